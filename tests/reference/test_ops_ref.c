/* test_ops_ref: the cpu ops against the PyTorch oracle (ops_ref.py).
 *
 * Reads the dump ops_ref.py wrote (path in argv[1]), runs each op of the cpu backend on the same
 * float32 inputs and compares every output and gradient with the float64 torch result:
 * max|ours - ref| / max|ref| must be <= 1e-4 (exact for integer outputs). Prints one line per
 * tensor; exits 1 on any mismatch, 2 if the dump is missing or malformed.
 */
#include "model_config.h"
#include "ops.h"
#include "refdump.h"

#define TOL 1e-4

static const nn_ops *ops;
static nn_ctx *ctx;

static float *buf(size_t n) /* garbage-filled, so an op that forgets to write is caught */
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = 1e30f;
    return p;
}

static int check_rmsnorm(const refdump *d) {
    int R = refdump_dim(d, "rmsnorm.x", 0), C = refdump_dim(d, "rmsnorm.x", 1);
    size_t n = (size_t)R * C;
    const float *x = refdump_f32(d, "rmsnorm.x", n), *w = refdump_f32(d, "rmsnorm.w", C),
                *dout = refdump_f32(d, "rmsnorm.dout", n);
    float *out = buf(n), *rstd = buf(R), *dx = buf(n), *dw = calloc(C, sizeof(float));
    ops->rmsnorm_fwd(ctx, out, rstd, x, w, R, C, refdump_scalar(d, "rmsnorm.eps"));
    ops->rmsnorm_bwd(ctx, dx, dw, dout, x, w, rstd, R, C, NULL);
    int bad = refdump_check(d, "rmsnorm.out", out, n, TOL) +
              refdump_check(d, "rmsnorm.rstd", rstd, R, TOL) +
              refdump_check(d, "rmsnorm.dx", dx, n, TOL) +
              refdump_check(d, "rmsnorm.dw", dw, C, TOL);
    free(out), free(rstd), free(dx), free(dw);
    return bad;
}

static int check_linear(const refdump *d) {
    int M = refdump_dim(d, "linear.x", 0), K = refdump_dim(d, "linear.x", 1),
        N = refdump_dim(d, "linear.w", 0);
    const float *x = refdump_f32(d, "linear.x", (size_t)M * K),
                *w = refdump_f32(d, "linear.w", (size_t)N * K), *b = refdump_f32(d, "linear.b", N),
                *dout = refdump_f32(d, "linear.dout", (size_t)M * N);
    float *y = buf((size_t)M * N), *dx = buf((size_t)M * K), *dw = calloc((size_t)N * K, 4),
          *db = calloc(N, 4);
    ops->linear_fwd(ctx, y, x, w, b, M, K, N);
    ops->linear_bwd(ctx, dx, dw, db, dout, x, w, M, K, N, 0);
    int bad = refdump_check(d, "linear.y", y, (size_t)M * N, TOL) +
              refdump_check(d, "linear.dx", dx, (size_t)M * K, TOL) +
              refdump_check(d, "linear.dw", dw, (size_t)N * K, TOL) +
              refdump_check(d, "linear.db", db, N, TOL);
    free(y), free(dx), free(dw), free(db);
    return bad;
}

/* head_norm_rope (a per-head RMSNorm then RoPE, the q/k path): the dump's rope.* entries */
static int check_rope(const refdump *d) {
    int T = refdump_dim(d, "rope.x", 0), nh = refdump_dim(d, "rope.x", 1),
        hd = refdump_dim(d, "rope.x", 2);
    size_t n = (size_t)T * nh * hd;
    const int32_t *pos = refdump_i32(d, "rope.pos", T);
    float *inv = buf(hd / 2), *out = buf(n), *dx = buf(n), *dw = calloc(hd, sizeof(float));
    float *rot = buf((size_t)T * hd);
    /* the host frequency table (rope.c) against Hugging Face's fp32 one; the op itself then runs
     * on Hugging Face's table, so that a last-bit difference of the table (which grows with the
     * position: ~3e-5 at 4096) does not hide or fake an error of the op */
    rope_inv_freq(inv, hd, refdump_scalar(d, "rope.theta"), NULL);
    int bad = refdump_check_each(d, "rope.inv_freq", inv, hd / 2, TOL);
    memcpy(inv, refdump_f32(d, "rope.inv_freq", hd / 2), hd / 2 * sizeof(float));
    const float *x = refdump_f32(d, "rope.x", n), *w = refdump_f32(d, "rope.w", hd),
                *dout = refdump_f32(d, "rope.dout", n);
    float eps = refdump_scalar(d, "rope.eps");
    ops->rope_table(ctx, rot, pos, inv, T, hd);
    ops->head_norm_rope_fwd(ctx, out, x, w, rot, T, nh, hd, eps);
    ops->head_norm_rope_bwd(ctx, dx, dw, dout, x, w, rot, T, nh, hd, eps);
    bad += refdump_check(d, "rope.out", out, n, TOL) + refdump_check(d, "rope.dx", dx, n, TOL) +
           refdump_check(d, "rope.dw", dw, hd, TOL);
    free(inv), free(out), free(dx), free(dw), free(rot);
    return bad;
}

