/* test_broker_steering: what the operator steers at run time (dflash-ctl set, pause, resume,
 * drain) survives a broker restart on the same journal, as docker-compose restarts a crashed
 * broker with the same command line (broker_dispatch without sockets, journal in a temp dir,
 * the broker destroyed and created again on it).
 *
 * What a user would notice if it broke:
 *   - a paused broker came back handing out work, and tuned values (min_ready, max_depth,
 *     lease_timeout_ms, ...) reverted to the configured ones: they are restored, each said in
 *     the log;
 *   - a value configured anew since it was set at run time (the operator edited the flags to
 *     keep it, or changed their mind) must not be overridden by the old runtime one: the
 *     configuration wins, and keeps winning at later restarts; runtime values that no longer fit
 *     the configuration (a min_ready above a max_depth lowered since: every claim would wait
 *     for ever) are dropped, the configuration runs;
 *   - a compaction of the journal (a snapshot) dropped the steering;
 *   - a draining broker stopped draining: it keeps draining (claims end at once while no target
 *     is registered, work requests are answered SHUTDOWN) until `resume`, which is journaled;
 *   - a drain outlived the deliberate stop that ends it (SIGTERM: broker_shutdown): a run started
 *     again on the journal (scripts/train's resume, `docker compose up`) would end at once. A
 *     pause outlives it.
 */
#include "check.h"
#include "broker_stub.h"
#include "err.h"
#include "ledger.h"
#include "policy.h"
#include "test_files.h"

#include <stdlib.h>

enum { TARGET_INC = 11, DRAFTER_INC = 22, POOL_INC = 111 };

static char dir[256], journal_path[300];
static int64_t configured_min_ready = 2, configured_max_depth = 90; /* the next start's flags */
static int64_t compact_bytes;
static const char *configured_shares = "";
static char said[16384]; /* the log of the last start */

static void tweak(queue_config *cfg)
{
    snprintf(cfg->journal, sizeof cfg->journal, "%s", journal_path);
    cfg->min_ready = configured_min_ready;
    cfg->max_depth = configured_max_depth;
    cfg->compact_bytes = compact_bytes;
    snprintf(cfg->shares, sizeof cfg->shares, "%s", configured_shares);
    log_set_level(LOG_INFO); /* the restore lines are INFO */
}

static void start_broker(void) { stub_broker_new(tweak); }

/* A (re)start of the broker on the journal, its log in said. */
static void restart(void)
{
    if (stub_b) stub_broker_free();
    stub_capture_log(start_broker, said, sizeof said);
    log_set_level(LOG_ERROR);
}

static int ctl(wire_type t)
{
    stub_init(t, WIRE_ROLE_CTL, 99);
    return stub_send("ctl-c-99");
}

/* dflash-ctl set with n key=value pairs. */
static int set(uint32_t n, const char *const kv[][2])
{
    stub_init(WIRE_SET_CONFIG, WIRE_ROLE_CTL, 99);
    stub_req.u.settings.n = n;
    for (uint32_t i = 0; i < n; i++) {
        snprintf(stub_req.u.settings.kv[i].key, WIRE_MAX_KEY, "%s", kv[i][0]);
        snprintf(stub_req.u.settings.kv[i].value, WIRE_MAX_VALUE, "%s", kv[i][1]);
    }
    return stub_send("ctl-c-99");
}

static int hello(const char *name, wire_role role, uint64_t inc)
{
    stub_init(WIRE_HELLO, role, inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", name);
    return stub_send(name);
}

static int work_request(void)
{
    stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, TARGET_INC);
    stub_req.u.pool_incarnation = POOL_INC;
    return stub_send("t");
}

static int claim(void)
{
    stub_init(WIRE_CLAIM, WIRE_ROLE_DRAFTER, DRAFTER_INC);
    return stub_send("d");
}

static void fresh_journal(void)
{
    if (stub_b) stub_broker_free();
    unlink(journal_path);
    configured_min_ready = 2;
    configured_max_depth = 90;
    compact_bytes = 0;
}

