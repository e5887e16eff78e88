/* ops_cuda_ctx: what the .cu files of the cuda backend whose ops take a context share
 * (ops_cuda.cu): the context struct nn_ctx and the cuBLASLt cache entries it embeds, the sizes
 * of its scratch, the bf16 typedef and MAIN_STREAM_ONLY. The attention and optimizer files take
 * a stream, not a context (ops_cuda.h). CUDA only: include from .cu files.
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

#endif
