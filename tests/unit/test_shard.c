/* test_shard: sequences written to a shard read back exactly (alone and as a multi-shard set);
 * the writer refuses bad sequences; truncated, corrupted or inconsistent shards are refused at
 * open with a message naming the file and the problem; out-of-vocabulary ids are found, and a
 * record changed after the writer by its checksum (version 1 shards, without one, still read);
 * a shard made for another tokenizer's vocabulary is told from one of the same tokenizer; a shard's
 * identity tells other data of the same shape from the same data; a set whose every loss_mask
 * byte is 0, or whose loss tokens never come two in a row (no anchor), or whose anchors all lie
 * in sequences longer than the last bucket, is refused as nothing to train on, each named; a
 * shard that shrinks while open ends the reader with a message naming it and exit 1
 * (map_guard), not "Bus error", while a SIGBUS sent from outside still goes to the action that
 * was there before (the default, or a sanitizer's handler). */
#include "check.h"
#include "err.h"
#include "shard.h"
#include "test_files.h"

#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void path_of(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", dir, name);
}

static void expect_bad(const char *path, const char *needle) {
    char err[512] = "";
    shard *s = shard_open(path, err, sizeof err);
    CHECK(s == NULL);
    shard_close(&s);
    CHECK(strstr(err, path) != NULL);
    if (needle) {
        CHECK(strstr(err, needle) != NULL);
        if (!strstr(err, needle)) fprintf(stderr, "  message was: %s\n", err);
    }
}

static const int32_t ids0[] = {1, 2, 3, 4, 5};
static const uint8_t mask0[] = {0, 0, 1, 1, 1};
static const int32_t ids1[] = {99, 0, 42};
static const uint8_t mask1[] = {1, 1, 0};
static const int32_t ids2[] = {7, 8, 9, 10, 11, 12, 13};
static const uint8_t mask2[] = {0, 1, 0, 1, 0, 1, 1};

static void write_basic(const char *path, uint32_t vocab) {
    shard_writer *w = shard_writer_new(path, vocab);
    CHECK(w != NULL);
    CHECK_EQ_INT(shard_writer_add(w, ids0, mask0, 5), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids1, mask1, 3), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids2, mask2, 7), 0);
    CHECK_EQ_INT(shard_writer_count(w), 3);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    CHECK(w == NULL);
}

