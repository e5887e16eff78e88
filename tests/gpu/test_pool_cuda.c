/* test_pool_cuda (GPU, label gpu): the cuda pool between real processes, as the daemons use it.
 *
 * The parent never touches CUDA (a forked child cannot use a parent's CUDA context); it forks an
 * exporter, which creates a cuda pool on GPU 0, uploads synthetic batches into its slots and
 * records each slot's interprocess event (slot 0 late: zeros first, then its batch copied behind
 * a 4 s host function on a stream, its event recorded behind that copy, and the descriptor sent
 * at once, so that an importer that did not wait on the event would read the zeros), and an
 * importer on GPU 0 (and, when a second GPU is
 * visible, another on GPU 1), which maps the arena from the encoded descriptor, stream-waits on
 * each slot's event, copies the slot device-to-device into a staging buffer, reads it back and
 * verifies every byte. The importer also uses the grant path (pool_importer_attach_slot), also
 * with a damaged handle (it fails and leaves no CUDA error pending for the next kernel launch's
 * check; a copy after it works), and the
 * exporter checks single-process mode (its own pool through raw pointers). Then it times copies:
 * bandwidth and copy latency p50/p99, printed as one table per importer device.
 * Exit 0 all good, 1 failures, 77 no GPU (ctest SKIP_RETURN_CODE).
 * Run on the GPU machine: ctest --test-dir build -L gpu --output-on-failure
 * or directly: build/tests/gpu/test_pool_cuda [slot_mib] [copies]
 */
#include "err.h"
#include "pool.h"
#include "pool_cuda.h"
#include "synthetic.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_SLOTS 4
static const synthetic_params sp = {.vocab_size = 151936, .min_seq_len = 200, .max_seq_len = 2048};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool rw_full(int fd, void *buf, size_t n, bool wr)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r =
            wr ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
        if (r <= 0) return false;
        done += (size_t)r;
    }
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static slot_work_unit unit_of(uint32_t i)
{
    return (slot_work_unit){.epoch = 0, .bucket = i % 3, .batch = 100 + i};
}

/* The CUDA runtime calls the late write of slot 0 needs beyond pool_cuda.h's, from the libcudart
 * pool_cuda loaded (RTLD_GLOBAL) once a pool exists. */
typedef struct late_rt {
    int (*launch_host_func)(void *stream, void (*fn)(void *), void *arg);
    int (*malloc_host)(void **ptr, size_t n);
    int (*free_host)(void *ptr);
    int (*memcpy_async)(void *dst, const void *src, size_t n, int kind, void *stream);
    int (*stream_sync)(void *stream);
} late_rt;

static bool late_rt_load(late_rt *rt)
{
    *(void **)&rt->launch_host_func = dlsym(RTLD_DEFAULT, "cudaLaunchHostFunc");
    *(void **)&rt->malloc_host = dlsym(RTLD_DEFAULT, "cudaMallocHost");
    *(void **)&rt->free_host = dlsym(RTLD_DEFAULT, "cudaFreeHost");
    *(void **)&rt->memcpy_async = dlsym(RTLD_DEFAULT, "cudaMemcpyAsync");
    *(void **)&rt->stream_sync = dlsym(RTLD_DEFAULT, "cudaStreamSynchronize");
    return rt->launch_host_func && rt->malloc_host && rt->free_host && rt->memcpy_async &&
           rt->stream_sync;
}

static void hold_stream(void *arg)
{
    (void)arg;
    sleep(4);
}

/* Exporter: pool on GPU 0, fills, sends the descriptor on out_fd, waits for one byte per
 * importer on in_fd, then destroys the pool. */
