/* wg_gemm_probe: can a GEMM of our own match cuBLASLt's joules per FLOP at the power limit?
 *
 * A one-off measurement behind bench/cuda_ops/NOTES.md, "A GEMM of our own at the limit". What
 * is left between the drafter step and 1.3x PyTorch lies in fusions that cuBLASLt cannot do
 * (SwiGLU into the gate|up product's epilogue, the softmax statistics into the lm_head's), and
 * at the board's 700 W limit a product's time is its energy. Such fusions pay only if a kernel
 * of ours spends about cuBLASLt's joules per FLOP. This program times a plain one against
 * cuBLASLt (the best of the heuristic's 8 by a cool timing, as ops_cuda picks) on the step's
 * largest shapes: cool (median of 5 runs) and sustained (SECONDS, default 1.5, after 0.3 s of
 * heating; joules from NVML's counter, ../target/energy.h), and checks its output against
 * cuBLASLt's. Usage: wg_gemm_probe [SECONDS [swiglu]]; `swiglu` times only the fusion that
 * the kernel is for (swiglu_test).
 *
 * The kernel and its variants are common/nn/wg_gemm.cuh's k_wg_gemm (its design comment):
 * STAGES and the epilogue (EPI_*) are template choices, each timed in some call
 * (bench/RESULTS.md). The variants list holds the last call's; earlier ones (direct or
 * row-staged stores, two m64n128k16 per k16 step, clusters of 2 CTAs sharing the W tile by
 * multicast) are in the commits that RESULTS names (the clusters last in d762993). Not built by
 * CMake:
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. -Icommon/nn bench/cuda_ops/wg_gemm_probe.cu \
 *     -o wg_gemm_probe -lcublasLt -lcuda -ldl
 */
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"
#include "wg_gemm.cuh"

#include "../target/energy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <unistd.h>

/* The pass the fusion saves: a[M, F] = silu(gu[:, :F]) gu[:, F:], 8 columns per thread (the
 * vector path of ops_cuda.cu's k_swiglu_fwd, which is not reachable from here) */
__global__ void k_swiglu_pass(const __nv_bfloat16 *gu, __nv_bfloat16 *a, int M, int F) {
    size_t n8 = (size_t)M * F / 8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (F / 8), c = i % (F / 8) * 8;
        float g[8], u[8];
        load8(&gu[r * 2 * F + c], g);
        load8(&gu[r * 2 * F + F + c], u);
#pragma unroll
        for (int e = 0; e < 8; e++)
            g[e] = swiglu_val(g[e], u[e]);
        store8(&a[r * F + c], g);
    }
}

/* The probe's tensor maps: exit where the encoder refuses */
static CUtensorMap kblock_map(wg_encode_fn enc, const void *base, int rows, int K, int box_rows) {
    CUtensorMap m;
    if (wgg_kblock_map(enc, &m, base, rows, K, box_rows) != 0) {
        printf("tensor map refused (rows %d K %d)\n", rows, K);
        exit(1);
    }
    return m;
}
static CUtensorMap store_map(wg_encode_fn enc, const void *base, int M, int N) {
    CUtensorMap m;
    if (wgg_store_map(enc, &m, base, M, N) != 0) {
        printf("tensor map refused (output %d x %d)\n", M, N);
        exit(1);
    }
    return m;
}

static cublasLtHandle_t lt;
static void *ws;
static size_t ws_bytes = 32 << 20;
static int g_sms;
static bench_energy g_en;

struct product {
    const char *name;
    int M, N, K;
    __nv_bfloat16 *X, *W, *Y, *Yref;
    CUtensorMap mx, mw, mw_half, my; /* W by 256 rows (by 128 for SwiGLU); Y by 64 x 64 */
    probe_linear lin; /* cuBLASLt's description; algo: the best of 8 by a cool timing */
    cublasLtMatmulAlgo_t algo;
};

/* The variants timed: stages, epilogue */
typedef void (*gemm_kernel)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, int, int, int);
struct variant {
    const char *name;
    gemm_kernel kernel;
    int smem;
};
#define VARIANT(S, E) {#S " stages " #E, (gemm_kernel)k_wg_gemm<S, E>, wgg_smem_bytes(S, E)}
static const variant variants[] = {VARIANT(3, EPI_TMA), VARIANT(4, EPI_TMA_HALF)};
#define N_VARIANTS 2

