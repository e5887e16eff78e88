/* group: see group.h for the model, the states and the resolution rule of a step in flight.
 *
 * Storage: the table is an array of heap-allocated groups (pointers stay valid until the group
 * is deleted: by group_leave when the last member leaves, or by group_dissolve); a group's members
 * are a fixed array in join order (removal shifts), so "ranks in join order" is a plain scan.
 * Orphaned steps (group.h) are a second array of heap-allocated records, at most one per group
 * name and only while no group of that name exists: the join that creates it takes the record.
 * Their bytes for the journal (group_orphans_encode), per step, little-endian: the group name
 * NUL-terminated, u64 step, u32 units (1..GROUP_MAX_UNITS: all its micro-steps'), then per
 * unit u32 epoch, bucket, index. A restored step's slots have no peer and no lease (the broker that granted them is
 * gone); every one is a copied unit (released), as orphan_keep requires.
 */
#include "group.h"

#include "err.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A step orphaned when the last member of its group left (group.h): what its resolution needs. */
typedef struct group_orphan {
    char name[GROUP_MAX_NAME];
    uint64_t step;
    bool stamped;      /* since_ms is set (group_orphan_expire's first look at it) */
    uint64_t since_ms; /* the caller's clock when group_orphan_expire first saw it */
    uint32_t n_slots;
    group_slot slots[GROUP_MAX_UNITS];
} group_orphan;

struct group_table {
    group *g[GROUP_MAX_GROUPS];
    uint32_t n;
    group_orphan *orphans[GROUP_MAX_GROUPS];
    uint32_t n_orphans;
};

const char *group_state_name(group_state s)
{
    static const char *const n[] = {"forming", "active", "re-forming"};
    return (unsigned)s < 3 ? n[s] : "unknown";
}

static void set_state(group *g, group_state to)
{
    static const bool legal[3][3] = {
        /* to:           FORMING ACTIVE REFORMING */
        [GROUP_FORMING] = {true, true, true},
        [GROUP_ACTIVE] = {true, false, true},
        [GROUP_REFORMING] = {true, false, false},
    };
    assert(legal[g->state][to]);
    g->state = to;
}

group_table *group_table_new(void) { return calloc(1, sizeof(group_table)); }

void group_table_destroy(group_table **t)
{
    if (!t || !*t) return;
    for (uint32_t i = 0; i < (*t)->n; i++) free((*t)->g[i]);
    for (uint32_t i = 0; i < (*t)->n_orphans; i++) free((*t)->orphans[i]);
    free(*t);
    *t = NULL;
}

uint32_t group_count(const group_table *t) { return t->n; }
group *group_at(group_table *t, uint32_t i) { return i < t->n ? t->g[i] : NULL; }

group *group_find(group_table *t, const char *name)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (strcmp(t->g[i]->name, name) == 0) return t->g[i];
    return NULL;
}

group_entry *group_entry_of(group *g, uint64_t peer)
{
    for (uint32_t i = 0; i < g->n_members; i++)
        if (g->members[i].peer == peer) return &g->members[i];
    return NULL;
}

group *group_of_peer(group_table *t, uint64_t peer)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (group_entry_of(t->g[i], peer)) return t->g[i];
    return NULL;
}

uint32_t group_largest(const group_table *t)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->g[i]->n_members > m) m = t->g[i]->n_members;
    return m;
}

static group_entry *first_admitted(group *g)
{
    for (uint32_t i = 0; i < g->n_members; i++)
        if (g->members[i].admitted) return &g->members[i];
    return NULL;
}

/* out tells the broker to carry out verdict v on the n slots of step. */
static void set_verdict(group_outcome *out, group_verdict v, uint64_t step,
                        const group_slot *slots, uint32_t n)
{
    out->verdict = v;
    out->step = step;
    out->n_slots = n;
    memcpy(out->slots, slots, n * sizeof *slots);
}

