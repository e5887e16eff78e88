/* itest_live_set: `dflash-ctl set min_ready=30 max_depth=90` changes the broker's behaviour
 * while it runs: before, the target gets FULL after 4 work units and a drafter is served while
 * 2 slots are ready; after, the target fills 90 slots and claims stop when 29 are left ready.
 * `dflash-ctl --json watch` started before the change sees the config announcement. Then
 * `dflash-ctl pause`, and the broker is killed (SIGKILL) and started again with the same
 * command line, as docker-compose restarts it: it is still paused with min_ready 30 and
 * max_depth 90 (journaled), and runs again after `dflash-ctl resume`. A drain outlives a
 * SIGKILL too, but a SIGTERM (a deliberate stop) ends it: the broker started next runs. A
 * `dflash-ctl watch` goes on across a broker restarted with another --pub-endpoint. */
#include "check.h"
#include "harness.h"

#include <stdbool.h>

static int run_ctl(const char *ctl, const char *dir, const char *a, const char *b, const char *c)
{
    char rt[128];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    char *argv[] = {(char *)ctl, rt, (char *)a, (char *)b, (char *)c, NULL};
    pid_t pid = h_spawn(argv, NULL);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Asks for work until FULL; makes each unit ready. Returns how many units it got. */
static int fill(client *t, uint64_t inc)
{
    int n = 0;
    wire_work_unit wu;
    int rc;
    while ((rc = client_request_work(t, inc, &wu)) == 0) {
        wire_slot_ready r = {inc, wu.slot, wu.unit, 100, 1};
        if (client_slot_ready(t, &r)) return -1;
        n++;
    }
    CHECK_EQ_INT(rc, DFLASH_EFULL);
    return n;
}

/* Stops broker q with sig (SIGKILL: a crash; SIGTERM: a deliberate stop), starts it again with
 * the same command line, as docker-compose would, and reads its status into s. The new pid. */
static pid_t restart_queue(pid_t q, int sig, const char *bin, const char *dir,
                           const char *const *extra, const char *ep, wire_status *s)
{
    if (sig == SIGKILL) {
        h_kill(q, SIGKILL);
    } else {
        CHECK_EQ_INT(h_stop(q), 0);
        /* a deliberate stop takes its socket files with it (they stayed behind) */
        char sock[128];
        snprintf(sock, sizeof sock, "%s/queue.sock", dir);
        CHECK(access(sock, F_OK) != 0);
        snprintf(sock, sizeof sock, "%s/queue-pub.sock", dir);
        CHECK(access(sock, F_OK) != 0);
    }
    q = h_start_queue(bin, dir, extra);
    CHECK(q > 0);
    CHECK_EQ_INT(h_broker_status(ep, s), 0);
    return q;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    /* liveness 100 (100 s): the target and drafter sessions stay quiet while the watcher and
     * dflash-ctl start (seconds under ASan on a loaded machine); expiry is not what this tests */
    char journal[128];
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    const char *extra[] = {journal, "--min-ready=2", "--max-depth=4", "--liveness=100", NULL};
    pid_t q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    client *t = client_new(ep, WIRE_ROLE_TARGET, "target");
    client *d = client_new(ep, WIRE_ROLE_DRAFTER, "drafter");
    CHECK_EQ_INT(client_hello(t, NULL, 0), 0);
    CHECK_EQ_INT(client_hello(d, NULL, 0), 0);
    wire_pool pool;
    h_pool(&pool, 0x5e7, 128, 1, 500, 1);
    CHECK_EQ_INT(client_register_pool(t, &pool), 0);

    CHECK_EQ_INT(fill(t, 0x5e7), 4);
    wire_grant g[128];
    int ng = 0;
    while (ng < 128 && client_claim(d, &g[ng]) == 0) ng++;
    CHECK_EQ_INT(ng, 3); /* served while ready >= 2 */
    for (int i = 0; i < ng; i++) {
        CHECK_EQ_INT(client_release(d, g[i].lease_id), 0);
        CHECK_EQ_INT(client_ack(d, &g[i].unit, (uint64_t)i + 1), 0);
    }

    /* a watcher, subscribed before the change (it prints the stats it sees, then the config) */
    char rt[128];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    char *wargv[] = {argv[2], rt, "--json", "watch", NULL};
    int wfd = -1;
    pid_t watcher = h_spawn(wargv, &wfd);
    FILE *wout = fdopen(wfd, "r");
    char line[4096];
    /* the first stats line proves the subscription is up (PUB drops until then) */
    CHECK(fgets(line, sizeof line, wout) != NULL);
    CHECK(strstr(line, "\"topic\":\"stats\"") != NULL);

    CHECK_EQ_INT(run_ctl(argv[2], dir, "set", "min_ready=30", "max_depth=90"), 0);
    bool seen = false;
    while (!seen && fgets(line, sizeof line, wout))
        seen = strstr(line, "\"topic\":\"config\"") && strstr(line, "\"max_depth\":\"90\"");
    CHECK(seen);
    h_kill(watcher, SIGTERM);
    fclose(wout);
    wire_status s;
    CHECK_EQ_INT(client_status(d, &s), 0);
    CHECK_EQ_INT(s.min_ready, 30);
    CHECK_EQ_INT(s.max_depth, 90);

    CHECK_EQ_INT(fill(t, 0x5e7), 89); /* 1 was still ready: depth 90 */
    ng = 0;
    while (ng < 128 && client_claim(d, &g[ng]) == 0) ng++;
    CHECK_EQ_INT(ng, 61); /* 90 ready, served while >= 30 */
    CHECK_EQ_INT(client_status(d, &s), 0);
    CHECK_EQ_INT(s.buckets[0].ready, 29);
    CHECK_EQ_INT(s.buckets[0].leased, 61);

    /* a setting that is not live is refused with exit 1, a bad value too */
    CHECK_EQ_INT(run_ctl(argv[2], dir, "set", "heartbeat_ms=5", NULL), 1);
    CHECK_EQ_INT(run_ctl(argv[2], dir, "set", "max_depth=0", NULL), 1);
    CHECK_EQ_INT(client_status(d, &s), 0);
    CHECK_EQ_INT(s.max_depth, 90);

    client_destroy(&d);
    client_destroy(&t);

    /* the steering survives a crash and a restart with the same command line */
    CHECK_EQ_INT(run_ctl(argv[2], dir, "pause", NULL, NULL), 0);
    q = restart_queue(q, SIGKILL, argv[1], dir, extra, ep, &s);
    CHECK_EQ_INT(s.state, WIRE_STATE_PAUSED);
    CHECK_EQ_INT(s.min_ready, 30);
    CHECK_EQ_INT(s.max_depth, 90);
    CHECK_EQ_INT(run_ctl(argv[2], dir, "resume", NULL, NULL), 0);
    CHECK_EQ_INT(h_broker_status(ep, &s), 0);
    CHECK_EQ_INT(s.state, WIRE_STATE_RUNNING);

    /* a drain survives a crash, but a deliberate stop (SIGTERM) ends it: the next run is served */
    CHECK_EQ_INT(run_ctl(argv[2], dir, "drain", NULL, NULL), 0);
    q = restart_queue(q, SIGKILL, argv[1], dir, extra, ep, &s);
    CHECK_EQ_INT(s.state, WIRE_STATE_DRAINING);
    q = restart_queue(q, SIGTERM, argv[1], dir, extra, ep, &s);
    CHECK_EQ_INT(s.state, WIRE_STATE_RUNNING);

    /* a watch goes on across a restart that moves the broker's PUB socket (--pub-endpoint): it
     * subscribes to the new one (defect: it said the restart and then heard nothing, for ever) */
    char wlog[128], pub2[160];
    snprintf(wlog, sizeof wlog, "%s/watch.log", dir);
    snprintf(pub2, sizeof pub2, "--pub-endpoint=ipc://%s/queue-pub2.sock", dir);
    char *w2argv[] = {argv[2], rt, "--timeout-ms=500", "watch", NULL};
    pid_t watcher2 = h_spawn_logged(w2argv, wlog);
    CHECK(h_wait_text(wlog, "stats ", 10000));
    const char *moved[] = {journal, "--min-ready=2", "--max-depth=4", "--liveness=100", pub2,
                           NULL};
    h_kill(q, SIGKILL);
    q = h_start_queue(argv[1], dir, moved);
    CHECK(q > 0);
    CHECK(h_wait_text(wlog, "queue-pub2.sock now", 15000));
    size_t from = 0;
    char *wtext = test_slurp(wlog, &from);
    free(wtext);
    CHECK(h_wait_text_from(wlog, from, "stats ", 10000));
    CHECK_EQ_INT(h_stop(watcher2), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
