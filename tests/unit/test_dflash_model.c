/* test_dflash_model: the DFlash drafter on the cpu backend, on a tiny drafter (D 16, 2 layers,
 * B 4) over a two-sequence packed batch.
 *   - whole-step gradients against finite differences, for every trainable tensor
 *   - the block mask: context strictly before the anchor, other sequences and blocks invisible,
 *     packing many blocks gives the same outputs as one block at a time
 *   - anchor sampling: candidate rule, count, order, determinism by (seed, epoch, batch)
 *   - loss weights: decay, the anchor offset and positions past the sequence end never trained
 *   - AdamW steps reduce the loss on a fixed batch; a step's accuracy and acceptance length
 *     are those of its correct flags and weights (1 + the leading run of correct offsets)
 *   - a step's update in closed form from the moments it leaves (AdamW's t, eps outside the
 *     root), weight decay on the matrices only; the cosine schedule with a floor
 *   - eval's tau: the trajectory walked reply by reply (each maximal span of loss mask 1 decoded
 *     on its own, nothing accepted past its end, the turns between never drafted), batched
 *     forwards giving what one block at a time gives
 *   - the optimizer on a side stream that lags as far as ops.h allows gives the same steps
 *   - checkpoint round trip, config.json fields, tensor names and shapes (dflash.md 2.1/2.2);
 *     a save that cannot write names the system's reason
 *   - every checkpoint has a model.safetensors.index.json naming exactly model.safetensors's
 *     tensors with their data bytes (what SGLang and vLLM go by to leave the training state
 *     unread); one written before the index still loads, resumes and is found
 *   - the trained batches a checkpoint records as not acked: round trip, absent in a checkpoint
 *     without them (as before the record), not in model.safetensors, a damaged record named
 *   - checkpoint checksums: a bit flipped in a tensor's data of either file is refused by the
 *     loader that reads it, naming the file and the tensor; a checkpoint without them loads
 *   - an exact resume checks model.safetensors and writes a damaged or missing one again from
 *     the masters, byte for byte, its index too; one it cannot read refuses the resume (I/O, not
 *     damage)
 *   - a drafter that does not fit the target is refused with both values named
 *   - a slot's view: trains like the batch it holds; arrays that disagree with its header refused
 *   - DFLASH_LM_CHUNK and DFLASH_LAYER0_DEDUP: a value they do not take ("on", "4k") exits 2
 *   - layer 0's dedup stays off for a batch with more than Q / 2 distinct ids (its xln holds
 *     2 U rows of Q), with the gradients of DFLASH_LAYER0_DEDUP=0
 */
#include "check.h"
#include "dflash_ckpt.h"
#include "dflash_eval.h"
#include "dflash_model.h"
#include "dflash_train.h"
#include "err.h"
#include "ops.h"
#include "safetensors.h"
#include "test_files.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* a tiny world: target embed / lm_head, one packed batch of two sequences */
enum { D = 16, NF = 2, V = 11, T0 = 9, T1 = 7, T = T0 + T1 };

typedef struct world {
    const nn_ops *ops;
    nn_ctx *ctx;
    dflash_config cfg;
    float embed[V * D], lm_head[V * D];
    float hidden[T * NF * D];
    int32_t seq_off[3], ids[T];
    uint8_t loss_mask[T];
    dflash_batch_view view;
    dflash_train_cfg tc;
} world;

static uint64_t rng_state = 12345;
static double urand(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}

static void world_init(world *w) {
    memset(w, 0, sizeof *w);
    w->ops = nn_cpu_ops();
    w->ctx = nn_cpu_new(1);
    dflash_config *c = &w->cfg;
    c->hidden_size = D;
    c->num_layers = 2;
    c->num_heads = 2;
    c->num_kv_heads = 1;
    c->head_dim = 8;
    c->intermediate_size = 24;
    c->block_size = 4;
    c->n_feat = NF;
    c->target_layer_ids[0] = 1;
    c->target_layer_ids[1] = 3;
    c->num_target_layers = 6;
    c->mask_token_id = V - 1;
    c->vocab_size = V;
    c->max_position_embeddings = 128;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->bos_token_id = c->eos_token_id = -1;
    for (int i = 0; i < V * D; i++)
        w->embed[i] = (float)(0.7 * urand());
    for (int i = 0; i < V * D; i++)
        w->lm_head[i] = (float)(0.7 * urand());
    for (int i = 0; i < T * NF * D; i++)
        w->hidden[i] = (float)urand();
    w->seq_off[0] = 0, w->seq_off[1] = T0, w->seq_off[2] = T;
    for (int t = 0; t < T; t++)
        w->ids[t] = (int32_t)((t * 7 + 3) % (V - 1));
    /* sequence 0: prompt of 2 then response; sequence 1: prompt 1, response, one masked hole */
    for (int t = 0; t < T; t++)
        w->loss_mask[t] = 1;
    w->loss_mask[0] = w->loss_mask[1] = 0;
    w->loss_mask[T0] = 0;
    w->loss_mask[T0 + 4] = 0;
    w->view = (dflash_batch_view){.n_seqs = 2,
                                  .seq_off = w->seq_off,
                                  .ids = w->ids,
                                  .positions = NULL,
                                  .loss_mask = w->loss_mask,
                                  .hidden = w->hidden,
                                  .ld = NF * D};
    dflash_train_cfg_default(&w->tc);
    w->tc.n_anchors = 3;
}

/* Randomises every parameter (norm weights around 1) so each nonlinearity matters. */
static void randomise(dflash_model *m) {
    for (int i = 0; i < m->n_tensors; i++) {
        float *p = dflash_model_master(m, i);
        for (size_t j = 0; j < m->tensors[i].numel; j++)
            p[j] = m->tensors[i].ndim == 1 ? (float)(1.0 + 0.2 * urand()) : (float)(0.4 * urand());
    }
    dflash_model_sync_params(m);
}

static double loss_only(dflash_model *m, const world *w, double wsum) {
    dflash_model_forward(m, w->view.hidden);
    dflash_model_loss(m, (float)(1.0 / wsum));
    return m->out_sums[0] / wsum;
}

/* Every tensor's gradient as fp32 at its offset in g[n_params] (padding left as it is). */
static void grads_f32(const dflash_model *m, float *g) {
    for (int i = 0; i < m->n_tensors; i++)
        dflash_model_grad_download(m, i, g + m->tensors[i].offset);
}

static void test_gradients(world *w) {
    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 1);
    CHECK(m != NULL);
    if (!m) return;
    randomise(m);
    int nb = dflash_train_sample_anchors(m, &w->tc, &w->view, 0, 0);
    CHECK_EQ_INT(nb, 6);
    int32_t bs[8], ba[8];
    memcpy(bs, m->h_blk_seq, sizeof bs);
    memcpy(ba, m->h_blk_anchor, sizeof ba);
    dflash_metrics met;
    CHECK_EQ_INT(dflash_train_grads(m, &w->tc, &w->view, nb, bs, ba, &met), 0);
    CHECK(met.loss > 0.5 && met.loss < 10);
    CHECK(m->cur_u > 0 && m->cur_u <= nb + 1); /* layer 0 ran on its distinct rows */
    CHECK(m->last_compact); /* the last layer on the loss's rows; the differences below: all */
    float *g = malloc(m->n_params * sizeof(float));
    grads_f32(m, g);
    double wsum = met.weight_sum;
    /* directional derivative per tensor: sum g*r against (L(p + h r) - L(p - h r)) / 2h */
    int bad = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        float *p = dflash_model_master(m, i);
        float *r = malloc(t->numel * sizeof(float)), *p0 = malloc(t->numel * sizeof(float));
        memcpy(p0, p, t->numel * sizeof(float));
        double an = 0.0;
        for (size_t j = 0; j < t->numel; j++) {
            r[j] = (float)urand();
            an += (double)g[t->offset + j] * r[j];
        }
        /* central differences at three steps; the best must agree (a real bug disagrees at
         * every step, while fp32 rounding or curvature spoils only one end of the range) */
        double best = 1e30, fd = 0;
        for (double h = 3e-2; h > 2e-3; h /= 3) {
            for (size_t j = 0; j < t->numel; j++)
                p[j] = p0[j] + (float)h * r[j];
            double lp = loss_only(m, w, wsum);
            for (size_t j = 0; j < t->numel; j++)
                p[j] = p0[j] - (float)h * r[j];
            double lm = loss_only(m, w, wsum);
            double f = (lp - lm) / (2 * h);
            if (fabs(f - an) < best) best = fabs(f - an), fd = f;
        }
        memcpy(p, p0, t->numel * sizeof(float));
        if (best > 1e-2 * fabs(an) + 2e-5) {
            fprintf(stderr, "grad %s: analytic %.6g finite difference %.6g\n", t->name, an, fd);
            bad++;
        }
        free(r);
        free(p0);
    }
    CHECK_EQ_INT(bad, 0);
    free(g);
    dflash_model_destroy(&m);
}

/* The training step's two row savings, layer 0 on its distinct rows and the last layer on
 * the rows the loss reads (both on by default), give the loss and gradients of the plain step
 * (DFLASH_LAYER0_DEDUP=0 DFLASH_LAST_LAYER_ROWS=all), to fp32 rounding, together and each on
 * its own. */
static void test_row_savings(world *w) {
    const char *dedup[4] = {NULL, "0", NULL, "0"}, *last[4] = {"all", "all", NULL, NULL};
    dflash_model *m[4];
    dflash_metrics met[4];
    for (int k = 0; k < 4; k++) {
        if (dedup[k]) setenv("DFLASH_LAYER0_DEDUP", dedup[k], 1);
        if (last[k]) setenv("DFLASH_LAST_LAYER_ROWS", last[k], 1);
        m[k] = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 1);
        unsetenv("DFLASH_LAYER0_DEDUP");
        unsetenv("DFLASH_LAST_LAYER_ROWS");
        CHECK(m[k] != NULL);
        if (!m[k]) return;
    }
    randomise(m[0]);
    for (int k = 0; k < 4; k++) {
        if (k) {
            memcpy(m[k]->master, m[0]->master, m[0]->n_params * sizeof(float));
            dflash_model_sync_params(m[k]);
        }
        int nb = dflash_train_sample_anchors(m[k], &w->tc, &w->view, 0, 0);
        int32_t bs[8], ba[8];
        memcpy(bs, m[k]->h_blk_seq, sizeof bs);
        memcpy(ba, m[k]->h_blk_anchor, sizeof ba);
        CHECK_EQ_INT(dflash_train_grads(m[k], &w->tc, &w->view, nb, bs, ba, &met[k]), 0);
        CHECK_EQ_INT(m[k]->cur_u > 0, dedup[k] == NULL);
        CHECK_EQ_INT(m[k]->last_compact, last[k] == NULL);
    }
    size_t n = m[1]->n_params;
    float *ga = calloc(n, sizeof(float)), *gb = calloc(n, sizeof(float));
    grads_f32(m[1], gb);
    for (int k = 0; k < 4; k++) {
        if (k == 1) continue;
        CHECK(fabs(met[k].loss - met[1].loss) < 1e-5 * fabs(met[1].loss));
        grads_f32(m[k], ga);
        double num = 0, den = 0;
        for (size_t j = 0; j < n; j++) {
            double a = ga[j], b = gb[j];
            num += (a - b) * (a - b), den += b * b;
        }
        CHECK(den > 0 && sqrt(num / den) < 1e-5);
    }
    free(ga), free(gb);
    for (int k = 0; k < 4; k++)
        dflash_model_destroy(&m[k]);
}

/* Layer 0's dedup keeps the distinct rows and their inputs in the first 2 U rows of its xln
 * ([Q, D]): a batch with more than Q / 2 distinct ids (block size 2, every anchor its own id:
 * U = nb + 1 > Q / 2) must run without it (cur_u 0), with the gradients of DFLASH_LAYER0_DEDUP=0.
 * With the guard gone the U inputs would be written past xln's Q rows, into the next
 * activation, on a batch of max_blocks blocks. */
static void test_dedup_over_half(world *w) {
    dflash_config c2 = w->cfg;
    c2.block_size = 2;
    enum { NB = 4 };
    int32_t bs[NB] = {0, 0, 0, 1}, ba[NB] = {2, 3, 4, 2}; /* ids 7, 4, 1, 8: all distinct */
    dflash_model *m[2];
    dflash_metrics met[2];
    for (int k = 0; k < 2; k++) {
        if (k) setenv("DFLASH_LAYER0_DEDUP", "0", 1);
        m[k] = dflash_model_new(&c2, w->ops, w->ctx, w->embed, w->lm_head, T, NB, 1);
        unsetenv("DFLASH_LAYER0_DEDUP");
        CHECK(m[k] != NULL);
        if (!m[k]) return;
    }
    CHECK(m[0]->u_cap > 0 && m[1]->u_cap == 0);
    randomise(m[0]);
    memcpy(m[1]->master, m[0]->master, m[0]->n_params * sizeof(float));
    dflash_model_sync_params(m[1]);
    for (int k = 0; k < 2; k++)
        CHECK_EQ_INT(dflash_train_grads(m[k], &w->tc, &w->view, NB, bs, ba, &met[k]), 0);
    CHECK_EQ_INT(m[0]->cur_u, 0); /* 2 U = 10 > Q = 8 */
    CHECK(met[0].loss == met[1].loss);
    size_t n = m[0]->n_params;
    float *ga = calloc(n, sizeof(float)), *gb = calloc(n, sizeof(float));
    grads_f32(m[0], ga);
    grads_f32(m[1], gb);
    CHECK(!memcmp(ga, gb, n * sizeof(float)));
    free(ga), free(gb);
    for (int k = 0; k < 2; k++)
        dflash_model_destroy(&m[k]);
}

/* The model's switches and sizes from the environment take only what they mean: a value like
 * "on" or "4k" stops the process (exit 2) naming the variable. atoi() read "on" and "true" as
 * 0 (DFLASH_LAYER0_DEDUP off) and "4k" as 4 rows per lm_head chunk, without a word. */
static void test_env_values(world *w) {
    setenv("DFLASH_LM_CHUNK", "4", 1);
    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 1);
    unsetenv("DFLASH_LM_CHUNK");
    CHECK(m && m->lm_chunk == 4);
    dflash_model_destroy(&m);
    const char *bad[][2] = {{"DFLASH_LAYER0_DEDUP", "on"}, {"DFLASH_LAYER0_DEDUP", "true"},
                            {"DFLASH_LAYER0_DEDUP", "2"},  {"DFLASH_LM_CHUNK", "4k"},
                            {"DFLASH_LM_CHUNK", "1"},      {"DFLASH_LM_CHUNK", "-8"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            setenv(bad[i][0], bad[i][1], 1);
            m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 1);
            _exit(m ? 0 : 1);
        }
        int st = 0;
        CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2)
            fprintf(stderr, "%s=%s: the model was made (status %d)\n", bad[i][0], bad[i][1], st);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    }
}

/* Outputs of block j must not depend on context rows at/after its anchor, nor on the other
 * sequence, nor on which other blocks are packed with it. */
