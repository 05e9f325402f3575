/* GPT-2 configurations: presets, JSON files, validation, FLOP counts. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "model/gpt_internal.h"

#define GPT2_VOCAB 50257

typedef struct gpt_preset {
    const char *name;
    int64_t L, C, NH, maxT;
    /* Llama's: key/value heads, the MLP's width, the vocabulary (0: GPT-2's), the rotary
     * base, a head of its own; family 0: GPT-2 */
    kiln_family family;
    int64_t NKV, H, V;
    double theta;
    int untied;
} gpt_preset;

/* GPT-2's four sizes, and small ones for CPU work: dN has N layers of 32N channels in
 * heads of 32 channels. llama-dN is dN's shape as a Llama with half as many key/value heads
 * and a SwiGLU MLP of about 8C/3 (a multiple of 32: the parameters of GPT-2's 4C MLP), GPT-2's
 * vocabulary; smollm2-135m is that model's shape (Hugging Face's SmolLM2-135M config). */
static const gpt_preset presets[] = {
    {"gpt2-124m", 12, 768, 12, 1024, KILN_FAMILY_GPT2, 0, 0, 0, 0.0, 0},
    {"gpt2-350m", 24, 1024, 16, 1024, KILN_FAMILY_GPT2, 0, 0, 0, 0.0, 0},
    {"gpt2-774m", 36, 1280, 20, 1024, KILN_FAMILY_GPT2, 0, 0, 0, 0.0, 0},
    {"gpt2-1558m", 48, 1600, 25, 1024, KILN_FAMILY_GPT2, 0, 0, 0, 0.0, 0},
    {"d4", 4, 128, 4, 256, KILN_FAMILY_GPT2, 0, 0, 0, 0.0, 0},
    {"d6", 6, 192, 6, 256, KILN_FAMILY_GPT2, 0, 0, 0, 0.0, 0},
    {"d12", 12, 384, 12, 512, KILN_FAMILY_GPT2, 0, 0, 0, 0.0, 0},
    {"llama-d4", 4, 128, 4, 256, KILN_FAMILY_LLAMA, 2, 352, 0, 10000.0, 0},
    {"llama-d6", 6, 192, 6, 256, KILN_FAMILY_LLAMA, 3, 512, 0, 10000.0, 0},
    {"llama-d12", 12, 384, 12, 512, KILN_FAMILY_LLAMA, 6, 1024, 0, 10000.0, 0},
    {"smollm2-135m", 30, 576, 9, 8192, KILN_FAMILY_LLAMA, 3, 1536, 49152, 100000.0, 0},
};

const char *const kiln_gpt_preset_names[] = {"gpt2-124m", "gpt2-350m", "gpt2-774m",    "gpt2-1558m",
                                             "d4",        "d6",        "d12",          "llama-d4",
                                             "llama-d6",  "llama-d12", "smollm2-135m", NULL};

const char *const kiln_family_names[] = {"gpt2", "llama", NULL};

const char *kiln_family_name(kiln_family f) {
    return (unsigned)f <= KILN_FAMILY_LLAMA ? kiln_family_names[f] : "?";
}

kiln_status kiln_gpt_require_family(const kiln_gpt_config *cfg, kiln_family f, const char *what) {
    if (cfg->family == f)
        return KILN_OK;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s is for %s models; this one is a %s", what,
                           kiln_family_name(f), kiln_family_name(cfg->family));
}

kiln_status kiln_gpt_config_family(kiln_gpt_config *cfg, const char *family) {
    if (!cfg || !family)
        return kiln_error_setf(KILN_ERR_ARG, "config family: NULL argument");
    if (!strcmp(family, "gpt2")) {
        cfg->family = KILN_FAMILY_GPT2;
        cfg->norm = KILN_NORM_LAYERNORM;
        cfg->position = KILN_POSITION_LEARNED;
        cfg->mlp = KILN_MLP_GELU;
        cfg->bias_free = 0;
        cfg->untied_head = 0;
        cfg->n_kv_head = 0;
        cfg->norm_eps = 0.0;
        cfg->rope_theta = 0.0;
        return KILN_OK;
    }
    if (!strcmp(family, "llama")) {
        cfg->family = KILN_FAMILY_LLAMA;
        cfg->norm = KILN_NORM_RMSNORM;
        cfg->position = KILN_POSITION_ROPE;
        cfg->mlp = KILN_MLP_SWIGLU;
        cfg->bias_free = 1;
        if (cfg->n_kv_head && cfg->n_head % cfg->n_kv_head != 0)
            cfg->n_kv_head = 0;
        return KILN_OK;
    }
    return kiln_error_setf(KILN_ERR_NOT_FOUND, "no model family named '%s' (known: gpt2, llama)",
                           family);
}