/* The units of the step in flight: every reserved micro-step's. */
static uint32_t step_units(const group *g) { return g->step_world * g->step_micros; }

/* The step ends with verdict v; out gets what the broker must do. */
static void resolve(group *g, group_verdict v, group_outcome *out)
{
    assert(g->step_active);
    set_verdict(out, v, g->step, g->slots, step_units(g));
    if (v == GROUP_ACK) {
        g->done_epoch = g->step_epoch;
        g->done_step = g->step;
        g->base_step = g->step;
        g->steps_done++;
    } else {
        g->steps_aborted++;
    }
    g->step_active = false;
    g->resolver = 0;
}

/* Ranks 0..world-1 to every member in join order, a new epoch, no id yet. */
static void new_epoch(group *g, group_outcome *out)
{
    assert(!g->step_active);
    /* rank 0 a joiner (no rank of the last epoch is left): the group goes on from its model.
     * Ahead of the group (a former rank that took steps the group then resolved without it):
     * from its step. Below it: the broker dissolves the group (broker_groups.c). */
    if (g->n_members && !g->members[0].admitted && g->members[0].model_step > g->base_step)
        g->base_step = g->members[0].model_step;
    g->epoch++;
    g->world = 0;
    for (uint32_t i = 0; i < g->n_members; i++) {
        g->members[i].admitted = true;
        g->members[i].rank = g->world++;
    }
    if (g->world > g->widest) g->widest = g->world;
    g->id_len = 0;
    set_state(g, GROUP_FORMING);
    out->new_epoch = true;
}

/* Keeps the step in flight of g, whose last member just left, as an orphan for the join that
 * creates the group again. False when it cannot be kept: a rank never copied its unit, or a
 * micro-step of it was never reserved (it neither has all its micro-steps nor ended early: so
 * nobody trained the step), or no room. */
static bool orphan_keep(group_table *t, group *g)
{
    if (g->step_micros < g->step_accumulate && !g->step_end) return false;
    for (uint32_t r = 0; r < step_units(g); r++)
        if (!g->slots[r].released) return false;
    group_orphan *o = t->n_orphans < GROUP_MAX_GROUPS ? calloc(1, sizeof *o) : NULL;
    if (!o) return false;
    snprintf(o->name, sizeof o->name, "%s", g->name);
    o->step = g->step;
    o->n_slots = step_units(g);
    memcpy(o->slots, g->slots, o->n_slots * sizeof *g->slots);
    t->orphans[t->n_orphans++] = o;
    g->step_active = false;
    g->resolver = 0;
    return true;
}

/* The step in flight has no admitted member left to resolve it. Members left (joiners waiting
 * for the boundary) form the next epoch from the first one's model, which decides the step by
 * the model step it reported: a former rank that expired and came back has the update (ACK), a
 * newcomer does not (ABORT). With nobody left the ranks may be alive (expired while they
 * trained, their models updated): the step is orphaned (out->orphan), else aborted. */
static void no_resolver(group_table *t, group *g, group_outcome *out)
{
    if (!g->n_members && orphan_keep(t, g)) {
        out->orphan = true;
        out->step = g->step;
        return;
    }
    bool had = g->n_members && g->members[0].model_step >= g->step;
    resolve(g, had ? GROUP_ACK : GROUP_ABORT, out);
}

/* The group name was just created by a join from a member at model_step: a step orphaned under
 * that name is resolved by the creator's model, which the group continues from. */
static void resolve_orphan(group_table *t, group *g, uint64_t model_step, group_outcome *out)
{
    for (uint32_t i = 0; i < t->n_orphans; i++) {
        group_orphan *o = t->orphans[i];
        if (strcmp(o->name, g->name) != 0) continue;
        group_verdict v = model_step >= o->step ? GROUP_ACK : GROUP_ABORT;
        set_verdict(out, v, o->step, o->slots, o->n_slots);
        out->orphan = true;
        if (v == GROUP_ACK) g->steps_done++;
        else g->steps_aborted++;
        free(o);
        t->orphans[i] = t->orphans[--t->n_orphans];
        return;
    }
}

