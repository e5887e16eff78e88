/* ops_limits: the shape limits a backend's ops table states (nn_ops.max_head_dim,
 * max_q_per_kv), checked once when a model is made (target_model_new, dflash_model_new), so a
 * model the backend's kernels cannot take is refused at start-up, naming the limit, instead of
 * failing or computing garbage in its first step. The cuda attention kernels keep their own
 * asserts as a second line. */
#include "ops.h"

#include "err.h"

int nn_ops_check_heads(const nn_ops *ops, int heads, int kv_heads, int head_dim, char *err,
                       size_t errlen) {
    if (ops->max_head_dim > 0 && head_dim > ops->max_head_dim) {
        err_fmt(err, errlen, "the %s backend's attention takes head_dim up to %d (this model: %d)",
                ops->name, ops->max_head_dim, head_dim);
        return DFLASH_EUNSUPPORTED;
    }
    if (ops->max_q_per_kv > 0 && kv_heads > 0 && heads / kv_heads > ops->max_q_per_kv) {
        err_fmt(err, errlen,
                "the %s backend's attention takes up to %d query heads per kv head (this model: "
                "%d heads over %d kv heads)",
                ops->name, ops->max_q_per_kv, heads, kv_heads);
        return DFLASH_EUNSUPPORTED;
    }
    return 0;
}
