/* dflash_model: the DFlash block-diffusion drafter (reference/dflash.md 1.4, 1.5, 3.3), forward
 * and backward, written once against the ops table (ops.h) so the cuda backend runs the same code.
 *
 * What it computes for one packed batch (Tc context rows, nb blocks of B rows, Q = nb*B):
 *   Z   = X Wfc^T                    X [Tc, nF*D] target features, Z [Tc, D]
 *   Ht  = rmsnorm(Z, hidden_norm)    context features, [Tc, D]
 *   h   = embed[noise_ids]           [Q, D]  (frozen target embedding; MASK row included)
 *   per layer l:
 *     x  = rmsnorm(h, input_layernorm)
 *     q  = rope(rmsnorm_head(x Wq^T, q_norm), block pos)            [Q, H, d]
 *     K  = rope(rmsnorm_head([Ht Wk^T ; x Wk^T], k_norm), [ctx pos ; block pos])   [Tk, Hk, d]
 *     V  = [Ht Wv^T ; x Wv^T]                                       [Tk, Hk, d], Tk = Tc + Q
 *     h += Wo blockattn(q, K, V, spans)                              (mask from nn_block_span)
 *     h += Wdown(silu(Wgate y) * Wup y),  y = rmsnorm(h, post_attention_layernorm)
 *   out = rmsnorm(h, norm); loss through the frozen lm_head with the chunked lm_head_xent op.
 * The K/V buffers are [context rows of all sequences | block rows of all blocks]; the span of
 * block j names its sequence's context rows strictly before the anchor and its own B rows.
 *
 * Memory (llm.c style): a few large allocations, each pointed into from a size table planned once
 * at creation for (max_tokens, max_blocks):
 *   master  fp32 parameters (trainable only), one flat array; the tensor table gives offsets.
 *           Order: all matrices first (weight decay applies), then, from n_decay (a multiple
 *           of 128), all norm vectors (none). Where the ops' master_split is set (cuda) the
 *           matrices' masters are stored split (master_split.h): their high halves are the
 *           act weights in params, their low halves master_lo [n_decay]; master is then NULL
 *           and master_vec, the vectors' fp32 masters, its own array. Read and write the
 *           masters as a whole with dflash_model_masters_download / _upload.
 *   params  act-typed copy used by the ops (cpu: the same memory as master).
 *   adam_m, adam_v   fp32, the layout of master.
 *   grads   the matrices' gradients act-typed (ops.h: cuda bf16, one rounding per product),
 *           [n_decay] elements, then grads_vec, the vectors' fp32 [n_params - n_decay]: one
 *           allocation of grad_bytes, the same offsets as master. On cpu (act fp32) it is one
 *           fp32 array [n_params], as master.
 *   acts    activations and backward scratch (act type), stats (fp32), inputs (int32/spans).
 * Nothing is allocated after dflash_model_new.
 *
 * Threads: one thread (the nn_ctx's thread / stream) uses a model at a time. The embed and
 * lm_head buffers are borrowed from the target and never written.
 * Callers: dflash_train (training step), dflash_eval (offline tau), dflash_ckpt, the tests.
 */
#ifndef DFLASH_NN_DFLASH_MODEL_H
#define DFLASH_NN_DFLASH_MODEL_H

#include "model_config.h"
#include "ops.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DFLASH_MAX_FEAT 64
#define DFLASH_MAX_LAYERS 64

/* The drafter's architecture: what config.json (dflash.md 2.1) holds. Plain data. */
typedef struct dflash_config {
    int hidden_size;                       /* D, must equal the target's */
    int num_layers;                        /* L_d */
    int num_heads;                         /* H */
    int num_kv_heads;                      /* Hk, H % Hk == 0 */
    int head_dim;                          /* d, even */
    int intermediate_size;                 /* F */
    int block_size;                        /* B: 1 anchor + B-1 predicted tokens */
    int n_feat;                            /* nF = len(target_layer_ids) */
    int target_layer_ids[DFLASH_MAX_FEAT]; /* output of target decoder layer k, 0-based */
    int num_target_layers;                 /* target depth */
    int mask_token_id;                     /* row of the target embedding used for MASK */
    int vocab_size;                        /* V, the target's */
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    bool tie_word_embeddings;       /* the target's (informational); config.json always says
                                       false: the drafter owns no embedding or lm_head */
    int bos_token_id, eos_token_id; /* -1 when unknown */
} dflash_config;

