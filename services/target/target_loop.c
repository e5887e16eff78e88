/* target_loop: see target_loop.h for the loop, its states and the producer interface.
 * A heartbeat thread (heartbeat.h) calls client_poll so that a producer busy for longer than the
 * broker's heartbeat interval does not get the target expired; its watchdog ends a target
 * whose loop stopped going round (--stall-exit-s).
 * Busy bitmap (busy[]): bit s is set once slot s is published and cleared when a work unit
 * names s again (the broker hands a slot out only once it is FREE); every registration sends it
 * as PoolRegister.busy_slots so that a restarted broker fences those slots (docs/protocol.md).
 * A stop (the stop flag, --max-batches) or a producer's fatal error while the pool is registered
 * and the broker answers leaves the broker before the pool is destroyed (target_leave.h): the
 * broker grants nothing more from it, and the memory stays until no drafter copies it. */
#include "target_loop.h"
#include "monotime.h"
#include "broker_silence.h"
#include "client.h"
#include "err.h"
#include "heartbeat.h"
#include "log.h"
#include "synthetic.h"
#include "target_leave.h"
#include "batch_plan.h"
#include "rng.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { TL_REGISTER = 0, TL_WORKING, TL_WAITING, TL_DONE } tl_state;

typedef struct target_loop {
    const target_loop_config *cfg;
    target_producer *prod;
    pool *pool;
    client *client;
    tl_state state;
    target_stats st;
    heartbeat *hb;
    uint64_t busy[WIRE_MAX_SLOTS / 64]; /* published, not handed back since (main thread) */
    broker_silence silence; /* the broker quiet since we registered (broker_silence.h) */
} target_loop;

static const char *state_name(tl_state s)
{
    static const char *const n[] = {"REGISTER", "WORKING", "WAITING", "DONE"};
    return n[s];
}

static void set_state(target_loop *t, tl_state to)
{
    static const bool legal[4][4] = {
        /* to:      REGISTER WORKING WAITING DONE */
        [TL_REGISTER] = {true, true, false, true},
        [TL_WORKING] = {true, true, true, true},
        [TL_WAITING] = {true, true, true, true},
        [TL_DONE] = {false, false, false, true},
    };
    assert(legal[t->state][to]);
    if (t->state != to) LOG_DEBUG("target loop %s -> %s", state_name(t->state), state_name(to));
    t->state = to;
}

static void fill_wire_pool(const target_loop *t, wire_pool *wp)
{
    const target_loop_config *c = t->cfg;
    const pool_desc *d = pool_descriptor(t->pool);
    memset(wp, 0, sizeof *wp);
    wp->pool_incarnation = d->incarnation;
    wp->backend = d->backend == POOL_CUDA ? WIRE_BACKEND_CUDA : WIRE_BACKEND_HOST;
    if (d->backend == POOL_CUDA) {
        memcpy(wp->mem_handle, d->mem_handle, WIRE_HANDLE_BYTES);
        wp->event_handles = (const uint8_t(*)[WIRE_HANDLE_BYTES])d->event_handles;
        wp->n_events = d->n_slots;
        snprintf(wp->gpu_bus_id, sizeof wp->gpu_bus_id, "%s", d->gpu_bus_id);
    }
    wp->device = d->device;
    snprintf(wp->shm_name, sizeof wp->shm_name, "%s", d->shm_name);
    wp->slot_count = d->n_slots;
    wp->slot_size = d->slot_bytes;
    wp->layout_version = SLOT_VERSION;
    wp->token_budget = c->layout.token_budget;
    wp->n_buckets = c->n_buckets;
    for (uint32_t b = 0; b < c->n_buckets; b++) {
        wp->bucket_upper[b] = c->bucket_upper[b];
        wp->bucket_share[b] = c->bucket_share[b];
        wp->bucket_batches[b] = c->bucket_batches[b];
    }
    wp->epochs = c->epochs;
    wp->plan_id = c->plan_id;
    wp->has_plan_id = c->has_plan_id;
    memcpy(wp->busy, t->busy, sizeof wp->busy);
}

