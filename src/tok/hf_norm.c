/* The normalisers of Hugging Face tokenizer.json files that kiln runs: Prepend, Replace (of
 * a string), NFC and NFKC, in the file's order (Sequence).
 *
 * NFC and NFKC are utf8proc's. Most text needs no change, and utf8proc is slow next to the
 * rest of encoding, so only the runs of non-ASCII characters that may change go through it:
 * a text may be cut before an ASCII character (it never composes with what precedes it), and
 * under NFC a run of characters that are starters, are their own normal form and never
 * compose with a character before them (the ranges in nfc_inert) is left as it is. Bytes
 * that are not UTF-8 are copied as they are; they end a run like a starter would. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"
#define HF_UNI_WANT_COMPOSE
#include "tok/hf_unicode_tables.h"

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

/* The canonical compositions node's ICU makes and this utf8proc does not know (their
 * composite is unassigned in its Unicode version): applied after utf8proc, with the rule
 * that a character combines with the last starter unless a character between them is a
 * starter or has a combining class at least its own. */
static uint32_t extra[HF_UNI_COMPOSE_COUNT][3];
static int n_extra;
static pthread_once_t extra_once = PTHREAD_ONCE_INIT;

static void extra_init(void) {
    for (int i = 0; i < HF_UNI_COMPOSE_COUNT; i++)
        if (utf8proc_category((utf8proc_int32_t)hf_uni_compose[i][2]) == UTF8PROC_CATEGORY_CN)
            memcpy(extra[n_extra++], hf_uni_compose[i], sizeof extra[0]);
}

static uint32_t extra_compose(uint32_t a, uint32_t b) {
    for (int i = 0; i < n_extra; i++)
        if (extra[i][0] == a && extra[i][1] == b)
            return extra[i][2];
    return UINT32_MAX;
}

static int ccc(uint32_t c) {
    return utf8proc_get_property((utf8proc_int32_t)c)->combining_class;
}

/* Apply the extra compositions to the NFC text out[from..). */
static kiln_status compose_extra(kiln_bytes *out, size_t from) {
    size_t n = out->len - from, k = 0;
    int32_t *cp = malloc((n + 1) * sizeof *cp);
    if (!cp)
        return kiln_error_setf(KILN_ERR_NOMEM, "Unicode normalisation: no memory");
    for (size_t i = 0, l = 1; i < n; i += l)
        cp[k++] = (int32_t)kiln__tok_utf8_next((const uint8_t *)out->data + from + i, n - i, &l);
    size_t m = 0;
    int64_t starter = -1, last = -1; /* in the output cp[0..m) */
    for (size_t i = 0; i < k; i++) {
        int cc = ccc((uint32_t)cp[i]);
        uint32_t c = UINT32_MAX;
        if (starter >= 0 &&
            (last == starter || (ccc((uint32_t)cp[last]) != 0 && ccc((uint32_t)cp[last]) < cc)))
            c = extra_compose((uint32_t)cp[starter], (uint32_t)cp[i]);
        if (c != UINT32_MAX) {
            cp[starter] = (int32_t)c;
            continue;
        }
        cp[m] = cp[i];
        last = (int64_t)m;
        if (cc == 0)
            starter = (int64_t)m;
        m++;
    }
    out->len = from;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < m && st == KILN_OK; i++) {
        utf8proc_uint8_t u[4];
        utf8proc_ssize_t ul = utf8proc_encode_char(cp[i], u);
        st = put(out, u, (size_t)ul);
    }
    free(cp);
    return st;
}

/* Normalise valid UTF-8 s[0..n) through utf8proc. */
static kiln_status unicode_form(const uint8_t *s, size_t n, int compat, kiln_bytes *out) {
    utf8proc_uint8_t *dst = NULL;
    int opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (compat ? UTF8PROC_COMPAT : 0);
    utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opts);
    if (m < 0)
        return kiln_error_setf(KILN_ERR_INTERNAL, "Unicode normalisation: %s", utf8proc_errmsg(m));
    size_t from = out->len;
    kiln_status st = put(out, dst, (size_t)m);
    free(dst);
    pthread_once(&extra_once, extra_init);
    if (st == KILN_OK && n_extra > 0)
        st = compose_extra(out, from);
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
