/* dflash_eval: offline acceptance length tau of a drafter (reference/dflash.md 4.2).
 *
 * Input: sequences whose response is the target's own greedy continuation, with the target's
 * captured features for every position (a slot's batch view, or the training capture).
 * For each sequence with response start P (first generated token) the greedy decode loop is
 * replayed without the target: p <- P; block [tok_p, MASK x (B-1)] at positions p..p+B-1 with
 * context rows 0..p-1; d_1..d_{B-1} = argmax of the target lm_head over the drafter's outputs;
 * a = leading run of d_i == tok_{p+i} (only positions inside the sequence can match); record
 * a + 1; p <- p + a + 1; stop when p has no token after it (p >= S - 1).
 * tau = mean(a + 1) over all cycles, in [1, B].
 * The drafter's prediction at p depends only on features < p, tok_p and p, so all candidate
 * anchors P..S-2 are run in masked forwards of up to max_blocks blocks (the training mask), then
 * the trajectory is walked over the stored predictions. Exact for greedy decoding up to numerics.
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
} dflash_tau;

/* mean(a + 1) so far; 0 when no cycle was walked. */
double dflash_tau_value(const dflash_tau *t);

/* Walks one trajectory: pred[(p - P) * (B - 1) + i - 1] is d_i of the block anchored at p,
 * for p in [P, S-2]; ids[0..S) the sequence. Adds its cycles to *acc. */
void dflash_tau_walk(const int32_t *pred, const int32_t *ids, int P, int S, int B, dflash_tau *acc);

/* Adds the trajectories of every sequence of the view to *acc (zero it first; sum many batches
 * into one). resp_start[s] is P of sequence s; NULL: its first position with loss_mask 1
 * (sequences without one are skipped). Returns 0 or a negative code. */
int dflash_eval_tau(dflash_model *m, const dflash_batch_view *b, const int32_t *resp_start,
                    dflash_tau *acc);

#endif
