/* dflash_anchor: which positions of a training sequence can anchor a DFlash block
 * (reference/dflash.md 3.2). One rule, read by every place that asks: the training samples its
 * anchors among these candidates (dflash_train), eval walks from them (dflash_eval), and the
 * data checks refuse data with none (dflash-data, shard_set_verify_tokens in the target).
 * A sequence without a candidate trains nothing: every loss_mask 0, or loss tokens that never
 * come two in a row (alternating masks, one-token replies).
 * Header-only, pure functions of the mask; any thread.
 */
#ifndef DFLASH_ANCHOR_H
#define DFLASH_ANCHOR_H

#include <stdbool.h>
#include <stdint.h>

/* Whether position p of a sequence of S tokens with loss mask lm is a candidate anchor: p and
 * the token after it are both response tokens, so a block anchored at p drafts inside p's
 * response span. */
static inline bool dflash_anchor_candidate(const uint8_t *lm, int p, int S) {
    return p + 1 < S && lm[p] && lm[p + 1];
}

/* Whether any position of the S-token loss mask lm is a candidate anchor. */
static inline bool dflash_anchor_any(const uint8_t *lm, int S) {
    for (int p = 0; p + 1 < S; p++)
        if (dflash_anchor_candidate(lm, p, S)) return true;
    return false;
}

#endif
