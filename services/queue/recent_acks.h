/* recent_acks: who acked each recently recorded batch, so that a second ack of a trained batch
 * can be told apart: a repeat of the recorded ack (its reply was lost, or the same run resumed
 * from a checkpoint that had it unacked) or another drafter's training of the batch (it was
 * trained twice). The ledger records a batch's step, not its acker, and journals nothing of it.
 *
 * Data: a fixed ring of the last RECENT_ACKS_CAP acks {batch, acker}; a lookup scans it newest
 * first, so the newest ack of a batch (after a rewind, say) wins. Bounded memory, O(1) noting;
 * the O(cap) lookup runs only for an ack the ledger refused EXISTS (rare). An ack older than the
 * ring, or recorded before a broker restart, is unknown: the caller decides without it.
 *
 * Acker identity (recent_acker): the drafter's process incarnation and, for a trainer, its run
 * id. Not the broker's peer entry: the broker recreates that when it expires a drafter that
 * comes back, and that drafter's retried ack is still a repeat. Two acks are from the same acker
 * when the incarnations match (the same process) or the run ids do (a restart of the same run:
 * one broker, one model, one live process per run).
 *
 * Thread: the broker's loop thread. Callers: broker.c (on_ack); tests.
 */
#ifndef DFLASH_QUEUE_RECENT_ACKS_H
#define DFLASH_QUEUE_RECENT_ACKS_H

#include "ledger.h"

#include <stdbool.h>
#include <stdint.h>

#define RECENT_ACKS_CAP 4096

typedef struct {
    uint64_t incarnation; /* the acking process */
    uint64_t run_id;      /* its run (a trainer), 0: none said */
} recent_acker;

typedef struct {
    struct {
        batch_id batch;
        recent_acker by;
    } ring[RECENT_ACKS_CAP];
    uint64_t n; /* acks noted; the newest is ring[(n - 1) % RECENT_ACKS_CAP] */
} recent_acks;

/* Notes that `by` acked batch (the ledger recorded it). Never fails. */
void recent_acks_note(recent_acks *r, const batch_id *batch, const recent_acker *by);

/* The acker of batch's newest noted ack into *by; false when none is noted (unknown). */
bool recent_acks_find(const recent_acks *r, const batch_id *batch, recent_acker *by);

/* Whether a and b are the same acker: the same process, or the same run. */
bool recent_acker_same(const recent_acker *a, const recent_acker *b);

#endif
