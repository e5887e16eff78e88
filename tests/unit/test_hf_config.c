/* test_hf_config: real-world config.json files of Qwen3, Qwen2 and Llama 3 load with the right
 * architecture flags; invalid or unsupported ones are refused naming the field; what
 * hf_config_write writes loads back identically; the weight-name table matches HF checkpoints;
 * the default MASK row follows the target's tokenizer.json. */
#include "check.h"
#include "err.h"
#include "hf_config.h"
#include "test_files.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static int load_text(const char *text, model_config *c, char *err, size_t errlen) {
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *fp = fopen(path, "w");
    fputs(text, fp);
    fclose(fp);
    return hf_config_load(dir, c, err, errlen);
}

static const char *qwen3_8b =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":12288,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":36,\"model_type\":\"qwen3\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":36,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,"
    "\"sliding_window\":null,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.51.0\",\"use_cache\":true,\"use_sliding_window\":false,"
    "\"vocab_size\":151936}";

static const char *qwen25_05b =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,"
    "\"eos_token_id\":151643,\"hidden_act\":\"silu\",\"hidden_size\":896,"
    "\"initializer_range\":0.02,\"intermediate_size\":4864,\"max_position_embeddings\":32768,"
    "\"max_window_layers\":24,\"model_type\":\"qwen2\",\"num_attention_heads\":14,"
    "\"num_hidden_layers\":24,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
    "\"rope_theta\":1000000.0,\"sliding_window\":32768,\"tie_word_embeddings\":true,"
    "\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"use_sliding_window\":false,"
    "\"vocab_size\":151936}";

static const char *llama31_8b =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\","
    "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,"
    "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
    "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":8.0,"
    "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,"
    "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"vocab_size\":128256}";

