/* batch_plan: seeded per-epoch permutation of each bucket, greedy packing to the token budget.
 *
 * Data structures (see batch_plan.h for the contract): per bucket, members[] (sequence ids in
 * ascending order) and lens[] (their lengths, same order); a cache {epoch, perm[], starts[],
 * n_batches} holding the packing of the last epoch asked for. perm[] is a permutation of
 * positions into members[]; batch k covers perm[starts[k] .. starts[k+1]).
 *
 * The generator: key = mix(mix(mix(seed) ^ epoch) ^ (bucket + 1) * C), step i draws
 * mix(key + (i + 1) * golden) and maps it to [0, i] with a 128-bit multiply-high. Only integer
 * arithmetic, so the plan is bit-identical everywhere. Not thread-safe (the cache).
 */
#include "batch_plan.h"
#include "rng.h"

#include "err.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bucket {
    uint32_t *members, *lens; /* n each */
    uint32_t n;
    uint64_t tokens;
    /* cache of one epoch */
    bool cached;
    uint32_t epoch;
    uint32_t *perm;   /* n */
    uint32_t *starts; /* n_batches + 1 */
    uint32_t n_batches;
} bucket;

struct batch_plan {
    batch_plan_params p;
    uint32_t bounds[BATCH_PLAN_MAX_BUCKETS];
    bucket b[BATCH_PLAN_MAX_BUCKETS];
    uint64_t total_tokens, dropped;
};

int batch_plan_bucket_of(const batch_plan *plan, uint32_t len) {
    if (!plan || len == 0) return -1;
    for (int i = 0; i < plan->p.n_buckets; i++)
        if (len <= plan->bounds[i]) return i;
    return -1;
}

uint64_t batch_plan_identity(const batch_plan_params *p, uint64_t data_identity) {
    uint64_t h = rng_hash64_fold(0x6466706c616e3100ull /* "dfplan1" */, p->seed);
    h = rng_hash64_fold(h, (uint64_t)p->n_buckets);
    for (int b = 0; b < p->n_buckets; b++) h = rng_hash64_fold(h, p->bucket_bounds[b]);
    h = rng_hash64_fold(h, p->token_budget);
    h = rng_hash64_fold(h, p->max_seqs);
    return rng_hash64_fold(h, data_identity);
}

int batch_plan_params_check(const batch_plan_params *p, char *err, size_t errlen) {
    if (!p || p->n_buckets < 1 || p->n_buckets > BATCH_PLAN_MAX_BUCKETS || !p->bucket_bounds) {
        err_fmt(err, errlen, "batch plan: need 1..%d buckets", BATCH_PLAN_MAX_BUCKETS);
        return DFLASH_EINVAL;
    }
    for (int i = 0; i < p->n_buckets; i++)
        if (p->bucket_bounds[i] == 0 || (i && p->bucket_bounds[i] <= p->bucket_bounds[i - 1])) {
            err_fmt(err, errlen, "batch plan: bucket bounds must be positive and strictly ascending");
            return DFLASH_EINVAL;
        }
    if (p->token_budget < p->bucket_bounds[p->n_buckets - 1]) {
        err_fmt(err, errlen,
             "batch plan: token budget %llu is smaller than the largest bucket bound %u: such "
             "sequences would not fit a slot",
             (unsigned long long)p->token_budget, p->bucket_bounds[p->n_buckets - 1]);
        return DFLASH_EINVAL;
    }
    return 0;
}

batch_plan *batch_plan_new(const uint32_t *lens, uint64_t n_seqs, const batch_plan_params *p,
                           char *err, size_t errlen) {
    if (batch_plan_params_check(p, err, errlen) < 0) return NULL;
    if (n_seqs == 0 || n_seqs > UINT32_MAX || !lens) {
        err_fmt(err, errlen, "batch plan: %llu sequences (need 1..2^32-1)",
             (unsigned long long)n_seqs);
        return NULL;
    }
    batch_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return NULL;
    plan->p = *p;
    memcpy(plan->bounds, p->bucket_bounds, (size_t)p->n_buckets * sizeof *plan->bounds);
    plan->p.bucket_bounds = plan->bounds;
    /* two passes: count, then fill */
    for (uint64_t i = 0; i < n_seqs; i++) {
        int b = batch_plan_bucket_of(plan, lens[i]);
        if (b < 0)
            plan->dropped++;
        else
            plan->b[b].n++;
    }
    for (int b = 0; b < p->n_buckets; b++) {
        bucket *k = &plan->b[b];
        size_t n = k->n ? k->n : 1;
        k->members = malloc(n * sizeof *k->members);
        k->lens = malloc(n * sizeof *k->lens);
        k->perm = malloc(n * sizeof *k->perm);
        k->starts = malloc((n + 1) * sizeof *k->starts);
        if (!k->members || !k->lens || !k->perm || !k->starts) {
            batch_plan_destroy(&plan);
            return NULL;
        }
        k->n = 0;
    }
    for (uint64_t i = 0; i < n_seqs; i++) {
        int b = batch_plan_bucket_of(plan, lens[i]);
        if (b < 0) continue;
        bucket *k = &plan->b[b];
        k->members[k->n] = (uint32_t)i;
        k->lens[k->n++] = lens[i];
        k->tokens += lens[i];
        plan->total_tokens += lens[i];
    }
    if (plan->total_tokens == 0) {
        err_fmt(err, errlen, "batch plan: all %llu sequences are empty or longer than %u tokens",
             (unsigned long long)n_seqs, p->bucket_bounds[p->n_buckets - 1]);
        batch_plan_destroy(&plan);
        return NULL;
    }
    return plan;
}

