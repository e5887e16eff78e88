/* record_file: an append-only file of whole records (a JSON line, a TFRecord frame) that a
 * failing disk never leaves with a record cut in two.
 *
 * Records are added to a buffer in memory and written with write(2) when it passes 64 KiB or on
 * record_file_flush. A write that fails part way (ENOSPC, EIO) cuts the file back to the end of
 * its last whole record and keeps the unwritten records, to be written by a later flush once
 * the disk takes them again; the file therefore only ever ends at a record's end (a process
 * killed inside a write(2) is the one exception: its reader trims that tail, as metrics.c does).
 * At most RECORD_FILE_PENDING_MAX bytes wait: a record past that is dropped and counted. The
 * first failure and the recovery are logged once each, naming the file.
 *
 * Owned by one thread; not thread-safe. Used by metrics.c (metrics.jsonl and the event file).
 */
#ifndef DFLASH_RECORD_FILE_H
#define DFLASH_RECORD_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RECORD_FILE_PENDING_MAX (16u << 20)

typedef struct record_file record_file;

/* Opens path for appending (created 0644 when missing); create_new: it must not exist (EEXIST).
 * NULL with errno set. */
record_file *record_file_open(const char *path, bool create_new);

/* Adds one record, the concatenation of parts[0..n_parts) of lens[i] bytes. 0; DFLASH_EIO
 * when a write this caused failed (the record is kept); DFLASH_EFULL when too much waits
 * already (the record is dropped and counted); DFLASH_ENOMEM. */
int record_file_add(record_file *f, const void *const *parts, const size_t *lens, int n_parts);

/* Writes every waiting record. 0, or DFLASH_EIO (they keep waiting; the file ends at its last
 * whole record). */
int record_file_flush(record_file *f);

/* record_file_flush, then fsync. 0 or DFLASH_EIO. */
int record_file_sync(record_file *f);

/* Bytes waiting for the disk; records dropped because too much was waiting. */
size_t record_file_pending(const record_file *f);
uint64_t record_file_dropped(const record_file *f);

const char *record_file_path(const record_file *f);

/* Flushes (a last try) and closes; NULL-safe. 0 or DFLASH_EIO (records were lost). */
int record_file_close(record_file **fp);

#endif
