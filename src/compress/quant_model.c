/* Inference on a quantized file (include/kiln/compress.h): an fp32 inference model whose
 * block matrices and head are products of the int8 kernel (src/backend/cpu/gemm_int8.h),
 * hooked in with kiln_gpt_set_linear. The dense tensors (biases, LayerNorms, wpe) load into
 * the model's slab; wte's rows too, dequantized, for the embedding. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemm_int8.h"
#include "core/error.h"
#include "kiln/compress.h"
#include "kiln/safetensors.h"

typedef struct quant_model {
    int64_t L;
    kiln__qmat *mats; /* [4L + 1]: block l's c_attn, attn.c_proj, c_fc, mlp.c_proj at 4l.., the
                         head last */
    kiln__qact act;   /* rows B x T, the widest matrix's inputs */
    kiln__qws ws;     /* int4 only */
} quant_model;

static void quant_model_free(void *p) {
    quant_model *q = p;
    if (!q)
        return;
    for (int64_t i = 0; q->mats && i < 4 * q->L + 1; i++)
        kiln__qmat_free(&q->mats[i]);
    free(q->mats);
    kiln__qact_free(&q->act);
    kiln__qws_free(&q->ws);
    free(q);
}

static void quant_model_forward(void *ctx, int64_t layer, kiln_gpt_matrix which, float *out,
                                const float *inp, const float *bias, int64_t N, int64_t C,
                                int64_t OC) {
    quant_model *q = ctx;
    const kiln__qmat *w =
        which == KILN_GPT_MATRIX_HEAD ? &q->mats[4 * q->L] : &q->mats[4 * layer + (int)which];
    (void)C; /* w->K, checked at load */
    (void)OC;
    kiln__qgemm(out, w->N, inp, w, bias, N, &q->act, q->ws.buf ? &q->ws : NULL);
}

/* The configuration from kiln's metadata keys, all of which a quantized file carries. */
static kiln_status read_config(const kiln_safetensors *f, kiln_gpt_config *cfg) {
    static const char *const keys[] = {"kiln.n_layer", "kiln.n_head", "kiln.n_embd",
                                       "kiln.vocab_size", "kiln.max_seq_len"};
    int64_t *fields[] = {&cfg->n_layer, &cfg->n_head, &cfg->n_embd, &cfg->vocab_size,
                         &cfg->max_seq_len};
    const char *path = kiln_safetensors_path(f);
    memset(cfg, 0, sizeof *cfg);
    for (int k = 0; k < 5; k++) {
        const char *v = kiln_safetensors_metadata(f, keys[k]);
        char *end = NULL;
        long long x = v ? strtoll(v, &end, 10) : 0;
        if (!v || !v[0] || *end || x < 1)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: metadata \"%s\" is %s: a quantized file "
                                   "records the configuration",
                                   path, keys[k], v ? v : "missing");
        *fields[k] = x;
    }
    static const char *const optional[] = {"kiln.share_layers", "kiln.head_size",
                                           "kiln.mlp_hidden"};
    int64_t *ofields[] = {&cfg->share_layers, &cfg->head_size, &cfg->mlp_hidden};
    const long long omax[] = {1024, 65536, 4 * 65536};
    for (int k = 0; k < 3; k++) {
        const char *v = kiln_safetensors_metadata(f, optional[k]);
        if (!v)
            continue;
        char *end = NULL;
        long long x = strtoll(v, &end, 10);
        if (!v[0] || *end || x < 1 || x > omax[k])
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: metadata \"%s\" is %s", path, optional[k],
                                   v);
        *ofields[k] = x;
    }
    kiln_status s = kiln_gpt_config_validate(cfg);
    return s ? kiln_error_wrapf(s, "%s", path) : KILN_OK;
}

/* A file holds at least the bytes of the model its metadata describes (every parameter, a
 * matrix's at half a byte for int4): checked before the model is allocated, so that a few
 * digits of metadata cannot make a small file claim a model of many gigabytes. */
