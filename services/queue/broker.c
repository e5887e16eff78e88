/* broker: see broker.h for the model. This file: the config table, the peer and pool tables,
 * message dispatch (one handler per request type), the socket plumbing (ROUTER + PUB through
 * zloop) and the cron timer.
 *
 * Peer table: a small array searched linearly by routing id (a node has a handful of peers).
 * A hello from a new incarnation of a live peer's role+name replaces that peer (a restart); the
 * new entry remembers the incarnations it replaced (PEER_REPLACED, inherited from the one it
 * replaced), and a hello from one of those is refused EXISTS: it is a second live process with
 * the name (defect: two of them replaced each other on every request, for ever).
 * Pool table: indexed by pool id, one per target name, kept across target incarnations so the
 * policy sees a restart as "same pool, new incarnation"; an entry no live target holds is given
 * to a new name when all MAX_POOLS are taken.
 *
 * Policy: created at the first pool registration, because the bucket count comes from the
 * target; settings made before then are kept in cfg and applied at creation.
 *
 * Runtime steering (steering.h): every set, pause, resume and drain journals the mode and the
 * live values that differ from `configured` (cfg as the flags, env and file gave it) as the
 * ledger's settings record, and is answered like a commit: once that record is durable, Error IO
 * when it could not be (the change is in force anyway). broker_new restores the record after the
 * replay (restore_steering): a value whose configuration is unchanged since it was set comes
 * back, a changed configuration wins (all configured values win when the restored ones do not
 * fit together, live_check), the mode comes back as it was. A restored drain keeps today's
 * semantics: pending_mode is DRAINING before any pool registers, so claims end at once
 * (drained()) and a target that registers gets SHUTDOWN. A deliberate stop (broker_shutdown,
 * SIGTERM) journals the end of a drain, so only a crash leaves one for the next start.
 *
 * Restart fence (defect: a re-registering target's slots were all taken as FREE, so a slot a
 * drafter was still copying under the old broker's lease could be handed out for refilling):
 * PoolRegister carries busy_slots, the slots the target published and was not handed back in a
 * work unit since. When the registration creates the pool in the policy (a new broker, or a pool
 * this broker had dropped), each busy slot is fenced until now + lease_timeout_ms: no work unit
 * names it and no SLOT_READY is accepted for it until the cron tick lifts the fence. Why that is
 * enough: every lease this broker cannot see on that slot was granted before this registration,
 * and a copy ends within a lease timeout of its grant (policy.h, "Restart fence"). A
 * re-registration of a pool the policy already has (same incarnation) ignores the list: the
 * broker's own slot states are authoritative. Old targets send no list: nothing is fenced.
 *
 * Journal and replies (defect: commit/rewind fsyncs and every journal write ran on this loop):
 * with sockets, the ledger's journal runs in writer mode (journal.h): handlers only queue
 * records. Each reply gets a ticket: the journal's last queued record number if its request
 * queued a record (the FIFO writer makes every earlier record durable first), else the ticket of
 * the same peer's previous reply (so e.g. a retried Ack answered EXISTS cannot overtake the
 * first Ack's record). A reply whose ticket is above the durable number is *deferred* (copied
 * into a list) and sent by on_journal_done once the writer reports it durable; a peer's replies
 * keep their order (its tickets never decrease), and other peers' claims, releases and
 * heartbeats are answered during an fsync. A reply thus never reports state less durable than
 * before the change (records written before the reply; COMMIT/REWIND/PLAN/SETTINGS fdatasynced).
 * If the record of a CheckpointCommitted, ResumeFrom or steering verb could not be written or
 * synced, its reply is Error IO, unless a healing rewrite made it durable before the failure was
 * reported (journal_watch: the reply is then the handler's). A journal that failed is rewritten
 * from memory every journal_retry_ms until that succeeds (journal_watch).
 * Without sockets (broker_dispatch from tests and the fuzz harness) the journal stays inline.
 *
 * Groups ("groups" below; group.h holds the state machine): the handlers turn GroupJoin,
 * GroupSetId, StepClaim, StepDone and GroupLeave into group.c calls and carry out the outcome
 * (apply_outcome): ledger acks of a step's units once for the group, or requeue/revoke on an
 * abort. A step's reservation is all or nothing (policy_claimable first). A dead drafter's copied
 * units of a step in flight stay in flight until the step is resolved (peer_remove skips them).
 */
#include "broker.h"

#include "curve.h"
#include "err.h"
#include "group.h"
#include "ledger.h"
#include "log.h"
#include "policy.h"
#include "steering.h"
#include "zloop.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

/* --- config table --------------------------------------------------------------------------- */

#define OPT_S(name, def, live, help, member)                                                       \
    {name, CFG_STRING, def, 1, 0, live, help, offsetof(queue_config, member),                     \
     sizeof(((queue_config *)0)->member)}
#define OPT_I(name, def, lo, hi, live, help, member)                                               \
    {name, CFG_INT, def, lo, hi, live, help, offsetof(queue_config, member), 0}

static const cfg_option queue_options[] = {
    OPT_S("runtime-dir", "", false,
          "0700 directory for ipc sockets (default $XDG_RUNTIME_DIR/dflash or /tmp/dflash-UID)",
          runtime_dir),
    OPT_S("endpoint", "", false, "ROUTER endpoint (default ipc://RUNTIME_DIR/queue.sock)",
          endpoint),
    OPT_S("pub-endpoint", "", false,
          "PUB endpoint for announcements (default ipc://RUNTIME_DIR/queue-pub.sock)",
          pub_endpoint),
    OPT_S("journal", "", false,
          "ledger journal path (default RUNTIME_DIR/queue.journal; 'none' keeps it in memory)",
          journal),
    OPT_S("bind", "", false,
          "extra ROUTER endpoint, e.g. tcp://10.0.0.1:5555 (needs the CURVE options below)",
          bind),
    OPT_S("curve-secret-key", "", false,
          "the broker's CURVE secret key file (dflash-ctl keygen); turns CURVE on for tcp://",
          curve_secret_key),
    OPT_S("curve-clients", "", false,
          "directory of client public keys (*.pub) allowed to connect over tcp://",
          curve_clients),
    OPT_S("admin-keys", "", false,
          "directory of public keys (*.pub) allowed to set/pause/resume/drain over tcp://",
          admin_keys),
    {"insecure-tcp", CFG_BOOL, "false", 1, 0, false,
     "FOR TESTS ONLY: allow tcp:// endpoints without CURVE (anyone who reaches the port may "
     "steer)",
     offsetof(queue_config, insecure_tcp), 0},
    OPT_I("min-ready", "30", 0, 1 << 20, true,
          "mixing reservoir: claims are served while at least this many slots are ready "
          "(at most max-depth)",
          min_ready),
    OPT_I("max-depth", "90", 1, 1 << 20, true, "cap on filling+ready+leased slots", max_depth),
    OPT_I("lease-timeout-ms", "5000", 1, 3600000, true,
          "a lease not released or heartbeated within this time is redelivered", lease_timeout_ms),
    OPT_I("max-redeliveries", "3", 0, 1000, true,
          "a batch whose deliveries end untrained more often (lease expired, drafter gone "
          "holding it) is quarantined",
          max_redeliveries),
    OPT_S("shares", "", true,
          "bucket token shares, comma separated, finite and >= 0, one per bucket (default, or "
          "when the count does not fit: as the target reports)",
          shares),
    OPT_I("mix-window", "1000", 1, 65536, false, "claims in the TV-distance window", mix_window),
    OPT_I("heartbeat-ms", "1000", 10, 60000, false, "heartbeat interval peers are told",
          heartbeat_ms),
    OPT_I("liveness", "3", 1, 100, false, "heartbeats a peer may miss before it is expired",
          liveness),
    OPT_I("stats-interval-ms", "1000", 0, 3600000, true, "stats on PUB every N ms (0 = off)",
          stats_interval_ms),
    OPT_I("orphan-grace-ms", "0", 0, 3600000, false,
          "after a restart, in-flight batches wait this long for their peers (0 = 2 leases)",
          orphan_grace_ms),
    OPT_I("max-epochs", "0", 0, 1000000, false, "stop after N epochs (0 = as the target says)",
          max_epochs),
    {"fsync", CFG_BOOL, "true", 1, 0, false, "fsync the journal on commits and rewinds",
     offsetof(queue_config, fsync), 0},
    OPT_I("compact-bytes", "67108864", 0, 1ll << 40, false,
          "rewrite the journal as a snapshot past this size (0 = never)", compact_bytes),
    OPT_I("journal-retry-ms", "15000", 10, 3600000, false,
          "while the journal is failing (a full disk), rewrite it whole from memory this often "
          "until it takes it", journal_retry_ms),
    OPT_S("log-level", "info", true, "debug, info, warn or error", log_level),
};

static const cfg_table queue_table = {
    "dflash-queue",
    "the DFlash broker: length buckets, ready reservoir, slot leases and the training ledger",
    "[options]",
    queue_options,
    sizeof queue_options / sizeof *queue_options,
};

const cfg_table *broker_config_table(void) { return &queue_table; }

/* The reservoir must fit under the depth cap: a claim waits for min_ready ready slots, a group
 * step of world ranks for min_ready + world - 1, and at most max_depth slots are ever filled.
 * Returns 0 or DFLASH_ERANGE with why (optional) set. */
static int depth_check(const queue_config *c, uint32_t world, char *why, size_t why_len)
{
    int64_t need = c->min_ready + (world > 1 ? world - 1 : 0);
    if (need <= c->max_depth) return 0;
    if (why)
        snprintf(why, why_len, "min-ready %lld needs %lld ready slots for a step of %u rank(s) "
                 "but max-depth is %lld: every claim would wait forever (lower min-ready or "
                 "raise max-depth)", (long long)c->min_ready, (long long)need,
                 world > 1 ? world : 1, (long long)c->max_depth);
    return DFLASH_ERANGE;
}

static int parse_shares(const char *s, uint32_t n, double *out);

int broker_config_check(const queue_config *c, char *why, size_t why_len)
{
    bool curve = c->curve_secret_key[0] || c->curve_clients[0];
    const char *tcp = curve_endpoint_is_tcp(c->endpoint)       ? c->endpoint
                      : curve_endpoint_is_tcp(c->bind)         ? c->bind
                      : curve_endpoint_is_tcp(c->pub_endpoint) ? c->pub_endpoint
                                                               : NULL;
    if (curve && !(c->curve_secret_key[0] && c->curve_clients[0])) {
        snprintf(why, why_len, "CURVE needs both --curve-secret-key FILE and --curve-clients DIR");
        return DFLASH_ECONFIG;
    }
    if (curve && !curve_available()) {
        snprintf(why, why_len, "CURVE options given but this libzmq has no CURVE (libsodium)");
        return DFLASH_ECONFIG;
    }
    if (tcp && !curve && !c->insecure_tcp) {
        snprintf(why, why_len,
                 "%s is a tcp:// endpoint: TCP needs CURVE (DESIGN.md section 5). Give "
                 "--curve-secret-key FILE and --curve-clients DIR (keys: dflash-ctl keygen DIR "
                 "NAME), or --insecure-tcp for tests on loopback only",
                 tcp);
        return DFLASH_ECONFIG;
    }
    if (c->admin_keys[0] && !curve) {
        snprintf(why, why_len, "--admin-keys needs CURVE (--curve-secret-key, --curve-clients)");
        return DFLASH_ECONFIG;
    }
    if (depth_check(c, 1, why, why_len)) return DFLASH_ECONFIG;
    double sh[WIRE_MAX_BUCKETS];
    if (c->shares[0] && parse_shares(c->shares, 0, sh)) {
        snprintf(why, why_len, "--shares '%s': need finite non-negative numbers, comma separated",
                 c->shares);
        return DFLASH_ECONFIG;
    }
    return 0;
}

/* --- state ---------------------------------------------------------------------------------- */

typedef enum { PEER_NEW = 0, PEER_LIVE, PEER_GONE } peer_state;

#define PEER_RECENT_RELEASES 8 /* a retried release of one of these is answered Ok */
#define PEER_REPLACED 8        /* replaced incarnations remembered per name (duplicates) */

