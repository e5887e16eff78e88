/* target_model: one forward definition for the Qwen3 / Qwen2 / Llama targets (see the header for
 * the maths).
 *
 * Data structures:
 *   params   one backend allocation; a size table (param_entry, built by plan_params) names every
 *            tensor with its HF name and shape and points into it. Only the decoder layers the
 *            model runs are loaded (n_loaded = deepest captured + 1, or all with all_layers).
 *   acts     one backend allocation planned for T_max tokens: the residual stream h, the
 *            scratch x, q, k, v, att, gu (first the fused q|k|v projection's output, then the
 *            fused gate|up one), mid, rot (RoPE's table of the forward's positions: rope_table
 *            once per forward, read by every layer), the index buffers used by the _host entry
 *            points, and (with max_logit_rows) the head rows and their logits; for a generation
 *            model (all layers, max_logit_rows > 0) also the KV cache [L, T_max, Hk*d] x 2 and
 *            the decode spans.
 *   host     small host scratch for target_generate (packed ids, positions, offsets, logits).
 * Generation with the cache: sequence s owns cache rows [base_s, base_s + cap_s); a prefill over
 * the packed prompts stores every layer's (normed, rotated) k and v there, then each decode step
 * embeds the newest token of every unfinished sequence, writes its k, v at base_s + pos and
 * attends through attention_block_fwd with B = 1 to rows [base_s, base_s + pos].
 * Invariants: capture_col[k] is the output column of layer k or -1; n_run = deepest id + 1 <=
 * n_loaded. Every forward reuses the same buffers, so one forward at a time per model. Every
 * loaded weight is finite: a tensor holding a NaN or an infinity is refused by name at the load
 * (finite.h), as each is converted; it would make every captured hidden state NaN.
 */
#include "target_model.h"

#include "config.h"
#include "err.h"
#include "finite.h"
#include "hf_config.h"
#include "log.h"
#include "safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN_BYTES 256

typedef struct target_layer {
    nn_buf *in_norm;         /* [D] */
    /* wq, wk, wv lie back to back (and bq, bk, bv): wq is also the fused [(H+2Hk)*d, D]
     * projection, bq its bias */
    nn_buf *wq, *bq;         /* [H*d, D], [H*d] (Qwen2) */
    nn_buf *wk, *bk;         /* [Hk*d, D], [Hk*d] (Qwen2) */
    nn_buf *wv, *bv;         /* [Hk*d, D], [Hk*d] (Qwen2) */
    nn_buf *q_norm, *k_norm; /* [d] (Qwen3) */
    nn_buf *wo;              /* [D, H*d] */
    nn_buf *post_norm;       /* [D] */
    nn_buf *w_gate, *w_up;   /* [F, D] */
    nn_buf *w_down;          /* [D, F] */
} target_layer;

typedef struct param_entry {
    char name[96];
    int64_t shape[2];
    int ndim;
    bool packed; /* the next tensor starts right after this one (no alignment gap) */
    nn_buf **ptr;
    size_t offset; /* bytes into params */
} param_entry;

struct target_model {
    model_config cfg;
    const nn_ops *ops;
    nn_ctx *ctx;

    int layer_ids[TARGET_MAX_CAPTURE];
    int n_capture;
    int *capture_col; /* [L] */
    int n_run, n_loaded;
    int T_max, S_max, R_max;
    bool no_head; /* final norm and lm_head not loaded */
    int (*after_layer)(void *user, int done, int n_layers); /* opts.after_layer; may be NULL */
    void *after_layer_user;

    void *params;
    nn_buf *embed, *final_norm, *lm_head;
    target_layer *layers; /* [n_loaded] */

    void *acts;
    float *inv_freq;                /* [d/2] fp32, backend */
    float *rot;                     /* [T, d] fp32, backend: rope_table of the forward's pos */
    nn_buf *h, *x;                  /* [T, D] */
    nn_buf *q, *att;                /* [T, H*d] */
    nn_buf *k, *v;                  /* [T, Hk*d] */
    nn_buf *gu, *mid;               /* [T, 2F] (gate | up per row), [T, F] */
    int32_t *d_ids, *d_pos, *d_off; /* [T], [T], [S+1] backend */
    nn_buf *head_x;                 /* [R, D] */
    nn_buf *logits;                 /* [R, V] */
    /* KV cache of target_generate (generation models: all_layers and max_logit_rows > 0):
     * layer l's keys are kcache + l * T * Hk*d; sequence s owns rows [base_s, base_s + cap_s) */
    nn_buf *kcache, *vcache; /* [L, T, Hk*d] each */
    nn_block_span *d_spans;  /* [R] backend */

    /* host scratch of target_generate */
    int32_t *g_ids, *g_pos, *g_off, *g_rows, *g_seq; /* [T], [T], [R+1], [R], [R] */
    int32_t *g_base;                                 /* [R] cache row of each sequence's token 0 */
    nn_block_span *g_spans;                          /* [R] */
    float *g_logits;                                 /* [R, V] */
};

static char *at(void *base, size_t byte_off) {
    return (char *)base + byte_off;
}

static size_t align_up(size_t n) {
    return (n + ALIGN_BYTES - 1) / ALIGN_BYTES * ALIGN_BYTES;
}

int target_default_layer_ids(int L, int n, int *ids) {
    if (n < 1 || n > TARGET_MAX_CAPTURE || L < 1) return DFLASH_EINVAL;
    int rc = hf_config_dflash_layers(L, n, ids); /* the rule itself lives with the config */
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= L) return DFLASH_EINVAL;
        for (int j = 0; j < i; j++)
            if (ids[i] == ids[j]) return DFLASH_EINVAL;
    }
    return 0;
}

