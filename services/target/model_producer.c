/* model_producer: work unit -> filled slot with the real target forward (see the header).
 *
 * One fill, in order (all on the backend's stream):
 *   1. batch_plan_get(epoch, bucket, index) -> global sequence ids, in packing order;
 *   2. host staging: seq_off[n+1], positions (0..len-1 per sequence), ids, loss mask;
 *   3. upload_raw into the slot's arrays;
 *   4. target_forward reading ids / positions / offsets from the slot itself and writing the
 *      captured layers into slot_hidden at column j*D of each row (row stride n_layers*D);
 *   5. the header (slot_header_write on a host copy, then upload_raw), last.
 *
 * Batch numbering: the broker's ledger keeps the batch count registered for each bucket (epoch
 * 0's, batch_plan_count) for every epoch, but a reshuffled epoch may pack into more or fewer
 * batches. plan_batch reconciles them so that indexes [0, count of epoch 0) hold every sequence
 * of the bucket exactly once in every epoch: an epoch with fewer batches gives the missing
 * indexes one sequence each, taken from the end of its last batches (each keeps at least one);
 * an epoch with more uses epoch 0's batches, rotated by a seeded offset. A pure function of the
 * plan, so the verifier (model_producer_verify) sees the same batches.
 */
#include "model_producer.h"

#include "err.h"
#include "hf_config.h"
#include "log.h"
#include "monotime.h"
#include "rng.h"
#include "shard.h"
#include "target_loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct model_producer {
    const nn_ops *ops;
    nn_ctx *ctx;
    target_model *model;
    shard_set *shards;
    batch_plan *plan;
    uint32_t token_budget, max_seqs;
    uint32_t bounds[BATCH_PLAN_MAX_BUCKETS];
    int n_buckets;
    uint64_t seed;
    uint64_t plan_id; /* batch_plan_identity: sent to the broker at registration */
    uint32_t per_epoch[BATCH_PLAN_MAX_BUCKETS]; /* batches registered: epoch 0's count */
    uint32_t cnt_epoch[BATCH_PLAN_MAX_BUCKETS]; /* epoch whose own count is in cnt (cached) */
    uint32_t cnt[BATCH_PLAN_MAX_BUCKETS];
    bool cnt_valid[BATCH_PLAN_MAX_BUCKETS];
    slot_layout layout;
    /* host staging for one batch */
    uint32_t *seq_ids;  /* [max_seqs] */
    uint32_t *scratch;  /* [max_seqs]: plan_batch's look at other batches */
    int32_t *seq_off;   /* [max_seqs + 1] */
    int32_t *pos, *ids; /* [token_budget] */
    uint8_t *mask;      /* [token_budget] */
    slot_header *hdr;   /* one slot's header bytes (host) */
    long fills, drains; /* batches filled; host waits for the whole stream inside fills */
    long allocs;        /* memory allocations inside fills (ops.h allocs) */
    volatile sig_atomic_t *stop; /* may be NULL */
};

static slot_dtype backend_dtype(const nn_ops *ops) {
    return ops->act_bytes == 4 ? SLOT_DTYPE_F32 : SLOT_DTYPE_BF16;
}

