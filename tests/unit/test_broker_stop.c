/* test_broker_stop: the broker's graceful stop (broker_stop.c), driven through broker_dispatch
 * without sockets (journal in memory), the broker's timers on a libuv loop run by hand.
 *
 * What a user would notice if it broke:
 *   - a broker stopped together with its drafters (a host shutdown: SIGTERM to all) exited
 *     before the ack of the batch a drafter was training and before its final checkpoint's
 *     report: the batch went into the checkpoint unacked and the journal said it was in flight.
 *     Here the stop ends only once the lease is released, the batch acked and the checkpoint
 *     reported, not one request earlier, and the reply to that last request is sent;
 *   - while stopping, a claim got a lease, or a target new work (more in flight at the exit);
 *     they get Error AGAIN "the broker is stopping", while releases, acks, commit reports,
 *     heartbeats and status are served; a group's rank still gets its slot of the step already
 *     reserved (its step could never end), but no new step is reserved;
 *   - a drafter that is not stopping (it claims again) held the stop for its whole grace
 *     waiting for a checkpoint report that only comes much later;
 *   - a dead lease holder (no heartbeat) held the stop for the whole grace: it ends once the
 *     holder is expired;
 *   - a holder that never settles held it for ever: the grace ends it, naming what was left;
 *   - a second stop request (a second signal) waited too: it ends the stop at once;
 *   - nothing in progress, or --stop-grace-ms 0: the stop is at once, as before;
 *   - the broker exited the moment the last report was answered (the drafter had not read the
 *     reply yet): it exits once settled for 200 ms, and again so when a drafter came back with
 *     a batch in training after it had settled once; a grace shorter than that ends it saying
 *     all settled, not naming nothing as unsettled;
 *   - the report owed is taken from served requests only and only forward (a refused ack held
 *     the stop for its grace; a late ack of an earlier step let it exit before the report);
 *     a group's rank 0 owes one after its StepDone;
 *   - status looked like a serving broker's during the stop: it carries the stop (grace, time
 *     since the signal, what is left, per drafter in words) from the signal to the exit.
 *     Who it waits for is cut to 255 bytes between characters (defect: inside a multi-byte
 *     UTF-8 character of a drafter's name).
 * Time is waited for (polled to a deadline), never assumed.
 */
#include "check.h"
#include "broker_stub.h"
#include "err.h"
#include "monotime.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TARGET_INC = 7, POOL_INC = 0x77 };

typedef stub_drafter drafter;

static const drafter D = {"drafter-d-1", "d", 0xd1}, E = {"drafter-e-2", "e", 0xe2};

static int stopped;      /* times the broker's done callback ran */
static char said[16384]; /* the broker's log lines of the last captured call */

