/* ledger: batch states of DESIGN.md section 5, persisted in an append-only journal.
 *
 * Structure: the plan (n_buckets, batches per bucket per epoch) and a growing array of opened
 * epochs. An epoch holds, per bucket, one entry per batch {state, orphan flag, step} plus counters
 * (batches per state, TODO per bucket, a lower bound on the first TODO index per bucket) so that
 * hand-out and stats do not scan. An epoch whose batches are all COMMITTED is *done*: its entries
 * are freed (nothing but a rewind before its done_step could change there, and that is refused)
 * and it costs a few counters, in memory and in snapshots. Epochs open lazily: the open epoch is
 * the lowest one with TODO batches; when none has any, the next one is allocated (up to
 * epoch_limit: max_epochs at first, the target's planned epochs once the broker knows them,
 * ledger_set_max_epochs). Epochs at or past the limit (opened by a journal, or by an adopt
 * before the limit was known) hand out nothing and their TODO batches are not counted as to do.
 *
 * Transitions (assert()ed in set_state; the table with its triggers is in ledger.h):
 *   TODO -> IN_FLIGHT | TRAINED;  IN_FLIGHT -> TODO | TRAINED | QUARANTINED;
 *   TRAINED -> TODO | COMMITTED;  QUARANTINED -> TODO | TRAINED;  COMMITTED -> TODO (a rewind
 *   below the commit; never in a done epoch, which keeps only its largest step, done_step).
 *
 * Durability: every public mutation first changes memory then appends one journal record (a
 * record describes the operation, e.g. COMMIT(step), not its effects); replay at open runs the
 * same apply_* functions, so memory after replay equals memory before the crash minus at most the
 * torn final record. Each open appends a BOOT record, which on replay orphans what was in flight
 * at that boot, so orphan flags replay exactly too. Only COMMIT, REWIND, PLAN (and PLAN_ID),
 * SETTINGS, GROUP_ORPHANS and UNQUARANTINE (an operator's release) are fsynced: a power loss
 * can forget recent hand-outs (a target's re-registration adopts them) and acks after the last
 * checkpoint (those batches are not committed and a drafter resuming from that checkpoint
 * retrains them anyway). Acks before a checkpoint are durable before it: the drafter asks for
 * ledger_barrier (JournalSync) before it publishes one, so a power loss never leaves a
 * checkpoint holding batches the journal still has to do. A failed append leaves memory ahead of the journal; the
 * snapshot that ledger_journal_heal writes is taken from memory, so it holds those operations.
 *
 * Broker settings: the operator's runtime steering (dflash-ctl set, pause, resume, drain) is an
 * opaque payload the broker encodes (steering.h); the ledger keeps the last one, journals it as
 * a SETTINGS record (fsynced, like COMMIT), hands the replayed one back and repeats it in every
 * snapshot, so a compaction or a heal keeps it. The broker's orphaned group steps (group.h: a
 * data-parallel step whose every rank the broker expired mid-step) are a second such payload,
 * the GROUP_ORPHANS record (fsynced too; length 0: none left), so a restarted broker resolves
 * them as it would have (broker_groups.c).
 *
 * Failed deliveries: each entry counts the deliveries of its batch that ended untrained (a lease
 * that expired, a drafter that died holding it), journaled as FAIL records, so the count
 * survives requeues (the batch is produced into a fresh slot) and broker restarts; the broker
 * quarantines a batch past max_redeliveries of them. Each entry also remembers whether its batch
 * was granted to a drafter since the ledger was opened (ledger_note_delivery: the broker's count
 * of redeliveries); memory only, since that count starts again with the broker.
 *
 * Plan identity: a PLAN_ID record after the PLAN holds the target's digest of its plan (seed,
 * buckets, data: batch_plan_identity). Journals written before it have a PLAN alone; the next
 * target that sends an identity with the same counts has it adopted (journaled then).
 *
 * Thread: the broker's loop thread only. Callers: broker.c, tests, bench.
 */
#include "ledger.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "journal.h"
#include "log.h"

enum {
    REC_PLAN = 1,
    REC_HANDOUT = 2,
    REC_ADOPT = 3,
    REC_REQUEUE = 4,
    REC_ACK = 5,
    REC_QUARANTINE = 6,
    REC_UNQUARANTINE = 7,
    REC_COMMIT = 8,
    REC_REWIND = 9,
    REC_SNAP_META = 10,  /* compaction: counters */
    REC_SNAP_CHUNK = 11, /* compaction: states of a run of batches of one (epoch, bucket) */
    REC_ORPHANS = 12,    /* requeue_orphans */
    REC_BOOT = 13,       /* a ledger_new: everything in flight became orphaned */
    REC_SNAP_DONE = 14,  /* compaction: an epoch whose every batch is committed (+ done_step) */
    REC_FAIL = 15,       /* a delivery of an in-flight batch ended untrained */
    REC_SNAP_FAILS = 16, /* compaction: a batch's failed deliveries (batch + u16 count) */
    REC_SETTINGS = 17,   /* the broker's runtime settings: an opaque payload, the last one wins */
    REC_GROUP_ORPHANS = 18, /* the broker's orphaned group steps: opaque, the last one wins */
    REC_PLAN_ID = 19,    /* the plan's identity (u64, batch_plan_identity); after its PLAN */
};
#define SNAP_ORPHAN 0x80 /* state byte flag in snapshot chunks */

#define N_STATES 5
#define SNAP_CHUNK 65536u /* batches per snapshot record: 9 bytes each, < JOURNAL_MAX_PAYLOAD */

typedef struct {
    uint64_t step;
    uint8_t state; /* batch_state */
    uint8_t orphan;
    uint16_t fails; /* deliveries that ended untrained (saturates); kept across requeues */
    uint8_t delivered; /* granted to a drafter since the ledger was opened (not journaled) */
} entry;

/* An opaque payload of the broker's that the ledger keeps, journals and repeats in snapshots. */
typedef struct {
    uint8_t *p; /* NULL: none kept */
    uint32_t len;
} kept_payload;