/* hello + pool registration. 0, or a fatal code (bad pool: the broker refused it; DFLASH_ECONFIG
 * when for its plan or buckets). Transient failures return DFLASH_EAGAIN. */
static int do_register(target_loop *t)
{
    int rc = client_hello(t->client, NULL, 0);
    if (rc == DFLASH_EEXISTS) {
        LOG_ERROR("the broker refused our hello: %s", client_last_error(t->client));
        t->st.name_in_use = true;
        return rc;
    }
    if (rc == DFLASH_EDENIED) /* our --name is a live target's of another CURVE key: exit 1 */
        LOG_ERROR("the broker refused our hello: %s", client_last_error(t->client));
    if (rc < 0) return rc == DFLASH_ETIMEOUT || rc == DFLASH_ESTALE ? DFLASH_EAGAIN : rc;
    wire_pool wp;
    fill_wire_pool(t, &wp);
    rc = client_register_pool(t->client, &wp);
    if (rc == DFLASH_ETIMEOUT || rc == DFLASH_ESTALE) return DFLASH_EAGAIN;
    if (rc < 0) {
        LOG_ERROR("the broker refused our pool: %s (%s)", err_str(rc),
                  client_last_error(t->client));
        /* a plan or buckets that are not the run's: our flags or data, exit 2 */
        return rc == DFLASH_EMISMATCH || rc == DFLASH_ERANGE ? DFLASH_ECONFIG : rc;
    }
    t->st.registrations++;
    LOG_INFO("registered pool %016llx (%s, %u slots of %llu bytes) with broker %016llx",
             (unsigned long long)wp.pool_incarnation, pool_backend_name(t->cfg->backend),
             wp.slot_count, (unsigned long long)wp.slot_size,
             (unsigned long long)client_broker_incarnation(t->client));
    return 0;
}

/* Every request's result, for the log lines about a silent broker (broker_silence.h). */
static void broker_heard(target_loop *t, int rc)
{
    broker_silence_note(&t->silence, rc, t->st.registrations > 0, client_last_error(t->client));
}

static void progress(target_loop *t, double *last_t, uint64_t *last_b, uint64_t *last_tok,
                     double *last_wait)
{
    double now = monotime_s(), dt = now - *last_t;
    if (dt <= 0) return;
    char silent[64];
    broker_silence_suffix(&t->silence, silent, sizeof silent);
    LOG_INFO("batches %llu (+%llu), %.0f tokens/s, %.1f batches/s, waiting for a free slot "
             "%.0f%%%s",
             (unsigned long long)t->st.batches, (unsigned long long)(t->st.batches - *last_b),
             (double)(t->st.tokens - *last_tok) / dt, (double)(t->st.batches - *last_b) / dt,
             100.0 * (t->st.wait_slot_s - *last_wait) / dt, silent);
    *last_t = now;
    *last_b = t->st.batches;
    *last_tok = t->st.tokens;
    *last_wait = t->st.wait_slot_s;
}

/* Whether a stop now should leave the broker (target_leave): the pool is registered (as far as
 * we know) and the broker answered our last request. After a timeout it is likely gone: the
 * target exits at once rather than wait another --timeout-ms for a goodbye nobody reads. */
static bool registered_and_heard(const target_loop *t)
{
    return (t->state == TL_WORKING || t->state == TL_WAITING) && t->silence.since == 0;
}

/* Fills and publishes one work unit. 0, DFLASH_ESTALE (re-register) or a fatal code. Its
 * SlotReady is tried up to 3 times while the broker does not answer, each try a loop pass: heard
 * or not (broker_heard), the loop alive (heartbeat_alive), and none after a stop (defect: a
 * SIGTERM while the broker was silent waited out every try and then a leave, 4 x --timeout-ms,
 * and the tries counted as a hung loop: exit 5 during a broker outage). */
