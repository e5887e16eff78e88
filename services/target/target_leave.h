/* target_leave: a stopping target's goodbye (PoolLeave; docs/protocol.md, "Stopping a target").
 *
 * A target that stops while the broker serves (a stop signal, --max-batches) gives up its pool
 * before it frees the memory: the broker grants nothing more from it at once, returns its ready
 * and filling batches to to-do, and answers how many of its slots drafters are still copying.
 * While some are, the target keeps the memory and asks again every TARGET_LEAVE_POLL_MS, so no
 * drafter's copy reads freed memory; at none the broker has ended the session and the target
 * exits. The wait is bounded by the broker's lease timeout (as its latest answer states it: a
 * live `dflash-ctl set` changes it; counted from the first answer): every such lease was
 * granted before the leave, and a copy ends within a lease timeout of its grant (the premise
 * of every lease, and of the restart fence: a copy takes micro- to milliseconds). The premise is not enforced: a live drafter's heartbeats extend its leases, so
 * a copy hung past the bound keeps its lease while the target exits and frees the memory under
 * it (the WARN says so). A broker that does not answer (--timeout-ms, one request) or
 * does not know the message (Error PROTO: older than it) ends the leave at once: the target
 * exits as before and the broker expires it.
 *
 * Thread: the target's main thread, after its loop; the heartbeat thread may poll the same client
 * meanwhile (the client serialises calls). Caller: target_loop.c.
 */
#ifndef DFLASH_TARGET_LEAVE_H
#define DFLASH_TARGET_LEAVE_H

#include "client.h"

#include <stdint.h>

#define TARGET_LEAVE_POLL_MS 10

/* Leaves the broker of c, giving up pool pool_incarnation, and waits as above; logs what
 * happened (INFO; WARN when copies were still running at the bound). Returns 0 once no slot of
 * the pool is being copied (the session is over), DFLASH_EAGAIN at the bound with copies still
 * running, or the request's error (DFLASH_ETIMEOUT, DFLASH_EPROTO, DFLASH_ESTALE, ...). */
int target_leave(client *c, uint64_t pool_incarnation);

#endif