typedef struct {
    entry *e[LEDGER_MAX_BUCKETS];
    uint32_t todo[LEDGER_MAX_BUCKETS];
    uint32_t first_todo[LEDGER_MAX_BUCKETS]; /* no TODO below this index */
    uint64_t count[N_STATES];
    uint64_t orphans;
    bool done; /* every batch COMMITTED: entries freed, all reads answer COMMITTED */
    uint64_t done_step; /* done: the largest step of its batches (a rewind below it is refused) */
} epoch_rec;

struct ledger {
    ledger_params params;
    journal *j;
    bool replaying;
    bool append_failed_said; /* the first failed append was logged (the rest are not) */
    uint32_t n_buckets;
    uint32_t per[LEDGER_MAX_BUCKETS];
    uint64_t batches_per_epoch;
    bool has_plan_id; /* the plan's identity is known (journals before it have none) */
    uint64_t plan_id;
    epoch_rec *ep;
    uint32_t n_epochs, cap_epochs;
    uint32_t epoch_limit; /* no hand-out, adopt or new epoch at or past it; 0 = none */
    uint64_t double_acks, stale_acks, last_commit_step, replayed;
    uint64_t compact_at;
    uint64_t compactions_failed; /* journal_rewrite_failures when compact_at was last set */
    kept_payload settings;       /* the broker's last settings payload (p NULL: none) */
    kept_payload group_orphans;  /* the broker's orphaned group steps (len 0: none) */
};

const char *batch_state_name(batch_state s)
{
    static const char *names[] = {"todo", "in_flight", "trained", "committed", "quarantined"};
    return (unsigned)s < N_STATES ? names[s] : "?";
}

/* --- little-endian payload helpers ------------------------------------------------------------ */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* --- state ---------------------------------------------------------------------------------- */

static bool legal(batch_state from, batch_state to)
{
    switch (from) {
    case BATCH_TODO: return to == BATCH_IN_FLIGHT || to == BATCH_TRAINED;
    case BATCH_IN_FLIGHT:
        return to == BATCH_TODO || to == BATCH_TRAINED || to == BATCH_QUARANTINED;
    case BATCH_TRAINED: return to == BATCH_TODO || to == BATCH_COMMITTED;
    case BATCH_QUARANTINED: return to == BATCH_TODO || to == BATCH_TRAINED;
    case BATCH_COMMITTED: return to == BATCH_TODO;
    }
    return false;
}

static void set_state(epoch_rec *E, uint32_t bucket, uint32_t index, batch_state to)
{
    entry *x = &E->e[bucket][index];
    batch_state from = (batch_state)x->state;
    assert(legal(from, to));
    E->count[from]--;
    E->count[to]++;
    if (from == BATCH_TODO) E->todo[bucket]--;
    if (to == BATCH_TODO) {
        E->todo[bucket]++;
        if (index < E->first_todo[bucket]) E->first_todo[bucket] = index;
    }
    if (x->orphan) {
        x->orphan = 0;
        E->orphans--;
    }
    if (to != BATCH_TRAINED && to != BATCH_COMMITTED) x->step = 0;
    x->state = (uint8_t)to;
}

static bool past_limit(const ledger *l, uint32_t epoch)
{
    return l->epoch_limit && epoch >= l->epoch_limit;
}

static int ensure_epoch(ledger *l, uint32_t epoch)
{
    if (l->n_buckets == 0) return DFLASH_ESTATE;
    /* Replay reopens what the journal opened, also under a lower limit than then. */
    if (past_limit(l, epoch) && !l->replaying) return DFLASH_ERANGE;
    while (l->n_epochs <= epoch) {
        if (l->n_epochs == l->cap_epochs) {
            uint32_t cap = l->cap_epochs ? 2 * l->cap_epochs : 4;
            epoch_rec *ep = realloc(l->ep, cap * sizeof *ep);
            if (!ep) return DFLASH_ENOMEM;
            l->ep = ep;
            l->cap_epochs = cap;
        }
        epoch_rec *E = &l->ep[l->n_epochs];
        memset(E, 0, sizeof *E);
        for (uint32_t b = 0; b < l->n_buckets; b++) {
            E->e[b] = calloc(l->per[b], sizeof(entry)); /* all TODO (0) */
            if (!E->e[b]) {
                for (uint32_t k = 0; k < b; k++) free(E->e[k]);
                return DFLASH_ENOMEM;
            }
            E->todo[b] = l->per[b];
        }
        E->count[BATCH_TODO] = l->batches_per_epoch;
        l->n_epochs++;
    }
    return 0;
}

/* What every batch of a done epoch reads as. Never written: callers check the state first and
 * COMMITTED allows no transition. */
static entry committed_entry = {.state = BATCH_COMMITTED};

/* Entry of b, or NULL when outside the plan or in an epoch not opened. */
static entry *find(const ledger *l, const batch_id *b, epoch_rec **E)
{
    if (l->n_buckets == 0 || b->bucket >= l->n_buckets || b->index >= l->per[b->bucket] ||
        b->epoch >= l->n_epochs)
        return NULL;
    *E = &l->ep[b->epoch];
    if ((*E)->done) return &committed_entry;
    return &(*E)->e[b->bucket][b->index];
}

static void mark_done(ledger *l, epoch_rec *E)
{
    E->done_step = 0;
    for (uint32_t b = 0; b < l->n_buckets; b++) {
        for (uint32_t i = 0; i < l->per[b]; i++)
            if (E->e[b][i].step > E->done_step) E->done_step = E->e[b][i].step;
        free(E->e[b]);
        E->e[b] = NULL;
        E->todo[b] = 0;
    }
    memset(E->count, 0, sizeof E->count);
    E->count[BATCH_COMMITTED] = l->batches_per_epoch;
    E->orphans = 0;
    E->done = true;
}

