/* Post-training quantization (include/kiln/compress.h): int8 per output channel and int4 per
 * group, the rounding of one matrix and back, and the quantized safetensors file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/compress.h"
#include "kiln/safetensors.h"

const char *kiln_quant_type_name(kiln_quant_type t) {
    switch (t) {
    case KILN_QUANT_NONE: return "none";
    case KILN_QUANT_INT8: return "int8";
    case KILN_QUANT_INT4: return "int4";
    }
    return "?";
}

kiln_status kiln_quant_type_parse(const char *name, kiln_quant_type *out) {
    if (name && !strcmp(name, "int8"))
        *out = KILN_QUANT_INT8;
    else if (name && !strcmp(name, "int4"))
        *out = KILN_QUANT_INT4;
    else
        return kiln_error_setf(KILN_ERR_ARG,
                               "unknown quantization type \"%s\" (expected int8 or "
                               "int4)",
                               name ? name : "(null)");
    return KILN_OK;
}

/* ---- one matrix ---- */

/* Element (k, n) of w, (K,N) or with trans (N,K). */
static float at(const float *w, int64_t k, int64_t n, int64_t K, int64_t N, int trans) {
    return trans ? w[n * K + k] : w[k * N + n];
}

/* q = round(w / scale), within [-lim, lim]; scale = max|w| / lim over inputs k0..k1-1 of
 * channel n (0 when they are all zero). */
static float quant_run(int8_t *q, const float *w, int64_t k0, int64_t k1, int64_t n, int64_t K,
                       int64_t N, int trans, int lim) {
    float amax = 0.0f;
    for (int64_t k = k0; k < k1; k++) {
        float v = fabsf(at(w, k, n, K, N, trans));
        amax = v > amax ? v : amax;
    }
    float scale = amax / (float)lim;
    for (int64_t k = k0; k < k1; k++) {
        float r = scale > 0.0f ? rintf(at(w, k, n, K, N, trans) / scale) : 0.0f;
        q[k - k0] = (int8_t)(r > lim ? lim : r < -lim ? -lim : (int)r);
    }
    return scale;
}

void kiln_quant_int8(int8_t *q, float *scale, const float *w, int64_t K, int64_t N, int trans) {
#pragma omp parallel for schedule(static) if (K * N >= 65536)
    for (int64_t n = 0; n < N; n++)
        scale[n] = quant_run(q + n * K, w, 0, K, n, K, N, trans, 127);
}

kiln_status kiln_quant_int4(uint8_t *q, float *scale, const float *w, int64_t K, int64_t N,
                            int64_t G, int trans) {
    if (G < 8 || G > 4096 || G % 8 || K % G)
        return kiln_error_setf(KILN_ERR_ARG,
                               "int4 groups of %lld inputs: the group must be a multiple of 8, "
                               "at most 4096, that divides the matrix's %lld inputs",
                               (long long)G, (long long)K);
    int64_t groups = K / G;
#pragma omp parallel for schedule(static) if (K * N >= 65536)
    for (int64_t n = 0; n < N; n++) {
        int8_t run[4096]; /* one group */
        for (int64_t g = 0; g < groups; g++) {
            scale[n * groups + g] = quant_run(run, w, g * G, (g + 1) * G, n, K, N, trans, 7);
            for (int64_t k = 0; k < G; k += 2)
                q[n * (K / 2) + (g * G + k) / 2] = (uint8_t)((run[k] + 8) | (run[k + 1] + 8) << 4);
        }
    }
    return KILN_OK;
}

void kiln_dequant_int8(float *w, const int8_t *q, const float *scale, int64_t N, int64_t K) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            w[n * K + k] = (float)q[n * K + k] * scale[n];
}

void kiln_dequant_int4(float *w, const uint8_t *q, const float *scale, int64_t N, int64_t K,
                       int64_t G) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int v = (q[n * (K / 2) + k / 2] >> (4 * (k % 2))) & 15;
            w[n * K + k] = (float)(v - 8) * scale[n * (K / G) + k / G];
        }
}

/* ---- the file ---- */

int kiln_quant_is_matrix(const char *name) {
    if (!strcmp(name, "wte.weight"))
        return 1;
    size_t n = strlen(name), w = strlen(".weight");
    if (n <= w || strcmp(name + n - w, ".weight") != 0)
        return 0;
    return strstr(name, ".c_attn.") || strstr(name, ".c_proj.") || strstr(name, ".c_fc.");
}

