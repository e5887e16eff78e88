/* journal: an append-only file of typed, checksummed records; the ledger's durable memory.
 *
 * File format (all integers little-endian):
 *   header  : magic "DFLJRNL1" (8 bytes), u32 version (=1), u32 reserved (0)          16 bytes
 *   record  : u32 payload_len, u16 type, u16 reserved(0), payload[payload_len],
 *             u32 crc32 (IEEE) over the 8 header bytes of the record and the payload
 * Invariants: records are only ever appended; a record is valid when it is complete and its CRC
 * matches. At open, every valid record is handed to the replay callback in file order. A final
 * record that is incomplete or fails its CRC (a torn write: the process died mid-append) is cut
 * off with a warning and appending resumes at the last good record. A bad record that is followed
 * by more data is corruption, not a torn tail: open fails with DFLASH_ECORRUPT.
 * journal_rewrite() compacts: the caller emits a fresh set of records into a temporary file,
 * which is fsynced and renamed over the journal (atomic on POSIX).
 *
 * Thread: single-threaded (the broker's loop thread); no internal locking. Writes are plain
 * write(2); only appends with sync=true (checkpoint commits, rewinds) call fdatasync.
 * Callers: ledger.c. The journal knows nothing of batches: record types are the caller's.
 */
#ifndef DFLASH_QUEUE_JOURNAL_H
#define DFLASH_QUEUE_JOURNAL_H

#include <stdbool.h>
#include <stdint.h>

#define JOURNAL_MAGIC "DFLJRNL1"
#define JOURNAL_VERSION 1u
#define JOURNAL_HEADER_BYTES 16u
#define JOURNAL_RECORD_OVERHEAD 12u     /* len + type + reserved + crc */
#define JOURNAL_MAX_PAYLOAD (1u << 20)  /* bigger records are refused (and treated as corrupt) */

typedef struct journal journal;

/* Called once per valid record during journal_open, in file order. Return 0 to go on or a
 * negative DFLASH_E* code to abort the open with that code. payload is valid only for the call. */
typedef int (*journal_replay_fn)(void *ctx, uint16_t type, const void *payload, uint32_t len);

/* Opens (creating with mode 0600 if missing) the journal at path and replays it through fn (may
 * be NULL). Returns the journal ready for appending, or NULL with *err (optional) set:
 * DFLASH_EIO, DFLASH_EFORMAT (bad magic), DFLASH_EVERSION, DFLASH_ECORRUPT, or fn's code. */
journal *journal_open(const char *path, journal_replay_fn fn, void *ctx, int *err);

/* Closes the file (no extra fsync) and frees; accepts NULL and NULLs *j. */
void journal_destroy(journal **j);

/* Appends one record; with sync, fdatasyncs before returning. Returns 0, DFLASH_EINVAL
 * (payload too large), or DFLASH_EIO (the journal is then unusable: every later call fails). */
int journal_append(journal *j, uint16_t type, const void *payload, uint32_t len, bool sync);

/* fdatasyncs the file. Returns 0 or DFLASH_EIO. */
int journal_sync(journal *j);

/* Compaction: creates "<path>.tmp", calls emit(ctx, tmp) which appends the records that replace
 * the whole journal (via journal_append on tmp), fsyncs and renames it over path, then continues
 * appending to the new file. On any failure the old journal stays in use. Returns 0 or code. */
int journal_rewrite(journal *j, int (*emit)(void *ctx, journal *tmp), void *ctx);

/* Bytes in the file (header + valid records). */
uint64_t journal_size(const journal *j);
/* Records replayed at open plus records appended since (reset by journal_rewrite). */
uint64_t journal_records(const journal *j);
/* Bytes cut off at open as a torn final record (0 when the file was clean). */
uint64_t journal_torn_bytes(const journal *j);

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32) of data, continuing from crc (start with 0). */
uint32_t journal_crc32(uint32_t crc, const void *data, uint64_t len);

#endif
