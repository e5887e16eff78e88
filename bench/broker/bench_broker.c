/* bench-broker: grant+release round trips per second over ipc:// against the real broker loop,
 * the grant latency distribution, and the broker's resident memory after 1000 and after N
 * round trips; compared in the same run with a bare ZeroMQ ROUTER echo (the transport ceiling).
 *
 *   bench-broker [round_trips (default 1000000)] [batch (default 4000)]
 *
 * A forked child runs broker_new + uv_run (the same code as dflash-queue, no journal); another
 * forked child runs a plain blocking ROUTER echo. The parent is both target and drafter through
 * client.h: it makes `batch` slots ready (untimed), then times claim (the grant latency) +
 * release for each, acks and rewinds them (untimed, so the same batches are reused and the
 * ledger's size stays fixed), and repeats; then once more with a raw DEALER keeping 256 requests in
 * flight (the broker loop's own capacity). RSS is read from /proc/PID/status of the broker child.
 * The sockets' directory (mkdtemp) must pass dflash-queue's own check of the ipc:// endpoints it
 * binds (client_check_endpoint: ours, 0700, not a link) before either child binds: this program
 * stands in for the broker. Exit 1, the reason on stderr, if not.
 * Prints one table; the last line is the ratio broker/echo. */
#include "broker.h"
#include "client.h"
#include "config.h"
#include "err.h"
#include "log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <zmq.h>

#define HIST_US 100000

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static void run_broker(const char *dir)
{
    log_init("bench-broker", LOG_WARN);
    queue_config cfg;
    char *argv[] = {"bench-broker", NULL};
    if (config_load(broker_config_table(), &cfg, 1, argv, NULL, 0, NULL)) _exit(1);
    snprintf(cfg.endpoint, sizeof cfg.endpoint, "ipc://%s/queue.sock", dir);
    snprintf(cfg.pub_endpoint, sizeof cfg.pub_endpoint, "ipc://%s/pub.sock", dir);
    snprintf(cfg.journal, sizeof cfg.journal, "none");
    snprintf(cfg.log_level, sizeof cfg.log_level, "warn");
    cfg.min_ready = 0;
    cfg.max_depth = WIRE_MAX_SLOTS;
    cfg.lease_timeout_ms = 600000;
    cfg.heartbeat_ms = 60000;
    uv_loop_t loop;
    uv_loop_init(&loop);
    int err = 0;
    broker *b = broker_new(&loop, &cfg, &err);
    if (!b) _exit(1);
    uv_run(&loop, UV_RUN_DEFAULT);
    _exit(0);
}

static void run_echo(const char *endpoint)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    if (zmq_bind(s, endpoint) != 0) _exit(1);
    uint8_t id[256], buf[4096];
    for (;;) {
        int n = zmq_recv(s, id, sizeof id, 0);
        int m = zmq_recv(s, buf, sizeof buf, 0);
        if (n < 0 || m < 0) continue;
        zmq_send(s, id, (size_t)n, ZMQ_SNDMORE);
        zmq_send(s, buf, (size_t)m, 0);
    }
}

static double percentile(const uint32_t *hist, uint64_t total, double p)
{
    uint64_t want = (uint64_t)(p * (double)total), acc = 0;
    for (int i = 0; i < HIST_US; i++)
        if ((acc += hist[i]) > want) return i;
    return HIST_US;
}

/* Pipelined: a raw DEALER drafter session keeps up to `window` requests in flight (claims, and a
 * release for every grant), so the broker loop, not the round-trip time, is the limit. Requires
 * n ready slots. Returns pairs/s or a negative number on a protocol error. */
