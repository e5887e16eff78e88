/* pool: the exporter and importer sides of slot pools, host (POSIX shm) and cuda (IPC) backends.
 * See pool.h for the contract.
 *
 * Data structures:
 *   pool           the exporter's arena: base pointer, per-slot events (cuda), the descriptor.
 *                  Every live pool is also linked into a process-local registry (mutex-guarded)
 *                  so an importer in the same process uses raw pointers instead of opening its
 *                  own IPC handle, which CUDA refuses (infra.md 2.1).
 *   pool_importer  up to POOL_IMPORT_MAX mappings, each keyed by incarnation and named by its
 *                  pool (the broker serves one pool per target, and grants alternate between
 *                  them): the mapped base and lazily opened per-slot events. Invariants: at most
 *                  one mapping per pool name (a new incarnation of a name closes the old one: that
 *                  exporter is gone); a mapping of unknown name (a cuda grant from an older
 *                  broker) is alone. When all are taken, the least recently used (last_use, from
 *                  the importer's clock, bumped by attach and copy) is closed for room. Nothing
 *                  is closed while a copy is in flight (it is waited for first).
 *                  One copy in flight at a time (in_flight, reading copy_incarnation's pool),
 *                  tracked by done_event (cuda). reached: the GPUs (bus ids) of cuda pools
 *                  whose reach from this importer's GPU was checked (pool_reach) before their
 *                  first mapping, with the answer; a pool on a GPU without peer access is never
 *                  opened.
 *
 * Gone pools: a mapping keeps its pool's memory alive after the exporter is gone (host: the
 * pages of an unlinked shm object stay in /dev/shm while mapped, and a restarted target may not
 * find room for its own pool; cuda: an IPC mapping keeps the dead exporter's allocation). So a
 * host mapping keeps its shm object open (shm_fd) and pool_importer_close_stale closes those
 * whose object was unlinked (fstat: no links left), and any mapping unused for a while (used_ms;
 * for cuda the only sign, as an exporter's death cannot be seen from here). It runs before every
 * new mapping and whenever the drafter calls it.
 *
 * The descriptor's wire form is little-endian and fixed-order (pool_desc_encode).
 *
 * Stale segments: a SIGKILLed host exporter cannot unlink its shm object. Its owner holds a
 * shared flock on the object for the pool's life (owner_fd), so an exporter starting later
 * (pool_sweep_stale, every pool name) removes an object only when the pid in its name is gone
 * (or now names a process started after the object last changed: a dead owner's pid reused)
 * and nobody holds that lock: the lock protects a live owner whose pid this process cannot see
 * (another PID namespace sharing /dev/shm), the pid check an owner of a version without it.
 */
#include "pool.h"
#include "err.h"
#include "fsutil.h"
#include "log.h"
#include "monotime.h"
#include "pool_cuda.h"
#include "process.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_PREFIX "dflash."
#define DESC_MAGIC "DFLPOOL1"
#define DESC_VERSION 2u /* 2: the GPU's bus id after the shm name */
#define DESC_FIXED_BYTES                                                                           \
    (56u + POOL_NAME_MAX + POOL_SHM_NAME_MAX + POOL_BUS_ID_MAX + POOL_HANDLE_BYTES)

struct pool {
    pool_desc desc;
    void *base;                   /* host: mmap of the shm object; cuda: the cudaMalloc arena */
    void *events[POOL_MAX_SLOTS]; /* cuda: interprocess events, one per slot */
    int owner_fd;                 /* host: the shm object, flock'ed shared while we own it */
    struct pool *next;            /* registry link */
};

typedef struct pool_mapping {
    bool used;
    bool local; /* raw pointers into a pool of this process */
    uint64_t incarnation;
    uint64_t last_use;            /* importer clock at the last attach or copy (LRU) */
    uint64_t used_ms;             /* monotime_ms of the same moment (idle mappings) */
    int shm_fd;                   /* host, mapped here: the shm object (to see it unlinked); -1 */
    char name[POOL_SHM_NAME_MAX]; /* the pool's identity; "" unknown */
    uint32_t n_slots;
    uint64_t slot_bytes, arena_bytes;
    int device; /* exporter's device (local cuda pools) */
    void *base;
    void *events[POOL_MAX_SLOTS]; /* cuda: opened lazily; for local pools borrowed */
    uint8_t ev_handles[POOL_MAX_SLOTS][POOL_HANDLE_BYTES]; /* cuda: from the descriptor */
} pool_mapping;

