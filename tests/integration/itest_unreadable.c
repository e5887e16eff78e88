/* itest_unreadable: a drafter that cannot read a granted slot (the target's shared memory
 * segment was removed) gives the lease back unread, and the broker returns the batch to to-do
 * instead of counting it as held by that drafter until it exits.
 *
 * The real dflash-queue and dflash-target (--model synthetic, host pool) run in a temp dir. A
 * raw drafter client claims one slot to learn the pool's shm name, unlinks it, and trains that
 * batch (acks it). Then this process runs the worker loop in a thread: it cannot map the pool,
 * so every grant fails to copy. Checks, from one status reply once 6 grants failed: the ledger
 * has at most max-depth (2) batches in flight (the ones in slots), not one per failed grant, and
 * the consumer never ran. Then the loop, whose max_copy_failures is 10, ends by itself with
 * DFLASH_EPEER (a drafter that cannot map any slot gives up instead of retrying for ever), after
 * finish(), where a drafter writes its final checkpoint (it wrote none: the steps since its last
 * periodic checkpoint were lost). */
#include "check.h"
#include "harness.h"
#include "slot.h"
#include "counting_worker.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

/* peek's grant and 6 failed ones */
static bool seven_grants(const wire_status *s) { return s->grants >= 7; }

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--log-level=error", NULL};
    pid_t q = h_start_small_queue(argv[1], dir, more);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    pid_t target = h_start_small_target(argv[3], dir, "t", 64, 500);
    CHECK(target > 0);

    /* Learn the pool's segment from one grant, remove it, and train that batch. */
    int rc;
    client *peek = h_client(ep, WIRE_ROLE_DRAFTER, "peek", 50, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_grant g;
    uint64_t deadline = h_now_ms() + 30000;
    while ((rc = client_claim(peek, &g)) != 0 && h_now_ms() < deadline) h_sleep_ms(10);
    CHECK_EQ_INT(rc, 0);
    if (rc) CHECK_DONE();
    printf("pool segment %s\n", g.shm_name);
    CHECK_EQ_INT(shm_unlink(g.shm_name), 0);
    CHECK_EQ_INT(client_release(peek, g.lease_id), 0);
    CHECK_EQ_INT(client_ack(peek, &g.unit, 1), 0);

    counting_worker k = {.lc = {.endpoint = ep, .name = "blind", .backend = POOL_HOST, .timeout_ms = 1000,
                      .max_copy_failures = 10}};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &k.lc.layout), 0);
    pthread_t th;
    CHECK_EQ_INT(counting_worker_start(&k, &th), 0);

    client *c = h_client(ep, WIRE_ROLE_CTL, "check", 20, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_status s = {0};
    h_status_until(c, &s, seven_grants, 60000);
    printf("grants %llu, releases %llu, ledger: %llu in flight, %llu trained, %llu to do\n",
           (unsigned long long)s.grants, (unsigned long long)s.releases,
           (unsigned long long)s.batches_inflight, (unsigned long long)s.batches_trained,
           (unsigned long long)s.batches_todo);
    CHECK(s.grants >= 7);
    CHECK(s.batches_inflight <= 2);
    CHECK_EQ_INT(s.batches_trained, 1);
    /* failures 7 to 10 wait 64 ms to 512 ms after the one before: ~1 s more */
    CHECK(counting_worker_join(&k, th, 30000));
    CHECK_EQ_INT(k.rc, DFLASH_EPEER);
    CHECK_EQ_INT(k.consumed, 0);
    CHECK_EQ_INT(k.finished, 1); /* the final checkpoint before that exit (it had none) */
    client_destroy(&c);
    client_destroy(&peek);
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
