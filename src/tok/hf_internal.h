/* Internal: Hugging Face tokenizer.json tokenizers (TOK_HF).
 *
 * Two styles of BPE, told apart by the pre-tokeniser:
 * - byte-level (a ByteLevel pre-tokeniser: GPT-2, Llama 3, Qwen 2): the text is cut into
 *   pieces by a pattern, each piece's bytes start as one id each (the vocabulary spells
 *   bytes in GPT-2's alphabet) and the merges join them;
 * - SentencePiece-style (no pre-tokeniser: Llama 2, Gemma): the normalised text starts as
 *   one id per character, a character outside the vocabulary stays alone and becomes its
 *   bytes' <0xXX> tokens at the end (byte fallback), or the unknown token.
 * A pair's rank is its merge's place in the file; t->rank_id maps it to the merged id.
 * Added tokens marked special are never looked for in text (see kiln_tokenizer_encode). */
#ifndef KILN_TOK_HF_INTERNAL_H
#define KILN_TOK_HF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/tokenizer.h"

typedef enum hf_style { HF_BYTE_LEVEL = 1, HF_SENTENCEPIECE = 2 } hf_style;

/* The pre-tokeniser patterns kiln runs (exactly, by hand: hf_pretok.c). */
typedef enum hf_pattern {
    HF_PAT_NONE = 0,       /* the whole text is one piece */
    HF_PAT_GPT2 = 1,       /* ByteLevel's built-in pattern, as tokenizers.js runs it (JS \s) */
    HF_PAT_SPLIT_GPT2 = 2, /* the same pattern given to Split (\s: White_Space) */
    HF_PAT_LLAMA3 = 3,     /* Llama 3's Split pattern (\p{N}{1,3}) */
    HF_PAT_QWEN2 = 4,      /* Qwen 2's: Llama 3's with \p{N} one digit at a time */
} hf_pattern;

typedef enum hf_norm_kind {
    HF_NORM_PREPEND = 1,
    HF_NORM_REPLACE = 2,
    HF_NORM_NFC = 3,
    HF_NORM_NFKC = 4
} hf_norm_kind;

#define HF_MAX_NORM 8
typedef struct hf_norm_step {
    uint32_t kind; /* hf_norm_kind */
    uint32_t alen,
        blen; /* bytes of a (Prepend's text, Replace's pattern) and b (Replace's content) */
    char a[64], b[64];
} hf_norm_step;

/* An added token that is looked for in text (not special). */
typedef struct hf_added {
    int32_t id;
    uint32_t normalized; /* 1: looked for in the normalised text, else in the raw text */
    uint32_t off, len;   /* its text in tok_hf.added_text */
} hf_added;

typedef struct tok_hf {
    uint32_t style;         /* hf_style */
    uint32_t pattern;       /* hf_pattern */
    uint32_t ignore_merges; /* 1: a piece that is a token is that token (Llama 3) */
    uint32_t byte_fallback; /* 1: unknown characters become <0xXX> tokens */
    uint32_t sp_cut;        /* 1: no token has a character other than U+2581 before U+2581,
                               so a word may be cut before such a U+2581 (hf_encode.c) */
    int32_t unk, bos;       /* -1: none */
    uint32_t n_norm;
    hf_norm_step norm[HF_MAX_NORM];
    int32_t n_added;
    hf_added *added; /* [n_added] */
    char *added_text;
    uint8_t *special; /* [n] 1: a special added token */
    /* SentencePiece style: the vocabulary's own strings (U+2581 and "<0x41>" as written),
     * which the piece map is built over; t->blob holds what each token decodes to. */
    char *mblob;
    uint32_t *moff;        /* [n + 1] */
    int32_t byte_tok[256]; /* id of <0xXX>, -1: none */
    int32_t ascii_id[128]; /* id of each ASCII character alone, -1: none */
    int64_t n_ranks;
    int32_t (*rank_merge)[3]; /* [n_ranks] (a, b, merged id) */
    /* derived when loaded (kiln__tok_hf_finish), not stored: */
    int32_t *rank_ids;           /* [n_ranks] merged id (what t->rank_id points to) */
    uint8_t added_first[2][256]; /* [normalized][byte] 1: an added token starts with it */
    uint64_t identity;           /* XXH3 of the prepared form (kiln_tokenizer_id) */
    void *arena; /* a prepared form mapped whole; the arrays point into it */
    size_t arena_len;
} tok_hf;

struct tok_encoder;
/* ---- hf_load.c ---- */
/* Load a tokenizer.json (through the prepared cache beside it when that is current). */
kiln_status kiln__tok_load_hf(kiln_tokenizer **out, const char *path);
void kiln__tok_hf_free(tok_hf *h);
/* The tables derived from a loaded tok_hf: rank ids and the pair map (tables_ready: read
 * from the prepared form, then only checked), and the small lookups. */
kiln_status kiln__tok_hf_finish(kiln_tokenizer *t, int tables_ready);

/* ---- hf_json.c ---- */
/* Build a tokenizer from tokenizer.json's text; where names the file in messages. */
kiln_status kiln__tok_hf_from_json(kiln_tokenizer **out, const char *text, size_t len,
                                   const char *where);

/* ---- hf_cache.c ---- */
/* The prepared form: everything that decides the ids and the tables built from it, after
 * the checksum of the source text; bytes 24..32 hold the identity. Deserialize takes buf
 * (malloc'ed) on success: the tokenizer's arrays point into it. */
kiln_status kiln__tok_hf_serialize(const kiln_tokenizer *t, uint64_t source_hash, uint8_t **buf,
                                   size_t *len);
kiln_status kiln__tok_hf_deserialize(kiln_tokenizer **out, char *buf, size_t len,
                                     uint64_t source_hash, const char *where);

/* ---- hf_pretok.c ---- */
/* Recognise a pre-tokeniser regex kiln runs exactly; HF_PAT_NONE when it is not one. */
hf_pattern kiln__tok_hf_pattern_of(const char *regex);
/* End of the piece that starts at pos in s[0..len) (pos < len). */
size_t kiln__tok_hf_piece_end(hf_pattern pat, const uint8_t *s, size_t len, size_t pos);
/* Decode one UTF-8 character at s[0..len) (len >= 1): its code point, or UINT32_MAX for a
 * byte that does not start a valid character (then *n = 1). */
uint32_t kiln__tok_utf8_next(const uint8_t *s, size_t len, size_t *n);

/* ---- hf_norm.c ---- */
/* out := the normalised s[0..len) (out is reset). */
kiln_status kiln__tok_hf_normalize(const tok_hf *h, const uint8_t *s, size_t len, kiln_bytes *out);

/* ---- hf_encode.c ---- */
kiln_status kiln__tok_hf_encode(struct tok_encoder *e, const uint8_t *s, size_t len,
                                kiln_tokens *out);

#endif