kiln_status kiln_gpt_config_preset(kiln_gpt_config *cfg, const char *name) {
    if (!cfg || !name)
        return kiln_error_setf(KILN_ERR_ARG, "config preset: NULL argument");
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0)
            continue;
        const gpt_preset *p = &presets[i];
        memset(cfg, 0, sizeof *cfg);
        cfg->n_layer = p->L;
        cfg->n_embd = p->C;
        cfg->n_head = p->NH;
        cfg->max_seq_len = p->maxT;
        cfg->vocab_size = p->V ? p->V : GPT2_VOCAB;
        if (p->family == KILN_FAMILY_LLAMA) {
            kiln_gpt_config_family(cfg, "llama");
            cfg->n_kv_head = p->NKV;
            cfg->mlp_hidden = p->H;
            cfg->rope_theta = p->theta;
            cfg->untied_head = p->untied;
        }
        return kiln_gpt_config_validate(cfg);
    }
    char known[256] = "";
    for (int i = 0; kiln_gpt_preset_names[i]; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, kiln_gpt_preset_names[i], sizeof known - strlen(known) - 1);
    }
    return kiln_error_setf(KILN_ERR_NOT_FOUND, "no model preset named '%s' (known: %s)", name,
                           known);
}

/* An integer at key (or alt); when optional, a missing key leaves *out as it is. */
kiln_status kiln__json_int(const cJSON *root, const char *key, const char *alt, int optional,
                           int64_t *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v && alt)
        v = cJSON_GetObjectItemCaseSensitive(root, alt);
    if (!v && optional)
        return KILN_OK;
    if (!v)
        return kiln_error_setf(KILN_ERR_CONFIG, "%s: missing key \"%s\"", path, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -1e15 && v->valuedouble <= 1e15) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return kiln_error_setf(KILN_ERR_CONFIG, "%s: \"%s\" must be an integer", path, key);
    *out = (int64_t)v->valuedouble;
    return KILN_OK;
}

static kiln_status finish_json_config(kiln_gpt_config *cfg, kiln_gpt_config *c, const char *path);

/* A model config is a few lines; anything much larger is not one. */
#define CONFIG_MAX_BYTES ((size_t)64 << 10)

kiln_status kiln_gpt_config_from_json(kiln_gpt_config *cfg, const char *path) {
    char *text = NULL;
    size_t len = 0;
    kiln_status s = kiln_file_read(path, CONFIG_MAX_BYTES, &text, &len);
    if (s)
        return kiln_error_wrapf(s, "model config");
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_error_setf(KILN_ERR_CONFIG, "%s: not a JSON object", path);
    }
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    if (cJSON_GetObjectItemCaseSensitive(root, "model_type")) { /* Hugging Face's config.json */
        s = kiln__gpt_config_from_hf(root, &c, path);
        cJSON_Delete(root);
        if (s)
            return s;
        return finish_json_config(cfg, &c, path);
    }
    s = kiln__json_arch(root, &c, path);
    if (!s)
        s = kiln__json_int(root, "n_layer", NULL, 0, &c.n_layer, path);
    if (!s)
        s = kiln__json_int(root, "n_head", NULL, 0, &c.n_head, path);
    if (!s)
        s = kiln__json_int(root, "n_embd", NULL, 0, &c.n_embd, path);
    if (!s)
        s = kiln__json_int(root, "vocab_size", NULL, 1, &c.vocab_size, path);
    if (!s)
        s = kiln__json_int(root, "max_seq_len", "n_positions", 0, &c.max_seq_len, path);
    if (!s)
        s = kiln__json_int(root, "share_layers", NULL, 1, &c.share_layers, path);
    if (!s)
        s = kiln__json_int(root, "head_size", NULL, 1, &c.head_size, path);
    if (!s)
        s = kiln__json_int(root, "mlp_hidden", "n_inner", 1, &c.mlp_hidden, path);
    static const char *const rank_keys[4] = {"rank_qkv", "rank_attproj", "rank_fc", "rank_fcproj"};
    for (int k = 0; k < 4 && !s; k++)
        s = kiln__json_int(root, rank_keys[k], NULL, 1, &c.rank[k], path);
    cJSON_Delete(root);
    if (s)
        return s;
    return finish_json_config(cfg, &c, path);
}