/* ---- creation ---------------------------------------------------------------------------- */

static int add_param(param_entry *t, int *n, nn_buf **ptr, int64_t d0, int64_t d1, int ndim,
                     const char *fmt, int layer) {
    param_entry *e = &t[(*n)++];
    snprintf(e->name, sizeof e->name, fmt, layer);
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->ndim = ndim;
    e->packed = false;
    e->ptr = ptr;
    return 0;
}

/* The size table: every tensor the model reads, with its HF name and shape, in load order. */
static int plan_params(target_model *m, param_entry *t) {
    const model_config *c = &m->cfg;
    int64_t D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t Qd = (int64_t)c->num_heads * c->head_dim, Kd = (int64_t)c->num_kv_heads * c->head_dim;
    int n = 0;
    add_param(t, &n, &m->embed, V, D, 2, "model.embed_tokens.weight", 0);
    if (!m->no_head) {
        add_param(t, &n, &m->final_norm, D, 0, 1, "model.norm.weight", 0);
        if (!c->tie_word_embeddings) add_param(t, &n, &m->lm_head, V, D, 2, "lm_head.weight", 0);
    }
    for (int l = 0; l < m->n_loaded; l++) {
        target_layer *w = &m->layers[l];
        add_param(t, &n, &w->in_norm, D, 0, 1, "model.layers.%d.input_layernorm.weight", l);
        add_param(t, &n, &w->wq, Qd, D, 2, "model.layers.%d.self_attn.q_proj.weight", l);
        t[n - 1].packed = true;
        add_param(t, &n, &w->wk, Kd, D, 2, "model.layers.%d.self_attn.k_proj.weight", l);
        t[n - 1].packed = true;
        add_param(t, &n, &w->wv, Kd, D, 2, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->qkv_bias) {
            add_param(t, &n, &w->bq, Qd, 0, 1, "model.layers.%d.self_attn.q_proj.bias", l);
            t[n - 1].packed = true;
            add_param(t, &n, &w->bk, Kd, 0, 1, "model.layers.%d.self_attn.k_proj.bias", l);
            t[n - 1].packed = true;
            add_param(t, &n, &w->bv, Kd, 0, 1, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (c->qk_norm) {
            add_param(t, &n, &w->q_norm, c->head_dim, 0, 1,
                      "model.layers.%d.self_attn.q_norm.weight", l);
            add_param(t, &n, &w->k_norm, c->head_dim, 0, 1,
                      "model.layers.%d.self_attn.k_norm.weight", l);
        }
        add_param(t, &n, &w->wo, D, Qd, 2, "model.layers.%d.self_attn.o_proj.weight", l);
        add_param(t, &n, &w->post_norm, D, 0, 1, "model.layers.%d.post_attention_layernorm.weight",
                  l);
        add_param(t, &n, &w->w_gate, F, D, 2, "model.layers.%d.mlp.gate_proj.weight", l);
        t[n - 1].packed = true;
        add_param(t, &n, &w->w_up, F, D, 2, "model.layers.%d.mlp.up_proj.weight", l);
        add_param(t, &n, &w->w_down, D, F, 2, "model.layers.%d.mlp.down_proj.weight", l);
    }
    return n;
}

static int64_t numel(const param_entry *e) {
    return e->ndim == 1 ? e->shape[0] : e->shape[0] * e->shape[1];
}

static int check_config(const model_config *c) {
    if (c->vocab_size < 1 || c->hidden_size < 1 || c->intermediate_size < 1 || c->num_layers < 1 ||
        c->num_heads < 1 || c->num_kv_heads < 1 || c->head_dim < 2 || c->head_dim % 2 != 0 ||
        c->num_heads % c->num_kv_heads != 0 || !(c->rms_norm_eps > 0) || !(c->rope_theta > 0)) {
        LOG_ERROR("target model: inconsistent config (vocab %d hidden %d intermediate %d layers "
                  "%d heads %d kv_heads %d head_dim %d eps %g theta %g)",
                  c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
                  c->num_kv_heads, c->head_dim, c->rms_norm_eps, c->rope_theta);
        return DFLASH_ECONFIG;
    }
    return 0;
}

int target_layer_ids_check_order(const int *ids, int n, char *err, size_t errlen) {
    for (int i = 1; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i]) {
                err_fmt(err, errlen, "captured layer id %d given twice", ids[i]);
                return DFLASH_ECONFIG;
            }
        if (ids[i] < ids[i - 1]) {
            err_fmt(err, errlen, "captured layer ids not in ascending order (%d after %d): give "
                    "them in ascending order, the order SGLang and vLLM capture them in as the "
                    "target's layers run", ids[i], ids[i - 1]);
            return DFLASH_ECONFIG;
        }
    }
    return 0;
}

int target_layer_ids_check(const int *ids, int n, int L, char *err, size_t errlen) {
    if (n < 1 || n > TARGET_MAX_CAPTURE) {
        err_fmt(err, errlen, "%d captured layers given, need 1..%d", n, TARGET_MAX_CAPTURE);
        return DFLASH_ECONFIG;
    }
    int rc = target_layer_ids_check_order(ids, n, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= L) {
            err_fmt(err, errlen, "captured layer id %d outside [0, %d) (ids are 0-based decoder "
                    "layer outputs of this %d-layer target)", ids[i], L, L);
            return DFLASH_ECONFIG;
        }
    return 0;
}

