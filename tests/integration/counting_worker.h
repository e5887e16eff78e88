/* counting_worker: the drafter's worker loop run in a thread of the test process, with a
 * consumer that only counts its batches (its step is the count): for integration tests of the
 * loop against the real broker and target. The caller fills k->lc (and k->step_ms: how long each
 * batch takes, as a training step would; 0 = at once), then counting_worker_start; k->ended
 * turns 1 when the loop returned (its result in k->rc), k->finished counts its finish() calls
 * (where a drafter writes its final checkpoint); k->stop = 1 asks it to stop;
 * counting_worker_join waits for it to end and joins its thread.
 * Header-only, static functions. Users: itest_drain_ready, itest_unreadable,
 * itest_target_leave. */
#ifndef DFLASH_ITEST_COUNTING_WORKER_H
#define DFLASH_ITEST_COUNTING_WORKER_H

#include "monotime.h"
#include "worker_loop.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>

typedef struct counting_worker {
    worker_loop_config lc;
    worker_consumer cons;
    volatile sig_atomic_t stop;
    int step_ms; /* each batch takes this long (a slow drafter: the target's slots stay ready) */
    volatile int consumed;
    volatile int finished; /* times the loop called finish() (a drafter's final checkpoint) */
    int rc;
    volatile int ended;
} counting_worker;

static int counting_consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    counting_worker *k = ctx;
    (void)b;
    if (k->step_ms > 0) monotime_sleep_ms(k->step_ms);
    *step = (uint64_t)++k->consumed;
    return 0;
}

static int counting_finish(void *ctx)
{
    ((counting_worker *)ctx)->finished++;
    return 0;
}

static void *counting_run(void *arg)
{
    counting_worker *k = arg;
    k->rc = worker_loop_run(&k->lc, &k->cons, &k->stop, NULL);
    k->ended = 1;
    return NULL;
}

/* Starts k's loop in thread *th, its consumer named k->lc.name. 0 or pthread_create's error. */
static __attribute__((unused)) int counting_worker_start(counting_worker *k, pthread_t *th)
{
    k->cons = (worker_consumer){.name = k->lc.name, .ctx = k, .consume = counting_consume,
                                .finish = counting_finish};
    return pthread_create(th, NULL, counting_run, k);
}

/* Waits up to ms for k's loop to end by itself (polling every 20 ms), then asks it to stop and
 * joins thread th. Whether it had ended by itself (k->rc: its result). */
static __attribute__((unused)) bool counting_worker_join(counting_worker *k, pthread_t th, int ms)
{
    for (uint64_t end = monotime_ms() + (uint64_t)ms; !k->ended && monotime_ms() < end;)
        monotime_sleep_ms(20);
    bool ended = k->ended;
    k->stop = 1;
    pthread_join(th, NULL);
    return ended;
}

#endif
