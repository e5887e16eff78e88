/* opprof.h: per-op GPU time of a model run on the cuda backend, for bench-target and
 * bench-drafter (header-only; include after ops_cuda.h and cuda_runtime_api.h).
 *
 * prof_ops(real, ctx) returns a copy of the cuda ops table whose compute and copy entries record
 * a CUDA event pair around the real call on the context's stream while prof_begin() ..
 * prof_end() is active (otherwise they only forward). A model built on that table runs as usual;
 * prof_end() synchronises, sums each op's event time and prints a table: calls, total ms, share
 * of the summed op time, and TFLOP/s for the matmuls (2*M*K*N forward; 2*M*K*N per product in
 * backward), then the same for every matmul shape (forward, backward dx, backward dw). Only an
 * extra, untimed pass is profiled: the event records do not perturb the timed passes. Gaps
 * between ops (host launch latency) show as the difference between the wall time and the
 * summed op time. The profiled pass runs every op on the main stream (no side stream).
 * DFLASH_PROF_SEQ=1 also lists the first half of the profiled ops one by one in queue order
 * (bench-drafter: its first of two profiled steps), each with the running sum of op times, the
 * op or matmul shape, ms and TFLOP/s: a product's rate by its place in the step.
 */
#ifndef DFLASH_BENCH_OPPROF_H
#define DFLASH_BENCH_OPPROF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opnames.h" /* the ops' indices and names, and BENCH_FREE's op sets */

#define PO_MAXEV 65536
static const nn_ops *po_real;
static nn_ops po_tab;
static cudaStream_t po_st;
static cudaEvent_t po_ev[PO_MAXEV];
static int po_op[PO_MAXEV / 2];
static double po_flop[PO_MAXEV / 2];
static int po_shape[PO_MAXEV / 2];
static int po_n, po_on;
static double po_ms[PO_N], po_tf[PO_N];
static long po_calls[PO_N];

static int po_start(void) {
    if (!po_on || po_n + 2 > PO_MAXEV) return -1;
    int i = po_n;
    po_n += 2;
    cudaEventRecord(po_ev[i], po_st);
    return i;
}
static void po_stop(int i, int op, double flop) {
    if (i < 0) return;
    cudaEventRecord(po_ev[i + 1], po_st);
    po_op[i / 2] = op;
    po_flop[i / 2] = flop;
    po_shape[i / 2] = -1;
}

/* Matmul shapes: each linear call's (kind, M, K, N) is recorded with its event pair, so that
 * prof_end can print the time and rate per shape (kind: 0 forward, 1 forward + residual,
 * 2 backward dx, 3 backward dw, 4 both). */
#define PO_SHAPES 128
typedef struct {
    int kind, M, K, N;
    long calls;
    double ms, flop;
} po_shape_row;
static po_shape_row po_shapes[PO_SHAPES];
static int po_nshapes;
static const char *po_kind_names[5] = {"fwd", "fwd+res", "bwd dx", "bwd dw", "bwd dx+dw"};

static void po_stop_shape(int i, int op, double flop, int kind, int M, int K, int N) {
    po_stop(i, op, flop);
    if (i < 0) return;
    int s = 0;
    while (s < po_nshapes && !(po_shapes[s].kind == kind && po_shapes[s].M == M &&
                               po_shapes[s].K == K && po_shapes[s].N == N))
        s++;
    if (s == po_nshapes) {
        if (po_nshapes == PO_SHAPES) return;
        po_shapes[po_nshapes++] = (po_shape_row){kind, M, K, N, 0, 0, 0};
    }
    po_shape[i / 2] = s;
}
/* Ops left out (bench-drafter's BENCH_FREE): while bit op of po_free is set, the wrapped calls
 * of that op return at once, so a step runs as if it cost nothing, and its outputs keep what
 * its last real call wrote (real values, so the products after it run on real data, not on
 * zeros, which draw less power). The products (linear_fwd, linear_fwd_res, linear_bwd) are
 * never left out; lm_head_xent can be. */
static unsigned po_free;

#define PO_WRAP(op, flop, call)                                                                    \
    do {                                                                                           \
        if ((po_free >> (op)) & 1u) break;                                                         \
        int i_ = po_start();                                                                       \
        call;                                                                                      \
        po_stop(i_, op, flop);                                                                     \
    } while (0)

