/* worker_loop: dflash-drafter's main loop, independent of what is done with a batch (DESIGN §2,
 * steps 4-6).
 *
 * It uses a worker_session (worker_session.h: the pool importer, the staging buffer, the broker
 * client and its heartbeat thread, shared with the group loop). Per iteration: claim a ready
 * slot (the grant names pool incarnation, slot, offset, size, handles and the batch), map the
 * pool if this incarnation is new (a new incarnation closes the old mappings: the target
 * restarted), make the copy stream wait on the slot's event, copy the slot into staging,
 * release the slot as soon as the copy is done, hand the staged copy to the *consumer*, and ack
 * the batch with the step the consumer reports. It waits and retries while
 * nothing is eligible (counted as "waiting for a grant"), re-registers (hello, with the batches
 * it holds) when the broker restarts or has expired it (an ack then goes again: a late ack),
 * and returns when the broker has drained, when *stop becomes non-zero, or on a fatal error.
 * A hello the broker refuses for good (EXISTS: our name or our run is another live process's;
 * DENIED: another model trains there, or, Error.other_key set, our name or run is a live
 * drafter's of another CURVE key) ends it too, after the consumer's save_refused() has kept
 * what the model trained (worker_session_save_refused says when that is not safe).
 *
 * Loop states (one set_state, transitions asserted):
 *   REGISTER -> CLAIMING         hello succeeded
 *   CLAIMING -> CLAIMING         grant handled, or nothing eligible (wait and retry)
 *   CLAIMING -> REGISTER         the broker restarted or forgot us (DFLASH_ESTALE)
 *   any      -> DONE             stop flag, drain (ESHUTDOWN), or fatal error
 *
 * The consumer interface is how the trainer plugs in (services/drafter/trainer.c); the
 * first consumer is --verify, which checks every byte against synthetic.h. Thread: the daemon's
 * main thread; the consumer runs on it and may enqueue GPU work ordered after the copy stream.
 */
#ifndef DFLASH_WORKER_LOOP_H
#define DFLASH_WORKER_LOOP_H

#include "pool.h"
#include "slot.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WORKER_MAX_BUCKETS 16

struct dp_comm; /* common/nn/collective.h */

/* One staged batch, handed to the consumer. */
typedef struct worker_batch {
    const void *staged;   /* the slot copy: host memory (host) or device memory (cuda) */
    void *copy_stream;    /* cuda: the stream the copy ran on (done when consume is called) */
    slot_work_unit wu;    /* the batch the grant named */
    uint32_t n_tokens, n_seqs;
    uint64_t pool_incarnation;
} worker_batch;

/* A batch the model trained whose ack the broker has not taken (or may not have: the reply to it
 * was lost): the batch and the optimizer step that trained it. */
typedef struct worker_unacked {
    slot_work_unit wu;
    uint64_t step;
} worker_unacked;

#define WORKER_MAX_UNACKED 64 /* a group step's batches: ranks x micro-steps (WIRE_MAX_WORLD) */

