/* itest_curve: the broker on tcp://127.0.0.1 with ZeroMQ CURVE (DESIGN.md section 5).
 *   (a) a client whose key is in --curve-clients gets hello, ping and status answered;
 *   (b) a client without CURVE, and one whose key is in no allowed dir, get no reply at all;
 *   (c) set/pause/drain/release from a non-admin key get ERROR DENIED and change nothing; set
 *       and release with the admin key work and status shows it; the ipc:// endpoint (0700 dir)
 *       still steers; status counts (b)'s refused connections and (c)'s refused steering
 *       (connections_refused, steering_refused; `dflash-ctl status`'s "refused" line);
 *   (d) a tcp:// bind without CURVE options is refused at start-up (exit 2), and starts only
 *       with --insecure-tcp;
 *   (e) `dflash-ctl watch` where the broker announces: over tcp with the default ipc:// PUB it
 *       watches on the broker's host and exits 2 at once naming --pub-endpoint where the socket
 *       file is not there (another host); with --pub-endpoint tcp:// it watches over tcp, and a
 *       keyless ctl over ipc:// exits 2 within three stats intervals instead of hanging;
 *   (f) a peer is bound to the key it registered with (the security audit's key-binding
 *       finding): while drafter d1 of key alice is live, key bob's hello as d1 (a new
 *       incarnation), its hello or ResumeFrom naming d1's run, and its requests sent from d1's
 *       routing id (a connection that takes it over: ROUTER_HANDOVER) are all refused DENIED,
 *       logged with bob's key, and d1 keeps its session; alice's restart of d1 (same key, new
 *       incarnation) replaces it as before; once d1 is expired, bob may take the name. Each of
 *       those refusals says so in the Error (other_key; a DENIED for the admin key does not),
 *       and the broker counts them in status (key_refusals; `dflash-ctl status`'s "refused"
 *       line, and --json has the counters). Real dflash-drafter
 *       processes under bob's key exit 4 (another live drafter has their --name or run), their
 *       log naming the cause: a --verify drafter named d1 (its hello refused: it exited 6, the
 *       code for another model), a trainer of d1's run (its --checkpoint-dir's run-id; its
 *       resume refused: it exited 1) and a --group rank named d1 (its hello refused: it
 *       retried it as a busy broker's, and exited 1 at --broker-wait-ms).
 * Keys come from `dflash-ctl keygen` (the operator's path) into a temp dir. Loopback only; every
 * wait has a deadline (no fixed sleeps).
 * Usage: itest_curve QUEUE CTL DRAFTER MKMODEL. */
#include "check.h"
#include "curve.h"
#include "harness.h"

#include <inttypes.h>
#include <zmq.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>

/* A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* The bound on a program run that must end (keygen, a refused start-up, a ctl command): not a
 * timing; `dflash-ctl keygen` outlasted 10 s under ctest -j6 on 2 cores (ASan). */
#define RUN_MS 30000

/* Runs argv to completion within deadline_ms; returns its exit status, or -1 (killed at the
 * deadline / not exited normally). */
static int run_wait(char *const argv[], int deadline_ms)
{
    pid_t pid = h_spawn(argv, NULL);
    uint64_t end = h_now_ms() + (uint64_t)deadline_ms;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (r < 0 || h_now_ms() >= end) {
            h_kill(pid, SIGKILL);
            return -1;
        }
        h_sleep_ms(10);
    }
}

/* run_wait with stdout and stderr in the file at log (read back into out, NUL-terminated).
 * keep, when not NULL, is a live peer that sends a heartbeat every 100 ms meanwhile (so that the
 * broker does not expire it while the program runs beside it). */
static int run_logged(char *const argv[], int deadline_ms, const char *log, char *out, size_t len,
                      client *keep)
{
    unlink(log);
    pid_t pid = h_spawn_logged(argv, log);
    uint64_t end = h_now_ms() + (uint64_t)deadline_ms;
    int st = 0, rc = -1;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            break;
        }
        if (r < 0 || h_now_ms() >= end) {
            h_kill(pid, SIGKILL);
            break;
        }
        if (keep) client_heartbeat(keep);
        h_sleep_ms(keep ? 100 : 10);
    }
    char *said = test_slurp(log, NULL);
    snprintf(out, len, "%s", said ? said : "");
    free(said);
    return rc;
}

static int keygen(const char *ctl, const char *dir, const char *name)
{
    char *argv[] = {(char *)ctl, "keygen", (char *)dir, (char *)name, NULL};
    return run_wait(argv, RUN_MS);
}

