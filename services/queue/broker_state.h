/* broker_state: the broker's state and the helpers its files share. Private to the broker:
 * broker.c (peers, pools, request dispatch, the socket loop and cron) and its parts,
 * broker_config.c (the options table and its checks), broker_groups.c (data-parallel drafter
 * groups), broker_steering.c (set, pause, resume, drain: applied, journaled, restored;
 * release of quarantined batches),
 * broker_trainers.c (one broker, one model: run ids and trainer admission),
 * broker_leave.c (a target's leave), broker_stop.c (the graceful stop) and broker_security.c
 * (CURVE, the ZAP handler, binding endpoints). broker.h is the public face;
 * broker.c's top comment has the model (peer table, pool table, journal and replies).
 *
 * Thread: the broker's loop thread, like everything of the broker.
 */
#ifndef DFLASH_QUEUE_BROKER_STATE_H
#define DFLASH_QUEUE_BROKER_STATE_H

#include "broker.h"
#include "curve.h"
#include "err.h"
#include "group.h"
#include "ledger.h"
#include "policy.h"
#include "recent_acks.h"
#include "zloop.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef enum { PEER_NEW = 0, PEER_LIVE, PEER_GONE } peer_state;

/* A warning a peer can trigger with every message (a flood must not flood the log): said at the
 * first occurrence, then at most once per BROKER_WARN_EVERY_MS, with the count since the last
 * one said. `count` is the total (the counter of the event). */
#define BROKER_WARN_EVERY_MS 10000
typedef struct warn_limit {
    uint64_t count;      /* occurrences in all */
    uint64_t said_count; /* count when it was last said */
    uint64_t said_ms;    /* when it was last said (0: never) */
} warn_limit;

/* Counts one occurrence at now; true when it is to be said now, *since then holding the
 * occurrences since the last one said (this one included). */
static inline bool warn_limit_due(warn_limit *w, uint64_t now, uint64_t *since)
{
    w->count++;
    if (w->said_ms && now - w->said_ms < BROKER_WARN_EVERY_MS) return false;
    *since = w->count - w->said_count;
    w->said_count = w->count;
    w->said_ms = now ? now : 1;
    return true;
}

/* Replies waiting for the journal (deferred_reply) per routing id: a client has one request
 * out at a time (common/client.c), so more are answers to requests it gave up waiting for
 * (each timeout resets its socket and moves on); the oldest beyond this is dropped. The broker
 * keeps at most this many per --max-peers in all. */
#define BROKER_DEFERRED_PER_PEER 8

#define PEER_RECENT_RELEASES 8 /* a retried release of one of these is answered Ok */
#define PEER_REPLACED 8        /* replaced incarnations remembered per name (duplicates) */

typedef struct peer {
    uint8_t rid[256];
    size_t rid_len;
    peer_state state;
    wire_role role;
    uint64_t incarnation;
    char name[WIRE_MAX_NAME];
    char key[CURVE_Z85_LEN + 1]; /* the CURVE key (User-Id) of its first hello; "" none (ipc://,
                                    NULL): every later request on it must come with the same one
                                    (broker_key_differs) */
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
    uint64_t run_id; /* trainer: the run its ResumeFrom named (0: an older drafter said none) */
    uint64_t trainer_wait_since_ms; /* drafter: when its resume or join first met another
                                       model's trainer (0: not waiting; broker.c) */
    uint64_t group_hold_since_ms; /* drafter: when its creating a group was first held (0) */
    /* drafter, for a graceful stop (broker_stop.c): the newest step it acked (a group's rank 0:
     * StepDone) and the newest it reported committed; it claimed while the broker stopped */
    uint64_t acked_step, committed_step;
    bool claimed_in_stop;
} peer;

