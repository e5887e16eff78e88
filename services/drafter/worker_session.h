/* worker_session: what a drafter needs to talk to the broker and read the target's slots, shared
 * by its two loops: the solo loop (worker_loop.c) and one rank of a data-parallel group
 * (group_worker.c). Each loop keeps its own state machine; the session holds no loop state.
 *
 * It owns, from worker_session_new to worker_session_destroy:
 *   - the pool importer (pool.h): maps each pool incarnation a grant names, once, and closes
 *     the mappings of pools whose target is gone (or that sat idle) after each copy and
 *     whenever a claim finds nothing, so that no dead target's memory stays pinned here;
 *   - the staging buffer: one slot's bytes (host or device memory, as the backend);
 *   - the broker client (client.h), with the request timeout and the CURVE keys of the config;
 *   - a heartbeat thread that calls client_poll every 100 ms once the broker knows us, so that a
 *     long consume(), collective or checkpoint does not get the session (and its leases) expired.
 * And it does the operations both loops do the same way: hello, the slot copy of a grant, the
 * check that the copy was written for our slot layout, the hand-over of the staged copy to the
 * consumer, checkpoint-committed reports (backed off and said when refused), the durability
 * barrier a consumer calls before it publishes a checkpoint, the "no broker
 * answers" deadline and the timing of progress lines. It counts into the loop's worker_stats
 * (borrowed): registrations, copy_s, bytes_copied, copy_failures, consume_s. The other counters
 * are the loop's.
 *
 * A stop with the broker gone: the loops hand every request's result to worker_session_heard.
 * Once a stop signal has come, the first request no broker answers (a timeout) marks the broker
 * lost: from then on the loops make no more requests (no more ack or StepDone attempts, no
 * commit report, no goodbye) and the heartbeat thread stops polling, so the final checkpoint is
 * written at most two request timeouts after the step in progress ends (one request in flight,
 * which may wait for a heartbeat's), not after rounds of retries (docs/operating.md). Before a
 * stop, a silent broker is waited for, as ever.
 *
 * A refusal for good (a hello answered EXISTS or DENIED, a group join refused; a DENIED because
 * another CURVE key's live drafter has our --name or run is told from another model's trainer by
 * worker_session_key_refused): the session keeps
 * the broker's words (worker_session_note_refusal), and the loop ends with the model's final
 * checkpoint in our --checkpoint-dir, reported to no broker (worker_session_save_refused),
 * except when those words name our own run: a live process of our run replaced us and may write
 * that very directory.
 *
 * Thread: the daemon's main thread calls every function; the heartbeat thread only polls the
 * client (the client serialises calls). Callers: worker_loop_run, group_worker_run.
 */
#ifndef DFLASH_WORKER_SESSION_H
#define DFLASH_WORKER_SESSION_H

#include "client.h"
#include "worker_loop.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct worker_session worker_session;

/* Creates the importer, the staging buffer (cfg->layout.slot_bytes) and the client, and starts
 * the heartbeat thread. cfg, st and stop (the daemon's stop flag) are borrowed and must outlive
 * the session. Returns the session, or NULL after logging the reason with *err set to a negative
 * code. Main thread. */
worker_session *worker_session_new(const worker_loop_config *cfg, worker_stats *st,
                                   volatile sig_atomic_t *stop, int *err);
/* Stops and joins the heartbeat thread, then frees the client, the staging buffer and the
 * importer; accepts NULL and nulls the pointer. */
void worker_session_destroy(worker_session **s);

/* The broker client, for the loop's own requests (claim, release, ack, group calls). Borrowed:
 * valid until worker_session_destroy. */
client *worker_session_client(const worker_session *s);

/* hello, carrying the held units (NULL, 0: none). On success counts the registration and logs
 * "registered with broker <incarnation><note>" (note: "" or e.g. " for group g"); returns 0, or
 * client_hello's negative code (the loop decides what is transient; EXISTS and DENIED, refusals
 * for good, are noted as worker_session_note_refusal does). */
