/* itest_group: two dflash-drafter processes train one drafter as a data-parallel group (--group g,
 * cpu backend, shm collective) from the real broker and a real dflash-target, survive the
 * SIGKILL of one rank, and take it back (issue 7).
 *
 * Setup (in a temp dir): a tiny random Qwen3 target (dflash-mkmodel), 96 generated sequences
 * (dflash-gen) packed into a shard (dflash-data); dflash-queue (journal, lease 1.5 s, heartbeat
 * 300 ms); drafters da and db with --group g --comm-timeout-s 3, each with its own checkpoint dir;
 * then dflash-target for 8 epochs (192 batches).
 * Phases, each waiting for a condition (never a fixed sleep):
 *   1. da creates the group (so da is rank 0 throughout), then db joins: world 2
 *      (`dflash-ctl set max_depth=1` is then refused, and so is a --verify drafter with
 *      --group: exit 2; with max_depth 2 a third rank's join is refused, Error FULL: exit 2,
 *      main.c's mapping); it trains >= 5 steps; the ledger shows every batch acked once
 *      (acks == trained + committed);
 *   2. db is SIGKILLed; da re-forms alone (world 1: its collective times out or the broker tells
 *      it) and trains >= 3 more steps;
 *   3. the broker is paused; db is started again: it joins at a step boundary, the group
 *      re-forms to world 2 and db takes rank 0's state (its "in sync" hash equals da's of that
 *      epoch); resume; >= 3 more steps with world 2;
 *   3b. once rank 0 (da) has a committed checkpoint, both are SIGKILLed; the broker expires
 *      them; db (no checkpoints of its own) is started first and must wait (the broker holds a
 *      group's creation below the newest committed checkpoint), its progress lines saying that
 *      it trains nothing and what it waits for (the broker's reason); da resumes from its checkpoint,
 *      creates the group as rank 0 and db syncs from it; nothing committed is rewound;
 *   4. once no batch is left to do (at most world - 1 ready batches can be left over: a step
 *      needs one per rank), drain: both drafters exit 0.
 * Checks at the end: every batch is committed/trained exactly once or left over (todo +
 * in flight <= 1), acks == trained + committed, no "already trained" in the broker's log, both
 * ranks end at the same step with the same state hash (dflash_dp_state_hash), and rank 0's
 * final checkpoint is the broker's committed step.
 * Usage: itest_group QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

#include <fcntl.h>
#include <sys/stat.h>

static char dir[64], ep[128], rt[128];
static const char *queue_bin, *target_bin, *drafter_bin;

/* A drafter of group g named name, a progress line every progress_ms ("0": none). */
static pid_t start_drafter_progress(const char *name, const char *progress_ms)
{
    char model[128], ckpt[128], log[128];
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, name);
    snprintf(log, sizeof log, "%s/drafter-%s.log", dir, name);
    const char *extra[] = {"--group", "g", "--comm", "shm", "--comm-timeout-s", "3", "--lr",
                           "3e-3", "--checkpoint-every", "10", "--progress-ms", progress_ms,
                           "--timeout-ms", "1000", NULL};
    return h_start_training_drafter(drafter_bin, model, rt, name, ckpt, 128, extra, log);
}

static pid_t start_drafter(const char *name)
{
    return start_drafter_progress(name, "0");
}

