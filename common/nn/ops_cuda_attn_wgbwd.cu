/* ops_cuda_attn_wgbwd: the fused DFlash block-attention backward on Hopper warpgroup MMA (wgmma,
 * sm_90a), head dim 128: k_wgb_fused, the same key-major pass as k_bwd_fused of
 * ops_cuda_attn_bwd.cu (read that file's comment first) with the products on wgmma instead of
 * mma.sync, and k_bwd_plan, its schedule. cuda_bwd_attention_block_bwd (ops_cuda_attn_bwd.cu)
 * runs it by default (DFLASH_CUDA_ATTN_BWD: wgmma, wgmma_seq = PIPE off, mma = k_bwd_fused; see
 * bwd_kernel there; wgmma is PP, below, where it can run, else PIPE) and runs k_bwd_fused when
 * cuda_wgb_attention_launch returns -1 (no sm_90a image or device, or a piece could visit more
 * than WGB_LIST blocks); it keeps the launches around it (k_bwd_rowD before: D = rowsum(dO *
 * O); k_bwd_dq_out after: dqacc to bf16 dq, times the scale for this kernel) and the split
 * scratch and tickets of dk, dv. This file and ops_cuda_attn_wgmma.cu alone build for sm_90a
 * (common/CMakeLists.txt).
 *
 * Schedule (DFLASH_CUDA_ATTN_FUSED_PIECES): the blocks that see a key tile are cut into pieces
 * by block ranges (bwd_piece_of; piece z of Z). sorted (default): k_bwd_plan (one CTA) counts
 * the blocks of every (tile, piece) and lists the non-empty ones heaviest first (bwd_item);
 * k_wgb_fused runs one CTA per SM, each taking items (x kv heads) from a counter until none is
 * left, so the heavy pieces (the first context tiles: every block sees tile 0) start first and
 * no CTA is launched for an empty piece; its pieces are about 2 DFLASH_CUDA_ATTN_SPLIT blocks
 * long (fewer pieces: less K, V loading, dk, dv atomics and pipeline start per block), shorter
 * in a small call unless that is given (bwd_piece_len in ops_cuda_attn_bwd.cu). blocks /
 * hits: one CTA per (tile, kv head, piece) of the grid, pieces by block ranges or by hit index.
 * A piece first lists its visits (wgb_list: all threads, a block each per round): the blocks of
 * its range (by hits: from its first hit on) that see the tile, each with its key ranges in the
 * tile as four bytes, so that a visit finds the next block and its key mask with two shared
 * loads (the span walk and span decoding per visit were ~100 instructions per warp).
 *
 * CTA: 2 warpgroups (256 threads, one CTA per SM) own WKT = 128 keys k0 .. of kv head hk;
 * warpgroup w keys k0 + 64 w .. + 63, warp q of it keys + 16 q .. (the M rows of its
 * accumulators: thread lane holds keys 16 q + lane / 4 and + 8), so a warp holds the same keys
 * as warp 4 w + q of k_bwd_fused and the shared tile end (dkdv_tile_out) applies unchanged.
 * Per visit (64 query rows: one block's 16 tokens x 4 heads at group 4), per warpgroup:
 *   S^T = K Q^T and dP^T = V dO^T (m64n64k16, 8 k-steps each, both operands K-major in shared
 *     memory), two commit groups (with PIPE dP^T waits until the previous dQ is out, below);
 *   once S^T is in: P^T = exp2(S^T scale log2e - lse log2e) (keys the block does not see get a
 *     -inf bias instead of -lse log2e: 0), packed to bf16 A fragments; dV += P^T dO issued
 *     (m64n128k16, A from registers, dO the MN-major B) while dP^T may still run;
 *   once dP^T is in: dS^T = P^T (dP^T - D), packed (the scale is left for the ends: dk times it
 *     before the tile end, dq in k_bwd_dq_out); dK += dS^T Q issued likewise; dS^T
 *     stored as bf16 to shared memory (core-matrix layout with the query rows contiguous:
 *     conflict-free 32-bit stores), fenced for the async proxy;
 *   one CTA barrier (all 128 keys of dS^T are in); dQ = dS K for the visit's 64 rows and the
 *     warpgroup's 64 of the 128 columns (m64n64k16, 8 k-steps over the CTA's keys, A = dS^T and
 *     B = K both MN-major: transpose bits set); once it is in, the two warps holding the same 16
 *     rows (warp q of each warpgroup) stage their column halves into one tile in which each
 *     query token's rows are contiguous, as in dqacc, and one lane hands each token's rows to
 *     the bulk-copy engine as one cp.reduce.async.bulk .add.f32 (4 per 16 rows at group 4; one
 *     per row and warp, lane by lane, cost 12% of the stall samples before).
 *     PIPE: dQ of visit i is issued at the start of visit i + 1 with S^T, its tile
 *     leaves while S^T runs, and dP^T follows (its accumulators reuse dQ's registers); dS^T is
 *     double-buffered. Visit 0 issues a dQ of the unused buffer that goes nowhere (a peeled
 *     first visit made ptxas spill). Without PIPE (wgmma_seq) dQ ends its own visit.
 * PIPE and wgmma_seq: two CTA barriers per visit, as k_bwd_fused: the first publishes the visit's
 * Q, dO, D, lse stage and frees the other stage, whose loads for the next visit (wgb_visit_load)
 * are issued once S^T (and dQ) are; the second publishes dS^T (and, through the dQ lane's wait
 * before it, frees the dQ staging). Q and dO of a visit arrive by tensor copies (TMA; wgb_maps):
 * one per tile through a 4-dimensional map of q, dout (d % 8, heads, tokens, d / 8: the box lands
 * in the column-major core-matrix layout below), issued by one lane each of warps 4 and 5 and
 * completing on the stage's mbarrier (one arrival per warp), which every thread waits for; per
 * 16-byte column (4 copies per warp) where the encoder refuses that map (DFLASH_CUDA_ATTN_TMA=1),
 * by cp.async (one division per thread, then steps of 16 rows) where a visit can hold padding rows
 * or start inside a token (FROWS % group or B group % FROWS nonzero) or DFLASH_CUDA_ATTN_TMA=0.
 * D and lse by cp.async (64 threads), waited for by every thread (PP: through the stage's
 * mbarrier). No wgmma is in flight across a visit's end (ptxas would serialise them). The stage
 * index goes through a shuffle so that the stage tiles' descriptors stay in uniform registers
 * (else each wgmma cost a 64-bit add, two R2UR and moves). Instructions per warp and visit
 * (ncu): 1400-1490 before wgb_visit_load and bwd_div_small, 1050 with them, 842 with the tensor
 * copies and visit lists, 704 with the uniform descriptors; at 0.21-0.25 issued per cycle and
 * scheduler (2 warps each) the kernel was bound by that count down to about 840, but 669 (lse
 * scaled once per row, the mask select only in warps with a masked key: tried, reverted) ran
 * no faster than 704: the warps now wait on wgmma results, the barriers and shared loads (wait
 * 19-21%, long scoreboard 19%, barrier 15%, short scoreboard 12-14% of the stall samples), so
 * the next gains need more independent work per warp (warpgroup ping-pong, larger visits).
 * PP, the default where every visit's Q and dO come by one tensor copy each (m.on 2: no padding
 * rows) and the encoder takes the map of dqacc (DFLASH_CUDA_ATTN_PP=0: PIPE there too): the
 * two warpgroups run with no CTA barrier in the visits, so one's elementwise work (P^T, dS^T,
 * the dQ staging) overlaps the other's products and waits (FA3's ping-pong; here they drift
 * apart on their own: making them take turns at issuing S^T, dP^T through named barriers ran
 * no faster). mbarriers do what the barriers did (step_pp): bar[st], the stage (the 2 tensor
 * copies, issued by warps 4 and 5, and the D, lse cp.async of threads 192-255 as
 * cp.async.mbarrier.arrive: 66 arrivals); bar[2 + p], visit i (p = i % 2) done (256 arrivals
 * after the visit's last wgmma wait: its stage, and the dS^T buffer that dQ of visit i - 1
 * read, are free; warpgroup 1 waits for visit i - 1's before it loads visit i + 1, every
 * thread before it stores dS^T of visit i); bar[4 + p], dS^T of visit i in (256 arrivals
 * after the stores and the proxy fence). dQ of visit i - 1 is issued in visit i once its dS^T
 * is computed, into S^T's registers (free by then), after the wait for the other warpgroup's
 * dS^T of visit i - 1 and before dK, so that its staging and reduction run while dK does
 * (-3% alone, -6% in the step's profile against dQ issued after dK and waited for with it;
 * NOTES "What a visit's parts cost"). dS^T is stored from dK's A fragments. Issued at the
 * start of visit i as in PIPE, that wait kept the warpgroups in step and ran slower than PIPE
 * (1.66 against 1.64 ms; PP 1.50 ms, run 2 of the NOTES section "Block backward: warpgroup
 * ping-pong"). A dQ left in flight into the next visit
 * (waited for after the next S^T) made ptxas serialise the wgmma (C7514), so PP's visits too
 * end with none in flight. PP's dQ leaves by tensor reductions per warp (dq_out_tma: each
 * warp stages its 16 rows x 64 columns as two 16 x 32 boxes of a map of dqacc, in its 128-byte
 * swizzle, and one lane issues two cp.reduce.async.bulk.tensor .add.f32), so warps need not
 * meet in pairs; in PIPE the same reductions ran 1% slower than the pairs' (run 1), kept there.
 * PP's Q, dO tiles are 128-byte-swizzled (SW, where the encoder takes those maps: box 64 x group
 * x FROWS / group x 2 of a map (d % 64, heads, tokens, d / 64), two blocks of FROWS rows of 128
 * bytes; S^T, dP^T read them K-major, 32 bytes per k16 step along the rows, then the second
 * block; dV, dK MN-major, LBO the block distance, 2048 bytes per k16 step): the unswizzled box's
 * 16-byte rows fetched every 32-byte sector twice (L2 throughput 66% -> 52%, -3%; NOTES section
 * "Block backward: swizzled tiles, bulk split ends"). DFLASH_CUDA_ATTN_PP=1: PP unswizzled.
 * Keys no row of the block sees (block-key tiles: 16 of 128 per visit; keys past Tk) are
 * computed and masked (P 0), never skipped: a branch around wgmma in flight serialises them.
 * Shared memory (d 128), the wgmma tiles in no-swizzle core matrices (wgmma.cuh; PP's Q, dO
 * swizzled, above): K, V 32 KB
 * each (WKT x D, the core-matrix layout of wgmma.cuh), 2 stages of Q and dO (16 KB each;
 * column-major core matrices: 16-byte column c of row r at byte c QCOL + 16 r, as one tensor
 * copy writes it), dS^T 16 KB (PIPE, PP: 2 buffers), the 4 warp pairs' dQ staging (34 KB; PP:
 * the 8 warps' boxes, 4 KB each, at 1024-byte alignment for the swizzle), 2 stages of D and
 * lse, the visit list (16 KB): 195 KB (PIPE, PP 211 KB). At the end K, V and the Q stages
 * serve as the row-major staging of dk, dv (stride D + 8, so dk at K and dv at the Q stages);
 * a split piece (nsplit > 1) stages its fp32 partials over K, V, the Q, dO stages and dS^T
 * (rows of 4 D + 16 bytes) and adds them into acc by one bulk reduction per key row and plane
 * (wgb_split_out), instead of float4 atomics whose queue stalled the warps
 * (DFLASH_CUDA_ATTN_SPLIT_OUT=atomics: those). Registers (ptxas): 255 (PIPE, PP; with 24-32
 * bytes of stack: the end's unrolled loads of attn_split_finish tipped the allocation) and
 * 255 (wgmma_seq, 104 bytes); before them 248-254 with no spills (a list rebuilt inside the
 * visit loop, for pieces longer than one list, made ptxas spill 400-600 bytes: hence WGB_LIST).
 * Numerics as k_bwd_fused: fp32 accumulators, P and dS (here unscaled) rounded to bf16 as the
 * products' inputs, dq summed in fp32 over key tiles in any order (not bitwise reproducible),
 * dk, dv one fp32 sum (split pieces: bulk reductions or atomics) rounded once. Masks and
 * conventions those of ops_cpu.c; padding rows (cp.async loads only) load zero Q and dO (and
 * D 0, lse 0), which makes their P^T dO, dS^T and dS^T Q zero whatever P is.
 * Stream: the caller's.
 */
