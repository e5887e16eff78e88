/* test_trainer: the drafter daemon's trainer (services/drafter/trainer.h) against a tiny random
 * target written by dflash-mkmodel (../tools/dflash-mkmodel from the ctest working directory, or
 * $DFLASH_MKMODEL_BIN), without a broker:
 *   - `eval` on held-out sets where no draft cycle can be walked (every loss mask 0, sequences
 *     too short, no sequence, replies of one token) is an error naming the cause, never a tau of 0 (tau lies in
 *     [1, block]); sequences without a cycle are counted as skipped, not as evaluated; and
 *     `dflash-drafter eval` (../services/drafter/dflash-drafter) refuses --checkpoint together
 *     with --init-only (exit 2) instead of evaluating the untrained drafter; a long `eval`
 *     reports its progress (on a terminal, `script`'s, every 0.2 s): it was silent until tau;
 *     a held-out shard made for another vocabulary is a mismatch (exit 2), not evaluated;
 *   - a fresh run whose --max-steps is past its --total-steps is refused at start-up, as its
 *     resume would be (the same command must be able to resume it);
 *   - without --max-steps a run stops at the end of its schedule, fresh (--total-steps) or
 *     resumed (the checkpoint's): it trained on at the floor learning rate (0) until the data
 *     ran out;
 *   - a --checkpoint-dir that cannot be written (a file, or a file in its path) is refused at
 *     start-up naming the path and the reason, not at the first checkpoint after hours of
 *     training; a missing one is created with its parents; one another live drafter
 *     writes is refused naming its pid (they would replace each other's checkpoints);
 *   - a checkpoint that cannot be resumed (another drafter shape, a truncated file, a bit flipped
 *     in a tensor's data) is refused naming the checkpoint and what to do; one with a file it
 *     cannot read (a FIFO in its place) is refused as an I/O failure to fix, not as damaged;
 *     one without its training state as not a whole checkpoint; a damaged model.safetensors is
 *     written again from the masters, byte for byte, and the run resumes; `eval` of a
 *     checkpoint made for another target (a captured layer this one lacks) exits 2 (mismatch),
 *     not 1 (the target's load failing); so does `eval` of a checkpoint trained on a target of
 *     the same shapes but another rope_theta (a Llama one for the Qwen3's), which the warm
 *     start refuses too;
 *   - a staged slot trains when it holds what its grant announced, and is refused (ECORRUPT)
 *     when its header holds more or fewer tokens or sequences than the grant said;
 *   - with --accumulate, consume() names the optimizer step that includes the batch (the step
 *     its ack names), not the one already taken;
 *   - a step whose loss is NaN (a NaN hidden state) stops the run: consume(), settled() and
 *     finish() return DFLASH_ENONFINITE, no checkpoint is written after the last finite step
 *     and committed() stays there; a run whose every batch was skipped (loss masks all 0)
 *     ends with DFLASH_ENODATA from finish(), one that trained a step does not;
 *   - a drafter that trained a few steps and then waits for data (a slow or restarting target)
 *     left metrics.jsonl without those steps for as long as it waited: the last step's record
 *     is read a step later and the file was flushed only when a record came; waiting (idle())
 *     writes and flushes them;
 *   - a checkpoint is written after the loop's durability barrier (the broker's journal holds
 *     its acks durably first), once per checkpoint, and written when the barrier fails too;
 *   - a save that fails for want of space (ENOSPC, EDQUOT) says that keep-last + 1
 *     checkpoints must fit, of what size, and what to do.
 */
#include "check.h"
#include "dflash_ckpt.h"
#include "err.h"
#include "hf_config.h"
#include "shard.h"
#include "test_files.h"
#include "trainer.h"

#include <signal.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256], target[300];

/* Writes a shard of n sequences (ids[i] of lens[i] tokens, masks[i]) to DIR/name. */
static void write_shard(const char *name, int n, const int32_t *const *ids,
                        const uint8_t *const *masks, const uint32_t *lens) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    shard_writer *w = shard_writer_new(path, 0);
    CHECK(w != NULL);
    if (!w) return;
    for (int i = 0; i < n; i++)
        CHECK_EQ_INT(shard_writer_add(w, ids[i], masks[i], lens[i]), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
}

static int eval(const char *shard, trainer_eval_result *r, char *err, size_t errlen) {
    char data[400];
    snprintf(data, sizeof data, "%s/%s", dir, shard);
    trainer_eval_opts o = {.model_dir = target,
                           .data = data,
                           .threads = 1,
                           .draft_layers = 1,
                           .block_size = 4,
                           .mask_token_id = -1,
                           .n_feat = 2,
                           .init_seed = 1};
    err[0] = 0;
    return trainer_eval(&o, r, err, errlen);
}

/* `ENV dflash-drafter eval ARGS` from the ctest working directory (ENV: "" or VAR=VALUE...):
 * its exit status; its output in DIR/eval.out. */
static int run_eval_env(const char *env, const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s ../services/drafter/dflash-drafter eval %s >%s/eval.out 2>&1",
             env, args, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_eval(const char *args) { return run_eval_env("", args); }

/* Whether the last eval's output (DIR/eval.out) holds text; prints it after what. */
static bool eval_said(const char *what, const char *text) {
    char path[400];
    snprintf(path, sizeof path, "%s/eval.out", dir);
    char *out = test_slurp(path, NULL);
    printf("%s: %s", what, out ? out : "(nothing)\n");
    bool said = out && strstr(out, text);
    free(out);
    return said;
}

/* The "sequences" of eval's --json line in DIR/eval.out (-1: none). */
static long eval_sequences(void) {
    char path[400];
    snprintf(path, sizeof path, "%s/eval.out", dir);
    char *out = test_slurp(path, NULL);
    const char *k = out ? strstr(out, "\"sequences\": ") : NULL;
    long n = k ? strtol(k + 13, NULL, 10) : -1;
    free(out);
    return n;
}

/* The slot layout's DFLASH_MAX_SEQS (deploy/docker-compose.yml sets it for every service) does
 * not change how many sequences eval reads: that is --eval-seqs (DFLASH_EVAL_SEQS); eval's old
 * --max-seqs, and DFLASH_DRAFTER_EVAL_MAX_SEQS, are refused naming it. */
static void test_eval_seqs_not_layout(void) {
    enum { N = 3, L = 24 };
    int32_t ids[L];
    uint8_t resp[L];
    for (int t = 0; t < L; t++)
        ids[t] = (t * 37 + 5) % 200, resp[t] = t >= 6;
    const int32_t *mi[N] = {ids, ids, ids};
    const uint8_t *mm[N] = {resp, resp, resp};
    const uint32_t ml[N] = {L, L, L};
    write_shard("three.shard", N, mi, mm, ml);
    char args[1024], more[1100];
    snprintf(args, sizeof args,
             "--init-only --model %s --data %s/three.shard --threads 1 --draft-layers 1 "
             "--block-size 4 --layers 2 --json",
             target, dir);
    CHECK_EQ_INT(run_eval_env("DFLASH_MAX_SEQS=1", args), 0);
    printf("eval with DFLASH_MAX_SEQS=1: %ld sequences\n", eval_sequences());
    CHECK_EQ_INT(eval_sequences(), N);
    snprintf(more, sizeof more, "%s --eval-seqs 2", args);
    CHECK_EQ_INT(run_eval_env("DFLASH_MAX_SEQS=1", more), 0);
    CHECK_EQ_INT(eval_sequences(), 2);
    CHECK_EQ_INT(run_eval_env("DFLASH_EVAL_SEQS=1", args), 0);
    CHECK_EQ_INT(eval_sequences(), 1);
    snprintf(more, sizeof more, "%s --max-seqs 2", args);
    const char *old[2][2] = {{"", more}, {"DFLASH_DRAFTER_EVAL_MAX_SEQS=2", args}};
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(run_eval_env(old[i][0], old[i][1]), 2);
        CHECK(eval_said("eval's old count option", "--eval-seqs N"));
    }
}

