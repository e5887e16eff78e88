/* dflash_train: anchors, blocks, loss and the AdamW step of the DFlash drafter (see
 * dflash_train.h). Host-side sample construction writes into the model's host staging arrays,
 * which dflash_model_set_inputs uploads; everything after that runs through the ops table.
 */
#include "dflash_train.h"
#include "rng.h"

#include "err.h"
#include "log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dflash_train_cfg_default(dflash_train_cfg *tc) {
    *tc = (dflash_train_cfg){
        .n_anchors = 512,
        .gamma = 0.0,
        .lr = 6e-4,
        .warmup_ratio = 0.04,
        .total_steps = 0,
        .min_lr_ratio = 0.0,
        .clip = 1.0,
        .beta1 = 0.9,
        .beta2 = 0.999,
        .eps = 1e-8,
        .weight_decay = 0.0,
        .seed = 0,
        .accumulate = 1,
    };
}

enum { C_W, C_LW, C_NW, C_RIGHT, C_NB, C_ACCLEN, C_NCTX, C_POS };

void dflash_metrics_to_counts(const dflash_metrics *l, double *v) {
    v[C_W] = l->weight_sum;
    v[C_LW] = l->weight_sum > 0 ? l->loss * l->weight_sum : 0.0;
    v[C_NW] = l->n_weighted;
    v[C_RIGHT] = nearbyint(l->accuracy * l->n_weighted);
    v[C_NB] = l->n_blocks;
    v[C_ACCLEN] = nearbyint(l->accept_len * l->n_blocks);
    v[C_NCTX] = l->n_ctx_tokens;
    for (int o = 0; o < DFLASH_MAX_BLOCK; o++) {
        v[C_POS + o] = l->pos_count[o];
        v[C_POS + DFLASH_MAX_BLOCK + o] = nearbyint(l->pos_acc[o] * l->pos_count[o]);
    }
}

void dflash_metrics_from_counts(dflash_metrics *met, const double *v) {
    met->weight_sum = v[C_W];
    met->loss = v[C_W] > 0 ? v[C_LW] / v[C_W] : 0.0;
    met->n_weighted = (int)v[C_NW];
    met->accuracy = v[C_NW] > 0 ? v[C_RIGHT] / v[C_NW] : 0.0;
    met->n_blocks = (int)v[C_NB];
    met->accept_len = v[C_NB] > 0 ? v[C_ACCLEN] / v[C_NB] : 0.0;
    met->n_ctx_tokens = (int)v[C_NCTX];
    for (int o = 0; o < DFLASH_MAX_BLOCK; o++) {
        double n = v[C_POS + o];
        met->pos_count[o] = (int)n;
        met->pos_acc[o] = n > 0 ? v[C_POS + DFLASH_MAX_BLOCK + o] / n : 0.0;
    }
}

double dflash_train_gamma(const dflash_train_cfg *tc, int B) {
    if (tc->gamma > 0) return tc->gamma;
    if (B == 16) return 7.0;
    if (B == 10) return 5.0;
    if (B == 8) return 4.0;
    return 7.0 * B / 16.0;
}

double dflash_train_lr(const dflash_train_cfg *tc, long step) {
    /* SpecForge's int(warmup_ratio * total_steps): rounded down; the 1e-6 counts a product a
     * rounding error below a whole number as that number */
    long W = (long)floor(tc->warmup_ratio * (double)tc->total_steps + 1e-6);
    if (step < W) return tc->lr * (double)(step + 1) / (double)W;
    if (tc->total_steps <= 0) return tc->lr;
    long span = tc->total_steps - W;
    double p = span > 0 ? (double)(step - W) / (double)span : 1.0;
    if (p > 1.0) p = 1.0;
    double floor = tc->min_lr_ratio;
    return tc->lr * (floor + (1.0 - floor) * 0.5 * (1.0 + cos(M_PI * p)));
}

