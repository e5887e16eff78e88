/* dflash_logits: our drafter's logits for dflash_logits_check.py, from a checkpoint directory.
 *
 *   dflash_logits CKPT_DIR EMBED_SRC INPUT.bin OUTPUT.bin
 *       Loads CKPT_DIR (config.json + model.safetensors, as dflash_ckpt writes it), the frozen
 *       embed_tokens / lm_head from EMBED_SRC (a target model directory or .safetensors file:
 *       model.embed_tokens.weight and lm_head.weight, tied when the latter is absent; or a
 *       refdump file with "embed" and "lm_head"), the batch from INPUT.bin (refdump: X [T, nF*D],
 *       ids [T], seq_off [n+1], blk_seq / blk_anchor [nb]), runs the drafter forward (training
 *       mask, dflash.md 1.5) and writes refdump OUTPUT.bin: "logits" [nb*B, V] (fp32, host sgemm
 *       over the final-norm outputs) and "argmax" [nb*B] (the lm_head_argmax op).
 *   dflash_logits --make-tiny CKPT_ROOT EMBED.bin
 *       Writes a small random drafter checkpoint under CKPT_ROOT (bf16, as training would) and a
 *       random embed / lm_head refdump, for the CI run of the check. Prints the checkpoint path.
 * Backend: cpu (the only one linked today). Exit 0 on success, 1 on any error (message on stderr).
 */
#include "dflash_ckpt.h"
#include "dflash_model.h"
#include "dflash_train.h"
#include "refdump.h"
#include "safetensors.h"

#include <cblas.h>
#include <stdint.h>

static void put_tensor(FILE *f, const char *name, uint32_t dtype, int ndim, const int64_t *dims,
                       const void *data, size_t numel) {
    uint32_t len = (uint32_t)strlen(name), hdr[2] = {dtype, (uint32_t)ndim};
    fwrite(&len, 4, 1, f);
    fwrite(name, 1, len, f);
    fwrite(hdr, 4, 2, f);
    fwrite(dims, 8, (size_t)ndim, f);
    fwrite(data, 4, numel, f);
}