/* A persistent grid: one CTA per SM, or per tile where there are fewer */
static int grid_of(int M, int N) {
    return std::min(wgg_tiles(M, N), g_sms);
}

static void run_ours(const product &p, int v) {
    const variant &w = variants[v];
    void *args[] = {(void *)&p.mx, (void *)&p.mw,   (void *)&p.my, (void *)&p.my,
                    (void *)&p.M,  (void *)&p.N, (void *)&p.K};
    CK(cudaLaunchKernel((const void *)w.kernel, dim3(grid_of(p.M, p.N)), dim3(WGG_THREADS), args,
                        (size_t)w.smem, 0));
}

static void run_lt(const product &p, __nv_bfloat16 *out) {
    float one = 1, zero = 0;
    LK(cublasLtMatmul(lt, p.lin.op, &one, p.W, p.lin.a, p.X, p.lin.b, &zero, out, p.lin.c, out,
                      p.lin.c, &p.algo, ws, ws_bytes, 0));
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

template <class F> static float cool_ms(F body) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> v;
    for (int r = 0; r < 5; r++) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(a));
        body();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        v.push_back(ms);
    }
    std::sort(v.begin(), v.end());
    return v[2];
}

/* ms and J per call over ~sec seconds of back-to-back calls, after 0.3 s of heating */
template <class F> static void sustained(F body, double sec, double *ms, double *j) {
    for (double t0 = now_s(); now_s() - t0 < 0.3;) {
        body();
        CK(cudaDeviceSynchronize());
    }
    double t0 = now_s(), j0 = bench_energy_j(&g_en);
    long calls = 0;
    while (now_s() - t0 < sec) {
        for (int r = 0; r < 4; r++)
            body();
        CK(cudaDeviceSynchronize());
        calls += 4;
    }
    double t1 = now_s(), j1 = bench_energy_j(&g_en);
    *ms = (t1 - t0) * 1e3 / calls, *j = (j1 - j0) / calls;
}

static void setup(product &p, wg_encode_fn enc) {
    CK(cudaMalloc(&p.X, (size_t)p.M * p.K * 2));
    CK(cudaMalloc(&p.W, (size_t)p.N * p.K * 2));
    CK(cudaMalloc(&p.Y, (size_t)p.M * p.N * 2));
    CK(cudaMalloc(&p.Yref, (size_t)p.M * p.N * 2));
    probe_fill<<<1024, 256>>>(p.X, (size_t)p.M * p.K, 11, 0.25f);
    probe_fill<<<1024, 256>>>(p.W, (size_t)p.N * p.K, 12, 0.25f);
    p.mx = kblock_map(enc, p.X, p.M, p.K, WGG_BM);
    p.mw = kblock_map(enc, p.W, p.N, p.K, WGG_BN);
    p.mw_half = kblock_map(enc, p.W, p.N, p.K, WGG_BN / 2);
    p.my = store_map(enc, p.Y, p.M, p.N);
    p.lin = probe_linear_make(p.M, p.N, p.K);
    cublasLtMatmulHeuristicResult_t res[8];
    int found = probe_linear_candidates(lt, p.lin, ws_bytes, res, 8);
    float best = INFINITY;
    int pick = 0;
    for (int c = 0; c < found; c++) {
        p.algo = res[c].algo;
        float ms = cool_ms([&] { run_lt(p, p.Yref); });
        if (ms < best) best = ms, pick = c;
    }
    p.algo = res[pick].algo;
}

/* max |x - ref| over n bf16 values on the device, relative to max |ref| */
static double rel_error(const __nv_bfloat16 *x_d, const __nv_bfloat16 *ref_d, size_t n) {
    std::vector<__nv_bfloat16> a(n), b(n);
    CK(cudaMemcpy(a.data(), x_d, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), ref_d, n * 2, cudaMemcpyDeviceToHost));
    double d = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double x = __bfloat162float(a[i]), r = __bfloat162float(b[i]);
        if (!(std::fabs(x - r) <= d)) d = std::fabs(x - r); /* NaN propagates */
        ref = std::max(ref, std::fabs(r));
    }
    return d / ref;
}

