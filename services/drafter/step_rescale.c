/* step_rescale: the per-rank slots of a resumed run's step (see step_rescale.h). */
#include "step_rescale.h"

#include "wire.h" /* WIRE_MAX_WORLD: the slots of a group step */

#include <assert.h>
#include <stdio.h>

#define ACCUMULATE_MAX 4096 /* dflash-drafter --accumulate's range */

static const char *plural(long n) {
    return n == 1 ? "" : "s";
}

/* "1, 2 or 4": the numbers of drafters up to WIRE_MAX_WORLD that share total slots evenly */
static void divisors_text(long total, char *buf, size_t len) {
    int d[WIRE_MAX_WORLD], n = 0;
    for (long k = 1; k <= WIRE_MAX_WORLD && k <= total; k++)
        if (total % k == 0) d[n++] = (int)k;
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d",
                               i == 0       ? ""
                               : i == n - 1 ? " or "
                                            : ", ",
                               d[i]);
}

/* "4 slots (2 drafters x 2)": a step of world x accumulate slots */
static void step_text(int world, int accumulate, char *buf, size_t len) {
    long total = (long)world * accumulate;
    snprintf(buf, len, "%ld slot%s (%d drafter%s x %d)", total, plural(total), world, plural(world),
             accumulate);
}

/* The checkpoint records its step: T slots over new_world ranks. */
static void share_step(const char *dir, int ckpt_world, int ckpt_accumulate, int new_world,
                       bool group, step_rescale *out, char *msg, size_t len) {
    char was[96], why[200] = "", keep[WIRE_MAX_WORLD * 4];
    step_text(ckpt_world, ckpt_accumulate, was, sizeof was);
    long total = (long)ckpt_world * ckpt_accumulate;
    long share = (total + new_world / 2) / new_world; /* nearest, at least 1 */
    if (share < 1) share = 1;
    if (total % new_world) {
        divisors_text(total, keep, sizeof keep);
        snprintf(why, sizeof why, "%d drafter%s cannot share it evenly; with %s drafter%s it would "
                 "stay %ld", new_world, plural(new_world), keep, total == 1 ? "" : "s", total);
    }
    if (share > ACCUMULATE_MAX) {
        share = ACCUMULATE_MAX;
        snprintf(why, sizeof why, "at most %d slots a drafter (--accumulate)", ACCUMULATE_MAX);
    }
    if (group && share * new_world > WIRE_MAX_WORLD) {
        share = WIRE_MAX_WORLD / new_world;
        snprintf(why, sizeof why, "a group step holds at most %d slots (ranks x --accumulate); "
                 "alone it would stay %ld", WIRE_MAX_WORLD, total);
    }
    out->accumulate = (int)share;
    if (share * new_world == total) {
        if (new_world == ckpt_world) return; /* KEEP: the same ranks */
        out->kind = STEP_RESCALE_ADAPT;
        snprintf(msg, len,
                 "resuming %s with %d drafter%s: its step stays %ld slot%s, now %d drafter%s x "
                 "%ld (it was %d x %d)",
                 dir, new_world, plural(new_world), total, plural(total), new_world,
                 plural(new_world), share, ckpt_world, ckpt_accumulate);
        return;
    }
    out->kind = STEP_RESCALE_CHANGE;
    snprintf(msg, len,
             "resuming %s with %d drafter%s: its step of %s becomes %ld slot%s, %ld a drafter "
             "(%s); the weights, moments and schedule go on (another step size from its start is "
             "a new run: --init-weights %s and another --checkpoint-dir)",
             dir, new_world, plural(new_world), was, share * new_world, plural(share * new_world),
             share, why, dir);
}

void step_rescale_decide(const char *dir, int ckpt_world, int ckpt_accumulate, int new_world,
                         bool group, step_rescale *out, char *msg, size_t len) {
    assert(ckpt_world >= 0 && ckpt_accumulate >= 1 && new_world >= 0 &&
           new_world <= WIRE_MAX_WORLD);
    assert(group || new_world == 1);
    msg[0] = 0;
    *out = (step_rescale){.kind = STEP_RESCALE_KEEP,
                          .accumulate = ckpt_accumulate,
                          .world = new_world ? new_world : ckpt_world};
    if (ckpt_world && new_world) {
        share_step(dir, ckpt_world, ckpt_accumulate, new_world, group, out, msg, len);
        return;
    }
    /* the step's size is not known (no record) or the new one is not (no --group-size): each
     * rank keeps the checkpoint's per-rank value, within a group's cap */
    int ranks = new_world ? new_world : 1;
    if (group && (long)ranks * out->accumulate > WIRE_MAX_WORLD)
        out->accumulate = WIRE_MAX_WORLD / ranks;
    if (!group) return; /* one drafter resumes a checkpoint without its world */
    out->kind = STEP_RESCALE_CHANGE;
    char capped[96] = "", was[96];
    if (out->accumulate != ckpt_accumulate)
        snprintf(capped, sizeof capped, " (not its %d: a group step holds at most %d slots)",
                 ckpt_accumulate, WIRE_MAX_WORLD);
    if (ckpt_world) {
        step_text(ckpt_world, ckpt_accumulate, was, sizeof was);
        snprintf(msg, len,
                 "resuming %s in a --group without --group-size: each drafter trains %d slot%s "
                 "a step%s, so the step's slot count now follows the group's size (the "
                 "checkpoint's step: %s); give --group-size %d to keep it",
                 dir, out->accumulate, plural(out->accumulate), capped, was, ckpt_world);
        return;
    }
    char step_is[64] = "that times the group's size";
    if (new_world) snprintf(step_is, sizeof step_is, "%d slots", new_world * out->accumulate);
    snprintf(msg, len,
             "resuming %s in a group: it does not record how many drafters took its steps "
             "(written before the record), so each trains %d slot%s a step%s and a step is %s",
             dir, out->accumulate, plural(out->accumulate), capped, step_is);
}
