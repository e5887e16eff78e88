/* itest_redelivery: a consumer SIGKILLed while it holds a lease gets its slot redelivered.
 *
 * The real dflash-queue runs in a temp runtime dir (lease 800 ms, heartbeat 100 ms, liveness 10:
 * a peer silent for 1 s is expired, which leaves this process room for a stall of most of a
 * second between its heartbeats; with liveness 3, a 60 ms sleep stretched past 240 ms expired
 * the target and its pool with the ready batch). This process registers a pool and makes one
 * batch ready; a child consumer (this binary in "consumer" mode) claims it, prints the granted
 * unit and hangs. It is SIGKILLed (its lease expires after 800 ms, its session after 1 s); a
 * second consumer then claims and must get the very same batch, and the broker counts the
 * redelivery; `dflash-ctl watch` then shows no lease held (the expired one once counted as
 * leased). */
#include "check.h"
#include "harness.h"

#include <poll.h>

static int consumer_main(const char *endpoint)
{
    client *c = client_new(endpoint, WIRE_ROLE_DRAFTER, "victim");
    if (!c || client_hello(c, NULL, 0)) return 1;
    wire_grant g;
    uint64_t end = h_now_ms() + 10000;
    while (h_now_ms() < end) {
        int rc = client_claim(c, &g);
        if (rc == 0) {
            printf("%u %u %llu %llu\n", g.unit.epoch, g.unit.bucket,
                   (unsigned long long)g.unit.index, (unsigned long long)g.lease_id);
            fflush(stdout);
            for (;;) pause(); /* holds the lease until killed */
        }
        h_sleep_ms(5);
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "consumer") == 0) return consumer_main(argv[2]);
    if (argc < 2) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *extra[] = {"--journal=none", "--min-ready=0", "--lease-timeout-ms=800",
                           "--heartbeat-ms=100", "--liveness=10", NULL};
    pid_t q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    client *t = client_new(ep, WIRE_ROLE_TARGET, "target");
    CHECK_EQ_INT(client_hello(t, NULL, 0), 0);
    wire_pool pool;
    h_pool(&pool, 0xabc, 4, 1, 5, 1);
    CHECK_EQ_INT(client_register_pool(t, &pool), 0);
    wire_work_unit wu;
    CHECK_EQ_INT(client_request_work(t, 0xabc, &wu), 0);
    wire_slot_ready r = {0xabc, wu.slot, wu.unit, 100, 3};
    CHECK_EQ_INT(client_slot_ready(t, &r), 0);
    /* a heartbeat (client_poll, the heartbeat thread's call) keeps the broker's words about the
     * last call: a drafter reads them after a refusal (defect: the poll cleared them) */
    CHECK_EQ_INT(client_request_work(t, 0xdead, &wu), DFLASH_ESTALE);
    char said[WIRE_MAX_TEXT];
    snprintf(said, sizeof said, "%s", client_last_error(t));
    h_sleep_ms(60); /* past half the broker's 100 ms heartbeat: the poll sends one */
    CHECK_EQ_INT(client_poll(t), 0);
    CHECK(said[0] && strcmp(client_last_error(t), said) == 0);

    char *cargv[] = {"/proc/self/exe", "consumer", ep, NULL};
    int fd = -1;
    pid_t victim = h_spawn(cargv, &fd);
    /* The target (this process) must keep its session alive while the victim starts: with a
     * 100 ms heartbeat and liveness 10, a slow start (ASan, a loaded machine) would otherwise
     * expire the target, and its pool with the ready batch, before the victim claims. */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    for (uint64_t until = h_now_ms() + 10000; h_now_ms() < until && poll(&pfd, 1, 50) == 0;)
        client_poll(t);
    FILE *in = fdopen(fd, "r");
    unsigned e = 0, bkt = 0;
    unsigned long long idx = 0, lease = 0;
    CHECK_EQ_INT(fscanf(in, "%u %u %llu %llu", &e, &bkt, &idx, &lease), 4);
    CHECK(e == wu.unit.epoch && bkt == wu.unit.bucket && idx == wu.unit.index);
    h_kill(victim, SIGKILL);
    fclose(in);

    /* A second consumer: nothing else is ready, so a grant can only be the redelivery. */
    client *d = client_new(ep, WIRE_ROLE_DRAFTER, "survivor");
    CHECK_EQ_INT(client_hello(d, NULL, 0), 0);
    wire_grant g;
    int rc = DFLASH_EAGAIN;
    uint64_t t0 = h_now_ms(), end = t0 + 10000;
    while (h_now_ms() < end && (rc = client_claim(d, &g)) == DFLASH_EAGAIN) {
        client_poll(t);
        h_sleep_ms(10);
    }
    CHECK_EQ_INT(rc, 0);
    CHECK(g.unit.index == idx && g.unit.bucket == bkt && g.unit.epoch == e);
    CHECK(g.lease_id != lease);
    /* the grant carries what the importer needs to find the batch */
    CHECK_EQ_INT(g.slot, wu.slot);
    CHECK_EQ_INT(g.offset, (uint64_t)wu.slot * pool.slot_size);
    CHECK_EQ_INT(g.n_tokens, 100);
    CHECK_EQ_INT(g.n_seqs, 3);
    CHECK_EQ_INT(g.backend, WIRE_BACKEND_HOST);
    CHECK(strcmp(g.shm_name, pool.shm_name) == 0);
    CHECK_EQ_INT(client_release(d, g.lease_id), 0);
    /* the dead consumer's lease is stale now */
    CHECK_EQ_INT(client_release(d, lease), DFLASH_ESTALE);
    CHECK_EQ_INT(client_ack(d, &g.unit, 1), 0);
    printf("redelivered after %llu ms\n", (unsigned long long)(h_now_ms() - t0));

    wire_status s;
    CHECK_EQ_INT(client_status(d, &s), 0);
    CHECK(s.redeliveries >= 1);
    CHECK_EQ_INT(s.batches_trained, 1);

    /* dflash-ctl watch counts the leases held now: the expired one is not (2 grants, 1
     * release, 1 expiry: 0 leased) */
    char rt[128], line[512] = "";
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    char *wargv[] = {argv[2], rt, "--count=1", "watch", NULL};
    int wfd = -1;
    pid_t watcher = h_spawn(wargv, &wfd);
    struct pollfd wp = {.fd = wfd, .events = POLLIN};
    for (uint64_t until = h_now_ms() + 10000; h_now_ms() < until && poll(&wp, 1, 50) == 0;)
        client_poll(t), client_poll(d);
    FILE *wout = fdopen(wfd, "r");
    CHECK(fgets(line, sizeof line, wout) != NULL);
    CHECK(strstr(line, "stats") == line && strstr(line, " leased 0 ") != NULL);
    if (!strstr(line, " leased 0 ")) fprintf(stderr, "watch printed: %s", line);
    h_kill(watcher, SIGTERM);
    fclose(wout);

    client_destroy(&d);
    client_destroy(&t);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