/* Lowest epoch with TODO batches, opening a new one if none has any; never one at or past
 * epoch_limit (a journal, or an adopt before the limit was known, may hold such epochs). -1 if
 * none. */
static int64_t open_epoch(ledger *l)
{
    if (l->n_buckets == 0) return -1;
    for (uint32_t e = 0; e < l->n_epochs; e++) {
        if (past_limit(l, e)) return -1;
        if (l->ep[e].count[BATCH_TODO]) return e;
    }
    if (ensure_epoch(l, l->n_epochs) != 0) return -1;
    return (int64_t)l->n_epochs - 1;
}

static int journal_rec(ledger *l, uint16_t type, const void *p, uint32_t len, bool sync);
static void maybe_compact(ledger *l);

static void pack_batch(uint8_t *p, const batch_id *b)
{
    put32(p, b->epoch);
    put32(p + 4, b->bucket);
    put32(p + 8, b->index);
}

static void log_batch(ledger *l, uint16_t type, const batch_id *b)
{
    uint8_t p[12];
    pack_batch(p, b);
    journal_rec(l, type, p, sizeof p, false);
}

/* --- operations (apply = memory only; the public wrappers journal) --------------------------- */

static int apply_plan(ledger *l, uint32_t n, const uint32_t *per)
{
    if (n == 0 || n > LEDGER_MAX_BUCKETS || !per) return DFLASH_EINVAL;
    for (uint32_t b = 0; b < n; b++)
        if (per[b] == 0) return DFLASH_EINVAL;
    if (l->n_buckets) {
        if (l->n_buckets != n) return DFLASH_EMISMATCH;
        for (uint32_t b = 0; b < n; b++)
            if (l->per[b] != per[b]) return DFLASH_EMISMATCH;
        return 1; /* same plan again */
    }
    l->n_buckets = n;
    l->batches_per_epoch = 0;
    for (uint32_t b = 0; b < n; b++) {
        l->per[b] = per[b];
        l->batches_per_epoch += per[b];
    }
    return 0;
}

/* 0 set, 1 the same identity again, DFLASH_EMISMATCH another one, DFLASH_ESTATE no plan. */
static int apply_plan_id(ledger *l, uint64_t id)
{
    if (l->n_buckets == 0) return DFLASH_ESTATE;
    if (l->has_plan_id) return l->plan_id == id ? 1 : DFLASH_EMISMATCH;
    l->has_plan_id = true;
    l->plan_id = id;
    return 0;
}

static int apply_handout(ledger *l, uint32_t bucket, batch_id *out)
{
    if (l->n_buckets == 0) return DFLASH_ESTATE;
    if (bucket >= l->n_buckets) return DFLASH_EINVAL;
    int64_t e = open_epoch(l);
    if (e < 0) return DFLASH_ENOTFOUND;
    epoch_rec *E = &l->ep[e];
    if (E->todo[bucket] == 0) return DFLASH_ENOTFOUND;
    uint32_t i = E->first_todo[bucket];
    while (E->e[bucket][i].state != BATCH_TODO) i++; /* todo > 0 guarantees one */
    E->first_todo[bucket] = i + 1;
    set_state(E, bucket, i, BATCH_IN_FLIGHT);
    *out = (batch_id){(uint32_t)e, bucket, i};
    return 0;
}

/* Replay of a HANDOUT: the exact batch recorded, not a recomputed choice. */
static int apply_handout_exact(ledger *l, const batch_id *b)
{
    if (b->bucket >= l->n_buckets || b->index >= l->per[b->bucket]) return DFLASH_ERANGE;
    int rc = ensure_epoch(l, b->epoch);
    if (rc) return rc;
    epoch_rec *E;
    entry *x = find(l, b, &E);
    if (x->state != BATCH_TODO) return DFLASH_ESTATE;
    set_state(E, b->bucket, b->index, BATCH_IN_FLIGHT);
    return 0;
}

static int apply_adopt(ledger *l, const batch_id *b)
{
    if (l->n_buckets == 0 || b->bucket >= l->n_buckets || b->index >= l->per[b->bucket])
        return DFLASH_ERANGE;
    /* The epoch comes from a peer: open at most the next one (hand-outs a power loss forgot),
     * never every epoch up to a far one. */
    if (b->epoch > l->n_epochs) return DFLASH_ERANGE;
    int rc = ensure_epoch(l, b->epoch);
    if (rc) return rc == DFLASH_ERANGE ? DFLASH_ERANGE : rc;
    epoch_rec *E;
    entry *x = find(l, b, &E);
    switch ((batch_state)x->state) {
    case BATCH_TODO: set_state(E, b->bucket, b->index, BATCH_IN_FLIGHT); return 0;
    case BATCH_IN_FLIGHT:
        if (!x->orphan) return DFLASH_EEXISTS;
        x->orphan = 0;
        E->orphans--;
        return 0;
    case BATCH_TRAINED:
    case BATCH_COMMITTED: return DFLASH_ESTALE;
    case BATCH_QUARANTINED: return DFLASH_EQUARANTINED;
    }
    return DFLASH_EINTERNAL;
}

static int apply_simple(ledger *l, const batch_id *b, batch_state from, batch_state to)
{
    epoch_rec *E;
    entry *x = find(l, b, &E);
    if (!x) return DFLASH_ERANGE;
    if (x->state != from) return DFLASH_ESTATE;
    set_state(E, b->bucket, b->index, to);
    return 0;
}

static int apply_ack(ledger *l, const batch_id *b, uint64_t step)
{
    epoch_rec *E;
    entry *x = find(l, b, &E);
    if (!x) {
        l->stale_acks++;
        return DFLASH_ERANGE;
    }
    if (x->state == BATCH_TRAINED || x->state == BATCH_COMMITTED) {
        l->double_acks++;
        return DFLASH_EEXISTS;
    }
    set_state(E, b->bucket, b->index, BATCH_TRAINED);
    x->step = step;
    return 0;
}

