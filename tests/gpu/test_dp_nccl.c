/* test_dp_nccl (GPU, label gpu): the data-parallel drafter step on the cuda backend, through
 * both collectives, with ranks as forked processes (the parent never touches CUDA: a forked
 * child cannot use its parent's CUDA context; a probe child counts the GPUs).
 *   1. nccl, world 1, GPU 0: open, allreduce (plain and pre-scaled, fp32 and bf16, device
 *      memory on the context's stream), allreduce_host_f64, broadcast (device),
 *      broadcast_host, barrier, close;
 *      then a world of 2 whose rank 1 never joins: rank 0's open returns DFLASH_ETIMEOUT;
 *      then a world of 2 with both ranks on GPU 0 (two forked ranks, the id through a pipe):
 *      NCCL refuses two ranks on one GPU, and each rank's open returns DFLASH_ECONFIG, saying
 *      one GPU per rank, within its 20 s timeout (the drafter then exits 2 instead of
 *      re-forming the group for ever).
 *   2. shm, world 2, both ranks on GPU 0 with the cuda backend: a small drafter (D 128, 2
 *      layers, head dim 64, B 8) trains N steps on different batches per rank; the gradients
 *      go through the shm segment with the ops' download/upload. First, a pre-scaled (mean)
 *      allreduce of fp32 and bf16 device buffers gives each rank the mean of both ranks' known
 *      values. After every step both ranks' state hashes (master, AdamW m and v, step) are
 *      equal; dflash_dp_sync_state makes a rank that started from other weights equal to rank 0.
 *   3. with >= 2 GPUs: the same training with nccl, rank r on GPU r (rank 0 makes the id and
 *      hands it to rank 1 through a pipe), gradients reduced on the device; the same mean
 *      check first; hashes equal after every step.
 * Exit 0 all good, 1 failures (also a GPU that is visible but cannot be used), 77 no GPU (ctest
 * SKIP_RETURN_CODE). Without NCCL in the build the nccl parts are reported as skipped and the
 * shm part still runs.
 * Run on the GPU machine: ctest --test-dir build -L gpu -R dp_nccl --output-on-failure
 * or directly: build/tests/gpu/test_dp_nccl [steps]
 */
#include "check.h"
#include "collective.h"
#include "dflash_dp.h"
#include "dflash_model.h"
#include "dflash_train.h"
#include "err.h"
#include "monotime.h"
#include "ops.h"
#include "ops_cuda.h"
#include "rng.h"
#include "safetensors.h"
#include "test_ranks.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { D = 128, NF = 2, V = 512, MAXT = 256, MAXB = 64, MAXSTEP = 32 };
static int n_steps = 6;

typedef struct shared {
    uint64_t hash[4][MAXSTEP], ghash[4][MAXSTEP], mhash[4][MAXSTEP];
    double loss[4][MAXSTEP], gnorm[4][MAXSTEP], lr[4][MAXSTEP];
    uint64_t synced[4];
    uint8_t id[DP_COMM_ID_BYTES];
} shared;
static shared *S;

static double unif(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0 * 2 - 1; }

/* ---------------------------------------------------------------------------------------------
 * a small drafter on one GPU */

typedef struct gworld {
    const nn_ops *ops;
    nn_ctx *ctx;
    dflash_config cfg;
    nn_buf *embed, *lm_head, *hidden;
    dflash_train_cfg tc;
} gworld;

static int gworld_init(gworld *w, int device) {
    memset(w, 0, sizeof *w);
    w->ops = nn_cuda_ops();
    w->ctx = nn_cuda_new(device);
    if (!w->ctx) return -1;
    w->cfg = (dflash_config){.hidden_size = D, .num_layers = 2, .num_heads = 2,
                             .num_kv_heads = 1, .head_dim = 64, .intermediate_size = 256,
                             .block_size = 8, .n_feat = NF, .target_layer_ids = {1, 3},
                             .num_target_layers = 6, .mask_token_id = V - 1, .vocab_size = V,
                             .max_position_embeddings = 4096, .rms_norm_eps = 1e-6,
                             .rope_theta = 1e6, .bos_token_id = -1, .eos_token_id = -1};
    size_t ne = (size_t)V * D;
    float *h = malloc(ne * sizeof(float));
    uint64_t s = 42;
    w->embed = w->ops->alloc(w->ctx, ne * w->ops->act_bytes);
    w->lm_head = w->ops->alloc(w->ctx, ne * w->ops->act_bytes);
    w->hidden = w->ops->alloc(w->ctx, (size_t)MAXT * NF * D * w->ops->act_bytes);
    for (size_t i = 0; i < ne; i++)
        h[i] = (float)unif(&s);
    w->ops->upload(w->ctx, w->embed, h, ne);
    for (size_t i = 0; i < ne; i++)
        h[i] = (float)(0.15 * unif(&s));
    w->ops->upload(w->ctx, w->lm_head, h, ne);
    free(h);
    dflash_train_cfg_default(&w->tc);
    w->tc.n_anchors = 8;
    w->tc.lr = 3e-3;
    if (getenv("DP_TEST_CLIP")) w->tc.clip = atof(getenv("DP_TEST_CLIP"));
    return w->embed && w->lm_head && w->hidden ? 0 : -1;
}

