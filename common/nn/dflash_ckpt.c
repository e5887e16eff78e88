/* dflash_ckpt: drafter checkpoint directories (see dflash_ckpt.h for the layout and contract).
 *
 * Everything goes through host copies: the masters and moments are downloaded once per save
 * (fp32), converted to bf16 for model.safetensors, and written with the safetensors writer
 * (each file itself temp + fsync + rename; the writer adds every tensor's crc32c to the file's
 * metadata as it writes). config.json is built with cJSON. dflash.py, which config.json's
 * auto_map names for transformers' AutoModel, is nn/dflash_hf.py, built in. The loaders check
 * every tensor's checksum as they convert it (load_all), before anything reaches the model.
 * model.safetensors and its index are written by write_weights and write_index, from the save
 * and from the resume when the checkpoint's copy is missing or damaged (check_weights_file):
 * the same writers, so the same bytes.
 * A failure keeps its kind from safetensors_open (unreadable, missing, damaged) to the caller.
 * The trained batches the broker has not acked (dflash_ckpt_opts.unacked) are one metadata
 * string of the training state, "E/B/I@S,...", checked on both sides (count, steps within the
 * checkpoint's): format_unacked writes it, parse_unacked reads it; a checkpoint without it has
 * none. It is not in model.safetensors, so the serving systems never see it.
 */
#include "dflash_ckpt.h"

#include "collective.h" /* DP_COMM_MAX_WORLD: the ranks a checkpoint's step can have */
#include "err.h"
#include "finite.h"
#include "fsutil.h"
#include "hf_config.h"
#include "log.h"
#include "safetensors.h"

#include "dflash_hf_py.h" /* generated: dflash_hf_py[], the text of nn/dflash_hf.py */

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_FORMAT "dflash-training-state-1"
#define STATE_FILE "training_state.safetensors"
#define UNACKED_KEY "unacked_batches" /* training state metadata: "E/B/I@S,..." */

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        if (err) snprintf(err, errlen, __VA_ARGS__);                                               \
        rc = (code);                                                                               \
        goto out;                                                                                  \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * small file helpers */

/* The helpers below return DFLASH_EIO with errno set to the cause (strerror for the message). */
static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return DFLASH_EIO;
    int r = fsync(fd), e = errno;
    close(fd);
    errno = e;
    return r ? DFLASH_EIO : 0;
}

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return DFLASH_EIO;
    size_t n = strlen(text);
    errno = 0;
    bool ok = fwrite(text, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok) return 0;
    errno = e ? e : EIO;
    return DFLASH_EIO;
}

/* Why a safetensors write failed: the system's reason (e.g. a full disk) when there is one. */
static const char *writer_error(const safetensors_writer *w, int rc) {
    int e = rc == DFLASH_EIO ? safetensors_writer_errno(w) : 0;
    return e ? strerror(e) : err_str(rc);
}

/* Removes dir and the plain files in it (checkpoints have no subdirectories). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static bool is_step_name(const char *n) {
    if (strncmp(n, "step-", 5) || !n[5]) return false;
    for (const char *c = n + 5; *c; c++)
        if (*c < '0' || *c > '9') return false;
    return true;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the step-* entries of root (zero padded, so name order is step order). */
static int list_steps(const char *root, char ***names) {
    DIR *d = opendir(root);
    *names = NULL;
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_step_name(e->d_name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(*names, (size_t)cap * sizeof *nn);
            if (!nn) break;
            *names = nn;
        }
        (*names)[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(*names, (size_t)n, sizeof **names, cmp_str);
    return n;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* ---------------------------------------------------------------------------------------------
 * config.json (dflash.md 2.1) */

static cJSON *config_json(const dflash_config *c, const char *dtype) {
    cJSON *j = cJSON_CreateObject();
    const char *arch[1] = {"DFlashDraftModel"};
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON *am = cJSON_AddObjectToObject(j, "auto_map");
    cJSON_AddStringToObject(am, "AutoModel", "dflash.DFlashDraftModel");
    cJSON_AddStringToObject(j, "model_type", "qwen3");
    cJSON_AddNumberToObject(j, "block_size", c->block_size);
    cJSON_AddNumberToObject(j, "num_target_layers", c->num_target_layers);
    cJSON *dc = cJSON_AddObjectToObject(j, "dflash_config");
    cJSON_AddNumberToObject(dc, "mask_token_id", c->mask_token_id);
    cJSON_AddItemToObject(dc, "target_layer_ids",
                          cJSON_CreateIntArray(c->target_layer_ids, c->n_feat));
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_layers);
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddNullToObject(j, "rope_scaling");
    cJSON_AddFalseToObject(j, "attention_bias");
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON *lt = cJSON_AddArrayToObject(j, "layer_types");
    for (int i = 0; i < c->num_layers; i++)
        cJSON_AddItemToArray(lt, cJSON_CreateString("full_attention"));
    cJSON_AddNumberToObject(j, "max_window_layers", c->num_layers);
    cJSON_AddNullToObject(j, "sliding_window");
    cJSON_AddFalseToObject(j, "use_sliding_window");
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    /* the drafter owns no embedding or lm_head: both are the target's */
    cJSON_AddFalseToObject(j, "tie_word_embeddings");
    hf_config_json_token_id(j, "bos_token_id", c->bos_token_id);
    hf_config_json_token_id(j, "eos_token_id", c->eos_token_id);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddStringToObject(j, "dtype", dtype);
    /* the same under its name before transformers 4.56, which older loaders read */
    cJSON_AddStringToObject(j, "torch_dtype", dtype);
    cJSON_AddTrueToObject(j, "use_cache");
    return j;
}

static bool get_int(const cJSON *o, const char *k, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return false;
    *out = (int)v->valuedouble;
    return (double)*out == v->valuedouble;
}

static bool get_dbl(const cJSON *o, const char *k, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return false;
    *out = v->valuedouble;
    return true;
}

/* DIR/config.json parsed into *out (the caller deletes it; path receives its path). 0,
 * DFLASH_ENOTFOUND or DFLASH_EIO (cannot be read: the system's reason in err), DFLASH_EFORMAT (not
 * a JSON object) or DFLASH_ENOMEM. */
static int read_config_json(const char *dir, char *path, size_t pathlen, cJSON **out, char *err,
                            size_t errlen) {
    int rc = 0;
    *out = NULL;
    snprintf(path, pathlen, "%s/config.json", dir);
    char *text = fs_read_text(path, 16u << 20, err, errlen, &rc); /* a FIFO is not waited on */
    if (!text) return rc;
    *out = cJSON_Parse(text);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        FAIL(DFLASH_EFORMAT, "%s: not a JSON object", path);
    }
out:
    free(text);
    return rc;
}