static void test_eval_two_drafters(void) {
    char args[1024];
    snprintf(args, sizeof args,
             "--model %s --data %s/mixed.shard --threads 1 --draft-layers 1 --block-size 4 "
             "--layers 2",
             target, dir);
    char one[1200], both[1300];
    snprintf(one, sizeof one, "%s --init-only", args);
    CHECK_EQ_INT(run_eval(one), 0); /* the untrained drafter */
    snprintf(both, sizeof both, "%s --checkpoint %s/no-such-checkpoint", one, dir);
    CHECK_EQ_INT(run_eval(both), 2);
    CHECK(eval_said("--init-only with --checkpoint", "--init-only"));
}

/* `dflash-drafter eval` of 3000 held-out sequences (about a second) on a terminal shows its
 * progress line before the result. */
static void test_eval_progress(void) {
    if (system("command -v script >/dev/null") != 0) {
        printf("eval progress: not checked (no `script` for a terminal)\n");
        return;
    }
    enum { N = 3000, L = 24 };
    static int32_t ids[L];
    static uint8_t resp[L];
    for (int t = 0; t < L; t++)
        ids[t] = (t * 37 + 5) % 200, resp[t] = t >= 6;
    static const int32_t *mi[N];
    static const uint8_t *mm[N];
    static uint32_t ml[N];
    for (int i = 0; i < N; i++)
        mi[i] = ids, mm[i] = resp, ml[i] = L;
    write_shard("long.shard", N, mi, mm, ml);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "script -qec '../services/drafter/dflash-drafter eval --init-only --model %s "
             "--data %s/long.shard --threads 1 --draft-layers 1 --block-size 4 --layers 2' "
             "/dev/null >%s/progress.out 2>&1",
             target, dir, dir);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char path[400];
    snprintf(path, sizeof path, "%s/progress.out", dir);
    char *out = test_slurp(path, NULL);
    char *line = strstr(out, "\reval "), *tau = strstr(out, "pooled over its");
    if (line) printf("eval progress: %.60s\n", line + 1);
    CHECK(line && strstr(line, "held-out sequences") && tau && line < tau);
    free(out);
}

static void test_eval_without_cycles(void) {
    enum { L = 24 };
    int32_t ids[L];
    uint8_t resp[L], none[L] = {0};
    for (int t = 0; t < L; t++)
        ids[t] = (t * 37 + 5) % 200, resp[t] = t >= 6;
    const uint8_t last[2] = {0, 1};
    /* every loss mask 0; a 1-token and a 2-token sequence whose only response token ends it */
    const int32_t *mi[2] = {ids, ids};
    const uint8_t *mm[2] = {none, none};
    const uint32_t ml[2] = {L, L};
    write_shard("masked.shard", 2, mi, mm, ml);
    const uint8_t *tm[2] = {resp, last};
    const uint32_t tl[2] = {1, 2};
    write_shard("tiny.shard", 2, mi, tm, tl);
    write_shard("empty.shard", 0, NULL, NULL, NULL);
    /* response tokens, but never two in a row: every reply ends where it starts, nothing is
     * drafted (the loss mask 0 tokens after them are not replies) */
    uint8_t alt[L];
    for (int t = 0; t < L; t++)
        alt[t] = t % 2 == 0;
    const uint8_t *am[1] = {alt};
    write_shard("alternating.shard", 1, mi, am, ml);
    /* one evaluable sequence beside a masked one */
    const uint8_t *xm[2] = {resp, none};
    write_shard("mixed.shard", 2, mi, xm, ml);

    trainer_eval_result r;
    char err[512];
    const char *bad[4] = {"masked.shard", "tiny.shard", "empty.shard", "alternating.shard"};
    for (int i = 0; i < 4; i++) {
        int rc = eval(bad[i], &r, err, sizeof err);
        printf("eval on %s: %s, tau %.4f over %ld cycles: %s\n", bad[i], err_str(rc), r.tau,
               r.cycles, err);
        CHECK(rc < 0);
        CHECK(strstr(err, "no draft cycle") != NULL);
    }
    CHECK_EQ_INT(eval("mixed.shard", &r, err, sizeof err), 0);
    printf("eval on mixed.shard: tau %.4f, %ld cycles, %ld sequences, %ld skipped\n", r.tau,
           r.cycles, r.sequences, r.skipped);
    CHECK(r.tau >= 1.0 && r.tau <= 4.0);
    CHECK(r.cycles > 0);
    CHECK_EQ_INT(r.sequences, 1);
    CHECK_EQ_INT(r.skipped, 1);
}

/* A held-out shard made for another vocabulary (another tokenizer: every id may still fit the
 * target's) is a mismatch, exit 2, naming both sizes; eval measured tau on it without a word. */
