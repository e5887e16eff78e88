/* journal: an append-only file of typed, checksummed records; the ledger's durable memory.
 *
 * File format (all integers little-endian):
 *   header  : magic "DFLJRNL1" (8 bytes), u32 version (=1), u32 reserved (0)          16 bytes
 *   record  : u32 payload_len, u16 type, u16 reserved(0), payload[payload_len],
 *             u32 crc32 (IEEE) over the 8 header bytes of the record and the payload
 * Invariants: records are only ever appended; a record is valid when it is complete and its CRC
 * matches. At open, every valid record is handed to the replay callback in file order. A bad
 * record (incomplete, over the maximum length or failing its CRC) with no whole valid record
 * starting anywhere after its first byte is a torn tail (the process died mid-append, or a crash
 * left zeros or stale blocks where appends not yet fsynced were): it is cut off with a warning
 * (a tail that is more than a short final write is first kept in "<path>.torn-<offset>", mode
 * 0600 like the journal) and appending resumes at the last good record. A bad record followed
 * by a whole valid record is corruption, not a torn tail: open fails with DFLASH_ECORRUPT.
 * journal_rewrite() compacts: the caller emits a fresh set of records into a temporary file,
 * which is fsynced and renamed over the journal (atomic on POSIX).
 *
 * Two modes. *Inline* (after journal_open): journal_append writes (and with sync fdatasyncs)
 * before it returns; replay at start, the tests and tools use it. *Writer* (after
 * journal_writer_start): the caller's thread (the broker's libuv loop) never touches the disk.
 * journal_append encodes the record into a FIFO and returns its sequence number at once; one
 * writer thread takes everything queued, writes each record with one write(2) in order,
 * fdatasyncs once if any of them asked for sync (group commit), publishes done_seq = the last
 * sequence number written (and synced where asked) and wakes the loop through a uv_async; the
 * done callback then runs on the loop thread. journal_rewrite in writer mode builds the snapshot
 * in memory on the caller's thread and queues it; the writer writes the temporary file, fsyncs,
 * renames and continues on the new file. Records are numbered 1, 2, ... per journal object
 * (journal_last_seq); a record is durable once done_seq >= its number. A write or sync failure
 * breaks the journal: fail_seq records the first failed number, later appends fail at once.
 *
 * Healing: a rewrite is a whole snapshot of the caller's state, so one that succeeds while the
 * journal is broken makes it whole again: the new file holds every record before the rewrite,
 * failed ones included, and broken, journal_failure and fail_seq are cleared (done_seq >= a
 * record's number then means durable again, whether it was written or is in the snapshot). In
 * writer mode a broken journal takes a rewrite and the appends queued behind it; those are
 * written if the rewrite succeeds and fail with it if not. The caller retries journal_rewrite.
 *
 * One owner: journal_open takes an exclusive flock on "<path>.lock" (created beside the journal,
 * never removed) and holds it until journal_destroy or the process's death; a second open of the
 * same journal, in any process, fails with DFLASH_EEXISTS.
 *
 * Thread: the owner's thread for every call (in writer mode: the loop thread given to
 * journal_writer_start); the writer thread is internal (mutex + condition variable around the
 * FIFO and the done/fail numbers). Callers: ledger.c. The journal knows nothing of batches:
 * record types are the caller's.
 */
#ifndef DFLASH_QUEUE_JOURNAL_H
#define DFLASH_QUEUE_JOURNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

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
 * DFLASH_EIO, DFLASH_EEXISTS (another owner holds it), DFLASH_EFORMAT (bad magic),
 * DFLASH_EVERSION, DFLASH_ECORRUPT, or fn's code. */
journal *journal_open(const char *path, journal_replay_fn fn, void *ctx, int *err);

/* Closes the file (no extra fsync) and frees; accepts NULL and NULLs *j. */
void journal_destroy(journal **j);

/* Appends one record; with sync, fdatasyncs before returning (writer mode: queues it, and the
 * writer syncs it before it counts as done). Returns 0, DFLASH_EINVAL (payload too large),
 * DFLASH_ENOMEM (writer mode), or DFLASH_EIO (the journal is then unusable: every later call
 * fails). */
