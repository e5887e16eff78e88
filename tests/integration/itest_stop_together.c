/* itest_stop_together: broker and drafter stopped together (a host shutdown, a systemd stop:
 * SIGTERM to both) while the drafter trains a batch, then restarted: every batch of the run is
 * in the final model exactly once (docs/operating.md section 6).
 *
 * stops, group-stops: the broker stops gracefully (broker_stop.c): it waits for the drafter's
 * ack (a group's StepDone) of that batch and its final checkpoint's report, so the batch is
 * acked before the stop, the checkpoint records no unacked batch, and the ledger a broker
 * started again on the journal reads has it committed, nothing in flight (defect: the broker
 * exited at once, the ack went unanswered and the batch went into the checkpoint unacked).
 * The other cases make the broker gone before it answers (killed, frozen: a crash, an OOM kill,
 * or its --stop-grace-ms over): the drafter's ack finds no broker, so the batch goes into its
 * final checkpoint unacked; the checkpoint records it, and the drafter resumed from it acks it
 * at its step (defect: it was handed out again and trained twice, and the run ended a step
 * late).
 *
 * Setup (in a temp dir): a tiny random Qwen3 target (dflash-mkmodel), 96 generated sequences
 * (dflash-gen) packed into a shard (dflash-data): 24 batches an epoch, 2 epochs. Per case, the
 * real broker (with a journal), target and drafter on their own runtime dir; never a fixed
 * sleep. Once the drafter has trained a few batches it is frozen (SIGSTOP) until the broker's
 * status shows it between a release and its ack (one batch held, the acks standing still).
 *   stops   the target is stopped (it leaves the broker: nothing of its pool stays in flight),
 *           then broker and drafter get SIGTERM at the same moment (and the drafter SIGCONT):
 *           both must exit 0, the broker's log saying its stop settled, the drafter's saying no
 *           batch goes unacked, its final checkpoint recording none; the broker started alone on
 *           the journal must count every batch trained up to that checkpoint's step committed,
 *           one per step, none trained uncommitted, none in flight;
 *   group-stops  as stops, the drafter a group of one (--group g: its StepDone must land).
 * Otherwise the broker is frozen, and the drafter gets SIGTERM (and SIGCONT): it finishes the
 * step, its ack goes unanswered, so that the stop is the broker's exit before it answers, made
 * certain. The drafter must exit 0 saying the batch goes into its final checkpoint unacked. The
 * target is stopped too. Then the broker:
 *   lost    SIGKILLed while frozen: the ack never reached it;
 *   landed  let go on (SIGCONT) until its acks count the frozen ack, then SIGTERM: the ack
 *           reached it, only its reply was lost (the resumed drafter's ack is a repeat,
 *           answered EXISTS, which must change nothing). The ack must be the drafter's first
 *           request to the frozen broker: a heartbeat sent first times out and resets the
 *           connection, and the ack then waits on a new one the frozen broker never accepts,
 *           and is dropped at the drafter's exit (it failed so in CI once the freeze took more
 *           than half a 200 ms heartbeat). So this broker's heartbeat is 2000 ms: the drafter's
 *           heartbeat thread sends only after 1000 ms without a request, and the ack follows
 *           the release by a step and the freeze. Its stop does not wait (--stop-grace-ms 0)
 *           for the frozen drafter's checkpoint report, which never comes, until it expires;
 *   group   as lost, the drafter a group of one (--group g, its StepDone unanswered);
 *   late    as lost, but the drafter comes back only after the broker gave the batches in flight
 *           before its restart back to to-do and the target put the unacked one in a slot
 *           again (a drafter slow to load): its late ack must keep that slot from being
 *           granted.
 * All three are started again as before; the drafter runs until the broker has no batch left.
 * Checks: the restarted drafter says it acked the checkpoint's batch (stops: that it had none to
 * ack); the broker's ledger holds
 * every batch trained or committed, none to do or in flight; and the final checkpoint's step is
 * the number of batches (one batch per step: a batch trained twice makes a step too many).
 * Usage: itest_stop_together QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "dflash_ckpt.h"
#include "harness.h"
#include "test_files.h"

#include <dirent.h>
#include <sys/stat.h>

#define EPOCHS 2 /* the target's --epochs */
#define EPOCHS_ARG "2"

static char dir[64], model[128], shard[128];
static const char *queue_bin, *target_bin, *drafter_bin;

typedef enum { BROKER_LOST, BROKER_LANDED, BROKER_STOPS } broker_end;
typedef enum { BACK_AT_ONCE, BACK_LATE } drafter_back;

/* One case's processes and paths. */
typedef struct run {
    const char *name, *group;
    broker_end end;
    char rt[160], rtflag[160], ep[160], journal[160], ckpt[160], qlog[160], tlog[160], dlog[160];
    pid_t q, t, d;
} run;

