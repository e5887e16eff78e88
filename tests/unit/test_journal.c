/* test_journal: the broker's journal gives back exactly what was appended after a restart; a
 * crash mid-append (torn final record, cut at any byte; or a tail of zeros or stale blocks where
 * unsynced appends were) loses only those records; corruption in the
 * middle, a foreign file or a future version refuse to start instead of silently losing batches;
 * compaction replaces the file atomically, and heals a journal a failed write broke; a journal
 * has one owner at a time; a record on disk is byte for byte journal.h's format, its CRC-32 the
 * one zlib computes; in the writer thread, a record is reported durable only once it is (a write
 * failing later in its batch, a compaction whose directory fsync fails). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "crc.h"
#include "err.h"
#include "journal.h"
#include "test_files.h"

#include <uv.h>

static char dir[256];
static char path[300];

typedef struct {
    int n;
    uint16_t type[64];
    uint32_t len[64];
    uint8_t first[64];
} seen;

static int collect(void *ctx, uint16_t type, const void *payload, uint32_t len)
{
    seen *s = ctx;
    if (s->n < 64) {
        s->type[s->n] = type;
        s->len[s->n] = len;
        s->first[s->n] = len ? ((const uint8_t *)payload)[0] : 0;
    }
    s->n++;
    return 0;
}

static int refuse(void *ctx, uint16_t type, const void *payload, uint32_t len)
{
    (void)ctx, (void)payload, (void)len;
    return type == 3 ? DFLASH_EMISMATCH : 0;
}

/* Flips the bits of mask in the byte at offset at of file (a damaged record). */
static void flip_bits(const char *file, off_t at, uint8_t mask)
{
    int fd = open(file, O_RDWR);
    uint8_t byte = 0;
    CHECK_EQ_INT(pread(fd, &byte, 1, at), 1);
    byte ^= mask;
    CHECK_EQ_INT(pwrite(fd, &byte, 1, at), 1);
    close(fd);
}

static void test_roundtrip(void)
{
    int err = 1;
    journal *j = journal_open(path, NULL, NULL, &err);
    CHECK(j != NULL);
    CHECK_EQ_INT(err, 0);
    CHECK_EQ_INT(journal_size(j), JOURNAL_HEADER_BYTES);
    uint8_t big[3000];
    memset(big, 7, sizeof big);
    CHECK_EQ_INT(journal_append(j, 1, "a", 1, false), 0);
    CHECK_EQ_INT(journal_append(j, 2, NULL, 0, true), 0);
    CHECK_EQ_INT(journal_append(j, 3, big, sizeof big, false), 0);
    CHECK_EQ_INT(journal_append(j, 4, big, JOURNAL_MAX_PAYLOAD + 1, false), DFLASH_EINVAL);
    CHECK_EQ_INT(journal_records(j), 3);
    uint64_t size = journal_size(j);
    CHECK_EQ_INT(size, test_file_size(path));
    journal_destroy(&j);
    CHECK(j == NULL);

    /* the first record on disk, byte for byte (journal.h's format): len 1, type 1, "a", then the
     * IEEE CRC-32 of those 9 bytes, little-endian (0xf6a77893, as zlib.crc32 computes it) */
    size_t flen = 0;
    uint8_t *file = (uint8_t *)test_slurp(path, &flen);
    static const uint8_t first[13] = {1, 0, 0, 0, 1, 0, 0, 0, 'a', 0x93, 0x78, 0xa7, 0xf6};
    CHECK(file && flen >= JOURNAL_HEADER_BYTES + 13 &&
          memcmp(file + JOURNAL_HEADER_BYTES, first, 13) == 0);
    CHECK_EQ_INT(crc32_ieee(0, first, 9), 0xf6a77893u);
    free(file);

    seen s = {0};
    j = journal_open(path, collect, &s, &err);
    CHECK(j != NULL);
    CHECK_EQ_INT(s.n, 3);
    CHECK_EQ_INT(s.type[0], 1);
    CHECK_EQ_INT(s.first[0], 'a');
    CHECK_EQ_INT(s.len[1], 0);
    CHECK_EQ_INT(s.len[2], 3000);
    CHECK_EQ_INT(s.first[2], 7);
    CHECK_EQ_INT(journal_torn_bytes(j), 0);
    /* Appends continue after the replayed records. */
    CHECK_EQ_INT(journal_append(j, 5, "z", 1, false), 0);
    journal_destroy(&j);
    memset(&s, 0, sizeof s);
    j = journal_open(path, collect, &s, &err);
    CHECK_EQ_INT(s.n, 4);
    CHECK_EQ_INT(s.type[3], 5);
    journal_destroy(&j);

    /* A replay callback can refuse the journal (e.g. a record it cannot apply). */
    j = journal_open(path, refuse, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_EMISMATCH);
}

