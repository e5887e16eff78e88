/* dflash_eval: offline tau by the trajectory method (see dflash_eval.h).
 *
 * Data: pred [n_anchors, B-1] int32 host array, one row per candidate anchor of every sequence
 * (sequence order, then position), filled chunk by chunk from lm_head_argmax.
 */
#include "dflash_eval.h"

#include "err.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

double dflash_tau_value(const dflash_tau *t) {
    return t->cycles ? (double)t->accepted / (double)t->cycles : 0.0;
}

void dflash_tau_walk(const int32_t *pred, const int32_t *ids, int P, int S, int B,
                     dflash_tau *acc) {
    for (int p = P; p < S - 1;) {
        const int32_t *d = pred + (size_t)(p - P) * (B - 1);
        int a = 0;
        while (a < B - 1 && p + a + 1 < S && d[a] == ids[p + a + 1])
            a++;
        acc->cycles++;
        acc->accepted += a + 1;
        if (a + 1 <= DFLASH_MAX_BLOCK) acc->hist[a + 1]++;
        p += a + 1;
    }
}

static int resp_begin(const dflash_batch_view *b, const int32_t *resp_start, int s) {
    int start = b->seq_off[s], S = b->seq_off[s + 1] - start;
    if (resp_start) return resp_start[s];
    for (int p = 0; p < S; p++)
        if (b->loss_mask[start + p]) return p;
    return S;
}

int dflash_eval_tau(dflash_model *m, const dflash_batch_view *b, const int32_t *resp_start,
                    dflash_tau *acc) {
    int B = m->cfg.block_size;
    dflash_train_cfg tc;
    dflash_train_cfg_default(&tc);
    /* anchors: sequence s, positions P..S-2; pred row k for the k-th anchor overall */
    int n = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int S = b->seq_off[s + 1] - b->seq_off[s], P = resp_begin(b, resp_start, s);
        if (P < 0) return DFLASH_EINVAL;
        if (P < S - 1) n += S - 1 - P;
    }
    if (n == 0) return 0;
    int32_t *pred = malloc((size_t)n * (B - 1) * sizeof(int32_t));
    int32_t *seq = malloc((size_t)n * sizeof(int32_t)), *anc = malloc((size_t)n * sizeof(int32_t));
    int rc = 0;
    if (!pred || !seq || !anc) {
        rc = DFLASH_ENOMEM;
        goto out;
    }
    int k = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int S = b->seq_off[s + 1] - b->seq_off[s], P = resp_begin(b, resp_start, s);
        for (int p = P; p < S - 1; p++)
            seq[k] = s, anc[k] = p, k++;
    }
    for (int k0 = 0; k0 < n; k0 += m->max_blocks) {
        int nb = n - k0 < m->max_blocks ? n - k0 : m->max_blocks;
        if ((rc = dflash_train_build(m, &tc, b, nb, seq + k0, anc + k0, NULL))) goto out;
        dflash_model_forward(m, b->hidden);
        dflash_model_predict(m);
        m->ops->download_raw(m->ctx, m->h_argmax, m->out_argmax, (size_t)nb * B * sizeof(int32_t));
        for (int j = 0; j < nb; j++)
            memcpy(pred + (size_t)(k0 + j) * (B - 1), m->h_argmax + (size_t)j * B + 1,
                   (size_t)(B - 1) * sizeof(int32_t));
    }
    k = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int start = b->seq_off[s], S = b->seq_off[s + 1] - start, P = resp_begin(b, resp_start, s);
        if (P >= S - 1) continue;
        dflash_tau_walk(pred + (size_t)k * (B - 1), b->ids + start, P, S, B, acc);
        k += S - 1 - P;
    }
out:
    free(pred);
    free(seq);
    free(anc);
    return rc;
}
