/* wire: the one place that packs, unpacks and range-checks protocol messages.
 *
 * Every message on the control plane is one protobuf-c Envelope (proto/dflash.proto) holding a
 * protocol version, the sender's role and incarnation, a request id and one body. This module
 * turns it into the plain C struct wire_msg below and back; generated protobuf-c names never
 * leave wire.c. wire_unpack bounds the input size before unpacking (WIRE_MAX_MSG) and checks
 * every field's range afterwards, so callers can trust a wire_msg they got from it: strings are
 * NUL-terminated and within their arrays, counts are within the WIRE_MAX_* bounds, enums are
 * known values, bucket shares are finite and in [0,1].
 *
 * Ownership: a wire_msg is a plain value except for pool.event_handles, which wire_unpack
 * allocates (wire_msg_clear frees it) and which pack only borrows. Thread: pure functions,
 * callable from any thread. Callers: client.c, services/queue/broker.c, tests.
 */
#ifndef DFLASH_WIRE_H
#define DFLASH_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Protocol version. A peer speaking another major version gets ERROR VERSION (docs/protocol.md). */
#define WIRE_VERSION 1u
#define WIRE_MAX_MSG (1u << 20)   /* bytes; ZMQ_MAXMSGSIZE and the pre-unpack check use it */
#define WIRE_MAX_NAME 64          /* names, shm names, incl. NUL */
#define WIRE_BUS_ID_MAX 32        /* a GPU's PCI bus id, incl. NUL (== POOL_BUS_ID_MAX) */
#define WIRE_MAX_BUCKETS 16
#define WIRE_MAX_SLOTS 4096
#define WIRE_HANDLE_BYTES 64      /* cudaIpcMemHandle_t / cudaIpcEventHandle_t */
#define WIRE_MAX_SETTINGS 32
#define WIRE_MAX_KEY 64
#define WIRE_MAX_VALUE 128
#define WIRE_MAX_TEXT 256         /* error messages */
#define WIRE_MAX_SHAPE_TEXT 128   /* a drafter's shape in words (GroupJoin.shape_text) */
#define WIRE_MAX_HELD 256         /* units a drafter may re-register */
#define WIRE_GROUP_ID_BYTES 128   /* rendezvous id of a drafter group (DP_COMM_ID_BYTES) */
#define WIRE_MAX_WORLD 64         /* ranks of one drafter group */
#define WIRE_MAX_GROUPS 8         /* groups listed in a status reply */
#define WIRE_MAX_STATUS_MEMBERS 32 /* member names listed per group in a status reply */
#define WIRE_MAX_STATUS_ORPHANS 8  /* orphaned group steps listed in a status reply */
#define WIRE_MAX_STATUS_PEERS 64   /* live targets and drafters listed in a status reply */

typedef enum {
    WIRE_ROLE_NONE = 0,
    WIRE_ROLE_TARGET = 1,
    WIRE_ROLE_DRAFTER = 2,
    WIRE_ROLE_CTL = 3,
    WIRE_ROLE_BROKER = 4,
} wire_role;

typedef enum { WIRE_BACKEND_NONE = 0, WIRE_BACKEND_HOST = 1, WIRE_BACKEND_CUDA = 2 } wire_backend;

typedef enum {
    WIRE_NONE = 0,
    WIRE_HELLO,
    WIRE_POOL_REGISTER,
    WIRE_WORK_REQUEST,
    WIRE_WORK_UNIT,
    WIRE_SLOT_READY,
    WIRE_CLAIM,
    WIRE_GRANT,
    WIRE_SLOT_RELEASE,
    WIRE_ACK,
    WIRE_CHECKPOINT_COMMITTED,
    WIRE_RESUME_FROM,
    WIRE_HEARTBEAT,
    WIRE_STATUS_REQUEST,
    WIRE_STATUS_REPLY,
    WIRE_SET_CONFIG,
    WIRE_SET_CONFIG_REPLY,
    WIRE_PAUSE,
    WIRE_RESUME,
    WIRE_DRAIN,
    WIRE_ERROR,
    WIRE_OK,
    WIRE_GROUP_JOIN,
    WIRE_GROUP_VIEW,
    WIRE_GROUP_SET_ID,
    WIRE_STEP_CLAIM,
    WIRE_STEP_GRANT,
    WIRE_STEP_DONE,
    WIRE_GROUP_LEAVE,
    WIRE_POOL_LEAVE,
    WIRE_POOL_LEFT,
    WIRE_RELEASE_QUARANTINE,
    WIRE_JOURNAL_SYNC, /* no body fields: the drafter's durability barrier */
    WIRE_TYPE_COUNT
} wire_type;