/* A ctl client on ep with CURVE keys from files (server_pub, key: NULL = no CURVE). */
static client *ctl_client(const char *ep, const char *server_pub, const char *key, int timeout)
{
    client *c = client_new(ep, WIRE_ROLE_CTL, "itest");
    if (c && server_pub && client_set_curve_files(c, server_pub, key) != 0) {
        fprintf(stderr, "curve keys: %s\n", client_last_error(c));
        client_destroy(&c);
    }
    if (c) client_set_timeout(c, timeout);
    return c;
}

/* Waits until a client with these keys gets a hello answer (the broker is up). */
static bool wait_up(const char *ep, const char *server_pub, const char *key, int deadline_ms)
{
    client *c = ctl_client(ep, server_pub, key, 200);
    uint64_t end = h_now_ms() + (uint64_t)deadline_ms;
    bool up = false;
    while (c && !up && h_now_ms() < end) up = client_hello(c, NULL, 0) == 0;
    client_destroy(&c);
    return up;
}

/* A drafter client named name on ep with key (a .key file), timeout ms; NULL on failure. */
static client *drafter_client(const char *ep, const char *server_pub, const char *key,
                              const char *name, int timeout)
{
    client *c = client_new(ep, WIRE_ROLE_DRAFTER, name);
    if (c && client_set_curve_files(c, server_pub, key) != 0) {
        fprintf(stderr, "curve keys: %s\n", client_last_error(c));
        client_destroy(&c);
    }
    if (c) client_set_timeout(c, timeout);
    return c;
}

/* A raw DEALER on ep with routing id rid and CURVE keys (server public, own secret: Z85), as a
 * client that copies a live peer's routing id would open it. */
static void *raw_dealer(void *zctx, const char *ep, const char *rid, const char *server_pub,
                        const char *secret)
{
    curve_key pub;
    CHECK_EQ_INT(curve_public_of(secret, pub), 0);
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, rid, strlen(rid));
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_pub, CURVE_Z85_LEN);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, CURVE_Z85_LEN);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, secret, CURVE_Z85_LEN);
    CHECK_EQ_INT(zmq_connect(s, ep), 0);
    return s;
}

/* Sends request type t as drafter incarnation inc on raw socket s until a reply comes (the
 * connection holding the routing id may change hands while the victim reconnects: a reply may
 * go to it), within deadline_ms: the reply's error code (0: not an Error), or 1 (no reply). */
static int raw_request(void *s, wire_type t, uint64_t inc, int deadline_ms)
{
    static uint8_t buf[WIRE_MAX_MSG];
    wire_msg m;
    uint64_t end = h_now_ms() + (uint64_t)deadline_ms;
    for (uint64_t id = 1000; h_now_ms() < end; id++) {
        wire_msg_init(&m, t, WIRE_ROLE_DRAFTER, inc, id);
        if (t == WIRE_HEARTBEAT) m.u.sent_ms = 1;
        int n = wire_pack(&m, buf, sizeof buf);
        CHECK(n > 0);
        if (n <= 0 || zmq_send(s, buf, (size_t)n, ZMQ_DONTWAIT) < 0) {
            h_sleep_ms(20);
            continue;
        }
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        while (zmq_poll(&it, 1, 300) > 0) {
            int got = zmq_recv(s, buf, sizeof buf, 0);
            if (got <= 0 || wire_unpack(buf, (size_t)got, &m, NULL, 0) != 0) continue;
            return m.type == WIRE_ERROR ? m.u.error.code : 0;
        }
    }
    return 1;
}

/* Retries call(c) until it returns 0 within deadline_ms (a reconnect may cost a timeout). */
static int until_ok(int (*call)(client *), client *c, int deadline_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)deadline_ms;
    int rc;
    while ((rc = call(c)) != 0 && h_now_ms() < end) h_sleep_ms(20);
    return rc;
}

static int hello0(client *c) { return client_hello(c, NULL, 0); }

/* Runs the drafter argv (output to log, read back into out) to its exit within deadline_ms while
 * the live peer `keep` sends heartbeats (not expired meanwhile): its exit status, or -1; its
 * output on stderr unless it exited 4. */
static int run_beside(char *const argv[], const char *log, client *keep, int deadline_ms,
                      char *out, size_t len)
{
    int rc = run_logged(argv, deadline_ms, log, out, len, keep);
    if (rc != 4) fprintf(stderr, "drafter exited %d:\n%s\n", rc, out);
    return rc;
}

