/* journal: an append-only file of typed, checksummed records (format and rules in journal.h).
 *
 * Structure: one open file descriptor positioned at the end of the last valid record; size and
 * record counters of the file in use (in writer mode: plus what is queued for it, and while a
 * rewrite is queued, as if it will succeed; take_progress sets them from what the writer reports
 * once none is, so a failed rewrite leaves the long file's). A failed write leaves
 * `broken` set: the on-disk tail may be torn, and every later append fails with DFLASH_EIO
 * rather than writing after garbage (the next open cuts the torn tail). A rewrite that succeeds
 * clears it: the new file replaces the torn one and holds everything (journal.h, "Healing").
 *
 * Writer mode (journal.h): a FIFO of jobs (one encoded record, a whole new file image for a
 * rewrite, or a barrier: no bytes, only a sync of what came before it) guarded by `mu`; the writer thread owns `fd` and `path` from journal_writer_start to
 * journal_writer_stop and reports w_done/w_fail/w_broken under `mu`; the loop thread copies them
 * into done_seq/fail_seq/broken (and w_why, the reason, into why) in the uv_async callback.
 * The writer keeps w_size/w_records (the file in use, as written) and w_bytes/w_recs (appends
 * it has taken, written or not); the owner counts q_bytes/q_records (appends queued).
 * While w_broken, appends are refused unless a rewrite is queued (w_rewrites: rewrite jobs not
 * yet reported): records queued behind a rewrite are written if it heals the journal.
 * Owner-thread fields: seq, size, records, done_seq, fail_seq, broken, why, rewrite_seq. A memory
 * journal (`is_mem`) is the image a rewrite emits into in writer mode. Called by ledger.c.
 */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc.h"
#include "err.h"
#include "fsutil.h"
#include "log.h"

typedef struct jjob {
    struct jjob *next;
    uint64_t seq;
    bool sync;     /* fdatasync before it counts as done */
    bool rewrite;  /* buf is a whole new file (header + records) */
    bool barrier;  /* journal_barrier: no bytes, only the sync (with sync set) */
    size_t len;
    uint64_t records; /* rewrite: records in the image */
    uint8_t *buf;  /* owned */
} jjob;

struct journal {
    int fd;
    int lock_fd; /* "<path>.lock", flock'ed for the journal's lifetime (one owner at a time) */
    char *path;
    uint64_t size;
    uint64_t records;
    uint64_t torn;
    bool broken;
    bool dir_unsynced; /* fd's owner: a compaction's rename is not yet durable (sync_journal) */
    char why[160];                    /* owner thread: the first failure, when broken */
    uint64_t seq, done_seq, fail_seq; /* owner thread */
    uint64_t rewrite_seq;             /* owner thread: the last rewrite queued (writer mode) */
    uint64_t q_bytes, q_records;      /* owner thread: appends queued (writer mode) */
    uint64_t rewrite_fails;           /* owner thread: rewrites that failed here, and ... */
    uint64_t rewrite_fails_seen;      /* ... in the writer, as last reported */
    journal_sync_fn sync_fn;
    void *sync_ctx;
    /* memory image (a rewrite's emit target in writer mode) */
    bool is_mem;
    uint8_t *mem;
    size_t mem_len, mem_cap;
    /* writer mode */
    bool writer;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    jjob *head, *tail;          /* under mu */
    bool stop;                  /* under mu */
    uint64_t w_done, w_fail;    /* under mu, written by the writer thread */
    bool w_broken;              /* under mu */
    uint32_t w_rewrites;        /* under mu: rewrite jobs queued and not yet reported */
    uint64_t w_size, w_records; /* under mu: the file in use, as written */
    uint64_t w_bytes, w_recs;   /* under mu: appends taken (written or not) */
    uint64_t w_rewrite_fails;   /* under mu: rewrites the writer failed to write */
    char w_why[160];            /* under mu: the writer's first failure */
    uv_async_t *async;
    journal_done_fn done_fn;
    void *done_ctx;
};

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

static void fill_header(uint8_t h[JOURNAL_HEADER_BYTES])
{
    memset(h, 0, JOURNAL_HEADER_BYTES);
    memcpy(h, JOURNAL_MAGIC, 8);
    put_u32(h + 8, JOURNAL_VERSION);
}

