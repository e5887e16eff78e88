/* itest_ack_outage: a batch the drafter trained while the broker was gone is acked once the
 * broker is back, however long it was gone, not left unacked (then handed out again: trained
 * twice). Both loops: the solo worker loop (Ack) and a data-parallel group of one (StepDone).
 *
 * The real dflash-queue (with a journal) and the real dflash-target (--model synthetic) run in a
 * temp dir; this process runs the drafter's loop (worker_loop_run, 50 ms request timeout) with a
 * consumer that SIGKILLs the broker while it "trains" its first batch. The ack (or StepDone) of
 * that batch then finds no broker for all of its attempts; a consumer hook the loop calls before
 * it claims again, or acks again (done()), restarts the broker on the same journal. The
 * loop re-registers (hello carries the batch) and goes on until 3 batches are trained. Checks:
 * every batch the consumer trained is acked (the loop's count), and the broker's ledger holds as
 * many trained batches. Without the re-ack, the first batch stays unacked (solo: held by the
 * drafter, and a fourth batch is trained; group: an orphan the broker hands out again).
 *
 * Last, the group of one where the broker comes back on a NEW journal (a lost one) while the
 * pending step holds a batch of epoch 2 (one batch per bucket, so 2 per epoch; the broker is
 * killed during the fifth): that ledger can never take its ack (an epoch it has not opened).
 * The member lets it go, said, and trains on; it re-registered 10 times a second for ever.
 *
 * And the solo loop whose ack's replies are lost: the broker is paused (SIGSTOP) while the
 * first batch "trains", and let go on after 10 request timeouts, while the loop still sends
 * the ack again. The broker takes the first ack it reads; the one whose answer reaches the loop
 * is a repeat, answered EXISTS: that is the loop's own ack, recorded before its reply was lost,
 * and the batch counts as acked (defect it guards: taken for a batch trained twice, not counted,
 * and a fourth batch trained for --max-batches 3).
 *
 * And the other side of that EXISTS: a batch another drafter acked while the loop trained it
 * (here a raw client acks it from inside the consumer: the broker records it trained) is not
 * the loop's own ack, which was never sent before: the loop says the batch was trained twice
 * and does not count it, so --max-batches 3 takes a fourth (defect it guards: any EXISTS taken
 * for a lost reply, the batch counted). */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "slot.h"
#include "worker_loop.h"

#include <pthread.h>
#include <signal.h>

#define BATCHES 3

typedef struct outage {
    const char *queue_bin, *dir;
    const char *const *extra, *const *extra_after; /* the restart's flags (NULL: extra) */
    int kill_at;                                     /* the batch during which it is killed */
    bool pause;                /* lost_reply: paused there instead, let go on after pause_ms */
    int pause_ms;
    pthread_t resumer;
    pid_t queue;
    int consumed;
    bool killed, restarted, paused;
} outage;

static void *resume_broker_later(void *arg)
{
    outage *o = arg;
    h_sleep_ms(o->pause_ms); /* the acks sent meanwhile time out, unanswered */
    h_signal(o->queue, SIGCONT);
    return NULL;
}

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    outage *o = ctx;
    (void)b;
    if (++o->consumed == o->kill_at && o->pause) {
        o->paused = h_signal(o->queue, SIGSTOP) == 0 &&
                    pthread_create(&o->resumer, NULL, resume_broker_later, o) == 0;
    } else if (o->consumed == o->kill_at) {
        h_kill(o->queue, SIGKILL);
        o->queue = -1;
        o->killed = true;
    }
    *step = (uint64_t)o->consumed;
    return 0;
}

/* After the first batch's ack or StepDone has given up: the broker comes back. */
static void restart(outage *o)
{
    if (o->killed && !o->restarted) {
        o->queue = h_start_queue(o->queue_bin, o->dir, o->extra_after ? o->extra_after : o->extra);
        o->restarted = true;
    }
}

static bool done(void *ctx)
{
    restart(ctx); /* called before the next claim or ack */
    return false;
}

/* the group hooks of a consumer without a model: steps are the batches consumed */
static uint64_t model_step(void *ctx)
{
    return (uint64_t)((outage *)ctx)->consumed;
}

