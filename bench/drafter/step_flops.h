/* step_flops: the FLOPs of one DFlash training step as the step ran it, from the model's
 * config and the batch it was last given (blocks and their anchors, layer 0's distinct rows,
 * the loss rows, the last layer's compaction). One formula for bench-drafter and
 * bench-cuda_ops' step row (its terms are listed in bench/drafter/main.c's header). Call it
 * after the step's forward was queued (dflash_train_step or _async) and before the next. */
#ifndef DFLASH_BENCH_STEP_FLOPS_H
#define DFLASH_BENCH_STEP_FLOPS_H

#include "dflash_model.h"

static inline double dflash_step_flops(const dflash_model *m, int T) {
    const dflash_config *c = &m->cfg;
    const double D = c->hidden_size, H = c->num_heads, HK = c->num_kv_heads, HD = c->head_dim;
    const double FF = c->intermediate_size, NF = c->n_feat, V = c->vocab_size;
    const double BS = c->block_size, layers = c->num_layers;
    const int nb = m->cur_nb;
    double keys = 0; /* the visible keys of every block row: the context before it, its block */
    for (int j = 0; j < nb; j++)
        keys += BS * (m->h_blk_anchor[j] + BS);
    double Q = nb * BS;
    double per_row = D * H * HD + 2.0 * D * HK * HD + H * HD * D + 3.0 * D * FF;
    /* layer 0's block q, k, v run on its U distinct rows, plus the one-hot sums */
    double qkv_row = D * H * HD + 2.0 * D * HK * HD, U = m->cur_u ? m->cur_u : Q;
    double flop = 6.0 * Q * per_row * layers + 6.0 * T * 2.0 * D * HK * HD * layers +
                  4.0 * T * NF * D * D + 12.0 * H * HD * keys * layers +
                  4.0 * m->cur_loss_rows * D * V - 6.0 * (Q - U) * qkv_row +
                  (m->cur_u ? 2.0 * Q * m->u_cap * (H + 2.0 * HK) * HD : 0.0);
    /* the last layer's o_proj and MLP on the Qc rows the loss reads */
    if (m->last_compact) flop -= 6.0 * (Q - m->cur_qc) * (H * HD * D + 3.0 * D * FF);
    return flop;
}

#endif
