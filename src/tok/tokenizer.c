/* Tokenizers: loading by name, the "bytes" tokenizer, encode and decode, and the map from
 * a token's bytes to its id. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

/* Texts at least this long get a piece cache in kiln_tokenizer_encode; shorter ones are
 * not worth its set-up. */
#define TOK_CACHE_MIN_TEXT (64 * 1024)

uint64_t kiln__tok_hash_bytes(const void *s, size_t len) {
    return XXH3_64bits(s, len);
}

void kiln_tokens_free(kiln_tokens *t) {
    if (!t)
        return;
    kiln_free(t->ids);
    memset(t, 0, sizeof *t);
}

kiln_status kiln_tokens_reserve(kiln_tokens *t, int64_t extra) {
    if (!t)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_tokens_reserve: no token buffer");
    if (extra < 0)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_tokens_reserve: negative count %lld",
                               (long long)extra);
    if (t->cap - t->len >= extra)
        return KILN_OK;
    return kiln__tok_tokens_grow(t, extra);
}

void kiln_bytes_free(kiln_bytes *b) {
    if (!b)
        return;
    kiln_free(b->data);
    memset(b, 0, sizeof *b);
}

kiln_status kiln__tok_bytes_reserve(kiln_bytes *b, size_t extra) {
    if (b->cap - b->len >= extra)
        return KILN_OK;
    if (extra > SIZE_MAX / 2 - b->len)
        return kiln_error_setf(KILN_ERR_NOMEM, "decoded text: %zu more bytes are too many", extra);
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    void *p = NULL;
    KILN_CHECK(kiln_alloc_checked(&p, cap, "decoded text"));
    if (b->len)
        memcpy(p, b->data, b->len);
    kiln_free(b->data);
    b->data = p;
    b->cap = cap;
    return KILN_OK;
}

kiln_status kiln__tok_new(kiln_tokenizer **out, tok_kind kind, const char *name) {
    *out = NULL;
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a tokenizer");
    t->kind = kind;
    t->eot = -1;
    snprintf(t->name, sizeof t->name, "%s", name);
    if (kind == TOK_GPT2 || kind == TOK_BPE) {
        kiln_status s = kiln__tok_pretok_init(&t->pretok);
        if (s != KILN_OK) {
            free(t);
            return s;
        }
    }
    *out = t;
    return KILN_OK;
}

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t)
        return;
    kiln__tok_pretok_free(&t->pretok);
    if (t->hf && t->hf->arena) { /* a prepared form's arrays live in it (hf_cache.c) */
        t->off = NULL;
        t->blob = NULL;
        t->pieces = NULL;
        t->pairs.keys = NULL;
        t->pairs.vals = NULL;
    }
    kiln__tok_pair_map_free(&t->pairs);
    kiln_free(t->off);
    kiln_free(t->blob);
    kiln_free(t->pieces);
    free(t->merges);
    if (t->hf) {
        kiln__tok_hf_free(t->hf);
        free(t->hf);
    }
    free(t);
}

static kiln_status load_bytes(kiln_tokenizer **out) {
    kiln_tokenizer *t = NULL;
    KILN_CHECK(kiln__tok_new(&t, TOK_BYTES, "bytes"));
    kiln_status s = KILN_OK;
    void *off = NULL, *blob = NULL;
    KILN_CHECK_GOTO(s, kiln_alloc_checked(&off, 257 * sizeof(uint32_t), "token offsets"), fail);
    t->off = off;
    KILN_CHECK_GOTO(s, kiln_alloc_checked(&blob, 256, "token bytes"), fail);
    t->blob = blob;
    t->n = 256;
    for (int i = 0; i < 256; i++) {
        t->blob[i] = (char)i;
        t->off[i + 1] = (uint32_t)(i + 1);
        t->byte_id[i] = i;
    }
    *out = t;
    return KILN_OK;
fail:
    kiln_tokenizer_free(t);
    return s;
}

