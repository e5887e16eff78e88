/* safetensors: mmap reader with full header validation, and an atomic streaming writer.
 *
 * Reader data structures: st_file per mapped file (path, base, size, data section start, parsed
 * __metadata__ as cJSON); one array of safetensors_tensor over all files, sorted by name after
 * loading so safetensors_find is a binary search. Invariant after open: every tensor lies inside
 * its file's data section, the tensors of a file tile its data section exactly, names are unique.
 *
 * Checksums (format in safetensors.h): at open, a file's "crc32c.NAME" metadata entries are
 * parsed into its tensors (all or none: a file with some must have one for every tensor, and
 * each must name one); safetensors_verify_tensor recomputes one over the mapping on request.
 *
 * Writer data structures: the declared tensor list (name, dtype, shape, bytes, borrowed data,
 * the crc32c of the bytes written so far), a cursor (tensor index, bytes written into it) for
 * streaming, the temporary file descriptor and the header's length. The header is written at
 * begin with every checksum "00000000" and written again over itself at commit with the real
 * ones (same length: fixed-width hex), so the data is read once, as it is written.
 *
 * Called from the target loader and tools at start-up; not on any hot path.
 */
#include "safetensors.h"

#include "crc.h"
#include "err.h"
#include "fsutil.h"
#include "map_guard.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */
#define CRC_KEY_PREFIX "crc32c."   /* __metadata__ key of a tensor's checksum: prefix + name */
#define CRC_MARKER_KEY "dflash.checksums" /* present (value CRC_MARKER_VALUE): the keys count */
#define CRC_MARKER_VALUE "crc32c"
#define CRC_HEX_DIGITS 8
#define WRITE_CHUNK (4u << 20) /* checksummed, then written while still in the cache */

static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
    [SAFETENSORS_BF16] = {"BF16", 2}, [SAFETENSORS_F16] = {"F16", 2},
    [SAFETENSORS_F32] = {"F32", 4},   [SAFETENSORS_I32] = {"I32", 4},
    [SAFETENSORS_I64] = {"I64", 8},   [SAFETENSORS_F64] = {"F64", 8},
    [SAFETENSORS_I8] = {"I8", 1},     [SAFETENSORS_I16] = {"I16", 2},
    [SAFETENSORS_U8] = {"U8", 1},     [SAFETENSORS_U16] = {"U16", 2},
    [SAFETENSORS_U32] = {"U32", 4},   [SAFETENSORS_U64] = {"U64", 8},
    [SAFETENSORS_BOOL] = {"BOOL", 1}, [SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1},
    [SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1},
};
#define N_WRITABLE_DTYPES (SAFETENSORS_I64 + 1) /* the writer's: BF16 .. I64 */
#define N_DTYPES (sizeof dtype_table / sizeof dtype_table[0])

size_t safetensors_dtype_size(safetensors_dtype dt) {
    return (unsigned)dt < N_DTYPES ? dtype_table[dt].size : 0;
}

const char *safetensors_dtype_name(safetensors_dtype dt) {
    return (unsigned)dt < N_DTYPES ? dtype_table[dt].name : "?";
}

int safetensors_dtype_parse(const char *s, safetensors_dtype *out) {
    static const struct {
        const char *alias;
        safetensors_dtype dt;
    } aliases[] = {{"bf16", SAFETENSORS_BF16},   {"bfloat16", SAFETENSORS_BF16},
                   {"f16", SAFETENSORS_F16},     {"fp16", SAFETENSORS_F16},
                   {"float16", SAFETENSORS_F16}, {"f32", SAFETENSORS_F32},
                   {"fp32", SAFETENSORS_F32},    {"float32", SAFETENSORS_F32},
                   {"i32", SAFETENSORS_I32},     {"i64", SAFETENSORS_I64}};
    if (!s) return DFLASH_EINVAL;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(s, dtype_table[i].name) == 0) {
            *out = (safetensors_dtype)i;
            return 0;
        }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcasecmp(s, aliases[i].alias) == 0) {
            *out = aliases[i].dt;
            return 0;
        }
    return DFLASH_EINVAL;
}

/* ---- scalar conversions ---- */

float safetensors_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t safetensors_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float safetensors_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0)
            u = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t safetensors_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to inf */
    if (a < 0x33000001u) return sign;            /* below half the smallest subnormal */
    int exp = (int)(a >> 23) - 127;
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = exp < -14 ? (-14 - exp) + 13 : 13; /* bits dropped from the 24-bit mantissa */
    uint32_t keep = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (keep & 1u))) keep++;
    if (exp < -14) return sign | (uint16_t)keep; /* subnormal (may round up into the normals) */
    /* keep has the implicit bit at 1<<10; a carry to 1<<11 bumps the exponent correctly */
    return sign | (uint16_t)((((uint32_t)(exp + 15)) << 10) + (keep - 0x400u));
}

