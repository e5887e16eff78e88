/* dflash_eval: offline tau by the trajectory method (see dflash_eval.h).
 *
 * Data: pred [n_anchors, B-1] int32 host array, one row per candidate anchor of every sequence
 * (sequence order, then position), filled chunk by chunk from lm_head_argmax.
 */
#include "dflash_eval.h"

#include "err.h"
#include "log.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

double dflash_tau_value(const dflash_tau *t) {
    return t->responses ? t->response_tau_sum / (double)t->responses : 0.0;
}

double dflash_tau_pooled(const dflash_tau *t) {
    return t->cycles ? (double)t->accepted / (double)t->cycles : 0.0;
}

void dflash_tau_walk(const int32_t *pred, const int32_t *ids, int b, int e, int B,
                     dflash_tau *acc) {
    long cycles = 0, accepted = 0;
    for (int p = b; p < e - 1;) {
        const int32_t *d = pred + (size_t)(p - b) * (B - 1);
        int a = 0;
        while (a < B - 1 && p + a + 1 < e && d[a] == ids[p + a + 1])
            a++;
        cycles++;
        accepted += a + 1;
        if (a + 1 <= DFLASH_MAX_BLOCK) acc->hist[a + 1]++;
        p += a + 1;
    }
    acc->cycles += cycles;
    acc->accepted += accepted;
    if (cycles) {
        acc->responses++;
        acc->response_tau_sum += (double)accepted / (double)cycles;
    }
}

int dflash_tau_walk_spans(const int32_t *pred, const int32_t *ids, const uint8_t *lm, int S, int B,
                          dflash_tau *acc) {
    int rows = 0;
    for (int b = 0; b < S;) {
        if (!lm[b]) {
            b++;
            continue;
        }
        int e = b + 1;
        while (e < S && lm[e])
            e++;
        /* the span's candidate anchors are b..e-2, consecutive rows of pred */
        dflash_tau_walk(pred + (size_t)rows * (B - 1), ids, b, e, B, acc);
        rows += e - 1 - b;
        b = e;
    }
    return rows;
}

int dflash_eval_tau(dflash_model *m, const dflash_batch_view *b, dflash_tau *acc,
                    int (*after_chunk)(void *user, int done, int n_chunks), void *user) {
    int B = m->cfg.block_size;
    dflash_train_cfg tc;
    dflash_train_cfg_default(&tc);
    /* every candidate anchor of every sequence; pred row k for the k-th overall */
    int n = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int start = b->seq_off[s], S = b->seq_off[s + 1] - start;
        for (int p = 0; p < S; p++)
            n += dflash_anchor_candidate(b->loss_mask + start, p, S);
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
        int start = b->seq_off[s], S = b->seq_off[s + 1] - start;
        for (int p = 0; p < S; p++)
            if (dflash_anchor_candidate(b->loss_mask + start, p, S)) seq[k] = s, anc[k] = p, k++;
    }
    int n_chunks = (n + m->max_blocks - 1) / m->max_blocks;
    for (int k0 = 0; k0 < n; k0 += m->max_blocks) {
        int nb = n - k0 < m->max_blocks ? n - k0 : m->max_blocks;
        if ((rc = dflash_train_build(m, &tc, b, nb, seq + k0, anc + k0, NULL))) goto out;
        dflash_model_forward(m, b->hidden);
        dflash_model_predict(m);
        m->ops->download_raw(m->ctx, m->h_argmax, m->out_argmax, (size_t)nb * B * sizeof(int32_t));
        for (int j = 0; j < nb; j++)
            memcpy(pred + (size_t)(k0 + j) * (B - 1), m->h_argmax + (size_t)j * B + 1,
                   (size_t)(B - 1) * sizeof(int32_t));
        if (after_chunk && after_chunk(user, k0 / m->max_blocks + 1, n_chunks)) {
            rc = DFLASH_ESHUTDOWN;
            goto out;
        }
    }
    k = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int start = b->seq_off[s], S = b->seq_off[s + 1] - start;
        k += dflash_tau_walk_spans(pred + (size_t)k * (B - 1), b->ids + start, b->loss_mask + start,
                                   S, B, acc);
    }
    assert(k == n); /* the walk's spans hold exactly the anchor candidates counted above */
out:
    free(pred);
    free(seq);
    free(anc);
    return rc;
}