#include "attn_bwd.cuh"
#include "attn_spans.cuh"
#include "config.h"
#include "mma_frag.cuh"
#include "ops_cuda.h"
#include "wgmma.cuh"

#include <cuda.h> /* CUtensorMap (the encoder is found through the runtime) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#define WKT WGB_KEYS /* keys per CTA: 2 warpgroups x 64 */

#define WLIST WGB_LIST /* the most blocks of a piece's visit list (wgb_list) */

#define QCOL (FROWS * 16) /* bytes of one 16-byte column of a visit's Q or dO tile */

/* The tensor maps of q and dout ([Q, H, D] bf16) for the visits' tensor-copy loads. on 2: dims
 * (8, H, Q, D / 8), the last one's stride 16 bytes, box 8 x group x FROWS / group x D / 8, a whole
 * tile in the column-major layout in one copy; on 1: dims (D, H, Q), box 8 x group x
 * FROWS / group, one 16-byte column of a visit's rows (QCOL bytes) per copy; on 0: none, the
 * visits load by cp.async (wgb_maps_make). */
struct wgb_maps {
    CUtensorMap q, dout, dq;
    int on;
    int dq_on; /* dq: the map of dqacc for PP's dQ reductions per warp (wgb_dq_map_make) */
    int sw;    /* 1: q, dout by 128-byte-swizzled maps (on 2; PP's SW tiles, wgb_maps_make) */
};

/* fp32 of a warp pair's dQ staging (16 rows x D, 8 words after each query token's rows) */
template <int D> __host__ __device__ static constexpr int wgb_pair_w(void) {
    return 16 * D + 16 * 8;
}

/* Shared-memory bytes for head dim D (see the file comment for the order). */
template <int D, bool PIPE> static constexpr size_t wgb_smem(void) {
    return (size_t)(2 * WKT + 4 * FROWS) * D * 2 + (size_t)(PIPE ? 2 : 1) * WKT * FROWS * 2 +
           (size_t)4 * wgb_pair_w<D>() * sizeof(float) + (size_t)4 * FROWS * sizeof(float) +
           (size_t)WLIST * sizeof(int2);
}

