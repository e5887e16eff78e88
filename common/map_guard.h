/* map_guard: a named death instead of "Bus error" when a file this process maps read-only (a
 * data shard, a model or checkpoint's safetensors) shrinks or its storage fails while mapped.
 * Reading such a page raises SIGBUS; the handler, installed at the first registration, looks the
 * faulting address up among the registered mappings and, when it is one of them, writes one line
 * naming the file, the offset and what to do to stderr and exits 1 (the daemons' "data or model
 * unreadable"). A SIGBUS elsewhere (or sent by kill) goes to the action that was there before
 * (the default, or another library's handler): the handler steps aside and raises it again. A file replaced by a rename while mapped is not at fault: the
 * mapping keeps the old inode. Thread-safe; the table holds MAP_GUARD_MAX mappings (beyond, a
 * mapping is not named: the default death; said once in the log).
 */
#ifndef DFLASH_MAP_GUARD_H
#define DFLASH_MAP_GUARD_H

#include <stddef.h>

#define MAP_GUARD_MAX 64

/* Registers [base, base + size) as a mapping of file path (copied, truncated to 255 bytes). */
void map_guard_add(const void *base, size_t size, const char *path);

/* Forgets the mapping registered at base (call before munmap). No-op when none is. */
void map_guard_remove(const void *base);

/* Exit status after a registered mapping's SIGBUS (EXIT_FAILURE). */
#define MAP_GUARD_EXIT 1

#endif