static int exporter(const slot_layout *l, int out_fd, int in_fd, int n_importers)
{
    int err = 0, failures = 0;
    pool_config cfg = {.backend = POOL_CUDA, .name = "gputest", .n_slots = N_SLOTS,
                       .slot_bytes = l->slot_bytes, .device = 0};
    pool *p = pool_new(&cfg, &err);
    if (!p) {
        fprintf(stderr, "exporter: pool_new: %s\n", err_str(err));
        return 1;
    }
    void *host = malloc(l->slot_bytes);
    for (uint32_t i = 0; i < N_SLOTS; i++) {
        slot_work_unit wu = unit_of(i);
        if (i == 0) memset(host, 0, l->slot_bytes); /* its batch comes late, below */
        else synthetic_fill(host, l, &wu, &sp, pool_descriptor(p)->incarnation);
        if (pool_staging_write(POOL_CUDA, pool_slot_ptr(p, i), host, l->slot_bytes) != 0)
            failures++;
        if (i && pool_slot_publish(p, i, NULL) != 0) failures++;
    }
    /* single-process mode: our own importer uses raw pointers */
    pool_importer *self = pool_importer_new(POOL_CUDA, 0, &err);
    void *stage = pool_staging_alloc(POOL_CUDA, 0, l->slot_bytes);
    if (!self || !stage || pool_importer_attach(self, pool_descriptor(p)) != 0 ||
        pool_copy_start(self, pool_descriptor(p)->incarnation, 1, pool_slot_offset(p, 1),
                        l->slot_bytes, stage) != 0 ||
        pool_copy_wait(self) != 0 ||
        pool_staging_read(POOL_CUDA, host, stage, l->slot_bytes) != 0) {
        fprintf(stderr, "exporter: single-process copy failed\n");
        failures++;
    } else {
        slot_work_unit wu = unit_of(1);
        char msg[256];
        if (synthetic_verify(host, l, &wu, &sp, NULL, msg, sizeof msg) != 0) {
            fprintf(stderr, "exporter: single-process verify: %s\n", msg);
            failures++;
        }
    }
    pool_staging_free(POOL_CUDA, 0, &stage);
    pool_importer_destroy(&self);
    /* slot 0's batch behind a 4 s host function, its event recorded behind the copy */
    late_rt rt;
    void *stream = NULL, *pinned = NULL;
    slot_work_unit wu0 = unit_of(0);
    if (!late_rt_load(&rt) || pool_cuda_stream_new(0, &stream) != 0 ||
        rt.malloc_host(&pinned, l->slot_bytes) != 0) {
        fprintf(stderr, "exporter: no stream, pinned memory or runtime calls for slot 0\n");
        failures++;
    } else {
        synthetic_fill(pinned, l, &wu0, &sp, pool_descriptor(p)->incarnation);
        if (rt.launch_host_func(stream, hold_stream, NULL) != 0 ||
            rt.memcpy_async(pool_slot_ptr(p, 0), pinned, l->slot_bytes, 1, stream) != 0 ||
            pool_slot_publish(p, 0, stream) != 0) {
            fprintf(stderr, "exporter: the late write of slot 0 failed\n");
            failures++;
        }
    }
    uint8_t buf[POOL_DESC_MAX_BYTES];
    int len = pool_desc_encode(pool_descriptor(p), buf, sizeof buf);
    for (int k = 0; k < n_importers; k++) {
        uint32_t ulen = (uint32_t)len;
        if (!rw_full(out_fd, &ulen, 4, true) || !rw_full(out_fd, buf, ulen, true)) failures++;
    }
    for (int k = 0; k < n_importers; k++) {
        char c;
        if (!rw_full(in_fd, &c, 1, false)) failures++;
    }
    if (stream && rt.stream_sync(stream) != 0) failures++;
    if (pinned) rt.free_host(pinned);
    if (stream) pool_cuda_stream_destroy(stream);
    free(host);
    pool_destroy(&p);
    return failures ? 1 : 0;
}