static double pipelined(const char *ep, int n, int window)
{
    static uint8_t buf[WIRE_MAX_MSG];
    static wire_msg m;
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    uint64_t inc = wire_new_incarnation();
    char rid[64];
    snprintf(rid, sizeof rid, "drafter-pipe-%llx", (unsigned long long)inc);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, rid, strlen(rid));
    zmq_connect(s, ep);
    wire_msg_init(&m, WIRE_HELLO, WIRE_ROLE_DRAFTER, inc, 1);
    snprintf(m.u.hello.name, sizeof m.u.hello.name, "pipe");
    int len = wire_pack(&m, buf, sizeof buf);
    zmq_send(s, buf, (size_t)len, 0);
    zmq_recv(s, buf, sizeof buf, 0);
    int sent_claims = 0, pairs = 0, inflight = 0;
    uint64_t t0 = now_ns(), rid_next = 2;
    while (pairs < n) {
        while (inflight < window && sent_claims < n) {
            wire_msg_init(&m, WIRE_CLAIM, WIRE_ROLE_DRAFTER, inc, rid_next++);
            len = wire_pack(&m, buf, sizeof buf);
            zmq_send(s, buf, (size_t)len, 0);
            sent_claims++;
            inflight++;
        }
        int got = zmq_recv(s, buf, sizeof buf, 0);
        inflight--;
        if (got <= 0 || wire_unpack(buf, (size_t)got, &m, NULL, 0)) return -1;
        if (m.type == WIRE_GRANT) {
            uint64_t lease = m.u.grant.lease_id;
            wire_msg_init(&m, WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, inc, rid_next++);
            m.u.lease_id = lease;
            len = wire_pack(&m, buf, sizeof buf);
            zmq_send(s, buf, (size_t)len, 0);
            inflight++;
        } else if (m.type == WIRE_OK) {
            pairs++;
        } else {
            fprintf(stderr, "pipelined: %s %s\n", wire_type_name(m.type),
                    m.type == WIRE_ERROR ? m.u.error.message : "");
            return -1;
        }
    }
    double rate = (double)n / ((double)(now_ns() - t0) / 1e9);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return rate;
}