typedef struct peer {
    uint8_t rid[256];
    size_t rid_len;
    peer_state state;
    wire_role role;
    uint64_t incarnation;
    char name[WIRE_MAX_NAME];
    uint64_t last_seen_ms;
    int32_t pool_id;   /* target: its pool, -1 none */
    batch_id *held;    /* drafter: released, not acked */
    uint32_t n_held, cap_held;
    struct {
        uint64_t lease_id;
        batch_id batch;
    } released[PEER_RECENT_RELEASES]; /* drafter: its last releases (ring, n_released % N) */
    uint32_t n_released;
    uint64_t journal_ticket; /* ticket of its last reply (see the header) */
    uint64_t replaced[PEER_REPLACED]; /* incarnations of its name it replaced (ring) */
    uint32_t n_replaced;
    bool trains; /* drafter: it sent ResumeFrom (a trainer; verifiers and group ranks do not) */
} peer;

typedef struct pool_desc {
    char owner[WIRE_MAX_NAME]; /* target name */
    bool registered;
    wire_pool desc;            /* event_handles points to events below */
    uint8_t (*events)[WIRE_HANDLE_BYTES];
    uint32_t *n_seqs;          /* per slot, from its last SLOT_READY (for the Grant) */
} pool_desc;

#define MAX_POOLS 64

/* A reply waiting for the journal: sent when done_seq >= ticket (see the header). */
typedef struct deferred_reply {
    struct deferred_reply *next;
    uint64_t ticket;
    uint64_t request_id;
    bool fail_on_io;  /* CheckpointCommitted, ResumeFrom, steering: Error IO if the record failed */
    size_t rid_len, len;
    uint8_t rid[256];
    uint8_t msg[];    /* the packed reply */
} deferred_reply;

struct broker {
    uv_loop_t *loop;
    queue_config cfg;
    queue_config configured;       /* cfg as configured at start-up (flags, env, file) */
    uint64_t incarnation;
    uint64_t start_ms;
    void *zctx, *router, *pub, *zap;
    zloop_sock *router_watch, *zap_watch;
    bool curve_on;                 /* tcp:// endpoints are bound with CURVE */
    curve_key curve_secret;        /* the broker's secret key (Z85) */
    curve_keyset curve_clients;    /* keys the ZAP handler accepts */
    curve_keyset admin_keys;       /* keys that may steer (also accepted by ZAP) */
    char dispatch_user[CURVE_Z85_LEN + 1]; /* CURVE key of the request being dispatched, or "" */
    uint64_t zap_denied, steer_denied;
    uv_timer_t cron;
    bool cron_started, stopped;
    uint64_t last_cron_ms;   /* when cron last ran (0: not yet) */
    uint64_t judge_from_ms;  /* nothing expires before this (stall_hold) */
    uint64_t last_grace_ms;  /* when that grace was last given */
    uint64_t last_stats_ms, grants_at_last; /* claims/s: when last measured, grants then */
    uint64_t journal_alarm_ms; /* when a broken journal was last said (journal_watch) */
    uint64_t journal_heal_ms;  /* when a heal of it was last tried */
    bool journal_failing;      /* it was broken at the last cron */
    double claims_per_s;

    ledger *ledger;
    policy *policy;
    group_table *groups;      /* data-parallel drafter groups (group.h) */
    policy_mode pending_mode;
    uint32_t n_buckets;
    double target_share[WIRE_MAX_BUCKETS]; /* the last registered target's: used while
                                              cfg.shares is empty */
    uint32_t epochs;          /* from the target (0 unknown) */
    bool orphans_requeued;

    peer **peers;
    uint32_t n_peers, cap_peers;
    pool_desc pools[MAX_POOLS];

    uint64_t malformed, acks, double_acks, unroutable, requests;
    deferred_reply *dq_head, *dq_tail; /* in deferral order; each peer's tickets ascending */
    uint64_t dispatch_ticket;          /* of the last broker_dispatch */
    uint64_t dispatch_request_id;
    bool dispatch_fail_on_io;
    uint8_t *inbuf, *outbuf;
    char cfg_applied_log[16]; /* log level last applied by a live set */
};

static uint64_t now_ms(broker *b)
{
    uv_update_time(b->loop);
    return uv_now(b->loop);
}

/* --- peers ---------------------------------------------------------------------------------- */

static void peer_set_state(peer *p, peer_state to)
{
    /* NEW -> LIVE (hello), LIVE -> LIVE (re-hello), NEW|LIVE -> GONE */
    assert((p->state == PEER_NEW && to == PEER_LIVE) || (p->state == PEER_LIVE && to == PEER_LIVE) ||
           (p->state != PEER_GONE && to == PEER_GONE));
    p->state = to;
}

static peer *peer_find(broker *b, const uint8_t *rid, size_t len)
{
    for (uint32_t i = 0; i < b->n_peers; i++)
        if (b->peers[i]->rid_len == len && memcmp(b->peers[i]->rid, rid, len) == 0)
            return b->peers[i];
    return NULL;
}

static peer *peer_add(broker *b, const uint8_t *rid, size_t len)
{
    if (b->n_peers == b->cap_peers) {
        uint32_t cap = b->cap_peers ? b->cap_peers * 2 : 16;
        peer **np = realloc(b->peers, cap * sizeof *np);
        if (!np) return NULL;
        b->peers = np;
        b->cap_peers = cap;
    }
    peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    memcpy(p->rid, rid, len);
    p->rid_len = len;
    p->pool_id = -1;
    b->peers[b->n_peers++] = p;
    return p;
}

static int held_add(peer *p, const batch_id *id)
{
    if (p->n_held == p->cap_held) {
        uint32_t cap = p->cap_held ? p->cap_held * 2 : 8;
        batch_id *nh = realloc(p->held, cap * sizeof *nh);
        if (!nh) return DFLASH_ENOMEM;
        p->held = nh;
        p->cap_held = cap;
    }
    p->held[p->n_held++] = *id;
    return 0;
}

static bool same_batch(const batch_id *a, const batch_id *b)
{
    return a->epoch == b->epoch && a->bucket == b->bucket && a->index == b->index;
}

static bool held_remove(peer *p, const batch_id *id)
{
    for (uint32_t i = 0; i < p->n_held; i++)
        if (same_batch(&p->held[i], id)) {
            p->held[i] = p->held[--p->n_held];
            return true;
        }
    return false;
}

static void groups_peer_gone(broker *b, peer *p);
static bool group_step_owns(broker *b, const batch_id *id);

/* A delivery of in-flight batch id ended untrained (a lease expired, a drafter left holding it):
 * counted in the ledger, so re-producing the batch into a fresh slot or restarting the broker
 * does not reset it. Past max_redeliveries the batch is quarantined (a batch that makes every
 * drafter fail must not stop training forever); otherwise, with requeue, it goes back to to-do.
 * Returns true when quarantined. */
static bool batch_failed(broker *b, const batch_id *id, bool requeue)
{
    int n = ledger_fail(b->ledger, id);
    if (n > 0 && (int64_t)n > b->cfg.max_redeliveries) {
        LOG_WARN("batch %u/%u/%u quarantined: %d of its deliveries ended untrained "
                 "(max-redeliveries %" PRId64 ")", id->epoch, id->bucket, id->index, n,
                 b->cfg.max_redeliveries);
        if (requeue) ledger_quarantine(b->ledger, id);
        return true;
    }
    if (requeue) ledger_requeue(b->ledger, id);
    return false;
}

/* Ends a peer's session: drafter leases end and its held batches return to to-do; a target's
 * pool is dropped. Frees the entry (index i). */
static void peer_remove(broker *b, uint32_t i, const char *why)
{
    peer *p = b->peers[i];
    LOG_INFO("peer %s (%s, incarnation %016" PRIx64 ") %s", p->name, wire_role_name(p->role),
             p->incarnation, why);
    if (p->role == WIRE_ROLE_DRAFTER) {
        groups_peer_gone(b, p);
        if (b->policy) policy_drop_worker(b->policy, p->incarnation);
        for (uint32_t k = 0; k < p->n_held; k++)
            if (!group_step_owns(b, &p->held[k])) batch_failed(b, &p->held[k], true);
    } else if (p->role == WIRE_ROLE_TARGET && p->pool_id >= 0) {
        if (b->policy) policy_pool_drop(b->policy, (uint32_t)p->pool_id);
        b->pools[p->pool_id].registered = false;
    }
    peer_set_state(p, PEER_GONE);
    free(p->held);
    free(p);
    b->peers[i] = b->peers[--b->n_peers];
}

/* --- policy glue ---------------------------------------------------------------------------- */

static void sink_requeue(void *ctx, const batch_id *id)
{
    broker *b = ctx;
    int rc = ledger_requeue(b->ledger, id);
    if (rc && rc != DFLASH_ESTATE)
        LOG_WARN("requeue %u/%u/%u: %s", id->epoch, id->bucket, id->index, err_str(rc));
}

static void sink_quarantine(void *ctx, const batch_id *id, uint32_t pool_id, uint64_t inc,
                            uint32_t slot)
{
    broker *b = ctx;
    (void)inc;
    /* count_failure said why, with the batch's count of failed deliveries: here only where */
    LOG_DEBUG("batch %u/%u/%u quarantined: its slot %u of pool %u is free again", id->epoch,
              id->bucket, id->index, slot, pool_id);
    ledger_quarantine(b->ledger, id);
}

static bool sink_failed(void *ctx, const batch_id *id)
{
    return batch_failed(ctx, id, false);
}

/* n finite non-negative numbers into out; n 0: any count up to WIRE_MAX_BUCKETS (the bucket
 * count is not known yet; out has room for that many). 0 or DFLASH_EINVAL. */
static int parse_shares(const char *s, uint32_t n, double *out)
{
    uint32_t k = 0, max = n ? n : WIRE_MAX_BUCKETS;
    const char *p = s;
    while (*p) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || k >= max || !(v >= 0) || !isfinite(v)) return DFLASH_EINVAL;
        out[k++] = v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return (n ? k == n : k > 0) ? 0 : DFLASH_EINVAL;
}

static int policy_create(broker *b, uint32_t n_buckets, const uint32_t *upper, const double *share)
{
    policy_params pp;
    policy_params_default(&pp);
    pp.n_buckets = n_buckets;
    for (uint32_t i = 0; i < n_buckets; i++) pp.bucket_max_len[i] = upper[i];
    pp.min_ready = (uint32_t)b->cfg.min_ready;
    pp.max_depth = (uint32_t)b->cfg.max_depth;
    pp.lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
    pp.max_redeliveries = (uint32_t)b->cfg.max_redeliveries;
    pp.mix_window = (uint32_t)b->cfg.mix_window;
    pp.first_lease_id = (b->incarnation & 0xffffff0000000000ull) | 1;
    policy_sink sink = {b, sink_requeue, sink_quarantine, sink_failed};
    b->policy = policy_new(&pp, &sink);
    if (!b->policy) return DFLASH_EINVAL;
    b->n_buckets = n_buckets;
    double sh[WIRE_MAX_BUCKETS];
    if (b->cfg.shares[0] && (parse_shares(b->cfg.shares, n_buckets, sh) ||
                             policy_set_shares(b->policy, n_buckets, sh))) {
        /* Known only now: drop it, so the config and later sets show and check what is used. */
        LOG_WARN("shares '%s' do not fit the target's %u buckets: using the target's shares",
                 b->cfg.shares, n_buckets);
        /* the configured ones too: dropped, they are no runtime change to journal */
        if (strcmp(b->configured.shares, b->cfg.shares) == 0) b->configured.shares[0] = '\0';
        b->cfg.shares[0] = '\0';
    }
    memcpy(b->target_share, share, n_buckets * sizeof *share);
    if (!b->cfg.shares[0]) policy_set_shares(b->policy, n_buckets, share);
    policy_set_mode(b->policy, b->pending_mode);
    return 0;
}

/* --- replies -------------------------------------------------------------------------------- */

static void reply_init(broker *b, wire_msg *r, wire_type t, uint64_t rid)
{
    wire_msg_init(r, t, WIRE_ROLE_BROKER, b->incarnation, rid);
}

