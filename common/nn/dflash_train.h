/* dflash_train: DFlash training samples and the training step (reference/dflash.md 3.1, 3.2).
 *
 * One step over one slot's batch (several packed sequences):
 *   1. anchors: per sequence, candidates p in [0, S-2] with loss_mask[p] and loss_mask[p+1];
 *      min(n_anchors, #candidates) drawn uniformly without replacement from a splitmix64 stream
 *      seeded by (seed, epoch, batch key, sequence index), sorted ascending. Deterministic: the
 *      same batch in the same epoch gets the same anchors after a restart.
 *   2. blocks: block j of sequence s with anchor a: noise ids [ids[a], MASK x (B-1)], positions
 *      pos[a] + o, labels ids[a+o] (clamped inside the sequence), weights
 *      w = [a+o < S] * [o >= 1] * loss_mask[a+o] * exp(-(o-1)/gamma); its span sees the
 *      sequence's context rows [start, start + a) and its own B rows.
 *      Only kept blocks are packed (no padding blocks), so keep is 1 for every block.
 *   3. forward, loss = sum w*CE / sum w over the whole batch, backward (dflash_model).
 *   4. grad norm over all trainable tensors, clipping to `clip`, AdamW (fp32 master and moments;
 *      the matrices' gradients act-typed, ops.h; weight decay on matrices only), learning rate
 *      from the warmup + cosine schedule.
 * Gradient accumulation (tc->accumulate = N > 1): one optimizer step over N slots' batches,
 * queued one at a time (dflash_train_step_async). The step's loss is sum w*CE / sum w over all
 * N batches (the global weight sum, as a data-parallel group's, dflash_dp.h), so its gradient is
 * sum_i (W_i / W) g_i with g_i a batch's gradient normalised by its own W_i: each batch but the
 * last adds W_i g_i to an fp32 accumulator (ops grad_accumulate; fp32 whatever the gradients'
 * act type, so 32 bf16 additions do not round 32 times); the last forms (acc + W_N g_N) / W
 * into the gradients (grad_average) and steps 4 run once. N batches of one sequence each give
 * the same update as one batch holding the N sequences with the same anchors (test_dflash_model
 * checks it), up to fp32 rounding. A step whose batches have no weight at all makes no update
 * (met->skipped) but counts as a step (m->step moves: its batches were acked with it);
 * dflash_train_flush_async closes a step with fewer batches (the end of a run). A data-parallel
 * group (dflash_dp.h) accumulates with dflash_train_grads_accumulate / _close instead: the same
 * accumulator, but the step's gradient is left for the group's all-reduce. The accumulator
 * (4 bytes per parameter) is allocated by dflash_train_plan.
 * No step waits for the device: results come back asynchronously (see dflash_train_step_async).
 * Metrics (host, once the step has run): loss, accuracy over w > 0
 * (undecayed), per-offset accuracy, acceptance length of the training blocks (1 + leading correct
 * offsets, an offset with w == 0 ends the run), learning rate, gradient norm.
 *
 * Threads: the model's thread. No allocation in the step: host staging lives in the model.
 * Callers: the drafter daemon's trainer (services/drafter), the tests, dflash_eval.
 */
#ifndef DFLASH_NN_DFLASH_TRAIN_H
#define DFLASH_NN_DFLASH_TRAIN_H

#include "dflash_anchor.h" /* dflash_anchor_candidate: the anchors' rule */
#include "dflash_model.h"
#include "slot.h"

#include <stdbool.h>
#include <stdint.h>

#define DFLASH_MAX_BLOCK 64

/* Training hyper-parameters; defaults (dflash_train_cfg_default) from dflash.md 3.1. */
typedef struct dflash_train_cfg {
    int n_anchors;            /* anchors per sequence (512) */
    double gamma;             /* loss decay; <= 0: 7 for B 16, 5 for B 10, 4 for B 8, else 7*B/16 */
    double lr;                /* peak learning rate (6e-4) */
    double warmup_ratio;      /* fraction of total_steps warming up linearly (0.04) */
    long total_steps;         /* schedule length; 0: constant lr (no cosine, and no warmup:
                               * it is warmup_ratio of 0 steps) */
    double min_lr_ratio;      /* cosine floor as a fraction of lr (0) */
    double clip;              /* global gradient-norm clip (1.0); <= 0: none */
    double beta1, beta2, eps; /* AdamW (0.9, 0.999, 1e-8) */
    double weight_decay;      /* decoupled, matrices only (0.0, SpecForge's default) */
    uint64_t seed;            /* anchor sampling seed (0) */
    int accumulate;           /* slots' batches per optimizer step (1; <= 1: one) */
    int world;                /* drafters a step is for (a data-parallel group's --group-size,
                               * else the ranks of its last step; 1 alone): the step is world x
                               * accumulate slots.
                               * Recorded in checkpoints ("world"); 0: unknown (0) */
} dflash_train_cfg;

