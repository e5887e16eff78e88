/* dflash-target: fills slots with the target model's hidden states for the broker (DESIGN §2).
 * main() is the table of contents: config table (defaults < file < DFLASH_* < flags), validate
 * (setup_from: every check of the options, which config_load also runs for --dump-config;
 * check_shape_flags: those against the model), build the slot layout and the producer chosen by
 * --model ("synthetic" is the deterministic
 * stand-in of synthetic.h; a checkpoint directory is the real target forward of model_producer.h
 * over --shards, on the cpu ops for the host backend or the cuda ops for the cuda one, warmed up
 * for every bucket shape before registering; SIGINT/SIGTERM end the loading and warm-up early),
 * log the effective config, run target_loop until drained or SIGINT/SIGTERM (a stop leaves the
 * broker first: target_leave.h), shut down in reverse (the pool's shared memory is removed).
 * Exit status: 0 done or stopped, 1 fatal error, 2 bad configuration (also an ipc:// endpoint
 * whose directory is not ours alone: client_check_endpoint), 4 another live target has
 * our --name (the broker refused our hello).
 * The only global is the stop flag. */
#include "client.h"
#include "config.h"
#include "hf_config.h"
#include "err.h"
#include "host_name.h"
#include "batch_plan.h"
#include "blas_env.h"
#include "log.h"
#include "signals.h"
#include "model_producer.h"
#include "shard.h"
#include "slot_options.h"
#include "target_model.h"
#include "ops.h"
#include "target_loop.h"
#ifdef DFLASH_HAVE_CUDA
#include "ops_cuda.h"
#endif

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct target_config {
    char runtime_dir[256];
    char endpoint[256];
    char curve_server_key[256]; /* CURVE: the broker's public key file */
    char curve_key[256];        /* CURVE: our secret key file */
    char name[32];
    char model[512];
    char shards[1024];
    char capture[256];
    int64_t seed;
    int64_t threads;
    char backend[16];
    int64_t device;
    int64_t slots;
    int64_t token_budget;
    int64_t max_seqs;
    int64_t hidden;
    int64_t layers;
    char buckets[256];
    int64_t batches_per_bucket;
    int64_t epochs;
    int64_t vocab_size;
    double rate;
    int64_t progress_ms;
    int64_t timeout_ms;
    int64_t max_batches;
    int64_t broker_wait_ms;
    double stall_exit_s;
    char log_level[16];
} target_config;

#define OPT(n, t, d, lo, hi, h, m) {n, t, d, lo, hi, false, h, offsetof(target_config, m), 0}
#define OPTS(n, d, h, m) {n, CFG_STRING, d, 1, 0, false, h, offsetof(target_config, m), \
                          sizeof(((target_config *)0)->m)}
static const cfg_option target_options[] = {
    CLIENT_CONNECTION_OPTIONS(OPTS),
    OPTS("name", "", "peer and pool name, unique per broker: letters, digits, - and _ (default "
         "target-<host>, a host name past 24 characters cut to its head and a hash of the whole; "
         "give each target on one host its own)", name),
    OPTS("model", "synthetic", "target checkpoint directory, or 'synthetic' for deterministic "
         "test data", model),
    OPTS("shards", "", "model: comma-separated token shard files (dflash-data)", shards),
    OPT("seed", CFG_INT, "0", 0, 9e15, "model: batch plan seed", seed),
    OPTS("capture-layers", "", "model: target layer ids to capture, ascending, e.g. 1,9,17,25,33 "
         "(default: DFlash's rule for --layers features)", capture),
    OPT("threads", CFG_INT, "0", 0, 1024, "model on the host backend: cpu threads (0 = all)",
        threads),
    OPTS("backend", "auto", "slot pool backend: host (POSIX shm, f32), cuda (IPC, bf16) or "
         "auto (cuda when built with it and a GPU is visible)", backend),
    OPT("device", CFG_INT, "0", 0, 64, "GPU this daemon uses (the target model's compute and "
        "the cuda slot pool): an ordinal among the GPUs CUDA_VISIBLE_DEVICES leaves visible",
        device),
    OPT("slots", CFG_INT, "8", 1, 256, "slots in the pool", slots),
    OPT("token-budget", CFG_INT, "2048", 16, 1 << 20, "tokens per slot", token_budget),
    OPT("max-seqs", CFG_INT, "64", 1, 65536, "sequences per slot", max_seqs),
    OPT("hidden", CFG_INT, "256", 1, 1 << 20, "hidden size of the captured layers", hidden),
    OPT("layers", CFG_INT, "3", 1, 1024, "captured layers per token", layers),
    OPTS("buckets", "256,512,1024,2048",
         "sequence-length buckets, inclusive upper bounds (at most 16)", buckets),
    OPT("batches-per-bucket", CFG_INT, "64", 1, 1 << 30, "synthetic: batches per bucket and "
        "epoch", batches_per_bucket),
    OPT("epochs", CFG_INT, "1", 1, 1 << 20, "epochs to produce", epochs),
    OPT("vocab-size", CFG_INT, "32000", 1, 1 << 24, "synthetic: token ids lie below this",
        vocab_size),
    OPT("rate", CFG_DOUBLE, "0", 0, 1e9, "synthetic: batches per second (0 = as fast as "
        "possible)", rate),
    OPT("progress-ms", CFG_INT, "10000", 0, 1 << 30, "progress line interval (0 = none)",
        progress_ms),
    OPT("timeout-ms", CFG_INT, "2000", 10, 600000, "broker request timeout", timeout_ms),
    OPT("max-batches", CFG_INT, "0", 0, 1e15, "stop after this many batches (0 = until the "
        "broker drains)", max_batches),
    OPT("broker-wait-ms", CFG_INT, "120000", 0, 1e9, "at start-up: exit with an error when no "
        "broker answers for this long (0 = wait forever); a broker lost after the first "
        "registration is waited for as long as it takes, and logged", broker_wait_ms),
    OPT("stall-exit-s", CFG_DOUBLE, "1800", 0, 604800, "exit with status 5 when the main loop "
        "makes no progress for this long (a hung GPU call, a deadlock): the broker gives its "
        "work to others and a supervisor restarts it (0 = never)", stall_exit_s),
    OPTS("log-level", "info", "debug, info, warn or error", log_level),
};
static int check_options(const cfg_table *t, const void *cfg, char *why, size_t len);
static const cfg_table target_table = {
    "dflash-target", "fills slot pools with target hidden states for the DFlash broker",
    "[options]", target_options, sizeof target_options / sizeof target_options[0], NULL,
    check_options, NULL};

