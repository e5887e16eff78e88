/* broker_thread: a real broker (broker.h) on its libuv loop in a thread of the test process, for
 * tests that talk to it over its sockets while they hold its journal's sync hook
 * (test_broker_caps, test_broker_durable, itest_power_loss). broker_thread_config loads the
 * broker's defaults with its sockets and journal in a temp dir; start it with that queue_config
 * (changed as the test needs); stop it with broker_thread_stop, which stops the broker on its
 * own loop, joins the thread and frees all. The test's side of the wire is raw DEALER sockets:
 * broker_thread_dealer, broker_thread_send, broker_thread_recv (test_broker_caps,
 * test_broker_durable). Header-only (static functions), like the other test helpers; the
 * sockets' failures are CHECKs (check.h). Threads: all on the test's, but for the loop's. */
#ifndef DFLASH_TEST_BROKER_THREAD_H
#define DFLASH_TEST_BROKER_THREAD_H

#include "broker.h"
#include "check.h"
#include "config.h"
#include "wire.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <uv.h>
#include <zmq.h>

typedef struct broker_thread {
    uv_loop_t loop;
    uv_async_t stopper;
    broker *b;
    pthread_t th;
} broker_thread;

/* Fills cfg with the broker's defaults (a CHECK fails when they do not load), its endpoints
 * ipc://DIR/queue.sock and ipc://DIR/pub.sock, its journal DIR/queue.journal, no periodic
 * stats lines and log level level. */
static __attribute__((unused)) void broker_thread_config(queue_config *cfg, const char *dir,
                                                         const char *level)
{
    char *argv[] = {"test", NULL};
    CHECK_EQ_INT(config_load(broker_config_table(), cfg, 1, argv, NULL, 0, NULL), 0);
    snprintf(cfg->endpoint, sizeof cfg->endpoint, "ipc://%s/queue.sock", dir);
    snprintf(cfg->pub_endpoint, sizeof cfg->pub_endpoint, "ipc://%s/pub.sock", dir);
    snprintf(cfg->journal, sizeof cfg->journal, "%s/queue.journal", dir);
    cfg->stats_interval_ms = 0;
    snprintf(cfg->log_level, sizeof cfg->log_level, "%s", level);
}

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

/* A DEALER socket of zmq context ctx with routing id id, connected to ep, lingering 0; the
 * caller closes it. */
static __attribute__((unused)) void *broker_thread_dealer(void *ctx, const char *ep,
                                                          const char *id)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id));
    CHECK_EQ_INT(zmq_connect(s, ep), 0);
    return s;
}

/* Packs m and sends it on sock as one frame. */
static __attribute__((unused)) void broker_thread_send(void *sock, const wire_msg *m)
{
    static uint8_t buf[WIRE_MAX_MSG];
    int n = wire_pack(m, buf, sizeof buf);
    CHECK(n > 0);
    if (n > 0) CHECK_EQ_INT(zmq_send(sock, buf, (size_t)n, 0), n);
}

/* Receives one reply on sock within timeout_ms: 0 and *out, or -1 (nothing came, or it did not
 * unpack: a CHECK failed). */
static __attribute__((unused)) int broker_thread_recv(void *sock, int timeout_ms, wire_msg *out)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0) return -1;
    static uint8_t buf[WIRE_MAX_MSG];
    int n = zmq_recv(sock, buf, sizeof buf, 0);
    if (n <= 0) return -1;
    int rc = wire_unpack(buf, (size_t)n, out, NULL, 0);
    CHECK_EQ_INT(rc, 0);
    return rc ? -1 : 0;
}

#endif