/* The newest step-N under root (0: none). */
static long newest_step(const char *root)
{
    DIR *dd = opendir(root);
    long best = 0;
    for (struct dirent *e; dd && (e = readdir(dd));) {
        long s;
        if (sscanf(e->d_name, "step-%ld", &s) == 1 && s > best) best = s;
    }
    if (dd) closedir(dd);
    return best;
}

/* BROKER_STOPS: the frozen drafter is not expired while the target stops and the signals are
 * sent (liveness 50, 10 s: at 10, 2 s, the target's exit under ctest -j6 on 2 cores (ASan) took
 * 3.4 s, the broker expired the frozen drafter and stopped with nothing to wait for).
 * The others' stop waits up to 30 s for the drafter's step, ack and checkpoint report (a bound,
 * not a timing: a settled stop exits at once). BROKER_LANDED: heartbeats of 2000 ms and no stop
 * grace (see the header). */
static void start_queue(run *r)
{
    bool landed = r->end == BROKER_LANDED;
    char *q[] = {(char *)queue_bin, r->rtflag, r->journal, "--min-ready", "1", "--max-depth", "4",
                 "--heartbeat-ms", landed ? "2000" : "200", "--lease-timeout-ms", "1000",
                 "--liveness", r->end == BROKER_STOPS ? "50" : "3", "--stop-grace-ms",
                 landed ? "0" : "30000", NULL};
    r->q = h_spawn_logged(q, r->qlog);
    CHECK(h_wait_broker(r->ep, H_BROKER_UP_MS) != 0);
}

/* The daemons' --timeout-ms. BROKER_STOPS: 2000, the stopping broker's replies must be waited for
 * (500 ms was outlasted under ASan, 4 tests at once on 2 cores: the ack went unanswered and the
 * batch into the checkpoint unacked, the other cases' path); else 500: the broker frozen or
 * gone, each request's timeout is a wait of the test's. */
static const char *request_timeout(const run *r)
{
    return r->end == BROKER_STOPS ? "2000" : "500";
}

static void start_target(run *r)
{
    char *t[] = {(char *)target_bin, "--name", "tgt", "--model", model, "--shards", shard,
                 "--slots", "4", "--epochs", EPOCHS_ARG, "--buckets", "32", "--token-budget", "128",
                 "--max-seqs", "4", "--layers", "3", r->rtflag, "--threads", "1", "--backend",
                 "host", "--timeout-ms", (char *)request_timeout(r), "--progress-ms", "0", NULL};
    r->t = h_spawn_logged(t, r->tlog);
}

static void start_drafter(run *r)
{
    const char *extra[] = {"--lr", "3e-3", "--checkpoint-every", "8", "--progress-ms", "0",
                           "--timeout-ms", request_timeout(r), r->group ? "--group" : NULL,
                           r->group, "--comm", "shm", NULL};
    r->d = h_start_training_drafter(drafter_bin, model, r->rt, r->name, r->ckpt, 128, extra,
                                    r->dlog);
}

/* Batches the broker's drafters hold: released (copied) and not acked. */
static uint64_t held_by_drafters(const wire_status *s)
{
    uint64_t in_slots = 0;
    for (uint32_t b = 0; b < s->n_buckets; b++)
        in_slots += s->buckets[b].ready + s->buckets[b].leased + s->buckets[b].filling;
    return s->batches_inflight - in_slots;
}

/* Freezes the drafter between the release of a batch and its ack: it is stopped at random
 * moments until two status replies 50 ms apart show one batch held and no new ack (an ack sent
 * before the freeze would have been counted by then). true when it is frozen so; *acks: the
 * broker's acks count then. */
static bool freeze_holding(run *r, uint64_t *acks)
{
    int rc;
    client *c = h_client(r->ep, WIRE_ROLE_CTL, "freeze", 10, &rc); /* one: a fresh client per
                                                                      look was slow under load */
    for (int attempt = 0; rc == 0 && attempt < 500; attempt++) {
        h_signal(r->d, SIGSTOP);
        wire_status a, b;
        bool held = client_status(c, &a) == 0 && held_by_drafters(&a) == 1;
        if (held) h_sleep_ms(50);
        if (held && client_status(c, &b) == 0 && held_by_drafters(&b) == 1 &&
            b.acks == a.acks) {
            *acks = b.acks;
            printf("%s: drafter frozen holding a batch after %d attempts (%llu acks)\n", r->name,
                   attempt + 1, (unsigned long long)b.acks);
            client_destroy(&c);
            return true;
        }
        h_signal(r->d, SIGCONT);
        h_sleep_ms(1 + attempt % 4);
    }
    client_destroy(&c);
    return false;
}

