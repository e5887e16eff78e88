/* test_dp_train: the data-parallel DFlash step (dflash_dp.h) on the cpu backend, with ranks as
 * forked processes joined by the shm collective, on a tiny drafter (D 16, 2 layers, B 4) and
 * random packed batches (2-3 sequences of 5-9 tokens) that differ per rank and per step.
 *   (a) two ranks train 8 steps on different batches: after every step their trainable state
 *       (master weights, AdamW m and v, step) hashes the same; at the end the full buffers are
 *       compared bit for bit;
 *   (b) the group's loss trajectory and final weights match a single-process reference that
 *       accumulates the same global objective: grads(A) * W_A/W + grads(B) * W_B/W, then one
 *       apply (tolerance 1e-6 relative, measured: identical); and the group loss is shown to
 *       differ from the mean of the per-rank losses (the normalisation the test guards);
 *   (c) dflash_dp_sync_state: rank 1 starts from other weights, moments, step and training
 *       settings (lr, schedule, clip); afterwards it holds rank 0's state bit for bit and its
 *       settings, and a DP step keeps the two equal; a drafter of another shape than rank 0's
 *       is refused: that rank gets DFLASH_EMISMATCH, rank 0 (the model of record) DFLASH_EAGAIN,
 *       nothing is copied and the group still works; with three ranks, rank 1 of another shape
 *       gets DFLASH_EMISMATCH and both rank 0 and rank 2 DFLASH_EAGAIN (no rank but the odd one
 *       is told its drafter differs);
 *   (d) a rank whose batch has no anchors (stale gradients left in its buffer) joins with zero
 *       gradients: the group step equals dflash_train_step on the other rank's batch alone; when
 *       no rank has a weighted position every rank skips (no update, step unchanged); a rank
 *       with a malformed batch gets its error, the others DFLASH_EAGAIN, and nothing changes;
 *   (e) a group of one equals dflash_train_step bit for bit, and comm NULL is dflash_train_step;
 *   (f) the layout a group joiner states to the broker (dflash_dp_layout_hash, _text): the same
 *       for two drafters of one shape with other weights, another for another shape.
 *   (g) gradient accumulation in a group (dflash_dp_micro / dflash_dp_close): 2 ranks x 2
 *       micro-steps give the update of one solo step accumulating the same 4 batches
 *       (dflash_train_step with accumulate 4): loss, gradient norm, weights and moments within
 *       1e-5 relative, step after step; a last step closed after 1 micro-step (the broker's end
 *       inside a step) equals a solo step flushed with the same 2 batches; the ranks stay bit
 *       identical; a micro-step discarded before (dflash_train_discard: a step abandoned when the
 *       group re-forms) leaves nothing in the update.
 * Results travel to the parent through a MAP_SHARED page set up before fork. Every child runs
 * under alarm(); no /dev/shm segment is left behind.
 */
#include "check.h"
#include "collective.h"
#include "dflash_dp.h"
#include "dflash_model.h"
#include "dflash_train.h"
#include "err.h"
#include "ops.h"
#include "rng.h"
#include "test_ranks.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { D = 16, NF = 2, V = 11, MAXT = 27, MAXB = 16, NSTEP = 8, MAXP = 16384 };
#define CLIP 3.0 /* gradient clip: (a) has norms of 2-3.7, so some steps clip, some do not */

/* ---------------------------------------------------------------------------------------------
 * the tiny world */

static double unif(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0 * 2 - 1; }

typedef struct tiny {
    const nn_ops *ops;
    nn_ctx *ctx;
    dflash_config cfg;
    float embed[V * D], lm_head[V * D];
    dflash_train_cfg tc;
} tiny;

static void tiny_init(tiny *w, int layers) {
    memset(w, 0, sizeof *w);
    w->ops = nn_cpu_ops();
    w->ctx = nn_cpu_new(1);
    dflash_config *c = &w->cfg;
    *c = (dflash_config){.hidden_size = D, .num_layers = layers, .num_heads = 2,
                         .num_kv_heads = 1, .head_dim = 8, .intermediate_size = 24,
                         .block_size = 4, .n_feat = NF, .target_layer_ids = {1, 3},
                         .num_target_layers = 6, .mask_token_id = V - 1, .vocab_size = V,
                         .max_position_embeddings = 128, .rms_norm_eps = 1e-6,
                         .rope_theta = 10000.0, .bos_token_id = -1, .eos_token_id = -1};
    uint64_t s = 42;
    for (int i = 0; i < V * D; i++)
        w->embed[i] = (float)(0.7 * unif(&s)), w->lm_head[i] = (float)(0.7 * unif(&s));
    dflash_train_cfg_default(&w->tc);
    w->tc.n_anchors = 3;
    w->tc.lr = 1e-2;
    w->tc.clip = CLIP;
}