static void reply_error(broker *b, wire_msg *r, uint64_t rid, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void reply_error(broker *b, wire_msg *r, uint64_t rid, int code, const char *fmt, ...)
{
    reply_init(b, r, WIRE_ERROR, rid);
    r->u.error.code = code < 0 ? code : DFLASH_EINTERNAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->u.error.message, sizeof r->u.error.message, fmt, ap);
    va_end(ap);
}

static void reply_ok(broker *b, wire_msg *r, uint64_t rid, uint64_t value)
{
    reply_init(b, r, WIRE_OK, rid);
    r->u.value = value;
}

static void publish(broker *b, const char *topic, const wire_msg *m)
{
    if (!b->pub) return;
    int n = wire_pack(m, b->outbuf, WIRE_MAX_MSG);
    if (n <= 0) return;
    if (zmq_send(b->pub, topic, strlen(topic), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return;
    zmq_send(b->pub, b->outbuf, (size_t)n, ZMQ_DONTWAIT);
}

/* --- handlers: each fills *r ---------------------------------------------------------------- */

static batch_id to_batch(const wire_unit *u)
{
    batch_id id = {u->epoch, u->bucket, (uint32_t)u->index};
    return id;
}

static wire_unit to_unit(const batch_id *id)
{
    wire_unit u = {id->epoch, id->bucket, id->index};
    return u;
}

/* False for a batch of an epoch past the target's (or --max-epochs): a peer's batch is not
 * adopted then (the ledger refuses far epochs too). Unknown epochs (no target yet) pass. */
static bool in_epochs(const broker *b, const batch_id *id)
{
    return !b->epochs || id->epoch < b->epochs;
}

static bool peer_replaced(const peer *o, uint64_t incarnation)
{
    uint32_t n = o->n_replaced < PEER_REPLACED ? o->n_replaced : PEER_REPLACED;
    for (uint32_t k = 0; k < n; k++)
        if (o->replaced[k] == incarnation) return true;
    return false;
}

static void peer_note_replaced(peer *p, uint64_t incarnation)
{
    if (!peer_replaced(p, incarnation)) p->replaced[p->n_replaced++ % PEER_REPLACED] = incarnation;
}

/* False when the hello is refused (r holds the error; p must be forgotten by the caller). */
static bool on_hello(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    /* A new incarnation of the same role+name replaces the old session (a restart); an
     * incarnation that was replaced and still says hello is a second live process with that
     * name (duplicates replaced each other for ever): refused, the newer one keeps the name. */
    for (uint32_t i = 0; i < b->n_peers; i++) {
        peer *o = b->peers[i];
        if (o != p && o->role == m->role && strcmp(o->name, m->u.hello.name) == 0 &&
            o->incarnation != m->incarnation) {
            if (o->state == PEER_LIVE && peer_replaced(o, m->incarnation)) {
                LOG_WARN("hello from %s %s (incarnation %016" PRIx64 ") refused: incarnation "
                         "%016" PRIx64 " replaced it and holds the name",
                         wire_role_name(m->role), m->u.hello.name, m->incarnation,
                         o->incarnation);
                reply_error(b, r, m->request_id, DFLASH_EEXISTS,
                            "the %s name '%s' is in use by another live process (incarnation "
                            "%016" PRIx64 "): give each %s its own --name",
                            wire_role_name(m->role), m->u.hello.name, o->incarnation,
                            wire_role_name(m->role));
                return false;
            }
            for (uint32_t k = 0; k < o->n_replaced && k < PEER_REPLACED; k++)
                peer_note_replaced(p, o->replaced[k]);
            peer_note_replaced(p, o->incarnation);
            peer_remove(b, i, "replaced by a new incarnation");
            break;
        }
    }
    snprintf(p->name, sizeof p->name, "%s", m->u.hello.name);
    p->role = m->role;
    p->incarnation = m->incarnation;
    peer_set_state(p, PEER_LIVE);
    /* A drafter re-registering after a broker restart: the batches it trains are not orphans. */
    for (uint32_t i = 0; i < m->u.hello.n_held; i++) {
        batch_id id = to_batch(&m->u.hello.held[i]);
        int rc = in_epochs(b, &id) ? ledger_adopt(b->ledger, &id) : DFLASH_ERANGE;
        if (rc == 0 || rc == DFLASH_EEXISTS) {
            bool known = false;
            for (uint32_t k = 0; k < p->n_held; k++) known |= same_batch(&p->held[k], &id);
            if (!known) held_add(p, &id);
        }
    }
    LOG_INFO("hello from %s %s (incarnation %016" PRIx64 ", %u held)", wire_role_name(p->role),
             p->name, p->incarnation, m->u.hello.n_held);
    reply_init(b, r, WIRE_HELLO, m->request_id);
    snprintf(r->u.hello.name, sizeof r->u.hello.name, "dflash-queue");
    r->u.hello.heartbeat_ms = (uint32_t)b->cfg.heartbeat_ms;
    r->u.hello.lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
    snprintf(r->u.hello.pub_endpoint, sizeof r->u.hello.pub_endpoint, "%s", b->cfg.pub_endpoint);
    return true;
}

/* True while pool i is registered or a live target holds it. */
static bool pool_held(const broker *b, int i)
{
    if (b->pools[i].registered) return true;
    for (uint32_t k = 0; k < b->n_peers; k++)
        if (b->peers[k]->pool_id == i) return true;
    return false;
}

/* The pool id of target `owner`: its own, else an unused one, else one that no live target
 * holds (its pool was dropped when its target went; defect: the table kept every name it had
 * seen, so after 64 names no target could register). -1 when all are held. */
static int pool_slot_for(broker *b, const char *owner)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (b->pools[i].owner[0] && strcmp(b->pools[i].owner, owner) == 0) return i;
    int reuse = -1;
    for (int i = 0; i < MAX_POOLS && reuse < 0; i++)
        if (!b->pools[i].owner[0]) reuse = i;
    for (int i = 0; i < MAX_POOLS && reuse < 0; i++)
        if (!pool_held(b, i)) reuse = i;
    if (reuse >= 0) snprintf(b->pools[reuse].owner, sizeof b->pools[reuse].owner, "%s", owner);
    return reuse;
}

/* Warns when the targets' slots cannot hold min_ready ready ones: claims then wait until more
 * slots register (another target, or a lower min_ready by `set`). */
static void warn_reservoir(const broker *b)
{
    uint64_t slots = 0;
    for (int i = 0; i < MAX_POOLS; i++)
        if (b->pools[i].registered) slots += b->pools[i].desc.slot_count;
    if (slots && (uint64_t)b->cfg.min_ready > slots)
        LOG_WARN("min-ready %lld is more than the %" PRIu64 " slots the targets registered: no "
                 "claim is served until more slots register or min_ready is lowered",
                 (long long)b->cfg.min_ready, slots);
}

static void on_pool_register(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_pool *w = &m->u.pool;
    if (p->role != WIRE_ROLE_TARGET)
        return reply_error(b, r, m->request_id, DFLASH_EDENIED, "only a target registers pools");
    int id = pool_slot_for(b, p->name);
    if (id < 0) return reply_error(b, r, m->request_id, DFLASH_EFULL, "too many pools");
    uint32_t batches[WIRE_MAX_BUCKETS];
    for (uint32_t i = 0; i < w->n_buckets; i++) batches[i] = (uint32_t)w->bucket_batches[i];
    if (w->n_buckets > LEDGER_MAX_BUCKETS)
        return reply_error(b, r, m->request_id, DFLASH_ERANGE, "too many buckets");
    int rc = ledger_set_plan(b->ledger, w->n_buckets, batches);
    if (rc)
        return reply_error(b, r, m->request_id, rc,
                           "batch plan differs from the journal's (another dataset?)");
    if (!b->policy) {
        if ((rc = policy_create(b, w->n_buckets, w->bucket_upper, w->bucket_share)))
            return reply_error(b, r, m->request_id, rc, "bucket policy refused the buckets");
    } else if (w->n_buckets != b->n_buckets) {
        return reply_error(b, r, m->request_id, DFLASH_EMISMATCH, "%u buckets, broker has %u",
                           w->n_buckets, b->n_buckets);
    }
    pool_desc *d = &b->pools[id];
    rc = policy_pool_add(b->policy, (uint32_t)id, w->pool_incarnation, w->slot_count, w->slot_size);
    if (rc == DFLASH_EEXISTS) {
        p->pool_id = id;
        return reply_ok(b, r, m->request_id, (uint64_t)id);
    }
    if (rc) return reply_error(b, r, m->request_id, rc, "pool refused");
    uint64_t fence_until = now_ms(b) + (uint64_t)b->cfg.lease_timeout_ms;
    uint32_t fenced = 0;
    for (uint32_t s = 0; s < w->slot_count; s++)
        if (wire_pool_is_busy(w, s) &&
            policy_slot_fence(b->policy, (uint32_t)id, s, fence_until) == 0)
            fenced++;
    if (fenced)
        LOG_INFO("pool %d of %s: %u busy slots fenced for %lld ms (a drafter may still copy them)",
                 id, p->name, fenced, (long long)b->cfg.lease_timeout_ms);
    free(d->events);
    d->events = NULL;
    free(d->n_seqs);
    d->n_seqs = calloc(w->slot_count, sizeof *d->n_seqs);
    if (!d->n_seqs) {
        policy_pool_drop(b->policy, (uint32_t)id);
        return reply_error(b, r, m->request_id, DFLASH_ENOMEM, "no memory");
    }
    d->desc = *w;
    d->desc.event_handles = NULL;
    if (w->n_events) {
        d->events = malloc((size_t)w->n_events * WIRE_HANDLE_BYTES);
        if (!d->events) {
            policy_pool_drop(b->policy, (uint32_t)id);
            return reply_error(b, r, m->request_id, DFLASH_ENOMEM, "no memory");
        }
        memcpy(d->events, w->event_handles, (size_t)w->n_events * WIRE_HANDLE_BYTES);
        d->desc.event_handles = (const uint8_t(*)[WIRE_HANDLE_BYTES])d->events;
    }
    d->registered = true;
    p->pool_id = id;
    memcpy(b->target_share, w->bucket_share, w->n_buckets * sizeof *w->bucket_share);
    if (!b->cfg.shares[0]) policy_set_shares(b->policy, w->n_buckets, w->bucket_share);
    b->epochs = b->cfg.max_epochs ? (uint32_t)b->cfg.max_epochs : w->epochs;
    LOG_INFO("pool %d of %s: incarnation %016" PRIx64 ", %u slots of %" PRIu64 " bytes, %s", id,
             p->name, w->pool_incarnation, w->slot_count, w->slot_size,
             w->backend == WIRE_BACKEND_CUDA ? "cuda" : w->shm_name);
    warn_reservoir(b);
    reply_ok(b, r, m->request_id, (uint64_t)id);
}

/* True when asking the ledger for work would open an epoch beyond the target's plan: no to-do
 * left in any opened epoch and all planned epochs opened. */
static bool epochs_done(broker *b)
{
    if (!b->epochs) return false;
    ledger_stats ls;
    ledger_get_stats(b->ledger, &ls);
    return ls.todo == 0 && ls.epochs_opened >= b->epochs;
}

static pool_desc *peer_pool(broker *b, peer *p, uint64_t incarnation)
{
    if (p->role != WIRE_ROLE_TARGET || p->pool_id < 0 || !b->policy) return NULL;
    pool_desc *d = &b->pools[p->pool_id];
    if (!d->registered || d->desc.pool_incarnation != incarnation) return NULL;
    return d;
}

static void on_work_request(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    if (!peer_pool(b, p, m->u.pool_incarnation))
        return reply_error(b, r, m->request_id, DFLASH_ESTALE, "unknown pool: register it");
    policy_mode mode = policy_get_mode(b->policy);
    if (mode == POLICY_DRAINING)
        return reply_error(b, r, m->request_id, DFLASH_ESHUTDOWN, "draining");
    if (mode == POLICY_PAUSED) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "paused");
    uint32_t mask = epochs_done(b) ? 0 : ledger_todo_mask(b->ledger);
    policy_set_flush(b->policy, mask == 0);
    if (!mask) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "nothing to do now");
    uint32_t bucket, slot;
    int rc = policy_next_bucket(b->policy, (uint32_t)p->pool_id, mask, &bucket);
    if (rc == DFLASH_EFULL) return reply_error(b, r, m->request_id, rc, "max_depth reached");
    if (rc == DFLASH_ESTATE) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "not running");
    if (rc == DFLASH_ENOTFOUND) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "no work");
    if (rc) return reply_error(b, r, m->request_id, rc, "work request refused");
    batch_id id;
    if ((rc = ledger_next_todo(b->ledger, bucket, &id)))
        return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "no batch: %s", err_str(rc));
    if ((rc = policy_work_start(b->policy, (uint32_t)p->pool_id, &id, &slot))) {
        ledger_requeue(b->ledger, &id);
        return reply_error(b, r, m->request_id, rc, "no free slot");
    }
    reply_init(b, r, WIRE_WORK_UNIT, m->request_id);
    r->u.work.unit = to_unit(&id);
    r->u.work.slot = slot;
}