char *target_layer_ids_text(const int *ids, int n, char *buf, size_t len) {
    if (len) buf[0] = 0;
    for (int i = 0, at = 0; i < n && at < (int)len; i++)
        at += snprintf(buf + at, len - (size_t)at, "%s%d", i ? "," : "", ids[i]);
    return buf;
}

int target_capture_layers_parse(const char *s, int *ids, int max, char *err, size_t errlen) {
    int n = config_parse_int_list(s, ids, max, err, errlen);
    if (n >= 0) {
        int rc = target_layer_ids_check_order(ids, n, err, errlen);
        if (rc) n = rc;
    }
    return n;
}

static int pick_layers(target_model *m, const target_model_opts *o) {
    int L = m->cfg.num_layers;
    if (o->layer_ids) {
        char why[160];
        int rc = target_layer_ids_check(o->layer_ids, o->n_layer_ids, L, why, sizeof why);
        if (rc) {
            LOG_ERROR("target model: %s", why);
            return rc;
        }
        m->n_capture = o->n_layer_ids;
        memcpy(m->layer_ids, o->layer_ids, (size_t)m->n_capture * sizeof *m->layer_ids);
    } else {
        int rc = target_default_layer_ids(L, o->drafter_layers, m->layer_ids);
        if (rc) {
            LOG_ERROR("target model: DFlash's default rule gives no valid distinct layer ids for "
                      "a %d-layer target and %d features; give the ids explicitly",
                      L, o->drafter_layers);
            return rc;
        }
        m->n_capture = o->drafter_layers;
    }
    m->n_run = 0;
    for (int i = 0; i < m->n_capture; i++)
        if (m->layer_ids[i] + 1 > m->n_run) m->n_run = m->layer_ids[i] + 1;
    m->n_loaded = o->all_layers ? L : m->n_run;
    return 0;
}

/* Activation plan: byte offsets of every buffer in one allocation. Returns the total size. */
static size_t plan_acts(target_model *m, size_t *off) {
    const model_config *c = &m->cfg;
    size_t ab = m->ops->act_bytes, T = (size_t)m->T_max, R = (size_t)m->R_max;
    size_t D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    size_t Qd = (size_t)c->num_heads * c->head_dim, Kd = (size_t)c->num_kv_heads * c->head_dim;
    size_t kv = m->R_max > 0 && m->n_loaded == c->num_layers; /* a generation model */
    size_t sizes[] = {
        sizeof(float) * (size_t)(c->head_dim / 2), /* inv_freq */
        ab * T * D,
        ab * T * D, /* h, x */
        ab * T * Qd,
        ab * T * Qd, /* q, att */
        ab * T * Kd,
        ab * T * Kd, /* k, v */
        ab * T * (2 * F > Qd + 2 * Kd ? 2 * F : Qd + 2 * Kd), /* gu, also the q|k|v output */
        ab * T * F,                                           /* mid */
        sizeof(int32_t) * T,
        sizeof(int32_t) * T,                      /* ids, pos */
        sizeof(int32_t) * ((size_t)m->S_max + 1), /* seq_off */
        ab * R * D,
        ab * R * V,                             /* head_x, logits */
        kv * ab * (size_t)m->n_loaded * T * Kd, /* kcache */
        kv * ab * (size_t)m->n_loaded * T * Kd, /* vcache */
        kv * sizeof(nn_block_span) * R,         /* spans */
        sizeof(float) * T * c->head_dim,        /* rot */
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        off[i] = total;
        total += align_up(sizes[i]);
    }
    return total;
}

static void destroy_host(target_model *m) {
    free(m->g_ids);
    free(m->g_pos);
    free(m->g_off);
    free(m->g_rows);
    free(m->g_seq);
    free(m->g_base);
    free(m->g_spans);
    free(m->g_logits);
}

