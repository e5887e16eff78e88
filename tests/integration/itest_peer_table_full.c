/* itest_peer_table_full: a daemon that a full broker keeps out says so. The broker answers a
 * hello past --max-peers with "try again ... the peer table is full"; dflash-target and
 * dflash-drafter retried it like a silent broker and, at --broker-wait-ms, exited 1 saying "no
 * broker answered ... is dflash-queue running?" (a review's finding: the broker was running, and
 * had said why). Now they name the broker's answer.
 *
 * The real dflash-queue with --max-peers 2 and two synthetic targets (the table full), in a
 * temp dir; then a third target and a drafter (--verify), each with --broker-wait-ms 1500:
 * each exits 1 within 10 s, its log saying "did not take our hello" and "peer table is full",
 * and not "no broker answered". Then a target kept out after it had registered once (expired,
 * the table full) waits as long as it takes, past its --broker-wait-ms, and registers again once
 * a place frees. Usage: itest_peer_table_full QUEUE TARGET DRAFTER. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

/* Whether log holds "did not take our hello" and the broker's reason, and not the silent
 * broker's line. */
static bool says_full(const char *log)
{
    return h_wait_text(log, "did not take our hello", 2000) &&
           h_wait_text(log, "peer table is full", 0) && !h_wait_text(log, "no broker answered", 0);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: itest_peer_table_full QUEUE TARGET DRAFTER\n");
        return 2;
    }
    char dir[64], ep[128], rt[128], tlog[128], dlog[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(tlog, sizeof tlog, "%s/t3.log", dir);
    snprintf(dlog, sizeof dlog, "%s/d.log", dir);
    const char *more[] = {"--max-peers=2", NULL};
    pid_t q = h_start_small_queue(argv[1], dir, more);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    pid_t t1 = h_start_small_target(argv[2], dir, "t1", 20000, 1000);
    pid_t t2 = h_start_small_target(argv[2], dir, "t2", 20000, 1000);
    wire_status s = {0};
    bool full = false;
    for (uint64_t end = h_now_ms() + 20000; !full && h_now_ms() < end; h_sleep_ms(50))
        full = h_broker_status(ep, &s) == 0 && s.peers >= 2;
    CHECK(full);

    char *tv[] = {argv[2], rt, "--name=t3", "--model=synthetic", "--slots=2",
                  "--token-budget=256", "--max-seqs=4", "--hidden=8", "--layers=2",
                  "--buckets=64,256", "--backend=host", "--timeout-ms=500",
                  "--broker-wait-ms=1500", "--progress-ms=0", NULL};
    CHECK_EQ_INT(h_wait_exit(h_spawn_logged(tv, tlog), 10000), 1);
    CHECK(says_full(tlog));
    char *dv[] = {argv[3], rt, "--verify", "--backend=host", "--name=d", "--hidden=8",
                  "--layers=2", "--token-budget=256", "--max-seqs=4", "--buckets=64,256",
                  "--progress-ms=0", "--timeout-ms=500", "--broker-wait-ms=1500", NULL};
    CHECK_EQ_INT(h_wait_exit(h_spawn_logged(dv, dlog), 10000), 1);
    CHECK(says_full(dlog));

    /* A target that registered once and is kept out later (expired while stopped, its place
     * taken, the table full) waits for a place as long as it takes: --broker-wait-ms is for the
     * first registration only. t2 leaves; t5 (--broker-wait-ms 1000) takes its place; t5 is
     * SIGSTOPped until the broker expired it and t6 took the place; past t5's --broker-wait-ms
     * since its registration it gets SIGCONT: it asks again and again (the broker counts 10
     * more refused hellos) and is still running; once t6 leaves, t5 registers again. */
    CHECK_EQ_INT(h_stop(t2), 0);
    char t5log[128], t6log[128];
    snprintf(t5log, sizeof t5log, "%s/t5.log", dir);
    snprintf(t6log, sizeof t6log, "%s/t6.log", dir);
    char *t5v[] = {argv[2], rt, "--name=t5", "--model=synthetic", "--slots=2",
                   "--token-budget=256", "--max-seqs=4", "--hidden=8", "--layers=2",
                   "--buckets=64,256", "--batches-per-bucket=20000", "--backend=host",
                   "--timeout-ms=500", "--broker-wait-ms=1000", "--progress-ms=0",
                   "--log-level=info", NULL}; /* the plan of t1 and t2 */
    pid_t t5 = h_spawn_logged(t5v, t5log);
    CHECK(h_wait_text(t5log, "registered pool", 20000));
    uint64_t registered = h_now_ms();
    h_signal(t5, SIGSTOP);
    char *t6v[] = {argv[2], rt, "--name=t6", "--model=synthetic", "--slots=2",
                   "--token-budget=256", "--max-seqs=4", "--hidden=8", "--layers=2",
                   "--buckets=64,256", "--batches-per-bucket=20000", "--backend=host",
                   "--timeout-ms=500", "--progress-ms=0", "--log-level=info", NULL};
    pid_t t6 = h_spawn_logged(t6v, t6log);
    CHECK(h_wait_text(t6log, "registered pool", 20000)); /* t5 expired: t6 in its place */
    while (h_now_ms() < registered + 1500) h_sleep_ms(20); /* past t5's --broker-wait-ms */
    CHECK_EQ_INT(h_broker_status(ep, &s), 0);
    uint64_t refused = s.hellos_refused_full;
    h_signal(t5, SIGCONT);
    CHECK(h_wait_text(t5log, "registering again", 10000));
    bool kept_asking = false, exited = false;
    for (uint64_t end = h_now_ms() + 20000; !kept_asking && !exited && h_now_ms() < end;
         h_sleep_ms(50)) {
        exited = waitpid(t5, NULL, WNOHANG) == t5;
        kept_asking = h_broker_status(ep, &s) == 0 && s.hellos_refused_full >= refused + 10;
    }
    printf("t5 kept out: %llu hellos refused, %s\n",
           (unsigned long long)(s.hellos_refused_full - refused), exited ? "exited" : "running");
    CHECK(kept_asking);
    CHECK(!exited && waitpid(t5, NULL, WNOHANG) == 0);
    CHECK(!h_wait_text(t5log, "did not take our hello", 0));
    struct stat st5;
    size_t from = stat(t5log, &st5) == 0 ? (size_t)st5.st_size : 0;
    CHECK_EQ_INT(h_stop(t6), 0);
    CHECK(h_wait_text_from(t5log, from, "registered pool", 20000));
    CHECK_EQ_INT(h_stop(t5), 0);

    CHECK_EQ_INT(h_stop(t1), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    if (check_failed) fprintf(stderr, "logs kept in %s\n", dir);
    else h_rmdir(dir);
    CHECK_DONE();
}
