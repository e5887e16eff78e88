/* dflash-drafter: claims slots from the broker, copies them, and trains the DFlash drafter on
 * them (DESIGN §2, steps 4-6). main() is the table of contents: config table (defaults < file <
 * DFLASH_* < flags), validate (setup_from: every check of the options, which config_load also
 * runs for --dump-config; then those against the model), build the slot layout and the consumer
 * chosen by the mode, log the effective config, run worker_loop until drained, --max-steps or
 * SIGINT/SIGTERM, shut down in reverse. Modes:
 *   --train (default when --model is given)  the trainer (trainer.h): steps, metrics,
 *            checkpoints, exact resume;
 *   --verify         every byte of every batch against the synthetic target (synthetic.h);
 *   --verify-model   issue 4's end-to-end check: each slot's captured hidden states against a
 *                    direct single-process forward of the same batch (model_producer_verify),
 *                    for --verify-slots slots, then exit.
 * --group NAME (with --train) makes the process one rank of a data-parallel group
 * (group_worker.h): whole steps from the broker, gradients averaged with --comm shm|nccl.
 * Subcommand: `dflash-drafter eval --model TARGET --data SHARDS [--checkpoint DIR | --init-only]`
 * prints the offline tau of a checkpoint (or of the untrained seeded drafter) on held-out shards;
 * SIGINT/SIGTERM end it within a target layer or a chunk of drafted blocks, the tau of the
 * sequences done printed marked partial, exit 128 + the signal (eval_main). `dflash-drafter show
 * CHECKPOINT [--drafters N]` prints a checkpoint's step and training settings (show.h).
 * Exit status: 0 done, 1 fatal error, 2 bad configuration (also an ipc:// endpoint whose
 * directory is not ours alone: client_check_endpoint), 3 a batch failed verification or did
 * not fit the drafter (corrupt or mismatched data: the data plane or the configuration is wrong),
 * 4 another live drafter has our --name or replaced us as a restart of our run (the broker
 * refused our hello), or a live drafter registered with another CURVE key has our --name or our
 * run (the broker refused our hello or resume DENIED, saying so: Error.other_key), 5 hung
 * (stall-exit-s), 6 another live drafter trains another model on the broker (it refused our
 * resume, or our hello naming our run after it had forgotten us; a
 * refused hello or group join, 4 or 6, first writes the final checkpoint, reported to no broker,
 * unless a live process of our run replaced us: worker_session_save_refused), 7
 * training diverged (a NaN or infinite loss or gradient norm), 8 no step trained (every batch
 * had no weighted position). The only global is the stop flag. */
#include "batch_plan.h"
#include "blas_env.h"
#include "client.h"
#include "collective.h"
#include "config.h"
#include "hf_config.h"
#include "err.h"
#include "fsutil.h"
#include "host_name.h"
#include "log.h"
#include "show.h"
#include "signals.h"
#include "model_producer.h"
#include "shard.h"
#include "slot_options.h"
#include "target_model.h"
#include "trainer.h"
#include "worker_loop.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct drafter_config {
    char runtime_dir[256];
    char endpoint[256];
    char curve_server_key[256]; /* CURVE: the broker's public key file */
    char curve_key[256];        /* CURVE: our secret key file */
    char name[48];
    bool verify;
    bool train;
    bool verify_model;
    char model[1024];
    char shards[1024];
    char capture[256];
    int64_t seed;
    int64_t threads;
    int64_t draft_layers;
    int64_t block_size;
    int64_t mask_token_id;
    int64_t anchors;
    int64_t accumulate;
    double lr;
    double warmup_ratio;
    int64_t total_steps;
    double min_lr_ratio;
    double clip;
    double weight_decay;
    double gamma;
    int64_t anchor_seed;
    int64_t init_seed;
    int64_t tune_matmuls;
    char checkpoint_dir[1024];
    int64_t checkpoint_every;
    int64_t keep_last;
    char resume[1024];
    char init_weights[1024];
    char metrics_dir[1024];
    int64_t max_steps;
    double verify_tol;
    int64_t verify_slots;
    char backend[16];
    int64_t device;
    int64_t token_budget;
    int64_t max_seqs;
    int64_t hidden;
    int64_t layers;
    char buckets[256];
    int64_t vocab_size;
    double rate;
    int64_t progress_ms;
    int64_t timeout_ms;
    int64_t max_batches;
    int64_t broker_wait_ms;
    double stall_exit_s;
    int64_t max_copy_failures;
    bool exit_when_drained;
    char group[48];
    char comm[16];
    double comm_timeout_s;
    int group_size;
    double group_wait_s;
    char log_level[16];
} drafter_config;

#define OPT(n, t, d, lo, hi, h, m) {n, t, d, lo, hi, false, h, offsetof(drafter_config, m), 0}
#define OPTS(n, d, h, m) {n, CFG_STRING, d, 1, 0, false, h, offsetof(drafter_config, m), \
                          sizeof(((drafter_config *)0)->m)}