static void test_mask(world *w) {
    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 1);
    CHECK(m != NULL);
    if (!m) return;
    randomise(m);
    int B = w->cfg.block_size;
    int32_t bs[4] = {0, 0, 1, 1}, ba[4] = {3, 5, 2, 4};
    double ws;
    CHECK_EQ_INT(dflash_train_build(m, &w->tc, &w->view, 4, bs, ba, &ws), 0);
    dflash_model_forward(m, w->view.hidden);
    float all[4 * 4 * D];
    memcpy(all, m->out, sizeof all);
    /* each block alone */
    double maxdiff = 0;
    for (int j = 0; j < 4; j++) {
        dflash_train_build(m, &w->tc, &w->view, 1, bs + j, ba + j, &ws);
        dflash_model_forward(m, w->view.hidden);
        for (int i = 0; i < B * D; i++)
            maxdiff = fmax(maxdiff, fabs(((float *)m->out)[i] - all[j * B * D + i]));
    }
    CHECK(maxdiff < 1e-5);
    /* block 1 (seq 0, anchor 5): rows 5.. and sequence 1 invisible, row 4 visible */
    float saved[T * NF * D];
    memcpy(saved, w->hidden, sizeof saved);
    for (int t = 5; t < T; t++)
        for (int k = 0; k < NF * D; k++)
            w->hidden[t * NF * D + k] += 1.0f;
    dflash_train_build(m, &w->tc, &w->view, 1, bs + 1, ba + 1, &ws);
    dflash_model_forward(m, w->view.hidden);
    maxdiff = 0;
    for (int i = 0; i < B * D; i++)
        maxdiff = fmax(maxdiff, fabs(((float *)m->out)[i] - all[1 * B * D + i]));
    CHECK(maxdiff < 1e-5);
    for (int k = 0; k < NF * D; k++)
        w->hidden[4 * NF * D + k] += 1.0f;
    dflash_model_forward(m, w->view.hidden);
    maxdiff = 0;
    for (int i = 0; i < B * D; i++)
        maxdiff = fmax(maxdiff, fabs(((float *)m->out)[i] - all[1 * B * D + i]));
    CHECK(maxdiff > 1e-3);
    memcpy(w->hidden, saved, sizeof saved);
    dflash_model_destroy(&m);
}

static void test_anchors_and_weights(world *w) {
    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 32, 1);
    CHECK(m != NULL);
    if (!m) return;
    dflash_train_cfg tc = w->tc;
    tc.n_anchors = 100; /* more than the candidates: all of them */
    int nb = dflash_train_sample_anchors(m, &tc, &w->view, 0, 0);
    /* seq 0: mask 0 0 1 1 1 1 1 1 1 -> candidates 2..7 (6); seq 1: 0 1 1 1 0 1 1 -> 1,2,5 (3) */
    CHECK_EQ_INT(nb, 9);
    int expect_a[9] = {2, 3, 4, 5, 6, 7, 1, 2, 5}, expect_s[9] = {0, 0, 0, 0, 0, 0, 1, 1, 1};
    for (int j = 0; j < 9 && j < nb; j++) {
        CHECK_EQ_INT(m->h_blk_anchor[j], expect_a[j]);
        CHECK_EQ_INT(m->h_blk_seq[j], expect_s[j]);
    }
    /* 3 per sequence: ascending, valid, deterministic per (seed, epoch, batch) */
    int32_t a1[6], a2[6];
    nb = dflash_train_sample_anchors(m, &w->tc, &w->view, 4, 17);
    CHECK_EQ_INT(nb, 6);
    memcpy(a1, m->h_blk_anchor, sizeof a1);
    for (int j = 0; j < 6; j++) {
        int s = m->h_blk_seq[j], st = w->seq_off[s];
        CHECK(w->loss_mask[st + a1[j]] && w->loss_mask[st + a1[j] + 1]);
        if (j % 3) CHECK(a1[j] > a1[j - 1]);
    }
    dflash_train_sample_anchors(m, &w->tc, &w->view, 4, 17);
    memcpy(a2, m->h_blk_anchor, sizeof a2);
    CHECK(!memcmp(a1, a2, sizeof a1));
    /* each of the three changes the draw (seq 0 picks 3 of 6 candidates: 1 in 20 draws alike) */
    int differs_epoch = 0, differs_batch = 0, differs_seed = 0;
    for (int e = 5; e < 15; e++) {
        dflash_train_sample_anchors(m, &w->tc, &w->view, (uint64_t)e, 17);
        differs_epoch += memcmp(a1, m->h_blk_anchor, sizeof a1) != 0;
        dflash_train_sample_anchors(m, &w->tc, &w->view, 4, (uint64_t)e + 13);
        differs_batch += memcmp(a1, m->h_blk_anchor, sizeof a1) != 0;
        dflash_train_cfg seeded = w->tc;
        seeded.seed += (uint64_t)e;
        dflash_train_sample_anchors(m, &seeded, &w->view, 4, 17);
        differs_seed += memcmp(a1, m->h_blk_anchor, sizeof a1) != 0;
    }
    CHECK(differs_epoch >= 5);
    CHECK(differs_batch >= 5);
    CHECK(differs_seed >= 5);
    /* weights of block (seq 1, anchor 2): offsets 1 (t=3), 2 (t=4 masked), 3 (t=5) */
    int32_t bs = 1, ba = 2;
    double ws;
    dflash_train_build(m, &w->tc, &w->view, 1, &bs, &ba, &ws);
    double g = dflash_train_gamma(&w->tc, 4);
    CHECK_NEAR(g, 1.75, 0); /* 7*B/16 for B 4 */
    CHECK_NEAR(m->h_weights[0], 0.0, 0);
    CHECK_NEAR(m->h_weights[1], 1.0, 1e-7);
    CHECK_NEAR(m->h_weights[2], 0.0, 0);
    CHECK_NEAR(m->h_weights[3], exp(-2.0 / g), 1e-7);
    CHECK_EQ_INT(m->h_ids[0], w->ids[T0 + 2]);
    CHECK_EQ_INT(m->h_ids[1], w->cfg.mask_token_id);
    CHECK_EQ_INT(m->h_pos[T + 3], 5);
    CHECK_EQ_INT(m->h_spans[0].ctx_begin, T0);
    CHECK_EQ_INT(m->h_spans[0].ctx_end, T0 + 2);
    /* block (seq 1, anchor 5): offset 2 is past the end of the sequence (S = 7) */
    ba = 5;
    dflash_train_build(m, &w->tc, &w->view, 1, &bs, &ba, &ws);
    CHECK_NEAR(m->h_weights[1], 1.0, 1e-7);
    CHECK_NEAR(m->h_weights[2], 0.0, 0);
    CHECK_NEAR(m->h_weights[3], 0.0, 0);
    CHECK_NEAR(ws, 1.0, 1e-7);
    dflash_model_destroy(&m);
}

static void test_training_reduces_loss(world *w) {
    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 3);
    CHECK(m != NULL);
    if (!m) return;
    dflash_train_cfg tc = w->tc;
    tc.lr = 1e-2;
    tc.total_steps = 40;
    dflash_metrics met;
    double first = 0, last = 0;
    for (int s = 0; s < 40; s++) {
        CHECK_EQ_INT(dflash_train_step(m, &tc, &w->view, 0, 0, &met), 0);
        if (s == 0) first = met.loss;
        last = met.loss;
    }
    printf("training: loss %.4f -> %.4f, accuracy %.3f, accept length %.3f, step %ld\n", first,
           last, met.accuracy, met.accept_len, met.step);
    CHECK(last < 0.5 * first);
    CHECK_EQ_INT(met.step, 40);
    /* [1, B] holds by construction; a model that learned the batch accepts well past 1 (this
     * run: accuracy ~0.92, accept length ~2.67 of 4) */
    CHECK(met.accept_len > 1.5 && met.accept_len <= 4.0);
    /* the last step's figures from its correct flags (out_correct, by row) and weights: the
     * accuracy over the weighted rows, the acceptance length the mean over blocks of 1 + the
     * leading run of weighted correct offsets (a row without weight ends the run) */
    int B = w->cfg.block_size, nb = met.n_blocks, right = 0, total = 0;
    double acc_len = 0.0;
    for (int j = 0; j < nb; j++) {
        int run = 0, live = 1;
        for (int o = 1; o < B; o++) {
            int q = j * B + o, weighted = m->h_weights[q] > 0.0f;
            int ok = weighted && m->out_correct[q];
            total += weighted, right += ok;
            if (live && ok)
                run++;
            else
                live = 0;
        }
        acc_len += 1 + run;
    }
    CHECK(nb > 0 && total > 0 && total == met.n_weighted);
    if (nb > 0 && total > 0) {
        CHECK_NEAR(met.accuracy, (double)right / total, 1e-12);
        CHECK_NEAR(met.accept_len, acc_len / nb, 1e-12);
    }
    /* schedule: warmup int(0.04*40) = 1 step (SpecForge rounds down: 2 steps would start at
     * lr / 2), then cosine over the other 39 to 0 at step 40 */
    CHECK_NEAR(dflash_train_lr(&tc, 0), 1e-2, 1e-12);
    CHECK_NEAR(dflash_train_lr(&tc, 1), 1e-2, 1e-12);
    CHECK_NEAR(dflash_train_lr(&tc, 20), 1e-2 * 0.5 * (1 + cos(M_PI * 19.0 / 39.0)), 1e-12);
    CHECK_NEAR(dflash_train_lr(&tc, 40), 0.0, 1e-12);
    dflash_train_cfg t75 = tc; /* 0.04 * 75 = 3 warmup steps: the first at lr / 3 */
    t75.total_steps = 75;
    CHECK_NEAR(dflash_train_lr(&t75, 0), 1e-2 / 3, 1e-12);
    dflash_train_cfg tf = tc; /* a cosine floor of 0.1: from lr down to 0.1 lr, past the end too */
    tf.min_lr_ratio = 0.1;
    CHECK_NEAR(dflash_train_lr(&tf, 1), 1e-2, 1e-12);
    CHECK_NEAR(dflash_train_lr(&tf, 20), 1e-2 * (0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 19.0 / 39.0))),
               1e-12);
    CHECK_NEAR(dflash_train_lr(&tf, 40), 1e-3, 1e-12);
    CHECK_NEAR(dflash_train_lr(&tf, 55), 1e-3, 1e-12);
    dflash_model_destroy(&m);
}

/* Every trainable element's master as fp32 at its offset in p[n_params]. */
static void masters_f32(const dflash_model *m, float *p) {
    for (int i = 0; i < m->n_tensors; i++)
        memcpy(p + m->tensors[i].offset, dflash_model_master(m, i),
               m->tensors[i].numel * sizeof(float));
}

/* The update a training step applies, in closed form from the moments it leaves: AdamW's t is
 * the step being taken (1 on the first, 2 on the second: the bias corrections), eps is added
 * outside the square root, and weight decay applies to the matrices only. Two models from one
 * state train one step on one batch, with and without decay: the norms' vectors come out bit
 * for bit equal, each matrix element differs by lr * wd * its value before the step. */
static void test_adamw_in_step(world *w) {
    dflash_model *a = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 3);
    dflash_model *b = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 3);
    CHECK(a != NULL && b != NULL);
    if (!a || !b) return;
    randomise(a);
    for (int i = 0; i < a->n_tensors; i++)
        memcpy(dflash_model_master(b, i), dflash_model_master(a, i),
               a->tensors[i].numel * sizeof(float));
    dflash_model_sync_params(b);
    dflash_train_cfg tc = w->tc, tcd;
    tc.lr = 1e-3, tc.total_steps = 0, tc.clip = 0, tc.weight_decay = 0; /* constant lr, no clip */
    tcd = tc, tcd.weight_decay = 0.1;
    size_t n = a->n_params;
    float *p0 = calloc(n, sizeof(float)), *p1 = calloc(n, sizeof(float));
    float *pd = calloc(n, sizeof(float));
    dflash_metrics met;
    for (int t = 1; t <= 2; t++) {
        masters_f32(a, p0);
        CHECK_EQ_INT(dflash_train_step(a, &tc, &w->view, 0, 0, &met), 0);
        masters_f32(a, p1);
        double bc1 = 1.0 - pow(tc.beta1, t), bc2 = 1.0 - pow(tc.beta2, t), worst = 0.0;
        size_t moved = 0;
        for (int i = 0; i < a->n_tensors; i++) {
            for (size_t j = a->tensors[i].offset; j < a->tensors[i].offset + a->tensors[i].numel;
                 j++) {
                double want = -tc.lr * (a->adam_m[j] / bc1) /
                              (sqrt((double)a->adam_v[j]) / sqrt(bc2) + tc.eps);
                worst = fmax(worst, fabs((double)(p1[j] - p0[j]) - want));
                moved += p1[j] != p0[j];
            }
        }
        printf("AdamW step %d: %zu of %zu elements moved, worst |update - closed form| %.3g "
               "(lr %g)\n",
               t, moved, n, worst, tc.lr);
        CHECK(worst <= 1e-3 * tc.lr);
        CHECK(moved > n / 2);
        if (t == 2) break;
        /* the same first step with decay, from the same state */
        CHECK_EQ_INT(dflash_train_step(b, &tcd, &w->view, 0, 0, &met), 0);
        masters_f32(b, pd);
        double worst_mat = 0.0;
        size_t vec_differ = 0;
        for (int i = 0; i < a->n_tensors; i++) {
            const dflash_tensor *te = &a->tensors[i];
            for (size_t j = te->offset; j < te->offset + te->numel; j++) {
                if (te->ndim == 1)
                    vec_differ += pd[j] != p1[j];
                else
                    worst_mat = fmax(worst_mat, fabs((double)(pd[j] - p1[j]) +
                                                     tcd.lr * tcd.weight_decay * p0[j]));
            }
        }
        CHECK_EQ_INT((int)vec_differ, 0);
        CHECK(worst_mat <= 1e-6);
    }
    free(p0), free(p1), free(pd);
    dflash_model_destroy(&a);
    dflash_model_destroy(&b);
}

static void test_mismatch(world *w) {
    model_config t = {0};
    t.hidden_size = D;
    t.vocab_size = V;
    t.num_layers = 6;
    t.rope_theta = w->cfg.rope_theta;
    t.rms_norm_eps = w->cfg.rms_norm_eps;
    char msg[256];
    int ids[2] = {1, 3};
    CHECK_EQ_INT(dflash_config_check_target(&w->cfg, &t, ids, 2, msg, sizeof msg), 0);
    t.hidden_size = 32;
    CHECK_EQ_INT(dflash_config_check_target(&w->cfg, &t, ids, 2, msg, sizeof msg),
                 DFLASH_EMISMATCH);
    CHECK(strstr(msg, "16") && strstr(msg, "32") && strstr(msg, "hidden_size"));
    t.hidden_size = D;
    ids[1] = 4;
    CHECK_EQ_INT(dflash_config_check_target(&w->cfg, &t, ids, 2, msg, sizeof msg),
                 DFLASH_EMISMATCH);
    CHECK(strstr(msg, "3") && strstr(msg, "4") && strstr(msg, "layer"));
    ids[1] = 3;
    t.vocab_size = 50;
    CHECK_EQ_INT(dflash_config_check_target(&w->cfg, &t, ids, 2, msg, sizeof msg),
                 DFLASH_EMISMATCH);
    CHECK(strstr(msg, "11") && strstr(msg, "50") && strstr(msg, "vocab"));
    t.vocab_size = V;
    /* another target of the same shapes: what the drafter took from its own target differs */
    t.rope_theta = 500000;
    CHECK_EQ_INT(dflash_config_check_target(&w->cfg, &t, ids, 2, msg, sizeof msg),
                 DFLASH_EMISMATCH);
    printf("another target's rope_theta: %s\n", msg);
    CHECK(strstr(msg, "rope_theta 10000 ") && strstr(msg, "rope_theta 500000"));
    t.rope_theta = w->cfg.rope_theta;
    t.rms_norm_eps = 1e-5;
    CHECK_EQ_INT(dflash_config_check_target(&w->cfg, &t, ids, 2, msg, sizeof msg),
                 DFLASH_EMISMATCH);
    CHECK(strstr(msg, "rms_norm_eps 1e-06 ") && strstr(msg, "rms_norm_eps 1e-05"));
    t.rms_norm_eps = w->cfg.rms_norm_eps;
    CHECK_EQ_INT(dflash_config_check_target(&w->cfg, &t, ids, 2, msg, sizeof msg), 0);
    int L = 36, z[5];
    dflash_default_layer_ids(L, 5, z);
    CHECK(z[0] == 1 && z[1] == 9 && z[2] == 17 && z[3] == 25 && z[4] == 33);
}

