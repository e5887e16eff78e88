/* itest_runtime_dir_trust: a client trusts an ipc:// endpoint only in a directory that is ours
 * alone. The default runtime dir (/tmp/dflash-UID) is predictable: another local user could make
 * it first, or open it up, and serve a fake broker there. The broker refused such a dir at its
 * start; dflash-target, dflash-drafter and dflash-ctl connected without a look (the security
 * audit's local-trust finding). Now each refuses before connecting, naming the dir, its owner
 * and mode and the fix, with its configuration exit status (target, drafter: 2; ctl: 1).
 *
 * The real dflash-queue serves on DIR/run, so that a client that did not check would be
 * answered (the stand-in for a fake broker):
 *   (a) mode 0700: ctl ping answers (the normal path);
 *   (b) the dir opened to 0755: ctl ping exits 1, target and drafter exit 2 at once, each
 *       naming the dir, "0755" and "chmod 700";
 *   (c) owned by another uid (only when run as root, who can chown): ctl exits 1 naming the uid;
 *   (d) a symlink to the good dir: ctl exits 1 ("symbolic link"), and so does dflash-queue
 *       (exit 2) on a symlink to an empty 0700 dir: it followed it before; dflash-queue also
 *       exits 2 on an explicit --endpoint or --pub-endpoint in a 0755 dir (not judged before);
 *   (e) an abstract socket (ipc://@NAME, no dir at all): ctl exits 1;
 *   (f) a runtime dir that does not exist (a mistyped --runtime-dir, or no broker started):
 *       ctl exits 2 at once, as for a broker not answering, naming the dir and saying that no
 *       broker runs there, and makes nothing (it made the dir, mode 0700, and waited its whole
 *       --timeout-ms for a broker that could not be there);
 *   (g) `watch` judges the PUB socket's dir the broker names the same way: open to 0755, exit 1
 *       naming it; removed while the broker runs, exit 2 at once naming it, and not made again
 *       (it made it, and waited three stats intervals for announcements that could not come). */
#include "check.h"
#include "harness.h"
#include "test_files.h"

#include <errno.h>
#include <sys/stat.h>

/* Runs `dflash-ctl --timeout-ms=1000 FLAG ping` with its output into log (emptied first); its
 * exit status. */
static int ctl_ping(const char *ctl, const char *flag, const char *log)
{
    remove(log);
    char *argv[] = {(char *)ctl, "--timeout-ms=1000", (char *)flag, "ping", NULL};
    return h_run_tool(argv, log);
}

/* Whether the file at path holds every one of the NULL-terminated texts; prints it if not. */
static bool log_says(const char *path, const char *const *texts)
{
    char *s = test_slurp(path, NULL);
    bool all = s != NULL;
    for (const char *const *t = texts; all && *t; t++) all = strstr(s, *t) != NULL;
    if (!all) fprintf(stderr, "%s lacks an expected text; it holds:\n%s\n", path, s ? s : "");
    free(s);
    return all;
}

