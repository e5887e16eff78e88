/* itest_group_accumulate: gradient accumulation inside a data-parallel group (--group g
 * --accumulate 2 on two dflash-drafter processes, cpu backend, shm collective), from the real
 * broker and a real dflash-target, to the end of a small data set.
 *
 * Setup (in a temp dir): the tiny training set of itest_group (96 sequences), planned with
 * --token-budget 80 --max-seqs 4 into 42 batches for one epoch: 10 full group steps of
 * 2 ranks x 2 micro-steps and a last step of 1 micro-step (2 batches: the plan ends inside it).
 * dflash-queue (journal, lease 1.5 s, heartbeat 300 ms); drafters da then db.
 *   1. da creates the group (rank 0), db joins: world 2; a third drafter with another
 *      --accumulate (the default 1) is refused by the broker and exits 2, naming --accumulate,
 *      and the group does not re-form for it;
 *   2. the target plans one epoch; the group trains it to the end: the broker ends step 11
 *      inside it (its micro-step 1 can never be served) and both ranks close it with the
 *      micro-step they have;
 *   3. the drafters end with the plan (the broker has nothing more for them) and exit 0; a
 *      drain ends the target;
 *   4. a rank killed between micro-steps: a target for 3 epochs continues the plan (84 batches
 *      more), da resumes from its checkpoint and creates the group again, db joins; the broker
 *      is paused (and resumed) until a step is in flight with micro-step 0 reserved and both
 *      ranks' slots of it copied, then db is SIGKILLed: the step is aborted (its batches back
 *      to to-do) once the broker expires db (still paused), db comes back and joins, the
 *      broker resumes; drain at the end.
 * Checks (1-3): every one of the 42 batches trained and acked exactly once (acks == 42, none
 * "already trained" or "trained twice"), 11 group steps done and none aborted (= ceil(42 / 4)),
 * both ranks' final state at step 11 with the same hash, rank 0's final checkpoint committed
 * at step 11. (4): an aborted step in the broker's log; every batch of the 3 epochs trained
 * and acked exactly once but for at most one left over (< one micro-step of 2 ranks), none
 * trained twice; both ranks end with the same state hash.
 * Usage: itest_group_accumulate QUEUE TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

static char dir[64], ep[128], rt[128];
static const char *drafter_bin;

/* A drafter of group g named name with --accumulate acc; its log in drafter-NAME.log. */
static char *const *drafter_argv(const char *name, const char *acc)
{
    static char model[128], ckpt[128], nm[64], ac[16];
    static const char *extra[] = {"--group", "g", "--accumulate", ac, "--comm", "shm",
                                  "--comm-timeout-s", "5", "--lr", "3e-3", "--checkpoint-every",
                                  "4", "--timeout-ms", "1000", NULL};
    static h_drafter_cmd cmd;
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, name);
    snprintf(nm, sizeof nm, "%s", name);
    snprintf(ac, sizeof ac, "%s", acc);
    return h_training_drafter_argv(&cmd, drafter_bin, model, rt, nm, ckpt, 80, extra);
}

static uint32_t leased_total(const wire_status *s)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < s->n_buckets; b++) n += s->buckets[b].leased;
    return n;
}

/* Pauses the broker at a moment when group g has a step in flight with only micro-step 0
 * reserved and every slot of it copied (released): both ranks are between micro-steps (the
 * pause holds off micro-step 1). Resumes and pauses again until then; false after ms. */
static bool pause_between_micros(client *c, int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    for (int i = 0; h_now_ms() < end; i++) {
        if (client_resume(c) != 0) return false;
        h_sleep_ms(1 + i % 7);
        if (client_pause(c) != 0) return false;
        wire_status s;
        const wire_group_stat *g = NULL;
        uint64_t until = h_now_ms() + 2000; /* the reserved slots get copied while paused */
        while (h_now_ms() < until && client_status(c, &s) == 0 && (g = h_group(&s, "g")) &&
               g->step_reserved && g->micros == 1 && leased_total(&s) > 0)
            h_sleep_ms(5);
        if (g && g->step_reserved && g->micros == 1 && g->world == 2 && leased_total(&s) == 0)
            return true;
    }
    return false;
}