typedef struct pool_desc {
    char owner[WIRE_MAX_NAME]; /* target name */
    bool registered;
    wire_pool desc;            /* event_handles points to events below */
    uint8_t (*events)[WIRE_HANDLE_BYTES];
    uint32_t *n_seqs;          /* per slot, from its last SLOT_READY (for the Grant) */
    uint64_t last_grant_ms;    /* when a slot of it was last granted (0: never) */
    uint64_t drain_hold_ms;    /* draining: when its target was first held (0: not held) */
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

/* The broker's stop (broker_stop.c has the transitions). */
typedef enum { BROKER_SERVING = 0, BROKER_STOPPING, BROKER_STOPPED } broker_stop_phase;

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
    uint64_t zap_denied, steer_denied; /* status: connections_refused, steering_refused */
    warn_limit key_denied;         /* requests refused: another key's peer (broker_key_refuse;
                                      status: key_refusals) */
    uv_timer_t cron;
    bool cron_started, stopped;
    broker_stop_phase stop_phase;  /* a graceful stop (broker_stop.c) */
    uv_timer_t stop_timer;         /* its checks while STOPPING */
    bool stop_timer_started;
    uint64_t stop_since_ms;        /* when it began */
    uint64_t stop_settled_ms;      /* since when nothing is left to wait for (0: something is) */
    broker_stopped_fn stop_done;   /* called once STOPPED (main: stops the loop) */
    void *stop_done_ctx;
    uint64_t last_cron_ms;   /* when cron last ran (before its first run: when it started) */
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
    bool plan_done_said;      /* "the plan is done" logged (again once it is undone) */

    peer **peers;
    uint32_t n_peers, cap_peers;
    warn_limit peers_full;         /* hellos refused: the table held cfg.max_peers (status:
                                      hellos_refused_full) */
    pool_desc pools[MAX_POOLS];

    uint64_t malformed, acks, double_acks, unroutable, requests;
    recent_acks acked_by;  /* who made the recent plain acks (on_ack: a repeat or trained twice) */
    uint64_t redeliveries; /* grants of a batch granted before (broker_granted) */
    deferred_reply *dq_head, *dq_tail; /* in deferral order; each peer's tickets ascending */
    uint32_t n_deferred;               /* entries in that list (capped: defer_reply) */
    warn_limit deferred_dropped;       /* deferred replies dropped for the caps (status:
                                          replies_dropped) */
    uint64_t dispatch_ticket;          /* of the last broker_dispatch */
    uint64_t dispatch_request_id;
    bool dispatch_fail_on_io;
    bool dispatch_rewound; /* the request journaled a REWIND (broker_rewind_to): fail_on_io */
    uint64_t dispatch_wait_seq; /* its reply waits for this journal record too: fail_on_io */
    uint8_t *inbuf, *outbuf;
    char cfg_applied_log[16]; /* log level last applied by a live set */
};

static inline uint64_t now_ms(broker *b)
{
    uv_update_time(b->loop);
    return uv_now(b->loop);
}

static inline void reply_init(broker *b, wire_msg *r, wire_type t, uint64_t rid)
{
    wire_msg_init(r, t, WIRE_ROLE_BROKER, b->incarnation, rid);
}

static inline void reply_error(broker *b, wire_msg *r, uint64_t rid, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static inline void reply_error(broker *b, wire_msg *r, uint64_t rid, int code, const char *fmt, ...)
{
    reply_init(b, r, WIRE_ERROR, rid);
    r->u.error.code = code < 0 ? code : DFLASH_EINTERNAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->u.error.message, sizeof r->u.error.message, fmt, ap);
    va_end(ap);
}

static inline void reply_ok(broker *b, wire_msg *r, uint64_t rid, uint64_t value)
{
    reply_init(b, r, WIRE_OK, rid);
    r->u.value = value;
}

static inline batch_id to_batch(const wire_unit *u)
{
    batch_id id = {u->epoch, u->bucket, (uint32_t)u->index};
    return id;
}

static inline wire_unit to_unit(const batch_id *id)
{
    wire_unit u = {id->epoch, id->bucket, id->index};
    return u;
}

/* --- shared between the broker's files ------------------------------------------------------ */

