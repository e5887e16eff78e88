/* broker_leave: a target's leave (PoolLeave; docs/protocol.md, "Stopping a target"). A target
 * that stops (a stop signal, --max-batches) used to vanish: the broker kept its pool registered
 * until it expired the target, granted its ready slots meanwhile (the drafters could not read the
 * removed memory) and its plan still counted the target. Now it says so:
 *
 *   first PoolLeave  the pool is given up at once (broker_pool_give_up, as for a drain's ready
 *                    slots nobody took): nothing more is granted from it, its READY and FILLING
 *                    batches go back to to-do, its LEASED slots become detached leases (their
 *                    drafters finish the copy and release as usual); the answer counts the three;
 *   later ones       (polls) count the detached leases still out;
 *   none left        the answer says 0 and the target's session ends (broker.c's dispatch ends
 *                    it as an expiry would, without the wait): the target may free its memory.
 *
 * So no drafter copies freed memory, and the target waits only for copies (micro- to
 * milliseconds; the target bounds its wait by the lease timeout). Thread: the broker's loop
 * thread. Caller: broker.c (dispatch).
 */
#include "broker_state.h"

#include "err.h"
#include "log.h"

#include <inttypes.h>

bool broker_on_pool_leave(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    uint64_t inc = m->u.pool_incarnation;
    if (p->pool_id < 0 || !b->policy || b->pools[p->pool_id].desc.pool_incarnation != inc) {
        reply_error(b, r, m->request_id, DFLASH_ESTALE, "unknown pool %016" PRIx64, inc);
        return false;
    }
    uint32_t id = (uint32_t)p->pool_id;
    reply_init(b, r, WIRE_POOL_LEFT, m->request_id);
    wire_pool_left *left = &r->u.left;
    if (b->pools[id].registered) {
        broker_slot_counts slots = broker_pool_slots(b, id);
        broker_pool_give_up(b, id);
        left->ready = slots.ready;
        left->filling = slots.filling;
        LOG_INFO("target %s leaving: %u ready slots given back, %u filling given back (their "
                 "batches back to to-do), %u being copied", p->name, slots.ready, slots.filling,
                 slots.leased);
    }
    left->leased = policy_detached_leases(b->policy, id, inc);
    left->lease_timeout_ms = (uint32_t)b->cfg.lease_timeout_ms; /* live: the hello's may be old */
    return left->leased == 0;
}
