/* test_collective: the shm backend of dp_comm (collective.h) between real processes.
 *
 * The parent makes an id and forks `world` ranks (2, 3 and 4); each rank runs the same
 * sequence of calls and exits with its number of failed checks (alarm() turns a hang into a
 * failure). Checked:
 *   - allreduce_f32 of 1, 1000 and 2 chunks + 777 floats: every rank's result equals, bit for
 *     bit, the sum of all ranks' inputs in rank order 0..world-1 (so ranks agree bitwise), with
 *     inputs of mixed magnitude and sign so that a different order would show;
 *   - allreduce_scaled_f32 (a per-rank pre-scale), also through a dp_host_io;
 *   - allreduce_scaled_bf16 on host memory and through a dp_host_io: every rank's result is,
 *     bit for bit, the fp32 sum in rank order of the widened, pre-scaled inputs rounded once
 *     to bf16 (chunks of the fp32 width: 2 chunks + 777 values);
 *   - allreduce_host_f64, broadcast (larger than a chunk, from the last rank), broadcast_host,
 *     barrier; 500 rounds of a reduction then a broadcast, back to back;
 *   - failures: a rank that never joins (the others' open times out within the timeout), a rank
 *     that dies after joining (the others' allreduce fails, later calls say EPEER), a rank
 *     that closes early (the others get EPEER without waiting), a world mismatch, bad ids;
 *   - a rank SIGKILLed in a group with a 30 s timeout: every survivor's next call fails within
 *     half of it (the dead process is seen, not waited out: ~1 s unloaded; a zombie its parent has not reaped yet
 *     counts as dead), dp_comm_error names the dead rank and its pid and dp_comm_gone_rank
 *     its rank, on every survivor (the ones that read it from the rank that broke the group
 *     too); -1 while the group holds and when it broke for another reason (a watch);
 *   - a watch (dp_comm_open_watched): a barrier whose peer is alive but late, and a join whose
 *     peer never comes, each under a 30 s timeout, end with EPEER as soon as the watch says so
 *     (about 2 s), with the watch's words in dp_comm_error / the open's error; the watch sees
 *     what is waited for, which rank (and its pid) and for how long, first after
 *     DP_COMM_WATCH_S; the late peer then finds the group broken by rank 0; a peer that arrives
 *     while the watch is being asked does not turn its "over" into a passed barrier;
 *   - no /dev/shm/dflash-dp-* segment of this test is left behind;
 *   - what a failed NCCL init means (dp_nccl_init_fault, built without NCCL too): NCCL's
 *     "Duplicate GPU detected" refusal (ncclInvalidUsage, the text NCCL 2.28 gives) and any
 *     other invalid usage are DFLASH_ECONFIG, whose message names --device and --comm shm;
 *     a peer's failure (remote / system error) and a timeout stay DFLASH_EPEER, message
 *     untouched.
 */
#include "check.h"
#include "collective.h"
#include "collective_nccl.h"
#include "err.h"
#include "monotime.h"
#include "safetensors.h"
#include "test_ranks.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK_F (DP_SHM_CHUNK_BYTES / sizeof(float))

static const size_t SIZES[] = {1, 1000, 2 * CHUNK_F + 777};