/* The current epoch is over (a rank left or failed). A step in flight waits for its resolver,
 * the first admitted member left (no_resolver with none). */
static void end_epoch(group_table *t, group *g, group_outcome *out)
{
    if (g->state == GROUP_REFORMING) return;
    set_state(g, GROUP_REFORMING);
    if (!g->step_active) return;
    group_entry *l = first_admitted(g);
    if (l) g->resolver = l->peer;
    else no_resolver(t, g, out);
}

/* Forms the next epoch when membership changed and no step is in flight. */
static void try_form(group *g, group_outcome *out)
{
    if (!g->n_members) return;
    bool pending = false;
    for (uint32_t i = 0; i < g->n_members; i++) pending |= !g->members[i].admitted;
    switch (g->state) {
    case GROUP_FORMING:
        if (pending) new_epoch(g, out);
        break;
    case GROUP_ACTIVE:
        if (pending && !g->step_active) new_epoch(g, out);
        break;
    case GROUP_REFORMING:
        if (!g->step_active) new_epoch(g, out);
        break;
    }
}

static void table_remove(group_table *t, group *g)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (t->g[i] == g) {
            free(g);
            t->g[i] = t->g[--t->n];
            return;
        }
}

const group_entry *group_shape_of(const group *g)
{
    return g->n_members && g->members[0].shape.hash ? &g->members[0] : NULL;
}

/* A join's stated accumulation: 0 or no shape is 1. */
static uint32_t accumulate_of(const group_shape *shape)
{
    return shape && shape->accumulate ? shape->accumulate : 1;
}

uint32_t group_accumulate(const group *g)
{
    return g->n_members ? accumulate_of(&g->members[0].shape) : 1;
}

int group_join(group_table *t, const char *name, uint64_t peer, const char *peer_name,
               const group_shape *shape, uint64_t model_step, uint64_t failed_epoch,
               uint32_t max_world, group **gp, group_outcome *out)
{
    memset(out, 0, sizeof *out);
    *gp = NULL;
    group *other = group_of_peer(t, peer);
    if (other && strcmp(other->name, name) != 0) return DFLASH_EEXISTS;
    group *g = group_find(t, name);
    const group_entry *owner = g ? group_shape_of(g) : NULL;
    bool newcomer = g && !group_entry_of(g, peer);
    if (newcomer && ((owner && shape && shape->hash && shape->hash != owner->shape.hash) ||
                     (g->n_members && accumulate_of(shape) != group_accumulate(g)))) {
        *gp = g;
        return DFLASH_EMISMATCH;
    }
    if (!g) {
        if (t->n == GROUP_MAX_GROUPS) return DFLASH_ENOMEM;
        g = calloc(1, sizeof *g);
        if (!g) return DFLASH_ENOMEM;
        snprintf(g->name, sizeof g->name, "%s", name);
        g->base_step = model_step;
        g->next_seq = 1;
        t->g[t->n++] = g;
        out->created = true;
    }
    group_entry *m = group_entry_of(g, peer);
    if (!m) {
        if (g->n_members + 1 > max_world || g->n_members + 1 > GROUP_MAX_WORLD ||
            (g->n_members + 1) * accumulate_of(shape) > GROUP_MAX_UNITS) {
            if (out->created) table_remove(t, g);
            out->created = false;
            return DFLASH_EFULL;
        }
        m = &g->members[g->n_members++];
        memset(m, 0, sizeof *m);
        m->peer = peer;
        snprintf(m->name, sizeof m->name, "%s", peer_name ? peer_name : "");
        m->join_seq = g->next_seq++;
        m->model_step = model_step;
        if (shape) m->shape = *shape;
        if (out->created) resolve_orphan(t, g, model_step, out);
        try_form(g, out);
        *gp = g;
        return 0;
    }
    m->model_step = model_step;
    if (m->admitted && failed_epoch && failed_epoch == g->epoch &&
        (g->state == GROUP_FORMING || g->state == GROUP_ACTIVE))
        end_epoch(t, g, out);
    if (g->state == GROUP_REFORMING && g->step_active && g->resolver == peer) {
        resolve(g, model_step >= g->step ? GROUP_ACK : GROUP_ABORT, out);
        g->base_step = model_step; /* the next epoch starts from this member's model */
    }
    try_form(g, out);
    *gp = g;
    return 0;
}

