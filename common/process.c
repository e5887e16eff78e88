/* process: see process.h. Linux only: the state and the start time are fields 3 and 22 of
 * /proc/PID/stat, counted after the last ')' of the command name (which may itself hold
 * parentheses and spaces). */
#include "process.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* pid's state letter and start time from /proc/PID/stat: 0, -ENOENT (no such entry: no such
 * process, or one hidden from us), or -EIO (unreadable, or not the expected form). */
static int read_stat(int pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? -ENOENT : -EIO;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    int err = n < 0 ? errno : 0;
    close(fd);
    if (n < 0) return err == ESRCH ? -ENOENT : -EIO; /* reaped while we read */
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2]) return -EIO;
    *state = p[2];
    /* fields 3 (state) to 22 (starttime): 19 separators after the state */
    p += 2;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -EIO;
        p++;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || end == p) return -EIO;
    *start = (uint64_t)v;
    return 0;
}

uint64_t process_start_time(int pid) {
    char state;
    uint64_t start;
    return pid > 0 && read_stat(pid, &state, &start) == 0 ? start : 0;
}

bool process_gone_since(int pid, uint64_t start) {
    if (pid <= 0) return false;
    bool signallable = kill((pid_t)pid, 0) == 0;
    if (!signallable && errno == ESRCH) return true;
    char state;
    uint64_t started;
    int rc = read_stat(pid, &state, &started);
    if (rc == -ENOENT) return signallable; /* ours: reaped between the two looks; another's:
                                             * hidden from us (hidepid), not ours to judge */
    if (rc < 0) return false;
    if (state == 'Z' || state == 'X') return true;
    return start != 0 && started != start; /* the pid now names another process */
}

bool process_gone(int pid) { return process_gone_since(pid, 0); }

static int64_t timespec_ns(const struct timespec *t) {
    return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

bool process_started_after(int pid, const struct timespec *t) {
    uint64_t ticks = process_start_time(pid);
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec real, boot;
    if (!ticks || hz <= 0 || clock_gettime(CLOCK_REALTIME, &real) != 0 ||
        clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
        return false;
    /* the start is counted in ticks since boot (truncated: earlier); boot is read after real,
     * so the boot's wall-clock time comes out a little early too */
    int64_t started = timespec_ns(&real) - timespec_ns(&boot) +
                      (int64_t)(ticks / (uint64_t)hz) * 1000000000 +
                      (int64_t)(ticks % (uint64_t)hz) * 1000000000 / hz;
    return started > timespec_ns(t);
}

uint64_t process_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}
