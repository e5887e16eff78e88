/* itest_heartbeat_thread: a daemon's heartbeat thread (heartbeat.h) speaks for its peer while
 * the main loop is busy elsewhere (a long step, a checkpoint being written: no request of its
 * own for seconds), and stops speaking for it after heartbeat_quiet (a drafter that stops with
 * its broker gone). Without the thread's polls the broker expires such a peer and hands its
 * leases to others; after quiet, polls would keep a stopping peer registered.
 *
 * The real dflash-queue (heartbeat 300 ms, liveness 3: a peer is expired about 0.9-1.2 s after
 * its last word; wide enough for a loaded test machine); this process a drafter peer whose main
 * thread sends nothing:
 *   1. with the heartbeat thread running, 4 s (4 expiry windows) pass: the broker still counts
 *      the peer (status peers, read through ctl sessions, which hold no peer entry);
 *   2. heartbeat_quiet: the peer is expired within 10 s.
 * Usage: itest_heartbeat_thread QUEUE CTL. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "heartbeat.h"

/* status' peer count through a fresh ctl session; -1 when the broker does not answer */
static int peers_now(const char *ep)
{
    wire_status s;
    return h_broker_status(ep, &s) == 0 ? (int)s.peers : -1;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *extra[] = {"--heartbeat-ms=300", "--liveness=3", "--stats-interval-ms=0",
                           "--journal=none", NULL};
    pid_t q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    int rc = 0;
    client *d = h_client(ep, WIRE_ROLE_DRAFTER, "busy-drafter", 20, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(peers_now(ep), 1);
    heartbeat *hb = heartbeat_start(d, 0, "itest drafter");
    CHECK(hb != NULL);

    /* 1: the main thread busy for 4 s; the thread's heartbeats keep the peer */
    h_sleep_ms(4000);
    int during = peers_now(ep);
    printf("after 4 s without a request of the main thread: %d peer(s)\n", during);
    CHECK_EQ_INT(during, 1);

    /* 2: quiet: nobody speaks for the peer any more, and the broker expires it */
    heartbeat_quiet(hb);
    uint64_t t0 = h_now_ms();
    int after = 1;
    while (h_now_ms() - t0 < 10000 && (after = peers_now(ep)) != 0) h_sleep_ms(50);
    printf("after heartbeat_quiet: %d peer(s) within %llu ms\n", after,
           (unsigned long long)(h_now_ms() - t0));
    CHECK_EQ_INT(after, 0);

    heartbeat_stop(&hb);
    client_destroy(&d);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