/* One slot's batch, as the slot holds it. Host memory except hidden. */
typedef struct dflash_batch_view {
    int n_seqs;
    const int32_t *seq_off;   /* [n_seqs + 1], seq_off[0] = 0, T = seq_off[n_seqs] */
    const int32_t *ids;       /* [T] token ids */
    const int32_t *positions; /* [T] position of each token in its sequence; NULL: 0..S-1 */
    const uint8_t *loss_mask; /* [T] 0/1 */
    const nn_buf *hidden;     /* backend memory [T, ld] act type; features in the first nF*D */
    size_t ld;                /* row stride in elements; must equal nF*D */
} dflash_batch_view;

typedef struct dflash_metrics {
    bool skipped;                     /* no weighted position in the batch: no update was made */
    double loss;                      /* sum w*CE / sum w */
    double weight_sum;                /* sum w */
    double accuracy;                  /* argmax == label over positions with w > 0 */
    double accept_len;                /* mean over blocks of 1 + leading correct offsets */
    double pos_acc[DFLASH_MAX_BLOCK]; /* per offset o (o >= 1) accuracy; pos_count[o] positions */
    int pos_count[DFLASH_MAX_BLOCK];
    int n_blocks, n_ctx_tokens, n_weighted;
    double lr;        /* learning rate used by this step */
    double grad_norm; /* before clipping */
    long step;        /* optimizer steps taken after this one */
    /* Gradient accumulation (tc->accumulate > 1): open: this batch's record, of a step that
     * more batches will join (loss and the counts are this batch's alone; no lr, norm, step);
     * batches: the batches the step trained (the record that closes a step holds the whole
     * step's figures, over all its batches: loss = sum w*CE / sum w, counts summed). 1 without
     * accumulation. */
    bool open;
    int batches;
} dflash_metrics;

void dflash_train_cfg_default(dflash_train_cfg *tc);

/* A step's metrics as counts that add up over batches or ranks (integers far below 2^53 and the
 * weight sums: exact or nearly so): [0] W  [1] loss * W  [2] weighted positions  [3] correct
 * ones  [4] blocks  [5] sum of acceptance lengths  [6] context tokens  [7, 7 + MB) per-offset
 * positions  [7 + MB, 7 + 2 MB) per-offset correct (MB = DFLASH_MAX_BLOCK). to_counts writes
 * them; from_counts sets the loss and count metrics of met from them (the rest untouched). */
#define DFLASH_METRIC_COUNTS (7 + 2 * DFLASH_MAX_BLOCK)
void dflash_metrics_to_counts(const dflash_metrics *met, double *v);
void dflash_metrics_from_counts(dflash_metrics *met, const double *v);

/* A view of one slot for the drafter m. host_base is the slot (or a host copy of at least its
 * header and small arrays: seq offsets, positions, ids, loss mask); hidden is its hidden-state
 * array in backend memory (cpu: slot_hidden(host_base, l)). Checks the header
 * (slot_header_check) and that the slot fits the drafter: hidden size, captured layers, the
 * backend's dtype (f32 on cpu, bf16 on cuda), tokens within m->max_tokens, and the arrays
 * against the header (slot_arrays_check: offsets ending at n_tokens, positions, token ids in the
 * vocabulary, 0/1 loss mask). Returns 0 or DFLASH_EMISMATCH / DFLASH_ERANGE / DFLASH_ECORRUPT /
 * a slot_header_check code, with a message naming both values in err. */
int dflash_view_from_slot(const dflash_model *m, const void *host_base, const slot_layout *l,
                          const void *hidden, dflash_batch_view *v, char *err, size_t errlen);
/* The batch key of a work unit for dflash_train_step (bucket and batch index; the epoch is
 * passed separately). */
uint64_t dflash_batch_key(const slot_work_unit *wu);
/* The decay gamma actually used for block size B. */
double dflash_train_gamma(const dflash_train_cfg *tc, int B);
/* Learning rate of optimizer step `step` (0-based): linear warmup (step+1)/W over
 * W = floor(warmup_ratio * total_steps) steps (SpecForge's int()), then cosine from lr to min_lr_ratio*lr at
 * total_steps. */
double dflash_train_lr(const dflash_train_cfg *tc, long step);

/* Draws the anchors of a batch (step 1) into m->h_blk_seq / m->h_blk_anchor; returns the block
 * count (>= 0), or DFLASH_ERANGE when they exceed m->max_blocks, DFLASH_EINVAL on a bad view. */
int dflash_train_sample_anchors(dflash_model *m, const dflash_train_cfg *tc,
                                const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key);

/* Builds the blocks for nb anchors (blk_seq[j] sequence, blk_anchor[j] index within it) and
 * uploads them (step 2). *wsum receives sum w. Returns 0 or a negative code. */