static void gworld_free(gworld *w) {
    w->ops->free(w->ctx, w->embed);
    w->ops->free(w->ctx, w->lm_head);
    w->ops->free(w->ctx, w->hidden);
    nn_cuda_destroy(&w->ctx);
}

typedef struct gbatch {
    int32_t seq_off[4], ids[MAXT];
    uint8_t mask[MAXT];
    dflash_batch_view view;
} gbatch;

/* The batch of (rank, step): 2-3 sequences of 40-80 tokens, hidden states uploaded to w->hidden. */
static void make_batch(gworld *w, gbatch *b, int rank, int step) {
    uint64_t s = 1000003ull * (uint64_t)(rank + 1) + (uint64_t)step * 7919u;
    int n = 2 + (int)(rng_next(&s) % 2), t = 0;
    b->seq_off[0] = 0;
    for (int q = 0; q < n; q++) {
        int len = 40 + (int)(rng_next(&s) % 41), prompt = 5 + (int)(rng_next(&s) % 10);
        for (int i = 0; i < len; i++, t++) {
            b->ids[t] = (int32_t)(rng_next(&s) % (V - 1));
            b->mask[t] = i >= prompt && rng_next(&s) % 13 != 0;
        }
        b->seq_off[q + 1] = t;
    }
    float *h = malloc((size_t)t * NF * D * sizeof(float));
    for (int i = 0; i < t * NF * D; i++)
        h[i] = (float)unif(&s);
    w->ops->upload(w->ctx, w->hidden, h, (size_t)t * NF * D);
    free(h);
    b->view = (dflash_batch_view){.n_seqs = n, .seq_off = b->seq_off, .ids = b->ids,
                                  .positions = NULL, .loss_mask = b->mask, .hidden = w->hidden,
                                  .ld = NF * D};
}

/* FNV-1a of n bytes of device memory (diagnostics: which array differs first). */
static uint64_t buf_hash(gworld *w, const void *dev, size_t n) {
    unsigned char *h = malloc(n);
    w->ops->download_raw(w->ctx, h, dev, n);
    uint64_t x = 0xcbf29ce484222325ull;
    const unsigned char *b = h;
    for (size_t i = 0; i < n; i++)
        x = (x ^ b[i]) * 0x100000001b3ull;
    free(h);
    return x;
}

/* Rank 1 of an nccl pair: rank 0's id from the pipe, waiting ID_WAIT_S at most. Rank 0 writes it
 * once its world and model are made (seconds); a rank 0 that failed first has exited, which
 * closes the pipe (rank 1 closed its own write end: EOF, said at once), and one that hangs is
 * given up on after the wait, well within the child's alarm(240) and gpu-check's 180 s. */
#define ID_WAIT_S 90
static bool read_id(int pipe_rd, uint8_t id[DP_COMM_ID_BYTES]) {
    struct pollfd pf = {.fd = pipe_rd, .events = POLLIN};
    size_t got = 0;
    double end = monotime_s() + ID_WAIT_S;
    while (got < DP_COMM_ID_BYTES) {
        int left_ms = (int)((end - monotime_s()) * 1000);
        if (left_ms <= 0 || poll(&pf, 1, left_ms) == 0) {
            fprintf(stderr, "rank 1: no nccl id from rank 0 within %d s (rank 0 hangs?)\n",
                    ID_WAIT_S);
            return false;
        }
        ssize_t n = read(pipe_rd, id + got, DP_COMM_ID_BYTES - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            fprintf(stderr, "rank 1: rank 0 ended before it sent the nccl id (its errors above)\n");
            return false;
        }
        got += (size_t)n;
    }
    return true;
}

/* dp_host_io over the world's ops (the shm backend reduces on the host), as dflash_dp.c's over
 * a model's */
