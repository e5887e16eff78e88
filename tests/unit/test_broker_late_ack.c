/* test_broker_late_ack: a late ack of a batch that was handed out again meanwhile (broker_dispatch
 * without sockets, journal in memory, the broker's cron on a libuv loop run by hand).
 *
 * The case: drafter a copies batch 0/0/0 and trains it, but is silent past the liveness window
 * (a paused process, a network blip) and is expired: the batch goes back to to-do, is produced
 * again and granted to drafter b. Then a comes back: its ack is answered STALE, it says hello
 * holding the batch and acks it again (services/drafter/worker_loop.c, ack_held). a did train
 * it, so its ack is recorded (the ledger counts the batch once, at a's step). What becomes of
 * b's delivery, and what the broker says, is the truth of each case:
 *   - b holds the lease and has not released it (it may be copying): its release is refused
 *     STALE, so b drops its copy and the batch is not trained twice (defect: the release was
 *     taken, b trained the batch again and its ack was refused as "trained twice"), also when
 *     a checkpoint committed a's step before b's release;
 *   - b's lease ends without a release (b expired too): the slot goes back to the target, not to
 *     READY (defect: the trained batch was granted once more, to the next claim);
 *   - b has released it already (it is training it): nothing can stop that; a's ack says it is
 *     trained twice, and b's ack is refused EXISTS as "trained twice" even when b's step equals
 *     a's (defect: a coincidence of steps was answered "a repeated ack", with no warning);
 *   - b acked it first, a comes back and acks it at the same step: a's ack is refused as trained
 *     twice (defect: a repeat, by the step alone); a repeat is decided by who acked (the same
 *     process, or a restart of the same run), also when the broker recreated the acker's entry
 *     after expiring it;
 *   - b had copied it, a resume sends it to to-do again and it is granted to c: b's death later
 *     does not send it back to to-do while c holds it;
 *   - a says hello holding it and is expired again before its ack, while a slot holds it ready
 *     again or b has copied it: it stays with that delivery, neither sent to to-do (defect: the
 *     next work request produced it into a second slot, and it was trained twice) nor counted
 *     as a failed delivery.
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

static const drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2},
                     C = {"drafter-c-3", "c", 0xc3};
static const wire_unit X = {0, 0, 0};

static char said[16384]; /* the broker's log lines of the last captured call */

static void tweak(queue_config *cfg)
{
    cfg->heartbeat_ms = 50;
    cfg->liveness = 3; /* a silent peer is expired after 150 ms */
    cfg->lease_timeout_ms = 60000;
    cfg->max_depth = 16;
    snprintf(cfg->log_level, sizeof cfg->log_level, "info");
}

/* d's hello, holding n_held units, as a trainer of run run_id (0: none said). */
static int hello_run(const drafter *d, const wire_unit *held, uint32_t n_held, uint64_t run_id)
{
    stub_init(WIRE_HELLO, WIRE_ROLE_DRAFTER, d->inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", d->name);
    stub_req.u.hello.n_held = n_held;
    for (uint32_t i = 0; i < n_held; i++) stub_req.u.hello.held[i] = held[i];
    stub_req.u.hello.run_id = run_id;
    return stub_send(d->rid);
}

static int hello(const drafter *d, const wire_unit *held, uint32_t n_held)
{
    return hello_run(d, held, n_held, 0);
}

static void heartbeat(const char *rid, wire_role role, uint64_t inc)
{
    stub_init(WIRE_HEARTBEAT, role, inc);
    stub_req.u.sent_ms = monotime_ms();
    CHECK_EQ_INT(stub_send(rid), 0);
}

static bool same_unit(wire_unit a, wire_unit b)
{
    return a.epoch == b.epoch && a.bucket == b.bucket && a.index == b.index;
}

/* Runs the broker's cron, the target and the drafters `beating` (NULL-terminated) heartbeating,
 * until the broker has expired drafter `silent` (the live peer count drops to the target and
 * those beating); whether it did within 5 s. */
static bool expire(const drafter *silent, const drafter *const *beating)
{
    struct timespec ts = {0, 5 * 1000000L};
    uint32_t live = 1;
    while (beating[live - 1]) live++;
    for (uint64_t end = monotime_ms() + 5000; monotime_ms() < end;) {
        uv_run(&stub_loop, UV_RUN_NOWAIT);
        heartbeat("target-t-7", WIRE_ROLE_TARGET, TARGET_INC);
        for (const drafter *const *d = beating; *d; d++)
            heartbeat((*d)->rid, WIRE_ROLE_DRAFTER, (*d)->inc);
        if (stub_status().peers == live) return true;
        nanosleep(&ts, NULL);
    }
    printf("drafter %s was not expired\n", silent->name);
    return false;
}

/* A broker with the target's pool of 4 slots, batch X ready. */
static void setup_target(void)
{
    stub_broker_new(tweak);
    log_init_named(NULL, "info");
    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, TARGET_INC);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    stub_pool("target-t-7", TARGET_INC, POOL_INC, 4);
}

