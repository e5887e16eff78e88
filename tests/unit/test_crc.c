/* test_crc: the CRC module (common/crc.h). Known vectors (the check value of each CRC and the
 * iSCSI vectors of RFC 3720 B.4), chaining across every split point, the slicing-by-8 tables
 * against a bit-at-a-time implementation of the definition, and crc32c's hardware path against
 * the portable one on random buffers of odd lengths and offsets. A wrong table, a slip in the
 * hardware path's alignment or tail handling, or a broken chaining convention (which would
 * change journal records, slot headers, TFRecord files and checkpoint checksums) fails here. */
#include "check.h"
#include "crc.h"
#include "rng.h"

#include <stdint.h>
#include <string.h>

/* The definition, one bit at a time: the reference the tables are checked against. */
static uint32_t crc_bitwise(uint32_t poly, uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? poly ^ (crc >> 1) : crc >> 1;
    }
    return ~crc;
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static const struct {
    const char *name;
    crc_fn fn;
    uint32_t poly;
} fns[] = {
    {"crc32_ieee", crc32_ieee, 0xEDB88320u},
    {"crc32c", crc32c, 0x82F63B78u},
    {"crc32c_portable", crc32c_portable, 0x82F63B78u},
};
#define N_FNS (sizeof fns / sizeof fns[0])

static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng_next(&seed);
}

static void test_known_vectors(void) {
    CHECK_EQ_INT(crc32_ieee(0, "123456789", 9), 0xCBF43926u);
    CHECK_EQ_INT(crc32c(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ_INT(crc32c_portable(0, "123456789", 9), 0xE3069283u);

    /* RFC 3720 B.4: 32 zeros, 32 0xff, 0..31, 31..0, and an iSCSI read command PDU */
    uint8_t zeros[32] = {0}, ones[32], inc[32], dec[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++) {
        inc[i] = (uint8_t)i;
        dec[i] = (uint8_t)(31 - i);
    }
    static const uint8_t read_pdu[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                         0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00,
                                         0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00,
                                         0x00, 0x18, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                         0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    crc_fn c[2] = {crc32c, crc32c_portable};
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(c[k](0, zeros, 32), 0x8A9136AAu);
        CHECK_EQ_INT(c[k](0, ones, 32), 0x62A8AB43u);
        CHECK_EQ_INT(c[k](0, inc, 32), 0x46DD794Eu);
        CHECK_EQ_INT(c[k](0, dec, 32), 0x113FDB5Cu);
        CHECK_EQ_INT(c[k](0, read_pdu, 48), 0xD9963A56u);
    }
    /* nothing to add leaves the value alone, whatever it is */
    for (size_t f = 0; f < N_FNS; f++) {
        CHECK_EQ_INT(fns[f].fn(0, "", 0), 0);
        CHECK_EQ_INT(fns[f].fn(0x12345678u, "", 0), 0x12345678u);
    }
}

/* f(f(0, a), b) == f(0, a || b) at every split point, and over three pieces. */
static void test_chaining(void) {
    enum { N = 300 };
    uint8_t buf[N];
    fill_random(buf, N, 1);
    for (size_t f = 0; f < N_FNS; f++) {
        uint32_t whole = fns[f].fn(0, buf, N);
        int bad = 0;
        for (size_t s = 0; s <= N; s++)
            bad += fns[f].fn(fns[f].fn(0, buf, s), buf + s, N - s) != whole;
        for (size_t s = 0; s <= N; s += 7)
            for (size_t t = s; t <= N; t += 13) {
                uint32_t c = fns[f].fn(0, buf, s);
                c = fns[f].fn(c, buf + s, t - s);
                bad += fns[f].fn(c, buf + t, N - t) != whole;
            }
        if (bad) fprintf(stderr, "%s: %d split points disagree\n", fns[f].name, bad);
        CHECK_EQ_INT(bad, 0);
    }
}

/* Every function against the bit-at-a-time definition, at every start alignment. */
static void test_against_definition(void) {
    enum { N = 4096 + 16 };
    static uint8_t buf[N];
    fill_random(buf, N, 2);
    uint64_t r = 3;
    for (size_t f = 0; f < N_FNS; f++) {
        int bad = 0;
        for (int i = 0; i < 200; i++) {
            size_t off = rng_next(&r) % 16, len = rng_next(&r) % 4096;
            uint32_t start = i % 2 ? (uint32_t)rng_next(&r) : 0;
            bad +=
                fns[f].fn(start, buf + off, len) != crc_bitwise(fns[f].poly, start, buf + off, len);
        }
        if (bad)
            fprintf(stderr, "%s: %d of 200 buffers differ from the definition\n", fns[f].name, bad);
        CHECK_EQ_INT(bad, 0);
    }
}

/* crc32c (the instruction, where the CPU has it) against crc32c_portable: odd lengths, every
 * start offset mod 8, lengths that end mid-word, large buffers, and a chain that mixes both. */
static void test_hardware_matches_portable(void) {
    enum { N = (1 << 20) + 64 };
    static uint8_t buf[N];
    fill_random(buf, N, 4);
    printf("crc32c path: %s\n", crc32c_hardware() ? "SSE4.2 crc32 instruction" : "portable only");
    uint64_t r = 5;
    int bad = 0;
    for (int i = 0; i < 2000; i++) {
        size_t off = rng_next(&r) % 64;
        size_t len = i < 1000 ? rng_next(&r) % 200 : rng_next(&r) % (N - 64);
        len |= 1; /* odd: a tail after the last 8-byte word */
        uint32_t start = (uint32_t)rng_next(&r);
        bad += crc32c(start, buf + off, len) != crc32c_portable(start, buf + off, len);
    }
    CHECK_EQ_INT(bad, 0);
    /* every length 0..64 at every offset 0..7: all the head and tail cases */
    bad = 0;
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; len <= 64; len++)
            bad += crc32c(0, buf + off, len) != crc32c_portable(0, buf + off, len);
    CHECK_EQ_INT(bad, 0);
    /* a chain alternating the two paths over uneven pieces equals either path over the whole */
    uint32_t mixed = 0;
    size_t at = 0;
    for (int k = 0; at < N; k++) {
        size_t piece = 1 + rng_next(&r) % 100000;
        if (piece > N - at) piece = N - at;
        mixed = k % 2 ? crc32c(mixed, buf + at, piece) : crc32c_portable(mixed, buf + at, piece);
        at += piece;
    }
    CHECK_EQ_INT(mixed, crc32c(0, buf, N));
    CHECK_EQ_INT(mixed, crc32c_portable(0, buf, N));
}

int main(void) {
    test_known_vectors();
    test_chaining();
    test_against_definition();
    test_hardware_matches_portable();
    CHECK_DONE();
}
