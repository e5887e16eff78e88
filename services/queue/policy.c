/* policy: the broker's bucket policy, slot lifecycle and leases (rules in policy.h).
 *
 * Structure: an array of pools, each owning an array of slots. A slot carries its state, its
 * batch and token count, its lease (id, worker, deadline) and how often its batch was redelivered.
 * READY slots of bucket b form a doubly linked FIFO (ready_head[b] oldest); LEASED slots are kept
 * in a dense array (leased[], slot->lease_pos) so ticks, heartbeats and releases touch only them.
 * Counters per bucket (filling, ready, leased) change only in set_state(), which asserts the
 * transition table of policy.h:
 *   FREE -> FILLING | FENCED;  FILLING -> READY | FREE;  READY -> LEASED | FREE;
 *   LEASED -> READY | FREE;  FENCED -> FREE.
 * FENCED slots carry fence_until_ms; policy_tick lifts the fences that are due (n_fenced > 0
 * only right after a target re-registered with busy slots, so the scan costs nothing otherwise).
 * Consumption accounting: consumed tokens per bucket since the shares were last set (the lag of
 * the choice rule, clamped so that a long-starved bucket cannot take a burst of claims), lifetime
 * produced/consumed counters, and a ring of the last mix_window claims (bucket, tokens) with
 * per-bucket token sums for the TV metric.
 *
 * Leases of a dropped pool become *detached* (detached[]): the worker may have copied the batch
 * before the target died, so its release just ends the lease; if it expires instead (or the
 * worker dies) the batch is requeued through the sink.
 *
 * A LEASED slot whose batch a late ack recorded trained (policy_lease_trained: the batch had been
 * handed out again to another worker) is marked `trained`: the lease ends as always, but in FREE
 * whatever ends it (release, expiry, the worker's drop, a revoke), never READY: a trained batch
 * is not granted again and its expiry is no failed delivery.
 *
 * Thread: the broker's loop thread only. Callers: broker.c, tests, bench/mix.
 */
#include "policy.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"

typedef struct pool pool;

typedef struct slot {
    pool *pool;
    uint32_t index;
    slot_state state;
    batch_id batch;
    uint32_t n_tokens;
    uint32_t redelivered;      /* expiries of this batch in this slot */
    bool granted;              /* granted before (counted in the mix); a revoked lease leaves it */
    struct slot *prev, *next;  /* ready FIFO of its bucket */
    uint64_t lease_id, worker_id, deadline_ms;
    uint32_t lease_pos;        /* index in policy.leased while LEASED */
    bool trained;              /* LEASED: its batch was trained meanwhile (policy_lease_trained):
                                  the lease ends in FREE, never READY */
    uint64_t fence_until_ms;   /* while FENCED: when it may go FREE */
} slot;

struct pool {
    uint32_t id;
    uint64_t incarnation;
    uint32_t n_slots, n_free, n_filling;
    uint64_t slot_bytes;
    slot *slots;
};

typedef struct {
    uint8_t bucket;
    uint32_t tokens;
} window_entry;

/* A lease whose pool was dropped while it was held: the worker may still have copied the batch,
 * so the batch is requeued only if the lease ends without a release. */
typedef struct {
    uint64_t lease_id, worker_id, deadline_ms;
    policy_slot_ref where;
} detached_lease;

struct policy {
    policy_params prm;
    policy_sink sink;
    policy_mode mode;
    bool flush;
    double share[POLICY_MAX_BUCKETS];
    pool **pools;
    uint32_t n_pools, cap_pools;
    slot **leased;
    uint32_t n_leased, cap_leased;
    detached_lease *detached;
    uint32_t n_detached, cap_detached;
    slot *ready_head[POLICY_MAX_BUCKETS], *ready_tail[POLICY_MAX_BUCKETS];
    uint32_t ready[POLICY_MAX_BUCKETS], leased_n[POLICY_MAX_BUCKETS],
        filling[POLICY_MAX_BUCKETS];
    uint32_t tot_ready, tot_leased, tot_filling;
    uint32_t n_fenced;         /* FENCED slots over all pools */
    double lag_consumed[POLICY_MAX_BUCKETS], lag_total; /* tokens since shares were set */
    uint64_t lag_claims;
    uint64_t prod_batches[POLICY_MAX_BUCKETS], prod_tokens[POLICY_MAX_BUCKETS];
    uint64_t cons_batches[POLICY_MAX_BUCKETS], cons_tokens[POLICY_MAX_BUCKETS];
    window_entry *win;
    uint32_t win_len, win_pos;
    uint64_t win_tokens[POLICY_MAX_BUCKETS];
    uint64_t next_lease;
    uint64_t claims, releases, work_units, expiries, quarantined, stale;
};

const char *policy_mode_name(policy_mode m)
{
    static const char *n[] = {"running", "paused", "draining"};
    return (unsigned)m < 3 ? n[m] : "?";
}