int dflash_ckpt_load_config(const char *dir, dflash_config *c, char *err, size_t errlen) {
    char path[4096];
    cJSON *j = NULL;
    int rc = read_config_json(dir, path, sizeof path, &j, err, errlen);
    if (rc) return rc;
    memset(c, 0, sizeof *c);
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(j, "dflash_config");
#define REQ_INT(key, dst)                                                                          \
    if (!get_int(j, key, dst))                                                                     \
    FAIL(DFLASH_EFORMAT, "%s: field %s missing or not an integer", path, key)
    REQ_INT("hidden_size", &c->hidden_size);
    REQ_INT("num_hidden_layers", &c->num_layers);
    REQ_INT("num_attention_heads", &c->num_heads);
    REQ_INT("intermediate_size", &c->intermediate_size);
    REQ_INT("vocab_size", &c->vocab_size);
#undef REQ_INT
    if (!get_int(j, "num_key_value_heads", &c->num_kv_heads)) c->num_kv_heads = c->num_heads;
    if (!get_int(j, "head_dim", &c->head_dim))
        c->head_dim = c->num_heads ? c->hidden_size / c->num_heads : 0;
    if (!get_int(j, "block_size", &c->block_size) &&
        !(dc && get_int(dc, "block_size", &c->block_size)))
        c->block_size = 16;
    if (!get_int(j, "num_target_layers", &c->num_target_layers) &&
        !(dc && get_int(dc, "num_target_layers", &c->num_target_layers)))
        FAIL(DFLASH_EFORMAT, "%s: field num_target_layers missing", path);
    if (!dc || !get_int(dc, "mask_token_id", &c->mask_token_id))
        FAIL(DFLASH_EFORMAT, "%s: field dflash_config.mask_token_id missing", path);
    const cJSON *ids = dc ? cJSON_GetObjectItemCaseSensitive(dc, "target_layer_ids") : NULL;
    if (cJSON_IsArray(ids)) {
        int n_ids = cJSON_GetArraySize(ids);
        if (n_ids < 1 || n_ids > DFLASH_MAX_FEAT)
            FAIL(DFLASH_ECONFIG, "%s: dflash_config.target_layer_ids has %d entries", path, n_ids);
        c->n_feat = n_ids;
        for (int i = 0; i < n_ids; i++) {
            const cJSON *v = cJSON_GetArrayItem(ids, i);
            if (!cJSON_IsNumber(v))
                FAIL(DFLASH_EFORMAT, "%s: dflash_config.target_layer_ids[%d] not a number", path,
                     i);
            c->target_layer_ids[i] = (int)v->valuedouble;
        }
    } else {
        c->n_feat = c->num_layers;
        if (dflash_default_layer_ids(c->num_target_layers, c->n_feat, c->target_layer_ids))
            FAIL(DFLASH_ECONFIG,
                 "%s: no dflash_config.target_layer_ids, and %d target layers are too few for "
                 "the default rule",
                 path, c->num_target_layers);
    }
    if (!get_int(j, "max_position_embeddings", &c->max_position_embeddings))
        c->max_position_embeddings = 40960;
    if (!get_dbl(j, "rms_norm_eps", &c->rms_norm_eps)) c->rms_norm_eps = 1e-6;
    /* transformers 5 writes it in rope_parameters only (a config saved through it) */
    if (!get_dbl(j, "rope_theta", &c->rope_theta) &&
        !get_dbl(cJSON_GetObjectItemCaseSensitive(j, "rope_parameters"), "rope_theta",
                 &c->rope_theta))
        c->rope_theta = 1e6;
    c->tie_word_embeddings =
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"));
    if (!get_int(j, "bos_token_id", &c->bos_token_id)) c->bos_token_id = -1;
    if (!get_int(j, "eos_token_id", &c->eos_token_id)) c->eos_token_id = -1;
    char msg[256];
    if (dflash_config_validate(c, msg, sizeof msg)) FAIL(DFLASH_ECONFIG, "%s: %s", path, msg);
out:
    cJSON_Delete(j);
    return rc;
}