/* What is done with a staged batch. consume() trains on (or checks) b and sets *step to the
 * optimizer step that includes it; the loop then acks (wu, step). Returns 0, or a negative
 * DFLASH_E* code: DFLASH_ECORRUPT / DFLASH_EMISMATCH mean the data plane delivered a bad batch
 * (the loop calls finish(), logs it and exits with the code: it is a bug or a misconfiguration),
 * anything else is fatal too. A slot written for another layout never gets here (layout()
 * below: the loop gives it back unread, calls finish() and ends with DFLASH_ECONFIG).
 * committed() (optional) returns the newest step that is durable (checkpointed): the loop
 * reports it with client_checkpoint_committed. destroy() frees ctx.
 * Optional hooks (NULL = none):
 *   resume_step()  the checkpoint step this consumer started from (0 for a fresh start), or -1
 *                  for "nothing to say"; told to the broker (client_resume_from) once, after the
 *                  first successful hello and before the first claim, so batches trained after
 *                  that step go back to to-do;
 *   run_id()       the run the consumer trains (run_id.h), told with resume_step (0: none);
 *   done()         true when the consumer wants no more batches (e.g. --max-steps reached): the
 *                  loop ends as if drained;
 *   done_at(s)     optional: true when a model at step s would be done() (a group member told
 *                  that the group's newest committed checkpoint is at s ends rather than wait
 *                  for the member holding it, whose run may have ended there);
 *   settled()      called before each claim while the loop holds no trained batch the broker
 *                  has not taken (solo: every ack answered; group: rank 0's StepDone answered):
 *                  the place for a periodic checkpoint. A checkpoint written earlier, between
 *                  consume() and the ack, would hold a batch that a crash right then leaves
 *                  unacked, and the broker hands out again: trained twice. 0 or a fatal code;
 *   finish()       called once when the loop ends without a fatal error (drained, stopped, done)
 *                  or on a bad batch (consume() returned DFLASH_ECORRUPT / DFLASH_EMISMATCH: it
 *                  refused the batch without using it), before the client closes, after the
 *                  ack of the last batch (for the same reason as settled()): e.g. save a
 *                  final checkpoint. The loop then reports committed() once more (also after a
 *                  stop signal, unless no broker answered since: worker_session.h). 0 or a
 *                  negative code;
 *   save_refused() called once, instead of finish(), when the loop ends because the broker
 *                  refused to take us back (a hello answered EXISTS or DENIED, a group join
 *                  refused), unless the refusal says a live process of our run replaced us
 *                  (worker_session_save_refused): write the model's final checkpoint, which the
 *                  loop reports to no broker. 0 or a negative code;
 *   unacked()      called right before finish() and save_refused() with the trained batches the
 *                  model holds whose acks the broker has not taken (n 0: none; the solo loop's
 *                  held batch, a group rank 0's pending step, resumed ones not acked yet): the
 *                  checkpoint they write records them (dflash_ckpt.h "unacked_batches"), so that
 *                  a stop while no broker answers does not leave the broker handing them out
 *                  again (trained twice);
 *   resumed_unacked() the batches the checkpoint this consumer resumed from records so (at most
 *                  max into out; returns how many). The solo loop acks them at their steps once
 *                  the broker took resume_step(), before its first claim; a group member once a
 *                  GroupView shows that the group goes on from a model at or past their step
 *                  (group_worker.c). */
typedef struct worker_consumer {
    const char *name; /* "verify", "train" */
    void *ctx;
    int (*consume)(void *ctx, const worker_batch *b, uint64_t *step);
    uint64_t (*committed)(void *ctx);
    void (*destroy)(void *ctx);
    int64_t (*resume_step)(void *ctx);
    uint64_t (*run_id)(void *ctx);
    bool (*done)(void *ctx);
    bool (*done_at)(void *ctx, uint64_t step);
    int (*settled)(void *ctx);
    int (*finish)(void *ctx);
    int (*save_refused)(void *ctx);
    void (*unacked)(void *ctx, const worker_unacked *b, uint32_t n);
    uint32_t (*resumed_unacked)(void *ctx, worker_unacked *out, uint32_t max);
    /* (optional) the loop waits for a grant or for the broker: write what is pending (e.g. the
     * last step's metrics) so that a stalled run's files are current. Called every few ms while
     * waiting; cheap when there is nothing to write. */
    void (*idle)(void *ctx);
    /* (optional) the slot layout every batch must have been written for, with the target layer
     * ids this consumer reads (the trainer's come from its model); NULL hook: cfg->layout. The
     * loops check each copied slot's header against it before the release
     * (worker_session_check_layout): a slot of another layout is the target's misconfiguration,
     * not the batch's fault, so it is given back unread and the loop ends with DFLASH_ECONFIG. */
    const slot_layout *(*layout)(void *ctx);
    /* (optional) the loop gives the consumer its durability barrier before the first request
     * (worker_session_offer_barrier), and takes it back (NULL) when it ends: the consumer calls
     * barrier(arg, step) right before it publishes a checkpoint of step `step` (after the last
     * ack of a batch in it: the places settled(), finish() and save_refused() above), and
     * writes the checkpoint whatever it returns (0: the broker's journal holds every ack so far
     * durably; a code: it could not be had, said by the loop). */
    void (*set_barrier)(void *ctx, int (*barrier)(void *arg, uint64_t step), void *arg);
    /* Data-parallel group hooks (group_worker.h); NULL: the consumer cannot train in a group.
     *   set_group(comm, rank, world) from now on each consume() is this rank's share of one
     *                  group step, trained with the collective comm (NULL: alone again); only
     *                  rank 0 writes checkpoints (committed() stays put on the other ranks);
     *   sync_state(root) makes the model equal to rank root's over that comm (0 or a code);
     *   model_step()   optimizer steps the model has taken (the group's step numbers);
     *   state_hash()   (optional) hash of the trainable state, logged to compare ranks;
     *   shape(text, len) (optional) the model's layout, what sync_state checks first: its
     *                  hash (0: none) and, in text, the same in words; stated in every
     *                  GroupJoin, so that the broker turns away a joiner of another shape than
     *                  the group's before the group re-forms for it (NULL: none stated);
     *   accumulate()   (optional) micro-steps per group step (--accumulate; NULL: 1), stated in
     *                  every GroupJoin; with more than 1, consume() in a group adds its batch to
     *                  the open group step (no collective; *step: the step it will be in) and
     *                  close_step(step) takes that step with the micro-steps consumed since the
     *                  last close (the collective, the update; *step: the model's step), with
     *                  consume()'s codes; leaving the group (set_group NULL) abandons an open
     *                  step (nothing of it is applied). */
    void (*set_group)(void *ctx, struct dp_comm *comm, int rank, int world);
    int (*sync_state)(void *ctx, int root);
    uint64_t (*model_step)(void *ctx);
    uint64_t (*state_hash)(void *ctx);
    uint64_t (*shape)(void *ctx, char *text, size_t len);
    uint32_t (*accumulate)(void *ctx);
    int (*close_step)(void *ctx, uint64_t *step);
} worker_consumer;

