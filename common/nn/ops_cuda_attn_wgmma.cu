/* ops_cuda_attn_wgmma: the causal and block attention forwards on Hopper warpgroup MMA (wgmma,
 * sm_90a), bf16 in and out, fp32 inside: causal at head dims 64 and 128, block at 128.
 * ops_cuda_attn.cu calls them first for attention_causal_fwd and attention_block_fwd in the
 * default mode and falls back to the mma.sync kernels of ops_cuda_attn_mma.cu when they return
 * -1 (another head dim, a group wider than a CTA, buffers not 16-byte aligned, a device without
 * sm_90a code, DFLASH_CUDA_ATTN_CAUSAL naming a mma.sync shape such as 4x32, or
 * DFLASH_CUDA_ATTN_BLOCK=mma; see the block mode below). This file alone builds for sm_90a
 * (common/CMakeLists.txt). The causal kernels and the block mode's cp.async kernel are one body,
 * wg_fwd<..., BLOCK>; the block forward's default is its own kernel, k_wg_block_tma (a producer
 * warpgroup with tensor copies; below).
 *
 * Rows: as in ops_cuda_attn_mma.cu, a CTA owns TQ = 64 NWG query rows = RT tokens x the `group`
 * query heads of kv head hk (row r: token t_a + r / group, head hk * group + r % group) and
 * every row shares one key range up to its own causal limit. Warpgroup w (128 threads) owns rows
 * 64 w .. 64 w + 63, the M = 64 of its wgmma; in its accumulators (the mma.sync C layout per
 * warp) thread (warp q, lane l) holds rows 16 q + l / 4 and + 8, columns 8 j + 2 (l % 4) + {0, 1}
 * of every 8-column block j. Softmax state (m, l) of those two rows lives in registers, reduced
 * over the 4 lanes of a quad.
 * Shared memory, all in the no-swizzle core-matrix layout (a core matrix = 8 rows x 16 bytes,
 * 128 contiguous bytes; tile element (row, col) at byte ((row / 8) (D / 8) + col / 8) 128 +
 * (row % 8) 16 + (col % 8) 2, so 16-byte chunk i of a tile sits at byte 16 i): Q (TQ x D) and
 * NS stages of K and V (KT x D each), loaded with cp.async (zero-filled past the range end), then
 * the bounds scratch and 2 NS mbarriers. Q and K are K-major operands (d contiguous) of
 * S = Q K^T; V is the MN-major B operand of O += P V (d contiguous, the transpose bit set).
 * Descriptor strides along K (LBO) and along M/N (SBO): Q, K 128 and 16 D bytes; V 16 D and 128.
 * Per key tile i (keys kb = begin + i KT ..), per warpgroup: S = Q K^T (D / 16 wgmma m64nKTk16,
 * both operands from shared memory), online softmax in the log2 domain (masked only where the
 * tile is not wholly inside every row's keys), P = exp2(S - m) packed to bf16 A fragments in
 * registers (the accumulator layout of two 8-column blocks is the A layout of one k16 step),
 * O += P V (KT / 16 wgmma m64nDk16, A from registers); O is rescaled only when a row max moved.
 * DIST tiles are in flight ahead of the computed one. Kernel modes (template MODE):
 *   0, plain: those steps in order; one CTA barrier per tile (after it the stage the next refill
 *     overwrites is free); a warpgroup skips tiles none of its rows sees.
 *   1, 2, 3 (pipelined): S of tile i and P V of tile i - 1 are issued back to back and the
 *     softmax of tile i runs while P V of tile i - 1 does (O is rescaled after it); a refill
 *     may only overwrite the stage of tile i - 2 (DIST <= NS - 2). Every warpgroup computes every
 *     tile of the CTA (masked where unseen): a branch around wgmma in flight is serialised by
 *     ptxas.
 *     1: one CTA barrier per tile, as in mode 0.
 *     2: no CTA barrier in the loop: per stage a "full" mbarrier (every thread arrives once its
 *       own copies of the tile landed: cp.async.wait_group, fence.proxy.async, arrive; it
 *       announces tile i + 1 before waiting for tile i) and an "empty" one (each warp arrives
 *       when its P V of the tile completed; a thread refills a stage only after its phase).
 *       Warpgroups drift apart by up to a tile, so one's softmax overlaps another's wgmma.
 *     3 (default): as 2, but warpgroup j % NWG alone loads tile j (full counts 128 threads),
 *       so only one warpgroup per tile waits for the stage to empty.
 * End: O / l staged through shared memory for 16-byte stores; rows without keys give 0. CTAs
 * run in reverse token order (longest rows first).
 * Kernels (DFLASH_CUDA_ATTN_CAUSAL names; NWG x KT, r: mode 3, m: 2, p: 1, none: 0; a 5: NS 5,
 * DIST 3, else NS 4 (3 for modes 0, 1), DIST 2 (1 for mode 1)): d 128 wg3x64r (default),
 * wg3x64r5, wg3x64m, wg3x64p, wg3x64; d 64 wg2x128 (mode 0). Measured on the H200
 * (bench/cuda_ops/NOTES.md; 4 x 3072 and 64 x 2048 tokens, H 32 / 8, d 128, TFLOP/s):
 * wg3x64r 306 and 303, wg3x64r5 310 and 298, wg3x64m 286 and 279, wg3x64p 264 and 266, wg3x64
 * 185 and 185; the mma.sync 4x32 kernel 203 and 208.
 * Resources (ptxas, d 128): wg3x64r 160 registers, 176 KB shared; wg3x64r5 157, 208 KB;
 * wg3x64m 168, 176 KB; wg3x64p 159, 144 KB; wg3x64 168 with a 24-byte spill, 144 KB; d 64
 * wg2x128 168, 112 KB; the block kernel 156, 176 KB; k_wg_block_tma 128 at entry, 160 / 32
 * after setmaxnreg, 208 KB (NS 5), 225 KB (p). No spills. One CTA per SM (launch bounds NWG x
 * 128, 1; k_wg_block_tma (NWG + 1) x 128, 1).
 * Block mode (attention_block_fwd; k_wg_block: mode 3, NWG 3, KT 64, NS 4, DIST 2 as wg3x64r):
 *   the rows of block j (B query tokens x the group heads of kv head hk, B x group <= 64) see the
 *   keys of its span: context [ctx_begin, ctx_end) and its own [blk_begin, blk_begin + B),
 *   each key once (nn_block_span, ops.h). A CTA takes NWG = 3 consecutive blocks (3 c .. 3 c +
 *   2, c in reverse order: sorted anchors put the long contexts last), warpgroup w the rows of
 *   block 3 c + w (rows past B x group, a padding block or a block past n_blocks: no keys). Its
 *   tiles: first those of the blocks' context ranges (clipped to [0, Tk)), sorted and merged
 *   where they overlap or touch (up to 3 intervals; thread 0 writes the schedule into the
 *   bounds scratch, wg_block_setup), then one own-keys tile whose row j < 3 B holds key
 *   blk_begin + j % B of block j / B (3 B <= KT). Masks (wg_block_mask, before the softmax of
 *   a full tile): in a context tile, row keys inside [ctx_begin, min(ctx_end, interval end))
 *   and outside the block's own keys (those come in the last tile; skipped where the tile lies
 *   inside that for every row of the thread); in the own-keys tile, rows B w .. B w + B - 1.
 *   In the measured case (512 blocks of 16, contexts [0, anchor) with sorted anchors) the three
 *   contexts differ by a few keys, so a CTA streams about one block's context once for 3 blocks.
 *   End: as causal, plus lse [H, n_blocks B] = (m + log2 l) ln 2 per row (+INF without keys),
 *   the layout of the mma.sync forward that ops_cuda_attn_bwd.cu reads.
 * Block mode with a producer (k_wg_block_tma, the default): the same CTAs' work, schedule,
 *   masks and consumer loop (3 warpgroups, one block each, mode 3's order: S of tile i with P V
 *   of tile i - 1, the softmax under P V), plus a fourth warpgroup that only loads. A work item
 *   is one former CTA (c, kv head hk), heaviest first over all kv heads (c descending, hk
 *   fastest), so the last items are the shortest of every head. The producer's first warp
 *   writes an item's record into shared memory (lane 0: the spans of its 3 blocks, the
 *   per-warpgroup mask bounds mk, read per tile by the consumers since in registers they made
 *   ptxas spill, and wg_block_setup's schedule) and announces it on an "ifull" mbarrier, then
 *   fills stage s % NS with the CTA's s-th tile once the 12 consumer warps released tile s - NS
 *   (per stage a "full" mbarrier, one arrival plus the copies' bytes, and an "empty" one, one
 *   arrival per consumer warp after its P V of the tile): a context tile by two tensor copies
 *   (lane 0; wg_kv_maps: 4-dim maps of k and v, box 64 x 1 x KT x 2, 128-byte swizzle, so
 *   every copy reads whole 128-byte rows; keys past Tk zero-filled, past the interval masked),
 *   the own-keys tile by cp.async of the warp into the same swizzled layout (zero-filled,
 *   waited, async-proxy fence, one arrival). K and V stages are read through 128-byte-swizzle
 *   descriptors (wg_desc_sw128: S steps 32 bytes along a 128-byte row, then to the second 64
 *   columns of d; P V steps 16 rows of 2048 bytes, LBO KT 128 between the d halves).
 *   setmaxnreg: the producer drops to 32 registers, the consumers rise to 160 (launch bounds 512
 *   threads: 128 each at entry). Q and the output, by variant:
 *   - q (QT): the producer loads Q with the record, 2 tensor copies per block (map of q: 4 dims
 *     (d % 64, head, token, d / 64), box 64 x group x B x 1, 128-byte swizzle; completing on
 *     ifull), read through the same swizzled descriptors as K; each consumer warpgroup stages
 *     its output in its own 64 Q rows once all its warps passed their last S (16-byte chunks
 *     XOR-swizzled by row: no bank conflicts, no barrier of all consumers).
 *   - else: Q by cp.async of its warpgroup into the core-matrix layout above, the output through
 *     padded rows after a barrier of the consumers (bar 4).
 *   - p (persistent, with q; the default): a grid of one CTA per SM; a CTA takes item
 *     blockIdx.x, then the next from a device counter (g_wgt_ctr: taken items less the grid;
 *     the last CTA of a launch resets it, so block forwards on one device must not overlap, as
 *     with the backward's plan) until none is left. Records and Q buffers alternate (2 of each:
 *     224 KB at NS 4): the producer writes item n + 1's while the consumers run item n and
 *     rewrites one after the consumers released it ("iempty", after their output), and the
 *     stage ring runs on across items, so an item's spans, schedule, Q and first tiles load
 *     under the previous item's last tiles and output. Without p: one item per CTA, a CTA per
 *     item. DFLASH_CUDA_ATTN_BLOCK_CTAS=N (tests only) caps the persistent grid at N CTAs.
 *   Variants (DFLASH_CUDA_ATTN_BLOCK names): wgt3x64p (default: NS 4, 225 KB shared), wgt3x64q
 *   (NS 4), wgt3x64s5q (NS 5), wgt3x64s5 (Q by cp.async, NS 5, the default before p), wgt3x64
 *   (the same with NS 4), wgt3x64s5n (no swizzle: 5-dim maps (d % 8, head, key % 8, d / 8, key
 *   / 8) into the core-matrix layout, interval begins rounded down to 8 keys, Tk % 8 == 0; its
 *   16-byte pieces read every 32-byte L2 sector twice: ncu L2 throughput 75%).
 *   DFLASH_CUDA_ATTN_BLOCK: unset, empty or "wgmma": the default producer kernel where it
 *   applies (the encoder found, NWG B <= KT), else k_wg_block; "wgcp": k_wg_block; a variant's
 *   name: that one; "mma" (or a mma.sync shape, 4x16 or 2x32): the mma.sync kernel.
 *   DFLASH_CUDA_ATTN_BLOCK_ORDER=head: the producer kernels' items by kv head (the old order,
 *   for comparison). Measured on the H200 (NOTES.md, 512 x 16 queries, 3072 context tokens,
 *   anchors as the step draws them, H 32 / 8, d 128): wgt3x64p 0.406-0.408 ms, 504-506 TFLOP/s;
 *   wgt3x64q 0.449, wgt3x64s5q 0.450, wgt3x64s5 0.457-0.465, wgt3x64 0.461 (main's wgt3x64s5,
 *   whose prologue read the spans and schedule before two CTA barriers, 0.476-0.485);
 *   wgt3x64s5n 0.562; k_wg_block 0.645-0.658 (313-318); the mma.sync 4x16 kernel 1.21 ms, 169
 *   TFLOP/s. Two consumer warpgroups at 232 registers with 128-key tiles (S as m64n128 products,
 *   less shared-memory traffic per FLOP; 2026-12-02, removed) ran 0.528-0.534 ms (NS 3, Q by
 *   tensor copies) and 0.678-0.683 (persistent, NS 2) against wgt3x64p's 0.412 in the same run:
 *   three warpgroups hide more than the wider product saves.
 * Stream: the caller's.
 */
