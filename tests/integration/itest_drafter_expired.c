/* itest_drafter_expired: a live drafter that the broker expired while it trained (silent past
 * liveness x heartbeat: a paused container, a network blip) still gets its batch acked, instead
 * of the broker handing it out again (trained twice). Both loops: the solo worker loop (Ack), a
 * data-parallel group of one and a group of two whose ranks are both expired mid-step (StepDone).
 *
 * The real dflash-queue (heartbeat 100 ms, liveness 30) and the real dflash-target (--model
 * synthetic) run in a temp dir. A forked child runs the drafter's loop (worker_loop_run) with a
 * consumer that stops its own process (SIGSTOP: every thread, the heartbeat thread too) while it
 * "trains" its first batch. This process waits until the broker has expired the drafter (its
 * peer count drops to the target alone), then lets the child go on (SIGCONT) until it has trained
 * 3 batches. The ack (or StepDone) of the first batch is then answered STALE by a broker that
 * did not restart. The solo loop says hello again, holding the batch, and acks it late; a
 * group's step was orphaned by the broker (group.h) and the join that creates the group again
 * acks it by the model step it reports. Checks: every batch the consumer trained is acked (the
 * loop's count) and the broker's ledger holds as many trained batches. Without the late ack the
 * solo loop drops the first batch (4 trained, 3 acked); with the step aborted, not orphaned, the
 * group leaves its step's unit in to-do (3 trained, 2 in the ledger).
 * The group of two: both ranks stop in their first step (the target starts once the group has
 * formed, so that step is their first); the broker expires both and, nobody being left to
 * resolve the step, keeps it orphaned; back (the broker paused until both are in the group
 * again, so that they train every later step together), the ranks re-register and the first to
 * join creates the group again at its model step (1), which acks the step. Without that, the step's 2 units
 * went back to to-do and were trained a second time (6 batches trained, 4 in the ledger).
 * A group of one whose stopped step is its last (its run ends at model step 1, as a trainer's
 * --max-steps): the loop joins once more before it ends, which resolves the orphaned step;
 * without that join the step stayed orphaned (0 in the ledger) until --group-hold-ms gave its
 * batch back to to-do, though the drafter's final model had it.
 * A group of one refused on its return: while it is expired a solo trainer of another run
 * registers (a rival that this process plays, beating while it waits). Back, the group's rank 0
 * registers and joins again; the broker holds the join (the rival might be a dying process),
 * then refuses it DENIED: the loop ends (exit 6 in the daemon) having called the consumer's
 * save_refused() once, at the model step it trained, so the daemon's final checkpoint keeps that
 * step (before, the loop ended without it: the step was lost although the model had it).
 * A solo trainer (run 0x77: its hellos name its run) stopped (its stop flag, as a SIGTERM) while
 * it is expired, the rival registered meanwhile: back, its ack is answered STALE and its one
 * hello after the stop is held (AGAIN: the rival might be dying), so no broker took the ack;
 * the batch stays held and its final checkpoint records it unacked at its step, for the drafter
 * resumed from it to ack (W12 of the drafter-loop audit: the batch was let go, the checkpoint
 * recorded nothing, and the broker, which had given it back to to-do, had it trained twice). */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

#include <signal.h>
#include <sys/mman.h>

#define BATCHES 3

/* What the drafter child reports, in memory shared with this process; and its model: a step
 * count, taken by a joiner from rank 0 (sync_state), one step per batch in lockstep with the
 * other ranks (a barrier stands for the step's all-reduce). */
