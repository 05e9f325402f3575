/* GGUF export (include/kiln/compress.h): GGUF version 3, little-endian.
 *
 * The file: "GGUF", version, tensor count, key-value count; the key-values (a length-prefixed
 * key, a type, a value); the tensor infos (name, dimensions innermost first, ggml type, offset
 * into the data); padding to the alignment (32); the tensors' data, each at an aligned offset.
 * llama.cpp's "gpt2" architecture reads: token_embd (V rows of C), position_embd, per block
 * attn_norm, attn_qkv, attn_output, ffn_norm, ffn_up, ffn_down (weights and biases), and
 * output_norm; the output matrix is the token embedding's (tied). A ggml matrix of dimensions
 * [in, out] holds `out` rows of `in` values: kiln's Conv1D matrices, (in, out) row-major, are
 * transposed; the embeddings' rows are already token- and position-major. Its "llama" reads
 * token_embd, per block attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
 * ffn_up, ffn_down (no biases), output_norm and, for an untied head, output; kiln's Llama
 * matrices are (out, in) already, and q and k are permuted for the rotation (rope_rows). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/compress.h"
#include "kiln/dtype.h"
#include "tok/tok_internal.h"

enum { GGUF_ALIGN = 32, QK = 32 };
enum { GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_STRING = 8, GGUF_ARRAY = 9 };
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q8_0 = 8 };

const char *kiln_gguf_type_name(kiln_gguf_type t) {
    static const char *names[] = {"f32", "f16", "q8_0", "q4_0"};
    return (unsigned)t < 4 ? names[t] : "?";
}

kiln_status kiln_gguf_type_parse(const char *name, kiln_gguf_type *out) {
    for (int t = 0; t < 4; t++)
        if (name && !strcmp(name, kiln_gguf_type_name((kiln_gguf_type)t))) {
            *out = (kiln_gguf_type)t;
            return KILN_OK;
        }
    return kiln_error_setf(KILN_ERR_ARG, "unknown GGUF type '%s': f32, f16, q8_0 or q4_0",
                           name ? name : "(null)");
}

/* ---- blocks ---- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static uint16_t get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

void kiln_quantize_q8_0(void *dst, const float *x, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 2 + QK, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        put_u16(b, kiln_f32_to_f16(d));
        for (int j = 0; j < QK; j++)
            b[2 + j] = (uint8_t)(int8_t)lrintf(x[j] * id);
    }
}

void kiln_dequantize_q8_0(float *y, const void *src, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 2 + QK, y += QK) {
        float d = kiln_f16_to_f32(get_u16(b));
        for (int j = 0; j < QK; j++)
            y[j] = d * (float)(int8_t)b[2 + j];
    }
}

/* 4-bit codes 0..15 standing for -8..7 times the scale; the scale's sign makes the value of
 * largest magnitude land on -8 exactly. Element j and j + 16 share byte j (low, high). */
void kiln_quantize_q4_0(void *dst, const float *x, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 2 + QK / 2, x += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_u16(b, kiln_f32_to_f16(d));
        for (int j = 0; j < QK / 2; j++) {
            int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + QK / 2] * id + 8.5f);
            lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
            hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
            b[2 + j] = (uint8_t)(lo | hi << 4);
        }
    }
}

void kiln_dequantize_q4_0(float *y, const void *src, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 2 + QK / 2, y += QK) {
        float d = kiln_f16_to_f32(get_u16(b));
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)((b[2 + j] & 15) - 8);
            y[j + QK / 2] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

/* ---- the header, in memory ---- */

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
    uint64_t nkv; /* key-values put */
    int oom;
} buf;

