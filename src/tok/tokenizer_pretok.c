/* GPT-2's pre-tokeniser: text -> pieces that BPE then encodes one by one.
 *
 * The definition is the regex (tiktoken's "gpt2" pattern), run by PCRE2 with Unicode
 * properties. Most text is ASCII, and for ASCII the regex's choice at a position is simple
 * enough to write out by hand; the scanner below does that and hands every position whose
 * piece depends on a non-ASCII byte back to the regex, so it gives the regex's pieces
 * exactly (tests/unit/test_tokenizer_pretok.c compares the two on every short string over
 * an alphabet of each character class, and on random text). */
#include <string.h>

#include "core/error.h"
#include "tok/tok_internal.h"

/* The pattern's alternatives, in the order PCRE2 tries them:
 *   contractions | ' '? letters | ' '? digits | ' '? other | spaces not before a non-space
 *   | spaces.
 * The classes are those of tiktoken's regex engine (Rust's regex-syntax 0.8.5, Unicode 16.0):
 * - \s is spelled out as Unicode's White_Space property: PCRE2's \s also takes U+180E,
 *   which Unicode stopped calling a space in 6.3;
 * - \p{L} and \p{N} get the letters and numbers Unicode added after 14.0, the tables of
 *   PCRE2 10.42 (a newer PCRE2 already has them; the union is the same). Without them a
 *   letter from Unicode 15 or 16 followed by "'s" would swallow the apostrophe.
 * tests/tok/unicode_classes.mjs prints the two lists below from the Unicode data. */
#define TOK_WS                                                                                     \
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"             \
    "\\x{202F}\\x{205F}\\x{3000}"
#define TOK_L16                                                                                    \
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"               \
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"         \
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}"                               \
    "\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}"                                          \
    "\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"                               \
    "\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}"         \
    "\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}"                                          \
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}"                    \
    "\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define TOK_N16                                                                                    \
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"         \
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"         \
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"
#define TOK_LET "\\p{L}" TOK_L16
#define TOK_NUM "\\p{N}" TOK_N16
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?[" TOK_LET "]+| ?[" TOK_NUM "]+| ?[^" TOK_WS TOK_LET TOK_NUM "]+"
    "|[" TOK_WS "]+(?![^" TOK_WS "])|[" TOK_WS "]+";

kiln_status kiln__tok_pretok_init(tok_pretok *p) {
    memset(p, 0, sizeof *p);
    int err = 0;
    PCRE2_SIZE erroff = 0;
    p->re = pcre2_compile((PCRE2_SPTR)gpt2_pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &erroff, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return kiln_error_setf(KILN_ERR_INTERNAL,
                               "compiling GPT-2's pre-tokeniser regex: %s at %zu",
                               (const char *)msg, (size_t)erroff);
    }
    /* Without JIT (a PCRE2 built without it) the interpreter gives the same matches. */
    p->jit = pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE) == 0;
    return KILN_OK;
}

void kiln__tok_pretok_free(tok_pretok *p) {
    if (p->re)
        pcre2_code_free(p->re);
    p->re = NULL;
}

/* ASCII classes as the regex sees them; bytes >= 0x80 are H (the regex decides). */
enum { P = 0, L = 1, N = 2, S = 3, H = 4 };
/* One row per 16 bytes. */
/* clang-format off */
#define H16 H, H, H, H, H, H, H, H, H, H, H, H, H, H, H, H
static const uint8_t cls[256] = {
    P, P, P, P, P, P, P, P, P, S, S, S, S, S, P, P,
    P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P,
    S, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P,
    N, N, N, N, N, N, N, N, N, N, P, P, P, P, P, P,
    P, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L,
    L, L, L, L, L, L, L, L, L, L, L, P, P, P, P, P,
    P, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L,
    L, L, L, L, L, L, L, L, L, L, L, P, P, P, P, P,
    H16, H16, H16, H16, H16, H16, H16, H16,
};
#undef H16
/* clang-format on */

/* The regex's piece at p when it is decided by ASCII bytes alone: returns 1 and sets
 * *end; returns 0 when a byte >= 0x80 takes part in the decision. */
static int ascii_piece(const uint8_t *s, size_t len, size_t p, size_t *end) {
    uint8_t c = s[p];
    int k = cls[c];
    if (k == H)
        return 0;
    if (c == '\'' && p + 1 < len) { /* 's 't 'm 'd 're 've 'll, lower case only */
        uint8_t d = s[p + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') {
            *end = p + 2;
            return 1;
        }
        if (p + 2 < len) {
            uint8_t f = s[p + 2];
            if ((d == 'r' && f == 'e') || (d == 'v' && f == 'e') || (d == 'l' && f == 'l')) {
                *end = p + 3;
                return 1;
            }
        }
    }
    size_t q = p;
    if (c == ' ' && p + 1 < len) { /* ' '? before letters, digits or other */
        int k2 = cls[s[p + 1]];
        if (k2 == H)
            return 0;
        if (k2 != S) {
            k = k2;
            q = p + 1;
        }
    }
    q++;
    if (k != S) { /* a run of one class */
        while (q < len && cls[s[q]] == k)
            q++;
        if (q < len && s[q] >= 0x80)
            return 0;
        *end = q;
        return 1;
    }
    /* Spaces: all of them at the end of the text; before a non-space, all but the last
     * (\s+(?!\S) backs off one), or the single one (\s+). */
    while (q < len && cls[s[q]] == S)
        q++;
    if (q == len) {
        *end = q;
        return 1;
    }
    if (s[q] >= 0x80)
        return 0;
    *end = q - p >= 2 ? q - 1 : q;
    return 1;
}

kiln_status kiln__tok_pretok_next(const tok_pretok *p, pcre2_match_data *md, const uint8_t *s,
                                  size_t len, size_t pos, int ascii_fast, size_t *end) {
    if (ascii_fast && ascii_piece(s, len, pos, end))
        return KILN_OK;
    int rc = p->jit ? pcre2_jit_match(p->re, s, len, pos, 0, md, NULL)
                    : pcre2_match(p->re, s, len, pos, 0, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) { /* invalid UTF-8 up to the end */
        *end = len;
        return KILN_OK;
    }
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return kiln_error_setf(KILN_ERR_INTERNAL, "pre-tokeniser regex at byte %zu: %s", pos,
                               (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    /* A match that starts later leaves invalid UTF-8 before it: that is a piece too. */
    *end = ov[0] > pos ? ov[0] : ov[1];
    if (*end <= pos || *end > len)
        return kiln_error_setf(KILN_ERR_INTERNAL, "pre-tokeniser made no progress at byte %zu",
                               pos);
    return KILN_OK;
}

/* A piece starts at b when b follows a newline and is a letter (the newline ends a run of
 * spaces, and nothing else takes a newline), or when b is a space between two letters (the
 * letter before ends its piece, the space starts " letters"). Matching at b reads nothing
 * before b, so the pieces from b on are the same whatever came before. */
size_t kiln__tok_pretok_safe_cut(const uint8_t *s, size_t len, size_t from) {
    for (size_t b = from > 0 ? from : 1; b + 1 < len; b++) {
        if (cls[s[b]] == L && s[b - 1] == '\n')
            return b;
        if (s[b] == ' ' && cls[s[b - 1]] == L && cls[s[b + 1]] == L)
            return b;
    }
    return len;
}
