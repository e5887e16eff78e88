/* target_leave: see target_leave.h. One PoolLeave, then polls while the answer counts slots being
 * copied, until none is, the bound (the broker's lease timeout as its last answer states it, a
 * live `set` included; from its hello when the broker predates the field) or an error. */
#include "target_leave.h"

#include "err.h"
#include "log.h"
#include "monotime.h"

#include <inttypes.h>

/* Why the leave ended without the broker's "none copied", said once. */
static void say_leave_failed(client *c, int rc)
{
    if (rc == DFLASH_EPROTO)
        LOG_INFO("the broker does not know PoolLeave (%s: it predates it): exiting without "
                 "leaving, it expires us", client_last_error(c));
    else if (rc == DFLASH_ETIMEOUT)
        LOG_WARN("no answer to our leave (%s): exiting without it, the broker expires us",
                 client_last_error(c));
    else if (rc == DFLASH_ESTALE)
        LOG_INFO("the broker does not know our pool any more (it restarted or expired us): "
                 "nothing to wait for");
    else
        LOG_WARN("leaving the broker: %s (%s); exiting", err_str(rc), client_last_error(c));
}

int target_leave(client *c, uint64_t pool_incarnation)
{
    wire_pool_left left;
    int rc = client_pool_leave(c, pool_incarnation, &left);
    if (rc < 0) {
        say_leave_failed(c, rc);
        return rc;
    }
    /* defect: the hello's value was used, and after a live raise the memory was freed under
     * leases the broker still held valid */
    uint32_t hello_ms = client_lease_timeout_ms(c);
    uint32_t bound_ms = left.lease_timeout_ms ? left.lease_timeout_ms : hello_ms;
    LOG_INFO("leaving the broker: %u ready slots given back, %u filling given back (their batches "
             "back to to-do), %u being copied%s", left.ready, left.filling, left.leased,
             left.leased ? ": waiting for the copies" : "");
    uint64_t start = monotime_ms(), waited = 0;
    while (left.leased > 0 && waited < bound_ms) {
        monotime_sleep_ms(TARGET_LEAVE_POLL_MS);
        if ((rc = client_pool_leave(c, pool_incarnation, &left)) < 0) {
            say_leave_failed(c, rc);
            return rc;
        }
        bound_ms = left.lease_timeout_ms ? left.lease_timeout_ms : hello_ms;
        waited = monotime_ms() - start;
    }
    if (left.leased > 0) {
        LOG_WARN("leaving with %u slots still leased after the lease timeout (%u ms): their "
                 "drafters have not released them (a copy takes milliseconds: hung?); the "
                 "memory is freed under them, and each lease ends with its release or its "
                 "drafter's expiry", left.leased, bound_ms);
        return DFLASH_EAGAIN;
    }
    if (waited)
        LOG_INFO("left the broker: the drafters' copies ended within %" PRIu64 " ms", waited);
    else
        LOG_INFO("left the broker");
    return 0;
}
