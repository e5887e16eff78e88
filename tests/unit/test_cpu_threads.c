/* test_cpu_threads: the cpu backend's --threads bounds OpenBLAS's worker threads, not only how
 * many a call uses. OpenBLAS (pthread build) starts a worker per core when it loads; the
 * process's first nn_cpu_new(n) must leave n - 1 of them (the caller is the n-th), and a later
 * context that asks for more gets them at its next product. Threads are counted in
 * /proc/self/task. Exit 77 (skip) where OpenBLAS started a single thread (one core, or
 * OPENBLAS_NUM_THREADS=1 in the environment): nothing to trim there.
 */
#include "check.h"
#include "ops.h"

#include <cblas.h>
#include <dirent.h>
#include <stdlib.h>

static int tasks(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* One product big enough for OpenBLAS to split over every thread it may use. */
static void product(const nn_ops *ops, nn_ctx *c) {
    enum { M = 512, K = 512, N = 512 };
    float *x = ops->alloc(c, sizeof(float) * M * K), *w = ops->alloc(c, sizeof(float) * N * K),
          *y = ops->alloc(c, sizeof(float) * M * N);
    CHECK(x && w && y);
    if (x && w && y) ops->linear_fwd(c, y, x, w, NULL, M, K, N);
    ops->free(c, x), ops->free(c, w), ops->free(c, y);
}

int main(void) {
    int started = openblas_get_num_threads(), at_load = tasks();
    printf("OpenBLAS started %d threads (this process: %d tasks)\n", started, at_load);
    if (started < 2) {
        printf("skip: OpenBLAS runs one thread here, so there is no pool to trim\n");
        return 77;
    }
    const nn_ops *ops = nn_cpu_ops();
    nn_ctx *one = nn_cpu_new(1);
    CHECK(one != NULL);
    CHECK_EQ_INT(tasks(), at_load - (started - 1)); /* the workers are gone */
    product(ops, one);
    CHECK_EQ_INT(tasks(), at_load - (started - 1)); /* and a product starts none */

    nn_ctx *two = nn_cpu_new(2); /* a later context: OpenBLAS grows to its count, no further */
    CHECK(two != NULL);
    product(ops, two);
    CHECK_EQ_INT(tasks(), at_load - (started - 1) + 1);
    CHECK_EQ_INT(openblas_get_num_threads(), 2);
    nn_cpu_destroy(&one);
    nn_cpu_destroy(&two);
    CHECK_DONE();
}
