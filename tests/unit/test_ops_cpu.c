/* test_ops_cpu: the cpu backend of ops.h against finite differences, a dense masked-attention
 * reference written here in double, and hand-computed values.
 *
 * Every backward is checked by central differences of a scalar loss L = sum(out * R) with a
 * fixed random R (so dout = R): analytic gradient vs (L(x+e) - L(x-e)) / 2e for every input
 * element, error measured relative to the largest gradient. Properties a model author relies on
 * are checked directly: the RoPE table is cos | sin of each angle, head norm + RoPE is the norm
 * then the rotation worked by hand (and in place), packed causal attention equals per-sequence
 * attention, the DFlash block mask (context range + own block, keep = 0 gives zeros), zero-weight
 * rows of the loss give no gradient, AdamW matches torch's formula worked by hand.
 */
#include "check.h"
#include "ops.h"

#include <stdlib.h>
#include <string.h>

static const nn_ops *ops;
static nn_ctx *ctx;

/* ---- helpers ---- */

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
static float *rnd(size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}
static float *zeros(size_t n) {
    return calloc(n, sizeof(float));
}
static double dot_d(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}
static double max_abs(const float *a, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}
static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fabs(a[i] - b[i]) > m ? fabs(a[i] - b[i]) : m;
    return m;
}

/* Central-difference check of grad[n] = dL/dx for the loss computed by f(arg) (which reads x).
 * Returns max |fd - grad| / max(max|grad|, 1e-3). */
typedef double (*loss_fn)(void *arg);
static double fd_error(const char *what, float *x, const float *grad, size_t n, loss_fn f,
                       void *arg, float eps) {
    double worst = 0.0, gmax = max_abs(grad, n);
    if (gmax < 1e-3) gmax = 1e-3;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + eps;
        double lp = f(arg);
        x[i] = x0 - eps;
        double lm = f(arg);
        x[i] = x0;
        double fd = (lp - lm) / (2.0 * eps);
        double e = fabs(fd - grad[i]) / gmax;
        if (e > worst) worst = e;
    }
    printf("  fd %-28s max rel err %.2e (max |grad| %.3g)\n", what, worst, gmax);
    return worst;
}

#define FD_TOL 2e-2

/* ---- rmsnorm ---- */

typedef struct {
    float *out, *rstd, *x, *w, *R;
    int Rn, C;
} norm_t;
static double norm_loss(void *a_) {
    norm_t *a = a_;
    ops->rmsnorm_fwd(ctx, a->out, a->rstd, a->x, a->w, a->Rn, a->C, 1e-6f);
    return dot_d(a->out, a->R, (size_t)a->Rn * a->C);
}

static void test_rmsnorm(void) {
    int Rn = 5, C = 16;
    size_t n = (size_t)Rn * C;
    norm_t a = {zeros(n), zeros(Rn), rnd(n, 2.0f), rnd(C, 1.0f), rnd(n, 1.0f), Rn, C};
    norm_loss(&a);
    /* forward against the formula */
    double ss = 0.0;
    for (int i = 0; i < C; i++)
        ss += (double)a.x[C + i] * a.x[C + i];
    double r = 1.0 / sqrt(ss / C + 1e-6);
    CHECK_NEAR(a.out[C + 3], a.x[C + 3] * r * a.w[3], 1e-5);
    CHECK_NEAR(a.rstd[1], r, 1e-5);

    float *dx = zeros(n), *dw = rnd(C, 1.0f), *dw0 = malloc(C * sizeof(float));
    memcpy(dw0, dw, C * sizeof(float));
    ops->rmsnorm_bwd(ctx, dx, dw, a.R, a.x, a.w, a.rstd, Rn, C, NULL);
    for (int i = 0; i < C; i++)
        dw[i] -= dw0[i]; /* accumulates: subtract the prefill */
    CHECK(fd_error("rmsnorm dx", a.x, dx, n, norm_loss, &a, 1e-2f) < FD_TOL);
    CHECK(fd_error("rmsnorm dw", a.w, dw, C, norm_loss, &a, 1e-2f) < FD_TOL);

    /* dx may equal dy */
    float *dy = malloc(n * sizeof(float));
    memcpy(dy, a.R, n * sizeof(float));
    norm_loss(&a);
    ops->rmsnorm_bwd(ctx, dy, NULL, dy, a.x, a.w, a.rstd, Rn, C, NULL);
    CHECK(max_diff(dy, dx, n) < 1e-6);
    /* dres adds a residual branch's gradient; dx may equal dres */
    float *res = rnd(n, 1.0f), *dxr = zeros(n);
    ops->rmsnorm_bwd(ctx, dxr, NULL, a.R, a.x, a.w, a.rstd, Rn, C, res);
    for (size_t i = 0; i < n; i++)
        dy[i] = dx[i] + res[i];
    CHECK(max_diff(dxr, dy, n) < 1e-6);
    ops->rmsnorm_bwd(ctx, res, NULL, a.R, a.x, a.w, a.rstd, Rn, C, res);
    CHECK(max_diff(res, dy, n) < 1e-6);
    free(res), free(dxr);
    /* out may equal x */
    float *xc = malloc(n * sizeof(float));
    memcpy(xc, a.x, n * sizeof(float));
    ops->rmsnorm_fwd(ctx, xc, NULL, xc, a.w, Rn, C, 1e-6f);
    CHECK(max_diff(xc, a.out, n) < 1e-6);
    free(a.out), free(a.rstd), free(a.x), free(a.w), free(a.R), free(dx), free(dw), free(dw0);
    free(dy), free(xc);
}

