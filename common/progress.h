/* progress: the one-line report of long work on stderr for the tools' cpu loops (dflash-gen's
 * generation, dflash-data's input, dflash-drafter eval's held-out sequences). On a terminal the
 * line is rewritten in place ('\r') every 0.2 s; otherwise a plain line every 10 s, like the
 * drafter's training line (metrics.h), so that logs stay short. The caller asks progress_due
 * in its loop and formats the line only then.
 * A progress value belongs to one thread; no globals. */
#ifndef DFLASH_PROGRESS_H
#define DFLASH_PROGRESS_H

#include <stdbool.h>
#include <stdio.h>

typedef struct progress {
    FILE *out;
    double t0, last, interval; /* monotime_s() seconds; interval < 0: no line */
    bool tty, open;            /* open: a '\r' line still waits for its newline */
} progress;

/* Starts the clock; the first line is due one interval later. out NULL: stderr. */
void progress_start(progress *p, FILE *out);
/* progress_start with another interval than 10 s when out is not a terminal (eval's
 * --progress-ms); seconds <= 0: no line is ever due, on a terminal neither. */
void progress_start_every(progress *p, FILE *out, double seconds);
/* True when a line is due: an interval has passed since the last one (or the start). */
bool progress_due(const progress *p);
/* Seconds since progress_start. */
double progress_elapsed(const progress *p);
/* Prints one line now (printf format, without a newline) and restarts the interval. */
void progress_printf(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends a line left open on a terminal with its newline; call it before other output to the
 * same stream and at the end. Nothing to free. */
void progress_end(progress *p);

#endif
