/* trainer: see trainer.h for start-up, the step, checkpoints and resume.
 *
 * State: one trainer per process. It owns the nn context, the frozen target tensors (a
 * target_model holding embed_tokens / lm_head), the drafter (dflash_model), the training config,
 * the metrics writer and, on the cuda backend, a host copy of each slot's small arrays.
 * Step numbers: m->step counts optimizer steps taken (1 after the first). A batch is acked with
 * the m->step that includes it: the one it was trained in, or, with --accumulate, for a batch of
 * a step still open, the step to come (m->step + 1; dflash_train.h); a checkpoint of step s
 * holds exactly the batches acked <= s (a checkpoint is written between steps: an open step's
 * batches are in none yet).
 * Thread: the drafter's main thread (worker_loop calls every hook from it).
 */
#include "trainer.h"
#include "monotime.h"
#include "dflash_ckpt.h"
#include "dflash_dp.h"
#include "dflash_eval.h"
#include "err.h"
#include "hf_config.h"
#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "progress.h"
#include "run_id.h"
#include "shard.h"
#include "step_rescale.h"
#include "target_model.h"
#include "wire.h"
#ifdef DFLASH_HAVE_CUDA
#include "ops_cuda.h"
#endif

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct trainer {
    pool_backend backend;
    slot_layout layout;
    const nn_ops *ops;
    nn_ctx *nn;
    target_model *target; /* frozen embed_tokens / lm_head only */
    dflash_model *m;
    dflash_train_cfg tc;
    int planned_anchors; /* the anchor count the drafter's blocks are planned for */
    metrics *met;
    void *host; /* cuda: host copy of a slot's header and small arrays */
    void *feat; /* cuda: the step's copy of the slot's hidden states (device) */
    /* steps queued on the device whose metrics are not reported yet, oldest first (the cuda
     * hot loop reports a step once the next one is queued: it never waits for the device) */
    struct step_note {
        uint32_t epoch, n_tokens, n_seqs;
        double queued_at;
    } notes[2];
    int note_head, note_count;
    double last_done; /* when the previous step's metrics came back */
    long drains;      /* host waits for the whole compute stream inside steps (should be 0) */
    long allocs;      /* memory allocations inside steps (ops.h allocs; should be 0) */
    char ckpt_root[1024];
    int ckpt_lock; /* dflash_ckpt_lock_root's descriptor: we are ckpt_root's only writer; -1 */
    uint64_t run_id; /* run_id.h: ckpt_root's, else this process's */
    int64_t ckpt_every;
    int keep_last;
    int64_t max_steps;
    const volatile sig_atomic_t *stop; /* trainer_opts.stop */
    long start_step; /* step resumed from (0: fresh or warm start) */
    long saved_step; /* newest checkpoint written by this process or resumed from */
    long committed;  /* newest durable step (the loop reports it) */
    int (*barrier)(void *arg, uint64_t step); /* the loop's durability barrier (set_barrier) */
    void *barrier_arg;
    dp_comm *comm;   /* data-parallel group (group_worker.h): NULL = alone */
    int group_size;  /* --group-size (0: none or alone): the ranks a step means (record_world) */
    int dp_rank;     /* our rank in the last group joined; only rank 0 writes checkpoints */
    bool dp_member;  /* joined a group at least once */
    long diverged_at; /* the first step whose loss or gradient norm was NaN or infinite; 0: none.
                         From then on nothing is checkpointed or committed (stop_if_diverged) */
    /* trained batches whose acks the broker has not taken: the loop's word for the next
     * checkpoint (unacked hook), and those of the checkpoint resumed from (resumed_unacked) */
    dflash_ckpt_unacked unacked[DFLASH_CKPT_MAX_UNACKED], resumed[DFLASH_CKPT_MAX_UNACKED];
    int n_unacked, n_resumed;
    /* summary */
    long steps_here, skipped; /* skipped: batches with no weighted position, in no-update steps */
    double loss_first, loss_last, tau_first, tau_last;
    double step_s;
    /* accumulation: the batches of the open step reported so far (record_step) */
    uint32_t open_tokens, open_seqs;
    double open_s;
    int micro_rc; /* a group step's micro-step that failed here (dflash_dp_close); 0: none */
    uint32_t last_epoch; /* of the last batch queued */
} trainer;

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_config(const char *dir) {
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    struct stat st;
    return stat(p, &st) == 0;
}

/* The compute backend for a pool backend: cpu ops for host slots, cuda ops for cuda slots. */
static int open_backend(pool_backend b, int device, int threads, const nn_ops **ops, nn_ctx **nn,
                        char *err, size_t errlen) {
    if (b == POOL_HOST) {
        *ops = nn_cpu_ops();
        *nn = nn_cpu_new(threads);
    } else {
#ifdef DFLASH_HAVE_CUDA
        *ops = nn_cuda_ops();
        *nn = nn_cuda_new(device);
#else
        (void)device;
        snprintf(err, errlen,
                 "this build has no cuda backend (configure on a machine with the "
                 "CUDA toolkit, or use --backend host)");
        return DFLASH_ECONFIG;
#endif
    }
    if (!*nn) {
        snprintf(err, errlen, "cannot create the %s compute context", (*ops)->name);
        return DFLASH_ENOMEM;
    }
    return 0;
}

static void close_backend(pool_backend b, nn_ctx **nn) {
    if (!*nn) return;
    if (b == POOL_HOST) nn_cpu_destroy(nn);
#ifdef DFLASH_HAVE_CUDA
    else
        nn_cuda_destroy(nn);
#endif
}

int trainer_features_check(int n_capture_ids, int n_feat, const char *capture_src,
                           const char *layers_src, char *err, size_t errlen) {
    if (n_capture_ids > 0 && n_capture_ids != n_feat) {
        snprintf(err, errlen,
                 "%s names %d target layers but the slots hold %d captured layers (%s): give "
                 "both daemons the same values",
                 capture_src, n_capture_ids, n_feat, layers_src);
        return DFLASH_EMISMATCH;
    }
    if (n_feat < 1 || n_feat > DFLASH_MAX_FEAT) {
        snprintf(err, errlen, "%s: captured layers must be in [1, %d]", layers_src,
                 DFLASH_MAX_FEAT);
        return DFLASH_ECONFIG;
    }
    return 0;
}

int trainer_drafter_config(const char *model_dir, int draft_layers, int block_size,
                           int mask_token_id, int n_feat, const int *capture_ids, int n_capture_ids,
                           dflash_config *out, char *err, size_t errlen) {
    model_config t;
    int rc = hf_config_load(model_dir, &t, err, errlen);
    if (rc < 0) return rc;
    char layers_src[64];
    snprintf(layers_src, sizeof layers_src, "--layers %d", n_feat);
    rc = trainer_features_check(capture_ids ? n_capture_ids : 0, n_feat, "--capture-layers",
                                layers_src, err, errlen);
    if (rc < 0) return rc;
    int mask = mask_token_id;
    if (mask < 0) {
        char why[PATH_MAX + 256];
        mask = hf_config_default_mask_row(model_dir, t.vocab_size, why, sizeof why);
        LOG_INFO("mask token: row %d, %s (--mask-token-id sets another)", mask, why);
    }
    dflash_config_default(out, &t, draft_layers, block_size, mask);
    int ids[DFLASH_MAX_FEAT];
    if (capture_ids) {
        memcpy(ids, capture_ids, (size_t)n_feat * sizeof *ids);
    } else if (target_default_layer_ids(t.num_layers, n_feat, ids) < 0) {
        snprintf(err, errlen,
                 "the target has %d layers: DFlash's rule gives no %d distinct "
                 "captured layers; give them with --capture-layers (both daemons)",
                 t.num_layers, n_feat);
        return DFLASH_ECONFIG;
    }
    if (ids[n_feat - 1] == t.num_layers - 1) {
        snprintf(err, errlen,
                 "captured layer %d is the target's last (%d layers): SGLang and vLLM take a "
                 "captured layer's output as the next layer's input, so they cannot feed it to "
                 "the drafter (and transformers' hidden_states[%d] is after the final norm); "
                 "capture layers below %d",
                 ids[n_feat - 1], t.num_layers, t.num_layers, t.num_layers - 1);
        return DFLASH_ECONFIG;
    }
    out->n_feat = n_feat;
    memcpy(out->target_layer_ids, ids, (size_t)n_feat * sizeof *ids);
    rc = dflash_config_validate(out, err, errlen);
    if (rc < 0) return rc;
    return dflash_config_check_target(out, &t, ids, n_feat, err, errlen);
}

/* Loads the target with one decoder layer: its embed_tokens and lm_head are what the drafter
 * borrows. max_tokens 1 keeps its activation plan tiny. */
static target_model *load_frozen(const char *model_dir, const nn_ops *ops, nn_ctx *nn) {
    int layer0 = 0;
    target_model_opts to = {.layer_ids = &layer0, .n_layer_ids = 1, .max_tokens = 1, .max_seqs = 1,
                            .lends = "the drafter's embeddings and lm_head"};
    return target_model_load(model_dir, &to, ops, nn);
}

static void report_oldest(trainer *t);

/* DFLASH_ENONFINITE once a step diverged (record_step said so), else 0: every hook that could
 * write a checkpoint, report a commit or train on returns it, and the daemon exits 7. */