/* Fills c for a drafter of num_layers layers and block block_size over target t: D, H, Hk, d, F,
 * V, eps, theta, positions from the target; target_layer_ids by z-lab's rule with n_feat =
 * num_layers (n_feat may be changed afterwards together with the ids); mask_token_id as given. */
void dflash_config_default(dflash_config *c, const model_config *t, int num_layers, int block_size,
                           int mask_token_id);
/* z-lab build_target_layer_ids: n == 1 -> [L/2]; else round(1 + i*(L-4)/(n-1)) (half to even).
 * Writes n ids. Returns 0, or DFLASH_EINVAL for a target too shallow for n > 1 (L < 4). */
int dflash_default_layer_ids(int L, int n, int *ids);
/* Checks the config on its own. Returns 0 or DFLASH_ECONFIG with the reason in msg. */
int dflash_config_validate(const dflash_config *c, char *msg, size_t msglen);
/* Checks that a drafter fits a target whose captured layers are ids[0..n_ids): hidden size,
 * vocabulary, layer ids (count and values), ids below the target depth, mask token inside the
 * vocabulary, and the rope_theta and rms_norm_eps a drafter takes from the target it is trained
 * on (a checkpoint trained on another target of the same shapes differs there). Returns 0 or DFLASH_EMISMATCH with a message naming both values, e.g.
 * "drafter hidden_size 64 does not match target hidden_size 128". */
int dflash_config_check_target(const dflash_config *c, const model_config *t, const int *ids,
                               int n_ids, char *msg, size_t msglen);

/* One trainable tensor of the flat parameter arrays. */
typedef struct dflash_tensor {
    char name[64]; /* checkpoint name (dflash.md 2.2), e.g. "layers.0.self_attn.q_proj.weight" */
    int ndim;      /* 1 or 2 */
    int shape[2];  /* [out, in] for linear weights, [n] for norms */
    size_t offset; /* elements from the start of master / moments / params / grads (matrices;
                      a vector's gradient is at offset - n_decay in grads_vec) */
    size_t numel;
    bool decay; /* weight decay applies (matrices) */
} dflash_tensor;

/* Per-layer tensor kinds, index into dflash_model.t_layer[l][]. */
enum {
    DFL_Q,
    DFL_K,
    DFL_V,
    DFL_O,
    DFL_GATE,
    DFL_UP,
    DFL_DOWN, /* matrices */
    DFL_IN_LN,
    DFL_POST_LN,
    DFL_Q_NORM,
    DFL_K_NORM, /* vectors */
    DFL_N_LAYER_TENSORS
};

/* Saved activations of one layer (pointers into the acts allocation). */
typedef struct dflash_layer_acts {
    nn_buf *xln;             /* [Q, D] input_layernorm output, after Tc_max rows for Ht */
    float *rstd_in;          /* [Q] */
    nn_buf *qraw;            /* [Q, H*d] before q_norm */
    nn_buf *q;               /* [Q, H*d] after q_norm and rope */
    nn_buf *kraw;            /* [Tk, Hk*d] before k_norm (context rows then block rows) */
    nn_buf *k;               /* [Tk, Hk*d] after k_norm and rope */
    nn_buf *v;               /* [Tk, Hk*d] */
    nn_buf *att;             /* [Q, H*d] attention output */
    float *lse;              /* [H, Q] */
    nn_buf *hmid;            /* [Q, D] residual after attention */
    nn_buf *yln;             /* [Q, D] post_attention_layernorm output */
    float *rstd_post;        /* [Q] */
    nn_buf *gu;              /* [Q, 2F]: gate | up per row (one product) */
    nn_buf *act;             /* [Q, F] silu(gate) * up */
} dflash_layer_acts;

