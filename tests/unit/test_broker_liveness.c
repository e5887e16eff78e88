/* test_broker_liveness: peers that stop sending heartbeats expire, and so do their leases; a
 * stall of the broker itself expires neither a peer nor a lease whose heartbeats kept coming
 * (broker_dispatch without sockets, the broker's cron on a libuv loop run by hand; heartbeat
 * 100 ms, liveness 3, lease timeout 300 ms).
 *
 * What a user would notice if it broke:
 *   - a broker descheduled for longer than the liveness window (a loaded machine) drops every
 *     peer, with a target its pool and the batches ready in it, and redelivers the batches
 *     the drafters are training, although each peer's heartbeats were waiting in the socket;
 *   - or, the other way, a dead peer never expires and its lease is never redelivered, also
 *     when the broker runs late again and again.
 */
#include "broker.h"
#include "check.h"
#include "config.h"
#include "err.h"
#include "log.h"
#include "monotime.h"
#include "wire.h"

#include <string.h>
#include <time.h>
#include <uv.h>

static broker *B;
static uv_loop_t loop;
static uint8_t buf[WIRE_MAX_MSG], out[WIRE_MAX_MSG];
static wire_msg req, rep;
static uint64_t next_rid = 1;

enum { TARGET_INC = 7, DRAFTER_INC = 8, POOL_INC = 0xabc };

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts a request of type t from the target (role TARGET) or the drafter. */
static void init(wire_type t, bool target)
{
    wire_msg_init(&req, t, target ? WIRE_ROLE_TARGET : WIRE_ROLE_DRAFTER,
                  target ? TARGET_INC : DRAFTER_INC, 0);
}

/* Sends req from the target ("t"), the drafter ("d") or a ctl ("c"); 0 or the error code. */
static int send_from(const char *rid)
{
    req.request_id = next_rid++;
    int n = wire_pack(&req, buf, sizeof buf);
    CHECK(n > 0);
    int r = broker_dispatch(B, (const uint8_t *)rid, strlen(rid), buf, (size_t)n, out, sizeof out);
    CHECK(r > 0);
    wire_msg_clear(&rep);
    CHECK_EQ_INT(wire_unpack(out, (size_t)r, &rep, NULL, 0), 0);
    return rep.type == WIRE_ERROR ? rep.u.error.code : 0;
}

static int hello(bool target)
{
    init(WIRE_HELLO, target);
    snprintf(req.u.hello.name, sizeof req.u.hello.name, target ? "target" : "drafter");
    return send_from(target ? "t" : "d");
}

static void heartbeat(bool target)
{
    init(WIRE_HEARTBEAT, target);
    req.u.step = monotime_ms(); /* its sent_ms */
    CHECK_EQ_INT(send_from(target ? "t" : "d"), 0);
}

static wire_status status(void)
{
    wire_msg_init(&req, WIRE_STATUS_REQUEST, WIRE_ROLE_CTL, 99, 0);
    CHECK_EQ_INT(send_from("c"), 0);
    return rep.u.status;
}

/* The target registers a pool and makes one batch ready; the drafter claims it. */
static void lease_one_batch(void)
{
    init(WIRE_POOL_REGISTER, true);
    wire_pool *p = &req.u.pool;
    p->pool_incarnation = POOL_INC;
    p->backend = WIRE_BACKEND_HOST;
    snprintf(p->shm_name, sizeof p->shm_name, "/dflash-test-liveness");
    p->slot_count = 4, p->slot_size = 4096, p->layout_version = 1, p->token_budget = 1024;
    p->n_buckets = 1, p->bucket_upper[0] = 512, p->bucket_share[0] = 1;
    p->bucket_batches[0] = 10, p->epochs = 1;
    CHECK_EQ_INT(send_from("t"), 0);
    init(WIRE_WORK_REQUEST, true);
    req.u.pool_incarnation = POOL_INC;
    CHECK_EQ_INT(send_from("t"), 0);
    wire_work_unit wu = rep.u.work;
    init(WIRE_SLOT_READY, true);
    req.u.ready = (wire_slot_ready){POOL_INC, wu.slot, wu.unit, 100, 3};
    CHECK_EQ_INT(send_from("t"), 0);
    init(WIRE_CLAIM, false);
    CHECK_EQ_INT(send_from("d"), 0);
    CHECK_EQ_INT(rep.type, WIRE_GRANT);
}

/* Runs the loop (due timers: the cron) every step_ms for ms, with both peers' heartbeats after
 * each run when beat. */
static void run_for(int ms, int step_ms, bool beat)
{
    for (uint64_t end = monotime_ms() + (uint64_t)ms; monotime_ms() < end;) {
        uv_run(&loop, UV_RUN_NOWAIT);
        if (beat) heartbeat(true), heartbeat(false);
        sleep_ms(step_ms);
    }
}

static void setup(void)
{
    log_init("test", LOG_ERROR);
    queue_config cfg;
    char *argv[] = {"test", NULL};
    CHECK_EQ_INT(config_load(broker_config_table(), &cfg, 1, argv, NULL, 0, NULL), 0);
    snprintf(cfg.journal, sizeof cfg.journal, "none");
    cfg.min_ready = 0;
    cfg.heartbeat_ms = 100;
    cfg.liveness = 3;
    cfg.lease_timeout_ms = 300;
    snprintf(cfg.log_level, sizeof cfg.log_level, "error");
    uv_loop_init(&loop);
    B = broker_new(&loop, &cfg, NULL);
    CHECK(B != NULL);
}

int main(void)
{
    setup();
    if (!B) CHECK_DONE();
    CHECK_EQ_INT(hello(true), 0);
    CHECK_EQ_INT(hello(false), 0);
    lease_one_batch();
    run_for(200, 20, true); /* alive while they beat */
    wire_status s = status();
    CHECK_EQ_INT(s.peers, 2);
    CHECK_EQ_INT(s.buckets[0].leased, 1);

    /* The broker stalls for twice the windows; the heartbeats wait in the socket and are read
     * after the late cron has run (libuv: timers first). */
    sleep_ms(600);
    uv_run(&loop, UV_RUN_NOWAIT);
    heartbeat(true), heartbeat(false);
    run_for(200, 20, true);
    s = status();
    CHECK_EQ_INT(s.peers, 2);
    CHECK_EQ_INT(s.buckets[0].leased, 1);
    CHECK_EQ_INT(s.lease_expiries, 0);

    /* The drafter stops beating: its lease and then it expire (window plus the cron's period);
     * the target, still beating, stays. */
    for (uint64_t end = monotime_ms() + 500; monotime_ms() < end;) {
        uv_run(&loop, UV_RUN_NOWAIT);
        heartbeat(true);
        sleep_ms(10);
    }
    s = status();
    CHECK_EQ_INT(s.peers, 1);
    CHECK_EQ_INT(s.buckets[0].leased, 0);

    /* A broker that always runs late (every 200 ms, more than half the 300 ms window) still
     * expires a silent peer: within two windows. */
    run_for(700, 200, false);
    CHECK_EQ_INT(status().peers, 0);

    broker_destroy(&B);
    uv_loop_close(&loop);
    wire_msg_clear(&rep);
    CHECK_DONE();
}