static void on_slot_ready(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_slot_ready *s = &m->u.ready;
    pool_desc *d = peer_pool(b, p, s->pool_incarnation);
    if (!d) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "unknown pool: register it");
    if (s->slot >= d->desc.slot_count || s->unit.bucket >= b->n_buckets)
        return reply_error(b, r, m->request_id, DFLASH_ERANGE, "slot or bucket out of range");
    batch_id id = to_batch(&s->unit);
    slot_state st;
    int rc = policy_slot_get(b->policy, (uint32_t)p->pool_id, s->slot, &st, NULL);
    if (rc == 0 && st == SLOT_FENCED) /* checked before adopting: the batch stays orphaned */
        return reply_error(b, r, m->request_id, DFLASH_ESTATE, "slot %u is fenced after a "
                           "broker restart: drop it", s->slot);
    bool adopted = false;
    if (!policy_is_filling(b->policy, (uint32_t)p->pool_id, &id)) {
        /* Filled for a previous broker incarnation: adopt it if nobody else has it. */
        if ((rc = in_epochs(b, &id) ? ledger_adopt(b->ledger, &id) : DFLASH_ERANGE))
            return reply_error(b, r, m->request_id, rc, "batch not adoptable: drop the slot");
        adopted = true;
    }
    rc = policy_slot_ready(b->policy, (uint32_t)p->pool_id, s->pool_incarnation, s->slot, &id,
                           s->n_tokens);
    if (rc) {
        if (adopted) ledger_requeue(b->ledger, &id); /* no slot holds it: back to to-do */
        return reply_error(b, r, m->request_id, rc, "slot ready refused");
    }
    d->n_seqs[s->slot] = s->n_seqs;
    reply_ok(b, r, m->request_id, 0);
    wire_msg a;
    reply_init(b, &a, WIRE_SLOT_READY, 0);
    a.u.ready = *s;
    publish(b, "ready", &a);
}

/* True when draining and nothing is left to hand out: no slot filling, ready or leased, or no
 * pool at all (a broker restarted after its targets exited at a drain knows none, and no target
 * will register and produce while it drains). Claims are then answered SHUTDOWN. */
static bool drained(const broker *b)
{
    if (b->pending_mode != POLICY_DRAINING) return false;
    return !b->policy || policy_drained(b->policy);
}

/* What the importer needs to map the granted slot. */
static void fill_grant(broker *b, const policy_grant *g, wire_grant *w)
{
    const pool_desc *d = &b->pools[g->where.pool_id];
    memset(w, 0, sizeof *w);
    uint64_t now = now_ms(b);
    w->lease_id = g->lease_id;
    w->deadline_ms = g->deadline_ms > now ? g->deadline_ms - now : 0;
    w->pool_incarnation = g->where.incarnation;
    w->slot = g->where.slot;
    w->offset = (uint64_t)g->where.slot * d->desc.slot_size;
    w->size = d->desc.slot_size;
    w->layout_version = d->desc.layout_version;
    w->unit = to_unit(&g->where.batch);
    w->n_tokens = g->where.n_tokens;
    w->n_seqs = d->n_seqs && g->where.slot < d->desc.slot_count ? d->n_seqs[g->where.slot] : 1;
    if (!w->n_seqs) w->n_seqs = 1;
    w->backend = d->desc.backend;
    memcpy(w->mem_handle, d->desc.mem_handle, WIRE_HANDLE_BYTES);
    if (d->events && g->where.slot < d->desc.n_events)
        memcpy(w->event_handle, d->events[g->where.slot], WIRE_HANDLE_BYTES);
    w->device = d->desc.device;
    memcpy(w->shm_name, d->desc.shm_name, sizeof w->shm_name);
    memcpy(w->pool_name, d->owner, sizeof w->pool_name);
    if (!w->size) w->size = 1;
}

static void on_claim(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    if (p->role != WIRE_ROLE_DRAFTER)
        return reply_error(b, r, m->request_id, DFLASH_EDENIED, "only a drafter claims");
    if (group_of_peer(b->groups, p->incarnation))
        return reply_error(b, r, m->request_id, DFLASH_EDENIED,
                           "a group member claims whole steps (StepClaim), not single slots");
    if (drained(b)) return reply_error(b, r, m->request_id, DFLASH_ESHUTDOWN, "drained");
    if (!b->policy) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "no pool yet");
    policy_grant g;
    int rc = policy_claim(b->policy, p->incarnation, now_ms(b), &g);
    if (rc == DFLASH_EAGAIN || rc == DFLASH_ESTATE)
        return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "nothing eligible");
    if (rc) return reply_error(b, r, m->request_id, rc, "claim refused");
    reply_init(b, r, WIRE_GRANT, m->request_id);
    fill_grant(b, &g, &r->u.grant);
    /* Safety net: a redelivered batch is no longer held by whoever had it before. (A batch
     * enters a held list only at release, which ends its lease, so a first delivery is in no
     * held list; skipping the scan keeps a grant O(1) in the number of held batches.) */
    if (g.deliveries > 1)
        for (uint32_t i = 0; i < b->n_peers; i++) held_remove(b->peers[i], &g.where.batch);
}

/* True when p released lease_id recently and still holds its batch: a retry whose first reply
 * was lost (the release is done; Stale would make the drafter drop a batch it holds). */
static bool released_before(const peer *p, uint64_t lease_id)
{
    uint32_t n = p->n_released < PEER_RECENT_RELEASES ? p->n_released : PEER_RECENT_RELEASES;
    for (uint32_t i = 0; i < n; i++) {
        if (p->released[i].lease_id != lease_id) continue;
        for (uint32_t k = 0; k < p->n_held; k++)
            if (same_batch(&p->held[k], &p->released[i].batch)) return true;
    }
    return false;
}

static void on_release(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    if (!b->policy) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "unknown lease");
    if (released_before(p, m->u.lease_id)) return reply_ok(b, r, m->request_id, 0);
    policy_slot_ref where;
    int rc = policy_release(b->policy, m->u.lease_id, &where);
    if (rc) return reply_error(b, r, m->request_id, rc, "lease %" PRIu64 " unknown or expired",
                               m->u.lease_id);
    if (m->u.release_unread) {
        /* The drafter could not read the slot: nobody holds the batch; the slot is FREE (the
         * target rewrites it) and the batch is produced again. Not the batch's failure: the
         * slot is unreadable to this drafter, e.g. its pool cannot be mapped. (A group step's
         * slot stays unreleased: the step cannot be acked with it, and its abort finds nothing
         * more to give back.) */
        LOG_WARN("%s could not read slot %u of pool %u: batch %u/%u/%u back to to-do", p->name,
                 where.slot, where.pool_id, where.batch.epoch, where.batch.bucket,
                 where.batch.index);
        ledger_requeue(b->ledger, &where.batch);
        return reply_ok(b, r, m->request_id, 0);
    }
    if (p->role == WIRE_ROLE_DRAFTER) {
        held_add(p, &where.batch);
        uint32_t k = p->n_released++ % PEER_RECENT_RELEASES;
        p->released[k].lease_id = m->u.lease_id;
        p->released[k].batch = where.batch;
    }
    group_slot *gs = group_slot_of_lease(b->groups, m->u.lease_id);
    if (gs) gs->released = true;
    reply_ok(b, r, m->request_id, 0);
}

static void on_ack(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    batch_id id = to_batch(&m->u.ack.unit);
    int rc = ledger_ack(b->ledger, &id, m->u.ack.step);
    held_remove(p, &id);
    if (rc == DFLASH_EEXISTS) {
        b->double_acks++;
        return reply_error(b, r, m->request_id, rc, "batch already trained");
    }
    if (rc) return reply_error(b, r, m->request_id, rc, "ack refused");
    b->acks++;
    reply_ok(b, r, m->request_id, 0);
}

static void on_commit(broker *b, const wire_msg *m, wire_msg *r)
{
    int64_t n = ledger_commit(b->ledger, m->u.step);
    if (n < 0) return reply_error(b, r, m->request_id, (int)n, "commit failed");
    reply_ok(b, r, m->request_id, (uint64_t)n);
}

/* One broker serves one model: a second live solo trainer's rewind would return the batches the
 * first trained after the step to to-do (the ledger's steps are not per drafter). Said, not
 * refused: a restarted trainer under a new name (a container's new pid) meets its predecessor
 * here until the broker expires it. */
static void warn_other_trainers(broker *b, const peer *p, uint64_t step)
{
    for (uint32_t i = 0; i < b->n_peers; i++) {
        const peer *q = b->peers[i];
        if (q == p || !q->trains || q->state != PEER_LIVE) continue;
        LOG_WARN("drafter %s resumes from step %" PRIu64 " while drafter %s also trains on this "
                 "broker: the batches %s trained after that step go back to to-do. One broker "
                 "serves one model; to train it on several GPUs give every drafter --group G",
                 p->name, step, q->name, q->name);
    }
}

static void on_resume_from(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    if (p) {
        warn_other_trainers(b, p, m->u.step);
        p->trains = true;
    }
    int64_t n = ledger_rewind(b->ledger, m->u.step);
    if (n == DFLASH_ESTATE)
        return reply_error(b, r, m->request_id, (int)n, "step %" PRIu64 " is older than a "
                           "finished epoch's last batch: resume from a later checkpoint (a "
                           "new run starts the broker on a new --journal)",
                           m->u.step);
    if (n < 0) return reply_error(b, r, m->request_id, (int)n, "rewind failed");
    LOG_INFO("drafter resumes from step %" PRIu64 ": %" PRId64 " batches back to to-do",
             m->u.step, n);
    reply_ok(b, r, m->request_id, (uint64_t)n);
}

/* --- groups: data-parallel drafters (group.h; docs/protocol.md "Groups") -------------------- */

static void held_remove_all(broker *b, const batch_id *id)
{
    for (uint32_t i = 0; i < b->n_peers; i++) held_remove(b->peers[i], id);
}

/* True when id is a released unit of a step in flight: the step owns it until it is resolved
 * (a dead member's copy may be in the model the group continues with). */
static bool group_step_owns(broker *b, const batch_id *id)
{
    for (uint32_t i = 0; i < group_count(b->groups); i++) {
        const group *g = group_at(b->groups, i);
        if (!g->step_active) continue;
        for (uint32_t r = 0; r < g->step_world; r++)
            if (g->slots[r].released && same_batch(&g->slots[r].batch, id)) return true;
    }
    return false;
}

/* Carries out what a group call decided (group.h, group_outcome): ACK records every unit of the
 * step as trained at the step (once for the whole group), ABORT gives unreleased leases back
 * (READY again) and returns released units to to-do. Returns the units recorded as trained. */