int dflash_ckpt_check_config(const dflash_config *a, const dflash_config *b, char *err,
                             size_t errlen) {
    int rc = 0;
#define SAME(field, key)                                                                           \
    if (a->field != b->field)                                                                      \
    FAIL(DFLASH_EMISMATCH, "drafter " key " %d does not match checkpoint " key " %d", a->field,    \
         b->field)
    SAME(hidden_size, "hidden_size");
    SAME(num_layers, "num_hidden_layers");
    SAME(num_heads, "num_attention_heads");
    SAME(num_kv_heads, "num_key_value_heads");
    SAME(head_dim, "head_dim");
    SAME(intermediate_size, "intermediate_size");
    SAME(block_size, "block_size");
    SAME(vocab_size, "vocab_size");
    SAME(mask_token_id, "mask_token_id");
    SAME(num_target_layers, "num_target_layers");
    SAME(n_feat, "number of target_layer_ids");
    for (int i = 0; i < a->n_feat; i++)
        SAME(target_layer_ids[i], "target_layer_id");
#undef SAME
    /* the target's, shaping the drafter's function though not its tensors */
#define SAME_D(field, key)                                                                         \
    if (a->field != b->field)                                                                      \
    FAIL(DFLASH_EMISMATCH, "drafter " key " %g (the target's) does not match checkpoint " key      \
         " %g",                                                                                    \
         a->field, b->field)
    SAME_D(rope_theta, "rope_theta");
    SAME_D(rms_norm_eps, "rms_norm_eps");
#undef SAME_D
out:
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * save */

/* Writes dir/model.safetensors.index.json (safetensors_write_index): every trainable tensor
 * mapped to model.safetensors, total_size the bytes of their data in that file (bf16, or fp32
 * with f32). The file names exactly model.safetensors's tensors, so loaders that glob
 * *.safetensors and keep only the files an index names (vLLM and SGLang) do not read
 * training_state.safetensors. 0, or a negative code with the file and the reason in err. */
static int write_index(const dflash_model *m, bool f32, const char *dir, char *err, size_t errlen) {
    int rc = 0;
    size_t n = (size_t)m->n_tensors;
    uint64_t total = 0;
    const char **names = malloc(n * sizeof *names), **files = malloc(n * sizeof *files);
    if (!names || !files) FAIL(DFLASH_ENOMEM, "checkpoint: out of memory for %s's index", dir);
    for (size_t i = 0; i < n; i++) {
        names[i] = m->tensors[i].name;
        files[i] = "model.safetensors";
        total += (uint64_t)m->tensors[i].numel * (f32 ? sizeof(float) : sizeof(uint16_t));
    }
    errno = 0;
    if ((rc = safetensors_write_index(dir, names, files, n, total)))
        FAIL(rc, "checkpoint: cannot write %s/model.safetensors.index.json: %s", dir,
             rc == DFLASH_EIO && errno ? strerror(errno) : err_str(rc));
out:
    free(names);
    free(files);
    return rc;
}

/* Writes dir/model.safetensors from masters (fp32, the masters' host layout): every trainable
 * tensor under its name, bf16 (round to nearest even) or, with f32, fp32, each with its
 * checksum. The safetensors writer replaces the file atomically (model.safetensors.tmp.PID,
 * fsync, rename, fsync of the directory): a reader sees the old file or the whole new one. The
 * bytes depend on the masters alone: the same masters write the same file. 0, or a negative
 * code with the file and the reason in err. Its index is write_index's. */
static int write_weights(const dflash_model *m, const float *masters, bool f32, const char *dir,
                         char *err, size_t errlen) {
    int rc = 0;
    size_t n = m->n_params;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint16_t *bf = f32 ? NULL : malloc(n * sizeof(uint16_t));
    safetensors_writer *w = safetensors_writer_new(path);
    if (!w || (!f32 && !bf)) FAIL(DFLASH_ENOMEM, "checkpoint: out of memory for %s", path);
    if (bf)
        for (size_t i = 0; i < n; i++)
            bf[i] = safetensors_f32_to_bf16(masters[i]);
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const dflash_tensor *t = &m->tensors[i];
        int64_t shp[2] = {t->shape[0], t->shape[1]};
        rc = f32 ? safetensors_writer_add(w, t->name, SAFETENSORS_F32, t->ndim, shp,
                                          masters + t->offset)
                 : safetensors_writer_add(w, t->name, SAFETENSORS_BF16, t->ndim, shp,
                                          bf + t->offset);
    }
    if (rc || (rc = safetensors_writer_commit(w)))
        FAIL(rc, "checkpoint: cannot write %s: %s", path, writer_error(w, rc));
out:
    safetensors_writer_destroy(&w);
    free(bf);
    return rc;
}

int dflash_ckpt_lock_root(const char *root, int *fd, char *err, size_t errlen) {
    int rc = 0;
    char p[4200], pid[32] = "";
    snprintf(p, sizeof p, "%s/.lock", root);
    *fd = open(p, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644); /* a symlink: refused */
    if (*fd < 0) FAIL(DFLASH_EIO, "cannot open %s: %s", p, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        ssize_t n = pread(*fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        if (e == EWOULDBLOCK)
            FAIL(DFLASH_EEXISTS,
                 "%s is in use by another drafter (pid %s; %s is locked): two drafters "
                 "writing one directory replace and delete each other's checkpoints; give each "
                 "its own",
                 root, pid[0] ? pid : "unknown", p);
        FAIL(DFLASH_EIO, "cannot lock %s: %s", p, strerror(e));
    }
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, pid, strlen(pid), 0) != (ssize_t)strlen(pid))
        FAIL(DFLASH_EIO, "cannot write %s: %s", p, strerror(errno));
