/* test_group_broker: the broker's data-parallel drafter groups (issue 7), driven through
 * broker_dispatch without sockets (journal in memory), with a scripted target and drafters.
 *
 * What a user would notice if it broke:
 *   - whole-step reservation: a group step gets exactly one slot per rank, reserved at once and
 *     only when that many are eligible (no rank ever waits on a partial step); a retried claim
 *     gets the same lease; every rank gets its own lease;
 *   - max_depth smaller than a group's step, or than min_ready plus a step, is refused, by
 *     `set` and by a join;
 *   - membership changes only at step boundaries: a join while a step is in flight waits, the
 *     epoch moves when the step is done; rank 0's id reaches the other ranks;
 *   - StepDone acks all R units once (a duplicate is harmless, a non-rank-0 is refused);
 *   - a member that dies or leaves mid-step: the step is aborted when the surviving first rank
 *     says its model did not take it (every unit back to to-do or READY, none acked), or acked
 *     when its model did; nothing is lost or acked twice; the aborted step's batches, granted
 *     again, count in status as redeliveries;
 *   - a survivor whose collective saw a rank's process end names it in its join (gone_rank):
 *     that member leaves the group at once (status, the next epoch), not at its expiry;
 *   - a joiner whose drafter shape differs from the group's is refused (MISMATCH, both shapes
 *     named) and the group neither re-forms nor lists it; once the group empties, the next
 *     creator's shape is the group's; a drafter stating no shape (older) is taken as before;
 *   - a join stating --exit-when-drained is answered SHUTDOWN once nothing is left to hand out
 *     (the plan done, or drained) and no step of a group waits for it, in a group that trained
 *     or had all its ranks, so the last rank at the data's end exits with its partners instead
 *     of waiting --group-wait-s for them; a group created at the data's end waits for its ranks;
 *   - the new messages are range-checked (wire_unpack/wire_pack refuse bad fields), and a
 *     field an older broker does not know (gone_rank, shape) is skipped there;
 *   - a group restarted whole waits for the member holding the newest committed checkpoint
 *     to be its rank 0 (a former rank 1 has none), for group-hold-ms at most;
 *   - every rank of a group expired mid-step (a paused node) and back: the step is trained once,
 *     acked when the model the group is created again from has it (whichever rank creates it),
 *     its units to do again when that model lacks it; never produced and trained again while
 *     the models have it;
 *   - the same across a broker restart between the orphaning and the group's return (a journal
 *     in a temp dir, compacted or not): the orphaned step's units stay in flight past the
 *     restart's orphan grace (they used to go back to to-do with the other batches in flight
 *     before the restart, and were trained twice when the group came back holding the step),
 *     the creating join acks or aborts them as without the restart, and nobody back within
 *     the hold (counted from the restart) aborts the step; a rank 0 that acked the step's units
 *     plainly after the restart (its StepDone answered Stale) has them counted once, whether
 *     the group is created again or the hold aborts the step;
 *   - gradient accumulation (GroupJoin.accumulate A, StepClaim.micro k): a joiner with another
 *     A is refused (MISMATCH), as is a group of more than 64 units a step (FULL); each
 *     micro-step is reserved whole (one slot per rank, at once, only when that many are
 *     eligible), k only after k-1, and the grant echoes k with that micro-step's units; StepDone
 *     acks every micro-step's units once; an abort gives them all back; a step with a micro-step
 *     never reserved cannot have been trained: with every member gone it is aborted, not
 *     orphaned (one with all of them is orphaned whole); a micro-step that can never be served
 *     (the plan has nothing left but the step's own batches, a drain with nothing filling) ends
 *     the step for every rank alike (SHUTDOWN), and stays ended when batches come again;
 *   - a target that restarted between a step's reservation and a late rank's StepClaim: the
 *     grant named the old pool incarnation with the new arena's shm name and handles, the rank
 *     copied unrelated bytes and exited; the claim is refused Stale, the group re-forms, the
 *     step is aborted and the next one is granted in the new pool.
 */
#include "check.h"
#include "broker_stub.h"
#include "config.h"
#include "err.h"
#include "ledger.h"
#include "log.h"
#include "monotime.h"
#include "test_files.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef stub_drafter drafter;

static int hello(const drafter *d)
{
    stub_init(WIRE_HELLO, WIRE_ROLE_DRAFTER, d->inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", d->name);
    return stub_send(d->rid);
}

/* A join stating drafter shape `shape` (0: none, as an older drafter), in words `text`. */
static int join_shaped(const drafter *d, uint64_t step, uint64_t shape, const char *text,
                       wire_group_view *v)
{
    stub_group_join_begin(d, step, 0);
    stub_req.u.join.shape = shape;
    snprintf(stub_req.u.join.shape_text, sizeof stub_req.u.join.shape_text, "%s", text);
    return stub_group_join_send(d, v);
}

/* A join of group "g" stating `acc` micro-steps a step (0: none, as an older drafter). */
static int join_acc(const drafter *d, uint64_t step, uint32_t acc, wire_group_view *v)
{
    stub_group_join_begin(d, step, 0);
    stub_req.u.join.accumulate = acc;
    return stub_group_join_send(d, v);
}

/* A join after a failed collective that saw rank `gone` of epoch `failed` end (gone_rank). */
static int join_gone(const drafter *d, uint64_t step, uint64_t failed, uint32_t gone,
                     wire_group_view *v)
{
    stub_group_join_begin(d, step, failed);
    stub_req.u.join.has_gone_rank = true;
    stub_req.u.join.gone_rank = gone;
    return stub_group_join_send(d, v);
}

/* Whether status lists member `name` in group g. */
static bool listed(const char *name)
{
    wire_status s = stub_status();
    const wire_group_stat *g = s.n_groups ? &s.groups[0] : NULL;
    for (uint32_t i = 0; g && i < g->n_members; i++)
        if (strcmp(g->members[i], name) == 0) return true;
    return false;
}

static int gstep(const drafter *d, wire_type t, uint64_t epoch, uint64_t step)
{
    return stub_group_step(d->rid, d->inc, t, epoch, step);
}

static int claim(const drafter *d, uint64_t epoch, uint64_t step, wire_step_grant *g)
{
    int rc = gstep(d, WIRE_STEP_CLAIM, epoch, step);
    if (!rc && g) *g = stub_rep.u.sgrant;
    return rc;
}

/* StepClaim of micro-step `micro`; the grant (may be NULL) on 0. */
static int claim_micro(const drafter *d, uint64_t epoch, uint64_t step, uint32_t micro,
                       wire_step_grant *g)
{
    stub_group_step_begin(d->inc, WIRE_STEP_CLAIM, epoch, step);
    stub_req.u.gstep.micro = micro;
    int rc = stub_send(d->rid);
    if (!rc && g) *g = stub_rep.u.sgrant;
    return rc;
}

static int release(const drafter *d, uint64_t lease)
{
    stub_init(WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, d->inc);
    stub_req.u.lease_id = lease;
    return stub_send(d->rid);
}

static int set_int(const char *key, int v)
{
    stub_init(WIRE_SET_CONFIG, WIRE_ROLE_CTL, 99);
    stub_req.u.settings.n = 1;
    snprintf(stub_req.u.settings.kv[0].key, WIRE_MAX_KEY, "%s", key);
    snprintf(stub_req.u.settings.kv[0].value, WIRE_MAX_VALUE, "%d", v);
    return stub_send("ctl-c-99");
}

static int set_depth(int depth) { return set_int("max-depth", depth); }

/* The target makes n more batches ready. */
static void make_ready(int n) { stub_make_ready("target-t-7", 7, 0x77, n); }

static uint32_t ready_total(const wire_status *s)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < s->n_buckets; b++) n += s->buckets[b].ready;
    return n;
}

static uint32_t leased_total(const wire_status *s)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < s->n_buckets; b++) n += s->buckets[b].leased;
    return n;
}

static void big_liveness(queue_config *cfg)
{
    cfg->max_depth = 8;
    cfg->liveness = 1000;
}

/* A broker (tweak sets its config) with target "target" and its pool of 16 slots. */
static void setup_with(void (*tweak)(queue_config *cfg))
{
    stub_broker_new(tweak);
    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, 7);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    stub_pool("target-t-7", 7, 0x77, 16);
}

static void setup(void) { setup_with(big_liveness); }