static int write_header(int fd)
{
    uint8_t h[JOURNAL_HEADER_BYTES];
    fill_header(h);
    return write_all(fd, h, sizeof h);
}

static int do_sync(journal_sync_fn fn, void *ctx, int fd)
{
    if (fn) return fn(ctx, fd) == 0 ? 0 : DFLASH_EIO;
    return fdatasync(fd) == 0 ? 0 : DFLASH_EIO;
}

/* Encodes one record (header, payload, CRC) into rec (total bytes). */
static void encode(uint8_t *rec, uint16_t type, const void *payload, uint32_t len)
{
    put_u32(rec, len);
    put_u16(rec + 4, type);
    put_u16(rec + 6, 0);
    if (len) memcpy(rec + 8, payload, len);
    put_u32(rec + 8 + len, crc32_ieee(0, rec, 8 + (uint64_t)len));
}

/* The reason a failed sync_journal (code rc) gives, into why: errno's text, or rc's when the
 * sync hook set no errno (the caller zeroes errno before the sync). */
static void sync_failure(char *why, size_t len, int rc)
{
    snprintf(why, len, "fdatasync failed: %s", errno ? strerror(errno) : err_str(rc));
}

/* Syncs the journal's file (fd): the data, and once after a compaction whose directory fsync
 * failed, the directory too, so that the rename is durable before any record the new file holds
 * counts as durable (those that follow it, and in writer mode those queued before it in its
 * batch). Called by whichever thread owns fd. */
static int sync_journal(journal *j, journal_sync_fn fn, void *ctx, int fd)
{
    int rc = do_sync(fn, ctx, fd);
    if (rc == 0 && j->dir_unsynced) {
        if (fs_sync_parent_dir(j->path) != 0) return DFLASH_EIO;
        j->dir_unsynced = false;
    }
    return rc;
}

