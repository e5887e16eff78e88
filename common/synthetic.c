/* synthetic: see synthetic.h. One 64-bit mixer (splitmix64 finaliser constants, written from the
 * published recurrence) turns (work unit, indices) into values; rows are generated into a scratch
 * row and copied or compared with memcmp, so fill and verify share one generator. */
#include "synthetic.h"
#include "rng.h"
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t wu_seed(const slot_work_unit *wu)
{
    return rng_hash64(rng_hash64(((uint64_t)wu->epoch << 32) | wu->bucket) ^ wu->batch);
}

static bool params_ok(const synthetic_params *sp)
{
    return sp && sp->vocab_size > 0 && sp->min_seq_len >= 1 && sp->max_seq_len >= sp->min_seq_len;
}

/* Sequence s's drawn length (before packing). */
static uint32_t seq_len(uint64_t seed, const synthetic_params *sp, uint32_t s)
{
    uint32_t span = sp->max_seq_len - sp->min_seq_len + 1;
    return sp->min_seq_len + (uint32_t)(rng_hash64(seed ^ (0x5E0000000ull + s)) % span);
}

synthetic_params synthetic_bucket_params(const uint32_t *upper, uint32_t n_buckets,
                                         uint32_t bucket, uint32_t vocab_size,
                                         uint32_t token_budget)
{
    synthetic_params sp = {.vocab_size = vocab_size ? vocab_size : 1, .min_seq_len = 1,
                           .max_seq_len = token_budget ? token_budget : 1};
    if (bucket < n_buckets) {
        if (bucket > 0) sp.min_seq_len = upper[bucket - 1] + 1;
        sp.max_seq_len = upper[bucket];
    }
    if (sp.max_seq_len > token_budget && token_budget) sp.max_seq_len = token_budget;
    if (sp.min_seq_len > sp.max_seq_len) sp.min_seq_len = sp.max_seq_len;
    return sp;
}

void synthetic_shape(const slot_layout *l, const slot_work_unit *wu, const synthetic_params *sp,
                     uint32_t *n_seqs, uint32_t *n_tokens)
{
    uint64_t seed = wu_seed(wu);
    uint32_t seqs = 0, tokens = 0;
    while (seqs < l->max_seqs) {
        uint32_t len = seq_len(seed, sp, seqs);
        if (tokens + len > l->token_budget) {
            if (seqs == 0) { /* truncate the first so every batch has tokens */
                tokens = l->token_budget;
                seqs = 1;
            }
            break;
        }
        tokens += len;
        seqs++;
    }
    *n_seqs = seqs;
    *n_tokens = tokens;
}

/* The expected hidden row of token t (all layers), written into row (l->row_bytes bytes). */
static void gen_row(uint64_t seed, const slot_layout *l, uint32_t t, void *row)
{
    uint64_t tseed = rng_hash64(seed ^ ((uint64_t)t << 20));
    for (uint32_t k = 0; k < l->n_layers; k++) {
        uint64_t kseed = rng_hash64(tseed ^ ((uint64_t)k * 0xD1B54A32D192ED03ull));
        size_t base = (size_t)k * l->hidden;
        if (l->dtype == SLOT_DTYPE_F32) {
            float *out = (float *)row + base;
            for (uint32_t c = 0; c < l->hidden; c++) {
                uint64_t h = rng_hash64(kseed + c);
                out[c] = (float)((int32_t)(h >> 40) - (1 << 23)) * (1.0f / (1 << 23));
            }
        } else {
            uint16_t *out = (uint16_t *)row + base;
            for (uint32_t c = 0; c < l->hidden; c++) {
                uint64_t h = rng_hash64(kseed + c);
                float v = (float)((int32_t)(h >> 56) - 128) * (1.0f / 128); /* exact in bf16 */
                uint32_t bits;
                memcpy(&bits, &v, 4);
                out[c] = (uint16_t)(bits >> 16);
            }
        }
    }
}

static int32_t token_id(uint64_t seed, const synthetic_params *sp, uint32_t t)
{
    return (int32_t)(rng_hash64(seed ^ (0x70CE000000000ull + t)) % sp->vocab_size);
}

/* Fills the arrays part (offsets, positions, ids, mask) of the synthetic batch into a zeroed
 * region laid out like the slot (base points at the slot start). */
static void gen_arrays(void *base, const slot_layout *l, uint64_t seed, const synthetic_params *sp,
                       uint32_t n_seqs, uint32_t n_tokens)
{
    int32_t *so = slot_seq_offsets(base, l);
    int32_t *pos = slot_positions(base, l);
    int32_t *tok = slot_token_ids(base, l);
    uint8_t *mask = slot_loss_mask(base, l);
    uint32_t t = 0;
    so[0] = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        uint32_t len = seq_len(seed, sp, s);
        if (t + len > n_tokens) len = n_tokens - t;
        for (uint32_t p = 0; p < len; p++, t++) {
            pos[t] = (int32_t)p;
            tok[t] = token_id(seed, sp, t);
            mask[t] = p >= len / 4 ? 1 : 0;
        }
        so[s + 1] = (int32_t)t;
    }
}