const char *slot_state_name(slot_state s)
{
    static const char *n[] = {"free", "filling", "ready", "leased", "fenced"};
    return (unsigned)s < 5 ? n[s] : "?";
}

void policy_params_default(policy_params *p)
{
    static const uint32_t lens[4] = {512, 1024, 2048, 3072};
    memset(p, 0, sizeof *p);
    p->n_buckets = 4;
    memcpy(p->bucket_max_len, lens, sizeof lens);
    p->min_ready = 30;
    p->max_depth = 90;
    p->lease_timeout_ms = 5000;
    p->max_redeliveries = 3;
    p->mix_window = 1000;
    p->first_lease_id = 1;
}

/* --- the one place slot states change ------------------------------------------------------- */

static bool legal(slot_state from, slot_state to)
{
    switch (from) {
    case SLOT_FREE: return to == SLOT_FILLING || to == SLOT_FENCED;
    case SLOT_FILLING: return to == SLOT_READY || to == SLOT_FREE;
    case SLOT_READY: return to == SLOT_LEASED || to == SLOT_FREE;
    case SLOT_LEASED: return to == SLOT_READY || to == SLOT_FREE;
    case SLOT_FENCED: return to == SLOT_FREE;
    }
    return false;
}

static void ready_unlink(policy *p, slot *s)
{
    uint32_t b = s->batch.bucket;
    if (s->prev) s->prev->next = s->next;
    else p->ready_head[b] = s->next;
    if (s->next) s->next->prev = s->prev;
    else p->ready_tail[b] = s->prev;
    s->prev = s->next = NULL;
}

static void ready_link(policy *p, slot *s, bool front)
{
    uint32_t b = s->batch.bucket;
    s->prev = s->next = NULL;
    if (!p->ready_head[b]) {
        p->ready_head[b] = p->ready_tail[b] = s;
    } else if (front) {
        s->next = p->ready_head[b];
        p->ready_head[b]->prev = s;
        p->ready_head[b] = s;
    } else {
        s->prev = p->ready_tail[b];
        p->ready_tail[b]->next = s;
        p->ready_tail[b] = s;
    }
}

/* front: a READY slot goes to the head of its FIFO (a redelivery is the oldest batch). Returns
 * DFLASH_ENOMEM only when growing the leased array fails (state then unchanged). */
static int set_state(policy *p, slot *s, slot_state to, bool front)
{
    slot_state from = s->state;
    assert(legal(from, to));
    assert(s->batch.bucket < p->prm.n_buckets);
    if (to == SLOT_LEASED && p->n_leased == p->cap_leased) {
        uint32_t cap = p->cap_leased ? 2 * p->cap_leased : 64;
        slot **a = realloc(p->leased, cap * sizeof *a);
        if (!a) return DFLASH_ENOMEM;
        p->leased = a;
        p->cap_leased = cap;
    }
    uint32_t b = s->batch.bucket;
    switch (from) {
    case SLOT_FREE: s->pool->n_free--; break;
    case SLOT_FILLING:
        p->filling[b]--;
        p->tot_filling--;
        s->pool->n_filling--;
        break;
    case SLOT_READY:
        ready_unlink(p, s);
        p->ready[b]--;
        p->tot_ready--;
        break;
    case SLOT_LEASED: {
        s->trained = false;
        slot *last = p->leased[--p->n_leased];
        p->leased[s->lease_pos] = last;
        last->lease_pos = s->lease_pos;
        p->leased_n[b]--;
        p->tot_leased--;
        break;
    }
    case SLOT_FENCED: p->n_fenced--; break;
    }
    switch (to) {
    case SLOT_FREE:
        s->pool->n_free++;
        s->redelivered = 0;
        s->granted = false;
        s->n_tokens = 0;
        break;
    case SLOT_FILLING:
        p->filling[b]++;
        p->tot_filling++;
        s->pool->n_filling++;
        break;
    case SLOT_READY:
        ready_link(p, s, front);
        p->ready[b]++;
        p->tot_ready++;
        break;
    case SLOT_LEASED:
        s->lease_pos = p->n_leased;
        p->leased[p->n_leased++] = s;
        p->leased_n[b]++;
        p->tot_leased++;
        break;
    case SLOT_FENCED: p->n_fenced++; break;
    }
    s->state = to;
    return 0;
}

/* --- helpers ------------------------------------------------------------------------------- */

static pool *find_pool(const policy *p, uint32_t pool_id, uint32_t *pos)
{
    for (uint32_t i = 0; i < p->n_pools; i++)
        if (p->pools[i]->id == pool_id) {
            if (pos) *pos = i;
            return p->pools[i];
        }
    return NULL;
}

static slot *find_filling(pool *pl, const batch_id *b)
{
    for (uint32_t i = 0; i < pl->n_slots; i++)
        if (pl->slots[i].state == SLOT_FILLING && same_batch(&pl->slots[i].batch, b))
            return &pl->slots[i];
    return NULL;
}