static void test_round_trip(void) {
    char path[300], err[512];
    path_of(path, sizeof path, "a.shard");
    shard_writer *w = shard_writer_new(path, 100);
    int32_t bad_ids[] = {1, 100};
    uint8_t ok_mask[] = {1, 1}, bad_mask[] = {1, 2};
    CHECK_EQ_INT(shard_writer_add(w, bad_ids, ok_mask, 2), DFLASH_ERANGE);
    CHECK_EQ_INT(shard_writer_add(w, ids0, bad_mask, 2), DFLASH_EINVAL);
    CHECK_EQ_INT(shard_writer_add(w, ids0, mask0, 0), DFLASH_EINVAL);
    int32_t neg[] = {-1};
    CHECK_EQ_INT(shard_writer_add(w, neg, ok_mask, 1), DFLASH_ERANGE);
    CHECK_EQ_INT(shard_writer_count(w), 0);
    shard_writer_destroy(&w);
    CHECK(access(path, F_OK) != 0); /* never committed: nothing at path */

    write_basic(path, 100);
    shard *s = shard_open(path, err, sizeof err);
    CHECK(s != NULL);
    if (!s) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    CHECK_EQ_INT(shard_count(s), 3);
    CHECK_EQ_INT(shard_tokens(s), 15);
    CHECK_EQ_INT(shard_vocab(s), 100);
    CHECK_EQ_INT(shard_max_len(s), 7);
    CHECK_EQ_INT(shard_len(s, 1), 3);
    CHECK_EQ_INT(shard_len(s, 3), 0);
    shard_seq q;
    CHECK_EQ_INT(shard_get(s, 0, &q), 0);
    CHECK(q.len == 5 && memcmp(q.ids, ids0, sizeof ids0) == 0 &&
          memcmp(q.mask, mask0, sizeof mask0) == 0);
    CHECK_EQ_INT(shard_get(s, 1, &q), 0);
    CHECK(q.len == 3 && memcmp(q.ids, ids1, sizeof ids1) == 0 &&
          memcmp(q.mask, mask1, sizeof mask1) == 0);
    CHECK_EQ_INT(shard_get(s, 2, &q), 0);
    CHECK(q.len == 7 && memcmp(q.ids, ids2, sizeof ids2) == 0 &&
          memcmp(q.mask, mask2, sizeof mask2) == 0);
    CHECK_EQ_INT(shard_get(s, 3, &q), DFLASH_ERANGE);
    CHECK_EQ_INT(shard_verify_tokens(s, 100, err, sizeof err), 0);
    CHECK_EQ_INT(shard_verify_tokens(s, 50, err, sizeof err), DFLASH_ERANGE);
    CHECK(strstr(err, "sequence 1 position 0: token id 99 outside the vocabulary of 50") != NULL);
    /* the bound is exclusive: id 99 is outside a vocabulary of 99 (the target's embedding has
     * rows 0..98), inside one of 100 */
    CHECK_EQ_INT(shard_verify_tokens(s, 99, err, sizeof err), DFLASH_ERANGE);
    shard_close(&s);
    shard_close(&s);

    /* an empty shard is valid */
    char empty[300];
    path_of(empty, sizeof empty, "empty.shard");
    w = shard_writer_new(empty, 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    s = shard_open(empty, err, sizeof err);
    CHECK(s != NULL && shard_count(s) == 0 && shard_tokens(s) == 0);
    shard_close(&s);
}

static void test_corrupt(void) {
    char good[300], path[300];
    path_of(good, sizeof good, "a.shard");
    path_of(path, sizeof path, "bad.shard");
    size_t len;
    char *raw = test_slurp(good, &len);
    CHECK(len > 64);
    if (len <= 64) {
        free(raw);
        return;
    }

    /* every truncation is refused */
    int opened = 0;
    for (size_t cut = 0; cut < len; cut++) {
        test_spill(path, raw, cut);
        char err[512];
        shard *s = shard_open(path, err, sizeof err);
        if (s) opened++;
        shard_close(&s);
    }
    CHECK_EQ_INT(opened, 0);
    test_spill(path, raw, 10);
    expect_bad(path, "truncated");
    test_spill(path, raw, len - 1);
    expect_bad(path, "truncated or inconsistent");
    /* trailing garbage */
    char *longer = malloc(len + 8);
    memcpy(longer, raw, len);
    memset(longer + len, 0, 8);
    test_spill(path, longer, len + 8);
    expect_bad(path, "truncated or inconsistent");
    free(longer);

    raw[0] ^= 1;
    test_spill(path, raw, len);
    expect_bad(path, "bad magic");
    raw[0] ^= 1;
    CHECK_EQ_INT(raw[8], 2); /* the version written */
    raw[8] = 3;
    test_spill(path, raw, len);
    expect_bad(path, "unsupported shard version 3");
    raw[8] = 2;
    raw[24] ^= 1; /* n_tokens */
    test_spill(path, raw, len);
    expect_bad(path, "header disagrees");
    raw[24] ^= 1;
    raw[44] = 9; /* longest */
    test_spill(path, raw, len);
    expect_bad(path, "header disagrees");
    raw[44] = 7;
    /* index entry 1: bump its offset */
    uint64_t index_off = 0;
    for (int i = 7; i >= 0; i--)
        index_off = (index_off << 8) | (unsigned char)raw[32 + i];
    raw[index_off + 16] += 4;
    test_spill(path, raw, len);
    expect_bad(path, "index entry 1 out of range");
    raw[index_off + 16] -= 4;
    /* index entry 2: a length running into the index */
    raw[index_off + 32 + 8] = 100;
    test_spill(path, raw, len);
    expect_bad(path, "index entry 2 out of range");
    raw[index_off + 32 + 8] = 7;
    /* zero length */
    raw[index_off + 8] = 0;
    test_spill(path, raw, len);
    expect_bad(path, "index entry 0");
    raw[index_off + 8] = 5;
    /* the repaired copy opens again: the edits above were the only problems */
    test_spill(path, raw, len);
    char err[256];
    shard *s = shard_open(path, err, sizeof err);
    CHECK(s != NULL);
    shard_close(&s);
    /* a corrupt mask byte is found by verification */
    raw[64 + 5 * 4 + 1] = 3;
    test_spill(path, raw, len);
    s = shard_open(path, err, sizeof err);
    CHECK(s != NULL);
    CHECK_EQ_INT(shard_verify_tokens(s, 0, err, sizeof err), DFLASH_ERANGE);
    CHECK(strstr(err, "sequence 0 position 1: loss mask byte 3") != NULL);
    shard_close(&s);
    free(raw);
    expect_bad("/nonexistent/x.shard", "cannot open");
}

/* A record whose bytes changed after the writer, its ids still inside the vocabulary and its
 * mask bytes 0/1, fails verification by its checksum, naming the sequence; the same file as
 * version 1 (no checksums, zeros in their place) still opens and verifies, as such shards did. */
static void test_checksum(void) {
    char good[300], path[300], err[512];
    path_of(good, sizeof good, "a.shard");
    path_of(path, sizeof path, "flipped.shard");
    size_t len;
    char *raw = test_slurp(good, &len);
    uint64_t index_off = 0;
    for (int i = 7; i >= 0; i--)
        index_off = (index_off << 8) | (unsigned char)raw[32 + i];
    const size_t rec1 = 64 + 28, rec2 = rec1 + 16; /* records of 5 and 3 tokens, padded to 4 */
    struct { size_t at; unsigned char xor; const char *seq; } flips[] = {
        {64 + 4 * 2, 0x01, "sequence 0 "},  /* id 3 -> 2 */
        {rec1 + 4 * 1, 0x04, "sequence 1 "}, /* id 0 -> 4 */
        {rec2 + 4 * 7 + 6, 0x01, "sequence 2 "}, /* the last mask byte 1 -> 0 */
    };
    for (size_t f = 0; f < sizeof flips / sizeof flips[0]; f++) {
        raw[flips[f].at] ^= flips[f].xor;
        test_spill(path, raw, len);
        shard *s = shard_open(path, err, sizeof err);
        CHECK(s != NULL);
        CHECK_EQ_INT(shard_verify_tokens(s, 100, err, sizeof err), DFLASH_ECORRUPT);
        CHECK(strstr(err, path) && strstr(err, flips[f].seq) && strstr(err, "checksum"));
        shard_close(&s);
        raw[flips[f].at] ^= flips[f].xor;
    }
    test_spill(path, raw, len);
    shard *s = shard_open(path, err, sizeof err);
    CHECK(s != NULL);
    CHECK_EQ_INT(shard_verify_tokens(s, 100, err, sizeof err), 0); /* restored */
    uint64_t id2 = s ? shard_identity(s) : 0;
    shard_close(&s);

    /* version 1: zero checksums, unchecked; the same data keeps its identity (a run's batch
     * plan survives a remade shard); a changed id is not seen (the format had none) */
    raw[8] = 1;
    for (uint64_t e = index_off; e < len; e += 16)
        memset(raw + e + 12, 0, 4);
    test_spill(path, raw, len);
    s = shard_open(path, err, sizeof err);
    CHECK(s != NULL && shard_identity(s) == id2);
    shard_close(&s);
    raw[64 + 4 * 2] ^= 1;
    test_spill(path, raw, len);
    s = shard_open(path, err, sizeof err);
    CHECK(s != NULL);
    CHECK_EQ_INT(shard_verify_tokens(s, 100, err, sizeof err), 0);
    shard_close(&s);
    free(raw);

    /* a record longer than the writer's 4 KiB chunk of ids (1024): its checksum chains across
     * chunks, and a change past the first chunk is found */
    enum { LONG = 3000 };
    static int32_t lids[LONG];
    static uint8_t lmask[LONG];
    for (int i = 0; i < LONG; i++) {
        lids[i] = (i * 37) % 100;
        lmask[i] = i % 3 != 0;
    }
    path_of(path, sizeof path, "long.shard");
    shard_writer *w = shard_writer_new(path, 100);
    CHECK_EQ_INT(shard_writer_add(w, lids, lmask, LONG), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    s = shard_open(path, err, sizeof err);
    CHECK(s != NULL);
    CHECK_EQ_INT(shard_verify_tokens(s, 100, err, sizeof err), 0);
    shard_close(&s);
    raw = test_slurp(path, &len);
    raw[64 + 4 * 2500] ^= 2; /* id 2500 * 37 % 100 = 0 -> 2 */
    test_spill(path, raw, len);
    s = shard_open(path, err, sizeof err);
    CHECK(s != NULL);
    CHECK_EQ_INT(shard_verify_tokens(s, 100, err, sizeof err), DFLASH_ECORRUPT);
    shard_close(&s);
    free(raw);
}

static void test_set(void) {
    char a[300], b[300], err[512];
    path_of(a, sizeof a, "a.shard");
    path_of(b, sizeof b, "b.shard");
    shard_writer *w = shard_writer_new(b, 0);
    int32_t big[] = {5000, 1};
    uint8_t m[] = {1, 0};
    CHECK_EQ_INT(shard_writer_add(w, big, m, 2), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    char list[700];
    snprintf(list, sizeof list, "%s,%s", a, b);
    shard_set *set = shard_set_open_list(list, err, sizeof err);
    CHECK(set != NULL);
    if (!set) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    CHECK_EQ_INT(shard_set_count(set), 4);
    CHECK_EQ_INT(shard_set_tokens(set), 17);
    CHECK_EQ_INT(shard_set_vocab(set), 100);
    uint32_t lens[4];
    shard_set_lengths(set, lens);
    CHECK(lens[0] == 5 && lens[1] == 3 && lens[2] == 7 && lens[3] == 2);
    shard_seq q;
    CHECK_EQ_INT(shard_set_get(set, 3, &q), 0);
    CHECK(q.len == 2 && q.ids[0] == 5000 && q.mask[1] == 0);
    CHECK_EQ_INT(shard_set_get(set, 2, &q), 0);
    CHECK(q.len == 7 && q.ids[6] == 13);
    CHECK_EQ_INT(shard_set_get(set, 4, &q), DFLASH_ERANGE);
    CHECK_EQ_INT(shard_set_len(set, 1), 3);
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 0, err, sizeof err), DFLASH_ERANGE);
    CHECK(strstr(err, b) != NULL && strstr(err, "token id 5000") != NULL);
    shard_set_close(&set);
    CHECK(set == NULL);
    snprintf(list, sizeof list, "%s,%s/missing.shard", a, dir);
    set = shard_set_open_list(list, err, sizeof err);
    CHECK(set == NULL);
    CHECK(strstr(err, "missing.shard") != NULL);
    CHECK(shard_set_open_list("", err, sizeof err) == NULL);

    /* a set whose every mask byte is 0 has nothing to train on: the target refuses it at its
     * start (it read it for every epoch, and only the drafter's end said "no step trained") */
    w = shard_writer_new(b, 0);
    uint8_t zero[] = {0, 0};
    int32_t ids[] = {3, 4};
    CHECK_EQ_INT(shard_writer_add(w, ids, zero, 2), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids, zero, 1), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    set = shard_set_open_list(b, err, sizeof err);
    CHECK(set != NULL);
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 0, err, sizeof err), DFLASH_ENODATA);
    CHECK(strstr(err, b) != NULL &&
          strstr(err, "no trainable token: every loss_mask of its 2 sequences is 0") != NULL);
    shard_set_close(&set);
    /* with a (the round trip's shard, some masks 1) before it, the set trains */
    snprintf(list, sizeof list, "%s,%s", a, b);
    set = shard_set_open_list(list, err, sizeof err);
    CHECK(set != NULL);
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 0, err, sizeof err), 0);
    shard_set_close(&set);

    /* loss tokens, but never two in a row (alternating, one token): no anchor candidate in the
     * set, nothing to train on either; refused as such, alone and after b's all-zero masks. It
     * passed, and the drafter failed at the end ("no step trained") */
    char c[300];
    path_of(c, sizeof c, "c.shard");
    w = shard_writer_new(c, 0);
    int32_t ids5[] = {3, 4, 5, 6, 7};
    uint8_t alt[] = {1, 0, 1, 0, 1}, one[] = {1}, pair[] = {0, 0, 1, 1, 0};
    CHECK_EQ_INT(shard_writer_add(w, ids5, alt, 5), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids5, one, 1), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    snprintf(list, sizeof list, "%s,%s", b, c);
    set = shard_set_open_list(list, err, sizeof err);
    CHECK(set != NULL);
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 0, err, sizeof err), DFLASH_ENODATA);
    const char *want = " and the other shards: no anchor: in none of its 4 sequences do two "
                       "loss tokens come in a row";
    CHECK(strstr(err, b) != NULL && strstr(err, want) != NULL);
    CHECK(strstr(err, "at least two in a row") != NULL);
    if (!strstr(err, "no anchor")) fprintf(stderr, "  %s\n", err);
    shard_set_close(&set);
    /* one pair of adjacent loss tokens anywhere (here the last sequence's last two) is enough */
    w = shard_writer_new(c, 0);
    CHECK_EQ_INT(shard_writer_add(w, ids5, alt, 5), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids5, pair, 5), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    set = shard_set_open_list(list, err, sizeof err);
    CHECK(set != NULL);
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 0, err, sizeof err), 0);
    shard_set_close(&set);
    /* anchors only in sequences longer than max_len (the last bucket: the batch plan leaves them
     * out) are none: refused, counting them and giving their lengths against the bound. It
     * passed, the target ran, and the drafter failed at the end ("no step trained") */
    w = shard_writer_new(c, 0);
    int32_t ids7[] = {3, 4, 5, 6, 7, 8, 9};
    uint8_t all7[] = {1, 1, 1, 1, 1, 1, 1};
    CHECK_EQ_INT(shard_writer_add(w, ids5, alt, 5), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids7, all7, 7), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids5, pair, 5), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    set = shard_set_open_list(list, err, sizeof err);
    CHECK(set != NULL);
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 4, err, sizeof err), DFLASH_ENODATA);
    want = " and the other shards: no anchor in a sequence the buckets keep: the 2 of its 5 "
           "sequences that have one (two loss tokens in a row) are all longer than the last "
           "bucket's 4 tokens (5 to 7 tokens)";
    CHECK(strstr(err, b) != NULL && strstr(err, want) != NULL);
    CHECK(strstr(err, "Give --buckets a last bound of at least 5") != NULL);
    if (!strstr(err, want)) fprintf(stderr, "  %s\n", err);
    /* the pair's 5 tokens fit a last bound of 5: the set trains */
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 5, err, sizeof err), 0);
    CHECK_EQ_INT(shard_set_verify_tokens(set, 100, 0, err, sizeof err), 0);
    shard_set_close(&set);
}