static int produce(target_loop *t, const wire_work_unit *w, volatile sig_atomic_t *stop)
{
    const target_loop_config *c = t->cfg;
    uint64_t inc = pool_descriptor(t->pool)->incarnation;
    if (w->slot >= c->n_slots || w->slot >= WIRE_MAX_SLOTS || w->unit.bucket >= c->n_buckets) {
        LOG_WARN("broker sent an impossible work unit (slot %u, bucket %u): ignored", w->slot,
                 w->unit.bucket);
        return 0;
    }
    t->busy[w->slot / 64] &= ~(1ull << (w->slot % 64)); /* the broker gave it back: FREE */
    slot_work_unit wu = {.epoch = w->unit.epoch, .bucket = w->unit.bucket, .batch = w->unit.index};
    void *stream = t->prod->stream ? t->prod->stream(t->prod->ctx) : NULL;
    double t0 = monotime_s();
    uint32_t n_seqs = 0;
    int n = t->prod->fill(t->prod->ctx, &wu, pool_slot_ptr(t->pool, w->slot), &c->layout, stream,
                          inc, &n_seqs);
    if (n < 0) {
        LOG_ERROR("producer %s failed on batch (%u, %u, %llu): %s", t->prod->name, wu.epoch,
                  wu.bucket, (unsigned long long)wu.batch, err_str(n));
        return n;
    }
    int rc = pool_slot_publish(t->pool, w->slot, stream);
    if (rc < 0) return rc;
    t->busy[w->slot / 64] |= 1ull << (w->slot % 64); /* a drafter may copy it from now on */
    t->st.fill_s += monotime_s() - t0;
    wire_slot_ready r = {.pool_incarnation = inc, .slot = w->slot, .unit = w->unit,
                         .n_tokens = (uint32_t)n, .n_seqs = n_seqs};
    for (int attempt = 0; attempt < 3 && (attempt == 0 || !*stop); attempt++) {
        heartbeat_alive(t->hb);
        rc = client_slot_ready(t->client, &r);
        broker_heard(t, rc);
        if (rc != DFLASH_ETIMEOUT) break;
    }
    if (rc == DFLASH_ESTALE) return rc;
    if (rc < 0) {
        LOG_WARN("slot ready for slot %u not accepted: %s (%s)", w->slot, err_str(rc),
                 client_last_error(t->client));
        return 0;
    }
    t->st.batches++;
    t->st.tokens += (uint64_t)n;
    return 0;
}

