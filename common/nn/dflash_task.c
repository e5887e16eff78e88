/* dflash_task: see dflash_task.h. */
#include "dflash_task.h"

#include "rng_fill.h"

#include <math.h>
#include <stdlib.h>

int dflash_task_config(dflash_config *c, int D, int layers, int H, int HK, int F, int NF, int V,
                       char *msg, size_t msglen) {
    *c = (dflash_config){0};
    c->hidden_size = D, c->num_layers = layers, c->num_heads = H, c->num_kv_heads = HK;
    c->head_dim = H > 0 ? D / H : 0, c->intermediate_size = F, c->block_size = 16;
    c->n_feat = NF, c->num_target_layers = 36;
    if (NF < 1 || NF > DFLASH_MAX_FEAT ||
        dflash_default_layer_ids(c->num_target_layers, NF, c->target_layer_ids) != 0)
        c->n_feat = 0; /* dflash_config_validate names it */
    c->mask_token_id = V > 151669 ? 151669 : V - 1, c->vocab_size = V;
    c->max_position_embeddings = 40960, c->rms_norm_eps = 1e-6, c->rope_theta = 1e6;
    c->bos_token_id = c->eos_token_id = -1;
    return dflash_config_validate(c, msg, msglen);
}

void dflash_task_tokens(int n_seqs, int S, int V, int32_t *seq_off, int32_t *ids,
                        int32_t *positions, uint8_t *loss_mask) {
    int64_t M = V - 64 < 151000 ? V - 64 : 151000;
    if (M < 1) M = 1; /* V <= 64: every id 0 (the header asks for V > 64) */
    seq_off[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        seq_off[s + 1] = seq_off[s] + S;
        for (int t = 0; t < S; t++) {
            int64_t g = (int64_t)s * S + t;
            ids[g] = (int32_t)(g * 7919 % M);
            if (positions) positions[g] = t;
            loss_mask[g] = t >= DFLASH_TASK_PROMPT;
        }
    }
}

double dflash_task_lm_sd(int D) { return 1.28 / sqrt((double)D); }

void *dflash_task_table(const nn_ops *ops, nn_ctx *ctx, uint64_t *rs, size_t n, double scale,
                        int normal) {
    void *p = ops->alloc(ctx, n * ops->act_bytes);
    if (!p) return NULL;
    const size_t chunk = (size_t)1 << 26; /* even, so chunks keep the pairs of one draw */
    float *h = malloc((n < chunk ? n : chunk) * sizeof(float));
    if (!h) {
        ops->free(ctx, p);
        return NULL;
    }
    for (size_t o = 0; o < n; o += chunk) {
        size_t m = n - o < chunk ? n - o : chunk;
        rng_fill(rs, h, m, scale, normal ? RNG_FILL_NORMAL : RNG_FILL_UNIFORM);
        ops->upload(ctx, (char *)p + o * ops->act_bytes, h, m);
    }
    ops->sync(ctx);
    free(h);
    return p;
}
