/* dflash-mkmodel: writes a random, seeded target checkpoint in Hugging Face layout.
 *
 *   dflash-mkmodel --preset tiny --family qwen3 --out /tmp/m              ~100 KB, for tests
 *   dflash-mkmodel --family llama --llama3-rope-scaling --tie --out DIR   any family, any flags
 *   dflash-mkmodel --preset qwen3-8b --out DIR --shard-size-mb 4096       real Qwen3-8B shapes
 *
 * Output: DIR/config.json (hf_config_write) and DIR/model.safetensors, or, with --shard-size-mb,
 * DIR/model-0000i-of-0000N.safetensors plus model.safetensors.index.json. Tensor names and
 * shapes come from hf_weight_nth (hf_config.h), in file order. config.json and any previous
 * checkpoint files in DIR are removed first and config.json is written last, so a directory
 * holding config.json is complete. DIR must be new, empty or one mkmodel wrote (it writes
 * DIR/.dflash-mkmodel first): another non-empty directory, likely a real checkpoint given as
 * --out by mistake, is refused (exit 2) unless --force. (Old model-*-of-*.safetensors shards are
 * left; the new index or single file never names them.)
 *
 * Initialisation follows Hugging Face post_init: linears and embeddings ~ normal(0, init-std),
 * RMSNorm weights = 1 (+ norm-jitter * normal, so tests notice a norm weight that is ignored);
 * Qwen2 q/k/v biases ~ normal(0, init-std) (HF uses 0; random biases make tests see them).
 * Each value is a pure function of (seed, tensor index, element index): a counter-based
 * generator (splitmix64 + Box-Muller), so the bytes do not depend on chunking or sharding.
 *
 * Size options left at 0 take the preset's value. Tensors are generated and written in chunks
 * of 16M elements through the streaming safetensors writer: memory stays small for a 16 GB model.
 * Progress is logged every few seconds for big models. Threads: the main thread writes; each
 * chunk's values are drawn by --threads workers over disjoint element ranges (the values are a
 * function of the element index, so the bytes do not depend on the thread count).
 * SIGINT/SIGTERM stop it between chunks: the temporary file and the shards this run wrote are
 * removed and it exits 1 (a killed run used to leave PATH.tmp.<pid>, up to a shard's size).
 */
#include "config.h"
#include "rng.h"
#include "err.h"
#include "hf_config.h"
#include "log.h"
#include "fsutil.h"
#include "safetensors.h"
#include "signals.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct mk_cfg {
    char preset[32];
    char family[16];
    int64_t hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, max_pos;
    double rope_theta, rms_norm_eps;
    bool llama3_rope_scaling;
    double rope_factor, rope_low_freq, rope_high_freq;
    int64_t rope_original_max;
    bool tie;
    char dtype[16];
    int64_t seed;
    double init_std, norm_jitter;
    int64_t shard_size_mb;
    int64_t threads;
    int64_t bos, eos;
    char out[1024];
    bool force;
    char log_level[16];
} mk_cfg;

/* in every directory mkmodel writes: a non-empty --out without it holds someone else's files */
#define MARKER ".dflash-mkmodel"