int worker_session_hello(worker_session *s, const wire_unit *held, uint32_t n_held,
                         const char *note);
/* A hello failed while no broker has answered since `since` (monotime_s): past
 * cfg->broker_wait_ms (0 = never) logs it and returns DFLASH_EPEER; else sleeps 100 ms and
 * returns 0 (try again). */
int worker_session_await_broker(const worker_session *s, double since);

/* Copies the slot that g grants into the staging buffer: attaches g's pool incarnation (mapping
 * it if new), makes the copy wait on the slot's event, copies the bytes g's batch uses and waits,
 * then closes the mappings of gone pools (worker_session_close_stale_pools).
 * Returns 0, counting the copy (copy_s, bytes_copied) and setting *secs (may be NULL) to its
 * duration; or a negative code after forgetting the incarnation: the slot was not read, and the
 * caller still holds (and must release) its lease. */
int worker_session_copy(worker_session *s, const wire_grant *g, double *secs);
/* Closes the importer's mappings of pools whose target is gone (its shared memory unlinked) or
 * that sat unused for POOL_IMPORT_IDLE_MS (pool_importer_close_stale): a dead target's pool is
 * freed only once no drafter maps it, and its restarted successor needs the room. Cheap; the
 * loops call it whenever a claim finds nothing. */
void worker_session_close_stale_pools(worker_session *s);
/* After a failed worker_session_copy (last_rc its code): true, after logging why and what to
 * check, when cfg->max_copy_failures (> 0) copies in a row have failed with none succeeding in
 * between: the drafter cannot map any slot it is granted and should exit. With a limit, also true
 * at once for DFLASH_EPEER: the importer found that this GPU has no peer access to the pool's
 * (and logged it), so no later grant of that pool could be copied either. A limit of 0 retries
 * for ever (grants of other pools may still be copied). */
bool worker_session_copy_hopeless(const worker_session *s, int last_rc);
/* Whether the slot copied for g (worker_session_copy succeeded) was written for the layout cons
 * reads (cons->layout(), else cfg->layout; slot_header_check): 0 when it was, and when its
 * header is faulty in a way of its own (torn, corrupt, over capacity: the consumer refuses that
 * batch). DFLASH_ECONFIG, after logging both layouts and what to do, when the target wrote
 * another layout (another model, --layers, --capture-layers, --token-budget, --max-seqs or
 * dtype): every slot of it would be refused alike, and the batch is not at fault. The caller
 * then gives the lease back unread (client_release_unread: not counted against the batch) and
 * ends its loop (the daemon's exit 2). Main thread, before the release. */
int worker_session_check_layout(worker_session *s, const worker_consumer *cons,
                                const wire_grant *g);
/* The loop made progress: every iteration calls it, for the watchdog (heartbeat.h). */
void worker_session_alive(worker_session *s);
/* Hands the staged copy of g to cons->consume (timed into consume_s); returns its result, with
 * *step as consume() set it. Call after worker_session_copy succeeded for g. */
int worker_session_consume(worker_session *s, worker_consumer *cons, const wire_grant *g,
                           uint64_t *step);

/* The result of a request to the broker: a DFLASH_ETIMEOUT after the stop signal marks the
 * broker lost (see the top of this file). Main thread. */
void worker_session_heard(worker_session *s, int rc);
/* True once a request made after the stop signal went unanswered: make no more requests. */
bool worker_session_broker_lost(const worker_session *s);

/* The broker's answer to the loop's last request refuses us for good (the loop ends): keeps its
 * words (client_last_error) for worker_session_save_refused. Call right after that request, before
 * the heartbeat thread's next one replaces them. Main thread. */
void worker_session_note_refusal(worker_session *s);
/* Whether the broker's answer to the loop's last request, a DENIED, refuses it because our
 * --name or our run is a live drafter's registered with another CURVE key (Error.other_key,
 * client_last_error_other_key): for good, as when another live drafter has them (exit 4), not
 * another model's trainer (exit 6). When it does, logs the cause (`what`: the request refused,
 * e.g. "hello") and what to do. Call right after that request. Main thread. */