/* One more failed delivery of an IN_FLIGHT batch. Returns the new count (>= 1) or a code. */
static int apply_fail(ledger *l, const batch_id *b)
{
    epoch_rec *E;
    entry *x = find(l, b, &E);
    if (!x) return DFLASH_ERANGE;
    if (x->state != BATCH_IN_FLIGHT) return DFLASH_ESTATE;
    if (x->fails < UINT16_MAX) x->fails++;
    return x->fails;
}

/* Moves every batch in state from that satisfies pred(step) to state to. */
static int64_t apply_bulk(ledger *l, batch_state from, batch_state to, uint64_t step, bool above)
{
    int64_t n = 0;
    for (uint32_t e = 0; e < l->n_epochs; e++) {
        epoch_rec *E = &l->ep[e];
        if (E->count[from] == 0 || E->done) continue;
        for (uint32_t b = 0; b < l->n_buckets; b++)
            for (uint32_t i = 0; i < l->per[b]; i++) {
                entry *x = &E->e[b][i];
                if (x->state != from) continue;
                if (above ? x->step <= step : x->step > step) continue;
                set_state(E, b, i, to);
                n++;
            }
        if (E->count[BATCH_COMMITTED] == l->batches_per_epoch) mark_done(l, E);
    }
    return n;
}

/* A durable checkpoint at step: every TRAINED batch trained at or before it -> COMMITTED. The last
 * commit is the newest one: the report of an older checkpoint arriving late commits what it
 * covers and leaves it (replay too, so a restart finds the same last commit). */
static int64_t apply_commit(ledger *l, uint64_t step)
{
    int64_t n = apply_bulk(l, BATCH_TRAINED, BATCH_COMMITTED, step, false);
    if (step > l->last_commit_step) l->last_commit_step = step;
    return n;
}

/* A drafter resumed from checkpoint step: every TRAINED or COMMITTED batch trained after it ->
 * TODO, and the last commit is no later than step. DFLASH_ESTATE (nothing changed) when a done
 * epoch has a batch trained after step: which ones is no longer known. Replay applies what the
 * live call did and refuses nothing (an older snapshot's done_step is only a bound). */
static int64_t apply_rewind(ledger *l, uint64_t step)
{
    for (uint32_t e = 0; e < l->n_epochs && !l->replaying; e++)
        if (l->ep[e].done && l->ep[e].done_step > step) {
            LOG_WARN("ledger: cannot rewind to step %" PRIu64 ": epoch %u was finished with "
                     "batches trained up to step %" PRIu64 " and its per-batch steps are not "
                     "kept (resume from a checkpoint at or after that step)",
                     step, e, l->ep[e].done_step);
            return DFLASH_ESTATE;
        }
    int64_t n = apply_bulk(l, BATCH_TRAINED, BATCH_TODO, step, true);
    n += apply_bulk(l, BATCH_COMMITTED, BATCH_TODO, step, true);
    if (step < l->last_commit_step) l->last_commit_step = step;
    return n;
}

static void apply_boot(ledger *l)
{
    for (uint32_t e = 0; e < l->n_epochs; e++)
        for (uint32_t b = 0; b < l->n_buckets && !l->ep[e].done; b++)
            for (uint32_t i = 0; i < l->per[b]; i++) {
                entry *x = &l->ep[e].e[b][i];
                if (x->state == BATCH_IN_FLIGHT && !x->orphan) {
                    x->orphan = 1;
                    l->ep[e].orphans++;
                }
            }
}

static uint64_t apply_orphans(ledger *l)
{
    uint64_t n = 0;
    for (uint32_t e = 0; e < l->n_epochs; e++) {
        epoch_rec *E = &l->ep[e];
        if (!E->orphans) continue;
        for (uint32_t b = 0; b < l->n_buckets; b++)
            for (uint32_t i = 0; i < l->per[b]; i++)
                if (E->e[b][i].orphan) {
                    set_state(E, b, i, BATCH_TODO);
                    n++;
                }
    }
    return n;
}

/* Replaces the payload kept in k with a copy of p. 0 or DFLASH_ENOMEM (the old one kept). */
static int keep_payload(kept_payload *k, const void *p, uint32_t len)
{
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return DFLASH_ENOMEM;
    if (len) memcpy(copy, p, len);
    free(k->p);
    k->p = copy;
    k->len = len;
    return 0;
}

/* --- journal glue --------------------------------------------------------------------------- */


/* Appends one record (see "Durability"). 0, or the append's code: the record is in memory only
 * (said once; the callers that promise durability report it). */
static int journal_rec(ledger *l, uint16_t type, const void *p, uint32_t len, bool sync)
{
    if (!l->j || l->replaying) return 0;
    int rc = journal_append(l->j, type, p, len, sync && l->params.fsync);
    if (rc) {
        /* Memory stays authoritative for this run; a restart would lose this operation. Said
         * once: every later record fails alike (the broker repeats it once a minute, and its
         * status carries it: ledger_journal_failure) */
        if (!l->append_failed_said)
            LOG_ERROR("ledger: journal append failed (%s); state since is not durable",
                      err_str(rc));
        l->append_failed_said = true;
        return rc;
    }
    l->append_failed_said = false; /* taken (again, after a heal): a new failure is said */
    maybe_compact(l);
    return 0;
}

