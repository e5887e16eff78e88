/* collective_wait: see collective_wait.h. */
#include "collective_wait.h"

#include "monotime.h"

#include <stdarg.h>
#include <stdio.h>

void dp_wait_begin(dp_waiter *wt, const dp_comm_watch *watch, const char *what, int peer,
                   int peer_pid, double start, double timeout_s) {
    wt->watch = watch && watch->fn ? watch : NULL;
    wt->w =
        (dp_comm_wait){.what = what, .peer = peer, .peer_pid = peer_pid, .timeout_s = timeout_s};
    wt->start = start;
    wt->next_call = start + DP_COMM_WATCH_S;
}

bool dp_wait_over(dp_waiter *wt, double now, char *why, size_t len) {
    if (!wt->watch || now < wt->next_call) return false;
    wt->w.waited_s = now - wt->start;
    why[0] = '\0';
    bool over = wt->watch->fn(wt->watch->ctx, &wt->w, why, len);
    /* counted from the call's end: a slow watch (a broker that does not answer) is not called
     * back to back */
    wt->next_call = monotime_s() + DP_COMM_WATCH_S;
    if (over && !why[0]) snprintf(why, len, "the caller's watch ended the wait");
    return over;
}

void dp_why_set(char *why, const char *fmt, ...) {
    if (why[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, DP_WHY_BYTES, fmt, ap);
    va_end(ap);
}
