/* pool: a slot arena shared between the target (exporter) and drafters (importers), DESIGN §3.
 *
 * One interface, two backends:
 *   POOL_CUDA  one 2 MiB-aligned cudaMalloc arena on one GPU, exported once with
 *              cudaIpcGetMemHandle, plus one cudaEventInterprocess|DisableTiming event per slot,
 *              each exported once. Slot i lives at offset i * slot_bytes (a handle always maps
 *              the allocation base, so descriptors carry offsets).
 *   POOL_HOST  one POSIX shared-memory object (mode 0600) named "/dflash.<name>.<pid>.<inc>"
 *              from the exporter's pid and incarnation; the "event" is a release/acquire fence
 *              (the broker round trip between publish and copy orders the bytes anyway).
 * Both publish the same pool_desc (serialised with pool_desc_encode for the wire), and a grant
 * names (incarnation, slot, offset, bytes), so broker and worker logic are backend-agnostic.
 *
 * Exporter (target, its main thread; the stream is its compute stream):
 *   pool_new -> pool_descriptor (register with the broker) -> per work unit: pool_slot_ptr,
 *   fill, pool_slot_publish (records the slot event; no host sync) -> SLOT_READY. The target
 *   never rewrites a slot until the broker returns it FREE (the lease is the reference count).
 *   pool_destroy frees the arena and unlinks the shm object.
 * Importer (drafter, its main thread; one private copy stream per importer):
 *   pool_importer_new -> on a grant: pool_importer_attach(desc) or pool_importer_attach_slot
 *   (a cuda pool on a GPU named by bus id is first checked for peer access: pool_reach.h;
 *   maps once per (incarnation, arena) and caches it; one importer keeps the mappings of up to
 *   POOL_IMPORT_MAX pools at once, one per pool name, evicting the least recently used; a new
 *   incarnation of a pool name closes that name's old mapping) -> pool_copy_start (stream-waits
 *   on the slot event, async copy into staging) -> pool_copy_wait / pool_copy_poll -> release
 *   the slot at once -> train -> ack. Now and then (and before each new mapping):
 *   pool_importer_close_stale, so that no mapping keeps a gone exporter's memory alive.
 *   A handle is never opened in its exporter's own process: pools created in this process are
 *   found in a process-local registry and used through raw pointers (single-process mode).
 * Single copy in flight per importer. Not thread-safe: one thread per pool / importer object.
 * Without CUDA in the build, POOL_CUDA operations return DFLASH_EUNSUPPORTED.
 */
#ifndef DFLASH_POOL_H
#define DFLASH_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "pool_reach.h"

#define POOL_MAX_SLOTS 256u
#define POOL_HANDLE_BYTES 64u /* sizeof(cudaIpcMemHandle_t) == sizeof(cudaIpcEventHandle_t) */
#define POOL_NAME_MAX 32u     /* logical pool name, e.g. "target0", incl. terminator */
#define POOL_SHM_NAME_MAX 64u /* == WIRE_MAX_NAME: it travels in the protocol */
#define POOL_ARENA_ALIGN (2u << 20)
#define POOL_DESC_MAX_BYTES (256u + POOL_MAX_SLOTS * POOL_HANDLE_BYTES)
#define POOL_IMPORT_MAX 8u     /* pools one importer keeps mapped at once (LRU beyond) */
#define POOL_SWEEP_REUSE_MARGIN_MS 100 /* pool_sweep_stale: a later start, by more than this */
#define POOL_IMPORT_IDLE_MS 60000u /* a mapping unused this long is closed (close_stale) */

typedef enum { POOL_HOST = 1, POOL_CUDA = 2 } pool_backend;

/* Everything an importer needs to map a pool. Plain data. */
typedef struct pool_desc {
    pool_backend backend;
    uint32_t n_slots;
    uint64_t incarnation; /* random, non-zero, new at every exporter start */
    uint64_t slot_bytes;  /* stride between slots, multiple of 256 */
    uint64_t arena_bytes; /* multiple of POOL_ARENA_ALIGN, >= n_slots * slot_bytes */
    int32_t device;       /* exporter's CUDA ordinal; -1 for host */
    int32_t owner_pid;
    char gpu_bus_id[POOL_BUS_ID_MAX]; /* cuda: the arena's GPU by PCI bus id; "" unknown */
    char name[POOL_NAME_MAX];
    char shm_name[POOL_SHM_NAME_MAX]; /* host */
    uint8_t mem_handle[POOL_HANDLE_BYTES];                   /* cuda */
    uint8_t event_handles[POOL_MAX_SLOTS][POOL_HANDLE_BYTES]; /* cuda, n_slots used */
} pool_desc;

typedef struct pool_config {
    pool_backend backend;
    const char *name;     /* logical name, [A-Za-z0-9_-], 1..POOL_NAME_MAX-1 chars */
    uint32_t n_slots;     /* 1..POOL_MAX_SLOTS */
    uint64_t slot_bytes;  /* > 0; rounded up to 256 */
    int device;           /* cuda: GPU ordinal */
    uint64_t incarnation; /* 0: draw a random one */
} pool_config;