int journal_append(journal *j, uint16_t type, const void *payload, uint32_t len, bool sync);

/* fdatasyncs the file (inline mode only; writer mode: DFLASH_ESTATE). Returns 0 or DFLASH_EIO. */
int journal_sync(journal *j);

/* A durability barrier: everything appended so far becomes durable, records appended without
 * sync included. Inline mode: journal_sync (DFLASH_EIO when broken). Writer mode: queues a job
 * that writes nothing and makes the writer fdatasync the file after every record before it
 * (FIFO; grouped with the other syncs of its batch); it takes a sequence number like a record
 * (journal_last_seq), so the caller waits for done_seq >= it, and a failed sync reports it
 * failed. Returns 0, DFLASH_ENOMEM, or DFLASH_EIO (broken: refused at once, as an append). */
int journal_barrier(journal *j);

/* Compaction: creates "<path>.tmp", calls emit(ctx, tmp) which appends the records that replace
 * the whole journal (via journal_append on tmp), fsyncs and renames it over path, then continues
 * appending to the new file. On any failure the old journal stays in use. Returns 0 or code.
 * Writer mode: emit fills a memory image; the file work is queued (returns 0 once queued; a
 * later failure is logged by the writer and the old journal stays in use). On a broken journal
 * it is the way back ("Healing" above); writer mode: 0 without a new image while an earlier
 * rewrite is still queued. */
int journal_rewrite(journal *j, int (*emit)(void *ctx, journal *tmp), void *ctx);

/* Bytes in the file in use (header + valid records). Writer mode: plus the appends queued for
 * it, and while a rewrite is queued, as if it will succeed (corrected once the writer reports a
 * failed one, and no other is queued). */
uint64_t journal_size(const journal *j);
/* Records replayed at open plus records appended since (reset by journal_rewrite); writer mode
 * as journal_size. */
uint64_t journal_records(const journal *j);
/* Rewrites that failed so far (writer mode: those the writer reported too). Owner's thread. */
uint64_t journal_rewrite_failures(const journal *j);
/* Bytes cut off at open as a torn final record (0 when the file was clean). */
uint64_t journal_torn_bytes(const journal *j);

/* fdatasync replacement (tests inject a slow or failing one): called with the journal's fd on
 * the thread that syncs; returns 0 or a negative code. */
typedef int (*journal_sync_fn)(void *ctx, int fd);
/* Called on the loop thread when records up to done_seq are durable; fail_seq is the first
 * record that failed to be written or synced since the journal was last whole (0: none; a
 * healing rewrite resets it, and every record up to done_seq is then durable). */
typedef void (*journal_done_fn)(void *ctx, uint64_t done_seq, uint64_t fail_seq);

/* Replaces fdatasync for this journal (NULL restores it); takes effect from the writer's next
 * batch. Owner's thread. */
void journal_set_sync_hook(journal *j, journal_sync_fn fn, void *ctx);

/* Switches to writer mode: starts the writer thread and a uv_async on loop that calls done (on
 * the loop thread) as records complete. Returns 0, DFLASH_EINVAL (already started), or
 * DFLASH_ENOMEM / DFLASH_EINTERNAL (thread or handle could not be created; still inline). */
int journal_writer_start(journal *j, uv_loop_t *loop, journal_done_fn done, void *ctx);

/* Leaves writer mode: waits until everything queued is written (and synced where asked), joins
 * the thread and closes the uv_async (the loop must run once more to free it). done is not
 * called again. Blocks; for shutdown only. No-op when not started. */
void journal_writer_stop(journal *j);

/* Sequence number of the last record appended (or rewrite queued); 0 before any. */
uint64_t journal_last_seq(const journal *j);
/* Last sequence number known durable / first failed (0 none), as seen by the owner's thread.
 * Inline mode: equal to journal_last_seq / the first failed append. */
uint64_t journal_done_seq(const journal *j);
uint64_t journal_fail_seq(const journal *j);
/* NULL while the journal takes every record; else why it broke (e.g. "append failed: No space
 * left on device"), as seen by the owner's thread: nothing after that is durable until a
 * rewrite heals it (NULL again). */
const char *journal_failure(const journal *j);

#endif
