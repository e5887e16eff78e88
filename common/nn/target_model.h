/* target_model: the frozen target LLM (Qwen3, Qwen2, Llama) written once against the ops table.
 *
 * What it computes (HF semantics, pre-norm decoder):
 *   h = embed_tokens[ids]                                            [T, D]
 *   for layer k < n_run:
 *     x = rmsnorm(h, input_layernorm)
 *     q = x Wq^T (+bq) [T,H,d]; k = x Wk^T (+bk) [T,Hk,d]; v = x Wv^T (+bv) [T,Hk,d]
 *     Qwen3: q = rmsnorm_per_head(q, q_norm); k = rmsnorm_per_head(k, k_norm)
 *     q, k = rope(q, k, pos)        (rotate_half; Llama-3 scaling folded into inv_freq)
 *     h = h + causal_gqa_attention(q, k, v over packed sequences) Wo^T
 *     h = h + down(silu(gate(y)) * up(y)),  y = rmsnorm(h, post_attention_layernorm)
 *     if k is captured (list index j): out_hidden[t, j*D : (j+1)*D] = h[t]   (row stride out_ld)
 *   logits (target_logits only): rmsnorm(h, model.norm) lm_head^T over chosen rows.
 * A captured id k is the output of decoder layer k, 0-based: HF output_hidden_states[k + 1]
 * (reference/dflash.md 1.3). The forward stops after the deepest captured layer.
 *
 * Memory: parameters are one backend allocation pointed into from a size table (tied
 * embeddings share one tensor); activations are one allocation planned at creation for
 * max_tokens tokens (per-layer scratch reused by every layer, O(T*(D+F)) elements; attention
 * memory is the backend's business and linear in T on cpu). A generation model (all_layers and
 * max_logit_rows > 0) also plans a KV cache of max_tokens rows per layer for target_generate.
 * Nothing is allocated in a forward.
 *
 * Threads: a model is used by one thread at a time (its nn_ctx's thread / stream). Weights are
 * read-only after creation, so the drafter may borrow embed_tokens and lm_head (see accessors).
 */
#ifndef DFLASH_TARGET_MODEL_H
#define DFLASH_TARGET_MODEL_H

#include "model_config.h"
#include "ops.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct target_model target_model;

#define TARGET_MAX_CAPTURE 64

typedef struct target_model_opts {
    /* Captured layers, in output column order. NULL: DFlash's default rule for drafter_layers
     * features (target_default_layer_ids). */
    const int *layer_ids;
    int n_layer_ids;
    int drafter_layers; /* number of features for the default rule (>= 1) when layer_ids NULL */
    int max_tokens;     /* T_max: largest packed batch target_forward accepts (>= 1) */
    int max_seqs;       /* largest n_seqs of target_forward_host (0: max_tokens) */
    int max_logit_rows; /* rows per target_logits call; 0: no logits (lm_head still loaded) */
    bool all_layers;    /* keep every decoder layer (needed by target_logits / generate) */
    bool no_head;       /* skip model.norm and lm_head (a capture-only target daemon saves V*D) */
    /* What the load is for, said by its log line instead of the layers it runs and captures
     * (NULL: those): "the drafter's embeddings and lm_head" of a load that only lends them. */
    const char *lends;
    /* A daemon's stop flag (may be NULL): once it is set, loading gives up before the next
     * tensor and creation returns NULL, so SIGINT/SIGTERM do not wait for a large checkpoint. */
    volatile sig_atomic_t *stop;
    /* Called after each decoder layer of target_forward and target_logits, and after each step
     * of target_generate with a KV cache (its prefill, each token: done == n_layers), on their
     * thread (may be NULL): a caller whose forward takes long (eval of a real target on the
     * cpu, dflash-gen) reports progress there and checks its stop flag. done of n_layers
     * layers have run (on the cuda backend their work may still be queued). Non-zero abandons
     * the forward (or the generation), which then returns DFLASH_ESHUTDOWN, its output
     * incomplete. */
    int (*after_layer)(void *user, int done, int n_layers);
    void *after_layer_user;
} target_model_opts;

/* Fills dst[numel(shape)] (fp32, host) with tensor `name` after checking that it exists and has
 * exactly shape[0..ndim). Returns 0 or a negative code after logging file, tensor and the
 * expected versus actual shape. */
typedef int (*target_tensor_fn)(void *user, const char *name, const int64_t *shape, int ndim,
                                float *dst);

/* DFlash's rule (z-lab build_target_layer_ids, computed by hf_config_dflash_layers): n == 1 ->
 * [L/2]; else start 1, end L-3, id_i = round(1 + i*(L-4)/(n-1)) with Python's round (half to
 * even). Writes n ids.
 * Returns 0, or DFLASH_EINVAL when n < 1, n > TARGET_MAX_CAPTURE, or the ids are not distinct
 * and inside [0, L) (very shallow targets: give the ids explicitly). */
int target_default_layer_ids(int L, int n, int *ids);

/* Checks what captured ids given by hand need whatever the target: ascending, none twice. The
 * features are the captured layers' outputs in list order, and SGLang and vLLM capture them as
 * the target's layers run, i.e. in layer order: a drafter trained on another order would be
 * served with its features permuted. Returns 0, or DFLASH_ECONFIG with the reason in err (may
 * be NULL). */
int target_layer_ids_check_order(const int *ids, int n, char *err, size_t errlen);

