/* bench-pipeline: does the pipeline keep up with its slower side? (issue 3, DESIGN §2)
 *
 * Runs the real daemons as processes on the host backend: dflash-queue, dflash-target --model
 * synthetic paced at --producer-rate batches/s, and --drafters dflash-drafter --verify each paced
 * at --consumer-rate. First it measures each side alone, in this process, with the same pacing
 * and the same per-batch work (synthetic fill / byte-exact verify of one slot, the buckets in
 * turn), then the end-to-end rate of committed batches from the broker's ledger over --seconds
 * after a warm-up. With --backend cuda the daemons also move each slot to and from the GPU,
 * which the sides alone (host work only) leave out: there, the ratio is against the host work.
 * Prints one table; the last line is end-to-end / slower side alone (goal >= 97%: measured,
 * not checked).
 * --targets N runs N targets (pools of their own, named bench-t0..): the drafters' grants then
 * alternate between pools, which their importers keep mapped side by side. Exit 1 when a daemon
 * does not register within 60 s or does not exit 0 on SIGTERM, no batch is committed in the
 * window, a target wrote no more batches than its slots (its pool never served), a drafter
 * found a batch that failed verification, or a drafter's summary counts a slot copy that
 * failed (or is missing).
 *   bench-pipeline [--producer-rate 200] [--consumer-rate 120] [--drafters 2] [--seconds 10]
 *                  [--targets 1] [--backend host|cuda] [--drafter-device N]
 * The daemons are found next to this program's build tree (BUILD/bench/..), or via
 * --build-dir. Their runtime dir is a new mkdtemp one (dflash-queue checks it as its own). This
 * program's own client only talks to that broker, so it checks the dir as dflash-ctl does, making
 * nothing (client_check_endpoint_existing: ours, 0700, not a link), before it starts any daemon
 * (exit 1 otherwise, the reason on stderr).
 */
#include "client.h"
#include "monotime.h"
#include "config.h"
#include "err.h"
#include "log.h"
#include "slot.h"
#include "synthetic.h"

#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_config {
    double producer_rate, consumer_rate;
    int64_t drafters, targets;
    double seconds, warmup;
    int64_t token_budget, hidden, layers, slots, min_ready, max_depth;
    char build_dir[PATH_MAX];
    char backend[16];
    int64_t drafter_device;
} bench_config;

#define OPT(n, t, d, lo, hi, h, m) {n, t, d, lo, hi, false, h, offsetof(bench_config, m), 0}
static const cfg_option bench_options[] = {
    OPT("producer-rate", CFG_DOUBLE, "200", 0, 1e6, "target batches/s (0 = unpaced)",
        producer_rate),
    OPT("consumer-rate", CFG_DOUBLE, "120", 0, 1e6, "batches/s per drafter (0 = unpaced)",
        consumer_rate),
    OPT("drafters", CFG_INT, "2", 1, 16, "verifying drafters", drafters),
    OPT("targets", CFG_INT, "1", 1, 4, "synthetic targets, each with its own pool", targets),
    OPT("seconds", CFG_DOUBLE, "10", 1, 3600, "measurement window", seconds),
    OPT("warmup", CFG_DOUBLE, "3", 0, 600, "seconds before measuring", warmup),
    OPT("token-budget", CFG_INT, "1024", 16, 1 << 20, "tokens per slot", token_budget),
    OPT("hidden", CFG_INT, "64", 1, 1 << 16, "hidden size", hidden),
    OPT("layers", CFG_INT, "3", 1, 64, "captured layers", layers),
    OPT("slots", CFG_INT, "16", 1, 256, "slots in the pool", slots),
    OPT("min-ready", CFG_INT, "4", 0, 1 << 20, "broker min_ready", min_ready),
    OPT("max-depth", CFG_INT, "16", 1, 1 << 20, "broker max_depth", max_depth),
    {"backend", CFG_STRING, "host", 1, 0, false,
     "pool backend: host or cuda (GPU machine; the "
     "synthetic data is still generated and verified on the host)",
     offsetof(bench_config, backend), 16},
    OPT("drafter-device", CFG_INT, "0", 0, 64, "cuda: GPU of the drafters (target on GPU 0)",
        drafter_device),
    {"build-dir", CFG_STRING, "", 1, 0, false, "build tree with the daemons (default: ours)",
     offsetof(bench_config, build_dir), PATH_MAX},
};
static const cfg_table bench_table = {"bench-pipeline", "end-to-end slot rate vs the slower side",
                                      "[options]", bench_options,
                                      sizeof bench_options / sizeof bench_options[0], NULL, NULL,
                                      NULL};

