/* heartbeat: see heartbeat.h. One thread per daemon loop; the main thread's progress is a
 * monotime stamp in an atomic, read by the thread every 100 ms. Nothing the thread does before
 * the stall check waits for the main thread: client_poll only tries the client's mutex. */
#include "heartbeat.h"

#include "log.h"
#include "monotime.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct heartbeat {
    client *c;
    double stall_s;
    const char *what;
    atomic_bool run;
    atomic_bool quiet; /* heartbeat_quiet: no more client_poll */
    _Atomic double alive_at; /* monotime_s of the main loop's last heartbeat_alive */
    pthread_t thread;
};

/* Ends the process HEARTBEAT_LOG_GRACE_MS from now, whatever the watchdog's message does. */
static void *exit_after_grace(void *arg)
{
    (void)arg;
    monotime_sleep_ms(HEARTBEAT_LOG_GRACE_MS);
    _exit(HEARTBEAT_STALL_EXIT);
}

static void *heartbeat_main(void *arg)
{
    heartbeat *h = arg;
    while (atomic_load(&h->run)) {
        monotime_sleep_ms(100);
        if (!atomic_load(&h->quiet) && client_broker_incarnation(h->c)) client_poll(h->c);
        double quiet = monotime_s() - atomic_load(&h->alive_at);
        if (h->stall_s > 0 && quiet > h->stall_s) {
            pthread_t bound;
            if (pthread_create(&bound, NULL, exit_after_grace, NULL) != 0)
                _exit(HEARTBEAT_STALL_EXIT); /* the message could block for good: unsaid */
            LOG_ERROR("%s made no progress for %.1f s (--stall-exit-s %g): hung (a GPU call "
                      "that does not return, a deadlock?); exiting with status %d so that the "
                      "broker gives its work to others and a supervisor restarts it",
                      h->what, quiet, h->stall_s, HEARTBEAT_STALL_EXIT);
            _exit(HEARTBEAT_STALL_EXIT); /* the main thread cannot be trusted to unwind */
        }
    }
    return NULL;
}

heartbeat *heartbeat_start(client *c, double stall_s, const char *what)
{
    heartbeat *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->c = c;
    h->stall_s = stall_s;
    h->what = what;
    atomic_store(&h->run, true);
    atomic_store(&h->alive_at, monotime_s());
    if (pthread_create(&h->thread, NULL, heartbeat_main, h) != 0) {
        LOG_WARN("%s: cannot start the heartbeat thread: a long step may get it expired",
                 what);
        free(h);
        return NULL;
    }
    return h;
}

void heartbeat_alive(heartbeat *h)
{
    if (h) atomic_store(&h->alive_at, monotime_s());
}

void heartbeat_quiet(heartbeat *h)
{
    if (h) atomic_store(&h->quiet, true);
}

void heartbeat_stop(heartbeat **hp)
{
    if (!hp || !*hp) return;
    heartbeat *h = *hp;
    atomic_store(&h->run, false);
    pthread_join(h->thread, NULL);
    free(h);
    *hp = NULL;
}