int dflash_view_from_slot(const dflash_model *m, const void *host_base, const slot_layout *l,
                          const void *hidden, dflash_batch_view *v, char *err, size_t errlen) {
    const dflash_config *c = &m->cfg;
    slot_header h;
    int rc = slot_header_check(host_base, l, &h, err, errlen);
    if (rc) return rc;
    slot_dtype want = m->ops->act_bytes == 4 ? SLOT_DTYPE_F32 : SLOT_DTYPE_BF16;
    if (l->hidden != (uint32_t)c->hidden_size || l->n_layers != (uint32_t)c->n_feat ||
        l->dtype != want) {
        if (err)
            snprintf(err, errlen,
                     "slot holds %u layers x hidden %u (%s); drafter needs %d target layers x "
                     "hidden_size %d (%s)",
                     l->n_layers, l->hidden, slot_dtype_name(l->dtype), c->n_feat, c->hidden_size,
                     slot_dtype_name(want));
        return DFLASH_EMISMATCH;
    }
    if (h.n_tokens > (uint32_t)m->max_tokens || h.n_seqs < 1) {
        if (err)
            snprintf(err, errlen, "slot holds %u tokens in %u sequences; drafter planned for %d",
                     h.n_tokens, h.n_seqs, m->max_tokens);
        return DFLASH_ERANGE;
    }
    /* the arrays must describe the header's tokens: offsets ending past n_tokens would train
     * on rows the slot does not hold for this batch (a copy stops at n_tokens) */
    rc = slot_arrays_check(host_base, l, (uint32_t)c->vocab_size, err, errlen);
    if (rc) return rc;
    void *base = (void *)host_base;
    *v = (dflash_batch_view){.n_seqs = (int)h.n_seqs,
                             .seq_off = slot_seq_offsets(base, l),
                             .ids = slot_token_ids(base, l),
                             .positions = slot_positions(base, l),
                             .loss_mask = slot_loss_mask(base, l),
                             .hidden = hidden,
                             .ld = (size_t)l->n_layers * l->hidden};
    return 0;
}

uint64_t dflash_batch_key(const slot_work_unit *wu) {
    return ((uint64_t)wu->bucket << 40) ^ wu->batch;
}

/* ---------------------------------------------------------------------------------------------
 * anchors */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int view_check(const dflash_model *m, const dflash_batch_view *b) {
    const dflash_config *c = &m->cfg;
    if (b->n_seqs < 1 || !b->seq_off || !b->ids || !b->loss_mask || !b->hidden) {
        LOG_ERROR("drafter batch: %d sequences or missing arrays", b->n_seqs);
        return DFLASH_EINVAL;
    }
    if (b->seq_off[0] != 0) return DFLASH_EINVAL;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seq_off[s + 1] <= b->seq_off[s]) {
            LOG_ERROR("drafter batch: sequence %d is empty or offsets decrease", s);
            return DFLASH_EINVAL;
        }
    int T = b->seq_off[b->n_seqs];
    if (T > m->max_tokens) {
        LOG_ERROR("drafter batch: %d tokens exceed the planned %d", T, m->max_tokens);
        return DFLASH_ERANGE;
    }
    if (b->ld != (size_t)c->n_feat * c->hidden_size) {
        LOG_ERROR("drafter batch: hidden row stride %zu, expected %d target layers x %d = %d",
                  b->ld, c->n_feat, c->hidden_size, c->n_feat * c->hidden_size);
        return DFLASH_EMISMATCH;
    }
    return 0;
}