target_model *target_model_new(const model_config *cfg, const target_model_opts *o,
                               const nn_ops *ops, nn_ctx *ctx, target_tensor_fn fetch, void *user) {
    if (!cfg || !o || !ops || !fetch) return NULL;
    if (check_config(cfg)) return NULL;
    char why[256];
    if (nn_ops_check_heads(ops, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim, why,
                           sizeof why)) {
        LOG_ERROR("target model: %s", why);
        return NULL;
    }
    if (o->max_tokens < 1 || o->max_seqs < 0 || o->max_logit_rows < 0 ||
        o->max_logit_rows > o->max_tokens) {
        LOG_ERROR("target model: max_tokens %d, max_seqs %d, max_logit_rows %d: need "
                  "max_tokens >= 1, the others >= 0 and max_logit_rows <= max_tokens",
                  o->max_tokens, o->max_seqs, o->max_logit_rows);
        return NULL;
    }
    target_model *m = calloc(1, sizeof *m);
    param_entry *table = NULL;
    float *staging = NULL;
    if (!m) return NULL;
    m->cfg = *cfg;
    m->ops = ops;
    m->ctx = ctx;
    m->T_max = o->max_tokens;
    m->S_max = o->max_seqs ? o->max_seqs : o->max_tokens;
    m->R_max = o->max_logit_rows;
    m->no_head = o->no_head;
    m->after_layer = o->after_layer;
    m->after_layer_user = o->after_layer_user;
    if (o->no_head && o->max_logit_rows > 0) {
        LOG_ERROR("target model: no_head leaves nothing to compute logits with");
        goto fail;
    }
    if (pick_layers(m, o)) goto fail;
    m->capture_col = malloc(sizeof(int) * (size_t)cfg->num_layers);
    m->layers = calloc((size_t)m->n_loaded, sizeof *m->layers);
    table = calloc(3 + 14 * (size_t)m->n_loaded, sizeof *table);
    if (!m->capture_col || !m->layers || !table) goto fail_nomem;
    for (int l = 0; l < cfg->num_layers; l++)
        m->capture_col[l] = -1;
    for (int j = 0; j < m->n_capture; j++)
        m->capture_col[m->layer_ids[j]] = j;

    /* parameters: size table -> one allocation -> fetch + upload tensor by tensor */
    int n_params = plan_params(m, table);
    size_t total = 0;
    int64_t biggest = 0;
    for (int i = 0; i < n_params; i++) {
        size_t bytes = (size_t)numel(&table[i]) * ops->act_bytes;
        table[i].offset = total;
        total += table[i].packed ? bytes : align_up(bytes);
        if (numel(&table[i]) > biggest) biggest = numel(&table[i]);
    }
    m->params = ops->alloc(ctx, total);
    staging = malloc(sizeof(float) * (size_t)biggest);
    if (!m->params || !staging) {
        LOG_ERROR("target model: cannot allocate %zu bytes of parameters", total);
        goto fail;
    }
    for (int i = 0; i < n_params; i++) {
        param_entry *e = &table[i];
        *e->ptr = at(m->params, e->offset);
        if (o->stop && *o->stop) {
            LOG_INFO("target model: stop requested: loading abandoned at tensor %d of %d", i,
                     n_params);
            goto fail;
        }
        int rc = fetch(user, e->name, e->shape, e->ndim, staging);
        if (rc) {
            LOG_ERROR("target model: cannot load tensor %s: %s", e->name, err_str(rc));
            goto fail;
        }
        size_t bad = finite_first_bad(staging, (size_t)numel(e));
        if (bad < (size_t)numel(e)) {
            LOG_ERROR("target model: tensor %s holds a non-finite value (%g at element %zu of "
                      "%lld): the checkpoint is damaged or was converted with an overflow (e.g. "
                      "to float16); every hidden state after it would be NaN. Use the original "
                      "weights, or convert them again (bfloat16 or float32)",
                      e->name, (double)staging[bad], bad, (long long)numel(e));
            goto fail;
        }
        ops->upload(ctx, *e->ptr, staging, (size_t)numel(e));
    }
    if (cfg->tie_word_embeddings && !m->no_head) m->lm_head = m->embed;
    free(staging);
    staging = NULL;
    free(table);
    table = NULL;

    /* activations */
    size_t off[20];
    size_t acts_bytes = plan_acts(m, off);
    m->acts = ops->alloc(ctx, acts_bytes);
    if (!m->acts) {
        LOG_ERROR("target model: cannot allocate %zu bytes of activations for %d tokens",
                  acts_bytes, m->T_max);
        goto fail;
    }
    m->inv_freq = (float *)at(m->acts, off[0]);
    m->h = at(m->acts, off[1]);
    m->x = at(m->acts, off[2]);
    m->q = at(m->acts, off[3]);
    m->att = at(m->acts, off[4]);
    m->k = at(m->acts, off[5]);
    m->v = at(m->acts, off[6]);
    m->gu = at(m->acts, off[7]);
    m->mid = at(m->acts, off[8]);
    m->d_ids = (int32_t *)at(m->acts, off[9]);
    m->d_pos = (int32_t *)at(m->acts, off[10]);
    m->d_off = (int32_t *)at(m->acts, off[11]);
    m->head_x = at(m->acts, off[12]);
    m->logits = at(m->acts, off[13]);
    if (m->R_max > 0 && m->n_loaded == cfg->num_layers) {
        m->kcache = at(m->acts, off[14]);
        m->vcache = at(m->acts, off[15]);
        m->d_spans = (nn_block_span *)at(m->acts, off[16]);
    }
    m->rot = (float *)at(m->acts, off[17]);

    float inv_freq[512];
    if (cfg->head_dim / 2 > (int)(sizeof inv_freq / sizeof inv_freq[0])) {
        LOG_ERROR("target model: head_dim %d too large", cfg->head_dim);
        goto fail;
    }
    rope_inv_freq(inv_freq, cfg->head_dim, cfg->rope_theta, &cfg->rope_scaling);
    ops->upload_raw(ctx, m->inv_freq, inv_freq, sizeof(float) * (size_t)(cfg->head_dim / 2));

    if (m->R_max > 0) {
        size_t T = (size_t)m->T_max, R = (size_t)m->R_max;
        m->g_ids = malloc(sizeof(int32_t) * T);
        m->g_pos = malloc(sizeof(int32_t) * T);
        m->g_off = malloc(sizeof(int32_t) * (R + 1));
        m->g_rows = malloc(sizeof(int32_t) * R);
        m->g_seq = malloc(sizeof(int32_t) * R);
        m->g_base = malloc(sizeof(int32_t) * R);
        m->g_spans = malloc(sizeof(nn_block_span) * R);
        m->g_logits = malloc(sizeof(float) * R * (size_t)cfg->vocab_size);
        if (!m->g_ids || !m->g_pos || !m->g_off || !m->g_rows || !m->g_seq || !m->g_base ||
            !m->g_spans || !m->g_logits)
            goto fail_nomem;
    }
    LOG_DEBUG("target model: %d of %d layers loaded, runs %d, captures %d, %zu bytes of "
              "activations for %d tokens",
              m->n_loaded, cfg->num_layers, m->n_run, m->n_capture, acts_bytes, m->T_max);
    return m;

fail_nomem:
    LOG_ERROR("target model: out of memory");
fail:
    free(staging);
    free(table);
    target_model_destroy(&m);
    return NULL;
}

