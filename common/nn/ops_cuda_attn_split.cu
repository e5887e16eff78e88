/* ops_cuda_attn_split: the tensor-core block backward's entry (cuda_tensor_attention_block_bwd)
 * and the scratch its kernels share. ops_cuda_attn.cu calls it first; it hands the work to the
 * fused key-major kernel of ops_cuda_attn_bwd.cu (the default, DFLASH_CUDA_ATTN unset or
 * "fused"; on Hopper its wgmma form), else to the mma.sync pair of ops_cuda_attn_mma.cu (dq, then
 * dk/dv; "mma" chooses it), and returns -1 where neither applies (head dims other than 64 / 128,
 * buffers not 16-byte aligned, more than 64 query heads per kv head, DFLASH_CUDA_ATTN=simple),
 * so that ops_cuda_attn.cu's CUDA-core kernels run.
 *
 * Why a split: a context key tile is seen by hundreds of query blocks while a block's own keys
 * by one, so one CTA per key tile would leave the SMs idle behind the few heaviest tiles. A tile
 * seen by more than `vps` query blocks is cut into up to ATTN_SPLIT_MAX pieces whose fp32 dk, dv
 * partials meet in a per-device accumulator; the last piece of a tile (a ticket per tile and kv
 * head) writes bf16 and zeroes its part again, so the scratch is zero between calls and needs no
 * memset. D = rowsum(dO * O) per query row is saved once per call ([H, Q]) instead of being
 * recomputed on every visit. The sum order of the pieces varies: dk, dv are not bitwise
 * reproducible run to run (one fp32 sum each, rounded to bf16 once).
 *
 * Scratch, one set per device: allocated (zeroed) by cuda_attn_split_init, i.e. in nn_cuda_new,
 * grown by cuda_attn_split_plan (the attention_block_plan op, at a model's creation), never
 * during a step, kept for the life of the process. Capacity at init SPLIT_ELEMS elements per
 * tensor (Tk Hk d <= 16 Mi: 128 MiB for dk + dv), SPLIT_DROWS rows of D and SPLIT_TICKETS key
 * tiles x kv heads; a larger call runs unsplit (one piece per key tile: several times slower)
 * or, without D's room, on the CUDA-core kernels. Two streams must not run attention_block_bwd
 * on one device at the same time (one trainer per device does not).
 */
#include "attn_spans.cuh"
#include "config.h"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

typedef __nv_bfloat16 bf16;

#define KEY_TILE 64       /* the smallest key tile of the split's kernels: tickets per kv head */
#define MAX_GROUP 64      /* query heads per kv head the kernels take (rows per CTA) */
#define SPLIT_ELEMS (16u << 20)
#define SPLIT_TICKETS 65536
#define SPLIT_DEVICES 64
#define SPLIT_DROWS (4u << 20) /* H * Q rows of D (16 MiB) */

static float *g_split_acc[SPLIT_DEVICES], *g_split_d[SPLIT_DEVICES];
static int *g_split_tickets[SPLIT_DEVICES];
static size_t g_split_cap[SPLIT_DEVICES][3]; /* elements per tensor, D rows, tickets */

/* Query blocks per dk/dv piece: DFLASH_CUDA_ATTN_SPLIT=N in the environment (N >= 1; tests use
 * a small N so that their few blocks still get cut), 0 when unset; then the mma.sync pair cuts
 * tiles every 80 blocks (measured 5.35 against 5.72 ms at 40 for the whole block backward) and
 * the wgmma backward's sorted pieces, 2 N blocks long, are shorter in a small call
 * (ops_cuda_attn_bwd.cu's bwd_piece_len). */
int cuda_attn_split_env(void) {
    static int n = -1;
    if (n < 0) {
        n = (int)config_env_int("DFLASH_CUDA_ATTN_SPLIT", 1, INT_MAX, 0);
    }
    return n;
}

static int split_vps(void) {
    int n = cuda_attn_split_env();
    return n ? n : 80;
}

/* The scratch with room for at least these sizes on the current device: larger ones replace the
 * old set (start-up only: it waits for the device); -1 (old set kept) when there is no memory. */
