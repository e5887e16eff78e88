/* test_group_logic: the pure group state machine (services/queue/group.h) in the corners the
 * broker-level test (test_group_broker.c) does not reach:
 *   - a rank whose communicator failed to open while FORMING re-forms the group at once;
 *   - the resolver of a step in flight dies: the next surviving first rank resolves it;
 *   - every admitted rank dies with a step in flight: it is aborted, a pending joiner forms the
 *     next epoch alone; with no joiner the empty group is deleted, and the step is orphaned when
 *     every rank had copied its unit: the join that creates the group again resolves it by its
 *     model step (aborted at once when a unit was never copied);
 *   - a pending joiner that dies changes nothing (no new epoch);
 *   - a step claim for the step after the one in flight waits (EAGAIN) instead of failing;
 *   - the max-world limit and "one group per peer";
 *   - orphaned steps as bytes for the journal (a broker restart): restored, a step resolves by
 *     the creator's model step as before; units that no longer stand are left out (a step with
 *     none is dropped); malformed bytes restore nothing. */
#include "check.h"
#include "err.h"
#include "group.h"

#include <string.h>

static group_slot slot_of(uint64_t peer, uint32_t index)
{
    group_slot s = {.peer = peer, .lease_id = 100 + index, .batch = {0, 0, index}};
    return s;
}

/* Forms an active epoch of the given members (all joined, rank 0 posted an id). */
static group *form(group_table *t, const uint64_t *peers, int n)
{
    group *g = NULL;
    group_outcome o;
    for (int i = 0; i < n; i++)
        CHECK_EQ_INT(group_join(t, "g", peers[i], "p", NULL, 0, 0, 8, &g, &o), 0);
    uint8_t id[4] = {1, 2, 3, 4};
    CHECK_EQ_INT(group_set_id(g, peers[0], g->epoch, id, 4), 0);
    CHECK_EQ_INT(g->state, GROUP_ACTIVE);
    CHECK_EQ_INT(g->world, (uint32_t)n);
    return g;
}

/* Forms an active pair of ranks a and b and begins step 1, both units copied; its slots into
 * slots (may be NULL). */
static group *form_pair_in_step(group_table *t, uint64_t a, uint64_t b, group_slot slots[2])
{
    uint64_t peers[2] = {a, b};
    group *g = form(t, peers, 2);
    group_slot s[2] = {slot_of(a, 0), slot_of(b, 1)};
    s[0].released = s[1].released = true;
    group_step_begin(g, 1, s);
    if (slots) memcpy(slots, s, sizeof s);
    return g;
}

static const batch_id *gone_unit; /* stands_but_one: the unit that does not stand */

static bool stands_but_one(void *ctx, const batch_id *id)
{
    (void)ctx;
    return !gone_unit || memcmp(id, gone_unit, sizeof *id) != 0;
}

/* Orphans of groups "g" (step 1, units 0 and 1) and "h" (step 4, units 2 and 3) as bytes. */
static int orphan_bytes(uint8_t *buf, uint32_t cap)
{
    group_table *t = group_table_new();
    group_outcome o;
    group *g;
    form_pair_in_step(t, 1, 2, NULL);
    uint64_t hp[2] = {3, 4};
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(group_join(t, "h", hp[i], "p", NULL, 3, 0, 8, &g, &o), 0);
    uint8_t id[4] = {1, 2, 3, 4};
    CHECK_EQ_INT(group_set_id(g, 3, g->epoch, id, 4), 0);
    group_slot s[2] = {slot_of(3, 2), slot_of(4, 3)};
    s[0].released = s[1].released = true;
    group_step_begin(g, 4, s);
    for (uint64_t p = 1; p <= 4; p++) CHECK(group_leave(t, p, &o));
    CHECK_EQ_INT(group_orphan_count(t), 2);
    CHECK_EQ_INT(group_count(t), 0);
    CHECK_EQ_INT(group_orphans_encode(t, buf, 10), DFLASH_ENOMEM);
    int n = group_orphans_encode(t, buf, cap);
    group_table_destroy(&t);
    return n;
}

