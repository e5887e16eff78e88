/* dflash_model: DFlash drafter weights, activations, forward and backward (see dflash_model.h).
 *
 * The file reads top to bottom: configuration helpers, the parameter size table, the activation
 * plan, creation, then forward and backward side by side for each piece (context fusion,
 * attention with KV injection, MLP, final norm + loss). Shapes use the names of ops.h:
 * Tc context rows, Q = nb*B query rows, Tk = Tc + Q key rows, D, H, Hk, d, F, V, nF.
 */
#include "dflash_model.h"
#include "master_split.h"
#include "rng_fill.h"

#include "config.h"
#include "err.h"
#include "hf_config.h"
#include "log.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * configuration */

int dflash_default_layer_ids(int L, int n, int *ids) {
    return hf_config_dflash_layers(L, n, ids); /* one copy of the rule, in hf_config */
}

void dflash_config_default(dflash_config *c, const model_config *t, int num_layers, int block_size,
                           int mask_token_id) {
    memset(c, 0, sizeof *c);
    c->hidden_size = t->hidden_size;
    c->num_layers = num_layers;
    c->num_heads = t->num_heads;
    c->num_kv_heads = t->num_kv_heads;
    c->head_dim = t->head_dim;
    c->intermediate_size = t->intermediate_size;
    c->block_size = block_size;
    c->n_feat = num_layers < DFLASH_MAX_FEAT ? num_layers : DFLASH_MAX_FEAT;
    c->num_target_layers = t->num_layers;
    if (dflash_default_layer_ids(t->num_layers, c->n_feat, c->target_layer_ids))
        c->n_feat = 0; /* too shallow for the rule: validate refuses until ids are given */
    c->mask_token_id = mask_token_id;
    c->vocab_size = t->vocab_size;
    c->max_position_embeddings = t->max_position_embeddings;
    c->rms_norm_eps = t->rms_norm_eps;
    c->rope_theta = t->rope_theta;
    c->tie_word_embeddings = t->tie_word_embeddings;
    c->bos_token_id = t->bos_token_id;
    c->eos_token_id = t->eos_token_id;
}

int dflash_config_validate(const dflash_config *c, char *msg, size_t msglen) {
#define BAD(...)                                                                                   \
    do {                                                                                           \
        if (msg) snprintf(msg, msglen, __VA_ARGS__);                                               \
        return DFLASH_ECONFIG;                                                                     \
    } while (0)
    if (c->hidden_size < 1) BAD("hidden_size %d must be >= 1", c->hidden_size);
    if (c->num_layers < 1 || c->num_layers > DFLASH_MAX_LAYERS)
        BAD("num_hidden_layers %d must be in [1, %d]", c->num_layers, DFLASH_MAX_LAYERS);
    if (c->num_heads < 1 || c->num_kv_heads < 1 || c->num_heads % c->num_kv_heads)
        BAD("num_attention_heads %d must be a multiple of num_key_value_heads %d", c->num_heads,
            c->num_kv_heads);
    if (c->head_dim < 2 || c->head_dim % 2) BAD("head_dim %d must be even", c->head_dim);
    if (c->intermediate_size < 1) BAD("intermediate_size %d must be >= 1", c->intermediate_size);
    if (c->block_size < 2) BAD("block_size %d must be >= 2", c->block_size);
    if (c->n_feat < 1 || c->n_feat > DFLASH_MAX_FEAT)
        BAD("%d target layers; must be in [1, %d]", c->n_feat, DFLASH_MAX_FEAT);
    if (c->vocab_size < 2) BAD("vocab_size %d must be >= 2", c->vocab_size);
    if (c->mask_token_id < 0 || c->mask_token_id >= c->vocab_size)
        BAD("mask_token_id %d outside the vocabulary [0, %d)", c->mask_token_id, c->vocab_size);
    for (int i = 0; i < c->n_feat; i++)
        if (c->target_layer_ids[i] < 0 || c->target_layer_ids[i] >= c->num_target_layers)
            BAD("target_layer_ids[%d] = %d outside the target's %d layers", i,
                c->target_layer_ids[i], c->num_target_layers);
    if (!(c->rms_norm_eps > 0)) BAD("rms_norm_eps %g must be > 0", c->rms_norm_eps);
    if (!(c->rope_theta > 0)) BAD("rope_theta %g must be > 0", c->rope_theta);
    return 0;
#undef BAD
}

int dflash_config_check_target(const dflash_config *c, const model_config *t, const int *ids,
                               int n_ids, char *msg, size_t msglen) {
#define BAD(...)                                                                                   \
    do {                                                                                           \
        if (msg) snprintf(msg, msglen, __VA_ARGS__);                                               \
        return DFLASH_EMISMATCH;                                                                   \
    } while (0)
    if (c->hidden_size != t->hidden_size)
        BAD("drafter hidden_size %d does not match target hidden_size %d", c->hidden_size,
            t->hidden_size);
    if (c->vocab_size != t->vocab_size)
        BAD("drafter vocab_size %d does not match target vocab_size %d", c->vocab_size,
            t->vocab_size);
    if (c->num_target_layers != t->num_layers)
        BAD("drafter num_target_layers %d does not match target num_hidden_layers %d",
            c->num_target_layers, t->num_layers);
    if (ids && c->n_feat != n_ids)
        BAD("drafter uses %d target layers but the target captures %d", c->n_feat, n_ids);
    for (int i = 0; ids && i < n_ids; i++)
        if (c->target_layer_ids[i] != ids[i])
            BAD("drafter target_layer_ids[%d] %d does not match target captured layer %d", i,
                c->target_layer_ids[i], ids[i]);
    for (int i = 0; i < c->n_feat; i++)
        if (c->target_layer_ids[i] >= t->num_layers)
            BAD("drafter target_layer_ids[%d] %d is beyond the target's %d layers", i,
                c->target_layer_ids[i], t->num_layers);
    if (c->mask_token_id < 0 || c->mask_token_id >= t->vocab_size)
        BAD("drafter mask_token_id %d is outside target vocab_size %d", c->mask_token_id,
            t->vocab_size);
    /* not the tensors' shapes, but the drafter's function: dflash_config_default's copies */
    if (c->rope_theta != t->rope_theta)
        BAD("drafter rope_theta %g does not match target rope_theta %g (a drafter takes it from "
            "the target it is trained on)", c->rope_theta, t->rope_theta);
    if (c->rms_norm_eps != t->rms_norm_eps)
        BAD("drafter rms_norm_eps %g does not match target rms_norm_eps %g (a drafter takes it "
            "from the target it is trained on)", c->rms_norm_eps, t->rms_norm_eps);
    return 0;
#undef BAD
}

/* ---------------------------------------------------------------------------------------------
 * the parameter size table */

static const char *layer_names[DFL_N_LAYER_TENSORS] = {
    [DFL_Q] = "self_attn.q_proj.weight",
    [DFL_K] = "self_attn.k_proj.weight",
    [DFL_V] = "self_attn.v_proj.weight",
    [DFL_O] = "self_attn.o_proj.weight",
    [DFL_GATE] = "mlp.gate_proj.weight",
    [DFL_UP] = "mlp.up_proj.weight",
    [DFL_DOWN] = "mlp.down_proj.weight",
    [DFL_IN_LN] = "input_layernorm.weight",
    [DFL_POST_LN] = "post_attention_layernorm.weight",
    [DFL_Q_NORM] = "self_attn.q_norm.weight",
    [DFL_K_NORM] = "self_attn.k_norm.weight",
};