/* rope.c's Llama-3 scaled table against Hugging Face's _compute_llama3_parameters */
static int check_rope_llama3(const refdump *d) {
    const float *p = refdump_f32(d, "rope_llama3.params", 6);
    int hd = (int)p[0];
    rope_llama3_scaling sc = {.enabled = true,
                              .factor = p[2],
                              .low_freq_factor = p[3],
                              .high_freq_factor = p[4],
                              .original_max_position_embeddings = (int)p[5]};
    float *inv = buf(hd / 2);
    rope_inv_freq(inv, hd, p[1], &sc);
    int bad = refdump_check_each(d, "rope_llama3.inv_freq", inv, hd / 2, TOL);
    free(inv);
    return bad;
}

static int check_swiglu(const refdump *d) {
    int R = refdump_dim(d, "swiglu.gate", 0), F = refdump_dim(d, "swiglu.gate", 1);
    size_t n = (size_t)R * F;
    const float *g = refdump_f32(d, "swiglu.gate", n), *u = refdump_f32(d, "swiglu.up", n),
                *dout = refdump_f32(d, "swiglu.dout", n);
    float *out = buf(n), *dg = buf(n), *du = buf(n), *gu = buf(2 * n), *dgu = buf(2 * n);
    for (size_t r = 0; r < (size_t)R; r++) { /* the ops' layout: gate | up per row */
        memcpy(gu + r * 2 * F, g + r * F, (size_t)F * sizeof(float));
        memcpy(gu + r * 2 * F + F, u + r * F, (size_t)F * sizeof(float));
    }
    ops->swiglu_fwd(ctx, out, gu, R, F);
    ops->swiglu_bwd(ctx, dgu, dout, gu, R, F);
    for (size_t r = 0; r < (size_t)R; r++) {
        memcpy(dg + r * F, dgu + r * 2 * F, (size_t)F * sizeof(float));
        memcpy(du + r * F, dgu + r * 2 * F + F, (size_t)F * sizeof(float));
    }
    free(gu), free(dgu);
    int bad = refdump_check(d, "swiglu.out", out, n, TOL) +
              refdump_check(d, "swiglu.dgate", dg, n, TOL) +
              refdump_check(d, "swiglu.dup", du, n, TOL);
    free(out), free(dg), free(du);
    return bad;
}

static int check_attention_causal(const refdump *d) {
    int T = refdump_dim(d, "attention_causal.q", 0), H = refdump_dim(d, "attention_causal.q", 1),
        hd = refdump_dim(d, "attention_causal.q", 2), Hk = refdump_dim(d, "attention_causal.k", 1);
    int ns = refdump_dim(d, "attention_causal.seq_off", 0) - 1;
    float *out = buf((size_t)T * H * hd);
    ops->attention_causal_fwd(ctx, out, refdump_f32(d, "attention_causal.q", 0),
                              refdump_f32(d, "attention_causal.k", (size_t)T * Hk * hd),
                              refdump_f32(d, "attention_causal.v", (size_t)T * Hk * hd),
                              refdump_i32(d, "attention_causal.seq_off", 0), ns, T, H, Hk, hd);
    int bad = refdump_check(d, "attention_causal.out", out, (size_t)T * H * hd, TOL);
    free(out);
    return bad;
}

static int check_attention_block(const refdump *d) {
    int Q = refdump_dim(d, "attention_block.q", 0), H = refdump_dim(d, "attention_block.q", 1),
        hd = refdump_dim(d, "attention_block.q", 2), Tk = refdump_dim(d, "attention_block.k", 0),
        Hk = refdump_dim(d, "attention_block.k", 1);
    int nb = refdump_dim(d, "attention_block.spans", 0), B = Q / nb;
    const int32_t *sp = refdump_i32(d, "attention_block.spans", (size_t)nb * 4);
    nn_block_span *spans = malloc(nb * sizeof(*spans));
    for (int j = 0; j < nb; j++)
        spans[j] = (nn_block_span){sp[4 * j], sp[4 * j + 1], sp[4 * j + 2], sp[4 * j + 3]};
    size_t nq = (size_t)Q * H * hd, nk = (size_t)Tk * Hk * hd;
    const float *q = refdump_f32(d, "attention_block.q", nq),
                *k = refdump_f32(d, "attention_block.k", nk),
                *v = refdump_f32(d, "attention_block.v", nk),
                *dout = refdump_f32(d, "attention_block.dout", nq);
    float *out = buf(nq), *lse = buf((size_t)H * Q), *dq = buf(nq), *dk = buf(nk), *dv = buf(nk);
    ops->attention_block_fwd(ctx, out, lse, q, k, v, spans, nb, B, Tk, H, Hk, hd);
    ops->attention_block_bwd(ctx, dq, dk, dv, dout, q, k, v, out, lse, spans, nb, B, Tk, H, Hk, hd);
    int bad = refdump_check(d, "attention_block.out", out, nq, TOL) +
              refdump_check(d, "attention_block.lse", lse, (size_t)H * Q, TOL) +
              refdump_check(d, "attention_block.dq", dq, nq, TOL) +
              refdump_check(d, "attention_block.dk", dk, nk, TOL) +
              refdump_check(d, "attention_block.dv", dv, nk, TOL);
    free(spans), free(out), free(lse), free(dq), free(dk), free(dv);
    return bad;
}

