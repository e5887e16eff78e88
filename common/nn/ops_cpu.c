/* ops_cpu: the cpu backend of the ops interface (ops.h). fp32 everywhere; the reference every
 * other backend is checked against.
 *
 * Memory: an nn_buf is a plain float array in host memory (64-byte aligned, zeroed by alloc);
 * upload/download/copy are memcpy. Linear layers and the chunked lm_head use OpenBLAS
 * cblas_sgemm; everything else is plain C loops written for clarity first.
 *
 * Threads: ops run synchronously on the caller's thread. nn_cpu_new(threads) sets OpenBLAS's
 * thread count (the process's first context also ends the workers beyond it that OpenBLAS
 * started at load) and keeps `threads` for our own loops: the attention ops split their tiles
 * (or, in the block-attention backward, their kv heads, so that dk/dv rows have one writer) and
 * the loss its rows over short-lived pthreads that grab work from an atomic counter. No op
 * allocates: attention is flash style (tiles of ATT_ROWS query rows x ATT_KEYS keys, sgemm for
 * the scores and the products, an online softmax whose scores live on the stack), so no [T,T] or
 * [Tk] score buffer exists; the lm_head logits live in the caller's scratch. Results do not depend
 * on our thread count (bit for bit): every tile and row is computed the same way whoever computes
 * it, and sums over rows are taken in row order.
 *
 * Speed: OpenBLAS 0.3.21 runs its slow generic kernels on cpus it does not know (recent Xeons);
 * nn_cpu_new warns when that happens; OPENBLAS_CORETYPE=Haswell in the environment fixes it.
 *
 * Choices where ops.h leaves room (the cuda backend should match them):
 *   - attention_block_fwd: a query row with no visible key (keep == 0 or an empty key set) gets
 *     out = 0 and lse = +INFINITY (so exp(s - lse) = 0 in any backward, as in FlashAttention-2).
 *     If a block's context range overlaps its own block range the union is used (each key once).
 *   - lm_head_xent: weights <= 0 count as 0 (no loss, no weight_sum, dh = 0). correct[] is written
 *     for every row, whatever its weight; dh may be NULL (loss and metrics only).
 *   - linear_bwd: dw may be NULL as well (frozen weight: only dx wanted).
 *   - rmsnorm_bwd: rstd may be NULL (recomputed from x; eps is then unknown, so the saved rstd is
 *     what callers should pass; NULL uses eps = 1e-6).
 *   - RoPE (rope_table): the angle is formed in fp32 as (float)pos * inv_freq[i] (as Hugging
 *     Face does), its cos/sin evaluated in double and rounded to float.
 */
#include "ops.h"

#include "log.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct nn_ctx {
    int threads; /* our own worker count for attention loops, >= 1 */
};

/* ------------------------------------------------------------------------------------------ */
/* parallel loop: fn(arg, begin, end) over [0, n) in chunks of `grain`, on up to c->threads
 * threads (the caller is one of them). Threads are created per call (tens of microseconds), so
 * a loop whose estimated work is below CPU_PAR_MIN_FLOPS runs on the caller alone. */

typedef void (*cpu_range_fn)(void *arg, int begin, int end);

typedef struct cpu_par {
    cpu_range_fn fn;
    void *arg;
    int n, grain;
    atomic_int next;
} cpu_par;

static void *cpu_par_worker(void *p_) {
    cpu_par *p = p_;
    for (;;) {
        int b = atomic_fetch_add(&p->next, p->grain);
        if (b >= p->n) break;
        int e = b + p->grain < p->n ? b + p->grain : p->n;
        p->fn(p->arg, b, e);
    }
    return NULL;
}

#define CPU_MAX_THREADS 64
#define CPU_PAR_MIN_FLOPS 4e6

static void cpu_parallel_for(nn_ctx *c, int n, int grain, double flops, cpu_range_fn fn,
                             void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = c && flops >= CPU_PAR_MIN_FLOPS ? c->threads : 1;
    int chunks = (n + grain - 1) / grain;
    if (nt > chunks) nt = chunks;
    if (nt > CPU_MAX_THREADS) nt = CPU_MAX_THREADS;
    if (nt <= 1) {
        fn(arg, 0, n);
        return;
    }
    cpu_par p = {.fn = fn, .arg = arg, .n = n, .grain = grain};
    atomic_init(&p.next, 0);
    pthread_t tid[CPU_MAX_THREADS];
    int started = 0;
    for (int i = 0; i < nt - 1; i++) {
        if (pthread_create(&tid[started], NULL, cpu_par_worker, &p) != 0) break;
        started++;
    }
    cpu_par_worker(&p); /* the caller works too; it finishes everything if no thread started */
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* memory */

static atomic_long cpu_allocs_so_far; /* ops.h allocs */

static void *cpu_alloc(nn_ctx *c, size_t bytes) {
    (void)c;
    atomic_fetch_add(&cpu_allocs_so_far, 1);
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0) n = 64;
    void *p = aligned_alloc(64, n);
    if (p) memset(p, 0, n);
    return p;
}

static void cpu_free(nn_ctx *c, void *p) {
    (void)c;
    free(p);
}

static void cpu_upload(nn_ctx *c, nn_buf *dst, const float *src, size_t n) {
    (void)c;
    if (n && dst != src) memcpy(dst, src, n * sizeof(float));
}

static void cpu_download(nn_ctx *c, float *dst, const nn_buf *src, size_t n) {
    (void)c;
    if (n && dst != src) memcpy(dst, src, n * sizeof(float));
}

static void cpu_memcpy(nn_ctx *c, void *dst, const void *src, size_t bytes) {
    (void)c;
    if (bytes && dst != src) memmove(dst, src, bytes);
}

static void cpu_zero(nn_ctx *c, void *p, size_t bytes) {
    (void)c;
    if (bytes) memset(p, 0, bytes);
}

static void cpu_sync(nn_ctx *c) {
    (void)c;
}

/* The cpu backend runs every op to completion on the caller's thread: there is no stream, host
 * memory is plain memory and a fence has nothing to wait for. */
static void *cpu_stream(nn_ctx *c) {
    (void)c;
    return NULL;
}

static void cpu_fence(nn_ctx *c, int k) {
    (void)c;
    assert(k >= 0 && k < NN_FENCES);
}

static long cpu_stream_drains(nn_ctx *c) {
    (void)c;
    return 0;
}

