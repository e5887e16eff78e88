/* show: a checkpoint's step and training settings (see show.h). */
#include "show.h"

#include "dflash_ckpt.h"
#include "err.h"
#include "fsutil.h"
#include "step_rescale.h"
#include "wire.h" /* WIRE_MAX_WORLD: the ranks of a group */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: dflash-drafter show CHECKPOINT [--drafters N [--group]]\n"
    "  A checkpoint's step and training settings, one \"name value\" line each (step,\n"
    "  accumulate: slots a drafter trained a step, world: drafters a step is for (a group's\n"
    "  --group-size, else the ranks of its last step) or 'unknown' for a checkpoint written\n"
    "  before the record, step_slots: world x accumulate, then the schedule and optimizer\n"
    "  settings a resume restores).\n"
    "  CHECKPOINT: a step-N directory, or a --checkpoint-dir (its newest complete step-N).\n"
    "  --drafters N  also print drafter_accumulate: the slots each of N drafters trains a step\n"
    "                when they resume it, as the drafter's resume decides (N > 1, or --group:\n"
    "                a --group of --group-size N), and, when the step changes or is shared\n"
    "                anew, a line \"note\" saying how and why.\n"
    "  Exit status: 0, 1 no readable checkpoint there, 2 bad arguments.\n";

static int parse_drafters(const char *s, int *n) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 1 || v > WIRE_MAX_WORLD) return -1;
    *n = (int)v;
    return 0;
}

/* dir itself when it holds a training state, else its newest complete step-N */
static int resolve(const char *arg, char *dir, size_t len) {
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/training_state.safetensors", arg);
    if (stat(p, &sb) == 0) {
        snprintf(dir, len, "%s", arg);
        return 0;
    }
    return dflash_ckpt_latest(arg, dir, len);
}

int show_main(int argc, char **argv) {
    const char *arg = NULL;
    int drafters = 0;
    bool group = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--drafters") && i + 1 == argc) {
            fprintf(stderr, "dflash-drafter show: --drafters needs a number of drafters\n");
            return 2;
        }
        if (!strcmp(argv[i], "--drafters")) {
            if (parse_drafters(argv[++i], &drafters) < 0) {
                fprintf(stderr, "dflash-drafter show: --drafters '%s' is not a number of drafters "
                                "(1 .. %d)\n", argv[i], WIRE_MAX_WORLD);
                return 2;
            }
        } else if (!strcmp(argv[i], "--group")) {
            group = true;
        } else if (argv[i][0] == '-' || arg) {
            fprintf(stderr, "dflash-drafter show: unexpected argument '%s'\n%s", argv[i], usage);
            return 2;
        } else {
            arg = argv[i];
        }
    }
    if (group && !drafters) {
        fprintf(stderr, "dflash-drafter show: --group goes with --drafters N\n");
        return 2;
    }
    if (!arg) {
        fprintf(stderr, "dflash-drafter show: which checkpoint?\n%s", usage);
        return 2;
    }
    char dir[4096], err[2048];
    if (resolve(arg, dir, sizeof dir) < 0) {
        fprintf(stderr, "dflash-drafter show: %s holds no checkpoint (no training_state.safetensors, "
                        "and no complete step-N directory)\n", arg);
        return 1;
    }
    dflash_train_cfg tc;
    long step = 0;
    int rc = dflash_ckpt_train_settings(dir, &tc, &step, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "dflash-drafter show: %s (%s)\n", err, err_str(rc));
        return 1;
    }
    int accumulate = tc.accumulate > 1 ? tc.accumulate : 1;
    step_rescale share = {0};
    char note[3072] = "";
    if (drafters)
        step_rescale_decide(dir, tc.world, accumulate, drafters, group || drafters > 1, &share,
                            note, sizeof note);
    printf("checkpoint %s\nstep %ld\naccumulate %d\n", dir, step, accumulate);
    if (tc.world > 0)
        printf("world %d\nstep_slots %ld\n", tc.world, (long)tc.world * accumulate);
    else
        printf("world unknown\n");
    printf("lr %.17g\nwarmup_ratio %.17g\ntotal_steps %ld\nmin_lr_ratio %.17g\nanchors %d\n"
           "gamma %.17g\nclip %.17g\nbeta1 %.17g\nbeta2 %.17g\neps %.17g\nweight_decay %.17g\n"
           "seed %llu\n",
           tc.lr, tc.warmup_ratio, tc.total_steps, tc.min_lr_ratio, tc.n_anchors, tc.gamma,
           tc.clip, tc.beta1, tc.beta2, tc.eps, tc.weight_decay, (unsigned long long)tc.seed);
    if (drafters) printf("drafter_accumulate %d\n", share.accumulate);
    if (note[0]) printf("note %s\n", note);
    return fs_stdout_written("dflash-drafter show") ? 0 : 1;
}