static void path_in(char *out, size_t len, const char *name, const char *what)
{
    snprintf(out, len, "%s/%s-%s", dir, what, name);
}

/* The unacked batches the newest checkpoint under r->ckpt records (-1: none readable). */
static int checkpoint_unacked(const run *r)
{
    char path[512], err[256] = "";
    dflash_ckpt_unacked u[DFLASH_CKPT_MAX_UNACKED];
    int n = -1;
    if (dflash_ckpt_latest(r->ckpt, path, sizeof path) != 0 ||
        dflash_ckpt_unacked_batches(path, u, DFLASH_CKPT_MAX_UNACKED, &n, err, sizeof err) != 0) {
        printf("%s: no checkpoint's unacked batches: %s\n", r->name, err);
        return -1;
    }
    return n;
}

/* BROKER_STOPS: the target stopped first (it leaves: nothing of its pool in flight), then broker
 * and drafter (frozen holding a batch) at the same moment. Both exit 0: the broker once its stop
 * settled, the drafter with its ack and its final checkpoint's report answered, so no batch goes
 * into the checkpoint unacked. The broker started alone on the journal then has every batch up to
 * the checkpoint's step committed (one per step, the frozen one included), nothing in flight. */
static void stop_gracefully(run *r)
{
    h_signal(r->t, SIGTERM);
    CHECK_EQ_INT(h_wait_exit(r->t, 30000), 0);
    r->t = -1;
    h_signal(r->q, SIGTERM);
    h_signal(r->d, SIGTERM);
    h_signal(r->d, SIGCONT);
    CHECK_EQ_INT(h_wait_exit(r->d, 30000), 0);
    r->d = -1;
    CHECK_EQ_INT(h_wait_exit(r->q, 60000), 0);
    r->q = -1;
    CHECK(h_wait_text(r->qlog, "stop: all settled", 0) ||
          h_wait_text(r->qlog, "stop: nothing in progress", 0));
    CHECK(!h_wait_text(r->dlog, "goes into the final checkpoint but", 0));
    CHECK(h_wait_text(r->dlog, "reported the final checkpoint", 0));
    CHECK_EQ_INT(checkpoint_unacked(r), 0);
    long step = newest_step(r->ckpt);
    start_queue(r);
    wire_status s;
    CHECK_EQ_INT(h_print_ledger(r->ep, r->name, &s), 0);
    printf("%s: after the stop, checkpoint step %ld, ledger committed %llu at step %llu\n",
           r->name, step, (unsigned long long)s.batches_committed,
           (unsigned long long)s.committed_step);
    CHECK(step > 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_trained, 0);
    CHECK_EQ_INT(s.batches_committed, step); /* one batch per step, each once */
    CHECK_EQ_INT(s.committed_step, step);
    CHECK_EQ_INT(h_stop(r->q), 0);
    r->q = -1;
}

/* The first run, stopped with the batch in training unacked (BROKER_STOPS: acked). false when it
 * could not be set up (the processes are left for the caller to kill). */
static bool first_run(run *r, broker_end end)
{
    start_queue(r);
    start_target(r);
    start_drafter(r);
    CHECK(r->q > 0 && r->t > 0 && r->d > 0);
    if (r->q <= 0 || r->t <= 0 || r->d <= 0) return false;
    wire_status s = {0};
    uint64_t until = h_now_ms() + 60000;
    /* a few acks in, early: the whole run (48 batches) can take 0.2 s, and the drafter must
     * still be training when freeze_holding tries (it once missed every try: the run ended) */
    while (h_now_ms() < until && (h_broker_status(r->ep, &s) != 0 || s.acks < 3)) h_sleep_ms(2);
    CHECK(s.acks >= 3);

    /* the stop: the broker gone before it answers the ack of the batch in training */
    uint64_t acks = 0;
    bool frozen = freeze_holding(r, &acks);
    CHECK(frozen);
    if (!frozen) return false;
    if (end == BROKER_STOPS) {
        stop_gracefully(r);
        printf("%s: stopped at step %ld\n", r->name, newest_step(r->ckpt));
        return true;
    }
    h_signal(r->q, SIGSTOP);
    h_signal(r->d, SIGTERM);
    h_signal(r->d, SIGCONT);
    CHECK_EQ_INT(h_wait_exit(r->d, 30000), 0);
    r->d = -1;
    CHECK(h_wait_text(r->dlog, r->group ? "goes into the final checkpoint but no broker took it"
                                        : "goes into the final checkpoint but is not acked", 0));
    h_signal(r->t, SIGTERM);
    CHECK_EQ_INT(h_wait_exit(r->t, 30000), 0);
    r->t = -1;
    if (end == BROKER_LOST) {
        h_kill(r->q, SIGKILL);
    } else {
        h_signal(r->q, SIGCONT);
        until = h_now_ms() + 10000;
        while (h_now_ms() < until && (h_broker_status(r->ep, &s) != 0 || s.acks != acks + 1))
            h_sleep_ms(20);
        CHECK_EQ_INT(s.acks, acks + 1); /* the frozen ack landed; its reply went nowhere */
        CHECK_EQ_INT(h_stop(r->q), 0);
    }
    r->q = -1;
    printf("%s: stopped at step %ld\n", r->name, newest_step(r->ckpt));
    return true;
}