void target_model_destroy(target_model **pm) {
    if (!pm || !*pm) return;
    target_model *m = *pm;
    if (m->ops) {
        m->ops->free(m->ctx, m->params);
        m->ops->free(m->ctx, m->acts);
    }
    destroy_host(m);
    free(m->layers);
    free(m->capture_col);
    free(m);
    *pm = NULL;
}

const model_config *target_model_config(const target_model *m) {
    return &m->cfg;
}

const int *target_model_layer_ids(const target_model *m, int *n) {
    if (n) *n = m->n_capture;
    return m->layer_ids;
}

int target_model_max_tokens(const target_model *m) {
    return m->T_max;
}

const nn_buf *target_model_embed_tokens(const target_model *m) {
    return m->embed;
}

const nn_buf *target_model_lm_head(const target_model *m) {
    return m->lm_head;
}

const nn_buf *target_model_final_norm(const target_model *m) {
    return m->final_norm;
}

/* ---- loading from a Hugging Face directory ---------------------------------------------- */

static int fetch_safetensors(void *user, const char *name, const int64_t *shape, int ndim,
                             float *dst) {
    char err[512];
    const safetensors *st = user;
    int rc = safetensors_load_f32(st, name, ndim, shape, dst, err, sizeof err);
    if (!rc) return 0;
    static const char prefix[] = "model.";
    if (rc == DFLASH_ENOTFOUND && strncmp(name, prefix, sizeof prefix - 1) == 0 &&
        safetensors_find(st, name + sizeof prefix - 1))
        LOG_ERROR("%s (it holds %s: the weights of a bare base model, saved without the causal-LM "
                  "wrapper's \"model.\" prefix; give the *ForCausalLM checkpoint)",
                  err, name + sizeof prefix - 1);
    else
        LOG_ERROR("%s", err);
    return rc;
}

target_model *target_model_load(const char *dir, const target_model_opts *opts, const nn_ops *ops,
                                nn_ctx *ctx) {
    char err[512];
    model_config cfg;
    int rc = hf_config_load(dir, &cfg, err, sizeof err);
    if (rc) {
        LOG_ERROR("target model: %s", err);
        return NULL;
    }
    safetensors *st = safetensors_open(dir, NULL, err, sizeof err);
    if (!st) {
        LOG_ERROR("target model: %s", err);
        return NULL;
    }
    target_model *m = target_model_new(&cfg, opts, ops, ctx, fetch_safetensors, st);
    safetensors_close(&st);
    if (m && opts->lends) {
        LOG_INFO("target model: %s %s, %d layers, hidden %d: %s", hf_config_family_name(cfg.family),
                 dir, cfg.num_layers, cfg.hidden_size, opts->lends);
    } else if (m) {
        char ids[TARGET_MAX_CAPTURE * 6];
        LOG_INFO("target model: %s %s, %d layers (running %d), hidden %d, captures layers %s",
                 hf_config_family_name(cfg.family), dir, cfg.num_layers, m->n_run, cfg.hidden_size,
                 target_layer_ids_text(m->layer_ids, m->n_capture, ids, sizeof ids));
    }
    return m;
}

/* ---- forward ----------------------------------------------------------------------------- */

/* The layers' inputs for T tokens: h[T, D] = the embeddings of ids, rot[T, d] = RoPE's table of
 * pos (read by every layer's q|k|v split). */
static void embed_rows(target_model *m, const int32_t *ids, const int32_t *pos, int T) {
    m->ops->embedding_fwd(m->ctx, m->h, ids, m->embed, T, m->cfg.hidden_size);
    m->ops->rope_table(m->ctx, m->rot, pos, m->inv_freq, T, m->cfg.head_dim);
}

/* First half of a decoder layer on rows h[T, D]: x = norm(h), q, k, v with q/k norm and RoPE
 * (by the rows of rot that embed_rows filled). */
static void layer_qkv(target_model *m, const target_layer *w, int T) {
    const nn_ops *ops = m->ops;
    nn_ctx *c = m->ctx;
    const model_config *cf = &m->cfg;
    int D = cf->hidden_size, H = cf->num_heads, Hk = cf->num_kv_heads, d = cf->head_dim;
    float eps = (float)cf->rms_norm_eps;
    ops->rmsnorm_fwd(c, m->x, NULL, m->h, w->in_norm, T, D, eps); /* x[T,D] */
    /* one product for q|k|v (the weights lie back to back) into gu, then split */
    ops->linear_fwd(c, m->gu, m->x, w->wq, w->bq, T, D, (H + 2 * Hk) * d);
    ops->qkv_norm_rope_fwd(c, m->q, m->k, m->v, m->gu, cf->qk_norm ? w->q_norm : NULL,
                           cf->qk_norm ? w->k_norm : NULL, m->rot, T, H, Hk, d, eps);
}