/* The file's text (up to 64 KiB) in a static buffer, or NULL. */
static const char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return text;
}

static cJSON *read_json(const char *path) {
    const char *text = read_text(path);
    return text ? cJSON_Parse(text) : NULL;
}

static int json_int(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : -12345;
}

static bool test_is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int count_steps(const char *root) {
    DIR *d = opendir(root);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += !strncmp(e->d_name, "step-", 5);
    if (d) closedir(d);
    return n;
}

/* dir/model.safetensors.index.json: JSON in the Hugging Face layout whose weight_map maps
 * exactly the tensors of model.safetensors, every one to "model.safetensors" (vLLM and SGLang
 * then read no other *.safetensors file of the directory: not the training state), and whose
 * metadata.total_size is their data bytes; safetensors_open of the directory (which takes the
 * index, as those loaders do) sees the same tensors and none of the training state's. */
static void check_ckpt_index(const char *dir) {
    char p[512], err[256];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    cJSON *j = read_json(p);
    CHECK(cJSON_IsObject(j));
    if (!j) {
        fprintf(stderr, "  %s: missing or not JSON\n", p);
        return;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    safetensors *st = safetensors_open(p, NULL, err, sizeof err);
    CHECK(st != NULL);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "metadata");
    const cJSON *total = meta ? cJSON_GetObjectItemCaseSensitive(meta, "total_size") : NULL;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    CHECK(cJSON_IsNumber(total) && cJSON_IsObject(wm));
    if (st && cJSON_IsNumber(total) && cJSON_IsObject(wm)) {
        size_t n = safetensors_count(st);
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++) {
            const safetensors_tensor *t = safetensors_at(st, i);
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(wm, t->name);
            CHECK(cJSON_IsString(f) && !strcmp(f->valuestring, "model.safetensors"));
            bytes += t->bytes;
        }
        CHECK_EQ_INT(cJSON_GetArraySize(wm), (int)n);
        for (const cJSON *e = wm->child; e; e = e->next)
            CHECK(safetensors_find(st, e->string) != NULL);
        CHECK(bytes > 0 && total->valuedouble == (double)bytes);
        safetensors *via = safetensors_open(dir, NULL, err, sizeof err);
        CHECK(via && safetensors_count(via) == n && !safetensors_find(via, "master.fc.weight"));
        safetensors_close(&via);
    }
    safetensors_close(&st);
    cJSON_Delete(j);
}

/* The files of a checkpoint directory, and nothing else (no writer's temporary file). */
static void check_ckpt_listing(const char *dir) {
    const char *want[] = {"config.json", "dflash.py", "model.safetensors",
                          "model.safetensors.index.json", "training_state.safetensors"};
    int found[5] = {0}, other = 0;
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int k = 0;
        while (k < 5 && strcmp(e->d_name, want[k]))
            k++;
        if (k < 5)
            found[k]++;
        else {
            fprintf(stderr, "  %s: unexpected file %s\n", dir, e->d_name);
            other++;
        }
    }
    if (d) closedir(d);
    for (int k = 0; k < 5; k++)
        CHECK_EQ_INT(found[k], 1);
    CHECK_EQ_INT(other, 0);
}

/* config.json fields (dflash.md 2.1) and tensor names / shapes / dtype (2.2) */
static void check_ckpt_files(const dflash_model *m, const char *dir) {
    const dflash_config *c = &m->cfg;
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cJSON *j = read_json(p);
    CHECK(j != NULL);
    if (!j) return;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    CHECK(cJSON_IsArray(arch) && cJSON_GetArraySize(arch) == 1 &&
          !strcmp(cJSON_GetArrayItem(arch, 0)->valuestring, "DFlashDraftModel"));
    CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(j, "model_type")->valuestring, "qwen3"));
    const cJSON *am = cJSON_GetObjectItemCaseSensitive(j, "auto_map");
    CHECK(am && !strcmp(cJSON_GetObjectItemCaseSensitive(am, "AutoModel")->valuestring,
                        "dflash.DFlashDraftModel"));
    CHECK_EQ_INT(json_int(j, "block_size"), c->block_size);
    CHECK_EQ_INT(json_int(j, "num_target_layers"), c->num_target_layers);
    CHECK_EQ_INT(json_int(j, "num_hidden_layers"), c->num_layers);
    CHECK_EQ_INT(json_int(j, "hidden_size"), c->hidden_size);
    CHECK_EQ_INT(json_int(j, "intermediate_size"), c->intermediate_size);
    CHECK_EQ_INT(json_int(j, "num_attention_heads"), c->num_heads);
    CHECK_EQ_INT(json_int(j, "num_key_value_heads"), c->num_kv_heads);
    CHECK_EQ_INT(json_int(j, "head_dim"), c->head_dim);
    CHECK_EQ_INT(json_int(j, "vocab_size"), c->vocab_size);
    CHECK_EQ_INT(json_int(j, "max_position_embeddings"), c->max_position_embeddings);
    CHECK_EQ_INT(json_int(j, "max_window_layers"), c->num_layers);
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(j, "dflash_config");
    CHECK(dc != NULL);
    if (dc) {
        CHECK_EQ_INT(json_int(dc, "mask_token_id"), c->mask_token_id);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(dc, "target_layer_ids");
        CHECK(cJSON_IsArray(ids) && cJSON_GetArraySize(ids) == c->n_feat);
        for (int i = 0; ids && i < c->n_feat; i++)
            CHECK_EQ_INT(cJSON_GetArrayItem(ids, i)->valuedouble, c->target_layer_ids[i]);
    }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    CHECK(cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == c->num_layers);
    CHECK(!strcmp(cJSON_GetArrayItem(lt, 0)->valuestring, "full_attention"));
    CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(j, "hidden_act")->valuestring, "silu"));
    CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(j, "dtype")->valuestring, "bfloat16"));
    /* and as torch_dtype, the name transformers read before 4.56 (older SGLang / vLLM) */
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
    CHECK(cJSON_IsString(td) && !strcmp(td->valuestring, "bfloat16"));
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "attention_bias")));
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "rope_scaling")));
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "use_sliding_window")));
    CHECK(cJSON_GetObjectItemCaseSensitive(j, "rms_norm_eps")->valuedouble == c->rms_norm_eps);
    CHECK(cJSON_GetObjectItemCaseSensitive(j, "rope_theta")->valuedouble == c->rope_theta);
    CHECK(!cJSON_GetObjectItemCaseSensitive(j, "eagle_aux_hidden_state_layer_ids"));
    cJSON_Delete(j);

    /* the module auto_map names (its maths: dflash_logits_check) */
    snprintf(p, sizeof p, "%s/dflash.py", dir);
    const char *py = read_text(p);
    CHECK(py && strstr(py, "\nclass DFlashDraftModel(_Base):"));

    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    char err[256];
    safetensors *st = safetensors_open(p, NULL, err, sizeof err);
    CHECK(st != NULL);
    if (!st) return;
    int L = c->num_layers, Dd = c->hidden_size, Hd = c->num_heads * c->head_dim;
    int Hkd = c->num_kv_heads * c->head_dim, Fi = c->intermediate_size;
    CHECK_EQ_INT(safetensors_count(st), 3 + 11 * L);
    struct {
        const char *name;
        int ndim;
        int64_t s0, s1;
    } want[] = {{"fc.weight", 2, Dd, (int64_t)c->n_feat * Dd},
                {"hidden_norm.weight", 1, Dd, 0},
                {"norm.weight", 1, Dd, 0}};
    for (int i = 0; i < 3; i++) {
        int64_t shp[2] = {want[i].s0, want[i].s1};
        CHECK_EQ_INT(safetensors_expect(st, want[i].name, want[i].ndim, shp, NULL, err, sizeof err),
                     0);
    }
    for (int l = 0; l < L; l++) {
        struct {
            const char *n;
            int ndim;
            int64_t s0, s1;
        } lw[] = {{"input_layernorm.weight", 1, Dd, 0},
                  {"post_attention_layernorm.weight", 1, Dd, 0},
                  {"self_attn.q_proj.weight", 2, Hd, Dd},
                  {"self_attn.k_proj.weight", 2, Hkd, Dd},
                  {"self_attn.v_proj.weight", 2, Hkd, Dd},
                  {"self_attn.o_proj.weight", 2, Dd, Hd},
                  {"self_attn.q_norm.weight", 1, c->head_dim, 0},
                  {"self_attn.k_norm.weight", 1, c->head_dim, 0},
                  {"mlp.gate_proj.weight", 2, Fi, Dd},
                  {"mlp.up_proj.weight", 2, Fi, Dd},
                  {"mlp.down_proj.weight", 2, Dd, Fi}};
        for (int i = 0; i < 11; i++) {
            char name[128];
            snprintf(name, sizeof name, "layers.%d.%s", l, lw[i].n);
            int64_t shp[2] = {lw[i].s0, lw[i].s1};
            const safetensors_tensor *t = NULL;
            int rc = safetensors_expect(st, name, lw[i].ndim, shp, &t, err, sizeof err);
            CHECK_EQ_INT(rc, 0);
            if (rc) fprintf(stderr, "%s\n", err);
            if (t) CHECK(t->dtype == SAFETENSORS_BF16);
        }
    }
    safetensors_close(&st);
    check_ckpt_index(dir);
    check_ckpt_listing(dir);
}

/* dflash_train_step_async + collect (the daemon's hot loop, one step behind) gives the same
 * weights and metrics as dflash_train_step; a third pending step is refused. */
static void test_async_step(world *w) {
    dflash_model *a = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 11);
    dflash_model *b = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 11);
    CHECK(a != NULL && b != NULL);
    if (!a || !b) return;
    dflash_train_cfg tc = w->tc;
    tc.lr = 3e-3;
    tc.clip = 0.05; /* small enough that clipping is active */
    CHECK_EQ_INT(dflash_train_prepare(a), 0);
    dflash_metrics ms[6], ma;
    for (int s = 0; s < 6; s++)
        CHECK_EQ_INT(dflash_train_step(b, &tc, &w->view, 0, (uint64_t)s, &ms[s]), 0);
    int got = 0;
    for (int s = 0; s < 6; s++) {
        CHECK_EQ_INT(dflash_train_step_async(a, &tc, &w->view, 0, (uint64_t)s), 0);
        CHECK_EQ_INT(a->step, s + 1); /* the step counter moves when the step is queued */
        if (s == 2) /* two pending: a third is refused until one is collected */
            CHECK_EQ_INT(dflash_train_step_async(a, &tc, &w->view, 0, 99), DFLASH_ESTATE);
        if (dflash_train_pending(a) == 2 && dflash_train_collect(a, &ma) == 1) {
            CHECK(ma.loss == ms[got].loss && ma.grad_norm == ms[got].grad_norm);
            CHECK(ma.accept_len == ms[got].accept_len && ma.step == ms[got].step);
            CHECK(ms[got].grad_norm > tc.clip);
            got++;
        }
    }
    while (dflash_train_collect(a, &ma) == 1) {
        CHECK(ma.loss == ms[got].loss && ma.lr == ms[got].lr);
        got++;
    }
    CHECK_EQ_INT(got, 6);
    CHECK_EQ_INT(dflash_train_collect(a, &ma), 0);
    CHECK(!memcmp(a->master, b->master, a->n_params * sizeof(float)));
    CHECK(!memcmp(a->adam_m, b->adam_m, a->n_params * sizeof(float)));
    dflash_model_destroy(&a);
    dflash_model_destroy(&b);
}

/* The world's sequence s alone as a batch (off: its two offsets' storage). */
static dflash_batch_view seq_view(const world *w, int s, int32_t off[2]) {
    dflash_batch_view v = w->view;
    int start = w->seq_off[s];
    off[0] = 0, off[1] = w->seq_off[s + 1] - start;
    v.n_seqs = 1, v.seq_off = off, v.ids = w->ids + start, v.loss_mask = w->loss_mask + start;
    v.hidden = w->hidden + (size_t)start * NF * D;
    return v;
}

/* max |a - b| / max |b| over n floats */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? d / mb : d;
}

/* Gradient accumulation (tc.accumulate): the world's two sequences as two batches of one step
 * give the update of one batch holding both with the same anchors (model b: dflash_train_grads
 * over the packed batch with each sequence's anchors, then dflash_train_apply): the same loss
 * (the global weight sum), gradient norm and first moment (AdamW's m after step 1 is 0.1 times
 * the clipped gradient: the gradient itself, which a wrong weighting of the two batches would
 * change), up to fp32 rounding. The step counter moves when the step closes; the records say
 * open / closing; three more steps stay together; a step closed early by
 * dflash_train_flush_async (accumulate 3, two batches) is the same step. */
static void test_accumulate(world *w) {
    int32_t off[2][2];
    dflash_batch_view one[2] = {seq_view(w, 0, off[0]), seq_view(w, 1, off[1])};
    for (int variant = 0; variant < 2; variant++) {
        dflash_model *a = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 11);
        dflash_model *b = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 11);
        CHECK(a != NULL && b != NULL);
        if (!a || !b) return;
        dflash_train_cfg tc = w->tc, tb = w->tc;
        tc.lr = tb.lr = 3e-3;
        tc.accumulate = variant ? 3 : 2;
        CHECK_EQ_INT(dflash_train_plan(a, &tc), 0);
        CHECK_EQ_INT(dflash_train_prepare(b), 0);
        long allocs0 = w->ops->allocs(w->ctx);
        for (int step = 0; step < 4; step++) {
            /* b: both sequences packed, each with the anchors its own batch draws */
            int32_t seq[16], anc[16];
            int nb = 0;
            for (int s = 0; s < 2; s++) {
                int k = dflash_train_sample_anchors(b, &tb, &one[s], 0, (uint64_t)(10 * step + s));
                CHECK(k > 0 && nb + k <= 16);
                for (int j = 0; j < k; j++)
                    seq[nb + j] = s, anc[nb + j] = b->h_blk_anchor[j];
                nb += k;
            }
            dflash_metrics mb, ma[3];
            CHECK_EQ_INT(dflash_train_grads(b, &tb, &w->view, nb, seq, anc, &mb), 0);
            dflash_train_apply(b, &tb, &mb);
            for (int s = 0; s < 2; s++) {
                CHECK_EQ_INT(dflash_train_step_async(a, &tc, &one[s], 0, (uint64_t)(10 * step + s)),
                             0);
                CHECK_EQ_INT(dflash_train_collect(a, &ma[s]), 1);
            }
            CHECK_EQ_INT(a->step, variant ? step : step + 1);
            CHECK(ma[0].open && ma[0].step == step);
            if (variant) { /* the third batch never comes: the run ends */
                CHECK(ma[1].open);
                CHECK_EQ_INT(dflash_train_open(a), 2);
                CHECK_EQ_INT(dflash_train_flush_async(a, &tc), 1);
                CHECK_EQ_INT(dflash_train_collect(a, &ma[1]), 1);
                CHECK_EQ_INT(dflash_train_flush_async(a, &tc), 0); /* nothing open now */
            }
            CHECK(!ma[1].open && !ma[1].skipped);
            CHECK_EQ_INT(ma[1].batches, 2);
            CHECK_EQ_INT(dflash_train_open(a), 0);
            CHECK_EQ_INT(a->step, step + 1);
            CHECK_EQ_INT(ma[1].step, step + 1);
            CHECK_EQ_INT(ma[1].n_blocks, nb);
            CHECK_EQ_INT(ma[1].n_weighted, mb.n_weighted);
            CHECK(fabs(ma[1].loss - mb.loss) <= 1e-5 * fabs(mb.loss));
            CHECK(fabs(ma[1].weight_sum - mb.weight_sum) <= 1e-9 * mb.weight_sum);
            CHECK(fabs(ma[1].grad_norm - mb.grad_norm) <= 1e-5 * mb.grad_norm);
            CHECK(fabs(ma[1].accuracy - mb.accuracy) <= 1e-12);
            if (step == 0) {
                /* the two batches' weights differ, so a plain mean would not pass this */
                CHECK(fabs(ma[0].weight_sum - (mb.weight_sum - ma[0].weight_sum)) > 0.5);
                double d = rel_diff(a->adam_m, b->adam_m, a->n_params);
                if (d > 1e-5) printf("first moment after step 1: max rel diff %g\n", d);
                CHECK(d <= 1e-5);
            }
        }
        CHECK(rel_diff(a->master, b->master, a->n_params) <= 1e-5);
        CHECK_EQ_INT(w->ops->allocs(w->ctx) - allocs0, 0); /* planned: no step allocates */
        dflash_model_destroy(&a);
        dflash_model_destroy(&b);
    }
}

