/* process: questions about other processes of this machine, by pid and start time (Linux:
 * kill(2) and /proc).
 * Used where a peer's death must be seen without its help: the shm collective's waits on its
 * peers (common/nn/collective.c) and the sweep of stale pool segments (pool.c).
 * Thread-safe: no state. */
#ifndef DFLASH_PROCESS_H
#define DFLASH_PROCESS_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* True when process pid has ended: it no longer exists (kill(pid, 0) says ESRCH) or it is a
 * zombie waiting for its parent to reap it (/proc/PID/stat state Z or X). False when it runs,
 * when it belongs to another user and /proc does not show it (alive, not ours to judge), or
 * when pid <= 0. A pid is reused only after the zombie is reaped, so a true answer is final; a
 * false one may be a new process that took a dead one's pid: process_gone_since tells them
 * apart where the start time was recorded. */
bool process_gone(int pid);

/* The start time of process pid (/proc/PID/stat field 22: clock ticks after boot), 0 when it
 * cannot be read (no such process, hidden from us, no /proc). A pid is reused; the pair of pid
 * and start time names one process for good. */
uint64_t process_start_time(int pid);

/* process_gone, and also true when pid now names a process other than the one started at start
 * (a dead process's pid taken by a new one). start 0 (not recorded): as process_gone. */
bool process_gone_since(int pid, uint64_t start);

/* True when process pid exists and started after t (CLOCK_REALTIME, e.g. a file's st_ctim): then
 * it cannot be whoever made that file before t. The start is read to within a clock tick and
 * always rounded earlier, so a process that started before t is never said to start after it
 * (short of the wall clock being set forward in between). False when unknown. */
bool process_started_after(int pid, const struct timespec *t);

/* An id of this process's pid namespace (the inode of /proc/self/ns/pid), 0 when unknown. Two
 * processes compare pids only when both ids are equal and not 0: in another namespace (another
 * container sharing /dev/shm) the same number names another process. */
uint64_t process_pidns(void);

#endif
