/* ops_cuda_linear: the cuda backend's linear ops (ops.h linear_fwd, linear_fwd_res, linear_bwd,
 * matmul_tune) and the cuBLASLt products under them (cu_lt_matmul, which lm_head's products use
 * too).
 *
 * The context (ops_cuda_ctx.cuh) holds a small cache of cuBLASLt descriptors + chosen algorithm
 * per matmul shape (filled on first use of a shape; host work only, unless matmul_tune or
 * DFLASH_LT_TUNE has it time the heuristic's candidates then: such entries stay, untimed ones are
 * replaced round robin).
 *
 * Matmuls (row-major, ops.h layout) are run as column-major cuBLASLt products of the transposes:
 *   linear_fwd  y[M,N]  = x[M,K] w[N,K]^T   ->  y^T (N x M) = op_T(w: K x N) * x^T (K x M)
 *   linear_bwd  dx[M,K] = dy[M,N] w[N,K]    -> dx^T (K x M) = w^T (K x N) * dy^T (N x M)
 *               dw[N,K] += dy^T x           -> dw^T (K x N) = x^T (K x M) * op_T(dy^T: N x M)
 * dw is bf16 output with beta = 1 (accumulate: the stored bf16 is read, added in fp32, rounded
 * again; 0 with NN_BWD_DW_SET); dx is bf16 with beta 0 (1 with NN_BWD_DX_ADD).
 *
 * Streams: the products use the context's cuBLASLt workspace, so they run on the main stream only
 * (MAIN_STREAM_ONLY); the bias and column-sum kernels are queued on c->stream. Called through the
 * vtable (ops_cuda.cu) by the host thread that owns the context.
 */
#include "ops_cuda_ctx.cuh"
#include "config.h"

#include "cuda_elem.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void lt_check_at(cublasStatus_t s, const char *what, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "%s:%d: cuBLASLt error %d in %s\n", file, line, (int)s, what);
    abort();
}
#define LT_CHECK(x) lt_check_at((x), #x, __FILE__, __LINE__)

/* ------------------------------------------------------------------------------------------ */
/* cuBLASLt matmul: D = alpha * op(A) op(B) + beta * C, column-major, C == D. */

static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0)
        al >>= 1;
    return al;
}

#define LT_TUNE_MAX 16

static int lt_tune_clamp(int n) {
    return n < 1 ? 1 : n > LT_TUNE_MAX ? LT_TUNE_MAX : n;
}

/* The context's initial tuning: DFLASH_LT_TUNE=N (2..16) times the heuristic's first N
 * candidates on every new shape's first use (unset or 0: the heuristic's first, no timing) */
int cu_lt_tune_env(void) {
    return lt_tune_clamp((int)config_env_int("DFLASH_LT_TUNE", 0, LT_TUNE_MAX, 0));
}

int cu_matmul_tune(nn_ctx *c, int candidates) {
    int was = c->tune > 1 ? c->tune : 0;
    c->tune = lt_tune_clamp(candidates);
    return was;
}

/* Mean time of `runs` products with algo a into scratch after one untimed (INFINITY if the
 * algorithm fails). */
static float lt_time(nn_ctx *c, const lt_entry *e, const cublasLtMatmulAlgo_t *a, const void *A,
                     const void *B, void *scratch, float beta, int runs, cudaEvent_t ev[2]) {
    float alpha = 1.0f;
    for (int r = 0; r <= runs; r++) {
        if (r == 1) CUDA_CHECK(cudaEventRecord(ev[0], c->stream));
        if (cublasLtMatmul(c->lt, e->op, &alpha, A, e->A, B, e->B, &beta, scratch, e->C, scratch,
                           e->C, a, c->ws, LT_WORKSPACE, c->stream) != CUBLAS_STATUS_SUCCESS)
            return INFINITY;
    }
    CUDA_CHECK(cudaEventRecord(ev[1], c->stream));
    CUDA_CHECK(cudaEventSynchronize(ev[1]));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    return ms / runs;
}

/* "algo A tile T stages S swizzle W cluster C custom O" of a chosen algorithm, for the log. */
static void lt_algo_name(const cublasLtMatmulAlgo_t *a, char *buf, size_t len) {
    int32_t id = 0;
    uint32_t tile = 0, stages = 0, sw = 0, custom = 0;
    uint16_t cluster = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages,
                                         &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw, sizeof sw,
                                         &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                         sizeof cluster, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom,
                                         sizeof custom, &got);
    snprintf(buf, len, "algo %d tile %u stages %u swizzle %u cluster %u custom %u", id, tile,
             stages, sw, (unsigned)cluster, custom);
}