static void on_stopped(void *ctx)
{
    (void)ctx;
    stopped++;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int hello(const drafter *d)
{
    stub_init(WIRE_HELLO, WIRE_ROLE_DRAFTER, d->inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", d->name);
    return stub_send(d->rid);
}

static int heartbeat(const drafter *d)
{
    stub_init(WIRE_HEARTBEAT, WIRE_ROLE_DRAFTER, d->inc);
    stub_req.u.sent_ms = monotime_ms();
    return stub_send(d->rid);
}

static void target_heartbeat(void)
{
    stub_init(WIRE_HEARTBEAT, WIRE_ROLE_TARGET, TARGET_INC);
    stub_req.u.sent_ms = monotime_ms();
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
}

static int commit(const drafter *d, uint64_t step)
{
    stub_init(WIRE_CHECKPOINT_COMMITTED, WIRE_ROLE_DRAFTER, d->inc);
    stub_req.u.step = step;
    return stub_send(d->rid);
}

static int gstep(const drafter *d, wire_type t, uint64_t epoch, uint64_t step)
{
    return stub_group_step(d->rid, d->inc, t, epoch, step);
}

static int64_t grace_ms = 60000, heartbeat_ms = 1000;

static void tweak(queue_config *cfg)
{
    cfg->stop_grace_ms = grace_ms;
    cfg->heartbeat_ms = heartbeat_ms;
    cfg->liveness = 3;
    cfg->max_depth = 16;
    snprintf(cfg->log_level, sizeof cfg->log_level, "info");
}

/* A broker with the target's pool of 16 slots and n ready batches; drafter D said hello. */
static void setup(int64_t grace, int64_t hb, int ready)
{
    grace_ms = grace;
    heartbeat_ms = hb;
    stopped = 0;
    stub_broker_new(tweak);
    log_init_named(NULL, "info");
    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, TARGET_INC);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    stub_pool("target-t-7", TARGET_INC, POOL_INC, 16);
    if (ready) stub_make_ready("target-t-7", TARGET_INC, POOL_INC, ready);
    CHECK_EQ_INT(hello(&D), 0);
}

static void begin_stop(void)
{
    broker_stop_gracefully(stub_b, on_stopped, NULL);
}

static void capture(void (*fn)(void))
{
    stub_capture_log(fn, said, sizeof said);
    fputs(said, stdout);
}

/* Runs the broker's timers for ms (the stop's checks, the cron), with the heartbeats of the
 * target and of `beating` (may be NULL) in between, or until it stopped; whether it did. The
 * log lines it writes meanwhile go to said. */
static int run_ms_arg;
static const drafter *run_beating;
static void run_loop(void)
{
    for (uint64_t end = monotime_ms() + (uint64_t)run_ms_arg; monotime_ms() < end && !stopped;) {
        uv_run(&stub_loop, UV_RUN_NOWAIT);
        if (stopped) break;
        target_heartbeat();
        if (run_beating) CHECK_EQ_INT(heartbeat(run_beating), 0);
        sleep_ms(5);
    }
}

static bool run_for(int ms, const drafter *beating)
{
    run_ms_arg = ms;
    run_beating = beating;
    capture(run_loop);
    return stopped > 0;
}

/* A drafter in the middle of its stop: a lease (copying), then its batch in training, then its
 * final checkpoint to report. The stop ends after the report, not before, and each request is
 * served meanwhile. */
static void test_waits_for_the_drafter(void)
{
    setup(60000, 1000, 2);
    wire_grant g;
    CHECK_EQ_INT(stub_claim(&D, &g), 0);
    CHECK(!stub_status().stopping);
    capture(begin_stop);
    CHECK_EQ_INT(stopped, 0);
    CHECK(strstr(said, "waiting up to 60000 ms") != NULL);
    CHECK(strstr(said, "1 lease, 0 batches in training, 0 checkpoint reports: drafter d "
                       "(1 lease)") != NULL);
    CHECK(broker_stopping(stub_b));
    /* status (over the wire) says it stops, the grace, and what it waits for */
    wire_status s = stub_status();
    CHECK(s.stopping);
    CHECK_EQ_INT(s.stop.grace_ms, 60000);
    CHECK(s.stop.elapsed_ms < 60000);
    CHECK(s.stop.drafters == 1 && s.stop.leases == 1 && s.stop.held == 0 && s.stop.reports == 0);
    CHECK(strcmp(s.stop.waiting_for, "drafter d (1 lease)") == 0);

    /* nothing new: a claim (another drafter's: one that claims is not stopping) and a work
     * request are refused, retryably */
    CHECK_EQ_INT(hello(&E), 0);
    CHECK_EQ_INT(stub_claim(&E, NULL), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "the broker is stopping") != NULL);
    stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, TARGET_INC);
    stub_req.u.pool_incarnation = POOL_INC;
    CHECK_EQ_INT(stub_send("target-t-7"), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "the broker is stopping: no new work") != NULL);
    s = stub_status();
    CHECK_EQ_INT(s.buckets[0].leased, 1);
    CHECK_EQ_INT(s.buckets[0].ready, 1); /* the other ready slot was not granted */
    CHECK(!run_for(100, &D));

    CHECK_EQ_INT(stub_release(&D, g.lease_id), 0);
    CHECK(!run_for(100, &D)); /* its batch is in training */
    s = stub_status();
    CHECK(s.stopping && s.stop.leases == 0 && s.stop.held == 1 && s.stop.elapsed_ms >= 100);
    CHECK(strcmp(s.stop.waiting_for, "drafter d (1 batch in training)") == 0);
    CHECK_EQ_INT(stub_ack(&D, g.unit, 1), 0);
    CHECK(!run_for(100, &D)); /* acked, the checkpoint of step 1 is not reported yet */
    s = stub_status();
    CHECK(s.stopping && s.stop.held == 0 && s.stop.reports == 1);
    CHECK(strstr(s.stop.waiting_for, "drafter d (a checkpoint to report: acked step 1, "
                                     "reported 0)") != NULL);
    uint64_t settled_at = monotime_ms();
    CHECK_EQ_INT(commit(&D, 1), 0);
    s = stub_status(); /* settled: nothing left, it exits after STOP_SETTLE_MS */
    CHECK(s.stopping && s.stop.drafters == 0 && s.stop.waiting_for[0] == '\0');
    CHECK(run_for(2000, NULL));
    /* not at once: settled for STOP_SETTLE_MS (200 ms) first, so that the drafter has read the
     * reply to its report before the broker goes (less a few ms: libuv's clock is coarse) */
    uint64_t settle = monotime_ms() - settled_at;
    printf("settled: stopped after %llu ms\n", (unsigned long long)settle);
    CHECK(settle >= 180);
    CHECK(strstr(said, "stop: all settled after") != NULL);
    CHECK_EQ_INT(stopped, 1);
    CHECK(!broker_stopping(stub_b));
    stub_broker_free();
}

