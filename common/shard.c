/* shard: reader, writer and set of the tokenised-data shard format described in shard.h.
 *
 * Reader: the whole file is mmapped; shard_open validates the header and every index entry, so
 * later accessors only index into trusted arrays. Writer: records are appended with write() as
 * they come (the index, 16 bytes per sequence, is kept in memory), then the index and the final
 * header are written and the temporary file is fsync'd and renamed. A set is an array of shards
 * plus the cumulative sequence counts used to map a global id to (shard, local id) by binary
 * search. Start-up code; not on a hot path except shard_get/shard_set_get, which are O(1)/O(log n).
 */
#include "shard.h"

#include "crc.h"
#include "dflash_anchor.h"
#include "err.h"
#include "fsutil.h"
#include "log.h"
#include "map_guard.h"
#include "rng.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_ENTRY 16u

struct shard {
    char *path;
    const unsigned char *base;
    size_t size;
    uint64_t n_seqs, n_tokens, index_off;
    uint32_t version, vocab, max_len;
};

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) {
    return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}
static void wr32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void wr64(unsigned char *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Bytes of one record: ids, mask, padding to 4. */
static uint64_t record_bytes(uint32_t len) {
    return ((uint64_t)len * 5 + 3) & ~(uint64_t)3;
}

shard *shard_open(const char *path, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    shard *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->path = strdup(path ? path : "");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        err_fmt(err, errlen, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    s->size = (size_t)sb.st_size;
    if (s->size < SHARD_HEADER_BYTES) {
        err_fmt(err, errlen, "%s: truncated: %zu bytes, shorter than the %u-byte header", path,
             s->size, SHARD_HEADER_BYTES);
        close(fd);
        goto fail;
    }
    void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int why = errno; /* mmap's reason, not close's */
    close(fd);
    if (m == MAP_FAILED) {
        err_fmt(err, errlen, "%s: mmap failed: %s", path, strerror(why));
        goto fail;
    }
    s->base = m;
    map_guard_add(s->base, s->size, path);
    const unsigned char *h = s->base;
    if (memcmp(h, SHARD_MAGIC, 8) != 0) {
        err_fmt(err, errlen, "%s: bad magic: not a dflash shard", path);
        goto fail;
    }
    uint32_t version = rd32(h + 8), hbytes = rd32(h + 12);
    if ((version != 1 && version != SHARD_VERSION) || hbytes != SHARD_HEADER_BYTES) {
        err_fmt(err, errlen,
                "%s: unsupported shard version %u (header %u bytes); this build reads 1 to %u",
                path, version, hbytes, SHARD_VERSION);
        goto fail;
    }
    s->version = version;
    s->n_seqs = rd64(h + 16);
    s->n_tokens = rd64(h + 24);
    s->index_off = rd64(h + 32);
    s->vocab = rd32(h + 40);
    s->max_len = rd32(h + 44);
    if (s->index_off < SHARD_HEADER_BYTES || s->index_off % 8 || s->index_off > s->size ||
        s->n_seqs > (s->size - s->index_off) / INDEX_ENTRY ||
        s->index_off + s->n_seqs * INDEX_ENTRY != s->size) {
        err_fmt(err, errlen,
             "%s: truncated or inconsistent: %zu bytes, but the header promises an index of %llu "
             "sequences at offset %llu",
             path, s->size, (unsigned long long)s->n_seqs, (unsigned long long)s->index_off);
        goto fail;
    }
    uint64_t expect = SHARD_HEADER_BYTES, tokens = 0;
    uint32_t longest = 0;
    for (uint64_t i = 0; i < s->n_seqs; i++) {
        const unsigned char *e = s->base + s->index_off + i * INDEX_ENTRY;
        uint64_t off = rd64(e);
        uint32_t len = rd32(e + 8);
        if (len == 0 || off != expect || off + record_bytes(len) > s->index_off) {
            err_fmt(err, errlen,
                 "%s: index entry %llu out of range: offset %llu length %u (expected offset %llu, "
                 "records end at %llu)",
                 path, (unsigned long long)i, (unsigned long long)off, len,
                 (unsigned long long)expect, (unsigned long long)s->index_off);
            goto fail;
        }
        expect = off + record_bytes(len);
        tokens += len;
        if (len > longest) longest = len;
    }
    if (((expect + 7) & ~(uint64_t)7) != s->index_off || tokens != s->n_tokens ||
        longest != s->max_len) {
        err_fmt(err, errlen,
             "%s: header disagrees with the index: %llu tokens / longest %u in the header, %llu / "
             "%u in the index, records end at %llu, index at %llu",
             path, (unsigned long long)s->n_tokens, s->max_len, (unsigned long long)tokens, longest,
             (unsigned long long)expect, (unsigned long long)s->index_off);
        goto fail;
    }
    return s;
fail:
    shard_close(&s);
    return NULL;
}

void shard_close(shard **ps) {
    if (!ps || !*ps) return;
    shard *s = *ps;
    if (s->base) {
        map_guard_remove(s->base);
        munmap((void *)s->base, s->size);
    }
    free(s->path);
    free(s);
    *ps = NULL;
}

uint64_t shard_count(const shard *s) {
    return s ? s->n_seqs : 0;
}
uint64_t shard_tokens(const shard *s) {
    return s ? s->n_tokens : 0;
}
uint32_t shard_vocab(const shard *s) {
    return s ? s->vocab : 0;
}
uint32_t shard_max_len(const shard *s) {
    return s ? s->max_len : 0;
}
const char *shard_path(const shard *s) {
    return s ? s->path : "";
}

uint32_t shard_len(const shard *s, uint64_t i) {
    if (!s || i >= s->n_seqs) return 0;
    return rd32(s->base + s->index_off + i * INDEX_ENTRY + 8);
}

int shard_get(const shard *s, uint64_t i, shard_seq *out) {
    if (!s || i >= s->n_seqs) return DFLASH_ERANGE;
    const unsigned char *e = s->base + s->index_off + i * INDEX_ENTRY;
    uint64_t off = rd64(e);
    out->len = rd32(e + 8);
    out->ids = (const int32_t *)(const void *)(s->base + off); /* off % 4 == 0 by construction */
    out->mask = s->base + off + (uint64_t)out->len * 4;
    return 0;
}

/* shard_identity reads the leading tokens of this many evenly spaced sequences */
#define IDENTITY_SAMPLES 1024u
#define IDENTITY_TOKENS 64u

uint64_t shard_identity(const shard *s) {
    uint64_t h = rng_hash64_fold(0x6466736861726431ull /* "dfshard1" */, s->n_seqs);
    h = rng_hash64_fold(h, s->n_tokens);
    h = rng_hash64_fold(h, s->vocab);
    h = rng_hash64_fold(h, s->max_len);
    const unsigned char *ix = s->base + s->index_off;
    for (uint64_t i = 0; i < s->n_seqs; i++, ix += INDEX_ENTRY) { /* every offset and length */
        h = rng_hash64_fold(h, rd64(ix));
        h = rng_hash64_fold(h, rd32(ix + 8));
    }
    uint64_t samples = s->n_seqs < IDENTITY_SAMPLES ? s->n_seqs : IDENTITY_SAMPLES;
    for (uint64_t k = 0; k < samples; k++) {
        uint64_t i = samples > 1 ? k * (s->n_seqs - 1) / (samples - 1) : 0; /* first to last */
        shard_seq q = {0};
        shard_get(s, i, &q); /* i < n_seqs: 0 */
        for (uint32_t p = 0; p < q.len && p < IDENTITY_TOKENS; p++)
            h = rng_hash64_fold(h, (uint64_t)(uint32_t)q.ids[p] | (uint64_t)q.mask[p] << 32);
    }
    return h;
}

int shard_check_vocab(const shard *s, uint32_t model_vocab, char *err, size_t errlen) {
    uint32_t v = s->vocab, larger = v > model_vocab ? v : model_vocab;
    uint32_t apart = v > model_vocab ? v - model_vocab : model_vocab - v;
    if (v == 0 || (uint64_t)apart * 128 <= larger) return 0;
    snprintf(err, errlen,
             "%s: made for a vocabulary of %u tokens, but the model's vocab_size is %u: another "
             "tokenizer (one model's sizes differ by at most 1/128). Tokenize the data with "
             "this model's tokenizer and convert it with dflash-data --model MODEL_DIR",
             s->path, v, model_vocab);
    return DFLASH_EMISMATCH;
}

/* What a set holds to train on, gathered by verify_tokens: a loss token, the sequences with an
 * anchor candidate, apart as they fit max_len or not (a longer one trains nothing: the batch
 * plan leaves it out). */
typedef struct trainable {
    uint32_t max_len;            /* longest sequence that counts (0: any) */
    bool loss;                   /* some mask byte is 1 */
    uint64_t anchored;           /* sequences of at most max_len tokens with a candidate anchor */
    uint64_t anchored_long;      /* sequences longer than max_len with one */
    uint32_t long_min, long_max; /* the shortest and longest of those */
} trainable;

/* Whether sequence i's record matches the checksum its index entry holds (version 2; a version 1
 * shard has none: true). DFLASH_ECORRUPT with the reason in err when not. */
static int check_record(const shard *s, uint64_t i, const shard_seq *q, char *err, size_t errlen) {
    if (s->version < 2) return 0;
    uint32_t recorded = rd32(s->base + s->index_off + i * INDEX_ENTRY + 12);
    uint32_t got = crc32c(0, q->ids, (size_t)q->len * 5); /* ids then mask, back to back */
    if (got == recorded) return 0;
    err_fmt(err, errlen,
            "%s: sequence %llu (%u tokens) does not match the checksum dflash-data recorded "
            "(CRC-32C %08x, recorded %08x): the file changed after it was written (a disk or "
            "copy error); make the shard again from its JSONL",
            s->path, (unsigned long long)i, q->len, got, recorded);
    return DFLASH_ECORRUPT;
}

/* shard_verify_tokens, also noting in *t (may be NULL) what the shard holds to train on: in the
 * same pass over the tokens, so a large set is read once. */
static int verify_tokens(const shard *s, uint32_t vocab, trainable *t, char *err, size_t errlen) {
    for (uint64_t i = 0; i < s->n_seqs; i++) {
        shard_seq q;
        shard_get(s, i, &q);
        bool anchor = false; /* the sequence has a candidate anchor (dflash_anchor_candidate) */
        for (uint32_t p = 0; p < q.len; p++) {
            if (q.ids[p] < 0 || (vocab && (uint32_t)q.ids[p] >= vocab)) {
                err_fmt(err, errlen,
                     "%s: sequence %llu position %u: token id %d outside the vocabulary of %u",
                     s->path, (unsigned long long)i, p, q.ids[p], vocab);
                return DFLASH_ERANGE;
            }
            if (q.mask[p] > 1) {
                err_fmt(err, errlen, "%s: sequence %llu position %u: loss mask byte %u is not 0/1",
                     s->path, (unsigned long long)i, p, q.mask[p]);
                return DFLASH_ERANGE;
            }
            if (t && q.mask[p]) {
                t->loss = true;
                if (dflash_anchor_candidate(q.mask, (int)p, (int)q.len)) anchor = true;
            }
        }
        int rc = check_record(s, i, &q, err, errlen);
        if (rc) return rc;
        if (!t || !anchor) continue;
        if (!t->max_len || q.len <= t->max_len) {
            t->anchored++;
        } else {
            if (!t->anchored_long++ || q.len < t->long_min) t->long_min = q.len;
            if (q.len > t->long_max) t->long_max = q.len;
        }
    }
    return 0;
}

int shard_verify_tokens(const shard *s, uint32_t vocab, char *err, size_t errlen) {
    return verify_tokens(s, vocab, NULL, err, errlen);
}

/* ---- writer ---- */

struct shard_writer {
    char *path;
    char tmp[PATH_MAX];
    FILE *fp;
    uint32_t vocab, max_len;
    uint64_t offset, n_tokens;
    unsigned char *index; /* n * 16 bytes */
    uint64_t n, cap;
    bool failed, committed;
    int sys_errno; /* errno of the first failed write, fsync, close or rename; 0 if none */
};

/* Marks w failed, keeping the first system error (a full disk is ENOSPC, not just "I/O"). */
static int writer_failed(shard_writer *w) {
    if (!w->failed) w->sys_errno = errno ? errno : EIO;
    w->failed = true;
    return DFLASH_EIO;
}

shard_writer *shard_writer_new(const char *path, uint32_t vocab) {
    shard_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->path = strdup(path);
    w->vocab = vocab;
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", path, (long)getpid());
    /* fopen's mode, but never written through a symlink planted at the name */
    int fd = w->path ? fs_create_new(w->tmp, O_WRONLY, 0666) : -1;
    w->fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !w->fp) close(fd);
    /* fs_create_new's flock holds it until the file is closed: fs_remove_stale_temps leaves a
     * locked one alone */
    if (!w->fp) {
        free(w->path);
        free(w);
        return NULL;
    }
    static const unsigned char zero[SHARD_HEADER_BYTES];
    errno = 0;
    if (fwrite(zero, 1, sizeof zero, w->fp) != sizeof zero) writer_failed(w);
    w->offset = SHARD_HEADER_BYTES;
    return w;
}

void shard_writer_destroy(shard_writer **pw) {
    if (!pw || !*pw) return;
    shard_writer *w = *pw;
    if (w->fp) fclose(w->fp);
    if (!w->committed) unlink(w->tmp);
    free(w->index);
    free(w->path);
    free(w);
    *pw = NULL;
}

uint64_t shard_writer_count(const shard_writer *w) {
    return w ? w->n : 0;
}

int shard_writer_errno(const shard_writer *w) {
    return w ? w->sys_errno : 0;
}

int shard_writer_add(shard_writer *w, const int32_t *ids, const uint8_t *mask, uint32_t len) {
    if (!w || w->committed) return DFLASH_ESTATE;
    if (w->failed) return DFLASH_EIO;
    if (len == 0 || !ids || !mask) return DFLASH_EINVAL;
    for (uint32_t i = 0; i < len; i++) {
        if (ids[i] < 0 || (w->vocab && (uint32_t)ids[i] >= w->vocab)) return DFLASH_ERANGE;
        if (mask[i] > 1) return DFLASH_EINVAL;
    }
    if (w->n == w->cap) {
        uint64_t nc = w->cap ? w->cap * 2 : 1024;
        unsigned char *ni = realloc(w->index, nc * INDEX_ENTRY);
        if (!ni) return DFLASH_ENOMEM;
        w->index = ni;
        w->cap = nc;
    }
    unsigned char buf[4096];
    uint32_t crc = 0; /* the record's checksum, over the bytes as written */
    errno = 0;
    for (uint32_t i = 0; i < len;) { /* ids, little-endian */
        uint32_t k = 0;
        for (; i < len && k + 4 <= sizeof buf; i++, k += 4)
            wr32(buf + k, (uint32_t)ids[i]);
        crc = crc32c(crc, buf, k);
        if (fwrite(buf, 1, k, w->fp) != k) goto io;
    }
    crc = crc32c(crc, mask, len);
    if (fwrite(mask, 1, len, w->fp) != len) goto io;
    uint64_t pad = record_bytes(len) - (uint64_t)len * 5;
    static const unsigned char zero[4];
    if (pad && fwrite(zero, 1, pad, w->fp) != pad) goto io;
    unsigned char *e = w->index + w->n * INDEX_ENTRY;
    wr64(e, w->offset);
    wr32(e + 8, len);
    wr32(e + 12, crc);
    w->n++;
    w->offset += record_bytes(len);
    w->n_tokens += len;
    if (len > w->max_len) w->max_len = len;
    return 0;
io:
    return writer_failed(w);
}

int shard_writer_commit(shard_writer *w) {
    if (!w || w->committed) return DFLASH_ESTATE;
    int rc = DFLASH_EIO;
    if (w->failed) goto fail;
    errno = 0;
    static const unsigned char zero[8];
    uint64_t index_off = (w->offset + 7) & ~(uint64_t)7;
    if (index_off > w->offset &&
        fwrite(zero, 1, index_off - w->offset, w->fp) != index_off - w->offset)
        goto fail;
    if (w->n && fwrite(w->index, INDEX_ENTRY, w->n, w->fp) != w->n) goto fail;
    unsigned char h[SHARD_HEADER_BYTES] = {0};
    memcpy(h, SHARD_MAGIC, 8);
    wr32(h + 8, SHARD_VERSION);
    wr32(h + 12, SHARD_HEADER_BYTES);
    wr64(h + 16, w->n);
    wr64(h + 24, w->n_tokens);
    wr64(h + 32, index_off);
    wr32(h + 40, w->vocab);
    wr32(h + 44, w->max_len);
    if (fseek(w->fp, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, w->fp) != sizeof h) goto fail;
    if (fflush(w->fp) != 0 || fsync(fileno(w->fp)) != 0) goto fail;
    int c = fclose(w->fp);
    w->fp = NULL;
    if (c != 0 || rename(w->tmp, w->path) != 0) goto fail;
    w->committed = true;
    if (fs_sync_parent_dir(w->path) != 0) return writer_failed(w); /* the rename may not last */
    return 0;
fail:
    writer_failed(w); /* before fclose and unlink change errno */
    if (w->fp) fclose(w->fp);
    w->fp = NULL;
    unlink(w->tmp);
    return rc;
}

/* ---- set ---- */

struct shard_set {
    shard **shards;
    uint64_t *first; /* first[i] = global id of shard i's sequence 0; first[n] = total */
    size_t n;
    uint64_t tokens;
};

shard_set *shard_set_open(const char *const *paths, size_t n, char *err, size_t errlen) {
    if (!n) {
        err_fmt(err, errlen, "no shard files given");
        return NULL;
    }
    shard_set *set = calloc(1, sizeof *set);
    if (!set) return NULL;
    set->shards = calloc(n, sizeof *set->shards);
    set->first = calloc(n + 1, sizeof *set->first);
    if (!set->shards || !set->first) goto fail;
    for (size_t i = 0; i < n; i++) {
        if (!(set->shards[i] = shard_open(paths[i], err, errlen))) goto fail;
        set->n = i + 1;
        set->first[i + 1] = set->first[i] + shard_count(set->shards[i]);
        set->tokens += shard_tokens(set->shards[i]);
    }
    return set;
fail:
    shard_set_close(&set);
    return NULL;
}

bool shard_list_names_none(const char *list) {
    return !list || strspn(list, ", ") == strlen(list);
}

shard_set *shard_set_open_list(const char *list, char *err, size_t errlen) {
    char *copy = strdup(list ? list : "");
    if (!copy) return NULL;
    size_t n = 0, cap = 8;
    const char **paths = malloc(cap * sizeof *paths);
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && paths; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (!*tok) continue;
        if (n == cap) {
            cap *= 2;
            const char **np = realloc(paths, cap * sizeof *np);
            if (!np) break;
            paths = np;
        }
        paths[n++] = tok;
    }
    shard_set *set = paths ? shard_set_open(paths, n, err, errlen) : NULL;
    free(paths);
    free(copy);
    return set;
}