static pid_t start_drafter(const char *name)
{
    char log[128];
    snprintf(log, sizeof log, "%s/drafter-%s.log", dir, name);
    return h_spawn_logged(drafter_argv(name, "2"), log);
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: itest_group_accumulate QUEUE TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    const char *queue_bin = argv[1], *target_bin = argv[2];
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
    client *c = h_start_group_broker(queue_bin, dir, rt, ep, NULL, &qp);
    CHECK(c != NULL);
    if (!c) CHECK_DONE();
    wire_status s;

    /* 1. da is rank 0; db joins; dc, of another --accumulate, is refused and exits 2 */
    pid_t da = start_drafter("da");
    CHECK(h_wait_group(c, "g", 1, 0, 30000, &s));
    pid_t db = start_drafter("db");
    CHECK(h_wait_group(c, "g", 2, 0, 30000, &s));
    uint64_t epoch = h_group(&s, "g")->epoch;
    CHECK_EQ_INT(h_run_tool(drafter_argv("dc", "1"), dclog), 2);
    CHECK(h_wait_text(dclog, "every rank needs the group's --accumulate (ours: 1)", 0));
    CHECK(!h_wait_text(dclog, "every rank needs the group's drafter", 0)); /* not the shape advice */
    CHECK(h_wait_text(qlog, "dc refused: it accumulates 1 micro-steps a step, the group", 0));
    CHECK(client_status(c, &s) == 0 && h_group(&s, "g") && h_group(&s, "g")->epoch == epoch &&
          h_group(&s, "g")->world == 2);
    printf("phase 1: group g of da and db, --accumulate 2; dc (--accumulate 1) refused, exit 2\n");

    /* 2. one epoch of 42 batches: 10 steps of 4 and a last of 2 */
    pid_t tp = h_start_training_target(target_bin, model, shard, rt, 1, 80, tlog);
    uint64_t end = h_now_ms() + 180000;
    while (h_now_ms() < end &&
           !(client_status(c, &s) == 0 && s.batches_total &&
             s.batches_trained + s.batches_committed == s.batches_total))
        h_sleep_ms(100);
    CHECK_EQ_INT(s.batches_total, 42);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 42);
    /* the group may be gone already (its ranks end with the plan): the broker's log says */
    unsigned step[256], n[256];
    int steps = h_group_steps(qlog, "g", step, n, 256), full = 0;
    for (int i = 0; i < steps; i++) {
        CHECK_EQ_INT(step[i], (unsigned)i + 1); /* each step once, in order */
        full += n[i] == 4;
    }
    CHECK(!h_wait_text(qlog, "aborted", 0));
    printf("phase 2: 42 batches trained in %d group steps (%d of 4 batches), %llu acks\n", steps,
           full, (unsigned long long)s.acks);
    CHECK_EQ_INT(steps, 11);
    CHECK_EQ_INT(full, 10);
    CHECK(h_wait_text(qlog, "group g: step 11 ends with 1 of its 2 micro-steps (2 batches)",
                      10000));
    CHECK(h_wait_text(dalog, "group step 11 closes with 1 of its 2 micro-steps", 10000));
    CHECK(h_wait_text(dblog, "group step 11 closes with 1 of its 2 micro-steps", 10000));

    /* 3. the ranks end with the plan; the drain ends the target; all exit 0 */
    CHECK_EQ_INT(client_drain(c), 0);
    int rca = h_wait_exit(da, 60000), rcb = h_wait_exit(db, 60000), rct = h_wait_exit(tp, 30000);
    CHECK_EQ_INT(rca, 0);
    CHECK_EQ_INT(rcb, 0);
    CHECK_EQ_INT(rct, 0);
    CHECK(client_status(c, &s) == 0);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, 42);
    CHECK_EQ_INT(s.acks, 42);
    CHECK_EQ_INT(s.batches_todo + s.batches_inflight, 0);
    CHECK_EQ_INT(s.quarantined, 0);
    CHECK(!h_wait_text(qlog, "already trained", 0) && !h_wait_text(qlog, "trained twice", 0));
    unsigned long long sa = 0, fa = 0, sb = 0, fb = 0;
    CHECK(h_final_hash(dalog, &sa, &fa));
    CHECK(h_final_hash(dblog, &sb, &fb));
    CHECK(sa == 11 && sb == 11 && fa == fb && fa != 0);
    CHECK_EQ_INT(s.committed_step, 11);
    CHECK_EQ_INT(s.batches_committed, 42);
    printf("end: 42 batches committed once at step %llu; both ranks at step %llu with state "
           "hash %016llx\n", (unsigned long long)s.committed_step, sa, fa);

    /* 4. 3 epochs: da resumes and creates the group, db joins; db killed between micro-steps */
    char tlog2[128];
    snprintf(tlog2, sizeof tlog2, "%s/target2.log", dir);
    CHECK_EQ_INT(client_resume(c), 0); /* out of the drain of 3 */
    tp = h_start_training_target(target_bin, model, shard, rt, 3, 80, tlog2);
    /* the plan goes on once the target has registered it (a drafter before that hears that
     * the 1 epoch planned so far is trained, and ends) */
    CHECK(h_wait_text(tlog2, "registered pool", 30000));
    end = h_now_ms() + 30000;
    while (h_now_ms() < end &&
           !(client_status(c, &s) == 0 && s.batches_todo + s.batches_inflight > 0))
        h_sleep_ms(20);
    CHECK(s.batches_todo + s.batches_inflight > 0);
    size_t q_from = (size_t)test_file_size(qlog);
    CHECK_EQ_INT(client_pause(c), 0); /* da alone would train it all before db joins */
    da = start_drafter("da");
    CHECK(h_wait_group(c, "g", 1, 0, 30000, &s));
    db = start_drafter("db");
    CHECK(h_wait_group(c, "g", 2, 0, 60000, &s));
    CHECK(pause_between_micros(c, 60000));
    CHECK(client_status(c, &s) == 0 && h_group(&s, "g"));
    uint64_t killed_in = h_group(&s, "g") ? h_group(&s, "g")->step : 0;
    h_kill(db, SIGKILL); /* still paused: da waits for micro-step 1 until the broker expires db */
    char aborted[96];
    /* micro-step 0's 2 batches, copied by both ranks: back to to-do (micro-step 1 was never
     * reserved: the pause) */
    snprintf(aborted, sizeof aborted, "group g: step %llu aborted: 2 of its 2 batches go back",
             (unsigned long long)killed_in);
    CHECK(h_wait_text_from(qlog, q_from, aborted, 30000));
    printf("phase 4: db killed between the micro-steps of step %llu: the step aborted\n",
           (unsigned long long)killed_in);
    /* still paused while db comes back, so that da alone does not train what is left first */
    db = start_drafter("db");
    CHECK(h_wait_group(c, "g", 2, 0, 30000, &s));
    CHECK_EQ_INT(client_resume(c), 0);
    end = h_now_ms() + 180000;
    while (h_now_ms() < end) {
        if (client_status(c, &s) == 0 && s.batches_total == 42 && s.batches_todo == 0 &&
            s.batches_trained + s.batches_committed + 1 >= 3 * 42) {
            const wire_group_stat *g = h_group(&s, "g");
            if (s.batches_trained + s.batches_committed == 3 * 42 || (g && !g->step_reserved))
                break;
        }
        h_sleep_ms(100);
    }
    CHECK_EQ_INT(client_drain(c), 0);
    rca = h_wait_exit(da, 60000), rcb = h_wait_exit(db, 60000), rct = h_wait_exit(tp, 30000);
    CHECK_EQ_INT(rca, 0);
    CHECK_EQ_INT(rcb, 0);
    CHECK_EQ_INT(rct, 0);
    CHECK(client_status(c, &s) == 0);
    uint64_t done = s.batches_trained + s.batches_committed;
    printf("phase 4 end: %llu of %d batches trained, %llu left over, %llu acks\n",
           (unsigned long long)done, 3 * 42,
           (unsigned long long)(s.batches_todo + s.batches_inflight), (unsigned long long)s.acks);
    CHECK_EQ_INT(done + s.batches_todo + s.batches_inflight, 3 * 42);
    CHECK(s.batches_todo + s.batches_inflight <= 1);
    CHECK_EQ_INT(s.acks, done);
    CHECK_EQ_INT(s.quarantined, 0);
    CHECK(!h_wait_text(qlog, "already trained", 0) && !h_wait_text(qlog, "trained twice", 0));
    CHECK(h_final_hash(dalog, &sa, &fa));
    CHECK(h_final_hash(dblog, &sb, &fb));
    CHECK(sa == sb && fa == fb && fa != 0);
    CHECK_EQ_INT(s.committed_step, sa);

    client_destroy(&c);
    CHECK_EQ_INT(h_stop(qp), 0);
    if (check_failed) fprintf(stderr, "logs kept in %s\n", dir);
    else h_rmdir(dir);
    CHECK_DONE();
}