static int add_tensor(dflash_model *m, const char *name, int ndim, int s0, int s1, size_t *off) {
    dflash_tensor *t = &m->tensors[m->n_tensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = s0;
    t->shape[1] = ndim == 2 ? s1 : 1;
    t->numel = (size_t)s0 * (size_t)t->shape[1];
    t->offset = *off;
    t->decay = ndim == 2;
    *off += (t->numel + 63) & ~(size_t)63; /* 256-byte aligned tensors */
    return m->n_tensors++;
}

/* Matrices first, then vectors, so AdamW runs twice (with and without decay) over two ranges. */
static void plan_params(dflash_model *m) {
    const dflash_config *c = &m->cfg;
    int D = c->hidden_size, Hd = c->num_heads * c->head_dim, Hkd = c->num_kv_heads * c->head_dim;
    int F = c->intermediate_size, L = c->num_layers;
    size_t off = 0;
    char name[64];
    m->n_tensors = 0;
    m->t_fc = add_tensor(m, "fc.weight", 2, D, c->n_feat * D, &off);
    for (int l = 0; l < L; l++) {
        int shp[DFL_DOWN + 1][2] = {
            [DFL_Q] = {Hd, D},   [DFL_K] = {Hkd, D}, [DFL_V] = {Hkd, D},  [DFL_O] = {D, Hd},
            [DFL_GATE] = {F, D}, [DFL_UP] = {F, D},  [DFL_DOWN] = {D, F},
        };
        for (int k = DFL_Q; k <= DFL_DOWN; k++) {
            snprintf(name, sizeof name, "layers.%d.%s", l, layer_names[k]);
            int t = m->t_layer[l][k] = add_tensor(m, name, 2, shp[k][0], shp[k][1], &off);
            if (k == DFL_GATE) /* up right after gate: one [2F, D] product for both */
                off = m->tensors[t].offset + m->tensors[t].numel;
        }
    }
    /* the vectors' gradients (fp32) follow the matrices' (act) 256-byte aligned in either type */
    m->n_decay = off = (off + 127) & ~(size_t)127;
    m->t_hidden_norm = add_tensor(m, "hidden_norm.weight", 1, D, 0, &off);
    m->t_norm = add_tensor(m, "norm.weight", 1, D, 0, &off);
    for (int l = 0; l < L; l++) {
        int n[DFL_N_LAYER_TENSORS] = {[DFL_IN_LN] = D,
                                      [DFL_POST_LN] = D,
                                      [DFL_Q_NORM] = c->head_dim,
                                      [DFL_K_NORM] = c->head_dim};
        for (int k = DFL_IN_LN; k < DFL_N_LAYER_TENSORS; k++) {
            snprintf(name, sizeof name, "layers.%d.%s", l, layer_names[k]);
            m->t_layer[l][k] = add_tensor(m, name, 1, n[k], 0, &off);
        }
    }
    m->n_params = off;
}

int dflash_model_find(const dflash_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return i;
    return -1;
}

nn_buf *dflash_model_weight(const dflash_model *m, int i) {
    return (char *)m->params + m->tensors[i].offset * m->ops->act_bytes;
}
float *dflash_model_master(const dflash_model *m, int i) {
    const dflash_tensor *t = &m->tensors[i];
    if (!t->decay) return m->master_vec + (t->offset - m->n_decay);
    return m->master ? m->master + t->offset : NULL;
}

/* Host staging of the split masters' transfers: this many elements at a time. */
#define SPLIT_CHUNK ((size_t)1 << 23)

int dflash_model_masters_download(const dflash_model *m, float *dst) {
    const nn_ops *o = m->ops;
    size_t nd = m->n_decay, nv = m->n_params - nd;
    o->download_raw(m->ctx, dst + nd, m->master_vec, nv * sizeof(float));
    if (m->master) {
        o->download_raw(m->ctx, dst, m->master, nd * sizeof(float));
        return 0;
    }
    /* the low halves into dst's own bytes, the high ones chunk by chunk beside them */
    uint16_t *hi = malloc(SPLIT_CHUNK * sizeof(uint16_t));
    if (!hi) {
        LOG_ERROR("drafter: out of host memory for the masters' download");
        return DFLASH_ENOMEM;
    }
    for (size_t a = 0; a < nd; a += SPLIT_CHUNK) {
        size_t k = nd - a < SPLIT_CHUNK ? nd - a : SPLIT_CHUNK;
        uint16_t *lo = (uint16_t *)(dst + a); /* k halves in the first half of dst[a, a + k) */
        o->download_raw(m->ctx, hi, (const char *)m->params + a * sizeof(uint16_t),
                        k * sizeof(uint16_t));
        o->download_raw(m->ctx, lo, m->master_lo + a, k * sizeof(uint16_t));
        nn_master_join_n(hi, lo, dst + a, k);
    }
    free(hi);
    return 0;
}

int dflash_model_masters_upload(dflash_model *m, const float *src) {
    const nn_ops *o = m->ops;
    size_t nd = m->n_decay, nv = m->n_params - nd;
    o->upload_raw(m->ctx, m->master_vec, src + nd, nv * sizeof(float));
    if (m->master) {
        o->upload_raw(m->ctx, m->master, src, nd * sizeof(float));
    } else {
        uint16_t *half = malloc(2 * SPLIT_CHUNK * sizeof(uint16_t));
        if (!half) {
            LOG_ERROR("drafter: out of host memory for the masters' upload");
            return DFLASH_ENOMEM;
        }
        for (size_t a = 0; a < nd; a += SPLIT_CHUNK) {
            size_t k = nd - a < SPLIT_CHUNK ? nd - a : SPLIT_CHUNK;
            uint16_t *hi = half, *lo = half + SPLIT_CHUNK;
            nn_master_split_n(src + a, hi, lo, k);
            /* upload_raw returns once the source is staged: the next chunk may overwrite it */
            o->upload_raw(m->ctx, (char *)m->params + a * sizeof(uint16_t), hi,
                          k * sizeof(uint16_t));
            o->upload_raw(m->ctx, m->master_lo + a, lo, k * sizeof(uint16_t));
        }
        free(half);
    }
    dflash_model_sync_params(m);
    return 0;
}

int dflash_model_master_ranges(const dflash_model *m, void *ptr[3], size_t bytes[3]) {
    if (m->master) {
        ptr[0] = m->master, bytes[0] = m->n_params * sizeof(float);
        return 1;
    }
    size_t nd = m->n_decay;
    ptr[0] = m->params, bytes[0] = nd * m->ops->act_bytes;
    ptr[1] = m->master_lo, bytes[1] = nd * sizeof(uint16_t);
    ptr[2] = m->master_vec, bytes[2] = (m->n_params - nd) * sizeof(float);
    return 3;
}
void *dflash_model_grad(const dflash_model *m, int i) {
    const dflash_tensor *t = &m->tensors[i];
    if (t->decay) return (char *)m->grads + t->offset * m->ops->act_bytes;
    return m->grads_vec + (t->offset - m->n_decay);
}

void dflash_model_grad_download(const dflash_model *m, int i, float *dst) {
    const dflash_tensor *t = &m->tensors[i];
    if (t->decay)
        m->ops->download(m->ctx, dst, dflash_model_grad(m, i), t->numel);
    else
        m->ops->download_raw(m->ctx, dst, dflash_model_grad(m, i), t->numel * sizeof(float));
}

void dflash_model_sync_params(dflash_model *m) {
    m->ops->side_wait(m->ctx, -1); /* a queued optimizer step writes params too */
    if ((void *)m->params == (void *)m->master) return;
    if (m->master) {
        m->ops->f32_to_act(m->ctx, m->params, m->master, m->n_params);
        return;
    }
    size_t nd = m->n_decay; /* split: the vectors' only */
    m->ops->f32_to_act(m->ctx, (char *)m->params + nd * m->ops->act_bytes, m->master_vec,
                       m->n_params - nd);
}

size_t dflash_model_layer_offset(const dflash_model *m, int l) {
    if (l >= m->cfg.num_layers) return m->n_decay;
    return m->tensors[m->t_layer[l][DFL_Q]].offset;
}

/* Short names for the act-typed weights and the grads (act matrices, fp32 vectors) below. */
#define LW(m, l, k) dflash_model_weight(m, (m)->t_layer[l][k])
#define LG(m, l, k) dflash_model_grad(m, (m)->t_layer[l][k])

/* ---------------------------------------------------------------------------------------------
 * the activation plan: one allocation, regions 256-byte aligned, planned for the max shapes */

typedef struct plan {
    char *base; /* NULL while sizing */
    size_t off;
} plan;

static void *take(plan *p, size_t bytes) {
    void *r = p->base ? p->base + p->off : NULL;
    p->off += (bytes + 255) & ~(size_t)255;
    return r;
}

static void plan_acts(dflash_model *m, plan *p) {
    const dflash_config *c = &m->cfg;
    size_t ab = m->ops->act_bytes;
    size_t D = c->hidden_size, H = c->num_heads, Hk = c->num_kv_heads, d = c->head_dim;
    size_t F = c->intermediate_size, V = c->vocab_size;
    size_t Tc = m->max_tokens, Q = (size_t)m->max_blocks * c->block_size, Tk = Tc + Q;
    for (int l = 0; l <= c->num_layers; l++)
        m->resid[l] = take(p, Q * D * ab);
    for (int l = 0; l < c->num_layers; l++) {
        dflash_layer_acts *a = &m->la[l];
        /* xln [Q, D] after Tc_max rows for the context's Ht (ctx_rows) */
        char *xc = take(p, Tk * D * ab);
        a->xln = xc ? xc + Tc * D * ab : NULL;
        a->rstd_in = take(p, Q * 4);
        a->qraw = take(p, Q * H * d * ab);
        a->q = take(p, Q * H * d * ab);
        a->kraw = take(p, Tk * Hk * d * ab);
        a->k = take(p, Tk * Hk * d * ab);
        a->v = take(p, Tk * Hk * d * ab);
        a->att = take(p, Q * H * d * ab);
        a->lse = take(p, H * Q * 4);
        a->hmid = take(p, Q * D * ab);
        a->yln = take(p, Q * D * ab);
        a->rstd_post = take(p, Q * 4);
        a->gu = take(p, Q * 2 * F * ab);
        a->act = take(p, Q * F * ab);
    }
    m->Z = take(p, Tc * D * ab);
    m->Ht = take(p, Tc * D * ab);
    m->rstd_h = take(p, Tc * 4);
    m->out = take(p, Q * D * ab);
    m->rstd_out = take(p, Q * 4);
    m->dh = take(p, Q * D * ab);
    m->dtmp = take(p, Q * D * ab);
    char *dhx = take(p, Tk * D * ab); /* dxln [Q, D] after Tc_max rows for dHt (ctx_rows) */
    m->dxln = dhx ? dhx + Tc * D * ab : NULL;
    m->datt = take(p, Q * H * d * ab);
    m->dq = take(p, Q * H * d * ab);
    m->dqraw = take(p, Q * H * d * ab);
    m->dk = take(p, Tk * Hk * d * ab);
    m->dkraw = take(p, Tk * Hk * d * ab);
    m->dv = take(p, Tk * Hk * d * ab);
    m->dact = take(p, Q * F * ab);
    m->dgu = take(p, Q * 2 * F * ab);
    m->dZ = take(p, Tc * D * ab);
    m->lm_scratch = take(p, (size_t)m->lm_chunk * V * ab);
    m->in_ids = take(p, Q * 4);
    m->in_pos = take(p, Tk * 4);
    m->in_spans = take(p, (size_t)m->max_blocks * sizeof(nn_block_span));
    m->in_loss_rows = take(p, Q * 4);
    m->in_labels = take(p, Q * 4);
    m->in_weights = take(p, Q * 4);
    m->loss_correct = take(p, Q * 4);
    m->out_correct = take(p, Q * 4);
    m->out_argmax = take(p, Q * 4);
    m->out_sums = take(p, 2 * 4);
    m->out_sumsq = take(p, 4);
    m->inv_freq = take(p, d / 2 * 4);
    m->rope_rot = take(p, Tk * d * 4);
    size_t U = (size_t)m->u_cap;
    m->in_rows_c = take(p, Q * 4);
    m->in_loss_rows_c = take(p, Q * 4);
    m->in_umap = take(p, Q * 4);
    m->in_uids = take(p, U * 4);
    m->eye = take(p, U * U * ab);
    m->sel = take(p, Q * U * ab);
    m->du = take(p, U * (H + 2 * Hk) * d * ab);
}

/* ---------------------------------------------------------------------------------------------
 * creation */

#define LM_SCRATCH_BYTES ((size_t)2500 << 20) /* the lm_head chunk's logits, at most */

dflash_model *dflash_model_new(const dflash_config *cfg, const nn_ops *ops, nn_ctx *ctx,
                               const nn_buf *embed, const nn_buf *lm_head, int max_tokens,
                               int max_blocks, uint64_t init_seed) {
    char msg[256];
    if (dflash_config_validate(cfg, msg, sizeof msg)) {
        LOG_ERROR("drafter config: %s", msg);
        return NULL;
    }
    if (nn_ops_check_heads(ops, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim, msg,
                           sizeof msg)) {
        LOG_ERROR("drafter: %s", msg);
        return NULL;
    }
    if (max_tokens < 1 || max_blocks < 1 || !embed || !lm_head) {
        LOG_ERROR("drafter: max_tokens %d and max_blocks %d must be >= 1, embed and lm_head set",
                  max_tokens, max_blocks);
        return NULL;
    }
    dflash_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->ops = ops;
    m->ctx = ctx;
    m->embed = embed;
    m->lm_head = lm_head;
    m->max_tokens = max_tokens;
    m->max_blocks = max_blocks;
    int Qmax = max_blocks * cfg->block_size;
    /* rows per lm_head chunk: as many as LM_SCRATCH_BYTES of logits hold (all 7680 loss rows of
     * a 512-anchor step at Qwen3's vocabulary in bf16: one product each way instead of four),
     * or DFLASH_LM_CHUNK, at most INT_MAX logits a chunk (the products' int sizes) */
    size_t fit = LM_SCRATCH_BYTES / ((size_t)cfg->vocab_size * ops->act_bytes);
    int max_chunk = INT_MAX / cfg->vocab_size < 2 ? 2 : INT_MAX / cfg->vocab_size;
    if (fit > (size_t)max_chunk) fit = (size_t)max_chunk;
    m->lm_chunk = (int)config_env_int("DFLASH_LM_CHUNK", 2, max_chunk, fit < 2 ? 2 : (int64_t)fit);
    if (m->lm_chunk > Qmax) m->lm_chunk = Qmax; /* >= 2: block_size >= 2 */
    /* layer 0 dedup: on unless DFLASH_LAYER0_DEDUP=0 or beyond 1024 blocks (sel grows as
     * Q x u_cap) */
    bool dedup = config_env_int("DFLASH_LAYER0_DEDUP", 0, 1, 1);
    m->u_cap = !dedup || max_blocks > 1024 ? 0 : (max_blocks + 1 + 7) & ~7;
    const char *last = getenv("DFLASH_LAST_LAYER_ROWS");
    m->last_rows_ok = !(last && !strcmp(last, "all"));
    int L = cfg->num_layers;
    m->tensors = calloc((size_t)(3 + L * DFL_N_LAYER_TENSORS), sizeof *m->tensors);
    m->resid = calloc((size_t)L + 1, sizeof *m->resid);
    m->la = calloc((size_t)L, sizeof *m->la);
    float *host = NULL;
    if (!m->tensors || !m->resid || !m->la) goto fail;
    size_t Q = (size_t)Qmax, Tk = (size_t)max_tokens + Q;
    m->h_ids = malloc(Q * 4);
    m->h_labels = malloc(Q * 4);
    m->h_correct = malloc(Q * 4);
    m->h_argmax = malloc(Q * 4);
    m->h_weights = malloc(Q * 4);
    m->h_loss_rows = malloc(Q * 4);
    m->h_loss_labels = malloc(Q * 4);
    m->h_loss_weights = malloc(Q * 4);
    m->h_pos = malloc(Tk * 4);
    m->h_spans = malloc((size_t)max_blocks * sizeof *m->h_spans);
    m->h_blk_seq = malloc((size_t)max_blocks * 4);
    m->h_blk_anchor = malloc((size_t)max_blocks * 4);
    m->h_cand = malloc((size_t)max_tokens * 4);
    m->h_rows_c = malloc(Q * 4);
    m->h_loss_rows_c = malloc(Q * 4);
    m->h_umap = malloc(Q * 4);
    m->h_uids = malloc((size_t)m->u_cap * 4 + 4);
    m->h_uhash = malloc((size_t)m->u_cap * 16 + 4);
    if (!m->h_ids || !m->h_labels || !m->h_correct || !m->h_argmax || !m->h_weights || !m->h_pos ||
        !m->h_loss_rows || !m->h_loss_labels || !m->h_loss_weights || !m->h_spans ||
        !m->h_blk_seq || !m->h_blk_anchor || !m->h_cand || !m->h_umap || !m->h_uids ||
        !m->h_uhash || !m->h_rows_c || !m->h_loss_rows_c)
        goto fail;
    plan_params(m);

    size_t pbytes = m->n_params * sizeof(float), nd = m->n_decay;
    if (ops->master_split) { /* the matrices' high halves are the act weights (params) */
        assert(ops->act_bytes == sizeof(uint16_t));
        m->master_lo = ops->alloc(ctx, nd * sizeof(uint16_t));
        m->master_vec = ops->alloc(ctx, (m->n_params - nd) * sizeof(float));
    } else {
        m->master = ops->alloc(ctx, pbytes);
        m->master_vec = m->master ? m->master + nd : NULL;
    }
    m->grad_bytes = m->n_decay * ops->act_bytes + (m->n_params - m->n_decay) * sizeof(float);
    m->grads = ops->alloc(ctx, m->grad_bytes);
    m->adam_m = ops->alloc(ctx, pbytes);
    m->adam_v = ops->alloc(ctx, pbytes);
    m->grads_vec = m->grads ? (float *)((char *)m->grads + m->n_decay * ops->act_bytes) : NULL;
    if (ops->act_bytes == sizeof(float))
        m->params = m->master;
    else
        m->params = ops->alloc(ctx, m->n_params * ops->act_bytes);
    plan p = {0};
    plan_acts(m, &p);
    m->acts_mem = ops->alloc(ctx, p.off);
    if (!m->master_vec || (ops->master_split && !m->master_lo) || !m->grads || !m->adam_m ||
        !m->adam_v || !m->params || !m->acts_mem) {
        LOG_ERROR("drafter: out of memory (%zu parameters, %zu activation bytes)", m->n_params,
                  p.off);
        goto fail;
    }
    p = (plan){.base = m->acts_mem};
    plan_acts(m, &p);
    /* the attention backward's scratch for the largest step, now rather than in a step */
    if (ops->attention_block_plan)
        ops->attention_block_plan(ctx, Qmax, max_tokens + Qmax, cfg->num_heads, cfg->num_kv_heads,
                                  cfg->head_dim);

    /* fresh weights (HF post_init): linear ~ N(0, 0.02), norms 1; generated on the host, the
     * matrices in tensor order from one stream, the first normal of each pair (the values as
     * before rng_fill, which draws them on threads) */
    host = calloc(m->n_params, sizeof(float));
    if (!host) goto fail;
    uint64_t s = init_seed ^ 0x6466666c61736864ull;
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        float *w = host + t->offset;
        if (t->ndim == 1)
            for (size_t j = 0; j < t->numel; j++)
                w[j] = 1.0f;
        else
            rng_fill(&s, w, t->numel, 0.02, RNG_FILL_NORMAL_FIRST);
    }
    if (dflash_model_masters_upload(m, host)) goto fail;
    if (m->u_cap) { /* the identity sel gathers its rows from (u_cap^2 <= 1032^2 floats) */
        size_t U = (size_t)m->u_cap;
        float *eye = calloc(U * U, sizeof(float));
        if (!eye) goto fail;
        for (size_t i = 0; i < U; i++)
            eye[i * U + i] = 1.0f;
        ops->upload(ctx, m->eye, eye, U * U);
        free(eye);
    }
    float *inv = host; /* reuse for the rope table */
    rope_inv_freq(inv, cfg->head_dim, cfg->rope_theta, NULL);
    ops->upload_raw(ctx, m->inv_freq, inv, (size_t)cfg->head_dim / 2 * sizeof(float));
    free(host);
    LOG_INFO("drafter: %d layers, D %d, %zu trainable parameters, %.1f MiB activations", L,
             cfg->hidden_size, m->n_params, (double)p.off / (1 << 20));
    return m;
fail:
    free(host);
    dflash_model_destroy(&m);
    return NULL;
}

