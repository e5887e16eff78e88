/* dflash_dp: the data-parallel training step and state sync (see dflash_dp.h for the loss
 * normalisation and the memory paths). Built only from the public training API
 * (dflash_train_sample_anchors / dflash_train_grads / dflash_train_apply), the model's arrays
 * and the ops table, plus the collective.
 *
 * The host allreduce vector of one step (doubles, summed over ranks): the rank's metric counts
 * (dflash_metrics_to_counts: W_r, loss_r * W_r, positions, blocks, ...; integers far below
 * 2^53, so their sums are exact), then failed_r.
 * Threads: the model's thread.
 */
#include "dflash_dp.h"

#include "err.h"
#include "log.h"
#include "target_model.h"


#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { V_FAILED = DFLASH_METRIC_COUNTS, V_N };

static bool on_host(const dflash_model *m) { return strcmp(m->ops->name, "cpu") == 0; }

/* dp_host_io over the model's ops: how the shm backend reaches backend memory. */
static void io_to_host(void *ctx, void *host_dst, const void *src, size_t bytes) {
    dflash_model *m = ctx;
    m->ops->download_raw(m->ctx, host_dst, src, bytes);
}

static void io_from_host(void *ctx, void *dst, const void *host_src, size_t bytes) {
    dflash_model *m = ctx;
    m->ops->upload_raw(m->ctx, dst, host_src, bytes);
    m->ops->sync(m->ctx); /* the shm region is rewritten by the peers as soon as we return */
}

/* How the model's arrays (fp32 state; gradients in the ops' activation type for the matrices,
 * bf16 on cuda) reach the collective: *io (NULL: the backend reads them directly)
 * and the stream for nccl. DFLASH_EUNSUPPORTED for a cpu model on nccl. */
static int mem_path(dflash_model *m, dp_comm *comm, dp_host_io *io_store, const dp_host_io **io,
                    void **stream) {
    *io = NULL;
    *stream = NULL;
    if (dp_comm_kind_of(comm) == DP_COMM_NCCL) {
        if (on_host(m)) {
            LOG_ERROR("dflash_dp: the nccl collective needs a cuda model (this one is on %s)",
                      m->ops->name);
            return DFLASH_EUNSUPPORTED;
        }
        *stream = m->ops->stream(m->ctx);
        return 0;
    }
    if (!on_host(m)) {
        *io_store = (dp_host_io){.to_host = io_to_host, .from_host = io_from_host, .ctx = m};
        *io = io_store;
    }
    return 0;
}

/* The gradients' all-reduce, each rank's scaled by scale: the matrices' act-typed part (bf16
 * on cuda: dp_comm_allreduce_scaled_bf16; fp32 on cpu) and the vectors' fp32 part. */
static int allreduce_grads(dflash_model *m, dp_comm *comm, float scale, const dp_host_io *io,
                           void *stream) {
    size_t nd = m->n_decay, nr = m->n_params - m->n_decay;
    int rc = m->ops->act_bytes == sizeof(float)
                 ? dp_comm_allreduce_scaled_f32(comm, (float *)m->grads, nd, scale, io, stream)
                 : dp_comm_allreduce_scaled_bf16(comm, m->grads, nd, scale, io, stream);
    return rc ? rc : dp_comm_allreduce_scaled_f32(comm, m->grads_vec, nr, scale, io, stream);
}

/* Global-norm clipping of the reduced gradient with rank 0's norm: dflash_train_apply would
 * take each rank's own sum of squares of the (identical) gradient, but a backend's sum of
 * squares need not be bit-reproducible across processes or devices (the cuda one used float
 * atomics until c6ce6ed), and a clip factor that differs in the last bit makes the ranks'
 * weights drift apart. Costs one sum of squares and an 8-byte broadcast per step. The factor is
 * the one dflash_train_apply's adamw_clip forms (NN_CLIP_SCALE, fp32), applied with the ops'
 * scale_act / scale_f32: the same fp32 product AdamW would form (the act-typed part is then
 * rounded to act again). *norm: the group's gradient norm. */
static int group_clip(dflash_model *m, const dflash_train_cfg *tc, dp_comm *comm, double *norm) {
    float sq;
    size_t nd = m->n_decay, nr = m->n_params - m->n_decay;
    m->ops->sumsq(m->ctx, m->out_sumsq, m->grads, nd, m->grads_vec, nr);
    m->ops->download_raw(m->ctx, &sq, m->out_sumsq, sizeof sq);
    double sqd = sq;
    int rc = dp_comm_broadcast_host(comm, &sqd, sizeof sqd, 0);
    if (rc) return rc;
    *norm = sqrt(sqd);
    float f = NN_CLIP_SCALE((float)sqd, (float)tc->clip); /* exactly what adamw_clip computes */
    if (f != 1.0f) {
        m->ops->scale_act(m->ctx, m->grads, nd, f);
        m->ops->scale_f32(m->ctx, m->grads_vec, nr, f);
    }
    return 0;
}

