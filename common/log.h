/* log: leveled logging to stderr with a timestamp, the program name and file:line.
 *
 * One process-wide level and program tag, set once at start-up (log_init) before threads start;
 * log_write itself is thread-safe (one fprintf per line). FATAL logs and exits with status 1,
 * which is what "an environment that cannot work" gets (CONVENTIONS.md): compose restarts us.
 */
#ifndef DFLASH_LOG_H
#define DFLASH_LOG_H

#include <stdbool.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_FATAL } log_level;

/* Makes text s printable in place, as every log line is: control characters (C0, DEL, and C1
 * as UTF-8) and bytes that are not part of well-formed UTF-8 become '?'. Text that came from a
 * peer (a name, a message) then can neither forge or hide lines nor send a terminal escape,
 * and is valid in JSON. */
void log_printable(char *s);

/* Sets the program tag printed on every line and the minimum level. Not thread-safe. */
void log_init(const char *program, log_level level);
/* Parses "debug", "info", "warn", "error". Returns 0 or DFLASH_EINVAL. */
int log_level_parse(const char *s, log_level *out);
/* log_init with the level a --log-level option names (log_level_parse's names); program NULL
 * keeps the tag. A bad name prints "TAG: bad --log-level 'NAME'" to stderr (TAG: program, else
 * the current tag) and changes nothing. Returns 0 or DFLASH_EINVAL. */
int log_init_named(const char *program, const char *level_name);
void log_set_level(log_level level);
bool log_enabled(log_level level);

void log_write(log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
_Noreturn void log_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_DEBUG(...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_DEBUG)) log_write(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__);         \
    } while (0)
#define LOG_INFO(...) log_write(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...) log_write(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_ERROR(...) log_write(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
/* Logs "fatal: ..." with file:line and exits(1). Use for environments that cannot work. */
#define LOG_FATAL(...) log_fatal(__FILE__, __LINE__, __VA_ARGS__)

#endif
