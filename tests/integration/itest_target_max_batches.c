/* itest_target_max_batches: dflash-target --max-batches N stops by itself after N batches
 * published (SlotReady accepted), and leaves the broker as a stop by signal does (target_leave.h:
 * its pool is dropped at once, its ready batches go back to to-do, its session ends without an
 * expiry). No other test ran the target's --max-batches: a loop that never counted its batches
 * (it never stopped), stopped one batch late, or exited without leaving passed them all.
 *
 * The real dflash-queue (max-depth 4 so nothing but --max-batches stops the target: no drafter;
 * heartbeat 1000 ms, liveness 3: an expiry would take 3 s) and dflash-target (--model synthetic,
 * host pool of 4 slots, 2 buckets of 8 batches, --max-batches 3) run in a temp dir with their
 * logs. Checks: the target exits 0 by itself; its summary line counts 3 batches; the broker
 * counted exactly 3 produced; right after the exit the broker has no pool, no peer, and all 16
 * batches to do (the 3 ready ones given back), and its log says the target left.
 * Usage: itest_target_max_batches QUEUE CTL TARGET. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"

#define BATCHES_PER_BUCKET 8
#define TOTAL_BATCHES (2 * BATCHES_PER_BUCKET)
#define MAX_BATCHES 3

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    char dir[64], ep[128], qlog[128], tlog[128], journal[128], rt[128], bpb[64], mb[64];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(qlog, sizeof qlog, "%s/queue.log", dir);
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(bpb, sizeof bpb, "--batches-per-bucket=%d", BATCHES_PER_BUCKET);
    snprintf(mb, sizeof mb, "--max-batches=%d", MAX_BATCHES);
    char *q[] = {argv[1], rt, journal, "--min-ready=1", "--max-depth=4", "--heartbeat-ms=1000",
                 "--liveness=3", "--lease-timeout-ms=10000", "--stats-interval-ms=0",
                 "--log-level=info", NULL};
    pid_t qp = h_spawn_logged(q, qlog);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    char *t[] = {argv[3], rt, "--name=t", "--model=synthetic", "--slots=4", "--token-budget=256",
                 "--max-seqs=4", "--hidden=8", "--layers=2", "--buckets=64,256", bpb,
                 "--backend=host", "--timeout-ms=1000", "--progress-ms=0", mb,
                 "--log-level=info", NULL};
    pid_t target = h_spawn_logged(t, tlog);
    CHECK(target > 0);

    int status = h_wait_exit(target, 30000);
    printf("target exit %d\n", status);
    CHECK_EQ_INT(status, 0); /* stopped by itself */
    int rc;
    client *c = h_client(ep, WIRE_ROLE_CTL, "check", 20, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_status s = {0};
    CHECK_EQ_INT(client_status(c, &s), 0);
    uint64_t produced = 0;
    for (uint32_t b = 0; b < s.n_buckets; b++) produced += s.buckets[b].produced;
    printf("broker: %llu produced, %u slots, %u peers, %llu to do\n",
           (unsigned long long)produced, s.slot_count, s.peers,
           (unsigned long long)s.batches_todo);
    CHECK_EQ_INT(produced, MAX_BATCHES);
    CHECK(h_wait_text(tlog, ": 3 batches,", 0)); /* the exit summary */
    CHECK_EQ_INT(s.slot_count, 0); /* it left: the pool dropped, not kept until an expiry */
    CHECK_EQ_INT(s.peers, 0);
    CHECK_EQ_INT(s.batches_todo, TOTAL_BATCHES); /* its ready batches went back to to-do */
    CHECK(h_wait_text(qlog, "target t leaving:", 2000));

    client_destroy(&c);
    h_kill(qp, SIGKILL);
    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