#define STR_OPT(field) offsetof(mk_cfg, field), sizeof(((mk_cfg *)0)->field)
#define INT_OPT(field) offsetof(mk_cfg, field), 0
static const cfg_option mk_options[] = {
    {"preset", CFG_STRING, "tiny", 1, 0, false, "tiny or qwen3-8b: sizes for options left at 0",
     STR_OPT(preset)},
    {"family", CFG_STRING, "qwen3", 1, 0, false, "qwen3, qwen2 or llama", STR_OPT(family)},
    {"hidden", CFG_INT, "0", 0, 1 << 20, false, "hidden size (0: preset)", INT_OPT(hidden)},
    {"layers", CFG_INT, "0", 0, 1024, false, "decoder layers (0: preset)", INT_OPT(layers)},
    {"heads", CFG_INT, "0", 0, 4096, false, "attention heads (0: preset)", INT_OPT(heads)},
    {"kv-heads", CFG_INT, "0", 0, 4096, false,
     "key/value heads (0: preset, or --heads when --heads is given)", INT_OPT(kv_heads)},
    {"head-dim", CFG_INT, "0", 0, 4096, false,
     "head dimension (0: preset, or hidden/heads when --hidden or --heads is given, which "
     "must then divide)",
     INT_OPT(head_dim)},
    {"intermediate", CFG_INT, "0", 0, 1 << 22, false, "MLP size (0: preset)",
     INT_OPT(intermediate)},
    {"vocab", CFG_INT, "0", 0, 1 << 24, false, "vocabulary size (0: preset)", INT_OPT(vocab)},
    {"max-pos", CFG_INT, "0", 0, 1 << 24, false, "max_position_embeddings (0: preset)",
     INT_OPT(max_pos)},
    {"rope-theta", CFG_DOUBLE, "0", 0, 1e12, false, "RoPE base (0: 1e6 for qwen, 500000 for llama)",
     offsetof(mk_cfg, rope_theta), 0},
    {"rms-norm-eps", CFG_DOUBLE, "0", 0, 1, false, "RMSNorm epsilon (0: family default)",
     offsetof(mk_cfg, rms_norm_eps), 0},
    {"llama3-rope-scaling", CFG_BOOL, "false", 1, 0, false,
     "add Llama-3 rope_scaling (llama family only)", offsetof(mk_cfg, llama3_rope_scaling), 0},
    {"rope-factor", CFG_DOUBLE, "8", 1, 1e6, false, "llama3 rope_scaling.factor",
     offsetof(mk_cfg, rope_factor), 0},
    {"rope-low-freq", CFG_DOUBLE, "1", 1e-6, 1e6, false, "llama3 rope_scaling.low_freq_factor",
     offsetof(mk_cfg, rope_low_freq), 0},
    {"rope-high-freq", CFG_DOUBLE, "4", 1e-6, 1e6, false, "llama3 rope_scaling.high_freq_factor",
     offsetof(mk_cfg, rope_high_freq), 0},
    {"rope-original-max", CFG_INT, "8192", 1, 1 << 24, false,
     "llama3 rope_scaling.original_max_position_embeddings", INT_OPT(rope_original_max)},
    {"tie", CFG_BOOL, "false", 1, 0, false, "tie lm_head to embed_tokens (no lm_head.weight)",
     offsetof(mk_cfg, tie), 0},
    {"dtype", CFG_STRING, "bf16", 1, 0, false, "bf16, f16 or f32", STR_OPT(dtype)},
    {"seed", CFG_INT, "1", 0, 9.0e18, false, "seed of every weight", INT_OPT(seed)},
    {"init-std", CFG_DOUBLE, "0.02", 0, 10, false, "std of linears, embeddings and biases",
     offsetof(mk_cfg, init_std), 0},
    {"norm-jitter", CFG_DOUBLE, "0", 0, 10, false, "norm weights are 1 + norm-jitter * normal(0,1)",
     offsetof(mk_cfg, norm_jitter), 0},
    {"shard-size-mb", CFG_INT, "0", 0, 1 << 30, false,
     "split into shards of at most this many MiB with an index (0: one file)",
     INT_OPT(shard_size_mb)},
    {"threads", CFG_INT, "0", 0, 1024, false, "threads drawing the values (0: all cores)",
     INT_OPT(threads)},
    {"bos", CFG_INT, "-1", -1, 1 << 24, false, "bos_token_id (-1: none)", INT_OPT(bos)},
    {"eos", CFG_INT, "-1", -1, 1 << 24, false, "eos_token_id (-1: none)", INT_OPT(eos)},
    {"out", CFG_STRING, "", 1, 0, false,
     "output directory: new, empty, or one dflash-mkmodel wrote (its " MARKER " file)",
     STR_OPT(out)},
    {"force", CFG_BOOL, "false", 1, 0, false,
     "replace the model in any --out directory (its config.json and weights)",
     offsetof(mk_cfg, force), 0},
    {"log-level", CFG_STRING, "info", 1, 0, false, "debug, info, warn or error",
     STR_OPT(log_level)},
};
static const cfg_table mk_table = {
    "dflash-mkmodel", "write a random seeded checkpoint in Hugging Face layout", "[options]",
    mk_options, sizeof mk_options / sizeof mk_options[0], NULL, NULL, NULL};

