/* broker_groups: the broker's side of data-parallel drafter groups (group.h holds the state
 * machine; docs/protocol.md "Groups"). The handlers turn GroupJoin, GroupSetId, StepClaim,
 * StepDone and GroupLeave into group.c calls and carry out the outcome (apply_outcome): ledger
 * acks of a step's units once for the group, or requeue/revoke on an abort. A step's
 * reservation is all or nothing (policy_claimable first). A dead drafter's copied units of a
 * step in flight, or of a step orphaned by the group's last member, stay in flight until the
 * step is resolved (broker.c's peer_remove skips the units group_owns_batch names).
 * Orphaned steps across a restart: every change of the set of orphaned steps (one orphaned,
 * resolved by a join, expired) is journaled as the ledger's GROUP_ORPHANS record (the whole set,
 * fsynced, after the records of the resolution's acks or requeues), and broker_new restores them
 * (broker_groups_restore): each unit that the replayed ledger still has in flight is taken from
 * the ledger's restart orphans (ledger_adopt), so the orphan grace does not give it back to to-do,
 * and waits, as before the restart, for the join that creates the group again or for the hold
 * (counted again from the restart). A unit the journal shows resolved (a crash between the
 * resolution's records and the new set) is not restored.
 * A joiner whose GroupJoin states a drafter shape other than its group's (group_shape_of) is
 * refused for good (Error MISMATCH, refuse_shape) before anything changes: the group does not
 * re-form for a rank that its state sync would turn away.
 * The group's gradient accumulation (GroupJoin.accumulate) is checked as its shape is. Micro-steps
 * (group.h): StepClaim.micro k reserves micro-step k of the step, all or nothing; a claim of
 * k > 0 that can never be served (the plan has nothing left but the step's own batches, a drain
 * with nothing filling, the broker stopping) ends the step there (group_step_end, end_reason):
 * every rank gets the same Error SHUTDOWN for it and closes the step with the micro-steps it has.
 * A member a survivor's GroupJoin names dead (gone_rank: its collective saw the process end)
 * leaves the group at once, as on its GroupLeave (drop_gone_rank); its session stays until the
 * heartbeat expires it.
 * Thread: the broker's loop thread. Callers: broker.c (dispatch, peer_remove).
 */
#include "broker_state.h"

#include "err.h"
#include "log.h"

#include <assert.h>
#include <inttypes.h>
#include <string.h>

/* Journals the set of orphaned steps as it is now (the ledger's GROUP_ORPHANS record). A failed
 * journal is said by journal_watch; the set is in memory and in the snapshot that heals it. */
static void journal_orphans(broker *b)
{
    static uint8_t buf[GROUP_ORPHANS_MAX_BYTES]; /* loop thread only */
    int n = group_orphans_encode(b->groups, buf, sizeof buf);
    assert(n >= 0);
    int rc = ledger_set_group_orphans(b->ledger, buf, (uint32_t)n);
    if (rc && rc != DFLASH_EIO)
        LOG_WARN("cannot keep the orphaned group steps for the journal: %s (a restart now "
                 "would give their batches back to to-do)", err_str(rc));
}

/* Whether batch was trained at `step` by a plain ack: a rank 0 whose StepDone a restarted broker
 * answered Stale says hello holding the step's units and acks each (group_worker's
 * do_register); when the step was orphaned, the join that resolves it later finds them trained
 * at that very step, once, not twice. */
static bool acked_late(broker *b, const batch_id *batch, uint64_t step)
{
    batch_state st;
    uint64_t at = 0;
    return ledger_get(b->ledger, batch, &st, &at) == 0 &&
           (st == BATCH_TRAINED || st == BATCH_COMMITTED) && at == step;
}

/* Whether a late ack recorded batch trained (at any step): its lease, marked by the ack
 * (policy_lease_trained), ends in FREE, and the batch is not to do again. */
static bool trained_meanwhile(broker *b, const batch_id *batch)
{
    batch_state st;
    return ledger_get(b->ledger, batch, &st, NULL) == 0 &&
           (st == BATCH_TRAINED || st == BATCH_COMMITTED);
}

/* Carries out what a group call decided (group.h, group_outcome): ACK records every unit of the
 * step as trained at the step (once for the whole group), ABORT gives unreleased leases back
 * (READY again; FREE, and counted apart, where a late ack trained the batch meanwhile) and
 * returns released units to to-do; an outcome that orphaned or resolved an
 * orphaned step journals the orphans after that. Returns the units recorded as trained. */
