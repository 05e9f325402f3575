/* Model configurations in Hugging Face's config.json (Llama and GPT-2), and the architecture
 * keys of kiln's own JSON. A key that changes what the model computes, and that kiln does not
 * compute, is refused by name: a model that loads is the model the file describes. Keys that
 * do not change the math (token ids, dtypes, versions, the initialiser's range) are ignored. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/gpt_internal.h"

/* A number at key: a missing one leaves *out as it is. */
static kiln_status json_num(const cJSON *root, const char *key, double *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v)
        return KILN_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return kiln_error_setf(KILN_ERR_CONFIG, "%s: \"%s\" must be a number", path, key);
    *out = v->valuedouble;
    return KILN_OK;
}

/* A boolean at key (true/false, or 0/1): a missing one leaves *out as it is. */
static kiln_status json_bool(const cJSON *root, const char *key, int *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v)
        return KILN_OK;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        return KILN_OK;
    }
    if (cJSON_IsNumber(v) && (v->valuedouble == 0.0 || v->valuedouble == 1.0)) {
        *out = v->valuedouble != 0.0;
        return KILN_OK;
    }
    return kiln_error_setf(KILN_ERR_CONFIG, "%s: \"%s\" must be true or false", path, key);
}

kiln_status kiln__json_arch(const cJSON *root, kiln_gpt_config *c, const char *path) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "family");
    if (f) {
        if (!cJSON_IsString(f))
            return kiln_error_setf(KILN_ERR_CONFIG, "%s: \"family\" must be a string", path);
        if (kiln_gpt_config_family(c, f->valuestring))
            return kiln_error_setf(KILN_ERR_CONFIG, "%s: no model family named \"%.32s\" (known: "
                                   "gpt2, llama)", path, f->valuestring);
    }
    KILN_CHECK(kiln__json_int(root, "n_kv_head", NULL, 1, &c->n_kv_head, path));
    KILN_CHECK(json_num(root, "norm_eps", &c->norm_eps, path));
    KILN_CHECK(json_num(root, "rope_theta", &c->rope_theta, path));
    return json_bool(root, "untied_head", &c->untied_head, path);
}

/* Refused unless absent, null, or equal to what kiln computes. */
static kiln_status refuse_set(const cJSON *root, const char *key, const char *why,
                              const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0.0))
        return KILN_OK;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s: \"%s\" is set; kiln does not support %s",
                           path, key, why);
}

/* A string key that must be one of the values kiln computes (absent: the default, which is). */
static kiln_status want_string(const cJSON *root, const char *key, const char *const *ok,
                               const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v)
        return KILN_OK;
    for (int i = 0; cJSON_IsString(v) && ok[i]; i++)
        if (!strcmp(v->valuestring, ok[i]))
            return KILN_OK;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s: \"%s\" is %s; kiln computes \"%s\"", path,
                           key, cJSON_IsString(v) ? v->valuestring : "not a string", ok[0]);
}

static kiln_status llama_from_hf(const cJSON *root, kiln_gpt_config *c, const char *path) {
    static const char *const silu[] = {"silu", "swish", NULL};
    KILN_CHECK(refuse_set(root, "rope_scaling", "scaled rotary embeddings", path));
    KILN_CHECK(refuse_set(root, "attention_bias", "biases in attention", path));
    KILN_CHECK(refuse_set(root, "mlp_bias", "biases in the MLP", path));
    KILN_CHECK(refuse_set(root, "attention_dropout", "dropout", path));
    KILN_CHECK(refuse_set(root, "rope_interleaved", "interleaved rotary channels", path));
    KILN_CHECK(refuse_set(root, "sliding_window", "sliding-window attention", path));
    KILN_CHECK(want_string(root, "hidden_act", silu, path));
    kiln_gpt_config_family(c, "llama");
    KILN_CHECK(kiln__json_int(root, "num_hidden_layers", NULL, 0, &c->n_layer, path));
    KILN_CHECK(kiln__json_int(root, "hidden_size", NULL, 0, &c->n_embd, path));
    KILN_CHECK(kiln__json_int(root, "num_attention_heads", NULL, 0, &c->n_head, path));
    KILN_CHECK(kiln__json_int(root, "num_key_value_heads", NULL, 1, &c->n_kv_head, path));
    KILN_CHECK(kiln__json_int(root, "intermediate_size", NULL, 0, &c->mlp_hidden, path));
    KILN_CHECK(kiln__json_int(root, "max_position_embeddings", NULL, 0, &c->max_seq_len, path));
    KILN_CHECK(kiln__json_int(root, "vocab_size", NULL, 1, &c->vocab_size, path));
    KILN_CHECK(kiln__json_int(root, "head_dim", NULL, 1, &c->head_size, path));
    c->norm_eps = 1e-6; /* LlamaConfig's default */
    KILN_CHECK(json_num(root, "rms_norm_eps", &c->norm_eps, path));
    c->rope_theta = 10000.0;
    KILN_CHECK(json_num(root, "rope_theta", &c->rope_theta, path));
    int tie = 0; /* tie_word_embeddings defaults to false */
    KILN_CHECK(json_bool(root, "tie_word_embeddings", &tie, path));
    c->untied_head = !tie;
    if (c->max_seq_len > (1 << 20)) /* positions are not parameters here: plan fewer */
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s: max_position_embeddings %lld is beyond kiln's 2^20", path,
                               (long long)c->max_seq_len);
    return KILN_OK;
}

static kiln_status gpt2_from_hf(const cJSON *root, kiln_gpt_config *c, const char *path) {
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    KILN_CHECK(want_string(root, "activation_function", gelu, path));
    KILN_CHECK(
        refuse_set(root, "scale_attn_by_inverse_layer_idx", "scaling attention by layer", path));
    KILN_CHECK(refuse_set(root, "reorder_and_upcast_attn", "upcast attention", path));
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    if (eps && (!cJSON_IsNumber(eps) || eps->valuedouble != 1e-5))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "%s: \"layer_norm_epsilon\" is not 1e-5, the only one kiln's "
                               "LayerNorm has",
                               path);
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(root, "scale_attn_weights");
    if (scale && cJSON_IsFalse(scale))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "%s: \"scale_attn_weights\" is false; kiln scales by 1/sqrt(hs)",
                               path);
    KILN_CHECK(kiln__json_int(root, "n_layer", NULL, 0, &c->n_layer, path));
    KILN_CHECK(kiln__json_int(root, "n_head", NULL, 0, &c->n_head, path));
    KILN_CHECK(kiln__json_int(root, "n_embd", NULL, 0, &c->n_embd, path));
    KILN_CHECK(kiln__json_int(root, "n_positions", "n_ctx", 0, &c->max_seq_len, path));
    KILN_CHECK(kiln__json_int(root, "vocab_size", NULL, 1, &c->vocab_size, path));
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (inner && !cJSON_IsNull(inner))
        KILN_CHECK(kiln__json_int(root, "n_inner", NULL, 0, &c->mlp_hidden, path));
    return KILN_OK;
}

kiln_status kiln__gpt_config_from_hf(const cJSON *root, kiln_gpt_config *c, const char *path) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(t))
        return kiln_error_setf(KILN_ERR_CONFIG, "%s: \"model_type\" must be a string", path);
    memset(c, 0, sizeof *c);
    if (!strcmp(t->valuestring, "llama"))
        return llama_from_hf(root, c, path);
    if (!strcmp(t->valuestring, "gpt2"))
        return gpt2_from_hf(root, c, path);
    return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                           "%s: model_type \"%.64s\" is not one kiln builds (llama, gpt2)", path,
                           t->valuestring);
}
