/* bench-target: the target forward (capture of layers 1, 9, 17, 25, 33) of a Qwen3-8B-shaped
 * checkpoint on the cuda backend, over a realistic mix of sequence lengths up to 3072 packed into
 * slots of a token budget. bench/target/run.sh runs it together with Hugging Face transformers
 * (bench/target/hf_target_bench.py) on the same lengths and prints the ratio.
 *
 * Usage: bench-target MODEL_DIR [BUDGET=16384] [N_SEQS=160] [LENGTHS_OUT] [UNIFORM_LEN=0]
 *   UNIFORM_LEN > 0: every sequence has that length instead of the mix. The lengths are drawn
 *   from a fixed seed: 20% short (64..511), 45% medium (512..1535), 35% long (1536..3072);
 *   they are packed first-fit (longest first) into slots of BUDGET tokens and written one per
 *   line to LENGTHS_OUT (for the transformers run) when given.
 * Timing: one untimed pass over all slots (warm-up), then 3 timed passes between stream syncs;
 *   the median pass. tokens/s counts real tokens.
 * FLOPs per token (forward, layers 0..33 = 34 layers run, embedding not counted):
 *   2 * (D*H*d + 2*D*Hk*d + H*d*D + 3*D*F) per layer  (q, k, v, o, gate, up, down)
 *   + 4 * H * d * (p + 1) per layer for the causal attention at position p (QK^T and PV).
 * MFU = FLOPs / time / peak, peak = a 8192^3 bf16 linear_fwd through the same cuBLASLt path,
 * measured first in this run. Peak device memory = device memory in use after the timed passes
 * (nothing is allocated in a forward, so this is the peak; includes the CUDA context; the
 * backend's allocation count over the passes is printed, and the bench fails when it is not 0).
 * After the timed passes, one more pass runs with per-op CUDA events (opprof.h) and prints where
 * the GPU time goes. A machine-readable line: RESULT tokens_per_s=... mfu=... peak_gib=...
 */
#include "monotime.h"
#include "ops.h"

#ifdef DFLASH_HAVE_CUDA
#include "ops_cuda.h"
#include "target_model.h"

#include <cuda_runtime_api.h>

#include "opprof.h"
#include "gemm_peak.h"
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef DFLASH_HAVE_CUDA
int main(void) {
    printf("bench-target: built without CUDA\n");
    return 77;
}
#else

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}

static int cmp_desc(const void *a, const void *b) {
    return *(const int *)b - *(const int *)a;
}

typedef struct slot {
    int n_seqs, T;
    int32_t *ids, *pos, *off;
} slot;

