/* group: the broker's data-parallel drafter groups (issue 7; docs/protocol.md "Groups"). Pure
 * logic like policy.h: no sockets, no clock, no ledger or policy calls. The broker
 * (broker_groups.c) turns requests into calls here and carries out the outcomes they return
 * (reserve the step's slots in the policy, ack or requeue the step's batches in the ledger).
 *
 * A group is a named set of drafter peers training one model: the members (in join order), an
 * epoch, the ranks 0..world-1 of that epoch (join order of the admitted members), the rendezvous
 * id rank 0 posts (<= GROUP_ID_BYTES opaque bytes), the model step rank 0 reported (base_step:
 * the group's next optimizer step is base_step + 1), and at most one *step* in flight: world
 * reserved slots of step base_step + 1 per micro-step, one lease per rank each. Every rank trains the model of the
 * group, so every member must have its drafter shape: that of its first member (rank 0, or the
 * next epoch's rank 0; group_shape_of), as the members' joins state them; a newcomer stating
 * another is refused before it joins (the ranks' state sync would turn it away only after the
 * group had re-formed for it, and re-form again without it). The same holds for the group's
 * gradient accumulation A (micro-steps per step, group_shape.accumulate; 1 when not stated).
 *
 * Micro-steps (A > 1): a step is trained as A micro-steps 0..A-1, each one slot per rank; the
 * first claim of (step, k) reserves micro-step k's world slots at once (all or nothing, as a
 * step's without accumulation), k only once k-1 is reserved (a rank claims k after its grant
 * of k-1), so the slots are ordered micro-major: slots[k * step_world + rank]. The step's units
 * are all its micro-steps' (world x micros <= GROUP_MAX_UNITS); its resolution (ACK, ABORT,
 * orphan) covers all of them, as it covers one micro-step's. A step that can never get its
 * next micro-step (the plan is done, a drain, the broker stops) *ends* there: group_step_end
 * records the micro-steps it closes with, and every claim of a later micro-step of it gets the
 * same answer (sticky), so every rank closes the step with the same batches.
 *
 * Group states (one set_state in group.c asserts the transitions):
 *
 *   from \ to    FORMING                    ACTIVE          REFORMING
 *   FORMING      new epoch (a join, a fail)  rank 0 posts id member gone
 *   ACTIVE       new epoch (join at a step   -               member gone / failed, or a join
 *                boundary, no step in flight)                while a step is in flight (**)
 *   REFORMING    new epoch (step resolved)   -               -
 *   (**) a joiner waits ("pending") until the step in flight is done or aborted: membership
 *        changes take effect only at step boundaries. ACTIVE -> REFORMING happens for a join only
 *        when the step ends (StepDone); then the new epoch forms at once.
 *
 * A step in flight when its epoch ends is *resolved* before the next epoch forms, by the member
 * whose model the next epoch starts from: the surviving admitted member that joined first (it
 * becomes rank 0; it is rank 0 of the ending epoch whenever that one is alive). Its StepDone
 * means the update happened (ACK: all its units trained at that step); its GroupJoin reports
 * its model step: >= the step's number means the update happened (ACK), else ABORT (every unit
 * back to to-do). If no admitted member survives, the group continues from the model of whoever
 * forms its next epoch: the first joiner waiting for the boundary (the step is resolved by the
 * model step its GroupJoin reported, as above: a former rank that expired and came back holds
 * the update, a newcomer does not), or, with nobody left, whoever creates the group again. In that last case the ranks
 * may well be alive (all expired by the broker while they trained: a paused node, a network
 * blip) and their models updated, so the step is *orphaned*, not aborted: its units stay in
 * flight (not produced again) and the join that creates the group again resolves it by the
 * creator's model step as above (ACK or ABORT); one nobody comes back for within the broker's
 * --group-hold-ms is aborted (group_orphan_expire). An orphaned step survives a broker restart:
 * the broker journals the orphans (group_orphans_encode) and a broker started on that journal
 * restores them (group_orphans_restore), to be resolved the same way; their units stay in flight
 * meanwhile, not given back with the ledger's restart orphans. A step with a unit no rank copied
 * cannot have been trained: it is aborted at once. So the ledger always matches the model the group
 * continues with: no batch is lost and none is trained twice.
 *
 * Thread: the broker's loop thread. Callers: broker_groups.c, broker.c, tests.
 */