/* Identity of one batch. */
typedef struct wire_unit {
    uint32_t epoch;
    uint32_t bucket; /* < WIRE_MAX_BUCKETS */
    uint64_t index;
} wire_unit;

typedef struct wire_hello {
    char name[WIRE_MAX_NAME];
    uint32_t heartbeat_ms;     /* broker's reply: its heartbeat interval */
    uint32_t lease_timeout_ms; /* broker's reply: lease length */
    uint32_t n_held;           /* drafter re-registration: units in training, not acked */
    wire_unit held[WIRE_MAX_HELD];
    char pub_endpoint[WIRE_MAX_TEXT]; /* broker's reply: its PUB endpoint */
    uint32_t stats_interval_ms;       /* broker's reply: stats on PUB every N ms (0 = never) */
    uint64_t run_id; /* solo trainer registering again: the run whose resume was taken (0: none) */
} wire_hello;

typedef struct wire_pool {
    uint64_t pool_incarnation; /* non-zero */
    wire_backend backend;
    uint8_t mem_handle[WIRE_HANDLE_BYTES];          /* cuda */
    const uint8_t (*event_handles)[WIRE_HANDLE_BYTES]; /* cuda: n_events == slot_count */
    uint32_t n_events;
    int32_t device;
    char shm_name[WIRE_MAX_NAME];                   /* host */
    uint32_t slot_count;                            /* 1..WIRE_MAX_SLOTS */
    uint64_t slot_size;                             /* > 0 */
    uint32_t layout_version;
    uint32_t token_budget;
    uint32_t n_buckets;                             /* 1..WIRE_MAX_BUCKETS */
    uint32_t bucket_upper[WIRE_MAX_BUCKETS];        /* strictly ascending */
    double bucket_share[WIRE_MAX_BUCKETS];          /* in [0,1], sum within 1e-3 of 1 */
    uint64_t bucket_batches[WIRE_MAX_BUCKETS];
    uint32_t epochs;                                /* >= 1 */
    uint64_t plan_id; /* batch_plan_identity of the target's plan, when has_plan_id */
    bool has_plan_id; /* false: an old target that does not send it */
    /* Bit s set: slot s was published and not handed back since (re-registration after a broker
     * restart); the broker fences those slots. Only bits < slot_count may be set. */
    uint64_t busy[WIRE_MAX_SLOTS / 64];
    /* cuda: the pool's GPU by PCI bus id ("0000:1b:00.0"); "" unknown (older targets, host) */
    char gpu_bus_id[WIRE_BUS_ID_MAX];
} wire_pool;

/* Busy-slot bitmap helpers for wire_pool.busy. */
static inline void wire_pool_set_busy(wire_pool *p, uint32_t slot, bool busy)
{
    if (slot >= WIRE_MAX_SLOTS) return;
    if (busy) p->busy[slot / 64] |= 1ull << (slot % 64);
    else p->busy[slot / 64] &= ~(1ull << (slot % 64));
}
static inline bool wire_pool_is_busy(const wire_pool *p, uint32_t slot)
{
    return slot < WIRE_MAX_SLOTS && (p->busy[slot / 64] >> (slot % 64) & 1);
}

typedef struct wire_work_unit {
    wire_unit unit;
    uint32_t slot;
} wire_work_unit;

typedef struct wire_slot_ready {
    uint64_t pool_incarnation;
    uint32_t slot;
    wire_unit unit;
    uint32_t n_tokens;
    uint32_t n_seqs;
} wire_slot_ready;

typedef struct wire_grant {
    uint64_t lease_id;
    uint64_t deadline_ms; /* lease length from receipt, ms */
    uint64_t pool_incarnation;
    uint32_t slot;
    uint64_t offset;
    uint64_t size;
    uint32_t layout_version;
    wire_unit unit;
    uint32_t n_tokens;
    uint32_t n_seqs;
    wire_backend backend;
    uint8_t mem_handle[WIRE_HANDLE_BYTES];
    uint8_t event_handle[WIRE_HANDLE_BYTES];
    int32_t device;
    char shm_name[WIRE_MAX_NAME];
    char pool_name[WIRE_MAX_NAME]; /* the pool's target name; "" from an older broker */
    char gpu_bus_id[WIRE_BUS_ID_MAX]; /* cuda: the pool's GPU (PoolRegister's); "" unknown */
} wire_grant;

typedef struct wire_ack {
    wire_unit unit;
    uint64_t step;
} wire_ack;