static void po_copy(nn_ctx *c, void *d, const void *s, size_t b) {
    PO_WRAP(PO_COPY, 0, po_real->copy(c, d, s, b));
}
static void po_copy2d(nn_ctx *c, void *d, size_t dp, const void *s, size_t sp, size_t w,
                      size_t r) {
    PO_WRAP(PO_COPY2D, 0, po_real->copy2d(c, d, dp, s, sp, w, r));
}
static void po_zero(nn_ctx *c, void *p, size_t b) {
    PO_WRAP(PO_ZERO, 0, po_real->zero(c, p, b));
}
static void po_scatter(nn_ctx *c, void *d, const int32_t *rows, const void *s, int n, size_t rb) {
    PO_WRAP(PO_SCATTER, 0, po_real->rows_scatter(c, d, rows, s, n, rb));
}
static void po_emb(nn_ctx *c, nn_buf *o, const int32_t *ids, const nn_buf *t, int T, int D) {
    PO_WRAP(PO_EMB, 0, po_real->embedding_fwd(c, o, ids, t, T, D));
}
static void po_rms(nn_ctx *c, nn_buf *o, float *r, const nn_buf *x, const nn_buf *w, int R, int C,
                   float e) {
    PO_WRAP(PO_RMS, 0, po_real->rmsnorm_fwd(c, o, r, x, w, R, C, e));
}
static void po_lin(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w, const nn_buf *b, int M,
                   int K, int N) {
    int i = po_start();
    po_real->linear_fwd(c, y, x, w, b, M, K, N);
    po_stop_shape(i, PO_LIN, 2.0 * M * K * N, 0, M, K, N);
}
static void po_linr(nn_ctx *c, nn_buf *y, const nn_buf *x, const nn_buf *w, const nn_buf *r,
                    int M, int K, int N) {
    int i = po_start();
    po_real->linear_fwd_res(c, y, x, w, r, M, K, N);
    po_stop_shape(i, PO_LIN, 2.0 * M * K * N, 1, M, K, N);
}
static void po_adamwc(nn_ctx *c, float *p, nn_buf *pa, const float *g, float *m, float *v,
                      size_t n, float lr, float b1, float b2, float eps, float wd, const float *sq,
                      float clip, int t) {
    PO_WRAP(PO_ADAMW, 0, po_real->adamw_clip(c, p, pa, g, m, v, n, lr, b1, b2, eps, wd, sq, clip, t));
}
static void po_adamwca(nn_ctx *c, float *p, nn_buf *pa, uint16_t *lo, const nn_buf *g, float *m,
                       float *v, size_t n, float lr, float b1, float b2, float eps, float wd,
                       const float *sq, float clip, int t) {
    PO_WRAP(PO_ADAMW, 0,
            po_real->adamw_clip_act(c, p, pa, lo, g, m, v, n, lr, b1, b2, eps, wd, sq, clip, t));
}
static void po_ropet(nn_ctx *c, float *rot, const int32_t *p, const float *f, int T, int d) {
    PO_WRAP(PO_ROPET, 0, po_real->rope_table(c, rot, p, f, T, d));
}
static void po_rope(nn_ctx *c, nn_buf *o, const nn_buf *x, const nn_buf *w, const float *rot,
                    int T, int nh, int d, float e) {
    PO_WRAP(PO_ROPE, 0, po_real->head_norm_rope_fwd(c, o, x, w, rot, T, nh, d, e));
}
static void po_qkv(nn_ctx *c, nn_buf *q, nn_buf *k, nn_buf *v, const nn_buf *qkv,
                   const nn_buf *qn, const nn_buf *kn, const float *rot, int T, int H, int Hk,
                   int d, float eps) {
    PO_WRAP(PO_QKV, 0, po_real->qkv_norm_rope_fwd(c, q, k, v, qkv, qn, kn, rot, T, H, Hk, d, eps));
}
static void po_attc(nn_ctx *c, nn_buf *o, const nn_buf *q, const nn_buf *k, const nn_buf *v,
                    const int32_t *so, int ns, int T, int H, int Hk, int d) {
    PO_WRAP(PO_ATTC, 0, po_real->attention_causal_fwd(c, o, q, k, v, so, ns, T, H, Hk, d));
}
static void po_attb(nn_ctx *c, nn_buf *o, float *l, const nn_buf *q, const nn_buf *k,
                    const nn_buf *v, const nn_block_span *sp, int nb, int B, int Tk, int H, int Hk,
                    int d) {
    PO_WRAP(PO_ATTB, 0, po_real->attention_block_fwd(c, o, l, q, k, v, sp, nb, B, Tk, H, Hk, d));
}
static void po_swi(nn_ctx *c, nn_buf *o, const nn_buf *gu, int R, int F) {
    PO_WRAP(PO_SWI, 0, po_real->swiglu_fwd(c, o, gu, R, F));
}
static void po_rmsb(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
                    const nn_buf *w, const float *r, int R, int C, const nn_buf *dres) {
    PO_WRAP(PO_RMSB, 0, po_real->rmsnorm_bwd(c, dx, dw, dy, x, w, r, R, C, dres));
}
static void po_linb(nn_ctx *c, nn_buf *dx, nn_buf *dw, float *db, const nn_buf *dy,
                    const nn_buf *x, const nn_buf *w, int M, int K, int N, int mode) {
    int i = po_start();
    po_real->linear_bwd(c, dx, dw, db, dy, x, w, M, K, N, mode);
    po_stop_shape(i, PO_LINB, 2.0 * M * K * N * ((dx ? 1 : 0) + (dw ? 1 : 0)),
                  dx && dw ? 4 : dx ? 2 : 3, M, K, N);
}
static void po_ropeb(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
                     const nn_buf *w, const float *rot, int T, int nh, int d, float e) {
    PO_WRAP(PO_ROPEB, 0, po_real->head_norm_rope_bwd(c, dx, dw, dy, x, w, rot, T, nh, d, e));
}
static void po_swib(nn_ctx *c, nn_buf *dgu, const nn_buf *dout, const nn_buf *gu, int R, int F) {
    PO_WRAP(PO_SWIB, 0, po_real->swiglu_bwd(c, dgu, dout, gu, R, F));
}
static void po_attbb(nn_ctx *c, nn_buf *dq, nn_buf *dk, nn_buf *dv, const nn_buf *dout,
                     const nn_buf *q, const nn_buf *k, const nn_buf *v, const nn_buf *out,
                     const float *lse, const nn_block_span *sp, int nb, int B, int Tk, int H,
                     int Hk, int d) {
    PO_WRAP(PO_ATTBB, 0,
            po_real->attention_block_bwd(c, dq, dk, dv, dout, q, k, v, out, lse, sp, nb, B, Tk, H,
                                         Hk, d));
}
static void po_xent(nn_ctx *c, nn_buf *dh, float *sums, int32_t *corr, const nn_buf *h,
                    const nn_buf *W, const int32_t *lab, const float *wt, float inv, nn_buf *scr,
                    int Q, int D, int V, int ch) {
    PO_WRAP(PO_XENT, 4.0 * Q * D * (double)V,
            po_real->lm_head_xent(c, dh, sums, corr, h, W, lab, wt, inv, scr, Q, D, V, ch));
}
static void po_argmax(nn_ctx *c, int32_t *o, const nn_buf *h, const nn_buf *W, nn_buf *scr, int Q,
                      int D, int V, int ch) {
    PO_WRAP(PO_ARGMAX, 2.0 * Q * D * (double)V, po_real->lm_head_argmax(c, o, h, W, scr, Q, D, V, ch));
}
static void po_sumsq(nn_ctx *c, float *o, const nn_buf *ga, size_t na, const float *g, size_t n) {
    PO_WRAP(PO_SUMSQ, 0, po_real->sumsq(c, o, ga, na, g, n));
}
static void po_adamw(nn_ctx *c, float *p, nn_buf *pa, const float *g, float *m, float *v, size_t n,
                     float lr, float b1, float b2, float eps, float wd, float gs, int t) {
    PO_WRAP(PO_ADAMW, 0, po_real->adamw(c, p, pa, g, m, v, n, lr, b1, b2, eps, wd, gs, t));
}
static void po_f2a(nn_ctx *c, nn_buf *d, const float *s, size_t n) {
    PO_WRAP(PO_F2A, 0, po_real->f32_to_act(c, d, s, n));
}