static const cfg_option drafter_options[] = {
    CLIENT_CONNECTION_OPTIONS(OPTS),
    OPTS("name", "", "peer name, unique per drafter (default drafter-<host>-<pid>)", name),
    OPT("verify", CFG_BOOL, "false", 1, 0, "mode: check every byte of every batch against the "
        "synthetic target (dflash-target --model synthetic), ack, report throughput", verify),
    OPT("train", CFG_BOOL, "false", 1, 0, "mode: train the DFlash drafter (the default when "
        "--model is given)", train),
    OPT("verify-model", CFG_BOOL, "false", 1, 0, "mode: check --verify-slots slots against a "
        "direct forward of the same batch by --model over --shards, then exit", verify_model),
    OPTS("model", "", "target checkpoint directory (the one dflash-target runs)", model),
    OPTS("shards", "", "verify-model: the target's --shards", shards),
    OPT("seed", CFG_INT, "0", 0, 9e15, "verify-model: the target's batch plan --seed", seed),
    OPTS("capture-layers", "", "target layer ids the target captures, ascending (as "
         "dflash-target; default: DFlash's rule for --layers features)", capture),
    OPT("threads", CFG_INT, "0", 0, 1024, "cpu backend threads (0 = all cores)", threads),
    OPT("draft-layers", CFG_INT, "1", 1, 64, "train: drafter decoder layers", draft_layers),
    OPT("block-size", CFG_INT, "16", 2, 64, "train: block size (1 anchor + predicted tokens)",
        block_size),
    OPT("mask-token-id", CFG_INT, "-1", -1, 1 << 24, "train: embedding row used as MASK (-1: "
        "the target tokenizer's <|MASK|>, else the first row past its tokenizer.json, 151669 for "
        "Qwen3, else vocab_size - 1; a resume keeps its checkpoint's)", mask_token_id),
    OPT("anchors", CFG_INT, "512", 1, 1 << 20, "train: anchors per sequence", anchors),
    OPT("accumulate", CFG_INT, "1", 1, 4096, "train: slots (batches) per optimizer step: "
        "their gradients are accumulated in fp32 and the step's loss is normalised over all of "
        "them; in a --group, micro-steps per group step, every rank the same (ranks x N <= 64); "
        "a resume keeps its checkpoint's step of T slots: alone or with --group-size R, each "
        "rank trains T / R (the nearest share, said, when R does not divide T)", accumulate),
    OPT("lr", CFG_DOUBLE, "6e-4", 0, 10, "train: peak learning rate (--lr x --weight-decay "
        "below 1)", lr),
    OPT("warmup-ratio", CFG_DOUBLE, "0.04", 0, 1, "train: warmup fraction of the schedule",
        warmup_ratio),
    OPT("total-steps", CFG_INT, "0", 0, 1e15, "train: cosine schedule length, at least "
        "--max-steps (0 = --max-steps; both 0: constant lr, no warmup)", total_steps),
    OPT("min-lr-ratio", CFG_DOUBLE, "0", 0, 1, "train: cosine floor as a fraction of --lr",
        min_lr_ratio),
    OPT("clip", CFG_DOUBLE, "1.0", 0, 1e9, "train: gradient-norm clip (0 = none)", clip),
    OPT("weight-decay", CFG_DOUBLE, "0", 0, 10, "train: AdamW decoupled weight decay "
        "(matrices; each step scales them by 1 - lr x this, so --lr x this must be below 1)",
        weight_decay),
    OPT("gamma", CFG_DOUBLE, "0", 0, 1e6, "train: loss decay gamma (0 = 7 for block 16, 5 for "
        "10, 4 for 8)", gamma),
    OPT("anchor-seed", CFG_INT, "0", 0, 9e15, "train: anchor sampling seed", anchor_seed),
    OPT("init-seed", CFG_INT, "1", 0, 9e15, "train: seed of fresh drafter weights", init_seed),
    OPT("tune-matmuls", CFG_INT, "8", 0, 16, "train, cuda: at start-up, time this many cuBLASLt "
        "algorithms per matmul shape of a full-size step and keep the fastest (0 = the "
        "heuristic's first)", tune_matmuls),
    OPTS("checkpoint-dir", "", "train: checkpoints go to DIR/step-N; a run restarted with the "
         "same DIR resumes from its newest one (DIR/run-id tells the broker it is the same run)",
         checkpoint_dir),
    OPT("checkpoint-every", CFG_INT, "500", 0, 1e15, "train: steps between checkpoints (0 = "
        "only the final one)", checkpoint_every),
    OPT("keep-last", CFG_INT, "3", 1, 1000, "train: checkpoints kept", keep_last),
    OPTS("resume", "", "train: resume exactly from this checkpoint (or the newest under it); "
         "a resume writes the checkpoint's model.safetensors again from its masters when that "
         "is missing or damaged", resume),
    OPTS("init-weights", "", "train: warm start (weights only) from this checkpoint", init_weights),
    OPTS("metrics-dir", "", "train: metrics.jsonl and TensorBoard events go here", metrics_dir),
    OPT("max-steps", CFG_INT, "0", 0, 1e15, "train: stop at this optimizer step (0 = at the end "
        "of the schedule, --total-steps or a resumed run's; with neither, when the broker "
        "drains)", max_steps),
    OPT("verify-tol", CFG_DOUBLE, "1e-4", 0, 1, "verify-model: max relative error per captured "
        "row", verify_tol),
    OPT("verify-slots", CFG_INT, "4", 1, 1 << 30, "verify-model: slots to check", verify_slots),
    OPTS("backend", "auto", "slot pool and compute backend: host (POSIX shm, f32; cpu ops), "
         "cuda (IPC, bf16; cuda ops) or auto (cuda when built with it and a GPU is visible)",
         backend),
    OPT("device", CFG_INT, "0", 0, 64, "GPU this daemon uses (training, the staging buffer and "
        "slot copies, and its rank of an nccl --group: one GPU per rank): an ordinal among the "
        "GPUs CUDA_VISIBLE_DEVICES leaves visible", device),
    OPT("token-budget", CFG_INT, "2048", 16, 1 << 20, "tokens per slot (as the target)",
        token_budget),
    OPT("max-seqs", CFG_INT, "64", 1, 65536, "sequences per slot (as the target)", max_seqs),
    OPT("hidden", CFG_INT, "256", 1, 1 << 20, "hidden size of the captured layers (as the target)",
        hidden),
    OPT("layers", CFG_INT, "3", 1, 1024, "captured layers per token (as the target)", layers),
    OPTS("buckets", "256,512,1024,2048", "sequence-length buckets (as the target; at most 16)",
         buckets),
    OPT("vocab-size", CFG_INT, "32000", 1, 1 << 24, "verify: token ids lie below this (as the "
        "target)", vocab_size),
    OPT("rate", CFG_DOUBLE, "0", 0, 1e9, "verify: batches per second (0 = as fast as possible)",
        rate),
    OPT("progress-ms", CFG_INT, "10000", 0, 1 << 30, "progress line interval (0 = none)",
        progress_ms),
    OPT("timeout-ms", CFG_INT, "2000", 10, 600000, "broker request timeout (a stop with the "
        "broker gone writes its final checkpoint at most twice this after the step)", timeout_ms),
    OPT("max-batches", CFG_INT, "0", 0, 1e15, "stop after this many batches (0 = until the "
        "broker drains)", max_batches),
    OPT("broker-wait-ms", CFG_INT, "120000", 0, 1e9, "at start-up: exit with an error when no "
        "broker answers for this long (0 = wait forever); a broker lost after the first "
        "registration is waited for as long as it takes, and logged", broker_wait_ms),
    OPT("stall-exit-s", CFG_DOUBLE, "1800", 0, 604800, "exit with status 5 when the main loop "
        "makes no progress for this long (a hung GPU call, a deadlock): the broker gives its "
        "work to others and a supervisor restarts it (0 = never)", stall_exit_s),
    OPT("max-copy-failures", CFG_INT, "60", 0, 1 << 30, "exit with an error after this many "
        "granted slots in a row could not be copied (this drafter cannot map the target's "
        "memory: another host, no shared /dev/shm or IPC namespace, a GPU that cannot reach "
        "the target's); 0 = retry forever", max_copy_failures),
    OPT("exit-when-drained", CFG_BOOL, "true", 1, 0,
        "exit 0 when the broker reports drained, or every batch of the target's epochs trained",
        exit_when_drained),
    OPTS("group", "", "train: join this data-parallel drafter group (one process per rank; the "
         "broker hands out whole steps, gradients are averaged; docs/protocol.md \"Groups\"); "
         "empty = train alone", group),
    OPTS("comm", "auto", "group: collective backend, shm (processes of one machine) or nccl; "
         "auto = nccl on the cuda backend when built with NCCL, else shm", comm),
    OPT("comm-timeout-s", CFG_DOUBLE, "60", 0.1, 86400, "group: a peer silent this long in a "
        "collective breaks the group (it re-forms); keep it above the step-time skew",
        comm_timeout_s),
    OPT("group-size", CFG_INT, "0", 0, WIRE_MAX_WORLD, "group: ranks the group waits for before "
        "it trains (a group step is a batch per rank, so a group started by its first rank "
        "alone trains smaller steps until the others join; a resume shares its checkpoint's "
        "step over them, --accumulate); 0 = start with those that have joined", group_size),
    OPT("group-wait-s", CFG_DOUBLE, "600", 0, 86400, "group: how long a group of fewer than "
        "--group-size ranks waits for the others (at start-up and after a rank is lost), then "
        "goes on with those it has", group_wait_s),
    OPTS("log-level", "info", "debug, info, warn or error", log_level),
};
static int check_options(const cfg_table *t, const void *cfg, char *why, size_t len);
static const cfg_table drafter_table = {
    "dflash-drafter", "copies slots from the DFlash broker and trains (or verifies) on them",
    "[options]\n       dflash-drafter eval [options]   offline tau of a checkpoint on held-out "
    "shards (eval --help)\n       dflash-drafter show CHECKPOINT [--drafters N]   a checkpoint's "
    "step and training settings (show --help)", drafter_options,
    sizeof drafter_options / sizeof drafter_options[0], NULL, check_options,
    (const char *const[]){"eval", NULL}};