static uint32_t apply_outcome(broker *b, const char *name, const group_outcome *o)
{
    if (o->verdict == GROUP_KEEP) return 0;
    uint32_t n = 0;
    for (uint32_t r = 0; r < o->n_slots; r++) {
        const group_slot *s = &o->slots[r];
        bool revoked = b->policy && policy_lease_revoke(b->policy, s->lease_id) == 0;
        if (o->verdict == GROUP_ACK && s->released) {
            int rc = ledger_ack(b->ledger, &s->batch, o->step);
            if (rc == DFLASH_EEXISTS) {
                b->double_acks++;
                LOG_WARN("group %s: batch %u/%u/%u of step %" PRIu64 " was already trained: "
                         "not recorded twice", name, s->batch.epoch, s->batch.bucket,
                         s->batch.index, o->step);
            } else if (rc == 0) {
                n++;
            }
            if (rc && rc != DFLASH_EEXISTS)
                LOG_WARN("group %s: ack of %u/%u/%u at step %" PRIu64 ": %s", name,
                         s->batch.epoch, s->batch.bucket, s->batch.index, o->step, err_str(rc));
        } else if (o->verdict == GROUP_ACK) {
            /* the rank never released its slot, so it cannot have trained it */
            LOG_WARN("group %s: step %" PRIu64 " acked but rank %u never copied its slot: batch "
                     "%u/%u/%u not recorded", name, o->step, r, s->batch.epoch, s->batch.bucket,
                     s->batch.index);
            if (!revoked) ledger_requeue(b->ledger, &s->batch);
        } else if (!revoked && s->released) {
            ledger_requeue(b->ledger, &s->batch);
        }
        held_remove_all(b, &s->batch);
    }
    b->acks += n;
    if (o->verdict == GROUP_ACK)
        LOG_INFO("group %s: step %" PRIu64 " done: %u batches trained", name, o->step, n);
    else
        LOG_INFO("group %s: step %" PRIu64 " aborted: its %u batches go back to to-do", name,
                 o->step, o->n_slots);
    return n;
}

static void log_epoch(const group *g)
{
    char ranks[512] = "";
    size_t off = 0;
    for (uint32_t i = 0; i < g->n_members && off < sizeof ranks; i++)
        if (g->members[i].admitted)
            off += (size_t)snprintf(ranks + off, sizeof ranks - off, "%s%u=%s", off ? " " : "",
                                    g->members[i].rank, g->members[i].name);
    LOG_INFO("group %s: epoch %" PRIu64 ", world %u, next step %" PRIu64 ": %s", g->name,
             g->epoch, g->world, g->base_step + 1, ranks);
}

/* A drafter left (expired, replaced or said goodbye): its group re-forms. */
static void groups_peer_gone(broker *b, peer *p)
{
    group *g = group_of_peer(b->groups, p->incarnation);
    if (!g) return;
    char name[GROUP_MAX_NAME];
    snprintf(name, sizeof name, "%s", g->name);
    group_outcome o;
    group_leave(b->groups, p->incarnation, &o);
    LOG_INFO("group %s: %s left", name, p->name);
    apply_outcome(b, name, &o);
    if (o.new_epoch && (g = group_find(b->groups, name))) log_epoch(g);
}

static void reply_view(broker *b, const group *g, const group_entry *e, uint64_t rid, wire_msg *r)
{
    reply_init(b, r, WIRE_GROUP_VIEW, rid);
    wire_group_view *v = &r->u.view;
    snprintf(v->group, sizeof v->group, "%s", g->name);
    v->epoch = g->epoch;
    v->rank = e->rank;
    v->world = g->world;
    v->step = g->base_step;
    v->id_len = g->id_len;
    memcpy(v->id, g->id, g->id_len);
}

static void on_group_join(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_join *j = &m->u.join;
    if (p->role != WIRE_ROLE_DRAFTER)
        return reply_error(b, r, m->request_id, DFLASH_EDENIED, "only a drafter joins a group");
    group *g;
    group_outcome o;
    /* A step of R ranks needs min_ready + R - 1 ready slots (depth_check) */
    int64_t max_world = b->cfg.max_depth - (b->cfg.min_ready ? b->cfg.min_ready - 1 : 0);
    int rc = group_join(b->groups, j->group, p->incarnation, p->name, j->step, j->failed_epoch,
                        (uint32_t)max_world, &g, &o);
    if (rc == DFLASH_EFULL) {
        const group *cur = group_find(b->groups, j->group);
        return reply_error(b, r, m->request_id, rc,
                           "group %s would have %u ranks but max-depth is %lld and min-ready "
                           "%lld: one step needs min-ready - 1 + one slot per rank (raise "
                           "max-depth or lower min-ready first)",
                           j->group, (cur ? cur->n_members : 0) + 1,
                           (long long)b->cfg.max_depth, (long long)b->cfg.min_ready);
    }
    if (rc == DFLASH_EEXISTS)
        return reply_error(b, r, m->request_id, rc, "%s is in another group", p->name);
    if (rc) return reply_error(b, r, m->request_id, rc, "join refused");
    if (o.created) {
        int64_t n = ledger_rewind(b->ledger, j->step);
        if (n < 0)
            LOG_WARN("group %s created by %s at step %" PRIu64 ": rewind refused (%s)", j->group,
                     p->name, j->step, err_str((int)n));
        else
            LOG_INFO("group %s created by %s at step %" PRIu64 ": %" PRId64 " batches trained "
                     "after it back to to-do", j->group, p->name, j->step, n);
    }
    apply_outcome(b, j->group, &o);
    if (o.new_epoch) log_epoch(g);
    const group_entry *e = group_entry_of(g, p->incarnation);
    if (e && e->admitted && g->state != GROUP_REFORMING) return reply_view(b, g, e, m->request_id, r);
    if (g->state == GROUP_REFORMING)
        return reply_error(b, r, m->request_id, DFLASH_EAGAIN,
                           "group %s is re-forming: waiting for its first rank to finish or "
                           "abandon step %" PRIu64, g->name, g->step);
    return reply_error(b, r, m->request_id, DFLASH_EAGAIN,
                       "waiting for step %" PRIu64 " of group %s to finish", g->step, g->name);
}

static void on_group_set_id(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_set_id *s = &m->u.set_id;
    group *g = group_find(b->groups, s->group);
    if (!g) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "no group %s: join", s->group);
    int rc = group_set_id(g, p->incarnation, s->epoch, s->id, s->id_len);
    if (rc == DFLASH_ESTALE)
        return reply_error(b, r, m->request_id, rc, "epoch %llu of group %s is over (now %llu): "
                           "re-form", (unsigned long long)s->epoch, g->name,
                           (unsigned long long)g->epoch);
    if (rc) return reply_error(b, r, m->request_id, rc, "only rank 0 sets the id, once");
    reply_ok(b, r, m->request_id, 0);
}

static void on_step_claim(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_step *c = &m->u.gstep;
    group *g = group_find(b->groups, c->group);
    if (!g) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "no group %s: join", c->group);
    group_slot *mine;
    int rc = group_step_check(g, p->incarnation, c->epoch, c->step, &mine);
    if (rc == DFLASH_ESTALE)
        return reply_error(b, r, m->request_id, rc, "epoch %llu of group %s is over: re-form",
                           (unsigned long long)c->epoch, g->name);
    if (rc == DFLASH_EAGAIN)
        return reply_error(b, r, m->request_id, rc, "group %s: waiting for %s", g->name,
                           g->step_active ? "rank 0's StepDone" : "rank 0's id");
    if (rc == DFLASH_ESTATE)
        return reply_error(b, r, m->request_id, rc, "group %s: the next step is %llu, not %llu",
                           g->name, (unsigned long long)(g->step_active ? g->step : g->base_step + 1),
                           (unsigned long long)c->step);
    if (rc) return reply_error(b, r, m->request_id, rc, "step claim refused");
    if (!mine) { /* reserve the whole step: one slot per rank, all or nothing */
        if (drained(b)) return reply_error(b, r, m->request_id, DFLASH_ESHUTDOWN, "drained");
        if (!b->policy) return reply_error(b, r, m->request_id, DFLASH_EAGAIN, "no pool yet");
        if (policy_claimable(b->policy) < g->world)
            return reply_error(b, r, m->request_id, DFLASH_EAGAIN,
                               "fewer than %u slots eligible for a step", g->world);
        group_slot slots[GROUP_MAX_WORLD];
        uint64_t now = now_ms(b), taken[GROUP_MAX_WORLD];
        uint32_t n_taken = 0;
        for (uint32_t i = 0; i < g->n_members; i++) {
            const group_entry *e = &g->members[i];
            if (!e->admitted) continue;
            policy_grant pg;
            rc = policy_claim(b->policy, e->peer, now, &pg); /* policy_claimable said it would */
            if (rc) { /* only out of memory: give back what was taken, reserve nothing */
                while (n_taken) policy_lease_revoke(b->policy, taken[--n_taken]);
                return reply_error(b, r, m->request_id, rc, "step reservation failed");
            }
            taken[n_taken++] = pg.lease_id;
            slots[e->rank] = (group_slot){.peer = e->peer, .lease_id = pg.lease_id,
                                          .batch = pg.where.batch, .pool_id = pg.where.pool_id,
                                          .slot = pg.where.slot, .n_tokens = pg.where.n_tokens,
                                          .pool_incarnation = pg.where.incarnation};
            if (pg.deliveries > 1) held_remove_all(b, &pg.where.batch);
        }
        group_step_begin(g, c->step, slots);
        rc = group_step_check(g, p->incarnation, c->epoch, c->step, &mine);
        assert(rc == 0 && mine);
    }
    reply_init(b, r, WIRE_STEP_GRANT, m->request_id);
    wire_step_grant *w = &r->u.sgrant;
    w->epoch = g->step_epoch;
    w->step = g->step;
    w->world = g->step_world;
    w->rank = (uint32_t)(mine - g->slots);
    w->n_units = g->step_world;
    for (uint32_t k = 0; k < g->step_world; k++) w->units[k] = to_unit(&g->slots[k].batch);
    policy_grant pg = {.lease_id = mine->lease_id, .worker_id = mine->peer,
                       .deadline_ms = now_ms(b) + (uint64_t)b->cfg.lease_timeout_ms,
                       .where = {.pool_id = mine->pool_id, .incarnation = mine->pool_incarnation,
                                 .slot = mine->slot, .batch = mine->batch,
                                 .n_tokens = mine->n_tokens}};
    fill_grant(b, &pg, &w->grant);
}

static void on_step_done(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    const wire_group_step *d = &m->u.gstep;
    group *g = group_find(b->groups, d->group);
    if (!g) return reply_error(b, r, m->request_id, DFLASH_ESTALE, "no group %s", d->group);
    group_outcome o;
    int rc = group_step_done(b->groups, g, p->incarnation, d->epoch, d->step, &o);
    if (rc == DFLASH_EDENIED)
        return reply_error(b, r, m->request_id, rc, "only rank 0 reports a step done");
    if (rc)
        return reply_error(b, r, m->request_id, rc, "step %llu of epoch %llu was aborted or is "
                           "unknown: re-form", (unsigned long long)d->step,
                           (unsigned long long)d->epoch);
    uint32_t n = apply_outcome(b, g->name, &o);
    if (o.new_epoch) log_epoch(g);
    reply_ok(b, r, m->request_id, n);
}

static void on_group_leave(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    group *g = group_of_peer(b->groups, p->incarnation);
    if (!g || strcmp(g->name, m->u.gstep.group) != 0)
        return reply_ok(b, r, m->request_id, 0);
    groups_peer_gone(b, p);
    reply_ok(b, r, m->request_id, 1);
}

