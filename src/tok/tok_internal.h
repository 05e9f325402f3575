/* Internal: kiln's tokenizers. A byte-level BPE is a vocabulary (the bytes of every id),
 * a map from adjacent pairs of ids to the id they merge into, and GPT-2's pre-tokeniser.
 *
 * Ranks: a pair's rank is the id it merges into. That holds for GPT-2 (tiktoken's ranks
 * are the ids) and for kiln's trained files (merge i makes id 256 + i), so the BPE loop
 * merges the pair with the smallest merged id, leftmost first, like tiktoken. */
#ifndef KILN_DATA_TOK_INTERNAL_H
#define KILN_DATA_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

typedef enum tok_kind { TOK_BYTES, TOK_GPT2, TOK_BPE, TOK_HF } tok_kind;

struct tok_hf; /* hf_internal.h */

/* Open-addressing map from a pair of ids (a << 32 | b) to the merged id. */
typedef struct tok_pair_map {
    uint64_t *keys; /* [mask + 1]; TOK_PAIR_EMPTY marks a free slot */
    int32_t *vals;  /* [mask + 1] */
    uint64_t mask;
    int64_t count;
} tok_pair_map;
#define TOK_PAIR_EMPTY UINT64_MAX

/* Open-addressing map from a token's bytes to its id. Most tokens are at most 8 bytes: those
 * are compared through `head` without reading the token's bytes elsewhere. */
typedef struct tok_piece_slot {
    uint32_t id1;  /* id + 1; 0: free */
    uint16_t tag;  /* high 16 bits of the key's hash, to skip most comparisons */
    uint16_t len;  /* the token's length in bytes, or 0xFFFF for 65535 and more */
    uint64_t head; /* its first 8 bytes, zero-padded */
} tok_piece_slot;

/* GPT-2's pre-tokeniser: the regex (PCRE2, JIT-compiled when the library can) and the
 * hand-written scanner for ASCII that gives the same pieces. */
typedef struct tok_pretok {
    pcre2_code *re;
    int jit; /* 1 when re was JIT-compiled */
} tok_pretok;

struct kiln_tokenizer {
    tok_kind kind;
    char name[256];
    int32_t n;              /* ids 0..n-1; eot (when >= 0) is among them */
    int32_t eot;            /* -1: none */
    uint32_t *off;          /* [n + 1] offsets of each id's bytes in blob */
    char *blob;             /* the bytes of every token, one after another */
    int32_t byte_id[256];   /* id of each single byte */
    int whole_piece_first;  /* 1: a piece that is itself a token is that token (tiktoken) */
    tok_piece_slot *pieces; /* NULL unless whole_piece_first */
    uint64_t piece_mask;
    tok_pair_map pairs;
    int32_t (*merges)[2]; /* [n_merges] for TOK_BPE (what save writes) */
    int64_t n_merges;
    tok_pretok pretok;
    /* TOK_HF: a pair's rank is its merge's place; rank_id[rank] is the id it merges into.
     * NULL for the others, where the rank is the merged id. */
    const int32_t *rank_id;
    struct tok_hf *hf; /* NULL unless TOK_HF */
    /* The strings the piece map is built over ([n + 1] offsets into key_blob); NULL: the
     * tokens' bytes (off, blob). */
    const uint32_t *key_off;
    const char *key_blob;
};

/* ---- tokenizer.c ---- */
/* A zeroed tokenizer of the given kind (name copied). */
kiln_status kiln__tok_new(kiln_tokenizer **out, tok_kind kind, const char *name);
/* Make room for `extra` more bytes in b. */
kiln_status kiln__tok_bytes_reserve(kiln_bytes *b, size_t extra);
/* Build the piece map over ids 0..n-1 except eot. */
kiln_status kiln__tok_build_piece_map(kiln_tokenizer *t);
int32_t kiln__tok_piece_lookup(const kiln_tokenizer *t, const uint8_t *s, size_t len,
                               uint64_t hash);
uint64_t kiln__tok_hash_bytes(const void *s, size_t len);

/* ---- tokenizer_gpt2.c ---- */
/* GPT-2's byte alphabet (also that of Hugging Face's ByteLevel): decode s[0..len) into out
 * (at most len bytes); -1 if a character is outside it. */
long kiln__tok_byte_alphabet_decode(const char *s, size_t len, uint8_t *out);
/* Load GPT-2's encoder.json and vocab.bpe from dir. */
kiln_status kiln__tok_load_gpt2(kiln_tokenizer **out, const char *dir);

/* ---- tokenizer_file.c ---- */
kiln_status kiln__tok_load_file(kiln_tokenizer **out, const char *path);
/* A TOK_BPE tokenizer from merges (ids as in kiln_bpe_trainer_finish); checks them. */
kiln_status kiln__tok_from_merges(kiln_tokenizer **out, const int32_t (*merges)[2],
                                  int64_t n_merges, int has_eot, const char *name,
                                  const char *where);

