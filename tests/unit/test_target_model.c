/* test_target_model: the target forward's contract on a tiny random Qwen3 (cpu backend).
 *
 * What a user would notice if it broke:
 *   - default captured layers differ from DFlash's (Qwen3-8B must give [1, 9, 17, 25, 33]; Python
 *     rounds halves to even); ids given by hand out of layer order (the order SGLang and vLLM
 *     capture in) or twice are accepted;
 *   - packing leaks between sequences (a sequence's hidden states change with its neighbours);
 *   - captured columns land in the wrong place of a slot row, or the padding of a wider row is
 *     overwritten;
 *   - the forward runs (and loads) layers deeper than the deepest captured one;
 *   - a checkpoint with a wrong shape or a missing tensor loads anyway;
 *   - a sharded bf16 checkpoint (how real targets ship) loads to other weights than it holds;
 *   - a loaded checkpoint computes something else than the same weights given directly;
 *   - bad token ids, negative positions or oversize batches are accepted;
 *   - a stop requested during a long load is not looked at until the load is done;
 *   - data that fits no bucket is reported without naming the shard file;
 *   - a shard made for another vocabulary (another tokenizer) trains the target's slots;
 *   - more captured layers than a slot records fail with "invalid argument";
 *   - dflash-target's effective configuration shows --hidden / --layers where the model decides;
 *   - an epoch that packs into another number of batches than the target registered makes the
 *     target exit or leaves sequences out of training;
 *   - greedy generation disagrees with the logits (KV-cached and recomputing paths alike), or
 *     sampling is not reproducible from its seed.
 * Correctness against PyTorch is tests/reference/test_target_ref.c.
 */
#include "check.h"

#include "batch_plan.h"
#include "err.h"
#include "hf_config.h"
#include "log.h"
#include "model_producer.h"
#include "ops.h"
#include "safetensors.h"
#include "shard.h"
#include "slot.h"
#include "target_loop.h"
#include "target_model.h"
#include "test_files.h"

#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- deterministic random weights, by tensor name ---- */

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill(const char *name, const int64_t *shape, int ndim, float *dst) {
    uint64_t s = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        s = (s ^ (uint8_t)*p) * 1099511628211ull;
    int64_t n = ndim == 1 ? shape[0] : shape[0] * shape[1];
    bool norm = strstr(name, "norm") != NULL, embed = strstr(name, "embed") != NULL;
    double scale = embed ? 1.0 : (norm ? 0.1 : 1.7 / sqrt((double)shape[ndim - 1]));
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(mix(&s) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
        dst[i] = (float)((norm ? 1.0 : 0.0) + scale * u);
    }
}

typedef struct fetch_log {
    int calls;
    int deepest_layer; /* deepest model.layers.N requested */
    bool head;         /* model.norm or lm_head requested */
} fetch_log;

static int fetch_random(void *user, const char *name, const int64_t *shape, int ndim, float *dst) {
    fetch_log *fl = user;
    if (fl) {
        fl->calls++;
        int layer;
        if (sscanf(name, "model.layers.%d.", &layer) == 1 && layer > fl->deepest_layer)
            fl->deepest_layer = layer;
        if (!strcmp(name, "model.norm.weight") || !strcmp(name, "lm_head.weight")) fl->head = true;
    }
    fill(name, shape, ndim, dst);
    return 0;
}

static model_config tiny_config(void) {
    model_config c;
    hf_config_defaults(&c, MODEL_QWEN3);
    c.vocab_size = 50;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_layers = 4;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 128;
    c.tie_word_embeddings = true;
    c.eos_token_id = 7;
    return c;
}

/* ---- tests ---- */

static void test_default_ids(void) {
    int ids[8];
    CHECK_EQ_INT(target_default_layer_ids(36, 5, ids), 0);
    CHECK(ids[0] == 1 && ids[1] == 9 && ids[2] == 17 && ids[3] == 25 && ids[4] == 33);
    /* L = 30: 1 + i*26/4 = 1, 7.5, 14, 20.5, 27 -> Python round() gives 8 and 20 */
    CHECK_EQ_INT(target_default_layer_ids(30, 5, ids), 0);
    CHECK(ids[0] == 1 && ids[1] == 8 && ids[2] == 14 && ids[3] == 20 && ids[4] == 27);
    CHECK_EQ_INT(target_default_layer_ids(36, 1, ids), 0);
    CHECK_EQ_INT(ids[0], 18);
    /* too shallow for distinct ids, or nonsense */
    CHECK_EQ_INT(target_default_layer_ids(4, 2, ids), DFLASH_EINVAL);
    CHECK_EQ_INT(target_default_layer_ids(36, 0, ids), DFLASH_EINVAL);
}

/* Ids given by hand: ascending and distinct whatever the target (SGLang and vLLM capture the
 * layers as they run), then inside it; DFlash's rule always gives such ids. */
static void test_given_ids(void) {
    char why[256];
    int up[3] = {1, 3, 5}, down[3] = {5, 3, 1}, twice[2] = {1, 1}, deep[2] = {1, 6}, ids[8];
    CHECK_EQ_INT(target_layer_ids_check_order(up, 3, why, sizeof why), 0);
    CHECK_EQ_INT(target_layer_ids_check(up, 3, 6, why, sizeof why), 0);
    CHECK_EQ_INT(target_layer_ids_check_order(down, 3, why, sizeof why), DFLASH_ECONFIG);
    printf("ids 5,3,1: %s\n", why);
    CHECK(strstr(why, "give them in ascending order") != NULL);
    CHECK_EQ_INT(target_layer_ids_check(down, 3, 6, why, sizeof why), DFLASH_ECONFIG);
    CHECK_EQ_INT(target_layer_ids_check_order(twice, 2, why, sizeof why), DFLASH_ECONFIG);
    CHECK(strstr(why, "id 1 given twice") != NULL);
    CHECK_EQ_INT(target_layer_ids_check(deep, 2, 6, why, sizeof why), DFLASH_ECONFIG);
    CHECK(strstr(why, "id 6 outside [0, 6)") != NULL);
    CHECK_EQ_INT(target_capture_layers_parse("1,3,5", ids, 8, NULL, 0), 3);
    CHECK_EQ_INT(target_capture_layers_parse("", ids, 8, NULL, 0), 0);
    CHECK(target_capture_layers_parse("5,3,1", ids, 8, NULL, 0) < 0);
    CHECK(target_capture_layers_parse("1,x", ids, 8, NULL, 0) < 0);
    for (int L = 4; L <= 80; L++)
        for (int n = 1; n <= 8; n++)
            if (target_default_layer_ids(L, n, ids) == 0)
                CHECK_EQ_INT(target_layer_ids_check(ids, n, L, NULL, 0), 0);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
        if (fabs((double)b[i]) > r) r = fabs((double)b[i]);
    }
    return r > 0 ? d / r : d;
}

