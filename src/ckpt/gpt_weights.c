/* GPT-2 weights as safetensors with Hugging Face's tensor names.
 *
 * Saving writes every tensor of the model's table (model.h) in the dtype asked, converted
 * from the slab as it is written, with kiln's configuration and that dtype in __metadata__. Loading
 * first matches every tensor of the file against the table (name, dtype, shape; nothing missing,
 * nothing unexpected) and only then copies, so a file that does not fit leaves the model as it was.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/checkpoint.h"
#include "kiln/safetensors.h"

#define HF_PREFIX "transformer."

static const struct {
    const char *key;
    size_t field;  /* offset in kiln_gpt_config */
    int in_shapes; /* 1: the tensor shapes tell this value too */
} meta_keys[] = {
    {"kiln.n_layer", offsetof(kiln_gpt_config, n_layer), 1},
    {"kiln.n_head", offsetof(kiln_gpt_config, n_head), 0},
    {"kiln.n_embd", offsetof(kiln_gpt_config, n_embd), 1},
    {"kiln.vocab_size", offsetof(kiln_gpt_config, vocab_size), 1},
    {"kiln.max_seq_len", offsetof(kiln_gpt_config, max_seq_len), 1},
};
#define N_META_KEYS (int)(sizeof meta_keys / sizeof meta_keys[0])

/* Factored block matrices (kiln_gpt_config.rank, kiln_gpt_matrix's order): the metadata key
 * "kiln.rank.<kind>" and the matrix, whose "<name>.weight_u" is (in, rank). */
static const struct {
    const char *kind, *name;
} rank_kinds[4] = {{"qkv", "attn.c_attn"},
                   {"attproj", "attn.c_proj"},
                   {"fc", "mlp.c_fc"},
                   {"fcproj", "mlp.c_proj"}};

static int64_t *config_field(kiln_gpt_config *c, int k) {
    return (int64_t *)((char *)c + meta_keys[k].field);
}

/* A model of another family than GPT-2 records its whole description: the shapes alone do not
 * tell the norms' epsilon, the rotary base or the head count. */
static kiln_status put_arch_meta(kiln_safetensors_writer *w, const kiln_gpt_config *c) {
    char v[5][40];
    snprintf(v[0], sizeof v[0], "%lld", (long long)kiln_gpt_config_kv_heads(c));
    snprintf(v[1], sizeof v[1], "%lld", (long long)kiln_gpt_config_head_size(c));
    snprintf(v[2], sizeof v[2], "%lld", (long long)kiln_gpt_config_mlp_width(c));
    /* the configuration's doubles, exactly (the defaults resolved) */
    snprintf(v[3], sizeof v[3], "%.17g", c->norm_eps > 0.0 ? c->norm_eps : 1e-5);
    snprintf(v[4], sizeof v[4], "%.17g", c->rope_theta > 0.0 ? c->rope_theta : 10000.0);
    const char *kv[] = {"kiln.family",      kiln_family_name(c->family),
                        "kiln.n_kv_head",   v[0],
                        "kiln.head_size",   v[1],
                        "kiln.mlp_hidden",  v[2],
                        "kiln.norm_eps",    v[3],
                        "kiln.rope_theta",  v[4],
                        "kiln.untied_head", c->untied_head ? "1" : "0"};
    kiln_status s = KILN_OK;
    for (size_t k = 0; s == KILN_OK && k < sizeof kv / sizeof kv[0]; k += 2)
        s = kiln_safetensors_writer_set_metadata(w, kv[k], kv[k + 1]);
    return s;
}

kiln_status kiln_gpt_save_slab(kiln_gpt *m, const char *path, const void *slab,
                               kiln_dtype slab_dtype, kiln_dtype save_dtype) {
    return kiln_gpt_save_slab_meta(m, path, slab, slab_dtype, save_dtype, NULL);
}