static int importer(const slot_layout *l, int in_fd, int done_fd, int device, int copies)
{
    int failures = 0, err = 0;
    uint32_t len;
    uint8_t buf[POOL_DESC_MAX_BYTES];
    pool_desc d;
    if (!rw_full(in_fd, &len, 4, false) || len > sizeof buf || !rw_full(in_fd, buf, len, false) ||
        pool_desc_decode(buf, len, &d) != 0) {
        fprintf(stderr, "importer: bad descriptor\n");
        return 1;
    }
    pool_importer *imp = pool_importer_new(POOL_CUDA, device, &err);
    void *stage = pool_staging_alloc(POOL_CUDA, device, l->slot_bytes);
    void *host = malloc(l->slot_bytes);
    if (!imp || !stage || pool_importer_attach(imp, &d) != 0) {
        fprintf(stderr, "importer %d: attach failed\n", device);
        return 1;
    }
    for (uint32_t i = 0; i < N_SLOTS; i++) {
        char msg[256] = "";
        slot_work_unit wu = unit_of(i);
        double t0 = now_s();
        if (pool_copy_start(imp, d.incarnation, i, i * d.slot_bytes, l->slot_bytes, stage) != 0 ||
            pool_copy_wait(imp) != 0 ||
            pool_staging_read(POOL_CUDA, host, stage, l->slot_bytes) != 0 ||
            synthetic_verify(host, l, &wu, &sp, NULL, msg, sizeof msg) != 0) {
            fprintf(stderr, "importer %d: slot %u: %s\n", device, i, msg);
            failures++;
        }
        if (i == 0) /* the exporter's stream held its batch for 4 s from the descriptor on */
            printf("importer GPU %d: slot 0's copy waited %.2f s for its event\n", device,
                   now_s() - t0);
    }
    /* the grant path, in a second importer */
    pool_importer *g = pool_importer_new(POOL_CUDA, device, &err);
    pool_slot_ref ref = {.backend = POOL_CUDA, .incarnation = d.incarnation, .slot = 2,
                         .offset = 2 * d.slot_bytes, .bytes = l->slot_bytes, .device = d.device};
    memcpy(ref.mem_handle, d.mem_handle, POOL_HANDLE_BYTES);
    memcpy(ref.event_handle, d.event_handles[2], POOL_HANDLE_BYTES);
    slot_work_unit wu2 = unit_of(2);
    if (!g || pool_importer_attach_slot(g, &ref) != 0 ||
        pool_copy_start(g, ref.incarnation, 2, ref.offset, ref.bytes, stage) != 0 ||
        pool_copy_wait(g) != 0 || pool_staging_read(POOL_CUDA, host, stage, l->slot_bytes) != 0 ||
        synthetic_verify(host, l, &wu2, &sp, NULL, NULL, 0) != 0) {
        fprintf(stderr, "importer %d: grant-path copy failed\n", device);
        failures++;
    }
    pool_importer_destroy(&g);
    /* a grant whose memory cannot be opened (a damaged handle, a crashed target's pool): the
     * attach fails and leaves no CUDA error behind for the compute code's next launch check to
     * find (it aborted the drafter), and a good copy still works after it */
    pool_importer *bad = pool_importer_new(POOL_CUDA, device, &err);
    pool_slot_ref broken = ref;
    for (size_t k = 0; k < POOL_HANDLE_BYTES; k++) broken.mem_handle[k] ^= 0x5a;
    broken.incarnation = d.incarnation + 1;
    int brc = bad ? pool_importer_attach_slot(bad, &broken) : -1;
    int pending = pool_cuda_pending_error();
    if (brc == 0 || pending != 0) {
        fprintf(stderr, "importer %d: a damaged handle: attach %d, CUDA error left %d\n", device,
                brc, pending);
        failures++;
    }
    pool_importer_destroy(&bad);
    if (pool_copy_start(imp, d.incarnation, 1, d.slot_bytes, l->slot_bytes, stage) != 0 ||
        pool_copy_wait(imp) != 0) {
        fprintf(stderr, "importer %d: a copy after the failed attach failed\n", device);
        failures++;
    }
    /* timing: copy start to done, whole slot */
    double *lat = calloc((size_t)copies, sizeof *lat);
    double t0 = now_s();
    for (int k = 0; k < copies; k++) {
        uint32_t i = (uint32_t)k % N_SLOTS;
        double a = now_s();
        if (pool_copy_start(imp, d.incarnation, i, i * d.slot_bytes, l->slot_bytes, stage) != 0 ||
            pool_copy_wait(imp) != 0)
            failures++;
        lat[k] = now_s() - a;
    }
    double total = now_s() - t0;
    qsort(lat, (size_t)copies, sizeof *lat, cmp_double);
    printf("| importer GPU %d (arena on GPU %d) | %8.1f MiB | %6d | %8.1f GB/s | %8.1f us | %8.1f "
           "us |\n",
           device, d.device, l->slot_bytes / 1048576.0, copies,
           (double)l->slot_bytes * copies / total / 1e9, lat[copies / 2] * 1e6,
           lat[(int)(copies * 0.99)] * 1e6);
    fflush(stdout);
    free(lat);
    free(host);
    pool_staging_free(POOL_CUDA, device, &stage);
    pool_importer_destroy(&imp);
    char c = 'd';
    if (!rw_full(done_fd, &c, 1, true)) failures++;
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int slot_mib = argc > 1 ? atoi(argv[1]) : 64;
    int copies = argc > 2 ? atoi(argv[2]) : 200;
    /* device count from a throwaway child: the parent stays CUDA-free */
    pid_t probe = fork();
    if (probe == 0) {
        int n = pool_cuda_device_count();
        _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    waitpid(probe, &status, 0);
    if (!WIFEXITED(status)) { /* a crashing probe is a failure, not a machine without a GPU */
        fprintf(stderr, "the CUDA device probe died (signal %d)\n", WTERMSIG(status));
        return 1;
    }
    int n_dev = WEXITSTATUS(status);
    if (n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    int n_imp = n_dev >= 2 ? 2 : 1;

    /* layout: bf16, 5 captured layers of 4096 (a 27B-class target), about slot_mib MiB a slot */
    slot_layout l;
    uint32_t hidden = 4096, layers = 5;
    uint32_t budget = (uint32_t)((size_t)slot_mib * 1048576 / (hidden * layers * 2));
    if (budget < 64) budget = 64;
    if (slot_layout_compute(budget, 64, hidden, layers, SLOT_DTYPE_BF16, &l) != 0) return 1;

    int to_imp[2], to_exp[2];
    if (pipe(to_imp) != 0 || pipe(to_exp) != 0) return 1;
    pid_t exp_pid = fork();
    if (exp_pid == 0) _exit(exporter(&l, to_imp[1], to_exp[0], n_imp));
    printf("| importer | slot | copies | bandwidth | copy p50 | copy p99 "
           "|\n|---|---|---|---|---|---|\n");
    fflush(stdout);
    int failures = 0;
    for (int k = 0; k < n_imp; k++) { /* one at a time, so the timings do not overlap */
        pid_t imp_pid = fork();
        if (imp_pid == 0) _exit(importer(&l, to_imp[0], to_exp[1], k, copies));
        waitpid(imp_pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "importer on GPU %d failed\n", k);
            failures++;
        }
    }
    waitpid(exp_pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "exporter failed\n");
        failures++;
    }
    printf("%s\n", failures ? "FAILED" : "all slots verified byte for byte");
    return failures ? 1 : 0;
}