bool worker_session_key_refused(const worker_session *s, const char *what);
/* The loop ends because the broker refused us for good (noted above), and the model may hold
 * steps past its newest checkpoint: cons->save_refused (if any) writes them into our
 * --checkpoint-dir, reported to no broker, unless the refusal's replaced_by_run is our run
 * (cons->run_id): then a live process of our run replaced us, and it may write that directory
 * (logged, nothing written). unacked (NULL: none) names trained work the broker never took (a held batch, a
 * pending step): logged as going into the checkpoint unacked. 0 or the save's negative code.
 * Main thread, after the loop's last request. */
int worker_session_save_refused(worker_session *s, worker_consumer *cons, const char *unacked);

/* Logs the broker's answer rc (0 or DFLASH_EEXISTS) to our ack of *u at step, a batch of the
 * checkpoint we resumed from that no broker acked before the stop (worker_loop.h
 * resumed_unacked): acked now, or the broker had it already (our ack before the stop had landed,
 * its reply lost; or, the broker's words say, it was trained again since). Right after the ack:
 * the broker's words are the client's last error. Main thread. */
void worker_session_resumed_acked(const worker_session *s, const wire_unit *u, uint64_t step,
                                  int rc);

/* Reports step cs as checkpointed (CheckpointCommitted): up to `attempts` tries while the broker
 * times out, fewer once it is lost. 0 or the last negative code (DFLASH_ETIMEOUT, without a
 * request, when it is lost already). */
int worker_session_commit(worker_session *s, uint64_t cs, int attempts);
/* The loop's last report, from its finish(): worker_session_commit with 3 tries (a stopped loop
 * still reports its final checkpoint to a broker that answers); logs success. 0 or the code;
 * the caller says what a failure means for it. */
int worker_session_commit_final(worker_session *s, uint64_t cs);

/* Periodic commit reports (the loops' settle()): whether one may be sent now. After a report
 * the broker refused or did not answer, the next waits WORKER_COMMIT_RETRY_MS (not one request
 * per claim while e.g. its journal fails). Main thread. */
#define WORKER_COMMIT_RETRY_MS 5000
bool worker_session_commit_due(const worker_session *s);
/* The result rc of a periodic report of checkpoint step cs: a failure is logged as a WARN the
 * first time and then at most once a minute, naming the step and the broker's reason
 * (client_last_error), and starts the wait above; the first success after failures is logged
 * as INFO. Call right after the report. Main thread. */
void worker_session_commit_noted(worker_session *s, uint64_t cs, int rc);

/* The durability barrier (docs/protocol.md "JournalSync"): hands cons (if it has set_barrier)
 * the function it calls right before it publishes a checkpoint of step `step`, which asks the
 * broker to make every record it has journaled durable (our acks of the steps in the
 * checkpoint included) and returns once it has, or once that cannot be had: the checkpoint is
 * written either way. Why: with the acks durable before the checkpoint, a power loss of the
 * broker's host leaves either the older checkpoint (the acks after it are rewound by our
 * ResumeFrom to its step) or the new one with all its acks; without, the new checkpoint could
 * survive with acks the journal lost, whose batches the broker would then hand out again
 * (trained twice). No request when this process never registered (it acked nothing) or the
 * broker is lost after a stop (the checkpoint goes first); a broker that predates the request
 * (Error PROTO) is said once in a WARN and not asked again (durability then rests on the
 * commit report, as before); other failures are a WARN at most once a minute.
 * worker_session_destroy takes the function back (set_barrier(NULL)). Main thread. */
void worker_session_offer_barrier(worker_session *s, worker_consumer *cons);

/* True once every cfg->progress_ms (never when 0): *d gets how much each counter of the loop's
 * stats grew since the last window and *dt_s the window's length; the next window starts now. */
bool worker_session_progress_due(worker_session *s, worker_stats *d, double *dt_s);

#endif
