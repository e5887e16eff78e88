/* synthetic: deterministic slot contents for `dflash-target --model synthetic` and the byte-exact
 * check of `dflash-drafter --verify`, so the data plane is proven before any model exists.
 *
 * Everything in a synthetic slot is a pure function of the work unit (epoch, bucket, batch) and
 * the layout:
 *   sequences  lengths drawn from hash(wu, seq) in [min_seq_len, max_seq_len], packed in order
 *              while they fit the token budget and max_seqs (the first is truncated to fit);
 *   positions  0..len-1 per sequence; token ids hash(wu, token) % vocab_size;
 *   loss mask  0 on the first quarter of each sequence (the "prompt"), 1 after;
 *   hidden     element (token t, layer k, channel c) = hash(wu, t, k, c) mapped to a value exactly
 *              representable in the slot dtype: f32 in [-1, 1) on a 2^-23 grid, bf16 on a
 *              2^-7 grid.
 * So a verifier that knows only the grant's work unit can recompute every byte.
 * Pure functions over host memory; thread-safe. Callers: the target's synthetic producer, the
 * drafter's verify consumer, tests and bench/pipeline.
 */
#ifndef DFLASH_SYNTHETIC_H
#define DFLASH_SYNTHETIC_H

#include "slot.h"

#include <stdint.h>

typedef struct synthetic_params {
    uint32_t vocab_size;  /* > 0 */
    uint32_t min_seq_len; /* >= 1 */
    uint32_t max_seq_len; /* >= min_seq_len */
} synthetic_params;

typedef struct synthetic_report {
    uint32_t n_seqs, n_tokens;
    uint64_t bytes_checked; /* header + arrays + used hidden rows */
    uint64_t bad_bytes;     /* bytes that differ from the expected contents */
    /* first mismatch, when bad_bytes > 0 */
    uint32_t bad_token, bad_layer, bad_channel;
} synthetic_report;

/* The params of bucket `bucket` given the buckets' inclusive upper bounds (ascending): sequence
 * lengths in (upper[bucket-1], upper[bucket]], capped at token_budget. Target and verifier both
 * derive their params this way, so they agree given the same bucket list. */
synthetic_params synthetic_bucket_params(const uint32_t *upper, uint32_t n_buckets,
                                         uint32_t bucket, uint32_t vocab_size,
                                         uint32_t token_budget);

/* Number of tokens and sequences the synthetic batch of wu has under layout l. */
void synthetic_shape(const slot_layout *l, const slot_work_unit *wu, const synthetic_params *sp,
                     uint32_t *n_seqs, uint32_t *n_tokens);

/* Writes the whole synthetic batch of wu (header with producer id, arrays, hidden rows) into the
 * slot at base (host memory). Returns n_tokens (> 0) or DFLASH_EINVAL for bad params. */
int synthetic_fill(void *base, const slot_layout *l, const slot_work_unit *wu,
                   const synthetic_params *sp, uint64_t producer);

/* Checks every byte of a copied slot at base (host memory) against the synthetic batch of
 * expect_wu: the header (slot_header_check, then the work unit: DFLASH_EMISMATCH if the slot holds
 * another batch), the arrays and every used hidden row. Returns 0 or DFLASH_ECORRUPT (with counts
 * in *r and the first problem in err). r and err may be NULL. */
int synthetic_verify(const void *base, const slot_layout *l, const slot_work_unit *expect_wu,
                     const synthetic_params *sp, synthetic_report *r, char *err, size_t err_len);

#endif