static void test_captured_layers(const nn_ops *ops, nn_ctx *ctx) {
    model_config c = tiny_config();
    int D = c.hidden_size;
    enum { T = 23, S = 3, PAD = 5 };
    int32_t ids[T], pos[T], off[S + 1] = {0, 9, 10, T};
    for (int t = 0; t < T; t++)
        ids[t] = (t * 7 + 3) % c.vocab_size;
    for (int s = 0; s < S; s++)
        for (int t = off[s]; t < off[s + 1]; t++)
            pos[t] = t - off[s];

    /* capture [0, 2] of 4 layers into rows of 2*D + PAD: only layers 0..2 are ever loaded;
     * [2, 0], out of layer order, is refused */
    fetch_log fl = {0, -1, false};
    int cap[2] = {2, 0};
    target_model_opts o = {.layer_ids = cap, .n_layer_ids = 2, .max_tokens = 32};
    log_set_level(LOG_FATAL);
    CHECK(target_model_new(&c, &o, ops, ctx, fetch_random, &fl) == NULL);
    log_set_level(LOG_WARN);
    cap[0] = 0, cap[1] = 2;
    target_model *m = target_model_new(&c, &o, ops, ctx, fetch_random, &fl);
    CHECK(m != NULL);
    if (!m) return;
    CHECK_EQ_INT(fl.deepest_layer, 2);
    size_t ld = 2 * (size_t)D + PAD;
    float *out = ops->alloc(ctx, sizeof(float) * T * ld);
    for (size_t i = 0; i < T * ld; i++)
        out[i] = 12345.0f;
    CHECK_EQ_INT(target_forward_host(m, ids, pos, off, S, T, out, ld), 0);
    bool pad_ok = true;
    for (int t = 0; t < T; t++)
        for (int i = 2 * D; i < (int)ld; i++)
            pad_ok &= out[t * ld + i] == 12345.0f;
    CHECK(pad_ok);

    /* same model, capturing [0] and [2] separately with contiguous rows: the columns of the
     * strided run are exactly these, in list (layer) order */
    int only0 = 0, only2 = 2;
    fetch_log fl0 = {0, -1, false};
    target_model_opts o0 = {
        .layer_ids = &only0, .n_layer_ids = 1, .max_tokens = 32, .no_head = true};
    target_model *m0 = target_model_new(&c, &o0, ops, ctx, fetch_random, &fl0);
    target_model_opts o2 = {.layer_ids = &only2, .n_layer_ids = 1, .max_tokens = 32};
    target_model *m2 = target_model_new(&c, &o2, ops, ctx, fetch_random, NULL);
    CHECK(m0 && m2);
    if (!m0 || !m2) goto out;
    CHECK_EQ_INT(fl0.deepest_layer, 0);
    CHECK(!fl0.head && fl.head); /* no_head skips model.norm and lm_head, capture is unchanged */
    CHECK(target_model_lm_head(m0) == NULL && target_model_lm_head(m) != NULL);
    float h0[T * 32], h2[T * 32];
    CHECK_EQ_INT(target_forward_host(m0, ids, pos, off, S, T, h0, D), 0);
    CHECK_EQ_INT(target_forward_host(m2, ids, pos, off, S, T, h2, D), 0);
    bool cols_ok = true;
    for (int t = 0; t < T; t++) {
        cols_ok &= memcmp(out + t * ld, h0 + t * D, sizeof(float) * D) == 0;
        cols_ok &= memcmp(out + t * ld + D, h2 + t * D, sizeof(float) * D) == 0;
    }
    CHECK(cols_ok);
    /* layer 2 differs from layer 0 (the test would be blind otherwise) */
    CHECK(max_rel(h0, h2, T * D) > 1e-2);

    /* packing: each sequence alone gives the same rows as inside the packed batch */
    for (int s = 0; s < S; s++) {
        int n = off[s + 1] - off[s];
        int32_t one_off[2] = {0, n};
        float alone[T * 32];
        CHECK_EQ_INT(target_forward_host(m2, ids + off[s], pos + off[s], one_off, 1, n, alone, D),
                     0);
        double e = max_rel(alone, h2 + off[s] * D, (size_t)n * D);
        if (e > 1e-5) fprintf(stderr, "sequence %d alone vs packed: rel error %g\n", s, e);
        CHECK(e <= 1e-5);
    }
    /* and a sequence does see its own past: changing its first token changes its last row */
    int32_t ids_b[T];
    memcpy(ids_b, ids, sizeof ids);
    ids_b[off[2]] = (ids_b[off[2]] + 1) % c.vocab_size;
    float hb[T * 32];
    CHECK_EQ_INT(target_forward_host(m2, ids_b, pos, off, S, T, hb, D), 0);
    CHECK(max_rel(hb + (T - 1) * D, h2 + (T - 1) * D, D) > 1e-4);
    CHECK(memcmp(hb, h2, sizeof(float) * off[2] * D) == 0); /* earlier sequences untouched */

    /* bad input is refused (the model logs why; silenced here) */
    log_set_level(LOG_FATAL);
    int32_t bad[T];
    memcpy(bad, ids, sizeof ids);
    bad[4] = c.vocab_size;
    CHECK_EQ_INT(target_forward_host(m2, bad, pos, off, S, T, h2, D), DFLASH_ERANGE);
    CHECK_EQ_INT(target_forward_host(m2, ids, pos, off, S, 33, h2, D), DFLASH_EINVAL);
    int32_t bad_off[S + 1] = {0, 9, 9, T};
    CHECK_EQ_INT(target_forward_host(m2, ids, pos, bad_off, S, T, h2, D), DFLASH_EINVAL);
    CHECK_EQ_INT(target_forward_host(m2, ids, pos, off, S, T, h2, D - 1), DFLASH_EINVAL);
    /* a negative position (a corrupt slot or a caller's bug) is refused, not rotated by RoPE
     * into some hidden state */
    int32_t bad_pos[T];
    memcpy(bad_pos, pos, sizeof bad_pos);
    bad_pos[T - 1] = -1;
    CHECK_EQ_INT(target_forward_host(m2, ids, bad_pos, off, S, T, h2, D), DFLASH_EINVAL);
    /* logits need every layer */
    int32_t row = 0;
    float lg[64];
    CHECK(target_logits(m2, ids, pos, off, S, T, &row, 1, lg) != 0);
    log_set_level(LOG_WARN);
out:
    ops->free(ctx, out);
    target_model_destroy(&m);
    target_model_destroy(&m0);
    target_model_destroy(&m2);
    CHECK(m == NULL);
}

/* Writes c's checkpoint with fill() weights: F32 or BF16, in one file or split over two shards
 * with a model.safetensors.index.json; bare: the names without their "model." prefix (a base
 * model saved without the causal-LM wrapper). */
