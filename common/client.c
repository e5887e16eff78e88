/* client: see client.h. One DEALER socket per client; each call = pack, send, wait for the reply
 * with the same request id, unpack. A late reply to an earlier request is dropped by its request
 * id. A timeout closes and reopens the socket (Lazy Pirate): nothing of the unanswered request
 * stays queued, and the next call connects at once instead of after ZeroMQ's reconnect back-off
 * (up to RECONNECT_IVL_MAX, 2 s, once a broker has been away a few seconds). The struct holds
 * two large wire_msg buffers so calls need no big stack frames; the mutex serialises calls
 * (client_poll only tries it: see there). */
#include "client.h"
#include "curve.h"
#include "err.h"
#include "fsutil.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

struct client {
    pthread_mutex_t mu;
    void *zctx, *sock;
    char endpoint[256];
    wire_role role;
    char name[WIRE_MAX_NAME];
    char rid[128];
    uint64_t incarnation, broker_incarnation, next_request;
    uint64_t trainer_run_id; /* client_set_trainer_run: named in every hello (0: none) */
    uint64_t shape;          /* client_set_drafter_shape: stated in every GroupJoin (0: none) */
    char shape_text[WIRE_MAX_SHAPE_TEXT];
    uint32_t accumulate; /* client_set_group_accumulate: stated in every GroupJoin (0/1: none) */
    bool ends_when_drained; /* client_set_group_ends_when_drained: stated in every GroupJoin */
    bool restarted;
    uint32_t heartbeat_ms, lease_timeout_ms, stats_interval_ms;
    char pub_endpoint[WIRE_MAX_TEXT];
    struct last_outcome {     /* what the last request left, for client_last_* */
        char error[WIRE_MAX_TEXT];
        uint64_t run;         /* the last ERROR reply's replaced_by_run (0: none) */
        uint32_t mismatch;    /* its mismatch (a wire_mismatch; 0: none) */
        bool other_key;       /* its other_key (DENIED: another CURVE key's live peer) */
        uint64_t committed;   /* its committed_step (a held GroupJoin; 0: none) */
        bool answered;        /* the request got the broker's reply (not a timeout) */
    } last;
    int timeout_ms;
    uint64_t last_send_ms; /* a request sent, or one that timed out (client_poll waits after it) */
    bool curve;                               /* CURVE on: the three keys below are set */
    curve_key server_public, public_, secret; /* Z85 */
    wire_msg req, rep;
    uint8_t buf[WIRE_MAX_MSG];
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int sock_open(client *c)
{
    c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (!c->sock) return DFLASH_EZMQ;
    int zero = 0, one = 1, ivl = 100, ivl_max = 2000;
    int64_t max = WIRE_MAX_MSG;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &max, sizeof max);
    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, c->rid, strlen(c->rid));
    if (c->curve &&
        (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, c->server_public, CURVE_Z85_LEN) != 0 ||
         zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, c->public_, CURVE_Z85_LEN) != 0 ||
         zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, c->secret, CURVE_Z85_LEN) != 0)) {
        snprintf(c->last.error, sizeof c->last.error, "cannot set CURVE keys: %s",
                 zmq_strerror(errno));
        zmq_close(c->sock);
        c->sock = NULL;
        return DFLASH_EZMQ;
    }
    if (zmq_connect(c->sock, c->endpoint) != 0) {
        snprintf(c->last.error, sizeof c->last.error, "cannot connect to %s: %s", c->endpoint,
                 zmq_strerror(errno));
        zmq_close(c->sock);
        c->sock = NULL;
        return DFLASH_EZMQ;
    }
    return 0;
}

static void sock_reset(client *c)
{
    if (c->sock) zmq_close(c->sock);
    c->sock = NULL;
    sock_open(c);
}

