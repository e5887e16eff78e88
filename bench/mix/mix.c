/* bench-mix: does the bucket policy keep the drafter's length mix on the dataset mix, and what
 * does it cost the target? A discrete-event simulation (simulated clock, no sleeping) of one
 * target and one faster drafter sharing a slot buffer, run three ways in one invocation:
 *
 *   (a) fifo   min 10 / max 90: the seeds' buffer. The target produces batches in the dataset's
 *              shuffled order (each batch's bucket drawn with the bucket's batch share); the
 *              drafter, once >= min_ready batches are ready, takes the oldest.
 *   (b) policy min 10 / max 90: services/queue/policy.c decides: work units go to the bucket with
 *              the largest ready deficit, claims wait for min_ready and take the bucket whose
 *              consumed share lags most, oldest first.
 *   (c) policy min 30 / max 90.
 *
 * Model: every batch is packed to a token budget of 16384; the sequence that no longer fits is
 * left out, so a batch carries budget - U(0, seq_len) tokens (long buckets pack worse).
 * The target's time per batch grows with the bucket's sequence length (attention), the drafter's
 * much less; both get +-jitter uniform noise from the same seeded generator in every run. The
 * drafter holds a lease only for the copy, then trains on its copy. The target is idle only when
 * filling+ready+leased reaches max_depth. Measured after a warm-up: the TV distance between the
 * consumed token mix over the last `window` claims and the dataset mix (mean over claims, and the
 * worst), the TV of the whole run, target idle and drafter idle fractions, and drafter batches per
 * simulated second. The last line gives the FIFO/policy TV ratio. Results: bench/RESULTS.md.
 *
 * Single-threaded. Uses policy.h only (no sockets); the FIFO is local to this file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "err.h"
#include "log.h"
#include "policy.h"

#define NB 4
#define TOKENS 16384u

typedef struct {
    int64_t claims;
    int64_t warmup;
    int64_t window;
    int64_t seed;
    double jitter;
    char shares[128];
    double target_ms_base, target_ms_per_1k; /* target time per batch = base + per_1k*len/1024 */
    double drafter_ms_base, drafter_ms_per_1k;
    double copy_ms;
} bench_cfg;

static const cfg_option options[] = {
    {"claims", CFG_INT, "20000", 100, 1e7, false, "drafter batches to simulate per run",
     offsetof(bench_cfg, claims), 0},
    {"warmup", CFG_INT, "1000", 0, 1e6, false, "claims before measuring",
     offsetof(bench_cfg, warmup), 0},
    {"window", CFG_INT, "100", 1, 65536, false, "claims in the TV window (the broker's N)",
     offsetof(bench_cfg, window), 0},
    {"seed", CFG_INT, "1", 0, 1e18, false, "random seed (same for every run)",
     offsetof(bench_cfg, seed), 0},
    {"jitter", CFG_DOUBLE, "0.1", 0, 0.9, false, "relative uniform noise on every batch time",
     offsetof(bench_cfg, jitter), 0},
    {"shares", CFG_STRING, "0.12,0.23,0.38,0.27", 1, 0, false,
     "dataset token shares of the buckets <=512,<=1024,<=2048,<=3072",
     offsetof(bench_cfg, shares), sizeof(((bench_cfg *)0)->shares)},
    {"target-ms-base", CFG_DOUBLE, "120", 0, 1e6, false, "target ms per batch, fixed part",
     offsetof(bench_cfg, target_ms_base), 0},
    {"target-ms-per-1k", CFG_DOUBLE, "60", 0, 1e6, false,
     "target ms per batch per 1024 of sequence length", offsetof(bench_cfg, target_ms_per_1k), 0},
    {"drafter-ms-base", CFG_DOUBLE, "110", 0, 1e6, false, "drafter ms per batch, fixed part",
     offsetof(bench_cfg, drafter_ms_base), 0},
    {"drafter-ms-per-1k", CFG_DOUBLE, "15", 0, 1e6, false,
     "drafter ms per batch per 1024 of sequence length", offsetof(bench_cfg, drafter_ms_per_1k),
     0},
    {"copy-ms", CFG_DOUBLE, "5", 0, 1e6, false, "drafter ms holding the lease (slot copy)",
     offsetof(bench_cfg, copy_ms), 0},
};

