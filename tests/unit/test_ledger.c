/* test_ledger: the training ledger keeps the promise of DESIGN section 5: after any sequence of
 * broker, target and drafter kills, every batch of every epoch ends in the final model exactly
 * once. Also: hand-out order and epochs, double acks rejected, commit and rewind, quarantine,
 * orphans after a broker restart, replay after a crash at every byte of the last record, a
 * failed journal healed from memory, the operator's release of quarantined batches (fsynced),
 * a failed compaction not retried at every record, the broker's settings payload and its
 * orphaned group steps kept across reopens, compactions and heals, an epoch limit set after an
 * epoch past it was opened, the plan's identity kept and another one refused. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "err.h"
#include "ledger.h"
#include "test_files.h"

#include <uv.h>

static char dir[256];
static char path[300];

static ledger *open_ledger(const char *p, uint32_t max_epochs, uint64_t compact)
{
    ledger_params prm = {p, max_epochs, true, compact};
    int err = 0;
    ledger *l = ledger_new(&prm, &err);
    if (!l) fprintf(stderr, "ledger_new(%s): %s\n", p ? p : "memory", err_str(err));
    return l;
}

static batch_state state_of(ledger *l, uint32_t e, uint32_t b, uint32_t i, uint64_t *step)
{
    batch_state s = (batch_state)-1;
    batch_id id = {e, b, i};
    ledger_get(l, &id, &s, step);
    return s;
}

static void test_handout_and_epochs(void)
{
    ledger *l = open_ledger(NULL, 2, 0);
    batch_id b;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), DFLASH_ESTATE); /* no plan yet */
    CHECK_EQ_INT(ledger_todo_mask(l), 0);
    const uint32_t plan[2] = {3, 1};
    CHECK_EQ_INT(ledger_set_plan(l, 2, plan), 0);
    CHECK_EQ_INT(ledger_set_plan(l, 2, plan), 0); /* the same target again */
    CHECK_EQ_INT(ledger_set_plan(l, 2, (const uint32_t[]){3, 2}), DFLASH_EMISMATCH);
    CHECK_EQ_INT(ledger_set_plan(l, 0, plan), DFLASH_EINVAL);
    CHECK_EQ_INT(ledger_todo_mask(l), 3);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK(b.epoch == 0 && b.bucket == 0 && b.index == 0);
    CHECK_EQ_INT(ledger_next_todo(l, 1, &b), 0);
    CHECK(b.epoch == 0 && b.bucket == 1 && b.index == 0);
    CHECK_EQ_INT(ledger_todo_mask(l), 1);                    /* bucket 1 done in epoch 0 */
    CHECK_EQ_INT(ledger_next_todo(l, 1, &b), DFLASH_ENOTFOUND); /* epoch 1 not open yet */
    CHECK_EQ_INT(ledger_next_todo(l, 2, &b), DFLASH_EINVAL);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK_EQ_INT(b.index, 2);
    /* Epoch 0 fully handed out: epoch 1 opens. */
    CHECK_EQ_INT(ledger_todo_mask(l), 3);
    CHECK_EQ_INT(ledger_next_todo(l, 1, &b), 0);
    CHECK(b.epoch == 1 && b.index == 0);
    /* A requeued epoch-0 batch reopens epoch 0 before epoch 1 continues. */
    batch_id e0 = {0, 0, 1};
    CHECK_EQ_INT(ledger_requeue(l, &e0), 0);
    CHECK_EQ_INT(ledger_requeue(l, &e0), DFLASH_ESTATE);
    CHECK_EQ_INT(ledger_todo_mask(l), 1);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK(b.epoch == 0 && b.index == 1);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    /* max_epochs 2: nothing more after epoch 1. */
    CHECK_EQ_INT(ledger_todo_mask(l), 0);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), DFLASH_ENOTFOUND);
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.epochs_opened, 2);
    CHECK_EQ_INT(st.in_flight, 8);
    CHECK_EQ_INT(st.todo, 0);
    batch_id outside = {2, 0, 0};
    CHECK_EQ_INT(ledger_get(l, &outside, NULL, NULL), DFLASH_ERANGE);
    ledger_destroy(&l);
    CHECK(l == NULL);
    ledger_destroy(&l);
}