/* A shard's recorded vocabulary against a model's: the same tokenizer passes (vocab_size
 * padded past the tokenizer, or another size of one family), another is refused naming both
 * sizes, and a shard that recorded none (0) is not judged. Nothing compared them: shards made
 * for Llama-3 (128,256) trained a Qwen3 target (151,936) without a word, every id fitting. */
static void test_vocab(void) {
    static const struct {
        uint32_t shard, model;
        bool ok;
    } cases[] = {
        {151936, 151936, true},  /* dflash-data --model of the same model */
        {151669, 151936, true},  /* --vocab of Qwen3's tokenizer */
        {152064, 151936, true},  /* Qwen2.5-7B's data on Qwen2.5-0.5B: one tokenizer */
        {0, 151936, true},       /* unknown */
        {128256, 151936, false}, /* Llama-3's data on Qwen3 */
        {151936, 128256, false}, /* and the other way */
        {32768, 32000, false},   /* Mistral v0.3's on Llama-2 */
        {1024, 512, false},      /* the audit's: a tiny target's data, --vocab 1024 */
        {500, 512, false},       /* 12 apart, more than 512 / 128 */
        {500, 506, false},       /* 6 apart: more than 506 / 128, though less than 506 / 64 */
        {1016, 1024, true},      /* 8 apart: exactly 1024 / 128, still "at most" */
    };
    char path[300], err[512];
    path_of(path, sizeof path, "v.shard");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_basic(path, cases[i].shard);
        shard *s = shard_open(path, err, sizeof err);
        CHECK(s != NULL);
        if (!s) continue;
        err[0] = 0;
        int rc = shard_check_vocab(s, cases[i].model, err, sizeof err);
        CHECK_EQ_INT(rc, cases[i].ok ? 0 : DFLASH_EMISMATCH);
        if (!cases[i].ok) {
            char want[128];
            snprintf(want, sizeof want, "vocabulary of %u tokens, but the model's vocab_size is %u",
                     cases[i].shard, cases[i].model);
            CHECK(strstr(err, path) != NULL && strstr(err, want) != NULL);
            CHECK(strstr(err, "dflash-data --model") != NULL);
            if (!strstr(err, want)) fprintf(stderr, "  message was: %s\n", err);
        }
        shard_close(&s);
    }
    /* over a set: the shard of another vocabulary is the one named */
    char a[300], list[700];
    path_of(a, sizeof a, "va.shard");
    write_basic(a, 151936);
    write_basic(path, 128256);
    snprintf(list, sizeof list, "%s,%s", a, path);
    shard_set *set = shard_set_open_list(list, err, sizeof err);
    CHECK(set != NULL);
    CHECK_EQ_INT(shard_set_check_vocab(set, 151936, err, sizeof err), DFLASH_EMISMATCH);
    CHECK(strstr(err, path) != NULL && strstr(err, "va.shard") == NULL);
    shard_set_close(&set);
}