/* Checks captured ids given by hand against an L-layer target: 1..TARGET_MAX_CAPTURE of them,
 * target_layer_ids_check_order, each in [0, L). Returns 0, or DFLASH_ECONFIG with the reason in
 * err (may be NULL). dflash-target calls it on the target's config.json before the load (a bad
 * list is bad configuration, found before minutes of loading); target_model_load applies it
 * too. */
int target_layer_ids_check(const int *ids, int n, int L, char *err, size_t errlen);

/* A --capture-layers value s (dflash-target, dflash-drafter, its eval): the ids,
 * comma-separated ("" gives none: DFlash's rule applies), into ids[0..max), checked with
 * target_layer_ids_check_order. Every program taking the flag calls it in its check of the
 * options, before any model is read. Returns the count, or a negative code with the reason in
 * err (which does not name the option: the caller says where s came from). */
int target_capture_layers_parse(const char *s, int *ids, int max, char *err, size_t errlen);

/* The inverse: ids[0..n) as a --capture-layers value ("1,9,17") into buf (cut to len); returns
 * buf. For logs, dumps and shape texts. */
char *target_layer_ids_text(const int *ids, int n, char *buf, size_t len);

/* Builds a model for cfg on the backend, reading every parameter through fetch(user, ...).
 * Returns NULL after logging why (bad opts, shape mismatch, a weight that is NaN or infinite,
 * out of memory). */
target_model *target_model_new(const model_config *cfg, const target_model_opts *opts,
                               const nn_ops *ops, nn_ctx *ctx, target_tensor_fn fetch, void *user);

/* Loads a Hugging Face directory: config.json and model.safetensors or a sharded
 * model.safetensors.index.json. Tensors of any supported dtype are converted to fp32 and
 * uploaded as the backend's act type. Returns NULL after logging file, tensor and problem (also
 * a tensor holding a NaN or an infinity). */
target_model *target_model_load(const char *dir, const target_model_opts *opts, const nn_ops *ops,
                                nn_ctx *ctx);

void target_model_destroy(target_model **m);

const model_config *target_model_config(const target_model *m);
/* Captured ids in column order; *n receives the count. Borrowed, valid while m lives. */
const int *target_model_layer_ids(const target_model *m, int *n);
int target_model_max_tokens(const target_model *m);
/* Frozen shared tensors the drafter borrows: embed_tokens [V, D] and lm_head [V, D] (the same
 * buffer when tie_word_embeddings). Backend memory of act type, valid while m lives. lm_head
 * and final_norm are NULL with opts.no_head. */
const nn_buf *target_model_embed_tokens(const target_model *m);
const nn_buf *target_model_lm_head(const target_model *m);
/* Final norm weight [D] (act type). */
const nn_buf *target_model_final_norm(const target_model *m);

/* Runs the forward over T packed tokens and writes each captured layer's output into
 * out_hidden[t * out_ld + j * D + c] (act type, backend memory; out_ld >= n_capture * D).
 * ids[T], pos[T], seq_off[n_seqs + 1] are backend memory (e.g. the slot's own arrays):
 * sequence s is tokens [seq_off[s], seq_off[s+1]), seq_off[0] = 0, seq_off[n_seqs] = T.
 * Attention is causal within each sequence only. Returns 0, DFLASH_EINVAL when T is not in
 * [1, max_tokens] or n_seqs < 1, or DFLASH_ESHUTDOWN when opts.after_layer abandoned it. Token
 * ids must be < vocab (the caller validates them). */
int target_forward(target_model *m, const int32_t *ids, const int32_t *pos, const int32_t *seq_off,
                   int n_seqs, int T, nn_buf *out_hidden, size_t out_ld);

/* Same, with ids, pos and seq_off on the host: they are validated (ids in [0, V), offsets
 * increasing, n_seqs <= max_seqs) and uploaded into the model's own index buffers first. */
int target_forward_host(target_model *m, const int32_t *ids, const int32_t *pos,
                        const int32_t *seq_off, int n_seqs, int T, nn_buf *out_hidden,
                        size_t out_ld);

/* Full-depth forward (needs opts.all_layers), then final norm and lm_head on the token rows
 * rows[0..n_rows) (host indices into the packed batch; n_rows <= max_logit_rows). logits
 * [n_rows, V] are written to the host as fp32. Host ids/pos/seq_off as target_forward_host.
 * Returns 0 or a negative code. */
int target_logits(target_model *m, const int32_t *ids, const int32_t *pos, const int32_t *seq_off,
                  int n_seqs, int T, const int32_t *rows, int n_rows, float *logits);

/* Extends n_seqs host sequences in place. seqs[s] has room for cap[s] tokens and holds
 * len[s] >= 1 on entry; len[s] grows until max_new tokens were added, one of the n_eos ids
 * eos[] was emitted (it is kept) or cap[s] is reached. temperature <= 0: greedy (lowest id wins
 * ties); otherwise sampling from softmax(logits / temperature) with a splitmix64 stream seeded by
 * *rng. With room for a KV cache (sum of cap[s] <= max_tokens) it runs one prefill and then one
 * token per sequence per step; otherwise it recomputes the whole batch for every token (the total
 * current length must then fit max_tokens). Needs all_layers and max_logit_rows >= n_seqs.
 * Returns 0 or a negative code. */
int target_generate(target_model *m, int32_t **seqs, int *len, const int *cap, int n_seqs,
                    int max_new, const int32_t *eos, int n_eos, float temperature, uint64_t *rng);

#endif
