/* itest_stall_exit: --stall-exit-s, the watchdog of dflash-target and dflash-drafter
 * (heartbeat.h; docs/operating.md's exit table: 5 = hung). A daemon whose main loop stops going
 * round exits 5 within about --stall-exit-s, saying so, wherever it stopped (between broker
 * requests or inside one, holding the client), while one that only waits (a target whose slots
 * all wait for a drafter, a drafter with no data) goes on for longer than that.
 *
 * The hang is real and needs no hook in the daemons: this process, the daemon's parent, traces
 * the daemon's main thread alone (ptrace) and stops it for good at its next call of a function,
 * as a GPU call that never returns would hold it; the other threads, the heartbeat and watchdog
 * among them, run on (SIGSTOP would stop them all). The breakpoint is an int3 written over the
 * function's first byte (PTRACE_POKETEXT: the daemon's private copy of its code), so the
 * functions are ones that only the main thread calls; another thread reaching one would die of
 * the SIGTRAP, and the test would fail. Its address: nm's value plus the executable's load
 * address. (Debug registers, which stop one thread in any function, are not used: some virtual
 * machines take the registers' values and never fire them.) The functions:
 *   heartbeat_alive        between broker requests (only the loop reports its progress);
 *   dflash__claim__init    inside a broker request, with the client's mutex held: wire_pack
 *                          calls it for a drafter's Claim, which only its loop sends (the
 *                          heartbeat thread's requests are Heartbeats). The heartbeat thread
 *                          polls the broker through that client before its stall check: if the
 *                          poll waited for the mutex, the watchdog would wait for ever with it.
 * Where ptrace is not available (or on another architecture than x86-64) the test says so and
 * exits 77 (skipped; scripts/test under CI fails on it).
 *
 * The real dflash-queue (heartbeat 100 ms), a synthetic dflash-target (2 slots) and dflash-drafter
 * --verify, both with --stall-exit-s 3, in a temp dir:
 *   1. the target alone: its slots fill and wait for a drafter; it runs on past 5 s;
 *   2. drafter d1 verifies batches; its main thread is stopped between requests: it exits 5
 *      within 15 s, its log names its loop and the limit;
 *   3. drafter d2 verifies batches; its main thread is stopped inside a request (a Claim): it exits 5
 *      likewise;
 *   4. drafter d3 verifies batches; the target's main thread is stopped between requests: it
 *      exits 5 likewise;
 *   5. d3, with no data now, runs on past 5 s, and exits 0 on SIGTERM.
 * Usage: itest_stall_exit QUEUE TARGET DRAFTER. Exit 0 pass, 1 fail, 77 skipped (no ptrace, or
 * not x86-64). */
#include "check.h"
#include "harness.h"
#include "test_files.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/user.h>

#define STALL_S "3"

static char dir[64], rt[128], ep[128];

/* The address of function fn in process pid running executable bin: nm's value, plus the load
 * address of bin's first mapping when bin is position-independent (ELF type ET_DYN). 0 when
 * not found. */
static uintptr_t function_address(pid_t pid, const char *bin, const char *fn)
{
    char cmd[400], line[512], name[256], real[PATH_MAX];
    uintptr_t value = 0, base = 0;
    snprintf(cmd, sizeof cmd, "nm --defined-only '%s'", bin);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    while (fgets(line, sizeof line, p)) {
        unsigned long v;
        char type;
        if (sscanf(line, "%lx %c %255s", &v, &type, name) == 3 && (type == 'T' || type == 't') &&
            strcmp(name, fn) == 0)
            value = (uintptr_t)v;
    }
    pclose(p);
    unsigned char ehdr[18] = {0};
    FILE *f = fopen(bin, "rb");
    if (!value || !f || fread(ehdr, 1, sizeof ehdr, f) != sizeof ehdr || !realpath(bin, real)) {
        if (f) fclose(f);
        return 0;
    }
    fclose(f);
    if (ehdr[16] != 3) return value; /* ET_EXEC: absolute */
    snprintf(cmd, sizeof cmd, "/proc/%d/maps", (int)pid);
    FILE *m = fopen(cmd, "r");
    while (m && fgets(line, sizeof line, m)) {
        unsigned long lo, off;
        char path[PATH_MAX] = "";
        if (sscanf(line, "%lx-%*x %*s %lx %*s %*s %4095s", &lo, &off, path) == 3 &&
            strcmp(path, real) == 0 && off == 0) {
            base = (uintptr_t)lo;
            break;
        }
    }
    if (m) fclose(m);
    return base ? base + value : 0;
}

