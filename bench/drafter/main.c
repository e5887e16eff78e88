/* bench-drafter: DFlash training steps (dflash_train_step: anchors, forward, lm_head loss,
 * backward, clip, AdamW) of the Qwen3-8B drafter (D 4096, 5 layers, H 32 / Hk 8, d 128,
 * F 12288, B 16, 5 features, V 151936) on the cuda backend. bench/drafter/run.sh runs it with
 * the PyTorch reference (bench/drafter/torch_drafter_bench.py) and prints the ratio.
 *
 * Usage: bench-drafter [LAYERS=5] [CASES|all] [TUNE=8] [STEPS=10] (CASES: comma-separated
 *   names of the cases below, s3072_a512, s768_a256, 4xs768_a256; an unknown name exits 2;
 *   TUNE: cuBLASLt candidates timed per matmul shape when the model is created, as the
 *   drafter daemon's --tune-matmuls does; 0: the heuristic's first; STEPS: timed steps)
 * Cases: one sequence of 3072 tokens with 512 anchors; one of 768 tokens with 256 anchors
 *   (SpecForge's published shape); 4 packed sequences of 768 tokens with 256 anchors each.
 *   The data are dflash_task.h's synthetic task, which the PyTorch reference draws alike:
 *   token g of the batch g * 7919 mod 151000, a 64-token prompt per sequence (loss mask 0),
 *   target features uniform in [-1, 1), embeddings and lm_head normal with sd 0.05 and 0.02,
 *   the drafter's matrices N(0, 0.02) (its own init).
 * Timing: 3 untimed steps, then STEPS (10) steps queued as the drafter daemon does
 *   (dflash_train_step_async, each step's metrics collected once the next is queued) between
 *   stream syncs (host clock); also printed: the host's time per timed step queuing the next
 *   step and waiting for the previous one (a queue time near the step time: a bubble).
 *   samples/s = steps/s * sequences per step.
 * FLOPs per step (12 = fwd 4 + bwd 8 per (query row, head, visible key, d) for attention;
 *   recomputation inside the attention backward not counted):
 *   6 * Q * (D*H*d + 2*D*Hk*d + H*d*D + 3*D*F) * layers     q, k, v, o, gate, up, down on blocks
 *   + 6 * T * 2*D*Hk*d * layers                             k, v of the context rows
 *   + 4 * T * nF*D*D                                         fc (features frozen: no dX)
 *   + 12 * H * d * sum_blocks B*(anchor + B) * layers        attention (exact visible keys)
 *   + 4 * Qw * D * V                                         lm_head logits + dh (frozen)
 *   - 6 * (Q - U) * (D*H*d + 2*D*Hk*d)                       layer 0's q, k, v on U rows
 *   + 2 * Q * Ucap * (H + 2*Hk) * d                          their one-hot gradient sums
 *   - 6 * (Q - Qc) * (H*d*D + 3*D*F)                         last layer's o, MLP on Qc rows
 * with Q = blocks * 16 and Qw the rows of weight > 0, the only ones the loss computes (15 of a
 * block's 16; the PyTorch reference computes and counts all Q, so its MFU counts 1/16 of its
 * lm_head work that ours skips: compare the two by time per step), and U the distinct input
 * rows of layer 0 (at most nb + 1: the anchors' tokens and MASK; dflash_model.h), Ucap its
 * padded capacity, Qc = blocks * 15 the rows the loss can read (all but each block's first).
 * MFU against a 8192^3 bf16 linear_fwd measured first in this run. Peak device memory =
 * memory in use after the steps (nothing is allocated in a step: the backend's allocation
 * count over the timed steps is printed, and a FAIL line when it is not 0), including the
 * drafter, its optimizer state, the borrowed embed/lm_head (2 x 1.2 GB) and the features.
 * Then 2 more steps run with per-op CUDA events (../target/opprof.h): where the GPU time goes
 * (DFLASH_PROF_SEQ=1: also the first of them op by op, in queue order).
 * Energy: the board's joules per timed step and mean power (NVML's counter, energy.h; the
 * products run at the power limit, so time follows energy), "energy: n/a" without NVML.
 * Curve: each timed step's loss, gradient norm and accuracy (the batch is the same every step,
 * its anchors re-drawn: the PyTorch reference prints its losses and norms alike). A loss or
 * gradient norm that is not finite prints a FAIL line, and the exit status is then 1.
 * BENCH_SEED=N (default 0) draws other tables, drafter weights and anchors (the reference's
 *   --seed N likewise), so that several draws of each show how far the curve's end spreads.
 * Lines, machine-readable: RESULT case=... steps_per_s=... samples_per_s=... mfu=...
 * What-if (BENCH_FREE="SET;SET;...", each SET a comma-separated list of the profile's op names
 *   or of none, attention, optimizer, memory, movers, nonproducts: opprof.h's po_free_parse,
 *   which says why sets with the movers can mislead; the loss shows it): after the
 *   timed steps, the same number of steps again for each SET with its ops left out (their
 *   outputs keep the last real call's values, so the products still run on real data), one
 *   line each: ms and J per step against the run with all ops and against the first SET:
 *   what the step would take if those ops cost nothing, which at the power limit need not be
 *   their time in the profile (on the H200 the attention, norms, RoPE and SwiGLU gave back
 *   90-115% of theirs, the optimizer ~70%: bench/cuda_ops/NOTES.md). The model keeps
 *   training through a set unless the optimizer is left out, and the board's draw follows the
 *   data (a model whose loss has gone back to ~12 ran 3 ms faster per step): put "optimizer"
 *   in every SET, first alone, so that every set runs the same weights and steps, and end
 *   with it again to see the drift.
 */