typedef struct dflash_model {
    dflash_config cfg;
    const nn_ops *ops;
    nn_ctx *ctx;
    const nn_buf *embed;   /* [V, D] borrowed, frozen */
    const nn_buf *lm_head; /* [V, D] borrowed, frozen */
    int max_tokens;        /* Tc_max: context rows per batch */
    int max_blocks;        /* nb_max: blocks (anchors) per batch */
    int lm_chunk;          /* rows per lm_head chunk */

    /* parameters: the size table and the flat arrays */
    int n_tensors;
    dflash_tensor *tensors;
    int t_fc, t_hidden_norm, t_norm;
    int t_layer[DFLASH_MAX_LAYERS][DFL_N_LAYER_TENSORS];
    size_t n_params, n_decay; /* all; the first n_decay take weight decay (the matrices) */
    float *master;            /* fp32 [n_params] backend memory; NULL where split */
    float *master_vec;        /* the vectors' fp32 masters [n_params - n_decay] */
    uint16_t *master_lo;      /* split: the matrices' low halves [n_decay]; else NULL */
    nn_buf *params;           /* act [n_params]; == master when act_bytes == 4 */
    nn_buf *grads;            /* act [n_decay]: the matrices' gradients, then grads_vec */
    float *grads_vec;         /* fp32 [n_params - n_decay], at grads + n_decay * act_bytes */
    size_t grad_bytes;        /* grads and grads_vec together (one allocation) */
    float *adam_m, *adam_v;
    long step; /* optimizer steps taken */

    /* activations (planned for max shapes) */
    void *acts_mem;
    nn_buf **resid;        /* [L+1] of [Q, D]: resid[l] is layer l's input */
    dflash_layer_acts *la; /* [L] */
    nn_buf *Z, *Ht;        /* [Tc, D] */
    float *rstd_h;         /* [Tc] */
    nn_buf *out;           /* [Q, D] final norm output */
    float *rstd_out;       /* [Q] */
    /* backward scratch */
    nn_buf *dh, *dtmp, *dxln;   /* [Q, D]; dxln after Tc_max rows, dHt's (ctx_rows) */
    nn_buf *datt, *dq, *dqraw;  /* [Q, H*d] */
    nn_buf *dk, *dkraw, *dv;    /* [Tk, Hk*d] */
    nn_buf *dact;               /* [Q, F] */
    nn_buf *dgu;                /* [Q, 2F] dgate | dup */
    nn_buf *dZ;                 /* [Tc, D] */
    nn_buf *lm_scratch;         /* [lm_chunk, V] */
    /* inputs (backend memory), filled by dflash_model_set_inputs */
    int32_t *in_ids;         /* [Q] noise ids */
    int32_t *in_pos;         /* [Tk] context positions then block positions */
    nn_block_span *in_spans; /* [nb] */
    /* the loss rows: rows of weight > 0 (offset 0 of a block and positions past a sequence's
     * end carry none), so the lm_head products skip the rest (1/16 of them at block 16) */
    int32_t *in_loss_rows;   /* [Q] row of the loss row i, ascending */
    int32_t *in_labels;      /* [Q] label of loss row i */
    float *in_weights;       /* [Q] weight of loss row i */
    int32_t *loss_correct;   /* [Q] correct flag of loss row i */
    int32_t *out_correct;    /* [Q] correct flags by row (0 where the weight is 0) */
    int32_t *out_argmax;     /* [Q] */
    float *out_sums;         /* [2] loss_sum, weight_sum */
    float *out_sumsq;        /* [1] */
    float *inv_freq;         /* [d/2] */
    float *rope_rot;         /* [Tk, d] rope_table of in_pos, filled by each forward */
    /* layer 0 on distinct input rows: block rows are [anchor token, MASK x (B-1)], so the rows
     * of resid[0] repeat and layer 0's norm and q, k, v products (forward and backward) run
     * on the U distinct rows only (U <= nb + 1), gathered back to all Q rows after the
     * products; their gradients are summed per distinct row first by a product with a one-hot
     * selection matrix. u_cap: the planned U (0: off: DFLASH_LAYER0_DEDUP=0 or too many
     * blocks). */
    int u_cap;               /* nb_max + 1 rounded up to 8 (aligned rows of sel), or 0 */
    int32_t *in_umap;        /* [Q] distinct row of each block row */
    int32_t *in_uids;        /* [u_cap] token id of each distinct row */
    nn_buf *eye;             /* [u_cap, u_cap] identity (the rows sel gathers) */
    nn_buf *sel;             /* [Q, u_cap] one-hot rows: sel[r, in_umap[r]] = 1 */
    nn_buf *du;              /* [u_cap, H*d + 2*Hk*d] per-row gradient sums of q | k | v */
    int32_t *h_umap, *h_uids, *h_uhash; /* host staging; h_uhash: open addressing, 4 u_cap */
    int cur_u;               /* distinct rows of the inputs set last (0: no dedup this step) */
    /* the last layer on the predicted rows: no loss reads a block's offset-0 row (it holds the
     * anchor's own token), so in a training step (dflash_model_forward_loss) the last layer's
     * o_proj, MLP and the final norm run on the Qc = nb * (B - 1) other rows, gathered
     * (in_rows_c), and the loss reads them at in_loss_rows_c. Off: DFLASH_LAST_LAYER_ROWS=all */
    bool last_rows_ok;       /* allowed (creation) */
    bool last_compact;       /* the forward ran so: the backward follows it */
    int cur_qc;              /* Qc of the inputs set last */
    int32_t *in_rows_c;      /* [Q] block row of compact row i */
    int32_t *in_loss_rows_c; /* [Q] compact row of loss row i */
    int32_t *h_rows_c, *h_loss_rows_c; /* host staging */
    int cur_tc, cur_nb;      /* shape of the inputs set last */
    int cur_loss_rows;       /* their loss rows (0 without weights) */
    /* metrics of queued training steps on their way to the host (dflash_train.c owns them;
     * pending_free releases them with the model) */
    struct dflash_pending *pending;
    void (*pending_free)(struct dflash_model *m);

    /* host staging of one batch (plain malloc), filled by dflash_train and dflash_eval:
     * [Qmax] ids, labels, weights, correct, argmax; [Tc_max + Qmax] pos; [nb_max] spans and
     * per-block sequence / anchor; [Tc_max] candidate scratch */
    int32_t *h_ids, *h_pos, *h_labels, *h_correct, *h_argmax;
    float *h_weights;
    int32_t *h_loss_rows, *h_loss_labels; /* [Qmax] the loss rows' staging */
    float *h_loss_weights;
    nn_block_span *h_spans;
    int32_t *h_blk_seq, *h_blk_anchor, *h_cand;
} dflash_model;

