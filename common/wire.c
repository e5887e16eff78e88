/* wire: see wire.h. Conversion between protobuf-c's generated structs and the plain wire_msg.
 *
 * pack: builds the generated structs on the stack pointing into the caller's wire_msg (nothing
 * is allocated; repeated sub-messages use fixed pointer arrays sized by the WIRE_MAX_* bounds),
 * then packs into the caller's buffer. unpack: size bound, protobuf-c unpack, copy into wire_msg
 * with per-string/bytes length checks, free the generated tree, then wire_check for semantics.
 * Thread: pure; any thread.
 */
#include "wire.h"
#include "err.h"
#include "pool_reach.h"

#include "dflash.pb-c.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

_Static_assert(WIRE_BUS_ID_MAX == POOL_BUS_ID_MAX, "a pool's GPU bus id travels in the protocol");
#include <unistd.h>

static const char *const type_names[WIRE_TYPE_COUNT] = {
    "none", "hello", "pool_register", "work_request", "work_unit", "slot_ready", "claim", "grant",
    "slot_release", "ack", "checkpoint_committed", "resume_from", "heartbeat", "status_request",
    "status_reply", "set_config", "set_config_reply", "pause", "resume", "drain", "error", "ok",
    "group_join", "group_view", "group_set_id", "step_claim", "step_grant", "step_done",
    "group_leave", "pool_leave", "pool_left", "release_quarantine", "journal_sync",
};

/* wire_type <-> body case; index is wire_type. */
static const Dflash__Envelope__BodyCase body_cases[WIRE_TYPE_COUNT] = {
    DFLASH__ENVELOPE__BODY__NOT_SET,
    DFLASH__ENVELOPE__BODY_HELLO,
    DFLASH__ENVELOPE__BODY_POOL_REGISTER,
    DFLASH__ENVELOPE__BODY_WORK_REQUEST,
    DFLASH__ENVELOPE__BODY_WORK_UNIT,
    DFLASH__ENVELOPE__BODY_SLOT_READY,
    DFLASH__ENVELOPE__BODY_CLAIM,
    DFLASH__ENVELOPE__BODY_GRANT,
    DFLASH__ENVELOPE__BODY_SLOT_RELEASE,
    DFLASH__ENVELOPE__BODY_ACK,
    DFLASH__ENVELOPE__BODY_CHECKPOINT_COMMITTED,
    DFLASH__ENVELOPE__BODY_RESUME_FROM,
    DFLASH__ENVELOPE__BODY_HEARTBEAT,
    DFLASH__ENVELOPE__BODY_STATUS_REQUEST,
    DFLASH__ENVELOPE__BODY_STATUS_REPLY,
    DFLASH__ENVELOPE__BODY_SET_CONFIG,
    DFLASH__ENVELOPE__BODY_SET_CONFIG_REPLY,
    DFLASH__ENVELOPE__BODY_PAUSE,
    DFLASH__ENVELOPE__BODY_RESUME,
    DFLASH__ENVELOPE__BODY_DRAIN,
    DFLASH__ENVELOPE__BODY_ERROR,
    DFLASH__ENVELOPE__BODY_OK,
    DFLASH__ENVELOPE__BODY_GROUP_JOIN,
    DFLASH__ENVELOPE__BODY_GROUP_VIEW,
    DFLASH__ENVELOPE__BODY_GROUP_SET_ID,
    DFLASH__ENVELOPE__BODY_STEP_CLAIM,
    DFLASH__ENVELOPE__BODY_STEP_GRANT,
    DFLASH__ENVELOPE__BODY_STEP_DONE,
    DFLASH__ENVELOPE__BODY_GROUP_LEAVE,
    DFLASH__ENVELOPE__BODY_POOL_LEAVE,
    DFLASH__ENVELOPE__BODY_POOL_LEFT,
    DFLASH__ENVELOPE__BODY_RELEASE_QUARANTINE,
    DFLASH__ENVELOPE__BODY_JOURNAL_SYNC,
};

const char *wire_type_name(wire_type t)
{
    return (unsigned)t < WIRE_TYPE_COUNT ? type_names[t] : "unknown";
}

const char *wire_role_name(wire_role r)
{
    static const char *const n[] = {"none", "target", "drafter", "ctl", "broker"};
    return (unsigned)r < 5 ? n[r] : "unknown";
}

uint64_t wire_new_incarnation(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    return v ? v : 1;
}

void wire_msg_init(wire_msg *m, wire_type t, wire_role r, uint64_t inc, uint64_t rid)
{
    memset(m, 0, sizeof *m);
    m->version = WIRE_VERSION;
    m->type = t;
    m->role = r;
    m->incarnation = inc;
    m->request_id = rid;
}

void wire_msg_clear(wire_msg *m)
{
    if (!m) return;
    free(m->owned_);
    m->owned_ = NULL;
    if (m->type == WIRE_POOL_REGISTER) {
        m->u.pool.event_handles = NULL;
        m->u.pool.n_events = 0;
    }
}