_Static_assert(HOST_NAME_TARGET_MAX <= POOL_NAME_MAX, "a target's name is its pool's");

/* Frees the model's compute context (NULL for the synthetic target); nulls it. */
static void close_nn(pool_backend backend, nn_ctx **nn)
{
    if (*nn && backend == POOL_HOST) nn_cpu_destroy(nn);
#ifdef DFLASH_HAVE_CUDA
    if (*nn && backend == POOL_CUDA) nn_cuda_destroy(nn);
#endif
}

/* The model decides the slots' hidden size: a --hidden given explicitly (not defaulted) that
 * disagrees is refused rather than silently replaced; so are --capture-layers ids the model
 * lacks. The checks that need the model; the options' own are setup_from's. 0 or
 * DFLASH_ECONFIG after printing why. */
static int check_shape_flags(const cfg_table *t, const target_config *c, const model_config *mc,
                             const int *ids, int n_ids)
{
    char why[512], src[300];
    if (config_given(t, "hidden") && c->hidden != mc->hidden_size) {
        fprintf(stderr, "dflash-target: %s does not match %s's hidden_size %d (leave it out: the "
                "model decides)\n", config_source(t, c, "hidden", src, sizeof src), c->model,
                mc->hidden_size);
        return DFLASH_ECONFIG;
    }
    if (n_ids > 0 && target_layer_ids_check(ids, n_ids, mc->num_layers, why, sizeof why) < 0) {
        fprintf(stderr, "dflash-target: bad %s for %s: %s\n",
                config_source(t, c, "capture-layers", src, sizeof src), c->model, why);
        return DFLASH_ECONFIG;
    }
    return 0;
}

/* What the options give once checked across each other. */
typedef struct target_setup {
    pool_backend backend;
    slot_layout layout;
    uint32_t bucket_upper[TARGET_MAX_BUCKETS];
    uint32_t n_buckets;
    int ids[64]; /* --capture-layers; n_ids 0: DFlash's rule */
    int n_ids;
} target_setup;

/* Every start-up check of the options that needs neither the model nor the data (those are
 * check_shape_flags' and the producer's), with what they give into *s: the name, the backend,
 * the slot layout, the buckets, --capture-layers (whatever the model: the synthetic one must not
 * take "abc" either), and for a real model --shards, --layers against the --capture-layers
 * count, the token budget against the largest bucket. config_load runs it (check_options), so
 * --dump-config refuses what the start refuses; main() runs it again for *s. 0 or
 * DFLASH_ECONFIG with the reason, naming where each value came from, in why. */