static int stop_if_diverged(const trainer *t) {
    return t->diverged_at ? DFLASH_ENONFINITE : 0;
}

/* Saves the model at its step. The metrics of every queued step are read first (the save waits
 * for the device anyway): a checkpoint is written only when every step in it had a finite loss
 * and gradient norm; else DFLASH_ENONFINITE and nothing is written. */
static int save_checkpoint(trainer *t) {
    while (dflash_train_pending(t->m) > 0)
        report_oldest(t);
    int rc = stop_if_diverged(t);
    if (rc < 0) return rc;
    if (!t->ckpt_root[0] || t->m->step == t->saved_step) return 0;
    /* the records of the steps the group's checkpoint holds, on every rank that writes them
     * (scripts/train gives the metrics to one process, which need not be rank 0) */
    if (t->dp_member && t->dp_rank != 0) {
        if (t->met) metrics_sync(t->met);
        return 0; /* a group's rank 0 writes them */
    }
    char path[1200], err[512] = "";
    dflash_ckpt_opts co = {.keep_last = t->keep_last, .unacked = t->unacked,
                           .n_unacked = t->n_unacked};
    double t0 = monotime_s();
    /* the records of the steps it holds first: a run killed after the checkpoint and resumed
     * from it trains only later steps, so a record lost now would be a gap for good. A failure
     * is logged by metrics and does not hold the checkpoint back. */
    if (t->met) metrics_sync(t->met);
    /* The broker's durability barrier (worker_loop.h set_barrier): every ack of a batch in this
     * checkpoint is durable in its journal before the checkpoint is. A power loss then leaves
     * either the older checkpoint (the acks after it are rewound by our ResumeFrom to its step)
     * or this one with all its acks; never this one with acks the journal lost, whose batches
     * the broker would hand out again to the model that has trained them. Written whatever the
     * barrier answers (the loop says why it could not be had). */
    if (t->barrier) (void)t->barrier(t->barrier_arg, (uint64_t)t->m->step);
    rc = dflash_ckpt_save(t->m, &t->tc, t->ckpt_root, &co, path, sizeof path, err, sizeof err);
    if (rc < 0) {
        char hint[256];
        bool full = dflash_ckpt_space_hint(err, t->keep_last, dflash_ckpt_bytes(t->m, false),
                                           hint, sizeof hint);
        LOG_ERROR("checkpoint of step %ld under %s failed: %s (%s)%s%s", t->m->step,
                  t->ckpt_root, err_str(rc), err, full ? "; " : "", full ? hint : "");
        return rc;
    }
    t->saved_step = t->m->step;
    t->committed = t->m->step;
    LOG_INFO("checkpoint %s written in %.2f s", path, monotime_s() - t0);
    return 0;
}

/* The first step whose loss or gradient norm is NaN or infinite: its update made the weights
 * non-finite (a NaN norm leaves the clipping factor at 1, an infinite one makes it 0 and
 * inf * 0 NaN), and every step after it would train on them. Said once, with what to do; the
 * hooks then stop the run (stop_if_diverged). On the cuda backend the metrics come a step
 * late, so the step after it may be queued too: it is neither checkpointed nor committed. */
static void note_divergence(trainer *t, const dflash_metrics *dm) {
    bool loss_bad = !isfinite(dm->loss), norm_bad = !isfinite(dm->grad_norm);
    if ((!loss_bad && !norm_bad) || t->diverged_at) return;
    t->diverged_at = dm->step > 0 ? dm->step : 1;
    char kept[160];
    if (t->saved_step > 0)
        snprintf(kept, sizeof kept, "the newest checkpoint, step %ld, is the last one kept",
                 t->saved_step);
    else
        snprintf(kept, sizeof kept, "no checkpoint of this run is kept");
    LOG_ERROR("training diverged at step %ld: its %s %s not finite (loss %g, gradient norm %g). "
              "The run stops: %s and no batch trained since is reported as committed (the "
              "broker hands them out again). A restart resumes from there with the "
              "checkpoint's settings and diverges again: start a new run with a lower --lr "
              "(now %g; weight decay %g, clip %g) and another --checkpoint-dir, from that "
              "checkpoint's weights (--init-weights) or from scratch, or look for non-finite "
              "weights in the target (--model) or non-finite hidden states in its batches",
              t->diverged_at,
              loss_bad && norm_bad ? "loss and gradient norm" : loss_bad ? "loss" : "gradient norm",
              loss_bad && norm_bad ? "are" : "is", dm->loss, dm->grad_norm, kept, t->tc.lr,
              t->tc.weight_decay, t->tc.clip);
}

/* Reports the oldest queued step: collects its metrics (waiting for the device only if it has
 * not finished) and writes them. The step time is the wall time since the previous step came
 * back (or since it was queued), i.e. the device's step time once the loop runs ahead. */
static void record_step(trainer *t, const dflash_metrics *dm, const struct step_note *note,
                        double dt) {
    t->step_s += dt;
    if (dm->open) { /* a batch of a step still open: its tokens and time count with the step */
        t->open_tokens += note->n_tokens;
        t->open_seqs += note->n_seqs;
        t->open_s += dt;
        return;
    }
    struct step_note all = *note; /* the whole step's: every batch it trained */
    const struct step_note *n = &all;
    all.n_tokens += t->open_tokens, all.n_seqs += t->open_seqs;
    dt += t->open_s;
    t->open_tokens = t->open_seqs = 0;
    t->open_s = 0.0;
    if (dm->skipped) {
        t->skipped += dm->batches > 1 ? dm->batches : 1; /* batches, whatever a step holds */
        if (dm->batches > 1)
            LOG_INFO("the %d batches of a step (epoch %u) had no weighted position: no update "
                     "(step %ld)", dm->batches, n->epoch, dm->step);
        else
            LOG_INFO("a batch of epoch %u had no weighted position: no update (step %ld)",
                     n->epoch, dm->step);
        return;
    }
    if (!t->steps_here) {
        t->loss_first = dm->loss;
        t->tau_first = dm->accept_len;
    }
    t->loss_last = dm->loss;
    t->tau_last = dm->accept_len;
    t->steps_here++;
    note_divergence(t, dm);
    if (!t->met) return;
    metrics_scalar extra[] = {{"train/epoch", (double)n->epoch},
                              {"train/blocks", (double)dm->n_blocks},
                              {"perf/step_s", dt},
                              {"train/batches", (double)dm->batches}};
    metrics_step ms = {.step = dm->step,
                       .loss = dm->loss,
                       .accuracy = dm->accuracy,
                       .pos_acc = dm->pos_acc,
                       .n_pos = t->m->cfg.block_size,
                       .pos_first = 1,
                       .acceptance_length = dm->accept_len,
                       .lr = dm->lr,
                       .grad_norm = dm->grad_norm,
                       .tokens_per_s = dt > 0 ? n->n_tokens / dt : 0,
                       .samples_per_s = dt > 0 ? n->n_seqs / dt : 0,
                       .extra = extra,
                       .n_extra = t->tc.accumulate > 1 ? 4 : 3};
    metrics_write(t->met, &ms);
}

static void report_oldest(trainer *t) {
    dflash_metrics dm;
    if (dflash_train_collect(t->m, &dm) != 1) return;
    struct step_note n = t->notes[t->note_head];
    t->note_head = (t->note_head + 1) % 2;
    t->note_count--;
    double now = monotime_s();
    double since = t->last_done > n.queued_at ? t->last_done : n.queued_at;
    t->last_done = now;
    record_step(t, &dm, &n, now - since);
}

static int train_consume_group(trainer *t, const dflash_batch_view *v, const worker_batch *b,
                               uint64_t *step);

/* A group step left open between its micro-steps (the group re-forms, the run stops): nothing
 * of it is applied on any rank (the broker aborts it: its batches are trained again), so its
 * gradients and figures are dropped here too. */
static void abandon_group_step(trainer *t) {
    int open = dflash_train_open(t->m);
    if (open > 0)
        LOG_INFO("group step %ld abandoned after %d of its %d micro-steps: nothing of it is "
                 "applied (its batches are trained again)", t->m->step + 1, open,
                 t->tc.accumulate);
    dflash_train_discard(t->m);
    t->micro_rc = 0;
    t->open_tokens = t->open_seqs = 0;
    t->open_s = 0.0;
}

/* The run ends inside an accumulated step (fewer batches than --accumulate came: the data ran
 * out, a drain, a stop): the step is taken with the batches it has, so that every batch acked
 * with its step is in the final checkpoint (dflash_train_flush_async). Not after a divergence:
 * nothing is trained or saved then. Called by every end hook (unacked, finish, save_refused);
 * a no-op once the step is closed. */
static void close_open_step(trainer *t) {
    int open = dflash_train_open(t->m);
    if (open == 0 || t->diverged_at) return;
    if (t->dp_member) { /* a group step: taken by every rank or none (train_set_group) */
        abandon_group_step(t);
        return;
    }
    while (dflash_train_pending(t->m) > 0)
        report_oldest(t);
    if (t->diverged_at) return;
    int rc = dflash_train_flush_async(t->m, &t->tc);
    if (rc != 1) { /* two records pending cannot be: report_oldest collected them all */
        LOG_ERROR("cannot close the last step of %d batches: %s", open, err_str(rc));
        return;
    }
    t->notes[(t->note_head + t->note_count) % 2] = (struct step_note){
        .epoch = t->last_epoch, .queued_at = monotime_s()};
    t->note_count++;
    LOG_INFO("the run ends inside step %ld: it closes with the %d batch%s it has (of %d)",
             t->m->step, open, open > 1 ? "es" : "", t->tc.accumulate);
    while (dflash_train_pending(t->m) > 0)
        report_oldest(t);
}

