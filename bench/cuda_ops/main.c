/* bench-cuda_ops: times the cuda backend's main ops at Qwen3-8B DFlash drafter shapes (512
 * anchors x block 16 = 8192 query rows, 3072 context tokens, D 4096, H 32 / Hk 8, d 128,
 * F 12288, V 151936) and prints TFLOP/s against the bf16 GEMM peak measured in the same run
 * (an 8192^3 linear_fwd through the same cuBLASLt path).
 *
 * Timing: 2 warm-up calls, then `reps` calls between two stream syncs, host clock; the median
 * of 3 such batches. Inputs are random (a 16M-element random block tiled over each buffer), never
 * zeros. FLOPs: 2*M*N*K per matmul; attention 4*d per (query row, head, visible key) forward,
 * 10*d backward (S, dP, dV, dK, dQ recomputation counted as 5 products); the lm_head loss
 * 4*Q*D*V (logits and dh), timed at D 4096 and at D 64 (products nearly free: the softmax pass
 * alone). Usage: bench-cuda_ops [drafter_layers (default 1; 0 skips the step)]
 * [attn|xent (only the peak GEMM and the attention ops, or the lm_head loss)]. The causal
 * attention rows also time the target's shape (64 sequences of 2048 tokens); the block attention
 * rows three anchor distributions (see bench_attention: the one of the training step is labelled
 * "(step)"). The last rows time whole DFlash training steps (dflash_train_step) of a
 * Qwen3-8B-shaped drafter with that many layers on dflash_task.h's synthetic task (the tables
 * drawn afresh, not tiled), with the MFU by bench-drafter's FLOPs per step (step_flops.h).
 * Energy (BENCH_ENERGY_S=S, S > 0): after each row's timing the op runs again for at least S
 * seconds and the row adds its joules per call and the board's mean power (NVML's counter,
 * ../target/energy.h; a window of ~1 s or more reads within a few %). At the board's power
 * limit a step's time follows its energy, so this says which ops' joules a faster step must
 * cut (bench/cuda_ops/NOTES.md, "The products at the power limit"). Isolated, an op runs on a
 * board that its neighbours in the step do not heat: compare rows with each other.
 */
#include "ops.h"

#ifdef DFLASH_HAVE_CUDA
#include "dflash_model.h"
#include "dflash_task.h"
#include "dflash_train.h"
#include "ops_cuda.h"
#include "rng.h"

#include <cuda_runtime_api.h>

#include "../target/energy.h"
#include "../drafter/step_flops.h"
#endif

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef DFLASH_HAVE_CUDA
int main(void) {
    printf("bench-cuda_ops: built without CUDA\n");
    return 77;
}
#else

static const nn_ops *O;
static nn_ctx *C;
static float *g_rand; /* 16M random fp32, bf16-representable */
#define RAND_N (16u << 20)
static double g_peak;
static bench_energy g_energy;          /* the board's counter; see BENCH_ENERGY_S at the top */
static double g_energy_s;              /* BENCH_ENERGY_S: seconds of the energy window, 0 = none */
static double g_call_j = -1, g_call_w; /* the last time_ms's joules per call and mean power */
static bool g_failed;                  /* the step row could not run or its steps failed: exit 1 */