/* The new messages' range checks, through wire_pack and wire_unpack. */
static void test_wire_checks(void)
{
    wire_msg m;
    uint8_t b[4096];
    wire_msg_init(&m, WIRE_GROUP_JOIN, WIRE_ROLE_DRAFTER, 1, 1);
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE); /* empty group name */
    snprintf(m.u.join.group, sizeof m.u.join.group, "g");
    m.u.join.world_hint = WIRE_MAX_WORLD + 1;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    m.u.join.world_hint = 2;
    m.u.join.step = 12;
    int n = wire_pack(&m, b, sizeof b);
    CHECK(n > 0);
    wire_msg u;
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(u.type == WIRE_GROUP_JOIN && u.u.join.step == 12 && strcmp(u.u.join.group, "g") == 0);
    CHECK(!u.u.join.has_gone_rank); /* not sent: none (also what an older drafter sends) */
    /* gone_rank: below WIRE_MAX_WORLD, only with a failed epoch; it travels */
    m.u.join.has_gone_rank = true;
    m.u.join.gone_rank = WIRE_MAX_WORLD;
    m.u.join.failed_epoch = 4;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    m.u.join.gone_rank = 3;
    m.u.join.failed_epoch = 0;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    m.u.join.failed_epoch = 4;
    n = wire_pack(&m, b, sizeof b);
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(u.u.join.has_gone_rank && u.u.join.gone_rank == 3 && u.u.join.failed_epoch == 4);
    /* an older broker does not know field 5: renamed to an unknown field 15, the join still
     * unpacks, as a failed join without it (protobuf-c skips unknown fields) */
    CHECK(n > 2 && b[n - 2] == 0x28 && b[n - 1] == 3); /* gone_rank = 3: the last field */
    if (n > 2) b[n - 2] = 0x78;                          /* field 15, varint */
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(!u.u.join.has_gone_rank && u.u.join.failed_epoch == 4 && u.u.join.step == 12);
    /* the drafter's shape and its words travel; words not terminated are refused */
    m.u.join.has_gone_rank = false;
    m.u.join.shape = 0x0123456789abcdefull;
    memset(m.u.join.shape_text, 'x', sizeof m.u.join.shape_text);
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    snprintf(m.u.join.shape_text, sizeof m.u.join.shape_text, "abc");
    n = wire_pack(&m, b, sizeof b);
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(u.u.join.shape == 0x0123456789abcdefull && strcmp(u.u.join.shape_text, "abc") == 0);
    /* an older broker knows neither field 6 (fixed64) nor 7 (string): renamed to unknown
     * fields 14 and 15, the join unpacks as one stating no shape */
    CHECK(n > 14 && b[n - 5] == 0x3a && b[n - 4] == 3 && b[n - 14] == 0x31);
    if (n > 14) b[n - 5] = 0x7a, b[n - 14] = 0x71;
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(u.u.join.shape == 0 && u.u.join.shape_text[0] == 0 && u.u.join.step == 12);
    /* accumulation: at most WIRE_MAX_WORLD micro-steps; it travels; absent is 0 */
    CHECK_EQ_INT(u.u.join.accumulate, 0);
    m.u.join.accumulate = WIRE_MAX_WORLD + 1;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    m.u.join.accumulate = 4;
    n = wire_pack(&m, b, sizeof b);
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK_EQ_INT(u.u.join.accumulate, 4);

    wire_msg_init(&m, WIRE_GROUP_VIEW, WIRE_ROLE_BROKER, 1, 1);
    snprintf(m.u.view.group, sizeof m.u.view.group, "g");
    m.u.view.epoch = 3;
    m.u.view.world = 2;
    m.u.view.rank = 2; /* rank >= world */
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    m.u.view.rank = 1;
    m.u.view.id_len = 5;
    memcpy(m.u.view.id, "abcde", 5);
    n = wire_pack(&m, b, sizeof b);
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(u.u.view.id_len == 5 && memcmp(u.u.view.id, "abcde", 5) == 0 && u.u.view.rank == 1);

    wire_msg_init(&m, WIRE_GROUP_SET_ID, WIRE_ROLE_DRAFTER, 1, 1);
    snprintf(m.u.set_id.group, sizeof m.u.set_id.group, "g");
    m.u.set_id.epoch = 1;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE); /* empty id */
    m.u.set_id.id_len = WIRE_GROUP_ID_BYTES + 1;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);

    wire_msg_init(&m, WIRE_STEP_CLAIM, WIRE_ROLE_DRAFTER, 1, 1);
    snprintf(m.u.gstep.group, sizeof m.u.gstep.group, "g");
    m.u.gstep.epoch = 1;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE); /* step 0 */
    m.u.gstep.step = 1;
    CHECK(wire_pack(&m, b, sizeof b) > 0);
    m.u.gstep.micro = WIRE_MAX_WORLD; /* micro-steps: below WIRE_MAX_WORLD */
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    m.u.gstep.micro = 3;
    n = wire_pack(&m, b, sizeof b);
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK_EQ_INT(u.u.gstep.micro, 3);

    wire_msg_init(&m, WIRE_STEP_GRANT, WIRE_ROLE_BROKER, 1, 1);
    wire_step_grant *g = &m.u.sgrant;
    g->epoch = g->step = 1;
    g->world = 2;
    g->n_units = 1; /* must equal world */
    g->grant.lease_id = 1;
    g->grant.size = 1;
    g->grant.backend = WIRE_BACKEND_HOST;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    g->n_units = 2;
    g->units[1].bucket = WIRE_MAX_BUCKETS; /* bad unit */
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    g->units[1].bucket = 0;
    g->units[1].index = 9;
    n = wire_pack(&m, b, sizeof b);
    CHECK(n > 0);
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(u.u.sgrant.n_units == 2 && u.u.sgrant.units[1].index == 9);
    CHECK(!u.u.sgrant.has_micro); /* not sent: an older broker's grant */
    g->has_micro = true;
    g->micro = WIRE_MAX_WORLD;
    CHECK_EQ_INT(wire_pack(&m, b, sizeof b), DFLASH_ERANGE);
    g->micro = 0;
    n = wire_pack(&m, b, sizeof b);
    CHECK_EQ_INT(wire_unpack(b, (size_t)n, &u, NULL, 0), 0);
    CHECK(u.u.sgrant.has_micro && u.u.sgrant.micro == 0); /* 0 echoed, told apart from none */
}

#define HOLD_MS 300

static void short_hold(queue_config *cfg)
{
    big_liveness(cfg);
    cfg->group_hold_ms = HOLD_MS;
}

static wire_status commit(const drafter *d, uint64_t step)
{
    stub_init(WIRE_CHECKPOINT_COMMITTED, WIRE_ROLE_DRAFTER, d->inc);
    stub_req.u.step = step;
    CHECK_EQ_INT(stub_send(d->rid), 0);
    return stub_status();
}

/* The whole group went down and comes back. Only rank 0 writes checkpoints, so a former rank 1
 * is back at step 0: if it joins first, the group waits (group-hold-ms) for the member resuming
 * from the newest committed checkpoint, which becomes rank 0, and nothing committed is rewound;
 * a creator below the commit is accepted only once the hold is over, rewinding as a solo
 * drafter's resume does. */
