/* test_process: process.h's judgement of other processes by pid and start time.
 *   - the start time is read after the last ')' of the command name: a child that renamed
 *     itself to "x) 9 9 (y" still reads as the start time it had before;
 *   - a live child is not gone, by pid or by pid and start time; a forged start time (what a
 *     dead process's pid taken by a new one looks like) is gone; a zombie is gone before it is
 *     reaped, and a reaped child is gone with no start time left;
 *   - a process started after a time t (t taken 50 ms before its fork) is said to start after
 *     it; one started before t (t taken after it) is not, nor is this process, a reaped child,
 *     or pid <= 0;
 *   - pid <= 0 is never judged gone, and has no start time. */
#include "check.h"
#include "process.h"

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child that reads its own start time, renames itself (prctl) to name, sends the start time
 * on the pipe, and waits to be killed; *start_before: what it read before the rename. */
static pid_t start_child(const char *name, uint64_t *start_before)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        uint64_t s = process_start_time((int)getpid());
        if (name) prctl(PR_SET_NAME, name, 0, 0, 0);
        if (write(fds[1], &s, sizeof s) != (ssize_t)sizeof s) _exit(1);
        for (;;) pause();
    }
    close(fds[1]);
    if (pid < 0 || read(fds[0], start_before, sizeof *start_before) != sizeof *start_before)
        pid = -1;
    close(fds[0]);
    return pid;
}

/* Waits (up to ~5 s) until pid is a zombie: /proc/PID/stat's state after the name is Z. */
static void wait_zombie(pid_t pid)
{
    for (int i = 0; i < 500; i++) {
        char path[64], buf[512] = "";
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
            fclose(f);
        }
        const char *p = strrchr(buf, ')');
        if (p && p[1] == ' ' && p[2] == 'Z') return;
        usleep(10000);
    }
}

int main(void)
{
    uint64_t self = process_start_time((int)getpid());
    CHECK(self > 0);
    CHECK(!process_gone((int)getpid()));
    CHECK(!process_gone_since((int)getpid(), self));
    CHECK(process_gone_since((int)getpid(), self + 1)); /* another process had our pid */
    CHECK(!process_gone_since((int)getpid(), 0));       /* not recorded: the pid alone */

    struct timespec before_child, after_child, far_past = {.tv_sec = 1};
    clock_gettime(CLOCK_REALTIME, &before_child);
    usleep(50000); /* the start is read in clock ticks (10 ms), rounded earlier */
    uint64_t before;
    pid_t child = start_child(NULL, &before);
    clock_gettime(CLOCK_REALTIME, &after_child);
    CHECK(process_started_after((int)child, &before_child));
    CHECK(process_started_after((int)child, &far_past));
    CHECK(!process_started_after((int)child, &after_child));
    CHECK(!process_started_after((int)getpid(), &before_child));
    CHECK(child > 0);
    uint64_t started = process_start_time((int)child);
    CHECK(started > 0);
    CHECK(started == before);
    CHECK(started >= self);
    /* a name holding ") " and digits does not move the fields read after it */
    pid_t renamed = start_child("x) 9 9 (y", &before);
    CHECK(renamed > 0);
    char path[64], buf[512] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)renamed);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        CHECK(fgets(buf, sizeof buf, f) != NULL);
        fclose(f);
    }
    CHECK(strncmp(buf, "x) 9 9 (y", 9) == 0); /* the rename took */
    uint64_t renamed_start = process_start_time((int)renamed);
    CHECK(renamed_start > 0);
    CHECK(renamed_start == before);
    CHECK(!process_gone_since((int)renamed, renamed_start));

    CHECK(!process_gone((int)child));
    CHECK(!process_gone_since((int)child, started));
    CHECK(process_gone_since((int)child, started + 1));
    kill(child, SIGKILL);
    wait_zombie(child);
    CHECK(process_gone((int)child)); /* a zombie has ended, though kill(pid, 0) succeeds */
    CHECK(process_gone_since((int)child, started));
    CHECK(waitpid(child, NULL, 0) == child);
    CHECK(process_gone((int)child));
    CHECK(process_gone_since((int)child, started));
    CHECK(process_start_time((int)child) == 0);
    CHECK(!process_started_after((int)child, &far_past)); /* no such process: unknown */

    kill(renamed, SIGKILL);
    CHECK(waitpid(renamed, NULL, 0) == renamed);
    CHECK(process_gone_since((int)renamed, renamed_start));

    CHECK(!process_gone(0));
    CHECK(!process_gone(-1));
    CHECK(!process_gone_since(0, 5));
    CHECK(process_start_time(0) == 0);
    CHECK(process_start_time(-3) == 0);
    CHECK(!process_started_after(0, &far_past));
    CHECK_DONE();
}