kiln_status kiln_tokenizer_load(kiln_tokenizer **out, const char *spec) {
    if (!out || !spec)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_tokenizer_load: no output or no spec");
    *out = NULL;
    if (!strcmp(spec, "bytes"))
        return load_bytes(out);
    struct stat st;
    if (!strcmp(spec, "gpt2") && stat(spec, &st) != 0)
        return kiln_error_setf(KILN_ERR_NOT_FOUND,
                               "tokenizer 'gpt2': kiln's library does not search for GPT-2's "
                               "files; pass the folder that holds encoder.json and vocab.bpe");
    if (stat(spec, &st) != 0 && errno != ENOENT)
        return kiln_error_setf(KILN_ERR_IO, "tokenizer '%s': %s", spec, strerror(errno));
    if (stat(spec, &st) != 0)
        return kiln_error_setf(KILN_ERR_NOT_FOUND,
                               "tokenizer '%s': no such file; use gpt2, bytes, a folder holding "
                               "GPT-2's encoder.json and vocab.bpe, a Hugging Face "
                               "tokenizer.json, or a file written by `kiln tokenizer train`",
                               spec);
    if (S_ISDIR(st.st_mode))
        return kiln__tok_load_gpt2(out, spec);
    size_t sl = strlen(spec);
    if (sl >= 5 && !strcmp(spec + sl - 5, ".json"))
        return kiln__tok_load_hf(out, spec);
    return kiln__tok_load_file(out, spec);
}

const char *kiln_tokenizer_name(const kiln_tokenizer *t) {
    return t ? t->name : "";
}
int64_t kiln_tokenizer_vocab_size(const kiln_tokenizer *t) {
    return t ? t->n : 0;
}
int32_t kiln_tokenizer_eot(const kiln_tokenizer *t) {
    return t ? t->eot : -1;
}
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t) {
    return t && t->hf ? t->hf->bos : -1;
}

/* XXH3 over a tag and version, the id count, <|endoftext|>'s id, whether a whole piece is
 * looked up first, each id's length (u32) and bytes, then the merges (u32 pairs): everything
 * that decides the ids of a text, and nothing else (not the name or the file it came from). */
uint64_t kiln_tokenizer_id(const kiln_tokenizer *t) {
    if (!t)
        return 0;
    if (t->hf)
        return t->hf->identity ? t->hf->identity : 1;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    const uint32_t head[4] = {1, (uint32_t)t->n, (uint32_t)t->eot, (uint32_t)t->whole_piece_first};
    XXH3_64bits_update(&st, "kiln-tokenizer", 14);
    XXH3_64bits_update(&st, head, sizeof head);
    for (int32_t id = 0; id < t->n; id++) {
        uint32_t len = t->off[id + 1] - t->off[id];
        XXH3_64bits_update(&st, &len, sizeof len);
        XXH3_64bits_update(&st, t->blob + t->off[id], len);
    }
    if (t->merges && t->n_merges > 0)
        XXH3_64bits_update(&st, t->merges, (size_t)t->n_merges * sizeof *t->merges);
    uint64_t h = XXH3_64bits_digest(&st);
    return h ? h : 1; /* 0 means "unknown" in shards */
}

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len,
                                  kiln_tokens *out) {
    if (!t || !out || (!text && len))
        return kiln_error_setf(KILN_ERR_ARG,
                               "kiln_tokenizer_encode: missing tokenizer, text or output");
    if (len == 0)
        return KILN_OK;
    tok_encoder e;
    KILN_CHECK(kiln__tok_encoder_init(&e, t, len >= TOK_CACHE_MIN_TEXT));
    kiln_status s = kiln__tok_encode_range(&e, (const uint8_t *)text, len, 0, len, out);
    kiln__tok_encoder_free(&e);
    return s;
}

