/* itest_target_leave: a target stopped (SIGTERM) while the broker serves leaves at once and
 * cleanly. It used to leave the loop and remove its pool without a word: the broker kept the pool
 * registered until it expired the target (liveness x heartbeat, 3 s here), granted its ready
 * slots meanwhile (from memory that was gone: a drafter that had closed its mapping of the
 * removed segment could not copy them, "cannot copy slot", given back unread; on cuda every
 * such copy fails), a drafter's copy in progress read memory being freed, and the plan still
 * counted the gone target. (Without the fix this test saw the target exit at once, and the
 * status right after still showed its 3 slots and 3 peers.)
 *
 * The real dflash-queue (heartbeat 1000 ms, liveness 3: an expiry would take 3 s) and
 * dflash-target (--model synthetic, host pool of 3 slots, max-depth 3, 2 buckets of 8 batches,
 * one epoch) run in a temp dir, with their logs. A raw drafter client, the holder, claims one
 * slot and keeps its lease (heartbeating) as a drafter in the middle of its copy would; the
 * drafter's worker loop (this process, a thread; 30 ms a batch, so the target's two other slots
 * are ready most of the time; one copy failure ends it) trains the rest. Once it has trained 3
 * batches the target gets SIGTERM. Checks:
 *   - the target says it leaves with slots being copied and waits: it is still running, while
 *     the broker's status shows its pool gone at once (no slots, no pool incarnation) and the
 *     broker says "target t leaving";
 *   - the holder releases: the target exits 0 within 3 s; the broker then counts the 2 drafters
 *     as its peers (the target's session ended with its leave, not after an expiry);
 *   - the drafter's loop still runs (a copy failure would have ended it) and waits for a
 *     target; the holder acks its batch;
 *   - a target started again registers a new pool incarnation; the drafter trains every other
 *     batch (what was ready in the first pool went back to to-do) and ends when all 16 are
 *     trained: 15 consumed + the holder's 1, 16 acks, none to do or in flight;
 *   - with the broker gone (SIGKILL), a SIGTERMed target exits 0 within 2 x --timeout-ms and
 *     a second (it does not wait for an answer that cannot come); one that has already seen
 *     the broker silent (its "waiting for the broker to come back") exits 0 without sending a
 *     leave at all; one whose broker hangs (SIGSTOP) while it fills a slot (--rate 0.5) exits 0
 *     after the fill and one unanswered SlotReady, without a leave (it tried three times and
 *     then left: 4 x --timeout-ms).
 * Usage: itest_target_leave QUEUE CTL TARGET. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "heartbeat.h"
#include "slot.h"
#include "counting_worker.h"

#include <pthread.h>
#include <signal.h>

#define BATCHES_PER_BUCKET 8
#define TOTAL_BATCHES (2 * BATCHES_PER_BUCKET)
#define TARGET_TIMEOUT_MS 1000

static char dir[64], ep[128];
static const char *target_bin;

/* A synthetic host-backend target "t" (3 slots of H_SMALL_LAYOUT, buckets 64 and 256) logging at
 * info to log, filling rate batches a second (0: at once). */
static pid_t start_target(const char *log, double rate)
{
    char rt[128], bpb[64], to[64];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(bpb, sizeof bpb, "--batches-per-bucket=%d", BATCHES_PER_BUCKET);
    snprintf(to, sizeof to, "--timeout-ms=%d", TARGET_TIMEOUT_MS);
    char pace[64];
    snprintf(pace, sizeof pace, "--rate=%g", rate);
    char *argv[] = {(char *)target_bin, rt, "--name=t", "--model=synthetic", "--slots=3",
                    "--token-budget=256", "--max-seqs=4", "--hidden=8", "--layers=2",
                    "--buckets=64,256", bpb, "--backend=host", to, "--progress-ms=0",
                    "--log-level=info", pace, NULL};
    return h_spawn_logged(argv, log);
}

/* Waits up to ms for text in the log at path while process pid runs: true when it appeared with
 * pid still running; false when pid exited first (reaped: its exit status in *status) or the
 * time ran out. */
static bool wait_text_or_exit(const char *path, const char *text, pid_t pid, int ms, int *status)
{
    for (uint64_t end = h_now_ms() + (uint64_t)ms;; h_sleep_ms(20)) {
        int st = 0;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            return false;
        }
        if (h_wait_text(path, text, 0)) return true;
        if (h_now_ms() >= end) return false;
    }
}