/* The broker's key_refusals, asked with key (a .key file); UINT64_MAX when it does not answer. */
static uint64_t key_refusals(const char *ep, const char *server_pub, const char *key)
{
    static wire_status s;
    client *c = ctl_client(ep, server_pub, key, 2000);
    uint64_t n = c && client_status(c, &s) == 0 ? s.key_refusals : UINT64_MAX;
    client_destroy(&c);
    return n;
}

static uint32_t status_min_ready(client *c)
{
    static wire_status s;
    return client_status(c, &s) == 0 ? s.min_ready : 0;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: itest_curve QUEUE CTL DRAFTER MKMODEL\n");
        return 2;
    }
    if (!curve_available()) { /* Debian's libzmq has it: a build without it is a failure */
        fprintf(stderr, "libzmq without CURVE: the broker's authentication cannot run\n");
        return 1;
    }
    const char *queue = argv[1], *ctl = argv[2], *drafter = argv[3], *mkmodel = argv[4];
    char dir[64], p[20][256];
    h_tempdir(dir, sizeof dir);
    snprintf(p[0], sizeof p[0], "%s/clients", dir);
    snprintf(p[1], sizeof p[1], "%s/admins", dir);
    snprintf(p[2], sizeof p[2], "%s/others", dir);
    for (int i = 0; i < 3; i++) CHECK(mkdir(p[i], 0700) == 0);
    CHECK_EQ_INT(keygen(ctl, dir, "broker"), 0);
    CHECK_EQ_INT(keygen(ctl, p[0], "alice"), 0);
    CHECK_EQ_INT(keygen(ctl, p[1], "root"), 0);
    CHECK_EQ_INT(keygen(ctl, p[2], "mallory"), 0);
    if (check_failed) { /* every case below needs the keys (a NULL client otherwise) */
        h_rmdir(dir);
        CHECK_DONE();
    }
    CHECK(keygen(ctl, p[0], "alice") != 0); /* never overwrites a key */
    struct stat st;
    snprintf(p[3], sizeof p[3], "%s/clients/alice.key", dir);
    CHECK(stat(p[3], &st) == 0 && (st.st_mode & 0777) == 0600);
    char broker_key[256], broker_pub[256], alice[256], root[256], mallory[256];
    snprintf(broker_key, sizeof broker_key, "%s/broker.key", dir);
    snprintf(broker_pub, sizeof broker_pub, "%s/broker.pub", dir);
    snprintf(alice, sizeof alice, "%s/alice.key", p[0]);
    snprintf(root, sizeof root, "%s/root.key", p[1]);
    snprintf(mallory, sizeof mallory, "%s/mallory.key", p[2]);

    /* (d) tcp:// without CURVE: refused at start-up, before binding anything */
    int port = free_port();
    CHECK(port > 0);
    char bind[64], tcp_ep[64], rt[300], ipc_ep[300];
    snprintf(bind, sizeof bind, "--bind=tcp://127.0.0.1:%d", port);
    snprintf(tcp_ep, sizeof tcp_ep, "tcp://127.0.0.1:%d", port);
    snprintf(rt, sizeof rt, "--runtime-dir=%s/rt", dir);
    snprintf(ipc_ep, sizeof ipc_ep, "ipc://%s/rt/queue.sock", dir);
    {
        char *a[] = {(char *)queue, rt, "--journal=none", bind, NULL};
        CHECK_EQ_INT(run_wait(a, RUN_MS), 2);
        char ep[80];
        snprintf(ep, sizeof ep, "--endpoint=%s", tcp_ep);
        char *b[] = {(char *)queue, rt, "--journal=none", ep, NULL};
        CHECK_EQ_INT(run_wait(b, RUN_MS), 2);
        /* half the CURVE options is a configuration error too */
        char sk[300];
        snprintf(sk, sizeof sk, "--curve-secret-key=%s", broker_key);
        char *c[] = {(char *)queue, rt, "--journal=none", bind, sk, NULL};
        CHECK_EQ_INT(run_wait(c, RUN_MS), 2);
    }
    /* ... and served without CURVE only with the explicit test flag */
    {
        char *a[] = {(char *)queue, rt, "--journal=none", bind, "--insecure-tcp", NULL};
        pid_t q = h_spawn(a, NULL);
        CHECK(wait_up(tcp_ep, NULL, NULL, H_BROKER_UP_MS));
        CHECK_EQ_INT(h_stop(q), 0);
    }

    /* the CURVE broker: tcp:// (CURVE) and the default ipc:// endpoint */
    char sk[300], cl[300], ad[300];
    snprintf(sk, sizeof sk, "--curve-secret-key=%s", broker_key);
    snprintf(cl, sizeof cl, "--curve-clients=%s", p[0]);
    snprintf(ad, sizeof ad, "--admin-keys=%s", p[1]);
    port = free_port();
    snprintf(bind, sizeof bind, "--bind=tcp://127.0.0.1:%d", port);
    snprintf(tcp_ep, sizeof tcp_ep, "tcp://127.0.0.1:%d", port);
    char *qa[] = {(char *)queue, rt, "--journal=none", bind, sk, cl, ad, NULL};
    pid_t q = h_spawn(qa, NULL);
    CHECK(wait_up(tcp_ep, broker_pub, alice, H_BROKER_UP_MS));

    /* (a) an allowed key: hello, ping, status */
    client *a = ctl_client(tcp_ep, broker_pub, alice, 2000);
    CHECK(a != NULL);
    CHECK_EQ_INT(client_hello(a, NULL, 0), 0);
    CHECK_EQ_INT(client_heartbeat(a), 0);
    CHECK_EQ_INT(status_min_ready(a), 30);

    /* (b) no CURVE at all, a key in no allowed dir, and the right key with the wrong server
     * key: no reply, whatever they send */
    client *none = ctl_client(tcp_ep, NULL, NULL, 300);
    CHECK_EQ_INT(client_hello(none, NULL, 0), DFLASH_ETIMEOUT);
    CHECK_EQ_INT(client_status(none, NULL), DFLASH_ETIMEOUT);
    client *m = ctl_client(tcp_ep, broker_pub, mallory, 300);
    CHECK_EQ_INT(client_hello(m, NULL, 0), DFLASH_ETIMEOUT);
    CHECK_EQ_INT(client_heartbeat(m), DFLASH_ETIMEOUT);
    char alice_pub[256];
    snprintf(alice_pub, sizeof alice_pub, "%s/alice.pub", p[0]);
    client *wrong = ctl_client(tcp_ep, alice_pub, alice, 300);
    CHECK_EQ_INT(client_hello(wrong, NULL, 0), DFLASH_ETIMEOUT);
    client_destroy(&none);
    client_destroy(&m);
    client_destroy(&wrong);
    /* ... and a ctl without keys says so with exit 2 (timeout) */
    {
        char ep[80];
        snprintf(ep, sizeof ep, "--endpoint=%s", tcp_ep);
        char *c[] = {(char *)ctl, ep, "--timeout-ms=300", "ping", NULL};
        CHECK_EQ_INT(run_wait(c, RUN_MS), 2);
    }

    /* (c) steering: DENIED for a plain client key, allowed for the admin key */
    wire_settings set = {0}, applied;
    set.n = 1;
    snprintf(set.kv[0].key, WIRE_MAX_KEY, "min_ready");
    snprintf(set.kv[0].value, WIRE_MAX_VALUE, "7");
    CHECK_EQ_INT(client_set(a, &set, &applied), DFLASH_EDENIED);
    CHECK(strstr(client_last_error(a), "admin key") != NULL);
    CHECK(!client_last_error_other_key(a)); /* no other key's peer: not that DENIED */
    CHECK_EQ_INT(client_pause(a), DFLASH_EDENIED);
    CHECK_EQ_INT(client_drain(a), DFLASH_EDENIED);
    CHECK_EQ_INT(client_release_quarantine(a, NULL, NULL), DFLASH_EDENIED);
    CHECK(strstr(client_last_error(a), "admin key") != NULL);
    CHECK_EQ_INT(status_min_ready(a), 30);
    {
        wire_status s;
        CHECK_EQ_INT(client_status(a, &s), 0);
        CHECK_EQ_INT(s.state, WIRE_STATE_RUNNING);
    }
    client *r = ctl_client(tcp_ep, broker_pub, root, 2000);
    CHECK_EQ_INT(client_hello(r, NULL, 0), 0);
    CHECK_EQ_INT(client_set(r, &set, &applied), 0);
    CHECK_EQ_INT(status_min_ready(a), 7);
    uint64_t released = 99;
    CHECK_EQ_INT(client_release_quarantine(r, NULL, &released), 0); /* none is quarantined */
    CHECK_EQ_INT(released, 0);
    /* the same through dflash-ctl with key files */
    {
        char ep[80], sv[300], k1[300], k2[300];
        snprintf(ep, sizeof ep, "--endpoint=%s", tcp_ep);
        snprintf(sv, sizeof sv, "--curve-server-key=%s", broker_pub);
        snprintf(k1, sizeof k1, "--curve-key=%s", alice);
        snprintf(k2, sizeof k2, "--curve-key=%s", root);
        char *c1[] = {(char *)ctl, ep, sv, k1, "set", "min_ready=9", NULL};
        CHECK_EQ_INT(run_wait(c1, RUN_MS), 1);
        CHECK_EQ_INT(status_min_ready(a), 7);
        char *c2[] = {(char *)ctl, ep, sv, k2, "set", "min_ready=11", NULL};
        CHECK_EQ_INT(run_wait(c2, RUN_MS), 0);
        CHECK_EQ_INT(status_min_ready(a), 11);
        char *c3[] = {(char *)ctl, ep, sv, k1, "status", NULL};
        char slog[300], said3[8192];
        snprintf(slog, sizeof slog, "%s/status.log", dir);
        CHECK_EQ_INT(run_logged(c3, RUN_MS, slog, said3, sizeof said3, NULL), 0);
        CHECK(strstr(said3, "leases    grants") != NULL);
        /* refused so far, in status' line: (b)'s key in no allowed dir, at the handshake (each
         * reconnection: at least one), and (c)'s steering without the admin key (four requests
         * and c1's set); nothing by the caps or the key binding yet */
        CHECK(strstr(said3, "refused   hellos (peer table full) 0  replies dropped (journal "
                            "wait) 0  key refusals (another CURVE key) 0  connections (key not "
                            "allowed) ") != NULL);
        CHECK(strstr(said3, "  steering (not an admin key) 5\n") != NULL);
        wire_status s;
        CHECK_EQ_INT(client_status(a, &s), 0);
        CHECK(s.connections_refused >= 1 && s.steering_refused == 5);
        if (check_failed) fprintf(stderr, "dflash-ctl status said:\n%s\n", said3);
    }
    /* the ipc:// endpoint in the 0700 runtime dir steers as before */
    client *local = ctl_client(ipc_ep, NULL, NULL, 2000);
    snprintf(set.kv[0].value, WIRE_MAX_VALUE, "13");
    CHECK_EQ_INT(client_set(local, &set, &applied), 0);
    CHECK_EQ_INT(status_min_ready(a), 13);
    CHECK_EQ_INT(client_pause(r), 0);
    {
        wire_status s;
        CHECK_EQ_INT(client_status(a, &s), 0);
        CHECK_EQ_INT(s.state, WIRE_STATE_PAUSED);
    }
    client_destroy(&local);
    client_destroy(&r);
    client_destroy(&a);

    /* (e) watch over tcp; the broker announces on its default ipc:// PUB. On its host the
     * socket file is there and watch subscribes to it (it hung: CURVE on an ipc socket) */
    char log[300], said[4096], ep[80], sv[300], k1[300], ipc_pub[300], hidden[310];
    snprintf(log, sizeof log, "%s/ctl.log", dir);
    snprintf(ep, sizeof ep, "--endpoint=%s", tcp_ep);
    snprintf(sv, sizeof sv, "--curve-server-key=%s", broker_pub);
    snprintf(k1, sizeof k1, "--curve-key=%s", alice);
    char *w1[] = {(char *)ctl, ep, sv, k1, "--count=1", "watch", NULL};
    CHECK_EQ_INT(run_logged(w1, 15000, log, said, sizeof said, NULL), 0);
    CHECK(strncmp(said, "stats ", 6) == 0);
    /* from another host the file is not there (hidden here): exit 2 at once, naming the flag
     * (it hung, the broker answering every heartbeat) */
    snprintf(ipc_pub, sizeof ipc_pub, "%s/rt/queue-pub.sock", dir);
    snprintf(hidden, sizeof hidden, "%s.hidden", ipc_pub);
    CHECK(rename(ipc_pub, hidden) == 0);
    uint64_t t0 = h_now_ms();
    CHECK_EQ_INT(run_logged(w1, 15000, log, said, sizeof said, NULL), 2);
    CHECK(h_now_ms() - t0 < 10000); /* at once, not a hang; 5 s were outlasted under ASan, 4
                                     * tests at once on 2 cores */
    CHECK(strstr(said, "--pub-endpoint tcp://") != NULL);
    if (!strstr(said, "--pub-endpoint")) fprintf(stderr, "watch said: %s\n", said);
    CHECK(rename(hidden, ipc_pub) == 0);
    CHECK_EQ_INT(h_stop(q), 0);

    /* the broker announcing on tcp:// too (docs/operating.md's across-hosts example): watch over
     * tcp with the client key works; a ctl over ipc:// has no keys for that CURVE PUB and exits 2
     * within three stats intervals and a second, saying why */
    char pubf[80];
    int pub_port = free_port();
    snprintf(pubf, sizeof pubf, "--pub-endpoint=tcp://127.0.0.1:%d", pub_port);
    char *qb[] = {(char *)queue, rt, "--journal=none", bind, pubf, "--stats-interval-ms=100", sk,
                  cl, ad, NULL};
    q = h_spawn(qb, NULL);
    CHECK(wait_up(tcp_ep, broker_pub, alice, H_BROKER_UP_MS));
    CHECK_EQ_INT(run_logged(w1, 15000, log, said, sizeof said, NULL), 0);
    CHECK(strncmp(said, "stats ", 6) == 0);
    char *w2[] = {(char *)ctl, rt, "--count=1", "watch", NULL};
    t0 = h_now_ms();
    CHECK_EQ_INT(run_logged(w2, 15000, log, said, sizeof said, NULL), 2);
    CHECK(h_now_ms() - t0 < 10000); /* about 1.3 s; slack for a loaded machine, as above */
    CHECK(strstr(said, "no announcement came") != NULL && strstr(said, "--curve-key") != NULL);
    if (!strstr(said, "no announcement came")) fprintf(stderr, "watch said: %s\n", said);
    CHECK_EQ_INT(h_stop(q), 0);

    /* (f) key binding: alice's drafter d1 against bob's key, both in --curve-clients. A peer is
     * expired 4 s after its last request (heartbeat 500 ms x liveness 8). A Claim tells whether
     * d1's session is there (no pool: AGAIN) or not (STALE): a Heartbeat needs no session */
    char bob[256], blog[300], model[300], mlog[300];
    CHECK_EQ_INT(keygen(ctl, p[0], "bob"), 0);
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(mlog, sizeof mlog, "%s/mkmodel.log", dir);
    char *mk[] = {(char *)mkmodel, "--family", "qwen3", "--layers", "6", "--seed", "3", "--out",
                  model, NULL};
    CHECK_EQ_INT(h_run_tool(mk, mlog), 0);
    snprintf(bob, sizeof bob, "%s/bob.key", p[0]);
    snprintf(blog, sizeof blog, "%s/bind.log", dir);
    port = free_port();
    snprintf(bind, sizeof bind, "--bind=tcp://127.0.0.1:%d", port);
    snprintf(tcp_ep, sizeof tcp_ep, "tcp://127.0.0.1:%d", port);
    char *qc[] = {(char *)queue, rt, "--journal=none", bind, "--heartbeat-ms=500",
                  "--liveness=8", sk, cl, NULL};
    q = h_spawn_logged(qc, blog);
    CHECK(wait_up(tcp_ep, broker_pub, alice, H_BROKER_UP_MS));
    curve_key bob_secret, bob_public, server;
    CHECK_EQ_INT(curve_key_read(bob, true, bob_secret, NULL, 0), 0);
    CHECK_EQ_INT(curve_public_of(bob_secret, bob_public), 0);
    CHECK_EQ_INT(curve_key_read(broker_pub, false, server, NULL, 0), 0);
    const uint64_t run = 0x5eed5eed5eed5eedull;

    client *d1 = drafter_client(tcp_ep, broker_pub, alice, "d1", 500);
    CHECK(d1 != NULL);
    client_set_trainer_run(d1, run);
    CHECK_EQ_INT(client_hello(d1, NULL, 0), 0);
    char d1_inc[32];
    snprintf(d1_inc, sizeof d1_inc, "%016" PRIx64, client_incarnation(d1));

    /* bob's hello as d1 (a new incarnation of the name): DENIED, saying why without naming
     * d1's incarnation (its routing id's secret part) */
    client *b1 = drafter_client(tcp_ep, broker_pub, bob, "d1", 2000);
    CHECK_EQ_INT(client_hello(b1, NULL, 0), DFLASH_EDENIED);
    CHECK(strstr(client_last_error(b1), "another CURVE key") != NULL);
    CHECK(strstr(client_last_error(b1), d1_inc) == NULL);
    CHECK(client_last_error_other_key(b1));
    CHECK(client_last_error_replaced_by_run(b1) == 0); /* a name, no run: b1's dir is its own */
    /* bob's hello naming d1's run under another name, and a resume of that run: DENIED */
    client *b2 = drafter_client(tcp_ep, broker_pub, bob, "b2", 2000);
    client_set_trainer_run(b2, run);
    CHECK_EQ_INT(client_hello(b2, NULL, 0), DFLASH_EDENIED);
    CHECK(strstr(client_last_error(b2), "another CURVE key") != NULL);
    CHECK(client_last_error_other_key(b2));
    /* the run named, so a drafter refused this way writes no final checkpoint into a dir that
     * d1 may write (worker_session_save_refused) */
    CHECK(client_last_error_replaced_by_run(b2) == run);
    client *b3 = drafter_client(tcp_ep, broker_pub, bob, "b3", 2000);
    CHECK_EQ_INT(client_hello(b3, NULL, 0), 0);
    CHECK_EQ_INT(client_resume_from(b3, 0, run), DFLASH_EDENIED);
    CHECK(client_last_error_other_key(b3));
    CHECK(client_last_error_replaced_by_run(b3) == run);
    /* d1 keeps its session; status counts the three refusals */
    CHECK_EQ_INT(client_claim(d1, NULL), DFLASH_EAGAIN);
    CHECK_EQ_INT(key_refusals(tcp_ep, broker_pub, alice), 3);

    /* real drafters under bob's key: each exits 4, naming the cause, while d1 stays live. A
     * --verify drafter with d1's --name (its hello refused); a trainer of d1's run (b4, its
     * --checkpoint-dir's run-id d1's run: its resume refused); a --group rank with d1's name */
    {
        char epf[80], svf[300], bobf[300], said[16384], dlog[300], ck4[300], ckg[300], rid[320];
        snprintf(epf, sizeof epf, "--endpoint=%s", tcp_ep);
        snprintf(svf, sizeof svf, "--curve-server-key=%s", broker_pub);
        snprintf(bobf, sizeof bobf, "--curve-key=%s", bob);
        snprintf(dlog, sizeof dlog, "%s/drafter.log", dir);
        char *dv[] = {(char *)drafter, "--verify", "--backend=host", "--name=d1", "--hidden=8",
                      "--layers=2", "--token-budget=256", "--max-seqs=4", "--buckets=64,256",
                      "--progress-ms=0", "--timeout-ms=2000", "--broker-wait-ms=10000", epf,
                      svf, bobf, NULL};
        CHECK_EQ_INT(run_beside(dv, dlog, d1, 30000, said, sizeof said), 4);
        CHECK(strstr(said, "another CURVE key") != NULL);
        CHECK(strstr(said, "refused our hello for good: our --name 'd1' or our run") != NULL);
        snprintf(ck4, sizeof ck4, "%s/ckpt-b4", dir);
        snprintf(ckg, sizeof ckg, "%s/ckpt-g", dir);
        snprintf(rid, sizeof rid, "%s/run-id", ck4);
        CHECK(mkdir(ck4, 0700) == 0 && mkdir(ckg, 0700) == 0);
        test_spill(rid, "5eed5eed5eed5eed\n", 17); /* d1's run */
        char *tv[] = {(char *)drafter, "--train", "--model", model, "--name", "b4",
                      "--checkpoint-dir", ck4, "--block-size", "4", "--anchors", "8",
                      "--buckets", "32", "--token-budget", "128", "--max-seqs", "4", "--layers",
                      "3", "--threads", "1", "--backend", "host", "--progress-ms", "0",
                      "--timeout-ms", "2000", "--broker-wait-ms", "10000", epf, svf, bobf, NULL};
        CHECK_EQ_INT(run_beside(tv, dlog, d1, 60000, said, sizeof said), 4);
        CHECK(strstr(said, "refused our resume for good: our --name 'b4' or our run") != NULL);
        char *gv[] = {(char *)drafter, "--train", "--model", model, "--name", "d1", "--group",
                      "g", "--checkpoint-dir", ckg, "--block-size", "4", "--anchors", "8",
                      "--buckets", "32", "--token-budget", "128", "--max-seqs", "4", "--layers",
                      "3", "--threads", "1", "--backend", "host", "--progress-ms", "0",
                      "--timeout-ms", "2000", "--broker-wait-ms", "10000", epf, svf, bobf, NULL};
        CHECK_EQ_INT(run_beside(gv, dlog, d1, 60000, said, sizeof said), 4);
        CHECK(strstr(said, "refused our hello for good: our --name 'd1' or our run") != NULL);
    }
    CHECK(key_refusals(tcp_ep, broker_pub, alice) >= 6);
    CHECK_EQ_INT(client_claim(d1, NULL), DFLASH_EAGAIN); /* d1 still has its session */

    /* bob's connection with d1's routing id: it takes d1's connection over (handover), but
     * every request on it is refused, a Heartbeat and a Claim as d1's incarnation alike */
    char d1_rid[128];
    snprintf(d1_rid, sizeof d1_rid, "drafter-d1-%s", d1_inc);
    void *zctx = zmq_ctx_new();
    void *raw = raw_dealer(zctx, tcp_ep, d1_rid, server, bob_secret);
    CHECK_EQ_INT(raw_request(raw, WIRE_HEARTBEAT, client_incarnation(d1), 5000), DFLASH_EDENIED);
    CHECK_EQ_INT(raw_request(raw, WIRE_CLAIM, client_incarnation(d1), 5000), DFLASH_EDENIED);
    zmq_close(raw);
    zmq_ctx_term(zctx);
    /* d1's socket reconnects (a timeout gives it a fresh one) and takes its routing id back:
     * its session is intact */
    CHECK_EQ_INT(until_ok(client_heartbeat, d1, 3000), 0);
    CHECK_EQ_INT(client_claim(d1, NULL), DFLASH_EAGAIN);
    /* each refusal is logged with bob's key */
    CHECK(h_wait_text(blog, bob_public, 5000));
    CHECK(h_wait_text(blog, "refused", 100));

    /* alice's restart of d1 (same key, a new incarnation, its run): replaces it as before */
    client *d1b = drafter_client(tcp_ep, broker_pub, alice, "d1", 2000);
    client_set_trainer_run(d1b, run);
    CHECK_EQ_INT(client_hello(d1b, NULL, 0), 0);
    CHECK_EQ_INT(client_claim(d1, NULL), DFLASH_ESTALE);
    CHECK_EQ_INT(client_claim(d1b, NULL), DFLASH_EAGAIN);
    CHECK_EQ_INT(client_hello(b1, NULL, 0), DFLASH_EDENIED);
    /* once d1 is expired (nothing sent for 4 s), any accepted key may take the name */
    uint64_t t1 = h_now_ms();
    CHECK_EQ_INT(until_ok(hello0, b1, 10000), 0);
    CHECK(h_now_ms() - t1 >= 1000); /* not before d1b's liveness window could end */
    /* `dflash-ctl status` shows what was refused: a "refused" line, the counters in --json */
    {
        char epf[80], svf[300], alf[300], slog[300], said[8192];
        snprintf(epf, sizeof epf, "--endpoint=%s", tcp_ep);
        snprintf(svf, sizeof svf, "--curve-server-key=%s", broker_pub);
        snprintf(alf, sizeof alf, "--curve-key=%s", alice);
        snprintf(slog, sizeof slog, "%s/status.log", dir);
        uint64_t n = key_refusals(tcp_ep, broker_pub, alice);
        CHECK(n >= 7 && n != UINT64_MAX);
        char *st[] = {(char *)ctl, epf, svf, alf, "status", NULL};
        CHECK_EQ_INT(run_logged(st, RUN_MS, slog, said, sizeof said, NULL), 0);
        CHECK(strstr(said, "refused   hellos (peer table full) 0  replies dropped (journal "
                           "wait) 0  key refusals (another CURVE key) ") != NULL);
        char *sj[] = {(char *)ctl, epf, svf, alf, "--json", "status", NULL};
        CHECK_EQ_INT(run_logged(sj, RUN_MS, slog, said, sizeof said, NULL), 0);
        CHECK(strstr(said, "\"hellos_refused_full\":0,\"replies_dropped\":0,\"key_refusals\":") !=
              NULL);
        if (check_failed) fprintf(stderr, "dflash-ctl status said:\n%s\n", said);
    }
    client_destroy(&d1);
    client_destroy(&d1b);
    client_destroy(&b1);
    client_destroy(&b2);
    client_destroy(&b3);
    CHECK_EQ_INT(h_stop(q), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