static void test_torn_tail(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    CHECK_EQ_INT(journal_append(j, 1, "first", 5, false), 0);
    CHECK_EQ_INT(journal_append(j, 2, "second", 6, false), 0);
    uint64_t before = journal_size(j);
    CHECK_EQ_INT(journal_append(j, 3, "third!!", 7, false), 0);
    uint64_t after = journal_size(j);
    journal_destroy(&j);
    char cut[320];
    snprintf(cut, sizeof cut, "%s.cut", path);
    /* Every crash point inside the last record: the first two survive, the third is cut off,
     * and the file is usable for appending again. */
    int bad = 0;
    for (uint64_t len = before; len <= after; len++) {
        test_copy_prefix(path, cut, len);
        seen s = {0};
        int err = 0;
        j = journal_open(cut, collect, &s, &err);
        int want = len == after ? 3 : 2;
        if (!j || s.n != want || journal_torn_bytes(j) != len - (len == after ? after : before))
            bad++;
        if (j) {
            if (journal_size(j) != (len == after ? after : before)) bad++;
            if (journal_append(j, 9, "x", 1, false) != 0) bad++;
            journal_destroy(&j);
            memset(&s, 0, sizeof s);
            j = journal_open(cut, collect, &s, NULL);
            if (!j || s.n != want + 1 || s.type[want] != 9) bad++;
            journal_destroy(&j);
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* A crash while writing the header of a new journal. */
    for (uint64_t len = 0; len < JOURNAL_HEADER_BYTES; len++) {
        test_copy_prefix(path, cut, len);
        j = journal_open(cut, NULL, NULL, NULL);
        CHECK(j != NULL);
        if (j) CHECK_EQ_INT(journal_size(j), JOURNAL_HEADER_BYTES);
        journal_destroy(&j);
    }
    /* A power loss while a new journal was created can leave its size with zeros for bytes:
     * started anew, and a record appended then is read back. */
    for (uint64_t len = 1; len <= JOURNAL_HEADER_BYTES; len++) {
        uint8_t zeros[JOURNAL_HEADER_BYTES] = {0};
        test_spill(cut, (const char *)zeros, len);
        int err = -1;
        j = journal_open(cut, NULL, NULL, &err);
        CHECK(j != NULL);
        CHECK_EQ_INT(err, 0);
        if (!j) continue;
        CHECK_EQ_INT(journal_size(j), JOURNAL_HEADER_BYTES);
        CHECK_EQ_INT(journal_append(j, 9, "x", 1, true), 0);
        journal_destroy(&j);
        seen z = {0};
        j = journal_open(cut, collect, &z, NULL);
        CHECK(j != NULL && z.n == 1 && z.type[0] == 9);
        journal_destroy(&j);
    }
    /* A flipped bit in the last record's payload is a torn tail too. */
    test_copy_prefix(path, cut, after);
    flip_bits(cut, (off_t)before + 9, 0x01);
    seen s = {0};
    j = journal_open(cut, collect, &s, NULL);
    CHECK(j != NULL);
    CHECK_EQ_INT(s.n, 2);
    journal_destroy(&j);
    unlink(cut);
}

/* A crash can leave zeros or stale blocks where appends not yet fsynced were (ext4 with
 * data=writeback, some virtual disks): with no whole record after it, that tail is cut like a
 * torn record, its bytes kept in "<path>.torn-<offset>". */
static void test_garbled_tail(void)
{
    static const uint8_t fills[] = {0x00, 0xff, 0x5a};
    for (unsigned f = 0; f < sizeof fills; f++) {
        unlink(path);
        journal *j = journal_open(path, NULL, NULL, NULL);
        CHECK_EQ_INT(journal_append(j, 1, "first", 5, false), 0);
        CHECK_EQ_INT(journal_append(j, 2, "second", 6, true), 0);
        uint64_t size = journal_size(j);
        journal_destroy(&j);
        uint8_t tail[4096];
        memset(tail, fills[f], sizeof tail);
        int fd = open(path, O_WRONLY | O_APPEND);
        CHECK_EQ_INT(write(fd, tail, sizeof tail), (int)sizeof tail);
        close(fd);
        seen s = {0};
        int err = -1;
        j = journal_open(path, collect, &s, &err);
        CHECK(j != NULL);
        CHECK_EQ_INT(err, 0);
        CHECK_EQ_INT(s.n, 2);
        if (!j) continue;
        CHECK_EQ_INT(journal_torn_bytes(j), sizeof tail);
        CHECK_EQ_INT(journal_size(j), size);
        CHECK_EQ_INT(test_file_size(path), size);
        CHECK_EQ_INT(journal_append(j, 3, "third", 5, true), 0);
        journal_destroy(&j);
        char keep[400];
        snprintf(keep, sizeof keep, "%s.torn-%llu", path, (unsigned long long)size);
        CHECK_EQ_INT(test_file_size(keep), sizeof tail);
        struct stat kst; /* the journal's records, as private as the journal (was 0644) */
        CHECK(stat(keep, &kst) == 0 && (kst.st_mode & 0777) == 0600);
        unlink(keep);
        memset(&s, 0, sizeof s);
        j = journal_open(path, collect, &s, NULL);
        CHECK(j != NULL);
        CHECK_EQ_INT(s.n, 3);
        journal_destroy(&j);
    }
    /* A whole final record failing its checksum (a stale block where the last append was) is
     * cut as well, and its bytes are kept too: it is no short write. */
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    CHECK_EQ_INT(journal_append(j, 1, "first", 5, false), 0);
    uint64_t size = journal_size(j);
    CHECK_EQ_INT(journal_append(j, 2, "second", 6, false), 0);
    journal_destroy(&j);
    flip_bits(path, (off_t)size + 9, 0x01);
    seen s = {0};
    j = journal_open(path, collect, &s, NULL);
    CHECK(j != NULL);
    CHECK_EQ_INT(s.n, 1);
    CHECK_EQ_INT(test_file_size(path), size);
    journal_destroy(&j);
    char keep[400];
    snprintf(keep, sizeof keep, "%s.torn-%llu", path, (unsigned long long)size);
    CHECK_EQ_INT(test_file_size(keep), JOURNAL_RECORD_OVERHEAD + 6);
    unlink(keep);
}

static void test_corrupt(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    CHECK_EQ_INT(journal_append(j, 1, "first", 5, false), 0);
    CHECK_EQ_INT(journal_append(j, 2, "second", 6, false), 0);
    journal_destroy(&j);
    /* A flipped bit in a record that is followed by more records: refuse to start. */
    off_t at = JOURNAL_HEADER_BYTES + 9;
    flip_bits(path, at, 0x40);
    int err = 0;
    j = journal_open(path, NULL, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_ECORRUPT);
    journal_destroy(&j); /* (taken as a torn tail, it would keep the lock) */
    /* The same when the only whole record after the damaged one is an empty one ending exactly
     * at the end of the file (the BOOT record every open appends has no payload). */
    unlink(path);
    j = journal_open(path, NULL, NULL, NULL);
    CHECK_EQ_INT(journal_append(j, 1, "first", 5, false), 0);
    CHECK_EQ_INT(journal_append(j, 13, NULL, 0, false), 0);
    journal_destroy(&j);
    CHECK_EQ_INT(test_file_size(path), JOURNAL_HEADER_BYTES + 2 * JOURNAL_RECORD_OVERHEAD + 5);
    flip_bits(path, at, 0x40);
    j = journal_open(path, NULL, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_ECORRUPT);
    journal_destroy(&j); /* (taken as a torn tail, it would keep the lock) */
    /* A length field that runs past the end, with whole records after it: not a torn tail
     * (every record after it was once cut off as one); refuse and leave the file as it is. */
    unlink(path);
    j = journal_open(path, NULL, NULL, NULL);
    CHECK_EQ_INT(journal_append(j, 1, "first", 5, false), 0);
    CHECK_EQ_INT(journal_append(j, 2, "second", 6, false), 0);
    CHECK_EQ_INT(journal_append(j, 3, "third", 5, false), 0);
    journal_destroy(&j);
    uint64_t size = test_file_size(path);
    int fd = open(path, O_RDWR);
    uint8_t big[4] = {0, 0x10, 0, 0}; /* 4096 bytes: < JOURNAL_MAX_PAYLOAD, past the end */
    CHECK_EQ_INT(pwrite(fd, big, 4, JOURNAL_HEADER_BYTES), 4);
    close(fd);
    /* its log says where the damage starts and how to cut the file there (a power loss can
     * lose an earlier page of unsynced appends and keep a later one) */
    char errlog[600];
    snprintf(errlog, sizeof errlog, "%s.stderr", path);
    fflush(stderr);
    int saved = dup(2), lf = open(errlog, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && lf >= 0 && dup2(lf, 2) == 2);
    j = journal_open(path, NULL, NULL, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(lf);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_ECORRUPT);
    CHECK_EQ_INT(test_file_size(path), size);
    char *said = test_slurp(errlog, NULL), want[700];
    snprintf(want, sizeof want, "truncate -s %d %s", JOURNAL_HEADER_BYTES, path);
    CHECK(said && strstr(said, "if the broker's host lost power") && strstr(said, want));
    free(said);
    unlink(errlog);
    journal_destroy(&j);
    /* Not a journal at all. */
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK_EQ_INT(write(fd, "hello, this is not a journal", 28), 28);
    close(fd);
    j = journal_open(path, NULL, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_EFORMAT);
    journal_destroy(&j);
    /* Nor one shorter than a journal's header (a crash while writing the header leaves a prefix
     * of the magic; anything else is some other file, refused and left as it is, not cut). */
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK_EQ_INT(write(fd, "notes\n", 6), 6);
    close(fd);
    j = journal_open(path, NULL, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_EFORMAT);
    CHECK_EQ_INT(test_file_size(path), 6);
    journal_destroy(&j);
    /* Zeros past a header's length are not a header lost at creation (records are appended
     * only after the header is synced): refused and left as they are. */
    uint8_t zeros[JOURNAL_HEADER_BYTES + 1] = {0};
    test_spill(path, (const char *)zeros, sizeof zeros);
    j = journal_open(path, NULL, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_EFORMAT);
    CHECK_EQ_INT(test_file_size(path), sizeof zeros);
    journal_destroy(&j);
    /* A journal from a future version. */
    fd = open(path, O_WRONLY | O_TRUNC);
    uint8_t hdr[16] = {'D', 'F', 'L', 'J', 'R', 'N', 'L', '1', 2, 0, 0, 0, 0, 0, 0, 0};
    CHECK_EQ_INT(write(fd, hdr, 16), 16);
    close(fd);
    j = journal_open(path, NULL, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_EVERSION);
    /* A directory that does not exist. */
    j = journal_open("/nonexistent-dir-dflash/j", NULL, NULL, &err);
    CHECK(j == NULL);
    CHECK_EQ_INT(err, DFLASH_EIO);
    unlink(path);
}

static int emit_two(void *ctx, journal *t)
{
    (void)ctx;
    int rc = journal_append(t, 7, "s1", 2, false);
    return rc ? rc : journal_append(t, 8, "s2", 2, false);
}

static int emit_fail(void *ctx, journal *t)
{
    (void)ctx, (void)t;
    return DFLASH_EIO;
}

static void test_rewrite(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    for (int i = 0; i < 100; i++) CHECK_EQ_INT(journal_append(j, 1, "rec", 3, false), 0);
    uint64_t long_size = journal_size(j);
    /* a symlink planted at the temporary name is not written through (it was: O_TRUNC) */
    char tmp[320], victim[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(victim, sizeof victim, "%s.victim", path);
    test_spill(victim, "precious", 8);
    unlink(tmp);
    CHECK_EQ_INT(symlink(victim, tmp), 0);
    CHECK_EQ_INT(journal_rewrite(j, emit_fail, NULL), DFLASH_EIO);
    CHECK_EQ_INT(journal_size(j), long_size); /* failure keeps the old journal */
    CHECK_EQ_INT(journal_rewrite(j, emit_two, NULL), 0);
    CHECK(journal_size(j) < long_size);
    CHECK_EQ_INT(journal_append(j, 9, "after", 5, true), 0);
    journal_destroy(&j);
    CHECK(access(tmp, F_OK) != 0); /* no temporary left behind */
    CHECK_EQ_INT(test_file_size(victim), 8);
    unlink(victim);
    seen s = {0};
    j = journal_open(path, collect, &s, NULL);
    CHECK_EQ_INT(s.n, 3);
    CHECK_EQ_INT(s.type[0], 7);
    CHECK_EQ_INT(s.type[2], 9);
    journal_destroy(&j);
    unlink(path);
}

/* Writer mode: records queued from the loop thread reach the file in order, the done callback
 * reports them on the loop thread with non-decreasing numbers, a sync record counts as done
 * only after the (counting) sync hook ran, and a queued compaction keeps later records. */
typedef struct {
    uint64_t done, calls, syncs_at_done;
    bool monotonic;
    uv_loop_t *loop;
    uint64_t until;
} writer_seen;

static int writer_syncs;
static int counting_sync(void *ctx, int fd)
{
    (void)ctx;
    __atomic_add_fetch(&writer_syncs, 1, __ATOMIC_SEQ_CST);
    return fdatasync(fd) == 0 ? 0 : DFLASH_EIO;
}

static void on_done(void *ctx, uint64_t done, uint64_t fail)
{
    writer_seen *w = ctx;
    if (done < w->done || fail) w->monotonic = false;
    w->done = done;
    w->calls++;
    w->syncs_at_done = (uint64_t)__atomic_load_n(&writer_syncs, __ATOMIC_SEQ_CST);
    if (done >= w->until) uv_stop(w->loop);
}

static void test_writer(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    CHECK_EQ_INT(journal_append(j, 1, "inline", 6, false), 0); /* before the writer: inline */
    CHECK_EQ_INT(journal_done_seq(j), 1);
    uv_loop_t loop;
    uv_loop_init(&loop);
    writer_seen w = {.monotonic = true, .loop = &loop};
    journal_set_sync_hook(j, counting_sync, NULL);
    CHECK_EQ_INT(journal_writer_start(j, &loop, on_done, &w), 0);
    CHECK_EQ_INT(journal_writer_start(j, &loop, on_done, &w), DFLASH_EINVAL);
    CHECK_EQ_INT(journal_sync(j), DFLASH_ESTATE);
    for (uint32_t i = 0; i < 200; i++) {
        uint8_t p[4] = {(uint8_t)i, (uint8_t)(i >> 8), 0, 0};
        CHECK_EQ_INT(journal_append(j, 2, p, 4, i == 199), 0);
    }
    CHECK_EQ_INT(journal_rewrite(j, emit_two, NULL), 0); /* queued behind the 200 */
    CHECK_EQ_INT(journal_append(j, 9, "after", 5, true), 0);
    CHECK_EQ_INT(journal_last_seq(j), 203);
    w.until = journal_last_seq(j);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(w.done, 203);
    CHECK(w.monotonic);
    CHECK(w.calls >= 1);
    CHECK(w.syncs_at_done >= 1); /* the last record asked for a sync: it ran before "done" */
    journal_writer_stop(j);
    uv_run(&loop, UV_RUN_DEFAULT); /* frees the async handle */
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
    CHECK_EQ_INT(journal_append(j, 10, "inline2", 7, false), 0); /* inline again */
    journal_destroy(&j);
    seen s = {0};
    j = journal_open(path, collect, &s, NULL);
    CHECK_EQ_INT(s.n, 4); /* the snapshot's two records, then the two after it */
    CHECK_EQ_INT(s.type[0], 7);
    CHECK_EQ_INT(s.type[2], 9);
    CHECK_EQ_INT(s.type[3], 10);
    journal_destroy(&j);

    /* without compaction every record comes back, in order */
    unlink(path);
    j = journal_open(path, NULL, NULL, NULL);
    uv_loop_init(&loop);
    writer_seen w2 = {.monotonic = true, .loop = &loop};
    CHECK_EQ_INT(journal_writer_start(j, &loop, on_done, &w2), 0);
    for (uint32_t i = 0; i < 50; i++) {
        uint8_t p[1] = {(uint8_t)i};
        CHECK_EQ_INT(journal_append(j, (uint16_t)(100 + i), p, 1, i % 7 == 0), 0);
    }
    w2.until = 50;
    uv_run(&loop, UV_RUN_DEFAULT);
    journal_destroy(&j); /* stops the writer itself */
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
    seen s2 = {0};
    j = journal_open(path, collect, &s2, NULL);
    CHECK_EQ_INT(s2.n, 50);
    bool in_order = true;
    for (int i = 0; i < 50 && i < 64; i++) in_order &= s2.type[i] == 100 + i && s2.first[i] == i;
    CHECK(in_order);
    journal_destroy(&j);
    unlink(path);
}

/* The end of a writer-mode test: the journal closed (its writer stopped), the loop run until its
 * async handle is freed and closed, the file removed. */
static void end_writer_test(journal **j, uv_loop_t *loop)
{
    journal_destroy(j);
    uv_run(loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(loop), 0);
    unlink(path);
}

/* Writer mode, a disk that fails and comes back: a failed sync breaks the journal (later appends
 * fail at once); a rewrite queued then heals it once the disk takes it, and the record queued
 * behind that rewrite is written too (it used to be refused, and the journal stayed broken). */
static bool disk_full;
static int full_disk_sync(void *ctx, int fd)
{
    (void)ctx;
    if (__atomic_load_n(&disk_full, __ATOMIC_SEQ_CST)) return DFLASH_EIO;
    return fdatasync(fd) == 0 ? 0 : DFLASH_EIO;
}

static void on_done_until(void *ctx, uint64_t done, uint64_t fail)
{
    writer_seen *w = ctx;
    (void)fail;
    w->done = done;
    if (done >= w->until) uv_stop(w->loop);
}

/* Starts j's writer on loop with the full-disk sync hook, the disk full from now on. */
static void start_writer_disk_full(journal *j, uv_loop_t *loop, writer_seen *w)
{
    uv_loop_init(loop);
    *w = (writer_seen){.loop = loop};
    journal_set_sync_hook(j, full_disk_sync, NULL);
    CHECK_EQ_INT(journal_writer_start(j, loop, on_done_until, w), 0);
    __atomic_store_n(&disk_full, true, __ATOMIC_SEQ_CST);
}

/* Without a writer thread a failing sync is said as one, with the hook's code when it sets no
 * errno (defect: "append failed: Success", a sync failure named as a write's). */
static void test_inline_sync_failure(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    CHECK(j != NULL);
    if (!j) return;
    journal_set_sync_hook(j, full_disk_sync, NULL);
    __atomic_store_n(&disk_full, true, __ATOMIC_SEQ_CST);
    CHECK_EQ_INT(journal_append(j, 1, "lost", 4, true), DFLASH_EIO);
    __atomic_store_n(&disk_full, false, __ATOMIC_SEQ_CST);
    const char *why = journal_failure(j);
    printf("inline sync failure: %s\n", why ? why : "(none)");
    CHECK(why && strstr(why, "fdatasync failed") && !strstr(why, "Success"));
    journal_destroy(&j);
}

static void test_writer_heals(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    uv_loop_t loop;
    writer_seen w;
    start_writer_disk_full(j, &loop, &w);
    CHECK_EQ_INT(journal_append(j, 1, "lost", 4, true), 0);
    w.until = journal_last_seq(j);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(journal_failure(j) != NULL);
    CHECK_EQ_INT(journal_fail_seq(j), 1);
    CHECK_EQ_INT(journal_append(j, 2, "refused", 7, false), DFLASH_EIO);
    __atomic_store_n(&disk_full, false, __ATOMIC_SEQ_CST);
    CHECK_EQ_INT(journal_rewrite(j, emit_two, NULL), 0);
    CHECK_EQ_INT(journal_rewrite(j, emit_two, NULL), 0); /* one is under way: not queued again */
    CHECK_EQ_INT(journal_last_seq(j), 2);
    CHECK_EQ_INT(journal_append(j, 9, "behind", 6, true), 0);
    w.until = journal_last_seq(j);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(journal_failure(j) == NULL);
    CHECK_EQ_INT(journal_fail_seq(j), 0);
    CHECK_EQ_INT(journal_done_seq(j), 3);
    journal_destroy(&j);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
    seen s = {0};
    j = journal_open(path, collect, &s, NULL);
    CHECK_EQ_INT(s.n, 3); /* the snapshot's two records, then the one behind it */
    CHECK_EQ_INT(s.type[0], 7);
    CHECK_EQ_INT(s.type[2], 9);
    journal_destroy(&j);
    unlink(path);
}

/* Writer mode: a rewrite and then a failed sync in one batch of the writer's. The records before
 * the rewrite are durable in its fsynced image, so only what follows it is reported failed (the
 * broker answers Error IO to the replies of failed records: a commit before the rewrite must not
 * be one). The sync hook holds the writer in its first sync so that the three are one batch. */
static int gate_calls;
static bool gate_open;
static int gated_sync(void *ctx, int fd)
{
    (void)ctx;
    int n = __atomic_add_fetch(&gate_calls, 1, __ATOMIC_SEQ_CST);
    if (n == 1)
        while (!__atomic_load_n(&gate_open, __ATOMIC_SEQ_CST)) usleep(1000);
    if (n == 3) return DFLASH_EIO; /* the batch's sync, after the rewrite's own */
    return fdatasync(fd) == 0 ? 0 : DFLASH_EIO;
}

static void test_writer_fail_after_rewrite(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    uv_loop_t loop;
    uv_loop_init(&loop);
    writer_seen w = {.loop = &loop};
    journal_set_sync_hook(j, gated_sync, NULL);
    CHECK_EQ_INT(journal_writer_start(j, &loop, on_done_until, &w), 0);
    CHECK_EQ_INT(journal_append(j, 1, "gate", 4, true), 0);
    while (__atomic_load_n(&gate_calls, __ATOMIC_SEQ_CST) < 1) usleep(1000);
    CHECK_EQ_INT(journal_append(j, 2, "before", 6, false), 0);
    CHECK_EQ_INT(journal_rewrite(j, emit_two, NULL), 0);
    uint64_t rewrite = journal_last_seq(j);
    CHECK_EQ_INT(journal_append(j, 9, "after", 5, true), 0);
    __atomic_store_n(&gate_open, true, __ATOMIC_SEQ_CST);
    w.until = journal_last_seq(j);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(__atomic_load_n(&gate_calls, __ATOMIC_SEQ_CST), 3);
    CHECK(journal_failure(j) != NULL);
    CHECK_EQ_INT(journal_fail_seq(j), rewrite + 1);
    end_writer_test(&j, &loop);
}

/* The writer held in its first sync (gate_ok_sync) so that what is queued meanwhile is one batch;
 * later syncs are counted and done. */
static int gate_ok_calls;
static bool gate_ok_open;
static int gate_ok_sync(void *ctx, int fd)
{
    (void)ctx;
    if (__atomic_add_fetch(&gate_ok_calls, 1, __ATOMIC_SEQ_CST) == 1)
        while (!__atomic_load_n(&gate_ok_open, __ATOMIC_SEQ_CST)) usleep(1000);
    return fdatasync(fd) == 0 ? 0 : DFLASH_EIO;
}

/* Starts j's writer on loop held at its first sync (a record of type 1 that asks for one). */
static void start_gated_writer(journal *j, uv_loop_t *loop, writer_seen *w)
{
    __atomic_store_n(&gate_ok_calls, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gate_ok_open, false, __ATOMIC_SEQ_CST);
    uv_loop_init(loop);
    *w = (writer_seen){.loop = loop};
    journal_set_sync_hook(j, gate_ok_sync, NULL);
    CHECK_EQ_INT(journal_writer_start(j, loop, on_done_until, w), 0);
    CHECK_EQ_INT(journal_append(j, 1, "gate", 4, true), 0);
    while (__atomic_load_n(&gate_ok_calls, __ATOMIC_SEQ_CST) < 1) usleep(1000);
}

/* Writer mode: one batch of a record that asks for a sync, a JournalSync barrier, and an append
 * whose write fails (past RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC). The two before the
 * failed write are synced and reported durable; only the failed one and what follows fail
 * (defect: the failure skipped the batch's sync, and the two were reported durable unsynced). */
static void test_writer_write_fail_syncs_before(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    uv_loop_t loop;
    writer_seen w;
    start_gated_writer(j, &loop, &w);
    CHECK_EQ_INT(journal_append(j, 2, "commit", 6, true), 0);
    CHECK_EQ_INT(journal_barrier(j), 0);
    static uint8_t big[100000];
    CHECK_EQ_INT(journal_append(j, 3, big, sizeof big, false), 0);
    uint64_t failed = journal_last_seq(j);
    struct rlimit was, small;
    CHECK_EQ_INT(getrlimit(RLIMIT_FSIZE, &was), 0);
    small = (struct rlimit){4096, was.rlim_max};
    signal(SIGXFSZ, SIG_IGN);
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &small), 0);
    w.until = failed;
    __atomic_store_n(&gate_ok_open, true, __ATOMIC_SEQ_CST);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &was), 0);
    signal(SIGXFSZ, SIG_DFL);
    printf("a write failed in a batch: %s; fail seq %llu of %llu, syncs %d\n",
           journal_failure(j) ? journal_failure(j) : "(none)",
           (unsigned long long)journal_fail_seq(j), (unsigned long long)failed,
           __atomic_load_n(&gate_ok_calls, __ATOMIC_SEQ_CST));
    CHECK(journal_failure(j) != NULL);
    CHECK_EQ_INT(journal_fail_seq(j), failed);
    CHECK_EQ_INT(__atomic_load_n(&gate_ok_calls, __ATOMIC_SEQ_CST), 2); /* the batch's sync ran */
    end_writer_test(&j, &loop);
}