/* A failed creation is a failed check (the callers then return early). */
static dflash_model *tiny_model(tiny *w, uint64_t seed) {
    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, MAXT, MAXB,
                                       seed);
    CHECK(m != NULL);
    return m;
}

static void tiny_free(tiny *w) { nn_cpu_destroy(&w->ctx); }

typedef struct batch {
    int32_t seq_off[4], ids[MAXT];
    uint8_t mask[MAXT];
    float hidden[MAXT * NF * D];
    dflash_batch_view view;
} batch;

/* The batch of (rank, step): 2-3 sequences of 5-9 tokens, a 1-2 token prompt, one random hole
 * in the loss mask. empty: loss mask all 0 (no anchor candidates). */
static void make_batch(batch *b, int rank, int step, bool empty) {
    uint64_t s = 1000003ull * (uint64_t)(rank + 1) + (uint64_t)step * 7919u;
    int n = 2 + (int)(rng_next(&s) % 2), t = 0;
    b->seq_off[0] = 0;
    for (int q = 0; q < n; q++) {
        int len = 5 + (int)(rng_next(&s) % 5), prompt = 1 + (int)(rng_next(&s) % 2);
        int hole = prompt + 1 + (int)(rng_next(&s) % (uint64_t)(len - prompt - 1));
        for (int i = 0; i < len; i++, t++) {
            b->ids[t] = (int32_t)(rng_next(&s) % (V - 1));
            b->mask[t] = !empty && i >= prompt && i != hole;
        }
        b->seq_off[q + 1] = t;
    }
    for (int i = 0; i < t * NF * D; i++)
        b->hidden[i] = (float)unif(&s);
    b->view = (dflash_batch_view){.n_seqs = n, .seq_off = b->seq_off, .ids = b->ids,
                                  .positions = NULL, .loss_mask = b->mask, .hidden = b->hidden,
                                  .ld = NF * D};
}

static uint64_t key_of(int rank, int step) { return (uint64_t)step << 8 | (uint64_t)rank; }

/* ---------------------------------------------------------------------------------------------
 * processes and their results */

typedef struct result {
    double loss[NSTEP], local_loss[NSTEP], local_w[NSTEP], gnorm[NSTEP];
    uint64_t hash[NSTEP], pre_hash;
    int skipped[NSTEP];
    long step;
    size_t n_params;
    float master[MAXP], adam_m[MAXP], adam_v[MAXP];
} result;

static result *R; /* [4], MAP_SHARED */
static uint8_t group_id[DP_COMM_ID_BYTES], solo_id[DP_COMM_ID_BYTES]; /* made by the parent */

static void save_state(result *r, const dflash_model *m) {
    r->n_params = m->n_params;
    r->step = m->step;
    if (m->n_params > MAXP) return;
    memcpy(r->master, m->master, m->n_params * sizeof(float));
    memcpy(r->adam_m, m->adam_m, m->n_params * sizeof(float));
    memcpy(r->adam_v, m->adam_v, m->n_params * sizeof(float));
}

static dp_comm *join(int rank, int world) {
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open(DP_COMM_SHM, group_id, rank, world, -1, 20.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "rank %d: %s\n", rank, err);
    return c;
}

typedef void (*proc_fn)(int idx);

/* Process idx of the proc_fn arg points to (test_ranks_fork's child). */
static void proc_main(int idx, void *arg) { (*(proc_fn *)arg)(idx); }

/* Forks n processes running fn(i) with R[i] cleared; returns how many failed. */
static int run_procs(int n, proc_fn fn) {
    memset(R, 0, 4 * sizeof *R);
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, group_id, NULL, 0), 0);
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, solo_id, NULL, 0), 0);
    pid_t pids[4];
    test_ranks_fork(n, proc_main, &fn, 60, pids);
    return test_ranks_wait(n, pids, -1, "process");
}

/* ---------------------------------------------------------------------------------------------
 * (a), (b): two ranks against the accumulated single-process reference */