void dflash_model_destroy(dflash_model **pm) {
    if (!pm || !*pm) return;
    dflash_model *m = *pm;
    if (m->pending_free) m->pending_free(m);
    if ((void *)m->params != (void *)m->master) m->ops->free(m->ctx, m->params);
    m->ops->free(m->ctx, m->master);
    if (!m->master) m->ops->free(m->ctx, m->master_vec); /* its own array only where split */
    m->ops->free(m->ctx, m->master_lo);
    m->ops->free(m->ctx, m->grads);
    m->ops->free(m->ctx, m->adam_m);
    m->ops->free(m->ctx, m->adam_v);
    m->ops->free(m->ctx, m->acts_mem);
    free(m->h_ids);
    free(m->h_labels);
    free(m->h_correct);
    free(m->h_argmax);
    free(m->h_weights);
    free(m->h_loss_rows);
    free(m->h_loss_labels);
    free(m->h_loss_weights);
    free(m->h_pos);
    free(m->h_spans);
    free(m->h_blk_seq);
    free(m->h_blk_anchor);
    free(m->h_cand);
    free(m->h_rows_c);
    free(m->h_loss_rows_c);
    free(m->h_umap);
    free(m->h_uids);
    free(m->h_uhash);
    free(m->tensors);
    free(m->resid);
    free(m->la);
    free(m);
    *pm = NULL;
}

