/* itest_group_size: a data-parallel group waits for its --group-size ranks before it trains
 * (real broker, target and drafters; cpu backend, shm collective).
 *
 * Without the wait, the first rank to start formed the group alone and trained steps of one
 * batch until the others joined: a group's step is a batch per rank, so the first steps of a
 * run were smaller than asked for (scripts/train --drafters N starts its drafters together, a
 * few milliseconds apart).
 *
 * Setup (in a temp dir): the tiny training set of itest_group (96 sequences), planned with
 * --token-budget 80 --max-seqs 4 into 42 batches for one epoch; dflash-queue (journal, lease
 * 1.5 s, heartbeat 300 ms); the target, then drafters da and db with --group g --group-size 3
 * --group-wait-s 8 (a third rank never comes).
 *   1. da alone, with batches ready: it says it waits for the group's 3 ranks, and after a
 *      second nothing is trained (no ack, no batch trained);
 *   2. db joins (world 2): the two still wait, until --group-wait-s ends the wait: rank 0 says
 *      it goes on with 2 of the 3 ranks;
 *   3. the epoch is trained to its end: every group step of 2 batches (21 steps), none of 1;
 *      the plan's end ends both drafters with exit 0 (--exit-when-drained); the final
 *      checkpoint records the step as the group means it, of 3 ranks (--group-size), not the 2
 *      it had (a resume with the 3 would otherwise share a step of 2 batches among them);
 *   4. the rank holding that checkpoint, started again alone at the plan's end (--group-wait-s
 *      3), waits for its ranks as at any start: a join is answered "nothing left" only in a
 *      group that trained or had all its ranks (itest_group_restart and test_group_broker show
 *      that answer); then it goes on alone, hears the end from its claim, exits 0 and nothing
 *      is rewound; a drain then ends the target.
 * A dflash-drafter with --group-size and no --group is refused (exit 2).
 * Usage: itest_group_size QUEUE TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "dflash_ckpt.h"
#include "harness.h"
#include "test_files.h"

static char dir[64], ep[128], rt[128];
static const char *drafter_bin;

/* Drafter name of group g with --group-size 3 --group-wait-s wait_s; its log in
 * drafter-NAME.log. group NULL: the same without --group. */
static pid_t start_drafter_waiting(const char *name, const char *group, const char *wait_s,
                                   char *log, size_t log_len)
{
    char model[128], ckpt[128];
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, name);
    snprintf(log, log_len, "%s/drafter-%s.log", dir, name);
    const char *extra[] = {"--group-size", "3", "--group-wait-s", wait_s, "--comm", "shm",
                           "--comm-timeout-s", "5", "--timeout-ms", "1000", "--progress-ms", "300",
                           group ? "--group" : NULL, group, NULL};
    return h_start_training_drafter(drafter_bin, model, rt, name, ckpt, 80, extra, log);
}