#include "attn_spans.cuh"
#include "config.h"
#include "mma_frag.cuh" /* cp_commit, ex2, quad_max, quad_sum */
#include "ops_cuda.h"

#include <cuda.h> /* CUtensorMap (the encoder is found through the runtime) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

typedef __nv_bfloat16 bf16;

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef struct wg_args {
    bf16 *out;
    const bf16 *q, *k, *v;
    const int32_t *seq_off;
    int n_seqs, T, H, Hk, group, RT;
    float scale;
    uint32_t lbo_qk, sbo_qk, lbo_v, sbo_v; /* descriptor strides in bytes */
} wg_args;

/* The block forward's own arguments (k_wg_block; wg_args holds the rest, T = n_blocks B) */
typedef struct wg_blk {
    float *lse; /* [H, n_blocks B], may be NULL */
    const nn_block_span *spans;
    int n_blocks, B, Tk;
    int by_head; /* k_wg_block_tma: CTAs by kv head, then heaviest first (else heaviest first) */
} wg_blk;

#include "wgmma.cuh" /* the wgmma PTX wrappers, load_cm */

/* K and V rows of keys [kb, kb + KT) of kv head hk into stage st (K at st, V after it), by
 * threads tid of nth (the CTA, or one warpgroup) */
template <int D, int KT>
__device__ __forceinline__ void issue_kv(const wg_args &a, int kb, int re, int hk,
                                         unsigned char *st, int tid, int nth) {
    auto off = [&](int r) -> long long {
        return kb + r < re ? ((long long)(kb + r) * a.Hk + hk) * D : -1;
    };
    load_cm<D, KT>(st, a.k, off, tid, nth);
    load_cm<D, KT>(st + KT * D * 2, a.v, off, tid, nth);
}

/* Q, NS stages of K and V, the bounds scratch [warp][4] and 2 NS mbarriers (MODE 2) */
template <int D, int NWG, int KT, int NS> static size_t wg_smem(void) {
    return (size_t)(64 * NWG + NS * 2 * KT) * D * sizeof(bf16) + 4 * NWG * 4 * sizeof(int) +
           2 * NS * sizeof(uint64_t);
}


/* O *= corr per row, and P (s) packed into bf16 A fragments pa (wg_pack_a) */
template <int D, int KT>
__device__ __forceinline__ void wg_rescale(float (&o)[D / 8][4], const float corr[2],
                                           const float (&s)[KT / 8][4],
                                           uint32_t (&pa)[KT / 16][4]) {
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) /* no max moved: skip */
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][0] *= corr[0], o[dt][1] *= corr[0];
            o[dt][2] *= corr[1], o[dt][3] *= corr[1];
        }
    wg_pack_a<KT / 8>(pa, s);
}

/* min (op 0) or max (op 1) over the 32 lanes */
__device__ __forceinline__ int warp_minmax(int v, int op) {
    for (int o = 16; o > 0; o >>= 1) {
        int w = __shfl_xor_sync(0xffffffffu, v, o);
        v = op ? max(v, w) : min(v, w);
    }
    return v;
}

/* ---- block mode: the CTA's key tiles ---- */

/* Thread 0 of a block-mode CTA (blocks blk0 .. blk0 + NWG - 1) writes its key schedule into ib
 * (the bounds scratch): ib[r], ib[NWG + r] begin and end of context interval r (the blocks'
 * context ranges clipped to [0, Tk), sorted, overlapping or touching ones merged; nr of them),
 * ib[2 NWG + r] its first tile (ib[2 NWG + nr]: the number of context tiles), ib[3 NWG + 1] nr,
 * ib[3 NWG + 2 + w] the first own key of warpgroup w's block (-1: none or padding); sp0[w]
 * is the span of block blk0 + w (read where blk0 + w < n_blocks). Interval
 * begins are rounded down to a multiple of AL (the tensor copies' 8-key groups; masked keys). */
template <int NWG, int KT, int AL = 1>
__device__ void wg_block_setup(const wg_blk &bs, int blk0, int *ib, const nn_block_span *sp0) {
    int nr = 0;
    for (int w = 0; w < NWG; w++) {
        int blk = blk0 + w, own = -1;
        if (blk < bs.n_blocks) {
            nn_block_span sp = sp0[w];
            if (sp.keep) {
                own = sp.blk_begin;
                int c0 = max(sp.ctx_begin, 0), c1 = min(sp.ctx_end, bs.Tk), j = nr++;
                if (c0 >= c1) nr--, j = -1;
                c0 = c0 / AL * AL;
                for (; j > 0 && ib[j - 1] > c0; j--) /* insertion by begin */
                    ib[j] = ib[j - 1], ib[NWG + j] = ib[NWG + j - 1];
                if (j >= 0) ib[j] = c0, ib[NWG + j] = c1;
            }
        }
        ib[3 * NWG + 2 + w] = own;
    }
    int n = 0;
    for (int j = 0; j < nr; j++) {
        if (n > 0 && ib[j] <= ib[NWG + n - 1]) {
            ib[NWG + n - 1] = max(ib[NWG + n - 1], ib[NWG + j]);
        } else {
            ib[n] = ib[j], ib[NWG + n] = ib[NWG + j];
            n++;
        }
    }
    ib[2 * NWG] = 0;
    for (int j = 0; j < n; j++)
        ib[2 * NWG + j + 1] = ib[2 * NWG + j] + (ib[NWG + j] - ib[j] + KT - 1) / KT;
    ib[3 * NWG + 1] = n;
}

