/* opnames.h: the ops that opprof.h times, by index and by the name its profile prints, and
 * the op sets of bench-drafter's BENCH_FREE (po_free_parse). Plain C, no CUDA, so that
 * tests/unit/test_opnames.c checks the sets on any machine. */
#ifndef DFLASH_BENCH_OPNAMES_H
#define DFLASH_BENCH_OPNAMES_H

#include <stdio.h>
#include <string.h>

enum {
    PO_EMB, PO_RMS, PO_LIN, PO_ROPET, PO_ROPE, PO_QKV, PO_ATTC, PO_ATTB, PO_SWI, PO_RMSB, PO_LINB,
    PO_ROPEB, PO_SWIB, PO_ATTBB, PO_XENT, PO_ARGMAX, PO_SUMSQ, PO_ADAMW, PO_F2A, PO_COPY, PO_COPY2D,
    PO_ZERO, PO_SCATTER, PO_N
};
static const char *po_names[PO_N] = {
    "embedding_fwd", "rmsnorm_fwd", "linear_fwd(+res)", "rope_table", "head_norm_rope_fwd",
    "qkv_norm_rope_fwd", "attention_causal_fwd", "attention_block_fwd", "swiglu_fwd",
    "rmsnorm_bwd", "linear_bwd",
    "head_norm_rope_bwd", "swiglu_bwd", "attention_block_bwd", "lm_head_xent", "lm_head_argmax",
    "sumsq", "adamw", "f32_to_act", "copy", "copy2d", "zero", "rows_scatter"};

/* The op set named by `set` (comma-separated op names of the profile's table, or: none;
 * attention = the block attention forward and backward; optimizer = sumsq and adamw; memory =
 * the norms, RoPE and SwiGLU; movers = the gathers, copies and zero fills; nonproducts =
 * attention, optimizer and memory) as a po_free mask; -1 and a message for an unknown or
 * product name. The movers write buffers that other ops reuse as scratch (the loss rows'
 * gather, for one), so leaving them out can feed the products degenerate data, which draw less
 * power (a loss of ln V: the lm_head saw equal logits); every other op's outputs are its own. */
static inline int po_free_parse(const char *set, unsigned *mask, char *err, size_t errlen) {
    enum {
        ATTN = 1u << PO_ATTB | 1u << PO_ATTBB,
        OPTIM = 1u << PO_SUMSQ | 1u << PO_ADAMW,
        MEM = 1u << PO_RMS | 1u << PO_ROPET | 1u << PO_ROPE | 1u << PO_SWI | 1u << PO_RMSB |
              1u << PO_ROPEB | 1u << PO_SWIB,
        MOVE = 1u << PO_EMB | 1u << PO_F2A | 1u << PO_COPY | 1u << PO_COPY2D | 1u << PO_ZERO |
               1u << PO_SCATTER,
    };
    static const struct {
        const char *name;
        unsigned bits;
    } alias[] = {{"none", 0},        {"attention", ATTN}, {"optimizer", OPTIM},
                 {"memory", MEM},    {"movers", MOVE},    {"nonproducts", ATTN | OPTIM | MEM}};
    char buf[512];
    *mask = 0;
    if (strlen(set) >= sizeof buf) {
        snprintf(err, errlen, "an op set of more than %zu characters", sizeof buf - 1);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", set);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (size_t a = 0; a < sizeof alias / sizeof *alias && !found; a++)
            if (!strcmp(t, alias[a].name)) *mask |= alias[a].bits, found = 1;
        for (int op = 0; op < PO_N && !found; op++)
            if (!strcmp(t, po_names[op])) {
                if (op == PO_LIN || op == PO_LINB) {
                    snprintf(err, errlen, "the products (%s) cannot be left out", t);
                    return -1;
                }
                *mask |= 1u << op, found = 1;
            }
        if (!found) {
            snprintf(err, errlen, "unknown op or op set '%s'", t);
            return -1;
        }
    }
    return 0;
}

#endif