static int make_tiny(const char *root, const char *embed_path) {
    dflash_config c = {0};
    c.hidden_size = 64;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 128;
    c.block_size = 8;
    c.n_feat = 3;
    c.num_target_layers = 8;
    dflash_default_layer_ids(8, 3, c.target_layer_ids);
    c.vocab_size = 97;
    c.mask_token_id = 96;
    c.max_position_embeddings = 4096;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.bos_token_id = c.eos_token_id = -1;
    size_t VD = (size_t)c.vocab_size * c.hidden_size;
    float *emb = malloc(2 * VD * sizeof(float));
    uint64_t s = 99;
    for (size_t i = 0; i < 2 * VD; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        emb[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    nn_ctx *ctx = nn_cpu_new(1);
    dflash_model *m = dflash_model_new(&c, nn_cpu_ops(), ctx, emb, emb + VD, 64, 8, 7);
    if (!m) return 1;
    /* spread the weights so the check sees more than near-identity layers */
    for (int i = 0; i < m->n_tensors; i++) {
        float *p = dflash_model_master(m, i);
        for (size_t j = 0; j < m->tensors[i].numel; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(s >> 11) / 9007199254740992.0 - 0.5;
            p[j] = m->tensors[i].ndim == 1 ? (float)(1.0 + 0.4 * u) : (float)(0.5 * u);
        }
    }
    dflash_model_sync_params(m);
    m->step = 1;
    dflash_train_cfg tc;
    dflash_train_cfg_default(&tc);
    char path[1024], err[512];
    int rc = dflash_ckpt_save(m, &tc, root, NULL, path, sizeof path, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dflash_logits: %s\n", err);
        return 1;
    }
    FILE *f = fopen(embed_path, "wb");
    if (!f) return 1;
    uint32_t hdr[2] = {REFDUMP_VERSION, 2};
    fwrite(REFDUMP_MAGIC, 1, 8, f);
    fwrite(hdr, 4, 2, f);
    int64_t dims[2] = {c.vocab_size, c.hidden_size};
    put_tensor(f, "embed", REFDUMP_F32, 2, dims, emb, VD);
    put_tensor(f, "lm_head", REFDUMP_F32, 2, dims, emb + VD, VD);
    fclose(f);
    printf("%s\n", path);
    dflash_model_destroy(&m);
    nn_cpu_destroy(&ctx);
    free(emb);
    return 0;
}

/* embed and lm_head [V, D] fp32 from a refdump or a safetensors file / model directory */
static int load_embed(const char *src, int V, int D, float *emb, float *lm) {
    size_t VD = (size_t)V * D;
    size_t n = strlen(src);
    if (n > 4 && !strcmp(src + n - 4, ".bin")) {
        refdump *d = refdump_load(src);
        if (!d) return 1;
        memcpy(emb, refdump_f32(d, "embed", VD), VD * sizeof(float));
        memcpy(lm, refdump_f32(d, "lm_head", VD), VD * sizeof(float));
        refdump_free(&d);
        return 0;
    }
    char err[512];
    safetensors *st = safetensors_open(src, NULL, err, sizeof err);
    if (!st) {
        fprintf(stderr, "dflash_logits: %s\n", err);
        return 1;
    }
    int64_t shp[2] = {V, D};
    int rc = safetensors_load_f32(st, "model.embed_tokens.weight", 2, shp, emb, err, sizeof err);
    if (!rc) {
        if (safetensors_find(st, "lm_head.weight"))
            rc = safetensors_load_f32(st, "lm_head.weight", 2, shp, lm, err, sizeof err);
        else
            memcpy(lm, emb, VD * sizeof(float)); /* tied */
    }
    if (rc) fprintf(stderr, "dflash_logits: %s\n", err);
    safetensors_close(&st);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    setenv("OPENBLAS_NUM_THREADS", "2", 0);
    if (argc == 4 && !strcmp(argv[1], "--make-tiny")) return make_tiny(argv[2], argv[3]);
    if (argc != 5) {
        fprintf(stderr, "usage: dflash_logits CKPT_DIR EMBED_SRC INPUT.bin OUTPUT.bin\n"
                        "       dflash_logits --make-tiny CKPT_ROOT EMBED.bin\n");
        return 1;
    }
    char err[512];
    dflash_config c;
    if (dflash_ckpt_load_config(argv[1], &c, err, sizeof err)) {
        fprintf(stderr, "dflash_logits: %s\n", err);
        return 1;
    }
    int V = c.vocab_size, D = c.hidden_size, B = c.block_size;
    size_t VD = (size_t)V * D;
    float *emb = malloc(VD * sizeof(float)), *lm = malloc(VD * sizeof(float));
    if (!emb || !lm || load_embed(argv[2], V, D, emb, lm)) return 1;
    refdump *in = refdump_load(argv[3]);
    if (!in) return 1;
    int n_seqs = refdump_dim(in, "seq_off", 0) - 1;
    const int32_t *seq_off = refdump_i32(in, "seq_off", 0);
    int T = seq_off[n_seqs], nb = refdump_dim(in, "blk_anchor", 0);
    uint8_t *mask = calloc((size_t)T, 1);
    dflash_batch_view view = {.n_seqs = n_seqs,
                              .seq_off = seq_off,
                              .ids = refdump_i32(in, "ids", T),
                              .positions = NULL,
                              .loss_mask = mask,
                              .hidden = refdump_f32(in, "X", (size_t)T * c.n_feat * D),
                              .ld = (size_t)c.n_feat * D};
    nn_ctx *ctx = nn_cpu_new(2);
    dflash_model *m = dflash_model_new(&c, nn_cpu_ops(), ctx, emb, lm, T, nb, 1);
    if (!m || dflash_ckpt_load_weights(m, argv[1], err, sizeof err)) {
        fprintf(stderr, "dflash_logits: %s\n", m ? err : "cannot create the drafter");
        return 1;
    }
    dflash_train_cfg tc;
    dflash_train_cfg_default(&tc);
    if (dflash_train_build(m, &tc, &view, nb, refdump_i32(in, "blk_seq", nb),
                           refdump_i32(in, "blk_anchor", nb), NULL))
        return 1;
    dflash_model_forward(m, view.hidden);
    dflash_model_predict(m);
    size_t Q = (size_t)nb * B;
    float *logits = malloc(Q * V * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Q, V, D, 1.0f, m->out, D, lm, D, 0.0f,
                logits, V);
    FILE *f = fopen(argv[4], "wb");
    if (!f) return 1;
    uint32_t hdr[2] = {REFDUMP_VERSION, 2};
    fwrite(REFDUMP_MAGIC, 1, 8, f);
    fwrite(hdr, 4, 2, f);
    int64_t d2[2] = {(int64_t)Q, V}, d1[1] = {(int64_t)Q};
    put_tensor(f, "logits", REFDUMP_F32, 2, d2, logits, Q * V);
    put_tensor(f, "argmax", REFDUMP_I32, 1, d1, m->out_argmax, Q);
    if (fclose(f)) return 1;
    free(logits);
    free(mask);
    dflash_model_destroy(&m);
    nn_cpu_destroy(&ctx);
    refdump_free(&in);
    free(emb);
    free(lm);
    return 0;
}
