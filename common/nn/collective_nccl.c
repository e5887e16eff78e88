/* collective_nccl: the nccl backend of collective.h, compiled only when the build found NCCL
 * (DFLASH_HAVE_NCCL; without it this file is empty and collective.c answers "this build has no
 * NCCL").
 *
 * State (dp_nccl): one non-blocking communicator (ncclConfig_t.blocking = 0) on one device, a
 * private non-blocking stream and a 4 KiB device staging buffer for the host-memory calls, and a
 * completion event. Every call enqueues, then polls (short sleeps) until the work is done on the
 * device: ncclCommGetAsyncError until the enqueue has finished, then cudaEventQuery on an event
 * recorded after it, checking the communicator's asynchronous error and the deadline
 * (timeout_s from open) on every poll. A timeout or an NCCL error aborts the communicator at
 * once (ncclCommAbort, which also ends a kernel stuck waiting for a dead peer) and marks the
 * state broken; close then only frees what is left. A wait that lasts gives the caller's watch
 * its turn (collective_wait.h): NCCL cannot tell a dead peer from a slow one before the timeout,
 * but the watch may know (the drafter asks the broker, whose heartbeats see a dead rank within
 * seconds), and when it ends the wait the communicator is aborted the same way (DFLASH_EPEER).
 * Each failure's reason goes to the handle's why buffer (dp_comm_error). An init that NCCL
 * refuses for this rank's configuration (two ranks on one GPU), or a --device that cannot be
 * set, is DFLASH_ECONFIG (dp_nccl_init_fault): no re-form mends it.
 * The caller's current device is saved and restored around every call.
 * Threads: one thread uses a handle at a time. Caller: collective.c only.
 */
#ifdef DFLASH_HAVE_NCCL

#include "collective.h"
#include "collective_nccl.h"
#include "collective_wait.h"

#include "err.h"
#include "log.h"
#include "monotime.h"
#include "safetensors.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(ncclUniqueId) == DP_COMM_ID_BYTES, "ncclUniqueId is not 128 bytes");
_Static_assert(ncclInvalidUsage == DP_NCCL_INVALID_USAGE, "ncclInvalidUsage moved");

#define STAGING_BYTES 4096u

typedef struct dp_nccl {
    ncclComm_t comm;
    int device, rank, world;
    double timeout_s;
    bool aborted;
    const dp_comm_watch *watch; /* the handle's (collective.c), may have fn NULL */
    char *why;                  /* the handle's reason buffer, DP_WHY_BYTES */
    cudaStream_t stream;
    cudaEvent_t done;
    void *staging;
    ncclResult_t failed;  /* the NCCL error that failed the last wait (wait_async) */
    char nccl_text[256]; /* ncclGetLastError's text then */
} dp_nccl;

static void nccl_abort(dp_nccl *n) {
    if (n->comm && !n->aborted) ncclCommAbort(n->comm);
    n->aborted = true;
}

static int cuda_fail(dp_nccl *n, cudaError_t e, const char *what) {
    LOG_ERROR("dp_comm nccl rank %d: %s: %s", n->rank, what, cudaGetErrorString(e));
    dp_why_set(n->why, "%s: %s", what, cudaGetErrorString(e));
    nccl_abort(n);
    return DFLASH_ECUDA;
}

/* The watch of a wait that started at deadline - timeout_s ended it: abort, DFLASH_EPEER. */
static bool watch_ended(dp_nccl *n, dp_waiter *wt, int *rc) {
    char over[DP_WHY_BYTES];
    if (!dp_wait_over(wt, monotime_s(), over, sizeof over)) return false;
    LOG_WARN("dp_comm nccl rank %d: %s: %s; aborting the communicator", n->rank, wt->w.what,
             over);
    dp_why_set(n->why, "%s: %s", wt->w.what, over);
    nccl_abort(n);
    *rc = DFLASH_EPEER;
    return true;
}

