/* itest_plan_identity: a target restarted on a running journal with another plan is refused.
 *
 * A target restarted with another --seed, or with other data of the same shape (the same
 * batches per bucket), used to be accepted silently: the ledger's marks then named batches of
 * another plan, trained twice or never. Now the broker compares the plan's identity (seed,
 * buckets, data: batch_plan_identity) with the journal's: such a target exits 2 naming both,
 * the journal untouched; the run's own seed and shards are accepted (a restart works as before),
 * also after a broker restart, whose journal kept the identity. The synthetic target's plan
 * (its layout, buckets and --vocab-size: the batches it makes) is checked the same way.
 *
 * Setup (in a temp dir): a tiny random Qwen3 target (dflash-mkmodel); two shards written here of
 * 64 sequences with the same lengths (16 batches of 4 per epoch) and other tokens; dflash-queue
 * with a journal; dflash-target (no drafter: the broker hands it work up to max-depth).
 * Usage: itest_plan_identity QUEUE CTL TARGET MKMODEL. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "shard.h"
#include "test_files.h"

#include <sys/stat.h>

static char dir[64], rt[128], ep[128], model[128], tlog[128];
static const char *target_bin;

/* 64 sequences of lengths 8..31 with tokens of the given multiplier (ids < 200). */
static int write_shard(const char *path, int mul)
{
    shard_writer *w = shard_writer_new(path, 0);
    if (!w) return -1;
    for (int i = 0; i < 64; i++) {
        int32_t ids[32];
        uint8_t mask[32];
        uint32_t len = 8 + (uint32_t)(i * 5) % 24;
        for (uint32_t p = 0; p < len; p++) {
            ids[p] = (int32_t)((i * mul + (int)p * 3 + 1) % 200);
            mask[p] = p >= 2;
        }
        if (shard_writer_add(w, ids, mask, len)) return -1;
    }
    int rc = shard_writer_commit(w);
    shard_writer_destroy(&w);
    return rc;
}

/* The run's target on shard with --seed seed, or (shard NULL) the synthetic target making
 * token ids below vocab (--vocab-size: the data it makes, so part of its plan). */
static pid_t start_target(const char *shard, const char *seed, const char *vocab)
{
    char *t[] = {(char *)target_bin, "--name", "tgt", "--slots", "2", "--epochs", "5",
                 "--buckets", "32", "--token-budget", "128", "--max-seqs", "4", "--layers", "3",
                 "--runtime-dir", rt, "--threads", "1", "--backend", "host", "--timeout-ms",
                 "1000", "--broker-wait-ms", "10000", "--progress-ms", "0", "--model", model,
                 "--shards", (char *)shard, "--seed", (char *)seed, NULL};
    if (!shard) { /* the same slots, the synthetic model */
        int at = 0;
        while (strcmp(t[at], "--model") != 0) at++;
        t[at + 1] = "synthetic";
        t[at + 2] = "--vocab-size";
        t[at + 3] = (char *)vocab;
        t[at + 4] = NULL;
    }
    return h_spawn_logged(t, tlog);
}

/* Starts a target that must be refused: exit 2, its log naming the mismatch, the journal (the
 * ledger) byte for byte as it was. */
static void expect_refused(const char *shard, const char *seed, const char *vocab,
                           const char *journal)
{
    size_t n0 = 0, n1 = 0;
    char *j0 = test_slurp(journal, &n0);
    truncate(tlog, 0);
    int rc = h_wait_exit(start_target(shard, seed, vocab), 60000);
    printf("target with %s, seed %s, vocab %s: exit %d\n", shard ? shard : "synthetic",
           seed ? seed : "-", vocab ? vocab : "-", rc);
    CHECK_EQ_INT(rc, 2);
    char *l = test_slurp(tlog, NULL);
    CHECK(l && strstr(l, "differs from the journal's"));
    CHECK(l && strstr(l, "start a new run on a new --journal"));
    if (rc != 2 && l) fprintf(stderr, "target log:\n%s\n", l);
    free(l);
    char *j1 = test_slurp(journal, &n1);
    CHECK(j0 && j1 && n0 == n1 && memcmp(j0, j1, n0) == 0);
    free(j0);
    free(j1);
}

