/* ops_cuda_ctx: what the .cu files of the cuda backend whose ops take a context share
 * (ops_cuda.cu, ops_cuda_linear.cu, ops_cuda_norm.cu, ops_cuda_xent.cu): the context struct
 * nn_ctx and the cuBLASLt cache entries it embeds, the sizes of its scratch, the bf16 typedef,
 * MAIN_STREAM_ONLY, vec_ok, and the functions each file gives the others (the ops for the vtable,
 * make_ops in ops_cuda.cu). The attention and optimizer files take a stream, not a context
 * (ops_cuda.h). CUDA only: include from .cu files.
 *
 * nn_ctx is made by nn_cuda_new (ops_cuda.cu, whose top comment lists what it holds). One host
 * thread uses a context at a time; every op queues its work on c->stream (ops_cuda.cu,
 * "Streams").
 */
#ifndef DFLASH_NN_OPS_CUDA_CTX_CUH
#define DFLASH_NN_OPS_CUDA_CTX_CUH

#include "ops_cuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#define LT_WORKSPACE (32u << 20)
#define STAGE_FLOATS (8u << 20) /* 32 MiB of fp32 */
#define LT_CACHE 96

typedef struct lt_key {
    int m, n, k, lda, ldb, ldc;
    int ta, tb;
    int ctype;   /* 0: bf16 C/D, 1: fp32 C/D */
    int beta_nz; /* beta != 0 (C read) */
    int align;   /* smallest alignment (bytes, power of two <= 256) of the four pointers */
} lt_key;

typedef struct lt_entry {
    lt_key key;
    int used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t A, B, C;
    cublasLtMatmulAlgo_t algo;
    int tuned; /* algo is the fastest of several timed candidates: kept in the cache */
} lt_entry;

struct nn_ctx {
    int device;
    cudaStream_t stream; /* the current stream: main, or side between side_begin and side_end */
    cudaStream_t main;   /* the main stream (high priority when there is a side stream) */
    cudaStream_t side;   /* low priority, for the optimizer (DFLASH_CUDA_SIDE_STREAM=1; or NULL) */
    cublasLtHandle_t lt;
    void *ws;     /* cuBLASLt workspace, LT_WORKSPACE bytes */
    float *stage; /* STAGE_FLOATS fp32 for upload/download conversion */
    lt_entry cache[LT_CACHE];
    int cache_next;
    int tune; /* candidates timed for a new matmul shape (matmul_tune; <= 1: none) */
    cudaEvent_t fence[NN_FENCES]; /* fence_record / fence_wait (timing disabled) */
    bool fence_used[NN_FENCES];
    cudaEvent_t order_ev;         /* order_after */
    cudaEvent_t side_fork, side_last, side_marks[NN_SIDE_MARKS], fence_side[NN_FENCES];
    bool side_used, last_used, mark_used[NN_SIDE_MARKS];
    long drains;                  /* host waits for the whole stream (stream_drains) */
    int sms;                      /* the device's multiprocessors (persistent grids) */
};

/* Ops that use the context's scratch (the cuBLASLt workspace, the staging buffer, the
 * attention buffers) run on the main stream only (ops.h side_begin): side work reusing it would
 * race the main stream's. */
#define MAIN_STREAM_ONLY(c) assert((c)->stream == (c)->main)

/* The chunk of rows that a block of the column-sum kernels adds up (blockIdx.y per chunk):
 * k_rmsnorm_bwd_dw (ops_cuda_norm.cu) and k_colsum (ops_cuda_linear.cu). */
#define COLSUM_ROWS 128

/* ops_cuda.cu: whether 8-wide (16-byte) access is allowed at all: DFLASH_CUDA_VEC, read once
 * (0: off; unset: on). */
bool cu_vec_enabled(void);

/* True when 8-wide access is allowed for all of these pointers. */
static inline bool vec_ok(const void *a, const void *b, const void *c) {
    return cu_vec_enabled() && ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

/* ops_cuda_linear.cu: the vtable's matmul_tune, linear_fwd, linear_fwd_res and linear_bwd (ops.h),
 * queued on c->stream; their products run on the main stream only. */
int cu_matmul_tune(nn_ctx *c, int candidates);
void cu_linear_fwd(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w, const nn_buf *b, int M,
                   int K, int N);
void cu_linear_fwd_res(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w, const nn_buf *res,
                       int M, int K, int N);
void cu_linear_bwd(nn_ctx *c, nn_buf *dx, nn_buf *dw, float *db, const nn_buf *dy, const nn_buf *x,
                   const nn_buf *w, int M, int K, int N, int mode);
/* Column-major D[m,n] = op(A) op(B) (+ C when beta = 1; C is D when NULL) by cuBLASLt, with the
 * context's cached descriptors, queued on the main stream (asserted); lm_head's products too. */
void cu_lt_matmul(nn_ctx *c, int ta, int tb, int m, int n, int k, const void *A, int lda,
                  const void *B, int ldb, void *D, int ldc, int d_f32, float beta,
                  const void *C = NULL);
/* The candidates a new context times per new matmul shape (nn_cuda_new): DFLASH_LT_TUNE clamped
 * to 1..16 (unset: 1, no timing). */
int cu_lt_tune_env(void);

/* ops_cuda_norm.cu: the vtable's rmsnorm_fwd, rmsnorm_bwd, rope_table, head_norm_rope_fwd,
 * head_norm_rope_bwd and qkv_norm_rope_fwd (ops.h), queued on c->stream. */
void cu_rmsnorm_fwd(nn_ctx *c, nn_buf *out, float *rstd, const nn_buf *x, const nn_buf *w, int R,
                    int C, float eps);
void cu_rmsnorm_bwd(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
                    const nn_buf *w, const float *rstd, int R, int C, const nn_buf *dres);
void cu_rope_table(nn_ctx *c, float *rot, const int32_t *pos, const float *inv_freq, int T, int d);
void cu_head_norm_rope_fwd(nn_ctx *c, nn_buf *out, const nn_buf *x, const nn_buf *w,
                           const float *rot, int T, int nh, int d, float eps);
void cu_head_norm_rope_bwd(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
                           const nn_buf *w, const float *rot, int T, int nh, int d, float eps);
void cu_qkv_norm_rope_fwd(nn_ctx *c, nn_buf *q, nn_buf *k, nn_buf *v, const nn_buf *qkv,
                          const nn_buf *qn, const nn_buf *kn, const float *rot, int T, int H,
                          int Hk, int d, float eps);
/* Raises the pipelined RMSNorm kernels' shared-memory limits on the current device (once per
 * context, nn_cuda_new); false when CUDA refuses. */
bool cu_norm_pipe_attrs(void);

/* ops_cuda_xent.cu: the vtable's lm_head_xent and lm_head_argmax (ops.h); their products run on
 * the main stream only. */
void cu_lm_head_xent(nn_ctx *c, nn_buf *dh, float *out_sums, int32_t *correct, const nn_buf *h,
                     const nn_buf *W, const int32_t *labels, const float *weights, float inv_norm,
                     nn_buf *scratch, int Q, int D, int V, int chunk);
void cu_lm_head_argmax(nn_ctx *c, int32_t *out, const nn_buf *h, const nn_buf *W, nn_buf *scratch,
                       int Q, int D, int V, int chunk);

#endif