/* The distinct ids among noise_ids[Q] in order of first appearance: h_uids[u], and
 * h_umap[r] = u of row r. Returns their count U, or 0 (no dedup) when dedup is off, U would
 * exceed u_cap or 2 U > Q (layer 0's xln keeps the U distinct rows and their inputs in its
 * first 2 U rows). */
static int distinct_rows(dflash_model *m, const int32_t *ids, int Q) {
    int cap = m->u_cap, U = 0, slots = 1;
    if (!cap) return 0;
    while (slots < 2 * cap) /* a power of two below 4 u_cap: h_uhash's size */
        slots <<= 1;
    uint32_t mask = (uint32_t)slots - 1;
    memset(m->h_uhash, 0xff, (size_t)slots * sizeof(int32_t));
    for (int r = 0; r < Q; r++) {
        uint32_t h = ((uint32_t)ids[r] * 2654435761u) & mask;
        while (m->h_uhash[h] >= 0 && m->h_uids[m->h_uhash[h]] != ids[r])
            h = (h + 1) & mask;
        if (m->h_uhash[h] < 0) {
            if (U == cap || 2 * (U + 1) > Q) return 0;
            m->h_uids[U] = ids[r];
            m->h_uhash[h] = U++;
        }
        m->h_umap[r] = m->h_uhash[h];
    }
    return U;
}

