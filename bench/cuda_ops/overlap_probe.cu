/* overlap_probe: can the AdamW step overlap the next forward's matmuls on one GPU?
 *
 * A one-off measurement behind bench/cuda_ops/NOTES.md, "AdamW beside the matmuls". The
 * optimizer (memory-bound, ~7.5 ms of the 3072/512 drafter step) could run on a side stream on
 * a few SMs while the next step's forward runs its matmuls on the rest with cuBLASLt's
 * CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET. This program times, on a board heated by 300 matmuls:
 * an 8192 x 4096 x 24576 bf16 matmul (the MLP's gate|up product) with SM targets 0 (the device
 * default: all 132 on the H200), 128, 124, 120, 116, 108; an AdamW-like kernel (fp32 p, g, m, v in,
 * p, m, v and a bf16 copy out: 30 bytes per parameter, 268M parameters) on all SMs and on 8-24 CTAs
 * of 1024 threads; 40 matmuls then AdamW in one stream; and 40 matmuls at each SM target beside
 * AdamW on 8-24 CTAs in a second (lower-priority) stream. Not built by CMake: nvcc -O3 -arch=sm_90
 * -std=c++17 bench/cuda_ops/overlap_probe.cu -o overlap_probe -lcublasLt
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"

#include <cstdio>
#include <cstdlib>
#include <vector>


__global__ void adamw_like(float *p, __nv_bfloat16 *pb, const float *g, float *m, float *v,
                           size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 P = ((float4 *)p)[i], G = ((const float4 *)g)[i];
        float4 M = ((float4 *)m)[i], V = ((float4 *)v)[i];
        float *pp = &P.x, *gg = &G.x, *mm = &M.x, *vv = &V.x;
        __nv_bfloat16 o[4];
        for (int e = 0; e < 4; e++) {
            mm[e] = 0.9f * mm[e] + 0.1f * gg[e];
            vv[e] = 0.999f * vv[e] + 0.001f * gg[e] * gg[e];
            pp[e] -= 1e-4f * mm[e] / (sqrtf(vv[e]) + 1e-8f);
            o[e] = __float2bfloat16(pp[e]);
        }
        ((float4 *)p)[i] = P, ((float4 *)m)[i] = M, ((float4 *)v)[i] = V;
        ((uint2 *)pb)[i] = *(uint2 *)o;
    }
}

struct matmul {
    probe_linear lin;
    cublasLtMatmulAlgo_t algo;
};
static cublasLtHandle_t lt;
static void *ws;
static size_t ws_bytes = 64 << 20;

/* Y[M, N] = X[M, K] W[N, K]^T (row-major, as the project's linear_fwd), the heuristic's first
 * algorithm for SM target sms (0: the device's count). */
static matmul make_matmul(int M, int N, int K, int sms) {
    matmul r;
    r.lin = probe_linear_make(M, N, K);
    if (sms)
        LK(cublasLtMatmulDescSetAttribute(r.lin.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms,
                                          sizeof sms));
    cublasLtMatmulHeuristicResult_t h;
    probe_linear_candidates(lt, r.lin, ws_bytes, &h, 1);
    r.algo = h.algo;
    return r;
}

static void run_matmul(const matmul &r, const void *W, const void *X, void *Y, cudaStream_t s) {
    float one = 1, zero = 0;
    LK(cublasLtMatmul(lt, r.lin.op, &one, W, r.lin.a, X, r.lin.b, &zero, Y, r.lin.c, Y, r.lin.c,
                      &r.algo, ws, ws_bytes, s));
}

static float elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