kiln_status kiln_gpt_save_slab_meta(kiln_gpt *m, const char *path, const void *slab,
                                    kiln_dtype slab_dtype, kiln_dtype save_dtype,
                                    const char *const *meta) {
    if (!m || !path || !slab)
        return kiln_error_setf(KILN_ERR_ARG, "save weights: NULL argument");
    kiln_safetensors_writer *w = NULL;
    KILN_CHECK(kiln_safetensors_writer_init(&w));
    kiln_gpt_config cfg = *kiln_gpt_get_config(m);
    kiln_status s = kiln_safetensors_writer_set_metadata(w, "format", "pt");
    for (int k = 0; s == KILN_OK && k < N_META_KEYS; k++) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)*config_field(&cfg, k));
        s = kiln_safetensors_writer_set_metadata(w, meta_keys[k].key, v);
    }
    if (s == KILN_OK && cfg.family != KILN_FAMILY_GPT2)
        s = put_arch_meta(w, &cfg);
    if (s == KILN_OK && cfg.share_layers > 1) { /* the tensors hold n_layer / share blocks */
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)cfg.share_layers);
        s = kiln_safetensors_writer_set_metadata(w, "kiln.share_layers", v);
    }
    for (int k = 0; s == KILN_OK && k < 4; k++) { /* factored matrices: the tensors say it too */
        char key[32], v[32];
        if (!cfg.rank[k])
            continue;
        snprintf(key, sizeof key, "kiln.rank.%s", rank_kinds[k].kind);
        snprintf(v, sizeof v, "%lld", (long long)cfg.rank[k]);
        s = kiln_safetensors_writer_set_metadata(w, key, v);
    }
    for (int k = 0; s == KILN_OK && meta && meta[k] && meta[k + 1]; k += 2)
        s = kiln_safetensors_writer_set_metadata(w, meta[k], meta[k + 1]);
    if (s == KILN_OK)
        s = kiln_safetensors_writer_declare_dtype(w, save_dtype);
    /* converted as they are written, a chunk at a time: no copy of the model */
    size_t es = kiln_dtype_size(slab_dtype);
    for (int i = 0; s == KILN_OK && i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        s = kiln_safetensors_writer_add_as(w, t->name, save_dtype, t->ndim, t->shape, slab_dtype,
                                           (const char *)slab + (size_t)t->offset * es);
    }
    if (s == KILN_OK)
        s = kiln_safetensors_writer_write(w, path);
    kiln_safetensors_writer_free(w);
    if (s != KILN_OK)
        return kiln_error_wrapf(s, "saving model weights");
    return KILN_OK;
}

kiln_status kiln_gpt_save_safetensors(kiln_gpt *m, const char *path, kiln_dtype save_dtype) {
    if (!m)
        return kiln_error_setf(KILN_ERR_ARG, "save weights: NULL model");
    return kiln_gpt_save_slab(m, path, kiln_gpt_params(m), kiln_gpt_dtype(m), save_dtype);
}

/* The name without Hugging Face's "transformer." prefix. */
static const char *strip_prefix(const char *name) {
    size_t n = strlen(HF_PREFIX);
    return strncmp(name, HF_PREFIX, n) == 0 ? name + n : name;
}

/* Hugging Face's causal-mask buffers, "h.<i>.attn.bias" and "h.<i>.attn.masked_bias": not
 * parameters, ignored. */
static int is_mask_buffer(const char *name) {
    if (strncmp(name, "h.", 2) != 0)
        return 0;
    const char *p = name + 2;
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    return strcmp(p, ".attn.bias") == 0 || strcmp(p, ".attn.masked_bias") == 0;
}

static int is_float_dtype(kiln_st_dtype d) {
    return d == KILN_ST_DTYPE_F32 || d == KILN_ST_DTYPE_F16 || d == KILN_ST_DTYPE_BF16;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, ")");
}

static int same_shape(const kiln_st_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i])
            return 0;
    return 1;
}

