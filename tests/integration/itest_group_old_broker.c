/* itest_group_old_broker: a dflash-drafter with --accumulate 2 in a --group, against a broker
 * that predates gradient accumulation in groups (its StepGrant has no `micro`), exits 2 with a
 * message that says so, before it reads the slot, and gives the slot back unread.
 *
 * The broker is the in-process stub (broker_stub.h: the real broker code, journal none) behind a
 * ROUTER on ipc://DIR/queue.sock (serve()), answering like an older broker: every StepGrant
 * leaves with its `micro` taken out (the field such a broker never sends; the rest of the
 * request path is today's). A fake target (in-process requests) registers a host pool and makes
 * 4 batches ready; the real dflash-drafter (--train on a 6-layer model from dflash-mkmodel,
 * --group g --accumulate 2, shm collective) forms the group alone and claims micro-step 0.
 * Checks: exit status 2; its log names --accumulate and the broker's missing micro-step; no
 * batch is trained or acked and no lease is left (the slot was given back unread, the group
 * left). With the stub answering as today's broker (micro kept) the drafter goes past the
 * grant instead (it reaches the copy, which fails on the fake pool: exit 1, not 2 for
 * --accumulate). Usage: itest_group_old_broker DRAFTER MKMODEL. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "broker_stub.h"

#include <zmq.h>

static bool older; /* serve(): answer as a broker that predates StepGrant.micro */

/* An older broker's StepGrant: no micro-step echoed. */
static void strip_micro(wire_msg *rep)
{
    if (rep->type == WIRE_STEP_GRANT) {
        rep->u.sgrant.has_micro = false;
        rep->u.sgrant.micro = 0;
    }
}

/* Serves the stub broker on a ROUTER at ep until pid exits or ms pass, running the broker's
 * loop (cron) between requests. Returns pid's exit status (h_wait_exit's), or -1 on time-out. */
static int serve(const char *ep, pid_t pid, int ms)
{
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    CHECK_EQ_INT(zmq_bind(sock, ep), 0);
    static uint8_t in[WIRE_MAX_MSG], out[WIRE_MAX_MSG];
    uint8_t rid[256];
    int status = -1;
    uint64_t end = h_now_ms() + (uint64_t)ms;
    while (h_now_ms() < end) {
        uv_run(&stub_loop, UV_RUN_NOWAIT);
        int rc;
        if (waitpid(pid, &rc, WNOHANG) == pid) {
            status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
            break;
        }
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 10) <= 0) continue;
        int nr = zmq_recv(sock, rid, sizeof rid, 0);
        int more = 0;
        size_t ml = sizeof more;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
        if (nr <= 0 || !more) continue;
        int n = zmq_recv(sock, in, sizeof in, 0);
        if (n <= 0 || n > (int)sizeof in) continue;
        int r = broker_dispatch(stub_b, rid, (size_t)nr, in, (size_t)n, out, sizeof out);
        CHECK(r > 0);
        if (r <= 0) continue;
        if (older) {
            wire_msg m;
            CHECK_EQ_INT(wire_unpack(out, (size_t)r, &m, NULL, 0), 0);
            strip_micro(&m);
            r = wire_pack(&m, out, sizeof out);
            wire_msg_clear(&m);
            CHECK(r > 0);
        }
        zmq_send(sock, rid, (size_t)nr, ZMQ_SNDMORE);
        zmq_send(sock, out, (size_t)r, 0);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return status;
}

/* One run of the drafter against the stub (older or not); its exit status, its log in *log. */
static int run(const char *drafter_bin, const char *dir, const char *model, bool as_older,
               char **log)
{
    older = as_older;
    stub_broker_new(NULL);
    stub_init(WIRE_HELLO, WIRE_ROLE_TARGET, 8);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "target");
    CHECK_EQ_INT(stub_send("target-t-8"), 0);
    stub_pool("target-t-8", 8, 0x88, 8);
    stub_make_ready("target-t-8", 8, 0x88, 4);

    char ep[128], rt[128], path[128];
    snprintf(rt, sizeof rt, "%s", dir);
    h_queue_endpoint(rt, ep, sizeof ep);
    snprintf(path, sizeof path, "%s/drafter-%s.log", dir, as_older ? "older" : "today");
    char *argv[] = {(char *)drafter_bin, "--train", "--model", (char *)model, "--name", "da",
                    "--group", "g", "--accumulate", "2", "--comm", "shm", "--comm-timeout-s",
                    "5", "--block-size", "4", "--anchors", "8", "--buckets", "32",
                    "--token-budget", "80", "--max-seqs", "4", "--layers", "3",
                    "--runtime-dir", rt, "--threads", "1", "--backend", "host",
                    "--timeout-ms", "500", "--broker-wait-ms", "20000", "--max-copy-failures",
                    "1", "--progress-ms", "0", NULL};
    pid_t pid = h_spawn_logged(argv, path);
    int status = serve(ep, pid, 60000);
    if (status < 0) h_kill(pid, SIGKILL);
    wire_status s = stub_status();
    uint32_t leased = 0;
    for (uint32_t b = 0; b < s.n_buckets; b++) leased += s.buckets[b].leased;
    printf("%s broker: drafter exit %d, trained %llu, acks %llu, leased %u, groups %u\n",
           as_older ? "older" : "today's", status, (unsigned long long)s.batches_trained,
           (unsigned long long)s.acks, leased, s.n_groups);
    if (as_older) {
        CHECK_EQ_INT(s.batches_trained, 0);
        CHECK_EQ_INT(s.acks, 0);
        CHECK_EQ_INT(leased, 0); /* given back unread */
        CHECK_EQ_INT(s.n_groups, 0); /* left */
    }
    stub_broker_free();
    *log = test_slurp(path, NULL);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: itest_group_old_broker DRAFTER MKMODEL\n");
        return 2;
    }
    char dir[64], model[128], mklog[128];
    h_tempdir(dir, sizeof dir);
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(mklog, sizeof mklog, "%s/mkmodel.log", dir);
    char *mk[] = {argv[2], "--family", "qwen3", "--layers", "6", "--seed", "3", "--out", model,
                  NULL};
    CHECK_EQ_INT(h_run_tool(mk, mklog), 0);

    char *log = NULL;
    CHECK_EQ_INT(run(argv[1], dir, model, true, &log), 2);
    CHECK(log && strstr(log, "--accumulate 2 in group g: the broker predates gradient "
                             "accumulation in groups (its StepGrant names no micro-step)"));
    CHECK(log && strstr(log, "run the group without --accumulate, or upgrade dflash-queue"));
    if (check_failed && log) fputs(log, stderr);
    free(log);

    /* the same with today's answer: the drafter takes the grant (the copy then fails: no pool) */
    CHECK(run(argv[1], dir, model, false, &log) != 2);
    CHECK(log && !strstr(log, "predates gradient accumulation"));
    CHECK(log && strstr(log, "no slot could be copied"));
    if (check_failed && log) fputs(log, stderr);
    free(log);
    if (!check_failed) h_rmdir(dir);
    CHECK_DONE();
}