/* Whether s is valid UTF-8 (no character cut short, no stray continuation byte). */
static bool utf8_valid(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = *p < 0x80 ? 0 : (*p & 0xe0) == 0xc0 ? 1 : (*p & 0xf0) == 0xe0 ? 2
                : (*p & 0xf8) == 0xf0 ? 3 : -1;
        if (n < 0) return false;
        for (p++; n > 0; n--, p++)
            if ((*p & 0xc0) != 0x80) return false;
    }
    return true;
}

/* Who the stop waits for, cut to 255 bytes in the status, is cut between characters: four
 * drafters named "N" and 25 "é" (2 bytes each) holding a lease each, after d, put byte 252 (where
 * "..." goes) inside an "é" of the fourth one's name (defect: the cut split it, and dflash-ctl's
 * JSON carried invalid UTF-8). */
static void test_waiting_for_cut_in_utf8(void)
{
    setup(60000, 1000, 5);
    CHECK_EQ_INT(stub_claim(&D, NULL), 0);
    static drafter many[4];
    static char rids[4][16], names[4][64];
    for (int i = 0; i < 4; i++) {
        snprintf(rids[i], sizeof rids[i], "drafter-u-%d", i);
        int n = snprintf(names[i], sizeof names[i], "%d", i + 1);
        for (int k = 0; k < 25; k++) n += snprintf(names[i] + n, sizeof names[i] - n, "\xc3\xa9");
        many[i] = (drafter){rids[i], names[i], 0x100u + (uint64_t)i};
        CHECK_EQ_INT(hello(&many[i]), 0);
        CHECK_EQ_INT(stub_claim(&many[i], NULL), 0);
    }
    capture(begin_stop);
    wire_status s = stub_status();
    CHECK(s.stopping && s.stop.drafters == 5 && s.stop.leases == 5);
    size_t len = strlen(s.stop.waiting_for);
    printf("waiting_for (%zu bytes): %s\n", len, s.stop.waiting_for);
    CHECK(len <= 255 && len >= 250);
    CHECK(len >= 3 && strcmp(s.stop.waiting_for + len - 3, "...") == 0);
    CHECK(utf8_valid(s.stop.waiting_for));
    CHECK(strncmp(s.stop.waiting_for, "drafter d (1 lease), drafter 1\xc3\xa9", 32) == 0);
    stub_broker_free();
}