/* ---- reader ---- */

typedef struct st_file {
    char *path;
    unsigned char *base; /* mapping of the whole file, or NULL for an empty data section */
    size_t size;
    size_t data_start; /* 8 + header length */
    cJSON *meta;       /* the "__metadata__" object, detached; may be NULL */
} st_file;

struct safetensors {
    char *path;
    st_file *files;
    size_t n_files;
    safetensors_tensor *tensors; /* sorted by name */
    size_t n_tensors, cap_tensors;
};

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const safetensors_tensor *)a)->name, ((const safetensors_tensor *)b)->name);
}

static int cmp_tensor_ptr(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a;
    const safetensors_tensor *y = *(const safetensors_tensor *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Reads a JSON number that must be a non-negative integer fitting int64. */
static bool json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static bool is_crc_key(const char *key) {
    return key && (strncmp(key, CRC_KEY_PREFIX, sizeof CRC_KEY_PREFIX - 1) == 0 ||
                   strcmp(key, CRC_MARKER_KEY) == 0);
}

/* "crc32c." + name, allocated (names have no length limit); NULL when out of memory. */
static char *crc_key_of(const char *name) {
    size_t n = sizeof CRC_KEY_PREFIX + strlen(name);
    char *k = malloc(n);
    if (k) snprintf(k, n, "%s%s", CRC_KEY_PREFIX, name);
    return k;
}

/* Exactly CRC_HEX_DIGITS hex digits into *out. */
static bool parse_crc_hex(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < CRC_HEX_DIGITS; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return false;
        v = v << 4 | (uint32_t)d;
    }
    if (s[CRC_HEX_DIGITS]) return false;
    *out = v;
    return true;
}

/* Sets the checksums of the file's tensors st->tensors[first..] from its metadata meta (may be
 * NULL). Only a file our writer marked ("dflash.checksums": "crc32c") has them, and then one per
 * tensor, each naming a tensor of the file: a key missing, extra or malformed is a damaged
 * header. Unmarked "crc32c." keys (another tool's, or ours carried over by a tool that re-saved
 * the file with other tensors) are ignored. */
static int read_checksums(safetensors *st, size_t first, const cJSON *meta, const char *path,
                          char *err, size_t errlen) {
    const cJSON *mark = meta ? cJSON_GetObjectItemCaseSensitive(meta, CRC_MARKER_KEY) : NULL;
    if (!mark) return 0;
    if (!cJSON_IsString(mark) || strcmp(mark->valuestring, CRC_MARKER_VALUE) != 0) {
        err_fmt(err, errlen, "%s: __metadata__ %s is not \"%s\": damaged header", path,
                CRC_MARKER_KEY, CRC_MARKER_VALUE);
        return DFLASH_EFORMAT;
    }
    size_t keys = 0;
    for (const cJSON *e = meta->child; e; e = e->next)
        keys += is_crc_key(e->string) && e != mark;
    for (size_t i = first; i < st->n_tensors; i++) {
        safetensors_tensor *t = &st->tensors[i];
        char *key = crc_key_of(t->name);
        if (!key) {
            err_fmt(err, errlen, "%s: out of memory", path);
            return DFLASH_ENOMEM;
        }
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
        free(key);
        if (!cJSON_IsString(v)) {
            err_fmt(err, errlen,
                    "%s: tensor %s: no %s%s entry in __metadata__, which says every tensor has "
                    "one: damaged header", path, t->name, CRC_KEY_PREFIX, t->name);
            return DFLASH_EFORMAT;
        }
        if (!parse_crc_hex(v->valuestring, &t->crc32c)) {
            err_fmt(err, errlen, "%s: tensor %s: checksum \"%s\" is not %d hex digits", path,
                    t->name, v->valuestring, CRC_HEX_DIGITS);
            return DFLASH_EFORMAT;
        }
        t->has_crc32c = true;
    }
    if (keys != st->n_tensors - first) {
        err_fmt(err, errlen,
                "%s: __metadata__ has %zu checksums for %zu tensors: one names no tensor of the "
                "file or repeats one: damaged header", path, keys, st->n_tensors - first);
        return DFLASH_EFORMAT;
    }
    return 0;
}

/* Maps one file, parses and validates its header and appends its tensors.
 * only: when non-NULL, the file must contain at least the names listed (checked by the caller). */
static int load_file(safetensors *st, const char *path, char *err, size_t errlen) {
    int rc = DFLASH_EFORMAT, fd = -1;
    cJSON *root = NULL;
    st_file f = {0};
    size_t first = st->n_tensors;

    f.path = dup_str(path);
    if (!f.path) {
        err_fmt(err, errlen, "%s: out of memory", path);
        return DFLASH_ENOMEM;
    }
    fd = fs_open_regular(path, &f.size, err, errlen, &rc);
    if (fd < 0) goto fail;
    if (f.size < 8) {
        err_fmt(err, errlen, "%s: truncated: %zu bytes, shorter than the 8-byte header length", path,
             f.size);
        goto fail;
    }
    f.base = mmap(NULL, f.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f.base == MAP_FAILED) {
        f.base = NULL;
        err_fmt(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        rc = DFLASH_EIO;
        goto fail;
    }
    close(fd);
    fd = -1;
    map_guard_add(f.base, f.size, path);

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f.base[i];
    if (hlen > f.size - 8 || hlen > ST_MAX_HEADER) {
        err_fmt(err, errlen,
             "%s: header length %llu exceeds the file (%zu bytes) or the 100 MiB limit: truncated "
             "or not a safetensors file",
             path, (unsigned long long)hlen, f.size);
        goto fail;
    }
    if (hlen < 2) {
        err_fmt(err, errlen, "%s: header length %llu is too small for JSON", path,
             (unsigned long long)hlen);
        goto fail;
    }
    f.data_start = 8 + (size_t)hlen;
    size_t data_len = f.size - f.data_start;
    const char *parse_end = NULL;
    root = cJSON_ParseWithLengthOpts((const char *)f.base + 8, (size_t)hlen, &parse_end, false);
    if (!root) {
        size_t at = parse_end ? (size_t)(parse_end - (const char *)f.base - 8) : 0;
        err_fmt(err, errlen, "%s: header is not valid JSON (near byte %zu of %llu)", path, at,
             (unsigned long long)hlen);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        err_fmt(err, errlen, "%s: header is not a JSON object", path);
        goto fail;
    }
    /* trailing bytes after the JSON may only be spaces (padding) */
    for (const char *p = parse_end; p && p < (const char *)f.base + f.data_start; p++)
        if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r' && *p != '\0') {
            err_fmt(err, errlen, "%s: garbage after the header JSON at byte %zu", path,
                 (size_t)(p - (const char *)f.base));
            goto fail;
        }

    for (cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (!name) continue;
        if (strcmp(name, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                err_fmt(err, errlen, "%s: __metadata__ is not an object", path);
                goto fail;
            }
            continue;
        }
        if (!cJSON_IsObject(e)) {
            err_fmt(err, errlen, "%s: tensor %s: entry is not an object", path, name);
            goto fail;
        }
        cJSON *jdt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *jshape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *joff = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        safetensors_tensor t = {0};
        if (!cJSON_IsString(jdt)) {
            err_fmt(err, errlen, "%s: tensor %s: missing dtype", path, name);
            goto fail;
        }
        bool known = false;
        for (size_t i = 0; i < N_DTYPES; i++)
            if (strcmp(jdt->valuestring, dtype_table[i].name) == 0) {
                t.dtype = (safetensors_dtype)i;
                known = true;
            }
        if (!known) {
            err_fmt(err, errlen, "%s: tensor %s: unknown dtype \"%s\" (not one of the safetensors dtypes)",
                 path, name, jdt->valuestring);
            rc = DFLASH_EUNSUPPORTED;
            goto fail;
        }
        if (!cJSON_IsArray(jshape)) {
            err_fmt(err, errlen, "%s: tensor %s: missing shape", path, name);
            goto fail;
        }
        int nd = cJSON_GetArraySize(jshape);
        if (nd > SAFETENSORS_MAX_DIMS) {
            err_fmt(err, errlen, "%s: tensor %s: %d dimensions, at most %d supported", path, name, nd,
                 SAFETENSORS_MAX_DIMS);
            goto fail;
        }
        t.ndim = nd;
        /* numel in 128 bits to catch overflow */
        unsigned __int128 numel = 1;
        int d = 0;
        for (cJSON *s = jshape->child; s; s = s->next, d++) {
            uint64_t v;
            if (!json_u64(s, &v)) {
                err_fmt(err, errlen, "%s: tensor %s: shape entry %d is not a non-negative integer",
                     path, name, d);
                goto fail;
            }
            t.shape[d] = (int64_t)v;
            numel *= v;
            if (numel > ((unsigned __int128)1 << 60)) { /* keeps numel * 8 in 64 bits */
                err_fmt(err, errlen, "%s: tensor %s: shape is absurdly large", path, name);
                goto fail;
            }
        }
        t.numel = (int64_t)numel;
        uint64_t b, end;
        if (!cJSON_IsArray(joff) || cJSON_GetArraySize(joff) != 2 ||
            !json_u64(cJSON_GetArrayItem(joff, 0), &b) ||
            !json_u64(cJSON_GetArrayItem(joff, 1), &end)) {
            err_fmt(err, errlen, "%s: tensor %s: data_offsets must be [begin, end] integers", path,
                 name);
            goto fail;
        }
        if (end < b) {
            err_fmt(err, errlen, "%s: tensor %s: data_offsets end %llu before begin %llu", path, name,
                 (unsigned long long)end, (unsigned long long)b);
            goto fail;
        }
        uint64_t want = (uint64_t)t.numel * dtype_table[t.dtype].size;
        if (end - b != want) {
            char sh[128];
            shape_str(sh, sizeof sh, t.ndim, t.shape);
            err_fmt(err, errlen,
                 "%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes but %s %s needs %llu",
                 path, name, (unsigned long long)b, (unsigned long long)end,
                 (unsigned long long)(end - b), jdt->valuestring, sh, (unsigned long long)want);
            goto fail;
        }
        if (end > data_len) {
            err_fmt(err, errlen,
                 "%s: tensor %s: data_offsets end %llu is past the data section (%zu bytes): "
                 "truncated file",
                 path, name, (unsigned long long)end, data_len);
            goto fail;
        }
        t.bytes = (size_t)want;
        t.data = f.base + f.data_start + b;
        t.name = dup_str(name);
        if (!t.name) {
            rc = DFLASH_ENOMEM;
            goto fail;
        }
        if (st->n_tensors == st->cap_tensors) {
            size_t nc = st->cap_tensors ? st->cap_tensors * 2 : 64;
            safetensors_tensor *nt = realloc(st->tensors, nc * sizeof *nt);
            if (!nt) {
                free((char *)t.name);
                rc = DFLASH_ENOMEM;
                goto fail;
            }
            st->tensors = nt;
            st->cap_tensors = nc;
        }
        st->tensors[st->n_tensors++] = t;
    }

    /* coverage: sorted by begin, the tensors must tile [0, data_len) */
    size_t n = st->n_tensors - first;
    const safetensors_tensor **by_off = malloc((n ? n : 1) * sizeof *by_off);
    if (!by_off) {
        rc = DFLASH_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < n; i++)
        by_off[i] = &st->tensors[first + i];
    qsort(by_off, n, sizeof *by_off, cmp_tensor_ptr);
    const unsigned char *expect = f.base + f.data_start;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = by_off[i]->data;
        size_t at = (size_t)(p - (f.base + f.data_start));
        if (p < expect) {
            err_fmt(err, errlen, "%s: tensor %s: data at offset %zu overlaps tensor %s", path,
                 by_off[i]->name, at, by_off[i - 1]->name);
            free(by_off);
            goto fail;
        }
        if (p > expect) {
            err_fmt(err, errlen, "%s: tensor %s: gap of %zu bytes before its data at offset %zu", path,
                 by_off[i]->name, (size_t)(p - expect), at);
            free(by_off);
            goto fail;
        }
        expect = p + by_off[i]->bytes;
    }
    free(by_off);
    size_t covered = (size_t)(expect - (f.base + f.data_start));
    if (covered != data_len) {
        err_fmt(err, errlen, "%s: %zu bytes after the last tensor (data section %zu, tensors %zu)",
             path, data_len - covered, data_len, covered);
        goto fail;
    }
    rc = read_checksums(st, first, cJSON_GetObjectItemCaseSensitive(root, "__metadata__"), path,
                        err, errlen);
    if (rc) goto fail;
    for (size_t i = first; i < st->n_tensors; i++)
        st->tensors[i].file = f.path;

    cJSON *meta = cJSON_DetachItemFromObjectCaseSensitive(root, "__metadata__");
    f.meta = meta;
    cJSON_Delete(root);
    st_file *nf = realloc(st->files, (st->n_files + 1) * sizeof *nf);
    if (!nf) {
        cJSON_Delete(meta);
        root = NULL;
        f.meta = NULL;
        rc = DFLASH_ENOMEM;
        goto fail_after_root;
    }
    st->files = nf;
    st->files[st->n_files++] = f;
    return 0;

fail:
    cJSON_Delete(root);
fail_after_root:
    for (size_t i = first; i < st->n_tensors; i++)
        free((char *)st->tensors[i].name);
    st->n_tensors = first;
    if (fd >= 0) close(fd);
    if (f.base) {
        map_guard_remove(f.base);
        munmap(f.base, f.size);
    }
    free(f.path);
    return rc;
}

