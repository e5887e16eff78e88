/* slot: the byte layout of one slot, the unit the target fills and a drafter copies (DESIGN §3).
 *
 * A slot is a fixed-size region of a pool arena. Its layout is fixed per run by five numbers
 * (token budget, max sequences, hidden size, captured layers, dtype) and computed by
 * slot_layout_compute(); every array starts on a SLOT_ALIGN (256) byte boundary:
 *
 *   off 0            slot_header (magic "DFLSLOT1", version, shapes, work unit, crc)
 *   off_seq_offsets  int32  [max_seqs + 1]   cumulative sequence starts; [0]=0, [n_seqs]=n_tokens
 *   off_positions    int32  [token_budget]   position of each token within its sequence
 *   off_token_ids    int32  [token_budget]   token ids
 *   off_loss_mask    uint8  [token_budget]   1 where the token is trained on
 *   off_hidden       dtype  [token_budget, n_layers * hidden]   captured hidden states, row-major
 *   slot_bytes       total, a multiple of SLOT_ALIGN
 *
 * Only the first n_tokens rows / n_seqs+1 offsets are meaningful. dtype is f32 on the cpu backend
 * and bf16 on cuda. The header carries the layout numbers too, so a reader can check that the
 * slot it copied was written for the layout it expects (slot_header_check), and a crc over the
 * header catches a torn or stale header. All functions here are pure and thread-safe; callers
 * are the target's producers (writers), drafters' consumers (readers) and the synthetic fill.
 */
#ifndef DFLASH_SLOT_H
#define DFLASH_SLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SLOT_MAGIC "DFLSLOT1"
#define SLOT_VERSION 2u
/* Captured target layer ids a slot can name (DFlash uses 5; 0xffff marks an unused entry). */
#define SLOT_MAX_LAYER_IDS 24
#define SLOT_LAYER_ID_NONE 0xffffu
#define SLOT_ALIGN 256u
#define SLOT_MAX_TOKENS (1u << 20)
#define SLOT_MAX_SEQS (1u << 16)

typedef enum { SLOT_DTYPE_F32 = 1, SLOT_DTYPE_BF16 = 2 } slot_dtype;

/* The deterministic identity of a batch (DESIGN §2, §5). */
typedef struct slot_work_unit {
    uint32_t epoch;
    uint32_t bucket;
    uint64_t batch; /* batch index within (epoch, bucket) */
} slot_work_unit;

/* Sizes and offsets of one slot; plain data. */
typedef struct slot_layout {
    uint32_t token_budget, max_seqs, hidden, n_layers;
    slot_dtype dtype;
    size_t off_seq_offsets, off_positions, off_token_ids, off_loss_mask, off_hidden;
    size_t row_bytes;  /* n_layers * hidden * dtype size: one token's hidden states */
    size_t slot_bytes; /* whole slot, multiple of SLOT_ALIGN */
    /* Which target layers the n_layers columns hold, in column order (slot_layout_set_layer_ids;
     * all SLOT_LAYER_ID_NONE when unknown, e.g. the synthetic target or a reader that does not
     * care). Part of what producer and reader must agree on. */
    uint16_t layer_ids[SLOT_MAX_LAYER_IDS];
} slot_layout;

/* The header at offset 0 of every slot. Fixed little-endian layout, 128 bytes. */
typedef struct slot_header {
    char magic[8]; /* SLOT_MAGIC, no terminator */
    uint32_t version;
    uint32_t dtype;
    uint32_t n_seqs, n_tokens;
    uint32_t hidden, n_layers;
    uint32_t token_budget, max_seqs;
    uint64_t slot_bytes;
    slot_work_unit wu;
    uint64_t producer; /* the pool's incarnation, for diagnostics */
    uint16_t layer_ids[SLOT_MAX_LAYER_IDS]; /* the layout's layer_ids */
    uint32_t crc; /* crc32_ieee (crc.h) of all bytes above */
} slot_header;

/* Bytes per element of dtype (4 or 2), 0 for an unknown dtype. */
size_t slot_dtype_size(slot_dtype dtype);
/* "f32" / "bf16" / "?". */
const char *slot_dtype_name(slot_dtype dtype);

/* Computes the layout. Returns 0, DFLASH_EINVAL (a zero size or unknown dtype) or DFLASH_ERANGE
 * (beyond SLOT_MAX_TOKENS / SLOT_MAX_SEQS or the size overflows). */
int slot_layout_compute(uint32_t token_budget, uint32_t max_seqs, uint32_t hidden,
                        uint32_t n_layers, slot_dtype dtype, slot_layout *out);

/* Records which target layers the columns hold (n == l->n_layers, ids < SLOT_LAYER_ID_NONE).
 * Returns 0 or DFLASH_EINVAL. */
int slot_layout_set_layer_ids(slot_layout *l, const int *ids, int n);
/* True when the layout names its layers. */
bool slot_layout_has_layer_ids(const slot_layout *l);

/* Writes the header of the slot at base (host memory) for layout l and computes its crc. The
 * arrays are the caller's to fill. Asserts n_tokens <= budget and n_seqs <= max_seqs. */
void slot_header_write(void *base, const slot_layout *l, const slot_work_unit *wu,
                       uint32_t n_seqs, uint32_t n_tokens, uint64_t producer);

/* Checks the header at base (host memory): magic (DFLASH_EFORMAT), version (DFLASH_EVERSION),
 * crc (DFLASH_ECORRUPT), shapes and sizes against expect (DFLASH_EMISMATCH; expect may be NULL
 * to check only self-consistency) and n_tokens/n_seqs within capacity (DFLASH_ERANGE). On error
 * a one-line reason goes to err (may be NULL). On success copies the header to *out (may be NULL).
 */
int slot_header_check(const void *base, const slot_layout *expect, slot_header *out, char *err,
                      size_t err_len);

/* Checks the arrays of a slot whose header passed slot_header_check: seq offsets start at 0,
 * increase strictly and end at n_tokens; positions restart at 0 per sequence and count up; token
 * ids lie in [0, vocab_size) (vocab_size 0 skips that); loss mask bytes are 0 or 1. Returns 0 or
 * DFLASH_ECORRUPT with the first problem in err. */
int slot_arrays_check(const void *base, const slot_layout *l, uint32_t vocab_size, char *err,
                      size_t err_len);

/* Typed views into a slot at base (host or device pointer: only arithmetic happens here). */
static inline int32_t *slot_seq_offsets(void *base, const slot_layout *l)
{
    return (int32_t *)((char *)base + l->off_seq_offsets);
}
static inline int32_t *slot_positions(void *base, const slot_layout *l)
{
    return (int32_t *)((char *)base + l->off_positions);
}
static inline int32_t *slot_token_ids(void *base, const slot_layout *l)
{
    return (int32_t *)((char *)base + l->off_token_ids);
}
static inline uint8_t *slot_loss_mask(void *base, const slot_layout *l)
{
    return (uint8_t *)base + l->off_loss_mask;
}
static inline void *slot_hidden(void *base, const slot_layout *l)
{
    return (char *)base + l->off_hidden;
}
/* Bytes from the slot start to the end of the last used hidden row: the prefix worth copying. */
static inline size_t slot_used_bytes(const slot_layout *l, uint32_t n_tokens)
{
    return l->off_hidden + (size_t)n_tokens * l->row_bytes;
}

#endif