/* Writes an int3 (0xCC) over the byte at `at` in the code of thread tid (stopped, traced): the
 * next thread to execute it gets SIGTRAP. 0 or -errno. */
static int set_breakpoint(pid_t tid, uintptr_t at)
{
#if defined(__x86_64__)
    errno = 0;
    long word = ptrace(PTRACE_PEEKTEXT, tid, (void *)at, NULL);
    if (errno) return -errno;
    word = (long)(((unsigned long)word & ~0xffUL) | 0xccUL); /* little-endian: the first byte */
    if (ptrace(PTRACE_POKETEXT, tid, (void *)at, (void *)word)) return -errno;
    return 0;
#else
    (void)tid, (void)at;
    return -ENOSYS;
#endif
}

/* Waits up to ms for a stop or the end of traced pid: its waitpid status in *st, 0, or
 * -ETIMEDOUT (nothing happened: pid runs on). */
static int wait_traced(pid_t pid, int *st, int ms)
{
    for (uint64_t end = h_now_ms() + (uint64_t)ms; h_now_ms() < end; h_sleep_ms(5)) {
        pid_t r = waitpid(pid, st, WNOHANG | __WALL);
        if (r == pid) return 0;
        if (r < 0) return -errno;
    }
    return -ETIMEDOUT;
}

/* Stops pid's main thread for good at its next call of fn (a breakpoint), its other threads
 * running on: pid is traced from here on (its main thread only). 0 or -errno. */
static int hang_main_thread(pid_t pid, const char *bin, const char *fn)
{
    uintptr_t at = function_address(pid, bin, fn);
    if (!at) return -ENOENT;
    if (ptrace(PTRACE_SEIZE, pid, NULL, NULL) != 0) return -errno;
    int st = 0;
    if (ptrace(PTRACE_INTERRUPT, pid, NULL, NULL) != 0) return -errno;
    if (waitpid(pid, &st, __WALL) != pid || !WIFSTOPPED(st)) return -ECHILD;
    int rc = set_breakpoint(pid, at);
    if (rc) return rc;
    int sig = 0;
    for (uint64_t end = h_now_ms() + 10000; h_now_ms() < end;) {
        if (ptrace(PTRACE_CONT, pid, NULL, (void *)(long)sig) != 0) return -errno;
        if ((rc = wait_traced(pid, &st, (int)(end - h_now_ms()) + 1))) return rc;
        if (!WIFSTOPPED(st)) return -ESRCH; /* it ended */
        if (WSTOPSIG(st) == SIGTRAP) return 0; /* at the breakpoint: left there */
        sig = st >> 16 ? 0 : WSTOPSIG(st); /* a signal for the thread goes on to it */
    }
    return -ETIMEDOUT;
}

/* Waits up to ms for pid (stopped by hang_main_thread) to exit: its exit status, -1 otherwise
 * (then it is SIGKILLed). */
static int wait_exit_traced(pid_t pid, int ms)
{
    for (uint64_t end = h_now_ms() + (uint64_t)ms; h_now_ms() < end; h_sleep_ms(20)) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG | __WALL);
        if (r == pid && WIFEXITED(st)) return WEXITSTATUS(st);
        if (r == pid && WIFSIGNALED(st)) return -1;
        if (r < 0) return -1; /* reaped already (hang_main_thread saw it end): not ours */
        /* another stop of the traced thread: leave it stopped */
    }
    h_signal(pid, SIGKILL);
    waitpid(pid, NULL, __WALL);
    return -1;
}

/* Whether pid still runs after ms (it has not exited). */
static bool runs_for(pid_t pid, int ms)
{
    h_sleep_ms(ms);
    return waitpid(pid, NULL, WNOHANG) == 0;
}

static pid_t start_target(const char *bin, const char *log)
{
    char *argv[] = {(char *)bin, rt, "--name=t", "--model=synthetic", "--slots=2",
                    "--token-budget=256", "--max-seqs=4", "--hidden=8", "--layers=2",
                    "--buckets=64,256", "--batches-per-bucket=20000", "--backend=host",
                    "--timeout-ms=1000", "--progress-ms=0", "--stall-exit-s=" STALL_S, NULL};
    return h_spawn_logged(argv, log);
}

static pid_t start_drafter(const char *bin, const char *name, const char *log)
{
    char nm[64];
    snprintf(nm, sizeof nm, "--name=%s", name);
    char *argv[] = {(char *)bin, rt, "--verify", "--backend=host", nm, "--hidden=8",
                    "--layers=2", "--token-budget=256", "--max-seqs=4", "--buckets=64,256",
                    "--progress-ms=0", "--timeout-ms=1000", "--stall-exit-s=" STALL_S, NULL};
    return h_spawn_logged(argv, log);
}