static kiln_status check_tensor(const char *path, const kiln_st_tensor *t, int ndim,
                                const int64_t *shape) {
    if (!is_float_dtype(t->dtype))
        return kiln_error_setf(KILN_ERR_DTYPE, "%s: tensor \"%s\" is %s; expected F32, F16 or BF16",
                               path, t->name, kiln_st_dtype_name(t->dtype));
    if (!same_shape(t, ndim, shape)) {
        char want[96], got[96];
        format_shape(want, sizeof want, ndim, shape);
        format_shape(got, sizeof got, t->ndim, t->shape);
        return kiln_error_setf(KILN_ERR_SHAPE,
                               "%s: tensor \"%s\" has shape %s; the model expects %s", path,
                               t->name, got, want);
    }
    return KILN_OK;
}

/* An "lm_head.weight" is accepted only as a copy of the tied embedding. */
static kiln_status check_lm_head(const kiln_safetensors *f, const kiln_st_tensor *head,
                                 const kiln_st_tensor *wte) {
    const char *path = kiln_safetensors_path(f);
    KILN_CHECK(check_tensor(path, head, wte->ndim, wte->shape));
    int equal = 1;
    if (head->dtype == wte->dtype) {
        equal = memcmp(head->data, wte->data, wte->nbytes) == 0;
    } else {
        /* compare row by row after conversion */
        int64_t C = wte->shape[1], rows = wte->shape[0];
        float *a = malloc((size_t)C * 2 * sizeof(float));
        if (!a)
            return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to compare lm_head.weight", path);
        for (int64_t r = 0; r < rows && equal; r++) {
            size_t ea = kiln_st_dtype_size(head->dtype), eb = kiln_st_dtype_size(wte->dtype);
            kiln_st_tensor ra = *head, rb = *wte;
            ra.ndim = rb.ndim = 1;
            ra.shape[0] = rb.shape[0] = ra.numel = rb.numel = C;
            ra.nbytes = (size_t)C * ea;
            rb.nbytes = (size_t)C * eb;
            ra.data = (const char *)head->data + (size_t)(r * C) * ea;
            rb.data = (const char *)wte->data + (size_t)(r * C) * eb;
            kiln_safetensors_read_f32(f, &ra, a);
            kiln_safetensors_read_f32(f, &rb, a + C);
            equal = memcmp(a, a + C, (size_t)C * sizeof(float)) == 0;
        }
        free(a);
    }
    if (!equal)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "%s: \"%s\" differs from the token embedding %s, and this "
                               "model's output head is tied to it",
                               path, head->name, wte->name);
    return KILN_OK;
}

/* Match every tensor of the file to the model's table: src[i] is the file's tensor for the
 * model's tensor i. */
static kiln_status match_tensors(const kiln_gpt *m, const kiln_safetensors *f,
                                 const kiln_st_tensor **src) {
    const char *path = kiln_safetensors_path(f);
    const kiln_st_tensor *head = NULL;
    for (int k = 0; k < kiln_safetensors_num_tensors(f); k++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, k);
        const char *name = strip_prefix(t->name);
        if (is_mask_buffer(name))
            continue;
        if (strcmp(name, "lm_head.weight") == 0 && !kiln_gpt_get_config(m)->untied_head) {
            if (head)
                return kiln_error_setf(KILN_ERR_FORMAT, "%s: two lm_head.weight tensors", path);
            head = t;
            continue;
        }
        int i = kiln_gpt_find_tensor(m, name);
        if (i < 0)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: unexpected tensor \"%s\": not part of this %s model "
                                   "(%lld layers)",
                                   path, t->name, kiln_family_name(kiln_gpt_get_config(m)->family),
                                   (long long)kiln_gpt_get_config(m)->n_layer);
        if (src[i])
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%s\" appears twice (as \"%s\")",
                                   path, name, t->name);
        const kiln_tensor_info *info = kiln_gpt_tensor(m, i);
        KILN_CHECK(check_tensor(path, t, info->ndim, info->shape));
        src[i] = t;
    }
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++)
        if (!src[i])
            return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: tensor \"%s\" is missing", path,
                                   kiln_gpt_tensor(m, i)->name);
    if (head) /* the token embedding is the table's first tensor */
        KILN_CHECK(check_lm_head(f, head, src[0]));
    return KILN_OK;
}

