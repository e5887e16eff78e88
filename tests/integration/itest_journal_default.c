/* itest_journal_default: without --journal the broker keeps its ledger in the runtime dir
 * ($XDG_RUNTIME_DIR/dflash or /tmp/dflash-UID), on most systems a tmpfs emptied at logout or
 * reboot: a broker restarted after that starts a fresh ledger, and every batch the drafter had
 * trained is trained again. It started without a word about it; now it warns at start-up and
 * says what to do (and the journal is there, queue.journal). A --journal given explicitly
 * (even inside the runtime dir) is not warned about. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

/* Starts dflash-queue on dir with extra (NULL or one flag), logging to dir/queue.log, stops it
 * and returns the log (malloc'ed). */
static char *start_stop(const char *bin, const char *dir, const char *extra)
{
    char rt[128], log[128], ep[128];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(log, sizeof log, "%s/queue.log", dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    remove(log);
    char *argv[] = {(char *)bin, rt, (char *)extra, NULL};
    pid_t q = h_spawn_logged(argv, log);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) != 0);
    CHECK_EQ_INT(h_stop(q), 0);
    return test_slurp(log, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    char dir[64], journal[128];
    h_tempdir(dir, sizeof dir);

    char *log = start_stop(argv[1], dir, NULL);
    CHECK(log && strstr(log, "give --journal a file on persistent storage") != NULL);
    if (log && !strstr(log, "persistent storage")) fprintf(stderr, "log was:\n%s\n", log);
    free(log);
    /* ... and it did keep its ledger there */
    snprintf(journal, sizeof journal, "%s/queue.journal", dir);
    CHECK(access(journal, F_OK) == 0);

    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    log = start_stop(argv[1], dir, journal);
    CHECK(log && strstr(log, "persistent storage") == NULL);
    free(log);

    h_rmdir(dir);
    CHECK_DONE();
}