int main(int argc, char **argv) {
    const char *usage = "usage: bench-target MODEL_DIR [BUDGET=16384] [N_SEQS=160] [LENGTHS_OUT] "
                        "[UNIFORM_LEN=0]\n";
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *dir = argv[1];
    int budget = argc > 2 ? atoi(argv[2]) : 16384, n_seqs = argc > 3 ? atoi(argv[3]) : 160;
    const char *lengths_out = argc > 4 ? argv[4] : NULL;
    int uniform = argc > 5 ? atoi(argv[5]) : 0;
    if (budget < 3072 || n_seqs < 1 || uniform < 0 || uniform > 3072) {
        fprintf(stderr,
                "bench-target: BUDGET must be >= 3072 (the longest sequence), N_SEQS >= 1, "
                "UNIFORM_LEN 0..3072\n%s",
                usage);
        return 2;
    }
    nn_ctx *C = nn_cuda_new(0);
    if (!C) {
        fprintf(stderr, "bench-target: no CUDA device\n");
        return 77;
    }
    const nn_ops *O = prof_ops(nn_cuda_ops(), C);
    double peak = gemm_peak_tflops(O, C);
    printf("peak (measured 8192^3 bf16 linear_fwd): %.1f TFLOP/s\n", peak);

    /* lengths */
    int *len = malloc(sizeof(int) * n_seqs);
    long total = 0;
    for (int i = 0; i < n_seqs; i++) {
        int u = (int)(rnd() % 100);
        if (u < 20)
            len[i] = 64 + (int)(rnd() % 448);
        else if (u < 65)
            len[i] = 512 + (int)(rnd() % 1024);
        else
            len[i] = 1536 + (int)(rnd() % 1537);
        if (uniform > 0) len[i] = uniform;
        total += len[i];
    }
    qsort(len, n_seqs, sizeof(int), cmp_desc);
    if (lengths_out) {
        FILE *f = fopen(lengths_out, "w");
        if (!f) { /* the transformers run would then time other lengths */
            fprintf(stderr, "bench-target: cannot write %s\n", lengths_out);
            return 1;
        }
        for (int i = 0; i < n_seqs; i++)
            fprintf(f, "%d\n", len[i]);
        fclose(f);
    }
    /* first-fit packing */
    slot *sl = calloc(n_seqs, sizeof(slot));
    int *fill = calloc(n_seqs, sizeof(int)), n_slots = 0, *which = malloc(sizeof(int) * n_seqs);
    for (int i = 0; i < n_seqs; i++) {
        int s = 0;
        while (s < n_slots && fill[s] + len[i] > budget)
            s++;
        if (s == n_slots) n_slots++;
        fill[s] += len[i];
        which[i] = s;
    }
    double flop_total = 0, flop_attn = 0;
    const int LAYERS_RUN = 34;
    for (int s = 0; s < n_slots; s++) {
        slot *p = &sl[s];
        p->ids = malloc(sizeof(int32_t) * fill[s]), p->pos = malloc(sizeof(int32_t) * fill[s]);
        p->off = malloc(sizeof(int32_t) * (n_seqs + 1));
        p->off[0] = 0;
        for (int i = 0; i < n_seqs; i++) {
            if (which[i] != s) continue;
            for (int t = 0; t < len[i]; t++) {
                p->ids[p->T + t] = (int32_t)(rnd() % 151000);
                p->pos[p->T + t] = t;
            }
            p->T += len[i];
            p->off[++p->n_seqs] = p->T;
        }
    }

    int ids[5] = {1, 9, 17, 25, 33};
    target_model_opts o = {0};
    o.layer_ids = ids, o.n_layer_ids = 5, o.max_tokens = budget, o.max_seqs = n_seqs;
    o.no_head = true;
    double t0 = monotime_s();
    target_model *m = target_model_load(dir, &o, O, C);
    if (!m) {
        fprintf(stderr, "bench-target: cannot load %s\n", dir);
        return 2;
    }
    O->sync(C);
    const model_config *cf = target_model_config(m);
    printf("loaded %s in %.1f s: D %d, %d layers (running 34), H %d / Hk %d, d %d, F %d\n", dir,
           monotime_s() - t0, cf->hidden_size, cf->num_layers, cf->num_heads, cf->num_kv_heads,
           cf->head_dim, cf->intermediate_size);
    for (int s = 0; s < n_slots; s++)
        for (int t = 0; t < sl[s].T; t++)
            sl[s].ids[t] %= cf->vocab_size;
    double D = cf->hidden_size, H = cf->num_heads, Hk = cf->num_kv_heads, d = cf->head_dim,
           F = cf->intermediate_size;
    double per_tok = 2.0 * (D * H * d + 2 * D * Hk * d + H * d * D + 3 * D * F);
    for (int i = 0; i < n_seqs; i++) {
        flop_attn += LAYERS_RUN * 4.0 * H * d * (double)len[i] * (len[i] + 1) / 2.0;
        flop_total += LAYERS_RUN * per_tok * len[i];
    }
    flop_total += flop_attn;
    size_t ld = (size_t)5 * cf->hidden_size;
    void *out = O->alloc(C, (size_t)budget * ld * O->act_bytes);
    printf("%d sequences, %ld tokens (mean %.0f, max %d), %d slots of <= %d tokens (fill %.1f%%)\n",
           n_seqs, total, (double)total / n_seqs, len[0], n_slots, budget,
           100.0 * total / ((double)n_slots * budget));
    for (int s = 0; s < n_slots; s++) /* warm-up */
        if (target_forward_host(m, sl[s].ids, sl[s].pos, sl[s].off, sl[s].n_seqs, sl[s].T, out,
                                ld)) {
            fprintf(stderr, "bench-target: forward failed\n");
            return 1;
        }
    O->sync(C);
    double t[3];
    long allocs0 = O->allocs(C);
    int failed = 0; /* a forward that fails in a timed pass voids the pass's time */
    for (int r = 0; r < 3; r++) {
        double a = monotime_s();
        for (int s = 0; s < n_slots; s++)
            failed += target_forward_host(m, sl[s].ids, sl[s].pos, sl[s].off, sl[s].n_seqs,
                                          sl[s].T, out, ld) != 0;
        O->sync(C);
        t[r] = monotime_s() - a;
    }
    if (failed) {
        fprintf(stderr, "bench-target: %d forwards failed in the timed passes\n", failed);
        return 1;
    }
    double lo = t[0] < t[1] ? t[0] : t[1], hi = t[0] < t[1] ? t[1] : t[0];
    double med = t[2] < lo ? lo : (t[2] > hi ? hi : t[2]);
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    double gib = (double)(tot - fr) / (1024.0 * 1024 * 1024);
    double tps = total / med, mfu = flop_total / med / 1e12 / peak;
    long allocs = O->allocs(C) - allocs0;
    printf("ours: pass %.3f s (median of %.3f %.3f %.3f), %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% "
           "of %.1f, device memory in use %.2f GiB, memory allocations in the passes %ld\n",
           med, t[0], t[1], t[2], tps, flop_total / med / 1e12, 100 * mfu, peak, gib, allocs);
    if (allocs) { /* the memory in use above would then not be the peak */
        fprintf(stderr, "bench-target: FAIL: %ld memory allocations in the timed passes\n", allocs);
        return 1;
    }
    printf("RESULT tokens_per_s=%.1f mfu=%.4f peak_gib=%.2f peak_tflops=%.1f\n", tps, mfu, gib,
           peak);
    prof_begin();
    double p0 = monotime_s();
    for (int s = 0; s < n_slots; s++)
        target_forward_host(m, sl[s].ids, sl[s].pos, sl[s].off, sl[s].n_seqs, sl[s].T, out, ld);
    O->sync(C);
    prof_end("one pass over all slots", (monotime_s() - p0) * 1e3, PO_ATTC, flop_attn);
    target_model_destroy(&m);
    O->free(C, out);
    nn_cuda_destroy(&C);
    return 0;
}
#endif