void safetensors_close(safetensors **pst) {
    if (!pst || !*pst) return;
    safetensors *st = *pst;
    for (size_t i = 0; i < st->n_tensors; i++)
        free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_files; i++) {
        if (st->files[i].base) {
            map_guard_remove(st->files[i].base);
            munmap(st->files[i].base, st->files[i].size);
        }
        cJSON_Delete(st->files[i].meta);
        free(st->files[i].path);
    }
    free(st->files);
    free(st->tensors);
    free(st->path);
    free(st);
    *pst = NULL;
}

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* After sorting by name: refuses a name defined twice (in one file or in two shards). */
static int check_dups(const safetensors *st, const char *where, char *err, size_t errlen) {
    for (size_t i = 1; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, st->tensors[i - 1].name) == 0) {
            err_fmt(err, errlen, "%s: tensor %s: defined twice (in %s and %s)", where,
                 st->tensors[i].name, st->tensors[i - 1].file, st->tensors[i].file);
            return DFLASH_EFORMAT;
        }
    return 0;
}

/* Opens every shard named in the index's weight_map, then checks that every mapped name is in
 * the shard the index says. */
static int load_index(safetensors *st, const char *index_path, char *err, size_t errlen) {
    int rc = 0;
    char *text = fs_read_text(index_path, 64u << 20, err, errlen, &rc);
    if (!text) return rc;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) {
        err_fmt(err, errlen, "%s: not valid JSON", index_path);
        return DFLASH_EFORMAT;
    }
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        err_fmt(err, errlen, "%s: no weight_map object", index_path);
        cJSON_Delete(root);
        return DFLASH_EFORMAT;
    }
    /* directory of the index */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = 0;
    else
        dir[0] = 0;

    size_t n = (size_t)cJSON_GetArraySize(wm);
    const char **files = malloc(n * sizeof *files);
    if (!files) {
        cJSON_Delete(root);
        return DFLASH_ENOMEM;
    }
    size_t i = 0;
    for (cJSON *e = wm->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0]) {
            err_fmt(err, errlen, "%s: weight_map entry %s is not a plain file name", index_path,
                 e->string ? e->string : "?");
            rc = DFLASH_EFORMAT;
            goto out;
        }
        files[i] = e->valuestring;
    }
    qsort(files, n, sizeof *files, cmp_cstr);
    for (i = 0; i < n; i++) {
        if (i && strcmp(files[i], files[i - 1]) == 0) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s%s", dir, files[i]);
        rc = load_file(st, path, err, errlen);
        if (rc) {
            size_t used = err ? strlen(err) : 0;
            if (err && used + 1 < errlen)
                snprintf(err + used, errlen - used, " (listed in %s)", index_path);
            goto out;
        }
    }
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
    if ((rc = check_dups(st, index_path, err, errlen))) goto out;
    for (cJSON *e = wm->child; e; e = e->next) {
        const safetensors_tensor *t = safetensors_find(st, e->string);
        const char *base = NULL;
        if (t) {
            base = strrchr(t->file, '/');
            base = base ? base + 1 : t->file;
        }
        if (!t || strcmp(base, e->valuestring) != 0) {
            err_fmt(err, errlen, "%s: tensor %s: the index maps it to %s%s, which does not hold it",
                 index_path, e->string, dir, e->valuestring);
            rc = DFLASH_EFORMAT;
            goto out;
        }
    }