static void scenario(const char *queue_bin, const char *target_bin, bool group)
{
    char dir[64], ep[128], journal[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    const char *extra[] = {journal, "--min-ready=1", "--max-depth=2", "--lease-timeout-ms=2000",
                           "--heartbeat-ms=100", "--stats-interval-ms=0", "--log-level=warn",
                           NULL};
    outage o = {.queue_bin = queue_bin, .dir = dir, .extra = extra, .kill_at = 1};
    o.queue = h_start_queue(queue_bin, dir, extra);
    CHECK(o.queue > 0);
    if (o.queue <= 0) return;

    /* the synthetic target: 2 buckets of 4 batches, slots as the drafter's layout below */
    pid_t target = h_start_small_target(target_bin, dir, "outage", 4, 200);
    CHECK(target > 0);

    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 50, .max_batches = BATCHES,
                             .exit_when_drained = true};
    if (group) {
        lc.group = "outage";
        lc.comm_kind = DP_COMM_SHM;
        lc.comm_timeout_s = 10;
    }
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    worker_consumer cons = {.name = "outage", .ctx = &o, .consume = consume, .done = done};
    if (group) {
        cons.set_group = h_set_group_none;
        cons.sync_state = h_sync_state_none;
        cons.model_step = model_step;
    }
    volatile sig_atomic_t stop = 0;
    worker_stats st;
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, &st), 0);
    CHECK(o.killed && o.restarted && o.queue > 0);
    printf("%s: trained %d batches, %llu counted, %llu registrations\n", group ? "group" : "solo",
           o.consumed, (unsigned long long)st.batches, (unsigned long long)st.registrations);
    CHECK_EQ_INT(st.batches, o.consumed);
    CHECK_EQ_INT(o.consumed, BATCHES);

    wire_status s;
    int rc = h_print_ledger(ep, group ? "group" : "solo", &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) CHECK_EQ_INT(s.batches_trained, o.consumed);
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(o.queue), 0);
    h_rmdir(dir);
}

/* The group of one, the broker back on a new journal with the pending step's batch in epoch 2. */
static void new_journal(const char *queue_bin, const char *target_bin)
{
    char dir[64], ep[128], journal[128], journal2[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    snprintf(journal2, sizeof journal2, "--journal=%s/new.journal", dir);
    const char *extra[] = {journal, "--min-ready=1", "--max-depth=2", "--lease-timeout-ms=2000",
                           "--heartbeat-ms=100", "--stats-interval-ms=0", "--log-level=warn",
                           NULL};
    const char *extra2[] = {journal2, "--min-ready=1", "--max-depth=2",
                            "--lease-timeout-ms=2000", "--heartbeat-ms=100",
                            "--stats-interval-ms=0", "--log-level=warn", NULL};
    outage o = {.queue_bin = queue_bin, .dir = dir, .extra = extra, .extra_after = extra2,
                .kill_at = 5};
    o.queue = h_start_queue(queue_bin, dir, extra);
    CHECK(o.queue > 0);
    if (o.queue <= 0) return;
    char rt[300], to[64];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(to, sizeof to, "--timeout-ms=%d", 200);
    char *targv[] = {(char *)target_bin, rt, "--name=newj", "--model=synthetic", "--slots=2",
                     "--token-budget=256", "--max-seqs=4", "--hidden=8", "--layers=2",
                     "--buckets=64,256", "--batches-per-bucket=1", "--epochs=10",
                     "--backend=host", to, "--progress-ms=0", "--log-level=warn", NULL};
    pid_t target = h_spawn(targv, NULL);
    CHECK(target > 0);
    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 50, .max_batches = 8, .exit_when_drained = true,
                             .group = "newj", .comm_kind = DP_COMM_SHM, .comm_timeout_s = 10};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    worker_consumer cons = {.name = "outage", .ctx = &o, .consume = consume, .done = done,
                            .set_group = h_set_group_none, .sync_state = h_sync_state_none,
                            .model_step = model_step};
    volatile sig_atomic_t stop = 0;
    worker_stats st;
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, &st), 0);
    printf("new journal: trained %d batches, %llu registrations\n", o.consumed,
           (unsigned long long)st.registrations);
    CHECK(o.killed && o.restarted);
    CHECK_EQ_INT(o.consumed, 8);
    CHECK(st.registrations < 10); /* not one every 100 ms */
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(o.queue), 0);
    h_rmdir(dir);
}