/* The fastest of n candidates for entry e, timed on the call's own A and B into a scratch copy
 * of D (so a beta = 1 product reads the same C): one warm-up and 3 timed runs each. Waits for
 * the stream (counted as a drain): meant for start-up, where every shape is warmed.
 * Timing other ways picked worse products for the drafter step under the board's power limit
 * (bench/cuda_ops/NOTES.md, "cuBLASLt picks and the power limit"). */
static int lt_tune(nn_ctx *c, const lt_entry *e, const cublasLtMatmulHeuristicResult_t *res,
                   int n, const void *A, const void *B, const void *D, float beta) {
    size_t bytes = (size_t)e->key.ldc * e->key.n * (e->key.ctype ? 4 : 2);
    void *scratch = NULL;
    cudaEvent_t ev[2];
    if (cuda_malloc(&scratch, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    CUDA_CHECK(cudaMemcpyAsync(scratch, D, bytes, cudaMemcpyDeviceToDevice, c->stream));
    CUDA_CHECK(cudaEventCreate(&ev[0]));
    CUDA_CHECK(cudaEventCreate(&ev[1]));
    float ms[LT_TUNE_MAX];
    int pick = 0;
    for (int i = 0; i < n; i++) {
        ms[i] = lt_time(c, e, &res[i].algo, A, B, scratch, beta, 3, ev);
        if (ms[i] < ms[pick]) pick = i;
    }
    c->drains++;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaEventDestroy(ev[0]));
    CUDA_CHECK(cudaEventDestroy(ev[1]));
    CUDA_CHECK(cudaFree(scratch));
    char name[112];
    lt_algo_name(&res[pick].algo, name, sizeof name);
    fprintf(stderr,
            "ops_cuda: matmul m %d n %d k %d%s: candidate %d of %d, %.3f ms (heuristic's first "
            "%.3f ms); %s\n",
            e->key.m, e->key.n, e->key.k, e->key.beta_nz ? " beta 1" : "", pick, n, ms[pick],
            ms[0], name);
    return pick;
}

static lt_entry *lt_get(nn_ctx *c, const lt_key *key, const void *A, const void *B,
                        const void *D, float beta) {
    for (int i = 0; i < LT_CACHE; i++)
        if (c->cache[i].used && memcmp(&c->cache[i].key, key, sizeof *key) == 0)
            return &c->cache[i];
    /* the next slot round robin, passing over tuned entries unless every slot holds one */
    lt_entry *e = &c->cache[c->cache_next];
    for (int tries = 0; tries < LT_CACHE && e->used && e->tuned; tries++) {
        c->cache_next = (c->cache_next + 1) % LT_CACHE;
        e = &c->cache[c->cache_next];
    }
    c->cache_next = (c->cache_next + 1) % LT_CACHE;
    if (e->used) {
        cublasLtMatmulDescDestroy(e->op);
        cublasLtMatrixLayoutDestroy(e->A);
        cublasLtMatrixLayoutDestroy(e->B);
        cublasLtMatrixLayoutDestroy(e->C);
        e->used = 0;
    }
    e->key = *key;
    LT_CHECK(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    /* stored shapes: A is m x k (k x m when transposed), B is k x n (n x k), C is m x n */
    LT_CHECK(cublasLtMatrixLayoutCreate(&e->A, CUDA_R_16BF, key->ta ? key->k : key->m,
                                        key->ta ? key->m : key->k, key->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&e->B, CUDA_R_16BF, key->tb ? key->n : key->k,
                                        key->tb ? key->k : key->n, key->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&e->C, key->ctype ? CUDA_R_32F : CUDA_R_16BF, key->m,
                                        key->n, key->ldc));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = LT_WORKSPACE;
    uint32_t al = (uint32_t)key->align;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &al, sizeof al));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &al, sizeof al));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &al, sizeof al));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res[LT_TUNE_MAX];
    int found = 0, want = lt_tune_clamp(c->tune);
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, e->op, e->A, e->B, e->C, e->C, pref, want, res,
                                            &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found < 1) {
        fprintf(stderr, "ops_cuda: no cuBLASLt algorithm for m %d n %d k %d (ld %d %d %d)\n",
                key->m, key->n, key->k, key->lda, key->ldb, key->ldc);
        abort();
    }
    e->algo = res[found > 1 ? lt_tune(c, e, res, found, A, B, D, beta) : 0].algo;
    e->tuned = found > 1;
    e->used = 1;
    return e;
}