static void io_down(void *ctx, void *host_dst, const void *src, size_t bytes) {
    gworld *w = ctx;
    w->ops->download_raw(w->ctx, host_dst, src, bytes);
}
static void io_up(void *ctx, void *dst, const void *host_src, size_t bytes) {
    gworld *w = ctx;
    w->ops->upload_raw(w->ctx, dst, host_src, bytes);
    w->ops->sync(w->ctx); /* the shm region is rewritten by the peers as soon as we return */
}

/* Rank r's value i of the reduction check: fp32 values of every magnitude, and bf16 values
 * (integers) whose halves' sum is exact in bf16, so any order of the two terms gives one result. */
static float red_f32(int r, int i) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(r * 1000003 + i + 1);
    return (float)(unif(&s) * ldexp(1.0, (int)(rng_next(&s) % 40) - 20));
}
static float red_bf16(int r, int i) { return r == 0 ? (float)(i % 64) : (float)(2 * (i % 31) - 7); }

/* The values a pre-scaled (0.5: the mean) allreduce of fp32 and bf16 device buffers gives every
 * rank, checked against the mean of both ranks' values computed here: each rank's check fails
 * on a reduction that returns zeros, its own values, or its peer's alone (the training below
 * checks that both ranks agree, which those would pass). */
static void check_reduction(gworld *w, dp_comm *c, dp_comm_kind kind, int rank) {
    enum { N = 1 << 16 };
    float *h = malloc(N * sizeof(float));
    uint16_t *hb = malloc(N * sizeof(uint16_t));
    void *dev = w->ops->alloc(w->ctx, N * sizeof(float));
    dp_host_io io = {.to_host = io_down, .from_host = io_up, .ctx = w};
    const dp_host_io *iop = kind == DP_COMM_SHM ? &io : NULL;
    void *st = nn_cuda_stream(w->ctx);
    for (int i = 0; i < N; i++)
        h[i] = red_f32(rank, i);
    w->ops->upload_raw(w->ctx, dev, h, N * sizeof(float));
    CHECK_EQ_INT(dp_comm_allreduce_scaled_f32(c, dev, N, 0.5f, iop, st), 0);
    w->ops->download_raw(w->ctx, h, dev, N * sizeof(float));
    int bad = 0, first = -1;
    for (int i = 0; i < N; i++)
        if (h[i] != 0.5f * red_f32(0, i) + 0.5f * red_f32(1, i) && !bad++) first = i;
    CHECK_EQ_INT(bad, 0);
    if (bad)
        printf("  rank %d: fp32 mean wrong at %d of %d values, first [%d] = %.9g (want %.9g)\n",
               rank, bad, N, first, h[first], 0.5f * red_f32(0, first) + 0.5f * red_f32(1, first));
    for (int i = 0; i < N; i++)
        hb[i] = safetensors_f32_to_bf16(red_bf16(rank, i));
    w->ops->upload_raw(w->ctx, dev, hb, N * sizeof(uint16_t));
    CHECK_EQ_INT(dp_comm_allreduce_scaled_bf16(c, dev, N, 0.5f, iop, st), 0);
    w->ops->download_raw(w->ctx, hb, dev, N * sizeof(uint16_t));
    int bad16 = 0;
    for (int i = 0; i < N; i++)
        bad16 += safetensors_bf16_to_f32(hb[i]) != 0.5f * (red_bf16(0, i) + red_bf16(1, i));
    CHECK_EQ_INT(bad16, 0);
    printf("rank %d: allreduce of %d fp32 and %d bf16 values = the ranks' mean: %s\n", rank, N, N,
           bad || bad16 ? "NO" : "yes");
    w->ops->free(w->ctx, dev);
    free(h), free(hb);
}

/* One rank: the reduction's values checked, sync from rank 0 (rank 1 starts from other
 * weights), then n_steps DP steps. */
