/* test_safetensors: round trips through the writer and reader (plain, streamed, sharded), the
 * half-precision conversions, and that corrupt, truncated or inconsistent files are refused with
 * messages that name the file, the tensor and the problem; the writer's per-tensor checksums
 * (right when streamed across tensor boundaries, a flipped data bit caught by
 * safetensors_verify_tensor, a file with some but not all of them refused, one with none accepted). */
#include "check.h"
#include "crc.h"
#include "err.h"
#include "safetensors.h"
#include "test_files.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void path_of(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", dir, name);
}

/* Writes an 8-byte length + header (padded with spaces to pad bytes if pad > strlen) + data. */
static void write_raw(const char *path, const char *header, size_t data_len, long hlen_override) {
    FILE *fp = fopen(path, "wb");
    uint64_t hl = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(header);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hl >> (8 * i));
    fwrite(b, 1, 8, fp);
    fwrite(header, 1, strlen(header), fp);
    for (size_t i = 0; i < data_len; i++)
        fputc((int)(i & 0xff), fp);
    fclose(fp);
}

/* Opening must fail with the kind want (DFLASH_EFORMAT: the bytes are wrong; DFLASH_EIO or
 * DFLASH_ENOTFOUND: the file cannot be read) and a message naming path and n1, n2 (each may be
 * NULL). */
static void expect_bad(const char *path, int want, const char *n1, const char *n2) {
    char err[512] = "";
    int rc = 0;
    safetensors *st = safetensors_open(path, &rc, err, sizeof err);
    CHECK(st == NULL);
    if (st) fprintf(stderr, "  unexpectedly opened %s\n", path);
    safetensors_close(&st);
    CHECK_EQ_INT(rc, want);
    CHECK(strstr(err, path) != NULL);
    if (n1) CHECK(strstr(err, n1) != NULL);
    if (n2) CHECK(strstr(err, n2) != NULL);
    if ((n1 && !strstr(err, n1)) || (n2 && !strstr(err, n2)) || !strstr(err, path))
        fprintf(stderr, "  message was: %s\n", err);
}

