/* itest_solo_trainers: one broker serves one model. Two real dflash-drafter processes train alone
 * (no --group) on one broker: the second one, another run (its own --checkpoint-dir), is
 * refused and exits 6 naming the first, whose ledger it left untouched; a trainer SIGKILLed and
 * started again on its checkpoint dir (the same run id, a new name as a new container has) takes
 * its predecessor's place at once instead of waiting for the broker to expire it. A trainer
 * whose registration again is refused for good keeps what it trained in a final checkpoint,
 * unless a live process of its own run replaced it.
 *
 * Setup (in a temp dir): a tiny random Qwen3 target (dflash-mkmodel), 96 generated sequences
 * (dflash-gen) packed into a shard (dflash-data); dflash-queue (journal, heartbeat 2 s, liveness
 * 3: a silent peer expires after 6 s, a refused trainer is held 9 s); dflash-target for 100000
 * epochs, so that the data never runs out (with 50, an idle machine's db2 trained them all while
 * da3 was held, exited, expired, and da3 was then admitted: exit 0, not 6). Phases, each waiting
 * for a condition (never a fixed sleep):
 *   1. drafter da trains (>= 6 batches trained, a checkpoint committed);
 *   2. the broker is paused (nothing new goes out); drafter db (its own checkpoint dir,
 *      starting at step 0) exits 6, its log and the broker's naming da and --group, and so
 *      does dc, which would join a group (--group g) while da trains alone; nothing
 *      went back to to-do and nothing trained was lost (under the old broker db's resume gave
 *      every batch back to to-do);
 *   3. da is SIGKILLed and started again as da2 on its checkpoint dir: the broker replaces da
 *      by da2 at its resume (its log says so) while da is still live to it (well within the 6 s
 *      it would take to expire it), and da2 trains on (from da's newest checkpoint, step X;
 *      da2 and the drafters after it checkpoint every 1000 steps: only final checkpoints);
 *   4. a second live process of run a: da3, its checkpoint dir a copy of da's run-id only,
 *      resuming from step X (--resume), replaces da2 (still live) at its resume; da2's next
 *      hello is refused EXISTS (the broker names the run) and da2 exits 4 without writing a
 *      final checkpoint into da's dir, which da3's run owns now (nothing past step X there,
 *      though da2 trained past it);
 *   5. da3 trains past step X, is stopped (SIGSTOP: a paused container) and the broker is
 *      SIGKILLed and restarted on its journal; db2, another run (resuming from step X into its
 *      own dir), registers while the broker does not know da3. da3 let go (SIGCONT) says hello
 *      again naming run a: the broker holds it (Error AGAIN: db2 might be a dying process) for
 *      9 s, nine of da3's request timeouts, which da3 does not take for a silent broker (no
 *      "waiting for the broker to come back" once held), then refuses it DENIED: da3 exits 6,
 *      with the steps it trained past X in a final checkpoint in its own dir, reported to
 *      nobody (before, they were lost);
 *   6. drain: db2 exits 0.
 * Usage: itest_solo_trainers QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "dflash_ckpt.h"
#include "test_files.h"

#include <fcntl.h>
#include <sys/stat.h>

static char dir[64], ep[128], rt[128];
static const char *drafter_bin;

/* A drafter named name, checkpointing into DIR/ckpt-<run> (every 3 steps), logging to
 * DIR/<name>.log, with the flags in extra (NULL-terminated, up to 8; NULL: none) after ours. */
static pid_t start_drafter_with(const char *name, const char *run, const char *const *extra)
{
    char model[128], ckpt[128], log[128];
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, run);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    const char *flags[24] = {"--lr", "3e-3", "--checkpoint-every", "3", "--progress-ms", "0",
                             "--timeout-ms", "1000"};
    size_t n = 8;
    for (size_t i = 0; extra && extra[i] && i < 8; i++) flags[n++] = extra[i];
    return h_start_training_drafter(drafter_bin, model, rt, name, ckpt, 128, flags, log);
}

/* A solo trainer (no --group). */
static pid_t start_drafter(const char *name, const char *run)
{
    return start_drafter_with(name, run, NULL);
}

/* A solo trainer that writes only its final checkpoint (--checkpoint-every 1000): every step it
 * trains stays past its newest checkpoint until it ends. resume: --resume DIR, or NULL. */
static pid_t start_final_only(const char *name, const char *run, const char *resume)
{
    const char *extra[] = {"--checkpoint-every", "1000", resume ? "--resume" : NULL, resume, NULL};
    return start_drafter_with(name, run, extra);
}

/* The step of the newest checkpoint under DIR/ckpt-<run> (path, may be NULL: its directory, 256
 * bytes), or -1 when there is none. */
static long newest_step(const char *run, char *path)
{
    char root[128], p[256];
    snprintf(root, sizeof root, "%s/ckpt-%s", dir, run);
    if (dflash_ckpt_latest(root, p, sizeof p) != 0) return -1;
    if (path) snprintf(path, 256, "%s", p);
    const char *base = strrchr(p, '/');
    return base && strncmp(base, "/step-", 6) == 0 ? strtol(base + 6, NULL, 10) : -1;
}

/* Whether every line of the log at path that says the drafter waits for a silent broker ("...:
 * waiting for the broker to come back", the reason first) gives an unanswered request as the
 * reason ("no reply from ..."), not an answer the broker gave. */
static bool silent_only_when_unanswered(const char *path)
{
    char *l = test_slurp(path, NULL);
    bool ok = true;
    for (char *line = strtok(l, "\n"); line && ok; line = strtok(NULL, "\n"))
        ok = !strstr(line, "waiting for the broker to come back") || strstr(line, "no reply from");
    free(l);
    return ok;
}