static void test_restart_order(void)
{
    setup_with(short_hold);
    drafter A = {"drafter-a-1", "a", 0xa1}, Bd = {"drafter-b-2", "b", 0xb2};
    CHECK_EQ_INT(hello(&A), 0);
    CHECK_EQ_INT(hello(&Bd), 0);
    wire_group_view va, vb;
    /* a first run: A (rank 0) and B train step 1, A checkpoints it */
    CHECK_EQ_INT(stub_group_join(&A, 0, 0, &va), 0);
    CHECK_EQ_INT(stub_group_join(&Bd, 0, 0, &vb), 0);
    CHECK_EQ_INT(stub_group_join(&A, 0, va.epoch, &va), 0);
    CHECK(va.rank == 0 && va.world == 2);
    CHECK_EQ_INT(stub_group_set_id(&A, va.epoch, 0x11), 0);
    make_ready(2);
    wire_step_grant ga, gb;
    CHECK_EQ_INT(claim(&A, va.epoch, 1, &ga), 0);
    CHECK_EQ_INT(claim(&Bd, va.epoch, 1, &gb), 0);
    CHECK_EQ_INT(release(&A, ga.grant.lease_id), 0);
    CHECK_EQ_INT(release(&Bd, gb.grant.lease_id), 0);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, va.epoch, 1), 0);
    wire_status s = commit(&A, 1);
    CHECK_EQ_INT(s.batches_committed, 2);
    uint64_t todo = s.batches_todo;
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(gstep(&Bd, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(stub_status().n_groups, 0);

    /* B, back at step 0, comes first: it waits, nothing is rewound */
    CHECK_EQ_INT(stub_group_join(&Bd, 0, 0, NULL), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "committed checkpoint is at step 1") != NULL);
    CHECK(stub_rep.u.error.committed_step == 1); /* a B whose run stops there ends on it */
    s = stub_status();
    CHECK_EQ_INT(s.n_groups, 0);
    CHECK_EQ_INT(s.batches_committed, 2);
    /* A resumes from its checkpoint at step 1: it creates the group, rank 0; B joins as rank 1 */
    CHECK_EQ_INT(stub_group_join(&A, 1, 0, &va), 0);
    CHECK(va.rank == 0 && va.world == 1 && va.step == 1);
    CHECK_EQ_INT(stub_group_join(&Bd, 0, 0, &vb), 0);
    CHECK(vb.rank == 1 && vb.world == 2 && vb.step == 1);
    s = stub_status();
    CHECK_EQ_INT(s.batches_committed, 2);
    CHECK_EQ_INT(s.batches_todo, todo);

    /* the window the hold cannot see: B comes back (fresh, step 0) while the broker still
     * lists A, dead: B joins the old group behind A; when A goes, B is its rank 0 at step 0 of a
     * group at step 1, with nobody left holding the group's model: the group is dissolved, and
     * is created again as after a whole restart (B waits, A resumes and creates it) */
    drafter B2 = {"drafter-b-3", "b", 0xb3}, A2 = {"drafter-a-4", "a", 0xa4};
    CHECK_EQ_INT(hello(&B2), 0); /* replaces B's session, which leaves the group */
    CHECK_EQ_INT(stub_group_join(&B2, 0, 0, &vb), 0);
    CHECK(vb.rank == 1 && vb.world == 2 && vb.step == 1);
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0); /* the broker expires A */
    CHECK_EQ_INT(stub_group_join(&B2, 0, vb.epoch, NULL), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "dissolved") != NULL);
    s = stub_status();
    CHECK_EQ_INT(s.n_groups, 0);
    CHECK_EQ_INT(s.batches_committed, 2);
    CHECK_EQ_INT(stub_group_join(&B2, 0, 0, NULL), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "committed checkpoint is at step 1") != NULL);
    CHECK_EQ_INT(hello(&A2), 0); /* A restarted, resuming from its checkpoint at step 1 */
    CHECK_EQ_INT(stub_group_join(&A2, 1, 0, &va), 0);
    CHECK(va.rank == 0 && va.step == 1);
    CHECK_EQ_INT(stub_group_join(&B2, 0, 0, &vb), 0);
    CHECK(vb.rank == 1 && vb.step == 1);
    s = stub_status();
    CHECK_EQ_INT(s.batches_committed, 2);
    CHECK_EQ_INT(s.batches_todo, todo);

    /* nobody holds the checkpoint any more (both gone, B fresh): after the hold, B creates the
     * group at step 0 and the ledger rewinds to it, as ResumeFrom(0) would */
    CHECK_EQ_INT(gstep(&A2, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(gstep(&B2, WIRE_GROUP_LEAVE, 0, 0), 0);
    /* B2 asks until the hold lets it in: never before the hold has passed since its first ask
     * (timed from before it, whatever a loaded machine does to the polls), the ledger untouched
     * while it waits (a fixed sleep inside the hold failed on a stall of 150 ms) */
    uint64_t asked = monotime_ms();
    int rc = stub_group_join(&B2, 0, 0, NULL), held = 0;
    CHECK_EQ_INT(rc, DFLASH_EAGAIN);
    for (uint64_t end = asked + 10000; rc == DFLASH_EAGAIN && monotime_ms() < end;) {
        held++;
        CHECK_EQ_INT(stub_status().batches_committed, 2);
        usleep(10 * 1000);
        rc = stub_group_join(&B2, 0, 0, &vb);
    }
    uint64_t waited = monotime_ms() - asked;
    printf("whole group gone, nobody holds the checkpoint: a fresh member created it after %llu "
           "ms (hold %d ms, %d asks held)\n", (unsigned long long)waited, HOLD_MS, held);
    CHECK_EQ_INT(rc, 0);
    CHECK(waited >= HOLD_MS);
    CHECK(vb.rank == 0 && vb.step == 0);
    s = stub_status();
    CHECK_EQ_INT(s.batches_committed, 0);
    CHECK_EQ_INT(s.batches_todo, todo + 2);
    stub_broker_free();
}

/* A group of a and b (hello, then each joins: a rank 0, b rank 1), a's id posted; its epoch. */
static uint64_t form_pair(const drafter *A, const drafter *B)
{
    wire_group_view vb;
    CHECK_EQ_INT(hello(A), 0);
    CHECK_EQ_INT(hello(B), 0);
    CHECK_EQ_INT(stub_group_join(A, 0, 0, NULL), 0);
    CHECK_EQ_INT(stub_group_join(B, 0, 0, &vb), 0);
    CHECK_EQ_INT(stub_group_set_id(A, vb.epoch, 0x11), 0);
    return vb.epoch;
}

/* A and B form a group over the target's pool; A's claim reserves step 1 and A copies its
 * slot; then the target restarts (a new incarnation of its name, with a new arena) before B
 * claims. */
static void test_step_after_target_restart(void)
{
    setup();
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    uint64_t e = form_pair(&A, &B);
    wire_group_view va, vb;
    make_ready(2);
    wire_step_grant ga, gb;
    CHECK_EQ_INT(claim(&A, e, 1, &ga), 0);
    CHECK_EQ_INT(release(&A, ga.grant.lease_id), 0);

    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, 8);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-8"), 0);
    CHECK_EQ_INT(claim(&B, e, 1, &gb), DFLASH_ESTALE); /* its pool is gone */
    printf("late claim, pool gone: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "not registered") != NULL);
    wire_pool *p = stub_pool_request(8, 0x88, 16);
    snprintf(p->shm_name, sizeof p->shm_name, "/dflash-test-stub-2");
    CHECK_EQ_INT(stub_send("target-t-8"), 0);
    CHECK_EQ_INT(claim(&B, e, 1, &gb), DFLASH_ESTALE); /* not the new arena's either */
    printf("late claim, pool back: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "re-registered") != NULL);

    /* B re-forms; A, the step's resolver, learns it from its collective: its model did not take
     * step 1, which is aborted: every unit is to do again, none leased, none trained */
    CHECK_EQ_INT(stub_group_join(&B, 0, e, NULL), DFLASH_EAGAIN);
    CHECK_EQ_INT(stub_group_join(&A, 0, e, &va), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.groups[0].steps_aborted, 1);
    CHECK_EQ_INT(s.batches_trained, 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(leased_total(&s), 0);
    CHECK_EQ_INT(stub_group_set_id(&A, va.epoch, 0x22), 0);
    CHECK_EQ_INT(stub_group_join(&B, 0, 0, &vb), 0);
    CHECK(vb.epoch == va.epoch && vb.rank == 1);
    stub_make_ready("target-t-8", 8, 0x88, 2);
    CHECK_EQ_INT(claim(&B, vb.epoch, 1, &gb), 0);
    CHECK_EQ_INT(claim(&A, va.epoch, 1, &ga), 0);
    CHECK(ga.grant.pool_incarnation == 0x88 && gb.grant.pool_incarnation == 0x88);
    CHECK(strcmp(gb.grant.shm_name, "/dflash-test-stub-2") == 0);
    stub_broker_free();
}

/* A rank dies mid-step (its process ended: the survivor's shm collective saw it). The survivor's
 * join names the dead rank (gone_rank): the broker drops that member at once, not when its
 * heartbeat expires (big_liveness: never here), so status stops listing it and the epoch formed
 * next is without it (it used to include it: the survivor waited in the communicator's join
 * for a dead rank until the broker's expiry); its session stays until it expires. The step in
 * flight is resolved by the survivor's model step as on any leave. A report that is not
 * credible (another epoch, the reporter itself, a reporter that is no rank of the epoch) drops
 * nobody; a join without the field (an older drafter) keeps the member listed, as before. */
/* A joiner whose drafter has another shape than the group's (its rank 0's) is refused for good
 * (MISMATCH, naming both shapes) before anything changes: the group's epoch, its id and its
 * members stay as they were (it used to take the joiner in, re-form for it, and re-form again
 * when the state sync turned it away). The group's shape is its first member's: once it
 * empties, the join that creates it again defines it, and a member of the old shape is
 * refused then. A drafter that states no shape (older) is taken in as before, and a group whose
 * first member stated none takes any shape. */
static void test_shape(void)
{
    setup();
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2},
            C = {"drafter-c-3", "c", 0xc3}, D = {"drafter-d-4", "d", 0xd4};
    CHECK_EQ_INT(hello(&A), 0);
    CHECK_EQ_INT(hello(&B), 0);
    CHECK_EQ_INT(hello(&C), 0);
    CHECK_EQ_INT(hello(&D), 0);
    const uint64_t X = 0x1111222233334444ull, Y = 0x5555666677778888ull;
    const char *x = "1 layer, block 4, hidden 64", *y = "2 layers, block 4, hidden 64";
    wire_group_view va, vb, vc, vd;
    CHECK_EQ_INT(join_shaped(&A, 0, X, x, &va), 0);
    CHECK_EQ_INT(join_shaped(&B, 0, X, x, &vb), 0); /* the same shape: taken */
    CHECK_EQ_INT(join_shaped(&A, 0, X, x, &va), 0);
    uint64_t e = va.epoch;
    CHECK(va.rank == 0 && va.world == 2 && vb.rank == 1 && vb.epoch == e);
    CHECK_EQ_INT(stub_group_set_id(&A, e, 0x11), 0);

    /* C, of another shape, is refused, twice; the group does not move */
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(join_shaped(&C, 0, Y, y, NULL), DFLASH_EMISMATCH);
        CHECK_EQ_INT(stub_rep.u.error.mismatch, WIRE_MISMATCH_SHAPE); /* what the drafter reads */
        const char *msg = stub_rep.u.error.message;
        CHECK(strstr(msg, "rank 0 a has 1 layer, block 4, hidden 64; this one has 2 layers") !=
              NULL);
        wire_status s = stub_status();
        CHECK(s.n_groups == 1 && s.groups[0].epoch == e && s.groups[0].world == 2);
        CHECK_EQ_INT(s.groups[0].state, WIRE_GROUP_ACTIVE);
        CHECK_EQ_INT(s.groups[0].pending, 0);
        CHECK(!listed("c"));
    }
    CHECK_EQ_INT(join_shaped(&A, 0, X, x, &va), 0); /* rank 0's epoch and id stand */
    CHECK(va.epoch == e && va.world == 2 && va.id_len == WIRE_GROUP_ID_BYTES && va.id[0] == 0x11);
    /* without words, the refusal names the layouts */
    CHECK_EQ_INT(join_shaped(&C, 0, Y, "", NULL), DFLASH_EMISMATCH);
    CHECK(strstr(stub_rep.u.error.message, "this one has layout 5555666677778888") != NULL);
    CHECK_EQ_INT(stub_rep.u.error.mismatch, WIRE_MISMATCH_SHAPE);
    /* another shape and another --accumulate: the accumulate is named, in words and field */
    stub_group_join_begin(&C, 0, 0);
    stub_req.u.join.shape = Y;
    stub_req.u.join.accumulate = 2;
    CHECK_EQ_INT(stub_group_join_send(&C, NULL), DFLASH_EMISMATCH);
    CHECK_EQ_INT(stub_rep.u.error.mismatch, WIRE_MISMATCH_ACCUMULATE);
    CHECK(strstr(stub_rep.u.error.message, "--accumulate 2") != NULL);

    /* an older drafter, stating no shape, is taken as before */
    CHECK_EQ_INT(join_shaped(&D, 0, 0, "", NULL), 0);
    CHECK(listed("d"));
    CHECK_EQ_INT(gstep(&D, WIRE_GROUP_LEAVE, 0, 0), 0);

    /* the group empties: C creates it again, of its shape; A, of the old one, is refused */
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(gstep(&B, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(stub_status().n_groups, 0);
    CHECK_EQ_INT(join_shaped(&C, 0, Y, y, &vc), 0);
    CHECK(vc.rank == 0 && vc.world == 1);
    CHECK_EQ_INT(join_shaped(&A, 0, X, x, NULL), DFLASH_EMISMATCH);
    CHECK(strstr(stub_rep.u.error.message, "rank 0 c has 2 layers") != NULL);
    CHECK(!listed("a"));

    /* a group whose first member stated no shape takes any */
    CHECK_EQ_INT(gstep(&C, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(join_shaped(&D, 0, 0, "", &vd), 0);
    CHECK_EQ_INT(join_shaped(&A, 0, X, x, &va), 0);
    CHECK(va.rank == 1 && va.world == 2);
    stub_broker_free();
}

static void ctl_mode(wire_type t)
{
    stub_init(t, WIRE_ROLE_CTL, 99);
    CHECK_EQ_INT(stub_send("ctl-c-99"), 0);
}

/* A group of a and b accumulating 2 micro-steps a step (epoch *e, id posted). */
static void form_acc(const drafter *A, const drafter *B, uint64_t *e)
{
    wire_group_view va, vb;
    CHECK_EQ_INT(hello(A), 0);
    CHECK_EQ_INT(hello(B), 0);
    CHECK_EQ_INT(join_acc(A, 0, 2, &va), 0);
    CHECK_EQ_INT(join_acc(B, 0, 2, &vb), 0);
    CHECK_EQ_INT(join_acc(A, 0, 2, &va), 0);
    CHECK(va.rank == 0 && va.world == 2 && vb.rank == 1);
    *e = va.epoch;
    CHECK_EQ_INT(stub_group_set_id(A, *e, 0x11), 0);
}

/* Micro-step reservations, StepDone of all of them, the end of the plan inside a step. */
static void test_micro_steps(void)
{
    stub_broker_new(big_liveness);
    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, 7);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    stub_pool_request(7, 0x77, 16)->bucket_batches[0] = 6; /* 6 batches: 1.5 steps of 2 x 2 */
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2},
            C = {"drafter-c-3", "c", 0xc3};
    uint64_t e;
    form_acc(&A, &B, &e);
    /* another accumulation is refused, stated or not (an older drafter: 1) */
    CHECK_EQ_INT(hello(&C), 0);
    CHECK_EQ_INT(join_acc(&C, 0, 3, NULL), DFLASH_EMISMATCH);
    CHECK_EQ_INT(stub_rep.u.error.mismatch, WIRE_MISMATCH_ACCUMULATE); /* what the drafter reads */
    CHECK(strstr(stub_rep.u.error.message, "trains 2 micro-steps a step") != NULL);
    CHECK(strstr(stub_rep.u.error.message, "--accumulate 3") != NULL);
    CHECK_EQ_INT(join_acc(&C, 0, 0, NULL), DFLASH_EMISMATCH);
    CHECK_EQ_INT(stub_rep.u.error.mismatch, WIRE_MISMATCH_ACCUMULATE);
    CHECK(!listed("c"));
    CHECK_EQ_INT(stub_status().groups[0].epoch, e);

    /* micro-step 0: whole or nothing */
    make_ready(1);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 0, NULL), DFLASH_EAGAIN);
    wire_status s = stub_status();
    CHECK_EQ_INT(leased_total(&s), 0);
    make_ready(1);
    wire_step_grant a0, b0, a1, b1, again;
    CHECK_EQ_INT(claim_micro(&A, e, 1, 0, &a0), 0);
    CHECK(a0.has_micro && a0.micro == 0 && a0.rank == 0 && a0.n_units == 2);
    s = stub_status();
    CHECK_EQ_INT(leased_total(&s), 2);
    CHECK(s.groups[0].step_reserved && s.groups[0].micros == 1 && s.groups[0].accumulate == 2);
    /* micro-step 1 only once 0 is reserved, 2 never (A = 2); whole or nothing again */
    CHECK_EQ_INT(claim_micro(&A, e, 1, 2, NULL), DFLASH_ESTATE);
    make_ready(1);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 1, NULL), DFLASH_EAGAIN);
    s = stub_status();
    CHECK_EQ_INT(leased_total(&s), 2);
    CHECK_EQ_INT(ready_total(&s), 1);
    make_ready(1);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 1, &b1), 0);
    s = stub_status();
    CHECK_EQ_INT(leased_total(&s), 4);
    CHECK_EQ_INT(s.groups[0].micros, 2);
    CHECK(b1.has_micro && b1.micro == 1 && b1.rank == 1 && b1.n_units == 2);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 1, &a1), 0);
    CHECK(a1.micro == 1 && a1.rank == 0 && a1.grant.lease_id != b1.grant.lease_id);
    CHECK(a1.units[0].index == b1.units[0].index && a1.units[1].index == b1.units[1].index);
    CHECK(a1.grant.unit.index == a1.units[0].index && b1.grant.unit.index == b1.units[1].index);
    CHECK(a1.units[0].index != a0.units[0].index && a1.units[0].index != a0.units[1].index &&
          a1.units[1].index != a0.units[0].index && a1.units[1].index != a0.units[1].index);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 0, &b0), 0); /* late, and retried: the same leases */
    CHECK(b0.micro == 0 && b0.rank == 1 && b0.grant.unit.index == a0.units[1].index);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 0, &again), 0);
    CHECK_EQ_INT(again.grant.lease_id, b0.grant.lease_id);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    CHECK_EQ_INT(release(&B, b0.grant.lease_id), 0);
    CHECK_EQ_INT(release(&A, a1.grant.lease_id), 0);
    CHECK_EQ_INT(release(&B, b1.grant.lease_id), 0);
    /* StepDone acks the 4 units of both micro-steps, once */
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, 1), 0);
    CHECK_EQ_INT(stub_rep.u.value, 4);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, 1), 0);
    CHECK_EQ_INT(stub_rep.u.value, 0);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 4);
    CHECK_EQ_INT(s.acks, 4);
    CHECK(!s.groups[0].step_reserved && s.groups[0].micros == 0);

    /* step 2: the last 2 batches are micro-step 0; micro-step 1 can never be served: the step
     * ends there, for both ranks alike */
    make_ready(2);
    CHECK_EQ_INT(claim_micro(&B, e, 2, 0, &b0), 0);
    CHECK_EQ_INT(claim_micro(&A, e, 2, 0, &a0), 0);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    CHECK_EQ_INT(claim_micro(&A, e, 2, 1, NULL), DFLASH_ESHUTDOWN);
    CHECK(strstr(stub_rep.u.error.message, "step 2 ends with its 1 micro-steps of 2") != NULL);
    CHECK_EQ_INT(claim_micro(&B, e, 2, 1, NULL), DFLASH_ESHUTDOWN); /* B has not released yet */
    CHECK(strstr(stub_rep.u.error.message, "step 2 ends with its 1 micro-steps of 2") != NULL);
    CHECK_EQ_INT(claim_micro(&B, e, 2, 0, &again), 0); /* micro-step 0 stands */
    CHECK_EQ_INT(again.grant.lease_id, b0.grant.lease_id);
    CHECK_EQ_INT(release(&B, b0.grant.lease_id), 0);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, 2), 0);
    CHECK_EQ_INT(stub_rep.u.value, 2);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 6);
    CHECK_EQ_INT(claim_micro(&A, e, 3, 0, NULL), DFLASH_ESHUTDOWN); /* the plan is done */
    CHECK(strstr(stub_rep.u.error.message, "every batch") != NULL);

    /* 64 units a step at most: 2 ranks of 64 micro-steps are refused */
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(gstep(&B, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(join_acc(&A, 2, 64, NULL), 0);
    CHECK_EQ_INT(join_acc(&B, 2, 64, NULL), DFLASH_EFULL);
    CHECK_EQ_INT(stub_rep.u.error.mismatch, WIRE_MISMATCH_NONE); /* only a MISMATCH says */
    CHECK(strstr(stub_rep.u.error.message, "2 ranks of 64 micro-steps") != NULL);
    stub_broker_free();
}

/* A join of group g stating --exit-when-drained (ends_when_drained) and --group-size `size`
 * (world_hint). */
static int join_ending(const drafter *d, uint64_t step, uint32_t size, wire_group_view *v)
{
    stub_group_join_begin(d, step, 0);
    stub_req.u.join.ends_when_drained = true;
    stub_req.u.join.world_hint = size;
    return stub_group_join_send(d, v);
}

/* A join that states --exit-when-drained is answered SHUTDOWN, as a claim is, once nothing is
 * left to hand out (the plan done, or drained) and nothing of a group step waits for it, in a
 * group that has trained a step or had an epoch of the joiner's --group-size: so a rank whose
 * partner left at the data's end ends too (it used to join again and wait --group-wait-s for a
 * second rank). A join that does not state it gets its view; so do a creating join and a group
 * still waiting for its ranks (its first member, holding the newest checkpoint, must not leave
 * the group to one with an older model, whose creation would rewind the trained batches); a
 * step in flight or an orphaned step is resolved first. */
static void test_join_nothing_left(void)
{
    stub_broker_new(big_liveness);
    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, 7);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    stub_pool_request(7, 0x77, 16)->bucket_batches[0] = 4; /* two steps of two ranks */
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2},
            C = {"drafter-c-3", "c", 0xc3}, D = {"drafter-d-4", "d", 0xd4},
            E = {"drafter-e-5", "e", 0xe5};
    uint64_t e = form_pair(&A, &B);
    wire_group_view v;
    CHECK_EQ_INT(join_ending(&B, 0, 2, &v), 0); /* work left: the view */
    CHECK(v.epoch == e && v.rank == 1);
    wire_step_grant a, b;
    for (uint64_t step = 1; step <= 2; step++) {
        make_ready(2);
        CHECK_EQ_INT(claim(&A, e, step, &a), 0);
        CHECK_EQ_INT(claim(&B, e, step, &b), 0);
        CHECK_EQ_INT(release(&A, a.grant.lease_id), 0);
        CHECK_EQ_INT(release(&B, b.grant.lease_id), 0);
        if (step == 2) { /* step 2 in flight, the plan's last batches in it: B's view */
            CHECK_EQ_INT(join_ending(&B, 1, 2, &v), 0);
            CHECK(v.epoch == e && v.rank == 1);
        }
        CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, step), 0);
    }
    CHECK_EQ_INT(stub_status().batches_trained, 4);
    /* A's claim heard the end first and A left; B, joining again, hears it too: the group
     * trained, though never of 3 ranks (B's --group-size) */
    CHECK_EQ_INT(claim(&A, e, 3, NULL), DFLASH_ESHUTDOWN);
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(join_ending(&B, 2, 3, NULL), DFLASH_ESHUTDOWN);
    CHECK(strstr(stub_rep.u.error.message, "every batch of the target's planned epochs (1) is "
                                            "trained") != NULL);
    CHECK_EQ_INT(stub_group_join(&B, 2, 0, &v), 0); /* not stated: the view, alone */
    CHECK(v.world == 1 && v.rank == 0);
    CHECK_EQ_INT(gstep(&B, WIRE_GROUP_LEAVE, 0, 0), 0); /* the group is gone */

    /* the group created again at the data's end by D, resumed from the newest model: D waits
     * for its 2 ranks (a view, twice), E comes, and then both hear the end */
    CHECK_EQ_INT(hello(&D), 0);
    CHECK_EQ_INT(hello(&E), 0);
    CHECK_EQ_INT(join_ending(&D, 2, 2, &v), 0);
    CHECK(v.world == 1 && v.rank == 0);
    CHECK_EQ_INT(join_ending(&D, 2, 2, &v), 0);
    CHECK_EQ_INT(join_ending(&E, 0, 2, &v), 0);
    CHECK(v.world == 2 && v.rank == 1);
    CHECK_EQ_INT(join_ending(&D, 2, 2, NULL), DFLASH_ESHUTDOWN);
    CHECK_EQ_INT(gstep(&D, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(join_ending(&E, 0, 2, NULL), DFLASH_ESHUTDOWN);
    CHECK_EQ_INT(gstep(&E, WIRE_GROUP_LEAVE, 0, 0), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 4); /* nothing rewound */
    /* a creator whose model is older: its rewind gives step 2's batches back, and it trains */
    CHECK_EQ_INT(hello(&C), 0);
    CHECK_EQ_INT(join_ending(&C, 1, 0, &v), 0);
    CHECK(v.world == 1 && v.rank == 0 && v.step == 1);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 2);
    CHECK_EQ_INT(s.batches_todo, 2);
    stub_broker_free();

    /* drained: SHUTDOWN "drained", but not while the group's step is in flight, nor while an
     * orphaned step waits for the join that creates its group again to resolve it */
    setup();
    e = form_pair(&A, &B);
    make_ready(2);
    CHECK_EQ_INT(claim(&A, e, 1, &a), 0);
    CHECK_EQ_INT(claim(&B, e, 1, &b), 0);
    CHECK_EQ_INT(release(&A, a.grant.lease_id), 0);
    CHECK_EQ_INT(release(&B, b.grant.lease_id), 0);
    ctl_mode(WIRE_DRAIN);
    CHECK_EQ_INT(join_ending(&B, 0, 0, &v), 0); /* step 1 in flight: the view */
    CHECK_EQ_INT(gstep(&B, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0); /* the last member: step 1 orphaned */
    s = stub_status();
    CHECK_EQ_INT(s.n_orphans, 1);
    /* the join that creates the group again resolves it (A's model has step 1: acked) */
    CHECK_EQ_INT(join_ending(&A, 1, 0, &v), 0);
    s = stub_status();
    CHECK_EQ_INT(s.n_orphans, 0);
    CHECK_EQ_INT(s.batches_trained, 2);
    CHECK_EQ_INT(join_ending(&A, 1, 0, NULL), DFLASH_ESHUTDOWN);
    CHECK(strcmp(stub_rep.u.error.message, "drained") == 0);
    stub_broker_free();
}

/* A plan that leaves fewer batches than ranks for a step's next micro-step ends the step there
 * (it waited for a drain, its trained micro-steps unapplied); the batch left stays to do, as
 * at a step's start. */
static void test_micro_leftover(void)
{
    stub_broker_new(big_liveness);
    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, 7);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    stub_pool_request(7, 0x77, 16)->bucket_batches[0] = 3; /* one micro-step and one batch */
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    uint64_t e;
    form_acc(&A, &B, &e);
    wire_step_grant a0, b0;
    make_ready(3);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 0, &a0), 0);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 0, &b0), 0);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 1, NULL), DFLASH_ESHUTDOWN);
    CHECK(strstr(stub_rep.u.error.message, "step 1 ends with its 1 micro-steps of 2") != NULL);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 1, NULL), DFLASH_ESHUTDOWN);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    CHECK_EQ_INT(release(&B, b0.grant.lease_id), 0);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, 1), 0);
    CHECK_EQ_INT(stub_rep.u.value, 2);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 2);
    CHECK_EQ_INT(ready_total(&s), 1); /* the one left: no step takes it */
    CHECK_EQ_INT(claim_micro(&A, e, 2, 0, NULL), DFLASH_EAGAIN);
    stub_broker_free();
}

