/* GPT-2's pre-tokeniser: the hand-written ASCII scanner must cut text exactly where the
 * regex cuts it. Checked on every string of up to 4 characters over an alphabet with one or
 * more characters of each kind the regex tells apart, and on random longer strings; and the
 * places where kiln_tokenizer_encode_parallel cuts must be places where a piece starts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "test.h"
#include "tok/tok_internal.h"

/* Letters (ASCII and not), digits, spaces of each kind, punctuation, the contraction
 * letters, and invalid UTF-8. */
static const char *alphabet[] = {
    "a",
    "Z",
    "s",
    "l",
    "e",
    "t",
    "0",
    " ",
    "\n",
    "\t",
    "'",
    ".",
    "\x00",
    "\xc3\xa9",         /* e acute: a letter */
    "\xc2\xb2",         /* superscript two: a number */
    "\xc2\xa0",         /* no-break space: white space */
    "\xe3\x80\x80",     /* ideographic space */
    "\xe1\xa0\x8e",     /* U+180E: not white space in tiktoken's sense */
    "\xe2\x80\x94",     /* em dash: punctuation */
    "\xf0\x9f\x98\x80", /* emoji: a symbol */
    "\xff",             /* invalid */
    "\xed\xa0\x80",     /* a lone surrogate's bytes */
    "r",
    "v",
    "m",
    "d",
    "\r",
    "S",
    "L",
    "\xf0\xae\xb2\xb0", /* U+2ECB0, a letter since Unicode 15.1 */
};
enum { NALPHA = sizeof alphabet / sizeof alphabet[0] };

static tok_pretok pre;
static pcre2_match_data *md;

/* Piece ends of s[0..n) with or without the ASCII scanner; returns how many. */
static int pieces(const uint8_t *s, size_t n, int fast, size_t *ends, int cap) {
    int k = 0;
    for (size_t pos = 0, end = 0; pos < n && k < cap; pos = end) {
        if (kiln__tok_pretok_next(&pre, md, s, n, pos, fast, &end) != KILN_OK)
            return -1;
        ends[k++] = end;
    }
    return k;
}

static int same_pieces(const uint8_t *s, size_t n) {
    size_t a[256], b[256];
    int na = pieces(s, n, 1, a, 256), nb = pieces(s, n, 0, b, 256);
    return na == nb && na >= 0 && !memcmp(a, b, (size_t)na * sizeof *a);
}

static void print_string(const uint8_t *s, size_t n) {
    fprintf(stderr, "  differ on \"");
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, s[i] >= 0x20 && s[i] < 0x7f ? "%c" : "\\x%02x", s[i]);
    fprintf(stderr, "\"\n");
}

static void test_every_short_string(void) {
    int bad = 0;
    long count = 0;
    uint8_t s[64];
    for (int len = 1; len <= 4; len++) {
        long total = 1;
        for (int i = 0; i < len; i++)
            total *= NALPHA;
        for (long code = 0; code < total; code++) {
            size_t n = 0;
            long c = code;
            for (int i = 0; i < len; i++, c /= NALPHA) {
                const char *ch = alphabet[c % NALPHA];
                size_t l = ch[0] ? strlen(ch) : 1;
                memcpy(s + n, ch, l);
                n += l;
            }
            count++;
            if (!same_pieces(s, n)) {
                if (bad++ < 5)
                    print_string(s, n);
            }
        }
    }
    fprintf(stderr, "  %ld strings\n", count);
    CHECK_INT_EQ(bad, 0);
}

static void test_random_strings(void) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 5);
    int bad = 0;
    uint8_t s[256];
    for (int trial = 0; trial < 100000; trial++) {
        size_t n = 0;
        int len = 5 + (int)kiln_rng_below(&rng, 20);
        for (int i = 0; i < len; i++) {
            const char *ch = alphabet[kiln_rng_below(&rng, NALPHA)];
            size_t l = ch[0] ? strlen(ch) : 1;
            memcpy(s + n, ch, l);
            n += l;
        }
        if (!same_pieces(s, n) && bad++ < 5)
            print_string(s, n);
    }
    CHECK_INT_EQ(bad, 0);
}

/* Every cut is a piece start, and the pieces after it do not depend on what precedes. */
static void test_safe_cuts(void) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 9);
    const char *w[] = {"The",  " cat", "\n", "  ", "\n\n", " \xc3\xa9t\xc3\xa9", "'s", "x", " ",
                       "\xff", "12",   ".",  "\t", "A"};
    size_t n = 0, cap = 1 << 16;
    uint8_t *s = malloc(cap);
    while (n + 8 < cap) {
        const char *p = w[kiln_rng_below(&rng, 14)];
        memcpy(s + n, p, strlen(p));
        n += strlen(p);
    }
    size_t *starts = calloc(n + 1, 1);
    uint8_t *is_start = (uint8_t *)starts;
    for (size_t pos = 0, end = 0; pos < n; pos = end) {
        CHECK_OK(kiln__tok_pretok_next(&pre, md, s, n, pos, 1, &end));
        is_start[pos] = 1;
    }
    int cuts = 0, bad = 0;
    for (size_t from = 0; from < n;) {
        size_t c = kiln__tok_pretok_safe_cut(s, n, from);
        if (c >= n)
            break;
        cuts++;
        bad += !is_start[c];
        /* the piece at c, seen from a text that starts at c */
        size_t e1 = 0, e2 = 0;
        CHECK_OK(kiln__tok_pretok_next(&pre, md, s, n, c, 1, &e1));
        CHECK_OK(kiln__tok_pretok_next(&pre, md, s + c, n - c, 0, 1, &e2));
        bad += e1 != c + e2;
        from = c + 1;
    }
    fprintf(stderr, "  %d cuts checked\n", cuts);
    CHECK_TRUE(cuts > 1000);
    CHECK_INT_EQ(bad, 0);
    free(starts);
    free(s);
}

int main(void) {
    if (kiln__tok_pretok_init(&pre) != KILN_OK) {
        fprintf(stderr, "cannot compile the regex: %s\n", kiln_error_message());
        return 1;
    }
    md = pcre2_match_data_create_from_pattern(pre.re, NULL);
    fprintf(stderr, "regex JIT: %s\n", pre.jit ? "yes" : "no (interpreter)");
    RUN_TEST(test_every_short_string);
    RUN_TEST(test_random_strings);
    RUN_TEST(test_safe_cuts);
    pcre2_match_data_free(md);
    kiln__tok_pretok_free(&pre);
    TEST_MAIN_END();
}