int dflash_train_sample_anchors(dflash_model *m, const dflash_train_cfg *tc,
                                const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key) {
    int rc = view_check(m, b);
    if (rc) return rc;
    int nb = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int start = b->seq_off[s], S = b->seq_off[s + 1] - start;
        const uint8_t *lm = b->loss_mask + start;
        int32_t *cand = m->h_cand;
        int nc = 0;
        for (int p = 0; p + 1 < S; p++)
            if (dflash_anchor_candidate(lm, p, S)) cand[nc++] = p;
        int k = nc < tc->n_anchors ? nc : tc->n_anchors;
        if (nb + k > m->max_blocks) {
            LOG_ERROR("drafter batch: %d anchors exceed the planned %d blocks", nb + k,
                      m->max_blocks);
            return DFLASH_ERANGE;
        }
        uint64_t st =
            rng_hash64(rng_hash64(rng_hash64(tc->seed ^ 0x616e63686f72ull) ^ epoch) ^ batch_key);
        st = rng_hash64(st ^ (uint64_t)s);
        for (int i = 0; i < k; i++) { /* partial Fisher-Yates: a uniform k-subset */
            st = rng_hash64(st);
            int j = i + (int)(st % (uint64_t)(nc - i));
            int32_t t = cand[i];
            cand[i] = cand[j];
            cand[j] = t;
        }
        qsort(cand, (size_t)k, sizeof *cand, cmp_i32);
        for (int i = 0; i < k; i++) {
            m->h_blk_seq[nb] = s;
            m->h_blk_anchor[nb] = cand[i];
            nb++;
        }
    }
    return nb;
}

/* ---------------------------------------------------------------------------------------------
 * blocks */

int dflash_train_build(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                       int nb, const int32_t *blk_seq, const int32_t *blk_anchor, double *wsum) {
    const dflash_config *c = &m->cfg;
    int rc = view_check(m, b);
    if (rc) return rc;
    if (nb < 1 || nb > m->max_blocks) return DFLASH_EINVAL;
    int B = c->block_size, V = c->vocab_size, Tc = b->seq_off[b->n_seqs];
    double gamma = dflash_train_gamma(tc, B), sum = 0.0;
    /* context positions: the slot's, or 0..S-1 per sequence */
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->seq_off[s]; t < b->seq_off[s + 1]; t++)
            m->h_pos[t] = b->positions ? b->positions[t] : t - b->seq_off[s];
    for (int j = 0; j < nb; j++) {
        int s = blk_seq[j], a = blk_anchor[j];
        if (s < 0 || s >= b->n_seqs) return DFLASH_EINVAL;
        int start = b->seq_off[s], S = b->seq_off[s + 1] - start;
        if (a < 0 || a >= S) return DFLASH_EINVAL;
        m->h_spans[j] = (nn_block_span){
            .ctx_begin = start, .ctx_end = start + a, .blk_begin = Tc + j * B, .keep = 1};
        for (int o = 0; o < B; o++) {
            int r = j * B + o, t = a + o < S ? a + o : S - 1;
            int32_t lab = b->ids[start + t];
            if (lab < 0 || lab >= V) {
                LOG_ERROR("drafter batch: token id %d outside the vocabulary %d", lab, V);
                return DFLASH_ERANGE;
            }
            m->h_ids[r] = o == 0 ? b->ids[start + a] : c->mask_token_id;
            m->h_pos[Tc + r] = m->h_pos[start + a] + o;
            m->h_labels[r] = lab;
            float w = 0.0f;
            if (o >= 1 && a + o < S && b->loss_mask[start + a + o])
                w = (float)exp(-(double)(o - 1) / gamma);
            m->h_weights[r] = w;
            sum += w;
        }
    }
    if (wsum) *wsum = sum;
    return dflash_model_set_inputs(m, Tc, nb, m->h_ids, m->h_pos, m->h_spans, m->h_labels,
                                   m->h_weights);
}

/* ---------------------------------------------------------------------------------------------
 * the step
 *
 * Everything after the host-side sample construction is queued on the backend's stream and
 * nothing in the step waits for the device: the loss sums, correct flags and gradient sum of
 * squares come back through download_raw_async into a pending record (pinned host memory on
 * cuda), and the clipping factor is applied on the device (adamw_clip). A record is finished
 * (loss, accuracy, acceptance length, grad norm) when its fence is waited for: at once by the
 * synchronous entry points, a step later by dflash_train_step_async + dflash_train_collect. */