client *client_new(const char *endpoint, wire_role role, const char *name)
{
    if (!endpoint || !*endpoint || strlen(endpoint) >= 256 || !name ||
        strlen(name) >= WIRE_MAX_NAME || role == WIRE_ROLE_NONE || role == WIRE_ROLE_BROKER)
        return NULL;
    client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->role = role;
    c->incarnation = wire_new_incarnation();
    c->next_request = 1;
    c->timeout_ms = 2000;
    /* Stable for this process: reconnects keep the identity (ROUTER_HANDOVER on the broker). */
    snprintf(c->rid, sizeof c->rid, "%s-%s-%016" PRIx64, wire_role_name(role), name,
             c->incarnation);
    c->zctx = zmq_ctx_new();
    if (!c->zctx || sock_open(c) != 0) {
        client_destroy(&c);
        return NULL;
    }
    return c;
}

void client_destroy(client **cp)
{
    if (!cp || !*cp) return;
    client *c = *cp;
    *cp = NULL;
    if (c->sock) zmq_close(c->sock);
    if (c->zctx) zmq_ctx_term(c->zctx);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int client_set_curve(client *c, const char *server_public, const char *secret)
{
    curve_key pub;
    if (!server_public || strlen(server_public) != CURVE_Z85_LEN || !secret ||
        curve_public_of(secret, pub) != 0) {
        snprintf(c->last.error, sizeof c->last.error, "bad CURVE key (want 40 Z85 characters)");
        return DFLASH_EINVAL;
    }
    pthread_mutex_lock(&c->mu);
    c->curve = true;
    memcpy(c->server_public, server_public, CURVE_Z85_LEN + 1);
    memcpy(c->public_, pub, sizeof pub);
    memcpy(c->secret, secret, CURVE_Z85_LEN + 1);
    if (c->sock) zmq_close(c->sock);
    c->sock = NULL;
    int rc = sock_open(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int client_set_curve_files(client *c, const char *server_key_file, const char *key_file)
{
    if (!server_key_file || !*server_key_file || !key_file || !*key_file) {
        snprintf(c->last.error, sizeof c->last.error,
                 "CURVE needs both --curve-server-key and --curve-key");
        return DFLASH_EINVAL;
    }
    curve_key server, secret;
    char why[300];
    int rc = curve_key_read(server_key_file, false, server, why, sizeof why);
    if (!rc) rc = curve_key_read(key_file, true, secret, why, sizeof why);
    if (rc) {
        snprintf(c->last.error, sizeof c->last.error, "%s", why);
        return rc;
    }
    rc = client_set_curve(c, server, secret);
    memset(secret, 0, sizeof secret);
    return rc;
}

void client_set_timeout(client *c, int timeout_ms) { c->timeout_ms = timeout_ms > 0 ? timeout_ms : 1; }
uint64_t client_incarnation(const client *c) { return c->incarnation; }
uint64_t client_broker_incarnation(const client *c) { return c->broker_incarnation; }
bool client_broker_restarted(const client *c) { return c->restarted; }
uint32_t client_heartbeat_ms(const client *c) { return c->heartbeat_ms; }
uint32_t client_lease_timeout_ms(const client *c) { return c->lease_timeout_ms; }
const char *client_pub_endpoint(const client *c) { return c->pub_endpoint; }
uint32_t client_stats_interval_ms(const client *c) { return c->stats_interval_ms; }
const char *client_last_error(const client *c) { return c->last.error; }
uint64_t client_last_error_replaced_by_run(const client *c) { return c->last.run; }
uint32_t client_last_error_mismatch(const client *c) { return c->last.mismatch; }
bool client_last_error_other_key(const client *c) { return c->last.other_key; }
uint64_t client_last_error_committed_step(const client *c) { return c->last.committed; }
bool client_last_answered(const client *c) { return c->last.answered; }

/* Sends c->req and waits for the matching reply in c->rep. Caller holds the mutex and has
 * filled c->req's body and type. Returns 0 (c->rep valid, may be an ERROR), or a code. */
static int roundtrip(client *c)
{
    c->last = (struct last_outcome){0};
    if (!c->sock && sock_open(c) != 0) return DFLASH_EZMQ;
    c->req.version = WIRE_VERSION;
    c->req.role = c->role;
    c->req.incarnation = c->incarnation;
    c->req.request_id = c->next_request++;
    int n = wire_pack(&c->req, c->buf, sizeof c->buf);
    if (n < 0) {
        snprintf(c->last.error, sizeof c->last.error, "cannot pack %s: %s",
                 wire_type_name(c->req.type), err_str(n));
        return n;
    }
    uint64_t deadline = mono_ms() + (uint64_t)c->timeout_ms;
    zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLOUT, 0};
    for (;;) {
        if (zmq_send(c->sock, c->buf, (size_t)n, ZMQ_DONTWAIT) >= 0) break;
        if (errno != EAGAIN && errno != EINTR) return DFLASH_EZMQ;
        uint64_t now = mono_ms();
        if (now >= deadline) goto timeout;
        it.events = ZMQ_POLLOUT;
        zmq_poll(&it, 1, (long)(deadline - now));
    }
    c->last_send_ms = mono_ms();
    for (;;) {
        int got = zmq_recv(c->sock, c->buf, sizeof c->buf, ZMQ_DONTWAIT);
        if (got < 0) {
            if (errno != EAGAIN && errno != EINTR) return DFLASH_EZMQ;
            uint64_t now = mono_ms();
            if (now >= deadline) goto timeout;
            it.events = ZMQ_POLLIN;
            zmq_poll(&it, 1, (long)(deadline - now));
            continue;
        }
        if ((size_t)got > sizeof c->buf) continue; /* truncated: not ours to trust */
        wire_msg_clear(&c->rep);
        char why[128];
        if (wire_unpack(c->buf, (size_t)got, &c->rep, why, sizeof why) != 0) continue;
        if (c->rep.request_id != c->req.request_id || c->rep.role != WIRE_ROLE_BROKER) continue;
        if (c->broker_incarnation && c->rep.incarnation != c->broker_incarnation)
            c->restarted = true;
        c->last.answered = true;
        if (c->rep.type == WIRE_ERROR) {
            snprintf(c->last.error, sizeof c->last.error, "%s", c->rep.u.error.message);
            c->last.run = c->rep.u.error.replaced_by_run;
            c->last.mismatch = c->rep.u.error.mismatch;
            c->last.other_key = c->rep.u.error.other_key;
            c->last.committed = c->rep.u.error.committed_step;
        }
        return 0;
    }
timeout:
    snprintf(c->last.error, sizeof c->last.error, "no reply from %s within %d ms", c->endpoint,
             c->timeout_ms);
    sock_reset(c);
    /* a silent broker: the heartbeat thread's client_poll, which may take the client the
     * moment this call returns, does not start another timeout at once (it would hold the
     * caller's next request, or a stopping daemon's exit, that long); it sends as after a
     * request, half a heartbeat later */
    c->last_send_ms = mono_ms();
    return DFLASH_ETIMEOUT;
}

/* roundtrip + the common reply rules: ERROR -> its code, restarted -> ESTALE, wrong type ->
 * EPROTO. Returns 0 when c->rep has type `want`. */
static int call(client *c, wire_type want)
{
    int rc = roundtrip(c);
    if (rc) return rc;
    if (c->restarted && c->req.type != WIRE_HELLO) {
        if (!c->last.error[0])
            snprintf(c->last.error, sizeof c->last.error, "broker restarted: re-register");
        return DFLASH_ESTALE;
    }
    if (c->rep.type == WIRE_ERROR) return c->rep.u.error.code < 0 ? c->rep.u.error.code : DFLASH_EPROTO;
    if (c->rep.type != want) {
        snprintf(c->last.error, sizeof c->last.error, "expected %s, got %s", wire_type_name(want),
                 wire_type_name(c->rep.type));
        return DFLASH_EPROTO;
    }
    return 0;
}

static void req_init(client *c, wire_type t) { wire_msg_init(&c->req, t, c->role, c->incarnation, 0); }

#define LOCKED(c, body)                                                                            \
    do {                                                                                           \
        pthread_mutex_lock(&(c)->mu);                                                              \
        int rc_ = (body);                                                                          \
        pthread_mutex_unlock(&(c)->mu);                                                            \
        return rc_;                                                                                \
    } while (0)

static int do_hello(client *c, const wire_unit *held, uint32_t n_held)
{
    if (n_held > WIRE_MAX_HELD) return DFLASH_ERANGE;
    req_init(c, WIRE_HELLO);
    snprintf(c->req.u.hello.name, sizeof c->req.u.hello.name, "%s", c->name);
    c->req.u.hello.n_held = n_held;
    c->req.u.hello.run_id = c->trainer_run_id;
    if (n_held) memcpy(c->req.u.hello.held, held, n_held * sizeof *held);
    int rc = call(c, WIRE_HELLO);
    if (rc) return rc;
    c->broker_incarnation = c->rep.incarnation;
    c->restarted = false;
    c->heartbeat_ms = c->rep.u.hello.heartbeat_ms;
    c->lease_timeout_ms = c->rep.u.hello.lease_timeout_ms;
    snprintf(c->pub_endpoint, sizeof c->pub_endpoint, "%s", c->rep.u.hello.pub_endpoint);
    c->stats_interval_ms = c->rep.u.hello.stats_interval_ms;
    return 0;
}

int client_hello(client *c, const wire_unit *held, uint32_t n_held)
{
    LOCKED(c, do_hello(c, held, n_held));
}

void client_set_trainer_run(client *c, uint64_t run_id)
{
    pthread_mutex_lock(&c->mu);
    c->trainer_run_id = run_id;
    pthread_mutex_unlock(&c->mu);
}

void client_set_drafter_shape(client *c, uint64_t shape, const char *text)
{
    pthread_mutex_lock(&c->mu);
    c->shape = shape;
    snprintf(c->shape_text, sizeof c->shape_text, "%s", shape && text ? text : "");
    pthread_mutex_unlock(&c->mu);
}

void client_set_group_accumulate(client *c, uint32_t accumulate)
{
    pthread_mutex_lock(&c->mu);
    c->accumulate = accumulate > 1 ? accumulate : 0;
    pthread_mutex_unlock(&c->mu);
}

void client_set_group_ends_when_drained(client *c, bool ends)
{
    pthread_mutex_lock(&c->mu);
    c->ends_when_drained = ends;
    pthread_mutex_unlock(&c->mu);
}

static int do_register(client *c, const wire_pool *pool)
{
    req_init(c, WIRE_POOL_REGISTER);
    c->req.u.pool = *pool;
    char why[128];
    int rc = wire_check(&c->req, why, sizeof why);
    if (rc) {
        snprintf(c->last.error, sizeof c->last.error, "bad pool: %s", why);
        return rc;
    }
    return call(c, WIRE_OK);
}

int client_register_pool(client *c, const wire_pool *pool) { LOCKED(c, do_register(c, pool)); }

static int do_work(client *c, uint64_t inc, wire_work_unit *out)
{
    req_init(c, WIRE_WORK_REQUEST);
    c->req.u.pool_incarnation = inc;
    int rc = call(c, WIRE_WORK_UNIT);
    if (!rc && out) *out = c->rep.u.work;
    return rc;
}

int client_request_work(client *c, uint64_t pool_incarnation, wire_work_unit *out)
{
    LOCKED(c, do_work(c, pool_incarnation, out));
}

static int do_ready(client *c, const wire_slot_ready *r)
{
    req_init(c, WIRE_SLOT_READY);
    c->req.u.ready = *r;
    return call(c, WIRE_OK);
}

int client_slot_ready(client *c, const wire_slot_ready *ready) { LOCKED(c, do_ready(c, ready)); }

static int do_pool_leave(client *c, uint64_t inc, wire_pool_left *out)
{
    req_init(c, WIRE_POOL_LEAVE);
    c->req.u.pool_incarnation = inc;
    int rc = call(c, WIRE_POOL_LEFT);
    if (!rc && out) *out = c->rep.u.left;
    return rc;
}

int client_pool_leave(client *c, uint64_t pool_incarnation, wire_pool_left *out)
{
    LOCKED(c, do_pool_leave(c, pool_incarnation, out));
}

static int do_claim(client *c, wire_grant *out)
{
    req_init(c, WIRE_CLAIM);
    int rc = call(c, WIRE_GRANT);
    if (!rc && out) *out = c->rep.u.grant;
    return rc;
}

int client_claim(client *c, wire_grant *out) { LOCKED(c, do_claim(c, out)); }

static int do_u64(client *c, wire_type t, uint64_t v, uint64_t *reply_value)
{
    req_init(c, t);
    c->req.u.step = v; /* lease_id, step, sent_ms share the slot */
    int rc = call(c, t == WIRE_HEARTBEAT ? WIRE_HEARTBEAT : WIRE_OK);
    if (!rc && reply_value) *reply_value = c->rep.u.value;
    return rc;
}

int client_release(client *c, uint64_t lease_id)
{
    LOCKED(c, do_u64(c, WIRE_SLOT_RELEASE, lease_id, NULL));
}

static int do_release_unread(client *c, uint64_t lease_id)
{
    req_init(c, WIRE_SLOT_RELEASE);
    c->req.u.lease_id = lease_id;
    c->req.u.release_unread = true;
    return call(c, WIRE_OK);
}

int client_release_unread(client *c, uint64_t lease_id)
{
    LOCKED(c, do_release_unread(c, lease_id));
}

static int do_ack(client *c, const wire_unit *u, uint64_t step)
{
    req_init(c, WIRE_ACK);
    c->req.u.ack.unit = *u;
    c->req.u.ack.step = step;
    return call(c, WIRE_OK);
}

int client_ack(client *c, const wire_unit *unit, uint64_t step) { LOCKED(c, do_ack(c, unit, step)); }

int client_checkpoint_committed(client *c, uint64_t step)
{
    LOCKED(c, do_u64(c, WIRE_CHECKPOINT_COMMITTED, step, NULL));
}

static int do_resume_from(client *c, uint64_t step, uint64_t run_id)
{
    req_init(c, WIRE_RESUME_FROM);
    c->req.u.step = step;
    c->req.u.run_id = run_id;
    return call(c, WIRE_OK);
}

int client_resume_from(client *c, uint64_t step, uint64_t run_id)
{
    LOCKED(c, do_resume_from(c, step, run_id));
}

static int do_group_join(client *c, const char *group, uint64_t step, uint64_t failed_epoch,
                         int gone_rank, uint32_t world_hint, wire_group_view *out)
{
    req_init(c, WIRE_GROUP_JOIN);
    snprintf(c->req.u.join.group, sizeof c->req.u.join.group, "%s", group);
    c->req.u.join.step = step;
    c->req.u.join.failed_epoch = failed_epoch;
    c->req.u.join.has_gone_rank = failed_epoch && gone_rank >= 0;
    c->req.u.join.gone_rank = c->req.u.join.has_gone_rank ? (uint32_t)gone_rank : 0;
    c->req.u.join.world_hint = world_hint;
    c->req.u.join.shape = c->shape;
    memcpy(c->req.u.join.shape_text, c->shape_text, sizeof c->shape_text);
    c->req.u.join.accumulate = c->accumulate;
    c->req.u.join.ends_when_drained = c->ends_when_drained;
    int rc = call(c, WIRE_GROUP_VIEW);
    if (!rc && out) *out = c->rep.u.view;
    return rc;
}

int client_group_join(client *c, const char *group, uint64_t step, uint64_t failed_epoch,
                      int gone_rank, uint32_t world_hint, wire_group_view *out)
{
    if (!group || !*group || strlen(group) >= WIRE_MAX_NAME) return DFLASH_EINVAL;
    if (gone_rank >= WIRE_MAX_WORLD) return DFLASH_EINVAL;
    LOCKED(c, do_group_join(c, group, step, failed_epoch, gone_rank, world_hint, out));
}

static int do_group_set_id(client *c, const char *group, uint64_t epoch, const uint8_t *id,
                           uint32_t len)
{
    req_init(c, WIRE_GROUP_SET_ID);
    snprintf(c->req.u.set_id.group, sizeof c->req.u.set_id.group, "%s", group);
    c->req.u.set_id.epoch = epoch;
    memcpy(c->req.u.set_id.id, id, len);
    c->req.u.set_id.id_len = len;
    return call(c, WIRE_OK);
}

int client_group_set_id(client *c, const char *group, uint64_t epoch, const uint8_t *id,
                        uint32_t len)
{
    if (!group || !*group || strlen(group) >= WIRE_MAX_NAME || !id || !len ||
        len > WIRE_GROUP_ID_BYTES)
        return DFLASH_EINVAL;
    LOCKED(c, do_group_set_id(c, group, epoch, id, len));
}

/* StepClaim, StepDone and GroupLeave share the body. */
static int do_gstep(client *c, wire_type t, const char *group, uint64_t epoch, uint64_t step,
                    uint32_t micro)
{
    req_init(c, t);
    snprintf(c->req.u.gstep.group, sizeof c->req.u.gstep.group, "%s", group);
    c->req.u.gstep.epoch = epoch;
    c->req.u.gstep.step = step;
    c->req.u.gstep.micro = micro;
    return call(c, t == WIRE_STEP_CLAIM ? WIRE_STEP_GRANT : WIRE_OK);
}

static int do_step_claim(client *c, const char *group, uint64_t epoch, uint64_t step,
                         uint32_t micro, wire_step_grant *out)
{
    int rc = do_gstep(c, WIRE_STEP_CLAIM, group, epoch, step, micro);
    if (!rc && out) *out = c->rep.u.sgrant;
    return rc;
}

int client_step_claim(client *c, const char *group, uint64_t epoch, uint64_t step,
                      uint32_t micro, wire_step_grant *out)
{
    if (!group || !*group || strlen(group) >= WIRE_MAX_NAME || micro >= WIRE_MAX_WORLD)
        return DFLASH_EINVAL;
    LOCKED(c, do_step_claim(c, group, epoch, step, micro, out));
}

static int do_step_done(client *c, const char *group, uint64_t epoch, uint64_t step,
                        uint64_t *n_acked)
{
    int rc = do_gstep(c, WIRE_STEP_DONE, group, epoch, step, 0);
    if (!rc && n_acked) *n_acked = c->rep.u.value;
    return rc;
}

int client_step_done(client *c, const char *group, uint64_t epoch, uint64_t step,
                     uint64_t *n_acked)
{
    if (!group || !*group || strlen(group) >= WIRE_MAX_NAME) return DFLASH_EINVAL;
    LOCKED(c, do_step_done(c, group, epoch, step, n_acked));
}

int client_group_leave(client *c, const char *group)
{
    if (!group || !*group || strlen(group) >= WIRE_MAX_NAME) return DFLASH_EINVAL;
    LOCKED(c, do_gstep(c, WIRE_GROUP_LEAVE, group, 0, 0, 0));
}

int client_heartbeat(client *c) { LOCKED(c, do_u64(c, WIRE_HEARTBEAT, mono_ms(), NULL)); }

/* The heartbeat thread's request: it leaves last_error as the main thread's last call left it
 * (defect: a poll between a call and its caller's client_last_error cleared the broker's words,
 * e.g. the refusal a drafter reads to tell whether a process of its own run replaced it). */
static int do_poll(client *c)
{
    uint32_t hb = c->heartbeat_ms ? c->heartbeat_ms : 1000;
    if (mono_ms() - c->last_send_ms < hb / 2) return 0;
    struct last_outcome kept = c->last;
    int rc = do_u64(c, WIRE_HEARTBEAT, mono_ms(), NULL);
    c->last = kept;
    return rc;
}

/* Never waits for another thread's call: the heartbeat thread's watchdog runs after its poll,
 * and a main thread hung inside a call (holding the mutex) must not hold the watchdog too. While
 * another call holds the client, that call's request is the heartbeat: nothing to send. */
int client_poll(client *c)
{
    if (pthread_mutex_trylock(&c->mu) != 0) return 0;
    int rc = do_poll(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int do_status(client *c, const char *peer_prefix, wire_status *out)
{
    if (peer_prefix && strlen(peer_prefix) >= WIRE_MAX_NAME) return DFLASH_ERANGE;
    req_init(c, WIRE_STATUS_REQUEST);
    if (peer_prefix) snprintf(c->req.u.peer_prefix, WIRE_MAX_NAME, "%s", peer_prefix);
    int rc = call(c, WIRE_STATUS_REPLY);
    if (!rc && out) *out = c->rep.u.status;
    return rc;
}

int client_status(client *c, wire_status *out) { LOCKED(c, do_status(c, NULL, out)); }

int client_status_peers(client *c, const char *peer_prefix, wire_status *out)
{
    LOCKED(c, do_status(c, peer_prefix, out));
}

static int do_set(client *c, const wire_settings *set, wire_settings *applied)
{
    if (set->n > WIRE_MAX_SETTINGS) return DFLASH_ERANGE;
    req_init(c, WIRE_SET_CONFIG);
    c->req.u.settings = *set;
    int rc = call(c, WIRE_SET_CONFIG_REPLY);
    if (!rc && applied) *applied = c->rep.u.settings;
    return rc;
}

int client_set(client *c, const wire_settings *set, wire_settings *applied)
{
    LOCKED(c, do_set(c, set, applied));
}

static int do_simple(client *c, wire_type t)
{
    req_init(c, t);
    return call(c, WIRE_OK);
}

int client_pause(client *c) { LOCKED(c, do_simple(c, WIRE_PAUSE)); }
int client_journal_sync(client *c) { LOCKED(c, do_simple(c, WIRE_JOURNAL_SYNC)); }
int client_resume(client *c) { LOCKED(c, do_simple(c, WIRE_RESUME)); }
int client_drain(client *c) { LOCKED(c, do_simple(c, WIRE_DRAIN)); }

static int do_release_quarantine(client *c, const wire_unit *unit, uint64_t *released)
{
    req_init(c, WIRE_RELEASE_QUARANTINE);
    c->req.u.release_q.all = unit == NULL;
    if (unit) c->req.u.release_q.unit = *unit;
    int rc = call(c, WIRE_OK);
    if (!rc && released) *released = c->rep.u.value;
    return rc;
}

int client_release_quarantine(client *c, const wire_unit *unit, uint64_t *released)
{
    LOCKED(c, do_release_quarantine(c, unit, released));
}

/* --- subscriber ----------------------------------------------------------------------------- */

struct client_sub {
    void *zctx, *sock;
    uint8_t buf[WIRE_MAX_MSG];
};

client_sub *client_sub_new(const char *pub_endpoint, const char *topic)
{
    return client_sub_new_curve(pub_endpoint, topic, NULL);
}

client_sub *client_sub_new_curve(const char *pub_endpoint, const char *topic, const client *keys)
{
    if (!pub_endpoint || !*pub_endpoint) return NULL;
    client_sub *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->zctx = zmq_ctx_new();
    s->sock = s->zctx ? zmq_socket(s->zctx, ZMQ_SUB) : NULL;
    int zero = 0;
    int64_t max = WIRE_MAX_MSG;
    if (!s->sock) goto fail;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max, sizeof max);
    zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, topic ? topic : "", topic ? strlen(topic) : 0);
    /* an ipc:// PUB is a NULL-mechanism socket (broker.h): CURVE there fails the handshake */
    if (keys && keys->curve && curve_endpoint_is_tcp(pub_endpoint) &&
        (zmq_setsockopt(s->sock, ZMQ_CURVE_SERVERKEY, keys->server_public, CURVE_Z85_LEN) ||
         zmq_setsockopt(s->sock, ZMQ_CURVE_PUBLICKEY, keys->public_, CURVE_Z85_LEN) ||
         zmq_setsockopt(s->sock, ZMQ_CURVE_SECRETKEY, keys->secret, CURVE_Z85_LEN)))
        goto fail;
    if (zmq_connect(s->sock, pub_endpoint) != 0) goto fail;
    return s;
fail:
    client_sub_destroy(&s);
    return NULL;
}

void client_sub_destroy(client_sub **sp)
{
    if (!sp || !*sp) return;
    client_sub *s = *sp;
    *sp = NULL;
    if (s->sock) zmq_close(s->sock);
    if (s->zctx) zmq_ctx_term(s->zctx);
    free(s);
}

int client_sub_recv(client_sub *s, char *topic, size_t topic_len, wire_msg *msg, int timeout_ms)
{
    zmq_pollitem_t it = {s->sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0) return DFLASH_ETIMEOUT;
    char t[64];
    int tn = zmq_recv(s->sock, t, sizeof t - 1, ZMQ_DONTWAIT);
    if (tn < 0) return DFLASH_ETIMEOUT;
    t[tn < (int)sizeof t - 1 ? tn : (int)sizeof t - 1] = 0;
    int more = 0;
    size_t ml = sizeof more;
    zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &ml);
    if (!more) return DFLASH_EPROTO;
    int n = zmq_recv(s->sock, s->buf, sizeof s->buf, ZMQ_DONTWAIT);
    if (n < 0 || (size_t)n > sizeof s->buf) return DFLASH_EPROTO;
    if (topic && topic_len) snprintf(topic, topic_len, "%s", t);
    return wire_unpack(s->buf, (size_t)n, msg, NULL, 0) ? DFLASH_EPROTO : 0;
}

void client_default_runtime_dir(char *out, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg) snprintf(out, len, "%.240s/dflash", xdg);
    else snprintf(out, len, "/tmp/dflash-%u", (unsigned)getuid());
}

