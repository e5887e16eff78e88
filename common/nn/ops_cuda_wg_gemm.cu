/* ops_cuda_wg_gemm: the launchers of wg_gemm.cuh's GEMM of our own (sm_90a) for ops_cuda.cu.
 *
 * cuda_wg_linear_swiglu: linear_swiglu_fwd's product with SwiGLU in its epilogue, gu = x w^T and
 * act = silu(gate) up in one kernel (4 stages, two boxes a pass). The caller falls back to
 * cuBLASLt + swiglu_fwd where this declines: not an sm_90a device, no tensor-map encoder, shapes
 * or alignments the tensor maps do not take (K % 64, F % 128, 16-byte rows), or
 * DFLASH_CUDA_WG_GEMM=0 (docs/operating.md). The four tensor maps are encoded on the host per
 * call (no device work, no synchronisation) and passed by value.
 */
#include "ops_cuda.h"
#include "wg_gemm.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SWIGLU_STAGES 4

static wg_encode_fn g_enc; /* NULL: no usable device image or encoder; every call declines */
static int g_sms;

int cuda_wg_gemm_init(void) {
    g_enc = NULL;
    if (!wg_device_runs_sm90a()) return 0;
    const char *e = getenv("DFLASH_CUDA_WG_GEMM");
    if (e && strcmp(e, "0") == 0) return 0;
    wg_encode_fn enc = wg_tensor_map_encoder();
    int dev = 0;
    if (!enc || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaFuncSetAttribute((const void *)k_wg_gemm<SWIGLU_STAGES, EPI_TMA_HALF, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             wgg_smem_bytes(SWIGLU_STAGES, EPI_TMA_HALF)) != cudaSuccess) {
        (void)cudaGetLastError(); /* cuBLASLt + swiglu_fwd serve */
        return 0;
    }
    g_enc = enc;
    return 0;
}

int cuda_wg_linear_swiglu(cudaStream_t st, __nv_bfloat16 *gu, __nv_bfloat16 *act,
                          const __nv_bfloat16 *x, const __nv_bfloat16 *w, int M, int K, int F) {
    if (!g_enc || M <= 0 || K <= 0 || F <= 0 || F % 128 != 0) return -1;
    CUtensorMap mx, mw, my, ma;
    if (wgg_kblock_map(g_enc, &mx, x, M, K, WGG_BM) != 0 ||
        wgg_kblock_map(g_enc, &mw, w, 2 * F, K, WGG_BN / 2) != 0 ||
        wgg_store_map(g_enc, &my, gu, M, 2 * F) != 0 || wgg_store_map(g_enc, &ma, act, M, F) != 0)
        return -1;
    int N = 2 * F, tiles = wgg_tiles(M, N);
    k_wg_gemm<SWIGLU_STAGES, EPI_TMA_HALF, true>
        <<<tiles < g_sms ? tiles : g_sms, WGG_THREADS, wgg_smem_bytes(SWIGLU_STAGES, EPI_TMA_HALF),
           st>>>(mx, mw, my, ma, M, N, K);
    CUDA_CHECK_LAUNCH();
    return 0;
}