typedef struct worker_loop_config {
    const char *endpoint;
    const char *curve_server_key, *curve_key; /* CURVE key files (client.h); NULL/"" = none */
    const char *name; /* peer name, e.g. "drafter0" */
    pool_backend backend;
    int device;
    slot_layout layout;   /* what every slot must hold (the consumer's layout() may name its
                             layer ids too; checked before the release and by the consumer) */
    int64_t progress_ms;  /* 0 = no progress lines */
    int64_t timeout_ms;   /* per broker request */
    int64_t max_batches;  /* stop after this many (tests, bench); 0 = until drained */
    int64_t broker_wait_ms; /* before the first hello: give up if no broker answers this long;
                             * 0 = never. Later a silent broker is waited for (logged). */
    int64_t max_copy_failures; /* slot copies failing in a row that end the loop with
                                * DFLASH_EPEER (the slots cannot be mapped here); 0 = never */
    double stall_exit_s; /* no loop iteration this long: exit 5 (heartbeat.h); 0 = never */
    bool exit_when_drained; /* ESHUTDOWN ends the loop (default true) */
    const char *group;      /* data-parallel group name (group_worker.h); NULL/"" = solo */
    int comm_kind;          /* dp_comm_kind of the group's collective */
    double comm_timeout_s;  /* collective join and wait timeout */
    uint32_t group_size;    /* ranks an epoch waits for before its first step (0: none) */
    double group_wait_s;    /* and for at most this long, then goes on with those it has */
} worker_loop_config;

typedef struct worker_stats {
    uint64_t batches, tokens, bytes_copied;
    uint64_t stale_releases; /* release refused (the lease expired, or the batch was trained
                              * meanwhile by a late ack): copy dropped */
    uint64_t copy_failures;  /* slot copies that failed (the slot given back unread) */
    double copy_s, consume_s, wait_grant_s, elapsed_s;
    double copy_p50_ms, copy_p99_ms; /* grant to copy done, over the last 4096 batches */
    uint64_t registrations;
    bool name_in_use; /* the broker refused our hello: another live drafter has our name or
                         replaced us as a restart of our run; or our hello or resume: a live
                         drafter of another CURVE key has our name or run (main.c: exit 4) */
    bool other_model; /* the broker refused our resume (or our hello naming our run, or our
                         group join): a live drafter trains another model (exit 6) */
} worker_stats;

/* Runs the loop (the group loop of group_worker.h when cfg->group is set). Returns 0 (drained
 * or stopped) or a negative code after logging the reason; *stats (may be NULL) gets the
 * totals. Main thread. */
int worker_loop_run(const worker_loop_config *cfg, worker_consumer *cons,
                    volatile sig_atomic_t *stop, worker_stats *stats);

/* The --verify consumer: checks every byte of each staged slot against the synthetic batch its
 * grant names (synthetic.h; bucket bounds and vocab must match the target's), counts bytes and
 * reports each batch as its own durable step (the step is a wall-clock millisecond stamp, so
 * commits from any verifier cover every earlier ack). rate > 0 paces it to that many batches
 * per second, to model a slower trainer (tests, bench/pipeline). NULL on failure. */
worker_consumer *worker_verify_new(const worker_loop_config *cfg, const uint32_t *bucket_upper,
                                   uint32_t n_buckets, uint32_t vocab_size, double rate);
/* Calls cons->destroy and frees; accepts NULL. */
void worker_consumer_destroy(worker_consumer **cons);

#endif