/* Steps 2-5 of the header with this rank's gradient, normalised by its own W_r, in m->grads
 * (zero when it has none), loc its figures (weight_sum W_r) and lrc its batch's error (0 none). */
static int group_update(dflash_model *m, const dflash_train_cfg *tc, dp_comm *comm,
                        const dflash_metrics *loc, int lrc, dflash_metrics *met,
                        dflash_metrics *local) {
    dp_host_io io_store;
    const dp_host_io *io;
    void *stream;
    int rc = mem_path(m, comm, &io_store, &io, &stream);
    if (rc) return rc;

    /* 2. the weight sums and metric counts of the group */
    double v[V_N];
    memset(v, 0, sizeof v);
    if (lrc >= 0 && loc->weight_sum > 0) {
        dflash_metrics_to_counts(loc, v);
    } else if (lrc >= 0) { /* no weight: its blocks and context tokens only */
        dflash_metrics none = {.n_blocks = loc->n_blocks, .n_ctx_tokens = loc->n_ctx_tokens};
        dflash_metrics_to_counts(&none, v);
    }
    v[V_FAILED] = lrc < 0 ? 1.0 : 0.0;
    rc = dp_comm_allreduce_host_f64(comm, v, V_N);
    if (rc) return rc;
    memset(met, 0, sizeof *met);
    met->step = m->step;
    met->batches = loc->batches > 1 ? loc->batches : 1;
    dflash_metrics_from_counts(met, v);
    double W = met->weight_sum;
    if (local) *local = *loc;
    if (v[V_FAILED] > 0) {
        met->skipped = true;
        return lrc < 0 ? lrc : DFLASH_EAGAIN;
    }
    if (!(W > 0)) { /* nobody has a weighted position: every rank skips the update, and the
                      * step counts, as an accumulated step's does: rank 0's StepDone names it
                      * (defect: the model stayed a step behind the broker's group, whose next
                      * claim it then made again: the group re-formed, dissolved, retrained) */
        met->skipped = true;
        m->step++;
        met->step = m->step;
        if (local) local->step = m->step;
        return 0;
    }

    /* 3. sum over ranks of (W_r / W) * grads_r = dL/dp for the global L */
    float scale = loc->weight_sum > 0 ? (float)(loc->weight_sum / W) : 0.0f;
    rc = allreduce_grads(m, comm, scale, io, stream);
    if (rc) return rc;

    /* 4. clipping with one norm for the whole group (see dflash_dp.h, step 4) */
    dflash_train_cfg tc_apply = *tc;
    double norm = 0.0;
    if (tc->clip > 0) {
        rc = group_clip(m, tc, comm, &norm);
        if (rc) return rc;
        tc_apply.clip = 0.0;
    }

    /* 5. the same update on every rank */
    dflash_train_apply(m, &tc_apply, met);
    if (tc->clip > 0) met->grad_norm = norm;
    if (local) {
        local->lr = met->lr;
        local->grad_norm = met->grad_norm;
        local->step = met->step;
    }
    return 0;
}

int dflash_train_step_dp_ex(dflash_model *m, const dflash_train_cfg *tc,
                            const dflash_batch_view *b, uint64_t epoch, uint64_t batch_key,
                            dp_comm *comm, dflash_metrics *met, dflash_metrics *local) {
    if (!comm) {
        int rc = dflash_train_step(m, tc, b, epoch, batch_key, met);
        if (local) *local = *met;
        return rc;
    }
    /* 1. this rank's gradients, normalised by its own W_r */
    dflash_metrics loc;
    memset(&loc, 0, sizeof loc);
    int lrc = dflash_train_sample_anchors(m, tc, b, epoch, batch_key);
    if (lrc >= 0) lrc = dflash_train_grads(m, tc, b, lrc, m->h_blk_seq, m->h_blk_anchor, &loc);
    if (lrc < 0) {
        LOG_WARN("dflash_dp rank %d: this rank's batch failed (%s); the group skips the step",
                 dp_comm_rank(comm), err_str(lrc));
        memset(&loc, 0, sizeof loc);
        loc.skipped = true;
    }
    /* grads_r is dL_r/dp with L_r = sum_r w*CE / W_r; no anchors (grads left as they were) or
     * zero weight: zero, so this rank adds nothing to the sum */
    if (loc.n_blocks == 0 || !(loc.weight_sum > 0)) dflash_train_zero_grads(m);
    return group_update(m, tc, comm, &loc, lrc < 0 ? lrc : 0, met, local);
}