static kiln_status check_size(const kiln_safetensors *f, const kiln_gpt_config *cfg, int64_t G) {
    uint64_t have = 0, need = (uint64_t)kiln_gpt_config_num_params(cfg) / (G ? 2 : 1);
    for (int i = 0; i < kiln_safetensors_num_tensors(f); i++)
        have += kiln_safetensors_tensor(f, i)->nbytes;
    if (have < need)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: its tensors hold %llu bytes, too few for the %lld parameters "
                               "of the model its metadata describes (%lld layers, n_embd %lld, "
                               "vocabulary %lld, context %lld)",
                               kiln_safetensors_path(f), (unsigned long long)have,
                               (long long)kiln_gpt_config_num_params(cfg), (long long)cfg->n_layer,
                               (long long)cfg->n_embd, (long long)cfg->vocab_size,
                               (long long)cfg->max_seq_len);
    return KILN_OK;
}

static kiln_status want(const char *path, const kiln_st_tensor *t, const char *name,
                        kiln_st_dtype dtype, int ndim, int64_t d0, int64_t d1) {
    if (!t)
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: tensor \"%s\" is missing", path, name);
    if (t->dtype != dtype || t->ndim != ndim || t->shape[0] != d0 ||
        (ndim == 2 && t->shape[1] != d1))
        return kiln_error_setf(KILN_ERR_SHAPE,
                               "%s: tensor \"%s\" is %s with %d dimensions (%lld, ...); the "
                               "quantized model expects %s (%lld%s%lld)",
                               path, name, kiln_st_dtype_name(t->dtype), t->ndim,
                               (long long)(t->ndim ? t->shape[0] : 0), kiln_st_dtype_name(dtype),
                               (long long)d0, ndim == 2 ? ", " : "", ndim == 2 ? (long long)d1 : 0);
    return KILN_OK;
}

/* Matrix `info` from the file into *w; wte also dequantized into dst (its (V,C) rows). */
static kiln_status load_matrix(const kiln_safetensors *f, const kiln_tensor_info *info,
                               kiln__qmat *w, int64_t G, int64_t Vp, float *dst) {
    const char *path = kiln_safetensors_path(f);
    int head = !strcmp(info->name, "wte.weight");
    int64_t K = head ? info->shape[1] : info->shape[0], N = head ? info->shape[0] : info->shape[1];
    int64_t groups = G ? K / G : 1;
    char sname[96];
    snprintf(sname, sizeof sname, "%s_scale", info->name);
    const kiln_st_tensor *q = kiln_safetensors_find(f, info->name);
    const kiln_st_tensor *sc = kiln_safetensors_find(f, sname);
    KILN_CHECK(
        want(path, q, info->name, G ? KILN_ST_DTYPE_U8 : KILN_ST_DTYPE_I8, 2, N, G ? K / 2 : K));
    KILN_CHECK(want(path, sc, sname, KILN_ST_DTYPE_F32, G ? 2 : 1, N, groups));
    float *scale = malloc((size_t)(N * groups) * sizeof *scale);
    if (!scale)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the scales of %s", info->name);
    kiln_status s = kiln_safetensors_read_f32(f, sc, scale);
    if (!s)
        s = kiln__qmat_pack(w, q->data, scale, N, head ? Vp : N, K, G ? 4 : 8, G);
    if (!s && head) {
        if (G)
            kiln_dequant_int4(dst, q->data, scale, N, K, G);
        else
            kiln_dequant_int8(dst, q->data, scale, N, K);
    }
    free(scale);
    return s ? kiln_error_wrapf(s, "%s: tensor \"%s\"", path, info->name) : KILN_OK;
}

/* Index in quant_model.mats of a matrix tensor's name. */
static int64_t matrix_index(const char *name, int64_t L) {
    if (!strcmp(name, "wte.weight"))
        return 4 * L;
    long long l = strtoll(name + 2, NULL, 10);
    int which = strstr(name, ".attn.c_attn.")   ? 0
                : strstr(name, ".attn.c_proj.") ? 1
                : strstr(name, ".mlp.c_fc.")    ? 2
                                                : 3;
    return 4 * l + which;
}