/* A quantized model (kiln compress quantize; "kiln.quant" in its metadata) holds int8 or int4
 * matrices with scales: not weights a dense model can take. */
static kiln_status refuse_quantized(const kiln_safetensors *f) {
    const char *q = kiln_safetensors_metadata(f, "kiln.quant");
    if (!q)
        return KILN_OK;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                           "%s is a quantized model (%s): it is for kiln eval and kiln sample "
                           "only; training, --init and export need the dense weights it was "
                           "made from",
                           kiln_safetensors_path(f), q);
}

kiln_status kiln_gpt_load_slab(kiln_gpt *m, const char *path, void *slab, kiln_dtype slab_dtype) {
    if (!m || !path || !slab)
        return kiln_error_setf(KILN_ERR_ARG, "load weights: NULL argument");
    kiln_safetensors *f = NULL;
    KILN_CHECK(kiln_safetensors_open(&f, path));
    kiln_status q = refuse_quantized(f);
    if (q) {
        kiln_safetensors_close(f);
        return q;
    }
    int n = kiln_gpt_num_tensors(m);
    const kiln_st_tensor **src = calloc((size_t)n, sizeof *src);
    kiln_status s = KILN_OK;
    if (!src) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to match tensors", path);
        goto done;
    }
    /* Everything is checked before anything is copied: the dtypes agree with the file's
     * declared dtype, every tensor is there with its shape, every value fits slab_dtype. */
    KILN_CHECK_GOTO(s, kiln_safetensors_check_dtype(f, NULL, NULL), done);
    KILN_CHECK_GOTO(s, match_tensors(m, f, src), done);
    for (int i = 0; i < n; i++)
        KILN_CHECK_GOTO(s, kiln_safetensors_check_fits(f, src[i], slab_dtype), done);
    size_t es = kiln_dtype_size(slab_dtype);
    for (int i = 0; i < n; i++)
        KILN_CHECK_GOTO(s,
                        kiln_safetensors_read_as(f, src[i], slab_dtype,
                                                 (char *)slab + kiln_gpt_tensor(m, i)->offset * es),
                        done);
    /* The padded rows of the embedding (V..Vp-1), and of an untied head, hold nothing and
     * must be zero. */
    const kiln_gpt_config *cfg = kiln_gpt_get_config(m);
    int64_t pad = (cfg->padded_vocab_size - cfg->vocab_size) * cfg->n_embd;
    for (int i = 0; i < n && pad > 0; i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        if (t->ndim == 2 && t->shape[0] == cfg->vocab_size && t->layer < 0 &&
            (i == 0 || !strcmp(t->name, "lm_head.weight")))
            memset((char *)slab + (t->offset + t->numel) * (int64_t)es, 0, (size_t)pad * es);
    }
done:
    free(src);
    kiln_safetensors_close(f);
    return s;
}

kiln_status kiln_gpt_load_safetensors(kiln_gpt *m, const char *path) {
    if (!m)
        return kiln_error_setf(KILN_ERR_ARG, "load weights: NULL model");
    return kiln_gpt_load_slab(m, path, kiln_gpt_params(m), kiln_gpt_dtype(m));
}

/* ---- configuration ---- */

static kiln_status parse_meta_int(const char *path, const char *key, const char *v, int64_t *out) {
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (!v[0] || *end || x < 1)
        return kiln_error_setf(
            KILN_ERR_FORMAT, "%s: metadata \"%s\" is \"%s\", not a positive integer", path, key, v);
    *out = x;
    return KILN_OK;
}