typedef struct dflash_pending dflash_pending;

#define PENDING 2 /* records in flight: the step being queued and the one before it */

typedef struct pending_rec {
    dflash_metrics met; /* host-known part, filled while queuing */
    bool forward;       /* the loss (and correct flags) were queued */
    bool applied;       /* the optimizer step (and its sumsq) was queued */
    bool open;          /* accumulation: a batch of a step that more batches will join */
    bool closes;        /* accumulation: the record that ends a step of several batches */
    bool flush;         /* that record is dflash_train_flush_async's, not a batch's */
    float *h_sums;      /* host_alloc: [0] loss sum, [1] weight sum, [2] gradient sum of squares */
    int32_t *h_correct; /* host_alloc [Qmax] */
    float *weights;     /* [Qmax] the step's weights: h_weights is rebuilt by the next step */
} pending_rec;

struct dflash_pending {
    pending_rec rec[PENDING];
    int head, count; /* oldest record, records queued and not collected */
    /* accumulation (dflash_train.h): the open step, as queued and as collected */
    float *acc;      /* backend fp32 [n_params]: sum of W_i g_i over its weighted batches */
    int acc_batches; /* batches queued into it */
    double acc_w;    /* their weight sum (host-known when queued) */
    int got_batches; /* batches of the open step collected, and their counts */
    double got[DFLASH_METRIC_COUNTS];
};

static void pending_free(dflash_model *m) {
    dflash_pending *p = m->pending;
    if (!p) return;
    m->ops->free(m->ctx, p->acc);
    for (int i = 0; i < PENDING; i++) {
        m->ops->host_free(m->ctx, p->rec[i].h_sums);
        m->ops->host_free(m->ctx, p->rec[i].h_correct);
        free(p->rec[i].weights);
    }
    free(p);
    m->pending = NULL;
}

int dflash_train_prepare(dflash_model *m) {
    if (m->pending) return 0;
    dflash_pending *p = calloc(1, sizeof *p);
    if (!p) return DFLASH_ENOMEM;
    m->pending = p;
    m->pending_free = pending_free;
    size_t Q = (size_t)m->max_blocks * (size_t)m->cfg.block_size;
    for (int i = 0; i < PENDING; i++) {
        pending_rec *r = &p->rec[i];
        r->h_sums = m->ops->host_alloc(m->ctx, 4 * sizeof(float));
        r->h_correct = m->ops->host_alloc(m->ctx, Q * sizeof(int32_t));
        r->weights = malloc(Q * sizeof(float));
        if (!r->h_sums || !r->h_correct || !r->weights) {
            pending_free(m);
            return DFLASH_ENOMEM;
        }
    }
    return 0;
}

int dflash_train_plan(dflash_model *m, const dflash_train_cfg *tc) {
    int rc = dflash_train_prepare(m);
    if (rc || tc->accumulate <= 1 || m->pending->acc) return rc;
    m->pending->acc = m->ops->alloc(m->ctx, m->n_params * sizeof(float));
    return m->pending->acc ? 0 : DFLASH_ENOMEM;
}

int dflash_train_open(const dflash_model *m) {
    return m->pending ? m->pending->acc_batches : 0;
}

/* The record the next step writes: DFLASH_ESTATE when every record is still pending. */
static int pending_open(dflash_model *m, pending_rec **out) {
    int rc = dflash_train_prepare(m);
    if (rc) return rc;
    dflash_pending *p = m->pending;
    if (p->count == PENDING) return DFLASH_ESTATE;
    pending_rec *r = &p->rec[(p->head + p->count) % PENDING];
    memset(&r->met, 0, sizeof r->met);
    r->met.batches = 1;
    r->forward = r->applied = r->open = r->closes = r->flush = false;
    *out = r;
    return 0;
}

static void pending_push(dflash_model *m) {
    dflash_pending *p = m->pending;
    m->ops->fence_record(m->ctx, (p->head + p->count) % PENDING);
    p->count++;
}

