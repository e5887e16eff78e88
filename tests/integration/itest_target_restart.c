/* itest_target_restart: a target that restarts (same name, new incarnation) gets a clean view:
 * the old incarnation's filling and ready slots are dropped, their batches go back to to-do and
 * are handed out again, and the old incarnation's requests are refused as stale. */
#include "check.h"
#include "harness.h"

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *extra[] = {"--journal=none", "--min-ready=0", NULL};
    pid_t q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    client *t1 = client_new(ep, WIRE_ROLE_TARGET, "target");
    CHECK_EQ_INT(client_hello(t1, NULL, 0), 0);
    wire_pool pool;
    h_pool(&pool, 0x111, 4, 1, 10, 1);
    CHECK_EQ_INT(client_register_pool(t1, &pool), 0);
    /* one unit at a time, as a target fills them: a reported, b still filling */
    wire_work_unit a, b;
    CHECK_EQ_INT(client_request_work(t1, 0x111, &a), 0);
    wire_slot_ready r = {0x111, a.slot, a.unit, 10, 1};
    CHECK_EQ_INT(client_slot_ready(t1, &r), 0);
    CHECK_EQ_INT(client_request_work(t1, 0x111, &b), 0);
    wire_status s;
    CHECK_EQ_INT(client_status(t1, &s), 0);
    CHECK_EQ_INT(s.buckets[0].ready, 1);
    CHECK_EQ_INT(s.buckets[0].filling, 1);

    /* the target process restarts: new incarnation, same name */
    client *t2 = client_new(ep, WIRE_ROLE_TARGET, "target");
    CHECK(client_incarnation(t2) != client_incarnation(t1));
    CHECK_EQ_INT(client_hello(t2, NULL, 0), 0);
    CHECK_EQ_INT(client_status(t2, &s), 0);
    CHECK_EQ_INT(s.buckets[0].ready, 0);
    CHECK_EQ_INT(s.buckets[0].filling, 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    /* the old incarnation is gone for the broker */
    wire_work_unit x;
    CHECK_EQ_INT(client_request_work(t1, 0x111, &x), DFLASH_ESTALE);

    h_pool(&pool, 0x222, 4, 1, 10, 1);
    CHECK_EQ_INT(client_register_pool(t2, &pool), 0);
    /* the dropped batches are handed out again, lowest index first */
    wire_work_unit c, d;
    CHECK_EQ_INT(client_request_work(t2, 0x222, &c), 0);
    wire_slot_ready rc_ready = {0x222, c.slot, c.unit, 10, 1};
    CHECK_EQ_INT(client_slot_ready(t2, &rc_ready), 0);
    CHECK_EQ_INT(client_request_work(t2, 0x222, &d), 0);
    CHECK(c.unit.index == a.unit.index && d.unit.index == b.unit.index);
    /* a SLOT_READY with the old pool incarnation is refused */
    CHECK_EQ_INT(client_slot_ready(t2, &r), DFLASH_ESTALE);

    client_destroy(&t1);
    client_destroy(&t2);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