/* fsync of a directory fails (EIO) while fail_dir_fsync is set; every other fsync is libc's. */
static bool fail_dir_fsync;
static int dir_fsyncs_failed;
int fsync(int fd)
{
    struct stat st;
    if (__atomic_load_n(&fail_dir_fsync, __ATOMIC_SEQ_CST) && fstat(fd, &st) == 0 &&
        S_ISDIR(st.st_mode)) {
        __atomic_add_fetch(&dir_fsyncs_failed, 1, __ATOMIC_SEQ_CST);
        errno = EIO;
        return -1;
    }
    int (*libc_fsync)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return libc_fsync ? libc_fsync(fd) : fdatasync(fd);
}

/* Writer mode: one batch of a record that asks for a sync and a compaction whose rename cannot
 * be made durable (the directory's fsync fails). The record lives only in the new image, whose
 * name a power loss may not keep: it is reported failed, not durable (defect: the rewrite
 * counted as its sync). */
static void test_writer_rewrite_dir_unsynced(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    uv_loop_t loop;
    writer_seen w;
    start_gated_writer(j, &loop, &w);
    CHECK_EQ_INT(journal_append(j, 2, "commit", 6, true), 0);
    uint64_t commit = journal_last_seq(j);
    CHECK_EQ_INT(journal_rewrite(j, emit_two, NULL), 0);
    w.until = journal_last_seq(j);
    __atomic_store_n(&fail_dir_fsync, true, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gate_ok_open, true, __ATOMIC_SEQ_CST);
    uv_run(&loop, UV_RUN_DEFAULT);
    __atomic_store_n(&fail_dir_fsync, false, __ATOMIC_SEQ_CST);
    printf("a compaction's directory fsync failed: %s; fail seq %llu, the commit's %llu; "
           "directory fsyncs failed %d\n", journal_failure(j) ? journal_failure(j) : "(none)",
           (unsigned long long)journal_fail_seq(j), (unsigned long long)commit,
           __atomic_load_n(&dir_fsyncs_failed, __ATOMIC_SEQ_CST));
    CHECK(__atomic_load_n(&dir_fsyncs_failed, __ATOMIC_SEQ_CST) >= 1);
    CHECK(journal_failure(j) != NULL);
    CHECK(journal_fail_seq(j) != 0 && journal_fail_seq(j) <= commit);
    end_writer_test(&j, &loop);
}