static int write_checkpoint_ex(const char *dir, const model_config *c, bool bf16, bool sharded,
                               bool bare) {
    int rc = hf_config_write(dir, c, bf16 ? "bfloat16" : "float32");
    if (rc) return rc;
    size_t n = hf_weight_count(c), half = sharded ? n / 2 : n;
    const char *fname[2] = {sharded ? "model-00001-of-00002.safetensors" : "model.safetensors",
                            "model-00002-of-00002.safetensors"};
    void **data = calloc(n, sizeof *data);
    const char **names = calloc(n, sizeof *names), **files = calloc(n, sizeof *files);
    hf_weight_desc *desc = calloc(n, sizeof *desc);
    uint64_t total = 0;
    for (int f = 0; f < (sharded ? 2 : 1) && !rc; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, fname[f]);
        safetensors_writer *w = safetensors_writer_new(path);
        for (size_t i = f ? half : 0; i < (f ? n : half) && !rc; i++) {
            hf_weight_desc *d = &desc[i];
            hf_weight_nth(c, i, d);
            size_t ne = (size_t)(d->ndim == 1 ? d->shape[0] : d->shape[0] * d->shape[1]);
            float *x = malloc(sizeof(float) * ne);
            fill(d->name, d->shape, d->ndim, x);
            if (bf16) {
                uint16_t *h = malloc(sizeof(uint16_t) * ne);
                for (size_t k = 0; k < ne; k++)
                    h[k] = safetensors_f32_to_bf16(x[k]);
                free(x);
                data[i] = h;
            } else {
                data[i] = x;
            }
            if (bare && strncmp(d->name, "model.", 6) == 0) memmove(d->name, d->name + 6,
                                                                     strlen(d->name + 6) + 1);
            names[i] = d->name;
            files[i] = fname[f];
            total += ne * (bf16 ? 2 : 4);
            rc = safetensors_writer_add(w, d->name, bf16 ? SAFETENSORS_BF16 : SAFETENSORS_F32,
                                        d->ndim, d->shape, data[i]);
        }
        if (!rc) rc = safetensors_writer_commit(w);
        safetensors_writer_destroy(&w);
    }
    if (!rc && sharded) rc = safetensors_write_index(dir, names, files, n, total);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
    free(data);
    free(names);
    free(files);
    free(desc);
    return rc;
}

static int write_checkpoint(const char *dir, const model_config *c) {
    return write_checkpoint_ex(dir, c, false, false, false);
}

/* fetch_random rounded through bf16, what a bf16 checkpoint of the same weights holds */
static int fetch_random_bf16(void *user, const char *name, const int64_t *shape, int ndim,
                             float *dst) {
    (void)user;
    fill(name, shape, ndim, dst);
    int64_t n = ndim == 1 ? shape[0] : shape[0] * shape[1];
    for (int64_t i = 0; i < n; i++)
        dst[i] = safetensors_bf16_to_f32(safetensors_f32_to_bf16(dst[i]));
    return 0;
}

/* A sharded bf16 checkpoint (the form real targets ship in) loads to exactly the bf16-rounded
 * weights. */