out:
    free(files);
    cJSON_Delete(root);
    return rc;
}

/* A directory without model.safetensors nor its index: what it holds instead, said in err (a
 * user's checkpoint of PyTorch .bin weights, or shards whose index was not copied), else
 * nothing. Returns DFLASH_EUNSUPPORTED or DFLASH_ENOTFOUND when said, 0 when not. */
static int say_no_weights(const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    bool bin = false, shard = false;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        bin |= n > 4 && strcmp(e->d_name + n - 4, ".bin") == 0 &&
               strncmp(e->d_name, "pytorch_model", 13) == 0;
        shard |= n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0 &&
                 strstr(e->d_name, "-of-") != NULL;
    }
    closedir(d);
    if (shard) {
        err_fmt(err, errlen, "%s: sharded *.safetensors files without their "
                "model.safetensors.index.json: copy the index from where the checkpoint came",
                dir);
        return DFLASH_ENOTFOUND;
    }
    if (bin) {
        err_fmt(err, errlen, "%s: PyTorch pytorch_model*.bin weights, no model.safetensors: "
                "only safetensors are read; convert them (e.g. transformers' "
                "save_pretrained(..., safe_serialization=True))", dir);
        return DFLASH_EUNSUPPORTED;
    }
    return 0;
}

safetensors *safetensors_open(const char *path, int *rcp, char *err, size_t errlen) {
    int rc_ignored, *out_rc = rcp ? rcp : &rc_ignored;
    *out_rc = 0;
    if (err && errlen) err[0] = 0;
    if (!path) {
        err_fmt(err, errlen, "safetensors_open: no path");
        *out_rc = DFLASH_EINVAL;
        return NULL;
    }
    safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = dup_str(path))) {
        free(st);
        err_fmt(err, errlen, "%s: out of memory", path);
        *out_rc = DFLASH_ENOMEM;
        return NULL;
    }
    int rc;
    struct stat sb;
    size_t plen = strlen(path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (access(p, F_OK) == 0)
            rc = load_index(st, p, err, errlen);
        else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            rc = access(p, F_OK) != 0 ? say_no_weights(path, err, errlen) : 0;
            if (!rc) rc = load_file(st, p, err, errlen);
        }
    } else if (plen >= 5 && strcmp(path + plen - 5, ".json") == 0) {
        rc = load_index(st, path, err, errlen);
    } else {
        rc = load_file(st, path, err, errlen);
    }
    if (rc) goto fail;
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
    if ((rc = check_dups(st, path, err, errlen))) goto fail;
    return st;