/* A configuration read from a file: checked, with the vocabulary left to the caller when the
 * file gave none. */
static kiln_status finish_json_config(kiln_gpt_config *cfg, kiln_gpt_config *cp, const char *path) {
    kiln_gpt_config c = *cp;
    kiln_status s;
    if (c.vocab_size < 0)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s: vocab_size is %lld; leave it out (or 0) to take the data's",
                               path, (long long)c.vocab_size);
    /* vocab_size 0 (left out): the rest is checked now, the vocabulary when it is known. */
    kiln_gpt_config check = c;
    if (check.vocab_size == 0)
        check.vocab_size = 2;
    s = kiln_gpt_config_validate(&check);
    if (s)
        return kiln_error_wrapf(s, "%s", path);
    /* the checked form (defaults stored as 0), with the vocabulary as the file gave it */
    check.vocab_size = c.vocab_size;
    if (!c.vocab_size)
        check.padded_vocab_size = 0;
    *cfg = check;
    return KILN_OK;
}

/* The architecture fields: a description kiln can run, defaults stored as 0. */
static kiln_status validate_arch(kiln_gpt_config *cfg) {
    const char *fam = kiln_family_name(cfg->family);
    if ((unsigned)cfg->family > KILN_FAMILY_LLAMA || (unsigned)cfg->norm > KILN_NORM_RMSNORM ||
        (unsigned)cfg->position > KILN_POSITION_ROPE || (unsigned)cfg->mlp > KILN_MLP_SWIGLU)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the architecture fields hold unknown values "
                               "(family %d, norm %d, position %d, mlp %d)",
                               (int)cfg->family, (int)cfg->norm, (int)cfg->position, (int)cfg->mlp);
    if (cfg->n_kv_head < 0 || (cfg->n_kv_head && cfg->n_head % cfg->n_kv_head != 0))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "n_kv_head %lld does not divide n_head %lld (1: multi-query; 0 or "
                               "n_head: one key/value head a query head)",
                               (long long)cfg->n_kv_head, (long long)cfg->n_head);
    if (cfg->n_kv_head == cfg->n_head)
        cfg->n_kv_head = 0;
    if (!(cfg->norm_eps >= 0.0 && cfg->norm_eps <= 1.0) || !(cfg->rope_theta >= 0.0) ||
        cfg->rope_theta > 1e12 || (cfg->rope_theta > 0.0 && cfg->rope_theta <= 1.0))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "norm_eps %g must be in [0, 1] and rope_theta %g above 1 (0: the "
                               "defaults 1e-5 and 10000)",
                               cfg->norm_eps, cfg->rope_theta);
    if (cfg->norm_eps == 1e-5)
        cfg->norm_eps = 0.0;
    if (cfg->rope_theta == 10000.0 || cfg->position != KILN_POSITION_ROPE)
        cfg->rope_theta = 0.0;
    if (cfg->family == KILN_FAMILY_GPT2) {
        if (cfg->norm != KILN_NORM_LAYERNORM || cfg->position != KILN_POSITION_LEARNED ||
            cfg->mlp != KILN_MLP_GELU || cfg->bias_free || cfg->untied_head || cfg->n_kv_head ||
            cfg->norm_eps != 0.0)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "a gpt2 model has LayerNorm (eps 1e-5), learned positions, a "
                                   "GELU MLP, biases, a tied head and a key/value head a query "
                                   "head; this description differs");
        return KILN_OK;
    }
    /* llama */
    if (cfg->norm != KILN_NORM_RMSNORM || cfg->position != KILN_POSITION_ROPE ||
        cfg->mlp != KILN_MLP_SWIGLU || !cfg->bias_free)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "a %s model has RMSNorm, rotary positions, a SwiGLU MLP and no "
                               "biases; this description differs",
                               fam);
    if (kiln_gpt_config_head_size(cfg) % 2 != 0)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "rotary embeddings need an even head size, not %lld",
                               (long long)kiln_gpt_config_head_size(cfg));
    for (int k = 0; k < 4; k++)
        if (cfg->rank[k])
            return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                                   "low-rank factors are not supported for %s models", fam);
    return KILN_OK;
}

