/* ops_cuda: the cuda backend of the ops interface (ops.h), callable from C.
 *
 * Storage: an nn_buf element is a bf16 (__nv_bfloat16, act_bytes 2); every `float *` of ops.h
 * is fp32 device memory; index arrays and block spans are device memory. Accumulation is fp32
 * everywhere (cuBLASLt compute 32F, fp32 registers in our kernels).
 *
 * One context = one device, a non-blocking main stream (with DFLASH_CUDA_SIDE_STREAM=1 also a
 * low-priority side stream for the optimizer, ops.h side_begin), one cuBLASLt handle and the
 * scratch that is planned once in nn_cuda_new (the 32 MiB cuBLASLt workspace, a conversion staging
 * buffer for upload/download). Every op is queued on the context's current stream and returns
 * without waiting, except download / download_raw / sync, which wait for both streams (the caller
 * reads the host result next). alloc/free are setup-time calls (cudaMalloc / cudaFree).
 *
 * Files: ops_cuda.cu (context, memory, copies, SwiGLU, the vtable), ops_cuda_linear.cu (linear
 * via cuBLASLt), ops_cuda_norm.cu (RMSNorm, RoPE, head norm + RoPE), ops_cuda_xent.cu (lm_head
 * with the loss or argmax), ops_cuda_ctx.cuh (the context struct these four share),
 * ops_cuda_optim.cu (sumsq, AdamW, scale), ops_cuda_attn.cu (the attention launchers and their
 * CUDA-core kernels for any head dim <= 256). The launchers try, in order: the Hopper wgmma
 * kernels (ops_cuda_attn_wgmma.cu: causal and block forward; ops_cuda_attn_wgbwd.cu: block
 * backward, reached through ops_cuda_attn_bwd.cu), the mma.sync ones (ops_cuda_attn_mma.cu,
 * ops_cuda_attn_bwd.cu; the block backward's entry and scratch: ops_cuda_attn_split.cu), then
 * the CUDA-core ones; each declines shapes or pointers it does not take. DFLASH_CUDA_ATTN
 * (docs/operating.md) pins one.
 * Threads: one host thread uses a context at a time.
 */
#ifndef DFLASH_NN_OPS_CUDA_H
#define DFLASH_NN_OPS_CUDA_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cuda backend's table. */
const nn_ops *nn_cuda_ops(void);
/* The CUDA devices this process sees, without making a context: 0 when there is none (no
 * driver installed, or the driver sees no device), -1 after logging why when a driver is there
 * but cannot be used (older than the runtime, or another error). A GPU test skips (ctest's 77)
 * only on 0: a device that is there but fails is a failure. Any thread; it initializes CUDA in
 * the process (one that forks CUDA users asks from a child, as tests/gpu/test_dp_nccl.c). */
int nn_cuda_device_count(void);
/* A context on CUDA device `device` (cudaSetDevice is called on the caller's thread). Returns
 * NULL after logging why (no device, out of memory). */
nn_ctx *nn_cuda_new(int device);
/* Waits for the streams, frees the context's scratch and handles; accepts NULL, nulls *c. */
void nn_cuda_destroy(nn_ctx **c);
/* The context's main cudaStream_t, as void * so that C callers need no CUDA headers. */
void *nn_cuda_stream(nn_ctx *c);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
/* The attention launchers' head shapes (nn_ops.max_head_dim / max_q_per_kv): the CUDA-core
 * kernels every shape falls back to hold head_dim <= 256 and one group of query heads in a
 * tile of 64 rows. */
#define CUDA_ATTN_MAX_HEAD_DIM 256
#define CUDA_ATTN_MAX_Q_PER_KV 64

/* Internal: the attention launchers of ops_cuda_attn.cu, used by the vtable in ops_cuda.cu. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
/* cudaMalloc, counted by the allocs op (ops.h): every device allocation of the backend goes
 * through it. */
cudaError_t cuda_malloc(void **p, size_t bytes);
void cuda_attention_causal_fwd(cudaStream_t st, __nv_bfloat16 *out, const __nv_bfloat16 *q,
                               const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                               const int32_t *seq_off, int n_seqs, int T, int H, int Hk, int d);