/* SIGTERM to target pid; its exit status into *status (15 s at most), said with what; returns
 * the milliseconds it took. */
static uint64_t term_and_time(pid_t pid, int *status, const char *what)
{
    uint64_t t0 = h_now_ms();
    h_signal(pid, SIGTERM);
    *status = h_wait_exit(pid, 15000);
    uint64_t took = h_now_ms() - t0;
    printf("target %s: exit %d after %llu ms\n", what, *status, (unsigned long long)took);
    return took;
}

static uint64_t first_pool; /* the first target's pool incarnation */
static bool other_pool_registered(const wire_status *s)
{
    return s->slot_count > 0 && s->pool_incarnation != first_pool;
}
static bool ready_slot(const wire_status *s) { return h_ready_slots(s) > 0; }

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    target_bin = argv[3];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    char qlog[128], tlog[128], t2log[128], journal[128], rt[128];
    snprintf(qlog, sizeof qlog, "%s/queue.log", dir);
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    snprintf(t2log, sizeof t2log, "%s/target2.log", dir);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    char *q[] = {argv[1], rt, journal, "--min-ready=1", "--max-depth=3", "--heartbeat-ms=1000",
                 "--liveness=3", "--lease-timeout-ms=10000", "--stats-interval-ms=0",
                 "--log-level=info", NULL};
    pid_t qp = h_spawn_logged(q, qlog);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    pid_t target = start_target(tlog, 0);
    CHECK(target > 0);

    int rc;
    client *c = h_client(ep, WIRE_ROLE_CTL, "check", 20, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_status s = {0};
    CHECK(h_status_until(c, &s, ready_slot, 30000));
    first_pool = s.pool_incarnation;

    /* the holder: one lease kept, as a drafter's copy in progress */
    client *holder = client_new(ep, WIRE_ROLE_DRAFTER, "holder");
    client_set_timeout(holder, 1000);
    CHECK_EQ_INT(client_hello(holder, NULL, 0), 0);
    heartbeat *hb = heartbeat_start(holder, 0, "the holder");
    wire_grant held = {0};
    rc = DFLASH_EAGAIN;
    for (uint64_t end = h_now_ms() + 10000; rc && h_now_ms() < end; h_sleep_ms(10))
        rc = client_claim(holder, &held);
    CHECK_EQ_INT(rc, 0);

    counting_worker k = {.lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                                .timeout_ms = 1000, .max_copy_failures = 1,
                                .exit_when_drained = true},
                         .step_ms = 30};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &k.lc.layout), 0);
    pthread_t th;
    CHECK_EQ_INT(counting_worker_start(&k, &th), 0);
    for (uint64_t end = h_now_ms() + 30000; k.consumed < 3 && !k.ended && h_now_ms() < end;)
        h_sleep_ms(5);
    CHECK(k.consumed >= 3);

    /* SIGTERM: the target leaves, waiting for the holder's copy */
    h_signal(target, SIGTERM);
    int status = -1;
    bool waits = wait_text_or_exit(tlog, "being copied: waiting for the copies", target, 5000,
                                   &status);
    CHECK_EQ_INT(client_status(c, &s), 0);
    printf("after the SIGTERM: target %s; broker: %u slots, pool %016llx, %u peers\n",
           waits ? "waits for the copy" : status >= 0 ? "exited" : "silent", s.slot_count,
           (unsigned long long)s.pool_incarnation, s.peers);
    CHECK(waits); /* still up: its memory is being read */
    CHECK_EQ_INT(s.slot_count, 0); /* its pool is gone at once: nothing more granted from it */
    CHECK_EQ_INT(s.pool_incarnation, 0);
    CHECK(h_wait_text(qlog, "target t leaving:", 2000));

    uint64_t t0 = h_now_ms();
    CHECK_EQ_INT(client_release(holder, held.lease_id), 0);
    if (waits) status = h_wait_exit(target, 3000);
    uint64_t took = h_now_ms() - t0;
    printf("target exit %d, %llu ms after the last copy was released\n", status,
           (unsigned long long)took);
    CHECK_EQ_INT(status, 0);
    CHECK_EQ_INT(client_status(c, &s), 0);
    CHECK_EQ_INT(s.peers, 2); /* the drafter and the holder: the target left, not expired */
    CHECK_EQ_INT(s.slot_count, 0);
    CHECK(!k.ended); /* no copy failure: it waits for a target */
    CHECK_EQ_INT(client_ack(holder, &held.unit, 1000), 0);
    printf("before the restart: %d trained by the drafter, ledger to-do %llu, in flight %llu, "
           "trained %llu\n", k.consumed, (unsigned long long)s.batches_todo,
           (unsigned long long)s.batches_inflight, (unsigned long long)s.batches_trained);

    /* a new target: a new pool incarnation; the rest is trained, each batch once */
    pid_t target2 = start_target(t2log, 0);
    CHECK(h_status_until(c, &s, other_pool_registered, 30000));
    CHECK(counting_worker_join(&k, th, 60000));
    CHECK_EQ_INT(k.rc, 0); /* a copy failure would end it with DFLASH_EPEER */
    CHECK_EQ_INT(client_status(c, &s), 0);
    printf("drafter trained %d, holder 1; ledger: %llu trained, %llu committed, %llu in flight, "
           "%llu to do, %llu acks\n", k.consumed, (unsigned long long)s.batches_trained,
           (unsigned long long)s.batches_committed, (unsigned long long)s.batches_inflight,
           (unsigned long long)s.batches_todo, (unsigned long long)s.acks);
    CHECK_EQ_INT(k.consumed + 1, TOTAL_BATCHES);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, TOTAL_BATCHES);
    CHECK_EQ_INT(s.acks, TOTAL_BATCHES);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK_EQ_INT(s.batches_todo, 0);

    /* the broker gone: the target does not wait for it */
    heartbeat_stop(&hb);
    client_destroy(&holder);
    client_destroy(&c);
    h_kill(qp, SIGKILL);
    took = term_and_time(target2, &status, "with the broker gone");
    CHECK_EQ_INT(status, 0);
    CHECK(took <= 2 * TARGET_TIMEOUT_MS + 1000);

    /* a target that already knows the broker silent does not try to leave at all (no request
     * that can only time out): a third target, the broker killed under it once registered */
    char t3log[128], q3log[128], journal3[128];
    snprintf(t3log, sizeof t3log, "%s/target3.log", dir);
    snprintf(q3log, sizeof q3log, "%s/queue3.log", dir);
    snprintf(journal3, sizeof journal3, "--journal=%s/queue3.journal", dir); /* a new run */
    q[2] = journal3;
    qp = h_spawn_logged(q, q3log);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    pid_t target3 = start_target(t3log, 0);
    CHECK(h_wait_text(t3log, "registered pool", 30000));
    h_kill(qp, SIGKILL);
    CHECK(h_wait_text(t3log, "waiting for the broker to come back", 10000));
    h_signal(target3, SIGTERM);
    status = h_wait_exit(target3, 10000);
    CHECK_EQ_INT(status, 0);
    CHECK(!h_wait_text(t3log, "our leave", 0)); /* no "no answer to our leave" */

    /* a broker that stops answering while the target fills a slot (SIGSTOP: a hung host): a
     * SIGTERM then costs one unanswered SlotReady, not three and a leave (4 s here), and no
     * leave is sent to a broker that did not answer. A fourth target, one fill every 2 s (the
     * first at once): the broker is stopped 1 s into the second fill. */
    char t4log[128], q4log[128], journal4[128];
    snprintf(t4log, sizeof t4log, "%s/target4.log", dir);
    snprintf(q4log, sizeof q4log, "%s/queue4.log", dir);
    snprintf(journal4, sizeof journal4, "--journal=%s/queue4.journal", dir);
    q[2] = journal4;
    qp = h_spawn_logged(q, q4log);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    pid_t target4 = start_target(t4log, 0.5);
    CHECK(h_wait_text(t4log, "registered pool", 30000));
    h_sleep_ms(1000);
    h_signal(qp, SIGSTOP);
    took = term_and_time(target4, &status, "stopped while its broker hangs");
    CHECK_EQ_INT(status, 0);
    CHECK(took <= 1000 + TARGET_TIMEOUT_MS + 1500); /* the fill's rest, one try, slack */
    CHECK(!h_wait_text(t4log, "our leave", 0));
    h_kill(qp, SIGKILL);

    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
