/* itest_idle_restart: a drafter waiting for work (no target yet: its claims are answered AGAIN)
 * when the broker restarts registers again with the new broker and trains once a target comes.
 * Both loops: the solo worker loop (Claim answered STALE: registering again) and a data-parallel
 * group of one (StepClaim answered STALE).
 *
 * The real dflash-queue (--journal none) runs in a temp dir; this process runs the drafter's
 * loop (worker_loop_run, --max-batches 2) in a thread with a consumer that counts its batches.
 * Once the broker lists the drafter (and, for the group, its group), the broker is SIGKILLed and
 * started again on the same runtime dir, and only then a synthetic dflash-target starts.
 * Checks: the loop ends by itself within 30 s with 0, having trained 2 batches, and the new
 * broker's ledger holds them. Defect it guards: a loop that took a Claim answered STALE for a
 * transient answer (not going back to its hello) claimed for ever, refused, training nothing.
 * Usage: itest_idle_restart QUEUE CTL TARGET. Exit 0 pass, 1 fail. */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

#include <pthread.h>
#include <signal.h>

#define BATCHES 2

typedef struct idle {
    worker_loop_config lc;
    worker_consumer cons;
    volatile sig_atomic_t stop;
    volatile int consumed, ended;
    int rc;
} idle;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    idle *k = ctx;
    (void)b;
    *step = (uint64_t)++k->consumed;
    return 0;
}

static uint64_t model_step(void *ctx)
{
    return (uint64_t)((idle *)ctx)->consumed;
}

static void *run_loop(void *arg)
{
    idle *k = arg;
    k->rc = worker_loop_run(&k->lc, &k->cons, &k->stop, NULL);
    k->ended = 1;
    return NULL;
}

/* Waits up to ms for the broker at ep to list the drafter (and a group when group). */
static bool wait_listed(const char *ep, bool group, int ms)
{
    wire_status s;
    for (uint64_t end = h_now_ms() + (uint64_t)ms; h_now_ms() < end; h_sleep_ms(20))
        if (h_broker_status(ep, &s) == 0 && s.peers >= 1 && (!group || s.n_groups == 1))
            return true;
    return false;
}

static void scenario(const char *queue_bin, const char *target_bin, bool group)
{
    const char *what = group ? "group of one" : "solo";
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *extra[] = {"--journal=none", "--min-ready=1", "--max-depth=2",
                           "--heartbeat-ms=100", "--stats-interval-ms=0", "--log-level=warn",
                           NULL};
    pid_t q = h_start_queue(queue_bin, dir, extra);
    CHECK(q > 0);
    if (q <= 0) return;

    idle k = {.lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                     .timeout_ms = 500, .max_batches = BATCHES}};
    if (group) {
        k.lc.group = "idle";
        k.lc.comm_kind = DP_COMM_SHM;
        k.lc.comm_timeout_s = 10;
    }
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &k.lc.layout), 0);
    k.cons = (worker_consumer){.name = "idle", .ctx = &k, .consume = consume};
    if (group) {
        k.cons.set_group = h_set_group_none;
        k.cons.sync_state = h_sync_state_none;
        k.cons.model_step = model_step;
    }
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, run_loop, &k), 0);
    CHECK(wait_listed(ep, group, 20000)); /* registered (and in its group), claiming: AGAIN */

    h_kill(q, SIGKILL);
    q = h_start_queue(queue_bin, dir, extra);
    CHECK(q > 0);
    pid_t target = h_start_small_target(target_bin, dir, group ? "group" : "solo", 4, 500);
    CHECK(target > 0);

    for (uint64_t end = h_now_ms() + 30000; !k.ended && h_now_ms() < end;) h_sleep_ms(20);
    bool ended = k.ended;
    k.stop = 1;
    pthread_join(th, NULL);
    printf("%s: the loop %s, trained %d batches\n", what,
           ended ? "ended by itself" : "did not end in 30 s", k.consumed);
    CHECK(ended);
    CHECK_EQ_INT(k.rc, 0);
    CHECK_EQ_INT(k.consumed, BATCHES);
    wire_status s;
    int rc = h_print_ledger(ep, what, &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) CHECK_EQ_INT(s.batches_trained, BATCHES);
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