int main(int argc, char **argv)
{
    if (argc < 5) return 2;
    const char *queue = argv[1], *ctl = argv[2], *target = argv[3], *drafter = argv[4];
    char dir[64], rt[128], ep[128], rtflag[160], log[128];
    h_run_dirs(dir, rt, ep);
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    snprintf(log, sizeof log, "%s/client.log", dir);
    pid_t q = h_start_small_queue(queue, rt, NULL);
    CHECK(q > 0);

    /* (a) ours, 0700: served */
    CHECK_EQ_INT(ctl_ping(ctl, rtflag, log), 0);

    /* (b) the same dir, open to group and others (the broker serves on: it checked at start) */
    CHECK_EQ_INT(chmod(rt, 0755), 0);
    CHECK_EQ_INT(ctl_ping(ctl, rtflag, log), 1);
    CHECK(log_says(log, (const char *const[]){rt, "0755", "chmod 700", NULL}));
    remove(log);
    char *tv[] = {(char *)target, rtflag, "--name=t", "--model=synthetic", "--slots=2",
                  "--token-budget=256", "--max-seqs=4", "--hidden=8", "--layers=2",
                  "--buckets=64,256", "--backend=host", "--timeout-ms=1000", NULL};
    CHECK_EQ_INT(h_wait_exit(h_spawn_logged(tv, log), 10000), 2);
    CHECK(log_says(log, (const char *const[]){"dflash-target", rt, "0755", "chmod 700", NULL}));
    remove(log);
    char *dr[] = {(char *)drafter, rtflag, "--verify", "--backend=host", "--name=d",
                  "--hidden=8", "--layers=2", "--token-budget=256", "--max-seqs=4",
                  "--buckets=64,256", "--progress-ms=0", "--timeout-ms=1000", NULL};
    pid_t d = h_spawn_logged(dr, log);
    CHECK_EQ_INT(h_wait_exit(d, 10000), 2);
    CHECK(log_says(log, (const char *const[]){"dflash-drafter", rt, "0755", "chmod 700", NULL}));
    CHECK_EQ_INT(chmod(rt, 0700), 0);
    CHECK_EQ_INT(ctl_ping(ctl, rtflag, log), 0);

    /* (c) another user's dir */
    if (geteuid() == 0) {
        CHECK_EQ_INT(chown(rt, 65534, (gid_t)-1), 0);
        CHECK_EQ_INT(ctl_ping(ctl, rtflag, log), 1);
        CHECK(log_says(log, (const char *const[]){rt, "owned by uid 65534", "run this as uid 65534",
                                                  NULL}));
        CHECK_EQ_INT(chown(rt, 0, (gid_t)-1), 0);
    }

    /* (d) a symlink to it: the link is judged, not where it points */
    char link[128], linkflag[160];
    snprintf(link, sizeof link, "%s/link", dir);
    CHECK_EQ_INT(symlink(rt, link), 0);
    snprintf(linkflag, sizeof linkflag, "--runtime-dir=%s", link);
    CHECK_EQ_INT(ctl_ping(ctl, linkflag, log), 1);
    CHECK(log_says(log, (const char *const[]){link, "symbolic link", NULL}));
    /* the broker judges its runtime dir by the same rule (it followed the link before) */
    char other[128], link2[160], link2flag[200];
    snprintf(other, sizeof other, "%s/other", dir);
    snprintf(link2, sizeof link2, "%s/link2", dir);
    snprintf(link2flag, sizeof link2flag, "--runtime-dir=%s", link2);
    CHECK_EQ_INT(mkdir(other, 0700), 0);
    CHECK_EQ_INT(symlink(other, link2), 0);
    remove(log);
    char *qv[] = {(char *)queue, link2flag, "--journal=none", NULL};
    CHECK_EQ_INT(h_wait_exit(h_spawn_logged(qv, log), 10000), 2);
    CHECK(log_says(log, (const char *const[]){link2, "symbolic link", NULL}));

    /* ... and the directory of an ipc:// endpoint it is given elsewhere (--endpoint,
     * --pub-endpoint), which it did not judge at all before */
    char open_dir[128], epflag[200];
    snprintf(open_dir, sizeof open_dir, "%s/open", dir);
    CHECK_EQ_INT(mkdir(open_dir, 0700), 0);
    CHECK_EQ_INT(chmod(open_dir, 0755), 0);
    snprintf(epflag, sizeof epflag, "--endpoint=ipc://%s/q.sock", open_dir);
    char goodrt[160];
    snprintf(goodrt, sizeof goodrt, "--runtime-dir=%s", other);
    remove(log);
    char *qe[] = {(char *)queue, goodrt, epflag, "--journal=none", NULL};
    CHECK_EQ_INT(h_wait_exit(h_spawn_logged(qe, log), 10000), 2);
    CHECK(log_says(log, (const char *const[]){open_dir, "0755", "chmod 700", NULL}));
    snprintf(epflag, sizeof epflag, "--pub-endpoint=ipc://%s/pub.sock", open_dir);
    remove(log);
    char *qp[] = {(char *)queue, goodrt, epflag, "--journal=none", NULL};
    CHECK_EQ_INT(h_wait_exit(h_spawn_logged(qp, log), 10000), 2);
    CHECK(log_says(log, (const char *const[]){open_dir, "0755", NULL}));

    /* (e) an abstract socket */
    CHECK_EQ_INT(ctl_ping(ctl, "--endpoint=ipc://@dflash-itest-abstract", log), 1);
    CHECK(log_says(log, (const char *const[]){"abstract socket", NULL}));

    /* (f) not there: no broker in it, said at once (a --timeout-ms wait would show), none made */
    char fresh[128], freshflag[160];
    snprintf(fresh, sizeof fresh, "%s/fresh", dir);
    snprintf(freshflag, sizeof freshflag, "--runtime-dir=%s", fresh);
    remove(log);
    char *cf[] = {(char *)ctl, "--timeout-ms=10000", freshflag, "status", NULL};
    uint64_t t0 = h_now_ms();
    CHECK_EQ_INT(h_run_tool(cf, log), 2);
    uint64_t took = h_now_ms() - t0;
    CHECK(took < 5000);
    CHECK(log_says(log, (const char *const[]){fresh, "does not exist", "no broker runs there",
                                              "--runtime-dir", NULL}));
    struct stat st;
    CHECK(lstat(fresh, &st) != 0 && errno == ENOENT);

    /* (g) watch: the PUB socket's dir, which the broker names in its hello reply */
    char wrt[128], pubdir[128], pubflag[200], wflag[160];
    snprintf(wrt, sizeof wrt, "%s/w", dir);
    snprintf(pubdir, sizeof pubdir, "%s/pubdir", dir);
    snprintf(pubflag, sizeof pubflag, "--pub-endpoint=ipc://%s/pub.sock", pubdir);
    snprintf(wflag, sizeof wflag, "--runtime-dir=%s", wrt);
    const char *wextra[] = {"--journal=none", pubflag, "--stats-interval-ms=200", NULL};
    pid_t wq = h_start_queue(queue, wrt, wextra);
    CHECK(wq > 0);
    char *cw[] = {(char *)ctl, "--timeout-ms=10000", "--count=1", wflag, "watch", NULL};
    CHECK_EQ_INT(chmod(pubdir, 0755), 0);
    remove(log);
    CHECK_EQ_INT(h_run_tool(cw, log), 1);
    CHECK(log_says(log, (const char *const[]){pubdir, "0755", "chmod 700", NULL}));
    char pubsock[160];
    snprintf(pubsock, sizeof pubsock, "%s/pub.sock", pubdir);
    CHECK_EQ_INT(unlink(pubsock), 0);
    CHECK_EQ_INT(rmdir(pubdir), 0);
    remove(log);
    t0 = h_now_ms();
    CHECK_EQ_INT(h_run_tool(cw, log), 2);
    took = h_now_ms() - t0;
    CHECK(took < 5000);
    CHECK(log_says(log, (const char *const[]){pubdir, "does not exist", "PUB endpoint", NULL}));
    CHECK(lstat(pubdir, &st) != 0 && errno == ENOENT);
    CHECK_EQ_INT(h_stop(wq), 0);

    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
