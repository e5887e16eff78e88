/* rope: host-side RoPE frequency table, shared by every backend and model.
 *
 * inv_freq[i] = theta^(-2i/d) for i < d/2 (rotate_half layout: dimension i pairs with i + d/2).
 * With Llama-3 scaling (HF rope_type "llama3") long wavelengths are divided by `factor`, short
 * ones kept, and the band between smoothly interpolated. Computed in double, stored as float.
 */
#include "model_config.h"
#include "ops.h"

#include <math.h>

void rope_inv_freq(float *inv_freq, int d, double theta, const struct rope_llama3_scaling *s)
{
    for (int i = 0; i < d / 2; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)d);
        if (s && s->enabled) {
            double old_ctx = (double)s->original_max_position_embeddings;
            double low_wavelen = old_ctx / s->low_freq_factor;
            double high_wavelen = old_ctx / s->high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / s->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old_ctx / wavelen - s->low_freq_factor) /
                                (s->high_freq_factor - s->low_freq_factor);
                f = (1.0 - smooth) * f / s->factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}
