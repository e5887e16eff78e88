/* attn_bwd: what the two fused block-attention backward kernels share (k_bwd_fused on mma.sync
 * in ops_cuda_attn_bwd.cu, k_wgb_fused on wgmma in ops_cuda_attn_wgbwd.cu): their argument
 * block bwd_args (filled by cuda_bwd_attention_block_bwd, which also runs k_bwd_rowD before and
 * k_bwd_dq_out after either kernel), the split of a key tile's visits into pieces by block
 * ranges (and the items of the wgmma kernel's sorted schedule of them, bwd_item), the bulk-copy
 * reduction of a warp's dQ tile into the fp32 scratch dqacc, and the visibility of a warp's keys
 * to a block. Both kernels are key-major: a CTA owns a tile of keys of one kv head and visits,
 * 64 query rows at a time, the blocks that see it.
 * Header-only device code (no -rdc in this build); every helper names the threads it needs.
 */
#ifndef DFLASH_ATTN_BWD_CUH
#define DFLASH_ATTN_BWD_CUH

#include "attn_spans.cuh"
#include "mma_frag.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define FROWS 64        /* query rows per visit */
#define FLOG2E 1.4426950408889634f

/* One item of the sorted schedule (k_bwd_plan): key tile x (keys x WGB_KEYS ..) of every kv
 * head, its piece z, the piece's hit range [h_lo, h_hi) and the tile's piece count nsplit. */
typedef struct bwd_item {
    int x, z, nsplit, h_lo, h_hi;
} bwd_item;

/* How a key tile's visits are cut into pieces (bwd_args.by_block): by hit index
 * (attn_split_piece), by block ranges (bwd_piece_blocks), or by block ranges run heaviest first
 * from the list of k_bwd_plan by persistent CTAs (the wgmma kernel only). */
enum { BWD_PIECES_HITS = 0, BWD_PIECES_BLOCKS = 1, BWD_PIECES_SORTED = 2 };

typedef struct bwd_args {
    const bf16 *q, *k, *v, *dout, *o;
    const float *lse, *dsave;
    float *dsave_w; /* k_bwd_rowD's output (= dsave) */
    float *dqacc, *acc;
    int *tickets;
    bf16 *dq, *dk, *dv;
    const nn_block_span *spans;
    int n_blocks, B, Tk, H, Hk, group, split_max, vps;
    float inv_group; /* 1.0f / group, for bwd_div_small */
    int by_block;    /* BWD_PIECES_*; SORTED: items and work are set */
    bwd_item *items; /* SORTED: the items, heaviest first (k_bwd_plan writes them) */
    int *work;       /* SORTED: [0] the next work index to take, [1] the item count */
    int list_round;  /* k_wgb_fused: blocks per round of its visit lists (256; tests: fewer) */
    int split_bulk;  /* k_wgb_fused: split pieces' dk, dv into acc by bulk reductions (else
                      * float4 atomics) */
    float scale;
} bwd_args;

/* floor(x / n) for 0 <= x < 2^20 and 1 <= n <= 64, given inv = 1.0f / n (IEEE, as the host
 * or 1.0f / n computes it): (x + 0.5) / n lies at least 0.5 / n from an integer, more than the
 * rounding of the float product there (checked for every such x and n). A few instructions
 * instead of the ~15 of an integer division by a run-time n. One thread. */
__device__ __forceinline__ int bwd_div_small(int x, float inv) {
    return (int)(((float)x + 0.5f) * inv);
}

/* The piece (of Z) of block blk when pieces are block ranges. */
__device__ __forceinline__ int bwd_piece_of(int blk, int Z, int n_blocks) {
    return (int)((long long)blk * Z / n_blocks);
}

/* The work split by block ranges (DFLASH_CUDA_ATTN_FUSED_PIECES=blocks): piece z of Z =
 * gridDim.z takes the blocks blk with bwd_piece_of(blk) == z that see keys [k0, k0 + kt), so
 * that the CTAs running at the same time (same z, neighbouring key tiles) add into the same dq
 * rows (L2 locality of the atomics). nsplit = the pieces with a hit (1 when none has: piece 0
 * then writes zero dk, dv). Gives this piece's hit indices [h_lo, h_hi); false: nothing to do
 * (uniform). All threads; contains barriers. k_bwd_plan makes the same pieces for all tiles at
 * once. */
__device__ __forceinline__ bool bwd_piece_blocks(const nn_block_span *spans, int n_blocks, int B,
                                                 int k0, int kt, int &nsplit, int &h_lo,
                                                 int &h_hi) {
    __shared__ int cnt[32];
    const int Z = gridDim.z, z = blockIdx.z;
    if (threadIdx.x < 32) cnt[threadIdx.x] = 0;
    __syncthreads();
    for (int blk = threadIdx.x; blk < n_blocks; blk += blockDim.x)
        if (attn_block_hits(spans, blk, B, k0, k0 + kt))
            atomicAdd(&cnt[bwd_piece_of(blk, Z, n_blocks)], 1);
    __syncthreads();
    int lo = 0, ns = 0;
    for (int i = 0; i < Z; i++) {
        lo += i < z ? cnt[i] : 0;
        ns += cnt[i] > 0;
    }
    h_lo = lo, h_hi = lo + cnt[z];
    if (ns == 0) {
        nsplit = 1;
        return z == 0;
    }
    nsplit = ns;
    return cnt[z] > 0;
}