/* broker.c */
void broker_publish(broker *b, const char *topic, const wire_msg *m);
/* p takes over from peers[i] (a restart by name or of its run): p remembers i's incarnation and
 * those i had replaced (a hello from one is refused EXISTS), and i's session ends as an expiry
 * would end it (its leases, its held batches back to to-do). */
void broker_peer_take_over(broker *b, peer *p, uint32_t i, const char *why);
/* Removes batch id from every drafter's held list. */
void broker_held_remove_all(broker *b, const batch_id *id);
/* A claim or a group step's reservation granted g (policy_claim): counts it in redeliveries when
 * its batch was delivered before, for whatever reason (ledger_note_delivery), and takes the batch
 * off the held list of whoever had it then. */
void broker_granted(broker *b, const policy_grant *g);
/* True when draining and nothing is left to hand out (claims are answered SHUTDOWN). */
bool broker_drained(const broker *b);
/* True when every batch of the target's planned epochs is trained (claims are answered
 * SHUTDOWN, broker_reply_plan_done); false again after a rewind. */
bool broker_plan_done(broker *b);
/* The same with `own` batches in flight that cannot come back (a group step's units: its end,
 * broker_groups.c): every other batch of the planned epochs is trained. No log, no state. */
bool broker_plan_done_but(broker *b, uint64_t own);
/* The batches of the planned epochs not trained yet besides `own` in flight (to do, being
 * produced, ready, leased elsewhere), once every epoch is opened and no step is orphaned;
 * UINT64_MAX while that is not known. broker_plan_done_but is this == 0. */
uint64_t broker_plan_left_but(broker *b, uint64_t own);
/* The answer to a claim once broker_plan_done: SHUTDOWN with the reason, said once in the log. */
void broker_reply_plan_done(broker *b, wire_msg *r, uint64_t rid);
/* The ledger back to a drafter's model step (ResumeFrom, a group's creation): the batches
 * trained after it return to to-do. Returns how many, or a negative code with the error reply
 * (why it was refused) already in r. */
int64_t broker_rewind_to(broker *b, uint64_t step, wire_msg *r, uint64_t rid);
/* What the importer needs to map the granted slot. */
void broker_fill_grant(broker *b, const policy_grant *g, wire_grant *w);
/* Warns when the registered slots cannot hold min_ready ready ones. */
void broker_warn_reservoir(const broker *b);
/* Slots of pool id by state (none counted when the policy does not have the pool). */
typedef struct broker_slot_counts {
    uint32_t filling, ready, leased;
} broker_slot_counts;
broker_slot_counts broker_pool_slots(const broker *b, uint32_t id);
/* Pool id is no longer registered: nothing more is granted from it, its FILLING and READY
 * batches go back to to-do, its LEASED slots become detached leases (policy_pool_drop), and the
 * plan no longer counts it. A drain's ready slots nobody took, a target's expiry, replacement
 * or leave. Idempotent. */
void broker_pool_give_up(broker *b, uint32_t id);

/* broker_config.c: the reservoir against the depth cap for a step of world ranks (0 or
 * DFLASH_ERANGE with why, optional, set); bucket shares from text (0 or DFLASH_EINVAL). */
int broker_depth_check(const queue_config *c, uint32_t world, char *why, size_t why_len);
int broker_parse_shares(const char *s, uint32_t n, double *out);

/* broker_groups.c: the group requests (each fills *r; p a drafter: dispatch's role_of_request);
 * a drafter gone; a released unit of a step in flight. */
void broker_on_group_join(broker *b, peer *p, const wire_msg *m, wire_msg *r);
void broker_on_group_set_id(broker *b, peer *p, const wire_msg *m, wire_msg *r);
void broker_on_step_claim(broker *b, peer *p, const wire_msg *m, wire_msg *r);
void broker_on_step_done(broker *b, peer *p, const wire_msg *m, wire_msg *r);
void broker_on_group_leave(broker *b, peer *p, const wire_msg *m, wire_msg *r);
void broker_groups_peer_gone(broker *b, peer *p);
/* From the broker's cron: aborts the orphaned steps (group.h) nobody came back for. */
void broker_groups_tick(broker *b, uint64_t now);
/* From broker_new, after the replay: the orphaned steps the journal holds back in the group
 * table, their units kept in flight (not given back by the orphan grace) until resolved. */