/* The identity that the plan identity is built from: the same file twice, a copy, the same
 * lengths with other tokens, other lengths, a set's order. */
static void test_identity(void) {
    char a[300], b[300], c[300], d[300], err[512] = "";
    path_of(a, sizeof a, "id-a.shard");
    path_of(b, sizeof b, "id-b.shard");
    path_of(c, sizeof c, "id-c.shard");
    path_of(d, sizeof d, "id-d.shard");
    write_basic(a, 100);
    write_basic(b, 100);
    static const int32_t other[] = {1, 2, 3, 4, 6}; /* ids0 with its last token changed */
    shard_writer *w = shard_writer_new(c, 100);
    CHECK_EQ_INT(shard_writer_add(w, other, mask0, 5), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids1, mask1, 3), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids2, mask2, 7), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    w = shard_writer_new(d, 100);
    CHECK_EQ_INT(shard_writer_add(w, ids0, mask0, 5), 0);
    CHECK_EQ_INT(shard_writer_add(w, ids1, mask1, 2), 0); /* one token shorter */
    CHECK_EQ_INT(shard_writer_add(w, ids2, mask2, 7), 0);
    CHECK_EQ_INT(shard_writer_commit(w), 0);
    shard_writer_destroy(&w);
    shard *sa = shard_open(a, err, sizeof err), *sb = shard_open(b, err, sizeof err);
    shard *sc = shard_open(c, err, sizeof err), *sd = shard_open(d, err, sizeof err);
    CHECK(sa && sb && sc && sd);
    if (sa && sb && sc && sd) {
        CHECK(shard_identity(sa) == shard_identity(sa));
        CHECK(shard_identity(sa) == shard_identity(sb)); /* same contents, another file */
        CHECK(shard_identity(sa) != shard_identity(sc)); /* same lengths, another token */
        CHECK(shard_identity(sa) != shard_identity(sd));
    }
    shard_close(&sa);
    shard_close(&sb);
    shard_close(&sc);
    shard_close(&sd);
    const char *ab[] = {a, c}, *ba[] = {c, a};
    shard_set *s1 = shard_set_open(ab, 2, err, sizeof err), *s2 = shard_set_open(ba, 2, err, sizeof err);
    CHECK(s1 && s2);
    if (s1 && s2) CHECK(shard_set_identity(s1) != shard_set_identity(s2)); /* ids are numbered */
    shard_set_close(&s1);
    shard_set_close(&s2);
}

