/* test_target_ref: our target forward (common/nn/target_model.c, cpu backend) against PyTorch.
 *
 * Two modes:
 *   test_target_ref PYTHON target_ref.py
 *       CI mode. Runs the oracle into a temporary directory (it writes, per family, an HF
 *       checkpoint and case.bin with packed inputs and float64-computed expectations), loads each
 *       checkpoint through target_model_load and compares every captured layer token by token,
 *       and the last-token logits of every sequence. Tolerance: for each (token, layer) row,
 *       max|ours - ref| / max|ref| <= 1e-4 (the same for each logits row). Exit 0 pass, 1 fail,
 *       77 (skip, with a message) when the oracle reports that torch is absent.
 *   test_target_ref --capture MODEL_DIR CASE_IN CASE_OUT
 *       Runs our forward on the inputs of CASE_IN (the case.bin format of target_ref.py) and
 *       writes CASE_OUT with our captured layers and logits. hf_target_check.py uses it to compare
 *       against transformers on the GPU machine.
 */
#include "err.h"
#include "log.h"
#include "ops.h"
#include "target_model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CASE_MAGIC 0x52544644
#define CASE_VERSION 1
#define TOL 1e-4

typedef struct tcase {
    int32_t hdr[8]; /* magic, version, n_seqs, T, n_layers, D, V, has_expected */
    int32_t *seq_off, *ids, *pos, *layer_ids;
    float *hidden; /* [T, n_layers*D] */
    float *logits; /* [n_seqs, V] */
} tcase;

static void case_free(tcase *c)
{
    free(c->seq_off);
    free(c->ids);
    free(c->pos);
    free(c->layer_ids);
    free(c->hidden);
    free(c->logits);
    memset(c, 0, sizeof *c);
}

static int read_arr(FILE *f, void *p, size_t elem, size_t n)
{
    return fread(p, elem, n, f) == n ? 0 : -1;
}

static int case_read(const char *path, tcase *c)
{
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    int rc = -1;
    if (read_arr(f, c->hdr, 4, 8) || c->hdr[0] != CASE_MAGIC || c->hdr[1] != CASE_VERSION) {
        fprintf(stderr, "%s: not a version %d case file\n", path, CASE_VERSION);
        goto out;
    }
    int S = c->hdr[2], T = c->hdr[3], nl = c->hdr[4], D = c->hdr[5], V = c->hdr[6];
    if (S < 1 || T < S || nl < 1 || nl > TARGET_MAX_CAPTURE || D < 1 || V < 1) {
        fprintf(stderr, "%s: bad sizes\n", path);
        goto out;
    }
    c->seq_off = malloc(4 * (size_t)(S + 1));
    c->ids = malloc(4 * (size_t)T);
    c->pos = malloc(4 * (size_t)T);
    c->layer_ids = malloc(4 * (size_t)nl);
    c->hidden = malloc(4 * (size_t)T * nl * D);
    c->logits = malloc(4 * (size_t)S * V);
    if (!c->seq_off || !c->ids || !c->pos || !c->layer_ids || !c->hidden || !c->logits) goto out;
    if (read_arr(f, c->seq_off, 4, S + 1) || read_arr(f, c->ids, 4, T) ||
        read_arr(f, c->pos, 4, T) || read_arr(f, c->layer_ids, 4, nl)) {
        fprintf(stderr, "%s: truncated\n", path);
        goto out;
    }
    if (c->hdr[7] && (read_arr(f, c->hidden, 4, (size_t)T * nl * D) ||
                      read_arr(f, c->logits, 4, (size_t)S * V))) {
        fprintf(stderr, "%s: truncated expectations\n", path);
        goto out;
    }
    rc = 0;
out:
    fclose(f);
    if (rc) case_free(c);
    return rc;
}

static int case_write(const char *path, const tcase *c)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int S = c->hdr[2], T = c->hdr[3], nl = c->hdr[4], D = c->hdr[5], V = c->hdr[6];
    int32_t hdr[8];
    memcpy(hdr, c->hdr, sizeof hdr);
    hdr[7] = 1;
    int ok = fwrite(hdr, 4, 8, f) == 8 && fwrite(c->seq_off, 4, S + 1, f) == (size_t)S + 1 &&
             fwrite(c->ids, 4, T, f) == (size_t)T && fwrite(c->pos, 4, T, f) == (size_t)T &&
             fwrite(c->layer_ids, 4, nl, f) == (size_t)nl &&
             fwrite(c->hidden, 4, (size_t)T * nl * D, f) == (size_t)T * nl * D &&
             fwrite(c->logits, 4, (size_t)S * V, f) == (size_t)S * V;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* Runs our model on c's inputs, overwriting c->hidden and c->logits. */
static int run_ours(const char *model_dir, tcase *c)
{
    int S = c->hdr[2], T = c->hdr[3], nl = c->hdr[4], D = c->hdr[5], V = c->hdr[6];
    const nn_ops *ops = nn_cpu_ops();
    nn_ctx *ctx = nn_cpu_new(1);
    target_model_opts o = {.layer_ids = c->layer_ids, .n_layer_ids = nl, .max_tokens = T,
                           .max_seqs = S, .max_logit_rows = S, .all_layers = true};
    target_model *m = target_model_load(model_dir, &o, ops, ctx);
    nn_buf *out = NULL;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)S);
    int rc = -1;
    if (!m || !rows) goto done;
    if (target_model_config(m)->hidden_size != D || target_model_config(m)->vocab_size != V) {
        fprintf(stderr, "%s: hidden/vocab differ from the case file\n", model_dir);
        goto done;
    }
    out = ops->alloc(ctx, sizeof(float) * (size_t)T * nl * D);
    if (!out) goto done;
    rc = target_forward_host(m, c->ids, c->pos, c->seq_off, S, T, out, (size_t)nl * D);
    if (rc) {
        fprintf(stderr, "%s: forward failed: %s\n", model_dir, err_str(rc));
        goto done;
    }
    ops->download(ctx, c->hidden, out, (size_t)T * nl * D);
    for (int s = 0; s < S; s++) rows[s] = c->seq_off[s + 1] - 1;
    rc = target_logits(m, c->ids, c->pos, c->seq_off, S, T, rows, S, c->logits);
    if (rc) fprintf(stderr, "%s: logits failed: %s\n", model_dir, err_str(rc));