/* What the options give once checked across each other. */
typedef enum { MODE_TRAIN, MODE_VERIFY, MODE_VERIFY_MODEL } drafter_mode;
typedef struct drafter_setup {
    drafter_mode mode;
    pool_backend backend;
    slot_layout layout; /* with --hidden: the model's hidden size replaces it at start-up */
    uint32_t upper[WORKER_MAX_BUCKETS];
    uint32_t n_buckets;
    int ids[64]; /* --capture-layers; n_ids 0: DFlash's rule */
    int n_ids;
    dp_comm_kind comm; /* --group only */
} drafter_setup;

/* Every start-up check of the options that needs neither the model nor the data (those are in
 * main() and trainer_new), with what they give into *s: --lr x --weight-decay, the backend, the
 * slot layout, the buckets, --comm, --capture-layers, one mode and what it needs; to train, the
 * schedule (trainer_schedule_check) and --layers against --capture-layers
 * (trainer_features_check). config_load runs it (check_options), so --dump-config refuses what
 * the start refuses; main() runs it again for *s. 0 or DFLASH_ECONFIG with the reason, naming
 * where each value came from, in why. */
static int setup_from(const cfg_table *t, const drafter_config *c, drafter_setup *s, char *why,
                      size_t len)
{
    char src[300], src2[300];
#define REFUSE(...) return config_refuse(why, len, __VA_ARGS__)
#define SRC(name) config_source(t, c, name, src, sizeof src)
#define SRC2(name) config_source(t, c, name, src2, sizeof src2)
    memset(s, 0, sizeof *s);
    /* AdamW's decoupled weight decay multiplies the weights by 1 - lr * wd each step, lr the
     * scheduled rate (at most --lr, reached after the warmup): at lr * wd >= 1 that factor is 0
     * or negative and the weights flip sign and grow each step until they overflow */
    if (c->lr * c->weight_decay >= 1.0)
        REFUSE("%s with %s: their product %g must stay below 1: AdamW's decoupled decay "
               "multiplies the weights by 1 - lr * weight_decay every step (lr up to --lr), "
               "which must stay positive, else the weights grow until they overflow; lower one "
               "of them (the recipe: --lr 6e-4, --weight-decay 0)", SRC("lr"),
               SRC2("weight-decay"), c->lr * c->weight_decay);
    slot_options so = {c->backend, c->buckets, c->capture, c->token_budget, c->max_seqs,
                       c->hidden, c->layers};
    slot_setup ss = {.bucket_upper = s->upper, .max_buckets = WORKER_MAX_BUCKETS, .ids = s->ids,
                     .max_ids = 64};
    if (slot_options_setup(t, c, &so, &ss, why, len) < 0) return DFLASH_ECONFIG;
    s->backend = ss.backend;
    s->layout = ss.layout;
    s->n_buckets = ss.n_buckets;
    s->n_ids = ss.n_ids;
    if (c->group[0]) {
        if (strcmp(c->comm, "auto") == 0)
            s->comm = s->backend == POOL_CUDA && dp_comm_have_nccl() ? DP_COMM_NCCL : DP_COMM_SHM;
        else if (dp_comm_kind_parse(c->comm, &s->comm) < 0)
            REFUSE("%s: give shm, nccl or auto", SRC("comm"));
        if (s->comm == DP_COMM_NCCL && (s->backend != POOL_CUDA || !dp_comm_have_nccl()))
            REFUSE("--comm nccl needs the cuda backend and a build with NCCL; use --comm shm");
    }
    bool train = c->train || (c->model[0] && !c->verify && !c->verify_model);
    if (c->verify + train + c->verify_model != 1)
        REFUSE("choose one mode: --train (with --model), --verify or --verify-model");
    s->mode = train ? MODE_TRAIN : c->verify ? MODE_VERIFY : MODE_VERIFY_MODEL;
    if (s->mode != MODE_VERIFY && !c->model[0])
        REFUSE("--%s needs --model TARGET_DIR", train ? "train" : "verify-model");
    if (s->mode == MODE_VERIFY_MODEL && shard_list_names_none(c->shards))
        REFUSE("--verify-model needs the target's --shards");
    if (s->mode == MODE_VERIFY_MODEL && s->backend != POOL_HOST)
        REFUSE("--verify-model runs its direct forward on the cpu; use --backend host");
    if (c->group_size && !c->group[0])
        REFUSE("%s is the size of a --group: give --group NAME, or leave it out",
               SRC("group-size"));
    if (!train) return 0;
    if (c->group[0] && c->accumulate > WIRE_MAX_WORLD)
        REFUSE("%s with %s: a group step holds at most %d batches (ranks x --accumulate)",
               SRC("accumulate"), SRC2("group"), WIRE_MAX_WORLD);
    if (c->group[0] && c->group_size * (c->accumulate > 1 ? c->accumulate : 1) > WIRE_MAX_WORLD)
        REFUSE("%s with %s: a group step holds at most %d batches (ranks x --accumulate)",
               SRC("group-size"), SRC2("accumulate"), WIRE_MAX_WORLD);
    dflash_train_cfg tc = {.lr = c->lr, .min_lr_ratio = c->min_lr_ratio,
                           .total_steps = c->total_steps};
    if (trainer_schedule_check(&tc, c->max_steps, SRC("total-steps"), SRC2("max-steps"), why,
                               len) < 0 ||
        trainer_features_check(s->n_ids, (int)c->layers, SRC("capture-layers"), SRC2("layers"),
                               why, len) < 0)
        return DFLASH_ECONFIG;
    return 0;
#undef SRC2
#undef SRC
#undef REFUSE
}