out:
    if (rc && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

int dflash_ckpt_check_root(const char *root, char *err, size_t errlen) {
    int rc = 0;
    struct stat sb;
    char probe[4200];
    if (fs_make_dirs(root) != 0) {
        int why = errno; /* fs_make_dirs's reason (a read-only file system), not stat's */
        if (stat(root, &sb) == 0 && !S_ISDIR(sb.st_mode))
            FAIL(DFLASH_EIO, "%s is not a directory", root);
        FAIL(DFLASH_EIO, "cannot create %s: %s", root, strerror(why));
    }
    if (fs_sync_parent_dir(root) != 0) /* a root just made must outlive a crash too */
        FAIL(DFLASH_EIO, "cannot fsync the directory holding %s: %s", root, strerror(errno));
    snprintf(probe, sizeof probe, "%s/.write-test-%d", root, (int)getpid());
    int fd = fs_create_new(probe, O_WRONLY, 0644);
    if (fd < 0) FAIL(DFLASH_EIO, "cannot write in %s: %s", root, strerror(errno));
    close(fd);
    unlink(probe);
out:
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * the unacked batches: "E/B/I@S" per batch, comma-separated, in the training state's metadata */

#define UNACKED_TEXT_MAX (DFLASH_CKPT_MAX_UNACKED * 72)

/* 0 when n batches (u) fit the record of a checkpoint at step: at most DFLASH_CKPT_MAX_UNACKED,
 * each trained at a step in 1 .. step; else DFLASH_EINVAL with the reason in err. */
static int check_unacked(const dflash_ckpt_unacked *u, int n, long step, char *err,
                         size_t errlen) {
    if (n < 0 || n > DFLASH_CKPT_MAX_UNACKED || (n && !u)) {
        if (err) snprintf(err, errlen, "%d unacked batches (at most %d)", n,
                          DFLASH_CKPT_MAX_UNACKED);
        return DFLASH_EINVAL;
    }
    for (int i = 0; i < n; i++)
        if (u[i].step < 1 || u[i].step > step) {
            if (err)
                snprintf(err, errlen, "unacked batch %u/%u/%" PRIu64 " trained at step %ld, "
                         "not in 1 .. %ld (the checkpoint's step)", u[i].epoch, u[i].bucket,
                         u[i].index, u[i].step, step);
            return DFLASH_EINVAL;
        }
    return 0;
}

/* The record's text for n (checked) batches into text (UNACKED_TEXT_MAX bytes). */
static void format_unacked(const dflash_ckpt_unacked *u, int n, char *text) {
    size_t len = 0;
    text[0] = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, UNACKED_TEXT_MAX - len, "%s%u/%u/%" PRIu64 "@%ld",
                                i ? "," : "", u[i].epoch, u[i].bucket, u[i].index, u[i].step);
}

/* One decimal number at *p (no sign, no space), at most max; advances *p. */
static bool parse_num(const char **p, uint64_t max, uint64_t *out) {
    if (**p < '0' || **p > '9') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(*p, &end, 10);
    if (errno || v > max) return false;
    *p = end;
    *out = v;
    return true;
}

/* Parses the record's text of a checkpoint at step: 0, or DFLASH_EFORMAT naming what is wrong. */
static int parse_unacked(const char *text, long step, dflash_ckpt_unacked *out, int max, int *n,
                         const char *path, char *err, size_t errlen) {
    const char *p = text;
    *n = 0;
    while (*p) {
        uint64_t e, b, i, s;
        bool ok = *n < max && parse_num(&p, UINT32_MAX, &e) && *p++ == '/' &&
                  parse_num(&p, UINT32_MAX, &b) && *p++ == '/' && parse_num(&p, UINT64_MAX, &i) &&
                  *p++ == '@' && parse_num(&p, (uint64_t)step, &s) && s >= 1 &&
                  (*p == 0 || (*p++ == ',' && *p));
        if (!ok) {
            if (err)
                snprintf(err, errlen, "%s: metadata %s \"%.200s\" is malformed (expected at most "
                         "%d of EPOCH/BUCKET/INDEX@STEP, comma-separated, STEP in 1 .. %ld)",
                         path, UNACKED_KEY, text, max, step);
            return DFLASH_EFORMAT;
        }
        out[*n] = (dflash_ckpt_unacked){(uint32_t)e, (uint32_t)b, i, (long)s};
        (*n)++;
    }
    return 0;
}

uint64_t dflash_ckpt_bytes(const dflash_model *m, bool weights_f32) {
    uint64_t n = m->n_params;
    return n * (weights_f32 ? 4u : 2u) + 3u * 4u * n; /* weights; masters, exp_avg, exp_avg_sq */
}

/* Whether step directory root/name holds a training state, i.e. a resume would take it: also
 * when the state cannot be looked at (EACCES, EIO, ELOOP...): its loader reports why, where
 * skipping it would resume from an older one in silence. */
static bool holds_state(const char *root, const char *name) {
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s/%s", root, name, STATE_FILE);
    return stat(p, &sb) == 0 || (errno != ENOENT && errno != ENOTDIR);
}

/* The retention: removes the checkpoints under root older than its newest `keep` that hold a
 * training state, never `spare` (the one a save just wrote). A step directory without one
 * (copied in part, weights only) is not counted: a resume skips it (defect: counted, a newer one
 * left the resumable ones fewer than --keep-last, and with --keep-last 1 a save removed the only
 * one before the new one was durable); one newer than the kept ones is left as it is. A save
 * runs it before writing too, so that a --keep-last lowered after a full disk frees room for the
 * next save (defect: the surplus went only after a successful save, which the full disk never
 * allowed); the `keep` newest stay while the new one is not durable. */
static void keep_newest(const char *root, int keep, const char *spare) {
    char **names, p[4200];
    int cnt = list_steps(root, &names), kept = 0, i = cnt - 1;
    for (; i >= 0 && kept < keep; i--) kept += holds_state(root, names[i]);
    for (; i >= 0; i--) {
        snprintf(p, sizeof p, "%s/%s", root, names[i]);
        if (strcmp(p, spare) == 0) continue;
        LOG_DEBUG("checkpoint: removing %s (--keep-last %d)", p, keep);
        remove_dir(p);
    }
    free_names(names, cnt);
}

/* A save writes the new checkpoint whole before the retention removes the oldest (pruning first
 * would leave fewer checkpoints while it is not durable): keep_last + 1 must fit. */
bool dflash_ckpt_space_hint(const char *err, int keep_last, uint64_t ckpt_bytes, char *out,
                            size_t len) {
    if (!err || (!strstr(err, strerror(ENOSPC)) && !strstr(err, strerror(EDQUOT)))) return false;
    int keep = keep_last > 0 ? keep_last : 3;
    snprintf(out, len, "a save needs room for --keep-last + 1 = %d checkpoints (%.1f MiB each: "
             "the new one is written before the oldest is removed): free space, or lower "
             "--keep-last (the next save removes the checkpoints past it first)", keep + 1,
             (double)ckpt_bytes / (1024.0 * 1024.0));
    return true;
}

int dflash_ckpt_save(const dflash_model *m, const dflash_train_cfg *tc, const char *root,
                     const dflash_ckpt_opts *opts, char *path, size_t pathlen, char *err,
                     size_t errlen) {
    int rc = 0, keep = opts && opts->keep_last > 0 ? opts->keep_last : 3;
    bool f32 = opts && opts->weights_f32;
    const nn_ops *o = m->ops;
    char tmp[4096], fin[4096], old[4096], p[4200], val[64];
    size_t n = m->n_params;
    float *host = malloc(3 * n * sizeof(float));
    safetensors_writer *w = NULL;
    cJSON *j = NULL;
    char *text = NULL;
    bool made_tmp = false;
    const dflash_ckpt_unacked *unacked = opts ? opts->unacked : NULL;
    int n_unacked = opts ? opts->n_unacked : 0;
    char why[256];
    if (check_unacked(unacked, n_unacked, m->step, why, sizeof why))
        FAIL(DFLASH_EINVAL, "checkpoint: %s", why);
    if (!host) FAIL(DFLASH_ENOMEM, "checkpoint: out of memory");
    if (mkdir(root, 0755) && errno != EEXIST)
        FAIL(DFLASH_EIO, "checkpoint: cannot create %s: %s", root, strerror(errno));
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%09ld-%d", root, m->step, (int)getpid());
    snprintf(fin, sizeof fin, "%s/step-%09ld", root, m->step);
    keep_newest(root, keep, fin);
    remove_dir(tmp);
    if (mkdir(tmp, 0755))
        FAIL(DFLASH_EIO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
    made_tmp = true;

    /* host copies: master, exp_avg, exp_avg_sq */
    float *hm = host, *ha = host + n, *hv = host + 2 * n;
    if ((rc = dflash_model_masters_download(m, hm)))
        FAIL(rc, "checkpoint: out of memory for the masters' download");
    o->download_raw(m->ctx, ha, m->adam_m, n * sizeof(float));
    o->download_raw(m->ctx, hv, m->adam_v, n * sizeof(float));

    /* config.json */
    j = config_json(&m->cfg, f32 ? "float32" : "bfloat16");
    text = j ? cJSON_Print(j) : NULL;
    if (!text) FAIL(DFLASH_ENOMEM, "checkpoint: out of memory");
    snprintf(p, sizeof p, "%s/config.json", tmp);
    if ((rc = write_file(p, text))) FAIL(rc, "checkpoint: cannot write %s: %s", p, strerror(errno));

    /* model.safetensors and model.safetensors.index.json */
    if ((rc = write_weights(m, hm, f32, tmp, err, errlen)) ||
        (rc = write_index(m, f32, tmp, err, errlen)))
        goto out;

    /* dflash.py: the drafter for AutoModel.from_pretrained(..., trust_remote_code=True) */
    snprintf(p, sizeof p, "%s/dflash.py", tmp);
    if ((rc = write_file(p, (const char *)dflash_hf_py)))
        FAIL(rc, "checkpoint: cannot write %s: %s", p, strerror(errno));

    /* training_state.safetensors */
    snprintf(p, sizeof p, "%s/%s", tmp, STATE_FILE);
    w = safetensors_writer_new(p);
    if (!w) FAIL(DFLASH_ENOMEM, "checkpoint: out of memory");
    safetensors_writer_meta(w, "format", STATE_FORMAT);
#define META(key, fmt, v)                                                                          \
    do {                                                                                           \
        snprintf(val, sizeof val, fmt, v);                                                         \
        safetensors_writer_meta(w, key, val);                                                      \
    } while (0)
    META("step", "%ld", m->step);
    META("seed", "%" PRIu64, tc->seed);
    META("n_anchors", "%d", tc->n_anchors);
    META("gamma", "%.17g", tc->gamma);
    META("lr", "%.17g", tc->lr);
    META("warmup_ratio", "%.17g", tc->warmup_ratio);
    META("total_steps", "%ld", tc->total_steps);
    META("min_lr_ratio", "%.17g", tc->min_lr_ratio);
    META("clip", "%.17g", tc->clip);
    META("beta1", "%.17g", tc->beta1);
    META("beta2", "%.17g", tc->beta2);
    META("eps", "%.17g", tc->eps);
    META("weight_decay", "%.17g", tc->weight_decay);
    META("accumulate", "%d", tc->accumulate > 1 ? tc->accumulate : 1);
    if (tc->world > 0) META("world", "%d", tc->world); /* absent: unknown */
#undef META
    if (n_unacked) {
        char unacked_text[UNACKED_TEXT_MAX];
        format_unacked(unacked, n_unacked, unacked_text);
        if ((rc = safetensors_writer_meta(w, UNACKED_KEY, unacked_text)))
            FAIL(rc, "checkpoint: out of memory");
    }
    const char *pre[3] = {"master.", "exp_avg.", "exp_avg_sq."};
    for (int k = 0; k < 3 && !rc; k++)
        for (int i = 0; i < m->n_tensors && !rc; i++) {
            const dflash_tensor *t = &m->tensors[i];
            int64_t shp[2] = {t->shape[0], t->shape[1]};
            char name[128];
            snprintf(name, sizeof name, "%s%s", pre[k], t->name);
            rc = safetensors_writer_add(w, name, SAFETENSORS_F32, t->ndim, shp,
                                        host + (size_t)k * n + t->offset);
        }
    if (rc || (rc = safetensors_writer_commit(w)))
        FAIL(rc, "checkpoint: cannot write %s: %s", p, writer_error(w, rc));

    /* publish: an existing checkpoint of the same step is replaced */
    if (fsync_path(tmp)) FAIL(DFLASH_EIO, "checkpoint: fsync %s: %s", tmp, strerror(errno));
    snprintf(old, sizeof old, "%s/.old-step-%09ld-%d", root, m->step, (int)getpid());
    bool had_old = rename(fin, old) == 0;
    if (rename(tmp, fin)) FAIL(DFLASH_EIO, "checkpoint: rename %s: %s", tmp, strerror(errno));
    made_tmp = false;
    if (had_old) remove_dir(old);
    if (fsync_path(root)) FAIL(DFLASH_EIO, "checkpoint: fsync %s: %s", root, strerror(errno));
    if (path) snprintf(path, pathlen, "%s", fin);

    keep_newest(root, keep, fin);
    LOG_INFO("checkpoint: wrote %s (%zu parameters, %s)", fin, n, f32 ? "fp32" : "bf16");
out:
    safetensors_writer_destroy(&w);
    if (made_tmp) remove_dir(tmp);
    free(text);
    cJSON_Delete(j);
    free(host);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * load */

/* Loads tensor prefix+name of every trainable tensor into dst (host layout of the masters),
 * each checked against its checksum first (one read of the file: the data is checked and
 * converted while in the cache). DFLASH_ECORRUPT names the file and the tensor of a damaged
 * one, DFLASH_ENONFINITE one holding a NaN or an infinity (finite.h); nothing reaches the
 * model before every tensor is loaded (the callers upload at the end). */
static int load_all(const dflash_model *m, const safetensors *st, const char *prefix, float *dst,
                    char *err, size_t errlen) {
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        int64_t shp[2] = {t->shape[0], t->shape[1]};
        char name[128];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        const safetensors_tensor *st_t = NULL;
        int rc = safetensors_expect(st, name, t->ndim, shp, &st_t, err, errlen);
        if (!rc) rc = safetensors_verify_tensor(st_t, err, errlen);
        if (!rc) rc = safetensors_load_f32(st, name, t->ndim, shp, dst + t->offset, err, errlen);
        if (rc) return rc;
        size_t bad = finite_first_bad(dst + t->offset, t->numel);
        if (bad < t->numel) {
            err_fmt(err, errlen, "%s: tensor %s holds a non-finite value (%g at element %zu): "
                    "weights of a run that diverged, or a damaged file", safetensors_path(st),
                    name, (double)dst[t->offset + bad], bad);
            return DFLASH_ENONFINITE;
        }
    }
    return 0;
}

/* err for a checkpoint directory without its training state: a save never publishes one (it
 * writes .tmp-step-N-PID and renames it whole; dflash_ckpt_recover removes what a dead writer
 * left), so the directory was copied in part, had files removed, or holds weights only. Returns
 * DFLASH_ENOTFOUND. */
static int state_missing(const char *dir, char *err, size_t errlen) {
    if (err)
        snprintf(err, errlen,
                 "%s has no %s: not a whole checkpoint (a save publishes one only with all its "
                 "files), so it was copied in part, had files removed, or holds weights only",
                 dir, STATE_FILE);
    return DFLASH_ENOTFOUND;
}

/* Opens DIR/NAME, one of the checkpoint's safetensors files (load_all checks its tensors'
 * checksums); a file written before checkpoints had checksums loads unverified (said in the
 * log). NULL with *rc the kind of failure (safetensors_open): DFLASH_ENOTFOUND or DFLASH_EIO
 * when it cannot be read, DFLASH_EFORMAT when its bytes are wrong. */
static safetensors *open_checked(const char *dir, const char *name, int *rc, char *err,
                                 size_t errlen) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    safetensors *st = safetensors_open(p, rc, err, errlen);
    if (!st) return NULL;
    if (safetensors_count(st) && !safetensors_at(st, 0)->has_crc32c)
        LOG_INFO("checkpoint: %s carries no checksums (written before they were added): its "
                 "data is loaded unverified", p);
    return st;
}

static int check_dir_config(const dflash_model *m, const char *dir, char *err, size_t errlen) {
    dflash_config c;
    int rc = dflash_ckpt_load_config(dir, &c, err, errlen);
    if (rc) return rc;
    return dflash_ckpt_check_config(&m->cfg, &c, err, errlen);
}

int dflash_ckpt_load_weights(dflash_model *m, const char *dir, char *err, size_t errlen) {
    int rc = check_dir_config(m, dir, err, errlen);
    if (rc) return rc;
    safetensors *st = open_checked(dir, "model.safetensors", &rc, err, errlen);
    if (!st) return rc;
    float *host = calloc(m->n_params, sizeof(float));
    if (!host) FAIL(DFLASH_ENOMEM, "checkpoint: out of memory");
    if ((rc = load_all(m, st, "", host, err, errlen))) goto out;
    m->ops->sync(m->ctx); /* a queued optimizer step (ops side stream) writes the masters */
    if ((rc = dflash_model_masters_upload(m, host)))
        FAIL(rc, "checkpoint: out of memory for the masters' upload");
    m->ops->zero(m->ctx, m->adam_m, m->n_params * sizeof(float));
    m->ops->zero(m->ctx, m->adam_v, m->n_params * sizeof(float));
    m->step = 0;
    LOG_INFO("drafter: warm start from the weights of %s", dir);
out:
    free(host);
    safetensors_close(&st);
    return rc;
}

static int meta_double(const safetensors *st, const char *key, double *out) {
    const char *v = safetensors_metadata(st, key);
    if (!v) return DFLASH_EFORMAT;
    char *end;
    *out = strtod(v, &end);
    return *end ? DFLASH_EFORMAT : 0;
}

/* The step and the training settings in the metadata of st (training_state.safetensors at p). */
static int read_train_meta(const safetensors *st, const char *p, dflash_train_cfg *tc, long *step,
                           char *err, size_t errlen) {
    int rc = 0;
    const char *fmt = safetensors_metadata(st, "format");
    if (!fmt || strcmp(fmt, STATE_FORMAT))
        FAIL(DFLASH_EVERSION, "%s: format %s, expected %s", p, fmt ? fmt : "(none)", STATE_FORMAT);
    double s, v[12];
    const char *keys[12] = {"seed",         "n_anchors",   "gamma",        "lr",
                            "warmup_ratio", "total_steps", "min_lr_ratio", "clip",
                            "beta1",        "beta2",       "eps",          "weight_decay"};
    if (meta_double(st, "step", &s)) FAIL(DFLASH_EFORMAT, "%s: metadata step missing", p);
    for (int k = 0; k < 12; k++)
        if (meta_double(st, keys[k], &v[k]))
            FAIL(DFLASH_EFORMAT, "%s: metadata %s missing", p, keys[k]);
    *step = (long)s;
    /* the seed is exact in text (a double would round a 64-bit value) */
    tc->seed = strtoull(safetensors_metadata(st, "seed"), NULL, 10);
    tc->n_anchors = (int)v[1];
    tc->gamma = v[2];
    tc->lr = v[3];
    tc->warmup_ratio = v[4];
    tc->total_steps = (long)v[5];
    tc->min_lr_ratio = v[6];
    tc->clip = v[7];
    tc->beta1 = v[8];
    tc->beta2 = v[9];
    tc->eps = v[10];
    tc->weight_decay = v[11];
    /* batches per step: a checkpoint written before accumulation existed trained one; a value
     * that is there must be one the drafter takes (--accumulate 1 .. 4096) */
    double acc = 1.0;
    if (safetensors_metadata(st, "accumulate") &&
        (meta_double(st, "accumulate", &acc) || !(acc >= 1 && acc <= 4096) || acc != floor(acc)))
        FAIL(DFLASH_EFORMAT, "%s: metadata accumulate '%s' is not a whole number in [1, 4096]",
             p, safetensors_metadata(st, "accumulate"));
    tc->accumulate = (int)acc;
    /* drafters that took the last step (a group's ranks): a checkpoint written before the
     * record has none (0: unknown); a value that is there must be a group's size */
    double world = 0.0;
    if (safetensors_metadata(st, "world") &&
        (meta_double(st, "world", &world) || !(world >= 1 && world <= DP_COMM_MAX_WORLD) ||
         world != floor(world)))
        FAIL(DFLASH_EFORMAT, "%s: metadata world '%s' is not a whole number in [1, %d]", p,
             safetensors_metadata(st, "world"), DP_COMM_MAX_WORLD);
    tc->world = (int)world;
out:
    return rc;
}

int dflash_ckpt_train_settings(const char *dir, dflash_train_cfg *tc, long *step, char *err,
                               size_t errlen) {
    char p[4200];
    int rc;
    snprintf(p, sizeof p, "%s/%s", dir, STATE_FILE);
    safetensors *st = safetensors_open(p, &rc, err, errlen);
    if (!st) return rc == DFLASH_ENOTFOUND ? state_missing(dir, err, errlen) : rc;
    rc = read_train_meta(st, p, tc, step, err, errlen);
    safetensors_close(&st);
    return rc;
}

int dflash_ckpt_unacked_batches(const char *dir, dflash_ckpt_unacked *out, int max, int *n,
                                char *err, size_t errlen) {
    char p[4200];
    int rc;
    dflash_train_cfg tc;
    long step = 0;
    *n = 0;
    snprintf(p, sizeof p, "%s/%s", dir, STATE_FILE);
    safetensors *st = safetensors_open(p, &rc, err, errlen);
    if (!st) return rc == DFLASH_ENOTFOUND ? state_missing(dir, err, errlen) : rc;
    if ((rc = read_train_meta(st, p, &tc, &step, err, errlen)) == 0) {
        const char *text = safetensors_metadata(st, UNACKED_KEY);
        if (text) rc = parse_unacked(text, step, out, max, n, p, err, errlen);
    }
    safetensors_close(&st);
    return rc;
}

/* Whether DIR's model.safetensors is fp32 (bf16 otherwise): config.json's "dtype", written with
 * it by the same save. */
static int weights_dtype_f32(const char *dir, bool *f32, char *err, size_t errlen) {
    char path[4096];
    cJSON *j = NULL;
    int rc = read_config_json(dir, path, sizeof path, &j, err, errlen);
    if (rc) return rc;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (!cJSON_IsString(d)) d = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
    *f32 = cJSON_IsString(d) && strcmp(d->valuestring, "float32") == 0;
    cJSON_Delete(j);
    return 0;
}

/* Every trainable tensor of st (model.safetensors) present with its shape and checksum: 0, or
 * the first failure's code with the file and the tensor named in err. */
static int verify_weights(const dflash_model *m, const safetensors *st, char *err,
                          size_t errlen) {
    for (int i = 0; i < m->n_tensors; i++) {
        const dflash_tensor *t = &m->tensors[i];
        int64_t shp[2] = {t->shape[0], t->shape[1]};
        const safetensors_tensor *st_t = NULL;
        int rc = safetensors_expect(st, t->name, t->ndim, shp, &st_t, err, errlen);
        if (!rc) rc = safetensors_verify_tensor(st_t, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

/* The exact resume's check of DIR/model.safetensors, the weights the checkpoint is served from,
 * which the resume itself does not read: every tensor's checksum (one read of the file). A file
 * missing or damaged (a bad header, a tensor missing, a checksum mismatch) is written again from
 * masters, the verified fp32 masters of the training state, as the save writes it (same bytes),
 * with a warning naming the file and the tensor; 0 then, or the write's failure naming the file;
 * without repair (DIR not under the caller's locked root) only the warning, and 0. A file that
 * cannot be read (DFLASH_EIO: permissions, an I/O error, not a regular file) is not damaged: that
 * error, and nothing is written. */
/* Whole weights without model.safetensors.index.json (a checkpoint from before the index, or a
 * repair that stopped between its two files): the index is written, so the servers that glob
 * *.safetensors read model.safetensors alone. Its failure is logged, not fatal: our loaders do
 * not need it. Always 0. */
static int add_missing_index(const dflash_model *m, const char *dir) {
    char p[4200], werr[1024] = "";
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    if (lstat(p, &sb) == 0) return 0;
    bool f32 = false;
    if (weights_dtype_f32(dir, &f32, werr, sizeof werr) == 0 &&
        write_index(m, f32, dir, werr, sizeof werr) == 0)
        LOG_INFO("checkpoint: %s written (it had none: SGLang and vLLM now read "
                 "model.safetensors alone)", p);
    else
        LOG_WARN("checkpoint: %s is missing and cannot be written: %s (serve a copy holding "
                 "config.json, model.safetensors and dflash.py)", p, werr);
    return 0;
}

static int check_weights_file(const dflash_model *m, const char *dir, const float *masters,
                              bool repair, char *err, size_t errlen) {
    char p[4200], why[1024] = "";
    int rc;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat sb;
    if (lstat(p, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode)) {
        if (err) /* safetensors_open would take a directory for a model folder */
            snprintf(err, errlen, "%s: cannot read: %s, not a regular file", p,
                     S_ISDIR(sb.st_mode) ? "a directory" : "a device, FIFO or socket");
        return DFLASH_EIO;
    }
    safetensors *st = safetensors_open(p, &rc, why, sizeof why);
    bool missing = !st && rc == DFLASH_ENOTFOUND;
    if (st) {
        rc = verify_weights(m, st, why, sizeof why);
        safetensors_close(&st);
        if (rc == 0) return repair ? add_missing_index(m, dir) : 0;
    } else if (!missing && rc != DFLASH_EFORMAT && rc != DFLASH_EUNSUPPORTED) {
        if (err) snprintf(err, errlen, "%s", why); /* cannot be read: not ours to replace */
        return rc;
    }
    if (!repair) {
        LOG_WARN("checkpoint: %s%s; it is not written again here (the checkpoint is outside "
                 "this run's --checkpoint-dir): the resume reads only %s, and this run's own "
                 "checkpoints will have whole weights; do not serve this one's",
                 missing ? p : why, missing ? " is missing" : "", STATE_FILE);
        return 0;
    }
    bool f32 = false;
    if ((rc = weights_dtype_f32(dir, &f32, err, errlen))) return rc;
    if (missing)
        LOG_WARN("checkpoint: %s is missing; writing it again from the training state's masters",
                 p);
    else
        LOG_WARN("checkpoint: %s: the file is damaged; writing it again from the training "
                 "state's masters", why); /* why names the file, and the tensor */
    char werr[1024] = "";
    if ((rc = write_weights(m, masters, f32, dir, werr, sizeof werr))) {
        if (err)
            snprintf(err, errlen,
                     "%s is %s and cannot be written again from the training state's masters "
                     "(%s, which is whole: a start that can write the file repairs it): %s",
                     p, missing ? "missing" : "damaged", STATE_FILE, werr);
        return rc;
    }
    if ((rc = write_index(m, f32, dir, werr, sizeof werr))) {
        if (err)
            snprintf(err, errlen, "%s was written again, but its index cannot be: %s", p, werr);
        return rc;
    }
    LOG_WARN("checkpoint: %s written again from the masters of %s/%s (%s), with its index: "
             "the checkpoint is whole again", p, dir, STATE_FILE, f32 ? "fp32" : "bf16");
    return 0;
}

int dflash_ckpt_resume(dflash_model *m, dflash_train_cfg *tc, const char *dir, bool repair,
                       char *err, size_t errlen) {
    int rc = check_dir_config(m, dir, err, errlen);
    if (rc) return rc;
    safetensors *st = open_checked(dir, STATE_FILE, &rc, err, errlen);
    if (!st) return rc == DFLASH_ENOTFOUND ? state_missing(dir, err, errlen) : rc;
    size_t n = m->n_params;
    dflash_train_cfg saved;
    long step = 0;
    float *host = calloc(3 * n, sizeof(float));
    if (!host) FAIL(DFLASH_ENOMEM, "checkpoint: out of memory");
    if ((rc = read_train_meta(st, safetensors_path(st), &saved, &step, err, errlen)) ||
        (rc = load_all(m, st, "master.", host, err, errlen)) ||
        (rc = load_all(m, st, "exp_avg.", host + n, err, errlen)) ||
        (rc = load_all(m, st, "exp_avg_sq.", host + 2 * n, err, errlen)) ||
        (rc = check_weights_file(m, dir, host, repair, err, errlen)))
        goto out;
    m->ops->sync(m->ctx); /* as in dflash_ckpt_load_weights */
    if ((rc = dflash_model_masters_upload(m, host)))
        FAIL(rc, "checkpoint: out of memory for the masters' upload");
    m->ops->upload_raw(m->ctx, m->adam_m, host + n, n * sizeof(float));
    m->ops->upload_raw(m->ctx, m->adam_v, host + 2 * n, n * sizeof(float));
    m->step = step;
    if (tc) *tc = saved;
    LOG_INFO("drafter: resumed from %s at step %ld", dir, m->step);
out:
    free(host);
    safetensors_close(&st);
    return rc;
}

int dflash_ckpt_latest(const char *root, char *path, size_t pathlen) {
    char **names;
    int n = list_steps(root, &names), rc = DFLASH_ENOTFOUND;
    for (int i = n - 1; i >= 0; i--) {
        if (holds_state(root, names[i])) {
            snprintf(path, pathlen, "%s/%s", root, names[i]);
            rc = 0;
            break;
        }
        LOG_WARN("checkpoint: %s/%s holds no %s (copied in part, or weights only): skipped "
                 "for an older one (and not counted by --keep-last)", root, names[i], STATE_FILE);
    }
    free_names(names, n);
    return rc;
}

/* A save's leftover name: ".tmp-step-N-PID" (tmp) or ".old-step-N-PID" (old); its step name
 * "step-N" into step. */
static bool leftover(const char *name, const char *prefix, char *step, size_t steplen) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl)) return false;
    const char *dash = strrchr(name, '-');
    if (!dash || dash <= name + pl) return false;
    char *end;
    long pid = strtol(dash + 1, &end, 10);
    if (*end || pid <= 0) return false;
    const char *s = name + pl - 5; /* "step-N" */
    snprintf(step, steplen, "%.*s", (int)(dash - s), s);
    return is_step_name(step);
}

/* Removes the temporary files of a file writer that died in step directory dir (NAME.tmp.PID,
 * the safetensors writer's: a resume writing model.safetensors again). Returns how many. */
static int remove_writer_leftovers(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    char p[4600];
    while ((e = readdir(d))) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t || t == e->d_name) continue;
        char *end;
        long pid = strtol(t + 5, &end, 10);
        if (*end || pid <= 0 || !isdigit((unsigned char)t[5])) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) == 0) {
            LOG_WARN("checkpoint: removed %s, a file its writer did not finish", p);
            n++;
        }
    }
    closedir(d);
    return n;
}