static pid_t start_drafter(const char *name, const char *group, char *log, size_t log_len)
{
    return start_drafter_waiting(name, group, "8", log, log_len);
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: itest_group_size QUEUE TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    const char *queue_bin = argv[1], *target_bin = argv[2];
    drafter_bin = argv[3];
    h_run_dirs(dir, rt, ep);
    char model[128], shard[128], qlog[128], tlog[128], dalog[128], dblog[128],
        dclog[128];
    snprintf(qlog, sizeof qlog, "%s/queue.log", dir);
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    CHECK_EQ_INT(h_make_training_set(argv[4], argv[5], argv[6], dir, model, shard), 0);
    if (check_failed) CHECK_DONE();

    /* --group-size without --group: refused before anything starts */
    CHECK_EQ_INT(h_wait_exit(start_drafter("dc", NULL, dclog, sizeof dclog), 30000), 2);
    CHECK(h_wait_text(dclog, "--group-size 3 is the size of a --group", 0));

    pid_t qp = -1;
    client *c = h_start_group_broker(queue_bin, dir, rt, ep, NULL, &qp);
    CHECK(c != NULL);
    if (!c) CHECK_DONE();
    wire_status s;
    pid_t tp = h_start_training_target(target_bin, model, shard, rt, 1, 80, tlog);
    CHECK(h_wait_text(tlog, "registered pool", 30000));

    /* 1. da alone waits for the group's 3 ranks: nothing trained while batches are ready */
    pid_t da = start_drafter("da", "g", dalog, sizeof dalog);
    CHECK(h_wait_text(dalog, "1 of its 3 ranks (--group-size) have joined: waiting up to 8 s",
                      30000));
    CHECK(h_wait_text(dalog, "waiting for group g's 3 ranks (1 joined", 5000)); /* progress */
    h_sleep_ms(1000);
    CHECK(client_status(c, &s) == 0);
    uint32_t ready = h_ready_slots(&s);
    CHECK(s.batches_total == 42 && ready > 0);
    CHECK_EQ_INT(s.acks, 0);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 0);
    printf("phase 1: da alone waits for the group's 3 ranks, %u batches ready, none trained\n",
           ready);

    /* 2. db joins: world 2, still short of 3 until the wait ends */
    pid_t db = start_drafter("db", "g", dblog, sizeof dblog);
    CHECK(h_wait_group(c, "g", 2, 0, 30000, &s));
    CHECK(h_wait_text(dalog, "2 of its 3 ranks (--group-size) after", 30000));
    CHECK(h_wait_text(dalog, "going on with them, 2 batches a step instead of 3", 0));
    printf("phase 2: db joined; after --group-wait-s the group goes on with 2 of 3 ranks\n");

    /* 3. the epoch to its end: every step of both ranks */
    uint64_t end = h_now_ms() + 180000;
    while (h_now_ms() < end &&
           !(client_status(c, &s) == 0 && s.batches_trained + s.batches_committed == 42))
        h_sleep_ms(100);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 42);
    unsigned step[256], n[256];
    int steps = h_group_steps(qlog, "g", step, n, 256), of_two = 0;
    for (int i = 0; i < steps; i++) of_two += n[i] == 2;
    printf("phase 3: 42 batches in %d group steps, %d of 2 batches\n", steps, of_two);
    CHECK_EQ_INT(steps, 21);
    CHECK_EQ_INT(of_two, 21);
    /* the end of the plan ends both ranks (--exit-when-drained, the default), no drain */
    CHECK_EQ_INT(h_wait_exit(da, 60000), 0);
    CHECK_EQ_INT(h_wait_exit(db, 60000), 0);
    /* the final checkpoint (rank 0's, in either directory) records the step the group means,
     * 3 ranks (--group-size), not the 2 it had: a resume with the 3 restores steps of 3 */
    int with_ckpt = 0;
    const char *rank0 = NULL;
    for (const char *who = "a"; who; who = who[0] == 'a' ? "b" : NULL) {
        char root[160], path[512], err[512];
        snprintf(root, sizeof root, "%s/ckpt-d%s", dir, who);
        if (dflash_ckpt_latest(root, path, sizeof path) < 0) continue;
        rank0 = who;
        dflash_train_cfg tc;
        long step = 0;
        CHECK_EQ_INT(dflash_ckpt_train_settings(path, &tc, &step, err, sizeof err), 0);
        CHECK_EQ_INT(tc.world, 3);
        CHECK_EQ_INT(step, 21);
        with_ckpt++;
    }
    CHECK(with_ckpt >= 1);
    printf("phase 3: the final checkpoint records world 3 (--group-size), its step 21\n");

    /* 4. the rank holding that checkpoint, started again alone at the plan's end, creates the
     * group again: it waits for its ranks as at any start (--group-wait-s 3 here), for the
     * broker answers a join "nothing left" only in a group that trained or had all its ranks
     * (one holding an older model may be on its way: its creation of the group would rewind the
     * trained batches), then goes on alone, hears the end from its claim and exits 0 */
    if (rank0) {
        char name[8], relog[160];
        snprintf(name, sizeof name, "d%s", rank0);
        snprintf(relog, sizeof relog, "%s/drafter-%s.log", dir, name); /* appended to */
        size_t from = (size_t)test_file_size(relog);
        pid_t again = start_drafter_waiting(name, "g", "3", relog, sizeof relog);
        CHECK_EQ_INT(h_wait_exit(again, 60000), 0);
        CHECK(h_wait_text_from(relog, from, "1 of its 3 ranks (--group-size) have joined: "
                                            "waiting up to 3 s", 0));
        CHECK(h_wait_text_from(relog, from, "the broker has nothing more for us (every batch "
                                            "of the target's planned epochs (1) is trained", 0));
        CHECK_EQ_INT(client_status(c, &s), 0);
        CHECK_EQ_INT(s.batches_trained + s.batches_committed, 42); /* nothing rewound */
        printf("phase 4: %s resumed alone at the plan's end waits for its ranks, then exits 0\n",
               name);
    }
    CHECK_EQ_INT(client_drain(c), 0);
    CHECK_EQ_INT(h_wait_exit(tp, 30000), 0);
    client_destroy(&c);
    CHECK_EQ_INT(h_stop(qp), 0);
    if (check_failed) fprintf(stderr, "logs kept in %s\n", dir);
    else h_rmdir(dir);
    CHECK_DONE();
}