static void train_rank(dp_comm_kind kind, int rank, int device, int pipe_rd, int pipe_wr) {
    if (kind == DP_COMM_NCCL) /* each end in one process only: rank 0's exit is rank 1's EOF */
        close(rank == 0 ? pipe_rd : pipe_wr);
    gworld w;
    if (gworld_init(&w, device)) {
        CHECK(!"cuda world");
        return;
    }
    dflash_model *m = dflash_model_new(&w.cfg, w.ops, w.ctx, w.embed, w.lm_head, MAXT, MAXB,
                                       rank == 0 ? 7 : 1234);
    CHECK(m != NULL);
    if (!m) return;
    char err[256] = "";
    if (kind == DP_COMM_NCCL) { /* rank 0 makes the id in its own process, rank 1 reads it */
        if (rank == 0) {
            CHECK_EQ_INT(dp_comm_make_id(kind, S->id, err, sizeof err), 0);
            CHECK(write(pipe_wr, S->id, DP_COMM_ID_BYTES) == DP_COMM_ID_BYTES);
        } else {
            bool got = read_id(pipe_rd, S->id);
            CHECK(got);
            if (!got) return;
        }
    }
    dp_comm *c = NULL;
    int rc = dp_comm_open(kind, S->id, rank, 2, device, 60.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return;
    }
    check_reduction(&w, c, kind, rank);
    CHECK_EQ_INT(dflash_dp_sync_state(m, NULL, c, 0), 0);
    S->synced[rank] = dflash_dp_state_hash(m);
    gbatch b;
    CHECK_EQ_INT(dflash_train_prepare(m), 0);
    long step_allocs = 0; /* memory is planned: a group step allocates nothing */
    for (int s = 0; s < n_steps; s++) {
        make_batch(&w, &b, rank, s);
        dflash_metrics met;
        long allocs0 = w.ops->allocs(w.ctx);
        rc = dflash_train_step_dp(m, &w.tc, &b.view, 0, (uint64_t)s << 8 | (uint64_t)rank, c,
                                  &met);
        step_allocs += w.ops->allocs(w.ctx) - allocs0;
        CHECK_EQ_INT(rc, 0);
        CHECK(!met.skipped);
        S->loss[rank][s] = met.loss;
        S->gnorm[rank][s] = met.grad_norm;
        S->lr[rank][s] = met.lr;
        S->hash[rank][s] = dflash_dp_state_hash(m);
        S->ghash[rank][s] = buf_hash(&w, m->grads, m->grad_bytes);
        void *mr[3];
        size_t mb[3];
        uint64_t mh = 0;
        for (int k = 0, nr = dflash_model_master_ranges(m, mr, mb); k < nr; k++)
            mh = mh * 31 + buf_hash(&w, mr[k], mb[k]);
        S->mhash[rank][s] = mh;
    }
    CHECK_EQ_INT(step_allocs, 0);
    dp_comm_close(&c);
    dflash_model_destroy(&m);
    gworld_free(&w);
}

/* ---------------------------------------------------------------------------------------------
 * the nccl primitives on one GPU */