static const char *const config_keys[] = {"kiln.n_layer", "kiln.n_head", "kiln.n_embd",
                                          "kiln.vocab_size", "kiln.max_seq_len"};

static kiln_status set_meta_int(kiln_safetensors_writer *w, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return kiln_safetensors_writer_set_metadata(w, key, buf);
}

kiln_status kiln_quant_save(kiln_gpt *m, kiln_quant_type type, int64_t group, const char *path) {
    if (!m || !path)
        return kiln_error_setf(KILN_ERR_ARG, "quantize: NULL argument");
    KILN_CHECK(kiln_gpt_require_family(kiln_gpt_get_config(m), KILN_FAMILY_GPT2, "quantization"));
    if (type != KILN_QUANT_INT8 && type != KILN_QUANT_INT4)
        return kiln_error_setf(KILN_ERR_ARG, "quantize: type %d is not int8 or int4", (int)type);
    if (kiln_gpt_dtype(m) != KILN_DTYPE_F32)
        return kiln_error_setf(KILN_ERR_ARG, "quantize: the model must be held in fp32");
    if (kiln_gpt_has_linear(m))
        return kiln_error_setf(KILN_ERR_ARG, "quantize: the model is quantized already");
    const kiln_gpt_config *cfg = kiln_gpt_get_config(m);
    for (int k = 0; k < 4; k++)
        if (cfg->rank[k])
            return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                                   "quantize: the model is factored (low rank): quantize the "
                                   "dense weights it was made from");
    int64_t G = type == KILN_QUANT_INT4 ? (group ? group : 32) : 0;
    int64_t A = kiln_gpt_config_attn_width(cfg), H = kiln_gpt_config_mlp_width(cfg);
    if (type == KILN_QUANT_INT4 &&
        (G < 8 || G > 4096 || G % 8 || cfg->n_embd % G || A % G || H % G))
        return kiln_error_setf(KILN_ERR_ARG,
                               "--group %lld: int4 groups must be a multiple of 8 (at most 4096) "
                               "that divides each matrix's inputs: the model's n_embd %lld, its "
                               "attention width %lld and its MLP width %lld",
                               (long long)G, (long long)cfg->n_embd, (long long)A, (long long)H);
    KILN_CHECK(kiln_gpt_check_finite(m));
    const float *slab = kiln_gpt_params(m);
    int nt = kiln_gpt_num_tensors(m);
    void **bufs = calloc((size_t)nt * 2, sizeof *bufs); /* each matrix's q and scales */
    char(*names)[80] = calloc((size_t)nt, sizeof *names);
    kiln_safetensors_writer *w = NULL;
    kiln_status s = KILN_OK;
    if (!bufs || !names) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "quantize: no memory");
        goto done;
    }
    KILN_CHECK_GOTO(s, kiln_safetensors_writer_init(&w), done);
    KILN_CHECK_GOTO(s, kiln_safetensors_writer_set_metadata(w, "format", "pt"), done);
    const int64_t vals[] = {cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size,
                            cfg->max_seq_len};
    for (int k = 0; k < 5; k++)
        KILN_CHECK_GOTO(s, set_meta_int(w, config_keys[k], vals[k]), done);
    KILN_CHECK_GOTO(
        s, kiln_safetensors_writer_set_metadata(w, KILN_ST_META_QUANT, kiln_quant_type_name(type)),
        done);
    KILN_CHECK_GOTO(s, set_meta_int(w, KILN_ST_META_QUANT_VERSION, KILN_QUANT_VERSION), done);
    if (G)
        KILN_CHECK_GOTO(s, set_meta_int(w, KILN_ST_META_QUANT_GROUP, G), done);
    if (cfg->share_layers > 1) /* the tensors hold n_layer / share blocks */
        KILN_CHECK_GOTO(s, set_meta_int(w, "kiln.share_layers", cfg->share_layers), done);
    if (cfg->head_size) /* narrower heads (structured pruning) */
        KILN_CHECK_GOTO(s, set_meta_int(w, "kiln.head_size", cfg->head_size), done);
    if (cfg->mlp_hidden)
        KILN_CHECK_GOTO(s, set_meta_int(w, "kiln.mlp_hidden", cfg->mlp_hidden), done);
    for (int i = 0; i < nt; i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        const float *src = slab + t->offset;
        if (!kiln_quant_is_matrix(t->name)) {
            KILN_CHECK_GOTO(s,
                            kiln_safetensors_writer_add_as(w, t->name, KILN_DTYPE_F32, t->ndim,
                                                           t->shape, KILN_DTYPE_F32, src),
                            done);
            continue;
        }
        int trans = !strcmp(t->name, "wte.weight"); /* (V,C): already (out, in) */
        int64_t K = trans ? t->shape[1] : t->shape[0], N = trans ? t->shape[0] : t->shape[1];
        int64_t groups = G ? K / G : 1;
        bufs[2 * i] = malloc((size_t)(N * K) / (G ? 2 : 1));
        bufs[2 * i + 1] = malloc((size_t)(N * groups) * sizeof(float));
        if (!bufs[2 * i] || !bufs[2 * i + 1]) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "quantize: no memory for %s", t->name);
            goto done;
        }
        if (G)
            KILN_CHECK_GOTO(s, kiln_quant_int4(bufs[2 * i], bufs[2 * i + 1], src, K, N, G, trans),
                            done);
        else
            kiln_quant_int8(bufs[2 * i], bufs[2 * i + 1], src, K, N, trans);
        int64_t qshape[2] = {N, G ? K / 2 : K}, sshape[2] = {N, groups};
        snprintf(names[i], sizeof names[i], "%s_scale", t->name);
        KILN_CHECK_GOTO(s,
                        kiln_safetensors_writer_add(w, t->name,
                                                    G ? KILN_ST_DTYPE_U8 : KILN_ST_DTYPE_I8, 2,
                                                    qshape, bufs[2 * i]),
                        done);
        KILN_CHECK_GOTO(s,
                        kiln_safetensors_writer_add(w, names[i], KILN_ST_DTYPE_F32, G ? 2 : 1,
                                                    sshape, bufs[2 * i + 1]),
                        done);
    }
    s = kiln_safetensors_writer_write(w, path);