/* config_load's check (drafter_table): setup_from's, for --dump-config and the start alike. */
static int check_options(const cfg_table *t, const void *cfg, char *why, size_t len)
{
    drafter_setup s;
    return setup_from(t, cfg, &s, why, len);
}

/* ------------------------------------------------------------ the --verify-model consumer */

typedef struct model_verify_ctx {
    model_producer *p;
    nn_ctx *nn; /* the cpu context the producer computes with; freed after it */
    pool_backend backend;
    slot_layout layout;
    double tol, worst;
    void *host;
    uint64_t n;
} model_verify_ctx;

static int model_verify_consume(void *vctx, const worker_batch *b, uint64_t *step)
{
    model_verify_ctx *v = vctx;
    const void *img = b->staged;
    if (v->backend == POOL_CUDA) {
        int rc = pool_staging_read(POOL_CUDA, v->host, b->staged,
                                   slot_used_bytes(&v->layout, b->n_tokens));
        if (rc < 0) return rc;
        img = v->host;
    }
    char err[512] = "";
    double max_err = 0;
    int rc = model_producer_verify(v->p, img, &v->layout, v->tol, &max_err, err, sizeof err);
    if (rc < 0) {
        LOG_ERROR("VERIFY FAILED for batch (%u, %u, %llu): %s", b->wu.epoch, b->wu.bucket,
                  (unsigned long long)b->wu.batch, err);
        return rc == DFLASH_EMISMATCH ? rc : DFLASH_ECORRUPT;
    }
    if (max_err > v->worst) v->worst = max_err;
    LOG_INFO("batch (%u, %u, %llu): %u tokens, %u sequences match a direct forward (max relative "
             "error %.3g, tolerance %.3g)", b->wu.epoch, b->wu.bucket,
             (unsigned long long)b->wu.batch, b->n_tokens, b->n_seqs, max_err, v->tol);
    *step = ++v->n;
    return 0;
}

static uint64_t model_verify_committed(void *vctx)
{
    return ((model_verify_ctx *)vctx)->n;
}

