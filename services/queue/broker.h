/* broker: dflash-queue's server loop. It owns the ROUTER (requests) and PUB (announcements)
 * sockets, the peer table, the policy (policy.h) and the ledger (ledger.h), and turns each
 * request into policy/ledger calls and one reply.
 *
 * Data: the peer table (one entry per routing id: role, incarnation, name, last-seen time; a
 * target's pool id; a drafter's *held* list = batches it released after copying but has not acked
 * yet); the pool table (per target name: pool id, the descriptor a Grant needs). Invariants: a
 * batch is in at most one place among {a policy slot, one drafter's held list}; a peer silent for
 * liveness x heartbeat_ms is expired: a drafter's leases end (slots READY again) and its held
 * batches return to to-do; a target's pool is dropped (its batches return to to-do). A new
 * incarnation with the same role and name replaces the old peer the same way.
 *
 * Peer session states: NEW (no hello) -> LIVE (hello) -> GONE (expired/replaced, entry freed).
 * At most max_peers entries (a hello past it: ERROR AGAIN, "the peer table is full").
 * Requests from a target or drafter without hello get ERROR STALE ("send hello"); ctl requests
 * need no hello and keep no state, but a ctl may only send hello, heartbeat, status, set, pause,
 * resume and drain (else ERROR DENIED).
 *
 * Groups (issue 7; group.h, docs/protocol.md "Groups"): drafters in a data-parallel group claim
 * whole optimizer steps: the broker reserves one slot per rank at once (only when that many
 * claims would be served), rank 0's StepDone acks all of them once, and membership changes
 * (joins at step boundaries, deaths, goodbyes) form a new epoch; a step in flight when its epoch
 * ends is acked or returned to to-do as the surviving first rank's model says. A dead drafter's
 * copied units of such a step stay in flight until then (they are not requeued with its other
 * held batches). max-depth below the largest group is refused.
 *
 * Security (DESIGN.md section 5): ipc:// endpoints use ZeroMQ's NULL mechanism; the 0700 runtime
 * dir is their access control, and every verb is open to them. tcp:// endpoints use CURVE: the
 * broker's secret key from a file, and a ZAP handler (inproc://zeromq.zap.01, a REP socket on
 * this loop) that accepts only public keys found in the curve-clients or admin-keys dirs and
 * sets the key (Z85) as the connection's User-Id. A rejected key gets no reply at all. Each
 * request's User-Id is read from its message metadata: a CURVE peer whose key is not an admin
 * key gets ERROR DENIED for the steering verbs (set, pause, resume, drain); other verbs are
 * allowed. A peer is bound to the key of its hello: a request on its routing id with another
 * key, and a hello that would replace it (same role and name, or its run) from another key while
 * it is registered, get ERROR DENIED (broker_security.c, "Key binding"). A tcp:// endpoint
 * without CURVE is refused at start-up unless insecure-tcp (tests).
 *
 * Steering (set, pause, resume, drain) is journaled and restored by a broker started again on
 * the same journal (steering.h has the rule: an unchanged configuration lets the runtime value
 * win, a changed one wins; paused and draining come back).
 *
 * Thread: everything runs on the libuv loop thread given to broker_new. One cron timer does the
 * periodic work: peer expiry, lease expiry (policy_tick), the orphan grace period after a restart,
 * stats on PUB. Journal writes and fsyncs run on the journal's writer thread (journal.h); a reply
 * is sent only once every journal record queued before it is durable (broker.c, "Journal and
 * replies"), in the order requests were handled.
 * Callers: services/queue/main.c, tests, bench, the fuzz harness (broker_dispatch without sockets).
 */
#ifndef DFLASH_QUEUE_BROKER_H
#define DFLASH_QUEUE_BROKER_H

#include "config.h"
#include "journal.h"
#include "wire.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define BROKER_PATH_MAX 256

/* The daemon's settings; the table (broker_config_table) holds names, defaults, ranges, help and
 * which ones are live (dflash-ctl set). */