/* The log's list of who the stop waits for (640 bytes) is cut once, after a character, and stays
 * so: eight drafters named with 15 four-byte characters each, after d, put the cut (byte 636)
 * in the last byte of one, so that it backs off 3 bytes and leaves the list at 636 bytes, where
 * a ninth one's part must not be appended (defect it guards: the appends after a cut tested for
 * a cut by the length left, which a 4-byte back-off fooled: "......" and more). */
static void test_waiting_for_cut_once(void)
{
    setup(60000, 1000, 10);
    CHECK_EQ_INT(stub_claim(&D, NULL), 0);
    static drafter many[9];
    static char rids[9][16], names[9][64];
    for (int i = 0; i < 9; i++) {
        snprintf(rids[i], sizeof rids[i], "drafter-w-%d", i);
        for (int k = 0; k < 15; k++) /* U+1F600 + i, fifteen times: 60 bytes */
            memcpy(names[i] + 4 * k, (const char[]){'\xf0', '\x9f', '\x98', (char)(0x80 + i)}, 4);
        names[i][60] = '\0';
        many[i] = (drafter){rids[i], names[i], 0x200u + (uint64_t)i};
        CHECK_EQ_INT(hello(&many[i]), 0);
        CHECK_EQ_INT(stub_claim(&many[i], NULL), 0);
    }
    capture(begin_stop);
    CHECK(strstr(said, "10 leases, 0 batches in training, 0 checkpoint reports: drafter d") != NULL);
    const char *cut = strstr(said, "...");
    CHECK(cut != NULL && strstr(cut + 3, "...") == NULL); /* one cut */
    CHECK(strstr(said, "\xf0\x9f\x98\x87...\n") != NULL); /* after the 8th's 11th character */
    CHECK(utf8_valid(said));
    stub_broker_free();
}

/* A drafter that claims while the broker stops is not stopping: its checkpoint report comes to
 * the next broker, the stop does not wait for it. */
static void test_claiming_drafter_not_waited_for(void)
{
    setup(60000, 1000, 1);
    wire_grant g;
    CHECK_EQ_INT(stub_claim(&D, &g), 0);
    CHECK_EQ_INT(stub_release(&D, g.lease_id), 0);
    CHECK_EQ_INT(stub_ack(&D, g.unit, 5), 0);
    CHECK_EQ_INT(commit(&D, 3), 0); /* a periodic checkpoint before the ack's step */
    capture(begin_stop);
    CHECK(strstr(said, "drafter d (a checkpoint to report: acked step 5, reported 3)") != NULL);
    CHECK(!run_for(100, &D));
    CHECK_EQ_INT(stub_claim(&D, NULL), DFLASH_EAGAIN);
    CHECK(run_for(2000, &D));
    CHECK(strstr(said, "all settled") != NULL);
    stub_broker_free();
}

/* Group g's rank 0 posts its rendezvous id for epoch. */
static void set_id(const drafter *d, uint64_t epoch)
{
    stub_init(WIRE_GROUP_SET_ID, WIRE_ROLE_DRAFTER, d->inc);
    snprintf(stub_req.u.set_id.group, sizeof stub_req.u.set_id.group, "g");
    stub_req.u.set_id.epoch = epoch;
    stub_req.u.set_id.id_len = 4;
    memcpy(stub_req.u.set_id.id, "rdv0", 4);
    CHECK_EQ_INT(stub_send(d->rid), 0);
}

/* A group of two: rank 0 reserved step 1 before the stop. Rank 1 still gets its slot of it, the
 * step ends with rank 0's StepDone; step 2 is not reserved. */
