/* slot_options: the start-up checks of the options that shape the slots, which dflash-target
 * and dflash-drafter both take and must agree on: --backend, the slot layout (--token-budget,
 * --max-seqs, --hidden, --layers; bf16 slots on cuda, fp32 on the host pool), --buckets and
 * --capture-layers (parsed, ascending, no id twice). One function for both programs' setup_from,
 * so both refuse a value the same way, naming where it came from (config_source). Pure. */
#ifndef DFLASH_SLOT_OPTIONS_H
#define DFLASH_SLOT_OPTIONS_H

#include "config.h"
#include "pool.h"
#include "slot.h"

#include <stdint.h>

typedef struct slot_options {
    const char *backend, *buckets, *capture;
    int64_t token_budget, max_seqs, hidden, layers;
} slot_options;

typedef struct slot_setup {
    pool_backend backend;
    slot_layout layout;
    uint32_t *bucket_upper; /* the caller's array of max_buckets */
    uint32_t max_buckets, n_buckets;
    int *ids; /* the caller's array of max_ids: --capture-layers; n_ids 0: DFlash's rule */
    int max_ids, n_ids;
} slot_setup;

/* Checks o (values of cfg under table t) and fills *s (its arrays set by the caller). 0, or
 * DFLASH_ECONFIG with the reason in why. */
int slot_options_setup(const cfg_table *t, const void *cfg, const slot_options *o, slot_setup *s,
                       char *why, size_t len);

#endif
