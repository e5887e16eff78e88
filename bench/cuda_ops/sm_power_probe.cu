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
 *   for ~4 s, and the products alone, interleaved in two rounds: ms and J per loop;
 *   part C (`sm_power_probe C`, instead of A and B): every SM with fewer warps, each thread
 *   issuing the loads of 2 or 4 iterations before using any, alone as in part A: whether fewer
 *   warps stream the same bytes for fewer joules.
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

/* One pass over n parameters, 8 per thread and iteration, U iterations' loads issued before
 * any is used (U 1: load, compute, store in turn): hi/lo are the split master
 * (common/nn/master_split.h's layout, combined here as plain fp32 bits), g the bf16 gradient. */
template <int U>
__global__ void adamw_split_like(uint16_t *hi, uint16_t *lo, float *m, float *v,
                                 const __nv_bfloat16 *g, size_t n8) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t base = blockIdx.x * (size_t)blockDim.x + threadIdx.x; base < n8;
         base += U * stride) {
        uint4 H[U], L[U], G[U];
        float4 M0[U], M1[U], V0[U], V1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            size_t i = base + u * stride;
            if (i >= n8) break;
            H[u] = ((const uint4 *)hi)[i], L[u] = ((const uint4 *)lo)[i];
            G[u] = ((const uint4 *)g)[i];
            M0[u] = ((const float4 *)m)[2 * i], M1[u] = ((const float4 *)m)[2 * i + 1];
            V0[u] = ((const float4 *)v)[2 * i], V1[u] = ((const float4 *)v)[2 * i + 1];
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            size_t i = base + u * stride;
            if (i >= n8) break;
            const uint16_t *h = (const uint16_t *)&H[u], *l = (const uint16_t *)&L[u];
            const __nv_bfloat16 *gg = (const __nv_bfloat16 *)&G[u];
            float *mm[8] = {&M0[u].x, &M0[u].y, &M0[u].z, &M0[u].w,
                            &M1[u].x, &M1[u].y, &M1[u].z, &M1[u].w};
            float *vv[8] = {&V0[u].x, &V0[u].y, &V0[u].z, &V0[u].w,
                            &V1[u].x, &V1[u].y, &V1[u].z, &V1[u].w};
            uint16_t ho[8], lw[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float p = __uint_as_float(((uint32_t)h[e] << 16) | l[e]);
                float gr = __bfloat162float(gg[e]);
                *mm[e] = 0.9f * *mm[e] + 0.1f * gr;
                *vv[e] = 0.999f * *vv[e] + 0.001f * gr * gr;
                p -= 1e-4f * (*mm[e] / (sqrtf(*vv[e]) + 1e-8f) + 0.01f * p);
                uint32_t w = __float_as_uint(p);
                ho[e] = (uint16_t)(w >> 16), lw[e] = (uint16_t)w;
            }
            ((uint4 *)hi)[i] = *(uint4 *)ho, ((uint4 *)lo)[i] = *(uint4 *)lw;
            ((float4 *)m)[2 * i] = M0[u], ((float4 *)m)[2 * i + 1] = M1[u];
            ((float4 *)v)[2 * i] = V0[u], ((float4 *)v)[2 * i + 1] = V1[u];
        }
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
    int unroll;          /* iterations' loads in flight per thread: 1, 2 or 4 */
};

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int main(int argc, char **argv) {
    const bool only_c = argc > 1 && argv[1][0] == 'C';
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
    const shape shapes[] = {{"1 thread per 8 (step)", 0, 256, 1},
                            {"2 x SMs x 1024", 2 * sms, 1024, 1},
                            {"SMs x 1024", sms, 1024, 1},
                            {"100 x 1024", 100, 1024, 1},
                            {"80 x 1024", 80, 1024, 1},
                            {"66 x 1024", 66, 1024, 1},
                            {"48 x 1024", 48, 1024, 1}};
    /* part C: every SM, fewer warps, more loads in flight each (U 2 takes 94 registers, U 4
     * 158: at most 512 and 384 threads per block) */
    const shape fewer_warps[] = {{"1 thread per 8 (step)", 0, 256, 1},
                                 {"SMs x 512 x U2", sms, 512, 2},
                                 {"SMs x 384 x U4", sms, 384, 4},
                                 {"SMs x 256 x U4", sms, 256, 4},
                                 {"SMs x 256 x U2", sms, 256, 2},
                                 {"SMs x 128 x U4", sms, 128, 4},
                                 {"1 thread per 8 (step)", 0, 256, 1}};
    auto pass = [&](const shape &s) {
        unsigned blocks = s.blocks ? (unsigned)s.blocks : (unsigned)((n8 + 255) / 256);
        if (s.unroll == 4)
            adamw_split_like<4><<<blocks, s.threads>>>(hi, lo, m, v, g, n8);
        else if (s.unroll == 2)
            adamw_split_like<2><<<blocks, s.threads>>>(hi, lo, m, v, g, n8);
        else
            adamw_split_like<1><<<blocks, s.threads>>>(hi, lo, m, v, g, n8);
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
    auto alone = [&](const shape &s) {
        sustain(0.3, 4, [&] { pass(s); }, &ms, &j);
        long c = sustain(1.5, 4, [&] { pass(s); }, &ms, &j);
        printf("  %-22s %4ld passes: %.3f ms, %.2f TB/s, %.3f J per pass, %.0f W\n", s.name, c,
               ms, 26.0 * n / (ms * 1e-3) / 1e12, j, j / (ms * 1e-3));
    };
    if (only_c) {
        printf("\npart C: the pass alone on every SM, fewer warps with more loads in flight\n");
        for (const shape &s : fewer_warps)
            alone(s);
        return 0;
    }
    printf("\npart A: the pass alone, 0.3 s heating then ~1.5 s\n");
    for (const shape &s : shapes)
        alone(s);
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