/* ---- linear ---- */

typedef struct {
    float *y, *x, *w, *b, *R;
    int M, K, N;
} lin_t;
static double lin_loss(void *a_) {
    lin_t *a = a_;
    ops->linear_fwd(ctx, a->y, a->x, a->w, a->b, a->M, a->K, a->N);
    return dot_d(a->y, a->R, (size_t)a->M * a->N);
}

static void test_linear(void) {
    int M = 6, K = 7, N = 5;
    lin_t a = {zeros((size_t)M * N),
               rnd((size_t)M * K, 1),
               rnd((size_t)N * K, 1),
               rnd(N, 1),
               rnd((size_t)M * N, 1),
               M,
               K,
               N};
    lin_loss(&a);
    /* forward against a naive loop */
    double y23 = a.b[3];
    for (int k = 0; k < K; k++)
        y23 += (double)a.x[2 * K + k] * a.w[3 * K + k];
    CHECK_NEAR(a.y[2 * N + 3], y23, 1e-5);

    float *dx = rnd((size_t)M * K, 5), *dw = zeros((size_t)N * K), *db = zeros(N);
    ops->linear_bwd(ctx, dx, dw, db, a.R, a.x, a.w, M, K, N, 0); /* dx overwritten, not added */
    CHECK(fd_error("linear dx", a.x, dx, (size_t)M * K, lin_loss, &a, 1e-2f) < FD_TOL);
    CHECK(fd_error("linear dw", a.w, dw, (size_t)N * K, lin_loss, &a, 1e-2f) < FD_TOL);
    CHECK(fd_error("linear db", a.b, db, N, lin_loss, &a, 1e-2f) < FD_TOL);

    /* a second backward accumulates dw, db; NN_BWD_DX_ADD accumulates dx too */
    float *dx2 = malloc((size_t)M * K * sizeof(float)), *dw2 = malloc((size_t)N * K * 4),
          *db2 = malloc(N * 4);
    memcpy(dx2, dx, (size_t)M * K * 4), memcpy(dw2, dw, (size_t)N * K * 4), memcpy(db2, db, N * 4);
    ops->linear_bwd(ctx, dx2, dw2, db2, a.R, a.x, a.w, M, K, N, NN_BWD_DX_ADD);
    int ok = 1;
    for (int i = 0; i < M * K; i++)
        ok &= fabsf(dx2[i] - 2 * dx[i]) < 1e-5f;
    for (int i = 0; i < N * K; i++)
        ok &= fabsf(dw2[i] - 2 * dw[i]) < 1e-5f;
    for (int i = 0; i < N; i++)
        ok &= fabsf(db2[i] - 2 * db[i]) < 1e-5f;
    CHECK(ok);
    /* NULL dx and db are skipped */
    ops->linear_bwd(ctx, NULL, dw2, NULL, a.R, a.x, a.w, M, K, N, 0);
    CHECK_NEAR(dw2[4], 3 * dw[4], 1e-5);
    /* NN_BWD_DW_SET overwrites dw (dx still added to with NN_BWD_DX_ADD); no rows: dw = 0 */
    ops->linear_bwd(ctx, dx2, dw2, NULL, a.R, a.x, a.w, M, K, N, NN_BWD_DW_SET | NN_BWD_DX_ADD);
    ok = 1;
    for (int i = 0; i < N * K; i++)
        ok &= fabsf(dw2[i] - dw[i]) < 1e-5f;
    for (int i = 0; i < M * K; i++)
        ok &= fabsf(dx2[i] - 3 * dx[i]) < 1e-5f;
    CHECK(ok);
    ops->linear_bwd(ctx, NULL, dw2, NULL, a.R, a.x, a.w, 0, K, N, NN_BWD_DW_SET);
    ok = 1;
    for (int i = 0; i < N * K; i++)
        ok &= dw2[i] == 0.0f;
    CHECK(ok);
    free(a.y), free(a.x), free(a.w), free(a.b), free(a.R), free(dx), free(dw), free(db);
    free(dx2), free(dw2), free(db2);
}

/* ---- head_norm_rope ---- */

/* The rotation by hand: dimension i pairs with i + d/2 at angle pos * inv_freq[i]. */
static void rotate_ref(float *x, const int32_t *pos, const float *inv, int T, int nh, int d) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < d / 2; i++) {
                float *r = x + ((size_t)t * nh + h) * d, a = (float)pos[t] * inv[i];
                float x1 = r[i], x2 = r[i + d / 2];
                r[i] = x1 * (float)cos(a) - x2 * (float)sin(a);
                r[i + d / 2] = x2 * (float)cos(a) + x1 * (float)sin(a);
            }
}

typedef struct {
    float *x, *w, *out, *R, *rot;
    int T, nh, d;
} hnr_t;
static double hnr_loss(void *a_) {
    hnr_t *a = a_;
    ops->head_norm_rope_fwd(ctx, a->out, a->x, a->w, a->rot, a->T, a->nh, a->d, 1e-6f);
    return dot_d(a->out, a->R, (size_t)a->T * a->nh * a->d);
}

