/* pool_cuda: the CUDA runtime calls of the pool's cuda backend, behind a C interface.
 *
 * Implemented in pool_cuda.c, which loads libcudart at run time (dlopen), so it builds with or
 * without nvcc; without the runtime or a GPU every call returns DFLASH_EUNSUPPORTED. pool.c is the
 * only caller. Streams and events are opaque pointers (cudaStream_t / cudaEvent_t). Every call
 * that takes a device sets it first; calls return 0, DFLASH_ECUDA or DFLASH_ENOMEM and log the
 * CUDA error string with the call, whose error they clear (cudaGetLastError). Thread: the pool's or importer's owning thread.
 */
#ifndef DFLASH_POOL_CUDA_H
#define DFLASH_POOL_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Number of visible devices, 0 when none or the driver is missing. */
int pool_cuda_device_count(void);
/* cudaMalloc of bytes on device + cudaIpcGetMemHandle (handle may be NULL: no export). */
int pool_cuda_alloc(int device, size_t bytes, void **ptr, uint8_t handle[64]);
int pool_cuda_free(int device, void *ptr);
/* An interprocess event (Interprocess|DisableTiming) and its exported handle. */
int pool_cuda_event_new(int device, void **event, uint8_t handle[64]);
/* A local DisableTiming event (completion tracking). */
int pool_cuda_event_new_local(int device, void **event);
int pool_cuda_event_destroy(void *event);
int pool_cuda_event_record(void *event, void *stream);
/* 1 done, 0 pending, or DFLASH_ECUDA. */
int pool_cuda_event_query(void *event);
int pool_cuda_event_sync(void *event);
/* Maps an exported allocation / event of another process into device's context. */
int pool_cuda_open_mem(int device, const uint8_t handle[64], void **ptr);
int pool_cuda_close_mem(int device, void *ptr);
int pool_cuda_open_event(int device, const uint8_t handle[64], void **event);
int pool_cuda_stream_new(int device, void **stream);
int pool_cuda_stream_destroy(void *stream);
/* On stream: wait on wait_event (may be NULL), copy n bytes device-to-device, record done. */
int pool_cuda_copy_async(void *dst, const void *src, size_t n, void *wait_event, void *stream,
                         void *done_event);
/* Synchronous copies between host and device (kind: 0 = device to host, 1 = host to device). */
int pool_cuda_memcpy(void *dst, const void *src, size_t n, int host_to_device);
int pool_cuda_set_device(int device);
/* The PCI bus id of device as this process sees it ("0000:1b:00.0"; 13 bytes and a NUL fit in
 * 16): it names the board whatever CUDA_VISIBLE_DEVICES renumbers (nvidia-smi -i takes it). */
int pool_cuda_bus_id(int device, char *buf, size_t len);
/* The ordinal this process gives the GPU with that PCI bus id: 0, DFLASH_ENOTFOUND (no visible
 * device has it, e.g. CUDA_VISIBLE_DEVICES hides it; not logged) or another code. */
int pool_cuda_device_by_bus_id(const char *bus_id, int *device);
/* cudaDeviceCanAccessPeer: whether device can map memory of peer (*can). 0 or a code. */
int pool_cuda_can_access_peer(int device, int peer, bool *can);
/* cudaPeekAtLastError: the calling thread's last CUDA error, left unread (0 when none or no
 * runtime). Every call here clears the error of a call that failed, so that the compute code's
 * launch checks of that record do not find it: tests check this. */
int pool_cuda_pending_error(void);

#endif