int target_loop_run(const target_loop_config *cfg, target_producer *prod,
                    volatile sig_atomic_t *stop, target_stats *stats)
{
    target_loop t = {.cfg = cfg, .prod = prod, .state = TL_REGISTER};
    int rc = 0, err = 0;
    double start = monotime_s();
    pool_config pc = {.backend = cfg->backend, .name = cfg->name, .n_slots = cfg->n_slots,
                      .slot_bytes = cfg->layout.slot_bytes, .device = cfg->device};
    t.pool = pool_new(&pc, &err);
    if (!t.pool) {
        LOG_ERROR("cannot create the %s slot pool (%u slots of %zu bytes): %s",
                  pool_backend_name(cfg->backend), cfg->n_slots, cfg->layout.slot_bytes,
                  err_str(err));
        rc = err;
        goto out;
    }
    t.client = client_new(cfg->endpoint, WIRE_ROLE_TARGET, cfg->name);
    if (!t.client) {
        LOG_ERROR("cannot create a client for %s", cfg->endpoint);
        rc = DFLASH_EZMQ;
        goto out_pool;
    }
    client_set_timeout(t.client, (int)cfg->timeout_ms);
    if (((cfg->curve_server_key && *cfg->curve_server_key) || (cfg->curve_key && *cfg->curve_key)) &&
        client_set_curve_files(t.client, cfg->curve_server_key, cfg->curve_key)) {
        LOG_ERROR("CURVE keys: %s", client_last_error(t.client));
        client_destroy(&t.client);
        rc = DFLASH_ECONFIG; /* the operator's key files: bad configuration, exit 2 */
        goto out_pool;
    }
    t.hb = heartbeat_start(t.client, cfg->stall_exit_s, "the target's loop");

    double backoff = 1, unreachable_since = monotime_s();
    double last_t = monotime_s(), last_wait = 0;
    uint64_t last_b = 0, last_tok = 0;
    bool leave = false; /* the loop ends on a stop: leave the broker first */
    while (t.state != TL_DONE) {
        heartbeat_alive(t.hb);
        if (*stop) {
            leave = registered_and_heard(&t);
            set_state(&t, TL_DONE);
            break;
        }
        if (cfg->progress_ms > 0 && (monotime_s() - last_t) * 1000 >= cfg->progress_ms)
            progress(&t, &last_t, &last_b, &last_tok, &last_wait);
        if (t.state == TL_REGISTER) {
            bool first = t.st.registrations == 0;
            rc = do_register(&t);
            bool answered = client_last_answered(t.client); /* "try again" is an answer */
            broker_heard(&t, rc == DFLASH_EAGAIN && !answered ? DFLASH_ETIMEOUT : rc);
            if (rc == 0) {
                set_state(&t, TL_WORKING);
                unreachable_since = monotime_s();
                continue;
            }
            if (rc != DFLASH_EAGAIN) goto out_client;
            rc = 0;
            if (first && cfg->register_fail_exit_ms > 0 &&
                (monotime_s() - unreachable_since) * 1000 > cfg->register_fail_exit_ms) {
                broker_silence_give_up(cfg->endpoint, monotime_s() - unreachable_since,
                                       (long long)cfg->register_fail_exit_ms,
                                       (long long)cfg->timeout_ms, answered,
                                       client_last_error(t.client));
                rc = DFLASH_EPEER;
                goto out_client;
            }
            monotime_sleep_ms(100);
            continue;
        }
        if (cfg->max_batches > 0 && (int64_t)t.st.batches >= cfg->max_batches) {
            leave = registered_and_heard(&t);
            set_state(&t, TL_DONE);
            break;
        }
        wire_work_unit w;
        double t0 = monotime_s();
        rc = client_request_work(t.client, pool_descriptor(t.pool)->incarnation, &w);
        broker_heard(&t, rc);
        if (rc == 0) {
            set_state(&t, TL_WORKING);
            backoff = 1;
            rc = produce(&t, &w, stop);
            if (rc == DFLASH_ESTALE) {
                set_state(&t, TL_REGISTER);
            } else if (rc < 0) { /* fatal: leave as a stop does (defect: the broker granted
                                  * the pool's ready slots from freed memory until it
                                  * expired us, and copies under way read it) */
                leave = registered_and_heard(&t);
                break;
            }
            rc = 0;
        } else if (rc == DFLASH_EAGAIN || rc == DFLASH_EFULL || rc == DFLASH_ETIMEOUT) {
            set_state(&t, TL_WAITING);
            monotime_sleep_ms(backoff);
            backoff = backoff < 20 ? backoff * 2 : 20;
            if (rc != DFLASH_ETIMEOUT) t.st.wait_slot_s += monotime_s() - t0; /* not the broker's */
            rc = 0;
        } else if (rc == DFLASH_ESHUTDOWN) {
            LOG_INFO("the broker is draining: done");
            set_state(&t, TL_DONE);
            rc = 0;
        } else if (rc == DFLASH_ESTALE) {
            LOG_WARN("the broker does not know us (it restarted, expired us, or another "
                     "target with our --name replaced us): registering again");
            set_state(&t, TL_REGISTER);
            rc = 0;
        } else {
            LOG_WARN("work request failed: %s (%s)", err_str(rc), client_last_error(t.client));
            set_state(&t, TL_WAITING);
            monotime_sleep_ms(100);
            rc = 0;
        }
    }
    if (leave) (void)target_leave(t.client, pool_descriptor(t.pool)->incarnation); /* logged */
out_client:
    heartbeat_stop(&t.hb);
    client_destroy(&t.client);
out_pool:
    pool_destroy(&t.pool);
out:
    t.st.elapsed_s = monotime_s() - start;
    if (stats) *stats = t.st;
    return rc;
}

