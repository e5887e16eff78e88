/* pool_reach: the up-front peer-access check of a cuda pool on another GPU. See pool_reach.h.
 *
 * The decision (pool_reach_decide) is a pure function of the runtime's answers, so its outcomes
 * and messages are unit-tested without a GPU; pool_reach_check gathers those answers through
 * pool_cuda (dlopen'ed libcudart) and logs the line. Only the importer's device is made current.
 */
#include "pool_reach.h"
#include "err.h"
#include "log.h"
#include "pool_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOPO_HINT                                                                                  \
    "`nvidia-smi topo -m` shows how the GPUs are linked, `nvidia-smi topo -p2p r` which pairs "    \
    "can read each other"

bool pool_bus_id_valid(const char *s, size_t cap)
{
    const char *end = memchr(s, 0, cap);
    if (!end) return false;
    for (const char *c = s; c < end; c++)
        if (!strchr("0123456789abcdefABCDEF:.", *c)) return false;
    return true;
}

static const char *or_unknown(const char *s) { return s && s[0] ? s : "(bus id unknown)"; }

pool_reach pool_reach_decide(const pool_reach_facts *f, char *msg, size_t len)
{
    const char *pool = f->pool_bus_id;
    const char *mine = or_unknown(f->device_bus_id);
    if (len) msg[0] = '\0';
    if (!pool || !pool[0]) return POOL_REACH_UNKNOWN;
    if (!f->visible) {
        snprintf(msg, len,
                 "the target's slot pool is on GPU %s, which this process cannot see "
                 "(CUDA_VISIBLE_DEVICES=%s): whether this GPU (device %d, %s) has peer access to "
                 "it cannot be checked up front. Mapping it anyway (CUDA IPC may open a hidden "
                 "GPU's memory); if the copies fail, make GPU %s visible to this drafter",
                 pool, f->visible_devices ? f->visible_devices : "(unset)", f->device, mine,
                 pool);
        return POOL_REACH_HIDDEN;
    }
    if (f->pool_device == f->device) {
        snprintf(msg, len, "the target's slot pool is on this drafter's own GPU (device %d, %s): "
                 "copies stay on the GPU", f->device, pool);
        return POOL_REACH_SAME;
    }
    if (f->can_access_peer) {
        snprintf(msg, len,
                 "the target's slot pool is on GPU %s (device %d here), this drafter is on GPU %s "
                 "(device %d): copies go over peer access (NVLink or PCIe; " TOPO_HINT ")",
                 pool, f->pool_device, mine, f->device);
        return POOL_REACH_PEER;
    }
    snprintf(msg, len,
             "the target's slot pool is on GPU %s (device %d here), and this drafter's GPU %s "
             "(device %d) has no peer access to it: CUDA IPC cannot map the pool, so no batch can "
             "be copied. Run this drafter on a GPU with peer access to %s (NVLink, or PCIe under "
             "the same root complex; " TOPO_HINT "), or on the target's own GPU",
             pool, f->pool_device, mine, f->device, pool);
    return POOL_REACH_NO_PEER;
}

int pool_reach_level(pool_reach r)
{
    switch (r) {
    case POOL_REACH_NO_PEER: return LOG_ERROR;
    case POOL_REACH_HIDDEN: return LOG_WARN;
    default: return LOG_INFO;
    }
}

const char *pool_reach_name(pool_reach r)
{
    switch (r) {
    case POOL_REACH_SAME: return "same GPU";
    case POOL_REACH_PEER: return "peer access";
    case POOL_REACH_HIDDEN: return "not visible";
    case POOL_REACH_NO_PEER: return "no peer access";
    default: return "unknown";
    }
}

pool_reach pool_reach_check(int device, const char *pool_bus_id)
{
    char mine[POOL_BUS_ID_MAX] = "";
    pool_reach_facts f = {.pool_bus_id = pool_bus_id, .device = device, .device_bus_id = mine,
                          .visible_devices = getenv("CUDA_VISIBLE_DEVICES")};
    if (!pool_bus_id || !pool_bus_id[0]) return POOL_REACH_UNKNOWN;
    (void)pool_cuda_bus_id(device, mine, sizeof mine); /* only for the message */
    int rc = pool_cuda_device_by_bus_id(pool_bus_id, &f.pool_device);
    f.visible = rc == 0;
    if (rc == 0 && f.pool_device != device)
        rc = pool_cuda_can_access_peer(device, f.pool_device, &f.can_access_peer);
    if (rc < 0 && rc != DFLASH_ENOTFOUND) {
        LOG_WARN("cannot check whether GPU %s of the target's slot pool is reachable from device "
                 "%d: %s; mapping it as usual", pool_bus_id, device, err_str(rc));
        return POOL_REACH_UNKNOWN;
    }
    char msg[768];
    pool_reach r = pool_reach_decide(&f, msg, sizeof msg);
    if (msg[0]) log_write((log_level)pool_reach_level(r), __FILE__, __LINE__, "%s", msg);
    return r;
}
