/* host_name: see host_name.h. */
#include "host_name.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char name_char(char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-')
        return c;
    return '-';
}

void host_name_part(const char *host, char *out, size_t cap)
{
    if (!out || cap < 10) return;
    size_t n = host ? strcspn(host, ".") : 0;
    if (n == 0) {
        snprintf(out, cap, "0");
        return;
    }
    uint32_t hash = 2166136261u; /* FNV-1a over the characters kept, as written */
    for (size_t i = 0; i < n; i++) {
        char c = name_char(host[i]);
        if (i < cap - 1) out[i] = c;
        hash = (hash ^ (uint8_t)c) * 16777619u;
    }
    if (n < cap) {
        out[n] = '\0';
        return;
    }
    snprintf(out + cap - 10, 10, "-%08x", hash);
}

void host_name_local(char *out, size_t cap)
{
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    host[sizeof host - 1] = '\0';
    host_name_part(host, out, cap);
}

void host_name_target(char *out, size_t cap)
{
    char host[HOST_NAME_TARGET_MAX - 7]; /* "target-" and this: HOST_NAME_TARGET_MAX - 1 */
    host_name_local(host, sizeof host);
    snprintf(out, cap < HOST_NAME_TARGET_MAX ? cap : HOST_NAME_TARGET_MAX, "target-%s", host);
}

void host_name_drafter_prefix(char *out, size_t cap)
{
    char host[HOST_NAME_DRAFTER_MAX - 16]; /* "drafter-", "-" and a pid of up to 7 digits */
    host_name_local(host, sizeof host);
    snprintf(out, cap, "drafter-%s-", host);
}
