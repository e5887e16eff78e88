/* broker: see broker.h for the model. This file: the peer and pool tables, message dispatch (one
 * handler per request type), the socket plumbing (ROUTER + PUB through zloop) and the cron timer.
 * Its parts: broker_state.h (the state and the helpers they share), broker_config.c (the options
 * table and its checks), broker_groups.c (the group requests), broker_steering.c (set, pause,
 * resume, drain: applied, journaled, restored; dflash-ctl release of quarantined batches),
 * broker_trainers.c (one broker, one model: run ids,
 * trainer admission, ResumeFrom), broker_leave.c (a target's leave: its pool given
 * up at once, its session ended once no slot of it is being copied), broker_stop.c (the graceful
 * stop: no new leases, the acks and checkpoint reports in progress waited for, bounded),
 * broker_security.c (CURVE, ZAP, binding).
 *
 * Peer table: a small array searched linearly by routing id (a node has a handful of peers),
 * at most cfg.max_peers entries (peer_table_full: a hello past it is answered AGAIN). Each entry
 * is bound to the CURVE key of its hello (broker_security.c, "Key binding"): a request on it
 * with another key is refused DENIED before anything else, and so is a hello that would replace
 * a peer of another key by name or run.
 * A hello from a new incarnation of a live peer's role+name replaces that peer (a restart); the
 * new entry remembers the incarnations it replaced (PEER_REPLACED, inherited from the one it
 * replaced), and a hello from one of those is refused EXISTS: it is a second live process with
 * the name (defect: two of them replaced each other on every request, for ever).
 * One broker, one model (broker_trainers.c): a trainer's run id, its predecessor replaced, a
 * trainer of another model refused; a replaced predecessor's hello refused EXISTS
 * (refuse_replaced), a solo trainer's later hello taken as its resume admitted again. A held
 * hello keeps its peer entry (PEER_NEW) so the wait is timed.
 * Pool table: indexed by pool id, one per target name, kept across target incarnations so the
 * policy sees a restart as "same pool, new incarnation"; an entry no live target holds is given
 * to a new name when all MAX_POOLS are taken. A pool stops being registered in one place,
 * broker_pool_give_up: its target expired, was replaced or left, or a drain gave up its ready
 * slots nobody took.
 *
 * Batch plan: every pool of every target must carry the ledger's plan, since any target may be
 * handed any batch. A registration is refused (Error MISMATCH, nothing changed) when its batches
 * per bucket or its plan identity (batch_plan_identity: seed, buckets, data) are not the
 * journal's; a target that sends no identity (older) is accepted with a warning, and a journal
 * whose plan has no identity (older) adopts the first one sent (check_plan).
 *
 * Policy: created at the first pool registration, because the bucket count comes from the
 * target; settings made before then are kept in cfg and applied at creation.
 *
 * Runtime steering (steering.h, broker_steering.c): every set, pause, resume and drain journals
 * the mode and the live values that differ from `configured` (cfg as the flags, env and file
 * gave it) as the ledger's settings record, and is answered like a commit: once that record is
 * durable, Error IO when it could not be (the change is in force anyway). broker_new restores
 * the record after the replay (broker_restore_steering): a value whose configuration is
 * unchanged since it was set comes back, a changed configuration wins (all configured values
 * win when the restored ones do not fit together, live_check), the mode comes back as it was. A
 * restored drain keeps today's semantics: pending_mode is DRAINING before any pool registers,
 * so claims end at once (broker_drained) and a target that registers gets SHUTDOWN. A
 * deliberate stop (broker_shutdown, SIGTERM: at the end of broker_stop_gracefully) journals the
 * end of a drain, so only a crash leaves one for the next start.
 *
 * Restart fence (defect: a re-registering target's slots were all taken as FREE, so a slot a
 * drafter was still copying under the old broker's lease could be handed out for refilling):
 * PoolRegister carries busy_slots, the slots the target published and was not handed back in a
 * work unit since. When the registration creates the pool in the policy (a new broker, or a pool
 * this broker had dropped), each busy slot is fenced until now + lease_timeout_ms: no work unit
 * names it and no SLOT_READY is accepted for it until the cron tick lifts the fence. Why that is
 * enough: every lease this broker cannot see on that slot was granted before this registration,
 * and a copy ends within a lease timeout of its grant (policy.h, "Restart fence"). A
 * re-registration of a pool the policy already has (same incarnation) ignores the list: the
 * broker's own slot states are authoritative. Old targets send no list: nothing is fenced.
 *
 * Journal and replies (defect: commit/rewind fsyncs and every journal write ran on this loop):
 * with sockets, the ledger's journal runs in writer mode (journal.h): handlers only queue
 * records. Each reply gets a ticket: the journal's last queued record number if its request
 * queued a record (the FIFO writer makes every earlier record durable first), else the ticket of
 * the same peer's previous reply (so e.g. a retried Ack answered EXISTS cannot overtake the
 * first Ack's record). A reply whose ticket is above the durable number is *deferred* (copied
 * into a list) and sent by on_journal_done once the writer reports it durable; a peer's replies
 * keep their order (its tickets never decrease), and other peers' claims, releases and
 * heartbeats are answered during an fsync. A reply thus never reports state less durable than
 * before the change (records written before the reply; COMMIT/REWIND/PLAN/SETTINGS fdatasynced).
 * The list is capped (deferred_make_room): BROKER_DEFERRED_PER_PEER per routing id, the oldest
 * dropped (a client has one request out; older ones it gave up on), max_peers times that in all.
 * JournalSync (a drafter's durability barrier before a checkpoint) queues a sync of every
 * record so far (ledger_barrier) and is answered like a commit. If the record of a
 * CheckpointCommitted, ResumeFrom, JournalSync or steering verb could not be written or
 * synced, its reply is Error IO, unless a healing rewrite made it durable before the failure was
 * reported (journal_watch: the reply is then the handler's). A journal that failed is rewritten
 * from memory every journal_retry_ms until that succeeds (journal_watch).
 * Without sockets (broker_dispatch from tests and the fuzz harness) the journal stays inline.
 *
 * Groups (broker_groups.c; group.h holds the state machine): the handlers turn GroupJoin,
 * GroupSetId, StepClaim, StepDone and GroupLeave into group.c calls and carry out the outcome
 * (apply_outcome): ledger acks of a step's units once for the group, or requeue/revoke on an
 * abort. A step's reservation is all or nothing (policy_claimable first). A dead drafter's copied
 * units of a step in flight, or orphaned (group.h), stay in flight until the step is resolved
 * (peer_remove skips them). Orphaned steps are journaled and restored at start-up, before the
 * orphan grace could give their units back to to-do (broker_groups_restore).
 * A rank's StepClaim whose reservation names a pool incarnation that is no longer registered is
 * answered Stale (broker_on_step_claim): its grant would describe the new arena.
 */
#include "broker_state.h"

#include "err.h"
#include "log.h"

#include <assert.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
/* --- peers ---------------------------------------------------------------------------------- */

static void peer_set_state(peer *p, peer_state to)
{
    /* NEW -> LIVE (hello), LIVE -> LIVE (re-hello), NEW|LIVE -> GONE */
    assert((p->state == PEER_NEW && to == PEER_LIVE) || (p->state == PEER_LIVE && to == PEER_LIVE) ||
           (p->state != PEER_GONE && to == PEER_GONE));
    p->state = to;
}

static peer *peer_find(broker *b, const uint8_t *rid, size_t len)
{
    for (uint32_t i = 0; i < b->n_peers; i++)
        if (b->peers[i]->rid_len == len && memcmp(b->peers[i]->rid, rid, len) == 0)
            return b->peers[i];
    return NULL;
}

/* True when a hello m from a new routing id finds the table at cfg.max_peers entries (live
 * peers and held hellos; defect: no cap, so a flood of hellos from new routing ids grew it
 * without bound): r gets Error AGAIN saying so (the target and drafter retry it, saying the
 * broker's reason), counted (status: hellos_refused_full) and warned about once per
 * BROKER_WARN_EVERY_MS. At the cap, a hello naming the role and name of an entry is let through:
 * it replaces that one (a restart), or is refused; one that does neither (a drafter of another
 * run under a trainer's name: on_hello) stays, one over the cap, and then no hello is let
 * through. */
static bool peer_table_full(broker *b, const wire_msg *m, wire_msg *r)
{
    uint64_t max = (uint64_t)b->cfg.max_peers;
    if (b->n_peers < max) return false;
    for (uint32_t i = 0; i < b->n_peers && b->n_peers == max; i++)
        if (b->peers[i]->role == m->role && strcmp(b->peers[i]->name, m->u.hello.name) == 0)
            return false;
    uint64_t since;
    if (warn_limit_due(&b->peers_full, now_ms(b), &since))
        LOG_WARN("hello from %s %s refused: the peer table is full (%u targets and drafters, "
                 "--max-peers %lld; %" PRIu64 " hellos refused since the last report, %" PRIu64
                 " in all): more peers than --max-peers (raise it), or a flood of hellos from "
                 "new routing ids (each entry lasts until it is expired)",
                 wire_role_name(m->role), m->u.hello.name, b->n_peers,
                 (long long)b->cfg.max_peers, since, b->peers_full.count);
    reply_error(b, r, m->request_id, DFLASH_EAGAIN, "the broker's peer table is full (%u targets "
                "and drafters, --max-peers %lld): try again once one leaves or is expired, or "
                "raise the broker's --max-peers", b->n_peers, (long long)b->cfg.max_peers);
    return true;
}

/* A new entry for routing id rid, bound to the key of the request being dispatched (its hello's
 * User-Id: broker_key_differs). */
static peer *peer_add(broker *b, const uint8_t *rid, size_t len)
{
    if (b->n_peers == b->cap_peers) {
        uint32_t cap = b->cap_peers ? b->cap_peers * 2 : 16;
        peer **np = realloc(b->peers, cap * sizeof *np);
        if (!np) return NULL;
        b->peers = np;
        b->cap_peers = cap;
    }
    peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    memcpy(p->rid, rid, len);
    p->rid_len = len;
    snprintf(p->key, sizeof p->key, "%s", b->dispatch_user);
    p->pool_id = -1;
    b->peers[b->n_peers++] = p;
    return p;
}

static int held_add(peer *p, const batch_id *id)
{
    if (p->n_held == p->cap_held) {
        uint32_t cap = p->cap_held ? p->cap_held * 2 : 8;
        batch_id *nh = realloc(p->held, cap * sizeof *nh);
        if (!nh) return DFLASH_ENOMEM;
        p->held = nh;
        p->cap_held = cap;
    }
    p->held[p->n_held++] = *id;
    return 0;
}

static bool held_remove(peer *p, const batch_id *id)
{
    for (uint32_t i = 0; i < p->n_held; i++)
        if (same_batch(&p->held[i], id)) {
            p->held[i] = p->held[--p->n_held];
            return true;
        }
    return false;
}

void broker_held_remove_all(broker *b, const batch_id *id)
{
    for (uint32_t i = 0; i < b->n_peers; i++) held_remove(b->peers[i], id);
}

void broker_granted(broker *b, const policy_grant *g)
{
    /* The policy's count is its slot's (expiries there); the ledger's follows the batch into
     * every slot it is produced in again (its drafter died holding it, a slot given back
     * unread, a rewind, a release from quarantine). */
    bool again = ledger_note_delivery(b->ledger, &g->where.batch) || g->deliveries > 1;
    if (!again) return;
    b->redeliveries++;
    /* Safety net: a redelivered batch is no longer held by whoever had it before. (A batch
     * enters a held list only at release, which ends its lease, so a first delivery is in no
     * held list; skipping the scan keeps a grant O(1) in the number of held batches.) */
    broker_held_remove_all(b, &g->where.batch);
}

/* A delivery of in-flight batch id ended untrained (a lease expired, a drafter left holding it):
 * counted in the ledger, so re-producing the batch into a fresh slot or restarting the broker
 * does not reset it. Past max_redeliveries the batch is quarantined (a batch that makes every
 * drafter fail must not stop training forever); otherwise, with requeue, it goes back to to-do.
 * Returns true when quarantined. */
static bool batch_failed(broker *b, const batch_id *id, bool requeue)
{
    int n = ledger_fail(b->ledger, id);
    if (n > 0 && (int64_t)n > b->cfg.max_redeliveries) {
        LOG_WARN("batch %u/%u/%u quarantined: %d of its deliveries ended untrained "
                 "(max-redeliveries %" PRId64 ")", id->epoch, id->bucket, id->index, n,
                 b->cfg.max_redeliveries);
        if (requeue) ledger_quarantine(b->ledger, id);
        return true;
    }
    if (requeue) ledger_requeue(b->ledger, id);
    return false;
}

/* A drafter other than p that holds batch id (copied, not acked: it is training it), or NULL. */
static const peer *other_holder(const broker *b, const peer *p, const batch_id *id)
{
    for (uint32_t i = 0; i < b->n_peers; i++) {
        const peer *q = b->peers[i];
        if (q == p) continue;
        for (uint32_t k = 0; k < q->n_held; k++)
            if (same_batch(&q->held[k], id)) return q;
    }
    return NULL;
}