static void test_ack_commit_rewind(void)
{
    ledger *l = open_ledger(NULL, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){6}), 0);
    batch_id b[6];
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(ledger_next_todo(l, 0, &b[i]), 0);
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(ledger_ack(l, &b[i], 10 + (uint64_t)i), 0);
    /* A second ack of a trained batch is rejected and counted: never trained twice. */
    CHECK_EQ_INT(ledger_ack(l, &b[2], 99), DFLASH_EEXISTS);
    uint64_t step = 0;
    CHECK_EQ_INT(state_of(l, 0, 0, 2, &step), BATCH_TRAINED);
    CHECK_EQ_INT(step, 12);
    CHECK_EQ_INT(ledger_commit(l, 11), 2); /* steps 10, 11 */
    CHECK_EQ_INT(state_of(l, 0, 0, 1, NULL), BATCH_COMMITTED);
    CHECK_EQ_INT(ledger_ack(l, &b[1], 50), DFLASH_EEXISTS);
    /* The drafter crashed and resumed from its checkpoint at step 13: 14, 15 are retrained. */
    CHECK_EQ_INT(ledger_rewind(l, 13), 2);
    CHECK_EQ_INT(state_of(l, 0, 0, 4, NULL), BATCH_TODO);
    CHECK_EQ_INT(state_of(l, 0, 0, 3, NULL), BATCH_TRAINED);
    CHECK_EQ_INT(ledger_rewind(l, 13), 0);
    batch_id again;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &again), 0);
    CHECK_EQ_INT(again.index, 4);
    CHECK_EQ_INT(ledger_ack(l, &again, 14), 0);
    CHECK_EQ_INT(ledger_commit(l, 20), 3);
    CHECK(!ledger_epoch_committed(l, 0));
    CHECK_EQ_INT(ledger_next_todo(l, 0, &again), 0);
    CHECK_EQ_INT(ledger_ack(l, &again, 21), 0);
    CHECK_EQ_INT(ledger_commit(l, 21), 1);
    CHECK(ledger_epoch_committed(l, 0));
    /* A finished epoch keeps answering (its per-batch memory is released). */
    CHECK_EQ_INT(state_of(l, 0, 0, 3, NULL), BATCH_COMMITTED);
    CHECK_EQ_INT(ledger_ack(l, &b[3], 30), DFLASH_EEXISTS);
    CHECK_EQ_INT(ledger_requeue(l, &b[3]), DFLASH_ESTATE);
    CHECK_EQ_INT(ledger_adopt(l, &b[3]), DFLASH_ESTALE);
    /* ... but cannot go back before it: which of its batches came after step 0 is forgotten. */
    CHECK_EQ_INT(ledger_rewind(l, 0), DFLASH_ESTATE);
    CHECK_EQ_INT(ledger_rewind(l, 21), 0);
    /* An ack outside the plan is counted, not applied. */
    batch_id bogus = {0, 0, 6};
    CHECK_EQ_INT(ledger_ack(l, &bogus, 1), DFLASH_ERANGE);
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.double_acks, 3);
    CHECK_EQ_INT(st.stale_acks, 1);
    CHECK_EQ_INT(st.committed, 6);
    CHECK_EQ_INT(st.epochs_committed, 1);
    CHECK_EQ_INT(st.last_commit_step, 21);
    ledger_destroy(&l);
}

static uint64_t committed_count(ledger *l)
{
    ledger_stats st;
    ledger_get_stats(l, &st);
    return st.committed;
}

/* A drafter resumed from a checkpoint older than the last commit (--resume of an older
 * checkpoint into another directory): the batches committed after that step are not in its
 * model and are trained again, also after a restart and a compaction. In a finished epoch, whose
 * per-batch steps are forgotten, a rewind before its last batch is refused and changes nothing. */
static void test_rewind_below_commit(void)
{
    char jp[320];
    snprintf(jp, sizeof jp, "%s/rewind.journal", dir);
    unlink(jp);
    ledger *l = open_ledger(jp, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){20}), 0);
    batch_id b;
    for (uint64_t s = 1; s <= 10; s++) {
        CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
        CHECK_EQ_INT(ledger_ack(l, &b, s), 0);
    }
    CHECK_EQ_INT(ledger_commit(l, 10), 10);
    CHECK_EQ_INT(ledger_rewind(l, 5), 5);
    CHECK_EQ_INT(committed_count(l), 5);
    CHECK_EQ_INT(state_of(l, 0, 0, 4, NULL), BATCH_COMMITTED);
    CHECK_EQ_INT(state_of(l, 0, 0, 5, NULL), BATCH_TODO);
    for (int round = 0; round < 2; round++) { /* replayed, then from a snapshot */
        ledger_destroy(&l);
        l = open_ledger(jp, 0, 0);
        CHECK(l != NULL);
        if (!l) return;
        CHECK_EQ_INT(committed_count(l), 5);
        CHECK_EQ_INT(state_of(l, 0, 0, 5, NULL), BATCH_TODO);
        ledger_stats st;
        ledger_get_stats(l, &st);
        CHECK_EQ_INT(st.todo, 15);
        CHECK_EQ_INT(st.last_commit_step, 5);
        if (round == 0) CHECK_EQ_INT(ledger_compact(l), 0);
    }
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK_EQ_INT(b.index, 5);
    ledger_destroy(&l);

    unlink(jp);
    l = open_ledger(jp, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){4}), 0);
    for (uint64_t s = 1; s <= 4; s++) {
        CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
        CHECK_EQ_INT(ledger_ack(l, &b, s), 0);
    }
    CHECK_EQ_INT(ledger_commit(l, 4), 4);
    CHECK(ledger_epoch_committed(l, 0));
    for (int round = 0; round < 2; round++) { /* live, then from a snapshot */
        CHECK_EQ_INT(ledger_rewind(l, 2), DFLASH_ESTATE);
        CHECK_EQ_INT(committed_count(l), 4);
        CHECK_EQ_INT(ledger_rewind(l, 4), 0);
        CHECK_EQ_INT(ledger_compact(l), 0);
        ledger_destroy(&l);
        l = open_ledger(jp, 0, 0);
        CHECK(l != NULL);
        if (!l) return;
    }
    ledger_destroy(&l);

    /* A finished epoch's bound is its own last batch's step, not the last commit, also from a
     * snapshot: a resume between the two rewinds the later epoch and is not refused. */
    unlink(jp);
    l = open_ledger(jp, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){2}), 0);
    for (uint64_t s = 1; s <= 3; s++) { /* epoch 0 at steps 1 and 2, epoch 1's first at 5 */
        CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
        CHECK_EQ_INT(ledger_ack(l, &b, s == 3 ? 5 : s), 0);
    }
    CHECK_EQ_INT(ledger_commit(l, 5), 3);
    CHECK(ledger_epoch_committed(l, 0));
    CHECK_EQ_INT(ledger_compact(l), 0);
    ledger_destroy(&l);
    l = open_ledger(jp, 0, 0);
    CHECK(l != NULL);
    if (!l) return;
    CHECK(ledger_epoch_committed(l, 0));
    CHECK_EQ_INT(ledger_rewind(l, 1), DFLASH_ESTATE); /* epoch 0's step 2 is after it */
    CHECK_EQ_INT(ledger_rewind(l, 3), 1);             /* after epoch 0, before step 5 */
    CHECK_EQ_INT(state_of(l, 1, 0, 0, NULL), BATCH_TODO);
    ledger_destroy(&l);
    unlink(jp);
}