/* setup_target; drafters a and b said hello. a copied batch X (released it), trained it and
 * went silent; the broker expired it and X went back to to-do; X was produced again (ready). */
static void setup_ready_again(void)
{
    setup_target();
    CHECK_EQ_INT(hello(&A, NULL, 0), 0);
    CHECK_EQ_INT(hello(&B, NULL, 0), 0);
    stub_make_ready("target-t-7", TARGET_INC, POOL_INC, 1);
    wire_grant ga;
    CHECK_EQ_INT(stub_claim(&A, &ga), 0);
    CHECK(same_unit(ga.unit, X));
    CHECK_EQ_INT(stub_release(&A, ga.lease_id), 0);
    CHECK(expire(&A, (const drafter *const[]){&B, NULL}));
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_inflight, 0); /* X back to to-do */
    stub_make_ready("target-t-7", TARGET_INC, POOL_INC, 1);
}

/* setup_ready_again, and X granted to b (*gb: b's grant). */
static void setup(wire_grant *gb)
{
    setup_ready_again();
    CHECK_EQ_INT(stub_claim(&B, gb), 0);
    CHECK(same_unit(gb->unit, X)); /* produced again, granted to b */
}

/* a comes back (worker_loop's ack_held): its ack is STALE (forgotten), its hello holds X, its
 * ack again is recorded at step 5. The log of that last ack goes to said. */
static void late_ack_of_a(void)
{
    CHECK_EQ_INT(stub_ack(&A, X, 5), DFLASH_ESTALE);
    CHECK_EQ_INT(hello(&A, &X, 1), 0);
    CHECK_EQ_INT(stub_ack(&A, X, 5), 0);
}

static void capture(void (*fn)(void))
{
    stub_capture_log(fn, said, sizeof said);
    fputs(said, stdout);
}

/* b holds the lease (copying): its release is refused, the slot goes back to the target, the
 * batch is trained once. */
static void test_lease_out(void)
{
    wire_grant gb;
    setup(&gb);
    capture(late_ack_of_a);
    CHECK(strstr(said, "a acked batch 0/0/0 late, while drafter b held it again (lease ") != NULL);
    CHECK(strstr(said, "not released): that release is refused and the copy dropped, the batch "
                       "is not trained twice") != NULL);
    CHECK(strstr(said, "trained twice:") == NULL && strstr(said, "it is trained twice") == NULL);
    uint64_t releases = stub_status().releases;
    CHECK_EQ_INT(stub_release(&B, gb.lease_id), DFLASH_ESTALE);
    printf("b's release: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "batch 0/0/0 was trained meanwhile") != NULL);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.releases, releases); /* refused: no slot given back after a kept copy */
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.buckets[0].leased, 0);
    CHECK_EQ_INT(s.buckets[0].ready, 0);
    CHECK_EQ_INT(stub_claim(&B, NULL), DFLASH_EAGAIN); /* nothing ready: X is not granted again */
    /* the slot went back to the target, which is asked for the next batch, not X */
    stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, TARGET_INC);
    stub_req.u.pool_incarnation = POOL_INC;
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    CHECK_EQ_INT(stub_rep.u.work.unit.index, 1);
    stub_broker_free();
}

/* As test_lease_out, with a checkpoint that covers a's step committed before b's release: the
 * batch is committed, not only trained, and b's copy is still refused (the batch is not trained
 * twice). */
static void test_lease_out_committed(void)
{
    wire_grant gb;
    setup(&gb);
    capture(late_ack_of_a);
    stub_init(WIRE_CHECKPOINT_COMMITTED, WIRE_ROLE_DRAFTER, A.inc);
    stub_req.u.step = 5;
    CHECK_EQ_INT(stub_send(A.rid), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_committed, 1);
    CHECK_EQ_INT(s.committed_step, 5);
    CHECK_EQ_INT(stub_release(&B, gb.lease_id), DFLASH_ESTALE);
    printf("b's release: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "batch 0/0/0 was trained meanwhile") != NULL);
    s = stub_status();
    CHECK_EQ_INT(s.batches_committed, 1);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.buckets[0].leased, 0);
    CHECK_EQ_INT(s.buckets[0].ready, 0);
    CHECK_EQ_INT(stub_claim(&B, NULL), DFLASH_EAGAIN); /* X is not granted again */
    stub_broker_free();
}