/* Context tile i (below ib's tile count): keys [kb, kb + KT) of the interval that ends at re */
template <int NWG, int KT>
__device__ __forceinline__ void wg_block_tile(const int *ib, int nr, int i, int &kb, int &re) {
    int r = 0;
#pragma unroll
    for (int j = 1; j < NWG; j++)
        if (j < nr && i >= ib[2 * NWG + j]) r = j;
    kb = ib[r] + (i - ib[2 * NWG + r]) * KT, re = ib[NWG + r];
}

/* A block-mode thread's two rows 16 wq + g and + 8 (of the warpgroup's NR) into lse [H,
 * n_blocks B] = (m + log2 l) ln 2 (l the quad's sum; no keys: +INF); lane tg 0 of a quad. */
__device__ __forceinline__ void block_lse_out(const wg_blk &bs, int myblk, int hk, int group,
                                              int NR, int wq, int g, const float m[2],
                                              const float lt[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = 16 * wq + g + 8 * i;
        if (r >= NR) continue;
        int t = myblk * bs.B + r / group, h = hk * group + r % group;
        bs.lse[(size_t)h * bs.n_blocks * bs.B + t] =
            lt[i] > 0.0f ? (m[i] + log2f(lt[i])) * LN2 : INFINITY;
    }
}

/* The own-keys tile (the last of a block-mode CTA) into stage st: row j < NWG B holds key
 * own + j % B of warpgroup j / B's block (own from ib), zero where it has none or past Tk */
template <int D, int NWG, int KT>
__device__ __forceinline__ void issue_own(const wg_args &a, const wg_blk &bs, const int *ib, int hk,
                                          unsigned char *st, int tid, int nth) {
    auto off = [&](int r) -> long long {
        int w = r / bs.B, own = w < NWG ? ib[3 * NWG + 2 + w] : -1, key = own + r % bs.B;
        return own >= 0 && key < bs.Tk ? ((long long)key * a.Hk + hk) * D : -1;
    };
    load_cm<D, KT>(st, a.k, off, tid, nth);
    load_cm<D, KT>(st + KT * D * 2, a.v, off, tid, nth);
}

/* issue_own into the 128-byte-swizzled layout of tiles of KT keys (wg_desc_sw128): 16-byte
 * chunk c of row j at (c / 8) KT 128 + 128 j + 16 ((c % 8) ^ (j % 8)) */
template <int D, int NWG, int KT>
__device__ __forceinline__ void issue_own_sw(const wg_args &a, const wg_blk &bs, const int *ib,
                                             int hk, unsigned char *st, int tid, int nth) {
    static_assert(D == 128, "16 chunks per row: nth / 16 rows per round");
    const int c = tid % 16;
    for (int r = tid / 16; r < KT; r += nth / 16) {
        int w = r / bs.B, own = w < NWG ? ib[3 * NWG + 2 + w] : -1, key = own + r % bs.B;
        bool in = own >= 0 && key < bs.Tk;
        size_t o = in ? ((size_t)key * a.Hk + hk) * D + c * 8 : 0;
        int b = (c / 8) * KT * 128 + 128 * r + 16 * ((c % 8) ^ (r % 8));
        cp_async16(st + b, a.k + o, in ? 16 : 0);
        cp_async16(st + KT * D * 2 + b, a.v + o, in ? 16 : 0);
    }
}

/* Block-mode mask of one tile's scores (accumulator layout): key kb + column is seen by row
 * e / 2 of this thread when the row has keys (rv), lo <= key < hi and key is outside
 * [xlo, xhi) */
template <int KT>
__device__ __forceinline__ void wg_block_mask(float (&s)[KT / 8][4], int kb, const bool rv[2],
                                              int lo, int hi, int xlo, int xhi) {
    const int tg = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < KT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = kb + n * 8 + 2 * tg + (e & 1);
            if (!rv[e / 2] || key < lo || key >= hi || (key >= xlo && key < xhi))
                s[n][e] = -INFINITY;
        }
}

/* The mask of tile i of a block item (ib: its record, nr merged context intervals, n_ctx
 * context tiles): a context tile is masked to [klo, min(khi, its interval's end)) outside
 * [xlo, xhi), unless it lies wholly inside that with every row live; the own-keys tile (i ==
 * n_ctx) to [glo, ghi). */
template <int NWG, int KT>
__device__ __forceinline__ void wg_block_mask_tile(float (&s)[KT / 8][4], const int *ib, int nr,
                                                   int i, int n_ctx, const bool rv[2], int klo,
                                                   int khi, int xlo, int xhi, int glo, int ghi) {
    if (i < n_ctx) {
        int cb, re;
        wg_block_tile<NWG, KT>(ib, nr, i, cb, re);
        const int h = min(khi, re);
        if (!(rv[0] && rv[1] && cb >= klo && cb + KT <= h && (cb + KT <= xlo || cb >= xhi)))
            wg_block_mask<KT>(s, cb, rv, klo, h, xlo, xhi);
    } else {
        wg_block_mask<KT>(s, 0, rv, glo, ghi, 0, 0);
    }
}

/* One CTA. Causal: TQ = 64 NWG query rows (RT tokens x group heads of kv head blockIdx.y), NWG
 * warpgroups of 64 rows. BLOCK: NWG consecutive blocks, warpgroup w the B x group rows of block
 * NWG c + w (c: the CTA's index, reversed), keys of the merged context intervals then the
 * own-keys tile. Keys in tiles of KT through NS stages. */