typedef struct preset {
    const char *name;
    int hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, max_pos;
} preset;

static const preset presets[] = {
    {"tiny", 64, 4, 4, 2, 16, 128, 512, 2048},
    {"qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, 40960},
};

/* Standard normals 2p and 2p+1 of the stream key (one Box-Muller draw per pair). */
static void normal_pair(uint64_t key, uint64_t p, float *z0, float *z1) {
    uint64_t r = rng_hash64(key + p * 0xd1b54a32d192ed03ull);
    double u1 = ((double)(r >> 40) + 1.0) / 16777217.0; /* (0, 1] */
    double u2 = (double)(r & 0xffffffu) / 16777216.0;   /* [0, 1) */
    double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586 * u2;
    *z0 = (float)(rad * cos(ang));
    *z1 = (float)(rad * sin(ang));
}

/* Resolves sizes and the family into *mc; logs and returns non-zero when something is wrong. */
static int build_config(const mk_cfg *c, model_config *mc) {
    model_family fam;
    if (hf_config_family_parse(c->family, &fam)) {
        LOG_ERROR("--family %s: use qwen3, qwen2 or llama", c->family);
        return DFLASH_EINVAL;
    }
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(c->preset, presets[i].name) == 0) p = &presets[i];
    if (!p) {
        LOG_ERROR("--preset %s: use tiny or qwen3-8b", c->preset);
        return DFLASH_EINVAL;
    }
    hf_config_defaults(mc, fam);
    mc->hidden_size = c->hidden ? (int)c->hidden : p->hidden;
    mc->num_layers = c->layers ? (int)c->layers : p->layers;
    mc->num_heads = c->heads ? (int)c->heads : p->heads;
    mc->num_kv_heads = c->kv_heads ? (int)c->kv_heads : (c->heads ? mc->num_heads : p->kv_heads);
    if (c->head_dim) {
        mc->head_dim = (int)c->head_dim;
    } else if (c->hidden || c->heads || fam == MODEL_QWEN2) {
        /* a truncated quotient would give heads * head_dim != hidden without a word */
        if (mc->hidden_size % mc->num_heads) {
            LOG_ERROR("hidden size %d is not a multiple of %d heads: choose sizes that divide, "
                      "or give --head-dim",
                      mc->hidden_size, mc->num_heads);
            return DFLASH_EINVAL;
        }
        mc->head_dim = mc->hidden_size / mc->num_heads;
    } else
        mc->head_dim = p->head_dim;
    mc->intermediate_size = c->intermediate ? (int)c->intermediate : p->intermediate;
    mc->vocab_size = c->vocab ? (int)c->vocab : p->vocab;
    mc->max_position_embeddings = c->max_pos ? (int)c->max_pos : p->max_pos;
    if (c->rope_theta > 0) mc->rope_theta = c->rope_theta;
    if (c->rms_norm_eps > 0) mc->rms_norm_eps = c->rms_norm_eps;
    mc->tie_word_embeddings = c->tie;
    mc->bos_token_id = (int)c->bos;
    mc->eos_token_id = (int)c->eos;
    if (c->llama3_rope_scaling) {
        if (fam != MODEL_LLAMA) {
            LOG_ERROR("--llama3-rope-scaling needs --family llama");
            return DFLASH_EINVAL;
        }
        mc->rope_scaling.enabled = true;
        mc->rope_scaling.factor = c->rope_factor;
        mc->rope_scaling.low_freq_factor = c->rope_low_freq;
        mc->rope_scaling.high_freq_factor = c->rope_high_freq;
        mc->rope_scaling.original_max_position_embeddings = (int)c->rope_original_max;
    }
    char err[256];
    if (hf_config_validate(mc, err, sizeof err)) {
        LOG_ERROR("invalid model: %s", err);
        return DFLASH_EINVAL;
    }
    return 0;
}