/* An abort gives back every micro-step's units; the end of a drain inside a step is sticky;
 * a step missing a micro-step is aborted when its last member leaves, one with all of them is
 * orphaned whole. */
static void test_micro_abort(void)
{
    setup();
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    uint64_t e;
    form_acc(&A, &B, &e);
    wire_step_grant a0, b0, a1, b1;
    make_ready(4);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 0, &a0), 0);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 1, &a1), 0);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 0, &b0), 0);
    CHECK_EQ_INT(claim_micro(&B, e, 1, 1, &b1), 0);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    CHECK_EQ_INT(release(&A, a1.grant.lease_id), 0);
    CHECK_EQ_INT(release(&B, b0.grant.lease_id), 0); /* b1 never copied */
    wire_status s = stub_status();
    uint64_t todo = s.batches_todo;
    CHECK_EQ_INT(gstep(&B, WIRE_GROUP_LEAVE, 0, 0), 0);
    wire_group_view va;
    CHECK_EQ_INT(join_acc(&A, 0, 2, &va), 0); /* A's model lacks step 1: ABORT */
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 0);
    CHECK_EQ_INT(s.batches_todo, todo + 3); /* the 3 copied units of both micro-steps */
    CHECK_EQ_INT(ready_total(&s), 1);       /* b1's slot: READY again */
    CHECK_EQ_INT(leased_total(&s), 0);
    CHECK_EQ_INT(s.groups[0].steps_aborted, 1);
    CHECK(va.world == 1 && va.rank == 0);
    e = va.epoch;
    CHECK_EQ_INT(stub_group_set_id(&A, e, 0x22), 0);

    /* a drain with nothing filling ends a step inside it; resumed, it stays ended */
    CHECK_EQ_INT(claim_micro(&A, e, 1, 0, &a0), 0);
    ctl_mode(WIRE_DRAIN);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 1, NULL), DFLASH_ESHUTDOWN);
    CHECK(strstr(stub_rep.u.error.message, "ends with its 1 micro-steps of 2") != NULL);
    ctl_mode(WIRE_RESUME);
    make_ready(2);
    CHECK_EQ_INT(claim_micro(&A, e, 1, 1, NULL), DFLASH_ESHUTDOWN);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, 1), 0);
    CHECK_EQ_INT(stub_rep.u.value, 1);

    /* step 2 with micro-step 1 never reserved: its last member leaves, the step is aborted */
    CHECK_EQ_INT(claim_micro(&A, e, 2, 0, &a0), 0);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    todo = stub_status().batches_todo;
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0);
    s = stub_status();
    CHECK_EQ_INT(s.n_orphans, 0);
    CHECK_EQ_INT(s.batches_todo, todo + 1);
    /* created again at step 1: step 2 with both micro-steps copied is orphaned whole */
    CHECK_EQ_INT(join_acc(&A, 1, 2, &va), 0);
    e = va.epoch;
    CHECK_EQ_INT(stub_group_set_id(&A, e, 0x33), 0);
    make_ready(2);
    CHECK_EQ_INT(claim_micro(&A, e, 2, 0, &a0), 0);
    CHECK_EQ_INT(claim_micro(&A, e, 2, 1, &a1), 0);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    CHECK_EQ_INT(release(&A, a1.grant.lease_id), 0);
    CHECK_EQ_INT(gstep(&A, WIRE_GROUP_LEAVE, 0, 0), 0);
    s = stub_status();
    CHECK_EQ_INT(s.n_orphans, 1);
    CHECK_EQ_INT(s.orphans[0].batches, 2);
    uint64_t trained = s.batches_trained;
    CHECK_EQ_INT(join_acc(&A, 2, 2, &va), 0); /* back with the step: both acked */
    s = stub_status();
    CHECK_EQ_INT(s.n_orphans, 0);
    CHECK_EQ_INT(s.batches_trained, trained + 2);

    /* a stopping broker ends a step at its next micro-step although slots are ready (it
     * reserved micro-steps on, and the stop waited for their leases) */
    e = va.epoch;
    CHECK_EQ_INT(stub_group_set_id(&A, e, 0x44), 0);
    make_ready(4);
    CHECK_EQ_INT(claim_micro(&A, e, 3, 0, &a0), 0);
    broker_stop_gracefully(stub_b, NULL, NULL);
    CHECK_EQ_INT(claim_micro(&A, e, 3, 1, NULL), DFLASH_ESHUTDOWN);
    CHECK(strstr(stub_rep.u.error.message, "ends with its 1 micro-steps of 2") != NULL);
    CHECK_EQ_INT(release(&A, a0.grant.lease_id), 0);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, 3), 0);
    CHECK_EQ_INT(stub_rep.u.value, 1);
    stub_broker_free();
}