static int split_alloc(size_t elems, size_t drows, size_t tickets) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= SPLIT_DEVICES) return -1;
    size_t *cap = g_split_cap[dev];
    if (g_split_acc[dev] && cap[0] >= elems && cap[1] >= drows && cap[2] >= tickets) return 0;
    if (elems < cap[0]) elems = cap[0];
    if (drows < cap[1]) drows = cap[1];
    if (tickets < cap[2]) tickets = cap[2];
    float *acc = NULL, *dd = NULL;
    int *tk = NULL;
    if (cuda_malloc((void **)&acc, 2 * elems * sizeof(float)) != cudaSuccess ||
        cuda_malloc((void **)&dd, drows * sizeof(float)) != cudaSuccess ||
        cuda_malloc((void **)&tk, tickets * sizeof(int)) != cudaSuccess ||
        cudaMemset(acc, 0, 2 * elems * sizeof(float)) != cudaSuccess ||
        cudaMemset(tk, 0, tickets * sizeof(int)) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
        if (acc) cudaFree(acc);
        if (dd) cudaFree(dd);
        if (tk) cudaFree(tk);
        (void)cudaGetLastError();
        return -1;
    }
    if (g_split_acc[dev]) {
        CUDA_CHECK(cudaFree(g_split_acc[dev]));
        CUDA_CHECK(cudaFree(g_split_d[dev]));
        CUDA_CHECK(cudaFree(g_split_tickets[dev]));
    }
    g_split_acc[dev] = acc, g_split_tickets[dev] = tk, g_split_d[dev] = dd;
    cap[0] = elems, cap[1] = drows, cap[2] = tickets;
    return 0;
}

int cuda_attn_split_plan(int max_q, int max_tk, int H, int Hk, int d) {
    if (cuda_attn_mode() == ATTN_SIMPLE || max_q < 1 || max_tk < 1) return 0;
    return split_alloc((size_t)max_tk * Hk * d, (size_t)H * max_q,
                       (size_t)((max_tk + KEY_TILE - 1) / KEY_TILE) * Hk);
}

void cuda_attn_split_init(void) {
    /* without the scratch (no memory) block_bwd runs unsplit: not an error */
    if (cuda_attn_mode() != ATTN_SIMPLE) (void)split_alloc(SPLIT_ELEMS, SPLIT_DROWS, SPLIT_TICKETS);
}

int cuda_tensor_attention_block_bwd(cudaStream_t st, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                    const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                                    const float *lse, const nn_block_span *spans, int n_blocks,
                                    int B, int Tk, int H, int Hk, int d) {
    if (cuda_attn_mode() == ATTN_SIMPLE || (d != 64 && d != 128) || Hk <= 0 || H % Hk ||
        H / Hk > MAX_GROUP || n_blocks <= 0 || B <= 0 || Tk <= 0)
        return -1;
    if (!attn_al16(dq) || !attn_al16(dk) || !attn_al16(dv) || !attn_al16(dout) || !attn_al16(q) ||
        !attn_al16(k) || !attn_al16(v) || !attn_al16(out))
        return -1;
    float *acc = NULL, *dsave = NULL;
    int *tickets = NULL, split_max = 1, vps = split_vps(), dev = 0;
    size_t n_kt = (size_t)(Tk + KEY_TILE - 1) / KEY_TILE;
    if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < SPLIT_DEVICES && g_split_acc[dev] &&
        (size_t)Tk * Hk * d <= g_split_cap[dev][0] && n_kt * Hk <= g_split_cap[dev][2]) {
        acc = g_split_acc[dev], tickets = g_split_tickets[dev];
        split_max = (n_blocks + vps - 1) / vps;
        if (split_max > ATTN_SPLIT_MAX) split_max = ATTN_SPLIT_MAX;
        if (split_max < 1) split_max = 1;
        if ((size_t)H * n_blocks * B <= g_split_cap[dev][1]) dsave = g_split_d[dev];
    }
    if (cuda_attn_mode() == ATTN_FUSED &&
        cuda_bwd_attention_block_bwd(st, dq, dk, dv, acc, tickets, split_max, vps, dsave, dout, q,
                                     k, v, out, lse, spans, n_blocks, B, Tk, H, Hk, d) == 0)
        return 0;
    /* the mma.sync pair: dk/dv reads the D that dq saves, so both need dsave */
    if (!dsave) return -1;
    if (cuda_mma_attention_dq(st, dq, dsave, dout, q, k, v, out, lse, spans, n_blocks, B, Tk, H,
                              Hk, d) != 0)
        return -1;
    if (cuda_mma_attention_dkdv(st, dk, dv, acc, tickets, split_max, vps, dsave, dout, q, k, v,
                                lse, spans, n_blocks, B, Tk, H, Hk, d) != 0)
        return -1; /* the caller's fallback computes dq again, with dk and dv */
    return 0;
}
