/* itest_broker_restart: the broker SIGKILLed and restarted mid-run loses no batch and has none
 * trained twice.
 *
 * The real dflash-queue runs with a journal in a temp dir. A producer child (this binary in
 * "producer" mode) fills slots as the broker asks; a consumer child ("consumer" mode) claims,
 * "copies" (adds the unit to its held list), releases, acks and commits every 4 steps, printing
 * "TRAIN e b i" for every grant it trains. Both re-register (hello with held units, pool) when a
 * call says DFLASH_ESTALE, and retry on timeouts, as the real daemons do. The parent kills the
 * broker with SIGKILL after 12 trained batches, restarts it on the same journal, and waits until
 * all 40 batches are trained. Checks: every unit trained exactly once, and the restarted broker's
 * ledger has 40 trained-or-committed, none to-do or in flight, and nothing is granted again in the
 * second after that. */
#include "check.h"
#include "harness.h"

#include <fcntl.h>

#define BATCHES 20
#define BUCKETS 2
#define TOTAL (BATCHES * BUCKETS)
#define POOL_INC 0x7a11ull
#define HELLO_MS 20000 /* how long a hello is retried while the broker restarts */

_Noreturn static void producer_main(const char *ep)
{
    client *c = client_new(ep, WIRE_ROLE_TARGET, "producer");
    client_set_timeout(c, 500);
    wire_pool pool;
    h_pool(&pool, POOL_INC, 8, BUCKETS, BATCHES, 1);
    bool registered = false;
    for (;;) {
        if (!registered) {
            if (h_hello_retry(c, NULL, 0, HELLO_MS) || client_register_pool(c, &pool)) continue;
            registered = true;
        }
        wire_work_unit wu;
        int rc = client_request_work(c, POOL_INC, &wu);
        if (rc == 0) {
            wire_slot_ready r = {POOL_INC, wu.slot, wu.unit, 64, 1};
            do rc = client_slot_ready(c, &r);
            while (rc == DFLASH_ETIMEOUT);
            if (rc == DFLASH_ESTALE) {
                /* new broker: re-register, then report the filled slot again (it is adopted) */
                if (h_hello_retry(c, NULL, 0, HELLO_MS) || client_register_pool(c, &pool))
                    registered = false;
                else
                    client_slot_ready(c, &r);
            }
        } else if (rc == DFLASH_ESTALE) {
            registered = false;
        } else if (rc != DFLASH_ETIMEOUT) {
            h_sleep_ms(2);
            client_poll(c);
        }
    }
}

