/* fake_broker: a scripted fake of dflash-queue for the tests of its clients (header-only,
 * static; include once, after check.h): a ZeroMQ ROUTER at ipc://DIR/queue.sock (DIR a fresh
 * 0700 temp dir) in a thread of the test, which records every request it gets and answers it
 * as the test set it up under fb.mu: the request's own reply type with plain contents (a
 * hello naming fb.pub_endpoint (one in no directory unless set), a grant of slot 2, a view of epoch 4
 * (the joiner rank 0 of 1, at the step it reported), the settings "applied", OK with
 * fb.ok_value, fb.status for a status request, a target's work unit: slot 1, batch (0, 0, n)
 * for its n-th work request, a PoolLeft with nothing left, fb.step_grant to a StepClaim), or
 * fb.reply_type, fb.error (to fb.error_for's requests only, unless that is WIRE_NONE), silence
 * (to fb.silent_for's only, likewise), a delay, or decoys first (a reply to another request
 * id, one not from a broker).
 *   fake_start() / fake_stop()  bind and serve / stop and remove the dir
 *   fake_reset()                plain answers again
 *   fake_answer_error(e, t)     ERROR e to requests of type t; fake_silence(t): none to them
 *   fake_last(), fake_count(h)  the last request (a copy), how many (heartbeats only when h)
 *   fake_count_type(t)          how many requests of type t; fake_last_join() the last GroupJoin
 *   fake_bind(ep)               the fake serves ep too from now on (a broker that comes back)
 *   fake_set_step_grant(sg)     what a StepClaim is answered with from now on
 *   fake_set_incarnation(i)     the incarnation every reply carries (another: a restart)
 *   fake_pub_send(pub, t, m)    one announcement on a PUB socket, framed as the broker's
 * Used by test_client (the client library's rules), test_ctl_output (dflash-ctl's output),
 * test_worker_session (the drafter's session) and test_target_loop (the target's loop). */
#ifndef DFLASH_TEST_FAKE_BROKER_H
#define DFLASH_TEST_FAKE_BROKER_H

#include "monotime.h"
#include "wire.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#define FAKE_VALUE 333 /* what an OK reply carries by default (StepDone's n_acked, released batches) */

/* The fake broker. The test sets the answer fields under mu before a call; the thread records
 * each request (last, counts) under mu and answers it. */
typedef struct fake {
    pthread_mutex_t mu;
    pthread_t th;
    void *zctx, *sock;
    char dir[64], endpoint[128];
    bool stop;
    /* how to answer */
    uint64_t incarnation;  /* in every reply */
    uint32_t heartbeat_ms; /* in a hello reply */
    bool silent;           /* no answer at all ... */
    wire_type silent_for;  /* ... to requests of this type only (WIRE_NONE: to every one) */
    int delay_ms;          /* before answering */
    bool decoys;           /* first a reply with another request id and one from a target */
    wire_type reply_type;  /* WIRE_NONE: the request's own reply type */
    wire_error error;      /* code != 0: answer ERROR with this */
    wire_type error_for;   /* ... to requests of this type only (WIRE_NONE: to every one) */
    wire_status status;    /* a status reply's contents */
    uint64_t ok_value;     /* what an OK reply carries (FAKE_VALUE after fake_reset) */
    char pub_endpoint[160]; /* a hello reply's (one in no directory after fake_reset) */
    wire_step_grant step_grant; /* a StepClaim's answer (fake_set_step_grant) */
    /* what came */
    wire_msg last;
    int n_requests, n_heartbeats;
    int n_type[WIRE_TYPE_COUNT]; /* per request type */
    wire_msg last_join; /* the last GroupJoin (fake_last_join) */
    char bind_more[160], bound_more[160]; /* fake_bind: to bind at the next turn, bound */
} fake;

static fake fb;

static void fake_send(const uint8_t *rid, size_t rid_len, const wire_msg *m)
{
    static uint8_t out[WIRE_MAX_MSG];
    int n = wire_pack(m, out, sizeof out);
    CHECK(n > 0);
    if (n <= 0) return;
    zmq_send(fb.sock, rid, rid_len, ZMQ_SNDMORE);
    zmq_send(fb.sock, out, (size_t)n, 0);
}