/* b's lease ends without a release (b is expired too): the slot is not READY again with the
 * trained batch, the next claim does not get it. */
static void test_lease_expires(void)
{
    wire_grant gb;
    setup(&gb);
    capture(late_ack_of_a);
    CHECK_EQ_INT(hello(&C, NULL, 0), 0);
    CHECK(expire(&B, (const drafter *const[]){&A, &C, NULL}));
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.buckets[0].leased, 0);
    CHECK_EQ_INT(s.buckets[0].ready, 0);
    wire_grant gc = {0};
    int rc = stub_claim(&C, &gc);
    if (rc == 0) printf("c was granted batch %u/%u/%llu\n", gc.unit.epoch, gc.unit.bucket,
                        (unsigned long long)gc.unit.index);
    CHECK_EQ_INT(rc, DFLASH_EAGAIN);
    stub_broker_free();
}

/* b released X before a's late ack (b is training it): trained twice, said at a's ack; b's ack
 * at the same step as a's is refused as trained twice, not as a repeat; the ledger counts X
 * once. */
static void test_copied_already(void)
{
    wire_grant gb;
    setup(&gb);
    CHECK_EQ_INT(stub_release(&B, gb.lease_id), 0);
    capture(late_ack_of_a);
    CHECK(strstr(said, "a acked batch 0/0/0 late (trained at step 5), while drafter b trains it "
                       "again (copied, not acked): it is trained twice; the ledger counts it "
                       "once, b's ack will be refused") != NULL);
    CHECK_EQ_INT(stub_ack(&B, X, 5), DFLASH_EEXISTS);
    printf("b's ack: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "already trained at step 5: trained twice") != NULL);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.acks, 1); /* a's; b's was refused */
    stub_broker_free();
}

/* b copied X (it holds it, training) when a's late ack records X trained; a then resumes from a
 * checkpoint before that step, so X is to do again, is produced and granted to c. The grant
 * takes X off b's held batches: when b dies, X (c's now) is neither counted as a failed
 * delivery nor sent back to to-do while c holds its lease, to be produced a third time. */
static void test_held_then_granted_again(void)
{
    wire_grant gb, gc;
    setup(&gb);
    CHECK_EQ_INT(stub_release(&B, gb.lease_id), 0);
    capture(late_ack_of_a);
    CHECK_EQ_INT(hello(&C, NULL, 0), 0);
    stub_init(WIRE_RESUME_FROM, WIRE_ROLE_DRAFTER, A.inc);
    stub_req.u.step = 4;
    CHECK_EQ_INT(stub_send(A.rid), 0);
    CHECK_EQ_INT(stub_status().batches_trained, 0);
    stub_make_ready("target-t-7", TARGET_INC, POOL_INC, 1);
    CHECK_EQ_INT(stub_claim(&C, &gc), 0);
    CHECK(same_unit(gc.unit, X));
    wire_status before = stub_status();
    CHECK(expire(&B, (const drafter *const[]){&A, &C, NULL}));
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_inflight, before.batches_inflight);
    CHECK_EQ_INT(s.batches_todo, before.batches_todo);
    CHECK_EQ_INT(s.buckets[0].leased, 1); /* c's */
    stub_broker_free();
}

/* The other order: b trains X and acks it at step 5 first, then a comes back and acks it at
 * step 5 too. X was trained twice (a's model and b's): a's ack is refused as trained twice,
 * with a warning (defect: the same step made it "a repeated ack", said of nothing). b's own
 * retry is still a repeat, also after b was expired and came back (the broker's peer entry for
 * b is a new one; b's process is the same). */
static void late_ack_of_a_second(void)
{
    CHECK_EQ_INT(stub_ack(&A, X, 5), DFLASH_ESTALE);
    CHECK_EQ_INT(hello(&A, &X, 1), 0);
    CHECK_EQ_INT(stub_ack(&A, X, 5), DFLASH_EEXISTS);
}

