/* probe_check.h: the status checks of the one-off cuBLASLt probes in this folder
 * (overlap_probe.cu, lt_shape_probe.cu; header-only): CK(cuda call) and LK(cuBLASLt call)
 * print the line and the error and exit(1). */
#ifndef DFLASH_BENCH_PROBE_CHECK_H
#define DFLASH_BENCH_PROBE_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x) probe_check_cuda((x), __LINE__)
#define LK(x) probe_check_lt((x), __LINE__)
static void probe_check_cuda(cudaError_t e, int line) {
    if (e == cudaSuccess) return;
    printf("line %d: %s\n", line, cudaGetErrorString(e));
    exit(1);
}
static void probe_check_lt(cublasStatus_t s, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    printf("line %d: cuBLASLt status %d\n", line, (int)s);
    exit(1);
}

#endif