static const kiln_st_tensor *find_either(const kiln_safetensors *f, const char *name) {
    const kiln_st_tensor *t = kiln_safetensors_find(f, name);
    if (!t) {
        char full[96];
        snprintf(full, sizeof full, HF_PREFIX "%s", name);
        t = kiln_safetensors_find(f, full);
    }
    return t;
}

/* What the tensors say: V and C from wte, maxT from wpe, L from the highest block index, the
 * attention's and the MLP's widths from block 0. */
static kiln_status infer_config(const kiln_safetensors *f, kiln_gpt_config *c,
                                int64_t *attn_width) {
    const char *path = kiln_safetensors_path(f);
    const kiln_st_tensor *wte = find_either(f, "wte.weight"), *wpe = find_either(f, "wpe.weight");
    if (!wte || !wpe)
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: tensor \"%s\" is missing", path,
                               !wte ? "wte.weight" : "wpe.weight");
    if (wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1])
        return kiln_error_setf(
            KILN_ERR_SHAPE, "%s: wte.weight and wpe.weight should be (V, C) and (maxT, C)", path);
    c->vocab_size = wte->shape[0];
    c->n_embd = wte->shape[1];
    c->max_seq_len = wpe->shape[0];
    int64_t layers = 0;
    for (int k = 0; k < kiln_safetensors_num_tensors(f); k++) {
        const char *name = strip_prefix(kiln_safetensors_tensor(f, k)->name);
        if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9')
            continue;
        long long l = strtoll(name + 2, NULL, 10);
        if (l >= 0 && l < (1 << 20) && l + 1 > layers)
            layers = l + 1;
    }
    c->n_layer = layers;
    /* the attention's width A and the MLP's H from block 0 (c_attn (C,3A), c_fc (C,H), or
     * their V factors (r,3A), (r,H)); the heads' width follows once n_head is known */
    const kiln_st_tensor *qkv = find_either(f, "h.0.attn.c_attn.weight");
    const kiln_st_tensor *fc = find_either(f, "h.0.mlp.c_fc.weight");
    if (!qkv)
        qkv = find_either(f, "h.0.attn.c_attn.weight_v");
    if (!fc)
        fc = find_either(f, "h.0.mlp.c_fc.weight_v");
    if (qkv && (qkv->ndim != 2 || qkv->shape[1] % 3 != 0 || qkv->shape[1] < 3))
        return kiln_error_setf(
            KILN_ERR_SHAPE, "%s: h.0.attn.c_attn.weight should be (C, 3 x attention width)", path);
    if (fc && (fc->ndim != 2 || fc->shape[1] < 1))
        return kiln_error_setf(KILN_ERR_SHAPE, "%s: h.0.mlp.c_fc.weight should be (C, H)", path);
    *attn_width = qkv ? qkv->shape[1] / 3 : c->n_embd;
    c->mlp_hidden = fc ? fc->shape[1] : 0;
    /* a factored matrix: its rank from block 0's U (in, r), checked against the metadata */
    for (int k = 0; k < 4; k++) {
        char name[64], key[32];
        snprintf(name, sizeof name, "h.0.%s.weight_u", rank_kinds[k].name);
        snprintf(key, sizeof key, "kiln.rank.%s", rank_kinds[k].kind);
        const kiln_st_tensor *u = find_either(f, name);
        const char *v = kiln_safetensors_metadata(f, key);
        c->rank[k] = u && u->ndim == 2 ? u->shape[1] : 0;
        int64_t said = 0;
        if (v)
            KILN_CHECK(parse_meta_int(path, key, v, &said));
        if (v && said != c->rank[k])
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: metadata says %s is %lld but the tensors say %lld", path,
                                   key, (long long)said, (long long)c->rank[k]);
    }
    return KILN_OK;
}

/* The bytes of a file's tensors: every parameter takes 2 at least (F16, BF16). */
static uint64_t tensor_bytes(const kiln_safetensors *f) {
    uint64_t have = 0;
    for (int k = 0; k < kiln_safetensors_num_tensors(f); k++)
        have += kiln_safetensors_tensor(f, k)->nbytes;
    return have;
}