#include "monotime.h"
#include "ops.h"
#include "rng.h"

#ifdef DFLASH_HAVE_CUDA
#include "dflash_model.h"
#include "dflash_task.h"
#include "dflash_train.h"
#include "ops_cuda.h"

#include <cuda_runtime_api.h>

#include "../target/energy.h"
#include "../target/opprof.h"
#include "../target/gemm_peak.h"
#include "step_flops.h"
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
    printf("bench-drafter: built without CUDA\n");
    return 77;
}
#else

static const nn_ops *O;
static nn_ctx *C;
static bench_energy g_energy; /* the board's counter (energy.h); none: rows say n/a */

static uint64_t rs = RNG_GOLDEN; /* rng.h's stream state */
/* BENCH_SEED: N != 0 draws other tables (rs), drafter weights (init seed N + 1; 1 by default)
 * and anchors (train seed N) */
static uint64_t g_seed;

/* n act-typed values on the device: normal with sd scale, or uniform in [-scale, scale)
 * (dflash_task_table: every value drawn afresh. Until 2026-12-02 one 2^24-value chunk was drawn
 * and uploaded again and again, so the embedding and lm_head rows repeated every 4,096 tokens:
 * 37 tokens shared each logit, and no training could bring the loss under ln 37 = 3.61; and
 * then, for a few hours, a single-precision Box-Muller took the logarithm of values that rounded
 * above 1, putting ~60 NaNs in each table; bench/cuda_ops/NOTES.md.) */
static void *act_rand(size_t n, double scale, int normal) {
    void *p = dflash_task_table(O, C, &rs, n, scale, normal);
    if (!p) {
        fprintf(stderr, "bench-drafter: out of device memory\n");
        exit(2);
    }
    return p;
}

enum { D = 4096, NF = 5, V = 151936, H = 32, HK = 8, HD = 128, FF = 12288, BS = 16 };
static int g_tune = 8;   /* cuBLASLt candidates per matmul shape (dflash_model_tune) */
static int g_steps = 10; /* timed steps per case */

/* The timed steps' losses, gradient norms and accuracies, printed after the row ("curve:
 * ..."): with the reference's random draws and recipe, the two benches should learn alike */
enum { CURVE_MAX = 64 };
static double g_curve[CURVE_MAX][3];
static int g_curve_n, g_curve_steps; /* kept, and collected (every step is checked) */
static int g_first_bad = -1;         /* the case's first step with a non-finite loss or norm */
static bool g_failed; /* a case with a non-finite loss or gradient norm, or allocating in its timed
                       * steps: exit status 1 */
static void curve_add(const dflash_metrics *met) {
    if (g_first_bad < 0 && !(isfinite(met->loss) && isfinite(met->grad_norm)))
        g_first_bad = g_curve_steps;
    g_curve_steps++;
    if (g_curve_n < CURVE_MAX) {
        g_curve[g_curve_n][0] = met->loss, g_curve[g_curve_n][1] = met->grad_norm;
        g_curve[g_curve_n][2] = met->accuracy;
        g_curve_n++;
    }
}
/* The last step's accuracy at each block offset and its acceptance length: where a curve
 * stalls, which offsets it leaves behind */
