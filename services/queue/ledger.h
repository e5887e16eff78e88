/* ledger: the training ledger of DESIGN.md section 5, persisted in a journal (journal.h).
 *
 * Every batch has a deterministic identity batch_id {epoch, bucket, index}; the plan (how many
 * batches each bucket has per epoch, the same every epoch) comes from the target at registration.
 * Each batch is in one state:
 *
 *   from \ to     TODO  IN_FLIGHT  TRAINED  COMMITTED  QUARANTINED
 *   TODO           -      hand-out   ack(*)     -          -
 *   IN_FLIGHT    requeue    -        ack        -       quarantine
 *   TRAINED      rewind     -         -       commit        -
 *   COMMITTED   rewind(***) -         -         -           -
 *   QUARANTINED  rewind(**) -        ack        -           -
 *   (*) a late ack of a batch that was requeued (its target died after the drafter copied it):
 *       the batch was trained, so it is recorded trained and not handed out again.
 *   (**) ledger_release_quarantine() and ledger_release_quarantined() only (dflash-ctl release).
 *   (***) a drafter resumed from a checkpoint older than the commit; never in a finished epoch
 *       (all COMMITTED: its per-batch steps are freed), where such a rewind is refused.
 * Acking a TRAINED or COMMITTED batch is rejected (DFLASH_EEXISTS) and counted: nothing is
 * recorded as trained twice. Batches of an epoch are handed out only from the *open epoch*: the
 * lowest epoch that still has TODO batches (a rewind can reopen an older one); a new epoch opens
 * when no epoch has TODO left, up to max_epochs (0 = unlimited; the broker sets it to the
 * target's planned epochs once it knows them, ledger_set_max_epochs). Epochs opened past a lower
 * limit (by a journal of a run with a higher one, or by an adopt before the target's plan was
 * known) hand out and adopt nothing, and their TODO batches are not counted as to do.
 *
 * Replay: the journal is replayed at ledger_new. IN_FLIGHT batches come back *orphaned*: the
 * broker restarted and does not know whether a target still holds them or a drafter is training
 * them; they are not handed out, a re-registering target may adopt them (ledger_adopt), a late
 * ack trains them, and ledger_requeue_orphans() (called by the broker once peers had a grace
 * period, e.g. two lease timeouts) returns the rest to TODO.
 *
 * Journal records: PLAN, PLAN_ID, HANDOUT, ADOPT, REQUEUE, ACK(step), QUARANTINE, UNQUARANTINE, FAIL,
 * COMMIT(step) and REWIND(step) (fsynced), SETTINGS (the broker's runtime settings, an opaque
 * payload; fsynced), GROUP_ORPHANS (the broker's orphaned group steps, an opaque payload;
 * fsynced), SNAPSHOT (compaction). Replay reapplies them in order. A journal holding a
 * record type this build does not know (written by a newer one) does not open: DFLASH_ECORRUPT,
 * logged as "unknown journal record type".
 *
 * Durability: by default every record is written (COMMIT, REWIND, PLAN, SETTINGS,
 * GROUP_ORPHANS and UNQUARANTINE also fdatasynced)
 * before the call returns. After ledger_writer_start the journal's disk I/O runs on its writer
 * thread (journal.h): calls return once the record is queued, ledger_journal_seq() names the
 * last record queued, and the done callback (loop thread) reports which are durable; a caller
 * that promises durability (the broker's replies) waits for it. A journal that fails (a full
 * disk, an I/O error) takes no more records and memory stays authoritative; ledger_journal_heal
 * rewrites it whole from memory, which makes it durable again (the broker retries it).
 *
 * Thread: single-threaded (the broker's loop thread). Callers: broker.c; tests; bench.
 */
#ifndef DFLASH_QUEUE_LEDGER_H
#define DFLASH_QUEUE_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

#include "journal.h"

#define LEDGER_MAX_BUCKETS 32

/* A batch's identity; also the broker's "work unit". */
typedef struct {
    uint32_t epoch;  /* 0-based */
    uint32_t bucket; /* < n_buckets of the plan */
    uint32_t index;  /* < batches of that bucket per epoch */
} batch_id;