static void test_conversions(void) {
    CHECK_EQ_INT(safetensors_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ_INT(safetensors_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(safetensors_f32_to_f16(1e6f), 0x7c00);
    CHECK_EQ_INT(safetensors_f32_to_f16(-2.0f), 0xc000);
    CHECK_EQ_INT(safetensors_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(safetensors_f32_to_bf16(0.1f), 0x3dcd); /* rounds up */
    CHECK_NEAR(safetensors_bf16_to_f32(0xc040), -3.0, 0);
    /* every finite f16 survives f16 -> f32 -> f16 exactly */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        if (safetensors_f32_to_f16(safetensors_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* round to nearest even between two f16 neighbours: 1 + 2^-11 is a tie -> 1.0 */
    CHECK_EQ_INT(safetensors_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
    CHECK_EQ_INT(safetensors_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    /* smallest subnormal */
    CHECK_EQ_INT(safetensors_f32_to_f16(5.9604645e-8f), 0x0001);
    safetensors_dtype dt;
    CHECK_EQ_INT(safetensors_dtype_parse("bf16", &dt), 0);
    CHECK_EQ_INT(dt, SAFETENSORS_BF16);
    CHECK_EQ_INT(safetensors_dtype_parse("F32", &dt), 0);
    CHECK_EQ_INT(dt, SAFETENSORS_F32);
    CHECK_EQ_INT(safetensors_dtype_parse("F8_E4M3", &dt), 0);
    CHECK_EQ_INT(dt, SAFETENSORS_F8_E4M3);
    CHECK_EQ_INT(safetensors_dtype_size(dt), 1);
    CHECK_EQ_INT(safetensors_dtype_parse("F4", &dt), DFLASH_EINVAL);
}

static void test_round_trip(void) {
    char path[300], err[512];
    path_of(path, sizeof path, "rt.safetensors");
    float a[6] = {1, -2, 3.5f, 0.25f, -0.125f, 100};
    uint16_t b[4], c[4];
    float bv[4] = {1.5f, -2, 0.25f, 3}, cv[4] = {-1, 0.5f, 1024, -0.0009765625f};
    for (int i = 0; i < 4; i++) {
        b[i] = safetensors_f32_to_bf16(bv[i]);
        c[i] = safetensors_f32_to_f16(cv[i]);
    }
    int32_t ids[3] = {7, -1, 1 << 30};
    safetensors_writer *w = safetensors_writer_new(path);
    CHECK(w != NULL);
    CHECK_EQ_INT(safetensors_writer_meta(w, "note", "hello"), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "x.a", SAFETENSORS_F32, 2, (int64_t[]){2, 3}, a), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "x.b", SAFETENSORS_BF16, 1, (int64_t[]){4}, b), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "x.c", SAFETENSORS_F16, 2, (int64_t[]){2, 2}, c), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "ids", SAFETENSORS_I32, 1, (int64_t[]){3}, ids), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "x.a", SAFETENSORS_F32, 1, (int64_t[]){1}, a),
                 DFLASH_EEXISTS);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    CHECK(w == NULL);

    /* the header is padded to a multiple of 8 */
    size_t len;
    char *raw = test_slurp(path, &len);
    CHECK(len >= 8);
    if (len < 8) {
        free(raw);
        return;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (unsigned char)raw[i];
    CHECK_EQ_INT(hl % 8, 0);
    CHECK_EQ_INT(len, 8 + hl + 24 + 8 + 8 + 12);
    free(raw);

    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st != NULL);
    if (!st) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    CHECK_EQ_INT(safetensors_count(st), 4);
    CHECK(strcmp(safetensors_at(st, 0)->name, "ids") == 0); /* name order */
    CHECK(safetensors_metadata(st, "note") &&
          strcmp(safetensors_metadata(st, "note"), "hello") == 0);
    CHECK(safetensors_metadata(st, "format") &&
          strcmp(safetensors_metadata(st, "format"), "pt") == 0);
    const safetensors_tensor *t = safetensors_find(st, "x.a");
    CHECK(t && t->dtype == SAFETENSORS_F32 && t->ndim == 2 && t->shape[0] == 2 &&
          t->shape[1] == 3 && t->numel == 6 && t->bytes == 24);
    float out[6];
    CHECK_EQ_INT(safetensors_load_f32(st, "x.a", 2, (int64_t[]){2, 3}, out, err, sizeof err), 0);
    CHECK(memcmp(out, a, sizeof a) == 0);
    CHECK_EQ_INT(safetensors_load_f32(st, "x.b", 1, (int64_t[]){4}, out, err, sizeof err), 0);
    for (int i = 0; i < 4; i++)
        CHECK_NEAR(out[i], bv[i], 0);
    CHECK_EQ_INT(safetensors_load_f32(st, "x.c", 2, (int64_t[]){2, 2}, out, err, sizeof err), 0);
    for (int i = 0; i < 4; i++)
        CHECK_NEAR(out[i], cv[i], 0);
    t = safetensors_find(st, "ids");
    CHECK(t && t->dtype == SAFETENSORS_I32 && memcmp(t->data, ids, 12) == 0);
    CHECK_EQ_INT(safetensors_load_f32(st, "ids", 1, (int64_t[]){3}, out, err, sizeof err),
                 DFLASH_EUNSUPPORTED);

    /* shape expectations: message names the file, tensor and both shapes */
    CHECK_EQ_INT(safetensors_expect(st, "x.a", 2, (int64_t[]){3, 2}, NULL, err, sizeof err),
                 DFLASH_EMISMATCH);
    char want[400];
    snprintf(want, sizeof want, "%s: tensor x.a has shape [2,3], expected [3,2]", path);
    CHECK(strcmp(err, want) == 0);
    CHECK_EQ_INT(safetensors_expect(st, "x.a", 1, (int64_t[]){6}, NULL, err, sizeof err),
                 DFLASH_EMISMATCH);
    /* every dimension counts, the last too, and so does the rank: the loader converts the
     * file's element count into a buffer sized for the expected shape */
    CHECK_EQ_INT(safetensors_expect(st, "x.a", 2, (int64_t[]){2, 2}, NULL, err, sizeof err),
                 DFLASH_EMISMATCH);
    CHECK_EQ_INT(safetensors_load_f32(st, "x.a", 2, (int64_t[]){2, 2}, out, err, sizeof err),
                 DFLASH_EMISMATCH);
    CHECK_EQ_INT(safetensors_expect(st, "x.a", 1, (int64_t[]){2}, NULL, err, sizeof err),
                 DFLASH_EMISMATCH);
    CHECK_EQ_INT(safetensors_expect(st, "nope", 1, (int64_t[]){6}, NULL, err, sizeof err),
                 DFLASH_ENOTFOUND);
    CHECK(strstr(err, "tensor nope not found") != NULL);
    CHECK(safetensors_find(st, "x") == NULL);
    safetensors_close(&st);
    CHECK(st == NULL);
    safetensors_close(&st); /* NULL is fine */
}

static void test_streaming(void) {
    char path[300], err[512];
    path_of(path, sizeof path, "stream.safetensors");
    enum { N = 1000 };
    static float big[N];
    for (int i = 0; i < N; i++)
        big[i] = (float)i * 0.5f;
    safetensors_writer *w = safetensors_writer_new(path);
    CHECK_EQ_INT(safetensors_writer_add(w, "p", SAFETENSORS_F32, 1, (int64_t[]){N}, NULL), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "q", SAFETENSORS_F32, 2, (int64_t[]){10, 10}, NULL), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "empty", SAFETENSORS_F32, 2, (int64_t[]){0, 4}, NULL),
                 0);
    CHECK_EQ_INT(safetensors_writer_begin(w), 0);
    /* chunks of 333 bytes cross the tensor boundary */
    const char *src = (const char *)big;
    size_t total = N * 4, off = 0;
    while (off < total) {
        size_t k = total - off < 333 ? total - off : 333;
        CHECK_EQ_INT(safetensors_writer_write(w, src + off, k), 0);
        off += k;
    }
    CHECK_EQ_INT(safetensors_writer_write(w, big, 400), 0);
    CHECK_EQ_INT(safetensors_writer_write(w, big, 1), DFLASH_ERANGE);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st != NULL);
    const safetensors_tensor *p = safetensors_find(st, "p"), *q = safetensors_find(st, "q");
    CHECK(p && memcmp(p->data, big, N * 4) == 0);
    CHECK(q && memcmp(q->data, big, 400) == 0);
    CHECK(safetensors_find(st, "empty") && safetensors_find(st, "empty")->bytes == 0);
    safetensors_close(&st);

    /* a commit with streamed data missing leaves no file behind (and the old one intact) */
    w = safetensors_writer_new(path);
    safetensors_writer_add(w, "p", SAFETENSORS_F32, 1, (int64_t[]){N}, NULL);
    CHECK(safetensors_writer_commit(w) < 0);
    safetensors_writer_destroy(&w);
    st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st != NULL && safetensors_count(st) == 3);
    safetensors_close(&st);
    /* an abandoned writer removes its temporary file */
    w = safetensors_writer_new(path);
    safetensors_writer_add(w, "p", SAFETENSORS_F32, 1, (int64_t[]){N}, NULL);
    CHECK_EQ_INT(safetensors_writer_begin(w), 0);
    safetensors_writer_destroy(&w);
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);
}