static void nccl_world1(void) {
    gworld w;
    if (gworld_init(&w, 0)) {
        CHECK(!"cuda world");
        return;
    }
    uint8_t id[DP_COMM_ID_BYTES];
    char err[256] = "";
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_NCCL, id, err, sizeof err), 0);
    dp_comm *c = NULL;
    int rc = dp_comm_open(DP_COMM_NCCL, id, 0, 1, 0, 30.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "nccl world 1: %s\n", err);
        return;
    }
    enum { N = 100000 };
    float *h = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    float *dev = w.ops->alloc(w.ctx, N * sizeof(float));
    void *st = nn_cuda_stream(w.ctx);
    for (int i = 0; i < N; i++)
        h[i] = (float)i * 0.25f - 7.0f;
    w.ops->upload_raw(w.ctx, dev, h, N * sizeof(float));
    CHECK_EQ_INT(dp_comm_allreduce_f32(c, dev, N, st), 0);
    w.ops->download_raw(w.ctx, back, dev, N * sizeof(float));
    CHECK(memcmp(h, back, N * sizeof(float)) == 0);
    CHECK_EQ_INT(dp_comm_allreduce_scaled_f32(c, dev, N, 0.5f, NULL, st), 0);
    w.ops->download_raw(w.ctx, back, dev, N * sizeof(float));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += back[i] != h[i] * 0.5f;
    CHECK_EQ_INT(bad, 0);
    /* bf16 (a cuda model's matrix gradients): a plain sum of one rank is the identity, a
     * pre-scale by 0.5 (exact in bf16) halves every value */
    uint16_t *hb = malloc(N * sizeof(uint16_t)), *bb = malloc(N * sizeof(uint16_t));
    for (int i = 0; i < N; i++)
        hb[i] = safetensors_f32_to_bf16(h[i]);
    w.ops->upload_raw(w.ctx, dev, hb, N * sizeof(uint16_t));
    CHECK_EQ_INT(dp_comm_allreduce_scaled_bf16(c, dev, N, 1.0f, NULL, st), 0);
    w.ops->download_raw(w.ctx, bb, dev, N * sizeof(uint16_t));
    CHECK(memcmp(hb, bb, N * sizeof(uint16_t)) == 0);
    CHECK_EQ_INT(dp_comm_allreduce_scaled_bf16(c, dev, N, 0.5f, NULL, st), 0);
    w.ops->download_raw(w.ctx, bb, dev, N * sizeof(uint16_t));
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += safetensors_bf16_to_f32(bb[i]) != safetensors_bf16_to_f32(hb[i]) * 0.5f;
    CHECK_EQ_INT(bad, 0);
    free(hb), free(bb);
    double v[3] = {1.5, -2.0, 1e300};
    CHECK_EQ_INT(dp_comm_allreduce_host_f64(c, v, 3), 0);
    CHECK(v[0] == 1.5 && v[1] == -2.0 && v[2] == 1e300);
    CHECK_EQ_INT(dp_comm_broadcast(c, dev, N * sizeof(float), 0, st), 0);
    int64_t step = 77;
    CHECK_EQ_INT(dp_comm_broadcast_host(c, &step, sizeof step, 0), 0);
    CHECK_EQ_INT(step, 77);
    CHECK_EQ_INT(dp_comm_barrier(c), 0);
    dp_comm_close(&c);
    CHECK(c == NULL);
    w.ops->free(w.ctx, dev);
    free(h), free(back);
    gworld_free(&w);
    printf("nccl world 1: open, allreduce (plain, pre-scaled; f32 and bf16), host f64, "
           "broadcasts, close ok\n");

    /* a group of 2 whose rank 1 never comes: rank 0's open times out (and aborts), no hang */
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_NCCL, id, err, sizeof err), 0);
    double t0 = monotime_s();
    rc = dp_comm_open(DP_COMM_NCCL, id, 0, 2, 0, 3.0, &c, err, sizeof err);
    double dt = monotime_s() - t0;
    CHECK_EQ_INT(rc, DFLASH_ETIMEOUT);
    CHECK(c == NULL);
    CHECK(dt < 3.0 + 10.0);
    printf("nccl absent peer: open gave %s after %.2f s (timeout 3 s): %s\n", err_name(rc), dt,
           err);
}

/* ---------------------------------------------------------------------------------------------
 * processes */

typedef void (*child_fn)(int idx, int pipe_rd, int pipe_wr);

/* n children of run_children, sharing one pipe (rank 0 sends rank 1 the nccl id). */
typedef struct children {
    child_fn fn;
    int p[2];
} children;

/* Child idx of the children arg points to (test_ranks_fork's child). */
static void child_main(int idx, void *arg) {
    const children *c = arg;
    c->fn(idx, c->p[0], c->p[1]);
}

static int run_children(int n, child_fn fn) {
    children c = {.fn = fn};
    if (pipe(c.p) != 0) return n;
    pid_t pids[4];
    test_ranks_fork(n, child_main, &c, 240, pids);
    close(c.p[0]), close(c.p[1]); /* a child whose peer ended sees the pipe's end */
    return test_ranks_wait(n, pids, -1, "child");
}

/* in the probe child: the visible GPUs (at most 8), -1 when the driver or one of them cannot be
 * used (nn_cuda_device_count or nn_cuda_new logged why) */
static void probe(int idx, int rd, int wr) {
    (void)idx, (void)rd;
    int n = nn_cuda_device_count();
    if (n > 8) n = 8;
    for (int d = 0; d < n; d++) {
        nn_ctx *c = nn_cuda_new(d);
        if (!c) {
            n = -1;
            break;
        }
        nn_cuda_destroy(&c);
    }
    CHECK(write(wr, &n, sizeof n) == sizeof n);
}

/* the probe's answer; -1 also when it died before answering */
static int gpu_count(void) {
    int p[2], n = -1;
    if (pipe(p) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        probe(0, p[0], p[1]);
        _exit(0);
    }
    close(p[1]);
    if (read(p[0], &n, sizeof n) != sizeof n) n = -1;
    close(p[0]);
    waitpid(pid, NULL, 0);
    return n;
}

/* Rank idx of an nccl world of 2 with both ranks on GPU 0: NCCL refuses it at init ("Duplicate
 * GPU detected"), which dp_comm_open must answer DFLASH_ECONFIG (the drafter's exit 2), within
 * the 20 s timeout, saying one GPU per rank. */
