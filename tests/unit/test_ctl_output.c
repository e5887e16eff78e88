/* test_ctl_output: what dflash-ctl prints, against a scripted fake broker (fake_broker.h) whose
 * status reply gives every field its own value: each one must land under its own name in
 * --json and in its own place in the table (a swapped or dropped field would otherwise pass
 * every test that reads only a few of them), the optional lines (the stop, the journal's
 * failure, the refusals, buckets, groups, orphans, peers) show exactly when their fields say so,
 * and each verb sends its own request and prints its answer: ping (healthy, stopping, a failing
 * journal: exit 1), peer (by name, PREFIX*, @target and @drafter, the prefix asked of the
 * broker; none: exit 1), set, pause / resume / drain, release (one, all, none, an old broker),
 * an error answer (exit 1) and a broker that does not answer (exit 2); watch prints each
 * announcement (stats, a ready slot, a config change), and exits 2 at once when the PUB
 * endpoint the broker names lies in no directory; names with bytes that are not printable
 * UTF-8 print as '?'. Runs the dflash-ctl binary
 * (../tools/dflash-ctl from the ctest working directory, or $DFLASH_CTL_BIN). */
#include "check.h"
#include "err.h"
#include "fake_broker.h"
#include "host_name.h"
#include "test_files.h"

#include <signal.h>

static char bin[512], outp[160];

/* Runs dflash-ctl ARGS against the fake; its stdout (blanks runs collapsed to one space, so
 * that the checks do not restate the table's column widths) into *out (malloc'd); returns its
 * exit status. */
static int ctl(const char *args, char **out)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --endpoint %s --timeout-ms 3000 %s >%s 2>/dev/null", bin,
             fb.endpoint, args, outp);
    int st = system(cmd);
    char *s = test_slurp(outp, NULL), *w = s;
    for (const char *r = s; *r; r++)
        if (!(*r == ' ' && w > s && w[-1] == ' ')) *w++ = *r;
    *w = 0;
    *out = s;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* CHECKs that out holds want, printing out when it does not. */
