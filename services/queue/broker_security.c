/* broker_security: how the broker's sockets are bound and who may connect (DESIGN.md section 5;
 * broker.h has the model). ipc:// endpoints use ZeroMQ's NULL mechanism (the 0700 runtime dir
 * is their access control); tcp:// endpoints use CURVE with the broker's secret key and a ZAP
 * handler (inproc://zeromq.zap.01, a REP socket on the loop) that accepts only the public keys
 * of the curve-clients and admin-keys dirs and sets the key as the connection's User-Id (which
 * broker.c's dispatch reads to refuse steering without an admin key). A bind refuses an ipc://
 * socket file a live process listens on.
 *
 * Key binding (defect: any accepted key could say hello as a live target's or drafter's name and
 * so replace it, or send requests from its routing id): a peer entry records the User-Id of its
 * first hello (peer.key; "" over ipc:// and NULL, which keeps ipc as it was). broker.c refuses
 * (Error DENIED with other_key set, broker_key_refuse; counted in status' key_refusals) any
 * later request on that entry with another key, a hello
 * that would replace a peer of the same role and name registered with another key while it is
 * in the table, and a hello or ResumeFrom that would replace a trainer of the same run
 * registered with another key (broker_take_over_run). Once that peer has left or expired
 * any accepted key may take the name; the same key takes over at once (a restart, as before).
 *
 * Routing-id takeover: the ROUTER has ZMQ_ROUTER_HANDOVER on (a client reconnecting with its
 * routing id must take over its half-dead connection), so a connection with a live peer's
 * routing id takes that peer's replies over, and it cannot be refused at the handshake: the
 * "identity" frame of a ZAP request (RFC 27) is, in libzmq (zap_client.cpp: options.routing_id;
 * checked with 4.3.4), the routing id of the *binding* socket, our ROUTER (empty), not the
 * connecting peer's (that travels in the handshake's metadata, which ZAP is not shown). So
 * the check is per request: every request of the taker is refused DENIED (above), and a
 * peer's routing id names its incarnation, 64 random bits the broker tells no other peer, so
 * the routing id of a live peer cannot be guessed (docs/protocol.md, "Security").
 * Thread: the broker's loop thread. Callers: broker.c (broker_new, dispatch), broker_trainers.c.
 */
#include "broker_state.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

/* Sends one ZAP reply frame; more = more frames follow. */
static void zap_send(void *s, const char *text, bool more)
{
    zmq_send(s, text, strlen(text), (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
}

/* One ZAP request (RFC 27): version, request id, domain, address, identity, mechanism,
 * credentials... CURVE's single credential is the client's 32-byte public key. Accepts a CURVE
 * key in curve_clients or admin_keys (User-Id = its Z85 text), and NULL connections (ipc://,
 * or tcp:// with --insecure-tcp; no User-Id); refuses anything else. Loop thread. */
static void on_zap(void *zsock, void *arg)
{
    broker *b = arg;
    zmq_msg_t f[8];
    int nf = 0, more = 1;
    size_t ml = sizeof more;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, zsock, nf ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (nf == 0) return; /* EAGAIN: spurious wake-up */
            break;
        }
        zmq_getsockopt(zsock, ZMQ_RCVMORE, &more, &ml);
        if (nf < 8) f[nf++] = m;
        else zmq_msg_close(&m);
    }
    char reqid[64] = "", mech[16] = "", user[CURVE_Z85_LEN + 1] = "";
    if (nf >= 2 && zmq_msg_size(&f[1]) < sizeof reqid)
        memcpy(reqid, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]));
    if (nf >= 6 && zmq_msg_size(&f[5]) < sizeof mech)
        memcpy(mech, zmq_msg_data(&f[5]), zmq_msg_size(&f[5]));
    bool ok = false;
    if (strcmp(mech, "NULL") == 0) {
        ok = true;
    } else if (strcmp(mech, "CURVE") == 0 && nf >= 7 && zmq_msg_size(&f[6]) == 32) {
        zmq_z85_encode(user, zmq_msg_data(&f[6]), 32);
        ok = curve_keyset_has(&b->curve_clients, user) || curve_keyset_has(&b->admin_keys, user);
    }
    if (!ok) {
        b->zap_denied++;
        char addr[64] = "?";
        if (nf >= 4 && zmq_msg_size(&f[3]) < sizeof addr) {
            memcpy(addr, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
            addr[zmq_msg_size(&f[3])] = 0;
        }
        if ((b->zap_denied & (b->zap_denied - 1)) == 0) /* peers retry: log 1st, 2nd, 4th... */
            LOG_WARN("refused a %s connection from %s%s%s: key not allowed (%" PRIu64
                     " refusals)",
                     mech[0] ? mech : "?", addr, user[0] ? " with key " : "", user, b->zap_denied);
        user[0] = 0;
    }
    for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
    zap_send(zsock, "1.0", true);
    zmq_send(zsock, reqid, strlen(reqid), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zap_send(zsock, ok ? "200" : "400", true);
    zap_send(zsock, ok ? "OK" : "key not allowed", true);
    zap_send(zsock, user, true);
    zap_send(zsock, "", false);
}

/* Loads the keys and starts the ZAP handler; must run before any CURVE bind (libzmq admits a
 * connection when no handler is bound). Returns 0 or DFLASH_ECONFIG/EZMQ with a log line. */
int broker_security_start(broker *b, const queue_config *cfg)
{
    char why[400];
    int rc = curve_key_read(cfg->curve_secret_key, true, b->curve_secret, why, sizeof why);
    if (!rc) rc = curve_keyset_load(cfg->curve_clients, &b->curve_clients, why, sizeof why);
    if (!rc && cfg->admin_keys[0])
        rc = curve_keyset_load(cfg->admin_keys, &b->admin_keys, why, sizeof why);
    if (rc) {
        LOG_ERROR("%s", why);
        return DFLASH_ECONFIG;
    }
    b->zap = zmq_socket(b->zctx, ZMQ_REP);
    int zero = 0;
    if (!b->zap || zmq_setsockopt(b->zap, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_bind(b->zap, "inproc://zeromq.zap.01") != 0) {
        LOG_ERROR("cannot start the ZAP handler: %s", zmq_strerror(errno));
        return DFLASH_EZMQ;
    }
    if (!(b->zap_watch = zloop_sock_new(b->loop, b->zap, 16, on_zap, b))) return DFLASH_EZMQ;
    b->curve_on = true;
    curve_key pub;
    curve_public_of(b->curve_secret, pub);
    LOG_INFO("CURVE on for tcp:// endpoints: server public key %s, %u client keys, %u admin keys",
             pub, b->curve_clients.n, b->admin_keys.n);
    return 0;
}

/* True when a process accepts connections on the ipc:// endpoint's socket file. ZeroMQ's bind
 * removes an existing socket file, a live broker's too: the second broker on a runtime dir
 * would take the path over and leave the first one unreachable. A file nobody listens on (its
 * broker died) is fair to replace. */
static bool ipc_endpoint_live(const char *endpoint)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strncmp(endpoint, "ipc://", 6) != 0 || strlen(endpoint + 6) >= sizeof a.sun_path)
        return false;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", endpoint + 6);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    bool live = connect(fd, (const struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return live;
}