static void test_corrupt(void) {
    char path[300];
    path_of(path, sizeof path, "bad.safetensors");

    /* a good baseline the raw writer produces */
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1);
    char err[512];
    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st != NULL);
    if (!st) fprintf(stderr, "  baseline: %s\n", err);
    safetensors_close(&st);

    write_raw(path, "{}", 0, 1000);
    expect_bad(path, DFLASH_EFORMAT, "header length 1000", NULL);
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, -1);
    expect_bad(path, DFLASH_EFORMAT, "not valid JSON", NULL);
    write_raw(path, "{\"a\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1);
    expect_bad(path, DFLASH_EUNSUPPORTED, "tensor a", "unknown dtype \"F8\"");
    /* the format's other dtypes open (a checkpoint may carry a mask or FP8 scales we never
     * read; sizes checked as for the others); only reading one as floats is refused */
    write_raw(path,
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"mask\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[4,6]},"
              "\"q\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]},"
              "\"s\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[8,12]},"
              "\"d\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[12,12]},"
              "\"u\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[12,16]}}",
              16, -1);
    int orc = 0;
    safetensors *st2 = safetensors_open(path, &orc, err, sizeof err);
    CHECK(st2 != NULL);
    if (!st2) fprintf(stderr, "  message was: %s\n", err);
    if (st2) {
        const safetensors_tensor *m = safetensors_find(st2, "mask");
        CHECK(m && m->dtype == SAFETENSORS_BOOL && m->bytes == 2);
        float f[4];
        CHECK_EQ_INT(safetensors_load_f32(st2, "w", 1, (int64_t[]){1}, f, err, sizeof err), 0);
        CHECK_EQ_INT(safetensors_load_f32(st2, "s", 1, (int64_t[]){4}, f, err, sizeof err),
                     DFLASH_EUNSUPPORTED);
        CHECK(strstr(err, "tensor s has dtype F8_E4M3, not a float type") != NULL);
        safetensors_close(&st2);
    }
    /* a BOOL tensor's size is checked like any other's (2 elements, 1 byte each) */
    write_raw(path, "{\"m\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
              -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor m", "");
    write_raw(path, "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "needs 4");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "shape entry 1");
    write_raw(path,
              "{\"a\":{\"dtype\":\"I64\",\"shape\":[4294967296,4294967296],"
              "\"data_offsets\":[0,0]}}",
              0, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "absurdly large");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "truncated");
    /* one byte short is truncated too (not "bytes after the last tensor") */
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 15, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "truncated");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "before begin");
    write_raw(path,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              12, -1);
    expect_bad(path, DFLASH_EFORMAT, "overlaps tensor", NULL);
    write_raw(path,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              12, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor b", "gap of 4 bytes");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, -1);
    expect_bad(path, DFLASH_EFORMAT, "8 bytes after the last tensor", NULL);
    write_raw(path,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              8, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "defined twice");
    write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor a", "data_offsets");
    write_raw(path, "[1,2]", 0, -1);
    expect_bad(path, DFLASH_EFORMAT, "not a JSON object", NULL);
    write_raw(path, "{\"__metadata__\":3}", 0, -1);
    expect_bad(path, DFLASH_EFORMAT, "__metadata__", NULL);
    test_spill(path, "abc", 3);
    expect_bad(path, DFLASH_EFORMAT, "truncated", NULL);
    expect_bad("/nonexistent/x.safetensors", DFLASH_ENOTFOUND, "cannot open", NULL);

    /* truncating a real file anywhere is caught */
    char good[300];
    path_of(good, sizeof good, "rt.safetensors");
    size_t len;
    char *raw = test_slurp(good, &len);
    CHECK(len > 64);
    if (len <= 64) {
        free(raw);
        return;
    }
    size_t cuts[] = {0, 4, 8, 9, 20, len / 2, len - 12, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        test_spill(path, raw, cuts[i]);
        expect_bad(path, DFLASH_EFORMAT, NULL, NULL);
    }
    /* flipping any header byte never crashes and never yields a tensor outside the file */
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (unsigned char)raw[i];
    int opened = 0, refused = 0;
    for (size_t i = 0; i < 8 + hl; i++) {
        char saved = raw[i];
        raw[i] = (char)(raw[i] ^ 0x5a);
        test_spill(path, raw, len);
        raw[i] = saved;
        st = safetensors_open(path, NULL, err, sizeof err);
        if (!st) {
            refused++;
            CHECK(strstr(err, path) != NULL);
            continue;
        }
        opened++;
        size_t sum = 0;
        for (size_t k = 0; k < safetensors_count(st); k++)
            sum += safetensors_at(st, k)->bytes;
        CHECK(sum == len - 8 - hl);
        safetensors_close(&st);
    }
    CHECK(refused > (int)hl / 2); /* most flips break the JSON or the sizes */
    (void)opened;
    free(raw);
}