/* The side stream (ops.h) only outside the profiled region: there the ops run in order on the
 * stream whose events time them, so the optimizer's time is its own, not the overlap's. */
static void po_side_begin(nn_ctx *c) {
    if (!po_on) po_real->side_begin(c);
}
static void po_side_mark(nn_ctx *c, int k) {
    if (!po_on) po_real->side_mark(c, k);
}
static void po_side_end(nn_ctx *c) {
    if (!po_on) po_real->side_end(c);
}

static const nn_ops *prof_ops(const nn_ops *real, nn_ctx *ctx) {
    po_real = real;
    po_tab = *real;
    po_st = (cudaStream_t)nn_cuda_stream(ctx);
    for (int i = 0; i < PO_MAXEV; i++)
        cudaEventCreate(&po_ev[i]);
    po_tab.copy = po_copy, po_tab.copy2d = po_copy2d, po_tab.zero = po_zero;
    po_tab.rows_scatter = po_scatter;
    po_tab.embedding_fwd = po_emb, po_tab.rmsnorm_fwd = po_rms, po_tab.linear_fwd = po_lin;
    po_tab.rope_table = po_ropet;
    po_tab.head_norm_rope_fwd = po_rope, po_tab.attention_causal_fwd = po_attc;
    po_tab.qkv_norm_rope_fwd = po_qkv;
    po_tab.attention_block_fwd = po_attb, po_tab.swiglu_fwd = po_swi;
    po_tab.rmsnorm_bwd = po_rmsb, po_tab.linear_bwd = po_linb;
    po_tab.head_norm_rope_bwd = po_ropeb, po_tab.swiglu_bwd = po_swib;
    po_tab.attention_block_bwd = po_attbb;
    po_tab.lm_head_xent = po_xent, po_tab.lm_head_argmax = po_argmax, po_tab.sumsq = po_sumsq;
    po_tab.adamw = po_adamw, po_tab.f32_to_act = po_f2a;
    po_tab.linear_fwd_res = po_linr, po_tab.adamw_clip = po_adamwc;
    po_tab.adamw_clip_act = po_adamwca;
    po_tab.side_begin = po_side_begin, po_tab.side_mark = po_side_mark;
    po_tab.side_end = po_side_end; /* side_wait as it is: harmless in the profiled pass */
    return &po_tab;
}