static void test_gone_rank(void)
{
    setup();
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2},
            C = {"drafter-c-3", "c", 0xc3};
    CHECK_EQ_INT(hello(&A), 0);
    CHECK_EQ_INT(hello(&B), 0);
    CHECK_EQ_INT(hello(&C), 0);
    wire_group_view va, vb;
    CHECK_EQ_INT(stub_group_join(&A, 0, 0, NULL), 0);
    CHECK_EQ_INT(stub_group_join(&B, 0, 0, &vb), 0);
    uint64_t e = vb.epoch;
    CHECK(vb.rank == 1 && vb.world == 2);
    CHECK_EQ_INT(stub_group_set_id(&A, e, 0x11), 0);
    uint32_t peers = stub_status().peers;

    /* not credible: an old epoch's report; one by a member about itself (it still ends the
     * epoch, as any failed collective does); one by a drafter that is no member */
    CHECK_EQ_INT(join_gone(&A, 0, e - 1, 1, &va), 0);
    CHECK(va.epoch == e && listed("b"));
    CHECK_EQ_INT(join_gone(&B, 0, e, 1, &vb), 0);
    CHECK(listed("b") && vb.epoch == e + 1 && vb.world == 2);
    e = vb.epoch;
    CHECK_EQ_INT(join_gone(&C, 0, e, 1, NULL), 0); /* C joins (pending): B stays */
    CHECK(listed("b") && listed("c"));
    CHECK_EQ_INT(gstep(&C, WIRE_GROUP_LEAVE, 0, 0), 0);
    CHECK_EQ_INT(stub_group_join(&A, 0, 0, &va), 0);
    e = va.epoch;
    CHECK(va.world == 2 && listed("b") && !listed("c"));
    CHECK_EQ_INT(stub_group_set_id(&A, e, 0x22), 0);

    /* step 1: both copy their slot; B dies; A's model took the step (the all-reduce ended) */
    make_ready(2);
    wire_step_grant ga, gb;
    CHECK_EQ_INT(claim(&A, e, 1, &ga), 0);
    CHECK_EQ_INT(claim(&B, e, 1, &gb), 0);
    CHECK_EQ_INT(release(&A, ga.grant.lease_id), 0);
    CHECK_EQ_INT(release(&B, gb.grant.lease_id), 0);
    CHECK_EQ_INT(join_gone(&A, 1, e, 1, &va), 0);
    wire_status s = stub_status();
    CHECK(!listed("b") && listed("a"));
    CHECK(va.epoch == e + 1 && va.rank == 0 && va.world == 1 && va.step == 1);
    CHECK_EQ_INT(s.groups[0].world, 1);
    CHECK_EQ_INT(s.groups[0].steps_done, 1);
    CHECK_EQ_INT(s.batches_trained, 2);
    CHECK_EQ_INT(s.peers, peers); /* B's session is the heartbeat's to end */
    CHECK_EQ_INT(claim(&B, e, 1, NULL), DFLASH_ESTALE);
    /* a second report of the same death (another survivor's) finds the epoch moved on */
    CHECK_EQ_INT(join_gone(&A, 1, e, 1, &va), 0);
    CHECK(va.epoch == e + 1 && va.world == 1);

    /* without the field (an older drafter): the dead member stays until it expires */
    e = va.epoch;
    CHECK_EQ_INT(stub_group_set_id(&A, e, 0x33), 0);
    CHECK_EQ_INT(stub_group_join(&B, 1, 0, &vb), 0); /* B (alive after all) joins again */
    CHECK_EQ_INT(stub_group_join(&A, 1, 0, &va), 0);
    e = va.epoch;
    CHECK(va.world == 2);
    CHECK_EQ_INT(stub_group_join(&A, 1, e, &va), 0); /* A's collective failed, B not named */
    CHECK(listed("b") && va.epoch == e + 1 && va.world == 2);
    stub_broker_free();
}

static void quick_expiry(queue_config *cfg)
{
    big_liveness(cfg);
    cfg->heartbeat_ms = 20;
    cfg->liveness = 3;
}

/* Runs the broker's cron, the target beating, until the drafters are expired (only the target
 * is left), for 5 s at most; whether they were. */
static void cron_with_target_beating(void)
{
    uv_run(&stub_loop, UV_RUN_NOWAIT);
    stub_init(WIRE_HEARTBEAT, WIRE_ROLE_TARGET, 7);
    stub_req.u.step = monotime_ms();
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
}

static bool expire_drafters(void)
{
    for (uint64_t end = monotime_ms() + 5000; monotime_ms() < end;) {
        cron_with_target_beating();
        if (stub_status().peers == 1) return true;
        usleep(5 * 1000);
    }
    return false;
}

static bool same_unit(const wire_unit *a, const wire_unit *b)
{
    return a->epoch == b->epoch && a->bucket == b->bucket && a->index == b->index;
}

/* Rank B cannot read its slot of step 1 and gives it back unread: its batch is to do again and
 * is produced into another slot. Rank 0 then reports the step done: B's unit is not recorded
 * (never copied), and its batch, which that other slot now holds, stays in flight there; it is
 * not sent back to to-do a second time, to be produced and trained twice. */
static void test_unread_unit_of_acked_step(void)
{
    setup();
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    uint64_t e = form_pair(&A, &B);
    make_ready(2);
    wire_step_grant ga, gb;
    CHECK_EQ_INT(claim(&A, e, 1, &ga), 0);
    CHECK_EQ_INT(claim(&B, e, 1, &gb), 0);
    CHECK_EQ_INT(release(&A, ga.grant.lease_id), 0);
    stub_init(WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, B.inc);
    stub_req.u.lease_id = gb.grant.lease_id;
    stub_req.u.release_unread = true;
    CHECK_EQ_INT(stub_send(B.rid), 0);
    /* the target produces B's batch again (the lowest to do) */
    stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, 7);
    stub_req.u.pool_incarnation = 0x77;
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    wire_work_unit wu = stub_rep.u.work;
    CHECK(same_unit(&wu.unit, &gb.grant.unit));
    stub_init(WIRE_SLOT_READY, WIRE_ROLE_TARGET, 7);
    stub_req.u.ready = (wire_slot_ready){0x77, wu.slot, wu.unit, 100, 2};
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    wire_status before = stub_status();
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e, 1), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 1);
    CHECK_EQ_INT(s.batches_todo, before.batches_todo);
    CHECK_EQ_INT(s.batches_inflight, before.batches_inflight - 1); /* A's unit, trained */
    CHECK_EQ_INT(ready_total(&s), 1);                               /* B's batch, once */
    /* the next work unit is a new batch, not B's again */
    stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, 7);
    stub_req.u.pool_incarnation = 0x77;
    CHECK_EQ_INT(stub_send("target-t-7"), 0);
    CHECK(!same_unit(&stub_rep.u.work.unit, &gb.grant.unit));
    stub_broker_free();
}