/* Waits until the communicator has no operation in progress on the host side (non-blocking
 * enqueue or init). 0, DFLASH_EPEER (an NCCL error) or DFLASH_ETIMEOUT; aborts on failure. */
static int wait_async(dp_nccl *n, ncclResult_t r, const char *what, double deadline) {
    dp_waiter wt;
    dp_wait_begin(&wt, n->watch, what, -1, 0, deadline - n->timeout_s, n->timeout_s);
    int rc;
    for (long i = 0;; i++) {
        if (r == ncclInProgress) {
            if (ncclCommGetAsyncError(n->comm, &r) != ncclSuccess) r = ncclSystemError;
        }
        if (r == ncclSuccess) return 0;
        if (r != ncclInProgress) {
            n->failed = r;
            snprintf(n->nccl_text, sizeof n->nccl_text, "%s",
                     n->comm ? ncclGetLastError(n->comm) : "");
            LOG_ERROR("dp_comm nccl rank %d: %s: %s (%s)", n->rank, what, ncclGetErrorString(r),
                      n->nccl_text);
            dp_why_set(n->why, "%s: %s", what, ncclGetErrorString(r));
            nccl_abort(n);
            return DFLASH_EPEER;
        }
        if (watch_ended(n, &wt, &rc)) return rc;
        if (monotime_s() > deadline) {
            LOG_ERROR("dp_comm nccl rank %d: %s: timed out after %.3g s; aborting the "
                      "communicator", n->rank, what, n->timeout_s);
            dp_why_set(n->why, "%s: timed out after %.3g s", what, n->timeout_s);
            nccl_abort(n);
            return DFLASH_ETIMEOUT;
        }
        monotime_sleep_ms(i < 1000 ? 0.02 : 0.2);
    }
}

/* Waits for the work queued on st so far (and for the communicator's enqueue). */
static int wait_done(dp_nccl *n, ncclResult_t r, cudaStream_t st, const char *what) {
    double deadline = monotime_s() + n->timeout_s;
    int rc = wait_async(n, r, what, deadline);
    if (rc) return rc;
    cudaError_t e = cudaEventRecord(n->done, st);
    if (e != cudaSuccess) return cuda_fail(n, e, "cudaEventRecord");
    dp_waiter wt;
    dp_wait_begin(&wt, n->watch, what, -1, 0, deadline - n->timeout_s, n->timeout_s);
    for (long i = 0;; i++) {
        e = cudaEventQuery(n->done);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return cuda_fail(n, e, what);
        ncclResult_t ae;
        if (ncclCommGetAsyncError(n->comm, &ae) != ncclSuccess ||
            (ae != ncclSuccess && ae != ncclInProgress))
            return wait_async(n, ae == ncclSuccess ? ncclSystemError : ae, what, deadline);
        if (watch_ended(n, &wt, &rc)) return rc;
        if (monotime_s() > deadline) {
            LOG_ERROR("dp_comm nccl rank %d: %s: not done after %.3g s (a peer gone?); aborting "
                      "the communicator", n->rank, what, n->timeout_s);
            dp_why_set(n->why, "%s: not done after %.3g s (a peer gone?)", what, n->timeout_s);
            nccl_abort(n);
            return DFLASH_ETIMEOUT;
        }
        if (i > 200) monotime_sleep_ms(i < 2000 ? 0.02 : 0.2);
    }
}

int dp_nccl_make_id(uint8_t id[DP_COMM_ID_BYTES], char *err, size_t errlen) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) {
        err_fmt(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return DFLASH_EIO;
    }
    memcpy(id, &u, DP_COMM_ID_BYTES);
    return 0;
}