static long cpu_allocs(nn_ctx *c) {
    (void)c;
    return atomic_load(&cpu_allocs_so_far);
}

static void cpu_order_after(nn_ctx *c, void *stream) {
    (void)c;
    (void)stream;
}

/* No side stream: side work runs in order with the rest. */
static void cpu_side(nn_ctx *c) {
    (void)c;
}

static void cpu_side_mark(nn_ctx *c, int k) {
    (void)c;
    assert(k >= 0 && k < NN_SIDE_MARKS);
}

static void cpu_side_wait(nn_ctx *c, int k) { /* k < 0: everything */
    (void)c;
    assert(k < NN_SIDE_MARKS);
}

/* ------------------------------------------------------------------------------------------ */
/* embedding: out[T,D] = table[ids[t], :] (no backward: the embedding is frozen) */

static void cpu_embedding_fwd(nn_ctx *c, nn_buf *out_, const int32_t *ids, const nn_buf *table_,
                              int T, int D) {
    (void)c;
    float *out = out_;
    const float *table = table_;
    for (int t = 0; t < T; t++) {
        assert(ids[t] >= 0);
        memcpy(out + (size_t)t * D, table + (size_t)ids[t] * D, (size_t)D * sizeof(float));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* rmsnorm: out[R,C] = x * rstd[r] * w[C], rstd[r] = 1 / sqrt(mean_c(x^2) + eps) */

/* 1 / rms of a row, in double as the reference */
static float row_rstd(const float *x, int C, float eps) {
    double ss = 0.0;
    for (int i = 0; i < C; i++)
        ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / C + (double)eps));
}

static void cpu_rmsnorm_fwd(nn_ctx *c, nn_buf *out_, float *rstd, const nn_buf *x_,
                            const nn_buf *w_, int R, int C, float eps) {
    (void)c;
    float *out = out_;
    const float *x = x_, *w = w_;
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * C;
        float *orow = out + (size_t)r * C;
        float rs = row_rstd(xr, C, eps);
        if (rstd) rstd[r] = rs;
        for (int i = 0; i < C; i++)
            orow[i] = (xr[i] * rs) * w[i];
    }
}

/* dx[R,C] = rstd * (dy*w - xhat * mean_c(dy*w*xhat)), xhat = x*rstd; dw[C] += sum_r dy*xhat.
 * dx may equal dy: each element of dy is read before the same element of dx is written. */
