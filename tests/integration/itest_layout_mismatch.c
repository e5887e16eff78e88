/* itest_layout_mismatch: a target restarted on the wrong model (another hidden size, same plan)
 * writes slots of another layout than the drafters read. That is the target's misconfiguration,
 * not the batches' fault: a drafter gives such a slot back unread and exits 2 (drafter/target
 * mismatch) naming both layouts and what to do; the batch goes back to to-do and is not counted
 * as a failed delivery. Before, every drafter exited 3 holding the batch, each supervisor
 * restart counted against it, and good batches were quarantined (the audit's finding 2).
 *
 * The real dflash-queue (--max-redeliveries=0: one counted failure quarantines) and dflash-target
 * (--model synthetic, hidden 8) run in a temp dir.
 *   (a) the real dflash-drafter --verify with --hidden 16, started 3 times under one --name as a
 *       supervisor would: every run exits 2, its log names both layouts and the way out, and the
 *       broker has quarantined nothing and trained nothing;
 *   (b) a data-parallel group of one (the worker loop in this process, a consumer whose layout()
 *       names hidden 16: the hook the trainer uses) ends with DFLASH_ECONFIG without consuming;
 *   (c) a drafter of the right layout then trains every batch of the plan, none quarantined. */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "test_files.h"
#include "worker_loop.h"

#include <signal.h>

#define BATCHES 4 /* per bucket; 2 buckets */

/* dflash-drafter --verify on the small target's slots with hidden `hidden`, logging to log;
 * its exit status (-1: killed at the deadline). */
static int run_drafter(const char *bin, const char *dir, int hidden, const char *log)
{
    char rt[300], hid[32];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(hid, sizeof hid, "--hidden=%d", hidden);
    char *argv[] = {(char *)bin, rt, "--verify", "--backend=host", "--name=d", hid, "--layers=2",
                    "--token-budget=256", "--max-seqs=4", "--buckets=64,256",
                    "--progress-ms=0", "--timeout-ms=1000", NULL};
    pid_t pid = h_spawn_logged(argv, log);
    return h_wait_exit(pid, 60000);
}

typedef struct group_rank {
    slot_layout wrong; /* what layout() says this consumer reads */
    int consumed;
} group_rank;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    group_rank *k = ctx;
    (void)b;
    *step = (uint64_t)++k->consumed;
    return 0;
}

static const slot_layout *layout(void *ctx) { return &((group_rank *)ctx)->wrong; }

static uint64_t model_step(void *ctx) { return (uint64_t)((group_rank *)ctx)->consumed; }

int main(int argc, char **argv)
{
    if (argc < 5) return 2;
    char dir[64], ep[128], log[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(log, sizeof log, "%s/drafter.log", dir);
    const char *more[] = {"--max-redeliveries=0", "--log-level=warn", NULL};
    pid_t q = h_start_small_queue(argv[1], dir, more);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    pid_t target = h_start_small_target(argv[3], dir, "t", BATCHES, 500);
    CHECK(target > 0);

    /* (a) the real drafter, restarted as a supervisor would */
    for (int run = 0; run < 3; run++) {
        int rc = run_drafter(argv[4], dir, 16, log);
        printf("drafter of hidden 16, run %d: exit %d\n", run, rc);
        CHECK_EQ_INT(rc, 2);
    }
    char *text = test_slurp(log, NULL);
    CHECK(text && strstr(text, "hidden 8") && strstr(text, "hidden 16"));
    CHECK(text && strstr(text, "restart the target with the run's model"));
    CHECK(text && strstr(text, "goes back unread"));
    if (!text || !strstr(text, "goes back unread")) fprintf(stderr, "drafter log:\n%s\n", text);
    free(text);
    wire_status s;
    int rc = h_print_ledger(ep, "after the mismatched drafters", &s);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(s.quarantined, 0);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 0);

    /* (b) a group member takes the same path */
    worker_loop_config lc = {.endpoint = ep, .name = "rank", .backend = POOL_HOST,
                             .timeout_ms = 1000, .max_batches = 2, .group = "g",
                             .comm_kind = DP_COMM_SHM, .comm_timeout_s = 10};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    group_rank k = {0};
    CHECK_EQ_INT(slot_layout_compute(256, 4, 16, 2, SLOT_DTYPE_F32, &k.wrong), 0);
    worker_consumer cons = {.name = "rank", .ctx = &k, .consume = consume, .layout = layout,
                            .set_group = h_set_group_none, .sync_state = h_sync_state_none,
                            .model_step = model_step};
    volatile sig_atomic_t stop = 0;
    rc = worker_loop_run(&lc, &cons, &stop, NULL);
    printf("group member of hidden 16: %s, consumed %d\n", err_str(rc), k.consumed);
    CHECK_EQ_INT(rc, DFLASH_ECONFIG);
    CHECK_EQ_INT(k.consumed, 0);

    /* (c) the right drafter trains the whole plan: nothing was lost */
    rc = run_drafter(argv[4], dir, 8, log);
    printf("drafter of hidden 8: exit %d\n", rc);
    CHECK_EQ_INT(rc, 0);
    rc = h_print_ledger(ep, "after the right drafter", &s);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(s.quarantined, 0);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 2 * BATCHES);

    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