static slot *find_free(pool *pl)
{
    if (pl->n_free == 0) return NULL;
    for (uint32_t i = 0; i < pl->n_slots; i++)
        if (pl->slots[i].state == SLOT_FREE) return &pl->slots[i];
    return NULL;
}

static policy_slot_ref ref_of(const slot *s)
{
    return (policy_slot_ref){s->pool->id, s->pool->incarnation, s->index, s->batch, s->n_tokens};
}

static bool valid_params(const policy_params *q)
{
    return q->n_buckets >= 1 && q->n_buckets <= POLICY_MAX_BUCKETS && q->max_depth >= 1 &&
           q->lease_timeout_ms >= 1 && q->mix_window >= 1 && q->mix_window <= POLICY_MAX_WINDOW &&
           q->first_lease_id > 0;
}

/* --- lifecycle ----------------------------------------------------------------------------- */

policy *policy_new(const policy_params *params, const policy_sink *sink)
{
    if (!params || !valid_params(params)) {
        LOG_ERROR("policy: invalid parameters (buckets 1..%u, max_depth >= 1, lease >= 1 ms, "
                  "window 1..%u, first lease id > 0)",
                  POLICY_MAX_BUCKETS, POLICY_MAX_WINDOW);
        return NULL;
    }
    policy *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->prm = *params;
    if (sink) p->sink = *sink;
    p->win = calloc(params->mix_window, sizeof *p->win);
    if (!p->win) {
        free(p);
        return NULL;
    }
    for (uint32_t b = 0; b < params->n_buckets; b++) p->share[b] = 1.0 / params->n_buckets;
    p->next_lease = params->first_lease_id;
    p->mode = POLICY_RUNNING;
    return p;
}

static void free_pool(pool *pl)
{
    if (!pl) return;
    free(pl->slots);
    free(pl);
}

void policy_destroy(policy **pp)
{
    if (!pp || !*pp) return;
    policy *p = *pp;
    for (uint32_t i = 0; i < p->n_pools; i++) free_pool(p->pools[i]);
    free(p->pools);
    free(p->leased);
    free(p->detached);
    free(p->win);
    free(p);
    *pp = NULL;
}

/* --- pools --------------------------------------------------------------------------------- */

int policy_pool_drop(policy *p, uint32_t pool_id)
{
    uint32_t pos;
    pool *pl = find_pool(p, pool_id, &pos);
    if (!pl) return DFLASH_ENOTFOUND;
    for (uint32_t i = 0; i < pl->n_slots; i++) {
        slot *s = &pl->slots[i];
        if (s->state == SLOT_FENCED) (void)set_state(p, s, SLOT_FREE, false); /* no batch */
        if (s->state == SLOT_FREE) continue;
        batch_id b = s->batch;
        bool keep = false;
        if (s->state == SLOT_LEASED) {
            if (p->n_detached == p->cap_detached) {
                uint32_t cap = p->cap_detached ? 2 * p->cap_detached : 16;
                detached_lease *a = realloc(p->detached, cap * sizeof *a);
                if (a) {
                    p->detached = a;
                    p->cap_detached = cap;
                }
            }
            if (p->n_detached < p->cap_detached) {
                p->detached[p->n_detached++] =
                    (detached_lease){s->lease_id, s->worker_id, s->deadline_ms, ref_of(s)};
                keep = true;
            }
        }
        (void)set_state(p, s, SLOT_FREE, false); /* never allocates */
        if (!keep && p->sink.requeue) p->sink.requeue(p->sink.ctx, &b);
    }
    p->pools[pos] = p->pools[--p->n_pools];
    free_pool(pl);
    return 0;
}

uint32_t policy_pool_drop_filling(policy *p, uint32_t pool_id)
{
    pool *pl = find_pool(p, pool_id, NULL);
    uint32_t n = 0;
    for (uint32_t i = 0; pl && pl->n_filling && i < pl->n_slots; i++) {
        slot *s = &pl->slots[i];
        if (s->state != SLOT_FILLING) continue;
        batch_id b = s->batch;
        LOG_WARN("policy: slot %u of pool %u still filling batch %u/%u/%u when its target asked "
                 "for more work (the work unit's reply or its slot ready was lost): the batch "
                 "goes back to to-do", s->index, pool_id, b.epoch, b.bucket, b.index);
        (void)set_state(p, s, SLOT_FREE, false);
        if (p->sink.requeue) p->sink.requeue(p->sink.ctx, &b);
        n++;
    }
    return n;
}

uint32_t policy_detached_leases(const policy *p, uint32_t pool_id, uint64_t incarnation)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_detached; i++)
        n += p->detached[i].where.pool_id == pool_id &&
             p->detached[i].where.incarnation == incarnation;
    return n;
}

