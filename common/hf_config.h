/* hf_config: Hugging Face config.json <-> model_config, and the HF tensor names of a target.
 *
 * Reads the Qwen3 ("qwen3"), Qwen2 ("qwen2") and Llama ("llama") families with cJSON:
 *   Qwen3: qk_norm on, head_dim from the file (default 128, as Qwen3Config), no biases.
 *   Qwen2: qkv_bias on, head_dim from the file or hidden / heads (must equal it).
 *   Llama: head_dim from the file or hidden / heads; rope_scaling {rope_type "llama3", ...};
 *          attention_bias true is refused (not supported by our forward).
 * rope_theta: top level, else rope_parameters.rope_theta (newer transformers), else 10000.
 * Refused (EUNSUPPORTED, naming the field): other rope types, partial_rotary_factor != 1,
 * use_sliding_window true, a quantization_config (AWQ, GPTQ, FP8, ...); rope_scaling and
 * rope_parameters naming different types (ECONFIG).
 * num_key_value_heads defaults to num_attention_heads; tie_word_embeddings to false;
 * rms_norm_eps to 1e-6; max_position_embeddings to 32768 (qwen) or 2048 (llama).
 * Validation: positive sizes, heads % kv_heads == 0, head_dim even, eps > 0, theta > 0.
 *
 * Writes config.json files transformers loads (architectures, model_type, every field, dtype and
 * torch_dtype), atomically (temp file + fsync + rename).
 *
 * Weight naming (hf_weight_*): the tensor names and shapes a checkpoint of the family holds,
 * in file order: model.embed_tokens.weight, per layer model.layers.{i}.(input_layernorm,
 * self_attn.{q,k,v,o}_proj (+ q/k/v bias for Qwen2), self_attn.{q,k}_norm (Qwen3),
 * post_attention_layernorm, mlp.{gate,up,down}_proj), model.norm.weight, lm_head.weight unless
 * tied. Linear weights are [out, in].
 *
 * The MASK row DFlash's drafter uses by default comes from the target's tokenizer.json
 * (hf_config_default_mask_row).
 *
 * Callers: the target loader, dflash-mkmodel, the drafter checkpoint writer, tests. Pure
 * functions: thread-safe.
 */
#ifndef DFLASH_HF_CONFIG_H
#define DFLASH_HF_CONFIG_H

#include "model_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* Loads path (a model directory holding config.json, or a config.json file) into *out.
 * Returns 0, DFLASH_ENOTFOUND / DFLASH_EIO (file), DFLASH_EFORMAT (bad JSON), DFLASH_EUNSUPPORTED
 * (unknown model_type or feature) or DFLASH_ECONFIG (invalid values), with a message naming
 * the file and the field in err. */
int hf_config_load(const char *model_dir_or_config_json, model_config *out, char *err,
                   size_t errlen);

/* Parses an already-loaded config.json object; where names the source in messages. */
int hf_config_from_json(const struct cJSON *json, const char *where, model_config *out, char *err,
                        size_t errlen);

/* Checks the invariants listed at the top. 0 or DFLASH_ECONFIG with the reason in err. */
int hf_config_validate(const model_config *c, char *err, size_t errlen);

/* Fills *c with family defaults (rms_norm_eps 1e-6, theta 1e6 for qwen, 500000 for llama,
 * max_position_embeddings as above,
 * flags per family, bos/eos -1); sizes are left 0 for the caller. */
void hf_config_defaults(model_config *c, model_family family);

/* A new cJSON object with everything transformers needs for the family; dtype is the
 * transformers spelling ("bfloat16", "float16", "float32"; NULL means "bfloat16"). The caller
 * owns it (cJSON_Delete) and may add keys (e.g. the drafter's dflash_config). NULL on OOM. */
struct cJSON *hf_config_to_json(const model_config *c, const char *dtype);
/* Adds key: id to json, or key: null where id < 0 (a token id that config.json leaves unset). */
void hf_config_json_token_id(struct cJSON *json, const char *key, int id);

/* Writes dir/config.json from hf_config_to_json(c, dtype). 0 or negative. */
int hf_config_write(const char *dir, const model_config *c, const char *dtype);

