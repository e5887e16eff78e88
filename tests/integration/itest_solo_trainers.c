/* itest_solo_trainers: one broker serves one model. Two real dflash-drafter processes train alone
 * (no --group) on one broker: the second one, another run (its own --checkpoint-dir), is
 * refused and exits 6 naming the first, whose ledger it left untouched; a trainer SIGKILLed and
 * started again on its checkpoint dir (the same run id, a new name as a new container has) takes
 * its predecessor's place at once instead of waiting for the broker to expire it.
 *
 * Setup (in a temp dir): a tiny random Qwen3 target (dflash-mkmodel), 96 generated sequences
 * (dflash-gen) packed into a shard (dflash-data); dflash-queue (journal, heartbeat 2 s, liveness
 * 3: a silent peer expires after 6 s, a refused trainer is held 9 s); dflash-target for 50
 * epochs. Phases, each waiting for a condition (never a fixed sleep):
 *   1. drafter da trains (>= 6 batches trained, a checkpoint committed);
 *   2. the broker is paused (nothing new goes out); drafter db (its own checkpoint dir,
 *      starting at step 0) exits 6, its log and the broker's naming da and --group, and so
 *      does dc, which would join a group (--group g) while da trains alone; nothing
 *      went back to to-do and nothing trained was lost (under the old broker db's resume gave
 *      every batch back to to-do);
 *   3. da is SIGKILLed and started again as da2 on its checkpoint dir: the broker replaces da
 *      by da2 at its resume (its log says so) while da is still live to it (well within the 6 s
 *      it would take to expire it), and da2 trains on;
 *   4. drain: da2 exits 0.
 * Usage: itest_solo_trainers QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

#include <fcntl.h>
#include <sys/stat.h>

static char dir[64], ep[128], rt[128];
static const char *drafter_bin;

/* A drafter named name, checkpointing into DIR/ckpt-<run>, logging to DIR/<name>.log, in
 * --group group when not NULL. */
static pid_t start_drafter_in(const char *name, const char *run, const char *group)
{
    char model[128], ckpt[128], log[128], nm[64];
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, run);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    snprintf(nm, sizeof nm, "%s", name);
    char *argv[] = {(char *)drafter_bin, "--train", "--model", model, "--name", nm,
                    "--block-size", "4", "--anchors", "8", "--lr", "3e-3", "--checkpoint-every",
                    "3", "--checkpoint-dir", ckpt, "--progress-ms", "0", "--buckets", "32",
                    "--token-budget", "128", "--max-seqs", "4", "--layers", "3", "--runtime-dir",
                    rt, "--threads", "1", "--backend", "host", "--timeout-ms", "1000", NULL,
                    NULL, NULL};
    if (group) {
        size_t n = 0;
        while (argv[n]) n++;
        argv[n] = "--group";
        argv[n + 1] = (char *)group;
    }
    return h_spawn_logged(argv, log);
}

