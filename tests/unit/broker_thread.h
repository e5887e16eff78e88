/* broker_thread: a real broker (broker.h) on its libuv loop in a thread of the test process, for
 * tests that talk to it over its sockets while they hold its journal's sync hook
 * (test_broker_durable, itest_power_loss). Start it with a loaded queue_config; stop it with
 * broker_thread_stop, which stops the broker on its own loop, joins the thread and frees all.
 * Header-only (static functions), like the other test helpers. */
#ifndef DFLASH_TEST_BROKER_THREAD_H
#define DFLASH_TEST_BROKER_THREAD_H

#include "broker.h"

#include <pthread.h>
#include <stdbool.h>
#include <uv.h>

typedef struct broker_thread {
    uv_loop_t loop;
    uv_async_t stopper;
    broker *b;
    pthread_t th;
} broker_thread;

static void broker_thread_on_stop(uv_async_t *h)
{
    broker_stop(((broker_thread *)h->data)->b);
    uv_close((uv_handle_t *)h, NULL);
}

static void *broker_thread_main(void *arg)
{
    uv_run(&((broker_thread *)arg)->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Creates the broker for cfg with the journal sync hook (fn may be NULL) and runs its loop on
 * a new thread. false (nothing left running) when broker_new failed; *err its code. */
static __attribute__((unused)) bool broker_thread_start(broker_thread *t, const queue_config *cfg,
                                                        journal_sync_fn fn, void *fn_ctx,
                                                        int *err)
{
    uv_loop_init(&t->loop);
    t->b = broker_new(&t->loop, cfg, err);
    if (!t->b) {
        uv_loop_close(&t->loop);
        return false;
    }
    if (fn) broker_set_sync_hook(t->b, fn, fn_ctx);
    uv_async_init(&t->loop, &t->stopper, broker_thread_on_stop);
    t->stopper.data = t;
    pthread_create(&t->th, NULL, broker_thread_main, t);
    return true;
}

static __attribute__((unused)) void broker_thread_stop(broker_thread *t)
{
    uv_async_send(&t->stopper);
    pthread_join(t->th, NULL);
    broker_destroy(&t->b);
    uv_run(&t->loop, UV_RUN_DEFAULT);
    uv_loop_close(&t->loop);
}

#endif