kiln_status kiln_tokenizer_token_bytes(const kiln_tokenizer *t, int32_t id, const char **bytes,
                                       size_t *len) {
    if (!t || !bytes || !len)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_tokenizer_token_bytes: missing argument");
    if (id < 0 || id >= t->n)
        return kiln_error_setf(KILN_ERR_RANGE,
                               "token id %d is outside the vocabulary [0, %d) of %s", id, t->n,
                               t->name);
    *bytes = t->blob + t->off[id];
    *len = t->off[id + 1] - t->off[id];
    return KILN_OK;
}

kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, int64_t n,
                                  kiln_bytes *out) {
    if (!t || !out || (!ids && n) || n < 0)
        return kiln_error_setf(KILN_ERR_ARG,
                               "kiln_tokenizer_decode: missing tokenizer, ids or output");
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n)
            return kiln_error_setf(KILN_ERR_RANGE,
                                   "token id %d (at position %lld) is outside the vocabulary "
                                   "[0, %d) of %s",
                                   id, (long long)i, t->n, t->name);
        total += t->off[id + 1] - t->off[id];
    }
    KILN_CHECK(kiln__tok_bytes_reserve(out, total));
    for (int64_t i = 0; i < n; i++) {
        size_t a = t->off[ids[i]], b = t->off[ids[i] + 1];
        memcpy(out->data + out->len, t->blob + a, b - a);
        out->len += b - a;
    }
    return KILN_OK;
}

/* ---- bytes -> id ---- */

static inline uint64_t head8(const uint8_t *s, size_t len) {
    uint64_t w = 0;
    memcpy(&w, s, len < 8 ? len : 8);
    return w;
}

kiln_status kiln__tok_build_piece_map(kiln_tokenizer *t) {
    uint64_t slots = 1024;
    while (slots < (uint64_t)t->n * 2)
        slots *= 2;
    void *p = NULL;
    KILN_CHECK(kiln_alloc_checked(&p, slots * sizeof(tok_piece_slot), "token map"));
    kiln_free(t->pieces);
    t->pieces = p;
    t->piece_mask = slots - 1;
    const uint32_t *off = t->key_off ? t->key_off : t->off;
    const char *blob = t->key_off ? t->key_blob : t->blob;
    for (int32_t id = 0; id < t->n; id++) {
        if (id == t->eot || (t->hf && t->hf->special[id]))
            continue;
        const uint8_t *s = (const uint8_t *)blob + off[id];
        size_t len = off[id + 1] - off[id];
        uint64_t h = kiln__tok_hash_bytes(s, len);
        if (kiln__tok_piece_lookup(t, s, len, h) >= 0)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: token %d has the same bytes as another",
                                   t->name, id);
        for (uint64_t i = h;; i++) {
            tok_piece_slot *c = &t->pieces[i & t->piece_mask];
            if (!c->id1) {
                c->id1 = (uint32_t)id + 1;
                c->tag = (uint16_t)(h >> 48);
                c->len = (uint16_t)(len < 0xFFFF ? len : 0xFFFF);
                c->head = head8(s, len);
                break;
            }
        }
    }
    return KILN_OK;
}

int32_t kiln__tok_piece_lookup(const kiln_tokenizer *t, const uint8_t *s, size_t len, uint64_t h) {
    uint16_t tag = (uint16_t)(h >> 48), l16 = (uint16_t)(len < 0xFFFF ? len : 0xFFFF);
    uint64_t head = head8(s, len);
    for (uint64_t i = h;; i++) {
        const tok_piece_slot *c = &t->pieces[i & t->piece_mask];
        if (!c->id1)
            return -1;
        if (c->tag != tag || c->len != l16 || c->head != head)
            continue;
        int32_t id = (int32_t)c->id1 - 1;
        if (len <= 8)
            return id;
        const uint32_t *off = t->key_off ? t->key_off : t->off;
        const char *blob = t->key_off ? t->key_blob : t->blob;
        size_t a = off[id], b = off[id + 1];
        if (b - a == len && !memcmp(blob + a + 8, s + 8, len - 8))
            return id;
    }
}