template <int D, int NWG, int KT, int MODE, int NS, int DIST, bool BLOCK>
__device__ __forceinline__ void wg_fwd(const wg_args &a, const wg_blk &bs) {
    static_assert(MODE == 0 ? DIST <= NS - 1 : DIST <= NS - 2, "a refill would hit a used stage");
    static_assert(MODE < 2 || DIST >= 2, "MODE 2, 3 announce tile i + 1 before refilling");
    static_assert(!BLOCK || MODE == 3, "the block mode is built on mode 3");
    constexpr bool PIPE = MODE > 0;
#if WG_DEVICE
    constexpr int TQ = 64 * NWG, CPR = D / 8, TILE_B = KT * D * 2, LD = D + 8;
    extern __shared__ __align__(1024) unsigned char sm[];
    unsigned char *Qs = sm, *KV = sm + TQ * D * 2;
    int *red = (int *)(KV + NS * 2 * TILE_B); /* [warp][4] bounds; BLOCK: the key schedule */
    uint64_t *full = (uint64_t *)(red + 4 * NWG * 4), *empty = full + NS; /* MODE 2 */
    if (MODE >= 2 && threadIdx.x == 0) {
        for (int j = 0; j < NS; j++)
            mb_init(full + j, MODE == 2 ? NWG * 128 : 128), mb_init(empty + j, NWG * 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, wq = warp % 4;
    const int lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int hk = blockIdx.y, group = a.group;
    const int tile = gridDim.x - 1 - blockIdx.x; /* long rows first */
    int t_a, R, nr, rng[4] = {0, 0, 0, 0};
    int n_ctx = 0, myblk = 0; /* BLOCK: context tiles; this warpgroup's block */
    if constexpr (BLOCK) {
        if (threadIdx.x == 0)
            wg_block_setup<NWG, KT>(bs, tile * NWG, red, bs.spans + tile * NWG);
        __syncthreads(); /* the schedule (and the mbarriers' init) are visible */
        nr = red[3 * NWG + 1], n_ctx = red[2 * NWG + nr], myblk = tile * NWG + wg;
        t_a = 0, R = 0;
    } else {
        attn_tile_keys(a.seq_off, a.n_seqs, a.T, NULL, 0, a.RT, 1, tile, t_a, R, nr, rng);
    }
    /* rows with a query: of the CTA (causal), of each warpgroup (BLOCK) */
    const int NR = BLOCK ? bs.B * group : R * group;
    load_cm<D, TQ>(
        Qs, a.q,
        [&](int r) -> long long {
            if constexpr (BLOCK) {
                int rl = r % 64, blk = tile * NWG + r / 64;
                if (rl >= NR || blk >= bs.n_blocks) return -1;
                int t = blk * bs.B + rl / group, h = hk * group + rl % group;
                return ((long long)t * a.H + h) * D;
            } else {
                if (r >= NR) return -1;
                int t = t_a + r / group, h = hk * group + r % group;
                return ((long long)t * a.H + h) * D;
            }
        },
        threadIdx.x, blockDim.x);
    if (MODE >= 2) cp_commit(); /* Q alone: published by the barrier below */
    /* the loads of tile j: the whole CTA, or (MODE 3) warpgroup j % NWG alone */
    auto loads = [&](int j) { return MODE != 3 || j % NWG == wg; };
    const int ltid = MODE == 3 ? threadIdx.x % 128 : threadIdx.x;
    const int lnth = MODE == 3 ? 128 : blockDim.x;
    /* BLOCK: K and V of tile j into its stage, by threads tid of nth */
    auto issue_blk = [&](int j, int tid, int nth) {
        unsigned char *st = KV + (j % NS) * 2 * TILE_B;
        if (j < n_ctx) {
            int kb, re;
            wg_block_tile<NWG, KT>(red, nr, j, kb, re);
            issue_kv<D, KT>(a, kb, re, hk, st, tid, nth);
        } else {
            issue_own<D, NWG, KT>(a, bs, red, hk, st, tid, nth);
        }
    };
    /* DIST tiles are in flight ahead of the one computed */
    const int n_tiles = BLOCK ? n_ctx + 1 : nr ? (rng[1] - rng[0] + KT - 1) / KT : 0;
#pragma unroll
    for (int j = 0; j < DIST; j++) {
        if constexpr (BLOCK) {
            if (j < n_tiles && loads(j)) issue_blk(j, ltid, lnth);
        } else {
            if (j < n_tiles && loads(j))
                issue_kv<D, KT>(a, rng[0] + j * KT, rng[1], hk, KV + j * 2 * TILE_B, ltid, lnth);
        }
        cp_commit();
    }

    /* keys [lo, hi) of rows g, g + 8 of this warp; the warpgroup's bounds: any key of a tile
     * is seen only inside [lo_any, hi_any) (rows with keys), every row sees [lo_all, hi_all) */
    int lo[2], hi[2];
    /* BLOCK: rows g, g + 8 have keys (rv); the block's context [klo, khi) less its own keys
     * [xlo, xhi); its slots [glo, ghi) of the own-keys tile */
    bool rv[2] = {false, false};
    int klo = 0, khi = 0, xlo = 0, xhi = 0, glo = 0, ghi = 0;
    if constexpr (BLOCK) {
        nn_block_span sp = {0, 0, 0, 0};
        if (myblk < bs.n_blocks) sp = bs.spans[myblk];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            rv[i] = sp.keep && 16 * wq + g + 8 * i < NR;
            lo[i] = 0, hi[i] = 0;
        }
        klo = sp.ctx_begin, khi = min(sp.ctx_end, bs.Tk);
        xlo = sp.blk_begin, xhi = sp.blk_begin + bs.B;
        glo = wg * bs.B, ghi = glo + max(0, min(bs.B, bs.Tk - sp.blk_begin));
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = 64 * wg + 16 * wq + g + 8 * i;
            lo[i] = 0, hi[i] = 0;
            if (r < NR) attn_row_keys(a.seq_off, a.n_seqs, a.T, t_a + r / group, lo[i], hi[i]);
        }
        bool k0 = lo[0] < hi[0], k1 = lo[1] < hi[1];
        int v[4] = {min(k0 ? lo[0] : INT_MAX, k1 ? lo[1] : INT_MAX),
                    max(k0 ? hi[0] : INT_MIN, k1 ? hi[1] : INT_MIN), max(lo[0], lo[1]),
                    min(hi[0], hi[1])};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int w = warp_minmax(v[j], j == 1 || j == 2);
            if (lane == 0) red[warp * 4 + j] = w;
        }
    }
    if (MODE >= 2) { /* this thread's Q copies landed (tiles 0 .. DIST - 1 may be in flight) */
        cp_wait<DIST>();
        fence_async_smem();
    }
    __syncthreads();
    int lo_any = INT_MAX, hi_any = INT_MIN, lo_all = INT_MIN, hi_all = INT_MAX;
    if constexpr (!BLOCK)
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const int *b = red + (4 * wg + w) * 4;
            lo_any = min(lo_any, b[0]), hi_any = max(hi_any, b[1]);
            lo_all = max(lo_all, b[2]), hi_all = min(hi_all, b[3]);
        }

    const float sl2 = a.scale * LOG2E;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    const uint64_t dq = wg_desc(Qs + wg * 64 * D * 2, a.lbo_qk, a.sbo_qk);

    /* MODE 0, 1, per tile: wait for it, one CTA barrier (after it the stage that tile i + DIST
     * refills, that of tile i + DIST - NS <= i - 1, or <= i - 2 with PIPE, is free), refill */
    auto next_tile = [&](int i) {
        cp_wait<DIST - 1>();
        fence_async_smem();
        __syncthreads();
        if (i + DIST < n_tiles)
            issue_kv<D, KT>(a, rng[0] + (i + DIST) * KT, rng[1], hk,
                            KV + ((i + DIST) % NS) * 2 * TILE_B, threadIdx.x, blockDim.x);
        cp_commit();
    };
    uint32_t pa[KT / 16][4];
    float s[KT / 8][4], corr[2];
    if constexpr (!PIPE) {
        for (int i = 0; i < n_tiles; i++) {
            next_tile(i);
            const int kb = rng[0] + i * KT, ke = min(kb + KT, rng[1]);
            if (!(kb < hi_any && ke > lo_any)) continue; /* uniform over the warpgroup */
            const bool full_tile = kb >= lo_all && kb + KT <= hi_all && kb + KT <= rng[1];
            const unsigned char *Kt = KV + (i % NS) * 2 * TILE_B, *Vt = Kt + TILE_B;
            wg_fence();
            wg_issue_s<D, KT>(s, dq, wg_desc(Kt, a.lbo_qk, a.sbo_qk));
            wg_wait<0>();
            wg_pin_all(s);
            online_softmax<KT>(s, m, l, corr, kb, lo, hi, full_tile, sl2);
            wg_rescale<D, KT>(o, corr, s, pa);
            wg_fence();
            wg_issue_pv<D, KT>(o, pa, wg_desc(Vt, a.lbo_v, a.sbo_v));
            wg_wait<0>();
            wg_pin_all(o);
            wg_pin_u(pa);
        }
    } else if (n_tiles > 0) {
        /* PIPE: S of tile i and P V of tile i - 1 are issued together, the softmax of tile i
         * runs while P V does; every warpgroup computes every tile (the ones it does not see
         * are masked: a branch around wgmma in flight would serialise them) */
        uint64_t pv = 0;
        if (MODE >= 2 && loads(0)) { /* tile 0: this thread's copies have landed */
            cp_wait<DIST - 1>();
            fence_async_smem();
            mb_arrive(full);
        }
        auto step = [&](int i, auto with_pv) {
            if (MODE < 2) {
                next_tile(i);
            } else {
                /* announce tile i + 1 (this thread's copies landed; issued DIST - 1 tiles ago),
                 * refill the stage of tile i + DIST - NS <= i - 2 once every warp released it,
                 * then wait for tile i */
                if (i + 1 < n_tiles && loads(i + 1)) {
                    cp_wait<DIST - 2>();
                    fence_async_smem();
                    mb_arrive(full + (i + 1) % NS);
                }
                const int j = i + DIST;
                if (j < n_tiles && loads(j)) {
                    if (j >= NS) mb_wait(empty + j % NS, (j / NS - 1) & 1);
                    if constexpr (BLOCK)
                        issue_blk(j, ltid, lnth);
                    else
                        issue_kv<D, KT>(a, rng[0] + j * KT, rng[1], hk, KV + (j % NS) * 2 * TILE_B,
                                        ltid, lnth);
                }
                cp_commit();
                mb_wait(full + i % NS, (i / NS) & 1);
            }
            const int kb = BLOCK ? 0 : rng[0] + i * KT;
            const bool full_tile = kb >= lo_all && kb + KT <= hi_all && kb + KT <= rng[1];
            const unsigned char *Kt = KV + (i % NS) * 2 * TILE_B, *Vt = Kt + TILE_B;
            wg_fence();
            wg_issue_s<D, KT>(s, dq, wg_desc(Kt, a.lbo_qk, a.sbo_qk));
            if constexpr (decltype(with_pv)::value) {
                wg_issue_pv<D, KT>(o, pa, pv);
                wg_wait<1>();
            } else {
                wg_wait<0>();
            }
            wg_pin_all(s);
            if constexpr (BLOCK) { /* mask here, then the softmax as of a full tile */
                wg_block_mask_tile<NWG, KT>(s, red, nr, i, n_ctx, rv, klo, khi, xlo, xhi, glo, ghi);
                online_softmax<KT>(s, m, l, corr, 0, lo, hi, true, sl2);
                (void)full_tile;
            } else {
                online_softmax<KT>(s, m, l, corr, kb, lo, hi, full_tile, sl2);
            }
            wg_wait<0>();
            wg_pin_all(o);
            wg_pin_u(pa);
            if (MODE >= 2 && decltype(with_pv)::value && lane == 0)
                mb_arrive(empty + (i - 1) % NS); /* this warp is done with tile i - 1 */
            wg_rescale<D, KT>(o, corr, s, pa);
            pv = wg_desc(Vt, a.lbo_v, a.sbo_v);
        };
        step(0, std::false_type());
        for (int i = 1; i < n_tiles; i++)
            step(i, std::true_type());
        wg_fence();
        wg_issue_pv<D, KT>(o, pa, pv);
        wg_wait<0>();
        wg_pin_all(o);
        wg_pin_u(pa);
    }
    cp_wait<0>();
    __syncthreads(); /* shared memory is free: stage the output rows (stride LD) */

    bf16 *St = (bf16 *)sm + (64 * wg + 16 * wq) * LD;
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lt = quad_sum(l[r]);
        inv[r] = lt > 0.0f ? 1.0f / lt : 0.0f;
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        *(uint32_t *)(St + g * LD + dt * 8 + 2 * tg) =
            pack_bf16x2(o[dt][0] * inv[0], o[dt][1] * inv[0]);
        *(uint32_t *)(St + (g + 8) * LD + dt * 8 + 2 * tg) =
            pack_bf16x2(o[dt][2] * inv[1], o[dt][3] * inv[1]);
    }
    __syncwarp();
    for (int idx = lane; idx < 16 * CPR; idx += 32) {
        int rr = idx / CPR, c = idx % CPR, r = 64 * wg + 16 * wq + rr, t, h;
        if constexpr (BLOCK) {
            r -= 64 * wg;
            if (r >= NR || myblk >= bs.n_blocks) continue;
            t = myblk * bs.B + r / group, h = hk * group + r % group;
        } else {
            if (r >= NR) continue;
            t = t_a + r / group, h = hk * group + r % group;
        }
        *(uint4 *)(a.out + ((size_t)t * a.H + h) * D + c * 8) =
            *(const uint4 *)(St + rr * LD + c * 8);
    }
    if constexpr (BLOCK) {
        const float lt[2] = {quad_sum(l[0]), quad_sum(l[1])};
        if (bs.lse && tg == 0 && myblk < bs.n_blocks)
            block_lse_out(bs, myblk, hk, group, NR, wq, g, m, lt);
    }
