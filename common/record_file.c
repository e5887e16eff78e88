/* record_file: see record_file.h.
 *
 * State: the file descriptor (O_APPEND), `whole`, the file's size at the end of its last whole
 * record (what a failed write is cut back to; taken from the file before each write, so that a
 * file cut or rotated from outside is not grown back with zeros), and the buffer of records not
 * yet written.
 * `failing` is set by a failed write and cleared by the next write that succeeds; while it is
 * set, adding records does not write (only record_file_flush retries), so a full disk costs one
 * failed write per flush, not one per record.
 */
#include "record_file.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RECORD_FILE_WRITE_AT (64u * 1024)

struct record_file {
    int fd;
    char *path;
    off_t whole;
    unsigned char *buf;
    size_t len, cap;
    bool failing;
    uint64_t dropped, dropped_said;
};

record_file *record_file_open(const char *path, bool create_new)
{
    int flags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | (create_new ? O_EXCL : 0);
    int fd = open(path, flags, 0644);
    if (fd < 0) return NULL;
    struct stat st;
    record_file *f = calloc(1, sizeof *f);
    if (!f || fstat(fd, &st) != 0 || !(f->path = strdup(path))) {
        int e = f ? errno : ENOMEM;
        close(fd);
        free(f);
        errno = e;
        return NULL;
    }
    f->fd = fd;
    f->whole = st.st_size;
    return f;
}

/* Writes the buffer; on a failure cuts the file back to `whole` (a later flush retries). */
static int write_out(record_file *f)
{
    struct stat st; /* the file's end as it is now (cut or rotated from outside, it moved) */
    if (!f->failing && fstat(f->fd, &st) == 0) f->whole = st.st_size;
    size_t done = 0;
    while (done < f->len) {
        ssize_t w = write(f->fd, f->buf + done, f->len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            /* cut back to the last whole record; retried before the next write if it fails */
            (void)ftruncate(f->fd, f->whole);
            if (!f->failing)
                LOG_ERROR("%s: writing failed: %s; its records wait in memory (up to %u MiB) "
                          "and are written once the disk takes them, the file ending at its "
                          "last whole record meanwhile",
                          f->path, strerror(e), RECORD_FILE_PENDING_MAX >> 20);
            f->failing = true;
            errno = e;
            return DFLASH_EIO;
        }
        done += (size_t)w;
    }
    f->whole += (off_t)f->len;
    f->len = 0;
    if (f->failing) {
        f->failing = false;
        uint64_t lost = f->dropped - f->dropped_said;
        f->dropped_said = f->dropped;
        LOG_INFO("%s: written again (%llu records dropped while the disk refused them)", f->path,
                 (unsigned long long)lost);
    }
    return 0;
}

int record_file_flush(record_file *f)
{
    if (!f) return DFLASH_EINVAL;
    if (f->failing) {
        /* a cut that failed before leaves part of a record: cut again before writing on */
        struct stat st;
        if (fstat(f->fd, &st) != 0 || (st.st_size != f->whole && ftruncate(f->fd, f->whole) != 0))
            return DFLASH_EIO;
    }
    return f->len ? write_out(f) : 0;
}

int record_file_add(record_file *f, const void *const *parts, const size_t *lens, int n_parts)
{
    if (!f || n_parts < 0) return DFLASH_EINVAL;
    size_t n = 0;
    for (int i = 0; i < n_parts; i++) n += lens[i];
    if (f->len + n > RECORD_FILE_PENDING_MAX) {
        f->dropped++;
        return DFLASH_EFULL;
    }
    if (f->len + n > f->cap) {
        size_t cap = f->cap ? f->cap : RECORD_FILE_WRITE_AT;
        while (cap < f->len + n) cap *= 2;
        unsigned char *b = realloc(f->buf, cap);
        if (!b) return DFLASH_ENOMEM;
        f->buf = b;
        f->cap = cap;
    }
    for (int i = 0; i < n_parts; i++) {
        memcpy(f->buf + f->len, parts[i], lens[i]);
        f->len += lens[i];
    }
    return f->len >= RECORD_FILE_WRITE_AT && !f->failing ? write_out(f) : 0;
}

int record_file_sync(record_file *f)
{
    int rc = record_file_flush(f);
    if (rc) return rc;
    if (fsync(f->fd) == 0) return 0;
    LOG_ERROR("%s: fsync failed: %s (its records may not outlive a power loss)", f->path,
              strerror(errno));
    return DFLASH_EIO;
}

size_t record_file_pending(const record_file *f) { return f ? f->len : 0; }

uint64_t record_file_dropped(const record_file *f) { return f ? f->dropped : 0; }

const char *record_file_path(const record_file *f) { return f ? f->path : NULL; }

int record_file_close(record_file **fp)
{
    if (!fp || !*fp) return 0;
    record_file *f = *fp;
    int rc = record_file_flush(f);
    if (rc && f->len)
        LOG_ERROR("%s: %zu bytes of records could not be written before closing: lost", f->path,
                  f->len);
    if (close(f->fd) != 0 && !rc) rc = DFLASH_EIO;
    free(f->buf);
    free(f->path);
    free(f);
    *fp = NULL;
    return rc;
}
