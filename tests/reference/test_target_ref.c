/* test_target_ref: our target forward (common/nn/target_model.c, cpu backend) against PyTorch.
 *
 * Two modes:
 *   test_target_ref DUMP
 *       CI mode, run by run_reference.sh after target_ref.py wrote DUMP (refdump format: packed
 *       inputs, float64-computed captured layers and last-token logits per family) and the
 *       checkpoints DUMP.models/<family>/. Loads each checkpoint through target_model_load, runs
 *       the packed batch and compares every captured layer token by token, and the last-token
 *       logits of every sequence. Tolerance: for each (token, layer) row and each logits row,
 *       max|ours - ref| / max|ref| <= 1e-4. Exit 0 pass, 1 fail, 2 malformed dump.
 *   test_target_ref --capture MODEL_DIR IN_DUMP OUT_DUMP
 *       Runs our forward on IN_DUMP's seq_off, ids, pos, layer_ids (i32 tensors) and writes
 *       OUT_DUMP with tensors hidden [T, n*D] and logits [n_seqs, V] (f32). hf_target_check.py
 *       uses it to compare with transformers on the GPU machine.
 */
#include "err.h"
#include "log.h"
#include "ops.h"
#include "refdump.h"
#include "target_model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-4

/* One packed batch: inputs and (ours or the reference's) outputs. Pointers are borrowed. */
typedef struct tcase {
    int n_seqs, T, n_layers, D, V;
    const int32_t *seq_off, *ids, *pos, *layer_ids;
    float *hidden; /* [T, n_layers*D] */
    float *logits; /* [n_seqs, V] */
} tcase;

/* Fills c's inputs from tensors <prefix>seq_off, ids, pos, layer_ids of d. */
static void case_inputs(const refdump *d, const char *prefix, tcase *c) {
    char n[256];
    snprintf(n, sizeof n, "%sseq_off", prefix);
    c->n_seqs = refdump_dim(d, n, 0) - 1;
    c->seq_off = refdump_i32(d, n, 0);
    snprintf(n, sizeof n, "%sids", prefix);
    c->T = refdump_dim(d, n, 0);
    c->ids = refdump_i32(d, n, 0);
    snprintf(n, sizeof n, "%spos", prefix);
    c->pos = refdump_i32(d, n, (size_t)c->T);
    snprintf(n, sizeof n, "%slayer_ids", prefix);
    c->n_layers = refdump_dim(d, n, 0);
    c->layer_ids = refdump_i32(d, n, 0);
}

/* A refdump writer for the two tensors of --capture (the format of refdump.py). */
static int write_f32(FILE *f, const char *name, const float *x, int64_t d0, int64_t d1) {
    uint32_t len = (uint32_t)strlen(name), dt[2] = {REFDUMP_F32, 2};
    int64_t dims[2] = {d0, d1};
    return fwrite(&len, 4, 1, f) == 1 && fwrite(name, 1, len, f) == len &&
                   fwrite(dt, 4, 2, f) == 2 && fwrite(dims, 8, 2, f) == 2 &&
                   fwrite(x, 4, (size_t)(d0 * d1), f) == (size_t)(d0 * d1)
               ? 0
               : -1;
}

static int write_outputs(const char *path, const tcase *c) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint32_t hdr[2] = {REFDUMP_VERSION, 2};
    int rc = fwrite(REFDUMP_MAGIC, 1, 8, f) == 8 && fwrite(hdr, 4, 2, f) == 2 ? 0 : -1;
    if (!rc) rc = write_f32(f, "hidden", c->hidden, c->T, (int64_t)c->n_layers * c->D);
    if (!rc) rc = write_f32(f, "logits", c->logits, c->n_seqs, c->V);
    return (fclose(f) == 0 && !rc) ? 0 : -1;
}

/* Runs our model (loaded from model_dir) on c's inputs into c->hidden and c->logits (allocated
 * here, freed by the caller); sets c->D and c->V from the model. */
static int run_ours(const char *model_dir, tcase *c) {
    int S = c->n_seqs, T = c->T, nl = c->n_layers;
    const nn_ops *ops = nn_cpu_ops();
    nn_ctx *ctx = nn_cpu_new(1);
    target_model_opts o = {.layer_ids = c->layer_ids,
                           .n_layer_ids = nl,
                           .max_tokens = T,
                           .max_seqs = S,
                           .max_logit_rows = S,
                           .all_layers = true};
    target_model *m = target_model_load(model_dir, &o, ops, ctx);
    nn_buf *out = NULL;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)S);
    int rc = -1;
    if (!m || !rows) goto done;
    c->D = target_model_config(m)->hidden_size;
    c->V = target_model_config(m)->vocab_size;
    c->hidden = malloc(sizeof(float) * (size_t)T * nl * c->D);
    c->logits = malloc(sizeof(float) * (size_t)S * c->V);
    out = ops->alloc(ctx, sizeof(float) * (size_t)T * nl * c->D);
    if (!out || !c->hidden || !c->logits) goto done;
    rc = target_forward_host(m, c->ids, c->pos, c->seq_off, S, T, out, (size_t)nl * c->D);
    if (rc) {
        fprintf(stderr, "%s: forward failed: %s\n", model_dir, err_str(rc));
        goto done;
    }
    ops->download(ctx, c->hidden, out, (size_t)T * nl * c->D);
    for (int s = 0; s < S; s++)
        rows[s] = c->seq_off[s + 1] - 1;
    rc = target_logits(m, c->ids, c->pos, c->seq_off, S, T, rows, S, c->logits);
    if (rc) fprintf(stderr, "%s: logits failed: %s\n", model_dir, err_str(rc));