/* Creates a drafter with fresh weights (linear ~ N(0, 0.02) from init_seed, norms 1), grads and
 * moments zero, planned for batches of up to max_tokens context rows and max_blocks blocks.
 * embed and lm_head are the target's [V, D] act-typed buffers, borrowed for the model's life.
 * Returns NULL after logging why (bad config, out of memory). */
dflash_model *dflash_model_new(const dflash_config *cfg, const nn_ops *ops, nn_ctx *ctx,
                               const nn_buf *embed, const nn_buf *lm_head, int max_tokens,
                               int max_blocks, uint64_t init_seed);
void dflash_model_destroy(dflash_model **m);

/* Tensor lookup by checkpoint name; -1 when absent. */
int dflash_model_find(const dflash_model *m, const char *name);
/* Act-typed weight, fp32 master and gradient of tensor i (backend memory). The gradient is
 * act-typed (nn_buf) for a matrix (tensors[i].decay) and fp32 for a vector. The master is NULL
 * for a matrix whose master is split (master_lo). */
nn_buf *dflash_model_weight(const dflash_model *m, int i);
float *dflash_model_master(const dflash_model *m, int i);
void *dflash_model_grad(const dflash_model *m, int i);
/* All fp32 masters as host values dst[n_params], joined where split (waits for the device).
 * 0, or DFLASH_ENOMEM (logged) without host memory for the staging. */
int dflash_model_masters_download(const dflash_model *m, float *dst);
/* Sets all fp32 masters from host src[n_params] (split where the model splits them) and the
 * act copies from them. 0, or DFLASH_ENOMEM (logged; the masters then partly written). */