/* Memory is planned at creation (and dflash_train_prepare): steps of any batch shape within the
 * planned maximum, synchronous or queued, allocate nothing (ops.h allocs counts the backend's
 * allocations; the trainer and the target report the same count for their hot loops). */
static void test_no_alloc_in_steps(world *w) {
    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 16, 5);
    CHECK(m != NULL);
    if (!m) return;
    CHECK_EQ_INT(dflash_train_prepare(m), 0);
    /* the whole batch, its first sequence alone, its second alone */
    int32_t off0[2] = {0, T0}, off1[2] = {0, T1};
    dflash_batch_view views[3] = {w->view, w->view, w->view};
    views[1].n_seqs = 1, views[1].seq_off = off0;
    views[2].n_seqs = 1, views[2].seq_off = off1, views[2].ids = w->ids + T0;
    views[2].loss_mask = w->loss_mask + T0, views[2].hidden = w->hidden + T0 * NF * D;
    long before = w->ops->allocs(w->ctx);
    dflash_train_cfg tc = w->tc;
    dflash_metrics met;
    for (int s = 0; s < 12; s++) {
        tc.n_anchors = 1 + s % 8;
        if (s % 2)
            CHECK_EQ_INT(dflash_train_step(m, &tc, &views[s % 3], 0, (uint64_t)s, &met), 0);
        else
            CHECK_EQ_INT(dflash_train_step_async(m, &tc, &views[s % 3], 0, (uint64_t)s), 0);
        while (dflash_train_pending(m) > 1)
            CHECK_EQ_INT(dflash_train_collect(m, &met), 1);
    }
    while (dflash_train_pending(m) > 0)
        CHECK_EQ_INT(dflash_train_collect(m, &met), 1);
    CHECK_EQ_INT(w->ops->allocs(w->ctx) - before, 0);
    /* the counter sees an allocation (so the check above can fail) */
    void *p = w->ops->alloc(w->ctx, 64);
    CHECK_EQ_INT(w->ops->allocs(w->ctx) - before, 1);
    w->ops->free(w->ctx, p);
    dflash_model_destroy(&m);
}

/* ---------------------------------------------------------------------------------------------
 * The optimizer on a side stream (ops.h side_begin): a cpu ops table whose side stream lags as
 * far as the contract allows. Work queued between side_begin and side_end (the AdamW calls) is
 * held back and runs only when a side_wait names a stage marked after it, or at a host wait
 * (sync, downloads, frees, fence_wait). A training loop that reads a weight before its update,
 * or overwrites a gradient before the update has read it, then computes something else. */

enum { LAG_CAP = 64 };
typedef struct lag_entry {
    int kind; /* 0: a mark, 1: adamw_clip, 2: adamw_clip_act */
    int stage;
    float *p, *m, *v;
    nn_buf *p_act;
    uint16_t *p_lo;
    const void *g;
    size_t n;
    float lr, beta1, beta2, eps, wd, clip;
    const float *sumsq;
    int t;
} lag_entry;

static struct {
    const nn_ops *real;
    nn_ops tab;
    bool on;           /* between side_begin and side_end */
    bool ignore_waits; /* the negative control: side_wait does nothing */
    lag_entry q[LAG_CAP];
    int n;
} lag;

static void lag_run(nn_ctx *c, int upto) { /* runs entries [0, upto) and drops them */
    for (int i = 0; i < upto; i++) {
        lag_entry *e = &lag.q[i];
        if (e->kind == 1)
            lag.real->adamw_clip(c, e->p, e->p_act, e->g, e->m, e->v, e->n, e->lr, e->beta1,
                                 e->beta2, e->eps, e->wd, e->sumsq, e->clip, e->t);
        else if (e->kind == 2)
            lag.real->adamw_clip_act(c, e->p, e->p_act, e->p_lo, e->g, e->m, e->v, e->n, e->lr,
                                     e->beta1, e->beta2, e->eps, e->wd, e->sumsq, e->clip, e->t);
    }
    memmove(lag.q, lag.q + upto, (size_t)(lag.n - upto) * sizeof lag.q[0]);
    lag.n -= upto;
}

static void lag_push(lag_entry e) {
    CHECK(lag.n < LAG_CAP);
    if (lag.n < LAG_CAP) lag.q[lag.n++] = e;
}

static void lag_side_begin(nn_ctx *c) {
    (void)c;
    lag.on = true;
}
static void lag_side_end(nn_ctx *c) {
    (void)c;
    lag_push((lag_entry){.kind = 0, .stage = -1});
    lag.on = false;
}
static void lag_side_mark(nn_ctx *c, int k) {
    (void)c;
    lag_push((lag_entry){.kind = 0, .stage = k});
}
static void lag_side_wait(nn_ctx *c, int k) {
    if (lag.ignore_waits) return;
    int upto = 0;
    for (int i = 0; i < lag.n; i++)
        if (lag.q[i].kind == 0 && lag.q[i].stage == k) upto = i + 1;
    lag_run(c, upto);
}

static void lag_adamw_clip(nn_ctx *c, float *p, nn_buf *p_act, const float *g, float *m, float *v,
                           size_t n, float lr, float b1, float b2, float eps, float wd,
                           const float *sumsq, float clip, int t) {
    if (!lag.on) {
        lag.real->adamw_clip(c, p, p_act, g, m, v, n, lr, b1, b2, eps, wd, sumsq, clip, t);
        return;
    }
    lag_push((lag_entry){1, 0, p, m, v, p_act, NULL, g, n, lr, b1, b2, eps, wd, clip, sumsq, t});
}
static void lag_adamw_clip_act(nn_ctx *c, float *p, nn_buf *p_act, uint16_t *p_lo,
                               const nn_buf *g, float *m, float *v, size_t n, float lr, float b1,
                               float b2, float eps, float wd, const float *sumsq, float clip,
                               int t) {
    if (!lag.on) {
        lag.real->adamw_clip_act(c, p, p_act, p_lo, g, m, v, n, lr, b1, b2, eps, wd, sumsq, clip,
                                 t);
        return;
    }
    lag_push((lag_entry){2, 0, p, m, v, p_act, p_lo, g, n, lr, b1, b2, eps, wd, clip, sumsq, t});
}

/* the host waits: everything queued first */
static void lag_sync(nn_ctx *c) {
    lag_run(c, lag.n);
    lag.real->sync(c);
}
static void lag_download(nn_ctx *c, float *dst, const nn_buf *src, size_t n) {
    lag_run(c, lag.n);
    lag.real->download(c, dst, src, n);
}
static void lag_download_raw(nn_ctx *c, void *dst, const void *src, size_t bytes) {
    lag_run(c, lag.n);
    lag.real->download_raw(c, dst, src, bytes);
}
static void lag_free(nn_ctx *c, void *p) {
    lag_run(c, lag.n);
    lag.real->free(c, p);
}
static void lag_host_free(nn_ctx *c, void *p) {
    lag_run(c, lag.n);
    lag.real->host_free(c, p);
}
static void lag_fence_wait(nn_ctx *c, int k) {
    lag_run(c, lag.n);
    lag.real->fence_wait(c, k);
}

static const nn_ops *lag_ops(const nn_ops *real) {
    lag.real = real;
    lag.tab = *real;
    lag.tab.side_begin = lag_side_begin, lag.tab.side_end = lag_side_end;
    lag.tab.side_mark = lag_side_mark, lag.tab.side_wait = lag_side_wait;
    lag.tab.adamw_clip = lag_adamw_clip, lag.tab.adamw_clip_act = lag_adamw_clip_act;
    lag.tab.sync = lag_sync, lag.tab.download = lag_download;
    lag.tab.download_raw = lag_download_raw, lag.tab.free = lag_free;
    lag.tab.host_free = lag_host_free, lag.tab.fence_wait = lag_fence_wait;
    return &lag.tab;
}

/* Accumulation with batches that have no weight (their loss masks all 0: skipped), as pattern
 * pat of slots (0: the world's sequence 0, 1: sequence 1, 2: sequence 0 without a loss token):
 * three steps of accumulate batches (with flush: closed by dflash_train_flush_async after pat)
 * against model b's one packed batch of both sequences with the same anchors: loss, norm,
 * blocks and final weights (rel 1e-5). A skipped first batch must not leave the previous step's
 * accumulator in (the first weighted batch overwrites it), a skipped last one must not be read
 * (grad_average a = 0). On ops (the lagging side stream too). */
static void accumulate_pattern(world *w, const int *pat, int npat, int accumulate, bool flush,
                               const nn_ops *ops, const char *name) {
    int32_t off[3][2];
    static uint8_t no_loss[T];
    dflash_batch_view one[3] = {seq_view(w, 0, off[0]), seq_view(w, 1, off[1]),
                                seq_view(w, 0, off[2])};
    one[2].loss_mask = no_loss;
    dflash_model *a = dflash_model_new(&w->cfg, ops, w->ctx, w->embed, w->lm_head, T, 8, 11);
    dflash_model *b = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 11);
    CHECK(a != NULL && b != NULL);
    if (!a || !b) return;
    dflash_train_cfg tc = w->tc, tb = w->tc;
    tc.lr = tb.lr = 3e-3;
    tc.accumulate = accumulate;
    CHECK_EQ_INT(dflash_train_plan(a, &tc), 0);
    bool ok = true;
    for (int step = 0; step < 3; step++) {
        int32_t seq[16], anc[16];
        int nb = 0;
        for (int s = 0; s < 2; s++) {
            int k = dflash_train_sample_anchors(b, &tb, &one[s], 0, (uint64_t)(10 * step + s));
            for (int j = 0; j < k && nb + j < 16; j++)
                seq[nb + j] = s, anc[nb + j] = b->h_blk_anchor[j];
            nb += k;
        }
        dflash_metrics mb, ma, last = {0};
        ok &= dflash_train_grads(b, &tb, &w->view, nb, seq, anc, &mb) == 0;
        dflash_train_apply(b, &tb, &mb);
        for (int i = 0; i < npat; i++) {
            int s = pat[i];
            ok &= dflash_train_step_async(a, &tc, &one[s], 0,
                                          (uint64_t)(10 * step + (s == 2 ? 7 : s))) == 0;
            while (dflash_train_collect(a, &ma) == 1)
                last = ma;
        }
        if (flush) {
            ok &= dflash_train_flush_async(a, &tc) == 1;
            while (dflash_train_collect(a, &ma) == 1)
                last = ma;
        }
        ok &= a->step == step + 1 && !last.open && !last.skipped && last.batches == npat;
        ok &= fabs(last.loss - mb.loss) <= 1e-5 * fabs(mb.loss) && last.n_blocks == nb;
        ok &= fabs(last.grad_norm - mb.grad_norm) <= 1e-5 * mb.grad_norm;
    }
    float *host = malloc(a->n_params * sizeof(float));
    ops->download_raw(w->ctx, host, a->master, a->n_params * sizeof(float));
    double d = rel_diff(host, b->master, a->n_params);
    if (!ok || d > 1e-5) printf("accumulate %s: steps %s, weights rel diff %g\n", name,
                                ok ? "agree" : "DIFFER", d);
    CHECK(ok);
    CHECK(d <= 1e-5);
    free(host);
    dflash_model_destroy(&a);
    dflash_model_destroy(&b);
}

/* A step whose batches all lack weight makes no update but counts: its records say skipped, the
 * closing one with its batches, and m->step moves (its open batches were acked with it), also
 * when a flush closes it; the weights stay as they were. */
static void accumulate_all_skipped(world *w) {
    int32_t off[2];
    static uint8_t no_loss[T];
    dflash_batch_view e = seq_view(w, 0, off);
    e.loss_mask = no_loss;
    dflash_model *a = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 11);
    CHECK(a != NULL);
    if (!a) return;
    dflash_train_cfg tc = w->tc;
    tc.accumulate = 2;
    CHECK_EQ_INT(dflash_train_plan(a, &tc), 0);
    float *before = malloc(a->n_params * sizeof(float));
    memcpy(before, a->master, a->n_params * sizeof(float));
    dflash_metrics m0, m1;
    CHECK_EQ_INT(dflash_train_step_async(a, &tc, &e, 0, 1), 0);
    CHECK_EQ_INT(dflash_train_collect(a, &m0), 1);
    CHECK_EQ_INT(dflash_train_step_async(a, &tc, &e, 0, 2), 0);
    CHECK_EQ_INT(dflash_train_collect(a, &m1), 1);
    CHECK(m0.open && !m1.open && m1.skipped);
    CHECK_EQ_INT(m1.batches, 2);
    CHECK_EQ_INT(a->step, 1);
    CHECK_EQ_INT(m1.step, 1);
    CHECK_EQ_INT(dflash_train_open(a), 0);
    CHECK_EQ_INT(dflash_train_step_async(a, &tc, &e, 0, 3), 0); /* open, then closed by a flush */
    CHECK_EQ_INT(dflash_train_collect(a, &m0), 1);
    CHECK_EQ_INT(dflash_train_flush_async(a, &tc), 1);
    CHECK_EQ_INT(dflash_train_collect(a, &m1), 1);
    CHECK(m1.skipped && !m1.open);
    CHECK_EQ_INT(m1.batches, 1);
    CHECK_EQ_INT(a->step, 2);
    CHECK(!memcmp(before, a->master, a->n_params * sizeof(float)));
    free(before);
    dflash_model_destroy(&a);
}