model_producer *model_producer_new(const model_producer_opts *o, const nn_ops *ops, nn_ctx *ctx,
                                   int *code, char *err, size_t errlen) {
    bool config = false; /* the options or the data do not fit: bad configuration */
    model_producer *p = calloc(1, sizeof *p);
    uint32_t *lens = NULL;
    if (!p) {
        snprintf(err, errlen, "out of memory");
        if (code) *code = DFLASH_ENOMEM;
        return NULL;
    }
    p->ops = ops;
    p->ctx = ctx;
    p->stop = o->stop;
    p->token_budget = o->token_budget;
    p->max_seqs = o->max_seqs;
    if (o->n_buckets < 1 || o->n_buckets > BATCH_PLAN_MAX_BUCKETS || !o->bucket_bounds) {
        snprintf(err, errlen, "%d buckets: need 1..%d", o->n_buckets, BATCH_PLAN_MAX_BUCKETS);
        goto fail_config;
    }
    p->n_buckets = o->n_buckets;
    memcpy(p->bounds, o->bucket_bounds, sizeof(uint32_t) * (size_t)o->n_buckets);
    if (o->token_budget < 1 || o->max_seqs < 1 || o->max_seqs > o->token_budget) {
        snprintf(err, errlen, "token budget %u and max seqs %u: need 1 <= max seqs <= budget",
                 o->token_budget, o->max_seqs);
        goto fail_config;
    }
    int n_capture = o->layer_ids ? o->n_layer_ids : o->drafter_layers;
    if (n_capture > SLOT_MAX_LAYER_IDS) { /* before the load, not after it */
        snprintf(err, errlen, "%d captured layers: a slot holds at most %d", n_capture,
                 SLOT_MAX_LAYER_IDS);
        goto fail_config;
    }

    p->shards = shard_set_open_list(o->shards, err, errlen);
    if (!p->shards) goto fail;
    uint64_t n = shard_set_count(p->shards);
    lens = malloc(sizeof(uint32_t) * (size_t)n);
    if (!lens) goto fail_nomem;
    shard_set_lengths(p->shards, lens);
    batch_plan_params bp = {.bucket_bounds = o->bucket_bounds,
                            .n_buckets = o->n_buckets,
                            .token_budget = o->token_budget,
                            .max_seqs = o->max_seqs,
                            .seed = o->seed};
    char perr[400] = "";
    p->plan = batch_plan_new(lens, n, &bp, perr, sizeof perr);
    if (p->plan) /* batch_plan_identity needs parameters batch_plan_new took */
        p->plan_id = batch_plan_identity(&bp, shard_set_identity(p->shards));
    else
        snprintf(err, errlen, "%s: %s", o->shards, perr); /* name the data */
    if (p->plan && batch_plan_dropped(p->plan)) {
        uint32_t last = o->bucket_bounds[o->n_buckets - 1];
        uint64_t tokens = 0, dropped_tokens = 0;
        for (uint64_t i = 0; i < n; i++) {
            tokens += lens[i];
            if (lens[i] > last) dropped_tokens += lens[i];
        }
        LOG_WARN("%llu of %llu sequences (%.1f%% of the tokens) are longer than the last "
                 "bucket's %u tokens and are left out of training: give --buckets a larger "
                 "last bound (and the slots the --token-budget for it) to keep them",
                 (unsigned long long)batch_plan_dropped(p->plan), (unsigned long long)n,
                 tokens ? 100.0 * (double)dropped_tokens / (double)tokens : 0.0, last);
    }
    free(lens);
    lens = NULL;
    if (!p->plan) goto fail_config; /* the data fits no bucket, or the bounds are bad */
    p->seed = o->seed;
    for (int b = 0; b < o->n_buckets; b++) /* the broker mixes every bucket: none may be empty */
        if ((p->per_epoch[b] = batch_plan_count(p->plan, 0, b)) == 0) {
            snprintf(err, errlen,
                     "%s: no sequence falls in bucket %d (<= %u tokens): leave it out of "
                     "--buckets (dflash-data prints the data's length histogram)",
                     o->shards, b, o->bucket_bounds[b]);
            goto fail_config;
        }

    /* The data must be the model's tokenizer's: checked from config.json before the weights
     * load (minutes for a large target), so a mismatch is said at once. Data of another
     * tokenizer often fits the model's ids: its recorded vocabulary tells. In the same pass,
     * something to train on: an anchor in a sequence the plan keeps (within the last bucket). */
    model_config hc;
    int crc = hf_config_load(o->model_dir, &hc, err, errlen);
    if (crc == DFLASH_ECONFIG || crc == DFLASH_EUNSUPPORTED) goto fail_config; /* the file's */
    if (crc) goto fail; /* cannot be read */
    if (shard_set_check_vocab(p->shards, (uint32_t)hc.vocab_size, err, errlen) ||
        shard_set_verify_tokens(p->shards, (uint32_t)hc.vocab_size,
                                o->bucket_bounds[o->n_buckets - 1], err, errlen))
        goto fail_config;
    /* captured layers the model lacks: a bad flag, said before the load (which would refuse
     * them too, as a failed load: exit 1 where a bad configuration is 2) */
    if (o->layer_ids &&
        target_layer_ids_check(o->layer_ids, o->n_layer_ids, hc.num_layers, err, errlen) < 0)
        goto fail_config;
    int rule_ids[TARGET_MAX_CAPTURE];
    if (!o->layer_ids && target_default_layer_ids(hc.num_layers, o->drafter_layers, rule_ids)) {
        snprintf(err, errlen, "--layers %d: DFlash's default rule gives no %d distinct layer ids "
                 "for this %d-layer target; give fewer, or the ids with --capture-layers",
                 o->drafter_layers, o->drafter_layers, hc.num_layers);
        goto fail_config;
    }

    target_model_opts mo = {.layer_ids = o->layer_ids,
                            .n_layer_ids = o->n_layer_ids,
                            .drafter_layers = o->drafter_layers,
                            .max_tokens = (int)o->token_budget,
                            .max_seqs = (int)o->max_seqs,
                            .no_head = true,
                            .stop = o->stop};
    p->model = target_model_load(o->model_dir, &mo, ops, ctx);
    if (!p->model) {
        snprintf(err, errlen, "%s: cannot load the target model (see the log above)", o->model_dir);
        goto fail;
    }
    const model_config *mc = target_model_config(p->model);
    int n_layers;
    const int *layer_ids = target_model_layer_ids(p->model, &n_layers);
    int rc = slot_layout_compute(o->token_budget, o->max_seqs, (uint32_t)mc->hidden_size,
                             (uint32_t)n_layers, backend_dtype(ops), &p->layout);
    if (!rc) rc = slot_layout_set_layer_ids(&p->layout, layer_ids, n_layers);
    if (rc) {
        snprintf(err, errlen, "slot layout for budget %u, %u seqs, hidden %d, %d layers: %s",
                 o->token_budget, o->max_seqs, mc->hidden_size, n_layers, err_str(rc));
        goto fail;
    }

    p->seq_ids = malloc(sizeof(uint32_t) * p->max_seqs);
    p->scratch = malloc(sizeof(uint32_t) * p->max_seqs);
    p->seq_off = malloc(sizeof(int32_t) * (p->max_seqs + 1));
    p->pos = malloc(sizeof(int32_t) * p->token_budget);
    p->ids = malloc(sizeof(int32_t) * p->token_budget);
    p->mask = malloc(p->token_budget);
    p->hdr = calloc(1, sizeof *p->hdr);
    if (!p->seq_ids || !p->scratch || !p->seq_off || !p->pos || !p->ids || !p->mask || !p->hdr)
        goto fail_nomem;
    return p;

fail_nomem:
    snprintf(err, errlen, "out of memory");
    goto fail;
fail_config:
    config = true;
fail:
    if (code) *code = config ? DFLASH_ECONFIG : DFLASH_EIO;
    free(lens);
    model_producer_destroy(&p);
    return NULL;
}