#else
    (void)a, (void)bs;
#endif
}

template <int D, int NWG, int KT, int MODE, int NS, int DIST>
__global__ void __launch_bounds__(NWG * 128, 1) k_wg_causal(wg_args a) {
    wg_fwd<D, NWG, KT, MODE, NS, DIST, false>(a, wg_blk{});
}

template <int D, int NWG, int KT, int MODE, int NS, int DIST>
__global__ void __launch_bounds__(NWG * 128, 1) k_wg_block(wg_args a, wg_blk bs) {
    wg_fwd<D, NWG, KT, MODE, NS, DIST, true>(a, bs);
}

/* ---- block mode with a producer warpgroup (k_wg_block_tma) ---- */

/* The tensor maps of k and v ([Tk, Hk, D] bf16) for k_wg_block_tma. SW (the default): 4 dims
 * (d % 64, kv head, key, d / 64), box 64 x 1 x KT x D / 64, 128-byte swizzle: one copy lands a
 * tile of KT keys as D / 64 blocks of KT rows of 128 bytes (wg_desc_sw128's layout). Else 5
 * dims (d % 8, kv head, key % 8, d / 8, key / 8), box 8 x 1 x 8 x D / 8 x KT / 8: a tile from a
 * multiple of 8 keys in the core-matrix layout above (16-byte pieces: twice the L2 sectors).
 * Keys past Tk are zero-filled. QT kernels also take q ([n_blocks B, H, D]): 4 dims (d % 64,
 * head, token, d / 64), box 64 x group x B x 1, 128-byte swizzle: one copy lands half of d of a
 * block's B x group rows (row r: token r / group, head r % group) as rows of 128 bytes; tokens
 * past the last block are zero-filled. */
struct wg_kv_maps {
    CUtensorMap k, v, q;
};

/* A work item's record in shared memory (k_wg_block_tma): the key schedule (wg_block_setup; ib[15]
 * the item, -1: none is left), per consumer warpgroup the mask bounds (mk: the block's context
 * [klo, khi) less its own keys [xlo, xhi), its slots [glo, ghi) of the own-keys tile, keep), and
 * the spans of the item's blocks. Written by the producer warp, read by the consumers. */
template <int NWG> struct wgt_item {
    int ib[16];
    int mk[NWG][8];
    nn_block_span sp[NWG];
};

/* Shared memory of k_wg_block_tma: NQ buffers of Q (NWG warpgroups of 64 rows), NS stages of K
 * and V, NQ item records, then the mbarriers: full and empty per stage, ifull and iempty per
 * item record */
template <int D, int NWG, int KT, int NS, int NQ> static size_t wgt_smem(void) {
    return (size_t)NQ * 64 * NWG * D * 2 + (size_t)NS * 2 * KT * D * 2 +
           NQ * sizeof(wgt_item<NWG>) + (2 * NS + 2 * NQ) * sizeof(uint64_t);
}