/* Input element j of rank r: mixed magnitudes and signs, so float addition order matters. */
static float input(int r, size_t j) {
    uint64_t x = (j + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(r + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    double u = (double)(x >> 11) / 9007199254740992.0 - 0.5; /* [-0.5, 0.5) */
    return (float)(u * (double)(1u << (x % 24)));
}

static float scale_of(int r) { return 0.37f * (float)(r + 1); }

typedef struct io_count {
    long to, from;
} io_count;

static void io_to(void *ctx, void *dst, const void *src, size_t bytes) {
    ((io_count *)ctx)->to++;
    memcpy(dst, src, bytes);
}

static void io_from(void *ctx, void *dst, const void *src, size_t bytes) {
    ((io_count *)ctx)->from++;
    memcpy(dst, src, bytes);
}

static char shm_name_of(const uint8_t *id, char *out, size_t len) {
    snprintf(out, len, "%s", (const char *)id + 9); /* skip "DPC1", padding and the '/' */
    return out[0];
}

/* Number of /dev/shm entries whose name starts with prefix. */
static int shm_count(const char *prefix) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * the ranks */

static void rank_main(const uint8_t *id, int rank, int world) {
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open(DP_COMM_SHM, id, rank, world, -1, 10.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return;
    }
    CHECK_EQ_INT(dp_comm_rank(c), rank);
    CHECK_EQ_INT(dp_comm_world(c), world);
    size_t nmax = SIZES[2];
    float *buf = malloc(nmax * sizeof(float)), *ref = malloc(nmax * sizeof(float));
    for (int scaled = 0; scaled < 3; scaled++) { /* plain, pre-scaled, pre-scaled through io */
        for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
            size_t n = SIZES[si];
            for (size_t j = 0; j < n; j++) {
                buf[j] = input(rank, j);
                ref[j] = scaled ? input(0, j) * scale_of(0) : input(0, j);
            }
            for (int r = 1; r < world; r++)
                for (size_t j = 0; j < n; j++)
                    ref[j] += scaled ? input(r, j) * scale_of(r) : input(r, j);
            io_count cnt = {0, 0};
            dp_host_io io = {io_to, io_from, &cnt};
            if (scaled == 0) rc = dp_comm_allreduce_f32(c, buf, n, NULL);
            else rc = dp_comm_allreduce_scaled_f32(c, buf, n, scale_of(rank),
                                                   scaled == 2 ? &io : NULL, NULL);
            CHECK_EQ_INT(rc, 0);
            size_t bad = 0;
            for (size_t j = 0; j < n; j++)
                bad += memcmp(&buf[j], &ref[j], sizeof(float)) != 0;
            if (bad)
                fprintf(stderr, "rank %d world %d n %zu scaled %d: %zu elements differ\n", rank,
                        world, n, scaled, bad);
            CHECK_EQ_INT(bad, 0);
            if (scaled == 2) {
                long chunks = (long)((n + CHUNK_F - 1) / CHUNK_F);
                CHECK_EQ_INT(cnt.to, chunks);
                CHECK_EQ_INT(cnt.from, chunks);
            }
        }
    }
    /* bf16: widened, scaled and summed in fp32 in rank order, rounded once */
    uint16_t *hb = malloc(nmax * sizeof(uint16_t));
    for (int via_io = 0; via_io < 2; via_io++) {
        for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
            size_t n = SIZES[si];
            for (size_t j = 0; j < n; j++) {
                hb[j] = safetensors_f32_to_bf16(input(rank, j));
                ref[j] = 0.0f;
                for (int r = 0; r < world; r++) {
                    float x = safetensors_bf16_to_f32(safetensors_f32_to_bf16(input(r, j)));
                    ref[j] = r == 0 ? x * scale_of(r) : ref[j] + x * scale_of(r);
                }
            }
            io_count cnt = {0, 0};
            dp_host_io io = {io_to, io_from, &cnt};
            rc = dp_comm_allreduce_scaled_bf16(c, hb, n, scale_of(rank), via_io ? &io : NULL,
                                               NULL);
            CHECK_EQ_INT(rc, 0);
            size_t bad = 0;
            for (size_t j = 0; j < n; j++)
                bad += hb[j] != safetensors_f32_to_bf16(ref[j]);
            if (bad)
                fprintf(stderr, "rank %d world %d n %zu bf16 io %d: %zu elements differ\n", rank,
                        world, n, via_io, bad);
            CHECK_EQ_INT(bad, 0);
            if (via_io) {
                long chunks = (long)((n + CHUNK_F - 1) / CHUNK_F);
                CHECK_EQ_INT(cnt.to, chunks);
                CHECK_EQ_INT(cnt.from, chunks);
            }
        }
    }
    free(hb);
    /* host doubles */
    double v[3] = {rank, 1.0 + rank * 0.1, -(double)rank * rank}, vr[3] = {0, 0, 0};
    for (int r = 0; r < world; r++)
        vr[0] += r, vr[1] += 1.0 + r * 0.1, vr[2] += -(double)r * r;
    CHECK_EQ_INT(dp_comm_allreduce_host_f64(c, v, 3), 0);
    CHECK(memcmp(v, vr, sizeof v) == 0);
    /* broadcast larger than a chunk from the last rank */
    int root = world - 1;
    size_t bytes = DP_SHM_CHUNK_BYTES * 2 + 13;
    unsigned char *bb = malloc(bytes);
    for (size_t j = 0; j < bytes; j++)
        bb[j] = (unsigned char)(rank == root ? (j * 131 + 7) : 0xee);
    CHECK_EQ_INT(dp_comm_broadcast(c, bb, bytes, root, NULL), 0);
    size_t badb = 0;
    for (size_t j = 0; j < bytes; j++)
        badb += bb[j] != (unsigned char)(j * 131 + 7);
    CHECK_EQ_INT(badb, 0);
    free(bb);
    int64_t step[2] = {rank == 1 ? 4242 : -1, rank == 1 ? -7 : 0};
    CHECK_EQ_INT(dp_comm_broadcast_host(c, step, sizeof step, 1), 0);
    CHECK_EQ_INT(step[0], 4242);
    CHECK_EQ_INT(step[1], -7);
    CHECK_EQ_INT(dp_comm_broadcast_host(c, step, sizeof step, world), DFLASH_EINVAL);
    CHECK_EQ_INT(dp_comm_barrier(c), 0);
    /* back to back reductions and broadcasts (the ranks' regions are reused at once) */
    int wrong = 0;
    for (int k = 0; k < 500; k++) {
        double s = rank + k;
        uint64_t t[2] = {rank == k % world ? (uint64_t)k * 3 : 0, 0};
        if (dp_comm_allreduce_host_f64(c, &s, 1) || dp_comm_broadcast_host(c, t, 16, k % world))
            wrong++;
        wrong += s != (double)world * (world - 1) / 2 + (double)k * world || t[0] != (uint64_t)k * 3;
    }
    CHECK_EQ_INT(wrong, 0);
    /* the same results on every rank: rank 0's hash of the last reduction, compared */
    uint64_t h = 1469598103934665603ull, h0;
    for (size_t j = 0; j < nmax; j++)
        h = (h ^ ((uint32_t *)buf)[j]) * 1099511628211ull;
    h0 = h;
    CHECK_EQ_INT(dp_comm_broadcast_host(c, &h0, sizeof h0, 0), 0);
    CHECK(h0 == h);
    free(buf);
    free(ref);
    dp_comm_close(&c);
    CHECK(c == NULL);
    dp_comm_close(&c); /* NULL is fine */
}

