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

/* The length of the well-formed UTF-8 sequence at p (1 to 4), 0 when p starts none (a stray
 * continuation byte, an overlong form, a surrogate, past U+10FFFF, a sequence cut short). */
static size_t utf8_sequence(const unsigned char *p)
{
    if (p[0] < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        n = 2;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        n = 3;
        if (p[0] == 0xe0) lo = 0xa0; /* overlong */
        if (p[0] == 0xed) hi = 0x9f; /* surrogates */
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        n = 4;
        if (p[0] == 0xf0) lo = 0x90; /* overlong */
        if (p[0] == 0xf4) hi = 0x8f; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (p[1] < lo || p[1] > hi) return 0; /* a NUL ends the check here */
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return n;
}

void log_printable(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t n = utf8_sequence(p);
        bool control = n == 1 ? *p < 0x20 || *p == 0x7f : n == 2 && p[0] == 0xc2 && p[1] < 0xa0;
        if (n == 0 || control)
            for (size_t i = 0; i < (n ? n : 1); i++) p[i] = '?';
        p += n ? n : 1;
    }
}

static void vlog(log_level level, const char *file, int line, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* a line is one record: control characters (a peer's name with a newline or a terminal
     * escape, relayed into a message) are shown as '?' and cannot forge or hide lines */
    log_printable(msg);
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