static void test_group_step_in_flight(void)
{
    setup(60000, 1000, 4);
    CHECK_EQ_INT(hello(&E), 0);
    CHECK_EQ_INT(stub_group_join(&D, 0, 0, NULL), 0);
    wire_group_view v;
    CHECK_EQ_INT(stub_group_join(&E, 0, 0, &v), 0);
    uint64_t epoch = v.epoch;
    CHECK_EQ_INT(v.rank, 1);
    set_id(&D, epoch);

    CHECK_EQ_INT(gstep(&D, WIRE_STEP_CLAIM, epoch, 1), 0); /* reserves both slots */
    uint64_t lease_d = stub_rep.u.sgrant.grant.lease_id;
    capture(begin_stop);
    CHECK(strstr(said, "drafter d (1 lease)") != NULL);
    CHECK(strstr(said, "drafter e (1 lease)") != NULL);
    CHECK_EQ_INT(gstep(&E, WIRE_STEP_CLAIM, epoch, 1), 0); /* its reserved slot */
    uint64_t lease_e = stub_rep.u.sgrant.grant.lease_id;
    CHECK_EQ_INT(stub_release(&D, lease_d), 0);
    CHECK_EQ_INT(stub_release(&E, lease_e), 0);
    CHECK(!run_for(100, &D));
    CHECK_EQ_INT(gstep(&D, WIRE_STEP_DONE, epoch, 1), 0);
    CHECK_EQ_INT(stub_status().batches_trained, 2);
    wire_status s = stub_status(); /* rank 0's StepDone is its ack: its checkpoint comes next */
    CHECK(s.stopping && s.stop.drafters == 1 && s.stop.held == 0 && s.stop.reports == 1);
    CHECK(strcmp(s.stop.waiting_for, "drafter d (a checkpoint to report: acked step 1, "
                                     "reported 0)") == 0);
    CHECK_EQ_INT(gstep(&D, WIRE_STEP_CLAIM, epoch, 2), DFLASH_EAGAIN); /* no new step */
    CHECK(strstr(stub_rep.u.error.message, "the broker is stopping") != NULL);
    CHECK_EQ_INT(gstep(&E, WIRE_STEP_CLAIM, epoch, 2), DFLASH_EAGAIN);
    s = stub_status();
    CHECK_EQ_INT(s.buckets[0].leased, 0);
    CHECK_EQ_INT(s.buckets[0].ready, 2);
    CHECK(run_for(2000, &D)); /* both claim on: neither is stopping */
    CHECK(strstr(said, "all settled") != NULL);
    stub_broker_free();
}

/* What a drafter owes is taken from the requests it was served, and only forward: a late ack
 * of an earlier step (a batch trained before its last checkpoint, acked now) leaves the report
 * owed for step 5, and a refused ack (a batch past the plan) names no step trained: the stop
 * waits for the report of step 5, and ends with it (defects they guard: the late ack let the
 * broker exit before the final report; the refused one held it until the grace). */
static void test_report_marks(void)
{
    setup(60000, 1000, 2);
    wire_grant g1, g2;
    CHECK_EQ_INT(stub_claim(&D, &g1), 0);
    CHECK_EQ_INT(stub_release(&D, g1.lease_id), 0);
    CHECK_EQ_INT(stub_claim(&D, &g2), 0);
    CHECK_EQ_INT(stub_release(&D, g2.lease_id), 0);
    CHECK_EQ_INT(stub_ack(&D, g1.unit, 5), 0);
    CHECK_EQ_INT(commit(&D, 3), 0);
    capture(begin_stop);
    CHECK(strstr(said, "drafter d (1 batch in training, a checkpoint to report: acked step 5, "
                       "reported 3)") != NULL);
    CHECK_EQ_INT(stub_ack(&D, g2.unit, 2), 0); /* late: trained at step 2 */
    wire_status s = stub_status();
    CHECK(s.stopping && s.stop.held == 0 && s.stop.reports == 1);
    CHECK(strcmp(s.stop.waiting_for, "drafter d (a checkpoint to report: acked step 5, "
                                     "reported 3)") == 0);
    wire_unit past = {0, 0, 100000};
    CHECK(stub_ack(&D, past, 9) != 0); /* refused */
    s = stub_status();
    CHECK(strcmp(s.stop.waiting_for, "drafter d (a checkpoint to report: acked step 5, "
                                     "reported 3)") == 0);
    CHECK(!run_for(100, &D));
    CHECK_EQ_INT(commit(&D, 5), 0);
    CHECK(run_for(2000, &D));
    CHECK(strstr(said, "all settled") != NULL);
    stub_broker_free();
}