static uint32_t apply_outcome(broker *b, const char *name, const group_outcome *o)
{
    if (o->orphan && o->verdict == GROUP_KEEP)
        LOG_WARN("group %s: its last member left while step %" PRIu64 " was in flight: the step "
                 "waits, its units in flight, for the group to be created again (the ranks may "
                 "be alive and have it: the creator's model step says whether it happened)",
                 name, o->step);
    else if (o->orphan)
        LOG_INFO("group %s: created again by a member at a model step %s %" PRIu64 ": the "
                 "orphaned step %s", name, o->verdict == GROUP_ACK ? ">=" : "<", o->step,
                 o->verdict == GROUP_ACK ? "happened" : "did not happen");
    if (o->verdict == GROUP_KEEP) {
        if (o->orphan) journal_orphans(b);
        return 0;
    }
    uint32_t n = 0, late = 0, back = 0, meanwhile = 0;
    for (uint32_t r = 0; r < o->n_slots; r++) {
        const group_slot *s = &o->slots[r];
        /* a step restored after a restart has no leases (lease_id 0) */
        bool revoked = b->policy && s->lease_id && policy_lease_revoke(b->policy, s->lease_id) == 0;
        if (o->verdict == GROUP_ACK && s->released && acked_late(b, &s->batch, o->step)) {
            late++; /* not acked again: the ledger would count a double ack */
        } else if (o->verdict == GROUP_ACK && s->released) {
            int rc = ledger_ack(b->ledger, &s->batch, o->step);
            if (rc == DFLASH_EEXISTS) {
                b->double_acks++;
                LOG_WARN("group %s: batch %u/%u/%u of step %" PRIu64 " was already trained: "
                         "not recorded twice", name, s->batch.epoch, s->batch.bucket,
                         s->batch.index, o->step);
            } else if (rc == 0) {
                n++;
            }
            if (rc && rc != DFLASH_EEXISTS)
                LOG_WARN("group %s: ack of %u/%u/%u at step %" PRIu64 ": %s", name,
                         s->batch.epoch, s->batch.bucket, s->batch.index, o->step, err_str(rc));
        } else if (o->verdict == GROUP_ACK) {
            /* the rank never released its slot, so it cannot have trained it. Its live lease was
             * revoked above (READY again); a lease that ended before had its batch dealt with
             * then (expired: READY again or quarantined; given back unread or its pool gone:
             * to do again, maybe produced since), so it is not requeued here, as on an abort:
             * that would put it to do while a slot holds it, to be produced and trained twice */
            LOG_WARN("group %s: step %" PRIu64 " acked but rank %u never copied its slot: batch "
                     "%u/%u/%u not recorded", name, o->step, r, s->batch.epoch, s->batch.bucket,
                     s->batch.index);
        } else if (revoked && trained_meanwhile(b, &s->batch)) {
            meanwhile++; /* another drafter's late ack: its slot was freed, not made ready */
        } else if (revoked || (s->released && ledger_requeue(b->ledger, &s->batch) == 0)) {
            back++;
        } else if (s->released && acked_late(b, &s->batch, o->step)) {
            late++; /* rank 0 acked it; its model has the step although nobody joined since */
        }
        broker_held_remove_all(b, &s->batch);
    }
    b->acks += n;
    char also[160] = "";
    if (late)
        snprintf(also, sizeof also, " (%u more acked by its rank 0 already)", late);
    if (meanwhile)
        snprintf(also + strlen(also), sizeof also - strlen(also),
                 " (%u trained meanwhile: another drafter's late ack)", meanwhile);
    if (o->verdict == GROUP_ACK)
        LOG_INFO("group %s: step %" PRIu64 " done: %u batches trained%s", name, o->step, n, also);
    else
        LOG_INFO("group %s: step %" PRIu64 " aborted: %u of its %u batches go back to to-do%s",
                 name, o->step, back, o->n_slots, also);
    if (o->orphan) journal_orphans(b);
    return n;
}

void broker_groups_tick(broker *b, uint64_t now)
{
    char name[GROUP_MAX_NAME];
    group_outcome o;
    uint64_t wait = b->cfg.group_hold_ms > 0 ? (uint64_t)b->cfg.group_hold_ms : 0;
    bool expired = false;
    while (group_orphan_expire(b->groups, now, wait, name, &o)) {
        expired = true;
        LOG_WARN("group %s: nobody created it again within %" PRIu64 " ms (--group-hold-ms) of "
                 "its last member leaving while step %" PRIu64 " was in flight: the step is "
                 "aborted (its ranks are taken for gone; one that comes back later holding the "
                 "step trains its batches again)", name, wait, o.step);
        o.orphan = false; /* said above; apply_outcome's orphan lines are the join's */
        apply_outcome(b, name, &o);
    }
    if (expired) journal_orphans(b);
}