static void ab_rank(int rank) {
    tiny w;
    tiny_init(&w, 2);
    dflash_model *m = tiny_model(&w, 7);
    dp_comm *c = join(rank, 2);
    if (!m || !c) return;
    CHECK_EQ_INT(dflash_train_prepare(m), 0);
    long allocs0 = w.ops->allocs(w.ctx); /* a group step allocates nothing (the daemon counts) */
    batch b;
    for (int s = 0; s < NSTEP; s++) {
        make_batch(&b, rank, s, false);
        dflash_metrics met, loc;
        CHECK_EQ_INT(dflash_train_step_dp_ex(m, &w.tc, &b.view, 0, key_of(rank, s), c, &met, &loc), 0);
        CHECK(!met.skipped);
        CHECK_EQ_INT(met.step, s + 1);
        R[rank].loss[s] = met.loss;
        R[rank].local_loss[s] = loc.loss;
        R[rank].local_w[s] = loc.weight_sum;
        R[rank].gnorm[s] = met.grad_norm;
        R[rank].hash[s] = dflash_dp_state_hash(m);
        /* the group's weight sum is the sum of the local ones */
        double wsum = loc.weight_sum;
        CHECK_EQ_INT(dp_comm_allreduce_host_f64(c, &wsum, 1), 0);
        CHECK(wsum == met.weight_sum);
    }
    CHECK_EQ_INT(w.ops->allocs(w.ctx) - allocs0, 0);
    save_state(&R[rank], m);
    dp_comm_close(&c);
    dflash_model_destroy(&m);
    tiny_free(&w);
}

/* The same objective in one process: grads of A scaled by W_A/W plus grads of B by W_B/W. */
static void ab_reference(int idx) {
    tiny w;
    tiny_init(&w, 2);
    dflash_model *m = tiny_model(&w, 7);
    if (!m) return;
    size_t n = m->n_params;
    float *acc = malloc(n * sizeof(float)), *g[2] = {malloc(n * sizeof(float)),
                                                     malloc(n * sizeof(float))};
    batch b;
    for (int s = 0; s < NSTEP; s++) {
        dflash_metrics met[2];
        for (int r = 0; r < 2; r++) {
            make_batch(&b, r, s, false);
            int nb = dflash_train_sample_anchors(m, &w.tc, &b.view, 0, key_of(r, s));
            CHECK(nb > 0);
            CHECK_EQ_INT(dflash_train_grads(m, &w.tc, &b.view, nb, m->h_blk_seq, m->h_blk_anchor,
                                            &met[r]), 0);
            memcpy(g[r], m->grads, n * sizeof(float)); /* cpu: one fp32 array (act fp32) */
        }
        double W = met[0].weight_sum + met[1].weight_sum;
        for (int r = 0; r < 2; r++) {
            float sc = (float)(met[r].weight_sum / W);
            for (size_t j = 0; j < n; j++)
                acc[j] = r == 0 ? g[r][j] * sc : acc[j] + g[r][j] * sc;
        }
        memcpy(m->grads, acc, n * sizeof(float));
        dflash_metrics out;
        memset(&out, 0, sizeof out);
        dflash_train_apply(m, &w.tc, &out);
        R[idx].gnorm[s] = out.grad_norm;
        R[idx].loss[s] = (met[0].loss * met[0].weight_sum + met[1].loss * met[1].weight_sum) / W;
        R[idx].hash[s] = dflash_dp_state_hash(m);
    }
    save_state(&R[idx], m);
    free(acc), free(g[0]), free(g[1]);
    dflash_model_destroy(&m);
    tiny_free(&w);
}

static void ab_proc(int i) {
    if (i < 2) ab_rank(i);
    else ab_reference(i);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t j = 0; j < n; j++) {
        double d = fabs((double)a[j] - b[j]) / fmax(fabs((double)b[j]), 1e-6);
        if (d > worst) worst = d;
    }
    return worst;
}

