/* itest_group_unacked: rank 0 of a group of 2 ranks x 2 micro-steps holds all 4 units of a step
 * whose StepDone no broker took: its final checkpoint's unacked list records all 4 (not only
 * the last micro-step's, not only rank 0's), and the hello to a restarted broker carries all 4,
 * which are then acked at the step.
 *
 * The real dflash-queue (journal) and a synthetic dflash-target (2 slots, 2 buckets of 4
 * batches) run in a temp dir; two forked processes run the drafter's loop (worker_loop_run,
 * --group g, shm collective) with a consumer without a model: accumulate() 2, consume() notes
 * its batch in shared memory, close_step() counts the step. Whichever process is rank 0 SIGKILLs
 * the broker in its close_step of step 1, once both processes have consumed both micro-steps
 * (the all-reduce a model would wait in): its StepDone then finds no broker.
 *   1. checkpoint: rank 0 is also told to stop there; its loop ends with the step pending, and
 *      the consumer's unacked() (what the trainer writes as the checkpoint's unacked_batches)
 *      must list the 4 units both processes consumed, each at step 1.
 *   2. hello: the test restarts the broker on the same journal; rank 0's StepDone meets it,
 *      STALE, and it says hello again holding the step's units, then acks them: the ledger
 *      trains exactly those 4 batches (an omitted unit stays orphaned in flight instead).
 * Usage: itest_group_unacked QUEUE TARGET. Exit 0 pass, 1 fail. */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

#include <signal.h>
#include <sys/mman.h>

#define MAX_SEEN 16

/* What the two processes share (MAP_SHARED): set by the children, read by the test. */
typedef struct shared {
    pid_t queue;
    volatile int killed, restarted;
    volatile int n_seen[2];
    worker_unacked seen[2][MAX_SEEN]; /* what each process consumed, at the step it trains */
    volatile int n_unacked;           /* rank 0's unacked() list (-1: never called) */
    worker_unacked unacked[WORKER_MAX_UNACKED];
} shared;

typedef struct member {
    shared *sh;
    int me;           /* process 0 or 1 */
    int rank;         /* in the group's epoch */
    uint64_t step;    /* the model's */
    bool stop_at_kill; /* scenario 1 */
    volatile sig_atomic_t *stop;
} member;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    member *m = ctx;
    int n = m->sh->n_seen[m->me];
    if (n < MAX_SEEN) m->sh->seen[m->me][n] = (worker_unacked){b->wu, m->step + 1};
    m->sh->n_seen[m->me] = n + 1;
    *step = m->step + 1;
    return 0;
}

static uint32_t accumulate(void *ctx)
{
    (void)ctx;
    return 2;
}

static int close_step(void *ctx, uint64_t *step)
{
    member *m = ctx;
    *step = ++m->step;
    if (m->rank == 0 && m->step == 1 && !m->sh->killed) {
        uint64_t end = h_now_ms() + 20000; /* both processes have both micro-steps */
        while (h_now_ms() < end && (m->sh->n_seen[0] < 2 || m->sh->n_seen[1] < 2))
            h_sleep_ms(5);
        pid_t q = m->sh->queue; /* 0 once the parent reaped it: the pid may be another's */
        if (q > 0) kill(q, SIGKILL);
        m->sh->killed = 1;
        if (m->stop_at_kill) *m->stop = 1;
    }
    return 0;
}

/* One step each, and the broker back (2) or gone (1). */
static bool done(void *ctx)
{
    member *m = ctx;
    return m->step >= 1 && (m->stop_at_kill ? m->sh->killed : m->sh->restarted);
}

static void set_group(void *ctx, struct dp_comm *comm, int rank, int world)
{
    (void)world;
    if (comm) ((member *)ctx)->rank = rank;
}

static uint64_t model_step(void *ctx)
{
    return ((member *)ctx)->step;
}

static void unacked(void *ctx, const worker_unacked *b, uint32_t n)
{
    member *m = ctx;
    if (m->rank != 0) return;
    memcpy(m->sh->unacked, b, n * sizeof *b);
    m->sh->n_unacked = (int)n;
}