/* The report of an older checkpoint that arrives after a newer one's (a retried report) commits
 * what it covers and leaves the last commit at the newer step, live and after a restart: the
 * journal replays to the same state (the group hold waits for the member at the last commit). */
static void test_commit_older_report(void)
{
    char jp[320];
    snprintf(jp, sizeof jp, "%s/commit-older.journal", dir);
    unlink(jp);
    ledger *l = open_ledger(jp, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){4}), 0);
    batch_id b;
    for (uint64_t s = 1; s <= 3; s++) {
        CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
        CHECK_EQ_INT(ledger_ack(l, &b, 3 * s), 0); /* steps 3, 6, 9 */
    }
    CHECK_EQ_INT(ledger_commit(l, 8), 2);
    CHECK_EQ_INT(ledger_commit(l, 5), 0); /* the older checkpoint's report, late */
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.last_commit_step, 8);
    for (int round = 0; round < 2; round++) { /* replayed, then from a snapshot */
        ledger_destroy(&l);
        l = open_ledger(jp, 0, 0);
        CHECK(l != NULL);
        if (!l) return;
        ledger_get_stats(l, &st);
        CHECK_EQ_INT(st.last_commit_step, 8);
        CHECK_EQ_INT(st.committed, 2);
        CHECK_EQ_INT(st.trained, 1);
        if (round == 0) CHECK_EQ_INT(ledger_compact(l), 0);
    }
    ledger_destroy(&l);
    unlink(jp);
}

/* A restart with a lower --max-epochs than the journal already opened: the journal is not
 * corrupt (it was reported so once compacted), its epochs come back as they were, and nothing
 * is handed out from an epoch at or past the new limit. */
static void test_lower_max_epochs(void)
{
    char jp[320];
    snprintf(jp, sizeof jp, "%s/epochs.journal", dir);
    for (int compact = 0; compact < 2; compact++) {
        unlink(jp);
        ledger *l = open_ledger(jp, 0, 0);
        CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){2}), 0);
        batch_id b;
        for (uint64_t s = 1; s <= 5; s++) { /* epochs 0 and 1 trained, 2 has one in flight */
            ledger_todo_mask(l);
            CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
            if (s < 5) CHECK_EQ_INT(ledger_ack(l, &b, s), 0);
        }
        if (compact) CHECK_EQ_INT(ledger_compact(l), 0);
        ledger_destroy(&l);
        l = open_ledger(jp, 2, 0);
        CHECK(l != NULL);
        if (!l) continue;
        ledger_stats st;
        ledger_get_stats(l, &st);
        CHECK_EQ_INT(st.epochs_opened, 3);
        CHECK_EQ_INT(st.trained, 4);
        CHECK_EQ_INT(ledger_requeue_orphans(l), 1); /* epoch 2's batch back to to-do */
        CHECK_EQ_INT(ledger_todo_mask(l), 0);       /* ... but not handed out */
        CHECK_EQ_INT(ledger_next_todo(l, 0, &b), DFLASH_ENOTFOUND);
        ledger_destroy(&l);
    }
    unlink(jp);
}

/* A peer may name a batch of any epoch: adopting one beyond the next epoch is refused and opens
 * nothing (it once allocated every epoch up to it, journaled, so each restart did it again). */
static void test_adopt_far_epoch(void)
{
    ledger *l = open_ledger(NULL, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){4}), 0);
    batch_id b;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0); /* epoch 0 open */
    CHECK_EQ_INT(ledger_adopt(l, &(batch_id){100000, 0, 0}), DFLASH_ERANGE);
    CHECK_EQ_INT(ledger_adopt(l, &(batch_id){2, 0, 0}), DFLASH_ERANGE);
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.epochs_opened, 1);
    /* The next epoch may have been opened by hand-outs a power loss forgot. */
    CHECK_EQ_INT(ledger_adopt(l, &(batch_id){1, 0, 0}), 0);
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.epochs_opened, 2);
    CHECK_EQ_INT(st.in_flight, 2);
    ledger_destroy(&l);
}

static void test_quarantine(void)
{
    ledger *l = open_ledger(NULL, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){2}), 0);
    batch_id b;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK_EQ_INT(ledger_quarantine(l, &b), 0);
    CHECK_EQ_INT(state_of(l, 0, 0, 0, NULL), BATCH_QUARANTINED);
    CHECK_EQ_INT(ledger_quarantine(l, &b), DFLASH_ESTATE);
    CHECK_EQ_INT(ledger_adopt(l, &b), DFLASH_EQUARANTINED);
    /* A quarantined batch is not handed out again... */
    batch_id c;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &c), 0);
    CHECK_EQ_INT(c.index, 1);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &c), 0);
    CHECK_EQ_INT(c.epoch, 1); /* epoch 0 has no to-do left */
    /* ...until an operator releases it. */
    CHECK_EQ_INT(ledger_release_quarantine(l, &b), 0);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &c), 0);
    CHECK(c.epoch == 0 && c.index == 0);
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.quarantined, 0);
    ledger_destroy(&l);
}

/* A batch's failed deliveries are counted across requeues, broker restarts (journal replay) and
 * compaction; releasing it from quarantine starts the count again. */
