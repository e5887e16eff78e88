/* dflash_task: see dflash_task.h. The table draws jump into the splitmix64 stream (state s0 +
 * k * RNG_GOLDEN is the state k draws on), so each thread draws its own slice of a table. */
#include "dflash_task.h"

#include "rng.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

int dflash_task_config(dflash_config *c, int D, int layers, int H, int HK, int F, int NF, int V,
                       char *msg, size_t msglen) {
    *c = (dflash_config){0};
    c->hidden_size = D, c->num_layers = layers, c->num_heads = H, c->num_kv_heads = HK;
    c->head_dim = H > 0 ? D / H : 0, c->intermediate_size = F, c->block_size = 16;
    c->n_feat = NF, c->num_target_layers = 36;
    if (NF < 1 || NF > DFLASH_MAX_FEAT ||
        dflash_default_layer_ids(c->num_target_layers, NF, c->target_layer_ids) != 0)
        c->n_feat = 0; /* dflash_config_validate names it */
    c->mask_token_id = V > 151669 ? 151669 : V - 1, c->vocab_size = V;
    c->max_position_embeddings = 40960, c->rms_norm_eps = 1e-6, c->rope_theta = 1e6;
    c->bos_token_id = c->eos_token_id = -1;
    return dflash_config_validate(c, msg, msglen);
}

void dflash_task_tokens(int n_seqs, int S, int V, int32_t *seq_off, int32_t *ids,
                        int32_t *positions, uint8_t *loss_mask) {
    const int64_t M = V - 64 < 151000 ? V - 64 : 151000;
    seq_off[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        seq_off[s + 1] = seq_off[s] + S;
        for (int t = 0; t < S; t++) {
            int64_t g = (int64_t)s * S + t;
            ids[g] = (int32_t)(g * 7919 % M);
            if (positions) positions[g] = t;
            loss_mask[g] = t >= DFLASH_TASK_PROMPT;
        }
    }
}

double dflash_task_lm_sd(int D) { return 1.28 / sqrt((double)D); }

/* one thread's slice: values [lo, hi) of a table whose stream starts at s0 (lo even) */
typedef struct draw_slice {
    uint64_t s0;
    float *out;
    size_t lo, hi;
    double scale;
    int normal;
} draw_slice;

static void *draw_run(void *arg) {
    const draw_slice *d = arg;
    uint64_t st = d->s0 + (uint64_t)d->lo * RNG_GOLDEN; /* value k: draw k (a normal pair: 2) */
    for (size_t k = d->lo; k < d->hi; k += 2) {
        double a, b;
        if (d->normal)
            rng_normal_pair(&st, &a, &b);
        else
            a = 2.0 * rng_uniform01(&st) - 1.0, b = 2.0 * rng_uniform01(&st) - 1.0;
        d->out[k] = (float)(a * d->scale);
        if (k + 1 < d->hi) d->out[k + 1] = (float)(b * d->scale);
    }
    return NULL;
}

enum { DRAW_THREADS_MAX = 32, DRAW_SLICE_MIN = 1 << 20 };

void dflash_task_draw(uint64_t *rs, float *out, size_t n, double scale, int normal) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = cores < 1 ? 1 : (size_t)cores;
    if (nt > DRAW_THREADS_MAX) nt = DRAW_THREADS_MAX;
    if (nt > n / DRAW_SLICE_MIN) nt = n / DRAW_SLICE_MIN ? n / DRAW_SLICE_MIN : 1;
    size_t per = ((n + nt - 1) / nt + 1) & ~(size_t)1; /* even: no pair straddles two slices */
    draw_slice d[DRAW_THREADS_MAX];
    pthread_t th[DRAW_THREADS_MAX];
    int started[DRAW_THREADS_MAX] = {0};
    for (size_t i = 0; i < nt; i++) {
        size_t lo = i * per < n ? i * per : n, hi = lo + per < n ? lo + per : n;
        d[i] = (draw_slice){*rs, out, lo, hi, scale, normal};
        /* slice 0 runs here; a thread that cannot start runs here too */
        started[i] = i > 0 && pthread_create(&th[i], NULL, draw_run, &d[i]) == 0;
        if (!started[i] && i > 0) draw_run(&d[i]);
    }
    draw_run(&d[0]);
    for (size_t i = 1; i < nt; i++)
        if (started[i]) pthread_join(th[i], NULL);
    *rs += (uint64_t)((n + 1) & ~(size_t)1) * RNG_GOLDEN; /* draws consumed: pairs */
}

void *dflash_task_table(const nn_ops *ops, nn_ctx *ctx, uint64_t *rs, size_t n, double scale,
                        int normal) {
    void *p = ops->alloc(ctx, n * ops->act_bytes);
    if (!p) return NULL;
    const size_t chunk = (size_t)1 << 26; /* even, so chunks keep the pairs of one draw */
    float *h = malloc((n < chunk ? n : chunk) * sizeof(float));
    if (!h) {
        ops->free(ctx, p);
        return NULL;
    }
    for (size_t o = 0; o < n; o += chunk) {
        size_t m = n - o < chunk ? n - o : chunk;
        dflash_task_draw(rs, h, m, scale, normal);
        ops->upload(ctx, (char *)p + o * ops->act_bytes, h, m);
    }
    ops->sync(ctx);
    free(h);
    return p;
}
