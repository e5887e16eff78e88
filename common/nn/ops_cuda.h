/* ops_cuda: the cuda backend of the ops interface (ops.h), callable from C.
 *
 * Storage: an nn_buf element is a bf16 (__nv_bfloat16, act_bytes 2); every `float *` of ops.h
 * is fp32 device memory; index arrays and block spans are device memory. Accumulation is fp32
 * everywhere (cuBLASLt compute 32F, fp32 registers in our kernels).
 *
 * One context = one device, a non-blocking main stream (and a low-priority side stream for the
 * optimizer, ops.h side_begin), one cuBLASLt handle and the scratch that is planned once in
 * nn_cuda_new (the 32 MiB cuBLASLt workspace, a conversion staging buffer for upload/download).
 * Every op is queued on the context's current stream and returns without waiting, except
 * download / download_raw / sync, which wait for both streams (the caller reads the host
 * result next). alloc/free are setup-time calls (cudaMalloc / cudaFree).
 *
 * Files: ops_cuda.cu (context, memory, elementwise ops, norms, rope, linear via cuBLASLt, loss,
 * optimizer, the vtable), ops_cuda_attn.cu (the causal and DFlash block attention kernels on
 * CUDA cores, any head dim <= 256), ops_cuda_attn_tc.cu (tensor-core versions for head dims 64
 * and 128, used first; DFLASH_CUDA_ATTN=simple in the environment forces the CUDA-core ones).
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
/* Internal: the attention launchers of ops_cuda_attn.cu, used by the vtable in ops_cuda.cu. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
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
/* Tensor-core versions (ops_cuda_attn_tc.cu) for d 64 / 128 and 16-byte aligned buffers: return
 * 0 when they queued the work, -1 when the shape is not theirs (the caller falls back). */
int cuda_tc_attention_causal_fwd(cudaStream_t st, __nv_bfloat16 *out, const __nv_bfloat16 *q,
                                 const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                 const int32_t *seq_off, int n_seqs, int T, int H, int Hk, int d);
int cuda_tc_attention_block_fwd(cudaStream_t st, __nv_bfloat16 *out, float *lse,
                                const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                const __nv_bfloat16 *v, const nn_block_span *spans, int n_blocks,
                                int B, int Tk, int H, int Hk, int d);
int cuda_tc_attention_block_bwd(cudaStream_t st, __nv_bfloat16 *dq, __nv_bfloat16 *dk,
                                __nv_bfloat16 *dv, const __nv_bfloat16 *dout,
                                const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                const __nv_bfloat16 *v, const __nv_bfloat16 *out, const float *lse,
                                const nn_block_span *spans, int n_blocks, int B, int Tk, int H,
                                int Hk, int d);
int cuda_tc_attention_init(void);
/* Grows the block backward's split buffers (dk/dv partials, tickets, saved D) for these shapes;
 * -1 when there is no memory (the old buffers stay). */
int cuda_tc_attention_plan(int max_q, int max_tk, int H, int Hk, int d);
/* attention_block_plan of ops.h: the split buffers and the fused backward's dq scratch. */
void cuda_attention_block_plan(int max_q, int max_tk, int H, int Hk, int d);
/* Raises the dynamic shared-memory limits of the attention kernels; once per device. */
int cuda_attention_init(void);
/* Aborts with file:line and the CUDA error string when e != cudaSuccess. */
void cuda_check_at(cudaError_t e, const char *what, const char *file, int line);
#define CUDA_CHECK(x) cuda_check_at((x), #x, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH() cuda_check_at(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
#endif

#endif