/* set + pause, restart with the same configuration: values and mode come back, and a pool
 * registered after the restart gets no work. */
static void test_set_and_pause_restored(void)
{
    fresh_journal();
    restart();
    const char *const kv[][2] = {{"min_ready", "4"}, {"max_depth", "50"},
                                 {"lease_timeout_ms", "7000"}, {"max_redeliveries", "5"},
                                 {"shares", "1"}, {"stats_interval_ms", "0"},
                                 {"log_level", "warn"}};
    CHECK_EQ_INT(set(7, kv), 0);
    CHECK_EQ_INT(ctl(WIRE_PAUSE), 0);

    restart();
    printf("restart after set + pause:\n%s", said);
    CHECK(strstr(said, "restored min_ready=4 from the journal (set at runtime; configured 2)"));
    CHECK(strstr(said, "restored max_depth=50 from the journal (set at runtime; configured 90)"));
    CHECK(strstr(said, "restored log_level=warn from the journal"));
    CHECK(strstr(said, " serving ") == NULL); /* in force at once: the start's INFO line is not */
    CHECK(strstr(said, "was paused before the restart: still paused; `dflash-ctl resume` to "
                       "continue"));
    wire_status s = stub_status();
    CHECK_EQ_INT(s.min_ready, 4);
    CHECK_EQ_INT(s.max_depth, 50);
    CHECK_EQ_INT(s.lease_timeout_ms, 7000);
    CHECK_EQ_INT(s.state, POLICY_PAUSED);
    const char *const get[][2] = {{"max_redeliveries", "5"}, {"shares", "1"},
                                  {"stats_interval_ms", "0"}};
    for (int i = 0; i < 3; i++) { /* set to the same value: the reply shows the one in force */
        CHECK_EQ_INT(set(1, &get[i]), 0);
        CHECK(strcmp(stub_rep.u.settings.kv[0].value, get[i][1]) == 0);
    }
    const char *const padded[][2] = {{"max_redeliveries", "05"}}; /* as it is in force: 5 */
    CHECK_EQ_INT(set(1, padded), 0);
    CHECK(strcmp(stub_rep.u.settings.kv[0].value, "5") == 0);

    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, TARGET_INC), 0);
    stub_pool("t", TARGET_INC, POOL_INC, 8);
    CHECK_EQ_INT(work_request(), DFLASH_EAGAIN); /* paused */
    CHECK_EQ_INT(stub_status().state, POLICY_PAUSED);
    CHECK_EQ_INT(ctl(WIRE_RESUME), 0);
    CHECK_EQ_INT(work_request(), 0);

    restart(); /* resume was journaled: running, the values still restored */
    CHECK(strstr(said, "was paused") == NULL);
    s = stub_status();
    CHECK_EQ_INT(s.state, POLICY_RUNNING);
    CHECK_EQ_INT(s.min_ready, 4);
}

/* A value configured anew since it was set at run time wins, and still wins at the next start
 * with the old configuration (the journal then holds what was in force). */
static void test_configuration_changed_wins(void)
{
    fresh_journal();
    restart();
    const char *const kv[][2] = {{"min_ready", "4"}, {"max_depth", "50"}};
    CHECK_EQ_INT(set(2, kv), 0);

    configured_min_ready = 3;
    restart();
    printf("restart with min_ready configured 3:\n%s", said);
    CHECK(strstr(said, "configured min_ready=3 replaces the runtime value 4: the configuration "
                       "changed since it was set"));
    CHECK(strstr(said, "restored max_depth=50"));
    wire_status s = stub_status();
    CHECK_EQ_INT(s.min_ready, 3);
    CHECK_EQ_INT(s.max_depth, 50);

    configured_min_ready = 2;
    restart();
    CHECK(strstr(said, "min_ready") == NULL);
    s = stub_status();
    CHECK_EQ_INT(s.min_ready, 2);
    CHECK_EQ_INT(s.max_depth, 50);
}