static void test_sharded(void) {
    char p1[300], p2[300], err[512];
    path_of(p1, sizeof p1, "model-00001-of-00002.safetensors");
    path_of(p2, sizeof p2, "model-00002-of-00002.safetensors");
    float v1[3] = {1, 2, 3}, v2[2] = {4, 5};
    safetensors_writer *w = safetensors_writer_new(p1);
    safetensors_writer_add(w, "model.a", SAFETENSORS_F32, 1, (int64_t[]){3}, v1);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    w = safetensors_writer_new(p2);
    safetensors_writer_add(w, "model.b", SAFETENSORS_F32, 1, (int64_t[]){2}, v2);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    const char *names[] = {"model.a", "model.b"};
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    CHECK_EQ_INT(safetensors_write_index(dir, names, files, 2, 20), 0);

    /* the directory prefers the index */
    safetensors *st = safetensors_open(dir, NULL, err, sizeof err);
    CHECK(st != NULL);
    if (!st) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(safetensors_count(st), 2);
    float out[3];
    CHECK_EQ_INT(safetensors_load_f32(st, "model.b", 1, (int64_t[]){2}, out, err, sizeof err), 0);
    CHECK_NEAR(out[1], 5, 0);
    CHECK(safetensors_find(st, "model.a") &&
          strcmp(safetensors_find(st, "model.a")->file, p1) == 0);
    safetensors_close(&st);

    /* index pointing a tensor at the wrong shard */
    const char *wrong[] = {"model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    CHECK_EQ_INT(safetensors_write_index(dir, names, wrong, 2, 20), 0);
    char idx[300];
    path_of(idx, sizeof idx, "model.safetensors.index.json");
    expect_bad(idx, DFLASH_EFORMAT, "tensor model.a", "does not hold it");
    /* the two swapped: both shards open and both tensors exist, each in the other file */
    const char *swapped[] = {"model-00002-of-00002.safetensors",
                             "model-00001-of-00002.safetensors"};
    CHECK_EQ_INT(safetensors_write_index(dir, names, swapped, 2, 20), 0);
    expect_bad(idx, DFLASH_EFORMAT, "tensor model.a", "does not hold it");
    /* index naming a missing shard */
    const char *missing[] = {"model-00001-of-00002.safetensors", "gone.safetensors"};
    CHECK_EQ_INT(safetensors_write_index(dir, names, missing, 2, 20), 0);
    char gone[300];
    path_of(gone, sizeof gone, "gone.safetensors");
    expect_bad(idx, DFLASH_ENOTFOUND, gone, "cannot open");
    /* the same name in two shards */
    w = safetensors_writer_new(p2);
    safetensors_writer_add(w, "model.a", SAFETENSORS_F32, 1, (int64_t[]){2}, v2);
    safetensors_writer_commit(w);
    safetensors_writer_destroy(&w);
    const char *both[] = {"model-00001-of-00002.safetensors"};
    const char *onlya[] = {"model.a"};
    (void)both;
    (void)onlya;
    const char *dup_files[] = {"model-00001-of-00002.safetensors",
                               "model-00002-of-00002.safetensors"};
    const char *dup_names[] = {"model.a", "model.x"};
    CHECK_EQ_INT(safetensors_write_index(dir, dup_names, dup_files, 2, 20), 0);
    expect_bad(idx, DFLASH_EFORMAT, "model.a", "defined twice");
    unlink(idx);
    /* the shards without their index: said so (it was "model.safetensors: cannot open") */
    int rc = 0;
    safetensors *none = safetensors_open(dir, &rc, err, sizeof err);
    CHECK(none == NULL && rc == DFLASH_ENOTFOUND && strstr(err, "without their") &&
          strstr(err, "model.safetensors.index.json"));
    unlink(p1);
    unlink(p2);
    /* PyTorch .bin weights alone: said so */
    char bin[300];
    path_of(bin, sizeof bin, "pytorch_model.bin");
    test_spill(bin, "x", 1);
    none = safetensors_open(dir, &rc, err, sizeof err);
    CHECK(none == NULL && rc == DFLASH_EUNSUPPORTED && strstr(err, "pytorch_model*.bin") &&
          strstr(err, "only safetensors are read"));
    unlink(bin);
    /* neither: the plain "cannot open" of model.safetensors */
    none = safetensors_open(dir, &rc, err, sizeof err);
    CHECK(none == NULL && strstr(err, "model.safetensors") && !strstr(err, "only safetensors"));
}

/* safetensors_verify_tensor over every tensor of st: 0 with *checked = how many had a checksum,
 * or the first mismatch's code. */
static int verify_all(const safetensors *st, size_t *checked, char *err, size_t errlen) {
    *checked = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const safetensors_tensor *t = safetensors_at(st, i);
        int rc = safetensors_verify_tensor(t, err, errlen);
        if (rc) return rc;
        *checked += t->has_crc32c;
    }
    return 0;
}