void broker_status(broker *b, wire_status *s)
{
    memset(s, 0, sizeof *s);
    uint64_t now = now_ms(b);
    s->uptime_ms = now - b->start_ms;
    s->min_ready = (uint32_t)b->cfg.min_ready;
    s->max_depth = (uint32_t)b->cfg.max_depth;
    s->lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
    s->state = (uint32_t)b->pending_mode;
    s->claims_per_s = b->claims_per_s;
    s->malformed = b->malformed;
    s->acks = b->acks;
    const char *jf = b->ledger ? ledger_journal_failure(b->ledger) : NULL;
    if (jf) snprintf(s->journal_error, sizeof s->journal_error, "%s: %s", b->cfg.journal, jf);
    uint32_t live = 0;
    for (uint32_t i = 0; i < b->n_peers; i++) live += b->peers[i]->state == PEER_LIVE;
    s->peers = live;
    ledger_stats ls;
    ledger_get_stats(b->ledger, &ls);
    s->batches_todo = ls.todo;
    s->batches_inflight = ls.in_flight;
    s->batches_trained = ls.trained;
    s->batches_committed = ls.committed;
    s->quarantined = ls.quarantined;
    s->committed_step = ls.last_commit_step;
    s->epoch = ls.open_epoch;
    for (uint32_t i = 0; i < ls.n_buckets; i++) s->batches_total += ls.batches_per_bucket[i];
    for (int i = 0; i < MAX_POOLS; i++)
        if (b->pools[i].registered) {
            s->pool_incarnation = b->pools[i].desc.pool_incarnation;
            s->slot_count += b->pools[i].desc.slot_count;
        }
    for (uint32_t i = 0; i < group_count(b->groups) && s->n_groups < WIRE_MAX_GROUPS; i++) {
        const group *g = group_at(b->groups, i);
        wire_group_stat *o = &s->groups[s->n_groups++];
        snprintf(o->name, sizeof o->name, "%s", g->name);
        o->epoch = g->epoch;
        o->world = g->world;
        o->step = g->step_active ? g->step : g->base_step + 1;
        o->state = g->state == GROUP_FORMING  ? WIRE_GROUP_FORMING
                   : g->state == GROUP_ACTIVE ? WIRE_GROUP_ACTIVE
                                              : WIRE_GROUP_REFORMING;
        o->step_reserved = g->step_active;
        o->steps_done = g->steps_done;
        o->steps_aborted = g->steps_aborted;
        for (uint32_t k = 0; k < g->n_members; k++) {
            if (!g->members[k].admitted) o->pending++;
            else if (o->n_members < WIRE_MAX_STATUS_MEMBERS)
                snprintf(o->members[o->n_members++], WIRE_MAX_NAME, "%s", g->members[k].name);
        }
    }
    if (!b->policy) return;
    policy_stats ps;
    policy_get_stats(b->policy, &ps);
    s->state = (uint32_t)ps.mode;
    s->tv_distance = ps.mix_tv;
    s->grants = ps.claims;
    s->releases = ps.releases;
    s->lease_expiries = ps.lease_expiries;
    s->redeliveries = ps.redeliveries;
    s->n_buckets = ps.n_buckets < WIRE_MAX_BUCKETS ? ps.n_buckets : WIRE_MAX_BUCKETS;
    for (uint32_t i = 0; i < s->n_buckets; i++) {
        const policy_bucket_stats *pb = &ps.bucket[i];
        wire_bucket_stat *o = &s->buckets[i];
        o->upper = pb->bucket_max_len;
        o->share = pb->share;
        o->ready = pb->ready;
        o->leased = pb->leased;
        o->filling = pb->filling;
        o->deficit = pb->deficit;
        o->produced = pb->produced_batches;
        o->consumed = pb->consumed_batches;
        o->produced_tokens = pb->produced_tokens;
        o->consumed_tokens = pb->consumed_tokens;
    }
}

/* Applies cfg's live values to the policy and the log; the shares (which restart the mix
 * accounting) only when shares_changed: cfg.shares, or the target's when it is empty. */
static int apply_live(broker *b, const queue_config *c, bool shares_changed)
{
    log_level lvl;
    if (strcmp(c->log_level, b->cfg_applied_log) != 0 && log_level_parse(c->log_level, &lvl) == 0) {
        log_set_level(lvl);
        snprintf(b->cfg_applied_log, sizeof b->cfg_applied_log, "%s", c->log_level);
    }
    if (!b->policy) return 0;
    policy_set_min_ready(b->policy, (uint32_t)c->min_ready);
    policy_set_max_depth(b->policy, (uint32_t)c->max_depth);
    policy_set_lease_timeout(b->policy, (uint32_t)c->lease_timeout_ms);
    policy_set_max_redeliveries(b->policy, (uint32_t)c->max_redeliveries);
    double sh[WIRE_MAX_BUCKETS];
    if (!shares_changed) return 0;
    if (!c->shares[0]) policy_set_shares(b->policy, b->n_buckets, b->target_share);
    else if (parse_shares(c->shares, b->n_buckets, sh) == 0)
        policy_set_shares(b->policy, b->n_buckets, sh);
    return 0;
}

/* Whether next's live values may run together on b (log level, shares, depth against the
 * largest group and the reservoir). 0 or a code with the reason in err (may be NULL). */
static int live_check(broker *b, const queue_config *next, char *err, size_t err_len)
{
    log_level lvl;
    if (log_level_parse(next->log_level, &lvl)) {
        if (err) snprintf(err, err_len, "log-level: '%s' unknown", next->log_level);
        return DFLASH_EINVAL;
    }
    if (next->shares[0]) {
        double sh[WIRE_MAX_BUCKETS];
        uint32_t n = b->policy ? b->n_buckets : 0;
        double sum = 0;
        int rc = parse_shares(next->shares, n, sh);
        for (uint32_t i = 0; i < n && !rc; i++) sum += sh[i];
        if (rc || (n && sum <= 0)) {
            if (err && n)
                snprintf(err, err_len, "shares: need %u finite non-negative numbers, not all 0",
                         n);
            else if (err)
                snprintf(err, err_len, "shares: need finite non-negative numbers, comma separated");
            return DFLASH_EINVAL;
        }
    }
    uint32_t largest = group_largest(b->groups);
    if (next->max_depth < (int64_t)largest) {
        if (err)
            snprintf(err, err_len, "max-depth %lld is smaller than one step of the largest "
                     "drafter group (%u ranks, one slot each): its steps could never be "
                     "reserved", (long long)next->max_depth, largest);
        return DFLASH_ERANGE;
    }
    return depth_check(next, largest, err, err_len);
}

/* Journals the runtime steering (mode, live values that differ from the configured ones) as
 * the ledger's settings record (fsynced; the reply waits for it: "Journal and replies"); a
 * restarted broker restores it (restore_steering). Returns 0, or a code with why (may be NULL)
 * telling the operator the change is in force but a restart would not keep it.
 * steering_payload: that payload in buf; its length or DFLASH_ENOMEM. */
static int steering_payload(broker *b, uint8_t *buf, size_t cap)
{
    steering_state st;
    steering_capture(&queue_table, &b->configured, &b->cfg, b->pending_mode, &st);
    return steering_encode(&st, buf, cap);
}

static int journal_steering(broker *b, char *why, size_t why_len)
{
    static uint8_t buf[STEERING_PAYLOAD_MAX]; /* loop thread only */
    int n = steering_payload(b, buf, sizeof buf);
    int rc = n < 0 ? n : ledger_set_settings(b->ledger, buf, (uint32_t)n);
    if (!rc) return 0;
    const char *jf = ledger_journal_failure(b->ledger);
    char msg[400];
    snprintf(msg, sizeof msg, "in force, but the journal did not take it (%s): a broker restart "
             "would forget it until the journal heals (dflash-ctl status)",
             jf ? jf : err_str(rc));
    LOG_WARN("runtime settings %s", msg);
    if (why) snprintf(why, why_len, "%s", msg);
    return rc;
}

int broker_set(broker *b, const wire_settings *set, char *err, size_t err_len)
{
    queue_config next = b->cfg;
    for (uint32_t i = 0; i < set->n; i++) {
        int rc = config_set(&queue_table, &next, set->kv[i].key, set->kv[i].value, true, err,
                            err_len);
        if (rc == DFLASH_ENOTFOUND && err) snprintf(err, err_len, "%s: no such option", set->kv[i].key);
        if (rc == DFLASH_EDENIED && err)
            snprintf(err, err_len, "%s: not live (restart with the new value)", set->kv[i].key);
        if (rc) return rc;
    }
    int rc = live_check(b, &next, err, err_len);
    if (rc) return rc;
    bool shares_changed = strcmp(next.shares, b->cfg.shares) != 0;
    b->cfg = next;
    apply_live(b, &b->cfg, shares_changed);
    warn_reservoir(b);
    for (uint32_t i = 0; i < set->n; i++)
        LOG_INFO("set %s = %s", set->kv[i].key, set->kv[i].value);
    return journal_steering(b, err, err_len);
}

static void on_set(broker *b, const wire_msg *m, wire_msg *r)
{
    char err[400] = "";
    int rc = broker_set(b, &m->u.settings, err, sizeof err);
    if (rc && rc != DFLASH_EIO) return reply_error(b, r, m->request_id, rc, "%s", err);
    reply_init(b, r, WIRE_SET_CONFIG_REPLY, m->request_id);
    r->u.settings.n = m->u.settings.n;
    for (uint32_t i = 0; i < m->u.settings.n; i++) {
        wire_kv *kv = &r->u.settings.kv[i];
        snprintf(kv->key, sizeof kv->key, "%s", m->u.settings.kv[i].key);
        config_get(&queue_table, &b->cfg, kv->key, kv->value, sizeof kv->value);
    }
    publish(b, "config", r);
    if (rc) reply_error(b, r, m->request_id, rc, "%s", err); /* in force, not durable */
}

static void on_mode(broker *b, const wire_msg *m, wire_msg *r, policy_mode mode)
{
    b->pending_mode = mode;
    if (b->policy) {
        int rc = policy_set_mode(b->policy, mode);
        if (rc) return reply_error(b, r, m->request_id, rc, "mode change refused");
    }
    LOG_INFO("mode: %s", policy_mode_name(mode));
    char why[400];
    if (journal_steering(b, why, sizeof why))
        reply_error(b, r, m->request_id, DFLASH_EIO, "%s", why);
    else
        reply_ok(b, r, m->request_id, 0);
    wire_msg a;
    reply_init(b, &a, WIRE_SET_CONFIG_REPLY, 0);
    a.u.settings.n = 1;
    snprintf(a.u.settings.kv[0].key, WIRE_MAX_KEY, "mode");
    snprintf(a.u.settings.kv[0].value, WIRE_MAX_VALUE, "%s", policy_mode_name(mode));
    publish(b, "config", &a);
}

/* --- dispatch ------------------------------------------------------------------------------- */

static bool needs_hello(wire_type t)
{
    return t != WIRE_HELLO && t != WIRE_HEARTBEAT && t != WIRE_STATUS_REQUEST &&
           t != WIRE_SET_CONFIG && t != WIRE_PAUSE && t != WIRE_RESUME && t != WIRE_DRAIN;
}

static bool is_steering(wire_type t)
{
    return t == WIRE_SET_CONFIG || t == WIRE_PAUSE || t == WIRE_RESUME || t == WIRE_DRAIN;
}

/* A request that came in over CURVE may steer only with an admin key; one over ipc:// (no
 * User-Id: the 0700 runtime dir is its access control) or from broker_dispatch's direct callers
 * may. */
static bool may_steer(const broker *b)
{
    return !b->curve_on || !b->dispatch_user[0] || curve_keyset_has(&b->admin_keys, b->dispatch_user);
}