int dflash_ckpt_recover(const char *root) {
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    char step[256], p[4200], q[4200];
    while ((e = readdir(d))) {
        if (is_step_name(e->d_name)) {
            snprintf(p, sizeof p, "%s/%s", root, e->d_name);
            int k = remove_writer_leftovers(p);
            if (k) fsync_path(p);
            n += k;
        } else if (leftover(e->d_name, ".tmp-step-", step, sizeof step)) {
            snprintf(p, sizeof p, "%s/%s", root, e->d_name);
            remove_dir(p);
            LOG_WARN("checkpoint: removed %s, a save its writer did not finish", p);
            n++;
        } else if (leftover(e->d_name, ".old-step-", step, sizeof step)) {
            snprintf(p, sizeof p, "%s/%s", root, e->d_name);
            snprintf(q, sizeof q, "%s/%s", root, step);
            struct stat sb;
            if (stat(q, &sb) < 0 && errno == ENOENT && rename(p, q) == 0) {
                LOG_WARN("checkpoint: %s restored from %s (its writer stopped while replacing "
                         "it)",
                         q, p);
            } else {
                remove_dir(p);
                LOG_WARN("checkpoint: removed %s, a replaced checkpoint", p);
            }
            n++;
        }
    }
    closedir(d);
    if (n) fsync_path(root);
    return n;
}

