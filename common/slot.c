/* slot: layout arithmetic and the header every reader checks. See slot.h for the byte layout.
 * Pure functions; the header crc is computed over the header bytes before the crc field. */
#include "slot.h"
#include "crc.h"
#include "err.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

_Static_assert(sizeof(slot_header) == 128, "slot_header is a fixed 128-byte wire layout");
_Static_assert(sizeof(slot_header) <= SLOT_ALIGN, "header must fit before the first array");

size_t slot_dtype_size(slot_dtype dtype)
{
    switch (dtype) {
    case SLOT_DTYPE_F32: return 4;
    case SLOT_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *slot_dtype_name(slot_dtype dtype)
{
    switch (dtype) {
    case SLOT_DTYPE_F32: return "f32";
    case SLOT_DTYPE_BF16: return "bf16";
    }
    return "?";
}

static size_t align_up(size_t x)
{
    return (x + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
}

int slot_layout_compute(uint32_t token_budget, uint32_t max_seqs, uint32_t hidden,
                        uint32_t n_layers, slot_dtype dtype, slot_layout *out)
{
    size_t es = slot_dtype_size(dtype);
    if (!out || !token_budget || !max_seqs || !hidden || !n_layers || !es) return DFLASH_EINVAL;
    if (token_budget > SLOT_MAX_TOKENS || max_seqs > SLOT_MAX_SEQS || max_seqs > token_budget)
        return DFLASH_ERANGE;
    if (hidden > (1u << 20) || n_layers > 1024) return DFLASH_ERANGE;
    slot_layout l = {.token_budget = token_budget, .max_seqs = max_seqs, .hidden = hidden,
                     .n_layers = n_layers, .dtype = dtype};
    size_t off = align_up(sizeof(slot_header));
    l.off_seq_offsets = off;
    off = align_up(off + ((size_t)max_seqs + 1) * sizeof(int32_t));
    l.off_positions = off;
    off = align_up(off + (size_t)token_budget * sizeof(int32_t));
    l.off_token_ids = off;
    off = align_up(off + (size_t)token_budget * sizeof(int32_t));
    l.off_loss_mask = off;
    off = align_up(off + token_budget);
    l.off_hidden = off;
    l.row_bytes = (size_t)n_layers * hidden * es; /* <= 2^32: no overflow on 64-bit size_t */
    off = align_up(off + (size_t)token_budget * l.row_bytes);
    l.slot_bytes = off;
    for (int i = 0; i < SLOT_MAX_LAYER_IDS; i++) l.layer_ids[i] = SLOT_LAYER_ID_NONE;
    *out = l;
    return 0;
}

int slot_layout_set_layer_ids(slot_layout *l, const int *ids, int n)
{
    if (n != (int)l->n_layers || n > SLOT_MAX_LAYER_IDS) return DFLASH_EINVAL;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= (int)SLOT_LAYER_ID_NONE) return DFLASH_EINVAL;
    for (int i = 0; i < SLOT_MAX_LAYER_IDS; i++)
        l->layer_ids[i] = i < n ? (uint16_t)ids[i] : SLOT_LAYER_ID_NONE;
    return 0;
}

bool slot_layout_has_layer_ids(const slot_layout *l)
{
    return l->layer_ids[0] != SLOT_LAYER_ID_NONE;
}

/* "[1, 9, 17]" or "[unknown]" for messages. */
static void format_ids(char *buf, size_t len, const uint16_t *ids, uint32_t n)
{
    if (ids[0] == SLOT_LAYER_ID_NONE) {
        snprintf(buf, len, "[unknown]");
        return;
    }
    size_t o = (size_t)snprintf(buf, len, "[");
    for (uint32_t i = 0; i < n && i < SLOT_MAX_LAYER_IDS && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, i ? ", %u" : "%u", ids[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

void slot_header_write(void *base, const slot_layout *l, const slot_work_unit *wu,
                       uint32_t n_seqs, uint32_t n_tokens, uint64_t producer)
{
    assert(n_tokens <= l->token_budget && n_seqs <= l->max_seqs);
    slot_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SLOT_MAGIC, 8);
    h.version = SLOT_VERSION;
    h.dtype = (uint32_t)l->dtype;
    h.n_seqs = n_seqs;
    h.n_tokens = n_tokens;
    h.hidden = l->hidden;
    h.n_layers = l->n_layers;
    h.token_budget = l->token_budget;
    h.max_seqs = l->max_seqs;
    h.slot_bytes = l->slot_bytes;
    h.wu = *wu;
    h.producer = producer;
    memcpy(h.layer_ids, l->layer_ids, sizeof h.layer_ids);
    h.crc = crc32_ieee(0, &h, offsetof(slot_header, crc));
    memcpy(base, &h, sizeof h);
}

int slot_header_check(const void *base, const slot_layout *expect, slot_header *out, char *err,
                      size_t err_len)
{
    slot_header h;
    memcpy(&h, base, sizeof h);
    if (memcmp(h.magic, SLOT_MAGIC, 8) != 0) {
        err_fmt(err, err_len, "slot header: bad magic (not a slot, or never written)");
        return DFLASH_EFORMAT;
    }
    if (h.version != SLOT_VERSION) {
        err_fmt(err, err_len, "slot header: version %u, this build reads version %u", h.version,
                SLOT_VERSION);
        return DFLASH_EVERSION;
    }
    uint32_t crc = crc32_ieee(0, &h, offsetof(slot_header, crc));
    if (crc != h.crc) {
        err_fmt(err, err_len, "slot header: crc mismatch (stored %08x, computed %08x): torn or "
                "corrupt header", h.crc, crc);
        return DFLASH_ECORRUPT;
    }
    slot_layout self;
    int rc = slot_layout_compute(h.token_budget, h.max_seqs, h.hidden, h.n_layers,
                                 (slot_dtype)h.dtype, &self);
    if (rc < 0 || self.slot_bytes != h.slot_bytes) {
        err_fmt(err, err_len, "slot header: inconsistent layout (budget %u, seqs %u, hidden %u, "
                "layers %u, dtype %u, bytes %llu)", h.token_budget, h.max_seqs, h.hidden,
                h.n_layers, h.dtype, (unsigned long long)h.slot_bytes);
        return DFLASH_ECORRUPT;
    }
    if (expect && (expect->token_budget != h.token_budget || expect->max_seqs != h.max_seqs ||
                   expect->hidden != h.hidden || expect->n_layers != h.n_layers ||
                   (uint32_t)expect->dtype != h.dtype)) {
        err_fmt(err, err_len, "slot layout mismatch: producer wrote budget %u seqs %u hidden %u "
                "layers %u %s, reader expects budget %u seqs %u hidden %u layers %u %s",
                h.token_budget, h.max_seqs, h.hidden, h.n_layers,
                slot_dtype_name((slot_dtype)h.dtype), expect->token_budget, expect->max_seqs,
                expect->hidden, expect->n_layers, slot_dtype_name(expect->dtype));
        return DFLASH_EMISMATCH;
    }
    /* Layer ids are compared when both sides name them: a reader that does not care (or a
     * producer that cannot say, like the synthetic target) passes. */
    if (expect && slot_layout_has_layer_ids(expect) && h.layer_ids[0] != SLOT_LAYER_ID_NONE &&
        memcmp(expect->layer_ids, h.layer_ids, sizeof h.layer_ids) != 0) {
        char have[128], want[128];
        format_ids(have, sizeof have, h.layer_ids, h.n_layers);
        format_ids(want, sizeof want, expect->layer_ids, expect->n_layers);
        err_fmt(err, err_len, "slot layout mismatch: the target captured layers %s, the reader "
                "expects layers %s", have, want);
        return DFLASH_EMISMATCH;
    }
    if (h.n_tokens > h.token_budget || h.n_seqs > h.max_seqs || h.n_seqs > h.n_tokens ||
        (h.n_tokens > 0 && h.n_seqs == 0)) {
        err_fmt(err, err_len, "slot header: %u tokens in %u sequences exceed capacity (%u, %u)",
                h.n_tokens, h.n_seqs, h.token_budget, h.max_seqs);
        return DFLASH_ERANGE;
    }
    if (out) *out = h;
    return 0;
}

int slot_arrays_check(const void *base, const slot_layout *l, uint32_t vocab_size, char *err,
                      size_t err_len)
{
    slot_header h;
    memcpy(&h, base, sizeof h);
    void *b = (void *)base; /* views are read only here */
    const int32_t *so = slot_seq_offsets(b, l);
    const int32_t *pos = slot_positions(b, l);
    const int32_t *tok = slot_token_ids(b, l);
    const uint8_t *mask = slot_loss_mask(b, l);
    if (so[0] != 0 || so[h.n_seqs] != (int32_t)h.n_tokens) {
        err_fmt(err, err_len, "seq offsets: first %d last %d, want 0 and n_tokens %u", so[0],
                so[h.n_seqs], h.n_tokens);
        return DFLASH_ECORRUPT;
    }
    for (uint32_t s = 0; s < h.n_seqs; s++) {
        if (so[s + 1] <= so[s]) {
            err_fmt(err, err_len, "seq offsets: not increasing at sequence %u (%d then %d)", s,
                    so[s], so[s + 1]);
            return DFLASH_ECORRUPT;
        }
        for (int32_t t = so[s]; t < so[s + 1]; t++) {
            if (pos[t] != t - so[s]) {
                err_fmt(err, err_len, "positions: token %d of sequence %u has position %d, "
                        "want %d", t, s, pos[t], t - so[s]);
                return DFLASH_ECORRUPT;
            }
        }
    }
    for (uint32_t t = 0; t < h.n_tokens; t++) {
        if (tok[t] < 0 || (vocab_size && (uint32_t)tok[t] >= vocab_size)) {
            err_fmt(err, err_len, "token ids: token %u has id %d outside [0, %u)", t, tok[t],
                    vocab_size);
            return DFLASH_ECORRUPT;
        }
        if (mask[t] > 1) {
            err_fmt(err, err_len, "loss mask: token %u has %u, want 0 or 1", t, mask[t]);
            return DFLASH_ECORRUPT;
        }
    }
    return 0;
}