/* Adds the allocations made since allocs0 (ops.h allocs) to the step count, warning at the
 * first: memory planned at start-up should cover every batch the broker can send. */
static void count_allocs(trainer *t, long allocs0) {
    long n = t->ops->allocs(t->nn) - allocs0;
    if (n > 0 && t->allocs == 0)
        LOG_WARN("step %ld allocated memory (%ld allocations) though memory is planned at "
                 "start-up; the exit summary counts every step's",
                 t->m->step, n);
    t->allocs += n;
}

static int train_consume(void *vctx, const worker_batch *b, uint64_t *step) {
    trainer *t = vctx;
    const slot_layout *l = &t->layout;
    int rc = stop_if_diverged(t); /* found while waiting (idle) */
    if (rc < 0) return rc;
    long drains0 = t->ops->stream_drains(t->nn), allocs0 = t->ops->allocs(t->nn);
    const void *host = b->staged;
    const void *hidden = (const char *)b->staged + l->off_hidden;
    if (t->backend == POOL_CUDA) {
        /* the small arrays (~100 KB) to the host: a synchronous copy on the default stream,
         * which does not wait for the (non-blocking) compute stream still running the
         * previous step */
        rc = pool_staging_read(POOL_CUDA, t->host, b->staged, l->off_hidden);
        if (rc < 0) return rc;
        host = t->host;
    }
    char err[512] = "";
    dflash_batch_view v;
    rc = dflash_view_from_slot(t->m, host, l, hidden, &v, err, sizeof err);
    if (rc < 0) {
        /* the batch's own fault (over the planned tokens, damaged arrays or header): a slot of
         * another layout, the target's configuration, was given back unread before its release
         * (train_layout, worker_session_check_layout) and never gets here */
        LOG_ERROR("batch (%u, %u, %llu) does not fit the drafter: %s", b->wu.epoch, b->wu.bucket,
                  (unsigned long long)b->wu.batch, err);
        return rc == DFLASH_ERANGE ? DFLASH_EMISMATCH : rc; /* the daemon's exit 3 */
    }
    const slot_header *h = host;
    if (h->wu.epoch != b->wu.epoch || h->wu.bucket != b->wu.bucket || h->wu.batch != b->wu.batch) {
        LOG_ERROR("the slot holds batch (%u, %u, %llu) but the grant named (%u, %u, %llu)",
                  h->wu.epoch, h->wu.bucket, (unsigned long long)h->wu.batch, b->wu.epoch,
                  b->wu.bucket, (unsigned long long)b->wu.batch);
        return DFLASH_EMISMATCH;
    }
    if (h->n_tokens != b->n_tokens || h->n_seqs != b->n_seqs) {
        /* the copy stopped at the announced tokens: rows past them are an earlier batch's */
        LOG_ERROR("batch (%u, %u, %llu): the slot holds %u tokens in %u sequences but the grant "
                  "announced %u tokens in %u sequences",
                  b->wu.epoch, b->wu.bucket, (unsigned long long)b->wu.batch, h->n_tokens,
                  h->n_seqs, b->n_tokens, b->n_seqs);
        return DFLASH_ECORRUPT;
    }
    if (t->backend == POOL_CUDA) {
        /* The step reads its own copy of the features, taken first on the compute stream; the
         * next slot copy into the staging buffer waits (on the device) only for this copy, so
         * it overlaps the step instead of waiting for it. */
        size_t used = (size_t)v.seq_off[v.n_seqs] * v.ld * t->ops->act_bytes;
        t->ops->copy(t->nn, t->feat, hidden, used);
        t->ops->order_after(t->nn, b->copy_stream);
        v.hidden = t->feat;
    }
    if (t->comm) return train_consume_group(t, &v, b, step);
    double queued_at = monotime_s();
    rc = dflash_train_step_async(t->m, &t->tc, &v, b->wu.epoch, dflash_batch_key(&b->wu));
    if (rc < 0) {
        LOG_ERROR("training step on batch (%u, %u, %llu) failed: %s", b->wu.epoch, b->wu.bucket,
                  (unsigned long long)b->wu.batch, err_str(rc));
        /* out of range: the batch's blocks or tokens exceed the plan (exit 3) */
        return rc == DFLASH_ERANGE ? DFLASH_EMISMATCH : rc;
    }
    t->notes[(t->note_head + t->note_count) % 2] = (struct step_note){
        .epoch = b->wu.epoch, .n_tokens = b->n_tokens, .n_seqs = b->n_seqs,
        .queued_at = queued_at};
    t->note_count++;
    t->last_epoch = b->wu.epoch;
    /* the step that includes this batch, counted when queued (accumulating: the next) */
    *step = (uint64_t)t->m->step + (dflash_train_open(t->m) > 0 ? 1u : 0u);
    /* cpu: the step has run; cuda: report the previous step, the device works on this one */
    int keep = t->backend == POOL_CUDA ? 1 : 0;
    while (dflash_train_pending(t->m) > keep)
        report_oldest(t);
    t->drains += t->ops->stream_drains(t->nn) - drains0;
    count_allocs(t, allocs0);
    return stop_if_diverged(t); /* this batch is not acked: the broker hands it out again */
}

/* The loop holds no batch the broker has not taken (worker_loop.h): the periodic checkpoint,
 * when a multiple of checkpoint_every was passed since the last one (its download waits for
 * the queued steps). */
static int train_settled(void *vctx) {
    trainer *t = vctx;
    int rc = stop_if_diverged(t);
    if (rc < 0) return rc;
    if (t->ckpt_every <= 0 || t->m->step / t->ckpt_every <= t->saved_step / t->ckpt_every) return 0;
    return save_checkpoint(t);
}

/* The loop's durability barrier (worker_loop.h): save_checkpoint calls it first. */
static void train_set_barrier(void *vctx, int (*barrier)(void *arg, uint64_t step), void *arg) {
    trainer *t = vctx;
    t->barrier = barrier;
    t->barrier_arg = arg;
}

static uint64_t train_committed(void *vctx) {
    return (uint64_t)((trainer *)vctx)->committed;
}

static int64_t train_resume_step(void *vctx) {
    return ((trainer *)vctx)->start_step;
}

static uint64_t train_run_id(void *vctx) {
    return ((trainer *)vctx)->run_id;
}

/* The layout every slot must have been written for, with the target layers our model reads
 * (worker_loop.h, layout()): the loop gives a slot of another layout back unread. */
static const slot_layout *train_layout(void *vctx) {
    return &((trainer *)vctx)->layout;
}

/* The loop's trained batches without an ack (worker_loop.h), for the checkpoint that follows.
 * One trained at a step this model does not hold (it cannot be, but a checkpoint refuses it)
 * is left out with a warning. */
static void train_unacked(void *vctx, const worker_unacked *b, uint32_t n) {
    trainer *t = vctx;
    close_open_step(t); /* its batches are acked (or held) with the step it becomes */
    t->n_unacked = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (t->n_unacked == DFLASH_CKPT_MAX_UNACKED) { /* the broker trains the rest again */
            LOG_WARN("%u trained batches without an ack: the checkpoint records %d of them, the "
                     "others will be trained again", n, DFLASH_CKPT_MAX_UNACKED);
            break;
        }
        if (b[i].step < 1 || b[i].step > (uint64_t)t->m->step) {
            LOG_WARN("batch (%u, %u, %llu) trained at step %llu is not in the model (at step "
                     "%ld): not recorded as unacked", b[i].wu.epoch, b[i].wu.bucket,
                     (unsigned long long)b[i].wu.batch, (unsigned long long)b[i].step,
                     t->m->step);
            continue;
        }
        t->unacked[t->n_unacked++] = (dflash_ckpt_unacked){b[i].wu.epoch, b[i].wu.bucket,
                                                            b[i].wu.batch, (long)b[i].step};
    }
}

static uint32_t train_resumed_unacked(void *vctx, worker_unacked *out, uint32_t max) {
    trainer *t = vctx;
    uint32_t n = 0;
    for (; n < max && n < (uint32_t)t->n_resumed; n++) {
        const dflash_ckpt_unacked *u = &t->resumed[n];
        out[n] = (worker_unacked){{u->epoch, u->bucket, u->index}, (uint64_t)u->step};
    }
    return n;
}

/* The step the run stops at: --max-steps, else the end of the schedule (--total-steps; a
 * resumed run's from its checkpoint, a group's from rank 0 once it synced), past which the
 * learning rate stays at its floor (0 by default): --max-steps 0 does not mean training on at
 * that rate until the data runs out. 0 when neither is set (constant lr: until drained). */
static long step_limit(const trainer *t) {
    return t->max_steps > 0 ? (long)t->max_steps : t->tc.total_steps;
}

static bool train_done_at(void *vctx, uint64_t step) {
    trainer *t = vctx;
    return step_limit(t) > 0 && step >= (uint64_t)step_limit(t);
}