static void cpu_rmsnorm_bwd(nn_ctx *c, nn_buf *dx_, float *dw, const nn_buf *dy_, const nn_buf *x_,
                            const nn_buf *w_, const float *rstd, int R, int C,
                            const nn_buf *dres_) {
    (void)c;
    float *dx = dx_;
    const float *dy = dy_, *x = x_, *w = w_, *dres = dres_;
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * C, *dyr = dy + (size_t)r * C;
        const float *dr = dres ? dres + (size_t)r * C : NULL;
        float *dxr = dx + (size_t)r * C;
        float rs;
        if (rstd)
            rs = rstd[r];
        else {
            double ss = 0.0;
            for (int i = 0; i < C; i++)
                ss += (double)xr[i] * xr[i];
            rs = (float)(1.0 / sqrt(ss / C + 1e-6));
        }
        double dot = 0.0; /* sum_c dy*w*xhat */
        for (int i = 0; i < C; i++) {
            float xhat = xr[i] * rs;
            dot += (double)dyr[i] * w[i] * xhat;
            if (dw) dw[i] += dyr[i] * xhat;
        }
        float mean = (float)(dot / C);
        for (int i = 0; i < C; i++)
            dxr[i] = rs * (dyr[i] * w[i] - xr[i] * rs * mean) + (dr ? dr[i] : 0.0f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* linear: y[M,N] = x[M,K] . w[N,K]^T (+ b[N]) */

static void cpu_linear_fwd(nn_ctx *c, nn_buf *y_, const nn_buf *x_, const nn_buf *w_,
                           const nn_buf *b_, int M, int K, int N) {
    (void)c;
    float *y = y_;
    const float *x = x_, *w = w_, *b = b_;
    if (M <= 0 || N <= 0) return;
    float beta = 0.0f;
    if (b) {
        for (int m = 0; m < M; m++)
            memcpy(y + (size_t)m * N, b, (size_t)N * sizeof(float));
        beta = 1.0f;
    }
    if (K <= 0) {
        if (!b) memset(y, 0, (size_t)M * N * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, beta, y, N);
}

static void cpu_linear_fwd_res(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w,
                               const nn_buf *res, int M, int K, int N) {
    (void)c;
    if (M <= 0 || N <= 0) return;
    if (res != y) memcpy(y, res, (size_t)M * N * sizeof(float));
    if (K <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 1.0f, y, N);
}

/* dx[M,K] (=|+=) dy[M,N] . w[N,K]; dw[N,K] (+=|=) dy^T . x[M,K]; db[N] += sum_m dy */
static void cpu_linear_bwd(nn_ctx *c, nn_buf *dx_, nn_buf *dw_, float *db, const nn_buf *dy_,
                           const nn_buf *x_, const nn_buf *w_, int M, int K, int N, int mode) {
    (void)c;
    float *dx = dx_, *dw = dw_;
    const float *dy = dy_, *x = x_, *w = w_;
    float beta = mode & NN_BWD_DX_ADD ? 1.0f : 0.0f, dw_beta = mode & NN_BWD_DW_SET ? 0.0f : 1.0f;
    if (K <= 0) return;
    if (M <= 0) {
        if (dw && N > 0 && dw_beta == 0.0f) memset(dw, 0, (size_t)N * K * sizeof(float));
        return;
    }
    if (N <= 0) {
        if (dx && beta == 0.0f) memset(dx, 0, (size_t)M * K * sizeof(float));
        return;
    }
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy, N, w, K, beta, dx,
                    K);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dy, N, x, K, dw_beta,
                    dw, K);
    if (db)
        for (int m = 0; m < M; m++) {
            const float *r = dy + (size_t)m * N;
            for (int n = 0; n < N; n++)
                db[n] += r[n];
        }
}

/* ------------------------------------------------------------------------------------------ */
/* rope: the table rot[T, d] (ops.h: per token cos | sin of a = pos[t] * inv_freq[i], i < d/2),
 * then the rotation in place on x[T, nh, d] (token stride ld) by its rows:
 *   fwd: (x_i, x_{i+d/2}) <- (x_i cos a - x_{i+d/2} sin a, x_{i+d/2} cos a + x_i sin a)
 *   bwd: the same with -a (the transpose, which is also the inverse). */

static void cpu_rope_table(nn_ctx *c, float *rot, const int32_t *pos, const float *inv_freq,
                           int T, int d) {
    (void)c;
    assert(d % 2 == 0);
    int half = d / 2;
    for (int t = 0; t < T; t++) {
        float p = (float)pos[t], *r = rot + (size_t)t * d;
        for (int i = 0; i < half; i++) {
            float a = p * inv_freq[i];
            r[i] = (float)cos((double)a), r[half + i] = (float)sin((double)a);
        }
    }
}

static void rope_rotate(float *x, const float *rot, int T, int nh, int d, int ld, float sign) {
    int half = d / 2;
    for (int t = 0; t < T; t++) {
        float *xt = x + (size_t)t * ld;
        const float *r = rot + (size_t)t * d;
        for (int i = 0; i < half; i++) {
            float cs = r[i], sn = sign * r[half + i];
            for (int h = 0; h < nh; h++) {
                float *xh = xt + (size_t)h * d;
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * cs - x2 * sn;
                xh[i + half] = x2 * cs + x1 * sn;
            }
        }
    }
}

/* head_norm_rope: rmsnorm_fwd over the head rows, then the rotation; backward: the rotation by
 * -angle of dy into dx, then rmsnorm_bwd row by row in place with the forward's rstd */
static void cpu_head_norm_rope_fwd(nn_ctx *c, nn_buf *out, const nn_buf *x, const nn_buf *w,
                                   const float *rot, int T, int nh, int d, float eps) {
    assert(d % 2 == 0);
    cpu_rmsnorm_fwd(c, out, NULL, x, w, T * nh, d, eps);
    rope_rotate(out, rot, T, nh, d, nh * d, 1.0f);
}

static void cpu_head_norm_rope_bwd(nn_ctx *c, nn_buf *dx_, float *dw, const nn_buf *dy,
                                   const nn_buf *x_, const nn_buf *w, const float *rot, int T,
                                   int nh, int d, float eps) {
    assert(d % 2 == 0);
    float *dx = dx_;
    const float *x = x_;
    size_t rows = (size_t)T * nh;
    if (dx != dy) memcpy(dx, dy, rows * d * sizeof(float));
    rope_rotate(dx, rot, T, nh, d, nh * d, -1.0f);
    for (size_t r = 0; r < rows; r++) {
        float rs = row_rstd(x + r * d, d, eps);
        cpu_rmsnorm_bwd(c, dx + r * d, dw, dx + r * d, x + r * d, w, &rs, 1, d, NULL);
    }
}

/* qkv[T, (H + 2 Hk) d] -> q, k (head_norm_rope_fwd, or the rotation alone), v */
static void cpu_qkv_norm_rope_fwd(nn_ctx *c, nn_buf *q_, nn_buf *k_, nn_buf *v_,
                                  const nn_buf *qkv_, const nn_buf *qn, const nn_buf *kn,
                                  const float *rot, int T, int H, int Hk, int d, float eps) {
    float *q = q_, *k = k_, *v = v_;
    const float *qkv = qkv_;
    size_t qd = (size_t)H * d, kd = (size_t)Hk * d;
    for (int t = 0; t < T; t++) {
        const float *src = qkv + (size_t)t * (qd + 2 * kd);
        memcpy(q + t * qd, src, qd * sizeof(float));
        memcpy(k + t * kd, src + qd, kd * sizeof(float));
        memcpy(v + t * kd, src + qd + kd, kd * sizeof(float));
    }
    if (qn) {
        cpu_head_norm_rope_fwd(c, q, q, qn, rot, T, H, d, eps);
        cpu_head_norm_rope_fwd(c, k, k, kn, rot, T, Hk, d, eps);
    } else {
        rope_rotate(q, rot, T, H, d, H * d, 1.0f);
        rope_rotate(k, rot, T, Hk, d, Hk * d, 1.0f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* swiglu: out[R,F] = silu(g) * u, silu(g) = g * sigmoid(g);
 * dgate = dout * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))), dup = dout * silu(g) */

static void cpu_swiglu_fwd(nn_ctx *c, nn_buf *out_, const nn_buf *gu_, int R, int F) {
    (void)c;
    float *out = out_;
    const float *gu = gu_;
    for (size_t r = 0; r < (size_t)R; r++) {
        const float *g = gu + r * 2 * F, *u = g + F;
        float *o = out + r * F;
        for (int i = 0; i < F; i++) {
            float s = 1.0f / (1.0f + expf(-g[i]));
            o[i] = g[i] * s * u[i];
        }
    }
}

static void cpu_swiglu_bwd(nn_ctx *c, nn_buf *dgu_, const nn_buf *dout_, const nn_buf *gu_, int R,
                           int F) {
    (void)c;
    float *dgu = dgu_;
    const float *dout = dout_, *gu = gu_;
    for (size_t r = 0; r < (size_t)R; r++) {
        const float *g = gu + r * 2 * F, *u = g + F, *dy = dout + r * F;
        float *dg = dgu + r * 2 * F, *du = dg + F;
        for (int i = 0; i < F; i++) {
            float gi = g[i], ui = u[i];
            float s = 1.0f / (1.0f + expf(-gi));
            float silu = gi * s;
            dg[i] = dy[i] * ui * s * (1.0f + gi * (1.0f - s));
            du[i] = dy[i] * silu;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* 8 independent partial sums so the compiler can vectorise without reassociating */
static inline float dotf(const float *a, const float *b, int d) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= d; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < d; i++)
        s += a[i] * b[i];
    return s;
}

/* attention, flash style. A tile of up to ATT_ROWS query rows of one head that see the same keys
 * (the rows of one DFlash block, or neighbouring rows of one sequence under the causal mask)
 * streams over tiles of up to ATT_KEYS keys of its kv head, which lie in up to two ranges
 * [r0,r1) ∪ [r2,r3):
 *   S[R,n] = q . k^T * scale                     (sgemm; causal: keys after the row -> -inf)
 *   per row: running max m and sum l; the output rescaled by exp(m_old - m_new) when m grows
 *   P = exp(S - m), l += rowsum(P), o[R,d] += P . v  (sgemm)
 *   finally o /= l, lse = m + log l (+INFINITY and o = 0 for a row that saw no key).
 * Scores live in a stack tile, so no [T,T] or [Tk] buffer exists. Tiles are small enough
 * (R*n*d <= 262144 for d <= 256) that OpenBLAS runs each sgemm on the calling thread, so the
 * result does not depend on the thread count. */

#define ATT_ROWS 16
#define ATT_KEYS 64

/* rows per tile: ATT_ROWS, fewer for d > 256 so that R * ATT_KEYS * d stays <= 262144, below
 * which OpenBLAS 0.3 runs an sgemm single-threaded on the caller */
static int att_rows(int d) {
    int r = 262144 / (ATT_KEYS * (d > 0 ? d : 1));
    return r < 1 ? 1 : r > ATT_ROWS ? ATT_ROWS : r;
}

typedef struct att_tile {
    const float *q;     /* row 0 of the tile, this head; row stride ldq */
    float *o;           /* same layout as q, stride ldo */
    float *lse;         /* lse of row 0, consecutive rows 1 apart (may be NULL) */
    const float *k, *v; /* key row 0 of this kv head; row stride ldk */
    size_t ldq, ldo, ldk;
    int R, d;
    int32_t ranges[4];
    int n_ranges;
    int causal_row0; /* >= 0: key t is visible to row i only if t <= causal_row0 + i */
} att_tile;

static void attend_tile(const att_tile *a, float scale) {
    int R = a->R, d = a->d;
    float m[ATT_ROWS], l[ATT_ROWS], S[ATT_ROWS * ATT_KEYS];
    for (int i = 0; i < R; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
        memset(a->o + i * a->ldo, 0, (size_t)d * sizeof(float));
    }
    for (int r = 0; r < a->n_ranges; r++) {
        int end = a->ranges[2 * r + 1];
        for (int kb = a->ranges[2 * r]; kb < end; kb += ATT_KEYS) {
            int n = end - kb < ATT_KEYS ? end - kb : ATT_KEYS;
            if (a->causal_row0 >= 0 && kb > a->causal_row0 + R - 1) break; /* all after */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, n, d, scale, a->q, a->ldq,
                        a->k + (size_t)kb * a->ldk, a->ldk, 0.0f, S, n);
            for (int i = 0; i < R; i++) {
                float *s = S + i * n;
                if (a->causal_row0 >= 0) { /* keys after this row's own position */
                    int first = a->causal_row0 + i - kb + 1;
                    for (int j = first > 0 ? first : 0; j < n; j++)
                        s[j] = -INFINITY;
                }
                float tmax = -INFINITY;
                for (int j = 0; j < n; j++)
                    tmax = s[j] > tmax ? s[j] : tmax;
                if (tmax == -INFINITY) { /* nothing visible in this tile */
                    memset(s, 0, (size_t)n * sizeof(float));
                    continue;
                }
                if (tmax > m[i]) {
                    float corr = expf(m[i] - tmax); /* 0 when m = -inf */
                    l[i] *= corr;
                    float *oi = a->o + i * a->ldo;
                    for (int x = 0; x < d; x++)
                        oi[x] *= corr;
                    m[i] = tmax;
                }
                float sum = 0.0f;
                for (int j = 0; j < n; j++) {
                    s[j] = expf(s[j] - m[i]);
                    sum += s[j];
                }
                l[i] += sum;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, d, n, 1.0f, S, n,
                        a->v + (size_t)kb * a->ldk, a->ldk, 1.0f, a->o, a->ldo);
        }
    }
    for (int i = 0; i < R; i++) {
        float *oi = a->o + i * a->ldo;
        float lse = INFINITY;
        if (l[i] > 0.0f) {
            float inv = 1.0f / l[i];
            for (int x = 0; x < d; x++)
                oi[x] *= inv;
            lse = m[i] + logf(l[i]);
        } else
            memset(oi, 0, (size_t)d * sizeof(float));
        if (a->lse) a->lse[i] = lse;
    }
}

/* ---- causal: row t of sequence s sees keys [seq_off[s], t] ---- */

typedef struct causal_job {
    float *out;
    const float *q, *k, *v;
    const int32_t *seq_off;
    int n_seqs, t0, t1, rows, n_tiles, H, Hk, d;
} causal_job;

/* index of the last s with seq_off[s] <= t (binary search; seq_off is non-decreasing) */
static int seq_of(const int32_t *seq_off, int n_seqs, int t) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seq_off[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void causal_tiles(void *arg, int begin, int end) {
    const causal_job *j = arg;
    int H = j->H, d = j->d, group = j->H / j->Hk;
    float scale = 1.0f / sqrtf((float)d);
    for (int it = begin; it < end; it++) { /* head-major: neighbours share their kv rows */
        int h = it / j->n_tiles, a = j->t0 + (it % j->n_tiles) * j->rows;
        int b = a + j->rows < j->t1 ? a + j->rows : j->t1;
        while (a < b) { /* split the tile where a sequence ends */
            int s = seq_of(j->seq_off, j->n_seqs, a);
            int e = j->seq_off[s + 1] < b ? j->seq_off[s + 1] : b;
            size_t hk_off = (size_t)(h / group) * d;
            att_tile t = {.q = j->q + ((size_t)a * H + h) * d,
                          .o = j->out + ((size_t)a * H + h) * d,
                          .k = j->k + hk_off,
                          .v = j->v + hk_off,
                          .ldq = (size_t)H * d,
                          .ldo = (size_t)H * d,
                          .ldk = (size_t)j->Hk * d,
                          .R = e - a,
                          .d = d,
                          .ranges = {j->seq_off[s], e},
                          .n_ranges = 1,
                          .causal_row0 = a};
            attend_tile(&t, scale);
            a = e;
        }
    }
}

/* q[T,H,d], k,v[T,Hk,d] -> out[T,H,d]. Tokens outside [seq_off[0], seq_off[n_seqs]) get 0. */
static void cpu_attention_causal_fwd(nn_ctx *c, nn_buf *out, const nn_buf *q, const nn_buf *k,
                                     const nn_buf *v, const int32_t *seq_off, int n_seqs, int T,
                                     int H, int Hk, int d) {
    assert(Hk > 0 && H % Hk == 0);
    if (T <= 0) return;
    if (n_seqs <= 0) {
        memset(out, 0, (size_t)T * H * d * sizeof(float));
        return;
    }
    int t0 = seq_off[0], t1 = seq_off[n_seqs];
    assert(t0 >= 0 && t1 <= T && t0 <= t1);
    size_t row = (size_t)H * d;
    if (t0 > 0) memset(out, 0, (size_t)t0 * row * sizeof(float));
    if (t1 < T) memset((float *)out + (size_t)t1 * row, 0, (size_t)(T - t1) * row * sizeof(float));
    int rows = att_rows(d), n_tiles = (t1 - t0 + rows - 1) / rows;
    causal_job job = {.out = out,
                      .q = q,
                      .k = k,
                      .v = v,
                      .seq_off = seq_off,
                      .n_seqs = n_seqs,
                      .t0 = t0,
                      .t1 = t1,
                      .rows = rows,
                      .n_tiles = n_tiles,
                      .H = H,
                      .Hk = Hk,
                      .d = d};
    double flops = 0.0; /* QK^T and PV over the causal triangles */
    for (int s = 0; s < n_seqs; s++) {
        double L = seq_off[s + 1] - seq_off[s];
        flops += 2.0 * L * (L + rows) * H * d;
    }
    cpu_parallel_for(c, n_tiles * H, 1, flops, causal_tiles, &job);
}

/* ---- DFlash block attention: block j's rows see [ctx_begin, ctx_end) ∪ [blk, blk + B) ---- */

/* The key ranges of one span as up to two disjoint ascending [begin, end) pairs; returns how
 * many (0 for keep == 0 or no key). */
static int block_key_ranges(const nn_block_span *sp, int B, int Tk, int32_t r[4]) {
    if (!sp->keep) return 0;
    int32_t c0 = sp->ctx_begin, c1 = sp->ctx_end, b0 = sp->blk_begin, b1 = sp->blk_begin + B;
    assert(b0 >= 0 && b1 <= Tk && (c1 <= c0 || (c0 >= 0 && c1 <= Tk)));
    (void)Tk;
    if (c1 <= c0) { /* no context */
        r[0] = b0, r[1] = b1;
        return B > 0 ? 1 : 0;
    }
    if (B <= 0) {
        r[0] = c0, r[1] = c1;
        return 1;
    }
    if (c1 < b0 || b1 < c0) { /* disjoint */
        if (c0 < b0)
            r[0] = c0, r[1] = c1, r[2] = b0, r[3] = b1;
        else
            r[0] = b0, r[1] = b1, r[2] = c0, r[3] = c1;
        return 2;
    }
    r[0] = c0 < b0 ? c0 : b0; /* overlapping or touching: one merged range */
    r[1] = c1 > b1 ? c1 : b1;
    return 1;
}

/* Keys visible to one query row, summed over the blocks (the work estimate of the block
 * attention ops). */
static double block_visible_keys(const nn_block_span *spans, int n_blocks, int B, int Tk) {
    double keys = 0.0;
    for (int j = 0; j < n_blocks; j++) {
        int32_t r[4];
        int nr = block_key_ranges(&spans[j], B, Tk, r);
        for (int i = 0; i < nr; i++)
            keys += r[2 * i + 1] - r[2 * i];
    }
    return keys;
}

typedef struct block_job {
    float *out, *lse;
    const float *q, *k, *v;
    /* backward only */
    float *dq, *dk, *dv;
    const float *dout, *fout, *flse;
    const nn_block_span *spans;
    int n_blocks, B, rows, row_tiles, Tk, H, Hk, d;
} block_job;

static void block_fwd_tiles(void *arg, int begin, int end) {
    const block_job *j = arg;
    int H = j->H, d = j->d, B = j->B, Q = j->n_blocks * j->B, group = j->H / j->Hk;
    int per_head = j->n_blocks * j->row_tiles;
    float scale = 1.0f / sqrtf((float)d);
    for (int it = begin; it < end; it++) { /* head-major, then block, then row tile */
        int h = it / per_head, blk = it % per_head / j->row_tiles, rt = it % j->row_tiles;
        int a = blk * B + rt * j->rows;
        int R = B - rt * j->rows < j->rows ? B - rt * j->rows : j->rows;
        size_t hk_off = (size_t)(h / group) * d;
        att_tile t = {.q = j->q + ((size_t)a * H + h) * d,
                      .o = j->out + ((size_t)a * H + h) * d,
                      .lse = j->lse ? j->lse + (size_t)h * Q + a : NULL,
                      .k = j->k + hk_off,
                      .v = j->v + hk_off,
                      .ldq = (size_t)H * d,
                      .ldo = (size_t)H * d,
                      .ldk = (size_t)j->Hk * d,
                      .R = R,
                      .d = d,
                      .causal_row0 = -1};
        t.n_ranges = block_key_ranges(&j->spans[blk], B, j->Tk, t.ranges);
        attend_tile(&t, scale);
    }
}

/* q[Q,H,d], k,v[Tk,Hk,d] -> out[Q,H,d], lse[H,Q] */
static void cpu_attention_block_fwd(nn_ctx *c, nn_buf *out, float *lse, const nn_buf *q,
                                    const nn_buf *k, const nn_buf *v, const nn_block_span *spans,
                                    int n_blocks, int B, int Tk, int H, int Hk, int d) {
    assert(Hk > 0 && H % Hk == 0);
    if (n_blocks <= 0 || B <= 0) return;
    int rows = att_rows(d), row_tiles = (B + rows - 1) / rows;
    block_job job = {.out = out,
                     .lse = lse,
                     .q = q,
                     .k = k,
                     .v = v,
                     .spans = spans,
                     .n_blocks = n_blocks,
                     .B = B,
                     .rows = rows,
                     .row_tiles = row_tiles,
                     .Tk = Tk,
                     .H = H,
                     .Hk = Hk,
                     .d = d};
    double flops = 4.0 * B * block_visible_keys(spans, n_blocks, B, Tk) * H * d;
    cpu_parallel_for(c, H * n_blocks * row_tiles, 1, flops, block_fwd_tiles, &job);
}

/* Backward, one kv head per work item (its dk/dv rows have no other writer). Per row tile of one
 * query head and key tile, with D = rowsum(dout * out) and the saved lse:
 *   P = exp(q.k^T*scale - lse)            dP = dout . v^T
 *   dS = P * (dP - D) * scale
 *   dv[keys] += P^T . dout   dk[keys] += dS^T . q   dq += dS . k      (all sgemm) */
static void block_bwd_kvheads(void *arg, int begin, int end) {
    const block_job *j = arg;
    int H = j->H, Hk = j->Hk, d = j->d, B = j->B, Q = j->n_blocks * j->B, group = H / Hk;
    size_t ldq = (size_t)H * d, ldk = (size_t)Hk * d;
    float scale = 1.0f / sqrtf((float)d);
    float P[ATT_ROWS * ATT_KEYS], dS[ATT_ROWS * ATT_KEYS], Dr[ATT_ROWS];
    for (int hk = begin; hk < end; hk++) {
        const float *k = j->k + (size_t)hk * d, *v = j->v + (size_t)hk * d;
        float *dk = j->dk + (size_t)hk * d, *dv = j->dv + (size_t)hk * d;
        for (int t = 0; t < j->Tk; t++) {
            memset(dk + (size_t)t * ldk, 0, (size_t)d * sizeof(float));
            memset(dv + (size_t)t * ldk, 0, (size_t)d * sizeof(float));
        }
        for (int h = hk * group; h < (hk + 1) * group; h++)
            for (int blk = 0; blk < j->n_blocks; blk++) {
                int32_t rng[4];
                int nr = block_key_ranges(&j->spans[blk], B, j->Tk, rng);
                for (int a = blk * B; a < (blk + 1) * B; a += j->rows) {
                    int R = (blk + 1) * B - a < j->rows ? (blk + 1) * B - a : j->rows;
                    size_t qo = ((size_t)a * H + h) * d;
                    const float *q = j->q + qo, *dout = j->dout + qo;
                    const float *lse = j->flse + (size_t)h * Q + a;
                    float *dq = j->dq + qo;
                    for (int i = 0; i < R; i++) {
                        memset(dq + i * ldq, 0, (size_t)d * sizeof(float));
                        Dr[i] = dotf(dout + i * ldq, j->fout + qo + i * ldq, d);
                    }
                    for (int r = 0; r < nr; r++)
                        for (int kb = rng[2 * r]; kb < rng[2 * r + 1]; kb += ATT_KEYS) {
                            int n = rng[2 * r + 1] - kb < ATT_KEYS ? rng[2 * r + 1] - kb : ATT_KEYS;
                            const float *kt = k + (size_t)kb * ldk, *vt = v + (size_t)kb * ldk;
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, n, d, scale, q,
                                        ldq, kt, ldk, 0.0f, P, n);
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, n, d, 1.0f,
                                        dout, ldq, vt, ldk, 0.0f, dS, n);
                            for (int i = 0; i < R; i++) {
                                float li = lse[i], Di = Dr[i];
                                int fin = isfinite(li);
                                for (int x = 0; x < n; x++) {
                                    float p = fin ? expf(P[i * n + x] - li) : 0.0f;
                                    P[i * n + x] = p;
                                    dS[i * n + x] = p * (dS[i * n + x] - Di) * scale;
                                }
                            }
                            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, R, 1.0f, P,
                                        n, dout, ldq, 1.0f, dv + (size_t)kb * ldk, ldk);
                            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, R, 1.0f, dS,
                                        n, q, ldq, 1.0f, dk + (size_t)kb * ldk, ldk);
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, d, n, 1.0f,
                                        dS, n, kt, ldk, 1.0f, dq, ldq);
                        }
                }
            }
    }
}