int broker_dispatch(broker *b, const uint8_t *rid, size_t rid_len, const uint8_t *msg,
                    size_t len, uint8_t *out, size_t cap)
{
    static wire_msg m, r; /* loop thread only; large, so not on the stack */
    char why[160] = "";
    b->requests++;
    b->dispatch_ticket = ledger_journal_seq(b->ledger);
    b->dispatch_fail_on_io = false;
    int rc = wire_unpack(msg, len, &m, why, sizeof why);
    if (rc) {
        b->malformed++;
        LOG_DEBUG("malformed message (%zu bytes): %s", len, why);
        reply_error(b, &r, m.request_id, rc, "malformed message: %s", why);
        b->dispatch_ticket = 0; /* nothing journaled: answer at once */
        return wire_pack(&r, out, cap);
    }
    peer *p = rid_len ? peer_find(b, rid, rid_len) : NULL;
    bool is_ctl = m.role == WIRE_ROLE_CTL;
    if (m.type == WIRE_HELLO && is_ctl) { /* ctl sessions are stateless: no peer entry */
        reply_init(b, &r, WIRE_HELLO, m.request_id);
        snprintf(r.u.hello.name, sizeof r.u.hello.name, "dflash-queue");
        r.u.hello.heartbeat_ms = (uint32_t)b->cfg.heartbeat_ms;
        r.u.hello.lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms;
        snprintf(r.u.hello.pub_endpoint, sizeof r.u.hello.pub_endpoint, "%s",
                 b->cfg.pub_endpoint);
        goto out;
    }
    if (m.type == WIRE_HELLO && !p && rid_len && rid_len <= sizeof p->rid)
        p = peer_add(b, rid, rid_len);
    if (m.type == WIRE_WORK_UNIT || m.type == WIRE_GRANT || m.type == WIRE_STATUS_REPLY ||
        m.type == WIRE_SET_CONFIG_REPLY || m.type == WIRE_ERROR || m.type == WIRE_OK ||
        m.type == WIRE_GROUP_VIEW || m.type == WIRE_STEP_GRANT) {
        b->malformed++;
        reply_error(b, &r, m.request_id, DFLASH_EPROTO, "%s is not a request",
                    wire_type_name(m.type));
        goto out;
    }
    if (m.role == WIRE_ROLE_BROKER || (is_ctl && needs_hello(m.type))) {
        reply_error(b, &r, m.request_id, DFLASH_EDENIED, "a %s may not send %s",
                    wire_role_name(m.role), wire_type_name(m.type));
        goto out;
    }
    if (is_steering(m.type) && !may_steer(b)) {
        b->steer_denied++;
        LOG_WARN("%s from CURVE key %s refused: not an admin key", wire_type_name(m.type),
                 b->dispatch_user);
        reply_error(b, &r, m.request_id, DFLASH_EDENIED, "%s needs the admin key",
                    wire_type_name(m.type));
        goto out;
    }
    if (needs_hello(m.type) && (!p || p->state != PEER_LIVE || p->incarnation != m.incarnation)) {
        reply_error(b, &r, m.request_id, DFLASH_ESTALE, "unknown peer: send hello");
        goto out;
    }
    if (!is_ctl && m.type != WIRE_HELLO && p && p->state == PEER_LIVE) {
        p->last_seen_ms = now_ms(b);
        if (p->role == WIRE_ROLE_DRAFTER && b->policy)
            policy_heartbeat(b->policy, p->incarnation, p->last_seen_ms);
    }
    switch (m.type) {
    case WIRE_HELLO:
        if (!p) {
            reply_error(b, &r, m.request_id, DFLASH_EINVAL, "hello needs a routing id");
            break;
        }
        p->last_seen_ms = now_ms(b);
        if (!on_hello(b, p, &m, &r) && p->state == PEER_NEW) {
            for (uint32_t i = 0; i < b->n_peers; i++)
                if (b->peers[i] == p) {
                    b->peers[i] = b->peers[--b->n_peers];
                    break;
                }
            free(p->held);
            free(p);
            p = NULL;
        }
        break;
    case WIRE_POOL_REGISTER: on_pool_register(b, p, &m, &r); break;
    case WIRE_WORK_REQUEST: on_work_request(b, p, &m, &r); break;
    case WIRE_SLOT_READY: on_slot_ready(b, p, &m, &r); break;
    case WIRE_CLAIM: on_claim(b, p, &m, &r); break;
    case WIRE_SLOT_RELEASE: on_release(b, p, &m, &r); break;
    case WIRE_ACK: on_ack(b, p, &m, &r); break;
    case WIRE_CHECKPOINT_COMMITTED: on_commit(b, &m, &r); break;
    case WIRE_RESUME_FROM: on_resume_from(b, p, &m, &r); break;
    case WIRE_GROUP_JOIN: on_group_join(b, p, &m, &r); break;
    case WIRE_GROUP_SET_ID: on_group_set_id(b, p, &m, &r); break;
    case WIRE_STEP_CLAIM: on_step_claim(b, p, &m, &r); break;
    case WIRE_STEP_DONE: on_step_done(b, p, &m, &r); break;
    case WIRE_GROUP_LEAVE: on_group_leave(b, p, &m, &r); break;
    case WIRE_HEARTBEAT:
        reply_init(b, &r, WIRE_HEARTBEAT, m.request_id);
        r.u.sent_ms = m.u.sent_ms;
        break;
    case WIRE_STATUS_REQUEST:
        reply_init(b, &r, WIRE_STATUS_REPLY, m.request_id);
        broker_status(b, &r.u.status);
        break;
    case WIRE_SET_CONFIG: on_set(b, &m, &r); break;
    case WIRE_PAUSE: on_mode(b, &m, &r, POLICY_PAUSED); break;
    case WIRE_RESUME: on_mode(b, &m, &r, POLICY_RUNNING); break;
    case WIRE_DRAIN: on_mode(b, &m, &r, POLICY_DRAINING); break;
    default: /* reply types were refused above */
        reply_error(b, &r, m.request_id, DFLASH_EINTERNAL, "unhandled %s", wire_type_name(m.type));
        break;
    }
out:
    if (ledger_journal_seq(b->ledger) != b->dispatch_ticket)
        b->dispatch_ticket = ledger_journal_seq(b->ledger); /* it queued records */
    else
        b->dispatch_ticket = p ? p->journal_ticket : 0;
    if (p) p->journal_ticket = b->dispatch_ticket;
    b->dispatch_request_id = m.request_id;
    b->dispatch_fail_on_io = m.type == WIRE_CHECKPOINT_COMMITTED || m.type == WIRE_RESUME_FROM ||
                             is_steering(m.type);
    wire_msg_clear(&m);
    return wire_pack(&r, out, cap);
}

/* --- sockets -------------------------------------------------------------------------------- */