/* Every tensor of path carries the crc32c of its data, in __metadata__ as 8 hex digits. */
static void expect_checksummed(const char *path, size_t n_tensors) {
    char err[512] = "";
    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st != NULL);
    if (!st) return;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const safetensors_tensor *t = safetensors_at(st, i);
        char key[1300], hex[16];
        snprintf(key, sizeof key, "crc32c.%s", t->name);
        snprintf(hex, sizeof hex, "%08x", crc32c(0, t->data, t->bytes));
        const char *v = safetensors_metadata(st, key);
        CHECK(t->has_crc32c && t->crc32c == crc32c(0, t->data, t->bytes));
        CHECK(v && strcasecmp(v, hex) == 0);
    }
    size_t checked = 0;
    CHECK_EQ_INT(verify_all(st, &checked, err, sizeof err), 0);
    CHECK_EQ_INT(checked, n_tensors);
    safetensors_close(&st);
}

#define MARK "\"dflash.checksums\":\"crc32c\","

static void test_checksums(void) {
    char path[300], err[512];
    /* streamed in chunks across tensor boundaries, with an empty tensor (test_streaming) */
    path_of(path, sizeof path, "stream.safetensors");
    expect_checksummed(path, 3);

    /* from data pointers; the checksum keys are the writer's own */
    path_of(path, sizeof path, "crc.safetensors");
    static float a[300], b[77];
    for (int i = 0; i < 300; i++)
        a[i] = (float)i - 7.25f;
    for (int i = 0; i < 77; i++)
        b[i] = 1.0f / (float)(i + 1);
    safetensors_writer *w = safetensors_writer_new(path);
    CHECK_EQ_INT(safetensors_writer_meta(w, "crc32c.a", "00000000"), DFLASH_EINVAL);
    CHECK_EQ_INT(safetensors_writer_meta(w, "dflash.checksums", "none"), DFLASH_EINVAL);
    CHECK_EQ_INT(safetensors_writer_add(w, "a", SAFETENSORS_F32, 1, (int64_t[]){300}, a), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "b", SAFETENSORS_F32, 1, (int64_t[]){77}, b), 0);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    expect_checksummed(path, 2);

    /* one bit of b's data flipped (b follows a's 1200 bytes): verify names the file and b */
    size_t len = 0;
    char *bytes = test_slurp(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | (unsigned char)bytes[i];
    free(bytes);
    CHECK_EQ_INT(test_flip_bit(path, 8 + hlen + 1200 + 101, 3), 0);
    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st != NULL);
    size_t checked = 99;
    CHECK_EQ_INT(verify_all(st, &checked, err, sizeof err), DFLASH_ECORRUPT);
    CHECK(strstr(err, path) && strstr(err, "tensor b:") && strstr(err, "checksum"));
    printf("a flipped bit: %s\n", err);
    safetensors_close(&st);

    /* one write across three tensors: one over the writer's 4 MiB piece, an empty one, a small
     * one; and names too long for any fixed buffer, alike in their first 1100 characters */
    path_of(path, sizeof path, "crc_big.safetensors");
    enum { BIG = (5 << 20) / 4 + 3, SMALL = 100 };
    float *buf = malloc((BIG + SMALL) * sizeof *buf);
    CHECK(buf != NULL);
    if (!buf) return;
    for (int i = 0; i < BIG + SMALL; i++)
        buf[i] = (float)(i % 1000) * 0.25f;
    char long1[1200], long2[1200];
    memset(long1, 'x', 1100);
    snprintf(long1 + 1100, sizeof long1 - 1100, "_one");
    memset(long2, 'x', 1100);
    snprintf(long2 + 1100, sizeof long2 - 1100, "_two");
    w = safetensors_writer_new(path);
    CHECK_EQ_INT(safetensors_writer_add(w, long1, SAFETENSORS_F32, 1, (int64_t[]){BIG}, NULL), 0);
    CHECK_EQ_INT(safetensors_writer_add(w, "mid_empty", SAFETENSORS_F32, 1, (int64_t[]){0}, NULL),
                 0);
    CHECK_EQ_INT(safetensors_writer_add(w, long2, SAFETENSORS_F32, 1, (int64_t[]){SMALL}, NULL), 0);
    CHECK_EQ_INT(safetensors_writer_begin(w), 0);
    CHECK_EQ_INT(safetensors_writer_write(w, buf, (BIG + SMALL) * sizeof *buf), 0);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    free(buf);
    expect_checksummed(path, 3);

    /* raw files: with the marker, checksums for every tensor, each 8 hex digits naming a tensor;
     * without it "crc32c." keys are not ours to check (another tool's, or ours carried over by a
     * tool that re-saved the file with other tensors) */
    char hdr[512], ca[16], cb[16];
    const char *ta = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    const char *tb = "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}";
    unsigned char data[16];
    for (int i = 0; i < 16; i++)
        data[i] = (unsigned char)i; /* write_raw's bytes */
    snprintf(ca, sizeof ca, "%08x", crc32c(0, data, 8));
    snprintf(cb, sizeof cb, "%08X", crc32c(0, data + 8, 8)); /* upper case is read too */
    path_of(path, sizeof path, "raw.safetensors");
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":{" MARK "\"crc32c.a\":\"%s\",\"crc32c.b\":"
             "\"%s\"},%s,%s}", ca, cb, ta, tb);
    write_raw(path, hdr, 16, -1);
    expect_checksummed(path, 2);
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"dflash.checksums\":\"md5\",\"crc32c.a\":"
             "\"%s\",\"crc32c.b\":\"%s\"},%s,%s}", ca, cb, ta, tb);
    write_raw(path, hdr, 16, -1);
    expect_bad(path, DFLASH_EFORMAT, "dflash.checksums", "damaged header");
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":{" MARK "\"crc32c.a\":\"%s\"},%s,%s}", ca, ta,
             tb);
    write_raw(path, hdr, 16, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor b", "damaged header");
    snprintf(hdr, sizeof hdr,
             "{\"__metadata__\":{" MARK "\"crc32c.a\":\"%s\",\"crc32c.b\":\"%s\",\"crc32c.c\":"
             "\"%s\"},%s,%s}",
             ca, cb, cb, ta, tb);
    write_raw(path, hdr, 16, -1);
    expect_bad(path, DFLASH_EFORMAT, "3 checksums for 2 tensors", "damaged header");
    snprintf(hdr, sizeof hdr,
             "{\"__metadata__\":{" MARK "\"crc32c.a\":\"%s\",\"crc32c.b\":\"%.7s\"},%s,%s}", ca,
             cb, ta, tb);
    write_raw(path, hdr, 16, -1);
    expect_bad(path, DFLASH_EFORMAT, "tensor b", "not 8 hex digits");
    /* none, or keys without the marker (here a stale one of a tensor the file no longer has):
     * a file from elsewhere (or from before the checksums) opens and verifies nothing */
    const char *unmarked[2] = {"{%s,%s}", "{\"__metadata__\":{\"crc32c.gone\":\"0000000\"},%s,%s}"};
    for (int k = 0; k < 2; k++) {
        snprintf(hdr, sizeof hdr, unmarked[k], ta, tb);
        write_raw(path, hdr, 16, -1);
        st = safetensors_open(path, NULL, err, sizeof err);
        CHECK(st != NULL);
        checked = 99;
        CHECK_EQ_INT(verify_all(st, &checked, err, sizeof err), 0);
        CHECK_EQ_INT(checked, 0);
        safetensors_close(&st);
    }
    st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st && !safetensors_find(st, "a")->has_crc32c);
    safetensors_close(&st);
}

