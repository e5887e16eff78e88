/* test_ranks: the processes of a multi-process test (the ranks of a data-parallel group, a
 * reference beside them), forked and reaped one way (header-only; test_collective,
 * test_dp_train, tests/gpu/test_dp_nccl).
 * test_ranks_fork forks n children: child i clears the CHECK counters (check.h), arms an alarm
 * of alarm_s seconds against a hang, runs fn(i, arg) and exits with its failed checks (100 at
 * most). test_ranks_wait reaps them (the parent may close what the children share first, a
 * pipe, so that one child sees another's end) and returns how many failed: did not exit 0, or
 * for child `killed` (>= 0), did not end by SIGKILL; each is said on stderr as
 * "WHAT i: exit N" (or "signal N"). Threads: the test's main thread. */
#ifndef DFLASH_TEST_RANKS_H
#define DFLASH_TEST_RANKS_H

#include "check.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { TEST_RANKS_MAX = 16 };

typedef void (*test_rank_fn)(int i, void *arg);

/* Forks n (<= TEST_RANKS_MAX) children running fn(i, arg); their pids into pids[]. */
static __attribute__((unused)) void test_ranks_fork(int n, test_rank_fn fn, void *arg,
                                                    unsigned alarm_s, pid_t *pids) {
    if (n > TEST_RANKS_MAX) abort(); /* the test's own bug */
    fflush(NULL);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            check_passed = check_failed = 0;
            alarm(alarm_s);
            fn(i, arg);
            fflush(NULL);
            _exit(check_failed > 100 ? 100 : check_failed);
        }
    }
}

/* Reaps test_ranks_fork's n children: how many failed (see the top), each said after what. */
static __attribute__((unused)) int test_ranks_wait(int n, const pid_t *pids, int killed,
                                                   const char *what) {
    int failed = 0;
    for (int i = 0; i < n; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (i == killed ? !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL
                        : !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            failed++;
            fprintf(stderr, "%s %d: %s %d\n", what, i, WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
    }
    return failed;
}

#endif