static void test_orphan_bytes(void)
{
    static uint8_t buf[GROUP_ORPHANS_MAX_BYTES];
    int n = orphan_bytes(buf, sizeof buf);
    CHECK_EQ_INT(n, 2 * (2 + 8 + 4 + 2 * 12));
    group_table *empty = group_table_new();
    CHECK_EQ_INT(group_orphans_encode(empty, buf + n, 1), 0); /* none: no bytes */
    group_table_destroy(&empty);

    /* restored: owned, listed, and resolved by the creator's model step as before */
    group_table *t = group_table_new();
    gone_unit = NULL;
    CHECK_EQ_INT(group_orphans_restore(t, buf, (uint32_t)n, stands_but_one, NULL), 2);
    group_orphan_info info;
    CHECK(group_orphan_get(t, 0, 5000, &info) && strcmp(info.name, "g") == 0 &&
          info.step == 1 && info.n_units == 2 && info.waited_ms == 0);
    CHECK(group_orphan_get(t, 1, 5000, &info) && strcmp(info.name, "h") == 0 && info.step == 4);
    CHECK(!group_orphan_get(t, 2, 5000, &info));
    batch_id u3 = {0, 0, 3};
    CHECK(group_owns_batch(t, &u3));
    char oname[GROUP_MAX_NAME];
    group_outcome o;
    CHECK(!group_orphan_expire(t, 5000, 100, oname, &o)); /* the wait starts now */
    CHECK(group_orphan_get(t, 0, 5060, &info) && info.waited_ms == 60);
    group *g;
    CHECK_EQ_INT(group_join(t, "h", 9, "p", NULL, 4, 0, 8, &g, &o), 0);
    CHECK(o.created && o.orphan && o.verdict == GROUP_ACK && o.step == 4 && o.n_slots == 2);
    CHECK(o.slots[0].released && o.slots[0].lease_id == 0 && o.slots[1].batch.index == 3);
    CHECK_EQ_INT(group_orphan_count(t), 1);
    CHECK_EQ_INT(group_join(t, "g", 8, "p", NULL, 0, 0, 8, &g, &o), 0);
    CHECK(o.created && o.orphan && o.verdict == GROUP_ABORT && o.step == 1);
    CHECK_EQ_INT(group_orphan_count(t), 0);
    group_table_destroy(&t);

    /* a unit that no longer stands (the journal shows it resolved) is left out; a step left
     * with none is dropped */
    t = group_table_new();
    batch_id u0 = {0, 0, 0};
    gone_unit = &u0;
    CHECK_EQ_INT(group_orphans_restore(t, buf, (uint32_t)n, stands_but_one, NULL), 2);
    CHECK(group_orphan_get(t, 0, 0, &info) && info.n_units == 1 && !group_owns_batch(t, &u0));
    group_table_destroy(&t);
    uint8_t one[2 + 8 + 4 + 12] = {'g', 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
    t = group_table_new();
    CHECK_EQ_INT(group_orphans_restore(t, one, sizeof one, stands_but_one, NULL), 0);
    CHECK_EQ_INT(group_orphan_count(t), 0);

    /* malformed bytes restore nothing: every truncation, no name, a unit count of 0 or past
     * the end, the same group twice */
    gone_unit = NULL;
    for (int k = 1; k < n; k++)
        if (k != n / 2) /* the end of the first step: a whole one */
            CHECK_EQ_INT(group_orphans_restore(t, buf, (uint32_t)k, stands_but_one, NULL),
                         DFLASH_ECORRUPT);
    CHECK_EQ_INT(group_orphan_count(t), 0);
    uint8_t bad[sizeof one];
    memcpy(bad, one, sizeof bad);
    bad[0] = 0; /* empty name */
    CHECK_EQ_INT(group_orphans_restore(t, bad, sizeof bad, stands_but_one, NULL), DFLASH_ECORRUPT);
    memcpy(bad, one, sizeof bad);
    bad[10] = 0; /* no units */
    CHECK_EQ_INT(group_orphans_restore(t, bad, sizeof bad, stands_but_one, NULL), DFLASH_ECORRUPT);
    bad[10] = 2; /* two units, one there */
    CHECK_EQ_INT(group_orphans_restore(t, bad, sizeof bad, stands_but_one, NULL), DFLASH_ECORRUPT);
    uint8_t twice[2 * sizeof one];
    memcpy(twice, one, sizeof one);
    memcpy(twice + sizeof one, one, sizeof one);
    CHECK_EQ_INT(group_orphans_restore(t, twice, sizeof twice, stands_but_one, NULL),
                 DFLASH_ECORRUPT);
    CHECK_EQ_INT(group_orphan_count(t), 0);
    CHECK_EQ_INT(group_orphans_restore(t, buf, (uint32_t)n / 2, stands_but_one, NULL), 1);
    group_table_destroy(&t);
}

int main(void)
{
    test_orphan_bytes();
    group_table *t = group_table_new();
    group_outcome o;
    group *g = NULL;

    /* a failed open while FORMING: new epoch at once, same members */
    CHECK_EQ_INT(group_join(t, "g", 1, "a", NULL, 0, 0, 8, &g, &o), 0);
    CHECK(o.created && o.new_epoch && g->epoch == 1);
    CHECK_EQ_INT(group_join(t, "g", 2, "b", NULL, 0, 0, 8, &g, &o), 0);
    CHECK(!o.created && o.new_epoch && g->epoch == 2 && g->world == 2);
    /* b: open failed in epoch 2 */
    CHECK_EQ_INT(group_join(t, "g", 2, "b", NULL, 0, 2, 8, &g, &o), 0);
    CHECK(o.new_epoch && g->epoch == 3 && g->world == 2 && g->state == GROUP_FORMING);
    CHECK_EQ_INT(group_join(t, "g", 2, "b", NULL, 0, 2, 8, &g, &o), 0); /* a retry: old epoch */
    CHECK(!o.new_epoch && g->epoch == 3);

    /* limits: one group per peer, max world */
    group *h = NULL;
    CHECK_EQ_INT(group_join(t, "h", 1, "a", NULL, 0, 0, 8, &h, &o), DFLASH_EEXISTS);
    CHECK_EQ_INT(group_join(t, "g", 3, "c", NULL, 0, 0, 2, &h, &o), DFLASH_EFULL);
    CHECK(h == NULL);
    CHECK(group_find(t, "h") == NULL);
    CHECK_EQ_INT(group_largest(t), 2);

    /* a step in flight; the claim of the next step waits for rank 0's StepDone */
    uint8_t id[4] = {9, 9, 9, 9};
    CHECK_EQ_INT(group_set_id(g, 1, 3, id, 4), 0);
    group_slot *mine;
    CHECK_EQ_INT(group_step_check(g, 2, 3, 1, &mine), 0);
    CHECK(mine == NULL);
    group_slot slots[2] = {slot_of(1, 0), slot_of(2, 1)};
    group_step_begin(g, 1, slots);
    CHECK_EQ_INT(group_step_check(g, 2, 3, 2, &mine), DFLASH_EAGAIN);
    CHECK_EQ_INT(group_step_check(g, 2, 3, 3, &mine), DFLASH_ESTATE);
    CHECK_EQ_INT(group_step_check(g, 2, 3, 1, &mine), 0);
    CHECK(mine && mine->lease_id == 101);
    CHECK(group_slot_of_lease(t, 100) == &g->slots[0]);

    /* c joins (pending) and dies before the boundary: no new epoch */
    CHECK_EQ_INT(group_join(t, "g", 3, "c", NULL, 0, 0, 8, &g, &o), 0);
    CHECK(!o.new_epoch && g->n_members == 3 && g->world == 2);
    CHECK(group_leave(t, 3, &o));
    CHECK(!o.new_epoch && o.verdict == GROUP_KEEP && g->epoch == 3 && g->state == GROUP_ACTIVE);

    /* d joins pending; a (rank 0, resolver-to-be) dies: b resolves; b dies too before saying
     * anything: nobody admitted is left, so the step is aborted; d alone forms epoch 4 */
    CHECK_EQ_INT(group_join(t, "g", 4, "d", NULL, 0, 0, 8, &g, &o), 0);
    CHECK(group_leave(t, 1, &o));
    CHECK(g->state == GROUP_REFORMING && g->resolver == 2 && o.verdict == GROUP_KEEP);
    CHECK_EQ_INT(group_step_done(t, g, 1, 3, 1, &o), DFLASH_EDENIED); /* a is gone: not rank 0 */
    CHECK(group_leave(t, 2, &o));
    CHECK_EQ_INT(o.verdict, GROUP_ABORT);
    CHECK_EQ_INT(o.n_slots, 2);
    CHECK(o.new_epoch && g->epoch == 4 && g->world == 1 && g->members[0].peer == 4);
    CHECK_EQ_INT(g->steps_aborted, 1);
    CHECK_EQ_INT(group_step_done(t, g, 4, 3, 1, &o), DFLASH_ESTALE);

    /* the resolver chain: e, f, k in one epoch, step 1 in flight; e dies -> f resolves; f dies
     * -> k resolves with its model step (it took the update: ACK) */
    group_table *t2 = group_table_new();
    uint64_t peers[3] = {10, 11, 12};
    g = form(t2, peers, 3);
    group_slot s3[3] = {slot_of(10, 0), slot_of(11, 1), slot_of(12, 2)};
    group_step_begin(g, 1, s3);
    CHECK(group_leave(t2, 10, &o));
    CHECK_EQ_INT(g->resolver, 11);
    CHECK(group_leave(t2, 11, &o));
    CHECK_EQ_INT(g->resolver, 12);
    CHECK_EQ_INT(group_join(t2, "g", 12, "k", NULL, 1, g->epoch, 8, &g, &o), 0);
    CHECK_EQ_INT(o.verdict, GROUP_ACK);
    CHECK_EQ_INT(o.step, 1);
    CHECK(o.new_epoch && g->world == 1 && g->base_step == 1 && g->steps_done == 1);
    /* the last member leaves: the group is deleted */
    CHECK(group_leave(t2, 12, &o));
    CHECK_EQ_INT(group_count(t2), 0);
    CHECK(!group_leave(t2, 12, &o));

    /* a group's only member dies with a step in flight: the step is aborted (its slot handed
     * back to the broker) and the empty group is deleted */
    group_table *t3 = group_table_new();
    uint64_t solo = 20;
    g = form(t3, &solo, 1);
    group_slot s1[1] = {slot_of(20, 0)};
    group_step_begin(g, 1, s1);
    CHECK(group_leave(t3, 20, &o));
    CHECK_EQ_INT(o.verdict, GROUP_ABORT);
    CHECK_EQ_INT(o.n_slots, 1);
    CHECK_EQ_INT(group_count(t3), 0);
    CHECK(group_find(t3, "g") == NULL);

    /* both ranks die after copying their units of step 1: nobody is left, the step is
     * orphaned (its units stay owned); the join that creates the group again resolves it: at
     * model step 1 it happened, at 0 it did not. A step of another group name is not touched. */
    group_table *t4 = group_table_new();
    uint64_t pair[2] = {30, 31};
    for (int creator_step = 1; creator_step >= 0; creator_step--) {
        group_slot s2[2];
        g = form_pair_in_step(t4, pair[0], pair[1], s2);
        CHECK(group_leave(t4, 30, &o));
        CHECK(!o.orphan && o.verdict == GROUP_KEEP);
        CHECK(group_leave(t4, 31, &o));
        CHECK(o.orphan && o.verdict == GROUP_KEEP && o.step == 1);
        CHECK_EQ_INT(group_count(t4), 0);
        CHECK(group_owns_batch(t4, &s2[1].batch));
        CHECK_EQ_INT(group_join(t4, "other", 32, "x", NULL, 5, 0, 8, &h, &o), 0);
        CHECK(o.created && !o.orphan && o.verdict == GROUP_KEEP);
        CHECK(group_leave(t4, 32, &o));
        CHECK_EQ_INT(group_join(t4, "g", 31, "b", NULL, (uint64_t)creator_step, 0, 8, &g, &o), 0);
        CHECK(o.created && o.orphan && o.step == 1 && o.n_slots == 2);
        CHECK_EQ_INT(o.verdict, creator_step == 1 ? GROUP_ACK : GROUP_ABORT);
        CHECK_EQ_INT(g->steps_done, creator_step == 1 ? 1 : 0);
        CHECK_EQ_INT(g->steps_aborted, creator_step == 1 ? 0 : 1);
        CHECK(!group_owns_batch(t4, &s2[1].batch));
        CHECK(group_leave(t4, 31, &o)); /* no step in flight: nothing orphaned */
        CHECK(!o.orphan && group_count(t4) == 0);
        CHECK_EQ_INT(group_join(t4, "g", 31, "b", NULL, 1, 0, 8, &g, &o), 0);
        CHECK(o.created && !o.orphan && o.verdict == GROUP_KEEP);
        CHECK(group_leave(t4, 31, &o));
    }

    /* an orphan nobody comes back for is aborted once it has waited wait_ms, counted from the
     * first look at it */
    group_slot s4[2];
    g = form_pair_in_step(t4, pair[0], pair[1], s4);
    CHECK(group_leave(t4, 30, &o));
    CHECK(group_leave(t4, 31, &o));
    CHECK(o.orphan && o.verdict == GROUP_KEEP);
    char oname[GROUP_MAX_NAME] = "";
    CHECK(!group_orphan_expire(t4, 1000, 500, oname, &o));
    CHECK(!group_orphan_expire(t4, 1499, 500, oname, &o));
    CHECK(group_owns_batch(t4, &s4[0].batch));
    CHECK(group_orphan_expire(t4, 1500, 500, oname, &o));
    CHECK(o.orphan && o.verdict == GROUP_ABORT && o.step == 1 && o.n_slots == 2);
    CHECK(strcmp(oname, "g") == 0);
    CHECK(!group_owns_batch(t4, &s4[0].batch));
    CHECK(!group_orphan_expire(t4, 99999, 500, oname, &o));
    CHECK_EQ_INT(group_join(t4, "g", 31, "b", NULL, 1, 0, 8, &g, &o), 0);
    CHECK(o.created && !o.orphan && o.verdict == GROUP_KEEP); /* nothing left to resolve */
    CHECK(group_leave(t4, 31, &o));

    /* staggered expiry: rank 0 (40) expires, comes back at its model step 1 and waits for the
     * boundary; then rank 1 (41), the resolver, expires too. The returning rank 0, which forms
     * the next epoch, has step 1: ACK, and the group goes on from step 1 (it was aborted, and
     * base_step stayed 0 while 40's model was at 1: its claims of step 2 were refused for
     * good). A newcomer in its place (model step 0) aborts it. */
    for (int back_step = 1; back_step >= 0; back_step--) {
        group_table *t5 = group_table_new();
        g = form_pair_in_step(t5, 40, 41, NULL);
        CHECK(group_leave(t5, 40, &o));
        CHECK(o.verdict == GROUP_KEEP && g->resolver == 41);
        CHECK_EQ_INT(group_join(t5, "g", 40, "a", NULL, (uint64_t)back_step, 0, 8, &g, &o), 0);
        CHECK(!o.created && o.verdict == GROUP_KEEP && g->state == GROUP_REFORMING);
        CHECK(group_leave(t5, 41, &o));
        CHECK(!o.orphan && o.new_epoch);
        CHECK_EQ_INT(o.verdict, back_step == 1 ? GROUP_ACK : GROUP_ABORT);
        CHECK_EQ_INT(g->base_step, (uint64_t)back_step);
        uint8_t id5[4] = {5, 6, 7, 8};
        CHECK_EQ_INT(group_set_id(g, 40, g->epoch, id5, 4), 0);
        group_slot *sl = NULL;
        CHECK_EQ_INT(group_step_check(g, 40, g->epoch, (uint64_t)back_step + 1, &sl), 0);
        group_table_destroy(&t5);
    }

    /* a joiner ahead of the group (model step 7, the group at step 1 in flight) waiting for the
     * boundary, which becomes rank 0 when every rank has left: the step is acked by its model
     * step and the group goes on from its step 7, not 1 (its claims of step 8 would be refused
     * for good) */
    group_table *t6 = group_table_new();
    g = form_pair_in_step(t6, 50, 51, NULL);
    CHECK_EQ_INT(group_join(t6, "g", 52, "c", NULL, 7, 0, 8, &h, &o), 0);
    CHECK(group_leave(t6, 50, &o));
    CHECK(group_leave(t6, 51, &o));
    CHECK_EQ_INT(o.verdict, GROUP_ACK);
    CHECK(o.new_epoch && g->base_step == 7 && g->world == 1);
    group_table_destroy(&t6);

    group_table_destroy(&t);
    group_table_destroy(&t2);
    group_table_destroy(&t3);
    group_table_destroy(&t4);
    CHECK(t == NULL);
    CHECK_DONE();
}