/* Pretty-prints json into path atomically (fs_write_atomic: temp name, fsync, rename, directory
 * fsync). 0, DFLASH_ENOMEM, or DFLASH_EIO with errno saying why (a full disk: ENOSPC). */
int hf_config_write_json(const char *path, const struct cJSON *json);

/* "qwen3", "qwen2", "llama"; and the reverse (0 or DFLASH_EUNSUPPORTED). */
const char *hf_config_family_name(model_family f);
int hf_config_family_parse(const char *model_type, model_family *out);

/* The layers DFlash captures by default (reference/dflash.md 1.3): n == 1 gives [L/2], otherwise
 * round(1 + i * (L - 4) / (n - 1)) for i in 0..n-1. ids must hold n entries. 0 or DFLASH_EINVAL. */
int hf_config_dflash_layers(int num_target_layers, int n, int *ids);

/* The embedding row DFlash's MASK takes when none is given, for the target in model_dir with
 * vocab_size rows (reference/dflash.md 1.8): the id of a "<|MASK|>" token its tokenizer.json
 * has; else the first row past the tokenizer's (its largest token id + 1: 151669 for Qwen3, the
 * row z-lab's drafters use and the one an SGLang that adds "<|MASK|>" to the tokenizer gives
 * it); else (no tokenizer.json, an unreadable one, or one that fills every row) vocab_size - 1.
 * Writes where the row came from into why, for the log. */
int hf_config_default_mask_row(const char *model_dir, int vocab_size, char *why, size_t whylen);

/* ---- target weight names ---- */

typedef enum {
    HF_W_EMBED = 0,  /* model.embed_tokens.weight [V, D] */
    HF_W_INPUT_NORM, /* model.layers.i.input_layernorm.weight [D] */
    HF_W_Q,          /* self_attn.q_proj.weight [H*d, D] */
    HF_W_Q_BIAS,     /* self_attn.q_proj.bias [H*d] (qwen2) */
    HF_W_K,          /* self_attn.k_proj.weight [Hk*d, D] */
    HF_W_K_BIAS,     /* self_attn.k_proj.bias [Hk*d] (qwen2) */
    HF_W_V,          /* self_attn.v_proj.weight [Hk*d, D] */
    HF_W_V_BIAS,     /* self_attn.v_proj.bias [Hk*d] (qwen2) */
    HF_W_O,          /* self_attn.o_proj.weight [D, H*d] */
    HF_W_Q_NORM,     /* self_attn.q_norm.weight [d] (qwen3) */
    HF_W_K_NORM,     /* self_attn.k_norm.weight [d] (qwen3) */
    HF_W_POST_NORM,  /* post_attention_layernorm.weight [D] */
    HF_W_GATE,       /* mlp.gate_proj.weight [F, D] */
    HF_W_UP,         /* mlp.up_proj.weight [F, D] */
    HF_W_DOWN,       /* mlp.down_proj.weight [D, F] */
    HF_W_FINAL_NORM, /* model.norm.weight [D] */
    HF_W_LM_HEAD,    /* lm_head.weight [V, D] (absent when tied) */
    HF_W_COUNT
} hf_weight;

typedef struct hf_weight_desc {
    hf_weight kind;
    int layer; /* -1 for the global tensors */
    char name[96];
    int ndim; /* 1 or 2 */
    int64_t shape[2];
    bool is_norm; /* RMSNorm weight (initialised to 1) */
    bool is_bias;
} hf_weight_desc;

/* Whether a checkpoint of c's family holds kind (e.g. no bias for qwen3, no lm_head if tied). */
bool hf_weight_present(const model_config *c, hf_weight kind);
/* Fills *out for kind at layer (ignored for global kinds). Returns false when not present. */
bool hf_weight_describe(const model_config *c, hf_weight kind, int layer, hf_weight_desc *out);
/* Number of tensors in the checkpoint, and the i-th in file order (embed, layers, norm, lm_head).
 * hf_weight_nth returns false when i is out of range. */
size_t hf_weight_count(const model_config *c);
bool hf_weight_nth(const model_config *c, size_t i, hf_weight_desc *out);

#endif