int policy_pool_add(policy *p, uint32_t pool_id, uint64_t incarnation, uint32_t n_slots,
                    uint64_t slot_bytes)
{
    if (n_slots == 0 || n_slots > (1u << 20)) return DFLASH_EINVAL;
    pool *old = find_pool(p, pool_id, NULL);
    if (old && old->incarnation == incarnation) return DFLASH_EEXISTS;
    if (p->n_pools == p->cap_pools) {
        uint32_t cap = p->cap_pools ? 2 * p->cap_pools : 4;
        pool **a = realloc(p->pools, cap * sizeof *a);
        if (!a) return DFLASH_ENOMEM;
        p->pools = a;
        p->cap_pools = cap;
    }
    pool *pl = calloc(1, sizeof *pl);
    if (!pl) return DFLASH_ENOMEM;
    pl->slots = calloc(n_slots, sizeof *pl->slots);
    if (!pl->slots) {
        free(pl);
        return DFLASH_ENOMEM;
    }
    if (old) {
        LOG_INFO("policy: pool %u restarted (incarnation %016llx -> %016llx); dropping old slots",
                 pool_id, (unsigned long long)old->incarnation, (unsigned long long)incarnation);
        (void)policy_pool_drop(p, pool_id);
    }
    pl->id = pool_id;
    pl->incarnation = incarnation;
    pl->n_slots = pl->n_free = n_slots;
    pl->slot_bytes = slot_bytes;
    for (uint32_t i = 0; i < n_slots; i++) {
        pl->slots[i].pool = pl;
        pl->slots[i].index = i;
    }
    p->pools[p->n_pools++] = pl;
    return 0;
}

int policy_slot_fence(policy *p, uint32_t pool_id, uint32_t slot_index, uint64_t until_ms)
{
    pool *pl = find_pool(p, pool_id, NULL);
    if (!pl) return DFLASH_ENOTFOUND;
    if (slot_index >= pl->n_slots) return DFLASH_ERANGE;
    slot *s = &pl->slots[slot_index];
    if (s->state != SLOT_FREE) return DFLASH_ESTATE;
    s->fence_until_ms = until_ms;
    (void)set_state(p, s, SLOT_FENCED, false);
    return 0;
}

uint64_t policy_pool_incarnation(const policy *p, uint32_t pool_id)
{
    pool *pl = find_pool(p, pool_id, NULL);
    return pl ? pl->incarnation : 0;
}

/* --- producer side ------------------------------------------------------------------------- */

int policy_set_shares(policy *p, uint32_t n, const double *shares)
{
    if (n != p->prm.n_buckets || !shares) return DFLASH_EINVAL;
    double sum = 0;
    for (uint32_t b = 0; b < n; b++) {
        if (!(shares[b] >= 0) || !isfinite(shares[b])) return DFLASH_EINVAL;
        sum += shares[b];
    }
    if (!(sum > 0)) return DFLASH_EINVAL;
    for (uint32_t b = 0; b < n; b++) {
        p->share[b] = shares[b] / sum;
        p->lag_consumed[b] = 0;
    }
    p->lag_total = 0;
    p->lag_claims = 0;
    return 0;
}

/* Deficit against the reservoir target T = max(min_ready, in_buffer + 1): below min_ready this
 * is DESIGN's share*min_ready - ready (filling counted as soon-ready); above it, it keeps the
 * buffer's composition proportional to the shares as it deepens towards max_depth. */
static double deficit_for_choice(const policy *p, uint32_t b)
{
    double have = (double)p->tot_ready + p->tot_filling + 1;
    double t = p->prm.min_ready > have ? p->prm.min_ready : have;
    return p->share[b] * t - (double)(p->ready[b] + p->filling[b]);
}

int policy_next_bucket(policy *p, uint32_t pool_id, uint32_t avail_mask, uint32_t *bucket)
{
    if (p->mode != POLICY_RUNNING) return DFLASH_ESTATE;
    pool *pl = find_pool(p, pool_id, NULL);
    if (!pl) return DFLASH_ESTALE;
    if (p->tot_filling + p->tot_ready + p->tot_leased >= p->prm.max_depth) return DFLASH_EFULL;
    if (pl->n_free == 0) return DFLASH_EFULL;
    if (p->prm.n_buckets < 32) avail_mask &= (1u << p->prm.n_buckets) - 1;
    int best = -1;
    double best_d = 0;
    for (uint32_t b = 0; b < p->prm.n_buckets; b++) {
        if (!(avail_mask & (1u << b))) continue;
        double d = deficit_for_choice(p, b);
        if (best < 0 || d > best_d + 1e-12) {
            best = (int)b;
            best_d = d;
        }
    }
    if (best < 0) return DFLASH_ENOTFOUND;
    *bucket = (uint32_t)best;
    return 0;
}

int policy_work_start(policy *p, uint32_t pool_id, const batch_id *batch, uint32_t *slot_out)
{
    pool *pl = find_pool(p, pool_id, NULL);
    if (!pl) return DFLASH_ESTALE;
    if (batch->bucket >= p->prm.n_buckets) return DFLASH_ERANGE;
    slot *s = find_free(pl);
    if (!s) return DFLASH_EFULL;
    s->batch = *batch;
    s->n_tokens = 0;
    (void)set_state(p, s, SLOT_FILLING, false);
    p->work_units++;
    if (slot_out) *slot_out = s->index;
    return 0;
}