static const uint32_t BUCKETS[] = {128, 256, 512, 1024};
#define N_BUCKETS 4

static void pace(double period, double *next)
{
    if (period <= 0) return;
    double now = monotime_s();
    if (*next < now - 1) *next = now;
    if (*next > now) {
        double d = *next - now;
        struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
    *next += period;
}

/* One side alone: fill (producer) or verify (consumer) paced at rate for `secs`, both over the
 * buckets in turn (the daemons' mix: every bucket holds the same number of batches), the
 * consumer on slots filled beforehand, one per bucket. The work is the daemons' per-batch work
 * on the host; -1 when a fill or a verification fails. */
static double side_alone(const slot_layout *l, double rate, bool producer, double secs)
{
    void *slot[N_BUCKETS] = {NULL};
    synthetic_params sp[N_BUCKETS];
    double r = -1;
    for (uint32_t b = 0; b < N_BUCKETS; b++) {
        slot[b] = aligned_alloc(256, l->slot_bytes);
        if (!slot[b]) goto out;
        sp[b] = synthetic_bucket_params(BUCKETS, N_BUCKETS, b, 32000, l->token_budget);
        slot_work_unit wu = {0, b, 0};
        if (!producer && synthetic_fill(slot[b], l, &wu, &sp[b], 0) <= 0) goto out;
    }
    double t0 = monotime_s(), next = t0, period = rate > 0 ? 1 / rate : 0;
    uint64_t n = 0;
    while (monotime_s() - t0 < secs) {
        pace(period, &next);
        uint32_t b = (uint32_t)(n % N_BUCKETS);
        slot_work_unit wu = {0, b, 0};
        if (producer ? synthetic_fill(slot[b], l, &wu, &sp[b], 0) <= 0
                     : synthetic_verify(slot[b], l, &wu, &sp[b], NULL, NULL, 0) != 0)
            goto out;
        n++;
    }
    r = n / (monotime_s() - t0);
out:
    for (uint32_t b = 0; b < N_BUCKETS; b++)
        free(slot[b]);
    return r;
}

/* The child's pid, or -1 (said) when fork fails. */
static pid_t spawn(const char *path, char *const argv[], const char *logfile)
{
    pid_t pid = fork();
    if (pid < 0) perror("bench-pipeline: fork");
    if (pid == 0) {
        FILE *f = freopen(logfile, "w", stderr);
        (void)f;
        execv(path, argv);
        _exit(127);
    }
    return pid;
}

/* The number next to marker in the last line of logfile that has it: the digits right before it
 * (before), else right after it; -1 when no line has it or the log cannot be read. */
static long log_number(const char *logfile, const char *marker, bool before)
{
    FILE *f = fopen(logfile, "r");
    if (!f) return -1;
    long n = -1;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, marker);
        if (!p) continue;
        if (before)
            while (p > line && p[-1] >= '0' && p[-1] <= '9') p--;
        else
            p += strlen(marker);
        n = strtol(p, NULL, 10);
    }
    fclose(f);
    return n;
}

/* The slot copies a drafter's log says failed (its last "N copies failed" line, written as it
 * exits), or -1 when the log has none. In a run without faults every copy succeeds: a failure
 * is a defect of the copy path the end-to-end rate would only show as a lower figure. */
static long copies_failed(const char *logfile)
{
    return log_number(logfile, " copies failed", true);
}

/* The batches a target's log says it wrote (its last "done: N batches" line); -1 none. */
static long target_batches(const char *logfile)
{
    return log_number(logfile, "done: ", false);
}

/* Committed batches from the broker's ledger into *n, retrying a few times; false (said) if it
 * never answers. */
static bool committed(client *c, uint64_t *n)
{
    wire_status st;
    for (int i = 0; i < 10; i++)
        if (client_status(c, &st) == 0) {
            *n = st.batches_committed;
            return true;
        }
    fprintf(stderr, "bench-pipeline: the broker did not answer status\n");
    return false;
}