/* max |ours - cuBLASLt| over all outputs, relative to max |cuBLASLt| */
static double check(const product &p) {
    return rel_error(p.Y, p.Yref, (size_t)p.M * p.N);
}

/* The fusion the kernel is for, measured: the gate|up product with SwiGLU in its epilogue
 * (k_wg_gemm's SWIGLU) against the product, then k_swiglu_pass over its output (cuBLASLt's
 * and ours, variant 1: 4 stages), each sustained as one unit; outputs checked against
 * cuBLASLt + pass.
 * Returns false where an output differs. */
static bool swiglu_test(wg_encode_fn enc, double sec) {
    product p = {"gate|up + SwiGLU 8192 x 24576 x 4096", 8192, 24576, 4096};
    setup(p, enc);
    const int F = p.N / 2;
    const size_t na = (size_t)p.M * F;
    __nv_bfloat16 *A, *Aref;
    CK(cudaMalloc(&A, na * 2));
    CK(cudaMalloc(&Aref, na * 2));
    CUtensorMap ma = store_map(enc, A, p.M, F);
    gemm_kernel fused = (gemm_kernel)k_wg_gemm<4, EPI_TMA_HALF, true>;
    const int smem = wgg_smem_bytes(4, EPI_TMA_HALF);
    CK(cudaFuncSetAttribute((const void *)fused, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem));
    auto pass = [&](const __nv_bfloat16 *gu, __nv_bfloat16 *a) {
        k_swiglu_pass<<<g_sms * 8, 256>>>(gu, a, p.M, F);
        CK(cudaGetLastError());
    };
    auto run_fused = [&] {
        void *args[] = {(void *)&p.mx, (void *)&p.mw_half, (void *)&p.my, (void *)&ma,
                        (void *)&p.M,  (void *)&p.N,       (void *)&p.K};
        CK(cudaLaunchKernel((const void *)fused, dim3(grid_of(p.M, p.N)), dim3(WGG_THREADS), args,
                            (size_t)smem, 0));
    };
    run_lt(p, p.Yref);
    pass(p.Yref, Aref);
    CK(cudaMemset(p.Y, 0xff, (size_t)p.M * p.N * 2));
    CK(cudaMemset(A, 0xff, na * 2));
    run_fused();
    CK(cudaDeviceSynchronize());
    double e_gu = check(p), e_a = rel_error(A, Aref, na);
    bool good = e_gu < 1e-2 && e_a < 1e-2;
    printf("%s: fused gate|up max error / max |ref| %.2e, SwiGLU %.2e %s\n", p.name, e_gu, e_a,
           good ? "ok" : "FAILED");
    const char *names[3] = {"cuBLASLt + pass", "ours + pass", "ours fused"};
    auto body = [&](int b) {
        if (b == 0) run_lt(p, p.Y), pass(p.Y, A);
        else if (b == 1) run_ours(p, 1), pass(p.Y, A);
        else run_fused();
    };
    for (int round = 0; good && round < 2; round++) {
        double ms[3], j[3];
        for (int q = 0; q < 3; q++) {
            int b = round ? 2 - q : q;
            sustained([&] { body(b); }, sec, &ms[b], &j[b]);
        }
        printf("  round %d:", round);
        for (int b = 0; b < 3; b++)
            printf(" | %s %.3f ms, %.4f J (%.0f W), J / first's %.3f", names[b], ms[b], j[b],
                   j[b] / ms[b] * 1e3, j[b] / j[0]);
        printf("\n");
    }
    if (good) {
        CK(cudaDeviceSynchronize());
        usleep(200000);
        printf("  cool:");
        for (int b = 0; b < 3; b++)
            printf(" | %s %.3f ms", names[b], cool_ms([&] { body(b); }));
        printf("\n");
    }
    CK(cudaFree(p.X)), CK(cudaFree(p.W)), CK(cudaFree(p.Y)), CK(cudaFree(p.Yref));
    CK(cudaFree(A)), CK(cudaFree(Aref));
    return good;
}

