/* test_pool_host: the host (POSIX shm) pool between real processes. A producer fills slots with
 * synthetic batches and a forked consumer, knowing only the encoded descriptor sent over a pipe,
 * maps the pool by name, copies every slot and verifies it byte for byte (it was forked before
 * the producer wrote anything, so it sees the batches only through the shared object); it also
 * maps a slot from grant fields alone. Also: single-process mode, a new incarnation replaces the
 * old mapping, a SIGKILLed exporter's segment is swept, descriptors are range-checked, and
 * destroying the pool leaves nothing in /dev/shm. And the grant path with several pools (the
 * broker serves one per target): grants alternating between two pools map each pool once, a
 * new incarnation of one pool drops only that pool's old mapping, the least recently used pool
 * is evicted beyond POOL_IMPORT_MAX, and no mapping outlives the importer. A dead exporter's
 * pool is no longer mapped once its segment is swept (its pages go back to /dev/shm). A pool
 * larger than /dev/shm is refused at creation. A grant or descriptor naming a shm object that
 * is not our pools' (another name form, another owner, open to others) maps nothing. And the
 * limits one by one: each field the descriptor decoder range-checks, the exporter's name
 * length, slot rounding, slot bounds and owner lock, the importer's copy bounds, every kind of
 * use keeping a mapping in the LRU order, the sweep's pid and name filters (a dead owner's pid
 * taken by a later process included), and no descriptor left open by a closed mapping. */
#include "check.h"
#include "err.h"
#include "pool.h"
#include "synthetic.h"
#include "test_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_SLOTS 4

static bool shm_exists(const char *shm_name)
{
    char path[256];
    snprintf(path, sizeof path, "/dev/shm%s", shm_name);
    struct stat st;
    return stat(path, &st) == 0;
}

/* pool_new with stderr captured: *log gets what it logged (malloc'ed, NUL-terminated). */
static pool *pool_new_logged(const pool_config *c, int *err, char **log)
{
    test_capture cap = test_capture_begin();
    pool *p = pool_new(c, err);
    *log = test_capture_end(&cap);
    return p;
}

static const synthetic_params sp = {.vocab_size = 32000, .min_seq_len = 16, .max_seq_len = 100};

static bool read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0) return false;
        got += (size_t)r;
    }
    return true;
}

/* Forks a process that exports a host pool like cfg named `name`, fills slot 0 with the low
 * byte of its incarnation (as grant_copy expects), tells its descriptor (into *d; shm_name ""
 * when it failed) and waits for a signal. Returns its pid: SIGKILL it to leave the segment
 * stale. */
static pid_t spawn_exporter(const pool_config *cfg, const char *name, pool_desc *d)
{
    int fds[2];
    memset(d, 0, sizeof *d);
    if (pipe(fds) != 0) return -1;
    pid_t child = fork();
    if (child == 0) {
        pool_config dc = *cfg;
        dc.name = name;
        pool *dp = pool_new(&dc, NULL);
        pool_desc cd;
        memset(&cd, 0, sizeof cd);
        if (dp) {
            cd = *pool_descriptor(dp);
            memset(pool_slot_ptr(dp, 0), (int)(cd.incarnation & 0xff), cd.slot_bytes);
            pool_slot_publish(dp, 0, NULL);
        }
        if (write(fds[1], &cd, sizeof cd) != (ssize_t)sizeof cd) _exit(1);
        pause();
        _exit(0);
    }
    close(fds[1]);
    if (child < 0 || !read_full(fds[0], d, sizeof *d)) d->shm_name[0] = '\0';
    close(fds[0]);
    return child;
}

/* The consumer process: returns the number of failures as its exit status. */
static int consumer(int rfd, const slot_layout *l)
{
    uint32_t len;
    uint8_t buf[POOL_DESC_MAX_BYTES];
    if (!read_full(rfd, &len, 4) || len > sizeof buf || !read_full(rfd, buf, len)) return 100;
    pool_desc d;
    if (pool_desc_decode(buf, len, &d) != 0) return 101;
    int err = 0;
    pool_importer *imp = pool_importer_new(POOL_HOST, 0, &err);
    if (!imp) return 102;
    if (pool_importer_attach(imp, &d) != 0) return 103;
    void *stage = pool_staging_alloc(POOL_HOST, 0, l->slot_bytes);
    int failures = 0;
    for (uint32_t i = 0; i < N_SLOTS; i++) {
        slot_work_unit wu = {.epoch = 1, .bucket = i % 2, .batch = 10 + i};
        if (pool_copy_start(imp, d.incarnation, i, i * d.slot_bytes, l->slot_bytes, stage) != 0)
            failures++;
        if (pool_copy_wait(imp) != 0) failures++;
        char err_msg[256];
        if (synthetic_verify(stage, l, &wu, &sp, NULL, err_msg, sizeof err_msg) != 0) {
            fprintf(stderr, "consumer: slot %u: %s\n", i, err_msg);
            failures++;
        }
    }
    /* out-of-slot ranges and unknown incarnations are refused */
    if (pool_copy_start(imp, d.incarnation, 1, 0, 16, stage) != DFLASH_ERANGE) failures++;
    if (pool_copy_start(imp, d.incarnation + 1, 0, 0, 16, stage) != DFLASH_ESTALE) failures++;
    /* the grant path: map from (incarnation, shm name, slot, offset, size) alone */
    pool_importer *gimp = pool_importer_new(POOL_HOST, 0, NULL);
    pool_slot_ref ref = {.backend = POOL_HOST, .incarnation = d.incarnation, .slot = 3,
                         .offset = 3 * d.slot_bytes, .bytes = l->slot_bytes, .device = -1};
    snprintf(ref.shm_name, sizeof ref.shm_name, "%s", d.shm_name);
    if (pool_importer_attach_slot(gimp, &ref) != 0) failures++;
    if (pool_copy_start(gimp, ref.incarnation, 3, ref.offset, ref.bytes, stage) != 0) failures++;
    slot_work_unit wu3 = {.epoch = 1, .bucket = 1, .batch = 13};
    if (synthetic_verify(stage, l, &wu3, &sp, NULL, NULL, 0) != 0) failures++;
    /* past the end of the arena */
    if (pool_copy_start(gimp, ref.incarnation, 3, d.arena_bytes - 8, 16, stage) != DFLASH_ERANGE)
        failures++;
    pool_importer_destroy(&gimp);
    pool_staging_free(POOL_HOST, 0, &stage);
    pool_importer_destroy(&imp);
    return failures;
}

/* Mappings of pool shm objects in this process, from /proc/self/maps. */
static int shm_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "/dev/shm/dflash.")) n++;
    fclose(f);
    return n;
}