bool policy_is_filling(const policy *p, uint32_t pool_id, const batch_id *batch)
{
    pool *pl = find_pool(p, pool_id, NULL);
    return pl && find_filling(pl, batch) != NULL;
}

int policy_slot_ready(policy *p, uint32_t pool_id, uint64_t incarnation, uint32_t slot_index,
                      const batch_id *batch, uint32_t n_tokens)
{
    pool *pl = find_pool(p, pool_id, NULL);
    if (!pl || pl->incarnation != incarnation) return DFLASH_ESTALE;
    if (slot_index >= pl->n_slots || batch->bucket >= p->prm.n_buckets) return DFLASH_ERANGE;
    slot *s = &pl->slots[slot_index];
    if (s->state == SLOT_READY || s->state == SLOT_LEASED || s->state == SLOT_FENCED)
        return DFLASH_ESTATE;
    if (s->state == SLOT_FILLING && !same_batch(&s->batch, batch)) {
        /* The target put batch into a slot we had suggested for another batch X. */
        slot *other = find_filling(pl, batch);
        if (other) {
            /* Swap the records: per-bucket filling counts are unchanged. */
            batch_id x = s->batch;
            s->batch = *batch;
            other->batch = x;
        } else {
            batch_id x = s->batch;
            slot *f = find_free(pl); /* s is FILLING, so never s */
            (void)set_state(p, s, SLOT_FREE, false);
            if (f) {
                f->batch = x;
                (void)set_state(p, f, SLOT_FILLING, false);
            } else {
                LOG_WARN("policy: pool %u: no free slot left to track filling batch "
                         "(%u,%u,%u)", pool_id, x.epoch, x.bucket, x.index);
            }
        }
    }
    if (s->state == SLOT_FREE) {
        slot *other = find_filling(pl, batch);
        if (other) (void)set_state(p, other, SLOT_FREE, false);
        s->batch = *batch;
        (void)set_state(p, s, SLOT_FILLING, false);
    }
    s->n_tokens = n_tokens;
    s->redelivered = 0;
    (void)set_state(p, s, SLOT_READY, false);
    p->prod_batches[batch->bucket]++;
    p->prod_tokens[batch->bucket] += n_tokens;
    return 0;
}

/* --- consumer side ------------------------------------------------------------------------- */

static void window_add(policy *p, uint32_t bucket, uint32_t tokens)
{
    if (p->win_len == p->prm.mix_window) {
        window_entry *old = &p->win[p->win_pos];
        p->win_tokens[old->bucket] -= old->tokens;
    } else {
        p->win_len++;
    }
    p->win[p->win_pos] = (window_entry){(uint8_t)bucket, tokens};
    p->win_tokens[bucket] += tokens;
    p->win_pos = (p->win_pos + 1) % p->prm.mix_window;
}

/* Counts a first grant in the lag of the choice rule. A bucket that could not be served for a
 * long time (none ready: its to-do ran out at an epoch's end, or its producer lagged) would
 * otherwise build up a lag that later drains as a burst of that bucket alone; the lag is clamped
 * to the tokens of mix_window/8 + 2 average claims either way, forgiving older history. */
static void account_lag(policy *p, uint32_t bucket, uint32_t tokens)
{
    p->lag_consumed[bucket] += tokens;
    p->lag_total += tokens;
    p->lag_claims++;
    double cap = (double)(p->prm.mix_window / 8 + 2) * (p->lag_total / (double)p->lag_claims);
    for (uint32_t b = 0; b < p->prm.n_buckets; b++) {
        double lag = p->share[b] * p->lag_total - p->lag_consumed[b];
        if (lag > cap) p->lag_consumed[b] = p->share[b] * p->lag_total - cap;
        else if (lag < -cap) p->lag_consumed[b] = p->share[b] * p->lag_total + cap;
    }
}