int dflash_dp_micro(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                    uint64_t epoch, uint64_t batch_key, dflash_metrics *local) {
    dflash_metrics scratch;
    int rc = dflash_train_grads_accumulate(m, tc, b, epoch, batch_key, local ? local : &scratch);
    if (rc < 0)
        LOG_WARN("dflash_dp: this rank's batch of a micro-step failed (%s); the group skips the "
                 "step", err_str(rc));
    return rc;
}

int dflash_dp_close(dflash_model *m, const dflash_train_cfg *tc, dp_comm *comm, int local_rc,
                    dflash_metrics *met, dflash_metrics *local) {
    dflash_metrics loc;
    int rc = dflash_train_grads_close(m, tc, &loc); /* G_r = sum_k W_rk g_rk / W_r */
    if (rc < 0) local_rc = local_rc < 0 ? local_rc : rc;
    if (local_rc < 0) {
        int batches = loc.batches;
        memset(&loc, 0, sizeof loc);
        loc.skipped = true;
        loc.batches = batches;
    }
    if (comm) return group_update(m, tc, comm, &loc, local_rc, met, local);
    *met = loc; /* alone: the step as it is */
    if (local_rc == 0 && loc.weight_sum > 0) dflash_train_apply(m, tc, met);
    if (local) *local = *met;
    return local_rc;
}