void cuda_attention_block_fwd(cudaStream_t st, __nv_bfloat16 *out, float *lse,
                              const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                              const __nv_bfloat16 *v, const nn_block_span *spans, int n_blocks,
                              int B, int Tk, int H, int Hk, int d);
void cuda_attention_block_bwd(cudaStream_t st, __nv_bfloat16 *dq, __nv_bfloat16 *dk,
                              __nv_bfloat16 *dv, const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                              const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                              const __nv_bfloat16 *out, const float *lse,
                              const nn_block_span *spans, int n_blocks, int B, int Tk, int H,
                              int Hk, int d);
/* The tensor-core block backward (ops_cuda_attn_split.cu: the fused kernel, else the mma.sync
 * pair) for d 64 / 128 and 16-byte aligned buffers: 0 when it queued the work, -1 when the shape
 * is not its own (the caller falls back to the CUDA-core kernels). */
int cuda_tensor_attention_block_bwd(cudaStream_t st, __nv_bfloat16 *dq, __nv_bfloat16 *dk,
                                    __nv_bfloat16 *dv, const __nv_bfloat16 *dout,
                                    const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                    const __nv_bfloat16 *v, const __nv_bfloat16 *out,
                                    const float *lse, const nn_block_span *spans, int n_blocks,
                                    int B, int Tk, int H, int Hk, int d);
/* Allocates the block backward's split scratch (dk/dv partials, tickets, saved D) on the
 * current device; without memory the backward runs unsplit. */
void cuda_attn_split_init(void);
/* Grows that scratch for these shapes; -1 when there is no memory (the old buffers stay). */
int cuda_attn_split_plan(int max_q, int max_tk, int H, int Hk, int d);
/* attention_block_plan of ops.h: the split buffers and the fused backward's dq scratch. */
void cuda_attention_block_plan(int max_q, int max_tk, int H, int Hk, int d);
/* Raises the dynamic shared-memory limits of the attention kernels; once per device. */
int cuda_attention_init(void);
/* Internal: the optimizer kernels of ops_cuda_optim.cu, on stream st. cuda_sumsq: out[0] = the
 * sum of squares of ga[na] (bf16) and g[n] (fp32), in a fixed order; part is device scratch of
 * part_cap floats (>= 1024). cuda_adamw: one AdamW step (t >= 1) of master p, moments m, v and,
 * where p_act is not NULL, its bf16 copy, from the fp32 gradient g times grad_scale, or, with
 * sumsq not NULL, times the clipping factor NN_CLIP_SCALE(*sumsq, clip) read on the device.
 * cuda_adamw_split: the same from a bf16 gradient on a master split into p_hi and p_lo
 * (master_split.h), clipped by sumsq. cuda_scale: x *= a for exactly one of x (fp32) and
 * x_bf16. */
void cuda_sumsq(cudaStream_t st, float *out, float *part, size_t part_cap,
                const __nv_bfloat16 *ga, size_t na, const float *g, size_t n);
void cuda_adamw(cudaStream_t st, float *p, __nv_bfloat16 *p_act, const float *g, float *m,
                float *v, size_t n, float lr, float beta1, float beta2, float eps, float wd,
                float grad_scale, const float *sumsq, float clip, int t);
void cuda_adamw_split(cudaStream_t st, __nv_bfloat16 *p_hi, uint16_t *p_lo,
                      const __nv_bfloat16 *g, float *m, float *v, size_t n, float lr, float beta1,
                      float beta2, float eps, float wd, const float *sumsq, float clip, int t);
void cuda_scale(cudaStream_t st, float *x, __nv_bfloat16 *x_bf16, size_t n, float a);
/* ops.h grad_accumulate / grad_average with the act part in bf16. */
void cuda_grad_accumulate(cudaStream_t st, float *acc, const __nv_bfloat16 *ga, size_t na,
                          const float *g, size_t n, float a, int first);
void cuda_grad_average(cudaStream_t st, __nv_bfloat16 *ga, size_t na, float *g, size_t n,
                       const float *acc, float a, float s);
/* Aborts with file:line and the CUDA error string when e != cudaSuccess. */
void cuda_check_at(cudaError_t e, const char *what, const char *file, int line);
#define CUDA_CHECK(x) cuda_check_at((x), #x, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH() cuda_check_at(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
#endif

#endif