/* Forks world ranks running fn; returns the number of ranks that failed (rank `killed`, when
 * >= 0, must end by SIGKILL instead). */
typedef void (*rank_fn)(const uint8_t *id, int rank, int world);

typedef struct group_run {
    const uint8_t *id;
    int world;
    rank_fn fn;
} group_run;

/* Rank r of the group_run arg points to (test_ranks_fork's child). */
static void group_rank(int r, void *arg) {
    const group_run *g = arg;
    g->fn(g->id, r, g->world);
}

static int run_group(const uint8_t *id, int world, rank_fn fn, int killed) {
    group_run g = {id, world, fn};
    pid_t pids[TEST_RANKS_MAX];
    test_ranks_fork(world, group_rank, &g, 60, pids);
    char what[32];
    snprintf(what, sizeof what, "world %d rank", world);
    return test_ranks_wait(world, pids, killed, what);
}

/* ---------------------------------------------------------------------------------------------
 * failures */

#define SHORT_TIMEOUT 1.0
/* How late a bounded wait may end on a loaded runner: a 1 s timeout has ended in 3.3 s with
 * 8 busy processes on 2 cores (every rank's work around the wait runs ~10x slower). The bounds
 * below still tell "ended by the timeout or the watch" from "waited out the 30 s timeout" or
 * a hang (alarm). */
#define LOADED_SLACK_S 8.0
#define LONG_TIMEOUT_BOUND 15.0 /* half of the 30 s timeouts: the end was seen, not waited out */