struct pool_importer {
    pool_backend backend;
    int device;
    void *stream;     /* cuda copy stream */
    void *done_event; /* cuda: recorded after each copy */
    bool in_flight;
    uint64_t copy_incarnation; /* the pool the copy in flight reads */
    uint64_t opens; /* arenas mapped (not local), pool_importer_opens */
    uint64_t clock; /* bumped at every attach and copy; orders mappings by last use */
    pool_mapping maps[POOL_IMPORT_MAX];
    struct {                         /* pool GPUs already checked (pool_reach_check), */
        char bus_id[POOL_BUS_ID_MAX]; /* round-robin: one line per GPU, not per mapping */
        pool_reach reach;
    } reached[POOL_IMPORT_MAX];
    uint32_t n_reached;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pool *registry;

const char *pool_backend_name(pool_backend b)
{
    return b == POOL_HOST ? "host" : b == POOL_CUDA ? "cuda" : "?";
}

int pool_backend_parse(const char *s, pool_backend *out)
{
    if (strcmp(s, "auto") == 0) {
#ifdef DFLASH_HAVE_CUDA
        *out = pool_cuda_available() ? POOL_CUDA : POOL_HOST;
#else
        *out = POOL_HOST; /* no cuda compute backend in this build */
#endif
        return 0;
    }
    if (strcmp(s, "host") == 0 || strcmp(s, "cpu") == 0) *out = POOL_HOST;
#ifdef DFLASH_HAVE_CUDA
    else if (strcmp(s, "cuda") == 0 && !pool_cuda_available()) return DFLASH_ENOTFOUND;
    else if (strcmp(s, "cuda") == 0) *out = POOL_CUDA;
#else
    else if (strcmp(s, "cuda") == 0) return DFLASH_EUNSUPPORTED;
#endif
    else return DFLASH_EINVAL;
    return 0;
}

const char *pool_backend_refusal(int rc)
{
    return rc == DFLASH_EUNSUPPORTED ? "this build has no CUDA (built without nvcc): use "
                                       "--backend host (or auto)"
           : rc == DFLASH_ENOTFOUND  ? "no CUDA device is visible (the driver, "
                                       "CUDA_VISIBLE_DEVICES, a container's GPU reservation): "
                                       "use --backend host (or auto)"
                                     : "give host, cuda or auto";
}

bool pool_cuda_available(void)
{
    return pool_cuda_device_count() > 0;
}

/* Why a cuda pool (what) cannot be made here, and what to do instead. */
static void log_no_cuda(const char *what)
{
    LOG_ERROR("cuda %s requested, but %s: use --backend host (or auto)", what,
#ifdef DFLASH_HAVE_CUDA
              "no CUDA device is visible"
#else
              "this build has no CUDA (built without nvcc)"
#endif
    );
}

bool pool_name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= POOL_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

static uint64_t random_incarnation(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16);
    }
    return v ? v : 1;
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* ---------------------------------------------------------------- exporter */

