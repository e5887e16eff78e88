/* itest_power_loss: a power loss of the broker's host never leaves a drafter checkpoint that holds
 * batches the broker's ledger hands out again (audit-crash finding 1), and a refused commit
 * report is said and backed off (finding 4).
 *
 * The broker runs in this process (its libuv loop on a thread, sockets on ipc:// in a temp dir,
 * the journal there) with its fdatasync replaced by a hook that records the journal's size after
 * each sync: what a power loss keeps of the journal is the file cut back to that size (appends
 * written but not synced are what ext4 or XFS may lose). The real dflash-target (--model
 * synthetic) fills slots; the drafter's loop (worker_loop_run) runs here too, with a consumer
 * that "publishes a checkpoint" every few steps in settled() (and a final one in finish(), the
 * run ending at a multiple of them): it calls the loop's
 * durability barrier (set_barrier) first, then notes the step and the journal's synced size at
 * that moment: a power loss right after the checkpoint became durable, before its commit report.
 *
 * Scenario 1 (power loss): after the run, for each checkpoint, a copy of the journal cut to its
 * noted size is opened as a ledger, rewound to the checkpoint's step (the resumed drafter's
 * ResumeFrom), and every batch the consumer trained at or before that step must be trained or
 * committed there, not to do (which the broker would hand out again: trained twice). Without
 * the barrier the acks since the previous commit were past the synced size: the first
 * checkpoint's 4 batches came back to do. And each checkpoint is reported once (the loop's
 * debug log): a loop that forgot what the broker took sent it again before every claim.
 *
 * Scenario 2 (refused reports): the sync hook fails from the first checkpoint on (a full disk;
 * the broker's rewrite retries are an hour apart), so every commit report is answered Error IO.
 * The drafter trains on with a checkpoint every step for about a second: it says the refusal
 * once (a WARN naming the step and the broker's reason), and sends one report, and one more
 * per WORKER_COMMIT_RETRY_MS the run lasts, where it sent one per claim, silently.
 * Usage: itest_power_loss TARGET. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "broker.h"
#include "broker_thread.h"
#include "config.h"
#include "ledger.h"
#include "log.h"
#include "monotime.h"
#include "slot.h"
#include "worker_loop.h"
#include "worker_session.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <uv.h>

#define MAX_TRAINED 256
#define MAX_CKPTS 64

/* --- the broker's sync hook: the synced size, or a full disk ------------------------------ */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t synced_size; /* the journal's size after its last successful sync */
static bool disk_full;       /* syncs fail */

static int recording_sync(void *ctx, int fd)
{
    (void)ctx;
    pthread_mutex_lock(&mu);
    bool full = disk_full;
    pthread_mutex_unlock(&mu);
    if (full) return DFLASH_EIO;
    if (fdatasync(fd) != 0) return DFLASH_EIO;
    struct stat st;
    if (fstat(fd, &st) != 0) return DFLASH_EIO;
    pthread_mutex_lock(&mu);
    synced_size = (uint64_t)st.st_size;
    pthread_mutex_unlock(&mu);
    return 0;
}

static uint64_t last_synced(void)
{
    pthread_mutex_lock(&mu);
    uint64_t n = synced_size;
    pthread_mutex_unlock(&mu);
    return n;
}

/* --- the broker on a thread ---------------------------------------------------------------- */

static broker_thread bt;

static bool broker_start(const char *dir, const char *level)
{
    queue_config cfg;
    broker_thread_config(&cfg, dir, level);
    cfg.heartbeat_ms = 100;
    cfg.min_ready = 1;
    cfg.max_depth = 2;
    cfg.lease_timeout_ms = 2000;
    cfg.journal_retry_ms = 3600 * 1000; /* a failed journal stays failed (scenario 2) */
    int err = 0;
    bool up = broker_thread_start(&bt, &cfg, recording_sync, NULL, &err);
    CHECK(up);
    return up;
}

static void broker_end(void)
{
    broker_thread_stop(&bt);
}

/* --- the consumer: trains (counts), checkpoints every ckpt_every steps ------------------------ */

