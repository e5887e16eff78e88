/* itest_poison: a batch that makes every drafter fail is quarantined after max-redeliveries
 * failed deliveries, however the drafter fails, instead of stopping training forever.
 *
 * The real dflash-queue (--max-redeliveries=1) and dflash-target (--model synthetic) run in a
 * temp dir; this process runs the worker loop again and again, as a supervisor restarts a
 * drafter (docker-compose restart: on-failure), with a consumer that refuses one batch (the first
 * it sees: DFLASH_ECORRUPT, the daemon's exit 3) and trains the others. Each refusal ends the
 * run holding the batch; the next run's hello replaces the session and the batch goes back to
 * to-do, is produced into a fresh slot and delivered again. Checks: the refused batch is
 * delivered exactly max-redeliveries + 1 = 2 times (the count survives re-production), later
 * runs train without it, and `status` counts it quarantined. Then the operator gives it back
 * (`dflash-ctl release E/B/I`, the id as the broker's log prints it): the ctl says so, status
 * counts none quarantined, and the batch gets a fresh set of tries (2 more deliveries, then
 * quarantined again); a release of a batch that is not quarantined is refused (exit 1), and
 * `dflash-ctl release all` reports what it released. */
#include "check.h"
#include "harness.h"
#include "test_files.h"
#include "slot.h"
#include "worker_loop.h"

#include <signal.h>

#define RUNS 6

typedef struct poison {
    bool have;
    slot_work_unit bad; /* the batch refused */
    int seen;           /* deliveries of it */
    uint64_t steps;
} poison;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    poison *k = ctx;
    if (!k->have) {
        k->have = true;
        k->bad = b->wu;
    }
    if (b->wu.epoch == k->bad.epoch && b->wu.bucket == k->bad.bucket &&
        b->wu.batch == k->bad.batch) {
        k->seen++;
        return DFLASH_ECORRUPT;
    }
    *step = ++k->steps;
    return 0;
}

/* Runs dflash-ctl (bin) on the broker of runtime dir `dir` with verb and arg (may be NULL), its
 * output into dir/ctl.out (replaced); its exit status. */
static int ctl(const char *bin, const char *dir, const char *verb, const char *arg)
{
    char rt[300], out[300];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(out, sizeof out, "%s/ctl.out", dir);
    unlink(out);
    char *argv[] = {(char *)bin, rt, (char *)verb, (char *)arg, NULL};
    return h_run_tool(argv, out);
}

static bool ctl_said(const char *dir, const char *text)
{
    char out[300];
    snprintf(out, sizeof out, "%s/ctl.out", dir);
    char *said = test_slurp(out, NULL);
    bool found = said && strstr(said, text);
    if (!found) fprintf(stderr, "dflash-ctl said:\n%s\n", said ? said : "(nothing)");
    free(said);
    return found;
}

static uint64_t quarantined(const char *ep)
{
    wire_status s;
    int rc = h_broker_status(ep, &s);
    CHECK_EQ_INT(rc, 0);
    return rc ? UINT64_MAX : s.quarantined;
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--max-redeliveries=1", "--log-level=warn", NULL};
    pid_t q = h_start_small_queue(argv[1], dir, more);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    pid_t target = h_start_small_target(argv[3], dir, "poison", 64, 500);
    CHECK(target > 0);

    worker_loop_config lc = {.endpoint = ep, .name = "drafter", .backend = POOL_HOST,
                             .timeout_ms = 1000, .max_batches = 8};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout), 0);
    poison k = {0};
    worker_consumer cons = {.name = "poison", .ctx = &k, .consume = consume};
    volatile sig_atomic_t stop = 0;
    int refusals = 0;
    for (int run = 0; run < RUNS; run++) {
        int rc = worker_loop_run(&lc, &cons, &stop, NULL);
        CHECK(rc == 0 || rc == DFLASH_ECORRUPT);
        refusals += rc == DFLASH_ECORRUPT;
        printf("run %d: %s, refused batch delivered %d times so far, %llu trained\n", run,
               rc ? err_str(rc) : "ok", k.seen, (unsigned long long)k.steps);
    }
    CHECK_EQ_INT(k.seen, 2);
    CHECK_EQ_INT(refusals, 2);

    client *c = client_new(ep, WIRE_ROLE_CTL, "check");
    client_set_timeout(c, 1000);
    wire_status s;
    int rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 20 && rc; a++)
        if ((rc = client_hello(c, NULL, 0)) == 0) rc = client_status(c, &s);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
        printf("ledger: %llu quarantined, %llu trained\n", (unsigned long long)s.quarantined,
               (unsigned long long)s.batches_trained);
        CHECK_EQ_INT(s.quarantined, 1);
    }
    client_destroy(&c);

    /* the operator releases it: a fresh set of max-redeliveries + 1 tries */
    char id[64], other[64];
    snprintf(id, sizeof id, "%u/%u/%llu", k.bad.epoch, k.bad.bucket,
             (unsigned long long)k.bad.batch);
    snprintf(other, sizeof other, "%u/%u/%llu", k.bad.epoch, k.bad.bucket,
             (unsigned long long)k.bad.batch + 1000);
    CHECK_EQ_INT(ctl(argv[2], dir, "release", other), 1); /* not in the plan */
    CHECK(ctl_said(dir, "not in the ledger"));
    CHECK_EQ_INT(ctl(argv[2], dir, "release", id), 0);
    char line[128];
    snprintf(line, sizeof line, "released batch %s: back to to-do", id);
    CHECK(ctl_said(dir, line));
    CHECK_EQ_INT(quarantined(ep), 0);
    CHECK_EQ_INT(ctl(argv[2], dir, "release", id), 1); /* not quarantined any more */
    CHECK(ctl_said(dir, "is not quarantined"));
    for (int run = 0; run < RUNS; run++) {
        int rc2 = worker_loop_run(&lc, &cons, &stop, NULL);
        CHECK(rc2 == 0 || rc2 == DFLASH_ECORRUPT);
    }
    printf("after the release: refused batch delivered %d times in all\n", k.seen);
    CHECK_EQ_INT(k.seen, 4);
    CHECK_EQ_INT(quarantined(ep), 1);
    CHECK_EQ_INT(ctl(argv[2], dir, "release", "all"), 0);
    CHECK(ctl_said(dir, "released 1 quarantined batches"));
    CHECK_EQ_INT(quarantined(ep), 0);

    CHECK_EQ_INT(h_stop(target), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