/* A restored min_ready above a max_depth configured lower since: the configured values run. */
static void test_restored_values_must_fit(void)
{
    fresh_journal();
    restart();
    const char *const kv[][2] = {{"min_ready", "60"}};
    CHECK_EQ_INT(set(1, kv), 0);
    configured_max_depth = 50;
    restart();
    printf("restart with max_depth configured 50:\n%s", said);
    CHECK(strstr(said, "restored min_ready=60"));
    CHECK(strstr(said, "do not fit the configuration now (min-ready 60 needs 60 ready slots"));
    wire_status s = stub_status();
    CHECK_EQ_INT(s.min_ready, 2);
    CHECK_EQ_INT(s.max_depth, 50);
}

/* Configured shares that do not fit the target's buckets are dropped when it registers: that
 * is no runtime change, so a restart after a pause does not "restore" the empty shares. */
static void test_dropped_shares_not_journaled(void)
{
    fresh_journal();
    configured_shares = "0.2,0.3,0.5";
    restart();
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, TARGET_INC), 0);
    stub_pool("t", TARGET_INC, POOL_INC, 8); /* one bucket: the shares are dropped */
    CHECK_EQ_INT(ctl(WIRE_PAUSE), 0);
    restart();
    configured_shares = "";
    CHECK(strstr(said, "shares") == NULL);
    CHECK(strstr(said, "still paused"));
}

/* A journal compacted (a snapshot) after set + pause keeps them. */
static void test_compaction_keeps_steering(void)
{
    fresh_journal();
    restart();
    const char *const kv[][2] = {{"min_ready", "5"}};
    CHECK_EQ_INT(set(1, kv), 0);
    CHECK_EQ_INT(ctl(WIRE_PAUSE), 0);
    uint64_t long_size = test_file_size(journal_path);

    compact_bytes = 1; /* the next start rewrites the journal as a snapshot */
    restart();
    compact_bytes = 0;
    CHECK(test_file_size(journal_path) < long_size);
    restart();
    CHECK(strstr(said, "restored min_ready=5"));
    wire_status s = stub_status();
    CHECK_EQ_INT(s.min_ready, 5);
    CHECK_EQ_INT(s.state, POLICY_PAUSED);
}

/* A drain survives a restart with the same semantics: claims end at once while no target is
 * registered (it exited at the drain), a target that registers gets SHUTDOWN. */
static void test_drain_survives(void)
{
    fresh_journal();
    restart();
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, TARGET_INC), 0);
    stub_pool("t", TARGET_INC, POOL_INC, 8);
    stub_make_ready("t", TARGET_INC, POOL_INC, 2);
    CHECK_EQ_INT(ctl(WIRE_DRAIN), 0);

    restart();
    printf("restart while draining:\n%s", said);
    CHECK(strstr(said, "was draining before the restart: still draining"));
    CHECK_EQ_INT(stub_status().state, POLICY_DRAINING);
    CHECK_EQ_INT(hello("d", WIRE_ROLE_DRAFTER, DRAFTER_INC), 0);
    CHECK_EQ_INT(claim(), DFLASH_ESHUTDOWN); /* no pool: drained */
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, TARGET_INC + 1), 0);
    stub_pool("t", TARGET_INC + 1, POOL_INC, 8);
    stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, TARGET_INC + 1);
    stub_req.u.pool_incarnation = POOL_INC;
    CHECK_EQ_INT(stub_send("t"), DFLASH_ESHUTDOWN);
    CHECK_EQ_INT(stub_status().state, POLICY_DRAINING);

    CHECK_EQ_INT(ctl(WIRE_RESUME), 0);
    restart();
    CHECK(strstr(said, "draining") == NULL);
    CHECK_EQ_INT(stub_status().state, POLICY_RUNNING);
    CHECK_EQ_INT(hello("d", WIRE_ROLE_DRAFTER, DRAFTER_INC), 0);
    CHECK_EQ_INT(claim(), DFLASH_EAGAIN); /* running: waits for a target */
}