bool group_leave(group_table *t, uint64_t peer, group_outcome *out)
{
    memset(out, 0, sizeof *out);
    group *g = group_of_peer(t, peer);
    if (!g) return false;
    uint32_t i = 0;
    while (g->members[i].peer != peer) i++;
    bool admitted = g->members[i].admitted;
    memmove(&g->members[i], &g->members[i + 1], (g->n_members - i - 1) * sizeof *g->members);
    g->n_members--;
    if (admitted) {
        if (g->state == GROUP_FORMING || g->state == GROUP_ACTIVE) {
            end_epoch(t, g, out);
        } else if (g->state == GROUP_REFORMING && g->step_active && g->resolver == peer) {
            group_entry *l = first_admitted(g);
            if (l) g->resolver = l->peer;
            else no_resolver(t, g, out);
        }
    }
    try_form(g, out);
    if (!g->n_members) {
        assert(!g->step_active);
        table_remove(t, g);
    }
    return true;
}

void group_dissolve(group_table *t, group *g)
{
    assert(!g->step_active);
    table_remove(t, g);
}

int group_set_id(group *g, uint64_t peer, uint64_t epoch, const uint8_t *id, uint32_t len)
{
    group_entry *m = group_entry_of(g, peer);
    if (!m || !m->admitted || epoch != g->epoch ||
        (g->state != GROUP_FORMING && g->state != GROUP_ACTIVE))
        return DFLASH_ESTALE;
    if (m->rank != 0) return DFLASH_EDENIED;
    if (len == 0 || len > GROUP_ID_BYTES) return DFLASH_ERANGE;
    if (g->state == GROUP_ACTIVE)
        return g->id_len == len && memcmp(g->id, id, len) == 0 ? 0 : DFLASH_EEXISTS;
    memcpy(g->id, id, len);
    g->id_len = len;
    set_state(g, GROUP_ACTIVE);
    return 0;
}

int group_step_check(group *g, uint64_t peer, uint64_t epoch, uint64_t step, group_slot **slot)
{
    return group_micro_check(g, peer, epoch, step, 0, slot);
}

int group_micro_check(group *g, uint64_t peer, uint64_t epoch, uint64_t step, uint32_t micro,
                      group_slot **slot)
{
    *slot = NULL;
    group_entry *m = group_entry_of(g, peer);
    if (!m || !m->admitted || epoch != g->epoch || g->state == GROUP_REFORMING)
        return DFLASH_ESTALE;
    if (g->state == GROUP_FORMING) return DFLASH_EAGAIN;
    if (g->step_active) {
        if (step == g->step + 1) return DFLASH_EAGAIN; /* rank 0's StepDone is on its way */
        if (step != g->step) return DFLASH_ESTATE;
        if (micro < g->step_micros) {
            *slot = &g->slots[micro * g->step_world + m->rank];
            return 0;
        }
        if (g->step_end) return DFLASH_ESHUTDOWN; /* the step ended: the same for every rank */
        return micro == g->step_micros && micro < g->step_accumulate ? 0 : DFLASH_ESTATE;
    }
    return step == g->base_step + 1 && micro == 0 ? 0 : DFLASH_ESTATE;
}

