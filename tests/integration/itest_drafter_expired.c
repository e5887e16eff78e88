/* itest_drafter_expired: a live drafter that the broker expired while it trained (silent past
 * liveness x heartbeat: a paused container, a network blip) still gets its batch acked, instead
 * of the broker handing it out again (trained twice). Both loops: the solo worker loop (Ack) and
 * a data-parallel group of one (StepDone).
 *
 * The real dflash-queue (heartbeat 100 ms, liveness 3) and the real dflash-target (--model
 * synthetic) run in a temp dir. A forked child runs the drafter's loop (worker_loop_run) with a
 * consumer that stops its own process (SIGSTOP: every thread, the heartbeat thread too) while it
 * "trains" its first batch. This process waits until the broker has expired the drafter (its
 * peer count drops to the target alone), then lets the child go on (SIGCONT) until it has trained
 * 3 batches. The ack (or StepDone) of the first batch is then answered STALE by a broker that
 * did not restart; the loop says hello again, holding the batch, and acks it late. Checks: every
 * batch the consumer trained is acked (the loop's count) and the broker's ledger holds as many
 * trained batches. Without the late ack, the solo loop drops the first batch (4 trained, 3
 * acked) and the group leaves its step's unit in to-do (3 trained, 2 in the ledger). */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

#include <signal.h>
#include <sys/mman.h>

#define BATCHES 3

/* What the drafter child reports, in memory shared with this process. */
typedef struct child_report {
    int consumed;
    int rc;
    worker_stats st;
} child_report;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    child_report *r = ctx;
    (void)b;
    if (++r->consumed == 1) raise(SIGSTOP); /* the paused container; the parent resumes us */
    *step = (uint64_t)r->consumed;
    return 0;
}

/* the group hooks of a consumer without a model: steps are the batches consumed */
static uint64_t model_step(void *ctx)
{
    return (uint64_t)((child_report *)ctx)->consumed;
}

/* The drafter process: its loop, its totals into *r. Exit status 0 when the loop returned 0. */
static void run_drafter(const char *ep, bool group, child_report *r)
{
    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 500, .max_batches = BATCHES,
                             .exit_when_drained = true};
    if (group) {
        lc.group = "expired";
        lc.comm_kind = DP_COMM_SHM;
        lc.comm_timeout_s = 10;
    }
    if (slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout) != 0) _exit(3);
    worker_consumer cons = {.name = "expired", .ctx = r, .consume = consume};
    if (group) {
        cons.set_group = h_set_group_none;
        cons.sync_state = h_sync_state_none;
        cons.model_step = model_step;
    }
    volatile sig_atomic_t stop = 0;
    r->rc = worker_loop_run(&lc, &cons, &stop, &r->st);
    _exit(r->rc == 0 ? 0 : 1);
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

static void scenario(const char *queue_bin, const char *target_bin, bool group)
{
    const char *mode = group ? "group" : "solo";
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--liveness=3", "--lease-timeout-ms=2000", "--log-level=warn", NULL};
    pid_t queue = h_start_small_queue(queue_bin, dir, more);
    CHECK(queue > 0);
    if (queue <= 0) return;
    /* the synthetic target: 2 buckets of 4 batches, slots as the drafter's layout */
    pid_t target = h_start_small_target(target_bin, dir, "expired", 4, 200);
    CHECK(target > 0);

    child_report *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                           -1, 0);
    CHECK(r != MAP_FAILED);
    if (r == MAP_FAILED) return;
    memset(r, 0, sizeof *r);
    fflush(NULL);
    pid_t drafter = fork();
    if (drafter == 0) run_drafter(ep, group, r);

    /* the drafter stops itself in its first consume(); the broker then expires it */
    int status = 0;
    CHECK(waitpid(drafter, &status, WUNTRACED) == drafter && WIFSTOPPED(status));
    bool expired = wait_peers(ep, 1);
    CHECK(expired);
    printf("%s: drafter stopped while training its first batch; broker expired it: %s\n", mode,
           expired ? "yes" : "no");
    kill(drafter, SIGCONT);
    CHECK(waitpid(drafter, &status, 0) == drafter);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    printf("%s: trained %d batches, %llu counted, %llu registrations\n", mode, r->consumed,
           (unsigned long long)r->st.batches, (unsigned long long)r->st.registrations);
    CHECK_EQ_INT(r->consumed, BATCHES);
    CHECK_EQ_INT(r->st.batches, r->consumed);
    CHECK(r->st.registrations >= 2); /* the late ack went through a second hello */
    wire_status s;
    int rc = h_print_ledger(ep, mode, &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) CHECK_EQ_INT(s.batches_trained, r->consumed);
    munmap(r, sizeof *r);
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(queue), 0);
    h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    scenario(argv[1], argv[3], false);
    scenario(argv[1], argv[3], true);
    CHECK_DONE();
}
