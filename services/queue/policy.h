/* policy: the broker's bucket policy, slot lifecycle and leases (DESIGN.md section 4). Pure
 * logic: no sockets, no clock of its own (every call that needs time takes now_ms), no I/O.
 *
 * Data: pools (one per target incarnation's slot arena) hold slots; each slot is
 *
 *   from \ to   FREE   FILLING      READY          LEASED   FENCED
 *   FREE         -     work_start   slot_ready(*)    -      slot_fence
 *   FILLING   drop(**)    -         slot_ready       -        -
 *   READY     quarantine  -            -           claim      -
 *   LEASED     release(+)  -     expiry/drop_worker   -        -
 *   FENCED    tick(***)   -            -             -        -
 *   (*) the target filled a different FREE slot than suggested, or (after a broker restart) an
 *       adopted batch: the slot passes through FILLING. (**) work moved to another slot.
 *   (***) policy_tick at or after the slot's fence deadline.
 *   (+) also expiry, drop_worker and revoke of a lease whose batch a late ack recorded trained
 *       meanwhile (policy_lease_trained): FREE, never READY again.
 *
 * Restart fence: a target that re-registers its pool (the broker restarted, or dropped the pool
 * while leases on it were out) names the slots it published and has not been handed back since;
 * a drafter may still be copying one under a lease this policy never saw. The broker fences each
 * such slot (policy_slot_fence) until one lease timeout after the registration: FENCED slots are
 * never handed out for filling and never accept a SLOT_READY. Safe because every lease the policy
 * cannot see was granted before the registration, and a drafter finishes its copy within a lease
 * timeout of its grant (the premise every lease rests on; copies take micro- to milliseconds).
 * FENCED slots count in no bucket and not against max_depth.
 *
 * One set_state() asserts these transitions and keeps the per-bucket counters (filling, ready,
 * leased) exact. Ready slots of each bucket sit in a FIFO (oldest first).
 *
 * Rules: max_depth caps filling+ready+leased (work requests get DFLASH_EFULL at the cap). A work
 * request goes to the bucket with the largest ready deficit share(b)*T - (ready(b) + filling(b)),
 * T = max(min_ready, ready+filling+1): below min_ready this is DESIGN's share*min_ready - ready
 * (filling counts: it will be ready soon); above it the buffer deepens in proportion to the
 * shares (ties to the lower bucket; stats report deficit with T = min_ready). A claim is served
 * only while ready >= min_ready, except when draining or flushing (epoch end: nothing more can be
 * produced); it takes, among buckets with a ready slot, the one whose consumed-token share lags its
 * dataset share most (lag = share(b)*consumed_total - consumed(b), counted since the shares were
 * last set), oldest slot first. A lease lasts lease_timeout_ms past the grant or the worker's last
 * heartbeat; an expired lease (or a dead worker) puts the slot back to READY and counts a
 * redelivery of its batch; past max_redeliveries (or when sink->failed says so: the broker's count
 * in the ledger, which survives re-production) the batch is quarantined: the slot goes FREE and
 * the sink is told (the broker tells the ledger and returns the slot to its target).
 *
 * Mode: RUNNING (normal), PAUSED (no work units, no grants; leases run on), DRAINING (no work
 * units; claims served regardless of min_ready). Every mode may follow every other: pause, resume
 * and drain are legal from anywhere.
 *
 * Thread: single-threaded, the broker's loop thread. Callers: broker.c, tests, bench/mix.
 */
#ifndef DFLASH_QUEUE_POLICY_H
#define DFLASH_QUEUE_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "ledger.h" /* batch_id */

#define POLICY_MAX_BUCKETS LEDGER_MAX_BUCKETS
#define POLICY_MAX_WINDOW 65536u

typedef struct policy policy;

typedef enum { POLICY_RUNNING = 0, POLICY_PAUSED, POLICY_DRAINING } policy_mode;
typedef enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_LEASED, SLOT_FENCED } slot_state;

typedef struct {
    uint32_t n_buckets;                             /* 1..POLICY_MAX_BUCKETS */
    uint32_t bucket_max_len[POLICY_MAX_BUCKETS];    /* upper sequence length, informational */
    uint32_t min_ready;                             /* reservoir; 0 serves at once */
    uint32_t max_depth;                             /* >= 1; cap on filling+ready+leased */
    uint32_t lease_timeout_ms;                      /* >= 1 */
    uint32_t max_redeliveries;                      /* quarantine when redelivered more often */
    uint32_t mix_window;                            /* N claims for the TV metric, 1..MAX_WINDOW */
    uint64_t first_lease_id;                        /* lease ids count up from here (>0); use the
                                                       broker incarnation in the high bits */
} policy_params;

