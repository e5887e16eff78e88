/* lt_enum: cuBLASLt matmul configurations beyond the heuristic's list, for the start-up tuning
 * of ops_cuda.cu (DFLASH_LT_ENUM=1, docs/operating.md).
 *
 * cublasLtMatmulAlgoGetHeuristic offers at most 8 algorithms per bf16 shape on the H200, all of
 * one kernel family with a few tile and cluster shapes. This enumerates, for each algorithm id
 * the heuristic offered, every combination of its large CTA tiles (both sides >= 64, multiples of
 * 32, 128 x 128 or more, at most 384), cluster shapes 1x1, 2x1, 1x2, 2x2 and the automatic one,
 * CTA swizzle and custom options it supports, with the heuristic's stages and no split-K, keeping
 * those that cublasLtMatmulAlgoCheck accepts within the workspace. Host calls only.
 */
#ifndef DFLASH_NN_LT_ENUM_H
#define DFLASH_NN_LT_ENUM_H

#include <cublasLt.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes up to `cap` accepted configurations not among `seeds` into out[] and returns how many.
 * The descriptors are the product's (compute 32F, scale 32F, A and B bf16, C = D of type
 * c_type); `workspace` is the largest workspace the caller passes. */
int lt_enum_configs(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cudaDataType_t c_type,
                    const cublasLtMatmulAlgo_t *seeds, int n_seeds, size_t workspace,
                    cublasLtMatmulAlgo_t *out, int cap);

/* "algo A tile T stages S swizzle W cluster C custom O" of a configuration. */
void lt_enum_name(const cublasLtMatmulAlgo_t *a, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