static void test_head_norm_rope(void) {
    int T = 4, nh = 3, d = 8;
    size_t n = (size_t)T * nh * d;
    int32_t pos[4] = {0, 7, 300, 3071};
    float inv[4];
    hnr_t a = {rnd(n, 2), rnd(d, 1), zeros(n), rnd(n, 1), rnd((size_t)T * d, 1), T, nh, d};
    rope_inv_freq(inv, d, 10000.0, NULL);
    /* the table: per token cos | sin of (float)pos * inv_freq, every element written */
    ops->rope_table(ctx, a.rot, pos, inv, T, d);
    int ok = 1;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d / 2; i++) {
            float ang = (float)pos[t] * inv[i], *r = a.rot + (size_t)t * d;
            ok &= r[i] == (float)cos(ang) && r[d / 2 + i] == (float)sin(ang);
        }
    CHECK(ok);
    hnr_loss(&a);
    /* rmsnorm_fwd then the rotation by hand */
    float *e = zeros(n);
    ops->rmsnorm_fwd(ctx, e, NULL, a.x, a.w, T * nh, d, 1e-6f);
    CHECK(max_diff(a.out, e, (size_t)nh * d) == 0.0); /* position 0: the norm alone */
    rotate_ref(e, pos, inv, T, nh, d);
    CHECK(max_diff(a.out, e, n) < 1e-5);
    /* out may equal x */
    float *xc = malloc(n * sizeof(float));
    memcpy(xc, a.x, n * sizeof(float));
    ops->head_norm_rope_fwd(ctx, xc, xc, a.w, a.rot, T, nh, d, 1e-6f);
    CHECK(max_diff(xc, a.out, n) == 0.0);

    /* the gradients against finite differences; dw accumulates, dx may equal dy */
    float *dx = zeros(n), *dw = rnd(d, 1), *dw0 = malloc(d * sizeof(float));
    memcpy(dw0, dw, d * sizeof(float));
    ops->head_norm_rope_bwd(ctx, dx, dw, a.R, a.x, a.w, a.rot, T, nh, d, 1e-6f);
    for (int i = 0; i < d; i++)
        dw[i] -= dw0[i];
    CHECK(fd_error("head_norm_rope dx", a.x, dx, n, hnr_loss, &a, 1e-2f) < FD_TOL);
    CHECK(fd_error("head_norm_rope dw", a.w, dw, d, hnr_loss, &a, 1e-2f) < FD_TOL);
    memcpy(xc, a.R, n * sizeof(float));
    ops->head_norm_rope_bwd(ctx, xc, NULL, xc, a.x, a.w, a.rot, T, nh, d, 1e-6f);
    CHECK(max_diff(xc, dx, n) == 0.0);
    free(a.x), free(a.w), free(a.out), free(a.R), free(a.rot), free(e), free(xc), free(dx);
    free(dw), free(dw0);
}

/* qkv_norm_rope_fwd: the q, k, v column ranges of each token's fused row, q and k as
 * head_norm_rope_fwd gives them (or only rotated without norm weights), v untouched */
static void test_qkv_norm_rope(void) {
    int T = 3, H = 4, Hk = 2, d = 8, W = (H + 2 * Hk) * d;
    float *qkv = rnd((size_t)T * W, 2), *qn = rnd(d, 1), *kn = rnd(d, 1), inv[4];
    float *q = zeros((size_t)T * H * d), *k = zeros((size_t)T * Hk * d);
    float *v = zeros((size_t)T * Hk * d), *eq = zeros((size_t)T * H * d);
    float *ek = zeros((size_t)T * Hk * d), *rot = zeros((size_t)T * d);
    int32_t pos[3] = {5, 0, 2047};
    rope_inv_freq(inv, d, 10000.0, NULL);
    ops->rope_table(ctx, rot, pos, inv, T, d);
    for (int norm = 0; norm < 2; norm++) {
        ops->qkv_norm_rope_fwd(ctx, q, k, v, qkv, norm ? qn : NULL, norm ? kn : NULL, rot, T, H, Hk,
                               d, 1e-6f);
        for (int t = 0; t < T; t++) {
            memcpy(eq + (size_t)t * H * d, qkv + (size_t)t * W, sizeof(float) * H * d);
            memcpy(ek + (size_t)t * Hk * d, qkv + (size_t)t * W + H * d, sizeof(float) * Hk * d);
            CHECK(max_diff(v + (size_t)t * Hk * d, qkv + (size_t)t * W + (H + Hk) * d,
                           (size_t)Hk * d) == 0.0);
        }
        if (norm) {
            ops->head_norm_rope_fwd(ctx, eq, eq, qn, rot, T, H, d, 1e-6f);
            ops->head_norm_rope_fwd(ctx, ek, ek, kn, rot, T, Hk, d, 1e-6f);
            CHECK(max_diff(q, eq, (size_t)T * H * d) == 0.0);
            CHECK(max_diff(k, ek, (size_t)T * Hk * d) == 0.0);
        } else {
            rotate_ref(eq, pos, inv, T, H, d);
            rotate_ref(ek, pos, inv, T, Hk, d);
            CHECK(max_diff(q, eq, (size_t)T * H * d) < 1e-5);
            CHECK(max_diff(k, ek, (size_t)T * Hk * d) < 1e-5);
        }
    }
    free(qkv), free(qn), free(kn), free(q), free(k), free(v), free(eq), free(ek), free(rot);
}

/* ---- swiglu ---- */

typedef struct {
    float *out, *gu, *R; /* gu [Rn, 2F]: gate | up per row */
    int Rn, F;
} swi_t;
static double swi_loss(void *a_) {
    swi_t *a = a_;
    ops->swiglu_fwd(ctx, a->out, a->gu, a->Rn, a->F);
    return dot_d(a->out, a->R, (size_t)a->Rn * a->F);
}

