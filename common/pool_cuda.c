/* pool_cuda: the CUDA runtime calls of the pool's cuda backend, loaded at run time.
 *
 * The pool needs only host-side runtime API calls (allocation, IPC handles, events, streams,
 * async copies), no kernels, so this is plain C that dlopen()s libcudart on first use and
 * resolves the functions it needs into one table. A build without nvcc, or a machine without the
 * CUDA runtime or a GPU, still links and runs: every call then returns DFLASH_EUNSUPPORTED and
 * pool_cuda_device_count() is 0. When nvcc-built code in the same process already loaded
 * libcudart.so.13, dlopen returns that same library, so streams and events are shared freely.
 * The few ABI facts declared here (handle size, flag values, error numbers) are those of
 * driver_types.h and have been stable since CUDA 4.
 * Thread: the table is filled once under pthread_once; calls are made by the owning thread.
 */
#include "pool_cuda.h"
#include "err.h"
#include "log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

typedef int cuda_err; /* cudaError_t */
typedef struct { char reserved[64]; } ipc_handle; /* cudaIpcMemHandle_t / cudaIpcEventHandle_t */

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERR_MEMORY_ALLOCATION = 2,
    CUDA_ERR_INVALID_DEVICE = 101,
    CUDA_ERR_NOT_READY = 600,
    EVENT_DISABLE_TIMING = 0x02,
    EVENT_INTERPROCESS = 0x04,
    IPC_LAZY_PEER_ACCESS = 0x01,
    STREAM_NON_BLOCKING = 0x01,
    MEMCPY_H2D = 1,
    MEMCPY_D2H = 2,
    MEMCPY_D2D = 3,
};

static struct {
    bool loaded;
    cuda_err (*GetDeviceCount)(int *);
    cuda_err (*SetDevice)(int);
    cuda_err (*Malloc)(void **, size_t);
    cuda_err (*Free)(void *);
    cuda_err (*IpcGetMemHandle)(ipc_handle *, void *);
    cuda_err (*IpcOpenMemHandle)(void **, ipc_handle, unsigned);
    cuda_err (*IpcCloseMemHandle)(void *);
    cuda_err (*IpcGetEventHandle)(ipc_handle *, void *);
    cuda_err (*IpcOpenEventHandle)(void **, ipc_handle);
    cuda_err (*EventCreateWithFlags)(void **, unsigned);
    cuda_err (*EventDestroy)(void *);
    cuda_err (*EventRecord)(void *, void *);
    cuda_err (*EventQuery)(void *);
    cuda_err (*EventSynchronize)(void *);
    cuda_err (*StreamCreateWithFlags)(void **, unsigned);
    cuda_err (*StreamDestroy)(void *);
    cuda_err (*StreamWaitEvent)(void *, void *, unsigned);
    cuda_err (*MemcpyAsync)(void *, const void *, size_t, int, void *);
    cuda_err (*Memcpy)(void *, const void *, size_t, int);
    cuda_err (*GetLastError)(void);
    cuda_err (*PeekAtLastError)(void);
    const char *(*GetErrorString)(cuda_err);
    cuda_err (*DeviceGetPCIBusId)(char *, int, int);
    cuda_err (*DeviceGetByPCIBusId)(int *, const char *);
    cuda_err (*DeviceCanAccessPeer)(int *, int, int);
} rt;

static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