fail:
    safetensors_close(&st);
    *out_rc = rc;
    return NULL;
}

size_t safetensors_count(const safetensors *st) {
    return st ? st->n_tensors : 0;
}

const safetensors_tensor *safetensors_at(const safetensors *st, size_t i) {
    return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const char *safetensors_path(const safetensors *st) {
    return st ? st->path : "";
}

const safetensors_tensor *safetensors_find(const safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *safetensors_metadata(const safetensors *st, const char *key) {
    if (!st) return NULL;
    for (size_t i = 0; i < st->n_files; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(st->files[i].meta, key);
        if (cJSON_IsString(v)) return v->valuestring;
    }
    return NULL;
}

int safetensors_verify_tensor(const safetensors_tensor *t, char *err, size_t errlen) {
    if (!t->has_crc32c) return 0;
    uint32_t crc = crc32c(0, t->data, t->bytes);
    if (crc == t->crc32c) return 0;
    err_fmt(err, errlen,
            "%s: tensor %s: data checksum mismatch (crc32c of the data %08x, stored %08x)",
            t->file, t->name, crc, t->crc32c);
    return DFLASH_ECORRUPT;
}

int safetensors_expect(const safetensors *st, const char *name, int ndim, const int64_t *shape,
                       const safetensors_tensor **out, char *err, size_t errlen) {
    const safetensors_tensor *t = safetensors_find(st, name);
    if (out) *out = NULL;
    if (!t) {
        err_fmt(err, errlen, "%s: tensor %s not found", safetensors_path(st), name ? name : "(null)");
        return DFLASH_ENOTFOUND;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (!ok) {
        char have[128], want[128];
        shape_str(have, sizeof have, t->ndim, t->shape);
        shape_str(want, sizeof want, ndim, shape);
        err_fmt(err, errlen, "%s: tensor %s has shape %s, expected %s", t->file, name, have, want);
        return DFLASH_EMISMATCH;
    }
    if (out) *out = t;
    return 0;
}

int safetensors_to_f32(const safetensors_tensor *t, float *dst) {
    const unsigned char *p = t->data;
    int64_t n = t->numel;
    uint16_t h;
    switch (t->dtype) {
    case SAFETENSORS_F32:
        memcpy(dst, p, (size_t)n * 4);
        return 0;
    case SAFETENSORS_BF16:
        for (int64_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = safetensors_bf16_to_f32(h);
        }
        return 0;
    case SAFETENSORS_F16:
        for (int64_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = safetensors_f16_to_f32(h);
        }
        return 0;
    default:
        return DFLASH_EUNSUPPORTED;
    }
}

int safetensors_load_f32(const safetensors *st, const char *name, int ndim, const int64_t *shape,
                         float *dst, char *err, size_t errlen) {
    const safetensors_tensor *t;
    int rc = safetensors_expect(st, name, ndim, shape, &t, err, errlen);
    if (rc) return rc;
    rc = safetensors_to_f32(t, dst);
    if (rc)
        err_fmt(err, errlen, "%s: tensor %s has dtype %s, not a float type", t->file, name,
             safetensors_dtype_name(t->dtype));
    return rc;
}

/* ---- writer ---- */

typedef struct wr_tensor {
    char *name;
    safetensors_dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    size_t bytes;
    const void *data;
    uint32_t crc32c; /* of the bytes written so far */
} wr_tensor;

struct safetensors_writer {
    char *path;
    char tmp[PATH_MAX];
    int fd;
    bool begun, committed, failed;
    int sys_errno; /* errno of the first failed open, write, fsync, close or rename; 0 if none */
    cJSON *meta;
    wr_tensor *t;
    size_t n, cap;
    size_t cur, cur_done; /* streaming cursor: tensor index, bytes of it written */
    size_t header_bytes;  /* 8 + padded JSON, as written at begin */
};

/* Keeps the errno of the first system failure (a full disk is ENOSPC, not just "I/O"). */
static void keep_errno(safetensors_writer *w) {
    if (!w->sys_errno) w->sys_errno = errno ? errno : EIO;
}

safetensors_writer *safetensors_writer_new(const char *path) {
    safetensors_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->fd = -1;
    w->path = dup_str(path);
    w->meta = cJSON_CreateObject();
    if (!w->path || !w->meta) {
        safetensors_writer_destroy(&w);
        return NULL;
    }
    return w;
}

void safetensors_writer_destroy(safetensors_writer **pw) {
    if (!pw || !*pw) return;
    safetensors_writer *w = *pw;
    if (w->fd >= 0) close(w->fd);
    if (w->begun && !w->committed) unlink(w->tmp);
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    cJSON_Delete(w->meta);
    free(w->path);
    free(w);
    *pw = NULL;
}

int safetensors_writer_meta(safetensors_writer *w, const char *key, const char *value) {
    if (!w || w->begun || !key || !value || strcmp(key, "__metadata__") == 0 || is_crc_key(key))
        return DFLASH_EINVAL;
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    return cJSON_AddStringToObject(w->meta, key, value) ? 0 : DFLASH_ENOMEM;
}

int safetensors_writer_add(safetensors_writer *w, const char *name, safetensors_dtype dtype,
                           int ndim, const int64_t *shape, const void *data) {
    if (!w || w->begun || !name || !name[0] || strcmp(name, "__metadata__") == 0 ||
        (unsigned)dtype >= N_WRITABLE_DTYPES || ndim < 0 || ndim > SAFETENSORS_MAX_DIMS || (ndim && !shape))
        return DFLASH_EINVAL;
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0) return DFLASH_EEXISTS;
    wr_tensor t = {0};
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return DFLASH_EINVAL;
        t.shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t.dtype = dtype;
    t.ndim = ndim;
    t.bytes = numel * dtype_table[dtype].size;
    t.data = data;
    if (!(t.name = dup_str(name))) return DFLASH_ENOMEM;
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 32;
        wr_tensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) {
            free(t.name);
            return DFLASH_ENOMEM;
        }
        w->t = nt;
        w->cap = nc;
    }
    w->t[w->n++] = t;
    return 0;
}

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return DFLASH_EIO;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t len, off_t off) {
    const char *p = buf;
    while (len) {
        ssize_t k = pwrite(fd, p, len, off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return DFLASH_EIO;
        }
        p += k;
        off += k;
        len -= (size_t)k;
    }
    return 0;
}