static void test_eval_other_vocab(void) {
    char err[512], path[400], args[1024];
    model_config mc;
    CHECK_EQ_INT(hf_config_load(target, &mc, err, sizeof err), 0);
    enum { L = 24 };
    int32_t ids[L];
    uint8_t resp[L];
    for (int t = 0; t < L; t++)
        ids[t] = (t * 37 + 5) % 200, resp[t] = t >= 6;
    snprintf(path, sizeof path, "%s/other-vocab.shard", dir);
    shard_writer *w = shard_writer_new(path, 2 * (uint32_t)mc.vocab_size);
    CHECK(w != NULL && shard_writer_add(w, ids, resp, L) == 0 && shard_writer_commit(w) == 0);
    shard_writer_destroy(&w);
    trainer_eval_result r;
    CHECK_EQ_INT(eval("other-vocab.shard", &r, err, sizeof err), DFLASH_EMISMATCH);
    char want[160];
    snprintf(want, sizeof want,
             "made for a vocabulary of %d tokens, but the model's vocab_size is %d",
             2 * mc.vocab_size, mc.vocab_size);
    CHECK(strstr(err, want) != NULL);
    if (!strstr(err, want)) fprintf(stderr, "eval: %s\n", err);
    snprintf(args, sizeof args,
             "--init-only --model %s --data %s --threads 1 --draft-layers 1 --block-size 4 "
             "--layers 2",
             target, path);
    CHECK_EQ_INT(run_eval(args), 2);
}

/* The slots every trainer here takes: 128 tokens, 4 sequences, 2 captured layers of the
 * target's hidden size, f32. */
static slot_layout slots(void) {
    char err[512];
    model_config mc;
    CHECK_EQ_INT(hf_config_load(target, &mc, err, sizeof err), 0);
    slot_layout l;
    CHECK_EQ_INT(slot_layout_compute(128, 4, (uint32_t)mc.hidden_size, 2, SLOT_DTYPE_F32, &l), 0);
    return l;
}

/* The options every trainer here starts from: the target at model_dir, the host backend with one
 * thread, the slots l (slots(), borrowed), one draft layer, blocks of 4, the default MASK row,
 * fresh weights of seed 1, the recipe's training settings with 8 anchors. */
static trainer_opts base_opts(const char *model_dir, const slot_layout *l) {
    trainer_opts o = {.model_dir = model_dir,
                      .backend = POOL_HOST,
                      .threads = 1,
                      .layout = l,
                      .draft_layers = 1,
                      .block_size = 4,
                      .mask_token_id = -1,
                      .init_seed = 1};
    dflash_train_cfg_default(&o.train);
    o.train.n_anchors = 8;
    return o;
}

/* The stop flag every trainer of these tests watches (a daemon's SIGTERM), and the optimizer
 * settings of the next start when non-zero (the recipe's otherwise). */
static volatile sig_atomic_t test_stop;
static double next_lr, next_weight_decay;
static int next_group_size = -1; /* >= 0: the next start joins a --group of this --group-size */
static int next_accumulate;      /* > 1: the next start's --accumulate */

/* trainer_new with the given schedule, checkpoint dir, metrics dir, --resume (NULL: none) and
 * --checkpoint-every (0: none); NULL with err when refused. */
static worker_consumer *start(long total_steps, long max_steps, const char *ckpt,
                              const char *metrics_dir, const char *resume, long ckpt_every,
                              char *err, size_t errlen) {
    slot_layout l = slots();
    trainer_opts o = base_opts(target, &l);
    o.checkpoint_dir = ckpt;
    o.max_steps = max_steps;
    o.checkpoint_every = ckpt_every;
    o.metrics_dir = metrics_dir;
    o.resume = resume;
    o.group = next_group_size >= 0;
    o.group_size = next_group_size > 0 ? next_group_size : 0;
    o.stop = &test_stop;
    if (next_lr > 0) o.train.lr = next_lr;
    if (next_weight_decay > 0) o.train.weight_decay = next_weight_decay;
    if (next_accumulate > 1) o.train.accumulate = next_accumulate;
    o.train.total_steps = total_steps;
    err[0] = 0;
    return trainer_new(&o, err, errlen);
}

/* start() of a run without --resume: fresh, or resumed from the newest checkpoint in ckpt. */
static worker_consumer *fresh(long total_steps, long max_steps, const char *ckpt,
                              const char *metrics_dir, char *err, size_t errlen) {
    return start(total_steps, max_steps, ckpt, metrics_dir, NULL, 0, err, errlen);
}

static void test_schedule_past_max_steps(void) {
    char err[512];
    worker_consumer *c = fresh(4, 8, NULL, NULL, err, sizeof err);
    printf("--total-steps 4 --max-steps 8: %s\n", c ? "started" : err);
    CHECK(c == NULL);
    CHECK(strstr(err, "--max-steps 8") && strstr(err, "--total-steps 4"));
    worker_consumer_destroy(&c);
    long ok[3][2] = {{8, 8}, {0, 8}, {12, 8}};
    for (int i = 0; i < 3; i++) {
        c = fresh(ok[i][0], ok[i][1], NULL, NULL, err, sizeof err);
        CHECK(c != NULL);
        if (!c) printf("--total-steps %ld --max-steps %ld refused: %s\n", ok[i][0], ok[i][1], err);
        worker_consumer_destroy(&c);
    }
}

static void test_checkpoint_dir(void) {
    char err[512], bad[2][400], fine[400];
    snprintf(bad[0], sizeof bad[0], "%s/target/config.json/ckpt", dir);
    snprintf(bad[1], sizeof bad[1], "%s/target/config.json", dir);
    const char *why[2] = {"cannot create", "is not a directory"};
    for (int i = 0; i < 2; i++) {
        worker_consumer *c = fresh(0, 0, bad[i], NULL, err, sizeof err);
        printf("--checkpoint-dir %s: %s\n", bad[i], c ? "started" : err);
        CHECK(c == NULL);
        CHECK(strstr(err, bad[i]) && strstr(err, why[i]));
        worker_consumer_destroy(&c);
    }
    /* a directory no one may create (sysfs: EPERM, like a read-only mount's EROFS): the error
     * names mkdir's reason, not the ENOENT of a look at the path afterwards */
    const char *denied = "/sys/dflash-test-ckpt/a/b";
    errno = 0;
    if (mkdir("/sys/dflash-test-ckpt", 0755) != 0 && errno != ENOENT) {
        char want[200];
        snprintf(want, sizeof want, "cannot create %s: %s", denied, strerror(errno));
        worker_consumer *d = fresh(0, 0, denied, NULL, err, sizeof err);
        printf("--checkpoint-dir %s: %s\n", denied, d ? "started" : err);
        CHECK(d == NULL);
        CHECK(strstr(err, want) != NULL);
        worker_consumer_destroy(&d);
    } else {
        if (errno == 0) rmdir("/sys/dflash-test-ckpt");
        printf("no /sys that refuses mkdir here: the denied --checkpoint-dir case is skipped\n");
    }
    snprintf(fine, sizeof fine, "%s/new/parent/ckpt", dir); /* made with its parents */
    worker_consumer *c = fresh(0, 0, fine, NULL, err, sizeof err);
    CHECK(c != NULL);
    struct stat sb;
    CHECK(stat(fine, &sb) == 0 && S_ISDIR(sb.st_mode));
    /* a second drafter on the same directory is refused while the first lives, naming it */
    worker_consumer *twin = fresh(0, 0, fine, NULL, err, sizeof err);
    printf("a second drafter on %s: %s\n", fine, twin ? "started" : err);
    CHECK(twin == NULL);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d", (int)getpid());
    CHECK(strstr(err, "in use by another drafter") && strstr(err, pid));
    worker_consumer_destroy(&twin);
    worker_consumer_destroy(&c);
    c = fresh(0, 0, fine, NULL, err, sizeof err); /* the first one's lock went with it */
    CHECK(c != NULL);
    worker_consumer_destroy(&c);
}