static void test_swiglu(void) {
    int Rn = 3, F = 10;
    size_t n = (size_t)Rn * F;
    swi_t a = {zeros(n), rnd(2 * n, 4), rnd(n, 1), Rn, F};
    swi_loss(&a);
    float g = a.gu[2 * 2 * F + 7], u = a.gu[2 * 2 * F + F + 7]; /* row 2, column 7 */
    CHECK_NEAR(a.out[2 * F + 7], g / (1.0 + exp(-g)) * u, 1e-6);
    float *dgu = zeros(2 * n);
    ops->swiglu_bwd(ctx, dgu, a.R, a.gu, Rn, F);
    CHECK(fd_error("swiglu dgate|dup", a.gu, dgu, 2 * n, swi_loss, &a, 1e-2f) < FD_TOL);
    free(a.out), free(a.gu), free(a.R), free(dgu);
}

/* ---- attention ---- */

/* Dense reference in double: out[Q,H,d] = softmax(q k^T / sqrt(d) + mask) v, GQA; rows without
 * a visible key give 0. mask[Q*Tk] is 1 where key is visible. */
static void ref_attention(float *out, const float *q, const float *k, const float *v,
                          const unsigned char *mask, int Q, int Tk, int H, int Hk, int d) {
    double *s = malloc((size_t)Tk * sizeof(double));
    for (int r = 0; r < Q; r++)
        for (int h = 0; h < H; h++) {
            int hk = h / (H / Hk);
            const float *qr = q + ((size_t)r * H + h) * d;
            double mx = -INFINITY;
            for (int t = 0; t < Tk; t++) {
                if (!mask[(size_t)r * Tk + t]) continue;
                s[t] = dot_d(qr, k + ((size_t)t * Hk + hk) * d, d) / sqrt((double)d);
                if (s[t] > mx) mx = s[t];
            }
            double l = 0.0;
            for (int i = 0; i < d; i++)
                out[((size_t)r * H + h) * d + i] = 0.0f;
            double *acc = calloc(d, sizeof(double));
            for (int t = 0; t < Tk; t++) {
                if (!mask[(size_t)r * Tk + t]) continue;
                double p = exp(s[t] - mx);
                l += p;
                for (int i = 0; i < d; i++)
                    acc[i] += p * v[((size_t)t * Hk + hk) * d + i];
            }
            if (l > 0)
                for (int i = 0; i < d; i++)
                    out[((size_t)r * H + h) * d + i] = (float)(acc[i] / l);
            free(acc);
        }
    free(s);
}

/* causal attention of packed sequences with the given lengths (n_seqs <= 8) */
static void check_attention_causal(const int *lens, int NS, int H, int Hk, int d) {
    int32_t off[9] = {0};
    for (int s = 0; s < NS; s++)
        off[s + 1] = off[s] + lens[s];
    int T = off[NS];
    float *q = rnd((size_t)T * H * d, 1.5f), *k = rnd((size_t)T * Hk * d, 1.5f),
          *v = rnd((size_t)T * Hk * d, 1);
    float *out = rnd((size_t)T * H * d, 9), *ref = zeros((size_t)T * H * d);
    ops->attention_causal_fwd(ctx, out, q, k, v, off, NS, T, H, Hk, d);

    /* against the dense masked reference: key t visible to row r iff same sequence and t <= r */
    unsigned char *mask = calloc((size_t)T * T, 1);
    for (int s = 0; s < NS; s++)
        for (int r = off[s]; r < off[s + 1]; r++)
            for (int t = off[s]; t <= r; t++)
                mask[(size_t)r * T + t] = 1;
    ref_attention(ref, q, k, v, mask, T, T, H, Hk, d);
    double e = max_diff(out, ref, (size_t)T * H * d);
    printf("  causal packed vs dense reference: max abs err %.2e\n", e);
    CHECK(e < 1e-5);

    /* a packed batch equals each sequence run alone */
    int ok = 1;
    for (int s = 0; s < NS; s++) {
        int L = off[s + 1] - off[s];
        int32_t one[2] = {0, L};
        float *o1 = zeros((size_t)L * H * d);
        ops->attention_causal_fwd(ctx, o1, q + (size_t)off[s] * H * d, k + (size_t)off[s] * Hk * d,
                                  v + (size_t)off[s] * Hk * d, one, 1, L, H, Hk, d);
        ok &= max_diff(o1, out + (size_t)off[s] * H * d, (size_t)L * H * d) < 1e-6;
        free(o1);
    }
    CHECK(ok);
    /* the first token of a sequence sees only itself: out = its v (of the right kv head) */
    CHECK(max_diff(out + ((size_t)off[1] * H + H - 1) * d, v + ((size_t)off[1] * Hk + Hk - 1) * d,
                   d) < 1e-6);
    free(q), free(k), free(v), free(out), free(ref), free(mask);
}

static void test_attention_causal(void) {
    check_attention_causal((const int[]){5, 3, 7}, 3, 4, 2, 8); /* one row tile, three sequences */
    check_attention_causal((const int[]){40, 1, 150}, 3, 2, 1, 16); /* several row and key tiles */
}

