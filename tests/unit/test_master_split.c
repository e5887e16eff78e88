/* test_master_split: the split fp32 master of master_split.h. Every high half with a set of low
 * halves (the ties, their neighbours, the extremes) and a million random values: joining the two
 * halves gives the fp32 bits back exactly (NaN: a NaN), and the high half is the bf16 weight the
 * checkpoints write (safetensors_f32_to_bf16: round to nearest even) except at the ties the
 * rounding documents (low half 0x8000 under an odd high half: one unit lower). The n-value
 * loops give every value back when the join runs in place over the staged low halves.
 */
#include "check.h"
#include "master_split.h"
#include "safetensors.h"

#include <stdint.h>
#include <string.h>

static int is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* One value: 0 if it behaves, else a bit per failed property (1: join, 2: rounding). */
static int check_one(uint32_t u) {
    uint16_t hi = nn_master_hi(u), lo = (uint16_t)u;
    uint32_t back = nn_master_join(hi, lo);
    int bad = 0;
    if (is_nan(u) ? !is_nan(back) : back != u) bad |= 1;
    float f;
    memcpy(&f, &u, sizeof f);
    uint16_t rne = safetensors_f32_to_bf16(f);
    int tie_odd = !is_nan(u) && lo == 0x8000u && ((u >> 16) & 1u);
    uint16_t want = tie_odd ? (uint16_t)(u >> 16) : rne;
    if (is_nan(u) ? !is_nan((uint32_t)hi << 16) : hi != want) bad |= 2;
    return bad;
}

int main(void) {
    static const uint16_t lows[] = {0x0000, 0x0001, 0x4000, 0x7fff, 0x8000,
                                    0x8001, 0xbfff, 0xfffe, 0xffff};
    int join_bad = 0, round_bad = 0, ties = 0;
    for (uint32_t h = 0; h <= 0xffffu; h++)
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
            uint32_t u = h << 16 | lows[k];
            int b = check_one(u);
            join_bad += b & 1, round_bad += (b >> 1) & 1;
            ties += lows[k] == 0x8000u && (h & 1u) && !is_nan(u);
        }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 1000000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int b = check_one((uint32_t)(s >> 32));
        join_bad += b & 1, round_bad += (b >> 1) & 1;
    }
    /* the loops, joining in place over the low halves (as dflash_model's download stages
     * them): every value back */
    enum { N = 1000 };
    float src[N], dst[N];
    uint16_t hi[N];
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32) & 0xbfffffffu; /* finite: no NaN to compare */
        memcpy(src + i, &u, sizeof u);
    }
    uint16_t *lo = (uint16_t *)dst;
    nn_master_split_n(src, hi, lo, N);
    nn_master_join_n(hi, lo, dst, N);
    CHECK(!memcmp(src, dst, sizeof src));
    CHECK_EQ_INT(join_bad, 0);
    CHECK_EQ_INT(round_bad, 0);
    CHECK(ties > 30000); /* the ties-toward-zero cases were visited */
    /* the extremes by name: the largest finite value rounds to infinity and comes back */
    CHECK_EQ_INT(nn_master_hi(0x7f7fffffu), 0x7f80);
    CHECK_EQ_INT(nn_master_join(0x7f80, 0xffff), 0x7f7fffff);
    CHECK_EQ_INT(nn_master_join(nn_master_hi(0x80000000u), 0), 0x80000000u); /* -0 */
    CHECK_DONE();
}