static void rt_load(void)
{
    static const char *const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                       "/usr/local/cuda/lib64/libcudart.so.13",
                                       "/usr/local/cuda/lib64/libcudart.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof libs / sizeof libs[0] && !h; i++)
        h = dlopen(libs[i], RTLD_NOW | RTLD_GLOBAL);
    if (!h) return;
#define RT_SYM(field)                                                                              \
    do {                                                                                           \
        *(void **)&rt.field = dlsym(h, "cuda" #field);                                             \
        if (!rt.field) {                                                                           \
            LOG_WARN("libcudart lacks cuda%s; cuda pools disabled", #field);                      \
            return;                                                                                \
        }                                                                                          \
    } while (0)
    RT_SYM(GetDeviceCount);
    RT_SYM(SetDevice);
    RT_SYM(Malloc);
    RT_SYM(Free);
    RT_SYM(IpcGetMemHandle);
    RT_SYM(IpcOpenMemHandle);
    RT_SYM(IpcCloseMemHandle);
    RT_SYM(IpcGetEventHandle);
    RT_SYM(IpcOpenEventHandle);
    RT_SYM(EventCreateWithFlags);
    RT_SYM(EventDestroy);
    RT_SYM(EventRecord);
    RT_SYM(EventQuery);
    RT_SYM(EventSynchronize);
    RT_SYM(StreamCreateWithFlags);
    RT_SYM(StreamDestroy);
    RT_SYM(StreamWaitEvent);
    RT_SYM(MemcpyAsync);
    RT_SYM(Memcpy);
    RT_SYM(GetLastError);
    RT_SYM(PeekAtLastError);
    RT_SYM(GetErrorString);
    RT_SYM(DeviceGetPCIBusId);
    RT_SYM(DeviceGetByPCIBusId);
    RT_SYM(DeviceCanAccessPeer);
#undef RT_SYM
    rt.loaded = true;
}

static bool rt_ready(void)
{
    pthread_once(&rt_once, rt_load);
    return rt.loaded;
}

/* A failed call's error is cleared from the thread's last-error record (defect: it stayed
 * there, and the drafter's next kernel launch, which checks that record, aborted the process
 * after a pool it could not open had been given back and a good one copied). */
static int check(cuda_err e, const char *call, const char *file, int line)
{
    if (e == CUDA_SUCCESS) return 0;
    (void)rt.GetLastError();
    log_write(LOG_ERROR, file, line, "%s: %s (cuda error %d)", call, rt.GetErrorString(e), e);
    return e == CUDA_ERR_MEMORY_ALLOCATION ? DFLASH_ENOMEM : DFLASH_ECUDA;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        if (!rt_ready()) return DFLASH_EUNSUPPORTED;                                               \
        int rc_ = check(rt.call, "cuda" #call, __FILE__, __LINE__);                                \
        if (rc_ < 0) return rc_;                                                                   \
    } while (0)

int pool_cuda_device_count(void)
{
    int n = 0;
    if (!rt_ready()) return 0;
    if (rt.GetDeviceCount(&n) != CUDA_SUCCESS) {
        (void)rt.GetLastError();
        return 0;
    }
    return n;
}

int pool_cuda_bus_id(int device, char *buf, size_t len)
{
    if (len) buf[0] = '\0';
    TRY(DeviceGetPCIBusId(buf, (int)(len < 64 ? len : 64), device));
    return 0;
}

int pool_cuda_device_by_bus_id(const char *bus_id, int *device)
{
    if (!rt_ready()) return DFLASH_EUNSUPPORTED;
    cuda_err e = rt.DeviceGetByPCIBusId(device, bus_id);
    if (e == CUDA_ERR_INVALID_DEVICE) { /* no visible device has that bus id */
        (void)rt.GetLastError();
        return DFLASH_ENOTFOUND;
    }
    return check(e, "cudaDeviceGetByPCIBusId", __FILE__, __LINE__);
}

int pool_cuda_can_access_peer(int device, int peer, bool *can)
{
    int yes = 0;
    *can = false;
    TRY(DeviceCanAccessPeer(&yes, device, peer));
    *can = yes != 0;
    return 0;
}

int pool_cuda_set_device(int device)
{
    TRY(SetDevice(device));
    return 0;
}

int pool_cuda_alloc(int device, size_t bytes, void **ptr, uint8_t handle[64])
{
    TRY(SetDevice(device));
    TRY(Malloc(ptr, bytes));
    if (handle) {
        ipc_handle h;
        int rc = check(rt.IpcGetMemHandle(&h, *ptr), "cudaIpcGetMemHandle", __FILE__, __LINE__);
        if (rc < 0) {
            rt.Free(*ptr);
            *ptr = NULL;
            return rc;
        }
        memcpy(handle, &h, 64);
    }
    return 0;
}

int pool_cuda_free(int device, void *ptr)
{
    if (!ptr) return 0;
    TRY(SetDevice(device));
    TRY(Free(ptr));
    return 0;
}

int pool_cuda_event_new(int device, void **event, uint8_t handle[64])
{
    TRY(SetDevice(device));
    TRY(EventCreateWithFlags(event, EVENT_INTERPROCESS | EVENT_DISABLE_TIMING));
    ipc_handle h;
    int rc = check(rt.IpcGetEventHandle(&h, *event), "cudaIpcGetEventHandle", __FILE__, __LINE__);
    if (rc < 0) {
        rt.EventDestroy(*event);
        *event = NULL;
        return rc;
    }
    memcpy(handle, &h, 64);
    return 0;
}

int pool_cuda_event_new_local(int device, void **event)
{
    TRY(SetDevice(device));
    TRY(EventCreateWithFlags(event, EVENT_DISABLE_TIMING));
    return 0;
}

int pool_cuda_event_destroy(void *event)
{
    if (!event) return 0;
    TRY(EventDestroy(event));
    return 0;
}

int pool_cuda_event_record(void *event, void *stream)
{
    TRY(EventRecord(event, stream));
    return 0;
}

int pool_cuda_event_query(void *event)
{
    if (!rt_ready()) return DFLASH_EUNSUPPORTED;
    cuda_err e = rt.EventQuery(event);
    if (e == CUDA_SUCCESS) return 1;
    if (e == CUDA_ERR_NOT_READY) {
        (void)rt.GetLastError();
        return 0;
    }
    return check(e, "cudaEventQuery", __FILE__, __LINE__);
}

int pool_cuda_event_sync(void *event)
{
    TRY(EventSynchronize(event));
    return 0;
}

int pool_cuda_open_mem(int device, const uint8_t handle[64], void **ptr)
{
    ipc_handle h;
    memcpy(&h, handle, 64);
    TRY(SetDevice(device));
    TRY(IpcOpenMemHandle(ptr, h, IPC_LAZY_PEER_ACCESS));
    return 0;
}

int pool_cuda_close_mem(int device, void *ptr)
{
    if (!ptr) return 0;
    TRY(SetDevice(device));
    TRY(IpcCloseMemHandle(ptr));
    return 0;
}

int pool_cuda_open_event(int device, const uint8_t handle[64], void **event)
{
    ipc_handle h;
    memcpy(&h, handle, 64);
    TRY(SetDevice(device));
    TRY(IpcOpenEventHandle(event, h));
    return 0;
}

int pool_cuda_stream_new(int device, void **stream)
{
    TRY(SetDevice(device));
    TRY(StreamCreateWithFlags(stream, STREAM_NON_BLOCKING));
    return 0;
}

int pool_cuda_stream_destroy(void *stream)
{
    if (!stream) return 0;
    TRY(StreamDestroy(stream));
    return 0;
}

int pool_cuda_copy_async(void *dst, const void *src, size_t n, void *wait_event, void *stream,
                         void *done_event)
{
    if (wait_event) TRY(StreamWaitEvent(stream, wait_event, 0));
    TRY(MemcpyAsync(dst, src, n, MEMCPY_D2D, stream));
    if (done_event) TRY(EventRecord(done_event, stream));
    return 0;
}

int pool_cuda_memcpy(void *dst, const void *src, size_t n, int host_to_device)
{
    TRY(Memcpy(dst, src, n, host_to_device ? MEMCPY_H2D : MEMCPY_D2H));
    return 0;
}

int pool_cuda_pending_error(void)
{
    if (!rt_ready()) return 0;
    return (int)rt.PeekAtLastError();
}