done:
    if (ctx) ops->free(ctx, out);
    free(rows);
    target_model_destroy(&m);
    nn_cpu_destroy(&ctx);
    return rc;
}

/* max over rows of max|a-b| / max|b| for rows of n floats; reports the worst row. */
static double worst_rel(const float *a, const float *b, int rows, int n, int *worst_row)
{
    double worst = 0;
    *worst_row = 0;
    for (int r = 0; r < rows; r++) {
        double diff = 0, ref = 0;
        for (int i = 0; i < n; i++) {
            double dd = fabs((double)a[(size_t)r * n + i] - b[(size_t)r * n + i]);
            if (dd > diff || isnan(dd)) diff = isnan(dd) ? INFINITY : dd;
            if (fabs(b[(size_t)r * n + i]) > ref) ref = fabs(b[(size_t)r * n + i]);
        }
        double rel = diff / (ref > 0 ? ref : 1);
        if (rel > worst) {
            worst = rel;
            *worst_row = r;
        }
    }
    return worst;
}

static int compare_family(const char *dir, const char *fam)
{
    char mdir[4096], cpath[4200];
    snprintf(mdir, sizeof mdir, "%s/%s", dir, fam);
    snprintf(cpath, sizeof cpath, "%s/case.bin", mdir);
    tcase ref, ours;
    if (case_read(cpath, &ref)) return 1;
    if (case_read(cpath, &ours)) {
        case_free(&ref);
        return 1;
    }
    int fails = 0;
    if (run_ours(mdir, &ours)) {
        fails++;
        goto out;
    }
    int S = ref.hdr[2], T = ref.hdr[3], nl = ref.hdr[4], D = ref.hdr[5], V = ref.hdr[6];
    /* per captured layer: rows of D inside rows of nl*D, compared token by token */
    for (int j = 0; j < nl; j++) {
        double worst = 0;
        int worst_t = 0;
        for (int t = 0; t < T; t++) {
            int r;
            const float *a = ours.hidden + (size_t)t * nl * D + (size_t)j * D;
            const float *b = ref.hidden + (size_t)t * nl * D + (size_t)j * D;
            double rel = worst_rel(a, b, 1, D, &r);
            if (rel > worst || isnan(rel)) {
                worst = isnan(rel) ? INFINITY : rel;
                worst_t = t;
            }
        }
        bool ok = worst <= TOL;
        printf("%s: layer %d: max rel error %.3g over %d tokens (worst token %d) %s\n", fam,
               ref.layer_ids[j], worst, T, worst_t, ok ? "ok" : "FAIL");
        fails += !ok;
    }
    int r;
    double wl = worst_rel(ours.logits, ref.logits, S, V, &r);
    bool ok = wl <= TOL;
    printf("%s: last-token logits of %d sequences: max rel error %.3g (worst sequence %d) %s\n",
           fam, S, wl, r, ok ? "ok" : "FAIL");
    fails += !ok;
out:
    case_free(&ref);
    case_free(&ours);
    return fails;
}

static void remove_tree(const char *dir)
{
    static const char *fams[] = {"qwen3", "qwen2", "llama"};
    static const char *files[] = {"config.json", "model.safetensors", "case.bin"};
    char p[4400];
    for (size_t i = 0; i < 3; i++) {
        for (size_t k = 0; k < 3; k++) {
            snprintf(p, sizeof p, "%s/%s/%s", dir, fams[i], files[k]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/%s", dir, fams[i]);
        rmdir(p);
    }
    rmdir(dir);
}

static int ci_mode(const char *python, const char *script)
{
    char dir[] = "/tmp/test_target_ref.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --out '%s'", python, script, dir);
    int st = system(cmd);
    int code = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
    if (code == 77) {
        printf("SKIPPED: the PyTorch oracle is unavailable (%s has no torch/numpy)\n", python);
        remove_tree(dir);
        return 77;
    }
    if (code != 0) {
        fprintf(stderr, "oracle failed (status %d): %s\n", code, cmd);
        remove_tree(dir);
        return 1;
    }
    int fails = 0;
    fails += compare_family(dir, "qwen3");
    fails += compare_family(dir, "qwen2");
    fails += compare_family(dir, "llama");
    remove_tree(dir);
    printf("%s\n", fails ? "FAILED" : "all captured layers and logits match the oracle");
    return fails ? 1 : 0;
}

static int capture_mode(const char *model_dir, const char *in, const char *out)
{
    tcase c;
    if (case_read(in, &c)) return 1;
    int rc = run_ours(model_dir, &c);
    if (!rc) rc = case_write(out, &c);
    if (rc) fprintf(stderr, "capture failed\n");
    case_free(&c);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    log_init("test_target_ref", LOG_WARN);
    if (argc == 5 && strcmp(argv[1], "--capture") == 0)
        return capture_mode(argv[2], argv[3], argv[4]);
    if (argc == 3) return ci_mode(argv[1], argv[2]);
    fprintf(stderr, "usage: %s PYTHON target_ref.py\n"
                    "       %s --capture MODEL_DIR CASE_IN CASE_OUT\n",
            argv[0], argv[0]);
    return 2;
}