static int replay_one(void *ctx, uint16_t type, const void *payload, uint32_t len)
{
    ledger *l = ctx;
    const uint8_t *p = payload;
    batch_id b = {0, 0, 0};
    if (len >= 12) b = (batch_id){get32(p), get32(p + 4), get32(p + 8)};
    int rc = 0;
    l->replayed++;
    switch (type) {
    case REC_PLAN: {
        if (len < 4 || get32(p) > LEDGER_MAX_BUCKETS || len != 4 + 4 * get32(p))
            return DFLASH_ECORRUPT;
        uint32_t n = get32(p), per[LEDGER_MAX_BUCKETS];
        for (uint32_t i = 0; i < n; i++) per[i] = get32(p + 4 + 4 * i);
        rc = apply_plan(l, n, per);
        if (rc == 1) rc = 0;
        break;
    }
    case REC_PLAN_ID:
        if (len != 8) return DFLASH_ECORRUPT;
        rc = apply_plan_id(l, get64(p));
        if (rc == 1) rc = 0;
        break;
    case REC_HANDOUT:
        if (len != 12) return DFLASH_ECORRUPT;
        rc = apply_handout_exact(l, &b);
        break;
    case REC_ADOPT:
        if (len != 12) return DFLASH_ECORRUPT;
        rc = apply_adopt(l, &b);
        break;
    case REC_REQUEUE:
        if (len != 12) return DFLASH_ECORRUPT;
        rc = apply_simple(l, &b, BATCH_IN_FLIGHT, BATCH_TODO);
        break;
    case REC_ACK:
        if (len != 20) return DFLASH_ECORRUPT;
        rc = apply_ack(l, &b, get64(p + 12));
        break;
    case REC_QUARANTINE:
        if (len != 12) return DFLASH_ECORRUPT;
        rc = apply_simple(l, &b, BATCH_IN_FLIGHT, BATCH_QUARANTINED);
        break;
    case REC_UNQUARANTINE:
        if (len != 12) return DFLASH_ECORRUPT;
        rc = apply_simple(l, &b, BATCH_QUARANTINED, BATCH_TODO);
        if (rc == 0) l->ep[b.epoch].e[b.bucket][b.index].fails = 0;
        break;
    case REC_FAIL:
        if (len != 12) return DFLASH_ECORRUPT;
        rc = apply_fail(l, &b);
        if (rc > 0) rc = 0;
        break;
    case REC_SNAP_FAILS: {
        if (len != 14) return DFLASH_ECORRUPT;
        epoch_rec *E;
        entry *x = find(l, &b, &E);
        if (!x || E->done) return DFLASH_ECORRUPT;
        x->fails = (uint16_t)(p[12] | p[13] << 8);
        break;
    }
    case REC_COMMIT:
        if (len != 8) return DFLASH_ECORRUPT;
        apply_commit(l, get64(p));
        break;
    case REC_REWIND:
        if (len != 8) return DFLASH_ECORRUPT;
        apply_rewind(l, get64(p));
        break;
    case REC_ORPHANS:
        if (len != 0) return DFLASH_ECORRUPT;
        apply_orphans(l);
        break;
    case REC_BOOT:
        if (len != 0) return DFLASH_ECORRUPT;
        apply_boot(l);
        break;
    case REC_SNAP_META:
        if (len != 28) return DFLASH_ECORRUPT;
        l->last_commit_step = get64(p);
        l->double_acks = get64(p + 8);
        l->stale_acks = get64(p + 16);
        if (get32(p + 24) && l->n_buckets) rc = ensure_epoch(l, get32(p + 24) - 1);
        if (rc) return DFLASH_ECORRUPT;
        break;
    case REC_SNAP_CHUNK: {
        if (len < 16) return DFLASH_ECORRUPT;
        uint32_t count = get32(p + 12);
        if (len != 16 + 9ull * count) return DFLASH_ECORRUPT;
        if (b.bucket >= l->n_buckets || (uint64_t)b.index + count > l->per[b.bucket])
            return DFLASH_ECORRUPT;
        rc = ensure_epoch(l, b.epoch);
        if (rc || l->ep[b.epoch].done) return DFLASH_ECORRUPT;
        epoch_rec *E = &l->ep[b.epoch];
        for (uint32_t k = 0; k < count; k++) {
            const uint8_t *q = p + 16 + 9ull * k;
            uint32_t i = b.index + k;
            batch_state to = (batch_state)(q[0] & ~SNAP_ORPHAN);
            bool orphan = q[0] & SNAP_ORPHAN;
            if (to >= N_STATES || (orphan && to != BATCH_IN_FLIGHT)) return DFLASH_ECORRUPT;
            entry *x = &E->e[b.bucket][i];
            /* Fresh epoch entries are TODO: set counters directly (a snapshot is not a
             * transition). A chunk over non-fresh entries is a corrupt journal. */
            if (x->state != BATCH_TODO || x->orphan) return DFLASH_ECORRUPT;
            if (orphan) {
                x->orphan = 1;
                E->orphans++;
            }
            E->count[BATCH_TODO]--;
            E->todo[b.bucket]--;
            E->count[to]++;
            if (to == BATCH_TODO) E->todo[b.bucket]++;
            x->state = (uint8_t)to;
            x->step = get64(q + 1);
        }
        for (uint32_t i = 0; i < l->per[b.bucket]; i++)
            if (E->e[b.bucket][i].state == BATCH_TODO) {
                E->first_todo[b.bucket] = i;
                break;
            }
        break;
    }
    case REC_SNAP_DONE:
        if ((len != 4 && len != 12) || !l->n_buckets) return DFLASH_ECORRUPT;
        if (ensure_epoch(l, get32(p)) != 0 || l->ep[get32(p)].count[BATCH_TODO] !=
                                                   l->batches_per_epoch)
            return DFLASH_ECORRUPT;
        mark_done(l, &l->ep[get32(p)]);
        /* Older snapshots have no step: the last commit (after SNAP_META) bounds it. */
        l->ep[get32(p)].done_step = len == 12 ? get64(p + 4) : l->last_commit_step;
        break;
    case REC_SETTINGS:
        if (keep_payload(&l->settings, p, len)) return DFLASH_ENOMEM;
        break;
    case REC_GROUP_ORPHANS:
        if (keep_payload(&l->group_orphans, p, len)) return DFLASH_ENOMEM;
        break;
    default:
        LOG_ERROR("ledger: unknown journal record type %u", type);
        return DFLASH_ECORRUPT;
    }
    if (rc < 0 && rc != DFLASH_EEXISTS)
        LOG_WARN("ledger: journal record type %u did not apply (%s); continuing", type,
                 err_str(rc));
    return 0;
}

