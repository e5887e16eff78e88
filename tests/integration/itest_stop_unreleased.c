/* itest_stop_unreleased: a stop signal that comes between a grant's copy and its release leaves
 * the copy untrained: without a confirmed release the lease may still expire and the batch be
 * handed out again, so training it could train it twice (worker_loop.c handle_grant, group_worker.c
 * run_step). Both loops: the solo worker loop and a data-parallel group of one.
 *
 * The real dflash-queue and dflash-target (--model synthetic) run in a temp dir; this process
 * runs the drafter's loop (worker_loop_run) with a consumer whose layout() hook, which the loop
 * calls after the copy and before the release (worker_session_check_layout), raises the loop's
 * stop flag, as a SIGTERM arriving then would. Checks: the loop returns 0, the consumer trained
 * nothing, and the broker counts no ack and no trained batch (the lease is left to expire; the
 * batch goes back to to-do). Defect it guards: a loop that went on to train after a release the
 * stop prevented (its error not taken as "drop the copy") trained the batch and acked it.
 * Usage: itest_stop_unreleased QUEUE CTL TARGET. Exit 0 pass, 1 fail. */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

typedef struct stopper {
    volatile sig_atomic_t *stop;
    slot_layout layout;
    int copies, consumed;
} stopper;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    stopper *k = ctx;
    (void)b;
    *step = (uint64_t)++k->consumed;
    return 0;
}

/* Called after the copy, before the release: the stop signal comes now. */
static const slot_layout *layout(void *ctx)
{
    stopper *k = ctx;
    k->copies++;
    *k->stop = 1;
    return &k->layout;
}

static uint64_t model_step(void *ctx)
{
    return (uint64_t)((stopper *)ctx)->consumed;
}

static void scenario(const char *queue_bin, const char *target_bin, bool group)
{
    const char *what = group ? "group of one" : "solo";
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--log-level=warn", NULL};
    pid_t q = h_start_small_queue(queue_bin, dir, more);
    CHECK(q > 0);
    if (q <= 0) return;
    pid_t target = h_start_small_target(target_bin, dir, "unreleased", 4, 500);
    CHECK(target > 0);

    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 1000, .exit_when_drained = true};
    if (group) {
        lc.group = "unreleased";
        lc.comm_kind = DP_COMM_SHM;
        lc.comm_timeout_s = 10;
    }
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    volatile sig_atomic_t stop = 0;
    stopper k = {.stop = &stop, .layout = lc.layout};
    worker_consumer cons = {.name = "unreleased", .ctx = &k, .consume = consume,
                            .layout = layout};
    if (group) {
        cons.set_group = h_set_group_none;
        cons.sync_state = h_sync_state_none;
        cons.model_step = model_step;
    }
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, NULL), 0);
    printf("%s: %d copies, %d trained\n", what, k.copies, k.consumed);
    CHECK_EQ_INT(k.copies, 1);
    CHECK_EQ_INT(k.consumed, 0);

    wire_status s;
    int rc = h_print_ledger(ep, what, &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
        CHECK_EQ_INT(s.acks, 0);
        CHECK_EQ_INT(s.batches_trained + s.batches_committed, 0);
    }
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    scenario(argv[1], argv[3], false);
    scenario(argv[1], argv[3], true);
    CHECK_DONE();
}