/* Binds s to endpoint; a tcp:// endpoint gets CURVE (server side) when it is on. ZeroMQ copies
 * the mechanism options at bind time, so ipc:// and tcp:// endpoints of one socket differ. */
static int bind_endpoint(broker *b, void *s, const char *endpoint)
{
    if (ipc_endpoint_live(endpoint)) {
        LOG_ERROR("cannot bind %s: a running process listens there (another dflash-queue on "
                  "this runtime dir?)",
                  endpoint);
        return DFLASH_EEXISTS;
    }
    int curve = b->curve_on && curve_endpoint_is_tcp(endpoint);
    zmq_setsockopt(s, ZMQ_CURVE_SERVER, &curve, sizeof curve);
    if (curve) {
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, b->curve_secret, CURVE_Z85_LEN);
        zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "dflash", 6);
    }
    if (zmq_bind(s, endpoint) != 0) {
        LOG_ERROR("cannot bind %s: %s (another dflash-queue running? wrong runtime dir?)",
                  endpoint, zmq_strerror(errno));
        return DFLASH_EZMQ;
    }
    return 0;
}

void *broker_bind_socket(broker *b, int type, const char *endpoint, int *err)
{
    void *s = zmq_socket(b->zctx, type);
    if (!s) return *err = DFLASH_EZMQ, NULL;
    int zero = 0, one = 1;
    int64_t max = WIRE_MAX_MSG;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max);
    if (type == ZMQ_ROUTER) {
        zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
        zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    }
    int rc = bind_endpoint(b, s, endpoint);
    if (!rc && type == ZMQ_ROUTER && b->cfg.bind[0]) rc = bind_endpoint(b, s, b->cfg.bind);
    if (rc) {
        zmq_close(s);
        return *err = rc, NULL;
    }
    return s;
}

/* A key as the log names it. */
static const char *key_text(const char *key)
{
    return key[0] ? key : "(none: ipc:// or NULL)";
}

void broker_key_refuse(broker *b, const wire_msg *m, const peer *o, const char *why, wire_msg *r)
{
    uint64_t since;
    if (warn_limit_due(&b->key_denied, now_ms(b), &since))
        LOG_WARN("%s from CURVE key %s refused: %s %s registered with key %s (%" PRIu64
                 " such refusals since the last report, %" PRIu64 " in all)",
                 wire_type_name(m->type), key_text(b->dispatch_user), wire_role_name(o->role),
                 o->name, key_text(o->key), since, b->key_denied.count);
    reply_error(b, r, m->request_id, DFLASH_EDENIED, "%s", why);
    r->u.error.other_key = true; /* a drafter tells it from another model's DENIED (exit 4) */
}