/* Whether batch id, held by drafter p, has another live delivery: a slot or lease holds it, or
 * another drafter copied it. So it is when p was expired holding it, it went back to to-do and
 * was handed out again, and p said hello holding it (adopt_held keeps it in p's held batches
 * for p's late ack). */
static bool delivered_elsewhere(const broker *b, const peer *p, const batch_id *id)
{
    return (b->policy && policy_holds_batch(b->policy, id)) || other_holder(b, p, id) != NULL;
}

/* Ends a peer's session: drafter leases end and its held batches return to to-do, except those
 * another delivery holds (defect: they went to to-do too, so the batch was produced and trained
 * once more, and the delivery it still had was counted as failed); a target's pool is dropped.
 * Frees the entry (index i). */
static void peer_remove(broker *b, uint32_t i, const char *why)
{
    peer *p = b->peers[i];
    LOG_INFO("peer %s (%s, incarnation %016" PRIx64 ") %s", p->name, wire_role_name(p->role),
             p->incarnation, why);
    if (p->role == WIRE_ROLE_DRAFTER) {
        broker_groups_peer_gone(b, p);
        if (b->policy) policy_drop_worker(b->policy, p->incarnation);
        for (uint32_t k = 0; k < p->n_held; k++) {
            const batch_id *id = &p->held[k];
            if (group_owns_batch(b->groups, id)) continue;
            if (delivered_elsewhere(b, p, id)) {
                LOG_INFO("%s held batch %u/%u/%u, which is handed out again: it stays with that "
                         "delivery", p->name, id->epoch, id->bucket, id->index);
                continue;
            }
            batch_failed(b, id, true);
        }
    } else if (p->role == WIRE_ROLE_TARGET && p->pool_id >= 0) {
        broker_pool_give_up(b, (uint32_t)p->pool_id);
    }
    peer_set_state(p, PEER_GONE);
    free(p->held);
    free(p);
    b->peers[i] = b->peers[--b->n_peers];
}

/* Ends p's session as peer_remove does, when p is still in the table (a target's leave). */
static void peer_end(broker *b, peer *p, const char *why)
{
    for (uint32_t i = 0; i < b->n_peers; i++)
        if (b->peers[i] == p) return peer_remove(b, i, why);
}

/* --- pools ---------------------------------------------------------------------------------- */

broker_slot_counts broker_pool_slots(const broker *b, uint32_t id)
{
    broker_slot_counts c = {0};
    for (uint32_t s = 0; b->policy && s < b->pools[id].desc.slot_count; s++) {
        slot_state st;
        if (policy_slot_get(b->policy, id, s, &st, NULL)) continue;
        c.filling += st == SLOT_FILLING;
        c.ready += st == SLOT_READY;
        c.leased += st == SLOT_LEASED;
    }
    return c;
}

void broker_pool_give_up(broker *b, uint32_t id)
{
    if (b->policy) (void)policy_pool_drop(b->policy, id); /* ENOTFOUND: dropped before */
    b->pools[id].registered = false;
}

/* --- policy glue ---------------------------------------------------------------------------- */

static void sink_requeue(void *ctx, const batch_id *id)
{
    broker *b = ctx;
    int rc = ledger_requeue(b->ledger, id);
    if (rc && rc != DFLASH_ESTATE)
        LOG_WARN("requeue %u/%u/%u: %s", id->epoch, id->bucket, id->index, err_str(rc));
}

static void sink_quarantine(void *ctx, const batch_id *id, uint32_t pool_id, uint64_t inc,
                            uint32_t slot)
{
    broker *b = ctx;
    (void)inc;
    /* count_failure said why, with the batch's count of failed deliveries: here only where */
    LOG_DEBUG("batch %u/%u/%u quarantined: its slot %u of pool %u is free again", id->epoch,
              id->bucket, id->index, slot, pool_id);
    ledger_quarantine(b->ledger, id);
}

static bool sink_failed(void *ctx, const batch_id *id)
{
    return batch_failed(ctx, id, false);
}

static int policy_create(broker *b, uint32_t n_buckets, const uint32_t *upper, const double *share)
{
    policy_params pp;
    policy_params_default(&pp);
    pp.n_buckets = n_buckets;
    for (uint32_t i = 0; i < n_buckets; i++) pp.bucket_max_len[i] = upper[i];
    pp.min_ready = (uint32_t)b->cfg.min_ready;
    pp.max_depth = (uint32_t)b->cfg.max_depth;
    pp.lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
    pp.max_redeliveries = (uint32_t)b->cfg.max_redeliveries;
    pp.mix_window = (uint32_t)b->cfg.mix_window;
    pp.first_lease_id = (b->incarnation & 0xffffff0000000000ull) | 1;
    policy_sink sink = {b, sink_requeue, sink_quarantine, sink_failed};
    b->policy = policy_new(&pp, &sink);
    if (!b->policy) return DFLASH_EINVAL;
    b->n_buckets = n_buckets;
    double sh[WIRE_MAX_BUCKETS];
    if (b->cfg.shares[0] && (broker_parse_shares(b->cfg.shares, n_buckets, sh) ||
                             policy_set_shares(b->policy, n_buckets, sh))) {
        /* Known only now: drop it, so the config and later sets show and check what is used. */
        LOG_WARN("shares '%s' do not fit the target's %u buckets (one finite non-negative "
                 "number each, not all 0): using the target's shares", b->cfg.shares, n_buckets);
        /* the configured ones too: dropped, they are no runtime change to journal */
        if (strcmp(b->configured.shares, b->cfg.shares) == 0) b->configured.shares[0] = '\0';
        b->cfg.shares[0] = '\0';
    }
    memcpy(b->target_share, share, n_buckets * sizeof *share);
    if (!b->cfg.shares[0]) policy_set_shares(b->policy, n_buckets, share);
    policy_set_mode(b->policy, b->pending_mode);
    return 0;
}

/* --- announcements -------------------------------------------------------------------------- */