int dflash_train_build(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                       int nb, const int32_t *blk_seq, const int32_t *blk_anchor, double *wsum);

/* Loss and gradients for the given anchors (steps 2-3): zeroes grads, then forward, loss,
 * backward, and waits for them. Fills the loss and accuracy metrics. A batch without blocks
 * or weight runs no forward (met->skipped) and leaves zero gradients. Collects (drops) the
 * metrics of any step still pending from dflash_train_step_async. Returns 0 or a code. */
int dflash_train_grads(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                       int nb, const int32_t *blk_seq, const int32_t *blk_anchor,
                       dflash_metrics *met);
/* Clip, schedule and AdamW over the gradients (step 4); increments m->step; waits for it and
 * fills met->lr, grad_norm and step. Call after dflash_train_grads. */
void dflash_train_apply(dflash_model *m, const dflash_train_cfg *tc, dflash_metrics *met);
/* Queues zero gradients for a step without a backward, once the previous update (on the ops'
 * side stream, if any) has read them. Model's thread. */
void dflash_train_zero_grads(dflash_model *m);

/* The whole step on a slot's batch: anchors from (tc->seed, epoch, batch_key), grads, apply.
 * batch_key identifies the batch within the epoch (e.g. bucket << 40 | batch index). A batch
 * without any weighted position is not applied (met->skipped). Returns 0 or a negative code. */
int dflash_train_step(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                      uint64_t epoch, uint64_t batch_key, dflash_metrics *met);

/* The same step without any host wait (the daemon's hot loop): everything is queued on the
 * backend's stream, m->step advances at once (with accumulation: once the step's last batch is
 * queued), and the metrics come back later through dflash_train_collect, one record a batch
 * (met->open: a batch of a step still open). At most two steps may be pending (DFLASH_ESTATE beyond); the caller
 * collects the older one after queuing the newer, so the device always has a step queued.
 * b's host arrays may be reused when this returns; b->hidden must stay valid until the step
 * has run on the device (order the next write to it after the step with ops->order_after). */
int dflash_train_step_async(dflash_model *m, const dflash_train_cfg *tc,
                            const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key);
/* The metrics of the oldest pending step, waiting for the device if that step still runs:
 * returns 1 with *met filled, or 0 when no step is pending. */
int dflash_train_collect(dflash_model *m, dflash_metrics *met);
/* Steps queued and not collected yet. */
int dflash_train_pending(const dflash_model *m);
/* Allocates the pending-metrics records (pinned host memory on cuda) so that no step
 * allocates; called by the first step otherwise. 0 or DFLASH_ENOMEM. */
int dflash_train_prepare(dflash_model *m);
/* dflash_train_prepare plus, for tc->accumulate > 1, the fp32 gradient accumulator (4 bytes a
 * parameter; else allocated by the first step that needs it). 0 or DFLASH_ENOMEM. */
int dflash_train_plan(dflash_model *m, const dflash_train_cfg *tc);
/* Batches queued into the optimizer step still open (0: none; accumulation only). The step that
 * includes a batch just queued is m->step + (dflash_train_open(m) > 0). */
int dflash_train_open(const dflash_model *m);
/* Closes the open step with the batches it has (the end of a run whose last step has fewer than
 * tc->accumulate): queues its update, or a skipped record when none of them had weight. Returns
 * 1 when a record was queued (collect it like a step's), 0 when no step was open, or
 * DFLASH_ESTATE when two records are still pending (collect one first). */
int dflash_train_flush_async(dflash_model *m, const dflash_train_cfg *tc);

/* Accumulation for a data-parallel group (dflash_dp.h), synchronous: batch b (anchors from
 * tc->seed, epoch, batch_key) joins the open step, its gradient weighted by its W into the
 * accumulator, and the step is never closed here whatever tc->accumulate says (the group closes
 * it when the broker says, dflash_train_grads_close). met: the batch's own figures (met->open).
 * 0, or a code (the batch adds nothing to the step). */
int dflash_train_grads_accumulate(dflash_model *m, const dflash_train_cfg *tc,
                                  const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key,
                                  dflash_metrics *met);
/* Closes the open step without an update: the gradients become sum_i W_i g_i / W over its
 * batches (zero when none had weight), for the caller to apply (dflash_train_apply); m->step
 * does not move. met: the step's figures over its batches (loss = sum w*CE / W, weight_sum W,
 * counts summed, batches; skipped when W == 0). 0 or DFLASH_ESTATE (two records pending). */
int dflash_train_grads_close(dflash_model *m, const dflash_train_cfg *tc, dflash_metrics *met);
/* Drops the open step (its batches' gradients and figures) without an update: a group step
 * abandoned between its micro-steps (the group re-forms; the broker gives its batches out
 * again). No-op when none is open. */
void dflash_train_discard(dflash_model *m);

#endif