int policy_claim(policy *p, uint64_t worker_id, uint64_t now_ms, policy_grant *grant)
{
    if (p->mode == POLICY_PAUSED) return DFLASH_ESTATE;
    if (p->tot_ready == 0) return DFLASH_EAGAIN;
    bool free_serve = p->mode == POLICY_DRAINING || p->flush;
    if (!free_serve && p->tot_ready < p->prm.min_ready) return DFLASH_EAGAIN;
    /* The bucket whose consumed-token share lags its dataset share most. */
    int best = -1;
    double best_lag = 0;
    for (uint32_t b = 0; b < p->prm.n_buckets; b++) {
        if (!p->ready_head[b]) continue;
        double lag = p->share[b] * p->lag_total - p->lag_consumed[b];
        if (best < 0 || lag > best_lag + 1e-9) {
            best = (int)b;
            best_lag = lag;
        }
    }
    assert(best >= 0);
    slot *s = p->ready_head[best];
    if (set_state(p, s, SLOT_LEASED, false) != 0) return DFLASH_ENOMEM;
    s->lease_id = p->next_lease++;
    s->worker_id = worker_id;
    s->deadline_ms = now_ms + p->prm.lease_timeout_ms;
    p->claims++;
    if (s->redelivered == 0 && !s->granted) {
        uint32_t b = (uint32_t)best;
        account_lag(p, b, s->n_tokens);
        p->cons_batches[b]++;
        p->cons_tokens[b] += s->n_tokens;
        window_add(p, b, s->n_tokens);
    }
    s->granted = true;
    grant->lease_id = s->lease_id;
    grant->worker_id = worker_id;
    grant->deadline_ms = s->deadline_ms;
    grant->deliveries = s->redelivered + 1;
    grant->where = ref_of(s);
    return 0;
}

static slot *find_lease(const policy *p, uint64_t lease_id)
{
    for (uint32_t i = 0; i < p->n_leased; i++)
        if (p->leased[i]->lease_id == lease_id) return p->leased[i];
    return NULL;
}

uint32_t policy_claimable(const policy *p)
{
    if (p->mode == POLICY_PAUSED) return 0;
    if (p->mode == POLICY_DRAINING || p->flush) return p->tot_ready;
    if (p->tot_ready < p->prm.min_ready) return 0;
    uint64_t n = (uint64_t)p->tot_ready - p->prm.min_ready + 1;
    return n > p->tot_ready ? p->tot_ready : (uint32_t)n;
}

int policy_lease_revoke(policy *p, uint64_t lease_id)
{
    slot *s = find_lease(p, lease_id);
    if (!s) {
        for (uint32_t i = 0; i < p->n_detached; i++)
            if (p->detached[i].lease_id == lease_id) {
                batch_id b = p->detached[i].where.batch;
                p->detached[i] = p->detached[--p->n_detached];
                if (p->sink.requeue) p->sink.requeue(p->sink.ctx, &b);
                return 0;
            }
        return DFLASH_ESTALE;
    }
    if (s->trained) {
        (void)set_state(p, s, SLOT_FREE, false);
        return 0;
    }
    uint32_t redelivered = s->redelivered;
    (void)set_state(p, s, SLOT_READY, true);
    s->redelivered = redelivered;
    return 0;
}

int policy_batch_trained(policy *p, const batch_id *b, policy_slot_ref *where)
{
    for (uint32_t i = 0; i < p->n_pools; i++) {
        pool *pl = p->pools[i];
        for (uint32_t k = 0; k < pl->n_slots; k++) {
            slot *s = &pl->slots[k];
            if ((s->state != SLOT_FILLING && s->state != SLOT_READY) || !same_batch(&s->batch, b))
                continue;
            if (where) *where = ref_of(s);
            set_state(p, s, SLOT_FREE, false);
            return 0;
        }
    }
    return DFLASH_ENOTFOUND;
}

bool policy_holds_batch(const policy *p, const batch_id *b)
{
    for (uint32_t i = 0; i < p->n_pools; i++) {
        const pool *pl = p->pools[i];
        for (uint32_t k = 0; k < pl->n_slots; k++) {
            const slot *s = &pl->slots[k];
            if ((s->state == SLOT_FILLING || s->state == SLOT_READY || s->state == SLOT_LEASED) &&
                same_batch(&s->batch, b))
                return true;
        }
    }
    for (uint32_t i = 0; i < p->n_detached; i++)
        if (same_batch(&p->detached[i].where.batch, b)) return true;
    return false;
}

int policy_lease_trained(policy *p, const batch_id *b, policy_grant *g)
{
    for (uint32_t i = 0; i < p->n_leased; i++) {
        slot *s = p->leased[i];
        if (!same_batch(&s->batch, b)) continue;
        s->trained = true;
        if (g) *g = (policy_grant){s->lease_id, s->worker_id, s->deadline_ms, 0, ref_of(s)};
        return 0;
    }
    for (uint32_t i = 0; i < p->n_detached; i++) {
        const detached_lease *d = &p->detached[i];
        if (!same_batch(&d->where.batch, b)) continue;
        if (g) *g = (policy_grant){d->lease_id, d->worker_id, d->deadline_ms, 0, d->where};
        return 0;
    }
    return DFLASH_ENOTFOUND;
}

int policy_release(policy *p, uint64_t lease_id, policy_slot_ref *where)
{
    slot *s = find_lease(p, lease_id);
    if (!s) {
        for (uint32_t i = 0; i < p->n_detached; i++)
            if (p->detached[i].lease_id == lease_id) {
                if (where) *where = p->detached[i].where;
                p->detached[i] = p->detached[--p->n_detached];
                p->releases++;
                return 0;
            }
        p->stale++;
        return DFLASH_ESTALE;
    }
    if (where) *where = ref_of(s);
    (void)set_state(p, s, SLOT_FREE, false);
    p->releases++;
    return 0;
}