/* m on the PUB socket under topic (none without a PUB socket; a full pipe drops it). */
void broker_publish(broker *b, const char *topic, const wire_msg *m)
{
    if (!b->pub) return;
    int n = wire_pack(m, b->outbuf, WIRE_MAX_MSG);
    if (n <= 0) return;
    if (zmq_send(b->pub, topic, strlen(topic), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return;
    zmq_send(b->pub, b->outbuf, (size_t)n, ZMQ_DONTWAIT);
}

/* --- handlers: each fills *r ---------------------------------------------------------------- */

static bool peer_replaced(const peer *o, uint64_t incarnation)
{
    uint32_t n = o->n_replaced < PEER_REPLACED ? o->n_replaced : PEER_REPLACED;
    for (uint32_t k = 0; k < n; k++)
        if (o->replaced[k] == incarnation) return true;
    return false;
}

static void peer_note_replaced(peer *p, uint64_t incarnation)
{
    if (!peer_replaced(p, incarnation)) p->replaced[p->n_replaced++ % PEER_REPLACED] = incarnation;
}

void broker_peer_take_over(broker *b, peer *p, uint32_t i, const char *why)
{
    const peer *o = b->peers[i];
    for (uint32_t k = 0; k < o->n_replaced && k < PEER_REPLACED; k++)
        peer_note_replaced(p, o->replaced[k]);
    peer_note_replaced(p, o->incarnation);
    peer_remove(b, i, why);
}

/* A drafter re-registering after a broker restart: the batches it trains are not orphans. The
 * ledger adopts one unit at a time and each may open the epoch after the last one opened, so
 * the bound is taken once for the whole hello (defect: units of epochs 0..255 opened 256 epochs
 * in one message): a unit past the next epoch the ledger would open is ignored, counted and
 * logged. The ledger refuses epochs past the target's plan itself (ledger_set_max_epochs). */
static void adopt_held(broker *b, peer *p, const wire_hello *h)
{
    ledger_stats ls;
    ledger_get_stats(b->ledger, &ls);
    uint32_t far = 0, first_far = 0;
    for (uint32_t i = 0; i < h->n_held; i++) {
        batch_id id = to_batch(&h->held[i]);
        if (id.epoch > ls.epochs_opened) {
            if (!far++) first_far = id.epoch;
            continue;
        }
        int rc = ledger_adopt(b->ledger, &id);
        if (rc == 0 || rc == DFLASH_EEXISTS) {
            bool known = false;
            for (uint32_t k = 0; k < p->n_held; k++) known |= same_batch(&p->held[k], &id);
            if (!known) held_add(p, &id);
        }
    }
    if (far)
        LOG_WARN("hello from %s %s: %u held units ignored (the first of epoch %u): past epoch %u, "
                 "the next one the ledger would open", wire_role_name(p->role), p->name, far,
                 first_far, ls.epochs_opened);
}

/* An incarnation that a live peer replaced and that still says hello is a second live process
 * (duplicates replaced each other for ever): refused EXISTS, the newer one keeps its place. It
 * was replaced by name (a new incarnation of the same role+name) or as its run's predecessor (a
 * restart of the same run, broker_take_over_run: two live processes share one run id). A hello
 * naming the replacement's run is answered naming that run, even when the name is the same too:
 * the drafter reads it as "a live process of my run may write my checkpoint dir" and writes no
 * final checkpoint there (services/drafter/worker_session.c). */
static bool refuse_replaced(broker *b, const peer *p, const wire_msg *m, wire_msg *r)
{
    const peer *o = NULL;
    for (uint32_t i = 0; i < b->n_peers && !o; i++)
        if (b->peers[i] != p && b->peers[i]->state == PEER_LIVE &&
            b->peers[i]->role == m->role && peer_replaced(b->peers[i], m->incarnation))
            o = b->peers[i];
    if (!o) return false;
    const char *role = wire_role_name(m->role);
    LOG_WARN("hello from %s %s (incarnation %016" PRIx64 ") refused: %s %s (incarnation %016"
             PRIx64 ") replaced it", role, m->u.hello.name, m->incarnation, role, o->name,
             o->incarnation);
    bool same_run = m->u.hello.run_id && o->run_id == m->u.hello.run_id;
    if (strcmp(o->name, m->u.hello.name) == 0 && !same_run)
        reply_error(b, r, m->request_id, DFLASH_EEXISTS,
                    "the %s name '%s' is in use by another live process (incarnation %016" PRIx64
                    "): give each %s its own --name", role, m->u.hello.name, o->incarnation,
                    role);
    else {
        reply_error(b, r, m->request_id, DFLASH_EEXISTS,
                    "drafter %s replaced this process as a restart of its run %016" PRIx64 ": "
                    "two live processes have that run id (a copied checkpoint dir, or one "
                    "shared by two hosts): give each its own --checkpoint-dir", o->name,
                    o->run_id);
        r->u.error.replaced_by_run = o->run_id;
    }
    return true;
}

/* Whether the hello m, from a new incarnation with o's role and name, takes o's session over
 * now. Not when o is a live solo trainer of a run and m does not name that run: m may be a
 * restart of o's run (its resume, naming the run, then replaces o: broker_take_over_run)
 * or a drafter of another run given the same --name, whose resume must meet o as another model's
 * trainer (broker_trainer_admitted) instead of ending o's session and rewinding o's committed
 * batches (defect: a second run started with a live trainer's --name took its place, rewound its
 * work, and the first run could never resume). */
static bool takes_over_by_name(const peer *o, const wire_msg *m)
{
    if (m->role != WIRE_ROLE_DRAFTER || !o->trains || !o->run_id || o->state != PEER_LIVE)
        return true;
    return m->u.hello.run_id == o->run_id;
}

/* False when the hello is refused (r holds the error). The caller forgets p, except when it
 * is held (Error AGAIN, p stays PEER_NEW so that its wait is timed: trainer_admitted). */
static bool on_hello(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    /* A live peer's role is its session's (defect: a hello of another role on its connection
     * changed it, so a target's pool was never given up when that peer went) */
    if (p->state == PEER_LIVE && p->role != m->role) {
        b->malformed++;
        LOG_WARN("%s %s said hello as a %s on its connection: refused", wire_role_name(p->role),
                 p->name, wire_role_name(m->role));
        reply_error(b, r, m->request_id, DFLASH_EDENIED,
                    "this connection is a %s's: a %s connects on its own",
                    wire_role_name(p->role), wire_role_name(m->role));
        return false;
    }
    if (refuse_replaced(b, p, m, r)) return false;
    /* A new incarnation of the same role+name replaces the old session (a restart), from the key
     * that one registered with only (broker_security.c, "Key binding"). */
    for (uint32_t i = 0; i < b->n_peers; i++) {
        peer *o = b->peers[i];
        if (o != p && o->role == m->role && strcmp(o->name, m->u.hello.name) == 0 &&
            o->incarnation != m->incarnation) {
            if (broker_key_differs(o, p->key)) {
                char why[WIRE_MAX_TEXT];
                snprintf(why, sizeof why,
                         "the %s name '%s' is held by a live %s registered with another CURVE "
                         "key: it is free once that one leaves or is expired (%lld ms without a "
                         "heartbeat); a restart of it must use the key it registered with",
                         wire_role_name(m->role), m->u.hello.name, wire_role_name(m->role),
                         (long long)(b->cfg.heartbeat_ms * b->cfg.liveness));
                broker_key_refuse(b, m, o, why, r);
                return false;
            }
            if (takes_over_by_name(o, m))
                broker_peer_take_over(b, p, i, "replaced by a new incarnation");
            else
                LOG_INFO("hello from drafter %s (incarnation %016" PRIx64 "): the name of a "
                         "live trainer of run %016" PRIx64 ", which it replaces only if its "
                         "resume names that run", m->u.hello.name, m->incarnation, o->run_id);
            break;
        }
    }
    snprintf(p->name, sizeof p->name, "%s", m->u.hello.name);
    /* A solo trainer registering again (the broker restarted, or expired it): a trainer of its
     * run again, without a rewind, as its resume would be admitted now (one broker, one model);
     * refused DENIED (the drafter exits 6) when another model's trainer came in meanwhile. */
    uint64_t run_id = m->role == WIRE_ROLE_DRAFTER ? m->u.hello.run_id : 0;
    if (run_id) {
        if (!broker_take_over_run(b, p, m, run_id, r)) return false;
        if (!broker_trainer_admitted(b, p, broker_other_model_trainer(b, p, run_id, NULL),
                                     m->request_id, DFLASH_EDENIED, r))
            return false;
        p->trains = true;
        p->run_id = run_id;
    }
    p->role = m->role;
    p->incarnation = m->incarnation;
    peer_set_state(p, PEER_LIVE);
    adopt_held(b, p, &m->u.hello);
    LOG_INFO("hello from %s %s (incarnation %016" PRIx64 ", %u held)", wire_role_name(p->role),
             p->name, p->incarnation, m->u.hello.n_held);
    reply_init(b, r, WIRE_HELLO, m->request_id);
    snprintf(r->u.hello.name, sizeof r->u.hello.name, "dflash-queue");
    r->u.hello.heartbeat_ms = (uint32_t)b->cfg.heartbeat_ms;
    r->u.hello.lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
    snprintf(r->u.hello.pub_endpoint, sizeof r->u.hello.pub_endpoint, "%s", b->cfg.pub_endpoint);
    r->u.hello.stats_interval_ms = (uint32_t)b->cfg.stats_interval_ms;
    return true;
}

/* True while pool i is registered or a live target holds it. */
static bool pool_held(const broker *b, int i)
{
    if (b->pools[i].registered) return true;
    for (uint32_t k = 0; k < b->n_peers; k++)
        if (b->peers[k]->pool_id == i) return true;
    return false;
}

/* The pool id of target `owner`: its own, else an unused one, else one that no live target
 * holds (its pool was dropped when its target went; defect: the table kept every name it had
 * seen, so after 64 names no target could register). -1 when all are held. */
static int pool_slot_for(broker *b, const char *owner)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (b->pools[i].owner[0] && strcmp(b->pools[i].owner, owner) == 0) return i;
    int reuse = -1;
    for (int i = 0; i < MAX_POOLS && reuse < 0; i++)
        if (!b->pools[i].owner[0]) reuse = i;
    for (int i = 0; i < MAX_POOLS && reuse < 0; i++)
        if (!pool_held(b, i)) reuse = i;
    if (reuse >= 0) snprintf(b->pools[reuse].owner, sizeof b->pools[reuse].owner, "%s", owner);
    return reuse;
}

/* Warns when the targets' slots cannot hold min_ready ready ones: claims then wait until more
 * slots register (another target, or a lower min_ready by `set`). */
void broker_warn_reservoir(const broker *b)
{
    uint64_t slots = 0;
    for (int i = 0; i < MAX_POOLS; i++)
        if (b->pools[i].registered) slots += b->pools[i].desc.slot_count;
    if (slots && (uint64_t)b->cfg.min_ready > slots)
        LOG_WARN("min-ready %lld is more than the %" PRIu64 " slots the targets registered: no "
                 "claim is served until more slots register or min_ready is lowered",
                 (long long)b->cfg.min_ready, slots);
}

/* The target's batch plan against the ledger's: its counts (ledger_set_plan) and its identity
 * (ledger_set_plan_id; a journal without one adopts the target's). 0, DFLASH_EMISMATCH (the
 * counts or the identity differ: another seed or dataset) or another ledger code. */
static int check_plan(broker *b, const peer *p, const wire_pool *w, const uint32_t *batches)
{
    uint64_t known;
    bool had_id = ledger_plan_id(b->ledger, &known);
    if (w->has_plan_id && had_id && known != w->plan_id) return DFLASH_EMISMATCH;
    bool had_plan = ledger_has_plan(b->ledger);
    int rc = ledger_set_plan(b->ledger, w->n_buckets, batches);
    if (rc) return rc;
    if (!w->has_plan_id) {
        LOG_WARN("pool of %s: the target sends no plan identity (a dflash-target older than the "
                 "broker): that its seed and data are the run's cannot be checked", p->name);
        return 0;
    }
    if ((rc = ledger_set_plan_id(b->ledger, w->plan_id))) return rc;
    if (had_plan && !had_id)
        LOG_INFO("pool of %s: batch plan %016" PRIx64 " adopted as the journal's (its plan had "
                 "no identity)", p->name, w->plan_id);
    return 0;
}

/* The Error for a plan check_plan refused, logged too (a peer's bad input: warn, reject). */
static void reply_plan_refusal(broker *b, wire_msg *r, uint64_t rid, const peer *p,
                               const wire_pool *w, int rc)
{
    uint64_t known;
    if (rc == DFLASH_EMISMATCH && w->has_plan_id && ledger_plan_id(b->ledger, &known) &&
        known != w->plan_id) {
        LOG_WARN("pool of %s refused: its batch plan %016" PRIx64 " is not the journal's %016" PRIx64,
                 p->name, w->plan_id, known);
        return reply_error(b, r, rid, rc,
                           "batch plan %016" PRIx64 " differs from the journal's %016" PRIx64
                           " (another --seed, --shards, --buckets, --token-budget or "
                           "--max-seqs): restart the target with the run's, or start a new run "
                           "on a new --journal",
                           w->plan_id, known);
    }
    if (rc != DFLASH_EMISMATCH) {
        LOG_WARN("pool of %s refused: batch plan: %s", p->name, err_str(rc));
        return reply_error(b, r, rid, rc, "batch plan refused: %s", err_str(rc));
    }
    LOG_WARN("pool of %s refused: its batches per bucket are not the journal's", p->name);
    reply_error(b, r, rid, rc,
                "batch plan differs from the journal's (another dataset?): restart the target "
                "with the run's --shards and --buckets, or start a new run on a new --journal");
}

/* Warns when pool id of target p registers slots of another size than its previous
 * registration or another registered pool: a target restarted on another model or slot
 * options (defect: taken silently, while every drafter refused its slots). The drafters read
 * one layout: those of the old one give the slots back unread and exit 2. */
static void warn_layout_change(const broker *b, const peer *p, int id, const wire_pool *w)
{
    const pool_desc *d = &b->pools[id];
    char whose[WIRE_MAX_NAME + 32] = "";
    uint64_t was = 0;
    if (d->desc.slot_size && d->desc.slot_size != w->slot_size) {
        snprintf(whose, sizeof whose, "its previous pool's");
        was = d->desc.slot_size;
    }
    for (int k = 0; k < MAX_POOLS && !whose[0]; k++)
        if (k != id && b->pools[k].registered && b->pools[k].desc.slot_size != w->slot_size) {
            snprintf(whose, sizeof whose, "target %s's", b->pools[k].owner);
            was = b->pools[k].desc.slot_size;
        }
    if (whose[0])
        LOG_WARN("pool %d of %s: slots of %" PRIu64 " bytes, but %s were of %" PRIu64 ": "
                 "another model or slot options (--model, --layers, --capture-layers, "
                 "--token-budget, --max-seqs) than the run's; drafters of the other layout give "
                 "its slots back unread and exit 2", id, p->name, w->slot_size, whose, was);
}

static void on_pool_register(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_pool *w = &m->u.pool; /* a target's (role_of_request) */
    int id = pool_slot_for(b, p->name);
    if (id < 0) return reply_error(b, r, m->request_id, DFLASH_EFULL, "too many pools");
    uint32_t batches[WIRE_MAX_BUCKETS];
    for (uint32_t i = 0; i < w->n_buckets; i++) batches[i] = (uint32_t)w->bucket_batches[i];
    if (w->n_buckets > LEDGER_MAX_BUCKETS)
        return reply_error(b, r, m->request_id, DFLASH_ERANGE, "too many buckets");
    int rc = check_plan(b, p, w, batches);
    if (rc) return reply_plan_refusal(b, r, m->request_id, p, w, rc);
    if (!b->policy) {
        if ((rc = policy_create(b, w->n_buckets, w->bucket_upper, w->bucket_share)))
            return reply_error(b, r, m->request_id, rc, "bucket policy refused the buckets");
    } else if (w->n_buckets != b->n_buckets) {
        return reply_error(b, r, m->request_id, DFLASH_EMISMATCH, "%u buckets, broker has %u",
                           w->n_buckets, b->n_buckets);
    }
    pool_desc *d = &b->pools[id];
    rc = policy_pool_add(b->policy, (uint32_t)id, w->pool_incarnation, w->slot_count, w->slot_size);
    if (rc == DFLASH_EEXISTS) {
        p->pool_id = id;
        return reply_ok(b, r, m->request_id, (uint64_t)id);
    }
    if (rc) return reply_error(b, r, m->request_id, rc, "pool refused");
    uint64_t fence_until = now_ms(b) + (uint64_t)b->cfg.lease_timeout_ms;
    uint32_t fenced = 0;
    for (uint32_t s = 0; s < w->slot_count; s++)
        if (wire_pool_is_busy(w, s) &&
            policy_slot_fence(b->policy, (uint32_t)id, s, fence_until) == 0)
            fenced++;
    if (fenced)
        LOG_INFO("pool %d of %s: %u busy slots fenced for %lld ms (a drafter may still copy them)",
                 id, p->name, fenced, (long long)b->cfg.lease_timeout_ms);
    free(d->events);
    d->events = NULL;
    free(d->n_seqs);
    d->n_seqs = calloc(w->slot_count, sizeof *d->n_seqs);
    if (!d->n_seqs) {
        policy_pool_drop(b->policy, (uint32_t)id);
        return reply_error(b, r, m->request_id, DFLASH_ENOMEM, "no memory");
    }
    warn_layout_change(b, p, id, w);
    d->desc = *w;
    d->desc.event_handles = NULL;
    if (w->n_events) {
        d->events = malloc((size_t)w->n_events * WIRE_HANDLE_BYTES);
        if (!d->events) {
            policy_pool_drop(b->policy, (uint32_t)id);
            return reply_error(b, r, m->request_id, DFLASH_ENOMEM, "no memory");
        }
        memcpy(d->events, w->event_handles, (size_t)w->n_events * WIRE_HANDLE_BYTES);
        d->desc.event_handles = (const uint8_t(*)[WIRE_HANDLE_BYTES])d->events;
    }
    d->registered = true;
    d->last_grant_ms = d->drain_hold_ms = 0;
    p->pool_id = id;
    memcpy(b->target_share, w->bucket_share, w->n_buckets * sizeof *w->bucket_share);
    if (!b->cfg.shares[0]) policy_set_shares(b->policy, w->n_buckets, w->bucket_share);
    b->epochs = b->cfg.max_epochs ? (uint32_t)b->cfg.max_epochs : w->epochs;
    ledger_set_max_epochs(b->ledger, b->epochs); /* nothing past the plan is handed out */
    LOG_INFO("pool %d of %s: incarnation %016" PRIx64 ", %u slots of %" PRIu64 " bytes, %s", id,
             p->name, w->pool_incarnation, w->slot_count, w->slot_size,
             w->backend == WIRE_BACKEND_CUDA ? "cuda" : w->shm_name);
    broker_warn_reservoir(b);
    reply_ok(b, r, m->request_id, (uint64_t)id);
}

/* True while some target has its pool registered (the plan's epochs are its word). */
static bool pool_registered(const broker *b)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (b->pools[i].registered) return true;
    return false;
}

/* True when the target's plan is finished: every batch of every planned epoch trained,
 * committed or quarantined, none to do, in flight or orphaned, and a target that declared the
 * plan is registered. A claim then ends the drafter's run as a drain does (DFLASH_ESHUTDOWN, a
 * drafter with --exit-when-drained exits and saves); it is not a state of its own: a rewind (a
 * drafter resuming from an older checkpoint) puts batches back to do and claims are served
 * again. A plan is only as live as the target that declared it (defect: the epochs of a target
 * that had been stopped, or had expired, ended a drafter restarted to train the larger --epochs
 * of the target starting next, exit 0 before that one had registered): while no pool is
 * registered, claims wait for a target (on_claim), whose registration sets the plan again. A
 * target stays registered at the plan's end (its work requests wait), so the normal end of a
 * run is unchanged. */
bool broker_plan_done(broker *b)
{
    bool done = broker_plan_done_but(b, 0);
    if (!done) b->plan_done_said = false;
    return done;
}