/* group_orphans_restore's test of a unit: still in flight in the replayed ledger (the journal
 * does not show it trained or requeued), then taken from the ledger's restart orphans. */
static bool orphan_unit_stands(void *ctx, const batch_id *id)
{
    broker *b = ctx;
    batch_state st;
    if (ledger_get(b->ledger, id, &st, NULL) != 0 || st != BATCH_IN_FLIGHT) return false;
    int rc = ledger_adopt(b->ledger, id);
    return rc == 0 || rc == DFLASH_EEXISTS;
}

void broker_groups_restore(broker *b)
{
    uint32_t len;
    const uint8_t *p = ledger_group_orphans(b->ledger, &len);
    if (!p) return;
    int n = group_orphans_restore(b->groups, p, len, orphan_unit_stands, b);
    if (n < 0) {
        LOG_WARN("the journal's orphaned group steps cannot be read (%s): their batches go back "
                 "to to-do with the other batches in flight before the restart", err_str(n));
        /* said once: the set journaled now replaces the unreadable one (defect: it was kept in
         * every snapshot and warned about at every restart) */
        journal_orphans(b);
        return;
    }
    uint64_t hold = b->cfg.group_hold_ms > 0 ? (uint64_t)b->cfg.group_hold_ms : 0;
    group_orphan_info info;
    for (uint32_t i = 0; group_orphan_get(b->groups, i, 0, &info); i++)
        LOG_WARN("group %s: step %" PRIu64 " was orphaned before the restart (every rank expired "
                 "while it trained); its %u batches stay in flight for the join that creates the "
                 "group again (its model step says whether the step happened), %" PRIu64 " ms at "
                 "most (--group-hold-ms)", info.name, info.step, info.n_units, hold);
    static uint8_t restored[GROUP_ORPHANS_MAX_BYTES]; /* loop thread only */
    int m = group_orphans_encode(b->groups, restored, sizeof restored);
    if (m != (int)len || memcmp(restored, p, len) != 0) journal_orphans(b); /* some resolved */
}

static void log_epoch(const group *g)
{
    char ranks[512] = "";
    size_t off = 0;
    for (uint32_t i = 0; i < g->n_members && off < sizeof ranks; i++)
        if (g->members[i].admitted)
            off += (size_t)snprintf(ranks + off, sizeof ranks - off, "%s%u=%s", off ? " " : "",
                                    g->members[i].rank, g->members[i].name);
    LOG_INFO("group %s: epoch %" PRIu64 ", world %u, next step %" PRIu64 ": %s", g->name,
             g->epoch, g->world, g->base_step + 1, ranks);
}

/* Member `incarnation` (named who) leaves group g, which re-forms; how, in words. */
static void member_leaves(broker *b, group *g, uint64_t incarnation, const char *who,
                          const char *how)
{
    char name[GROUP_MAX_NAME];
    snprintf(name, sizeof name, "%s", g->name);
    group_outcome o;
    group_leave(b->groups, incarnation, &o);
    LOG_INFO("group %s: %s left%s", name, who, how);
    apply_outcome(b, name, &o);
    if (o.new_epoch && (g = group_find(b->groups, name))) log_epoch(g);
}

/* A drafter left (expired, replaced or said goodbye): its group re-forms. */
void broker_groups_peer_gone(broker *b, peer *p)
{
    group *g = group_of_peer(b->groups, p->incarnation);
    if (g) member_leaves(b, g, p->incarnation, p->name, "");
}

/* A member's join reports the failed epoch's rank j->gone_rank dead (its collective saw that
 * process end: GroupJoin.gone_rank). That member leaves the group now, as its expiry would later
 * make it: the epoch the survivors form next is without it (it kept them waiting in the
 * communicator's join until the broker expired it) and status stops listing it. Believed only
 * from an admitted member of that epoch, still the group's current one, about another admitted
 * member; else ignored (the epoch moved on: the first report, or the expiry, did it). Its
 * session is not ended: it expires as before (its leases, its held batches). */
static void drop_gone_rank(broker *b, peer *p, const wire_group_join *j)
{
    group *g = group_find(b->groups, j->group);
    const group_entry *me = g ? group_entry_of(g, p->incarnation) : NULL;
    if (!me || !me->admitted || j->failed_epoch != g->epoch) return;
    for (uint32_t i = 0; i < g->n_members; i++) {
        const group_entry *e = &g->members[i];
        if (e == me || !e->admitted || e->rank != j->gone_rank) continue;
        char who[GROUP_MAX_NAME], how[GROUP_MAX_NAME + 96];
        snprintf(who, sizeof who, "%s", e->name);
        snprintf(how, sizeof how, " (rank %u of epoch %" PRIu64 "): %s saw its process end",
                 e->rank, g->epoch, p->name);
        member_leaves(b, g, e->peer, who, how);
        return;
    }
}