/* Opens the shard, cuts the file down to its first page, then reads its last sequence. */
static void read_after_truncate(const char *path) {
    char err[512];
    shard *s = shard_open(path, err, sizeof err);
    if (!s) _exit(98);
    if (truncate(path, 4096) != 0) _exit(97);
    shard_seq q;
    int rc = shard_get(s, shard_count(s) - 1, &q);
    long sum = 0;
    for (uint32_t i = 0; rc == 0 && i < q.len; i++) sum += q.ids[i];
    printf("read %ld without a fault\n", sum);
    _exit(0);
}

static void killed_from_outside(const char *path) {
    char err[512];
    shard *s = shard_open(path, err, sizeof err); /* the handler is installed */
    if (!s) _exit(98);
    kill(getpid(), SIGBUS);
    _exit(0);
}

static void test_truncated_while_mapped(void) {
    char path[300], errpath[300];
    path_of(path, sizeof path, "cut.shard");
    path_of(errpath, sizeof errpath, "cut.err");
    enum { N = 6000 };
    static int32_t ids[N];
    static uint8_t mask[N];
    for (int i = 0; i < N; i++) ids[i] = i % 50, mask[i] = 1;
    for (int round = 0; round < 2; round++) {
        shard_writer *w = shard_writer_new(path, 100);
        CHECK_EQ_INT(shard_writer_add(w, ids, mask, 5), 0);
        CHECK_EQ_INT(shard_writer_add(w, ids, mask, N), 0); /* spans pages past the first */
        CHECK_EQ_INT(shard_writer_commit(w), 0);
        shard_writer_destroy(&w);
        int st = test_in_child(round ? killed_from_outside : read_after_truncate, path, errpath);
        if (round) {
            /* the action before ours takes it: the default (killed by SIGBUS), or a sanitizer's
             * handler (its report, exit 1); never our line */
            char *said = test_slurp(errpath, NULL);
            CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0));
            CHECK(strstr(said, "FATAL: reading") == NULL);
            free(said);
            continue;
        }
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
        char *msg = test_slurp(errpath, NULL);
        printf("child: %s", msg);
        CHECK(strstr(msg, path) != NULL);
        CHECK(strstr(msg, "SIGBUS") != NULL);
        CHECK(strstr(msg, "renaming") != NULL);
        free(msg);
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/dflash-test-shard-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_round_trip();
    test_corrupt();
    test_checksum();
    test_set();
    test_vocab();
    test_identity();
    test_truncated_while_mapped();
    test_rmtree(dir);
    CHECK_DONE();
}
