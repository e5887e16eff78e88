/* collective_wait: what every wait on peers of both collective backends (collective.c's shm,
 * collective_nccl.c) does besides polling its own condition: after DP_COMM_WATCH_S it calls the
 * caller's watch (collective.h, dp_comm_open_watched) about every DP_COMM_WATCH_S seconds, and
 * it records why the group broke (the first reason wins) for dp_comm_error.
 * Internal to the collective; no state of its own. Thread: the waiting thread.
 */
#ifndef DFLASH_NN_COLLECTIVE_WAIT_H
#define DFLASH_NN_COLLECTIVE_WAIT_H

#include "collective.h"

#include <stdbool.h>
#include <stddef.h>

/* The size of a handle's reason buffer (dp_comm_error). */
#define DP_WHY_BYTES 320

/* One wait in progress. */
typedef struct dp_waiter {
    const dp_comm_watch *watch; /* NULL or fn NULL: no watch */
    dp_comm_wait w;
    double start, next_call; /* monotime_s */
} dp_waiter;

/* Starts a wait that began at start (monotime_s; a barrier's waits share their start) on peer
 * (-1: unknown; pid 0: unknown) for `what`, breaking the group after timeout_s. */
void dp_wait_begin(dp_waiter *wt, const dp_comm_watch *watch, const char *what, int peer,
                   int peer_pid, double start, double timeout_s);

/* Call on every poll with the current monotime_s: true when the watch ended the wait, its reason
 * in why (len bytes). Costs a comparison between the watch's calls. */
bool dp_wait_over(dp_waiter *wt, double now, char *why, size_t len);

/* Records why the group broke into why (DP_WHY_BYTES) unless a reason is there already. */
void dp_why_set(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