/* Column-major D[m,n] = op(A) op(B) (+ C when beta = 1; C is D when NULL); A, B bf16; C/D bf16
 * or fp32, the same layout. */
void cu_lt_matmul(nn_ctx *c, int ta, int tb, int m, int n, int k, const void *A, int lda,
                  const void *B, int ldb, void *D, int ldc, int d_f32, float beta, const void *C) {
    MAIN_STREAM_ONLY(c); /* c->ws */
    if (m <= 0 || n <= 0) return;
    assert(k > 0);
    lt_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.ta = ta, key.tb = tb, key.ctype = d_f32, key.beta_nz = beta != 0.0f;
    int al = ptr_align(A);
    if (ptr_align(B) < al) al = ptr_align(B);
    if (ptr_align(D) < al) al = ptr_align(D);
    if (C && ptr_align(C) < al) al = ptr_align(C);
    key.align = al;
    lt_entry *e = lt_get(c, &key, A, B, D, beta);
    float alpha = 1.0f;
    LT_CHECK(cublasLtMatmul(c->lt, e->op, &alpha, A, e->A, B, e->B, &beta, C ? C : D, e->C, D,
                            e->C, &e->algo, c->ws, LT_WORKSPACE, c->stream));
}

__global__ void k_add_bias(bf16 *y, const bf16 *b, int M, int N) {
    size_t n = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(b[i % N]));
}

void cu_linear_fwd(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w, const nn_buf *b, int M,
                   int K, int N) {
    assert(M >= 0 && K >= 0 && N >= 0);
    if (M == 0 || N == 0) return;
    if (K == 0) {
        CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)M * N * sizeof(bf16), c->stream));
    } else {
        cu_lt_matmul(c, 1, 0, N, M, K, w, K, x, K, y, N, 0, 0.0f);
    }
    if (b) {
        size_t n = (size_t)M * N;
        k_add_bias<<<grid_for(n, 256), 256, 0, c->stream>>>((bf16 *)y, (const bf16 *)b, M, N);
        CUDA_CHECK_LAUNCH();
    }
}

void cu_linear_fwd_res(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w, const nn_buf *res,
                       int M, int K, int N) {
    assert(M >= 0 && K >= 0 && N >= 0);
    if (M == 0 || N == 0) return;
    if (K == 0) {
        if (res != y)
            CUDA_CHECK(cudaMemcpyAsync(y, res, (size_t)M * N * sizeof(bf16),
                                       cudaMemcpyDeviceToDevice, c->stream));
        return;
    }
    cu_lt_matmul(c, 1, 0, N, M, K, w, K, x, K, y, N, 0, 1.0f, res);
}

/* db[n] += sum_m dy[m, n]: thread per column, blockIdx.y per chunk of rows. */
__global__ void k_colsum(float *db, const bf16 *dy, int M, int N) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= N) return;
    int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(M, r0 + COLSUM_ROWS);
    float s = 0.0f;
    for (int r = r0; r < r1; r++)
        s += __bfloat162float(dy[(size_t)r * N + col]);
    atomicAdd(db + col, s);
}

void cu_linear_bwd(nn_ctx *c, nn_buf *dx, nn_buf *dw, float *db, const nn_buf *dy, const nn_buf *x,
                   const nn_buf *w, int M, int K, int N, int mode) {
    assert(M >= 0 && K >= 0 && N >= 0);
    float beta = mode & NN_BWD_DX_ADD ? 1.0f : 0.0f, dw_beta = mode & NN_BWD_DW_SET ? 0.0f : 1.0f;
    if (K == 0) return;
    if (M == 0) {
        if (dw && N > 0 && dw_beta == 0.0f)
            CUDA_CHECK(cudaMemsetAsync(dw, 0, (size_t)N * K * sizeof(bf16), c->stream));
        return;
    }
    if (N == 0) {
        if (dx && beta == 0.0f)
            CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)M * K * sizeof(bf16), c->stream));
        return;
    }
    if (dx) cu_lt_matmul(c, 0, 0, K, M, N, w, K, dy, N, dx, K, 0, beta);
    if (dw) cu_lt_matmul(c, 0, 1, K, N, M, x, K, dy, N, dw, K, 0, dw_beta);
    if (db) {
        dim3 g((N + 127) / 128, (M + COLSUM_ROWS - 1) / COLSUM_ROWS);
        assert(g.y <= 65535);
        k_colsum<<<g, 128, 0, c->stream>>>(db, (const bf16 *)dy, M, N);
        CUDA_CHECK_LAUNCH();
    }
}