static void test_load_sharded_bf16(const nn_ops *ops, nn_ctx *ctx) {
    char dir[] = "/tmp/test_target_bf16.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    model_config c = tiny_config();
    CHECK_EQ_INT(write_checkpoint_ex(dir, &c, true, true, false), 0);
    enum { T = 9 };
    int32_t ids[T], pos[T], off[2] = {0, T};
    for (int t = 0; t < T; t++)
        ids[t] = (3 * t + 2) % c.vocab_size, pos[t] = t;
    int cap = 3;
    target_model_opts o = {.layer_ids = &cap, .n_layer_ids = 1, .max_tokens = T};
    target_model *file = target_model_load(dir, &o, ops, ctx);
    target_model *direct = target_model_new(&c, &o, ops, ctx, fetch_random_bf16, NULL);
    target_model *unrounded = target_model_new(&c, &o, ops, ctx, fetch_random, NULL);
    CHECK(file && direct && unrounded);
    if (file && direct && unrounded) {
        float a[T * 32], b[T * 32], u[T * 32];
        CHECK_EQ_INT(target_forward_host(file, ids, pos, off, 1, T, a, 32), 0);
        CHECK_EQ_INT(target_forward_host(direct, ids, pos, off, 1, T, b, 32), 0);
        CHECK_EQ_INT(target_forward_host(unrounded, ids, pos, off, 1, T, u, 32), 0);
        CHECK(memcmp(a, b, sizeof a) == 0);
        CHECK(memcmp(a, u, sizeof a) != 0); /* the rounding is real, so the check can fail */
    }
    target_model_destroy(&file);
    target_model_destroy(&direct);
    target_model_destroy(&unrounded);
    const char *files[] = {"config.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "model.safetensors.index.json"};
    char p[600];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* A backend's head limits (nn_ops.max_head_dim, max_q_per_kv: the cuda backend's 256 and 64)
 * refuse a target when it is made, naming the limit; within them it is made as before. */
static void test_head_limits(const nn_ops *ops, nn_ctx *ctx) {
    model_config c = tiny_config(); /* head_dim 8, 4 heads over 2 kv heads */
    int cap[1] = {1};
    target_model_opts o = {.layer_ids = cap, .n_layer_ids = 1, .max_tokens = 8};
    nn_ops limited = *ops;
    limited.name = "limited";
    limited.max_head_dim = 8;
    limited.max_q_per_kv = 2;
    target_model *m = target_model_new(&c, &o, &limited, ctx, fetch_random, NULL);
    CHECK(m != NULL);
    target_model_destroy(&m);
    const struct {
        int head_dim, kv_heads;
        const char *said;
    } bad[2] = {{10, 2, "the limited backend's attention takes head_dim up to 8 (this model: 10)"},
                {8, 1, "takes up to 2 query heads per kv head (this model: 4 heads over 1 kv"}};
    for (int i = 0; i < 2; i++) {
        model_config b = c;
        b.head_dim = bad[i].head_dim;
        b.num_kv_heads = bad[i].kv_heads;
        test_capture cap_log = test_capture_begin();
        m = target_model_new(&b, &o, &limited, ctx, fetch_random, NULL);
        char *said = test_capture_end(&cap_log);
        CHECK(m == NULL);
        CHECK(said && strstr(said, bad[i].said));
        if (said && !strstr(said, bad[i].said)) fprintf(stderr, "  log was: %s\n", said);
        free(said);
        target_model_destroy(&m);
    }
    /* the cpu backend has none */
    CHECK(ops->max_head_dim == 0 && ops->max_q_per_kv == 0);
    /* kv heads that do not divide the heads are refused by the model itself, whoever made the
     * config (hf_config_validate guards only configs read from a file): GQA would map query
     * heads 3 and up to kv heads past the last */
    model_config g = c;
    g.num_kv_heads = 3;
    test_capture gqa_log = test_capture_begin();
    m = target_model_new(&g, &o, ops, ctx, fetch_random, NULL);
    char *gqa_said = test_capture_end(&gqa_log);
    CHECK(m == NULL);
    CHECK(gqa_said && strstr(gqa_said, "inconsistent config") && strstr(gqa_said, "kv_heads 3"));
    free(gqa_said);
    target_model_destroy(&m);
}

static void test_load(const nn_ops *ops, nn_ctx *ctx) {
    char dir[] = "/tmp/test_target_model.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    model_config c = tiny_config();
    c.tie_word_embeddings = false; /* lm_head from the file */
    CHECK_EQ_INT(write_checkpoint(dir, &c), 0);

    enum { T = 11 };
    int32_t ids[T], pos[T], off[2] = {0, T};
    for (int t = 0; t < T; t++)
        ids[t] = (5 * t + 1) % c.vocab_size, pos[t] = t;
    int cap[2] = {1, 3};
    target_model_opts o = {.layer_ids = cap,
                           .n_layer_ids = 2,
                           .max_tokens = 16,
                           .max_logit_rows = 2,
                           .all_layers = true};
    target_model *file = target_model_load(dir, &o, ops, ctx);
    target_model *direct = target_model_new(&c, &o, ops, ctx, fetch_random, NULL);
    CHECK(file && direct);
    if (file && direct) {
        float a[T * 64], b[T * 64], la[2 * 50], lb[2 * 50];
        int32_t rows[2] = {3, T - 1};
        CHECK_EQ_INT(target_forward_host(file, ids, pos, off, 1, T, a, 64), 0);
        CHECK_EQ_INT(target_forward_host(direct, ids, pos, off, 1, T, b, 64), 0);
        CHECK(memcmp(a, b, sizeof a) == 0);
        CHECK_EQ_INT(target_logits(file, ids, pos, off, 1, T, rows, 2, la), 0);
        CHECK_EQ_INT(target_logits(direct, ids, pos, off, 1, T, rows, 2, lb), 0);
        CHECK(memcmp(la, lb, sizeof la) == 0);
        CHECK(target_model_lm_head(file) != target_model_embed_tokens(file));
    }
    target_model_destroy(&file);
    target_model_destroy(&direct);

    /* the same tensors under a config that expects another intermediate size: refused */
    model_config wrong = c;
    wrong.intermediate_size = 40;
    CHECK_EQ_INT(hf_config_write(dir, &wrong, "float32"), 0);
    log_set_level(LOG_FATAL); /* the expected error lines would only clutter the output */
    CHECK(target_model_load(dir, &o, ops, ctx) == NULL);
    /* a Qwen2 config needs q/k/v biases the file lacks: refused */
    model_config q2 = c;
    q2.family = MODEL_QWEN2;
    q2.qk_norm = false;
    q2.qkv_bias = true;
    q2.head_dim = q2.hidden_size / q2.num_heads;
    CHECK_EQ_INT(hf_config_write(dir, &q2, "float32"), 0);
    CHECK(target_model_load(dir, &o, ops, ctx) == NULL);
    log_set_level(LOG_WARN);
    /* a bare base model's names (no "model." prefix): refused, and the error says why */
    CHECK_EQ_INT(write_checkpoint_ex(dir, &c, false, false, true), 0);
    test_capture cap_log = test_capture_begin();
    CHECK(target_model_load(dir, &o, ops, ctx) == NULL);
    char *said = test_capture_end(&cap_log);
    CHECK(said && strstr(said, "it holds embed_tokens.weight: the weights of a bare base model"));
    if (said && !strstr(said, "bare base model")) fprintf(stderr, "  log was: %s\n", said);
    free(said);

    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static void test_generate(const nn_ops *ops, nn_ctx *ctx) {
    model_config c = tiny_config();
    c.tie_word_embeddings = false; /* tied random embeddings make every token repeat itself */
    int cap1 = 1;
    target_model_opts o = {.layer_ids = &cap1,
                           .n_layer_ids = 1,
                           .max_tokens = 64,
                           .max_logit_rows = 3,
                           .all_layers = true};
    target_model *m = target_model_new(&c, &o, ops, ctx, fetch_random, NULL);
    CHECK(m != NULL);
    if (!m) return;
    int32_t a[20] = {3, 14, 15}, b[20] = {9}, c2[20] = {3, 14, 15};
    int32_t *seqs[3] = {a, b, c2};
    int len[3] = {3, 1, 3}, cap[3] = {20, 20, 5};
    CHECK_EQ_INT(target_generate(m, seqs, len, cap, 3, 6, NULL, 0, 0.0f, NULL), 0);
    CHECK_EQ_INT(len[0], 9);
    CHECK_EQ_INT(len[1], 7);
    CHECK_EQ_INT(len[2], 5);                        /* stopped by its capacity */
    CHECK(memcmp(a, c2, sizeof(int32_t) * 5) == 0); /* same prompt, same greedy tokens */

    /* greedy token k is the argmax of the logits of the prefix before it */
    bool greedy_ok = true;
    for (int k = 3; k < 9; k++) {
        int32_t pos[20], off[2] = {0, k}, row = k - 1;
        for (int i = 0; i < k; i++)
            pos[i] = i;
        float lg[50];
        CHECK_EQ_INT(target_logits(m, a, pos, off, 1, k, &row, 1, lg), 0);
        int best = 0;
        for (int v = 1; v < c.vocab_size; v++)
            if (lg[v] > lg[best]) best = v;
        greedy_ok &= best == a[k];
    }
    CHECK(greedy_ok);

    /* A model without room for the KV cache (45 cache rows > 40 tokens) recomputes every step
     * instead; both paths produce the same greedy continuations. */
    target_model_opts o2 = o;
    o2.max_tokens = 40;
    target_model *rm = target_model_new(&c, &o2, ops, ctx, fetch_random, NULL);
    CHECK(rm != NULL);
    if (rm) {
        int32_t ra[20] = {3, 14, 15}, rb[20] = {9}, rc2[20] = {3, 14, 15};
        int32_t *rs[3] = {ra, rb, rc2};
        int rlen[3] = {3, 1, 3};
        CHECK_EQ_INT(target_generate(rm, rs, rlen, cap, 3, 6, NULL, 0, 0.0f, NULL), 0);
        CHECK(rlen[0] == len[0] && rlen[1] == len[1] && rlen[2] == len[2]);
        CHECK(memcmp(ra, a, sizeof(int32_t) * 9) == 0);
        CHECK(memcmp(rb, b, sizeof(int32_t) * 7) == 0);
        CHECK(memcmp(rc2, c2, sizeof(int32_t) * 5) == 0);
        target_model_destroy(&rm);
    }

    /* sampling: reproducible from the seed, ids in range, eos stops and is kept */
    int32_t s1[40] = {1, 2}, s2[40] = {1, 2};
    int32_t *p1 = s1, *p2 = s2;
    int l1 = 2, l2 = 2, cp = 40;
    uint64_t r1 = 99, r2 = 99;
    CHECK_EQ_INT(target_generate(m, &p1, &l1, &cp, 1, 30, NULL, 0, 1.5f, &r1), 0);
    CHECK_EQ_INT(target_generate(m, &p2, &l2, &cp, 1, 30, NULL, 0, 1.5f, &r2), 0);
    CHECK_EQ_INT(l1, 32);
    CHECK(l1 == l2 && memcmp(s1, s2, sizeof s1) == 0);
    bool range_ok = true;
    for (int i = 0; i < l1; i++)
        range_ok &= s1[i] >= 0 && s1[i] < c.vocab_size;
    CHECK(range_ok);
    int first_eos = -1;
    for (int i = 2; i < l1 && first_eos < 0; i++)
        if (s1[i] == s1[5]) first_eos = i;
    /* replay with eos = the token sampled at index 5: stops right after its first occurrence;
     * as the second of two eos ids (Llama-3 Instruct's list), the same */
    int32_t s3[40] = {1, 2};
    int32_t *p3 = s3;
    int l3 = 2;
    uint64_t r3 = 99;
    CHECK_EQ_INT(target_generate(m, &p3, &l3, &cp, 1, 30, &s1[5], 1, 1.5f, &r3), 0);
    CHECK_EQ_INT(l3, first_eos + 1);
    int32_t eos2[2] = {c.vocab_size + 1, s1[5]}; /* the first never sampled */
    l3 = 2, r3 = 99;
    CHECK_EQ_INT(target_generate(m, &p3, &l3, &cp, 1, 30, eos2, 2, 1.5f, &r3), 0);
    CHECK_EQ_INT(l3, first_eos + 1);
    target_model_destroy(&m);
}

/* Writes a shard of n sequences of the given lengths, ids below vocab; the last one's last id is
 * vocab + 3 when big_ids. The shard records the vocabulary recorded (0 = unknown). */
static int write_shard(const char *path, const uint32_t *lens, int n, int vocab, bool big_ids,
                       uint32_t recorded) {
    shard_writer *w = shard_writer_new(path, recorded);
    int rc = w ? 0 : DFLASH_ENOMEM;
    for (int s = 0; s < n && !rc; s++) {
        int32_t ids[64];
        uint8_t mask[64];
        for (uint32_t i = 0; i < lens[s]; i++) {
            ids[i] = (int32_t)((i * 13 + (uint32_t)s * 7 + 1) % (uint32_t)vocab);
            mask[i] = i >= lens[s] / 4;
        }
        if (big_ids && s == n - 1) ids[lens[s] - 1] = vocab + 3;
        rc = shard_writer_add(w, ids, mask, lens[s]);
    }
    if (!rc) rc = shard_writer_commit(w);
    shard_writer_destroy(&w);
    return rc;
}

/* The target daemon's producer: work unit -> slot, checked against the shard, the batch plan and
 * a direct forward of the same packed batch. */
static void test_producer(const nn_ops *ops, nn_ctx *ctx) {
    char dir[] = "/tmp/test_target_producer.XXXXXX", shard_path[600], bad_path[600];
    char other_path[600];
    CHECK(mkdtemp(dir) != NULL);
    model_config c = tiny_config();
    CHECK_EQ_INT(write_checkpoint(dir, &c), 0);
    enum { N = 9 };
    const uint32_t lens[N] = {3, 9, 14, 5, 20, 2, 11, 24, 7};
    snprintf(shard_path, sizeof shard_path, "%s/data.shard", dir);
    snprintf(bad_path, sizeof bad_path, "%s/bad.shard", dir);
    snprintf(other_path, sizeof other_path, "%s/other.shard", dir);
    CHECK_EQ_INT(write_shard(shard_path, lens, N, c.vocab_size, false, (uint32_t)c.vocab_size), 0);
    CHECK_EQ_INT(write_shard(bad_path, lens, N, c.vocab_size, true, 0), 0);
    /* made for another tokenizer (every id fits this model's, as Llama-3 data on Qwen3) */
    CHECK_EQ_INT(write_shard(other_path, lens, N, c.vocab_size, false, 2 * (uint32_t)c.vocab_size),
                 0);

    const uint32_t bounds[2] = {8, 24};
    int cap[2] = {0, 2};
    volatile sig_atomic_t stop = 0; /* the daemon's stop flag */
    model_producer_opts po = {.model_dir = dir,
                              .shards = shard_path,
                              .bucket_bounds = bounds,
                              .n_buckets = 2,
                              .token_budget = 32,
                              .max_seqs = 4,
                              .seed = 7,
                              .layer_ids = cap,
                              .n_layer_ids = 2,
                              .stop = &stop};
    char err[512] = "";
    model_producer *p = model_producer_new(&po, ops, ctx, NULL, err, sizeof err);
    if (!p) fprintf(stderr, "model_producer_new: %s\n", err);
    CHECK(p != NULL);
    /* a shard with a token id outside the vocabulary is refused at start-up, naming it */
    model_producer_opts bo = po;
    bo.shards = bad_path;
    char berr[512] = "";
    int code = 0;
    model_producer *bad = model_producer_new(&bo, ops, ctx, &code, berr, sizeof berr);
    CHECK(bad == NULL);
    CHECK(strstr(berr, "bad.shard") != NULL);
    CHECK_EQ_INT(code, DFLASH_ECONFIG); /* the data does not fit the model: dflash-target exits 2 */
    model_producer_destroy(&bad);
    /* a shard recording another vocabulary is refused at start-up, naming both sizes; it trained
     * the drafter on another tokenizer's text without a word */
    bo.shards = other_path;
    berr[0] = 0;
    bad = model_producer_new(&bo, ops, ctx, &code, berr, sizeof berr);
    CHECK(bad == NULL);
    CHECK(strstr(berr, "other.shard: made for a vocabulary of 100 tokens, but the model's "
                       "vocab_size is 50") != NULL);
    if (!strstr(berr, "vocabulary of 100")) fprintf(stderr, "model_producer_new: %s\n", berr);
    CHECK_EQ_INT(code, DFLASH_ECONFIG);
    model_producer_destroy(&bad);
    /* ... said before the weights load (minutes for a large target; defect: after it): a model
     * directory with its config.json and no weights gets the same answer */
    char cfg_only[700];
    snprintf(cfg_only, sizeof cfg_only, "%s/config-only", dir);
    CHECK(mkdir(cfg_only, 0700) == 0);
    CHECK_EQ_INT(hf_config_write(cfg_only, &c, "float32"), 0);
    bo.model_dir = cfg_only;
    berr[0] = 0;
    bad = model_producer_new(&bo, ops, ctx, &code, berr, sizeof berr);
    CHECK(bad == NULL);
    CHECK(strstr(berr, "made for a vocabulary of 100 tokens") != NULL);
    CHECK_EQ_INT(code, DFLASH_ECONFIG);
    bo.shards = shard_path; /* matching data: the missing weights are the failure, not config */
    bad = model_producer_new(&bo, ops, ctx, &code, berr, sizeof berr);
    CHECK(bad == NULL);
    CHECK(code != DFLASH_ECONFIG);
    bo.model_dir = po.model_dir;
    /* a bucket no sequence falls in is refused at start-up, naming it (the broker would refuse
     * the pool with a less helpful message) */
    const uint32_t sparse[3] = {1, 8, 24}; /* the shortest sequence has 2 tokens */
    model_producer_opts eo = po;
    eo.bucket_bounds = sparse;
    eo.n_buckets = 3;
    char eerr[512] = "";
    model_producer *empty = model_producer_new(&eo, ops, ctx, &code, eerr, sizeof eerr);
    CHECK(empty == NULL);
    CHECK(strstr(eerr, "bucket 0 (<= 1 tokens)") != NULL);
    CHECK_EQ_INT(code, DFLASH_ECONFIG);
    CHECK(strstr(eerr, "data.shard") != NULL);
    model_producer_destroy(&empty);
    /* data that fits no bucket at all: the error names the shard file, not only "batch plan" */
    const uint32_t below[1] = {1};
    eo.bucket_bounds = below;
    eo.n_buckets = 1;
    eerr[0] = 0;
    empty = model_producer_new(&eo, ops, ctx, &code, eerr, sizeof eerr);
    CHECK(empty == NULL);
    CHECK(strstr(eerr, "data.shard") != NULL);
    model_producer_destroy(&empty);
    /* more captured layers than a slot records: said so, before loading (was "slot layout ...:
     * invalid argument" after the load); the ids need not exist for that */
    int many[SLOT_MAX_LAYER_IDS + 1];
    for (int i = 0; i <= SLOT_MAX_LAYER_IDS; i++)
        many[i] = i;
    model_producer_opts mo2 = po;
    mo2.layer_ids = many;
    mo2.n_layer_ids = SLOT_MAX_LAYER_IDS + 1;
    eerr[0] = 0;
    empty = model_producer_new(&mo2, ops, ctx, &code, eerr, sizeof eerr);
    CHECK(empty == NULL);
    CHECK(strstr(eerr, "at most 24") != NULL);
    model_producer_destroy(&empty);
    if (!p) goto out;

    slot_layout l;
    CHECK_EQ_INT(model_producer_layout(p, &l), 0);
    CHECK_EQ_INT(l.hidden, c.hidden_size);
    CHECK_EQ_INT(l.n_layers, 2);
    CHECK_EQ_INT(l.dtype, SLOT_DTYPE_F32);
    CHECK(target_model_lm_head(model_producer_model(p)) == NULL); /* the daemon needs no head */
    void *slot = ops->alloc(ctx, l.slot_bytes);
    int D = c.hidden_size;
    target_model_opts mo = {.layer_ids = cap, .n_layer_ids = 2, .max_tokens = 32};
    target_model *direct = target_model_new(&c, &mo, ops, ctx, fetch_random, NULL);
    float *want = malloc(sizeof(float) * 32 * 2 * (size_t)D);
    CHECK(slot && direct && want);
    if (!slot || !direct || !want) goto out2;
    CHECK_EQ_INT(model_producer_warmup(p), 0);
    /* a stop (SIGTERM) ends the warm-up (minutes on a large model) before its next bucket */
    stop = 1;
    CHECK_EQ_INT(model_producer_warmup(p), DFLASH_ESHUTDOWN);
    stop = 0;

    batch_plan *plan = model_producer_plan(p);
    int seen[N] = {0}, batches = 0;
    bool arrays_ok = true, rows_ok = true;
    for (int b = 0; b < 2; b++) { /* epoch 0, numbered as the plan (others: _epochs below) */
        uint32_t nb = batch_plan_count(plan, 0, b);
        for (uint32_t i = 0; i < nb; i++) {
            slot_work_unit wu = {.epoch = 0, .bucket = (uint32_t)b, .batch = i};
            uint32_t n_seqs = 0;
            int T = model_producer_fill(p, slot, &l, &wu, 0xabc, &n_seqs);
            CHECK(T > 0);
            if (T <= 0) continue;
            batches++;
            slot_header h;
            char herr[256];
            CHECK_EQ_INT(slot_header_check(slot, &l, &h, herr, sizeof herr), 0);
            CHECK_EQ_INT(slot_arrays_check(slot, &l, (uint32_t)c.vocab_size, herr, sizeof herr), 0);
            CHECK(h.n_tokens == (uint32_t)T && h.n_seqs == n_seqs && h.wu.batch == i &&
                  h.wu.bucket == (uint32_t)b && h.producer == 0xabc);
            /* the slot holds the plan's sequences, in order, with their ids and masks */
            uint32_t ids[8], n = 0;
            CHECK_EQ_INT(batch_plan_get(plan, 0, b, i, ids, 8, &n, NULL), 0);
            CHECK_EQ_INT(n, n_seqs);
            const int32_t *off = slot_seq_offsets(slot, &l), *tok = slot_token_ids(slot, &l);
            const uint8_t *mask = slot_loss_mask(slot, &l);
            for (uint32_t s = 0; s < n; s++) {
                seen[ids[s]]++;
                arrays_ok &= (uint32_t)(off[s + 1] - off[s]) == lens[ids[s]];
                for (int t = off[s]; t < off[s + 1]; t++) {
                    uint32_t k = (uint32_t)(t - off[s]);
                    arrays_ok &= tok[t] == (int32_t)((k * 13 + ids[s] * 7 + 1) % 50u);
                    arrays_ok &= mask[t] == (k >= lens[ids[s]] / 4);
                }
            }
            /* the captured rows are exactly the direct forward of the same packed batch */
            CHECK_EQ_INT(target_forward_host(direct, tok, slot_positions(slot, &l), off,
                                             (int)n_seqs, T, want, 2 * (size_t)D),
                         0);
            rows_ok &= memcmp(slot_hidden(slot, &l), want, sizeof(float) * (size_t)T * 2 * D) == 0;
            /* and the verifier agrees, bit for bit */
            double worst = 1;
            char verr[256] = "";
            CHECK_EQ_INT(model_producer_verify(p, slot, &l, 0.0, &worst, verr, sizeof verr), 0);
            CHECK(worst == 0.0);
        }
    }
    CHECK(batches >= 3);
    CHECK(arrays_ok);
    CHECK(rows_ok);
    bool once = true;
    for (int s = 0; s < N; s++)
        once &= seen[s] == 1;
    CHECK(once); /* every sequence (all fit a bucket) is produced exactly once per epoch */

    /* the verifier catches a changed hidden value, a token and a loss mask that are not the
     * plan's */
    {
        slot_work_unit wu = {.epoch = 1, .bucket = 1, .batch = 0};
        int T = model_producer_fill(p, slot, &l, &wu, 1, NULL);
        char verr[256] = "";
        float *hid = slot_hidden(slot, &l);
        hid[(size_t)(T - 1) * 2 * D + D + 3] *= 1.01f; /* last token, second column (layer 2) */
        CHECK_EQ_INT(model_producer_verify(p, slot, &l, 1e-4, NULL, verr, sizeof verr),
                     DFLASH_ECORRUPT);
        CHECK(strstr(verr, "layer 2") != NULL);
        model_producer_fill(p, slot, &l, &wu, 1, NULL);
        int32_t *tok = slot_token_ids(slot, &l);
        tok[0] = (tok[0] + 1) % c.vocab_size;
        CHECK_EQ_INT(model_producer_verify(p, slot, &l, 1e-4, NULL, verr, sizeof verr),
                     DFLASH_ECORRUPT);
        CHECK(strstr(verr, "arrays differ") != NULL);
        /* and a loss mask that is not the plan's (which tokens train: the rows do not tell) */
        model_producer_fill(p, slot, &l, &wu, 1, NULL);
        slot_loss_mask(slot, &l)[T - 1] ^= 1;
        verr[0] = 0;
        CHECK_EQ_INT(model_producer_verify(p, slot, &l, 1e-4, NULL, verr, sizeof verr),
                     DFLASH_ECORRUPT);
        CHECK(strstr(verr, "arrays differ") != NULL);
    }

    /* refusals: a batch that does not exist, a slot laid out for something else */
    slot_work_unit none = {.epoch = 1, .bucket = 0, .batch = 1000};
    CHECK_EQ_INT(model_producer_fill(p, slot, &l, &none, 1, NULL), DFLASH_ERANGE);
    slot_layout other = l;
    other.n_layers = 3;
    slot_work_unit first = {.epoch = 1, .bucket = 1, .batch = 0};
    CHECK_EQ_INT(model_producer_fill(p, slot, &other, &first, 1, NULL), DFLASH_EMISMATCH);

    /* what the loop registers with the broker */
    target_loop_config lc;
    memset(&lc, 0, sizeof lc);
    CHECK_EQ_INT(model_producer_loop_config(p, &lc), 0);
    CHECK(lc.n_buckets == 2 && lc.bucket_upper[1] == 24 && lc.layout.slot_bytes == l.slot_bytes);
    CHECK(fabs(lc.bucket_share[0] + lc.bucket_share[1] - 1.0) < 1e-9);
    CHECK(lc.bucket_share[0] > 0 && lc.bucket_batches[0] >= 1 && lc.bucket_batches[1] >= 1);

    /* the same through the target loop's producer interface */
    target_producer *tp = model_producer_as_target(&p);
    CHECK(tp != NULL && p == NULL);
    if (tp) {
        uint32_t n_seqs = 0;
        int T = tp->fill(tp->ctx, &first, slot, &l, tp->stream(tp->ctx), 0xdef, &n_seqs);
        CHECK(T > 0 && n_seqs > 0);
        CHECK(((slot_header *)slot)->producer == 0xdef);
        tp->destroy(tp->ctx);
        free(tp);
    }
out2:
    free(want);
    target_model_destroy(&direct);
    ops->free(ctx, slot);
out:
    model_producer_destroy(&p);
    char path[700];
    const char *files[] = {"config.json", "model.safetensors", "data.shard", "bad.shard",
                           "other.shard", "config-only/config.json", "config-only"};
    for (int i = 0; i < 7; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    rmdir(dir);
}

/* Sets the stop flag (user) after the second tensor, as SIGTERM would during a long load. */
static volatile sig_atomic_t load_stop;
static int load_calls;
static int fetch_then_stop(void *user, const char *name, const int64_t *shape, int ndim,
                           float *dst) {
    (void)user;
    if (++load_calls == 2) load_stop = 1;
    fill(name, shape, ndim, dst);
    return 0;
}

/* A stop requested while the weights load ends the load at the next tensor (dflash-target used
 * to load every tensor and warm up before it looked at its stop flag: minutes for a large
 * checkpoint); without a stop the same load completes. */
static void test_load_stop(const nn_ops *ops, nn_ctx *ctx) {
    model_config c = tiny_config();
    int cap[1] = {3};
    target_model_opts o = {.layer_ids = cap, .n_layer_ids = 1, .max_tokens = 8, .stop = &load_stop};
    target_model *m = target_model_new(&c, &o, ops, ctx, fetch_then_stop, NULL);
    CHECK(m == NULL);
    CHECK_EQ_INT(load_calls, 2);
    target_model_destroy(&m);
    load_stop = 0;
    load_calls = -100; /* never reaches 2 again: no stop */
    m = target_model_new(&c, &o, ops, ctx, fetch_then_stop, NULL);
    CHECK(m != NULL);
    target_model_destroy(&m);
}

/* Every epoch, as the broker numbers it: the broker keeps the batch count the target registered
 * (epoch 0's) for every epoch, while a reshuffled epoch may pack into more or fewer batches.
 * Every batch index below the registered count must fill, and together they must hold each
 * sequence exactly once, in epochs that pack into fewer batches (the target used to fail on
 * the first missing index and exit) and in epochs that pack into more (their last batches were
 * never asked for: sequences silently left out). */
static void test_producer_epochs(const nn_ops *ops, nn_ctx *ctx) {
    char dir[] = "/tmp/test_target_epochs.XXXXXX", shard_path[600];
    CHECK(mkdtemp(dir) != NULL);
    model_config c = tiny_config();
    CHECK_EQ_INT(write_checkpoint(dir, &c), 0);
    enum { N = 24, EPOCHS = 6 };
    uint32_t lens[N];
    for (int i = 0; i < N; i++)
        lens[i] = 3 + (uint32_t)(i * 37) % 29; /* 3..31 tokens */
    snprintf(shard_path, sizeof shard_path, "%s/data.shard", dir);
    CHECK_EQ_INT(write_shard(shard_path, lens, N, c.vocab_size, false, 0), 0);
    const uint32_t bounds[1] = {32};
    int cap[1] = {1};
    model_producer_opts po = {.model_dir = dir,
                              .shards = shard_path,
                              .bucket_bounds = bounds,
                              .n_buckets = 1,
                              .token_budget = 32,
                              .max_seqs = 4,
                              .seed = 7, /* packs into 17 18 17 16 16 15 batches in epochs 0..5 */
                              .layer_ids = cap,
                              .n_layer_ids = 1};
    char err[512] = "";
    model_producer *p = model_producer_new(&po, ops, ctx, NULL, err, sizeof err);
    if (!p) fprintf(stderr, "model_producer_new: %s\n", err);
    CHECK(p != NULL);
    if (!p) goto out;
    target_loop_config lc;
    memset(&lc, 0, sizeof lc);
    CHECK_EQ_INT(model_producer_loop_config(p, &lc), 0);
    uint32_t per_epoch = (uint32_t)lc.bucket_batches[0];
    /* the data must make the epochs differ both ways, or this test proves nothing */
    bool fewer = false, more = false;
    for (uint32_t e = 1; e < EPOCHS; e++) {
        uint32_t k = batch_plan_count(model_producer_plan(p), e, 0);
        fewer |= k < per_epoch;
        more |= k > per_epoch;
    }
    CHECK(fewer && more);
    slot_layout l;
    model_producer_layout(p, &l);
    void *slot = ops->alloc(ctx, l.slot_bytes);
    uint64_t print0[64] = {0}; /* epoch 0's batches by index: a hash of their tokens */
    bool rotated_seen = false;
    CHECK(per_epoch <= 64);
    for (uint32_t e = 0; slot && e < EPOCHS && per_epoch <= 64; e++) {
        int seen[N] = {0};
        bool filled = true;
        uint64_t print[64] = {0};
        for (uint32_t i = 0; i < per_epoch; i++) {
            slot_work_unit wu = {.epoch = e, .bucket = 0, .batch = i};
            uint32_t n_seqs = 0;
            int T = model_producer_fill(p, slot, &l, &wu, 1, &n_seqs);
            filled &= T > 0 && T <= 32 && n_seqs >= 1 && n_seqs <= 4;
            if (T <= 0) continue;
            const int32_t *off = slot_seq_offsets(slot, &l), *tok = slot_token_ids(slot, &l);
            print[i] = 1469598103934665603ull ^ (uint64_t)T;
            for (int t = 0; t < T; t++)
                print[i] = (print[i] ^ (uint32_t)tok[t]) * 1099511628211ull;
            for (uint32_t s = 0; s < n_seqs; s++) /* which sequence: its length and first id */
                for (int q = 0; q < N; q++)
                    if ((uint32_t)(off[s + 1] - off[s]) == lens[q] &&
                        tok[off[s]] == (int32_t)(((uint32_t)q * 7 + 1) % 50u))
                        seen[q]++;
            char verr[256] = "";
            CHECK_EQ_INT(model_producer_verify(p, slot, &l, 0.0, NULL, verr, sizeof verr), 0);
        }
        bool once = true;
        for (int q = 0; q < N; q++)
            once &= seen[q] == 1;
        if (e == 0) memcpy(print0, print, sizeof print0);
        /* an epoch that packs into more batches serves epoch 0's, rotated by a seeded offset
         * r (batch i is epoch 0's (i + r) % count): not epoch 0's order again */
        if (e > 0 && batch_plan_count(model_producer_plan(p), e, 0) > per_epoch) {
            uint32_t r = 0;
            for (; r < per_epoch; r++) {
                bool match = true;
                for (uint32_t i = 0; i < per_epoch; i++)
                    match &= print[i] == print0[(i + r) % per_epoch];
                if (match) break;
            }
            if (r == 0 || r == per_epoch)
                fprintf(stderr, "epoch %u: epoch 0's batches rotated by %u of %u\n", e, r,
                        per_epoch);
            CHECK(r > 0 && r < per_epoch);
            rotated_seen = true;
        }
        if (!filled || !once) fprintf(stderr, "epoch %u: filled %d, once %d\n", e, filled, once);
        CHECK(filled);
        CHECK(once);
    }
    CHECK(rotated_seen);
    ops->free(ctx, slot);
out:
    model_producer_destroy(&p);
    char path[700];
    const char *files[] = {"config.json", "model.safetensors", "data.shard"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* dflash-target's dump of its effective configuration shows the hidden size and captured layers
 * the model gives the slots, not the defaults of --hidden / --layers, which a model overrides
 * (it printed 256 and 3; given explicitly and different, they are refused: cli_checks). The
 * daemon runs against no broker and gives up after 100 ms. */
static void test_daemon_dump(void) {
    char exe[PATH_MAX], bin[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    snprintf(bin, sizeof bin, "%s/../services/target/dflash-target", dirname(exe));
    CHECK(access(bin, X_OK) == 0);
    char dir[] = "/tmp/test_target_dump.XXXXXX", path[600], cmd[3000];
    CHECK(mkdtemp(dir) != NULL);
    model_config c = tiny_config();
    CHECK_EQ_INT(write_checkpoint(dir, &c), 0);
    const uint32_t lens[4] = {5, 9, 12, 7};
    snprintf(path, sizeof path, "%s/data.shard", dir);
    CHECK_EQ_INT(write_shard(path, lens, 4, c.vocab_size, false, 0), 0);
    snprintf(cmd, sizeof cmd,
             "'%s' --runtime-dir '%s' --model '%s' --shards '%s' --backend host --threads 1 "
             "--buckets 16 --token-budget 32 --max-seqs 4 --capture-layers 0,2 "
             "--broker-wait-ms 100 --name dumptest >'%s/out' 2>&1",
             bin, dir, dir, path, dir);
    CHECK(system(cmd) != -1);
    snprintf(path, sizeof path, "%s/out", dir);
    FILE *f = fopen(path, "r");
    char line[512];
    bool hidden = false, layers = false, ids = false, stale = false;
    while (f && fgets(line, sizeof line, f)) {
        hidden |= strcmp(line, "hidden 32\n") == 0;
        layers |= strcmp(line, "layers 2\n") == 0;
        ids |= strcmp(line, "capture-layers 0,2\n") == 0;
        stale |= strcmp(line, "hidden 256\n") == 0 || strcmp(line, "layers 3\n") == 0;
    }
    if (f) fclose(f);
    CHECK(hidden && layers && ids && !stale);
    const char *files[] = {"config.json", "model.safetensors", "data.shard", "out"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(void) {
    log_init("test_target_model", LOG_WARN);
    const nn_ops *ops = nn_cpu_ops();
    nn_ctx *ctx = nn_cpu_new(1);
    test_default_ids();
    test_given_ids();
    test_captured_layers(ops, ctx);
    test_head_limits(ops, ctx);
    test_load(ops, ctx);
    test_load_sharded_bf16(ops, ctx);
    test_generate(ops, ctx);
    test_producer(ops, ctx);
    test_producer_epochs(ops, ctx);
    test_daemon_dump();
    test_load_stop(ops, ctx);
    nn_cpu_destroy(&ctx);
    CHECK_DONE();
}