/* Block attention fixture: S context keys then nb blocks of B keys; L = sum(out * R). */
typedef struct {
    int nb, B, S, H, Hk, d, Q, Tk;
    size_t nq, nk;
    float *out, *lse, *q, *k, *v, *R;
    nn_block_span *spans;
} blk_t;
static double blk_loss(void *a_) {
    blk_t *a = a_;
    ops->attention_block_fwd(ctx, a->out, a->lse, a->q, a->k, a->v, a->spans, a->nb, a->B, a->Tk,
                             a->H, a->Hk, a->d);
    return dot_d(a->out, a->R, a->nq);
}
static blk_t blk_new(int nb, int B, int S, int H, int Hk, int d) {
    blk_t a = {nb, B, S, H, Hk, d, nb * B, S + nb * B, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    a.nq = (size_t)a.Q * H * d, a.nk = (size_t)a.Tk * Hk * d;
    a.out = zeros(a.nq), a.lse = zeros((size_t)H * a.Q);
    a.q = rnd(a.nq, 1.5f), a.k = rnd(a.nk, 1.5f), a.v = rnd(a.nk, 1), a.R = rnd(a.nq, 1);
    a.spans = calloc(nb, sizeof(nn_block_span));
    return a;
}
static void blk_free(blk_t *a) {
    free(a->out), free(a->lse), free(a->q), free(a->k), free(a->v), free(a->R), free(a->spans);
}
/* the visibility mask [Q, Tk] of the spans, written from the ops.h contract */
static unsigned char *blk_mask(const blk_t *a) {
    unsigned char *mask = calloc((size_t)a->Q * a->Tk, 1);
    for (int j = 0; j < a->nb; j++)
        for (int i = 0; i < a->B; i++) {
            const nn_block_span *s = &a->spans[j];
            if (!s->keep) continue;
            unsigned char *m = mask + (size_t)(j * a->B + i) * a->Tk;
            for (int t = s->ctx_begin; t < s->ctx_end; t++)
                m[t] = 1;
            for (int t = s->blk_begin; t < s->blk_begin + a->B; t++)
                m[t] = 1;
        }
    return mask;
}
/* forward against the dense masked reference, backward by finite differences (every `step`-th
 * element); returns the forward error */
static void blk_check(blk_t *a, const char *what, size_t step) {
    blk_loss(a);
    unsigned char *mask = blk_mask(a);
    float *ref = zeros(a->nq);
    ref_attention(ref, a->q, a->k, a->v, mask, a->Q, a->Tk, a->H, a->Hk, a->d);
    double e = max_diff(a->out, ref, a->nq);
    printf("  %s: block attention vs dense masked reference: max abs err %.2e\n", what, e);
    CHECK(e < 1e-5);
    /* lse of row 0, head 0 is the log-sum-exp of its visible scores */
    double se = 0.0;
    for (int t = 0; t < a->Tk; t++)
        if (mask[t]) se += exp(dot_d(a->q, a->k + (size_t)t * a->Hk * a->d, a->d) / sqrt(a->d));
    if (se > 0) CHECK_NEAR(a->lse[0], log(se), 1e-5);

    float *dq = rnd(a->nq, 7), *dk = rnd(a->nk, 7), *dv = rnd(a->nk, 7);
    ops->attention_block_bwd(ctx, dq, dk, dv, a->R, a->q, a->k, a->v, a->out, a->lse, a->spans,
                             a->nb, a->B, a->Tk, a->H, a->Hk, a->d);
    /* sampled finite differences: view every step-th element as its own 1-element check */
    double worst[3] = {0, 0, 0};
    float *x[3] = {a->q, a->k, a->v}, *g[3] = {dq, dk, dv};
    size_t n[3] = {a->nq, a->nk, a->nk};
    for (int w = 0; w < 3; w++) {
        double gmax = max_abs(g[w], n[w]);
        for (size_t i = 0; i < n[w]; i += step) {
            float x0 = x[w][i];
            x[w][i] = x0 + 1e-2f;
            double lp = blk_loss(a);
            x[w][i] = x0 - 1e-2f;
            double lm = blk_loss(a);
            x[w][i] = x0;
            double err = fabs((lp - lm) / 2e-2 - g[w][i]) / (gmax > 1e-3 ? gmax : 1e-3);
            if (err > worst[w]) worst[w] = err;
        }
    }
    printf("  %s: fd dq %.2e dk %.2e dv %.2e (every %zu-th element)\n", what, worst[0], worst[1],
           worst[2], step);
    CHECK(worst[0] < FD_TOL && worst[1] < FD_TOL && worst[2] < FD_TOL);
    blk_loss(a);
    /* keys that no block sees get exactly zero gradient, though dk/dv held garbage */
    int ok = 1;
    for (int t = 0; t < a->Tk; t++) {
        int seen = 0;
        for (int r = 0; r < a->Q; r++)
            seen |= mask[(size_t)r * a->Tk + t];
        if (!seen)
            ok &= max_abs(dk + (size_t)t * a->Hk * a->d, (size_t)a->Hk * a->d) == 0.0 &&
                  max_abs(dv + (size_t)t * a->Hk * a->d, (size_t)a->Hk * a->d) == 0.0;
    }
    CHECK(ok);
    free(mask), free(ref), free(dq), free(dk), free(dv);
}

static void test_attention_block(void) {
    /* 3 blocks of 4 after 6 context keys. block 0: anchor 3 sees ctx [0,3); block 1: keep = 0;
     * block 2: anchor 0 sees no context */
    blk_t a = blk_new(3, 4, 6, 4, 2, 8);
    a.spans[0] = (nn_block_span){0, 3, 6 + 0 * 4, 1};
    a.spans[1] = (nn_block_span){0, 5, 6 + 1 * 4, 0};
    a.spans[2] = (nn_block_span){0, 0, 6 + 2 * 4, 1};
    blk_check(&a, "small", 1);
    size_t rowb = (size_t)a.B * a.H * a.d; /* one block of out rows */
    /* keep = 0 rows are zero, with lse = +inf */
    CHECK(max_abs(a.out + rowb, rowb) == 0.0);
    CHECK(isinf(a.lse[a.B]) && a.lse[a.B] > 0);

    /* keys outside a block's span do not change its output: perturb context key 4 (invisible to
     * block 0, whose anchor is 3) and the keys of block 1 */
    float *o0 = malloc(a.nq * sizeof(float));
    memcpy(o0, a.out, a.nq * sizeof(float));
    for (int i = 0; i < a.Hk * a.d; i++) {
        a.k[(size_t)4 * a.Hk * a.d + i] += 1.0f;
        a.v[(size_t)(a.S + a.B) * a.Hk * a.d + i] += 1.0f;
    }
    blk_loss(&a);
    CHECK(max_diff(a.out, o0, rowb) == 0.0);                       /* block 0 */
    CHECK(max_diff(a.out + 2 * rowb, o0 + 2 * rowb, rowb) == 0.0); /* block 2 */

    /* keep = 0 rows get dq = 0 */
    float *dq = rnd(a.nq, 7), *dk = rnd(a.nk, 7), *dv = rnd(a.nk, 7);
    ops->attention_block_bwd(ctx, dq, dk, dv, a.R, a.q, a.k, a.v, a.out, a.lse, a.spans, a.nb, a.B,
                             a.Tk, a.H, a.Hk, a.d);
    CHECK(max_abs(dq + rowb, rowb) == 0.0);
    free(o0), free(dq), free(dk), free(dv);
    blk_free(&a);

    /* blocks of 20 rows (more than one row tile) over 150 context keys (several key tiles), and
     * a block whose context range overlaps its own keys (the union counts each key once) */
    blk_t b = blk_new(3, 20, 150, 2, 1, 8);
    b.spans[0] = (nn_block_span){0, 150, 150, 1};
    b.spans[1] = (nn_block_span){0, 200, 170, 1}; /* context reaches past its block */
    b.spans[2] = (nn_block_span){100, 200, 190, 1};
    blk_check(&b, "tiled", 3);
    blk_free(&b);

    /* a large head dim (fewer rows per tile) */
    blk_t w = blk_new(1, 14, 3, 2, 1, 320);
    w.spans[0] = (nn_block_span){0, 3, 3, 1};
    blk_check(&w, "d=320", 37);
    blk_free(&w);
}

/* Attention big enough to run on two threads (the ops run loops under ~4 MFLOP on the caller)
 * gives the same bits as on one thread, and still the dense reference's values. */
static void test_attention_threads(void) {
    nn_ctx *c1 = nn_cpu_new(1), *c2 = nn_cpu_new(2);
    int H = 4, Hk = 2, d = 32;
    int32_t off[3] = {0, 130, 300};
    int T = off[2];
    size_t nq = (size_t)T * H * d, nk = (size_t)T * Hk * d;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *o1 = zeros(nq), *o2 = zeros(nq);
    ops->attention_causal_fwd(c1, o1, q, k, v, off, 2, T, H, Hk, d);
    ops->attention_causal_fwd(c2, o2, q, k, v, off, 2, T, H, Hk, d);
    CHECK(max_diff(o1, o2, nq) == 0.0 && max_abs(o1, nq) > 0.0);
    free(q), free(k), free(v), free(o1), free(o2);

    blk_t a = blk_new(8, 16, 200, 4, 2, 32);
    for (int j = 0; j < a.nb; j++)
        a.spans[j] = (nn_block_span){0, 25 * j, a.S + j * a.B, j != 3};
    nn_ctx *saved = ctx;
    float *lse1 = zeros((size_t)a.H * a.Q), *dq[2], *dk[2], *dv[2];
    for (int i = 0; i < 2; i++) {
        ctx = i ? c2 : c1;
        blk_loss(&a);
        if (i == 0) memcpy(lse1, a.lse, (size_t)a.H * a.Q * sizeof(float));
        dq[i] = zeros(a.nq), dk[i] = zeros(a.nk), dv[i] = zeros(a.nk);
        ops->attention_block_bwd(ctx, dq[i], dk[i], dv[i], a.R, a.q, a.k, a.v, a.out, a.lse,
                                 a.spans, a.nb, a.B, a.Tk, a.H, a.Hk, a.d);
    }
    ctx = saved;
    int same = 1;
    for (size_t i = 0; i < (size_t)a.H * a.Q; i++)
        same &= memcmp(&lse1[i], &a.lse[i], 4) == 0;
    CHECK(same);
    CHECK(max_diff(dq[0], dq[1], a.nq) == 0.0 && max_diff(dk[0], dk[1], a.nk) == 0.0 &&
          max_diff(dv[0], dv[1], a.nk) == 0.0 && max_abs(dk[0], a.nk) > 0.0);
    for (int i = 0; i < 2; i++)
        free(dq[i]), free(dk[i]), free(dv[i]);
    free(lse1);
    blk_free(&a);
    nn_cpu_destroy(&c1);
    nn_cpu_destroy(&c2);
    CHECK(c1 == NULL && c2 == NULL);
}

/* ---- lm_head + cross-entropy ---- */

typedef struct {
    float *dh, *h, *W, *wts, *scratch;
    int32_t *labels, *correct;
    float sums[2];
    int Q, D, V, chunk;
    float inv_norm;
} xent_t;
static double xent_loss(void *a_) {
    xent_t *a = a_;
    ops->lm_head_xent(ctx, NULL, a->sums, NULL, a->h, a->W, a->labels, a->wts, a->inv_norm,
                      a->scratch, a->Q, a->D, a->V, a->chunk);
    return (double)a->sums[0] * a->inv_norm;
}

static void test_lm_head_xent(void) {
    int Q = 7, D = 6, V = 11, chunk = 3;
    xent_t a = {zeros((size_t)Q * D),
                rnd((size_t)Q * D, 1),
                rnd((size_t)V * D, 1),
                zeros(Q),
                zeros((size_t)chunk * V),
                malloc(Q * 4),
                malloc(Q * 4),
                {0, 0},
                Q,
                D,
                V,
                chunk,
                0.37f};
    for (int r = 0; r < Q; r++) {
        a.labels[r] = (r * 5) % V;
        a.wts[r] = (r == 2 || r == 5) ? 0.0f : 0.5f + 0.1f * r;
    }
    ops->lm_head_xent(ctx, a.dh, a.sums, a.correct, a.h, a.W, a.labels, a.wts, a.inv_norm,
                      a.scratch, Q, D, V, chunk);
    /* the loss and weight sum against a double computation */
    double loss = 0.0, wsum = 0.0;
    int ok_correct = 1;
    for (int r = 0; r < Q; r++) {
        double lg[64], mx = -INFINITY;
        int am = 0;
        for (int v = 0; v < V; v++) {
            lg[v] = dot_d(a.h + (size_t)r * D, a.W + (size_t)v * D, D);
            if (lg[v] > mx) mx = lg[v], am = v;
        }
        ok_correct &= a.correct[r] == (am == a.labels[r]);
        if (a.wts[r] <= 0) continue;
        double se = 0.0;
        for (int v = 0; v < V; v++)
            se += exp(lg[v] - mx);
        loss += a.wts[r] * (mx + log(se) - lg[a.labels[r]]);
        wsum += a.wts[r];
    }
    CHECK_NEAR(a.sums[0], loss, 1e-4 * loss);
    CHECK_NEAR(a.sums[1], wsum, 1e-5);
    CHECK(ok_correct);
    /* rows with weight 0 get dh = 0 (overwritten) */
    CHECK(max_abs(a.dh + 2 * D, D) == 0.0 && max_abs(a.dh + 5 * D, D) == 0.0);
    CHECK(max_abs(a.dh, D) > 0.0);
    /* dh is d(inv_norm * loss_sum)/dh */
    CHECK(fd_error("lm_head_xent dh", a.h, a.dh, (size_t)Q * D, xent_loss, &a, 1e-2f) < FD_TOL);

    /* the chunk size does not change the result */
    xent_loss(&a); /* the fd loop left sums from a perturbed h */
    float *dh2 = rnd((size_t)Q * D, 3), *scr2 = zeros((size_t)Q * V), sums2[2];
    ops->lm_head_xent(ctx, dh2, sums2, NULL, a.h, a.W, a.labels, a.wts, a.inv_norm, scr2, Q, D, V,
                      Q);
    CHECK(max_diff(dh2, a.dh, (size_t)Q * D) < 1e-6);
    CHECK_NEAR(sums2[0], a.sums[0], 1e-5);

    /* greedy argmax agrees with the correct flags: label := argmax makes every row correct */
    int32_t am[7];
    ops->lm_head_argmax(ctx, am, a.h, a.W, a.scratch, Q, D, V, chunk);
    ops->lm_head_xent(ctx, NULL, sums2, a.correct, a.h, a.W, am, a.wts, 1.0f, a.scratch, Q, D, V,
                      chunk);
    int all = 1;
    for (int r = 0; r < Q; r++)
        all &= a.correct[r] == 1;
    CHECK(all);
    free(a.dh), free(a.h), free(a.W), free(a.wts), free(a.scratch), free(a.labels), free(a.correct);
    free(dh2), free(scr2);
}

/* ---- optimizer and small ops ---- */

static void test_adamw(void) {
    /* p = 1, g = 0.5 scaled by 2 -> 1; lr 0.1, wd 0.01, betas (0.9, 0.999):
     * step 1: m = 0.1, v = 0.001, mhat = vhat = 1: p = 1 * (1 - 0.001) - 0.1 * 1 / (1 + eps)
     * step 2: m = 0.19, v = 0.001999, mhat = vhat = 1: p = 0.899 * 0.999 - 0.1 */
    float p[2] = {1.0f, -2.0f}, act[2] = {0, 0}, g[2] = {0.5f, 0.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    ops->adamw(ctx, p, act, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2.0f, 1);
    CHECK_NEAR(p[0], 0.899, 1e-6);
    CHECK_NEAR(m[0], 0.1, 1e-7);
    CHECK_NEAR(v[0], 0.001, 2e-8);        /* 1 - 0.999f is 0.00099998713 */
    CHECK_NEAR(p[1], -2.0 * 0.999, 1e-6); /* zero gradient: only the decay */
    CHECK(act[0] == p[0] && act[1] == p[1]);
    ops->adamw(ctx, p, NULL, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2.0f, 2);
    CHECK_NEAR(p[0], 0.899 * 0.999 - 0.1, 1e-6);
    /* eps is added to the bias-corrected root, outside the square root: a large eps (0.5) at
     * step 2 tells that apart from sqrt(vhat + eps) and from (sqrt(v) + eps) / sqrt(1 - b2^t) */
    float pe = 1.0f, ge = 0.5f, me = 0.1f, ve = 0.01f;
    ops->adamw(ctx, &pe, NULL, &ge, &me, &ve, 1, 0.1f, 0.9f, 0.999f, 0.5f, 0.0f, 1.0f, 2);
    double me2 = 0.9 * 0.1 + 0.1 * 0.5, ve2 = 0.999 * 0.01 + 0.001 * 0.25;
    CHECK_NEAR(pe, 1.0 - 0.1 * (me2 / (1 - 0.81)) / (sqrt(ve2) / sqrt(1 - 0.998001) + 0.5), 1e-6);

    float s;
    ops->sumsq(ctx, &s, NULL, 0, (float[]){3, -4, 12}, 3);
    CHECK_NEAR(s, 169.0, 1e-6);
    ops->sumsq(ctx, &s, (float[]){1, 2}, 2, (float[]){3, -4, 12}, 3); /* act part + fp32 part */
    CHECK_NEAR(s, 174.0, 1e-6);

    /* adamw_clip: the clip factor from sumsq equals an explicit grad_scale; under the clip
     * threshold the gradient is used as is */
    float pa[2] = {1.0f, -2.0f}, ma[2] = {0, 0}, va[2] = {0, 0}, ga[2] = {3.0f, 4.0f};
    float pb[2] = {1.0f, -2.0f}, mb[2] = {0, 0}, vb[2] = {0, 0};
    float sq = 25.0f; /* norm 5 */
    ops->adamw_clip(ctx, pa, NULL, ga, ma, va, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, &sq, 1.0f, 1);
    ops->adamw(ctx, pb, NULL, ga, mb, vb, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f / (5.0f + 1e-6f),
               1);
    CHECK(pa[0] == pb[0] && pa[1] == pb[1] && ma[0] == mb[0] && va[1] == vb[1]);
    CHECK_NEAR(ma[0], 0.1 * 3.0 / 5.0, 1e-6);
    ops->adamw_clip(ctx, pa, NULL, ga, ma, va, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, &sq, 10.0f, 2);
    ops->adamw(ctx, pb, NULL, ga, mb, vb, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 2);
    CHECK(pa[0] == pb[0] && ma[1] == mb[1]);
    CHECK_NEAR(NN_CLIP_SCALE(25.0f, 0.0f), 1.0, 0); /* clip <= 0: none */
    /* adamw_clip_act: the same update from an act gradient (fp32 on cpu) */
    ops->adamw_clip_act(ctx, pa, NULL, NULL, ga, ma, va, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, &sq,
                        1.0f, 3);
    ops->adamw_clip(ctx, pb, NULL, ga, mb, vb, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, &sq, 1.0f, 3);
    CHECK(pa[0] == pb[0] && pa[1] == pb[1] && ma[0] == mb[0] && va[1] == vb[1]);

    /* linear_fwd_res: y = res + x w^T, in place (res = y) or not */
    float yl[2] = {10.0f, 20.0f}, xl[3] = {1, 2, 3}, wl[6] = {1, 0, 0, 0, 1, 1}, y2[2];
    ops->linear_fwd_res(ctx, y2, xl, wl, yl, 1, 3, 2);
    ops->linear_fwd_res(ctx, yl, xl, wl, yl, 1, 3, 2);
    CHECK(yl[0] == 11.0f && yl[1] == 25.0f && y2[0] == 11.0f && y2[1] == 25.0f);

    float x[3] = {1, -2, 4};
    ops->scale_f32(ctx, x, 3, 0.5f);
    CHECK(x[0] == 0.5f && x[1] == -1.0f && x[2] == 2.0f);
    ops->scale_act(ctx, x, 3, 2.0f);
    CHECK(x[0] == 1.0f && x[1] == -2.0f && x[2] == 4.0f);
}

static void test_embedding_and_memory(void) {
    float table[3 * 2] = {1, 2, 3, 4, 5, 6}, out[4 * 2];
    int32_t ids[4] = {2, 0, 2, 1};
    ops->embedding_fwd(ctx, out, ids, table, 4, 2);
    CHECK(out[0] == 5 && out[1] == 6 && out[2] == 1 && out[7] == 4);

    float *b = ops->alloc(ctx, 10 * sizeof(float));
    CHECK(b != NULL && max_abs(b, 10) == 0.0);
    ops->upload(ctx, b, table, 6);
    float back[6];
    ops->download(ctx, back, b, 6);
    CHECK(memcmp(back, table, sizeof(back)) == 0);
    ops->zero(ctx, b, 10 * sizeof(float));
    CHECK(max_abs(b, 10) == 0.0);
    ops->free(ctx, b);
    ops->free(ctx, NULL);
    CHECK(ops->act_bytes == sizeof(float) && strcmp(ops->name, "cpu") == 0);
}

int main(void) {
    ops = nn_cpu_ops();
    ctx = nn_cpu_new(2);
    CHECK(ctx != NULL);
    test_rmsnorm();
    test_linear();
    test_head_norm_rope();
    test_qkv_norm_rope();
    test_swiglu();
    test_attention_causal();
    test_attention_block();
    test_attention_threads();
    test_lm_head_xent();
    test_adamw();
    test_embedding_and_memory();
    nn_cpu_destroy(&ctx);
    CHECK_DONE();
}
