/* The normalisers of Hugging Face tokenizer.json files that kiln runs: Prepend, Replace (of
 * a string), NFC and NFKC, in the file's order (Sequence).
 *
 * NFC and NFKC are utf8proc's. Most text needs no change, and utf8proc is slow next to the
 * rest of encoding, so only the runs of non-ASCII characters that may change go through it:
 * a text may be cut before an ASCII character (it never composes with what precedes it), and
 * under NFC a run of characters that are starters, are their own normal form and never
 * compose with a character before them (the ranges in nfc_inert) is left as it is. Bytes
 * that are not UTF-8 are copied as they are; they end a run like a starter would. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

static kiln_status put(kiln_bytes *b, const void *s, size_t n) {
    KILN_CHECK(kiln__tok_bytes_reserve(b, n));
    if (n)
        memcpy(b->data + b->len, s, n);
    b->len += n;
    return KILN_OK;
}

/* Starters that are in NFC and never compose with a preceding character. */
static int nfc_inert(uint32_t c) {
    return (c >= 0x80 && c <= 0x2FF) || (c >= 0x400 && c <= 0x482) ||
           (c >= 0x3040 && c <= 0x3098) || (c >= 0x309B && c <= 0x30FF) ||
           (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3);
}

/* Normalise valid UTF-8 s[0..n) through utf8proc. */
static kiln_status unicode_form(const uint8_t *s, size_t n, int compat, kiln_bytes *out) {
    utf8proc_uint8_t *dst = NULL;
    int opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (compat ? UTF8PROC_COMPAT : 0);
    utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opts);
    if (m < 0)
        return kiln_error_setf(KILN_ERR_INTERNAL, "Unicode normalisation: %s", utf8proc_errmsg(m));
    kiln_status st = put(out, dst, (size_t)m);
    free(dst);
    return st;
}

/* A segment: an optional ASCII character, then non-ASCII bytes up to the next ASCII one. */
static kiln_status nf_segment(const uint8_t *s, size_t n, int compat, kiln_bytes *out) {
    size_t i = 0;
    while (i < n) { /* valid stretches go to utf8proc; a byte that is not UTF-8 is copied */
        size_t j = i, k = 1;
        int inert = 1;
        while (j < n) {
            uint32_t c = kiln__tok_utf8_next(s + j, n - j, &k);
            if (c == UINT32_MAX)
                break;
            inert &= c < 0x80 || (!compat && nfc_inert(c));
            j += k;
        }
        if (inert)
            KILN_CHECK(put(out, s + i, j - i));
        else
            KILN_CHECK(unicode_form(s + i, j - i, compat, out));
        if (j < n)
            KILN_CHECK(put(out, s + j, 1));
        i = j + 1;
    }
    return KILN_OK;
}

static kiln_status nf(const uint8_t *s, size_t len, int compat, kiln_bytes *out) {
    size_t i = 0;
    while (i < len) {
        size_t a = i; /* copy ASCII up to the character before the next non-ASCII byte */
        while (i < len && s[i] < 0x80)
            i++;
        if (i == len) {
            KILN_CHECK(put(out, s + a, i - a));
            break;
        }
        size_t start = i > a ? i - 1 : i;
        KILN_CHECK(put(out, s + a, start - a));
        while (i < len && s[i] >= 0x80)
            i++;
        KILN_CHECK(nf_segment(s + start, i - start, compat, out));
    }
    return KILN_OK;
}

static kiln_status replace(const uint8_t *s, size_t len, const hf_norm_step *st, kiln_bytes *out) {
    const char *pat = st->a;
    size_t i = 0, pl = st->alen;
    while (i < len) {
        const uint8_t *hit = pl ? memchr(s + i, (uint8_t)pat[0], len - i) : NULL;
        while (hit && ((size_t)(s + len - hit) < pl || memcmp(hit, pat, pl) != 0))
            hit = memchr(hit + 1, (uint8_t)pat[0], (size_t)(s + len - hit - 1));
        size_t at = hit ? (size_t)(hit - s) : len;
        KILN_CHECK(put(out, s + i, at - i));
        if (!hit)
            break;
        KILN_CHECK(put(out, st->b, st->blen));
        i = at + pl;
    }
    return KILN_OK;
}

kiln_status kiln__tok_hf_normalize(const tok_hf *h, const uint8_t *s, size_t len, kiln_bytes *out) {
    kiln_bytes tmp[2] = {{0}, {0}};
    const uint8_t *src = s;
    size_t n = len;
    kiln_status st = KILN_OK;
    out->len = 0;
    for (uint32_t k = 0; k < h->n_norm; k++) {
        const hf_norm_step *step = &h->norm[k];
        kiln_bytes *dst = k + 1 == h->n_norm ? out : &tmp[k % 2];
        dst->len = 0;
        switch (step->kind) {
        case HF_NORM_PREPEND:
            KILN_CHECK_GOTO(st, put(dst, step->a, step->alen), done);
            KILN_CHECK_GOTO(st, put(dst, src, n), done);
            break;
        case HF_NORM_REPLACE: KILN_CHECK_GOTO(st, replace(src, n, step, dst), done); break;
        default: KILN_CHECK_GOTO(st, nf(src, n, step->kind == HF_NORM_NFKC, dst), done); break;
        }
        src = (const uint8_t *)dst->data;
        n = dst->len;
    }
    if (h->n_norm == 0)
        st = put(out, s, len);
done:
    kiln_bytes_free(&tmp[0]);
    kiln_bytes_free(&tmp[1]);
    return st;
}