static void test_acked_second(void)
{
    wire_grant gb;
    setup(&gb);
    CHECK_EQ_INT(stub_release(&B, gb.lease_id), 0);
    CHECK_EQ_INT(stub_ack(&B, X, 5), 0);
    capture(late_ack_of_a_second);
    printf("a's ack: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "already trained at step 5: trained twice") != NULL);
    CHECK(strstr(said, "WARN") != NULL);
    CHECK(strstr(said, "a acked batch 0/0/0 at step 5, already trained at step 5: it is trained "
                       "twice") != NULL);
    CHECK_EQ_INT(stub_ack(&B, X, 5), DFLASH_EEXISTS); /* b's reply was lost: b retries */
    printf("b's retry: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "a repeated ack") != NULL);
    CHECK(expire(&B, (const drafter *const[]){&A, NULL}));
    CHECK_EQ_INT(stub_ack(&B, X, 5), DFLASH_ESTALE); /* forgotten: b says hello again */
    CHECK_EQ_INT(hello(&B, NULL, 0), 0);
    CHECK_EQ_INT(stub_ack(&B, X, 5), DFLASH_EEXISTS);
    printf("b's retry after its expiry: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "a repeated ack") != NULL);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.acks, 1); /* b's */
    stub_broker_free();
}

/* A trainer restarted from its checkpoint (a new process of the same run) acks again what the
 * checkpoint had unacked, at the same step: a repeat (the same run), not trained twice. */
static const drafter T = {"drafter-t-8", "t", 0xe8}, T2 = {"drafter-t-9", "t", 0xe9};
static void test_resumed_run_repeats(void)
{
    setup_target();
    CHECK_EQ_INT(hello_run(&T, NULL, 0, 0x5151), 0);
    stub_make_ready("target-t-7", TARGET_INC, POOL_INC, 1);
    wire_grant g;
    CHECK_EQ_INT(stub_claim(&T, &g), 0);
    CHECK(same_unit(g.unit, X));
    CHECK_EQ_INT(stub_release(&T, g.lease_id), 0);
    CHECK_EQ_INT(stub_ack(&T, X, 5), 0);
    CHECK_EQ_INT(hello_run(&T2, NULL, 0, 0x5151), 0); /* t restarted: it replaces itself */
    CHECK_EQ_INT(stub_ack(&T2, X, 5), DFLASH_EEXISTS);
    printf("the restarted t's ack: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "a repeated ack") != NULL);
    stub_broker_free();
}

/* b gives its lease back unread (it cannot map the slot) after a's late ack: the slot is freed,
 * and the log does not say the trained batch goes back to to-do (it is not in flight). */
static wire_grant unread_grant;
static void release_unread_of_b(void)
{
    stub_init(WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, B.inc);
    stub_req.u.lease_id = unread_grant.lease_id;
    stub_req.u.release_unread = true;
    CHECK_EQ_INT(stub_send(B.rid), 0);
}

static void test_unread_after_late_ack(void)
{
    setup(&unread_grant);
    capture(late_ack_of_a);
    capture(release_unread_of_b);
    CHECK(strstr(said, "b could not read slot") != NULL);
    CHECK(strstr(said, "not in flight any more (trained meanwhile: a late ack)") != NULL);
    CHECK(strstr(said, "back to to-do") == NULL);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.batches_inflight, 0);
    stub_broker_free();
}

/* X granted to a group step (g, a group of one) when a's late ack lands: a group's release is
 * never refused (the group would re-form), so the group trains X again, and the log says so
 * (it said the release would be refused and X not trained twice); the group's StepDone then
 * records nothing twice. */
static const drafter G = {"drafter-g-5", "g0", 0xc5};
static void test_group_step_holds_it(void)
{
    setup_ready_again();
    CHECK_EQ_INT(hello(&G, NULL, 0), 0);
    wire_group_view v;
    CHECK_EQ_INT(stub_group_join(&G, 0, 0, &v), 0);
    CHECK_EQ_INT(stub_group_set_id(&G, v.epoch, 0x11), 0);
    CHECK_EQ_INT(stub_group_step(G.rid, G.inc, WIRE_STEP_CLAIM, v.epoch, 1), 0);
    wire_step_grant sg = stub_rep.u.sgrant;
    CHECK(same_unit(sg.units[0], X));
    capture(late_ack_of_a);
    CHECK(strstr(said, "while a group step holds it again (lease ") != NULL);
    CHECK(strstr(said, "the group trains it again, it is trained twice") != NULL);
    CHECK(strstr(said, "that release is refused") == NULL);
    CHECK_EQ_INT(stub_release(&G, sg.grant.lease_id), 0); /* not refused: no re-form */
    CHECK_EQ_INT(stub_group_step(G.rid, G.inc, WIRE_STEP_DONE, v.epoch, 1), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.acks, 1); /* a's; the group's is not recorded twice */
    stub_broker_free();
}

/* A group of two (g0, h) holds X in step 1 (not released) when a's late ack lands; h leaves
 * and g0 joins again reporting the epoch failed: the step is aborted, its leases revoked. X's
 * slot is freed (not ready again) and the abort counts it apart, not as going back to to-do
 * (it said "2 of its 2 batches go back to to-do"). */
static const drafter H = {"drafter-h-6", "h", 0xd6};
static wire_group_view abort_view;
static void abort_step_of_g(void)
{
    stub_init(WIRE_GROUP_LEAVE, WIRE_ROLE_DRAFTER, H.inc);
    snprintf(stub_req.u.gstep.group, sizeof stub_req.u.gstep.group, "g");
    CHECK_EQ_INT(stub_send(H.rid), 0);
    CHECK_EQ_INT(stub_group_join(&G, 0, abort_view.epoch, NULL), 0);
}

static void test_group_abort(void)
{
    setup_ready_again();
    stub_make_ready("target-t-7", TARGET_INC, POOL_INC, 1); /* the step's second batch */
    CHECK_EQ_INT(hello(&G, NULL, 0), 0);
    CHECK_EQ_INT(hello(&H, NULL, 0), 0);
    CHECK_EQ_INT(stub_group_join(&G, 0, 0, NULL), 0);
    CHECK_EQ_INT(stub_group_join(&H, 0, 0, NULL), 0);
    CHECK_EQ_INT(stub_group_join(&G, 0, 0, &abort_view), 0);
    CHECK_EQ_INT(abort_view.world, 2);
    CHECK_EQ_INT(stub_group_set_id(&G, abort_view.epoch, 0x11), 0);
    CHECK_EQ_INT(stub_group_step(G.rid, G.inc, WIRE_STEP_CLAIM, abort_view.epoch, 1), 0);
    wire_step_grant sg = stub_rep.u.sgrant;
    CHECK_EQ_INT(sg.n_units, 2);
    CHECK(same_unit(sg.units[0], X) || same_unit(sg.units[1], X));
    capture(late_ack_of_a);
    capture(abort_step_of_g);
    CHECK(strstr(said, "step 1 aborted: 1 of its 2 batches go back to to-do (1 trained meanwhile: "
                       "another drafter's late ack)") != NULL);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.buckets[0].ready, 1); /* the other batch's slot; X's was freed */
    stub_broker_free();
}

/* X ready again in a slot (and, with copied, granted to b and copied) when a says hello holding
 * it and is expired again before acking: X stays with that delivery. The next work request
 * produces another batch, X is granted once and trained once. */
static void rehello_then_expired(bool copied)
{
    setup_ready_again();
    wire_grant gb = {0};
    if (copied) {
        CHECK_EQ_INT(stub_claim(&B, &gb), 0);
        CHECK(same_unit(gb.unit, X));
        CHECK_EQ_INT(stub_release(&B, gb.lease_id), 0);
    }
    wire_status before = stub_status();
    CHECK_EQ_INT(hello(&A, &X, 1), 0);
    CHECK(expire(&A, (const drafter *const[]){&B, NULL}));
    wire_status s = stub_status();
    printf("%s: in flight %llu -> %llu, to do %llu -> %llu, quarantined %llu\n",
           copied ? "b copied X" : "X ready", (unsigned long long)before.batches_inflight,
           (unsigned long long)s.batches_inflight, (unsigned long long)before.batches_todo,
           (unsigned long long)s.batches_todo, (unsigned long long)s.quarantined);
    CHECK_EQ_INT(s.batches_inflight, before.batches_inflight);
    CHECK_EQ_INT(s.batches_todo, before.batches_todo);
    CHECK_EQ_INT(s.buckets[0].ready, copied ? 0 : 1);
    stub_make_ready("target-t-7", TARGET_INC, POOL_INC, 1);
    if (!copied) {
        CHECK_EQ_INT(stub_claim(&B, &gb), 0);
        CHECK(same_unit(gb.unit, X)); /* the older ready slot first */
        CHECK_EQ_INT(stub_release(&B, gb.lease_id), 0);
    }
    wire_grant other;
    CHECK_EQ_INT(stub_claim(&B, &other), 0);
    CHECK(!same_unit(other.unit, X)); /* X was not produced again */
    CHECK_EQ_INT(stub_ack(&B, X, 7), 0);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.quarantined, 0);
    stub_broker_free();
}

static void test_rehello_then_expired_ready(void) { rehello_then_expired(false); }
static void test_rehello_then_expired_copied(void) { rehello_then_expired(true); }

int main(void)
{
    test_lease_out();
    test_lease_out_committed();
    test_group_step_holds_it();
    test_group_abort();
    test_unread_after_late_ack();
    test_lease_expires();
    test_copied_already();
    test_held_then_granted_again();
    test_acked_second();
    test_resumed_run_repeats();
    test_rehello_then_expired_ready();
    test_rehello_then_expired_copied();
    CHECK_DONE();
}