static void test_group_vs_reference(void) {
    CHECK_EQ_INT(run_procs(3, ab_proc), 0);
    const result *r0 = &R[0], *r1 = &R[1], *ref = &R[2];
    int same = 0;
    for (int s = 0; s < NSTEP; s++)
        same += r0->hash[s] == r1->hash[s] && r0->loss[s] == r1->loss[s];
    CHECK_EQ_INT(same, NSTEP);
    CHECK_EQ_INT(r0->step, NSTEP);
    CHECK_EQ_INT(r1->step, NSTEP);
    size_t n = r0->n_params;
    CHECK(n > 0 && n <= MAXP && r1->n_params == n && ref->n_params == n);
    if (!(n > 0 && n <= MAXP)) return;
    CHECK(memcmp(r0->master, r1->master, n * sizeof(float)) == 0);
    CHECK(memcmp(r0->adam_m, r1->adam_m, n * sizeof(float)) == 0);
    CHECK(memcmp(r0->adam_v, r1->adam_v, n * sizeof(float)) == 0);
    /* (b) */
    double worst_loss = 0, worst_mm = 0;
    for (int s = 0; s < NSTEP; s++) {
        worst_loss = fmax(worst_loss, fabs(r0->loss[s] - ref->loss[s]) / ref->loss[s]);
        double mean_of_means = 0.5 * (r0->local_loss[s] + r1->local_loss[s]);
        worst_mm = fmax(worst_mm, fabs(mean_of_means - r0->loss[s]) / r0->loss[s]);
    }
    double worst_w = max_rel(r0->master, ref->master, n);
    double worst_m = max_rel(r0->adam_m, ref->adam_m, n);
    int same_hash = 0, clipped = 0;
    for (int s = 0; s < NSTEP; s++) {
        same_hash += r0->hash[s] == ref->hash[s];
        clipped += r0->gnorm[s] > CLIP;
        CHECK_NEAR(r0->gnorm[s], ref->gnorm[s], 1e-6 * ref->gnorm[s]);
    }
    printf("(a,b) 2 ranks x %d steps: loss %.5f -> %.5f; vs the accumulated reference: loss max "
           "rel diff %.3g, weights %.3g, adam m %.3g, %d of %d step hashes identical; mean of "
           "per-rank losses is off by up to %.3g; %d of %d steps clipped\n",
           NSTEP, r0->loss[0], r0->loss[NSTEP - 1], worst_loss, worst_w, worst_m, same_hash,
           NSTEP, worst_mm, clipped, NSTEP);
    /* both paths of the group clipping are taken */
    CHECK(clipped > 0 && clipped < NSTEP);
    CHECK(worst_loss <= 1e-6);
    CHECK(worst_w <= 1e-6);
    CHECK(worst_m <= 1e-6);
    /* the local weight sums differ, so the two normalisations really differ */
    CHECK(worst_mm > 1e-4);
    CHECK(r0->local_w[0] != r1->local_w[0]);
}

/* ---------------------------------------------------------------------------------------------
 * (g) accumulation: 2 ranks x 2 micro-steps against one solo step of the same 4 batches */

enum { GSTEP = 4, GMICRO = 2 };

/* The batch of rank r's micro-step k in step s, and its key. */
static void g_batch(batch *b, int r, int k, int s) { make_batch(b, r * GMICRO + k, 100 + s, false); }
static uint64_t g_key(int r, int k, int s) { return key_of(r * GMICRO + k, 100 + s); }
/* The last step closes after 1 micro-step. */
static int g_micros(int s) { return s == GSTEP - 1 ? 1 : GMICRO; }

static void g_rank(int rank) {
    tiny w;
    tiny_init(&w, 2);
    w.tc.accumulate = GMICRO;
    dflash_model *m = tiny_model(&w, 7);
    dp_comm *c = join(rank, 2);
    if (!m || !c) return;
    CHECK_EQ_INT(dflash_train_plan(m, &w.tc), 0);
    long allocs0 = w.ops->allocs(w.ctx);
    batch b;
    /* a step abandoned after a micro-step (the group re-forms) leaves nothing behind */
    dflash_metrics loc0;
    g_batch(&b, rank, 0, 50);
    CHECK_EQ_INT(dflash_dp_micro(m, &w.tc, &b.view, 0, g_key(rank, 0, 50), &loc0), 0);
    CHECK_EQ_INT(dflash_train_open(m), 1);
    dflash_train_discard(m);
    CHECK_EQ_INT(dflash_train_open(m), 0);
    for (int s = 0; s < GSTEP; s++) {
        dflash_metrics met, loc;
        for (int k = 0; k < g_micros(s); k++) {
            g_batch(&b, rank, k, s);
            CHECK_EQ_INT(dflash_dp_micro(m, &w.tc, &b.view, 0, g_key(rank, k, s), &loc), 0);
            CHECK(loc.open && loc.weight_sum > 0);
        }
        CHECK_EQ_INT(dflash_train_open(m), g_micros(s));
        CHECK_EQ_INT(dflash_dp_close(m, &w.tc, c, 0, &met, &loc), 0);
        CHECK_EQ_INT(dflash_train_open(m), 0);
        CHECK(!met.skipped && met.batches == g_micros(s));
        CHECK_EQ_INT(met.step, s + 1);
        R[rank].loss[s] = met.loss;
        R[rank].gnorm[s] = met.grad_norm;
        R[rank].hash[s] = dflash_dp_state_hash(m);
    }
    CHECK_EQ_INT(w.ops->allocs(w.ctx) - allocs0, 0);
    save_state(&R[rank], m);
    dp_comm_close(&c);
    dflash_model_destroy(&m);
    tiny_free(&w);
}