static inline bool same_batch(const batch_id *a, const batch_id *b)
{
    return a->epoch == b->epoch && a->bucket == b->bucket && a->index == b->index;
}

typedef enum {
    BATCH_TODO = 0,
    BATCH_IN_FLIGHT,
    BATCH_TRAINED,
    BATCH_COMMITTED,
    BATCH_QUARANTINED,
} batch_state;

typedef struct ledger ledger;

typedef struct {
    const char *journal_path; /* NULL: in memory only (tests, bench) */
    uint32_t max_epochs;      /* 0 = unlimited */
    bool fsync; /* fsync COMMIT, REWIND, PLAN(_ID), SETTINGS, GROUP_ORPHANS, UNQUARANTINE (true) */
    uint64_t compact_bytes;   /* rewrite the journal as a snapshot past this size; 0 = never */
} ledger_params;

typedef struct {
    uint32_t n_buckets;
    uint32_t batches_per_bucket[LEDGER_MAX_BUCKETS];
    uint32_t open_epoch;            /* epoch handed out now (== epochs opened - 1, or rewound) */
    /* todo counts the epochs below max_epochs only: those past it hand out nothing */
    uint32_t epochs_opened;
    uint32_t epochs_committed;      /* epochs whose every batch is COMMITTED */
    uint64_t todo, in_flight, orphaned, trained, committed, quarantined; /* all opened epochs */
    uint64_t double_acks;           /* rejected acks of already trained batches */
    uint64_t stale_acks;            /* acks of batches outside the plan */
    uint64_t last_commit_step;
    uint64_t journal_bytes;
    uint64_t replayed_records;
} ledger_stats;

/* Opens the ledger, replaying params->journal_path if it exists. Returns NULL with *err
 * (optional) set on failure (journal unreadable/corrupt: DFLASH_EIO/ECORRUPT/EFORMAT). */
ledger *ledger_new(const ledger_params *params, int *err);
/* Frees; accepts NULL and NULLs *l. */
void ledger_destroy(ledger **l);

/* Sets the batch plan (target registration). The first call fixes it (journaled); later calls
 * with the same plan return 0, with a different one DFLASH_EMISMATCH (another dataset).
 * DFLASH_EINVAL for n_buckets 0 or > LEDGER_MAX_BUCKETS or a bucket with 0 batches. */
int ledger_set_plan(ledger *l, uint32_t n_buckets, const uint32_t *batches_per_bucket);
bool ledger_has_plan(const ledger *l);

/* The plan's identity (a target's batch_plan_identity: its seed, buckets and data), set after
 * ledger_set_plan. The first call fixes it (journaled, fsynced); later calls with the same
 * identity return 0, with another DFLASH_EMISMATCH (the target's seed or data is not the run's).
 * DFLASH_ESTATE before a plan is set. A journal written before identities has a plan without
 * one: the first identity set is adopted. */
int ledger_set_plan_id(ledger *l, uint64_t id);
/* Whether the plan's identity is known; if so it goes to *id (may be NULL). */
bool ledger_plan_id(const ledger *l, uint64_t *id);

/* Replaces max_epochs (0 = unlimited): from now on nothing is handed out or adopted, and no
 * epoch opened, at or past it (the broker passes the target's planned epochs, or --max-epochs,
 * at each registration). Not journaled: epochs already opened stay. */
void ledger_set_max_epochs(ledger *l, uint32_t max_epochs);

/* Bit b set when bucket b has a TODO batch in the open epoch, opening the next epoch first if
 * the current one has no TODO left (and max_epochs allows). 0: nothing to hand out now. */
uint32_t ledger_todo_mask(ledger *l);

/* Hands out the lowest-index TODO batch of bucket in the open epoch: TODO -> IN_FLIGHT.
 * Returns 0 with *out, DFLASH_ENOTFOUND (bucket has nothing to do now), DFLASH_ESTATE (no plan),
 * DFLASH_EINVAL (bucket out of range). */
int ledger_next_todo(ledger *l, uint32_t bucket, batch_id *out);

