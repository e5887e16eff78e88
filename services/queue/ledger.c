/* ledger: batch states persisted in the journal (see ledger.h). STUB: bodies follow. */
#include "ledger.h"

#include <stddef.h>
#include <string.h>

#include "err.h"

ledger *ledger_new(const ledger_params *params, int *err)
{
    (void)params;
    if (err) *err = DFLASH_EUNSUPPORTED;
    return NULL;
}
void ledger_destroy(ledger **l) { if (l) *l = NULL; }
int ledger_set_plan(ledger *l, uint32_t n, const uint32_t *b) { (void)l, (void)n, (void)b; return DFLASH_EUNSUPPORTED; }
bool ledger_has_plan(const ledger *l) { (void)l; return false; }
uint32_t ledger_todo_mask(ledger *l) { (void)l; return 0; }
int ledger_next_todo(ledger *l, uint32_t bucket, batch_id *out) { (void)l, (void)bucket, (void)out; return DFLASH_EUNSUPPORTED; }
int ledger_adopt(ledger *l, const batch_id *b) { (void)l, (void)b; return DFLASH_EUNSUPPORTED; }
int ledger_requeue(ledger *l, const batch_id *b) { (void)l, (void)b; return DFLASH_EUNSUPPORTED; }
uint64_t ledger_requeue_orphans(ledger *l) { (void)l; return 0; }
int ledger_ack(ledger *l, const batch_id *b, uint64_t step) { (void)l, (void)b, (void)step; return DFLASH_EUNSUPPORTED; }
int ledger_quarantine(ledger *l, const batch_id *b) { (void)l, (void)b; return DFLASH_EUNSUPPORTED; }
int ledger_release_quarantine(ledger *l, const batch_id *b) { (void)l, (void)b; return DFLASH_EUNSUPPORTED; }
int64_t ledger_commit(ledger *l, uint64_t step) { (void)l, (void)step; return DFLASH_EUNSUPPORTED; }
int64_t ledger_rewind(ledger *l, uint64_t step) { (void)l, (void)step; return DFLASH_EUNSUPPORTED; }
int ledger_get(const ledger *l, const batch_id *b, batch_state *s, uint64_t *step) { (void)l, (void)b, (void)s, (void)step; return DFLASH_EUNSUPPORTED; }
bool ledger_epoch_committed(const ledger *l, uint32_t e) { (void)l, (void)e; return false; }
int ledger_compact(ledger *l) { (void)l; return DFLASH_EUNSUPPORTED; }
void ledger_get_stats(const ledger *l, ledger_stats *out) { (void)l; memset(out, 0, sizeof *out); }
const char *batch_state_name(batch_state s) { (void)s; return "?"; }