int dflash_ckpt_set_aside_after(const char *root, long step, char *err, size_t errlen) {
    char **names;
    int cnt = list_steps(root, &names), moved = 0, rc = 0;
    for (int i = 0; i < cnt && rc == 0; i++) {
        if (strtol(names[i] + 5, NULL, 10) <= step) continue;
        char from[4200], to[4300];
        snprintf(from, sizeof from, "%s/%s", root, names[i]);
        snprintf(to, sizeof to, "%s/superseded-%s", root, names[i]);
        struct stat sb;
        for (int k = 2; stat(to, &sb) == 0; k++)
            snprintf(to, sizeof to, "%s/superseded-%s.%d", root, names[i], k);
        if (rename(from, to) != 0) {
            snprintf(err, errlen, "checkpoint: cannot rename %s to %s: %s", from, to,
                     strerror(errno));
            rc = DFLASH_EIO;
            break;
        }
        LOG_WARN("checkpoint: %s is ahead of the model's step %ld, which came from another "
                 "rank: moved to %s (delete it when you do not need it)", from, step, to);
        moved++;
    }
    free_names(names, cnt);
    if (rc == 0 && moved && fsync_path(root) != 0) {
        snprintf(err, errlen, "checkpoint: fsync %s: %s", root, strerror(errno));
        rc = DFLASH_EIO;
    }
    return rc ? rc : moved;
}
