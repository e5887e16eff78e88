/* target_loop: dflash-target's main loop, independent of what fills the slots (DESIGN §2, 1-3).
 *
 * It owns the slot pool (pool.h) and the broker client (client.h). Per iteration: ask the broker
 * for a work unit (epoch, bucket, batch, slot), hand the slot to the *producer*, publish the slot
 * (record its event on the producer's stream, no host sync) and send SLOT_READY. It waits and
 * retries when the broker has no work or max_depth is reached (counted as "waiting for a free
 * slot"), re-registers (hello + pool, naming the slots it published and was not handed back
 * since, which the broker fences) when the broker restarts, and returns when the broker
 * drains, when *stop becomes non-zero, or on a fatal error. On a stop (or --max-batches) it
 * leaves the broker first (target_leave.h: the pool given up, the copies in progress waited for).
 *
 * Loop states (one set_state, transitions asserted):
 *   REGISTER -> WORKING        hello and pool registration succeeded
 *   WORKING  -> REGISTER       the broker restarted or forgot us (DFLASH_ESTALE)
 *   WORKING  -> WAITING        no work / max_depth (EAGAIN, EFULL) or broker silent (ETIMEOUT)
 *   WAITING  -> WORKING | REGISTER
 *   any      -> DONE           stop flag, drain (ESHUTDOWN), or fatal error
 *
 * The producer interface is how the real model plugs in (services/target/target_model.c later):
 * the loop never looks inside a slot except through it. Thread: the daemon's main thread; the
 * producer runs on that thread and may enqueue GPU work on its own stream.
 */
#ifndef DFLASH_TARGET_LOOP_H
#define DFLASH_TARGET_LOOP_H

#include "pool.h"
#include "slot.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#define TARGET_MAX_BUCKETS 16

/* What fills a slot. fill() writes the whole batch of wu (header, naming producer: the pool's
 * incarnation; arrays, hidden states in
 * l->dtype) into slot, which is a host pointer (host pools) or a device pointer on the pool's
 * GPU (cuda pools); GPU work goes on stream (the producer's compute stream, returned by
 * stream(); NULL for host producers), after which the loop records the slot's event on it.
 * Returns n_tokens > 0 with *n_seqs set, or a negative DFLASH_E* code (the loop exits with it).
 * destroy() frees ctx. */
typedef struct target_producer {
    const char *name; /* "synthetic", "model" */
    void *ctx;
    int (*fill)(void *ctx, const slot_work_unit *wu, void *slot, const slot_layout *l,
                void *stream, uint64_t producer, uint32_t *n_seqs);
    void *(*stream)(void *ctx);
    void (*destroy)(void *ctx);
} target_producer;

typedef struct target_loop_config {
    const char *endpoint; /* broker ROUTER */
    const char *curve_server_key, *curve_key; /* CURVE key files (client.h); NULL/"" = none */
    const char *name;     /* peer and pool name, e.g. "target-node1" */
    pool_backend backend;
    int device;
    uint32_t n_slots;
    slot_layout layout;
    uint32_t n_buckets;
    uint32_t bucket_upper[TARGET_MAX_BUCKETS];
    double bucket_share[TARGET_MAX_BUCKETS];
    uint64_t bucket_batches[TARGET_MAX_BUCKETS]; /* batches per epoch */
    uint64_t plan_id; /* the plan's identity (batch_plan_identity), sent when has_plan_id */
    bool has_plan_id;
    uint32_t epochs;
    int64_t progress_ms;    /* progress line interval; 0 = none */
    int64_t timeout_ms;     /* per broker request */
    int64_t max_batches;    /* stop after this many (tests, bench); 0 = until drained */
    int64_t register_fail_exit_ms; /* before the first registration: give up if the broker
                                    * cannot be reached this long; 0 = never. Later a silent
                                    * broker is waited for (logged). */
    double stall_exit_s; /* no loop iteration this long: exit 5 (heartbeat.h); 0 = never */
} target_loop_config;

typedef struct target_stats {
    uint64_t batches, tokens;
    double fill_s, wait_slot_s, elapsed_s;
    uint64_t registrations;
    bool name_in_use; /* the broker refused our hello: another live target has our name */
} target_stats;

/* Runs the loop until drained, stopped or a fatal error. The pool is created inside (and its
 * shm removed on return, after a stop's leave: target_leave.h). Returns 0 (drained or stopped)
 * or a negative code after logging the reason (DFLASH_ECONFIG: the CURVE key files cannot be
 * used, or the broker refused our pool for its plan or buckets); *stats (may be NULL) gets the
 * totals. Main thread. */
int target_loop_run(const target_loop_config *cfg, target_producer *prod,
                    volatile sig_atomic_t *stop, target_stats *stats);

/* The synthetic producer of `dflash-target --model synthetic` (synthetic.h): sequence lengths
 * of bucket b are drawn from (upper[b-1], upper[b]]. Works for host and cuda pools (cuda:
 * generated on the host, uploaded). rate > 0 paces it to that many batches per second, to model
 * a slower target (tests, bench/pipeline); 0 = as fast as it can. NULL on failure. */
target_producer *target_synthetic_new(const target_loop_config *cfg, uint32_t vocab_size,
                                      double rate);
/* The synthetic producer's plan identity (batch_plan_identity of its bounds, token budget and
 * max seqs, over its vocabulary as the data): what decides the contents of its batches. */
uint64_t target_synthetic_plan_id(const target_loop_config *cfg, uint32_t vocab_size);
/* Calls prod->destroy and frees; accepts NULL. */
void target_producer_destroy(target_producer **prod);

#endif