#ifndef DFLASH_QUEUE_GROUP_H
#define DFLASH_QUEUE_GROUP_H

#include "ledger.h" /* batch_id */

#include <stdbool.h>
#include <stdint.h>

#define GROUP_ID_BYTES 128
#define GROUP_MAX_WORLD 64
#define GROUP_MAX_GROUPS 64
#define GROUP_MAX_NAME 64
#define GROUP_SHAPE_TEXT 128 /* WIRE_MAX_SHAPE_TEXT */
#define GROUP_MAX_UNITS 64   /* units of one step: world x accumulate (WIRE_MAX_WORLD) */

typedef enum { GROUP_FORMING = 0, GROUP_ACTIVE, GROUP_REFORMING } group_state;

/* A member's drafter shape as its join stated it (GroupJoin.shape, shape_text): the layout
 * hash that the ranks' state sync compares, and the same in words. hash 0: not stated (an
 * older drafter). accumulate: its micro-steps per step (GroupJoin.accumulate; 0 = not stated,
 * taken as 1), which every member must share, stated or not. */
typedef struct group_shape {
    uint64_t hash;
    char text[GROUP_SHAPE_TEXT];
    uint32_t accumulate;
} group_shape;

typedef struct group_entry {
    uint64_t peer;  /* the drafter's incarnation (the policy's worker id) */
    char name[GROUP_MAX_NAME];
    uint64_t join_seq;
    bool admitted;  /* a rank of the current epoch (false: waiting for a step boundary) */
    uint64_t model_step; /* the model step its last GroupJoin reported */
    uint32_t rank;  /* when admitted */
    group_shape shape; /* stated by its first join */
} group_entry;

/* One rank's share of a step: its lease and where the batch lives (to answer a retried claim). */
typedef struct group_slot {
    uint64_t peer;
    uint64_t lease_id;
    batch_id batch;
    bool released; /* the rank released the lease (copied the slot) */
    uint32_t pool_id, slot, n_tokens;
    uint64_t pool_incarnation;
} group_slot;

typedef struct group_s {
    char name[GROUP_MAX_NAME];
    group_state state;
    uint64_t epoch;      /* >= 1 once formed */
    uint64_t base_step;  /* rank 0's model step; next step = base_step + 1 */
    uint32_t world;      /* admitted members */
    group_entry members[GROUP_MAX_WORLD]; /* join order */
    uint32_t n_members;
    uint8_t id[GROUP_ID_BYTES];
    uint32_t id_len;     /* 0 until rank 0 posts it */
    /* the step in flight */
    bool step_active;
    uint64_t step, step_epoch;
    group_slot slots[GROUP_MAX_UNITS]; /* [micro * step_world + rank] */
    uint32_t step_world;
    uint32_t step_micros;     /* micro-steps reserved (>= 1) */
    uint32_t step_accumulate; /* micro-steps the step has when it does not end early (A) */
    uint32_t step_end;        /* 0, or the micro-steps it ended with (group_step_end; sticky) */
    uint64_t resolver;   /* REFORMING with a step in flight: whose word resolves it (0 none) */
    /* history */
    uint64_t done_epoch, done_step;       /* the last step acked */
    uint64_t steps_done, steps_aborted;
    uint32_t widest;     /* the most ranks an epoch of it had */
    uint64_t next_seq;
    uint64_t rewind_seq; /* the broker's journal record of the rewind that created it (0: none) */
} group;

typedef enum { GROUP_KEEP = 0, GROUP_ACK, GROUP_ABORT } group_verdict;

/* What the broker must do after a call: ACK = ledger-ack every slot's batch at `step`; ABORT =
 * revoke unreleased leases and requeue released batches; `created` = the group was created by
 * this join (the broker rewinds the ledger to the joiner's model step, as ResumeFrom would). */
typedef struct group_outcome {
    group_verdict verdict;
    uint64_t step;
    uint32_t n_slots;
    group_slot slots[GROUP_MAX_UNITS];
    bool created;
    bool new_epoch; /* a new epoch formed */
    bool orphan;    /* step `step` was orphaned now (KEEP), or the verdict resolves an orphan */
} group_outcome;

typedef struct group_table group_table;

