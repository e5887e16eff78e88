/* dflash-drafter: claims slots from the broker, copies them, and trains the DFlash drafter on
 * them (DESIGN §2, steps 4-6). main() is the table of contents: config table (defaults < file <
 * DFLASH_* < flags), validate, build the slot layout and the consumer chosen by the mode
 * (--verify checks every byte against the synthetic target; training plugs in as another
 * consumer), log the effective config, run worker_loop until drained or SIGINT/SIGTERM, shut
 * down in reverse. Exit status: 0 done, 1 fatal error, 2 bad configuration, 3 a batch failed
 * verification (corrupt or mismatched data: the data plane is broken).
 * The only global is the stop flag. */
#include "config.h"
#include "err.h"
#include "log.h"
#include "worker_loop.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct drafter_config {
    char runtime_dir[256];
    char endpoint[256];
    char name[48];
    bool verify;
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
    bool exit_when_drained;
    char log_level[16];
} drafter_config;

#define OPT(n, t, d, lo, hi, h, m) {n, t, d, lo, hi, false, h, offsetof(drafter_config, m), 0}
#define OPTS(n, d, h, m) {n, CFG_STRING, d, 1, 0, false, h, offsetof(drafter_config, m), \
                          sizeof(((drafter_config *)0)->m)}
static const cfg_option drafter_options[] = {
    OPTS("runtime-dir", "", "0700 directory of the broker's ipc sockets (default "
         "$XDG_RUNTIME_DIR/dflash or /tmp/dflash-UID)", runtime_dir),
    OPTS("endpoint", "", "broker ROUTER endpoint (default ipc://<runtime-dir>/queue.sock)",
         endpoint),
    OPTS("name", "", "peer name, unique per drafter (default drafter-<host>-<pid>)", name),
    OPT("verify", CFG_BOOL, "false", 1, 0, "mode: check every byte of every batch against the "
        "synthetic target (dflash-target --model synthetic), ack, report throughput", verify),
    OPTS("backend", "host", "slot pool backend: host (POSIX shm, f32) or cuda (IPC, bf16)",
         backend),
    OPT("device", CFG_INT, "0", 0, 64, "GPU ordinal for the staging buffer and copies", device),
    OPT("token-budget", CFG_INT, "2048", 16, 1 << 20, "tokens per slot (as the target)",
        token_budget),
    OPT("max-seqs", CFG_INT, "64", 1, 65536, "sequences per slot (as the target)", max_seqs),
    OPT("hidden", CFG_INT, "256", 1, 1 << 20, "hidden size of the captured layers (as the target)",
        hidden),
    OPT("layers", CFG_INT, "3", 1, 1024, "captured layers per token (as the target)", layers),
    OPTS("buckets", "256,512,1024,2048", "sequence-length buckets (as the target)", buckets),
    OPT("vocab-size", CFG_INT, "32000", 1, 1 << 24, "verify: token ids lie below this (as the "
        "target)", vocab_size),
    OPT("rate", CFG_DOUBLE, "0", 0, 1e9, "verify: batches per second (0 = as fast as possible)",
        rate),
    OPT("progress-ms", CFG_INT, "10000", 0, 1 << 30, "progress line interval (0 = none)",
        progress_ms),
    OPT("timeout-ms", CFG_INT, "2000", 10, 600000, "broker request timeout", timeout_ms),
    OPT("max-batches", CFG_INT, "0", 0, 1e15, "stop after this many batches (0 = until the "
        "broker drains)", max_batches),
    OPT("broker-wait-ms", CFG_INT, "120000", 0, 1e9, "exit with an error when no broker "
        "answers for this long (0 = wait forever)", broker_wait_ms),
    OPT("exit-when-drained", CFG_BOOL, "true", 1, 0, "exit 0 when the broker reports drained",
        exit_when_drained),
    OPTS("log-level", "info", "debug, info, warn or error", log_level),
};
static const cfg_table drafter_table = {
    "dflash-drafter", "copies slots from the DFlash broker and trains (or verifies) on them",
    "[options]", drafter_options, sizeof drafter_options / sizeof drafter_options[0]};

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static int parse_buckets(const char *s, uint32_t *upper, uint32_t *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0 || *n >= WORKER_MAX_BUCKETS || (*n && (uint32_t)v <= upper[*n - 1]))
            return DFLASH_ECONFIG;
        upper[(*n)++] = (uint32_t)v;
        if (*end && *end != ',') return DFLASH_ECONFIG;
        p = *end == ',' ? end + 1 : end;
    }
    return *n ? 0 : DFLASH_ECONFIG;
}

