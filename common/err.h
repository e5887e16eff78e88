/* err: the project's one table of error codes.
 *
 * Every action in the project returns int: 0 on success or a negative code from this table.
 * The X-macro below is the only place codes are defined; err_str() and err_name() come from it.
 * Codes are stable numbers (they travel in ERROR messages on the wire), so append, never renumber.
 * Thread-safe: pure functions over static data.
 */
#ifndef DFLASH_ERR_H
#define DFLASH_ERR_H

#include <stddef.h>

/* X(name, number, message) */
#define DFLASH_ERRORS(X)                                                                           \
    X(OK, 0, "success")                                                                            \
    X(INVAL, 1, "invalid argument")                                                                \
    X(NOMEM, 2, "out of memory")                                                                   \
    X(IO, 3, "input/output error")                                                                 \
    X(FORMAT, 4, "malformed or corrupt file")                                                      \
    X(PROTO, 5, "malformed protocol message")                                                      \
    X(VERSION, 6, "unsupported version")                                                           \
    X(RANGE, 7, "value out of range")                                                              \
    X(STATE, 8, "operation not allowed in the current state")                                      \
    X(NOTFOUND, 9, "not found")                                                                    \
    X(EXISTS, 10, "already exists")                                                                \
    X(TIMEOUT, 11, "timed out")                                                                    \
    X(AGAIN, 12, "try again later")                                                                \
    X(PEER, 13, "peer unreachable or gone")                                                        \
    X(STALE, 14, "stale incarnation or lease")                                                     \
    X(MISMATCH, 15, "shapes or settings do not fit each other")                                    \
    X(CUDA, 16, "CUDA error")                                                                      \
    X(ZMQ, 17, "ZeroMQ error")                                                                     \
    X(CONFIG, 18, "bad configuration")                                                             \
    X(DENIED, 19, "permission denied")                                                             \
    X(FULL, 20, "capacity reached")                                                                \
    X(UNSUPPORTED, 21, "not supported")                                                            \
    X(INTERNAL, 22, "internal error")                                                              \
    X(CORRUPT, 23, "data failed verification")                                                     \
    X(QUARANTINED, 24, "batch quarantined after too many redeliveries")                           \
    X(SHUTDOWN, 25, "shutting down")                                                               \
    X(NONFINITE, 26, "non-finite value (NaN or infinity)")                                         \
    X(NODATA, 27, "nothing to train on")

enum {
#define DFLASH_ERR_ENUM(name, num, msg) DFLASH_E##name = -(num),
    DFLASH_ERRORS(DFLASH_ERR_ENUM)
#undef DFLASH_ERR_ENUM
};

/* Writes a printf-style message into a caller's error buffer (err, len); does nothing when
 * err is NULL or len is 0. The one helper behind every `char *err, size_t errlen` API. */
void err_fmt(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Human message for a code (0 or negative). Unknown codes give "unknown error". */
const char *err_str(int code);
/* Symbolic name without prefix, e.g. "INVAL". Unknown codes give "UNKNOWN". */
const char *err_name(int code);

#endif