int dflash_model_set_inputs(dflash_model *m, int Tc, int nb, const int32_t *noise_ids,
                            const int32_t *pos, const nn_block_span *spans, const int32_t *labels,
                            const float *weights) {
    if (Tc < 1 || Tc > m->max_tokens || nb < 1 || nb > m->max_blocks) return DFLASH_EINVAL;
    size_t Q = (size_t)nb * m->cfg.block_size;
    const nn_ops *o = m->ops;
    o->upload_raw(m->ctx, m->in_ids, noise_ids, Q * sizeof(int32_t));
    o->upload_raw(m->ctx, m->in_pos, pos, ((size_t)Tc + Q) * sizeof(int32_t));
    o->upload_raw(m->ctx, m->in_spans, spans, (size_t)nb * sizeof(nn_block_span));
    int n = 0, B = m->cfg.block_size;
    for (size_t r = 0; labels && weights && r < Q; r++)
        if (weights[r] > 0.0f) {
            m->h_loss_rows[n] = (int32_t)r;
            /* loss rows are never a block's first: their row among the Qc others */
            m->h_loss_rows_c[n] = r % B ? (int32_t)(r / B * (B - 1) + r % B - 1) : -1;
            m->h_loss_labels[n] = labels[r];
            m->h_loss_weights[n++] = weights[r];
        }
    m->cur_qc = nb * (B - 1);
    for (int i = 0; i < n && m->cur_qc; i++)
        if (m->h_loss_rows_c[i] < 0) m->cur_qc = 0; /* a weighted first row: no compaction */
    for (int i = 0; i < m->cur_qc; i++)
        m->h_rows_c[i] = i / (B - 1) * B + i % (B - 1) + 1;
    if (n) {
        o->upload_raw(m->ctx, m->in_loss_rows, m->h_loss_rows, (size_t)n * sizeof(int32_t));
        o->upload_raw(m->ctx, m->in_labels, m->h_loss_labels, (size_t)n * sizeof(int32_t));
        o->upload_raw(m->ctx, m->in_weights, m->h_loss_weights, (size_t)n * sizeof(float));
    }
    if (n && m->cur_qc) {
        o->upload_raw(m->ctx, m->in_loss_rows_c, m->h_loss_rows_c, (size_t)n * sizeof(int32_t));
        o->upload_raw(m->ctx, m->in_rows_c, m->h_rows_c, (size_t)m->cur_qc * sizeof(int32_t));
    }
    m->cur_tc = Tc;
    m->cur_nb = nb;
    m->cur_loss_rows = n;
    m->cur_u = distinct_rows(m, noise_ids, (int)Q);
    if (m->cur_u) {
        o->upload_raw(m->ctx, m->in_umap, m->h_umap, Q * sizeof(int32_t));
        o->upload_raw(m->ctx, m->in_uids, m->h_uids, (size_t)m->cur_u * sizeof(int32_t));
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * forward and backward */

/* Row r of an act-typed [*, cols] buffer. */
static nn_buf *row(const dflash_model *m, const nn_buf *b, size_t r, size_t cols) {
    return (char *)b + r * cols * m->ops->act_bytes;
}

/* The cur_tc rows right before b, a [Q, D] buffer planned after Tc_max spare rows (a layer's
 * xln, dxln): there a copy of Ht and dHt sit right before the block rows, so one k or v product
 * and its backward run over the Tk = Tc + Q rows [context ; block] at once. */
static nn_buf *ctx_rows(const dflash_model *m, const nn_buf *b) {
    return (char *)b - (size_t)m->cur_tc * m->cfg.hidden_size * m->ops->act_bytes;
}

/* Context fusion. Forward: Z[Tc,D] = X[Tc,nF*D] Wfc^T; Ht = rmsnorm(Z, hidden_norm).
 * Backward: dZ = rmsnorm_bwd(dHt); dWfc = dZ^T X (no dX: the target features are frozen). */
static void context_fwd(dflash_model *m, const nn_buf *X) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    int Tc = m->cur_tc, D = c->hidden_size;
    o->linear_fwd(m->ctx, m->Z, X, dflash_model_weight(m, m->t_fc), NULL, Tc, c->n_feat * D, D);
    o->rmsnorm_fwd(m->ctx, m->Ht, m->rstd_h, m->Z, dflash_model_weight(m, m->t_hidden_norm), Tc, D,
                   (float)c->rms_norm_eps);
}

static void context_bwd(dflash_model *m, const nn_buf *X) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    int Tc = m->cur_tc, D = c->hidden_size;
    o->rmsnorm_bwd(m->ctx, m->dZ, dflash_model_grad(m, m->t_hidden_norm), ctx_rows(m, m->dxln),
                   m->Z, dflash_model_weight(m, m->t_hidden_norm), m->rstd_h, Tc, D, NULL);
    o->linear_bwd(m->ctx, NULL, dflash_model_grad(m, m->t_fc), NULL, m->dZ, X,
                  dflash_model_weight(m, m->t_fc), Tc, c->n_feat * D, D, NN_BWD_DW_SET);
}

/* Layer 0's input norm and q, k, v products of the block rows on the cur_u distinct rows
 * (see dflash_model.h): xln keeps their norm output in rows [0, U) and their inputs (embedding
 * rows) in [U, 2U) for the backward; the products go to backward scratch (free during the
 * forward) and are gathered to every block row. */