void client_resolve_endpoint(const char *endpoint, const char *runtime_dir, char *out, size_t len)
{
    if (endpoint && *endpoint) {
        snprintf(out, len, "%s", endpoint);
        return;
    }
    char dir[256];
    if (runtime_dir && *runtime_dir) snprintf(dir, sizeof dir, "%s", runtime_dir);
    else client_default_runtime_dir(dir, sizeof dir);
    snprintf(out, len, "ipc://%.240s/queue.sock", dir);
}

/* client_check_endpoint (create: a daemon's check) and client_check_endpoint_existing. */
static int check_endpoint(const char *endpoint, bool create, char *err, size_t errlen)
{
    if (strncmp(endpoint, "ipc://", 6) != 0) return 0;
    const char *path = endpoint + 6;
    if (path[0] == '@') {
        err_fmt(err, errlen, "%s: an abstract socket, which any local user may serve: give "
                "ipc://DIR/NAME with DIR a directory of ours, mode 0700", endpoint);
        return DFLASH_ECONFIG;
    }
    char dir[256];
    if (fs_parent_dir(path, dir, sizeof dir) != 0) {
        err_fmt(err, errlen, "%s: the path is too long", endpoint);
        return DFLASH_ECONFIG;
    }
    char why[768];
    int rc = create ? fs_make_private_dir(dir, why, sizeof why)
                    : fs_check_private_dir(dir, why, sizeof why);
    if (rc == DFLASH_ENOTFOUND) {
        err_fmt(err, errlen, "ipc endpoint %s: no broker runs there, as its directory %s does "
                "not exist (a broker makes it when it starts)", endpoint, dir);
        return DFLASH_EPEER;
    }
    if (rc) err_fmt(err, errlen, "ipc endpoint %s refused: %s", endpoint, why);
    return rc;
}

int client_check_endpoint(const char *endpoint, char *err, size_t errlen)
{
    return check_endpoint(endpoint, true, err, errlen);
}

int client_check_endpoint_existing(const char *endpoint, char *err, size_t errlen)
{
    return check_endpoint(endpoint, false, err, errlen);
}
