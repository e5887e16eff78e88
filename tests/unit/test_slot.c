/* test_slot: the slot layout is aligned and sized as documented, a reader rejects a corrupt,
 * foreign or mismatched header with the right code, and the synthetic batch verifies byte for
 * byte while a single flipped bit anywhere is caught. */
#include "check.h"
#include "crc.h"
#include "err.h"
#include "slot.h"
#include "synthetic.h"

#include <stdlib.h>
#include <string.h>

/* The captured layer ids travel in the header: a reader that expects other layers is refused
 * with both lists named; either side may leave them unknown. */
static void test_layer_ids(void)
{
    slot_layout w, r;
    CHECK_EQ_INT(slot_layout_compute(64, 2, 16, 3, SLOT_DTYPE_F32, &w), 0);
    r = w;
    CHECK(!slot_layout_has_layer_ids(&w));
    int have[] = {1, 3, 5}, want[] = {1, 2, 5}, four[] = {1, 2, 3, 4};
    CHECK_EQ_INT(slot_layout_set_layer_ids(&w, have, 3), 0);
    CHECK_EQ_INT(slot_layout_set_layer_ids(&r, four, 4), DFLASH_EINVAL);
    CHECK(slot_layout_has_layer_ids(&w));
    void *s = aligned_alloc(SLOT_ALIGN, w.slot_bytes);
    slot_work_unit wu = {.epoch = 0, .bucket = 1, .batch = 2};
    slot_header_write(s, &w, &wu, 1, 8, 7);
    char err[256] = "";
    CHECK_EQ_INT(slot_header_check(s, &r, NULL, err, sizeof err), 0); /* reader does not care */
    CHECK_EQ_INT(slot_layout_set_layer_ids(&r, want, 3), 0);
    CHECK_EQ_INT(slot_header_check(s, &r, NULL, err, sizeof err), DFLASH_EMISMATCH);
    CHECK(strstr(err, "[1, 3, 5]") && strstr(err, "[1, 2, 5]"));
    CHECK_EQ_INT(slot_layout_set_layer_ids(&r, have, 3), 0);
    CHECK_EQ_INT(slot_header_check(s, &r, NULL, err, sizeof err), 0);
    slot_layout anon;
    CHECK_EQ_INT(slot_layout_compute(64, 2, 16, 3, SLOT_DTYPE_F32, &anon), 0);
    slot_header_write(s, &anon, &wu, 1, 8, 7); /* a producer that cannot say (synthetic) */
    CHECK_EQ_INT(slot_header_check(s, &r, NULL, err, sizeof err), 0);
    free(s);
}