static void qkv_blocks_fwd_distinct(dflash_model *m) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    dflash_layer_acts *a = &m->la[0];
    int Tc = m->cur_tc, Q = m->cur_nb * c->block_size, U = m->cur_u, D = c->hidden_size;
    int Hd = c->num_heads * c->head_dim, Hkd = c->num_kv_heads * c->head_dim;
    nn_buf *xu = row(m, a->xln, U, D);
    o->embedding_fwd(m->ctx, xu, m->in_uids, m->embed, U, D);
    o->rmsnorm_fwd(m->ctx, a->xln, a->rstd_in, xu, LW(m, 0, DFL_IN_LN), U, D,
                   (float)c->rms_norm_eps);
    o->linear_fwd(m->ctx, m->dqraw, a->xln, LW(m, 0, DFL_Q), NULL, U, D, Hd);
    o->embedding_fwd(m->ctx, a->qraw, m->in_umap, m->dqraw, Q, Hd);
    o->linear_fwd(m->ctx, m->dkraw, a->xln, LW(m, 0, DFL_K), NULL, U, D, Hkd);
    o->embedding_fwd(m->ctx, row(m, a->kraw, Tc, Hkd), m->in_umap, m->dkraw, Q, Hkd);
    o->linear_fwd(m->ctx, m->dv, a->xln, LW(m, 0, DFL_V), NULL, U, D, Hkd);
    o->embedding_fwd(m->ctx, row(m, a->v, Tc, Hkd), m->in_umap, m->dv, Q, Hkd);
    o->linear_fwd(m->ctx, a->kraw, m->Ht, LW(m, 0, DFL_K), NULL, Tc, D, Hkd);
    o->linear_fwd(m->ctx, a->v, m->Ht, LW(m, 0, DFL_V), NULL, Tc, D, Hkd);
}

/* Backward of the q, k, v products and input norm, layer l, with k and v over the Tk rows
 * [context ; block] at once (see ctx_rows): dqraw, dkraw and dv in; dxln through the three
 * products (q sets it), dHt (the rows before it) accumulating the k and v products over layers;
 * then the norm's backward, which adds the residual's own gradient dh in place (dres = dx). */
static void qkv_bwd(dflash_model *m, int l) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    dflash_layer_acts *a = &m->la[l];
    int Tk = m->cur_tc + m->cur_nb * c->block_size, Q = m->cur_nb * c->block_size;
    int D = c->hidden_size, Hd = c->num_heads * c->head_dim, Hkd = c->num_kv_heads * c->head_dim;
    const int add = NN_BWD_DX_ADD, set = NN_BWD_DW_SET;
    nn_buf *dhx = ctx_rows(m, m->dxln), *xc = ctx_rows(m, a->xln);
    o->linear_bwd(m->ctx, m->dxln, LG(m, l, DFL_Q), NULL, m->dqraw, a->xln, LW(m, l, DFL_Q), Q, D,
                  Hd, set);
    o->linear_bwd(m->ctx, dhx, LG(m, l, DFL_K), NULL, m->dkraw, xc, LW(m, l, DFL_K), Tk, D, Hkd,
                  add | set);
    o->linear_bwd(m->ctx, dhx, LG(m, l, DFL_V), NULL, m->dv, xc, LW(m, l, DFL_V), Tk, D, Hkd,
                  add | set);
    o->rmsnorm_bwd(m->ctx, m->dh, LG(m, l, DFL_IN_LN), m->dxln, m->resid[l], LW(m, l, DFL_IN_LN),
                   a->rstd_in, Q, D, m->dh);
}

/* The same for layer 0 on its distinct rows: the gradients of q, k, v are summed per distinct
 * row (du = sel^T [dq | dk | dv], one product each with the one-hot rows sel, accumulated in
 * fp32 and rounded once as linear_bwd's dw), the products' backward runs on U rows, and the
 * input norm's backward gives only its weight's gradient (resid[0], the frozen embedding,
 * takes none). */
static void qkv_blocks_bwd_distinct(dflash_model *m) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    dflash_layer_acts *a = &m->la[0];
    int Tc = m->cur_tc, Q = m->cur_nb * c->block_size, U = m->cur_u, Uc = m->u_cap;
    int D = c->hidden_size, Hd = c->num_heads * c->head_dim, Hkd = c->num_kv_heads * c->head_dim;
    const int add = NN_BWD_DX_ADD, set = NN_BWD_DW_SET;
    nn_buf *uq = m->du, *uk = row(m, m->du, Uc, Hd), *uv = row(m, uk, Uc, Hkd);
    o->embedding_fwd(m->ctx, m->sel, m->in_umap, m->eye, Q, Uc);
    o->linear_bwd(m->ctx, NULL, uq, NULL, m->sel, m->dqraw, NULL, Q, Hd, Uc, set);
    o->linear_bwd(m->ctx, NULL, uk, NULL, m->sel, row(m, m->dkraw, Tc, Hkd), NULL, Q, Hkd, Uc,
                  set);
    o->linear_bwd(m->ctx, NULL, uv, NULL, m->sel, row(m, m->dv, Tc, Hkd), NULL, Q, Hkd, Uc, set);
    o->linear_bwd(m->ctx, m->dxln, LG(m, 0, DFL_Q), NULL, uq, a->xln, LW(m, 0, DFL_Q), U, D, Hd,
                  set);
    o->linear_bwd(m->ctx, m->dxln, LG(m, 0, DFL_K), NULL, uk, a->xln, LW(m, 0, DFL_K), U, D, Hkd,
                  add | set);
    o->linear_bwd(m->ctx, m->dxln, LG(m, 0, DFL_V), NULL, uv, a->xln, LW(m, 0, DFL_V), U, D, Hkd,
                  add | set);
    o->rmsnorm_bwd(m->ctx, m->dtmp, LG(m, 0, DFL_IN_LN), m->dxln, row(m, a->xln, U, D),
                   LW(m, 0, DFL_IN_LN), a->rstd_in, U, D, NULL);
    /* the context rows' k, v products on their own: dHt accumulates, dWk and dWv add (to the
     * act-rounded sum of the distinct rows' product, rounded again: on cuda two bf16 roundings,
     * accepted; layers >= 1 take both row sets in one product) */
    nn_buf *dHt = ctx_rows(m, m->dxln);
    o->linear_bwd(m->ctx, dHt, LG(m, 0, DFL_K), NULL, m->dkraw, m->Ht, LW(m, 0, DFL_K), Tc, D, Hkd,
                  add);
    o->linear_bwd(m->ctx, dHt, LG(m, 0, DFL_V), NULL, m->dv, m->Ht, LW(m, 0, DFL_V), Tc, D, Hkd,
                  add);
}

/* Whether layer l's o_proj and MLP run on the Qc compact rows (last_compact, last layer). */
static bool compact_layer(const dflash_model *m, int l) {
    return m->last_compact && l == m->cfg.num_layers - 1;
}

/* Rows of layer l's o_proj output, MLP and (after the last layer) final norm: Qc or Q. */
static int post_attn_rows(const dflash_model *m, int l) {
    return compact_layer(m, l) ? m->cur_qc : m->cur_nb * m->cfg.block_size;
}

