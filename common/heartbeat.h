/* heartbeat: the thread that keeps a daemon known to the broker while its main thread is busy
 * (a training step, a target forward, a checkpoint), and the watchdog beside it.
 *
 * Every 100 ms, once the broker knows the client (client_broker_incarnation), the thread calls
 * client_poll, which sends the heartbeats the broker expects (and skips its turn while the main
 * thread is in a call on the client: that call's request counts as one). So a peer is expired
 * only when its process is gone or frozen, never for one long step. The flip side: a main
 * thread hung for good (a GPU call that never returns, a deadlock) would keep its leases, slots
 * and in-flight batches for ever. The watchdog ends that: the main loop calls
 * heartbeat_alive every iteration; when it has not for stall_s seconds, the thread logs what
 * and for how long and ends the process with exit status HEARTBEAT_STALL_EXIT, so the broker
 * expires the peer (its leases redelivered, its batches retrained) and the supervisor
 * (docker-compose's restart: on-failure) starts it again. The watchdog never waits on the main
 * thread: client_poll does not wait for the client's mutex, so a main thread hung inside a broker
 * request (holding that mutex) is caught too. It acts within stall_s plus 100 ms, plus at most
 * one request timeout when the thread's own heartbeat is waiting for a silent broker, plus at
 * most HEARTBEAT_LOG_GRACE_MS when its message cannot be written.
 * Thread-safe: heartbeat_alive is one atomic store. */
#ifndef DFLASH_HEARTBEAT_H
#define DFLASH_HEARTBEAT_H

#include "client.h"

#define HEARTBEAT_STALL_EXIT 5
/* The watchdog's message may block (a stderr nobody reads, or the hung thread holding stderr's
 * lock mid-line): the process exits this long after the message began in any case. */
#define HEARTBEAT_LOG_GRACE_MS 2000

typedef struct heartbeat heartbeat;

/* Starts the thread for c (which must outlive it). stall_s: the watchdog's limit in seconds (0:
 * no watchdog); what: the loop's name for its message ("the drafter's loop"). NULL when the
 * thread cannot be started (logged; the daemon then runs without it, as before). */
heartbeat *heartbeat_start(client *c, double stall_s, const char *what);
/* The main loop made progress (call it every iteration). NULL is ignored. */
void heartbeat_alive(heartbeat *h);
/* From now on the thread sends no more heartbeats (the watchdog stays): a stopping daemon whose
 * broker is gone, so that no poll holds the client (or the join in heartbeat_stop) for a request
 * timeout. NULL is ignored. */
void heartbeat_quiet(heartbeat *h);
/* Stops and joins the thread; *h NULL afterwards. NULL or *h NULL is ignored. */
void heartbeat_stop(heartbeat **h);

#endif