/* The same commands again, until the broker has no batch left; then the checks. BACK_LATE: the
 * target first, once the broker has given the batches in flight before its restart back to
 * to-do, and the drafter once the target has filled its slots (the first of them with the
 * unacked batch, the lowest to do): the late ack finds it in a ready slot, which must not be
 * granted (trained twice). */
static void second_run(run *r, drafter_back back)
{
    start_queue(r);
    if (back == BACK_LATE)
        CHECK(h_wait_text(r->qlog, "batches in flight before the restart went back to to-do",
                          30000));
    start_target(r);
    wire_status s = {0};
    uint64_t until = h_now_ms() + 30000;
    while (back == BACK_LATE && h_now_ms() < until &&
           (h_broker_status(r->ep, &s) != 0 || s.buckets[0].ready < 4))
        h_sleep_ms(20);
    start_drafter(r);
    CHECK_EQ_INT(h_wait_exit(r->d, 120000), 0);
    r->d = -1;
    /* the checkpoint's unacked batch acked (BROKER_STOPS: none recorded, none acked) */
    CHECK_EQ_INT(h_wait_text(r->dlog, "of the checkpoint we resumed from", 0),
                 r->end != BROKER_STOPS);
    if (back == BACK_LATE) CHECK(h_wait_text(r->qlog, "held it again: the slot goes back", 0));
    CHECK_EQ_INT(h_print_ledger(r->ep, r->name, &s), 0);
    long final = newest_step(r->ckpt);
    uint64_t planned = EPOCHS * s.batches_total; /* batches_total: one epoch's */
    printf("%s: final checkpoint step %ld, ledger trained %llu + committed %llu of %llu, "
           "committed step %llu\n", r->name, final, (unsigned long long)s.batches_trained,
           (unsigned long long)s.batches_committed, (unsigned long long)planned,
           (unsigned long long)s.committed_step);
    CHECK(planned > 0);
    CHECK_EQ_INT(s.batches_todo, 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_committed, planned);
    CHECK_EQ_INT(final, planned); /* one batch per step, none twice */
    CHECK_EQ_INT(s.committed_step, final);
}

static void stop_together(const char *name, const char *group, broker_end end,
                          drafter_back back)
{
    run r = {.name = name, .group = group, .end = end, .q = -1, .t = -1, .d = -1};
    path_in(r.rt, sizeof r.rt, name, "run");
    mkdir(r.rt, 0700);
    h_queue_endpoint(r.rt, r.ep, sizeof r.ep);
    snprintf(r.rtflag, sizeof r.rtflag, "--runtime-dir=%s", r.rt);
    snprintf(r.journal, sizeof r.journal, "--journal=%s/%s.journal", dir, name);
    path_in(r.ckpt, sizeof r.ckpt, name, "ckpt");
    path_in(r.qlog, sizeof r.qlog, name, "queue.log");
    path_in(r.tlog, sizeof r.tlog, name, "target.log");
    path_in(r.dlog, sizeof r.dlog, name, "drafter.log");
    if (first_run(&r, end)) second_run(&r, back);
    /* pids already reaped are -1: h_kill skips them (kill(-1, ...) would signal everyone) */
    if (r.d > 0) h_signal(r.d, SIGCONT);
    h_kill(r.d, SIGKILL);
    h_kill(r.t, SIGKILL);
    if (r.q > 0) h_signal(r.q, SIGCONT);
    if (r.q > 0) CHECK_EQ_INT(h_stop(r.q), 0);
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: itest_stop_together QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    queue_bin = argv[1];
    target_bin = argv[3];
    drafter_bin = argv[4];
    h_tempdir(dir, sizeof dir);
    CHECK_EQ_INT(h_make_training_set(argv[5], argv[6], argv[7], dir, model, shard), 0);
    if (check_failed) CHECK_DONE();

    stop_together("stops", NULL, BROKER_STOPS, BACK_AT_ONCE);
    stop_together("group-stops", "g", BROKER_STOPS, BACK_AT_ONCE);
    stop_together("lost", NULL, BROKER_LOST, BACK_AT_ONCE);
    stop_together("landed", NULL, BROKER_LANDED, BACK_AT_ONCE);
    stop_together("group", "g", BROKER_LOST, BACK_AT_ONCE);
    stop_together("late", NULL, BROKER_LOST, BACK_LATE);

    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