/* rank world-1 never joins: the others' open must time out, not hang */
static void rank_absent(const uint8_t *id, int rank, int world) {
    if (rank == world - 1) return;
    dp_comm *c = NULL;
    char err[256] = "";
    double t0 = monotime_s();
    int rc = dp_comm_open(DP_COMM_SHM, id, rank, world, -1, SHORT_TIMEOUT, &c, err, sizeof err);
    double dt = monotime_s() - t0;
    CHECK_EQ_INT(rc, DFLASH_ETIMEOUT);
    CHECK(c == NULL);
    CHECK(dt < SHORT_TIMEOUT + LOADED_SLACK_S);
    CHECK(strstr(err, "within") != NULL);
}

/* rank world-1 joins then dies (no close): the others' allreduce times out; later calls EPEER */
static void rank_dies(const uint8_t *id, int rank, int world) {
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open(DP_COMM_SHM, id, rank, world, -1, 20.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    CHECK_EQ_INT(dp_comm_set_timeout(c, 0.0), DFLASH_EINVAL);
    CHECK_EQ_INT(dp_comm_barrier(c), 0); /* joined and in step (under the long timeout) */
    CHECK_EQ_INT(dp_comm_set_timeout(c, SHORT_TIMEOUT), 0); /* then fail fast */
    float x[4] = {1, 2, 3, 4};
    CHECK_EQ_INT(dp_comm_allreduce_f32(c, x, 4, NULL), 0);
    if (rank == world - 1) _exit(check_failed); /* a crash: no close */
    double t0 = monotime_s();
    rc = dp_comm_allreduce_f32(c, x, 4, NULL);
    double dt = monotime_s() - t0;
    /* the first rank to time out breaks the group; the others may see that first */
    CHECK(rc == DFLASH_ETIMEOUT || rc == DFLASH_EPEER);
    CHECK(dt < SHORT_TIMEOUT + LOADED_SLACK_S);
    CHECK_EQ_INT(dp_comm_allreduce_f32(c, x, 4, NULL), DFLASH_EPEER);
    CHECK_EQ_INT(dp_comm_barrier(c), DFLASH_EPEER);
    dp_comm_close(&c);
}

/* rank 0 closes right after joining: the others learn it at once (EPEER), long before the
 * (long) timeout */
static void rank_leaves(const uint8_t *id, int rank, int world) {
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open(DP_COMM_SHM, id, rank, world, -1, 30.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    if (rank == 0) {
        dp_comm_close(&c);
        return;
    }
    double t0 = monotime_s(), v = 1.0;
    rc = dp_comm_allreduce_host_f64(c, &v, 1);
    CHECK_EQ_INT(rc, DFLASH_EPEER);
    CHECK(monotime_s() - t0 < 5.0);
    CHECK_EQ_INT(dp_comm_gone_rank(c), -1); /* it left (closed) before its process ended */
    dp_comm_close(&c);
}

/* rank world-1 tells its pid, then is SIGKILLed (by itself) while the others wait for it
 * under a 30 s timeout: they fail within 3 s, naming its rank and pid */
static void rank_killed(const uint8_t *id, int rank, int world) {
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open(DP_COMM_SHM, id, rank, world, -1, 30.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    int32_t pid = (int32_t)getpid();
    CHECK_EQ_INT(dp_comm_broadcast_host(c, &pid, sizeof pid, world - 1), 0);
    CHECK_EQ_INT(dp_comm_barrier(c), 0);
    CHECK_EQ_INT(strlen(dp_comm_error(c)), 0);
    CHECK_EQ_INT(dp_comm_gone_rank(c), -1);
    if (rank == world - 1) kill(getpid(), SIGKILL);
    double t0 = monotime_s(), v = 1.0;
    rc = dp_comm_allreduce_host_f64(c, &v, 1);
    double dt = monotime_s() - t0;
    CHECK_EQ_INT(rc, DFLASH_EPEER);
    CHECK(dt < LONG_TIMEOUT_BOUND);
    char want[64];
    snprintf(want, sizeof want, "rank %d (pid %d) has exited", world - 1, (int)pid);
    CHECK(strstr(dp_comm_error(c), want) != NULL);
    if (!strstr(dp_comm_error(c), want))
        fprintf(stderr, "rank %d: error '%s' lacks '%s'\n", rank, dp_comm_error(c), want);
    printf("rank %d: failed after %.2f s: %s\n", rank, dt, dp_comm_error(c));
    /* whether this rank saw it or read it from the rank that broke the group */
    CHECK_EQ_INT(dp_comm_gone_rank(c), world - 1);
    CHECK_EQ_INT(dp_comm_barrier(c), DFLASH_EPEER);
    CHECK_EQ_INT(dp_comm_gone_rank(c), world - 1);
    dp_comm_close(&c);
}

/* A watch that ends the wait once it has lasted 2 s, and records what it was shown. */
typedef struct watch_log {
    int calls, peer, peer_pid;
    double first_s, last_s;
    char what[32];
} watch_log;

static bool watch_2s(void *ctx, const dp_comm_wait *w, char *why, size_t len) {
    watch_log *l = ctx;
    if (l->calls++ == 0) l->first_s = w->waited_s;
    l->last_s = w->waited_s;
    l->peer = w->peer;
    l->peer_pid = w->peer_pid;
    snprintf(l->what, sizeof l->what, "%s", w->what);
    if (w->waited_s < 2.0) return false;
    snprintf(why, len, "the broker moved the group on");
    return true;
}

/* world 2: rank 1 reaches the second barrier 5 s late; rank 0's watch ends its wait at 2 s */
static void rank_watched(const uint8_t *id, int rank, int world) {
    (void)world;
    watch_log l = {0};
    dp_comm_watch w = {watch_2s, &l};
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open_watched(DP_COMM_SHM, id, rank, 2, -1, 30.0, rank == 0 ? &w : NULL, &c,
                                  err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    int32_t pid = (int32_t)getpid();
    CHECK_EQ_INT(dp_comm_broadcast_host(c, &pid, sizeof pid, 1), 0);
    if (rank == 1) { /* rank 0 arrived at this barrier before it broke the group: it may pass */
        monotime_sleep_ms(5000);
        double t0 = monotime_s();
        rc = dp_comm_barrier(c);
        if (rc == 0) rc = dp_comm_barrier(c);
        CHECK_EQ_INT(rc, DFLASH_EPEER);
        CHECK(monotime_s() - t0 < 5.0);
        CHECK(strstr(dp_comm_error(c), "rank 0 broke the group") != NULL);
        CHECK_EQ_INT(dp_comm_gone_rank(c), -1); /* no process ended */
        dp_comm_close(&c);
        return;
    }
    double t0 = monotime_s();
    rc = dp_comm_barrier(c);
    double dt = monotime_s() - t0;
    CHECK_EQ_INT(rc, DFLASH_EPEER);
    CHECK(dt >= 2.0 && dt < LONG_TIMEOUT_BOUND);
    CHECK(l.calls >= 2);
    CHECK(l.first_s >= DP_COMM_WATCH_S && l.first_s < DP_COMM_WATCH_S + LOADED_SLACK_S);
    CHECK(l.last_s >= 2.0);
    CHECK(strcmp(l.what, "barrier") == 0);
    CHECK_EQ_INT(l.peer, 1);
    CHECK_EQ_INT(l.peer_pid, pid);
    CHECK(strstr(dp_comm_error(c), "the broker moved the group on") != NULL);
    CHECK_EQ_INT(dp_comm_gone_rank(c), -1);
    printf("watched barrier: ended after %.2f s (%d calls): %s\n", dt, l.calls,
           dp_comm_error(c));
    dp_comm_close(&c);
}

/* A page shared by the forked ranks of rank_watched_arrival: rank 0's watch is being asked
 * (in_watch), rank 1 has entered its barrier (arrived). */
static struct arrival_flags {
    atomic_int in_watch, arrived;
} *arrival;

/* The watch of a broker that moves the group on while rank 1 arrives: it waits for rank 1 to
 * enter the barrier, then says the wait is over. */
static bool watch_while_arriving(void *ctx, const dp_comm_wait *w, char *why, size_t len) {
    (void)ctx, (void)w;
    atomic_store(&arrival->in_watch, 1);
    for (double end = monotime_s() + 20; !atomic_load(&arrival->arrived) && monotime_s() < end;)
        monotime_sleep_ms(1);
    monotime_sleep_ms(100); /* rank 1's arrival is stored right after its flag */
    snprintf(why, len, "the broker moved the group on");
    return true;
}

/* world 2: rank 1 enters the barrier while rank 0's watch is being asked, and the watch says
 * the wait is over: rank 0's barrier fails (defect: the peer was there by then, so it passed,
 * and a step the broker had aborted on rank 0's word was applied); rank 1, which found rank 0
 * there, may pass, and its next call finds the group broken. */
static void rank_watched_arrival(const uint8_t *id, int rank, int world) {
    (void)world;
    dp_comm_watch w = {watch_while_arriving, NULL};
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open_watched(DP_COMM_SHM, id, rank, 2, -1, 30.0, rank == 0 ? &w : NULL, &c,
                                  err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    if (rank == 1) {
        for (double end = monotime_s() + 20;
             !atomic_load(&arrival->in_watch) && monotime_s() < end;)
            monotime_sleep_ms(1);
        atomic_store(&arrival->arrived, 1);
        rc = dp_comm_barrier(c);
        if (rc == 0) rc = dp_comm_barrier(c);
        CHECK_EQ_INT(rc, DFLASH_EPEER);
        dp_comm_close(&c);
        return;
    }
    rc = dp_comm_barrier(c);
    CHECK_EQ_INT(rc, DFLASH_EPEER);
    CHECK(strstr(dp_comm_error(c), "the broker moved the group on") != NULL);
    printf("watched barrier, the peer arriving meanwhile: %s (%s)\n", err_str(rc),
           dp_comm_error(c));
    dp_comm_close(&c);
}

/* world 2: rank 1 never comes; rank 0's watch ends its join at 2 s (timeout 30 s) */
static void rank_watched_join(const uint8_t *id, int rank, int world) {
    (void)world;
    if (rank == 1) return;
    watch_log l = {0};
    dp_comm_watch w = {watch_2s, &l};
    dp_comm *c = NULL;
    char err[256] = "";
    double t0 = monotime_s();
    int rc = dp_comm_open_watched(DP_COMM_SHM, id, 0, 2, -1, 30.0, &w, &c, err, sizeof err);
    double dt = monotime_s() - t0;
    CHECK_EQ_INT(rc, DFLASH_EPEER);
    CHECK(c == NULL);
    CHECK(dt >= 2.0 && dt < LONG_TIMEOUT_BOUND);
    CHECK(strcmp(l.what, "join") == 0);
    CHECK(strstr(err, "the broker moved the group on") != NULL);
    printf("watched join: ended after %.2f s: %s\n", dt, err);
}

/* rank 1 says world + 1 */
static void rank_mismatch(const uint8_t *id, int rank, int world) {
    dp_comm *c = NULL;
    char err[256] = "";
    int rc = dp_comm_open(DP_COMM_SHM, id, rank, rank == 1 ? world + 1 : world, -1,
                          SHORT_TIMEOUT, &c, err, sizeof err);
    if (rank == 1) {
        CHECK_EQ_INT(rc, DFLASH_EMISMATCH);
        CHECK(strstr(err, "world") != NULL);
    } else {
        CHECK(rc == DFLASH_ETIMEOUT || rc == DFLASH_EPEER);
    }
    CHECK(c == NULL);
}

static void test_args(void) {
    dp_comm_kind k = DP_COMM_NCCL;
    CHECK_EQ_INT(dp_comm_kind_parse("shm", &k), 0);
    CHECK_EQ_INT(k, DP_COMM_SHM);
    CHECK_EQ_INT(dp_comm_kind_parse("nccl", &k), 0);
    CHECK_EQ_INT(k, DP_COMM_NCCL);
    CHECK_EQ_INT(dp_comm_kind_parse("mpi", &k), DFLASH_EINVAL);
    CHECK_EQ_INT(dp_comm_kind_parse(NULL, &k), DFLASH_EINVAL);
    CHECK(strcmp(dp_comm_kind_name(DP_COMM_SHM), "shm") == 0);
    CHECK(strcmp(dp_comm_kind_name(DP_COMM_NCCL), "nccl") == 0);
    uint8_t id[DP_COMM_ID_BYTES], id2[DP_COMM_ID_BYTES];
    char err[256] = "";
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, id, err, sizeof err), 0);
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, id2, err, sizeof err), 0);
    CHECK(memcmp(id, id2, sizeof id) != 0);
    CHECK(strncmp((char *)id + 8, "/dflash-dp-", 11) == 0);
    dp_comm *c = (dp_comm *)1;
    CHECK_EQ_INT(dp_comm_open(DP_COMM_SHM, id, 2, 2, -1, 1.0, &c, err, sizeof err),
                 DFLASH_EINVAL);
    CHECK(c == NULL);
    CHECK_EQ_INT(dp_comm_open(DP_COMM_SHM, id, 0, 0, -1, 1.0, &c, err, sizeof err),
                 DFLASH_EINVAL);
    uint8_t junk[DP_COMM_ID_BYTES];
    memset(junk, 'x', sizeof junk);
    CHECK_EQ_INT(dp_comm_open(DP_COMM_SHM, junk, 0, 1, -1, 1.0, &c, err, sizeof err),
                 DFLASH_EINVAL);
    if (!dp_comm_have_nccl()) {
        CHECK_EQ_INT(dp_comm_make_id(DP_COMM_NCCL, id2, err, sizeof err), DFLASH_EUNSUPPORTED);
        CHECK(strstr(err, "no NCCL") != NULL);
        CHECK_EQ_INT(dp_comm_open(DP_COMM_NCCL, id2, 0, 1, 0, 1.0, &c, err, sizeof err),
                     DFLASH_EUNSUPPORTED);
    }
    /* world 1: everything is a copy of itself */
    CHECK_EQ_INT(dp_comm_open(DP_COMM_SHM, id, 0, 1, -1, 1.0, &c, err, sizeof err), 0);
    float x = 3.25f;
    CHECK_EQ_INT(dp_comm_allreduce_scaled_f32(c, &x, 1, 2.0f, NULL, NULL), 0);
    CHECK(x == 6.5f);
    dp_comm_close(&c);
}

/* A rank other than 0 attaches only a segment of its own uid with mode 0600, as rank 0 makes
 * it: one planted at the group's name, open to others (or another user's), could hold anything
 * (the local-trust check the host pools have too). Refused at once, not waited on. */
static void test_foreign_segment(void) {
    uint8_t id[DP_COMM_ID_BYTES];
    char err[256] = "";
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, id, err, sizeof err), 0);
    const char *name = (const char *)id + 8;
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK_EQ_INT(fchmod(fd, 0644), 0);
    CHECK_EQ_INT(ftruncate(fd, 1 << 20), 0);
    close(fd);
    dp_comm *c = NULL;
    double t0 = monotime_s();
    CHECK_EQ_INT(dp_comm_open(DP_COMM_SHM, id, 1, 2, -1, 5.0, &c, err, sizeof err),
                 DFLASH_EDENIED);
    CHECK(monotime_s() - t0 < 2.0);
    CHECK(c == NULL);
    CHECK(strstr(err, name) != NULL && strstr(err, "0644") != NULL);
    shm_unlink(name);
}

