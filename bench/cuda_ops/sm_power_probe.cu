/* sm_power_probe: does a memory-bound kernel cost fewer joules on fewer SMs, and does that buy
 * time for the products around it under the board's power limit?
 *
 * A one-off measurement behind bench/cuda_ops/NOTES.md, "Memory-bound kernels on fewer SMs".
 * The drafter step runs at the H200's 700 W limit, so its time follows its energy; ~14 ms of it
 * are memory-bound kernels (AdamW alone ~6.6 ms) launched over every SM. If an SM that only
 * waits on loads still draws power, the same bytes streamed by fewer SMs cost fewer joules, and
 * the products after them get the watts back. This program streams an AdamW-like pass with the
 * step's bytes (bf16 weight and low half, fp32 moments, bf16 gradient in; weight, low half and
 * moments out: 26 bytes per parameter, 1024M parameters) in several grid shapes:
 *   part A, each shape alone for ~1.5 s after 0.3 s of heating: ms and J per pass, mean W;
 *   part B, each shape after 16 gate|up products (8192 x 4096 x 24576, as the MLP's) in a loop
 *   for ~4 s, and the products alone, interleaved in two rounds: ms and J per loop.
 * Energy from NVML's counter (../target/energy.h). Not built by CMake:
 *   nvcc -O3 -arch=sm_90 -std=c++17 -I. bench/cuda_ops/sm_power_probe.cu -o sm_power_probe \
 *     -lcublasLt -ldl
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"

#include "../target/energy.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

/* One pass over n parameters, 8 per thread and iteration: hi/lo are the split master
 * (common/nn/master_split.h's layout, combined here as plain fp32 bits), g the bf16 gradient. */
__global__ void adamw_split_like(uint16_t *hi, uint16_t *lo, float *m, float *v,
                                 const __nv_bfloat16 *g, size_t n8) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 H = ((const uint4 *)hi)[i], L = ((const uint4 *)lo)[i], G = ((const uint4 *)g)[i];
        float4 M0 = ((const float4 *)m)[2 * i], M1 = ((const float4 *)m)[2 * i + 1];
        float4 V0 = ((const float4 *)v)[2 * i], V1 = ((const float4 *)v)[2 * i + 1];
        const uint16_t *h = (const uint16_t *)&H, *l = (const uint16_t *)&L;
        const __nv_bfloat16 *gg = (const __nv_bfloat16 *)&G;
        float *mm[8] = {&M0.x, &M0.y, &M0.z, &M0.w, &M1.x, &M1.y, &M1.z, &M1.w};
        float *vv[8] = {&V0.x, &V0.y, &V0.z, &V0.w, &V1.x, &V1.y, &V1.z, &V1.w};
        uint16_t ho[8], lw[8];
        for (int e = 0; e < 8; e++) {
            float p = __uint_as_float(((uint32_t)h[e] << 16) | l[e]);
            float gr = __bfloat162float(gg[e]);
            *mm[e] = 0.9f * *mm[e] + 0.1f * gr;
            *vv[e] = 0.999f * *vv[e] + 0.001f * gr * gr;
            p -= 1e-4f * (*mm[e] / (sqrtf(*vv[e]) + 1e-8f) + 0.01f * p);
            uint32_t u = __float_as_uint(p);
            ho[e] = (uint16_t)(u >> 16), lw[e] = (uint16_t)u;
        }
        ((uint4 *)hi)[i] = *(uint4 *)ho, ((uint4 *)lo)[i] = *(uint4 *)lw;
        ((float4 *)m)[2 * i] = M0, ((float4 *)m)[2 * i + 1] = M1;
        ((float4 *)v)[2 * i] = V0, ((float4 *)v)[2 * i + 1] = V1;
    }
}

static cublasLtHandle_t lt;
static void *ws;
static size_t ws_bytes = 32 << 20;
static probe_linear lin;
static cublasLtMatmulAlgo_t algo;

