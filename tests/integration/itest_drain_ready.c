/* itest_drain_ready: a drain trains what is ready. The ready slots live in the target's memory:
 * told SHUTDOWN at once, the target exited and removed its pool while the broker still granted
 * them, so a drafter that had not mapped the pool yet warned "cannot copy slot" for each and gave
 * it back unread, untrained. Now the broker keeps the target while the drafters take them.
 *
 * The real dflash-queue and dflash-target (--model synthetic, host pool of 2 slots) run in a
 * temp dir. A raw drafter client says hello and keeps heartbeating (a drafter is connected) but
 * claims nothing, so both slots become ready. Then `drain`; the target is still up a second
 * later, and only then a worker loop (this process, a thread) starts: it has never mapped the
 * pool. Checks: it trains both ready batches and ends (drained); the target exits 0 within
 * 10 s; the ledger has 2 trained, none in flight. */
#include "check.h"
#include "harness.h"
#include "heartbeat.h"
#include "slot.h"
#include "counting_worker.h"

#include <pthread.h>
#include <signal.h>

static bool two_ready(const wire_status *s) { return h_ready_slots(s) >= 2; }

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--log-level=info", NULL};
    pid_t q = h_start_small_queue(argv[1], dir, more);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    pid_t target = h_start_small_target(argv[3], dir, "t", 64, 500);
    CHECK(target > 0);

    int rc;
    client *idle = h_client(ep, WIRE_ROLE_DRAFTER, "idle", 50, &rc);
    CHECK_EQ_INT(rc, 0);
    heartbeat *hb = heartbeat_start(idle, 0, "the idle drafter");

    client *c = h_client(ep, WIRE_ROLE_CTL, "check", 20, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_status s = {0};
    h_status_until(c, &s, two_ready, 30000);
    CHECK_EQ_INT(h_ready_slots(&s), 2);
    CHECK_EQ_INT(client_drain(c), 0);
    /* A second of the drain for the target to go, as it did at once (its work requests come
     * every 20 ms): a drafter slow to start (loading its model) then met a removed pool. */
    int early = -1;
    for (uint64_t end = h_now_ms() + 1000; h_now_ms() < end && early < 0;) {
        if (waitpid(target, &early, WNOHANG) != target) early = -1;
        h_sleep_ms(20);
    }
    CHECK_EQ_INT(early, -1); /* the target keeps its pool: its slots are ready */

    counting_worker k = {.lc = {.endpoint = ep, .name = "late", .backend = POOL_HOST, .timeout_ms = 1000,
                        .max_copy_failures = 1, .exit_when_drained = true}};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &k.lc.layout), 0);
    pthread_t th;
    CHECK_EQ_INT(counting_worker_start(&k, &th), 0);
    CHECK(counting_worker_join(&k, th, 30000));
    CHECK_EQ_INT(k.rc, 0); /* a copy failure would end it with DFLASH_EPEER */
    CHECK_EQ_INT(k.consumed, 2);

    int status = early >= 0 ? early : h_wait_exit(target, 10000); /* 0: exited 0 */
    CHECK(status == 0);
    CHECK_EQ_INT(client_status(c, &s), 0);
    printf("trained %d; ledger: %llu in flight, %llu trained, %llu committed, %llu to do\n",
           k.consumed, (unsigned long long)s.batches_inflight,
           (unsigned long long)s.batches_trained, (unsigned long long)s.batches_committed,
           (unsigned long long)s.batches_todo);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 2);
    CHECK_EQ_INT(s.batches_inflight, 0);
    heartbeat_stop(&hb);
    client_destroy(&c);
    client_destroy(&idle);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
