/* collective_nccl.h: the internal interface between collective.c and its nccl backend
 * (collective_nccl.c), declared only when the build found NCCL (DFLASH_HAVE_NCCL), but for
 * dp_nccl_init_fault (collective_fault.c), built always. Same contracts as the public calls of
 * collective.h; `impl` is the backend's state.
 */
#ifndef DFLASH_NN_COLLECTIVE_NCCL_H
#define DFLASH_NN_COLLECTIVE_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* nccl.h's ncclInvalidUsage, for dp_nccl_init_fault in builds without nccl.h
 * (collective_nccl.c asserts that they agree). */
#define DP_NCCL_INVALID_USAGE 5

/* What a failed communicator init means (collective_fault.c; built with or without NCCL):
 * result is the ncclResult_t that ncclCommInitRankConfig or its asynchronous error gave,
 * last_error ncclGetLastError's text (may be NULL). DFLASH_ECONFIG when NCCL refused this rank's
 * configuration (ncclInvalidUsage, or the text names a GPU used by two ranks), which no re-form
 * can mend, with the operator's message (naming --device and --comm shm) in msg; else
 * DFLASH_EPEER (msg untouched). */
int dp_nccl_init_fault(int result, const char *last_error, int rank, int device, char *msg,
                       size_t len);

#ifdef DFLASH_HAVE_NCCL
#include "collective.h"

int dp_nccl_make_id(uint8_t id[DP_COMM_ID_BYTES], char *err, size_t errlen);
/* watch and why (DP_WHY_BYTES) are the handle's, borrowed for the backend's life: every wait
 * gives the watch its turn, every failure writes its reason into why (collective_wait.h). */
int dp_nccl_open(const uint8_t id[DP_COMM_ID_BYTES], int rank, int world, int device,
                 double timeout_s, const dp_comm_watch *watch, char *why, void **impl, char *err,
                 size_t errlen);
/* What dp_nccl_allreduce's buf holds: n host doubles, or n device fp32 / bf16 values. */
typedef enum { DP_NCCL_F64_HOST, DP_NCCL_F32, DP_NCCL_BF16 } dp_nccl_elem;
/* Host doubles: a plain sum. Device values: each pre-scaled by scale (PreMulSum; for bf16 the
 * scalar is scale rounded to bf16), summed in their own type, on stream. */
int dp_nccl_allreduce(void *impl, void *buf, size_t n, dp_nccl_elem t, float scale,
                      void *stream);
int dp_nccl_broadcast(void *impl, void *buf, size_t bytes, int root, bool host, void *stream);
int dp_nccl_barrier(void *impl);
void dp_nccl_set_timeout(void *impl, double timeout_s);
/* abort: the group is broken (ncclCommAbort instead of finalize + destroy). */
void dp_nccl_close(void **impl, bool abort);
#endif

#endif