/* A re-registering target reports a filled slot with batch b: TODO or orphaned IN_FLIGHT ->
 * IN_FLIGHT. DFLASH_EEXISTS (already handed out elsewhere: drop the slot), DFLASH_ESTALE
 * (already trained/committed: drop the slot), DFLASH_EQUARANTINED, DFLASH_ERANGE (not in plan,
 * or an epoch past the next one to open: nothing is opened for it). */
int ledger_adopt(ledger *l, const batch_id *b);

/* IN_FLIGHT -> TODO (its target died, its slot was dropped). DFLASH_ESTATE in other states
 * (harmless: e.g. already acked), DFLASH_ERANGE outside the plan. */
int ledger_requeue(ledger *l, const batch_id *b);

/* Orphaned IN_FLIGHT (from replay) -> TODO. Returns how many. */
uint64_t ledger_requeue_orphans(ledger *l);

/* A drafter trained b at optimizer step: IN_FLIGHT/TODO/QUARANTINED -> TRAINED(step).
 * DFLASH_EEXISTS for TRAINED/COMMITTED (counted in double_acks), DFLASH_ERANGE outside the plan
 * or an epoch not opened (counted in stale_acks). */
int ledger_ack(ledger *l, const batch_id *b, uint64_t step);

/* IN_FLIGHT -> QUARANTINED (redelivered too often). DFLASH_ESTATE otherwise. */
int ledger_quarantine(ledger *l, const batch_id *b);
/* QUARANTINED -> TODO (an operator lets it through again; its failure count restarts at 0),
 * journaled as UNQUARANTINE, fsynced like COMMIT. 0; DFLASH_ESTATE (not quarantined) or
 * DFLASH_ERANGE (outside the plan or an epoch not opened), nothing changed; DFLASH_EIO: released
 * in memory, but the journal is failing (durable once ledger_journal_heal succeeds). In writer
 * mode 0 means queued, as for ledger_set_settings. */
int ledger_release_quarantine(ledger *l, const batch_id *b);
/* Every QUARANTINED batch -> TODO, as ledger_release_quarantine each (one fsync, with the last
 * record). *released (may be NULL): how many. 0, or DFLASH_EIO as above. */
int ledger_release_quarantined(ledger *l, uint64_t *released);

/* A delivery of IN_FLIGHT batch b ended without training it (lease expired, its drafter died
 * holding it): counts it, journaled; the count survives requeues and restarts. Returns the
 * count (>= 1, saturating at 65535), DFLASH_ESTATE (not IN_FLIGHT), DFLASH_ERANGE. The caller
 * decides on quarantine (broker: count > max_redeliveries). */
int ledger_fail(ledger *l, const batch_id *b);
/* A slot holding b was granted to a drafter (a delivery of b). True when b had been delivered
 * before since this ledger was opened (whatever ended that delivery: a lease that expired, a
 * drafter gone holding it, a slot given back unread, a group step aborted, a rewind after it was
 * trained, a release from quarantine); false on its first delivery and outside the plan. Memory
 * only, not journaled. */
bool ledger_note_delivery(ledger *l, const batch_id *b);
/* Failed deliveries of b so far (0 outside the plan or in a finished epoch). */
uint32_t ledger_failures(const ledger *l, const batch_id *b);

/* A durable checkpoint at step exists: every TRAINED batch with step <= step -> COMMITTED; the
 * last commit (stats) is the largest step committed, after a replay too. Journaled with fsync.
 * Returns the number committed (>= 0) or a negative code (DFLASH_EIO). */
int64_t ledger_commit(ledger *l, uint64_t step);

/* A drafter resumed from checkpoint step: every TRAINED or COMMITTED batch with step > step ->
 * TODO (the resumed model lacks them), and last_commit_step is at most step. Journaled with
 * fsync. Returns the number rewound (>= 0) or a negative code: DFLASH_ESTATE, nothing changed,
 * when a finished epoch holds a batch trained after step (which ones is no longer known). */
int64_t ledger_rewind(ledger *l, uint64_t step);