static void reply_view(broker *b, const group *g, const group_entry *e, uint64_t rid, wire_msg *r)
{
    reply_init(b, r, WIRE_GROUP_VIEW, rid);
    wire_group_view *v = &r->u.view;
    snprintf(v->group, sizeof v->group, "%s", g->name);
    v->epoch = g->epoch;
    v->rank = e->rank;
    v->world = g->world;
    v->step = g->base_step;
    v->id_len = g->id_len;
    memcpy(v->id, g->id, g->id_len);
}

/* Whether p's join, which would create group j->group at p's model step, waits instead. Only
 * rank 0 writes checkpoints, so after the whole group went down a member with no checkpoint of
 * its own (a former rank 1..R-1, back at step 0) may come back first; created at its step, the
 * group would rewind the ledger past its commits (or, refused, train on with those batches
 * committed but in no model) and then replace the checkpoint holder's weights with its own when
 * it joins. So a creator below the newest committed checkpoint's step waits up to group-hold-ms
 * for a member that resumes from it; past that it creates the group as a solo drafter resumes,
 * the rewind refused when an epoch it would reopen is finished. True when r holds the wait. */
static bool hold_creation(broker *b, peer *p, const wire_group_join *j, uint64_t rid, wire_msg *r)
{
    ledger_stats ls;
    ledger_get_stats(b->ledger, &ls);
    if (j->step >= ls.last_commit_step || b->cfg.group_hold_ms <= 0) return false;
    uint64_t now = now_ms(b), hold = (uint64_t)b->cfg.group_hold_ms;
    if (!p->group_hold_since_ms) {
        p->group_hold_since_ms = now;
        LOG_WARN("group %s: %s would create it at step %" PRIu64 ", below the newest committed "
                 "checkpoint (step %" PRIu64 "): waiting up to %" PRIu64 " ms for a member "
                 "resuming from that checkpoint", j->group, p->name, j->step,
                 ls.last_commit_step, hold);
    }
    uint64_t waited = now - p->group_hold_since_ms;
    if (waited >= hold) {
        LOG_WARN("group %s: no member resuming from step %" PRIu64 " came in %" PRIu64 " ms: %s "
                 "creates it at step %" PRIu64, j->group, ls.last_commit_step, waited, p->name,
                 j->step);
        return false;
    }
    reply_error(b, r, rid, DFLASH_EAGAIN, "group %s: the newest committed checkpoint is at step "
                "%" PRIu64 " and this drafter is at step %" PRIu64 ": waiting %" PRIu64 " s more "
                "for a member resuming from it (it becomes rank 0)", j->group,
                ls.last_commit_step, j->step, (hold - waited + 999) / 1000);
    /* a member whose run stops at or before that step ends on it (the member holding the
     * checkpoint may have ended already, its run done) */
    r->u.error.committed_step = ls.last_commit_step;
    return true;
}

/* A drafter shape for messages: its words, else its layout hash. */
static const char *shape_words(const group_shape *s, char *buf, size_t len)
{
    if (s->text[0]) return s->text;
    snprintf(buf, len, "layout %016" PRIx64, s->hash);
    return buf;
}

/* p's join stated shape *mine, another than group g's (group_shape_of): refused for good
 * (Error MISMATCH) before the group re-forms for it; both shapes in the log and in r, and
 * what differs in r's mismatch (the accumulate when both do), which the drafter reads. */
static void refuse_shape(broker *b, peer *p, const group *g, const group_shape *mine,
                         uint64_t rid, wire_msg *r)
{
    if (group_accumulate(g) != (mine->accumulate ? mine->accumulate : 1)) {
        const group_entry *first = &g->members[0];
        uint32_t ours = mine->accumulate ? mine->accumulate : 1;
        LOG_WARN("group %s: %s refused: it accumulates %u micro-steps a step, the group (its "
                 "rank 0 %s) %u", g->name, p->name, ours, first->name, group_accumulate(g));
        reply_error(b, r, rid, DFLASH_EMISMATCH, "group %s trains %u micro-steps a step "
                    "(--accumulate of its rank 0 %s); this one has --accumulate %u: every "
                    "member must have the same", g->name, group_accumulate(g), first->name, ours);
        r->u.error.mismatch = WIRE_MISMATCH_ACCUMULATE;
        return;
    }
    const group_entry *owner = group_shape_of(g);
    char a[32], c[32];
    const char *theirs = shape_words(&owner->shape, a, sizeof a);
    const char *ours = shape_words(mine, c, sizeof c);
    LOG_WARN("group %s: %s refused: its drafter (%s; layout %016" PRIx64 ") differs from the "
             "group's, that of %s, rank 0 (%s; layout %016" PRIx64 ")", g->name, p->name, ours,
             mine->hash, owner->name, theirs, owner->shape.hash);
    reply_error(b, r, rid, DFLASH_EMISMATCH, "group %s trains another drafter: its rank 0 %s has "
                "%s; this one has %s", g->name, owner->name, theirs, ours);
    r->u.error.mismatch = WIRE_MISMATCH_SHAPE;
}