/* --- public --------------------------------------------------------------------------------- */

ledger *ledger_new(const ledger_params *params, int *err)
{
    ledger *l = calloc(1, sizeof *l);
    if (!l) {
        if (err) *err = DFLASH_ENOMEM;
        return NULL;
    }
    l->params = *params;
    l->params.journal_path = NULL; /* not kept: the journal owns its copy */
    l->epoch_limit = params->max_epochs;
    if (params->journal_path) {
        int rc = 0;
        l->replaying = true;
        l->j = journal_open(params->journal_path, replay_one, l, &rc);
        l->replaying = false;
        if (!l->j) {
            ledger_destroy(&l);
            if (err) *err = rc;
            return NULL;
        }
        /* Whatever was in flight when the broker died is now orphaned (see ledger.h). */
        apply_boot(l);
        journal_rec(l, REC_BOOT, NULL, 0, false);
        if (params->compact_bytes) l->compact_at = params->compact_bytes;
        maybe_compact(l);
    }
    if (err) *err = 0;
    return l;
}

void ledger_destroy(ledger **lp)
{
    if (!lp || !*lp) return;
    ledger *l = *lp;
    for (uint32_t e = 0; e < l->n_epochs; e++)
        for (uint32_t b = 0; b < l->n_buckets; b++) free(l->ep[e].e[b]);
    free(l->ep);
    free(l->settings.p);
    free(l->group_orphans.p);
    journal_destroy(&l->j);
    free(l);
    *lp = NULL;
}

int ledger_set_plan(ledger *l, uint32_t n, const uint32_t *per)
{
    int rc = apply_plan(l, n, per);
    if (rc == 1) return 0;
    if (rc) return rc;
    uint8_t p[4 + 4 * LEDGER_MAX_BUCKETS];
    put32(p, n);
    for (uint32_t b = 0; b < n; b++) put32(p + 4 + 4 * b, per[b]);
    journal_rec(l, REC_PLAN, p, 4 + 4 * n, true);
    return 0;
}

bool ledger_has_plan(const ledger *l) { return l->n_buckets > 0; }

int ledger_set_plan_id(ledger *l, uint64_t id)
{
    int rc = apply_plan_id(l, id);
    if (rc == 1) return 0;
    if (rc) return rc;
    uint8_t p[8];
    put64(p, id);
    journal_rec(l, REC_PLAN_ID, p, sizeof p, true);
    return 0;
}

bool ledger_plan_id(const ledger *l, uint64_t *id)
{
    if (l->has_plan_id && id) *id = l->plan_id;
    return l->has_plan_id;
}

void ledger_set_max_epochs(ledger *l, uint32_t max_epochs) { l->epoch_limit = max_epochs; }

uint32_t ledger_todo_mask(ledger *l)
{
    int64_t e = open_epoch(l);
    if (e < 0) return 0;
    uint32_t mask = 0;
    for (uint32_t b = 0; b < l->n_buckets; b++)
        if (l->ep[e].todo[b]) mask |= 1u << b;
    return mask;
}

int ledger_next_todo(ledger *l, uint32_t bucket, batch_id *out)
{
    int rc = apply_handout(l, bucket, out);
    if (rc == 0) log_batch(l, REC_HANDOUT, out);
    return rc;
}

int ledger_adopt(ledger *l, const batch_id *b)
{
    int rc = apply_adopt(l, b);
    if (rc == 0) log_batch(l, REC_ADOPT, b);
    return rc;
}

int ledger_requeue(ledger *l, const batch_id *b)
{
    int rc = apply_simple(l, b, BATCH_IN_FLIGHT, BATCH_TODO);
    if (rc == 0) log_batch(l, REC_REQUEUE, b);
    return rc;
}

uint64_t ledger_requeue_orphans(ledger *l)
{
    uint64_t n = apply_orphans(l);
    if (n) journal_rec(l, REC_ORPHANS, NULL, 0, false);
    return n;
}

int ledger_ack(ledger *l, const batch_id *b, uint64_t step)
{
    int rc = apply_ack(l, b, step);
    if (rc == 0) {
        uint8_t p[20];
        pack_batch(p, b);
        put64(p + 12, step);
        journal_rec(l, REC_ACK, p, sizeof p, false);
    }
    return rc;
}

int ledger_quarantine(ledger *l, const batch_id *b)
{
    int rc = apply_simple(l, b, BATCH_IN_FLIGHT, BATCH_QUARANTINED);
    if (rc == 0) log_batch(l, REC_QUARANTINE, b);
    return rc;
}

/* QUARANTINED -> TODO with a fresh set of tries, journaled as UNQUARANTINE (fsynced when sync).
 * 0, apply_simple's code (nothing changed), or DFLASH_EIO: released, but the journal failed. */
static int release_one(ledger *l, const batch_id *b, bool sync)
{
    int rc = apply_simple(l, b, BATCH_QUARANTINED, BATCH_TODO);
    if (rc) return rc;
    l->ep[b->epoch].e[b->bucket][b->index].fails = 0;
    uint8_t p[12];
    pack_batch(p, b);
    return journal_rec(l, REC_UNQUARANTINE, p, sizeof p, sync) ? DFLASH_EIO : 0;
}

int ledger_release_quarantine(ledger *l, const batch_id *b)
{
    return release_one(l, b, true);
}

int ledger_release_quarantined(ledger *l, uint64_t *released)
{
    uint64_t total = 0, n = 0;
    for (uint32_t e = 0; e < l->n_epochs; e++) total += l->ep[e].count[BATCH_QUARANTINED];
    bool failed = false;
    for (uint32_t e = 0; e < l->n_epochs && n < total; e++) {
        epoch_rec *E = &l->ep[e];
        for (uint32_t b = 0; b < l->n_buckets && E->count[BATCH_QUARANTINED]; b++)
            for (uint32_t i = 0; i < l->per[b]; i++) {
                if (E->e[b][i].state != BATCH_QUARANTINED) continue;
                batch_id id = {e, b, i};
                n++;
                /* one fsync, with the last record, makes them all durable (appended in order) */
                int rc = release_one(l, &id, n == total);
                assert(rc == 0 || rc == DFLASH_EIO);
                failed |= rc == DFLASH_EIO;
            }
    }
    if (released) *released = n;
    return failed ? DFLASH_EIO : 0;
}