/* Both ranks of a group copied their slots of step 1 and train it; the broker expires both (all
 * SIGSTOPped, a paused node, a network blip of the whole node): nobody is left to resolve the
 * step. The ranks were alive and went on: their models took the update. They come back (same
 * incarnations), rank 0's StepDone is answered Stale (unknown peer), they say hello and join
 * again; `creator` (0: the old rank 0, 1: the old rank 1) comes first, at `creator_step` (1: its
 * model has step 1; 0: its collective failed and its model did not take it). The group is
 * created at that step: step 1's units must then be trained exactly when that model has them
 * (defect: the step was aborted when the last rank expired, its units went back to to-do and
 * were produced and trained again, by models that already had them). */
/* A broker set up with cfg; A and B form a group of two and copy their units of step 1 (grants
 * ga, gb; B's view vb), then fall silent until the broker expires them both. The batches to do
 * before the expiry, into *todo. */
static void group_expired_mid_step(void (*cfg)(queue_config *), const drafter *A,
                                   const drafter *B, wire_group_view *vb, wire_step_grant *ga,
                                   wire_step_grant *gb, uint64_t *todo)
{
    setup_with(cfg);
    CHECK_EQ_INT(hello(A), 0);
    CHECK_EQ_INT(hello(B), 0);
    CHECK_EQ_INT(stub_group_join(A, 0, 0, NULL), 0);
    CHECK_EQ_INT(stub_group_join(B, 0, 0, vb), 0);
    CHECK_EQ_INT(stub_group_set_id(A, vb->epoch, 0x11), 0);
    make_ready(2);
    CHECK_EQ_INT(claim(A, vb->epoch, 1, ga), 0);
    CHECK_EQ_INT(claim(B, vb->epoch, 1, gb), 0);
    CHECK_EQ_INT(release(A, ga->grant.lease_id), 0);
    CHECK_EQ_INT(release(B, gb->grant.lease_id), 0);
    *todo = stub_status().batches_todo;
    bool expired = expire_drafters();
    CHECK(expired);
}

static void all_ranks_expired(int creator, uint64_t creator_step)
{
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    wire_group_view va, vb;
    wire_step_grant ga, gb;
    uint64_t todo;
    group_expired_mid_step(quick_expiry, &A, &B, &vb, &ga, &gb, &todo);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.n_groups, 0);
    CHECK_EQ_INT(s.batches_trained, 0);
    CHECK_EQ_INT(s.batches_inflight, 2); /* not produced again while nobody can say */
    CHECK_EQ_INT(s.batches_todo, todo);

    /* they come back */
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, vb.epoch, 1), DFLASH_ESTALE); /* unknown peer */
    CHECK_EQ_INT(hello(&A), 0);
    CHECK_EQ_INT(hello(&B), 0);
    const drafter *first = creator == 0 ? &A : &B, *second = creator == 0 ? &B : &A;
    CHECK_EQ_INT(stub_group_join(first, creator_step, 0, &va), 0);
    CHECK(va.rank == 0 && va.step == creator_step);
    s = stub_status();
    printf("all ranks expired, rank %d creates the group again at step %llu: %llu trained, "
           "%llu in flight, %llu to do (%llu before)\n", creator,
           (unsigned long long)creator_step, (unsigned long long)s.batches_trained,
           (unsigned long long)s.batches_inflight, (unsigned long long)s.batches_todo,
           (unsigned long long)todo);
    CHECK_EQ_INT(s.batches_trained, creator_step == 1 ? 2 : 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_todo, creator_step == 1 ? todo : todo + 2);

    /* the group goes on from the creator's model: step creator_step + 1, two new units unless
     * step 1 was aborted (then they are step 1's, to be trained for the first time) */
    CHECK_EQ_INT(stub_group_join(second, 0, 0, &vb), 0);
    CHECK_EQ_INT(stub_group_join(first, creator_step, 0, &va), 0);
    CHECK(va.epoch == vb.epoch && va.world == 2 && vb.rank == 1 && vb.step == creator_step);
    CHECK_EQ_INT(stub_group_set_id(first, va.epoch, 0x22), 0);
    make_ready(2);
    wire_step_grant g1, g2;
    uint64_t next = creator_step + 1;
    CHECK_EQ_INT(claim(first, va.epoch, next, &g1), 0);
    CHECK_EQ_INT(claim(second, vb.epoch, next, &g2), 0);
    int again = 0;
    for (uint32_t k = 0; k < g1.n_units; k++)
        again += same_unit(&g1.units[k], &ga.units[0]) + same_unit(&g1.units[k], &ga.units[1]);
    CHECK_EQ_INT(again, creator_step == 1 ? 0 : 2);
    CHECK_EQ_INT(release(first, g1.grant.lease_id), 0);
    CHECK_EQ_INT(release(second, g2.grant.lease_id), 0);
    CHECK_EQ_INT(gstep(first, WIRE_STEP_DONE, va.epoch, next), 0);
    CHECK_EQ_INT(stub_rep.u.value, 2);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, creator_step == 1 ? 4 : 2);
    CHECK_EQ_INT(s.acks, s.batches_trained); /* none acked twice */
    stub_broker_free();
}

static void quick_expiry_short_hold(queue_config *cfg)
{
    quick_expiry(cfg);
    cfg->group_hold_ms = 300;
}

/* Both ranks expire mid-step (as above) and nobody creates the group again: after the broker's
 * --group-hold-ms the orphaned step is aborted, its units back to to-do (before, they stayed in
 * flight for good and the plan's epochs could never end). */
static void orphan_expires(void)
{
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    wire_group_view vb;
    wire_step_grant ga, gb;
    uint64_t todo;
    group_expired_mid_step(quick_expiry_short_hold, &A, &B, &vb, &ga, &gb, &todo);
    CHECK_EQ_INT(stub_status().batches_inflight, 2);
    wire_status s = stub_status();
    for (uint64_t end = monotime_ms() + 3000; monotime_ms() < end && s.batches_inflight;) {
        cron_with_target_beating();
        usleep(20 * 1000);
        s = stub_status();
    }
    printf("orphaned step, nobody back within the hold: %llu in flight, %llu to do (%llu "
           "before)\n", (unsigned long long)s.batches_inflight,
           (unsigned long long)s.batches_todo, (unsigned long long)todo);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_todo, todo + 2);
    CHECK_EQ_INT(s.batches_trained, 0);
    stub_broker_free();
}

/* --- orphaned steps across a broker restart ------------------------------------------------- */

static char journal_dir[256], journal_path[300];
static int64_t restart_hold_ms, restart_compact_bytes;

/* quick_expiry with the journal at journal_path, an orphan grace of 50 ms, the hold and
 * compaction the test chose. */
static void journaled(queue_config *cfg)
{
    quick_expiry(cfg);
    snprintf(cfg->journal, sizeof cfg->journal, "%s", journal_path);
    cfg->orphan_grace_ms = 50;
    cfg->group_hold_ms = restart_hold_ms;
    cfg->compact_bytes = restart_compact_bytes;
}

/* The broker restarted on its journal (a crash or a redeploy: the peers are gone with it). */
static void restart_broker(void)
{
    stub_broker_free();
    stub_broker_new(journaled);
}

/* Runs the broker's cron (nobody beats) for ms. */
static void cron_for(int ms)
{
    for (uint64_t end = monotime_ms() + (uint64_t)ms; monotime_ms() < end;) {
        uv_run(&stub_loop, UV_RUN_NOWAIT);
        usleep(5 * 1000);
    }
}

/* s lists group g's orphaned step 1 (its two units): how long it has been held and what is
 * left of the hold (restart_hold_ms), at most max_left (defect: status did not list orphaned
 * steps at all, only a WARN line in the broker's log said it). */
static void check_orphan_listed(wire_status s, uint64_t max_left)
{
    CHECK_EQ_INT(s.n_groups, 0);
    CHECK_EQ_INT(s.n_orphans, 1);
    const wire_orphan_stat *o = &s.orphans[0];
    printf("status: orphaned step %llu of group %s, %u batches, held %llu ms, aborted in %llu ms\n",
           (unsigned long long)o->step, o->group, o->batches, (unsigned long long)o->held_ms,
           (unsigned long long)o->abort_in_ms);
    CHECK(strcmp(o->group, "g") == 0 && o->step == 1 && o->batches == 2);
    CHECK(o->abort_in_ms <= max_left && o->held_ms + o->abort_in_ms == (uint64_t)restart_hold_ms);
}

/* Both ranks of group g expire while they train step 1 (its two units copied); the broker
 * restarts (twice, so that a compacted journal is read back too) and runs past its orphan grace
 * (50 ms); then a former rank creates the group again at model step creator_step. The units
 * must stay in flight until then (defect: the restart took them for its own orphans and gave
 * them back to to-do after the grace, so a group holding step 1 trained them again), and the
 * join resolves the step as without the restart: trained at step 1 when the creator's model has
 * it, to do again when it lacks it. */
static void orphan_across_restart(uint64_t creator_step, int64_t compact_bytes)
{
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    wire_group_view va, vb;
    wire_step_grant ga, gb;
    uint64_t todo;
    unlink(journal_path);
    restart_hold_ms = 60000;
    restart_compact_bytes = compact_bytes;
    group_expired_mid_step(journaled, &A, &B, &vb, &ga, &gb, &todo);
    CHECK_EQ_INT(stub_status().batches_inflight, 2);
    check_orphan_listed(stub_status(), 60000);
    for (int k = 0; k < 2; k++) {
        restart_broker();
        cron_for(200); /* four orphan graces */
    }
    wire_status s = stub_status();
    check_orphan_listed(s, 60000 - 100); /* held since the last restart (200 ms of cron) */
    printf("orphaned step, broker restarted twice (compact-bytes %lld), past the orphan grace: "
           "%llu in flight, %llu to do (%llu before)\n", (long long)compact_bytes,
           (unsigned long long)s.batches_inflight, (unsigned long long)s.batches_todo,
           (unsigned long long)todo);
    CHECK_EQ_INT(s.batches_inflight, 2);
    CHECK_EQ_INT(s.batches_todo, todo);
    CHECK_EQ_INT(s.batches_trained, 0);

    CHECK_EQ_INT(hello(&A), 0);
    CHECK_EQ_INT(hello(&B), 0);
    CHECK_EQ_INT(stub_group_join(&A, creator_step, 0, &va), 0);
    CHECK(va.rank == 0 && va.step == creator_step);
    s = stub_status();
    printf("... rank 0 creates the group again at step %llu: %llu trained, %llu in flight, %llu "
           "to do\n", (unsigned long long)creator_step, (unsigned long long)s.batches_trained,
           (unsigned long long)s.batches_inflight, (unsigned long long)s.batches_todo);
    CHECK_EQ_INT(s.batches_trained, creator_step >= 1 ? 2 : 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_todo, creator_step >= 1 ? todo : todo + 2);
    CHECK_EQ_INT(s.n_orphans, 0);
    CHECK_EQ_INT(s.groups[0].steps_done, creator_step >= 1 ? 1 : 0);
    CHECK_EQ_INT(s.groups[0].steps_aborted, creator_step >= 1 ? 0 : 1);
    /* the resolution is journaled too: a broker restarted now neither resolves it again nor
     * holds those units */
    restart_broker();
    cron_for(100);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, creator_step >= 1 ? 2 : 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_todo, creator_step >= 1 ? todo : todo + 2);
    stub_broker_free();
}