/* A join that ends its member's run when the broker has nothing more (GroupJoin's
 * ends_when_drained) is answered SHUTDOWN, as a claim is, when nothing is left to hand out
 * (drained, or the plan done), no group step is orphaned (its units wait for a join to resolve
 * them) and group g has no step in flight (the join may resolve it); a rank whose partner left
 * at the data's end otherwise waited --group-wait-s for another before it claimed and heard
 * it. Only in a group that exists (a creating join is answered as before) and has trained a
 * step since the broker started, or has had an epoch of the joiner's --group-size (world_hint):
 * a group created by a resumed member at the data's end waits for its ranks as at any start,
 * so the member holding the newest checkpoint does not leave before one with an older model,
 * whose creation of the group would rewind the trained batches. True when r holds the answer. */
static bool answer_nothing_left(broker *b, const group *g, uint32_t world_hint, uint64_t rid,
                                wire_msg *r)
{
    if (!g || g->step_active || group_orphan_count(b->groups)) return false;
    if (!g->steps_done && g->widest < world_hint) return false;
    if (broker_drained(b)) {
        reply_error(b, r, rid, DFLASH_ESHUTDOWN, "drained");
        return true;
    }
    if (!broker_plan_done(b)) return false;
    broker_reply_plan_done(b, r, rid);
    return true;
}

/* A group created by a join rewound the ledger to its creator's step (a REWIND record, fsynced).
 * Until that record is on disk nobody trains in the group: a broker started again before it
 * was would replay no rewind and take the batches trained after that step for trained, though
 * the group's model lacks them (defect: only the creating join was answered Error IO, and its
 * next join, or a second member's, got a view). While it is being written a join's reply waits
 * for it (Error IO if it fails: dispatch); once it failed (the journal is failing, not rewritten
 * whole since), joins are answered AGAIN until the journal heals. True when r holds that. */
static bool rewind_not_durable(broker *b, const group *g, uint64_t rid, wire_msg *r)
{
    if (!g || !g->rewind_seq) return false;
    uint64_t done, fail;
    ledger_journal_progress(b->ledger, &done, &fail);
    if (fail && fail <= g->rewind_seq) {
        const char *why = ledger_journal_failure(b->ledger);
        reply_error(b, r, rid, DFLASH_EAGAIN, "group %s: its rewind to step %" PRIu64 " is not "
                    "on disk, the broker's journal is failing (%s): waiting for it to heal",
                    g->name, g->base_step, why ? why : "a write failed");
        return true;
    }
    if (done < g->rewind_seq) b->dispatch_wait_seq = g->rewind_seq;
    return false;
}

