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
 *   part D (`sm_power_probe D`, instead of A and B): the same pass by the bulk-copy engine
 *   (adamw_bulk_like: one CTA per SM used, chunks of CH parameters through S shared-memory
 *   stages, one thread issuing 1-dimensional cp.async.bulk loads onto the stage's mbarrier and
 *   bulk stores from it), so that a few SMs keep enough bytes in flight for the copy rate
 *   (part A's reduced grids of plain loads could not: 2.84 TB/s on 66 SMs); first its outputs
 *   against adamw_split_like's bit for bit, then alone on 132 .. 33 SMs as in part A, then
 *   after the products as in part B.
 * Energy from NVML's counter (../target/energy.h). Not built by CMake:
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I. -Icommon/nn \
 *     bench/cuda_ops/sm_power_probe.cu -o sm_power_probe -lcublasLt -ldl
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"
#include "wgmma.cuh" /* mbarriers */

#include "../target/energy.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <vector>

/* One AdamW update of P parameters (h, l: the split master's halves as in adamw_split_like; m,
 * v its moments; g the gradient): what both passes compute, in place. */
template <int P>
__device__ __forceinline__ void adamw_n(uint16_t *h, uint16_t *l, const __nv_bfloat16 *gg,
                                        float *mm, float *vv) {
#pragma unroll
    for (int e = 0; e < P; e++) {
        float p = __uint_as_float(((uint32_t)h[e] << 16) | l[e]);
        float gr = __bfloat162float(gg[e]);
        mm[e] = 0.9f * mm[e] + 0.1f * gr;
        vv[e] = 0.999f * vv[e] + 0.001f * gr * gr;
        p -= 1e-4f * (mm[e] / (sqrtf(vv[e]) + 1e-8f) + 0.01f * p);
        uint32_t w = __float_as_uint(p);
        h[e] = (uint16_t)(w >> 16), l[e] = (uint16_t)w;
    }
}

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
            float mm[8] = {M0[u].x, M0[u].y, M0[u].z, M0[u].w, M1[u].x, M1[u].y, M1[u].z, M1[u].w};
            float vv[8] = {V0[u].x, V0[u].y, V0[u].z, V0[u].w, V1[u].x, V1[u].y, V1[u].z, V1[u].w};
            adamw_n<8>((uint16_t *)&H[u], (uint16_t *)&L[u], (const __nv_bfloat16 *)&G[u], mm, vv);
            M0[u] = make_float4(mm[0], mm[1], mm[2], mm[3]);
            M1[u] = make_float4(mm[4], mm[5], mm[6], mm[7]);
            V0[u] = make_float4(vv[0], vv[1], vv[2], vv[3]);
            V1[u] = make_float4(vv[4], vv[5], vv[6], vv[7]);
            ((uint4 *)hi)[i] = H[u], ((uint4 *)lo)[i] = L[u];
            ((float4 *)m)[2 * i] = M0[u], ((float4 *)m)[2 * i + 1] = M1[u];
            ((float4 *)v)[2 * i] = V0[u], ((float4 *)v)[2 * i + 1] = V1[u];
        }
    }
}

/* 1-dimensional bulk copies: global to shared completing on mbarrier b (which expects the
 * bytes), and shared to global in this thread's bulk group */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes), "r"((uint32_t)__cvta_generic_to_shared(b))
                 : "memory");
}
__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
                 "r"((uint32_t)__cvta_generic_to_shared(src)), "r"(bytes)
                 : "memory");
}

template <int N> struct alignas(N) bytes_of { unsigned char b[N]; }; /* a vector load of N */

/* The pass by bulk copies: CTA b takes chunks b, b + grid, ... of CH parameters; stage k % S
 * holds chunk k's hi, lo, g (2 CH bytes each), m, v (4 CH each). Thread 0 keeps S - 1 chunks'
 * loads in flight; each of the CH / P threads updates P parameters of the chunk in shared
 * memory; thread 0 stores the chunk's hi, lo, m, v back and, once the stores of the chunk
 * before have read their stage (wait_group.read 1), loads chunk k + S - 1 into it.
 * n % CH == 0. */