/* A file that cannot be read is DFLASH_EIO (or DFLASH_ENOTFOUND) naming it and the system's
 * reason, never DFLASH_EFORMAT, the damaged file a checkpoint loader tells the user to move away:
 * no descriptor left (EMFILE), a FIFO where the file, a shard or the index should be (opened
 * without waiting for a writer), a file without read permission (when not root, who reads it
 * anyway). All but the last fail as root too. */
static void test_unreadable(void) {
    char path[300], idx[300], shard[300], err[512];
    path_of(path, sizeof path, "unreadable.safetensors");
    float v[2] = {1, 2};
    safetensors_writer *w = safetensors_writer_new(path);
    safetensors_writer_add(w, "a", SAFETENSORS_F32, 1, (int64_t[]){2}, v);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);

    /* out of descriptors: the soft limit at the lowest free one */
    struct rlimit saved;
    CHECK_EQ_INT(getrlimit(RLIMIT_NOFILE, &saved), 0);
    int lowest = dup(0);
    CHECK(lowest >= 0);
    close(lowest);
    struct rlimit none = {.rlim_cur = (rlim_t)lowest, .rlim_max = saved.rlim_max};
    CHECK_EQ_INT(setrlimit(RLIMIT_NOFILE, &none), 0);
    int rc = 0;
    safetensors *st = safetensors_open(path, &rc, err, sizeof err);
    CHECK_EQ_INT(setrlimit(RLIMIT_NOFILE, &saved), 0);
    CHECK(st == NULL && rc == DFLASH_EIO);
    CHECK(strstr(err, path) && strstr(err, strerror(EMFILE)));
    printf("out of descriptors: %s\n", err);
    safetensors_close(&st);

    CHECK_EQ_INT(chmod(path, 0), 0);
    if (access(path, R_OK) != 0)
        expect_bad(path, DFLASH_EIO, "cannot open", strerror(EACCES));
    else
        printf("unreadable file: not checked (root reads it anyway)\n");
    CHECK_EQ_INT(chmod(path, 0644), 0);
    st = safetensors_open(path, &rc, err, sizeof err);
    CHECK(st != NULL && rc == 0);
    safetensors_close(&st);
    unlink(path);

    CHECK_EQ_INT(mkfifo(path, 0600), 0);
    expect_bad(path, DFLASH_EIO, "cannot read", "FIFO");
    CHECK_EQ_INT(unlink(path), 0);

    /* an index naming a shard that is a FIFO, and an index that is one */
    const char *names[] = {"a"}, *files[] = {"fifo-shard.safetensors"};
    CHECK_EQ_INT(safetensors_write_index(dir, names, files, 1, 8), 0);
    path_of(idx, sizeof idx, "model.safetensors.index.json");
    path_of(shard, sizeof shard, "fifo-shard.safetensors");
    CHECK_EQ_INT(mkfifo(shard, 0600), 0);
    expect_bad(idx, DFLASH_EIO, shard, "FIFO");
    CHECK_EQ_INT(unlink(shard), 0);
    CHECK_EQ_INT(unlink(idx), 0);
    CHECK_EQ_INT(mkfifo(idx, 0600), 0);
    expect_bad(idx, DFLASH_EIO, "cannot read", "FIFO");
    CHECK_EQ_INT(unlink(idx), 0);
}

