/* itest_resumed_unacked: a drafter resumed from a checkpoint that records a trained batch whose
 * ack no broker took (broker and drafter stopped together) acks it, at its step, instead of
 * training it again; a group member does so only when the group goes on from a model that took
 * that step; a solo trainer tells its ResumeFrom once per process, not again to a restarted broker.
 *
 * The real dflash-queue (in-memory ledger; a journal in solo-restart) and the real dflash-target
 * (--model synthetic: 2 buckets of 4 batches, one epoch) run in a temp dir; this process runs the
 * drafter's loop (worker_loop_run) with a consumer that resumed "from step 3" and whose checkpoint
 * records batch (0, 0, 2) as trained at step 3 and unacked (resumed_unacked()). The loop runs
 * until the broker has nothing left. Cases:
 *   solo      the loop acks the batch after its ResumeFrom: the consumer trains the other 7;
 *   group-on  a group of one whose model is at step 3: the group goes on from it (the view's
 *             step 3), the batch is acked: the other 7 are trained;
 *   group-off a group of one whose model is at step 0, below the batch's step (as when another
 *             member, at a lower step, created the group and we are synced to its model): the
 *             batch is not in the group's model, it is let go and trained: all 8.
 *   solo-late as solo, but the broker is paused (SIGSTOP) when the loop is about to send its
 *             ResumeFrom, for three request timeouts: the request goes unanswered, and the loop
 *             sends it again until the broker, let go on, answers (defect it guards: a retry
 *             that gave up at the first timeout made the resume fail and the drafter exit
 *             with it, at start-up).
 *   solo-restart as solo, a trainer of a run (run_id()), the broker with a journal: once the loop
 *             has trained and acked 3 batches (steps 4 to 6), between two claims (its settled()
 *             hook, where a trainer checkpoints), the broker is SIGKILLed and started again on its
 *             journal; the loop's next Claim is answered STALE and it registers again through its
 *             main loop, its hello naming its run. Defect it guards: a loop that told the broker
 *             its ResumeFrom again at that hello (not once per process) had the restarted broker
 *             rewind to step 3 what this process trained since: steps 4 to 6 trained twice.
 * Checks: the batches trained (each once), the loop's count of them and of their tokens (the
 * checkpoint's batch, trained by the run before, is not one: --max-batches counts this run's),
 * the broker's ledger (8 trained, none to do or in flight; solo-restart: the restarted broker took
 * 4 acks, those of the batches left then), and that the loop reported no unacked batch at its end
 * (unacked() called with none).
 * Without the acks, (0, 0, 2) is trained again in the first two cases. */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

#include <pthread.h>
#include <signal.h>

#define PER_BUCKET 4
#define BATCHES (2 * PER_BUCKET)
#define RESUMED_STEP 3

typedef struct fake {
    uint64_t base;               /* the model's step at the start */
    int trained[2][PER_BUCKET];  /* times each batch of epoch 0 was consumed */
    int consumed;
    uint64_t tokens;             /* of the batches consumed */
    int unacked_calls;
    uint32_t unacked_last;       /* n of the last unacked() call */
    pid_t pause_queue;           /* solo-late: the broker to pause at the ResumeFrom, or 0 */
    int pause_ms;                /* for how long */
    bool paused;
    pthread_t resumer;           /* lets the paused broker go on */
    uint64_t run_id;             /* solo-restart: the run we train (0: none, as older drafters) */
    int restart_after;           /* solo-restart: the broker restarts after this many batches */
    pid_t queue;                 /* the broker (restarted: its new pid) */
    const char *queue_bin, *queue_dir;
    const char *const *queue_args;
    bool restarted;
} fake;

static void *resume_broker_later(void *arg)
{
    fake *f = arg;
    h_sleep_ms(f->pause_ms); /* the ResumeFrom sent meanwhile times out (timeout_ms) */
    h_signal(f->pause_queue, SIGCONT);
    return NULL;
}

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    fake *f = ctx;
    if (b->wu.epoch == 0 && b->wu.bucket < 2 && b->wu.batch < PER_BUCKET)
        f->trained[b->wu.bucket][b->wu.batch]++;
    f->tokens += b->n_tokens;
    *step = f->base + (uint64_t)++f->consumed;
    return 0;
}

/* Called by the loop right before its ResumeFrom (solo-late: pauses the broker first). */
static int64_t resume_step(void *ctx)
{
    fake *f = ctx;
    if (f->pause_queue > 0 && !f->paused) {
        f->paused = h_signal(f->pause_queue, SIGSTOP) == 0 &&
                    pthread_create(&f->resumer, NULL, resume_broker_later, f) == 0;
    }
    return (int64_t)f->base;
}

static uint32_t resumed_unacked(void *ctx, worker_unacked *out, uint32_t max)
{
    (void)ctx;
    if (max < 1) return 0;
    out[0] = (worker_unacked){{0, 0, 2}, RESUMED_STEP};
    return 1;
}

static void unacked(void *ctx, const worker_unacked *b, uint32_t n)
{
    fake *f = ctx;
    (void)b;
    f->unacked_calls++;
    f->unacked_last = n;
}

static uint64_t run_id(void *ctx) { return ((fake *)ctx)->run_id; }