typedef struct mk_ctx {
    const mk_cfg *cfg;
    const model_config *mc;
    safetensors_dtype dt;
    size_t n_tensors;
    hf_weight_desc *w; /* all tensors, file order */
    int *shard_of;     /* shard index of each tensor */
    int n_shards;
    uint64_t total_bytes, done_bytes;
    time_t last_log, started;
    float *fbuf;
    unsigned char *obuf;
    int threads; /* workers per chunk, 1..MAX_THREADS */
    volatile sig_atomic_t *stop; /* set by SIGINT/SIGTERM */
} mk_ctx;

#define CHUNK (1u << 24)
#define MAX_THREADS 64

static uint64_t tensor_bytes(const mk_ctx *m, size_t i) {
    const hf_weight_desc *d = &m->w[i];
    uint64_t n = (uint64_t)d->shape[0] * (d->ndim == 2 ? (uint64_t)d->shape[1] : 1);
    return n * safetensors_dtype_size(m->dt);
}

/* Elements [j0, j1) of a chunk starting at element s of one tensor: drawn into fbuf and, for
 * 16-bit dtypes, converted into obuf. j0 is even. */
typedef struct fill_job {
    const mk_ctx *m;
    const hf_weight_desc *d;
    uint64_t key, s;
    size_t j0, j1;
} fill_job;

static void *fill_range(void *arg) {
    const fill_job *f = arg;
    const mk_ctx *m = f->m;
    /* s is even (CHUNK is), so element s + j is component j & 1 of pair (s + j) / 2 */
    for (size_t j = f->j0; j < f->j1; j += 2) {
        float z[2];
        normal_pair(f->key, (f->s + j) >> 1, &z[0], &z[1]);
        for (size_t q = 0; q < 2 && j + q < f->j1; q++)
            m->fbuf[j + q] = f->d->is_norm ? 1.0f + (float)m->cfg->norm_jitter * z[q]
                                           : (float)m->cfg->init_std * z[q];
    }
    if (m->dt == SAFETENSORS_BF16 || m->dt == SAFETENSORS_F16) {
        uint16_t *h = (uint16_t *)(void *)m->obuf;
        for (size_t j = f->j0; j < f->j1; j++)
            h[j] = m->dt == SAFETENSORS_BF16 ? safetensors_f32_to_bf16(m->fbuf[j])
                                             : safetensors_f32_to_f16(m->fbuf[j]);
    }
    return NULL;
}

/* Fills k elements of the chunk at s with m->threads workers (the caller is one of them). */
static void fill_chunk(const mk_ctx *m, const hf_weight_desc *d, uint64_t key, uint64_t s,
                       size_t k) {
    int nt = m->threads;
    size_t per = ((k + (size_t)nt - 1) / (size_t)nt + 1) & ~(size_t)1; /* even */
    fill_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    int n = 0;
    for (size_t j0 = 0; j0 < k && n < nt; j0 += per, n++) {
        jobs[n] = (fill_job){m, d, key, s, j0, j0 + per < k ? j0 + per : k};
        if (n > 0) started[n] = pthread_create(&tid[n], NULL, fill_range, &jobs[n]) == 0;
    }
    for (int t = 0; t < n; t++)
        if (t == 0 || !started[t]) fill_range(&jobs[t]); /* ours, or a thread that did not start */
    for (int t = 1; t < n; t++)
        if (started[t]) pthread_join(tid[t], NULL);
}