/* the cpu backward needs no planned scratch */
static void cpu_attention_block_plan(nn_ctx *c, int max_q, int max_tk, int H, int Hk, int d) {
    (void)c, (void)max_q, (void)max_tk, (void)H, (void)Hk, (void)d;
}

static void cpu_attention_block_bwd(nn_ctx *c, nn_buf *dq, nn_buf *dk, nn_buf *dv,
                                    const nn_buf *dout, const nn_buf *q, const nn_buf *k,
                                    const nn_buf *v, const nn_buf *out, const float *lse,
                                    const nn_block_span *spans, int n_blocks, int B, int Tk, int H,
                                    int Hk, int d) {
    assert(Hk > 0 && H % Hk == 0 && lse);
    block_job job = {.q = q,
                     .k = k,
                     .v = v,
                     .dq = dq,
                     .dk = dk,
                     .dv = dv,
                     .dout = dout,
                     .fout = out,
                     .flse = lse,
                     .spans = spans,
                     .n_blocks = n_blocks,
                     .B = B,
                     .rows = att_rows(d),
                     .Tk = Tk,
                     .H = H,
                     .Hk = Hk,
                     .d = d};
    double flops = 10.0 * B * block_visible_keys(spans, n_blocks, B, Tk) * H * d;
    cpu_parallel_for(c, Hk, 1, flops, block_bwd_kvheads, &job);
}

