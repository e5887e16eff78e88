/* bench-target_parity: the whole target forward (target_model) on the cuda backend against the
 * cpu backend, for small random Qwen3, Qwen2 and Llama (with Llama-3 rope scaling) checkpoints
 * built in-process. Run on the GPU machine (scripts/gpu-bench, ctest -L gpu); exits 1 on any
 * FAIL, 77 (ctest's skip) without CUDA or a visible GPU, 2 when a GPU is there but no context
 * can be made on it.
 *
 * Method: every parameter is drawn from a hash of (tensor name, element index), rounded to bf16,
 * so both backends hold identical values (cpu: fp32, cuda: bf16 storage, fp32 accumulation).
 * Each model runs one packed batch of sequences of different lengths (1, 7, 64, 129, 300, 523
 * tokens; 1024 in all) with positions restarting at 0 per sequence; the captured layers land in
 * a slot-like buffer of row stride n_capture*D + 8 (the 8 pad columns must keep their sentinel,
 * which checks that the strided capture writes only its own columns). Per captured layer the
 * table prints max|a-b| / max|b| ("max rel") and ||a-b|| / ||b|| ("l2 rel").
 * Tolerances (bf16): every activation on the cuda side is rounded to bf16 (2^-9 relative) and
 * the error grows with depth through the residual stream, so l2 rel <= 2e-2 + 4e-3 * layer and
 * max rel <= 8x that; a second run of the same batch on cuda must be bit-identical to the first
 * (deterministic kernels), and a run with the sequences in another order must give the same
 * rows (packing independence, l2 rel <= 1e-6 on cpu).
 */
#include "ops.h"

#ifdef DFLASH_HAVE_CUDA
#include "ops_cuda.h"
#include "safetensors.h"
#include "target_model.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DFLASH_HAVE_CUDA
int main(void) {
    printf("bench-target_parity: built without CUDA; nothing to compare\n");
    return 77;
}
#else

/* f rounded to the nearest bf16 (ties to even) */
static float bf16r(float f) {
    return safetensors_bf16_to_f32(safetensors_f32_to_bf16(f));
}

static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* deterministic parameters: norms 1 + 0.2 u, biases 0.1 u, embeddings u, linears u / sqrt(K) */
static int fetch(void *user, const char *name, const int64_t *shape, int ndim, float *dst) {
    (void)user;
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    double scale = 1.0, offset = 0.0;
    if (strstr(name, "norm"))
        scale = 0.2, offset = 1.0;
    else if (strstr(name, "bias"))
        scale = 0.1;
    else if (strstr(name, "embed_tokens"))
        scale = 1.0;
    else if (ndim == 2)
        scale = 1.7 / sqrt((double)shape[1]);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(mix(h + i) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        dst[i] = bf16r((float)(offset + scale * u));
    }
    return 0;
}

static int n_fail;

typedef struct batch {
    int n_seqs, T;
    int32_t *ids, *pos, *off;
} batch;

static batch make_batch(const int *lens, int n, int V, uint64_t seed) {
    batch b = {.n_seqs = n};
    for (int i = 0; i < n; i++)
        b.T += lens[i];
    b.ids = malloc(sizeof(int32_t) * b.T), b.pos = malloc(sizeof(int32_t) * b.T);
    b.off = malloc(sizeof(int32_t) * (n + 1));
    b.off[0] = 0;
    for (int s = 0; s < n; s++) {
        b.off[s + 1] = b.off[s] + lens[s];
        for (int t = 0; t < lens[s]; t++) {
            b.ids[b.off[s] + t] = (int32_t)(mix(seed * 1000003u + (uint64_t)s * 7919u + t) % V);
            b.pos[b.off[s] + t] = t;
        }
    }
    return b;
}

static void free_batch(batch *b) {
    free(b->ids), free(b->pos), free(b->off);
}

