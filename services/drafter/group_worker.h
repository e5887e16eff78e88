/* group_worker: dflash-drafter's loop as one rank of a data-parallel group (--group NAME; issue 7;
 * docs/protocol.md "Groups"). worker_loop_run hands over to it when the config names a group.
 *
 * Per epoch: GroupJoin until the broker's view names our rank (rank 0: make the rendezvous id
 * with dp_comm_make_id and post it with GroupSetId; the others poll until the view carries it),
 * open the communicator (dp_comm_open), copy rank 0's model state (the consumer's sync_state),
 * then per step s = model step + 1: StepClaim our slot of step s, copy it, release it, train it
 * with the collective (the consumer's consume(), which averages the gradients over the group),
 * and rank 0 sends StepDone (the broker acks the step's units once). With gradient
 * accumulation (the consumer's accumulate() A > 1, stated in every join): micro-steps
 * k = 0..A-1 of step s, each StepClaim(s, k), copy, release and consume() (the batch into the
 * accumulator, no collective), then the consumer's close_step() (the collective and the
 * update) and rank 0's StepDone with every micro-step's units; the broker's SHUTDOWN to a claim
 * of k > 0 (the step ended: the data's end, a drain, its stop) closes the step with the k
 * micro-steps trained, on every rank alike; a re-form or a stop between micro-steps abandons
 * the step (the consumer drops it; the broker aborts it). A broker whose StepGrant names no
 * micro-step predates accumulation: DFLASH_ECONFIG (exit 2). A collective error (a peer
 * died: shm sees its process gone, or the collective times out; or, asked while a collective
 * waits, the broker says the epoch is over), a "re-form" answer (Error STALE) or a refused
 * release closes the communicator and joins again, naming the failed epoch (and, when shm saw
 * a rank's process end, that rank: dp_comm_gone_rank; the broker drops that member at once).
 * Every join states our drafter's shape (the consumer's shape()): the broker refuses a joiner
 * of another shape than the group's (Error MISMATCH), which is fatal (DFLASH_ECONFIG), before
 * the group re-forms for it. With an older broker a sync that finds another rank's drafter of
 * another shape than rank 0's re-forms too; our own differing is fatal (DFLASH_ECONFIG), after
 * a GroupLeave. A communicator that refuses our own setup (dp_comm_open's DFLASH_ECONFIG: two
 * nccl ranks on one GPU) is fatal too (DFLASH_ECONFIG), after the final checkpoint and a
 * GroupLeave: a re-form would fail the same way. Only rank 0 writes checkpoints and
 * reports them (CheckpointCommitted). A broker restart: hello again (rank 0 with the units of a
 * step whose StepDone was not answered), plain Acks for those units, then join again. A
 * StepDone the same broker answers STALE (it expired us while we trained) is not acked late:
 * the broker resolves the step by the model the group goes on from, reported in a GroupJoin
 * (see group_worker.c).
 *
 * Loop states (one set_state, transitions asserted):
 *   REGISTER -> JOINING           hello succeeded
 *   JOINING  -> JOINING           waiting for a view or an id; a failed open or sync
 *   JOINING  -> STEPPING          communicator open and state synced
 *   STEPPING -> STEPPING          a step trained, or nothing eligible yet
 *   STEPPING -> JOINING           re-form (collective error, Error STALE, lost lease)
 *   JOINING|STEPPING -> REGISTER  the broker restarted or forgot us
 *   any      -> DONE              stop flag, drain, --max-steps, or a fatal error
 *
 * Thread: the daemon's main thread; a heartbeat thread keeps the broker session (and the step's
 * leases) alive during long collectives and checkpoints. Callers: worker_loop_run.
 */
#ifndef DFLASH_GROUP_WORKER_H
#define DFLASH_GROUP_WORKER_H

#include "worker_loop.h"

/* Runs the group loop (cfg->group set). Returns 0 (drained, stopped, done) or a negative code
 * after logging the reason (DFLASH_EFULL: the broker refused the join because the group would
 * be larger than its max-depth; DFLASH_ECONFIG: our drafter's shape differs from rank 0's, the
 * group's model (the broker refused our join; or, with an older broker, the sync found it:
 * only the differing rank ends, rank 0 and the matching ranks re-form without it), the
 * communicator refused our setup (two nccl ranks on one GPU, an unusable --device), a slot of
 * the target was written for another layout than ours (given back unread), a broker without
 * our --accumulate (each of these three after the final checkpoint), or cons has no group
 * hooks: a mode that cannot train in a group; DFLASH_ECORRUPT / DFLASH_EMISMATCH: a bad batch,
 * after the final checkpoint too). Main thread. */
int group_worker_run(const worker_loop_config *cfg, worker_consumer *cons,
                     volatile sig_atomic_t *stop, worker_stats *stats);

#endif
