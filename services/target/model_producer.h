/* model_producer: the real producer of dflash-target. Turns a work unit (epoch, bucket, batch)
 * into a filled slot: materialises the batch from the batch plan and the token shards, writes the
 * slot's arrays, runs the target forward up to the deepest captured layer and lets it write the
 * captured layers straight into the slot's hidden rows (no concatenation copy), then the header.
 *
 * (Named model_producer, not target_model, so that its header never shadows
 * common/nn/target_model.h on an include path that holds both folders.)
 *
 * Data: the target_model (weights + activations planned for the slot's token budget), the shard
 * set (mmapped; its recorded vocabulary checked against the model's, shard_check_vocab, and its
 * token ids verified against it once at creation), the batch plan, and
 * host staging for one batch's seq offsets / positions / ids / loss mask (uploaded into the slot
 * with the backend's upload_raw, so the slot may be device memory).
 * Thread: one producer is driven by one thread (the target's compute thread); the batch plan's
 * epoch cache and the model's activations are not shareable.
 */
#ifndef DFLASH_MODEL_PRODUCER_H
#define DFLASH_MODEL_PRODUCER_H

#include "batch_plan.h"
#include "ops.h"
#include "slot.h"
#include "target_model.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct model_producer model_producer;

typedef struct model_producer_opts {
    const char *model_dir;         /* HF directory (config.json + safetensors) */
    const char *shards;            /* comma-separated shard paths */
    const uint32_t *bucket_bounds; /* inclusive upper bounds, ascending */
    int n_buckets;
    uint32_t token_budget; /* tokens per slot (>= the largest bound) */
    uint32_t max_seqs;     /* sequences per slot */
    uint64_t seed;         /* batch plan seed */
    const int *layer_ids;  /* captured ids (NULL: DFlash's rule for drafter_layers) */
    int n_layer_ids;
    int drafter_layers;
    volatile sig_atomic_t *stop; /* the daemon's stop flag (may be NULL): ends loading, warmup */
} model_producer_opts;

/* Loads the model and the shards and builds the plan. NULL with the reason in err and, when
 * code is not NULL, *code DFLASH_ECONFIG for options or data that do not fit (bounds, a bucket
 * no sequence falls in, a shard made for another vocabulary or with a token id outside the
 * model's, a captured layer id the model lacks, found from config.json before the weights
 * load), else another code (a checkpoint or shard that cannot be read, out of memory, or
 * *o->stop set while loading). */
model_producer *model_producer_new(const model_producer_opts *o, const nn_ops *ops, nn_ctx *ctx,
                                   int *code, char *err, size_t errlen);
void model_producer_destroy(model_producer **p);

/* The slot layout this producer fills: token_budget, max_seqs, hidden, captured layers, and the
 * backend's dtype (f32 cpu, bf16 cuda). 0 or the slot_layout_compute error. */
int model_producer_layout(const model_producer *p, slot_layout *out);

/* Borrowed views (valid while p lives) for registration with the broker and for tests. */
batch_plan *model_producer_plan(model_producer *p);
const target_model *model_producer_model(const model_producer *p);

/* Fills the slot at base (backend memory laid out as l, which must equal
 * model_producer_layout's) with batch wu and writes the header with the producer id.
 * Returns the number of tokens (> 0) with *n_seqs (may be NULL) set, DFLASH_ERANGE (no such
 * batch), DFLASH_EMISMATCH (layout) or another negative code. Work is queued on the backend's
 * stream; the caller records the slot's event afterwards. */
int model_producer_fill(model_producer *p, void *base, const slot_layout *l,
                        const slot_work_unit *wu, uint64_t producer, uint32_t *n_seqs);

/* The verifying side of the end-to-end test: checks a copied slot (host memory, laid out as
 * model_producer_layout's) against this producer's own materialisation of the batch named in its
 * header and a direct forward of it: header and arrays valid, arrays equal to the plan's batch,
 * and every captured (token, layer) row within max|got - want| / max|want| <= tol (0 demands
 * bit equality on the same backend; bf16 slots need about 1e-2). *max_err (may be NULL) gets the
 * worst row. Returns 0, or the slot_header_check code / DFLASH_ECORRUPT with the first problem
 * (batch, token, layer) in err. Allocates scratch: not for the hot loop. */
int model_producer_verify(model_producer *p, const void *slot, const slot_layout *l, double tol,
                          double *max_err, char *err, size_t errlen);

/* Runs one forward per bucket at its full-batch shape (sequences of the bound's length while they
 * fit the budget) into a scratch slot allocated and freed here, so every shape is warm before
 * the daemon reports ready; logs each bucket's time as it goes (on a large model on the cpu
 * this takes minutes). Start-up only. 0, DFLASH_ESHUTDOWN (the stop flag was set) or
 * negative. */
int model_producer_warmup(model_producer *p);

/* Fills the loop config's layout and buckets (bounds, token shares, batches of epoch 0: the
 * count the broker keeps for every epoch; fill numbers the batches of other epochs to match, see
 * model_producer.c). 0 or DFLASH_ERANGE (too many buckets). */
struct target_loop_config;
int model_producer_loop_config(model_producer *p, struct target_loop_config *cfg);

/* Wraps *p as the target loop's producer (target_loop.h), taking ownership (*p = NULL); the
 * loop's producer id (its pool's incarnation) goes into every slot header. Free with
 * target_producer_destroy. NULL on out of memory (then *p is left as is). */
struct target_producer;
struct target_producer *model_producer_as_target(model_producer **p);

#endif