/* ------------------------------------------------------------------------------------------ */
/* lm_head + weighted cross-entropy, chunk rows at a time:
 *   logits[n,V] = h[n,D] . W[V,D]^T                       (sgemm into scratch)
 *   per row: lse, CE = lse - logit[label], argmax
 *   dlogits = w * inv_norm * (softmax - onehot)           (in place in scratch; 0 if w == 0)
 *   dh[n,D] = dlogits . W                                 (sgemm) */

static int row_argmax(const float *x, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Rows of one sub-batch of a chunk are independent: they run on the worker threads and leave
 * their weighted loss in rowloss[]; the caller sums those in row order, so the result does not
 * depend on the thread count. */
#define XENT_SUB 256

typedef struct xent_job {
    float *logits; /* [n, V] of the chunk */
    const int32_t *labels;
    const float *weights;
    int32_t *correct;
    double *rowloss; /* [XENT_SUB], indexed from sub0 */
    int r0, sub0, V;
    float inv_norm;
} xent_job;

static void xent_rows(void *arg, int begin, int end) {
    const xent_job *j = arg;
    int V = j->V;
    for (int i = j->sub0 + begin; i < j->sub0 + end; i++) {
        int r = j->r0 + i;
        float *L = j->logits + (size_t)i * V;
        int am = row_argmax(L, V), lab = j->labels[r];
        if (j->correct) j->correct[r] = am == lab;
        float w = j->weights[r];
        j->rowloss[i - j->sub0] = 0.0;
        if (!(w > 0.0f)) {
            memset(L, 0, (size_t)V * sizeof(float));
            continue;
        }
        assert(lab >= 0 && lab < V);
        /* e = exp(L - max) in place; lse = max + log(sum e); softmax = e / sum e */
        float mx = L[am], llab = L[lab];
        double se = 0.0;
        for (int vi = 0; vi < V; vi++) {
            L[vi] = expf(L[vi] - mx);
            se += L[vi];
        }
        j->rowloss[i - j->sub0] = (double)w * ((double)mx + log(se) - (double)llab);
        float g = w * j->inv_norm, gs = (float)(g / se);
        for (int vi = 0; vi < V; vi++)
            L[vi] *= gs;
        L[lab] -= g;
    }
}

static void cpu_lm_head_xent(nn_ctx *c, nn_buf *dh_, float *out_sums, int32_t *correct,
                             const nn_buf *h_, const nn_buf *W_, const int32_t *labels,
                             const float *weights, float inv_norm, nn_buf *scratch, int Q, int D,
                             int V, int chunk) {
    float *dh = dh_, *logits = scratch;
    const float *h = h_, *W = W_;
    double loss = 0.0, wsum = 0.0, rowloss[XENT_SUB];
    assert(chunk > 0 && V > 0);
    for (int r0 = 0; r0 < Q; r0 += chunk) {
        int n = Q - r0 < chunk ? Q - r0 : chunk;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, D, 1.0f, h + (size_t)r0 * D, D,
                    W, D, 0.0f, logits, V);
        xent_job job = {.logits = logits,
                        .labels = labels,
                        .weights = weights,
                        .correct = correct,
                        .rowloss = rowloss,
                        .r0 = r0,
                        .V = V,
                        .inv_norm = inv_norm};
        int nz = 0;
        for (job.sub0 = 0; job.sub0 < n; job.sub0 += XENT_SUB) {
            int m = n - job.sub0 < XENT_SUB ? n - job.sub0 : XENT_SUB;
            cpu_parallel_for(c, m, 4, 10.0 * m * V, xent_rows, &job);
            for (int i = 0; i < m; i++) {
                float w = weights[r0 + job.sub0 + i];
                if (!(w > 0.0f)) continue;
                loss += rowloss[i];
                wsum += w;
                nz++;
            }
        }
        if (!dh) continue;
        float *dhc = dh + (size_t)r0 * D;
        if (nz == 0) {
            memset(dhc, 0, (size_t)n * D * sizeof(float));
            continue;
        }
        /* zero-weight rows would give zero rows of dh: pack the others to the front, one sgemm
         * for them, then spread the results back (downwards, so nothing unread is overwritten) */
        if (nz < n) {
            for (int i = 0, k = 0; i < n; i++)
                if (weights[r0 + i] > 0.0f) {
                    if (i != k)
                        memcpy(logits + (size_t)k * V, logits + (size_t)i * V,
                               (size_t)V * sizeof(float));
                    k++;
                }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nz, D, V, 1.0f, logits, V, W, D,
                    0.0f, dhc, D);
        if (nz < n) {
            for (int i = n - 1, k = nz; i >= 0; i--) {
                if (weights[r0 + i] > 0.0f) {
                    k--;
                    if (i != k)
                        memcpy(dhc + (size_t)i * D, dhc + (size_t)k * D, (size_t)D * sizeof(float));
                } else
                    memset(dhc + (size_t)i * D, 0, (size_t)D * sizeof(float));
            }
        }
    }
    out_sums[0] = (float)loss;
    out_sums[1] = (float)wsum;
}