group_table *group_table_new(void);
void group_table_destroy(group_table **t);
uint32_t group_count(const group_table *t);
group *group_at(group_table *t, uint32_t i);
group *group_find(group_table *t, const char *name);
/* The member entry of peer in g, or NULL. */
group_entry *group_entry_of(group *g, uint64_t peer);
/* The group peer belongs to (at most one), or NULL. */
group *group_of_peer(group_table *t, uint64_t peer);
/* The size a join would give g (members incl. pending + 1); for the max_depth rule. */
uint32_t group_largest(const group_table *t);

/* GroupJoin from peer (shape: its drafter's, NULL or hash 0 when not stated, with its
 * accumulation: NULL or 0 is 1; model_step: its
 * optimizer steps; failed_epoch: the epoch whose collective failed there, 0 none). Creates the
 * group (resolving a step orphaned under its name by model_step), adds the peer (pending) or
 * treats a member's join as a poll, a failure (failed_epoch == epoch while FORMING/ACTIVE: the
 * epoch ends) or the resolver's word on a step in flight; forms a new epoch when it can.
 * max_world: refuse growing past it. Returns 0 (*g set; the peer's view is current when its
 * member entry is admitted and the group is FORMING or ACTIVE), DFLASH_EFULL (max_world),
 * DFLASH_EEXISTS (peer is in another group), DFLASH_ENOMEM (too many groups),
 * DFLASH_EMISMATCH (a new member whose stated shape differs from the group's,
 * group_shape_of: it would be turned away at the state sync, after the group re-formed for
 * it; or whose accumulation differs from the group's, group_accumulate; nothing changed, *g
 * set), DFLASH_EFULL also when world x accumulation would exceed GROUP_MAX_UNITS. out gets
 * the outcome. */
int group_join(group_table *t, const char *name, uint64_t peer, const char *peer_name,
               const group_shape *shape, uint64_t model_step, uint64_t failed_epoch,
               uint32_t max_world, group **g, group_outcome *out);

/* The member whose drafter shape is g's: its first member, whose model the group goes on from
 * (rank 0, or the next epoch's rank 0), or NULL when it has none or stated no shape (then any
 * joiner is taken, as before shapes were stated). A group left empty is deleted, so the join
 * that creates it again, of whatever shape, defines its shape anew. */
const group_entry *group_shape_of(const group *g);
/* The group's micro-steps per step: its first member's (1 when it stated none). */
uint32_t group_accumulate(const group *g);

/* Deletes g (no step in flight): its members are none, their next group request finds no group
 * (a join creates it anew). For a group whose every member lacks its model (broker_groups.c). */
void group_dissolve(group_table *t, group *g);

/* The peer died, was replaced, or said goodbye: it leaves its group (if any); the epoch ends if
 * it was a rank; a step in flight is resolved, waits for its resolver, or is orphaned (the peer
 * was the last member). A group left empty is deleted after the outcome is filled. Returns true
 * if the peer was in a group. */
bool group_leave(group_table *t, uint64_t peer, group_outcome *out);

/* Rank 0 posts the rendezvous id of epoch: FORMING -> ACTIVE. 0, DFLASH_ESTALE (another epoch or
 * not FORMING/ACTIVE), DFLASH_EDENIED (not rank 0), DFLASH_EEXISTS (a different id is set). */
int group_set_id(group *g, uint64_t peer, uint64_t epoch, const uint8_t *id, uint32_t len);

/* Checks a StepClaim: 0 when a step is in flight for (epoch, step) (*slot = the peer's share)
 * or none is and one may be reserved (*slot NULL: call group_step_begin after reserving);
 * DFLASH_ESTALE the peer is not a rank of the current epoch or the epoch ended (re-form),
 * DFLASH_EAGAIN forming (no id yet) or the step after the one in flight (its StepDone has not
 * arrived yet), DFLASH_ESTATE wrong step number. */
int group_step_check(group *g, uint64_t peer, uint64_t epoch, uint64_t step, group_slot **slot);
/* The same for micro-step `micro` of the step (group_step_check is micro 0): *slot the peer's
 * share of a reserved micro-step; *slot NULL for the next one to reserve (group_step_begin for
 * micro 0, group_step_add for the others); DFLASH_ESHUTDOWN when the step ended before it
 * (group_step_end: the caller answers every rank the same); DFLASH_ESTATE also for a micro-step
 * past the next one or past the group's accumulation. */
