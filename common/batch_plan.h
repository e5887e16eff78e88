/* batch_plan: the deterministic batch plan (DESIGN.md section 2, docs/formats.md).
 *
 * Input: the length of every sequence (global ids 0..n-1, e.g. from shard_set_lengths), bucket
 * upper bounds (inclusive, ascending), the token budget of a slot, the most sequences per slot
 * and a seed. A sequence belongs to the first bucket whose bound >= its length; longer ones are
 * dropped (counted). For each (epoch, bucket) the bucket's sequences, in ascending id order, are
 * shuffled by Fisher-Yates driven by a counter-based generator (splitmix64 of a key derived from
 * (seed, epoch, bucket) and the step number: no state, same bits on every machine), then packed
 * greedily in that order: a batch is closed when the next sequence would exceed the token budget
 * or the sequence limit. Batch (epoch, bucket, index) is therefore the same on every run.
 * Every kept sequence appears exactly once per epoch.
 *
 * Data structures: per bucket the member ids and their lengths; a one-epoch cache per bucket
 * (permutation + batch start offsets), recomputed when another epoch is asked for. Because of
 * that cache a plan is NOT thread-safe: one plan per thread (they are cheap to build twice).
 * Callers: dflash-queue (counts and shares for work units), dflash-target (materialises a unit).
 */
#ifndef DFLASH_BATCH_PLAN_H
#define DFLASH_BATCH_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define BATCH_PLAN_MAX_BUCKETS 16

typedef struct batch_plan batch_plan;

typedef struct batch_plan_params {
    const uint32_t *bucket_bounds; /* n_buckets inclusive upper bounds, strictly ascending */
    int n_buckets;                 /* 1..BATCH_PLAN_MAX_BUCKETS */
    uint64_t token_budget;         /* >= the largest bound */
    uint32_t max_seqs;             /* most sequences per batch; 0 = no limit */
    uint64_t seed;
} batch_plan_params;

/* The parameters on their own, before any data is read (a daemon's start-up checks): 0, or
 * DFLASH_EINVAL with the reason in err (bad bounds, budget < largest bound). */
int batch_plan_params_check(const batch_plan_params *p, char *err, size_t errlen);

/* The plan's identity: a 64-bit digest of everything that decides which sequences batch
 * (epoch, bucket, index) holds, the parameters (seed, bounds, token budget, max seqs) and the
 * data's identity (shard_set_identity). The target sends it when it registers and the broker
 * refuses a target whose identity is not the journal's; the digest never changes between builds
 * (docs/formats.md). p must pass batch_plan_params_check. */
uint64_t batch_plan_identity(const batch_plan_params *p, uint64_t data_identity);

/* Builds the plan; lens is copied. NULL with the reason in err (batch_plan_params_check's, no
 * sequences, too many sequences for 32-bit ids). */
batch_plan *batch_plan_new(const uint32_t *lens, uint64_t n_seqs, const batch_plan_params *p,
                           char *err, size_t errlen);
void batch_plan_destroy(batch_plan **plan);

int batch_plan_n_buckets(const batch_plan *plan);
/* Bucket of a sequence of length len, or -1 when longer than every bound (or len == 0). */
int batch_plan_bucket_of(const batch_plan *plan, uint32_t len);
/* Sequences and tokens of bucket b, and its share of all kept tokens (0..1; shares sum to 1). */
uint64_t batch_plan_bucket_seqs(const batch_plan *plan, int bucket);
uint64_t batch_plan_bucket_tokens(const batch_plan *plan, int bucket);
double batch_plan_share(const batch_plan *plan, int bucket);
/* Sequences longer than the last bound, left out of every epoch. */
uint64_t batch_plan_dropped(const batch_plan *plan);
/* Upper bound on the sequences of one batch (a safe capacity for batch_plan_get). */
uint32_t batch_plan_max_batch_seqs(const batch_plan *plan);

/* Number of batches of (epoch, bucket); 0 for an empty or invalid bucket. */
uint32_t batch_plan_count(batch_plan *plan, uint32_t epoch, int bucket);
/* Batch (epoch, bucket, index): its sequence ids, in packing order, into ids[0..*n).
 * Returns 0, DFLASH_ERANGE (bucket or index out of range) or DFLASH_EFULL (cap too small).
 * tokens (may be NULL) receives the batch's total length. */
int batch_plan_get(batch_plan *plan, uint32_t epoch, int bucket, uint32_t index, uint32_t *ids,
                   uint32_t cap, uint32_t *n, uint64_t *tokens);

/* Parses "512,1024,2048,3072" into bounds (at most max). Returns the count, or DFLASH_EINVAL
 * with the reason in err (e.g. "more than 16 buckets (at most 16)"). */
int batch_plan_parse_bounds(const char *text, uint32_t *bounds, int max, char *err, size_t errlen);

#endif