static pid_t start_member(shared *sh, int me, const char *ep, bool stop_at_kill)
{
    pid_t pid = fork();
    if (pid != 0) return pid;
    volatile sig_atomic_t stop = 0;
    member m = {.sh = sh, .me = me, .rank = -1, .stop_at_kill = stop_at_kill, .stop = &stop};
    worker_loop_config lc = {.endpoint = ep, .name = me ? "d1" : "d0", .backend = POOL_HOST,
                             .timeout_ms = 50, .exit_when_drained = true, .group = "g",
                             .comm_kind = DP_COMM_SHM, .comm_timeout_s = 10};
    if (slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout) != 0) _exit(3);
    worker_consumer cons = {.name = "unacked", .ctx = &m, .consume = consume, .done = done,
                            .set_group = set_group, .sync_state = h_sync_state_none,
                            .model_step = model_step, .unacked = unacked,
                            .accumulate = accumulate, .close_step = close_step};
    int rc = worker_loop_run(&lc, &cons, &stop, NULL);
    _exit(rc == 0 ? 0 : 1);
}

static bool same_unit(const slot_work_unit *a, const slot_work_unit *b)
{
    return a->epoch == b->epoch && a->bucket == b->bucket && a->batch == b->batch;
}

/* The units both processes consumed at step 1 (4 when both trained both micro-steps). */
static int step1_units(const shared *sh, worker_unacked *out)
{
    int n = 0;
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < sh->n_seen[p] && i < MAX_SEEN; i++)
            if (sh->seen[p][i].step == 1) out[n++] = sh->seen[p][i];
    return n;
}

static void scenario(const char *queue_bin, const char *target_bin, bool checkpoint)
{
    const char *what = checkpoint ? "checkpoint" : "hello";
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return;
    memset(sh, 0, sizeof *sh);
    sh->n_unacked = -1;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--lease-timeout-ms=2000", "--log-level=warn", NULL};
    sh->queue = h_start_small_queue(queue_bin, dir, more);
    CHECK(sh->queue > 0);
    pid_t target = h_start_small_target(target_bin, dir, "unacked", 4, 200);
    CHECK(target > 0);
    pid_t d[2] = {start_member(sh, 0, ep, checkpoint), start_member(sh, 1, ep, checkpoint)};

    uint64_t end = h_now_ms() + 60000;
    while (!sh->killed && h_now_ms() < end) h_sleep_ms(10);
    CHECK(sh->killed);
    pid_t old = sh->queue;
    sh->queue = 0; /* narrows, not closes, rank 0's window to kill it after the reap (the wait
                    * above timed out); in hello mode a late rank 0 kills the new broker */
    h_kill(old, SIGKILL);
    if (!checkpoint) {
        sh->queue = h_start_small_queue(queue_bin, dir, more);
        CHECK(sh->queue > 0);
        sh->restarted = 1;
    }
    for (int p = 0; p < 2; p++) {
        int rc = h_wait_exit(d[p], 60000);
        if (rc < 0) h_kill(d[p], SIGKILL);
        CHECK_EQ_INT(rc, 0);
    }
    worker_unacked want[2 * MAX_SEEN];
    int n = step1_units(sh, want);
    CHECK_EQ_INT(n, 4);
    if (checkpoint) {
        /* rank 0's final checkpoint: all 4 units of step 1, each at step 1 */
        printf("%s: rank 0's unacked list holds %d units; step 1 trained %d\n", what,
               sh->n_unacked, n);
        CHECK_EQ_INT(sh->n_unacked, n);
        for (int i = 0; i < n; i++) {
            bool found = false;
            for (int j = 0; j < sh->n_unacked; j++)
                found |= same_unit(&want[i].wu, &sh->unacked[j].wu) && sh->unacked[j].step == 1;
            CHECK(found);
        }
    } else {
        /* the restarted broker took all 4 through rank 0's hello and its acks at step 1 */
        wire_status s;
        int rc = h_print_ledger(ep, what, &s);
        CHECK_EQ_INT(rc, 0);
        if (rc == 0) {
            CHECK_EQ_INT(s.batches_trained, (uint64_t)n);
            CHECK_EQ_INT(s.acks, (uint64_t)n);
        }
        CHECK_EQ_INT(sh->n_unacked, 0); /* nothing left for the checkpoint */
    }
    CHECK_EQ_INT(h_stop(target), 0);
    if (!checkpoint) CHECK_EQ_INT(h_stop(sh->queue), 0);
    munmap(sh, sizeof *sh);
    if (!check_failed) h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: itest_group_unacked QUEUE TARGET\n");
        return 2;
    }
    scenario(argv[1], argv[2], true);
    scenario(argv[1], argv[2], false);
    CHECK_DONE();
}