static void put(buf *b, const void *data, size_t n) {
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}
static void put32(buf *b, uint32_t v) {
    put(b, &v, 4);
} /* the host is little-endian */
static void put64(buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void put_str(buf *b, const char *s, size_t n) {
    put64(b, n);
    put(b, s, n);
}
static void kv_str(buf *b, const char *k, const char *v) {
    b->nkv++;
    put_str(b, k, strlen(k));
    put32(b, GGUF_STRING);
    put_str(b, v, strlen(v));
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    b->nkv++;
    put_str(b, k, strlen(k));
    put32(b, GGUF_U32);
    put32(b, v);
}
static void kv_f32(buf *b, const char *k, float v) {
    b->nkv++;
    put_str(b, k, strlen(k));
    put32(b, GGUF_F32);
    put(b, &v, 4);
}
static void kv_array(buf *b, const char *k, uint32_t type, uint64_t n) {
    b->nkv++;
    put_str(b, k, strlen(k));
    put32(b, GGUF_ARRAY);
    put32(b, type);
    put64(b, n);
}

/* GPT-2's byte-to-character alphabet: printable Latin-1 bytes stand for themselves, the
 * others for U+0100 onwards in byte order. UTF-8 of byte c's character into out; its length. */
static int byte_char(uint8_t c, char *out) {
    int cp = c;
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) {
        int k = 0;
        for (int x = 0; x < c; x++)
            k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A token's bytes in the alphabet, as a GGUF string. */
static void put_token(buf *b, const kiln_tokenizer *t, int32_t id) {
    const char *bytes = t->blob + t->off[id];
    size_t n = t->off[id + 1] - t->off[id];
    if (id == t->eot) { /* a control token keeps its text */
        put_str(b, bytes, n);
        return;
    }
    char tmp[2 * 1024];
    size_t len = 0;
    for (size_t i = 0; i < n && len + 2 <= sizeof tmp; i++)
        len += (size_t)byte_char((uint8_t)bytes[i], tmp + len);
    put_str(b, tmp, len);
}

/* The merge that makes each id (ids made by no merge: -1), from the pair map. */
static kiln_status merges_of(const kiln_tokenizer *t, int32_t (**pairs)[2]) {
    *pairs = malloc((size_t)t->n * sizeof **pairs);
    if (!*pairs)
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < t->n; i++)
        (*pairs)[i][0] = (*pairs)[i][1] = -1;
    for (uint64_t s = 0; t->pairs.keys && s <= t->pairs.mask; s++) {
        uint64_t k = t->pairs.keys[s];
        int32_t v = t->pairs.vals[s];
        if (k != TOK_PAIR_EMPTY && v >= 0 && v < t->n) {
            (*pairs)[v][0] = (int32_t)(k >> 32);
            (*pairs)[v][1] = (int32_t)(k & 0xFFFFFFFFu);
        }
    }
    return KILN_OK;
}

static void put_tokenizer(buf *b, const kiln_tokenizer *t, int32_t (*pairs)[2]) {
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    kv_str(b, "tokenizer.ggml.pre", "gpt-2");
    kv_array(b, "tokenizer.ggml.tokens", GGUF_STRING, (uint64_t)t->n);
    for (int32_t i = 0; i < t->n; i++)
        put_token(b, t, i);
    kv_array(b, "tokenizer.ggml.token_type", GGUF_I32, (uint64_t)t->n);
    for (int32_t i = 0; i < t->n; i++)
        put32(b, i == t->eot ? 3u : 1u); /* 3: control, 1: normal */
    uint64_t nm = 0;
    for (int32_t i = 0; i < t->n; i++)
        nm += pairs[i][0] >= 0;
    /* merges in the order they apply: a merged id's rank is its id */
    kv_array(b, "tokenizer.ggml.merges", GGUF_STRING, nm);
    for (int32_t i = 0; i < t->n; i++) {
        if (pairs[i][0] < 0)
            continue;
        buf one = {0};
        for (int side = 0; side < 2; side++) {
            int32_t id = pairs[i][side];
            const char *bytes = t->blob + t->off[id];
            for (uint32_t k = 0; k < t->off[id + 1] - t->off[id]; k++) {
                char c[2];
                put(&one, c, (size_t)byte_char((uint8_t)bytes[k], c));
            }
            if (side == 0)
                put(&one, " ", 1);
        }
        put_str(b, one.oom ? "" : (const char *)one.p, one.oom ? 0 : one.len);
        b->oom |= one.oom;
        free(one.p);
    }
    if (t->eot >= 0) {
        kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)t->eot);
        kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)t->eot);
    }
}

