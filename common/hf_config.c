/* hf_config: config.json reader/writer for the Qwen3, Qwen2 and Llama families, and the table of
 * target tensor names. See hf_config.h for the rules; this file keeps them in three places:
 * hf_config_from_json (reading, defaults), hf_config_validate (invariants) and the weight table
 * below (names, shapes, presence per family). Pure functions; thread-safe.
 */
#include "hf_config.h"

#include "err.h"
#include "fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const family_names[] = {"qwen3", "qwen2", "llama"};
static const char *const family_archs[] = {"Qwen3ForCausalLM", "Qwen2ForCausalLM",
                                           "LlamaForCausalLM"};

const char *hf_config_family_name(model_family f) {
    return (unsigned)f < 3 ? family_names[f] : "unknown";
}

int hf_config_family_parse(const char *model_type, model_family *out) {
    for (int i = 0; i < 3; i++)
        if (model_type && strcmp(model_type, family_names[i]) == 0) {
            *out = (model_family)i;
            return 0;
        }
    return DFLASH_EUNSUPPORTED;
}

void hf_config_defaults(model_config *c, model_family family) {
    memset(c, 0, sizeof *c);
    c->family = family;
    c->rms_norm_eps = 1e-6; /* transformers' default for all three */
    c->rope_theta = family == MODEL_LLAMA ? 500000.0 : 1000000.0;
    c->max_position_embeddings = family == MODEL_LLAMA ? 2048 : 32768;
    c->qk_norm = family == MODEL_QWEN3;
    c->qkv_bias = family == MODEL_QWEN2;
    c->bos_token_id = -1;
    c->eos_token_id = -1;
}

/* ---- reading ---- */

typedef struct rd {
    const cJSON *j;
    const char *where;
    char *err;
    size_t errlen;
    int rc;
} rd;

/* Integer field: required when def < 0 is not allowed (required = true). */
static int get_int(rd *r, const char *key, bool required, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->j, key);
    if (!v || cJSON_IsNull(v)) {
        if (required && !r->rc) {
            err_fmt(r->err, r->errlen, "%s: missing field %s", r->where, key);
            r->rc = DFLASH_ECONFIG;
        }
        return def;
    }
    if (cJSON_IsArray(v)) { /* eos_token_id may be a list; an empty one, as transformers reads
                             * it, means none */
        if (cJSON_GetArraySize(v) == 0 && !required) return def;
        v = cJSON_GetArrayItem(v, 0);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > INT_MAX) {
        if (!r->rc) {
            err_fmt(r->err, r->errlen, "%s: field %s is not an integer", r->where, key);
            r->rc = DFLASH_ECONFIG;
        }
        return def;
    }
    return (int)v->valuedouble;
}

static double get_num(rd *r, const cJSON *obj, const char *key, double def, bool *found) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (found) *found = false;
    if (!v || cJSON_IsNull(v)) return def;
    if (!cJSON_IsNumber(v)) {
        if (!r->rc) {
            err_fmt(r->err, r->errlen, "%s: field %s is not a number", r->where, key);
            r->rc = DFLASH_ECONFIG;
        }
        return def;
    }
    if (found) *found = true;
    return v->valuedouble;
}

static bool get_bool(rd *r, const char *key, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->j, key);
    if (!v || cJSON_IsNull(v)) return def;
    if (!cJSON_IsBool(v)) {
        if (!r->rc) {
            err_fmt(r->err, r->errlen, "%s: field %s is not true/false", r->where, key);
            r->rc = DFLASH_ECONFIG;
        }
        return def;
    }
    return cJSON_IsTrue(v);
}

/* eos_token_id as a list (Llama-3 Instruct ends a turn with any of three): every id into
 * eos_ids, the first also as eos_token_id (get_int took it); one id: a list of one; [] or
 * null: none (dflash-gen then stops only at its length limit). */