/* One process, accumulate 4: the step's batches in the ranks' order; the last one flushed. */
static void g_reference(int idx) {
    tiny w;
    tiny_init(&w, 2);
    w.tc.accumulate = 2 * GMICRO;
    dflash_model *m = tiny_model(&w, 7);
    if (!m) return;
    batch b;
    for (int s = 0; s < GSTEP; s++) {
        dflash_metrics met;
        memset(&met, 0, sizeof met);
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < g_micros(s); k++) {
                g_batch(&b, r, k, s);
                CHECK_EQ_INT(dflash_train_step(m, &w.tc, &b.view, 0, g_key(r, k, s), &met), 0);
            }
        if (met.open) { /* fewer than 4 batches: closed as a run's last step */
            CHECK_EQ_INT(dflash_train_flush_async(m, &w.tc), 1);
            CHECK_EQ_INT(dflash_train_collect(m, &met), 1);
        }
        CHECK(!met.open && !met.skipped && met.batches == 2 * g_micros(s));
        R[idx].loss[s] = met.loss;
        R[idx].gnorm[s] = met.grad_norm;
    }
    save_state(&R[idx], m);
    dflash_model_destroy(&m);
    tiny_free(&w);
}

static void g_proc(int i) {
    if (i < 2) g_rank(i);
    else g_reference(i);
}

/* ||a - b|| / ||b||: the summation order of the gradients differs (per rank, then over ranks),
 * so an element whose terms cancel may differ much relative to itself (AdamW then amplifies
 * it: m / sqrt(v) of a tiny gradient), not relative to the whole tensor. */