/* Streams tensor i's values into the writer, CHUNK elements at a time. */
static int write_tensor(mk_ctx *m, safetensors_writer *wr, size_t i) {
    const hf_weight_desc *d = &m->w[i];
    uint64_t n = (uint64_t)d->shape[0] * (d->ndim == 2 ? (uint64_t)d->shape[1] : 1);
    uint64_t key = rng_hash64(rng_hash64((uint64_t)m->cfg->seed) ^ (0x5bd1e995ull * (i + 1)));
    size_t es = safetensors_dtype_size(m->dt);
    bool half = m->dt == SAFETENSORS_BF16 || m->dt == SAFETENSORS_F16;
    for (uint64_t s = 0; s < n; s += CHUNK) {
        if (*m->stop) return DFLASH_ESHUTDOWN;
        size_t k = n - s < CHUNK ? (size_t)(n - s) : CHUNK;
        fill_chunk(m, d, key, s, k);
        const void *src = half ? (const void *)m->obuf : (const void *)m->fbuf;
        int rc = safetensors_writer_write(wr, src, k * es);
        if (rc) return rc;
        m->done_bytes += k * es;
        time_t now = time(NULL);
        if (now - m->last_log >= 5) {
            m->last_log = now;
            LOG_INFO("%.2f / %.2f GB written (%.0f%%), %lds", m->done_bytes / 1e9,
                     m->total_bytes / 1e9, 100.0 * m->done_bytes / m->total_bytes,
                     (long)(now - m->started));
        }
    }
    return 0;
}

static int write_shard(mk_ctx *m, int s, const char *path) {
    safetensors_writer *wr = safetensors_writer_new(path);
    if (!wr) return DFLASH_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < m->n_tensors && !rc; i++)
        if (m->shard_of[i] == s)
            rc = safetensors_writer_add(wr, m->w[i].name, m->dt, m->w[i].ndim, m->w[i].shape, NULL);
    if (!rc) rc = safetensors_writer_begin(wr);
    for (size_t i = 0; i < m->n_tensors && !rc; i++)
        if (m->shard_of[i] == s) rc = write_tensor(m, wr, i);
    if (!rc) rc = safetensors_writer_commit(wr);
    int e = safetensors_writer_errno(wr);
    safetensors_writer_destroy(&wr);
    errno = e; /* the system's reason for DFLASH_EIO (a full disk: ENOSPC), for write_error */
    return rc;
}

/* What a failed write reports (a shard, the index, config.json): strerror of its errno when it
 * has one. */
static const char *write_error(int rc) {
    return rc == DFLASH_EIO && errno ? strerror(errno) : err_str(rc);
}

/* Whether dir (which exists) may take a new model: empty, or holding MARKER, or force; else
 * says why not. Then writes MARKER (before any weight, so an interrupted run's directory is
 * recognised). 0, 1 (cannot read or write dir) or 2 (refused). */