/* The same orphaned step, the broker restarted, and nobody creates the group again: the step is
 * aborted once the hold (300 ms, counted from the restart) is over, not at the orphan grace
 * (50 ms) and not never. */
static void orphan_expires_after_restart(void)
{
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    wire_group_view vb;
    wire_step_grant ga, gb;
    uint64_t todo;
    unlink(journal_path);
    restart_hold_ms = 300;
    restart_compact_bytes = 0;
    group_expired_mid_step(journaled, &A, &B, &vb, &ga, &gb, &todo);
    restart_broker();
    uint64_t restarted = monotime_ms();
    cron_for(150);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.batches_inflight, 2); /* past the grace, within the hold */
    while (monotime_ms() < restarted + 3000 && s.batches_inflight) {
        cron_for(20);
        s = stub_status();
    }
    uint64_t took = monotime_ms() - restarted;
    printf("orphaned step, broker restarted, nobody back: aborted %llu ms after the restart "
           "(hold 300 ms): %llu in flight, %llu to do (%llu before)\n",
           (unsigned long long)took, (unsigned long long)s.batches_inflight,
           (unsigned long long)s.batches_todo, (unsigned long long)todo);
    CHECK(took >= 300);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_todo, todo + 2);
    CHECK_EQ_INT(s.batches_trained, 0);
    restart_broker(); /* the abort is journaled: nothing is held again */
    s = stub_status();
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_todo, todo + 2);
    stub_broker_free();
}

/* Rank 0 of the group (A) had step 1's StepDone pending when the broker, which had expired
 * every rank, restarted: its StepDone is answered Stale by a restarted broker, so it says hello
 * holding the step's units and acks them plainly at step 1 (group_worker's do_register). Then
 * either it joins at model step 1 and creates the group again, resolving the restored orphaned
 * step as happened, or nobody joins within the hold and the step is aborted. Either way the units
 * are trained once, at step 1: the join's resolution neither counts them again nor warns
 * "already trained" (defect: each was counted a double ack with that warning), and the abort
 * does not say they go back to to-do. */
static char late_ack_log[1 << 16];
static wire_status late_ack_status;
static uint64_t late_ack_todo;
static bool late_ack_joins;

