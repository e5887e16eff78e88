/* itest_group_restart: a broker restarted on its journal while a data-parallel group trains: the
 * ranks register again (the group loop's REGISTER path, group_worker.c), join again, form the
 * group again and train the run to its end, every batch once. And a group of two ranks restarted
 * from checkpoints that record trained batches no broker acked: only rank 0 acks its own.
 *
 * The real dflash-queue (journal, heartbeat 100 ms, liveness 30) and a synthetic dflash-target
 * (2 slots, 2 buckets of PER_BUCKET batches, one epoch) run in a temp dir. Forked processes run
 * the drafter's loop (worker_loop_run, --group g, shm collective, exit when drained) with a
 * consumer without a model: a step counter, taken by a joiner from rank 0 (sync_state), one
 * step per batch in lockstep with the other ranks (a barrier stands for the step's all-reduce),
 * each batch it trains counted in memory shared with this process.
 *   training  a group of two: once rank 0's model is at step 2, the broker is SIGKILLed and
 *             started again on its journal (wherever the ranks are then: claiming, copying,
 *             in the barrier, in a StepDone). Defect it guards: a group rank that took the new
 *             broker's STALE for a transient answer (no hello) claimed for ever, or a rank 0
 *             whose pending step was not carried by its hello left that step to be trained
 *             again.
 *   lost-reply a group of one: its first step's StepDone reaches the broker, frozen (SIGSTOP)
 *             while the step trains, and only its reply is lost: the loop gives up on it
 *             (kept pending) and, before its next step, waits in done() until this process
 *             let the broker go on (it records the step, its acks), made that durable
 *             (JournalSync), SIGKILLed it and started it again on the journal. The StepDone sent
 *             again meets the new broker: STALE; the hello carries the step's unit, whose late
 *             ack the new broker answers EXISTS (trained already, at that step): the step is
 *             resolved and the loop joins again. Defect it guards (a mutant, G06 of the
 *             drafter-loop audit): a late ack answered EXISTS taken for a failure made the rank
 *             say hello again, again and again, for ever, training nothing more.
 *   resumed   a group of two (--group-size 2) whose ranks resumed from checkpoints at step 3
 *             that record trained, unacked batches (resumed_unacked()): d0's (0, 0, 0) and
 *             (0, 1, 0), d1's (0, 0, 1). d0 joins first and is rank 0: the group goes on from
 *             its model, which holds its two batches: it acks them at step 3 (resolve_resumed);
 *             d1 is rank 1: the group's model is not its own and may lack its batch, which it
 *             lets go, and the group trains it. No broker restart. (G10 of the drafter-loop
 *             audit: no test resumed a group of two; a rank 1 that acked its batch too left it
 *             recorded trained and never trained in the group's model; a rank 0 that let its
 *             batches go had them trained twice.) At the plan's end the rank whose claim hears
 *             it second finds its partner gone and joins again: the broker answers that join
 *             as the claim (SHUTDOWN), where it used to wait --group-wait-s (60 s) for a second
 *             rank, past this test's 60 s.
 * Checks: every rank exits 0 within 60 s having logged no ERROR, every batch of the epoch was trained exactly once (the
 * processes' counts; resumed: d0's two batches never, the others once), the broker's ledger has
 * them all trained, none to do or in flight, and each rank registered at least twice (resumed:
 * once).
 * Usage: itest_group_restart QUEUE TARGET. Exit 0 pass, 1 fail. */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "test_files.h"
#include "worker_loop.h"

#include <signal.h>
#include <sys/mman.h>

#define PER_BUCKET 6
#define BATCHES (2 * PER_BUCKET)
#define RESUMED_STEP 3

typedef enum { LOST_REPLY, TRAINING, RESUMED } mode;
static const char *const mode_name[] = {"lost-reply", "training", "resumed"};

/* One rank's process: its model and what it reports (shared memory). */
typedef struct rank_state {
    int rc;
    worker_stats st;
    uint64_t step;  /* the model's optimizer steps */
    dp_comm *comm;  /* the process's own pointer: the epoch's communicator, or NULL */
    int rank;
    worker_unacked resumed[2]; /* resumed: its checkpoint's unacked batches */
    uint32_t n_resumed;
} rank_state;

