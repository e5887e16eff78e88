/* probe_check.h: what the one-off probes in this folder share (overlap_probe.cu,
 * lt_shape_probe.cu, sm_power_probe.cu, wg_gemm_probe.cu; header-only, CUDA C++):
 * CK(cuda call) and LK(cuBLASLt call) print the line and the error and exit(1); probe_fill
 * draws a buffer's bf16 values from a hash of their index; probe_linear describes linear_fwd's
 * product for cuBLASLt and asks its heuristic for candidates. */
#ifndef DFLASH_BENCH_PROBE_CHECK_H
#define DFLASH_BENCH_PROBE_CHECK_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x) probe_check_cuda((x), __LINE__)
#define LK(x) probe_check_lt((x), __LINE__)
static void probe_check_cuda(cudaError_t e, int line) {
    if (e == cudaSuccess) return;
    printf("line %d: %s\n", line, cudaGetErrorString(e));
    exit(1);
}
static void probe_check_lt(cublasStatus_t s, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    printf("line %d: cuBLASLt status %d\n", line, (int)s);
    exit(1);
}

/* x[i] = (hash(i, seed) in [-0.5, 0.5)) * scale, bf16 */
__global__ void probe_fill(__nv_bfloat16 *x, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        x[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * scale);
    }
}

/* cuBLASLt's description of Y[M, N] = X[M, K] W[N, K]^T (row-major bf16, fp32 compute; the
 * project's linear_fwd), run as the column-major Y^T = op_T(W) X^T with A = W, B = X, as
 * ops_cuda runs it */
struct probe_linear {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
};

static probe_linear probe_linear_make(int M, int N, int K) {
    probe_linear r;
    LK(cublasLtMatmulDescCreate(&r.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(r.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LK(cublasLtMatmulDescSetAttribute(r.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    LK(cublasLtMatrixLayoutCreate(&r.a, CUDA_R_16BF, K, N, K));
    LK(cublasLtMatrixLayoutCreate(&r.b, CUDA_R_16BF, K, M, K));
    LK(cublasLtMatrixLayoutCreate(&r.c, CUDA_R_16BF, N, M, N));
    return r;
}

/* Up to max candidates of the heuristic for r within ws_bytes of workspace (at least one, or
 * exit(1)); returns how many */
static int probe_linear_candidates(cublasLtHandle_t lt, const probe_linear &r, size_t ws_bytes,
                                   cublasLtMatmulHeuristicResult_t *res, int max) {
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    int found = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(lt, r.op, r.a, r.b, r.c, r.c, pref, max, res, &found));
    LK(cublasLtMatmulPreferenceDestroy(pref));
    if (found < 1) {
        printf("no cuBLASLt algorithm for this product\n");
        exit(1);
    }
    return found;
}

#endif
