/* itest_restart_fence: after a broker restart, a slot a drafter may still be copying is not
 * handed out for refilling until one lease timeout after the target re-registered it as busy.
 *
 * The real dflash-queue runs with a journal (lease 1000 ms). This process plays the target (a
 * 2-slot pool: both slots filled and announced) and a drafter (claims one of them and keeps the
 * grant, as if its copy were still running). The broker is SIGKILLed and restarted on the same
 * journal; the target re-registers naming both slots busy (PoolRegister.busy_slots). Checks:
 * every work request within the fence is refused (no slot may be refilled), a SLOT_READY for the
 * fenced slot is refused (its batch stays in flight), the first work unit after the fence comes
 * no earlier than one lease timeout after the registration was sent, and both slots are then
 * handed out again. Run against a broker without the fence (it ignores the unknown field) the
 * first work request succeeds at once and the test fails. */
#include "check.h"
#include "harness.h"

#define POOL_INC 0xfe4ce11ull
#define LEASE_MS 1000
#define SLOTS 2

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    char dir[64], ep[128], journal[128], lease[64];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    snprintf(lease, sizeof lease, "--lease-timeout-ms=%d", LEASE_MS);
    const char *extra[] = {journal, "--min-ready=0", "--max-depth=8", lease, "--heartbeat-ms=100",
                           "--liveness=50", "--stats-interval-ms=0", "--log-level=warn", NULL};
    pid_t q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    client *t = client_new(ep, WIRE_ROLE_TARGET, "target");
    client *d = client_new(ep, WIRE_ROLE_DRAFTER, "drafter");
    client_set_timeout(t, 1000);
    client_set_timeout(d, 1000);
    wire_pool pool;
    h_pool(&pool, POOL_INC, SLOTS, 1, 8, 1);
    CHECK_EQ_INT(h_hello_retry(t, NULL, 0, H_BROKER_UP_MS), 0);
    CHECK_EQ_INT(client_register_pool(t, &pool), 0);

    /* fill and announce both slots; the target now considers both busy */
    bool busy[SLOTS] = {false};
    for (int k = 0; k < SLOTS; k++) {
        wire_work_unit wu;
        int rc = client_request_work(t, POOL_INC, &wu);
        CHECK_EQ_INT(rc, 0);
        if (rc || wu.slot >= SLOTS) CHECK_DONE();
        wire_slot_ready r = {POOL_INC, wu.slot, wu.unit, 64, 1};
        CHECK_EQ_INT(client_slot_ready(t, &r), 0);
        busy[wu.slot] = true;
    }
    CHECK(busy[0] && busy[1]);

    /* the drafter takes a grant and keeps it: its copy is "still running" */
    CHECK_EQ_INT(h_hello_retry(d, NULL, 0, H_BROKER_UP_MS), 0);
    wire_grant g;
    int rc = client_claim(d, &g);
    CHECK_EQ_INT(rc, 0);
    if (rc) CHECK_DONE();

    /* broker crash and restart on the same journal */
    h_kill(q, SIGKILL);
    q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    /* the target notices (ESTALE) and re-registers with its busy slots; a loaded machine (the
     * sanitizer run) may time a request out while the client reconnects: that one is retried */
    wire_work_unit wu;
    int wrc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 10 && wrc == DFLASH_ETIMEOUT; a++)
        wrc = client_request_work(t, POOL_INC, &wu);
    CHECK_EQ_INT(wrc, DFLASH_ESTALE);
    CHECK_EQ_INT(h_hello_retry(t, NULL, 0, H_BROKER_UP_MS), 0);
    for (uint32_t s = 0; s < SLOTS; s++) wire_pool_set_busy(&pool, s, busy[s]);
    uint64_t t_reg = h_now_ms();
    CHECK_EQ_INT(client_register_pool(t, &pool), 0);

    /* within the fence: the granted slot may not be re-announced either */
    wire_slot_ready again = {POOL_INC, g.slot, g.unit, 64, 1};
    CHECK_EQ_INT(client_slot_ready(t, &again), DFLASH_ESTATE);
    /* ... and its batch stays in flight, orphaned (the drafter that may hold its copy can still
     * adopt it), as the other one: not to do again, to be produced and trained a second time */
    wire_status st;
    CHECK_EQ_INT(client_status(t, &st), 0);
    CHECK_EQ_INT(st.batches_inflight, SLOTS);

    /* poll for work: every answer inside the fence is a refusal, the first work unit comes no
     * earlier than registration + lease timeout */
    uint64_t refused = 0, t_first = 0;
    uint32_t first_slot = UINT32_MAX;
    uint64_t end = t_reg + 10 * LEASE_MS;
    while (h_now_ms() < end) {
        rc = client_request_work(t, POOL_INC, &wu);
        if (rc == 0) {
            t_first = h_now_ms();
            first_slot = wu.slot;
            break;
        }
        CHECK(rc == DFLASH_EFULL || rc == DFLASH_EAGAIN);
        if (rc != DFLASH_EFULL && rc != DFLASH_EAGAIN) break;
        refused++;
        h_sleep_ms(10);
    }
    CHECK(t_first > 0);
    CHECK(refused > 0);
    CHECK(t_first >= t_reg + LEASE_MS);
    printf("first work unit %llu ms after the re-registration (lease %d ms), slot %u, %llu "
           "requests refused meanwhile\n", (unsigned long long)(t_first - t_reg), LEASE_MS,
           first_slot, (unsigned long long)refused);

    /* after the fence both slots are FREE again: the second one is handed out too */
    CHECK(first_slot < SLOTS);
    wire_slot_ready r1 = {POOL_INC, wu.slot, wu.unit, 64, 1};
    CHECK_EQ_INT(client_slot_ready(t, &r1), 0);
    rc = client_request_work(t, POOL_INC, &wu);
    CHECK_EQ_INT(rc, 0);
    CHECK(rc == 0 && wu.slot < SLOTS && wu.slot != first_slot);

    client_destroy(&t);
    client_destroy(&d);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