static int fail(char *why, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *why, size_t len, int code, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* --- semantic checks ------------------------------------------------------------------------ */

static int check_unit(const wire_unit *u, char *why, size_t len)
{
    if (u->bucket >= WIRE_MAX_BUCKETS)
        return fail(why, len, DFLASH_ERANGE, "unit bucket %u >= %u", u->bucket, WIRE_MAX_BUCKETS);
    if (u->index > UINT32_MAX)
        return fail(why, len, DFLASH_ERANGE, "unit index %llu too large",
                    (unsigned long long)u->index);
    return 0;
}

static bool terminated(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

static int check_grant(const wire_grant *g, char *why, size_t len)
{
    if (!g->lease_id || g->slot >= WIRE_MAX_SLOTS || !g->size)
        return fail(why, len, DFLASH_ERANGE, "grant lease/slot/size");
    if (g->backend != WIRE_BACKEND_HOST && g->backend != WIRE_BACKEND_CUDA)
        return fail(why, len, DFLASH_ERANGE, "grant backend %d", (int)g->backend);
    if (!terminated(g->shm_name, sizeof g->shm_name))
        return fail(why, len, DFLASH_ERANGE, "shm name");
    if (!terminated(g->pool_name, sizeof g->pool_name))
        return fail(why, len, DFLASH_ERANGE, "pool name");
    if (!pool_bus_id_valid(g->gpu_bus_id, sizeof g->gpu_bus_id))
        return fail(why, len, DFLASH_ERANGE, "grant GPU bus id is not a PCI bus id");
    return check_unit(&g->unit, why, len);
}

/* A group name: non-empty and NUL-terminated within its array. */
static int check_group_name(const char *name, char *why, size_t len)
{
    if (!terminated(name, WIRE_MAX_NAME) || !name[0])
        return fail(why, len, DFLASH_ERANGE, "group name empty or longer than %d",
                    WIRE_MAX_NAME - 1);
    return 0;
}

static int check_group(const wire_msg *m, char *why, size_t len)
{
    int rc;
    switch (m->type) {
    case WIRE_GROUP_JOIN:
        if (m->u.join.world_hint > WIRE_MAX_WORLD)
            return fail(why, len, DFLASH_ERANGE, "world hint %u > %u", m->u.join.world_hint,
                        WIRE_MAX_WORLD);
        if (m->u.join.has_gone_rank && m->u.join.gone_rank >= WIRE_MAX_WORLD)
            return fail(why, len, DFLASH_ERANGE, "gone rank %u >= %u", m->u.join.gone_rank,
                        WIRE_MAX_WORLD);
        if (m->u.join.has_gone_rank && !m->u.join.failed_epoch)
            return fail(why, len, DFLASH_ERANGE, "gone rank %u without a failed epoch",
                        m->u.join.gone_rank);
        if (!terminated(m->u.join.shape_text, WIRE_MAX_SHAPE_TEXT))
            return fail(why, len, DFLASH_ERANGE, "shape text longer than %d",
                        WIRE_MAX_SHAPE_TEXT - 1);
        if (m->u.join.accumulate > WIRE_MAX_WORLD)
            return fail(why, len, DFLASH_ERANGE, "accumulate %u > %u", m->u.join.accumulate,
                        WIRE_MAX_WORLD);
        return check_group_name(m->u.join.group, why, len);
    case WIRE_GROUP_VIEW: {
        const wire_group_view *v = &m->u.view;
        if (!v->epoch || !v->world || v->world > WIRE_MAX_WORLD || v->rank >= v->world)
            return fail(why, len, DFLASH_ERANGE, "view epoch %llu rank %u world %u",
                        (unsigned long long)v->epoch, v->rank, v->world);
        if (v->id_len > WIRE_GROUP_ID_BYTES)
            return fail(why, len, DFLASH_ERANGE, "group id of %u bytes > %u", v->id_len,
                        WIRE_GROUP_ID_BYTES);
        return check_group_name(v->group, why, len);
    }
    case WIRE_GROUP_SET_ID:
        if (!m->u.set_id.epoch) return fail(why, len, DFLASH_ERANGE, "epoch 0");
        if (!m->u.set_id.id_len || m->u.set_id.id_len > WIRE_GROUP_ID_BYTES)
            return fail(why, len, DFLASH_ERANGE, "group id of %u bytes (want 1..%u)",
                        m->u.set_id.id_len, WIRE_GROUP_ID_BYTES);
        return check_group_name(m->u.set_id.group, why, len);
    case WIRE_STEP_CLAIM:
    case WIRE_STEP_DONE:
        if (!m->u.gstep.epoch || !m->u.gstep.step)
            return fail(why, len, DFLASH_ERANGE, "epoch %llu step %llu (both must be >= 1)",
                        (unsigned long long)m->u.gstep.epoch,
                        (unsigned long long)m->u.gstep.step);
        if (m->u.gstep.micro >= WIRE_MAX_WORLD)
            return fail(why, len, DFLASH_ERANGE, "micro-step %u >= %u", m->u.gstep.micro,
                        WIRE_MAX_WORLD);
        return check_group_name(m->u.gstep.group, why, len);
    case WIRE_GROUP_LEAVE: return check_group_name(m->u.gstep.group, why, len);
    case WIRE_STEP_GRANT: {
        const wire_step_grant *g = &m->u.sgrant;
        if (!g->epoch || !g->step || !g->world || g->world > WIRE_MAX_WORLD ||
            g->rank >= g->world || g->n_units != g->world || g->micro >= WIRE_MAX_WORLD)
            return fail(why, len, DFLASH_ERANGE, "step grant epoch/step/rank %u/world %u/%u units",
                        g->rank, g->world, g->n_units);
        for (uint32_t i = 0; i < g->n_units; i++)
            if ((rc = check_unit(&g->units[i], why, len))) return rc;
        return check_grant(&g->grant, why, len);
    }
    default: return 0;
    }
}

static int check_pool(const wire_pool *p, char *why, size_t len)
{
    if (!p->pool_incarnation) return fail(why, len, DFLASH_ERANGE, "pool incarnation 0");
    if (p->slot_count < 1 || p->slot_count > WIRE_MAX_SLOTS)
        return fail(why, len, DFLASH_ERANGE, "slot count %u outside [1, %u]", p->slot_count,
                    WIRE_MAX_SLOTS);
    if (!p->slot_size || p->slot_size > (1ull << 40))
        return fail(why, len, DFLASH_ERANGE, "slot size %llu", (unsigned long long)p->slot_size);
    if (p->backend == WIRE_BACKEND_CUDA) {
        if (p->n_events != p->slot_count)
            return fail(why, len, DFLASH_ERANGE, "%u event handles for %u slots", p->n_events,
                        p->slot_count);
        if (p->device < 0 || p->device > 1024)
            return fail(why, len, DFLASH_ERANGE, "device %d", p->device);
        if (!pool_bus_id_valid(p->gpu_bus_id, sizeof p->gpu_bus_id))
            return fail(why, len, DFLASH_ERANGE, "pool GPU bus id is not a PCI bus id");
    } else if (p->backend == WIRE_BACKEND_HOST) {
        if (!terminated(p->shm_name, sizeof p->shm_name) || p->shm_name[0] != '/')
            return fail(why, len, DFLASH_ERANGE, "host pool needs an shm name starting with /");
        if (p->n_events) return fail(why, len, DFLASH_ERANGE, "host pool with event handles");
    } else {
        return fail(why, len, DFLASH_ERANGE, "unknown backend %d", (int)p->backend);
    }
    if (p->n_buckets < 1 || p->n_buckets > WIRE_MAX_BUCKETS)
        return fail(why, len, DFLASH_ERANGE, "%u buckets outside [1, %u]", p->n_buckets,
                    WIRE_MAX_BUCKETS);
    double sum = 0;
    for (uint32_t b = 0; b < p->n_buckets; b++) {
        if (!p->bucket_upper[b] || (b && p->bucket_upper[b] <= p->bucket_upper[b - 1]))
            return fail(why, len, DFLASH_ERANGE, "bucket bounds must be positive and ascending");
        double s = p->bucket_share[b];
        if (!isfinite(s) || s < 0 || s > 1)
            return fail(why, len, DFLASH_ERANGE, "bucket %u share %g outside [0, 1]", b, s);
        sum += s;
        if (!p->bucket_batches[b] || p->bucket_batches[b] > UINT32_MAX)
            return fail(why, len, DFLASH_ERANGE, "bucket %u batch count %llu", b,
                        (unsigned long long)p->bucket_batches[b]);
    }
    if (fabs(sum - 1.0) > 1e-3) return fail(why, len, DFLASH_ERANGE, "shares sum to %g", sum);
    if (p->epochs < 1) return fail(why, len, DFLASH_ERANGE, "epochs must be >= 1");
    for (uint32_t s = p->slot_count; s < WIRE_MAX_SLOTS; s++)
        if (wire_pool_is_busy(p, s))
            return fail(why, len, DFLASH_ERANGE, "busy slot %u >= slot count %u", s,
                        p->slot_count);
    return 0;
}

int wire_check(const wire_msg *m, char *why, size_t len)
{
    if (m->version != WIRE_VERSION)
        return fail(why, len, DFLASH_EVERSION, "protocol version %u, this peer speaks %u",
                    m->version, WIRE_VERSION);
    if ((unsigned)m->role > WIRE_ROLE_BROKER || m->role == WIRE_ROLE_NONE)
        return fail(why, len, DFLASH_ERANGE, "role %d", (int)m->role);
    if (!m->incarnation) return fail(why, len, DFLASH_ERANGE, "incarnation 0");
    if (m->type <= WIRE_NONE || m->type >= WIRE_TYPE_COUNT)
        return fail(why, len, DFLASH_EPROTO, "no body");
    int rc;
    switch (m->type) {
    case WIRE_HELLO:
        if (!terminated(m->u.hello.name, sizeof m->u.hello.name) ||
            !terminated(m->u.hello.pub_endpoint, sizeof m->u.hello.pub_endpoint))
            return fail(why, len, DFLASH_ERANGE, "hello name too long");
        if (m->u.hello.n_held > WIRE_MAX_HELD)
            return fail(why, len, DFLASH_ERANGE, "%u held units > %u", m->u.hello.n_held,
                        WIRE_MAX_HELD);
        for (uint32_t i = 0; i < m->u.hello.n_held; i++)
            if ((rc = check_unit(&m->u.hello.held[i], why, len))) return rc;
        return 0;
    case WIRE_POOL_REGISTER: return check_pool(&m->u.pool, why, len);
    case WIRE_WORK_UNIT:
        if (m->u.work.slot >= WIRE_MAX_SLOTS)
            return fail(why, len, DFLASH_ERANGE, "slot %u", m->u.work.slot);
        return check_unit(&m->u.work.unit, why, len);
    case WIRE_SLOT_READY:
        if (!m->u.ready.pool_incarnation) return fail(why, len, DFLASH_ERANGE, "incarnation 0");
        if (m->u.ready.slot >= WIRE_MAX_SLOTS)
            return fail(why, len, DFLASH_ERANGE, "slot %u", m->u.ready.slot);
        if (!m->u.ready.n_tokens || !m->u.ready.n_seqs || m->u.ready.n_seqs > m->u.ready.n_tokens)
            return fail(why, len, DFLASH_ERANGE, "n_tokens %u n_seqs %u", m->u.ready.n_tokens,
                        m->u.ready.n_seqs);
        return check_unit(&m->u.ready.unit, why, len);
    case WIRE_GRANT: return check_grant(&m->u.grant, why, len);
    case WIRE_POOL_LEAVE:
        if (!m->u.pool_incarnation) return fail(why, len, DFLASH_ERANGE, "incarnation 0");
        return 0;
    case WIRE_POOL_LEFT:
        if (m->u.left.ready > WIRE_MAX_SLOTS || m->u.left.filling > WIRE_MAX_SLOTS ||
            m->u.left.leased > WIRE_MAX_SLOTS)
            return fail(why, len, DFLASH_ERANGE, "pool left: %u ready, %u filling, %u leased",
                        m->u.left.ready, m->u.left.filling, m->u.left.leased);
        return 0;
    case WIRE_SLOT_RELEASE:
        if (!m->u.lease_id) return fail(why, len, DFLASH_ERANGE, "lease id 0");
        return 0;
    case WIRE_ACK: return check_unit(&m->u.ack.unit, why, len);
    case WIRE_RELEASE_QUARANTINE:
        return m->u.release_q.all ? 0 : check_unit(&m->u.release_q.unit, why, len);
    case WIRE_STATUS_REQUEST:
        if (!terminated(m->u.peer_prefix, WIRE_MAX_NAME))
            return fail(why, len, DFLASH_ERANGE, "status request: peer_prefix not terminated");
        return 0;
    case WIRE_STATUS_REPLY:
        if (m->u.status.n_buckets > WIRE_MAX_BUCKETS)
            return fail(why, len, DFLASH_ERANGE, "%u buckets", m->u.status.n_buckets);
        if (m->u.status.n_groups > WIRE_MAX_GROUPS)
            return fail(why, len, DFLASH_ERANGE, "%u groups", m->u.status.n_groups);
        for (uint32_t i = 0; i < m->u.status.n_groups; i++) {
            const wire_group_stat *g = &m->u.status.groups[i];
            if (g->n_members > WIRE_MAX_STATUS_MEMBERS || !terminated(g->name, sizeof g->name))
                return fail(why, len, DFLASH_ERANGE, "group %u: name or members", i);
            for (uint32_t k = 0; k < g->n_members; k++)
                if (!terminated(g->members[k], WIRE_MAX_NAME))
                    return fail(why, len, DFLASH_ERANGE, "group %u: member name", i);
        }
        if (m->u.status.n_orphans > WIRE_MAX_STATUS_ORPHANS)
            return fail(why, len, DFLASH_ERANGE, "%u orphaned steps", m->u.status.n_orphans);
        for (uint32_t i = 0; i < m->u.status.n_orphans; i++)
            if (!terminated(m->u.status.orphans[i].group, WIRE_MAX_NAME))
                return fail(why, len, DFLASH_ERANGE, "orphaned step %u: group name", i);
        if (m->u.status.stopping && !terminated(m->u.status.stop.waiting_for, WIRE_MAX_TEXT))
            return fail(why, len, DFLASH_ERANGE, "stopping: waiting_for not terminated");
        if (m->u.status.n_peer_list > WIRE_MAX_STATUS_PEERS)
            return fail(why, len, DFLASH_ERANGE, "%u peers listed", m->u.status.n_peer_list);
        for (uint32_t i = 0; i < m->u.status.n_peer_list; i++)
            if (!terminated(m->u.status.peer_list[i].name, WIRE_MAX_NAME))
                return fail(why, len, DFLASH_ERANGE, "listed peer %u: name", i);
        return 0;
    case WIRE_GROUP_JOIN:
    case WIRE_GROUP_VIEW:
    case WIRE_GROUP_SET_ID:
    case WIRE_STEP_CLAIM:
    case WIRE_STEP_GRANT:
    case WIRE_STEP_DONE:
    case WIRE_GROUP_LEAVE: return check_group(m, why, len);
    case WIRE_SET_CONFIG:
    case WIRE_SET_CONFIG_REPLY:
        if (m->u.settings.n > WIRE_MAX_SETTINGS)
            return fail(why, len, DFLASH_ERANGE, "%u settings > %u", m->u.settings.n,
                        WIRE_MAX_SETTINGS);
        for (uint32_t i = 0; i < m->u.settings.n; i++) {
            const wire_kv *kv = &m->u.settings.kv[i];
            if (!terminated(kv->key, sizeof kv->key) || !terminated(kv->value, sizeof kv->value) ||
                !kv->key[0])
                return fail(why, len, DFLASH_ERANGE, "setting %u: empty or too long", i);
        }
        return 0;
    case WIRE_ERROR:
        if (m->u.error.code > 0 || m->u.error.code < -1000 ||
            !terminated(m->u.error.message, sizeof m->u.error.message))
            return fail(why, len, DFLASH_ERANGE, "error code %d", m->u.error.code);
        if (m->u.error.mismatch > WIRE_MISMATCH_ACCUMULATE)
            return fail(why, len, DFLASH_ERANGE, "error mismatch %u", m->u.error.mismatch);
        return 0;
    default: return 0;
    }
}

/* --- pack ----------------------------------------------------------------------------------- */

static void unit_to_pb(Dflash__Unit *pb, const wire_unit *u)
{
    dflash__unit__init(pb);
    pb->has_epoch = pb->has_bucket = pb->has_index = 1;
    pb->epoch = u->epoch;
    pb->bucket = u->bucket;
    pb->index = u->index;
}

static ProtobufCBinaryData bin(const uint8_t *p, size_t n)
{
    ProtobufCBinaryData b = {n, (uint8_t *)p};
    return b;
}

static void grant_to_pb(Dflash__Grant *pb, Dflash__Unit *unit_pb, const wire_grant *g)
{
    dflash__grant__init(pb);
    pb->has_lease_id = pb->has_deadline_ms = pb->has_pool_incarnation = 1;
    pb->lease_id = g->lease_id;
    pb->deadline_ms = g->deadline_ms;
    pb->pool_incarnation = g->pool_incarnation;
    pb->has_slot = pb->has_offset = pb->has_size = pb->has_layout_version = 1;
    pb->slot = g->slot;
    pb->offset = g->offset;
    pb->size = g->size;
    pb->layout_version = g->layout_version;
    unit_to_pb(unit_pb, &g->unit);
    pb->unit = unit_pb;
    pb->has_n_tokens = pb->has_n_seqs = pb->has_backend = 1;
    pb->n_tokens = g->n_tokens;
    pb->n_seqs = g->n_seqs;
    pb->backend = (Dflash__Backend)g->backend;
    if (g->backend == WIRE_BACKEND_CUDA) {
        pb->has_mem_handle = pb->has_event_handle = pb->has_device = 1;
        pb->mem_handle = bin(g->mem_handle, WIRE_HANDLE_BYTES);
        pb->event_handle = bin(g->event_handle, WIRE_HANDLE_BYTES);
        pb->device = g->device;
        if (g->gpu_bus_id[0]) pb->gpu_bus_id = (char *)g->gpu_bus_id;
    } else {
        pb->shm_name = (char *)g->shm_name;
    }
    if (g->pool_name[0]) pb->pool_name = (char *)g->pool_name;
}

int wire_pack(const wire_msg *m, uint8_t *buf, size_t cap)
{
    char why[128];
    int rc = wire_check(m, why, sizeof why);
    if (rc) return rc == DFLASH_EVERSION ? DFLASH_EINVAL : rc;

    Dflash__Envelope env;
    dflash__envelope__init(&env);
    env.has_version = env.has_role = env.has_incarnation = env.has_request_id = 1;
    env.version = m->version;
    env.role = (Dflash__Role)m->role;
    env.incarnation = m->incarnation;
    env.request_id = m->request_id;
    env.body_case = body_cases[m->type];

    /* Every body lives on this stack frame; only the one in use is touched. */
    Dflash__Hello hello;
    Dflash__Unit held_pb[WIRE_MAX_HELD];
    Dflash__Unit *held_ptr[WIRE_MAX_HELD];
    Dflash__PoolRegister pool;
    ProtobufCBinaryData *events = NULL;
    uint32_t busy_list[WIRE_MAX_SLOTS];
    uint64_t batches[WIRE_MAX_BUCKETS];
    Dflash__WorkRequest wreq;
    Dflash__WorkUnit work;
    Dflash__SlotReady ready;
    Dflash__Claim claim;
    Dflash__Grant grant;
    Dflash__SlotRelease rel;
    Dflash__Ack ack;
    Dflash__CheckpointCommitted ckpt;
    Dflash__ResumeFrom resume_from;
    Dflash__Heartbeat hb;
    Dflash__StatusRequest sreq;
    Dflash__StatusReply st;
    Dflash__BucketStat bs_pb[WIRE_MAX_BUCKETS];
    Dflash__BucketStat *bs_ptr[WIRE_MAX_BUCKETS];
    Dflash__SetConfig setc;
    Dflash__SetConfigReply setr;
    Dflash__KeyValue kv_pb[WIRE_MAX_SETTINGS];
    Dflash__KeyValue *kv_ptr[WIRE_MAX_SETTINGS];
    Dflash__Pause pause;
    Dflash__Resume resume;
    Dflash__Drain drain;
    Dflash__Error error;
    Dflash__Ok ok;
    Dflash__Unit unit_pb;
    Dflash__GroupStat gs_pb[WIRE_MAX_GROUPS];
    Dflash__GroupStat *gs_ptr[WIRE_MAX_GROUPS];
    char *gs_members[WIRE_MAX_GROUPS][WIRE_MAX_STATUS_MEMBERS];
    Dflash__OrphanStat os_pb[WIRE_MAX_STATUS_ORPHANS];
    Dflash__OrphanStat *os_ptr[WIRE_MAX_STATUS_ORPHANS];
    Dflash__PeerStat ps_pb[WIRE_MAX_STATUS_PEERS];
    Dflash__PeerStat *ps_ptr[WIRE_MAX_STATUS_PEERS];
    Dflash__StopStat stop;
    Dflash__GroupJoin gjoin;
    Dflash__GroupView gview;
    Dflash__GroupSetId gsetid;
    Dflash__StepClaim sclaim;
    Dflash__StepGrant sgrant;
    Dflash__StepDone sdone;
    Dflash__GroupLeave gleave;
    Dflash__PoolLeave pleave;
    Dflash__PoolLeft pleft;
    Dflash__ReleaseQuarantine relq;
    Dflash__JournalSync jsync;
    Dflash__Unit su_pb[WIRE_MAX_WORLD];
    Dflash__Unit *su_ptr[WIRE_MAX_WORLD];
    (void)batches;

    switch (m->type) {
    case WIRE_HELLO: {
        const wire_hello *h = &m->u.hello;
        dflash__hello__init(&hello);
        hello.name = (char *)h->name;
        if (h->heartbeat_ms) hello.has_heartbeat_ms = 1, hello.heartbeat_ms = h->heartbeat_ms;
        if (h->lease_timeout_ms)
            hello.has_lease_timeout_ms = 1, hello.lease_timeout_ms = h->lease_timeout_ms;
        for (uint32_t i = 0; i < h->n_held; i++) {
            unit_to_pb(&held_pb[i], &h->held[i]);
            held_ptr[i] = &held_pb[i];
        }
        hello.n_held = h->n_held;
        hello.held = held_ptr;
        if (h->pub_endpoint[0]) hello.pub_endpoint = (char *)h->pub_endpoint;
        if (h->stats_interval_ms)
            hello.has_stats_interval_ms = 1, hello.stats_interval_ms = h->stats_interval_ms;
        if (h->run_id) hello.has_run_id = 1, hello.run_id = h->run_id;
        env.hello = &hello;
        break;
    }
    case WIRE_POOL_REGISTER: {
        const wire_pool *p = &m->u.pool;
        dflash__pool_register__init(&pool);
        pool.has_pool_incarnation = pool.has_backend = pool.has_slot_count = 1;
        pool.pool_incarnation = p->pool_incarnation;
        pool.backend = (Dflash__Backend)p->backend;
        pool.slot_count = p->slot_count;
        pool.has_slot_size = pool.has_layout_version = pool.has_token_budget = 1;
        pool.slot_size = p->slot_size;
        pool.layout_version = p->layout_version;
        pool.token_budget = p->token_budget;
        pool.has_epochs = 1;
        pool.epochs = p->epochs;
        pool.has_plan_id = p->has_plan_id;
        pool.plan_id = p->plan_id;
        if (p->backend == WIRE_BACKEND_CUDA) {
            pool.has_mem_handle = pool.has_device = 1;
            pool.mem_handle = bin(p->mem_handle, WIRE_HANDLE_BYTES);
            pool.device = p->device;
            if (p->gpu_bus_id[0]) pool.gpu_bus_id = (char *)p->gpu_bus_id;
            events = malloc(sizeof *events * (p->n_events ? p->n_events : 1));
            if (!events) return DFLASH_ENOMEM;
            for (uint32_t i = 0; i < p->n_events; i++)
                events[i] = bin(p->event_handles[i], WIRE_HANDLE_BYTES);
            pool.n_event_handles = p->n_events;
            pool.event_handles = events;
        } else {
            pool.shm_name = (char *)p->shm_name;
        }
        pool.n_bucket_upper = pool.n_bucket_share = pool.n_bucket_batches = p->n_buckets;
        pool.bucket_upper = (uint32_t *)p->bucket_upper;
        pool.bucket_share = (double *)p->bucket_share;
        pool.bucket_batches = (uint64_t *)p->bucket_batches;
        pool.n_busy_slots = 0;
        for (uint32_t i = 0; i < p->slot_count && i < WIRE_MAX_SLOTS; i++)
            if (wire_pool_is_busy(p, i)) busy_list[pool.n_busy_slots++] = i;
        pool.busy_slots = busy_list;
        env.pool_register = &pool;
        break;
    }
    case WIRE_WORK_REQUEST:
        dflash__work_request__init(&wreq);
        wreq.has_pool_incarnation = 1;
        wreq.pool_incarnation = m->u.pool_incarnation;
        env.work_request = &wreq;
        break;
    case WIRE_WORK_UNIT:
        dflash__work_unit__init(&work);
        unit_to_pb(&unit_pb, &m->u.work.unit);
        work.unit = &unit_pb;
        work.has_slot = 1;
        work.slot = m->u.work.slot;
        env.work_unit = &work;
        break;
    case WIRE_SLOT_READY: {
        const wire_slot_ready *r = &m->u.ready;
        dflash__slot_ready__init(&ready);
        ready.has_pool_incarnation = ready.has_slot = ready.has_n_tokens = ready.has_n_seqs = 1;
        ready.pool_incarnation = r->pool_incarnation;
        ready.slot = r->slot;
        ready.n_tokens = r->n_tokens;
        ready.n_seqs = r->n_seqs;
        unit_to_pb(&unit_pb, &r->unit);
        ready.unit = &unit_pb;
        env.slot_ready = &ready;
        break;
    }
    case WIRE_CLAIM:
        dflash__claim__init(&claim);
        env.claim = &claim;
        break;
    case WIRE_GRANT:
        grant_to_pb(&grant, &unit_pb, &m->u.grant);
        env.grant = &grant;
        break;
    case WIRE_SLOT_RELEASE:
        dflash__slot_release__init(&rel);
        rel.has_lease_id = 1;
        rel.lease_id = m->u.lease_id;
        rel.has_unread = m->u.release_unread;
        rel.unread = m->u.release_unread;
        env.slot_release = &rel;
        break;
    case WIRE_ACK:
        dflash__ack__init(&ack);
        unit_to_pb(&unit_pb, &m->u.ack.unit);
        ack.unit = &unit_pb;
        ack.has_step = 1;
        ack.step = m->u.ack.step;
        env.ack = &ack;
        break;
    case WIRE_CHECKPOINT_COMMITTED:
        dflash__checkpoint_committed__init(&ckpt);
        ckpt.has_step = 1;
        ckpt.step = m->u.step;
        env.checkpoint_committed = &ckpt;
        break;
    case WIRE_RESUME_FROM:
        dflash__resume_from__init(&resume_from);
        resume_from.has_step = 1;
        resume_from.step = m->u.step;
        resume_from.has_run_id = m->u.run_id != 0;
        resume_from.run_id = m->u.run_id;
        env.resume_from = &resume_from;
        break;
    case WIRE_HEARTBEAT:
        dflash__heartbeat__init(&hb);
        hb.has_sent_ms = 1;
        hb.sent_ms = m->u.sent_ms;
        env.heartbeat = &hb;
        break;
    case WIRE_STATUS_REQUEST:
        dflash__status_request__init(&sreq);
        if (m->u.peer_prefix[0]) sreq.peer_prefix = (char *)m->u.peer_prefix;
        env.status_request = &sreq;
        break;
    case WIRE_STATUS_REPLY: {
        const wire_status *s = &m->u.status;
        dflash__status_reply__init(&st);
#define ST(f) st.has_##f = 1, st.f = s->f
        ST(uptime_ms), ST(state), ST(min_ready), ST(max_depth), ST(lease_timeout_ms);
        ST(tv_distance), ST(claims_per_s), ST(grants), ST(releases), ST(lease_expiries);
        ST(redeliveries), ST(quarantined), ST(malformed), ST(acks), ST(batches_todo);
        ST(batches_inflight), ST(batches_trained), ST(batches_committed), ST(committed_step);
        ST(peers), ST(epoch), ST(pool_incarnation), ST(slot_count), ST(batches_total);
        ST(hellos_refused_full), ST(replies_dropped), ST(key_refusals), ST(connections_refused);
        ST(steering_refused);
#undef ST
        for (uint32_t i = 0; i < s->n_buckets; i++) {
            const wire_bucket_stat *b = &s->buckets[i];
            Dflash__BucketStat *o = &bs_pb[i];
            dflash__bucket_stat__init(o);
#define BS(f) o->has_##f = 1, o->f = b->f
            BS(upper), BS(share), BS(ready), BS(leased), BS(filling), BS(deficit), BS(produced);
            BS(consumed), BS(produced_tokens), BS(consumed_tokens);
#undef BS
            bs_ptr[i] = o;
        }
        st.n_buckets = s->n_buckets;
        st.buckets = bs_ptr;
        for (uint32_t i = 0; i < s->n_groups; i++) {
            const wire_group_stat *g = &s->groups[i];
            Dflash__GroupStat *o = &gs_pb[i];
            dflash__group_stat__init(o);
            o->name = (char *)g->name;
#define GS(f) o->has_##f = 1, o->f = g->f
            GS(epoch), GS(world), GS(step), GS(state), GS(pending), GS(steps_done);
            GS(steps_aborted), GS(step_reserved), GS(micros), GS(accumulate);
#undef GS
            for (uint32_t k = 0; k < g->n_members; k++) gs_members[i][k] = (char *)g->members[k];
            o->n_members = g->n_members;
            o->members = gs_members[i];
            gs_ptr[i] = o;
        }
        st.n_groups = s->n_groups;
        st.groups = gs_ptr;
        for (uint32_t i = 0; i < s->n_orphans; i++) {
            Dflash__OrphanStat *o = &os_pb[i];
            dflash__orphan_stat__init(o);
            o->group = (char *)s->orphans[i].group;
#define OS(f) o->has_##f = 1, o->f = s->orphans[i].f
            OS(step), OS(batches), OS(held_ms), OS(abort_in_ms);
#undef OS
            os_ptr[i] = o;
        }
        st.n_orphans = s->n_orphans;
        st.orphans = os_ptr;
        for (uint32_t i = 0; i < s->n_peer_list; i++) {
            Dflash__PeerStat *o = &ps_pb[i];
            dflash__peer_stat__init(o);
            o->name = (char *)s->peer_list[i].name;
#define PS(f) o->has_##f = 1, o->f = s->peer_list[i].f
            PS(role), PS(heard_ms_ago), PS(leases), PS(held), PS(slots), PS(trains);
#undef PS
            ps_ptr[i] = o;
        }
        st.n_peer_list = s->n_peer_list;
        st.peer_list = ps_ptr;
        st.has_peers_unlisted = s->peers_unlisted != 0;
        st.peers_unlisted = s->peers_unlisted;
        if (s->journal_error[0]) st.journal_error = (char *)s->journal_error;
        if (s->stopping) {
            dflash__stop_stat__init(&stop);
#define SS(f) stop.has_##f = 1, stop.f = s->stop.f
            SS(grace_ms), SS(elapsed_ms), SS(drafters), SS(leases), SS(held), SS(reports);
#undef SS
            stop.waiting_for = (char *)s->stop.waiting_for;
            st.stopping = &stop;
        }
        env.status_reply = &st;
        break;
    }
    case WIRE_GROUP_JOIN:
        dflash__group_join__init(&gjoin);
        gjoin.group = (char *)m->u.join.group;
        gjoin.has_step = gjoin.has_failed_epoch = gjoin.has_world_hint = 1;
        gjoin.step = m->u.join.step;
        gjoin.failed_epoch = m->u.join.failed_epoch;
        gjoin.world_hint = m->u.join.world_hint;
        gjoin.has_gone_rank = m->u.join.has_gone_rank;
        gjoin.gone_rank = m->u.join.gone_rank;
        gjoin.has_shape = m->u.join.shape != 0;
        gjoin.shape = m->u.join.shape;
        if (m->u.join.shape_text[0]) gjoin.shape_text = (char *)m->u.join.shape_text;
        gjoin.has_accumulate = m->u.join.accumulate != 0;
        gjoin.accumulate = m->u.join.accumulate;
        gjoin.has_ends_when_drained = m->u.join.ends_when_drained;
        gjoin.ends_when_drained = m->u.join.ends_when_drained;
        env.group_join = &gjoin;
        break;
    case WIRE_GROUP_VIEW: {
        const wire_group_view *v = &m->u.view;
        dflash__group_view__init(&gview);
        gview.group = (char *)v->group;
        gview.has_epoch = gview.has_rank = gview.has_world = gview.has_step = 1;
        gview.epoch = v->epoch;
        gview.rank = v->rank;
        gview.world = v->world;
        gview.step = v->step;
        if (v->id_len) gview.has_id = 1, gview.id = bin(v->id, v->id_len);
        env.group_view = &gview;
        break;
    }
    case WIRE_GROUP_SET_ID:
        dflash__group_set_id__init(&gsetid);
        gsetid.group = (char *)m->u.set_id.group;
        gsetid.has_epoch = gsetid.has_id = 1;
        gsetid.epoch = m->u.set_id.epoch;
        gsetid.id = bin(m->u.set_id.id, m->u.set_id.id_len);
        env.group_set_id = &gsetid;
        break;
    case WIRE_STEP_CLAIM:
        dflash__step_claim__init(&sclaim);
        sclaim.group = (char *)m->u.gstep.group;
        sclaim.has_epoch = sclaim.has_step = 1;
        sclaim.epoch = m->u.gstep.epoch;
        sclaim.step = m->u.gstep.step;
        sclaim.has_micro = m->u.gstep.micro != 0;
        sclaim.micro = m->u.gstep.micro;
        env.step_claim = &sclaim;
        break;
    case WIRE_STEP_DONE:
        dflash__step_done__init(&sdone);
        sdone.group = (char *)m->u.gstep.group;
        sdone.has_epoch = sdone.has_step = 1;
        sdone.epoch = m->u.gstep.epoch;
        sdone.step = m->u.gstep.step;
        env.step_done = &sdone;
        break;
    case WIRE_GROUP_LEAVE:
        dflash__group_leave__init(&gleave);
        gleave.group = (char *)m->u.gstep.group;
        env.group_leave = &gleave;
        break;
    case WIRE_POOL_LEAVE:
        dflash__pool_leave__init(&pleave);
        pleave.has_pool_incarnation = 1;
        pleave.pool_incarnation = m->u.pool_incarnation;
        env.pool_leave = &pleave;
        break;
    case WIRE_POOL_LEFT:
        dflash__pool_left__init(&pleft);
        pleft.has_ready = pleft.has_filling = pleft.has_leased = 1;
        pleft.ready = m->u.left.ready;
        pleft.filling = m->u.left.filling;
        pleft.leased = m->u.left.leased;
        pleft.has_lease_timeout_ms = m->u.left.lease_timeout_ms != 0;
        pleft.lease_timeout_ms = m->u.left.lease_timeout_ms;
        env.pool_left = &pleft;
        break;
    case WIRE_STEP_GRANT: {
        const wire_step_grant *g = &m->u.sgrant;
        dflash__step_grant__init(&sgrant);
        sgrant.has_epoch = sgrant.has_step = sgrant.has_rank = sgrant.has_world = 1;
        sgrant.epoch = g->epoch;
        sgrant.step = g->step;
        sgrant.rank = g->rank;
        sgrant.world = g->world;
        sgrant.has_micro = g->has_micro;
        sgrant.micro = g->micro;
        grant_to_pb(&grant, &unit_pb, &g->grant);
        sgrant.grant = &grant;
        for (uint32_t i = 0; i < g->n_units; i++) {
            unit_to_pb(&su_pb[i], &g->units[i]);
            su_ptr[i] = &su_pb[i];
        }
        sgrant.n_units = g->n_units;
        sgrant.units = su_ptr;
        env.step_grant = &sgrant;
        break;
    }
    case WIRE_SET_CONFIG:
    case WIRE_SET_CONFIG_REPLY:
        for (uint32_t i = 0; i < m->u.settings.n; i++) {
            dflash__key_value__init(&kv_pb[i]);
            kv_pb[i].key = (char *)m->u.settings.kv[i].key;
            kv_pb[i].value = (char *)m->u.settings.kv[i].value;
            kv_ptr[i] = &kv_pb[i];
        }
        if (m->type == WIRE_SET_CONFIG) {
            dflash__set_config__init(&setc);
            setc.n_settings = m->u.settings.n;
            setc.settings = kv_ptr;
            env.set_config = &setc;
        } else {
            dflash__set_config_reply__init(&setr);
            setr.n_settings = m->u.settings.n;
            setr.settings = kv_ptr;
            env.set_config_reply = &setr;
        }
        break;
    case WIRE_PAUSE:
        dflash__pause__init(&pause);
        env.pause = &pause;
        break;
    case WIRE_RESUME:
        dflash__resume__init(&resume);
        env.resume = &resume;
        break;
    case WIRE_DRAIN:
        dflash__drain__init(&drain);
        env.drain = &drain;
        break;
    case WIRE_JOURNAL_SYNC:
        dflash__journal_sync__init(&jsync);
        env.journal_sync = &jsync;
        break;
    case WIRE_RELEASE_QUARANTINE:
        dflash__release_quarantine__init(&relq);
        relq.has_all = m->u.release_q.all;
        relq.all = m->u.release_q.all;
        if (!m->u.release_q.all) {
            unit_to_pb(&unit_pb, &m->u.release_q.unit);
            relq.unit = &unit_pb;
        }
        env.release_quarantine = &relq;
        break;
    case WIRE_ERROR:
        dflash__error__init(&error);
        error.has_code = 1;
        error.code = m->u.error.code;
        error.message = (char *)m->u.error.message;
        if (m->u.error.replaced_by_run) {
            error.has_replaced_by_run = 1;
            error.replaced_by_run = m->u.error.replaced_by_run;
        }
        if (m->u.error.mismatch) {
            error.has_mismatch = 1;
            error.mismatch = m->u.error.mismatch;
        }
        error.has_other_key = m->u.error.other_key;
        error.other_key = m->u.error.other_key;
        error.has_committed_step = m->u.error.committed_step != 0;
        error.committed_step = m->u.error.committed_step;
        env.error = &error;
        break;
    case WIRE_OK:
        dflash__ok__init(&ok);
        ok.has_value = 1;
        ok.value = m->u.value;
        env.ok = &ok;
        break;
    default: return DFLASH_EINVAL;
    }
    size_t need = dflash__envelope__get_packed_size(&env);
    if (need > cap || need > WIRE_MAX_MSG) {
        free(events);
        return DFLASH_EFULL;
    }
    size_t n = dflash__envelope__pack(&env, buf);
    free(events);
    return (int)n;
}

/* --- unpack --------------------------------------------------------------------------------- */

static int copy_str(char *dst, size_t cap, const char *src)
{
    if (!src) {
        dst[0] = 0;
        return 0;
    }
    size_t n = strlen(src);
    if (n >= cap) return DFLASH_ERANGE;
    memcpy(dst, src, n + 1);
    return 0;
}

static int copy_handle(uint8_t dst[WIRE_HANDLE_BYTES], protobuf_c_boolean has,
                       ProtobufCBinaryData b)
{
    if (!has) return 0;
    if (b.len != WIRE_HANDLE_BYTES) return DFLASH_ERANGE;
    memcpy(dst, b.data, WIRE_HANDLE_BYTES);
    return 0;
}

static int unit_from_pb(wire_unit *u, const Dflash__Unit *pb)
{
    if (!pb) return DFLASH_EPROTO; /* a unit is mandatory where it appears */
    u->epoch = pb->epoch;
    u->bucket = pb->bucket;
    u->index = pb->index;
    return 0;
}

/* 0, DFLASH_ERANGE (a string or handle too long) or DFLASH_EPROTO (no unit). */
static int grant_from_pb(wire_grant *w, const Dflash__Grant *g)
{
    if (!g) return DFLASH_EPROTO;
    w->lease_id = g->lease_id;
    w->deadline_ms = g->deadline_ms;
    w->pool_incarnation = g->pool_incarnation;
    w->slot = g->slot;
    w->offset = g->offset;
    w->size = g->size;
    w->layout_version = g->layout_version;
    w->n_tokens = g->n_tokens;
    w->n_seqs = g->n_seqs;
    w->backend = (wire_backend)g->backend;
    w->device = g->device;
    if (copy_str(w->shm_name, WIRE_MAX_NAME, g->shm_name) ||
        copy_str(w->pool_name, WIRE_MAX_NAME, g->pool_name) ||
        copy_str(w->gpu_bus_id, WIRE_BUS_ID_MAX, g->gpu_bus_id) ||
        copy_handle(w->mem_handle, g->has_mem_handle, g->mem_handle) ||
        copy_handle(w->event_handle, g->has_event_handle, g->event_handle))
        return DFLASH_ERANGE;
    return unit_from_pb(&w->unit, g->unit);
}

/* Copies a group id blob (<= WIRE_GROUP_ID_BYTES). 0 or DFLASH_ERANGE. */
static int copy_id(uint8_t *dst, uint32_t *n, protobuf_c_boolean has, ProtobufCBinaryData b)
{
    *n = 0;
    if (!has) return 0;
    if (b.len > WIRE_GROUP_ID_BYTES) return DFLASH_ERANGE;
    memcpy(dst, b.data, b.len);
    *n = (uint32_t)b.len;
    return 0;
}

/* Copies the body of env into m. Returns 0 or a code with a reason. */
static int from_pb(const Dflash__Envelope *env, wire_msg *m, char *why, size_t len)
{
    int rc = 0;
    switch (env->body_case) {
    case DFLASH__ENVELOPE__BODY_HELLO: {
        const Dflash__Hello *h = env->hello;
        m->type = WIRE_HELLO;
        if (copy_str(m->u.hello.name, WIRE_MAX_NAME, h->name) ||
            copy_str(m->u.hello.pub_endpoint, WIRE_MAX_TEXT, h->pub_endpoint))
            return fail(why, len, DFLASH_ERANGE, "hello: string too long");
        m->u.hello.heartbeat_ms = h->heartbeat_ms;
        m->u.hello.lease_timeout_ms = h->lease_timeout_ms;
        m->u.hello.stats_interval_ms = h->stats_interval_ms;
        m->u.hello.run_id = h->run_id; /* 0 when absent */
        if (h->n_held > WIRE_MAX_HELD)
            return fail(why, len, DFLASH_ERANGE, "hello: %zu held units", h->n_held);
        m->u.hello.n_held = (uint32_t)h->n_held;
        for (size_t i = 0; i < h->n_held; i++)
            if ((rc = unit_from_pb(&m->u.hello.held[i], h->held[i]))) break;
        break;
    }
    case DFLASH__ENVELOPE__BODY_POOL_REGISTER: {
        const Dflash__PoolRegister *p = env->pool_register;
        wire_pool *w = &m->u.pool;
        m->type = WIRE_POOL_REGISTER;
        w->pool_incarnation = p->pool_incarnation;
        w->backend = (wire_backend)p->backend;
        w->device = p->device;
        w->slot_count = p->slot_count;
        w->slot_size = p->slot_size;
        w->layout_version = p->layout_version;
        w->token_budget = p->token_budget;
        w->epochs = p->epochs;
        w->has_plan_id = p->has_plan_id;
        w->plan_id = p->plan_id;
        if (copy_str(w->shm_name, WIRE_MAX_NAME, p->shm_name) ||
            copy_str(w->gpu_bus_id, WIRE_BUS_ID_MAX, p->gpu_bus_id) ||
            copy_handle(w->mem_handle, p->has_mem_handle, p->mem_handle))
            return fail(why, len, DFLASH_ERANGE,
                        "pool: shm name, GPU bus id or memory handle size");
        if (p->n_bucket_upper != p->n_bucket_share || p->n_bucket_upper != p->n_bucket_batches ||
            p->n_bucket_upper > WIRE_MAX_BUCKETS)
            return fail(why, len, DFLASH_ERANGE, "pool: bucket arrays of %zu/%zu/%zu entries",
                        p->n_bucket_upper, p->n_bucket_share, p->n_bucket_batches);
        w->n_buckets = (uint32_t)p->n_bucket_upper;
        for (uint32_t b = 0; b < w->n_buckets; b++) {
            w->bucket_upper[b] = p->bucket_upper[b];
            w->bucket_share[b] = p->bucket_share[b];
            w->bucket_batches[b] = p->bucket_batches[b];
        }
        if (p->n_busy_slots > WIRE_MAX_SLOTS)
            return fail(why, len, DFLASH_ERANGE, "pool: %zu busy slots", p->n_busy_slots);
        for (size_t i = 0; i < p->n_busy_slots; i++) {
            if (p->busy_slots[i] >= WIRE_MAX_SLOTS)
                return fail(why, len, DFLASH_ERANGE, "pool: busy slot %u", p->busy_slots[i]);
            wire_pool_set_busy(w, p->busy_slots[i], true);
        }
        if (p->n_event_handles > WIRE_MAX_SLOTS)
            return fail(why, len, DFLASH_ERANGE, "pool: %zu event handles", p->n_event_handles);
        if (p->n_event_handles) {
            uint8_t(*ev)[WIRE_HANDLE_BYTES] = malloc(p->n_event_handles * WIRE_HANDLE_BYTES);
            if (!ev) return fail(why, len, DFLASH_ENOMEM, "pool: no memory");
            m->owned_ = ev;
            for (size_t i = 0; i < p->n_event_handles; i++)
                if (copy_handle(ev[i], 1, p->event_handles[i]))
                    return fail(why, len, DFLASH_ERANGE, "pool: event handle %zu size", i);
            w->event_handles = (const uint8_t(*)[WIRE_HANDLE_BYTES])ev;
            w->n_events = (uint32_t)p->n_event_handles;
        }
        break;
    }
    case DFLASH__ENVELOPE__BODY_WORK_REQUEST:
        m->type = WIRE_WORK_REQUEST;
        m->u.pool_incarnation = env->work_request->pool_incarnation;
        break;
    case DFLASH__ENVELOPE__BODY_WORK_UNIT:
        m->type = WIRE_WORK_UNIT;
        m->u.work.slot = env->work_unit->slot;
        rc = unit_from_pb(&m->u.work.unit, env->work_unit->unit);
        break;
    case DFLASH__ENVELOPE__BODY_SLOT_READY: {
        const Dflash__SlotReady *r = env->slot_ready;
        m->type = WIRE_SLOT_READY;
        m->u.ready.pool_incarnation = r->pool_incarnation;
        m->u.ready.slot = r->slot;
        m->u.ready.n_tokens = r->n_tokens;
        m->u.ready.n_seqs = r->n_seqs;
        rc = unit_from_pb(&m->u.ready.unit, r->unit);
        break;
    }
    case DFLASH__ENVELOPE__BODY_CLAIM: m->type = WIRE_CLAIM; break;
    case DFLASH__ENVELOPE__BODY_GRANT:
        m->type = WIRE_GRANT;
        if ((rc = grant_from_pb(&m->u.grant, env->grant)) == DFLASH_ERANGE)
            return fail(why, len, rc, "grant: name or handle size");
        break;
    case DFLASH__ENVELOPE__BODY_SLOT_RELEASE:
        m->type = WIRE_SLOT_RELEASE;
        m->u.lease_id = env->slot_release->lease_id;
        m->u.release_unread = env->slot_release->has_unread && env->slot_release->unread;
        break;
    case DFLASH__ENVELOPE__BODY_ACK:
        m->type = WIRE_ACK;
        m->u.ack.step = env->ack->step;
        rc = unit_from_pb(&m->u.ack.unit, env->ack->unit);
        break;
    case DFLASH__ENVELOPE__BODY_CHECKPOINT_COMMITTED:
        m->type = WIRE_CHECKPOINT_COMMITTED;
        m->u.step = env->checkpoint_committed->step;
        break;
    case DFLASH__ENVELOPE__BODY_RESUME_FROM:
        m->type = WIRE_RESUME_FROM;
        m->u.step = env->resume_from->step;
        m->u.run_id = env->resume_from->run_id; /* 0 when absent */
        break;
    case DFLASH__ENVELOPE__BODY_HEARTBEAT:
        m->type = WIRE_HEARTBEAT;
        m->u.sent_ms = env->heartbeat->sent_ms;
        break;
    case DFLASH__ENVELOPE__BODY_STATUS_REQUEST:
        m->type = WIRE_STATUS_REQUEST;
        if (env->status_request &&
            copy_str(m->u.peer_prefix, WIRE_MAX_NAME, env->status_request->peer_prefix))
            return fail(why, len, DFLASH_ERANGE, "status request: peer_prefix too long");
        break;
    case DFLASH__ENVELOPE__BODY_STATUS_REPLY: {
        const Dflash__StatusReply *s = env->status_reply;
        wire_status *w = &m->u.status;
        m->type = WIRE_STATUS_REPLY;
#define ST(f) w->f = s->f
        ST(uptime_ms), ST(state), ST(min_ready), ST(max_depth), ST(lease_timeout_ms);
        ST(tv_distance), ST(claims_per_s), ST(grants), ST(releases), ST(lease_expiries);
        ST(redeliveries), ST(quarantined), ST(malformed), ST(acks), ST(batches_todo);
        ST(batches_inflight), ST(batches_trained), ST(batches_committed), ST(committed_step);
        ST(peers), ST(epoch), ST(pool_incarnation), ST(slot_count), ST(batches_total);
        ST(hellos_refused_full), ST(replies_dropped), ST(key_refusals), ST(connections_refused);
        ST(steering_refused); /* these five: 0 from an older broker */
#undef ST
        if (s->n_buckets > WIRE_MAX_BUCKETS)
            return fail(why, len, DFLASH_ERANGE, "status: %zu buckets", s->n_buckets);
        w->n_buckets = (uint32_t)s->n_buckets;
        for (size_t i = 0; i < s->n_buckets; i++) {
            const Dflash__BucketStat *b = s->buckets[i];
            wire_bucket_stat *o = &w->buckets[i];
#define BS(f) o->f = b->f
            BS(upper), BS(share), BS(ready), BS(leased), BS(filling), BS(deficit), BS(produced);
            BS(consumed), BS(produced_tokens), BS(consumed_tokens);
#undef BS
        }
        if (s->n_groups > WIRE_MAX_GROUPS)
            return fail(why, len, DFLASH_ERANGE, "status: %zu groups", s->n_groups);
        w->n_groups = (uint32_t)s->n_groups;
        for (size_t i = 0; i < s->n_groups; i++) {
            const Dflash__GroupStat *g = s->groups[i];
            wire_group_stat *o = &w->groups[i];
#define GS(f) o->f = g->f
            GS(epoch), GS(world), GS(step), GS(state), GS(pending), GS(steps_done);
            GS(steps_aborted), GS(step_reserved), GS(micros), GS(accumulate);
#undef GS
            if (copy_str(o->name, WIRE_MAX_NAME, g->name) ||
                g->n_members > WIRE_MAX_STATUS_MEMBERS)
                return fail(why, len, DFLASH_ERANGE, "status: group %zu name or members", i);
            o->n_members = (uint32_t)g->n_members;
            for (size_t k = 0; k < g->n_members; k++)
                if (copy_str(o->members[k], WIRE_MAX_NAME, g->members[k]))
                    return fail(why, len, DFLASH_ERANGE, "status: group member name");
        }
        if (copy_str(w->journal_error, WIRE_MAX_TEXT, s->journal_error))
            return fail(why, len, DFLASH_ERANGE, "status: journal_error too long");
        if (s->n_orphans > WIRE_MAX_STATUS_ORPHANS)
            return fail(why, len, DFLASH_ERANGE, "status: %zu orphaned steps", s->n_orphans);
        w->n_orphans = (uint32_t)s->n_orphans;
        for (size_t i = 0; i < s->n_orphans; i++) {
            const Dflash__OrphanStat *o = s->orphans[i];
            wire_orphan_stat *x = &w->orphans[i];
#define OS(f) x->f = o->f
            OS(step), OS(batches), OS(held_ms), OS(abort_in_ms);
#undef OS
            if (copy_str(x->group, WIRE_MAX_NAME, o->group))
                return fail(why, len, DFLASH_ERANGE, "status: orphaned step %zu group name", i);
        }
        w->stopping = s->stopping != NULL;
        if (s->stopping) {
            const Dflash__StopStat *x = s->stopping;
#define SS(f) w->stop.f = x->f
            SS(grace_ms), SS(elapsed_ms), SS(drafters), SS(leases), SS(held), SS(reports);
#undef SS
            if (copy_str(w->stop.waiting_for, WIRE_MAX_TEXT, x->waiting_for))
                return fail(why, len, DFLASH_ERANGE, "status: stopping.waiting_for too long");
        }
        if (s->n_peer_list > WIRE_MAX_STATUS_PEERS)
            return fail(why, len, DFLASH_ERANGE, "status: %zu peers listed", s->n_peer_list);
        w->n_peer_list = (uint32_t)s->n_peer_list;
        for (size_t i = 0; i < s->n_peer_list; i++) {
            const Dflash__PeerStat *o = s->peer_list[i];
            wire_peer_stat *x = &w->peer_list[i];
#define PS(f) x->f = o->f
            PS(role), PS(heard_ms_ago), PS(leases), PS(held), PS(slots), PS(trains);
#undef PS
            if (copy_str(x->name, WIRE_MAX_NAME, o->name))
                return fail(why, len, DFLASH_ERANGE, "status: listed peer %zu name", i);
        }
        w->peers_unlisted = s->peers_unlisted;
        break;
    }
    case DFLASH__ENVELOPE__BODY_GROUP_JOIN: {
        const Dflash__GroupJoin *j = env->group_join;
        m->type = WIRE_GROUP_JOIN;
        if (copy_str(m->u.join.group, WIRE_MAX_NAME, j->group))
            return fail(why, len, DFLASH_ERANGE, "group_join: group name too long");
        m->u.join.step = j->step;
        m->u.join.failed_epoch = j->failed_epoch;
        m->u.join.world_hint = j->world_hint;
        m->u.join.has_gone_rank = j->has_gone_rank;
        m->u.join.gone_rank = j->has_gone_rank ? j->gone_rank : 0;
        m->u.join.shape = j->has_shape ? j->shape : 0;
        if (copy_str(m->u.join.shape_text, WIRE_MAX_SHAPE_TEXT, j->shape_text))
            return fail(why, len, DFLASH_ERANGE, "group_join: shape text too long");
        m->u.join.accumulate = j->has_accumulate ? j->accumulate : 0;
        m->u.join.ends_when_drained = j->has_ends_when_drained && j->ends_when_drained;
        break;
    }
    case DFLASH__ENVELOPE__BODY_GROUP_VIEW: {
        const Dflash__GroupView *v = env->group_view;
        m->type = WIRE_GROUP_VIEW;
        if (copy_str(m->u.view.group, WIRE_MAX_NAME, v->group) ||
            copy_id(m->u.view.id, &m->u.view.id_len, v->has_id, v->id))
            return fail(why, len, DFLASH_ERANGE, "group_view: name or id too long");
        m->u.view.epoch = v->epoch;
        m->u.view.rank = v->rank;
        m->u.view.world = v->world;
        m->u.view.step = v->step;
        break;
    }
    case DFLASH__ENVELOPE__BODY_GROUP_SET_ID: {
        const Dflash__GroupSetId *g = env->group_set_id;
        m->type = WIRE_GROUP_SET_ID;
        if (copy_str(m->u.set_id.group, WIRE_MAX_NAME, g->group) ||
            copy_id(m->u.set_id.id, &m->u.set_id.id_len, g->has_id, g->id))
            return fail(why, len, DFLASH_ERANGE, "group_set_id: name or id too long");
        m->u.set_id.epoch = g->epoch;
        break;
    }
    case DFLASH__ENVELOPE__BODY_STEP_CLAIM:
    case DFLASH__ENVELOPE__BODY_STEP_DONE: {
        bool claim = env->body_case == DFLASH__ENVELOPE__BODY_STEP_CLAIM;
        const char *g = claim ? env->step_claim->group : env->step_done->group;
        m->type = claim ? WIRE_STEP_CLAIM : WIRE_STEP_DONE;
        if (copy_str(m->u.gstep.group, WIRE_MAX_NAME, g))
            return fail(why, len, DFLASH_ERANGE, "%s: group name too long",
                        wire_type_name(m->type));
        m->u.gstep.epoch = claim ? env->step_claim->epoch : env->step_done->epoch;
        m->u.gstep.step = claim ? env->step_claim->step : env->step_done->step;
        m->u.gstep.micro = claim && env->step_claim->has_micro ? env->step_claim->micro : 0;
        break;
    }
    case DFLASH__ENVELOPE__BODY_GROUP_LEAVE:
        m->type = WIRE_GROUP_LEAVE;
        if (copy_str(m->u.gstep.group, WIRE_MAX_NAME, env->group_leave->group))
            return fail(why, len, DFLASH_ERANGE, "group_leave: group name too long");
        break;
    case DFLASH__ENVELOPE__BODY_POOL_LEAVE:
        m->type = WIRE_POOL_LEAVE;
        m->u.pool_incarnation = env->pool_leave->pool_incarnation;
        break;
    case DFLASH__ENVELOPE__BODY_POOL_LEFT:
        m->type = WIRE_POOL_LEFT;
        m->u.left.ready = env->pool_left->ready;
        m->u.left.filling = env->pool_left->filling;
        m->u.left.leased = env->pool_left->leased;
        m->u.left.lease_timeout_ms = env->pool_left->lease_timeout_ms;
        break;
    case DFLASH__ENVELOPE__BODY_STEP_GRANT: {
        const Dflash__StepGrant *g = env->step_grant;
        wire_step_grant *w = &m->u.sgrant;
        m->type = WIRE_STEP_GRANT;
        w->epoch = g->epoch;
        w->step = g->step;
        w->rank = g->rank;
        w->world = g->world;
        w->has_micro = g->has_micro;
        w->micro = g->has_micro ? g->micro : 0;
        if ((rc = grant_from_pb(&w->grant, g->grant)) == DFLASH_ERANGE)
            return fail(why, len, rc, "step_grant: grant name or handle size");
        if (rc) break;
        if (g->n_units > WIRE_MAX_WORLD)
            return fail(why, len, DFLASH_ERANGE, "step_grant: %zu units", g->n_units);
        w->n_units = (uint32_t)g->n_units;
        for (size_t i = 0; i < g->n_units && !rc; i++) rc = unit_from_pb(&w->units[i], g->units[i]);
        break;
    }
    case DFLASH__ENVELOPE__BODY_SET_CONFIG:
    case DFLASH__ENVELOPE__BODY_SET_CONFIG_REPLY: {
        bool is_set = env->body_case == DFLASH__ENVELOPE__BODY_SET_CONFIG;
        size_t n = is_set ? env->set_config->n_settings : env->set_config_reply->n_settings;
        Dflash__KeyValue **kv = is_set ? env->set_config->settings
                                       : env->set_config_reply->settings;
        m->type = is_set ? WIRE_SET_CONFIG : WIRE_SET_CONFIG_REPLY;
        if (n > WIRE_MAX_SETTINGS) return fail(why, len, DFLASH_ERANGE, "%zu settings", n);
        m->u.settings.n = (uint32_t)n;
        for (size_t i = 0; i < n; i++)
            if (copy_str(m->u.settings.kv[i].key, WIRE_MAX_KEY, kv[i]->key) ||
                copy_str(m->u.settings.kv[i].value, WIRE_MAX_VALUE, kv[i]->value))
                return fail(why, len, DFLASH_ERANGE, "setting %zu too long", i);
        break;
    }
    case DFLASH__ENVELOPE__BODY_PAUSE: m->type = WIRE_PAUSE; break;
    case DFLASH__ENVELOPE__BODY_RESUME: m->type = WIRE_RESUME; break;
    case DFLASH__ENVELOPE__BODY_DRAIN: m->type = WIRE_DRAIN; break;
    case DFLASH__ENVELOPE__BODY_JOURNAL_SYNC: m->type = WIRE_JOURNAL_SYNC; break;
    case DFLASH__ENVELOPE__BODY_RELEASE_QUARANTINE: {
        const Dflash__ReleaseQuarantine *q = env->release_quarantine;
        m->type = WIRE_RELEASE_QUARANTINE;
        m->u.release_q.all = q->has_all && q->all;
        if (!m->u.release_q.all) rc = unit_from_pb(&m->u.release_q.unit, q->unit);
        break;
    }
    case DFLASH__ENVELOPE__BODY_ERROR:
        m->type = WIRE_ERROR;
        m->u.error.code = env->error->code;
        if (copy_str(m->u.error.message, WIRE_MAX_TEXT, env->error->message)) {
            /* a long error text is truncated, not rejected */
            snprintf(m->u.error.message, WIRE_MAX_TEXT, "%.*s", WIRE_MAX_TEXT - 1,
                     env->error->message);
        }
        m->u.error.replaced_by_run =
            env->error->has_replaced_by_run ? env->error->replaced_by_run : 0;
        /* a newer broker's kind of mismatch is one we cannot advise on: not stated */
        if (env->error->has_mismatch && env->error->mismatch <= WIRE_MISMATCH_ACCUMULATE)
            m->u.error.mismatch = env->error->mismatch;
        m->u.error.other_key = env->error->has_other_key && env->error->other_key;
        m->u.error.committed_step =
            env->error->has_committed_step ? env->error->committed_step : 0;
        break;
    case DFLASH__ENVELOPE__BODY_OK:
        m->type = WIRE_OK;
        m->u.value = env->ok->value;
        break;
    default: return fail(why, len, DFLASH_EPROTO, "envelope without a known body");
    }
    if (rc) return fail(why, len, rc, "%s: missing unit", wire_type_name(m->type));
    return 0;
}

int wire_unpack(const uint8_t *buf, size_t len, wire_msg *m, char *why, size_t why_len)
{
    memset(m, 0, sizeof *m);
    if (!buf || !len) return fail(why, why_len, DFLASH_EPROTO, "empty message");
    if (len > WIRE_MAX_MSG)
        return fail(why, why_len, DFLASH_EPROTO, "message of %zu bytes > %u", len, WIRE_MAX_MSG);
    Dflash__Envelope *env = dflash__envelope__unpack(NULL, len, buf);
    if (!env) return fail(why, why_len, DFLASH_EPROTO, "not a valid envelope");
    m->version = env->version;
    m->role = (wire_role)env->role;
    m->incarnation = env->incarnation;
    m->request_id = env->request_id;
    int rc = from_pb(env, m, why, why_len);
    dflash__envelope__free_unpacked(env, NULL);
    if (!rc) rc = wire_check(m, why, why_len);
    if (rc) {
        free(m->owned_);
        m->owned_ = NULL;
        if (m->type == WIRE_POOL_REGISTER) m->u.pool.event_handles = NULL, m->u.pool.n_events = 0;
    }
    return rc;
}
