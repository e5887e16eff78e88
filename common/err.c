/* err: messages and names for the error table in err.h, and the error-buffer formatter. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

void err_fmt(char *err, size_t len, const char *fmt, ...)
{
    if (!err || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

const char *err_str(int code)
{
    switch (code) {
#define DFLASH_ERR_STR(name, num, msg)                                                             \
    case -(num):                                                                                   \
        return msg;
        DFLASH_ERRORS(DFLASH_ERR_STR)
#undef DFLASH_ERR_STR
    }
    return "unknown error";
}

const char *err_name(int code)
{
    switch (code) {
#define DFLASH_ERR_NAME(name, num, msg)                                                            \
    case -(num):                                                                                   \
        return #name;
        DFLASH_ERRORS(DFLASH_ERR_NAME)
#undef DFLASH_ERR_NAME
    }
    return "UNKNOWN";
}