/* The reply to req as the fake is set up now (caller holds mu). */
static void fake_reply(const wire_msg *req, wire_msg *rep)
{
    wire_type t = fb.reply_type;
    if (fb.error.code && (fb.error_for == WIRE_NONE || fb.error_for == req->type)) t = WIRE_ERROR;
    if (t == WIRE_NONE) {
        switch (req->type) {
        case WIRE_HELLO: t = WIRE_HELLO; break;
        case WIRE_HEARTBEAT: t = WIRE_HEARTBEAT; break;
        case WIRE_CLAIM: t = WIRE_GRANT; break;
        case WIRE_GROUP_JOIN: t = WIRE_GROUP_VIEW; break;
        case WIRE_STATUS_REQUEST: t = WIRE_STATUS_REPLY; break;
        case WIRE_SET_CONFIG: t = WIRE_SET_CONFIG_REPLY; break;
        case WIRE_WORK_REQUEST: t = WIRE_WORK_UNIT; break;
        case WIRE_POOL_LEAVE: t = WIRE_POOL_LEFT; break;
        case WIRE_STEP_CLAIM: t = WIRE_STEP_GRANT; break;
        default: t = WIRE_OK; break;
        }
    }
    wire_msg_init(rep, t, WIRE_ROLE_BROKER, fb.incarnation, req->request_id);
    switch (t) {
    case WIRE_HELLO:
        strcpy(rep->u.hello.name, "fake");
        rep->u.hello.heartbeat_ms = fb.heartbeat_ms;
        rep->u.hello.lease_timeout_ms = 7000;
        snprintf(rep->u.hello.pub_endpoint, sizeof rep->u.hello.pub_endpoint, "%s",
                 fb.pub_endpoint);
        rep->u.hello.stats_interval_ms = 1500;
        break;
    case WIRE_HEARTBEAT: rep->u.sent_ms = req->u.sent_ms; break;
    case WIRE_GRANT: {
        wire_grant *g = &rep->u.grant;
        g->lease_id = 41;
        g->slot = 2;
        g->size = 4096;
        g->unit = (wire_unit){1, 0, 9};
        g->backend = WIRE_BACKEND_HOST;
        strcpy(g->shm_name, "/dflash-fake");
        break;
    }
    case WIRE_GROUP_VIEW:
        strcpy(rep->u.view.group, req->u.join.group);
        rep->u.view.epoch = 4;
        rep->u.view.world = 1;
        rep->u.view.step = req->u.join.step; /* the joiner alone: rank 0, its model the group's */
        break;
    case WIRE_SET_CONFIG_REPLY: /* the effective values: what the broker made of them */
        rep->u.settings = req->u.settings;
        for (uint32_t i = 0; i < rep->u.settings.n; i++)
            strcpy(rep->u.settings.kv[i].value, "applied");
        break;
    case WIRE_STATUS_REPLY: rep->u.status = fb.status; break;
    case WIRE_WORK_UNIT: /* the one being answered is counted already */
        rep->u.work = (wire_work_unit){.unit = {0, 0, (uint64_t)fb.n_type[WIRE_WORK_REQUEST] - 1},
                                       .slot = 1};
        break;
    case WIRE_STEP_GRANT: rep->u.sgrant = fb.step_grant; break;
    case WIRE_ERROR: rep->u.error = fb.error; break;
    case WIRE_OK: rep->u.value = fb.ok_value; break;
    default: break;
    }
}

