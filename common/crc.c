/* crc: CRC-32 (IEEE) and CRC-32C (Castagnoli); contract in crc.h.
 *
 * Portable path, slicing-by-8: table[0] is the classic byte-at-a-time table of a reflected
 * polynomial; table[k][b] is the CRC of byte b followed by k zero bytes, so eight input bytes
 * are folded with eight independent lookups instead of eight dependent ones. Bytes are read one
 * by one and composed, so the result does not depend on the host's byte order.
 *
 * Hardware path (x86-64 with SSE4.2 only): the crc32 instruction computes CRC-32C over 8 bytes
 * at a time. One instruction waits for the previous one's result (a latency of about three
 * cycles, a throughput of one per cycle), so long buffers go in blocks of three streams of
 * SSE42_STRIDE bytes, each with its own register, and the three registers are then joined:
 * the register is linear in (start value, data), so
 *   reg(r, A || B) = shift(reg(r, A), |B|) ^ reg(0, B)
 * where shift(x, n) is the register after n zero bytes from x, a linear map of x. For n =
 * SSE42_STRIDE it is tabulated once, by byte lane (shift_stride). The path lives in functions
 * compiled for SSE4.2 (target attribute) and runs only when __builtin_cpu_supports says the CPU
 * has it, so the rest of the build assumes nothing.
 *
 * Both work on the inverted register (the "~crc" in and out is what makes 0 the start value and
 * lets calls chain). The tables and the CPU check are set once under pthread_once; afterwards
 * everything is read-only, so any thread may call at any time.
 */
#include "crc.h"

#include <pthread.h>
#include <string.h>

/* DFLASH_CRC_PORTABLE_ONLY builds the tables alone, as on a machine without the instruction
 * (tests/CMakeLists.txt's test_crc_portable: the build and results other CPUs get). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) &&                        \
    !defined(DFLASH_CRC_PORTABLE_ONLY)
#define CRC_HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#endif

#define POLY_IEEE 0xEDB88320u
#define POLY_CASTAGNOLI 0x82F63B78u

#define SSE42_STRIDE 8192 /* bytes per stream in a block of three */

typedef uint32_t slice8_table[8][256];

static slice8_table table_ieee, table_castagnoli;
static bool use_sse42;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void slice8_table_build(slice8_table t, uint32_t poly) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? poly ^ (c >> 1) : c >> 1;
        t[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (uint32_t b = 0; b < 256; b++)
            t[k][b] = t[0][t[k - 1][b] & 0xff] ^ (t[k - 1][b] >> 8);
}

/* The register (already inverted) after n bytes at p. */
static uint32_t slice8_update(const slice8_table t, uint32_t crc, const uint8_t *p, size_t n) {
    for (; n >= 8; p += 8, n -= 8) {
        crc ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        crc = t[7][crc & 0xff] ^ t[6][(crc >> 8) & 0xff] ^ t[5][(crc >> 16) & 0xff] ^
              t[4][crc >> 24] ^ t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    }
    for (; n; p++, n--)
        crc = t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
    return crc;
}

#ifdef CRC_HAVE_SSE42_PATH
static uint32_t shift_stride[4][256]; /* x -> shift(x, SSE42_STRIDE) as x's bytes' images */

/* The register after n zero bytes from reg, through the tables: shift(reg, n) of the top. */
static uint32_t castagnoli_after_zeros(uint32_t reg, size_t n) {
    static const uint8_t zeros[256];
    for (size_t k; n; n -= k) {
        k = n < sizeof zeros ? n : sizeof zeros;
        reg = slice8_update(table_castagnoli, reg, zeros, k);
    }
    return reg;
}

/* shift_stride[k][b] = shift(b << 8k, SSE42_STRIDE), from the images of the 32 single bits. */
static void shift_stride_build(void) {
    uint32_t bit_image[32];
    for (int j = 0; j < 32; j++)
        bit_image[j] = castagnoli_after_zeros(1u << j, SSE42_STRIDE);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t x = 0;
            for (int i = 0; i < 8; i++)
                if (b & (1u << i)) x ^= bit_image[8 * k + i];
            shift_stride[k][b] = x;
        }
}
#endif

static void crc_init(void) {
    slice8_table_build(table_ieee, POLY_IEEE);
    slice8_table_build(table_castagnoli, POLY_CASTAGNOLI);
#ifdef CRC_HAVE_SSE42_PATH
    use_sse42 = __builtin_cpu_supports("sse4.2");
    if (use_sse42) shift_stride_build();
#endif
}

#ifdef CRC_HAVE_SSE42_PATH
static uint32_t shift_by_stride(uint32_t x) {
    return shift_stride[0][x & 0xff] ^ shift_stride[1][(x >> 8) & 0xff] ^
           shift_stride[2][(x >> 16) & 0xff] ^ shift_stride[3][x >> 24];
}

__attribute__((target("sse4.2"))) static uint64_t sse42_word(uint64_t reg, const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return _mm_crc32_u64(reg, v);
}

/* The register (already inverted) after n bytes at p, with the crc32 instruction: single bytes
 * up to 8-byte alignment, blocks of three interleaved streams, 8-byte words, the tail. */
__attribute__((target("sse4.2"))) static uint32_t sse42_update(uint32_t crc, const uint8_t *p,
                                                               size_t n) {
    for (; n && ((uintptr_t)p & 7); p++, n--)
        crc = _mm_crc32_u8(crc, *p);
    for (; n >= 3 * SSE42_STRIDE; p += 3 * SSE42_STRIDE, n -= 3 * SSE42_STRIDE) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        for (size_t i = 0; i < SSE42_STRIDE; i += 8) {
            c0 = sse42_word(c0, p + i);
            c1 = sse42_word(c1, p + SSE42_STRIDE + i);
            c2 = sse42_word(c2, p + 2 * SSE42_STRIDE + i);
        }
        crc = shift_by_stride(shift_by_stride((uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
    }
    uint64_t c = crc;
    for (; n >= 8; p += 8, n -= 8)
        c = sse42_word(c, p);
    crc = (uint32_t)c;
    for (; n; p++, n--)
        crc = _mm_crc32_u8(crc, *p);
    return crc;
}
#endif

uint32_t crc32_ieee(uint32_t crc, const void *data, size_t n) {
    pthread_once(&init_once, crc_init);
    return ~slice8_update(table_ieee, ~crc, data, n);
}

uint32_t crc32c_portable(uint32_t crc, const void *data, size_t n) {
    pthread_once(&init_once, crc_init);
    return ~slice8_update(table_castagnoli, ~crc, data, n);
}

uint32_t crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&init_once, crc_init);
#ifdef CRC_HAVE_SSE42_PATH
    if (use_sse42) return ~sse42_update(~crc, data, n);
#endif
    return ~slice8_update(table_castagnoli, ~crc, data, n);
}

bool crc32c_hardware(void) {
    pthread_once(&init_once, crc_init);
    return use_sse42;
}