/* Accuracy, per-offset accuracy and acceptance length from a record's correct flags. */
static void block_metrics(const dflash_model *m, const pending_rec *r, dflash_metrics *met) {
    int B = m->cfg.block_size, nb = met->n_blocks;
    long right = 0, total = 0;
    double acc_len = 0.0;
    for (int o = 0; o < DFLASH_MAX_BLOCK; o++)
        met->pos_acc[o] = 0.0, met->pos_count[o] = 0;
    for (int j = 0; j < nb; j++) {
        int run = 0, live = 1;
        for (int o = 1; o < B; o++) {
            int q = j * B + o;
            bool weighted = r->weights[q] > 0.0f, ok = weighted && r->h_correct[q];
            if (weighted) {
                total++;
                right += ok;
                if (o < DFLASH_MAX_BLOCK) met->pos_count[o]++, met->pos_acc[o] += ok;
            }
            if (live && ok)
                run++;
            else
                live = 0;
        }
        acc_len += 1 + run;
    }
    for (int o = 0; o < DFLASH_MAX_BLOCK; o++)
        if (met->pos_count[o]) met->pos_acc[o] /= met->pos_count[o];
    met->n_weighted = (int)total;
    met->accuracy = total ? (double)right / (double)total : 0.0;
    met->accept_len = nb ? acc_len / nb : 0.0;
}

/* Waits for the oldest record's fence and finishes its metrics into *met. */
static void pending_pop(dflash_model *m, dflash_metrics *met) {
    dflash_pending *p = m->pending;
    pending_rec *r = &p->rec[p->head];
    m->ops->fence_wait(m->ctx, p->head);
    *met = r->met;
    if (r->forward) {
        met->loss = met->weight_sum > 0 ? r->h_sums[0] / met->weight_sum : 0.0;
        block_metrics(m, r, met);
    }
    if (r->applied) met->grad_norm = sqrt((double)r->h_sums[2]);
    if (r->open || r->closes) { /* accumulation: the step's figures over all its batches */
        double v[DFLASH_METRIC_COUNTS];
        if (p->got_batches == 0) memset(p->got, 0, sizeof p->got);
        if (r->forward) {
            dflash_metrics_to_counts(met, v);
            for (int i = 0; i < DFLASH_METRIC_COUNTS; i++)
                p->got[i] += v[i];
        } else { /* blocks and context tokens of a batch without weight count all the same */
            p->got[C_NB] += met->n_blocks, p->got[C_NCTX] += met->n_ctx_tokens;
        }
        p->got_batches += r->flush ? 0 : 1;
        met->open = r->open;
        if (r->closes) {
            dflash_metrics_from_counts(met, p->got);
            met->batches = p->got_batches;
            met->skipped = !r->applied;
            p->got_batches = 0;
        }
    }
    p->head = (p->head + 1) % PENDING;
    p->count--;
}

void dflash_train_zero_grads(dflash_model *m) {
    m->ops->side_wait(m->ctx, -1);
    m->ops->zero(m->ctx, m->grads, m->grad_bytes);
}

/* Builds the blocks and queues forward, loss and backward (steps 2-3; the backward overwrites
 * the gradients); the loss sums and correct flags go to r asynchronously. A batch without
 * blocks or weight queues no forward (r->met.skipped) but still leaves zero gradients. */