static double norm_rel(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t j = 0; j < n; j++) {
        d += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
        r += (double)b[j] * b[j];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static void test_group_accumulate(void) {
    CHECK_EQ_INT(run_procs(3, g_proc), 0);
    const result *r0 = &R[0], *r1 = &R[1], *ref = &R[2];
    size_t n = r0->n_params;
    CHECK(n > 0 && n <= MAXP && r1->n_params == n && ref->n_params == n);
    if (!(n > 0 && n <= MAXP)) return;
    CHECK(memcmp(r0->master, r1->master, n * sizeof(float)) == 0);
    CHECK(memcmp(r0->adam_v, r1->adam_v, n * sizeof(float)) == 0);
    CHECK_EQ_INT(r0->step, GSTEP);
    CHECK_EQ_INT(ref->step, GSTEP);
    double worst_loss = 0, worst_norm = 0;
    for (int s = 0; s < GSTEP; s++) {
        CHECK(r0->hash[s] == r1->hash[s]);
        worst_loss = fmax(worst_loss, fabs(r0->loss[s] - ref->loss[s]) / ref->loss[s]);
        worst_norm = fmax(worst_norm, fabs(r0->gnorm[s] - ref->gnorm[s]) / ref->gnorm[s]);
    }
    double worst_w = norm_rel(r0->master, ref->master, n);
    double worst_m = norm_rel(r0->adam_m, ref->adam_m, n);
    double worst_v = norm_rel(r0->adam_v, ref->adam_v, n);
    printf("(g) 2 ranks x 2 micro-steps x %d steps (the last 1 micro-step) vs one solo step of "
           "the same batches: loss %.5f -> %.5f, max rel diff loss %.3g, grad norm %.3g; "
           "||diff|| / ||ref|| weights %.3g, adam m %.3g, v %.3g (element-wise max: weights "
           "%.3g)\n", GSTEP, ref->loss[0], ref->loss[GSTEP - 1], worst_loss, worst_norm,
           worst_w, worst_m, worst_v, max_rel(r0->master, ref->master, n));
    CHECK(worst_loss <= 1e-5);
    CHECK(worst_norm <= 1e-5);
    CHECK(worst_w <= 1e-5);
    CHECK(worst_m <= 1e-5);
    CHECK(worst_v <= 1e-5);
}

/* ---------------------------------------------------------------------------------------------
 * (c) sync_state */

static void c_rank(int rank) {
    tiny w;
    tiny_init(&w, 2);
    dflash_model *m = tiny_model(&w, rank == 0 ? 7 : 99);
    if (!m) return;
    batch b;
    dflash_metrics met;
    for (int s = 0; s < 2 + rank; s++) { /* different weights, moments and step */
        make_batch(&b, rank + 2, s, false);
        CHECK_EQ_INT(dflash_train_step(m, &w.tc, &b.view, 0, key_of(rank, s), &met), 0);
    }
    R[rank].pre_hash = dflash_dp_state_hash(m);
    dp_comm *c = join(rank, 2);
    if (!c) return;
    dflash_train_cfg tc = w.tc; /* rank 1's settings differ: it takes rank 0's */
    if (rank == 1) tc.lr *= 2, tc.total_steps += 7, tc.clip = 0.5;
    /* and its MASK row (a member without a checkpoint took another default): rank 0's */
    int mask0 = m->cfg.mask_token_id;
    if (rank == 1) m->cfg.mask_token_id = mask0 - 1;
    CHECK_EQ_INT(dflash_dp_sync_state(m, &tc, c, 0), 0);
    CHECK(tc.lr == w.tc.lr && tc.total_steps == w.tc.total_steps && tc.clip == w.tc.clip);
    CHECK_EQ_INT(m->cfg.mask_token_id, mask0);
    R[rank].hash[0] = dflash_dp_state_hash(m);
    R[rank].step = m->step;
    make_batch(&b, rank, 5, false);
    CHECK_EQ_INT(dflash_train_step_dp(m, &w.tc, &b.view, 0, key_of(rank, 5), c, &met), 0);
    R[rank].hash[1] = dflash_dp_state_hash(m);
    /* rank 1's drafter has another shape: it alone is at fault; nothing copied, the group still
     * works */
    tiny w1;
    tiny_init(&w1, rank == 0 ? 2 : 1);
    dflash_model *other = tiny_model(&w1, 5);
    uint64_t before = dflash_dp_state_hash(other);
    CHECK_EQ_INT(dflash_dp_sync_state(other, NULL, c, 0),
                 rank == 0 ? DFLASH_EAGAIN : DFLASH_EMISMATCH);
    CHECK(dflash_dp_state_hash(other) == before);
    CHECK_EQ_INT(dp_comm_barrier(c), 0);
    dflash_model_destroy(&other);
    tiny_free(&w1);
    dp_comm_close(&c);
    dflash_model_destroy(&m);
    tiny_free(&w);
}

/* three ranks, rank 1 with one layer where ranks 0 and 2 have two */
static void c3_rank(int rank) {
    tiny w;
    tiny_init(&w, rank == 1 ? 1 : 2);
    dflash_model *m = tiny_model(&w, 7 + rank);
    dp_comm *c = join(rank, 3);
    if (!m || !c) return;
    uint64_t before = dflash_dp_state_hash(m);
    CHECK_EQ_INT(dflash_dp_sync_state(m, NULL, c, 0), rank == 1 ? DFLASH_EMISMATCH : DFLASH_EAGAIN);
    CHECK(dflash_dp_state_hash(m) == before); /* rank 2 took nothing from rank 0 */
    CHECK_EQ_INT(dp_comm_barrier(c), 0);
    dp_comm_close(&c);
    dflash_model_destroy(&m);
    tiny_free(&w);
}

static void test_sync_state(void) {
    CHECK_EQ_INT(run_procs(3, c3_rank), 0);
    CHECK_EQ_INT(run_procs(2, c_rank), 0);
    CHECK(R[0].pre_hash != R[1].pre_hash);
    CHECK(R[1].hash[0] == R[0].pre_hash);
    CHECK(R[0].hash[0] == R[0].pre_hash);
    CHECK_EQ_INT(R[1].step, 2);
    CHECK(R[0].hash[1] == R[1].hash[1]);
    printf("(c) sync_state: rank 1 took rank 0's state (step %ld); a DP step after it keeps them "
           "identical\n", R[1].step);
}

/* ---------------------------------------------------------------------------------------------
 * (d) empty batches, (e) a group of one */

enum { D_STEPS = 3 };

static void d_rank(int rank) {
    tiny w;
    tiny_init(&w, 2);
    dflash_model *m = tiny_model(&w, 7);
    dp_comm *c = join(rank, 2);
    if (!m || !c) return;
    batch b;
    for (int s = 0; s < D_STEPS; s++) {
        make_batch(&b, 0, s, rank == 1); /* rank 0: rank 0's batches; rank 1: no anchors */
        for (size_t j = 0; j < m->n_params; j++) /* stale gradients must not leak in */
            ((float *)m->grads)[j] = 1.0f;
        dflash_metrics met, loc;
        CHECK_EQ_INT(dflash_train_step_dp_ex(m, &w.tc, &b.view, 0, key_of(0, s), c, &met, &loc), 0);
        CHECK(!met.skipped);
        if (rank == 1) CHECK_EQ_INT(loc.n_blocks, 0);
        R[rank].loss[s] = met.loss;
    }
    save_state(&R[rank], m);
    /* rank 1's batch is malformed: it gets its own error, rank 0 DFLASH_EAGAIN, nothing is
     * applied anywhere, and the group goes on */
    uint64_t before = dflash_dp_state_hash(m);
    dflash_metrics met;
    make_batch(&b, rank, 8, false);
    dflash_batch_view bad = b.view;
    if (rank == 1) bad.n_seqs = 0;
    CHECK_EQ_INT(dflash_train_step_dp(m, &w.tc, &bad, 0, key_of(rank, 8), c, &met),
                 rank == 1 ? DFLASH_EINVAL : DFLASH_EAGAIN);
    CHECK(met.skipped);
    CHECK(dflash_dp_state_hash(m) == before);
    /* nobody has a weighted position: every rank skips the update, and the step counts (the
     * group's StepDone names it; the model stayed behind, and the group's next claim failed) */
    make_batch(&b, rank, 9, true);
    CHECK_EQ_INT(dflash_train_step_dp(m, &w.tc, &b.view, 0, key_of(rank, 9), c, &met), 0);
    CHECK(met.skipped);
    CHECK_EQ_INT(met.step, D_STEPS + 1);
    CHECK_EQ_INT(m->step, D_STEPS + 1);
    static result now; /* this process's: R[rank] holds the state before the skipped steps */
    save_state(&now, m);
    CHECK(memcmp(now.master, R[rank].master, m->n_params * sizeof(float)) == 0 &&
          memcmp(now.adam_m, R[rank].adam_m, m->n_params * sizeof(float)) == 0); /* no update */
    /* the same with micro-steps: two of them, none weighted, close as one counted step */
    for (int k = 0; k < 2; k++) {
        make_batch(&b, rank, 10 + k, true);
        dflash_metrics loc;
        CHECK_EQ_INT(dflash_dp_micro(m, &w.tc, &b.view, 0, key_of(rank, 10 + k), &loc), 0);
    }
    CHECK_EQ_INT(dflash_dp_close(m, &w.tc, c, 0, &met, NULL), 0);
    CHECK(met.skipped);
    CHECK_EQ_INT(m->step, D_STEPS + 2);
    save_state(&now, m);
    CHECK(memcmp(now.master, R[rank].master, m->n_params * sizeof(float)) == 0 &&
          memcmp(now.adam_v, R[rank].adam_v, m->n_params * sizeof(float)) == 0);
    dp_comm_close(&c);
    dflash_model_destroy(&m);
    tiny_free(&w);
}

/* rank 0's batches alone with dflash_train_step; and a group of one; and comm NULL */
static void d_reference(int idx) {
    tiny w;
    tiny_init(&w, 2);
    dflash_model *m = tiny_model(&w, 7), *m1 = tiny_model(&w, 7), *m2 = tiny_model(&w, 7);
    dp_comm *c = NULL;
    CHECK_EQ_INT(dp_comm_open(DP_COMM_SHM, solo_id, 0, 1, -1, 5.0, &c, NULL, 0), 0);
    if (!m || !m1 || !m2 || !c) return;
    batch b;
    int same = 0;
    for (int s = 0; s < D_STEPS; s++) {
        make_batch(&b, 0, s, false);
        dflash_metrics met, met1, met2;
        CHECK_EQ_INT(dflash_train_step(m, &w.tc, &b.view, 0, key_of(0, s), &met), 0);
        CHECK_EQ_INT(dflash_train_step_dp(m1, &w.tc, &b.view, 0, key_of(0, s), c, &met1), 0);
        CHECK_EQ_INT(dflash_train_step_dp(m2, &w.tc, &b.view, 0, key_of(0, s), NULL, &met2), 0);
        R[idx].loss[s] = met.loss;
        uint64_t h = dflash_dp_state_hash(m);
        /* the group loss is (L * W) / W: equal up to an ulp */
        same += h == dflash_dp_state_hash(m1) && h == dflash_dp_state_hash(m2) &&
                fabs(met.loss - met1.loss) <= 1e-12 * met.loss && met.loss == met2.loss;
    }
    CHECK_EQ_INT(same, D_STEPS);
    save_state(&R[idx], m);
    dp_comm_close(&c);
    dflash_model_destroy(&m);
    dflash_model_destroy(&m1);
    dflash_model_destroy(&m2);
    tiny_free(&w);
}

static void d_proc(int i) {
    if (i < 2) d_rank(i);
    else d_reference(i);
}

/* value-equal (a -0 gradient plus rank 1's +0 is +0, so compare values, not bits) */
static size_t n_differ(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t j = 0; j < n; j++)
        k += a[j] != b[j];
    return k;
}