static void read_eos_list(rd *r, model_config *c) {
    c->n_eos_ids = 0;
    if (c->eos_token_id >= 0) c->eos_ids[c->n_eos_ids++] = c->eos_token_id;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->j, "eos_token_id");
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    for (int i = 1; i < n && !r->rc; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble > INT_MAX) {
            err_fmt(r->err, r->errlen, "%s: eos_token_id[%d] is not a token id", r->where, i);
            r->rc = DFLASH_ECONFIG;
        } else if (c->n_eos_ids < MODEL_MAX_EOS_IDS) {
            c->eos_ids[c->n_eos_ids++] = (int32_t)e->valuedouble;
        }
    }
}

/* The rope type an object names ("rope_type", or the older "type"); "default" when it names none
 * or is not an object. */
static const char *rope_type_of(const cJSON *o) {
    if (!cJSON_IsObject(o)) return "default";
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(type) ? type->valuestring : "default";
}

/* partial_rotary_factor (top level, or in rope_parameters as transformers 5 writes it): HF rotates
 * only that share of each head; we rotate all of it, so anything but 1 is refused. */
static void refuse_partial_rotary(rd *r, const cJSON *rp) {
    const cJSON *in[2] = {r->j, rp};
    for (int i = 0; i < 2 && !r->rc; i++) {
        if (!cJSON_IsObject(in[i])) continue;
        bool found;
        double f = get_num(r, in[i], "partial_rotary_factor", 1.0, &found);
        if (found && f != 1.0 && !r->rc) {
            err_fmt(r->err, r->errlen,
                    "%s: partial_rotary_factor %g is not supported (RoPE over the whole head only)",
                    r->where, f);
            r->rc = DFLASH_EUNSUPPORTED;
        }
    }
}

/* rope scaling from rope_scaling or rope_parameters (transformers 5's name); only "default"/null
 * and "llama3". A file with both naming different types is refused rather than one silently
 * preferred (which one transformers reads depends on its version). */
static void read_rope(rd *r, model_config *c) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r->j, "rope_parameters");
    bool found;
    double theta = get_num(r, r->j, "rope_theta", 10000.0, &found);
    if (!found && cJSON_IsObject(rp)) theta = get_num(r, rp, "rope_theta", 10000.0, &found);
    c->rope_theta = theta;
    refuse_partial_rotary(r, rp);

    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r->j, "rope_scaling");
    if (cJSON_IsObject(rs) && cJSON_IsObject(rp) &&
        strcmp(rope_type_of(rs), rope_type_of(rp)) != 0 && !r->rc) {
        err_fmt(r->err, r->errlen,
                "%s: rope_scaling (type \"%s\") and rope_parameters (type \"%s\") disagree: keep "
                "one of them",
                r->where, rope_type_of(rs), rope_type_of(rp));
        r->rc = DFLASH_ECONFIG;
    }
    if (!cJSON_IsObject(rs)) rs = rp;
    memset(&c->rope_scaling, 0, sizeof c->rope_scaling);
    if (!cJSON_IsObject(rs)) return;
    const char *type = rope_type_of(rs);
    if (strcmp(type, "default") == 0) return;
    if (strcmp(type, "llama3") != 0) {
        if (!r->rc) {
            err_fmt(r->err, r->errlen, "%s: rope_scaling type \"%s\" is not supported (only llama3)",
                 r->where, type);
            r->rc = DFLASH_EUNSUPPORTED;
        }
        return;
    }
    rope_llama3_scaling *s = &c->rope_scaling;
    s->enabled = true;
    bool f1, f2, f3, f4;
    s->factor = get_num(r, rs, "factor", 0, &f1);
    s->low_freq_factor = get_num(r, rs, "low_freq_factor", 0, &f2);
    s->high_freq_factor = get_num(r, rs, "high_freq_factor", 0, &f3);
    double omax = get_num(r, rs, "original_max_position_embeddings", 0, &f4);
    s->original_max_position_embeddings = omax > 0 && omax <= INT_MAX ? (int)omax : 0;
    if (!(f1 && f2 && f3 && f4) && !r->rc) {
        err_fmt(r->err, r->errlen,
             "%s: llama3 rope_scaling needs factor, low_freq_factor, high_freq_factor and "
             "original_max_position_embeddings",
             r->where);
        r->rc = DFLASH_ECONFIG;
    }
}