int dp_nccl_open(const uint8_t id[DP_COMM_ID_BYTES], int rank, int world, int device,
                 double timeout_s, const dp_comm_watch *watch, char *why, void **impl, char *err,
                 size_t errlen) {
    *impl = NULL;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) { /* no such GPU here, or none usable: no re-form mends that */
        err_fmt(err, errlen, "--device %d cannot be used: cudaSetDevice: %s (an ordinal among "
                "the GPUs CUDA_VISIBLE_DEVICES leaves visible)", device, cudaGetErrorString(e));
        return DFLASH_ECONFIG;
    }
    dp_nccl *n = calloc(1, sizeof *n);
    if (!n) return DFLASH_ENOMEM;
    n->device = device;
    n->rank = rank;
    n->world = world;
    n->timeout_s = timeout_s;
    n->watch = watch;
    n->why = why;
    int rc = 0;
    if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMalloc(&n->staging, STAGING_BYTES)) != cudaSuccess) {
        err_fmt(err, errlen, "device %d: %s", device, cudaGetErrorString(e));
        rc = DFLASH_ECUDA;
        goto fail;
    }
    ncclUniqueId u;
    memcpy(&u, id, DP_COMM_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, world, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(n->nccl_text, sizeof n->nccl_text, "%s", ncclGetLastError(n->comm));
        rc = dp_nccl_init_fault(r, n->nccl_text, rank, device, err, errlen);
        if (rc != DFLASH_ECONFIG)
            err_fmt(err, errlen, "ncclCommInitRankConfig rank %d of %d on device %d: %s", rank,
                    world, device, ncclGetErrorString(r));
        nccl_abort(n);
        goto fail;
    }
    rc = wait_async(n, r, "join", monotime_s() + timeout_s);
    if (rc == DFLASH_EPEER && n->failed != ncclSuccess && /* NCCL's answer, not the watch's */
        dp_nccl_init_fault(n->failed, n->nccl_text, rank, device, err, errlen) ==
            DFLASH_ECONFIG) {
        rc = DFLASH_ECONFIG;
        goto fail;
    }
    if (rc) {
        err_fmt(err, errlen, "rank %d of %d on device %d: the nccl group did not form (%s: %s)",
                rank, world, device, err_str(rc), why);
        goto fail;
    }
    cudaSetDevice(prev);
    *impl = n;
    return 0;
fail:
    dp_nccl_close((void **)&n, true);
    cudaSetDevice(prev);
    return rc;
}

int dp_nccl_allreduce(void *impl, void *buf, size_t n_el, dp_nccl_elem t, float scale,
                      void *stream) {
    dp_nccl *n = impl;
    if (n->aborted) return DFLASH_EPEER;
    int prev = 0, rc = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(n->device);
    if (t == DP_NCCL_F64_HOST) { /* stage chunk by chunk through the device buffer on our stream */
        size_t per = STAGING_BYTES / sizeof(double);
        for (size_t off = 0; off < n_el && !rc; off += per) {
            size_t k = n_el - off < per ? n_el - off : per;
            double *h = (double *)buf + off;
            cudaError_t e = cudaMemcpyAsync(n->staging, h, k * sizeof(double),
                                            cudaMemcpyHostToDevice, n->stream);
            if (e != cudaSuccess) {
                rc = cuda_fail(n, e, "stage in");
                break;
            }
            ncclResult_t r = ncclAllReduce(n->staging, n->staging, k, ncclFloat64, ncclSum,
                                           n->comm, n->stream);
            rc = wait_async(n, r, "allreduce f64", monotime_s() + n->timeout_s);
            if (rc) break;
            e = cudaMemcpyAsync(h, n->staging, k * sizeof(double), cudaMemcpyDeviceToHost,
                                n->stream);
            if (e != cudaSuccess) {
                rc = cuda_fail(n, e, "stage out");
                break;
            }
            rc = wait_done(n, ncclSuccess, n->stream, "allreduce f64");
        }
    } else {
        cudaStream_t st = (cudaStream_t)stream;
        ncclRedOp_t op = ncclSum;
        bool bf = t == DP_NCCL_BF16;
        ncclDataType_t type = bf ? ncclBfloat16 : ncclFloat32;
        uint16_t scale_bf16 = safetensors_f32_to_bf16(scale); /* the scalar in the data's type */
        bool premul = bf ? scale_bf16 != safetensors_f32_to_bf16(1.0f) : scale != 1.0f;
        if (premul) {
            void *scalar = bf ? (void *)&scale_bf16 : (void *)&scale;
            ncclResult_t r = ncclRedOpCreatePreMulSum(&op, scalar, type, ncclScalarHostImmediate,
                                                      n->comm);
            rc = wait_async(n, r, "ncclRedOpCreatePreMulSum", monotime_s() + n->timeout_s);
        }
        if (!rc) {
            ncclResult_t r = ncclAllReduce(buf, buf, n_el, type, op, n->comm, st);
            rc = wait_done(n, r, st, bf ? "allreduce bf16" : "allreduce f32");
        }
        if (premul && !n->aborted) ncclRedOpDestroy(op, n->comm);
    }
    cudaSetDevice(prev);
    return rc;
}