typedef struct pl {
    int ckpt_every, steps;
    bool fail_after_first; /* scenario 2: the disk fills at the first checkpoint */
    int consumed;
    worker_unacked trained[MAX_TRAINED];
    struct {
        uint64_t step, synced;
    } ckpt[MAX_CKPTS];
    int n_ckpt;
    int (*barrier)(void *arg, uint64_t step);
    void *barrier_arg;
} pl;

static int pl_consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    pl *p = ctx;
    *step = (uint64_t)++p->consumed;
    if (p->consumed <= MAX_TRAINED) p->trained[p->consumed - 1] = (worker_unacked){b->wu, *step};
    return 0;
}

/* A checkpoint of the current step, when due: the barrier, then "durable" (noted). */
static int pl_settled(void *ctx)
{
    pl *p = ctx;
    uint64_t last = p->n_ckpt ? p->ckpt[p->n_ckpt - 1].step : 0;
    if (p->consumed % p->ckpt_every || (uint64_t)p->consumed == last || p->n_ckpt == MAX_CKPTS)
        return 0;
    if (p->barrier) (void)p->barrier(p->barrier_arg, (uint64_t)p->consumed);
    p->ckpt[p->n_ckpt].step = (uint64_t)p->consumed;
    p->ckpt[p->n_ckpt].synced = last_synced();
    p->n_ckpt++;
    if (p->fail_after_first) {
        pthread_mutex_lock(&mu);
        disk_full = true;
        pthread_mutex_unlock(&mu);
    }
    return 0;
}

/* The loop's end: the final checkpoint (the run stops at a multiple of ckpt_every). */
static int pl_finish(void *ctx)
{
    return pl_settled(ctx);
}

static uint64_t pl_committed(void *ctx)
{
    pl *p = ctx;
    return p->n_ckpt ? p->ckpt[p->n_ckpt - 1].step : 0;
}

static bool pl_done(void *ctx)
{
    pl *p = ctx;
    return p->consumed >= p->steps;
}

static void pl_set_barrier(void *ctx, int (*barrier)(void *arg, uint64_t step), void *arg)
{
    pl *p = ctx;
    p->barrier = barrier;
    p->barrier_arg = arg;
}

/* Runs broker, target and the drafter loop until p->steps batches are trained. */
static void run(const char *target_bin, const char *dir, pl *p, const char *level)
{
    char ep[128];
    h_queue_endpoint(dir, ep, sizeof ep);
    if (!broker_start(dir, level)) return;
    pid_t target = h_start_small_target(target_bin, dir, "power", 64, 500);
    CHECK(target > 0);
    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 1000, .exit_when_drained = true};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    worker_consumer cons = {.name = "power", .ctx = p, .consume = pl_consume,
                            .committed = pl_committed, .done = pl_done, .settled = pl_settled, .finish = pl_finish,
                            .set_barrier = pl_set_barrier};
    volatile sig_atomic_t stop = 0;
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, NULL), 0);
    CHECK(p->barrier == NULL); /* the loop took its barrier back */
    CHECK_EQ_INT(h_stop(target), 0);
    broker_end();
}

/* Counts the lines of path holding text. */
static int count_lines(const char *path, const char *text)
{
    char *s = test_slurp(path, NULL);
    int n = 0;
    for (const char *q = s; q && (q = strstr(q, text)); q++) n++;
    free(s);
    return n;
}

/* run(), this process's log (the loop's, at debug level) going to the file logp meanwhile. */
static void run_logged(const char *target_bin, const char *dir, pl *p, const char *level,
                       const char *logp)
{
    int saved = dup(2), fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    log_init("itest", LOG_DEBUG);
    run(target_bin, dir, p, level);
    log_init("itest", LOG_WARN);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
}