/* The collective is part of a member's stated shape: the same drafter with another --comm
 * states another hash and says which in words, so the broker turns it away (a rank of another
 * kind misread the group's id, and the group re-formed for ever). */
static void test_comm_shape(void) {
    char shm[128] = "2 layers, block 4", nccl[128] = "2 layers, block 4";
    uint64_t a = dp_comm_shape(DP_COMM_SHM, 42, shm, sizeof shm);
    uint64_t b = dp_comm_shape(DP_COMM_NCCL, 42, nccl, sizeof nccl);
    CHECK(a != b && a != 0 && b != 0 && a != 42);
    CHECK(strcmp(shm, "2 layers, block 4, comm shm") == 0);
    CHECK(strcmp(nccl, "2 layers, block 4, comm nccl") == 0);
    char again[128] = "2 layers, block 4";
    CHECK(dp_comm_shape(DP_COMM_SHM, 42, again, sizeof again) == a); /* the same every join */
    CHECK(dp_comm_shape(DP_COMM_SHM, 43, again, sizeof again) != a); /* the drafter's part too */
    char tight[20] = "2 layers, block 4";   /* no room for all of it: cut, terminated */
    dp_comm_shape(DP_COMM_NCCL, 42, tight, sizeof tight);
    CHECK(strlen(tight) == sizeof tight - 1);
}