int group_micro_check(group *g, uint64_t peer, uint64_t epoch, uint64_t step, uint32_t micro,
                      group_slot **slot);
/* Records the reserved slots (by rank, world entries) as micro-step 0 of the step in flight. */
void group_step_begin(group *g, uint64_t step, const group_slot *slots);
/* Records the reserved slots (by rank, world entries) of the step's next micro-step. */
void group_step_add(group *g, const group_slot *slots);
/* The step in flight can never get its next micro-step (the plan is done, a drain, the broker
 * stops): it ends with the micro-steps reserved (>= 1). Later claims of it get
 * DFLASH_ESHUTDOWN from group_micro_check. */
void group_step_end(group *g);
/* An orphaned step whose group nobody created again within wait_ms is aborted (its units back
 * to to-do, trained by whoever trains next): the ranks are taken for gone (restarted from a
 * checkpoint, whose model lacks the step, or stopped for good), and the plan's epochs could not
 * end while the units stay in flight. Called periodically with the caller's clock: an orphan's
 * wait counts from the first call that sees it. True with out (ABORT, orphan) and the group's
 * name filled for one expired orphan (call again until false). */
bool group_orphan_expire(group_table *t, uint64_t now_ms, uint64_t wait_ms,
                         char name[GROUP_MAX_NAME], group_outcome *out);
/* The orphaned steps waiting for their group (group_orphan_expire has not aborted them). */
uint32_t group_orphan_count(const group_table *t);
/* The i-th orphaned step (i < group_orphan_count) as dflash-ctl status shows it: its group's name,
 * its step, its units, and how long it has waited at now_ms (0 until group_orphan_expire first
 * saw it: its wait counts from there). False when i is out of range. */
typedef struct group_orphan_info {
    char name[GROUP_MAX_NAME];
    uint64_t step;
    uint32_t n_units;
    uint64_t waited_ms;
} group_orphan_info;
bool group_orphan_get(const group_table *t, uint32_t i, uint64_t now_ms, group_orphan_info *out);

/* The orphaned steps survive a broker restart through its journal (broker_groups.c journals these
 * bytes as the ledger's GROUP_ORPHANS record; format in docs/formats.md): each one's group name,
 * step and units. group_orphans_encode writes them into buf: the length (0: none) or
 * DFLASH_ENOMEM when cap is too small (GROUP_ORPHANS_MAX_BYTES always suffices). */
#define GROUP_ORPHANS_MAX_BYTES (GROUP_MAX_GROUPS * (GROUP_MAX_NAME + 8 + 4 + 12 * GROUP_MAX_UNITS))
int group_orphans_encode(const group_table *t, uint8_t *buf, uint32_t cap);
/* Restores the steps group_orphans_encode wrote into t (no orphans yet: a broker starting on its
 * journal), for the join that creates each group again to resolve as before the restart; their
 * wait for group_orphan_expire starts again at its next call. unit_stands(ctx, id) says whether
 * a unit is still in flight (the broker: in the ledger, and takes it from the ledger's restart
 * orphans); a step keeps the units that stand, one with none is dropped. Returns the steps
 * restored, or DFLASH_ECORRUPT (malformed bytes: nothing restored). */
int group_orphans_restore(group_table *t, const uint8_t *p, uint32_t len,
                          bool (*unit_stands)(void *ctx, const batch_id *id), void *ctx);
/* True when id is a copied unit of a step in flight or orphaned: the step owns it until it is
 * resolved (a dead member's copy may be in the model the group continues with). */
bool group_owns_batch(const group_table *t, const batch_id *id);
/* The slot of a released lease (any group), or NULL. */
group_slot *group_slot_of_lease(group_table *t, uint64_t lease_id);

/* StepDone from peer: ACK when (epoch, step) is the step in flight and peer is rank 0 of its
 * epoch and still a member (also while re-forming); then a waiting join forms a new epoch. Returns 0 (out->verdict
 * ACK, or KEEP for a duplicate of the last acked step), DFLASH_EDENIED (not rank 0),
 * DFLASH_ESTALE (the step was aborted or is unknown). */
int group_step_done(group_table *t, group *g, uint64_t peer, uint64_t epoch, uint64_t step,
                    group_outcome *out);

const char *group_state_name(group_state s);

#endif
