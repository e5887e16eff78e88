/* dflash_task: the synthetic training task that bench-drafter, bench-cuda_ops's drafter step,
 * `bench-cuda_parity learn` and test_dflash_learns train on, and that
 * bench/drafter/torch_drafter_bench.py draws the same way for PyTorch. One definition, so that
 * what the learning checks prove is what the benchmarks time.
 *
 * The task: a Qwen3-style drafter (block 16, RMSNorm eps 1e-6, RoPE theta 1e6, the target's
 * layers chosen by z-lab's rule over a 36-layer target: 1, 9, 17, 25, 33 for five features);
 * token g of the batch is g * 7919 mod M with M = min(151000, V - 64), so a block's labels
 * follow from its anchor and a drafter can learn them; a 64-token prompt (loss mask 0) at the
 * start of each sequence; target features uniform in [-1, 1); embeddings normal with sd 0.05;
 * the lm_head normal with sd 1.28 / sqrt(D) (0.02 at D 4096, rows of norm ~1.28 at any D, so the
 * logits can grow large enough for a low loss); the drafter's own N(0, 0.02) init.
 *
 * Tables are drawn by rng_fill (rng.h's stream, on several threads, the values of drawing them one
 * by one), so the same starting state gives the same table on every backend (the cpu twin of
 * `learn` relies on it), and the Qwen3-8B tables (2 x 622 M values) take seconds.
 */
#ifndef DFLASH_NN_DFLASH_TASK_H
#define DFLASH_NN_DFLASH_TASK_H

#include "dflash_model.h"
#include "ops.h"

#include <stddef.h>
#include <stdint.h>

#define DFLASH_TASK_PROMPT 64  /* tokens of each sequence with loss mask 0 */
#define DFLASH_TASK_EMBED_SD 0.05 /* the embeddings' standard deviation */

/* The drafter of the task: hidden size D, `layers` layers, H / HK heads (head_dim D / H), MLP
 * width F, NF target features, vocabulary V (MASK: Qwen3's 151669 where V holds it, else V - 1).
 * Returns 0, or DFLASH_ECONFIG with the reason in msg (dflash_config_validate). */
int dflash_task_config(dflash_config *c, int D, int layers, int H, int HK, int F, int NF, int V,
                       char *msg, size_t msglen);

/* The token ids of n_seqs packed sequences of S tokens each over vocabulary V > 64: seq_off
 * [n_seqs + 1], ids [n_seqs * S], positions (NULL: not wanted) 0 .. S - 1 per sequence,
 * loss_mask 0 on each sequence's first DFLASH_TASK_PROMPT tokens and 1 after. */
void dflash_task_tokens(int n_seqs, int S, int V, int32_t *seq_off, int32_t *ids,
                        int32_t *positions, uint8_t *loss_mask);

/* The lm_head's standard deviation at hidden size D: 1.28 / sqrt(D). */
double dflash_task_lm_sd(int D);

/* n values of stream *rs as a new act-typed buffer of backend ops: normal with sd `scale`
 * (normal != 0) or uniform in [-scale, scale), rng_fill's values (RNG_FILL_NORMAL or _UNIFORM),
 * *rs advanced past them; drawn and uploaded in chunks.
 * Returns the buffer (free it with ops->free), or NULL when the backend cannot allocate it. */
void *dflash_task_table(const nn_ops *ops, nn_ctx *ctx, uint64_t *rs, size_t n, double scale,
                        int normal);

#endif
