/* journal: an append-only file of typed, checksummed records (format and rules in journal.h).
 *
 * Structure: one open file descriptor positioned at the end of the last valid record; size and
 * record counters. A failed write leaves `broken` set: the on-disk tail may be torn, and every
 * later append fails with DFLASH_EIO rather than writing after garbage (the next open cuts the
 * torn tail). Thread: the broker's loop thread only. Called by ledger.c.
 */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "log.h"

struct journal {
    int fd;
    char *path;
    uint64_t size;
    uint64_t records;
    uint64_t torn;
    bool broken;
};

uint32_t journal_crc32(uint32_t crc, const void *data, uint64_t len)
{
    static uint32_t table[256];
    static bool ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = true;
    }
    const uint8_t *p = data;
    crc = ~crc;
    for (uint64_t i = 0; i < len; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return DFLASH_EIO;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int write_header(int fd)
{
    uint8_t h[JOURNAL_HEADER_BYTES] = {0};
    memcpy(h, JOURNAL_MAGIC, 8);
    put_u32(h + 8, JOURNAL_VERSION);
    return write_all(fd, h, sizeof h);
}

/* Reads the whole file into memory (journals are compacted, so this stays modest). */
static int read_file(int fd, uint8_t **out, uint64_t *len)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return DFLASH_EIO;
    uint64_t n = (uint64_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return DFLASH_ENOMEM;
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            return DFLASH_EIO;
        }
        got += (uint64_t)r;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* Walks the records of buf, replaying each valid one; sets *good to the end of the last valid
 * record. A bad record at the very end is a torn tail; a bad record followed by more bytes is
 * corruption. */
static int replay(journal *j, const uint8_t *buf, uint64_t len, journal_replay_fn fn, void *ctx,
                  uint64_t *good)
{
    uint64_t off = JOURNAL_HEADER_BYTES;
    while (off < len) {
        uint64_t left = len - off;
        if (left < JOURNAL_RECORD_OVERHEAD) break; /* torn: not even a header and CRC */
        uint32_t plen = get_u32(buf + off);
        uint16_t type = get_u16(buf + off + 4);
        if (plen > JOURNAL_MAX_PAYLOAD) {
            LOG_ERROR("journal %s: record at byte %llu claims %u bytes", j->path,
                      (unsigned long long)off, plen);
            return DFLASH_ECORRUPT;
        }
        uint64_t rlen = (uint64_t)plen + JOURNAL_RECORD_OVERHEAD;
        if (rlen > left) break; /* torn: the record runs past the end */
        uint32_t want = get_u32(buf + off + 8 + plen);
        uint32_t crc = journal_crc32(0, buf + off, 8 + (uint64_t)plen);
        if (crc != want) {
            if (off + rlen == len) break; /* the final record: torn */
            LOG_ERROR("journal %s: checksum mismatch at byte %llu with %llu bytes after it",
                      j->path, (unsigned long long)off, (unsigned long long)(len - off - rlen));
            return DFLASH_ECORRUPT;
        }
        if (fn) {
            int rc = fn(ctx, type, buf + off + 8, plen);
            if (rc < 0) return rc;
        }
        j->records++;
        off += rlen;
    }
    *good = off < len ? off : len;
    return 0;
}

journal *journal_open(const char *path, journal_replay_fn fn, void *ctx, int *err)
{
    int rc = DFLASH_ENOMEM;
    uint8_t *buf = NULL;
    journal *j = calloc(1, sizeof *j);
    if (!j) goto fail;
    j->fd = -1;
    j->path = strdup(path);
    if (!j->path) goto fail;
    j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (j->fd < 0) {
        LOG_ERROR("journal %s: cannot open: %s", path, strerror(errno));
        rc = DFLASH_EIO;
        goto fail;
    }
    uint64_t len = 0;
    rc = read_file(j->fd, &buf, &len);
    if (rc) goto fail;
    uint64_t good = JOURNAL_HEADER_BYTES;
    if (len < JOURNAL_HEADER_BYTES) {
        /* New file, or a crash while writing the header: no record can exist yet. */
        if (len > 0 && memcmp(buf, JOURNAL_MAGIC, len < 8 ? len : 8) != 0) {
            LOG_ERROR("journal %s: not a journal (bad magic)", path);
            rc = DFLASH_EFORMAT;
            goto fail;
        }
        if (ftruncate(j->fd, 0) != 0 || lseek(j->fd, 0, SEEK_SET) != 0 ||
            write_header(j->fd) != 0 || fdatasync(j->fd) != 0) {
            rc = DFLASH_EIO;
            goto fail;
        }
        len = JOURNAL_HEADER_BYTES;
    } else {
        if (memcmp(buf, JOURNAL_MAGIC, 8) != 0) {
            LOG_ERROR("journal %s: not a journal (bad magic)", path);
            rc = DFLASH_EFORMAT;
            goto fail;
        }
        if (get_u32(buf + 8) != JOURNAL_VERSION) {
            LOG_ERROR("journal %s: version %u, this build reads %u", path, get_u32(buf + 8),
                      JOURNAL_VERSION);
            rc = DFLASH_EVERSION;
            goto fail;
        }
        rc = replay(j, buf, len, fn, ctx, &good);
        if (rc) goto fail;
        if (good < len) {
            j->torn = len - good;
            LOG_WARN("journal %s: ignoring a torn final record (%llu bytes at byte %llu)", path,
                     (unsigned long long)j->torn, (unsigned long long)good);
            if (ftruncate(j->fd, (off_t)good) != 0) {
                rc = DFLASH_EIO;
                goto fail;
            }
            len = good;
        }
    }
    if (lseek(j->fd, (off_t)len, SEEK_SET) < 0) {
        rc = DFLASH_EIO;
        goto fail;
    }
    j->size = len;
    free(buf);
    if (err) *err = 0;
    return j;
fail:
    free(buf);
    journal_destroy(&j);
    if (err) *err = rc;
    return NULL;
}

void journal_destroy(journal **jp)
{
    if (!jp || !*jp) return;
    journal *j = *jp;
    if (j->fd >= 0) close(j->fd);
    free(j->path);
    free(j);
    *jp = NULL;
}

int journal_append(journal *j, uint16_t type, const void *payload, uint32_t len, bool sync)
{
    if (len > JOURNAL_MAX_PAYLOAD || (len && !payload)) return DFLASH_EINVAL;
    if (j->broken) return DFLASH_EIO;
    uint8_t small[256];
    size_t total = (size_t)len + JOURNAL_RECORD_OVERHEAD;
    uint8_t *rec = total <= sizeof small ? small : malloc(total);
    if (!rec) return DFLASH_ENOMEM;
    put_u32(rec, len);
    put_u16(rec + 4, type);
    put_u16(rec + 6, 0);
    if (len) memcpy(rec + 8, payload, len);
    put_u32(rec + 8 + len, journal_crc32(0, rec, 8 + (uint64_t)len));
    /* One write per record keeps a crash's damage to the final record. */
    int rc = write_all(j->fd, rec, total);
    if (rec != small) free(rec);
    if (rc == 0 && sync && fdatasync(j->fd) != 0) rc = DFLASH_EIO;
    if (rc) {
        LOG_ERROR("journal %s: append failed: %s", j->path, strerror(errno));
        j->broken = true;
        return rc;
    }
    j->size += total;
    j->records++;
    return 0;
}

int journal_sync(journal *j)
{
    if (j->broken) return DFLASH_EIO;
    return fdatasync(j->fd) == 0 ? 0 : DFLASH_EIO;
}

int journal_rewrite(journal *j, int (*emit)(void *ctx, journal *tmp), void *ctx)
{
    if (j->broken) return DFLASH_EIO;
    size_t plen = strlen(j->path);
    char *tmp_path = malloc(plen + 5);
    if (!tmp_path) return DFLASH_ENOMEM;
    memcpy(tmp_path, j->path, plen);
    memcpy(tmp_path + plen, ".tmp", 5);
    int rc = DFLASH_EIO;
    journal *t = calloc(1, sizeof *t);
    if (!t) {
        rc = DFLASH_ENOMEM;
        goto out_path;
    }
    t->path = tmp_path;
    t->fd = open(tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (t->fd < 0) goto out_tmp;
    if (write_header(t->fd) != 0) goto out_unlink;
    t->size = JOURNAL_HEADER_BYTES;
    rc = emit(ctx, t);
    if (rc) goto out_unlink;
    if (t->broken || fsync(t->fd) != 0) {
        rc = DFLASH_EIO;
        goto out_unlink;
    }
    if (rename(tmp_path, j->path) != 0) {
        rc = DFLASH_EIO;
        goto out_unlink;
    }
    /* Make the rename durable: fsync the directory. Best effort. */
    char *slash = strrchr(j->path, '/');
    int dfd = -1;
    if (slash) {
        *slash = '\0';
        dfd = open(slash == j->path ? "/" : j->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        *slash = '/';
    } else {
        dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    close(j->fd);
    j->fd = t->fd;
    j->size = t->size;
    j->records = t->records;
    t->fd = -1;
    rc = 0;
    goto out_tmp;
out_unlink:
    unlink(tmp_path);
out_tmp:
    if (t && t->fd >= 0) close(t->fd);
    free(t);
out_path:
    free(tmp_path);
    return rc;
}

uint64_t journal_size(const journal *j) { return j->size; }
uint64_t journal_records(const journal *j) { return j->records; }
uint64_t journal_torn_bytes(const journal *j) { return j->torn; }