/* The solo loop, the broker paused during the first batch: its ack's replies are lost. */
static void lost_reply(const char *queue_bin, const char *target_bin)
{
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *extra[] = {"--journal=none", "--min-ready=1", "--max-depth=2",
                           "--lease-timeout-ms=2000", "--heartbeat-ms=100",
                           "--stats-interval-ms=0", "--log-level=warn", NULL};
    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 50, .max_batches = BATCHES,
                             .exit_when_drained = true};
    /* 10 timeouts: well inside the ack's 50 attempts */
    outage o = {.kill_at = 1, .pause = true, .pause_ms = 10 * lc.timeout_ms};
    o.queue = h_start_queue(queue_bin, dir, extra);
    CHECK(o.queue > 0);
    if (o.queue <= 0) return;
    pid_t target = h_start_small_target(target_bin, dir, "lost", 4, 200);
    CHECK(target > 0);
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    worker_consumer cons = {.name = "outage", .ctx = &o, .consume = consume};
    volatile sig_atomic_t stop = 0;
    worker_stats st;
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, &st), 0);
    if (o.paused) pthread_join(o.resumer, NULL);
    CHECK(o.paused);
    printf("lost reply: trained %d batches, %llu counted\n", o.consumed,
           (unsigned long long)st.batches);
    CHECK_EQ_INT(st.batches, o.consumed);
    CHECK_EQ_INT(o.consumed, BATCHES);
    wire_status s;
    int rc = h_print_ledger(ep, "lost reply", &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) CHECK_EQ_INT(s.batches_trained, o.consumed);
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(o.queue), 0);
    h_rmdir(dir);
}

/* acked_by_another's consumer: its first batch is acked by another drafter meanwhile. */
typedef struct taken {
    const char *ep;
    int consumed, taken;
} taken;

static int consume_taken(void *ctx, const worker_batch *b, uint64_t *step)
{
    taken *t = ctx;
    if (t->consumed == 0) {
        client *c = client_new(t->ep, WIRE_ROLE_DRAFTER, "other");
        wire_unit u = {.epoch = b->wu.epoch, .bucket = b->wu.bucket, .index = b->wu.batch};
        if (c && client_hello(c, NULL, 0) == 0 && client_ack(c, &u, 1) == 0) t->taken++;
        client_destroy(&c);
    }
    *step = (uint64_t)++t->consumed;
    return 0;
}

/* The solo loop, its first batch acked by another drafter while it trains it. */
static void acked_by_another(const char *queue_bin, const char *target_bin)
{
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *extra[] = {"--journal=none", "--min-ready=1", "--max-depth=2",
                           "--heartbeat-ms=100", "--stats-interval-ms=0", "--log-level=error",
                           NULL};
    pid_t q = h_start_queue(queue_bin, dir, extra);
    CHECK(q > 0);
    if (q <= 0) return;
    pid_t target = h_start_small_target(target_bin, dir, "taken", 4, 200);
    CHECK(target > 0);
    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 1000, .max_batches = BATCHES,
                             .exit_when_drained = true};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    taken t = {.ep = ep};
    worker_consumer cons = {.name = "taken", .ctx = &t, .consume = consume_taken};
    volatile sig_atomic_t stop = 0;
    worker_stats st;
    CHECK_EQ_INT(worker_loop_run(&lc, &cons, &stop, &st), 0);
    printf("acked by another: trained %d batches, %llu counted\n", t.consumed,
           (unsigned long long)st.batches);
    CHECK_EQ_INT(t.taken, 1);
    CHECK_EQ_INT(st.batches, BATCHES);
    CHECK_EQ_INT(t.consumed, BATCHES + 1);
    wire_status s;
    int rc = h_print_ledger(ep, "acked by another", &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) CHECK_EQ_INT(s.batches_trained, t.consumed);
    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    scenario(argv[1], argv[3], false);
    scenario(argv[1], argv[3], true);
    new_journal(argv[1], argv[3]);
    lost_reply(argv[1], argv[3]);
    acked_by_another(argv[1], argv[3]);
    CHECK_DONE();
}