static void test_real_configs(void) {
    model_config c;
    char err[512];
    CHECK_EQ_INT(load_text(qwen3_8b, &c, err, sizeof err), 0);
    CHECK_EQ_INT(c.family, MODEL_QWEN3);
    CHECK_EQ_INT(c.hidden_size, 4096);
    CHECK_EQ_INT(c.num_layers, 36);
    CHECK_EQ_INT(c.num_heads, 32);
    CHECK_EQ_INT(c.num_kv_heads, 8);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK_EQ_INT(c.intermediate_size, 12288);
    CHECK_EQ_INT(c.vocab_size, 151936);
    CHECK_EQ_INT(c.max_position_embeddings, 40960);
    CHECK_NEAR(c.rms_norm_eps, 1e-6, 0);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    CHECK(c.qk_norm && !c.qkv_bias && !c.tie_word_embeddings && !c.rope_scaling.enabled);
    CHECK_EQ_INT(c.eos_token_id, 151645);
    CHECK(c.n_eos_ids == 1 && c.eos_ids[0] == 151645);

    CHECK_EQ_INT(load_text(qwen25_05b, &c, err, sizeof err), 0);
    CHECK_EQ_INT(c.family, MODEL_QWEN2);
    CHECK_EQ_INT(c.head_dim, 64); /* 896 / 14 */
    CHECK_EQ_INT(c.num_kv_heads, 2);
    CHECK(!c.qk_norm && c.qkv_bias && c.tie_word_embeddings);

    CHECK_EQ_INT(load_text(llama31_8b, &c, err, sizeof err), 0);
    CHECK_EQ_INT(c.family, MODEL_LLAMA);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK(!c.qk_norm && !c.qkv_bias);
    CHECK(c.rope_scaling.enabled);
    CHECK_NEAR(c.rope_scaling.factor, 8, 0);
    CHECK_NEAR(c.rope_scaling.low_freq_factor, 1, 0);
    CHECK_NEAR(c.rope_scaling.high_freq_factor, 4, 0);
    CHECK_EQ_INT(c.rope_scaling.original_max_position_embeddings, 8192);
    CHECK_NEAR(c.rope_theta, 500000, 0);
    CHECK_NEAR(c.rms_norm_eps, 1e-5, 0);
    CHECK_EQ_INT(c.eos_token_id, 128001); /* first of the list */
    CHECK(c.n_eos_ids == 3 && c.eos_ids[0] == 128001 && c.eos_ids[1] == 128008 &&
          c.eos_ids[2] == 128009); /* all of it: generation stops at <|eot_id|> 128009 too */
    /* an empty list means no eos, as transformers reads it (was "not an integer") */
    char text[4096];
    const char *at = strstr(llama31_8b, "[128001,128008,128009]");
    CHECK(at != NULL);
    snprintf(text, sizeof text, "%.*s[]%s", (int)(at - llama31_8b), llama31_8b,
             at + strlen("[128001,128008,128009]"));
    int rc = load_text(text, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  message was: %s\n", err);
    CHECK(c.eos_token_id == -1 && c.n_eos_ids == 0 && c.bos_token_id == 128000);

    /* rope_theta: default 10000, or rope_parameters (newer transformers) */
    CHECK_EQ_INT(load_text("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
                           "\"intermediate_size\":16,\"num_hidden_layers\":1,"
                           "\"num_attention_heads\":2}",
                           &c, err, sizeof err),
                 0);
    CHECK_NEAR(c.rope_theta, 10000, 0);
    CHECK_EQ_INT(c.num_kv_heads, 2);
    CHECK_EQ_INT(c.head_dim, 4);
    CHECK_EQ_INT(c.max_position_embeddings, 2048);
    CHECK_NEAR(c.rms_norm_eps, 1e-6, 0);
    /* no tie_word_embeddings: untied, as transformers' LlamaConfig / Qwen2Config / Qwen3Config
     * default it (tied, the logits would come from the embedding and the file's lm_head.weight
     * would be ignored) */
    CHECK(!c.tie_word_embeddings);
    CHECK_EQ_INT(load_text("{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,"
                           "\"intermediate_size\":16,\"num_hidden_layers\":1,"
                           "\"num_attention_heads\":2}",
                           &c, err, sizeof err),
                 0);
    CHECK_EQ_INT(c.head_dim, 128); /* Qwen3Config's default, not hidden / heads */
    CHECK_EQ_INT(load_text("{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,"
                           "\"intermediate_size\":16,\"num_hidden_layers\":1,"
                           "\"num_attention_heads\":2,\"head_dim\":6,\"rope_parameters\":"
                           "{\"rope_type\":\"default\",\"rope_theta\":12345.0}}",
                           &c, err, sizeof err),
                 0);
    CHECK_NEAR(c.rope_theta, 12345, 0);
    CHECK_EQ_INT(c.head_dim, 6);
    /* transformers 5 saves llama3 scaling under rope_parameters alone, or beside a rope_scaling
     * of the same type; partial_rotary_factor 1 and a null quantization_config are no-ops */
    CHECK_EQ_INT(load_text("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
                           "\"intermediate_size\":16,\"num_hidden_layers\":1,"
                           "\"num_attention_heads\":2,\"partial_rotary_factor\":1.0,"
                           "\"quantization_config\":null,\"rope_parameters\":{\"rope_type\":"
                           "\"llama3\",\"rope_theta\":500000.0,\"factor\":32.0,"
                           "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8192},\"rope_scaling\":"
                           "{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,"
                           "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}",
                           &c, err, sizeof err),
                 0);
    CHECK(c.rope_scaling.enabled && c.rope_scaling.factor == 32.0);
    CHECK_NEAR(c.rope_theta, 500000, 0);
}

/* Replaces the first occurrence of from in base with to and expects rc and needle. */
static void expect_bad(const char *base, const char *from, const char *to, int rc,
                       const char *needle) {
    char text[4096], err[512] = "";
    const char *at = strstr(base, from);
    CHECK(at != NULL);
    if (!at) return;
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
    model_config c;
    int got = load_text(text, &c, err, sizeof err);
    CHECK_EQ_INT(got, rc);
    CHECK(strstr(err, needle) != NULL);
    CHECK(strstr(err, "config.json") != NULL);
    if (!strstr(err, needle)) fprintf(stderr, "  message was: %s\n", err);
}

static void test_bad_configs(void) {
    expect_bad(qwen3_8b, "\"num_key_value_heads\":8", "\"num_key_value_heads\":5", DFLASH_ECONFIG,
               "not a multiple of num_key_value_heads 5");
    expect_bad(qwen3_8b, "\"head_dim\":128", "\"head_dim\":127", DFLASH_ECONFIG, "head_dim 127");
    expect_bad(llama31_8b, "[128001,128008,128009]", "[128001,128008,\"x\"]", DFLASH_ECONFIG,
               "eos_token_id[2] is not a token id");
    expect_bad(llama31_8b, "[128001,128008,128009]", "[128001,999999999]", DFLASH_ECONFIG,
               "eos_token_id[1] 999999999 outside the vocabulary");
    expect_bad(qwen3_8b, "\"hidden_size\":4096,", "", DFLASH_ECONFIG, "missing field hidden_size");
    expect_bad(qwen3_8b, "\"vocab_size\":151936", "\"vocab_size\":0", DFLASH_ECONFIG,
               "vocab_size 0");
    expect_bad(qwen3_8b, "\"vocab_size\":151936", "\"vocab_size\":\"big\"", DFLASH_ECONFIG,
               "vocab_size is not an integer");
    expect_bad(qwen3_8b, "\"model_type\":\"qwen3\"", "\"model_type\":\"mistral\"",
               DFLASH_EUNSUPPORTED, "mistral");
    expect_bad(qwen3_8b, "\"attention_bias\":false", "\"attention_bias\":true", DFLASH_EUNSUPPORTED,
               "attention_bias");
    expect_bad(qwen3_8b, "\"hidden_act\":\"silu\"", "\"hidden_act\":\"gelu\"", DFLASH_EUNSUPPORTED,
               "gelu");
    expect_bad(qwen3_8b, "\"rope_scaling\":null", "\"rope_scaling\":{\"rope_type\":\"yarn\"}",
               DFLASH_EUNSUPPORTED, "yarn");
    /* llama3 scaling is Llama's: on a Qwen model it is refused, not applied to its RoPE */
    expect_bad(qwen3_8b, "\"rope_scaling\":null", "\"rope_scaling\":{\"rope_type\":\"llama3\","
               "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
               "\"original_max_position_embeddings\":8192}",
               DFLASH_EUNSUPPORTED, "llama3 rope_scaling on a qwen3 model");
    expect_bad(qwen25_05b, "\"use_cache\":true", "\"rope_scaling\":{\"rope_type\":\"llama3\","
               "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
               "\"original_max_position_embeddings\":8192}",
               DFLASH_EUNSUPPORTED, "llama3 rope_scaling on a qwen2 model");
    /* a quantized repo (Qwen/Qwen2.5-7B-Instruct-AWQ, Qwen/Qwen3-8B-FP8) keeps its model_type */
    expect_bad(qwen25_05b, "\"use_cache\":true", "\"quantization_config\":{\"bits\":4,"
               "\"group_size\":128,\"quant_method\":\"awq\",\"version\":\"gemm\"}",
               DFLASH_EUNSUPPORTED, "quantized checkpoint (quantization_config, quant_method \"awq\")");
    expect_bad(qwen3_8b, "\"use_cache\":true", "\"quantization_config\":{\"activation_scheme\":"
               "\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\"}",
               DFLASH_EUNSUPPORTED, "quant_method \"fp8\"");
    expect_bad(qwen3_8b, "\"use_cache\":true", "\"partial_rotary_factor\":0.5",
               DFLASH_EUNSUPPORTED, "partial_rotary_factor 0.5");
    expect_bad(qwen3_8b, "\"rope_scaling\":null", "\"rope_parameters\":{\"rope_type\":\"default\","
               "\"rope_theta\":1000000,\"partial_rotary_factor\":0.25}",
               DFLASH_EUNSUPPORTED, "partial_rotary_factor 0.25");
    expect_bad(llama31_8b, "\"rope_theta\":500000.0", "\"rope_theta\":500000.0,"
               "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0}",
               DFLASH_ECONFIG, "rope_scaling (type \"llama3\") and rope_parameters (type "
               "\"default\") disagree");
    expect_bad(qwen3_8b, "\"vocab_size\":151936}", "\"vocab_size\":151936", DFLASH_EFORMAT,
               "not valid JSON");
    expect_bad(llama31_8b, "\"factor\":8.0,", "", DFLASH_ECONFIG, "factor");
    expect_bad(qwen25_05b, "\"num_key_value_heads\":2", "\"num_key_value_heads\":2,\"head_dim\":32",
               DFLASH_ECONFIG, "qwen2 needs head_dim");
    model_config c;
    char err[256];
    CHECK_EQ_INT(hf_config_load("/nonexistent/dir", &c, err, sizeof err), DFLASH_ENOTFOUND);
    CHECK(strstr(err, "/nonexistent/dir") != NULL);
}

static bool same(const model_config *a, const model_config *b) {
    return a->family == b->family && a->vocab_size == b->vocab_size &&
           a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
           a->num_layers == b->num_layers && a->num_heads == b->num_heads &&
           a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim &&
           a->max_position_embeddings == b->max_position_embeddings &&
           a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
           a->rope_scaling.enabled == b->rope_scaling.enabled &&
           a->rope_scaling.factor == b->rope_scaling.factor &&
           a->rope_scaling.low_freq_factor == b->rope_scaling.low_freq_factor &&
           a->rope_scaling.high_freq_factor == b->rope_scaling.high_freq_factor &&
           a->rope_scaling.original_max_position_embeddings ==
               b->rope_scaling.original_max_position_embeddings &&
           a->qk_norm == b->qk_norm && a->qkv_bias == b->qkv_bias &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->bos_token_id == b->bos_token_id &&
           a->eos_token_id == b->eos_token_id && a->n_eos_ids == b->n_eos_ids &&
           memcmp(a->eos_ids, b->eos_ids, (size_t)a->n_eos_ids * sizeof a->eos_ids[0]) == 0;
}

static void test_write_round_trip(void) {
    char err[512];
    const char *texts[] = {qwen3_8b, qwen25_05b, llama31_8b};
    for (int i = 0; i < 3; i++) {
        model_config a, b;
        CHECK_EQ_INT(load_text(texts[i], &a, err, sizeof err), 0);
        a.rms_norm_eps = 1.2345e-6; /* a value that needs all digits */
        CHECK_EQ_INT(hf_config_write(dir, &a, "float32"), 0);
        CHECK_EQ_INT(hf_config_load(dir, &b, err, sizeof err), 0);
        CHECK(same(&a, &b));
    }
    /* what transformers needs to pick the class */
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *fp = fopen(path, "r");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    CHECK(strstr(buf, "\"LlamaForCausalLM\"") != NULL);
    CHECK(strstr(buf, "\"torch_dtype\":\t\"float32\"") != NULL);
    CHECK(strstr(buf, "\"rope_type\":\t\"llama3\"") != NULL);
    model_config bad;
    hf_config_defaults(&bad, MODEL_QWEN3);
    CHECK_EQ_INT(hf_config_write(dir, &bad, NULL), DFLASH_EINVAL); /* sizes are 0 */
}

static void test_weights(void) {
    char err[512];
    model_config c;
    CHECK_EQ_INT(load_text(qwen3_8b, &c, err, sizeof err), 0);
    CHECK_EQ_INT(hf_weight_count(&c), 2 + 36 * 11 + 1); /* 399 tensors in Qwen3-8B */
    hf_weight_desc d;
    CHECK(hf_weight_nth(&c, 0, &d) && strcmp(d.name, "model.embed_tokens.weight") == 0);
    CHECK(d.shape[0] == 151936 && d.shape[1] == 4096);
    CHECK(hf_weight_nth(&c, 3, &d) &&
          strcmp(d.name, "model.layers.0.self_attn.k_proj.weight") == 0);
    CHECK(d.ndim == 2 && d.shape[0] == 1024 && d.shape[1] == 4096);
    CHECK(hf_weight_nth(&c, 6, &d) &&
          strcmp(d.name, "model.layers.0.self_attn.q_norm.weight") == 0 && d.is_norm &&
          d.shape[0] == 128 && d.ndim == 1);
    CHECK(hf_weight_nth(&c, 1 + 11 * 35 + 10, &d) &&
          strcmp(d.name, "model.layers.35.mlp.down_proj.weight") == 0 && d.shape[0] == 4096 &&
          d.shape[1] == 12288);
    CHECK(hf_weight_nth(&c, 397, &d) && strcmp(d.name, "model.norm.weight") == 0);
    CHECK(hf_weight_nth(&c, 398, &d) && strcmp(d.name, "lm_head.weight") == 0);
    CHECK(!hf_weight_nth(&c, 399, &d));
    CHECK(!hf_weight_describe(&c, HF_W_Q_BIAS, 0, &d));

    CHECK_EQ_INT(load_text(qwen25_05b, &c, err, sizeof err), 0);
    CHECK_EQ_INT(hf_weight_count(&c), 2 + 24 * 12); /* biases, no q/k norm, tied */
    CHECK(hf_weight_describe(&c, HF_W_K_BIAS, 23, &d) &&
          strcmp(d.name, "model.layers.23.self_attn.k_proj.bias") == 0 && d.shape[0] == 128 &&
          d.is_bias);
    CHECK(!hf_weight_describe(&c, HF_W_LM_HEAD, -1, &d));
    CHECK(!hf_weight_describe(&c, HF_W_Q, 24, &d));
    /* every name is distinct */
    size_t n = hf_weight_count(&c);
    int dups = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            hf_weight_desc a, b;
            hf_weight_nth(&c, i, &a);
            hf_weight_nth(&c, j, &b);
            if (strcmp(a.name, b.name) == 0) dups++;
        }
    CHECK_EQ_INT(dups, 0);

    int ids[5];
    CHECK_EQ_INT(hf_config_dflash_layers(36, 5, ids), 0);
    CHECK(ids[0] == 1 && ids[1] == 9 && ids[2] == 17 && ids[3] == 25 && ids[4] == 33);
    CHECK_EQ_INT(hf_config_dflash_layers(36, 1, ids), 0);
    CHECK_EQ_INT(ids[0], 18);
    CHECK_EQ_INT(hf_config_dflash_layers(4, 3, ids), 0);
    CHECK(ids[0] == 1 && ids[1] == 1 && ids[2] == 1);
    CHECK_EQ_INT(hf_config_dflash_layers(28, 3, ids), 0);
    CHECK(ids[0] == 1 && ids[1] == 13 && ids[2] == 25);
}