/* Open file descriptors of this process, from /proc/self/fd (the listing's own included). */
static int open_fds(void)
{
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int n = 0;
    while (readdir(dir)) n++;
    closedir(dir);
    return n;
}

/* The grant the broker would send for slot 0 of d; named: with the pool's name. */
static pool_slot_ref grant_for(const pool_desc *d, bool named)
{
    pool_slot_ref ref = {.backend = POOL_HOST, .incarnation = d->incarnation, .slot = 0,
                         .offset = 0, .bytes = d->slot_bytes, .device = -1};
    if (named) snprintf(ref.pool_name, sizeof ref.pool_name, "%s", d->name);
    snprintf(ref.shm_name, sizeof ref.shm_name, "%s", d->shm_name);
    return ref;
}

/* Attaches d's slot 0 from a grant and copies it; true if the copy holds d's fill byte. */
static bool grant_copy(pool_importer *imp, const pool_desc *d, bool named, uint8_t *stage)
{
    pool_slot_ref ref = grant_for(d, named);
    if (pool_importer_attach_slot(imp, &ref) != 0) return false;
    if (pool_copy_start(imp, ref.incarnation, 0, 0, ref.bytes, stage) != 0) return false;
    if (pool_copy_wait(imp) != 0) return false;
    return stage[0] == (uint8_t)(d->incarnation & 0xff) && stage[ref.bytes - 1] == stage[0];
}

#define N_EXTRA POOL_IMPORT_MAX

/* The importer side of test_many_pools, in a process of its own (pools of this process would be
 * used through raw pointers and never opened). a1 and a2 are two incarnations of one pool name,
 * b another pool, extra[] more pools. Returns its failures as the exit status. */