/* A deliberate stop ends a drain (journaled); a pause stays. */
static void test_stop_ends_drain(void)
{
    fresh_journal();
    restart();
    CHECK_EQ_INT(ctl(WIRE_DRAIN), 0);
    broker_shutdown(stub_b);
    restart();
    CHECK(strstr(said, "draining") == NULL);
    CHECK_EQ_INT(stub_status().state, POLICY_RUNNING);
    CHECK_EQ_INT(hello("d", WIRE_ROLE_DRAFTER, DRAFTER_INC), 0);
    CHECK_EQ_INT(claim(), DFLASH_EAGAIN); /* running: waits for a target */

    CHECK_EQ_INT(ctl(WIRE_PAUSE), 0);
    broker_shutdown(stub_b);
    restart();
    CHECK(strstr(said, "was paused before the restart: still paused"));
    CHECK_EQ_INT(stub_status().state, POLICY_PAUSED);
}

/* A key given twice in one set (min_ready and min-ready are one) is refused, nothing changed
 * (defect: the last value counted and ctl printed "min_ready = 3" twice); a start-up setting is
 * refused saying so (it read "permission denied: heartbeat_ms: not live"). Also given twice in
 * a row, and an unknown log level (nothing else checks it: it would be taken and shown). */
static void test_set_refusals(void)
{
    fresh_journal();
    restart();
    const char *const twice[][2] = {{"min_ready", "3"}, {"max_depth", "40"}, {"min-ready", "4"}};
    CHECK_EQ_INT(set(3, twice), DFLASH_EINVAL);
    printf("set twice: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "given twice (3 and 4)") != NULL);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.min_ready, 2);
    CHECK_EQ_INT(s.max_depth, 90);
    const char *const adjacent[][2] = {{"min_ready", "3"}, {"min-ready", "4"}};
    CHECK_EQ_INT(set(2, adjacent), DFLASH_EINVAL);
    CHECK(strstr(stub_rep.u.error.message, "given twice (3 and 4)") != NULL);
    const char *const loud[][2] = {{"log_level", "loud"}};
    CHECK_EQ_INT(set(1, loud), DFLASH_EINVAL);
    printf("unknown log level: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "log-level: 'loud' unknown") != NULL);
    s = stub_status();
    CHECK_EQ_INT(s.min_ready, 2);
    const char *const startup[][2] = {{"heartbeat_ms", "500"}};
    CHECK_EQ_INT(set(1, startup), DFLASH_EDENIED);
    printf("start-up setting: %s\n", stub_rep.u.error.message);
    CHECK(strstr(stub_rep.u.error.message, "heartbeat_ms is a start-up setting") != NULL);
}

/* A damaged settings record (the decoder stops inside it: a key without its configured value)
 * is warned about and nothing of it is restored, not the mode or the values read before the
 * damage: the configuration runs, not paused. */
static void test_damaged_record(void)
{
    fresh_journal();
    restart();
    CHECK_EQ_INT(ctl(WIRE_PAUSE), 0);
    stub_broker_free();
    ledger_params prm = {journal_path, 0, true, 0};
    int err = 0;
    ledger *l = ledger_new(&prm, &err);
    CHECK(l != NULL);
    static const char bad[] = "mode\0paused\0min_ready\0" "7"; /* "7\0", no configured */
    if (l) CHECK_EQ_INT(ledger_set_settings(l, bad, sizeof bad), 0);
    ledger_destroy(&l);
    restart();
    printf("restart on a damaged settings record:\n%s", said);
    CHECK(strstr(said, "the journal's runtime settings record is damaged"));
    CHECK(strstr(said, "still paused") == NULL && strstr(said, "restored") == NULL);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.state, POLICY_RUNNING);
    CHECK_EQ_INT(s.min_ready, 2);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/test_broker_steering.XXXXXX", t && *t ? t : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    snprintf(journal_path, sizeof journal_path, "%s/queue.journal", dir);
    test_set_and_pause_restored();
    test_configuration_changed_wins();
    test_restored_values_must_fit();
    test_dropped_shares_not_journaled();
    test_compaction_keeps_steering();
    test_drain_survives();
    test_stop_ends_drain();
    test_set_refusals();
    test_damaged_record();
    if (stub_b) stub_broker_free();
    test_rmtree(dir);
    CHECK_DONE();
}
