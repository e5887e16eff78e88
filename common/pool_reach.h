/* pool_reach: can this importer's GPU reach a cuda pool on another GPU? Decided once, up front.
 *
 * CUDA IPC maps another GPU's allocation only with peer access between the two GPUs (NVLink, or
 * PCIe under one root complex; not across some root complexes or in VMs whose IOMMU blocks it).
 * Without it every grant of the pool fails. The pool is named by its GPU's PCI bus id (the
 * PoolRegister / Grant field gpu_bus_id), which, unlike a device ordinal, means the same board
 * in every process whatever CUDA_VISIBLE_DEVICES says.
 *
 * pool_reach_decide is the pure decision over what the CUDA runtime reported (unit-tested
 * without a GPU); pool_reach_check asks the runtime (pool_cuda) and logs the decision's one line.
 * pool.c's importer calls pool_reach_check on the first mapping of a pool and caches the answer.
 * Thread: any; pool_reach_check runs on the importer's owning thread (it sets the device).
 */
#ifndef DFLASH_POOL_REACH_H
#define DFLASH_POOL_REACH_H

#include <stdbool.h>
#include <stddef.h>

#define POOL_BUS_ID_MAX 32u /* a PCI bus id ("0000:1b:00.0") and its NUL, with room to spare */

/* True when s, NUL-terminated within cap bytes, is empty (unknown) or a PCI bus id as CUDA
 * writes it: hex digits, ':' and '.' only. */
bool pool_bus_id_valid(const char *s, size_t cap);

typedef enum {
    POOL_REACH_UNKNOWN = 0, /* the pool's GPU is not named (older target, broker): map as before */
    POOL_REACH_SAME,        /* it is this importer's own GPU */
    POOL_REACH_PEER,        /* another GPU, with peer access from this one */
    POOL_REACH_HIDDEN,      /* not visible in this process: peer access cannot be checked; CUDA may
                               still map it, so try as before */
    POOL_REACH_NO_PEER,     /* another visible GPU without peer access: nothing can be copied */
} pool_reach;

/* What the CUDA runtime says about a pool's GPU, seen from the importer. */
typedef struct pool_reach_facts {
    const char *pool_bus_id;   /* the pool's GPU; "" or NULL unknown */
    int device;                /* the importer's device ordinal */
    const char *device_bus_id; /* its bus id; "" or NULL unknown */
    bool visible;              /* cudaDeviceGetByPCIBusId found the pool's GPU ... */
    int pool_device;           /* ... as this ordinal (when visible) */
    bool can_access_peer;      /* cudaDeviceCanAccessPeer(device, pool_device) (when they differ) */
    const char *visible_devices; /* CUDA_VISIBLE_DEVICES; NULL when unset */
} pool_reach_facts;

/* The outcome for f, and the one line to log about it in msg ("" for UNKNOWN): INFO for SAME and
 * PEER, WARN for HIDDEN, ERROR for NO_PEER (pool_reach_level). Pure. */
pool_reach pool_reach_decide(const pool_reach_facts *f, char *msg, size_t len);
/* The log level (log.h) of r's line. */
int pool_reach_level(pool_reach r);
/* "unknown", "same GPU", "peer access", "not visible", "no peer access". */
const char *pool_reach_name(pool_reach r);

/* Asks the CUDA runtime about the pool on GPU pool_bus_id as seen from device, decides, logs the
 * decision's line and returns it. A failing runtime query counts as unknown (logged as a
 * warning): the mapping then fails or works as it would have without the check. */
pool_reach pool_reach_check(int device, const char *pool_bus_id);

#endif
