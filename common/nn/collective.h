/* collective: the collective communication of a data-parallel drafter group (one process per
 * rank), with two backends behind one handle.
 *
 *   shm   POSIX shared memory between processes of one machine; needs no GPU (CI runs it).
 *         The rendezvous id names a segment "/dflash-dp-<pid>-<random hex>"; rank 0 creates it,
 *         the others open it (retrying until it exists). The segment holds a header, one
 *         arrival counter and the pid per rank (a generation-counter barrier over C11 atomics,
 *         polled with short sleeps against a deadline; while it waits, a rank looks every
 *         0.1 s whether the peer it waits for still lives: a peer process that has ended
 *         fails the call at once with DFLASH_EPEER, naming its rank and pid, and a peer that
 *         hangs gives DFLASH_ETIMEOUT, never a hang), and
 *         world + 1 regions of DP_SHM_CHUNK_BYTES: one input region per rank and one result
 *         region. A reduction goes chunk by chunk: every rank copies its chunk into its input
 *         region (bf16 data widened to fp32 there), barrier, rank r sums slice r of the chunk
 *         over all input regions in rank order 0..world-1 into the result region, barrier,
 *         every rank copies the result back (bf16: rounded once on the way). So each
 *         element is summed once, in a fixed order: the results are deterministic and
 *         bit-identical on every rank, and the segment size does not depend on the model. A
 *         broadcast goes through the root's input region, two barriers per chunk. The
 *         name is unlinked as soon as every rank has joined (no leftover even if ranks die
 *         later), on any open failure, and again (harmlessly) when the last rank closes.
 *   nccl  NCCL on CUDA devices (built when nccl.h and libnccl are found: DFLASH_HAVE_NCCL).
 *         The id is the 128-byte ncclUniqueId. The communicator is non-blocking
 *         (ncclConfig_t.blocking = 0): every call polls ncclCommGetAsyncError and an event
 *         against the deadline, and a timeout aborts the communicator (ncclCommAbort) instead
 *         of hanging. Calls return once the collective has completed on the device.
 *         Host-memory calls stage through a small device buffer owned by the handle.
 *
 * Timeouts: timeout_s given at open bounds the join and every later wait on peers. A rank that
 * falls behind its peers by more than that (e.g. a slow batch) breaks the group, so choose it
 * well above the worst step-time skew. After any error other than DFLASH_EINVAL the group is
 * broken: every later call returns DFLASH_EPEER (dp_comm_error says why it broke); close it
 * and form a new one with a new id.
 *
 * Watch: a caller that knows more about the group than the collective (the drafter: the
 * broker's view of its epoch) opens it with dp_comm_open_watched. Every wait on peers, join
 * included, that lasts longer than DP_COMM_WATCH_S calls the watch about every DP_COMM_WATCH_S
 * seconds from the waiting thread: it may say that the rank waits (a log line) and may end the
 * wait at once (the group is over for this rank: DFLASH_EPEER, the group broken), so a rank
 * need not sit out the timeout when its peers have moved on without it, or on another host
 * (nccl) a peer died that no process check here can see.
 *
 * Threads: one thread uses a handle at a time; every rank must make the same sequence of calls
 * with the same sizes. Callers: dflash_dp (the data-parallel training step), the drafter
 * daemon's group code (services/drafter), the tests.
 *
 * Additions to the agreed interface (nothing agreed was changed): dp_comm_kind_of,
 * dp_comm_barrier, dp_comm_set_timeout, dp_comm_allreduce_scaled_f32, _scaled_bf16 and
 * dp_comm_broadcast_io (a per-rank pre-scale, bf16 data, and copies through caller-supplied host
 * i/o, used by dflash_dp), dp_comm_have_nccl, dp_comm_open_watched, dp_comm_error and
 * dp_comm_gone_rank.
 */
#ifndef DFLASH_NN_COLLECTIVE_H
#define DFLASH_NN_COLLECTIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DP_COMM_ID_BYTES 128
/* The largest world dp_comm_open takes. */
#define DP_COMM_MAX_WORLD 1024
/* Bytes per region of the shm segment: the segment is (world + 1) regions plus a header. */
#define DP_SHM_CHUNK_BYTES ((size_t)4 << 20)

typedef enum { DP_COMM_SHM = 0, DP_COMM_NCCL = 1 } dp_comm_kind;
typedef struct dp_comm dp_comm;