static int model_verify_finish(void *vctx)
{
    model_verify_ctx *v = vctx;
    LOG_INFO("verify-model: %llu slots verified against a direct forward, worst relative error "
             "%.3g", (unsigned long long)v->n, v->worst);
    return 0;
}

static void model_verify_destroy(void *vctx)
{
    model_verify_ctx *v = vctx;
    model_producer_destroy(&v->p);
    nn_cpu_destroy(&v->nn);
    free(v->host);
    free(v);
}

/* Takes ownership of *p and *nn (both NULLed). NULL on out of memory (nothing taken). */
static worker_consumer *model_verify_new(model_producer **p, nn_ctx **nn,
                                         const worker_loop_config *lc, double tol)
{
    worker_consumer *c = calloc(1, sizeof *c);
    model_verify_ctx *v = calloc(1, sizeof *v);
    if (!c || !v || (lc->backend == POOL_CUDA && !(v->host = malloc(lc->layout.slot_bytes)))) {
        free(c);
        if (v) free(v->host);
        free(v);
        return NULL;
    }
    v->p = *p;
    *p = NULL;
    v->nn = *nn;
    *nn = NULL;
    v->backend = lc->backend;
    v->layout = lc->layout;
    v->tol = tol;
    *c = (worker_consumer){.name = "verify-model", .ctx = v, .consume = model_verify_consume,
                           .committed = model_verify_committed, .destroy = model_verify_destroy,
                           .finish = model_verify_finish};
    return c;
}

/* ------------------------------------------------------------------------ eval subcommand */

typedef struct eval_config {
    char checkpoint[1024];
    char model[1024];
    char data[2048];
    bool init_only;
    int64_t threads;
    int64_t eval_seqs;
    int64_t progress_ms;
    int64_t draft_layers, block_size, mask_token_id, layers, init_seed;
    char capture[256];
    bool json;
    char log_level[16];
} eval_config;

#define EOPT(n, t, d, lo, hi, h, m) {n, t, d, lo, hi, false, h, offsetof(eval_config, m), 0}
#define EOPTS(n, d, h, m) {n, CFG_STRING, d, 1, 0, false, h, offsetof(eval_config, m), \
                           sizeof(((eval_config *)0)->m)}
static const cfg_option eval_options[] = {
    EOPTS("checkpoint", "", "drafter checkpoint directory, or a --checkpoint-dir (its newest)",
          checkpoint),
    EOPTS("model", "", "the target checkpoint directory", model),
    EOPTS("data", "", "comma-separated held-out shards (the target's greedy continuations); "
          "each reply, a run of loss_mask 1, is decoded on its own", data),
    EOPT("init-only", CFG_BOOL, "false", 1, 0, "evaluate the untrained drafter that training "
         "starts from (same --draft-layers, --block-size, --layers, --init-seed)", init_only),
    EOPT("threads", CFG_INT, "0", 0, 1024, "cpu threads (0 = all cores)", threads),
    /* not "max-seqs": that is the slot layout's, set in DFLASH_MAX_SEQS for every service */
    EOPT("eval-seqs", CFG_INT, "0", 0, 1e12, "evaluate the first N sequences (0 = all)",
         eval_seqs),
    EOPT("progress-ms", CFG_INT, "10000", 0, 1 << 30, "progress line interval when stderr is not "
         "a terminal, also inside one long sequence (0 = none; a terminal's line is rewritten "
         "every 0.2 s)", progress_ms),
    EOPT("draft-layers", CFG_INT, "1", 1, 64, "init-only: drafter layers", draft_layers),
    EOPT("block-size", CFG_INT, "16", 2, 64, "init-only: block size", block_size),
    EOPT("mask-token-id", CFG_INT, "-1", -1, 1 << 24, "init-only: MASK row (-1: as training's default)",
         mask_token_id),
    EOPT("layers", CFG_INT, "3", 1, 64, "init-only: captured target layers", layers),
    EOPTS("capture-layers", "", "init-only: target layer ids, ascending (default: DFlash's rule)",
          capture),
    EOPT("init-seed", CFG_INT, "1", 0, 9e15, "init-only: seed of the fresh weights", init_seed),
    EOPT("json", CFG_BOOL, "false", 1, 0, "print one JSON object instead of a sentence", json),
    EOPTS("log-level", "warn", "debug, info, warn or error", log_level),
};
static int eval_check(const cfg_table *t, const void *cfg, char *why, size_t len);
static const cfg_table eval_table = {
    "dflash-drafter eval", "offline acceptance length tau (docs/operating.md section 5) of a drafter checkpoint "
    "on held-out shards", "[options]", eval_options,
    sizeof eval_options / sizeof eval_options[0], NULL, eval_check, NULL};

/* Every check of eval's options (the model's and the data's are trainer_eval's), with the
 * captured ids into ids[0..64) and their count into *n_ids: what to evaluate on, one drafter,
 * --capture-layers. config_load runs it (eval_check), so --dump-config refuses what eval
 * refuses; eval_main() runs it again for the ids. 0 or DFLASH_ECONFIG with the reason in why. */
static int eval_setup_from(const cfg_table *t, const eval_config *c, int *ids, int *n_ids,
                           char *why, size_t len)
{
    char reason[256], src[300];
    if (!c->model[0] || shard_list_names_none(c->data) || (!c->checkpoint[0] && !c->init_only))
        return config_refuse(why, len, "needs --model TARGET_DIR, --data SHARD[,...] and "
                             "--checkpoint DIR (or --init-only)");
    if (c->checkpoint[0] && c->init_only)
        return config_refuse(why, len, "%s and --init-only name two drafters: give one",
                             config_source(t, c, "checkpoint", src, sizeof src));
    *n_ids = target_capture_layers_parse(c->capture, ids, 64, reason, sizeof reason);
    if (*n_ids < 0)
        return config_refuse(why, len, "bad %s: %s",
                             config_source(t, c, "capture-layers", src, sizeof src), reason);
    return 0;
}

