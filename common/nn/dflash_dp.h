/* dflash_dp: the data-parallel DFlash training step: one process per rank, each with its own
 * copy of the drafter (dflash_model) and its own batch, joined by a dp_comm (collective.h).
 *
 * Loss normalisation (reference/dflash.md 3.3): the group's objective for one optimizer step is
 *     L = sum over ranks r of sum_r w*CE  /  W,    W = sum over ranks of W_r,  W_r = sum_r w
 * i.e. the GLOBAL weight sum is the denominator; it is NOT the mean of per-rank means. One step:
 *   1. each rank: anchors and gradients of its own batch (dflash_train_grads), which are
 *      normalised by the local W_r (known on the host); a rank with no anchors or zero weight
 *      gets zero gradients;
 *   2. allreduce (host doubles) of [W_r, loss_r * W_r, failed_r, and the metric counts];
 *   3. allreduce of the gradients, each rank's scaled by W_r / W on the way in (the collective's
 *      pre-scaled sum: NCCL PreMulSum on the device, or while staging on shm), giving the
 *      gradient of L above, bit-identical on every rank; the matrices' act-typed part (bf16 on
 *      cuda) and the vectors' fp32 part are two calls (collective.h: how bf16 is summed);
 *   4. clipping with ONE norm for the group: rank 0's sum of squares of that gradient is used
 *      by all ranks (a backend's sum of squares need not be bit-reproducible across processes
 *      or devices, as the cuda one was with float atomics before c6ce6ed, and a clip factor
 *      differing in the last bit makes the ranks drift apart: seen on the H200); on a step that
 *      clips, the gradient is scaled here by
 *      clip / (norm + 1e-6) (ops->scale_act and scale_f32);
 *   5. dflash_train_apply with clipping off: AdamW sees the same global gradient on every
 *      rank, so master weights, moments and step stay bit-identical.
 * If W == 0 every rank skips the update (met->skipped) consistently; the step counts (m->step
 * moves, as for an accumulated step whose batches all lack weight): the group's step is done. If a rank fails locally
 * (a bad batch) it still joins the allreduces, nobody applies the step, the failing rank returns
 * its code and the others DFLASH_EAGAIN; the group stays usable.
 * Gradient accumulation (tc->accumulate = A > 1): a group step is up to A micro-steps of one
 * batch per rank (dflash_dp_micro, no collective) closed by dflash_dp_close: step 1 becomes the
 * rank's accumulated gradient G_r = sum_k W_rk g_rk / W_r over its micro-steps' batches, W_r =
 * sum_k W_rk (dflash_train_grads_close), and steps 2-5 run once with it, so the group's gradient
 * is sum over ranks and micro-steps of W g / W with W the weight sum of all of them: the update
 * of one solo step accumulating the same batches, up to fp32 rounding on cpu (on cuda each rank's
 * G_r is stored in bf16 before the all-reduce, as a one-batch step's gradient is). dflash_train_step_dp
 * (with a comm) trains one batch a rank whatever tc->accumulate says.
 * Memory: cpu model + shm: m->grads (host) are reduced in place. cuda model + nccl: m->grads are
 * reduced on the device, on the model's stream (ops->stream). cuda model + shm: the gradients
 * move through the shm segment chunk by chunk with the ops' download_raw / upload_raw
 * (dp_host_io), so no host copy of the gradients is allocated at all. cpu model + nccl: refused
 * (DFLASH_EUNSUPPORTED).
 * Threads: the model's thread. Callers: the drafter daemon's group worker (services/drafter),
 * the tests.
 */
#ifndef DFLASH_NN_DFLASH_DP_H
#define DFLASH_NN_DFLASH_DP_H

#include "collective.h"
#include "dflash_train.h"

