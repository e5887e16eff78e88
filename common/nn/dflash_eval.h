/* dflash_eval: offline acceptance length tau of a drafter (reference/dflash.md 4.2).
 *
 * Input: sequences whose responses (the maximal spans of loss_mask 1: one per assistant reply,
 * its end-of-turn token included, scripts/chat_to_jsonl.py; one to the end in dflash-gen's
 * data) are the target's own greedy continuation, with the target's captured features for every
 * position (a slot's batch view, or the training capture).
 * Each response span [b, e) is one greedy decode, replayed without the target: p <- b; block
 * [tok_p, MASK x (B-1)] at positions p..p+B-1 with context rows 0..p-1 (the turns before
 * included); d_1..d_{B-1} = argmax of the target lm_head over the drafter's outputs;
 * a = leading run of d_i == tok_{p+i}, only positions inside the span can match (decoding ends
 * at the span's end-of-turn token: nothing after it is accepted); record a + 1; p <- p + a + 1;
 * stop when p has no token of its span after it (p >= e - 1). Prompts, user turns and any other
 * loss_mask 0 position are never drafted.
 * tau (reference/dflash.md 4.1, z-lab's benchmark): each response's mean of a + 1 over its
 * cycles, then the mean over responses, in [1, B]; the pooled mean over all cycles (long
 * responses weigh more) is kept beside it, as is the pooled histogram.
 * The drafter's prediction at p depends only on features < p, tok_p and p, so all candidate
 * anchors (dflash_anchor_candidate: p and p + 1 in one span) are run in masked forwards of up
 * to max_blocks blocks (the training mask), then the trajectories are walked over the stored
 * predictions. Exact for greedy decoding up to numerics.
 *
 * Threads: the model's thread. Allocates host scratch per call (eval is not the hot loop).
 * Callers: `dflash-drafter eval`, the demo's before/after report, the tests.
 */
#ifndef DFLASH_NN_DFLASH_EVAL_H
#define DFLASH_NN_DFLASH_EVAL_H

#include "dflash_model.h"
#include "dflash_train.h"

#include <stdint.h>

typedef struct dflash_tau {
    long cycles;                     /* draft cycles walked */
    long accepted;                   /* sum of (a + 1) over cycles */
    long hist[DFLASH_MAX_BLOCK + 1]; /* hist[k]: cycles with a + 1 == k */
    long responses;                  /* response spans with at least one cycle */
    double response_tau_sum;         /* sum over them of their own mean(a + 1) */
} dflash_tau;

/* tau so far: the mean over responses of each one's mean(a + 1); 0 when no cycle was walked. */
double dflash_tau_value(const dflash_tau *t);
/* mean(a + 1) over all cycles pooled; 0 when no cycle was walked. */
double dflash_tau_pooled(const dflash_tau *t);

/* Walks one trajectory over the span [b, e) of a sequence (one response):
 * pred[(p - b) * (B - 1) + i - 1] is d_i of the block anchored at p, for p in [b, e-2]; ids the
 * sequence (ids[b..e) read). Adds its cycles, and the response when it has one, to *acc. */
void dflash_tau_walk(const int32_t *pred, const int32_t *ids, int b, int e, int B, dflash_tau *acc);

/* Walks every response span of one sequence of S tokens (ids, loss mask lm): pred holds one
 * row of B - 1 drafted tokens per candidate anchor (dflash_anchor_candidate) in position
 * order. Adds the cycles to *acc; returns the number of rows read. */
int dflash_tau_walk_spans(const int32_t *pred, const int32_t *ids, const uint8_t *lm, int S, int B,
                          dflash_tau *acc);

/* Adds the trajectories of every response span of every sequence of the view to *acc (zero it
 * first; sum many batches into one). Sequences without a span of two tokens add no cycle.
 * The candidate anchors are drafted in chunks of the model's max_blocks; after_chunk (may be
 * NULL) is called with user after each (done of n_chunks), so that a long evaluation reports
 * progress and honours a stop: non-zero abandons the view, adding nothing to *acc.
 * Returns 0, DFLASH_ESHUTDOWN when after_chunk abandoned it, or a negative code. */
int dflash_eval_tau(dflash_model *m, const dflash_batch_view *b, dflash_tau *acc,
                    int (*after_chunk)(void *user, int done, int n_chunks), void *user);

#endif