/* Opens the file, cuts it down to its first page, then reads tensor "big" whole. */
static void read_after_truncate(const char *path) {
    char err[512];
    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    if (!st) _exit(98);
    if (truncate(path, 4096) != 0) _exit(97);
    const safetensors_tensor *t = safetensors_find(st, "big");
    float sum = 0;
    for (size_t i = 0; t && i < t->bytes / 4; i++) sum += ((const float *)t->data)[i];
    printf("read %g without a fault\n", (double)sum);
}

/* A model file that shrinks while open (rewritten in place under a running target) ends the
 * reader with a message naming it and exit 1 (map_guard), not "Bus error". */
static void test_truncated_while_mapped(void) {
    char path[300], errpath[300];
    path_of(path, sizeof path, "cut.safetensors");
    path_of(errpath, sizeof errpath, "cut.err");
    enum { N = 8192 };
    static float big[N];
    safetensors_writer *w = safetensors_writer_new(path);
    CHECK_EQ_INT(safetensors_writer_add(w, "big", SAFETENSORS_F32, 1, (int64_t[]){N}, big), 0);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    int st = test_in_child(read_after_truncate, path, errpath);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    char *msg = test_slurp(errpath, NULL);
    printf("child: %s", msg);
    CHECK(strstr(msg, path) != NULL && strstr(msg, "SIGBUS") != NULL);
    free(msg);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/dflash-test-st-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_conversions();
    test_round_trip();
    test_streaming();
    test_checksums();
    test_corrupt();
    test_sharded();
    test_unreadable();
    test_truncated_while_mapped();
    test_rmtree(dir);
    CHECK_DONE();
}
