/* policy: bucket policy, slots and leases (see policy.h). STUB: bodies follow. */
#include "policy.h"

#include <stddef.h>
#include <string.h>

#include "err.h"

void policy_params_default(policy_params *p) { memset(p, 0, sizeof *p); }
policy *policy_new(const policy_params *params, const policy_sink *sink) { (void)params, (void)sink; return NULL; }
void policy_destroy(policy **p) { if (p) *p = NULL; }
int policy_pool_add(policy *p, uint32_t pool_id, uint64_t inc, uint32_t n, uint64_t bytes) { (void)p, (void)pool_id, (void)inc, (void)n, (void)bytes; return DFLASH_EUNSUPPORTED; }
int policy_pool_drop(policy *p, uint32_t pool_id) { (void)p, (void)pool_id; return DFLASH_EUNSUPPORTED; }
uint64_t policy_pool_incarnation(const policy *p, uint32_t pool_id) { (void)p, (void)pool_id; return 0; }
int policy_set_shares(policy *p, uint32_t n, const double *s) { (void)p, (void)n, (void)s; return DFLASH_EUNSUPPORTED; }
int policy_next_bucket(policy *p, uint32_t pool_id, uint32_t mask, uint32_t *bucket) { (void)p, (void)pool_id, (void)mask, (void)bucket; return DFLASH_EUNSUPPORTED; }
int policy_work_start(policy *p, uint32_t pool_id, const batch_id *b, uint32_t *slot) { (void)p, (void)pool_id, (void)b, (void)slot; return DFLASH_EUNSUPPORTED; }
bool policy_is_filling(const policy *p, uint32_t pool_id, const batch_id *b) { (void)p, (void)pool_id, (void)b; return false; }
int policy_slot_ready(policy *p, uint32_t pool_id, uint64_t inc, uint32_t slot, const batch_id *b, uint32_t n_tokens) { (void)p, (void)pool_id, (void)inc, (void)slot, (void)b, (void)n_tokens; return DFLASH_EUNSUPPORTED; }
int policy_claim(policy *p, uint64_t w, uint64_t now, policy_grant *g) { (void)p, (void)w, (void)now, (void)g; return DFLASH_EUNSUPPORTED; }
int policy_release(policy *p, uint64_t lease, policy_slot_ref *where) { (void)p, (void)lease, (void)where; return DFLASH_EUNSUPPORTED; }
int policy_heartbeat(policy *p, uint64_t w, uint64_t now) { (void)p, (void)w, (void)now; return DFLASH_EUNSUPPORTED; }
int policy_drop_worker(policy *p, uint64_t w) { (void)p, (void)w; return DFLASH_EUNSUPPORTED; }
int policy_tick(policy *p, uint64_t now) { (void)p, (void)now; return DFLASH_EUNSUPPORTED; }
uint64_t policy_next_deadline(const policy *p) { (void)p; return UINT64_MAX; }
int policy_set_min_ready(policy *p, uint32_t v) { (void)p, (void)v; return DFLASH_EUNSUPPORTED; }
int policy_set_max_depth(policy *p, uint32_t v) { (void)p, (void)v; return DFLASH_EUNSUPPORTED; }
int policy_set_lease_timeout(policy *p, uint32_t v) { (void)p, (void)v; return DFLASH_EUNSUPPORTED; }
int policy_set_max_redeliveries(policy *p, uint32_t v) { (void)p, (void)v; return DFLASH_EUNSUPPORTED; }
int policy_set_mode(policy *p, policy_mode m) { (void)p, (void)m; return DFLASH_EUNSUPPORTED; }
policy_mode policy_get_mode(const policy *p) { (void)p; return POLICY_RUNNING; }
void policy_set_flush(policy *p, bool f) { (void)p, (void)f; }
bool policy_drained(const policy *p) { (void)p; return false; }
void policy_get_stats(const policy *p, policy_stats *out) { (void)p; memset(out, 0, sizeof *out); }
int policy_slot_get(const policy *p, uint32_t pool_id, uint32_t slot, slot_state *s, batch_id *b) { (void)p, (void)pool_id, (void)slot, (void)s, (void)b; return DFLASH_EUNSUPPORTED; }
double policy_tv_distance(uint32_t n, const double *a, const double *b) { (void)n, (void)a, (void)b; return 0; }
const char *policy_mode_name(policy_mode m) { (void)m; return "?"; }
const char *slot_state_name(slot_state s) { (void)s; return "?"; }