done:
    kiln_safetensors_writer_free(w);
    for (int i = 0; bufs && i < 2 * nt; i++)
        free(bufs[i]);
    free(bufs);
    free(names);
    if (s)
        return kiln_error_wrapf(s, "writing the %s model %s", kiln_quant_type_name(type), path);
    return KILN_OK;
}

kiln_status kiln_quant_probe(const char *path, kiln_quant_type *type, int64_t *group) {
    if (!path || !type)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_quant_probe: NULL argument");
    kiln_safetensors *f = NULL;
    KILN_CHECK(kiln_safetensors_open(&f, path));
    const char *q = kiln_safetensors_metadata(f, KILN_ST_META_QUANT);
    const char *g = kiln_safetensors_metadata(f, KILN_ST_META_QUANT_GROUP);
    kiln_status s = KILN_OK;
    *type = KILN_QUANT_NONE;
    if (group)
        *group = 0;
    if (q && kiln_quant_type_parse(q, type) != KILN_OK)
        s = kiln_error_setf(KILN_ERR_FORMAT,
                            "%s: metadata \"%s\" is \"%s\": a quantization this kiln does not know",
                            path, KILN_ST_META_QUANT, q);
    const char *ver = kiln_safetensors_metadata(f, KILN_ST_META_QUANT_VERSION);
    if (!s && *type != KILN_QUANT_NONE && ver) { /* none: version 1, which did not record it */
        char *end = NULL;
        long long v = strtoll(ver, &end, 10);
        if (!ver[0] || *end || v < 1)
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: metadata \"%s\" is \"%s\": not a version",
                                path, KILN_ST_META_QUANT_VERSION, ver);
        else if (v > KILN_QUANT_VERSION)
            s = kiln_error_setf(KILN_ERR_UNSUPPORTED,
                                "%s: a quantized model of format version %lld, written by a newer "
                                "kiln (this one reads version %d and older): quantize the dense "
                                "model again with this kiln, or use the newer one",
                                path, v, KILN_QUANT_VERSION);
    }
    if (!s && *type == KILN_QUANT_INT4) {
        char *end = NULL;
        long long v = g ? strtoll(g, &end, 10) : 0;
        if (!g || !g[0] || *end || v < 8 || v > 4096 || v % 8)
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: metadata \"%s\" is %s%s%s: not a group size",
                                path, KILN_ST_META_QUANT_GROUP, g ? "\"" : "missing", g ? g : "",
                                g ? "\"" : "");
        else if (group)
            *group = v;
    }
    kiln_safetensors_close(f);
    return s;
}