/* Waits up to 60 s for the broker to count `more` acks past `from`; its status into *s. */
static bool wait_acks(client *c, uint64_t from, uint64_t more, wire_status *s)
{
    uint64_t end = h_now_ms() + 60000;
    while (h_now_ms() < end && (client_status(c, s) != 0 || s->acks < from + more))
        h_sleep_ms(50);
    return s->acks >= from + more;
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: itest_solo_trainers QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    drafter_bin = argv[4];
    h_run_dirs(dir, rt, ep);
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
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    pid_t tp = h_start_training_target(argv[3], model, shard, rt, 100000, 128, tlog);
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
    /* a group member beside a solo trainer */
    pid_t dc = start_drafter_with("dc", "c", (const char *[]){"--group", "g", NULL});
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
    h_kill(da, SIGKILL); /* reaped: da2 starts at once, well inside da's liveness window */
    uint64_t killed_ms = h_now_ms();
    pid_t da2 = start_final_only("da2", "a", NULL);
    /* the broker ends da at da2's resume: had it expired da first, it would not say this */
    CHECK(h_wait_text(qlog, "replaced by da2, a restart of its run", 60000));
    char da2log[128];
    snprintf(da2log, sizeof da2log, "%s/da2.log", dir);
    CHECK(h_wait_text(da2log, "told the broker we resume from step", 60000));
    char *l2 = test_slurp(da2log, NULL);
    CHECK(l2 && !strstr(l2, "the broker holds our resume"));
    const char *told = strstr(l2, "told the broker we resume from step ");
    long x = told ? strtol(told + strlen("told the broker we resume from step "), NULL, 10) : -1;
    free(l2);
    char xdir[256];
    CHECK_EQ_INT(newest_step("a", xdir), x); /* da2 resumed from da's newest checkpoint */
    char *ql = test_slurp(qlog, NULL);
    CHECK(ql && !strstr(ql, "drafter da2 would train"));
    free(ql);
    printf("phase 3: da killed, da2 resumed from step %ld %llu ms later (da replaced, not "
           "expired)\n", x, (unsigned long long)(h_now_ms() - killed_ms));
    CHECK_EQ_INT(client_status(c, &before), 0);
    CHECK(wait_acks(c, before.acks, 3, &s));

    /* 4. da3, a second live process of run a (da's run-id copied into a dir of its own),
     * replaces da2 at its resume; da2, refused, writes nothing into the dir its run owns */
    char a3[128], src[128];
    snprintf(a3, sizeof a3, "%s/ckpt-a3", dir);
    mkdir(a3, 0700);
    snprintf(src, sizeof src, "%s/ckpt-a/run-id", dir);
    size_t idlen = 0;
    char *id = test_slurp(src, &idlen);
    snprintf(src, sizeof src, "%s/run-id", a3);
    test_spill(src, id, idlen);
    free(id);
    pid_t da3 = start_final_only("da3", "a3", xdir);
    CHECK_EQ_INT(h_wait_exit(da2, 60000), 4);
    CHECK(h_wait_text(da2log, "replaced this process as a restart of its run", 1000));
    CHECK(h_wait_text(da2log, "no final checkpoint is written", 1000));
    CHECK_EQ_INT(newest_step("a", NULL), x); /* da2 trained past x, and wrote none of it */
    printf("phase 4: da2 replaced by da3 (run a), exited 4, no checkpoint past step %ld\n", x);

    /* 5. da3 trains past x, stops; the broker restarts; db2 (another run) comes in; da3 is
     * held, then refused (exit 6), and writes its final checkpoint into its own dir */
    char da3log[128], db2log[128];
    snprintf(da3log, sizeof da3log, "%s/da3.log", dir);
    snprintf(db2log, sizeof db2log, "%s/db2.log", dir);
    CHECK(h_wait_text(da3log, "told the broker we resume from step", 60000));
    CHECK_EQ_INT(client_status(c, &before), 0);
    CHECK(wait_acks(c, before.acks, 2, &s)); /* da3's (da2 is gone): steps x+1, x+2 */
    h_signal(da3, SIGSTOP);
    h_kill(qp, SIGKILL);
    client_destroy(&c);
    qp = h_spawn_logged(q, qlog);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    c = client_new(ep, WIRE_ROLE_CTL, "itest");
    client_set_timeout(c, 2000);
    CHECK_EQ_INT(client_hello(c, NULL, 0), 0);
    pid_t db2 = start_final_only("db2", "b2", xdir);
    CHECK(h_wait_text(db2log, "told the broker we resume from step", 60000));
    uint64_t held_ms = h_now_ms();
    h_signal(da3, SIGCONT);
    CHECK(h_wait_text(da3log, "the broker holds our hello", 30000));
    CHECK_EQ_INT(h_wait_exit(da3, 60000), 6);
    held_ms = h_now_ms() - held_ms;
    /* held 9 s with --timeout-ms 1000: an answer, not a silent broker */
    CHECK(silent_only_when_unanswered(da3log));
    CHECK(h_wait_text(da3log, "the broker refused our hello", 1000));
    long f = newest_step("a3", NULL);
    CHECK(f >= x + 2);
    CHECK(h_wait_text(da3log, "reported to no broker", 1000));
    CHECK(!h_wait_text(da3log, "reported the final checkpoint", 0));
    printf("phase 5: da3 held, then refused after %llu ms: exited 6 with its final checkpoint at "
           "step %ld (resumed from %ld)\n", (unsigned long long)held_ms, f, x);

    /* 6. drain: db2 checkpoints and exits 0 */
    CHECK_EQ_INT(client_drain(c), 0);
    CHECK_EQ_INT(h_wait_exit(db2, 60000), 0);
    client_destroy(&c);
    h_kill(tp, SIGTERM);
    h_kill(qp, SIGTERM);
    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