/* Second half, after att[T, H*d] holds the attention output: o_proj, residual, MLP, residual. */
static void layer_out(target_model *m, const target_layer *w, int T) {
    const nn_ops *ops = m->ops;
    nn_ctx *c = m->ctx;
    const model_config *cf = &m->cfg;
    int D = cf->hidden_size, F = cf->intermediate_size, Qd = cf->num_heads * cf->head_dim;
    ops->linear_fwd_res(c, m->h, m->att, w->wo, m->h, T, Qd, D); /* h += att Wo^T */
    ops->rmsnorm_fwd(c, m->x, NULL, m->h, w->post_norm, T, D, (float)cf->rms_norm_eps);
    /* one product for gate|up (the weights lie back to back) */
    ops->linear_fwd(c, m->gu, m->x, w->w_gate, NULL, T, D, 2 * F); /* gu[T,2F] */
    ops->swiglu_fwd(c, m->mid, m->gu, T, F);                        /* mid[T,F] */
    ops->linear_fwd_res(c, m->h, m->mid, w->w_down, m->h, T, F, D); /* h += mid Wdown^T */
}

/* One decoder layer in place on the residual stream m->h[T, D]. */
static void layer_fwd(target_model *m, const target_layer *w, const int32_t *seq_off, int n_seqs,
                      int T) {
    const model_config *cf = &m->cfg;
    layer_qkv(m, w, T);
    m->ops->attention_causal_fwd(m->ctx, m->att, m->q, m->k, m->v, seq_off, n_seqs, T,
                                 cf->num_heads, cf->num_kv_heads, cf->head_dim);
    layer_out(m, w, T);
}

/* h[T, D] -> out[t * ld + col * D] (the slot's rows interleave the captured layers, so the
 * destination is strided): one strided copy. */
static void capture(target_model *m, nn_buf *out, size_t ld, int col, int T) {
    size_t ab = m->ops->act_bytes, D = (size_t)m->cfg.hidden_size;
    char *dst = (char *)out + (size_t)col * D * ab;
    m->ops->copy2d(m->ctx, dst, ld * ab, m->h, D * ab, D * ab, (size_t)T);
}

/* Embedding and layers [0, n_layers), capturing into out (when not NULL), asking after_layer
 * after each layer. 0, or DFLASH_ESHUTDOWN when after_layer abandoned the forward. */
static int run(target_model *m, const int32_t *ids, const int32_t *pos, const int32_t *seq_off,
               int n_seqs, int T, int n_layers, nn_buf *out, size_t out_ld) {
    embed_rows(m, ids, pos, T);
    for (int l = 0; l < n_layers; l++) {
        layer_fwd(m, &m->layers[l], seq_off, n_seqs, T);
        if (out && m->capture_col[l] >= 0) capture(m, out, out_ld, m->capture_col[l], T);
        if (m->after_layer && m->after_layer(m->after_layer_user, l + 1, n_layers))
            return DFLASH_ESHUTDOWN;
    }
    return 0;
}

int target_forward(target_model *m, const int32_t *ids, const int32_t *pos, const int32_t *seq_off,
                   int n_seqs, int T, nn_buf *out_hidden, size_t out_ld) {
    if (!m || T < 1 || T > m->T_max || n_seqs < 1 || n_seqs > T || !out_hidden ||
        out_ld < (size_t)m->n_capture * (size_t)m->cfg.hidden_size)
        return DFLASH_EINVAL;
    return run(m, ids, pos, seq_off, n_seqs, T, m->n_run, out_hidden, out_ld);
}

/* Validates host index arrays and uploads them into the model's own buffers. */
static int upload_host(target_model *m, const int32_t *ids, const int32_t *pos,
                       const int32_t *seq_off, int n_seqs, int T) {
    if (T < 1 || T > m->T_max || n_seqs < 1 || n_seqs > m->S_max || n_seqs > T) {
        LOG_ERROR("target model: batch of %d tokens in %d sequences exceeds the plan (%d tokens, "
                  "%d sequences)",
                  T, n_seqs, m->T_max, m->S_max);
        return DFLASH_EINVAL;
    }
    if (seq_off[0] != 0 || seq_off[n_seqs] != T) return DFLASH_EINVAL;
    for (int s = 0; s < n_seqs; s++)
        if (seq_off[s + 1] <= seq_off[s]) return DFLASH_EINVAL;
    for (int t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= m->cfg.vocab_size) {
            LOG_ERROR("target model: token id %d at %d outside the vocabulary [0, %d)", ids[t], t,
                      m->cfg.vocab_size);
            return DFLASH_ERANGE;
        }
        if (pos[t] < 0) return DFLASH_EINVAL;
    }
    m->ops->upload_raw(m->ctx, m->d_ids, ids, sizeof(int32_t) * (size_t)T);
    m->ops->upload_raw(m->ctx, m->d_pos, pos, sizeof(int32_t) * (size_t)T);
    m->ops->upload_raw(m->ctx, m->d_off, seq_off, sizeof(int32_t) * (size_t)(n_seqs + 1));
    return 0;
}

int target_forward_host(target_model *m, const int32_t *ids, const int32_t *pos,
                        const int32_t *seq_off, int n_seqs, int T, nn_buf *out_hidden,
                        size_t out_ld) {
    if (!m) return DFLASH_EINVAL;
    int rc = upload_host(m, ids, pos, seq_off, n_seqs, T);
    if (rc) return rc;
    return target_forward(m, m->d_ids, m->d_pos, m->d_off, n_seqs, T, out_hidden, out_ld);
}

/* Final norm and lm_head over the n rows h[0..n) (already gathered), logits to the host. */
static void head_rows(target_model *m, const nn_buf *rows, int n, float *logits) {
    const nn_ops *ops = m->ops;
    int D = m->cfg.hidden_size, V = m->cfg.vocab_size;
    ops->rmsnorm_fwd(m->ctx, m->head_x, NULL, rows, m->final_norm, n, D,
                     (float)m->cfg.rms_norm_eps);
    ops->linear_fwd(m->ctx, m->logits, m->head_x, m->lm_head, NULL, n, D, V);
    ops->download(m->ctx, logits, m->logits, (size_t)n * (size_t)V);
    ops->sync(m->ctx);
}