static void test_empty_rank(void) {
    CHECK_EQ_INT(run_procs(3, d_proc), 0);
    size_t n = R[0].n_params;
    CHECK(n > 0 && n <= MAXP && R[1].n_params == n && R[2].n_params == n);
    if (!(n > 0 && n <= MAXP)) return;
    for (int s = 0; s < D_STEPS; s++) {
        CHECK_NEAR(R[0].loss[s], R[2].loss[s], 1e-12 * R[2].loss[s]);
        CHECK(R[1].loss[s] == R[0].loss[s]);
    }
    CHECK_EQ_INT(n_differ(R[0].master, R[2].master, n), 0);
    CHECK_EQ_INT(n_differ(R[1].master, R[2].master, n), 0);
    CHECK_EQ_INT(n_differ(R[1].adam_v, R[2].adam_v, n), 0);
    CHECK_EQ_INT(R[1].step, D_STEPS);
    printf("(d,e) a rank without anchors: the group step equals rank 0's batch alone; all empty "
           "skips; a group of one and comm NULL equal dflash_train_step\n");
}

/* What a group joiner states to the broker (dflash_dp_layout_hash and _text): the same for two
 * drafters of one shape whatever their weights, another for another shape (the one
 * dflash_dp_sync_state turns away), and words that name it, cut with "..." when too long. */
