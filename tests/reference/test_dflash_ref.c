/* test_dflash_ref: the DFlash training step of the cpu backend against the PyTorch oracle
 * (dflash_ref.py, written from reference/dflash.md without our code).
 *
 * Reads the dump (argv[1]): the tiny drafter's config, parameters, frozen embed / lm_head, the
 * packed two-sequence batch and the anchors torch drew. Runs dflash_train_grads on the same
 * anchors and compares the loss and the gradient of every trainable tensor (max rel err
 * <= 1e-4 against torch's float64), then 10 dflash_train_apply steps (AdamW, clipping, warmup +
 * cosine) against torch.optim.AdamW's loss, gradient-norm and learning-rate trajectory, and the
 * parameters after them tensor by tensor (<= 1e-5): the decoupled weight decay on the matrices
 * and none on the norm vectors, which the loss trajectory barely sees.
 * Exits 1 on any mismatch, 2 on a malformed dump.
 */
#include "dflash_model.h"
#include "dflash_train.h"
#include "refdump.h"

#define TOL 1e-4
#define PTOL 1e-5 /* the parameters after the steps (float32 noise: 2e-6) */

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_dflash_ref DUMP\n");
        return 2;
    }
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    refdump *d = refdump_load(argv[1]);
    if (!d) return 2;
    const int32_t *ci = refdump_i32(d, "cfg", 0);
    dflash_config c = {0};
    c.hidden_size = ci[0];
    c.num_heads = ci[1];
    c.num_kv_heads = ci[2];
    c.head_dim = ci[3];
    c.intermediate_size = ci[4];
    c.num_layers = ci[5];
    c.block_size = ci[6];
    c.n_feat = ci[7];
    c.vocab_size = ci[8];
    c.mask_token_id = ci[9];
    c.num_target_layers = ci[10];
    for (int i = 0; i < c.n_feat; i++)
        c.target_layer_ids[i] = ci[11 + i];
    c.rms_norm_eps = refdump_scalar(d, "eps");
    c.rope_theta = refdump_scalar(d, "theta");
    c.max_position_embeddings = 4096;
    c.bos_token_id = c.eos_token_id = -1;
    int D = c.hidden_size, V = c.vocab_size;

    int n_seqs = refdump_dim(d, "seq_off", 0) - 1;
    const int32_t *seq_off = refdump_i32(d, "seq_off", 0);
    int T = seq_off[n_seqs];
    int nb = refdump_dim(d, "blk_anchor", 0);
    const int32_t *ids = refdump_i32(d, "ids", T), *lm32 = refdump_i32(d, "loss_mask", T);
    const int32_t *bs = refdump_i32(d, "blk_seq", nb), *ba = refdump_i32(d, "blk_anchor", nb);
    uint8_t *lm = malloc((size_t)T);
    for (int t = 0; t < T; t++)
        lm[t] = (uint8_t)lm32[t];
    const float *X = refdump_f32(d, "X", (size_t)T * c.n_feat * D);

    nn_ctx *ctx = nn_cpu_new(1);
    const nn_ops *ops = nn_cpu_ops();
    dflash_model *m = dflash_model_new(&c, ops, ctx, refdump_f32(d, "embed", (size_t)V * D),
                                       refdump_f32(d, "lm_head", (size_t)V * D), T, nb, 1);
    if (!m) return 1;
    int bad = 0;
    char name[96];
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        snprintf(name, sizeof name, "p.%s", t->name);
        memcpy(dflash_model_master(m, i), refdump_f32(d, name, t->numel), t->numel * sizeof(float));
    }
    dflash_model_sync_params(m);

    dflash_batch_view view = {.n_seqs = n_seqs,
                              .seq_off = seq_off,
                              .ids = ids,
                              .positions = NULL,
                              .loss_mask = lm,
                              .hidden = X,
                              .ld = (size_t)c.n_feat * D};
    dflash_train_cfg tc;
    dflash_train_cfg_default(&tc);
    tc.gamma = refdump_scalar(d, "gamma");
    dflash_metrics met;
    printf("one step, %d blocks of %d over %d sequences (%d tokens):\n", nb, c.block_size, n_seqs,
           T);
    if (dflash_train_grads(m, &tc, &view, nb, bs, ba, &met)) return 1;
    float loss = (float)met.loss;
    bad += refdump_check(d, "loss", &loss, 1, TOL);
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        snprintf(name, sizeof name, "g.%s", t->name);
        bad += refdump_check(d, name, dflash_model_grad(m, i), t->numel, TOL);
    }

    /* the 10-step trajectory from the same initial parameters (grads left them unchanged) */
    const float *hp = refdump_f32(d, "train.hp", 9);
    tc.lr = hp[0];
    tc.warmup_ratio = hp[1];
    tc.total_steps = (long)hp[2];
    tc.min_lr_ratio = hp[3];
    tc.clip = hp[4];
    tc.weight_decay = hp[5];
    tc.beta1 = hp[6];
    tc.beta2 = hp[7];
    tc.eps = hp[8];
    int n = (int)tc.total_steps;
    float *traj = malloc((size_t)n * 3 * sizeof(float));
    for (int s = 0; s < n; s++) {
        if (dflash_train_grads(m, &tc, &view, nb, bs, ba, &met)) return 1;
        dflash_train_apply(m, &tc, &met);
        traj[s] = (float)met.loss;
        traj[n + s] = (float)met.grad_norm;
        traj[2 * n + s] = (float)met.lr;
    }
    printf("%d AdamW steps: loss %.5f -> %.5f\n", n, traj[0], traj[n - 1]);
    bad += refdump_check(d, "traj.loss", traj, (size_t)n, TOL);
    bad += refdump_check(d, "traj.grad_norm", traj + n, (size_t)n, TOL);
    bad += refdump_check(d, "traj.lr", traj + 2 * n, (size_t)n, 1e-6);
    float *after = malloc(m->n_params * sizeof(float));
    if (dflash_model_masters_download(m, after)) return 1;
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        snprintf(name, sizeof name, "q.%s", t->name);
        bad += refdump_check(d, name, after + t->offset, t->numel, PTOL);
    }
    free(after);
    printf("%s: %d mismatches\n", bad ? "FAIL" : "PASS", bad);
    free(traj);
    free(lm);
    dflash_model_destroy(&m);
    nn_cpu_destroy(&ctx);
    refdump_free(&d);
    return bad ? 1 : 0;
}
