/* itest_journal_failing: a broker whose journal writes fail keeps serving and says so where an
 * operator and a supervisor look (docs/operating.md section 4): `dflash-ctl status` shows
 * "journal FAILING" with the reason, and `dflash-ctl ping`, the compose healthcheck, exits 1
 * naming it; once the disk takes writes again the broker rewrites the journal whole from memory
 * (every --journal-retry-ms), ping exits 0 again, and a broker restarted on that journal has the
 * setting changed meanwhile (in force, though answered with an I/O error).
 *
 * The full disk is a file size limit of 0 (RLIMIT_FSIZE) that this process sets on the running
 * broker with prlimit (the broker ignores SIGXFSZ itself, signals.h: it was killed by it, a
 * limit being no full disk to it, before this test set SIG_IGN for it): no file of its may
 * grow, a write fails with EFBIG as it does with ENOSPC on a full disk, the journal's appends
 * and its rewrites alike (a limit just above the journal's size let the rewrite, which
 * is smaller than the appended records, succeed at once). A `dflash-ctl set` appends a settings
 * record. Lifting the limit is the disk that has room again. The broker logs to this process's
 * stderr (a pipe or terminal: no limit).
 * Usage: itest_journal_failing QUEUE CTL. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

#include <sys/resource.h>

static char dir[64], rt[128], journal[128], out[128];
static const char *queue_bin, *ctl_bin;

/* Starts the broker on dir's journal, SIGXFSZ at its default action (the broker's to ignore). */
static pid_t start_broker(void)
{
    char *argv[] = {(char *)queue_bin, rt, journal, "--journal-retry-ms=200", "--log-level=info",
                    NULL};
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_DFL);
        execv(argv[0], argv);
        perror("execv");
        _exit(127);
    }
    char ep[128];
    h_queue_endpoint(dir, ep, sizeof ep);
    if (pid < 0 || !h_wait_broker(ep, H_BROKER_UP_MS)) return -1;
    return pid;
}

/* Runs dflash-ctl with arguments a (and b, may be NULL); its exit status, its output (stdout
 * and stderr, malloc'ed) in *text. */
static int ctl(const char *a, const char *b, char **text)
{
    char *argv[] = {(char *)ctl_bin, rt, "--timeout-ms=2000", (char *)a, (char *)b, NULL};
    remove(out);
    int rc = h_run_tool(argv, out);
    *text = test_slurp(out, NULL);
    if (!*text) *text = strdup("");
    return rc;
}

/* Sets the broker's file size limit (soft; RLIM_INFINITY lifts it). */
static int limit_files(pid_t pid, rlim_t bytes)
{
    struct rlimit r;
    if (prlimit(pid, RLIMIT_FSIZE, NULL, &r) != 0) return -1;
    r.rlim_cur = bytes;
    return prlimit(pid, RLIMIT_FSIZE, &r, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    queue_bin = argv[1];
    ctl_bin = argv[2];
    h_tempdir(dir, sizeof dir);
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    snprintf(out, sizeof out, "%s/ctl.out", dir);
    pid_t q = start_broker();
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    char *text = NULL;
    CHECK_EQ_INT(ctl("ping", NULL, &text), 0);
    CHECK(strstr(text, "ok: dflash-queue") != NULL);
    free(text);

    /* the disk is full */
    CHECK_EQ_INT(limit_files(q, 0), 0);
    int sets = 0, failed_sets = 0;
    bool failing = false;
    char set[64];
    for (uint64_t end = h_now_ms() + 20000; !failing && h_now_ms() < end; sets++) {
        snprintf(set, sizeof set, "min_ready=%d", 2 + sets % 50);
        failed_sets += ctl("set", set, &text) != 0;
        free(text);
        ctl("status", NULL, &text);
        failing = strstr(text, "journal FAILING") != NULL;
        free(text);
    }
    printf("no file may grow: journal FAILING after %d sets (%d answered with an error)\n",
           sets, failed_sets);
    CHECK(failing);

    /* status names the failure, ping (the healthcheck) exits 1 naming it; the broker answers */
    CHECK_EQ_INT(ctl("status", NULL, &text), 0);
    CHECK(strstr(text, "JOURNAL") && strstr(text, "nothing since is durable"));
    printf("status says: %s", strstr(text, "JOURNAL") ? strstr(text, "JOURNAL") : text);
    free(text);
    int prc = ctl("ping", NULL, &text);
    printf("ping while failing: exit %d: %s", prc, text);
    CHECK_EQ_INT(prc, 1);
    CHECK(strstr(text, "the broker's journal failed") != NULL);
    free(text);
    /* a setting changed while the journal fails is answered with an I/O error */
    CHECK(ctl("set", "min_ready=7", &text) != 0);
    free(text);
    /* its rewrites fail too while the disk is full (a few --journal-retry-ms): still failing */
    h_sleep_ms(1000);
    CHECK_EQ_INT(ctl("ping", NULL, &text), 1);
    free(text);

    /* the disk has room again: the broker rewrites the journal and is healthy again */
    CHECK_EQ_INT(limit_files(q, RLIM_INFINITY), 0);
    int pings = 0;
    prc = 1;
    for (uint64_t end = h_now_ms() + 10000; prc != 0 && h_now_ms() < end; pings++) {
        prc = ctl("ping", NULL, &text);
        free(text);
        if (prc != 0) h_sleep_ms(100);
    }
    printf("limit lifted: ping exits %d after %d tries\n", prc, pings);
    CHECK_EQ_INT(prc, 0);
    CHECK_EQ_INT(ctl("status", NULL, &text), 0);
    CHECK(strstr(text, "journal ok") != NULL);
    free(text);

    /* the rewritten journal holds what changed during the failure: a broker restarted on it
     * has min_ready 7 (in force, though answered with an I/O error) */
    CHECK_EQ_INT(h_stop(q), 0);
    q = start_broker();
    CHECK(q > 0);
    CHECK_EQ_INT(ctl("status", NULL, &text), 0);
    CHECK(strstr(text, "min_ready 7 ") != NULL && strstr(text, "journal ok") != NULL);
    if (!strstr(text, "min_ready 7 ")) fprintf(stderr, "status after the restart:\n%s", text);
    free(text);
    CHECK_EQ_INT(h_stop(q), 0);
    if (check_failed) fprintf(stderr, "files kept in %s\n", dir);
    else h_rmdir(dir);
    CHECK_DONE();
}