/* Scenario 1: every checkpoint survives a power loss right after it with all its acks. */
static void power_loss(const char *target_bin)
{
    char dir[64], journal[128], cut[128], logp[128];
    h_tempdir(dir, sizeof dir);
    snprintf(journal, sizeof journal, "%s/queue.journal", dir);
    snprintf(cut, sizeof cut, "%s/cut.journal", dir);
    snprintf(logp, sizeof logp, "%s/drafter.log", dir);
    pl p = {.ckpt_every = 4, .steps = 12};
    run_logged(target_bin, dir, &p, "warn", logp);
    CHECK_EQ_INT(p.consumed, 12);
    CHECK_EQ_INT(p.n_ckpt, 3);
    /* each checkpoint is reported once, the broker taking every report (not again before
     * every claim: the loop notes what the broker took) */
    int reports = count_lines(logp, "reporting checkpoint step");
    printf("%d checkpoints, %d commit reports before the final one\n", p.n_ckpt, reports);
    CHECK(reports <= p.n_ckpt);
    size_t len = 0;
    char *whole = test_slurp(journal, &len);
    CHECK(whole != NULL);
    for (int k = 0; whole && k < p.n_ckpt; k++) {
        /* the journal a power loss right after checkpoint k leaves */
        uint64_t keep = p.ckpt[k].synced < len ? p.ckpt[k].synced : len;
        FILE *f = fopen(cut, "wb");
        CHECK(f && fwrite(whole, 1, keep, f) == keep);
        if (f) fclose(f);
        ledger_params lp = {.journal_path = cut, .fsync = false};
        int err = 0;
        ledger *l = ledger_new(&lp, &err);
        CHECK(l != NULL);
        if (!l) break;
        CHECK(ledger_rewind(l, p.ckpt[k].step) >= 0); /* the resumed drafter's ResumeFrom */
        int again = 0, held = 0;
        for (int i = 0; i < p.consumed; i++) {
            if (p.trained[i].step > p.ckpt[k].step) continue;
            batch_id b = {p.trained[i].wu.epoch, p.trained[i].wu.bucket,
                          (uint32_t)p.trained[i].wu.batch};
            batch_state s = BATCH_TODO;
            CHECK_EQ_INT(ledger_get(l, &b, &s, NULL), 0);
            held++;
            if (s != BATCH_TRAINED && s != BATCH_COMMITTED) again++;
        }
        printf("power loss after the checkpoint of step %llu (journal cut to %llu of %zu "
               "bytes): %d of its %d batches to do again\n",
               (unsigned long long)p.ckpt[k].step, (unsigned long long)keep, len, again, held);
        CHECK_EQ_INT(again, 0);
        ledger_destroy(&l);
        unlink(cut);
    }
    free(whole);
    h_rmdir(dir);
}


/* Scenario 2: commit reports refused (the journal failing) are said once and backed off. */
static void refused_reports(const char *target_bin)
{
    char dir[64], logp[128];
    h_tempdir(dir, sizeof dir);
    snprintf(logp, sizeof logp, "%s/drafter.log", dir);
    pl p = {.ckpt_every = 1, .steps = 30, .fail_after_first = true};
    double t0 = monotime_s();
    run_logged(target_bin, dir, &p, "debug", logp);
    double secs = monotime_s() - t0;
    int reports = count_lines(logp, "reporting checkpoint step");
    int warned = count_lines(logp, "did not take the commit report of checkpoint step");
    int named = count_lines(logp, "did not take the commit report of checkpoint step 1: ");
    int why = count_lines(logp, "(commit failed)") + count_lines(logp, "not durable)");
    printf("journal failing: %d checkpoints in %.1f s, %d commit reports, %d said (%d naming "
           "step 1, %d the broker's reason)\n", p.n_ckpt, secs, reports, warned, named, why);
    CHECK_EQ_INT(p.n_ckpt, 30);
    CHECK_EQ_INT(warned, 1);
    CHECK_EQ_INT(named, 1);
    CHECK(why >= 1);
    /* the first (refused), then one more per WORKER_COMMIT_RETRY_MS at most */
    CHECK(reports >= 1 && reports <= 1 + (int)(secs * 1000 / WORKER_COMMIT_RETRY_MS));
    h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s TARGET\n", argv[0]);
        return 1;
    }
    log_init("itest", LOG_WARN);
    power_loss(argv[1]);
    refused_reports(argv[1]);
    CHECK_DONE();
}