typedef struct wire_bucket_stat {
    uint32_t upper;
    double share;
    uint32_t ready, leased, filling;
    double deficit;
    uint64_t produced, consumed;
    uint64_t produced_tokens, consumed_tokens;
} wire_bucket_stat;

/* A data-parallel drafter group as the status reply shows it. */
typedef enum { WIRE_GROUP_FORMING = 0, WIRE_GROUP_ACTIVE = 1, WIRE_GROUP_REFORMING = 2 } wire_group_state;

typedef struct wire_group_stat {
    char name[WIRE_MAX_NAME];
    uint64_t epoch;
    uint32_t world;
    uint64_t step;  /* the next optimizer step */
    uint32_t state; /* wire_group_state */
    uint32_t n_members; /* names listed (<= WIRE_MAX_STATUS_MEMBERS), rank order */
    char members[WIRE_MAX_STATUS_MEMBERS][WIRE_MAX_NAME];
    uint32_t pending; /* joiners waiting for a step boundary */
    uint64_t steps_done, steps_aborted;
    bool step_reserved;
    uint32_t micros;     /* micro-steps of the step in flight reserved (0: none in flight) */
    uint32_t accumulate; /* the group's micro-steps a step (0: an older broker) */
} wire_group_stat;

/* An orphaned step of a data-parallel group (every rank expired mid-step), as status shows it. */
typedef struct wire_orphan_stat {
    char group[WIRE_MAX_NAME];
    uint64_t step;
    uint32_t batches;     /* its units, in flight until it is resolved */
    uint64_t held_ms;     /* how long it has waited (counted again after a broker restart) */
    uint64_t abort_in_ms; /* left before the broker's group-hold-ms aborts it */
} wire_orphan_stat;

/* A live target or drafter as status lists it. */
typedef struct wire_peer_stat {
    char name[WIRE_MAX_NAME];
    uint32_t role;         /* wire_role: WIRE_ROLE_TARGET or WIRE_ROLE_DRAFTER */
    uint64_t heard_ms_ago; /* since its last message (heartbeats included) */
    uint32_t leases, held; /* drafter: slots granted, not released; batches in training */
    uint32_t slots;        /* target: its registered pool's slots (0: none yet) */
    bool trains;           /* drafter: a trainer (it said ResumeFrom) */
} wire_peer_stat;

typedef enum { WIRE_STATE_RUNNING = 0, WIRE_STATE_PAUSED = 1, WIRE_STATE_DRAINING = 2 } wire_run_state;

/* The broker's graceful stop as status shows it (wire_status.stopping): what it still waits for,
 * summed over its live drafters, and the same per drafter in words. */
typedef struct wire_stop_stat {
    uint64_t grace_ms, elapsed_ms; /* --stop-grace-ms; since the stop began */
    uint32_t drafters, leases, held, reports; /* all 0: settled, exiting */
    char waiting_for[WIRE_MAX_TEXT]; /* "drafter d (1 lease), ..." (cut with "...") */
} wire_stop_stat;

typedef struct wire_status {
    uint64_t uptime_ms;
    uint32_t state; /* wire_run_state */
    uint32_t min_ready, max_depth, lease_timeout_ms;
    uint32_t n_buckets;
    wire_bucket_stat buckets[WIRE_MAX_BUCKETS];
    double tv_distance, claims_per_s;
    uint64_t grants, releases, lease_expiries, redeliveries, quarantined, malformed, acks;
    uint64_t batches_todo, batches_inflight, batches_trained, batches_committed, batches_total;
    uint64_t committed_step;
    uint32_t peers, epoch, slot_count;
    uint64_t pool_incarnation;
    uint32_t n_groups; /* <= WIRE_MAX_GROUPS */
    wire_group_stat groups[WIRE_MAX_GROUPS];
    char journal_error[WIRE_MAX_TEXT]; /* "": the journal is healthy (or none); else why not */
    uint32_t n_orphans; /* <= WIRE_MAX_STATUS_ORPHANS; 0 from an older broker */
    wire_orphan_stat orphans[WIRE_MAX_STATUS_ORPHANS];
    bool stopping;       /* stopping gracefully (false from an older broker): stop is set */
    wire_stop_stat stop;
    /* refused since the broker started (0 from an older broker): hellos at --max-peers, replies
     * waiting for the journal dropped by its caps, requests naming another CURVE key's live
     * peer (its name, run or routing id), CURVE connections of a key not allowed (ZAP), steering
     * without an admin key */
    uint64_t hellos_refused_full, replies_dropped, key_refusals, connections_refused,
        steering_refused;
    /* live targets, then live drafters, of the request's peer_prefix (0 listed from an older
     * broker); beyond the list: */
    uint32_t n_peer_list; /* <= WIRE_MAX_STATUS_PEERS */
    wire_peer_stat peer_list[WIRE_MAX_STATUS_PEERS];
    uint32_t peers_unlisted;
} wire_status;