/* Waits up to ms until the broker has n more acks (batches verified) than when called: whether
 * it has. Called while one drafter lives (the one before it has exited), they are that drafter's:
 * it is past its hello, in its loop. */
static bool trains(uint64_t n, int ms)
{
    wire_status s;
    if (h_broker_status(ep, &s) != 0) return false;
    uint64_t from = s.acks;
    for (uint64_t end = h_now_ms() + (uint64_t)ms; h_now_ms() < end; h_sleep_ms(50))
        if (h_broker_status(ep, &s) == 0 && s.acks >= from + n) return true;
    return false;
}

/* Stops the main thread of pid (running bin; its log is log) at its next call of fn (where: what
 * that point is, for the output) and checks that it exits 5 within 15 s, saying so. False when
 * ptrace or the breakpoint is not available. */
static bool check_hang(pid_t pid, const char *bin, const char *fn, const char *where,
                       const char *who, const char *loop, const char *log)
{
    /* one that ended early (runs_for reaped it): its pid may be another process's by now */
    int rc = h_is_child(pid) ? hang_main_thread(pid, bin, fn) : -ECHILD;
    if (rc == -EPERM || rc == -ENOSYS) {
        printf("SKIPPED: cannot stop a thread of our own child at a breakpoint here (%s)\n",
               strerror(-rc));
        return false;
    }
    CHECK_EQ_INT(rc, 0);
    uint64_t t0 = h_now_ms();
    int st = wait_exit_traced(pid, 15000);
    printf("%s, its main thread stopped %s (at %s): exit %d after %.1f s (--stall-exit-s " STALL_S
           ")\n", who, where, fn, st, (h_now_ms() - t0) / 1000.0);
    CHECK_EQ_INT(st, 5);
    char want[160];
    snprintf(want, sizeof want, "%s made no progress for", loop);
    CHECK(h_wait_text(log, want, 2000));
    CHECK(h_wait_text(log, "--stall-exit-s " STALL_S, 0));
    return true;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: itest_stall_exit QUEUE TARGET DRAFTER\n");
        return 2;
    }
    h_tempdir(dir, sizeof dir);
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    char tlog[128], d1log[128], d2log[128], d3log[128];
    snprintf(tlog, sizeof tlog, "%s/target.log", dir);
    snprintf(d1log, sizeof d1log, "%s/d1.log", dir);
    snprintf(d2log, sizeof d2log, "%s/d2.log", dir);
    snprintf(d3log, sizeof d3log, "%s/d3.log", dir);
    pid_t q = h_start_small_queue(argv[1], dir, NULL);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();

    /* 1. a target that waits for a drafter is not hung */
    pid_t t = start_target(argv[2], tlog);
    bool alive = runs_for(t, 5000);
    printf("target with every slot waiting for a drafter: %s after 5 s\n",
           alive ? "running" : "exited");
    CHECK(alive);

    /* 2. a drafter that trains, then hangs between requests */
    pid_t d1 = start_drafter(argv[3], "d1", d1log);
    CHECK(trains(4, 30000));
    int skipped = 0;
    if (!check_hang(d1, argv[3], "heartbeat_alive", "between requests", "drafter d1",
                    "the drafter's loop", d1log)) {
        skipped = 1;
        h_signal(d1, SIGKILL);
        waitpid(d1, NULL, 0);
        goto out;
    }

    /* 3. another drafter takes over, then hangs inside a request, holding its client */
    pid_t d2 = start_drafter(argv[3], "d2", d2log);
    CHECK(trains(4, 30000));
    check_hang(d2, argv[3], "dflash__claim__init", "inside a request", "drafter d2",
               "the drafter's loop", d2log);

    /* 4. a third drafter takes over; the target hangs */
    pid_t d3 = start_drafter(argv[3], "d3", d3log);
    CHECK(trains(4, 30000));
    check_hang(t, argv[2], "heartbeat_alive", "between requests", "target", "the target's loop",
               tlog);
    t = -1;

    /* 5. a drafter with nothing to do is not hung */
    alive = runs_for(d3, 5000);
    printf("drafter d3 without data: %s after 5 s\n", alive ? "running" : "exited");
    CHECK(alive);
    CHECK_EQ_INT(h_stop(d3), 0);
out:
    if (t > 0) CHECK_EQ_INT(h_stop(t), 0);
    CHECK_EQ_INT(h_stop(q), 0);
    if (check_failed) fprintf(stderr, "logs kept in %s\n", dir);
    else h_rmdir(dir);
    if (skipped && !check_failed) return 77;
    CHECK_DONE();
}
