/* host_name: a daemon's default --name (target-<host>, drafter-<host>-<pid>) and its host part;
 * dflash-ctl peer @target / @drafter names the daemons of its own host by them.
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

/* The default --name of a target on this host, "target-<host part>" (a pool name: at most
 * HOST_NAME_TARGET_MAX - 1 characters), into out[cap]. Stable across restarts on one host, so a
 * restart takes over its session and pool; unique per container. */
#define HOST_NAME_TARGET_MAX 32
void host_name_target(char *out, size_t cap);

/* The default --name of a drafter on this host without its pid, "drafter-<host part>-" (the
 * host part at most HOST_NAME_DRAFTER_MAX - 17 characters: a drafter's name is this and a pid of
 * up to 7 digits, at most HOST_NAME_DRAFTER_MAX - 1 characters), into out[cap]. */
#define HOST_NAME_DRAFTER_MAX 64
void host_name_drafter_prefix(char *out, size_t cap);

#endif
