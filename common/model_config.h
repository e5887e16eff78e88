/* model_config: the architecture of a Hugging Face target checkpoint (Qwen3, Qwen2, Llama).
 *
 * Filled from config.json by hf_config_load() (hf_config.c) and written by dflash-mkmodel.
 * Plain data, copied freely. All three families are pre-norm decoders with RMSNorm, GQA,
 * RoPE (rotate_half layout) and SwiGLU; they differ only in the flags below:
 *   Qwen3: qk_norm (per-head RMSNorm on q and k before RoPE), no biases, explicit head_dim.
 *   Qwen2: qkv_bias (bias on q_proj, k_proj, v_proj), head_dim = hidden / heads.
 *   Llama: no biases, optional Llama-3 rope scaling.
 */
#ifndef DFLASH_MODEL_CONFIG_H
#define DFLASH_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#define MODEL_MAX_EOS_IDS 8 /* eos ids kept from a list (more are ignored, with a warning) */

typedef enum { MODEL_QWEN3 = 0, MODEL_QWEN2, MODEL_LLAMA } model_family;

typedef struct rope_llama3_scaling {
    bool enabled; /* rope_scaling.rope_type == "llama3" */
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings;
} rope_llama3_scaling;

typedef struct model_config {
    model_family family;
    int vocab_size;
    int hidden_size;       /* D */
    int intermediate_size; /* F */
    int num_layers;        /* num_hidden_layers */
    int num_heads;         /* H */
    int num_kv_heads;      /* Hk; H % Hk == 0 */
    int head_dim;          /* d */
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    rope_llama3_scaling rope_scaling;
    bool qk_norm;             /* Qwen3 */
    bool qkv_bias;            /* Qwen2 */
    bool tie_word_embeddings; /* lm_head shares embed_tokens */
    int bos_token_id, eos_token_id; /* -1 when absent; eos: the first of eos_ids */
    int n_eos_ids;                  /* eos_token_id as a list (Llama-3 Instruct: three) */
    int32_t eos_ids[MODEL_MAX_EOS_IDS];
} model_config;

#endif
