/* Encoding with a Hugging Face tokenizer, in tokenizers.js's order:
 *   added tokens that are not special are cut out of the raw text (leftmost, longest);
 *   each section between them is normalised, and the normalised added tokens cut out;
 *   each remaining part is pre-tokenised (byte-level) or taken whole (SentencePiece style);
 *   BPE encodes each piece.
 * SentencePiece style: a part is one word, its characters the first symbols. When no token
 * has another character right before a U+2581 (tok_hf.sp_cut), no merge can join across
 * such a place, so the word is cut there and each bit encoded (and cached) alone: the ids
 * are those of the whole word, found as fast as a byte-level tokenizer's pieces. */
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

enum { HF_CACHE_KEY_MAX = 64 };

/* The first added token at or after pos in s[0..len) (leftmost, then longest): its start
 * (len: none) and *which. */
static size_t find_added(const tok_hf *h, int normalized, const uint8_t *s, size_t len, size_t pos,
                         int32_t *which) {
    const uint8_t *first = h->added_first[normalized];
    for (size_t i = pos; i < len; i++) {
        if (!first[s[i]])
            continue;
        int32_t best = -1;
        uint32_t best_len = 0;
        for (int32_t k = 0; k < h->n_added; k++) {
            const hf_added *a = &h->added[k];
            if ((int)a->normalized != normalized || a->len <= best_len || a->len > len - i)
                continue;
            if (!memcmp(s + i, h->added_text + a->off, a->len)) {
                best = k;
                best_len = a->len;
            }
        }
        if (best >= 0) {
            *which = best;
            return i;
        }
    }
    return len;
}

static kiln_status push_bytes_of(tok_encoder *e, const uint8_t *c, size_t n, kiln_tokens *out) {
    const tok_hf *h = e->t->hf;
    int ok = h->byte_fallback;
    for (size_t i = 0; i < n && ok; i++)
        ok = h->byte_tok[c[i]] >= 0;
    if (ok) {
        for (size_t i = 0; i < n; i++)
            KILN_CHECK(tok_tokens_push(out, h->byte_tok[c[i]]));
        return KILN_OK;
    }
    return h->unk >= 0 ? tok_tokens_push(out, h->unk) : KILN_OK; /* tokenizers.js drops it */
}

/* One SentencePiece-style word w[0..n). */
static kiln_status sp_word(tok_encoder *e, const uint8_t *w, size_t n, kiln_tokens *out) {
    const kiln_tokenizer *t = e->t;
    const tok_hf *h = t->hf;
    uint64_t hash = 0;
    if (e->cache && n <= HF_CACHE_KEY_MAX) {
        hash = kiln__tok_hash_bytes(w, n);
        const tok_cache_slot *c = kiln__tok_cache_find(e, w, n, hash);
        if (c) {
            KILN_CHECK(kiln_tokens_reserve(out, c->ids_len));
            memcpy(out->ids + out->len, e->cache_ids + c->ids_off, c->ids_len * sizeof(int32_t));
            out->len += c->ids_len;
            return KILN_OK;
        }
    }
    if (n > e->sym_cap) {
        void *p = NULL;
        KILN_CHECK(kiln_alloc_checked(&p, n * sizeof(int32_t), "BPE symbols"));
        kiln_free(e->sym);
        e->sym = p;
        e->sym_cap = n;
    }
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = 1;
        int32_t id;
        if (w[i] < 0x80) {
            id = h->ascii_id[w[i]];
        } else {
            kiln__tok_utf8_next(w + i, n - i, &cl);
            id = kiln__tok_piece_lookup(t, w + i, cl, kiln__tok_hash_bytes(w + i, cl));
        }
        e->sym[k++] = id >= 0 ? id : -1 - (int32_t)i; /* outside the vocabulary: its place */
        i += cl;
    }
    int64_t left = 0;
    KILN_CHECK(kiln__tok_bpe_ids(e, e->sym, k, &left));
    int64_t start = out->len;
    for (int64_t i = 0; i < left; i++) {
        int32_t id = e->sym[i];
        if (id >= 0) {
            KILN_CHECK(tok_tokens_push(out, id));
        } else {
            size_t at = (size_t)(-1 - (int64_t)id), cl = 1;
            kiln__tok_utf8_next(w + at, n - at, &cl);
            KILN_CHECK(push_bytes_of(e, w + at, cl, out));
        }
    }
    if (e->cache && n <= HF_CACHE_KEY_MAX && out->len - start <= HF_CACHE_KEY_MAX)
        kiln__tok_cache_put(e, w, n, hash, out->ids + start, (int)(out->len - start));
    return KILN_OK;
}

static kiln_status sp_text(tok_encoder *e, const uint8_t *s, size_t n, kiln_tokens *out) {
    if (!e->t->hf->sp_cut)
        return sp_word(e, s, n, out);
    size_t a = 0;
    for (size_t i = 1; i + 3 <= n; i++) /* cut before U+2581 (E2 96 81) after another character */
        if (s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81 &&
            !(i >= 3 && s[i - 3] == 0xE2 && s[i - 2] == 0x96 && s[i - 1] == 0x81)) {
            KILN_CHECK(sp_word(e, s + a, i - a, out));
            a = i;
        }
    return sp_word(e, s + a, n - a, out);
}

/* A part with no added token in it. */
static kiln_status encode_part(tok_encoder *e, const uint8_t *s, size_t n, kiln_tokens *out) {
    const tok_hf *h = e->t->hf;
    if (n == 0)
        return KILN_OK;
    if (h->style == HF_SENTENCEPIECE)
        return sp_text(e, s, n, out);
    if (h->pattern == HF_PAT_NONE)
        return kiln__tok_encode_piece(e, s, n, out);
    for (size_t pos = 0; pos < n;) {
        size_t end = kiln__tok_hf_piece_end((hf_pattern)h->pattern, s, n, pos);
        KILN_CHECK(kiln__tok_encode_piece(e, s + pos, end - pos, out));
        pos = end;
    }
    return KILN_OK;
}

static kiln_status encode_section(tok_encoder *e, const uint8_t *s, size_t n, kiln_tokens *out);

/* Cut the added tokens (normalised ones, or the others) out of s[0..n) and encode what is
 * between them as parts (normalized) or sections. */
static kiln_status split_added(tok_encoder *e, int normalized, const uint8_t *s, size_t n,
                               kiln_tokens *out) {
    const tok_hf *h = e->t->hf;
    for (size_t pos = 0; pos < n;) {
        int32_t k = -1;
        size_t at = find_added(h, normalized, s, n, pos, &k);
        KILN_CHECK(normalized ? encode_part(e, s + pos, at - pos, out)
                              : encode_section(e, s + pos, at - pos, out));
        if (at == n)
            break;
        KILN_CHECK(tok_tokens_push(out, h->added[k].id));
        pos = at + h->added[k].len;
    }
    return KILN_OK;
}

/* A section of the raw text between added tokens. */
static kiln_status encode_section(tok_encoder *e, const uint8_t *s, size_t n, kiln_tokens *out) {
    const tok_hf *h = e->t->hf;
    if (n == 0)
        return KILN_OK;
    if (h->n_norm) {
        KILN_CHECK(kiln__tok_hf_normalize(h, s, n, &e->norm));
        s = (const uint8_t *)e->norm.data;
        n = e->norm.len;
    }
    return split_added(e, 1, s, n, out);
}

kiln_status kiln__tok_hf_encode(tok_encoder *e, const uint8_t *s, size_t len, kiln_tokens *out) {
    return split_added(e, 0, s, len, out);
}