static void offsets_print(const dflash_metrics *met) {
    printf("last step: accept length %.2f, accuracy by offset:", met->accept_len);
    for (int o = 1; o < BS && o < DFLASH_MAX_BLOCK; o++)
        printf(" %d:%.2f", o, met->pos_acc[o]);
    printf("\n");
}

static void curve_print(void) {
    printf("curve (loss/grad norm/accuracy per timed step):");
    for (int i = 0; i < g_curve_n; i++)
        printf(" %.3f/%.2f/%.2f", g_curve[i][0], g_curve[i][1], g_curve[i][2]);
    printf("\n");
}

/* BENCH_FREE (see the header): the op sets, as written and as opprof.h masks */
enum { FREE_MAX = 16 };
static char g_free_set[FREE_MAX][128];
static unsigned g_free_mask[FREE_MAX];
static int g_n_free;

/* A case's first non-finite loss or gradient norm in the timed steps just run: FAIL line and
 * exit status 1 */
static void curve_check(const char *name) {
    if (g_first_bad < 0) return;
    printf("%s: FAIL: timed step %d's loss or gradient norm is not finite\n", name, g_first_bad);
    g_failed = true;
}

typedef struct {
    double sec, flop;          /* per timed step */
    double j0, j1;             /* the board's counter around the steps (< 0: none) */
    double t_queue, t_collect; /* host seconds, all steps */
    long allocs;               /* memory allocations during the steps (ops.h allocs) */
    dflash_metrics met;        /* the last step's */
} timed_run;

/* g_steps training steps queued as the drafter daemon queues them (each step's metrics
 * collected once the next is queued), between stream syncs; the curve collects their metrics */
static void timed_steps(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *v,
                        int T, timed_run *r) {
    const int steps = g_steps;
    g_curve_n = 0, g_curve_steps = 0, g_first_bad = -1;
    r->j0 = bench_energy_j(&g_energy);
    double flop = 0, t0 = monotime_s();
    long allocs0 = O->allocs(C);
    r->t_queue = r->t_collect = 0;
    for (int i = 0; i < steps; i++) {
        double q0 = monotime_s();
        dflash_train_step_async(m, tc, v, 0, (uint64_t)(100 + i));
        r->t_queue += monotime_s() - q0;
        flop += dflash_step_flops(m, T); /* the step just queued: its blocks and rows */
        double c0 = monotime_s();
        if (dflash_train_pending(m) > 1 && dflash_train_collect(m, &r->met) == 1)
            curve_add(&r->met);
        r->t_collect += monotime_s() - c0;
    }
    while (dflash_train_collect(m, &r->met) == 1)
        curve_add(&r->met);
    O->sync(C);
    r->sec = (monotime_s() - t0) / steps, r->j1 = bench_energy_j(&g_energy);
    r->allocs = O->allocs(C) - allocs0;
    r->flop = flop / steps;
}

