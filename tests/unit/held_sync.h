/* held_sync: a journal sync hook (journal.h's sync function, given to broker_thread_start) that
 * the test holds: each sync waits until the test releases the syncs, so a test can see what the
 * broker answers while its journal's writer is stuck in an fdatasync, and then let it finish or
 * fail. Header-only, one instance per test program (static state).
 * Threads: held_sync runs on the journal's writer thread; the rest on the test's. */
#ifndef DFLASH_TEST_HELD_SYNC_H
#define DFLASH_TEST_HELD_SYNC_H

#include "err.h"

#include <pthread.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t held_sync_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_sync_cv = PTHREAD_COND_INITIALIZER;
static int held_sync_begun;     /* syncs begun */
static bool held_sync_released; /* held syncs may finish */
static bool held_sync_fail;     /* released syncs report failure */

/* The hook: counts the sync, waits for a release, then fdatasyncs (or fails, DFLASH_EIO). */
static __attribute__((unused)) int held_sync(void *ctx, int fd)
{
    (void)ctx;
    pthread_mutex_lock(&held_sync_mu);
    held_sync_begun++;
    pthread_cond_broadcast(&held_sync_cv);
    while (!held_sync_released) pthread_cond_wait(&held_sync_cv, &held_sync_mu);
    bool fail = held_sync_fail;
    pthread_mutex_unlock(&held_sync_mu);
    if (fail) return DFLASH_EIO;
    return fdatasync(fd) == 0 ? 0 : DFLASH_EIO;
}

/* Syncs begun so far. */
static __attribute__((unused)) int held_sync_entered(void)
{
    pthread_mutex_lock(&held_sync_mu);
    int n = held_sync_begun;
    pthread_mutex_unlock(&held_sync_mu);
    return n;
}

/* Waits until at least n syncs have begun; false after 10 s. */
static __attribute__((unused)) bool held_sync_wait_entered(int n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&held_sync_mu);
    int rc = 0;
    while (held_sync_begun < n && rc == 0)
        rc = pthread_cond_timedwait(&held_sync_cv, &held_sync_mu, &until);
    bool ok = held_sync_begun >= n;
    pthread_mutex_unlock(&held_sync_mu);
    return ok;
}

/* Syncs from now on wait for the next held_sync_release. */
static __attribute__((unused)) void held_sync_hold(void)
{
    pthread_mutex_lock(&held_sync_mu);
    held_sync_released = false;
    pthread_mutex_unlock(&held_sync_mu);
}

/* Lets the waiting syncs and later ones finish; fail: they report failure. */
static __attribute__((unused)) void held_sync_release(bool fail)
{
    pthread_mutex_lock(&held_sync_mu);
    held_sync_released = true;
    held_sync_fail = fail;
    pthread_cond_broadcast(&held_sync_cv);
    pthread_mutex_unlock(&held_sync_mu);
}

#endif