int target_logits(target_model *m, const int32_t *ids, const int32_t *pos, const int32_t *seq_off,
                  int n_seqs, int T, const int32_t *rows, int n_rows, float *logits) {
    if (!m || n_rows < 1 || n_rows > m->R_max || m->n_loaded < m->cfg.num_layers) {
        if (m)
            LOG_ERROR("target model: logits need all_layers and n_rows (%d) in [1, %d]", n_rows,
                      m->R_max);
        return DFLASH_EINVAL;
    }
    int rc = upload_host(m, ids, pos, seq_off, n_seqs, T);
    if (rc) return rc;
    for (int r = 0; r < n_rows; r++)
        if (rows[r] < 0 || rows[r] >= T) return DFLASH_EINVAL;
    const nn_ops *ops = m->ops;
    size_t ab = ops->act_bytes, D = (size_t)m->cfg.hidden_size;
    if ((rc = run(m, m->d_ids, m->d_pos, m->d_off, n_seqs, T, m->cfg.num_layers, NULL, 0)))
        return rc;
    for (int r = 0; r < n_rows; r++) /* gather the rows into x (free after the layers) */
        ops->copy(m->ctx, (char *)m->x + r * D * ab, (char *)m->h + (size_t)rows[r] * D * ab,
                  D * ab);
    head_rows(m, m->x, n_rows, logits);
    return 0;
}

/* ---- generation -------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int32_t pick_token(const float *logits, int V, float temperature, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    double mx = logits[best], sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp(((double)logits[i] - mx) / temperature);
    double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += exp(((double)logits[i] - mx) / temperature);
        if (u < acc) return i;
    }
    return best;
}

/* Cached prefill: the full forward over the packed batch in m->d_* (host offsets g_off, n
 * sequences, T tokens), storing every layer's k, v rows of sequence r at cache rows
 * g_base[r]...; then the logits of each sequence's last token into g_logits. */
static void prefill_cached(target_model *m, int n, int T) {
    const nn_ops *ops = m->ops;
    const model_config *cf = &m->cfg;
    size_t ab = ops->act_bytes, D = (size_t)cf->hidden_size;
    size_t Kd = (size_t)cf->num_kv_heads * cf->head_dim, layer = (size_t)m->T_max * Kd * ab;
    embed_rows(m, m->d_ids, m->d_pos, T);
    for (int l = 0; l < cf->num_layers; l++) {
        const target_layer *w = &m->layers[l];
        layer_qkv(m, w, T);
        for (int r = 0; r < n; r++) {
            size_t rows = (size_t)(m->g_off[r + 1] - m->g_off[r]);
            size_t dst = (size_t)l * layer + (size_t)m->g_base[r] * Kd * ab;
            size_t src = (size_t)m->g_off[r] * Kd * ab;
            ops->copy(m->ctx, (char *)m->kcache + dst, (char *)m->k + src, rows * Kd * ab);
            ops->copy(m->ctx, (char *)m->vcache + dst, (char *)m->v + src, rows * Kd * ab);
        }
        ops->attention_causal_fwd(m->ctx, m->att, m->q, m->k, m->v, m->d_off, n, T, cf->num_heads,
                                  cf->num_kv_heads, cf->head_dim);
        layer_out(m, w, T);
    }
    for (int r = 0; r < n; r++)
        ops->copy(m->ctx, (char *)m->x + r * D * ab,
                  (char *)m->h + (size_t)(m->g_off[r + 1] - 1) * D * ab, D * ab);
    head_rows(m, m->x, n, m->g_logits);
}

/* One cached decode step: n new tokens (d_ids, d_pos; token r of sequence r at cache row
 * g_base[r] + g_pos[r]) attend to their sequence's cached rows and themselves (d_spans, Tk
 * cache rows in use); logits into g_logits. */
static void decode_cached(target_model *m, int n, int Tk) {
    const nn_ops *ops = m->ops;
    const model_config *cf = &m->cfg;
    size_t ab = ops->act_bytes;
    size_t Kd = (size_t)cf->num_kv_heads * cf->head_dim, layer = (size_t)m->T_max * Kd * ab;
    embed_rows(m, m->d_ids, m->d_pos, n);
    for (int l = 0; l < cf->num_layers; l++) {
        const target_layer *w = &m->layers[l];
        char *kc = (char *)m->kcache + (size_t)l * layer,
             *vc = (char *)m->vcache + (size_t)l * layer;
        layer_qkv(m, w, n);
        for (int r = 0; r < n; r++) {
            size_t row = (size_t)(m->g_base[r] + m->g_pos[r]) * Kd * ab;
            ops->copy(m->ctx, kc + row, (char *)m->k + (size_t)r * Kd * ab, Kd * ab);
            ops->copy(m->ctx, vc + row, (char *)m->v + (size_t)r * Kd * ab, Kd * ab);
        }
        ops->attention_block_fwd(m->ctx, m->att, NULL, m->q, kc, vc, m->d_spans, n, 1, Tk,
                                 cf->num_heads, cf->num_kv_heads, cf->head_dim);
        layer_out(m, w, n);
    }
    head_rows(m, m->h, n, m->g_logits);
}

