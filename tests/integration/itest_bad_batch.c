/* itest_bad_batch: a drafter that stops on a bad batch (the consumer refuses it: DFLASH_ECORRUPT,
 * the daemon's exit 3) first saves what it trained (the consumer's finish(): its final
 * checkpoint) and reports that checkpoint, instead of throwing away every step since the last
 * one.
 *
 * The real dflash-queue and dflash-target (--model synthetic) run in a temp dir; this process
 * runs the worker loop with a consumer that trains its first batch and refuses its second.
 * Checks: the loop returns DFLASH_ECORRUPT, finish() ran once, after the refusal, and the broker
 * holds the commit of the checkpoint finish() wrote (step 1). */
#include "check.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

#include <signal.h>

typedef struct bad {
    int consumed, finished;
    bool refused;
} bad;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    bad *k = ctx;
    (void)b;
    if (k->consumed == 1) {
        k->refused = true;
        return DFLASH_ECORRUPT;
    }
    *step = (uint64_t)++k->consumed;
    return 0;
}

static int finish(void *ctx)
{
    bad *k = ctx;
    CHECK(k->refused);
    k->finished++;
    return 0;
}

static uint64_t committed(void *ctx)
{
    bad *k = ctx;
    return k->finished ? (uint64_t)k->consumed : 0; /* the checkpoint finish() writes */
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--log-level=warn", NULL};
    pid_t q = h_start_small_queue(argv[1], dir, more);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    pid_t target = h_start_small_target(argv[3], dir, "bad", 4, 500);
    CHECK(target > 0);

    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 1000, .exit_when_drained = true};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    bad k = {0};
    worker_consumer cons = {.name = "bad", .ctx = &k, .consume = consume,
                            .committed = committed, .finish = finish};
    volatile sig_atomic_t stop = 0;
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, NULL), DFLASH_ECORRUPT);
    printf("consumed %d, refused %d, finish() ran %d times\n", k.consumed, k.refused,
           k.finished);
    CHECK(k.refused);
    CHECK_EQ_INT(k.finished, 1);

    wire_status s;
    int rc = h_broker_status(ep, &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
        printf("ledger: committed step %llu, %llu committed batches, %llu in flight\n",
               (unsigned long long)s.committed_step, (unsigned long long)s.batches_committed,
               (unsigned long long)s.batches_inflight);
        CHECK_EQ_INT(s.committed_step, 1);
        CHECK_EQ_INT(s.batches_committed, 1);
    }
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