static void run_case(const char *name, int layers, int n_seqs, int S, int anchors, double peak,
                     const void *emb, const void *lm) {
    int T = n_seqs * S;
    dflash_config cfg;
    char msg[256];
    if (dflash_task_config(&cfg, D, layers, H, HK, FF, NF, V, msg, sizeof msg) != 0) {
        printf("%s: %s\n", name, msg);
        g_failed = true;
        return;
    }
    void *hid = act_rand((size_t)T * NF * D, 1.0, 0);
    dflash_model *m = dflash_model_new(&cfg, O, C, emb, lm, T, n_seqs * anchors, 1 + g_seed);
    if (!m) {
        printf("%s: dflash_model_new failed\n", name);
        g_failed = true;
        O->free(C, hid);
        return;
    }
    double tune0 = monotime_s();
    if (dflash_model_tune(m, g_tune) < 0) {
        printf("%s: matmul tuning failed\n", name);
        g_failed = true;
    }
    printf("%s: matmuls tuned with %d candidates per shape in %.1f s\n", name, g_tune,
           monotime_s() - tune0);
    int32_t *off = malloc(sizeof(int32_t) * (n_seqs + 1)), *ids = malloc(sizeof(int32_t) * T);
    int32_t *pos = malloc(sizeof(int32_t) * T);
    uint8_t *lmask = malloc(T);
    dflash_task_tokens(n_seqs, S, V, off, ids, pos, lmask);
    dflash_batch_view v = {.n_seqs = n_seqs, .seq_off = off, .ids = ids, .positions = pos,
                           .loss_mask = lmask, .hidden = hid, .ld = (size_t)NF * D};
    dflash_train_cfg tc;
    dflash_train_cfg_default(&tc);
    tc.n_anchors = anchors;
    tc.seed = g_seed;
    dflash_metrics met;
    for (int i = 0; i < 3; i++)
        dflash_train_step(m, &tc, &v, 0, (uint64_t)i, &met);
    O->sync(C);
    timed_run r;
    timed_steps(m, &tc, &v, T, &r);
    const int steps = g_steps;
    double sec = r.sec, flop = r.flop;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    double gib = (double)(tot - fr) / (1024.0 * 1024 * 1024);
    double mfu = flop / sec / 1e12 / peak;
    printf("%-16s %d x %d tokens, %d anchors/seq, %d blocks: %.1f ms/step, %.2f steps/s, "
           "%.2f samples/s, %.1f TFLOP/s, MFU %.1f%%, memory in use %.2f GiB, loss %.3f\n",
           name, n_seqs, S, anchors, r.met.n_blocks, sec * 1e3, 1.0 / sec, n_seqs / sec,
           flop / sec / 1e12, 100 * mfu, gib, r.met.loss);
    printf("RESULT case=%s steps_per_s=%.3f samples_per_s=%.3f mfu=%.4f peak_gib=%.2f\n", name,
           1.0 / sec, n_seqs / sec, mfu, gib);
    bench_energy_line(&g_energy, r.j0, r.j1, steps, sec);
    curve_print();
    offsets_print(&r.met);
    curve_check(name);
    /* where the host spent the timed steps: queuing a step should take a few ms, the rest is
     * the wait for the previous step's metrics; a queue time near the step time means the
     * host waited for the stream while queuing (the GPU then ran dry) */
    printf("host per timed step: %.2f ms queuing (dflash_train_step_async), %.2f ms waiting for "
           "the previous step (dflash_train_collect); memory allocations in the timed steps: "
           "%ld\n",
           r.t_queue * 1e3 / steps, r.t_collect * 1e3 / steps, r.allocs);
    if (r.allocs) { /* the memory in use above would then not be the peak */
        printf("%s: FAIL: %ld memory allocations in the timed steps (planned memory: 0)\n", name,
               r.allocs);
        g_failed = true;
    }
    timed_run first = {0}; /* BENCH_FREE: the same steps with ops left out, set by set */
    for (int f = 0; f < g_n_free; f++) {
        po_free = g_free_mask[f];
        timed_run x;
        timed_steps(m, &tc, &v, T, &x);
        po_free = 0;
        if (f == 0) first = x;
        char en[128] = "energy n/a";
        if (r.j0 >= 0 && r.j1 >= 0 && x.j0 >= 0 && x.j1 >= 0) {
            double xj = (x.j1 - x.j0) / steps, rj = (r.j1 - r.j0) / steps;
            double fj = (first.j1 - first.j0) / steps;
            snprintf(en, sizeof en, "%.2f J/step (%+.2f; %+.2f), %.0f W", xj, xj - rj, xj - fj,
                     xj / x.sec);
        }
        printf("%-16s free=%s: %.1f ms/step (%+.1f ms against all ops; %+.1f against free=%s), "
               "%s, loss %.3f\n",
               name, g_free_set[f], x.sec * 1e3, (x.sec - sec) * 1e3, (x.sec - first.sec) * 1e3,
               g_free_set[0], en, x.met.loss);
        curve_check(name);
    }
    fflush(stdout);
    prof_begin();
    double ak = 0, p0 = monotime_s();
    for (int i = 0; i < 2; i++) {
        dflash_train_step(m, &tc, &v, 0, (uint64_t)(200 + i), &met);
        for (int j = 0; j < met.n_blocks; j++)
            ak += (double)BS * (m->h_blk_anchor[j] + BS);
    }
    O->sync(C);
    po_tf[PO_ATTBB] += 8.0 * H * HD * ak * layers; /* dV, dP, dQ, dK (recompute not counted) */
    char title[96];
    snprintf(title, sizeof title, "%s, 2 steps", name);
    prof_end(title, (monotime_s() - p0) * 1e3, PO_ATTB, 4.0 * H * HD * ak * layers);
    dflash_model_destroy(&m);
    O->free(C, hid);
    free(off), free(ids), free(pos), free(lmask);
}

/* The cases: name, packed sequences, tokens per sequence, anchors per sequence. */
static const struct bench_case {
    const char *name;
    int n_seqs, S, anchors;
} CASES[] = {
    {"s3072_a512", 1, 3072, 512}, {"s768_a256", 1, 768, 256}, {"4xs768_a256", 4, 768, 256}};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