static void test_layout(void) {
    tiny w2, w1;
    tiny_init(&w2, 2);
    tiny_init(&w1, 1);
    dflash_model *a = tiny_model(&w2, 7), *b = tiny_model(&w2, 99), *c = tiny_model(&w1, 7);
    if (a && b && c) {
        CHECK(dflash_dp_state_hash(a) != dflash_dp_state_hash(b)); /* other weights */
        CHECK(dflash_dp_layout_hash(a) == dflash_dp_layout_hash(b));
        CHECK(dflash_dp_layout_hash(a) != dflash_dp_layout_hash(c));
        char t[128], cut[24];
        dflash_dp_layout_text(a, t, sizeof t);
        char want[128];
        snprintf(want, sizeof want, "2 layers, block 4, hidden %d, target layers 1,3 of 6, %zu "
                 "parameters", D, a->n_params);
        CHECK(strcmp(t, want) == 0);
        dflash_dp_layout_text(c, t, sizeof t);
        CHECK(strncmp(t, "1 layer, block 4", 16) == 0);
        dflash_dp_layout_text(a, cut, sizeof cut);
        CHECK(strlen(cut) == sizeof cut - 1 && strcmp(cut + sizeof cut - 4, "...") == 0);
    }
    dflash_model_destroy(&a);
    dflash_model_destroy(&b);
    dflash_model_destroy(&c);
    tiny_free(&w2);
    tiny_free(&w1);
}

static int shm_left(const char *prefix) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

int main(void) {
    R = mmap(NULL, 4 * sizeof *R, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (R == MAP_FAILED) return 1;
    test_group_vs_reference();
    test_group_accumulate();
    test_sync_state();
    test_empty_rank();
    test_layout();
    char prefix[64]; /* the segments of the ids this process made */
    snprintf(prefix, sizeof prefix, "dflash-dp-%ld-", (long)getpid());
    CHECK_EQ_INT(shm_left(prefix), 0);
    CHECK_DONE();
}