static void test_fail_count_survives(void)
{
    unlink(path);
    ledger *l = open_ledger(path, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){4}), 0);
    batch_id b, c;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK_EQ_INT(ledger_fail(l, &b), 1);
    CHECK_EQ_INT(ledger_requeue(l, &b), 0);
    CHECK_EQ_INT(ledger_fail(l, &b), DFLASH_ESTATE); /* TODO: not in flight */
    CHECK_EQ_INT(ledger_next_todo(l, 0, &c), 0);     /* produced again */
    CHECK(c.index == b.index);
    CHECK_EQ_INT(ledger_fail(l, &b), 2);
    CHECK_EQ_INT(ledger_requeue(l, &b), 0);
    ledger_destroy(&l);
    for (int round = 0; round < 2; round++) { /* replay, then replay of a snapshot */
        l = open_ledger(path, 0, 0);
        CHECK(l != NULL);
        if (!l) return;
        CHECK_EQ_INT(ledger_failures(l, &b), 2);
        if (round == 0) CHECK_EQ_INT(ledger_compact(l), 0);
        ledger_destroy(&l);
    }
    l = open_ledger(path, 0, 0);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &c), 0);
    CHECK_EQ_INT(ledger_fail(l, &c), 3);
    CHECK_EQ_INT(ledger_quarantine(l, &c), 0);
    CHECK_EQ_INT(ledger_release_quarantine(l, &c), 0);
    CHECK_EQ_INT(ledger_failures(l, &c), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK_EQ_INT(ledger_failures(l, &c), 0);
    CHECK_EQ_INT(state_of(l, 0, 0, 0, NULL), BATCH_TODO);
    ledger_destroy(&l);
}

static int syncs;

static int count_sync(void *ctx, int fd)
{
    (void)ctx, (void)fd;
    syncs++;
    return 0;
}

/* The operator's release of every quarantined batch (dflash-ctl release): all of them, across
 * epochs, back to to-do with a fresh count of tries, made durable by one fsync (each record
 * fsynced: a release that a crash forgets would leave the batches lost to the run), and a
 * restarted broker replays them released. A single release is fsynced too. */
static void test_release_all_quarantined(void)
{
    unlink(path);
    ledger *l = open_ledger(path, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){2}), 0);
    batch_id b[4];
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(ledger_next_todo(l, 0, &b[i]), 0); /* 2 epochs */
    CHECK_EQ_INT(b[3].epoch, 1);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(ledger_fail(l, &b[i]), 1);
        CHECK_EQ_INT(ledger_quarantine(l, &b[i]), 0);
    }
    ledger_set_sync_hook(l, count_sync, NULL);
    uint64_t n = 99;
    CHECK_EQ_INT(ledger_release_quarantine(l, &b[3]), DFLASH_ESTATE); /* in flight */
    CHECK_EQ_INT(ledger_release_quarantine(l, &(batch_id){0, 0, 2}), DFLASH_ERANGE);
    CHECK_EQ_INT(syncs, 0);
    CHECK_EQ_INT(ledger_release_quarantine(l, &b[1]), 0);
    CHECK_EQ_INT(syncs, 1);
    CHECK_EQ_INT(ledger_release_quarantined(l, &n), 0);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(syncs, 2);
    CHECK_EQ_INT(ledger_release_quarantined(l, &n), 0); /* none left: nothing written */
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(syncs, 2);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(l != NULL);
    if (!l) return;
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.quarantined, 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(state_of(l, b[i].epoch, 0, b[i].index, NULL), BATCH_TODO);
        CHECK_EQ_INT(ledger_failures(l, &b[i]), 0);
    }
    ledger_destroy(&l);
}

/* Fingerprint of every batch's state and step, to compare ledgers. */
static uint64_t fingerprint(ledger *l, uint32_t epochs, uint32_t n_buckets, const uint32_t *per)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t e = 0; e < epochs; e++)
        for (uint32_t b = 0; b < n_buckets; b++)
            for (uint32_t i = 0; i < per[b]; i++) {
                uint64_t step = 0;
                batch_state s = state_of(l, e, b, i, &step);
                h = (h ^ (uint64_t)s) * 1099511628211ull;
                h = (h ^ step) * 1099511628211ull;
            }
    return h;
}

static void test_replay_and_orphans(void)
{
    unlink(path);
    const uint32_t plan[2] = {4, 4};
    ledger *l = open_ledger(path, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 2, plan), 0);
    batch_id b[6];
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(ledger_next_todo(l, (uint32_t)i % 2, &b[i]), 0);
    CHECK_EQ_INT(ledger_ack(l, &b[0], 1), 0);
    CHECK_EQ_INT(ledger_ack(l, &b[1], 2), 0);
    CHECK_EQ_INT(ledger_commit(l, 1), 1);
    CHECK_EQ_INT(ledger_requeue(l, &b[2]), 0);
    CHECK_EQ_INT(ledger_quarantine(l, &b[3]), 0);
    uint64_t fp = fingerprint(l, 1, 2, plan);
    ledger_destroy(&l);

    /* The broker restarts: the same states come back... */
    l = open_ledger(path, 0, 0);
    CHECK(l != NULL);
    if (!l) return;
    CHECK(ledger_has_plan(l));
    CHECK(fingerprint(l, 1, 2, plan) == fp);
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.last_commit_step, 1);
    CHECK_EQ_INT(st.orphaned, 2); /* b[4], b[5] were in flight */
    /* ...in-flight batches are orphaned: not handed out again while their holders may still
     * report; a target re-registering adopts one, a late ack trains the other. */
    batch_id n;
    for (int i = 0; i < 10; i++) {
        int rc = ledger_next_todo(l, 0, &n);
        if (rc) break;
        CHECK(!(n.epoch == b[4].epoch && n.bucket == b[4].bucket && n.index == b[4].index));
    }
    CHECK_EQ_INT(ledger_adopt(l, &b[4]), 0);
    CHECK_EQ_INT(ledger_adopt(l, &b[4]), DFLASH_EEXISTS); /* now owned */
    CHECK_EQ_INT(ledger_adopt(l, &b[0]), DFLASH_ESTALE);  /* already committed */
    ledger_destroy(&l);

    /* Second restart: the adopted batch is orphaned again (it was in flight at this boot), and
     * after the grace period the broker returns orphans to to-do. */
    l = open_ledger(path, 0, 0);
    ledger_get_stats(l, &st);
    uint64_t orphans_before = st.orphaned;
    CHECK(orphans_before >= 2);
    CHECK_EQ_INT(ledger_ack(l, &b[5], 3), 0); /* a late ack */
    CHECK_EQ_INT(ledger_requeue_orphans(l), orphans_before - 1);
    CHECK_EQ_INT(state_of(l, b[4].epoch, b[4].bucket, b[4].index, NULL), BATCH_TODO);
    fp = fingerprint(l, 2, 2, plan);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(fingerprint(l, 2, 2, plan) == fp);
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.orphaned, 0);
    /* Compaction keeps every state, and replay of the snapshot gives the same ledger. */
    uint64_t big = st.journal_bytes;
    CHECK_EQ_INT(ledger_compact(l), 0);
    ledger_get_stats(l, &st);
    CHECK(st.journal_bytes < big);
    CHECK(fingerprint(l, 2, 2, plan) == fp);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(fingerprint(l, 2, 2, plan) == fp);
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.last_commit_step, 1);
    CHECK_EQ_INT(ledger_set_plan(l, 2, (const uint32_t[]){4, 5}), DFLASH_EMISMATCH);
    ledger_destroy(&l);
    unlink(path);
}