void group_step_begin(group *g, uint64_t step, const group_slot *slots)
{
    assert(g->state == GROUP_ACTIVE && !g->step_active);
    g->step_active = true;
    g->step = step;
    g->step_epoch = g->epoch;
    g->step_world = g->world;
    g->step_micros = 1;
    g->step_accumulate = group_accumulate(g);
    g->step_end = 0;
    assert(g->step_world * g->step_accumulate <= GROUP_MAX_UNITS); /* group_join's limit */
    memcpy(g->slots, slots, g->world * sizeof *slots);
}

void group_step_add(group *g, const group_slot *slots)
{
    assert(g->state == GROUP_ACTIVE && g->step_active && !g->step_end &&
           g->step_micros < g->step_accumulate);
    memcpy(&g->slots[step_units(g)], slots, g->step_world * sizeof *slots);
    g->step_micros++;
}

void group_step_end(group *g)
{
    assert(g->step_active && g->step_micros >= 1);
    if (!g->step_end) g->step_end = g->step_micros;
}

static bool slots_hold(const group_slot *slots, uint32_t n, const batch_id *id)
{
    for (uint32_t r = 0; r < n; r++)
        if (slots[r].released && same_batch(&slots[r].batch, id)) return true;
    return false;
}

bool group_orphan_expire(group_table *t, uint64_t now_ms, uint64_t wait_ms,
                         char name[GROUP_MAX_NAME], group_outcome *out)
{
    memset(out, 0, sizeof *out);
    for (uint32_t i = 0; i < t->n_orphans; i++) {
        group_orphan *o = t->orphans[i];
        if (!o->stamped) {
            o->stamped = true;
            o->since_ms = now_ms;
        }
        if (now_ms - o->since_ms < wait_ms) continue;
        set_verdict(out, GROUP_ABORT, o->step, o->slots, o->n_slots);
        out->orphan = true;
        snprintf(name, GROUP_MAX_NAME, "%s", o->name);
        free(o);
        t->orphans[i] = t->orphans[--t->n_orphans];
        return true;
    }
    return false;
}

bool group_owns_batch(const group_table *t, const batch_id *id)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (t->g[i]->step_active && slots_hold(t->g[i]->slots, step_units(t->g[i]), id))
            return true;
    for (uint32_t i = 0; i < t->n_orphans; i++)
        if (slots_hold(t->orphans[i]->slots, t->orphans[i]->n_slots, id)) return true;
    return false;
}

group_slot *group_slot_of_lease(group_table *t, uint64_t lease_id)
{
    for (uint32_t i = 0; i < t->n; i++) {
        group *g = t->g[i];
        if (!g->step_active) continue;
        for (uint32_t r = 0; r < step_units(g); r++)
            if (g->slots[r].lease_id == lease_id) return &g->slots[r];
    }
    return NULL;
}

int group_step_done(group_table *t, group *g, uint64_t peer, uint64_t epoch, uint64_t step,
                    group_outcome *out)
{
    (void)t;
    memset(out, 0, sizeof *out);
    if (g->step_active && g->step_epoch == epoch && g->step == step) {
        if (g->slots[0].peer != peer || !group_entry_of(g, peer)) return DFLASH_EDENIED;
        resolve(g, GROUP_ACK, out);
        try_form(g, out);
        return 0;
    }
    if (g->done_epoch == epoch && g->done_step == step) return 0; /* duplicate: KEEP */
    return DFLASH_ESTALE;
}

uint32_t group_orphan_count(const group_table *t) { return t->n_orphans; }

bool group_orphan_get(const group_table *t, uint32_t i, uint64_t now_ms, group_orphan_info *out)
{
    if (i >= t->n_orphans) return false;
    const group_orphan *o = t->orphans[i];
    snprintf(out->name, sizeof out->name, "%s", o->name);
    out->step = o->step;
    out->n_units = o->n_slots;
    out->waited_ms = o->stamped && now_ms > o->since_ms ? now_ms - o->since_ms : 0;
    return true;
}