/* forward on one backend; returns host fp32 [T, ld] */
static float *forward(const nn_ops *O, nn_ctx *C, target_model *m, const batch *b, size_t ld) {
    size_t n = (size_t)b->T * ld;
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = 7.0f; /* sentinel: pad columns must keep it */
    void *out = O->alloc(C, n * O->act_bytes);
    O->upload(C, out, h, n);
    int rc = target_forward_host(m, b->ids, b->pos, b->off, b->n_seqs, b->T, out, ld);
    if (rc) {
        printf("  %s: target_forward_host failed (%d)\n", O->name, rc);
        n_fail++;
    }
    O->download(C, h, out, n);
    O->sync(C);
    O->free(C, out);
    return h;
}

static void compare(const char *what, const float *a, const float *b, int T, size_t ld, int col,
                    int D, double tol) {
    double maxd = 0, maxb = 0, se = 0, sb = 0;
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) {
            double x = a[(size_t)t * ld + (size_t)col * D + c],
                   y = b[(size_t)t * ld + (size_t)col * D + c];
            if (!isfinite(x)) bad = 1;
            double d = fabs(x - y);
            if (d > maxd) maxd = d;
            if (fabs(y) > maxb) maxb = fabs(y);
            se += d * d, sb += y * y;
        }
    double mr = maxb > 0 ? maxd / maxb : maxd, l2 = sb > 0 ? sqrt(se / sb) : sqrt(se);
    int ok = !bad && l2 <= tol && mr <= 8 * tol;
    printf("  %-28s max|b| %9.3f  max rel %.2e  l2 rel %.2e  tol %.1e  %s\n", what, maxb, mr, l2,
           tol, ok ? "ok" : "FAIL");
    if (!ok) n_fail++;
}

static void run_family(const char *label, model_config cfg, const int *ids, int n_ids) {
    printf("== %s: D %d, %d layers, H %d / Hk %d, d %d, F %d, V %d%s%s ==\n", label,
           cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
           cfg.intermediate_size, cfg.vocab_size, cfg.qk_norm ? ", qk_norm" : "",
           cfg.qkv_bias ? ", qkv bias" : "");
    const nn_ops *CO = nn_cpu_ops(), *GO = nn_cuda_ops();
    nn_ctx *CC = nn_cpu_new(0), *GC = nn_cuda_new(0);
    target_model_opts o = {0};
    o.layer_ids = ids, o.n_layer_ids = n_ids, o.max_tokens = 1024, o.max_seqs = 16;
    o.no_head = true;
    target_model *mc = target_model_new(&cfg, &o, CO, CC, fetch, NULL);
    target_model *mg = target_model_new(&cfg, &o, GO, GC, fetch, NULL);
    if (!mc || !mg) {
        printf("  target_model_new failed\n");
        n_fail++;
        goto done;
    }
    static const int lens[] = {1, 7, 64, 129, 300, 523};
    static const int lens_rev[] = {523, 300, 129, 64, 7, 1};
    int ns = (int)(sizeof lens / sizeof lens[0]);
    batch b = make_batch(lens, ns, cfg.vocab_size, 1);
    int D = cfg.hidden_size;
    size_t ld = (size_t)n_ids * D + 8;
    float *hc = forward(CO, CC, mc, &b, ld), *hg = forward(GO, GC, mg, &b, ld);
    float *hg2 = forward(GO, GC, mg, &b, ld);
    for (int j = 0; j < n_ids; j++) {
        char what[64];
        snprintf(what, sizeof what, "layer %d (column %d)", ids[j], j);
        compare(what, hg, hc, b.T, ld, j, D, 2e-2 + 4e-3 * ids[j]);
    }
    size_t pad_bad = 0, nondet = 0;
    for (int t = 0; t < b.T; t++) {
        for (int c = 0; c < 8; c++)
            pad_bad += hc[(size_t)t * ld + (size_t)n_ids * D + c] != 7.0f ||
                       hg[(size_t)t * ld + (size_t)n_ids * D + c] != 7.0f;
    }
    for (size_t i = 0; i < (size_t)b.T * ld; i++)
        nondet += memcmp(&hg[i], &hg2[i], 4) != 0;
    printf("  %-28s %zu pad elements changed  %s\n", "pad columns untouched", pad_bad,
           pad_bad ? "FAIL" : "ok");
    printf("  %-28s %zu elements differ        %s\n", "cuda run twice: identical", nondet,
           nondet ? "FAIL" : "ok");
    n_fail += pad_bad != 0;
    n_fail += nondet != 0;
    /* reversed packing: sequence s of b is sequence ns-1-s of r, same tokens */
    batch r = make_batch(lens_rev, ns, cfg.vocab_size, 2);
    for (int s = 0; s < ns; s++)
        memcpy(r.ids + r.off[ns - 1 - s], b.ids + b.off[s], sizeof(int32_t) * lens[s]);
    float *rc = forward(CO, CC, mc, &r, ld), *rg = forward(GO, GC, mg, &r, ld);
    /* permute back */
    float *pc = malloc(sizeof(float) * b.T * ld), *pg = malloc(sizeof(float) * b.T * ld);
    for (int s = 0; s < ns; s++) {
        memcpy(pc + (size_t)b.off[s] * ld, rc + (size_t)r.off[ns - 1 - s] * ld,
               sizeof(float) * lens[s] * ld);
        memcpy(pg + (size_t)b.off[s] * ld, rg + (size_t)r.off[ns - 1 - s] * ld,
               sizeof(float) * lens[s] * ld);
    }
    compare("cpu: packing order", pc, hc, b.T, ld, n_ids - 1, D, 1e-5);
    compare("cuda: packing order vs cpu", pg, hc, b.T, ld, n_ids - 1, D,
            2e-2 + 4e-3 * ids[n_ids - 1]);
    free(hc), free(hg), free(hg2), free(rc), free(rg), free(pc), free(pg);
    free_batch(&b), free_batch(&r);
done:
    target_model_destroy(&mc);
    target_model_destroy(&mg);
    nn_cpu_destroy(&CC);
    nn_cuda_destroy(&GC);
}