static void test_accumulate_skipped(world *w) {
    const int s01[] = {0, 1}, e01[] = {2, 0, 1}, s0e1[] = {0, 2, 1}, s01e[] = {0, 1, 2};
    accumulate_pattern(w, s01, 2, 2, false, w->ops, "[s0 s1]");
    accumulate_pattern(w, e01, 3, 3, false, w->ops, "[E s0 s1]");
    accumulate_pattern(w, s0e1, 3, 3, false, w->ops, "[s0 E s1]");
    accumulate_pattern(w, s01e, 3, 3, false, w->ops, "[s0 s1 E]");
    accumulate_pattern(w, s01e, 3, 4, true, w->ops, "[s0 s1 E] + flush");
    accumulate_pattern(w, e01, 3, 4, true, w->ops, "[E s0 s1] + flush");
    const nn_ops *lo = lag_ops(w->ops);
    accumulate_pattern(w, s0e1, 3, 3, false, lo, "[s0 E s1], lagging side stream");
    accumulate_pattern(w, s01e, 3, 4, true, lo, "[s0 s1 E] + flush, lagging side stream");
    accumulate_all_skipped(w);
}

/* A checkpoint resumed into a model whose last update still lags on the side stream holds the
 * file's weights (the lagging update runs before the upload, not over it); with the lag's host
 * waits bypassed for the resume (run_late: the update runs after it) it does not. */
static void side_stream_resume(world *w, const nn_ops *lo, bool run_late) {
    char root[] = "/tmp/dflash_side_XXXXXX", path[512], err[512];
    CHECK(mkdtemp(root) != NULL);
    dflash_train_cfg tc = w->tc;
    tc.lr = 2e-2;
    dflash_model *r = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 5);
    dflash_model *m = dflash_model_new(&w->cfg, lo, w->ctx, w->embed, w->lm_head, T, 8, 5);
    dflash_metrics met;
    dflash_ckpt_opts opts = {.keep_last = 1};
    lag_entry held[LAG_CAP];
    int n_held = 0;
    if (!r || !m) goto out;
    CHECK_EQ_INT(dflash_train_step(r, &tc, &w->view, 0, 0, &met), 0);
    CHECK_EQ_INT(dflash_ckpt_save(r, &tc, root, &opts, path, sizeof path, err, sizeof err), 0);
    CHECK_EQ_INT(dflash_train_step_async(m, &tc, &w->view, 0, 1), 0);
    CHECK(lag.n > 0); /* m's update is held back */
    n_held = lag.n;
    if (run_late) { /* the resume does not see it: it runs after */
        memcpy(held, lag.q, sizeof held);
        lag.n = 0;
    }
    dflash_train_cfg tm;
    dflash_train_cfg_default(&tm);
    CHECK_EQ_INT(dflash_ckpt_resume(m, &tm, path, true, err, sizeof err), 0);
    if (run_late) {
        memcpy(lag.q, held, sizeof held);
        lag.n = n_held;
    }
    float *host = malloc(m->n_params * sizeof(float));
    lo->download_raw(w->ctx, host, m->master, m->n_params * sizeof(float)); /* runs what lags */
    bool same = !memcmp(host, r->master, m->n_params * sizeof(float));
    CHECK(run_late ? !same : same);
    free(host);
out:
    while (m && dflash_train_collect(m, &met) == 1) /* the step queued before the resume */
        ;
    dflash_model_destroy(&m);
    dflash_model_destroy(&r);
    CHECK_EQ_INT(test_rmtree(root), 0);
}

/* Queued steps (the daemon's loop) with the lagging side stream give the weights, moments and
 * metrics of the same steps run in order, bit for bit; with its waits ignored they do not (the
 * check can fail). A checkpoint resumed mid-run is not overwritten by a lagging update
 * (side_stream_resume). */
static void test_side_stream(world *w) {
    const nn_ops *lo = lag_ops(w->ops);
    dflash_train_cfg tc = w->tc;
    tc.lr = 2e-2;
    tc.clip = 0.05;
    float *ref_master = NULL;
    for (int mode = 0; mode < 3; mode++) { /* in order; lagging; lagging without waits */
        lag.ignore_waits = mode == 2;
        const nn_ops *o = mode ? lo : w->ops;
        dflash_model *m = dflash_model_new(&w->cfg, o, w->ctx, w->embed, w->lm_head, T, 8, 5);
        if (!m) break;
        static double loss[3][8];
        dflash_metrics met;
        int got = 0;
        for (int s = 0; s < 8; s++) {
            CHECK_EQ_INT(dflash_train_step_async(m, &tc, &w->view, 0, (uint64_t)(s % 2)), 0);
            if (dflash_train_pending(m) == 2 && dflash_train_collect(m, &met) == 1)
                loss[mode][got++] = met.loss;
        }
        while (dflash_train_collect(m, &met) == 1)
            loss[mode][got++] = met.loss;
        CHECK_EQ_INT(got, 8);
        if (mode == 0) {
            ref_master = malloc(m->n_params * sizeof(float));
            memcpy(ref_master, m->master, m->n_params * sizeof(float));
            CHECK(loss[0][7] < loss[0][1]); /* it trains */
        } else {
            /* what the host can see of the weights: a download is a host wait */
            float *host = malloc(m->n_params * sizeof(float));
            o->download_raw(w->ctx, host, m->master, m->n_params * sizeof(float));
            bool same = !memcmp(host, ref_master, m->n_params * sizeof(float)) &&
                        !memcmp(loss[mode], loss[0], sizeof loss[0]);
            CHECK(mode == 1 ? same : !same);
            CHECK_EQ_INT(lag.n, 0);
            free(host);
        }
        dflash_model_destroy(&m);
    }
    lag.ignore_waits = false;
    free(ref_master);
    side_stream_resume(w, lo, false);
    side_stream_resume(w, lo, true);
}

/* Edits the training state at st_path (checkpoint path's): key's value goes from `from` to each
 * of bad[0..n) in turn (each as long as the one before: the header keeps its length), and
 * the checkpoint's settings must be refused for each, a format error naming the key. The key
 * is left at bad[n - 1]. */
static void settings_refused(const char *path, const char *st_path, const char *key,
                             const char *from, const char *const *bad, int n) {
    for (int i = 0; i < n; i++) {
        char was[64], now[64], err[512] = "";
        snprintf(was, sizeof was, "\"%s\":\"%s\"", key, i ? bad[i - 1] : from);
        snprintf(now, sizeof now, "\"%s\":\"%s\"", key, bad[i]);
        CHECK(test_edit_in_place(st_path, was, now));
        dflash_train_cfg ts;
        long step;
        CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &step, err, sizeof err),
                     DFLASH_EFORMAT);
        CHECK(strstr(err, key) != NULL);
    }
}

/* The checkpoint tests' fixture: a fresh temp dir from the template root (mkdtemp) and two
 * models of w's shape, *a (seed 5: the one trained and saved) and *b (seed 6: the one resumed
 * into). false (a CHECK failed; the caller returns) when either model could not be made. */
static bool ckpt_models_new(world *w, char *root, dflash_model **a, dflash_model **b) {
    CHECK(mkdtemp(root) != NULL);
    *a = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 5);
    *b = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 6);
    CHECK(*a != NULL && *b != NULL);
    return *a && *b;
}

/* ckpt_models_new's end: destroys both models and removes root with what is in it. */
static void ckpt_models_end(const char *root, dflash_model **a, dflash_model **b) {
    dflash_model_destroy(a);
    dflash_model_destroy(b);
    CHECK_EQ_INT(test_rmtree(root), 0);
}

/* dflash_ckpt_save under a 4 KiB file size limit (RLIMIT_FSIZE, SIGXFSZ ignored): a save that
 * fails as on a full disk. Its return code. */
static int save_past_fsize(dflash_model *a, const dflash_train_cfg *tc, const char *root,
                           const dflash_ckpt_opts *o, char *path, size_t plen, char *err,
                           size_t elen) {
    struct rlimit was, small;
    CHECK_EQ_INT(getrlimit(RLIMIT_FSIZE, &was), 0);
    small = (struct rlimit){4096, was.rlim_max};
    signal(SIGXFSZ, SIG_IGN);
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = dflash_ckpt_save(a, tc, root, o, path, plen, err, elen);
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &was), 0);
    signal(SIGXFSZ, SIG_DFL);
    return rc;
}

/* A --keep-last lowered after a full disk: the save removes the checkpoints past it before it
 * writes (defect: only after a successful save, which the full disk never allowed, so the
 * restarted drafter failed at the same save again, however low --keep-last). The save here
 * fails (past RLIMIT_FSIZE, as on a full disk) and leaves the newest checkpoint, the two older
 * ones removed, and no temporary directory. */
static void test_checkpoint_keep_lowered(world *w) {
    char root[] = "/tmp/dflash_ckpt_XXXXXX";
    dflash_model *a, *b;
    if (!ckpt_models_new(w, root, &a, &b)) return;
    dflash_ckpt_opts keep3 = {.keep_last = 3}, keep1 = {.keep_last = 1};
    char path[512], err[512] = "";
    for (long s = 1; s <= 3; s++) {
        a->step = s;
        CHECK_EQ_INT(dflash_ckpt_save(a, &w->tc, root, &keep3, path, sizeof path, err,
                                      sizeof err), 0);
    }
    CHECK_EQ_INT(count_steps(root), 3);
    a->step = 4;
    int rc = save_past_fsize(a, &w->tc, root, &keep1, path, sizeof path, err, sizeof err);
    printf("a save past the file size limit with --keep-last 1: %s\n", err);
    CHECK(rc != 0);
    CHECK_EQ_INT(count_steps(root), 1);
    char latest[512] = "";
    CHECK_EQ_INT(dflash_ckpt_latest(root, latest, sizeof latest), 0);
    CHECK(strstr(latest, "step-000000003") != NULL);
    DIR *d = opendir(root);
    int tmps = 0;
    for (struct dirent *e; d && (e = readdir(d));) tmps += strncmp(e->d_name, ".tmp", 4) == 0;
    if (d) closedir(d);
    CHECK_EQ_INT(tmps, 0);
    ckpt_models_end(root, &a, &b);
}

/* A newer step directory without a training state (copied in part, weights only) is skipped by
 * the resume and not counted by the retention (defect: counted, with --keep-last 1 a save
 * removed the only resumable checkpoint before its own was durable, and a save failing then
 * left nothing to resume from). Left as it is; the older resumable ones past --keep-last go. */
static void test_checkpoint_keep_incomplete(world *w) {
    char root[] = "/tmp/dflash_ckpt_XXXXXX";
    dflash_model *a, *b;
    if (!ckpt_models_new(w, root, &a, &b)) return;
    dflash_ckpt_opts keep1 = {.keep_last = 1};
    char path[512], err[512] = "", partial[600], latest[512] = "";
    for (long s = 1; s <= 2; s++) {
        a->step = s;
        CHECK_EQ_INT(dflash_ckpt_save(a, &w->tc, root, &keep1, path, sizeof path, err,
                                      sizeof err), 0);
    }
    snprintf(partial, sizeof partial, "%s/step-000000009", root);
    CHECK_EQ_INT(mkdir(partial, 0755), 0);
    CHECK_EQ_INT(dflash_ckpt_latest(root, latest, sizeof latest), 0);
    CHECK(strstr(latest, "step-000000002") != NULL);
    a->step = 4;
    int rc = save_past_fsize(a, &w->tc, root, &keep1, path, sizeof path, err, sizeof err);
    CHECK(rc != 0);
    CHECK_EQ_INT(dflash_ckpt_latest(root, latest, sizeof latest), 0);
    CHECK(strstr(latest, "step-000000002") != NULL);
    CHECK(test_is_dir(partial));
    CHECK_EQ_INT(count_steps(root), 2);
    CHECK_EQ_INT(dflash_ckpt_save(a, &w->tc, root, &keep1, path, sizeof path, err, sizeof err),
                 0);
    CHECK_EQ_INT(dflash_ckpt_latest(root, latest, sizeof latest), 0);
    CHECK(strstr(latest, "step-000000004") != NULL);
    CHECK(test_is_dir(partial)); /* newer than the kept one: left */
    CHECK_EQ_INT(count_steps(root), 2);
    CHECK_EQ_INT(rmdir(partial), 0);
    ckpt_models_end(root, &a, &b);
}

