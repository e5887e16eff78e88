/* test_pool_create_race: a host pool whose shared memory segment is unlinked between its create
 * and its owner's lock (what a target starting in another pid namespace does when its sweep of
 * /dev/shm runs in that window: our pid means nothing there, and the segment is not locked yet)
 * is created again, so pool_new gives a pool drafters can open (defect: it went on with the
 * unlinked segment, and every drafter's shm_open failed with ENOENT until --max-copy-failures
 * ended it). Three such removals in a row fail the create, leaving nothing behind.
 * The sweep is simulated by this binary's flock(), which unlinks the segment just before the
 * owner's LOCK_SH while `sweeps` is positive, then does libc's flock. */
#include "check.h"
#include "err.h"
#include "pool.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

static int sweeps, swept;

int flock(int fd, int op)
{
    if (op == LOCK_SH && sweeps > 0) {
        char link[64], target[512];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = '\0';
            if (strstr(target, "/dev/shm/") && unlink(target) == 0) {
                sweeps--;
                swept++;
            }
        }
    }
    int (*libc_flock)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    return libc_flock ? libc_flock(fd, op) : -1;
}

int main(void)
{
    char name[32];
    snprintf(name, sizeof name, "race%d", (int)getpid());
    pool_config cfg = {.backend = POOL_HOST, .name = name, .n_slots = 2, .slot_bytes = 4096};

    /* one removal in the window: created again, the segment is there for an importer */
    sweeps = 1;
    int err = 0;
    pool *p = pool_new(&cfg, &err);
    CHECK(p != NULL);
    CHECK_EQ_INT(swept, 1);
    if (p) {
        const pool_desc *d = pool_descriptor(p);
        int fd = shm_open(d->shm_name, O_RDWR, 0);
        printf("after one removal: %s %s\n", d->shm_name, fd >= 0 ? "is there" : "is gone");
        CHECK(fd >= 0);
        if (fd >= 0) close(fd);
        pool_importer *imp = pool_importer_new(POOL_HOST, 0, &err);
        CHECK(imp != NULL);
        if (imp) CHECK_EQ_INT(pool_importer_attach(imp, d), 0);
        pool_importer_destroy(&imp);
        pool_destroy(&p);
    }

    /* removed every time: the create fails, nothing left */
    sweeps = 3;
    swept = 0;
    p = pool_new(&cfg, &err);
    CHECK(p == NULL);
    CHECK_EQ_INT(swept, 3);
    printf("after three removals: pool_new %s (%s)\n", p ? "succeeded" : "failed", err_str(err));
    pool_destroy(&p);
    CHECK_DONE();
}
