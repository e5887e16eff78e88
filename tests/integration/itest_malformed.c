/* itest_malformed: what a broken or hostile peer sends (garbage, a truncated envelope, a reply
 * type as a request, an envelope from a future protocol version, extra frames, a message over
 * ZMQ_MAXMSGSIZE) gets an ERROR reply with the right code and bumps the malformed counter; the
 * broker keeps serving (dflash-ctl ping exits 0). Without a broker, ping exits 2 promptly. */
#include "check.h"
#include "harness.h"

#include <zmq.h>

static uint8_t buf[WIRE_MAX_MSG + 4096];

/* Sends one frame (or two with `extra`) and waits for the reply; returns the ERROR code, 1 for a
 * non-error reply, 0 for no reply within 2 s. */
static int send_raw(void *s, const void *data, size_t len, bool extra)
{
    zmq_send(s, data, len, extra ? ZMQ_SNDMORE : 0);
    if (extra) zmq_send(s, "x", 1, 0);
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 2000) <= 0) return 0;
    int n = zmq_recv(s, buf, sizeof buf, 0);
    wire_msg m;
    if (n <= 0 || wire_unpack(buf, (size_t)n, &m, NULL, 0)) return -999;
    return m.type == WIRE_ERROR ? m.u.error.code : 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *extra[] = {"--journal=none", NULL};
    pid_t q = h_start_queue(argv[1], dir, extra);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    CHECK_EQ_INT(zmq_connect(s, ep), 0);

    uint8_t garbage[100];
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (uint8_t)(i * 37 + 11);
    CHECK_EQ_INT(send_raw(s, garbage, sizeof garbage, false), DFLASH_EPROTO);

    wire_msg m;
    wire_msg_init(&m, WIRE_STATUS_REQUEST, WIRE_ROLE_CTL, 7, 1);
    int n = wire_pack(&m, buf, sizeof buf);
    CHECK_EQ_INT(send_raw(s, buf, (size_t)n, false), 1); /* valid: a STATUS reply */
    CHECK_EQ_INT(send_raw(s, buf, (size_t)n - 1, false), DFLASH_EPROTO); /* truncated */
    n = wire_pack(&m, buf, sizeof buf);
    CHECK_EQ_INT(send_raw(s, buf, (size_t)n, true), DFLASH_EPROTO); /* extra frame */

    wire_msg_init(&m, WIRE_OK, WIRE_ROLE_CTL, 7, 2); /* a reply type as a request */
    n = wire_pack(&m, buf, sizeof buf);
    CHECK_EQ_INT(send_raw(s, buf, (size_t)n, false), DFLASH_EPROTO);

    const uint8_t v2[] = {0x08, 0x02, 0x10, 0x03, 0x18, 0x07, 0xaa, 0x01, 0x00};
    CHECK_EQ_INT(send_raw(s, v2, sizeof v2, false), DFLASH_EVERSION);

    /* a drafter request without hello is refused as STALE, not served */
    wire_msg_init(&m, WIRE_CLAIM, WIRE_ROLE_DRAFTER, 7, 3);
    n = wire_pack(&m, buf, sizeof buf);
    CHECK_EQ_INT(send_raw(s, buf, (size_t)n, false), DFLASH_ESTALE);

    /* over ZMQ_MAXMSGSIZE: the connection is dropped, no reply, the broker lives on */
    memset(buf, 0x41, WIRE_MAX_MSG + 100);
    CHECK_EQ_INT(send_raw(s, buf, WIRE_MAX_MSG + 100, false), 0);

    client *c = client_new(ep, WIRE_ROLE_CTL, "checker");
    wire_status st;
    CHECK_EQ_INT(client_status(c, &st), 0);
    CHECK_EQ_INT(st.malformed, 5);
    client_destroy(&c);

    char rt[128];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    char *cargv[] = {argv[2], rt, "ping", NULL};
    int status = 0;
    waitpid(h_spawn(cargv, NULL), &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    zmq_close(s);
    zmq_ctx_term(ctx);
    CHECK_EQ_INT(h_stop(q), 0);

    /* no broker: ping gives up after its timeout with exit 2 (healthcheck), not a hang */
    char *pargv[] = {argv[2], rt, "--timeout-ms=300", "ping", NULL};
    uint64_t t0 = h_now_ms();
    waitpid(h_spawn(pargv, NULL), &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    CHECK(h_now_ms() - t0 < 15000); /* a hang, not a slow start (5 s was outlasted under ASan,
                                     * 4 tests at once on 2 cores) */
    h_rmdir(dir);
    CHECK_DONE();
}