/* hf_config_default_mask_row with tokenizer.json holding text (NULL: no file), vocab 100. */
static int mask_row(const char *text, char *why, size_t whylen) {
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    if (text) test_spill(path, text, strlen(text));
    int row = hf_config_default_mask_row(dir, 100, why, whylen);
    printf("mask row %d: %s\n", row, why);
    return row;
}

static void test_mask_row(void) {
    char why[600];
    CHECK_EQ_INT(mask_row(NULL, why, sizeof why), 99);
    CHECK(strstr(why, "no tokenizer.json") != NULL);
    /* BPE: {piece: id} plus added tokens past it (Qwen3's shape: 151669 of 151936 rows) */
    CHECK_EQ_INT(mask_row("{\"added_tokens\":[{\"id\":40,\"content\":\"<|im_end|>\"}],"
                          "\"model\":{\"vocab\":{\"a\":0,\"b\":39}}}", why, sizeof why), 41);
    CHECK(strstr(why, "41 tokens") != NULL);
    /* Unigram: an array of [piece, score]; ids are positions */
    CHECK_EQ_INT(mask_row("{\"model\":{\"vocab\":[[\"a\",0],[\"b\",-1],[\"c\",-2]]}}", why,
                          sizeof why), 3);
    /* a <|MASK|> token the tokenizer has wins */
    CHECK_EQ_INT(mask_row("{\"added_tokens\":[{\"id\":7,\"content\":\"<|MASK|>\"}],"
                          "\"model\":{\"vocab\":{\"a\":0,\"b\":50}}}", why, sizeof why), 7);
    /* a tokenizer that fills every row (Llama 3's 128256), bad JSON, no ids: vocab_size - 1 */
    CHECK_EQ_INT(mask_row("{\"added_tokens\":[{\"id\":99,\"content\":\"x\"}]}", why,
                          sizeof why), 99);
    CHECK(strstr(why, "fill every row") != NULL);
    CHECK_EQ_INT(mask_row("{\"model\":", why, sizeof why), 99);
    CHECK(strstr(why, "not valid JSON") != NULL);
    CHECK_EQ_INT(mask_row("{}", why, sizeof why), 99);
    CHECK(strstr(why, "no token ids") != NULL);
    mask_row(NULL, why, sizeof why);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/dflash-test-hfc-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_real_configs();
    test_bad_configs();
    test_write_round_trip();
    test_weights();
    test_mask_row();
    test_rmtree(dir);
    CHECK_DONE();
}