/* Attention with KV injection, layer l. Input resid[l] [Q,D], output hmid [Q,D].
 *   xln = rmsnorm(h); qraw = xln Wq^T; q = rope(rmsnorm_head(qraw))
 *   kraw = [Ht Wk^T ; xln Wk^T]; k = rope(rmsnorm_head(kraw)) at [ctx pos ; blk pos]
 *   v = [Ht Wv^T ; xln Wv^T]; att = blockattn(q, k, v); hmid = h + att Wo^T */
static void attn_fwd(dflash_model *m, int l) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    dflash_layer_acts *a = &m->la[l];
    int Tc = m->cur_tc, nb = m->cur_nb, B = c->block_size, Q = nb * B, Tk = Tc + Q;
    int D = c->hidden_size, H = c->num_heads, Hk = c->num_kv_heads, d = c->head_dim;
    float eps = (float)c->rms_norm_eps;
    const nn_buf *h = m->resid[l];
    if (l == 0 && m->cur_u) {
        qkv_blocks_fwd_distinct(m);
    } else { /* k and v over [Ht ; xln] at once: Ht copied to the rows before xln */
        nn_buf *xc = ctx_rows(m, a->xln);
        o->rmsnorm_fwd(m->ctx, a->xln, a->rstd_in, h, LW(m, l, DFL_IN_LN), Q, D, eps);
        o->copy(m->ctx, xc, m->Ht, (size_t)Tc * D * o->act_bytes);
        o->linear_fwd(m->ctx, a->qraw, a->xln, LW(m, l, DFL_Q), NULL, Q, D, H * d);
        o->linear_fwd(m->ctx, a->kraw, xc, LW(m, l, DFL_K), NULL, Tk, D, Hk * d);
        o->linear_fwd(m->ctx, a->v, xc, LW(m, l, DFL_V), NULL, Tk, D, Hk * d);
    }
    o->head_norm_rope_fwd(m->ctx, a->q, a->qraw, LW(m, l, DFL_Q_NORM), m->rope_rot + (size_t)Tc * d,
                          Q, H, d, eps);
    o->head_norm_rope_fwd(m->ctx, a->k, a->kraw, LW(m, l, DFL_K_NORM), m->rope_rot, Tk, Hk, d, eps);
    o->attention_block_fwd(m->ctx, a->att, a->lse, a->q, a->k, a->v, m->in_spans, nb, B, Tk, H, Hk,
                           d);
    if (compact_layer(m, l)) { /* att and h of the Qc rows: backward scratch until then */
        o->embedding_fwd(m->ctx, m->dq, m->in_rows_c, a->att, m->cur_qc, H * d);
        o->embedding_fwd(m->ctx, m->dtmp, m->in_rows_c, h, m->cur_qc, D);
        o->linear_fwd_res(m->ctx, a->hmid, m->dq, LW(m, l, DFL_O), m->dtmp, m->cur_qc, H * d, D);
    } else {
        o->linear_fwd_res(m->ctx, a->hmid, a->att, LW(m, l, DFL_O), h, Q, H * d, D);
    }
}

/* Backward of attn_fwd: dh [Q,D] holds d/d hmid on entry and d/d resid[l] on exit; dHt
 * accumulates the context branch (k and v of the context rows). */
static void attn_bwd(dflash_model *m, int l) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    dflash_layer_acts *a = &m->la[l];
    int Tc = m->cur_tc, nb = m->cur_nb, B = c->block_size, Q = nb * B, Tk = Tc + Q;
    int D = c->hidden_size, H = c->num_heads, Hk = c->num_kv_heads, d = c->head_dim;
    /* hmid = h + att Wo^T */
    if (compact_layer(m, l)) { /* on the Qc rows, then both gradients spread to all Q rows */
        int qc = m->cur_qc;
        size_t ab = o->act_bytes;
        o->linear_bwd(m->ctx, m->dqraw, LG(m, l, DFL_O), NULL, m->dh, m->dq, LW(m, l, DFL_O), qc,
                      H * d, D, NN_BWD_DW_SET);
        o->zero(m->ctx, m->datt, (size_t)Q * H * d * ab);
        o->rows_scatter(m->ctx, m->datt, m->in_rows_c, m->dqraw, qc, (size_t)H * d * ab);
        o->copy(m->ctx, m->dtmp, m->dh, (size_t)qc * D * ab);
        o->zero(m->ctx, m->dh, (size_t)Q * D * ab);
        o->rows_scatter(m->ctx, m->dh, m->in_rows_c, m->dtmp, qc, (size_t)D * ab);
    } else {
        o->linear_bwd(m->ctx, m->datt, LG(m, l, DFL_O), NULL, m->dh, a->att, LW(m, l, DFL_O), Q,
                      H * d, D, NN_BWD_DW_SET);
    }
    o->attention_block_bwd(m->ctx, m->dq, m->dk, m->dv, m->datt, a->q, a->k, a->v, a->att, a->lse,
                           m->in_spans, nb, B, Tk, H, Hk, d);
    /* q = rope(rmsnorm_head(qraw)); k likewise over all Tk rows */
    float eps = (float)c->rms_norm_eps;
    o->head_norm_rope_bwd(m->ctx, m->dqraw, LG(m, l, DFL_Q_NORM), m->dq, a->qraw,
                          LW(m, l, DFL_Q_NORM), m->rope_rot + (size_t)Tc * d, Q, H, d, eps);
    o->head_norm_rope_bwd(m->ctx, m->dkraw, LG(m, l, DFL_K_NORM), m->dk, a->kraw,
                          LW(m, l, DFL_K_NORM), m->rope_rot, Tk, Hk, d, eps);
    /* dHt accumulates the context rows' share over layers; dWk and dWv cover both row sets */
    if (l == 0 && m->cur_u)
        qkv_blocks_bwd_distinct(m);
    else
        qkv_bwd(m, l);
}

/* MLP, layer l: yln = rmsnorm(hmid); resid[l+1] = hmid + (silu(yln Wg^T) * yln Wu^T) Wd^T,
 * gate and up from one product (Wg and Wu lie back to back); on post_attn_rows rows. */
static void mlp_fwd(dflash_model *m, int l) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    dflash_layer_acts *a = &m->la[l];
    int R = post_attn_rows(m, l), D = c->hidden_size, F = c->intermediate_size;
    o->rmsnorm_fwd(m->ctx, a->yln, a->rstd_post, a->hmid, LW(m, l, DFL_POST_LN), R, D,
                   (float)c->rms_norm_eps);
    o->linear_fwd(m->ctx, a->gu, a->yln, LW(m, l, DFL_GATE), NULL, R, D, 2 * F);
    o->swiglu_fwd(m->ctx, a->act, a->gu, R, F);
    o->linear_fwd_res(m->ctx, m->resid[l + 1], a->act, LW(m, l, DFL_DOWN), a->hmid, R, F, D);
}

/* Backward of mlp_fwd: dh holds d/d resid[l+1] on entry, d/d hmid on exit. */
static void mlp_bwd(dflash_model *m, int l) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    dflash_layer_acts *a = &m->la[l];
    int R = post_attn_rows(m, l), D = c->hidden_size, F = c->intermediate_size;
    o->linear_bwd(m->ctx, m->dact, LG(m, l, DFL_DOWN), NULL, m->dh, a->act, LW(m, l, DFL_DOWN), R,
                  F, D, NN_BWD_DW_SET);
    o->swiglu_bwd(m->ctx, m->dgu, m->dact, a->gu, R, F);
    /* gate and up: one product; the gradient at gate's offset covers both [2F, D] */
    o->linear_bwd(m->ctx, m->dxln, LG(m, l, DFL_GATE), NULL, m->dgu, a->yln, LW(m, l, DFL_GATE), R,
                  D, 2 * F, NN_BWD_DW_SET);
    o->rmsnorm_bwd(m->ctx, m->dh, LG(m, l, DFL_POST_LN), m->dxln, a->hmid, LW(m, l, DFL_POST_LN),
                   a->rstd_post, R, D, m->dh);
}