typedef struct pool pool;
typedef struct pool_importer pool_importer;

/* "host" / "cuda" <-> enum. Parse also takes "cpu" (= host) and "auto" (cuda when this build has
 * the cuda compute backend and a GPU is visible, else host); returns 0, DFLASH_EINVAL (no such
 * backend), DFLASH_EUNSUPPORTED ("cuda" in a build without CUDA) or DFLASH_ENOTFOUND ("cuda"
 * with no GPU visible): bad configuration, found at start-up rather than when the pool or the
 * compute context is made (the target exited 1, the drafter 2). pool_backend_refusal: what to
 * tell the user for parse's code. */
const char *pool_backend_name(pool_backend b);
int pool_backend_parse(const char *s, pool_backend *out);
const char *pool_backend_refusal(int rc);
/* True when this build has CUDA and a device is visible. */
bool pool_cuda_available(void);

/* True when s can name a pool (a target's --name): 1..POOL_NAME_MAX-1 characters, each a letter,
 * a digit, '-' or '_'. */
bool pool_name_valid(const char *s);

/* ---- exporter ---- */

/* Creates and exports the arena and events. Returns the pool or NULL with *err (optional):
 * DFLASH_EINVAL, DFLASH_EUNSUPPORTED (cuda without CUDA), DFLASH_EIO (shm, including a
 * /dev/shm too small for the arena: host pages are reserved here, not at first write),
 * DFLASH_ECUDA, DFLASH_ENOMEM. Main thread of the exporter. */
pool *pool_new(const pool_config *cfg, int *err);
/* Frees the arena, destroys events, unlinks the shm object. Accepts NULL; NULLs *p. */
void pool_destroy(pool **p);
/* The descriptor to register; valid for the pool's lifetime. */
const pool_desc *pool_descriptor(const pool *p);
/* Pointer to slot i in the exporter's address space (host pointer or device pointer). */
void *pool_slot_ptr(pool *p, uint32_t slot);
uint64_t pool_slot_offset(const pool *p, uint32_t slot);
/* Marks slot i as written: cuda records its event on stream (a cudaStream_t, NULL = legacy
 * default stream) without host synchronisation; host issues a release fence. 0 or code. */
int pool_slot_publish(pool *p, uint32_t slot, void *stream);
/* Blocks until everything published on slot i is complete (tests, shutdown). 0 or code. */
int pool_slot_sync(pool *p, uint32_t slot);

/* Removes shm objects "/dev/shm/dflash.<name>.<pid>.*" left by dead processes (a SIGKILLed
 * exporter cannot unlink its own): those whose pid is gone (or names a process started over
 * POOL_SWEEP_REUSE_MARGIN_MS after the object last changed: the dead owner's pid reused) and
 * whose owner lock (a shared flock a live exporter holds on its object) nobody holds. name NULL
 * sweeps every pool name. Returns how many were removed (>= 0). Host exporters call it with
 * NULL at start-up, so a target that comes back under another name (target-<host> in a new
 * container) still frees its old one. Objects of another uid are left alone. */
int pool_sweep_stale(const char *name);
/* The sweep's judgement of a live pid: true when the process under it started more than
 * POOL_SWEEP_REUSE_MARGIN_MS after `changed` (the object's last change, st_ctim), so it is not
 * the object's maker. */
bool pool_owner_pid_reused(int pid, const struct timespec *changed);

/* ---- descriptor wire format ---- */

/* Serialises d into buf (cap bytes, POOL_DESC_MAX_BYTES is always enough). Returns the length
 * or DFLASH_ERANGE. */
int pool_desc_encode(const pool_desc *d, uint8_t *buf, size_t cap);
/* Parses and range-checks a serialised descriptor. Returns 0, DFLASH_EFORMAT, DFLASH_EVERSION
 * or DFLASH_ERANGE. */
int pool_desc_decode(const uint8_t *buf, size_t len, pool_desc *out);

/* ---- importer ---- */

/* An importer for backend on GPU device (ignored for host); creates its copy stream and
 * completion event. NULL with *err on failure. Main thread of the consumer. */
pool_importer *pool_importer_new(pool_backend backend, int device, int *err);
/* Closes every mapping and event, then frees. Waits for a copy in flight. Accepts NULL. */
void pool_importer_destroy(pool_importer **imp);
/* Makes the pool described by d available (maps the arena and events once; cached by
 * (incarnation, arena)). A different incarnation with the same pool name closes the old
 * mapping first (that exporter is gone); mappings of other names stay, the least recently used
 * one is closed when POOL_IMPORT_MAX are held. A new mapping first closes those of gone or idle
 * pools (pool_importer_close_stale). A cuda pool whose GPU is named (gpu_bus_id) is first
 * checked for reach (pool_reach_check, once per GPU; it logs which path copies take). A host
 * pool is mapped only when its shm name has our pools' form ("/dflash.<name>.<pid>.<16 hex>")
 * and the object is ours alone (our effective uid, no group or other access): a broker's word
 * cannot point the importer at another /dev/shm object. Returns 0, DFLASH_EMISMATCH (backend),
 * DFLASH_ENOTFOUND (shm object gone: the exporter died), DFLASH_EDENIED (host: not such a name,
 * or not our object; a warning says which), DFLASH_EIO, DFLASH_ECUDA, DFLASH_EPEER (the pool's
 * GPU is visible and this importer's GPU has no peer access to it: no grant of it can ever be
 * copied, give up; the ERROR is logged). */