/* config_load's check (eval_table): eval_setup_from's. */
static int eval_check(const cfg_table *t, const void *cfg, char *why, size_t len)
{
    int ids[64], n_ids = 0;
    return eval_setup_from(t, cfg, ids, &n_ids, why, len);
}

/* eval's count was --max-seqs, the name of the slot layout's sequences per slot: a deployment's
 * DFLASH_MAX_SEQS changed how many sequences eval read. It is --eval-seqs now; the old flag (and
 * eval's own variable) are refused naming it, so an old command is not silently another count.
 * 0 or the exit status (2). */
static int eval_refuse_max_seqs(int argc, char **argv)
{
    const char *var = "DFLASH_DRAFTER_EVAL_MAX_SEQS", *how = NULL;
    for (int i = 1; i < argc && !how; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--max-seqs") == 0 || strncmp(argv[i], "--max-seqs=", 11) == 0)
            how = "--max-seqs";
    }
    if (!how && getenv(var)) how = var;
    if (!how) return 0;
    fprintf(stderr, "dflash-drafter eval: %s is not eval's option (--max-seqs is the slot "
            "layout's sequences per slot): evaluate the first N sequences with --eval-seqs N "
            "(DFLASH_EVAL_SEQS)\n", how);
    return 2;
}

/* eval's result on stdout, a sentence or (--json) one object; a stopped eval's marked partial
 * (r->total sequences were to be evaluated, sequences + skipped were). False (said) when stdout
 * did not take it. */
static bool eval_print(const eval_config *ec, const trainer_eval_result *r, bool partial)
{
    const char *what = ec->init_only ? "untrained" : ec->checkpoint;
    long done = r->sequences + r->skipped;
    char tau[32] = "null", pooled[32] = "null";
    if (r->cycles) {
        snprintf(tau, sizeof tau, "%.4f", r->tau);
        snprintf(pooled, sizeof pooled, "%.4f", r->tau_pooled);
    }
    if (ec->json)
        printf("{\"tau\": %s, \"tau_pooled\": %s, \"responses\": %ld, \"cycles\": %ld, "
               "\"sequences\": %ld, \"skipped\": %ld, \"total\": %ld, \"partial\": %s, "
               "\"block_size\": %d, \"seconds\": %.2f}\n",
               tau, pooled, r->responses, r->cycles, r->sequences, r->skipped, r->total,
               partial ? "true" : "false", r->block_size, r->seconds);
    else if (!partial)
        printf("tau %.4f (the mean over %ld responses of each one's mean acceptance length; "
               "%.4f pooled over its %ld draft cycles; %ld held-out sequences, %ld without a "
               "response skipped, block %d, drafter %s) in %.1f s\n",
               r->tau, r->responses, r->tau_pooled, r->cycles, r->sequences, r->skipped,
               r->block_size, what, r->seconds);
    else if (r->cycles)
        printf("stopped after %ld of %ld sequences: tau %.4f over the %ld sequences done (%ld "
               "responses; %.4f pooled over %ld draft cycles, %ld without a response skipped, "
               "block %d, drafter %s) in %.1f s (partial)\n", done, r->total, r->tau, done,
               r->responses, r->tau_pooled, r->cycles, r->skipped, r->block_size, what,
               r->seconds);
    else
        printf("stopped after %ld of %ld sequences: no draft cycle yet, so no tau (partial)\n",
               done, r->total);
    return fs_stdout_written("dflash-drafter eval");
}

/* `dflash-drafter eval`: exit 0 with tau, 1 or 2 (docs/operating.md section 7), or 128 + the
 * signal (130 SIGINT, 143 SIGTERM, as a shell reports a process the signal ended) when a stop
 * ended it early, after printing the partial tau of the sequences done, marked so. */
static int eval_main(int argc, char **argv, volatile sig_atomic_t *stop)
{
    eval_config ec;
    int rc = eval_refuse_max_seqs(argc, argv);
    if (rc) return rc;
    cfg_source sources[sizeof eval_options / sizeof eval_options[0]];
    cfg_table table = eval_table; /* with `sources`: where each value came from */
    table.sources = sources;
    rc = config_load(&table, &ec, argc, argv, NULL, 0, NULL);
    if (rc == 1) return 0;
    if (rc < 0) return 2;
    if (log_init_named(NULL, ec.log_level) != 0) return 2;
    int ids[64], n_ids = 0;
    char why[1024];
    if (eval_setup_from(&table, &ec, ids, &n_ids, why, sizeof why) < 0) { /* config_load's */
        fprintf(stderr, "dflash-drafter eval: %s\n", why);
        return 2;
    }
    trainer_eval_opts eo = {.checkpoint = ec.init_only ? NULL : ec.checkpoint,
                            .model_dir = ec.model, .data = ec.data, .threads = (int)ec.threads,
                            .eval_seqs = ec.eval_seqs, .draft_layers = (int)ec.draft_layers,
                            .block_size = (int)ec.block_size,
                            .mask_token_id = (int)ec.mask_token_id,
                            .n_feat = n_ids ? n_ids : (int)ec.layers,
                            .capture_ids = n_ids ? ids : NULL, .n_capture_ids = n_ids,
                            .init_seed = (uint64_t)ec.init_seed, .stop = stop,
                            .progress_s = (double)ec.progress_ms / 1000.0};
    trainer_eval_result r;
    char err[512] = "";
    rc = trainer_eval(&eo, &r, err, sizeof err);
    if (rc == DFLASH_ESHUTDOWN) {
        fprintf(stderr, "dflash-drafter eval: %s: signal %d (the tau printed is partial)\n", err,
                (int)*stop);
        (void)eval_print(&ec, &r, true); /* the signal's status either way */
        return 128 + (*stop ? (int)*stop : SIGTERM);
    }
    if (rc < 0) {
        fprintf(stderr, "dflash-drafter eval: %s (%s)\n", err, err_str(rc));
        return rc == DFLASH_EMISMATCH || rc == DFLASH_ECONFIG ? 2 : 1;
    }
    return eval_print(&ec, &r, false) ? 0 : 1;
}