static const cfg_table table = {"bench-mix",
                                "simulated length mix and target idle time: FIFO vs the policy",
                                "[options]", options, sizeof options / sizeof options[0], NULL,
                                NULL, NULL};

static const uint32_t bucket_len[NB] = {512, 1024, 2048, 3072};

typedef struct {
    uint32_t bucket, tokens;
} window_entry;

typedef struct {
    const char *name;
    bool use_policy;
    uint32_t min_ready, max_depth;
} run_spec;

typedef struct {
    double tv_mean, tv_max, tv_all;
    double target_idle, drafter_idle;
    double batches_per_s;
    double policy_tv; /* policy's own metric at the end (policy runs), for cross-checking */
} run_result;

/* xorshift64*: the bench's only randomness, re-seeded per run. */
static uint64_t rng_state;
static double uniform(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static double jittered(double ms, double jitter) { return ms * (1 + jitter * (2 * uniform() - 1)); }

/* The FIFO of ready batches (buckets), oldest first. */
typedef struct {
    uint8_t *b;
    uint32_t *tok;
    size_t head, len, cap;
} fifo;

static void fifo_push(fifo *f, uint8_t b, uint32_t tokens)
{
    f->b[(f->head + f->len) % f->cap] = b;
    f->tok[(f->head + f->len) % f->cap] = tokens;
    f->len++;
}
static uint8_t fifo_pop(fifo *f, uint32_t *tokens)
{
    uint8_t b = f->b[f->head];
    *tokens = f->tok[f->head];
    f->head = (f->head + 1) % f->cap;
    f->len--;
    return b;
}

/* Tokens in a packed batch of bucket b: the budget minus the sequence that did not fit. */
static uint32_t batch_tokens(uint32_t b) { return TOKENS - (uint32_t)(uniform() * bucket_len[b]); }

static int run(const bench_cfg *c, const double *share, const run_spec *spec, run_result *out)
{
    rng_state = (uint64_t)c->seed * 0x9E3779B97F4A7C15ull + 1;
    bool deadlocked = false;
    policy *p = NULL;
    fifo q = {0};
    if (spec->use_policy) {
        policy_params prm;
        policy_params_default(&prm);
        prm.n_buckets = NB;
        memcpy(prm.bucket_max_len, bucket_len, sizeof bucket_len);
        prm.min_ready = spec->min_ready;
        prm.max_depth = spec->max_depth;
        prm.lease_timeout_ms = 1000000;
        prm.mix_window = (uint32_t)c->window;
        p = policy_new(&prm, NULL);
        if (!p || policy_set_shares(p, NB, share) != 0 ||
            policy_pool_add(p, 1, 1, spec->max_depth + 8, TOKENS) != 0) {
            policy_destroy(&p);
            return DFLASH_EINTERNAL;
        }
    } else {
        q.cap = spec->max_depth + 1;
        q.b = calloc(q.cap, 1);
        q.tok = calloc(q.cap, sizeof *q.tok);
        if (!q.b || !q.tok) {
            free(q.b);
            free(q.tok);
            return DFLASH_ENOMEM;
        }
    }
    window_entry *win = calloc((size_t)c->window, sizeof *win);
    if (!win) {
        policy_destroy(&p);
        free(q.b);
        free(q.tok);
        return DFLASH_ENOMEM;
    }
    double win_tok[NB] = {0}, all_tok[NB] = {0}, batch_share[NB], bsum = 0;
    for (uint32_t b = 0; b < NB; b++)
        bsum += batch_share[b] = share[b] / (TOKENS - bucket_len[b] / 2.0);
    for (uint32_t b = 0; b < NB; b++) batch_share[b] /= bsum;
    int64_t win_n = 0, win_pos = 0;

    /* Actors. The target is busy until t_target (producing `producing`), or blocked. The drafter
     * is copying (lease held) until t_copy, training until t_train, or waiting for a claim. */
    enum { T_BUSY, T_BLOCKED } ts = T_BLOCKED;
    enum { D_COPY, D_TRAIN, D_WAIT } ds = D_WAIT;
    double now = 0, t_target = 0, t_drafter = 0;
    uint32_t producing = 0, batch_index = 0, copying = 0, tokens = 0, produced_tokens = 0;
    uint64_t lease = 0;
    uint32_t in_flight = 0; /* FIFO run: filling + ready + leased */
    int64_t claims = 0;
    double measure_from = -1, target_idle = 0, drafter_idle = 0;
    double tv_sum = 0, tv_max = 0;
    int64_t tv_n = 0;

    for (;;) {
        /* Start whoever can start. The target: one work unit at a time. */
        if (ts == T_BLOCKED) {
            bool go = false;
            if (p) {
                uint32_t b;
                if (policy_next_bucket(p, 1, (1u << NB) - 1, &b) == 0) {
                    batch_id id = {0, b, batch_index++};
                    uint32_t slot;
                    if (policy_work_start(p, 1, &id, &slot) == 0) {
                        producing = slot;
                        go = true;
                    }
                }
            } else if (in_flight < spec->max_depth) {
                /* The dataset's shuffled order: the bucket of the next batch, drawn with the
                 * bucket's share of *batches* (token share / mean tokens per batch), so the
                 * FIFO's long-run token mix is the dataset's. */
                double u = uniform(), acc = 0;
                producing = NB - 1;
                for (uint32_t b = 0; b < NB; b++) {
                    acc += batch_share[b];
                    if (u < acc) {
                        producing = b;
                        break;
                    }
                }
                in_flight++;
                go = true;
            }
            if (go) {
                uint32_t b;
                if (p) {
                    slot_state st;
                    batch_id id;
                    policy_slot_get(p, 1, producing, &st, &id);
                    b = id.bucket;
                } else {
                    b = producing;
                }
                double ms = c->target_ms_base + c->target_ms_per_1k * bucket_len[b] / 1024.0;
                t_target = now + jittered(ms, c->jitter);
                produced_tokens = batch_tokens(b);
                ts = T_BUSY;
            }
        }
        if (ds == D_WAIT) {
            int got = -1;
            uint32_t b = 0;
            if (p) {
                policy_grant g;
                if (policy_claim(p, 7, (uint64_t)now, &g) == 0) {
                    got = 1;
                    b = g.where.batch.bucket;
                    tokens = g.where.n_tokens;
                    lease = g.lease_id;
                }
            } else if (q.len >= spec->min_ready && q.len > 0) {
                b = fifo_pop(&q, &tokens);
                got = 1;
            }
            if (got > 0) {
                copying = b;
                claims++;
                if (claims == c->warmup + 1) measure_from = now;
                /* The TV window over consumed tokens. */
                if (win_n == c->window) win_tok[win[win_pos].bucket] -= win[win_pos].tokens;
                else win_n++;
                win[win_pos] = (window_entry){b, tokens};
                win_tok[b] += tokens;
                win_pos = (win_pos + 1) % c->window;
                if (measure_from >= 0) {
                    all_tok[b] += tokens;
                    if (win_n == c->window) {
                        double tv = policy_tv_distance(NB, win_tok, share);
                        tv_sum += tv;
                        tv_n++;
                        if (tv > tv_max) tv_max = tv;
                    }
                }
                t_drafter = now + jittered(c->copy_ms, c->jitter);
                ds = D_COPY;
                if (claims >= c->claims + c->warmup) break;
            }
        }
        /* Advance the clock to the next event. */
        bool t_next = ts == T_BUSY && (ds == D_WAIT || t_target <= t_drafter);
        if (!t_next && ds == D_WAIT) {
            LOG_ERROR("bench-mix: deadlock (target blocked, drafter waiting) in run %s",
                      spec->name);
            deadlocked = true;
            break;
        }
        double next = t_next ? t_target : t_drafter;
        if (measure_from >= 0) { /* idle time over [now, next) */
            if (ts == T_BLOCKED) target_idle += next - now;
            if (ds == D_WAIT) drafter_idle += next - now;
        }
        if (t_next) {
            now = t_target;
            if (p) {
                slot_state st;
                batch_id id;
                policy_slot_get(p, 1, producing, &st, &id);
                policy_slot_ready(p, 1, 1, producing, &id, produced_tokens);
            } else {
                fifo_push(&q, (uint8_t)producing, produced_tokens);
            }
            ts = T_BLOCKED;
        } else {
            now = t_drafter;
            if (ds == D_COPY) {
                if (p) policy_release(p, lease, NULL);
                else in_flight--;
                const uint32_t len = bucket_len[copying];
                double ms = c->drafter_ms_base + c->drafter_ms_per_1k * len / 1024.0;
                t_drafter = now + jittered(ms, c->jitter);
                ds = D_TRAIN;
            } else {
                ds = D_WAIT;
            }
        }
    }
    double span = now - measure_from;
    out->tv_mean = tv_n ? tv_sum / (double)tv_n : 0;
    out->tv_max = tv_max;
    out->tv_all = policy_tv_distance(NB, all_tok, share);
    out->target_idle = span > 0 ? target_idle / span : 0;
    out->drafter_idle = span > 0 ? drafter_idle / span : 0;
    out->batches_per_s = span > 0 ? (double)c->claims / (span / 1000.0) : 0;
    out->policy_tv = -1;
    if (p) {
        policy_stats st;
        policy_get_stats(p, &st);
        out->policy_tv = st.mix_tv;
    }
    policy_destroy(&p);
    free(q.b);
    free(q.tok);
    free(win);
    return deadlocked ? -1 : 0; /* a cut-off run's figures are not the run's */
}

static int parse_shares(const char *s, double *share)
{
    char *end;
    double sum = 0;
    for (int b = 0; b < NB; b++) {
        share[b] = strtod(s, &end);
        if (end == s || !(share[b] >= 0)) return DFLASH_EINVAL;
        sum += share[b];
        s = end;
        if (b < NB - 1) {
            if (*s != ',') return DFLASH_EINVAL;
            s++;
        }
    }
    if (*s || !(sum > 0)) return DFLASH_EINVAL;
    for (int b = 0; b < NB; b++) share[b] /= sum;
    return 0;
}

int main(int argc, char **argv)
{
    log_init("bench-mix", LOG_WARN);
    bench_cfg c;
    int rc = config_load(&table, &c, argc, argv, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : 2;
    double share[NB];
    if (parse_shares(c.shares, share) != 0) {
        fprintf(stderr, "bench-mix: --shares needs %d non-negative numbers, e.g. "
                        "0.12,0.23,0.38,0.27\n", NB);
        return 2;
    }
    static const run_spec runs[] = {
        {"fifo", false, 10, 90},
        {"policy", true, 10, 90},
        {"policy", true, 30, 90},
    };
    run_result r[3];
    for (int i = 0; i < 3; i++)
        if (run(&c, share, &runs[i], &r[i]) != 0) {
            fprintf(stderr, "bench-mix: run %d failed\n", i);
            return 1;
        }
    printf("bench-mix: %lld claims after %lld warm-up, TV window %lld claims, seed %lld, "
           "shares %.3f/%.3f/%.3f/%.3f (<=512/1024/2048/3072)\n",
           (long long)c.claims, (long long)c.warmup, (long long)c.window, (long long)c.seed,
           share[0], share[1], share[2], share[3]);
    printf("%-7s %4s %4s  %8s %8s %8s  %11s %12s %10s\n", "buffer", "min", "max", "TV mean",
           "TV max", "TV run", "target idle", "drafter idle", "batches/s");
    for (int i = 0; i < 3; i++)
        printf("%-7s %4u %4u  %8.4f %8.4f %8.4f  %10.2f%% %11.2f%% %10.3f\n", runs[i].name,
               runs[i].min_ready, runs[i].max_depth, r[i].tv_mean, r[i].tv_max, r[i].tv_all,
               100 * r[i].target_idle, 100 * r[i].drafter_idle, r[i].batches_per_s);
    double worst = r[1].tv_mean > r[2].tv_mean ? r[1].tv_mean : r[2].tv_mean;
    printf("TV mean ratio fifo/policy: %.1fx at 10/90, %.1fx at 30/90 (target: policy TV <= 0.05, "
           ">= 5x lower, target idle <= 2%%: %s)\n",
           r[0].tv_mean / (r[1].tv_mean > 0 ? r[1].tv_mean : 1e-12),
           r[0].tv_mean / (r[2].tv_mean > 0 ? r[2].tv_mean : 1e-12),
           worst <= 0.05 && r[0].tv_mean >= 5 * worst && r[1].target_idle <= 0.02 &&
                   r[2].target_idle <= 0.02
               ? "met"
               : "NOT met");
    return 0;
}