static void prof_begin(void) {
    memset(po_ms, 0, sizeof po_ms), memset(po_tf, 0, sizeof po_tf);
    memset(po_calls, 0, sizeof po_calls);
    for (int s = 0; s < po_nshapes; s++)
        po_shapes[s].calls = 0, po_shapes[s].ms = po_shapes[s].flop = 0;
    po_n = 0;
    po_on = 1;
}

/* wall_ms: host wall time of the profiled region (for the gap line). extra_name/extra_flop:
 * FLOPs to attach to one op without a host-side count (attention), or NULL. */
static void prof_end(const char *title, double wall_ms, int attn_op, double attn_flop) {
    po_on = 0;
    cudaStreamSynchronize(po_st);
    double tot = 0;
    for (int i = 0; i < po_n; i += 2) {
        float ms = 0;
        cudaEventElapsedTime(&ms, po_ev[i], po_ev[i + 1]);
        int op = po_op[i / 2];
        po_ms[op] += ms, po_tf[op] += po_flop[i / 2], po_calls[op]++;
        tot += ms;
        int s = po_shape[i / 2];
        if (s < 0) continue;
        po_shapes[s].calls++, po_shapes[s].ms += ms, po_shapes[s].flop += po_flop[i / 2];
    }
    if (attn_op >= 0) po_tf[attn_op] += attn_flop;
    /* DFLASH_PROF_SEQ=1: the first half of the profiled ops one by one, in queue order */
    const char *seq = getenv("DFLASH_PROF_SEQ");
    if (seq && atoi(seq) > 0) {
        double at = 0;
        for (int i = 0; i < po_n / 2; i += 2) {
            float ms = 0;
            cudaEventElapsedTime(&ms, po_ev[i], po_ev[i + 1]);
            int s = po_shape[i / 2];
            at += ms;
            if (s < 0) {
                printf("   seq %4d %9.3f %-22s %8.3f ms\n", i / 2, at, po_names[po_op[i / 2]], ms);
                continue;
            }
            const po_shape_row *r = &po_shapes[s];
            printf("   seq %4d %9.3f %-10s %6d %6d %6d %8.3f ms %7.1f TFLOP/s\n", i / 2, at,
                   po_kind_names[r->kind], r->M, r->K, r->N, ms,
                   po_flop[i / 2] / (ms * 1e-3) / 1e12);
        }
    }
    printf("-- op profile: %s (%d ops, summed op time %.1f ms, wall %.1f ms%s) --\n", title,
           po_n / 2, tot, wall_ms, po_n + 2 > PO_MAXEV ? ", event pool full: partial" : "");
    printf("   %-22s %7s %10s %6s %9s\n", "op", "calls", "ms", "share", "TFLOP/s");
    for (int op = 0; op < PO_N; op++) {
        if (!po_calls[op]) continue;
        char tf[16] = "";
        if (po_tf[op] > 0) snprintf(tf, sizeof tf, "%.1f", po_tf[op] / (po_ms[op] * 1e-3) / 1e12);
        printf("   %-22s %7ld %10.2f %5.1f%% %9s\n", po_names[op], po_calls[op], po_ms[op],
               100 * po_ms[op] / tot, tf);
    }
    printf("   matmuls by shape (M rows, K in, N out):\n");
    printf("   %-10s %6s %6s %6s %6s %9s %9s\n", "kind", "M", "K", "N", "calls", "ms", "TFLOP/s");
    for (int s = 0; s < po_nshapes; s++) {
        const po_shape_row *r = &po_shapes[s];
        if (!r->calls) continue;
        printf("   %-10s %6d %6d %6d %6ld %9.3f %9.1f\n", po_kind_names[r->kind], r->M, r->K, r->N,
               r->calls, r->ms, r->flop / (r->ms * 1e-3) / 1e12);
    }
    fflush(stdout);
}

#endif