/* bar.sync on named barrier id (1 .. 15) for n threads (whole warps) */
__device__ __forceinline__ void wg_bar(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* The persistent kernels' work counter (next item less the grid, CTAs finished); the last CTA of
 * a launch to finish resets both, so launches on one device must not overlap. */
__device__ int g_wgt_ctr[2];

/* One CTA of the block forward with a producer: warpgroups 0 .. NWG - 1 consume (warpgroup w the
 * rows of block NWG c + w of the work item, as k_wg_block), warpgroup NWG produces. Work items
 * (c, kv head hk), heaviest first: item k is c = n_c - 1 - k / Hk, hk = k % Hk (by_head: c =
 * n_c - 1 - k % n_c, hk = k / n_c). A CTA takes item blockIdx.x; PER: then more from
 * g_wgt_ctr until none is left (grid: at most one CTA per SM), the stage ring running on across
 * items. The producer's first warp writes an item's record (lane 0: spans, masks, schedule) and
 * announces it on ifull (QT: with the tensor copies of the item's Q, 2 per block), then fills
 * stage s % NS with the s-th tile of the CTA once the consumers released tile s - NS: a context
 * tile by two tensor copies (lane 0; full counts one arrival plus the bytes), the own-keys tile
 * by cp.async (the warp's 32 lanes, zero-filled; wait, async-proxy fence, one arrival). Item
 * records and (QT) Q buffers alternate (NQ 2 with PER): the producer rewrites one after the
 * consumers released it on iempty (after their output), so an item's prologue and first tiles
 * load under the previous item's loop. Registers: the producer gives back to RP per thread, the
 * consumers take RC (setmaxnreg; NWG 128 RC + 128 RP is the pool fixed at launch). The consumer
 * loop is mode 3's without loads: wait full, S of tile i with P V of tile i - 1, mask and
 * softmax, each warp arrives on empty of tile i - 1 (and of the last tile after its P V). Q: QT,
 * swizzled by tensor copies, the output staged in the warpgroup's own Q rows (16-byte chunks
 * XOR-swizzled by row); else cp.async by the consumers into the core-matrix layout and the
 * output staged through padded rows after a barrier of all consumers. */
template <int D, int NWG, int KT, int NS, int RC, int RP, bool SW, bool QT, bool PER>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
    k_wg_block_tma(wg_args a, wg_blk bs, const __grid_constant__ wg_kv_maps mp) {
#if WG_DEVICE
    static_assert(!QT || SW, "swizzled Q with swizzled K and V");
    static_assert(!PER || QT, "a persistent CTA stages its output in its own Q rows");
    static_assert(4 * NWG + 2 <= 15, "ib[15] holds the item");
    constexpr int TILE_B = KT * D * 2, LD = D + 8, CPR = D / 8, NQ = PER ? 2 : 1;
    constexpr int QB = 64 * NWG * D * 2; /* one Q buffer */
    /* setmaxnreg moves registers within what the launch gave the CTA: its threads times the
     * per-thread count that the launch bounds allow (65536 / threads, down to a multiple of 8);
     * more, and the consumers' increase waits forever (a 2 x 128 variant at 240 hung) */
    static_assert(NWG * 128 * RC + 128 * RP <=
                      (65536 / ((NWG + 1) * 128) / 8 * 8) * (NWG + 1) * 128,
                  "the register pool");
    extern __shared__ __align__(1024) unsigned char sm[];
    unsigned char *Qs = sm, *KV = sm + NQ * QB;
    wgt_item<NWG> *items = (wgt_item<NWG> *)(KV + NS * 2 * TILE_B);
    uint64_t *full = (uint64_t *)(items + NQ), *empty = full + NS;
    uint64_t *ifull = empty + NS, *iempty = ifull + NQ;
    const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, wq = warp % 4;
    const int lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int n_c = (bs.n_blocks + NWG - 1) / NWG, n_items = n_c * a.Hk, group = a.group;
    const int NR = bs.B * group; /* rows of a block */
    auto item_c = [&](int k) { return n_c - 1 - (bs.by_head ? k % n_c : k / a.Hk); };
    auto item_hk = [&](int k) { return bs.by_head ? k / n_c : k % a.Hk; };
    if (threadIdx.x == 32) {
        for (int j = 0; j < NS; j++)
            mb_init(full + j, 1), mb_init(empty + j, NWG * 4);
        for (int j = 0; j < NQ; j++)
            mb_init(ifull + j, 1), mb_init(iempty + j, NWG * 4);
        mb_init_fence();
    }
    __syncthreads(); /* the mbarriers' init is visible */

    if (wg == NWG) { /* the producer */
        wg_setmaxnreg_dec<RP>();
        if (warp != 4 * NWG) return;
        int k = blockIdx.x, seq = 0; /* the item; tiles loaded (the next goes to seq % NS) */
        for (int n = 0;; n++) {
            const int b = n % NQ;
            wgt_item<NWG> *it = items + b;
            if (n >= NQ) mb_wait(iempty + b, (n / NQ - 1) & 1); /* item n - NQ is out */
            if (n > 0) {
                int nk = 0;
                if (lane == 0) nk = gridDim.x + atomicAdd(g_wgt_ctr, 1);
                k = __shfl_sync(0xffffffffu, nk, 0);
            }
            if (k >= n_items) { /* PER: none left */
                if (lane == 0) {
                    it->ib[15] = -1;
                    mb_arrive(ifull + b);
                    __threadfence(); /* this CTA's last take precedes its count */
                    if (atomicAdd(g_wgt_ctr + 1, 1) == (int)gridDim.x - 1)
                        atomicExch(g_wgt_ctr, 0), atomicExch(g_wgt_ctr + 1, 0);
                }
                return;
            }
            const int c = item_c(k), hk = item_hk(k);
            if (lane == 0) {
                for (int w = 0; w < NWG; w++) {
                    const int blk = c * NWG + w;
                    nn_block_span sp = {0, 0, 0, 0};
                    if (blk < bs.n_blocks) sp = bs.spans[blk];
                    it->sp[w] = sp;
                    int *mk = it->mk[w];
                    mk[0] = sp.ctx_begin, mk[1] = min(sp.ctx_end, bs.Tk);
                    mk[2] = sp.blk_begin, mk[3] = sp.blk_begin + bs.B;
                    mk[4] = w * bs.B, mk[5] = mk[4] + max(0, min(bs.B, bs.Tk - sp.blk_begin));
                    mk[6] = sp.keep;
                }
                wg_block_setup<NWG, KT, SW ? 1 : 8>(bs, c * NWG, it->ib, it->sp);
                it->ib[15] = k;
                if constexpr (QT) { /* the record, then Q: 2 copies (halves of d) per block */
                    unsigned char *q = Qs + b * QB;
                    mb_arrive_tx(ifull + b, NWG * (D / 64) * NR * 128);
                    for (int w = 0; w < NWG; w++)
                        for (int h = 0; h < D / 64; h++)
                            tma_load_4d(q + w * 64 * D * 2 + h * 64 * 128, &mp.q, 0, hk * group,
                                        (c * NWG + w) * bs.B, h, ifull + b);
                } else {
                    mb_arrive(ifull + b);
                }
            }
            __syncwarp(); /* lane 0's record is visible to the warp */
            const int *ib = it->ib;
            const int nr = ib[3 * NWG + 1], n_ctx = ib[2 * NWG + nr];
            for (int j = 0; j <= n_ctx; j++, seq++) {
                const int sg = seq % NS;
                unsigned char *st = KV + sg * 2 * TILE_B;
                if (seq >= NS) mb_wait(empty + sg, (seq / NS - 1) & 1);
                if (j < n_ctx) {
                    if (lane == 0) {
                        int kb, re;
                        wg_block_tile<NWG, KT>(ib, nr, j, kb, re);
                        mb_arrive_tx(full + sg, 2 * TILE_B);
                        if constexpr (SW) {
                            tma_load_4d(st, &mp.k, 0, hk, kb, 0, full + sg);
                            tma_load_4d(st + TILE_B, &mp.v, 0, hk, kb, 0, full + sg);
                        } else {
                            tma_load_5d(st, &mp.k, 0, hk, 0, 0, kb / 8, full + sg);
                            tma_load_5d(st + TILE_B, &mp.v, 0, hk, 0, 0, kb / 8, full + sg);
                        }
                    }
                } else {
                    if constexpr (SW)
                        issue_own_sw<D, NWG, KT>(a, bs, ib, hk, st, lane, 32);
                    else
                        issue_own<D, NWG, KT>(a, bs, ib, hk, st, lane, 32);
                    cp_commit();
                    cp_wait<0>();
                    fence_async_smem();
                    __syncwarp();
                    if (lane == 0) mb_arrive(full + sg);
                }
            }
            if (!PER) return;
        }
    }

    wg_setmaxnreg_inc<RC>();
    int seq = 0; /* tiles consumed by this CTA before the item's first */
    for (int n = 0;; n++) {
        const int b = n % NQ;
        const wgt_item<NWG> *it = items + b;
        unsigned char *Qw = Qs + b * QB + wg * 64 * D * 2;
        if constexpr (!QT) { /* one item, blockIdx.x: Q now, the record below */
            const int myblk = item_c(blockIdx.x) * NWG + wg, hk = item_hk(blockIdx.x);
            load_cm<D, 64>(
                Qw, a.q,
                [&](int rl) -> long long {
                    if (rl >= NR || myblk >= bs.n_blocks) return -1;
                    int t = myblk * bs.B + rl / group, h = hk * group + rl % group;
                    return ((long long)t * a.H + h) * D;
                },
                threadIdx.x % 128, 128);
            cp_commit();
        }
        mb_wait(ifull + b, (n / NQ) & 1); /* the record (QT: and Q) of item n */
        const int *ib = it->ib;
        const int k = ib[15];
        if (k < 0) break; /* PER: none left */
        const int hk = item_hk(k), myblk = item_c(k) * NWG + wg;
        const int nr = ib[3 * NWG + 1], n_ctx = ib[2 * NWG + nr], n_tiles = n_ctx + 1;
        if constexpr (!QT) {
            cp_wait<0>();
            fence_async_smem();
            wg_bar(1 + wg, 128); /* this warpgroup's Q landed */
        }
        const int *mk = it->mk[wg];
        int lo[2] = {0, 0}, hi[2] = {0, 0};

        const float sl2 = 1.0f / sqrtf((float)D) * LOG2E; /* a.scale, the launcher's 1 / sqrt(d) */
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        uint32_t pa[KT / 16][4];
        float s[KT / 8][4], corr[2];
        uint64_t pv = 0;
        auto step = [&](int i, auto with_pv) {
            const int sg = (seq + i) % NS;
            mb_wait(full + sg, ((seq + i) / NS) & 1);
            const unsigned char *Kt = KV + sg * 2 * TILE_B, *Vt = Kt + TILE_B;
            wg_fence();
            if constexpr (QT) { /* k16 step kk: 32 kk bytes into the 128-byte rows of d / 64 */
                wg_ss_first<KT>(s, wg_desc_sw128(Qw, 16, 1024), wg_desc_sw128(Kt, 16, 1024));
#pragma unroll
                for (int kk = 1; kk < D / 16; kk++)
                    wg_ss<KT>(s,
                              wg_desc_sw128(Qw + (kk / 4) * 64 * 128 + (kk % 4) * 32, 16, 1024),
                              wg_desc_sw128(Kt + (kk / 4) * KT * 128 + (kk % 4) * 32, 16, 1024));
                wg_commit();
            } else if constexpr (SW) {
                wg_issue_s_sw<D, KT>(s, wg_desc(Qw, 128, 16 * D), wg_desc_sw128(Kt, 16, 1024));
            } else {
                wg_issue_s<D, KT>(s, wg_desc(Qw, 128, 16 * D), wg_desc(Kt, 128, 16 * D));
            }
            if constexpr (decltype(with_pv)::value) {
                if constexpr (SW) /* k16 step: 16 rows of 128 bytes */
                    wg_issue_pv<D, KT, 128>(o, pa, pv);
                else
                    wg_issue_pv<D, KT>(o, pa, pv);
                wg_wait<1>();
            } else {
                wg_wait<0>();
            }
            wg_pin_all(s);
            const volatile int *vk = mk;
            const int klo = vk[0], khi = vk[1], xlo = vk[2], xhi = vk[3];
            bool rv[2]; /* rows g, g + 8 have keys */
#pragma unroll
            for (int e = 0; e < 2; e++)
                rv[e] = vk[6] && 16 * wq + g + 8 * e < NR;
            wg_block_mask_tile<NWG, KT>(s, ib, nr, i, n_ctx, rv, klo, khi, xlo, xhi, vk[4], vk[5]);
            online_softmax<KT>(s, m, l, corr, 0, lo, hi, true, sl2);
            wg_wait<0>();
            wg_pin_all(o);
            wg_pin_u(pa);
            if (decltype(with_pv)::value && lane == 0)
                mb_arrive(empty + (seq + i - 1) % NS); /* this warp is done with tile i - 1 */
            wg_rescale<D, KT>(o, corr, s, pa);
            pv = SW ? wg_desc_sw128(Vt, KT * 128, 1024) : wg_desc(Vt, 16 * D, 128);
        };
        step(0, std::false_type());
        for (int i = 1; i < n_tiles; i++)
            step(i, std::true_type());
        wg_fence();
        if constexpr (SW)
            wg_issue_pv<D, KT, 128>(o, pa, pv);
        else
            wg_issue_pv<D, KT>(o, pa, pv);
        wg_wait<0>();
        wg_pin_all(o);
        wg_pin_u(pa);
        if (lane == 0) mb_arrive(empty + (seq + n_tiles - 1) % NS); /* done with the last tile */
        seq += n_tiles;

        float lt[2], inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            lt[r] = quad_sum(l[r]);
            inv[r] = lt[r] > 0.0f ? 1.0f / lt[r] : 0.0f;
        }
        /* the warp's 16 staged rows of o / l out to a.out by 16-byte chunks, chunk c of row r at
         * St + at(r, c) */
        auto copy_out = [&](const unsigned char *St, auto at) {
            __syncwarp();
            if (myblk < bs.n_blocks)
                for (int idx = lane; idx < 16 * CPR; idx += 32) {
                    int rr = idx / CPR, cc = idx % CPR, r = 16 * wq + rr;
                    if (r >= NR) continue;
                    int t = myblk * bs.B + r / group, h = hk * group + r % group;
                    *(uint4 *)(a.out + ((size_t)t * a.H + h) * D + cc * 8) =
                        *(const uint4 *)(St + at(rr, cc));
                }
        };
        if constexpr (QT) {
            /* the warpgroup's Q rows are free once all its warps passed their last S: warp wq
             * stages its rows 16 wq .. 16 wq + 15 there (256 bytes a row, 16-byte chunk j of row
             * r at chunk j ^ (r % 8): conflict-free stores and loads) */
            wg_bar(1 + wg, 128);
            unsigned char *St = Qw + 16 * wq * D * 2;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                *(uint32_t *)(St + g * D * 2 + ((dt ^ g) * 16) + 4 * tg) =
                    pack_bf16x2(o[dt][0] * inv[0], o[dt][1] * inv[0]);
                *(uint32_t *)(St + (g + 8) * D * 2 + ((dt ^ g) * 16) + 4 * tg) =
                    pack_bf16x2(o[dt][2] * inv[1], o[dt][3] * inv[1]);
            }
            copy_out(St, [&](int r, int c) { return r * D * 2 + ((c ^ (r % 8)) * 16); });
            if (PER) { /* the item's record and Q buffer may be rewritten (by tensor copies) */
                fence_async_smem();
                __syncwarp();
                if (lane == 0) mb_arrive(iempty + b);
            }
        } else {
            wg_bar(1 + NWG, NWG * 128); /* every consumer is done: stage the rows (stride LD) */
            bf16 *St = (bf16 *)sm + (64 * wg + 16 * wq) * LD;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                *(uint32_t *)(St + g * LD + dt * 8 + 2 * tg) =
                    pack_bf16x2(o[dt][0] * inv[0], o[dt][1] * inv[0]);
                *(uint32_t *)(St + (g + 8) * LD + dt * 8 + 2 * tg) =
                    pack_bf16x2(o[dt][2] * inv[1], o[dt][3] * inv[1]);
            }
            copy_out((const unsigned char *)St, [&](int r, int c) { return (r * LD + c * 8) * 2; });
        }
        if (bs.lse && tg == 0 && myblk < bs.n_blocks)
            block_lse_out(bs, myblk, hk, group, NR, wq, g, m, lt);
        if (!PER) break;
    }