void broker_on_group_join(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_join *j = &m->u.join;
    group_shape shape = {.hash = j->shape, .accumulate = j->accumulate};
    _Static_assert(sizeof shape.text == sizeof j->shape_text, "GROUP_SHAPE_TEXT");
    memcpy(shape.text, j->shape_text, sizeof shape.text);
    bool creates = !group_find(b->groups, j->group) && !group_of_peer(b->groups, p->incarnation);
    if (!creates && rewind_not_durable(b, group_find(b->groups, j->group), m->request_id, r))
        return;
    if (creates) {
        if (hold_creation(b, p, j, m->request_id, r)) return;
        /* the group continues from its creator's model: batches trained after it are redone */
        int64_t n = broker_rewind_to(b, j->step, r, m->request_id);
        if (n < 0) {
            LOG_WARN("group %s: %s cannot create it at step %" PRIu64 ": %s", j->group, p->name,
                     j->step, r->u.error.message);
            return;
        }
        char w[32];
        LOG_INFO("group %s created by %s at step %" PRIu64 ": %" PRId64 " batches trained after "
                 "it back to to-do; its drafter: %s; %u micro-step%s a step", j->group, p->name,
                 j->step, n, shape.hash ? shape_words(&shape, w, sizeof w) : "shape not stated",
                 j->accumulate > 1 ? j->accumulate : 1, j->accumulate > 1 ? "s" : "");
    }
    if (j->has_gone_rank) drop_gone_rank(b, p, j);
    if (j->ends_when_drained &&
        answer_nothing_left(b, group_find(b->groups, j->group), j->world_hint, m->request_id, r))
        return;
    group *g;
    group_outcome o;
    /* A step of R ranks needs min_ready + R - 1 ready slots (depth_check) */
    int64_t max_world = b->cfg.max_depth - (b->cfg.min_ready ? b->cfg.min_ready - 1 : 0);
    int rc = group_join(b->groups, j->group, p->incarnation, p->name, &shape, j->step,
                        j->failed_epoch, (uint32_t)max_world, &g, &o);
    if (rc == DFLASH_EMISMATCH) {
        refuse_shape(b, p, g, &shape, m->request_id, r);
        return;
    }
    if (rc == DFLASH_EFULL) {
        const group *cur = group_find(b->groups, j->group);
        uint32_t n = (cur ? cur->n_members : 0) + 1, acc = j->accumulate ? j->accumulate : 1;
        if (n <= max_world)
            return reply_error(b, r, m->request_id, rc,
                               "group %s would have %u ranks of %u micro-steps a step: more "
                               "than %d batches a step", j->group, n, acc, GROUP_MAX_UNITS);
        return reply_error(b, r, m->request_id, rc,
                           "group %s would have %u ranks but max-depth is %lld and min-ready "
                           "%lld: one step needs min-ready - 1 + one slot per rank (raise "
                           "max-depth or lower min-ready first)",
                           j->group, n, (long long)b->cfg.max_depth, (long long)b->cfg.min_ready);
    }
    if (rc == DFLASH_EEXISTS)
        return reply_error(b, r, m->request_id, rc, "%s is in another group", p->name);
    if (rc) return reply_error(b, r, m->request_id, rc, "join refused");
    if (creates) g->rewind_seq = ledger_journal_seq(b->ledger); /* its REWIND's (0: no journal) */
    p->group_hold_since_ms = 0;
    apply_outcome(b, j->group, &o);
    if (o.new_epoch) log_epoch(g);
    const group_entry *e = group_entry_of(g, p->incarnation);
    if (e && e->admitted && e->rank == 0 && g->state != GROUP_REFORMING && !g->step_active &&
        j->step < g->base_step) {
        /* The group continues from rank 0's model, and ours is older: every member that had the
         * group's model is gone (the whole group went down and this one, without a checkpoint of
         * its own, came back before the broker had expired the old rank 0). Created again, the
         * group takes the member resuming from the newest checkpoint as rank 0 (hold_creation). */
        LOG_WARN("group %s: rank 0 (%s) is at step %" PRIu64 ", below the group's step %" PRIu64
                 ": no member has the group's model; dissolved, to be created again",
                 g->name, p->name, j->step, g->base_step);
        uint64_t base = g->base_step;
        group_dissolve(b->groups, g);
        return reply_error(b, r, m->request_id, DFLASH_EAGAIN,
                           "group %s was at step %" PRIu64 " and its rank 0 now, this drafter, "
                           "is at step %" PRIu64 " (every member with the group's model is gone): "
                           "dissolved; join again", j->group, base, j->step);
    }
    if (e && e->admitted && g->state != GROUP_REFORMING) return reply_view(b, g, e, m->request_id, r);
    if (g->state == GROUP_REFORMING)
        return reply_error(b, r, m->request_id, DFLASH_EAGAIN,
                           "group %s is re-forming: waiting for its first rank to finish or "
                           "abandon step %" PRIu64, g->name, g->step);
    return reply_error(b, r, m->request_id, DFLASH_EAGAIN,
                       "waiting for step %" PRIu64 " of group %s to finish", g->step, g->name);
}

void broker_on_group_set_id(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_set_id *s = &m->u.set_id;
    group *g = group_find(b->groups, s->group);
    if (!g) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "no group %s: join", s->group);
    int rc = group_set_id(g, p->incarnation, s->epoch, s->id, s->id_len);
    if (rc == DFLASH_ESTALE)
        return reply_error(b, r, m->request_id, rc, "epoch %llu of group %s is over (now %llu): "
                           "re-form", (unsigned long long)s->epoch, g->name,
                           (unsigned long long)g->epoch);
    if (rc) return reply_error(b, r, m->request_id, rc, "only rank 0 sets the id, once");
    reply_ok(b, r, m->request_id, 0);
}

/* Why micro-step `micro` (> 0) of g's step in flight can never be reserved, or NULL when it
 * may be later (AGAIN): the broker stops; a drain with nothing filling (no slot will be ready
 * again); or the plan has no batch left but the step's own (in flight until it is acked), or
 * fewer than one a rank (broker_plan_left_but). */