static int queue_grads(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                       int nb, const int32_t *blk_seq, const int32_t *blk_anchor,
                       pending_rec *r) {
    const nn_ops *o = m->ops;
    dflash_metrics *met = &r->met;
    met->step = m->step;
    met->n_blocks = nb;
    if (nb == 0) {
        dflash_train_zero_grads(m);
        met->skipped = true;
        return 0;
    }
    double wsum = 0.0;
    int rc = dflash_train_build(m, tc, b, nb, blk_seq, blk_anchor, &wsum);
    if (rc) {
        dflash_train_zero_grads(m);
        return rc;
    }
    met->n_ctx_tokens = m->cur_tc;
    met->weight_sum = wsum;
    if (!(wsum > 0)) {
        dflash_train_zero_grads(m);
        met->skipped = true;
        return 0;
    }
    size_t Q = (size_t)nb * (size_t)m->cfg.block_size;
    memcpy(r->weights, m->h_weights, Q * sizeof(float));
    dflash_model_forward_loss(m, b->hidden, (float)(1.0 / wsum));
    o->download_raw_async(m->ctx, r->h_sums, m->out_sums, 2 * sizeof(float));
    o->download_raw_async(m->ctx, r->h_correct, m->out_correct, Q * sizeof(int32_t));
    r->forward = true;
    dflash_model_backward(m, b->hidden);
    return 0;
}

/* The act copy of the parameters from element a (NULL where master is the weight itself). */
static nn_buf *params_at(const dflash_model *m, size_t a) {
    if ((void *)m->params == (void *)m->master) return NULL;
    return (char *)m->params + a * m->ops->act_bytes;
}

/* The matrices' masters from element a (< n_decay): fp32, or split (master_lo) */
static float *master_at(const dflash_model *m, size_t a) {
    return m->master ? m->master + a : NULL;
}
static uint16_t *master_lo_at(const dflash_model *m, size_t a) {
    return m->master_lo ? m->master_lo + a : NULL;
}

static float clip_of(const dflash_train_cfg *tc) {
    return tc->clip > 0 ? (float)tc->clip : 0.0f;
}

/* AdamW with clipping over the matrices' elements [a, b) (act-typed gradients, weight decay). */
static void adamw_matrices(dflash_model *m, const dflash_train_cfg *tc, size_t a, size_t b,
                           float lr, int t) {
    m->ops->adamw_clip_act(m->ctx, master_at(m, a), params_at(m, a), master_lo_at(m, a),
                           (const char *)m->grads + a * m->ops->act_bytes, m->adam_m + a,
                           m->adam_v + a, b - a, lr, (float)tc->beta1, (float)tc->beta2,
                           (float)tc->eps, (float)tc->weight_decay, m->out_sumsq, clip_of(tc), t);
}

/* Queues clipping and AdamW (step 4); the gradient norm goes to r asynchronously (when r has
 * host memory). The updates run on the ops' side stream in the stages the next forward waits
 * for (dflash_opt_stage): the vectors and fc first, then layer by layer, so that they overlap
 * that forward's first layers instead of holding up its start. */
static void queue_apply(dflash_model *m, const dflash_train_cfg *tc, pending_rec *r) {
    const nn_ops *o = m->ops;
    size_t nd = m->n_decay, nr = m->n_params - m->n_decay;
    o->sumsq(m->ctx, m->out_sumsq, m->grads, nd, m->grads_vec, nr);
    if (r->h_sums) o->download_raw_async(m->ctx, r->h_sums + 2, m->out_sumsq, sizeof(float));
    double lr = dflash_train_lr(tc, m->step);
    int t = (int)(m->step + 1), L = m->cfg.num_layers;
    o->side_begin(m->ctx);
    /* stage 0: the vectors (fp32 gradients, no decay) and fc */
    o->adamw_clip(m->ctx, m->master_vec, params_at(m, nd), m->grads_vec, m->adam_m + nd,
                  m->adam_v + nd, nr, (float)lr, (float)tc->beta1, (float)tc->beta2,
                  (float)tc->eps, 0.0f, m->out_sumsq, clip_of(tc), t);
    adamw_matrices(m, tc, 0, dflash_model_layer_offset(m, 0), (float)lr, t);
    o->side_mark(m->ctx, 0);
    for (int l = 0; l < L; l++) {
        adamw_matrices(m, tc, dflash_model_layer_offset(m, l), dflash_model_layer_offset(m, l + 1),
                       (float)lr, t);
        o->side_mark(m->ctx, dflash_opt_stage(l));
    }
    o->side_end(m->ctx);
    m->step++;
    r->applied = true;
    r->met.lr = lr;
    r->met.step = m->step;
}