static void *fake_main(void *arg)
{
    (void)arg;
    static uint8_t in[WIRE_MAX_MSG];
    for (;;) {
        pthread_mutex_lock(&fb.mu);
        bool stop = fb.stop;
        if (fb.bind_more[0]) { /* the socket is this thread's: fake_bind asks it to bind */
            if (zmq_bind(fb.sock, fb.bind_more) != 0) {
                fprintf(stderr, "cannot bind %s\n", fb.bind_more);
                exit(1);
            }
            memcpy(fb.bound_more, fb.bind_more, sizeof fb.bound_more);
            fb.bind_more[0] = 0;
        }
        pthread_mutex_unlock(&fb.mu);
        if (stop) break;
        zmq_pollitem_t it = {fb.sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) <= 0) continue;
        uint8_t rid[256];
        int rid_len = zmq_recv(fb.sock, rid, sizeof rid, 0);
        int n = zmq_recv(fb.sock, in, sizeof in, 0);
        if (rid_len <= 0 || n <= 0) continue;
        wire_msg req, rep;
        if (wire_unpack(in, (size_t)n, &req, NULL, 0) != 0) continue;
        pthread_mutex_lock(&fb.mu);
        fb.last = req;
        fb.n_requests++;
        if (req.type == WIRE_HEARTBEAT) fb.n_heartbeats++;
        if (req.type < WIRE_TYPE_COUNT) fb.n_type[req.type]++;
        if (req.type == WIRE_GROUP_JOIN) fb.last_join = req;
        bool silent = fb.silent && (fb.silent_for == WIRE_NONE || fb.silent_for == req.type);
        bool decoys = fb.decoys;
        uint64_t ok_value = fb.ok_value;
        int delay = fb.delay_ms;
        fake_reply(&req, &rep);
        pthread_mutex_unlock(&fb.mu);
        if (silent) continue;
        if (delay) monotime_sleep_ms(delay);
        if (decoys) {
            /* the answer to another request (a late one), then one not from a broker: both
             * well-formed, both to be dropped */
            wire_msg other = rep;
            other.request_id = req.request_id + 1;
            if (other.type == WIRE_OK) other.u.value = ok_value + 1;
            fake_send(rid, (size_t)rid_len, &other);
            other = rep;
            other.role = WIRE_ROLE_TARGET;
            if (other.type == WIRE_OK) other.u.value = ok_value + 2;
            fake_send(rid, (size_t)rid_len, &other);
        }
        fake_send(rid, (size_t)rid_len, &rep);
    }
    return NULL;
}

/* The fake's answer settings back to plain answers. */
static __attribute__((unused)) void fake_reset(void)
{
    pthread_mutex_lock(&fb.mu);
    fb.silent = fb.decoys = false;
    fb.delay_ms = 0;
    fb.reply_type = fb.error_for = fb.silent_for = WIRE_NONE;
    fb.ok_value = FAKE_VALUE;
    snprintf(fb.pub_endpoint, sizeof fb.pub_endpoint, "ipc:///nonexistent/pub.sock");
    memset(&fb.error, 0, sizeof fb.error);
    pthread_mutex_unlock(&fb.mu);
}

/* From now on the fake answers requests of type FOR (WIRE_NONE: every request) with ERROR E. */
static __attribute__((unused)) void fake_answer_error(wire_error e, wire_type for_type)
{
    pthread_mutex_lock(&fb.mu);
    fb.error = e;
    fb.error_for = for_type;
    pthread_mutex_unlock(&fb.mu);
}

/* From now on a StepClaim is answered with *sg. */
static __attribute__((unused)) void fake_set_step_grant(const wire_step_grant *sg)
{
    pthread_mutex_lock(&fb.mu);
    fb.step_grant = *sg;
    pthread_mutex_unlock(&fb.mu);
}

/* From now on every reply carries incarnation inc (another than the hello's: a restart). */
static __attribute__((unused)) void fake_set_incarnation(uint64_t inc)
{
    pthread_mutex_lock(&fb.mu);
    fb.incarnation = inc;
    pthread_mutex_unlock(&fb.mu);
}

/* From now on the fake answers no request of type FOR (WIRE_NONE: none at all). */
static __attribute__((unused)) void fake_silence(wire_type for_type)
{
    pthread_mutex_lock(&fb.mu);
    fb.silent = true;
    fb.silent_for = for_type;
    pthread_mutex_unlock(&fb.mu);
}