static bool train_done(void *vctx) {
    return train_done_at(vctx, (uint64_t)((trainer *)vctx)->m->step);
}

/* The loop waits for data: the last step's metrics (read a step later while steps come) are
 * written and the files flushed, so a stalled run's metrics are current. */
static void train_idle(void *vctx) {
    trainer *t = vctx;
    while (dflash_train_pending(t->m) > 0)
        report_oldest(t);
    if (t->met) metrics_flush(t->met);
}

/* The exit summary: steps, time per step, first and last loss and training-block acceptance;
 * a run that trained no step has no such figures and says so. */
static void log_summary(const trainer *t) {
    if (!t->steps_here) {
        LOG_INFO("training: no step trained in this run (at step %ld), %ld skipped batches; "
                 "memory allocations inside steps: %ld",
                 t->m->step, t->skipped, t->allocs);
        return;
    }
    LOG_INFO("training: %ld steps in this run (%ld .. %ld), %ld skipped batches, %.3f s per step; "
             "loss first %.4f last %.4f; training-block acceptance first %.3f last %.3f; "
             "host waits for the whole compute stream inside steps: %ld; memory allocations "
             "inside steps: %ld",
             t->steps_here, t->start_step, t->m->step, t->skipped, t->step_s / t->steps_here,
             t->loss_first, t->loss_last, t->tau_first, t->tau_last, t->drains, t->allocs);
}

/* The final checkpoint (none after a divergence: DFLASH_ENONFINITE), the summary, and why a run
 * ended early: DFLASH_ENODATA when every batch it got was skipped (nothing to train on in the
 * data: more epochs cannot help), else a warning when the step limit was not reached. */
static int train_finish(void *vctx) {
    trainer *t = vctx;
    close_open_step(t);
    int rc = save_checkpoint(t); /* reads the queued steps' metrics first */
    if (t->met) metrics_flush(t->met);
    log_summary(t);
    if (rc < 0) return rc;
    /* a stop signal ends a run early by request: the batches to come may well be trainable */
    if (!t->steps_here && t->skipped && !(t->stop && *t->stop)) {
        LOG_ERROR("no step trained: every one of the %ld batches this run got had no weighted "
                  "position (an anchor needs two loss-masked tokens in a row): the data's loss "
                  "masks leave nothing to train on. Check how the data was made (dflash-data: "
                  "the loss_mask of each sequence should mark its response tokens); more epochs "
                  "would not help. (A run cut short by --max-batches may only have missed the "
                  "batches that have one.)",
                  t->skipped);
        return DFLASH_ENODATA;
    }
    /* the loop ended short of the step limit without a stop signal: the broker had no batch
     * left (the target's planned epochs all trained, or a drain) */
    long limit = step_limit(t);
    if (limit > 0 && t->m->step < limit && !(t->stop && *t->stop))
        LOG_WARN("the schedule is not finished: training stopped at step %ld of %ld (lr still "
                 "%g), before the step limit (the reason is above: the broker had no batch "
                 "left, --max-batches, a drain, an error). Only if the broker said every batch "
                 "of the target's planned epochs is trained, continue with more epochs: restart "
                 "dflash-target with a larger --epochs and this drafter with the same flags; "
                 "after a drain, or once an error is mended, start it again as it was. It "
                 "resumes from %s",
                 t->m->step, limit, dflash_train_lr(&t->tc, t->m->step),
                 t->ckpt_root[0] ? "its newest checkpoint under --checkpoint-dir"
                                 : "step 0 (no --checkpoint-dir: nothing was saved)");
    return 0;
}

/* The broker refused to take us back (worker_loop.h save_refused; the loop decided it is safe):
 * the final checkpoint of the steps past the newest one, in our own --checkpoint-dir, which no
 * broker hears of, and the summary. Nothing without a checkpoint dir, on a group rank other than
 * 0, or after a divergence (DFLASH_ENONFINITE), as for any checkpoint. */
static int train_save_refused(void *vctx) {
    trainer *t = vctx;
    long before = t->saved_step;
    close_open_step(t);
    int rc = save_checkpoint(t); /* reads the queued steps' metrics first */
    if (t->met) metrics_flush(t->met);
    log_summary(t);
    if (rc == 0 && t->saved_step != before)
        LOG_WARN("the final checkpoint (step %ld) is in --checkpoint-dir %s although the broker "
                 "refused to take us back: it is reported to no broker; a restart on this "
                 "--checkpoint-dir resumes from it",
                 t->saved_step, t->ckpt_root);
    return rc;
}

/* --- data-parallel group hooks (group_worker.h) -------------------------------------------- */

/* One micro-step of a group step (--accumulate > 1): the batch's gradient into the accumulator,
 * no collective (dflash_dp_micro); its tokens and time count with the step (record_step). A
 * batch that fails here fails the step on every rank at its close, as a one-batch step's does
 * in the collective. */
static int train_micro_group(trainer *t, const dflash_batch_view *v, const worker_batch *b,
                             uint64_t *step) {
    double t0 = monotime_s();
    long allocs0 = t->ops->allocs(t->nn);
    dflash_metrics loc;
    int rc = dflash_dp_micro(t->m, &t->tc, v, b->wu.epoch, dflash_batch_key(&b->wu), &loc);
    count_allocs(t, allocs0);
    if (rc < 0 && !t->micro_rc) t->micro_rc = rc;
    if (rc < 0)
        LOG_WARN("group training on batch (%u, %u, %llu) failed: %s (the group skips the step)",
                 b->wu.epoch, b->wu.bucket, (unsigned long long)b->wu.batch, err_str(rc));
    t->open_tokens += b->n_tokens;
    t->open_seqs += b->n_seqs;
    t->open_s += monotime_s() - t0;
    t->last_epoch = b->wu.epoch;
    *step = (uint64_t)t->m->step + 1;
    return 0;
}

/* The ranks whose batches make a step, as the checkpoints record it (tc.world): the group's
 * --group-size when given, which a group short of ranks (one lost, or not come by --group-wait-s)
 * still means to have, so that a resume restores the run's step and not the shortfall's; the
 * live group's size when larger (a group of hand-started ranks past its --group-size) or none. */
static void record_world(trainer *t) {
    int live = dp_comm_world(t->comm);
    t->tc.world = t->group_size > live ? t->group_size : live;
}

/* The group step of the micro-steps consumed since the last close (worker_loop.h close_step):
 * dflash_dp_close all-reduces the accumulated gradients and applies the update on every rank;
 * then the group's metrics, as for a one-batch group step. */
static int train_close_group(void *vctx, uint64_t *step) {
    trainer *t = vctx;
    dflash_metrics dm;
    double t0 = monotime_s();
    long allocs0 = t->ops->allocs(t->nn);
    int rc = dflash_dp_close(t->m, &t->tc, t->comm, t->micro_rc, &dm, NULL);
    t->micro_rc = 0;
    double dt = monotime_s() - t0;
    count_allocs(t, allocs0);
    if (rc < 0) {
        LOG_WARN("group training step %ld failed: %s", t->m->step + 1, err_str(rc));
        abandon_group_step(t);
        return rc;
    }
    *step = (uint64_t)t->m->step;
    record_world(t);
    struct step_note n = {.epoch = t->last_epoch};
    record_step(t, &dm, &n, dt);
    return stop_if_diverged(t); /* every rank alike: the group's loss and norm */
}

/* One rank's share of a group step: dflash_train_step_dp averages the gradients over the group
 * (synchronous: the collective needs the step's gradients), then the group's metrics. With
 * --accumulate, a micro-step of it (train_micro_group). */
static int train_consume_group(trainer *t, const dflash_batch_view *v, const worker_batch *b,
                               uint64_t *step) {
    while (dflash_train_pending(t->m) > 0)
        report_oldest(t);
    if (t->tc.accumulate > 1) return train_micro_group(t, v, b, step);
    dflash_metrics dm;
    double t0 = monotime_s();
    long allocs0 = t->ops->allocs(t->nn); /* the group step waits by design, allocates nothing */
    int rc = dflash_train_step_dp(t->m, &t->tc, v, b->wu.epoch, dflash_batch_key(&b->wu),
                                  t->comm, &dm);
    double dt = monotime_s() - t0;
    count_allocs(t, allocs0);
    if (rc < 0) {
        LOG_WARN("group training step on batch (%u, %u, %llu) failed: %s", b->wu.epoch,
                 b->wu.bucket, (unsigned long long)b->wu.batch, err_str(rc));
        return rc;
    }
    *step = (uint64_t)t->m->step;
    record_world(t);
    struct step_note n = {.epoch = b->wu.epoch, .n_tokens = b->n_tokens, .n_seqs = b->n_seqs};
    record_step(t, &dm, &n, dt);
    /* the loss is all-reduced and the gradient norm is that of the all-reduced gradient (rank
     * 0's, broadcast, when clipping): every rank finds a divergence at the same step and stops
     * alike (group_worker.c ends on DFLASH_ENONFINITE instead of re-forming) */
    return stop_if_diverged(t);
}

static void train_set_group(void *vctx, dp_comm *comm, int rank, int world) {
    trainer *t = vctx;
    (void)world;
    if (comm != t->comm) abandon_group_step(t); /* a step of the epoch left: not taken */
    t->comm = comm;
    if (comm) {
        t->dp_rank = rank;
        t->dp_member = true;
    }
}

