/* lt_shape_probe: does a product of the drafter step run faster in another decomposition?
 *
 * A one-off measurement behind bench/cuda_ops/NOTES.md, "The products at the power limit, the
 * step's energy, and a stall from the bench's data". The step's cuBLASLt products run at 690-760
 * TFLOP/s under the board's power limit, but not alike when cool: the lm_head forward (m 151936 n
 * 7680 k 4096) took 13.2 ms in the start-up tuning (726 TFLOP/s) where the gate|up forward (m 24576
 * n 8192 k 4096) took 1.96 ms (843). One reading (refuted: NOTES): with the vocabulary along m, a
 * wave of tiles walks down the 1.24 GB weight for a few token columns and streams it from DRAM once
 * per column of tiles. This program times each product as one call and as chunks of it (the same
 * output, ld unchanged; chunks along m, along n, or the transposed problem, for its rate only),
 * each decomposition's shapes tuned on a heated board (the best of the heuristic's 8 by 5 timed
 * runs), then in 3 interleaved rounds of ~150 ms each. Mode `ncu`: every decomposition once with
 * the heuristic's first algorithm, for `ncu --metrics dram__bytes_read.sum,...`. Mode `cands`: each
 * of the heuristic's candidates (up to 8) for the step's largest shapes, its time in 3 runs after
 * an idle moment (as the start-up tuning times it) and its rate sustained over ~150 ms, twice,
 * interleaved: under the power limit the sustained rate is the candidate's energy per FLOP.
 * Not built by CMake: nvcc -O3 -arch=sm_90 -std=c++17 bench/cuda_ops/lt_shape_probe.cu
 *   -o lt_shape_probe -lcublasLt
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>


static cublasLtHandle_t lt;
static void *ws;
static size_t ws_bytes = 32 << 20;
static cudaStream_t st;
static cudaEvent_t ev0, ev1;

/* One column-major product D[m, n] = op(A) op(B), bf16 in and out, fp32 compute */
struct prod {
    int ta, tb, m, n, k, lda, ldb, ldc;
    const void *A, *B;
    void *D;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulHeuristicResult_t res[8];
    int found, pick;
};

static void prod_init(prod &p) {
    LK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.lda));
    LK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.ldb));
    LK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, p.m, p.n, p.ldc));
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    uint32_t al = 256; /* the pointers' common alignment */
    for (const void *q : {p.A, p.B, (const void *)p.D})
        while ((uintptr_t)q % al) al /= 2;
    for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        LK(cublasLtMatmulPreferenceSetAttribute(pref, a, &al, sizeof al));
    LK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 8, p.res, &p.found));
    LK(cublasLtMatmulPreferenceDestroy(pref));
    if (p.found < 1) {
        printf("no algorithm for m %d n %d k %d\n", p.m, p.n, p.k);
        exit(1);
    }
    p.pick = 0;
}

static void prod_run(const prod &p, int cand) {
    float one = 1, zero = 0;
    LK(cublasLtMatmul(lt, p.op, &one, p.A, p.a, p.B, p.b, &zero, p.D, p.c, p.D, p.c,
                      &p.res[cand].algo, ws, ws_bytes, st));
}

static float timed(const std::vector<prod> &ps, int reps, int cand = -1) {
    CK(cudaEventRecord(ev0, st));
    for (int r = 0; r < reps; r++)
        for (const prod &p : ps)
            prod_run(p, cand < 0 ? p.pick : cand);
    CK(cudaEventRecord(ev1, st));
    CK(cudaEventSynchronize(ev1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev0, ev1));
    return ms / reps;
}

/* A decomposition: its name and products (together one whole product of `flop`) */
struct decomp {
    std::string name;
    std::vector<prod> ps;
};

/* Splits m (when along_m) or n of product p into chunks of `chunk` (the last shorter), with
 * pointers moved as the stored layouts (ta, tb, column-major) give. */
