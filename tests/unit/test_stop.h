/* test_stop: stops a tool while it writes its output, for the tests of what a stop leaves behind
 * (header-only). test_stop_while_writing starts argv[0] with argv (output to log), waits until a
 * file whose name holds pattern (e.g. ".tmp.": the tool is writing its output under a temporary
 * name) appears in watch, sends SIGTERM and reaps the tool. Returns its exit status, -1 when a
 * signal ended it, -2 when it exited before a temporary file appeared (the test then proves
 * nothing), -3 when it could not be started. The wait is for a condition, bounded only against a
 * hang. test_dir_has: whether a file name in watch holds pattern. */
#ifndef DFLASH_TEST_STOP_H
#define DFLASH_TEST_STOP_H

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline bool test_dir_has(const char *watch, const char *pattern) {
    DIR *d = opendir(watch);
    bool found = false;
    struct dirent *e;
    while (d && !found && (e = readdir(d)))
        found = strstr(e->d_name, pattern) != NULL;
    if (d) closedir(d);
    return found;
}

static inline int test_stop_while_writing(char *const argv[], const char *watch,
                                          const char *pattern, const char *log) {
    pid_t pid = fork();
    if (pid < 0) return -3;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    bool seen = false;
    const struct timespec tick = {0, 2000000};   /* 2 ms between looks */
    for (long i = 0; i < 300000 && !seen; i++) { /* 10 minutes at most: only against a hang */
        if (waitpid(pid, &st, WNOHANG) == pid) return -2;
        seen = test_dir_has(watch, pattern);
        if (!seen) nanosleep(&tick, NULL);
    }
    kill(pid, SIGTERM);
    if (waitpid(pid, &st, 0) != pid) return -3;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