/* Writer mode: a compaction that fails (its temporary file cannot be synced) keeps the long
 * journal, and journal_size says so: it used to report the snapshot's size, as if the rewrite
 * had succeeded, while the file in use kept growing from its old size. */
static void test_writer_failed_compaction_size(void)
{
    unlink(path);
    journal *j = journal_open(path, NULL, NULL, NULL);
    for (int i = 0; i < 100; i++) CHECK_EQ_INT(journal_append(j, 1, "long", 4, false), 0);
    uv_loop_t loop;
    writer_seen w;
    start_writer_disk_full(j, &loop, &w);
    CHECK_EQ_INT(journal_rewrite(j, emit_two, NULL), 0); /* queued; fails in the writer */
    CHECK_EQ_INT(journal_append(j, 9, "after", 5, false), 0);
    w.until = journal_last_seq(j);
    uv_run(&loop, UV_RUN_DEFAULT);
    __atomic_store_n(&disk_full, false, __ATOMIC_SEQ_CST);
    CHECK(journal_failure(j) == NULL); /* a failed compaction does not break the journal */
    struct stat st;
    CHECK_EQ_INT(stat(path, &st), 0);
    printf("after the failed compaction: journal_size %llu, file %llu bytes\n",
           (unsigned long long)journal_size(j), (unsigned long long)st.st_size);
    CHECK_EQ_INT(journal_size(j), (uint64_t)st.st_size);
    CHECK_EQ_INT(journal_records(j), 101);
    end_writer_test(&j, &loop);
}