int dflash_train_step_dp(dflash_model *m, const dflash_train_cfg *tc, const dflash_batch_view *b,
                         uint64_t epoch, uint64_t batch_key, dp_comm *comm, dflash_metrics *met) {
    return dflash_train_step_dp_ex(m, tc, b, epoch, batch_key, comm, met, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * state */

/* The trainable state as byte ranges of backend memory: the masters as stored, the moments. */
static int state_ranges(const dflash_model *m, void *ptr[5], size_t bytes[5]) {
    int n = dflash_model_master_ranges(m, ptr, bytes);
    ptr[n] = m->adam_m, bytes[n++] = m->n_params * sizeof(float);
    ptr[n] = m->adam_v, bytes[n++] = m->n_params * sizeof(float);
    return n;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* A hash of the tensor table (names, shapes, offsets), the sizes, and the settings that shape
 * the drafter's function without its tensors (block size, captured layers): ranks must agree on
 * it. The MASK row is not in it: a member takes rank 0's (dflash_dp_sync_state). */
uint64_t dflash_dp_layout_hash(const dflash_model *m) {
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t sizes[3] = {m->n_params, m->n_decay, (uint64_t)m->n_tensors};
    h = fnv1a(h, sizes, sizeof sizes);
    int shape[2 + DFLASH_MAX_FEAT] = {m->cfg.block_size, m->cfg.n_feat};
    memcpy(shape + 2, m->cfg.target_layer_ids, (size_t)m->cfg.n_feat * sizeof(int));
    h = fnv1a(h, shape, sizeof shape);
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        h = fnv1a(h, t->name, strnlen(t->name, sizeof t->name));
        uint64_t d[4] = {(uint64_t)t->ndim, (uint64_t)t->shape[0], (uint64_t)t->shape[1],
                         (uint64_t)t->offset};
        h = fnv1a(h, d, sizeof d);
    }
    return h;
}

void dflash_dp_layout_text(const dflash_model *m, char *buf, size_t len) {
    const dflash_config *c = &m->cfg;
    char ids[DFLASH_MAX_FEAT * 4];
    target_layer_ids_text(c->target_layer_ids, c->n_feat, ids, sizeof ids);
    int n = snprintf(buf, len, "%d layer%s, block %d, hidden %d, target layers %s of %d, %zu "
                     "parameters", c->num_layers, c->num_layers == 1 ? "" : "s", c->block_size,
                     c->hidden_size, ids, c->num_target_layers, m->n_params);
    if (n >= (int)len && len > 4) memcpy(buf + len - 4, "...", 4); /* cut: say so */
}

/* The same model on every rank? Root's layout against each rank's; every rank learns which
 * ranks differ (one flag per rank, summed). 0: all the same; DFLASH_EMISMATCH on a rank that
 * differs from root, DFLASH_EAGAIN on the others when some rank does (root's model is the
 * group's: it and the ranks that match it are not at fault); or a collective error. */
static int check_layout(const dflash_model *m, dp_comm *comm, int root) {
    int world = dp_comm_world(comm), me = dp_comm_rank(comm);
    uint64_t mine[2] = {dflash_dp_layout_hash(m), m->n_params}, theirs[2] = {mine[0], mine[1]};
    int rc = dp_comm_broadcast_host(comm, theirs, sizeof theirs, root);
    if (rc) return rc;
    double bad[DP_COMM_MAX_WORLD] = {0};
    bad[me] = memcmp(mine, theirs, sizeof mine) != 0 ? 1.0 : 0.0;
    if (bad[me] > 0)
        LOG_ERROR("dflash_dp rank %d: this drafter has %zu parameters (layout %016llx), rank %d's "
                  "has %llu (layout %016llx)", me, m->n_params, (unsigned long long)mine[0], root,
                  (unsigned long long)theirs[1], (unsigned long long)theirs[0]);
    rc = dp_comm_allreduce_host_f64(comm, bad, world);
    if (rc == 0 && bad[me] > 0) rc = DFLASH_EMISMATCH;
    char list[160] = "";
    int n_bad = 0;
    for (int r = 0; rc == 0 && r < world; r++) {
        if (!(bad[r] > 0)) continue;
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%d", n_bad++ ? ", " : "", r);
    }
    if (n_bad) {
        LOG_WARN("dflash_dp rank %d: the drafter of rank%s %s differs from rank %d's (%llu "
                 "parameters): nothing copied; the group goes on without %s", me,
                 n_bad > 1 ? "s" : "", list, root, (unsigned long long)theirs[1],
                 n_bad > 1 ? "them" : "it");
        rc = DFLASH_EAGAIN;
    }
    return rc;
}

int dflash_dp_sync_state(dflash_model *m, dflash_train_cfg *tc, dp_comm *comm, int root) {
    if (!comm) return 0;
    if (root < 0 || root >= dp_comm_world(comm)) return DFLASH_EINVAL;
    dp_host_io io_store;
    const dp_host_io *io;
    void *stream;
    int rc = mem_path(m, comm, &io_store, &io, &stream);
    if (rc) return rc;
    m->ops->sync(m->ctx); /* a queued optimizer step has written the state it sends */
    rc = check_layout(m, comm, root);
    if (rc) return rc;

    void *ranges[5];
    size_t bytes[5];
    int nr = state_ranges(m, ranges, bytes);
    for (int i = 0; i < nr; i++) {
        rc = dp_comm_broadcast_io(comm, ranges[i], bytes[i], root, io, stream);
        if (rc) return rc;
    }
    int64_t step = m->step;
    rc = dp_comm_broadcast_host(comm, &step, sizeof step, root);
    if (rc) return rc;
    m->step = (long)step;
    /* rank 0's MASK row: its model was trained for it (a member without a checkpoint of its own
     * took the default, which may differ: the target's tokenizer.json, or an older default) */
    int32_t mask = m->cfg.mask_token_id;
    rc = dp_comm_broadcast_host(comm, &mask, sizeof mask, root);
    if (rc) return rc;
    if (mask != m->cfg.mask_token_id) {
        LOG_WARN("dflash_dp rank %d: taking rank %d's MASK row %d over this rank's %d",
                 dp_comm_rank(comm), root, (int)mask, m->cfg.mask_token_id);
        m->cfg.mask_token_id = mask;
    }
    dflash_model_sync_params(m);
    if (tc) {
        dflash_train_cfg root_tc = *tc; /* plain numbers: the same bytes on every rank */
        rc = dp_comm_broadcast_host(comm, &root_tc, sizeof root_tc, root);
        if (rc) return rc;
        if (root_tc.lr != tc->lr || root_tc.total_steps != tc->total_steps ||
            root_tc.n_anchors != tc->n_anchors || root_tc.clip != tc->clip ||
            root_tc.warmup_ratio != tc->warmup_ratio || root_tc.min_lr_ratio != tc->min_lr_ratio ||
            root_tc.weight_decay != tc->weight_decay || root_tc.gamma != tc->gamma)
            LOG_WARN("dflash_dp rank %d: taking rank %d's training settings (lr %g, schedule %ld "
                     "steps, %d anchors, clip %g) over this rank's (lr %g, %ld, %d, %g)",
                     dp_comm_rank(comm), root, root_tc.lr, root_tc.total_steps, root_tc.n_anchors,
                     root_tc.clip, tc->lr, tc->total_steps, tc->n_anchors, tc->clip);
        *tc = root_tc;
    }
    return 0;
}

uint64_t dflash_dp_state_hash(const dflash_model *m) {
    uint64_t h = 0xcbf29ce484222325ull;
    void *ranges[5];
    size_t bytes[5];
    int nr = state_ranges(m, ranges, bytes);
    enum { CHUNK = 1 << 16 };
    char *tmp = on_host(m) ? NULL : malloc(CHUNK);
    if (!on_host(m) && !tmp) return 0; /* out of memory: no hash */
    for (int i = 0; i < nr; i++) {
        for (size_t off = 0; off < bytes[i]; off += CHUNK) {
            size_t k = bytes[i] - off < CHUNK ? bytes[i] - off : CHUNK;
            const char *p = (const char *)ranges[i] + off;
            if (tmp) {
                m->ops->download_raw(m->ctx, tmp, p, k);
                p = tmp;
            }
            h = fnv1a(h, p, k);
        }
    }
    free(tmp);
    int64_t step = m->step;
    return fnv1a(h, &step, sizeof step);
}