/* "shm" / "nccl" <-> kind; returns 0 or DFLASH_EINVAL. */
int dp_comm_kind_parse(const char *s, dp_comm_kind *out);
const char *dp_comm_kind_name(dp_comm_kind k);
/* A group member's drafter shape (the hash and words its joins state, GroupJoin.shape) with
 * the collective kind added: ranks of two kinds cannot form one communicator (each misreads the
 * other's rendezvous id, and the group re-formed for ever), so the broker refuses a joiner whose
 * kind is not the group's as it refuses another drafter shape, naming both. ", comm KIND" is
 * appended to text (len bytes, cut if it does not fit); returns the hash, never 0 (0 is "not
 * stated"). */
uint64_t dp_comm_shape(dp_comm_kind kind, uint64_t hash, char *text, size_t len);
/* Whether this build has the nccl backend. */
bool dp_comm_have_nccl(void);

/* Rank 0 makes the rendezvous id; the broker relays the opaque bytes to the other ranks.
 * shm: a fresh segment name (nothing is created yet). nccl: ncclGetUniqueId, which starts
 * NCCL's bootstrap listener in this process: the process that makes it must stay alive until
 * the group has formed (make it in rank 0's own process). Returns 0, DFLASH_EUNSUPPORTED ("this
 * build has no NCCL"), or a negative code, with the reason in err. */
int dp_comm_make_id(dp_comm_kind kind, uint8_t id[DP_COMM_ID_BYTES], char *err, size_t errlen);

/* Joins the group `id` as `rank` of `world`. device: cuda device for nccl (ignored by shm).
 * Blocks until every rank has joined or timeout_s passes (DFLASH_ETIMEOUT). Other errors:
 * DFLASH_EPEER (shm: a rank that had joined has exited; or a watch ended the join),
 * DFLASH_EINVAL (rank/world/id), DFLASH_EMISMATCH (peers opened with another world),
 * DFLASH_EEXISTS (the rank joined twice, or the segment already exists), DFLASH_EUNSUPPORTED
 * (nccl in a build without NCCL), DFLASH_ECONFIG (nccl: NCCL refused this rank's configuration,
 * e.g. two ranks on one GPU, or the device cannot be set: joining again fails the same way; err
 * says what to change), DFLASH_EIO / DFLASH_ECUDA. *out is NULL on failure. */
int dp_comm_open(dp_comm_kind kind, const uint8_t id[DP_COMM_ID_BYTES], int rank, int world,
                 int device, double timeout_s, dp_comm **out, char *err, size_t errlen);

/* A wait on peers that has lasted a while, as the watch sees it. */
typedef struct dp_comm_wait {
    const char *what; /* "join", "barrier", "allreduce bf16", ... */
    int peer;         /* the rank waited for; -1 when the backend cannot tell (nccl, a join) */
    int peer_pid;     /* its process id when known (shm), else 0 */
    double waited_s;  /* since the wait began */
    double timeout_s; /* where it breaks the group */
} dp_comm_wait;

/* How often a lasting wait calls the watch, and how long a wait lasts before the first call. */
#define DP_COMM_WATCH_S 1.0

/* The caller's watch over lasting waits (see the top of this file). fn is called from the
 * waiting thread with ctx and the wait; it returns false to go on waiting, or true, with the
 * reason in why (len bytes), to end the wait: the call then returns DFLASH_EPEER, the group is
 * broken and dp_comm_error gives why. It may block for a while (a request to a broker). */
typedef struct dp_comm_watch {
    bool (*fn)(void *ctx, const dp_comm_wait *w, char *why, size_t len);
    void *ctx;
} dp_comm_watch;

/* dp_comm_open with a watch (copied; NULL or fn NULL: none, as dp_comm_open), which applies to
 * the join and to every later call on the handle. ctx must outlive the handle. A join the watch
 * ends returns DFLASH_EPEER with its words in err. */
int dp_comm_open_watched(dp_comm_kind kind, const uint8_t id[DP_COMM_ID_BYTES], int rank,
                         int world, int device, double timeout_s, const dp_comm_watch *watch,
                         dp_comm **out, char *err, size_t errlen);
int dp_comm_rank(const dp_comm *c);
int dp_comm_world(const dp_comm *c);
dp_comm_kind dp_comm_kind_of(const dp_comm *c);