static int setup_from(const cfg_table *t, const target_config *c, target_setup *s, char *why,
                      size_t len)
{
    char reason[256], src[300], src2[300];
#define REFUSE(...) return config_refuse(why, len, __VA_ARGS__)
#define SRC(name) config_source(t, c, name, src, sizeof src)
    memset(s, 0, sizeof *s);
    if (c->name[0] && !pool_name_valid(c->name)) /* it names the slot pool: found here */
        REFUSE("%s: give 1 to %u letters, digits, '-' or '_'", SRC("name"), POOL_NAME_MAX - 1);
    slot_options so = {c->backend, c->buckets, c->capture, c->token_budget, c->max_seqs,
                       c->hidden, c->layers};
    slot_setup ss = {.bucket_upper = s->bucket_upper, .max_buckets = TARGET_MAX_BUCKETS,
                     .ids = s->ids, .max_ids = 64};
    if (slot_options_setup(t, c, &so, &ss, why, len) < 0) return DFLASH_ECONFIG;
    s->backend = ss.backend;
    s->layout = ss.layout;
    s->n_buckets = ss.n_buckets;
    s->n_ids = ss.n_ids;
    if (strcmp(c->model, "synthetic") == 0) return 0;
    if (shard_list_names_none(c->shards)) /* "," too: it failed later, exit 1 (defect) */
        REFUSE("--model %s needs --shards FILE[,FILE...]", c->model);
    /* the model decides the captured layers' count from --capture-layers */
    if (s->n_ids > 0 && config_given(t, "layers") && c->layers != s->n_ids)
        REFUSE("%s disagrees with the %d ids of %s (give one of them)", SRC("layers"), s->n_ids,
               config_source(t, c, "capture-layers", src2, sizeof src2));
    batch_plan_params bp = {.bucket_bounds = s->bucket_upper, .n_buckets = (int)s->n_buckets,
                            .token_budget = (uint64_t)c->token_budget};
    if (batch_plan_params_check(&bp, reason, sizeof reason) < 0)
        REFUSE("%s, %s: %s", SRC("token-budget"),
               config_source(t, c, "buckets", src2, sizeof src2), reason);
    return 0;
#undef SRC
#undef REFUSE
}

/* config_load's check (target_table): setup_from's, for --dump-config and the start alike. */
static int check_options(const cfg_table *t, const void *cfg, char *why, size_t len)
{
    target_setup s;
    return setup_from(t, cfg, &s, why, len);
}

static void build_loop_config(const target_config *c, const target_setup *s,
                              target_loop_config *lc, char *endpoint, size_t ep_len)
{
    memset(lc, 0, sizeof *lc);
    client_resolve_endpoint(c->endpoint, c->runtime_dir, endpoint, ep_len);
    lc->endpoint = endpoint;
    lc->curve_server_key = c->curve_server_key;
    lc->curve_key = c->curve_key;
    lc->name = c->name;
    lc->backend = s->backend;
    lc->device = (int)c->device;
    lc->n_slots = (uint32_t)c->slots;
    lc->layout = s->layout;
    lc->n_buckets = s->n_buckets;
    memcpy(lc->bucket_upper, s->bucket_upper, sizeof s->bucket_upper);
    /* synthetic: every bucket has the same number of batches; its token share follows its
     * mean sequence length, roughly, so use equal batch shares (each batch ~ one budget) */
    for (uint32_t b = 0; b < lc->n_buckets; b++) {
        lc->bucket_batches[b] = (uint64_t)c->batches_per_bucket;
        lc->bucket_share[b] = 1.0 / lc->n_buckets;
    }
    lc->epochs = (uint32_t)c->epochs;
    lc->progress_ms = c->progress_ms;
    lc->timeout_ms = c->timeout_ms;
    lc->max_batches = c->max_batches;
    lc->register_fail_exit_ms = c->broker_wait_ms;
    lc->stall_exit_s = c->stall_exit_s;
}

