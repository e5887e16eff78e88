/* itest_group_anchors: a group rank whose memory is planned for fewer anchors than rank 0 trains
 * with leaves the group with exit 2, naming the flag that mends it (real broker, target and
 * drafters; cpu backend, shm collective).
 *
 * A rank takes rank 0's training settings at the group's state sync, its anchor count among
 * them, but its blocks were planned at start-up for its own --anchors (or its checkpoint's:
 * rank 0 resumed from a run of 1024 anchors, the others started with the default 512). Every
 * batch with more anchors than that plan failed on the rank ("anchors exceed the planned
 * blocks"), the group skipped the step and re-formed, and the batch came back: the group
 * trained little or nothing and never ended.
 *
 * Setup (in a temp dir): itest_group's tiny training set (96 sequences, 42 batches of up to 4
 * sequences in the 32-token bucket, --token-budget 80); dflash-queue; the target; drafter da
 * (8 anchors a sequence: 32 blocks a batch) with --group g --group-size 2; once it waits for
 * its second rank, drafter db with --anchors 1 (4 blocks a batch).
 *   1. da is rank 0; db says it cannot follow rank 0's 8 anchors with its plan of 4 blocks
 *      (--anchors 1 x --max-seqs 4), names --anchors 8, leaves and exits 2;
 *   2. da goes on alone and trains the epoch to its end (42 batches), exit 0.
 * Usage: itest_group_anchors QUEUE TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

static char dir[64], ep[128], rt[128];
static const char *drafter_bin;

/* Drafter name of group g (--group-size 2, waiting up to 20 s), then more (NULL-terminated
 * flags); its log in drafter-NAME.log. */
static pid_t start_drafter(const char *name, const char *const *more, char *log, size_t log_len)
{
    char model[128], ckpt[128];
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, name);
    snprintf(log, log_len, "%s/drafter-%s.log", dir, name);
    const char *extra[24] = {"--group", "g", "--group-size", "2", "--group-wait-s", "20",
                             "--comm", "shm", "--comm-timeout-s", "5", "--timeout-ms", "1000",
                             "--progress-ms", "300"};
    size_t n = 14;
    for (size_t i = 0; more && more[i] && n + 1 < sizeof extra / sizeof *extra; i++)
        extra[n++] = more[i];
    return h_start_training_drafter(drafter_bin, model, rt, name, ckpt, 80, extra, log);
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: itest_group_anchors QUEUE TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    const char *queue_bin = argv[1], *target_bin = argv[2];
    drafter_bin = argv[3];
    h_run_dirs(dir, rt, ep);
    char model[128], shard[128], tlog[128], dalog[128], dblog[128];
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    CHECK_EQ_INT(h_make_training_set(argv[4], argv[5], argv[6], dir, model, shard), 0);
    if (check_failed) CHECK_DONE();

    pid_t qp = -1;
    client *c = h_start_group_broker(queue_bin, dir, rt, ep, NULL, &qp);
    CHECK(c != NULL);
    if (!c) CHECK_DONE();
    pid_t tp = h_start_training_target(target_bin, model, shard, rt, 1, 80, tlog);
    CHECK(h_wait_text(tlog, "registered pool", 30000));

    /* 1. da (8 anchors) creates the group and waits; db (1 anchor) joins, cannot follow */
    pid_t da = start_drafter("da", NULL, dalog, sizeof dalog);
    CHECK(h_wait_text(dalog, "1 of its 2 ranks (--group-size) have joined", 30000));
    pid_t db = start_drafter("db", (const char *const[]){"--anchors", "1", NULL}, dblog,
                             sizeof dblog);
    int db_exit = h_wait_exit(db, 60000);
    CHECK_EQ_INT(db_exit, 2);
    CHECK(h_wait_text(dalog, "rank 0 of 2 in sync at step 0", 0));
    CHECK(h_wait_text(dblog, "rank 0 of the group trains with 8 anchors a sequence", 0));
    CHECK(h_wait_text(dblog, "planned for 4 blocks a batch (1 anchors x --max-seqs 4", 0));
    CHECK(h_wait_text(dblog, "restart it with --anchors 8; leaving the group", 0));
    CHECK(!h_wait_text(dblog, "the group skips the step", 0));
    printf("phase 1: db (--anchors 1) cannot follow rank 0's 8 anchors: exit %d\n", db_exit);

    /* 2. da trains the epoch alone */
    wire_status s = {0};
    uint64_t end = h_now_ms() + 180000;
    while (h_now_ms() < end &&
           !(client_status(c, &s) == 0 && s.batches_trained + s.batches_committed == 42))
        h_sleep_ms(100);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 42);
    CHECK_EQ_INT(h_wait_exit(da, 60000), 0);
    printf("phase 2: da trained the 42 batches alone and exited\n");

    CHECK_EQ_INT(client_drain(c), 0);
    CHECK_EQ_INT(h_wait_exit(tp, 30000), 0);
    client_destroy(&c);
    CHECK_EQ_INT(h_stop(qp), 0);
    if (check_failed) fprintf(stderr, "logs kept in %s\n", dir);
    else h_rmdir(dir);
    CHECK_DONE();
}