/* Events the policy cannot resolve itself; the broker forwards them to the ledger/target.
 * Callbacks run synchronously inside the policy call that caused them; they must not call back
 * into the policy. Any callback may be NULL. */
typedef struct {
    void *ctx;
    /* A batch lost its slot (pool dropped while FILLING/READY, or a detached lease expired):
     * back to to-do. */
    void (*requeue)(void *ctx, const batch_id *b);
    /* A batch was redelivered more than max_redeliveries times: quarantine it. Its slot
     * (pool_id, incarnation, slot) is FREE now and must be handed back to its target. */
    void (*quarantine)(void *ctx, const batch_id *b, uint32_t pool_id, uint64_t incarnation,
                       uint32_t slot);
    /* A lease of b ended without a release (expired, or its worker dropped). Returns true to
     * quarantine b now. NULL: the policy's own count decides (redelivered > max_redeliveries);
     * the broker counts in the ledger instead, so the count survives re-production. */
    bool (*failed)(void *ctx, const batch_id *b);
} policy_sink;

/* Where a batch lives: returned by work_start, release, claim. */
typedef struct {
    uint32_t pool_id;
    uint64_t incarnation;
    uint32_t slot;
    batch_id batch;
    uint32_t n_tokens; /* 0 until the slot is ready */
} policy_slot_ref;

typedef struct {
    uint64_t lease_id;    /* unique for this policy object */
    uint64_t worker_id;
    uint64_t deadline_ms; /* now + lease_timeout at grant; heartbeats extend it */
    uint32_t deliveries;  /* grants of this batch from this slot: 1, 2 after one expiry, ...
                           * (produced again into a slot, a batch starts at 1 there) */
    policy_slot_ref where;
} policy_grant;

typedef struct {
    double share;            /* dataset token share (normalized) */
    uint32_t bucket_max_len;
    uint32_t ready, leased, filling;
    double deficit;          /* share*min_ready - (ready+filling) */
    uint64_t produced_batches, produced_tokens; /* slots that became ready (first time) */
    uint64_t consumed_batches, consumed_tokens; /* first grants from a slot (not after expiry) */
    double window_share;     /* token share of this bucket in the last mix_window claims */
} policy_bucket_stats;

typedef struct {
    policy_mode mode;
    bool flush;
    uint32_t n_buckets, n_pools, n_slots;
    uint32_t min_ready, max_depth, lease_timeout_ms, max_redeliveries, mix_window;
    uint32_t ready, leased, filling; /* totals */
    uint32_t fenced;                 /* FENCED slots (restart fence, see above) */
    double mix_tv;                   /* TV(consumed mix over the window, dataset mix); 0 if empty */
    uint32_t window_claims;          /* claims in the window (<= mix_window) */
    uint64_t claims, releases, work_units, lease_expiries, quarantined;
    uint64_t stale_releases;         /* releases of unknown or expired leases, and releases
                                      * the broker refused (policy_release_refused) */
    uint32_t detached_leases;        /* leases outliving their dropped pool */
    policy_bucket_stats bucket[POLICY_MAX_BUCKETS];
} policy_stats;

/* Fills p with defaults: 4 buckets (512/1024/2048/3072), equal shares, min_ready 30,
 * max_depth 90, lease 5000 ms, 3 redeliveries, window 1000, first lease id 1. */
void policy_params_default(policy_params *p);

/* New policy with no pools; shares start equal. NULL on invalid params (logged) or no memory.
 * sink may be NULL; it is copied. */
policy *policy_new(const policy_params *params, const policy_sink *sink);
/* Frees; accepts NULL and NULLs *p. */
void policy_destroy(policy **p);

/* --- pools (targets) ------------------------------------------------------------------------ */

/* Registers a pool of n_slots slots, all FREE. A pool_id already registered with another
 * incarnation is dropped first (policy_pool_drop semantics: its batches requeued via the sink).
 * DFLASH_EEXISTS same pool_id and incarnation (re-registration is a no-op), DFLASH_EINVAL
 * n_slots 0 or > 1<<20, DFLASH_ENOMEM. */
int policy_pool_add(policy *p, uint32_t pool_id, uint64_t incarnation, uint32_t n_slots,
                    uint64_t slot_bytes);
/* Drops a pool (its target died or restarted): every FILLING/READY batch is reported via
 * sink->requeue at once. A LEASED one becomes a detached lease: its worker may have copied it, so
 * a release ends it normally (where->incarnation is the old one: do not hand the slot to the new
 * target); expiry or drop_worker requeues its batch. DFLASH_ENOTFOUND unknown pool. */
int policy_pool_drop(policy *p, uint32_t pool_id);
/* Leases of pool (pool_id, incarnation) still out after it was dropped (detached: neither
 * released nor expired): drafters may be copying its slots, so its target keeps the memory while
 * this is > 0 (a target's leave, broker_leave.c). Pure. */