/* Before a caller allocates the model: a small file whose names claim many large layers
 * would otherwise cost gigabytes before the load finds the tensors missing. */
static kiln_status check_enough(const char *path, uint64_t have, const kiln_gpt_config *c) {
    if (have >= 2 * (uint64_t)kiln_gpt_config_num_params(c))
        return KILN_OK;
    return kiln_error_setf(KILN_ERR_FORMAT,
                           "%s: its tensors hold %llu bytes, too few for the %lld parameters "
                           "of the model they describe (%lld layers, n_embd %lld)",
                           path, (unsigned long long)have, (long long)kiln_gpt_config_num_params(c),
                           (long long)c->n_layer, (long long)c->n_embd);
}

/* A metadata value as a number (kiln.norm_eps, kiln.rope_theta, kiln.untied_head). */
static kiln_status parse_meta_real(const char *path, const char *key, const char *v, double *out) {
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || !v[0] || *end || !(x >= 0.0 && x <= 1e12))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: metadata \"%s\" is %s%s%s, not a number", path,
                               key, v ? "\"" : "", v ? v : "missing", v ? "\"" : "");
    *out = x;
    return KILN_OK;
}

/* A Llama's configuration (its tensors are model.embed_tokens.weight, ...): kiln's metadata,
 * or Hugging Face's config.json in the file's folder. The tensors' shapes are checked against
 * it when the weights load. */
static kiln_status llama_config(const kiln_safetensors *f, kiln_gpt_config *c) {
    const char *path = kiln_safetensors_path(f);
    const char *fam = kiln_safetensors_metadata(f, "kiln.family");
    if (!fam) {
        char json[4096];
        const char *slash = strrchr(path, '/');
        int dir = slash ? (int)(slash - path) : 1;
        snprintf(json, sizeof json, "%.*s/config.json", dir, slash ? path : ".");
        kiln_status s = kiln_gpt_config_from_json(c, json);
        if (s)
            return kiln_error_wrapf(s,
                                    "%s holds a Llama model without kiln's metadata: its "
                                    "configuration is read from config.json beside it",
                                    path);
        const kiln_st_tensor *e = kiln_safetensors_find(f, "model.embed_tokens.weight");
        if (c->vocab_size == 0 && e->ndim == 2)
            c->vocab_size = e->shape[0];
        return KILN_OK;
    }
    if (strcmp(fam, "llama"))
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: metadata kiln.family is \"%s\" but its "
                               "tensors are a Llama's",
                               path, fam);
    kiln_gpt_config_family(c, "llama");
    static const char *const ints[] = {"kiln.n_kv_head", "kiln.head_size", "kiln.mlp_hidden"};
    int64_t *fields[] = {&c->n_kv_head, &c->head_size, &c->mlp_hidden};
    for (int k = 0; k < N_META_KEYS; k++) {
        const char *v = kiln_safetensors_metadata(f, meta_keys[k].key);
        if (!v)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: kiln metadata lacks %s", path,
                                   meta_keys[k].key);
        KILN_CHECK(parse_meta_int(path, meta_keys[k].key, v, config_field(c, k)));
    }
    for (int k = 0; k < 3; k++) {
        const char *v = kiln_safetensors_metadata(f, ints[k]);
        if (!v)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: kiln metadata lacks %s", path, ints[k]);
        KILN_CHECK(parse_meta_int(path, ints[k], v, fields[k]));
    }
    double untied = 0.0;
    KILN_CHECK(parse_meta_real(path, "kiln.norm_eps", kiln_safetensors_metadata(f, "kiln.norm_eps"),
                               &c->norm_eps));
    KILN_CHECK(parse_meta_real(path, "kiln.rope_theta",
                               kiln_safetensors_metadata(f, "kiln.rope_theta"), &c->rope_theta));
    KILN_CHECK(parse_meta_real(path, "kiln.untied_head",
                               kiln_safetensors_metadata(f, "kiln.untied_head"), &untied));
    c->untied_head = untied != 0.0;
    /* shared blocks: kiln.n_layer counts layers, the tensors blocks (validation checks both) */
    const char *share = kiln_safetensors_metadata(f, "kiln.share_layers");
    if (share)
        KILN_CHECK(parse_meta_int(path, "kiln.share_layers", share, &c->share_layers));
    return KILN_OK;
}