/* ncclResult_t numbers as nccl.h gives them (this test builds without nccl.h too). */
enum { NCCL_SYSTEM_ERROR = 2, NCCL_REMOTE_ERROR = 6 };

static void test_init_fault(void) {
    char msg[600] = "untouched";
    const char *dup = "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000";
    CHECK_EQ_INT(dp_nccl_init_fault(DP_NCCL_INVALID_USAGE, dup, 1, 0, msg, sizeof msg),
                 DFLASH_ECONFIG);
    CHECK(strstr(msg, "one GPU per rank") != NULL);
    CHECK(strstr(msg, "--device 0") != NULL);
    CHECK(strstr(msg, "--comm shm") != NULL);
    CHECK(strstr(msg, dup) != NULL); /* NCCL's own words, for the ranks and the bus id */
    /* another invalid usage at init: still no re-form can mend it */
    snprintf(msg, sizeof msg, "untouched");
    CHECK_EQ_INT(dp_nccl_init_fault(DP_NCCL_INVALID_USAGE, "", 2, 3, msg, sizeof msg),
                 DFLASH_ECONFIG);
    CHECK(strstr(msg, "rank 2 on --device 3") != NULL);
    CHECK(strstr(msg, "--comm shm") != NULL);
    CHECK_EQ_INT(dp_nccl_init_fault(DP_NCCL_INVALID_USAGE, NULL, 0, 0, msg, sizeof msg),
                 DFLASH_ECONFIG);
    /* the text alone names the shared GPU, whatever number came with it */
    CHECK_EQ_INT(dp_nccl_init_fault(NCCL_SYSTEM_ERROR, dup, 0, 1, msg, sizeof msg),
                 DFLASH_ECONFIG);
    /* a peer gave up, or another failure: the group re-forms without it */
    snprintf(msg, sizeof msg, "untouched");
    CHECK_EQ_INT(dp_nccl_init_fault(NCCL_REMOTE_ERROR, "", 0, 1, msg, sizeof msg), DFLASH_EPEER);
    CHECK_EQ_INT(dp_nccl_init_fault(NCCL_SYSTEM_ERROR, "socket closed", 0, 1, msg, sizeof msg),
                 DFLASH_EPEER);
    CHECK(strcmp(msg, "untouched") == 0);
}