/* What the processes share with this one (MAP_SHARED). */
typedef struct shared {
    pid_t queue;
    bool lost_reply;                /* freeze the broker in the first step */
    volatile int frozen, gave_up, restarted;
    int trained[2][PER_BUCKET];     /* times each batch of epoch 0 was trained, all processes */
    int trained_other;              /* batches outside that (none expected) */
    rank_state r[2];
} shared;

typedef struct member {
    shared *sh;
    rank_state *r;
} member;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    member *m = ctx;
    shared *sh = m->sh;
    pid_t q = sh->queue; /* 0 once the parent reaped it: the pid may be another's by then */
    if (sh->lost_reply && !sh->frozen && q > 0) { /* the StepDone after this step finds it frozen */
        kill(q, SIGSTOP);
        sh->frozen = 1;
    }
    int rc = m->r->comm ? dp_comm_barrier(m->r->comm) : 0; /* the step's all-reduce */
    if (rc < 0) return rc;
    if (b->wu.epoch == 0 && b->wu.bucket < 2 && b->wu.batch < PER_BUCKET)
        __atomic_fetch_add(&sh->trained[b->wu.bucket][b->wu.batch], 1, __ATOMIC_SEQ_CST);
    else
        __atomic_fetch_add(&sh->trained_other, 1, __ATOMIC_SEQ_CST);
    *step = ++m->r->step;
    return 0;
}

/* Never done: the plan's end ends the loop (exit when drained), also for a rank that joins
 * again after its partner heard the end first and left (resumed: --group-size 2, so before the
 * broker answered such a join SHUTDOWN it waited --group-wait-s, 60 s, for the other). But
 * lost-reply: the first call after the frozen step (the loop gave up on its StepDone, the step
 * kept pending) waits until this process has restarted the broker. */
static bool done(void *ctx)
{
    member *m = ctx;
    shared *sh = m->sh;
    if (sh->lost_reply && sh->frozen && !sh->gave_up) {
        sh->gave_up = 1;
        for (uint64_t end = h_now_ms() + 60000; !sh->restarted && h_now_ms() < end;)
            h_sleep_ms(5);
    }
    return false;
}

static void set_group(void *ctx, struct dp_comm *comm, int rank, int world)
{
    member *m = ctx;
    (void)world;
    m->r->comm = comm;
    if (comm) m->r->rank = rank;
}

static int sync_state(void *ctx, int root)
{
    member *m = ctx;
    return dp_comm_broadcast_host(m->r->comm, &m->r->step, sizeof m->r->step, root);
}

static uint64_t model_step(void *ctx) { return ((member *)ctx)->r->step; }

static uint32_t resumed_unacked(void *ctx, worker_unacked *out, uint32_t max)
{
    const rank_state *r = ((member *)ctx)->r;
    uint32_t n = r->n_resumed < max ? r->n_resumed : max;
    memcpy(out, r->resumed, n * sizeof *out);
    return n;
}

/* Rank process `me`, logging to DIR/d<me>.log. */
static pid_t start_rank(shared *sh, int me, const char *dir, const char *ep, uint32_t group_size)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid;
    char log[128];
    snprintf(log, sizeof log, "%s/d%d.log", dir, me);
    if (!freopen(log, "w", stderr)) _exit(3);
    setvbuf(stderr, NULL, _IOLBF, 0);
    member m = {.sh = sh, .r = &sh->r[me]};
    m.r->rank = -1;
    volatile sig_atomic_t stop = 0;
    worker_loop_config lc = {.endpoint = ep, .name = me ? "d1" : "d0", .backend = POOL_HOST,
                             .timeout_ms = 100, .exit_when_drained = true, .group = "g",
                             .comm_kind = DP_COMM_SHM, .comm_timeout_s = 10,
                             .group_size = group_size, .group_wait_s = 60};
    if (slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout) != 0) _exit(3);
    worker_consumer cons = {.name = "restart", .ctx = &m, .consume = consume, .done = done,
                            .set_group = set_group, .sync_state = sync_state,
                            .model_step = model_step, .resumed_unacked = resumed_unacked};
    m.r->rc = worker_loop_run(&lc, &cons, &stop, &m.r->st);
    _exit(m.r->rc == 0 ? 0 : 1);
}

/* Waits up to ms for the broker at ep to hold `world` ranks in one group. */
static bool wait_group(const char *ep, uint32_t world, int ms)
{
    wire_status s;
    for (uint64_t end = h_now_ms() + (uint64_t)ms; h_now_ms() < end; h_sleep_ms(20))
        if (h_broker_status(ep, &s) == 0 && s.n_groups == 1 && s.groups[0].world == world)
            return true;
    return false;
}

