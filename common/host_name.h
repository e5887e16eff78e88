/* host_name: the host part of a daemon's default --name (target-<host>, drafter-<host>-<pid>).
 * A name field is short (a target's names its slot pool: 31 characters), and host names are
 * often longer and share a long prefix (Kubernetes pods: <deployment>-<hash>-<suffix>, numbered
 * cluster nodes), so cutting the end off made two hosts one name: the broker took the second
 * target for a restart of the first and refused the first (exit 4). A host part that does not
 * fit keeps its head and ends in 8 hex digits of a hash of the whole host name instead.
 * Thread-safe: no state. */
#ifndef DFLASH_HOST_NAME_H
#define DFLASH_HOST_NAME_H

#include <stddef.h>

/* Writes into out[cap] (cap >= 10) the host part for `host`: up to its first dot, each
 * character other than a letter, digit, - or _ as -, "0" when empty; at most cap - 1
 * characters: when longer, its first cap - 10 characters, '-' and the 8 hex digits of a
 * 32-bit FNV-1a hash of that whole part. */
void host_name_part(const char *host, char *out, size_t cap);

/* host_name_part of this machine's gethostname(). */
void host_name_local(char *out, size_t cap);

#endif