/* One optimizer step of a data-parallel group: this rank's batch b; comm NULL = single process
 * (exactly dflash_train_step). met receives the GROUP's metrics: loss = sum w*CE / W over all
 * ranks, weight_sum = W, accuracy / pos_acc / pos_count / accept_len / n_blocks / n_weighted /
 * n_ctx_tokens over all ranks' batches, and lr, grad_norm (of the global gradient), step.
 * Returns 0, DFLASH_EAGAIN (a peer's batch failed; nothing was applied anywhere), this rank's
 * own batch error (nothing applied anywhere), or a collective error (the group is broken). */
int dflash_train_step_dp(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                         uint64_t epoch, uint64_t batch_key, dp_comm *comm, dflash_metrics *met);
/* The same; local (may be NULL) receives this rank's own numbers as dflash_train_grads gives
 * them (loss and weight_sum of its batch alone, skipped when it had no weight), plus the
 * step's lr / grad_norm / step. */
int dflash_train_step_dp_ex(dflash_model *m, const dflash_train_cfg *tc,
                            const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key,
                            dp_comm *comm, dflash_metrics *met, dflash_metrics *local);

/* Gradient accumulation in a group (see the header): this rank's batch b joins the open group
 * step (its weighted gradient into the fp32 accumulator; no collective, synchronous). local:
 * the batch's own figures. Returns 0 or the batch's error (it adds nothing; pass the code to
 * dflash_dp_close, which then fails on every rank as a one-batch step does). */
int dflash_dp_micro(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                    uint64_t epoch, uint64_t batch_key, dflash_metrics *local);
/* Takes the open group step with the micro-steps it has (every rank must close after the same
 * number: the broker's word): steps 2-5 of the header with this rank's accumulated gradient.
 * local_rc: a micro-step's error on this rank (0: none). met and local as for
 * dflash_train_step_dp_ex (met->batches: this rank's micro-steps). Returns 0, DFLASH_EAGAIN (a
 * peer's batch failed; nothing applied anywhere), local_rc, or a collective error. comm NULL:
 * the step applied alone. */
int dflash_dp_close(dflash_model *m, const dflash_train_cfg *tc, dp_comm *comm, int local_rc,
                    dflash_metrics *met, dflash_metrics *local);

/* Makes every rank's trainable state equal to root's: master weights, params, AdamW m and v,
 * m->step and, when tc is not NULL, the training settings *tc (schedule, optimizer, anchors,
 * seed: root's win, as a checkpoint's do on resume, so that every rank applies the same
 * update; a rank whose settings differed says so in its log). Used when a group forms or
 * re-forms: a joining rank takes rank 0's state. First checks that every rank has root's
 * parameter count and tensor layout; when some rank has not, nothing is copied anywhere and the
 * ranks that differ get DFLASH_EMISMATCH (logged), root and the ranks that match it
 * DFLASH_EAGAIN (logged, naming the ranks that differ): root's model is the group's, so only the
 * others are at fault, and the rest of the group re-forms without them. comm NULL: nothing to
 * do, 0. */
int dflash_dp_sync_state(dflash_model *m, dflash_train_cfg *tc, dp_comm *comm, int root);

/* The drafter's layout: a hash of its tensor table (names, shapes, offsets), its sizes and the
 * settings that shape its function without tensors (block size, captured target layers); the
 * model of every rank of a group must have rank 0's (dflash_dp_sync_state compares them). A
 * group joiner states it to the broker, which turns away one of another layout than the group's
 * (docs/protocol.md, GroupJoin.shape). Any thread that may read m->cfg and the tensor table. */
uint64_t dflash_dp_layout_hash(const dflash_model *m);
/* The same layout in words for messages ("2 layers, block 16, hidden 4096, target layers
 * 1,17,33 of 36, N parameters"), cut to len - 1 bytes (ending "...") when longer. */
void dflash_dp_layout_text(const dflash_model *m, char *buf, size_t len);

/* FNV-1a hash of the bytes of the trainable state (master, adam_m, adam_v and step), read from
 * the backend; for tests and logs that compare ranks. 0 when out of host memory. */
uint64_t dflash_dp_state_hash(const dflash_model *m);

#endif
