/* test_broker_release: `dflash-ctl release` gives quarantined batches back to the run
 * (broker_dispatch without sockets, the journal in a temp dir, the broker destroyed and created
 * again on it; max-redeliveries 0, so one failed delivery quarantines a batch).
 *
 * What a user would notice if it broke (the operator audit's finding 2): batches quarantined for
 * a fault of the target, not theirs (it ran the wrong model, every drafter restart counted
 * against them), were lost to the run for good: nothing called the ledger's release, the run
 * ended short of its schedule. Now:
 *   - ReleaseQuarantine of one batch (E/B/I) puts it back to to-do and the target is asked to
 *     produce it again; the reply counts it and comes after its journal record is fsynced; the
 *     broker logs it;
 *   - a batch that is not quarantined is refused with its state named (Error STATE), one the
 *     ledger does not have with Error RANGE, and nothing changes;
 *   - ReleaseQuarantine of all releases every quarantined batch (Ok with the count; 0 when
 *     none is);
 *   - a broker restarted on the journal keeps them released (the records replay);
 *   - a release the journal did not take is answered Error IO saying so (it is in force, but a
 *     restart would have the batch quarantined again), not Ok.
 * And status counts every delivery of a batch after its first as a redelivery (the audit's
 * finding 9: `redeliveries 0` while batches had two deliveries each and were quarantined, as
 * it counted lease expiries only): a drafter restarted holding copied batches, a slot given back
 * unread, a release from quarantine; a batch quarantined is not delivered again, not counted.
 * The admin-key check over CURVE is itest_curve's; the dflash-ctl verb is itest_poison's. */
#include "check.h"
#include "broker_stub.h"
#include "err.h"
#include "test_files.h"

#include <stdlib.h>

enum { TARGET_INC = 11, DRAFTER_INC = 22, POOL_INC = 111 };

static char journal_path[300];
static int syncs;
static char said[8192];

static void tweak(queue_config *cfg)
{
    snprintf(cfg->journal, sizeof cfg->journal, "%s", journal_path);
    cfg->max_redeliveries = 0;
}

static int count_sync(void *ctx, int fd)
{
    (void)ctx, (void)fd;
    syncs++;
    return 0;
}

static int fail_sync(void *ctx, int fd)
{
    (void)ctx, (void)fd;
    return DFLASH_EIO;
}

static int hello(const char *rid, wire_role role, uint64_t inc, const char *name)
{
    stub_init(WIRE_HELLO, role, inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", name);
    return stub_send(rid);
}

/* ReleaseQuarantine from a ctl: of *unit, or of all (unit NULL). 0 or the error code; the Ok's
 * count in stub_rep.u.value. */
static int release(const wire_unit *unit)
{
    stub_init(WIRE_RELEASE_QUARANTINE, WIRE_ROLE_CTL, 99);
    stub_req.u.release_q.all = unit == NULL;
    if (unit) stub_req.u.release_q.unit = *unit;
    return stub_send("ctl-c-99");
}

/* Batches 0/0/0..n-1 made ready, copied by drafter d, and d restarted (a supervisor) holding
 * them: each delivery counted, each batch quarantined. */
static void quarantine_first(int n)
{
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, TARGET_INC, "t"), 0);
    CHECK_EQ_INT(hello("d", WIRE_ROLE_DRAFTER, DRAFTER_INC, "d"), 0);
    stub_pool("t", TARGET_INC, POOL_INC, 4);
    stub_make_ready("t", TARGET_INC, POOL_INC, n);
    for (int i = 0; i < n; i++) {
        stub_init(WIRE_CLAIM, WIRE_ROLE_DRAFTER, DRAFTER_INC);
        CHECK_EQ_INT(stub_send("d"), 0);
        uint64_t lease = stub_rep.u.grant.lease_id;
        stub_init(WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, DRAFTER_INC);
        stub_req.u.lease_id = lease;
        CHECK_EQ_INT(stub_send("d"), 0);
    }
    CHECK_EQ_INT(hello("d2", WIRE_ROLE_DRAFTER, DRAFTER_INC + 1, "d"), 0); /* the restart */
}