int pool_importer_attach(pool_importer *imp, const pool_desc *d);
/* What a broker grant says about one slot (DESIGN §2 step 4): enough to map the pool and wait
 * on that slot's event without the full descriptor. */
typedef struct pool_slot_ref {
    pool_backend backend;
    uint64_t incarnation;
    uint32_t slot;
    uint64_t offset, bytes;
    int32_t device;
    char pool_name[POOL_SHM_NAME_MAX];         /* the pool's identity (its target's name);
                                                  "" unknown (an older broker) */
    char shm_name[POOL_SHM_NAME_MAX];          /* host */
    char gpu_bus_id[POOL_BUS_ID_MAX];          /* cuda: the pool's GPU; "" unknown */
    uint8_t mem_handle[POOL_HANDLE_BYTES];   /* cuda */
    uint8_t event_handle[POOL_HANDLE_BYTES]; /* cuda: this slot's event */
} pool_slot_ref;

/* Attach for a grant: maps the arena of ref's incarnation unless cached, and remembers the
 * slot's event handle (opened on first copy). Mappings are cached per pool as by
 * pool_importer_attach, so grants alternating between pools map each one once. A new
 * incarnation of ref's pool_name means that exporter restarted: its old mapping is closed. The
 * name of a host pool is also read from its shm name; a cuda grant without pool_name (older
 * broker) cannot be told apart from a restart, so it closes every other mapping. Pools of this
 * process are used through raw pointers. Returns as pool_importer_attach, or DFLASH_ERANGE. */
int pool_importer_attach_slot(pool_importer *imp, const pool_slot_ref *ref);
/* Closes the mapping of one incarnation (its exporter is known dead). No-op if unknown. */
void pool_importer_forget(pool_importer *imp, uint64_t incarnation);
/* Closes every mapping (the broker restarted and pools will be re-announced). */
void pool_importer_forget_all(pool_importer *imp);
/* Closes the mappings of pools that are gone or idle: a host pool whose shm object was unlinked
 * (its exporter's pool_destroy, or the next exporter's sweep after its death: the mapping alone
 * would keep its pages in /dev/shm, where a restarted target may then find no room), and any
 * pool not used (attached or copied from) for idle_ms (for cuda the only sign: an IPC mapping
 * keeps a dead exporter's allocation, and its death cannot be seen from here). Never the pool
 * a copy in flight reads. A later grant of a closed pool maps it again. Cheap (one fstat per
 * host mapping); every new mapping runs it first with POOL_IMPORT_IDLE_MS. Returns how many
 * mappings it closed. */
int pool_importer_close_stale(pool_importer *imp, uint64_t idle_ms);
/* Number of cached mappings (for tests and status). */
int pool_importer_mappings(const pool_importer *imp);
/* How many arenas this importer has mapped so far (shm_open+mmap or cudaIpcOpenMemHandle;
 * pools of this process do not count), for tests and status. */
uint64_t pool_importer_opens(const pool_importer *imp);

/* Starts copying bytes [offset, offset+bytes) of the pool with that incarnation into dst (a
 * staging buffer from pool_staging_alloc): cuda makes the copy stream wait on the slot's event
 * and issues cudaMemcpyAsync; host copies at once. offset must be slot's offset and the range
 * must lie inside the slot. Returns 0, DFLASH_ESTALE (incarnation not attached), DFLASH_ERANGE,
 * DFLASH_ESTATE (a copy is already in flight), DFLASH_ECUDA. */
int pool_copy_start(pool_importer *imp, uint64_t incarnation, uint32_t slot, uint64_t offset,
                    uint64_t bytes, void *dst);
/* 1 when the copy in flight is done (or none is), 0 while it runs, or a negative code. */
int pool_copy_poll(pool_importer *imp);
/* Blocks until the copy in flight is done. 0 or code. Once done, the slot may be released. */
int pool_copy_wait(pool_importer *imp);
/* The importer's copy stream (cudaStream_t) so the consumer can order its work after the copy;
 * NULL for host. */
void *pool_importer_stream(pool_importer *imp);

/* ---- staging buffers ---- */

/* A buffer a slot can be copied into: 256-byte aligned host memory, or device memory on GPU
 * device. NULL on failure. */
void *pool_staging_alloc(pool_backend backend, int device, size_t bytes);
/* Frees a staging buffer; accepts NULL and NULLs *buf. */
void pool_staging_free(pool_backend backend, int device, void **buf);
/* Copies n bytes of a staging buffer (or any pointer of that backend) into host memory dst,
 * synchronously. 0 or code. */
int pool_staging_read(pool_backend backend, void *dst, const void *src, size_t n);
/* Copies n host bytes into a buffer of that backend, synchronously. 0 or code. */
int pool_staging_write(pool_backend backend, void *dst, const void *src, size_t n);

#endif