static void cpu_lm_head_argmax(nn_ctx *c, int32_t *out, const nn_buf *h_, const nn_buf *W_,
                               nn_buf *scratch, int Q, int D, int V, int chunk) {
    (void)c;
    float *logits = scratch;
    const float *h = h_, *W = W_;
    assert(chunk > 0 && V > 0);
    for (int r0 = 0; r0 < Q; r0 += chunk) {
        int n = Q - r0 < chunk ? Q - r0 : chunk;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, D, 1.0f, h + (size_t)r0 * D, D,
                    W, D, 0.0f, logits, V);
        for (int i = 0; i < n; i++)
            out[r0 + i] = row_argmax(logits + (size_t)i * V, V);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* optimizer */

/* One double sum over ga then g, in element order. */
static void cpu_sumsq(nn_ctx *c, float *out, const nn_buf *ga_, size_t na, const float *g,
                      size_t n) {
    (void)c;
    const float *ga = ga_;
    double s = 0.0;
    for (size_t i = 0; i < na; i++)
        s += (double)ga[i] * ga[i];
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    out[0] = (float)s;
}

static void cpu_scale_f32(nn_ctx *c, float *x, size_t n, float a) {
    (void)c;
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

static void cpu_scale_act(nn_ctx *c, nn_buf *x, size_t n, float a) {
    cpu_scale_f32(c, x, n, a);
}

/* acc = (first ? 0 : acc) + a * g over one part (act is fp32 on cpu) */
static void acc_part(float *acc, const float *g, size_t n, float a, int first) {
    for (size_t i = 0; i < n; i++)
        acc[i] = first ? a * g[i] : acc[i] + a * g[i];
}

static void cpu_grad_accumulate(nn_ctx *c, float *acc, const nn_buf *ga, size_t na,
                                const float *g, size_t n, float a, int first) {
    (void)c;
    acc_part(acc, ga, na, a, first);
    acc_part(acc + na, g, n, a, first);
}

/* g = (acc + a * g) * s over one part; a == 0 does not read g */
static void avg_part(float *g, const float *acc, size_t n, float a, float s) {
    for (size_t i = 0; i < n; i++)
        g[i] = (a != 0.0f ? acc[i] + a * g[i] : acc[i]) * s;
}

static void cpu_grad_average(nn_ctx *c, nn_buf *ga, size_t na, float *g, size_t n,
                             const float *acc, float a, float s) {
    (void)c;
    avg_part(ga, acc, na, a, s);
    avg_part(g, acc + na, n, a, s);
}

/* torch.optim.AdamW: p *= 1 - lr*wd; g' = g*grad_scale; m = b1 m + (1-b1) g';
 * v = b2 v + (1-b2) g'^2; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). */
static void cpu_adamw(nn_ctx *c, float *p, nn_buf *p_act, const float *g, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps, float wd,
                      float grad_scale, int t) {
    (void)c;
    assert(t >= 1);
    float bc1 = (float)(1.0 - pow((double)beta1, t));
    float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t));
    float step = lr / bc1, decay = 1.0f - lr * wd;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
    if (p_act && p_act != p) memcpy(p_act, p, n * sizeof(float));
}