/* Waits up to ms for the broker at ep to have the target's plan (its pool registered). */
static bool wait_plan(const char *ep, int ms)
{
    wire_status s;
    for (uint64_t end = h_now_ms() + (uint64_t)ms; h_now_ms() < end; h_sleep_ms(20))
        if (h_broker_status(ep, &s) == 0 && s.batches_total == BATCHES) return true;
    return false;
}

/* lost-reply: the frozen broker let go on until it recorded the step's StepDone, that made
 * durable, then the broker SIGKILLed and started again on its journal, holding that step. */
static pid_t restart_after_lost_reply(shared *sh, const char *queue_bin, const char *dir,
                                      const char *ep, const char *const *more, bool *landed_out)
{
    for (uint64_t end = h_now_ms() + 60000; !sh->gave_up && h_now_ms() < end;) h_sleep_ms(10);
    CHECK(sh->gave_up); /* the loop gave up on the StepDone, its step pending */
    h_signal(sh->queue, SIGCONT);
    wire_status s = {0};
    bool landed = false;
    for (uint64_t end = h_now_ms() + 20000; !landed && h_now_ms() < end; h_sleep_ms(20))
        landed = h_broker_status(ep, &s) == 0 && s.batches_trained == 1;
    printf("lost-reply: the StepDone sent to the frozen broker %s\n",
           landed ? "landed (its reply lost)" : "did not land (run again)");
    *landed_out = landed;
    client *c = client_new(ep, WIRE_ROLE_CTL, "sync");
    CHECK(c != NULL);
    if (c) {
        client_set_timeout(c, 5000);
        CHECK_EQ_INT(client_journal_sync(c), 0); /* the step's acks durable: the restart has them */
        client_destroy(&c);
    }
    pid_t old = sh->queue;
    sh->queue = 0; /* the ranks freeze it no more: reaped below */
    h_kill(old, SIGKILL);
    pid_t q = h_start_small_queue(queue_bin, dir, more);
    CHECK(q > 0);
    CHECK_EQ_INT(h_broker_status(ep, &s), 0);
    if (landed) CHECK_EQ_INT(s.batches_trained, 1); /* so the late ack of the unit is EXISTS */
    return q;
}

/* The checkpoints' unacked batches (resumed): d0's two, d1's one, all trained at RESUMED_STEP. */
static void resume(shared *sh)
{
    for (int i = 0; i < 2; i++) sh->r[i].step = RESUMED_STEP;
    sh->r[0].resumed[0] = (worker_unacked){{0, 0, 0}, RESUMED_STEP};
    sh->r[0].resumed[1] = (worker_unacked){{0, 1, 0}, RESUMED_STEP};
    sh->r[0].n_resumed = 2;
    sh->r[1].resumed[0] = (worker_unacked){{0, 0, 1}, RESUMED_STEP};
    sh->r[1].n_resumed = 1;
}

/* How many times batch (0, b, i) must be trained: d0's resumed ones are acked, not trained. */
static int times_wanted(mode md, int b, int i)
{
    (void)b; /* (0, 0, 0) and (0, 1, 0) */
    return md == RESUMED && i == 0 ? 0 : 1;
}

/* One run of mode md, every check made. False only for a lost-reply run whose StepDone did not
 * reach the frozen broker (the scenario's premise, not the loop's doing: run it again). */