static bool get_status(client *c, wire_status *s)
{
    return client_status(c, s) == 0;
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

/* The hash a drafter logged when it synced into `epoch` (or 0), looked for from byte `from` of
 * its log on (a group created again counts its epochs from 1 again). */
static unsigned long long sync_hash(const char *log, unsigned long long epoch, size_t from)
{
    size_t len = 0;
    char *s = test_slurp(log, &len);
    if (!s) return 0;
    unsigned long long h = 0, e = 0, st = 0;
    int rank = 0, world = 0;
    for (char *p = s + (from < len ? from : len); (p = strstr(p, "group g epoch ")); p++)
        if (sscanf(p, "group g epoch %llu: rank %d of %d in sync at step %llu (state hash %llx)", &e,
                   &rank, &world, &st, &h) == 5 &&
            e == epoch)
            break;
        else
            h = 0;
    free(s);
    return h;
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: itest_group QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    queue_bin = argv[1];
    target_bin = argv[3];
    drafter_bin = argv[4];
    h_run_dirs(dir, rt, ep);
    char model[128], shard[128], qlog[128], tlog[128];
    snprintf(qlog, sizeof qlog, "%s/queue.log", dir);
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    CHECK_EQ_INT(h_make_training_set(argv[5], argv[6], argv[7], dir, model, shard), 0);
    if (check_failed) CHECK_DONE();

    char rtflag[160];
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    pid_t qp = -1;
    client *c = h_start_group_broker(queue_bin, dir, rt, ep, NULL, &qp);
    CHECK(c != NULL);
    if (!c) CHECK_DONE();
    wire_status s;
    /* da creates the group before db starts, so da is rank 0, the only rank that writes
     * checkpoints, in every phase (3b relies on db having none; started together, db was rank 0
     * about half the time and, with phase 1 past step 10 on a loaded machine, held the commit) */
    pid_t da = start_drafter("da");
    CHECK(wait_group(c, 1, 0, 30000, &s));
    pid_t db = start_drafter("db");
    /* both ranks in the group before any batch exists: every step is two wide */
    CHECK(wait_group(c, 2, 0, 30000, &s));
    CHECK(group_g(&s)->n_members == 2 && strcmp(group_g(&s)->members[0], "da") == 0);
    /* max_depth below the group's step is refused, with the reason (dflash-ctl exits 1) */
    char ctllog[128];
    snprintf(ctllog, sizeof ctllog, "%s/ctl.log", dir);
    char *set1[] = {argv[2], rtflag, "set", "max_depth=1", NULL};
    CHECK_EQ_INT(h_run_tool(set1, ctllog), 1);
    char *cl = test_slurp(ctllog, NULL);
    CHECK(cl && strstr(cl, "max-depth 1 is smaller than one step"));
    free(cl);
    /* --group with a mode that cannot train is bad configuration: exit 2 (was 1, as for a
     * fatal run-time error), with the reason */
    char vlog[128];
    snprintf(vlog, sizeof vlog, "%s/drafter-verify.log", dir);
    char *vg[] = {(char *)drafter_bin, "--verify", "--group", "g", "--name", "dv", rtflag,
                  "--backend", "host", NULL};
    CHECK_EQ_INT(h_run_tool(vg, vlog), 2);
    char *vl = test_slurp(vlog, NULL);
    CHECK(vl && strstr(vl, "cannot train in a group"));
    free(vl);
    /* a third rank that max-depth cannot hold (a step of 3 needs min-ready 1 - 1 + 3 slots) is
     * refused its join (Error FULL): exit 2, with the broker's reason; the group goes on */
    char *set2[] = {argv[2], rtflag, "set", "max_depth=2", NULL};
    CHECK_EQ_INT(h_run_tool(set2, ctllog), 0);
    pid_t dc = start_drafter("dc");
    CHECK_EQ_INT(h_wait_exit(dc, 30000), 2);
    char dclog[128];
    snprintf(dclog, sizeof dclog, "%s/drafter-dc.log", dir);
    char *dl = test_slurp(dclog, NULL);
    CHECK(dl && strstr(dl, "group g would have 3 ranks but max-depth is 2"));
    free(dl);
    char *set4[] = {argv[2], rtflag, "set", "max_depth=4", NULL};
    CHECK_EQ_INT(h_run_tool(set4, ctllog), 0);
    CHECK(wait_group(c, 2, 0, 5000, &s));
    pid_t tp = h_start_training_target(target_bin, model, shard, rt, 8, 128, tlog);

    /* 1. training in the group; each batch acked once */
    CHECK(wait_group(c, 2, 5, 60000, &s));
    printf("phase 1: %llu steps with world 2, %llu batches trained+committed, %llu acks\n",
           (unsigned long long)group_g(&s)->steps_done,
           (unsigned long long)(s.batches_trained + s.batches_committed),
           (unsigned long long)s.acks);
    CHECK_EQ_INT(s.acks, s.batches_trained + s.batches_committed);
    CHECK_EQ_INT(s.acks, 2 * group_g(&s)->steps_done);

    /* 2. SIGKILL db: da re-forms alone and continues */
    h_kill(db, SIGKILL);
    uint64_t done_before = group_g(&s)->steps_done;
    CHECK(wait_group(c, 1, done_before + 3, 30000, &s));
    CHECK_EQ_INT(client_pause(c), 0);
    const wire_group_stat *g = group_g(&s);
    printf("phase 2: db killed; da alone in epoch %llu, %llu steps done, %llu aborted\n",
           (unsigned long long)g->epoch, (unsigned long long)g->steps_done,
           (unsigned long long)g->steps_aborted);

    /* 3. db comes back: the group re-forms to world 2 at a step boundary, db syncs */
    db = start_drafter("db");
    CHECK(wait_group(c, 2, 0, 30000, &s));
    uint64_t epoch2 = group_g(&s)->epoch;
    char dalog[128], dblog[128];
    snprintf(dalog, sizeof dalog, "%s/drafter-da.log", dir);
    snprintf(dblog, sizeof dblog, "%s/drafter-db.log", dir);
    unsigned long long ha = 0, hb = 0;
    uint64_t end = h_now_ms() + 20000;
    while (h_now_ms() < end && (!(ha = sync_hash(dalog, epoch2, 0)) || !(hb = sync_hash(dblog, epoch2, 0))))
        h_sleep_ms(50);
    CHECK(ha != 0 && ha == hb);
    printf("phase 3: db rejoined: epoch %llu, world 2, both in sync with state hash %016llx\n",
           (unsigned long long)epoch2, ha);
    done_before = group_g(&s)->steps_done;
    CHECK_EQ_INT(client_resume(c), 0);
    CHECK(wait_group(c, 2, done_before + 3, 30000, &s));

    /* 3b. the whole group goes down (SIGKILL both) once rank 0 (da) has a committed checkpoint;
     * db, the rank without checkpoints, comes back first: it waits for da, which resumes from
     * its checkpoint, creates the group as rank 0 and gives db its state; the ledger keeps its
     * commits (only batches trained after da's checkpoint are redone) */
    end = h_now_ms() + 60000;
    while (h_now_ms() < end && (!get_status(c, &s) || s.committed_step < 10)) h_sleep_ms(50);
    CHECK(s.committed_step >= 10);
    CHECK_EQ_INT(client_pause(c), 0);
    /* both frozen first, so that neither outlives the other: a survivor of a few ms would see
     * the other's process end, tell the broker, and go on as rank 0 of the group (db then
     * writes a checkpoint of the group's model and is no longer the rank without one) */
    h_signal(da, SIGSTOP);
    h_signal(db, SIGSTOP);
    h_kill(da, SIGKILL);
    h_kill(db, SIGKILL);
    end = h_now_ms() + 20000; /* the broker expires both: the group is gone */
    while (h_now_ms() < end && (!get_status(c, &s) || group_g(&s))) h_sleep_ms(50);
    CHECK(group_g(&s) == NULL);
    uint64_t commit_before = s.committed_step, committed_before = s.batches_committed;
    size_t da_from = (size_t)test_file_size(dalog), db_from = (size_t)test_file_size(dblog);
    db = start_drafter_progress("db", "200");
    bool held = false;
    end = h_now_ms() + 30000;
    while (h_now_ms() < end && !held) {
        char *l = test_slurp(dblog, NULL);
        held = l && strstr(l, "newest committed checkpoint is at step");
        free(l);
        h_sleep_ms(50);
    }
    CHECK(held);
    /* its progress lines say it trains nothing and why (it printed "group g epoch 0 rank 0 of
     * 1: step 0, batches 0, 0 tokens/s, waiting for a step 0%", a rank of no group) */
    CHECK(h_wait_text_from(dblog, db_from, "group g: not training for ", 5000));
    CHECK(h_wait_text_from(dblog, db_from, "waiting to join group g (the broker: group g: the "
                                           "newest committed checkpoint is at step", 5000));
    char *dbl = test_slurp(dblog, NULL);
    CHECK(dbl && !strstr(dbl + db_from, "tokens/s"));
    char *line = dbl ? strstr(dbl + db_from, "group g: not training for ") : NULL;
    if (line) printf("phase 3b: db while held: %.*s\n", (int)strcspn(line, "\n"), line);
    free(dbl);
    CHECK(get_status(c, &s) && group_g(&s) == NULL); /* db did not create it */
    CHECK_EQ_INT(s.batches_committed, committed_before);
    da = start_drafter("da");
    CHECK(wait_group(c, 2, 0, 30000, &s));
    uint64_t epoch3 = group_g(&s)->epoch;
    ha = hb = 0;
    end = h_now_ms() + 20000;
    while (h_now_ms() < end && (!(ha = sync_hash(dalog, epoch3, da_from)) ||
                                     !(hb = sync_hash(dblog, epoch3, db_from))))
        h_sleep_ms(50);
    CHECK(ha != 0 && ha == hb);
    CHECK(get_status(c, &s));
    CHECK(s.committed_step >= commit_before);
    CHECK(s.batches_committed >= committed_before);
    char *qlg = test_slurp(qlog, NULL);
    unsigned long long created_at = 0, rewound = 0;
    for (char *p = qlg; p && (p = strstr(p, "group g created by da at step ")); p++)
        sscanf(p, "group g created by da at step %llu: %llu batches", &created_at, &rewound);
    free(qlg);
    CHECK(created_at >= commit_before);
    printf("phase 3b: whole group killed at committed step %llu; db back first waited; da "
           "created epoch %llu at step %llu (%llu batches trained after it redone), both in "
           "sync (%016llx)\n", (unsigned long long)commit_before, (unsigned long long)epoch3,
           created_at, rewound, ha);
    done_before = group_g(&s)->steps_done;
    CHECK_EQ_INT(client_resume(c), 0);

    /* 4. until nothing is left to do, then drain */
    end = h_now_ms() + 120000;
    while (h_now_ms() < end) {
        if (get_status(c, &s) && s.batches_total && s.batches_todo == 0 &&
            s.batches_trained + s.batches_committed + 1 >= 8 * s.batches_total) {
            g = group_g(&s);
            if (s.batches_trained + s.batches_committed == 8 * s.batches_total ||
                (g && !g->step_reserved))
                break;
        }
        h_sleep_ms(50);
    }
    CHECK_EQ_INT(s.batches_todo, 0);
    CHECK_EQ_INT(client_drain(c), 0);
    int rca = h_wait_exit(da, 60000), rcb = h_wait_exit(db, 60000), rct = h_wait_exit(tp, 30000);
    CHECK_EQ_INT(rca, 0);
    CHECK_EQ_INT(rcb, 0);
    CHECK_EQ_INT(rct, 0);
    CHECK(get_status(c, &s));
    uint64_t done = s.batches_trained + s.batches_committed;
    uint64_t total = 8 * s.batches_total; /* batches_total is per epoch; 8 epochs */
    printf("end: %llu of %llu batches trained (%llu committed at step %llu), %llu left over, "
           "%llu acks\n", (unsigned long long)done, (unsigned long long)total,
           (unsigned long long)s.batches_committed, (unsigned long long)s.committed_step,
           (unsigned long long)(s.batches_todo + s.batches_inflight), (unsigned long long)s.acks);
    CHECK_EQ_INT(total, 192);
    CHECK_EQ_INT(done + s.batches_todo + s.batches_inflight, total);
    CHECK(s.batches_todo + s.batches_inflight <= 1); /* < one step of two ranks */
    CHECK_EQ_INT(s.acks, done + rewound); /* the batches redone in 3b were acked twice */
    CHECK_EQ_INT(s.quarantined, 0);
    char *ql = test_slurp(qlog, NULL);
    CHECK(ql && !strstr(ql, "already trained"));
    free(ql);
    unsigned long long sa = 0, fa = 0, sb = 0, fb = 0;
    CHECK(h_final_hash(dalog, &sa, &fa));
    CHECK(h_final_hash(dblog, &sb, &fb));
    CHECK(sa == sb && fa == fb && fa != 0);
    CHECK_EQ_INT(s.committed_step, sa);
    printf("final: both ranks at step %llu with state hash %016llx\n", sa, fa);

    client_destroy(&c);
    CHECK_EQ_INT(h_stop(qp), 0);
    if (check_failed) fprintf(stderr, "logs kept in %s\n", dir);
    else h_rmdir(dir);
    CHECK_DONE();
}
