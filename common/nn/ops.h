/* ops: the small set of neural-network operations every model in the project is written against.
 *
 * One model definition per architecture (target forward, DFlash drafter forward/backward) calls
 * these through an nn_ops table; two backends implement the table:
 *   cpu  (ops_cpu.c): fp32 everywhere, OpenBLAS sgemm for linear layers. The reference.
 *   cuda (ops_cuda.cu): bf16 activations, weights and matrix weight gradients, fp32
 *        accumulation, fp32 master weights (the matrices' split into the bf16 weight and a
 *        low half: master_split.h), vector gradients and AdamW moments.
 * A "buffer" (nn_buf) is backend memory holding `act` elements (cpu: float; cuda: bf16). Buffers
 * typed `float *` are fp32 on every backend (vector weight gradients, master weights, optimizer
 * moments, softmax statistics, loss sums). Index arrays (`const int32_t *`) are backend memory
 * too.
 * Weight gradients: a matrix's (linear_bwd's dw) is act-typed: each product accumulates in fp32
 * and rounds once when it stores (cuda: bf16, half the bytes of fp32 for the product to write
 * and for sumsq and AdamW to read; cpu: fp32, as before). A product that adds to a stored
 * gradient reads the rounded value, adds in fp32 and rounds again. PyTorch's autocast, the
 * reference we race, rounds its weight gradients to bf16 the same way (a bf16 matmul's weight
 * gradient is a bf16 tensor), so the comparison is fair. Vector gradients (rmsnorm_bwd's and
 * head_norm_rope_bwd's dw, linear_bwd's db) stay fp32: they are sums of many atomic adds.
 * Host<->backend transfers go through upload/download (and download_raw_async, which a training
 * step uses so that it never waits for the device).
 *
 * Shapes use named dimensions: T packed tokens, D hidden, H query heads, Hk kv heads, d head dim,
 * F intermediate, V vocabulary, Q query rows (drafter blocks * B), B block size, R rows.
 * Matrices are row-major; a linear weight is [N_out, K_in] like PyTorch.
 *
 * Conventions: forward functions overwrite their output. Backward functions ACCUMULATE (+=)
 * into weight gradients (dw, db, dgamma) and OVERWRITE input gradients (dx) unless an argument
 * says otherwise (linear_bwd's mode, rmsnorm_bwd's dres). Every function runs on the context's
 * stream (cpu: synchronously on the caller's thread, possibly with internal threads). No function
 * allocates; scratch comes from the caller.
 */
#ifndef DFLASH_NN_OPS_H
#define DFLASH_NN_OPS_H

#include <math.h> /* sqrtf in NN_CLIP_SCALE */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef void nn_buf; /* backend memory of the backend's activation type */

typedef struct nn_ctx nn_ctx; /* backend state: threads (cpu), stream + handles (cuda) */

/* RoPE tables for one head_dim d (rotate_half: dimension i pairs with i + d/2):
 *   inv_freq[d/2]: the frequencies, Llama-3 scaling already applied; built on the host by
 *     rope_inv_freq() (rope.c) and uploaded once.
 *   rot[T, d]: the rotation per token, filled by rope_table from positions once per batch and
 *     read by every RoPE op of it. Row t is [cos | sin]: for i < d/2 and the fp32 angle
 *     a = (float)pos[t] * inv_freq[i], rot[t d + i] = cos(a) and rot[t d + d/2 + i] = sin(a)
 *     (the backend's cosine and sine). fp32 on every backend; a RoPE op given T tokens reads
 *     the T rows starting at its rot argument (the cuda ops' fast paths want it 16-byte
 *     aligned: a lane reads its 8 columns' cos and sin as 16-byte loads). */

/* One DFlash training/eval block: the B query rows q0..q0+B-1 attend to context keys
 * [ctx_begin, ctx_end) and to their own block keys [blk_begin, blk_begin + B). keep == 0 means
 * the block is padding: its outputs and gradients are zero. All indices are rows of the K/V
 * buffers. */