_Noreturn static void consumer_main(const char *ep)
{
    client *c = client_new(ep, WIRE_ROLE_DRAFTER, "consumer");
    client_set_timeout(c, 500);
    wire_unit held[WIRE_MAX_HELD];
    uint32_t n_held = 0;
    uint64_t step = 0;
    h_hello_retry(c, NULL, 0, HELLO_MS);
    for (;;) {
        wire_grant g;
        int rc = client_claim(c, &g);
        if (rc == DFLASH_ESTALE) {
            h_hello_retry(c, held, n_held, HELLO_MS);
            continue;
        }
        if (rc) {
            h_sleep_ms(2);
            continue;
        }
        /* copied: from now on the batch is ours to train */
        held[n_held++] = g.unit;
        printf("TRAIN %u %u %llu\n", g.unit.epoch, g.unit.bucket, (unsigned long long)g.unit.index);
        fflush(stdout);
        rc = client_release(c, g.lease_id);
        if (rc == DFLASH_ESTALE && client_broker_restarted(c))
            h_hello_retry(c, held, n_held, HELLO_MS);
        step++;
        for (;;) { /* the ack must land, whatever happens to the broker */
            rc = client_ack(c, &g.unit, step);
            if (rc == 0 || rc == DFLASH_EEXISTS) break; /* EEXISTS: our earlier ack landed */
            if (rc == DFLASH_ESTALE) h_hello_retry(c, held, n_held, HELLO_MS);
            else if (rc != DFLASH_ETIMEOUT) {
                fprintf(stderr, "consumer: ack %s: %s\n", err_name(rc), client_last_error(c));
                break;
            }
        }
        n_held--;
        if (step % 4 == 0) {
            while ((rc = client_checkpoint_committed(c, step)) != 0) {
                if (rc == DFLASH_ESTALE) h_hello_retry(c, held, n_held, HELLO_MS);
                else if (rc != DFLASH_ETIMEOUT) break;
            }
        }
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "producer") == 0) producer_main(argv[2]);
    if (argc == 3 && strcmp(argv[1], "consumer") == 0) consumer_main(argv[2]);
    if (argc < 2) return 2;
    char dir[64], ep[128], journal[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    const char *extra[] = {journal, "--min-ready=0", "--max-depth=6", "--lease-timeout-ms=500",
                           "--heartbeat-ms=200", "--liveness=5", "--orphan-grace-ms=1500",
                           "--stats-interval-ms=0", "--log-level=warn", NULL};
    pid_t q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    char *pargv[] = {"/proc/self/exe", "producer", ep, NULL};
    char *cargv[] = {"/proc/self/exe", "consumer", ep, NULL};
    pid_t prod = h_spawn(pargv, NULL);
    int fd = -1;
    pid_t cons = h_spawn(cargv, &fd);
    FILE *in = fdopen(fd, "r");

    int count[BUCKETS][BATCHES] = {{0}};
    int trained = 0, distinct = 0, bad = 0;
    bool restarted = false;
    uint64_t end = h_now_ms() + 60000;
    char line[128];
    while (distinct < TOTAL && h_now_ms() < end && fgets(line, sizeof line, in)) {
        unsigned e, b;
        unsigned long long i;
        if (sscanf(line, "TRAIN %u %u %llu", &e, &b, &i) != 3 || e != 0 || b >= BUCKETS ||
            i >= BATCHES) {
            bad++;
            continue;
        }
        if (count[b][i]++ == 0) distinct++;
        trained++;
        if (trained == 12 && !restarted) {
            h_kill(q, SIGKILL);
            q = h_start_queue(argv[1], dir, extra);
            CHECK(q > 0);
            restarted = true;
        }
    }
    CHECK(restarted);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(distinct, TOTAL);
    int dups = 0;
    for (int b = 0; b < BUCKETS; b++)
        for (int i = 0; i < BATCHES; i++)
            if (count[b][i] > 1) {
                dups++;
                fprintf(stderr, "batch 0/%d/%d trained %d times\n", b, i, count[b][i]);
            }
    CHECK_EQ_INT(dups, 0);

    /* the ledger agrees: all trained (or committed), nothing left, nothing double-acked */
    client *c = client_new(ep, WIRE_ROLE_CTL, "checker");
    wire_status s;
    uint64_t until = h_now_ms() + 10000;
    int rc;
    do {
        rc = client_status(c, &s);
        if (!rc && s.batches_trained + s.batches_committed == TOTAL) break;
        h_sleep_ms(20);
    } while (h_now_ms() < until);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(s.batches_trained + s.batches_committed, TOTAL);
    CHECK_EQ_INT(s.batches_todo, 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    CHECK(s.batches_committed > 0);
    /* and no batch is granted again once all are trained: the consumer prints nothing more
     * (a second training after the 40th distinct one would otherwise go unread) */
    int late = 0;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    for (uint64_t quiet = h_now_ms() + 1000; h_now_ms() < quiet;) {
        if (fgets(line, sizeof line, in)) {
            late++;
            fprintf(stderr, "after all batches were trained: %s", line);
        } else {
            clearerr(in);
            h_sleep_ms(20);
        }
    }
    CHECK_EQ_INT(late, 0);
    printf("%d trainings of %d batches, %llu committed, broker restarted once\n", trained, TOTAL,
           (unsigned long long)s.batches_committed);
    client_destroy(&c);

    h_kill(prod, SIGKILL);
    h_kill(cons, SIGKILL);
    fclose(in);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