static void shared_gpu_rank(int idx, int rd, int wr) {
    close(idx == 0 ? rd : wr);
    uint8_t id[DP_COMM_ID_BYTES];
    char err[600] = "";
    if (idx == 0) {
        CHECK_EQ_INT(dp_comm_make_id(DP_COMM_NCCL, id, err, sizeof err), 0);
        CHECK(write(wr, id, DP_COMM_ID_BYTES) == DP_COMM_ID_BYTES);
    } else if (!read_id(rd, id)) {
        CHECK(!"rank 0's id");
        return;
    }
    dp_comm *c = NULL;
    double t0 = monotime_s();
    int rc = dp_comm_open(DP_COMM_NCCL, id, idx, 2, 0, 20.0, &c, err, sizeof err);
    CHECK_EQ_INT(rc, DFLASH_ECONFIG);
    CHECK(strstr(err, "one GPU per rank") != NULL);
    CHECK(c == NULL);
    dp_comm_close(&c);
    printf("nccl world 2 on one GPU, rank %d: open gave %s after %.2f s: %s\n", idx, err_name(rc),
           monotime_s() - t0, err);
}

static void child_nccl1(int idx, int rd, int wr) { (void)idx, (void)rd, (void)wr, nccl_world1(); }
static void child_shm(int idx, int rd, int wr) { train_rank(DP_COMM_SHM, idx, 0, rd, wr); }
static void child_nccl2(int idx, int rd, int wr) { train_rank(DP_COMM_NCCL, idx, idx, rd, wr); }

static void check_ranks(const char *what) {
    int same = 0;
    for (int s = 0; s < n_steps; s++)
        same += S->hash[0][s] == S->hash[1][s] && S->loss[0][s] == S->loss[1][s];
    CHECK(S->synced[0] == S->synced[1] && S->synced[0] != 0);
    CHECK_EQ_INT(same, n_steps);
    for (int s = 0; s < n_steps; s++)
        if (S->hash[0][s] != S->hash[1][s]) {
            printf("  first differing step %d: reduced gradients %s, master weights %s, grad norm "
                   "%.9g / %.9g, lr %g / %g\n", s,
                   S->ghash[0][s] == S->ghash[1][s] ? "equal" : "differ",
                   S->mhash[0][s] == S->mhash[1][s] ? "equal" : "differ", S->gnorm[0][s],
                   S->gnorm[1][s], S->lr[0][s], S->lr[1][s]);
            for (int k = 0; k <= s; k++)
                printf("    step %d: grad norm %.9g / %.9g\n", k, S->gnorm[0][k], S->gnorm[1][k]);
            break;
        }
    printf("%s: synced, %d of %d steps with bit-identical state on both ranks, group loss %.4f -> "
           "%.4f\n", what, same, n_steps, S->loss[0][0], S->loss[0][n_steps - 1]);
}

int main(int argc, char **argv) {
    /* NVLink multicast stays off (shared machines; it buys nothing at these sizes) */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (argc > 1) n_steps = atoi(argv[1]);
    if (n_steps < 1 || n_steps > MAXSTEP) n_steps = 6;
    S = mmap(NULL, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (S == MAP_FAILED) return 1;
    int gpus = gpu_count();
    if (gpus < 0) { /* a GPU that is there but fails is a failure, not a skip */
        printf("a GPU is visible but cannot be used (why: above): FAIL\n");
        return 1;
    }
    printf("%d GPU(s) visible; NCCL in this build: %s\n", gpus, dp_comm_have_nccl() ? "yes" : "no");
    if (gpus < 1) {
        printf("no GPU: skipped\n");
        return 77;
    }
    if (dp_comm_have_nccl()) {
        CHECK_EQ_INT(run_children(1, child_nccl1), 0);
        CHECK_EQ_INT(run_children(2, shared_gpu_rank), 0);
    } else {
        printf("nccl world 1, and 2 on one GPU: skipped (no NCCL in this build)\n");
    }

    memset(S, 0, sizeof *S);
    CHECK_EQ_INT(dp_comm_make_id(DP_COMM_SHM, S->id, NULL, 0), 0);
    CHECK_EQ_INT(run_children(2, child_shm), 0);
    check_ranks("shm world 2 on GPU 0 (cuda backend)");

    if (gpus >= 2 && dp_comm_have_nccl()) {
        memset(S, 0, sizeof *S);
        CHECK_EQ_INT(run_children(2, child_nccl2), 0);
        check_ranks("nccl world 2 on GPUs 0 and 1");
    } else {
        printf("nccl world 2: skipped (%s)\n", gpus < 2 ? "needs 2 GPUs" : "no NCCL in this build");
    }
    CHECK_DONE();
}