/* Collects every pending record (their metrics are dropped): the synchronous entry points
 * start from an empty ring. */
static void pending_drain(dflash_model *m) {
    dflash_metrics scratch;
    while (m->pending && m->pending->count) pending_pop(m, &scratch);
}

int dflash_train_grads(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                       int nb, const int32_t *blk_seq, const int32_t *blk_anchor,
                       dflash_metrics *met) {
    memset(met, 0, sizeof *met);
    pending_drain(m);
    pending_rec *r;
    int rc = pending_open(m, &r);
    if (rc) return rc;
    rc = queue_grads(m, tc, b, nb, blk_seq, blk_anchor, r);
    if (rc) return rc;
    pending_push(m);
    pending_pop(m, met);
    return 0;
}

void dflash_train_apply(dflash_model *m, const dflash_train_cfg *tc, dflash_metrics *met) {
    pending_drain(m);
    pending_rec *r;
    if (pending_open(m, &r)) { /* out of host memory for the records: apply, report no norm */
        pending_rec none = {0};
        queue_apply(m, tc, &none);
        met->lr = none.met.lr, met->step = none.met.step, met->grad_norm = NAN;
        return;
    }
    queue_apply(m, tc, r);
    pending_push(m);
    dflash_metrics am;
    pending_pop(m, &am);
    met->lr = am.lr;
    met->grad_norm = am.grad_norm;
    met->step = am.step;
}

/* Ends the open step of accumulated batches in record r: the last batch's own weight w_last
 * (0: none, or r is a flush's) joins the accumulator's into the gradients, then the update.
 * A step whose batches had no weight at all makes no update (skipped) but still counts: its
 * batches were acked with it (the trainer acks an open step's batches with the step to come),
 * so m->step moves as for a taken step, and the checkpoint of that step holds them. A step
 * whose only weighted batch is the last has its gradients as they are (no accumulator pass:
 * the one-batch step's bits). */
static void close_step(dflash_model *m, const dflash_train_cfg *tc, pending_rec *r,
                       double w_last) {
    dflash_pending *p = m->pending;
    double W = p->acc_w + w_last;
    if (p->acc_w > 0)
        m->ops->grad_average(m->ctx, m->grads, m->n_decay, m->grads_vec, m->n_params - m->n_decay,
                             p->acc, (float)w_last, (float)(1.0 / W));
    if (W > 0) {
        queue_apply(m, tc, r);
    } else {
        m->step++;
        r->met.step = m->step;
    }
    r->closes = true;
    p->acc_batches = 0;
    p->acc_w = 0.0;
}

/* Batch r's gradient (weight w) joins the open step without closing it: W_i g_i into the
 * accumulator (the first weighted batch overwrites it). */
static void accumulate_open(dflash_model *m, pending_rec *r, double w) {
    dflash_pending *p = m->pending;
    if (w > 0) {
        m->ops->grad_accumulate(m->ctx, p->acc, m->grads, m->n_decay, m->grads_vec,
                                m->n_params - m->n_decay, (float)w, !(p->acc_w > 0));
        p->acc_w += w;
    }
    r->open = true;
    r->met.step = m->step;
}

/* Accumulation: batch r (queued by queue_grads) joins the open step; the step closes with the
 * tc->accumulate-th batch. DFLASH_ENOMEM when the accumulator cannot be had. */
static int accumulate_batch(dflash_model *m, const dflash_train_cfg *tc, pending_rec *r) {
    int rc = dflash_train_plan(m, tc);
    if (rc) return rc;
    dflash_pending *p = m->pending;
    double w = r->met.skipped ? 0.0 : r->met.weight_sum;
    if (++p->acc_batches >= tc->accumulate) {
        close_step(m, tc, r, w);
        return 0;
    }
    accumulate_open(m, r, w);
    return 0;
}