int hf_config_from_json(const cJSON *json, const char *where, model_config *out, char *err,
                        size_t errlen) {
    rd r = {json, where ? where : "config.json", err, errlen, 0};
    if (!cJSON_IsObject(json)) {
        err_fmt(err, errlen, "%s: not a JSON object", r.where);
        return DFLASH_EFORMAT;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(json, "model_type");
    model_family fam;
    if (!cJSON_IsString(mt)) {
        err_fmt(err, errlen, "%s: missing model_type", r.where);
        return DFLASH_ECONFIG;
    }
    if (hf_config_family_parse(mt->valuestring, &fam)) {
        err_fmt(err, errlen, "%s: model_type \"%s\" is not supported (qwen3, qwen2, llama)", r.where,
             mt->valuestring);
        return DFLASH_EUNSUPPORTED;
    }
    model_config c;
    hf_config_defaults(&c, fam);
    c.vocab_size = get_int(&r, "vocab_size", true, 0);
    c.hidden_size = get_int(&r, "hidden_size", true, 0);
    c.intermediate_size = get_int(&r, "intermediate_size", true, 0);
    c.num_layers = get_int(&r, "num_hidden_layers", true, 0);
    c.num_heads = get_int(&r, "num_attention_heads", true, 0);
    c.num_kv_heads = get_int(&r, "num_key_value_heads", false, c.num_heads);
    /* Qwen3Config defaults head_dim to 128; the others derive it */
    int dflt_hd = fam == MODEL_QWEN3 ? 128 : c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
    c.head_dim = get_int(&r, "head_dim", false, dflt_hd);
    c.max_position_embeddings =
        get_int(&r, "max_position_embeddings", false, c.max_position_embeddings);
    c.rms_norm_eps = get_num(&r, json, "rms_norm_eps", c.rms_norm_eps, NULL);
    c.tie_word_embeddings = get_bool(&r, "tie_word_embeddings", false);
    c.bos_token_id = get_int(&r, "bos_token_id", false, -1);
    c.eos_token_id = get_int(&r, "eos_token_id", false, -1);
    read_eos_list(&r, &c);
    read_rope(&r, &c);
    if (r.rc) return r.rc;

    const cJSON *act = cJSON_GetObjectItemCaseSensitive(json, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        err_fmt(err, errlen, "%s: hidden_act \"%s\" is not supported (silu)", r.where,
             act->valuestring);
        return DFLASH_EUNSUPPORTED;
    }
    if (fam != MODEL_QWEN2 && get_bool(&r, "attention_bias", false)) {
        err_fmt(err, errlen, "%s: attention_bias true is not supported for %s", r.where,
             mt->valuestring);
        return DFLASH_EUNSUPPORTED;
    }
    if (get_bool(&r, "mlp_bias", false)) {
        err_fmt(err, errlen, "%s: mlp_bias true is not supported", r.where);
        return DFLASH_EUNSUPPORTED;
    }
    const cJSON *quant = cJSON_GetObjectItemCaseSensitive(json, "quantization_config");
    if (quant && !cJSON_IsNull(quant)) {
        const cJSON *method = cJSON_GetObjectItemCaseSensitive(quant, "quant_method");
        err_fmt(err, errlen,
                "%s: a quantized checkpoint (quantization_config, quant_method \"%s\") is not "
                "supported: use the model's original bf16, fp16 or fp32 weights",
                r.where, cJSON_IsString(method) ? method->valuestring : "?");
        return DFLASH_EUNSUPPORTED;
    }
    if (get_bool(&r, "use_sliding_window", false)) {
        err_fmt(err, errlen, "%s: use_sliding_window true is not supported", r.where);
        return DFLASH_EUNSUPPORTED;
    }
    if (fam != MODEL_LLAMA && c.rope_scaling.enabled) {
        err_fmt(err, errlen, "%s: llama3 rope_scaling on a %s model is not supported", r.where,
             mt->valuestring);
        return DFLASH_EUNSUPPORTED;
    }
    if (r.rc) return r.rc;
    char verr[256];
    int rc = hf_config_validate(&c, verr, sizeof verr);
    if (rc) {
        err_fmt(err, errlen, "%s: %s", r.where, verr);
        return rc;
    }
    *out = c;
    return 0;
}

int hf_config_load(const char *path, model_config *out, char *err, size_t errlen) {
    char file[PATH_MAX];
    struct stat sb;
    if (!path) return DFLASH_EINVAL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    int rc = 0;
    char *buf = fs_read_text(file, 16u << 20, err, errlen, &rc);
    if (!buf) return rc;
    size_t len = strlen(buf);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, false);
    if (!j) {
        err_fmt(err, errlen, "%s: not valid JSON (near byte %zu)", file,
             end ? (size_t)(end - buf) : (size_t)0);
        free(buf);
        return DFLASH_EFORMAT;
    }
    free(buf);
    rc = hf_config_from_json(j, file, out, err, errlen);
    cJSON_Delete(j);
    return rc;
}