typedef struct child_report {
    int consumed; /* batches trained here */
    int rc;
    worker_stats st;
    uint64_t step; /* the model's optimizer steps */
    uint64_t limit; /* done() once step reaches it (0: never), as a trainer's --max-steps */
    dp_comm *comm; /* the child's own pointer: the epoch's communicator, or NULL */
    int saves_refused;     /* save_refused() calls */
    uint64_t saved_step;   /* the model step at the last one */
    bool trainer;          /* solo: a trainer of run 0x77 (resume_step 0, run_id) */
    volatile sig_atomic_t stop; /* the loop's stop flag (the parent sets it: a SIGTERM) */
    int unacked_calls;     /* unacked() calls: what the final checkpoint records as unacked */
    uint32_t n_unacked;
    worker_unacked unacked[WORKER_MAX_UNACKED];
} child_report;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    child_report *r = ctx;
    (void)b;
    if (!r->consumed && !r->step) raise(SIGSTOP); /* the paused container; the parent resumes */
    int rc = r->comm ? dp_comm_barrier(r->comm) : 0;
    if (rc < 0) return rc;
    r->consumed++;
    *step = ++r->step;
    return 0;
}

static uint64_t model_step(void *ctx) { return ((child_report *)ctx)->step; }

static bool done(void *ctx)
{
    const child_report *r = ctx;
    return r->limit && r->step >= r->limit;
}

/* The broker refused us for good: what the trainer's final checkpoint would hold. */
static int save_refused(void *ctx)
{
    child_report *r = ctx;
    r->saves_refused++;
    r->saved_step = r->step;
    return 0;
}

/* A trainer resumed "from step 0" as run 0x77: its hellos name the run (client_set_trainer_run). */
static int64_t resume_step(void *ctx)
{
    (void)ctx;
    return 0;
}

static uint64_t run_id(void *ctx)
{
    (void)ctx;
    return 0x77;
}

/* The final checkpoint's unacked batches. */
static void unacked(void *ctx, const worker_unacked *b, uint32_t n)
{
    child_report *r = ctx;
    r->unacked_calls++;
    r->n_unacked = n < WORKER_MAX_UNACKED ? n : WORKER_MAX_UNACKED;
    memcpy(r->unacked, b, r->n_unacked * sizeof *b);
}

static void set_group(void *ctx, struct dp_comm *comm, int rank, int world)
{
    (void)rank, (void)world;
    ((child_report *)ctx)->comm = comm;
}

static int sync_state(void *ctx, int root)
{
    child_report *r = ctx;
    return dp_comm_broadcast_host(r->comm, &r->step, sizeof r->step, root);
}

/* The drafter process: its loop, its totals into *r. Exit status 0 when the loop returned 0. */
static void run_drafter(const char *ep, const char *name, bool group, child_report *r)
{
    worker_loop_config lc = {.endpoint = ep, .name = name, .backend = POOL_HOST,
                             .timeout_ms = 500, .max_batches = BATCHES,
                             .exit_when_drained = true};
    if (group) {
        lc.group = "expired";
        lc.comm_kind = DP_COMM_SHM;
        lc.comm_timeout_s = 10;
    }
    if (slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout) != 0) _exit(3);
    worker_consumer cons = {.name = "expired", .ctx = r, .consume = consume, .done = done,
                            .save_refused = save_refused, .unacked = unacked};
    if (group) {
        cons.set_group = set_group;
        cons.sync_state = sync_state;
        cons.model_step = model_step;
    }
    if (r->trainer) {
        cons.resume_step = resume_step;
        cons.run_id = run_id;
    }
    r->rc = worker_loop_run(&lc, &cons, &r->stop, &r->st);
    _exit(r->rc == 0 ? 0 : 1);
}

/* Waits until the broker at ep has a group of world ranks, up to 10 s. */
static bool wait_group(const char *ep, uint32_t world)
{
    uint64_t end = h_now_ms() + 10000;
    wire_status s;
    while (h_now_ms() < end) {
        if (h_broker_status(ep, &s) == 0 && s.n_groups == 1 && s.groups[0].world == world)
            return true;
        h_sleep_ms(20);
    }
    return false;
}