int dflash_model_masters_upload(dflash_model *m, const float *src);
/* The backend memory that holds the masters exactly, as up to 3 byte ranges (ptr[k], bytes[k]):
 * master; or the matrices' act weights, master_lo and master_vec. Returns the count. For
 * byte-wise copies and hashes of the state (dflash_dp). */
int dflash_model_master_ranges(const dflash_model *m, void *ptr[3], size_t bytes[3]);
/* Tensor i's gradient as fp32 host values dst[numel], whatever its type (ops download or
 * download_raw: waits for the device). For tests, checks and tools. */
void dflash_model_grad_download(const dflash_model *m, int i, float *dst);
/* Refreshes the act copies from the fp32 masters (after writing them directly, e.g. a load;
 * a split master's act weights are its own high halves: nothing to refresh there). */
void dflash_model_sync_params(dflash_model *m);
/* The optimizer's stages on the ops' side stream (ops.h side_begin; dflash_train.c queues
 * them): stage 0 updates the vectors and fc, stage dflash_opt_stage(l) layer l's matrices
 * (layers past NN_SIDE_MARKS - 2 share the last stage). A forward waits for each stage right
 * before it reads that stage's weights, so the update of layer l overlaps the forward of the
 * layers before it. */
static inline int dflash_opt_stage(int l) {
    return l + 1 < NN_SIDE_MARKS - 1 ? l + 1 : NN_SIDE_MARKS - 1;
}
/* Element offset of layer l's first matrix in master (layer l's matrices, padding included,
 * are [this(l), this(l + 1)) ); l = num_layers gives n_decay, the end of the matrices. */
size_t dflash_model_layer_offset(const dflash_model *m, int l);

/* Uploads one batch's host arrays into the model's input buffers: noise_ids[nb*B],
 * pos[Tc + nb*B] (context positions then block positions), spans[nb], and optionally
 * labels[nb*B] and weights[nb*B] (NULL at inference; the loss keeps the rows of weight > 0
 * and their labels). Returns 0 or DFLASH_EINVAL when Tc or nb exceed the planned maxima. */
int dflash_model_set_inputs(dflash_model *m, int Tc, int nb, const int32_t *noise_ids,
                            const int32_t *pos, const nn_block_span *spans, const int32_t *labels,
                            const float *weights);
/* Forward over the inputs set last; X is [Tc, nF*D] act-typed target features (backend memory,
 * rows contiguous). Leaves out [Q, D] and all saved activations. */
void dflash_model_forward(dflash_model *m, const nn_buf *X);
/* Chunked lm_head cross-entropy over the loss rows of out (weight > 0; the others give dh 0 and
 * correct 0) with the labels/weights set last; writes dh and out_sums {sum w*CE, sum w},
 * out_correct. inv_norm scales the gradient (1 / sum w). */
void dflash_model_loss(dflash_model *m, float inv_norm);
/* Backward from dh (set by dflash_model_loss): WRITES every trainable gradient into grads and
 * grads_vec (overwrites them: a step needs no zeroing before; the padding between tensors stays
 * 0).
 * X must be the forward's; the backward follows its rows (dflash_model_forward_loss's). */
void dflash_model_backward(dflash_model *m, const nn_buf *X);
/* A training step's forward and loss: dflash_model_forward then dflash_model_loss, except that
 * the last layer's o_proj, MLP and final norm run on the rows the loss can read (every row but
 * each block's first; see last_rows_ok), so out holds those rows only. dflash_model_backward
 * then follows the same rows. */
void dflash_model_forward_loss(dflash_model *m, const nn_buf *X, float inv_norm);
/* Greedy lm_head argmax of every query row into out_argmax [Q] (backend memory). */
void dflash_model_predict(dflash_model *m);
/* Start-up tuning (cuda: matmul_tune): one forward, loss and backward at the planned maximum
 * shape (max_tokens context rows, max_blocks blocks; synthetic inputs, zero features) with
 * `candidates` algorithms timed for each matmul shape, so that steps of that shape run on the
 * fastest. Weights, moments and step are untouched; the gradients are overwritten (the next
 * step writes its own). Waits for the device. candidates < 2 or cpu: nothing to do. Returns 0,
 * DFLASH_ENOMEM (the zero features) or set_inputs' error. */
int dflash_model_tune(dflash_model *m, int candidates);

#endif
