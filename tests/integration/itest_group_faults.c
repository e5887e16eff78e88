/* itest_group_faults: a data-parallel drafter group (--group g, cpu backend, shm collective,
 * --comm-timeout-s 60) from the real broker, target and drafters, meeting the faults an operator
 * meets, each of which must cost the healthy rank seconds, not the 60 s timeout, and never its
 * run (audit-operator findings 5 and 6).
 *
 * Setup (in a temp dir): the tiny training set of harness.h; dflash-queue (heartbeat 1 s,
 * liveness 10: a silent rank is expired after 10 s; lease timeout 30 s), dflash-target (epochs
 * without end), drafters da and db with --group g; da creates the group, so it is rank 0.
 * Phases, each waiting for a condition (never a fixed sleep):
 *   1. da and db train >= 3 steps with world 2;
 *   2. dc joins with another drafter shape (--draft-layers 2): dc exits 2 saying its drafter
 *      differs from rank 0's; da names the odd rank, re-forms with db and trains >= 3 more steps
 *      with world 2; da is still running and nowhere told that its own drafter differs;
 *   3. db is SIGSTOPped: da, waiting for it inside a collective, says so after 5 s (whom, pid,
 *      the timeout); db is then SIGKILLed: within 5 s da's log names rank 1 and db's pid as
 *      gone, and da's next join names that rank, so the broker drops db from the group within
 *      5 s, before its expiry (it used to list the dead db until then, up to 10 s, and da's
 *      next epoch waited for it); within 20 s da trains >= 2 steps alone (world 1);
 *   4. db is started again and rejoins (world 2, >= 2 steps); then SIGSTOPped and left
 *      stopped: it is alive, so only the broker's view can end da's wait: when the broker
 *      expires db (10 s), da learns it within seconds and trains alone (world 1, >= 2 steps)
 *      within 25 s of the stop; SIGCONT: db finds its group broken, registers again and the
 *      group is back to world 2;
 *   5. db is SIGSTOPped again and, once da says it waits for it in the collective, the broker
 *      is SIGKILLed and started again on its journal: the new broker knows no da, so da's next
 *      poll of its epoch is answered STALE, which ends the wait: within 5 s of the new broker
 *      answering, da has registered again and formed group g alone (a wait that took STALE for
 *      "no answer" lasted until db woke, or the 60 s comm timeout); SIGCONT: db, answered
 *      STALE too, registers again and the group trains >= 2 steps with world 2 (once the new
 *      broker's fence on the target's slots, the 30 s lease timeout, has passed);
 *   6. SIGTERM: da and db exit 0.
 * Checks at the end: acks (both brokers') == trained + committed (every acked batch once), no
 * "already trained" in the broker's log.
 * Usage: itest_group_faults QUEUE TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

static char dir[64], ep[128], rt[128];
static const char *drafter_bin;

/* A drafter of group g named name, with --draft-layers layers. */
static pid_t start_drafter(const char *name, const char *layers)
{
    char model[128], ckpt[128], log[128];
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, name);
    snprintf(log, sizeof log, "%s/drafter-%s.log", dir, name);
    const char *extra[] = {"--group", "g", "--comm", "shm", "--comm-timeout-s", "60",
                           "--draft-layers", layers, "--lr", "3e-3", "--checkpoint-every", "50",
                           "--progress-ms", "0", "--timeout-ms", "1000", NULL};
    return h_start_training_drafter(drafter_bin, model, rt, name, ckpt, 128, extra, log);
}

static const wire_group_stat *group_g(const wire_status *s)
{
    return h_group(s, "g");
}

/* Waits up to ms until group g is active with `world` ranks and done >= min_done steps. */
static bool wait_group(client *c, uint32_t world, uint64_t min_done, int ms, wire_status *s)
{
    return h_wait_group(c, "g", world, min_done, ms, s);
}

/* Waits up to ms (twice) until group g is active with `world` ranks, then until it has done n
 * more steps (with that world: s shows it at the end). */
static bool wait_steps(client *c, uint32_t world, uint64_t n, int ms, wire_status *s)
{
    if (!wait_group(c, world, 0, ms, s)) return false;
    return wait_group(c, world, group_g(s)->steps_done + n, ms, s);
}

static uint64_t steps_done(client *c)
{
    wire_status s;
    const wire_group_stat *g = client_status(c, &s) == 0 ? group_g(&s) : NULL;
    return g ? g->steps_done : 0;
}