static void test_checkpoint(world *w) {
    char root[] = "/tmp/dflash_ckpt_XXXXXX";
    dflash_model *a, *b;
    if (!ckpt_models_new(w, root, &a, &b)) return;
    dflash_train_cfg tc = w->tc;
    tc.lr = 3e-3;
    tc.total_steps = 20;
    tc.seed = 0xfedcba9876543210ull;
    dflash_metrics ma, mb;
    dflash_ckpt_opts opts = {.keep_last = 2};
    char path[512], err[512];
    for (int s = 0; s < 3; s++) {
        dflash_train_step(a, &tc, &w->view, 0, (uint64_t)s, &ma);
        CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &opts, path, sizeof path, err, sizeof err), 0);
    }
    CHECK_EQ_INT(count_steps(root), 2); /* keep_last */
    char latest[512];
    CHECK_EQ_INT(dflash_ckpt_latest(root, latest, sizeof latest), 0);
    CHECK(!strcmp(latest, path));
    check_ckpt_files(a, path);

    /* exact resume: b continues where a stands, the next step is bit-identical */
    dflash_train_cfg tb;
    dflash_train_cfg_default(&tb);
    CHECK_EQ_INT(dflash_ckpt_resume(b, &tb, path, true, err, sizeof err), 0);
    CHECK_EQ_INT(b->step, 3);
    CHECK(tb.seed == tc.seed && tb.total_steps == 20 && tb.lr == tc.lr && tb.n_anchors == 3);
    CHECK(!memcmp(a->master, b->master, a->n_params * sizeof(float)));
    CHECK(!memcmp(a->adam_v, b->adam_v, a->n_params * sizeof(float)));
    float *saved = malloc(a->n_params * sizeof(float));
    memcpy(saved, b->master, a->n_params * sizeof(float));
    dflash_train_step(a, &tc, &w->view, 0, 3, &ma);
    dflash_train_step(b, &tb, &w->view, 0, 3, &mb);
    CHECK(ma.loss == mb.loss && ma.lr == mb.lr);
    CHECK(!memcmp(a->master, b->master, a->n_params * sizeof(float)));

    /* the settings alone, without a model (what the drafter plans its blocks from) */
    dflash_train_cfg ts;
    long ts_step = -1;
    CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &ts_step, err, sizeof err), 0);
    CHECK(ts_step == 3 && ts.seed == tc.seed && ts.total_steps == 20 && ts.lr == tc.lr &&
          ts.n_anchors == tc.n_anchors && ts.clip == tc.clip);

    /* a save older than the newest kept one does not delete itself (keep_last 1) */
    long a_step = a->step;
    a->step = 1;
    dflash_ckpt_opts keep1 = {.keep_last = 1};
    char older[512];
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &keep1, older, sizeof older, err, sizeof err), 0);
    CHECK(test_is_dir(older));
    CHECK_EQ_INT(test_rmtree(older), 0);
    a->step = a_step;

    /* leftovers of saves whose writer died, the root locked (we are its only writer): an
     * unfinished one is removed and a checkpoint moved aside for its replacement is put back,
     * also where a live process now has the PID in their names (after a reboot, or in another
     * container's PID namespace) */
    int lock = -1;
    CHECK_EQ_INT(dflash_ckpt_lock_root(root, &lock, err, sizeof err), 0);
    char tmp_ours[600], tmp_live[600], old_live[600], gone_step[600];
    snprintf(tmp_ours, sizeof tmp_ours, "%s/.tmp-step-000000009-%d", root, (int)getpid());
    snprintf(tmp_live, sizeof tmp_live, "%s/.tmp-step-000000009-%d", root, (int)getppid());
    snprintf(old_live, sizeof old_live, "%s/.old-step-000000003-%d", root, (int)getppid());
    snprintf(gone_step, sizeof gone_step, "%s/step-000000003", root);
    CHECK(mkdir(tmp_ours, 0755) == 0 && mkdir(tmp_live, 0755) == 0);
    CHECK(rename(gone_step, old_live) == 0);
    CHECK_EQ_INT(dflash_ckpt_recover(root), 3);
    CHECK(!test_is_dir(tmp_ours) && !test_is_dir(tmp_live) && !test_is_dir(old_live));
    CHECK(test_is_dir(gone_step));
    /* a resume that died writing model.safetensors again left its writer's temp file in the
     * step directory: removed; a user's file that only looks alike is kept */
    char writer_tmp[700], index_tmp[700], keep_name[700];
    snprintf(writer_tmp, sizeof writer_tmp, "%s/model.safetensors.tmp.%d", gone_step,
             (int)getppid());
    snprintf(index_tmp, sizeof index_tmp, "%s/model.safetensors.index.json.tmp.%d", gone_step,
             (int)getppid());
    snprintf(keep_name, sizeof keep_name, "%s/notes.tmp.txt", gone_step);
    test_spill(writer_tmp, "partial", 7);
    test_spill(index_tmp, "{", 1);
    test_spill(keep_name, "user", 4);
    CHECK_EQ_INT(dflash_ckpt_recover(root), 2);
    CHECK(access(writer_tmp, F_OK) != 0 && access(index_tmp, F_OK) != 0 &&
          access(keep_name, F_OK) == 0);
    CHECK_EQ_INT(unlink(keep_name), 0);
    check_ckpt_files(a, gone_step);

    /* a model replaced by one at step 2 (a data-parallel group's rank 0's): step-3 (the only
     * one left) is moved to superseded-step-3, not deleted, and no longer one a restart resumes
     * from; a second one of the same step gets its own name */
    char aside[600], aside2[600];
    snprintf(aside, sizeof aside, "%s/superseded-step-000000003", root);
    snprintf(aside2, sizeof aside2, "%s/superseded-step-000000003.2", root);
    CHECK_EQ_INT(dflash_ckpt_set_aside_after(root, 2, err, sizeof err), 1);
    CHECK(!test_is_dir(gone_step) && test_is_dir(aside));
    CHECK_EQ_INT(dflash_ckpt_latest(root, latest, sizeof latest), DFLASH_ENOTFOUND);
    CHECK_EQ_INT(dflash_ckpt_set_aside_after(root, 2, err, sizeof err), 0);
    CHECK(rename(aside, gone_step) == 0);
    CHECK_EQ_INT(dflash_ckpt_set_aside_after(root, 3, err, sizeof err), 0);
    CHECK(mkdir(aside, 0755) == 0);
    CHECK_EQ_INT(dflash_ckpt_set_aside_after(root, 1, err, sizeof err), 1);
    CHECK(test_is_dir(aside2) && !test_is_dir(gone_step));
    CHECK(rmdir(aside) == 0 && rename(aside2, gone_step) == 0);
    check_ckpt_files(a, gone_step);
    close(lock);

    /* warm start: bf16 weights, fresh optimizer */
    dflash_model *c = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 7);
    CHECK_EQ_INT(dflash_ckpt_load_weights(c, path, err, sizeof err), 0);
    CHECK_EQ_INT(c->step, 0);
    double maxrel = 0, vsum = 0;
    for (size_t i = 0; i < c->n_params; i++) {
        maxrel = fmax(maxrel, fabs(c->master[i] - saved[i]) / fmax(fabs(saved[i]), 1e-3));
        vsum += c->adam_v[i];
    }
    CHECK(maxrel > 0 && maxrel < 1e-2); /* bf16 rounding, nothing more */
    CHECK(vsum == 0);
    free(saved);
    dflash_model_destroy(&c);

    /* a checkpoint of another shape is refused, naming both values */
    dflash_config other = w->cfg;
    other.intermediate_size = 40;
    c = dflash_model_new(&other, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 7);
    CHECK_EQ_INT(dflash_ckpt_resume(c, NULL, path, true, err, sizeof err), DFLASH_EMISMATCH);
    CHECK(strstr(err, "intermediate_size") && strstr(err, "40") && strstr(err, "24"));
    dflash_model_destroy(&c);
    /* the same shapes for a target of another rope_theta (its RoPE): refused too */
    other = w->cfg;
    other.rope_theta = w->cfg.rope_theta * 2;
    c = dflash_model_new(&other, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 7);
    CHECK_EQ_INT(dflash_ckpt_resume(c, NULL, path, true, err, sizeof err), DFLASH_EMISMATCH);
    CHECK(strstr(err, "rope_theta") != NULL);
    dflash_model_destroy(&c);
    dflash_config back;
    CHECK_EQ_INT(dflash_ckpt_load_config(path, &back, err, sizeof err), 0);
    CHECK_EQ_INT(dflash_ckpt_check_config(&w->cfg, &back, err, sizeof err), 0);
    /* the config as transformers 5 saves it, rope_theta inside rope_parameters only: the same
     * theta (it read as the default 1e6, and a target of another theta was refused) */
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", path);
    size_t cfg_len = 0;
    char *cfg_text = test_slurp(cfgp, &cfg_len);
    cJSON *cj5 = cfg_text ? cJSON_Parse(cfg_text) : NULL;
    CHECK(cj5 && cJSON_GetObjectItemCaseSensitive(cj5, "rope_theta"));
    if (cj5) {
        cJSON_DeleteItemFromObjectCaseSensitive(cj5, "rope_theta");
        cJSON *rp = cJSON_AddObjectToObject(cj5, "rope_parameters");
        cJSON_AddNumberToObject(rp, "rope_theta", w->cfg.rope_theta);
        cJSON_AddStringToObject(rp, "rope_type", "default");
        char *t5 = cJSON_Print(cj5);
        test_spill(cfgp, t5, strlen(t5));
        free(t5);
        cJSON_Delete(cj5);
        CHECK_EQ_INT(dflash_ckpt_load_config(path, &back, err, sizeof err), 0);
        CHECK(back.rope_theta == w->cfg.rope_theta && back.rope_theta != 1e6);
        test_spill(cfgp, cfg_text, cfg_len);
    }
    free(cfg_text);

    /* a save that cannot write (past a file size limit here, a full disk alike) says why,
     * failing in config.json, in model.safetensors and in dflash.py (written in that order, the
     * index between the last two; each limit above the files before); it used to say
     * "input/output error" or nothing. Nothing is published. */
    struct stat cj, py, ms, ix;
    char f[600];
    snprintf(f, sizeof f, "%s/config.json", path);
    CHECK(stat(f, &cj) == 0);
    snprintf(f, sizeof f, "%s/dflash.py", path);
    CHECK(stat(f, &py) == 0);
    snprintf(f, sizeof f, "%s/model.safetensors.index.json", path);
    CHECK(stat(f, &ix) == 0);
    snprintf(f, sizeof f, "%s/model.safetensors", path);
    CHECK(stat(f, &ms) == 0);
    CHECK(ms.st_size > cj.st_size + 64 && py.st_size > ms.st_size + 64 && ix.st_size < ms.st_size);
    struct rlimit lim0, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &lim0) == 0);
    void (*xfsz)(int) = signal(SIGXFSZ, SIG_IGN);
    const char *where[3] = {"config.json", "model.safetensors", "dflash.py"};
    const rlim_t limit[3] = {1, (rlim_t)cj.st_size + 64, (rlim_t)ms.st_size + 64};
    for (int k = 0; k < 3; k++) {
        lim = lim0;
        lim.rlim_cur = limit[k];
        CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
        a->step = 50 + k;
        int rc = dflash_ckpt_save(a, &tc, root, &opts, f, sizeof f, err, sizeof err);
        CHECK(setrlimit(RLIMIT_FSIZE, &lim0) == 0);
        CHECK_EQ_INT(rc, DFLASH_EIO);
        CHECK(strstr(err, where[k]) != NULL && strstr(err, strerror(EFBIG)) != NULL);
        if (!strstr(err, strerror(EFBIG))) fprintf(stderr, "  message was: %s\n", err);
        CHECK_EQ_INT(dflash_ckpt_latest(root, f, sizeof f), 0);
        CHECK(!strcmp(f, path));
    }
    signal(SIGXFSZ, xfsz);
    a->step = a_step;

    /* a checkpoint written before the index: found, warm-started from, eval's config read, a
     * directory open takes model.safetensors; resumed exactly, from outside the run's dir
     * (no repair: nothing written) and from inside it (the index is added, the weights being
     * whole) */
    char idx[600];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", path);
    CHECK_EQ_INT(unlink(idx), 0);
    CHECK_EQ_INT(dflash_ckpt_latest(root, latest, sizeof latest), 0);
    CHECK(!strcmp(latest, path));
    safetensors *old_st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(old_st && safetensors_count(old_st) == (size_t)a->n_tensors);
    safetensors_close(&old_st);
    c = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 7);
    CHECK_EQ_INT(dflash_ckpt_load_weights(c, path, err, sizeof err), 0);
    CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &ts_step, err, sizeof err), 0);
    CHECK_EQ_INT(dflash_ckpt_load_config(path, &back, err, sizeof err), 0);
    CHECK_EQ_INT(dflash_ckpt_resume(c, &tb, path, false, err, sizeof err), 0);
    CHECK(access(idx, F_OK) != 0);
    CHECK_EQ_INT(dflash_ckpt_resume(c, &tb, path, true, err, sizeof err), 0);
    CHECK_EQ_INT(c->step, 3);
    CHECK(access(idx, F_OK) == 0);
    dflash_model_destroy(&c);

    ckpt_models_end(root, &a, &b);
}
/* The header length of the safetensors file at path (its first 8 bytes, little-endian). */
static uint64_t header_length(const char *path) {
    unsigned char b[8] = {0};
    FILE *f = fopen(path, "rb");
    if (f) {
        if (fread(b, 1, 8, f) != 8) memset(b, 0, 8);
        fclose(f);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[i];
    return n;
}

/* The offset in the file at path of byte `at` of tensor name's data (the data section starts
 * after the header; the tensors tile it from its first byte); 0 when there is no such tensor. */
static uint64_t tensor_file_offset(const char *path, const char *name, size_t at) {
    char err[512];
    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    const safetensors_tensor *t = safetensors_find(st, name);
    uint64_t off = 0;
    if (t && at < t->bytes) {
        const char *start = t->data;
        for (size_t i = 0; i < safetensors_count(st); i++)
            if ((const char *)safetensors_at(st, i)->data < start)
                start = safetensors_at(st, i)->data;
        off = 8 + header_length(path) + (uint64_t)((const char *)t->data - start) + at;
    }
    safetensors_close(&st);
    return off;
}

/* Makes path a file of a checkpoint written before the checksums: its __metadata__ without the
 * "crc32c." entries and their marker, the data as it was. */
static void strip_checksums(const char *path) {
    size_t len = 0;
    char *b = test_slurp(path, &len);
    uint64_t hlen = header_length(path);
    cJSON *root = hlen + 8 <= len ? cJSON_ParseWithLength(b + 8, hlen) : NULL;
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    CHECK(meta != NULL);
    for (cJSON *e = meta ? meta->child : NULL, *next; e; e = next) {
        next = e->next;
        if (!strncmp(e->string, "crc32c.", 7) || !strcmp(e->string, "dflash.checksums"))
            cJSON_Delete(cJSON_DetachItemViaPointer(meta, e));
    }
    char *json = cJSON_PrintUnformatted(root);
    size_t jl = json ? strlen(json) : 0, padded = (jl + 7) & ~(size_t)7;
    size_t data = len - 8 - hlen, n = 8 + padded + data;
    char *out = malloc(n);
    if (json && out) {
        for (int i = 0; i < 8; i++)
            out[i] = (char)((uint64_t)padded >> (8 * i));
        memcpy(out + 8, json, jl);
        memset(out + 8 + jl, ' ', padded - jl);
        memcpy(out + 8 + padded, b + 8 + hlen, data);
        test_spill(path, out, n);
    }
    free(out);
    free(json);
    cJSON_Delete(root);
    free(b);
}

/* Both files of a checkpoint carry every tensor's crc32c. A bit flipped in a tensor's data is
 * refused by the loader that reads that file (DFLASH_ECORRUPT, naming the file and the tensor)
 * instead of training on or serving a damaged weight or moment, which no shape or header check
 * sees. A checkpoint from before the checksums still loads, to the same values. */
static void test_checkpoint_checksums(world *w) {
    char root[] = "/tmp/dflash_ckpt_crc_XXXXXX";
    dflash_model *a, *b;
    if (!ckpt_models_new(w, root, &a, &b)) return;
    dflash_train_cfg tc = w->tc, tb;
    dflash_metrics ma;
    dflash_train_step(a, &tc, &w->view, 0, 0, &ma); /* moments not zero */
    char path[512], err[512], file[600], name[200];
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, NULL, path, sizeof path, err, sizeof err), 0);
    const dflash_tensor *mid = &a->tensors[a->n_tensors / 2];

    /* model.safetensors, read by the warm start and eval (and by SGLang, vLLM) */
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    uint64_t off = tensor_file_offset(file, mid->name, mid->numel); /* mid-tensor (bf16) */
    CHECK(off > 0);
    CHECK_EQ_INT(test_flip_bit(file, off, 5), 0);
    CHECK_EQ_INT(dflash_ckpt_load_weights(b, path, err, sizeof err), DFLASH_ECORRUPT);
    printf("warm start from a flipped bit: %s\n", err);
    CHECK(strstr(err, file) && strstr(err, mid->name) && strstr(err, "checksum mismatch"));
    CHECK_EQ_INT(test_flip_bit(file, off, 5), 0);
    CHECK_EQ_INT(dflash_ckpt_load_weights(b, path, err, sizeof err), 0);

    /* training_state.safetensors, read by the exact resume: a second moment this time */
    snprintf(file, sizeof file, "%s/training_state.safetensors", path);
    snprintf(name, sizeof name, "exp_avg_sq.%s", mid->name);
    off = tensor_file_offset(file, name, 2 * mid->numel); /* mid-tensor (fp32) */
    CHECK(off > 0);
    CHECK_EQ_INT(test_flip_bit(file, off, 1), 0);
    CHECK_EQ_INT(dflash_ckpt_resume(b, &tb, path, true, err, sizeof err), DFLASH_ECORRUPT);
    printf("resume from a flipped bit: %s\n", err);
    CHECK(strstr(err, file) && strstr(err, name) && strstr(err, "checksum mismatch"));
    CHECK_EQ_INT(test_flip_bit(file, off, 1), 0);
    CHECK_EQ_INT(dflash_ckpt_resume(b, &tb, path, true, err, sizeof err), 0);

    /* written before the checksums: loads, unverified, to the same values */
    strip_checksums(file);
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    strip_checksums(file);
    safetensors *st = safetensors_open(file, NULL, err, sizeof err);
    CHECK(st && safetensors_count(st) == (size_t)a->n_tensors &&
          !safetensors_at(st, 0)->has_crc32c);
    safetensors_close(&st);
    dflash_model_destroy(&b);
    b = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 6);
    CHECK_EQ_INT(dflash_ckpt_resume(b, &tb, path, true, err, sizeof err), 0);
    CHECK(!memcmp(a->master, b->master, a->n_params * sizeof(float)));
    CHECK(!memcmp(a->adam_v, b->adam_v, a->n_params * sizeof(float)));
    CHECK_EQ_INT(b->step, 1);
    CHECK_EQ_INT(dflash_ckpt_load_weights(b, path, err, sizeof err), 0);

    ckpt_models_end(root, &a, &b);
}