/* Pauses (or resumes) the broker at ep as dflash-ctl would. 0 or the error. */
static int steer(const char *ep, bool pause)
{
    client *c = client_new(ep, WIRE_ROLE_CTL, "steer");
    if (!c) return DFLASH_ENOMEM;
    int rc = client_hello(c, NULL, 0);
    if (rc == 0) rc = pause ? client_pause(c) : client_resume(c);
    client_destroy(&c);
    return rc;
}

/* Waits until the broker at ep counts `peers` peers, up to 10 s. */
static bool wait_peers(const char *ep, uint32_t peers)
{
    uint64_t end = h_now_ms() + 10000;
    wire_status s;
    while (h_now_ms() < end) {
        if (h_broker_status(ep, &s) == 0 && s.peers == peers) return true;
        h_sleep_ms(20);
    }
    return false;
}

/* A solo trainer of another run on the broker at ep (it resumes from step 0 as run 0x5a),
 * beating while it waits for drafter to exit, up to 30 s: drafter's exit status, or -1. */
static int rival_until_exit(const char *ep, pid_t drafter)
{
    client *c = client_new(ep, WIRE_ROLE_DRAFTER, "rival");
    client_set_timeout(c, 1000);
    CHECK_EQ_INT(client_hello(c, NULL, 0), 0);
    CHECK_EQ_INT(client_resume_from(c, 0, 0x5a), 0);
    h_signal(drafter, SIGCONT);
    int status = 0;
    pid_t got = 0;
    for (uint64_t end = h_now_ms() + 30000; !got && h_now_ms() < end; h_sleep_ms(20)) {
        client_poll(c);
        got = waitpid(drafter, &status, WNOHANG);
    }
    client_destroy(&c);
    if (got != drafter) {
        h_kill(drafter, SIGKILL);
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* n drafters (solo, or ranks of one group when group) stop in their first batch, are expired and
 * go on; every batch they trained must be in the ledger once. limit: their runs end at that
 * model step (0: after BATCHES batches); 1 makes the stopped step their last. rival (a group of
 * one): a solo trainer of another run comes in while it is expired, and its return is refused;
 * the step it trained goes to save_refused(). */
static void scenario(const char *queue_bin, const char *target_bin, bool group, int n,
                     uint64_t limit, bool rival, bool stopped)
{
    const char *mode = stopped      ? "solo trainer, stopped while expired"
                       : rival      ? "group of one, refused on its return"
                       : !group     ? "solo"
                       : limit == 1 ? "group of one, its last step"
                       : n == 1     ? "group of one"
                                    : "group of two";
    int batches = limit ? (int)limit : BATCHES;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    /* liveness 3 s: the second rank claims its slot of the step before the broker could expire
     * the first one, stopped already (1 s was short for a loaded machine: an ASan build, a
     * parallel ctest on 2 cores) */
    const char *more[] = {"--liveness=30", "--lease-timeout-ms=2000", "--log-level=warn", NULL};
    pid_t queue = h_start_small_queue(queue_bin, dir, more);
    CHECK(queue > 0);
    if (queue <= 0) return;

    child_report *r = mmap(NULL, 2 * sizeof *r, PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(r != MAP_FAILED);
    if (r == MAP_FAILED) return;
    memset(r, 0, 2 * sizeof *r);
    r[0].limit = r[1].limit = limit;
    r[0].trainer = stopped;
    pid_t drafter[2];
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "drafter-%d", i);
        fflush(NULL);
        drafter[i] = fork();
        if (drafter[i] == 0) run_drafter(ep, name, group, &r[i]);
    }
    /* a group trains its first step with all its ranks: slots come once it has formed */
    if (group) CHECK(wait_group(ep, (uint32_t)n));
    /* the synthetic target: 2 buckets of 4 batches, slots as the drafter's layout */
    pid_t target = h_start_small_target(target_bin, dir, "expired", 4, 200);
    CHECK(target > 0);

    /* each drafter stops itself in its first consume(); the broker then expires them */
    int status = 0;
    for (int i = 0; i < n; i++)
        CHECK(waitpid(drafter[i], &status, WUNTRACED) == drafter[i] && WIFSTOPPED(status));
    bool expired = wait_peers(ep, 1);
    CHECK(expired);
    printf("%s: stopped while training their first batch; broker expired them: %s\n", mode,
           expired ? "yes" : "no");
    /* a group goes on only once all its ranks are back in it (paused till then): a rank that
     * trained on alone and stopped would take its steps with it, its peer left to start again
     * from its own model, and the batches would not add up */
    if (stopped) {
        r[0].stop = 1; /* a SIGTERM while it was stopped: seen once it goes on */
        int rc = rival_until_exit(ep, drafter[0]);
        printf("%s: exit %d, rc %s, trained %d, its final checkpoint records %u unacked "
               "(%d unacked() calls)\n", mode, rc, err_str(r[0].rc), r[0].consumed,
               r[0].n_unacked, r[0].unacked_calls);
        CHECK_EQ_INT(rc, 0);
        CHECK_EQ_INT(r[0].consumed, 1);
        CHECK_EQ_INT(r[0].st.batches, 0); /* never acked */
        CHECK_EQ_INT(r[0].unacked_calls, 1);
        CHECK_EQ_INT(r[0].n_unacked, 1); /* the batch it trained, at its step */
        if (r[0].n_unacked == 1) CHECK_EQ_INT(r[0].unacked[0].step, 1);
        goto out;
    }
    if (rival) {
        int rc = rival_until_exit(ep, drafter[0]);
        printf("%s: exit %d, rc %s, save_refused() %d time(s) at model step %llu\n", mode, rc,
               err_str(r[0].rc), r[0].saves_refused, (unsigned long long)r[0].saved_step);
        CHECK_EQ_INT(rc, 1);
        CHECK_EQ_INT(r[0].rc, DFLASH_EDENIED);
        CHECK(r[0].st.other_model); /* the daemon's exit 6 */
        CHECK_EQ_INT(r[0].saves_refused, 1);
        CHECK_EQ_INT(r[0].saved_step, 1);
        goto out;
    }
    if (n > 1) CHECK_EQ_INT(steer(ep, true), 0);
    for (int i = 0; i < n; i++) h_signal(drafter[i], SIGCONT);
    if (n > 1) {
        CHECK(wait_group(ep, (uint32_t)n));
        CHECK_EQ_INT(steer(ep, false), 0);
    }
    int consumed = 0;
    for (int i = 0; i < n; i++) {
        CHECK(waitpid(drafter[i], &status, 0) == drafter[i]);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            printf("%s: drafter-%d %s %d (loop rc %s)\n", mode, i,
                   WIFEXITED(status) ? "exited" : "killed by signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), err_str(r[i].rc));
        printf("%s: drafter-%d trained %d batches, %llu counted, %llu registrations\n", mode, i,
               r[i].consumed, (unsigned long long)r[i].st.batches,
               (unsigned long long)r[i].st.registrations);
        CHECK_EQ_INT(r[i].consumed, batches);
        CHECK_EQ_INT(r[i].st.batches, r[i].consumed);
        CHECK(r[i].st.registrations >= 2); /* expired: a second hello */
        consumed += r[i].consumed;
    }
    wire_status s;
    int rc = h_print_ledger(ep, mode, &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) CHECK_EQ_INT(s.batches_trained, consumed);
out:
    munmap(r, 2 * sizeof *r);
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(queue), 0);
    h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    scenario(argv[1], argv[3], false, 1, 0, false, false);
    scenario(argv[1], argv[3], true, 1, 0, false, false);
    scenario(argv[1], argv[3], true, 2, 0, false, false);
    scenario(argv[1], argv[3], true, 1, 1, false, false);
    scenario(argv[1], argv[3], true, 1, 0, true, false);
    scenario(argv[1], argv[3], false, 1, 0, true, true);
    CHECK_DONE();
}