/* Blocks the drafter is planned for when a sequence takes up to `anchors`: one per anchor of
 * each of --max-seqs sequences, at most one per context token. */
static long planned_blocks(const slot_layout *l, int anchors) {
    long blocks = (long)anchors * l->max_seqs;
    return blocks > (long)l->token_budget ? (long)l->token_budget : blocks;
}

/* Takes rank root's model and training state; our checkpoints past its step then belong to a
 * history we no longer have, and are set aside (dflash_ckpt_set_aside_after). Rank root's
 * anchor count is taken too: one past what our blocks were planned for (our --anchors, or our
 * checkpoint's, was smaller) is DFLASH_ECONFIG, said with the flag that mends it (defect: every
 * batch with more anchors failed on this rank, and the group skipped the step and re-formed
 * for ever). */
static int train_sync_state(void *vctx, int root) {
    trainer *t = vctx;
    while (dflash_train_pending(t->m) > 0)
        report_oldest(t);
    int rc = dflash_dp_sync_state(t->m, &t->tc, t->comm, root);
    if (rc == 0 && planned_blocks(&t->layout, t->tc.n_anchors) > t->m->max_blocks) {
        LOG_ERROR("rank %d of the group trains with %d anchors a sequence (--anchors, or its "
                  "checkpoint's), and this drafter's memory is planned for %d blocks a batch "
                  "(%d anchors x --max-seqs %u, at most --token-budget %u): restart it with "
                  "--anchors %d; leaving the group", root, t->tc.n_anchors, t->m->max_blocks,
                  t->planned_anchors, t->layout.max_seqs, t->layout.token_budget,
                  t->tc.n_anchors);
        return DFLASH_ECONFIG;
    }
    if (rc == 0 && t->dp_rank != root && (t->saved_step || t->committed)) {
        /* rank root's history is ours now, and no checkpoint of it is (defect: a rank that had
         * resumed past root's step and later became rank 0 reported that step as committed,
         * and wrote no checkpoint until past it) */
        LOG_INFO("took rank %d's model at step %ld: our checkpoint of step %ld is of another "
                 "history, none of this one is ours yet", root, t->m->step, t->saved_step);
        t->saved_step = t->committed = 0;
    }
    if (rc < 0 || !t->ckpt_root[0] || !is_dir(t->ckpt_root)) return rc;
    char err[4600];
    if (dflash_ckpt_set_aside_after(t->ckpt_root, t->m->step, err, sizeof err) < 0)
        LOG_ERROR("%s: move the checkpoints of --checkpoint-dir %s past step %ld away before the "
                  "next restart, or it resumes from them", err, t->ckpt_root, t->m->step);
    return rc;
}

static uint64_t train_model_step(void *vctx) {
    return (uint64_t)((trainer *)vctx)->m->step;
}

static uint64_t train_state_hash(void *vctx) {
    return dflash_dp_state_hash(((trainer *)vctx)->m);
}

static uint32_t train_accumulate(void *vctx) {
    const trainer *t = vctx;
    return t->tc.accumulate > 1 ? (uint32_t)t->tc.accumulate : 1;
}

static uint64_t train_shape(void *vctx, char *text, size_t len) {
    const trainer *t = vctx;
    dflash_dp_layout_text(t->m, text, len);
    return dflash_dp_layout_hash(t->m);
}

static void train_destroy(void *vctx) {
    trainer *t = vctx;
    if (!t) return;
    metrics_destroy(&t->met);
    dflash_model_destroy(&t->m);
    target_model_destroy(&t->target);
    if (t->ops && t->nn) {
        t->ops->free(t->nn, t->feat);
        t->ops->host_free(t->nn, t->host);
    }
    close_backend(t->backend, &t->nn);
    if (t->ckpt_lock >= 0) close(t->ckpt_lock);
    free(t);
}

/* err (why checkpoint dir cannot be resumed) with the checkpoint named and what to do, by the
 * kind of failure rc; returns rc. A file that cannot be read (DFLASH_EIO: permissions, a volume
 * mounted for another uid, an I/O error) is not a damaged checkpoint: moving it away would lose
 * a good one. */
static int resume_refused(const char *dir, int rc, char *err, size_t errlen) {
    char why[1024];
    snprintf(why, sizeof why, "%s", err);
    switch (rc) {
    case DFLASH_EMISMATCH:
        snprintf(err, errlen,
                 "cannot resume from %s: %s; give the drafter the --model and flags that run was "
                 "trained with, or another --checkpoint-dir to start a new run",
                 dir, why);
        break;
    case DFLASH_EIO:
        snprintf(err, errlen,
                 "cannot resume from %s: %s; a file of the checkpoint cannot be read or written: "
                 "keep the checkpoint (moving it away would lose it), fix the access to it "
                 "(permissions, owner, the volume's mount, free space) and start again",
                 dir, why);
        break;
    case DFLASH_ENOTFOUND:
        snprintf(err, errlen,
                 "cannot resume from %s: %s; complete the checkpoint (e.g. finish its copy), or "
                 "move it out of its directory to resume from the one before it",
                 dir, why);
        break;
    case DFLASH_EFORMAT:
    case DFLASH_ECONFIG: /* config.json's values */
    case DFLASH_ECORRUPT:
    case DFLASH_ENONFINITE: /* a NaN or infinity in its masters or moments */
    case DFLASH_EUNSUPPORTED:
        snprintf(err, errlen,
                 "cannot resume from %s: %s; the checkpoint is damaged: move it out of its "
                 "directory to resume from the one before it",
                 dir, why);
        break;
    case DFLASH_EVERSION: /* another training-state format: another version of ours wrote it */
        snprintf(err, errlen,
                 "cannot resume from %s: %s; it was written by another version of dflash-drafter: "
                 "resume it with that version, or start a new run from its weights with "
                 "--init-weights %s and another --checkpoint-dir (or move it out of its "
                 "directory to resume from the one before it)",
                 dir, why, dir);
        break;
    default: /* DFLASH_ENOMEM, ...: the message says it all */
        snprintf(err, errlen, "cannot resume from %s: %s", dir, why);
    }
    return rc;
}

/* The checkpoint an exact resume starts from, into dir ("" when none): --resume (a step
 * directory or a root), else the newest under --checkpoint-dir; with its step and training
 * settings in *saved. Refuses a --resume older than the newest checkpoint in --checkpoint-dir:
 * the next restart would resume from that one, and the retention, which keeps the newest names,
 * would delete this run's new checkpoints. */
static int resume_source(const trainer *t, const trainer_opts *o, char *dir, size_t dirlen,
                         dflash_train_cfg *saved, long *saved_step, char *err, size_t errlen) {
    dir[0] = 0;
    if (t->ckpt_root[0] && is_dir(t->ckpt_root)) dflash_ckpt_recover(t->ckpt_root);
    if (o->resume && o->resume[0]) {
        snprintf(dir, dirlen, "%s", o->resume);
        if (!has_config(dir) && dflash_ckpt_latest(o->resume, dir, dirlen) < 0) {
            snprintf(err, errlen, "--resume %s: no checkpoint there", o->resume);
            return DFLASH_ENOTFOUND;
        }
    } else if (t->ckpt_root[0] && is_dir(t->ckpt_root)) {
        if (dflash_ckpt_latest(t->ckpt_root, dir, dirlen) < 0) dir[0] = 0;
    }
    if (!dir[0]) return 0;
    int rc = dflash_ckpt_train_settings(dir, saved, saved_step, err, errlen);
    if (rc < 0) return resume_refused(dir, rc, err, errlen);
    char newest[1200];
    dflash_train_cfg nc;
    long newest_step;
    if (o->resume && o->resume[0] && t->ckpt_root[0] && is_dir(t->ckpt_root) &&
        dflash_ckpt_latest(t->ckpt_root, newest, sizeof newest) == 0 &&
        dflash_ckpt_train_settings(newest, &nc, &newest_step, err, errlen) == 0 &&
        newest_step > *saved_step) {
        snprintf(err, errlen,
                 "--resume %s (step %ld) into --checkpoint-dir %s, which holds the newer %s "
                 "(step %ld) of the run resumed from: a restart would resume from that one and "
                 "the retention would delete the new run's checkpoints; give another "
                 "--checkpoint-dir, or move the newer ones away",
                 dir, *saved_step, t->ckpt_root, newest, newest_step);
        return DFLASH_ECONFIG;
    }
    return 0;
}

/* Whether checkpoint dir lies under root (both resolved): this run's own, which the resume
 * may write (a missing or damaged model.safetensors again), holding root's lock. */
static bool under_root(const char *dir, const char *root) {
    if (!root[0]) return false;
    char d[PATH_MAX], r[PATH_MAX];
    if (!realpath(dir, d) || !realpath(root, r)) return false;
    size_t n = strlen(r);
    return strncmp(d, r, n) == 0 && (d[n] == '/' || d[n] == 0);
}

/* The checkpoint --init-weights names: that directory, or the newest one under it. */
static int init_weights_dir(const char *init, char *dir, size_t len) {
    snprintf(dir, len, "%s", init);
    return has_config(dir) || dflash_ckpt_latest(init, dir, len) == 0 ? 0 : -1;
}