int hf_config_validate(const model_config *c, char *err, size_t errlen) {
#define NEED(cond, ...)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            err_fmt(err, errlen, __VA_ARGS__);                                                        \
            return DFLASH_ECONFIG;                                                                 \
        }                                                                                          \
    } while (0)
    NEED((unsigned)c->family < 3, "unknown family %d", (int)c->family);
    NEED(c->vocab_size > 0, "vocab_size %d must be positive", c->vocab_size);
    NEED(c->hidden_size > 0, "hidden_size %d must be positive", c->hidden_size);
    NEED(c->intermediate_size > 0, "intermediate_size %d must be positive", c->intermediate_size);
    NEED(c->num_layers > 0, "num_hidden_layers %d must be positive", c->num_layers);
    NEED(c->num_heads > 0, "num_attention_heads %d must be positive", c->num_heads);
    NEED(c->num_kv_heads > 0, "num_key_value_heads %d must be positive", c->num_kv_heads);
    NEED(c->num_heads % c->num_kv_heads == 0,
         "num_attention_heads %d is not a multiple of num_key_value_heads %d", c->num_heads,
         c->num_kv_heads);
    NEED(c->head_dim > 0 && c->head_dim % 2 == 0, "head_dim %d must be positive and even",
         c->head_dim);
    NEED(c->family != MODEL_QWEN2 || c->head_dim * c->num_heads == c->hidden_size,
         "qwen2 needs head_dim %d * num_attention_heads %d == hidden_size %d", c->head_dim,
         c->num_heads, c->hidden_size);
    NEED(c->max_position_embeddings > 0, "max_position_embeddings %d must be positive",
         c->max_position_embeddings);
    NEED(c->rms_norm_eps > 0 && c->rms_norm_eps < 1, "rms_norm_eps %g must be in (0, 1)",
         c->rms_norm_eps);
    NEED(c->rope_theta > 0, "rope_theta %g must be positive", c->rope_theta);
    NEED(c->bos_token_id < c->vocab_size && c->eos_token_id < c->vocab_size,
         "bos/eos token id outside the vocabulary of %d", c->vocab_size);
    for (int i = 0; i < c->n_eos_ids; i++)
        NEED(c->eos_ids[i] >= 0 && c->eos_ids[i] < c->vocab_size,
             "eos_token_id[%d] %d outside the vocabulary of %d", i, c->eos_ids[i], c->vocab_size);
    if (c->rope_scaling.enabled) {
        const rope_llama3_scaling *s = &c->rope_scaling;
        NEED(s->factor >= 1, "rope_scaling.factor %g must be >= 1", s->factor);
        NEED(s->low_freq_factor > 0 && s->high_freq_factor > s->low_freq_factor,
             "rope_scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g)",
             s->low_freq_factor, s->high_freq_factor);
        NEED(s->original_max_position_embeddings > 0,
             "rope_scaling.original_max_position_embeddings %d must be positive",
             s->original_max_position_embeddings);
    }
    return 0;