static decomp split(const char *name, const prod &p, bool along_m, int chunk) {
    decomp d{name, {}};
    int total = along_m ? p.m : p.n;
    for (int o = 0; o < total; o += chunk) {
        prod q = p;
        int len = total - o < chunk ? total - o : chunk;
        if (along_m) {
            q.m = len; /* A rows o.. of op(A): stored column o (ta) or row o (not ta) */
            q.A = (const char *)p.A + (size_t)o * (p.ta ? p.lda : 1) * 2;
            q.D = (char *)p.D + (size_t)o * 2;
        } else {
            q.n = len; /* B columns o.. of op(B): stored row o (tb) or column o */
            q.B = (const char *)p.B + (size_t)o * (p.tb ? 1 : p.ldb) * 2;
            q.D = (char *)p.D + (size_t)o * p.ldc * 2;
        }
        d.ps.push_back(q);
    }
    return d;
}

static void tune(decomp &d, int reps) {
    for (prod &p : d.ps) {
        prod_init(p);
        if (reps == 0) continue;
        float best = 1e30f;
        for (int c = 0; c < p.found; c++) {
            timed({p}, 1, c); /* warm */
            float ms = timed({p}, reps, c);
            if (ms < best) best = ms, p.pick = c;
        }
    }
}

static void family(const char *title, std::vector<decomp> ds, double flop, bool ncu) {
    printf("== %s (%.2f TFLOP)\n", title, flop / 1e12);
    for (decomp &d : ds)
        tune(d, ncu ? 0 : 5);
    if (ncu) {
        for (decomp &d : ds) {
            printf("ncu: %s, %zu products\n", d.name.c_str(), d.ps.size());
            timed(d.ps, 1);
        }
        return;
    }
    float one = timed(ds[0].ps, 1);
    int reps = (int)(150.0f / one) + 1;
    timed(ds[0].ps, reps); /* heat */
    for (int round = 0; round < 3; round++)
        for (decomp &d : ds) {
            float ms = timed(d.ps, reps);
            printf("  round %d %-22s %2zu products %8.3f ms %7.1f TFLOP/s\n", round,
                   d.name.c_str(), d.ps.size(), ms, flop / (ms * 1e-3) / 1e12);
        }
}

/* Every candidate of product p: cool (3 runs after 50 ms idle) and sustained (~150 ms) */
static void candidates(const char *title, prod p) {
    prod_init(p);
    double flop = 2.0 * p.m * p.n * p.k;
    float one = timed({p}, 1, 0);
    int reps = (int)(150.0f / one) + 1;
    float cool[8], hot[2][8];
    timed({p}, reps, 0); /* heat */
    for (int round = 0; round < 2; round++)
        for (int c = 0; c < p.found; c++)
            hot[round][c] = timed({p}, reps, c);
    for (int c = 0; c < p.found; c++) {
        CK(cudaDeviceSynchronize());
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        timed({p}, 1, c);
        cool[c] = timed({p}, 3, c);
    }
    printf("== %s: m %d n %d k %d, %d candidates\n", title, p.m, p.n, p.k, p.found);
    for (int c = 0; c < p.found; c++)
        printf("  candidate %d: cool %.3f ms (%.1f TFLOP/s), sustained %.1f / %.1f TFLOP/s\n", c,
               cool[c], flop / (cool[c] * 1e-3) / 1e12, flop / (hot[0][c] * 1e-3) / 1e12,
               flop / (hot[1][c] * 1e-3) / 1e12);
}