struct shape {
    const char *name;
    int blocks, threads; /* blocks 0: one thread per 8 parameters (the step's launch) */
};

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int main() {
    const int M = 8192, K = 4096, N = 24576, GEMMS = 16;
    const size_t n = 1024ull << 20, n8 = n / 8;
    bench_energy en;
    if (bench_energy_open(&en, 0) != 0) return 1;
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, ws_bytes));
    __nv_bfloat16 *W, *X, *Y, *g;
    CK(cudaMalloc(&W, (size_t)N * K * 2));
    CK(cudaMalloc(&X, (size_t)M * K * 2));
    CK(cudaMalloc(&Y, (size_t)M * N * 2));
    probe_fill<<<1024, 256>>>(W, (size_t)N * K, 1, 0.25f);
    probe_fill<<<1024, 256>>>(X, (size_t)M * K, 2, 0.25f);
    lin = probe_linear_make(M, N, K);
    cublasLtMatmulHeuristicResult_t h;
    probe_linear_candidates(lt, lin, ws_bytes, &h, 1);
    algo = h.algo; /* the heuristic's first */
    uint16_t *hi, *lo;
    float *m, *v;
    CK(cudaMalloc(&hi, n * 2));
    CK(cudaMalloc(&lo, n * 2));
    CK(cudaMalloc(&g, n * 2));
    CK(cudaMalloc(&m, n * 4));
    CK(cudaMalloc(&v, n * 4));
    probe_fill<<<1024, 256>>>((__nv_bfloat16 *)hi, n, 3, 0.25f);
    probe_fill<<<1024, 256>>>((__nv_bfloat16 *)lo, n, 4, 0.25f);
    probe_fill<<<1024, 256>>>(g, n, 5, 0.25f);
    CK(cudaMemset(m, 0, n * 4));
    CK(cudaMemset(v, 0, n * 4));
    CK(cudaDeviceSynchronize());
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("device SMs %d, board limit %.0f W, %zu M parameters (%.1f GB per pass)\n", sms,
           en.limit_w, n >> 20, 26.0 * n / 1e9);
    const shape shapes[] = {{"1 thread per 8 (step)", 0, 256},
                            {"2 x SMs x 1024", 2 * sms, 1024},
                            {"SMs x 1024", sms, 1024},
                            {"100 x 1024", 100, 1024},
                            {"80 x 1024", 80, 1024},
                            {"66 x 1024", 66, 1024},
                            {"48 x 1024", 48, 1024}};
    auto pass = [&](const shape &s) {
        unsigned blocks = s.blocks ? (unsigned)s.blocks : (unsigned)((n8 + 255) / 256);
        adamw_split_like<<<blocks, s.threads>>>(hi, lo, m, v, g, n8);
        CK(cudaGetLastError());
    };
    float one = 1, zero = 0;
    auto gemm = [&]() {
        LK(cublasLtMatmul(lt, lin.op, &one, W, lin.a, X, lin.b, &zero, Y, lin.c, Y, lin.c, &algo,
                          ws, ws_bytes, 0));
    };
    /* runs body until `sec` seconds have passed (synchronising every `batch` calls); returns
     * calls, fills ms per call and J per call */
    auto sustain = [&](double sec, int batch, auto body, double *ms, double *j) {
        CK(cudaDeviceSynchronize());
        double t0 = now_s(), j0 = bench_energy_j(&en);
        long calls = 0;
        while (now_s() - t0 < sec) {
            for (int i = 0; i < batch; i++)
                body();
            CK(cudaDeviceSynchronize());
            calls += batch;
        }
        double t1 = now_s(), j1 = bench_energy_j(&en);
        *ms = (t1 - t0) * 1e3 / calls, *j = (j1 - j0) / calls;
        return calls;
    };
    double ms, j;
    printf("\npart A: the pass alone, 0.3 s heating then ~1.5 s\n");
    for (const shape &s : shapes) {
        sustain(0.3, 4, [&] { pass(s); }, &ms, &j);
        long c = sustain(1.5, 4, [&] { pass(s); }, &ms, &j);
        printf("  %-22s %4ld passes: %.3f ms, %.2f TB/s, %.3f J per pass, %.0f W\n", s.name, c,
               ms, 26.0 * n / (ms * 1e-3) / 1e12, j, j / (ms * 1e-3));
    }
    printf("\npart B: %d gate|up products then the pass, looped ~4 s; two rounds\n", GEMMS);
    const int order[] = {-1, 0, 2, 4, 5, 5, 4, 2, 0, -1};
    for (int k : order) {
        auto loop = [&] {
            for (int i = 0; i < GEMMS; i++)
                gemm();
            if (k >= 0) pass(shapes[k]);
        };
        sustain(0.5, 1, loop, &ms, &j);
        long c = sustain(4.0, 1, loop, &ms, &j);
        printf("  %-22s %3ld loops: %.3f ms, %.3f J per loop, %.0f W\n",
               k < 0 ? "products only" : shapes[k].name, c, ms, j, j / (ms * 1e-3));
    }
    return 0; /* the process's exit releases the device memory and handles */
}