static int check_lm_head_xent(const refdump *d) {
    int Q = refdump_dim(d, "lm_head_xent.h", 0), D = refdump_dim(d, "lm_head_xent.h", 1),
        V = refdump_dim(d, "lm_head_xent.W", 0);
    int chunk = refdump_i32(d, "lm_head_xent.chunk", 1)[0];
    const float *h = refdump_f32(d, "lm_head_xent.h", (size_t)Q * D),
                *W = refdump_f32(d, "lm_head_xent.W", (size_t)V * D);
    const int32_t *labels = refdump_i32(d, "lm_head_xent.labels", Q);
    float *dh = buf((size_t)Q * D), *scratch = buf((size_t)chunk * V), sums[2];
    int32_t *correct = malloc(Q * sizeof(int32_t)), *am = malloc(Q * sizeof(int32_t));
    ops->lm_head_xent(ctx, dh, sums, correct, h, W, labels,
                      refdump_f32(d, "lm_head_xent.weights", Q),
                      refdump_scalar(d, "lm_head_xent.inv_norm"), scratch, Q, D, V, chunk);
    ops->lm_head_argmax(ctx, am, h, W, scratch, Q, D, V, chunk);
    int bad = refdump_check(d, "lm_head_xent.sums", sums, 2, TOL) +
              refdump_check(d, "lm_head_xent.dh", dh, (size_t)Q * D, TOL) +
              refdump_check_i32(d, "lm_head_xent.correct", correct, Q) +
              refdump_check_i32(d, "lm_head_xent.argmax", am, Q);
    free(dh), free(scratch), free(correct), free(am);
    return bad;
}

static int check_adamw(const refdump *d) {
    int steps = refdump_dim(d, "adamw.grads", 0), n = refdump_dim(d, "adamw.grads", 1);
    const float *hp = refdump_f32(d, "adamw.hyper", 6), *grads = refdump_f32(d, "adamw.grads", 0);
    float *p = malloc(n * sizeof(float)), *act = buf(n), *m = calloc(n, 4), *v = calloc(n, 4);
    memcpy(p, refdump_f32(d, "adamw.p0", n), n * sizeof(float));
    for (int s = 0; s < steps; s++)
        ops->adamw(ctx, p, act, grads + (size_t)s * n, m, v, n, hp[0], hp[1], hp[2], hp[3], hp[4],
                   hp[5], s + 1);
    int bad = refdump_check(d, "adamw.p", p, n, TOL) + refdump_check(d, "adamw.p", act, n, TOL) +
              refdump_check(d, "adamw.m", m, n, TOL) + refdump_check(d, "adamw.v", v, n, TOL);
    free(p), free(act), free(m), free(v);
    return bad;
}

static int check_embedding(const refdump *d) {
    int T = refdump_dim(d, "embedding.ids", 0), D = refdump_dim(d, "embedding.table", 1);
    float *out = buf((size_t)T * D);
    ops->embedding_fwd(ctx, out, refdump_i32(d, "embedding.ids", T),
                       refdump_f32(d, "embedding.table", 0), T, D);
    int bad = refdump_check(d, "embedding.out", out, (size_t)T * D, 0.0);
    free(out);
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DUMP\n", argv[0]);
        return 2;
    }
    refdump *d = refdump_load(argv[1]);
    if (!d) return 2;
    ops = nn_cpu_ops();
    ctx = nn_cpu_new(2);
    int bad = check_rmsnorm(d) + check_linear(d) + check_rope(d) + check_rope_llama3(d) +
              check_swiglu(d) + check_attention_causal(d) + check_attention_block(d) +
              check_lm_head_xent(d) + check_adamw(d) + check_embedding(d);
    nn_cpu_destroy(&ctx);
    refdump_free(&d);
    printf("%s: %d mismatching tensor(s)\n", bad ? "FAIL" : "PASS", bad);
    return bad ? 1 : 0;
}