int main(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "dflash-dp-%ld-", (long)getpid());
    test_args();
    test_init_fault();
    test_comm_shape();
    test_foreign_segment();
    uint8_t id[DP_COMM_ID_BYTES];
    char err[256], name[128];
    for (int world = 2; world <= 4; world++) {
        CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, id, err, sizeof err), 0);
        double t0 = monotime_s();
        CHECK_EQ_INT(run_group(id, world, rank_main, -1), 0);
        printf("world %d: collectives ok in %.2f s (segment %s)\n", world, monotime_s() - t0,
               (shm_name_of(id, name, sizeof name), name));
    }
    arrival = mmap(NULL, sizeof *arrival, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    CHECK(arrival != MAP_FAILED);
    if (arrival == MAP_FAILED) CHECK_DONE();
    struct {
        const char *what;
        rank_fn fn;
    } fails[] = {{"absent rank", rank_absent},
                 {"dead rank", rank_dies},
                 {"early close", rank_leaves},
                 {"world mismatch", rank_mismatch},
                 {"killed rank", rank_killed},
                 {"watched barrier", rank_watched},
                 {"watched barrier, the peer arriving meanwhile", rank_watched_arrival},
                 {"watched join", rank_watched_join}};
    for (size_t i = 0; i < sizeof fails / sizeof fails[0]; i++) {
        CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, id, err, sizeof err), 0);
        double t0 = monotime_s();
        bool two = fails[i].fn == rank_watched || fails[i].fn == rank_watched_join ||
                   fails[i].fn == rank_watched_arrival;
        CHECK_EQ_INT(run_group(id, two ? 2 : 3, fails[i].fn, fails[i].fn == rank_killed ? 2 : -1),
                     0);
        printf("%s: handled in %.2f s\n", fails[i].what, monotime_s() - t0);
    }
    int left = shm_count(prefix);
    if (left) fprintf(stderr, "%d /dev/shm/%s* segments left behind\n", left, prefix);
    CHECK_EQ_INT(left, 0);
    CHECK_DONE();
}