uint64_t broker_plan_left_but(broker *b, uint64_t own)
{
    ledger_stats ls;
    if (!b->epochs || !pool_registered(b)) return UINT64_MAX;
    ledger_get_stats(b->ledger, &ls);
    /* ls.todo counts the planned epochs only (ledger_set_max_epochs) */
    if (ls.epochs_opened < b->epochs || ls.orphaned != 0 || ls.in_flight < own) return UINT64_MAX;
    return ls.todo + (ls.in_flight - own);
}

bool broker_plan_done_but(broker *b, uint64_t own)
{
    return broker_plan_left_but(b, own) == 0;
}

/* The answer to a claim once broker_plan_done: SHUTDOWN with the reason, said once in the log. */
void broker_reply_plan_done(broker *b, wire_msg *r, uint64_t rid)
{
    /* the epochs are the broker's --max-epochs when it caps the target's plan */
    const char *whose = b->cfg.max_epochs ? "the broker's --max-epochs" : "the target's planned";
    const char *more = b->cfg.max_epochs ? "a broker with a higher --max-epochs continues"
                                         : "a target with more --epochs continues";
    if (!b->plan_done_said)
        LOG_INFO("every batch of %s epochs (%u) is trained: claims now end the drafters' runs "
                 "(their checkpoints hold it all)", whose, b->epochs);
    b->plan_done_said = true;
    reply_error(b, r, rid, DFLASH_ESHUTDOWN,
                "every batch of %s epochs (%u) is trained: nothing left to claim (%s)", whose,
                b->epochs, more);
}

static pool_desc *peer_pool(broker *b, peer *p, uint64_t incarnation)
{
    if (p->role != WIRE_ROLE_TARGET || p->pool_id < 0 || !b->policy) return NULL;
    pool_desc *d = &b->pools[p->pool_id];
    if (!d->registered || d->desc.pool_incarnation != incarnation) return NULL;
    return d;
}

/* True while a drafter is live (one may still claim). */
static bool drafter_live(const broker *b)
{
    for (uint32_t i = 0; i < b->n_peers; i++)
        if (b->peers[i]->role == WIRE_ROLE_DRAFTER && b->peers[i]->state == PEER_LIVE)
            return true;
    return false;
}

/* A draining target's WorkRequest. Its ready slots live in its memory, so they can be trained
 * only while it keeps its pool (defect: told SHUTDOWN at once, it exited and removed the pool,
 * and the broker granted the pool's ready slots until it expired the target: the drafters
 * could not map them, warned, and gave them back unread, untrained). It is answered AGAIN while
 * a slot of its pool is leased (a drafter copies it; a lease ends within a lease timeout), or
 * ready while a drafter is live and took a slot of the pool within lease_timeout_ms (of the
 * last grant, or of the hold's start). Then SHUTDOWN; ready slots nobody took are given up
 * first: the pool is dropped (their batches back to to-do), so none is granted from memory
 * that is about to go. */
static void drain_hold(broker *b, peer *p, pool_desc *d, wire_msg *r, uint64_t rid)
{
    uint32_t id = (uint32_t)p->pool_id;
    broker_slot_counts slots = broker_pool_slots(b, id);
    uint32_t ready = slots.ready, leased = slots.leased;
    uint64_t now = now_ms(b), timeout = (uint64_t)b->cfg.lease_timeout_ms;
    bool first = !d->drain_hold_ms;
    if (first) d->drain_hold_ms = now;
    uint64_t since = d->last_grant_ms > d->drain_hold_ms ? d->last_grant_ms : d->drain_hold_ms;
    bool live = drafter_live(b);
    if (leased || (ready && live && now - since < timeout)) {
        if (first)
            LOG_INFO("draining: target %s keeps its pool until the drafters have its %u ready "
                     "and %u leased slots", p->name, ready, leased);
        return reply_error(b, r, rid, DFLASH_EAGAIN, "draining: %u ready and %u leased slots "
                           "of the pool left to the drafters", ready, leased);
    }
    if (ready) {
        LOG_WARN("draining: %u ready slots of %s's pool %s: their batches go back to to-do", ready,
                 p->name, live ? "not claimed within the lease timeout" : "and no drafter");
        broker_pool_give_up(b, id);
    } else if (!first) {
        LOG_INFO("draining: the drafters have every ready slot of %s's pool: it may go", p->name);
    }
    reply_error(b, r, rid, DFLASH_ESHUTDOWN, "draining");
}

static void on_work_request(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    pool_desc *d = peer_pool(b, p, m->u.pool_incarnation);
    if (!d) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "unknown pool: register it");
    /* the target fills one unit at a time: one still filling was lost (defect: its slot and
     * batch stayed so for ever, and the epoch never ended) */
    policy_pool_drop_filling(b->policy, (uint32_t)p->pool_id);
    policy_mode mode = policy_get_mode(b->policy);
    if (mode == POLICY_DRAINING) return drain_hold(b, p, d, r, m->request_id);
    d->drain_hold_ms = 0;
    if (mode == POLICY_PAUSED) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "paused");
    uint32_t mask = ledger_todo_mask(b->ledger); /* 0 past the plan's epochs too */
    policy_set_flush(b->policy, mask == 0);
    if (!mask) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "nothing to do now");
    uint32_t bucket, slot;
    int rc = policy_next_bucket(b->policy, (uint32_t)p->pool_id, mask, &bucket);
    if (rc == DFLASH_EFULL) return reply_error(b, r, m->request_id, rc, "max_depth reached");
    if (rc == DFLASH_ESTATE) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "not running");
    if (rc == DFLASH_ENOTFOUND) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "no work");
    if (rc) return reply_error(b, r, m->request_id, rc, "work request refused");
    batch_id id;
    if ((rc = ledger_next_todo(b->ledger, bucket, &id)))
        return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "no batch: %s", err_str(rc));
    if ((rc = policy_work_start(b->policy, (uint32_t)p->pool_id, &id, &slot))) {
        ledger_requeue(b->ledger, &id);
        return reply_error(b, r, m->request_id, rc, "no free slot");
    }
    reply_init(b, r, WIRE_WORK_UNIT, m->request_id);
    r->u.work.unit = to_unit(&id);
    r->u.work.slot = slot;
}

static void on_slot_ready(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_slot_ready *s = &m->u.ready;
    pool_desc *d = peer_pool(b, p, s->pool_incarnation);
    if (!d) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "unknown pool: register it");
    if (s->slot >= d->desc.slot_count || s->unit.bucket >= b->n_buckets)
        return reply_error(b, r, m->request_id, DFLASH_ERANGE, "slot or bucket out of range");
    batch_id id = to_batch(&s->unit);
    slot_state st;
    int rc = policy_slot_get(b->policy, (uint32_t)p->pool_id, s->slot, &st, NULL);
    if (rc == 0 && st == SLOT_FENCED) /* checked before adopting: the batch stays orphaned */
        return reply_error(b, r, m->request_id, DFLASH_ESTATE, "slot %u is fenced after a "
                           "broker restart: drop it", s->slot);
    bool adopted = false;
    if (!policy_is_filling(b->policy, (uint32_t)p->pool_id, &id)) {
        /* Filled for a previous broker incarnation: adopt it if nobody else has it. */
        if ((rc = ledger_adopt(b->ledger, &id)))
            return reply_error(b, r, m->request_id, rc, "batch not adoptable: drop the slot");
        adopted = true;
    }
    rc = policy_slot_ready(b->policy, (uint32_t)p->pool_id, s->pool_incarnation, s->slot, &id,
                           s->n_tokens);
    if (rc) {
        if (adopted) ledger_requeue(b->ledger, &id); /* no slot holds it: back to to-do */
        return reply_error(b, r, m->request_id, rc, "slot ready refused");
    }
    d->n_seqs[s->slot] = s->n_seqs;
    reply_ok(b, r, m->request_id, 0);
    wire_msg a;
    reply_init(b, &a, WIRE_SLOT_READY, 0);
    a.u.ready = *s;
    broker_publish(b, "ready", &a);
}

/* True when draining and nothing is left to hand out: no slot filling, ready or leased, or no
 * pool at all (a broker restarted after its targets exited at a drain knows none, and no target
 * will register and produce while it drains). Claims are then answered SHUTDOWN. */
bool broker_drained(const broker *b)
{
    if (b->pending_mode != POLICY_DRAINING) return false;
    return !b->policy || policy_drained(b->policy);
}

/* What the importer needs to map the granted slot: from the pool's current descriptor, so the
 * caller has checked that g's incarnation is still the registered one (policy_claim's grants
 * are; a group step's reservation may be older: broker_on_step_claim). */
void broker_fill_grant(broker *b, const policy_grant *g, wire_grant *w)
{
    pool_desc *d = &b->pools[g->where.pool_id];
    memset(w, 0, sizeof *w);
    uint64_t now = now_ms(b);
    d->last_grant_ms = now; /* a draining target waits while its slots are taken (drain_hold) */
    w->lease_id = g->lease_id;
    w->deadline_ms = g->deadline_ms > now ? g->deadline_ms - now : 0;
    w->pool_incarnation = g->where.incarnation;
    w->slot = g->where.slot;
    w->offset = (uint64_t)g->where.slot * d->desc.slot_size;
    w->size = d->desc.slot_size;
    w->layout_version = d->desc.layout_version;
    w->unit = to_unit(&g->where.batch);
    w->n_tokens = g->where.n_tokens;
    w->n_seqs = d->n_seqs && g->where.slot < d->desc.slot_count ? d->n_seqs[g->where.slot] : 1;
    if (!w->n_seqs) w->n_seqs = 1;
    w->backend = d->desc.backend;
    memcpy(w->mem_handle, d->desc.mem_handle, WIRE_HANDLE_BYTES);
    if (d->events && g->where.slot < d->desc.n_events)
        memcpy(w->event_handle, d->events[g->where.slot], WIRE_HANDLE_BYTES);
    w->device = d->desc.device;
    memcpy(w->shm_name, d->desc.shm_name, sizeof w->shm_name);
    memcpy(w->pool_name, d->owner, sizeof w->pool_name);
    memcpy(w->gpu_bus_id, d->desc.gpu_bus_id, sizeof w->gpu_bus_id); /* "" unknown */
    if (!w->size) w->size = 1;
}

/* The live solo trainer other than p that has p's name, or NULL. A drafter that shares a live
 * trainer's name keeps its own session at hello (takes_over_by_name); one that claims without
 * having become a trainer itself (a --verify drafter, or an older one) is then a second process
 * with that name. */
static const peer *trainer_named_like(const broker *b, const peer *p)
{
    for (uint32_t i = 0; i < b->n_peers; i++) {
        const peer *q = b->peers[i];
        if (q != p && q->trains && q->state == PEER_LIVE && q->role == WIRE_ROLE_DRAFTER &&
            strcmp(q->name, p->name) == 0)
            return q;
    }
    return NULL;
}

static void on_claim(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const peer *named = p->trains ? NULL : trainer_named_like(b, p);
    if (named)
        return reply_error(b, r, m->request_id, DFLASH_EEXISTS,
                           "the drafter name '%s' is in use by a live trainer (run %016" PRIx64
                           "): give each drafter its own --name", p->name, named->run_id);
    if (group_of_peer(b->groups, p->incarnation))
        return reply_error(b, r, m->request_id, DFLASH_EDENIED,
                           "a group member claims whole steps (StepClaim), not single slots");
    if (broker_drained(b)) return reply_error(b, r, m->request_id, DFLASH_ESHUTDOWN, "drained");
    if (!b->policy) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "no pool yet");
    policy_grant g;
    int rc = policy_claim(b->policy, p->incarnation, now_ms(b), &g);
    if (rc == DFLASH_EAGAIN || rc == DFLASH_ESTATE) {
        /* the plan's end: only then nothing is ready */
        if (broker_plan_done(b)) return broker_reply_plan_done(b, r, m->request_id);
        return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "%s",
                           pool_registered(b) ? "nothing eligible"
                                              : "no target registered: waiting for one");
    }
    if (rc) return reply_error(b, r, m->request_id, rc, "claim refused");
    reply_init(b, r, WIRE_GRANT, m->request_id);
    broker_fill_grant(b, &g, &r->u.grant);
    broker_granted(b, &g);
}

/* True when p released lease_id recently and still holds its batch: a retry whose first reply
 * was lost (the release is done; Stale would make the drafter drop a batch it holds). */
static bool released_before(const peer *p, uint64_t lease_id)
{
    uint32_t n = p->n_released < PEER_RECENT_RELEASES ? p->n_released : PEER_RECENT_RELEASES;
    for (uint32_t i = 0; i < n; i++) {
        if (p->released[i].lease_id != lease_id) continue;
        for (uint32_t k = 0; k < p->n_held; k++)
            if (same_batch(&p->held[k], &p->released[i].batch)) return true;
    }
    return false;
}