static void forward_rows(dflash_model *m, const nn_buf *X, bool compact) {
    const dflash_config *c = &m->cfg;
    int Q = m->cur_nb * c->block_size, D = c->hidden_size, L = c->num_layers;
    m->last_compact = compact;
    m->ops->embedding_fwd(m->ctx, m->resid[0], m->in_ids, m->embed, Q, D);
    /* RoPE's table for the Tk = Tc + Q rows [context ; block], read by every layer's q and k
     * norm + RoPE, forward and backward */
    m->ops->rope_table(m->ctx, m->rope_rot, m->in_pos, m->inv_freq, m->cur_tc + Q, c->head_dim);
    m->ops->side_wait(m->ctx, 0); /* the previous step's update of the vectors and fc */
    context_fwd(m, X);
    for (int l = 0; l < L; l++) {
        m->ops->side_wait(m->ctx, dflash_opt_stage(l)); /* and of layer l's matrices */
        attn_fwd(m, l);
        mlp_fwd(m, l);
    }
    m->ops->rmsnorm_fwd(m->ctx, m->out, m->rstd_out, m->resid[L],
                        dflash_model_weight(m, m->t_norm), post_attn_rows(m, L - 1), D,
                        (float)c->rms_norm_eps);
}

void dflash_model_forward(dflash_model *m, const nn_buf *X) {
    forward_rows(m, X, false);
}

void dflash_model_forward_loss(dflash_model *m, const nn_buf *X, float inv_norm) {
    forward_rows(m, X, m->last_rows_ok && m->cur_qc > 0 && m->cur_loss_rows > 0);
    dflash_model_loss(m, inv_norm);
}

/* Final norm + lm_head + weighted CE: out = rmsnorm(h, norm); dh = d loss / d out. */
void dflash_model_loss(dflash_model *m, float inv_norm) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    int Q = m->cur_nb * c->block_size, D = c->hidden_size, n = m->cur_loss_rows;
    size_t row_bytes = (size_t)D * o->act_bytes;
    /* out's rows: all Q, or the Qc compact ones (last_compact) where the loss rows sit at
     * in_loss_rows_c */
    const int32_t *at = m->last_compact ? m->in_loss_rows_c : m->in_loss_rows;
    int rows = post_attn_rows(m, c->num_layers - 1);
    /* the loss rows of out, packed into dtmp; their gradients into dxln (both backward scratch,
     * free until the backward starts), then spread into dh, zero elsewhere */
    o->embedding_fwd(m->ctx, m->dtmp, at, m->out, n, D);
    o->lm_head_xent(m->ctx, m->dxln, m->out_sums, m->loss_correct, m->dtmp, m->lm_head,
                    m->in_labels, m->in_weights, inv_norm, m->lm_scratch, n, D, c->vocab_size,
                    m->lm_chunk);
    o->zero(m->ctx, m->dh, (size_t)rows * row_bytes);
    o->rows_scatter(m->ctx, m->dh, at, m->dxln, n, row_bytes);
    o->zero(m->ctx, m->out_correct, (size_t)Q * sizeof(int32_t));
    o->rows_scatter(m->ctx, m->out_correct, m->in_loss_rows, m->loss_correct, n, sizeof(int32_t));
}

void dflash_model_backward(dflash_model *m, const nn_buf *X) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    int D = c->hidden_size, L = c->num_layers;
    /* the gradients are the previous optimizer step's input (the forward waited for each of
     * its stages already; this covers a backward without one) */
    o->side_wait(m->ctx, -1);
    /* the norm weights' gradients are sums of atomic adds: zeroed first; every matrix's first
     * product (NN_BWD_DW_SET) overwrites its gradient */
    o->zero(m->ctx, m->grads_vec, (m->n_params - m->n_decay) * sizeof(float));
    /* out = rmsnorm(resid[L], norm): dh <- d/d resid[L] (dx may equal dy) */
    o->rmsnorm_bwd(m->ctx, m->dh, dflash_model_grad(m, m->t_norm), m->dh, m->resid[L],
                   dflash_model_weight(m, m->t_norm), m->rstd_out, post_attn_rows(m, L - 1), D,
                   NULL);
    o->zero(m->ctx, ctx_rows(m, m->dxln), (size_t)m->cur_tc * D * o->act_bytes); /* dHt */
    for (int l = L - 1; l >= 0; l--) {
        mlp_bwd(m, l);
        attn_bwd(m, l);
    }
    /* resid[0] is the frozen embedding: no gradient */
    context_bwd(m, X);
}

int dflash_model_tune(dflash_model *m, int candidates) {
    const nn_ops *o = m->ops;
    const dflash_config *c = &m->cfg;
    if (candidates < 2) return 0;
    int was = o->matmul_tune(m->ctx, candidates);
    if (was < 0) return 0;
    int Tc = m->max_tokens, nb = m->max_blocks, B = c->block_size, D = c->hidden_size;
    size_t Q = (size_t)nb * B;
    nn_buf *X = o->alloc(m->ctx, (size_t)Tc * c->n_feat * D * o->act_bytes); /* zeros */
    if (!X) {
        o->matmul_tune(m->ctx, was);
        return DFLASH_ENOMEM;
    }
    /* block j: anchor spread over the context, its context before the anchor */
    for (int j = 0; j < nb; j++) {
        int32_t anchor = 1 + (int32_t)((int64_t)j * (Tc - 1) / nb);
        m->h_spans[j] = (nn_block_span){0, anchor, Tc + j * B, 1};
        int32_t token = j < c->mask_token_id ? j : j + 1; /* as training: distinct anchors */
        for (int i = 0; i < B; i++) {
            size_t r = (size_t)j * B + (size_t)i;
            m->h_ids[r] = i == 0 ? token % c->vocab_size : c->mask_token_id;
            m->h_pos[Tc + r] = anchor + i;
            m->h_labels[r] = 0;
            m->h_weights[r] = i > 0 ? 1.0f : 0.0f;
        }
    }
    for (int t = 0; t < Tc; t++)
        m->h_pos[t] = t;
    int rc = dflash_model_set_inputs(m, Tc, nb, m->h_ids, m->h_pos, m->h_spans, m->h_labels,
                                     m->h_weights);
    if (rc == 0) {
        dflash_model_forward_loss(m, X, (float)(1.0 / (double)(Q - (size_t)nb)));
        dflash_model_backward(m, X);
        o->sync(m->ctx);
    }
    o->matmul_tune(m->ctx, was);
    o->free(m->ctx, X);
    return rc;
}

void dflash_model_predict(dflash_model *m) {
    const dflash_config *c = &m->cfg;
    m->ops->lm_head_argmax(m->ctx, m->out_argmax, m->out, m->lm_head, m->lm_scratch,
                           m->cur_nb * c->block_size, c->hidden_size, c->vocab_size, m->lm_chunk);
}