int policy_lease_worker(const policy *p, uint64_t lease_id, uint64_t *worker_id)
{
    const slot *s = find_lease(p, lease_id);
    if (s) {
        *worker_id = s->worker_id;
        return 0;
    }
    for (uint32_t i = 0; i < p->n_detached; i++)
        if (p->detached[i].lease_id == lease_id) {
            *worker_id = p->detached[i].worker_id;
            return 0;
        }
    return DFLASH_ESTALE;
}

void policy_release_refused(policy *p)
{
    if (p->releases) p->releases--;
    p->stale++;
}

int policy_heartbeat(policy *p, uint64_t worker_id, uint64_t now_ms)
{
    for (uint32_t i = 0; i < p->n_leased; i++)
        if (p->leased[i]->worker_id == worker_id)
            p->leased[i]->deadline_ms = now_ms + p->prm.lease_timeout_ms;
    for (uint32_t i = 0; i < p->n_detached; i++)
        if (p->detached[i].worker_id == worker_id)
            p->detached[i].deadline_ms = now_ms + p->prm.lease_timeout_ms;
    return 0;
}

/* A detached lease ended without a release: its batch goes back to to-do, not counted as a
 * failed delivery (sink->failed): its target died while it was leased, which the batch cannot
 * cause (the target is done with a slot once it is ready), and a drafter that could not copy the
 * dead target's slot, or died of it, is no sign of a bad batch. A batch that fails its drafter
 * does so after the copy: it is then held, and counted when that drafter goes (broker.c). */
static void expire_detached(policy *p, uint32_t i)
{
    batch_id b = p->detached[i].where.batch;
    p->detached[i] = p->detached[--p->n_detached];
    p->expiries++;
    if (p->sink.requeue) p->sink.requeue(p->sink.ctx, &b);
}

/* A lease ended without a release: READY again at the head of its FIFO, or quarantined; FREE
 * when its batch was trained meanwhile (a late ack: policy_lease_trained). */
static void expire(policy *p, slot *s)
{
    p->expiries++;
    if (s->trained) {
        (void)set_state(p, s, SLOT_FREE, false);
        return;
    }
    s->redelivered++;
    uint32_t redelivered = s->redelivered;
    (void)set_state(p, s, SLOT_READY, true);
    s->redelivered = redelivered;
    bool quarantine = p->sink.failed ? p->sink.failed(p->sink.ctx, &s->batch)
                                     : s->redelivered > p->prm.max_redeliveries;
    if (quarantine) {
        batch_id b = s->batch;
        if (!p->sink.failed) /* else the sink decided, and said so with its own count */
            LOG_WARN("policy: batch (%u,%u,%u) failed too often (redelivered %u times from this "
                     "slot): quarantined",
                     b.epoch, b.bucket, b.index, s->redelivered);
        (void)set_state(p, s, SLOT_FREE, false);
        p->quarantined++;
        if (p->sink.quarantine)
            p->sink.quarantine(p->sink.ctx, &b, s->pool->id, s->pool->incarnation, s->index);
    }
}

int policy_drop_worker(policy *p, uint64_t worker_id)
{
    for (uint32_t i = p->n_leased; i-- > 0;)
        if (i < p->n_leased && p->leased[i]->worker_id == worker_id) expire(p, p->leased[i]);
    for (uint32_t i = p->n_detached; i-- > 0;)
        if (p->detached[i].worker_id == worker_id) expire_detached(p, i);
    return 0;
}

uint32_t policy_worker_leases(const policy *p, uint64_t worker_id)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_leased; i++) n += p->leased[i]->worker_id == worker_id;
    for (uint32_t i = 0; i < p->n_detached; i++) n += p->detached[i].worker_id == worker_id;
    return n;
}

int policy_tick(policy *p, uint64_t now_ms)
{
    /* Backwards: expire() swap-removes, which only moves entries from the end. */
    for (uint32_t i = p->n_leased; i-- > 0;)
        if (i < p->n_leased && p->leased[i]->deadline_ms <= now_ms) expire(p, p->leased[i]);
    for (uint32_t i = p->n_detached; i-- > 0;)
        if (p->detached[i].deadline_ms <= now_ms) expire_detached(p, i);
    for (uint32_t k = 0; k < p->n_pools && p->n_fenced; k++) {
        pool *pl = p->pools[k];
        for (uint32_t i = 0; i < pl->n_slots; i++) {
            slot *s = &pl->slots[i];
            if (s->state == SLOT_FENCED && s->fence_until_ms <= now_ms)
                (void)set_state(p, s, SLOT_FREE, false);
        }
    }
    return 0;
}