int main(void)
{
    test_layer_ids();
    slot_layout l;
    CHECK_EQ_INT(slot_layout_compute(512, 8, 64, 3, SLOT_DTYPE_F32, &l), 0);
    size_t offs[] = {l.off_seq_offsets, l.off_positions, l.off_token_ids, l.off_loss_mask,
                     l.off_hidden, l.slot_bytes};
    for (size_t i = 0; i < 6; i++) CHECK_EQ_INT(offs[i] % SLOT_ALIGN, 0);
    CHECK(l.off_seq_offsets >= sizeof(slot_header));
    CHECK(l.off_positions >= l.off_seq_offsets + 9 * 4);
    CHECK(l.off_token_ids >= l.off_positions + 512 * 4);
    CHECK(l.off_loss_mask >= l.off_token_ids + 512 * 4);
    CHECK(l.off_hidden >= l.off_loss_mask + 512);
    CHECK_EQ_INT(l.row_bytes, 3 * 64 * 4);
    CHECK(l.slot_bytes >= l.off_hidden + 512 * l.row_bytes);
    CHECK(l.slot_bytes < l.off_hidden + 512 * l.row_bytes + SLOT_ALIGN);
    slot_layout lb;
    CHECK_EQ_INT(slot_layout_compute(512, 8, 64, 3, SLOT_DTYPE_BF16, &lb), 0);
    CHECK_EQ_INT(lb.row_bytes, 3 * 64 * 2);
    /* bad shapes */
    CHECK_EQ_INT(slot_layout_compute(0, 8, 64, 3, SLOT_DTYPE_F32, &l), DFLASH_EINVAL);
    CHECK_EQ_INT(slot_layout_compute(512, 8, 64, 3, (slot_dtype)7, &l), DFLASH_EINVAL);
    CHECK_EQ_INT(slot_layout_compute(SLOT_MAX_TOKENS + 1, 8, 64, 3, SLOT_DTYPE_F32, &l),
                 DFLASH_ERANGE);
    CHECK_EQ_INT(slot_layout_compute(16, 32, 64, 3, SLOT_DTYPE_F32, &l), DFLASH_ERANGE);

    /* a synthetic batch verifies; header checks */
    CHECK_EQ_INT(slot_layout_compute(512, 8, 64, 3, SLOT_DTYPE_F32, &l), 0);
    uint8_t *s = aligned_alloc(256, l.slot_bytes);
    memset(s, 0xAB, l.slot_bytes);
    synthetic_params sp = {.vocab_size = 1000, .min_seq_len = 40, .max_seq_len = 200};
    slot_work_unit wu = {.epoch = 2, .bucket = 1, .batch = 77};
    int n = synthetic_fill(s, &l, &wu, &sp, 0x1234);
    CHECK(n > 0 && n <= 512);
    char err[256] = "";
    slot_header h;
    CHECK_EQ_INT(slot_header_check(s, &l, &h, err, sizeof err), 0);
    CHECK_EQ_INT(h.n_tokens, n);
    CHECK(h.n_seqs >= 2); /* 512 tokens of 40..200-token sequences pack several */
    CHECK_EQ_INT(h.producer, 0x1234);
    CHECK_EQ_INT(slot_arrays_check(s, &l, sp.vocab_size, err, sizeof err), 0);
    synthetic_report rep;
    CHECK_EQ_INT(synthetic_verify(s, &l, &wu, &sp, &rep, err, sizeof err), 0);
    CHECK_EQ_INT(rep.bad_bytes, 0);
    CHECK_EQ_INT(rep.bytes_checked, sizeof(slot_header) + (h.n_seqs + 1) * 4 + n * 9 +
                                        (uint64_t)n * l.row_bytes);
    /* deterministic: a second fill of the same unit is byte-identical over the used prefix */
    uint8_t *s2 = aligned_alloc(256, l.slot_bytes);
    memset(s2, 0, l.slot_bytes);
    synthetic_fill(s2, &l, &wu, &sp, 0x1234);
    CHECK(memcmp(s, s2, slot_used_bytes(&l, (uint32_t)n)) == 0);
    /* another unit differs and is refused by the verifier as the wrong batch */
    slot_work_unit other = {.epoch = 2, .bucket = 1, .batch = 78};
    CHECK_EQ_INT(synthetic_verify(s, &l, &other, &sp, NULL, err, sizeof err), DFLASH_EMISMATCH);
    CHECK(strstr(err, "batch 78") != NULL);

    /* the reader expects another layout */
    slot_layout l2;
    slot_layout_compute(512, 8, 64, 4, SLOT_DTYPE_F32, &l2);
    CHECK_EQ_INT(slot_header_check(s, &l2, NULL, err, sizeof err), DFLASH_EMISMATCH);
    CHECK(strstr(err, "layers 3") && strstr(err, "layers 4"));

    /* corruptions of the header */
    memcpy(s2, s, l.slot_bytes);
    s2[0] ^= 1; /* magic */
    CHECK_EQ_INT(slot_header_check(s2, &l, NULL, err, sizeof err), DFLASH_EFORMAT);
    memcpy(s2, s, sizeof(slot_header));
    ((slot_header *)s2)->version = 9;
    CHECK_EQ_INT(slot_header_check(s2, &l, NULL, err, sizeof err), DFLASH_EVERSION);
    for (size_t off = 12; off < offsetof(slot_header, crc); off += 5) {
        memcpy(s2, s, sizeof(slot_header));
        s2[off] ^= 0x10;
        CHECK_EQ_INT(slot_header_check(s2, &l, NULL, err, sizeof err), DFLASH_ECORRUPT);
    }
    /* a consistent header (crc recomputed) claiming more tokens than fit */
    memcpy(s2, s, sizeof(slot_header));
    slot_header *hh = (slot_header *)s2;
    hh->n_tokens = 513;
    hh->crc = crc32_ieee(0, hh, offsetof(slot_header, crc));
    CHECK_EQ_INT(slot_header_check(s2, &l, NULL, err, sizeof err), DFLASH_ERANGE);

    /* one flipped bit in each region is caught and located */
    size_t where[] = {l.off_seq_offsets + 4, l.off_positions + 8, l.off_token_ids,
                      l.off_loss_mask + 3, l.off_hidden + 5 * l.row_bytes + 2 * 64 * 4 + 7 * 4 + 1};
    for (size_t i = 0; i < 5; i++) {
        memcpy(s2, s, l.slot_bytes);
        s2[where[i]] ^= 0x04;
        CHECK_EQ_INT(synthetic_verify(s2, &l, &wu, &sp, &rep, err, sizeof err), DFLASH_ECORRUPT);
        CHECK_EQ_INT(rep.bad_bytes, 1);
    }
    CHECK_EQ_INT(rep.bad_token, 5);
    CHECK_EQ_INT(rep.bad_layer, 2);
    CHECK_EQ_INT(rep.bad_channel, 7);
    /* arrays check catches a token id out of vocabulary and broken positions */
    memcpy(s2, s, l.slot_bytes);
    slot_token_ids(s2, &l)[3] = 5000;
    CHECK_EQ_INT(slot_arrays_check(s2, &l, 1000, err, sizeof err), DFLASH_ECORRUPT);
    CHECK(strstr(err, "token ids") != NULL);
    memcpy(s2, s, l.slot_bytes);
    slot_positions(s2, &l)[1] = 7;
    CHECK_EQ_INT(slot_arrays_check(s2, &l, 1000, err, sizeof err), DFLASH_ECORRUPT);
    /* the vocabulary bound is exclusive, and a loss mask byte is 0 or 1 (the drafter weighs
     * each token's loss by it) */
    memcpy(s2, s, l.slot_bytes);
    slot_token_ids(s2, &l)[3] = 1000;
    CHECK_EQ_INT(slot_arrays_check(s2, &l, 1000, err, sizeof err), DFLASH_ECORRUPT);
    CHECK(strstr(err, "token ids") != NULL);
    memcpy(s2, s, l.slot_bytes);
    slot_loss_mask(s2, &l)[2] = 2;
    CHECK_EQ_INT(slot_arrays_check(s2, &l, 1000, err, sizeof err), DFLASH_ECORRUPT);
    CHECK(strstr(err, "loss mask") != NULL);

    /* bf16 synthetic batches verify too */
    uint8_t *sb = aligned_alloc(256, lb.slot_bytes);
    CHECK(synthetic_fill(sb, &lb, &wu, &sp, 1) > 0);
    CHECK_EQ_INT(synthetic_verify(sb, &lb, &wu, &sp, NULL, err, sizeof err), 0);
    free(sb);
    free(s);
    free(s2);
    CHECK_DONE();
}