typedef struct nn_block_span {
    int32_t ctx_begin, ctx_end;
    int32_t blk_begin;
    int32_t keep;
} nn_block_span;

#define NN_FENCES 4
#define NN_SIDE_MARKS 16
/* Global-norm clipping factor from the sum of squared gradients (fp32, on host or device):
 * clip <= 0 disables clipping. */
#define NN_CLIP_SCALE(sumsq, clip)                                                                 \
    ((clip) > 0.0f && sqrtf(sumsq) > (clip) ? (clip) / (sqrtf(sumsq) + 1e-6f) : 1.0f)

/* linear_bwd modes */
#define NN_BWD_DX_ADD 1 /* dx += dy . w (else dx = dy . w) */
#define NN_BWD_DW_SET 2 /* dw = dy^T . x (else dw += dy^T . x) */

typedef struct nn_ops {
    const char *name; /* "cpu" or "cuda" */
    size_t act_bytes; /* sizeof one nn_buf element: 4 (cpu) or 2 (cuda) */
    /* The attention ops' head shapes (0: no limit): head_dim at most max_head_dim, at most
     * max_q_per_kv query heads per kv head. A model checks them when it is made
     * (nn_ops_check_heads), so an unsupported target or drafter is refused by name at start-up
     * instead of reaching a kernel that cannot take it. */
    int max_head_dim, max_q_per_kv;
    /* How a matrix's fp32 master is stored (adamw_clip_act): false (cpu), as the fp32 weight
     * itself; true (cuda), split into the bf16 weight and a low half (master_split.h). */
    bool master_split;

    /* ---- memory ---- */
    void *(*alloc)(nn_ctx *c, size_t bytes);        /* zeroed; NULL on failure */
    void (*free)(nn_ctx *c, void *p);               /* accepts NULL */
    void (*upload)(nn_ctx *c, nn_buf *dst, const float *src, size_t n);   /* fp32 host -> act */
    void (*download)(nn_ctx *c, float *dst, const nn_buf *src, size_t n); /* act -> fp32 host */
    void (*upload_raw)(nn_ctx *c, void *dst, const void *src, size_t bytes);  /* bytes as is */
    void (*download_raw)(nn_ctx *c, void *dst, const void *src, size_t bytes);
    void (*copy)(nn_ctx *c, void *dst, const void *src, size_t bytes);        /* device-device */
    /* Strided device-device copy of `rows` rows of width_bytes each: row r goes from
     * src + r * src_pitch to dst + r * dst_pitch (pitches in bytes, >= width_bytes). One call
     * (cuda: cudaMemcpy2DAsync on the context stream), e.g. a layer into a slot's interleaved
     * columns. Regions must not overlap. */
    void (*copy2d)(nn_ctx *c, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                   size_t width_bytes, size_t rows);
    /* Row i of src goes to row rows[i] of dst, for i < n (rows of row_bytes bytes of any type;
     * rows[] distinct, on the device); other dst rows are left as they are. E.g. the gradients
     * of the loss rows back into the full [Q, D] dh, or their correct flags (row_bytes 4). */
    void (*rows_scatter)(nn_ctx *c, void *dst, const int32_t *rows, const void *src, int n,
                         size_t row_bytes);
    void (*zero)(nn_ctx *c, void *p, size_t bytes);
    void (*sync)(nn_ctx *c); /* waits for all queued work (cpu: no-op) */

    /* ---- asynchronous host traffic (a training step never waits for the device) ---- */
    /* The backend's native stream (cudaStream_t), or NULL (cpu). */
    void *(*stream)(nn_ctx *c);
    /* Host memory the device can copy into without a wait (cuda: pinned), zeroed; NULL on
     * failure. host_free accepts NULL. */
    void *(*host_alloc)(nn_ctx *c, size_t bytes);
    void (*host_free)(nn_ctx *c, void *p);
    /* Queues a device -> host copy into host_alloc memory and returns at once (cpu: copies). The
     * bytes are there once a fence recorded after it has been waited for. */
    void (*download_raw_async)(nn_ctx *c, void *dst, const void *src, size_t bytes);
    /* Fence k (0 <= k < NN_FENCES) marks the work queued so far; fence_wait blocks the host
     * until that work is done (a fence never recorded returns at once). cpu: no-ops. */
    void (*fence_record)(nn_ctx *c, int k);
    void (*fence_wait)(nn_ctx *c, int k);
    /* Makes another stream of the same device (e.g. a slot copy stream) wait, on the device,
     * for the work queued on c so far. No host wait. cpu (or stream NULL): no-op. */
    void (*order_after)(nn_ctx *c, void *stream);
    /* Calls so far that made the host wait for everything queued on the stream (sync, download,
     * download_raw, upload, free, host_free; cpu: 0): a hot loop checks that it adds none. */
    long (*stream_drains)(nn_ctx *c);
    /* Memory allocations so far by this process's backend (cpu: alloc and host_alloc; cuda:
     * every cudaMalloc and cudaMallocHost, the contexts' and the attention's scratch and the
     * matmul tuning's copies included). Memory is planned at start-up: a hot loop checks that
     * it adds none. Process-wide (the attention's scratch is per device, not per context). */
    long (*allocs)(nn_ctx *c);
    /* A side stream for work that may overlap the next step's (the optimizer's, see
     * dflash_train.c): after side_begin, ops run on a side stream that first waits, on the
     * device, for everything queued so far; side_mark(k) (0 <= k < NN_SIDE_MARKS) marks the
     * side work queued so far as stage k; side_end sends ops back to the main stream, which does
     * not wait. side_wait(k) makes the main stream wait, on the device, for stage k's latest
     * mark (a stage never marked: no wait); k < 0: for everything queued before the latest
     * side_end. Every host wait (sync, download, download_raw, free, host_free, fence_wait)
     * covers the side stream too; upload_raw and order_after do not (they order the main
     * stream's inputs): a caller writing what side work writes (a checkpoint's masters) calls
     * sync first. cpu, or cuda without DFLASH_CUDA_SIDE_STREAM=1: side ops run on the main
     * stream in order, marks and waits do nothing. Only ops that need no context scratch may
     * run on the side stream: elementwise ops, copies, zero, scale_*, adamw*; cuda's matmuls
     * (and lm_head_*), sumsq, upload, download and attention share the context's scratch with
     * the main stream and assert that they run on it. */
    void (*side_begin)(nn_ctx *c);
    void (*side_mark)(nn_ctx *c, int k);
    void (*side_end)(nn_ctx *c);
    void (*side_wait)(nn_ctx *c, int k);
    /* From now on each matmul shape met for the first time times the backend's first
     * `candidates` algorithms (cuda: cuBLASLt's heuristic list, at most 16) on its own operands
     * and keeps the fastest for later calls of that shape; that first call waits for the device
     * (counted in stream_drains): meant for start-up (dflash_model_tune). 0 or 1: no timing.
     * Returns the previous setting, or -1 where there is nothing to tune (cpu). */
    int (*matmul_tune)(nn_ctx *c, int candidates);

    /* ---- forward ---- */
    /* out[T,D] = table[ids[t], :]; ids in [0, V). */
    void (*embedding_fwd)(nn_ctx *c, nn_buf *out, const int32_t *ids, const nn_buf *table, int T,
                          int D);
    /* out[R,C] = x / sqrt(mean(x^2) + eps) * w. rstd[R] (fp32, may be NULL) saves 1/rms for
     * backward. The normalisation is computed in fp32 and cast back before the weight multiply
     * (HF Qwen3RMSNorm). Per-head q/k norm is this with R = T*heads, C = d. out may equal x. */
    void (*rmsnorm_fwd)(nn_ctx *c, nn_buf *out, float *rstd, const nn_buf *x, const nn_buf *w,
                        int R, int C, float eps);
    /* y[M,N] = x[M,K] . w[N,K]^T (+ b[N] if b). */
    void (*linear_fwd)(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w, const nn_buf *b,
                       int M, int K, int N);
    /* y[M,N] = res[M,N] + x[M,K] . w[N,K]^T: a residual add fused into the product (cuda: the
     * GEMM's beta = 1 with C = res, one rounding to bf16 instead of two). res may equal y (then
     * y += x . w^T); otherwise they must not overlap. */
    void (*linear_fwd_res)(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w,
                           const nn_buf *res, int M, int K, int N);
    /* rot[T, d] = the RoPE rotation table (above) of positions pos[T] and inv_freq[d/2]. */
    void (*rope_table)(nn_ctx *c, float *rot, const int32_t *pos, const float *inv_freq, int T,
                       int d);
    /* Per-head RMSNorm then RoPE, in one pass, on x[T, nh, d] (head rows of d, contiguous):
     * out = rope(rmsnorm_fwd(x, w, eps) over rows of d) with rotate_half RoPE by the table rows
     * rot[T, d] (rope_table): (x_i, x_{i+d/2}) <- (x_i cos - x_{i+d/2} sin, x_{i+d/2} cos +
     * x_i sin). The norm's output is rounded to act before the rotation, as the two ops one
     * after the other would. out may equal x. */
    void (*head_norm_rope_fwd)(nn_ctx *c, nn_buf *out, const nn_buf *x, const nn_buf *w,
                               const float *rot, int T, int nh, int d, float eps);
    /* The output of one fused q|k|v projection, qkv[T, (H + 2 Hk) * d] (per token: H query
     * heads, Hk key heads, Hk value heads), split into q[T,H,d], k[T,Hk,d], v[T,Hk,d]: q and k
     * through head_norm_rope_fwd (weights qn and kn; RoPE only when qn is NULL); v copied. */
    void (*qkv_norm_rope_fwd)(nn_ctx *c, nn_buf *q, nn_buf *k, nn_buf *v, const nn_buf *qkv,
                              const nn_buf *qn, const nn_buf *kn, const float *rot, int T, int H,
                              int Hk, int d, float eps);
    /* Causal GQA attention over packed sequences: tokens [seq_off[s], seq_off[s+1]) form
     * sequence s. q[T,H,d], k,v[T,Hk,d] -> out[T,H,d]. scale = 1/sqrt(d). */
    void (*attention_causal_fwd)(nn_ctx *c, nn_buf *out, const nn_buf *q, const nn_buf *k,
                                 const nn_buf *v, const int32_t *seq_off, int n_seqs, int T,
                                 int H, int Hk, int d);
    /* DFlash block attention: q[Q,H,d] with Q = n_blocks*B, k,v[Tk,Hk,d]. Query rows of block j
     * see the key rows given by spans[j]. lse[H,Q] (fp32) saves log-sum-exp for backward
     * (may be NULL at inference). Fully masked rows give zero output. */
    void (*attention_block_fwd)(nn_ctx *c, nn_buf *out, float *lse, const nn_buf *q,
                                const nn_buf *k, const nn_buf *v, const nn_block_span *spans,
                                int n_blocks, int B, int Tk, int H, int Hk, int d);
    /* out[R,F] = silu(gate) * up, where gu[R, 2F] holds per row gate in columns [0, F) and up in
     * [F, 2F): the output of one product with the gate and up weights back to back. */
    void (*swiglu_fwd)(nn_ctx *c, nn_buf *out, const nn_buf *gu, int R, int F);

    /* ---- backward ---- */
    /* dx[R,C] = d/dx (+ dres[R,C] when dres is not NULL: the gradient of a residual branch
     * around the norm, added before the one rounding), dw[C] += d/dw, given dy, x, w and saved
     * rstd. dx may equal dy or dres. */
    void (*rmsnorm_bwd)(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
                        const nn_buf *w, const float *rstd, int R, int C, const nn_buf *dres);
    /* dx[M,K] = dy . w (skipped if dx NULL), dw[N,K] += dy^T . x (act; skipped if NULL),
     * db[N] += sum_rows(dy) (fp32; skipped if NULL). mode (NN_BWD_*, or-ed) chooses how dx and
     * dw are written: dx overwritten unless NN_BWD_DX_ADD, dw added to unless NN_BWD_DW_SET (the
     * first product of a weight in a step then needs no zeroed gradient; M = 0 sets dw to 0).
     * dw is rounded to act once per call (see the weight gradients note above). */
    void (*linear_bwd)(nn_ctx *c, nn_buf *dx, nn_buf *dw, float *db, const nn_buf *dy,
                       const nn_buf *x, const nn_buf *w, int M, int K, int N, int mode);
    /* Backward of head_norm_rope_fwd: dx = rmsnorm_bwd(rope^T(dy)) (the rotation by -angle,
     * from the forward's table rows rot, kept in fp32, then the norm's backward with its rstd
     * recomputed from x and eps), dw[d] += d/dw. dx may equal dy. */
    void (*head_norm_rope_bwd)(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy,
                               const nn_buf *x, const nn_buf *w, const float *rot, int T, int nh,
                               int d, float eps);
    /* dgu[R, 2F] (dgate | dup per row, the layout of gu) from dout[R,F] and gu. */
    void (*swiglu_bwd)(nn_ctx *c, nn_buf *dgu, const nn_buf *dout, const nn_buf *gu, int R,
                       int F);
    /* Backward of attention_block_fwd. dq overwritten; dk, dv overwritten (every key row either
     * receives gradient or is set to zero). out and lse are the forward's. */
    void (*attention_block_bwd)(nn_ctx *c, nn_buf *dq, nn_buf *dk, nn_buf *dv,
                                const nn_buf *dout, const nn_buf *q, const nn_buf *k,
                                const nn_buf *v, const nn_buf *out, const float *lse,
                                const nn_block_span *spans, int n_blocks, int B, int Tk, int H,
                                int Hk, int d);
    /* Sizes the backend's scratch for attention_block_bwd calls of up to max_q query rows and
     * max_tk key rows (cuda: fp32 accumulators, allocated here, at start-up, never in a step;
     * larger calls still run, on slower paths; cpu: nothing). Called once by a model's
     * creation; safe to call again (it only grows). */
    void (*attention_block_plan)(nn_ctx *c, int max_q, int max_tk, int H, int Hk, int d);

    /* ---- loss ---- */
    /* Chunked lm_head + weighted cross-entropy, forward and backward at once; full logits
     * [Q,V] are never materialised (chunks of `chunk` rows, scratch logits[chunk,V] act).
     * For rows r with weight[r] > 0: loss_sum += weight[r] * CE(h[r] . W^T, label[r]);
     * dh[r] = weight[r] * inv_norm * (softmax - onehot) . W (overwrite; rows with weight 0 get
     * 0). correct[r] (int32, may be NULL) = argmax == label. out_sums (fp32[2], device) receives
     * {loss_sum, weight_sum} (overwrite). */
    void (*lm_head_xent)(nn_ctx *c, nn_buf *dh, float *out_sums, int32_t *correct,
                         const nn_buf *h, const nn_buf *W, const int32_t *labels,
                         const float *weights, float inv_norm, nn_buf *scratch, int Q, int D,
                         int V, int chunk);
    /* Greedy argmax of h[Q,D] . W[V,D]^T per row, chunked like above. */
    void (*lm_head_argmax)(nn_ctx *c, int32_t *out, const nn_buf *h, const nn_buf *W,
                           nn_buf *scratch, int Q, int D, int V, int chunk);

    /* ---- optimizer (fp32 state) ---- */
    /* out[0] = sum(ga[i]^2) over na act elements + sum(g[i]^2) over n fp32 ones (overwrite),
     * in fp32 or wider, in a fixed order (the same bits every run): a gradient's norm over its
     * act-typed matrices and fp32 vectors at once. */
    void (*sumsq)(nn_ctx *c, float *out, const nn_buf *ga, size_t na, const float *g, size_t n);
    /* AdamW on fp32 master p with moments m, v: grad scaled by grad_scale (clipping) first;
     * decoupled weight decay wd; bias correction with step t (1-based). Writes the act-typed
     * copy p_act (may be NULL on cpu where p is the weight itself). */
    void (*adamw)(nn_ctx *c, float *p, nn_buf *p_act, const float *g, float *m, float *v,
                  size_t n, float lr, float beta1, float beta2, float eps, float wd,
                  float grad_scale, int t);
    /* adamw with the clipping factor taken on the device from sumsq[0] (sumsq()'s output):
     * grad_scale = NN_CLIP_SCALE(sumsq[0], clip), so the step needs no host round trip. */
    void (*adamw_clip)(nn_ctx *c, float *p, nn_buf *p_act, const float *g, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps, float wd,
                       const float *sumsq, float clip, int t);
    /* adamw_clip for the matrices: an act-typed gradient g (widened to fp32 as it is read) and
     * the fp32 master as master_split says: without it, p (fp32, the weight itself; p_lo
     * NULL); with it, split (master_split.h) into the act weights p_act (bf16, the high half,
     * rounded) and p_lo (the low 16 bits), both read and written (p NULL). */
    void (*adamw_clip_act)(nn_ctx *c, float *p, nn_buf *p_act, uint16_t *p_lo, const nn_buf *g,
                           float *m, float *v, size_t n, float lr, float beta1, float beta2,
                           float eps, float wd, const float *sumsq, float clip, int t);
    /* x[n] *= a (fp32), e.g. gradients rescaled for a data-parallel loss normaliser. */
    void (*scale_f32)(nn_ctx *c, float *x, size_t n, float a);
    /* x[n] = act(x * a), the product in fp32 (cpu: scale_f32). */
    void (*scale_act)(nn_ctx *c, nn_buf *x, size_t n, float a);
    /* dst act[n] <- fp32 src[n] (weights to act copies). */
    void (*f32_to_act)(nn_ctx *c, nn_buf *dst, const float *src, size_t n);
    /* Gradient accumulation over the batches of one optimizer step (dflash_train.h): the fp32
     * accumulator acc[na + n] = (first ? 0 : acc) + a * [ga (act, na) | g (fp32, n)], each
     * element in fp32 (first: acc is not read). */
    void (*grad_accumulate)(nn_ctx *c, float *acc, const nn_buf *ga, size_t na, const float *g,
                            size_t n, float a, int first);
    /* The step's gradient from the accumulator: ga = act((acc + a * ga) * s) over the first na
     * elements, g = (acc + a * g) * s over the next n; a == 0: ga and g are not read. */
    void (*grad_average)(nn_ctx *c, nn_buf *ga, size_t na, float *g, size_t n, const float *acc,
                         float a, float s);
} nn_ops;

/* 0 when ops' attention takes heads query heads over kv_heads kv heads of head_dim; else
 * DFLASH_EUNSUPPORTED with "the cuda backend's attention takes head_dim up to 256 (this model:
 * 512)"-like words in err (ops_limits.c). */
int nn_ops_check_heads(const nn_ops *ops, int heads, int kv_heads, int head_dim, char *err,
                       size_t errlen);

/* The cpu backend. nn_cpu_new(threads) returns a context (threads <= 0: all cores). */
const nn_ops *nn_cpu_ops(void);
nn_ctx *nn_cpu_new(int threads);
void nn_cpu_destroy(nn_ctx **c);

/* Host helper (rope.c): inv_freq[d/2] for theta, with Llama-3 scaling when scaling->enabled. */
struct rope_llama3_scaling;
void rope_inv_freq(float *inv_freq, int d, double theta, const struct rope_llama3_scaling *scaling);

#endif