int main(int argc, char **argv) {
    double sec = argc > 1 ? atof(argv[1]) : 1.5;
    if (!wg_device_runs_sm90a()) {
        printf("wg_gemm_probe: needs an sm_90 device\n");
        return 77;
    }
    wg_encode_fn enc = wg_tensor_map_encoder();
    if (!enc || bench_energy_open(&g_en, 0) != 0) return 1;
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    for (const variant &v : variants)
        CK(cudaFuncSetAttribute((const void *)v.kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, ws_bytes));
    if (argc > 2 && strcmp(argv[2], "swiglu") == 0) return swiglu_test(enc, sec) ? 0 : 1;
    std::vector<product> ps = {{"check 256 x 512 x 128", 256, 512, 128},
                               {"check 512 x 600 x 4096", 512, 600, 4096},
                               {"q/o 8192 x 4096 x 4096", 8192, 4096, 4096},
                               {"gate|up 8192 x 24576 x 4096", 8192, 24576, 4096},
                               {"down 8192 x 4096 x 12288", 8192, 4096, 12288},
                               {"lm_head 7680 x 151936 x 4096", 7680, 151936, 4096}};
    printf("tile %d x %d x %d, %d SMs, board limit %.0f W, %.1f s sustained\n", WGG_BM, WGG_BN, WGG_BK,
           g_sms, g_en.limit_w, sec);
    bool ok = true;
    for (product &p : ps) {
        setup(p, enc);
        run_lt(p, p.Yref);
        bool good = true;
        for (int v = 0; v < N_VARIANTS; v++) {
            CK(cudaMemset(p.Y, 0xff, (size_t)p.M * p.N * 2)); /* NaN where nothing is stored */
            run_ours(p, v);
            CK(cudaDeviceSynchronize());
            double err = check(p);
            good = good && err < 1e-2;
            printf("%-30s %-18s max error / max |ref| %.2e %s\n", p.name, variants[v].name, err,
                   err < 1e-2 ? "ok" : "FAILED");
        }
        ok = ok && good;
        double flop = 2.0 * p.M * p.N * p.K;
        for (int round = 0; good && p.M >= 1024 && round < 2; round++) {
            double ms[N_VARIANTS + 1], j[N_VARIANTS + 1];
            for (int q = 0; q <= N_VARIANTS; q++) {
                int v = round ? N_VARIANTS - q : q; /* cuBLASLt is v == N_VARIANTS */
                if (v == N_VARIANTS)
                    sustained([&] { run_lt(p, p.Y); }, sec, &ms[v], &j[v]);
                else
                    sustained([&] { run_ours(p, v); }, sec, &ms[v], &j[v]);
            }
            printf("  round %d: cuBLASLt %.3f ms, %.4f J (%.3f pJ/FLOP, %.0f W)", round,
                   ms[N_VARIANTS], j[N_VARIANTS], j[N_VARIANTS] / flop * 1e12,
                   j[N_VARIANTS] / ms[N_VARIANTS] * 1e3);
            for (int v = 0; v < N_VARIANTS; v++)
                printf(" | %s %.3f ms, %.4f J (%.0f W), J / cuBLASLt's %.3f", variants[v].name,
                       ms[v], j[v], j[v] / ms[v] * 1e3, j[v] / j[N_VARIANTS]);
            printf("\n");
        }
        for (int round = 0; good && p.M >= 1024 && round < 1; round++) {
            CK(cudaDeviceSynchronize());
            usleep(200000); /* a cooler board for the cool timings */
            printf("  cool: cuBLASLt %.3f ms", cool_ms([&] { run_lt(p, p.Y); }));
            for (int v = 0; v < N_VARIANTS; v++)
                printf(" | %s %.3f ms", variants[v].name, cool_ms([&] { run_ours(p, v); }));
            printf("\n");
        }
        CK(cudaFree(p.X)), CK(cudaFree(p.W)), CK(cudaFree(p.Y)), CK(cudaFree(p.Yref));
    }
    return ok ? 0 : 1;
}