kiln_status kiln_gpt_config_from_safetensors(kiln_gpt_config *cfg, const char *path) {
    if (!cfg || !path)
        return kiln_error_setf(KILN_ERR_ARG, "config from weights: NULL argument");
    kiln_safetensors *f = NULL;
    KILN_CHECK(kiln_safetensors_open(&f, path));
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    int64_t A = 0;
    kiln_status s = refuse_quantized(f);
    if (s == KILN_OK && kiln_safetensors_find(f, "model.embed_tokens.weight")) {
        s = llama_config(f, &c);
        uint64_t have = tensor_bytes(f);
        kiln_safetensors_close(f);
        if (s == KILN_OK && (s = kiln_gpt_config_validate(&c)) != KILN_OK)
            s = kiln_error_wrapf(s, "%s", path);
        if (s == KILN_OK && (s = check_enough(path, have, &c)) == KILN_OK)
            *cfg = c;
        return s;
    }
    if (s == KILN_OK)
        s = infer_config(f, &c, &A);
    /* shared blocks: the tensors count blocks, each serving share_layers layers */
    const char *share = kiln_safetensors_metadata(f, "kiln.share_layers");
    if (s == KILN_OK && share &&
        (s = parse_meta_int(path, "kiln.share_layers", share, &c.share_layers)) == KILN_OK &&
        c.share_layers > 1) {
        if (c.share_layers > 1024)
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: kiln.share_layers %lld is beyond 1024", path,
                                (long long)c.share_layers);
        c.n_layer *= c.share_layers > 1024 ? 1 : c.share_layers;
    }
    int present = 0;
    for (int k = 0; s == KILN_OK && k < N_META_KEYS; k++) {
        const char *v = kiln_safetensors_metadata(f, meta_keys[k].key);
        if (!v)
            continue;
        present++;
        int64_t x = 0, inferred = *config_field(&c, k);
        s = parse_meta_int(path, meta_keys[k].key, v, &x);
        if (s == KILN_OK && meta_keys[k].in_shapes && x != inferred)
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: metadata says %s is %lld but the tensors say %lld", path,
                                meta_keys[k].key, (long long)x, (long long)inferred);
        *config_field(&c, k) = x;
    }
    if (s == KILN_OK && present && present != N_META_KEYS)
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: kiln metadata is incomplete (%d of %d keys)",
                            path, present, N_META_KEYS);
    uint64_t have = tensor_bytes(f);
    kiln_safetensors_close(f);
    if (s != KILN_OK)
        return s;
    if (!present) {
        /* Hugging Face files do not record the head count: the caller's, or GPT-2's 64
         * channels per head. */
        c.n_head = cfg->n_head > 0 ? cfg->n_head : A % 64 == 0 ? A / 64 : 0;
        if (c.n_head == 0)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "%s does not record n_head, and the attention width %lld is "
                                   "not a multiple of GPT-2's 64 channels per head: give the "
                                   "head count",
                                   path, (long long)A);
    }
    if (c.n_head < 1 || A % c.n_head != 0)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s: n_head %lld does not divide the attention width %lld "
                               "(h.0.attn.c_attn.weight is (C, 3 x width))",
                               path, (long long)c.n_head, (long long)A);
    c.head_size = A / c.n_head; /* validate keeps it 0 when it is n_embd / n_head */
    s = kiln_gpt_config_validate(&c);
    if (s != KILN_OK)
        return kiln_error_wrapf(s, "%s", path);
    KILN_CHECK(check_enough(path, have, &c));
    *cfg = c;
    return KILN_OK;
}