void model_producer_destroy(model_producer **pp) {
    if (!pp || !*pp) return;
    model_producer *p = *pp;
    if (p->fills)
        LOG_INFO("target: %ld batches filled; host waits for the whole compute stream inside "
                 "them: %ld; memory allocations inside them: %ld",
                 p->fills, p->drains, p->allocs);
    target_model_destroy(&p->model);
    batch_plan_destroy(&p->plan);
    shard_set_close(&p->shards);
    free(p->seq_ids);
    free(p->scratch);
    free(p->seq_off);
    free(p->pos);
    free(p->ids);
    free(p->mask);
    free(p->hdr);
    free(p);
    *pp = NULL;
}

int model_producer_layout(const model_producer *p, slot_layout *out) {
    *out = p->layout;
    return 0;
}

batch_plan *model_producer_plan(model_producer *p) {
    return p->plan;
}

const target_model *model_producer_model(const model_producer *p) {
    return p->model;
}

static bool same_layout(const slot_layout *a, const slot_layout *b) {
    return a->token_budget == b->token_budget && a->max_seqs == b->max_seqs &&
           a->hidden == b->hidden && a->n_layers == b->n_layers && a->dtype == b->dtype &&
           a->slot_bytes == b->slot_bytes;
}

/* Batch (epoch, b, index) as the broker numbers it (see the top): its sequence ids into
 * seq_ids[0..*n). 0 or DFLASH_ERANGE (no such bucket or index). */