typedef struct wire_kv {
    char key[WIRE_MAX_KEY];
    char value[WIRE_MAX_VALUE];
} wire_kv;

typedef struct wire_settings {
    uint32_t n;
    wire_kv kv[WIRE_MAX_SETTINGS];
} wire_settings;

/* What a group join refused MISMATCH differs in (Error.mismatch). */
typedef enum wire_mismatch {
    WIRE_MISMATCH_NONE = 0,       /* not stated: another error, or an older broker (shape) */
    WIRE_MISMATCH_SHAPE = 1,      /* the joiner's drafter shape is not the group's */
    WIRE_MISMATCH_ACCUMULATE = 2, /* its --accumulate is not the group's (also when both are) */
} wire_mismatch;

typedef struct wire_error {
    int32_t code; /* negative DFLASH_E* code */
    char message[WIRE_MAX_TEXT];
    /* non-zero: a live process of this run replaced the sender, or trains the run it named
     * under another CURVE key */
    uint64_t replaced_by_run;
    uint32_t mismatch; /* a wire_mismatch: a GroupJoin's MISMATCH; an unknown value reads as 0 */
    bool other_key; /* DENIED: what the request names is a live peer's of another CURVE key */
    uint64_t committed_step; /* a GroupJoin held (AGAIN): the newest committed checkpoint's step;
                              * 0 = not stated */
} wire_error;

/* Data-parallel drafter groups (docs/protocol.md, "Groups"). Group names are non-empty. */
typedef struct wire_group_join {
    char group[WIRE_MAX_NAME];
    uint64_t step;         /* optimizer steps the member's model has taken */
    uint64_t failed_epoch; /* epoch whose collective failed at this member; 0 = none */
    uint32_t world_hint;   /* informational, <= WIRE_MAX_WORLD */
    bool has_gone_rank;    /* false: none seen (or an older drafter) */
    uint32_t gone_rank;    /* with has_gone_rank: the rank of failed_epoch whose process this
                            * member saw end; < WIRE_MAX_WORLD, failed_epoch set */
    uint64_t shape;        /* the drafter's layout hash (dflash_dp_layout_hash); 0 = not stated
                            * (an older drafter) */
    char shape_text[WIRE_MAX_SHAPE_TEXT]; /* the same in words; "" when not stated */
    uint32_t accumulate;   /* micro-steps per group step, 1..WIRE_MAX_WORLD; 0 = not stated
                            * (an older drafter: 1) */
    bool ends_when_drained; /* --exit-when-drained: a join with nothing left is answered
                             * SHUTDOWN (broker_on_group_join); false: a view (an older one) */
} wire_group_join;

typedef struct wire_group_view {
    char group[WIRE_MAX_NAME];
    uint64_t epoch; /* >= 1 */
    uint32_t rank, world; /* rank < world <= WIRE_MAX_WORLD */
    uint64_t step;  /* rank 0's model step; the next step is step + 1 */
    uint32_t id_len; /* 0 = rank 0 has not posted the id yet */
    uint8_t id[WIRE_GROUP_ID_BYTES];
} wire_group_view;

typedef struct wire_group_set_id {
    char group[WIRE_MAX_NAME];
    uint64_t epoch;
    uint32_t id_len; /* 1..WIRE_GROUP_ID_BYTES */
    uint8_t id[WIRE_GROUP_ID_BYTES];
} wire_group_set_id;

/* STEP_CLAIM and STEP_DONE; GROUP_LEAVE uses only group. */
typedef struct wire_group_step {
    char group[WIRE_MAX_NAME];
    uint64_t epoch, step; /* both >= 1 (not for GROUP_LEAVE) */
    uint32_t micro;       /* STEP_CLAIM: the micro-step, < WIRE_MAX_WORLD (0 when absent) */
} wire_group_step;

typedef struct wire_step_grant {
    uint64_t epoch, step;
    uint32_t rank, world;
    wire_grant grant;   /* this rank's slot, with its own lease */
    uint32_t n_units;   /* == world */
    wire_unit units[WIRE_MAX_WORLD]; /* the micro-step's units in rank order */
    bool has_micro;     /* false: an older broker (no accumulation in groups) */
    uint32_t micro;     /* the claim's micro-step, < WIRE_MAX_WORLD */
} wire_step_grant;