/* ---------------------------------------------------------------- synthetic producer */

typedef struct synth_ctx {
    pool_backend backend;
    uint32_t n_buckets, vocab, budget;
    uint32_t upper[TARGET_MAX_BUCKETS];
    void *scratch; /* cuda: host-side slot image */
    double period_s, next_s; /* pacing; period 0 = none */
} synth_ctx;

/* Sleeps until the next tick of a 1/period schedule; never bursts more than a second behind. */
static void pace(double period_s, double *next_s)
{
    if (period_s <= 0) return;
    double now = monotime_s();
    if (*next_s < now - 1.0) *next_s = now;
    if (*next_s > now) monotime_sleep_ms((*next_s - now) * 1000);
    *next_s += period_s;
}

static int synth_fill(void *vctx, const slot_work_unit *wu, void *slot, const slot_layout *l,
                      void *stream, uint64_t producer, uint32_t *n_seqs)
{
    (void)stream;
    synth_ctx *s = vctx;
    pace(s->period_s, &s->next_s);
    synthetic_params sp = synthetic_bucket_params(s->upper, s->n_buckets, wu->bucket, s->vocab,
                                                  s->budget);
    void *dst = s->backend == POOL_HOST ? slot : s->scratch;
    int n = synthetic_fill(dst, l, wu, &sp, producer);
    if (n < 0) return n;
    slot_header h;
    slot_header_check(dst, l, &h, NULL, 0);
    *n_seqs = h.n_seqs;
    if (s->backend == POOL_CUDA) {
        int rc = pool_staging_write(POOL_CUDA, slot, s->scratch, slot_used_bytes(l, (uint32_t)n));
        if (rc < 0) return rc;
    }
    return n;
}

static void synth_destroy(void *vctx)
{
    synth_ctx *s = vctx;
    free(s->scratch);
    free(s);
}

uint64_t target_synthetic_plan_id(const target_loop_config *cfg, uint32_t vocab_size)
{
    batch_plan_params bp = {.bucket_bounds = cfg->bucket_upper, .n_buckets = (int)cfg->n_buckets,
                            .token_budget = cfg->layout.token_budget,
                            .max_seqs = cfg->layout.max_seqs};
    return batch_plan_identity(&bp, rng_hash64_fold(0x73796e7468657469ull /* "synthetic" */,
                                                    vocab_size));
}

target_producer *target_synthetic_new(const target_loop_config *cfg, uint32_t vocab_size,
                                      double rate)
{
    target_producer *p = calloc(1, sizeof *p);
    synth_ctx *s = calloc(1, sizeof *s);
    if (!p || !s) goto fail;
    s->backend = cfg->backend;
    s->n_buckets = cfg->n_buckets;
    s->vocab = vocab_size;
    s->budget = cfg->layout.token_budget;
    s->period_s = rate > 0 ? 1.0 / rate : 0;
    memcpy(s->upper, cfg->bucket_upper, sizeof s->upper);
    if (cfg->backend == POOL_CUDA) {
        s->scratch = aligned_alloc(256, cfg->layout.slot_bytes);
        if (!s->scratch) goto fail;
    }
    *p = (target_producer){.name = "synthetic", .ctx = s, .fill = synth_fill, .stream = NULL,
                           .destroy = synth_destroy};
    return p;
fail:
    free(s);
    free(p);
    return NULL;
}

void target_producer_destroy(target_producer **prod)
{
    if (!prod || !*prod) return;
    if ((*prod)->destroy) (*prod)->destroy((*prod)->ctx);
    free(*prod);
    *prod = NULL;
}