int main(int argc, char **argv)
{
    log_init("bench-pipeline", LOG_WARN);
    bench_config cfg;
    int rc = config_load(&bench_table, &cfg, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    char self[PATH_MAX], build[PATH_MAX];
    if (cfg.build_dir[0]) snprintf(build, sizeof build, "%s", cfg.build_dir);
    else {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return 1;
        self[n] = 0;
        snprintf(build, sizeof build, "%s/..", dirname(self));
    }
    char q[PATH_MAX + 64], t[PATH_MAX + 64], d[PATH_MAX + 64];
    snprintf(q, sizeof q, "%s/services/queue/dflash-queue", build);
    snprintf(t, sizeof t, "%s/services/target/dflash-target", build);
    snprintf(d, sizeof d, "%s/services/drafter/dflash-drafter", build);

    slot_layout l;
    bool cuda = strcmp(cfg.backend, "cuda") == 0;
    if (slot_layout_compute((uint32_t)cfg.token_budget, 16, (uint32_t)cfg.hidden,
                            (uint32_t)cfg.layers, cuda ? SLOT_DTYPE_BF16 : SLOT_DTYPE_F32,
                            &l) < 0) {
        fprintf(stderr, "bench-pipeline: bad layout\n");
        return 2;
    }
    double prod_alone = side_alone(&l, cfg.producer_rate, true, 2);
    double cons_one = side_alone(&l, cfg.consumer_rate, false, 2);
    if (prod_alone < 0 || cons_one < 0) {
        fprintf(stderr, "bench-pipeline: a synthetic fill or verification failed alone\n");
        return 1;
    }
    double cons_alone = cons_one * (double)cfg.drafters;

    char dir[] = "/tmp/bench-pipeline-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    chmod(dir, 0700);
    char ep[128], why[1024];
    snprintf(ep, sizeof ep, "ipc://%s/queue.sock", dir);
    if (client_check_endpoint_existing(ep, why, sizeof why) != 0) {
        fprintf(stderr, "bench-pipeline: %s\n", why);
        rmdir(dir);
        return 1;
    }
    char be[32], dev[32];
    snprintf(be, sizeof be, "--backend=%s", cuda ? "cuda" : "host");
    snprintf(dev, sizeof dev, "--device=%lld", (long long)cfg.drafter_device);
    char rt[64], lay[4][32], rate_p[32], rate_c[32], mr[32], md[32], slots[32], logf[128];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(lay[0], 32, "--token-budget=%lld", (long long)cfg.token_budget);
    snprintf(lay[1], 32, "--hidden=%lld", (long long)cfg.hidden);
    snprintf(lay[2], 32, "--layers=%lld", (long long)cfg.layers);
    snprintf(lay[3], 32, "--max-seqs=16");
    snprintf(rate_p, 32, "--rate=%g", cfg.producer_rate);
    snprintf(rate_c, 32, "--rate=%g", cfg.consumer_rate);
    snprintf(mr, 32, "--min-ready=%lld", (long long)cfg.min_ready);
    snprintf(md, 32, "--max-depth=%lld", (long long)cfg.max_depth);
    snprintf(slots, 32, "--slots=%lld", (long long)cfg.slots);
    pid_t pids[1 + 4 + 16]; /* the broker, --targets (<= 4), --drafters (<= 16) */
    int np = 0;
    char *qa[] = {q, rt, "--journal=none", mr, md, NULL};
    snprintf(logf, sizeof logf, "%s/queue.log", dir);
    pids[np++] = spawn(q, qa, logf);
    client *c = client_new(ep, WIRE_ROLE_CTL, "bench");
    client_set_timeout(c, 500);
    double until = monotime_s() + 10;
    wire_status st;
    while (client_status(c, &st) != 0 && monotime_s() < until) usleep(50000);
    char tnames[4][32];
    for (int i = 0; i < cfg.targets; i++) {
        snprintf(tnames[i], 32, "--name=bench-t%d", i);
        char *ta[] = {t, rt, be, lay[0], lay[1], lay[2], lay[3], rate_p, slots, tnames[i],
                      "--buckets=128,256,512,1024", "--batches-per-bucket=200000",
                      "--progress-ms=0", NULL};
        snprintf(logf, sizeof logf, "%s/target%d.log", dir, i);
        pids[np++] = spawn(t, ta, logf);
    }
    char names[16][32];
    for (int i = 0; i < cfg.drafters; i++) {
        snprintf(names[i], 32, "--name=bench-d%d", i);
        char *da[] = {d, rt, be, dev, lay[0], lay[1], lay[2], lay[3], rate_c, names[i], "--verify",
                      "--buckets=128,256,512,1024", "--progress-ms=0", NULL};
        snprintf(logf, sizeof logf, "%s/drafter%d.log", dir, i);
        pids[np++] = spawn(d, da, logf);
    }
    /* every daemon registered before the warmup counts (a loaded machine may take seconds to
     * start them; one stopped before its signal handlers exist would end by SIGTERM) */
    until = monotime_s() + 60;
    bool all_in = false;
    while (!all_in && monotime_s() < until) {
        all_in = client_status(c, &st) == 0 && st.peers >= (uint32_t)(cfg.targets + cfg.drafters);
        if (!all_in) usleep(50000);
    }
    int bad = 0;
    if (!all_in) {
        fprintf(stderr, "bench-pipeline: the %lld daemons did not all register in 60 s (logs in "
                "%s)\n", (long long)(cfg.targets + cfg.drafters), dir);
        bad++;
    }
    usleep((useconds_t)(cfg.warmup * 1e6));
    uint64_t c0 = 0, c1 = 0;
    bool counted = committed(c, &c0);
    double t0 = monotime_s();
    usleep((useconds_t)(cfg.seconds * 1e6));
    counted = counted && committed(c, &c1);
    if (counted && c1 <= c0) {
        fprintf(stderr, "bench-pipeline: no batch was committed in the %g s window\n",
                cfg.seconds);
        counted = false;
    }
    double e2e = counted ? (double)(c1 - c0) / (monotime_s() - t0) : 0;
    client_destroy(&c);
    bad += !counted; /* every daemon exits 0 on SIGTERM (a drafter whose batch failed: 3) */
    for (int i = np - 1; i >= 0; i--) {
        if (pids[i] <= 0) { /* never started (said by spawn): never kill(-1) or kill(0) */
            bad++;
            continue;
        }
        kill(pids[i], SIGTERM);
        int status = 0;
        waitpid(pids[i], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "bench-pipeline: daemon %d of %d (pid %d) ended with status 0x%x "
                    "(logs in %s)\n", i, np, (int)pids[i], status, dir);
            bad++;
        }
    }
    /* every target was served: a pool never claimed from fills its slots and no more */
    for (int i = 0; i < cfg.targets; i++) {
        snprintf(logf, sizeof logf, "%s/target%d.log", dir, i);
        long wrote = target_batches(logf);
        if (wrote <= cfg.slots) {
            fprintf(stderr, "bench-pipeline: target %d wrote %ld batches, no more than its %lld "
                    "slots: its pool was never served (log %s)\n", i, wrote,
                    (long long)cfg.slots, logf);
            bad++;
        }
    }
    for (int i = 0; i < cfg.drafters; i++) {
        snprintf(logf, sizeof logf, "%s/drafter%d.log", dir, i);
        long failed = copies_failed(logf);
        if (failed != 0) {
            fprintf(stderr, "bench-pipeline: drafter %d %s (log %s)\n", i,
                    failed < 0 ? "wrote no summary of its copies" : "had slot copies fail", logf);
            bad++;
        }
    }
    double slower = prod_alone < cons_alone ? prod_alone : cons_alone;
    printf("| side | batches/s |\n|---|---|\n");
    printf("| producer alone (synthetic fill, paced %g/s) | %.1f |\n", cfg.producer_rate,
           prod_alone);
    printf("| consumers alone (%lld x verify, paced %g/s) | %.1f |\n", (long long)cfg.drafters,
           cfg.consumer_rate, cons_alone);
    printf("| end to end (%s, committed, %.0f s window, slot %.2f MiB) | %.1f |\n", cfg.backend,
           cfg.seconds, l.slot_bytes / 1048576.0, e2e);
    printf("end-to-end / slower side alone: %.1f%% (goal >= 97%%)\n", 100 * e2e / slower);
    if (bad) return 1; /* the logs stay for a look */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (getenv("BENCH_KEEP")) printf("logs in %s\n", dir);
    else if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return 0;
}