kiln_status kiln_gpt_config_validate(kiln_gpt_config *cfg) {
    if (cfg->n_layer < 1 || cfg->n_layer > 1024)
        return kiln_error_setf(KILN_ERR_CONFIG, "n_layer is %lld; it must be 1..1024",
                               (long long)cfg->n_layer);
    if (cfg->n_embd < 1 || cfg->n_embd > 65536)
        return kiln_error_setf(KILN_ERR_CONFIG, "n_embd is %lld; it must be 1..65536",
                               (long long)cfg->n_embd);
    if (cfg->n_head < 1 || cfg->n_head > 65536)
        return kiln_error_setf(KILN_ERR_CONFIG, "n_head is %lld; it must be 1..65536",
                               (long long)cfg->n_head);
    if (cfg->head_size < 0 || cfg->head_size > 65536)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "head_size is %lld; it must be 1..65536 (0: "
                               "n_embd / n_head)",
                               (long long)cfg->head_size);
    if (cfg->head_size == 0 && cfg->n_embd % cfg->n_head != 0)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "n_head %lld does not divide n_embd %lld (or give head_size)",
                               (long long)cfg->n_head, (long long)cfg->n_embd);
    if (cfg->n_head * (cfg->head_size ? cfg->head_size : 1) > 4 * 65536)
        return kiln_error_setf(KILN_ERR_CONFIG, "n_head x head_size is %lld; at most %d",
                               (long long)(cfg->n_head * cfg->head_size), 4 * 65536);
    if (cfg->mlp_hidden < 0 || cfg->mlp_hidden > 4 * 65536)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "mlp_hidden is %lld; it must be 1..%d (0: 4 x "
                               "n_embd)",
                               (long long)cfg->mlp_hidden, 4 * 65536);
    /* the defaults are stored as 0: one model, one config */
    if (cfg->head_size && cfg->head_size * cfg->n_head == cfg->n_embd)
        cfg->head_size = 0;
    if (cfg->mlp_hidden == 4 * cfg->n_embd)
        cfg->mlp_hidden = 0;
    if (cfg->vocab_size < 2 || cfg->vocab_size > (1LL << 31) - 256)
        return kiln_error_setf(KILN_ERR_CONFIG, "vocab_size is %lld; it must be 2..2^31-256",
                               (long long)cfg->vocab_size);
    if (cfg->share_layers < 0 || cfg->share_layers > cfg->n_layer ||
        (cfg->share_layers > 1 && cfg->n_layer % cfg->share_layers != 0))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "share_layers is %lld; it must divide n_layer %lld (0 or 1: no "
                               "sharing)",
                               (long long)cfg->share_layers, (long long)cfg->n_layer);
    static const char *const kinds[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    for (int k = 0; k < 4; k++) {
        int64_t in, out;
        kiln__gpt_matrix_shape(cfg, k, &in, &out);
        int64_t most = in < out ? in : out;
        if (cfg->rank[k] < 0 || cfg->rank[k] > most)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "the rank of %s is %lld; it must be 1..%lld (min(in, out) of "
                                   "its (%lld, %lld) matrices), or 0 for the dense matrix",
                                   kinds[k], (long long)cfg->rank[k], (long long)most,
                                   (long long)in, (long long)out);
    }
    if (cfg->max_seq_len < 1 || cfg->max_seq_len > (1 << 20))
        return kiln_error_setf(KILN_ERR_CONFIG, "max_seq_len is %lld; it must be 1..2^20",
                               (long long)cfg->max_seq_len);
    KILN_CHECK(validate_arch(cfg));
    /* Padding to a multiple of 128 keeps the head's matrix products on fast paths. */
    cfg->padded_vocab_size = (cfg->vocab_size + 127) / 128 * 128;
    return KILN_OK;
}