static int many_pools_importer(const pool_desc *a1, const pool_desc *a2, const pool_desc *b,
                               const pool_desc *extra)
{
    check_passed = check_failed = 0;
    int inherited = shm_maps(); /* the exporters' own mappings, inherited through fork */
    pool_importer *imp = pool_importer_new(POOL_HOST, 0, NULL);
    uint8_t *stage = pool_staging_alloc(POOL_HOST, 0, a1->slot_bytes);
    CHECK(imp && stage && inherited >= 0);
    if (!imp || !stage) return 1;
    /* two targets: the broker's grants alternate between their pools */
    for (int i = 0; i < 10; i++) {
        CHECK(grant_copy(imp, a1, true, stage));
        CHECK(grant_copy(imp, b, true, stage));
    }
    CHECK_EQ_INT(pool_importer_opens(imp), 2); /* each pool mapped once, not once per switch */
    CHECK_EQ_INT(pool_importer_mappings(imp), 2);
    CHECK_EQ_INT(shm_maps(), inherited + 2);
    /* pool a restarts: a grant of its new incarnation drops its old mapping, not b's */
    CHECK(grant_copy(imp, a2, true, stage));
    CHECK_EQ_INT(pool_importer_opens(imp), 3);
    CHECK_EQ_INT(pool_importer_mappings(imp), 2);
    CHECK_EQ_INT(pool_copy_start(imp, a1->incarnation, 0, 0, 64, stage), DFLASH_ESTALE);
    for (int i = 0; i < 5; i++) {
        CHECK(grant_copy(imp, b, true, stage));
        CHECK(grant_copy(imp, a2, true, stage));
    }
    CHECK_EQ_INT(pool_importer_opens(imp), 3);
    CHECK_EQ_INT(shm_maps(), inherited + 2);
    /* a grant without the pool name (older broker): a host pool's name is in its shm name, so
     * a1 supersedes a2 and b stays */
    CHECK(grant_copy(imp, a1, false, stage));
    CHECK_EQ_INT(pool_importer_opens(imp), 4);
    CHECK_EQ_INT(pool_importer_mappings(imp), 2);
    CHECK_EQ_INT(pool_copy_start(imp, a2->incarnation, 0, 0, 64, stage), DFLASH_ESTALE);
    CHECK(grant_copy(imp, b, false, stage));
    CHECK_EQ_INT(pool_importer_opens(imp), 4);
    /* more pools than the cache holds: the least recently used is closed for room (a1, b were
     * used last in that order, so extra[N_EXTRA-2] evicts a1 and extra[N_EXTRA-1] evicts b) */
    for (uint32_t i = 0; i < N_EXTRA; i++) CHECK(grant_copy(imp, &extra[i], true, stage));
    CHECK_EQ_INT(pool_importer_opens(imp), 4 + N_EXTRA);
    CHECK_EQ_INT(pool_importer_mappings(imp), POOL_IMPORT_MAX);
    CHECK_EQ_INT(shm_maps(), inherited + (int)POOL_IMPORT_MAX);
    CHECK_EQ_INT(pool_copy_start(imp, a1->incarnation, 0, 0, 64, stage), DFLASH_ESTALE);
    CHECK_EQ_INT(pool_copy_start(imp, b->incarnation, 0, 0, 64, stage), DFLASH_ESTALE);
    CHECK(grant_copy(imp, &extra[0], true, stage)); /* a hit: extra[1] is now the oldest */
    CHECK(grant_copy(imp, b, true, stage));
    CHECK_EQ_INT(pool_importer_opens(imp), 5 + N_EXTRA);
    CHECK_EQ_INT(pool_copy_start(imp, extra[1].incarnation, 0, 0, 64, stage), DFLASH_ESTALE);
    CHECK_EQ_INT(pool_copy_start(imp, extra[0].incarnation, 0, 0, 64, stage), 0);
    CHECK_EQ_INT(pool_copy_wait(imp), 0);
    /* destroy closes them all */
    pool_importer_destroy(&imp);
    CHECK_EQ_INT(shm_maps(), inherited);
    pool_staging_free(POOL_HOST, 0, (void **)&stage);
    printf("many pools importer: %d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

/* Exporters of several pools in this process, the importer forked (see many_pools_importer).
 * Slot 0 of each pool is filled with the low byte of its incarnation. */
static void test_many_pools(void)
{
    char an[32], bn[32];
    snprintf(an, sizeof an, "umanyA%d", (int)getpid());
    snprintf(bn, sizeof bn, "umanyB%d", (int)getpid());
    pool *pools[3 + N_EXTRA] = {0};
    pool_config cfg = {.backend = POOL_HOST, .n_slots = 2, .slot_bytes = 4096};
    for (uint32_t i = 0; i < 3 + N_EXTRA; i++) {
        char xn[32];
        snprintf(xn, sizeof xn, "umanyX%u-%d", i, (int)getpid());
        cfg.name = i == 0 || i == 2 ? an : i == 1 ? bn : xn; /* pools[2]: a's next incarnation */
        cfg.incarnation = 0x1000 + i;                        /* distinct low bytes */
        pools[i] = pool_new(&cfg, NULL);
        CHECK(pools[i] != NULL);
        if (!pools[i]) goto out;
        memset(pool_slot_ptr(pools[i], 0), (int)(0x1000 + i) & 0xff, 4096);
        CHECK_EQ_INT(pool_slot_publish(pools[i], 0, NULL), 0);
    }
    pool_desc extra[N_EXTRA];
    for (uint32_t i = 0; i < N_EXTRA; i++) extra[i] = *pool_descriptor(pools[3 + i]);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0)
        _exit(many_pools_importer(pool_descriptor(pools[0]), pool_descriptor(pools[2]),
                                  pool_descriptor(pools[1]), extra));
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
out:
    for (uint32_t i = 0; i < 3 + N_EXTRA; i++) {
        char shm[POOL_SHM_NAME_MAX] = "";
        if (pools[i]) snprintf(shm, sizeof shm, "%s", pool_descriptor(pools[i])->shm_name);
        pool_destroy(&pools[i]);
        if (shm[0]) CHECK(!shm_exists(shm));
    }
}

/* Kills an exporter of spawn_exporter and sweeps its segment, as the next target would. */
static void kill_and_sweep(pid_t exporter, const pool_desc *d)
{
    kill(exporter, SIGKILL);
    waitpid(exporter, NULL, 0);
    pool_sweep_stale(d->name);
    CHECK(!shm_exists(d->shm_name));
}

/* An importer's mapping of a dead exporter's pool is closed once the segment is unlinked, so
 * that /dev/shm gets its pages back (a restarted target used to find no room for its pool
 * while a drafter still mapped the dead one): by pool_importer_close_stale (the drafter's
 * periodic call) and before any new mapping; live pools stay mapped until they sit idle. The
 * exporters are forked (pools of this process would be used through raw pointers). */
static void test_gone_pools(const pool_config *cfg)
{
    char an[32], bn[32], cn[32];
    snprintf(an, sizeof an, "ugoneA%d", (int)getpid());
    snprintf(bn, sizeof bn, "ugoneB%d", (int)getpid());
    snprintf(cn, sizeof cn, "ugoneC%d", (int)getpid());
    int inherited = shm_maps(), fds = open_fds();
    pool_importer *imp = pool_importer_new(POOL_HOST, 0, NULL);
    uint8_t *stage = pool_staging_alloc(POOL_HOST, 0, cfg->slot_bytes);
    pool_desc a, b, c;
    pid_t pa = spawn_exporter(cfg, an, &a), pb = spawn_exporter(cfg, bn, &b), pc = -1;
    CHECK(imp && stage && inherited >= 0 && pa > 0 && pb > 0 && a.shm_name[0] && b.shm_name[0]);
    if (!imp || !stage || pa <= 0 || pb <= 0 || !a.shm_name[0] || !b.shm_name[0]) goto out;
    CHECK(grant_copy(imp, &a, true, stage));
    CHECK(grant_copy(imp, &b, true, stage));
    CHECK_EQ_INT(pool_importer_mappings(imp), 2);
    CHECK_EQ_INT(shm_maps(), inherited + 2);
    CHECK_EQ_INT(pool_importer_close_stale(imp, POOL_IMPORT_IDLE_MS), 0); /* both alive */

    /* target a dies and its segment is swept: our mapping alone holds its pages, until the
     * periodic call closes it; b stays */
    kill_and_sweep(pa, &a);
    pa = -1;
    CHECK_EQ_INT(shm_maps(), inherited + 2);
    CHECK_EQ_INT(pool_importer_close_stale(imp, POOL_IMPORT_IDLE_MS), 1);
    CHECK_EQ_INT(pool_importer_mappings(imp), 1);
    CHECK_EQ_INT(shm_maps(), inherited + 1);
    CHECK_EQ_INT(pool_copy_start(imp, a.incarnation, 0, 0, 64, stage), DFLASH_ESTALE);
    CHECK(grant_copy(imp, &b, true, stage));

    /* target b dies too and target c (another name) comes up: mapping c closes b's first */
    kill_and_sweep(pb, &b);
    pb = -1;
    pc = spawn_exporter(cfg, cn, &c);
    CHECK(pc > 0 && c.shm_name[0]);
    if (pc <= 0 || !c.shm_name[0]) goto out;
    CHECK(grant_copy(imp, &c, true, stage));
    CHECK_EQ_INT(pool_importer_mappings(imp), 1);
    CHECK_EQ_INT(shm_maps(), inherited + 1);
    CHECK_EQ_INT(pool_copy_start(imp, b.incarnation, 0, 0, 64, stage), DFLASH_ESTALE);

    /* a live pool is closed only once idle (here: unused for 0 ms), and mapped again at need */
    CHECK_EQ_INT(pool_importer_close_stale(imp, POOL_IMPORT_IDLE_MS), 0);
    CHECK_EQ_INT(pool_importer_close_stale(imp, 0), 1);
    CHECK_EQ_INT(pool_importer_mappings(imp), 0);
    CHECK_EQ_INT(shm_maps(), inherited);
    CHECK(grant_copy(imp, &c, true, stage));
out:
    pool_importer_destroy(&imp);
    CHECK_EQ_INT(shm_maps(), inherited);
    CHECK_EQ_INT(open_fds(), fds); /* each mapping's shm descriptor closed with it */
    pool_staging_free(POOL_HOST, 0, (void **)&stage);
    if (pa > 0) kill_and_sweep(pa, &a);
    if (pb > 0) kill_and_sweep(pb, &b);
    if (pc > 0) kill_and_sweep(pc, &c);
}

/* Makes shm object `name` of 64 KiB with mode `mode` (fchmod: the umask does not cut it) and
 * returns its descriptor, or -1. */
static int shm_make(const char *name, mode_t mode)
{
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return -1;
    if (ftruncate(fd, 65536) != 0 || fchmod(fd, mode) != 0) {
        close(fd);
        shm_unlink(name);
        return -1;
    }
    return fd;
}

/* pool_importer_attach_slot of a grant naming shm object `name` (incarnation inc), with what it
 * logged in *log (malloc'ed). */
static int attach_named(pool_importer *imp, const char *name, uint64_t inc, char **log)
{
    pool_slot_ref ref = {.backend = POOL_HOST, .incarnation = inc, .slot = 0, .offset = 0,
                         .bytes = 4096, .device = -1};
    snprintf(ref.shm_name, sizeof ref.shm_name, "%s", name);
    test_capture cap = test_capture_begin();
    int rc = pool_importer_attach_slot(imp, &ref);
    *log = test_capture_end(&cap);
    return rc;
}

/* A grant names the shm object the drafter maps; the broker's word alone must not point it at
 * any object in /dev/shm (the security audit's local-trust finding): the importer maps only a
 * name of our pools' form ("/dflash.<name>.<pid>.<16 hex>") whose object is ours alone (our
 * uid, mode 0600). A refused grant maps nothing and the warning names the object and why. The
 * sweep of stale segments leaves another user's alone (only as root: it could remove it). */
/* A dead exporter's pid taken by a process that started after its object last changed: the
 * sweep takes the object for stale (it used to stay until that process ended), unless its owner
 * lock is held; a process that started before (or within the margin after) the change could be
 * the maker, and its object stays. The judgement alone: a pid cannot be reused on purpose here
 * without moving the pid counter of every process (ns_last_pid), which other tests running
 * beside this one would feel. */
static void test_reused_pid(void)
{
    struct timespec before, after;
    clock_gettime(CLOCK_REALTIME, &before);
    usleep(POOL_SWEEP_REUSE_MARGIN_MS * 1000 + 100000);
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t later = fork();
    if (later == 0) {
        close(ready[0]);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char x;
    CHECK(later > 0 && read(ready[0], &x, 1) == 1);
    close(ready[0]);
    clock_gettime(CLOCK_REALTIME, &after);
    CHECK(pool_owner_pid_reused(later, &before)); /* made before it started: not its maker */
    CHECK(!pool_owner_pid_reused(later, &after));
    /* a change 50 ms before `after`, within the margin of the start: could be its maker */
    struct timespec just_before = after;
    if (just_before.tv_nsec >= 50000000) {
        just_before.tv_nsec -= 50000000;
    } else {
        just_before.tv_sec -= 1;
        just_before.tv_nsec += 950000000;
    }
    CHECK(!pool_owner_pid_reused(later, &just_before));
    CHECK(!pool_owner_pid_reused((int)getpid(), &before)); /* we started before it */
    kill(later, SIGKILL);
    waitpid(later, NULL, 0);
    CHECK(!pool_owner_pid_reused(later, &before)); /* no such process: not judged */
}

static void test_foreign_shm(void)
{
    pool_importer *imp = pool_importer_new(POOL_HOST, 0, NULL);
    CHECK(imp != NULL);
    if (!imp) return;
    int maps = shm_maps(); /* this process's own pools */
    char name[POOL_SHM_NAME_MAX], *log = NULL;
    snprintf(name, sizeof name, "/dflash.uforeign%d.%d.00000000000000aa", (int)getpid(),
             (int)getpid());
    int fd = shm_make(name, 0644);
    CHECK(fd >= 0);
    /* readable by others: refused */
    CHECK_EQ_INT(attach_named(imp, name, 0xaa, &log), DFLASH_EDENIED);
    CHECK(log && strstr(log, name) && strstr(log, "mode 0644") && strstr(log, "not mapped"));
    free(log);
    CHECK_EQ_INT(pool_importer_opens(imp), 0);
    CHECK_EQ_INT(pool_importer_mappings(imp), 0);
    CHECK_EQ_INT(shm_maps(), maps);
    /* another user's, mode 0600 */
    if (geteuid() == 0 && fd >= 0) {
        CHECK(fchmod(fd, 0600) == 0 && fchown(fd, 65534, (gid_t)-1) == 0);
        CHECK_EQ_INT(attach_named(imp, name, 0xaa, &log), DFLASH_EDENIED);
        CHECK(log && strstr(log, "owner uid 65534"));
        free(log);
        CHECK_EQ_INT(pool_importer_opens(imp), 0);
        CHECK(fchown(fd, 0, (gid_t)-1) == 0);
    }
    /* ours, 0600: mapped (the check refuses what it should, not everything) */
    CHECK(fd >= 0 && fchmod(fd, 0600) == 0);
    CHECK_EQ_INT(attach_named(imp, name, 0xaa, &log), 0);
    free(log);
    CHECK_EQ_INT(pool_importer_opens(imp), 1);
    pool_importer_forget(imp, 0xaa);
    if (fd >= 0) close(fd);
    shm_unlink(name);

    /* objects of ours, mode 0600, whose names our pools never have */
    char bad[8][POOL_SHM_NAME_MAX];
    snprintf(bad[0], sizeof bad[0], "/dflash-utest-%d", (int)getpid());
    snprintf(bad[1], sizeof bad[1], "/dflash.ubad%d.1.xyz", (int)getpid());
    snprintf(bad[2], sizeof bad[2], "/other.ubad%d.1.00000000000000aa", (int)getpid());
    snprintf(bad[3], sizeof bad[3], "/dflash.u.bad%d.1.00000000000000aa", (int)getpid());
    snprintf(bad[4], sizeof bad[4], "/dflash.ubad%d.0.00000000000000aa", (int)getpid()); /* pid 0 */
    snprintf(bad[5], sizeof bad[5], "/dflash.ubad%d.1.0000000000000aa", (int)getpid()); /* 15 */
    snprintf(bad[6], sizeof bad[6], "/dflash.ubad%d.1.00000000000000ag", (int)getpid());
    /* a pool name part of POOL_NAME_MAX characters: one more than a pool name holds */
    snprintf(bad[7], sizeof bad[7], "/dflash.nnnnnnnnnnnnnnnnnnnnnnnnn%07d.1.00000000000000aa",
             (int)getpid() % 10000000);
    for (int i = 0; i < 8; i++) {
        fd = shm_make(bad[i], 0600);
        CHECK(fd >= 0);
        CHECK_EQ_INT(attach_named(imp, bad[i], 0xb0 + (uint64_t)i, &log), DFLASH_EDENIED);
        CHECK(log && strstr(log, bad[i]) && strstr(log, "not the name of a pool"));
        free(log);
        if (fd >= 0) close(fd);
        shm_unlink(bad[i]);
    }
    CHECK_EQ_INT(pool_importer_opens(imp), 1);
    CHECK_EQ_INT(pool_importer_mappings(imp), 0);
    /* the descriptor path checks alike */
    snprintf(name, sizeof name, "/dflash.uforeign%d.%d.00000000000000ab", (int)getpid(),
             (int)getpid());
    fd = shm_make(name, 0666);
    pool_desc d = {.backend = POOL_HOST, .n_slots = 1, .slot_bytes = 4096, .arena_bytes = 65536,
                   .incarnation = 0xab, .owner_pid = getpid()};
    snprintf(d.name, sizeof d.name, "uforeign%d", (int)getpid());
    snprintf(d.shm_name, sizeof d.shm_name, "%s", name);
    test_capture cap = test_capture_begin();
    int rc = pool_importer_attach(imp, &d);
    log = test_capture_end(&cap);
    CHECK_EQ_INT(rc, DFLASH_EDENIED);
    CHECK(log && strstr(log, "mode 0666"));
    free(log);
    /* ours, but smaller than the descriptor's arena: refused, not mapped short */
    CHECK(fd >= 0 && fchmod(fd, 0600) == 0);
    d.arena_bytes = 2 * POOL_ARENA_ALIGN;
    cap = test_capture_begin();
    rc = pool_importer_attach(imp, &d);
    log = test_capture_end(&cap);
    CHECK_EQ_INT(rc, DFLASH_EMISMATCH);
    CHECK(log && strstr(log, "smaller than its descriptor says"));
    free(log);
    CHECK_EQ_INT(pool_importer_mappings(imp), 0);
    if (fd >= 0) close(fd);
    shm_unlink(name);
    pool_importer_destroy(&imp);

    /* the sweep removes only what is stale: an object whose pid lives stays even without the
     * owner lock (an exporter of a version before it), and a sweep of one pool name leaves a
     * dead object of another name */
    snprintf(name, sizeof name, "/dflash.ulive%d.%d.0000000000000001", (int)getpid(),
             (int)getpid());
    fd = shm_make(name, 0600);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    pool_sweep_stale(NULL);
    CHECK(shm_exists(name));
    shm_unlink(name);
    pid_t gone_pid = fork();
    if (gone_pid == 0) _exit(0);
    waitpid(gone_pid, NULL, 0);
    char filt[32];
    snprintf(filt, sizeof filt, "ufilt%d", (int)getpid());
    snprintf(name, sizeof name, "/dflash.%s.%d.0000000000000001", filt, (int)gone_pid);
    fd = shm_make(name, 0600);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    /* (a test beside this one that starts a host pool sweeps every name: so the count of this
     * call, not the object's presence after it, tells whether it reached another name) */
    CHECK_EQ_INT(pool_sweep_stale("ufiltother"), 0);
    CHECK(pool_sweep_stale(filt) <= 1);
    CHECK(!shm_exists(name));

    test_reused_pid();

    if (geteuid() == 0) {
        pid_t dead = fork();
        if (dead == 0) _exit(0);
        waitpid(dead, NULL, 0);
        snprintf(name, sizeof name, "/dflash.usweep%d.%d.0000000000000001", (int)getpid(),
                 (int)dead);
        fd = shm_make(name, 0600);
        CHECK(fd >= 0 && fchown(fd, 65534, (gid_t)-1) == 0);
        if (fd >= 0) close(fd);
        pool_sweep_stale(NULL);
        CHECK(shm_exists(name));
        shm_unlink(name);
    }
}

/* decode(encode(d)) for a descriptor changed by hand. */
static int recode(const pool_desc *d)
{
    uint8_t buf[POOL_DESC_MAX_BYTES];
    int len = pool_desc_encode(d, buf, sizeof buf);
    if (len < 0) return len;
    pool_desc back;
    return pool_desc_decode(buf, (size_t)len, &back);
}

/* Each field the decoder range-checks, refused alone (the rest of the descriptor valid), and
 * the encoder's own limits. A descriptor comes from the broker, so each check is the importer's
 * word against a wrong one: a slot size off the 256-byte grid, an arena off its alignment, a
 * pool name or shm name no exporter gives, a version or length it does not know. */
static void test_descriptor_checks(const pool_desc *d)
{
    pool_desc v = *d, x;
    v.n_slots = 1, v.slot_bytes = 512, v.arena_bytes = POOL_ARENA_ALIGN;
    CHECK_EQ_INT(recode(&v), 0); /* the base of the cases below is accepted */
    x = v, x.incarnation = 0;
    CHECK_EQ_INT(recode(&x), DFLASH_ERANGE);
    x = v, x.slot_bytes = 384; /* fits the arena, off the grid */
    CHECK_EQ_INT(recode(&x), DFLASH_ERANGE);
    x = v, x.slot_bytes = (1ull << 40) + 256, x.arena_bytes = (1ull << 40) + POOL_ARENA_ALIGN;
    CHECK_EQ_INT(recode(&x), DFLASH_ERANGE);
    x = v, x.arena_bytes = POOL_ARENA_ALIGN + 256; /* holds the slot, off the alignment */
    CHECK_EQ_INT(recode(&x), DFLASH_ERANGE);
    x = v, snprintf(x.name, sizeof x.name, "a/b");
    CHECK_EQ_INT(recode(&x), DFLASH_ERANGE);
    x = v, snprintf(x.shm_name, sizeof x.shm_name, "/other.a.1.0000000000000001");
    CHECK_EQ_INT(recode(&x), DFLASH_ERANGE);
    x = v, x.backend = (pool_backend)7;
    CHECK_EQ_INT(recode(&x), DFLASH_ERANGE);

    uint8_t buf[POOL_DESC_MAX_BYTES + 1];
    int len = pool_desc_encode(&v, buf, sizeof buf - 1);
    CHECK(len > 0 && (size_t)len < sizeof buf);
    pool_desc back;
    buf[len] = 0;
    CHECK_EQ_INT(pool_desc_decode(buf, (size_t)len + 1, &back), DFLASH_EFORMAT); /* a byte more */
    buf[8]++; /* the version, little-endian after the 8-byte magic */
    CHECK_EQ_INT(pool_desc_decode(buf, (size_t)len, &back), DFLASH_EVERSION);
    buf[8]--;
    CHECK_EQ_INT(pool_desc_decode(buf, (size_t)len, &back), 0);
    CHECK_EQ_INT(pool_desc_encode(&v, buf, (size_t)len - 1), DFLASH_ERANGE); /* no room */
    CHECK_EQ_INT(pool_desc_encode(&v, buf, (size_t)len), len);
    x = v, x.n_slots = POOL_MAX_SLOTS + 1;
    CHECK_EQ_INT(pool_desc_encode(&x, buf, sizeof buf), DFLASH_ERANGE);
}

/* The exporter's side of its limits: a pool name of POOL_NAME_MAX - 1 characters and no more
 * (it travels NUL-terminated in POOL_NAME_MAX bytes), slots rounded up to 256 bytes (the
 * descriptor's grid, so an odd size still makes a pool an importer accepts), slot numbers past
 * the pool refused by publish and sync, and the shared owner lock the sweep goes by held for
 * the pool's life. */
static void test_exporter_limits(const pool_config *cfg)
{
    char name[POOL_NAME_MAX + 1];
    memset(name, 'n', POOL_NAME_MAX);
    name[POOL_NAME_MAX] = '\0';
    CHECK(!pool_name_valid(name));
    name[POOL_NAME_MAX - 1] = '\0';
    CHECK(pool_name_valid(name));

    pool_config oc = *cfg;
    char on[32];
    snprintf(on, sizeof on, "uodd%d", (int)getpid());
    oc.name = on, oc.n_slots = 2, oc.slot_bytes = 1000;
    pool *p = pool_new(&oc, NULL);
    CHECK(p != NULL);
    if (!p) return;
    const pool_desc *d = pool_descriptor(p);
    CHECK(d->slot_bytes == 1024 && pool_slot_offset(p, 1) == 1024);
    CHECK_EQ_INT(recode(d), 0);
    CHECK_EQ_INT(pool_slot_publish(p, 1, NULL), 0);
    CHECK_EQ_INT(pool_slot_publish(p, 2, NULL), DFLASH_ERANGE);
    CHECK_EQ_INT(pool_slot_sync(p, 1), 0);
    CHECK_EQ_INT(pool_slot_sync(p, 2), DFLASH_ERANGE);
    int fd = shm_open(d->shm_name, O_RDONLY, 0);
    CHECK(fd >= 0);
    CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0); /* the owner's shared lock holds */
    if (fd >= 0) close(fd);
    pool_destroy(&p);
}

/* The importer's bounds on one pool of this process: a descriptor of another backend, a grant's
 * slot past the table, a copy of no bytes, past its slot or of a slot past the pool (the arena's
 * alignment padding lies there), all refused; a pool of this process is used through raw
 * pointers and never counted as opened. */
static void test_importer_bounds(pool *p)
{
    const pool_desc *d = pool_descriptor(p);
    pool_importer *imp = pool_importer_new(POOL_HOST, 0, NULL);
    uint8_t *stage = pool_staging_alloc(POOL_HOST, 0, d->slot_bytes + 256);
    CHECK(imp && stage);
    if (!imp || !stage) goto out;
    pool_desc other = *d;
    other.backend = POOL_CUDA;
    CHECK_EQ_INT(pool_importer_attach(imp, &other), DFLASH_EMISMATCH);
    CHECK_EQ_INT(pool_importer_attach(imp, d), 0);
    CHECK_EQ_INT(pool_importer_opens(imp), 0);
    pool_slot_ref ref = grant_for(d, true);
    ref.slot = POOL_MAX_SLOTS;
    CHECK_EQ_INT(pool_importer_attach_slot(imp, &ref), DFLASH_ERANGE);
    uint32_t n = d->n_slots;
    CHECK(d->arena_bytes > (uint64_t)n * d->slot_bytes); /* padding past the last slot */
    CHECK_EQ_INT(pool_copy_start(imp, d->incarnation, n, n * d->slot_bytes, 16, stage),
                 DFLASH_ERANGE);
    CHECK_EQ_INT(pool_copy_start(imp, d->incarnation, 0, 0, 0, stage), DFLASH_ERANGE);
    CHECK_EQ_INT(pool_copy_start(imp, d->incarnation, 0, 0, d->slot_bytes + 1, stage),
                 DFLASH_ERANGE);
    CHECK_EQ_INT(pool_copy_start(imp, d->incarnation, 0, 0, d->slot_bytes, stage), 0);
    CHECK_EQ_INT(pool_copy_wait(imp), 0);
out:
    pool_staging_free(POOL_HOST, 0, (void **)&stage);
    pool_importer_destroy(&imp);
}

/* Which of pools[0..2] imp still maps (bit i: pools[i]); a copy of slot 0 tells. */
static unsigned mapped_of(pool_importer *imp, pool **pools, int n, uint8_t *stage)
{
    unsigned bits = 0;
    for (int i = 0; i < n; i++) {
        const pool_desc *d = pool_descriptor(pools[i]);
        if (pool_copy_start(imp, d->incarnation, 0, 0, 64, stage) == 0) bits |= 1u << i;
        pool_copy_wait(imp);
    }
    return bits;
}

/* Each use of a mapping counts for the least-recently-used order: an attach by descriptor, an
 * attach by grant, a copy. POOL_IMPORT_MAX pools of this process are mapped, pools[0] is used
 * once more in one of those ways, then one more pool comes: pools[1] is closed for room, not
 * pools[0]. */
static void test_lru_uses(const pool_config *cfg)
{
    enum { N = POOL_IMPORT_MAX + 1 };
    pool *pools[N] = {0};
    pool_config c = *cfg;
    c.n_slots = 1, c.slot_bytes = 4096;
    for (int i = 0; i < N; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "ulru%d-%d", i, (int)getpid());
        c.name = nm;
        pools[i] = pool_new(&c, NULL);
        CHECK(pools[i] != NULL);
        if (!pools[i]) goto out;
    }
    uint8_t *stage = pool_staging_alloc(POOL_HOST, 0, 4096);
    for (int how = 0; how < 3; how++) {
        pool_importer *imp = pool_importer_new(POOL_HOST, 0, NULL);
        CHECK(imp != NULL);
        if (!imp) break;
        for (int i = 0; i < N - 1; i++) {
            pool_slot_ref ref = grant_for(pool_descriptor(pools[i]), true);
            CHECK_EQ_INT(how == 1 ? pool_importer_attach_slot(imp, &ref)
                                  : pool_importer_attach(imp, pool_descriptor(pools[i])),
                         0);
        }
        const pool_desc *d0 = pool_descriptor(pools[0]);
        pool_slot_ref ref0 = grant_for(d0, true);
        if (how == 0) CHECK_EQ_INT(pool_importer_attach(imp, d0), 0);
        if (how == 1) CHECK_EQ_INT(pool_importer_attach_slot(imp, &ref0), 0);
        if (how == 2) {
            CHECK_EQ_INT(pool_copy_start(imp, d0->incarnation, 0, 0, 64, stage), 0);
            CHECK_EQ_INT(pool_copy_wait(imp), 0);
        }
        CHECK_EQ_INT(pool_importer_attach(imp, pool_descriptor(pools[N - 1])), 0);
        CHECK_EQ_INT(pool_importer_mappings(imp), (int)POOL_IMPORT_MAX);
        unsigned bits = mapped_of(imp, pools, 2, stage);
        if (bits != 1u) printf("lru: use %d left mappings %#x of pools 0 and 1 (want 0x1)\n", how,
                               bits);
        CHECK(bits == 1u);
        pool_importer_destroy(&imp);
    }
    pool_staging_free(POOL_HOST, 0, (void **)&stage);
out:
    for (int i = 0; i < N; i++) pool_destroy(&pools[i]);
}