static model_config base(void) {
    model_config c = {0};
    c.family = MODEL_QWEN3;
    c.vocab_size = 1000, c.hidden_size = 256, c.intermediate_size = 704, c.num_layers = 6;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 64, c.max_position_embeddings = 4096;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e6;
    c.bos_token_id = c.eos_token_id = -1;
    return c;
}

int main(void) {
    int gpus = nn_cuda_device_count();
    if (gpus == 0) { /* ctest's skip code, as bench-cuda_parity and test_dp_nccl */
        printf("bench-target_parity: no GPU\n");
        return 77;
    }
    nn_ctx *probe = gpus > 0 ? nn_cuda_new(0) : NULL;
    if (!probe) { /* a GPU that is there but fails (driver, memory) fails the run, no skip */
        fprintf(stderr, "bench-target_parity: no cuda context on GPU 0 (why: above)\n");
        return 2;
    }
    nn_cuda_destroy(&probe);
    int ids6[] = {1, 3, 5}, ids_l[] = {0, 2, 5};
    model_config q3 = base();
    q3.qk_norm = true;
    run_family("qwen3", q3, ids6, 3);
    model_config q2 = base();
    q2.family = MODEL_QWEN2, q2.qkv_bias = true, q2.hidden_size = 256, q2.num_heads = 2;
    q2.num_kv_heads = 1, q2.head_dim = 128, q2.rope_theta = 1e4;
    run_family("qwen2 (head_dim 128, bias)", q2, ids6, 3);
    model_config ll = base();
    ll.family = MODEL_LLAMA, ll.num_heads = 8, ll.num_kv_heads = 8, ll.head_dim = 32;
    ll.rope_theta = 5e5, ll.rope_scaling.enabled = true, ll.rope_scaling.factor = 8.0;
    ll.rope_scaling.low_freq_factor = 1.0, ll.rope_scaling.high_freq_factor = 4.0;
    ll.rope_scaling.original_max_position_embeddings = 256;
    run_family("llama (llama3 rope, MHA)", ll, ids_l, 3);
    printf("bench-target_parity: %s (%d failures)\n", n_fail ? "FAIL" : "all ok", n_fail);
    return n_fail ? 1 : 0;
}
#endif