/* The plan's identity (the target's digest of its seed, buckets and data): the first one is
 * journaled, another is refused, and it survives a reopen and a compaction; a journal whose plan
 * has none (written before identities) adopts the first one sent. */
static void test_plan_identity(void)
{
    unlink(path);
    ledger *l = open_ledger(path, 0, 0);
    uint64_t id = 1;
    CHECK_EQ_INT(ledger_set_plan_id(l, 0x1234), DFLASH_ESTATE); /* no plan yet */
    CHECK(!ledger_plan_id(l, &id));
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){4}), 0);
    CHECK(!ledger_plan_id(l, NULL)); /* a plan without identity: an old target's, an old journal */
    ledger_destroy(&l);

    /* an old journal (PLAN alone) + a target that sends its identity: adopted and journaled */
    l = open_ledger(path, 0, 0);
    CHECK(ledger_has_plan(l) && !ledger_plan_id(l, NULL));
    CHECK_EQ_INT(ledger_set_plan_id(l, 0xfeedbeef00c0ffeeull), 0);
    CHECK_EQ_INT(ledger_set_plan_id(l, 0xfeedbeef00c0ffeeull), 0); /* the same target again */
    CHECK_EQ_INT(ledger_set_plan_id(l, 0xfeedbeef00c0ffefull), DFLASH_EMISMATCH);
    batch_id b;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK_EQ_INT(ledger_ack(l, &b, 1), 0);
    ledger_destroy(&l);

    /* replayed: the identity is the journal's, another one is still refused */
    l = open_ledger(path, 0, 0);
    CHECK(ledger_plan_id(l, &id) && id == 0xfeedbeef00c0ffeeull);
    CHECK_EQ_INT(ledger_set_plan_id(l, 5), DFLASH_EMISMATCH);
    CHECK_EQ_INT(state_of(l, 0, 0, 0, NULL), BATCH_TRAINED); /* the refusal changed nothing */
    CHECK_EQ_INT(ledger_compact(l), 0); /* the snapshot keeps it */
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    id = 0;
    CHECK(ledger_plan_id(l, &id) && id == 0xfeedbeef00c0ffeeull);
    CHECK_EQ_INT(ledger_set_plan_id(l, 5), DFLASH_EMISMATCH);
    CHECK_EQ_INT(state_of(l, 0, 0, 0, NULL), BATCH_TRAINED);
    ledger_destroy(&l);
    unlink(path);
}

static void test_truncation_every_byte(void)
{
    unlink(path);
    const uint32_t plan[1] = {3};
    ledger *l = open_ledger(path, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, plan), 0);
    batch_id b;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    ledger_stats st;
    ledger_get_stats(l, &st);
    uint64_t before = st.journal_bytes;
    CHECK_EQ_INT(ledger_ack(l, &b, 7), 0); /* the last record: an ACK */
    ledger_get_stats(l, &st);
    uint64_t after = st.journal_bytes;
    CHECK_EQ_INT(after, test_file_size(path));
    ledger_destroy(&l);
    char cut[320];
    snprintf(cut, sizeof cut, "%s.cut", path);
    int wrong = 0;
    for (uint64_t len = before; len <= after; len++) {
        test_copy_prefix(path, cut, len);
        l = open_ledger(cut, 0, 0);
        if (!l) {
            wrong++;
            continue;
        }
        uint64_t step = 0;
        batch_state s = state_of(l, 0, 0, 0, &step);
        /* Whole record: trained at 7; any cut inside it: still in flight (orphaned), and the
         * ledger works on: the drafter's ack can be applied again. */
        if (len == after ? (s != BATCH_TRAINED || step != 7) : s != BATCH_IN_FLIGHT) wrong++;
        if (len < after && ledger_ack(l, &b, 7) != 0) wrong++;
        if (state_of(l, 0, 0, 1, NULL) != BATCH_TODO) wrong++;
        ledger_destroy(&l);
    }
    CHECK_EQ_INT(wrong, 0);
    unlink(cut);
    unlink(path);
}

/* The invariant, by simulation: a target produces, a drafter trains and checkpoints, and any of
 * the three may be killed at any time. The "model" is the list of batches in the drafter's
 * latest checkpoint plus what it trained since; a drafter kill drops what it trained since its
 * checkpoint and the broker rewinds. At the end every batch of every epoch must be in the final
 * checkpoint exactly once and COMMITTED in the ledger. */
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