/* bar.sync on named barrier id (1 .. 15; 0 is __syncthreads) for n threads (whole warps) */
__device__ __forceinline__ void named_bar(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* Loads of visit it's Q and dO rows (q, dout [Q, H, D]) into the tiles Qs, dOs (column-major
 * core matrices: 16-byte column c of row r at byte c QCOL + 16 r; padding rows zero-filled) and
 * of its saved D and lse (dsave, lse [H, Q]; as saved) into Dr, Lr (padding rows 0, 0): 256
 * threads. By tensor copies (m.on; their bytes complete on bar, one arrival per warp; a visit
 * then has FROWS rows and its first row is a token's first head: wgb_maps_make's conditions):
 * lane 0 of warp 4 copies the Q tile, of warp 5 the dO tile (m.on 2), or lane 0 of warp w
 * columns 2 w, 2 w + 1 of both (m.on 1); else by cp.async: thread tid takes column
 * c = (tid / 8) % 16 of rows r0 + 16 k, r0 = 8 (tid / 128) + tid % 8, k = 0 .. 3, stepping its
 * query token and head by 16 rows (16 / group tokens, 16 % group heads; bwd_div_small's
 * divisions, B group < 2^20). D and lse by cp.async, row r by thread 192 + r. The copies' issue
 * sits in warpgroup 1 because warpgroup 0 issues the dQ reductions (dq_out): the warps meet
 * at two CTA barriers per visit. Left in flight (the caller commits). PP: warpgroup 1 alone
 * (m.on 2; lane 0 of warps 4, 5 the copies, threads 192-255 D and lse), the stage complete on
 * bar after 66 arrivals (2 with the copies' bytes, 64 by cp.async.mbarrier.arrive). */
template <int D, bool PP = false>
__device__ __forceinline__ void wgb_visit_load(const bwd_args &a, const wgb_maps &m, visit_item it,
                                               int hk, unsigned char *Qs, unsigned char *dOs,
                                               float *Dr, float *Lr, uint64_t *bar) {
    static_assert(D == 128 && FROWS == 64, "2 columns per warp, 4 chunks of 16 bytes per thread");
    const int tid = threadIdx.x, group = a.group, nrows = min(FROWS, a.B * group - it.cb);
    if (PP) { /* warpgroup 1 alone, m.on 2; the stage is complete at 66 arrivals */
        const int w = tid / 32;
        if (tid % 32 == 0 && (w == 4 || w == 5)) {
            const int t0 = it.blk * a.B + bwd_div_small(it.cb, a.inv_group);
            mb_arrive_tx(bar, D / 8 * QCOL);
            tma_load_4d(w == 5 ? dOs : Qs, w == 5 ? &m.dout : &m.q, 0, hk * group, t0, 0, bar);
        }
    } else if (m.on) {
        if (tid % 32 == 0) {
            const int w = tid / 32, t0 = it.blk * a.B + bwd_div_small(it.cb, a.inv_group);
            if (m.on == 2) {
                const bool cp = w == 4 || w == 5; /* Q by warp 4, dO by warp 5 */
                mb_arrive_tx(bar, cp ? D / 8 * QCOL : 0);
                if (cp)
                    tma_load_4d(w == 5 ? dOs : Qs, w == 5 ? &m.dout : &m.q, 0, hk * group, t0, 0,
                                bar);
            } else {
                mb_arrive_tx(bar, 4 * QCOL);
#pragma unroll
                for (int c = 2 * w; c < 2 * w + 2; c++) {
                    tma_load_3d(Qs + c * QCOL, &m.q, 8 * c, hk * group, t0, bar);
                    tma_load_3d(dOs + c * QCOL, &m.dout, 8 * c, hk * group, t0, bar);
                }
            }
        }
    } else {
        const int r0 = 8 * (tid / 128) + tid % 8, c = (tid / 8) % (D / 8);
        const int qr = it.cb + r0, dt = bwd_div_small(16, a.inv_group), dh = 16 - dt * group;
        int t = bwd_div_small(qr, a.inv_group), h = qr - t * group;
        t += it.blk * a.B;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const bool in = r0 + 16 * k < nrows;
            const size_t off = ((size_t)t * a.H + hk * group + h) * D + c * 8;
            const int dst = c * QCOL + 16 * (r0 + 16 * k);
            cp_async16(Qs + dst, in ? (const void *)(a.q + off) : a.q, in ? 16 : 0);
            cp_async16(dOs + dst, in ? (const void *)(a.dout + off) : a.dout, in ? 16 : 0);
            t += dt, h += dh;
            if (h >= group) h -= group, t++;
        }
    }
    const int r = tid - (256 - FROWS);
    if (r >= 0) { /* row r */
        size_t o = 0;
        if (r < nrows) {
            const int q2 = it.cb + r, t2 = bwd_div_small(q2, a.inv_group);
            o = (size_t)(hk * group + q2 - t2 * group) * (a.n_blocks * a.B) + it.blk * a.B + t2;
        }
        cp_async4(Dr + r, a.dsave + o, r < nrows ? 4 : 0);
        cp_async4(Lr + r, a.lse + o, r < nrows ? 4 : 0);
        if (PP) mb_arrive_cp_async(bar);
    }
}

/* A piece's visit list: of the blocks from blk0 on, below b_end, those that see keys
 * [k0, k0 + WKT) (attn_block_hits), in block order, the first min(lim, WLIST): lst[e] = {blk,
 * keys}, keys the block's (up to two) key ranges [lo, hi) in the tile, counted from k0 and
 * clipped to the tile and to Tk, one byte each (lo0 | hi0 << 8 | lo1 << 16 | hi1 << 24). Returns
 * the number listed. All threads (256); rounds of a.list_round <= 256 blocks (one per thread),
 * two CTA barriers each. */
__device__ __forceinline__ int wgb_list(const bwd_args &a, int k0, int blk0, int b_end, int lim,
                                        int2 *lst) {
    static_assert(WKT < 256, "key offsets in one byte");
    __shared__ int cnt[8];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    lim = min(lim, WLIST);
    int n = 0;
    for (int b0 = blk0; b0 < b_end && n < lim; b0 += a.list_round) { /* uniform */
        const int blk = b0 + tid;
        bool hit = false;
        uint32_t keys = 0;
        if (tid < a.list_round && blk < b_end) {
            int rg[4];
            const int nr = attn_span_ranges(a.spans + blk, a.B, rg);
            for (int r = 0; r < nr; r++) {
                hit = hit || (rg[2 * r] < k0 + WKT && rg[2 * r + 1] > k0);
                const int lo = min(max(rg[2 * r] - k0, 0), WKT);
                const int hi = min(max(min(rg[2 * r + 1], a.Tk) - k0, 0), WKT);
                keys |= (uint32_t)(lo | hi << 8) << (16 * r);
            }
        }
        const unsigned bal = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) cnt[warp] = __popc(bal);
        __syncthreads();
        int e = n + __popc(bal & ((1u << lane) - 1));
        for (int w = 0; w < 8; w++) {
            e += w < warp ? cnt[w] : 0;
            n += cnt[w];
        }
        if (hit && e < lim) lst[e] = make_int2(blk, (int)keys);
        __syncthreads(); /* also: cnt is read before the next round writes it */
    }
    return min(n, lim);
}

/* The end of a split piece (nsplit > 1) by bulk reductions: its fp32 dk, dv partials (warp w
 * keys 16 w .., the accumulator layout) staged at stg (key row r of plane p, 0 dk and 1 dv, at
 * byte (p WKT + r) WRS; WRS = 4 D + 16, so a warp's float2 stores hit 32 distinct banks), then
 * thread t adds row t % WKT of plane t / WKT into acc (as dkdv_tile_out: the dk plane, then the
 * dv plane) by one cp.reduce.async.bulk .add.f32 of 4 D bytes, waits for its completion and
 * makes it visible before attn_split_finish takes the ticket (the last piece converts). Replaces
 * the 2 D / 8 float4 atomics per thread of dkdv_tile_out, whose queue stalled the warps (5% of
 * the stall samples). All threads (2 WKT); stg free, 2 WKT WRS bytes. */
template <int D>
__device__ __forceinline__ void wgb_split_out(const bwd_args &a, const float (&dk)[D / 8][4],
                                              const float (&dv)[D / 8][4], unsigned char *stg,
                                              int nsplit, int k0, int hk, int *ticket) {
    constexpr int WRS = 4 * D + 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    unsigned char *w0 = stg + (16 * warp + g) * WRS + 8 * tg;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        *(float2 *)(w0 + 32 * j) = make_float2(dk[j][0], dk[j][1]);
        *(float2 *)(w0 + 8 * WRS + 32 * j) = make_float2(dk[j][2], dk[j][3]);
        *(float2 *)(w0 + WKT * WRS + 32 * j) = make_float2(dv[j][0], dv[j][1]);
        *(float2 *)(w0 + (WKT + 8) * WRS + 32 * j) = make_float2(dv[j][2], dv[j][3]);
    }
    fence_proxy_async();
    __syncthreads();
    const size_t plane = (size_t)a.Tk * a.Hk * D;
    const int r = threadIdx.x % WKT, p = threadIdx.x / WKT;
    if (k0 + r < a.Tk) {
        float *dst = a.acc + p * plane + ((size_t)(k0 + r) * a.Hk + hk) * D;
        bulk_red_add(dst, (const float *)(stg + (p * WKT + r) * WRS), D * (int)sizeof(float));
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
    }
    attn_split_finish<D>(a.acc, plane, ticket, nsplit, k0, WKT, a.Tk, a.Hk, hk, a.dk, a.dv);
}