#else
    (void)a, (void)bs, (void)mp;
#endif
}

/* ------------------------------------------------------------------------------------------ */

/* The kernels: DFLASH_CUDA_ATTN_CAUSAL name, d, rows per CTA, and their shared-memory limit
 * (init) and launch. */
template <int D, int NWG, int KT, int MODE, int NS, int DIST> static int wg_attr(void) {
    return cudaFuncSetAttribute(k_wg_causal<D, NWG, KT, MODE, NS, DIST>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)wg_smem<D, NWG, KT, NS>()) != cudaSuccess;
}

template <int D, int NWG, int KT, int MODE, int NS, int DIST>
static void wg_launch(cudaStream_t st, wg_args &a) {
    a.RT = 64 * NWG / a.group;
    dim3 grid((a.T + a.RT - 1) / a.RT, a.Hk);
    k_wg_causal<D, NWG, KT, MODE, NS, DIST><<<grid, NWG * 128, wg_smem<D, NWG, KT, NS>(), st>>>(a);
}

typedef struct wg_kernel {
    const char *name;
    int d, rows;
    int (*attr)(void);
    void (*launch)(cudaStream_t, wg_args &);
} wg_kernel;

#define WG_K(name, D, NWG, KT, MODE, NS, DIST)                                                     \
    {                                                                                              \
        name, D, 64 * NWG, wg_attr<D, NWG, KT, MODE, NS, DIST>,                                    \
            wg_launch<D, NWG, KT, MODE, NS, DIST>                                                  \
    }
/* the first of each head dim is the default; the others for comparison (NOTES.md: d 128,
 * wg3x64r 306 TFLOP/s on 4 x 3072 tokens, wg3x64r5 310, wg3x64m 286, wg3x64p 264, wg3x64 185) */
static const wg_kernel wg_kernels[] = {
    WG_K("wg3x64r", 128, 3, 64, 3, 4, 2), WG_K("wg3x64r5", 128, 3, 64, 3, 5, 3),
    WG_K("wg3x64m", 128, 3, 64, 2, 4, 2), WG_K("wg3x64p", 128, 3, 64, 1, 3, 1),
    WG_K("wg3x64", 128, 3, 64, 0, 3, 2),  WG_K("wg2x128", 64, 2, 128, 0, 3, 2),
};
#define N_WG_KERNELS (int)(sizeof wg_kernels / sizeof wg_kernels[0])

/* DFLASH_CUDA_ATTN_CAUSAL: unset, empty or "wgmma": the default kernel of the head dim; a name
 * of wg_kernels: that one where its head dim matches (else the default); anything else (a
 * mma.sync shape such as 4x32): none. */
static const wg_kernel *wg_pick(int d) {
    const char *e = getenv("DFLASH_CUDA_ATTN_CAUSAL");
    bool named = e && *e && strcmp(e, "wgmma") != 0, known = false;
    const wg_kernel *dflt = NULL;
    for (int i = 0; i < N_WG_KERNELS; i++) {
        const wg_kernel *k = &wg_kernels[i];
        known = known || (named && strcmp(k->name, e) == 0);
        if (k->d != d) continue;
        if (named && strcmp(k->name, e) == 0) return k;
        if (!dflt) dflt = k;
    }
    return named && !known ? NULL : dflt;
}

/* The block forward's cp.async kernel (k_wg_block): d 128, 3 warpgroups (blocks) of 64 rows,
 * 64-key tiles, mode 3, NS 4, DIST 2 (as wg3x64r). */
#define WG_BLOCK_K 128, 3, 64, 3, 4, 2
#define WG_BLOCK_NWG 3

/* The block forward's producer kernels (k_wg_block_tma): DFLASH_CUDA_ATTN_BLOCK name, blocks
 * (consumer warpgroups) per CTA, keys per tile, swizzled K and V, Q by tensor copies,
 * persistent; the first is the default. */
typedef struct wgt_kernel {
    const char *name;
    int nwg, kt, sw, qt, per;
    int (*attr)(void);
    void (*launch)(cudaStream_t, const wg_args &, const wg_blk &, const wg_kv_maps &);
} wgt_kernel;

/* the persistent grid: the device's multiprocessors, or DFLASH_CUDA_ATTN_BLOCK_CTAS (tests only:
 * fewer CTAs, so that each takes many items) */
static int g_wg_nsm;

#define WGT_T NWG, KT, NS, RC, RP, SW, QT, PER
#define WGT_TP int NWG, int KT, int NS, int RC, int RP, bool SW, bool QT, bool PER
template <WGT_TP> static int wgt_attr(void) {
    return cudaFuncSetAttribute(k_wg_block_tma<128, WGT_T>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)wgt_smem<128, NWG, KT, NS, PER ? 2 : 1>()) != cudaSuccess;
}

template <WGT_TP>
static void wgt_launch(cudaStream_t st, const wg_args &a, const wg_blk &bs, const wg_kv_maps &mp) {
    const int n_items = (bs.n_blocks + NWG - 1) / NWG * a.Hk;
    dim3 grid(PER ? min(n_items, g_wg_nsm) : n_items);
    k_wg_block_tma<128, WGT_T>
        <<<grid, (NWG + 1) * 128, wgt_smem<128, NWG, KT, NS, PER ? 2 : 1>(), st>>>(a, bs, mp);
}

#define WGT_K(name, NWG, KT, NS, RC, RP, SW, QT, PER)                                              \
    {                                                                                              \
        name, NWG, KT, SW, QT, PER, wgt_attr<NWG, KT, NS, RC, RP, SW, QT, PER>,                    \
            wgt_launch<NWG, KT, NS, RC, RP, SW, QT, PER>                                           \
    }
