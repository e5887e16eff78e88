/* zloop: see zloop.h. One heap block per watched socket holding the three handles; it is freed
 * when the last of the three close callbacks has run (closing counts them down). */
#include "zloop.h"

#include <stdlib.h>
#include <zmq.h>

struct zloop_sock {
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_check_t check;
    uv_idle_t idle;
    void *zsock;
    int budget;
    int closing; /* handles still to close */
    zloop_read_fn fn;
    void *arg;
};

static int pending_in(void *zsock)
{
    int ev = 0;
    size_t len = sizeof ev;
    if (zmq_getsockopt(zsock, ZMQ_EVENTS, &ev, &len) != 0) return 0;
    return ev & ZMQ_POLLIN;
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    (void)h, (void)status, (void)events; /* waking the loop is all it is for */
}

static void on_idle(uv_idle_t *h) { (void)h; }

static void on_prepare(uv_prepare_t *h)
{
    zloop_sock *z = h->data;
    if (pending_in(z->zsock)) uv_idle_start(&z->idle, on_idle);
    else uv_idle_stop(&z->idle);
}

static void on_check(uv_check_t *h)
{
    zloop_sock *z = h->data;
    for (int i = 0; i < z->budget && !z->closing && pending_in(z->zsock); i++)
        z->fn(z->zsock, z->arg);
}

zloop_sock *zloop_sock_new(uv_loop_t *loop, void *zsock, int budget, zloop_read_fn fn, void *arg)
{
    int fd = -1;
    size_t len = sizeof fd;
    if (!loop || !zsock || !fn || zmq_getsockopt(zsock, ZMQ_FD, &fd, &len) != 0) return NULL;
    zloop_sock *z = calloc(1, sizeof *z);
    if (!z) return NULL;
    z->zsock = zsock;
    z->budget = budget > 0 ? budget : 1;
    z->fn = fn;
    z->arg = arg;
    if (uv_poll_init(loop, &z->poll, fd)) {
        free(z);
        return NULL;
    }
    uv_prepare_init(loop, &z->prepare);
    uv_check_init(loop, &z->check);
    uv_idle_init(loop, &z->idle);
    z->poll.data = z->prepare.data = z->check.data = z->idle.data = z;
    uv_poll_start(&z->poll, UV_READABLE, on_poll);
    uv_prepare_start(&z->prepare, on_prepare);
    uv_check_start(&z->check, on_check);
    return z;
}

static void on_closed(uv_handle_t *h)
{
    zloop_sock *z = h->data;
    if (--z->closing == 0) free(z);
}

void zloop_sock_destroy(zloop_sock **zs)
{
    if (!zs || !*zs) return;
    zloop_sock *z = *zs;
    *zs = NULL;
    z->closing = 4;
    uv_poll_stop(&z->poll);
    uv_close((uv_handle_t *)&z->poll, on_closed);
    uv_close((uv_handle_t *)&z->prepare, on_closed);
    uv_close((uv_handle_t *)&z->check, on_closed);
    uv_close((uv_handle_t *)&z->idle, on_closed);
}
