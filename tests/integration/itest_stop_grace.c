/* itest_stop_grace: the bounds of the broker's graceful stop (services/queue/broker_stop.c), on
 * the real dflash-queue (its log in a file) and synthetic dflash-target, with drafters played by
 * clients (heartbeat 200 ms, liveness 3: a silent peer is expired after 600 ms; lease timeout
 * 10 s, so that only the expiry can end a dead holder's lease soon). Every case stops the
 * broker with SIGTERM while a drafter holds a lease (granted, never released):
 *   dead    the holder is a process SIGKILLed just before the broker's SIGTERM (a drafter that
 *           died, or was killed first by a host shutdown), --stop-grace-ms 30000: the broker
 *           must say it waits for that lease, and exit 0 once the holder is expired, within a
 *           few seconds, not after the whole grace (defect it guards: the wait on leases of a
 *           peer nobody will ever hear from again);
 *   second  a live holder (heartbeating), --stop-grace-ms 30000: while the broker stops it
 *           answers the holder's heartbeats, `dflash-ctl status` (text and --json) shows it
 *           stopping, with its grace and the lease it waits for (defect: it looked like a
 *           serving broker; then its first line and --json "state" still said "running":
 *           "stopping" now, the mode in "mode"; before the SIGTERM "state" is the mode,
 *           "stopping" null), and `dflash-ctl ping`, the compose healthcheck, still exits 0,
 *           saying it stops; then a second SIGTERM must make it exit 0 at once, naming the
 *           lease left. (These dflash-ctl calls ran in the grace case, whose 6 s they outlasted
 *           under ASan on a loaded machine: the broker had exited before the ping.)
 *   grace   a live holder, --stop-grace-ms 6000: the broker exits 0 once the grace is over (not
 *           before), naming what was unsettled; meanwhile it answers the holder's heartbeats,
 *           and another drafter's claim is refused with the retryable Error AGAIN "the broker
 *           is stopping" over the wire.
 * Usage: itest_stop_grace QUEUE TARGET CTL. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

#include <poll.h>

static char dir[64], rt[128], ep[128];
static const char *queue_bin, *target_bin, *ctl_bin;


/* The broker (its log at DIR/NAME-queue.log into qlog) with --stop-grace-ms grace; the synthetic
 * target once it answers. */
