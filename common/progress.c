/* progress: see progress.h. */
#include "progress.h"
#include "monotime.h"

#include <stdarg.h>
#include <unistd.h>

void progress_start(progress *p, FILE *out)
{
    progress_start_every(p, out, 10.0);
}

void progress_start_every(progress *p, FILE *out, double seconds)
{
    p->out = out ? out : stderr;
    p->tty = isatty(fileno(p->out));
    p->interval = seconds <= 0 ? -1 : p->tty ? 0.2 : seconds;
    p->t0 = p->last = monotime_s();
    p->open = false;
}

bool progress_due(const progress *p)
{
    return p->interval > 0 && monotime_s() - p->last >= p->interval;
}

double progress_elapsed(const progress *p)
{
    return monotime_s() - p->t0;
}

void progress_printf(progress *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (p->tty) fputc('\r', p->out);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fputs(p->tty ? "\033[K" : "\n", p->out);
    fflush(p->out);
    p->open = p->tty;
    p->last = monotime_s();
}

void progress_end(progress *p)
{
    if (!p->open) return;
    fputc('\n', p->out);
    fflush(p->out);
    p->open = false;
}