done:
    if (ctx) ops->free(ctx, out);
    free(rows);
    target_model_destroy(&m);
    nn_cpu_destroy(&ctx);
    return rc;
}

/* max|a-b| / max|b| over one row of n floats (NaN counts as infinite). */
static double row_rel(const float *a, const float *b, int n) {
    double diff = 0, ref = 0;
    for (int i = 0; i < n; i++) {
        double dd = fabs((double)a[i] - b[i]);
        if (isnan(dd)) dd = INFINITY;
        if (dd > diff) diff = dd;
        if (fabs(b[i]) > ref) ref = fabs(b[i]);
    }
    return diff / (ref > 0 ? ref : 1);
}

static int compare_family(const refdump *d, const char *dump, const char *fam) {
    char mdir[4096], prefix[64], name[128];
    snprintf(mdir, sizeof mdir, "%s.models/%s", dump, fam);
    snprintf(prefix, sizeof prefix, "%s.", fam);
    tcase c = {0};
    case_inputs(d, prefix, &c);
    int fails = 0;
    if (run_ours(mdir, &c)) {
        fails = 1;
        goto out;
    }
    int S = c.n_seqs, T = c.T, nl = c.n_layers, D = c.D, V = c.V;
    snprintf(name, sizeof name, "%shidden", prefix);
    const float *ref_h = refdump_f32(d, name, (size_t)T * nl * D);
    snprintf(name, sizeof name, "%slogits", prefix);
    const float *ref_l = refdump_f32(d, name, (size_t)S * V);
    /* per captured layer, token by token */
    for (int j = 0; j < nl; j++) {
        double worst = 0;
        int worst_t = 0;
        for (int t = 0; t < T; t++) {
            size_t at = (size_t)t * nl * D + (size_t)j * D;
            double rel = row_rel(c.hidden + at, ref_h + at, D);
            if (rel > worst) worst = rel, worst_t = t;
        }
        bool ok = worst <= TOL;
        printf("%s: layer %d: max rel error %.3g over %d tokens (worst token %d) %s\n", fam,
               c.layer_ids[j], worst, T, worst_t, ok ? "ok" : "FAIL");
        fails += !ok;
    }
    double worst = 0;
    for (int s = 0; s < S; s++) {
        double rel = row_rel(c.logits + (size_t)s * V, ref_l + (size_t)s * V, V);
        if (rel > worst) worst = rel;
    }
    bool ok = worst <= TOL;
    printf("%s: last-token logits of %d sequences: max rel error %.3g %s\n", fam, S, worst,
           ok ? "ok" : "FAIL");
    fails += !ok;
out:
    free(c.hidden);
    free(c.logits);
    return fails;
}

int main(int argc, char **argv) {
    log_init("test_target_ref", LOG_WARN);
    if (argc == 5 && strcmp(argv[1], "--capture") == 0) {
        refdump *in = refdump_load(argv[3]);
        if (!in) return 1;
        tcase c = {0};
        case_inputs(in, "", &c);
        int rc = run_ours(argv[2], &c);
        if (!rc) rc = write_outputs(argv[4], &c);
        if (rc) fprintf(stderr, "capture failed\n");
        free(c.hidden);
        free(c.logits);
        refdump_free(&in);
        return rc ? 1 : 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s DUMP\n       %s --capture MODEL_DIR IN_DUMP OUT_DUMP\n", argv[0],
                argv[0]);
        return 2;
    }
    refdump *d = refdump_load(argv[1]);
    if (!d) return 1;
    /* target_ref.py's FAMILIES, then its LAYOUTS (bf16 / f16 weights, shards, real config
     * spellings, tensors never read) */
    static const char *const cases[] = {"qwen3", "qwen2", "llama", "qwen3_bf16_shards",
                                        "qwen2_f16_hub", "llama_v5"};
    int fails = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += compare_family(d, argv[1], cases[i]);
    refdump_free(&d);
    printf("%s\n", fails ? "FAILED" : "all captured layers and logits match the oracle");
    return fails ? 1 : 0;
}