int main(void)
{
    char name[32];
    snprintf(name, sizeof name, "utest%d", (int)getpid());
    slot_layout l;
    CHECK_EQ_INT(slot_layout_compute(256, 8, 32, 2, SLOT_DTYPE_F32, &l), 0);
    pool_config cfg = {.backend = POOL_HOST, .name = name, .n_slots = N_SLOTS,
                       .slot_bytes = l.slot_bytes};
    int err = 0;
    pool *p = pool_new(&cfg, &err);
    CHECK(p != NULL);
    if (!p) CHECK_DONE();
    const pool_desc *d = pool_descriptor(p);
    CHECK(d->incarnation != 0);
    CHECK_EQ_INT(d->arena_bytes % POOL_ARENA_ALIGN, 0);
    CHECK(shm_exists(d->shm_name));
    struct stat st;
    char path[256];
    snprintf(path, sizeof path, "/dev/shm%s", d->shm_name);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    /* the consumer is forked before anything is written: it can only see the batches through
     * the shared object it maps by name */
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t child = fork();
    if (child == 0) {
        close(fds[1]);
        _exit(consumer(fds[0], &l));
    }
    close(fds[0]);
    for (uint32_t i = 0; i < N_SLOTS; i++) {
        slot_work_unit wu = {.epoch = 1, .bucket = i % 2, .batch = 10 + i};
        CHECK(synthetic_fill(pool_slot_ptr(p, i), &l, &wu, &sp, d->incarnation) > 0);
        CHECK_EQ_INT(pool_slot_publish(p, i, NULL), 0);
    }

    /* descriptor round trip */
    uint8_t buf[POOL_DESC_MAX_BYTES];
    int len = pool_desc_encode(d, buf, sizeof buf);
    CHECK(len > 0);
    pool_desc back;
    CHECK_EQ_INT(pool_desc_decode(buf, (size_t)len, &back), 0);
    CHECK(back.incarnation == d->incarnation && strcmp(back.shm_name, d->shm_name) == 0 &&
          back.slot_bytes == d->slot_bytes && back.n_slots == N_SLOTS);
    CHECK_EQ_INT(pool_desc_decode(buf, (size_t)len - 1, &back), DFLASH_EFORMAT);
    uint8_t bad[POOL_DESC_MAX_BYTES];
    memcpy(bad, buf, (size_t)len);
    bad[0] = 'X';
    CHECK_EQ_INT(pool_desc_decode(bad, (size_t)len, &back), DFLASH_EFORMAT);
    memcpy(bad, buf, (size_t)len);
    bad[16] = 0xFF; /* n_slots 511: over POOL_MAX_SLOTS */
    bad[17] = 0x01;
    CHECK_EQ_INT(pool_desc_decode(bad, (size_t)len, &back), DFLASH_ERANGE);
    /* a slot count within the limit whose slots do not fit the arena: an importer would read
     * past its mapping */
    uint32_t too_many = (uint32_t)(d->arena_bytes / d->slot_bytes) + 1;
    CHECK(too_many <= POOL_MAX_SLOTS);
    memcpy(bad, buf, (size_t)len);
    for (int i = 0; i < 4; i++) bad[16 + i] = (uint8_t)(too_many >> (8 * i));
    CHECK_EQ_INT(pool_desc_decode(bad, (size_t)len, &back), DFLASH_ERANGE);
    /* the GPU's bus id travels with the descriptor (a host pool's is empty); junk is refused */
    CHECK(back.gpu_bus_id[0] == '\0');
    {
        pool_desc named = *d;
        uint8_t nbuf[POOL_DESC_MAX_BYTES];
        snprintf(named.gpu_bus_id, sizeof named.gpu_bus_id, "0000:1b:00.0");
        int nlen = pool_desc_encode(&named, nbuf, sizeof nbuf);
        CHECK(nlen == len && pool_desc_decode(nbuf, (size_t)nlen, &back) == 0 &&
              strcmp(back.gpu_bus_id, "0000:1b:00.0") == 0);
        snprintf(named.gpu_bus_id, sizeof named.gpu_bus_id, "0000:1b:00.0;");
        nlen = pool_desc_encode(&named, nbuf, sizeof nbuf);
        CHECK_EQ_INT(pool_desc_decode(nbuf, (size_t)nlen, &back), DFLASH_ERANGE);
    }

    /* hand the consumer the descriptor bytes, as the broker would */
    uint32_t ulen = (uint32_t)len;
    CHECK(write(fds[1], &ulen, 4) == 4 && write(fds[1], buf, ulen) == (ssize_t)ulen);
    close(fds[1]);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);

    /* single-process mode: the same process imports its own pool through raw pointers */
    pool_importer *imp = pool_importer_new(POOL_HOST, 0, &err);
    CHECK(imp != NULL);
    CHECK_EQ_INT(pool_importer_attach(imp, d), 0);
    CHECK_EQ_INT(pool_importer_mappings(imp), 1);
    void *stage = pool_staging_alloc(POOL_HOST, 0, l.slot_bytes);
    CHECK_EQ_INT(pool_copy_start(imp, d->incarnation, 2, 2 * d->slot_bytes, l.slot_bytes, stage),
                 0);
    CHECK_EQ_INT(pool_copy_poll(imp), 1);
    slot_work_unit wu2 = {.epoch = 1, .bucket = 0, .batch = 12};
    CHECK_EQ_INT(synthetic_verify(stage, &l, &wu2, &sp, NULL, NULL, 0), 0);

    /* restart of the exporter: new incarnation, same name; the old mapping is dropped */
    uint64_t old_inc = d->incarnation;
    char old_shm[POOL_SHM_NAME_MAX];
    snprintf(old_shm, sizeof old_shm, "%s", d->shm_name);
    pool_destroy(&p);
    CHECK(p == NULL);
    CHECK(!shm_exists(old_shm));
    p = pool_new(&cfg, &err);
    CHECK(p != NULL);
    d = pool_descriptor(p);
    CHECK(d->incarnation != old_inc);
    CHECK_EQ_INT(pool_importer_attach(imp, d), 0);
    CHECK_EQ_INT(pool_importer_mappings(imp), 1);
    CHECK_EQ_INT(pool_copy_start(imp, old_inc, 0, 0, 64, stage), DFLASH_ESTALE);
    pool_importer_forget_all(imp);
    CHECK_EQ_INT(pool_importer_mappings(imp), 0);

    /* an exporter killed with SIGKILL leaves its segment; the next exporter sweeps it */
    char dead_name[32];
    snprintf(dead_name, sizeof dead_name, "udead%d", (int)getpid());
    pool_desc dead;
    child = spawn_exporter(&cfg, dead_name, &dead);
    const char *dead_shm = dead.shm_name;
    CHECK(child > 0 && dead_shm[0] == '/' && shm_exists(dead_shm));
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    pool_desc gone;
    memset(&gone, 0, sizeof gone);
    /* 1, or 0 when a test running beside this one started a host pool (its sweep takes every
     * dead exporter's segment) since the kill: gone either way */
    CHECK(pool_sweep_stale(dead_name) <= 1);
    CHECK(!shm_exists(dead_shm));

    /* a dead exporter's segment of another name goes too: a target back under a new name
     * (target-<host> in a new container) used to leave its old pool in /dev/shm for good */
    char old_name[32], new_name[32];
    snprintf(old_name, sizeof old_name, "uold%d", (int)getpid());
    snprintf(new_name, sizeof new_name, "unew%d", (int)getpid());
    pool_desc other_pool;
    pid_t other = spawn_exporter(&cfg, old_name, &other_pool);
    const char *other_shm = other_pool.shm_name;
    CHECK(other > 0 && other_shm[0] == '/' && shm_exists(other_shm));
    kill(other, SIGKILL);
    waitpid(other, &status, 0);
    pool_config nc = cfg;
    nc.name = new_name;
    pool *np = pool_new(&nc, &err);
    CHECK(np != NULL);
    CHECK(!shm_exists(other_shm));
    pool_destroy(&np);
    /* but not one whose owner lock is held: its owner lives where this process cannot see its
     * pid (another PID namespace sharing /dev/shm); the pid in the name is a dead one */
    char locked[POOL_SHM_NAME_MAX];
    snprintf(locked, sizeof locked, "/dflash.ulocked.%d.0000000000000001", (int)other);
    int lfd = shm_open(locked, O_CREAT | O_EXCL | O_RDWR, 0600);
    CHECK(lfd >= 0 && flock(lfd, LOCK_SH) == 0);
    pool_sweep_stale(NULL);
    CHECK(shm_exists(locked));
    close(lfd); /* the owner is gone: now it is stale */
    pool_sweep_stale(NULL);
    CHECK(!shm_exists(locked));
    /* an importer told about a vanished segment gets a clear NOTFOUND */
    gone = *d;
    snprintf(gone.shm_name, sizeof gone.shm_name, "%s", dead_shm);
    gone.incarnation = 99;
    gone.owner_pid = child;
    CHECK_EQ_INT(pool_importer_attach(imp, &gone), DFLASH_ENOTFOUND);

    /* a pool larger than /dev/shm can hold is refused at creation. A sparse ftruncate used to
     * accept it, and the target died of SIGBUS writing a slot (a container's /dev/shm is 64 MiB
     * unless raised). The size is the file system's whole size, so nothing gets allocated. */
    struct statvfs sv;
    if (statvfs("/dev/shm", &sv) == 0 && sv.f_blocks > 0) {
        uint64_t fs_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
        pool_config bc = cfg;
        char big_name[32];
        snprintf(big_name, sizeof big_name, "ubig%d", (int)getpid());
        bc.name = big_name;
        bc.n_slots = 2;
        bc.slot_bytes = fs_bytes / 2 + POOL_ARENA_ALIGN;
        if (bc.slot_bytes <= (1ull << 40)) {
            err = 0;
            pool *bp = pool_new(&bc, &err);
            CHECK(bp == NULL);
            CHECK_EQ_INT(err, DFLASH_EIO);
            pool_destroy(&bp);
            char prefix[64];
            snprintf(prefix, sizeof prefix, "dflash.%s.", big_name);
            DIR *dir = opendir("/dev/shm");
            struct dirent *de;
            while (dir && (de = readdir(dir)))
                CHECK(strncmp(de->d_name, prefix, strlen(prefix)) != 0);
            if (dir) closedir(dir);
        }
    }

    /* the cuda backend is refused cleanly where there is no GPU, saying why and what to do on
     * both sides (the importer of dflash-drafter --verify --backend cuda used to log only
     * "cannot create the cuda pool importer on device 0: not supported") */
    if (!pool_cuda_available()) {
        pool_config cc = cfg;
        cc.backend = POOL_CUDA;
        char *why = NULL;
        CHECK(pool_new_logged(&cc, &err, &why) == NULL);
        CHECK_EQ_INT(err, DFLASH_EUNSUPPORTED);
        CHECK(why && strstr(why, "use --backend host") != NULL);
        free(why);
        test_capture cap = test_capture_begin();
        CHECK(pool_importer_new(POOL_CUDA, 0, &err) == NULL);
        why = test_capture_end(&cap);
        CHECK_EQ_INT(err, DFLASH_EUNSUPPORTED);
        CHECK(why && strstr(why, "cuda pool importer requested") != NULL &&
              strstr(why, "use --backend host") != NULL);
        free(why);
    }

    /* bad configs, each named in the error line (dflash-target --name a.b used to say only
     * "cannot create the host slot pool (...): invalid argument") */
    pool_config bc = cfg;
    bc.name = "has/slash";
    char *msg = NULL;
    CHECK(pool_new_logged(&bc, &err, &msg) == NULL && err == DFLASH_EINVAL);
    CHECK(msg && strstr(msg, "pool name 'has/slash'") != NULL);
    free(msg);
    bc = cfg;
    bc.n_slots = POOL_MAX_SLOTS + 1;
    CHECK(pool_new_logged(&bc, &err, &msg) == NULL && err == DFLASH_EINVAL);
    CHECK(msg && strstr(msg, "pool of 257 slots") != NULL);
    free(msg);

    test_many_pools();
    test_foreign_shm();
    test_gone_pools(&cfg);
    test_descriptor_checks(d);
    test_exporter_limits(&cfg);
    test_importer_bounds(p);
    test_lru_uses(&cfg);

    char last_shm[POOL_SHM_NAME_MAX];
    snprintf(last_shm, sizeof last_shm, "%s", d->shm_name);
    pool_staging_free(POOL_HOST, 0, &stage);
    pool_importer_destroy(&imp);
    pool_destroy(&p);
    pool_destroy(&p); /* NULL is fine */
    CHECK(!shm_exists(last_shm));
    CHECK_DONE();
}