static const char *end_reason(broker *b, group *g)
{
    if (b->stop_phase == BROKER_STOPPING) return "the broker is stopping";
    policy_stats ps;
    policy_get_stats(b->policy, &ps);
    if (b->pending_mode == POLICY_DRAINING && ps.filling == 0) return "the broker drains";
    uint32_t own = 0;
    for (uint32_t i = 0; i < g->step_world * g->step_micros; i++) {
        batch_state st;
        own += ledger_get(b->ledger, &g->slots[i].batch, &st, NULL) == 0 &&
               st == BATCH_IN_FLIGHT;
    }
    uint64_t left = broker_plan_left_but(b, own);
    if (left == 0) return "every batch of the planned epochs is trained or in this step";
    /* fewer than one a rank: no micro-step can be reserved again (the step would wait for a
     * drain with its trained micro-steps unapplied); they stay to do, as at a step's start */
    return left < g->world ? "fewer batches than ranks are left in the planned epochs" : NULL;
}

/* The slots of the step's next micro-step (micro 0 begins the step), one per admitted rank,
 * all or nothing. 0, or a code with r holding the answer. */
static int reserve_micro(broker *b, group *g, const wire_group_step *c, uint64_t rid,
                         wire_msg *r)
{
    if (c->micro == 0 && broker_drained(b)) {
        reply_error(b, r, rid, DFLASH_ESHUTDOWN, "drained");
        return DFLASH_ESHUTDOWN;
    }
    if (!b->policy) {
        reply_error(b, r, rid, DFLASH_EAGAIN, "no pool yet");
        return DFLASH_EAGAIN;
    }
    bool short_of = policy_claimable(b->policy) < g->world;
    /* a stopping broker ends the step at once, slots or not: no new leases to wait for */
    const char *why = !c->micro                          ? NULL
                      : b->stop_phase == BROKER_STOPPING ? "the broker is stopping"
                      : short_of                         ? end_reason(b, g)
                                                         : NULL;
    if (why) { /* sticky: every rank closes the step with the micro-steps reserved */
        group_step_end(g);
        LOG_INFO("group %s: step %" PRIu64 " ends with %u of its %u micro-steps (%u "
                 "batches): %s", g->name, g->step, g->step_micros, g->step_accumulate,
                 g->step_micros * g->step_world, why);
        return DFLASH_ESHUTDOWN; /* answered by the caller, as every later claim */
    }
    if (short_of) {
        if (!c->micro && broker_plan_done(b)) {
            broker_reply_plan_done(b, r, rid);
            return DFLASH_ESHUTDOWN;
        }
        reply_error(b, r, rid, DFLASH_EAGAIN, "fewer than %u slots eligible for a step", g->world);
        return DFLASH_EAGAIN;
    }
    group_slot slots[GROUP_MAX_WORLD];
    uint64_t now = now_ms(b), taken[GROUP_MAX_WORLD];
    uint32_t n_taken = 0;
    for (uint32_t i = 0; i < g->n_members; i++) {
        const group_entry *e = &g->members[i];
        if (!e->admitted) continue;
        policy_grant pg;
        int rc = policy_claim(b->policy, e->peer, now, &pg); /* policy_claimable said it would */
        if (rc) { /* only out of memory: give back what was taken, reserve nothing */
            while (n_taken) policy_lease_revoke(b->policy, taken[--n_taken]);
            reply_error(b, r, rid, rc, "step reservation failed");
            return rc;
        }
        taken[n_taken++] = pg.lease_id;
        slots[e->rank] = (group_slot){.peer = e->peer, .lease_id = pg.lease_id,
                                      .batch = pg.where.batch, .pool_id = pg.where.pool_id,
                                      .slot = pg.where.slot, .n_tokens = pg.where.n_tokens,
                                      .pool_incarnation = pg.where.incarnation};
        broker_granted(b, &pg);
    }
    if (c->micro == 0) group_step_begin(g, c->step, slots);
    else group_step_add(g, slots);
    return 0;
}