static void cpu_adamw_clip(nn_ctx *c, float *p, nn_buf *p_act, const float *g, float *m, float *v,
                           size_t n, float lr, float beta1, float beta2, float eps, float wd,
                           const float *sumsq, float clip, int t) {
    cpu_adamw(c, p, p_act, g, m, v, n, lr, beta1, beta2, eps, wd, NN_CLIP_SCALE(sumsq[0], clip),
              t);
}

static void cpu_adamw_clip_act(nn_ctx *c, float *p, nn_buf *p_act, uint16_t *p_lo,
                               const nn_buf *g, float *m, float *v, size_t n, float lr,
                               float beta1, float beta2, float eps, float wd, const float *sumsq,
                               float clip, int t) {
    assert(p && !p_lo); /* master_split is false: the fp32 master is the weight */
    (void)p_lo;
    cpu_adamw_clip(c, p, p_act, g, m, v, n, lr, beta1, beta2, eps, wd, sumsq, clip, t);
}

static void cpu_f32_to_act(nn_ctx *c, nn_buf *dst, const float *src, size_t n) {
    (void)c;
    if (n && dst != src) memmove(dst, src, n * sizeof(float));
}

/* ------------------------------------------------------------------------------------------ */

static void cpu_copy2d(nn_ctx *c, void *dst, size_t dst_pitch, const void *src,
                       size_t src_pitch, size_t width, size_t rows) {
    (void)c;
    if (!width) return;
    if (dst_pitch == width && src_pitch == width) {
        memcpy(dst, src, width * rows);
        return;
    }
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}