static pid_t start_queue(const char *qbin, const char *journal, const char *qlog)
{
    char rtflag[160];
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    char *q[] = {(char *)qbin, rtflag, "--journal", (char *)journal, "--min-ready", "1",
                 "--max-depth", "2", "--heartbeat-ms", "200", "--liveness", "2", NULL};
    pid_t qp = h_spawn_logged(q, qlog);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    return qp;
}

/* Starts the run's target and waits until the broker registered its pool and handed it work,
 * then stops it (SIGTERM: exit 0) and waits until the broker has no batch in flight. */
static void run_accepted(const char *shard, const char *vocab, const char *qlog,
                         int registrations)
{
    truncate(tlog, 0);
    pid_t tp = start_target(shard, "0", vocab);
    CHECK(h_wait_text(tlog, "registered pool", 60000));
    wire_status s = {0};
    uint64_t end = h_now_ms() + 30000;
    while (h_now_ms() < end && (h_broker_status(ep, &s) != 0 || s.batches_inflight == 0))
        h_sleep_ms(50);
    CHECK(s.batches_inflight > 0);
    h_signal(tp, SIGTERM);
    CHECK_EQ_INT(h_wait_exit(tp, 30000), 0);
    end = h_now_ms() + 30000;
    while (h_now_ms() < end && (h_broker_status(ep, &s) != 0 || s.batches_inflight != 0))
        h_sleep_ms(50);
    CHECK_EQ_INT(s.batches_inflight, 0);
    char *l = test_slurp(qlog, NULL);
    int n = 0;
    for (const char *p = l; p && (p = strstr(p, "pool 0 of tgt: incarnation")); p++) n++;
    CHECK_EQ_INT(n, registrations);
    free(l);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: itest_plan_identity QUEUE CTL TARGET MKMODEL\n");
        return 2;
    }
    target_bin = argv[3];
    h_run_dirs(dir, rt, ep);
    char tools_log[128], a[128], b[128], journal[128], qlog[128];
    snprintf(tools_log, sizeof tools_log, "%s/tools.log", dir);
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(a, sizeof a, "%s/a.shard", dir);
    snprintf(b, sizeof b, "%s/b.shard", dir);
    snprintf(journal, sizeof journal, "%s/queue.journal", dir);
    snprintf(qlog, sizeof qlog, "%s/queue.log", dir);
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    char *mk[] = {argv[4], "--family", "qwen3", "--layers", "6", "--vocab", "256", "--seed", "3",
                  "--out", model, NULL};
    pid_t mp = h_spawn_logged(mk, tools_log);
    int st = 0;
    CHECK(mp > 0 && waitpid(mp, &st, 0) == mp && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ_INT(write_shard(a, 7), 0);
    CHECK_EQ_INT(write_shard(b, 11), 0); /* the same lengths: the same batches per bucket */
    if (check_failed) CHECK_DONE();

    pid_t qp = start_queue(argv[1], journal, qlog);
    run_accepted(a, NULL, qlog, 1); /* the run: shards a, seed 0 */
    expect_refused(a, "5", NULL, journal); /* another --seed */
    expect_refused(b, "0", NULL, journal); /* other data of the same shape */
    CHECK(h_wait_text(qlog, "pool of tgt refused: its batch plan", 1000));
    run_accepted(a, NULL, qlog, 2); /* the run's own seed and shards: a restart works */

    /* the broker restarts: its journal kept the identity */
    h_signal(qp, SIGTERM);
    CHECK_EQ_INT(h_wait_exit(qp, 30000), 0);
    qp = start_queue(argv[1], journal, qlog);
    expect_refused(b, "0", NULL, journal);
    run_accepted(a, NULL, qlog, 3);
    h_signal(qp, SIGTERM);
    CHECK_EQ_INT(h_wait_exit(qp, 30000), 0);

    /* the synthetic target has a plan too: another --vocab-size makes other batches */
    char journal2[128], qlog2[128];
    snprintf(journal2, sizeof journal2, "%s/synthetic.journal", dir);
    snprintf(qlog2, sizeof qlog2, "%s/queue-synthetic.log", dir);
    qp = start_queue(argv[1], journal2, qlog2);
    run_accepted(NULL, "1000", qlog2, 1);
    expect_refused(NULL, NULL, "2000", journal2);
    run_accepted(NULL, "1000", qlog2, 2);
    h_signal(qp, SIGTERM);
    CHECK_EQ_INT(h_wait_exit(qp, 30000), 0);
    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