static void on_release(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    if (!b->policy) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "unknown lease");
    if (released_before(p, m->u.lease_id)) return reply_ok(b, r, m->request_id, 0);
    uint64_t holder = 0;
    if (policy_lease_worker(b->policy, m->u.lease_id, &holder) == 0 && holder != p->incarnation) {
        /* a lease is its drafter's: another peer's release would free a slot it may still be
         * copying (the target rewrites FREE slots) and, unread, requeue its batch */
        LOG_WARN("%s released lease %" PRIu64 ", which is another drafter's: refused", p->name,
                 m->u.lease_id);
        return reply_error(b, r, m->request_id, DFLASH_EDENIED,
                           "lease %" PRIu64 " was granted to another drafter", m->u.lease_id);
    }
    policy_slot_ref where;
    int rc = policy_release(b->policy, m->u.lease_id, &where);
    if (rc) return reply_error(b, r, m->request_id, rc, "lease %" PRIu64 " unknown or expired",
                               m->u.lease_id);
    if (m->u.release_unread) {
        /* The drafter could not read the slot: nobody holds the batch; the slot is FREE (the
         * target rewrites it) and the batch is produced again. Not the batch's failure: the
         * slot is unreadable to this drafter, e.g. its pool cannot be mapped. (A group step's
         * slot stays unreleased: the step cannot be acked with it, and its abort finds nothing
         * more to give back.) */
        bool back = ledger_requeue(b->ledger, &where.batch) == 0;
        LOG_WARN("%s could not read slot %u of pool %u: batch %u/%u/%u %s", p->name, where.slot,
                 where.pool_id, where.batch.epoch, where.batch.bucket, where.batch.index,
                 back ? "back to to-do" : "not in flight any more (trained meanwhile: a late ack)");
        return reply_ok(b, r, m->request_id, 0);
    }
    group_slot *gs = group_slot_of_lease(b->groups, m->u.lease_id);
    batch_state st;
    if (!gs && ledger_get(b->ledger, &where.batch, &st, NULL) == 0 &&
        (st == BATCH_TRAINED || st == BATCH_COMMITTED)) {
        /* A late ack recorded it trained while this lease was out (on_ack): the copy must not
         * be trained again. The slot is FREE (policy_release). */
        LOG_INFO("%s released lease %" PRIu64 " of batch %u/%u/%u, trained meanwhile (a late "
                 "ack): its copy is refused, the batch is not trained twice", p->name,
                 m->u.lease_id, where.batch.epoch, where.batch.bucket, where.batch.index);
        policy_release_refused(b->policy);
        return reply_error(b, r, m->request_id, DFLASH_ESTALE,
                           "batch %u/%u/%u was trained meanwhile (the late ack of the drafter it "
                           "was handed to before): drop the copy", where.batch.epoch,
                           where.batch.bucket, where.batch.index);
    }
    if (p->role == WIRE_ROLE_DRAFTER) {
        held_add(p, &where.batch);
        uint32_t k = p->n_released++ % PEER_RECENT_RELEASES;
        p->released[k].lease_id = m->u.lease_id;
        p->released[k].batch = where.batch;
    }
    if (gs) gs->released = true;
    reply_ok(b, r, m->request_id, 0);
}

/* The live drafter whose leases carry worker id inc (its incarnation), or NULL. */
static const peer *drafter_of_worker(const broker *b, uint64_t inc)
{
    for (uint32_t i = 0; i < b->n_peers; i++)
        if (b->peers[i]->role == WIRE_ROLE_DRAFTER && b->peers[i]->incarnation == inc)
            return b->peers[i];
    return NULL;
}

/* p's late ack recorded batch id trained (at step) after it had been handed out again (p was
 * expired holding it, or a restart gave it back): what becomes of the other delivery, said in
 * the log. A slot that holds it and is not granted (filling or ready) goes back to its target
 * untrained. A lease on it (another drafter may be copying it) is marked: its release is refused
 * STALE (on_release: that drafter drops its copy) and its end frees the slot; either way the
 * batch is not trained twice. A group step's lease is marked too (its end frees the slot), but
 * its release is never refused (that would re-form the group): the group trains it again, which
 * is logged as trained twice. A drafter that copied it already (it holds it) is training it:
 * nothing can stop that, it is trained twice, and that drafter's ack will be refused EXISTS. */
static void late_ack_overtakes(broker *b, const peer *p, const batch_id *id, uint64_t step)
{
    if (!b->policy) return;
    policy_slot_ref where;
    policy_grant g;
    const peer *q;
    if (policy_batch_trained(b->policy, id, &where) == 0) {
        LOG_INFO("%s acked batch %u/%u/%u late, while slot %u of pool %u held it again: the slot "
                 "goes back to its target, the batch is not trained twice", p->name, id->epoch,
                 id->bucket, id->index, where.slot, where.pool_id);
    } else if (policy_lease_trained(b->policy, id, &g) == 0) {
        if (group_slot_of_lease(b->groups, g.lease_id)) {
            /* a group step's lease: its release is never refused (that would re-form the
             * group), so the group trains the batch again; the lease's end frees the slot */
            LOG_WARN("%s acked batch %u/%u/%u late (trained at step %" PRIu64 "), while a "
                     "group step holds it again (lease %" PRIu64 " on slot %u of pool %u): the "
                     "group trains it again, it is trained twice; the ledger counts it once",
                     p->name, id->epoch, id->bucket, id->index, step, g.lease_id,
                     g.where.slot, g.where.pool_id);
            return;
        }
        q = drafter_of_worker(b, g.worker_id);
        LOG_INFO("%s acked batch %u/%u/%u late, while %s%s held it again (lease %" PRIu64
                 " on slot %u of pool %u, not released): that release is refused and the "
                 "copy dropped, the batch is not trained twice", p->name, id->epoch, id->bucket,
                 id->index, q ? "drafter " : "a drafter", q ? q->name : "", g.lease_id,
                 g.where.slot, g.where.pool_id);
    } else if ((q = other_holder(b, p, id)) != NULL) {
        LOG_WARN("%s acked batch %u/%u/%u late (trained at step %" PRIu64 "), while drafter %s "
                 "trains it again (copied, not acked): it is trained twice; the ledger counts "
                 "it once, %s's ack will be refused", p->name, id->epoch, id->bucket, id->index,
                 step, q->name, q->name);
    }
}

/* Whether p's ack of batch id at step, refused EXISTS (the ledger has it trained at step `at`),
 * repeats the ack the ledger recorded: the same step, and the same acker (recent_acks: the same
 * process or run) when that is known; when it is not (an ack older than the ring, or recorded
 * before a restart, or by a group's StepDone), a drafter that does not hold the batch (holding
 * it, it copied the batch after the recorded ack, so it trained it again). Defect: the step
 * alone decided, so a late acker acking second at the redelivered copy's drafter's step was
 * answered "a repeated ack", with no warning, for a batch trained twice. */
static bool repeats_recorded_ack(const broker *b, const peer *p, const batch_id *id,
                                 uint64_t step, uint64_t at, bool held)
{
    if (at != step) return false;
    recent_acker was, is = {p->incarnation, p->run_id};
    if (recent_acks_find(&b->acked_by, id, &was)) return recent_acker_same(&was, &is);
    return !held;
}

/* An ack of a batch not trained yet records it, wherever it is (to-do, in flight, orphaned by a
 * restart, quarantined: the ledger's late ack), notes who acked it (recent_acks), and
 * late_ack_overtakes deals with a delivery of it since. One already trained is refused EXISTS:
 * a repeat of the recorded ack (repeats_recorded_ack: the first one's reply was lost, or a
 * resumed drafter acks what its checkpoint recorded as unacked); else the batch was trained
 * twice, which is logged: at another step, or by another drafter at the same step (defect: a
 * coincidence of two drafters' steps was called a repeat). */
static void on_ack(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    batch_id id = to_batch(&m->u.ack.unit);
    uint64_t step = m->u.ack.step, at = 0;
    int rc = ledger_ack(b->ledger, &id, step);
    bool held = held_remove(p, &id);
    if (rc == DFLASH_EEXISTS) {
        b->double_acks++;
        ledger_get(b->ledger, &id, NULL, &at); /* 0 in a finished epoch: no longer known */
        if (repeats_recorded_ack(b, p, &id, step, at, held))
            return reply_error(b, r, m->request_id, rc,
                               "a repeated ack: the batch is recorded at step %" PRIu64, step);
        if (!at) return reply_error(b, r, m->request_id, rc, "batch already trained");
        LOG_WARN("%s acked batch %u/%u/%u at step %" PRIu64 ", already trained at step %" PRIu64
                 ": it is trained twice", p->name, id.epoch, id.bucket, id.index, step, at);
        return reply_error(b, r, m->request_id, rc,
                           "batch already trained at step %" PRIu64 ": trained twice", at);
    }
    if (rc) return reply_error(b, r, m->request_id, rc, "ack refused");
    b->acks++;
    recent_acks_note(&b->acked_by, &id, &(recent_acker){p->incarnation, p->run_id});
    late_ack_overtakes(b, p, &id, step);
    reply_ok(b, r, m->request_id, 0);
}

static void on_commit(broker *b, const wire_msg *m, wire_msg *r)
{
    int64_t n = ledger_commit(b->ledger, m->u.step);
    if (n < 0) return reply_error(b, r, m->request_id, (int)n, "commit failed");
    reply_ok(b, r, m->request_id, (uint64_t)n);
}

/* JournalSync, a drafter's durability barrier before it publishes a checkpoint: the ledger queues
 * a sync after every record so far (its acks included); the reply's ticket is that sync, so it
 * is deferred until the writer has fdatasynced them (Error IO when it could not: fail_on_io). */
static void on_journal_sync(broker *b, const wire_msg *m, wire_msg *r)
{
    int rc = ledger_barrier(b->ledger);
    if (rc < 0)
        return reply_error(b, r, m->request_id, rc, "journal sync failed: %s",
                           ledger_journal_failure(b->ledger) ? ledger_journal_failure(b->ledger)
                                                             : err_str(rc));
    reply_ok(b, r, m->request_id, 0);
}

int64_t broker_rewind_to(broker *b, uint64_t step, wire_msg *r, uint64_t rid)
{
    int64_t n = ledger_rewind(b->ledger, step);
    if (n == DFLASH_ESTATE)
        reply_error(b, r, rid, (int)n, "step %" PRIu64 " is older than a finished epoch's last "
                    "batch: resume from a later checkpoint (a new run starts the broker on a "
                    "new --journal)", step);
    else if (n < 0)
        reply_error(b, r, rid, (int)n, "rewind failed: %s",
                    ledger_journal_failure(b->ledger) ? ledger_journal_failure(b->ledger)
                                                      : err_str((int)n));
    else
        b->dispatch_rewound = true;
    return n;
}

/* The live targets, then the live drafters, whose names start with prefix ("" every one), into
 * s's peer list (WIRE_MAX_STATUS_PEERS at most; the rest counted in peers_unlisted): who is
 * connected, heard when, holding what. */
static void status_peers(broker *b, uint64_t now, const char *prefix, wire_status *s)
{
    size_t n = strlen(prefix);
    s->n_peer_list = s->peers_unlisted = 0;
    static const wire_role roles[] = {WIRE_ROLE_TARGET, WIRE_ROLE_DRAFTER};
    for (size_t k = 0; k < sizeof roles / sizeof *roles; k++)
        for (uint32_t i = 0; i < b->n_peers; i++) {
            const peer *p = b->peers[i];
            if (p->state != PEER_LIVE || p->role != roles[k] || strncmp(p->name, prefix, n) != 0)
                continue;
            if (s->n_peer_list == WIRE_MAX_STATUS_PEERS) {
                s->peers_unlisted++;
                continue;
            }
            wire_peer_stat *o = &s->peer_list[s->n_peer_list++];
            snprintf(o->name, sizeof o->name, "%s", p->name);
            o->role = (uint32_t)p->role;
            o->heard_ms_ago = now > p->last_seen_ms ? now - p->last_seen_ms : 0;
            if (p->role == WIRE_ROLE_DRAFTER) {
                o->leases = b->policy ? policy_worker_leases(b->policy, p->incarnation) : 0;
                o->held = p->n_held;
                o->trains = p->trains;
            } else if (p->pool_id >= 0 && p->pool_id < MAX_POOLS &&
                       b->pools[p->pool_id].registered) {
                o->slots = b->pools[p->pool_id].desc.slot_count;
            }
        }
}

void broker_status(broker *b, wire_status *s) { broker_status_of(b, "", s); }