/* names: NWG x KT, s5: NS 5 (else 4), n: no swizzle (5-dim maps, 16-byte pieces), q: Q by tensor
 * copies (swizzled), p: persistent (with q; two Q buffers, so NS 4) */
static const wgt_kernel wgt_kernels[] = {
    WGT_K("wgt3x64p", 3, 64, 4, 160, 32, true, true, true),
    WGT_K("wgt3x64s5", 3, 64, 5, 160, 32, true, false, false),
    WGT_K("wgt3x64", 3, 64, 4, 160, 32, true, false, false),
    WGT_K("wgt3x64s5n", 3, 64, 5, 160, 32, false, false, false),
    WGT_K("wgt3x64s5q", 3, 64, 5, 160, 32, true, true, false),
    WGT_K("wgt3x64q", 3, 64, 4, 160, 32, true, true, false),
};
#define N_WGT_KERNELS (int)(sizeof wgt_kernels / sizeof wgt_kernels[0])

static int wg_block_attr(void) {
    int bad = cudaFuncSetAttribute(k_wg_block<WG_BLOCK_K>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)wg_smem<128, 3, 64, 4>()) != cudaSuccess;
    for (int i = 0; i < N_WGT_KERNELS; i++)
        bad |= wgt_kernels[i].attr();
    return bad;
}

/* DFLASH_CUDA_ATTN_BLOCK: unset, empty or "wgmma": the default producer kernel, else (no tensor
 * copies) the cp.async one; a name of wgt_kernels: that one; "wgcp": the cp.async kernel;
 * anything else ("mma", or a mma.sync shape such as 4x16): none, the mma.sync kernel serves.
 * Returns 0 none, 1 the cp.async kernel, 2 a producer kernel (*k). */
static int wg_block_pick(const wgt_kernel **k) {
    static int on = -1;
    static const wgt_kernel *pk;
    if (on < 0) {
        const char *e = getenv("DFLASH_CUDA_ATTN_BLOCK");
        on = !e || !*e || strcmp(e, "wgmma") == 0 ? 2 : strcmp(e, "wgcp") == 0 ? 1 : 0;
        pk = &wgt_kernels[0];
        for (int i = 0; e && i < N_WGT_KERNELS; i++)
            if (strcmp(e, wgt_kernels[i].name) == 0) on = 2, pk = &wgt_kernels[i];
    }
    *k = pk;
    return on;
}

static wg_encode_fn g_wg_encode; /* wg_tensor_map_encoder's; NULL: the cp.async kernel */

/* The maps of k and v (wg_kv_maps) for tiles of kt keys, swizzled (sw) or not, and where q is
 * not NULL the map of q ([T, H, 128], blocks of B tokens, GQA group H / Hk); 0, or -1 where the
 * encoder refuses */
static int wg_kv_maps_make(wg_kv_maps *mp, const bf16 *k, const bf16 *v, int Tk, int Hk, int kt,
                           int sw, const bf16 *q, int T, int H, int B) {
    const cuuint64_t row = 128 * sizeof(bf16), hk = (cuuint64_t)Hk;
    /* unswizzled k, v: core matrices of 8 rows x 16 bytes */
    const cuuint64_t dims[5] = {8, hk, 8, 128 / 8, (cuuint64_t)Tk / 8};
    const cuuint64_t strides[4] = {row, hk * row, 8 * sizeof(bf16), 8 * hk * row};
    const cuuint32_t box[5] = {8, 1, 8, 128 / 8, (cuuint32_t)kt / 8}, one[5] = {1, 1, 1, 1, 1};
    const bf16 *src[2] = {k, v};
    CUtensorMap *dst[2] = {&mp->k, &mp->v};
    bool ok = true;
    for (int i = 0; i < 2 && ok; i++)
        ok = sw ? wg_map_sw128(g_wg_encode, dst[i], src[i], Hk, Tk, 1, kt, 2) == 0
                : g_wg_encode(dst[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, (void *)src[i], dims,
                              strides, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    if (ok && q) ok = wg_map_sw128(g_wg_encode, &mp->q, q, H, T, H / Hk, B, 1) == 0;
    if (!ok) {
        static int told;
        if (!told++) fprintf(stderr, "k_wg_block_tma: the encoder refused the map of k, v or q\n");
        return -1;
    }
    return 0;
}

static int g_wg_ready; /* 1: the kernels' limits are set and the device runs sm_90a code */

int cuda_wg_attention_init(void) {
    g_wg_ready = 0;
    if (!wg_device_runs_sm90a()) return 0;
    g_wg_encode = wg_tensor_map_encoder(); /* NULL: the block forward loads by cp.async */
    int bad = 0;
    for (int i = 0; i < N_WG_KERNELS; i++)
        bad |= wg_kernels[i].attr();
    bad |= wg_block_attr();
    int dev = 0;
    bad |= cudaGetDevice(&dev) != cudaSuccess ||
           cudaDeviceGetAttribute(&g_wg_nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess;
    const int ctas = (int)config_env_int("DFLASH_CUDA_ATTN_BLOCK_CTAS", 1, INT_MAX, g_wg_nsm);
    if (ctas < g_wg_nsm) g_wg_nsm = ctas;
    if (bad) {
        (void)cudaGetLastError(); /* no usable image: the mma.sync kernels serve */
        return 0;
    }
    g_wg_ready = 1;
    return 0;
}

int cuda_wg_attention_causal_fwd(cudaStream_t st, bf16 *out, const bf16 *q, const bf16 *k,
                                 const bf16 *v, const int32_t *seq_off, int n_seqs, int T, int H,
                                 int Hk, int d) {
    if (!g_wg_ready || (d != 64 && d != 128) || Hk <= 0 || H % Hk != 0 || n_seqs <= 0 || T <= 0)
        return -1;
    const wg_kernel *kn = wg_pick(d);
    const uintptr_t al = (uintptr_t)out | (uintptr_t)q | (uintptr_t)k | (uintptr_t)v;
    if (!kn || H / Hk > kn->rows || (al & 15u)) return -1;
    wg_args a = {};
    a.out = out, a.q = q, a.k = k, a.v = v, a.seq_off = seq_off, a.n_seqs = n_seqs, a.T = T;
    a.H = H, a.Hk = Hk, a.group = H / Hk, a.scale = 1.0f / sqrtf((float)d);
    a.lbo_qk = 128, a.sbo_qk = 16 * d, a.lbo_v = 16 * d, a.sbo_v = 128;
    kn->launch(st, a);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int cuda_wg_attention_block_fwd(cudaStream_t st, bf16 *out, float *lse, const bf16 *q,
                                const bf16 *k, const bf16 *v, const nn_block_span *spans,
                                int n_blocks, int B, int Tk, int H, int Hk, int d) {
    const wgt_kernel *kt = NULL;
    int on = wg_block_pick(&kt);
    if (!g_wg_ready || !on || d != 128 || Hk <= 0 || H % Hk != 0 || n_blocks <= 0 || B <= 0 ||
        Tk <= 0)
        return -1;
    const uintptr_t al = (uintptr_t)out | (uintptr_t)q | (uintptr_t)k | (uintptr_t)v;
    /* a block's rows fit one warpgroup, the CTA's own keys one tile */
    if (B * (H / Hk) > 64 || WG_BLOCK_NWG * B > 64 || (al & 15u)) return -1;
    wg_args a = {};
    a.out = out, a.q = q, a.k = k, a.v = v, a.T = n_blocks * B;
    a.H = H, a.Hk = Hk, a.group = H / Hk, a.scale = 1.0f / sqrtf((float)d);
    a.lbo_qk = 128, a.sbo_qk = 16 * d, a.lbo_v = 16 * d, a.sbo_v = 128;
    static int by_head = -1; /* DFLASH_CUDA_ATTN_BLOCK_ORDER=head: the producer kernels' CTAs by
                                kv head (for comparison) */
    if (by_head < 0) {
        const char *e = getenv("DFLASH_CUDA_ATTN_BLOCK_ORDER");
        by_head = e && strcmp(e, "head") == 0;
    }
    wg_blk bs = {lse, spans, n_blocks, B, Tk, by_head};
    wg_kv_maps mp;
    /* the producer kernels (without the swizzle: whole 8-key groups, Tk % 8 == 0) */
    if (on == 2 && g_wg_encode && (kt->sw || Tk % 8 == 0) && kt->nwg * B <= kt->kt &&
        wg_kv_maps_make(&mp, k, v, Tk, Hk, kt->kt, kt->sw, kt->qt ? q : NULL, n_blocks * B, H,
                        B) == 0) {
        kt->launch(st, a, bs, mp);
    } else {
        dim3 grid((n_blocks + WG_BLOCK_NWG - 1) / WG_BLOCK_NWG, Hk);
        k_wg_block<WG_BLOCK_K><<<grid, WG_BLOCK_NWG * 128, wg_smem<128, 3, 64, 4>(), st>>>(a, bs);
    }
    CUDA_CHECK_LAUNCH();
    return 0;
}