static void fake_start(void)
{
    pthread_mutex_init(&fb.mu, NULL);
    snprintf(fb.dir, sizeof fb.dir, "/tmp/dflash-fake-XXXXXX");
    if (!mkdtemp(fb.dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(fb.endpoint, sizeof fb.endpoint, "ipc://%s/queue.sock", fb.dir);
    fb.zctx = zmq_ctx_new();
    fb.sock = zmq_socket(fb.zctx, ZMQ_ROUTER);
    int zero = 0, one = 1;
    zmq_setsockopt(fb.sock, ZMQ_LINGER, &zero, sizeof zero);
    /* as the broker: a client's socket reopened after a timeout keeps its routing id */
    zmq_setsockopt(fb.sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    if (zmq_bind(fb.sock, fb.endpoint) != 0) {
        fprintf(stderr, "cannot bind %s\n", fb.endpoint);
        exit(1);
    }
    fb.incarnation = 0xb0b;
    fb.heartbeat_ms = 1000;
    fake_reset();
    pthread_create(&fb.th, NULL, fake_main, NULL);
}

static void fake_stop(void)
{
    pthread_mutex_lock(&fb.mu);
    fb.stop = true;
    pthread_mutex_unlock(&fb.mu);
    pthread_join(fb.th, NULL);
    zmq_close(fb.sock);
    zmq_ctx_term(fb.zctx);
    char sock[160];
    snprintf(sock, sizeof sock, "%s/queue.sock", fb.dir);
    unlink(sock);
    snprintf(sock, sizeof sock, "%s/pub.sock", fb.dir);
    unlink(sock);
    if (strncmp(fb.bound_more, "ipc://", 6) == 0) unlink(fb.bound_more + 6);
    rmdir(fb.dir);
}

/* One announcement on a PUB socket as the broker makes it: the topic, then the packed message
 * (or the topic alone: a malformed one). */
static __attribute__((unused)) void fake_pub_send(void *pub, const char *topic, const wire_msg *m)
{
    static uint8_t out[WIRE_MAX_MSG];
    int n = m ? wire_pack(m, out, sizeof out) : 0;
    zmq_send(pub, topic, strlen(topic), m ? ZMQ_SNDMORE : 0);
    if (m && n > 0) zmq_send(pub, out, (size_t)n, 0);
}

/* The fake serves endpoint ep as well as its own from now on (its thread binds it within a
 * turn, 20 ms; this waits for that): a broker that was not there, or gone, and comes back. */
static __attribute__((unused)) void fake_bind(const char *ep)
{
    pthread_mutex_lock(&fb.mu);
    snprintf(fb.bind_more, sizeof fb.bind_more, "%s", ep);
    pthread_mutex_unlock(&fb.mu);
    for (bool pending = true; pending;) {
        monotime_sleep_ms(2);
        pthread_mutex_lock(&fb.mu);
        pending = fb.bind_more[0] != 0;
        pthread_mutex_unlock(&fb.mu);
    }
}

/* The last request the fake got (a copy), and how many so far. */
static __attribute__((unused)) wire_msg fake_last(void)
{
    pthread_mutex_lock(&fb.mu);
    wire_msg m = fb.last;
    pthread_mutex_unlock(&fb.mu);
    return m;
}

static __attribute__((unused)) int fake_count(bool heartbeats)
{
    pthread_mutex_lock(&fb.mu);
    int n = heartbeats ? fb.n_heartbeats : fb.n_requests;
    pthread_mutex_unlock(&fb.mu);
    return n;
}

/* The last GroupJoin the fake got (a copy; zeroed before the first). */
static __attribute__((unused)) wire_group_join fake_last_join(void)
{
    pthread_mutex_lock(&fb.mu);
    wire_group_join j = fb.last_join.u.join;
    pthread_mutex_unlock(&fb.mu);
    return j;
}

/* How many requests of type t the fake got so far. */
static __attribute__((unused)) int fake_count_type(wire_type t)
{
    pthread_mutex_lock(&fb.mu);
    int n = fb.n_type[t];
    pthread_mutex_unlock(&fb.mu);
    return n;
}

#endif