#define HAS(out, want)                                                                             \
    do {                                                                                           \
        bool has_ = strstr(out, want) != NULL;                                                     \
        CHECK(has_ && #want);                                                                      \
        if (!has_) fprintf(stderr, "  wanted: %s\n  in: %s\n", want, out);                         \
    } while (0)

static void set_status(const wire_status *s)
{
    pthread_mutex_lock(&fb.mu);
    fb.status = *s;
    pthread_mutex_unlock(&fb.mu);
}

/* A status of a stopping, paused broker with a failing journal: every number its own. */
static void full_status(wire_status *s)
{
    memset(s, 0, sizeof *s);
    s->uptime_ms = 123456;
    s->state = WIRE_STATE_PAUSED;
    s->min_ready = 11, s->max_depth = 12, s->lease_timeout_ms = 13000;
    s->tv_distance = 0.125, s->claims_per_s = 2.5;
    s->grants = 101, s->releases = 102, s->lease_expiries = 103, s->redeliveries = 104;
    s->quarantined = 105, s->malformed = 106, s->acks = 107;
    s->batches_todo = 108, s->batches_inflight = 109, s->batches_trained = 110;
    s->batches_committed = 111, s->batches_total = 112, s->committed_step = 113;
    s->peers = 14, s->epoch = 15, s->slot_count = 16;
    s->hellos_refused_full = 201, s->replies_dropped = 202, s->key_refusals = 203;
    s->connections_refused = 204, s->steering_refused = 205;
    s->n_buckets = 2;
    s->buckets[0] = (wire_bucket_stat){512, 0.25, 21, 22, 23, 1.5, 301, 302, 303, 304};
    s->buckets[1] = (wire_bucket_stat){2048, 0.75, 31, 32, 33, -0.5, 401, 402, 403, 404};
    snprintf(s->journal_error, sizeof s->journal_error, "no space left on device");
    s->n_groups = 1;
    wire_group_stat *g = &s->groups[0];
    snprintf(g->name, sizeof g->name, "g1");
    g->state = WIRE_GROUP_ACTIVE;
    g->epoch = 41, g->world = 2, g->step = 42, g->pending = 43, g->steps_done = 44;
    g->steps_aborted = 45, g->micros = 3, g->accumulate = 4, g->step_reserved = true;
    g->n_members = 2;
    snprintf(g->members[0], sizeof g->members[0], "d0");
    snprintf(g->members[1], sizeof g->members[1], "d1");
    s->n_orphans = 1;
    s->orphans[0] = (wire_orphan_stat){"g0", 51, 52, 5300, 5400};
    s->stopping = true;
    s->stop = (wire_stop_stat){8000, 2500, 1, 2, 3, 4, "drafter d0 (1 lease)"};
    s->n_peer_list = 3;
    s->peer_list[0] = (wire_peer_stat){"target-h.1", WIRE_ROLE_TARGET, 1500, 0, 0, 61, false};
    s->peer_list[1] = (wire_peer_stat){"drafter-h.2-7", WIRE_ROLE_DRAFTER, 250, 62, 63, 0, true};
    s->peer_list[2] = (wire_peer_stat){"drafter-h.3-8", WIRE_ROLE_DRAFTER, 64000, 65, 66, 0, false};
    s->peers_unlisted = 67;
}

static void test_status_json(void)
{
    wire_status s;
    full_status(&s);
    set_status(&s);
    char *o;
    CHECK_EQ_INT(ctl("--json status", &o), 0);
    HAS(o, "\"state\":\"stopping\",\"mode\":\"paused\"");
    HAS(o, "\"stopping\":{\"grace_ms\":8000,\"elapsed_ms\":2500,\"drafters\":1,\"leases\":2,"
           "\"held\":3,\"reports\":4,\"left_ms\":5500,\"waiting_for\":\"drafter d0 (1 lease)\"}");
    const char *top[] = {
        "\"uptime_ms\":123456", "\"min_ready\":11", "\"max_depth\":12",
        "\"lease_timeout_ms\":13000", "\"tv_distance\":0.125", "\"claims_per_s\":2.5",
        "\"grants\":101", "\"releases\":102", "\"lease_expiries\":103", "\"redeliveries\":104",
        "\"quarantined\":105", "\"malformed\":106", "\"acks\":107", "\"batches_todo\":108",
        "\"batches_inflight\":109", "\"batches_trained\":110", "\"batches_committed\":111",
        "\"batches_total\":112", "\"committed_step\":113", "\"peers\":14", "\"epoch\":15",
        "\"slot_count\":16", "\"hellos_refused_full\":201", "\"replies_dropped\":202",
        "\"key_refusals\":203", "\"connections_refused\":204", "\"steering_refused\":205",
        "\"journal_error\":\"no space left on device\"", "\"incarnation\":\"0000000000000b0b\""};
    for (size_t i = 0; i < sizeof top / sizeof *top; i++) HAS(o, top[i]);
    HAS(o, "\"buckets\":[{\"upper\":512,\"share\":0.25,\"ready\":21,\"leased\":22,\"filling\":23,"
           "\"deficit\":1.5,\"produced\":301,\"consumed\":302,\"produced_tokens\":303,"
           "\"consumed_tokens\":304},{\"upper\":2048,\"share\":0.75,\"ready\":31,\"leased\":32,"
           "\"filling\":33,\"deficit\":-0.5,\"produced\":401,\"consumed\":402,"
           "\"produced_tokens\":403,\"consumed_tokens\":404}]");
    HAS(o, "\"groups\":[{\"name\":\"g1\",\"state\":\"active\",\"epoch\":41,\"world\":2,\"step\":42,"
           "\"pending\":43,\"steps_done\":44,\"steps_aborted\":45,\"micros\":3,\"accumulate\":4,"
           "\"step_reserved\":true,\"members\":[\"d0\",\"d1\"]}]");
    HAS(o, "\"orphans\":[{\"group\":\"g0\",\"step\":51,\"batches\":52,\"held_ms\":5300,"
           "\"abort_in_ms\":5400}]");
    HAS(o, "\"peer_list\":[{\"name\":\"target-h.1\",\"role\":\"target\",\"heard_ms_ago\":1500,"
           "\"leases\":0,\"held\":0,\"slots\":61,\"trains\":false},{\"name\":\"drafter-h.2-7\","
           "\"role\":\"drafter\",\"heard_ms_ago\":250,\"leases\":62,\"held\":63,\"slots\":0,"
           "\"trains\":true},{\"name\":\"drafter-h.3-8\",\"role\":\"drafter\",\"heard_ms_ago\":"
           "64000,\"leases\":65,\"held\":66,\"slots\":0,\"trains\":false}],\"peers_unlisted\":67");
    CHECK(strchr(o, '\n') == strrchr(o, '\n')); /* one line */
    free(o);

    /* a running broker, not stopping, journal healthy; the other run and group states */
    s.stopping = false;
    s.state = WIRE_STATE_DRAINING;
    s.journal_error[0] = 0;
    s.groups[0].state = WIRE_GROUP_REFORMING;
    set_status(&s);
    CHECK_EQ_INT(ctl("--json status", &o), 0);
    HAS(o, "\"state\":\"draining\",\"mode\":\"draining\",\"stopping\":null");
    HAS(o, "\"journal_error\":\"\"");
    HAS(o, "\"name\":\"g1\",\"state\":\"re-forming\"");
    free(o);
}

static void test_status_table(void)
{
    wire_status s;
    full_status(&s);
    set_status(&s);
    char *o;
    CHECK_EQ_INT(ctl("status", &o), 0);
    HAS(o, "broker 0000000000000b0b stopping up 123.5 s 14 peers 16 slots\n");
    HAS(o, "\nstate stopping (grace 8000 ms, 5.5 s left; waiting for: drafter d0 (1 lease)): no "
           "new leases or work\n");
    HAS(o, "\nsettings min_ready 11 max_depth 12 lease 13000 ms\n");
    HAS(o, "\nledger epoch 15 (112 batches an epoch) over all epochs: todo 108 in flight 109 "
           "trained 110 committed 111 (step 113) quarantined 105\n");
    HAS(o, "\nleases grants 101 releases 102 expiries 103 redeliveries 104 claims/s 2.5 acks "
           "107\n");
    HAS(o, "\nhealth mix TV distance 0.1250 malformed messages 106 journal FAILING\n");
    HAS(o, "\nJOURNAL no space left on device: nothing since is durable");
    HAS(o, "\nrefused hellos (peer table full) 201 replies dropped (journal wait) 202 key "
           "refusals (another CURVE key) 203 connections (key not allowed) 204 steering (not an "
           "admin key) 205\n");
    HAS(o, "\nbucket share ready leased filling deficit produced consumed tok.prod tok.cons\n"
           "<=512 0.250 21 22 23 1.50 301 302 303 304\n"
           "<=2048 0.750 31 32 33 -0.50 401 402 403 404\n");
    HAS(o, "\ngroup state epoch world step micro pending done aborted members (rank order)\n"
           "g1 active 41 2 42* 3/4 43 44 45 d0 d1\n");
    HAS(o, "\norphaned step batches held s abort in s (every rank expired mid-step: the group's "
           "creator resolves it)\ng0 51 52 5.3 5.4\n");
    HAS(o, "\n\npeer role heard s leases held slots trains\n"
           "target-h.1 target 1.5 - - 61 -\n"
           "drafter-h.2-7 drafter 0.2 62 63 - yes\n"
           "drafter-h.3-8 drafter 64.0 65 66 - no\n"
           "(and 67 more live targets and drafters, not listed)\n");
    free(o);

    /* nothing optional: no stop line, journal ok, no refusals, no tables; a group step not
     * reserved, without --accumulate */
    s.stopping = false;
    s.state = WIRE_STATE_RUNNING;
    s.journal_error[0] = 0;
    s.hellos_refused_full = s.replies_dropped = s.key_refusals = 0;
    s.connections_refused = s.steering_refused = 0;
    s.n_buckets = s.n_orphans = s.n_peer_list = 0;
    s.groups[0].step_reserved = false;
    s.groups[0].accumulate = 1;
    s.groups[0].state = WIRE_GROUP_FORMING;
    set_status(&s);
    CHECK_EQ_INT(ctl("status", &o), 0);
    HAS(o, "broker 0000000000000b0b running up 123.5 s");
    HAS(o, "journal ok\n");
    HAS(o, "\ng1 forming 41 2 42 - 43 44 45 d0 d1\n");
    CHECK(!strstr(o, "\nstate ") && !strstr(o, "JOURNAL") && !strstr(o, "refused") &&
          !strstr(o, "bucket") && !strstr(o, "orphaned") && !strstr(o, "\npeer "));
    free(o);
    /* each refusal count alone shows the line */
    uint64_t *counts[] = {&s.hellos_refused_full, &s.replies_dropped, &s.key_refusals,
                          &s.connections_refused, &s.steering_refused};
    for (int i = 0; i < 5; i++) {
        *counts[i] = 7;
        set_status(&s);
        CHECK_EQ_INT(ctl("status", &o), 0);
        CHECK(strstr(o, "\nrefused hellos") != NULL);
        free(o);
        *counts[i] = 0;
    }
}

/* Names are a peer's to choose, any bytes: what ctl prints of them is printable (log_printable:
 * '?' for a control character or a byte that is not UTF-8), so --json stays valid JSON and the
 * table carries no terminal escape (defect: both printed the bytes raw). */
static void test_untrusted_names(void)
{
    wire_status s;
    full_status(&s);
    snprintf(s.peer_list[1].name, sizeof s.peer_list[1].name, "d\xff\"q");
    snprintf(s.groups[0].name, sizeof s.groups[0].name, "g\xfe");
    snprintf(s.groups[0].members[0], sizeof s.groups[0].members[0], "m\x1b[31m");
    snprintf(s.orphans[0].group, sizeof s.orphans[0].group, "o\x01");
    snprintf(s.stop.waiting_for, sizeof s.stop.waiting_for, "drafter \xc2\x9b (1 lease)");
    set_status(&s);
    const char *cmds[] = {"--json status", "status", "--json peer d*", "peer d*"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char *o;
        CHECK_EQ_INT(ctl(cmds[i], &o), 0);
        bool clean = true;
        for (const unsigned char *p = (const unsigned char *)o; *p; p++)
            if (*p >= 0x80 || (*p < 0x20 && *p != '\n')) clean = false;
        CHECK(clean);
        if (!clean) fprintf(stderr, "  %s printed: %s\n", cmds[i], o);
        HAS(o, strstr(cmds[i], "json") ? "d?\\\"q" : "d?\"q");
        if (strstr(cmds[i], "status")) {
            HAS(o, "g?");
            HAS(o, "m?[31m");
            HAS(o, "o?");
            HAS(o, "drafter ?? (1 lease)");
        }
        free(o);
    }
}

static void test_ping(void)
{
    wire_status s;
    memset(&s, 0, sizeof s);
    set_status(&s);
    char *o, want[300];
    CHECK_EQ_INT(ctl("ping", &o), 0);
    snprintf(want, sizeof want, "ok: dflash-queue 0000000000000b0b at %s\n", fb.endpoint);
    HAS(o, want);
    free(o);
    CHECK_EQ_INT(ctl("--json ping", &o), 0);
    HAS(o, "{\"ok\":true,\"incarnation\":\"0000000000000b0b\",\"stopping\":null}");
    free(o);
    CHECK_EQ_INT(fake_last().type, WIRE_STATUS_REQUEST);
    /* stopping is healthy (exit 0), and said */
    s.stopping = true;
    s.stop = (wire_stop_stat){8000, 8000, 0, 0, 0, 0, ""};
    set_status(&s);
    CHECK_EQ_INT(ctl("ping", &o), 0);
    HAS(o, "; stopping (grace 8000 ms, 0.0 s left; settled: exiting)\n");
    free(o);
    /* a drafter it waits for with no lease (its report): still waiting */
    s.stop = (wire_stop_stat){8000, 1000, 1, 0, 0, 1, "drafter d (a report)"};
    set_status(&s);
    CHECK_EQ_INT(ctl("ping", &o), 0);
    HAS(o, "; stopping (grace 8000 ms, 7.0 s left; waiting for: drafter d (a report))\n");
    free(o);
    /* a failing journal is not */
    snprintf(s.journal_error, sizeof s.journal_error, "disk gone");
    set_status(&s);
    CHECK_EQ_INT(ctl("--json ping", &o), 1);
    HAS(o, "\"ok\":false,\"verb\":\"ping\",\"error\":\"IO\"");
    HAS(o, "the broker's journal failed: disk gone");
    free(o);
}

static void test_verbs(void)
{
    char *o;
    CHECK_EQ_INT(ctl("set min_ready=5 max_depth=9", &o), 0);
    HAS(o, "min_ready = applied\nmax_depth = applied\n");
    free(o);
    wire_msg m = fake_last();
    CHECK_EQ_INT(m.type, WIRE_SET_CONFIG);
    CHECK(m.u.settings.n == 2 && strcmp(m.u.settings.kv[1].value, "9") == 0);
    CHECK_EQ_INT(ctl("--json set min_ready=5", &o), 0);
    HAS(o, "{\"ok\":true,\"min_ready\":\"applied\"}");
    free(o);
    const char *verbs[] = {"pause", "resume", "drain"};
    wire_type types[] = {WIRE_PAUSE, WIRE_RESUME, WIRE_DRAIN};
    for (int i = 0; i < 3; i++) {
        char args[32], want[64];
        snprintf(args, sizeof args, "%s", verbs[i]);
        CHECK_EQ_INT(ctl(args, &o), 0);
        snprintf(want, sizeof want, "%s: ok\n", verbs[i]);
        HAS(o, want);
        free(o);
        CHECK_EQ_INT(fake_last().type, types[i]);
        snprintf(args, sizeof args, "--json %s", verbs[i]);
        CHECK_EQ_INT(ctl(args, &o), 0);
        snprintf(want, sizeof want, "{\"ok\":true,\"verb\":\"%s\"}", verbs[i]);
        HAS(o, want);
        free(o);
    }
    /* release: one batch, all (the broker's count), none */
    CHECK_EQ_INT(ctl("release 1/2/3", &o), 0);
    HAS(o, "released batch 1/2/3: back to to-do\n");
    free(o);
    m = fake_last();
    CHECK(m.type == WIRE_RELEASE_QUARANTINE && !m.u.release_q.all && m.u.release_q.unit.epoch == 1 &&
          m.u.release_q.unit.bucket == 2 && m.u.release_q.unit.index == 3);
    CHECK_EQ_INT(ctl("release all", &o), 0);
    HAS(o, "released 333 quarantined batches: back to to-do\n");
    free(o);
    CHECK(fake_last().u.release_q.all);
    CHECK_EQ_INT(ctl("--json release all", &o), 0);
    HAS(o, "{\"ok\":true,\"verb\":\"release\",\"released\":333}");
    free(o);
    /* an error answer: exit 1, its code and message (to the hello as to the verb); an old
     * broker's PROTO to release: said as such */
    wire_error denied = {.code = DFLASH_EDENIED, .message = "not an admin key"};
    fake_answer_error(denied, WIRE_PAUSE);
    CHECK_EQ_INT(ctl("--json pause", &o), 1);
    HAS(o, "{\"ok\":false,\"verb\":\"pause\",\"error\":\"DENIED\",\"message\":\"not an admin key\"}");
    free(o);
    CHECK_EQ_INT(fake_last().type, WIRE_PAUSE);
    fake_answer_error(denied, WIRE_NONE);
    CHECK_EQ_INT(ctl("--json status", &o), 1);
    HAS(o, "\"verb\":\"status\",\"error\":\"DENIED\"");
    free(o);
    CHECK_EQ_INT(fake_last().type, WIRE_HELLO);
    fake_answer_error((wire_error){.code = DFLASH_EPROTO}, WIRE_RELEASE_QUARANTINE);
    CHECK_EQ_INT(ctl("--json release all", &o), 1);
    HAS(o, "\"error\":\"PROTO\",\"message\":\"this broker predates release");
    free(o);
    fake_reset();
    /* release all with nothing quarantined */
    pthread_mutex_lock(&fb.mu);
    fb.ok_value = 0;
    pthread_mutex_unlock(&fb.mu);
    CHECK_EQ_INT(ctl("release all", &o), 0);
    HAS(o, "released 0: no batch is quarantined\n");
    free(o);
    fake_reset();
    /* no answer: exit 2 */
    fake_silence(WIRE_NONE);
    char cmd[768];
    snprintf(cmd, sizeof cmd, "%s --endpoint %s --timeout-ms 200 status >/dev/null 2>&1", bin,
             fb.endpoint);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    fake_reset();
}

/* Runs `dflash-ctl ARGS` in the background while announcing status, ready and config in turn
 * on a PUB socket the fake's hello names, until it exits (ARGS has --count 3: three in a row,
 * one of each, whichever comes first) or 20 s pass; its stdout as ctl() gives it. */
static int watch_with_announcements(const char *args, char **out)
{
    char ep[160], cmd[1024];
    snprintf(ep, sizeof ep, "ipc://%s/pub.sock", fb.dir);
    void *pub = zmq_socket(fb.zctx, ZMQ_PUB);
    int zero = 0;
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof zero);
    CHECK_EQ_INT(zmq_bind(pub, ep), 0);
    pthread_mutex_lock(&fb.mu);
    snprintf(fb.pub_endpoint, sizeof fb.pub_endpoint, "%s", ep);
    pthread_mutex_unlock(&fb.mu);
    static wire_msg stats, ready, cfg;
    wire_msg_init(&stats, WIRE_STATUS_REPLY, WIRE_ROLE_BROKER, 0xb0b, 0);
    full_status(&stats.u.status);
    wire_msg_init(&ready, WIRE_SLOT_READY, WIRE_ROLE_BROKER, 0xb0b, 0);
    ready.u.ready = (wire_slot_ready){0xfeed, 5, {6, 1, 2}, 100, 3};
    wire_msg_init(&cfg, WIRE_SET_CONFIG_REPLY, WIRE_ROLE_BROKER, 0xb0b, 0);
    cfg.u.settings.n = 1;
    snprintf(cfg.u.settings.kv[0].key, WIRE_MAX_KEY, "min_ready");
    snprintf(cfg.u.settings.kv[0].value, WIRE_MAX_VALUE, "4");
    snprintf(cmd, sizeof cmd, "exec %s --endpoint %s --timeout-ms 3000 %s >%s 2>/dev/null", bin,
             fb.endpoint, args, outp);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0);
    int st = -1;
    double t0 = monotime_s();
    for (int i = 0; pid > 0 && monotime_s() - t0 < 20; i++) {
        const char *topic[] = {"stats", "ready", "config"};
        const wire_msg *m[] = {&stats, &ready, &cfg};
        fake_pub_send(pub, topic[i % 3], m[i % 3]);
        monotime_sleep_ms(i % 3 == 2 ? 30 : 0);
        if (waitpid(pid, &st, WNOHANG) == pid) break;
    }
    if (waitpid(pid, &st, WNOHANG) == 0) { /* still running: fail, and do not leave it */
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    zmq_close(pub);
    snprintf(cmd, sizeof cmd, "%s/pub.sock", fb.dir);
    unlink(cmd);
    fake_reset();
    char *s = test_slurp(outp, NULL), *w = s;
    for (const char *r = s; *r; r++)
        if (!(*r == ' ' && w > s && w[-1] == ' ')) *w++ = *r;
    *w = 0;
    *out = s;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* watch: each announcement as its line (or JSON object); a PUB endpoint in a directory that
 * is not there is exit 2 at once, with the flag to look at. */
static void test_watch(void)
{
    char *o;
    CHECK_EQ_INT(watch_with_announcements("--count 3 watch", &o), 0);
    HAS(o, "stats stopping ready 21 31 leased 54 claims/s 2.5 TV 0.1250 trained 110 committed "
           "111\n");
    HAS(o, "ready slot 5 batch 6/1/2 100 tokens\n");
    HAS(o, "config min_ready=4\n");
    int lines = 0;
    for (const char *q = o; *q; q++) lines += *q == '\n';
    CHECK_EQ_INT(lines, 3); /* --count 3: three announcements, then exit */
    free(o);
    CHECK_EQ_INT(watch_with_announcements("--json --count 3 watch", &o), 0);
    HAS(o, "\"state\":\"stopping\",\"mode\":\"paused\"");
    HAS(o, "\"steering_refused\":205");
    HAS(o, "\"topic\":\"stats\"}");
    HAS(o, "{\"topic\":\"ready\",\"slot\":5,\"epoch\":6,\"bucket\":1,\"index\":2,\"n_tokens\":100}");
    HAS(o, "{\"topic\":\"config\",\"min_ready\":\"4\"}");
    free(o);
    /* the fake's default hello names ipc:///nonexistent/pub.sock */
    double t0 = monotime_s();
    CHECK_EQ_INT(ctl("--timeout-ms 20000 --json watch", &o), 2);
    CHECK(monotime_s() - t0 < 10); /* at once, not after the request timeout */
    HAS(o, "\"verb\":\"watch\",\"error\":\"PEER\"");
    HAS(o, "--pub-endpoint");
    free(o);
}

/* The peer prefix the last request asked the broker to list. */
static void asked_prefix(const char *want)
{
    wire_msg m = fake_last();
    CHECK(m.type == WIRE_STATUS_REQUEST && strcmp(m.u.peer_prefix, want) == 0);
    if (strcmp(m.u.peer_prefix, want) != 0)
        fprintf(stderr, "  asked for '%s', want '%s'\n", m.u.peer_prefix, want);
}

/* peer NAME / PREFIX* / @target / @drafter: the broker is asked to list the names that start
 * so, and the rows of those that are it are printed, exit 0; none, exit 1 saying so; no name,
 * or two: refused before asking (exit 1). (The fake lists every peer whatever it is asked: the
 * names' '.' is in no host part, so no host's defaults match them.) */
static void test_peer(void)
{
    wire_status s;
    full_status(&s);
    set_status(&s);
    char *o;
    CHECK_EQ_INT(ctl("peer target-h.1", &o), 0);
    HAS(o, "peer role heard s leases held slots trains\ntarget-h.1 target 1.5 - - 61 -\n");
    CHECK(!strstr(o, "drafter"));
    asked_prefix("target-h.1");
    free(o);
    CHECK_EQ_INT(ctl("peer 'drafter-*'", &o), 0);
    HAS(o, "\ndrafter-h.2-7 drafter 0.2 62 63 - yes\ndrafter-h.3-8 drafter 64.0 65 66 - no\n");
    CHECK(!strstr(o, "target-h.1"));
    asked_prefix("drafter-");
    free(o);
    CHECK_EQ_INT(ctl("--json peer 'drafter-h.3*'", &o), 0);
    HAS(o, "{\"ok\":true,\"peers\":[{\"name\":\"drafter-h.3-8\",\"role\":\"drafter\"");
    CHECK(!strstr(o, "drafter-h.2-7"));
    free(o);
    /* a name that is only a prefix of a listed one is not it; nor is a missing one */
    CHECK_EQ_INT(ctl("peer target-h", &o), 1);
    free(o);
    CHECK_EQ_INT(ctl("--json peer drafter-h.9", &o), 1);
    HAS(o, "\"ok\":false,\"verb\":\"peer\",\"error\":\"NOTFOUND\"");
    HAS(o, "the broker lists no live target or drafter named drafter-h.9");
    free(o);
    CHECK_EQ_INT(ctl("peer", &o), 1);
    free(o);
    CHECK_EQ_INT(ctl("peer a b", &o), 1);
    free(o);
    /* @target and @drafter: this host's daemons by their default names (host_name.h); a
     * drafter's is its prefix and digits (another host's "<host>-2" shares the prefix) */
    CHECK_EQ_INT(ctl("peer @target", &o), 1);
    free(o);
    CHECK_EQ_INT(ctl("peer @drafter", &o), 1);
    free(o);
    char target[HOST_NAME_TARGET_MAX], prefix[HOST_NAME_DRAFTER_MAX];
    host_name_target(target, sizeof target);
    host_name_drafter_prefix(prefix, sizeof prefix);
    snprintf(s.peer_list[0].name, sizeof s.peer_list[0].name, "%s", target);
    snprintf(s.peer_list[1].name, sizeof s.peer_list[1].name, "%s2-77", prefix);
    set_status(&s);
    CHECK_EQ_INT(ctl("peer @drafter", &o), 1); /* "<prefix>2-77": another host's */
    asked_prefix(prefix);
    free(o);
    snprintf(s.peer_list[2].name, sizeof s.peer_list[2].name, "%s4242", prefix);
    set_status(&s);
    CHECK_EQ_INT(ctl("peer @target", &o), 0);
    HAS(o, target);
    CHECK(!strstr(o, "drafter"));
    asked_prefix(target);
    free(o);
    CHECK_EQ_INT(ctl("--json peer @drafter", &o), 0);
    HAS(o, s.peer_list[2].name);
    CHECK(!strstr(o, s.peer_list[1].name));
    free(o);
    /* an older broker lists nobody: not found */
    s.n_peer_list = s.peers_unlisted = 0;
    set_status(&s);
    CHECK_EQ_INT(ctl("peer 'target-*'", &o), 1);
    free(o);
}

int main(void)
{
    const char *env = getenv("DFLASH_CTL_BIN");
    snprintf(bin, sizeof bin, "%s", env ? env : "../tools/dflash-ctl");
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "dflash-ctl not found at %s (set DFLASH_CTL_BIN)\n", bin);
        return 1;
    }
    fake_start();
    snprintf(outp, sizeof outp, "%s/out", fb.dir);
    test_status_json();
    test_status_table();
    test_untrusted_names();
    test_ping();
    test_peer();
    test_verbs();
    test_watch();
    unlink(outp);
    fake_stop();
    CHECK_DONE();
}