int main() {
    const int M = 8192, K = 4096, N = 24576, R = 40;
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, ws_bytes));
    __nv_bfloat16 *W, *X, *Y;
    CK(cudaMalloc(&W, (size_t)N * K * 2));
    CK(cudaMalloc(&X, (size_t)M * K * 2));
    CK(cudaMalloc(&Y, (size_t)M * N * 2));
    probe_fill<<<1024, 256>>>(W, (size_t)N * K, 1, 1.0f);
    probe_fill<<<1024, 256>>>(X, (size_t)M * K, 2, 1.0f);
    CK(cudaGetLastError());
    int sms = 0; /* the device's multiprocessors: the matmuls' default target, AdamW's grid */
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    size_t n = 256u << 20, n4 = n / 4;
    float *p, *g, *m, *v;
    __nv_bfloat16 *pb;
    for (float **a : {&p, &g, &m, &v}) {
        CK(cudaMalloc(a, n * 4));
        CK(cudaMemset(*a, 0, n * 4));
    }
    CK(cudaMalloc(&pb, n * 2));
    cudaStream_t s0, s1;
    int low, high;
    CK(cudaDeviceGetStreamPriorityRange(&low, &high));
    CK(cudaStreamCreateWithPriority(&s0, cudaStreamNonBlocking, high));
    CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, low));
    cudaEvent_t e0, e1, e2, e3;
    for (cudaEvent_t *e : {&e0, &e1, &e2, &e3})
        CK(cudaEventCreate(e));
    const int targets[] = {0, 128, 124, 120, 116, 108};
    std::vector<matmul> mms;
    for (int t : targets)
        mms.push_back(make_matmul(M, N, K, t));
    const double flop = 2.0 * M * N * K, bytes = 30.0 * n;
    auto heat = [&]() {
        for (int i = 0; i < 300; i++)
            run_matmul(mms[0], W, X, Y, s0);
        CK(cudaStreamSynchronize(s0));
    };
    heat();
    for (int rep = 0; rep < 2; rep++)
        for (size_t ti = 0; ti < mms.size(); ti++) {
            CK(cudaEventRecord(e0, s0));
            for (int i = 0; i < R; i++)
                run_matmul(mms[ti], W, X, Y, s0);
            CK(cudaEventRecord(e1, s0));
            float ms = elapsed(e0, e1) / R;
            printf("matmul %dx%dx%d sm_target %3d: %.3f ms each, %.1f TFLOP/s\n", M, K, N,
                   targets[ti], ms, flop / (ms * 1e-3) / 1e12);
        }
    for (int ctas : {0, 8, 12, 16, 24}) {
        int blocks = ctas ? ctas : sms * 4, threads = ctas ? 1024 : 512;
        CK(cudaEventRecord(e0, s1));
        adamw_like<<<blocks, threads, 0, s1>>>(p, pb, g, m, v, n4);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1, s1));
        float ms = elapsed(e0, e1);
        printf("adamw alone, %d CTAs x %d: %.3f ms, %.2f TB/s\n", blocks, threads, ms,
               bytes / (ms * 1e-3) / 1e12);
    }
    heat();
    for (int rep = 0; rep < 3; rep++) {
        CK(cudaEventRecord(e0, s0));
        for (int i = 0; i < R; i++)
            run_matmul(mms[0], W, X, Y, s0);
        adamw_like<<<sms * 4, 512, 0, s0>>>(p, pb, g, m, v, n4);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1, s0));
        printf("serial: %d matmuls (all SMs) + adamw: %.3f ms\n", R, elapsed(e0, e1));
    }
    for (size_t ti = 1; ti < mms.size(); ti++)
        for (int ctas : {8, 12, 16, 24}) {
            if (targets[ti] + ctas > sms + 8) continue;
            heat();
            CK(cudaEventRecord(e0, s0));
            CK(cudaStreamWaitEvent(s1, e0, 0));
            adamw_like<<<ctas, 1024, 0, s1>>>(p, pb, g, m, v, n4);
            CK(cudaGetLastError());
            CK(cudaEventRecord(e2, s1));
            for (int i = 0; i < R; i++)
                run_matmul(mms[ti], W, X, Y, s0);
            CK(cudaEventRecord(e1, s0));
            CK(cudaStreamWaitEvent(s0, e2, 0));
            CK(cudaEventRecord(e3, s0));
            float total = elapsed(e0, e3), mm_done = elapsed(e0, e1), ad_done = elapsed(e0, e2);
            printf("overlap: matmuls sm_target %3d + adamw %2d CTAs: total %.3f ms (matmuls "
                   "done %.3f, adamw done %.3f)\n",
                   targets[ti], ctas, total, mm_done, ad_done);
        }
    return 0; /* the process's exit releases the device memory and handles */
}