/* The broker's answer to a target's leave (POOL_LEFT): slots of its pool given back by this
 * leave (their batches back to to-do; 0 when it asks again) and slots drafters still copy. Each
 * <= WIRE_MAX_SLOTS. */
typedef struct wire_pool_left {
    uint32_t ready, filling;   /* given back now */
    uint32_t leased;           /* still being copied: keep the memory and ask again */
    uint32_t lease_timeout_ms; /* the broker's lease timeout now (0: an older broker) */
} wire_pool_left;

/* RELEASE_QUARANTINE (an operator's): every quarantined batch back to to-do, or the one named. */
typedef struct wire_release_quarantine {
    bool all;
    wire_unit unit; /* when !all */
} wire_release_quarantine;

/* One envelope. Only the member of `u` named by `type` is meaningful. */
typedef struct wire_msg {
    uint32_t version;
    wire_role role;
    uint64_t incarnation;
    uint64_t request_id;
    wire_type type;
    union {
        wire_hello hello;
        wire_pool pool;
        uint64_t pool_incarnation; /* WORK_REQUEST, POOL_LEAVE */
        wire_work_unit work;
        wire_slot_ready ready;
        wire_grant grant;
        struct {
            uint64_t lease_id;   /* SLOT_RELEASE */
            bool release_unread; /* SLOT_RELEASE: given back unread (protocol.md) */
        };
        wire_ack ack;
        struct {
            uint64_t step;   /* CHECKPOINT_COMMITTED, RESUME_FROM */
            uint64_t run_id; /* RESUME_FROM: the trainer's run, 0 = not said (an old drafter) */
        };
        uint64_t sent_ms;   /* HEARTBEAT */
        char peer_prefix[WIRE_MAX_NAME]; /* STATUS_REQUEST: list only these peers ("": all) */
        wire_status status; /* STATUS_REPLY */
        wire_settings settings; /* SET_CONFIG, SET_CONFIG_REPLY */
        wire_error error;
        uint64_t value; /* OK */
        wire_group_join join;     /* GROUP_JOIN */
        wire_group_view view;     /* GROUP_VIEW */
        wire_group_set_id set_id; /* GROUP_SET_ID */
        wire_group_step gstep;    /* STEP_CLAIM, STEP_DONE, GROUP_LEAVE */
        wire_step_grant sgrant;   /* STEP_GRANT */
        wire_pool_left left;      /* POOL_LEFT */
        wire_release_quarantine release_q; /* RELEASE_QUARANTINE */
    } u;
    void *owned_; /* wire.c's allocation (pool.event_handles after unpack) */
} wire_msg;

/* Starts msg as an envelope of `type` from (role, incarnation) with request id `rid`; zeroes
 * the body. Always succeeds. */
void wire_msg_init(wire_msg *msg, wire_type type, wire_role role, uint64_t incarnation,
                   uint64_t rid);
/* Frees what wire_unpack allocated inside msg (safe on an init'ed or cleared msg). */
void wire_msg_clear(wire_msg *msg);

/* Range-checks msg as wire_unpack would. Returns 0, DFLASH_EPROTO/ERANGE/EVERSION and a reason
 * in why (may be NULL). */
int wire_check(const wire_msg *msg, char *why, size_t why_len);

/* Packs msg (after wire_check) into buf. Returns the packed length (> 0), or DFLASH_EINVAL /
 * DFLASH_ERANGE when msg fails wire_check, DFLASH_EFULL when cap is too small. */
int wire_pack(const wire_msg *msg, uint8_t *buf, size_t cap);

/* Unpacks and range-checks len bytes. On success returns 0 and fills *msg (call wire_msg_clear
 * later). On failure returns DFLASH_EPROTO (not a valid envelope, too big, empty),
 * DFLASH_EVERSION or DFLASH_ERANGE with a reason in why (may be NULL); *msg then holds whatever
 * header fields could be read (request_id for the ERROR reply) and needs no clear. */
int wire_unpack(const uint8_t *buf, size_t len, wire_msg *msg, char *why, size_t why_len);

/* "hello", "grant", ... ; "unknown" for out-of-range values. */
const char *wire_type_name(wire_type t);
const char *wire_role_name(wire_role r);

/* A random non-zero 64-bit incarnation id (from getrandom, falling back to time ^ pid). */
uint64_t wire_new_incarnation(void);

#endif