/* The broker's runtime settings (steering.h; opaque here): keeps a copy of the len bytes at p as
 * the last settings, journals them (fsynced like COMMIT) and repeats them in every snapshot.
 * Returns 0, DFLASH_EINVAL (longer than a journal record), DFLASH_ENOMEM (nothing changed), or
 * DFLASH_EIO: kept in memory, but the journal is failing (ledger_journal_failure), so they are
 * durable only once ledger_journal_heal succeeds. In writer mode 0 means queued: durable when
 * the writer reports ledger_journal_seq() done, failed when it reports it failed. */
int ledger_set_settings(ledger *l, const void *p, uint32_t len);
/* The last settings kept (set, or replayed from the journal at ledger_new), with their length in
 * *len; NULL (and 0) when none. Valid until the next ledger_set_settings or ledger_destroy. */
const void *ledger_settings(const ledger *l, uint32_t *len);

/* The broker's orphaned group steps (group.h, group_orphans_encode; opaque here), kept, journaled
 * and repeated in snapshots like the settings (len 0: none left). Returns as ledger_set_settings.
 * ledger_group_orphans: the last ones kept (set, or replayed at ledger_new), NULL (and 0) when
 * none; valid until the next ledger_set_group_orphans or ledger_destroy. */
int ledger_set_group_orphans(ledger *l, const void *p, uint32_t len);
const void *ledger_group_orphans(const ledger *l, uint32_t *len);

/* State (and training step, 0 unless TRAINED/COMMITTED) of b; either out pointer may be NULL.
 * A batch of an epoch not opened yet is TODO. DFLASH_ERANGE outside the plan (or no plan). */
int ledger_get(const ledger *l, const batch_id *b, batch_state *state, uint64_t *step);
/* True when every batch of epoch is COMMITTED. */
bool ledger_epoch_committed(const ledger *l, uint32_t epoch);

/* A durability barrier (a drafter's JournalSync before it publishes a checkpoint): every record
 * appended so far, ACK and HANDOUT records included (never fsynced on their own), becomes
 * durable (journal_barrier). 0 at once for an in-memory ledger or with params.fsync off (nothing
 * is synced then); in writer mode 0 means queued: durable when the writer reports
 * ledger_journal_seq() done, failed when it reports it failed. DFLASH_EIO: the journal is
 * failing (ledger_journal_failure). */
int ledger_barrier(ledger *l);

/* Rewrites the journal as one snapshot (also done automatically past compact_bytes).
 * Returns 0 or a code; a no-op for an in-memory ledger. */
int ledger_compact(ledger *l);

/* While the journal is broken (ledger_journal_failure), rewrites it whole from memory, which
 * holds every operation, the ones whose records failed too: 0 when there is nothing to heal, it
 * healed (inline) or the rewrite is queued or already under way (writer mode: the failure clears
 * once the writer has done it); else a code (the journal stays broken; call again later). */
int ledger_journal_heal(ledger *l);

/* Journal writer thread (see the header comment). 0 and a no-op for an in-memory ledger; else
 * journal_writer_start's codes. done runs on loop's thread. */
int ledger_writer_start(ledger *l, uv_loop_t *loop, journal_done_fn done, void *ctx);
/* Drains and stops the writer (blocks; shutdown only). No-op when not started. */
void ledger_writer_stop(ledger *l);
/* Sequence number of the last journal record queued (0: none or in memory). A reply that
 * depends on the records a request appended waits until journal done_seq reaches it. */
uint64_t ledger_journal_seq(const ledger *l);
/* Durable / first failed record numbers as last reported to the loop thread (0 in memory). */
void ledger_journal_progress(const ledger *l, uint64_t *done_seq, uint64_t *fail_seq);
/* NULL while the journal (if any) takes every record; else why it stopped (journal_failure):
 * what changed since is in memory only, and a broker restart would not see it, until
 * ledger_journal_heal succeeds. */
const char *ledger_journal_failure(const ledger *l);
/* Replaces fdatasync for the journal (tests). No-op in memory. */
void ledger_set_sync_hook(ledger *l, journal_sync_fn fn, void *ctx);

void ledger_get_stats(const ledger *l, ledger_stats *out);
const char *batch_state_name(batch_state s);

#endif