/* One piece of one key tile (see the file comment): keys k0 .. k0 + WKT - 1 of kv head hk, the
 * visits of hit indices [h_lo, h_hi), nsplit pieces of the tile (dk, dv through acc and ticket
 * when more than one). PIPE: dQ of visit i - 1 is issued with S^T of visit i and leaves while it
 * runs (dS^T double-buffered), else at the end of its own visit. All threads of the CTA; sm is
 * the kernel's shared memory, free at entry; ends with the dk, dv tile out. */
template <int D, bool PIPE, bool PP, bool SW>
__device__ __forceinline__ void wgb_piece(const bwd_args &a, const wgb_maps &m, unsigned char *sm,
                                          uint64_t *bar, uint32_t &ph, int hk, int k0, int z,
                                          int nsplit, int h_lo, int h_hi, int *ticket) {
    static_assert(FROWS == 64, "one m64 wgmma per visit for dQ, n64 for S^T and dP^T");
    static_assert(8 * 4096 <= 4 * wgb_pair_w<D>() * sizeof(float), "dq_out_tma's boxes fit");
    constexpr int TILE = WKT * D * 2, QT = FROWS * D * 2, NT = FROWS / 8, DSB = WKT * FROWS * 2;
    constexpr uint32_t LBO_K = 128, SBO_K = 16 * D; /* K, V (row x d) as K-major operands */
    constexpr uint32_t LBO_T = 16 * D, SBO_T = 128; /* the same tiles as MN-major operands */
    constexpr uint32_t CMB = 128;                   /* bytes of a core matrix */
    /* the Q, dO tiles (column-major core matrices) as K-major and MN-major operands, and their
     * descriptors' k16 steps (16-byte units) */
    constexpr uint32_t QLBO_K = QCOL, QSBO_K = CMB, QLBO_T = CMB, QSBO_T = QCOL;
    constexpr int QSTEP_K = 2 * QCOL / 16, QSTEP_T = 2 * CMB / 16;
    /* SW (PP only): the Q, dO tiles 128-byte-swizzled, D / 64 blocks of FROWS rows of 128 bytes
     * (wg_desc_sw128): K-major LBO unused, SBO 1024; MN-major LBO the block distance, SBO 1024,
     * k16 step 16 rows */
    static_assert(!SW || PP, "the swizzled tiles come by PP's tensor copies");
    constexpr int QSTEP_TS = SW ? 16 * 128 / 16 : QSTEP_T;
    auto q_kmaj = [](const unsigned char *t) {
        return SW ? wg_desc_sw128(t, 16, 1024) : wg_desc(t, QLBO_K, QSBO_K);
    };
    auto q_mnmaj = [](const unsigned char *t) {
        return SW ? wg_desc_sw128(t, FROWS * 128, 1024) : wg_desc(t, QLBO_T, QSBO_T);
    };
    /* S^T = A Q^T (A = K or V, B = the Q or dO tile t, K-major) issued, committed */
    auto issue_s = [&](float(&s)[NT][4], uint64_t dA, const unsigned char *t) {
        if constexpr (SW)
            wg_issue_s_sw<D, FROWS>(s, dA, q_kmaj(t));
        else
            wg_issue_s<D, FROWS, QSTEP_K>(s, dA, q_kmaj(t));
    };
    unsigned char *Ks = sm, *Vs = Ks + TILE, *Qs = Vs + TILE, *dOs = Qs + 2 * QT;
    unsigned char *dS = dOs + 2 * QT; /* dS^T (PIPE: 2 buffers): key group x row group */
    constexpr int PW = wgb_pair_w<D>();
    float *stg_all = (float *)(dS + (PIPE ? 2 : 1) * DSB);
    float *Dr = stg_all + 4 * PW, *Lr = Dr + 2 * FROWS;
    int2 *lst = (int2 *)(Lr + 2 * FROWS); /* the visit list (wgb_list) */
    /* wg through a shuffle: the compiler then knows it is warp-uniform (descriptors in uniform
     * registers) */
    const int warp = threadIdx.x / 32, wg = __shfl_sync(0xffffffffu, warp / 4, 0), wq = warp % 4;
    const int lane = threadIdx.x % 32;
    const int tg = lane % 4;
    auto kvoff = [&](int r) -> long long {
        return k0 + r < a.Tk ? ((long long)(k0 + r) * a.Hk + hk) * D : -1;
    };
    load_cm2<D, WKT>(Ks, a.k, Vs, a.v, kvoff, threadIdx.x, blockDim.x);
    cp_commit();
    /* The blocks this piece visits: from b_lo on, below b_hi, h_hi - h_lo of them: its block range
     * (pieces by blocks; z is the piece) or all blocks from its first hit on (by hits). */
    int b_lo = 0, b_hi = a.n_blocks;
    if (a.by_block != BWD_PIECES_HITS) {
        const int Z = a.split_max;
        b_lo = (int)(((long long)z * a.n_blocks + Z - 1) / Z);
        b_hi = (int)(((long long)(z + 1) * a.n_blocks + Z - 1) / Z);
    } else if (h_lo < h_hi) {
        b_lo = attn_nth_hit(a.spans, a.n_blocks, a.B, k0, k0 + WKT, h_lo);
    }

    const float sl2 = a.scale * FLOG2E;
    float dk[D / 8][4], dv[D / 8][4];
    frag_zero(dk);
    frag_zero(dv);
    /* this warpgroup's 64 keys as the A operand of S^T and dP^T */
    const uint64_t dK = wg_desc(Ks + wg * 64 * D * 2, LBO_K, SBO_K);
    const uint64_t dV = wg_desc(Vs + wg * 64 * D * 2, LBO_K, SBO_K);
    /* dQ = dS K, B = K columns 64 wg .., MN-major */
    const uint64_t dB = wg_desc(Ks + wg * 8 * CMB, LBO_T, SBO_T);
    /* this thread's dS^T pairs: keys 64 wg + 16 wq + g (+ 8: one key group on), rows 8 n + 2 tg
     * and + 1 (row group n) */
    const int dsw = (8 * wg + 2 * wq) * NT * CMB + (lane / 4) * 16 + tg * 4;

    /* dQ of the visit whose dS^T is in buffer buf: A = dS (rows x keys) read from dS^T, MN-major
     * (K-adjacent core matrices are one key group, NT core matrices, apart); issued, committed */
    auto issue_dq = [&](float(&dq)[8][4], int buf) {
        const uint64_t dA = wg_desc(dS + buf * DSB, NT * CMB, CMB);
        wg_ss_tt_first<64>(dq, dA, dB);
#pragma unroll
        for (int kk = 1; kk < WKT / 16; kk++) /* k-step: 16 keys, two key groups */
            wg_ss_tt<64>(dq, dA + kk * (2 * NT * CMB / 16), dB + kk * (2 * (D / 8) * CMB / 16));
        wg_commit();
    };
    /* dq (complete) of visit v (nr rows) into dqacc. Warp wq of each warpgroup holds rows
     * 16 wq .. + 15 of the visit, columns 64 wg ..; the two stage their halves into the pair's
     * tile stg (row j at j D + 8 tk, tk = the row's query token counted from the pair's first:
     * each token's rows, consecutive rows of dqacc, lie contiguous, and the 8 words after them
     * spread the stores of different tokens over the banks), meet at named barrier 1 + wq, and
     * lane 0 of warpgroup 0's warp hands each token's rows to the bulk-copy engine as one
     * reduction (group x 512 bytes at most), one commit. That lane waits for their reads of stg
     * (bulk_wait_read) before the CTA barrier that precedes the next dq_out. */
    const int pr0 = 16 * wq; /* the pair's first visit row */
    auto dq_out_pair = [&](const float(&dq)[8][4], visit_item v, int nr) {
        float *stg = stg_all + wq * PW;
        const int x0 = v.cb + pr0, h0 = x0 - bwd_div_small(x0, a.inv_group) * a.group;
        const int g = lane / 4; /* h0: the head of the pair's first row */
        float *w0 = stg + g * D + bwd_div_small(h0 + g, a.inv_group) * 8 + 64 * wg + 2 * tg;
        float *w1 =
            stg + (g + 8) * D + bwd_div_small(h0 + g + 8, a.inv_group) * 8 + 64 * wg + 2 * tg;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            *(float2 *)(w0 + n * 8) = make_float2(dq[n][0], dq[n][1]);
            *(float2 *)(w1 + n * 8) = make_float2(dq[n][2], dq[n][3]);
        }
        fence_proxy_async(); /* the stores, for the bulk-copy engine */
        named_bar(1 + wq, 64);
        const int nv = min(16, nr - pr0); /* the pair's rows that are not padding */
        if (wg == 0 && lane == 0 && nv > 0) {
            float *dst = bwd_dq_row<D>(a, v, hk, nr, pr0); /* head h0 of the first token */
            for (int j = 0, h = h0, tk = 0; j < nv; tk++) {
                const int len = min(a.group - h, nv - j); /* rows of this token */
                bulk_red_add_nc(dst, stg + j * D + tk * 8, len * D * (int)sizeof(float));
                dst += (size_t)(a.H - h) * D; /* head 0 of the next token */
                j += len, h = 0;
            }
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    };
    /* The same by tensor reductions (m.dq_on: every visit has FROWS rows from a token's first
     * head on): warp w stages its 16 rows x 64 columns alone, as two boxes of the map of dqacc
     * (32 columns x gh heads x 16 / gh tokens, gh = min(group, 16): 16 rows of 128 bytes, in the
     * map's 128-byte swizzle, so the float2 stores of a warp take the 2 wavefronts its 256 bytes
     * need), and lane 0 hands both to the copy engine. No barrier between warps: lane 0 waits for
     * the engine's reads of its previous boxes, then __syncwarp. */
    auto dq_out_tma = [&](const float(&dq)[8][4], visit_item v, int nr) {
        unsigned char *stg = (unsigned char *)stg_all + warp * 4096;
        if (lane == 0) bulk_wait_read();
        __syncwarp();
        const int g = lane / 4;
#pragma unroll
        for (int n = 0; n < 8; n++) { /* box n / 4, 16-byte chunk 2 (n % 4) + tg / 2 of row g */
            const int o = n / 4 * 2048 + g * 128 + ((2 * (n % 4) + tg / 2) ^ g) * 16 + tg % 2 * 8;
            *(float2 *)(stg + o) = make_float2(dq[n][0], dq[n][1]);
            *(float2 *)(stg + o + 8 * 128) = make_float2(dq[n][2], dq[n][3]);
        }
        fence_proxy_async(); /* the stores, for the copy engine */
        __syncwarp();
        if (lane == 0 && nr > 0) {
            const int x0 = v.cb + pr0, t0 = bwd_div_small(x0, a.inv_group);
            const int h = hk * a.group + x0 - t0 * a.group, t = v.blk * a.B + t0;
            tma_red_add_3d(&m.dq, 64 * wg, h, t, stg);
            tma_red_add_3d(&m.dq, 64 * wg + 32, h, t, stg + 2048);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    };
    auto dq_out = [&](const float(&dq)[8][4], visit_item v, int nr) {
        if constexpr (PP)
            dq_out_tma(dq, v, nr);
        else
            dq_out_pair(dq, v, nr);
    };
    visit_item it = {-1, 0, 0}, prev = it; /* it.hit_i: its block's entry in lst */
    int prev_rows = 0, nlst = 0;
    /* whether visit it's block sees the thread's keys 16 warp + g and + 8 of the tile */
    auto visit_keys = [&](bool(&kvis)[2]) {
        const uint32_t keys = (uint32_t)lst[it.hit_i].y;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint32_t key = 16 * warp + lane / 4 + 8 * r;
            kvis[r] = (key >= (keys & 255u) && key < (keys >> 8 & 255u)) ||
                      (key >= (keys >> 16 & 255u) && key < keys >> 24);
        }
    };
    /* the visit after v: the block's next rows, else the next block of the list (blk -1) */
    auto next_of = [&](visit_item v) {
        visit_item nx = v;
        if (v.cb + FROWS < a.B * a.group) {
            nx.cb += FROWS;
        } else {
            nx.cb = 0, nx.hit_i++;
            nx.blk = nx.hit_i < nlst ? lst[nx.hit_i].x : -1;
        }
        return nx;
    };
    auto next_visit = [&]() { return next_of(it); };
    /* P^T = exp2(S^T scale log2e - lse log2e) in place; masked keys through a -inf bias (ex2
     * gives 0) */
    auto rows2 = [&](float2(&v)[NT], const float *t) { /* rows 8 n + 2 tg, + 1 of t */
#pragma unroll
        for (int n = 0; n < NT; n++)
            v[n] = *(const float2 *)(t + n * 8 + 2 * tg);
    };
    auto p_of_s = [&](float(&s)[NT][4], const bool(&kvis)[2], const float2(&lv)[NT]) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float2 l = lv[n]; /* rows 2 tg, + 1 */
            const float l0 = -l.x * FLOG2E, l1 = -l.y * FLOG2E;
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[n][e] = ex2(fmaf(s[n][e], sl2, kvis[e / 2] ? (e & 1 ? l1 : l0) : -INFINITY));
        }
    };
    /* dS^T / scale = P^T (dP^T - D) in place of dP^T */
    auto ds_of_dp = [&](float(&dp)[NT][4], const float(&s)[NT][4], const float2(&dv2)[NT]) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float2 dd = dv2[n];