int ledger_fail(ledger *l, const batch_id *b)
{
    int rc = apply_fail(l, b);
    if (rc > 0) log_batch(l, REC_FAIL, b);
    return rc;
}

bool ledger_note_delivery(ledger *l, const batch_id *b)
{
    epoch_rec *E;
    entry *x = find(l, b, &E);
    if (!x || E->done) return false;
    bool before = x->delivered;
    x->delivered = 1;
    return before;
}

uint32_t ledger_failures(const ledger *l, const batch_id *b)
{
    if (l->n_buckets == 0 || b->bucket >= l->n_buckets || b->index >= l->per[b->bucket] ||
        b->epoch >= l->n_epochs || l->ep[b->epoch].done)
        return 0;
    return l->ep[b->epoch].e[b->bucket][b->index].fails;
}

int64_t ledger_commit(ledger *l, uint64_t step)
{
    int64_t n = apply_commit(l, step);
    uint8_t p[8];
    put64(p, step);
    if (l->j && journal_append(l->j, REC_COMMIT, p, 8, l->params.fsync) != 0) return DFLASH_EIO;
    return n;
}

int64_t ledger_rewind(ledger *l, uint64_t step)
{
    int64_t n = apply_rewind(l, step);
    if (n < 0) return n;
    uint8_t p[8];
    put64(p, step);
    if (l->j && journal_append(l->j, REC_REWIND, p, 8, l->params.fsync) != 0) return DFLASH_EIO;
    return n;
}

/* Keeps a copy of p in k and journals it as a record of type (fsynced): the broker's payloads. */
static int set_kept(ledger *l, kept_payload *k, uint16_t type, const void *p, uint32_t len)
{
    if (len > JOURNAL_MAX_PAYLOAD) return DFLASH_EINVAL;
    int rc = keep_payload(k, p, len);
    if (rc) return rc;
    return journal_rec(l, type, p, len, true) ? DFLASH_EIO : 0;
}

int ledger_set_settings(ledger *l, const void *p, uint32_t len)
{
    return set_kept(l, &l->settings, REC_SETTINGS, p, len);
}

const void *ledger_settings(const ledger *l, uint32_t *len)
{
    *len = l->settings.p ? l->settings.len : 0;
    return l->settings.p;
}

int ledger_set_group_orphans(ledger *l, const void *p, uint32_t len)
{
    return set_kept(l, &l->group_orphans, REC_GROUP_ORPHANS, p, len);
}

const void *ledger_group_orphans(const ledger *l, uint32_t *len)
{
    *len = l->group_orphans.len;
    return l->group_orphans.len ? l->group_orphans.p : NULL;
}

int ledger_get(const ledger *l, const batch_id *b, batch_state *state, uint64_t *step)
{
    if (l->n_buckets == 0 || b->bucket >= l->n_buckets || b->index >= l->per[b->bucket] ||
        past_limit(l, b->epoch))
        return DFLASH_ERANGE;
    batch_state s = BATCH_TODO;
    uint64_t st = 0;
    if (b->epoch < l->n_epochs) {
        const entry *x = l->ep[b->epoch].done ? &committed_entry
                                               : &l->ep[b->epoch].e[b->bucket][b->index];
        s = (batch_state)x->state;
        st = x->step;
    }
    if (state) *state = s;
    if (step) *step = st;
    return 0;
}

bool ledger_epoch_committed(const ledger *l, uint32_t epoch)
{
    return l->n_buckets && epoch < l->n_epochs &&
           l->ep[epoch].count[BATCH_COMMITTED] == l->batches_per_epoch;
}

static int emit_snapshot(void *ctx, journal *t)
{
    ledger *l = ctx;
    int rc;
    if (l->n_buckets) {
        uint8_t p[4 + 4 * LEDGER_MAX_BUCKETS];
        put32(p, l->n_buckets);
        for (uint32_t b = 0; b < l->n_buckets; b++) put32(p + 4 + 4 * b, l->per[b]);
        if ((rc = journal_append(t, REC_PLAN, p, 4 + 4 * l->n_buckets, false))) return rc;
        put64(p, l->plan_id);
        if (l->has_plan_id && (rc = journal_append(t, REC_PLAN_ID, p, 8, false))) return rc;
    }
    uint8_t meta[28];
    put64(meta, l->last_commit_step);
    put64(meta + 8, l->double_acks);
    put64(meta + 16, l->stale_acks);
    put32(meta + 24, l->n_epochs);
    if ((rc = journal_append(t, REC_SNAP_META, meta, sizeof meta, false))) return rc;
    if (l->settings.p &&
        (rc = journal_append(t, REC_SETTINGS, l->settings.p, l->settings.len, false)))
        return rc;
    if (l->group_orphans.len && (rc = journal_append(t, REC_GROUP_ORPHANS, l->group_orphans.p,
                                                     l->group_orphans.len, false)))
        return rc;
    uint8_t *buf = malloc(16 + 9ull * SNAP_CHUNK);
    if (!buf) return DFLASH_ENOMEM;
    for (uint32_t e = 0; e < l->n_epochs && !rc; e++) {
        if (!l->ep[e].done) continue;
        uint8_t d[12];
        put32(d, e);
        put64(d + 4, l->ep[e].done_step);
        rc = journal_append(t, REC_SNAP_DONE, d, sizeof d, false);
    }
    for (uint32_t e = 0; e < l->n_epochs && !rc; e++)
        for (uint32_t b = 0; b < l->n_buckets && !rc && !l->ep[e].done; b++)
            for (uint32_t i0 = 0; i0 < l->per[b] && !rc; i0 += SNAP_CHUNK) {
                uint32_t n = l->per[b] - i0 < SNAP_CHUNK ? l->per[b] - i0 : SNAP_CHUNK;
                bool all_todo = true;
                for (uint32_t k = 0; k < n; k++) {
                    const entry *x = &l->ep[e].e[b][i0 + k];
                    /* An orphan stays IN_FLIGHT in the snapshot: replay re-orphans it. */
                    buf[16 + 9 * k] = (uint8_t)(x->state | (x->orphan ? SNAP_ORPHAN : 0));
                    put64(buf + 16 + 9 * k + 1, x->step);
                    if (x->state != BATCH_TODO) all_todo = false;
                }
                if (all_todo) continue;
                put32(buf, e);
                put32(buf + 4, b);
                put32(buf + 8, i0);
                put32(buf + 12, n);
                rc = journal_append(t, REC_SNAP_CHUNK, buf, 16 + 9 * n, false);
            }
    /* Failure counts after the chunks (a chunk replays over fresh entries only). */
    for (uint32_t e = 0; e < l->n_epochs && !rc; e++)
        for (uint32_t b = 0; b < l->n_buckets && !rc && !l->ep[e].done; b++)
            for (uint32_t i = 0; i < l->per[b] && !rc; i++) {
                if (!l->ep[e].e[b][i].fails) continue;
                uint8_t f[14];
                pack_batch(f, &(batch_id){e, b, i});
                f[12] = (uint8_t)l->ep[e].e[b][i].fails;
                f[13] = (uint8_t)(l->ep[e].e[b][i].fails >> 8);
                rc = journal_append(t, REC_SNAP_FAILS, f, sizeof f, false);
            }
    free(buf);
    return rc;
}