#define BLD 72 /* row stride (fp32) of a warp's bulk dQ staging tile: 16 rows x 64 columns */

/* Bulk-copy engine reduction: dst[0 .. bytes) += src (fp32, 16-byte aligned, bytes % 16 == 0),
 * added to this thread's open bulk group, not committed; src must not change before
 * bulk_wait_read. */
__device__ __forceinline__ void bulk_red_add_nc(float *dst, const float *src, int bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(src);
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
        "r"(s), "r"(bytes)
        : "memory");
}

/* bulk_red_add_nc, then its bulk group committed. */
__device__ __forceinline__ void bulk_red_add(float *dst, const float *src, int bytes) {
    bulk_red_add_nc(dst, src, bytes);
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* This thread's bulk operations have read their shared sources. */
__device__ __forceinline__ void bulk_wait_read(void) {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/* Shared-memory writes of this thread become visible to the bulk-copy engine (async proxy). */
__device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* dqacc row of visit row r (query row it.cb + r of block it.blk, kv head hk; head dim D), or
 * NULL for a padding row (r >= nrows) */
template <int D>
__device__ __forceinline__ float *bwd_dq_row(const bwd_args &a, visit_item it, int hk, int nrows,
                                             int r) {
    if (r >= nrows) return NULL;
    int qr = it.cb + r, t = it.blk * a.B + qr / a.group, h = hk * a.group + qr % a.group;
    return a.dqacc + ((size_t)t * a.H + h) * D;
}

/* A warp's 16 x 8 NT fp32 dQ tile (acc in the C layout: rows g, g + 8, columns 8 n + 2 tg) added
 * into dqacc by the bulk-copy engine: staged in the warp's own stg (16 x BLD; float2 stores,
 * conflict-free), then lane r < 16 hands row r (32 NT bytes) to dst (its row's destination,
 * NULL: none), after waiting for its previous piece to have left stg. One warp; the CTA must
 * wait for its bulk groups (cp.async.bulk.wait_group 0) before it ends. */
template <int NT>
__device__ __forceinline__ void bwd_dq_bulk(const float (&acc)[NT][4], float *stg, float *dst) {
    static_assert(8 * NT <= BLD, "staging row");
    const int lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    if (lane < 16) bulk_wait_read(); /* the previous piece has left stg */
    __syncwarp();
#pragma unroll
    for (int n = 0; n < NT; n++) {
        *(float2 *)(stg + g * BLD + n * 8 + 2 * tg) = make_float2(acc[n][0], acc[n][1]);
        *(float2 *)(stg + (g + 8) * BLD + n * 8 + 2 * tg) = make_float2(acc[n][2], acc[n][3]);
    }
    fence_proxy_async();
    __syncwarp();
    if (lane < 16 && dst) bulk_red_add(dst, stg + lane * BLD, 8 * NT * (int)sizeof(float));
}

/* Whether block span sp sees keys key0 + g and key0 + g + 8 (g = lane / 4: the thread's two
 * C-layout rows when its warp holds keys key0 ..); keys at or past Tk never. One thread. */
__device__ __forceinline__ void bwd_keys_seen(const nn_block_span *sp, int B, int Tk, int key0,
                                              bool vis[2]) {
    int rng[4];
    const int nr = attn_span_ranges(sp, B, rng), g = threadIdx.x % 32 / 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = key0 + g + 8 * r;
        vis[r] = false;
        for (int j = 0; j < nr; j++)
            vis[r] = vis[r] || (key >= rng[2 * j] && key < rng[2 * j + 1]);
        vis[r] = vis[r] && key < Tk;
    }
}

/* ops_cuda_attn_wgbwd.cu (sm_90a): the wgmma backward kernel. init: its shared-memory limits,
 * where the device runs sm_90a code (never fails: else the kernel stays unused). launch: queues
 * k_wgb_fused for a (d 128, group <= 64 and 16-byte aligned buffers, checked by the caller),
 * after k_bwd_plan when a->by_block is BWD_PIECES_SORTED (then a->items holds WGB_PLAN_MAX items,
 * a->work 2 ints, and tiles x split_max <= WGB_PLAN_MAX, n_blocks < 2^19: the caller's checks);
 * pipe: dQ of one visit overlapping the next (PIPE), else one visit after the other. -1 when
 * the kernel is not usable on this device or a piece could visit more than WGB_LIST blocks (the
 * caller runs k_bwd_fused). */
int cuda_wgb_attention_init(void);
int cuda_wgb_attention_launch(cudaStream_t st, const bwd_args *a, int pipe);
/* keys per CTA of k_wgb_fused (the tiles of the sorted schedule); the most items (key tiles x
 * pieces) of that schedule; the most blocks a piece of k_wgb_fused may visit (its visit list:
 * cuda_wgb_attention_launch declines larger pieces) */
#define WGB_KEYS 128
#define WGB_PLAN_MAX 4096
#define WGB_LIST 2048

#endif