/* After the rename of a compaction: fsyncs the directory, or leaves that to the next sync. */
static void sync_dir_after_rename(journal *j)
{
    if (fs_sync_parent_dir(j->path) == 0) return;
    j->dir_unsynced = true;
    LOG_WARN("journal %s: cannot fsync its directory after compaction (%s): the next sync "
             "tries again and fails if it cannot", j->path, strerror(errno));
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

/* True when a whole record with a matching CRC starts in buf[from, len): what follows a bad
 * record is then more than a torn tail. Only a bad record's tail is scanned (at open). */
static bool record_after(const uint8_t *buf, uint64_t from, uint64_t len)
{
    for (uint64_t p = from; p + JOURNAL_RECORD_OVERHEAD <= len; p++) {
        uint32_t plen = get_u32(buf + p);
        if (plen > JOURNAL_MAX_PAYLOAD || plen + JOURNAL_RECORD_OVERHEAD > len - p) continue;
        if (crc32_ieee(0, buf + p, 8 + (uint64_t)plen) == get_u32(buf + p + 8 + plen))
            return true;
    }
    return false;
}

/* Walks the records of buf, replaying each valid one; sets *good to the end of the last valid
 * record. A bad record (a length past the end or over the maximum, or a checksum mismatch) with
 * no whole record after it is a torn tail: what a crash leaves of appends not yet fsynced, which
 * some file systems fill with zeros or stale blocks. A bad record followed by a whole record is
 * corruption: a later fsync made everything before it durable. */
static int replay(journal *j, const uint8_t *buf, uint64_t len, journal_replay_fn fn, void *ctx,
                  uint64_t *good, bool *garbled)
{
    *garbled = false;
    uint64_t off = JOURNAL_HEADER_BYTES;
    while (off < len) {
        uint64_t left = len - off;
        if (left < JOURNAL_RECORD_OVERHEAD) break; /* torn: not even a header and CRC */
        uint32_t plen = get_u32(buf + off);
        uint16_t type = get_u16(buf + off + 4);
        uint64_t rlen = (uint64_t)plen + JOURNAL_RECORD_OVERHEAD;
        const char *bad = NULL;
        if (plen > JOURNAL_MAX_PAYLOAD) bad = "claims more than the largest record";
        else if (rlen > left) bad = "runs past the end";
        else if (crc32_ieee(0, buf + off, 8 + (uint64_t)plen) != get_u32(buf + off + 8 + plen))
            bad = "fails its checksum";
        if (bad) {
            if (!record_after(buf, off + 1, len)) { /* torn */
                *garbled = rlen <= left || plen > JOURNAL_MAX_PAYLOAD; /* not a short write */
                break;
            }
            LOG_ERROR("journal %s: the record at byte %llu (%u bytes) %s, and whole records "
                      "follow it", j->path, (unsigned long long)off, plen, bad);
            /* Not a torn tail by this rule (a later sync made what came before it durable),
             * but appends not yet synced are written page by page: a power loss may keep a
             * later page of them and lose an earlier one. What to do, said where it is met. */
            LOG_ERROR("journal %s: if the broker's host lost power, the bytes from %llu on may "
                      "be appends that were never synced, with a page of them lost: keep a copy "
                      "and cut the journal there (cp %s %s.before-cut && truncate -s %llu %s); "
                      "the broker then starts from the records before it (a drafter's resume "
                      "rewinds what they lack). Otherwise the file is damaged: restore it, or "
                      "move it aside to start the plan over", j->path, (unsigned long long)off,
                      j->path, j->path, (unsigned long long)off, j->path);
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

/* A tail that is not a short final write (zeros or stale blocks where unsynced appends were, or
 * a whole record failing its checksum) is cut like a torn record, but its bytes are kept in
 * "<path>.torn-<offset>" first, for whoever wants to look. */
static void save_torn_tail(const char *path, const uint8_t *tail, uint64_t n, uint64_t at)
{
    char keep[4096];
    snprintf(keep, sizeof keep, "%s.torn-%llu", path, (unsigned long long)at);
    bool kept = fs_write_atomic_mode(keep, tail, n, 0600) == 0; /* the journal's own mode */
    LOG_WARN("journal %s: cutting %llu bytes at byte %llu that hold no whole record (what a crash "
             "leaves of appends not yet fsynced); %s %s", path, (unsigned long long)n,
             (unsigned long long)at, kept ? "kept in" : "cannot keep them:",
             kept ? keep : strerror(errno));
}

/* One process at a time may own the journal: a second broker started on it would cut what it
 * takes for a torn tail of the first one's append and write over its records. The lock is on a
 * side file, as a rewrite renames a new file over the journal; the kernel drops it when its
 * owner dies, SIGKILL included, so a restart never finds it stale. */
static int lock_owner(journal *j)
{
    size_t n = strlen(j->path) + sizeof ".lock";
    char *lock_path = malloc(n);
    if (!lock_path) return DFLASH_ENOMEM;
    snprintf(lock_path, n, "%s.lock", j->path);
    int rc = 0;
    j->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (j->lock_fd < 0) {
        LOG_ERROR("journal %s: cannot open %s: %s", j->path, lock_path, strerror(errno));
        rc = DFLASH_EIO;
    } else if (flock(j->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            LOG_ERROR("journal %s is in use by another process (%s is locked): is another "
                      "dflash-queue running with this journal or runtime dir?",
                      j->path, lock_path);
            rc = DFLASH_EEXISTS;
        } else {
            LOG_ERROR("journal %s: cannot lock %s: %s", j->path, lock_path, strerror(errno));
            rc = DFLASH_EIO;
        }
    }
    free(lock_path);
    return rc;
}

static bool all_zero(const uint8_t *buf, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        if (buf[i]) return false;
    return true;
}

journal *journal_open(const char *path, journal_replay_fn fn, void *ctx, int *err)
{
    int rc = DFLASH_ENOMEM;
    uint8_t *buf = NULL;
    journal *j = calloc(1, sizeof *j);
    if (!j) goto fail;
    j->fd = -1;
    j->lock_fd = -1;
    j->path = strdup(path);
    if (!j->path) goto fail;
    if ((rc = lock_owner(j))) goto fail;
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
    if (len <= JOURNAL_HEADER_BYTES && all_zero(buf, len)) {
        /* A power loss while the file was created can leave its size without its bytes: no
         * record follows a header that was never synced, so it starts anew. */
        if (len > 0)
            LOG_WARN("journal %s: %llu zero bytes where the header belongs (a power loss "
                     "while it was created): starting it anew",
                     path, (unsigned long long)len);
        len = 0;
    }
    if (len < JOURNAL_HEADER_BYTES) {
        /* New file, or a crash while writing the header: no record can exist yet. */
        if (len > 0 && memcmp(buf, JOURNAL_MAGIC, len < 8 ? len : 8) != 0) {
            LOG_ERROR("journal %s: not a journal (bad magic)", path);
            rc = DFLASH_EFORMAT;
            goto fail;
        }
        if (ftruncate(j->fd, 0) != 0 || lseek(j->fd, 0, SEEK_SET) != 0 ||
            write_header(j->fd) != 0 || fdatasync(j->fd) != 0 ||
            fs_sync_parent_dir(path) != 0) { /* a new file's name must last too */
            LOG_ERROR("journal %s: cannot start it: %s", path, strerror(errno));
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
        bool garbled;
        rc = replay(j, buf, len, fn, ctx, &good, &garbled);
        if (rc) goto fail;
        if (good < len) {
            j->torn = len - good;
            if (garbled) save_torn_tail(path, buf + good, j->torn, good);
            else
                LOG_WARN("journal %s: ignoring a torn final record (%llu bytes at byte %llu)",
                         path, (unsigned long long)j->torn, (unsigned long long)good);
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
    journal_writer_stop(j);
    if (j->fd >= 0) close(j->fd);
    if (j->lock_fd >= 0) close(j->lock_fd);
    free(j->mem);
    free(j->path);
    free(j);
    *jp = NULL;
}

static int mem_append(journal *j, uint16_t type, const void *payload, uint32_t len, size_t total)
{
    if (j->mem_len + total > j->mem_cap) {
        size_t cap = j->mem_cap ? j->mem_cap : 4096;
        while (cap < j->mem_len + total) cap *= 2;
        uint8_t *m = realloc(j->mem, cap);
        if (!m) return DFLASH_ENOMEM;
        j->mem = m;
        j->mem_cap = cap;
    }
    encode(j->mem + j->mem_len, type, payload, len);
    j->mem_len += total;
    return 0;
}

/* Writer mode: queues a job. Takes ownership of job (freed on failure). A broken journal
 * takes rewrites (each may heal it) and the appends queued behind one. */
static int enqueue(journal *j, jjob *job)
{
    pthread_mutex_lock(&j->mu);
    if (j->w_broken && !job->rewrite && !j->w_rewrites) {
        pthread_mutex_unlock(&j->mu);
        free(job->buf);
        free(job);
        j->broken = true;
        return DFLASH_EIO;
    }
    if (job->rewrite) j->w_rewrites++;
    job->seq = ++j->seq;
    job->next = NULL;
    if (j->tail) j->tail->next = job;
    else j->head = job;
    j->tail = job;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int journal_append(journal *j, uint16_t type, const void *payload, uint32_t len, bool sync)
{
    if (len > JOURNAL_MAX_PAYLOAD || (len && !payload)) return DFLASH_EINVAL;
    if (j->broken && !j->writer) return DFLASH_EIO; /* writer mode: enqueue decides */
    size_t total = (size_t)len + JOURNAL_RECORD_OVERHEAD;
    int rc;
    if (j->is_mem) {
        if ((rc = mem_append(j, type, payload, len, total))) return rc;
    } else if (j->writer) {
        jjob *job = calloc(1, sizeof *job);
        uint8_t *buf = job ? malloc(total) : NULL;
        if (!buf) {
            free(job);
            return DFLASH_ENOMEM;
        }
        encode(buf, type, payload, len);
        job->buf = buf;
        job->len = total;
        job->sync = sync;
        if ((rc = enqueue(j, job))) return rc;
        j->q_bytes += total;
        j->q_records++;
    } else {
        uint8_t small[256];
        uint8_t *rec = total <= sizeof small ? small : malloc(total);
        if (!rec) return DFLASH_ENOMEM;
        encode(rec, type, payload, len);
        j->seq++;
        /* One write per record keeps a crash's damage to the final record. */
        rc = write_all(j->fd, rec, total);
        if (rec != small) free(rec);
        bool synced = false;
        if (rc == 0 && sync) {
            errno = 0; /* a sync hook may fail without saying why */
            rc = sync_journal(j, j->sync_fn, j->sync_ctx, j->fd);
            synced = true;
        }
        if (rc) { /* worded as the writer thread words it */
            if (synced)
                sync_failure(j->why, sizeof j->why, rc);
            else
                snprintf(j->why, sizeof j->why, "append failed: %s", strerror(errno));
            LOG_ERROR("journal %s: %s", j->path, j->why);
            j->broken = true;
            if (!j->fail_seq) j->fail_seq = j->seq;
            j->done_seq = j->seq; /* processed (and failed): nobody waits for it */
            return rc;
        }
        j->done_seq = j->seq;
    }
    j->size += total;
    j->records++;
    return 0;
}

int journal_sync(journal *j)
{
    if (j->writer) return DFLASH_ESTATE;
    if (j->broken) return DFLASH_EIO;
    return sync_journal(j, j->sync_fn, j->sync_ctx, j->fd);
}

int journal_barrier(journal *j)
{
    if (j->is_mem) return 0;
    if (!j->writer) return journal_sync(j);
    jjob *job = calloc(1, sizeof *job);
    if (!job) return DFLASH_ENOMEM;
    job->barrier = job->sync = true;
    return enqueue(j, job); /* counted in no size or record total */
}

/* Writer mode: emit into a memory image and queue it as one rewrite job. */
static int rewrite_queued(journal *j, int (*emit)(void *ctx, journal *tmp), void *ctx)
{
    journal *t = calloc(1, sizeof *t);
    if (!t) return DFLASH_ENOMEM;
    t->fd = -1;
    t->is_mem = true;
    t->mem = malloc(4096);
    int rc = DFLASH_ENOMEM;
    if (!t->mem) goto out;
    t->mem_cap = 4096;
    fill_header(t->mem);
    t->mem_len = t->size = JOURNAL_HEADER_BYTES;
    rc = emit(ctx, t);
    if (rc) goto out;
    jjob *job = calloc(1, sizeof *job);
    if (!job) {
        rc = DFLASH_ENOMEM;
        goto out;
    }
    job->rewrite = true;
    job->buf = t->mem;
    job->len = t->mem_len;
    job->records = t->records;
    t->mem = NULL;
    if ((rc = enqueue(j, job))) goto out;
    j->rewrite_seq = j->seq;
    j->size = t->size;
    j->records = t->records;
out:
    free(t->mem);
    free(t);
    return rc;
}

/* Writer thread: writes a rewrite image to "<path>.tmp", fsyncs, renames it over path and
 * continues on it. On failure the old file stays in use. */
static int write_new_file(journal *j, const uint8_t *buf, size_t len, journal_sync_fn fn,
                          void *fctx)
{
    size_t plen = strlen(j->path);
    char *tmp_path = malloc(plen + 5);
    if (!tmp_path) return DFLASH_ENOMEM;
    memcpy(tmp_path, j->path, plen);
    memcpy(tmp_path + plen, ".tmp", 5);
    int rc = DFLASH_EIO;
    int fd = fs_create_new(tmp_path, O_RDWR, 0600); /* ours under the journal lock */
    if (fd < 0) goto out;
    if (write_all(fd, buf, len) != 0 || do_sync(fn, fctx, fd) != 0 ||
        rename(tmp_path, j->path) != 0) {
        close(fd);
        unlink(tmp_path);
        goto out;
    }
    sync_dir_after_rename(j);
    close(j->fd);
    j->fd = fd;
    rc = 0;
out:
    free(tmp_path);
    return rc;
}

/* The journal holds everything again (a rewrite of the whole state succeeded). Owner thread,
 * inline mode; the writer clears its own fields. */
static void heal(journal *j)
{
    if (!j->broken) return;
    LOG_DEBUG("journal %s: rewritten whole after \"%s\"", j->path, j->why);
    j->broken = false;
    j->why[0] = '\0';
    j->fail_seq = 0;
}

/* Inline mode: the whole rewrite on the caller's thread. */
static int rewrite_inline(journal *j, int (*emit)(void *ctx, journal *tmp), void *ctx)
{
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
    t->fd = fs_create_new(tmp_path, O_RDWR, 0600); /* ours under the journal lock */
    if (t->fd < 0) goto out_tmp;
    if (write_header(t->fd) != 0) goto out_unlink;
    t->size = JOURNAL_HEADER_BYTES;
    rc = emit(ctx, t);
    if (rc) goto out_unlink;
    if (t->broken || do_sync(j->sync_fn, j->sync_ctx, t->fd) != 0) {
        rc = DFLASH_EIO;
        goto out_unlink;
    }
    if (rename(tmp_path, j->path) != 0) {
        rc = DFLASH_EIO;
        goto out_unlink;
    }
    sync_dir_after_rename(j); /* make the rename durable */
    close(j->fd);
    j->fd = t->fd;
    j->size = t->size;
    j->records = t->records;
    t->fd = -1;
    heal(j);
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

int journal_rewrite(journal *j, int (*emit)(void *ctx, journal *tmp), void *ctx)
{
    int rc;
    if (j->writer) {
        if (j->broken && j->rewrite_seq > j->done_seq) return 0; /* one is under way */
        rc = rewrite_queued(j, emit, ctx);
    } else {
        rc = rewrite_inline(j, emit, ctx);
    }
    if (rc) j->rewrite_fails++;
    return rc;
}

uint64_t journal_rewrite_failures(const journal *j)
{
    return j->rewrite_fails + j->rewrite_fails_seen;
}

uint64_t journal_size(const journal *j) { return j->size; }
uint64_t journal_records(const journal *j) { return j->records; }
uint64_t journal_torn_bytes(const journal *j) { return j->torn; }

/* --- writer mode ---------------------------------------------------------------------------- */

void journal_set_sync_hook(journal *j, journal_sync_fn fn, void *ctx)
{
    if (j->writer) pthread_mutex_lock(&j->mu); /* the writer reads it per batch */
    j->sync_fn = fn;
    j->sync_ctx = ctx;
    if (j->writer) pthread_mutex_unlock(&j->mu);
}

static void *writer_main(void *arg)
{
    journal *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (!j->head && !j->stop) pthread_cond_wait(&j->cv, &j->mu);
        if (!j->head) break; /* stop, and everything written */
        jjob *batch = j->head;
        j->head = j->tail = NULL;
        bool broken = j->w_broken;
        journal_sync_fn sync_fn = j->sync_fn;
        void *sync_ctx = j->sync_ctx;
        uint64_t size = j->w_size, records = j->w_records, taken_bytes = 0, taken = 0;
        pthread_mutex_unlock(&j->mu);

        uint64_t unsynced = batch->seq, last = 0, fail = 0;
        uint32_t rewrites = 0, rewrite_fails = 0;
        bool need_sync = false, healed = false;
        char why[160] = "";
        while (batch) {
            jjob *x = batch;
            batch = x->next;
            last = x->seq;
            if (!x->rewrite && !x->barrier) {
                taken_bytes += x->len;
                taken++;
            }
            if (x->rewrite) {
                rewrites++;
                int rc = write_new_file(j, x->buf, x->len, sync_fn, sync_ctx);
                if (rc == 0) {
                    /* the fsynced image holds every record before it, the failed ones too (it
                     * was taken from memory after they were applied): the journal is whole,
                     * once its rename is durable. A directory fsync that failed is the batch's
                     * sync to retry, and what the image holds counts as unsynced until it
                     * succeeds (defect: a sync record before the rewrite was reported durable
                     * while the old, unsynced file could still be the one a power loss left) */
                    size = x->len;
                    records = x->records;
                    need_sync = j->dir_unsynced;
                    if (!j->dir_unsynced) unsynced = x->seq + 1;
                    healed |= broken;
                    broken = false;
                    fail = 0;
                    why[0] = '\0';
                } else {
                    rewrite_fails++;
                    if (broken)
                        LOG_DEBUG("journal %s: rewrite failed (%s); still broken", j->path,
                                  err_str(rc));
                    else
                        LOG_WARN("journal %s: compaction failed (%s); keeping the long journal",
                                 j->path, err_str(rc));
                }
            } else if (broken) {
                /* nothing after a failure is written, until a rewrite heals the journal */
            } else if (x->barrier) {
                need_sync = true; /* the batch's one fdatasync covers every byte written */
            } else if (write_all(j->fd, x->buf, x->len) != 0) {
                snprintf(why, sizeof why, "append failed: %s", strerror(errno));
                LOG_ERROR("journal %s: %s", j->path, why);
                broken = true;
                fail = x->seq;
                /* the records before it that asked for a sync get it now (defect: the batch's
                 * sync was skipped, and they were reported durable); if it fails, nothing of
                 * the batch since its last rewrite is */
                errno = 0;
                if (need_sync && sync_journal(j, sync_fn, sync_ctx, j->fd) != 0) fail = unsynced;
                need_sync = false;
            } else {
                size += x->len;
                records++;
                need_sync |= x->sync;
            }
            free(x->buf);
            free(x);
        }
        errno = 0; /* a sync hook may fail without saying why */
        int src = !broken && need_sync ? sync_journal(j, sync_fn, sync_ctx, j->fd) : 0;
        if (src) {
            sync_failure(why, sizeof why, src);
            LOG_ERROR("journal %s: %s", j->path, why);
            broken = true;
            fail = unsynced; /* nothing of this batch since its last rewrite is durable */
        }

        pthread_mutex_lock(&j->mu);
        j->w_done = last;
        j->w_rewrites -= rewrites;
        j->w_rewrite_fails += rewrite_fails;
        j->w_size = size;
        j->w_records = records;
        j->w_bytes += taken_bytes;
        j->w_recs += taken;
        if (healed) {
            j->w_fail = 0;
            j->w_why[0] = '\0';
        }
        if (fail && !j->w_fail) j->w_fail = fail;
        if (why[0] && !j->w_why[0]) memcpy(j->w_why, why, sizeof why);
        j->w_broken = broken;
        uv_async_send(j->async);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Copies the writer's progress to the owner's fields (the writer's are the truth: a failure
 * there is sticky until a rewrite heals it). Loop thread. */
static void take_progress(journal *j)
{
    pthread_mutex_lock(&j->mu);
    j->done_seq = j->w_done;
    j->fail_seq = j->w_fail;
    j->broken = j->w_broken;
    memcpy(j->why, j->w_why, sizeof j->why);
    j->rewrite_fails_seen = j->w_rewrite_fails;
    if (j->rewrite_seq <= j->done_seq) { /* no rewrite in flight: the file in use, and its queue */
        j->size = j->w_size + (j->q_bytes - j->w_bytes);
        j->records = j->w_records + (j->q_records - j->w_recs);
    }
    pthread_mutex_unlock(&j->mu);
}

static void on_async(uv_async_t *h)
{
    journal *j = h->data;
    if (!j) return; /* closing */
    take_progress(j);
    if (j->done_fn) j->done_fn(j->done_ctx, j->done_seq, j->fail_seq);
}

static void free_handle(uv_handle_t *h) { free(h); }

int journal_writer_start(journal *j, uv_loop_t *loop, journal_done_fn done, void *ctx)
{
    if (j->writer || j->is_mem) return DFLASH_EINVAL;
    j->async = calloc(1, sizeof *j->async);
    if (!j->async) return DFLASH_ENOMEM;
    if (uv_async_init(loop, j->async, on_async) != 0) {
        free(j->async);
        j->async = NULL;
        return DFLASH_EINTERNAL;
    }
    j->async->data = j;
    j->done_fn = done;
    j->done_ctx = ctx;
    j->w_done = j->done_seq = j->seq;
    j->w_fail = j->fail_seq;
    j->w_broken = j->broken;
    j->w_rewrites = 0;
    j->w_size = j->size;
    j->w_records = j->records;
    j->w_rewrite_fails = j->rewrite_fails_seen;
    j->q_bytes = j->q_records = j->w_bytes = j->w_recs = 0;
    memcpy(j->w_why, j->why, sizeof j->why);
    j->stop = false;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    if (pthread_create(&j->thread, NULL, writer_main, j) != 0) {
        pthread_cond_destroy(&j->cv);
        pthread_mutex_destroy(&j->mu);
        j->async->data = NULL;
        uv_close((uv_handle_t *)j->async, free_handle);
        j->async = NULL;
        return DFLASH_EINTERNAL;
    }
    j->writer = true;
    return 0;
}

void journal_writer_stop(journal *j)
{
    if (!j || !j->writer) return;
    pthread_mutex_lock(&j->mu);
    j->stop = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_join(j->thread, NULL);
    take_progress(j);
    j->async->data = NULL;
    uv_close((uv_handle_t *)j->async, free_handle);
    j->async = NULL;
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    j->writer = false;
}

uint64_t journal_last_seq(const journal *j) { return j->seq; }
uint64_t journal_done_seq(const journal *j) { return j->done_seq; }
uint64_t journal_fail_seq(const journal *j) { return j->fail_seq; }

const char *journal_failure(const journal *j)
{
    if (!j->broken) return NULL;
    return j->why[0] ? j->why : "a write failed";
}
