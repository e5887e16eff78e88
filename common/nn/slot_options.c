/* slot_options: see slot_options.h. */
#include "slot_options.h"

#include "batch_plan.h"
#include "err.h"
#include "target_model.h"

int slot_options_setup(const cfg_table *t, const void *cfg, const slot_options *o, slot_setup *s,
                       char *why, size_t len)
{
    char reason[256], src[300];
#define SRC(name) config_source(t, cfg, name, src, sizeof src)
    int rc = pool_backend_parse(o->backend, &s->backend);
    if (rc < 0) return config_refuse(why, len, "%s: %s", SRC("backend"), pool_backend_refusal(rc));
    slot_dtype dt = s->backend == POOL_CUDA ? SLOT_DTYPE_BF16 : SLOT_DTYPE_F32;
    rc = slot_layout_compute((uint32_t)o->token_budget, (uint32_t)o->max_seqs,
                             (uint32_t)o->hidden, (uint32_t)o->layers, dt, &s->layout);
    if (rc < 0)
        return config_refuse(why, len,
                             "slot layout (token budget %lld, max seqs %lld, hidden %lld, layers "
                             "%lld) is invalid: %s",
                             (long long)o->token_budget, (long long)o->max_seqs,
                             (long long)o->hidden, (long long)o->layers, err_str(rc));
    int nb = batch_plan_parse_bounds(o->buckets, s->bucket_upper, (int)s->max_buckets, reason,
                                     sizeof reason);
    if (nb <= 0) return config_refuse(why, len, "%s: %s", SRC("buckets"), reason);
    s->n_buckets = (uint32_t)nb;
    s->n_ids = target_capture_layers_parse(o->capture, s->ids, s->max_ids, reason, sizeof reason);
    if (s->n_ids < 0) return config_refuse(why, len, "bad %s: %s", SRC("capture-layers"), reason);
    return 0;
#undef SRC
}