/* A grace shorter than the settling time (200 ms): the stop ends with the grace once everything
 * is settled, and says so, not "exiting with 0 leases, ... unsettled". */
static void test_settled_when_grace_ends(void)
{
    setup(150, 1000, 1);
    wire_grant g;
    CHECK_EQ_INT(stub_claim(&D, &g), 0);
    capture(begin_stop);
    CHECK_EQ_INT(stub_release(&D, g.lease_id), 0);
    CHECK_EQ_INT(stub_ack(&D, g.unit, 1), 0);
    CHECK_EQ_INT(commit(&D, 1), 0);
    CHECK(run_for(5000, &D));
    CHECK(strstr(said, "stop: all settled after") != NULL);
    CHECK(strstr(said, "unsettled") == NULL);
    stub_broker_free();
}

/* Runs the broker's timers with the target beating (D silent) until the stop waits for nothing
 * (or it stopped, or 5 s passed). */
static void run_until_settled(void)
{
    for (uint64_t end = monotime_ms() + 5000; monotime_ms() < end && !stopped;) {
        uv_run(&stub_loop, UV_RUN_NOWAIT);
        if (stopped) break;
        target_heartbeat();
        if (stub_status().stop.drafters == 0) break;
        sleep_ms(5);
    }
}

/* Settled, then unsettled again before the exit: the drafter training a batch was expired (a
 * network blip: heartbeat 100 ms x liveness 3), which settled the stop; it says hello again
 * with that batch within STOP_SETTLE_MS. The stop waits for its ack again instead of exiting
 * under it once the first settling time is over, and settles for STOP_SETTLE_MS again after
 * the final report (the drafter reads its reply). */