static bool scenario(const char *queue_bin, const char *target_bin, mode md)
{
    const char *what = mode_name[md];
    bool lost_reply = md == LOST_REPLY;
    int n = lost_reply ? 1 : 2;
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return true;
    memset(sh, 0, sizeof *sh);
    sh->lost_reply = lost_reply;
    if (md == RESUMED) resume(sh);
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--liveness=30", "--lease-timeout-ms=2000", "--log-level=warn", NULL};
    sh->queue = h_start_small_queue(queue_bin, dir, more);
    CHECK(sh->queue > 0);
    if (sh->queue <= 0) return true;
    pid_t d[2] = {0, 0}, target = 0;
    if (md == RESUMED) {
        /* the plan first (the acks name its batches), then d0 alone: rank 0; then d1. Their
         * epoch starts with both (--group-size 2) */
        target = h_start_small_target(target_bin, dir, what, PER_BUCKET, 200);
        CHECK(target > 0);
        CHECK(wait_plan(ep, 20000));
        d[0] = start_rank(sh, 0, dir, ep, 2);
        CHECK(wait_group(ep, 1, 20000));
        d[1] = start_rank(sh, 1, dir, ep, 2);
    } else {
        for (int i = 0; i < n; i++) d[i] = start_rank(sh, i, dir, ep, 0);
        /* the group's first step is every rank's: slots come once it has formed */
        CHECK(wait_group(ep, (uint32_t)n, 20000));
        target = h_start_small_target(target_bin, dir, what, PER_BUCKET, 200);
        CHECK(target > 0);
    }

    pid_t q = 0;
    bool landed = true;
    if (md == RESUMED) {
        q = sh->queue; /* not restarted */
    } else if (lost_reply) {
        q = restart_after_lost_reply(sh, queue_bin, dir, ep, more, &landed);
    } else {
        bool at2 = false; /* rank 0's model at step 2: the broker goes */
        for (uint64_t end = h_now_ms() + 60000; !at2 && h_now_ms() < end; h_sleep_ms(1))
            for (int i = 0; i < n; i++) at2 |= sh->r[i].rank == 0 && sh->r[i].step >= 2;
        CHECK(at2);
        h_kill(sh->queue, SIGKILL);
        q = h_start_small_queue(queue_bin, dir, more);
        CHECK(q > 0);
    }
    sh->restarted = 1;

    for (int i = 0; i < n; i++) {
        int rc = h_wait_exit(d[i], 60000);
        printf("%s: d%d exit %d, %llu batches counted, %llu registrations, model step %llu\n",
               what, i, rc, (unsigned long long)sh->r[i].st.batches,
               (unsigned long long)sh->r[i].st.registrations, (unsigned long long)sh->r[i].step);
        CHECK_EQ_INT(rc, 0);
        /* a second hello, to the restarted broker */
        CHECK(sh->r[i].st.registrations >= (md == RESUMED ? 1u : 2u));
        /* nothing went wrong that a user is told of as an error (e.g. rank 1 sending StepDone,
         * which the broker refuses: only rank 0 reports a step done) */
        char log[128];
        snprintf(log, sizeof log, "%s/d%d.log", dir, i);
        char *text = test_slurp(log, NULL);
        CHECK(text != NULL);
        const char *err = text ? strstr(text, " ERROR ") : NULL;
        if (err) printf("%s: d%d logged an error: %.200s\n", what, i, err);
        CHECK(err == NULL);
        free(text);
    }
    if (md == RESUMED) CHECK_EQ_INT(sh->r[0].rank, 0); /* d0's model is the group's */
    int right = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < PER_BUCKET; i++) {
            int want = times_wanted(md, b, i);
            if (sh->trained[b][i] != want)
                printf("%s: batch (0, %d, %d) trained %d times, not %d\n", what, b, i,
                       sh->trained[b][i], want);
            right += sh->trained[b][i] == want;
        }
    CHECK_EQ_INT(right, BATCHES);
    CHECK_EQ_INT(sh->trained_other, 0);
    wire_status s;
    int rc = h_print_ledger(ep, what, &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
        CHECK_EQ_INT(s.batches_trained + s.batches_committed, BATCHES);
        CHECK_EQ_INT(s.batches_todo, 0);
        CHECK_EQ_INT(s.batches_inflight, 0);
    }
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    munmap(sh, sizeof *sh);
    if (!check_failed) h_rmdir(dir);
    return landed;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: itest_group_restart QUEUE TARGET\n");
        return 2;
    }
    /* lost-reply's premise, a StepDone in the frozen broker's socket, failed twice in ~120 runs
     * (one log kept: 8 tests at once on 16 cores): the StepDone never reached the broker, and
     * the loop, correctly, had it acked by the restarted one. Likely cause: another request of
     * the loop's client (its heartbeat) in flight at the freeze times out first and resets the
     * socket, and the StepDone waits on the new one for a handshake the frozen broker cannot
     * answer, dropped at the loop's give-up. Every run still checks that nothing is lost or
     * trained twice; up to 3 runs, until one lands */
    bool landed = false;
    for (int a = 0; a < 3 && !landed; a++) landed = scenario(argv[1], argv[2], LOST_REPLY);
    CHECK(landed);
    scenario(argv[1], argv[2], TRAINING);
    scenario(argv[1], argv[2], RESUMED);
    CHECK_DONE();
}