/* The header as it stands: the 8-byte length, then the JSON padded with spaces to a multiple
 * of 8, its __metadata__ holding each tensor's crc32c of the bytes written so far (fixed-width
 * hex: the length does not depend on the values). *len receives its size; NULL when out of
 * memory. */
static unsigned char *header_build(const safetensors_writer *w, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *meta = cJSON_Duplicate(w->meta, true);
    if (!meta) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddItemToObject(root, "__metadata__", meta);
    bool ok = cJSON_AddStringToObject(meta, CRC_MARKER_KEY, CRC_MARKER_VALUE) != NULL;
    for (size_t i = 0; ok && i < w->n; i++) {
        char hex[CRC_HEX_DIGITS + 1], *key = crc_key_of(w->t[i].name);
        snprintf(hex, sizeof hex, "%08x", w->t[i].crc32c);
        ok = key && cJSON_AddStringToObject(meta, key, hex);
        free(key);
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(root, w->t[i].name, e);
        cJSON_AddStringToObject(e, "dtype", dtype_table[w->t[i].dtype].name);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < w->t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)w->t[i].shape[d]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        off += w->t[i].bytes;
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return NULL;
    size_t jl = strlen(json), padded = (jl + 7) & ~(size_t)7;
    unsigned char *hdr = malloc(8 + padded);
    if (hdr) {
        for (int i = 0; i < 8; i++)
            hdr[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        memcpy(hdr + 8, json, jl);
        memset(hdr + 8 + jl, ' ', padded - jl);
        *len = 8 + padded;
    }
    free(json);
    return hdr;
}

int safetensors_writer_begin(safetensors_writer *w) {
    if (!w || w->begun) return DFLASH_ESTATE;
    if (!cJSON_GetObjectItemCaseSensitive(w->meta, "format"))
        cJSON_AddStringToObject(w->meta, "format", "pt");
    unsigned char *hdr = header_build(w, &w->header_bytes);
    if (!hdr) return DFLASH_ENOMEM;

    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", w->path, (long)getpid());
    w->fd = fs_create_new(w->tmp, O_WRONLY, 0644); /* never through a symlink planted there */
    if (w->fd < 0) {
        keep_errno(w);
        free(hdr);
        return DFLASH_EIO;
    }
    w->begun = true;
    int rc = write_all(w->fd, hdr, w->header_bytes);
    if (rc) {
        keep_errno(w);
        w->failed = true;
    }
    free(hdr);
    return rc;
}

/* Moves the streaming cursor past the tensors whose bytes are all written (empty ones too). */
static void cursor_advance(safetensors_writer *w) {
    while (w->cur < w->n && w->cur_done >= w->t[w->cur].bytes) {
        w->cur_done -= w->t[w->cur].bytes;
        w->cur++;
    }
}

int safetensors_writer_write(safetensors_writer *w, const void *data, size_t bytes) {
    if (!w || !w->begun || w->committed || w->failed) return DFLASH_ESTATE;
    size_t left = 0;
    for (size_t i = w->cur; i < w->n; i++)
        left += w->t[i].bytes;
    left -= w->cur_done;
    if (bytes > left) return DFLASH_ERANGE;
    const unsigned char *p = data;
    while (bytes) {
        cursor_advance(w); /* bytes <= left: a tensor with room remains */
        wr_tensor *t = &w->t[w->cur];
        size_t k = t->bytes - w->cur_done;
        if (k > bytes) k = bytes;
        if (k > WRITE_CHUNK) k = WRITE_CHUNK;
        t->crc32c = crc32c(t->crc32c, p, k);
        int rc = write_all(w->fd, p, k);
        if (rc) {
            keep_errno(w);
            w->failed = true;
            return rc;
        }
        p += k;
        bytes -= k;
        w->cur_done += k;
    }
    cursor_advance(w);
    return 0;
}

/* Writes the header again, over the first one, now with every tensor's final checksum. */
static int header_finish(safetensors_writer *w) {
    size_t len = 0;
    unsigned char *hdr = header_build(w, &len);
    if (!hdr) return DFLASH_ENOMEM;
    if (len != w->header_bytes) { /* fixed-width checksums: never, or the data is overwritten */
        free(hdr);
        return DFLASH_EINVAL;
    }
    int rc = pwrite_all(w->fd, hdr, len, 0);
    if (rc) keep_errno(w);
    free(hdr);
    return rc;
}

int safetensors_writer_commit(safetensors_writer *w) {
    int rc;
    if (!w || w->committed) return DFLASH_ESTATE;
    if (!w->begun && (rc = safetensors_writer_begin(w))) goto fail;
    if (w->failed) {
        rc = DFLASH_EIO;
        goto fail;
    }
    while (w->cur < w->n) {
        const wr_tensor *t = &w->t[w->cur];
        if (t->bytes == 0) {
            w->cur++;
            continue;
        }
        if (!t->data) {
            rc = DFLASH_ESTATE;
            goto fail;
        }
        size_t done = w->cur_done;
        if ((rc = safetensors_writer_write(w, (const char *)t->data + done, t->bytes - done)))
            goto fail;
    }
    if ((rc = header_finish(w))) goto fail;
    if (fsync(w->fd) != 0) {
        rc = DFLASH_EIO;
        keep_errno(w);
        goto fail;
    }
    if (close(w->fd) != 0) {
        w->fd = -1;
        rc = DFLASH_EIO;
        keep_errno(w);
        goto fail;
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        rc = DFLASH_EIO;
        keep_errno(w);
        goto fail;
    }
    w->committed = true;
    if (fs_sync_parent_dir(w->path) != 0) { /* the rename may not last */
        keep_errno(w);
        return DFLASH_EIO;
    }
    return 0;
fail:
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->begun) unlink(w->tmp);
    w->failed = true;
    w->committed = false;
    w->begun = true; /* nothing more may be written */
    return rc;
}

int safetensors_writer_errno(const safetensors_writer *w) {
    return w ? w->sys_errno : 0;
}

int safetensors_write_index(const char *dir, const char *const *names, const char *const *files,
                            size_t n, uint64_t total_size) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return DFLASH_ENOMEM;
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total_size);
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    for (size_t i = 0; i < n; i++)
        cJSON_AddStringToObject(wm, names[i], files[i]);
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    if (!json) return DFLASH_ENOMEM;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t jl = strlen(json);
    json[jl] = '\n'; /* replace the terminator: written length is exact */
    int rc = fs_write_atomic(path, json, jl + 1), e = errno;
    free(json);
    errno = e; /* fs_write_atomic's reason, for the caller's message */
    return rc;
}