static void registry_add(pool *p)
{
    pthread_mutex_lock(&registry_lock);
    p->next = registry;
    registry = p;
    pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(pool *p)
{
    pthread_mutex_lock(&registry_lock);
    for (pool **pp = &registry; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
}

/* Copies what an importer needs from a pool of this process; false if none has incarnation. */
static bool registry_find(uint64_t incarnation, pool_mapping *m)
{
    bool found = false;
    pthread_mutex_lock(&registry_lock);
    for (pool *p = registry; p; p = p->next) {
        /* a forked child inherits the list but not the CUDA context: only our own pools */
        if (p->desc.incarnation == incarnation && p->desc.owner_pid == (int32_t)getpid()) {
            m->base = p->base;
            m->device = p->desc.device;
            memcpy(m->events, p->events, sizeof m->events);
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

static int host_create(pool *p)
{
    pool_desc *d = &p->desc;
    int n = snprintf(d->shm_name, sizeof d->shm_name, "/" SHM_PREFIX "%s.%d.%016" PRIx64,
                     d->name, (int)getpid(), d->incarnation);
    if (n < 0 || (size_t)n >= sizeof d->shm_name) {
        LOG_ERROR("pool name '%s' is too long for a shared memory name", d->name);
        return DFLASH_EINVAL;
    }
    /* Between the create and the lock the segment is unlocked under its final name: a target
     * starting in another pid namespace (our pid means nothing there) sweeping it then takes
     * it for a dead process's and unlinks it (defect: we went on with a segment no drafter
     * could open). Once locked, one still linked is ours; an unlinked one is created again. */
    int fd = -1, rc = 0;
    for (int tries = 0; fd < 0; tries++) {
        fd = shm_open(d->shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) {
            LOG_ERROR("shm_open %s: %s (is /dev/shm mounted and writable?)", d->shm_name,
                      strerror(errno));
            return DFLASH_EIO;
        }
        struct stat st;
        if (flock(fd, LOCK_SH) != 0) { /* "owned by a live process" for pool_sweep_stale */
            LOG_ERROR("flock %s: %s", d->shm_name, strerror(errno));
            rc = DFLASH_EIO;
            goto fail_unlink;
        }
        if (fstat(fd, &st) == 0 && st.st_nlink > 0) break;
        close(fd);
        fd = -1;
        if (tries == 2) {
            LOG_ERROR("shared memory %s was removed as it was created, three times (another "
                      "process sweeping /dev/shm)", d->shm_name);
            return DFLASH_EIO;
        }
        LOG_WARN("shared memory %s was removed as it was created (another process sweeping "
                 "/dev/shm); creating it again", d->shm_name);
    }
    /* Reserve the pages now: a sparse ftruncate succeeds beyond what /dev/shm holds (64 MiB
     * in a container by default) and the first slot write past it dies of SIGBUS. */
    int e;
    while ((e = posix_fallocate(fd, 0, (off_t)d->arena_bytes)) == EINTR)
        ;
    if (e != 0) {
        LOG_ERROR("cannot reserve %" PRIu64 " bytes of shared memory for %s: %s (/dev/shm too "
                  "small? raise the container's shm size, or lower --slots or --token-budget)",
                  d->arena_bytes, d->shm_name, strerror(e));
        rc = DFLASH_EIO;
        goto fail_unlink;
    }
    p->base = mmap(NULL, d->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p->base == MAP_FAILED) {
        p->base = NULL;
        LOG_ERROR("mmap %s: %s", d->shm_name, strerror(errno));
        rc = DFLASH_EIO;
        goto fail_unlink;
    }
    p->owner_fd = fd; /* kept open: the lock lasts until pool_destroy or our death */
    return 0;
fail_unlink:
    shm_unlink(d->shm_name);
    close(fd);
    return rc;
}

/* The PCI bus id of a cuda device ordinal into bus ("" when unknown), and one line naming it
 * (who: "pool", "importer"): an ordinal means nothing to another process with another
 * CUDA_VISIBLE_DEVICES, the bus id does. */
static void cuda_device_bus_id(const char *who, int device, char *bus, size_t len)
{
    if (pool_cuda_bus_id(device, bus, len) == 0)
        LOG_INFO("cuda %s on device %d: PCI bus id %s", who, device, bus);
    else if (len)
        bus[0] = '\0';
}

static int cuda_create(pool *p)
{
    pool_desc *d = &p->desc;
    int rc = pool_cuda_alloc(d->device, d->arena_bytes, &p->base, d->mem_handle);
    if (rc < 0) return rc;
    cuda_device_bus_id("pool", d->device, d->gpu_bus_id, sizeof d->gpu_bus_id);
    for (uint32_t i = 0; i < d->n_slots; i++) {
        rc = pool_cuda_event_new(d->device, &p->events[i], d->event_handles[i]);
        if (rc < 0) return rc; /* pool_destroy frees what exists */
    }
    return 0;
}

pool *pool_new(const pool_config *cfg, int *err)
{
    int rc = DFLASH_EINVAL;
    if (!cfg || (cfg->backend != POOL_HOST && cfg->backend != POOL_CUDA)) goto fail;
    /* say which setting is wrong: the caller only sees "invalid argument" */
    if (!pool_name_valid(cfg->name)) {
        LOG_ERROR("pool name '%s': give 1 to %u letters, digits, '-' or '_'",
                  cfg->name ? cfg->name : "", POOL_NAME_MAX - 1);
        goto fail;
    }
    if (cfg->n_slots == 0 || cfg->n_slots > POOL_MAX_SLOTS) {
        LOG_ERROR("pool of %u slots: give 1 to %u", cfg->n_slots, POOL_MAX_SLOTS);
        goto fail;
    }
    if (cfg->slot_bytes == 0 || cfg->slot_bytes > (1ull << 40)) {
        LOG_ERROR("slots of %" PRIu64 " bytes: give 1 byte to 1 TiB", cfg->slot_bytes);
        goto fail;
    }
    if (cfg->backend == POOL_CUDA && !pool_cuda_available()) {
        log_no_cuda("pool");
        rc = DFLASH_EUNSUPPORTED;
        goto fail;
    }
    pool *p = calloc(1, sizeof *p);
    if (!p) {
        rc = DFLASH_ENOMEM;
        goto fail;
    }
    pool_desc *d = &p->desc;
    p->owner_fd = -1;
    registry_add(p); /* first, so pool_destroy on a failed start can unlink it */
    d->backend = cfg->backend;
    d->n_slots = cfg->n_slots;
    d->incarnation = cfg->incarnation ? cfg->incarnation : random_incarnation();
    d->slot_bytes = round_up(cfg->slot_bytes, 256);
    d->arena_bytes = round_up(d->slot_bytes * d->n_slots, POOL_ARENA_ALIGN);
    d->device = cfg->backend == POOL_CUDA ? cfg->device : -1;
    d->owner_pid = (int32_t)getpid();
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    if (cfg->backend == POOL_HOST) {
        pool_sweep_stale(NULL);
        rc = host_create(p);
    } else {
        rc = cuda_create(p);
    }
    if (rc < 0) {
        pool_destroy(&p);
        goto fail;
    }
    if (err) *err = 0;
    return p;
fail:
    if (err) *err = rc;
    return NULL;
}

void pool_destroy(pool **pp)
{
    if (!pp || !*pp) return;
    pool *p = *pp;
    registry_remove(p);
    if (p->desc.backend == POOL_HOST) {
        if (p->base) {
            munmap(p->base, p->desc.arena_bytes);
            shm_unlink(p->desc.shm_name);
        }
        if (p->owner_fd >= 0) close(p->owner_fd);
    } else {
        for (uint32_t i = 0; i < p->desc.n_slots; i++) {
            if (p->events[i]) {
                pool_cuda_event_sync(p->events[i]);
                pool_cuda_event_destroy(p->events[i]);
            }
        }
        pool_cuda_free(p->desc.device, p->base);
    }
    free(p);
    *pp = NULL;
}

const pool_desc *pool_descriptor(const pool *p)
{
    return &p->desc;
}

uint64_t pool_slot_offset(const pool *p, uint32_t slot)
{
    assert(slot < p->desc.n_slots);
    return (uint64_t)slot * p->desc.slot_bytes;
}

void *pool_slot_ptr(pool *p, uint32_t slot)
{
    return (char *)p->base + pool_slot_offset(p, slot);
}

int pool_slot_publish(pool *p, uint32_t slot, void *stream)
{
    if (slot >= p->desc.n_slots) return DFLASH_ERANGE;
    if (p->desc.backend == POOL_HOST) {
        atomic_thread_fence(memory_order_release);
        return 0;
    }
    return pool_cuda_event_record(p->events[slot], stream);
}

int pool_slot_sync(pool *p, uint32_t slot)
{
    if (slot >= p->desc.n_slots) return DFLASH_ERANGE;
    if (p->desc.backend == POOL_HOST) return 0;
    return pool_cuda_event_sync(p->events[slot]);
}

/* Parses "dflash.<name>.<pid>.<hex>"; returns the pid or -1, and copies the name. */
static int parse_shm_entry(const char *entry, char *name, size_t name_len)
{
    if (strncmp(entry, SHM_PREFIX, strlen(SHM_PREFIX)) != 0) return -1;
    const char *s = entry + strlen(SHM_PREFIX);
    const char *last = strrchr(s, '.');
    if (!last || last == s) return -1;
    const char *mid = last - 1;
    while (mid > s && *mid != '.') mid--;
    if (mid == s || (size_t)(mid - s) >= name_len) return -1;
    char *end;
    long pid = strtol(mid + 1, &end, 10);
    if (end != last || pid <= 0) return -1;
    memcpy(name, s, (size_t)(mid - s));
    name[mid - s] = '\0';
    return (int)pid;
}

/* Whether shm_name has the form host_create gives its objects, "/dflash.<pool name>.<pid>.<16
 * hex digits>": a grant or descriptor naming anything else in /dev/shm is never opened. */
static bool shm_name_ours(const char *shm_name)
{
    char name[POOL_NAME_MAX];
    if (shm_name[0] != '/' || parse_shm_entry(shm_name + 1, name, sizeof name) < 0 ||
        !pool_name_valid(name))
        return false;
    const char *hex = strrchr(shm_name, '.') + 1;
    if (strlen(hex) != 16) return false;
    for (const char *c = hex; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return false;
    return true;
}

/* The margin covers the two clocks' grain: the file system stamps a change with a coarse clock
 * (up to a scheduler tick early) and the start is read in clock ticks. */
bool pool_owner_pid_reused(int pid, const struct timespec *changed)
{
    struct timespec t = *changed;
    t.tv_nsec += POOL_SWEEP_REUSE_MARGIN_MS * 1000000L;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return process_started_after(pid, &t);
}

int pool_sweep_stale(const char *name)
{
    DIR *dir = opendir("/dev/shm");
    if (!dir) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        char owner[POOL_NAME_MAX];
        int pid = parse_shm_entry(e->d_name, owner, sizeof owner);
        if (pid < 0 || (name && strcmp(owner, name) != 0)) continue;
        char path[POOL_SHM_NAME_MAX + 8];
        snprintf(path, sizeof path, "/%s", e->d_name);
        int fd = shm_open(path, O_RDONLY, 0);
        if (fd < 0) continue;
        /* another user's is not ours to judge; a pid that lives is the owner's unless the
         * process now under it started well after the object last changed (a dead owner's pid
         * taken by a new process) */
        bool gone = process_gone(pid), taken = false;
        struct stat st;
        if (!fs_fd_private(fd, NULL, 0) ||
            (!gone && !(taken = fstat(fd, &st) == 0 && pool_owner_pid_reused(pid, &st.st_ctim)))) {
            close(fd);
            continue;
        }
        bool owned = flock(fd, LOCK_EX | LOCK_NB) != 0; /* a live owner we cannot see */
        close(fd);
        if (!owned && shm_unlink(path) == 0) {
            LOG_INFO("removed stale shared memory %s of dead process %d%s", path, pid,
                     taken ? " (its pid now names a process started later)" : "");
            removed++;
        }
    }
    closedir(dir);
    return removed;
}

/* ---------------------------------------------------------------- descriptor wire form */

static void put32(uint8_t **p, uint32_t v)
{
    for (int i = 0; i < 4; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t **p, uint64_t v)
{
    for (int i = 0; i < 8; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t **p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)(*(*p)++) << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t **p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)(*(*p)++) << (8 * i);
    return v;
}

int pool_desc_encode(const pool_desc *d, uint8_t *buf, size_t cap)
{
    uint32_t n_ev = d->backend == POOL_CUDA ? d->n_slots : 0;
    size_t len = DESC_FIXED_BYTES + (size_t)n_ev * POOL_HANDLE_BYTES;
    if (len > cap || d->n_slots > POOL_MAX_SLOTS) return DFLASH_ERANGE;
    uint8_t *p = buf;
    memcpy(p, DESC_MAGIC, 8);
    p += 8;
    put32(&p, DESC_VERSION);
    put32(&p, (uint32_t)d->backend);
    put32(&p, d->n_slots);
    put32(&p, (uint32_t)d->device);
    put32(&p, (uint32_t)d->owner_pid);
    put32(&p, 0);
    put64(&p, d->incarnation);
    put64(&p, d->slot_bytes);
    put64(&p, d->arena_bytes);
    memcpy(p, d->name, POOL_NAME_MAX);
    p += POOL_NAME_MAX;
    memcpy(p, d->shm_name, POOL_SHM_NAME_MAX);
    p += POOL_SHM_NAME_MAX;
    memcpy(p, d->gpu_bus_id, POOL_BUS_ID_MAX);
    p += POOL_BUS_ID_MAX;
    memcpy(p, d->mem_handle, POOL_HANDLE_BYTES);
    p += POOL_HANDLE_BYTES;
    for (uint32_t i = 0; i < n_ev; i++) {
        memcpy(p, d->event_handles[i], POOL_HANDLE_BYTES);
        p += POOL_HANDLE_BYTES;
    }
    assert((size_t)(p - buf) == len);
    return (int)len;
}

int pool_desc_decode(const uint8_t *buf, size_t len, pool_desc *out)
{
    if (len < DESC_FIXED_BYTES || memcmp(buf, DESC_MAGIC, 8) != 0) return DFLASH_EFORMAT;
    const uint8_t *p = buf + 8;
    if (get32(&p) != DESC_VERSION) return DFLASH_EVERSION;
    pool_desc d;
    memset(&d, 0, sizeof d);
    d.backend = (pool_backend)get32(&p);
    d.n_slots = get32(&p);
    d.device = (int32_t)get32(&p);
    d.owner_pid = (int32_t)get32(&p);
    (void)get32(&p);
    d.incarnation = get64(&p);
    d.slot_bytes = get64(&p);
    d.arena_bytes = get64(&p);
    memcpy(d.name, p, POOL_NAME_MAX);
    p += POOL_NAME_MAX;
    memcpy(d.shm_name, p, POOL_SHM_NAME_MAX);
    p += POOL_SHM_NAME_MAX;
    memcpy(d.gpu_bus_id, p, POOL_BUS_ID_MAX);
    p += POOL_BUS_ID_MAX;
    memcpy(d.mem_handle, p, POOL_HANDLE_BYTES);
    p += POOL_HANDLE_BYTES;
    if (d.backend != POOL_HOST && d.backend != POOL_CUDA) return DFLASH_ERANGE;
    if (d.n_slots == 0 || d.n_slots > POOL_MAX_SLOTS || d.incarnation == 0) return DFLASH_ERANGE;
    if (d.slot_bytes == 0 || d.slot_bytes % 256 || d.slot_bytes > (1ull << 40))
        return DFLASH_ERANGE;
    if (d.arena_bytes % POOL_ARENA_ALIGN || d.arena_bytes < d.slot_bytes * d.n_slots)
        return DFLASH_ERANGE;
    if (memchr(d.name, 0, POOL_NAME_MAX) == NULL || !pool_name_valid(d.name)) return DFLASH_ERANGE;
    if (memchr(d.shm_name, 0, POOL_SHM_NAME_MAX) == NULL) return DFLASH_ERANGE;
    if (!pool_bus_id_valid(d.gpu_bus_id, POOL_BUS_ID_MAX)) return DFLASH_ERANGE;
    if (d.backend == POOL_HOST && strncmp(d.shm_name, "/" SHM_PREFIX, strlen(SHM_PREFIX) + 1))
        return DFLASH_ERANGE;
    uint32_t n_ev = d.backend == POOL_CUDA ? d.n_slots : 0;
    if (len != DESC_FIXED_BYTES + (size_t)n_ev * POOL_HANDLE_BYTES) return DFLASH_EFORMAT;
    for (uint32_t i = 0; i < n_ev; i++) {
        memcpy(d.event_handles[i], p, POOL_HANDLE_BYTES);
        p += POOL_HANDLE_BYTES;
    }
    *out = d;
    return 0;
}

/* ---------------------------------------------------------------- importer */

pool_importer *pool_importer_new(pool_backend backend, int device, int *err)
{
    int rc = DFLASH_EINVAL;
    if (backend != POOL_HOST && backend != POOL_CUDA) goto fail;
    if (backend == POOL_CUDA && !pool_cuda_available()) {
        log_no_cuda("pool importer");
        rc = DFLASH_EUNSUPPORTED;
        goto fail;
    }
    pool_importer *imp = calloc(1, sizeof *imp);
    if (!imp) {
        rc = DFLASH_ENOMEM;
        goto fail;
    }
    imp->backend = backend;
    imp->device = backend == POOL_CUDA ? device : -1;
    if (backend == POOL_CUDA) {
        rc = pool_cuda_stream_new(device, &imp->stream);
        if (rc == 0) rc = pool_cuda_event_new_local(device, &imp->done_event);
        if (rc < 0) {
            pool_importer_destroy(&imp);
            goto fail;
        }
        char bus[POOL_BUS_ID_MAX];
        cuda_device_bus_id("importer", device, bus, sizeof bus);
    }
    if (err) *err = 0;
    return imp;
fail:
    if (err) *err = rc;
    return NULL;
}

static void mapping_close(pool_importer *imp, pool_mapping *m)
{
    if (!m->used) return;
    if (m->shm_fd >= 0) close(m->shm_fd);
    if (!m->local) {
        if (imp->backend == POOL_HOST) {
            munmap(m->base, m->arena_bytes);
        } else {
            for (uint32_t i = 0; i < m->n_slots; i++)
                if (m->events[i]) pool_cuda_event_destroy(m->events[i]);
            pool_cuda_close_mem(imp->device, m->base);
        }
    }
    memset(m, 0, sizeof *m);
}

void pool_importer_destroy(pool_importer **pimp)
{
    if (!pimp || !*pimp) return;
    pool_importer *imp = *pimp;
    if (imp->in_flight) pool_copy_wait(imp);
    for (uint32_t i = 0; i < POOL_IMPORT_MAX; i++) mapping_close(imp, &imp->maps[i]);
    pool_cuda_event_destroy(imp->done_event);
    pool_cuda_stream_destroy(imp->stream);
    free(imp);
    *pimp = NULL;
}

static pool_mapping *mapping_find(pool_importer *imp, uint64_t incarnation)
{
    for (uint32_t i = 0; i < POOL_IMPORT_MAX; i++)
        if (imp->maps[i].used && imp->maps[i].incarnation == incarnation) return &imp->maps[i];
    return NULL;
}

/* Maps the shm object and keeps it open in m->shm_fd; arena_bytes 0 means "take the object's
 * size". */
static int host_map(pool_mapping *m, const char *shm_name, uint64_t arena_bytes)
{
    if (!shm_name_ours(shm_name)) {
        LOG_WARN("shm %s: not the name of a pool (/" SHM_PREFIX "NAME.PID.INCARNATION): not "
                 "mapped", shm_name);
        return DFLASH_EDENIED;
    }
    int fd = shm_open(shm_name, O_RDWR, 0600);
    if (fd < 0) {
        int e = errno;
        LOG_WARN("shm_open %s: %s", shm_name, strerror(e));
        return e == ENOENT ? DFLASH_ENOTFOUND : DFLASH_EIO;
    }
    char why[200];
    if (!fs_fd_private(fd, why, sizeof why)) {
        LOG_WARN("shm %s: %s; not mapped (another user's object, or one others may write, could "
                 "hold anything)", shm_name, why);
        close(fd);
        return DFLASH_EDENIED;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || (uint64_t)st.st_size < arena_bytes) {
        LOG_WARN("shm %s is smaller than its descriptor says", shm_name);
        close(fd);
        return DFLASH_EMISMATCH;
    }
    m->arena_bytes = (uint64_t)st.st_size;
    void *b = mmap(NULL, m->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b == MAP_FAILED) {
        LOG_WARN("mmap %s: %s", shm_name, strerror(errno));
        close(fd);
        return DFLASH_EIO;
    }
    m->base = b;
    m->shm_fd = fd;
    return 0;
}

/* Whether mappings named a and b may be incarnations of one pool ("" is unknown: any pool). */
static bool same_pool(const char *a, const char *b)
{
    return !a[0] || !b[0] || strcmp(a, b) == 0;
}

/* Closes one mapping, after the copy in flight (which may read it). */
static void mapping_drop(pool_importer *imp, pool_mapping *m)
{
    if (imp->in_flight) pool_copy_wait(imp);
    mapping_close(imp, m);
}

/* A mapping not yet opened: of incarnation, nothing held. */
static void mapping_init(pool_mapping *m, uint64_t incarnation)
{
    memset(m, 0, sizeof *m);
    m->incarnation = incarnation;
    m->shm_fd = -1;
}

/* Records a use of m (attach or copy), for the LRU order and the idle time. */
static void mapping_touch(pool_importer *imp, pool_mapping *m)
{
    m->last_use = ++imp->clock;
    m->used_ms = monotime_ms();
}

/* True when m's shm object has been unlinked: its exporter is gone, only mappings hold it. */
static bool mapping_unlinked(const pool_mapping *m)
{
    struct stat st;
    return m->shm_fd >= 0 && fstat(m->shm_fd, &st) == 0 && st.st_nlink == 0;
}

int pool_importer_close_stale(pool_importer *imp, uint64_t idle_ms)
{
    uint64_t now = monotime_ms();
    int closed = 0;
    for (uint32_t i = 0; i < POOL_IMPORT_MAX; i++) {
        pool_mapping *m = &imp->maps[i];
        if (!m->used || (imp->in_flight && m->incarnation == imp->copy_incarnation)) continue;
        bool unlinked = mapping_unlinked(m);
        uint64_t idle = now - m->used_ms;
        if (!unlinked && idle < idle_ms) continue;
        if (unlinked)
            LOG_INFO("closing the mapping of pool %s (incarnation %016" PRIx64 "): its shared "
                     "memory was removed (its exporter is gone)", m->name[0] ? m->name : "?",
                     m->incarnation);
        else
            LOG_INFO("closing the mapping of pool %s (incarnation %016" PRIx64 "): unused for "
                     "%" PRIu64 " ms", m->name[0] ? m->name : "?", m->incarnation, idle);
        mapping_close(imp, m);
        closed++;
    }
    return closed;
}

/* Stores the freshly opened mapping nm of a new incarnation: first closes the mappings of gone
 * or idle pools (pool_importer_close_stale) and every mapping nm supersedes (an older
 * incarnation of the same pool: that exporter is gone), then, if all entries are still taken,
 * the least recently used one. Returns the entry. */
static pool_mapping *mapping_insert(pool_importer *imp, const pool_mapping *nm)
{
    pool_importer_close_stale(imp, POOL_IMPORT_IDLE_MS);
    pool_mapping *free_m = NULL, *lru = NULL;
    for (uint32_t i = 0; i < POOL_IMPORT_MAX; i++) {
        pool_mapping *m = &imp->maps[i];
        if (m->used && same_pool(m->name, nm->name)) mapping_drop(imp, m);
        if (!m->used) {
            if (!free_m) free_m = m;
        } else if (!lru || m->last_use < lru->last_use) {
            lru = m;
        }
    }
    if (!free_m) {
        mapping_drop(imp, lru); /* evicted for room; a later grant maps it again */
        free_m = lru;
    }
    *free_m = *nm;
    free_m->used = true;
    mapping_touch(imp, free_m);
    return free_m;
}

/* Before the first mapping of a cuda pool on GPU bus_id ("" or malformed: unknown, as before):
 * can this importer's GPU reach it? Checked once per GPU (the answer and its log line do not
 * change). 0, or DFLASH_EPEER when it cannot (pool_reach_check logged the ERROR). */
static int reach_check(pool_importer *imp, const char *bus_id)
{
    if (imp->backend != POOL_CUDA || !pool_bus_id_valid(bus_id, POOL_BUS_ID_MAX) || !bus_id[0])
        return 0;
    pool_reach r = POOL_REACH_UNKNOWN;
    bool known = false;
    for (uint32_t i = 0; i < imp->n_reached && i < POOL_IMPORT_MAX && !known; i++)
        if (strcmp(imp->reached[i].bus_id, bus_id) == 0) {
            r = imp->reached[i].reach;
            known = true;
        }
    if (!known) {
        r = pool_reach_check(imp->device, bus_id);
        uint32_t i = imp->n_reached++ % POOL_IMPORT_MAX;
        snprintf(imp->reached[i].bus_id, sizeof imp->reached[i].bus_id, "%s", bus_id);
        imp->reached[i].reach = r;
    }
    return r == POOL_REACH_NO_PEER ? DFLASH_EPEER : 0;
}

int pool_importer_attach(pool_importer *imp, const pool_desc *d)
{
    if (d->backend != imp->backend) return DFLASH_EMISMATCH;
    pool_mapping *hit = mapping_find(imp, d->incarnation);
    if (hit) {
        mapping_touch(imp, hit);
        return 0;
    }
    pool_mapping m;
    mapping_init(&m, d->incarnation);
    snprintf(m.name, sizeof m.name, "%s", d->name);
    m.n_slots = d->n_slots;
    m.slot_bytes = d->slot_bytes;
    m.arena_bytes = d->arena_bytes;
    m.device = d->device;
    if (d->backend == POOL_CUDA) memcpy(m.ev_handles, d->event_handles, sizeof m.ev_handles);
    int rc = 0;
    if (registry_find(d->incarnation, &m)) {
        m.local = true;
    } else if (d->backend == POOL_HOST) {
        rc = host_map(&m, d->shm_name, d->arena_bytes);
    } else if ((rc = reach_check(imp, d->gpu_bus_id)) == 0) {
        rc = pool_cuda_open_mem(imp->device, d->mem_handle, &m.base);
    }
    if (rc < 0) return rc;
    if (!m.local) imp->opens++;
    mapping_insert(imp, &m);
    return 0;
}

int pool_importer_attach_slot(pool_importer *imp, const pool_slot_ref *ref)
{
    if (ref->backend != imp->backend) return DFLASH_EMISMATCH;
    if (ref->slot >= POOL_MAX_SLOTS) return DFLASH_ERANGE;
    pool_mapping *m = mapping_find(imp, ref->incarnation);
    if (m) {
        mapping_touch(imp, m);
    } else {
        pool_mapping nm;
        mapping_init(&nm, ref->incarnation);
        if (memchr(ref->pool_name, 0, sizeof ref->pool_name) && ref->pool_name[0])
            snprintf(nm.name, sizeof nm.name, "%s", ref->pool_name);
        else if (ref->backend == POOL_HOST && ref->shm_name[0] == '/' &&
                 parse_shm_entry(ref->shm_name + 1, nm.name, sizeof nm.name) < 0)
            nm.name[0] = '\0'; /* not one of ours: unknown, so it supersedes every mapping */
        nm.n_slots = POOL_MAX_SLOTS; /* unknown from a grant: bounded by the table */
        nm.device = ref->device;
        int rc = 0;
        if (registry_find(ref->incarnation, &nm)) nm.local = true;
        else if (ref->backend == POOL_HOST) rc = host_map(&nm, ref->shm_name, 0);
        else if ((rc = reach_check(imp, ref->gpu_bus_id)) == 0)
            rc = pool_cuda_open_mem(imp->device, ref->mem_handle, &nm.base);
        if (rc < 0) return rc;
        if (!nm.local) imp->opens++;
        m = mapping_insert(imp, &nm);
    }
    if (!m->local && ref->backend == POOL_CUDA && !m->events[ref->slot])
        memcpy(m->ev_handles[ref->slot], ref->event_handle, POOL_HANDLE_BYTES);
    return 0;
}

void pool_importer_forget(pool_importer *imp, uint64_t incarnation)
{
    pool_mapping *m = mapping_find(imp, incarnation);
    if (!m) return;
    if (imp->in_flight) pool_copy_wait(imp);
    mapping_close(imp, m);
}

void pool_importer_forget_all(pool_importer *imp)
{
    if (imp->in_flight) pool_copy_wait(imp);
    for (uint32_t i = 0; i < POOL_IMPORT_MAX; i++) mapping_close(imp, &imp->maps[i]);
}

int pool_importer_mappings(const pool_importer *imp)
{
    int n = 0;
    for (uint32_t i = 0; i < POOL_IMPORT_MAX; i++) n += imp->maps[i].used;
    return n;
}

uint64_t pool_importer_opens(const pool_importer *imp)
{
    return imp->opens;
}

void *pool_importer_stream(pool_importer *imp)
{
    return imp->stream;
}

int pool_copy_start(pool_importer *imp, uint64_t incarnation, uint32_t slot, uint64_t offset,
                    uint64_t bytes, void *dst)
{
    if (imp->in_flight) return DFLASH_ESTATE;
    pool_mapping *m = mapping_find(imp, incarnation);
    if (!m) return DFLASH_ESTALE;
    mapping_touch(imp, m);
    if (slot >= m->n_slots || bytes == 0) return DFLASH_ERANGE;
    if (m->slot_bytes && (offset != (uint64_t)slot * m->slot_bytes || bytes > m->slot_bytes))
        return DFLASH_ERANGE; /* slot geometry known from a descriptor */
    if (m->arena_bytes && (offset > m->arena_bytes || bytes > m->arena_bytes - offset))
        return DFLASH_ERANGE;
    const char *src = (const char *)m->base + offset;
    if (imp->backend == POOL_HOST) {
        atomic_thread_fence(memory_order_acquire);
        memcpy(dst, src, bytes);
        return 0;
    }
    if (!m->events[slot]) {
        assert(!m->local); /* local pools borrow every event */
        int orc = pool_cuda_open_event(imp->device, m->ev_handles[slot], &m->events[slot]);
        if (orc < 0) return orc;
    }
    int rc = pool_cuda_copy_async(dst, src, bytes, m->events[slot], imp->stream, imp->done_event);
    if (rc < 0) return rc;
    imp->in_flight = true;
    imp->copy_incarnation = incarnation;
    return 0;
}

int pool_copy_poll(pool_importer *imp)
{
    if (!imp->in_flight) return 1;
    int rc = pool_cuda_event_query(imp->done_event);
    if (rc != 0) imp->in_flight = false;
    return rc;
}

int pool_copy_wait(pool_importer *imp)
{
    if (!imp->in_flight) return 0;
    imp->in_flight = false;
    return pool_cuda_event_sync(imp->done_event);
}

/* ---------------------------------------------------------------- staging */

void *pool_staging_alloc(pool_backend backend, int device, size_t bytes)
{
    if (bytes == 0) return NULL;
    if (backend == POOL_HOST) return aligned_alloc(256, round_up(bytes, 256));
    void *p = NULL;
    if (backend == POOL_CUDA && pool_cuda_alloc(device, bytes, &p, NULL) == 0) return p;
    return NULL;
}

void pool_staging_free(pool_backend backend, int device, void **buf)
{
    if (!buf || !*buf) return;
    if (backend == POOL_HOST) free(*buf);
    else pool_cuda_free(device, *buf);
    *buf = NULL;
}

int pool_staging_read(pool_backend backend, void *dst, const void *src, size_t n)
{
    if (backend == POOL_HOST) {
        memcpy(dst, src, n);
        return 0;
    }
    return pool_cuda_memcpy(dst, src, n, 0);
}

int pool_staging_write(pool_backend backend, void *dst, const void *src, size_t n)
{
    if (backend == POOL_HOST) {
        memcpy(dst, src, n);
        return 0;
    }
    return pool_cuda_memcpy(dst, src, n, 1);
}