int dp_nccl_broadcast(void *impl, void *buf, size_t bytes, int root, bool host, void *stream) {
    dp_nccl *n = impl;
    if (n->aborted) return DFLASH_EPEER;
    int prev = 0, rc = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(n->device);
    if (host) {
        for (size_t off = 0; off < bytes && !rc; off += STAGING_BYTES) {
            size_t k = bytes - off < STAGING_BYTES ? bytes - off : STAGING_BYTES;
            char *h = (char *)buf + off;
            cudaError_t e = cudaSuccess;
            if (n->rank == root)
                e = cudaMemcpyAsync(n->staging, h, k, cudaMemcpyHostToDevice, n->stream);
            if (e != cudaSuccess) {
                rc = cuda_fail(n, e, "stage in");
                break;
            }
            ncclResult_t r = ncclBroadcast(n->staging, n->staging, k, ncclUint8, root, n->comm,
                                           n->stream);
            rc = wait_async(n, r, "broadcast", monotime_s() + n->timeout_s);
            if (rc) break;
            if (n->rank != root)
                e = cudaMemcpyAsync(h, n->staging, k, cudaMemcpyDeviceToHost, n->stream);
            if (e != cudaSuccess) {
                rc = cuda_fail(n, e, "stage out");
                break;
            }
            rc = wait_done(n, ncclSuccess, n->stream, "broadcast");
        }
    } else {
        cudaStream_t st = (cudaStream_t)stream;
        ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->comm, st);
        rc = wait_done(n, r, st, "broadcast");
    }
    cudaSetDevice(prev);
    return rc;
}

int dp_nccl_barrier(void *impl) {
    dp_nccl *n = impl;
    double one = 1.0;
    return dp_nccl_allreduce(n, &one, 1, DP_NCCL_F64_HOST, 1.0f, NULL);
}

void dp_nccl_set_timeout(void *impl, double timeout_s) { ((dp_nccl *)impl)->timeout_s = timeout_s; }

void dp_nccl_close(void **impl, bool abort) {
    dp_nccl *n = *impl;
    if (!n) return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(n->device);
    if (n->comm && !n->aborted) {
        if (abort) {
            nccl_abort(n);
        } else {
            ncclResult_t r = ncclCommFinalize(n->comm);
            if (wait_async(n, r, "finalize", monotime_s() + n->timeout_s) == 0)
                ncclCommDestroy(n->comm);
            /* else wait_async has aborted it */
        }
    }
    if (n->staging) cudaFree(n->staging);
    if (n->done) cudaEventDestroy(n->done);
    if (n->stream) cudaStreamDestroy(n->stream);
    cudaSetDevice(prev);
    free(n);
    *impl = NULL;
}

#else
typedef int dp_nccl_not_built; /* ISO C wants a declaration in every translation unit */
#endif