uint64_t policy_next_deadline(const policy *p)
{
    uint64_t d = UINT64_MAX;
    for (uint32_t i = 0; i < p->n_leased; i++)
        if (p->leased[i]->deadline_ms < d) d = p->leased[i]->deadline_ms;
    for (uint32_t i = 0; i < p->n_detached; i++)
        if (p->detached[i].deadline_ms < d) d = p->detached[i].deadline_ms;
    return d;
}

/* --- live settings ------------------------------------------------------------------------- */

int policy_set_min_ready(policy *p, uint32_t v)
{
    p->prm.min_ready = v;
    return 0;
}

int policy_set_max_depth(policy *p, uint32_t v)
{
    if (v < 1) return DFLASH_EINVAL;
    p->prm.max_depth = v;
    return 0;
}

int policy_set_lease_timeout(policy *p, uint32_t v)
{
    if (v < 1) return DFLASH_EINVAL;
    p->prm.lease_timeout_ms = v;
    return 0;
}

int policy_set_max_redeliveries(policy *p, uint32_t n)
{
    p->prm.max_redeliveries = n;
    return 0;
}

int policy_set_mode(policy *p, policy_mode m)
{
    if ((unsigned)m > POLICY_DRAINING) return DFLASH_EINVAL;
    /* Every mode may follow every other (see policy.h); same mode is a no-op. */
    if (m != p->mode)
        LOG_INFO("policy: %s -> %s", policy_mode_name(p->mode), policy_mode_name(m));
    p->mode = m;
    return 0;
}

policy_mode policy_get_mode(const policy *p) { return p->mode; }
void policy_set_flush(policy *p, bool flush) { p->flush = flush; }

bool policy_drained(const policy *p)
{
    return (p->mode == POLICY_DRAINING || p->flush) &&
           p->tot_filling + p->tot_ready + p->tot_leased == 0;
}

/* --- stats --------------------------------------------------------------------------------- */

double policy_tv_distance(uint32_t n, const double *a, const double *b)
{
    double sa = 0, sb = 0;
    for (uint32_t i = 0; i < n; i++) {
        sa += a[i];
        sb += b[i];
    }
    if (!(sa > 0) || !(sb > 0)) return 0;
    double d = 0;
    for (uint32_t i = 0; i < n; i++) d += fabs(a[i] / sa - b[i] / sb);
    return 0.5 * d;
}

void policy_get_stats(const policy *p, policy_stats *o)
{
    memset(o, 0, sizeof *o);
    o->mode = p->mode;
    o->flush = p->flush;
    o->n_buckets = p->prm.n_buckets;
    o->n_pools = p->n_pools;
    for (uint32_t i = 0; i < p->n_pools; i++) o->n_slots += p->pools[i]->n_slots;
    o->min_ready = p->prm.min_ready;
    o->max_depth = p->prm.max_depth;
    o->lease_timeout_ms = p->prm.lease_timeout_ms;
    o->max_redeliveries = p->prm.max_redeliveries;
    o->mix_window = p->prm.mix_window;
    o->ready = p->tot_ready;
    o->leased = p->tot_leased;
    o->filling = p->tot_filling;
    o->fenced = p->n_fenced;
    double win[POLICY_MAX_BUCKETS];
    uint64_t win_sum = 0;
    for (uint32_t b = 0; b < p->prm.n_buckets; b++) {
        win[b] = (double)p->win_tokens[b];
        win_sum += p->win_tokens[b];
    }
    o->mix_tv = policy_tv_distance(p->prm.n_buckets, win, p->share);
    o->window_claims = p->win_len;
    o->claims = p->claims;
    o->releases = p->releases;
    o->work_units = p->work_units;
    o->lease_expiries = p->expiries;
    o->quarantined = p->quarantined;
    o->stale_releases = p->stale;
    o->detached_leases = p->n_detached;
    for (uint32_t b = 0; b < p->prm.n_buckets; b++) {
        policy_bucket_stats *s = &o->bucket[b];
        s->share = p->share[b];
        s->bucket_max_len = p->prm.bucket_max_len[b];
        s->ready = p->ready[b];
        s->leased = p->leased_n[b];
        s->filling = p->filling[b];
        s->deficit = p->share[b] * p->prm.min_ready - (double)(p->ready[b] + p->filling[b]);
        s->produced_batches = p->prod_batches[b];
        s->produced_tokens = p->prod_tokens[b];
        s->consumed_batches = p->cons_batches[b];
        s->consumed_tokens = p->cons_tokens[b];
        s->window_share = win_sum ? win[b] / (double)win_sum : 0;
    }
}

int policy_slot_get(const policy *p, uint32_t pool_id, uint32_t slot_index, slot_state *state,
                    batch_id *batch)
{
    pool *pl = find_pool(p, pool_id, NULL);
    if (!pl) return DFLASH_ENOTFOUND;
    if (slot_index >= pl->n_slots) return DFLASH_ERANGE;
    if (state) *state = pl->slots[slot_index].state;
    if (batch) *batch = pl->slots[slot_index].batch;
    return 0;
}
