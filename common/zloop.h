/* zloop: drives one ZeroMQ socket from a libuv loop (DESIGN.md section 4, infra.md 3.3).
 *
 * ZMQ_FD is edge-triggered and readable does not mean a message is there; only ZMQ_EVENTS says.
 * So each watched socket gets three libuv handles:
 *   uv_poll on ZMQ_FD   (empty callback: it only wakes the loop),
 *   uv_prepare          (before the loop blocks: reads ZMQ_EVENTS; if POLLIN is pending it starts
 *                        the uv_idle so the loop polls without blocking, else stops it),
 *   uv_check            (after I/O: while ZMQ_EVENTS has POLLIN and the per-iteration budget
 *                        lasts, calls on_readable, which must receive exactly one message with
 *                        ZMQ_DONTWAIT).
 * ZMQ_EVENTS is re-read after every callback, and in every prepare, so a send made from any loop
 * callback (which can consume the fd's edge) never strands a pending message. The budget keeps
 * one busy socket from starving timers and the other sockets.
 *
 * Thread: the loop's thread only (ZeroMQ sockets are not thread-safe). Callers: broker.c,
 * broker_security.c.
 */
#ifndef DFLASH_ZLOOP_H
#define DFLASH_ZLOOP_H

#include <uv.h>

typedef struct zloop_sock zloop_sock;

/* Called with one message pending on zsock; receive it with ZMQ_DONTWAIT (EAGAIN is harmless). */
typedef void (*zloop_read_fn)(void *zsock, void *arg);

/* Starts watching zsock on loop; budget = most messages handled per loop iteration (>= 1).
 * Returns NULL when ZMQ_FD cannot be read or libuv refuses a handle. */
zloop_sock *zloop_sock_new(uv_loop_t *loop, void *zsock, int budget, zloop_read_fn fn, void *arg);

/* Stops the watch and closes the three handles (freed from their close callbacks, so the loop
 * must run once more). Accepts NULL and NULLs *zs. Close the ZeroMQ socket only after this. */
void zloop_sock_destroy(zloop_sock **zs);

#endif