#define SIM_EPOCHS 3
#define SIM_BUCKETS 3
#define SIM_MAXB 40

static void test_exactly_once(void)
{
    const uint32_t plan[SIM_BUCKETS] = {40, 17, 5};
    uint64_t total = SIM_EPOCHS * (40 + 17 + 5);
    static uint8_t in_model[SIM_EPOCHS][SIM_BUCKETS][SIM_MAXB];  /* times in the checkpoint */
    static uint8_t in_recent[SIM_EPOCHS][SIM_BUCKETS][SIM_MAXB]; /* times since it */
    int double_trained = 0, bad_replies = 0;
    for (int round = 0; round < 20; round++) {
        unlink(path);
        memset(in_model, 0, sizeof in_model);
        memset(in_recent, 0, sizeof in_recent);
        /* Half the rounds compact often, to replay snapshots too. */
        uint64_t compact = round % 2 ? 600 : 0;
        ledger *l = open_ledger(path, SIM_EPOCHS, compact);
        if (!l) {
            bad_replies++;
            break;
        }
        CHECK_EQ_INT(ledger_set_plan(l, SIM_BUCKETS, plan), 0);
        batch_id target[8]; /* batches the target is producing or holding in slots */
        int n_target = 0;
        uint64_t step = 0, ckpt = 0;
        int guard = 0;
        for (;;) {
            if (++guard > 100000) {
                bad_replies++;
                break;
            }
            uint32_t mask = ledger_todo_mask(l);
            if (!mask && n_target == 0) {
                ledger_stats st;
                ledger_get_stats(l, &st);
                if (st.in_flight == 0) break;
                ledger_requeue_orphans(l); /* nobody holds them: the grace period ends */
                continue;
            }
            uint32_t ev = rnd(100);
            if (ev < 40 && mask && n_target < 8) { /* work request */
                uint32_t b;
                do b = rnd(SIM_BUCKETS);
                while (!(mask & (1u << b)));
                if (ledger_next_todo(l, b, &target[n_target]) == 0) n_target++;
                else bad_replies++;
            } else if (ev < 80 && n_target) { /* delivered and trained */
                uint32_t k = rnd((uint32_t)n_target);
                batch_id b = target[k];
                target[k] = target[--n_target];
                in_recent[b.epoch][b.bucket][b.index]++;
                if (in_model[b.epoch][b.bucket][b.index] + in_recent[b.epoch][b.bucket][b.index] >
                    1)
                    double_trained++;
                if (ledger_ack(l, &b, ++step) != 0) bad_replies++;
            } else if (ev < 88) { /* checkpoint */
                for (int e = 0; e < SIM_EPOCHS; e++)
                    for (int b = 0; b < SIM_BUCKETS; b++)
                        for (int i = 0; i < SIM_MAXB; i++) {
                            in_model[e][b][i] += in_recent[e][b][i];
                            in_recent[e][b][i] = 0;
                        }
                ckpt = step;
                if (ledger_commit(l, ckpt) < 0) bad_replies++;
            } else if (ev < 92) { /* drafter killed: resumes from its checkpoint */
                memset(in_recent, 0, sizeof in_recent);
                step = ckpt;
                if (ledger_rewind(l, ckpt) < 0) bad_replies++;
            } else if (ev < 96) { /* target killed: its batches go back to to-do */
                for (int k = 0; k < n_target; k++)
                    if (ledger_requeue(l, &target[k]) != 0) bad_replies++;
                n_target = 0;
            } else { /* broker killed and restarted; the target re-registers its slots */
                ledger_destroy(&l);
                l = open_ledger(path, SIM_EPOCHS, compact);
                if (!l) {
                    bad_replies++;
                    break;
                }
                CHECK_EQ_INT(ledger_set_plan(l, SIM_BUCKETS, plan), 0);
                for (int k = 0; k < n_target; k++)
                    if (ledger_adopt(l, &target[k]) != 0) bad_replies++;
                if (rnd(2)) ledger_requeue_orphans(l); /* nobody else holds anything */
            }
        }
        if (!l) break;
        /* The run ends with a final checkpoint. */
        for (int e = 0; e < SIM_EPOCHS; e++)
            for (int b = 0; b < SIM_BUCKETS; b++)
                for (int i = 0; i < SIM_MAXB; i++) in_model[e][b][i] += in_recent[e][b][i];
        ledger_commit(l, step);
        uint64_t once = 0, other = 0;
        for (int e = 0; e < SIM_EPOCHS; e++)
            for (int b = 0; b < SIM_BUCKETS; b++)
                for (uint32_t i = 0; i < plan[b]; i++) {
                    if (in_model[e][b][i] == 1 && state_of(l, (uint32_t)e, (uint32_t)b, i,
                                                           NULL) == BATCH_COMMITTED)
                        once++;
                    else
                        other++;
                }
        CHECK_EQ_INT(once, total);
        CHECK_EQ_INT(other, 0);
        for (int e = 0; e < SIM_EPOCHS; e++) CHECK(ledger_epoch_committed(l, (uint32_t)e));
        ledger_destroy(&l);
        /* And the journal agrees after one more restart. */
        l = open_ledger(path, SIM_EPOCHS, compact);
        ledger_stats st;
        ledger_get_stats(l, &st);
        CHECK_EQ_INT(st.committed, total);
        CHECK_EQ_INT(st.epochs_committed, SIM_EPOCHS);
        ledger_destroy(&l);
    }
    CHECK_EQ_INT(double_trained, 0);
    CHECK_EQ_INT(bad_replies, 0);
    unlink(path);
}

/* A disk that is full while *ctx: syncs fail (a journal sync hook). */
static int full_disk_sync(void *ctx, int fd)
{
    if (__atomic_load_n((const bool *)ctx, __ATOMIC_SEQ_CST)) return DFLASH_EIO;
    return fdatasync(fd) == 0 ? 0 : DFLASH_EIO;
}

