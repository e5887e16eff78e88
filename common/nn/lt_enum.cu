/* lt_enum: cuBLASLt matmul configurations beyond the heuristic's list (lt_enum.h).
 *
 * A configuration is an algorithm id initialised by cublasLtMatmulAlgoInit with its config
 * attributes set; cublasLtMatmulAlgoCheck says whether it runs this product and with how much
 * workspace. The tiles tried are listed below (the enum holds ~600, most too small to feed the
 * H200's tensor cores from a 128-thread warpgroup); an algorithm's CUBLASLT_ALGO_CAP_TILE_IDS
 * narrows them to those it has.
 */
#include "lt_enum.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* CTA tiles with both sides >= 64 and multiples of 32, at least 128 x 128 elements, at most 384
 * a side: the shapes of the products' output tiles worth timing at the drafter's sizes. */
static const uint16_t large_tiles[] = {
    CUBLASLT_MATMUL_TILE_128x128, CUBLASLT_MATMUL_TILE_128x256, CUBLASLT_MATMUL_TILE_256x128,
    CUBLASLT_MATMUL_TILE_64x256,  CUBLASLT_MATMUL_TILE_256x64,  CUBLASLT_MATMUL_TILE_128x160,
    CUBLASLT_MATMUL_TILE_160x128, CUBLASLT_MATMUL_TILE_192x128, CUBLASLT_MATMUL_TILE_128x192,
    CUBLASLT_MATMUL_TILE_64x320,  CUBLASLT_MATMUL_TILE_64x384,  CUBLASLT_MATMUL_TILE_96x192,
    CUBLASLT_MATMUL_TILE_96x256,  CUBLASLT_MATMUL_TILE_96x320,  CUBLASLT_MATMUL_TILE_96x384,
    CUBLASLT_MATMUL_TILE_128x320, CUBLASLT_MATMUL_TILE_128x384, CUBLASLT_MATMUL_TILE_160x192,
    CUBLASLT_MATMUL_TILE_160x256, CUBLASLT_MATMUL_TILE_192x192, CUBLASLT_MATMUL_TILE_192x256,
    CUBLASLT_MATMUL_TILE_224x128, CUBLASLT_MATMUL_TILE_224x192, CUBLASLT_MATMUL_TILE_256x192,
    CUBLASLT_MATMUL_TILE_288x64,  CUBLASLT_MATMUL_TILE_288x128, CUBLASLT_MATMUL_TILE_320x64,
    CUBLASLT_MATMUL_TILE_320x128, CUBLASLT_MATMUL_TILE_352x64,  CUBLASLT_MATMUL_TILE_352x128,
    CUBLASLT_MATMUL_TILE_384x64,  CUBLASLT_MATMUL_TILE_384x128, CUBLASLT_MATMUL_TILE_64x288,
    CUBLASLT_MATMUL_TILE_64x352,  CUBLASLT_MATMUL_TILE_128x224, CUBLASLT_MATMUL_TILE_128x288,
    CUBLASLT_MATMUL_TILE_128x352, CUBLASLT_MATMUL_TILE_192x96,  CUBLASLT_MATMUL_TILE_192x160,
    CUBLASLT_MATMUL_TILE_192x224, CUBLASLT_MATMUL_TILE_192x288, CUBLASLT_MATMUL_TILE_192x320,
    CUBLASLT_MATMUL_TILE_256x96,  CUBLASLT_MATMUL_TILE_256x160, CUBLASLT_MATMUL_TILE_256x224,
    CUBLASLT_MATMUL_TILE_256x256, CUBLASLT_MATMUL_TILE_320x96,  CUBLASLT_MATMUL_TILE_320x160,
    CUBLASLT_MATMUL_TILE_320x192, CUBLASLT_MATMUL_TILE_384x96,  CUBLASLT_MATMUL_TILE_384x160,
};

static const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                    CUBLASLT_CLUSTER_SHAPE_2x2x1};

#define N_ELEMS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAX_IDS 64

typedef struct config {
    int32_t id;
    uint32_t tile, stages, swizzle, custom;
    uint16_t cluster;
} config;

static config config_of(const cublasLtMatmulAlgo_t *a) {
    config k;
    size_t got = 0;
    memset(&k, 0, sizeof k);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &k.id, sizeof k.id, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &k.tile, sizeof k.tile,
                                         &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &k.stages,
                                         sizeof k.stages, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &k.swizzle,
                                         sizeof k.swizzle, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &k.custom,
                                         sizeof k.custom, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &k.cluster,
                                         sizeof k.cluster, &got);
    return k;
}