/* Appends the token picked from logits row r to sequence g_seq[r]; updates done. */
static void take(target_model *m, int r, int32_t **seqs, int *len, const int *cap, int *added,
                 bool *done, int max_new, const int32_t *eos, int n_eos, float temperature,
                 uint64_t *rng) {
    int V = m->cfg.vocab_size, s = m->g_seq[r];
    int32_t tok = pick_token(m->g_logits + (size_t)r * V, V, temperature, rng);
    seqs[s][len[s]++] = tok;
    added[s]++;
    bool at_eos = false;
    for (int i = 0; i < n_eos; i++)
        at_eos |= tok == eos[i];
    if (added[s] >= max_new || len[s] >= cap[s] || at_eos) done[s] = true;
}

/* Generation with the KV cache: one prefill, then one token per sequence per step. */
static int generate_cached(target_model *m, int32_t **seqs, int *len, const int *cap, int n_seqs,
                           int *added, bool *done, int max_new, const int32_t *eos, int n_eos,
                           float temperature, uint64_t *rng) {
    const nn_ops *ops = m->ops;
    int seq_base[n_seqs], Tk = 0, n = 0, T = 0;
    for (int s = 0; s < n_seqs; s++) {
        seq_base[s] = Tk;
        Tk += cap[s];
    }
    /* prefill every unfinished sequence */
    m->g_off[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (done[s]) continue;
        for (int i = 0; i < len[s]; i++)
            m->g_ids[T + i] = seqs[s][i], m->g_pos[T + i] = i;
        T += len[s];
        m->g_seq[n] = s;
        m->g_base[n] = seq_base[s];
        m->g_off[++n] = T;
    }
    if (n == 0) return 0;
    int rc = upload_host(m, m->g_ids, m->g_pos, m->g_off, n, T);
    if (rc) return rc;
    prefill_cached(m, n, T);
    int L = m->cfg.num_layers;
    if (m->after_layer && m->after_layer(m->after_layer_user, L, L)) return DFLASH_ESHUTDOWN;
    for (int r = 0; r < n; r++)
        take(m, r, seqs, len, cap, added, done, max_new, eos, n_eos, temperature, rng);
    /* decode: the newest token of every unfinished sequence, at position len - 1 */
    for (;;) {
        n = 0;
        for (int s = 0; s < n_seqs; s++) {
            if (done[s]) continue;
            int p = len[s] - 1;
            m->g_ids[n] = seqs[s][p];
            m->g_pos[n] = p;
            m->g_seq[n] = s;
            m->g_base[n] = seq_base[s];
            m->g_spans[n] = (nn_block_span){.ctx_begin = seq_base[s],
                                            .ctx_end = seq_base[s] + p,
                                            .blk_begin = seq_base[s] + p,
                                            .keep = 1};
            n++;
        }
        if (n == 0) return 0;
        for (int r = 0; r < n; r++)
            if (m->g_ids[r] < 0 || m->g_ids[r] >= m->cfg.vocab_size) return DFLASH_ERANGE;
        ops->upload_raw(m->ctx, m->d_ids, m->g_ids, sizeof(int32_t) * (size_t)n);
        ops->upload_raw(m->ctx, m->d_pos, m->g_pos, sizeof(int32_t) * (size_t)n);
        ops->upload_raw(m->ctx, m->d_spans, m->g_spans, sizeof(nn_block_span) * (size_t)n);
        decode_cached(m, n, Tk);
        if (m->after_layer && m->after_layer(m->after_layer_user, L, L)) return DFLASH_ESHUTDOWN;
        for (int r = 0; r < n; r++)
            take(m, r, seqs, len, cap, added, done, max_new, eos, n_eos, temperature, rng);
    }
}

int target_generate(target_model *m, int32_t **seqs, int *len, const int *cap, int n_seqs,
                    int max_new, const int32_t *eos, int n_eos, float temperature, uint64_t *rng) {
    if (!m || n_seqs < 1 || n_seqs > m->R_max || n_seqs > m->S_max || max_new < 0 ||
        (temperature > 0 && !rng))
        return DFLASH_EINVAL;
    int added[n_seqs];
    bool done[n_seqs];
    long cache_rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (len[s] < 1 || len[s] > cap[s]) return DFLASH_EINVAL;
        added[s] = 0;
        done[s] = max_new == 0 || len[s] >= cap[s];
        cache_rows += cap[s];
    }
    if (m->kcache && cache_rows <= m->T_max)
        return generate_cached(m, seqs, len, cap, n_seqs, added, done, max_new, eos, n_eos,
                               temperature, rng);
    /* without room for the cache: recompute the whole batch for every token */
    for (;;) {
        int n = 0, T = 0;
        m->g_off[0] = 0;
        for (int s = 0; s < n_seqs; s++) {
            if (done[s]) continue;
            if (T + len[s] > m->T_max) {
                LOG_ERROR("target generate: %d tokens exceed the model's plan of %d", T + len[s],
                          m->T_max);
                return DFLASH_EFULL;
            }
            for (int i = 0; i < len[s]; i++)
                m->g_ids[T + i] = seqs[s][i], m->g_pos[T + i] = i;
            T += len[s];
            m->g_rows[n] = T - 1;
            m->g_seq[n] = s;
            m->g_off[++n] = T;
        }
        if (n == 0) return 0;
        int rc = target_logits(m, m->g_ids, m->g_pos, m->g_off, n, T, m->g_rows, n, m->g_logits);
        if (rc) return rc;
        for (int r = 0; r < n; r++)
            take(m, r, seqs, len, cap, added, done, max_new, eos, n_eos, temperature, rng);
    }
}