/* Without --mask-token-id, a resume or a warm start keeps its checkpoint's MASK row: the
 * default may have changed since that checkpoint's run began (vocab_size - 1 before
 * tokenizer.json was read for it), and its weights were trained for that row. A checkpoint
 * whose config cannot be read is left to the load, which says why. */
static void keep_checkpoint_mask(const char *dir, const char *what, dflash_config *dc) {
    dflash_config ck;
    char why[512];
    if (dflash_ckpt_load_config(dir, &ck, why, sizeof why) < 0 ||
        ck.mask_token_id == dc->mask_token_id)
        return;
    LOG_INFO("mask token: row %d, the %s checkpoint's (the default for a new run: %d)",
             ck.mask_token_id, what, dc->mask_token_id);
    dc->mask_token_id = ck.mask_token_id;
}

/* Step 4 of the start-up: exact resume from dir (resume_source), warm start or fresh weights. */
static int restore(trainer *t, const trainer_opts *o, const char *resume_dir, char *err,
                   size_t errlen) {
    char dir[1200] = "";
    if (resume_dir[0]) {
        /* checks the checkpoint's config against the drafter's first */
        int rc = dflash_ckpt_resume(t->m, &t->tc, resume_dir, under_root(resume_dir, t->ckpt_root),
                                    err, errlen);
        if (rc < 0) return resume_refused(resume_dir, rc, err, errlen);
        if (t->tc.lr * t->tc.weight_decay >= 1.0) {
            snprintf(err, errlen,
                     "cannot resume from %s: its lr %g with weight decay %g (the checkpoint's "
                     "settings win over the flags) make the decoupled decay 1 - lr * weight_decay "
                     "%g, not positive: the weights would flip and grow each step; start a new "
                     "run from its weights with a lower --lr (--init-weights %s and another "
                     "--checkpoint-dir)",
                     resume_dir, t->tc.lr, t->tc.weight_decay,
                     1.0 - t->tc.lr * t->tc.weight_decay, resume_dir);
            return DFLASH_ECONFIG;
        }
        /* the step keeps its slots whatever the number of drafters now (step_rescale.h) */
        int ckpt_accumulate = t->tc.accumulate > 1 ? t->tc.accumulate : 1;
        step_rescale sr;
        char line[3072]; /* names the checkpoint twice */
        step_rescale_decide(resume_dir, t->tc.world, ckpt_accumulate,
                            o->group ? o->group_size : 1, o->group, &sr, line, sizeof line);
        t->tc.accumulate = sr.accumulate;
        t->tc.world = sr.world;
        if (sr.kind == STEP_RESCALE_ADAPT) LOG_INFO("%s", line);
        if (sr.kind == STEP_RESCALE_CHANGE) LOG_WARN("%s", line);
        t->start_step = t->saved_step = t->committed = t->m->step;
        rc = dflash_ckpt_unacked_batches(resume_dir, t->resumed, DFLASH_CKPT_MAX_UNACKED,
                                         &t->n_resumed, err, errlen);
        if (rc < 0) return resume_refused(resume_dir, rc, err, errlen);
        if (t->n_resumed)
            LOG_INFO("%s holds %d trained batches whose acks no broker took before the stop "
                     "(the first (%u, %u, %llu) of step %ld): acked once the broker takes our "
                     "resume", resume_dir, t->n_resumed, t->resumed[0].epoch, t->resumed[0].bucket,
                     (unsigned long long)t->resumed[0].index, t->resumed[0].step);
        if (o->init_weights && o->init_weights[0])
            LOG_WARN("--init-weights %s ignored: resuming the run from %s", o->init_weights,
                     resume_dir);
        LOG_INFO("resumed exactly from %s at step %ld (lr %g, schedule %ld steps, %d anchors, "
                 "%d batch%s a step%s; the checkpoint's training settings win over the flags)",
                 resume_dir, t->m->step, t->tc.lr, t->tc.total_steps, t->tc.n_anchors,
                 t->tc.accumulate, t->tc.accumulate > 1 ? "es" : "",
                 o->group ? " on each rank" : "");
        if (t->tc.accumulate != (o->train.accumulate > 1 ? o->train.accumulate : 1))
            LOG_WARN("--accumulate %d ignored: the resumed run trains %d batch%s a step%s, as its "
                     "checkpoint's step says (another batch size is a new run: --init-weights %s "
                     "and another --checkpoint-dir)",
                     o->train.accumulate, t->tc.accumulate, t->tc.accumulate > 1 ? "es" : "",
                     o->group ? " on each rank" : "", resume_dir);
        if (t->max_steps > 0 && t->tc.total_steps > 0 && t->max_steps > t->tc.total_steps) {
            snprintf(err, errlen,
                     "--max-steps %ld is past the resumed run's schedule of %ld steps, after "
                     "which its learning rate stays at %g; to train on, start a new run from "
                     "its weights (--init-weights %s, another --checkpoint-dir and the new "
                     "schedule)",
                     t->max_steps, t->tc.total_steps, t->tc.lr * t->tc.min_lr_ratio, resume_dir);
            return DFLASH_ECONFIG;
        }
        return 0;
    }
    if (o->init_weights && o->init_weights[0]) {
        if (init_weights_dir(o->init_weights, dir, sizeof dir) < 0) {
            snprintf(err, errlen, "--init-weights %s: no checkpoint there", o->init_weights);
            return DFLASH_ENOTFOUND;
        }
        int rc = dflash_ckpt_load_weights(t->m, dir, err, errlen);
        if (rc < 0) return rc;
        LOG_INFO("warm start: weights from %s, fresh optimizer, step 0", dir);
        return 0;
    }
    LOG_INFO("fresh drafter (init seed %llu)", (unsigned long long)o->init_seed);
    return 0;
}

int trainer_schedule_check(const dflash_train_cfg *tc, int64_t max_steps, const char *total_src,
                           const char *max_src, char *err, size_t errlen) {
    if (max_steps <= 0 || tc->total_steps <= 0 || max_steps <= tc->total_steps) return 0;
    snprintf(err, errlen,
             "%s is past %s: the last %ld steps would train at the schedule's floor (lr %g), and "
             "the same command could not resume the run; give --total-steps >= --max-steps "
             "(0 = --max-steps)",
             max_src, total_src, (long)max_steps - tc->total_steps, tc->lr * tc->min_lr_ratio);
    return DFLASH_ECONFIG;
}