static int plan_batch(model_producer *p, uint32_t epoch, int b, uint64_t index, uint32_t *n) {
    if (b < 0 || b >= p->n_buckets || index >= p->per_epoch[b]) return DFLASH_ERANGE;
    uint32_t want = p->per_epoch[b], i = (uint32_t)index;
    if (!p->cnt_valid[b] || p->cnt_epoch[b] != epoch) {
        p->cnt[b] = batch_plan_count(p->plan, epoch, b);
        p->cnt_epoch[b] = epoch;
        p->cnt_valid[b] = true;
    }
    uint32_t have = p->cnt[b];
    if (have > want) { /* epoch 0's batches, rotated */
        uint64_t key = rng_hash64(rng_hash64(p->seed ^ 0x70a7e0ull) ^ epoch) + (uint64_t)b;
        uint32_t j = (uint32_t)((i + rng_hash64(key) % want) % want);
        return batch_plan_get(p->plan, 0, b, j, p->seq_ids, p->max_seqs, n, NULL);
    }
    /* have < want: the last batches give the trailing sequences, one per missing index:
     * missing index have + k gets the k-th given, counting from the end of the plan */
    uint32_t need = want - have, given = 0, m;
    for (uint32_t j = have; j-- > 0 && given < need;) {
        int rc = batch_plan_get(p->plan, epoch, b, j, p->scratch, p->max_seqs, &m, NULL);
        if (rc) return rc;
        uint32_t give = m - 1 < need - given ? m - 1 : need - given;
        if (j == i) {
            *n = m - give;
            memcpy(p->seq_ids, p->scratch, sizeof(uint32_t) * *n);
            return 0;
        }
        if (i >= have && i - have >= given && i - have < given + give) {
            p->seq_ids[0] = p->scratch[m - 1 - (i - have - given)];
            *n = 1;
            return 0;
        }
        given += give;
    }
    if (i >= have) return DFLASH_EINTERNAL; /* fewer sequences than epoch 0 has batches */
    return batch_plan_get(p->plan, epoch, b, i, p->seq_ids, p->max_seqs, n, NULL);
}

/* Batch wu into the host staging: seq_off[n+1], pos, ids, mask of T tokens, positions
 * restarting per sequence. Returns T > 0 with *n_seqs, or a negative code. */
static int materialise(model_producer *p, const slot_work_unit *wu, uint32_t *n_seqs) {
    uint32_t n = 0;
    int rc = plan_batch(p, wu->epoch, (int)wu->bucket, wu->batch, &n);
    if (rc) return rc;
    if (n == 0) return DFLASH_EINTERNAL;
    uint32_t T = 0;
    p->seq_off[0] = 0;
    for (uint32_t s = 0; s < n; s++) {
        shard_seq q;
        rc = shard_set_get(p->shards, p->seq_ids[s], &q);
        if (rc) return rc;
        if (T + q.len > p->token_budget) return DFLASH_EINTERNAL;
        memcpy(p->ids + T, q.ids, sizeof(int32_t) * q.len);
        memcpy(p->mask + T, q.mask, q.len);
        for (uint32_t i = 0; i < q.len; i++)
            p->pos[T + i] = (int32_t)i;
        T += q.len;
        p->seq_off[s + 1] = (int32_t)T;
    }
    *n_seqs = n;
    return (int)T;
}

