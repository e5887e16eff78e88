/* recent_acks: see recent_acks.h (a ring of the last acks and who made them). */
#include "recent_acks.h"

void recent_acks_note(recent_acks *r, const batch_id *batch, const recent_acker *by)
{
    uint64_t i = r->n++ % RECENT_ACKS_CAP;
    r->ring[i].batch = *batch;
    r->ring[i].by = *by;
}

bool recent_acks_find(const recent_acks *r, const batch_id *batch, recent_acker *by)
{
    uint64_t kept = r->n < RECENT_ACKS_CAP ? r->n : RECENT_ACKS_CAP;
    for (uint64_t k = 1; k <= kept; k++) {
        uint64_t i = (r->n - k) % RECENT_ACKS_CAP;
        if (same_batch(&r->ring[i].batch, batch)) {
            *by = r->ring[i].by;
            return true;
        }
    }
    return false;
}

bool recent_acker_same(const recent_acker *a, const recent_acker *b)
{
    return (a->incarnation && a->incarnation == b->incarnation) ||
           (a->run_id && a->run_id == b->run_id);
}