/* A staged slot of layout l holding one sequence of n tokens (a 4-token prompt, then response)
 * of batch wu; hidden rows random. */
static void *staged_slot(const slot_layout *l, const slot_work_unit *wu, uint32_t n) {
    void *base = aligned_alloc(SLOT_ALIGN, l->slot_bytes);
    if (!base) return NULL;
    memset(base, 0, l->slot_bytes);
    slot_header_write(base, l, wu, 1, n, 7);
    int32_t *so = slot_seq_offsets(base, l), *pos = slot_positions(base, l);
    int32_t *ids = slot_token_ids(base, l);
    uint8_t *mask = slot_loss_mask(base, l);
    so[0] = 0, so[1] = (int32_t)n;
    for (uint32_t t = 0; t < n; t++)
        pos[t] = (int32_t)t, ids[t] = (int32_t)((t * 37 + 5) % 200), mask[t] = t >= 4;
    float *hid = slot_hidden(base, l);
    for (size_t i = 0; i < (size_t)n * l->n_layers * l->hidden; i++)
        hid[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    return base;
}

static void test_slot_against_grant(void) {
    char err[512];
    worker_consumer *c = fresh(0, 0, NULL, NULL, err, sizeof err);
    CHECK(c != NULL);
    if (!c) return;
    slot_layout l = slots();
    slot_work_unit wu = {.epoch = 0, .bucket = 0, .batch = 5};
    void *base = staged_slot(&l, &wu, 20);
    CHECK(base != NULL);
    if (!base) return;
    worker_batch b = {.staged = base, .wu = wu, .n_tokens = 20, .n_seqs = 1};
    uint64_t step = 0;
    CHECK_EQ_INT(c->consume(c->ctx, &b, &step), 0);
    CHECK_EQ_INT(step, 1);
    /* the grant announced 12 tokens (the copy brings 12 rows), the header says 20; or 2 seqs */
    const uint32_t said[2][2] = {{12, 1}, {20, 2}};
    for (int i = 0; i < 2; i++) {
        b.n_tokens = said[i][0], b.n_seqs = said[i][1];
        step = 0;
        CHECK_EQ_INT(c->consume(c->ctx, &b, &step), DFLASH_ECORRUPT);
        CHECK_EQ_INT(step, 0);
    }
    free(base);
    worker_consumer_destroy(&c);
}

/* With --accumulate 3 the step consume() reports for a batch, the one its ack names (a
 * checkpoint of step s holds exactly the batches acked <= s), is the optimizer step that
 * includes it: 1 for each of the first three batches, though only the third takes the step,
 * then 2. Naming the step already taken (0) would ack an open step's batches with a
 * checkpoint that does not hold them: lost on a restart from it. */
static void test_accumulate_ack_step(void) {
    char err[512];
    next_accumulate = 3;
    worker_consumer *c = fresh(0, 0, NULL, NULL, err, sizeof err);
    next_accumulate = 0;
    CHECK(c != NULL);
    if (!c) return;
    slot_layout l = slots();
    const uint64_t want[4] = {1, 1, 1, 2};
    for (uint32_t i = 0; i < 4; i++) {
        slot_work_unit wu = {.epoch = 0, .bucket = 0, .batch = i};
        void *base = staged_slot(&l, &wu, 20);
        CHECK(base != NULL);
        if (!base) break;
        worker_batch b = {.staged = base, .wu = wu, .n_tokens = 20, .n_seqs = 1};
        uint64_t step = 0;
        CHECK_EQ_INT(c->consume(c->ctx, &b, &step), 0);
        if (step != want[i]) printf("--accumulate 3, batch %u: step %llu, want %llu\n", i,
                                    (unsigned long long)step, (unsigned long long)want[i]);
        CHECK(step == want[i]);
        free(base);
    }
    worker_consumer_destroy(&c);
}

/* Trains one step on a fresh batch; the consumer's done() after it. */
static bool train_step_done(worker_consumer *c, uint32_t batch) {
    slot_layout l = slots();
    slot_work_unit wu = {.epoch = 0, .bucket = 0, .batch = batch};
    void *base = staged_slot(&l, &wu, 20);
    worker_batch b = {.staged = base, .wu = wu, .n_tokens = 20, .n_seqs = 1};
    uint64_t step = 0;
    CHECK(base && c->consume(c->ctx, &b, &step) == 0 && step == batch + 1);
    free(base);
    return c->done(c->ctx);
}

static void test_stop_at_schedule_end(void) {
    char err[512], root[400];
    worker_consumer *c = fresh(2, 0, NULL, NULL, err, sizeof err); /* --total-steps 2 alone */
    CHECK(c != NULL && c->done != NULL);
    if (!c || !c->done) return;
    CHECK(!train_step_done(c, 0));
    CHECK(train_step_done(c, 1)); /* step 2: the schedule's end */
    worker_consumer_destroy(&c);
    /* resumed without --max-steps: the checkpoint's schedule (3 steps) ends the run */
    snprintf(root, sizeof root, "%s/ckpt-schedule", dir);
    c = fresh(3, 3, root, NULL, err, sizeof err);
    CHECK(c != NULL);
    if (!c) return;
    CHECK(!train_step_done(c, 0));
    CHECK_EQ_INT(c->finish(c->ctx), 0); /* checkpoint step 1 */
    worker_consumer_destroy(&c);
    c = fresh(0, 0, root, NULL, err, sizeof err);
    CHECK(c != NULL);
    if (!c) return;
    CHECK(!train_step_done(c, 1));
    CHECK(train_step_done(c, 2)); /* step 3 */
    worker_consumer_destroy(&c);
}

/* Replaces the first `from` in the file at path by `to`. */
static void edit_file(const char *path, const char *from, const char *to) {
    size_t n;
    char *text = test_slurp(path, &n), *at = strstr(text, from), out[8192];
    CHECK(at != NULL);
    if (at) {
        snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
        test_spill(path, out, strlen(out));
    }
    free(text);
}

/* Consumes batch `batch`: a one-sequence slot (staged_slot) whose loss mask is all 0 when
 * `masked`, whose first hidden value is NaN when `nan`. consume()'s result. */
static int consume_batch(worker_consumer *c, uint32_t batch, bool masked, bool nan) {
    slot_layout l = slots();
    slot_work_unit wu = {.epoch = 0, .bucket = 0, .batch = batch};
    void *base = staged_slot(&l, &wu, 20);
    CHECK(base != NULL);
    if (!base) return DFLASH_ENOMEM;
    if (masked) memset(slot_loss_mask(base, &l), 0, 20);
    if (nan) ((float *)slot_hidden(base, &l))[0] = NAN;
    worker_batch b = {.staged = base, .wu = wu, .n_tokens = 20, .n_seqs = 1};
    uint64_t step = 0;
    int rc = c->consume(c->ctx, &b, &step);
    free(base);
    return rc;
}

/* The started trainer *c (CHECKed not NULL) trains batch and ends (its final checkpoint);
 * then it is freed. */
static void train_and_finish(worker_consumer **c, uint32_t batch) {
    CHECK(*c != NULL);
    if (*c) {
        CHECK_EQ_INT(consume_batch(*c, batch, false, false), 0);
        CHECK_EQ_INT((*c)->finish((*c)->ctx), 0);
    }
    worker_consumer_destroy(c);
}

/* A run checkpointing into root trains one batch and ends: its final checkpoint, step 1, whose
 * directory goes to step. */
static void checkpoint_one_step(const char *root, char *step, size_t steplen) {
    char err[1024];
    worker_consumer *c = fresh(0, 0, root, NULL, err, sizeof err);
    train_and_finish(&c, 1);
    snprintf(step, steplen, "%s/step-000000001", root);
}

/* A run started on root (fresh(): resuming its newest checkpoint) that must be refused: says
 * what and the reason (into err), CHECKs the refusal and frees what started if it was not. */
static void resume_refused(const char *what, const char *root, char *err, size_t errlen) {
    worker_consumer *c = fresh(0, 0, root, NULL, err, errlen);
    printf("%s: %s\n", what, c ? "started" : err);
    CHECK(c == NULL);
    worker_consumer_destroy(&c);
}

/* A checkpoint that cannot be resumed names itself and says what to do: the flags of its run
 * when its drafter differs, moving it away when it is damaged. */
static void test_resume_refused(void) {
    char err[1024], root[400], step[500], path[600];
    snprintf(root, sizeof root, "%s/ckpt-resume", dir);
    checkpoint_one_step(root, step, sizeof step);
    worker_consumer *c = NULL;

    snprintf(path, sizeof path, "%s/config.json", step);
    edit_file(path, "\"block_size\":\t4", "\"block_size\":\t8");
    resume_refused("resume of another block size", root, err, sizeof err);
    CHECK(strstr(err, step) && strstr(err, "block_size") &&
          strstr(err, "flags that run was trained with"));
    edit_file(path, "\"block_size\":\t8", "\"block_size\":\t4");

    /* a training state of another format (another version wrote it): the message says how to
     * go on (that version, or a new run from its weights) */
    snprintf(path, sizeof path, "%s/training_state.safetensors", step);
    CHECK(test_edit_in_place(path, "dflash-training-state-1", "dflash-training-state-9"));
    resume_refused("resume of another training-state format", root, err, sizeof err);
    CHECK(strstr(err, step) && strstr(err, "dflash-training-state-9") &&
          strstr(err, "another version") && strstr(err, "--init-weights"));
    CHECK(test_edit_in_place(path, "dflash-training-state-9", "dflash-training-state-1"));
    snprintf(path, sizeof path, "%s/config.json", step);

    /* a checkpoint of another target (a captured layer this one lacks): eval says mismatch,
     * exit 2, instead of failing the target's load (exit 1) */
    edit_file(path, "[1, 3]", "[1, 33]");
    edit_file(path, "\"num_target_layers\":\t6", "\"num_target_layers\":\t36");
    char args[1200];
    snprintf(args, sizeof args, "--checkpoint %s --model %s --data %s/mixed.shard --threads 1",
             step, target, dir);
    CHECK_EQ_INT(run_eval(args), 2);
    CHECK(eval_said("eval of a checkpoint for another target",
                    "does not match target num_hidden_layers 6"));
    snprintf(path, sizeof path, "%s/config.json", step);
    edit_file(path, "[1, 33]", "[1, 3]");
    edit_file(path, "\"num_target_layers\":\t36", "\"num_target_layers\":\t6");

    /* one bit flipped in the data of the file's last tensor (a second moment): its checksum
     * fails, and the message names it and says what to do */
    snprintf(path, sizeof path, "%s/training_state.safetensors", step);
    uint64_t last = test_file_size(path) - 1;
    CHECK_EQ_INT(test_flip_bit(path, last, 4), 0);
    resume_refused("resume of a checkpoint with a flipped bit", root, err, sizeof err);
    CHECK(strstr(err, step) && strstr(err, "tensor exp_avg_sq.") &&
          strstr(err, "data checksum mismatch") && strstr(err, "the checkpoint is damaged"));
    CHECK_EQ_INT(test_flip_bit(path, last, 4), 0);

    /* a file that cannot be read (a FIFO in its place: no read waits on it, root's neither) is
     * no damaged checkpoint, which the user would move away: the message says to fix the
     * access, for the training state and for model.safetensors */
    char saved[700];
    snprintf(saved, sizeof saved, "%s.saved", path);
    CHECK_EQ_INT(rename(path, saved), 0);
    CHECK_EQ_INT(mkfifo(path, 0600), 0);
    resume_refused("resume of an unreadable training state", root, err, sizeof err);
    CHECK(strstr(err, path) && strstr(err, "FIFO") && strstr(err, "keep the checkpoint") &&
          strstr(err, "fix the access") && !strstr(err, "move it out"));
    CHECK_EQ_INT(unlink(path), 0);

    /* a newer step whose training state cannot even be looked at (a symbolic link loop: ELOOP,
     * as root too) is the one resumed, and refused as unreadable: skipping it resumed the older
     * one without a word */
    CHECK_EQ_INT(rename(saved, path), 0);
    char step2[500], loop[600];
    snprintf(step2, sizeof step2, "%s/step-000000002", root);
    snprintf(loop, sizeof loop, "%s/training_state.safetensors", step2);
    CHECK_EQ_INT(mkdir(step2, 0700), 0);
    CHECK_EQ_INT(symlink(loop, loop), 0);
    resume_refused("resume of a newer checkpoint that cannot be looked at", root, err, sizeof err);
    CHECK(strstr(err, step2) && strstr(err, strerror(ELOOP)) &&
          strstr(err, "keep the checkpoint"));
    CHECK_EQ_INT(unlink(loop), 0);
    CHECK_EQ_INT(rmdir(step2), 0);
    CHECK_EQ_INT(rename(path, saved), 0);

    /* missing beside config.json (a --resume of the step): not a whole checkpoint */
    c = start(0, 0, root, NULL, step, 0, err, sizeof err);
    printf("resume without a training state: %s\n", c ? "started" : err);
    CHECK(c == NULL);
    CHECK(strstr(err, step) && strstr(err, "not a whole checkpoint") && !strstr(err, "damaged"));
    worker_consumer_destroy(&c);
    CHECK_EQ_INT(rename(saved, path), 0);

    char model[600];
    snprintf(model, sizeof model, "%s/model.safetensors", step);
    snprintf(saved, sizeof saved, "%s.saved", model);
    CHECK_EQ_INT(rename(model, saved), 0);
    CHECK_EQ_INT(mkfifo(model, 0600), 0);
    resume_refused("resume with an unreadable model.safetensors", root, err, sizeof err);
    CHECK(strstr(err, model) && strstr(err, "FIFO") && strstr(err, "keep the checkpoint"));
    CHECK_EQ_INT(unlink(model), 0);

    /* a damaged model.safetensors is written again from the masters and the run resumes */
    size_t n = 0;
    char *orig = test_slurp(saved, &n);
    test_spill(model, orig, n);
    CHECK_EQ_INT(test_flip_bit(model, n - 1, 2), 0);
    c = fresh(0, 0, root, NULL, err, sizeof err);
    printf("resume with a damaged model.safetensors: %s\n", c ? "started" : err);
    CHECK(c != NULL);
    worker_consumer_destroy(&c);
    size_t m = 0;
    char *now = test_slurp(model, &m);
    CHECK(m == n && memcmp(now, orig, n) == 0);
    free(now);
    free(orig);
    CHECK_EQ_INT(unlink(saved), 0);

    CHECK(truncate(path, 1000) == 0);
    resume_refused("resume of a truncated checkpoint", root, err, sizeof err);
    CHECK(strstr(err, step) && strstr(err, "truncated") && strstr(err, "damaged"));
}

/* A resume keeps the checkpoint's step of world x accumulate slots over the drafters it has now
 * (step_rescale.h): the final checkpoint of a drafter alone records world 1; edited to the
 * checkpoint of a group of 2 x 3, it resumes alone at 6 slots a step (what the group hooks
 * read), in a group of 3 at 2 each, and in a group of 4 (6 slots cannot be shared evenly) at
 * the nearest share, 2 each (8 a step), with a warning: a rescale never stops the run. */
static void test_resume_rescale(void) {
    char err[2048], root[400], step[500], path[600];
    snprintf(root, sizeof root, "%s/ckpt-rescale", dir);
    checkpoint_one_step(root, step, sizeof step);
    snprintf(path, sizeof path, "%s/training_state.safetensors", step);
    CHECK(test_edit_in_place(path, "\"world\":\"1\"", "\"world\":\"2\""));
    CHECK(test_edit_in_place(path, "\"accumulate\":\"1\"", "\"accumulate\":\"3\""));
    int want[3] = {6, 2, 2}, sizes[3] = {-1, 3, 4};
    for (int i = 0; i < 3; i++) {
        next_group_size = sizes[i];
        worker_consumer *c = fresh(0, 0, root, NULL, err, sizeof err);
        next_group_size = -1;
        printf("a checkpoint of 2 x 3 slots a step resumed by %d drafter%s: %s\n",
               sizes[i] < 0 ? 1 : sizes[i], sizes[i] < 0 ? " alone" : "s", c ? "started" : err);
        CHECK(c != NULL);
        if (c) CHECK_EQ_INT(c->accumulate(c->ctx), want[i]);
        worker_consumer_destroy(&c);
    }
}

/* A step whose loss is NaN stops the run: consume() refuses it, nothing is checkpointed after
 * the last finite step and committed() stays there (it trained on and saved NaN weights). */

static void test_divergence_stops(void) {
    char err[512], root[400];
    snprintf(root, sizeof root, "%s/ckpt-diverge", dir);
    worker_consumer *c = fresh(0, 0, root, NULL, err, sizeof err);
    CHECK(c != NULL);
    if (!c) return;
    CHECK_EQ_INT(consume_batch(c, 0, false, false), 0);
    CHECK_EQ_INT(c->finish(c->ctx), 0); /* checkpoint step 1, committed */
    CHECK_EQ_INT(c->committed(c->ctx), 1);
    CHECK_EQ_INT(consume_batch(c, 1, false, true), DFLASH_ENONFINITE);
    CHECK_EQ_INT(c->settled(c->ctx), DFLASH_ENONFINITE);
    CHECK_EQ_INT(c->finish(c->ctx), DFLASH_ENONFINITE);
    CHECK_EQ_INT(consume_batch(c, 2, false, false), DFLASH_ENONFINITE);
    CHECK_EQ_INT(c->committed(c->ctx), 1);
    char step2[500];
    snprintf(step2, sizeof step2, "%s/step-000000002", root);
    CHECK(access(step2, F_OK) != 0);
    worker_consumer_destroy(&c);
}

/* Every batch skipped (no loss-masked position): finish() says DFLASH_ENODATA (exit 8), it
 * returned 0 as if the run had trained. */
static void test_nothing_trained(void) {
    char err[512];
    worker_consumer *c = fresh(0, 10, NULL, NULL, err, sizeof err);
    CHECK(c != NULL);
    if (!c) return;
    CHECK_EQ_INT(consume_batch(c, 0, true, false), 0);
    CHECK_EQ_INT(consume_batch(c, 1, true, false), 0);
    CHECK_EQ_INT(c->finish(c->ctx), DFLASH_ENODATA);
    worker_consumer_destroy(&c);
    c = fresh(0, 10, NULL, NULL, err, sizeof err); /* one step trained: a short run, not this */
    CHECK(c != NULL);
    if (!c) return;
    CHECK_EQ_INT(consume_batch(c, 0, true, false), 0);
    CHECK_EQ_INT(consume_batch(c, 1, false, false), 0);
    CHECK_EQ_INT(c->finish(c->ctx), 0);
    worker_consumer_destroy(&c);
    c = fresh(0, 10, NULL, NULL, err, sizeof err); /* stopped by a signal: not a verdict */
    CHECK(c != NULL);
    if (!c) return;
    CHECK_EQ_INT(consume_batch(c, 0, true, false), 0);
    test_stop = 1;
    CHECK_EQ_INT(c->finish(c->ctx), 0);
    test_stop = 0;
    worker_consumer_destroy(&c);
}

/* A checkpoint whose own lr x weight decay reaches 1 (written before the flags were checked, or
 * by a build without the check) is not resumed: the resume takes the checkpoint's settings, and
 * with them the decoupled decay would flip the weights every step. */
static void test_resume_growing_decay(void) {
    char err[1024], ckpt[400];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-decay", dir);
    next_lr = 0.5;
    next_weight_decay = 4;
    worker_consumer *c = fresh(0, 10, ckpt, NULL, err, sizeof err);
    next_lr = next_weight_decay = 0;
    CHECK(c != NULL);
    if (!c) return;
    CHECK_EQ_INT(consume_batch(c, 0, false, false), 0);
    CHECK_EQ_INT(c->finish(c->ctx), 0);
    worker_consumer_destroy(&c);
    c = fresh(0, 10, ckpt, NULL, err, sizeof err);
    printf("resume of a checkpoint with lr 0.5, weight decay 4: %s\n", c ? "started" : err);
    CHECK(c == NULL);
    CHECK(strstr(err, "weight decay 4") && strstr(err, "--init-weights"));
    worker_consumer_destroy(&c);
}

/* Lines of DIR/metrics/metrics.jsonl on disk now. */
static int jsonl_lines(void) {
    char path[400];
    snprintf(path, sizeof path, "%s/metrics/metrics.jsonl", dir);
    char *text = test_slurp(path, NULL);
    int n = 0;
    for (const char *p = text; p && *p; p++) n += *p == '\n';
    free(text);
    return n;
}

static void test_metrics_when_idle(void) {
    char err[512], mdir[400];
    snprintf(mdir, sizeof mdir, "%s/metrics", dir);
    worker_consumer *c = fresh(0, 0, NULL, mdir, err, sizeof err);
    CHECK(c != NULL && c->idle != NULL);
    if (!c || !c->idle) return;
    for (uint32_t i = 0; i < 2; i++)
        CHECK_EQ_INT(consume_batch(c, i, false, false), 0);
    CHECK(jsonl_lines() < 2); /* the second step's record comes a step later */
    c->idle(c->ctx);
    CHECK_EQ_INT(jsonl_lines(), 2);
    worker_consumer_destroy(&c);
}

/* --checkpoint-every 1: each periodic checkpoint (settled(), before the next claim) finds the
 * records of the steps it holds in metrics.jsonl already, without an idle() or the 1 s flush: a
 * process killed right after it, and resumed from it, would otherwise never log those steps. */
static void test_metrics_before_checkpoint(void) {
    char err[512], mdir[400], root[400];
    snprintf(mdir, sizeof mdir, "%s/metrics", dir);
    snprintf(root, sizeof root, "%s/ckpt-metrics", dir);
    char path[450];
    snprintf(path, sizeof path, "%s/metrics.jsonl", mdir);
    unlink(path);
    worker_consumer *c = start(0, 0, root, mdir, NULL, 1, err, sizeof err);
    CHECK(c != NULL && c->settled != NULL);
    if (!c || !c->settled) return;
    for (uint32_t i = 0; i < 3; i++) {
        CHECK_EQ_INT(consume_batch(c, i, false, false), 0);
        CHECK_EQ_INT(c->settled(c->ctx), 0); /* checkpoint of step i + 1 */
        CHECK_EQ_INT(c->committed(c->ctx), i + 1);
        printf("checkpoint of step %u: %d metrics records on disk\n", i + 1, jsonl_lines());
        CHECK_EQ_INT(jsonl_lines(), (int)i + 1);
    }
    worker_consumer_destroy(&c);
}

/* The loop's durability barrier (worker_loop.h set_barrier): called once per checkpoint, with
 * its step, before the checkpoint's directory exists (the broker's journal must hold its acks
 * durably first); a checkpoint whose barrier failed is written anyway. */
typedef struct barrier_log {
    const char *root;
    int calls, early; /* calls, and those made while step-<step> did not exist yet */
    uint64_t last_step;
    int rc; /* what the barrier answers */
} barrier_log;

static int log_barrier(void *arg, uint64_t step) {
    barrier_log *b = arg;
    char p[600];
    snprintf(p, sizeof p, "%s/step-%09llu", b->root, (unsigned long long)step);
    b->calls++;
    b->early += access(p, F_OK) != 0;
    b->last_step = step;
    return b->rc;
}

static void test_barrier_before_checkpoint(void) {
    char err[512], root[400], p[600];
    snprintf(root, sizeof root, "%s/ckpt-barrier", dir);
    worker_consumer *c = start(0, 0, root, NULL, NULL, 2, err, sizeof err);
    CHECK(c != NULL && c->set_barrier != NULL);
    if (!c || !c->set_barrier) return;
    barrier_log b = {.root = root};
    c->set_barrier(c->ctx, log_barrier, &b);
    CHECK_EQ_INT(consume_batch(c, 0, false, false), 0);
    CHECK_EQ_INT(c->settled(c->ctx), 0); /* step 1: no checkpoint due, no barrier */
    CHECK_EQ_INT(b.calls, 0);
    CHECK_EQ_INT(consume_batch(c, 1, false, false), 0);
    CHECK_EQ_INT(c->settled(c->ctx), 0); /* step 2: a checkpoint, after the barrier */
    CHECK_EQ_INT(b.calls, 1);
    CHECK_EQ_INT(b.early, 1);
    CHECK_EQ_INT((int)b.last_step, 2);
    CHECK_EQ_INT(c->settled(c->ctx), 0); /* nothing new: no second barrier */
    CHECK_EQ_INT(b.calls, 1);
    b.rc = DFLASH_EPROTO; /* an older broker: the checkpoint is written all the same */
    CHECK_EQ_INT(consume_batch(c, 2, false, false), 0);
    CHECK_EQ_INT(c->finish(c->ctx), 0); /* the final checkpoint (step 3) */
    CHECK_EQ_INT(b.calls, 2);
    CHECK_EQ_INT(b.early, 2);
    CHECK_EQ_INT((int)b.last_step, 3);
    snprintf(p, sizeof p, "%s/step-000000003", root);
    CHECK(access(p, F_OK) == 0);
    CHECK_EQ_INT((int)c->committed(c->ctx), 3);
    c->set_barrier(c->ctx, NULL, NULL); /* the loop took it back: none called */
    worker_consumer_destroy(&c);
}

/* A checkpoint save that fails for want of space says what a save needs (keep-last + 1
 * checkpoints of the given size) and what to do; other failures get no such hint. */
static void test_space_hint(void) {
    char out[256] = "";
    char err[256];
    snprintf(err, sizeof err, "checkpoint: cannot write /x/.tmp-step-000000018-1/"
             "training_state.safetensors: %s", strerror(ENOSPC));
    CHECK(dflash_ckpt_space_hint(err, 2, 716 * 1024, out, sizeof out));
    printf("ENOSPC hint: %s\n", out);
    CHECK(strstr(out, "--keep-last + 1 = 3 checkpoints") != NULL);
    CHECK(strstr(out, "0.7 MiB each") != NULL);
    CHECK(strstr(out, "free space, or lower --keep-last") != NULL);
    snprintf(err, sizeof err, "checkpoint: fsync /x: %s", strerror(EDQUOT));
    CHECK(dflash_ckpt_space_hint(err, 0, 3u << 20, out, sizeof out)); /* 0: the default 3 */
    CHECK(strstr(out, "= 4 checkpoints (3.0 MiB each") != NULL);
    snprintf(out, sizeof out, "untouched");
    snprintf(err, sizeof err, "checkpoint: cannot write /x: %s", strerror(EROFS));
    CHECK(!dflash_ckpt_space_hint(err, 2, 1, out, sizeof out));
    CHECK(strcmp(out, "untouched") == 0);
}

/* A checkpoint of another target of the same shapes (a Llama target, rope_theta 500000, for a
 * drafter trained on the Qwen3 one, 1e6): eval refuses it (exit 2, mismatch) as the warm start
 * and the resume do, naming rope_theta; it printed a tau. */
static void test_other_target(const char *mkmodel) {
    char err[1024], root[400], step[500], llama[400], cmd[1200];
    snprintf(root, sizeof root, "%s/ckpt-other-target", dir);
    checkpoint_one_step(root, step, sizeof step);
    worker_consumer *c = NULL;

    snprintf(llama, sizeof llama, "%s/llama", dir);
    snprintf(cmd, sizeof cmd, "%s --family llama --layers 6 --seed 1 --threads 1 --out %s "
             "--log-level warn", mkmodel, llama);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    snprintf(cmd, sizeof cmd, "--checkpoint %s --model %s --data %s/mixed.shard --threads 1",
             step, target, dir);
    CHECK_EQ_INT(run_eval(cmd), 0); /* its own target */
    snprintf(cmd, sizeof cmd, "--checkpoint %s --model %s --data %s/mixed.shard --threads 1",
             step, llama, dir);
    CHECK_EQ_INT(run_eval(cmd), 2);
    CHECK(eval_said("eval on another target of the same shapes",
                    "rope_theta 1e+06 does not match target rope_theta 500000"));

    /* the warm start from it on the Llama target: refused by the checkpoint's config check */
    slot_layout l = slots();
    trainer_opts o = base_opts(llama, &l);
    o.init_weights = step;
    err[0] = 0;
    c = trainer_new(&o, err, sizeof err);
    printf("warm start on another target of the same shapes: %s\n", c ? "started" : err);
    CHECK(c == NULL);
    CHECK(strstr(err, "rope_theta 500000 (the target's) does not match checkpoint rope_theta"));
    worker_consumer_destroy(&c);
}

/* The MASK row of the checkpoint at step. */
static int mask_of(const char *step) {
    dflash_config c;
    char err[512];
    int rc = dflash_ckpt_load_config(step, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    return rc ? -2 : c.mask_token_id;
}

/* Without --mask-token-id a new run takes the row past the target's tokenizer.json (Qwen3's
 * 151669), or vocab_size - 1 without one; a resume and a warm start keep their checkpoint's row
 * when the default has changed under them (a run begun before the default read the tokenizer,
 * or on a target dir without one), instead of being refused as another drafter. */
static void test_mask_default(void) {
    char root[400], step[500], tok[400], path[600], err[1024];
    model_config mc;
    CHECK_EQ_INT(hf_config_load(target, &mc, err, sizeof err), 0);
    snprintf(root, sizeof root, "%s/ckpt-mask", dir);
    checkpoint_one_step(root, step, sizeof step);
    CHECK_EQ_INT(mask_of(step), mc.vocab_size - 1); /* no tokenizer.json */

    snprintf(tok, sizeof tok, "%s/tokenizer.json", target);
    const char *json = "{\"added_tokens\": [{\"id\": 10, \"content\": \"<|endoftext|>\"}],"
                       " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 9}}}";
    test_spill(tok, json, strlen(json));
    /* the resume keeps vocab_size - 1, trains, and its next checkpoint says so */
    worker_consumer *c = fresh(0, 0, root, NULL, err, sizeof err);
    printf("resume after the default changed: %s\n", c ? "started" : err);
    train_and_finish(&c, 2);
    snprintf(path, sizeof path, "%s/step-000000002", root);
    CHECK_EQ_INT(mask_of(path), mc.vocab_size - 1);

    /* a warm start from it (scripts/train --init-from) keeps vocab_size - 1 too */
    char warm[400];
    snprintf(warm, sizeof warm, "%s/ckpt-mask-warm", dir);
    slot_layout l = slots();
    trainer_opts o = base_opts(target, &l);
    o.checkpoint_dir = warm;
    o.init_weights = path;
    o.stop = &test_stop;
    c = trainer_new(&o, err, sizeof err);
    printf("warm start after the default changed: %s\n", c ? "started" : err);
    train_and_finish(&c, 1);
    snprintf(path, sizeof path, "%s/step-000000001", warm);
    CHECK_EQ_INT(mask_of(path), mc.vocab_size - 1);

    /* a new run: the row past the tokenizer's 11 tokens */
    snprintf(root, sizeof root, "%s/ckpt-mask-new", dir);
    checkpoint_one_step(root, step, sizeof step);
    CHECK_EQ_INT(mask_of(step), 11);
    unlink(tok);
}

int main(void) {
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    char bin[512];
    const char *env = getenv("DFLASH_MKMODEL_BIN");
    snprintf(bin, sizeof bin, "%s", env ? env : "../tools/dflash-mkmodel");
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "dflash-mkmodel not found at %s (set DFLASH_MKMODEL_BIN)\n", bin);
        return 1;
    }
    snprintf(dir, sizeof dir, "/tmp/test_trainer.%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(target, sizeof target, "%s/target", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s --family qwen3 --layers 6 --seed 1 --threads 1 --out %s "
             "--log-level warn",
             bin, target);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    test_eval_without_cycles();
    test_eval_other_vocab();
    test_eval_two_drafters();
    test_eval_seqs_not_layout();
    test_eval_progress();
    test_schedule_past_max_steps();
    test_checkpoint_dir();
    test_stop_at_schedule_end();
    test_resume_refused();
    test_slot_against_grant();
    test_accumulate_ack_step();
    test_metrics_when_idle();
    test_metrics_before_checkpoint();
    test_barrier_before_checkpoint();
    test_space_hint();
    test_resume_rescale();
    test_divergence_stops();
    test_nothing_trained();
    test_resume_growing_decay();
    test_other_target(bin);
    test_mask_default();

    test_rmtree(dir);
    CHECK_DONE();
}