/* One owner at a time: a second open of a journal in use (a second dflash-queue started on the
 * same runtime dir) used to succeed, cut the first one's tail as "torn" and write over its
 * records. It is refused while the first is open and allowed once it is closed. */
static void test_single_owner(void)
{
    int err = 0;
    journal *a = journal_open(path, NULL, NULL, &err);
    CHECK(a != NULL);
    CHECK_EQ_INT(journal_append(a, 1, "a", 1, true), 0);
    journal *b = journal_open(path, NULL, NULL, &err);
    CHECK(b == NULL);
    CHECK_EQ_INT(err, DFLASH_EEXISTS);
    journal_destroy(&b);
    journal_destroy(&a);
    seen s = {0};
    b = journal_open(path, collect, &s, &err);
    CHECK(b != NULL);
    CHECK_EQ_INT(s.n, 1);
    journal_destroy(&b);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/test_journal.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) return 2;
    snprintf(path, sizeof path, "%s/ledger.journal", dir);
    test_roundtrip();
    test_torn_tail();
    test_garbled_tail();
    test_corrupt();
    test_rewrite();
    test_writer();
    test_writer_heals();
    test_inline_sync_failure();
    test_writer_fail_after_rewrite();
    test_writer_failed_compaction_size();
    test_writer_write_fail_syncs_before();
    test_writer_rewrite_dir_unsynced();
    unlink(path);
    test_single_owner();
    test_rmtree(dir); /* the journals' .lock files stay beside them */
    CHECK_DONE();
}