void broker_status_of(broker *b, const char *peer_prefix, wire_status *s)
{
    memset(s, 0, sizeof *s);
    uint64_t now = now_ms(b);
    s->uptime_ms = now - b->start_ms;
    s->min_ready = (uint32_t)b->cfg.min_ready;
    s->max_depth = (uint32_t)b->cfg.max_depth;
    s->lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
    s->state = (uint32_t)b->pending_mode;
    s->claims_per_s = b->claims_per_s;
    s->malformed = b->malformed;
    s->acks = b->acks;
    s->redeliveries = b->redeliveries;
    s->hellos_refused_full = b->peers_full.count;
    s->replies_dropped = b->deferred_dropped.count;
    s->key_refusals = b->key_denied.count;
    s->connections_refused = b->zap_denied;
    s->steering_refused = b->steer_denied;
    const char *jf = b->ledger ? ledger_journal_failure(b->ledger) : NULL;
    if (jf) snprintf(s->journal_error, sizeof s->journal_error, "%s: %s", b->cfg.journal, jf);
    uint32_t live = 0;
    for (uint32_t i = 0; i < b->n_peers; i++) live += b->peers[i]->state == PEER_LIVE;
    s->peers = live;
    ledger_stats ls;
    ledger_get_stats(b->ledger, &ls);
    s->batches_todo = ls.todo;
    s->batches_inflight = ls.in_flight;
    s->batches_trained = ls.trained;
    s->batches_committed = ls.committed;
    s->quarantined = ls.quarantined;
    s->committed_step = ls.last_commit_step;
    s->epoch = ls.open_epoch;
    for (uint32_t i = 0; i < ls.n_buckets; i++) s->batches_total += ls.batches_per_bucket[i];
    for (int i = 0; i < MAX_POOLS; i++)
        if (b->pools[i].registered) {
            s->pool_incarnation = b->pools[i].desc.pool_incarnation;
            s->slot_count += b->pools[i].desc.slot_count;
        }
    for (uint32_t i = 0; i < group_count(b->groups) && s->n_groups < WIRE_MAX_GROUPS; i++) {
        const group *g = group_at(b->groups, i);
        wire_group_stat *o = &s->groups[s->n_groups++];
        snprintf(o->name, sizeof o->name, "%s", g->name);
        o->epoch = g->epoch;
        o->world = g->world;
        o->step = g->step_active ? g->step : g->base_step + 1;
        o->state = g->state == GROUP_FORMING  ? WIRE_GROUP_FORMING
                   : g->state == GROUP_ACTIVE ? WIRE_GROUP_ACTIVE
                                              : WIRE_GROUP_REFORMING;
        o->step_reserved = g->step_active;
        o->micros = g->step_active ? g->step_micros : 0;
        o->accumulate = group_accumulate(g);
        o->steps_done = g->steps_done;
        o->steps_aborted = g->steps_aborted;
        for (uint32_t k = 0; k < g->n_members; k++) {
            if (!g->members[k].admitted) o->pending++;
            else if (o->n_members < WIRE_MAX_STATUS_MEMBERS)
                snprintf(o->members[o->n_members++], WIRE_MAX_NAME, "%s", g->members[k].name);
        }
    }
    uint64_t hold = b->cfg.group_hold_ms > 0 ? (uint64_t)b->cfg.group_hold_ms : 0;
    group_orphan_info oi;
    for (uint32_t i = 0; s->n_orphans < WIRE_MAX_STATUS_ORPHANS &&
                         group_orphan_get(b->groups, i, now, &oi); i++) {
        wire_orphan_stat *o = &s->orphans[s->n_orphans++];
        snprintf(o->group, sizeof o->group, "%s", oi.name);
        o->step = oi.step;
        o->batches = oi.n_units;
        o->held_ms = oi.waited_ms;
        o->abort_in_ms = hold > oi.waited_ms ? hold - oi.waited_ms : 0;
    }
    broker_stop_status(b, s);
    status_peers(b, now, peer_prefix, s);
    if (!b->policy) return;
    policy_stats ps;
    policy_get_stats(b->policy, &ps);
    s->state = (uint32_t)ps.mode;
    s->tv_distance = ps.mix_tv;
    s->grants = ps.claims;
    s->releases = ps.releases;
    s->lease_expiries = ps.lease_expiries;
    s->n_buckets = ps.n_buckets < WIRE_MAX_BUCKETS ? ps.n_buckets : WIRE_MAX_BUCKETS;
    for (uint32_t i = 0; i < s->n_buckets; i++) {
        const policy_bucket_stats *pb = &ps.bucket[i];
        wire_bucket_stat *o = &s->buckets[i];
        o->upper = pb->bucket_max_len;
        o->share = pb->share;
        o->ready = pb->ready;
        o->leased = pb->leased;
        o->filling = pb->filling;
        o->deficit = pb->deficit;
        o->produced = pb->produced_batches;
        o->consumed = pb->consumed_batches;
        o->produced_tokens = pb->produced_tokens;
        o->consumed_tokens = pb->consumed_tokens;
    }
}

/* --- dispatch ------------------------------------------------------------------------------- */

/* The operator's verbs (dflash-ctl set, pause, resume, drain, release): sent without a session,
 * admin-only over CURVE (may_steer), answered once their journal record is durable (Error IO
 * when it could not be). */
static bool is_steering(wire_type t)
{
    return t == WIRE_SET_CONFIG || t == WIRE_PAUSE || t == WIRE_RESUME || t == WIRE_DRAIN ||
           t == WIRE_RELEASE_QUARANTINE;
}

/* JournalSync needs none either: a drafter whose hello was refused, or a broker that restarted
 * since it, still makes the acks of its final checkpoint durable first (any sync of the file
 * covers every record written to it, by this process or the one before). */
/* The one role whose registered peers may send request t (a target's pool and slots, a drafter's
 * claims, acks, commits, resumes and group steps); WIRE_ROLE_BROKER: any (hello, heartbeat,
 * status, the journal barrier, steering). Checked for every registered peer before its handler
 * (defect: a peer registered as a target acked every batch of the plan it never trained, and its
 * ResumeFrom put them all back to do; the role was never looked at). */
static wire_role role_of_request(wire_type t)
{
    switch (t) {
    case WIRE_POOL_REGISTER:
    case WIRE_WORK_REQUEST:
    case WIRE_SLOT_READY:
    case WIRE_POOL_LEAVE: return WIRE_ROLE_TARGET;
    case WIRE_CLAIM:
    case WIRE_SLOT_RELEASE:
    case WIRE_ACK:
    case WIRE_CHECKPOINT_COMMITTED:
    case WIRE_RESUME_FROM:
    case WIRE_GROUP_JOIN:
    case WIRE_GROUP_SET_ID:
    case WIRE_STEP_CLAIM:
    case WIRE_STEP_DONE:
    case WIRE_GROUP_LEAVE: return WIRE_ROLE_DRAFTER;
    default: return WIRE_ROLE_BROKER;
    }
}

static bool needs_hello(wire_type t)
{
    return t != WIRE_HELLO && t != WIRE_HEARTBEAT && t != WIRE_STATUS_REQUEST &&
           t != WIRE_JOURNAL_SYNC && !is_steering(t);
}

/* A request that came in over CURVE may steer only with an admin key; one over ipc:// (no
 * User-Id: the 0700 runtime dir is its access control) or from broker_dispatch's direct callers
 * may. */
static bool may_steer(const broker *b)
{
    return !b->curve_on || !b->dispatch_user[0] || curve_keyset_has(&b->admin_keys, b->dispatch_user);
}

int broker_dispatch(broker *b, const uint8_t *rid, size_t rid_len, const uint8_t *msg,
                    size_t len, uint8_t *out, size_t cap)
{
    static wire_msg m, r; /* loop thread only; large, so not on the stack */
    char why[160] = "";
    b->requests++;
    b->dispatch_ticket = ledger_journal_seq(b->ledger);
    b->dispatch_fail_on_io = b->dispatch_rewound = false;
    b->dispatch_wait_seq = 0;
    int rc = wire_unpack(msg, len, &m, why, sizeof why);
    if (rc) {
        b->malformed++;
        LOG_DEBUG("malformed message (%zu bytes): %s", len, why);
        reply_error(b, &r, m.request_id, rc, "malformed message: %s", why);
        b->dispatch_ticket = 0; /* nothing journaled: answer at once */
        return wire_pack(&r, out, cap);
    }
    peer *p = rid_len ? peer_find(b, rid, rid_len) : NULL;
    bool is_ctl = m.role == WIRE_ROLE_CTL;
    if (p && broker_key_differs(p, b->dispatch_user)) {
        /* another key on a registered peer's routing id (a connection that took it over:
         * broker_security.c, "Routing-id takeover"): nothing of p's is touched */
        char why[WIRE_MAX_TEXT];
        snprintf(why, sizeof why, "this routing id belongs to a %s registered with another "
                 "CURVE key: a client uses its own routing id (common/client.c makes one per "
                 "process)", wire_role_name(p->role));
        broker_key_refuse(b, &m, p, why, &r);
        p = NULL;
        goto out;
    }
    if (m.type == WIRE_HELLO && is_ctl) { /* ctl sessions are stateless: no peer entry */
        reply_init(b, &r, WIRE_HELLO, m.request_id);
        snprintf(r.u.hello.name, sizeof r.u.hello.name, "dflash-queue");
        r.u.hello.heartbeat_ms = (uint32_t)b->cfg.heartbeat_ms;
        r.u.hello.lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
        snprintf(r.u.hello.pub_endpoint, sizeof r.u.hello.pub_endpoint, "%s",
                 b->cfg.pub_endpoint);
        r.u.hello.stats_interval_ms = (uint32_t)b->cfg.stats_interval_ms; /* watch's deadline */
        goto out;
    }
    if (m.type == WIRE_HELLO && !p && rid_len && rid_len <= sizeof p->rid) {
        if (peer_table_full(b, &m, &r)) goto out;
        p = peer_add(b, rid, rid_len);
    }
    if (m.type == WIRE_WORK_UNIT || m.type == WIRE_GRANT || m.type == WIRE_STATUS_REPLY ||
        m.type == WIRE_SET_CONFIG_REPLY || m.type == WIRE_ERROR || m.type == WIRE_OK ||
        m.type == WIRE_GROUP_VIEW || m.type == WIRE_STEP_GRANT || m.type == WIRE_POOL_LEFT) {
        b->malformed++;
        reply_error(b, &r, m.request_id, DFLASH_EPROTO, "%s is not a request",
                    wire_type_name(m.type));
        goto out;
    }
    if (m.role == WIRE_ROLE_BROKER || (is_ctl && needs_hello(m.type))) {
        reply_error(b, &r, m.request_id, DFLASH_EDENIED, "a %s may not send %s",
                    wire_role_name(m.role), wire_type_name(m.type));
        goto out;
    }
    if (is_steering(m.type) && !may_steer(b)) {
        b->steer_denied++;
        LOG_WARN("%s from CURVE key %s refused: not an admin key", wire_type_name(m.type),
                 b->dispatch_user);
        reply_error(b, &r, m.request_id, DFLASH_EDENIED, "%s needs the admin key",
                    wire_type_name(m.type));
        goto out;
    }
    if (needs_hello(m.type) && (!p || p->state != PEER_LIVE || p->incarnation != m.incarnation)) {
        reply_error(b, &r, m.request_id, DFLASH_ESTALE, "unknown peer: send hello");
        goto out;
    }
    wire_role needed = role_of_request(m.type);
    if (p && needed != WIRE_ROLE_BROKER && p->role != needed) {
        b->malformed++;
        LOG_WARN("%s %s sent %s, a %s's request: refused", wire_role_name(p->role), p->name,
                 wire_type_name(m.type), wire_role_name(needed));
        reply_error(b, &r, m.request_id, DFLASH_EDENIED, "a %s may not send %s",
                    wire_role_name(p->role), wire_type_name(m.type));
        goto out;
    }
    if (!is_ctl && m.type != WIRE_HELLO && p && p->state == PEER_LIVE) {
        p->last_seen_ms = now_ms(b);
        if (p->role == WIRE_ROLE_DRAFTER && b->policy)
            policy_heartbeat(b->policy, p->incarnation, p->last_seen_ms);
    }
    if (broker_stop_refuses(b, p, &m, &r)) goto out; /* stopping: nothing new handed out */
    switch (m.type) {
    case WIRE_HELLO:
        if (!p) {
            reply_error(b, &r, m.request_id, DFLASH_EINVAL, "hello needs a routing id");
            break;
        }
        p->last_seen_ms = now_ms(b);
        if (!on_hello(b, p, &m, &r) && p->state == PEER_NEW && r.u.error.code != DFLASH_EAGAIN) {
            for (uint32_t i = 0; i < b->n_peers; i++)
                if (b->peers[i] == p) {
                    b->peers[i] = b->peers[--b->n_peers];
                    break;
                }
            free(p->held);
            free(p);
            p = NULL;
        }
        break;
    case WIRE_POOL_REGISTER: on_pool_register(b, p, &m, &r); break;
    case WIRE_WORK_REQUEST: on_work_request(b, p, &m, &r); break;
    case WIRE_SLOT_READY: on_slot_ready(b, p, &m, &r); break;
    case WIRE_POOL_LEAVE:
        if (broker_on_pool_leave(b, p, &m, &r)) {
            peer_end(b, p, "left: its pool is dropped");
            p = NULL;
        }
        break;
    case WIRE_CLAIM: on_claim(b, p, &m, &r); break;
    case WIRE_SLOT_RELEASE: on_release(b, p, &m, &r); break;
    case WIRE_ACK: on_ack(b, p, &m, &r); break;
    case WIRE_CHECKPOINT_COMMITTED: on_commit(b, &m, &r); break;
    case WIRE_RESUME_FROM: broker_on_resume_from(b, p, &m, &r); break;
    case WIRE_JOURNAL_SYNC: on_journal_sync(b, &m, &r); break;
    case WIRE_GROUP_JOIN:
        /* a group member beside a solo trainer or another group: the same conflict (one
         * broker, one model) */
        if (broker_trainer_admitted(b, p, broker_other_model_trainer(b, p, 0, m.u.join.group),
                                    m.request_id, DFLASH_EDENIED, &r))
            broker_on_group_join(b, p, &m, &r);
        break;
    case WIRE_GROUP_SET_ID: broker_on_group_set_id(b, p, &m, &r); break;
    case WIRE_STEP_CLAIM: broker_on_step_claim(b, p, &m, &r); break;
    case WIRE_STEP_DONE: broker_on_step_done(b, p, &m, &r); break;
    case WIRE_GROUP_LEAVE: broker_on_group_leave(b, p, &m, &r); break;
    case WIRE_HEARTBEAT:
        reply_init(b, &r, WIRE_HEARTBEAT, m.request_id);
        r.u.sent_ms = m.u.sent_ms;
        break;
    case WIRE_STATUS_REQUEST:
        reply_init(b, &r, WIRE_STATUS_REPLY, m.request_id);
        broker_status_of(b, m.u.peer_prefix, &r.u.status);
        break;
    case WIRE_SET_CONFIG: broker_on_set(b, &m, &r); break;
    case WIRE_PAUSE: broker_on_mode(b, &m, &r, POLICY_PAUSED); break;
    case WIRE_RESUME: broker_on_mode(b, &m, &r, POLICY_RUNNING); break;
    case WIRE_DRAIN: broker_on_mode(b, &m, &r, POLICY_DRAINING); break;
    case WIRE_RELEASE_QUARANTINE: broker_on_release_quarantine(b, &m, &r); break;
    default: /* reply types were refused above */
        reply_error(b, &r, m.request_id, DFLASH_EINTERNAL, "unhandled %s", wire_type_name(m.type));
        break;
    }
out:
    broker_stop_note(b, p, &m, &r);
    if (ledger_journal_seq(b->ledger) != b->dispatch_ticket)
        b->dispatch_ticket = ledger_journal_seq(b->ledger); /* it queued records */
    else
        b->dispatch_ticket = p ? p->journal_ticket : 0;
    if (b->dispatch_ticket < b->dispatch_wait_seq) b->dispatch_ticket = b->dispatch_wait_seq;
    if (p) p->journal_ticket = b->dispatch_ticket;
    b->dispatch_request_id = m.request_id;
    /* a rewind (ResumeFrom, a GroupJoin that creates its group, a join of a group whose
     * creating rewind is being written) is answered Error IO when its REWIND record fails (a
     * creating join got its view: the group trained on while a broker restarted before the
     * journal healed replayed no rewind) */
    b->dispatch_fail_on_io = m.type == WIRE_CHECKPOINT_COMMITTED || m.type == WIRE_RESUME_FROM ||
                             m.type == WIRE_JOURNAL_SYNC || is_steering(m.type) ||
                             b->dispatch_rewound || b->dispatch_wait_seq;
    wire_msg_clear(&m);
    return wire_pack(&r, out, cap);
}