/* The comma-separated list's item after the one at p, or NULL. */
static const char *next_item(const char *p) {
    const char *comma = strchr(p, ',');
    return comma ? comma + 1 : NULL;
}

/* The case that the list's item at p names, or -1. */
static int case_at(const char *p) {
    size_t n = strcspn(p, ",");
    for (int i = 0; i < N_CASES; i++)
        if (strlen(CASES[i].name) == n && !strncmp(p, CASES[i].name, n)) return i;
    return -1;
}

/* Whether the comma-separated list names case i (a NULL list names every case). */
static bool case_listed(const char *list, int i) {
    for (const char *p = list; p; p = next_item(p))
        if (case_at(p) == i) return true;
    return list == NULL;
}

/* 0 when every item of the comma-separated list is a case, else -1 after saying which is not. */
static int cases_check(const char *list) {
    for (const char *p = list; p; p = next_item(p))
        if (case_at(p) < 0) {
            fprintf(stderr, "bench-drafter: unknown case \"%.*s\" (cases: %s, %s, %s, all)\n",
                    (int)strcspn(p, ","), p, CASES[0].name, CASES[1].name, CASES[2].name);
            return -1;
        }
    return 0;
}

int main(int argc, char **argv) {
    int layers = argc > 1 ? atoi(argv[1]) : 5;
    const char *only = argc > 2 && strcmp(argv[2], "all") ? argv[2] : NULL; /* NULL: all */
    if (only && cases_check(only) != 0) return 2;
    if (argc > 3) g_tune = atoi(argv[3]);
    if (argc > 4) g_steps = atoi(argv[4]);
    if (g_steps < 1 || g_steps > 100000) {
        fprintf(stderr, "bench-drafter: STEPS must be 1..100000\n");
        return 2;
    }
    const char *seed_env = getenv("BENCH_SEED");
    if (seed_env && *seed_env) {
        char *end;
        g_seed = strtoull(seed_env, &end, 10);
        if (*end || seed_env[0] == '-') {
            fprintf(stderr, "bench-drafter: BENCH_SEED must be a non-negative integer\n");
            return 2;
        }
        if (g_seed) rs = rng_hash64(RNG_GOLDEN ^ g_seed);
    }
    const char *free_env = getenv("BENCH_FREE");
    if (free_env && *free_env) {
        char sets[FREE_MAX * 128], err[160];
        if (strlen(free_env) >= sizeof sets) { /* cut short, a set could name other ops */
            fprintf(stderr, "bench-drafter: BENCH_FREE: more than %zu characters\n",
                    sizeof sets - 1);
            return 2;
        }
        snprintf(sets, sizeof sets, "%s", free_env);
        for (char *save = NULL, *t = strtok_r(sets, ";", &save); t;
             t = strtok_r(NULL, ";", &save)) {
            if (g_n_free == FREE_MAX || strlen(t) >= sizeof g_free_set[0]) {
                fprintf(stderr, "bench-drafter: BENCH_FREE: at most %d sets of < %zu characters\n",
                        FREE_MAX, sizeof g_free_set[0]);
                return 2;
            }
            if (po_free_parse(t, &g_free_mask[g_n_free], err, sizeof err) != 0) {
                fprintf(stderr, "bench-drafter: BENCH_FREE: %s\n", err);
                return 2;
            }
            snprintf(g_free_set[g_n_free++], sizeof g_free_set[0], "%s", t);
        }
    }
    C = nn_cuda_new(0);
    if (!C) {
        fprintf(stderr, "bench-drafter: no CUDA device\n");
        return 77;
    }
    O = prof_ops(nn_cuda_ops(), C);
    int dev = 0;
    cudaGetDevice(&dev);
    bench_energy_open(&g_energy, dev);
    double peak = gemm_peak_tflops(O, C);
    printf("peak (measured 8192^3 bf16 linear_fwd): %.1f TFLOP/s\n", peak);
    void *emb = act_rand((size_t)V * D, DFLASH_TASK_EMBED_SD, 1);
    void *lm = act_rand((size_t)V * D, dflash_task_lm_sd(D), 1);
    for (int i = 0; i < N_CASES; i++)
        if (case_listed(only, i))
            run_case(CASES[i].name, layers, CASES[i].n_seqs, CASES[i].S, CASES[i].anchors, peak,
                     emb, lm);
    printf("RESULT peak_tflops=%.1f\n", peak);
    O->free(C, emb), O->free(C, lm);
    nn_cuda_destroy(&C);
    return g_failed ? 1 : 0;
}
#endif