static void cpu_rows_scatter(nn_ctx *c, void *dst, const int32_t *rows, const void *src, int n,
                             size_t row_bytes) {
    (void)c;
    for (int i = 0; i < n; i++) {
        assert(rows[i] >= 0);
        memcpy((char *)dst + (size_t)rows[i] * row_bytes, (const char *)src + (size_t)i * row_bytes,
               row_bytes);
    }
}

static int cpu_matmul_tune(nn_ctx *c, int candidates) {
    (void)c;
    (void)candidates;
    return -1; /* one OpenBLAS sgemm per product: nothing to choose */
}

static const nn_ops cpu_ops = {
    .name = "cpu",
    .act_bytes = sizeof(float),
    .master_split = false,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .upload_raw = cpu_memcpy,
    .download_raw = cpu_memcpy,
    .copy = cpu_memcpy,
    .copy2d = cpu_copy2d,
    .rows_scatter = cpu_rows_scatter,
    .matmul_tune = cpu_matmul_tune,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .embedding_fwd = cpu_embedding_fwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .linear_fwd = cpu_linear_fwd,
    .linear_fwd_res = cpu_linear_fwd_res,
    .rope_table = cpu_rope_table,
    .head_norm_rope_fwd = cpu_head_norm_rope_fwd,
    .qkv_norm_rope_fwd = cpu_qkv_norm_rope_fwd,
    .attention_causal_fwd = cpu_attention_causal_fwd,
    .attention_block_fwd = cpu_attention_block_fwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .linear_bwd = cpu_linear_bwd,
    .head_norm_rope_bwd = cpu_head_norm_rope_bwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .attention_block_bwd = cpu_attention_block_bwd,
    .attention_block_plan = cpu_attention_block_plan,
    .lm_head_xent = cpu_lm_head_xent,
    .lm_head_argmax = cpu_lm_head_argmax,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
    .f32_to_act = cpu_f32_to_act,
    .stream = cpu_stream,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .download_raw_async = cpu_memcpy,
    .fence_record = cpu_fence,
    .fence_wait = cpu_fence,
    .order_after = cpu_order_after,
    .side_begin = cpu_side,
    .side_mark = cpu_side_mark,
    .side_end = cpu_side,
    .side_wait = cpu_side_wait,
    .stream_drains = cpu_stream_drains,
    .allocs = cpu_allocs,
    .adamw_clip = cpu_adamw_clip,
    .adamw_clip_act = cpu_adamw_clip_act,
    .scale_f32 = cpu_scale_f32,
    .scale_act = cpu_scale_act,
    .grad_accumulate = cpu_grad_accumulate,
    .grad_average = cpu_grad_average,
};

const nn_ops *nn_cpu_ops(void) {
    return &cpu_ops;
}

/* OpenBLAS 0.3.21 does not know recent Xeons (e.g. model 207) and falls back to its SSE3
 * "Prescott" kernels, 3-4x slower than its AVX2 ones on the same machine. The core type is fixed
 * when the library loads, so all we can do is say so, once per process. */
static void warn_slow_openblas(void) {
    static atomic_int warned;
    const char *core = openblas_get_corename();
    if (!core || strcmp(core, "Prescott") != 0 || atomic_exchange(&warned, 1)) return;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        LOG_WARN("OpenBLAS chose its generic Prescott kernels on this AVX2 cpu: matrix products "
                 "run ~3x slower; start with OPENBLAS_CORETYPE=Haswell (or SkylakeX) set");
}

/* OpenBLAS (pthread build) starts one worker per core when the library loads, before main(),
 * and openblas_set_num_threads only lowers how many a call uses: the others sleep on for the
 * process's life. Shutting its server down makes the next call start exactly the count set, so
 * a --threads 4 process on a 64-core host holds 3 workers, not 63. Safe only while no BLAS call
 * runs on another thread, hence only in the process's first nn_cpu_new: every BLAS call of ours
 * goes through a context, and none exists before it. Weak: a BLAS build without the function
 * (another threading variant) keeps its pool as it is. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

static void limit_openblas_threads(int threads, bool first_context) {
    int started = openblas_get_num_threads(); /* the workers it runs, the caller included */
    openblas_set_num_threads(threads);
    if (first_context && threads < started && blas_thread_shutdown_) blas_thread_shutdown_();
}

nn_ctx *nn_cpu_new(int threads) {
    static atomic_int contexts_made;
    bool first_context = atomic_exchange(&contexts_made, 1) == 0;
    nn_ctx *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    warn_slow_openblas();
    if (threads > 0)
        limit_openblas_threads(threads, first_context);
    else {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    c->threads = threads > CPU_MAX_THREADS ? CPU_MAX_THREADS : threads;
    return c;
}

void nn_cpu_destroy(nn_ctx **c) {
    if (!c || !*c) return;
    free(*c);
    *c = NULL;
}