template <int S, int CH, int P>
__global__ void __launch_bounds__(CH / P, 1)
    adamw_bulk_like(uint16_t *hi, uint16_t *lo, float *m, float *v, const __nv_bfloat16 *g,
                    size_t n) {
    constexpr uint32_t SB = 14 * CH;
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t full[S];
    const int t = threadIdx.x;
    const long nch = (long)(n / CH), K = (nch - blockIdx.x + gridDim.x - 1) / gridDim.x;
    if (t == 0) {
        for (int s = 0; s < S; s++)
            mb_init(full + s, 1);
        mb_init_fence();
    }
    __syncthreads();
    auto load = [&](long k) {
        unsigned char *st = sm + (k % S) * SB;
        const size_t p0 = (size_t)(blockIdx.x + k * gridDim.x) * CH;
        mb_arrive_tx(full + k % S, SB);
        bulk_load(st, hi + p0, 2 * CH, full + k % S);
        bulk_load(st + 2 * CH, lo + p0, 2 * CH, full + k % S);
        bulk_load(st + 4 * CH, g + p0, 2 * CH, full + k % S);
        bulk_load(st + 6 * CH, m + p0, 4 * CH, full + k % S);
        bulk_load(st + 10 * CH, v + p0, 4 * CH, full + k % S);
    };
    if (t == 0)
        for (long k = 0; k < S - 1 && k < K; k++)
            load(k);
    for (long k = 0; k < K; k++) {
        unsigned char *st = sm + (k % S) * SB;
        mb_wait(full + k % S, (int)((k / S) & 1));
        /* this thread's P parameters of each array, by vector loads and stores */
        using B2 = bytes_of<2 * P>;
        using B4 = bytes_of<(4 * P < 16 ? 4 * P : 16)>;
        constexpr int NW = P / 4 > 0 ? P / 4 : 1; /* B4 words of P floats */
        union {
            B2 w;
            uint16_t x[P];
        } H, L;
        union {
            B2 w;
            __nv_bfloat16 x[P];
        } G;
        union {
            B4 w[NW];
            float x[P];
        } M, V;
        H.w = ((B2 *)st)[t], L.w = ((B2 *)(st + 2 * CH))[t], G.w = ((B2 *)(st + 4 * CH))[t];
        B4 *ms = (B4 *)(st + 6 * CH), *vs = (B4 *)(st + 10 * CH);
#pragma unroll
        for (int w = 0; w < NW; w++)
            M.w[w] = ms[NW * t + w], V.w[w] = vs[NW * t + w];
        adamw_n<P>(H.x, L.x, G.x, M.x, V.x);
        ((B2 *)st)[t] = H.w, ((B2 *)(st + 2 * CH))[t] = L.w;
#pragma unroll
        for (int w = 0; w < NW; w++)
            ms[NW * t + w] = M.w[w], vs[NW * t + w] = V.w[w];
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (t == 0) {
            const size_t p0 = (size_t)(blockIdx.x + k * gridDim.x) * CH;
            bulk_store(hi + p0, st, 2 * CH);
            bulk_store(lo + p0, st + 2 * CH, 2 * CH);
            bulk_store(m + p0, st + 6 * CH, 4 * CH);
            bulk_store(v + p0, st + 10 * CH, 4 * CH);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            if (k + S - 1 < K) {
                asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
                load(k + S - 1);
            }
        }
    }
    if (t == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

static cublasLtHandle_t lt;
static void *ws;
static size_t ws_bytes = 32 << 20;
static probe_linear lin;
static cublasLtMatmulAlgo_t algo;

struct shape {
    const char *name;
    int blocks, threads; /* blocks 0: one thread per 8 parameters (the step's launch) */
    int unroll;          /* iterations' loads in flight per thread: 1, 2 or 4; part D: 0, the
                          * bulk pass with 7 stages of 2048 parameters, 8 per thread (256
                          * threads), -1 the same with 2 per thread (1024), -2 with 4 (512),
                          * on `blocks` SMs */
};

/* the bulk pass's dynamic shared memory, set once per instance */
template <int S, int CH, int P>
static void bulk_pass(const shape &s, uint16_t *hi, uint16_t *lo, float *m, float *v,
                      const __nv_bfloat16 *g, size_t n) {
    constexpr int SMEM = S * 14 * CH;
    static bool set = false;
    if (!set) {
        CK(cudaFuncSetAttribute(adamw_bulk_like<S, CH, P>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
        set = true;
    }
    adamw_bulk_like<S, CH, P><<<s.blocks, CH / P, SMEM>>>(hi, lo, m, v, g, n);
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int main(int argc, char **argv) {
    const bool only_c = argc > 1 && argv[1][0] == 'C', only_d = argc > 1 && argv[1][0] == 'D';
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
    /* part D: the bulk pass against the step's launch */
    const shape bulk[] = {{"1 thread per 8 (step)", 0, 256, 1},
                          {"bulk x2 132 SMs", sms, 1024, -1},
                          {"bulk x2 100 SMs", 100, 1024, -1},
                          {"bulk x2 80 SMs", 80, 1024, -1},
                          {"bulk x2 66 SMs", 66, 1024, -1},
                          {"bulk x4 66 SMs", 66, 512, -2},
                          {"bulk x8 132 SMs", sms, 256, 0},
                          {"bulk x8 66 SMs", 66, 256, 0},
                          {"bulk x2 48 SMs", 48, 1024, -1},
                          {"1 thread per 8 (step)", 0, 256, 1}};
    auto pass_n = [&](const shape &s, uint16_t *hi, uint16_t *lo, float *m, float *v,
                      size_t n) {
        if (s.unroll == 0)
            bulk_pass<7, 2048, 8>(s, hi, lo, m, v, g, n);
        else if (s.unroll == -1)
            bulk_pass<7, 2048, 2>(s, hi, lo, m, v, g, n);
        else if (s.unroll == -2)
            bulk_pass<7, 2048, 4>(s, hi, lo, m, v, g, n);
        else
            adamw_split_like<1><<<(unsigned)((n / 8 + 255) / 256), 256>>>(hi, lo, m, v, g,
                                                                          n / 8);
        CK(cudaGetLastError());
    };
    auto pass = [&](const shape &s) {
        unsigned blocks = s.blocks ? (unsigned)s.blocks : (unsigned)((n8 + 255) / 256);
        if (s.unroll <= 0) {
            pass_n(s, hi, lo, m, v, n);
            return;
        }
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
    /* GEMMS products, then the pass of set[k] (k -1: none), looped ~4 s for each k in order */
    auto after_products = [&](const shape *set, std::initializer_list<int> order) {
        for (int k : order) {
            auto loop = [&] {
                for (int i = 0; i < GEMMS; i++)
                    gemm();
                if (k >= 0) pass(set[k]);
            };
            sustain(0.5, 1, loop, &ms, &j);
            long c = sustain(4.0, 1, loop, &ms, &j);
            printf("  %-22s %3ld loops: %.3f ms, %.3f J per loop, %.0f W\n",
                   k < 0 ? "products only" : set[k].name, c, ms, j, j / (ms * 1e-3));
        }
    };
    if (only_d) {
        /* correctness: the first ns parameters' state, copied, through the step's pass and
         * through each bulk form; every output byte must agree */
        const size_t ns = 16ull << 20;
        uint16_t *h2, *l2;
        float *m2, *v2;
        CK(cudaMalloc(&h2, ns * 2));
        CK(cudaMalloc(&l2, ns * 2));
        CK(cudaMalloc(&m2, ns * 4));
        CK(cudaMalloc(&v2, ns * 4));
        probe_fill<<<1024, 256>>>((__nv_bfloat16 *)m, 2 * ns, 6, 0.01f); /* m nonzero, v 0 */
        CK(cudaDeviceSynchronize());
        std::vector<unsigned char> a(ns * 12), b(ns * 12);
        auto state = [&](std::vector<unsigned char> &out, uint16_t *H, uint16_t *L, float *Mm,
                         float *Vv) {
            CK(cudaMemcpy(out.data(), H, ns * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(out.data() + ns * 2, L, ns * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(out.data() + ns * 4, Mm, ns * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(out.data() + ns * 8, Vv, ns * 4, cudaMemcpyDeviceToHost));
        };
        for (int form : {0, -1, -2}) {
            CK(cudaMemcpy(h2, hi, ns * 2, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(l2, lo, ns * 2, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(m2, m, ns * 4, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(v2, v, ns * 4, cudaMemcpyDeviceToDevice));
            const shape step = {"", 0, 256, 1}, bs = {"", 66, 256, form};
            for (int rep = 0; rep < 3; rep++) { /* three updates: the state moves each time */
                pass_n(step, hi, lo, m, v, ns);
                pass_n(bs, h2, l2, m2, v2, ns);
            }
            CK(cudaDeviceSynchronize());
            state(a, hi, lo, m, v);
            state(b, h2, l2, m2, v2);
            size_t diff = 0;
            for (size_t i = 0; i < a.size(); i++)
                diff += a[i] != b[i];
            printf("check: bulk form %d on 66 SMs, 3 updates of %zu M parameters: %zu of %zu "
                   "output bytes differ from the step's pass%s\n",
                   form, ns >> 20, diff, a.size(), diff ? " (FAIL)" : "");
            if (diff) return 1;
        }
        printf("\npart D: the pass alone, by the bulk-copy engine on fewer SMs\n");
        for (const shape &s : bulk)
            alone(s);
        printf("\npart D, after %d gate|up products, looped ~4 s; two rounds\n", GEMMS);
        after_products(bulk, {-1, 0, 1, 3, 2, 2, 3, 1, 0, -1});
        return 0;
    }
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
    after_products(shapes, {-1, 0, 2, 4, 5, 5, 4, 2, 0, -1});
    return 0; /* the process's exit releases the device memory and handles */
}