static const wire_unit one = {0, 0, 1};

static void release_one_logged(void)
{
    log_set_level(LOG_INFO);
    CHECK_EQ_INT(release(&one), 0);
    log_set_level(LOG_ERROR);
}

static void redeliver_once(queue_config *cfg)
{
    cfg->max_redeliveries = 1;
}

/* Drafter (rid, inc) claims a slot and releases it (unread: given back without reading it);
 * the batch it got goes to *got. */
static void claim_release(const char *rid, uint64_t inc, bool unread, wire_unit *got)
{
    stub_init(WIRE_CLAIM, WIRE_ROLE_DRAFTER, inc);
    CHECK_EQ_INT(stub_send(rid), 0);
    *got = stub_rep.u.grant.unit;
    uint64_t lease = stub_rep.u.grant.lease_id;
    stub_init(WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, inc);
    stub_req.u.lease_id = lease;
    stub_req.u.release_unread = unread;
    CHECK_EQ_INT(stub_send(rid), 0);
}

static void test_redeliveries_counted(void)
{
    stub_broker_new(redeliver_once); /* journal none, max-redeliveries 1 */
    if (!stub_b) return;
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, TARGET_INC, "t"), 0);
    CHECK_EQ_INT(hello("d", WIRE_ROLE_DRAFTER, DRAFTER_INC, "d"), 0);
    stub_pool("t", TARGET_INC, POOL_INC, 4);
    wire_unit u;

    /* first deliveries: not counted */
    stub_make_ready("t", TARGET_INC, POOL_INC, 2);
    claim_release("d", DRAFTER_INC, false, &u);
    claim_release("d", DRAFTER_INC, false, &u);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.grants, 2);
    CHECK_EQ_INT(s.redeliveries, 0);

    /* the drafter restarted holding both (a supervisor): produced again, delivered again */
    CHECK_EQ_INT(hello("d2", WIRE_ROLE_DRAFTER, DRAFTER_INC + 1, "d"), 0);
    stub_make_ready("t", TARGET_INC, POOL_INC, 2);
    claim_release("d2", DRAFTER_INC + 1, false, &u);
    CHECK(u.epoch == 0 && u.index <= 1);
    claim_release("d2", DRAFTER_INC + 1, false, &u);
    CHECK(u.epoch == 0 && u.index <= 1);
    s = stub_status();
    CHECK_EQ_INT(s.redeliveries, 2);
    CHECK_EQ_INT(s.lease_expiries, 0);

    /* restarted again: the second failed delivery quarantines them, none is delivered again */
    CHECK_EQ_INT(hello("d3", WIRE_ROLE_DRAFTER, DRAFTER_INC + 2, "d"), 0);
    s = stub_status();
    printf("two deliveries each, quarantined: quarantined %llu, redeliveries %llu\n",
           (unsigned long long)s.quarantined, (unsigned long long)s.redeliveries);
    CHECK_EQ_INT(s.quarantined, 2);
    CHECK_EQ_INT(s.redeliveries, 2);

    /* a slot given back unread: the batch is produced again and its next grant counted */
    stub_make_ready("t", TARGET_INC, POOL_INC, 1);
    claim_release("d3", DRAFTER_INC + 2, true, &u);
    CHECK(u.index == 2);
    CHECK_EQ_INT(stub_status().redeliveries, 2);
    stub_make_ready("t", TARGET_INC, POOL_INC, 1);
    claim_release("d3", DRAFTER_INC + 2, false, &u);
    CHECK(u.index == 2);
    CHECK_EQ_INT(stub_status().redeliveries, 3);

    /* released from quarantine and delivered again: counted */
    CHECK_EQ_INT(release(&one), 0);
    stub_make_ready("t", TARGET_INC, POOL_INC, 1);
    claim_release("d3", DRAFTER_INC + 2, false, &u);
    CHECK(u.index == 1);
    CHECK_EQ_INT(stub_status().redeliveries, 4);
    /* a new batch's first delivery still is not */
    stub_make_ready("t", TARGET_INC, POOL_INC, 1);
    claim_release("d3", DRAFTER_INC + 2, false, &u);
    CHECK(u.index == 3);
    CHECK_EQ_INT(stub_status().redeliveries, 4);
    stub_broker_free();
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    char dir[300];
    snprintf(dir, sizeof dir, "%s/test_broker_release.XXXXXX", t && *t ? t : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    snprintf(journal_path, sizeof journal_path, "%s/q.journal", dir);
    stub_broker_new(tweak);
    if (!stub_b) CHECK_DONE();
    quarantine_first(3);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.quarantined, 3);
    CHECK_EQ_INT(s.batches_inflight, 0);

    /* one batch: released, counted, durable before the reply, logged */
    broker_set_sync_hook(stub_b, count_sync, NULL);
    stub_capture_log(release_one_logged, said, sizeof said);
    CHECK_EQ_INT(stub_rep.u.value, 1);
    CHECK_EQ_INT(syncs, 1); /* inline journal: fsynced before broker_dispatch returned */
    CHECK(strstr(said, "batch 0/0/1 back to to-do") != NULL);
    if (!strstr(said, "back to to-do")) fprintf(stderr, "the broker said:\n%s\n", said);
    s = stub_status();
    CHECK_EQ_INT(s.quarantined, 2);
    /* the target is asked for it again (the lowest batch to do) */
    stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, TARGET_INC);
    stub_req.u.pool_incarnation = POOL_INC;
    CHECK_EQ_INT(stub_send("t"), 0);
    CHECK(stub_rep.u.work.unit.epoch == 0 && stub_rep.u.work.unit.index == 1);

    /* not quarantined (now in flight again), not in the ledger: refused, nothing changed */
    CHECK_EQ_INT(release(&one), DFLASH_ESTATE);
    printf("release of a batch in flight: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "0/0/1 is not quarantined (it is in_flight)"));
    wire_unit far = {0, 0, 5000}, late = {7, 0, 0};
    CHECK_EQ_INT(release(&far), DFLASH_ERANGE);
    printf("release of a batch past the plan: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "not in the ledger") != NULL);
    CHECK_EQ_INT(release(&late), DFLASH_ERANGE);
    CHECK_EQ_INT(syncs, 1);
    CHECK_EQ_INT(stub_status().quarantined, 2);

    /* all of them: both left, then none */
    CHECK_EQ_INT(release(NULL), 0);
    CHECK_EQ_INT(stub_rep.u.value, 2);
    CHECK_EQ_INT(syncs, 2);
    CHECK_EQ_INT(stub_status().quarantined, 0);
    CHECK_EQ_INT(release(NULL), 0);
    CHECK_EQ_INT(stub_rep.u.value, 0);
    s = stub_status();
    stub_broker_free();

    /* a restart on the journal keeps them released */
    stub_broker_new(tweak);
    if (stub_b) {
        wire_status r = stub_status();
        printf("after the restart: quarantined %llu, to do %llu, in flight %llu\n",
               (unsigned long long)r.quarantined, (unsigned long long)r.batches_todo,
               (unsigned long long)r.batches_inflight);
        CHECK_EQ_INT(r.quarantined, 0);
        CHECK_EQ_INT(r.batches_todo + r.batches_inflight, s.batches_todo + s.batches_inflight);
        stub_broker_free();
    }

    /* released while the journal fails (its fsync): in force, answered Error IO saying so (a
     * restart would have the batch quarantined again), not a false Ok */
    snprintf(journal_path, sizeof journal_path, "%s/failing.journal", dir);
    stub_broker_new(tweak);
    if (stub_b) {
        quarantine_first(1);
        broker_set_sync_hook(stub_b, fail_sync, NULL);
        const wire_unit first = {0, 0, 0};
        CHECK_EQ_INT(release(&first), DFLASH_EIO);
        printf("release with a failing journal: %s\n", stub_rep.u.error.message);
        CHECK(strstr(stub_rep.u.error.message, "released 1, but the journal did not take it"));
        CHECK_EQ_INT(stub_status().quarantined, 0);
        stub_broker_free();
    }
    test_rmtree(dir);
    test_redeliveries_counted();
    CHECK_DONE();
}