static void late_ack_scenario(void)
{
    drafter A = {"drafter-a-1", "a", 0xa1}, B = {"drafter-b-2", "b", 0xb2};
    wire_group_view va = {0}, vb;
    wire_step_grant ga, gb;
    unlink(journal_path);
    restart_hold_ms = late_ack_joins ? 60000 : 300;
    restart_compact_bytes = 0;
    group_expired_mid_step(journaled, &A, &B, &vb, &ga, &gb, &late_ack_todo);
    restart_broker();
    log_set_level(LOG_INFO); /* stub_broker_new set ERROR; what follows is said at INFO/WARN */
    cron_for(100);           /* past the orphan grace */
    stub_init(WIRE_HELLO, WIRE_ROLE_DRAFTER, A.inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", A.name);
    stub_req.u.hello.n_held = ga.n_units;
    memcpy(stub_req.u.hello.held, ga.units, ga.n_units * sizeof *ga.units);
    CHECK_EQ_INT(stub_send(A.rid), 0);
    for (uint32_t k = 0; k < ga.n_units; k++) {
        stub_init(WIRE_ACK, WIRE_ROLE_DRAFTER, A.inc);
        stub_req.u.ack.unit = ga.units[k];
        stub_req.u.ack.step = 1;
        CHECK_EQ_INT(stub_send(A.rid), 0);
    }
    if (late_ack_joins) {
        CHECK_EQ_INT(stub_group_join(&A, 1, 0, &va), 0);
        CHECK(va.rank == 0 && va.step == 1);
    } else {
        for (uint64_t end = monotime_ms() + 3000; monotime_ms() < end && stub_status().n_orphans;)
            cron_for(20);
    }
    late_ack_status = stub_status();
    stub_broker_free();
}

static void orphan_late_plain_ack(bool joins)
{
    late_ack_joins = joins;
    stub_capture_log(late_ack_scenario, late_ack_log, sizeof late_ack_log);
    const wire_status *s = &late_ack_status;
    printf("orphaned step, broker restarted, rank 0 acks its pending step plainly, then %s: "
           "%llu trained, %llu acks, %llu in flight, %llu to do (%llu before), %u orphans\n",
           joins ? "creates the group at step 1" : "nobody joins within the hold",
           (unsigned long long)s->batches_trained, (unsigned long long)s->acks,
           (unsigned long long)s->batches_inflight, (unsigned long long)s->batches_todo,
           (unsigned long long)late_ack_todo, s->n_orphans);
    CHECK_EQ_INT(s->batches_trained, 2);
    CHECK_EQ_INT(s->acks, 2);
    CHECK_EQ_INT(s->batches_inflight, 0);
    CHECK_EQ_INT(s->batches_todo, late_ack_todo);
    CHECK_EQ_INT(s->n_orphans, 0);
    CHECK(strstr(late_ack_log, "already trained") == NULL);
    if (joins) {
        CHECK(s->n_groups == 1 && s->groups[0].steps_done == 1);
        CHECK(strstr(late_ack_log, "step 1 done: 0 batches trained (2 more acked by its rank 0 "
                                   "already)") != NULL);
    } else {
        CHECK(strstr(late_ack_log, "step 1 aborted: 0 of its 2 batches go back to to-do (2 more "
                                   "acked by its rank 0 already)") != NULL);
    }
}

/* The journal's orphaned steps as a ledger opened on it reads them (NULL: none). */
static bool journal_has_orphans(void)
{
    ledger_params prm = {journal_path, 0, true, 0};
    int err = 0;
    ledger *l = ledger_new(&prm, &err);
    CHECK(l != NULL);
    uint32_t len = 0;
    bool has = l && ledger_group_orphans(l, &len) != NULL;
    ledger_destroy(&l);
    return has;
}

/* An orphans record that cannot be read (a damaged payload) is warned about once: the broker
 * journals the empty set over it (defect: it stayed in every snapshot, warned about at every
 * restart). */
static void unreadable_orphans_cleared(void)
{
    unlink(journal_path);
    ledger_params prm = {journal_path, 0, true, 0};
    int err = 0;
    ledger *l = ledger_new(&prm, &err);
    CHECK(l != NULL);
    if (!l) return;
    CHECK_EQ_INT(ledger_set_group_orphans(l, "\x01\x02\x03", 3), 0); /* no name: unreadable */
    ledger_destroy(&l);
    CHECK(journal_has_orphans());
    restart_hold_ms = 60000;
    restart_compact_bytes = 0;
    stub_broker_new(journaled);
    stub_broker_free();
    CHECK(!journal_has_orphans());
}

static void orphans_across_restart(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(journal_dir, sizeof journal_dir, "%s/test_group_broker.XXXXXX", t && *t ? t : "/tmp");
    CHECK(mkdtemp(journal_dir) != NULL);
    snprintf(journal_path, sizeof journal_path, "%s/queue.journal", journal_dir);
    orphan_across_restart(1, 0);
    orphan_across_restart(0, 0);
    orphan_across_restart(1, 1); /* compacted at every chance: the snapshot keeps the orphans */
    orphan_expires_after_restart();
    orphan_late_plain_ack(true);
    orphan_late_plain_ack(false);
    unreadable_orphans_cleared();
    test_rmtree(journal_dir);
}

int main(void)
{
    test_wire_checks();
    orphans_across_restart();
    orphan_expires();
    all_ranks_expired(0, 1);
    all_ranks_expired(1, 1);
    all_ranks_expired(0, 0);
    test_restart_order();
    test_step_after_target_restart();
    test_gone_rank();
    test_shape();
    test_micro_steps();
    test_micro_abort();
    test_micro_leftover();
    test_join_nothing_left();
    test_unread_unit_of_acked_step();
    setup();
    drafter A = {"drafter-a-1", "a", 0xa1}, Bd = {"drafter-b-2", "b", 0xb2},
            C = {"drafter-c-3", "c", 0xc3};
    CHECK_EQ_INT(hello(&A), 0);
    CHECK_EQ_INT(hello(&Bd), 0);
    CHECK_EQ_INT(hello(&C), 0);
    wire_group_view va, vb, vc;

    /* A founds the group: epoch 1, rank 0 of 1, no id yet */
    CHECK_EQ_INT(stub_group_join(&A, 0, 0, &va), 0);
    uint64_t e1 = va.epoch;
    CHECK(e1 >= 1 && va.rank == 0 && va.world == 1 && va.id_len == 0 && va.step == 0);
    /* only rank 0 posts the id; the step claim waits for it */
    CHECK_EQ_INT(claim(&A, e1, 1, NULL), DFLASH_EAGAIN);
    CHECK_EQ_INT(stub_group_set_id(&A, e1, 0x11), 0);
    CHECK_EQ_INT(stub_group_set_id(&A, e1, 0x11), 0);             /* a retry is fine */
    CHECK_EQ_INT(stub_group_set_id(&A, e1, 0x22), DFLASH_EEXISTS); /* another id is not */

    /* B joins with no step in flight: the group re-forms at once (epoch + 1, ranks by join) */
    CHECK_EQ_INT(stub_group_join(&Bd, 0, 0, &vb), 0);
    uint64_t e2 = vb.epoch;
    CHECK(e2 == e1 + 1 && vb.rank == 1 && vb.world == 2 && vb.id_len == 0);
    CHECK_EQ_INT(claim(&A, e1, 1, NULL), DFLASH_ESTALE); /* A learns: re-form */
    CHECK_EQ_INT(stub_group_join(&A, 0, e1, &va), 0);               /* old epoch: no new re-form */
    CHECK(va.epoch == e2 && va.rank == 0 && va.world == 2);
    CHECK_EQ_INT(stub_group_set_id(&Bd, e2, 0x33), DFLASH_EDENIED); /* not rank 0 */
    CHECK_EQ_INT(stub_group_set_id(&A, e1, 0x33), DFLASH_ESTALE);   /* old epoch */
    CHECK_EQ_INT(stub_group_set_id(&A, e2, 0x33), 0);
    CHECK_EQ_INT(stub_group_join(&Bd, 0, 0, &vb), 0); /* B polls and gets rank 0's id */
    CHECK(vb.epoch == e2 && vb.id_len == WIRE_GROUP_ID_BYTES && vb.id[0] == 0x33);

    /* a plain Claim from a group member is refused: groups claim whole steps */
    stub_init(WIRE_CLAIM, WIRE_ROLE_DRAFTER, A.inc);
    CHECK_EQ_INT(stub_send(A.rid), DFLASH_EDENIED);

    /* max_depth: smaller than the group's step is refused by set and by a join */
    CHECK_EQ_INT(set_depth(1), DFLASH_ERANGE);
    CHECK(strstr(stub_rep.u.error.message, "max-depth 1") != NULL);
    CHECK_EQ_INT(set_depth(2), 0);
    CHECK_EQ_INT(stub_group_join(&C, 0, 0, NULL), DFLASH_EFULL);
    CHECK(strstr(stub_rep.u.error.message, "max-depth is 2") != NULL);
    CHECK_EQ_INT(set_depth(8), 0);
    /* ... and so is a reservoir that leaves no room for a step: a step of 2 ranks needs
     * min_ready + 1 ready slots, of at most max_depth (8) */
    CHECK_EQ_INT(set_int("min-ready", 8), DFLASH_ERANGE);
    CHECK(strstr(stub_rep.u.error.message, "min-ready 8") != NULL);
    CHECK_EQ_INT(set_int("min-ready", 7), 0);
    CHECK_EQ_INT(stub_group_join(&C, 0, 0, NULL), DFLASH_EFULL); /* 3 ranks need 9 */
    CHECK(strstr(stub_rep.u.error.message, "min-ready") != NULL);
    CHECK_EQ_INT(set_int("min-ready", 0), 0);

    /* whole-step reservation: one ready slot is not a step for two ranks */
    make_ready(1);
    CHECK_EQ_INT(claim(&A, e2, 2, NULL), DFLASH_ESTATE); /* the next step is 1 */
    CHECK_EQ_INT(claim(&A, e2, 1, NULL), DFLASH_EAGAIN);
    wire_status s = stub_status();
    CHECK_EQ_INT(leased_total(&s), 0); /* nothing reserved partially */
    CHECK_EQ_INT(ready_total(&s), 1);
    make_ready(1);
    wire_step_grant ga, gb, ga2;
    CHECK_EQ_INT(claim(&A, e2, 1, &ga), 0);
    s = stub_status();
    CHECK_EQ_INT(leased_total(&s), 2); /* both ranks' slots at once */
    CHECK(s.n_groups == 1 && s.groups[0].step_reserved && s.groups[0].world == 2);
    CHECK(ga.rank == 0 && ga.world == 2 && ga.n_units == 2 && ga.step == 1 && ga.epoch == e2);
    CHECK_EQ_INT(claim(&Bd, e2, 1, &gb), 0);
    CHECK(gb.rank == 1 && gb.grant.lease_id != ga.grant.lease_id);
    CHECK(gb.units[0].index == ga.units[0].index && gb.units[1].index == ga.units[1].index);
    CHECK(gb.grant.unit.index == ga.units[1].index && ga.grant.unit.index == ga.units[0].index);
    CHECK_EQ_INT(claim(&A, e2, 1, &ga2), 0); /* a retried claim: the same lease */
    CHECK_EQ_INT(ga2.grant.lease_id, ga.grant.lease_id);

    /* C joins while step 1 is in flight: it waits for the boundary */
    CHECK_EQ_INT(stub_group_join(&C, 0, 0, NULL), DFLASH_EAGAIN);
    s = stub_status();
    CHECK_EQ_INT(s.groups[0].pending, 1);
    CHECK_EQ_INT(s.groups[0].epoch, e2);
    CHECK_EQ_INT(release(&A, ga.grant.lease_id), 0);
    CHECK_EQ_INT(release(&Bd, gb.grant.lease_id), 0);
    /* StepDone: only rank 0; acks both units once; the pending join then forms epoch 3 */
    CHECK_EQ_INT(gstep(&Bd, WIRE_STEP_DONE, e2, 1), DFLASH_EDENIED);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e2, 1), 0);
    CHECK_EQ_INT(stub_rep.u.value, 2);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 2);
    CHECK_EQ_INT(s.acks, 2);
    CHECK_EQ_INT(s.groups[0].steps_done, 1);
    CHECK_EQ_INT(s.groups[0].epoch, e2 + 1);
    CHECK_EQ_INT(s.groups[0].pending, 0);
    CHECK_EQ_INT(s.groups[0].world, 3);
    CHECK_EQ_INT(s.groups[0].step, 2);
    /* a duplicate StepDone is harmless: Ok 0, nothing recorded twice */
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e2, 1), 0);
    CHECK_EQ_INT(stub_rep.u.value, 0);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 2);
    CHECK_EQ_INT(s.acks, 2);

    /* epoch 3: A, B, C; rank 0 posts, step 2 */
    uint64_t e3 = e2 + 1;
    CHECK_EQ_INT(claim(&A, e2, 2, NULL), DFLASH_ESTALE);
    CHECK_EQ_INT(stub_group_join(&A, 1, e2, &va), 0);
    CHECK(va.epoch == e3 && va.rank == 0 && va.world == 3 && va.step == 1);
    CHECK_EQ_INT(stub_group_join(&C, 0, 0, &vc), 0);
    CHECK(vc.rank == 2 && vc.step == 1);
    CHECK_EQ_INT(stub_group_set_id(&A, e3, 0x44), 0);
    make_ready(2);
    CHECK_EQ_INT(claim(&C, e3, 2, NULL), DFLASH_EAGAIN); /* 2 ready, 3 ranks */
    make_ready(1);
    wire_step_grant gc;
    CHECK_EQ_INT(claim(&C, e3, 2, &gc), 0);
    CHECK_EQ_INT(claim(&A, e3, 2, &ga), 0);
    CHECK_EQ_INT(claim(&Bd, e3, 2, &gb), 0);
    CHECK_EQ_INT(release(&A, ga.grant.lease_id), 0);
    CHECK_EQ_INT(release(&Bd, gb.grant.lease_id), 0);
    /* C leaves before copying: epoch 3 ends; the step waits for A (the first rank left) */
    CHECK_EQ_INT(gstep(&C, WIRE_GROUP_LEAVE, 0, 0), 0);
    s = stub_status();
    CHECK_EQ_INT(s.groups[0].state, WIRE_GROUP_REFORMING);
    CHECK_EQ_INT(ready_total(&s), 0);
    CHECK_EQ_INT(claim(&Bd, e3, 2, NULL), DFLASH_ESTALE);
    CHECK_EQ_INT(stub_group_join(&Bd, 1, e3, NULL), DFLASH_EAGAIN); /* B is not the resolver */
    /* A's model is still at step 1: the step is aborted, every unit comes back */
    uint64_t todo_before = s.batches_todo;
    CHECK_EQ_INT(stub_group_join(&A, 1, e3, &va), 0);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 2); /* nothing acked */
    CHECK_EQ_INT(s.batches_todo, todo_before + 2); /* A's and B's copied units: to-do */
    CHECK_EQ_INT(ready_total(&s), 1);              /* C's uncopied slot: READY again */
    CHECK_EQ_INT(leased_total(&s), 0);
    CHECK_EQ_INT(s.groups[0].steps_aborted, 1);
    CHECK(va.epoch == e3 + 1 && va.world == 2 && va.rank == 0 && va.step == 1);
    CHECK_EQ_INT(gstep(&A, WIRE_STEP_DONE, e3, 2), DFLASH_ESTALE); /* too late: aborted */
    CHECK_EQ_INT(release(&Bd, gb.grant.lease_id), DFLASH_ESTALE);

    /* epoch 4: A, B; step 2 again. A (rank 0) dies after both copied; B's model took the step
     * (the all-reduce finished before A died): B resolves it as done */
    uint64_t e4 = va.epoch;
    CHECK_EQ_INT(stub_group_set_id(&A, e4, 0x55), 0);
    CHECK_EQ_INT(stub_group_join(&Bd, 1, 0, &vb), 0);
    CHECK(vb.epoch == e4 && vb.rank == 1);
    uint64_t redelivered = stub_status().redeliveries;
    make_ready(1);
    CHECK_EQ_INT(claim(&A, e4, 2, &ga), 0);
    CHECK_EQ_INT(claim(&Bd, e4, 2, &gb), 0);
    /* the step's two slots hold batches of the aborted one: C's uncopied slot, READY again, and
     * a copied unit produced again; both are deliveries after their first */
    CHECK_EQ_INT(stub_status().redeliveries, redelivered + 2);
    CHECK_EQ_INT(release(&A, ga.grant.lease_id), 0);
    CHECK_EQ_INT(release(&Bd, gb.grant.lease_id), 0);
    drafter A2 = {"drafter-a-9", "a", 0xa9}; /* A restarted: replaces the old session */
    CHECK_EQ_INT(hello(&A2), 0);
    s = stub_status();
    CHECK_EQ_INT(s.groups[0].state, WIRE_GROUP_REFORMING);
    CHECK_EQ_INT(s.batches_inflight, 2); /* the dead rank's copied unit waits for the verdict */
    CHECK_EQ_INT(stub_group_join(&Bd, 2, e4, &vb), 0);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 4);
    CHECK_EQ_INT(s.groups[0].steps_done, 2);
    CHECK(vb.epoch == e4 + 1 && vb.rank == 0 && vb.world == 1 && vb.step == 2);
    /* the restarted A rejoins: a new member at the end of the order, synced from rank 0 */
    CHECK_EQ_INT(stub_group_join(&A2, 0, 0, &va), 0);
    CHECK(va.epoch == e4 + 2 && va.rank == 1 && va.world == 2 && va.step == 2);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 4); /* a late joiner does not rewind the ledger */
    /* 6 distinct batches were granted; the revoked one's second grant is not counted again in
     * the consumed mix */
    CHECK_EQ_INT(s.buckets[0].consumed, 6);
    CHECK(s.groups[0].n_members == 2 && strcmp(s.groups[0].members[0], "b") == 0 &&
          strcmp(s.groups[0].members[1], "a") == 0);

    /* mutated group messages: every one gets a valid reply, the broker keeps serving */
    static const wire_type types[] = {WIRE_GROUP_JOIN, WIRE_GROUP_SET_ID, WIRE_STEP_CLAIM,
                                      WIRE_STEP_DONE, WIRE_GROUP_LEAVE};
    uint64_t seed = 12345, bad = 0;
    for (int it = 0; it < 4000; it++) {
        stub_init(types[it % 5], WIRE_ROLE_DRAFTER, Bd.inc);
        snprintf(stub_req.u.gstep.group, sizeof stub_req.u.gstep.group, "g");
        if (types[it % 5] == WIRE_GROUP_SET_ID)
            stub_req.u.set_id.id_len = 7, stub_req.u.set_id.epoch = 1;
        else
            stub_req.u.gstep.epoch = stub_req.u.gstep.step = 1 + (uint64_t)(it % 7);
        stub_req.request_id = stub_next_rid++;
        int n = wire_pack(&stub_req, stub_buf, sizeof stub_buf);
        for (int k = 0; k < 1 + it % 4 && n > 0; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            stub_buf[(seed >> 33) % (uint64_t)n] ^= (uint8_t)(seed >> 17);
        }
        int r = broker_dispatch(stub_b, (const uint8_t *)Bd.rid, strlen(Bd.rid), stub_buf,
                                n > 0 ? (size_t)n : 0, stub_out, sizeof stub_out);
        wire_msg_clear(&stub_rep);
        if (r <= 0 || wire_unpack(stub_out, (size_t)r, &stub_rep, NULL, 0) != 0) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    s = stub_status();
    CHECK_EQ_INT(s.batches_trained, 4); /* nothing recorded by the noise */

    stub_broker_free();
    CHECK_DONE();
}
