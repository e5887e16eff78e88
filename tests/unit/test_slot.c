/* test_slot: the slot layout is aligned and sized as documented, a reader rejects a corrupt,
 * foreign or mismatched header with the right code, and the synthetic batch verifies byte for
 * byte while a single flipped bit anywhere is caught, and keeps synthetic.h's contract (lengths,
 * mask, value grid), which fill and verify, sharing one generator, cannot check alone. */
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

/* synthetic.h's contract, beyond "fill and verify agree" (they share one generator, so a wrong
 * generator passes that check): the bucket's length range, sequences within it and within
 * max_seqs, a first sequence longer than the budget truncated to it, the loss mask's first
 * quarter, hidden values exact on their grid in [-1, 1), bad params refused, and the verifier
 * refusing another bucket, a header whose counts differ, and naming the first bad token. */
static void test_synthetic_contract(void)
{
    uint32_t upper[] = {64, 128, 512};
    synthetic_params p = synthetic_bucket_params(upper, 3, 0, 1000, 512);
    CHECK(p.min_seq_len == 1 && p.max_seq_len == 64 && p.vocab_size == 1000);
    p = synthetic_bucket_params(upper, 3, 1, 1000, 512);
    CHECK(p.min_seq_len == 65 && p.max_seq_len == 128);
    p = synthetic_bucket_params(upper, 3, 2, 1000, 100); /* capped at the budget */
    CHECK(p.min_seq_len == 100 && p.max_seq_len == 100);
    p = synthetic_bucket_params(upper, 3, 1, 1000, 1);
    CHECK(p.min_seq_len == 1 && p.max_seq_len == 1);
    p = synthetic_bucket_params(upper, 3, 3, 1000, 300); /* no such bucket: any length */
    CHECK(p.min_seq_len == 1 && p.max_seq_len == 300);

    slot_layout l, lb;
    CHECK_EQ_INT(slot_layout_compute(512, 8, 16, 2, SLOT_DTYPE_F32, &l), 0);
    CHECK_EQ_INT(slot_layout_compute(512, 8, 16, 2, SLOT_DTYPE_BF16, &lb), 0);
    uint8_t *s = aligned_alloc(SLOT_ALIGN, l.slot_bytes), *sb = aligned_alloc(SLOT_ALIGN, lb.slot_bytes);
    synthetic_params sp = {.vocab_size = 50, .min_seq_len = 10, .max_seq_len = 30};
    uint32_t full = 0, short_len = 0, bad_len = 0, bad_mask = 0, bad_f32 = 0, bad_bf16 = 0;
    char err[256] = "";
    for (uint64_t batch = 0; batch < 200; batch++) {
        slot_work_unit wu = {.epoch = 1, .bucket = 0, .batch = batch};
        int n = synthetic_fill(s, &l, &wu, &sp, 9);
        slot_header h;
        if (n <= 0 || slot_header_check(s, &l, &h, err, sizeof err) != 0 ||
            slot_arrays_check(s, &l, sp.vocab_size, err, sizeof err) != 0) {
            CHECK(!"a synthetic batch fills and passes the slot's checks");
            break;
        }
        if (h.n_seqs == l.max_seqs) full++;
        const int32_t *so = slot_seq_offsets(s, &l);
        const uint8_t *mask = slot_loss_mask(s, &l);
        for (uint32_t q = 0; q < h.n_seqs; q++) {
            uint32_t len = (uint32_t)(so[q + 1] - so[q]);
            if (len < sp.min_seq_len) short_len++;
            if (len < sp.min_seq_len || len > sp.max_seq_len) bad_len++;
            for (uint32_t t = 0; t < len; t++)
                if (mask[so[q] + t] != (t >= len / 4)) bad_mask++;
        }
        const float *hf = slot_hidden(s, &l);
        for (size_t i = 0; i < (size_t)n * 2 * 16; i++) {
            double scaled = (double)hf[i] * (1 << 23);
            if (!(hf[i] >= -1.0f && hf[i] < 1.0f) || scaled != (double)(int64_t)scaled) bad_f32++;
        }
        CHECK_EQ_INT(synthetic_fill(sb, &lb, &wu, &sp, 9), n);
        const uint16_t *hb = slot_hidden(sb, &lb);
        for (size_t i = 0; i < (size_t)n * 2 * 16; i++) {
            uint32_t bits = (uint32_t)hb[i] << 16;
            float v;
            memcpy(&v, &bits, 4);
            double scaled = (double)v * 128;
            if (!(v >= -1.0f && v < 1.0f) || scaled != (double)(int64_t)scaled) bad_bf16++;
        }
    }
    CHECK(full > 0); /* 8 sequences of 10..30 tokens fit 512: max_seqs is what stops them */
    CHECK_EQ_INT(short_len, 0);
    CHECK_EQ_INT(bad_len, 0);
    CHECK_EQ_INT(bad_mask, 0);
    CHECK_EQ_INT(bad_f32, 0);
    CHECK_EQ_INT(bad_bf16, 0);

    /* a first sequence longer than the budget is cut to it: every batch has tokens */
    synthetic_params lng = {.vocab_size = 50, .min_seq_len = 600, .max_seq_len = 700};
    slot_work_unit wu = {.epoch = 1, .bucket = 2, .batch = 5};
    CHECK_EQ_INT(synthetic_fill(s, &l, &wu, &lng, 9), 512);
    CHECK_EQ_INT(slot_seq_offsets(s, &l)[1], 512);
    CHECK_EQ_INT(slot_positions(s, &l)[511], 511);
    CHECK_EQ_INT(slot_arrays_check(s, &l, 50, err, sizeof err), 0);
    CHECK_EQ_INT(synthetic_verify(s, &l, &wu, &lng, NULL, err, sizeof err), 0);

    /* bad params: refused by both sides */
    synthetic_params bad[] = {{0, 10, 30}, {50, 0, 30}, {50, 31, 30}};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(synthetic_fill(s, &l, &wu, &bad[i], 9), DFLASH_EINVAL);
        CHECK_EQ_INT(synthetic_verify(s, &l, &wu, &bad[i], NULL, err, sizeof err), DFLASH_EINVAL);
    }

    /* the verifier: another bucket is another batch; a header whose token count differs (crc
     * right) is refused; the first bad token is the one reported */
    int n = synthetic_fill(s, &l, &wu, &sp, 9);
    slot_work_unit other_bucket = wu;
    other_bucket.bucket = 1;
    CHECK_EQ_INT(synthetic_verify(s, &l, &other_bucket, &sp, NULL, err, sizeof err),
                 DFLASH_EMISMATCH);
    CHECK(strstr(err, "bucket 2") && strstr(err, "bucket 1"));
    slot_header h;
    CHECK_EQ_INT(slot_header_check(s, &l, &h, NULL, 0), 0);
    slot_header_write(s, &l, &wu, h.n_seqs, (uint32_t)n - 1, 9);
    CHECK_EQ_INT(synthetic_verify(s, &l, &wu, &sp, NULL, err, sizeof err), DFLASH_ECORRUPT);
    CHECK(strstr(err, "slot header says") != NULL);
    synthetic_fill(s, &l, &wu, &sp, 9);
    ((uint8_t *)slot_hidden(s, &l))[3 * l.row_bytes + 1] ^= 1;
    ((uint8_t *)slot_hidden(s, &l))[9 * l.row_bytes + 1] ^= 1;
    synthetic_report rep;
    CHECK_EQ_INT(synthetic_verify(s, &l, &wu, &sp, &rep, err, sizeof err), DFLASH_ECORRUPT);
    CHECK_EQ_INT(rep.bad_bytes, 2);
    CHECK_EQ_INT(rep.bad_token, 3);
    CHECK(strstr(err, "token 3 ") != NULL);
    free(s);
    free(sb);
}

int main(void)
{
    test_layer_ids();
    test_synthetic_contract();
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
