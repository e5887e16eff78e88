/* test_opnames: the op sets of bench-drafter's BENCH_FREE (bench/target/opnames.h). Each alias
 * names its ops and no others; the products can never be left out, by name or through an
 * alias; op names and aliases combine; the movers, whose outputs other ops reuse as scratch,
 * are in no alias but their own; unknown names and over-long sets are refused with a message.
 */
#include "check.h"

#include "../../bench/target/opnames.h"

#include <string.h>

static unsigned bit(int op) {
    return 1u << op;
}

/* the mask of a set that must parse */
static unsigned mask_of(const char *set) {
    unsigned m = 0xdeadbeefu;
    char err[128] = "";
    int rc = po_free_parse(set, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) fprintf(stderr, "  '%s': %s\n", set, err);
    return m;
}

/* a set that must be refused, with a message holding `needle` */
static void refused(const char *set, const char *needle) {
    unsigned m = 0;
    char err[128] = "";
    CHECK_EQ_INT(po_free_parse(set, &m, err, sizeof err), -1);
    CHECK(strstr(err, needle) != NULL);
    printf("refused '%.40s': %s\n", set, err);
}

int main(void) {
    const unsigned attn = bit(PO_ATTB) | bit(PO_ATTBB), optim = bit(PO_SUMSQ) | bit(PO_ADAMW);
    const unsigned mem = bit(PO_RMS) | bit(PO_ROPET) | bit(PO_ROPE) | bit(PO_SWI) |
                         bit(PO_RMSB) | bit(PO_ROPEB) | bit(PO_SWIB);
    const unsigned movers = bit(PO_EMB) | bit(PO_F2A) | bit(PO_COPY) | bit(PO_COPY2D) |
                            bit(PO_ZERO) | bit(PO_SCATTER);
    const unsigned products = bit(PO_LIN) | bit(PO_LINB);

    CHECK_EQ_INT(mask_of("none"), 0);
    CHECK_EQ_INT(mask_of(""), 0);
    CHECK_EQ_INT(mask_of("attention"), attn);
    CHECK_EQ_INT(mask_of("optimizer"), optim);
    CHECK_EQ_INT(mask_of("memory"), mem);
    CHECK_EQ_INT(mask_of("movers"), movers);
    CHECK_EQ_INT(mask_of("nonproducts"), attn | optim | mem);
    /* no alias holds a product or the loss; only "movers" holds the movers */
    const char *aliases[] = {"attention", "optimizer", "memory", "movers", "nonproducts"};
    for (int i = 0; i < 5; i++) {
        unsigned m = mask_of(aliases[i]);
        CHECK_EQ_INT(m & (products | bit(PO_XENT)), 0);
        if (strcmp(aliases[i], "movers")) CHECK_EQ_INT(m & movers, 0);
    }
    /* every op name of the profile, alone: its own bit; the products refused */
    for (int op = 0; op < PO_N; op++) {
        if (op == PO_LIN || op == PO_LINB) {
            refused(po_names[op], "products");
            continue;
        }
        CHECK_EQ_INT(mask_of(po_names[op]), bit(op));
    }
    /* lists: names and aliases together, repeats harmless */
    CHECK_EQ_INT(mask_of("optimizer,attention_block_bwd"), optim | bit(PO_ATTBB));
    CHECK_EQ_INT(mask_of("swiglu_fwd,swiglu_bwd,swiglu_fwd"), bit(PO_SWI) | bit(PO_SWIB));
    CHECK_EQ_INT(mask_of("optimizer,lm_head_xent"), optim | bit(PO_XENT));
    /* refusals: a product inside a list, unknown names, a near miss, an over-long set */
    refused("optimizer,linear_bwd", "products");
    refused("attention,bogus", "unknown");
    refused("Attention", "unknown");
    refused("linear_fwd", "unknown"); /* the profile's name is linear_fwd(+res) */
    char big[600];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    refused(big, "characters");
    CHECK_DONE();
}
