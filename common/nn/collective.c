/* collective: the dp_comm handle, the shm backend, and the dispatch to the nccl backend
 * (collective_nccl.c, compiled only with DFLASH_HAVE_NCCL). See collective.h for the model.
 *
 * Shared segment (all offsets fixed at creation by rank 0, read by the others):
 *   [0, 256)                 shm_hdr: magic (stored last, so a joiner never sees a half-made
 *                            header), version, world, chunk bytes, data offset, segment bytes,
 *                            counters n_joined / n_closed and `broken`: 0, or who broke the
 *                            group first and why, packed (break_word): 1 + its rank, 1 + the
 *                            rank whose process it found ended (0: another reason), that pid
 *   [256, 256 + 64*world)    one shm_rank per rank, one cache line each: `arrived` (the number of
 *                            barriers this rank has entered), `joined`, `left`, its pid and pid
 *                            namespace (process.h; pid 0 until it has joined)
 *   [data_off, ...)          world + 1 regions of chunk bytes, 4 KiB aligned: input region of
 *                            rank r, then the result region
 * Region hazards: a reduction writes the input regions before its first barrier, the result
 * region between its barriers, and reads the result region after its last barrier; a broadcast
 * writes the root's input region before its first barrier and reads it between its two. So
 * every write happens after all ranks have passed the barrier that follows the last read of
 * the same region.
 * Invariants: a rank's own counters are written only by that rank; `broken` only goes from 0 to
 * its final value; barrier k is passed when every rank's `arrived` is >= k (even if a rank broke
 * the group after it arrived there: the next call fails). All atomics are
 * sequentially consistent, which orders the plain region reads and writes around each barrier.
 * Waits (shm_wait): spin, then short sleeps; every PEER_CHECK_S the peer waited for (while
 * joining: every peer that has joined) is looked at with process_gone_since (its pid and start
 * time: a dead peer's pid reused by a new process is not taken for the peer), when it shares our
 * pid namespace, and the watch is given its turn (collective_wait.h). A peer found gone is checked
 * once more for arrival (it may have arrived, then exited) before the group is broken.
 * Thread: the caller's; no thread of our own.
 */
#include "collective.h"
#include "collective_nccl.h"
#include "collective_wait.h"

#include "err.h"
#include "fsutil.h"
#include "log.h"
#include "monotime.h"
#include "process.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


#define SHM_MAGIC 0x3150444c46444675ull /* "uFDFLDP1" */
#define SHM_VERSION 2u
#define SHM_HDR_BYTES 256u
#define SHM_RANK_BYTES 64u
#define ID_MAGIC "DPC1"
#define SPIN_POLLS 200 /* sched_yield polls before sleeping between polls */
#define PEER_CHECK_S 0.1 /* how often a wait looks whether its peer's process still lives */

typedef struct shm_hdr {
    _Atomic uint64_t magic;
    uint32_t version;
    int32_t world;
    uint64_t chunk_bytes, data_off, seg_bytes;
    _Atomic uint32_t n_joined, n_closed;
    _Atomic uint64_t broken; /* break_word() */
} shm_hdr;

typedef struct shm_rank {
    _Atomic uint64_t arrived;
    _Atomic uint32_t joined, left;
    _Atomic int32_t pid; /* stored after pidns and start */
    uint64_t pidns;
    uint64_t start; /* the process's start time (process_start_time), 0: unknown */
} shm_rank;

_Static_assert(sizeof(shm_hdr) <= SHM_HDR_BYTES, "shm header too large");
_Static_assert(sizeof(shm_rank) <= SHM_RANK_BYTES, "shm rank record too large");

struct dp_comm {
    dp_comm_kind kind;
    int rank, world;
    double timeout_s;
    bool broken;
    int gone; /* the rank whose ended process broke the group (dp_comm_gone_rank), or -1 */
    dp_comm_watch watch;
    char why[DP_WHY_BYTES]; /* why the group broke (dp_comm_error) */
    /* shm */
    char name[64];
    int fd;
    void *base;
    size_t seg_bytes;
    uint64_t epoch; /* barriers entered by this rank */
    uint64_t pidns; /* process_pidns() */
    /* nccl */
    void *nccl;
};

/* ---------------------------------------------------------------------------------------------
 * names and ids */