/* A solo trainer (no --group). */
static pid_t start_drafter(const char *name, const char *run)
{
    return start_drafter_in(name, run, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: itest_solo_trainers QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    drafter_bin = argv[4];
    h_tempdir(dir, sizeof dir);
    snprintf(rt, sizeof rt, "%s/run", dir);
    mkdir(rt, 0700);
    h_queue_endpoint(rt, ep, sizeof ep);
    char model[128], shard[128], journal[128], qlog[128], tlog[128];
    snprintf(journal, sizeof journal, "%s/queue.journal", dir);
    snprintf(qlog, sizeof qlog, "%s/queue.log", dir);
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    CHECK_EQ_INT(h_make_training_set(argv[5], argv[6], argv[7], dir, model, shard), 0);
    if (check_failed) CHECK_DONE();

    char rtflag[160];
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    char *q[] = {argv[1], rtflag, "--journal", journal, "--min-ready", "1", "--max-depth", "4",
                 "--lease-timeout-ms", "1500", "--heartbeat-ms", "2000", "--liveness", "3",
                 NULL};
    pid_t qp = h_spawn_logged(q, qlog);
    CHECK(h_wait_broker(ep, 10000) != 0);
    char *t[] = {argv[3], "--name", "tgt", "--model", model, "--shards", shard, "--slots", "4",
                 "--epochs", "50", "--buckets", "32", "--token-budget", "128", "--max-seqs", "4",
                 "--layers", "3", "--runtime-dir", rt, "--threads", "1", "--backend", "host",
                 "--timeout-ms", "1000", NULL};
    pid_t tp = h_spawn_logged(t, tlog);
    client *c = client_new(ep, WIRE_ROLE_CTL, "itest");
    client_set_timeout(c, 2000);
    CHECK_EQ_INT(client_hello(c, NULL, 0), 0);

    /* 1. da trains and commits a checkpoint */
    pid_t da = start_drafter("da", "a");
    wire_status s = {0};
    uint64_t end = h_now_ms() + 60000;
    while (h_now_ms() < end &&
           (client_status(c, &s) != 0 || s.batches_trained + s.batches_committed < 6 ||
            s.committed_step == 0))
        h_sleep_ms(50);
    CHECK(s.committed_step > 0);

    /* 2. db, another run, is refused: exit 6, the ledger untouched */
    CHECK_EQ_INT(client_pause(c), 0);
    wire_status before;
    CHECK_EQ_INT(client_status(c, &before), 0);
    pid_t db = start_drafter("db", "b");
    pid_t dc = start_drafter_in("dc", "c", "g"); /* a group member beside a solo trainer */
    int db_rc = h_wait_exit(db, 60000);
    CHECK_EQ_INT(db_rc, 6);
    CHECK_EQ_INT(h_wait_exit(dc, 60000), 6);
    char dclog[128];
    snprintf(dclog, sizeof dclog, "%s/dc.log", dir);
    CHECK(h_wait_text(dclog, "the broker refused to let us join group g", 1000));
    char dblog[128];
    snprintf(dblog, sizeof dblog, "%s/db.log", dir);
    char *l = test_slurp(dblog, NULL);
    CHECK(l && strstr(l, "drafter da (run "));
    CHECK(l && strstr(l, "trains another model on this broker"));
    CHECK(l && strstr(l, "--group G"));
    free(l);
    CHECK(h_wait_text(qlog, "drafter db refused: drafter da (run ", 1000));
    wire_status after;
    CHECK_EQ_INT(client_status(c, &after), 0);
    /* paused: nothing new goes out, but da may still ack a batch it had before the pause */
    CHECK_EQ_INT(after.batches_todo, before.batches_todo);
    CHECK(after.batches_trained + after.batches_committed >=
          before.batches_trained + before.batches_committed);
    CHECK(after.batches_committed >= before.batches_committed);
    printf("phase 2: db exited %d; ledger todo %llu trained %llu committed %llu, nothing rewound\n",
           db_rc, (unsigned long long)after.batches_todo,
           (unsigned long long)after.batches_trained,
           (unsigned long long)after.batches_committed);
    CHECK_EQ_INT(client_resume(c), 0);

    /* 3. da SIGKILLed, started again on its checkpoint dir: replaced at once, trains on */
    h_kill(da, SIGKILL);
    h_wait_exit(da, 5000);
    uint64_t killed_ms = h_now_ms();
    pid_t da2 = start_drafter("da2", "a");
    /* the broker ends da at da2's resume: had it expired da first, it would not say this */
    CHECK(h_wait_text(qlog, "replaced by da2, a restart of its run", 60000));
    char da2log[128];
    snprintf(da2log, sizeof da2log, "%s/da2.log", dir);
    CHECK(h_wait_text(da2log, "told the broker we resume from step", 60000));
    char *l2 = test_slurp(da2log, NULL);
    CHECK(l2 && !strstr(l2, "the broker holds our resume"));
    free(l2);
    char *ql = test_slurp(qlog, NULL);
    CHECK(ql && !strstr(ql, "drafter da2 would train"));
    free(ql);
    printf("phase 3: da killed, da2 resumed %llu ms later (da replaced, not expired)\n",
           (unsigned long long)(h_now_ms() - killed_ms));
    CHECK_EQ_INT(client_status(c, &before), 0);
    end = h_now_ms() + 60000;
    while (h_now_ms() < end && (client_status(c, &s) != 0 || s.acks < before.acks + 3))
        h_sleep_ms(50);
    CHECK(s.acks >= before.acks + 3);

    /* 4. drain: da2 checkpoints and exits 0 */
    CHECK_EQ_INT(client_drain(c), 0);
    CHECK_EQ_INT(h_wait_exit(da2, 60000), 0);
    client_destroy(&c);
    h_kill(tp, SIGTERM);
    h_wait_exit(tp, 10000);
    h_kill(qp, SIGTERM);
    h_wait_exit(qp, 10000);
    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