worker_consumer *trainer_new(const trainer_opts *o, char *err, size_t errlen) {
    worker_consumer *c = calloc(1, sizeof *c);
    trainer *t = calloc(1, sizeof *t);
    if (t) t->ckpt_lock = -1;
    if (!c || !t) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    t->backend = o->backend;
    t->layout = *o->layout;
    t->tc = o->train;
    t->group_size = o->group ? o->group_size : 0;
    t->tc.world = o->group ? o->group_size : 1; /* a resume's: restore; a group's: its steps */
    t->ckpt_every = o->checkpoint_every;
    t->keep_last = o->keep_last > 0 ? o->keep_last : 3;
    t->max_steps = o->max_steps;
    t->stop = o->stop;
    snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s", o->checkpoint_dir ? o->checkpoint_dir : "");
    /* found out now, not at the first checkpoint, after hours of training */
    char why[600];
    if (t->ckpt_root[0] &&
        (dflash_ckpt_check_root(t->ckpt_root, why, sizeof why) < 0 ||
         dflash_ckpt_lock_root(t->ckpt_root, &t->ckpt_lock, why, sizeof why) < 0)) {
        snprintf(err, errlen, "--checkpoint-dir: %s", why);
        goto fail;
    }
    /* the run the broker knows us by: the checkpoint root's, so a restart is the same run */
    if (t->ckpt_root[0] && run_id_load_or_create(t->ckpt_root, &t->run_id, why, sizeof why) < 0) {
        snprintf(err, errlen, "--checkpoint-dir: %s", why);
        goto fail;
    }
    if (!t->ckpt_root[0]) t->run_id = wire_new_incarnation();
    LOG_INFO("run %016" PRIx64 " (%s)", t->run_id,
             t->ckpt_root[0] ? "the checkpoint dir's run-id: a restart is the same run"
                             : "this process's: no --checkpoint-dir");

    dflash_config dc;
    if (trainer_drafter_config(o->model_dir, o->draft_layers, o->block_size, o->mask_token_id,
                               (int)o->layout->n_layers, o->capture_ids, o->n_capture_ids, &dc, err,
                               errlen) < 0)
        goto fail;
    if (dc.hidden_size != (int)o->layout->hidden) {
        snprintf(err, errlen, "the target's hidden_size is %d but the slots hold hidden %u",
                 dc.hidden_size, o->layout->hidden);
        goto fail;
    }
    /* every slot must come from a target capturing exactly these layers (slot_header_check) */
    if (slot_layout_set_layer_ids(&t->layout, dc.target_layer_ids, dc.n_feat) < 0) {
        snprintf(err, errlen, "%d captured layers do not fit a slot header (max %d)", dc.n_feat,
                 SLOT_MAX_LAYER_IDS);
        goto fail;
    }
    if (open_backend(o->backend, o->device, o->threads, &t->ops, &t->nn, err, errlen) < 0)
        goto fail;
    t->target = load_frozen(o->model_dir, t->ops, t->nn);
    if (!t->target) {
        snprintf(err, errlen,
                 "cannot load the target's embed_tokens / lm_head from %s (see the "
                 "log above)",
                 o->model_dir);
        goto fail;
    }
    /* an exact resume takes the checkpoint's settings, its anchor count among them: the
     * blocks are planned for those */
    char resume_dir[1200];
    dflash_train_cfg saved;
    long saved_step = 0;
    if (resume_source(t, o, resume_dir, sizeof resume_dir, &saved, &saved_step, err, errlen) < 0)
        goto fail;
    char init_dir[1200];
    if (o->mask_token_id < 0 && resume_dir[0])
        keep_checkpoint_mask(resume_dir, "resumed", &dc);
    else if (o->mask_token_id < 0 && o->init_weights && o->init_weights[0] &&
             init_weights_dir(o->init_weights, init_dir, sizeof init_dir) == 0)
        keep_checkpoint_mask(init_dir, "--init-weights", &dc);
    int anchors = resume_dir[0] ? saved.n_anchors : o->train.n_anchors;
    long blocks = planned_blocks(o->layout, anchors);
    t->planned_anchors = anchors;
    t->m = dflash_model_new(&dc, t->ops, t->nn, target_model_embed_tokens(t->target),
                            target_model_lm_head(t->target), (int)o->layout->token_budget,
                            (int)blocks, o->init_seed);
    if (!t->m) {
        snprintf(err, errlen, "cannot create the drafter (see the log above)");
        goto fail;
    }
    if (t->tc.total_steps == 0 && o->max_steps > 0) t->tc.total_steps = o->max_steps;
    if (!resume_dir[0]) {
        char total_src[64], max_src[64];
        snprintf(total_src, sizeof total_src, "--total-steps %ld", t->tc.total_steps);
        snprintf(max_src, sizeof max_src, "--max-steps %ld", (long)t->max_steps);
        if (trainer_schedule_check(&t->tc, t->max_steps, total_src, max_src, err, errlen) < 0)
            goto fail;
    }
    if (restore(t, o, resume_dir, err, errlen) < 0) goto fail;
    if (t->tc.total_steps == 0)
        LOG_WARN("no --total-steps or --max-steps: the learning rate stays at %g from the first "
                 "step, with neither the recipe's warmup nor its cosine decay (both are "
                 "fractions of the schedule's length)",
                 t->tc.lr);
    else if (t->max_steps == 0)
        LOG_INFO("no --max-steps: the run stops at step %ld, the end of its schedule (the "
                 "learning rate would stay at %g after it)",
                 t->tc.total_steps, t->tc.lr * t->tc.min_lr_ratio);
    if (!t->ckpt_root[0])
        LOG_WARN("no --checkpoint-dir: the trained drafter is saved nowhere, and a restart "
                 "starts over");
    if (t->backend == POOL_CUDA) {
        size_t feat = (size_t)t->layout.token_budget * t->layout.n_layers * t->layout.hidden *
                      t->ops->act_bytes;
        t->host = t->ops->host_alloc(t->nn, t->layout.off_hidden);
        t->feat = t->ops->alloc(t->nn, feat);
        if (!t->host || !t->feat) {
            snprintf(err, errlen, "cannot allocate the step's feature copy (%zu bytes)", feat);
            goto fail;
        }
    }
    if (t->backend == POOL_CUDA && o->tune_matmuls > 1) {
        double t0 = monotime_s();
        if (dflash_model_tune(t->m, o->tune_matmuls) < 0) {
            snprintf(err, errlen, "cannot run the start-up matmul tuning (out of device memory?)");
            goto fail;
        }
        LOG_INFO("drafter: matmuls of a %u-token, %ld-block step tuned (%d candidates each) in "
                 "%.1f s", o->layout->token_budget, blocks, o->tune_matmuls, monotime_s() - t0);
    }
    if (dflash_train_plan(t->m, &t->tc) < 0) {
        snprintf(err, errlen, "out of memory for the step metrics or the gradient accumulator "
                 "(%d batches a step: 4 bytes a parameter, %.1f MiB)", t->tc.accumulate,
                 t->m->n_params * 4.0 / (1 << 20));
        goto fail;
    }
    if (t->tc.accumulate > 1)
        LOG_INFO("gradient accumulation: %d slots (batches) a step, their gradients summed in "
                 "fp32 (%.1f MiB) and the loss normalised over all of them", t->tc.accumulate,
                 t->m->n_params * 4.0 / (1 << 20));
    if ((o->metrics_dir && o->metrics_dir[0]) || o->progress) {
        metrics_opts mo = metrics_opts_default();
        mo.dir = o->metrics_dir && o->metrics_dir[0] ? o->metrics_dir : NULL;
        mo.jsonl = mo.tensorboard = mo.dir != NULL;
        mo.progress = o->progress;
        mo.total_steps = step_limit(t);
        t->met = metrics_new(&mo);
        if (!t->met) {
            snprintf(err, errlen, "cannot write metrics to %s", o->metrics_dir);
            goto fail;
        }
    }
    char ids[DFLASH_MAX_FEAT * 6];
    target_layer_ids_text(dc.target_layer_ids, dc.n_feat, ids, sizeof ids);
    LOG_INFO("drafter: %d layers, block %d, %d features from target layers %s, mask token "
             "%d, %zu parameters, planned for %u tokens and %ld blocks; anchors %d, lr %g, "
             "schedule %ld steps, start step %ld",
             dc.num_layers, dc.block_size, dc.n_feat, ids, dc.mask_token_id, t->m->n_params,
             o->layout->token_budget, blocks, t->tc.n_anchors, t->tc.lr, t->tc.total_steps,
             t->m->step);
    *c = (worker_consumer){.name = "train",
                           .ctx = t,
                           .consume = train_consume,
                           .committed = train_committed,
                           .destroy = train_destroy,
                           .resume_step = train_resume_step,
                           .run_id = train_run_id,
                           .layout = train_layout,
                           .done = train_done,
                           .done_at = train_done_at,
                           .settled = train_settled,
                           .set_barrier = train_set_barrier,
                           .finish = train_finish,
                           .save_refused = train_save_refused,
                           .unacked = train_unacked,
                           .resumed_unacked = train_resumed_unacked,
                           .idle = train_idle,
                           .set_group = train_set_group,
                           .sync_state = train_sync_state,
                           .model_step = train_model_step,
                           .state_hash = train_state_hash,
                           .shape = train_shape,
                           .accumulate = train_accumulate,
                           .close_step = train_close_group};
    return c;
fail:
    train_destroy(t);
    free(c);
    return NULL;
}

/* ------------------------------------------------------------------------------ evaluation */

/* One evaluation as its progress line and its stop see it: what is done, and where the sequence
 * in hand is. Its forward ticks (eval_tick) after each target layer and each chunk of drafted
 * blocks, so a line comes every interval and a stop is heard within a layer or a chunk, however
 * long one sequence takes. */
typedef struct eval_run {
    progress prog;
    volatile sig_atomic_t *stop; /* may be NULL */
    uint64_t n, done;             /* sequences to evaluate; done (walked or skipped) */
    uint64_t tokens, tokens_done; /* the n sequences' tokens; the done ones' */
    uint32_t len;                 /* tokens of the sequence in hand (0: between sequences) */
    const char *phase;            /* its forward: "target layer" or "drafting block chunk" */
    bool drafting;                /* the second phase */
    int step, steps;              /* of that phase */
    double phase_t0;              /* monotime_s() at its start */
    double cur_s[2];              /* seconds in each phase of the sequence in hand */
    double phase_s[2];            /* seconds in each phase over the sequences done */
    const dflash_tau *acc;
} eval_run;

static bool eval_stopped(const eval_run *r) {
    return r->stop && *r->stop;
}

/* "37s", "12min", "3.5h": an ETA a reader takes in at a glance. */
static void eta_text(double s, char *buf, size_t len) {
    if (s < 120) snprintf(buf, len, "%.0fs", s);
    else if (s < 7200) snprintf(buf, len, "%.0fmin", s / 60);
    else snprintf(buf, len, "%.1fh", s / 3600);
}

/* The progress line, when one is due: sequences and tokens done, the sequence in hand and its
 * phase, tau so far and the ETA by tokens: the done sequences', and the share of the one in
 * hand that its phases have done, each phase weighed by its share of the time so far (half each
 * until a sequence is done). */
static void eval_progress(eval_run *r) {
    if (!progress_due(&r->prog)) return;
    double both = r->phase_s[0] + r->phase_s[1];
    double w = both > 0 ? r->phase_s[0] / both : 0.5; /* the target's share of a sequence */
    double part = !r->len || !r->steps ? 0
                  : r->drafting        ? w + (1 - w) * r->step / r->steps
                                       : w * r->step / r->steps;
    double done = (double)r->tokens_done + part * r->len;
    char eta[32] = "?", where[96] = "";
    if (done > 0) eta_text(progress_elapsed(&r->prog) * ((double)r->tokens - done) / done, eta,
                           sizeof eta);
    if (r->len && r->steps)
        snprintf(where, sizeof where, ", in sequence %llu (%u tokens): %s %d/%d",
                 (unsigned long long)r->done + 1, r->len, r->phase, r->step, r->steps);
    char tau[32] = "-";
    if (r->acc->cycles) snprintf(tau, sizeof tau, "%.3f", dflash_tau_value(r->acc));
    progress_printf(&r->prog, "eval %llu/%llu held-out sequences (%llu/%llu tokens)%s, %ld draft "
                    "cycles, tau so far %s, ETA %s", (unsigned long long)r->done,
                    (unsigned long long)r->n, (unsigned long long)r->tokens_done,
                    (unsigned long long)r->tokens, where, r->acc->cycles, tau, eta);
}