int main(int argc, char **argv)
{
    blas_select_fast_kernels(argv);
    volatile sig_atomic_t *stop = signals_install_stop_flag();
    log_init("dflash-drafter", LOG_INFO);
    if (argc > 1 && strcmp(argv[1], "eval") == 0) return eval_main(argc - 1, argv + 1, stop);
    if (argc > 1 && strcmp(argv[1], "show") == 0) return show_main(argc - 1, argv + 1);
    drafter_config cfg;
    cfg_source sources[sizeof drafter_options / sizeof drafter_options[0]];
    cfg_table table = drafter_table; /* with `sources`: where each value came from */
    table.sources = sources;
    int rc = config_load(&table, &cfg, argc, argv, NULL, 0, NULL);
    if (rc == 1) return 0;
    if (rc < 0) return 2;
    if (log_init_named(NULL, cfg.log_level) != 0) return 2;
    drafter_setup setup;
    char why[1024];
    if (setup_from(&table, &cfg, &setup, why, sizeof why) < 0) { /* config_load's check passed */
        fprintf(stderr, "dflash-drafter: %s\n", why);
        return 2;
    }
    cfg.train = setup.mode == MODE_TRAIN; /* the default mode with --model: the effective
                                            * configuration logged at start-up shows it */
    cfg.verify = setup.mode == MODE_VERIFY;
    cfg.verify_model = setup.mode == MODE_VERIFY_MODEL;

    worker_loop_config lc;
    memset(&lc, 0, sizeof lc);
    char endpoint[300], name[64];
    client_resolve_endpoint(cfg.endpoint, cfg.runtime_dir, endpoint, sizeof endpoint);
    if (client_check_endpoint(endpoint, why, sizeof why) != 0) { /* a runtime dir not ours */
        fprintf(stderr, "dflash-drafter: %s\n", why);
        return 2;
    }
    if (cfg.name[0]) {
        snprintf(name, sizeof name, "%s", cfg.name);
    } else {
        char prefix[HOST_NAME_DRAFTER_MAX];
        host_name_drafter_prefix(prefix, sizeof prefix);
        snprintf(name, sizeof name, "%s%d", prefix, (int)getpid());
    }
    lc.endpoint = endpoint;
    lc.curve_server_key = cfg.curve_server_key;
    lc.curve_key = cfg.curve_key;
    lc.name = name;
    lc.backend = setup.backend;
    lc.device = (int)cfg.device;
    lc.layout = setup.layout;
    slot_dtype dt = setup.layout.dtype;
    const uint32_t *upper = setup.upper;
    uint32_t n_buckets = setup.n_buckets;
    lc.progress_ms = cfg.progress_ms;
    lc.timeout_ms = cfg.timeout_ms;
    lc.max_batches = cfg.max_batches;
    lc.broker_wait_ms = cfg.broker_wait_ms;
    lc.stall_exit_s = cfg.stall_exit_s;
    lc.max_copy_failures = cfg.max_copy_failures;
    lc.exit_when_drained = cfg.exit_when_drained;
    if (cfg.group[0]) {
        lc.group = cfg.group;
        lc.comm_kind = (int)setup.comm;
        lc.comm_timeout_s = cfg.comm_timeout_s;
        lc.group_size = (uint32_t)cfg.group_size;
        lc.group_wait_s = cfg.group_wait_s;
    }
    const int *ids = setup.ids;
    int n_ids = setup.n_ids;

    worker_consumer *cons = NULL;
    char err[2048] = ""; /* a resume refusal names its checkpoint twice */
    if (cfg.model[0]) { /* the slots carry the target's hidden size: take it from its config */
        model_config tcfg;
        if (hf_config_load(cfg.model, &tcfg, err, sizeof err) < 0) {
            fprintf(stderr, "dflash-drafter: --model %s: %s\n", cfg.model, err);
            return 2;
        }
        if ((uint32_t)tcfg.hidden_size != lc.layout.hidden) {
            if (config_given(&table, "hidden")) {
                char src[300];
                fprintf(stderr, "dflash-drafter: %s does not match the target's hidden_size %d "
                        "(leave it out: the model decides)\n",
                        config_source(&table, &cfg, "hidden", src, sizeof src),
                        tcfg.hidden_size);
                return 2;
            }
            rc = slot_layout_compute((uint32_t)cfg.token_budget, (uint32_t)cfg.max_seqs,
                                     (uint32_t)tcfg.hidden_size, (uint32_t)cfg.layers, dt,
                                     &lc.layout);
            if (rc < 0) {
                fprintf(stderr, "dflash-drafter: slot layout: %s\n", err_str(rc));
                return 2;
            }
            cfg.hidden = tcfg.hidden_size; /* so the effective config shows it */
        }
    }
    if (cfg.verify) {
        cons = worker_verify_new(&lc, upper, n_buckets, (uint32_t)cfg.vocab_size, cfg.rate);
    } else if (cfg.verify_model) {
        const nn_ops *ops = nn_cpu_ops();
        nn_ctx *nn = nn_cpu_new((int)cfg.threads);
        model_producer_opts mo = {.model_dir = cfg.model, .shards = cfg.shards,
                                  .bucket_bounds = upper, .n_buckets = (int)n_buckets,
                                  .token_budget = (uint32_t)cfg.token_budget,
                                  .max_seqs = (uint32_t)cfg.max_seqs, .seed = (uint64_t)cfg.seed,
                                  .layer_ids = n_ids ? ids : NULL, .n_layer_ids = n_ids,
                                  .drafter_layers = n_ids ? n_ids : (int)cfg.layers};
        int why = 0;
        model_producer *mp = nn ? model_producer_new(&mo, ops, nn, &why, err, sizeof err) : NULL;
        if (!mp) {
            LOG_ERROR("cannot load the target model %s for verification: %s", cfg.model, err);
            nn_cpu_destroy(&nn);
            return why == DFLASH_ECONFIG ? 2 : 1;
        }
        slot_layout want;
        if (model_producer_layout(mp, &want) < 0 || want.slot_bytes != lc.layout.slot_bytes ||
            want.hidden != lc.layout.hidden || want.n_layers != lc.layout.n_layers) {
            LOG_ERROR("the target's slots (hidden %u, %u layers, %zu bytes) differ from ours "
                      "(--hidden %u, --layers %u, %zu bytes)", want.hidden, want.n_layers,
                      want.slot_bytes, lc.layout.hidden, lc.layout.n_layers,
                      lc.layout.slot_bytes);
            model_producer_destroy(&mp);
            nn_cpu_destroy(&nn);
            return 2;
        }
        lc.max_batches = cfg.verify_slots;
        cons = model_verify_new(&mp, &nn, &lc, cfg.verify_tol);
        model_producer_destroy(&mp);
        nn_cpu_destroy(&nn);
    } else {
        trainer_opts to = {.model_dir = cfg.model, .backend = lc.backend, .device = lc.device,
                           .threads = (int)cfg.threads, .layout = &lc.layout,
                           .draft_layers = (int)cfg.draft_layers,
                           .block_size = (int)cfg.block_size,
                           .mask_token_id = (int)cfg.mask_token_id,
                           .capture_ids = n_ids ? ids : NULL, .n_capture_ids = n_ids,
                           .init_seed = (uint64_t)cfg.init_seed,
                           .tune_matmuls = (int)cfg.tune_matmuls,
                           .checkpoint_dir = cfg.checkpoint_dir,
                           .checkpoint_every = cfg.checkpoint_every,
                           .keep_last = (int)cfg.keep_last,
                           .resume = cfg.resume, .init_weights = cfg.init_weights,
                           .metrics_dir = cfg.metrics_dir, .progress = cfg.progress_ms > 0,
                           .group = cfg.group[0] != '\0',
                           .group_size = (int)cfg.group_size,
                           .max_steps = cfg.max_steps, .stop = stop};
        dflash_train_cfg_default(&to.train);
        to.train.n_anchors = (int)cfg.anchors;
        to.train.accumulate = (int)cfg.accumulate;
        to.train.lr = cfg.lr;
        to.train.warmup_ratio = cfg.warmup_ratio;
        to.train.total_steps = cfg.total_steps;
        to.train.min_lr_ratio = cfg.min_lr_ratio;
        to.train.clip = cfg.clip;
        to.train.weight_decay = cfg.weight_decay;
        to.train.gamma = cfg.gamma;
        to.train.seed = (uint64_t)cfg.anchor_seed;
        cons = trainer_new(&to, err, sizeof err);
        if (!cons) {
            LOG_ERROR("cannot start training: %s", err);
            return 2;
        }
    }
    if (!cons) LOG_FATAL("cannot create the consumer");

    LOG_INFO("effective configuration (name %s, endpoint %s, slot %zu bytes, %s, mode %s):", name,
             endpoint, lc.layout.slot_bytes, slot_dtype_name(lc.layout.dtype), cons->name);
    config_dump(&drafter_table, &cfg, stderr);

    worker_stats st;
    rc = worker_loop_run(&lc, cons, stop, &st);
    LOG_INFO("%s: %llu batches, %llu tokens in %.1f s (%.0f tokens/s), copied %.1f MB in %.2f s "
             "(grant to copy done p50 %.2f ms, p99 %.2f ms), consume %.1f s, waiting for a grant "
             "%.1f s, %llu copies failed (slot given back unread), %llu copies dropped (release "
             "refused), %llu registrations",
             rc ? "failed" : "done", (unsigned long long)st.batches, (unsigned long long)st.tokens,
             st.elapsed_s, st.elapsed_s > 0 ? st.tokens / st.elapsed_s : 0.0,
             st.bytes_copied / 1e6, st.copy_s, st.copy_p50_ms, st.copy_p99_ms, st.consume_s,
             st.wait_grant_s,
             (unsigned long long)st.copy_failures, (unsigned long long)st.stale_releases,
             (unsigned long long)st.registrations);
    worker_consumer_destroy(&cons);
    if (st.name_in_use) return 4;
    if (st.other_model) return 6;
    if (rc == DFLASH_ECONFIG || (cfg.group[0] && rc == DFLASH_EFULL)) {
        LOG_ERROR("dflash-drafter: %s (see above)", err_str(rc));
        return 2;
    }
    if (rc == DFLASH_ENONFINITE) {
        LOG_ERROR("dflash-drafter: training diverged (see above); nothing after the last finite "
                  "step was checkpointed or committed");
        return 7;
    }
    if (rc == DFLASH_ENODATA) {
        LOG_ERROR("dflash-drafter: no step trained: the data has nothing to train on (see above)");
        return 8;
    }
    if (rc == DFLASH_ECORRUPT || rc == DFLASH_EMISMATCH) {
        LOG_ERROR("dflash-drafter: a batch failed verification or did not fit the drafter: %s",
                  err_str(rc));
        return 3;
    }
    if (rc < 0) {
        LOG_ERROR("dflash-drafter: %s", err_str(rc));
        return 1;
    }
    return 0;
}