static int config_eq(const config *x, const config *y) {
    return x->id == y->id && x->tile == y->tile && x->stages == y->stages &&
           x->swizzle == y->swizzle && x->custom == y->custom && x->cluster == y->cluster;
}

void lt_enum_name(const cublasLtMatmulAlgo_t *a, char *buf, size_t len) {
    config k = config_of(a);
    snprintf(buf, len, "algo %d tile %u stages %u swizzle %u cluster %u custom %u", k.id, k.tile,
             k.stages, k.swizzle, (unsigned)k.cluster, k.custom);
}

/* Whether configuration k is new (not a seed, not yet in out[0..n)). */
static int is_new(const config *k, const cublasLtMatmulAlgo_t *seeds, int n_seeds,
                  const cublasLtMatmulAlgo_t *out, int n) {
    for (int i = 0; i < n_seeds; i++) {
        config s = config_of(&seeds[i]);
        if (config_eq(k, &s)) return 0;
    }
    for (int i = 0; i < n; i++) {
        config s = config_of(&out[i]);
        if (config_eq(k, &s)) return 0;
    }
    return 1;
}

static int has_tile(const uint32_t *tiles, int n, uint32_t t) {
    for (int i = 0; i < n; i++)
        if (tiles[i] == t) return 1;
    return 0;
}

/* Adds the accepted configurations of algorithm `id` with stages `stages` to out[n..cap). */
static int enum_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cudaDataType_t c_type,
                     int32_t id, uint32_t stages, const cublasLtMatmulAlgo_t *seeds,
                     int n_seeds, size_t workspace, cublasLtMatmulAlgo_t *out, int n, int cap) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, c_type,
                               c_type, id, &base) != CUBLAS_STATUS_SUCCESS)
        return n;
    size_t got = 0;
    uint32_t tiles[1024];
    int n_tiles = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles,
                                          &got) == CUBLAS_STATUS_SUCCESS)
        n_tiles = (int)(got / sizeof tiles[0]);
    int32_t swizzle_ok = 0, custom_max = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swizzle_ok,
                                      sizeof swizzle_ok, &got);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max,
                                      sizeof custom_max, &got);
    if (custom_max > 7) custom_max = 7;
    /* (swizzle, custom option) pairs outermost, (0, 0) first: a cap that cuts the list keeps
     * every tile and cluster of the default pair */
    int n_pairs = (swizzle_ok ? 2 : 1) * (custom_max + 1);
    for (int p = 0; p < n_pairs && n < cap; p++) {
        uint32_t sw = (uint32_t)(p % (swizzle_ok ? 2 : 1));
        uint32_t cu = (uint32_t)(p / (swizzle_ok ? 2 : 1));
        for (int t = 0; t < N_ELEMS(large_tiles) && n < cap; t++) {
            if (n_tiles > 0 && !has_tile(tiles, n_tiles, large_tiles[t])) continue;
            for (int cl = 0; cl < N_ELEMS(clusters) && n < cap; cl++) {
                cublasLtMatmulAlgo_t x = base;
                uint32_t tile = large_tiles[t];
                int32_t splitk = 1;
                cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                     sizeof tile);
                cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                                     sizeof stages);
                cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                     sizeof splitk);
                cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw,
                                                     sizeof sw);
                cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cu,
                                                     sizeof cu);
                cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                     &clusters[cl], sizeof clusters[cl]);
                cublasLtMatmulHeuristicResult_t r;
                memset(&r, 0, sizeof r);
                if (cublasLtMatmulAlgoCheck(lt, op, a, b, c, c, &x, &r) != CUBLAS_STATUS_SUCCESS ||
                    r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > workspace)
                    continue;
                config k = config_of(&x);
                if (is_new(&k, seeds, n_seeds, out, n)) out[n++] = x;
            }
        }
    }
    return n;
}

int lt_enum_configs(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cudaDataType_t c_type,
                    const cublasLtMatmulAlgo_t *seeds, int n_seeds, size_t workspace,
                    cublasLtMatmulAlgo_t *out, int cap) {
    int n = 0;
    config done[MAX_IDS];
    int n_done = 0;
    for (int s = 0; s < n_seeds && n < cap; s++) {
        config k = config_of(&seeds[s]);
        int seen = 0;
        for (int i = 0; i < n_done && !seen; i++)
            seen = done[i].id == k.id && done[i].stages == k.stages;
        if (seen || n_done == MAX_IDS) continue;
        done[n_done++] = k;
        n = enum_algo(lt, op, a, b, c, c_type, k.id, k.stages, seeds, n_seeds, workspace, out, n,
                      cap);
    }
    return n;
}