/* target_model_opts.after_layer and dflash_eval_tau's after_chunk: a line when due; non-zero
 * (abandon the forward) once a stop was asked for. */
static int eval_tick(void *user, int step, int steps) {
    eval_run *r = user;
    r->step = step;
    r->steps = steps;
    eval_progress(r);
    return eval_stopped(r);
}

/* Enters a phase of the sequence in hand of len tokens: its target forward, or (drafting) the
 * drafting of its blocks; len 0: between sequences. The time of the phase left is counted, and
 * a sequence's once it was drafted. */
static void eval_phase(eval_run *r, uint32_t len, bool drafting) {
    double now = monotime_s();
    if (r->len) r->cur_s[r->drafting] += now - r->phase_t0;
    if (!drafting && r->cur_s[1] > 0) { /* the sequence in hand was drafted: done */
        r->phase_s[0] += r->cur_s[0];
        r->phase_s[1] += r->cur_s[1];
    }
    if (!drafting) r->cur_s[0] = r->cur_s[1] = 0;
    r->len = len;
    r->drafting = drafting;
    r->phase = drafting ? "drafting block chunk" : "target layer";
    r->phase_t0 = now;
    r->step = r->steps = 0;
}

int trainer_eval(const trainer_eval_opts *o, trainer_eval_result *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    double t0 = monotime_s();
    int rc = 0;
    dflash_config dc;
    char dir[1200] = "";
    if (o->checkpoint && o->checkpoint[0]) {
        snprintf(dir, sizeof dir, "%s", o->checkpoint);
        if (!has_config(dir) && dflash_ckpt_latest(o->checkpoint, dir, sizeof dir) < 0) {
            snprintf(err, errlen, "--checkpoint %s: no checkpoint there", o->checkpoint);
            return DFLASH_ENOTFOUND;
        }
        if ((rc = dflash_ckpt_load_config(dir, &dc, err, errlen)) < 0) return rc;
    } else if ((rc = trainer_drafter_config(o->model_dir, o->draft_layers, o->block_size,
                                            o->mask_token_id, o->n_feat, o->capture_ids,
                                            o->n_capture_ids, &dc, err, errlen)) < 0) {
        return rc;
    }
    shard_set *set = shard_set_open_list(o->data, err, errlen);
    if (!set) return DFLASH_EIO;
    dflash_tau acc;
    memset(&acc, 0, sizeof acc);
    eval_run run = {.stop = o->stop, .n = shard_set_count(set), .acc = &acc};
    if (o->eval_seqs > 0 && (uint64_t)o->eval_seqs < run.n) run.n = (uint64_t)o->eval_seqs;
    out->total = (long)run.n;
    uint32_t max_len = 1;
    for (uint64_t i = 0; i < run.n; i++) {
        uint32_t len = shard_set_len(set, i);
        run.tokens += len;
        if (len > max_len) max_len = len;
    }

    const nn_ops *ops = nn_cpu_ops();
    nn_ctx *nn = nn_cpu_new(o->threads);
    target_model *tm = NULL;
    dflash_model *m = NULL;
    float *hidden = NULL;
    int32_t *pos = NULL;
    if (!nn) {
        snprintf(err, errlen, "cannot create the cpu compute context");
        rc = DFLASH_ENOMEM;
        goto out;
    }
    /* the drafter against the target's config.json first: a checkpoint of another target is a
     * mismatch (exit 2), not a load failure */
    model_config tc;
    if ((rc = hf_config_load(o->model_dir, &tc, err, errlen)) < 0 ||
        (rc = dflash_config_check_target(&dc, &tc, dc.target_layer_ids, dc.n_feat, err,
                                         errlen)) < 0)
        goto out;
    /* held-out data of another tokenizer: its recorded vocabulary tells (a mismatch, exit 2) */
    if ((rc = shard_set_check_vocab(set, (uint32_t)tc.vocab_size, err, errlen)) < 0) goto out;
    target_model_opts to = {.layer_ids = dc.target_layer_ids,
                            .n_layer_ids = dc.n_feat,
                            .max_tokens = (int)max_len,
                            .max_seqs = 1,
                            .stop = o->stop, /* a large target loads for minutes */
                            .after_layer = eval_tick,
                            .after_layer_user = &run};
    tm = target_model_load(o->model_dir, &to, ops, nn);
    if (!tm) {
        rc = eval_stopped(&run) ? DFLASH_ESHUTDOWN : DFLASH_EIO;
        snprintf(err, errlen, "%s the target %s%s", rc == DFLASH_ESHUTDOWN ? "stopped loading" :
                 "cannot load", o->model_dir, rc == DFLASH_ESHUTDOWN ? "" : " (see the log above)");
        goto out;
    }
    m = dflash_model_new(&dc, ops, nn, target_model_embed_tokens(tm), target_model_lm_head(tm),
                         (int)max_len, 256, o->init_seed);
    if (!m) {
        snprintf(err, errlen, "cannot create the drafter (see the log above)");
        rc = DFLASH_ENOMEM;
        goto out;
    }
    if (dir[0] && (rc = dflash_ckpt_load_weights(m, dir, err, errlen)) < 0) goto out;
    size_t ld = (size_t)dc.n_feat * (size_t)dc.hidden_size;
    hidden = ops->alloc(nn, (size_t)max_len * ld * sizeof(float));
    pos = malloc(max_len * sizeof *pos);
    if (!hidden || !pos) {
        snprintf(err, errlen, "out of memory");
        rc = DFLASH_ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < max_len; i++)
        pos[i] = (int32_t)i;
    /* a line every 10 s (0.2 s on a terminal), as the training's, or every o->progress_s */
    progress_start_every(&run.prog, stderr, o->progress_s);
    for (; run.done < run.n && !eval_stopped(&run); run.done++) {
        eval_phase(&run, 0, false);
        eval_progress(&run);
        uint64_t i = run.done;
        shard_seq s;
        if ((rc = shard_set_get(set, i, &s)) < 0) {
            snprintf(err, errlen, "cannot read held-out sequence %llu of %s: %s",
                     (unsigned long long)i, o->data, err_str(rc));
            goto out;
        }
        if (s.len < 2) {
            out->skipped++;
            run.tokens_done += s.len;
            continue;
        }
        int32_t off[2] = {0, (int32_t)s.len};
        eval_phase(&run, s.len, false);
        rc = target_forward_host(tm, s.ids, pos, off, 1, (int)s.len, (nn_buf *)hidden, ld);
        if (rc == DFLASH_ESHUTDOWN) break;
        if (rc < 0) {
            snprintf(err, errlen, "target forward of held-out sequence %llu: %s",
                     (unsigned long long)i, err_str(rc));
            goto out;
        }
        dflash_batch_view v = {.n_seqs = 1,
                               .seq_off = off,
                               .ids = s.ids,
                               .positions = NULL,
                               .loss_mask = s.mask,
                               .hidden = (const nn_buf *)hidden,
                               .ld = ld};
        long cycles0 = acc.cycles;
        eval_phase(&run, s.len, true);
        rc = dflash_eval_tau(m, &v, &acc, eval_tick, &run);
        if (rc == DFLASH_ESHUTDOWN) break;
        if (rc < 0) {
            snprintf(err, errlen, "tau of held-out sequence %llu: %s", (unsigned long long)i,
                     err_str(rc));
            goto out;
        }
        if (acc.cycles > cycles0)
            out->sequences++;
        else
            out->skipped++;
        run.tokens_done += s.len;
    }
    out->tau = dflash_tau_value(&acc);
    out->tau_pooled = dflash_tau_pooled(&acc);
    out->responses = acc.responses;
    out->cycles = acc.cycles;
    out->block_size = dc.block_size;
    out->seconds = monotime_s() - t0;
    if (run.done < run.n) { /* stopped: what was measured so far, which the caller marks partial */
        snprintf(err, errlen, "stopped after %llu of %llu held-out sequences",
                 (unsigned long long)run.done, (unsigned long long)run.n);
        rc = DFLASH_ESHUTDOWN;
        goto out;
    }
    if (acc.cycles == 0) { /* tau = mean(a + 1) over no cycle: undefined, not 0 */
        snprintf(err, errlen,
                 "no draft cycle in %llu held-out sequences of %s: none has a loss-masked "
                 "(response) token followed by another, so tau is undefined",
                 (unsigned long long)run.n, o->data);
        rc = DFLASH_EINVAL;
        goto out;
    }
    rc = 0;
out:
    progress_end(&run.prog);
    free(pos);
    if (hidden) ops->free(nn, hidden);
    dflash_model_destroy(&m);
    target_model_destroy(&tm);
    if (nn) nn_cpu_destroy(&nn);
    shard_set_close(&set);
    return rc;
}