static void send_reply(broker *b, const uint8_t *rid, size_t rid_len, const uint8_t *msg,
                       size_t len)
{
    if (!b->router) return;
    if (zmq_send(b->router, rid, rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(b->router, msg, len, ZMQ_DONTWAIT) < 0)
        b->unroutable++; /* peer gone (ROUTER_MANDATORY) or its pipe is full */
}

/* Sends the deferred replies whose records are durable, in the order they were deferred.
 * Loop thread. */
static void flush_deferred(broker *b, uint64_t done_seq, uint64_t fail_seq)
{
    deferred_reply **pp = &b->dq_head, *prev = NULL;
    while (*pp) {
        deferred_reply *d = *pp;
        if (d->ticket > done_seq) {
            prev = d;
            pp = &d->next;
            continue;
        }
        *pp = d->next;
        if (b->dq_tail == d) b->dq_tail = prev;
        if (d->fail_on_io && fail_seq && fail_seq <= d->ticket) {
            static wire_msg e; /* loop thread only */
            reply_error(b, &e, d->request_id, DFLASH_EIO,
                        "journal write failed: the record is not durable");
            int n = wire_pack(&e, b->outbuf, WIRE_MAX_MSG);
            if (n > 0) send_reply(b, d->rid, d->rid_len, b->outbuf, (size_t)n);
        } else {
            send_reply(b, d->rid, d->rid_len, d->msg, d->len);
        }
        free(d);
    }
}

static void journal_note_recovery(broker *b);

static void on_journal_done(void *ctx, uint64_t done_seq, uint64_t fail_seq)
{
    flush_deferred(ctx, done_seq, fail_seq);
    journal_note_recovery(ctx);
}

/* Queues the reply in b->outbuf until the journal reaches b->dispatch_ticket. */
static void defer_reply(broker *b, const uint8_t *rid, size_t rid_len, size_t len)
{
    deferred_reply *d = malloc(sizeof *d + len);
    if (!d) { /* cannot wait: better late durability than a lost reply */
        LOG_WARN("no memory to defer a reply; sending it before its journal record is durable");
        send_reply(b, rid, rid_len, b->outbuf, len);
        return;
    }
    d->next = NULL;
    d->ticket = b->dispatch_ticket;
    d->request_id = b->dispatch_request_id;
    d->fail_on_io = b->dispatch_fail_on_io;
    memcpy(d->rid, rid, rid_len);
    d->rid_len = rid_len;
    memcpy(d->msg, b->outbuf, len);
    d->len = len;
    if (b->dq_tail) b->dq_tail->next = d;
    else b->dq_head = d;
    b->dq_tail = d;
}

static void on_router(void *zsock, void *arg)
{
    broker *b = arg;
    uint8_t rid[256];
    int rlen = zmq_recv(zsock, rid, sizeof rid, ZMQ_DONTWAIT);
    if (rlen < 0) return; /* EAGAIN: spurious */
    int more = 0;
    size_t ml = sizeof more;
    zmq_getsockopt(zsock, ZMQ_RCVMORE, &more, &ml);
    if (!more) return;
    zmq_msg_t body;
    zmq_msg_init(&body);
    int n = zmq_msg_recv(&body, zsock, ZMQ_DONTWAIT);
    if (n >= 0) {
        memcpy(b->inbuf, zmq_msg_data(&body), (size_t)n > WIRE_MAX_MSG ? WIRE_MAX_MSG : (size_t)n);
        /* set by our ZAP handler for CURVE connections only (see the header) */
        const char *user = b->curve_on ? zmq_msg_gets(&body, "User-Id") : NULL;
        snprintf(b->dispatch_user, sizeof b->dispatch_user, "%s", user ? user : "");
    }
    zmq_msg_close(&body);
    zmq_getsockopt(zsock, ZMQ_RCVMORE, &more, &ml);
    while (more) { /* extra frames: a malformed request; drain them */
        char junk[64];
        zmq_recv(zsock, junk, sizeof junk, ZMQ_DONTWAIT);
        zmq_getsockopt(zsock, ZMQ_RCVMORE, &more, &ml);
        n = (int)WIRE_MAX_MSG + 1;
    }
    if (n < 0) {
        b->dispatch_user[0] = 0;
        return;
    }
    size_t len = (size_t)n > WIRE_MAX_MSG ? WIRE_MAX_MSG + 1 : (size_t)n; /* truncated: too big */
    int out = broker_dispatch(b, rid, (size_t)rlen, b->inbuf, len, b->outbuf, WIRE_MAX_MSG);
    b->dispatch_user[0] = 0;
    if (out <= 0) return;
    uint64_t done_seq, fail_seq;
    ledger_journal_progress(b->ledger, &done_seq, &fail_seq);
    if (b->dispatch_ticket > done_seq) defer_reply(b, rid, (size_t)rlen, (size_t)out);
    else send_reply(b, rid, (size_t)rlen, b->outbuf, (size_t)out);
}

/* Whether cron holds its expiries: peers silent for longer than liveness heartbeats, and leases
 * past their deadline, expire only while the broker could hear. When cron runs late (the broker
 * itself stalled for more than half the shorter of the two windows, and for more than two cron
 * periods, e.g. descheduled on a loaded machine), the heartbeats sent meanwhile are still waiting
 * (libuv runs timers before socket reads; ZeroMQ's own thread may lag too), so nothing expires
 * for half a window more. That grace is given at most once per window (at least two periods), so
 * a broker that is always late still expires dead peers and leases (within about 1.5 windows),
 * and a lease timeout shorter than the period (a live setting) is not taken for a stall on every
 * run. The hold also delays policy_tick's lifting of restart fences, by as much. */
static bool stall_hold(broker *b, uint64_t now)
{
    uint64_t window = (uint64_t)b->cfg.heartbeat_ms * (uint64_t)b->cfg.liveness;
    if ((uint64_t)b->cfg.lease_timeout_ms < window) window = (uint64_t)b->cfg.lease_timeout_ms;
    uint64_t two_periods = 2 * uv_timer_get_repeat(&b->cron);
    uint64_t late = window / 2 > two_periods ? window / 2 : two_periods;
    uint64_t every = window > two_periods ? window : two_periods;
    uint64_t gap = b->last_cron_ms ? now - b->last_cron_ms : 0;
    b->last_cron_ms = now;
    if (gap > late && (!b->last_grace_ms || now - b->last_grace_ms >= every)) {
        b->last_grace_ms = now;
        b->judge_from_ms = now + window / 2;
        LOG_WARN("the broker did not run for %" PRIu64 " ms (a stall): nothing expires for"
                 " %" PRIu64 " ms more",
                 gap, window / 2);
    }
    return now < b->judge_from_ms;
}

static void expire_peers(broker *b, uint64_t now)
{
    uint64_t dead_after = (uint64_t)(b->cfg.heartbeat_ms * b->cfg.liveness);
    for (uint32_t i = 0; i < b->n_peers;) {
        peer *p = b->peers[i];
        if (now - p->last_seen_ms > dead_after) peer_remove(b, i, "expired (no heartbeat)");
        else i++;
    }
}

/* A journal that stopped taking records (a full disk, an I/O error) heals itself: every
 * journal_retry_ms the ledger rewrites it whole from memory (ledger_journal_heal), and once that
 * succeeds it holds everything, what changed during the failure too, and takes records again
 * (said once, INFO). Until then the failure is said once a minute, not only at the failure: the
 * ledger lives on in memory, and a broker restarted now would not see what changed since
 * (batches trained again, commits forgotten). Status carries it too (journal_error), and
 * dflash-ctl ping fails on it, so the healthcheck shows it. */
static void journal_watch(broker *b, uint64_t now)
{
    const char *jf = b->ledger ? ledger_journal_failure(b->ledger) : NULL;
    if (jf && now - b->journal_heal_ms >= (uint64_t)b->cfg.journal_retry_ms) {
        b->journal_heal_ms = now;
        (void)ledger_journal_heal(b->ledger); /* inline: done now; writer mode: queued */
        jf = ledger_journal_failure(b->ledger);
    }
    if (!jf) {
        journal_note_recovery(b);
        return;
    }
    b->journal_failing = true;
    if (b->journal_alarm_ms && now - b->journal_alarm_ms < 60000) return;
    b->journal_alarm_ms = now;
    LOG_ERROR("journal %s: %s; since then the ledger lives in memory only (a restart now would "
              "hand out again the batches trained since). The broker rewrites the journal from "
              "memory every %lld ms and recovers once the disk takes it: free space or fix the "
              "disk, and do not restart it before it says it recovered",
              b->cfg.journal, jf, (long long)b->cfg.journal_retry_ms);
}

/* Says once that a journal journal_watch saw failing takes records again (from cron, or as
 * soon as the writer reports the healing rewrite done). Loop thread. */
static void journal_note_recovery(broker *b)
{
    if (!b->journal_failing || ledger_journal_failure(b->ledger)) return;
    b->journal_failing = false;
    b->journal_alarm_ms = 0;
    LOG_INFO("journal %s recovered: rewritten whole from memory, it holds every change made "
             "while it was failing and takes records again", b->cfg.journal);
}

static void cron(uv_timer_t *t)
{
    broker *b = t->data;
    uint64_t now = now_ms(b);
    bool hold = stall_hold(b, now);
    if (!hold) expire_peers(b, now);
    if (b->policy && !hold) policy_tick(b->policy, now);
    uint64_t grace = b->cfg.orphan_grace_ms ? (uint64_t)b->cfg.orphan_grace_ms
                                            : 2 * (uint64_t)b->cfg.lease_timeout_ms;
    if (!b->orphans_requeued && now - b->start_ms >= grace) {
        b->orphans_requeued = true;
        uint64_t n = ledger_requeue_orphans(b->ledger);
        if (n) LOG_INFO("%" PRIu64 " batches in flight before the restart went back to to-do", n);
    }
    journal_watch(b, now);
    /* claims/s is measured over the stats interval, or each second when stats are off (status
     * shows it either way) */
    uint64_t window = b->cfg.stats_interval_ms ? (uint64_t)b->cfg.stats_interval_ms : 1000;
    if (now - b->last_stats_ms >= window) {
        static wire_msg s;
        reply_init(b, &s, WIRE_STATUS_REPLY, 0);
        broker_status(b, &s.u.status);
        double dt = (double)(now - b->last_stats_ms) / 1000.0;
        b->claims_per_s = dt > 0 ? (double)(s.u.status.grants - b->grants_at_last) / dt : 0;
        s.u.status.claims_per_s = b->claims_per_s;
        b->grants_at_last = s.u.status.grants;
        b->last_stats_ms = now;
        if (b->cfg.stats_interval_ms) publish(b, "stats", &s);
    }
}

/* --- security: CURVE and the ZAP handler ---------------------------------------------------- */

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
static int security_start(broker *b, const queue_config *cfg)
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

static void *bind_socket(broker *b, int type, const char *endpoint, int *err)
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

/* The steering a previous broker journaled (dflash-ctl set, pause, drain), back in force by the
 * rule of steering.h; journaled again when the configuration won somewhere, so that a later
 * restart compares with what is in force now. Runtime values that do not fit together with the
 * configuration now (e.g. a restored min-ready above a lowered max-depth) are all dropped. */
static void restore_steering(broker *b)
{
    uint32_t len;
    const void *p = ledger_settings(b->ledger, &len);
    steering_state js;
    if (!p) return;
    if (steering_decode(p, len, &js)) {
        LOG_WARN("the journal's runtime settings record is damaged: running with the "
                 "configuration, not paused or draining (give dflash-ctl set/pause/drain again "
                 "if they are still wanted)");
        return;
    }
    queue_config next = b->cfg;
    char why[400];
    if (steering_restore(&queue_table, &js, &next) && live_check(b, &next, why, sizeof why)) {
        LOG_WARN("the runtime settings restored from the journal do not fit the configuration "
                 "now (%s): running with the configured values", why);
        next = b->cfg;
    }
    b->cfg = next;
    b->pending_mode = js.mode;
    apply_live(b, &b->cfg, false); /* the log level; the policy comes with the first pool */
    if (js.mode == POLICY_PAUSED)
        LOG_WARN("was paused before the restart: still paused; `dflash-ctl resume` to continue");
    else if (js.mode == POLICY_DRAINING)
        LOG_WARN("was draining before the restart: still draining (no work units; claims end "
                 "once nothing is left to hand out); `dflash-ctl resume` to run again");
    static uint8_t now[STEERING_PAYLOAD_MAX]; /* loop thread only */
    int n = steering_payload(b, now, sizeof now);
    if (n >= 0 && ((uint32_t)n != len || memcmp(now, p, len) != 0)) journal_steering(b, NULL, 0);
}

broker *broker_new(uv_loop_t *loop, const queue_config *cfg, int *err)
{
    int dummy;
    if (!err) err = &dummy;
    *err = 0;
    broker *b = calloc(1, sizeof *b);
    if (!b) return *err = DFLASH_ENOMEM, NULL;
    b->loop = loop;
    b->cfg = *cfg;
    b->configured = *cfg;
    snprintf(b->cfg_applied_log, sizeof b->cfg_applied_log, "%s", cfg->log_level);
    b->incarnation = wire_new_incarnation();
    b->start_ms = now_ms(b);
    b->last_stats_ms = b->start_ms;
    b->pending_mode = POLICY_RUNNING;
    b->inbuf = malloc(WIRE_MAX_MSG + 1);
    b->outbuf = malloc(WIRE_MAX_MSG);
    if (!b->inbuf || !b->outbuf) {
        *err = DFLASH_ENOMEM;
        goto fail;
    }
    ledger_params lp = {
        .journal_path = strcmp(cfg->journal, "none") == 0 || !cfg->journal[0] ? NULL
                                                                              : cfg->journal,
        .max_epochs = (uint32_t)cfg->max_epochs,
        .fsync = cfg->fsync,
        .compact_bytes = (uint64_t)cfg->compact_bytes,
    };
    char why[400];
    if ((*err = broker_config_check(cfg, why, sizeof why))) {
        LOG_ERROR("%s", why);
        goto fail;
    }
    b->ledger = ledger_new(&lp, err);
    if (!b->ledger) goto fail;
    if (!(b->groups = group_table_new())) {
        *err = DFLASH_ENOMEM;
        goto fail;
    }
    restore_steering(b);
    if (cfg->endpoint[0]) {
        b->zctx = zmq_ctx_new();
        if (!b->zctx) {
            *err = DFLASH_EZMQ;
            goto fail;
        }
        if (cfg->curve_secret_key[0] && (*err = security_start(b, cfg))) goto fail;
        if (!(b->router = bind_socket(b, ZMQ_ROUTER, cfg->endpoint, err))) goto fail;
        if (cfg->pub_endpoint[0] && !(b->pub = bind_socket(b, ZMQ_PUB, cfg->pub_endpoint, err)))
            goto fail;
        b->router_watch = zloop_sock_new(loop, b->router, 64, on_router, b);
        if (!b->router_watch) {
            *err = DFLASH_EZMQ;
            goto fail;
        }
        /* from here on the loop thread never writes the journal itself */
        if ((*err = ledger_writer_start(b->ledger, loop, on_journal_done, b))) {
            LOG_ERROR("cannot start the journal writer thread: %s", err_str(*err));
            goto fail;
        }
    }
    uv_timer_init(loop, &b->cron);
    b->cron.data = b;
    uint64_t period = (uint64_t)cfg->heartbeat_ms / 4;
    if (period < 10) period = 10;
    if (period > 250) period = 250;
    uv_timer_start(&b->cron, cron, period, period);
    b->cron_started = true;
    LOG_INFO("broker incarnation %016" PRIx64 " serving %s%s%s (pub %s), journal %s",
             b->incarnation, cfg->endpoint[0] ? cfg->endpoint : "(none)",
             cfg->bind[0] ? " and " : "", cfg->bind,
             cfg->pub_endpoint[0] ? cfg->pub_endpoint : "(none)",
             lp.journal_path ? lp.journal_path : "(memory)");
    return b;
fail:
    broker_destroy(&b);
    return NULL;
}

void broker_stop(broker *b)
{
    if (!b || b->stopped) return;
    b->stopped = true;
    /* drain the journal, then answer whoever still waits for it */
    if (b->ledger) {
        ledger_writer_stop(b->ledger);
        uint64_t done_seq, fail_seq;
        ledger_journal_progress(b->ledger, &done_seq, &fail_seq);
        flush_deferred(b, done_seq, fail_seq);
    }
    zloop_sock_destroy(&b->router_watch);
    zloop_sock_destroy(&b->zap_watch);
    if (b->cron_started) {
        uv_timer_stop(&b->cron);
        uv_close((uv_handle_t *)&b->cron, NULL);
    }
}

void broker_shutdown(broker *b)
{
    if (!b || b->stopped) return;
    if (b->pending_mode == POLICY_DRAINING) {
        b->pending_mode = POLICY_RUNNING; /* for the record only: nothing is served after this */
        if (journal_steering(b, NULL, 0) == 0)
            LOG_INFO("the drain ends with this stop: a broker started again on this journal runs "
                     "(a crash, unlike a stop, leaves it draining)");
    }
    broker_stop(b);
}

void broker_destroy(broker **bp)
{
    if (!bp || !*bp) return;
    broker *b = *bp;
    *bp = NULL;
    broker_stop(b);
    /* Let the close callbacks run before the memory they point into goes away. */
    if (b->loop) uv_run(b->loop, UV_RUN_NOWAIT);
    if (b->router) zmq_close(b->router);
    if (b->pub) zmq_close(b->pub);
    if (b->zap) zmq_close(b->zap);
    if (b->zctx) zmq_ctx_term(b->zctx);
    curve_keyset_clear(&b->curve_clients);
    curve_keyset_clear(&b->admin_keys);
    memset(b->curve_secret, 0, sizeof b->curve_secret);
    for (uint32_t i = 0; i < b->n_peers; i++) {
        free(b->peers[i]->held);
        free(b->peers[i]);
    }
    free(b->peers);
    while (b->dq_head) {
        deferred_reply *d = b->dq_head;
        b->dq_head = d->next;
        free(d);
    }
    for (int i = 0; i < MAX_POOLS; i++) {
        free(b->pools[i].events);
        free(b->pools[i].n_seqs);
    }
    policy_destroy(&b->policy);
    group_table_destroy(&b->groups);
    ledger_destroy(&b->ledger);
    free(b->inbuf);
    free(b->outbuf);
    free(b);
}

uint64_t broker_incarnation(const broker *b) { return b->incarnation; }

void broker_set_sync_hook(broker *b, journal_sync_fn fn, void *ctx)
{
    ledger_set_sync_hook(b->ledger, fn, ctx);
}