/* A journal that failed (a full disk) used to stay broken until a restart, which replayed it as
 * written before the failure: acks and commits since were lost. ledger_journal_heal rewrites it
 * from memory once the disk takes it; a restart then sees what changed while it was failing. */
static void test_journal_heals(void)
{
    unlink(path);
    ledger *l = open_ledger(path, 0, 0);
    bool full = false;
    ledger_set_sync_hook(l, full_disk_sync, &full);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){4}), 0);
    batch_id b[4];
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(ledger_next_todo(l, 0, &b[i]), 0);
    CHECK_EQ_INT(ledger_ack(l, &b[0], 1), 0);
    CHECK_EQ_INT(ledger_journal_heal(l), 0); /* nothing to heal */
    full = true;
    CHECK_EQ_INT(ledger_commit(l, 1), DFLASH_EIO); /* the journal breaks here */
    CHECK(ledger_journal_failure(l) != NULL);
    CHECK_EQ_INT(ledger_ack(l, &b[1], 2), 0); /* in memory only, for now */
    CHECK_EQ_INT(ledger_ack(l, &b[2], 3), 0);
    CHECK_EQ_INT(ledger_journal_heal(l), DFLASH_EIO); /* the disk is still full */
    CHECK(ledger_journal_failure(l) != NULL);
    full = false;
    CHECK_EQ_INT(ledger_journal_heal(l), 0);
    CHECK(ledger_journal_failure(l) == NULL);
    CHECK_EQ_INT(ledger_commit(l, 2), 1); /* records are taken again: b[1] */
    ledger_destroy(&l);

    l = open_ledger(path, 0, 0);
    uint64_t step = 0;
    CHECK_EQ_INT(state_of(l, 0, 0, 0, NULL), BATCH_COMMITTED);
    CHECK_EQ_INT(state_of(l, 0, 0, 1, NULL), BATCH_COMMITTED);
    CHECK_EQ_INT(state_of(l, 0, 0, 2, &step), BATCH_TRAINED); /* acked while it was failing */
    CHECK_EQ_INT(step, 3);
    CHECK_EQ_INT(state_of(l, 0, 0, 3, NULL), BATCH_IN_FLIGHT); /* an orphan of the restart */
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.last_commit_step, 2);
    CHECK_EQ_INT(st.orphaned, 1);
    ledger_destroy(&l);
    unlink(path);
}

/* True when the payload get returns from l is the string want (with its NUL). */
static bool payload_is(const void *(*get)(const ledger *, uint32_t *), const ledger *l,
                       const char *want)
{
    uint32_t len;
    const void *p = get(l, &len);
    return p && len == strlen(want) + 1 && memcmp(p, want, len) == 0;
}

static bool settings_are(const ledger *l, const char *want)
{
    return payload_is(ledger_settings, l, want);
}

static bool group_orphans_are(const ledger *l, const char *want)
{
    return payload_is(ledger_group_orphans, l, want);
}

/* The broker's runtime settings (an opaque payload; the last one counts) survive a reopen, a
 * compaction, and a journal that failed while they were set and was healed from memory. */
