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
} gpt_preset;

/* GPT-2's four sizes, and small ones for CPU work: dN has N layers of 32N channels in
 * heads of 32 channels. */
static const gpt_preset presets[] = {
    {"gpt2-124m", 12, 768, 12, 1024},  {"gpt2-350m", 24, 1024, 16, 1024},
    {"gpt2-774m", 36, 1280, 20, 1024}, {"gpt2-1558m", 48, 1600, 25, 1024},
    {"d4", 4, 128, 4, 256},            {"d6", 6, 192, 6, 256},
    {"d12", 12, 384, 12, 512},
};

const char *const kiln_gpt_preset_names[] = {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m",
                                             "d4",        "d6",        "d12",       NULL};

kiln_status kiln_gpt_config_preset(kiln_gpt_config *cfg, const char *name) {
    if (!cfg || !name)
        return kiln_error_setf(KILN_ERR_ARG, "config preset: NULL argument");
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0)
            continue;
        memset(cfg, 0, sizeof *cfg);
        cfg->n_layer = presets[i].L;
        cfg->n_embd = presets[i].C;
        cfg->n_head = presets[i].NH;
        cfg->max_seq_len = presets[i].maxT;
        cfg->vocab_size = GPT2_VOCAB;
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
static kiln_status json_int(const cJSON *root, const char *key, const char *alt, int optional,
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
    s = json_int(root, "n_layer", NULL, 0, &c.n_layer, path);
    if (!s)
        s = json_int(root, "n_head", NULL, 0, &c.n_head, path);
    if (!s)
        s = json_int(root, "n_embd", NULL, 0, &c.n_embd, path);
    if (!s)
        s = json_int(root, "vocab_size", NULL, 1, &c.vocab_size, path);
    if (!s)
        s = json_int(root, "max_seq_len", "n_positions", 0, &c.max_seq_len, path);
    if (!s)
        s = json_int(root, "share_layers", NULL, 1, &c.share_layers, path);
    if (!s)
        s = json_int(root, "head_size", NULL, 1, &c.head_size, path);
    if (!s)
        s = json_int(root, "mlp_hidden", "n_inner", 1, &c.mlp_hidden, path);
    static const char *const rank_keys[4] = {"rank_qkv", "rank_attproj", "rank_fc", "rank_fcproj"};
    for (int k = 0; k < 4 && !s; k++)
        s = json_int(root, rank_keys[k], NULL, 1, &c.rank[k], path);
    cJSON_Delete(root);
    if (s)
        return s;
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
    if (c.vocab_size)
        c.padded_vocab_size = check.padded_vocab_size;
    *cfg = c;
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
        return kiln_error_setf(KILN_ERR_CONFIG, "head_size is %lld; it must be 1..65536 (0: "
                               "n_embd / n_head)", (long long)cfg->head_size);
    if (cfg->head_size == 0 && cfg->n_embd % cfg->n_head != 0)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "n_head %lld does not divide n_embd %lld (or give head_size)",
                               (long long)cfg->n_head, (long long)cfg->n_embd);
    if (cfg->n_head * (cfg->head_size ? cfg->head_size : 1) > 4 * 65536)
        return kiln_error_setf(KILN_ERR_CONFIG, "n_head x head_size is %lld; at most %d",
                               (long long)(cfg->n_head * cfg->head_size), 4 * 65536);
    if (cfg->mlp_hidden < 0 || cfg->mlp_hidden > 4 * 65536)
        return kiln_error_setf(KILN_ERR_CONFIG, "mlp_hidden is %lld; it must be 1..%d (0: 4 x "
                               "n_embd)", (long long)cfg->mlp_hidden, 4 * 65536);
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

void kiln__gpt_matrix_shape(const kiln_gpt_config *cfg, int kind, int64_t *in, int64_t *out) {
    int64_t C = cfg->n_embd, A = kiln_gpt_config_attn_width(cfg), H = kiln_gpt_config_mlp_width(cfg);
    const int64_t ins[4] = {C, A, C, H}, outs[4] = {3 * A, C, H, C};
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
    int64_t C = cfg->n_embd, L = kiln_gpt_config_blocks(cfg);
    int64_t A = kiln_gpt_config_attn_width(cfg), H = kiln_gpt_config_mlp_width(cfg);
    int64_t block = 2 * C + 3 * A + C + 2 * C + H + C + block_matrix_params(cfg);
    return cfg->vocab_size * C + cfg->max_seq_len * C + L * block + 2 * C;
}

double kiln_gpt_flops_per_token(const kiln_gpt_config *cfg, int64_t T) {
    double C = (double)cfg->n_embd, L = (double)cfg->n_layer, V = (double)cfg->vocab_size;
    double A = (double)kiln_gpt_config_attn_width(cfg);
    double matmul_params = L * (double)block_matrix_params(cfg) + V * C;
    return 6.0 * matmul_params + 12.0 * L * (double)T * A;
}