/* ---- tokenizer_pretok.c ---- */
kiln_status kiln__tok_pretok_init(tok_pretok *p);
void kiln__tok_pretok_free(tok_pretok *p);
/* The end of the piece that starts at pos in s[0..len). Every byte is in some piece:
 * where the regex matches nothing (invalid UTF-8) the bytes up to its next match form a
 * piece of their own. ascii_fast = 0 uses only the regex (for tests). Returns KILN_OK, or
 * an error when PCRE2 fails (a resource limit). */
kiln_status kiln__tok_pretok_next(const tok_pretok *p, pcre2_match_data *md, const uint8_t *s,
                                  size_t len, size_t pos, int ascii_fast, size_t *end);
/* A position in [from, len] where a piece provably starts whatever precedes it; len if
 * none. */
size_t kiln__tok_pretok_safe_cut(const uint8_t *s, size_t len, size_t from);

/* ---- bpe.c ---- */
kiln_status kiln__tok_pair_map_init(tok_pair_map *m, int64_t expected);
void kiln__tok_pair_map_free(tok_pair_map *m);
/* Returns 0, or 1 when the pair was already there (its value is kept). */
int kiln__tok_pair_map_put(tok_pair_map *m, int32_t a, int32_t b, int32_t merged);
/* First slot to probe for a key (a multiply-xorshift mix; the keys are small integers). */
static inline uint64_t tok_pair_slot(uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}
static inline int32_t tok_pair_get(const tok_pair_map *m, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = tok_pair_slot(key);; i++) {
        uint64_t k = m->keys[i & m->mask];
        if (k == key)
            return m->vals[i & m->mask];
        if (k == TOK_PAIR_EMPTY)
            return -1;
    }
}

/* Per-thread encoding state: regex match data, BPE scratch, and a cache from pieces to
 * their ids. */
typedef struct tok_cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len; /* in key arena */
    uint32_t ids_off, ids_len; /* in ids arena */
} tok_cache_slot;

typedef struct tok_encoder {
    const kiln_tokenizer *t;
    pcre2_match_data *md;
    int ascii_fast;
    int32_t *work; /* BPE scratch for long pieces */
    size_t work_cap;
    tok_cache_slot *cache; /* NULL: no cache */
    uint64_t cache_mask;
    int64_t cache_count;
    char *cache_keys;
    size_t cache_keys_len, cache_keys_cap;
    int32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
    kiln_bytes norm; /* TOK_HF: the normalised text */
    int32_t *sym;    /* TOK_HF SentencePiece style: one id per character */
    size_t sym_cap;
} tok_encoder;

/* The cache of pieces' ids: the slot of s[0..n) (hash h), or NULL; remember ids[0..k). */
const tok_cache_slot *kiln__tok_cache_find(const tok_encoder *e, const uint8_t *s, size_t n,
                                           uint64_t h);
void kiln__tok_cache_put(tok_encoder *e, const uint8_t *s, size_t n, uint64_t h, const int32_t *ids,
                         int k);

kiln_status kiln__tok_encoder_init(tok_encoder *e, const kiln_tokenizer *t, int use_cache);
void kiln__tok_encoder_free(tok_encoder *e);
/* Append the ids of the pieces of s[from..to) to out; the regex sees the whole s[0..len)
 * (its look-ahead at `to` reads past it), and `from` and `to` must be piece starts. */
kiln_status kiln__tok_encode_range(tok_encoder *e, const uint8_t *s, size_t len, size_t from,
                                   size_t to, kiln_tokens *out);
/* Merge ids[0..n) in place by the tokenizer's ranks (lowest rank first, leftmost first);
 * a negative id never merges. Returns the number of ids left. */
kiln_status kiln__tok_bpe_ids(tok_encoder *e, int32_t *ids, int64_t n, int64_t *left);
/* Set the pair's value, replacing an earlier one (Hugging Face: the last merge wins). */
void kiln__tok_pair_map_set(tok_pair_map *m, int32_t a, int32_t b, int32_t value);
/* Append the ids of one piece (BPE over its bytes). */
kiln_status kiln__tok_encode_piece(tok_encoder *e, const uint8_t *s, size_t n, kiln_tokens *out);

/* Grow out so that `extra` more ids fit. */
kiln_status kiln__tok_tokens_grow(kiln_tokens *out, int64_t extra);
static inline kiln_status tok_tokens_push(kiln_tokens *out, int32_t id) {
    if (out->len == out->cap) {
        kiln_status s = kiln__tok_tokens_grow(out, 1);
        if (s != KILN_OK)
            return s;
    }
    out->ids[out->len++] = id;
    return KILN_OK;
}

#endif
