/* itest_drafter_stop: a drafter stopped (SIGTERM) while its broker is gone writes its final
 * checkpoint and exits promptly, not after rounds of ack or StepDone retries that a supervisor's
 * 10 s grace period (docker stop) would cut off before the checkpoint (docs/operating.md: at
 * most 2 x --timeout-ms plus the step and the checkpoint's write; it was 13-17 s).
 *
 * Setup (in a temp dir): a tiny random Qwen3 target (dflash-mkmodel), 96 generated sequences
 * (dflash-gen) packed into a shard (dflash-data). Two cases, each on its own broker and target
 * (own runtime dir), each waiting for conditions (never a fixed sleep):
 *   solo  a real dflash-drafter trains alone with --checkpoint-every 100000 (only the final
 *         checkpoint is written), --timeout-ms 2000;
 *   group the same in --group g (a group of one, rank 0: its StepDone instead of acks).
 * Once it has trained a few batches the broker is SIGKILLed; once it is reaped (solo: and the
 * drafter's log says the broker is silent, so the drafter is in its retries) the drafter is
 * SIGTERMed: it must exit 0 within 2 x 2000 ms + 1.5 s, with a checkpoint (step-*) in its
 * checkpoint dir, and say that it stopped talking to the broker.
 * Usage: itest_drafter_stop QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "test_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#define TIMEOUT_MS 2000
#define EXIT_BOUND_MS (2 * TIMEOUT_MS + 1500)

static char dir[64], model[128], shard[128];
static const char *queue_bin, *target_bin, *drafter_bin;

/* The number of step-* checkpoints in root. */
static int checkpoints_in(const char *root)
{
    DIR *d = opendir(root);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, "step-", 5) == 0;
    if (d) closedir(d);
    return n;
}

/* One case: a broker and a target on runtime dir DIR/run-<name>, a drafter <name> (in group
 * `group` when not NULL); the broker killed, the drafter stopped. */
static void stop_without_broker(const char *name, const char *group)
{
    char rt[128], ep[160], rtflag[160], qlog[160], tlog[160], dlog[160], ckpt[160], nm[64];
    snprintf(rt, sizeof rt, "%s/run-%s", dir, name);
    mkdir(rt, 0700);
    h_queue_endpoint(rt, ep, sizeof ep);
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    snprintf(qlog, sizeof qlog, "%s/queue-%s.log", dir, name);
    snprintf(tlog, sizeof tlog, "%s/target-%s.log", dir, name);
    snprintf(dlog, sizeof dlog, "%s/%s.log", dir, name);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, name);
    snprintf(nm, sizeof nm, "%s", name);

    char *q[] = {(char *)queue_bin, rtflag, "--min-ready", "1", "--max-depth", "4", NULL};
    pid_t qp = h_spawn_logged(q, qlog);
    CHECK(h_wait_broker(ep, 10000) != 0);
    char *t[] = {(char *)target_bin, "--name", "tgt", "--model", model, "--shards", shard,
                 "--slots", "4", "--epochs", "200", "--buckets", "32", "--token-budget", "128",
                 "--max-seqs", "4", "--layers", "3", rtflag, "--threads", "1", "--backend",
                 "host", "--timeout-ms", "1000", NULL};
    pid_t tp = h_spawn_logged(t, tlog);
    char *d[] = {(char *)drafter_bin, "--train", "--model", model, "--name", nm, "--block-size",
                 "4", "--anchors", "8", "--lr", "3e-3", "--checkpoint-every", "100000",
                 "--checkpoint-dir", ckpt, "--progress-ms", "0", "--buckets", "32",
                 "--token-budget", "128", "--max-seqs", "4", "--layers", "3", rtflag,
                 "--threads", "1", "--backend", "host", "--timeout-ms", "2000", NULL, NULL, NULL,
                 NULL, NULL};
    if (group) {
        size_t n = 0;
        while (d[n]) n++;
        d[n] = "--group";
        d[n + 1] = (char *)group;
        d[n + 2] = "--comm";
        d[n + 3] = "shm";
    }
    pid_t dp = h_spawn_logged(d, dlog);

    /* it trains (acked or StepDone'd batches), with no checkpoint yet */
    client *c = client_new(ep, WIRE_ROLE_CTL, "itest");
    client_set_timeout(c, 2000);
    CHECK_EQ_INT(client_hello(c, NULL, 0), 0);
    wire_status s = {0};
    uint64_t end = h_now_ms() + 60000;
    while (h_now_ms() < end && (client_status(c, &s) != 0 || s.acks < 5)) h_sleep_ms(20);
    CHECK(s.acks >= 5);
    client_destroy(&c);
    CHECK_EQ_INT(checkpoints_in(ckpt), 0);

    /* the broker dies; once the drafter has noticed, it is told to stop */
    h_kill(qp, SIGKILL); /* and reaped */
    if (!group) CHECK(h_wait_text(dlog, "waiting for the broker to come back", 30000));
    uint64_t t0 = h_now_ms();
    kill(dp, SIGTERM);
    int rc = h_wait_exit(dp, 60000);
    uint64_t took = h_now_ms() - t0;
    printf("%s: exit %d %llu ms after SIGTERM with the broker gone (bound %d ms), %d "
           "checkpoint(s)\n", name, rc, (unsigned long long)took, EXIT_BOUND_MS,
           checkpoints_in(ckpt));
    CHECK_EQ_INT(rc, 0);
    CHECK(took <= EXIT_BOUND_MS);
    CHECK_EQ_INT(checkpoints_in(ckpt), 1); /* the final one */
    CHECK(h_wait_text(dlog, "the final checkpoint goes first", 0));

    h_kill(tp, SIGKILL);
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: itest_drafter_stop QUEUE CTL TARGET DRAFTER MKMODEL GEN DATA\n");
        return 2;
    }
    queue_bin = argv[1];
    target_bin = argv[3];
    drafter_bin = argv[4];
    h_tempdir(dir, sizeof dir);
    CHECK_EQ_INT(h_make_training_set(argv[5], argv[6], argv[7], dir, model, shard), 0);
    if (check_failed) CHECK_DONE();

    stop_without_broker("solo", NULL);
    stop_without_broker("grouped", "g");

    if (!check_failed) h_rmdir(dir);
    else fprintf(stderr, "logs kept in %s\n", dir);
    CHECK_DONE();
}