/* Changes the timeout of every later wait on peers (e.g. a long one to join, a shorter one per
 * step). Local: no communication. DFLASH_EINVAL unless timeout_s > 0. */
int dp_comm_set_timeout(dp_comm *c, double timeout_s);

/* Waits until every rank has reached the barrier. 0 or a negative code (as allreduce). */
int dp_comm_barrier(dp_comm *c);

/* In-place sum over ranks of n floats. buf: host memory for shm, device memory for nccl
 * (stream: the cudaStream_t to order it on, NULL for the default; ignored by shm). Every rank
 * ends with bit-identical results. Returns 0, or a negative code when a peer is gone / the
 * timeout given at open passes (the group is then broken: close it and re-form). */
int dp_comm_allreduce_f32(dp_comm *c, float *buf, size_t n, void *stream);

/* Copies between a caller's memory (e.g. a cuda model's device buffers) and host memory, for
 * the shm backend, which reduces on the host: to_host(ctx, host_dst, src + off, bytes) and
 * from_host(ctx, dst + off, host_src, bytes). from_host may return before the copy is done if
 * it has already taken the source bytes (cudaMemcpyAsync from pageable memory does). */
typedef struct dp_host_io {
    void (*to_host)(void *ctx, void *host_dst, const void *src, size_t bytes);
    void (*from_host)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void *ctx;
} dp_host_io;

/* In-place sum over ranks of scale_r * buf_r, where scale is this rank's own factor (fp32
 * multiply before the sum: NCCL's PreMulSum op, or while staging on shm; scale 1 is a plain
 * sum). io: NULL when buf is memory the backend reduces directly (host for shm, device for
 * nccl); else (shm only) buf is the caller's memory, moved through io chunk by chunk, so no
 * buffer of n floats is ever allocated. nccl ignores io. Returns as dp_comm_allreduce_f32. */
int dp_comm_allreduce_scaled_f32(dp_comm *c, float *buf, size_t n, float scale,
                                 const dp_host_io *io, void *stream);

/* The same for n bf16 values (bit patterns, the upper half of an fp32; a cuda model's weight
 * gradients). shm: each rank's values are widened to fp32 and multiplied by scale while staged
 * in, summed in fp32 in rank order and rounded once to bf16 (nearest even) while staged out.
 * nccl: ncclBfloat16 with PreMulSum, whose scalar has the data's type: scale is rounded to
 * bf16 first (a relative error of at most 2^-9 in this rank's factor, the size of one rounding
 * of the values themselves), each product is rounded to bf16 and the ring's partial sums are
 * too (world - 1 additions in NCCL's order). Bit-identical on every rank with either backend. */
int dp_comm_allreduce_scaled_bf16(dp_comm *c, void *buf, size_t n, float scale,
                                  const dp_host_io *io, void *stream);

/* Same for a few host doubles (loss sums, weight sums): always host memory on both backends. */
int dp_comm_allreduce_host_f64(dp_comm *c, double *v, int n);
/* Copies root's n bytes to every rank: host memory for shm, device memory for nccl. */
int dp_comm_broadcast(dp_comm *c, void *buf, size_t bytes, int root, void *stream);
/* Broadcast of the caller's memory through io (shm; NULL io = host memory). nccl ignores io and
 * broadcasts device memory on stream. */
int dp_comm_broadcast_io(dp_comm *c, void *buf, size_t bytes, int root, const dp_host_io *io,
                         void *stream);
/* Same, host memory on both backends (small: step counters, config checks). */
int dp_comm_broadcast_host(dp_comm *c, void *buf, size_t bytes, int root);

/* Why the group broke, in words for a log line ("rank 1 (pid 4242) has exited", "timed out after
 * 60 s in barrier waiting for rank 1", a watch's reason); "" while it is not broken. Valid until
 * dp_comm_close. */
const char *dp_comm_error(const dp_comm *c);

/* The rank whose process was seen to have ended when the group broke, by this rank or (shm: the
 * segment records it) by the rank that broke it; -1 when the group is not broken, broke for
 * another reason (a timeout, a watch, a rank that closed), or on nccl (no process check). The
 * drafter tells the broker (GroupJoin.gone_rank), which drops that member at once. */
int dp_comm_gone_rank(const dp_comm *c);

/* Leaves the group; safe on a broken group (nccl: ncclCommAbort); NULLs *c. Accepts NULL. */
void dp_comm_close(dp_comm **c);

#endif