int main(int argc, char **argv)
{
    long total = argc > 1 ? atol(argv[1]) : 1000000;
    int batch = argc > 2 ? atoi(argv[2]) : 4000;
    if (total < 2000 || batch < 1 || batch > WIRE_MAX_SLOTS) {
        fprintf(stderr, "usage: bench-broker [round_trips >= 2000] [batch 1..%d]\n",
                WIRE_MAX_SLOTS);
        return 2;
    }
    char dir[] = "/tmp/dflash-bench-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    int rc;
    char ep[128], echo_ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/queue.sock", dir);
    snprintf(echo_ep, sizeof echo_ep, "ipc://%s/echo.sock", dir);
    const char *eps[] = {ep, echo_ep};
    for (int i = 0; i < 2; i++) {
        char why[1024];
        if ((rc = client_check_endpoint(eps[i], why, sizeof why))) {
            fprintf(stderr, "bench-broker: %s\n", why);
            rmdir(dir);
            return 1;
        }
    }
    pid_t bpid = fork();
    if (bpid == 0) run_broker(dir);
    pid_t epid = fork();
    if (epid == 0) run_echo(echo_ep);

    client *t = client_new(ep, WIRE_ROLE_TARGET, "bench-target");
    client *d = client_new(ep, WIRE_ROLE_DRAFTER, "bench-drafter");
    rc = DFLASH_ETIMEOUT;
    for (int i = 0; i < 100 && rc; i++) rc = client_hello(t, NULL, 0);
    if (rc || client_hello(d, NULL, 0)) {
        fprintf(stderr, "broker did not answer: %s\n", err_str(rc));
        return 1;
    }
    wire_pool pool;
    memset(&pool, 0, sizeof pool);
    pool.pool_incarnation = 0xbe4c;
    pool.backend = WIRE_BACKEND_HOST;
    snprintf(pool.shm_name, sizeof pool.shm_name, "/dflash-bench");
    pool.slot_count = (uint32_t)batch;
    pool.slot_size = 1 << 20;
    pool.layout_version = 1;
    pool.n_buckets = 1;
    pool.bucket_upper[0] = 4096;
    pool.bucket_share[0] = 1;
    /* One epoch of `batch` batches, recycled: every phase acks its batches and rewinds them
     * (ResumeFrom 0), so the ledger's size stays fixed and RSS shows the loop's own growth. */
    pool.bucket_batches[0] = (uint64_t)batch;
    pool.epochs = 1;
    if ((rc = client_register_pool(t, &pool))) {
        fprintf(stderr, "register: %s: %s\n", err_str(rc), client_last_error(t));
        return 1;
    }

    uint32_t *hist = calloc(HIST_US + 1, sizeof *hist);
    uint64_t timed_ns = 0;
    long done = 0, rss_first = -1;
    wire_grant *g = malloc(sizeof *g);
    wire_unit *units = malloc((size_t)batch * sizeof *units);
    uint64_t step = 0;
    while (done < total) {
        int n = batch;
        if (total - done < n) n = (int)(total - done);
        for (int i = 0; i < n; i++) { /* untimed: make n slots ready */
            wire_work_unit wu;
            if ((rc = client_request_work(t, pool.pool_incarnation, &wu))) {
                fprintf(stderr, "work: %s: %s\n", err_str(rc), client_last_error(t));
                return 1;
            }
            wire_slot_ready r = {pool.pool_incarnation, wu.slot, wu.unit, 1000, 1};
            if ((rc = client_slot_ready(t, &r))) return 1;
        }
        uint64_t t0 = now_ns();
        for (int i = 0; i < n; i++) {
            uint64_t c0 = now_ns();
            if ((rc = client_claim(d, g))) {
                fprintf(stderr, "claim: %s: %s\n", err_str(rc), client_last_error(d));
                return 1;
            }
            uint64_t us = (now_ns() - c0) / 1000;
            hist[us < HIST_US ? us : HIST_US]++;
            if ((rc = client_release(d, g->lease_id))) return 1;
            units[i] = g->unit;
            if (done + i + 1 == 1000) rss_first = rss_kb(bpid);
        }
        timed_ns += now_ns() - t0;
        done += n;
        step++; /* untimed: train (ack) the phase's batches, then rewind them for reuse */
        for (int i = 0; i < n; i++)
            if ((rc = client_ack(d, &units[i], step))) {
                fprintf(stderr, "ack: %s: %s\n", err_str(rc), client_last_error(d));
                return 1;
            }
        if ((rc = client_resume_from(d, 0, 0))) return 1;
    }
    long rss_last = rss_kb(bpid);
    /* pipelined phase: refill, then a window of 256 outstanding requests */
    double pipe_rate = 0;
    for (int i = 0; i < batch; i++) {
        wire_work_unit wu;
        if (client_request_work(t, pool.pool_incarnation, &wu)) break;
        wire_slot_ready r = {pool.pool_incarnation, wu.slot, wu.unit, 1000, 1};
        if (client_slot_ready(t, &r)) break;
    }
    pipe_rate = pipelined(ep, batch, 256);
    if (pipe_rate < 0) fprintf(stderr, "bench-broker: the pipelined run failed\n");
    double rate = (double)done / ((double)timed_ns / 1e9);

    /* Transport ceiling: the same request/reply pattern against a bare ROUTER echo. */
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    zmq_connect(s, echo_ep);
    uint8_t msg[64] = {1}, back[64];
    long echo_n = 200000;
    uint64_t e0 = now_ns();
    for (long i = 0; i < echo_n; i++) {
        zmq_send(s, msg, sizeof msg, 0);
        zmq_recv(s, back, sizeof back, 0);
    }
    double echo_rate = (double)echo_n / ((double)(now_ns() - e0) / 1e9) / 2; /* 2 RTs per pair */
    zmq_close(s);
    zmq_ctx_term(ctx);

    printf("bench-broker: %ld grant+release pairs over ipc://, batches of %d ready slots\n", done,
           batch);
    printf("%-34s %14s\n", "measure", "value");
    printf("%-34s %14.0f\n", "grant+release pairs/s (broker)", rate);
    printf("%-34s %14.0f\n", "pairs/s (bare ZeroMQ echo, 2 RTs)", echo_rate);
    printf("%-34s %14.0f\n", "pairs/s (broker, 256 pipelined)", pipe_rate);
    printf("%-34s %14.1f\n", "grant latency p50 (us)", percentile(hist, (uint64_t)done, 0.50));
    printf("%-34s %14.1f\n", "grant latency p99 (us)", percentile(hist, (uint64_t)done, 0.99));
    printf("%-34s %14.1f\n", "grant latency p99.9 (us)", percentile(hist, (uint64_t)done, 0.999));
    printf("%-34s %14ld\n", "broker RSS after 1000 pairs (KiB)", rss_first);
    printf("%-34s %14ld\n", "broker RSS at the end (KiB)", rss_last);
    printf("broker/echo throughput ratio: %.2f\n", rate / echo_rate);
    int status = pipe_rate < 0; /* its row is then -1, not a rate */

    client_destroy(&d);
    client_destroy(&t);
    kill(bpid, SIGKILL);
    kill(epid, SIGKILL);
    waitpid(bpid, NULL, 0);
    waitpid(epid, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) return 1;
    free(hist);
    free(g);
    free(units);
    return status;
}
