/* test_host_name: the host part of the default --name (common/host_name.h). Short names are kept
 * as they were (up to the first dot, odd characters as -); names that do not fit keep their head
 * and end in a hash of the whole, so two hosts that share a long prefix (Kubernetes pods of one
 * deployment) get two names (defect: the target's name cut at 31 characters made them one, and
 * the broker refused the first target, exit 4). The hash is FNV-1a, checked against its
 * published test vectors. */
#include "check.h"
#include "host_name.h"

#include <stdio.h>
#include <string.h>

enum { CAP = 25 }; /* the target's: "target-" and 24 characters */

/* FNV-1a 32, written from its definition in 64-bit arithmetic */
static unsigned fnv1a(const char *s)
{
    unsigned long long h = 2166136261ull;
    for (; *s; s++) h = ((h ^ (unsigned char)*s) * 16777619ull) % 4294967296ull;
    return (unsigned)h;
}

static const char *part(const char *host, char *out)
{
    host_name_part(host, out, CAP);
    return out;
}

int main(void)
{
    char a[CAP], b[CAP];
    CHECK(strcmp(part("gpu-node-3", a), "gpu-node-3") == 0);
    CHECK(strcmp(part("gpu-node-3.cluster.example.com", a), "gpu-node-3") == 0);
    CHECK(strcmp(part("node_7#x", a), "node_7-x") == 0);
    CHECK(strcmp(part("", a), "0") == 0);
    CHECK(strcmp(part(".local", a), "0") == 0);
    CHECK(strcmp(part(NULL, a), "0") == 0);
    /* 24 characters fit as they are; 25 do not */
    CHECK(strcmp(part("abcdefghijklmnopqrstuvwx", a), "abcdefghijklmnopqrstuvwx") == 0);
    part("abcdefghijklmnopqrstuvwxy", a);
    CHECK_EQ_INT(strlen(a), CAP - 1);
    CHECK(strncmp(a, "abcdefghijklmno-", 16) == 0);
    /* two pods of one deployment: one head, two names, each within the field */
    part("dflash-target-5f7c9d8b4-x2k9q", a);
    part("dflash-target-5f7c9d8b4-p7m2z", b);
    printf("%s\n%s\n", a, b);
    CHECK_EQ_INT(strlen(a), CAP - 1);
    CHECK_EQ_INT(strlen(b), CAP - 1);
    CHECK(strcmp(a, b) != 0);
    CHECK(strncmp(a, "dflash-target-5-", 16) == 0);
    /* the same host, the same name (a restart takes over its session); the dot ends it there
     * too */
    part("dflash-target-5f7c9d8b4-x2k9q.svc", b);
    CHECK(strcmp(a, b) == 0);
    /* the tail is FNV-1a 32 of the whole part: the reference below, checked against the
     * published vectors, gives it for a 12-character host in the smallest field (10: no head) */
    CHECK_EQ_INT(fnv1a("a"), 0xe40c292cu);
    CHECK_EQ_INT(fnv1a("foobar"), 0xbf9cf968u);
    char small[10], want[10];
    host_name_part("node-1234567", small, sizeof small);
    snprintf(want, sizeof want, "-%08x", fnv1a("node-1234567"));
    CHECK(strcmp(small, want) == 0);
    host_name_local(a, CAP);
    CHECK(strlen(a) >= 1 && strlen(a) < CAP);
    CHECK(strchr(a, '.') == NULL);
    CHECK_DONE();
}