typedef struct queue_config {
    char runtime_dir[BROKER_PATH_MAX];   /* 0700 dir for ipc sockets; "" = default */
    char endpoint[BROKER_PATH_MAX];      /* ROUTER; "" = ipc://<runtime_dir>/queue.sock */
    char pub_endpoint[BROKER_PATH_MAX];  /* PUB; "" = ipc://<runtime_dir>/queue-pub.sock */
    char journal[BROKER_PATH_MAX];       /* "" = <runtime_dir>/queue.journal; "none" = memory */
    char bind[BROKER_PATH_MAX];          /* extra ROUTER endpoint (tcp://host:port); "" = none */
    char curve_secret_key[BROKER_PATH_MAX]; /* broker's secret key file: CURVE on tcp:// */
    char curve_clients[BROKER_PATH_MAX]; /* dir of *.pub keys allowed to connect over CURVE */
    char admin_keys[BROKER_PATH_MAX];    /* dir of *.pub keys allowed to steer over CURVE */
    bool insecure_tcp;                   /* tests only: tcp:// without CURVE */
    int64_t min_ready;                   /* live */
    int64_t max_depth;                   /* live */
    int64_t lease_timeout_ms;            /* live */
    int64_t max_redeliveries;            /* live */
    char shares[BROKER_PATH_MAX];        /* live; "" = from the target, else "0.1,0.2,..." */
    int64_t mix_window;
    int64_t heartbeat_ms;
    int64_t liveness;
    int64_t stats_interval_ms;           /* live; 0 = no stats on PUB */
    int64_t orphan_grace_ms;             /* 0 = two lease timeouts */
    int64_t max_epochs;                  /* 0 = as the target says */
    int64_t group_hold_ms; /* a group's creator below the last commit waits this long (0: no) */
    bool fsync;
    int64_t compact_bytes;
    int64_t journal_retry_ms;            /* a failing journal is rewritten from memory this often */
    int64_t stop_grace_ms;               /* the longest graceful stop (broker_stop_gracefully) */
    int64_t max_peers;                   /* targets and drafters at once; a hello past it: AGAIN */
    char log_level[16];                  /* live */
} queue_config;

const cfg_table *broker_config_table(void);

/* Checks the security settings before anything is bound (DESIGN.md section 5): a tcp://
 * endpoint (endpoint, bind or pub_endpoint) needs curve_secret_key and curve_clients unless
 * insecure_tcp; CURVE options need a libzmq with CURVE and must come together. Returns 0 or
 * DFLASH_ECONFIG with a message for the operator in why. */
int broker_config_check(const queue_config *cfg, char *why, size_t why_len);

typedef struct broker broker;

/* Opens the ledger (replaying the journal), creates the sockets and binds them (an empty
 * endpoint means no socket: broker_dispatch only, for tests and fuzzing) and starts the cron
 * timer on loop. cfg is copied; endpoints and journal must already be resolved (main does it).
 * Returns NULL with *err set (DFLASH_EZMQ bind failed, ledger codes, DFLASH_ENOMEM). */
broker *broker_new(uv_loop_t *loop, const queue_config *cfg, int *err);

/* Closes sockets and handles (run the loop once more to finish closing), frees everything.
 * Accepts NULL and NULLs *b. */
void broker_destroy(broker **b);

/* Stops serving: closes the watchers and the timer so uv_run returns. Safe to call twice. */
void broker_stop(broker *b);

/* A deliberate stop (SIGTERM, SIGINT; the end of broker_stop_gracefully): a drain under way is
 * over with it, journaled as running, so a broker started again on this journal runs (a pause
 * stays: it is still in force after the restart); then broker_stop. A crash skips this: a broker
 * restarted after one keeps draining. */
void broker_shutdown(broker *b);

typedef void (*broker_stopped_fn)(void *ctx);

/* The graceful stop (the first SIGTERM or SIGINT; broker_stop.c): from now on claims, step
 * claims that would reserve a new step and work requests are answered Error AGAIN ("the broker
 * is stopping"), everything else as before, until no live drafter holds a lease or a batch it has
 * not acked and every one that stops has reported its final checkpoint, or cfg.stop_grace_ms has
 * passed; then broker_shutdown and done(ctx) (main: stop the loop). Logged: what it waits for,
 * and how it ended. A second call (a second signal) ends it at once, as does nothing to wait for
 * or a grace of 0 (done runs inside the call then, else from the broker's stop timer). Loop
 * thread. */
void broker_stop_gracefully(broker *b, broker_stopped_fn done, void *ctx);

/* True from broker_stop_gracefully until the broker has stopped. */
bool broker_stopping(const broker *b);

/* Handles one request from routing id (rid, rid_len) and writes the packed reply into out.
 * Returns the reply length (> 0; every request gets a reply, malformed ones an ERROR) or a
 * negative code if out is too small. The socket loop and the fuzz harness both use it. */
int broker_dispatch(broker *b, const uint8_t *rid, size_t rid_len, const uint8_t *msg,
                    size_t len, uint8_t *out, size_t cap);

/* Applies live settings (all or nothing) and journals the runtime steering (steering.h), so a
 * restarted broker keeps them. Returns 0 or DFLASH_ENOTFOUND/EINVAL/ERANGE/EDENIED (nothing
 * changed), or DFLASH_EIO (in force, but the journal is failing: not durable), with a message in
 * err. */
int broker_set(broker *b, const wire_settings *set, char *err, size_t err_len);

/* Fills the status (same as the STATUS reply). */
void broker_status(broker *b, wire_status *out);
/* The same, its peer list only the live peers whose name starts with peer_prefix ("": all). */
void broker_status_of(broker *b, const char *peer_prefix, wire_status *out);

/* The broker's incarnation (random per start). */
uint64_t broker_incarnation(const broker *b);

/* Replaces the journal's fdatasync (tests: a slow or failing disk). Loop thread. */
void broker_set_sync_hook(broker *b, journal_sync_fn fn, void *ctx);

#endif