static void test_unsettled_again(void)
{
    setup(60000, 100, 1);
    wire_grant g;
    CHECK_EQ_INT(stub_claim(&D, &g), 0);
    CHECK_EQ_INT(stub_release(&D, g.lease_id), 0);
    capture(begin_stop);
    capture(run_until_settled);
    CHECK(!stopped);
    CHECK(strstr(said, "peer d (drafter") != NULL && strstr(said, "expired") != NULL);
    stub_init(WIRE_HELLO, WIRE_ROLE_DRAFTER, D.inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", D.name);
    stub_req.u.hello.n_held = 1;
    stub_req.u.hello.held[0] = g.unit;
    CHECK_EQ_INT(stub_send(D.rid), 0);
    wire_status s = stub_status();
    CHECK(s.stopping && s.stop.drafters == 1 && s.stop.held == 1);
    CHECK(!run_for(400, &D)); /* two settling times: it waits for the ack */
    CHECK(strcmp(stub_status().stop.waiting_for, "drafter d (1 batch in training)") == 0);
    CHECK_EQ_INT(stub_ack(&D, g.unit, 1), 0);
    uint64_t settled_at = monotime_ms();
    CHECK_EQ_INT(commit(&D, 1), 0);
    CHECK(run_for(2000, &D));
    CHECK(strstr(said, "all settled") != NULL);
    uint64_t settle = monotime_ms() - settled_at; /* a settling time of its own again */
    printf("settled again: stopped after %llu ms\n", (unsigned long long)settle);
    CHECK(settle >= 180);
    stub_broker_free();
}

/* A step aborted during the stop (rank 1 left; rank 0, back at model step 0, resolves step 1
 * as not trained) is no step reserved any more: its number claimed again, in the group's next
 * epoch, is a new step and is refused like any new one (no new leases while stopping), though
 * it has the number of the step the group had reserved. */
static void test_aborted_step_not_reserved(void)
{
    setup(60000, 1000, 4);
    CHECK_EQ_INT(hello(&E), 0);
    CHECK_EQ_INT(stub_group_join(&D, 0, 0, NULL), 0);
    wire_group_view v;
    CHECK_EQ_INT(stub_group_join(&E, 0, 0, &v), 0);
    set_id(&D, v.epoch);
    CHECK_EQ_INT(gstep(&D, WIRE_STEP_CLAIM, v.epoch, 1), 0); /* reserves both slots */
    capture(begin_stop);
    CHECK_EQ_INT(gstep(&E, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(stub_group_join(&D, 0, 0, &v), 0); /* at step 0: step 1 is aborted */
    CHECK(v.rank == 0 && v.world == 1 && v.step == 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.buckets[0].leased, 0);
    CHECK_EQ_INT(s.buckets[0].ready, 4);
    set_id(&D, v.epoch);
    CHECK_EQ_INT(gstep(&D, WIRE_STEP_CLAIM, v.epoch, 1), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "the broker is stopping") != NULL);
    CHECK_EQ_INT(stub_status().buckets[0].leased, 0);
    stub_broker_free();
}

/* The lease holder is dead (no heartbeat): the stop ends once the cron has expired it (heartbeat
 * 100 ms x liveness 3), long before the grace of 60 s. */
static void test_dead_holder(void)
{
    setup(60000, 100, 1);
    wire_grant g;
    CHECK_EQ_INT(stub_claim(&D, &g), 0);
    uint64_t t0 = monotime_ms();
    capture(begin_stop);
    CHECK(!stopped);
    CHECK(run_for(5000, NULL));
    uint64_t took = monotime_ms() - t0;
    printf("dead holder: stopped after %llu ms\n", (unsigned long long)took);
    CHECK(took < 5000);
    CHECK(strstr(said, "peer d (drafter") != NULL && strstr(said, "expired") != NULL);
    CHECK(strstr(said, "all settled") != NULL);
    stub_broker_free();
}

/* A live holder that never releases: the grace (300 ms) ends the stop, naming it. */
static void test_grace_over(void)
{
    setup(300, 1000, 1);
    CHECK_EQ_INT(stub_claim(&D, NULL), 0);
    uint64_t t0 = monotime_ms();
    capture(begin_stop);
    CHECK(run_for(5000, &D));
    uint64_t took = monotime_ms() - t0;
    printf("grace over: stopped after %llu ms\n", (unsigned long long)took);
    CHECK(took >= 300 && took < 5000);
    CHECK(strstr(said, "--stop-grace-ms 300 is over: exiting with 1 lease, 0 batches in training, "
                       "0 checkpoint reports: drafter d (1 lease) unsettled") != NULL);
    stub_broker_free();
}

/* A second stop request ends the stop at once. */
static void test_second_request(void)
{
    setup(60000, 1000, 1);
    CHECK_EQ_INT(stub_claim(&D, NULL), 0);
    capture(begin_stop);
    CHECK(!run_for(50, &D));
    capture(begin_stop);
    CHECK_EQ_INT(stopped, 1);
    CHECK(strstr(said, "a second stop request: exiting at once with 1 lease") != NULL);
    stub_broker_free();
}

/* Nothing in progress, or no grace: the stop is at once (inside the call). */
static void test_at_once(void)
{
    setup(60000, 1000, 1);
    capture(begin_stop);
    CHECK_EQ_INT(stopped, 1);
    CHECK(strstr(said, "nothing in progress") != NULL);
    stub_broker_free();

    setup(0, 1000, 1);
    CHECK_EQ_INT(stub_claim(&D, NULL), 0);
    capture(begin_stop);
    CHECK_EQ_INT(stopped, 1);
    CHECK(strstr(said, "--stop-grace-ms 0: exiting at once with 1 lease") != NULL);
    stub_broker_free();
}

int main(void)
{
    test_waits_for_the_drafter();
    test_claiming_drafter_not_waited_for();
    test_group_step_in_flight();
    test_dead_holder();
    test_grace_over();
    test_second_request();
    test_at_once();
    test_waiting_for_cut_in_utf8();
    test_report_marks();
    test_settled_when_grace_ends();
    test_unsettled_again();
    test_aborted_step_not_reserved();
    test_waiting_for_cut_once();
    CHECK_DONE();
}