/* --- orphans across a restart: bytes (format in the header) ---------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int group_orphans_encode(const group_table *t, uint8_t *buf, uint32_t cap)
{
    uint32_t at = 0;
    for (uint32_t i = 0; i < t->n_orphans; i++) {
        const group_orphan *o = t->orphans[i];
        uint32_t name_len = (uint32_t)strlen(o->name) + 1;
        if (cap - at < name_len + 12 + 12 * o->n_slots) return DFLASH_ENOMEM;
        memcpy(buf + at, o->name, name_len);
        at += name_len;
        put_le(buf + at, o->step, 8);
        put_le(buf + at + 8, o->n_slots, 4);
        at += 12;
        for (uint32_t r = 0; r < o->n_slots; r++, at += 12) {
            put_le(buf + at, o->slots[r].batch.epoch, 4);
            put_le(buf + at + 4, o->slots[r].batch.bucket, 4);
            put_le(buf + at + 8, o->slots[r].batch.index, 4);
        }
    }
    return (int)at;
}

/* One step from the bytes at p + *at (len in all) into o; *at moves past it. False when
 * malformed: no terminated name of 1..GROUP_MAX_NAME - 1 bytes, or a unit count out of range or
 * past the end. */
static bool decode_orphan(const uint8_t *p, uint32_t len, uint32_t *at, group_orphan *o)
{
    const uint8_t *nul = memchr(p + *at, 0, len - *at);
    uint32_t name_len = nul ? (uint32_t)(nul - (p + *at)) : 0;
    if (!nul || name_len == 0 || name_len >= GROUP_MAX_NAME) return false;
    memset(o, 0, sizeof *o);
    memcpy(o->name, p + *at, name_len);
    uint32_t q = *at + name_len + 1;
    if (len - q < 12) return false;
    o->step = get_le(p + q, 8);
    uint32_t n = (uint32_t)get_le(p + q + 8, 4);
    q += 12;
    if (n == 0 || n > GROUP_MAX_UNITS || (len - q) / 12 < n) return false;
    for (uint32_t r = 0; r < n; r++, q += 12) {
        o->slots[r].batch = (batch_id){(uint32_t)get_le(p + q, 4), (uint32_t)get_le(p + q + 4, 4),
                                       (uint32_t)get_le(p + q + 8, 4)};
        o->slots[r].released = true;
    }
    o->n_slots = n;
    *at = q;
    return true;
}

int group_orphans_restore(group_table *t, const uint8_t *p, uint32_t len,
                          bool (*unit_stands)(void *ctx, const batch_id *id), void *ctx)
{
    assert(t->n_orphans == 0);
    group_orphan *got[GROUP_MAX_GROUPS];
    uint32_t n = 0, at = 0;
    int rc = 0;
    while (at < len && !rc) {
        if (n == GROUP_MAX_GROUPS) rc = DFLASH_ECORRUPT;
        else if (!(got[n] = malloc(sizeof *got[n]))) rc = DFLASH_ENOMEM;
        else if (!decode_orphan(p, len, &at, got[n++])) rc = DFLASH_ECORRUPT;
        for (uint32_t k = 0; k + 1 < n && !rc; k++)
            if (strcmp(got[k]->name, got[n - 1]->name) == 0) rc = DFLASH_ECORRUPT;
    }
    for (uint32_t k = 0; k < n; k++) {
        group_orphan *o = got[k];
        uint32_t kept = 0;
        for (uint32_t r = 0; r < o->n_slots && !rc; r++)
            if (unit_stands(ctx, &o->slots[r].batch)) o->slots[kept++] = o->slots[r];
        o->n_slots = kept;
        if (!rc && kept) t->orphans[t->n_orphans++] = o;
        else free(o);
    }
    return rc ? rc : (int)t->n_orphans;
}