int dflash_train_grads_accumulate(dflash_model *m, const dflash_train_cfg *tc,
                                  const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key,
                                  dflash_metrics *met) {
    memset(met, 0, sizeof *met);
    pending_drain(m);
    dflash_train_cfg two = *tc; /* the accumulator, whatever tc->accumulate says */
    two.accumulate = tc->accumulate > 1 ? tc->accumulate : 2;
    int rc = dflash_train_plan(m, &two);
    pending_rec *r;
    if (!rc) rc = pending_open(m, &r);
    if (rc) return rc;
    int nb = dflash_train_sample_anchors(m, tc, b, epoch, batch_key);
    if (nb < 0) return nb;
    rc = queue_grads(m, tc, b, nb, m->h_blk_seq, m->h_blk_anchor, r);
    if (rc) return rc;
    m->pending->acc_batches++;
    accumulate_open(m, r, r->met.skipped ? 0.0 : r->met.weight_sum);
    pending_push(m);
    pending_pop(m, met);
    return 0;
}

void dflash_train_discard(dflash_model *m) {
    pending_drain(m);
    if (!m->pending) return;
    m->pending->acc_batches = 0;
    m->pending->acc_w = 0.0;
    m->pending->got_batches = 0;
}

int dflash_train_grads_close(dflash_model *m, const dflash_train_cfg *tc, dflash_metrics *met) {
    (void)tc;
    memset(met, 0, sizeof *met);
    pending_drain(m);
    pending_rec *r;
    int rc = pending_open(m, &r);
    if (rc) return rc;
    dflash_pending *p = m->pending;
    double W = p->acc_w;
    if (W > 0)
        m->ops->grad_average(m->ctx, m->grads, m->n_decay, m->grads_vec,
                             m->n_params - m->n_decay, p->acc, 0.0f, (float)(1.0 / W));
    else
        dflash_train_zero_grads(m);
    r->flush = r->closes = true;
    r->met.step = m->step;
    p->acc_batches = 0;
    p->acc_w = 0.0;
    pending_push(m);
    pending_pop(m, met);
    met->skipped = !(W > 0);
    met->open = false;
    return 0;
}

int dflash_train_step_async(dflash_model *m, const dflash_train_cfg *tc,
                            const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key) {
    pending_rec *r;
    int rc = pending_open(m, &r);
    if (rc) return rc;
    int nb = dflash_train_sample_anchors(m, tc, b, epoch, batch_key);
    if (nb < 0) return nb;
    rc = queue_grads(m, tc, b, nb, m->h_blk_seq, m->h_blk_anchor, r);
    if (rc) return rc;
    if (tc->accumulate > 1) {
        rc = accumulate_batch(m, tc, r);
        if (rc) return rc;
    } else if (!r->met.skipped) {
        queue_apply(m, tc, r);
    }
    pending_push(m);
    return 0;
}

int dflash_train_flush_async(dflash_model *m, const dflash_train_cfg *tc) {
    if (dflash_train_open(m) == 0) return 0;
    pending_rec *r;
    int rc = pending_open(m, &r);
    if (rc) return rc;
    r->flush = true;
    r->met.step = m->step;
    close_step(m, tc, r, 0.0);
    pending_push(m);
    return 1;
}

int dflash_train_collect(dflash_model *m, dflash_metrics *met) {
    if (!m->pending || m->pending->count == 0) return 0;
    pending_pop(m, met);
    return 1;
}

int dflash_train_pending(const dflash_model *m) {
    return m->pending ? m->pending->count : 0;
}

int dflash_train_step(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                      uint64_t epoch, uint64_t batch_key, dflash_metrics *met) {
    memset(met, 0, sizeof *met);
    pending_drain(m);
    int rc = dflash_train_step_async(m, tc, b, epoch, batch_key);
    if (rc) return rc;
    dflash_train_collect(m, met);
    return 0;
}