#undef NEED
}

int hf_config_dflash_layers(int L, int n, int *ids) {
    if (n < 1 || L < 1 || !ids) return DFLASH_EINVAL;
    if (n == 1) {
        ids[0] = L / 2;
        return 0;
    }
    if (L < 4) return DFLASH_EINVAL;
    int start = 1, end = L - 3, span = end - start;
    for (int i = 0; i < n; i++) /* Python round(): half to even, which rint does by default */
        ids[i] = (int)rint(start + (double)i * span / (n - 1));
    return 0;
}

/* ---- writing ---- */

void hf_config_json_token_id(cJSON *json, const char *key, int id) {
    if (id >= 0)
        cJSON_AddNumberToObject(json, key, id);
    else
        cJSON_AddNullToObject(json, key);
}

cJSON *hf_config_to_json(const model_config *c, const char *dtype) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    if (!dtype) dtype = "bfloat16";
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(family_archs[c->family]));
    cJSON_AddStringToObject(j, "model_type", family_names[c->family]);
    if (c->family != MODEL_QWEN2) cJSON_AddBoolToObject(j, "attention_bias", false);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    hf_config_json_token_id(j, "bos_token_id", c->bos_token_id);
    if (c->n_eos_ids > 1) {
        cJSON *eos = cJSON_AddArrayToObject(j, "eos_token_id");
        for (int i = 0; eos && i < c->n_eos_ids; i++)
            cJSON_AddItemToArray(eos, cJSON_CreateNumber(c->eos_ids[i]));
    } else {
        hf_config_json_token_id(j, "eos_token_id", c->eos_token_id);
    }
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    if (c->family == MODEL_LLAMA) {
        cJSON_AddBoolToObject(j, "mlp_bias", false);
        cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    } else {
        cJSON_AddNumberToObject(j, "max_window_layers", c->num_layers);
        cJSON_AddNullToObject(j, "sliding_window");
        cJSON_AddBoolToObject(j, "use_sliding_window", false);
    }
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_heads);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_layers);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_kv_heads);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_norm_eps);
    if (c->rope_scaling.enabled) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddNumberToObject(rs, "factor", c->rope_scaling.factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_scaling.high_freq_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_scaling.low_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                c->rope_scaling.original_max_position_embeddings);
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(j, "torch_dtype", dtype);
    cJSON_AddStringToObject(j, "dtype", dtype);
    cJSON_AddBoolToObject(j, "use_cache", true);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    return j;
}

/* The largest token id tokenizer.json knows (model.vocab: {piece: id} for BPE/WordPiece, an
 * array of [piece, score] for Unigram; added_tokens[].id), and the id of a "<|MASK|>" added
 * token (-1: none). -1 when the file holds no id. */
static long tokenizer_max_id(const cJSON *root, long *mask_id) {
    long max = -1;
    *mask_id = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *e;
    if (cJSON_IsArray(vocab)) {
        max = (long)cJSON_GetArraySize(vocab) - 1;
    } else {
        cJSON_ArrayForEach(e, vocab) {
            if (cJSON_IsNumber(e) && e->valuedouble > max) max = (long)e->valuedouble;
        }
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0) continue;
        if (id->valuedouble > max) max = (long)id->valuedouble;
        if (cJSON_IsString(content) && strcmp(content->valuestring, "<|MASK|>") == 0)
            *mask_id = (long)id->valuedouble;
    }
    return max;
}