int dp_comm_kind_parse(const char *s, dp_comm_kind *out) {
    if (s && strcmp(s, "shm") == 0) *out = DP_COMM_SHM;
    else if (s && strcmp(s, "nccl") == 0) *out = DP_COMM_NCCL;
    else return DFLASH_EINVAL;
    return 0;
}

const char *dp_comm_kind_name(dp_comm_kind k) {
    return k == DP_COMM_SHM ? "shm" : k == DP_COMM_NCCL ? "nccl" : "unknown";
}

uint64_t dp_comm_shape(dp_comm_kind kind, uint64_t hash, char *text, size_t len) {
    size_t n = strnlen(text, len);
    if (n < len) snprintf(text + n, len - n, ", comm %s", dp_comm_kind_name(kind));
    uint64_t h = (hash ^ ((uint64_t)kind + 1)) * 0x9e3779b97f4a7c15ull; /* one odd multiply */
    return h ? h : 1;
}

bool dp_comm_have_nccl(void) {
#ifdef DFLASH_HAVE_NCCL
    return true;
#else
    return false;
#endif
}

static uint64_t random64(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    }
    return v;
}

/* shm id: "DPC1", then the NUL-terminated segment name at byte 8. */
static int shm_make_id(uint8_t id[DP_COMM_ID_BYTES]) {
    memset(id, 0, DP_COMM_ID_BYTES);
    memcpy(id, ID_MAGIC, 4);
    snprintf((char *)id + 8, DP_COMM_ID_BYTES - 8, "/dflash-dp-%ld-%016llx", (long)getpid(),
             (unsigned long long)random64());
    return 0;
}

static int shm_parse_id(const uint8_t id[DP_COMM_ID_BYTES], char *name, size_t len) {
    if (memcmp(id, ID_MAGIC, 4) != 0) return DFLASH_EINVAL;
    const char *s = (const char *)id + 8;
    size_t n = strnlen(s, DP_COMM_ID_BYTES - 8);
    if (n == DP_COMM_ID_BYTES - 8 || n + 1 > len || strncmp(s, "/dflash-dp-", 11) != 0)
        return DFLASH_EINVAL;
    memcpy(name, s, n + 1);
    return 0;
}

int dp_comm_make_id(dp_comm_kind kind, uint8_t id[DP_COMM_ID_BYTES], char *err, size_t errlen) {
    if (kind == DP_COMM_SHM) return shm_make_id(id);
    if (kind != DP_COMM_NCCL) {
        err_fmt(err, errlen, "unknown collective backend %d", (int)kind);
        return DFLASH_EINVAL;
    }
#ifdef DFLASH_HAVE_NCCL
    return dp_nccl_make_id(id, err, errlen);
#else
    err_fmt(err, errlen, "this build has no NCCL (nccl.h / libnccl not found at configure time, "
                         "or -DDFLASH_NCCL=OFF): use the shm backend");
    return DFLASH_EUNSUPPORTED;
#endif
}

/* ---------------------------------------------------------------------------------------------
 * shm: segment access and the barrier */

static shm_hdr *hdr_of(const dp_comm *c) { return (shm_hdr *)c->base; }

static shm_rank *rank_of(const dp_comm *c, int r) {
    return (shm_rank *)((char *)c->base + SHM_HDR_BYTES + (size_t)r * SHM_RANK_BYTES);
}

static char *region_of(const dp_comm *c, int r) { /* r == world: the result region */
    shm_hdr *h = hdr_of(c);
    return (char *)c->base + h->data_off + (size_t)r * h->chunk_bytes;
}

/* The header's `broken` word: rank broke the group, having found rank gone's process (pid)
 * ended, or gone -1 for another reason. Ranks are below DP_COMM_MAX_WORLD < 0xffff. */
static uint64_t break_word(int rank, int gone, int pid) {
    return (uint64_t)(rank + 1) | (uint64_t)(gone + 1) << 16 | (uint64_t)(uint32_t)pid << 32;
}

/* Marks the group broken, here and (the first reason only) in the segment. */
static void break_group(dp_comm *c, int gone, int pid) {
    c->broken = true;
    if (gone >= 0 && c->gone < 0) c->gone = gone;
    uint64_t none = 0;
    if (c->base)
        atomic_compare_exchange_strong(&hdr_of(c)->broken, &none,
                                       break_word(c->rank, gone, gone >= 0 ? pid : 0));
}