int main(int argc, char **argv)
{
    blas_select_fast_kernels(argv);
    volatile sig_atomic_t *stop = signals_install_stop_flag();
    log_init("dflash-target", LOG_INFO);
    target_config cfg;
    cfg_source sources[sizeof target_options / sizeof target_options[0]];
    cfg_table table = target_table; /* with `sources`: where each value came from */
    table.sources = sources;
    int rc = config_load(&table, &cfg, argc, argv, NULL, 0, NULL);
    if (rc == 1) return 0;
    if (rc < 0) return 2;
    if (log_init_named(NULL, cfg.log_level) != 0) return 2;
    target_setup setup;
    char why[1024];
    if (setup_from(&table, &cfg, &setup, why, sizeof why) < 0) { /* config_load's check passed */
        fprintf(stderr, "dflash-target: %s\n", why);
        return 2;
    }
    if (!cfg.name[0]) host_name_target(cfg.name, sizeof cfg.name); /* target-<host> */

    target_loop_config lc;
    char endpoint[300];
    build_loop_config(&cfg, &setup, &lc, endpoint, sizeof endpoint);
    if (client_check_endpoint(endpoint, why, sizeof why) != 0) { /* a runtime dir not ours */
        fprintf(stderr, "dflash-target: %s\n", why);
        return 2;
    }

    target_producer *prod = NULL;
    const nn_ops *ops = NULL;
    nn_ctx *nn = NULL;
    const int *ids = setup.ids;
    int n_ids = setup.n_ids;
    if (strcmp(cfg.model, "synthetic") == 0) {
        prod = target_synthetic_new(&lc, (uint32_t)cfg.vocab_size, cfg.rate);
        lc.plan_id = target_synthetic_plan_id(&lc, (uint32_t)cfg.vocab_size);
        lc.has_plan_id = true;
    } else {
        /* the model's checks first, then the compute context (nothing to free on a refusal) */
        model_config mc;
        char cerr[512];
        if (hf_config_load(cfg.model, &mc, cerr, sizeof cerr) == 0 &&
            check_shape_flags(&table, &cfg, &mc, ids, n_ids) < 0)
            return 2;
        if (lc.backend == POOL_HOST) {
            ops = nn_cpu_ops();
            nn = nn_cpu_new((int)cfg.threads);
        } else {
#ifdef DFLASH_HAVE_CUDA
            ops = nn_cuda_ops();
            nn = nn_cuda_new(lc.device);
#endif
        }
        if (!nn) LOG_FATAL("no %s compute backend for the target model", cfg.backend);
        model_producer_opts mo = {.model_dir = cfg.model, .shards = cfg.shards,
                                  .bucket_bounds = lc.bucket_upper, .n_buckets = (int)lc.n_buckets,
                                  .token_budget = (uint32_t)cfg.token_budget,
                                  .max_seqs = (uint32_t)cfg.max_seqs, .seed = (uint64_t)cfg.seed,
                                  .layer_ids = n_ids ? ids : NULL, .n_layer_ids = n_ids,
                                  .drafter_layers = n_ids ? n_ids : (int)cfg.layers,
                                  .stop = stop};
        char err[512] = "";
        int why = 0;
        model_producer *mp = model_producer_new(&mo, ops, nn, &why, err, sizeof err);
        if (!mp) {
            if (*stop) LOG_INFO("stopped while loading the target model");
            else
                LOG_ERROR("cannot start the target on model %s and shards %s: %s", cfg.model,
                          cfg.shards, err);
            close_nn(lc.backend, &nn);
            return *stop ? 0 : why == DFLASH_ECONFIG ? 2 : 1;
        }
        rc = model_producer_loop_config(mp, &lc); /* layout and buckets come from the model */
        if (rc == 0) rc = model_producer_warmup(mp);
        if (rc == DFLASH_ESHUTDOWN) {
            LOG_INFO("stopped while warming up the target model");
            model_producer_destroy(&mp);
            close_nn(lc.backend, &nn);
            return 0;
        }
        if (rc < 0) {
            LOG_ERROR("target model %s: %s", cfg.model, err_str(rc));
            model_producer_destroy(&mp);
            close_nn(lc.backend, &nn);
            return 1;
        }
        /* the model decides the slot's hidden size and captured layers: dump those */
        cfg.hidden = lc.layout.hidden;
        cfg.layers = lc.layout.n_layers;
        int n_cap;
        const int *cap = target_model_layer_ids(model_producer_model(mp), &n_cap);
        target_layer_ids_text(cap, n_cap, cfg.capture, sizeof cfg.capture);
        prod = model_producer_as_target(&mp);
        model_producer_destroy(&mp); /* NULL after a successful hand-over */
    }
    if (!prod) LOG_FATAL("cannot create the %s producer", cfg.model);

    LOG_INFO("effective configuration (endpoint %s, slot %zu bytes, %s):", endpoint,
             lc.layout.slot_bytes, slot_dtype_name(lc.layout.dtype));
    config_dump(&target_table, &cfg, stderr);

    target_stats st;
    rc = target_loop_run(&lc, prod, stop, &st);
    LOG_INFO("%s: %llu batches, %llu tokens in %.1f s (%.0f tokens/s), fill %.1f s, waiting for "
             "a free slot %.1f s, %llu registrations", rc ? "failed" : "done",
             (unsigned long long)st.batches, (unsigned long long)st.tokens, st.elapsed_s,
             st.elapsed_s > 0 ? st.tokens / st.elapsed_s : 0.0, st.fill_s, st.wait_slot_s,
             (unsigned long long)st.registrations);
    target_producer_destroy(&prod);
    close_nn(lc.backend, &nn);
    if (st.name_in_use) return 4;
    if (rc < 0) {
        LOG_ERROR("dflash-target: %s", err_str(rc));
        return rc == DFLASH_ECONFIG ? 2 : 1;
    }
    return 0;
}
