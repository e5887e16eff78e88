/* monotime: the monotonic clock for rates, deadlines and progress lines, and a plain sleep.
 * Thread-safe. (Wall-clock time for logs and metrics stays with its users.) */
#ifndef DFLASH_MONOTIME_H
#define DFLASH_MONOTIME_H

#include <stdint.h>

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
double monotime_s(void);
/* Milliseconds since the same point. */
uint64_t monotime_ms(void);
/* Sleeps ms milliseconds (fractions allowed); returns early on a signal. */
void monotime_sleep_ms(double ms);

#endif