/* Breaks the group (gone, pid: as break_word) for reason fmt, logged and kept for
 * dp_comm_error; returns rc. */
static int shm_fail(dp_comm *c, int rc, int gone, int pid, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int shm_fail(dp_comm *c, int rc, int gone, int pid, const char *fmt, ...) {
    char why[DP_WHY_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    break_group(c, gone, pid);
    dp_why_set(c->why, "%s", why);
    LOG_WARN("dp_comm shm rank %d: %s", c->rank, why);
    return rc;
}

/* Peer r's pid when we can judge its process (it has joined, in our pid namespace), else 0;
 * its start time in *start (0: not recorded) when start is not NULL. */
static int peer_pid(const dp_comm *c, int r, uint64_t *start) {
    shm_rank *p = rank_of(c, r);
    int pid = atomic_load(&p->pid); /* after it: pidns and start, stored before it */
    if (start) *start = pid > 0 ? p->start : 0;
    return pid > 0 && c->pidns && p->pidns == c->pidns ? pid : 0;
}

/* The first peer (r, or every peer when r < 0) whose process has ended; -1 when none. Its pid
 * taken by a new process since is seen as the end it is (by the start time). */
static int gone_peer(const dp_comm *c, int r, int *pid) {
    for (int q = r < 0 ? 0 : r; q < (r < 0 ? c->world : r + 1); q++) {
        if (q == c->rank) continue;
        uint64_t start;
        *pid = peer_pid(c, q, &start);
        if (*pid && process_gone_since(*pid, start)) return q;
    }
    return -1;
}

/* Polls cond(c, arg) until it holds, the group breaks, or the deadline (monotime_s) passes.
 * peer: the rank waited for (-1: any, while joining), looked at every PEER_CHECK_S. */
typedef bool (*shm_cond)(const dp_comm *c, int arg, int *why);

static int shm_wait(dp_comm *c, shm_cond cond, int arg, int peer, const char *what,
                    double deadline) {
    dp_waiter wt;
    dp_wait_begin(&wt, &c->watch, what, peer, peer >= 0 ? peer_pid(c, peer, NULL) : 0,
                  deadline - c->timeout_s, c->timeout_s);
    double next_check = 0;
    for (long i = 0;; i++) {
        int why = 0;
        if (cond(c, arg, &why)) return 0;
        uint64_t by = atomic_load(&hdr_of(c)->broken);
        if (by) {
            c->broken = true;
            int breaker = (int)(by & 0xffff) - 1, gone = (int)(by >> 16 & 0xffff) - 1;
            if (gone >= 0 && c->gone < 0) c->gone = gone;
            if (gone >= 0)
                dp_why_set(c->why, "rank %d broke the group: rank %d (pid %d) has exited",
                           breaker, gone, (int)(by >> 32));
            else
                dp_why_set(c->why, "rank %d broke the group", breaker);
            LOG_WARN("dp_comm shm rank %d: %s: %s", c->rank, what, c->why);
            return DFLASH_EPEER;
        }
        if (why) return shm_fail(c, DFLASH_EPEER, -1, 0, "%s: rank %d left the group", what, arg);
        if (i < SPIN_POLLS) {
            sched_yield();
            continue;
        }
        double now = monotime_s();
        if (now >= next_check) {
            next_check = now + PEER_CHECK_S;
            int pid = 0, gone = gone_peer(c, peer, &pid);
            if (gone >= 0 && !cond(c, arg, &why)) /* not one that arrived, then exited */
                return shm_fail(c, DFLASH_EPEER, gone, pid, "%s: rank %d (pid %d) has exited "
                                "(killed or crashed) while this rank waited for it", what, gone,
                                pid);
            /* the watch's word is final, also when the peer came while it was asked: the
             * broker has moved on (as the step's resolver our poll may have aborted the step
             * on our model; defect: the wait then passed, the step was applied, and the group
             * re-formed for ever on a model past the broker's) */
            char over[DP_WHY_BYTES];
            if (dp_wait_over(&wt, now, over, sizeof over))
                return shm_fail(c, DFLASH_EPEER, -1, 0, "%s: %s", what, over);
        }
        if (now > deadline) {
            if (peer >= 0)
                return shm_fail(c, DFLASH_ETIMEOUT, -1, 0, "%s: timed out after %.3g s waiting for "
                                "rank %d", what, c->timeout_s, peer);
            return shm_fail(c, DFLASH_ETIMEOUT, -1, 0, "%s: timed out after %.3g s", what,
                            c->timeout_s);
        }
        monotime_sleep_ms(i < 2000 ? 0.02 : 0.2);
    }
}

static bool cond_all_joined(const dp_comm *c, int arg, int *why) {
    (void)arg, (void)why;
    return atomic_load(&hdr_of(c)->n_joined) >= (uint32_t)c->world;
}

/* Peer `arg` has entered barrier c->epoch (or left before it: a peer gone). */
static bool cond_arrived(const dp_comm *c, int arg, int *why) {
    shm_rank *p = rank_of(c, arg);
    if (atomic_load(&p->arrived) >= c->epoch) return true;
    if (atomic_load(&p->left)) *why = 1;
    return false;
}

static int shm_barrier(dp_comm *c) {
    if (c->broken) return DFLASH_EPEER;
    c->epoch++;
    atomic_store(&rank_of(c, c->rank)->arrived, c->epoch);
    double deadline = monotime_s() + c->timeout_s; /* for the whole barrier */
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        int rc = shm_wait(c, cond_arrived, r, r, "barrier", deadline);
        if (rc) return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * shm: open and close */

static void shm_detach(dp_comm *c) {
    if (c->base) munmap(c->base, c->seg_bytes);
    if (c->fd >= 0) close(c->fd);
    c->base = NULL;
    c->fd = -1;
}

static int shm_create(dp_comm *c, char *err, size_t errlen) {
    size_t chunk = DP_SHM_CHUNK_BYTES;
    size_t data_off = (SHM_HDR_BYTES + (size_t)c->world * SHM_RANK_BYTES + 4095) & ~(size_t)4095;
    c->seg_bytes = data_off + (size_t)(c->world + 1) * chunk;
    c->fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (c->fd < 0) {
        int e = errno;
        err_fmt(err, errlen, "shm_open %s: %s", c->name, strerror(e));
        return e == EEXIST ? DFLASH_EEXISTS : DFLASH_EIO;
    }
    if (ftruncate(c->fd, (off_t)c->seg_bytes) != 0) {
        err_fmt(err, errlen, "ftruncate %s to %zu bytes: %s (is /dev/shm large enough?)",
                c->name, c->seg_bytes, strerror(errno));
        return DFLASH_EIO;
    }
    c->base = mmap(NULL, c->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (c->base == MAP_FAILED) {
        c->base = NULL;
        err_fmt(err, errlen, "mmap %s: %s", c->name, strerror(errno));
        return DFLASH_EIO;
    }
    shm_hdr *h = hdr_of(c);
    h->version = SHM_VERSION;
    h->world = c->world;
    h->chunk_bytes = chunk;
    h->data_off = data_off;
    h->seg_bytes = c->seg_bytes;
    atomic_store(&h->magic, SHM_MAGIC); /* last: the header is complete */
    return 0;
}

/* One attempt to attach a segment rank 0 made: 1 attached, 0 not there yet, < 0 error. */
static int shm_try_attach(dp_comm *c, char *err, size_t errlen) {
    if (c->fd < 0) {
        c->fd = shm_open(c->name, O_RDWR, 0600);
        if (c->fd < 0) {
            if (errno == ENOENT) return 0;
            err_fmt(err, errlen, "shm_open %s: %s", c->name, strerror(errno));
            return DFLASH_EIO;
        }
        char why[160];
        if (!fs_fd_private(c->fd, why, sizeof why)) { /* another user's object: not rank 0's */
            err_fmt(err, errlen, "shm %s: %s; not attached (rank 0 makes it 0600 as our uid)",
                    c->name, why);
            close(c->fd);
            c->fd = -1;
            return DFLASH_EDENIED;
        }
    }
    struct stat st;
    if (fstat(c->fd, &st) != 0 || (size_t)st.st_size < SHM_HDR_BYTES) return 0;
    shm_hdr *h = mmap(NULL, SHM_HDR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (h == MAP_FAILED) {
        err_fmt(err, errlen, "mmap %s: %s", c->name, strerror(errno));
        return DFLASH_EIO;
    }
    int rc = 0;
    if (atomic_load(&h->magic) != SHM_MAGIC) goto unmap; /* still being made */
    if (h->version != SHM_VERSION) {
        err_fmt(err, errlen, "segment %s has version %u, this build speaks %u", c->name,
                h->version, SHM_VERSION);
        rc = DFLASH_EVERSION;
        goto unmap;
    }
    if (h->world != c->world) {
        err_fmt(err, errlen, "rank %d opened the group with world %d but rank 0 made it for %d",
                c->rank, c->world, h->world);
        rc = DFLASH_EMISMATCH;
        goto unmap;
    }
    c->seg_bytes = h->seg_bytes;
    if ((size_t)st.st_size < c->seg_bytes) {
        err_fmt(err, errlen, "segment %s holds %lld bytes, header says %zu", c->name,
                (long long)st.st_size, c->seg_bytes);
        rc = DFLASH_ECORRUPT;
        goto unmap;
    }
    c->base = mmap(NULL, c->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (c->base == MAP_FAILED) {
        c->base = NULL;
        err_fmt(err, errlen, "mmap %s: %s", c->name, strerror(errno));
        rc = DFLASH_EIO;
        goto unmap;
    }
    rc = 1;
unmap:
    munmap(h, SHM_HDR_BYTES);
    return rc;
}

static int shm_open_group(dp_comm *c, const uint8_t id[DP_COMM_ID_BYTES], char *err,
                          size_t errlen) {
    int rc = shm_parse_id(id, c->name, sizeof c->name);
    if (rc) {
        err_fmt(err, errlen, "not an shm collective id (made by dp_comm_make_id(shm)?)");
        return rc;
    }
    double start = monotime_s(), deadline = start + c->timeout_s;
    c->pidns = process_pidns();
    if (c->rank == 0) {
        rc = shm_create(c, err, errlen);
        if (rc) goto fail;
    } else {
        dp_waiter wt;
        dp_wait_begin(&wt, &c->watch, "join", 0, 0, start, c->timeout_s);
        for (;;) {
            rc = shm_try_attach(c, err, errlen);
            if (rc < 0) goto fail;
            if (rc == 1) break;
            double now = monotime_s();
            if (dp_wait_over(&wt, now, c->why, sizeof c->why)) {
                err_fmt(err, errlen, "rank %d: waiting for rank 0's segment %s: %s", c->rank,
                        c->name, c->why);
                rc = DFLASH_EPEER;
                goto fail;
            }
            if (now > deadline) {
                err_fmt(err, errlen, "rank %d: segment %s did not appear within %.3g s (is rank 0 "
                        "alive?)", c->rank, c->name, c->timeout_s);
                rc = DFLASH_ETIMEOUT;
                goto fail;
            }
            monotime_sleep_ms(1);
        }
    }
    shm_hdr *h = hdr_of(c);
    shm_rank *me = rank_of(c, c->rank);
    if (atomic_exchange(&me->joined, 1u) != 0) {
        err_fmt(err, errlen, "rank %d joined group %s twice", c->rank, c->name);
        rc = DFLASH_EEXISTS;
        goto fail;
    }
    me->pidns = c->pidns;
    me->start = process_start_time((int)getpid());
    atomic_store(&me->pid, (int32_t)getpid());
    atomic_fetch_add(&h->n_joined, 1u);
    rc = shm_wait(c, cond_all_joined, 0, -1, "join", deadline);
    if (rc) { /* the group did not form */
        if (rc == DFLASH_EPEER && (atomic_load(&h->broken) & 0xffff) == (uint64_t)c->rank + 1) {
            /* we saw why: a rank that had joined is gone, or the watch ended the join */
            err_fmt(err, errlen, "rank %d of %d: group %s did not form: %s", c->rank, c->world,
                    c->name, c->why);
        } else { /* timed out here or in a peer that then broke the group */
            rc = DFLASH_ETIMEOUT;
            err_fmt(err, errlen, "rank %d of %d: only %u ranks joined %s within %.3g s", c->rank,
                    c->world, atomic_load(&h->n_joined), c->name, c->timeout_s);
        }
        goto fail;
    }
    /* everyone has it mapped: the name is no longer needed, and no crash can leave it behind */
    if (c->rank == 0) shm_unlink(c->name);
    return 0;
fail:
    if (c->base) break_group(c, -1, 0);
    shm_detach(c);
    shm_unlink(c->name); /* a failed group is never re-joined; ENOENT is fine */
    return rc;
}

static void shm_close(dp_comm *c) {
    if (!c->base) return;
    shm_hdr *h = hdr_of(c);
    atomic_store(&rank_of(c, c->rank)->left, 1u);
    if (atomic_fetch_add(&h->n_closed, 1u) + 1 == (uint32_t)c->world) shm_unlink(c->name);
    shm_detach(c);
}

/* ---------------------------------------------------------------------------------------------
 * shm: reduce and broadcast, chunk by chunk */

/* Element types of a reduction: fp32 and fp64 are summed as they are; bf16 (bit patterns, the
 * upper half of an fp32) is widened to fp32 while staging in, summed in fp32 and rounded once
 * to bf16 (nearest even) while staging out. */
typedef enum { ELEM_F32, ELEM_F64, ELEM_BF16 } elem_type;

static void stage_in(void *dst, const void *src, size_t bytes, const dp_host_io *io) {
    if (io) io->to_host(io->ctx, dst, src, bytes);
    else memcpy(dst, src, bytes);
}

static void stage_out(void *dst, const void *src, size_t bytes, const dp_host_io *io) {
    if (io) io->from_host(io->ctx, dst, src, bytes);
    else memcpy(dst, src, bytes);
}

/* This rank's k elements of buf (at src) into its input region as summands: fp32 and bf16
 * multiplied by scale in fp32. bf16 lands in the region's upper half [2k, 4k) bytes and is
 * widened in place, front to back: float j's bytes [4j, 4j + 4) only cover bf16 elements
 * 2j - k and 2j - k + 1, both <= j, so already read. */
static void stage_summands(char *mine, const char *src, size_t k, elem_type t, float scale,
                           const dp_host_io *io) {
    float *x = (float *)mine;
    if (t == ELEM_BF16) {
        const uint16_t *h = (const uint16_t *)(mine + 2 * k);
        stage_in(mine + 2 * k, src, 2 * k, io);
        for (size_t j = 0; j < k; j++)
            x[j] = safetensors_bf16_to_f32(h[j]) * scale;
        return;
    }
    stage_in(mine, src, k * (t == ELEM_F32 ? sizeof(float) : sizeof(double)), io);
    if (t == ELEM_F32 && scale != 1.0f)
        for (size_t j = 0; j < k; j++)
            x[j] *= scale;
}

static int shm_reduce(dp_comm *c, void *buf, size_t n, elem_type t, float scale,
                      const dp_host_io *io) {
    if (c->broken) return DFLASH_EPEER;
    /* sizes in the shared regions (the sum's type) and in buf */
    size_t esz = t == ELEM_F64 ? sizeof(double) : sizeof(float), bsz = t == ELEM_BF16 ? 2 : esz;
    size_t per = hdr_of(c)->chunk_bytes / esz;
    int W = c->world;
    for (size_t off = 0; off < n; off += per) {
        size_t k = n - off < per ? n - off : per;
        char *mine = region_of(c, c->rank), *src = (char *)buf + off * bsz;
        stage_summands(mine, src, k, t, scale, io);
        int rc = shm_barrier(c);
        if (rc) return rc;
        /* this rank's slice of the chunk, summed over ranks 0..W-1 in order */
        size_t slice = (k + (size_t)W - 1) / (size_t)W;
        size_t lo = (size_t)c->rank * slice, hi = lo + slice < k ? lo + slice : k;
        if (lo < hi) {
            if (t != ELEM_F64) {
                float *out = (float *)region_of(c, W);
                memcpy(out + lo, (float *)region_of(c, 0) + lo, (hi - lo) * esz);
                for (int r = 1; r < W; r++) {
                    const float *in = (const float *)region_of(c, r);
                    for (size_t j = lo; j < hi; j++)
                        out[j] += in[j];
                }
            } else {
                double *out = (double *)region_of(c, W);
                memcpy(out + lo, (double *)region_of(c, 0) + lo, (hi - lo) * esz);
                for (int r = 1; r < W; r++) {
                    const double *in = (const double *)region_of(c, r);
                    for (size_t j = lo; j < hi; j++)
                        out[j] += in[j];
                }
            }
        }
        rc = shm_barrier(c);
        if (rc) return rc;
        const char *res = region_of(c, W);
        if (t == ELEM_BF16) { /* rounded into this rank's own input region: no peer reads it
                               * after the barrier above */
            const float *sum = (const float *)res;
            uint16_t *h = (uint16_t *)mine;
            for (size_t j = 0; j < k; j++)
                h[j] = safetensors_f32_to_bf16(sum[j]);
            res = mine;
        }
        stage_out(src, res, k * bsz, io);
    }
    return 0;
}

static int shm_broadcast(dp_comm *c, void *buf, size_t bytes, int root, const dp_host_io *io) {
    if (c->broken) return DFLASH_EPEER;
    size_t per = hdr_of(c)->chunk_bytes;
    /* the root's input region, not the result region: a reduction's ranks read the result
     * region after its last barrier, so a root writing there next could overwrite it early */
    char *res = region_of(c, root);
    for (size_t off = 0; off < bytes; off += per) {
        size_t k = bytes - off < per ? bytes - off : per;
        if (c->rank == root) stage_in(res, (char *)buf + off, k, io);
        int rc = shm_barrier(c);
        if (rc) return rc;
        if (c->rank != root) stage_out((char *)buf + off, res, k, io);
        rc = shm_barrier(c);
        if (rc) return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * the public calls */

int dp_comm_open(dp_comm_kind kind, const uint8_t id[DP_COMM_ID_BYTES], int rank, int world,
                 int device, double timeout_s, dp_comm **out, char *err, size_t errlen) {
    return dp_comm_open_watched(kind, id, rank, world, device, timeout_s, NULL, out, err, errlen);
}

int dp_comm_open_watched(dp_comm_kind kind, const uint8_t id[DP_COMM_ID_BYTES], int rank,
                         int world, int device, double timeout_s, const dp_comm_watch *watch,
                         dp_comm **out, char *err, size_t errlen) {
    *out = NULL;
    if (world < 1 || world > DP_COMM_MAX_WORLD || rank < 0 || rank >= world || !(timeout_s > 0)) {
        err_fmt(err, errlen, "bad group: rank %d of world %d, timeout %g s (world in [1, %d])",
                rank, world, timeout_s, DP_COMM_MAX_WORLD);
        return DFLASH_EINVAL;
    }
    if (kind != DP_COMM_SHM && kind != DP_COMM_NCCL) {
        err_fmt(err, errlen, "unknown collective backend %d", (int)kind);
        return DFLASH_EINVAL;
    }
#ifndef DFLASH_HAVE_NCCL
    if (kind == DP_COMM_NCCL) {
        (void)device;
        err_fmt(err, errlen, "this build has no NCCL (nccl.h / libnccl not found at configure "
                             "time, or -DDFLASH_NCCL=OFF): use the shm backend");
        return DFLASH_EUNSUPPORTED;
    }
#endif
    dp_comm *c = calloc(1, sizeof *c);
    if (!c) return DFLASH_ENOMEM;
    c->kind = kind;
    c->rank = rank;
    c->world = world;
    c->timeout_s = timeout_s;
    c->fd = -1;
    c->gone = -1;
    if (watch) c->watch = *watch;
    int rc;
#ifdef DFLASH_HAVE_NCCL
    if (kind == DP_COMM_NCCL)
        rc = dp_nccl_open(id, rank, world, device, timeout_s, &c->watch, c->why, &c->nccl, err,
                          errlen);
    else
#endif
        rc = shm_open_group(c, id, err, errlen);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int dp_comm_rank(const dp_comm *c) { return c->rank; }
const char *dp_comm_error(const dp_comm *c) { return c->why; }
int dp_comm_gone_rank(const dp_comm *c) { return c->gone; }
int dp_comm_world(const dp_comm *c) { return c->world; }
dp_comm_kind dp_comm_kind_of(const dp_comm *c) { return c->kind; }

/* Records a failed call: every later call on the handle answers DFLASH_EPEER. */
static int track(dp_comm *c, int rc) {
    if (rc && rc != DFLASH_EINVAL) {
        c->broken = true;
        dp_why_set(c->why, "%s", err_str(rc)); /* when the backend said nothing more precise */
    }
    return rc;
}

int dp_comm_set_timeout(dp_comm *c, double timeout_s) {
    if (!(timeout_s > 0)) return DFLASH_EINVAL;
    c->timeout_s = timeout_s;
#ifdef DFLASH_HAVE_NCCL
    if (c->kind == DP_COMM_NCCL) dp_nccl_set_timeout(c->nccl, timeout_s);
#endif
    return 0;
}

int dp_comm_barrier(dp_comm *c) {
    if (c->broken) return DFLASH_EPEER;
#ifdef DFLASH_HAVE_NCCL
    if (c->kind == DP_COMM_NCCL) return track(c, dp_nccl_barrier(c->nccl));
#endif
    return track(c, shm_barrier(c));
}

/* The scaled all-reduce of either element type: bf16 (true) or fp32. */
static int allreduce_scaled(dp_comm *c, void *buf, size_t n, bool bf16, float scale,
                            const dp_host_io *io, void *stream) {
    if (c->broken) return DFLASH_EPEER;
    if (n == 0) return 0;
    if (!buf) return DFLASH_EINVAL;
#ifdef DFLASH_HAVE_NCCL
    if (c->kind == DP_COMM_NCCL)
        return track(c, dp_nccl_allreduce(c->nccl, buf, n, bf16 ? DP_NCCL_BF16 : DP_NCCL_F32,
                                          scale, stream));
#endif
    (void)stream;
    return track(c, shm_reduce(c, buf, n, bf16 ? ELEM_BF16 : ELEM_F32, scale, io));
}

int dp_comm_allreduce_scaled_f32(dp_comm *c, float *buf, size_t n, float scale,
                                 const dp_host_io *io, void *stream) {
    return allreduce_scaled(c, buf, n, false, scale, io, stream);
}

int dp_comm_allreduce_scaled_bf16(dp_comm *c, void *buf, size_t n, float scale,
                                  const dp_host_io *io, void *stream) {
    return allreduce_scaled(c, buf, n, true, scale, io, stream);
}

int dp_comm_allreduce_f32(dp_comm *c, float *buf, size_t n, void *stream) {
    return dp_comm_allreduce_scaled_f32(c, buf, n, 1.0f, NULL, stream);
}

int dp_comm_allreduce_host_f64(dp_comm *c, double *v, int n) {
    if (c->broken) return DFLASH_EPEER;
    if (n < 0 || (n > 0 && !v)) return DFLASH_EINVAL;
    if (n == 0) return 0;
#ifdef DFLASH_HAVE_NCCL
    if (c->kind == DP_COMM_NCCL)
        return track(c, dp_nccl_allreduce(c->nccl, v, (size_t)n, DP_NCCL_F64_HOST, 1.0f, NULL));
#endif
    return track(c, shm_reduce(c, v, (size_t)n, ELEM_F64, 1.0f, NULL));
}

int dp_comm_broadcast_io(dp_comm *c, void *buf, size_t bytes, int root, const dp_host_io *io,
                         void *stream) {
    if (c->broken) return DFLASH_EPEER;
    if (root < 0 || root >= c->world || (bytes && !buf)) return DFLASH_EINVAL;
    if (bytes == 0) return 0;
#ifdef DFLASH_HAVE_NCCL
    if (c->kind == DP_COMM_NCCL)
        return track(c, dp_nccl_broadcast(c->nccl, buf, bytes, root, false, stream));
#endif
    (void)stream;
    return track(c, shm_broadcast(c, buf, bytes, root, io));
}

int dp_comm_broadcast(dp_comm *c, void *buf, size_t bytes, int root, void *stream) {
    return dp_comm_broadcast_io(c, buf, bytes, root, NULL, stream);
}

int dp_comm_broadcast_host(dp_comm *c, void *buf, size_t bytes, int root) {
    if (c->broken) return DFLASH_EPEER;
    if (root < 0 || root >= c->world || (bytes && !buf)) return DFLASH_EINVAL;
    if (bytes == 0) return 0;
#ifdef DFLASH_HAVE_NCCL
    if (c->kind == DP_COMM_NCCL)
        return track(c, dp_nccl_broadcast(c->nccl, buf, bytes, root, true, NULL));
#endif
    return track(c, shm_broadcast(c, buf, bytes, root, NULL));
}

void dp_comm_close(dp_comm **cp) {
    if (!cp || !*cp) return;
    dp_comm *c = *cp;
#ifdef DFLASH_HAVE_NCCL
    if (c->kind == DP_COMM_NCCL) dp_nccl_close(&c->nccl, c->broken);
#endif
    shm_close(c);
    free(c);
    *cp = NULL;
}