static void test_settings_kept(void)
{
    unlink(path);
    ledger *l = open_ledger(path, 0, 0);
    uint32_t len = 1;
    CHECK(ledger_settings(l, &len) == NULL && len == 0);
    CHECK_EQ_INT(ledger_set_settings(l, "paused", 7), 0);
    CHECK_EQ_INT(ledger_set_settings(l, "draining", 9), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(settings_are(l, "draining"));
    CHECK_EQ_INT(ledger_compact(l), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(settings_are(l, "draining")); /* from the snapshot */

    bool full = true;
    ledger_set_sync_hook(l, full_disk_sync, &full);
    CHECK_EQ_INT(ledger_set_settings(l, "running", 8), DFLASH_EIO); /* fsynced: the journal breaks */
    CHECK(ledger_journal_failure(l) != NULL);
    CHECK(settings_are(l, "running")); /* memory holds it */
    full = false;
    CHECK_EQ_INT(ledger_journal_heal(l), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(settings_are(l, "running"));
    ledger_destroy(&l);
    unlink(path);
}

/* The broker's orphaned group steps (an opaque payload beside the settings; the last one counts,
 * length 0: none) survive a reopen, a compaction (defect: a snapshot dropped them, so a broker
 * restarted after a compaction gave their batches back to to-do) and a healed journal, and do
 * not disturb the settings. */
static void test_group_orphans_kept(void)
{
    unlink(path);
    ledger *l = open_ledger(path, 0, 0);
    uint32_t len = 1;
    CHECK(ledger_group_orphans(l, &len) == NULL && len == 0);
    CHECK_EQ_INT(ledger_set_settings(l, "paused", 7), 0);
    CHECK_EQ_INT(ledger_set_group_orphans(l, "g1", 3), 0);
    CHECK_EQ_INT(ledger_set_group_orphans(l, "g1g2", 5), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(group_orphans_are(l, "g1g2") && settings_are(l, "paused"));
    CHECK_EQ_INT(ledger_compact(l), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(group_orphans_are(l, "g1g2") && settings_are(l, "paused")); /* from the snapshot */

    bool full = true;
    ledger_set_sync_hook(l, full_disk_sync, &full);
    CHECK_EQ_INT(ledger_set_group_orphans(l, "g2", 3), DFLASH_EIO); /* fsynced: it breaks */
    CHECK(group_orphans_are(l, "g2")); /* memory holds it */
    full = false;
    CHECK_EQ_INT(ledger_journal_heal(l), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(group_orphans_are(l, "g2"));
    CHECK_EQ_INT(ledger_set_group_orphans(l, NULL, 0), 0); /* resolved: none left */
    CHECK(ledger_group_orphans(l, &len) == NULL && len == 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(ledger_group_orphans(l, &len) == NULL && len == 0);
    CHECK_EQ_INT(ledger_compact(l), 0);
    ledger_destroy(&l);
    l = open_ledger(path, 0, 0);
    CHECK(ledger_group_orphans(l, &len) == NULL && settings_are(l, "paused"));
    ledger_destroy(&l);
    unlink(path);
}

/* The loop runs until the journal reports *until done. */
typedef struct {
    uv_loop_t *loop;
    uint64_t until;
} done_wait;

static void done_until(void *ctx, uint64_t done, uint64_t fail)
{
    done_wait *w = ctx;
    (void)fail;
    if (done >= w->until) uv_stop(w->loop);
}

/* Runs the loop until every journal record queued so far is reported done. */
static void run_until_done(ledger *l, done_wait *w)
{
    uint64_t done, fail;
    w->until = ledger_journal_seq(l);
    ledger_journal_progress(l, &done, &fail);
    if (done < w->until) uv_run(w->loop, UV_RUN_DEFAULT);
}

/* One record each: hands out a batch, or gives it back (a long journal of a small ledger). */
static void churn(ledger *l, int i, batch_id *b)
{
    if (i % 2 == 0) CHECK_EQ_INT(ledger_next_todo(l, 0, b), 0);
    else CHECK_EQ_INT(ledger_requeue(l, b), 0);
}

/* Writer mode: a compaction the disk refuses leaves the long journal, journal_bytes says so (it
 * used to report the failed snapshot's size), and the ledger waits for the journal to double
 * before it tries again instead of queuing a new snapshot at every record. */
static void test_failed_compaction_backs_off(void)
{
    unlink(path);
    ledger *l = open_ledger(path, 0, 4096);
    bool full = false;
    ledger_set_sync_hook(l, full_disk_sync, &full);
    uv_loop_t loop;
    uv_loop_init(&loop);
    done_wait w = {&loop, 0};
    CHECK_EQ_INT(ledger_writer_start(l, &loop, done_until, &w), 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){10}), 0);
    run_until_done(l, &w);
    __atomic_store_n(&full, true, __ATOMIC_SEQ_CST); /* each compaction's temporary file fails */
    batch_id b;
    uint64_t expect = ledger_journal_seq(l);
    int i = 0;
    for (; i < 1000 && ledger_journal_seq(l) == expect; i++, expect++) churn(l, i, &b);
    CHECK(i < 1000); /* a compaction was queued */
    run_until_done(l, &w); /* the writer fails it */
    CHECK(ledger_journal_failure(l) == NULL);
    ledger_stats st;
    ledger_get_stats(l, &st);
    struct stat fst;
    CHECK_EQ_INT(stat(path, &fst), 0);
    CHECK_EQ_INT(st.journal_bytes, (uint64_t)fst.st_size); /* the long journal is in use */
    uint64_t seq = ledger_journal_seq(l);
    for (int k = 0; k < 20; k++) churn(l, i + k, &b);
    CHECK_EQ_INT(ledger_journal_seq(l) - seq, 20); /* 20 records, no new compaction */
    run_until_done(l, &w);
    ledger_destroy(&l);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
    unlink(path);
}

/* The broker learns the target's epochs only at its registration: an epoch opened before (an
 * adopt after a restart) hands out nothing once the limit is set below it, its TODO batches are
 * not counted as to do (or the plan's end never comes), and a higher limit later opens it. */
static void test_limit_set_later(void)
{
    ledger *l = open_ledger(NULL, 0, 0);
    CHECK_EQ_INT(ledger_set_plan(l, 1, (const uint32_t[]){2}), 0);
    batch_id b;
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0); /* 0/0/0 */
    CHECK_EQ_INT(ledger_adopt(l, &(batch_id){1, 0, 1}), 0); /* opens epoch 1: no limit yet */
    CHECK_EQ_INT(ledger_requeue(l, &(batch_id){1, 0, 1}), 0);
    ledger_set_max_epochs(l, 1);
    CHECK_EQ_INT(ledger_adopt(l, &(batch_id){1, 0, 1}), DFLASH_ERANGE);
    ledger_stats st;
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.epochs_opened, 2);
    CHECK_EQ_INT(st.todo, 1); /* epoch 0's batch 1 only */
    CHECK_EQ_INT(st.open_epoch, 0);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK(b.epoch == 0 && b.index == 1);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), DFLASH_ENOTFOUND);
    CHECK_EQ_INT(ledger_todo_mask(l), 0);
    ledger_get_stats(l, &st);
    CHECK_EQ_INT(st.todo, 0);
    CHECK_EQ_INT(st.open_epoch, 0);
    ledger_set_max_epochs(l, 3); /* a target with more epochs */
    CHECK_EQ_INT(ledger_todo_mask(l), 1);
    CHECK_EQ_INT(ledger_next_todo(l, 0, &b), 0);
    CHECK(b.epoch == 1 && b.index == 0);
    ledger_destroy(&l);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/test_ledger.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) return 2;
    snprintf(path, sizeof path, "%s/ledger.journal", dir);
    test_handout_and_epochs();
    test_ack_commit_rewind();
    test_rewind_below_commit();
    test_commit_older_report();
    test_lower_max_epochs();
    test_adopt_far_epoch();
    test_limit_set_later();
    test_quarantine();
    test_fail_count_survives();
    test_release_all_quarantined();
    test_replay_and_orphans();
    test_plan_identity();
    test_truncation_every_byte();
    test_exactly_once();
    test_journal_heals();
    test_settings_kept();
    test_group_orphans_kept();
    test_failed_compaction_backs_off();
    test_rmtree(dir); /* the journals' .lock files stay beside them */
    CHECK_DONE();
}