void batch_plan_destroy(batch_plan **pp) {
    if (!pp || !*pp) return;
    batch_plan *plan = *pp;
    for (int b = 0; b < BATCH_PLAN_MAX_BUCKETS; b++) {
        free(plan->b[b].members);
        free(plan->b[b].lens);
        free(plan->b[b].perm);
        free(plan->b[b].starts);
    }
    free(plan);
    *pp = NULL;
}

int batch_plan_n_buckets(const batch_plan *plan) {
    return plan ? plan->p.n_buckets : 0;
}

static bool valid_bucket(const batch_plan *plan, int b) {
    return plan && b >= 0 && b < plan->p.n_buckets;
}

uint64_t batch_plan_bucket_seqs(const batch_plan *plan, int b) {
    return valid_bucket(plan, b) ? plan->b[b].n : 0;
}

uint64_t batch_plan_bucket_tokens(const batch_plan *plan, int b) {
    return valid_bucket(plan, b) ? plan->b[b].tokens : 0;
}

double batch_plan_share(const batch_plan *plan, int b) {
    if (!valid_bucket(plan, b) || !plan->total_tokens) return 0;
    return (double)plan->b[b].tokens / (double)plan->total_tokens;
}

uint64_t batch_plan_dropped(const batch_plan *plan) {
    return plan ? plan->dropped : 0;
}

uint32_t batch_plan_max_batch_seqs(const batch_plan *plan) {
    if (!plan) return 0;
    uint64_t m = plan->p.token_budget; /* every sequence has >= 1 token */
    if (plan->p.max_seqs && plan->p.max_seqs < m) m = plan->p.max_seqs;
    return m > UINT32_MAX ? UINT32_MAX : (uint32_t)m;
}

/* Computes the permutation and packing of (epoch, bucket) into the bucket's cache. */
static void pack(batch_plan *plan, uint32_t epoch, int b) {
    bucket *k = &plan->b[b];
    if (k->cached && k->epoch == epoch) return;
    uint64_t key =
        rng_hash64(rng_hash64(rng_hash64(plan->p.seed) ^ epoch) ^ ((uint64_t)b + 1) * 0xd1b54a32d192ed03ull);
    for (uint32_t i = 0; i < k->n; i++)
        k->perm[i] = i;
    for (uint32_t i = k->n; i-- > 1;) {
        uint64_t r = rng_hash64(key + ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull);
        uint32_t j = (uint32_t)(((unsigned __int128)r * ((uint64_t)i + 1)) >> 64);
        uint32_t t = k->perm[i];
        k->perm[i] = k->perm[j];
        k->perm[j] = t;
    }
    uint32_t nb = 0, in_batch = 0;
    uint64_t tok = 0;
    for (uint32_t i = 0; i < k->n; i++) {
        uint32_t len = k->lens[k->perm[i]];
        if (in_batch && (tok + len > plan->p.token_budget ||
                         (plan->p.max_seqs && in_batch >= plan->p.max_seqs))) {
            in_batch = 0;
            tok = 0;
        }
        if (in_batch == 0) k->starts[nb++] = i;
        in_batch++;
        tok += len;
    }
    k->starts[nb] = k->n;
    k->n_batches = nb;
    k->epoch = epoch;
    k->cached = true;
}

uint32_t batch_plan_count(batch_plan *plan, uint32_t epoch, int b) {
    if (!valid_bucket(plan, b)) return 0;
    pack(plan, epoch, b);
    return plan->b[b].n_batches;
}

int batch_plan_get(batch_plan *plan, uint32_t epoch, int b, uint32_t index, uint32_t *ids,
                   uint32_t cap, uint32_t *n, uint64_t *tokens) {
    if (!valid_bucket(plan, b)) return DFLASH_ERANGE;
    pack(plan, epoch, b);
    bucket *k = &plan->b[b];
    if (index >= k->n_batches) return DFLASH_ERANGE;
    uint32_t s = k->starts[index], e = k->starts[index + 1];
    if (e - s > cap) return DFLASH_EFULL;
    uint64_t t = 0;
    for (uint32_t i = s; i < e; i++) {
        ids[i - s] = k->members[k->perm[i]];
        t += k->lens[k->perm[i]];
    }
    if (n) *n = e - s;
    if (tokens) *tokens = t;
    return 0;
}

static void not_a_length(const char *p, char *err, size_t errlen) {
    int n = (int)strcspn(p, ",");
    if (n == 0)
        err_fmt(err, errlen, "an empty entry between commas");
    else
        err_fmt(err, errlen, "'%.*s' is not a positive length", n, p);
}

int batch_plan_parse_bounds(const char *text, uint32_t *bounds, int max, char *err, size_t errlen) {
    int n = 0;
    const char *p = text;
    if (!p || !*p) {
        err_fmt(err, errlen, "empty list: give ascending lengths like 512,1024,2048");
        return DFLASH_EINVAL;
    }
    while (*p) {
        while (*p == ' ')
            p++;
        const char *entry = p;
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || *p == '-' || v == 0 || v > UINT32_MAX) {
            not_a_length(p, err, errlen);
            return DFLASH_EINVAL;
        }
        if (n >= max) {
            err_fmt(err, errlen, "too many buckets: at most %d", max);
            return DFLASH_EINVAL;
        }
        if (n && v <= bounds[n - 1]) {
            err_fmt(err, errlen, "%lu after %u: give ascending lengths like 512,1024,2048", v,
                    bounds[n - 1]);
            return DFLASH_EINVAL;
        }
        bounds[n++] = (uint32_t)v;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',') {
            p++;
            if (!*p) {
                err_fmt(err, errlen, "a comma with no length after it");
                return DFLASH_EINVAL;
            }
        } else if (*p) {
            not_a_length(entry, err, errlen);
            return DFLASH_EINVAL;
        }
    }
    return n;
}