uint32_t policy_detached_leases(const policy *p, uint32_t pool_id, uint64_t incarnation);
/* Restart fence: a FREE slot of pool_id -> FENCED until until_ms (policy_tick lifts it). The
 * slot is not handed out for filling and refuses SLOT_READY meanwhile. DFLASH_ENOTFOUND unknown
 * pool, DFLASH_ERANGE slot out of range, DFLASH_ESTATE slot not FREE. */
int policy_slot_fence(policy *p, uint32_t pool_id, uint32_t slot, uint64_t until_ms);
/* A work request of pool_id's target, which fills one work unit at a time and asks for the next
 * only once the last is reported (or given up): a slot of that pool still FILLING will never be
 * reported (the work unit's reply or the slot ready was lost to a timeout). Each goes FREE and
 * its batch is reported via sink->requeue. Returns how many (0 unknown pool). */
uint32_t policy_pool_drop_filling(policy *p, uint32_t pool_id);
/* Incarnation of a registered pool, 0 if unknown. */
uint64_t policy_pool_incarnation(const policy *p, uint32_t pool_id);

/* --- producer side ---------------------------------------------------------------------------- */

/* Dataset token shares per bucket (target registration or live set). n must equal n_buckets;
 * values >= 0, sum > 0; normalized here. Resets the consumed-share lag counters. DFLASH_EINVAL. */
int policy_set_shares(policy *p, uint32_t n, const double *shares);

/* Step 1 of a work request from pool_id: which bucket to produce. avail_mask: buckets that have
 * work to do (ledger_todo_mask). Returns 0 with *bucket = the available bucket with the largest
 * ready deficit; DFLASH_EFULL at max_depth or no FREE slot in that pool; DFLASH_ESTATE paused or
 * draining; DFLASH_ENOTFOUND no available bucket; DFLASH_ESTALE unknown pool. No state change. */
int policy_next_bucket(policy *p, uint32_t pool_id, uint32_t avail_mask, uint32_t *bucket);

/* Step 2 (after ledger_next_todo gave the batch): a FREE slot of pool_id -> FILLING with batch.
 * *slot = the slot suggested to the target. DFLASH_EFULL no FREE slot, DFLASH_ESTALE pool. */
int policy_work_start(policy *p, uint32_t pool_id, const batch_id *batch, uint32_t *slot);

/* True if batch is FILLING in pool_id (issued by this broker). A SLOT_READY for a batch that is
 * not (broker restarted) must first be adopted by the ledger (ledger_adopt). */
bool policy_is_filling(const policy *p, uint32_t pool_id, const batch_id *batch);

/* SLOT_READY: the target wrote batch (n_tokens tokens) into slot. The slot (FREE or FILLING)
 * -> READY; a FILLING slot elsewhere holding the same batch goes FREE. DFLASH_ESTALE wrong
 * incarnation or unknown pool, DFLASH_ERANGE slot or bucket out of range, DFLASH_ESTATE slot is
 * READY/LEASED (the target rewrote a slot it does not own: a protocol error). */
int policy_slot_ready(policy *p, uint32_t pool_id, uint64_t incarnation, uint32_t slot,
                      const batch_id *batch, uint32_t n_tokens);

/* A late ack recorded batch b trained (its drafter trained it before a broker restart gave it
 * back to to-do, and it was handed out again): the FILLING or READY slot holding it goes FREE,
 * so it is neither granted nor trained again (a SLOT_READY for a slot freed while FILLING then
 * counts as the target's report of a batch this policy did not hand out; the broker refuses the
 * adopt of a trained batch). 0 with *where (optional) naming the slot, or DFLASH_ENOTFOUND when
 * no FILLING or READY slot holds b. A LEASED slot is left alone: its drafter may be copying it. */
int policy_batch_trained(policy *p, const batch_id *b, policy_slot_ref *where);

/* Whether a delivery of b is live in the policy: a FILLING, READY or LEASED slot, or a detached
 * lease, holds it. No state change. */
bool policy_holds_batch(const policy *p, const batch_id *b);

/* The same while a lease on b is out (the batch was handed out again and granted to another
 * worker, who may be copying it now): the slot stays LEASED, but the lease ends in FREE, not
 * READY, whichever way it ends (release, expiry, drop_worker, revoke): b is not granted again,
 * and its expiry counts no failed delivery. A detached lease needs nothing (its expiry's requeue
 * of a trained batch is refused by the ledger). 0 with *g (optional) naming the lease (id,
 * worker, slot), or DFLASH_ENOTFOUND when no lease holds b. The caller refuses that lease's
 * release (broker.c: Error STALE, the worker drops its copy). */
int policy_lease_trained(policy *p, const batch_id *b, policy_grant *g);