#pragma unroll
            for (int e = 0; e < 4; e++)
                dp[n][e] = s[n][e] * (dp[n][e] - (e & 1 ? dd.y : dd.x));
        }
    };
    /* dS^T as bf16 into buffer buf, fenced for the tensor cores, from da (dK's A fragments:
     * k16 step kk holds row groups 2 kk and 2 kk + 1) */
    auto ds_store = [&](const uint32_t(&da)[NT / 2][4], int buf) {
        unsigned char *w = dS + buf * DSB + dsw;
#pragma unroll
        for (int kk = 0; kk < NT / 2; kk++) {
            *(uint32_t *)(w + 2 * kk * CMB) = da[kk][0];
            *(uint32_t *)(w + NT * CMB + 2 * kk * CMB) = da[kk][1];
            *(uint32_t *)(w + (2 * kk + 1) * CMB) = da[kk][2];
            *(uint32_t *)(w + NT * CMB + (2 * kk + 1) * CMB) = da[kk][3];
        }
        fence_proxy_async();
    };
    /* visit i; WDQ (= PIPE): issues dQ of visit i - 1 first (for i = 0 a product of the unused
     * second dS^T buffer that goes nowhere: prev_rows 0; a peeled first visit made ptxas spill).
     * Ends with no wgmma in flight; with PIPE the visit's dQ is not issued yet. */
    /* A visit's middle, once S^T and dP^T are issued (two commit groups in flight): P^T from
     * S^T, dV += P^T dO issued, dS^T from dP^T into da, dK's A fragments (S^T's registers are
     * free after it). pa and da are the products' A fragments: the caller keeps them live
     * until its last wait. */
    auto dv_ds = [&](float(&s)[NT][4], float(&dp)[NT][4], uint32_t(&pa)[NT / 2][4],
                     uint32_t(&da)[NT / 2][4], const bool(&kvis)[2], const unsigned char *dOt,
                     const float *Dt, const float *Lt) {
        float2 lv[NT], dv2[NT];
        wg_wait<1>(); /* S^T is in */
        wg_pin_all(s);
        rows2(lv, Lt);
        p_of_s(s, kvis, lv);
        wg_pack_a<NT>(pa, s);
        wg_fence();
        wg_issue_pv<D, FROWS, QSTEP_TS>(dv, pa, q_mnmaj(dOt)); /* dV += P^T dO */
        wg_wait<1>(); /* dP^T is in */
        wg_pin_all(dp);
        rows2(dv2, Dt);
        ds_of_dp(dp, s, dv2);
        wg_pack_a<NT>(da, dp);
    };
    /* dK += dS^T Q, issued and committed (after a wg_fence) */
    auto issue_dk = [&](const uint32_t(&da)[NT / 2][4], const unsigned char *Qt) {
        wg_issue_pv<D, FROWS, QSTEP_TS>(dk, da, q_mnmaj(Qt));
    };
    auto step = [&](int i, auto wdq) {
        constexpr bool WDQ = decltype(wdq)::value;
        /* through a shuffle: warp-uniform for the compiler, so the descriptors of the stage's
         * tiles and their k-steps stay in uniform registers */
        const int st = __shfl_sync(0xffffffffu, i % 2, 0);
        cp_wait_all();
        if (m.on) { /* the stage's tensor copies */
            mb_wait(bar + st, (ph >> st) & 1);
            ph ^= 1u << st;
        }
        fence_proxy_async(); /* this thread's copies, for the tensor cores */
        /* stage st is complete for all threads, and all are done with the previous visit's
         * stage (1 - st) and with the dS^T buffer this visit writes */
        __syncthreads();
        const int nrows = min(FROWS, a.B * a.group - it.cb);
        const unsigned char *Qt = Qs + st * QT, *dOt = dOs + st * QT;
        const float *Dt = Dr + st * FROWS, *Lt = Lr + st * FROWS;

        /* dp holds dQ of the previous visit first (WDQ), dP^T after it: fewer live registers */
        float s[NT][4], dp[NT][4];
        wg_fence();
        if constexpr (WDQ) issue_dq(dp, 1 - st);
        issue_s(s, dK, Qt); /* S^T = K Q^T */
        /* while it runs: this visit's key mask (its span read before the copies below queue in
         * the LSU), the next visit's loads into the other stage */
        bool kvis[2];
        visit_keys(kvis);
        const visit_item nx = next_visit();
        if (nx.blk >= 0)
            wgb_visit_load<D>(a, m, nx, hk, Qs + (1 - st) * QT, dOs + (1 - st) * QT,
                              Dr + (1 - st) * FROWS, Lr + (1 - st) * FROWS, bar + 1 - st);
        cp_commit();
        if constexpr (WDQ) {
            wg_wait<1>(); /* dQ of the previous visit is in */
            wg_pin_all(dp);
            dq_out(dp, prev, prev_rows);
            wg_fence();
        }
        issue_s(dp, dV, dOt); /* dP^T = V dO^T */
        uint32_t pa[NT / 2][4], da[NT / 2][4];
        dv_ds(s, dp, pa, da, kvis, dOt, Dt, Lt);
        wg_fence();
        issue_dk(da, Qt);
        ds_store(da, PIPE ? st : 0);
        if (wg == 0 && lane == 0) bulk_wait_read(); /* dq_out's staging is free after the barrier */
        __syncthreads(); /* dS^T of all 128 keys is in */
        if constexpr (!PIPE) {
            wg_fence();
            issue_dq(dp, 0);
        }
        wg_wait<0>();
        wg_pin_all(dv);
        wg_pin_all(dk);
        wg_pin_u(pa);
        wg_pin_u(da);
        if constexpr (!PIPE) {
            wg_pin_all(dp);
            dq_out(dp, it, nrows);
        }
        prev = it, prev_rows = nrows;
        it = nx;
    };
    /* PP's visit i: no CTA barrier; mbarriers bar[st] (Q, dO, D, lse of the stage), bar[2 + p]
     * (all threads are done with visit i, i % 2 = p: its stage and the dS^T buffer its dQ read
     * are free), bar[4 + p] (all threads' dS^T of visit i is in buffer p). dQ of visit i - 1 is
     * issued once this visit's dS^T is computed (into S^T's registers, free by then; for i = 0
     * one of buffer 1 that goes nowhere, as in step) and before dK, so that its staging and
     * reduction run while dK does. Ends with no wgmma in flight. */
    auto step_pp = [&](int i) {
        const int st = __shfl_sync(0xffffffffu, i % 2, 0);
        mb_wait(bar + st, (ph >> st) & 1);
        ph ^= 1u << st;
        const int nrows = FROWS; /* PP runs only where visits have no padding rows */
        const unsigned char *Qt = Qs + st * QT, *dOt = dOs + st * QT;
        const float *Dt = Dr + st * FROWS, *Lt = Lr + st * FROWS;
        float s[NT][4], dp[NT][4];
        wg_fence();
        issue_s(s, dK, Qt);   /* S^T = K Q^T */
        issue_s(dp, dV, dOt); /* dP^T = V dO^T */
        bool kvis[2];
        visit_keys(kvis);
        const visit_item nx = next_visit();
        const int vp = 2 + (1 - st); /* bar[vp]: visit i - 1 is done */
        if (wg == 1 && nx.blk >= 0) {
            if (i > 0) mb_wait(bar + vp, (ph >> vp) & 1); /* its stage is free */
            wgb_visit_load<D, true>(a, m, nx, hk, Qs + (1 - st) * QT, dOs + (1 - st) * QT,
                                    Dr + (1 - st) * FROWS, Lr + (1 - st) * FROWS, bar + 1 - st);
        }
        uint32_t pa[NT / 2][4], da[NT / 2][4];
        dv_ds(s, dp, pa, da, kvis, dOt, Dt, Lt);
        if (i > 0) { /* dS^T of visit i - 1 is in */
            mb_wait(bar + 5 - st, (ph >> (5 - st)) & 1);
            ph ^= 1u << (5 - st);
        }
        wg_fence();
        issue_dq(s, 1 - st); /* dQ of visit i - 1 */
        issue_dk(da, Qt);
        if (i > 0) { /* buffer st: dQ of visit i - 2 (in visit i - 1) is done */
            mb_wait(bar + vp, (ph >> vp) & 1);
            ph ^= 1u << vp;
        }
        ds_store(da, st);
        mb_arrive(bar + 4 + st);
        wg_wait<1>(); /* dV and dQ are in; dK may run */
        wg_pin_all(s);
        dq_out(s, prev, prev_rows);
        wg_wait<0>();
        mb_arrive(bar + 2 + st); /* visit i is done */
        wg_pin_all(dv);
        wg_pin_all(dk);
        wg_pin_u(pa);
        wg_pin_u(da);
        prev = it, prev_rows = nrows;
        it = nx;
    };
    /* the piece's visits; the list of the next WLIST blocks when the last one is used up (one
     * list for pieces of WLIST blocks or fewer), its first visit's loads into the next stage */
    nlst = h_lo < h_hi ? wgb_list(a, k0, b_lo, b_hi, h_hi - h_lo, lst) : 0;
    if (nlst > 0) {
        it = visit_item{lst[0].x, 0, 0};
        if (!PP || wg == 1) wgb_visit_load<D, PP>(a, m, it, hk, Qs, dOs, Dr, Lr, bar);
        cp_commit();
    }
    int i = 0;
    if constexpr (PP) {
        cp_wait_all(); /* K, V (no CTA barrier in the visits) */
        fence_proxy_async();
        __syncthreads();
        for (; it.blk >= 0; i++)
            step_pp(i);
        if (i > 0) {
            const int lb = (i - 1) % 2;
            mb_wait(bar + 4 + lb, (ph >> (4 + lb)) & 1); /* dS^T of the last visit is in */
            ph ^= 1u << (4 + lb);
            ph ^= 1u << (2 + lb); /* bar[2 + lb]: complete at the barrier below, never waited */
        }
    } else {
        for (; it.blk >= 0; i++)
            step(i, std::integral_constant<bool, PIPE>());
    }
    if (PIPE && i > 0) { /* dQ of the last visit */
        float dq[8][4];
        wg_fence();
        issue_dq(dq, (i - 1) % 2);
        wg_wait<0>();
        wg_pin_all(dq);
        dq_out(dq, prev, prev_rows);
    }
    cp_wait_all(); /* K, V of a CTA without visits may still be landing: staging reuses them */
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    __syncthreads();
#pragma unroll
    for (int j = 0; j < D / 8; j++) /* dS^T was left unscaled */
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[j][e] *= a.scale;
    static_assert(2 * WKT * (4 * D + 16) <= 2 * TILE + 4 * QT + DSB, "wgb_split_out's staging");
    if (nsplit > 1 && a.split_bulk)
        wgb_split_out<D>(a, dk, dv, sm, nsplit, k0, hk, ticket);
    else
        dkdv_tile_out<D>(dk, dv, (bf16 *)Ks, (bf16 *)Qs, nsplit, k0, WKT, a.Tk, a.Hk, hk, a.dk,
                         a.dv, a.acc, ticket);
    fence_proxy_async(); /* the staging's generic accesses before the next piece's tensor copies */
}