/* device memory in use on this GPU (all processes), GiB */
static double mem_used_gib(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1.0;
    return (double)(tot - fr) / (1024.0 * 1024.0 * 1024.0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static uint64_t rs = 88172645463325252ull;
static double urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 4503599627370496.0 - 1.0;
}

/* act buffer of n elements filled with scale * random */
static void *act_rand(size_t n, float scale) {
    void *p = O->alloc(C, n * O->act_bytes);
    if (!p) {
        fprintf(stderr, "out of device memory (%zu elements)\n", n);
        exit(2);
    }
    static float *tmp;
    if (!tmp) tmp = malloc(RAND_N * sizeof(float));
    for (size_t i = 0; i < RAND_N; i++)
        tmp[i] = g_rand[i] * scale;
    size_t first = n < RAND_N ? n : RAND_N;
    O->upload(C, p, tmp, first);
    for (size_t o = first; o < n; o += first) {
        size_t m = n - o < first ? n - o : first;
        O->copy(C, (char *)p + o * O->act_bytes, p, m * O->act_bytes);
    }
    return p;
}

typedef void (*bench_fn)(void *arg);

static double time_ms(bench_fn fn, void *arg, int reps) {
    fn(arg);
    fn(arg);
    O->sync(C);
    double t[3];
    for (int b = 0; b < 3; b++) {
        double t0 = now_s();
        for (int i = 0; i < reps; i++)
            fn(arg);
        O->sync(C);
        t[b] = (now_s() - t0) * 1e3 / reps;
    }
    g_call_j = -1;
    if (g_energy_s > 0) { /* the energy window: whole batches of reps for >= g_energy_s */
        long calls = 0;
        double j0 = bench_energy_j(&g_energy), w0 = now_s(), el = 0;
        while (el < g_energy_s) {
            for (int i = 0; i < reps; i++)
                fn(arg);
            O->sync(C);
            calls += reps, el = now_s() - w0;
        }
        double j1 = bench_energy_j(&g_energy);
        if (j0 >= 0 && j1 >= 0) g_call_j = (j1 - j0) / calls, g_call_w = (j1 - j0) / el;
    }
    /* median of 3 */
    double a = t[0], bb = t[1], c = t[2];
    if (a > bb) {
        double x = a;
        a = bb;
        bb = x;
    }
    if (bb > c) {
        double x = bb;
        bb = c;
        c = x;
    }
    if (a > bb) {
        double x = a;
        a = bb;
        bb = x;
    }
    return bb;
}

static void row(const char *name, const char *shape, double ms, double flop) {
    double tf = flop / (ms * 1e-3) / 1e12;
    printf("%-26s %-34s %10.3f %9.1f %7.1f%%", name, shape, ms, tf,
           g_peak > 0 ? 100.0 * tf / g_peak : 100.0);
    if (g_call_j >= 0) printf(" %9.3f %5.0f", g_call_j, g_call_w);
    printf("\n");
    fflush(stdout);
}

/* ---- GEMMs ---- */

typedef struct lin_arg {
    void *x, *w, *y, *dy, *dw;
    int M, K, N, bwd;
} lin_arg;

static void lin_run(void *p) {
    lin_arg *a = p;
    if (a->bwd)
        O->linear_bwd(C, a->x, a->dw, NULL, a->dy, a->x, a->w, a->M, a->K, a->N, 0);
    else
        O->linear_fwd(C, a->y, a->x, a->w, NULL, a->M, a->K, a->N);
}

static double bench_linear(const char *name, int M, int K, int N, int bwd) {
    lin_arg a = {.M = M, .K = K, .N = N, .bwd = bwd};
    a.x = act_rand((size_t)M * K, 1.0f);
    a.w = act_rand((size_t)N * K, 0.02f);
    if (bwd) {
        a.dy = act_rand((size_t)M * N, 1.0f);
        a.dw = O->alloc(C, (size_t)N * K * O->act_bytes);
    } else
        a.y = O->alloc(C, (size_t)M * N * O->act_bytes);
    double flop = 2.0 * M * K * N * (bwd ? 2 : 1);
    double ms = time_ms(lin_run, &a, 10);
    char shape[64];
    snprintf(shape, sizeof shape, "M%d K%d N%d%s", M, K, N, bwd ? " dx+dw" : "");
    if (!g_peak) g_peak = flop / (ms * 1e-3) / 1e12;
    row(name, shape, ms, flop);
    O->free(C, a.x), O->free(C, a.w), O->free(C, a.y), O->free(C, a.dy), O->free(C, a.dw);
    return ms;
}

/* ---- attention ---- */

typedef struct att_arg {
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
    nn_block_span *spans;
    int32_t *seq_off;
    int nb, B, Tk, T, n_seqs, H, Hk, d, mode;
} att_arg;

static void att_run(void *p) {
    att_arg *a = p;
    if (a->mode == 0)
        O->attention_causal_fwd(C, a->o, a->q, a->k, a->v, a->seq_off, a->n_seqs, a->T, a->H, a->Hk,
                                a->d);
    else if (a->mode == 1)
        O->attention_block_fwd(C, a->o, a->lse, a->q, a->k, a->v, a->spans, a->nb, a->B, a->Tk,
                               a->H, a->Hk, a->d);
    else
        O->attention_block_bwd(C, a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->o, a->lse,
                               a->spans, a->nb, a->B, a->Tk, a->H, a->Hk, a->d);
}

static int cmp_int(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

static void bench_block_attention(const char *label, int lo, int hi);

static void bench_attention(void) {
    int H = 32, Hk = 8, d = 128;
    /* causal: 4 sequences of 3072, and the target's 64 sequences of 2048 */
    for (int c = 0; c < 2; c++) {
        int n = c ? 64 : 4, L = c ? 2048 : 3072;
        att_arg a = {.T = n * L, .n_seqs = n, .H = H, .Hk = Hk, .d = d, .mode = 0};
        int32_t off[65];
        for (int i = 0; i <= n; i++)
            off[i] = i * L;
        a.seq_off = O->alloc(C, (n + 1) * sizeof(int32_t));
        O->upload_raw(C, a.seq_off, off, (n + 1) * sizeof(int32_t));
        a.q = act_rand((size_t)a.T * H * d, 1.0f);
        a.k = act_rand((size_t)a.T * Hk * d, 1.0f);
        a.v = act_rand((size_t)a.T * Hk * d, 1.0f);
        a.o = O->alloc(C, (size_t)a.T * H * d * 2);
        double keys = (double)n * L * (L + 1.0) / 2.0;
        double ms = time_ms(att_run, &a, 5);
        char shape[64];
        snprintf(shape, sizeof shape, "%dx%d H32/8 d128", n, L);
        row("attention_causal_fwd", shape, ms, keys * H * 4.0 * d);
        O->free(C, a.seq_off), O->free(C, a.q), O->free(C, a.k), O->free(C, a.v), O->free(C, a.o);
    }
    /* DFlash block attention: 512 blocks of 16 over 3072 context tokens; anchors (sorted) as
     * this bench always drew them (uniform over [1, Tc - 2]), as the training step draws them
     * (dflash_train_sample_anchors: a uniform subset of the loss positions, about [1, Tc - B]),
     * and over the upper half of the context only (about 1.5x the work) */
    bench_block_attention("a U[1,Tc-2]", 1, 3072 - 2);
    bench_block_attention("a U[1,Tc-B] (step)", 1, 3072 - 16);
    bench_block_attention("a U[Tc/2,Tc-1]", 3072 / 2, 3072 - 1);
}

/* Block attention forward and backward, 512 blocks of 16 after Tc = 3072 context tokens, over
 * 512 sorted anchors drawn uniformly from [lo, hi] (block j sees context [0, anchor j) and its
 * own 16 keys); label names the distribution in the rows. */
static void bench_block_attention(const char *label, int lo, int hi) {
    int H = 32, Hk = 8, d = 128;
    int nb = 512, B = 16, Tc = 3072, Q = nb * B, Tk = Tc + Q;
    int anchors[512];
    for (int j = 0; j < nb; j++)
        anchors[j] = lo + (int)((urand() * 0.5 + 0.5) * (hi - lo + 1));
    qsort(anchors, nb, sizeof(int), cmp_int);
    nn_block_span sp[512];
    double keys = 0;
    for (int j = 0; j < nb; j++) {
        sp[j] = (nn_block_span){0, anchors[j], Tc + j * B, 1};
        keys += (double)B * (anchors[j] + B);
    }
    att_arg a = {.nb = nb, .B = B, .Tk = Tk, .H = H, .Hk = Hk, .d = d, .mode = 1};
    a.spans = O->alloc(C, sizeof sp);
    O->upload_raw(C, a.spans, sp, sizeof sp);
    a.q = act_rand((size_t)Q * H * d, 1.0f);
    a.k = act_rand((size_t)Tk * Hk * d, 1.0f);
    a.v = act_rand((size_t)Tk * Hk * d, 1.0f);
    a.o = O->alloc(C, (size_t)Q * H * d * 2);
    a.lse = O->alloc(C, (size_t)H * Q * 4);
    a.dout = act_rand((size_t)Q * H * d, 1.0f);
    a.dq = O->alloc(C, (size_t)Q * H * d * 2);
    a.dk = O->alloc(C, (size_t)Tk * Hk * d * 2);
    a.dv = O->alloc(C, (size_t)Tk * Hk * d * 2);
    char shape[64];
    snprintf(shape, sizeof shape, "512x16 ctx3072 %s", label);
    double ms = time_ms(att_run, &a, 5);
    row("attention_block_fwd", shape, ms, keys * H * 4.0 * d);
    a.mode = 2;
    ms = time_ms(att_run, &a, 3);
    row("attention_block_bwd", shape, ms, keys * H * 10.0 * d);
    O->free(C, a.spans), O->free(C, a.q), O->free(C, a.k), O->free(C, a.v), O->free(C, a.o);
    O->free(C, a.lse), O->free(C, a.dout), O->free(C, a.dq), O->free(C, a.dk), O->free(C, a.dv);
}

/* ---- loss ---- */

typedef struct xent_arg {
    void *dh, *h, *W, *scratch;
    float *sums, *weights, inv;
    int32_t *labels, *correct;
    int Q, D, V, chunk;
} xent_arg;

static void xent_run(void *p) {
    xent_arg *a = p;
    O->lm_head_xent(C, a->dh, a->sums, a->correct, a->h, a->W, a->labels, a->weights, a->inv,
                    a->scratch, a->Q, a->D, a->V, a->chunk);
}

/* D 64 makes the two products nearly free: that row times the softmax pass between them. */
static void bench_xent(int D) {
    xent_arg a = {.Q = 8192, .D = D, .V = 151936, .chunk = 2048};
    a.h = act_rand((size_t)a.Q * a.D, 1.0f);
    a.W = act_rand((size_t)a.V * a.D, 0.02f);
    a.dh = O->alloc(C, (size_t)a.Q * a.D * 2);
    a.scratch = O->alloc(C, (size_t)a.chunk * a.V * 2);
    a.sums = O->alloc(C, 8);
    a.correct = O->alloc(C, (size_t)a.Q * 4);
    int32_t *lab = malloc((size_t)a.Q * 4);
    float *w = malloc((size_t)a.Q * 4);
    for (int i = 0; i < a.Q; i++)
        lab[i] = (int32_t)(i * 7919 % a.V), w[i] = 1.0f;
    a.labels = O->alloc(C, (size_t)a.Q * 4);
    a.weights = O->alloc(C, (size_t)a.Q * 4);
    O->upload_raw(C, a.labels, lab, (size_t)a.Q * 4);
    O->upload_raw(C, a.weights, w, (size_t)a.Q * 4);
    a.inv = 1.0f / a.Q;
    double ms = time_ms(xent_run, &a, 3);
    char shape[64];
    snprintf(shape, sizeof shape, "Q8192 D%d V151936 chunk2048", D);
    row("lm_head_xent fwd+bwd", shape, ms, 4.0 * a.Q * (double)a.D * a.V);
    O->free(C, a.h), O->free(C, a.W), O->free(C, a.dh), O->free(C, a.scratch);
    O->free(C, a.sums), O->free(C, a.correct), O->free(C, a.labels), O->free(C, a.weights);
    free(lab), free(w);
}

/* ---- a whole training step of a Qwen3-8B-shaped drafter ---- */

static void bench_step(int layers) {
    enum { D = 4096, NF = 5, V = 151936, T = 3072 };
    dflash_config cfg;
    char msg[256];
    if (dflash_task_config(&cfg, D, layers, 32, 8, 12288, NF, V, msg, sizeof msg) != 0) {
        printf("drafter step: %s\n", msg);
        g_failed = true;
        return;
    }
    uint64_t st = RNG_GOLDEN; /* dflash_task.h's tables, as bench-drafter draws them */
    void *emb = dflash_task_table(O, C, &st, (size_t)V * D, DFLASH_TASK_EMBED_SD, 1);
    void *lm = dflash_task_table(O, C, &st, (size_t)V * D, dflash_task_lm_sd(D), 1);
    void *hid = dflash_task_table(O, C, &st, (size_t)T * NF * D, 1.0, 0);
    if (!emb || !lm || !hid) {
        printf("drafter step: out of device memory\n");
        g_failed = true;
        O->free(C, emb), O->free(C, lm), O->free(C, hid);
        return;
    }
    double t0 = now_s();
    dflash_model *m = dflash_model_new(&cfg, O, C, emb, lm, T, 512, 1);
    if (!m) {
        printf("drafter step: dflash_model_new failed\n");
        g_failed = true;
        O->free(C, emb), O->free(C, lm), O->free(C, hid);
        return;
    }
    O->sync(C);
    printf("drafter of %d layers: %.2f M params, created in %.1f s\n", layers, m->n_params / 1e6,
           now_s() - t0);
    int32_t seq_off[2], *ids = malloc(T * 4);
    uint8_t *lmask = malloc(T);
    dflash_task_tokens(1, T, V, seq_off, ids, NULL, lmask);
    dflash_batch_view v = {.n_seqs = 1,
                           .seq_off = seq_off,
                           .ids = ids,
                           .positions = NULL,
                           .loss_mask = lmask,
                           .hidden = hid,
                           .ld = NF * D};
    dflash_train_cfg tc;
    dflash_train_cfg_default(&tc);
    dflash_metrics met;
    for (int i = 0; i < 2; i++)
        dflash_train_step(m, &tc, &v, 0, (uint64_t)i, &met);
    O->sync(C);
    int steps = 5, failed_steps = 0;
    double flop = 0, j0 = g_energy_s > 0 ? bench_energy_j(&g_energy) : -1, s0 = now_s();
    for (int i = 0; i < steps; i++) {
        failed_steps += dflash_train_step(m, &tc, &v, 0, (uint64_t)(10 + i), &met) != 0;
        flop += dflash_step_flops(m, T) / steps; /* bench-drafter's formula, this step's rows */
    }
    O->sync(C);
    if (failed_steps || !isfinite(met.loss)) {
        printf("drafter step: %d of %d steps failed, loss %g\n", failed_steps, steps, met.loss);
        g_failed = true;
    }
    double ms = (now_s() - s0) * 1e3 / steps, j1 = j0 >= 0 ? bench_energy_j(&g_energy) : -1;
    g_call_j = -1; /* the row's joules: these 5 steps' (a short window: coarse) */
    if (j0 >= 0 && j1 >= 0) g_call_j = (j1 - j0) / steps, g_call_w = g_call_j / (ms * 1e-3);
    char shape[64];
    snprintf(shape, sizeof shape, "%d layers, %d blocks, T%d", layers, met.n_blocks, T);
    row("dflash_train_step", shape, ms, flop);
    printf("step loss %.4f grad_norm %.4f (%d blocks); device memory in use %.2f GiB "
           "(drafter + target embed/lm_head + features)\n",
           met.loss, met.grad_norm, met.n_blocks, mem_used_gib());
    printf("step FLOPs: bench-drafter's formula (bench/drafter/step_flops.h)\n");
    dflash_model_destroy(&m);
    O->free(C, emb), O->free(C, lm), O->free(C, hid);
    free(ids), free(lmask);
}

int main(int argc, char **argv) {
    int layers = argc > 1 ? atoi(argv[1]) : 1;
    const char *only = argc > 2 ? argv[2] : "";
    int attn_only = strcmp(only, "attn") == 0, xent_only = strcmp(only, "xent") == 0;
    if (layers < 0 || (*only && !attn_only && !xent_only)) {
        fprintf(stderr, "usage: bench-cuda_ops [drafter_layers (default 1; 0 skips the step)] "
                        "[attn|xent]\n");
        return 2;
    }
    O = nn_cuda_ops();
    C = nn_cuda_new(0);
    if (!C) {
        fprintf(stderr, "bench-cuda_ops: no CUDA device\n");
        return 2;
    }
    g_rand = malloc(RAND_N * sizeof(float));
    for (size_t i = 0; i < RAND_N; i++)
        g_rand[i] = (float)urand();
    const char *es = getenv("BENCH_ENERGY_S");
    g_energy_s = es && *es ? atof(es) : 0.0;
    if (g_energy_s > 0 && bench_energy_open(&g_energy, 0) != 0) {
        printf("BENCH_ENERGY_S: no energy counter, the rows go without joules\n");
        g_energy_s = 0;
    }
    printf("%-26s %-34s %10s %9s %8s%s\n", "op", "shape", "ms", "TFLOP/s", "of peak",
           g_energy_s > 0 ? "    J/call     W" : "");
    bench_linear("peak: linear_fwd", 8192, 8192, 8192, 0);
    if (!attn_only && !xent_only) {
        bench_linear("linear_fwd q/o", 8192, 4096, 4096, 0);
        bench_linear("linear_fwd k/v ctx", 3072, 4096, 1024, 0);
        bench_linear("linear_fwd gate/up", 8192, 4096, 12288, 0);
        bench_linear("linear_fwd down", 8192, 12288, 4096, 0);
        bench_linear("linear_fwd fc", 3072, 20480, 4096, 0);
        bench_linear("linear_bwd gate/up", 8192, 4096, 12288, 1);
        bench_linear("linear_bwd down", 8192, 12288, 4096, 1);
    }
    if (!xent_only) bench_attention();
    if (!attn_only) bench_xent(4096), bench_xent(64);
    if (layers > 0) bench_step(layers);
    printf("peak (measured 8192^3 bf16 linear_fwd): %.1f TFLOP/s\n", g_peak);
    nn_cuda_destroy(&C);
    return g_failed ? 1 : 0;
}
#endif