/* dflash_ckpt_resume of the checkpoint at path into m (tb its settings) with its log captured:
 * the return code; *log (malloc'd) what it logged. */
static int resume_logged_as(dflash_model *m, dflash_train_cfg *tb, const char *path, bool repair,
                            char **log, char *err, size_t errlen) {
    test_capture cap = test_capture_begin();
    int rc = dflash_ckpt_resume(m, tb, path, repair, err, errlen);
    *log = test_capture_end(&cap);
    return rc;
}

/* As the checkpoint's own run resumes it (under its locked root: it may repair the file). */
static int resume_logged(dflash_model *m, dflash_train_cfg *tb, const char *path, char **log,
                         char *err, size_t errlen) {
    return resume_logged_as(m, tb, path, true, log, err, errlen);
}

/* The file at path holds the n bytes of want. */
static bool same_file(const char *path, const char *want, size_t n) {
    size_t len = 0;
    char *now = test_slurp(path, &len);
    bool same = len == n && memcmp(now, want, n) == 0;
    free(now);
    return same;
}

/* A FIFO where a checkpoint's config.json should be is refused as unreadable at once (the
 * warm start, eval and resume read config.json first; a blocking open would wait forever). */
/* The trained batches a checkpoint records as not acked (a drafter stopped while no broker
 * answered its ack): they round-trip through a save, exactly, in the training state only (not in
 * model.safetensors, which the serving systems read); a checkpoint without them (as every one
 * written before the record existed) reads as none and resumes as before; a record the save
 * cannot write (a step past the model's, too many) is refused, and a damaged one named. */
static void test_checkpoint_unacked(world *w) {
    char root[] = "/tmp/dflash_unacked_XXXXXX";
    dflash_model *a, *b;
    if (!ckpt_models_new(w, root, &a, &b)) return;
    dflash_train_cfg tc = w->tc;
    dflash_metrics ma;
    for (int s = 0; s < 3; s++) dflash_train_step(a, &tc, &w->view, 0, (uint64_t)s, &ma);
    char path[512], err[512] = "", st_path[600];

    /* none recorded: what every checkpoint written before the record looks like */
    dflash_ckpt_opts plain = {.keep_last = 5};
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &plain, path, sizeof path, err, sizeof err), 0);
    snprintf(st_path, sizeof st_path, "%s/training_state.safetensors", path);
    char *text = test_slurp(st_path, NULL);
    CHECK(text && !strstr(text, "unacked_batches"));
    free(text);
    dflash_ckpt_unacked got[DFLASH_CKPT_MAX_UNACKED];
    int n = -1;
    CHECK_EQ_INT(dflash_ckpt_unacked_batches(path, got, DFLASH_CKPT_MAX_UNACKED, &n, err,
                                             sizeof err), 0);
    CHECK_EQ_INT(n, 0);
    dflash_train_cfg tb;
    dflash_train_cfg_default(&tb);
    CHECK_EQ_INT(dflash_ckpt_resume(b, &tb, path, true, err, sizeof err), 0);
    CHECK_EQ_INT(b->step, 3);

    /* two recorded (a group step's, or a batch and a large identity): read back exactly */
    dflash_train_step(a, &tc, &w->view, 0, 3, &ma);
    dflash_ckpt_unacked u[2] = {{0, 0, 23, 4}, {UINT32_MAX, 7, UINT64_MAX, 1}};
    dflash_ckpt_opts rec = {.keep_last = 5, .unacked = u, .n_unacked = 2};
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &rec, path, sizeof path, err, sizeof err), 0);
    n = -1;
    CHECK_EQ_INT(dflash_ckpt_unacked_batches(path, got, DFLASH_CKPT_MAX_UNACKED, &n, err,
                                             sizeof err), 0);
    CHECK_EQ_INT(n, 2);
    for (int i = 0; i < 2 && n == 2; i++)
        CHECK(got[i].epoch == u[i].epoch && got[i].bucket == u[i].bucket &&
              got[i].index == u[i].index && got[i].step == u[i].step);
    /* fewer room than recorded: refused, not cut */
    CHECK_EQ_INT(dflash_ckpt_unacked_batches(path, got, 1, &n, err, sizeof err), DFLASH_EFORMAT);
    /* the record does not reach what the servers load, and the checkpoint resumes */
    char model_path[600];
    snprintf(model_path, sizeof model_path, "%s/model.safetensors", path);
    text = test_slurp(model_path, NULL);
    CHECK(text && !strstr(text, "unacked_batches"));
    free(text);
    check_ckpt_files(a, path);
    CHECK_EQ_INT(dflash_ckpt_resume(b, &tb, path, true, err, sizeof err), 0);
    CHECK_EQ_INT(b->step, 4);
    CHECK(!memcmp(a->master, b->master, a->n_params * sizeof(float)));

    /* a damaged record is named, not read as none */
    snprintf(st_path, sizeof st_path, "%s/training_state.safetensors", path);
    CHECK(test_edit_in_place(st_path, "0/0/23@4", "0/0/2x@4"));
    err[0] = 0;
    CHECK_EQ_INT(dflash_ckpt_unacked_batches(path, got, DFLASH_CKPT_MAX_UNACKED, &n, err,
                                             sizeof err), DFLASH_EFORMAT);
    CHECK(strstr(err, "unacked_batches") != NULL);
    CHECK(test_edit_in_place(st_path, "0/0/2x@4", "0/0/23@5")); /* past the checkpoint's step */
    CHECK_EQ_INT(dflash_ckpt_unacked_batches(path, got, DFLASH_CKPT_MAX_UNACKED, &n, err,
                                             sizeof err), DFLASH_EFORMAT);

    /* the batches a step (accumulate): recorded; one the drafter would not take is refused,
     * naming it, not read as 1 (a resumed run's batch changed without a word) */
    dflash_train_cfg ts;
    long ts_step;
    CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &ts_step, err, sizeof err), 0);
    CHECK_EQ_INT(ts.accumulate, 1);
    CHECK(test_edit_in_place(st_path, "\"accumulate\":\"1\"", "\"accumulate\":\"7\""));
    CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &ts_step, err, sizeof err), 0);
    CHECK_EQ_INT(ts.accumulate, 7);
    const char *bad_acc[] = {"x", "0"};
    settings_refused(path, st_path, "accumulate", "7", bad_acc, 2);
    /* 9 is a value the drafter takes (the edit keeps the length: one digit) */
    CHECK(test_edit_in_place(st_path, "\"accumulate\":\"0\"", "\"accumulate\":\"9\""));
    CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &ts_step, err, sizeof err), 0);
    CHECK(test_edit_in_place(st_path, "\"accumulate\":\"9\"", "\"accumulate\":\"1\""));

    /* what a save cannot record: a step past the model's or before the first, too many */
    dflash_ckpt_unacked late = {0, 0, 1, 5};
    dflash_ckpt_opts bad = {.keep_last = 5, .unacked = &late, .n_unacked = 1};
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &bad, path, sizeof path, err, sizeof err),
                 DFLASH_EINVAL);
    late.step = 0;
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &bad, path, sizeof path, err, sizeof err),
                 DFLASH_EINVAL);
    bad.n_unacked = DFLASH_CKPT_MAX_UNACKED + 1;
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &bad, path, sizeof path, err, sizeof err),
                 DFLASH_EINVAL);
    ckpt_models_end(root, &a, &b);
}

/* How many drafters a checkpoint's step is for (tc.world: a group's --group-size or ranks, 1
 * alone): recorded
 * ("world") and read back by the resume and by the settings alone, so that a resume with
 * another number of drafters keeps the step's world x accumulate slots (the drafter's
 * step_rescale). A checkpoint without it (every one written before the record, or a save that
 * does not know it) reads as 0, unknown: the resume then keeps the per-rank value as before. A
 * value no group can have is refused naming it, not read as unknown. */
static void test_checkpoint_world(world *w) {
    char root[] = "/tmp/dflash_world_XXXXXX";
    dflash_model *a, *b;
    if (!ckpt_models_new(w, root, &a, &b)) return;
    dflash_train_cfg tc = w->tc, tb, ts;
    dflash_metrics ma;
    dflash_train_step(a, &w->tc, &w->view, 0, 0, &ma);
    tc.accumulate = 2; /* what the save records */
    char path[512], err[512] = "", st_path[600];
    dflash_ckpt_opts opts = {.keep_last = 5};
    long step = 0;

    /* not known at the save: no record, read as unknown */
    tc.world = 0;
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &opts, path, sizeof path, err, sizeof err), 0);
    snprintf(st_path, sizeof st_path, "%s/training_state.safetensors", path);
    char *text = test_slurp(st_path, NULL);
    CHECK(text && !strstr(text, "\"world\""));
    free(text);
    ts.world = 5;
    CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &step, err, sizeof err), 0);
    CHECK_EQ_INT(ts.world, 0);
    CHECK_EQ_INT(ts.accumulate, 2);

    /* a group of 1000 (the widest value that keeps the edits below one length) */
    tc.world = 1000;
    dflash_train_step(a, &w->tc, &w->view, 0, 1, &ma);
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &opts, path, sizeof path, err, sizeof err), 0);
    CHECK_EQ_INT(dflash_ckpt_train_settings(path, &ts, &step, err, sizeof err), 0);
    CHECK_EQ_INT(ts.world, 1000);
    CHECK_EQ_INT(ts.accumulate, 2);
    dflash_train_cfg_default(&tb);
    CHECK_EQ_INT(dflash_ckpt_resume(b, &tb, path, true, err, sizeof err), 0);
    CHECK_EQ_INT(tb.world, 1000);
    CHECK_EQ_INT(tb.accumulate, 2);
    CHECK_EQ_INT(b->step, 2);

    /* what no group has: refused naming the key */
    snprintf(st_path, sizeof st_path, "%s/training_state.safetensors", path);
    const char *bad[] = {"0000", "2000", "10.5", "1e2x"};
    settings_refused(path, st_path, "world", "1000", bad, 4);
    ckpt_models_end(root, &a, &b);
}

static void test_config_fifo(void) {
    char dir[] = "/tmp/dflash_ckpt_fifo_XXXXXX", file[128], err[512] = "";
    CHECK(mkdtemp(dir) != NULL);
    snprintf(file, sizeof file, "%s/config.json", dir);
    CHECK_EQ_INT(mkfifo(file, 0600), 0);
    dflash_config c;
    CHECK_EQ_INT(dflash_ckpt_load_config(dir, &c, err, sizeof err), DFLASH_EIO);
    CHECK(strstr(err, file) && strstr(err, "FIFO"));
    CHECK_EQ_INT(test_rmtree(dir), 0);
}

/* An exact resume reads the training state, not model.safetensors, the weights the checkpoint
 * is served from; it checks that file's checksums too. A flipped data bit, a truncated file or
 * no file at all is written again from the training state's masters, with a warning naming the
 * file (and the tensor), to the very bytes the save wrote (bf16 or fp32, as config.json says),
 * and the resume goes on, its index with it. A file it cannot read (a FIFO in its place) is an
 * I/O failure, not damage: the resume is refused with the system's reason and the file left
 * alone; one it cannot write again, or whose index it cannot, refuses the resume naming the
 * file; a checkpoint outside the resuming run's --checkpoint-dir (repair false) is only warned
 * about. */
static void test_resume_checks_weights(world *w) {
    char root[] = "/tmp/dflash_ckpt_weights_XXXXXX";
    dflash_model *a, *b;
    if (!ckpt_models_new(w, root, &a, &b)) return;
    dflash_train_cfg tc = w->tc, tb;
    dflash_metrics ma;
    dflash_train_step(a, &tc, &w->view, 0, 0, &ma);
    char path[512], err[1024], file[600], tmp[700], *log = NULL;
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, NULL, path, sizeof path, err, sizeof err), 0);
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    size_t n = 0, idx_n = 0;
    char *orig = test_slurp(file, &n), idx[700];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", path);
    char *idx_orig = test_slurp(idx, &idx_n);
    CHECK(n > 0 && idx_n > 0);

    /* a good file: nothing said, nothing written */
    struct stat before, after;
    CHECK_EQ_INT(stat(file, &before), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), 0);
    CHECK(strstr(log, "model.safetensors") == NULL);
    CHECK(stat(file, &after) == 0 && after.st_ino == before.st_ino);
    free(log);

    /* a flipped data bit */
    const dflash_tensor *mid = &a->tensors[a->n_tensors / 2];
    uint64_t off = tensor_file_offset(file, mid->name, mid->numel);
    CHECK(off > 0);
    CHECK_EQ_INT(test_flip_bit(file, off, 3), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), 0);
    printf("resume with a flipped bit in model.safetensors: %s", log);
    CHECK(strstr(log, file) && strstr(log, mid->name) && strstr(log, "checksum mismatch") &&
          strstr(log, "written again"));
    CHECK(same_file(file, orig, n));
    CHECK(!memcmp(a->master, b->master, a->n_params * sizeof(float)));
    CHECK_EQ_INT(b->step, 1);
    free(log);

    /* missing, its index too: both written again, the same bytes */
    CHECK_EQ_INT(unlink(file), 0);
    CHECK_EQ_INT(unlink(idx), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), 0);
    printf("resume without model.safetensors: %s", log);
    CHECK(strstr(log, file) && strstr(log, "missing") && strstr(log, "written again"));
    CHECK(same_file(file, orig, n));
    CHECK(same_file(idx, idx_orig, idx_n));
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", file, (int)getpid());
    CHECK(access(tmp, F_OK) != 0);
    free(log);

    /* truncated (a damaged header) */
    CHECK_EQ_INT(truncate(file, 100), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), 0);
    CHECK(strstr(log, file) && strstr(log, "damaged") && strstr(log, "written again"));
    CHECK(same_file(file, orig, n));
    free(log);

    /* cannot be read: refused, not overwritten */
    CHECK_EQ_INT(unlink(file), 0);
    CHECK_EQ_INT(mkfifo(file, 0600), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), DFLASH_EIO);
    printf("resume with a FIFO for model.safetensors: %s\n", err);
    CHECK(strstr(err, file) && strstr(err, "FIFO") && !strstr(err, "damaged"));
    CHECK(stat(file, &after) == 0 && S_ISFIFO(after.st_mode));
    free(log);

    /* a directory in its place: not a regular file, an I/O failure like the FIFO (not taken
     * for a missing file: safetensors_open would read a directory as a model folder) */
    CHECK_EQ_INT(unlink(file), 0);
    CHECK_EQ_INT(mkdir(file, 0700), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), DFLASH_EIO);
    CHECK(strstr(err, file) && strstr(err, "not a regular file") && !strstr(err, "missing"));
    CHECK(stat(file, &after) == 0 && S_ISDIR(after.st_mode));
    CHECK_EQ_INT(rmdir(file), 0);
    free(log);

    /* cannot be written again (missing, and a directory where the writer's temp file goes) */
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", file, (int)getpid());
    CHECK_EQ_INT(mkdir(tmp, 0700), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), DFLASH_EIO);
    printf("resume where model.safetensors cannot be written: %s\n", err);
    CHECK(strstr(err, file) && strstr(err, "cannot be written again"));
    CHECK_EQ_INT(rmdir(tmp), 0);
    free(log);

    /* its index cannot be written again (a directory in its place): refused naming the index
     * and the system's reason */
    CHECK_EQ_INT(unlink(idx), 0);
    CHECK_EQ_INT(mkdir(idx, 0700), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), DFLASH_EIO);
    printf("resume where the index cannot be written: %s\n", err);
    CHECK(strstr(err, idx) && strstr(err, strerror(EISDIR)) && strstr(err, "its index cannot be"));
    CHECK(same_file(file, orig, n));
    CHECK_EQ_INT(rmdir(idx), 0);
    free(log);
    test_spill(idx, idx_orig, idx_n);

    /* not this run's checkpoint (outside its --checkpoint-dir): warned, never written */
    test_spill(file, "not a safetensors file", 22);
    CHECK_EQ_INT(resume_logged_as(b, &tb, path, false, &log, err, sizeof err), 0);
    printf("resume of another run's checkpoint with a damaged model.safetensors: %s", log);
    CHECK(strstr(log, file) && strstr(log, "not written again"));
    CHECK(same_file(file, "not a safetensors file", 22));
    CHECK_EQ_INT(b->step, 1);
    free(log);
    CHECK_EQ_INT(unlink(file), 0);
    CHECK_EQ_INT(resume_logged_as(b, &tb, path, false, &log, err, sizeof err), 0);
    CHECK(strstr(log, "is missing") && strstr(log, "not written again"));
    CHECK(access(file, F_OK) != 0);
    free(log);
    free(orig);

    /* an fp32 checkpoint is written again in fp32 */
    dflash_ckpt_opts fo = {.weights_f32 = true};
    a->step = 2;
    CHECK_EQ_INT(dflash_ckpt_save(a, &tc, root, &fo, path, sizeof path, err, sizeof err), 0);
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    orig = test_slurp(file, &n);
    CHECK_EQ_INT(unlink(file), 0);
    CHECK_EQ_INT(resume_logged(b, &tb, path, &log, err, sizeof err), 0);
    CHECK(strstr(log, "fp32") != NULL);
    CHECK(same_file(file, orig, n));
    check_ckpt_index(path); /* total_size of fp32 data */
    free(log);
    free(orig);
    free(idx_orig);

    ckpt_models_end(root, &a, &b);
}