static pid_t start_broker(const char *name, const char *grace, char *qlog, size_t qlog_len,
                          pid_t *target)
{
    char rtflag[160], journal[160], graceflag[64];
    snprintf(qlog, qlog_len, "%s/%s-queue.log", dir, name);
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    snprintf(journal, sizeof journal, "--journal=%s/%s.journal", dir, name);
    snprintf(graceflag, sizeof graceflag, "--stop-grace-ms=%s", grace);
    char *q[] = {(char *)queue_bin, rtflag, journal, "--min-ready=1", "--max-depth=2",
                 "--heartbeat-ms=200", "--liveness=3", "--lease-timeout-ms=10000",
                 "--stats-interval-ms=0", graceflag, NULL};
    pid_t pid = h_spawn_logged(q, qlog);
    CHECK(pid > 0 && h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    *target = h_start_small_target(target_bin, rt, name, 50, 500);
    CHECK(*target > 0);
    return pid;
}

/* A drafter client `name` that said hello and holds a lease (claims until granted, 20 s at
 * most); NULL when it got none. */
static client *holder(const char *name)
{
    int rc;
    client *c = h_client(ep, WIRE_ROLE_DRAFTER, name, 10, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_grant g;
    for (uint64_t end = h_now_ms() + 20000; h_now_ms() < end; h_sleep_ms(20))
        if ((rc = client_claim(c, &g)) == 0) return c;
    CHECK_EQ_INT(rc, 0);
    client_destroy(&c);
    return NULL;
}

/* Waits up to ms for pid to exit while c (may be NULL) keeps heartbeating; its exit status, or
 * -1 (killed then). *took: the time waited. Stops early once the log at qlog holds `until` (may
 * be NULL), returning -2. */
static int wait_beating(pid_t pid, client *c, int ms, const char *qlog, const char *until,
                        uint64_t *took)
{
    uint64_t t0 = h_now_ms(), end = t0 + (uint64_t)ms, beat = 0;
    int st = 0;
    for (;; h_sleep_ms(20)) {
        uint64_t now = h_now_ms();
        *took = now - t0;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (until && h_wait_text(qlog, until, 0)) return -2;
        if (now >= end) break;
        if (c && now - beat >= 100) {
            client_heartbeat(c);
            beat = now;
        }
    }
    h_kill(pid, SIGKILL);
    return -1;
}

/* Runs dflash-ctl with arguments a and b (may be NULL) while c keeps heartbeating (a slow ctl
 * start, e.g. under a sanitizer, must not get the holder expired); its exit status, its output
 * (stdout and stderr, malloc'ed) in *text. */
static int ctl(client *c, const char *a, const char *b, char **text)
{
    char rtflag[160], out[128];
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    snprintf(out, sizeof out, "%s/ctl.out", dir);
    char *argv[] = {(char *)ctl_bin, rtflag, "--timeout-ms=2000", (char *)a, (char *)b, NULL};
    remove(out);
    uint64_t took;
    pid_t pid = h_spawn_logged(argv, out);
    int rc = pid > 0 ? wait_beating(pid, c, 10000, NULL, NULL, &took) : -1;
    *text = test_slurp(out, NULL);
    if (!*text) *text = strdup("");
    printf("dflash-ctl %s%s%s: exit %d: %s", a, b ? " " : "", b ? b : "", rc, *text);
    return rc;
}

static void test_dead_holder(void)
{
    char qlog[160];
    pid_t t, q = start_broker("dead", "30000", qlog, sizeof qlog, &t);
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t d = fork();
    if (d == 0) { /* the drafter: takes a lease, says so, then waits to be killed */
        close(fds[0]);
        client *c = holder("dead");
        if (c && write(fds[1], "L", 1) == 1)
            for (;;) pause();
        _exit(1);
    }
    close(fds[1]);
    struct pollfd pf = {fds[0], POLLIN, 0};
    char got = 0;
    CHECK(poll(&pf, 1, 30000) == 1 && read(fds[0], &got, 1) == 1 && got == 'L');
    close(fds[0]);
    h_kill(d, SIGKILL);
    h_signal(q, SIGTERM);
    uint64_t took;
    CHECK_EQ_INT(wait_beating(q, NULL, 20000, qlog, NULL, &took), 0);
    printf("dead: the broker exited %llu ms after its SIGTERM\n", (unsigned long long)took);
    CHECK(took < 5000); /* the holder's expiry (600 ms after its claim), not the 30 s grace */
    CHECK(h_wait_text(qlog, "waiting up to 30000 ms", 0));
    CHECK(h_wait_text(qlog, "drafter dead (1 lease)", 0));
    CHECK(h_wait_text(qlog, "expired (no heartbeat)", 0));
    CHECK(h_wait_text(qlog, "stop: all settled", 0));
    CHECK_EQ_INT(h_stop(t), 0);
}

static void test_second_signal(void)
{
    char qlog[160];
    pid_t t, q = start_broker("second", "30000", qlog, sizeof qlog, &t);
    client *c = holder("live");
    CHECK(c != NULL);
    char *text;
    CHECK_EQ_INT(ctl(c, "--json", "status", &text), 0); /* serving: its mode, not stopping */
    CHECK(strstr(text, "\"state\":\"running\",\"mode\":\"running\",\"stopping\":null") != NULL);
    free(text);
    h_signal(q, SIGTERM);
    uint64_t took;
    CHECK_EQ_INT(wait_beating(q, c, 10000, qlog, "stopping: no new leases", &took), -2);
    /* the operator's view and the healthcheck's during the grace: stopping from the first
     * line and in --json "state" (its mode kept in "mode") */
    CHECK_EQ_INT(ctl(c, "status", NULL, &text), 0);
    CHECK(strncmp(text, "broker    ", 10) == 0 && strstr(text, "  stopping  up ") != NULL &&
          strstr(text, "  stopping  up ") < strchr(text, '\n'));
    CHECK(strstr(text, "state     stopping (grace 30000 ms, ") != NULL);
    CHECK(strstr(text, " s left; waiting for: drafter live (1 lease)): no new leases or work") !=
          NULL);
    free(text);
    CHECK_EQ_INT(ctl(c, "--json", "status", &text), 0);
    CHECK(strstr(text, "\"state\":\"stopping\",\"mode\":\"running\","
                       "\"stopping\":{\"grace_ms\":30000,") != NULL);
    CHECK(strstr(text, "\"waiting_for\":\"drafter live (1 lease)\"") != NULL);
    free(text);
    CHECK_EQ_INT(ctl(c, "ping", NULL, &text), 0);
    CHECK(strstr(text, "ok: dflash-queue ") != NULL);
    CHECK(strstr(text, "; stopping (grace 30000 ms, ") != NULL);
    free(text);
    CHECK_EQ_INT(client_heartbeat(c), 0);
    h_signal(q, SIGTERM); /* no more heartbeats: one to a broker gone waits for its time-out */
    CHECK_EQ_INT(wait_beating(q, NULL, 10000, qlog, NULL, &took), 0);
    printf("second: the broker exited %llu ms after the second SIGTERM\n",
           (unsigned long long)took);
    CHECK(took < 2000);
    CHECK(h_wait_text(qlog, "a second stop request: exiting at once with 1 lease", 0));
    CHECK(h_wait_text(qlog, "drafter live (1 lease) unsettled", 0));
    client_destroy(&c);
    CHECK_EQ_INT(h_stop(t), 0);
}

static void test_grace_over(void)
{
    char qlog[160];
    pid_t t, q = start_broker("grace", "6000", qlog, sizeof qlog, &t);
    client *c = holder("live");
    CHECK(c != NULL);
    uint64_t t0 = h_now_ms(), took;
    h_signal(q, SIGTERM);
    CHECK_EQ_INT(wait_beating(q, c, 10000, qlog, "stopping: no new leases", &took), -2);
    /* another drafter says hello now, while the broker stops (one made before the SIGTERM sent
     * nothing during the status call and the wait: on a loaded machine, under ASan, it was
     * expired, 600 ms silent, and its claim answered "unknown peer") */
    int rc;
    client *other = h_client(ep, WIRE_ROLE_DRAFTER, "other", 10, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_grant g;
    CHECK_EQ_INT(client_claim(other, &g), DFLASH_EAGAIN);
    printf("grace: a claim while stopping: %s\n", client_last_error(other));
    CHECK(strstr(client_last_error(other), "the broker is stopping") != NULL);
    CHECK_EQ_INT(client_heartbeat(c), 0);
    CHECK_EQ_INT(wait_beating(q, c, 10000, qlog, NULL, &took), 0);
    took = h_now_ms() - t0;
    printf("grace: the broker exited %llu ms after its SIGTERM\n", (unsigned long long)took);
    CHECK(took >= 6000 && took < 11000);
    CHECK(h_wait_text(qlog, "--stop-grace-ms 6000 is over: exiting with 1 lease", 0));
    CHECK(h_wait_text(qlog, "drafter live (1 lease) unsettled", 0));
    client_destroy(&other);
    client_destroy(&c);
    CHECK_EQ_INT(h_stop(t), 0);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: itest_stop_grace QUEUE TARGET CTL\n");
        return 2;
    }
    queue_bin = argv[1];
    target_bin = argv[2];
    ctl_bin = argv[3];
    h_run_dirs(dir, rt, ep);
    test_dead_holder();
    test_second_signal();
    test_grace_over();
    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