void broker_groups_restore(broker *b);

/* broker_trainers.c: one broker, one model. The live drafter that trains another model than p
 * would (p alone as run run_id: group_name NULL; or joining group group_name), or NULL; p's
 * run's predecessors taken over by p's request m (true), or none when one of them registered
 * with another CURVE key than p (false: r holds Error DENIED, broker_key_refuse); whether p may
 * train now (false: r holds Error AGAIN while the other may be a dying process, then Error
 * `final`); a trainer's ResumeFrom (fills *r). */
const peer *broker_other_model_trainer(broker *b, const peer *p, uint64_t run_id,
                                       const char *group_name);
bool broker_take_over_run(broker *b, peer *p, const wire_msg *m, uint64_t run_id, wire_msg *r);
bool broker_trainer_admitted(broker *b, peer *p, const peer *q, uint64_t rid, int final,
                             wire_msg *r);
void broker_on_resume_from(broker *b, peer *p, const wire_msg *m, wire_msg *r);

/* broker_stop.c: while STOPPING, the answer to a request that would hand out a new lease or
 * work unit (true: r holds Error AGAIN "the broker is stopping"); what a handled request tells
 * the stop about its peer (its acks, commit reports and claims; after the handler, r its reply);
 * the stop timer closed (broker_stop); the stop in a status reply. */
bool broker_stop_refuses(broker *b, peer *p, const wire_msg *m, wire_msg *r);
void broker_stop_note(broker *b, peer *p, const wire_msg *m, const wire_msg *r);
void broker_stop_close(broker *b);
/* The stop in a status reply: s->stopping, and while STOPPING s->stop (what it still waits for,
 * the grace and the time since the signal). */
void broker_stop_status(broker *b, wire_status *s);

/* broker_leave.c: a target's PoolLeave (fills *r; p a target: dispatch's role_of_request). True
 * when its session has ended (nothing of its pool is being copied any more): the caller then
 * ends it (the entry p is freed). */
bool broker_on_pool_leave(broker *b, peer *p, const wire_msg *m, wire_msg *r);

/* broker_steering.c: Set, Pause/Resume/Drain and ReleaseQuarantine (each fills *r); the
 * steering journaled as the ledger's settings record (0, or a code with why, optional, saying it
 * is not durable); the journaled steering back in force at start-up. */
void broker_on_set(broker *b, const wire_msg *m, wire_msg *r);
void broker_on_mode(broker *b, const wire_msg *m, wire_msg *r, policy_mode mode);
void broker_on_release_quarantine(broker *b, const wire_msg *m, wire_msg *r);
int broker_journal_steering(broker *b, char *why, size_t why_len);
void broker_restore_steering(broker *b);

/* broker_security.c: loads the CURVE keys and starts the ZAP handler (before any CURVE bind;
 * 0 or DFLASH_ECONFIG/EZMQ, logged); a socket of type bound to endpoint (and cfg.bind for the
 * ROUTER), NULL with *err set. */
int broker_security_start(broker *b, const queue_config *cfg);
void *broker_bind_socket(broker *b, int type, const char *endpoint, int *err);
/* Key binding (broker_security.c's header): true when `key` (a request's User-Id, or a peer's
 * key) is not the one peer o registered with. */
static inline bool broker_key_differs(const peer *o, const char *key)
{
    return strcmp(o->key, key) != 0;
}
/* Refuses request m, whose key (b->dispatch_user) is not that of o, a peer in the table: r gets
 * Error DENIED with `why` (for the requester: what it may not do and what would work) and
 * Error.other_key set, counted (status: key_refusals) and logged with both keys (once per
 * BROKER_WARN_EVERY_MS, with the count since). */
void broker_key_refuse(broker *b, const wire_msg *m, const peer *o, const char *why, wire_msg *r);

#endif