void shard_set_close(shard_set **pset) {
    if (!pset || !*pset) return;
    shard_set *set = *pset;
    for (size_t i = 0; set->shards && i < set->n; i++)
        shard_close(&set->shards[i]);
    free(set->shards);
    free(set->first);
    free(set);
    *pset = NULL;
}

uint64_t shard_set_count(const shard_set *set) {
    return set ? set->first[set->n] : 0;
}
uint64_t shard_set_tokens(const shard_set *set) {
    return set ? set->tokens : 0;
}

uint32_t shard_set_vocab(const shard_set *set) {
    uint32_t v = 0;
    for (size_t i = 0; set && i < set->n; i++)
        if (shard_vocab(set->shards[i]) > v) v = shard_vocab(set->shards[i]);
    return v;
}

/* Shard holding global id g (g < total): the last i with first[i] <= g. */
static size_t locate(const shard_set *set, uint64_t g) {
    size_t lo = 0, hi = set->n; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (set->first[mid] <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

uint32_t shard_set_len(const shard_set *set, uint64_t g) {
    if (!set || g >= shard_set_count(set)) return 0;
    size_t i = locate(set, g);
    return shard_len(set->shards[i], g - set->first[i]);
}

int shard_set_get(const shard_set *set, uint64_t g, shard_seq *out) {
    if (!set || g >= shard_set_count(set)) return DFLASH_ERANGE;
    size_t i = locate(set, g);
    return shard_get(set->shards[i], g - set->first[i], out);
}

void shard_set_lengths(const shard_set *set, uint32_t *lens) {
    for (size_t i = 0; set && i < set->n; i++)
        for (uint64_t j = 0; j < shard_count(set->shards[i]); j++)
            lens[set->first[i] + j] = shard_len(set->shards[i], j);
}

uint64_t shard_set_identity(const shard_set *set) {
    uint64_t h = rng_hash64_fold(0x6466736574310000ull /* "dfset1" */, set ? set->n : 0);
    for (size_t i = 0; set && i < set->n; i++) h = rng_hash64_fold(h, shard_identity(set->shards[i]));
    return h;
}

int shard_set_check_vocab(const shard_set *set, uint32_t model_vocab, char *err, size_t errlen) {
    for (size_t i = 0; set && i < set->n; i++) {
        int rc = shard_check_vocab(set->shards[i], model_vocab, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

int shard_set_verify_tokens(const shard_set *set, uint32_t vocab, uint32_t max_len, char *err,
                            size_t errlen) {
    trainable t = {.max_len = max_len};
    for (size_t i = 0; set && i < set->n; i++) {
        int rc = verify_tokens(set->shards[i], vocab, &t, err, errlen);
        if (rc) return rc;
    }
    if (!set || !set->n || t.anchored) return 0;
    const char *first = shard_path(set->shards[0]);
    const char *others = set->n > 1 ? " and the other shards" : "";
    unsigned long long n = (unsigned long long)shard_set_count(set);
    if (!t.loss)
        err_fmt(err, errlen,
                "%s%s: no trainable token: every loss_mask of its %llu sequences is 0 (dflash-data "
                "refuses such data; scripts/chat_to_jsonl.py marks each assistant reply 1)",
                first, others, n);
    else if (!t.anchored_long)
        err_fmt(err, errlen,
                "%s%s: no anchor: in none of its %llu sequences do two loss tokens come in a row "
                "(a block starts where loss_mask marks a token and the next one: alternating "
                "masks and one-token replies give none; dflash-data refuses such data). Mark "
                "every token of a reply, at least two in a row: scripts/chat_to_jsonl.py marks "
                "each assistant reply 1",
                first, others, n);
    else
        err_fmt(err, errlen,
                "%s%s: no anchor in a sequence the buckets keep: the %llu of its %llu sequences "
                "that have one (two loss tokens in a row) are all longer than the last bucket's "
                "%u tokens (%u to %u tokens), and the batch plan leaves them out. Give --buckets "
                "a last bound of at least %u (and --token-budget at least that), or cut the "
                "sequences to fit when tokenizing (scripts/chat_to_jsonl.py --max-len N)",
                first, others, (unsigned long long)t.anchored_long, n, max_len, t.long_min,
                t.long_max, t.long_min);
    return DFLASH_ENODATA;
}