int model_producer_fill(model_producer *p, void *base, const slot_layout *l,
                        const slot_work_unit *wu, uint64_t producer, uint32_t *n_seqs) {
    if (!same_layout(l, &p->layout)) return DFLASH_EMISMATCH;
    uint32_t n = 0;
    int T = materialise(p, wu, &n);
    if (T < 0) return T;

    const nn_ops *ops = p->ops;
    long drains0 = ops->stream_drains(p->ctx), allocs0 = ops->allocs(p->ctx);
    int32_t *d_off = slot_seq_offsets(base, l), *d_pos = slot_positions(base, l);
    int32_t *d_ids = slot_token_ids(base, l);
    ops->upload_raw(p->ctx, d_off, p->seq_off, sizeof(int32_t) * (n + 1));
    ops->upload_raw(p->ctx, d_pos, p->pos, sizeof(int32_t) * (size_t)T);
    ops->upload_raw(p->ctx, d_ids, p->ids, sizeof(int32_t) * (size_t)T);
    ops->upload_raw(p->ctx, slot_loss_mask(base, l), p->mask, (size_t)T);

    int rc = target_forward(p->model, d_ids, d_pos, d_off, (int)n, T, slot_hidden(base, l),
                            (size_t)l->n_layers * l->hidden);
    if (rc) return rc;

    slot_header_write(p->hdr, l, wu, n, (uint32_t)T, producer);
    ops->upload_raw(p->ctx, base, p->hdr, sizeof *p->hdr);
    p->fills++;
    p->drains += ops->stream_drains(p->ctx) - drains0;
    long allocs = ops->allocs(p->ctx) - allocs0;
    if (allocs > 0 && p->allocs == 0)
        LOG_WARN("target: filling batch (%u, %u, %llu) allocated memory (%ld allocations) though "
                 "memory is planned at start-up; the exit summary counts every fill's",
                 wu->epoch, wu->bucket, (unsigned long long)wu->batch, allocs);
    p->allocs += allocs;
    if (n_seqs) *n_seqs = n;
    return T;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int model_producer_verify(model_producer *p, const void *slot, const slot_layout *l, double tol,
                          double *max_err, char *err, size_t errlen) {
    slot_header h;
    int rc = slot_header_check(slot, &p->layout, &h, err, errlen);
    if (rc) return rc;
    const model_config *mc = target_model_config(p->model);
    rc = slot_arrays_check(slot, l, (uint32_t)mc->vocab_size, err, errlen);
    if (rc) return rc;
    uint32_t n = 0;
    int T = materialise(p, &h.wu, &n);
    if (T < 0) {
        snprintf(err, errlen, "batch (%u, %u, %llu) does not exist in this plan", h.wu.epoch,
                 h.wu.bucket, (unsigned long long)h.wu.batch);
        return DFLASH_ECORRUPT;
    }
    void *base = (void *)slot; /* the typed views take non-const; nothing is written */
    if (n != h.n_seqs || (uint32_t)T != h.n_tokens ||
        memcmp(slot_seq_offsets(base, l), p->seq_off, sizeof(int32_t) * (n + 1)) ||
        memcmp(slot_positions(base, l), p->pos, sizeof(int32_t) * (size_t)T) ||
        memcmp(slot_token_ids(base, l), p->ids, sizeof(int32_t) * (size_t)T) ||
        memcmp(slot_loss_mask(base, l), p->mask, (size_t)T)) {
        snprintf(err, errlen, "slot arrays differ from batch (%u, %u, %llu) of the plan",
                 h.wu.epoch, h.wu.bucket, (unsigned long long)h.wu.batch);
        return DFLASH_ECORRUPT;
    }

    /* the direct forward of the same batch, downloaded as fp32 */
    const nn_ops *ops = p->ops;
    size_t W = (size_t)l->n_layers * l->hidden, D = l->hidden;
    nn_buf *out = ops->alloc(p->ctx, ops->act_bytes * (size_t)T * W);
    float *want = malloc(sizeof(float) * (size_t)T * W);
    rc = (out && want) ? 0 : DFLASH_ENOMEM;
    if (!rc) rc = target_forward_host(p->model, p->ids, p->pos, p->seq_off, (int)n, T, out, W);
    if (!rc) ops->download(p->ctx, want, out, (size_t)T * W);
    ops->sync(p->ctx);
    double worst = 0;
    int bad_t = -1, bad_j = -1;
    const char *hid = slot_hidden(base, l);
    for (int t = 0; !rc && t < T; t++) {
        for (uint32_t j = 0; j < l->n_layers; j++) {
            double diff = 0, ref = 0;
            for (size_t c = 0; c < D; c++) {
                size_t i = (size_t)t * W + j * D + c;
                float got;
                if (l->dtype == SLOT_DTYPE_F32)
                    memcpy(&got, hid + 4 * i, 4);
                else {
                    uint16_t b;
                    memcpy(&b, hid + 2 * i, 2);
                    got = bf16_to_f32(b);
                }
                double e = fabs((double)got - want[i]);
                if (!(e <= diff)) diff = isnan(e) ? INFINITY : e;
                if (fabs(want[i]) > ref) ref = fabs(want[i]);
            }
            double rel = diff / (ref > 0 ? ref : 1);
            if (rel > worst) worst = rel, bad_t = t, bad_j = (int)j;
        }
    }
    ops->free(p->ctx, out);
    free(want);
    if (rc) {
        snprintf(err, errlen, "direct forward failed: %s", err_str(rc));
        return rc;
    }
    if (max_err) *max_err = worst;
    if (worst > tol) {
        int n_ids;
        const int *ids = target_model_layer_ids(p->model, &n_ids);
        snprintf(err, errlen,
                 "batch (%u, %u, %llu): token %d, layer %d differs from a direct forward "
                 "(max rel error %.3g > %.3g)",
                 h.wu.epoch, h.wu.bucket, (unsigned long long)h.wu.batch, bad_t, ids[bad_j], worst,
                 tol);
        return DFLASH_ECORRUPT;
    }
    return 0;
}

int model_producer_warmup(model_producer *p) {
    const nn_ops *ops = p->ops;
    const slot_layout *l = &p->layout;
    void *base = ops->alloc(p->ctx, l->slot_bytes);
    if (!base) return DFLASH_ENOMEM;
    int32_t *d_off = slot_seq_offsets(base, l), *d_pos = slot_positions(base, l);
    int32_t *d_ids = slot_token_ids(base, l);
    int rc = 0;
    double t0 = monotime_s();
    LOG_INFO("target: warming up, one full batch per bucket (%d buckets)", p->n_buckets);
    for (int b = 0; b < p->n_buckets && !rc; b++) {
        if (p->stop && *p->stop) {
            rc = DFLASH_ESHUTDOWN;
            break;
        }
        double tb = monotime_s();
        /* the bucket's full batch: sequences of the bound's length while they fit */
        uint32_t len = p->bounds[b] < p->token_budget ? p->bounds[b] : p->token_budget;
        uint32_t n = 0, T = 0;
        p->seq_off[0] = 0;
        while (len > 0 && n < p->max_seqs && T + len <= p->token_budget) {
            for (uint32_t i = 0; i < len; i++)
                p->pos[T + i] = (int32_t)i, p->ids[T + i] = 0;
            T += len;
            p->seq_off[++n] = (int32_t)T;
        }
        if (n == 0) continue;
        ops->upload_raw(p->ctx, d_off, p->seq_off, sizeof(int32_t) * (n + 1));
        ops->upload_raw(p->ctx, d_pos, p->pos, sizeof(int32_t) * T);
        ops->upload_raw(p->ctx, d_ids, p->ids, sizeof(int32_t) * T);
        rc = target_forward(p->model, d_ids, d_pos, d_off, (int)n, (int)T, slot_hidden(base, l),
                            (size_t)l->n_layers * l->hidden);
        ops->sync(p->ctx); /* the time of this bucket's forward, not of its queueing */
        if (!rc)
            LOG_INFO("target: warm-up bucket %d/%d (%u sequences of %u tokens) in %.1f s", b + 1,
                     p->n_buckets, n, len, monotime_s() - tb);
    }
    ops->sync(p->ctx);
    if (!rc) LOG_INFO("target: warmed up in %.1f s", monotime_s() - t0);
    ops->free(p->ctx, base);
    return rc;
}

/* ---- the target loop's producer interface ---- */

int model_producer_loop_config(model_producer *p, struct target_loop_config *cfg) {
    if (p->n_buckets > TARGET_MAX_BUCKETS) return DFLASH_ERANGE;
    cfg->layout = p->layout;
    cfg->n_buckets = (uint32_t)p->n_buckets;
    for (int b = 0; b < p->n_buckets; b++) {
        cfg->bucket_upper[b] = p->bounds[b];
        cfg->bucket_share[b] = batch_plan_share(p->plan, b);
        cfg->bucket_batches[b] = batch_plan_count(p->plan, 0, b);
    }
    cfg->plan_id = p->plan_id;
    cfg->has_plan_id = true;
    return 0;
}

typedef struct producer_ctx {
    model_producer *p;
} producer_ctx;

static int tp_fill(void *ctx, const slot_work_unit *wu, void *slot, const slot_layout *l,
                   void *stream, uint64_t producer, uint32_t *n_seqs) {
    (void)stream; /* == tp_stream: the model's nn_ctx owns the compute stream */
    producer_ctx *c = ctx;
    return model_producer_fill(c->p, slot, l, wu, producer, n_seqs);
}

/* The stream the forward runs on: the slot's ready event is recorded there, so a drafter's copy
 * waits for exactly this batch's writes (NULL on cpu, where fill returns with them done). */
static void *tp_stream(void *ctx) {
    producer_ctx *c = ctx;
    return c->p->ops->stream(c->p->ctx);
}

static void tp_destroy(void *ctx) {
    producer_ctx *c = ctx;
    if (!c) return;
    model_producer_destroy(&c->p);
    free(c);
}

target_producer *model_producer_as_target(model_producer **pp) {
    target_producer *tp = calloc(1, sizeof *tp);
    producer_ctx *c = calloc(1, sizeof *c);
    if (!tp || !c || !pp || !*pp) {
        free(tp);
        free(c);
        return NULL;
    }
    c->p = *pp;
    *pp = NULL;
    tp->name = "model";
    tp->ctx = c;
    tp->fill = tp_fill;
    tp->stream = tp_stream;
    tp->destroy = tp_destroy;
    return tp;
}