int64_t kiln_gpt_config_blocks(const kiln_gpt_config *cfg) {
    return cfg->share_layers > 1 ? cfg->n_layer / cfg->share_layers : cfg->n_layer;
}

int64_t kiln_gpt_config_head_size(const kiln_gpt_config *cfg) {
    return cfg->head_size > 0 ? cfg->head_size : cfg->n_embd / cfg->n_head;
}

int64_t kiln_gpt_config_attn_width(const kiln_gpt_config *cfg) {
    return cfg->n_head * kiln_gpt_config_head_size(cfg);
}

int64_t kiln_gpt_config_mlp_width(const kiln_gpt_config *cfg) {
    return cfg->mlp_hidden > 0 ? cfg->mlp_hidden : 4 * cfg->n_embd;
}

int64_t kiln_gpt_config_kv_heads(const kiln_gpt_config *cfg) {
    return cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
}

int64_t kiln_gpt_config_kv_width(const kiln_gpt_config *cfg) {
    return kiln_gpt_config_kv_heads(cfg) * kiln_gpt_config_head_size(cfg);
}

int64_t kiln_gpt_config_qkv_width(const kiln_gpt_config *cfg) {
    return kiln_gpt_config_attn_width(cfg) + 2 * kiln_gpt_config_kv_width(cfg);
}

float kiln_gpt_config_norm_eps(const kiln_gpt_config *cfg) {
    return cfg->norm_eps > 0.0 ? (float)cfg->norm_eps : 1e-5f;
}

float kiln_gpt_config_rope_theta(const kiln_gpt_config *cfg) {
    return cfg->rope_theta > 0.0 ? (float)cfg->rope_theta : 10000.0f;
}

/* (in, out) whatever the family's layout: a Llama's gate and up projections are one
 * (C, 2H) matrix, q, k and v one (C, A + 2 x kv width). */
void kiln__gpt_matrix_shape(const kiln_gpt_config *cfg, int kind, int64_t *in, int64_t *out) {
    int64_t C = cfg->n_embd, A = kiln_gpt_config_attn_width(cfg),
            H = kiln_gpt_config_mlp_width(cfg);
    int64_t fc = cfg->mlp == KILN_MLP_SWIGLU ? 2 * H : H;
    const int64_t ins[4] = {C, A, C, H}, outs[4] = {kiln_gpt_config_qkv_width(cfg), C, fc, C};
    *in = ins[kind];
    *out = outs[kind];
}

/* Weights of one block's matrices (factored ones as their two factors), biases left out. */
static int64_t block_matrix_params(const kiln_gpt_config *cfg) {
    int64_t n = 0;
    for (int k = 0; k < 4; k++) {
        int64_t in, out;
        kiln__gpt_matrix_shape(cfg, k, &in, &out);
        n += cfg->rank[k] ? cfg->rank[k] * (in + out) : in * out;
    }
    return n;
}

int64_t kiln_gpt_config_num_params(const kiln_gpt_config *cfg) {
    int64_t C = cfg->n_embd, L = kiln_gpt_config_blocks(cfg), in, fc;
    kiln__gpt_matrix_shape(cfg, KILN_GPT_MATRIX_FC, &in, &fc);
    int64_t norm = cfg->norm == KILN_NORM_LAYERNORM ? 2 * C : C;
    int64_t bias = cfg->bias_free ? 0 : kiln_gpt_config_qkv_width(cfg) + C + fc + C;
    int64_t block = 2 * norm + bias + block_matrix_params(cfg);
    int64_t embed = cfg->vocab_size * C * (cfg->untied_head ? 2 : 1) +
                    (cfg->position == KILN_POSITION_LEARNED ? cfg->max_seq_len * C : 0);
    return embed + L * block + norm;
}

double kiln_gpt_flops_per_token(const kiln_gpt_config *cfg, int64_t T) {
    double C = (double)cfg->n_embd, L = (double)cfg->n_layer, V = (double)cfg->vocab_size;
    double A = (double)kiln_gpt_config_attn_width(cfg);
    double matmul_params = L * (double)block_matrix_params(cfg) + V * C;
    return 6.0 * matmul_params + 12.0 * L * (double)T * A;
}