/* The broker refused a release that policy_release took (its batch was trained meanwhile: the
 * drafter drops its copy): counted as a stale release, not as a release (status `releases` is
 * the slots given back after a copy the drafter keeps). */
void policy_release_refused(policy *p);

/* --- consumer side ---------------------------------------------------------------------------- */

/* A claim by worker_id at now_ms. 0 with *grant (slot READY -> LEASED); DFLASH_EAGAIN when the
 * reservoir is below min_ready (not draining/flushing) or nothing is ready: the caller parks the
 * claim and retries after slot_ready / set / tick; DFLASH_ESTATE when paused. */
int policy_claim(policy *p, uint64_t worker_id, uint64_t now_ms, policy_grant *grant);

/* How many claims in a row would be served now (0 when paused): every READY slot when draining
 * or flushing, else ready - min_ready + 1 when ready >= min_ready (each claim needs the reservoir
 * at min_ready before it), else 0. A group step reserves its R slots only when this is >= R.
 * Pure. */
uint32_t policy_claimable(const policy *p);

/* Takes a lease back without blaming its batch (a group step was aborted): LEASED -> READY at the
 * head of its FIFO, deliveries unchanged, nothing counted as a redelivery; a detached lease's
 * batch goes back to to-do via sink->requeue. The holder's later release gets DFLASH_ESTALE (it
 * drops its copy; a copy of a READY slot is harmless: the target rewrites only FREE slots).
 * DFLASH_ESTALE unknown or already released/expired lease. */
int policy_lease_revoke(policy *p, uint64_t lease_id);

/* The worker copied the slot: LEASED -> FREE. *where (optional) tells the caller which slot to
 * hand back to its target. DFLASH_ESTALE unknown or expired lease (counted in stale_releases). */
int policy_release(policy *p, uint64_t lease_id, policy_slot_ref *where);

/* The worker a live or detached lease was granted to, into *worker_id: 0, or DFLASH_ESTALE for an
 * unknown or ended lease. The broker refuses a release from any other peer. */
int policy_lease_worker(const policy *p, uint64_t lease_id, uint64_t *worker_id);

/* Extends every lease of worker_id to now_ms + lease_timeout. Returns 0 (also with no leases). */
int policy_heartbeat(policy *p, uint64_t worker_id, uint64_t now_ms);

/* The worker is gone: each of its leases ends as if expired (READY again, redelivery counted,
 * possibly quarantined). Returns 0. */
int policy_drop_worker(policy *p, uint64_t worker_id);
/* Leases worker_id holds now, detached ones included (granted, neither released nor expired):
 * what a stopping broker waits for (broker_stop.c). Pure. */
uint32_t policy_worker_leases(const policy *p, uint64_t worker_id);

/* Expires leases with deadline <= now_ms (READY again + redelivery, or quarantine) and lifts
 * restart fences with deadline <= now_ms (FENCED -> FREE). Returns 0. */
int policy_tick(policy *p, uint64_t now_ms);

/* Earliest lease deadline (for the broker's timer), UINT64_MAX when no lease is held. */
uint64_t policy_next_deadline(const policy *p);

/* --- live settings and modes --------------------------------------------------------------- */

int policy_set_min_ready(policy *p, uint32_t min_ready);          /* any value; 0 or code */
int policy_set_max_depth(policy *p, uint32_t max_depth);          /* >= 1 (lowering never evicts) */
/* >= 1 ms; applies to new grants and heartbeats. */
int policy_set_lease_timeout(policy *p, uint32_t lease_timeout_ms);
int policy_set_max_redeliveries(policy *p, uint32_t n);
/* Sets the mode (pause/resume/drain). DFLASH_EINVAL for an unknown mode value. */
int policy_set_mode(policy *p, policy_mode mode);
policy_mode policy_get_mode(const policy *p);
/* Epoch end / nothing more can be produced: serve claims below min_ready. */
void policy_set_flush(policy *p, bool flush);
/* True when draining (or flushing) and nothing is filling, ready or leased. */
bool policy_drained(const policy *p);

/* --- stats ---------------------------------------------------------------------------------- */

void policy_get_stats(const policy *p, policy_stats *out);
/* State of one slot (tests, status). DFLASH_ENOTFOUND / DFLASH_ERANGE. */
int policy_slot_get(const policy *p, uint32_t pool_id, uint32_t slot, slot_state *state,
                    batch_id *batch);

/* Total-variation distance 0.5 * sum |a_i/sum(a) - b_i/sum(b)| between two non-negative weight
 * vectors of length n (each normalized here); 0 when either sums to 0. Pure. */
double policy_tv_distance(uint32_t n, const double *a, const double *b);

const char *policy_mode_name(policy_mode m);
const char *slot_state_name(slot_state s);

#endif