/* The kernel: pieces SORTED, persistent CTAs take work items (item w / Hk of a.items, kv head
 * w % Hk, w counted up by a.work[0]) until none is left; else the one piece of the CTA's grid
 * coordinates (tile blockIdx.x, kv head blockIdx.y, piece blockIdx.z). */
template <int D, bool PIPE, bool PP, bool SW>
__global__ void __launch_bounds__(256, 1)
    k_wgb_fused(bwd_args a, const __grid_constant__ wgb_maps m) {
#if WG_DEVICE
    extern __shared__ __align__(1024) unsigned char sm[];
    /* [0, 1]: the Q, dO stages' tensor copies (one arrival per warp; PP: 2 tensor copies and 64
     * cp.async arrivals for D, lse); PP also [2, 3] visit done and [4, 5] dS^T in (step_pp) */
    __shared__ uint64_t bar[6];
    uint32_t ph = 0; /* bit b: the parity of bar[b]'s next phase to wait for */
    if (threadIdx.x == 0) {
        mb_init(bar, PP ? 66 : 8), mb_init(bar + 1, PP ? 66 : 8);
        for (int b = 2; b < 6; b++)
            mb_init(bar + b, 256);
        mb_init_fence();
    }
    __syncthreads();
    const int nx = (a.Tk + WKT - 1) / WKT;
    if (a.by_block != BWD_PIECES_SORTED) {
        const int hk = blockIdx.y, k0 = blockIdx.x * WKT;
        int nsplit, h_lo, h_hi;
        if (a.by_block ? bwd_piece_blocks(a.spans, a.n_blocks, a.B, k0, WKT, nsplit, h_lo, h_hi)
                       : attn_split_piece(a.spans, a.n_blocks, a.B, k0, WKT, a.acc != NULL,
                                          a.split_max, a.vps, nsplit, h_lo, h_hi))
            wgb_piece<D, PIPE, PP, SW>(a, m, sm, bar, ph, hk, k0, blockIdx.z, nsplit, h_lo,
                                       h_hi, a.tickets + (size_t)hk * nx + blockIdx.x);
        return;
    }
    __shared__ int s_work;
    for (;;) {
        if (threadIdx.x == 0) s_work = atomicAdd(a.work, 1);
        __syncthreads(); /* also: all threads are done with the previous piece */
        const int w = s_work;
        if (w >= a.work[1] * a.Hk) break; /* uniform */
        const bwd_item it = a.items[w / a.Hk];
        const int hk = w % a.Hk;
        wgb_piece<D, PIPE, PP, SW>(a, m, sm, bar, ph, hk, it.x * WKT, it.z, it.nsplit,
                                   it.h_lo, it.h_hi, a.tickets + (size_t)hk * nx + it.x);
    }
#else
    (void)a, (void)m;
#endif
}

