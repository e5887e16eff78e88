/* log: see log.h. Lines look like
 *   2026-11-29T09:30:00.123Z dflash-queue INFO  broker.c:120 listening on ipc://...
 */
#include "log.h"
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *g_program = "dflash";
static log_level g_level = LOG_INFO;

static const char *const level_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR", "FATAL"};

void log_init(const char *program, log_level level)
{
    if (program) g_program = program;
    g_level = level;
}

int log_init_named(const char *program, const char *level_name)
{
    log_level lvl;
    if (log_level_parse(level_name, &lvl) != 0) {
        fprintf(stderr, "%s: bad --log-level '%s'\n", program ? program : g_program, level_name);
        return DFLASH_EINVAL;
    }
    log_init(program, lvl);
    return 0;
}

void log_set_level(log_level level)
{
    g_level = level;
}

bool log_enabled(log_level level)
{
    return level >= g_level;
}

int log_level_parse(const char *s, log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (log_level)i;
            return 0;
        }
    }
    return DFLASH_EINVAL;
}

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static void vlog(log_level level, const char *file, int line, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* a line is one record: control characters (a peer's name with a newline or a terminal
     * escape, relayed into a message) are shown as '?' and cannot forge or hide lines */
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    /* One fprintf per line keeps lines whole across threads. */
    fprintf(stderr, "%s.%03ldZ %s %s %s:%d %s\n", when, ts.tv_nsec / 1000000L, g_program,
            level_names[level], basename_of(file), line, msg);
}

void log_write(log_level level, const char *file, int line, const char *fmt, ...)
{
    if (!log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, file, line, fmt, ap);
    va_end(ap);
}

void log_fatal(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(LOG_FATAL, file, line, fmt, ap);
    va_end(ap);
    fflush(stderr);
    exit(1);
}