/* ---- tensors ---- */

typedef struct gguf_tensor {
    char name[64];
    int src;          /* the model's tensor */
    int transpose;    /* kiln's (in, out) into ggml's (out, in) rows */
    int64_t heads;    /* > 0: rows are this many heads, each permuted as rope_rows says */
    int64_t ne0, ne1; /* ggml's dimensions: ne0 innermost; ne1 1 for a vector */
    int type;         /* ggml type */
    uint64_t offset, bytes;
} gguf_tensor;

static uint64_t type_bytes(int type, int64_t n) {
    switch (type) {
    case GGML_F16: return (uint64_t)n * 2;
    case GGML_Q8_0: return (uint64_t)(n / QK) * (2 + QK);
    case GGML_Q4_0: return (uint64_t)(n / QK) * (2 + QK / 2);
    default: return (uint64_t)n * 4;
    }
}

/* The tensor list being planned: the ggml type of the matrices, and where the next goes. */
typedef struct plan {
    const kiln_gpt *m;
    kiln_gguf_type type;
    gguf_tensor *g;
    int n, cap;
} plan;

/* Add kiln's tensor kn as gguf's gn: vectors in f32, matrices in the plan's type (or f32 when
 * keep_f32 and the type is quantized: GPT-2's position embedding). */
static kiln_status plan_add(plan *p, const char *kn, const char *gn, int transpose, int64_t heads,
                            int keep_f32) {
    if (p->n >= p->cap)
        return kiln_error_setf(KILN_ERR_ARG, "too many tensors");
    gguf_tensor *t = &p->g[p->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", gn);
    t->src = kiln_gpt_find_tensor(p->m, kn);
    if (t->src < 0)
        return kiln_error_setf(KILN_ERR_FORMAT, "the model has no tensor %s", kn);
    const kiln_tensor_info *ti = kiln_gpt_tensor(p->m, t->src);
    t->transpose = transpose;
    t->heads = heads;
    int wide = p->type == KILN_GGUF_F16    ? GGML_F16
               : p->type == KILN_GGUF_Q8_0 ? GGML_Q8_0
               : p->type == KILN_GGUF_Q4_0 ? GGML_Q4_0
                                           : GGML_F32;
    if (ti->ndim == 1) {
        t->ne0 = ti->shape[0];
        t->ne1 = 1;
        t->type = GGML_F32;
    } else {
        t->ne0 = transpose ? ti->shape[0] : ti->shape[1]; /* in */
        t->ne1 = transpose ? ti->shape[1] : ti->shape[0]; /* out (rows) */
        t->type = keep_f32 && wide != GGML_F16 ? GGML_F32 : wide;
    }
    if ((t->type == GGML_Q8_0 || t->type == GGML_Q4_0) && t->ne0 % QK)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s has rows of %lld values: %s needs a multiple of %d (n_embd, "
                               "the attention's width and the MLP's multiples of 32)",
                               t->name, (long long)t->ne0, kiln_gguf_type_name(p->type), QK);
    t->bytes = type_bytes(t->type, t->ne0 * t->ne1);
    p->n++;
    return KILN_OK;
}

/* A block's tensor: kiln's name after the layer's prefix, llama.cpp's after "blk.N.", and how
 * it is written. */
typedef struct block_tensor {
    const char *kiln, *gguf;
    int transpose; /* a GPT-2 Conv1D matrix */
    int rope;      /* a Llama's 1: q (n_head heads), 2: k (n_kv_head heads), permuted */
} block_tensor;

/* Every layer's tensors, kiln's named "<prefix><block>.<name>"; shared blocks: each layer
 * written with its block's weights. */
static kiln_status plan_blocks(plan *p, const kiln_gpt_config *c, const char *prefix,
                               const block_tensor *block, int count) {
    const int64_t heads[3] = {0, c->n_head, kiln_gpt_config_kv_heads(c)};
    int64_t share = c->share_layers > 1 ? c->share_layers : 1;
    for (int64_t l = 0; l < c->n_layer; l++)
        for (int k = 0; k < count; k++) {
            char kn[64], gn[64];
            snprintf(kn, sizeof kn, "%s%lld.%s", prefix, (long long)(l / share), block[k].kiln);
            snprintf(gn, sizeof gn, "blk.%lld.%s", (long long)l, block[k].gguf);
            KILN_CHECK(plan_add(p, kn, gn, block[k].transpose, heads[block[k].rope], 0));
        }
    return KILN_OK;
}

/* GPT-2 in llama.cpp's "gpt2" names, types and shapes. */
static kiln_status plan_gpt2(plan *p, const kiln_gpt_config *c) {
    static const block_tensor block[] = {
        {"ln_1.weight", "attn_norm.weight", 0, 0},
        {"ln_1.bias", "attn_norm.bias", 0, 0},
        {"attn.c_attn.weight", "attn_qkv.weight", 1, 0},
        {"attn.c_attn.bias", "attn_qkv.bias", 0, 0},
        {"attn.c_proj.weight", "attn_output.weight", 1, 0},
        {"attn.c_proj.bias", "attn_output.bias", 0, 0},
        {"ln_2.weight", "ffn_norm.weight", 0, 0},
        {"ln_2.bias", "ffn_norm.bias", 0, 0},
        {"mlp.c_fc.weight", "ffn_up.weight", 1, 0},
        {"mlp.c_fc.bias", "ffn_up.bias", 0, 0},
        {"mlp.c_proj.weight", "ffn_down.weight", 1, 0},
        {"mlp.c_proj.bias", "ffn_down.bias", 0, 0},
    };
    KILN_CHECK(plan_add(p, "wte.weight", "token_embd.weight", 0, 0, 0));
    KILN_CHECK(plan_add(p, "wpe.weight", "position_embd.weight", 0, 0, 1));
    KILN_CHECK(plan_blocks(p, c, "h.", block, (int)(sizeof block / sizeof block[0])));
    KILN_CHECK(plan_add(p, "ln_f.weight", "output_norm.weight", 0, 0, 0));
    return plan_add(p, "ln_f.bias", "output_norm.bias", 0, 0, 0);
}

/* A Llama in llama.cpp's "llama" names: its matrices are already (out, in); q and k have
 * their rows permuted per head (tensor_data), v and the rest are as they are. An untied head
 * is "output"; a tied one is left out and llama.cpp multiplies by token_embd. */
static kiln_status plan_llama(plan *p, const kiln_gpt_config *c) {
    static const block_tensor block[] = {
        {"input_layernorm.weight", "attn_norm.weight", 0, 0},
        {"self_attn.q_proj.weight", "attn_q.weight", 0, 1},
        {"self_attn.k_proj.weight", "attn_k.weight", 0, 2},
        {"self_attn.v_proj.weight", "attn_v.weight", 0, 0},
        {"self_attn.o_proj.weight", "attn_output.weight", 0, 0},
        {"post_attention_layernorm.weight", "ffn_norm.weight", 0, 0},
        {"mlp.gate_proj.weight", "ffn_gate.weight", 0, 0},
        {"mlp.up_proj.weight", "ffn_up.weight", 0, 0},
        {"mlp.down_proj.weight", "ffn_down.weight", 0, 0},
    };
    KILN_CHECK(plan_add(p, "model.embed_tokens.weight", "token_embd.weight", 0, 0, 0));
    KILN_CHECK(plan_blocks(p, c, "model.layers.", block, (int)(sizeof block / sizeof block[0])));
    KILN_CHECK(plan_add(p, "model.norm.weight", "output_norm.weight", 0, 0, 0));
    return c->untied_head ? plan_add(p, "lm_head.weight", "output.weight", 0, 0, 0) : KILN_OK;
}

/* The tensors in llama.cpp's names, types and shapes, each at its aligned offset. */
static kiln_status plan_tensors(plan *p) {
    const kiln_gpt_config *c = kiln_gpt_get_config(p->m);
    KILN_CHECK(c->family == KILN_FAMILY_LLAMA ? plan_llama(p, c) : plan_gpt2(p, c));
    uint64_t off = 0;
    for (int i = 0; i < p->n; i++) {
        p->g[i].offset = off;
        off += (p->g[i].bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
    }
    return KILN_OK;
}

/* Hugging Face's Llama rotates channel i of a head with channel i + hs/2 (rotate-half);
 * llama.cpp's "llama" rotates channels 2i and 2i + 1 at the same frequency. So row 2i + h of
 * each head in the file is row h hs/2 + i of kiln's (h = 0, 1): the pairs come together, and
 * q.k over a head is unchanged because q and k are permuted alike. rows: (heads x hs, in). */
static void rope_rows(float *out, const float *rows, int64_t heads, int64_t hs, int64_t in) {
    int64_t half = hs / 2;
    for (int64_t n = 0; n < heads; n++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t h = 0; h < 2; h++)
                memcpy(out + (n * hs + 2 * i + h) * in, rows + (n * hs + h * half + i) * in,
                       (size_t)in * sizeof *out);
}

/* One tensor's bytes: rows of ne0 fp32 values (transposed or permuted when asked), then its
 * type. */
static kiln_status tensor_data(kiln_gpt *m, const gguf_tensor *t, uint8_t *out) {
    const kiln_tensor_info *ti = kiln_gpt_tensor(m, t->src);
    int64_t n = t->ne0 * t->ne1;
    float *src = malloc((size_t)ti->numel * sizeof *src), *rows = malloc((size_t)n * sizeof *rows);
    if (!src || !rows) {
        free(src);
        free(rows);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot convert %s", t->name);
    }
    kiln_dtype dt = kiln_gpt_dtype(m);
    kiln_convert(src, KILN_DTYPE_F32,
                 (const char *)kiln_gpt_params(m) + (size_t)ti->offset * kiln_dtype_size(dt), dt,
                 ti->numel);
    if (t->transpose) /* src (in = ne0, out = ne1) row-major -> rows (out, in) */
        for (int64_t i = 0; i < t->ne0; i++)
            for (int64_t o = 0; o < t->ne1; o++)
                rows[o * t->ne0 + i] = src[i * t->ne1 + o];
    else if (t->heads > 0)
        rope_rows(rows, src, t->heads, t->ne1 / t->heads, t->ne0);
    else
        memcpy(rows, src, (size_t)n * sizeof *rows);
    switch (t->type) {
    case GGML_F16:
        for (int64_t i = 0; i < n; i++)
            put_u16(out + 2 * i, kiln_f32_to_f16(rows[i]));
        break;
    case GGML_Q8_0: kiln_quantize_q8_0(out, rows, n); break;
    case GGML_Q4_0: kiln_quantize_q4_0(out, rows, n); break;
    default: memcpy(out, rows, (size_t)n * 4);
    }
    free(src);
    free(rows);
    return KILN_OK;
}

static uint32_t file_type(kiln_gguf_type t) {
    /* llama.cpp's llama_ftype: all f32, mostly f16, mostly q4_0, mostly q8_0 */
    return t == KILN_GGUF_F16 ? 1u : t == KILN_GGUF_Q4_0 ? 2u : t == KILN_GGUF_Q8_0 ? 7u : 0u;
}

/* The architecture's hyperparameters, under "<arch>." keys. */
static void put_hparams(buf *b, const kiln_gpt_config *c) {
    if (c->family != KILN_FAMILY_LLAMA) {
        kv_u32(b, "gpt2.context_length", (uint32_t)c->max_seq_len);
        kv_u32(b, "gpt2.embedding_length", (uint32_t)c->n_embd);
        kv_u32(b, "gpt2.feed_forward_length", (uint32_t)kiln_gpt_config_mlp_width(c));
        kv_u32(b, "gpt2.block_count", (uint32_t)c->n_layer);
        kv_u32(b, "gpt2.attention.head_count", (uint32_t)c->n_head);
        kv_f32(b, "gpt2.attention.layer_norm_epsilon", 1e-5f);
        return;
    }
    int64_t hs = kiln_gpt_config_head_size(c);
    kv_u32(b, "llama.context_length", (uint32_t)c->max_seq_len);
    kv_u32(b, "llama.embedding_length", (uint32_t)c->n_embd);
    kv_u32(b, "llama.block_count", (uint32_t)c->n_layer);
    kv_u32(b, "llama.feed_forward_length", (uint32_t)kiln_gpt_config_mlp_width(c));
    kv_u32(b, "llama.attention.head_count", (uint32_t)c->n_head);
    kv_u32(b, "llama.attention.head_count_kv", (uint32_t)kiln_gpt_config_kv_heads(c));
    kv_f32(b, "llama.rope.freq_base", kiln_gpt_config_rope_theta(c));
    kv_f32(b, "llama.attention.layer_norm_rms_epsilon", kiln_gpt_config_norm_eps(c));
    kv_u32(b, "llama.rope.dimension_count", (uint32_t)hs); /* every channel of a head rotates */
    kv_u32(b, "llama.vocab_size", (uint32_t)c->vocab_size);
    if (hs * c->n_head != c->n_embd) { /* llama.cpp's default head size is n_embd / n_head */
        kv_u32(b, "llama.attention.key_length", (uint32_t)hs);
        kv_u32(b, "llama.attention.value_length", (uint32_t)hs);
    }
}

static kiln_status build_header(kiln_gpt *m, const kiln_tokenizer *tok, kiln_gguf_type type,
                                const char *name, const gguf_tensor *g, int n, buf *b) {
    const kiln_gpt_config *c = kiln_gpt_get_config(m);
    int llama = c->family == KILN_FAMILY_LLAMA;
    int32_t(*pairs)[2] = NULL;
    KILN_CHECK(merges_of(tok, &pairs));
    put32(b, 0x46554747u); /* "GGUF" */
    put32(b, 3);
    put64(b, (uint64_t)n);
    put64(b, 0); /* the key-value count, filled in below */
    kv_str(b, "general.architecture", llama ? "llama" : "gpt2");
    kv_str(b, "general.name", name && name[0] ? name : llama ? "kiln-llama" : "kiln-gpt2");
    kv_u32(b, "general.file_type", file_type(type));
    kv_u32(b, "general.alignment", GGUF_ALIGN);
    put_hparams(b, c);
    put_tokenizer(b, tok, pairs);
    free(pairs);
    if (!b->oom)
        memcpy(b->p + 16, &b->nkv, 8); /* after the magic, the version and the tensor count */
    for (int i = 0; i < n; i++) {
        put_str(b, g[i].name, strlen(g[i].name));
        int dims = g[i].ne1 > 1 || kiln_gpt_tensor(m, g[i].src)->ndim == 2 ? 2 : 1;
        put32(b, (uint32_t)dims);
        put64(b, (uint64_t)g[i].ne0);
        if (dims == 2)
            put64(b, (uint64_t)g[i].ne1);
        put32(b, (uint32_t)g[i].type);
        put64(b, g[i].offset);
    }
    static const uint8_t zeros[GGUF_ALIGN] = {0};
    put(b, zeros, (GGUF_ALIGN - b->len % GGUF_ALIGN) % GGUF_ALIGN);
    if (b->oom)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot build the GGUF header");
    return KILN_OK;
}

kiln_status kiln_export_gguf(kiln_gpt *m, const kiln_tokenizer *tok, kiln_gguf_type type,
                             const char *name, const char *path) {
    if (!m || !tok || !path || (unsigned)type > KILN_GGUF_Q4_0)
        return kiln_error_setf(KILN_ERR_ARG, "GGUF export: a NULL argument or a bad type");
    if (kiln_gpt_has_linear(m)) /* its slab holds no block matrices */
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "GGUF export needs a dense model, not a "
                                                     "quantized one: export the weights it was "
                                                     "made from");
    const kiln_gpt_config *c = kiln_gpt_get_config(m);
    const char *arch = c->family == KILN_FAMILY_LLAMA ? "llama" : "gpt2";
    for (int k = 0; k < 4; k++)
        if (c->rank[k])
            return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                                   "GGUF export: the model is factored (low rank), which "
                                   "llama.cpp's %s does not run: export the dense weights",
                                   arch);
    /* llama.cpp's gpt2 graph splits qkv by C; its llama reads the head size from the file */
    if (c->family != KILN_FAMILY_LLAMA && kiln_gpt_config_attn_width(c) != c->n_embd)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "GGUF export: llama.cpp's gpt2 models have n_head x head size = "
                               "n_embd, and this model's attention is %lld wide for n_embd %lld "
                               "(heads pruned): export a model with whole attention",
                               (long long)kiln_gpt_config_attn_width(c), (long long)c->n_embd);
    if (tok->kind == TOK_HF) /* its ranks are not its ids, its pieces maybe not bytes' */
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "GGUF export writes kiln's own tokenizers (bytes, gpt2, a trained "
                               "BPE); %s is a Hugging Face tokenizer.json, whose merges and "
                               "pre-tokeniser it does not write",
                               kiln_tokenizer_name(tok));
    if (kiln_tokenizer_vocab_size(tok) != c->vocab_size)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the tokenizer (%s) has %lld tokens but the model's vocabulary is "
                               "%lld: export with the tokenizer the model was trained with",
                               kiln_tokenizer_name(tok), (long long)kiln_tokenizer_vocab_size(tok),
                               (long long)c->vocab_size);
    int cap = (int)(4 + 12 * c->n_layer);
    gguf_tensor *g = calloc((size_t)cap, sizeof *g);
    plan p = {m, type, g, 0, cap};
    buf head = {0};
    uint8_t *data = NULL;
    kiln__atomic_file f = KILN__ATOMIC_FILE_INIT;
    kiln_status s = g ? KILN_OK : kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    if (s == KILN_OK)
        s = plan_tensors(&p);
    int n = p.n;
    if (s == KILN_OK)
        s = build_header(m, tok, type, name, g, n, &head);
    if (s == KILN_OK)
        s = kiln__atomic_open(&f, path);
    if (s == KILN_OK)
        s = kiln__atomic_write(&f, head.p, head.len);
    static const uint8_t zeros[GGUF_ALIGN] = {0};
    for (int i = 0; s == KILN_OK && i < n; i++) {
        data = malloc((size_t)g[i].bytes);
        if (!data) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "cannot convert %s", g[i].name);
            break;
        }
        s = tensor_data(m, &g[i], data);
        if (s == KILN_OK)
            s = kiln__atomic_write(&f, data, (size_t)g[i].bytes);
        if (s == KILN_OK)
            s = kiln__atomic_write(&f, zeros, (GGUF_ALIGN - g[i].bytes % GGUF_ALIGN) % GGUF_ALIGN);
        free(data);
        data = NULL;
    }
    if (s == KILN_OK)
        s = kiln__atomic_commit(&f);
    else
        kiln__atomic_abort(&f);
    free(head.p);
    free(g);
    return s;
}