static int claim_out_dir(const char *dir, bool force) {
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        LOG_ERROR("cannot open %s: %s", dir, strerror(e));
        return e == ENOTDIR ? 2 : 1; /* --out names a file: the flags */
    }
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/" MARKER, dir);
    if (!empty && !force && access(path, F_OK) != 0) {
        LOG_ERROR("--out %s is not empty and not a model dflash-mkmodel wrote (no " MARKER
                  "): it would replace its config.json and weights with random ones; give a new "
                  "or empty directory, or --force to replace them",
                  dir);
        return 2;
    }
    FILE *fp = fopen(path, "w");
    bool failed = !fp;
    if (fp) {
        failed = fputs("a random model written by dflash-mkmodel, which may replace it\n", fp) < 0;
        failed |= fclose(fp) != 0;
    }
    if (failed) {
        LOG_ERROR("cannot write %s: %s", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* Removes dir's shards of an earlier model (model-NNNNN-of-NNNNN.safetensors): without an
 * index a loader (vLLM, SGLang) reads every *.safetensors file, so shards left beside a new
 * single file (or beside fewer new shards) would load with it (defect: they stayed). */
static void remove_old_shards(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[PATH_MAX];
    for (struct dirent *e; (e = readdir(d));) {
        int n = 0; /* five digits each, and nothing after the name's end */
        sscanf(e->d_name, "model-%*5[0-9]-of-%*5[0-9].safetensors%n", &n);
        if (n != (int)strlen("model-00001-of-00001.safetensors") || e->d_name[n]) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0) LOG_INFO("removing %s, a shard of the model replaced", path);
    }
    closedir(d);
}

/* Removes the first n of this run's shards (names): no checkpoint without the others. */
static void remove_run_shards(const char *dir, char (*names)[64], int n) {
    char path[PATH_MAX];
    for (int k = 0; k < n; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        unlink(path);
    }
}

static const char *transformers_dtype(safetensors_dtype dt) {
    return dt == SAFETENSORS_BF16 ? "bfloat16" : dt == SAFETENSORS_F16 ? "float16" : "float32";
}

int main(int argc, char **argv) {
    volatile sig_atomic_t *stop = signals_install_stop_flag();
    mk_cfg cfg;
    int rc = config_load(&mk_table, &cfg, argc, argv, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : 2;
    if (log_init_named("dflash-mkmodel", cfg.log_level) != 0) return 2;
    if (!cfg.out[0]) {
        LOG_ERROR("--out DIR is required");
        return 2;
    }
    mk_ctx m = {.cfg = &cfg, .stop = stop};
    model_config mc;
    if (build_config(&cfg, &mc)) return 2;
    m.mc = &mc;
    if (safetensors_dtype_parse(cfg.dtype, &m.dt) ||
        (m.dt != SAFETENSORS_BF16 && m.dt != SAFETENSORS_F16 && m.dt != SAFETENSORS_F32)) {
        LOG_ERROR("--dtype %s: use bf16, f16 or f32", cfg.dtype);
        return 2;
    }
    if (mkdir(cfg.out, 0755) != 0 && errno != EEXIST) {
        LOG_ERROR("cannot create %s: %s", cfg.out, strerror(errno));
        return 1;
    }
    if ((rc = claim_out_dir(cfg.out, cfg.force))) return rc;

    m.n_tensors = hf_weight_count(&mc);
    m.w = calloc(m.n_tensors, sizeof *m.w);
    m.shard_of = calloc(m.n_tensors, sizeof *m.shard_of);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    m.threads = cfg.threads > 0 ? (int)cfg.threads : (int)(cores > 0 ? cores : 1);
    if (m.threads > MAX_THREADS) m.threads = MAX_THREADS;
    m.fbuf = malloc(CHUNK * sizeof *m.fbuf);
    m.obuf = malloc(CHUNK * 2);
    if (!m.w || !m.shard_of || !m.fbuf || !m.obuf) LOG_FATAL("out of memory");
    uint64_t limit = (uint64_t)cfg.shard_size_mb << 20, in_shard = 0;
    for (size_t i = 0; i < m.n_tensors; i++) {
        if (!hf_weight_nth(&mc, i, &m.w[i])) LOG_FATAL("weight table has a hole at %zu", i);
        uint64_t b = tensor_bytes(&m, i);
        m.total_bytes += b;
        if (limit && in_shard && in_shard + b > limit) {
            m.n_shards++;
            in_shard = 0;
        }
        m.shard_of[i] = m.n_shards;
        in_shard += b;
    }
    m.n_shards++;
    if (!limit) m.n_shards = 1;

    LOG_INFO("%s: hidden %d, %d layers, %d/%d heads of %d, intermediate %d, vocab %d, %s%s, "
             "%zu tensors, %.3f GB in %d file(s), seed %lld",
             hf_config_family_name(mc.family), mc.hidden_size, mc.num_layers, mc.num_heads,
             mc.num_kv_heads, mc.head_dim, mc.intermediate_size, mc.vocab_size,
             safetensors_dtype_name(m.dt), mc.tie_word_embeddings ? ", tied" : "", m.n_tensors,
             m.total_bytes / 1e9, m.n_shards, (long long)cfg.seed);
    m.started = m.last_log = time(NULL);

    /* a previous checkpoint in DIR must not mix with this one: drop its files first, and write
     * config.json last, so a directory with a config.json is complete */
    char path[PATH_MAX];
    const char *stale[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof stale / sizeof stale[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", cfg.out, stale[i]);
        if (unlink(path) == 0) LOG_INFO("replacing %s", path);
    }
    remove_old_shards(cfg.out);
    if (m.n_shards == 1 && !limit) {
        snprintf(path, sizeof path, "%s/model.safetensors", cfg.out);
        fs_remove_stale_temps(path, "a partial model file"); /* an earlier run's, killed */
        rc = write_shard(&m, 0, path);
        if (rc == DFLASH_ESHUTDOWN)
            LOG_ERROR("stopped: %s not written", path);
        else if (rc)
            LOG_FATAL("cannot write %s: %s", path, write_error(rc));
    } else {
        char(*names)[64] = calloc((size_t)m.n_shards, sizeof *names);
        const char **files = calloc(m.n_tensors, sizeof *files);
        const char **tnames = calloc(m.n_tensors, sizeof *tnames);
        if (!names || !files || !tnames) LOG_FATAL("out of memory");
        for (int s = 0; s < m.n_shards && rc != DFLASH_ESHUTDOWN; s++) {
            snprintf(names[s], sizeof names[s], "model-%05d-of-%05d.safetensors", s + 1,
                     m.n_shards);
            snprintf(path, sizeof path, "%s/%s", cfg.out, names[s]);
            fs_remove_stale_temps(path, "a partial model file"); /* an earlier run's, killed */
            rc = write_shard(&m, s, path);
            const char *why = rc ? write_error(rc) : ""; /* before the unlinks touch errno */
            if (rc) /* this run's shards are no checkpoint: remove them (a full disk kept GBs) */
                remove_run_shards(cfg.out, names, s);
            if (rc == DFLASH_ESHUTDOWN)
                LOG_ERROR("stopped: no checkpoint written in %s", cfg.out);
            else if (rc)
                LOG_FATAL("cannot write %s: %s", path, why);
        }
        for (size_t i = 0; i < m.n_tensors; i++) {
            tnames[i] = m.w[i].name;
            files[i] = names[m.shard_of[i]];
        }
        if (rc != DFLASH_ESHUTDOWN)
            rc = safetensors_write_index(cfg.out, tnames, files, m.n_tensors, m.total_bytes);
        if (rc && rc != DFLASH_ESHUTDOWN) {
            const char *why = write_error(rc);
            remove_run_shards(cfg.out, names, m.n_shards);
            LOG_FATAL("cannot write the index in %s: %s", cfg.out, why);
        }
        free(names);
        free(files);
        free(tnames);
    }
    if (rc != DFLASH_ESHUTDOWN) {
        rc = hf_config_write(cfg.out, &mc, transformers_dtype(m.dt));
        if (rc) LOG_FATAL("cannot write %s/config.json: %s", cfg.out, write_error(rc));
        LOG_INFO("wrote %s (%.3f GB, %lds)", cfg.out, m.total_bytes / 1e9,
                 (long)(time(NULL) - m.started));
    }
    free(m.w);
    free(m.shard_of);
    free(m.fbuf);
    free(m.obuf);
    return rc == DFLASH_ESHUTDOWN ? 1 : 0;
}