/* Before each claim with every ack taken (a trainer's checkpoint place); solo-restart: SIGKILLs
 * the broker once restart_after batches are trained and starts it again on its journal. */
static int settled(void *ctx)
{
    fake *f = ctx;
    if (f->restart_after > 0 && f->consumed == f->restart_after && !f->restarted) {
        h_kill(f->queue, SIGKILL);
        f->queue = h_start_queue(f->queue_bin, f->queue_dir, f->queue_args);
        f->restarted = true;
        if (f->queue <= 0) return DFLASH_EIO;
    }
    return 0;
}

static uint64_t model_step(void *ctx)
{
    fake *f = ctx;
    return f->base + (uint64_t)f->consumed;
}

/* One case on its own broker and target; group NULL: solo. base: the model's step at the start.
 * want_resumed: how often (0, 0, 2) must be trained (0: acked from the checkpoint, 1: let go).
 * late: the broker is paused for three request timeouts at the ResumeFrom. restart_after > 0: the
 * broker keeps a journal, and is SIGKILLed and restarted on it after that many batches. */
static void scenario(const char *queue_bin, const char *target_bin, const char *what,
                     const char *group, uint64_t base, int want_resumed, bool late,
                     int restart_after)
{
    char dir[64], ep[128], journal[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    const char *extra[] = {restart_after > 0 ? journal : "--journal=none", "--min-ready=1",
                           "--max-depth=2", "--heartbeat-ms=100", "--stats-interval-ms=0",
                           "--log-level=warn", NULL};
    pid_t q = h_start_queue(queue_bin, dir, extra);
    CHECK(q > 0);
    if (q <= 0) return;
    pid_t target = h_start_small_target(target_bin, dir, what, PER_BUCKET, 500);
    CHECK(target > 0);
    /* the epoch is open (the target asked for work) before the loop acks into it */
    wire_status s = {0};
    uint64_t until = h_now_ms() + 20000;
    while (h_now_ms() < until && (h_broker_status(ep, &s) != 0 || s.batches_inflight == 0))
        h_sleep_ms(20);
    CHECK(s.batches_inflight > 0);

    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 500, .exit_when_drained = true};
    if (group) {
        lc.group = group;
        lc.comm_kind = DP_COMM_SHM;
        lc.comm_timeout_s = 10;
    }
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    fake f = {.base = base, .pause_queue = late ? q : 0, .pause_ms = 3 * lc.timeout_ms,
              .run_id = restart_after > 0 ? 0x5eed0f7e57ull : 0, .restart_after = restart_after,
              .queue = q, .queue_bin = queue_bin, .queue_dir = dir, .queue_args = extra};
    worker_consumer cons = {.name = "resumed", .ctx = &f, .consume = consume,
                            .resume_step = resume_step, .run_id = run_id, .settled = settled,
                            .resumed_unacked = resumed_unacked, .unacked = unacked};
    if (group) {
        cons.set_group = h_set_group_none;
        cons.sync_state = h_sync_state_none;
        cons.model_step = model_step;
    }
    volatile sig_atomic_t stop = 0;
    worker_stats st;
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, &st), 0);
    if (f.paused) pthread_join(f.resumer, NULL);
    CHECK(f.paused == late);
    CHECK(f.restarted == (restart_after > 0));
    if (restart_after > 0) CHECK(st.registrations >= 2); /* the restart was registered with */
    q = f.queue;

    int twice = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < PER_BUCKET; i++)
            if (f.trained[b][i] > 1) twice++;
    printf("%s: trained %d batches, (0, 0, 2) %d times, %d twice\n", what, f.consumed,
           f.trained[0][2], twice);
    CHECK_EQ_INT(f.trained[0][2], want_resumed);
    CHECK_EQ_INT(twice, 0);
    CHECK_EQ_INT(f.consumed, BATCHES - 1 + want_resumed);
    CHECK_EQ_INT(st.batches, f.consumed); /* the checkpoint's batch is not this run's */
    CHECK_EQ_INT(st.tokens, f.tokens);    /* nor are its tokens (the progress line's rate) */
    CHECK_EQ_INT(f.unacked_calls, 1); /* before the final checkpoint ... */
    CHECK_EQ_INT(f.unacked_last, 0);  /* ... with nothing left unacked */
    CHECK_EQ_INT(h_print_ledger(ep, what, &s), 0);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, BATCHES);
    CHECK_EQ_INT(s.batches_todo, 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    /* the restarted broker's acks (its counter starts at its start): one per batch left to
     * train then, none of a batch it handed out again */
    if (restart_after > 0) CHECK_EQ_INT(s.acks, BATCHES - 1 - restart_after);
    CHECK_EQ_INT(h_stop(target), 0);
    if (q > 0) CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    scenario(argv[1], argv[3], "solo", NULL, RESUMED_STEP, 0, false, 0);
    scenario(argv[1], argv[3], "solo-late", NULL, RESUMED_STEP, 0, true, 0);
    scenario(argv[1], argv[3], "solo-restart", NULL, RESUMED_STEP, 0, false, 3);
    scenario(argv[1], argv[3], "group-on", "r", RESUMED_STEP, 0, false, 0);
    scenario(argv[1], argv[3], "group-off", "r", 0, 1, false, 0);
    CHECK_DONE();
}