void broker_on_step_claim(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_step *c = &m->u.gstep;
    group *g = group_find(b->groups, c->group);
    if (!g) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "no group %s: join", c->group);
    group_slot *mine;
    int rc = group_micro_check(g, p->incarnation, c->epoch, c->step, c->micro, &mine);
    if (rc == DFLASH_ESTALE)
        return reply_error(b, r, m->request_id, rc, "epoch %llu of group %s is over: re-form",
                           (unsigned long long)c->epoch, g->name);
    if (rc == DFLASH_EAGAIN)
        return reply_error(b, r, m->request_id, rc, "group %s: waiting for %s", g->name,
                           g->step_active ? "rank 0's StepDone" : "rank 0's id");
    if (rc == DFLASH_ESTATE)
        return reply_error(b, r, m->request_id, rc, "group %s: the next step is %llu, not %llu "
                           "(micro-step %u of %u)", g->name,
                           (unsigned long long)(g->step_active ? g->step : g->base_step + 1),
                           (unsigned long long)c->step, c->micro, group_accumulate(g));
    if (!rc && !mine) { /* reserve the micro-step: one slot per rank, all or nothing */
        rc = reserve_micro(b, g, c, m->request_id, r);
        if (rc == 0) {
            rc = group_micro_check(g, p->incarnation, c->epoch, c->step, c->micro, &mine);
            assert(rc == 0 && mine);
        } else if (rc != DFLASH_ESHUTDOWN || c->micro == 0) {
            return; /* r holds the answer */
        }
    }
    if (rc == DFLASH_ESHUTDOWN)
        return reply_error(b, r, m->request_id, rc, "group %s: step %llu ends with its %u "
                           "micro-steps of %u (no more batches for it): close it with them",
                           g->name, (unsigned long long)g->step, g->step_end,
                           g->step_accumulate);
    if (rc) return reply_error(b, r, m->request_id, rc, "step claim refused");
    /* A rank that claims late (or again) after the step's pool was dropped or re-registered by
     * its target would get a grant mixing the two arenas: the reservation's incarnation and
     * lease, the new arena's shm name and handles (it copied unrelated bytes and exited). Stale
     * instead: the rank re-forms, the step's resolver aborts it (its units back to to-do), and
     * the next step is reserved in the pool as it is now. */
    const pool_desc *d = &b->pools[mine->pool_id];
    if (!d->registered)
        return reply_error(b, r, m->request_id, DFLASH_ESTALE,
                           "step %" PRIu64 " of group %s was reserved in pool %u of %s, which is "
                           "not registered now (its target went): re-form", g->step, g->name,
                           mine->pool_id, d->owner);
    if (d->desc.pool_incarnation != mine->pool_incarnation)
        return reply_error(b, r, m->request_id, DFLASH_ESTALE,
                           "step %" PRIu64 " of group %s was reserved in incarnation %016" PRIx64
                           " of pool %u, re-registered since by %s (incarnation %016" PRIx64 "): "
                           "re-form", g->step, g->name, mine->pool_incarnation, mine->pool_id,
                           d->owner, d->desc.pool_incarnation);
    reply_init(b, r, WIRE_STEP_GRANT, m->request_id);
    wire_step_grant *w = &r->u.sgrant;
    w->epoch = g->step_epoch;
    w->step = g->step;
    w->world = g->step_world;
    uint32_t at = (uint32_t)(mine - g->slots), first = at - at % g->step_world;
    w->rank = at % g->step_world;
    w->has_micro = true;
    w->micro = at / g->step_world;
    w->n_units = g->step_world;
    for (uint32_t k = 0; k < g->step_world; k++) w->units[k] = to_unit(&g->slots[first + k].batch);
    policy_grant pg = {.lease_id = mine->lease_id, .worker_id = mine->peer,
                       .deadline_ms = now_ms(b) + (uint64_t)b->cfg.lease_timeout_ms,
                       .where = {.pool_id = mine->pool_id, .incarnation = mine->pool_incarnation,
                                 .slot = mine->slot, .batch = mine->batch,
                                 .n_tokens = mine->n_tokens}};
    broker_fill_grant(b, &pg, &w->grant);
}

void broker_on_step_done(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_step *d = &m->u.gstep;
    group *g = group_find(b->groups, d->group);
    if (!g) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "no group %s", d->group);
    group_outcome o;
    int rc = group_step_done(b->groups, g, p->incarnation, d->epoch, d->step, &o);
    if (rc == DFLASH_EDENIED)
        return reply_error(b, r, m->request_id, rc, "only rank 0 reports a step done");
    if (rc)
        return reply_error(b, r, m->request_id, rc, "step %llu of epoch %llu was aborted or is "
                           "unknown: re-form", (unsigned long long)d->step,
                           (unsigned long long)d->epoch);
    uint32_t n = apply_outcome(b, g->name, &o);
    if (o.new_epoch) log_epoch(g);
    reply_ok(b, r, m->request_id, n);
}

void broker_on_group_leave(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    group *g = group_of_peer(b->groups, p->incarnation);
    if (!g || strcmp(g->name, m->u.gstep.group) != 0)
        return reply_ok(b, r, m->request_id, 0);
    broker_groups_peer_gone(b, p);
    reply_ok(b, r, m->request_id, 1);
}