int hf_config_default_mask_row(const char *model_dir, int vocab_size, char *why, size_t whylen) {
    char file[PATH_MAX], err[PATH_MAX + 128] = "";
    snprintf(file, sizeof file, "%s/tokenizer.json", model_dir);
    int rc = 0;
    long max = -1, mask = -1;
    char *text = fs_read_text(file, 256u << 20, err, sizeof err, &rc);
    if (!text) {
        if (rc == DFLASH_ENOTFOUND)
            snprintf(why, whylen, "vocab_size - 1 (no tokenizer.json in %s)", model_dir);
        else
            snprintf(why, whylen, "vocab_size - 1 (%s)", err);
        return vocab_size - 1;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    bool parsed = root != NULL;
    if (parsed) max = tokenizer_max_id(root, &mask);
    cJSON_Delete(root);
    if (mask >= 0 && mask < vocab_size) {
        snprintf(why, whylen, "the tokenizer's <|MASK|> token (%s)", file);
        return (int)mask;
    }
    if (max < 0) {
        snprintf(why, whylen, "vocab_size - 1 (%s: %s)", file,
                 parsed ? "no token ids in it" : "not valid JSON");
        return vocab_size - 1;
    }
    if (max + 1 >= vocab_size) {
        snprintf(why, whylen, "vocab_size - 1 (the tokenizer's %ld tokens fill every row: %s)",
                 max + 1, file);
        return vocab_size - 1;
    }
    snprintf(why, whylen, "the first row past the tokenizer's %ld tokens (%s)", max + 1, file);
    return (int)(max + 1);
}

int hf_config_write_json(const char *path, const cJSON *json) {
    char *text = cJSON_Print(json);
    if (!text) return DFLASH_ENOMEM;
    size_t len = strlen(text);
    text[len] = '\n'; /* the terminator's place: the written length is exact */
    int rc = fs_write_atomic(path, text, len + 1);
    int e = errno;
    free(text);
    errno = e;
    return rc;
}

int hf_config_write(const char *dir, const model_config *c, const char *dtype) {
    char err[256];
    if (!dir || !c || hf_config_validate(c, err, sizeof err)) return DFLASH_EINVAL;
    cJSON *j = hf_config_to_json(c, dtype);
    if (!j) return DFLASH_ENOMEM;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = hf_config_write_json(path, j);
    cJSON_Delete(j);
    return rc;
}

/* ---- weight names ---- */

static const struct {
    const char *suffix; /* after "model.layers.{i}." or the full name for globals */
    bool global, norm, bias;
} wtable[HF_W_COUNT] = {
    [HF_W_EMBED] = {"model.embed_tokens.weight", true, false, false},
    [HF_W_INPUT_NORM] = {"input_layernorm.weight", false, true, false},
    [HF_W_Q] = {"self_attn.q_proj.weight", false, false, false},
    [HF_W_Q_BIAS] = {"self_attn.q_proj.bias", false, false, true},
    [HF_W_K] = {"self_attn.k_proj.weight", false, false, false},
    [HF_W_K_BIAS] = {"self_attn.k_proj.bias", false, false, true},
    [HF_W_V] = {"self_attn.v_proj.weight", false, false, false},
    [HF_W_V_BIAS] = {"self_attn.v_proj.bias", false, false, true},
    [HF_W_O] = {"self_attn.o_proj.weight", false, false, false},
    [HF_W_Q_NORM] = {"self_attn.q_norm.weight", false, true, false},
    [HF_W_K_NORM] = {"self_attn.k_norm.weight", false, true, false},
    [HF_W_POST_NORM] = {"post_attention_layernorm.weight", false, true, false},
    [HF_W_GATE] = {"mlp.gate_proj.weight", false, false, false},
    [HF_W_UP] = {"mlp.up_proj.weight", false, false, false},
    [HF_W_DOWN] = {"mlp.down_proj.weight", false, false, false},
    [HF_W_FINAL_NORM] = {"model.norm.weight", true, true, false},
    [HF_W_LM_HEAD] = {"lm_head.weight", true, false, false},
};

bool hf_weight_present(const model_config *c, hf_weight k) {
    switch (k) {
    case HF_W_Q_BIAS:
    case HF_W_K_BIAS:
    case HF_W_V_BIAS:
        return c->qkv_bias;
    case HF_W_Q_NORM:
    case HF_W_K_NORM:
        return c->qk_norm;
    case HF_W_LM_HEAD:
        return !c->tie_word_embeddings;
    default:
        return (unsigned)k < HF_W_COUNT;
    }
}

bool hf_weight_describe(const model_config *c, hf_weight k, int layer, hf_weight_desc *out) {
    if (!hf_weight_present(c, k)) return false;
    if (!wtable[k].global && (layer < 0 || layer >= c->num_layers)) return false;
    memset(out, 0, sizeof *out);
    out->kind = k;
    out->layer = wtable[k].global ? -1 : layer;
    out->is_norm = wtable[k].norm;
    out->is_bias = wtable[k].bias;
    if (wtable[k].global)
        snprintf(out->name, sizeof out->name, "%s", wtable[k].suffix);
    else
        snprintf(out->name, sizeof out->name, "model.layers.%d.%s", layer, wtable[k].suffix);
    int64_t D = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    int64_t Q = (int64_t)c->num_heads * c->head_dim, KV = (int64_t)c->num_kv_heads * c->head_dim;
    int64_t r = 0, cl = 0; /* rows, cols (cols 0: 1-D) */
    switch (k) {
    case HF_W_EMBED:
    case HF_W_LM_HEAD:
        r = V, cl = D;
        break;
    case HF_W_INPUT_NORM:
    case HF_W_POST_NORM:
    case HF_W_FINAL_NORM:
        r = D;
        break;
    case HF_W_Q:
        r = Q, cl = D;
        break;
    case HF_W_Q_BIAS:
        r = Q;
        break;
    case HF_W_K:
    case HF_W_V:
        r = KV, cl = D;
        break;
    case HF_W_K_BIAS:
    case HF_W_V_BIAS:
        r = KV;
        break;
    case HF_W_O:
        r = D, cl = Q;
        break;
    case HF_W_Q_NORM:
    case HF_W_K_NORM:
        r = c->head_dim;
        break;
    case HF_W_GATE:
    case HF_W_UP:
        r = F, cl = D;
        break;
    case HF_W_DOWN:
        r = D, cl = F;
        break;
    default:
        return false;
    }
    out->ndim = cl ? 2 : 1;
    out->shape[0] = r;
    out->shape[1] = cl;
    return true;
}

static size_t per_layer(const model_config *c) {
    size_t n = 0;
    for (int k = HF_W_INPUT_NORM; k <= HF_W_DOWN; k++)
        n += hf_weight_present(c, (hf_weight)k);
    return n;
}

size_t hf_weight_count(const model_config *c) {
    return 2 + (size_t)c->num_layers * per_layer(c) + !c->tie_word_embeddings;
}

bool hf_weight_nth(const model_config *c, size_t i, hf_weight_desc *out) {
    size_t pl = per_layer(c), body = (size_t)c->num_layers * pl;
    if (i == 0) return hf_weight_describe(c, HF_W_EMBED, -1, out);
    i--;
    if (i < body) {
        int layer = (int)(i / pl);
        size_t j = i % pl;
        for (int k = HF_W_INPUT_NORM; k <= HF_W_DOWN; k++) {
            if (!hf_weight_present(c, (hf_weight)k)) continue;
            if (j-- == 0) return hf_weight_describe(c, (hf_weight)k, layer, out);
        }
        return false;
    }
    i -= body;
    if (i == 0) return hf_weight_describe(c, HF_W_FINAL_NORM, -1, out);
    if (i == 1) return hf_weight_describe(c, HF_W_LM_HEAD, -1, out);
    return false;
}