int synthetic_fill(void *base, const slot_layout *l, const slot_work_unit *wu,
                   const synthetic_params *sp, uint64_t producer)
{
    if (!params_ok(sp)) return DFLASH_EINVAL;
    uint64_t seed = wu_seed(wu);
    uint32_t n_seqs, n_tokens;
    synthetic_shape(l, wu, sp, &n_seqs, &n_tokens);
    memset(base, 0, l->off_hidden); /* header padding and unused array tails too */
    gen_arrays(base, l, seed, sp, n_seqs, n_tokens);
    char *hidden = slot_hidden(base, l);
    for (uint32_t t = 0; t < n_tokens; t++) gen_row(seed, l, t, hidden + (size_t)t * l->row_bytes);
    slot_header_write(base, l, wu, n_seqs, n_tokens, producer);
    return (int)n_tokens;
}

static uint64_t count_diff(const uint8_t *a, const uint8_t *b, size_t n, size_t *first)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i]) {
            if (!bad && first) *first = i;
            bad++;
        }
    }
    return bad;
}

int synthetic_verify(const void *base, const slot_layout *l, const slot_work_unit *expect_wu,
                     const synthetic_params *sp, synthetic_report *r, char *err, size_t err_len)
{
    synthetic_report rep;
    memset(&rep, 0, sizeof rep);
    if (!params_ok(sp)) return DFLASH_EINVAL;
    slot_header h;
    int rc = slot_header_check(base, l, &h, err, err_len);
    if (rc < 0) goto out;
    if (h.wu.epoch != expect_wu->epoch || h.wu.bucket != expect_wu->bucket ||
        h.wu.batch != expect_wu->batch) {
        err_fmt(err, err_len, "slot holds batch (epoch %u, bucket %u, batch %llu) but the grant "
                "named (epoch %u, bucket %u, batch %llu)", h.wu.epoch, h.wu.bucket,
                (unsigned long long)h.wu.batch, expect_wu->epoch, expect_wu->bucket,
                (unsigned long long)expect_wu->batch);
        rc = DFLASH_EMISMATCH;
        goto out;
    }
    uint64_t seed = wu_seed(expect_wu);
    uint32_t n_seqs, n_tokens;
    synthetic_shape(l, expect_wu, sp, &n_seqs, &n_tokens);
    rep.n_seqs = h.n_seqs;
    rep.n_tokens = h.n_tokens;
    if (h.n_seqs != n_seqs || h.n_tokens != n_tokens) {
        err_fmt(err, err_len, "slot header says %u tokens in %u sequences, batch has %u in %u",
                h.n_tokens, h.n_seqs, n_tokens, n_seqs);
        rc = DFLASH_ECORRUPT;
        goto out;
    }
    /* arrays: regenerate into a scratch copy of the arrays region and compare the used parts */
    size_t arr_bytes = l->off_hidden;
    uint8_t *exp = calloc(1, arr_bytes + l->row_bytes);
    if (!exp) {
        rc = DFLASH_ENOMEM;
        goto out;
    }
    gen_arrays(exp, l, seed, sp, n_seqs, n_tokens);
    const uint8_t *b = base;
    struct { size_t off, len; const char *what; } parts[] = {
        {l->off_seq_offsets, ((size_t)n_seqs + 1) * 4, "seq offsets"},
        {l->off_positions, (size_t)n_tokens * 4, "positions"},
        {l->off_token_ids, (size_t)n_tokens * 4, "token ids"},
        {l->off_loss_mask, n_tokens, "loss mask"},
    };
    rep.bytes_checked = sizeof(slot_header);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t first = 0;
        uint64_t bad = count_diff(b + parts[i].off, exp + parts[i].off, parts[i].len, &first);
        if (bad && !rep.bad_bytes)
            err_fmt(err, err_len, "%s differ from the synthetic batch at byte %zu", parts[i].what,
                    first);
        rep.bad_bytes += bad;
        rep.bytes_checked += parts[i].len;
    }
    uint8_t *row = exp + arr_bytes;
    const uint8_t *hidden = b + l->off_hidden;
    size_t es = slot_dtype_size(l->dtype);
    for (uint32_t t = 0; t < n_tokens; t++) {
        gen_row(seed, l, t, row);
        const uint8_t *got = hidden + (size_t)t * l->row_bytes;
        if (memcmp(got, row, l->row_bytes) != 0) {
            size_t first = 0;
            uint64_t bad = count_diff(got, row, l->row_bytes, &first);
            if (!rep.bad_bytes) {
                rep.bad_token = t;
                rep.bad_layer = (uint32_t)(first / es / l->hidden);
                rep.bad_channel = (uint32_t)(first / es % l->hidden);
                err_fmt(err, err_len, "hidden states differ from the synthetic batch at token %u "
                        "layer %u channel %u", t, rep.bad_layer, rep.bad_channel);
            }
            rep.bad_bytes += bad;
        }
        rep.bytes_checked += l->row_bytes;
    }
    free(exp);
    rc = rep.bad_bytes ? DFLASH_ECORRUPT : 0;
out:
    if (r) *r = rep;
    return rc;
}