static kiln_status load_all(kiln_gpt *m, quant_model *q, const kiln_safetensors *f, int64_t G) {
    const char *path = kiln_safetensors_path(f);
    const kiln_gpt_config *cfg = kiln_gpt_get_config(m);
    float *slab = kiln_gpt_params(m);
    int expected = 0;
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *info = kiln_gpt_tensor(m, i);
        if (kiln_quant_is_matrix(info->name)) {
            KILN_CHECK(load_matrix(f, info, &q->mats[matrix_index(info->name, q->L)], G,
                                   cfg->padded_vocab_size, slab + info->offset));
            expected += 2;
            continue;
        }
        const kiln_st_tensor *t = kiln_safetensors_find(f, info->name);
        KILN_CHECK(want(path, t, info->name, KILN_ST_DTYPE_F32, info->ndim, info->shape[0],
                        info->ndim == 2 ? info->shape[1] : 0));
        KILN_CHECK(kiln_safetensors_read_as(f, t, KILN_DTYPE_F32, slab + info->offset));
        expected++;
    }
    if (kiln_safetensors_num_tensors(f) != expected)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: %d tensors, but a quantized model of %lld layers has %d", path,
                               kiln_safetensors_num_tensors(f), (long long)cfg->n_layer, expected);
    return KILN_OK;
}

kiln_status kiln_quant_load(kiln_gpt **out, const char *path, int64_t B, int64_t T) {
    if (!out || !path)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_quant_load: NULL argument");
    *out = NULL;
    kiln_quant_type type;
    int64_t G = 0;
    KILN_CHECK(kiln_quant_probe(path, &type, &G));
    if (type == KILN_QUANT_NONE)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s is not a quantized model (no \"%s\")", path,
                               KILN_ST_META_QUANT);
    kiln_safetensors *f = NULL;
    kiln_gpt *m = NULL;
    quant_model *q = NULL;
    kiln_gpt_config cfg;
    kiln_status s;
    KILN_CHECK(kiln_safetensors_open(&f, path));
    KILN_CHECK_GOTO(s, read_config(f, &cfg), fail);
    if (G && (cfg.n_embd % G || kiln_gpt_config_attn_width(&cfg) % G ||
              kiln_gpt_config_mlp_width(&cfg) % G)) {
        s = kiln_error_setf(KILN_ERR_FORMAT,
                            "%s: int4 groups of %lld do not divide n_embd %lld, the attention "
                            "width %lld and the MLP width %lld",
                            path, (long long)G, (long long)cfg.n_embd,
                            (long long)kiln_gpt_config_attn_width(&cfg),
                            (long long)kiln_gpt_config_mlp_width(&cfg));
        goto fail;
    }
    KILN_CHECK_GOTO(s, check_size(f, &cfg, G), fail);
    if (T <= 0 || T > cfg.max_seq_len)
        T = cfg.max_seq_len;
    KILN_CHECK_GOTO(s, kiln_gpt_create_inference(&m, &cfg, B, T, KILN_DTYPE_F32, NULL), fail);
    q = calloc(1, sizeof *q);
    if (q) {
        q->L = kiln_gpt_config_blocks(&cfg); /* blocks of weights (shared: fewer) */
        q->mats = calloc((size_t)(4 * q->L + 1), sizeof *q->mats);
    }
    if (!q || !q->mats) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "no memory for the quantized matrices");
        goto fail;
    }
    KILN_CHECK_GOTO(s, load_all(m, q, f, G), fail);
    int64_t K = cfg.n_embd; /* the widest input of a product */
    if (kiln_gpt_config_attn_width(&cfg) > K)
        K = kiln_gpt_config_attn_width(&cfg);
    if (kiln_gpt_config_mlp_width(&cfg) > K)
        K = kiln_gpt_config_mlp_width(&cfg);
    int64_t Kp = G ? K : (K + 3) / 4 * 4;
    KILN_CHECK_GOTO(s, kiln__qact_init(&q->act, B * T, Kp, G ? K / G : 1), fail);
    if (G)
        KILN_CHECK_GOTO(s, kiln__qws_init(&q->ws, Kp, omp_get_max_threads()), fail);
    KILN_CHECK_GOTO(s, kiln_gpt_set_linear(m, quant_model_forward, q, quant_model_free), fail);
    kiln_safetensors_close(f);
    *out = m;
    return KILN_OK;
fail:
    quant_model_free(q);
    kiln_gpt_free(m);
    kiln_safetensors_close(f);
    return s;
}

const char *kiln_quant_kernel_name(void) {
    return kiln__qgemm_kernel_name();
}