int main(int argc, char **argv)
{
    log_init("dflash-drafter", LOG_INFO);
    drafter_config cfg;
    int rc = config_load(&drafter_table, &cfg, argc, argv, NULL, 0, NULL);
    if (rc == 1) return 0;
    if (rc < 0) return 2;
    log_level lvl;
    if (log_level_parse(cfg.log_level, &lvl) != 0) {
        fprintf(stderr, "dflash-drafter: bad --log-level '%s'\n", cfg.log_level);
        return 2;
    }
    log_set_level(lvl);

    worker_loop_config lc;
    memset(&lc, 0, sizeof lc);
    char endpoint[300], name[64];
    if (cfg.endpoint[0]) snprintf(endpoint, sizeof endpoint, "%s", cfg.endpoint);
    else if (cfg.runtime_dir[0])
        snprintf(endpoint, sizeof endpoint, "ipc://%.200s/queue.sock", cfg.runtime_dir);
    else if (getenv("XDG_RUNTIME_DIR") && *getenv("XDG_RUNTIME_DIR"))
        snprintf(endpoint, sizeof endpoint, "ipc://%.200s/dflash/queue.sock",
                 getenv("XDG_RUNTIME_DIR"));
    else snprintf(endpoint, sizeof endpoint, "ipc:///tmp/dflash-%u/queue.sock", (unsigned)getuid());
    if (cfg.name[0]) {
        snprintf(name, sizeof name, "%s", cfg.name);
    } else {
        char host[32] = "";
        gethostname(host, sizeof host - 1);
        snprintf(name, sizeof name, "drafter-%s-%d", host, (int)getpid());
    }
    lc.endpoint = endpoint;
    lc.name = name;
    if (pool_backend_parse(cfg.backend, &lc.backend) < 0) {
        fprintf(stderr, "dflash-drafter: --backend must be host or cuda, not '%s'\n", cfg.backend);
        return 2;
    }
    lc.device = (int)cfg.device;
    slot_dtype dt = lc.backend == POOL_CUDA ? SLOT_DTYPE_BF16 : SLOT_DTYPE_F32;
    rc = slot_layout_compute((uint32_t)cfg.token_budget, (uint32_t)cfg.max_seqs,
                             (uint32_t)cfg.hidden, (uint32_t)cfg.layers, dt, &lc.layout);
    if (rc < 0) {
        fprintf(stderr, "dflash-drafter: slot layout (token budget %lld, max seqs %lld, hidden "
                "%lld, layers %lld) is invalid: %s\n", (long long)cfg.token_budget,
                (long long)cfg.max_seqs, (long long)cfg.hidden, (long long)cfg.layers, err_str(rc));
        return 2;
    }
    uint32_t upper[WORKER_MAX_BUCKETS], n_buckets = 0;
    if (parse_buckets(cfg.buckets, upper, &n_buckets) < 0) {
        fprintf(stderr, "dflash-drafter: --buckets '%s' must be ascending positive integers "
                "separated by commas\n", cfg.buckets);
        return 2;
    }
    lc.progress_ms = cfg.progress_ms;
    lc.timeout_ms = cfg.timeout_ms;
    lc.max_batches = cfg.max_batches;
    lc.broker_wait_ms = cfg.broker_wait_ms;
    lc.exit_when_drained = cfg.exit_when_drained;

    worker_consumer *cons = NULL;
    if (cfg.verify) {
        cons = worker_verify_new(&lc, upper, n_buckets, (uint32_t)cfg.vocab_size, cfg.rate);
    } else {
        fprintf(stderr, "dflash-drafter: training is not wired into dflash-drafter yet; run with "
                "--verify against dflash-target --model synthetic\n");
        return 2;
    }
    if (!cons) LOG_FATAL("cannot create the consumer");

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    LOG_INFO("effective configuration (name %s, endpoint %s, slot %zu bytes, %s, mode %s):", name,
             endpoint, lc.layout.slot_bytes, slot_dtype_name(lc.layout.dtype), cons->name);
    config_dump(&drafter_table, &cfg, stderr);

    worker_stats st;
    rc = worker_loop_run(&lc, cons, &g_stop, &st);
    LOG_INFO("%s: %llu batches, %llu tokens in %.1f s (%.0f tokens/s), copied %.1f MB in %.2f s "
             "(grant to copy done p50 %.2f ms, p99 %.2f ms), consume %.1f s, waiting for a grant "
             "%.1f s, %llu stale leases, %llu registrations",
             rc ? "failed" : "done", (unsigned long long)st.batches, (unsigned long long)st.tokens,
             st.elapsed_s, st.elapsed_s > 0 ? st.tokens / st.elapsed_s : 0.0,
             st.bytes_copied / 1e6, st.copy_s, st.copy_p50_ms, st.copy_p99_ms, st.consume_s,
             st.wait_grant_s,
             (unsigned long long)st.stale_releases, (unsigned long long)st.registrations);
    worker_consumer_destroy(&cons);
    if (rc == DFLASH_ECORRUPT || rc == DFLASH_EMISMATCH) {
        LOG_ERROR("dflash-drafter: a batch failed verification: %s", err_str(rc));
        return 3;
    }
    if (rc < 0) {
        LOG_ERROR("dflash-drafter: %s", err_str(rc));
        return 1;
    }
    return 0;
}