int main(int argc, char **argv) {
    bool ncu = argc > 1 && !strcmp(argv[1], "ncu");
    bool cands = argc > 1 && !strcmp(argv[1], "cands");
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaStreamCreate(&st));
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    const int V = 151936, T = 7680, D = 4096, M = 8192, F2 = 24576;
    __nv_bfloat16 *W, *h, *logits, *out, *x, *wgu, *gu;
    CK(cudaMalloc(&W, (size_t)V * D * 2));
    CK(cudaMalloc(&h, (size_t)T * D * 2));
    CK(cudaMalloc(&logits, (size_t)V * T * 2));
    CK(cudaMalloc(&out, (size_t)F2 * D * 2));
    CK(cudaMalloc(&x, (size_t)M * D * 2));
    CK(cudaMalloc(&wgu, (size_t)F2 * D * 2));
    CK(cudaMalloc(&gu, (size_t)M * F2 * 2));
    probe_fill<<<2048, 256, 0, st>>>(W, (size_t)V * D, 1, 0.25f);
    probe_fill<<<2048, 256, 0, st>>>(h, (size_t)T * D, 2, 0.25f);
    probe_fill<<<2048, 256, 0, st>>>(logits, (size_t)V * T, 3, 0.25f);
    probe_fill<<<2048, 256, 0, st>>>(x, (size_t)M * D, 4, 0.25f);
    probe_fill<<<2048, 256, 0, st>>>(wgu, (size_t)F2 * D, 5, 0.25f);
    probe_fill<<<2048, 256, 0, st>>>(gu, (size_t)M * F2, 6, 0.25f);
    CK(cudaGetLastError());
    if (cands) { /* the step's largest products (bench-drafter's op profile), as ops_cuda calls */
        const int F = F2 / 2;
        candidates("lm_head forward", {1, 0, V, T, D, D, D, V, W, h, logits});
        candidates("lm_head dh", {0, 0, D, T, V, D, V, D, W, logits, out});
        candidates("gate|up forward", {1, 0, F2, M, D, D, D, F2, wgu, x, gu});
        candidates("gate|up dx", {0, 0, D, M, F2, D, F2, D, wgu, gu, out});
        candidates("gate|up dW", {0, 1, D, F2, M, D, F2, D, x, gu, out});
        candidates("down forward", {1, 0, D, M, F, F, F, D, wgu, gu, out});
        candidates("down dx", {0, 0, F, M, D, F, D, F, wgu, x, gu});
        candidates("down dW", {0, 1, F, D, M, F, D, F, gu, x, out});
        printf("done\n");
        return 0;
    }

    { /* lm_head forward: logits[T, V] = h W^T, as the step: m V, n T, k D */
        prod p{1, 0, V, T, D, D, D, V, W, h, logits};
        prod t{1, 0, T, V, D, D, D, T, h, W, logits}; /* transposed result, rate only */
        family("lm_head forward", {{"one (m V)", {p}}, split("m chunks 77824", p, true, 77824),
                                   split("m chunks 32768", p, true, 32768),
                                   split("m chunks 16384", p, true, 16384),
                                   split("m chunks 8192", p, true, 8192),
                                   split("m chunks 4096", p, true, 4096),
                                   split("n chunks T/2", p, false, T / 2),
                                   {"transposed (m T)", {t}}},
               2.0 * V * T * D, ncu);
    }
    { /* lm_head dh[T, D] = dlogits W: m D, n T, k V */
        prod p{0, 0, D, T, V, D, V, D, W, logits, out};
        prod t{1, 1, T, D, V, V, D, T, logits, W, out};
        family("lm_head dh", {{"one", {p}}, split("n chunks T/2", p, false, T / 2),
                              {"transposed (m T)", {t}}},
               2.0 * V * T * D, ncu);
    }
    { /* gate|up forward gu[M, F2] = x Wgu^T: m F2, n M, k D */
        prod p{1, 0, F2, M, D, D, D, F2, wgu, x, gu};
        prod t{1, 0, M, F2, D, D, D, M, x, wgu, gu};
        family("gate|up forward",
               {{"one", {p}}, split("m chunks F2/2", p, true, F2 / 2), {"transposed", {t}}},
               2.0 * F2 * M * D, ncu);
    }
    { /* gate|up dW[F2, D] = dgu^T x: m D, n F2, k M (x as A, dgu as B transposed) */
        prod p{0, 1, D, F2, M, D, F2, D, x, gu, out};
        prod t{0, 1, F2, D, M, F2, D, F2, gu, x, out};
        family("gate|up dW", {{"one", {p}}, split("n chunks F2/2", p, false, F2 / 2),
                              split("n chunks F2/4", p, false, F2 / 4), {"transposed", {t}}},
               2.0 * F2 * M * D, ncu);
    }
    printf("done\n");
    return 0;
}