/* tau by the real decode loop: one block at each trajectory point, nothing batched; each reply
 * (a maximal span of loss mask 1: sequence 1 has two, 1..3 and 5..6, around its hole) is
 * decoded on its own and ends at its last token */
static dflash_tau decode_tau(dflash_model *s, world *w) {
    dflash_tau t = {0};
    int B = w->cfg.block_size;
    for (int q = 0; q < 2; q++) {
        int st = w->seq_off[q], S = w->seq_off[q + 1] - st;
        const uint8_t *lm = w->loss_mask + st;
        for (int b = 0, e; b < S; b = e) {
            for (e = b + 1; lm[b] && e < S && lm[e];)
                e++;
            long cycles = 0, accepted = 0; /* this reply's */
            for (int p = b; lm[b] && p < e - 1;) {
                int32_t bs = q, ba = p;
                dflash_train_build(s, &w->tc, &w->view, 1, &bs, &ba, NULL);
                dflash_model_forward(s, w->view.hidden);
                dflash_model_predict(s);
                int a = 0;
                while (a < B - 1 && p + a + 1 < e &&
                       s->out_argmax[a + 1] == w->ids[st + p + a + 1])
                    a++;
                cycles++;
                accepted += a + 1;
                p += a + 1;
            }
            t.cycles += cycles;
            t.accepted += accepted;
            if (cycles) t.responses++, t.response_tau_sum += (double)accepted / (double)cycles;
        }
    }
    return t;
}

/* the backend's head limits refuse a drafter when it is made (nn_ops_check_heads) */
static void test_head_limits(world *w) {
    nn_ops limited = *w->ops;
    limited.max_head_dim = w->cfg.head_dim - 2;
    test_capture cap_log = test_capture_begin();
    dflash_model *m = dflash_model_new(&w->cfg, &limited, w->ctx, w->embed, w->lm_head, T, 4, 3);
    char *said = test_capture_end(&cap_log);
    CHECK(m == NULL);
    CHECK(said && strstr(said, "drafter: the cpu backend's attention takes head_dim up to"));
    free(said);
    dflash_model_destroy(&m);
    limited.max_head_dim = w->cfg.head_dim;
    m = dflash_model_new(&w->cfg, &limited, w->ctx, w->embed, w->lm_head, T, 4, 3);
    CHECK(m != NULL);
    dflash_model_destroy(&m);
}

/* dflash_eval_tau's after_chunk: counts the calls and keeps the last (done, n_chunks). */
static int count_chunks(void *user, int done, int n_chunks) {
    int *c = user;
    c[0]++, c[1] = done, c[2] = n_chunks;
    return 0;
}

/* tau by the trajectory: hand-made predictions, then batched vs one block at a time */
static void test_eval(world *w) {
    int32_t ids[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    /* anchors 2..8, B 4: p=2 predicts 3 4 9 (a=2), p=5 predicts 6 7 8 (a=3), p=9 ends */
    int32_t pred[7 * 3] = {0};
    int32_t p2[3] = {3, 4, 9}, p5[3] = {6, 7, 8};
    memcpy(pred + 0 * 3, p2, sizeof p2);
    memcpy(pred + 3 * 3, p5, sizeof p5);
    dflash_tau t = {0};
    dflash_tau_walk(pred, ids, 2, 10, 4, &t);
    CHECK_EQ_INT(t.cycles, 2);
    CHECK_EQ_INT(t.accepted, 7);
    CHECK_NEAR(dflash_tau_value(&t), 3.5, 1e-12);
    CHECK_EQ_INT(t.hist[3], 1);
    CHECK_EQ_INT(t.hist[4], 1);
    /* near the end only tokens inside the sequence can match: p=8 predicts 9 then anything */
    int32_t p8[3] = {9, 9, 9};
    memset(&t, 0, sizeof t);
    memcpy(pred + 6 * 3, p8, sizeof p8);
    dflash_tau_walk(pred + 6 * 3, ids, 8, 10, 4, &t);
    CHECK_EQ_INT(t.cycles, 1);
    CHECK_EQ_INT(t.accepted, 2);
    /* a block drafts B - 1 tokens at most: p=0 predicts 1 2 3, all right, and the row after it
     * (p=1's) starts with 4, the token after them, which is not this block's to accept */
    int32_t full[2 * 3] = {1, 2, 3, 4, 5, 6};
    memset(&t, 0, sizeof t);
    dflash_tau_walk(full, ids, 0, 5, 4, &t);
    CHECK_EQ_INT(t.cycles, 1);
    CHECK_EQ_INT(t.accepted, 4);
    CHECK_EQ_INT(t.hist[4], 1);
    /* a reply of one token has no anchor to draft from: no cycle, and not a reply of tau 0 */
    memset(&t, 0, sizeof t);
    dflash_tau_walk(pred, ids, 9, 10, 4, &t);
    CHECK_EQ_INT(t.cycles, 0);
    CHECK_EQ_INT(t.responses, 0);
    CHECK_NEAR(dflash_tau_value(&t), 0.0, 0);
    /* two replies, [2, 6) and [9, 12), around a turn of loss mask 0 that is never drafted;
     * rows for the candidate anchors 2 3 4 | 9 10. p=2 predicts 3 9 9 (a=1); p=4 predicts 5 6 7,
     * the sequence's next tokens, but 6 and 7 lie past the reply's end (a=1); p=9 predicts
     * 10 11 12 (a=2, the sequence ends) */
    int32_t ids2[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    uint8_t lm2[12] = {0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1};
    int32_t pred2[5 * 3] = {3, 9, 9, 0, 0, 0, 5, 6, 7, 10, 11, 12, 0, 0, 0};
    memset(&t, 0, sizeof t);
    CHECK_EQ_INT(dflash_tau_walk_spans(pred2, ids2, lm2, 12, 4, &t), 5);
    CHECK_EQ_INT(t.cycles, 3);
    CHECK_EQ_INT(t.accepted, 2 + 2 + 3);
    CHECK_EQ_INT(t.hist[2], 2);
    CHECK_EQ_INT(t.hist[3], 1);
    /* tau: each reply's mean, then the mean over replies (2 and 3: 2.5), not the pooled 7 / 3 */
    CHECK_EQ_INT(t.responses, 2);
    CHECK_NEAR(dflash_tau_value(&t), 2.5, 1e-12);
    CHECK_NEAR(dflash_tau_pooled(&t), 7.0 / 3.0, 1e-12);

    dflash_model *m = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 32, 3);
    dflash_model *s = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 3, 3);
    CHECK(m != NULL && s != NULL);
    if (!m || !s) return;
    dflash_tau before = {0}, after = {0}, small = {0}, naive = {0};
    CHECK_EQ_INT(dflash_eval_tau(m, &w->view, &before, NULL, NULL), 0);
    naive = decode_tau(s, w); /* the same initial weights (seed 3) */
    printf("untrained: tau walked reply by reply: %ld cycles, %ld accepted; eval: %ld, %ld\n",
           naive.cycles, naive.accepted, before.cycles, before.accepted);
    CHECK(naive.cycles == before.cycles && naive.accepted == before.accepted &&
          naive.responses == before.responses);
    CHECK_NEAR(dflash_tau_value(&naive), dflash_tau_value(&before), 1e-12);
    dflash_train_cfg tc = w->tc;
    tc.lr = 1e-2;
    tc.n_anchors = 8;
    dflash_metrics met;
    for (int i = 0; i < 60; i++)
        dflash_train_step(m, &tc, &w->view, 0, (uint64_t)i, &met);
    CHECK_EQ_INT(dflash_eval_tau(m, &w->view, &after, NULL, NULL), 0);
    printf("tau before %.3f (%ld cycles), after %.3f (%ld cycles)\n", dflash_tau_value(&before),
           before.cycles, dflash_tau_value(&after), after.cycles);
    CHECK(dflash_tau_value(&after) > dflash_tau_value(&before) + 0.5);
    /* chunked by 3 blocks: the same */
    memcpy(s->master, m->master, m->n_params * sizeof(float));
    dflash_model_sync_params(s);
    int chunks[3] = {0, 0, 0}; /* calls, the last call's done and its n_chunks */
    CHECK_EQ_INT(dflash_eval_tau(s, &w->view, &small, count_chunks, chunks), 0);
    CHECK(small.cycles == after.cycles && small.accepted == after.accepted);
    /* progress: one call a chunk, the last saying all of them are done */
    CHECK(chunks[0] > 1 && chunks[1] == chunks[0] && chunks[2] == chunks[0]);
    naive = decode_tau(s, w);
    printf("tau walked reply by reply: %ld cycles, %ld accepted; eval: %ld, %ld\n",
           naive.cycles, naive.accepted, after.cycles, after.accepted);
    CHECK(naive.cycles == after.cycles && naive.accepted == after.accepted &&
          naive.responses == after.responses);
    CHECK_NEAR(dflash_tau_value(&naive), dflash_tau_value(&after), 1e-12);
    dflash_model_destroy(&m);
    dflash_model_destroy(&s);
}

/* a slot filled with the world's batch trains exactly like the world's own view */
static void test_slot_view(world *w) {
    slot_layout l, bad;
    CHECK_EQ_INT(slot_layout_compute(32, 4, D, NF, SLOT_DTYPE_F32, &l), 0);
    CHECK_EQ_INT(slot_layout_compute(32, 4, D, NF + 1, SLOT_DTYPE_F32, &bad), 0);
    void *base = aligned_alloc(SLOT_ALIGN, l.slot_bytes);
    memset(base, 0, l.slot_bytes);
    slot_work_unit wu = {.epoch = 1, .bucket = 2, .batch = 3};
    slot_header_write(base, &l, &wu, 2, T, 77);
    memcpy(slot_seq_offsets(base, &l), w->seq_off, sizeof w->seq_off);
    memcpy(slot_token_ids(base, &l), w->ids, sizeof w->ids);
    memcpy(slot_loss_mask(base, &l), w->loss_mask, sizeof w->loss_mask);
    memcpy(slot_hidden(base, &l), w->hidden, sizeof w->hidden);
    int32_t *pos = slot_positions(base, &l);
    for (int t = 0; t < T; t++)
        pos[t] = t < T0 ? t : t - T0;
    dflash_model *a = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 4);
    dflash_model *b = dflash_model_new(&w->cfg, w->ops, w->ctx, w->embed, w->lm_head, T, 8, 4);
    CHECK(a != NULL && b != NULL);
    if (!a || !b) return;
    dflash_batch_view v;
    char err[256];
    CHECK_EQ_INT(dflash_view_from_slot(a, base, &l, slot_hidden(base, &l), &v, err, sizeof err), 0);
    dflash_metrics ma, mb;
    uint64_t key = dflash_batch_key(&wu);
    CHECK_EQ_INT(dflash_train_step(a, &w->tc, &v, wu.epoch, key, &ma), 0);
    CHECK_EQ_INT(dflash_train_step(b, &w->tc, &w->view, wu.epoch, key, &mb), 0);
    CHECK(ma.loss == mb.loss && ma.n_blocks == mb.n_blocks);
    CHECK(!memcmp(a->master, b->master, a->n_params * sizeof(float)));
    /* arrays that disagree with the header are refused, not trained on: offsets running past
     * its n_tokens (rows a copy of the slot's used bytes does not bring), positions that do not
     * restart per sequence */
    slot_header_write(base, &l, &wu, 2, T - 3, 77);
    CHECK_EQ_INT(dflash_view_from_slot(a, base, &l, slot_hidden(base, &l), &v, err, sizeof err),
                 DFLASH_ECORRUPT);
    printf("offsets past n_tokens: %s\n", err);
    slot_header_write(base, &l, &wu, 2, T, 77);
    pos[T0] = T0;
    CHECK_EQ_INT(dflash_view_from_slot(a, base, &l, slot_hidden(base, &l), &v, err, sizeof err),
                 DFLASH_ECORRUPT);
    printf("positions: %s\n", err);
    pos[T0] = 0;
    slot_header_write(base, &bad, &wu, 2, T, 77);
    CHECK_EQ_INT(dflash_view_from_slot(a, base, &bad, slot_hidden(base, &bad), &v, err, sizeof err),
                 DFLASH_EMISMATCH);
    CHECK(strstr(err, "3 layers") && strstr(err, "2 target layers"));
    dflash_model_destroy(&a);
    dflash_model_destroy(&b);
    free(base);
}

int main(void) {
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    world *w = malloc(sizeof *w);
    world_init(w);
    test_gradients(w);
    test_row_savings(w);
    test_dedup_over_half(w);
    test_env_values(w);
    test_mask(w);
    test_anchors_and_weights(w);
    test_training_reduces_loss(w);
    test_adamw_in_step(w);
    test_mismatch(w);
    test_async_step(w);
    test_accumulate(w);
    test_accumulate_skipped(w);
    test_no_alloc_in_steps(w);
    test_side_stream(w);
    test_checkpoint_checksums(w);
    test_resume_checks_weights(w);
    test_config_fifo();
    test_checkpoint(w);
    test_checkpoint_keep_lowered(w);
    test_checkpoint_keep_incomplete(w);
    test_checkpoint_unacked(w);
    test_checkpoint_world(w);
    test_head_limits(w);
    test_eval(w);
    test_slot_view(w);
    nn_cpu_destroy(&w->ctx);
    free(w);
    CHECK_DONE();
}