/* Compact again only once the journal doubled past its size now (no thrashing): after a
 * rewrite, its compacted size; after a failed one, the long journal's. */
static void compacted(ledger *l)
{
    if (l->params.compact_bytes) {
        uint64_t twice = 2 * journal_size(l->j);
        l->compact_at = twice > l->params.compact_bytes ? twice : l->params.compact_bytes;
    }
}

/* Compacts past compact_at. A compaction that failed (in writer mode known only once the
 * writer reports it, when journal_size is the long file's again) first moves compact_at, so a
 * disk that refuses rewrites is not asked again at every record. */
static void maybe_compact(ledger *l)
{
    if (!l->compact_at) return;
    uint64_t failed = journal_rewrite_failures(l->j);
    if (failed != l->compactions_failed) {
        l->compactions_failed = failed;
        compacted(l);
    }
    if (journal_size(l->j) > l->compact_at) (void)ledger_compact(l);
}

int ledger_compact(ledger *l)
{
    if (!l->j) return 0;
    int rc = journal_rewrite(l->j, emit_snapshot, l);
    if (rc) {
        LOG_WARN("ledger: journal compaction failed (%s); keeping the long journal",
                 err_str(rc));
        return rc; /* maybe_compact backs off */
    }
    compacted(l);
    return 0;
}

int ledger_barrier(ledger *l)
{
    if (!l->j || !l->params.fsync) return 0;
    return journal_barrier(l->j) ? DFLASH_EIO : 0;
}

int ledger_journal_heal(ledger *l)
{
    if (!l->j || !journal_failure(l->j)) return 0;
    int rc = journal_rewrite(l->j, emit_snapshot, l);
    if (rc == 0) compacted(l);
    return rc;
}

int ledger_writer_start(ledger *l, uv_loop_t *loop, journal_done_fn done, void *ctx)
{
    return l->j ? journal_writer_start(l->j, loop, done, ctx) : 0;
}

void ledger_writer_stop(ledger *l)
{
    if (l->j) journal_writer_stop(l->j);
}

uint64_t ledger_journal_seq(const ledger *l) { return l->j ? journal_last_seq(l->j) : 0; }

void ledger_journal_progress(const ledger *l, uint64_t *done_seq, uint64_t *fail_seq)
{
    *done_seq = l->j ? journal_done_seq(l->j) : 0;
    *fail_seq = l->j ? journal_fail_seq(l->j) : 0;
}

const char *ledger_journal_failure(const ledger *l)
{
    return l->j ? journal_failure(l->j) : NULL;
}

void ledger_set_sync_hook(ledger *l, journal_sync_fn fn, void *ctx)
{
    if (l->j) journal_set_sync_hook(l->j, fn, ctx);
}

void ledger_get_stats(const ledger *l, ledger_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_buckets = l->n_buckets;
    for (uint32_t b = 0; b < l->n_buckets; b++) out->batches_per_bucket[b] = l->per[b];
    out->epochs_opened = l->n_epochs;
    uint32_t handed = past_limit(l, l->n_epochs) ? l->epoch_limit : l->n_epochs;
    out->open_epoch = handed ? handed - 1 : 0;
    bool found = false;
    for (uint32_t e = 0; e < l->n_epochs; e++) {
        const epoch_rec *E = &l->ep[e];
        if (!found && E->count[BATCH_TODO] && !past_limit(l, e)) {
            out->open_epoch = e;
            found = true;
        }
        if (!past_limit(l, e)) out->todo += E->count[BATCH_TODO];
        out->in_flight += E->count[BATCH_IN_FLIGHT];
        out->orphaned += E->orphans;
        out->trained += E->count[BATCH_TRAINED];
        out->committed += E->count[BATCH_COMMITTED];
        out->quarantined += E->count[BATCH_QUARANTINED];
        if (E->count[BATCH_COMMITTED] == l->batches_per_epoch) out->epochs_committed++;
    }
    out->double_acks = l->double_acks;
    out->stale_acks = l->stale_acks;
    out->last_commit_step = l->last_commit_step;
    out->journal_bytes = l->j ? journal_size(l->j) : 0;
    out->replayed_records = l->replayed;
}