/* The sorted schedule (pieces SORTED): for each key tile x (WKT keys) and piece z of Z (block
 * ranges, bwd_piece_of), the number of blocks of the piece that see the tile, counted from each
 * block's key ranges (one thread per block; counters cnt[x Z + z] in shared memory); the items
 * (the pieces with a hit, and piece 0 of a tile nobody sees, which writes its zero dk, dv)
 * sorted by that count, heaviest first (ties by piece, then tile, so that the CTAs running
 * together add into neighbouring dq rows), into items; work[0] = 0 (the counter k_wgb_fused's
 * CTAs take work from), work[1] = the item count. One CTA of 1024 threads, shared memory
 * 8 nx Z bytes; nx Z <= WGB_PLAN_MAX and n_blocks < 2^19 (the sort keys fit 32 bits). */
__global__ void __launch_bounds__(1024) k_bwd_plan(bwd_args a, int nx, int Z) {
    extern __shared__ int plan_sm[];
    __shared__ int s_items;
    const int n = nx * Z;
    int *cnt = plan_sm;
    unsigned *key = (unsigned *)(plan_sm + n);
    for (int e = threadIdx.x; e < n; e += blockDim.x)
        cnt[e] = 0;
    if (threadIdx.x == 0) s_items = 0;
    __syncthreads();
    for (int blk = threadIdx.x; blk < a.n_blocks; blk += blockDim.x) {
        int rg[4], last = -1; /* the last tile counted: two ranges may share one */
        const int nr = attn_span_ranges(a.spans + blk, a.B, rg);
        const int z = bwd_piece_of(blk, Z, a.n_blocks);
        for (int r = 0; r < nr; r++) {
            if (rg[2 * r + 1] <= rg[2 * r]) continue;
            const int x0 = max(rg[2 * r] / WKT, last + 1);
            const int x1 = min((rg[2 * r + 1] - 1) / WKT, nx - 1);
            for (int x = x0; x <= x1; x++)
                atomicAdd(&cnt[x * Z + z], 1);
            last = max(last, x1);
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < nx; x += blockDim.x) {
        bool any = false;
        for (int z = 0; z < Z; z++)
            any = any || cnt[x * Z + z] > 0;
        for (int z = 0; z < Z; z++) {
            const int c = cnt[x * Z + z];
            key[x * Z + z] = c > 0 || (!any && z == 0)
                                 ? (unsigned)(a.n_blocks - c) * (unsigned)n + (unsigned)(z * nx + x)
                                 : 0xffffffffu;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const unsigned k = key[e];
        if (k == 0xffffffffu) continue;
        int rank = 0; /* keys are distinct */
        for (int f = 0; f < n; f++)
            rank += key[f] < k;
        const int x = e / Z, z = e % Z;
        int lo = 0, ns = 0;
        for (int i = 0; i < Z; i++) {
            lo += i < z ? cnt[x * Z + i] : 0;
            ns += cnt[x * Z + i] > 0;
        }
        a.items[rank] = bwd_item{x, z, ns > 0 ? ns : 1, lo, lo + cnt[e]};
        atomicAdd(&s_items, 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) a.work[0] = 0, a.work[1] = s_items;
}

/* ------------------------------------------------------------------------------------------ */

static int g_wgb_ready; /* 1: the kernel's limit is set and the device runs sm_90a code */

static wg_encode_fn g_encode; /* wg_tensor_map_encoder's; NULL: no tensor copies */

/* The tensor map of a's dqacc ([Q, H, 128] fp32) for dq_out_tma: dims (128, H, Q), box 32 x gh x
 * 16 / gh (gh = min(group, 16): a warp's 16 rows, which start at a token's first head when
 * group <= 16, else at head 16 k), 128-byte swizzle; m->dq_on = 1 where the encoder takes it
 * (else PP does not run). */
static void wgb_dq_map_make(const bwd_args *a, wgb_maps *m) {
    const cuuint64_t row = 128 * sizeof(float), H = (cuuint64_t)a->H;
    const cuuint64_t dims[3] = {128, H, (cuuint64_t)a->n_blocks * a->B};
    const cuuint64_t strides[2] = {row, H * row};
    const cuuint32_t gh = (cuuint32_t)(a->group < 16 ? a->group : 16);
    const cuuint32_t box[3] = {32, gh, 16 / gh}, one[3] = {1, 1, 1};
    m->dq_on = g_encode(&m->dq, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)a->dqacc, dims, strides,
                        box, one, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    static int told;
    if (!m->dq_on && !told++)
        fprintf(stderr, "k_wgb_fused: the encoder refused the tensor map of dqacc\n");
}

/* The 128-byte-swizzled tensor maps of a's q and dout for PP's SW tiles: dims (64, H, Q, D / 64),
 * the last one's stride 128 bytes, box 64 x group x FROWS / group x 2 (a tile: 2 blocks of FROWS
 * rows of 128 bytes); m->on = 2, m->sw = 1 where the encoder takes them and the map of dqacc,
 * else m->sw = 0 (wgb_maps_make then encodes the unswizzled maps over them). */
static void wgb_maps_make_sw(const bwd_args *a, wgb_maps *m) {
    const int T = a->n_blocks * a->B, g = a->group;
    int ok = wg_map_sw128(g_encode, &m->q, a->q, a->H, T, g, FROWS / g, 2) == 0 &&
             wg_map_sw128(g_encode, &m->dout, a->dout, a->H, T, g, FROWS / g, 2) == 0;
    if (ok) wgb_dq_map_make(a, m);
    m->sw = ok && m->dq_on;
    if (m->sw) m->on = 2;
    static int told;
    if (!ok && !told++)
        fprintf(stderr, "k_wgb_fused: the encoder refused the swizzled tensor maps of q, dout\n");
}

/* The tensor maps of a's q and dout (wgb_maps), when the encoder is there, every visit has FROWS
 * rows starting at a token's first head (FROWS % group == 0, B group % FROWS == 0) and
 * DFLASH_CUDA_ATTN_TMA is not 0: swizzled where sw asks for them (PP's SW tiles) and the encoder
 * takes them (wgb_maps_make_sw), else one copy per tile (on 2) where the encoder takes its map,
 * else one per column (on 1); else m->on = 0 (cp.async). DFLASH_CUDA_ATTN_TMA=1: on 1 at most. */
static void wgb_maps_make(const bwd_args *a, wgb_maps *m, int sw) {
    static int env = -1;
    if (env < 0) {
        env = (int)config_env_int("DFLASH_CUDA_ATTN_TMA", 0, 2, 2);
    }
    memset(m, 0, sizeof *m);
    if (!env || !g_encode || FROWS % a->group || (a->B * a->group) % FROWS) return;
    if (sw && env == 2) {
        wgb_maps_make_sw(a, m);
        if (m->sw) return;
    }
    const cuuint64_t row = 128 * sizeof(bf16), H = (cuuint64_t)a->H;
    const cuuint64_t dims[4] = {8, H, (cuuint64_t)a->n_blocks * a->B, 128 / 8};
    const cuuint64_t strides[3] = {row, H * row, 8 * sizeof(bf16)};
    const cuuint32_t box[4] = {8, (cuuint32_t)a->group, (cuuint32_t)(FROWS / a->group), 128 / 8};
    const cuuint32_t one[4] = {1, 1, 1, 1};
    const bf16 *src[2] = {a->q, a->dout};
    CUtensorMap *dst[2] = {&m->q, &m->dout};
    for (int on = env; on > 0; on--) { /* on 2: 4 dims; on 1: the first 3 with d whole */
        const cuuint64_t d3[3] = {128, H, dims[2]};
        int ok = 1;
        for (int i = 0; i < 2 && ok; i++)
            ok = g_encode(dst[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, on + 2, (void *)src[i],
                          on == 2 ? dims : d3, strides, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
                          CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
        if (ok) {
            m->on = on;
            wgb_dq_map_make(a, m);
            return;
        }
        static int told;
        if (!told++)
            fprintf(stderr, "k_wgb_fused: the encoder refused the %d-dim tensor map of q, dout\n",
                    on + 2);
    }
}

int cuda_wgb_attention_init(void) {
    g_wgb_ready = 0;
    if (!wg_device_runs_sm90a()) return 0;
    g_encode = wg_tensor_map_encoder(); /* NULL: the visits load by cp.async */
    const cudaFuncAttribute lim = cudaFuncAttributeMaxDynamicSharedMemorySize;
    const int SP = (int)wgb_smem<128, true>();
    if (cudaFuncSetAttribute(k_wgb_fused<128, true, true, true>, lim, SP) != cudaSuccess ||
        cudaFuncSetAttribute(k_wgb_fused<128, true, true, false>, lim, SP) != cudaSuccess ||
        cudaFuncSetAttribute(k_wgb_fused<128, true, false, false>, lim, SP) != cudaSuccess ||
        cudaFuncSetAttribute(k_wgb_fused<128, false, false, false>, lim,
                             (int)wgb_smem<128, false>()) != cudaSuccess) {
        (void)cudaGetLastError(); /* no usable image: k_bwd_fused serves */
        return 0;
    }
    g_wgb_ready = 1;
    return 0;
}

int cuda_wgb_attention_launch(cudaStream_t st, const bwd_args *a, int pipe) {
    if (!g_wgb_ready) return -1;
    /* a piece's blocks (pieces by blocks) or hits (by hits: about n_hit / split_max, at least
     * vps) fit its visit list */
    const int len = (a->n_blocks + a->split_max - 1) / a->split_max;
    if (len > WLIST || (a->by_block == BWD_PIECES_HITS && a->vps >= WLIST)) return -1;
    bwd_args b = *a;
    static int round = -1; /* DFLASH_CUDA_ATTN_LIST_ROUND=N (1 .. 256): tests of the rounds */
    if (round < 0) {
        round = (int)config_env_int("DFLASH_CUDA_ATTN_LIST_ROUND", 1, 256, 256);
    }
    b.list_round = round;
    static int bulk = -1; /* DFLASH_CUDA_ATTN_SPLIT_OUT=atomics: split pieces by float4 atomics */
    if (bulk < 0) {
        const char *e = getenv("DFLASH_CUDA_ATTN_SPLIT_OUT");
        bulk = !(e && strcmp(e, "atomics") == 0);
    }
    b.split_bulk = bulk;
    const int nx = (a->Tk + WKT - 1) / WKT;
    dim3 grid(nx, a->Hk, a->split_max);
    if (a->by_block == BWD_PIECES_SORTED) {
        const int nsm = cuda_attn_sm_count();
        if (nsm <= 0) return -1;
        const int Z = a->split_max;
        assert(a->items && a->work && nx * Z <= WGB_PLAN_MAX && a->n_blocks < (1 << 19));
        k_bwd_plan<<<1, 1024, (size_t)8 * nx * Z, st>>>(b, nx, Z);
        CUDA_CHECK_LAUNCH();
        grid = dim3((unsigned)min(nsm, nx * Z * a->Hk));
    }
    /* DFLASH_CUDA_ATTN_PP: 0 the PIPE kernel where PP could run, 1 PP with the Q, dO tiles in
     * the core-matrix layout; else PP with them 128-byte-swizzled (SW) */
    static int pp = -1;
    if (pp < 0) {
        pp = (int)config_env_int("DFLASH_CUDA_ATTN_PP", 0, 2, 2);
    }
    wgb_maps m;
    wgb_maps_make(a, &m, pipe && pp == 2);
    constexpr size_t SP = wgb_smem<128, true>();
    if (pipe && pp && m.on == 2 && m.dq_on && m.sw)
        k_wgb_fused<128, true, true, true><<<grid, 256, SP, st>>>(b, m);
    else if (pipe && pp && m.on == 2 && m.dq_on)
        k_wgb_fused<128, true, true, false><<<grid, 256, SP, st>>>(b, m);
    else if (pipe)
        k_wgb_fused<128, true, false, false><<<grid, 256, SP, st>>>(b, m);
    else
        k_wgb_fused<128, false, false, false><<<grid, 256, wgb_smem<128, false>(), st>>>(b, m);
    return 0;
}