/* Whether pid is still running (not exited, not reaped). */
static bool running(pid_t pid)
{
    return waitpid(pid, NULL, WNOHANG) == 0;
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: itest_group_faults QUEUE TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    drafter_bin = argv[3];
    h_run_dirs(dir, rt, ep);
    char model[128], shard[128], qlog[128], tlog[128], dalog[128], dblog[128],
        dclog[128];
    snprintf(qlog, sizeof qlog, "%s/queue.log", dir);
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    snprintf(dalog, sizeof dalog, "%s/drafter-da.log", dir);
    snprintf(dblog, sizeof dblog, "%s/drafter-db.log", dir);
    snprintf(dclog, sizeof dclog, "%s/drafter-dc.log", dir);
    CHECK_EQ_INT(h_make_training_set(argv[4], argv[5], argv[6], dir, model, shard), 0);
    if (check_failed) CHECK_DONE();

    pid_t qp = -1;
    static const char *const more[] = {"--lease-timeout-ms", "30000", "--heartbeat-ms",
                                       "1000", "--liveness", "10", NULL};
    client *c = h_start_group_broker(argv[1], dir, rt, ep, more, &qp);
    CHECK(c != NULL);
    if (!c) CHECK_DONE();
    wire_status s;
    pid_t da = start_drafter("da", "1");
    CHECK(wait_group(c, 1, 0, 30000, &s));
    pid_t db = start_drafter("db", "1");
    CHECK(wait_group(c, 2, 0, 30000, &s));
    pid_t tp = h_start_training_target(argv[2], model, shard, rt, 100000, 128, tlog);

    /* 1. a group of two trains */
    CHECK(wait_group(c, 2, 3, 60000, &s));
    printf("phase 1: %llu steps with world 2\n", (unsigned long long)group_g(&s)->steps_done);

    /* 2. a joiner of another shape, started twice: the broker refuses it, it exits 2; the
     * group does not re-form for it */
    uint64_t epoch = group_g(&s)->epoch;
    size_t da_from = (size_t)test_file_size(dalog), db_from = (size_t)test_file_size(dblog);
    size_t q_from = (size_t)test_file_size(qlog);
    int rcc = -1;
    for (int k = 0; k < 2; k++) {
        pid_t dc = start_drafter("dc", "2");
        rcc = h_wait_exit(dc, 60000);
        CHECK_EQ_INT(rcc, 2);
        CHECK_EQ_INT(client_status(c, &s), 0);
        CHECK(group_g(&s) && group_g(&s)->epoch == epoch && group_g(&s)->world == 2);
    }
    CHECK(h_wait_text(dclog, "the broker refused to let us join group g: group g trains another "
                             "drafter: its rank 0 da has 1 layer, ", 0));
    CHECK(h_wait_text(dclog, "this one has 2 layers, ", 0));
    CHECK(h_wait_text(dclog, "every rank needs the group's drafter", 0)); /* the shape advice */
    CHECK(h_wait_text(dclog, " parameters, comm shm; this one has 2 layers, ", 0)); /* --comm */
    CHECK(!h_wait_text(dclog, "every rank needs the group's --accumulate", 0));
    CHECK(h_wait_text_from(qlog, q_from, "group g: dc refused: its drafter (2 layers, ", 0));
    CHECK(wait_steps(c, 2, 3, 60000, &s));
    CHECK_EQ_INT(group_g(&s)->epoch, epoch);
    CHECK(running(da));
    CHECK(running(db));
    char *la = test_slurp(dalog, NULL), *lb = test_slurp(dblog, NULL);
    CHECK(la && !strstr(la + da_from, "re-forming") && !strstr(la, "ERROR"));
    CHECK(lb && !strstr(lb + db_from, "re-forming"));
    free(la);
    free(lb);
    printf("phase 2: dc (--draft-layers 2) started twice, exited %d; da and db went on in epoch "
           "%llu: %llu steps\n", rcc, (unsigned long long)group_g(&s)->epoch,
           (unsigned long long)group_g(&s)->steps_done);

    /* 3. db stops inside a step: da says it waits; db is killed: da sees it at once */
    size_t from = (size_t)test_file_size(dalog);
    h_signal(db, SIGSTOP);
    char text[128];
    snprintf(text, sizeof text, "waiting for rank 1 (pid %d) in the collective", (int)db);
    CHECK(h_wait_text_from(dalog, from, text, 30000));
    CHECK(h_wait_text_from(dalog, from, "the group breaks at 60 s", 0));
    uint64_t done = steps_done(c);
    size_t qfrom = (size_t)test_file_size(qlog);
    uint64_t t0 = h_now_ms();
    h_kill(db, SIGKILL);
    snprintf(text, sizeof text, "rank 1 (pid %d) has exited", (int)db);
    CHECK(h_wait_text_from(dalog, from, text, 5000));
    uint64_t seen_ms = h_now_ms() - t0;
    /* da's join names the rank it saw end: the broker drops db from the group then, not at its
     * expiry (db has been silent since its SIGSTOP: that comes up to 10 s later) */
    CHECK(h_wait_text_from(qlog, qfrom, "group g: db left (rank 1 of epoch ", 5000));
    uint64_t dropped_ms = h_now_ms() - t0;
    char *ql3 = test_slurp(qlog, NULL);
    const char *drop = ql3 ? strstr(ql3 + qfrom, "group g: db left (rank 1 of epoch ") : NULL;
    const char *expiry = ql3 ? strstr(ql3 + qfrom, "peer db (") : NULL;
    const char *eol = drop ? strchr(drop, '\n') : NULL;
    const char *said = drop ? strstr(drop, "da saw its process end") : NULL;
    CHECK(said && (!eol || said < eol)); /* why, on the same line */
    CHECK(drop && (!expiry || expiry > drop));
    free(ql3);
    CHECK(wait_group(c, 1, done + 2, 20000, &s));
    printf("phase 3: db SIGKILLed while da waited for it: da saw it in %.1f s, the broker "
           "dropped it in %.1f s, da trained alone %.1f s after the kill (comm timeout 60 s)\n",
           seen_ms / 1000.0, dropped_ms / 1000.0, (h_now_ms() - t0) / 1000.0);

    /* 4. db back, then stopped for good: only the broker's expiry can tell da */
    db = start_drafter("db", "1");
    CHECK(wait_steps(c, 2, 2, 60000, &s));
    from = (size_t)test_file_size(dalog);
    done = steps_done(c);
    t0 = h_now_ms();
    h_signal(db, SIGSTOP);
    CHECK(wait_group(c, 1, done + 2, 25000, &s));
    CHECK(h_wait_text_from(dalog, from, "the broker has", 0));
    printf("phase 4: db SIGSTOPped: da trained alone %.1f s after (broker expiry 10 s, comm "
           "timeout 60 s)\n", (h_now_ms() - t0) / 1000.0);
    h_signal(db, SIGCONT);
    CHECK(wait_steps(c, 2, 2, 60000, &s));
    printf("phase 4: db continued and rejoined: world 2, epoch %llu\n",
           (unsigned long long)group_g(&s)->epoch);

    /* 5. the broker restarted while da waits for db in a collective: STALE ends the wait */
    from = (size_t)test_file_size(dalog);
    h_signal(db, SIGSTOP);
    snprintf(text, sizeof text, "waiting for rank 1 (pid %d) in the collective", (int)db);
    CHECK(h_wait_text_from(dalog, from, text, 30000));
    /* the acks so far: the new broker counts its own (da waits in the collective: none now) */
    CHECK_EQ_INT(client_status(c, &s), 0);
    uint64_t acks_before = s.acks;
    client_destroy(&c);
    h_kill(qp, SIGKILL);
    c = h_start_group_broker(argv[1], dir, rt, ep, more, &qp);
    t0 = h_now_ms(); /* the new broker answers */
    CHECK(c != NULL);
    if (!c) {
        h_kill(da, SIGKILL);
        h_kill(db, SIGKILL);
        h_kill(tp, SIGKILL);
        CHECK_DONE();
    }
    CHECK(h_wait_text_from(dalog, from, "the broker has ended epoch ", 5000));
    CHECK(wait_group(c, 1, 0, 5000, &s));
    uint64_t alone_ms = h_now_ms() - t0;
    CHECK(alone_ms < 5000);
    printf("phase 5: broker restarted while da waited for a stopped db: da formed the group "
           "alone %.1f s after the new broker answered (comm timeout 60 s)\n",
           alone_ms / 1000.0);
    h_signal(db, SIGCONT);
    CHECK(wait_steps(c, 2, 2, 60000, &s));
    printf("phase 5: db continued and rejoined the new broker's group: world 2, epoch %llu\n",
           (unsigned long long)group_g(&s)->epoch);

    /* 6. the end */
    CHECK_EQ_INT(h_stop(da), 0);
    CHECK_EQ_INT(h_stop(db), 0);
    CHECK_EQ_INT(h_stop(tp), 0);
    CHECK_EQ_INT(client_status(c, &s), 0);
    CHECK_EQ_INT(acks_before + s.acks, s.batches_trained + s.batches_committed);
    char *ql = test_slurp(qlog, NULL);
    CHECK(ql && !strstr(ql, "already trained"));
    free(ql);
    client_destroy(&c);
    CHECK_EQ_INT(h_stop(qp), 0);
    if (check_failed) fprintf(stderr, "logs kept in %s\n", dir);
    else h_rmdir(dir);
    CHECK_DONE();
}