/* --- sockets -------------------------------------------------------------------------------- */

static void send_reply(broker *b, const uint8_t *rid, size_t rid_len, const uint8_t *msg,
                       size_t len)
{
    if (!b->router) return;
    if (zmq_send(b->router, rid, rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(b->router, msg, len, ZMQ_DONTWAIT) < 0)
        b->unroutable++; /* peer gone (ROUTER_MANDATORY) or its pipe is full */
}

/* Sends the deferred replies whose records are durable, in the order they were deferred.
 * Loop thread. */
static void flush_deferred(broker *b, uint64_t done_seq, uint64_t fail_seq)
{
    deferred_reply **pp = &b->dq_head, *prev = NULL;
    while (*pp) {
        deferred_reply *d = *pp;
        if (d->ticket > done_seq) {
            prev = d;
            pp = &d->next;
            continue;
        }
        *pp = d->next;
        if (b->dq_tail == d) b->dq_tail = prev;
        b->n_deferred--;
        if (d->fail_on_io && fail_seq && fail_seq <= d->ticket) {
            static wire_msg e; /* loop thread only */
            reply_error(b, &e, d->request_id, DFLASH_EIO,
                        "journal write failed: the record is not durable");
            int n = wire_pack(&e, b->outbuf, WIRE_MAX_MSG);
            if (n > 0) send_reply(b, d->rid, d->rid_len, b->outbuf, (size_t)n);
        } else {
            send_reply(b, d->rid, d->rid_len, d->msg, d->len);
        }
        free(d);
    }
}

static void journal_note_recovery(broker *b);

static void on_journal_done(void *ctx, uint64_t done_seq, uint64_t fail_seq)
{
    flush_deferred(ctx, done_seq, fail_seq);
    journal_note_recovery(ctx);
}

/* Unlinks and frees the deferred reply *pp (the link that points to it), counted as dropped. */
static void deferred_drop(broker *b, deferred_reply **pp)
{
    deferred_reply *d = *pp;
    *pp = d->next;
    if (b->dq_tail == d) /* pp is the head pointer or the `next` member of its predecessor */
        b->dq_tail = pp == &b->dq_head
                         ? NULL
                         : (deferred_reply *)((char *)pp - offsetof(deferred_reply, next));
    b->n_deferred--;
    free(d);
}

/* Room for one more reply deferred to rid (defect: no cap, so a peer pipelining requests while
 * an fsync was pending, or a flood of JournalSyncs from new routing ids, grew the list without
 * bound). Per routing id at most BROKER_DEFERRED_PER_PEER wait: its oldest goes, an answer its
 * client gave up waiting for (it has one request out at a time; a timeout resets its socket and
 * it goes on), so the request is still handled (its heartbeat still counts). In all at most
 * that many per --max-peers: the oldest of all goes. Counted (status: replies_dropped); warned
 * about once per BROKER_WARN_EVERY_MS. */
static void deferred_make_room(broker *b, const uint8_t *rid, size_t rid_len)
{
    deferred_reply **oldest = NULL;
    uint32_t mine = 0;
    for (deferred_reply **pp = &b->dq_head; *pp; pp = &(*pp)->next)
        if ((*pp)->rid_len == rid_len && memcmp((*pp)->rid, rid, rid_len) == 0 && !mine++)
            oldest = pp;
    uint64_t total_cap = (uint64_t)b->cfg.max_peers * BROKER_DEFERRED_PER_PEER;
    const char *which;
    if (mine >= BROKER_DEFERRED_PER_PEER) {
        deferred_drop(b, oldest);
        which = "its routing id's oldest: more replies were waiting for it than a client asks";
    } else if (b->n_deferred >= total_cap) {
        deferred_drop(b, &b->dq_head);
        which = "the oldest of all: as many replies were waiting as --max-peers allows";
    } else {
        return;
    }
    uint64_t since;
    if (warn_limit_due(&b->deferred_dropped, now_ms(b), &since))
        LOG_WARN("a reply waiting for the journal was dropped, %s (%" PRIu64 " dropped since the "
                 "last report, %" PRIu64 " in all; %u waiting, the journal's disk is slow or a "
                 "peer sends requests without waiting for their replies)", which, since,
                 b->deferred_dropped.count, b->n_deferred);
}

/* Queues the reply in b->outbuf until the journal reaches b->dispatch_ticket (deferred_make_room
 * first). */
static void defer_reply(broker *b, const uint8_t *rid, size_t rid_len, size_t len)
{
    deferred_make_room(b, rid, rid_len);
    deferred_reply *d = malloc(sizeof *d + len);
    if (!d) { /* cannot wait: better late durability than a lost reply */
        LOG_WARN("no memory to defer a reply; sending it before its journal record is durable");
        send_reply(b, rid, rid_len, b->outbuf, len);
        return;
    }
    d->next = NULL;
    d->ticket = b->dispatch_ticket;
    d->request_id = b->dispatch_request_id;
    d->fail_on_io = b->dispatch_fail_on_io;
    memcpy(d->rid, rid, rid_len);
    d->rid_len = rid_len;
    memcpy(d->msg, b->outbuf, len);
    d->len = len;
    if (b->dq_tail) b->dq_tail->next = d;
    else b->dq_head = d;
    b->dq_tail = d;
    b->n_deferred++;
}

static void on_router(void *zsock, void *arg)
{
    broker *b = arg;
    uint8_t rid[256];
    int rlen = zmq_recv(zsock, rid, sizeof rid, ZMQ_DONTWAIT);
    if (rlen < 0) return; /* EAGAIN: spurious */
    int more = 0;
    size_t ml = sizeof more;
    zmq_getsockopt(zsock, ZMQ_RCVMORE, &more, &ml);
    if (!more) return;
    zmq_msg_t body;
    zmq_msg_init(&body);
    int n = zmq_msg_recv(&body, zsock, ZMQ_DONTWAIT);
    if (n >= 0) {
        memcpy(b->inbuf, zmq_msg_data(&body), (size_t)n > WIRE_MAX_MSG ? WIRE_MAX_MSG : (size_t)n);
        /* set by our ZAP handler for CURVE connections only (see the header) */
        const char *user = b->curve_on ? zmq_msg_gets(&body, "User-Id") : NULL;
        snprintf(b->dispatch_user, sizeof b->dispatch_user, "%s", user ? user : "");
    }
    zmq_msg_close(&body);
    zmq_getsockopt(zsock, ZMQ_RCVMORE, &more, &ml);
    while (more) { /* extra frames: a malformed request; drain them */
        char junk[64];
        zmq_recv(zsock, junk, sizeof junk, ZMQ_DONTWAIT);
        zmq_getsockopt(zsock, ZMQ_RCVMORE, &more, &ml);
        n = (int)WIRE_MAX_MSG + 1;
    }
    if (n < 0) {
        b->dispatch_user[0] = 0;
        return;
    }
    size_t len = (size_t)n > WIRE_MAX_MSG ? WIRE_MAX_MSG + 1 : (size_t)n; /* truncated: too big */
    int out = broker_dispatch(b, rid, (size_t)rlen, b->inbuf, len, b->outbuf, WIRE_MAX_MSG);
    b->dispatch_user[0] = 0;
    if (out <= 0) return;
    uint64_t done_seq, fail_seq;
    ledger_journal_progress(b->ledger, &done_seq, &fail_seq);
    if (b->dispatch_ticket > done_seq) defer_reply(b, rid, (size_t)rlen, (size_t)out);
    else send_reply(b, rid, (size_t)rlen, b->outbuf, (size_t)out);
}

/* Whether cron holds its expiries: peers silent for longer than liveness heartbeats, and leases
 * past their deadline, expire only while the broker could hear. When cron runs late (the broker
 * itself stalled for more than half the shorter of the two windows, and for more than two cron
 * periods, e.g. descheduled on a loaded machine), the heartbeats sent meanwhile are still waiting
 * (libuv runs timers before socket reads; ZeroMQ's own thread may lag too), so nothing expires
 * for half a window more. That grace is given at most once per window (at least two periods), so
 * a broker that is always late still expires dead peers and leases (within about 1.5 windows),
 * and a lease timeout shorter than the period (a live setting) is not taken for a stall on every
 * run. The hold also delays policy_tick's lifting of restart fences, by as much. */
static bool stall_hold(broker *b, uint64_t now)
{
    uint64_t window = (uint64_t)b->cfg.heartbeat_ms * (uint64_t)b->cfg.liveness;
    if ((uint64_t)b->cfg.lease_timeout_ms < window) window = (uint64_t)b->cfg.lease_timeout_ms;
    uint64_t two_periods = 2 * uv_timer_get_repeat(&b->cron);
    uint64_t late = window / 2 > two_periods ? window / 2 : two_periods;
    uint64_t every = window > two_periods ? window : two_periods;
    uint64_t gap = now - b->last_cron_ms;
    b->last_cron_ms = now;
    if (gap > late && (!b->last_grace_ms || now - b->last_grace_ms >= every)) {
        b->last_grace_ms = now;
        b->judge_from_ms = now + window / 2;
        LOG_WARN("the broker did not run for %" PRIu64 " ms (a stall): nothing expires for"
                 " %" PRIu64 " ms more",
                 gap, window / 2);
    }
    return now < b->judge_from_ms;
}

/* A live peer whose reply waits for the journal (a JournalSync or a commit behind a slow
 * fsync) is heard now, as by a heartbeat: its request holds its client, which cannot beat
 * meanwhile (client.h), so it is not silent but waiting on us, and neither it nor its leases
 * expire for the disk's slowness (defect: with a --timeout-ms past the liveness window, a
 * drafter waiting on a 5 s fsync was expired and its batches redelivered). One that died while
 * it waited expires a window after the journal answers (or fails). */
static void hear_peers_awaiting_journal(broker *b, uint64_t now)
{
    for (const deferred_reply *d = b->dq_head; d; d = d->next) {
        peer *p = peer_find(b, d->rid, d->rid_len);
        if (!p || p->state != PEER_LIVE || p->last_seen_ms == now) continue;
        p->last_seen_ms = now;
        if (p->role == WIRE_ROLE_DRAFTER && b->policy)
            policy_heartbeat(b->policy, p->incarnation, now);
    }
}

static void expire_peers(broker *b, uint64_t now)
{
    uint64_t dead_after = (uint64_t)(b->cfg.heartbeat_ms * b->cfg.liveness);
    for (uint32_t i = 0; i < b->n_peers;) {
        peer *p = b->peers[i];
        if (now - p->last_seen_ms > dead_after) peer_remove(b, i, "expired (no heartbeat)");
        else i++;
    }
}

/* A journal that stopped taking records (a full disk, an I/O error) heals itself: every
 * journal_retry_ms the ledger rewrites it whole from memory (ledger_journal_heal), and once that
 * succeeds it holds everything, what changed during the failure too, and takes records again
 * (said once, INFO). Until then the failure is said once a minute, not only at the failure: the
 * ledger lives on in memory, and a broker restarted now would not see what changed since
 * (batches trained again, commits forgotten). Status carries it too (journal_error), and
 * dflash-ctl ping fails on it, so the healthcheck shows it. */
static void journal_watch(broker *b, uint64_t now)
{
    const char *jf = b->ledger ? ledger_journal_failure(b->ledger) : NULL;
    if (jf && now - b->journal_heal_ms >= (uint64_t)b->cfg.journal_retry_ms) {
        b->journal_heal_ms = now;
        (void)ledger_journal_heal(b->ledger); /* inline: done now; writer mode: queued */
        jf = ledger_journal_failure(b->ledger);
    }
    if (!jf) {
        journal_note_recovery(b);
        return;
    }
    b->journal_failing = true;
    if (b->journal_alarm_ms && now - b->journal_alarm_ms < 60000) return;
    b->journal_alarm_ms = now;
    LOG_ERROR("journal %s: %s; since then the ledger lives in memory only (a restart now would "
              "hand out again the batches trained since). The broker rewrites the journal from "
              "memory every %lld ms and recovers once the disk takes it: free space or fix the "
              "disk, and do not restart it before it says it recovered",
              b->cfg.journal, jf, (long long)b->cfg.journal_retry_ms);
}

/* Says once that a journal journal_watch saw failing takes records again (from cron, or as
 * soon as the writer reports the healing rewrite done). Loop thread. */
static void journal_note_recovery(broker *b)
{
    if (!b->journal_failing || ledger_journal_failure(b->ledger)) return;
    b->journal_failing = false;
    b->journal_alarm_ms = 0;
    LOG_INFO("journal %s recovered: rewritten whole from memory, it holds every change made "
             "while it was failing and takes records again", b->cfg.journal);
}

static void cron(uv_timer_t *t)
{
    broker *b = t->data;
    uint64_t now = now_ms(b);
    bool hold = stall_hold(b, now);
    hear_peers_awaiting_journal(b, now);
    if (!hold) expire_peers(b, now);
    if (!hold) broker_groups_tick(b, now);
    if (b->policy && !hold) policy_tick(b->policy, now);
    uint64_t grace = b->cfg.orphan_grace_ms ? (uint64_t)b->cfg.orphan_grace_ms
                                            : 2 * (uint64_t)b->cfg.lease_timeout_ms;
    if (!b->orphans_requeued && now - b->start_ms >= grace) {
        b->orphans_requeued = true;
        uint64_t n = ledger_requeue_orphans(b->ledger);
        if (n) LOG_INFO("%" PRIu64 " batches in flight before the restart went back to to-do", n);
    }
    journal_watch(b, now);
    /* claims/s is measured over the stats interval, or each second when stats are off (status
     * shows it either way) */
    uint64_t window = b->cfg.stats_interval_ms ? (uint64_t)b->cfg.stats_interval_ms : 1000;
    if (now - b->last_stats_ms >= window) {
        static wire_msg s;
        reply_init(b, &s, WIRE_STATUS_REPLY, 0);
        broker_status(b, &s.u.status);
        double dt = (double)(now - b->last_stats_ms) / 1000.0;
        b->claims_per_s = dt > 0 ? (double)(s.u.status.grants - b->grants_at_last) / dt : 0;
        s.u.status.claims_per_s = b->claims_per_s;
        b->grants_at_last = s.u.status.grants;
        b->last_stats_ms = now;
        if (b->cfg.stats_interval_ms) broker_publish(b, "stats", &s);
    }
}

broker *broker_new(uv_loop_t *loop, const queue_config *cfg, int *err)
{
    int dummy;
    if (!err) err = &dummy;
    *err = 0;
    broker *b = calloc(1, sizeof *b);
    if (!b) return *err = DFLASH_ENOMEM, NULL;
    b->loop = loop;
    b->cfg = *cfg;
    b->configured = *cfg;
    snprintf(b->cfg_applied_log, sizeof b->cfg_applied_log, "%s", cfg->log_level);
    b->incarnation = wire_new_incarnation();
    b->start_ms = now_ms(b);
    b->last_stats_ms = b->start_ms;
    b->pending_mode = POLICY_RUNNING;
    b->inbuf = malloc(WIRE_MAX_MSG + 1);
    b->outbuf = malloc(WIRE_MAX_MSG);
    if (!b->inbuf || !b->outbuf) {
        *err = DFLASH_ENOMEM;
        goto fail;
    }
    ledger_params lp = {
        .journal_path = strcmp(cfg->journal, "none") == 0 || !cfg->journal[0] ? NULL
                                                                              : cfg->journal,
        .max_epochs = (uint32_t)cfg->max_epochs,
        .fsync = cfg->fsync,
        .compact_bytes = (uint64_t)cfg->compact_bytes,
    };
    char why[400];
    if ((*err = broker_config_check(cfg, why, sizeof why))) {
        LOG_ERROR("%s", why);
        goto fail;
    }
    if ((int64_t)cfg->heartbeat_ms * cfg->liveness < 500)
        LOG_WARN("a peer silent for %lld ms (--heartbeat-ms %lld x --liveness %lld) is expired: "
                 "a scheduling hiccup on a loaded host ends sessions, and peers drop and "
                 "register again over and over; keep it at 1 s or more (the default is 3 s)",
                 (long long)cfg->heartbeat_ms * cfg->liveness, (long long)cfg->heartbeat_ms,
                 (long long)cfg->liveness);
    b->ledger = ledger_new(&lp, err);
    if (!b->ledger) goto fail;
    if (!(b->groups = group_table_new())) {
        *err = DFLASH_ENOMEM;
        goto fail;
    }
    broker_groups_restore(b);
    broker_restore_steering(b);
    if (cfg->endpoint[0]) {
        b->zctx = zmq_ctx_new();
        if (!b->zctx) {
            *err = DFLASH_EZMQ;
            goto fail;
        }
        if (cfg->curve_secret_key[0] && (*err = broker_security_start(b, cfg))) goto fail;
        if (!(b->router = broker_bind_socket(b, ZMQ_ROUTER, cfg->endpoint, err))) goto fail;
        if (cfg->pub_endpoint[0] &&
            !(b->pub = broker_bind_socket(b, ZMQ_PUB, cfg->pub_endpoint, err)))
            goto fail;
        b->router_watch = zloop_sock_new(loop, b->router, 64, on_router, b);
        if (!b->router_watch) {
            *err = DFLASH_EZMQ;
            goto fail;
        }
        /* from here on the loop thread never writes the journal itself */
        if ((*err = ledger_writer_start(b->ledger, loop, on_journal_done, b))) {
            LOG_ERROR("cannot start the journal writer thread: %s", err_str(*err));
            goto fail;
        }
    }
    uv_timer_init(loop, &b->cron);
    b->cron.data = b;
    uint64_t period = (uint64_t)cfg->heartbeat_ms / 4;
    if (period < 10) period = 10;
    if (period > 250) period = 250;
    b->last_cron_ms = now_ms(b); /* a stall before cron's first run is one too (stall_hold) */
    uv_timer_start(&b->cron, cron, period, period);
    b->cron_started = true;
    LOG_INFO("broker incarnation %016" PRIx64 " serving %s%s%s (pub %s), journal %s",
             b->incarnation, cfg->endpoint[0] ? cfg->endpoint : "(none)",
             cfg->bind[0] ? " and " : "", cfg->bind,
             cfg->pub_endpoint[0] ? cfg->pub_endpoint : "(none)",
             lp.journal_path ? lp.journal_path : "(memory)");
    return b;
fail:
    broker_destroy(&b);
    return NULL;
}

/* The journal's last words at a stop (its writer stopped: inline). A failing one is rewritten
 * from memory once more: the disk may take it again since the last retry (defect: a stop while
 * it was failing lost every change made since the failure, a drafter's rewind too, whose
 * batches a broker started again took for trained). A healthy one is fdatasynced: ACK and
 * HANDOUT records are not synced on their own, and a power loss right after a stop lost them. */
static void journal_at_stop(broker *b)
{
    const char *jf = ledger_journal_failure(b->ledger);
    if (!jf) {
        if (ledger_barrier(b->ledger) < 0)
            LOG_ERROR("journal %s: the last records may not be on disk: %s", b->cfg.journal,
                      ledger_journal_failure(b->ledger) ? ledger_journal_failure(b->ledger)
                                                        : "fdatasync failed");
        return;
    }
    if (ledger_journal_heal(b->ledger) == 0 && !ledger_journal_failure(b->ledger)) {
        LOG_INFO("journal %s recovered at the stop: rewritten whole from memory, it holds every "
                 "change made while it was failing", b->cfg.journal);
        return;
    }
    jf = ledger_journal_failure(b->ledger);
    LOG_ERROR("journal %s is still failing at the stop (%s): what changed since the failure is "
              "lost (a broker started on it hands out again the batches trained since, and "
              "forgets the commits and rewinds since)", b->cfg.journal, jf ? jf : "?");
}

void broker_stop(broker *b)
{
    if (!b || b->stopped) return;
    b->stopped = true;
    /* drain the journal, then answer whoever still waits for it */
    if (b->ledger) {
        ledger_writer_stop(b->ledger);
        uint64_t done_seq, fail_seq;
        ledger_journal_progress(b->ledger, &done_seq, &fail_seq);
        flush_deferred(b, done_seq, fail_seq);
        journal_at_stop(b);
    }
    zloop_sock_destroy(&b->router_watch);
    zloop_sock_destroy(&b->zap_watch);
    broker_stop_close(b);
    if (b->cron_started) {
        uv_timer_stop(&b->cron);
        uv_close((uv_handle_t *)&b->cron, NULL);
    }
}

void broker_shutdown(broker *b)
{
    if (!b || b->stopped) return;
    if (b->pending_mode == POLICY_DRAINING) {
        b->pending_mode = POLICY_RUNNING; /* for the record only: nothing is served after this */
        if (broker_journal_steering(b, NULL, 0) == 0)
            LOG_INFO("the drain ends with this stop: a broker started again on this journal runs "
                     "(a crash, unlike a stop, leaves it draining)");
    }
    broker_stop(b);
}

static void unlink_ipc_path(const char *endpoint)
{
    if (strncmp(endpoint, "ipc://", 6) == 0) unlink(endpoint + 6);
}

void broker_destroy(broker **bp)
{
    if (!bp || !*bp) return;
    broker *b = *bp;
    *bp = NULL;
    broker_stop(b);
    /* Let the close callbacks run before the memory they point into goes away. */
    if (b->loop) uv_run(b->loop, UV_RUN_NOWAIT);
    /* our ipc:// socket files go with us (they stayed behind a clean stop); removed while still
     * bound, so no broker started since can have taken the path */
    if (b->router) unlink_ipc_path(b->cfg.endpoint);
    if (b->router) unlink_ipc_path(b->cfg.bind); /* "" or tcp:// usually: nothing to do */
    if (b->pub) unlink_ipc_path(b->cfg.pub_endpoint);
    if (b->router) zmq_close(b->router);
    if (b->pub) zmq_close(b->pub);
    if (b->zap) zmq_close(b->zap);
    if (b->zctx) zmq_ctx_term(b->zctx);
    curve_keyset_clear(&b->curve_clients);
    curve_keyset_clear(&b->admin_keys);
    memset(b->curve_secret, 0, sizeof b->curve_secret);
    for (uint32_t i = 0; i < b->n_peers; i++) {
        free(b->peers[i]->held);
        free(b->peers[i]);
    }
    free(b->peers);
    while (b->dq_head) {
        deferred_reply *d = b->dq_head;
        b->dq_head = d->next;
        free(d);
    }
    for (int i = 0; i < MAX_POOLS; i++) {
        free(b->pools[i].events);
        free(b->pools[i].n_seqs);
    }
    policy_destroy(&b->policy);
    group_table_destroy(&b->groups);
    ledger_destroy(&b->ledger);
    free(b->inbuf);
    free(b->outbuf);
    free(b);
}

uint64_t broker_incarnation(const broker *b) { return b->incarnation; }

void broker_set_sync_hook(broker *b, journal_sync_fn fn, void *ctx)
{
    ledger_set_sync_hook(b->ledger, fn, ctx);
}
