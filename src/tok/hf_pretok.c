/* The pre-tokeniser patterns of Hugging Face tokenizer.json files that kiln runs, written
 * out by hand, exactly as tokenizers.js's regex engine (JavaScript's, `u` mode) matches them.
 *
 * A pattern is recognised by its whole text (kiln__tok_hf_pattern_of); any other is refused
 * when the file is loaded. Each is an alternation tried left to right at the position where
 * the previous piece ended, and every character is in some alternative, so the pieces tile
 * the text. tokenizers.js rewrites Oniguruma's \s to \p{White_Space} and (?i:...) to ASCII
 * case folding; ByteLevel's own built-in pattern is a JavaScript literal, where \s is
 * JavaScript's (U+FEFF in, U+0085 out). The classes come from hf_unicode_tables.h, generated
 * from node's RegExp. A byte that does not start valid UTF-8 counts as a character of no
 * class (neither letter, number nor space), one byte long. */
#include <pthread.h>
#include <string.h>

#include "tok/hf_internal.h"
#define HF_UNI_WANT_CLASSES
#include "tok/hf_unicode_tables.h"

enum { C_L = 1, C_N = 2, C_WS = 4, C_JSWS = 8, C_CRLF = 16 };

static const char pat_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char pat_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char pat_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

hf_pattern kiln__tok_hf_pattern_of(const char *regex) {
    if (!strcmp(regex, pat_llama3))
        return HF_PAT_LLAMA3;
    if (!strcmp(regex, pat_qwen2))
        return HF_PAT_QWEN2;
    if (!strcmp(regex, pat_gpt2))
        return HF_PAT_SPLIT_GPT2;
    return HF_PAT_NONE;
}

/* ---- classes ---- */

static uint8_t bmp_class[0x10000]; /* the classes of U+0000..U+FFFF */
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static void add_ranges(uint8_t bit, const uint32_t (*r)[2], int n) {
    for (int i = 0; i < n && r[i][0] < 0x10000; i++)
        for (uint32_t c = r[i][0]; c <= r[i][1] && c < 0x10000; c++)
            bmp_class[c] |= bit;
}

static void bmp_init(void) {
    add_ranges(C_L, hf_uni_l, HF_UNI_L_COUNT);
    add_ranges(C_N, hf_uni_n, HF_UNI_N_COUNT);
    add_ranges(C_WS, hf_uni_ws, HF_UNI_WS_COUNT);
    add_ranges(C_JSWS, hf_uni_jsws, HF_UNI_JSWS_COUNT);
    bmp_class['\r'] |= C_CRLF;
    bmp_class['\n'] |= C_CRLF;
}

static int in_ranges(uint32_t c, const uint32_t (*r)[2], int n) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < r[mid][0])
            hi = mid - 1;
        else if (c > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

static uint8_t class_of(uint32_t c) {
    if (c < 0x10000)
        return bmp_class[c];
    if (c == UINT32_MAX)
        return 0;
    return (uint8_t)((in_ranges(c, hf_uni_l, HF_UNI_L_COUNT) ? C_L : 0) |
                     (in_ranges(c, hf_uni_n, HF_UNI_N_COUNT) ? C_N : 0) |
                     (in_ranges(c, hf_uni_ws, HF_UNI_WS_COUNT) ? C_WS : 0) |
                     (in_ranges(c, hf_uni_jsws, HF_UNI_JSWS_COUNT) ? C_JSWS : 0));
}

uint32_t kiln__tok_utf8_next(const uint8_t *s, size_t len, size_t *n) {
    uint8_t c = s[0];
    *n = 1;
    if (c < 0x80)
        return c;
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 ? 1 : 0;
    if (k == 0 || c > 0xF4 || (size_t)k >= len)
        return UINT32_MAX;
    uint32_t cp = c & (0x3F >> k);
    for (int i = 1; i <= k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return UINT32_MAX;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    /* overlong forms, surrogates and code points past U+10FFFF are not characters */
    if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
        return UINT32_MAX;
    *n = (size_t)k + 1;
    return cp;
}

/* The character at p: its class and its length in bytes; at the end class 0, length 0. */
typedef struct ch {
    uint8_t cls;
    uint8_t len;
    uint32_t cp;
} ch;

static inline ch char_at(const uint8_t *s, size_t len, size_t p) {
    ch r = {0, 0, UINT32_MAX};
    if (p >= len)
        return r;
    if (s[p] < 0x80) {
        r.cp = s[p];
        r.cls = bmp_class[s[p]];
        r.len = 1;
        return r;
    }
    size_t n = 1;
    r.cp = kiln__tok_utf8_next(s + p, len - p, &n);
    r.cls = class_of(r.cp);
    r.len = (uint8_t)n;
    return r;
}

/* The end of the run of characters from p whose class has a bit of `any` and none of `none`;
 * at most max characters (0: no limit). */
static size_t run(const uint8_t *s, size_t len, size_t p, uint8_t any, uint8_t none, size_t max) {
    size_t count = 0;
    while (p < len && (max == 0 || count < max)) {
        ch c = char_at(s, len, p);
        if (!(c.cls & any) || (c.cls & none))
            break;
        p += c.len;
        count++;
    }
    return p;
}

/* A run of characters that are none of letters, numbers and `ws`. */
static size_t run_other(const uint8_t *s, size_t len, size_t p, uint8_t ws) {
    while (p < len) {
        ch c = char_at(s, len, p);
        if (c.cls & (C_L | C_N | ws))
            break;
        p += c.len;
    }
    return p;
}

/* 's 't 're 've 'm 'll 'd at p (s[p] == '\''), folding ASCII case when ci: its end or 0. */
static size_t contraction(const uint8_t *s, size_t len, size_t p, int ci) {
    if (p + 1 >= len)
        return 0;
    uint8_t a = s[p + 1], b = p + 2 < len ? s[p + 2] : 0;
    if (ci) {
        a = (uint8_t)(a >= 'A' && a <= 'Z' ? a + 32 : a);
        b = (uint8_t)(b >= 'A' && b <= 'Z' ? b + 32 : b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return p + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return p + 3;
    return 0;
}

/* \s+(?!\S) then \s+ over the space run [p, q) (q: its end). */
static size_t spaces(size_t len, size_t p, size_t q, size_t last_len) {
    if (q == len || q - p == last_len) /* at the end, or a single space: all of it */
        return q;
    return q - last_len; /* before a non-space: all but the last */
}

/* The length in bytes of the last character of the space run [p, q). */
static size_t last_char_len(const uint8_t *s, size_t p, size_t q) {
    size_t k = q - 1;
    while (k > p && (s[k] & 0xC0) == 0x80)
        k--;
    return q - k;
}

/* GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t piece_gpt2(const uint8_t *s, size_t len, size_t p, uint8_t ws) {
    if (s[p] == '\'') {
        size_t e = contraction(s, len, p, 0);
        if (e)
            return e;
    }
    ch c0 = char_at(s, len, p);
    size_t q = p;
    ch c = c0;
    if (c0.cp == ' ') {
        ch c1 = char_at(s, len, p + 1);
        if (c1.len && !(c1.cls & ws)) { /* ' ' before a letter, a number or other */
            q = p + 1;
            c = c1;
        }
    }
    if (c.cls & C_L)
        return run(s, len, q, C_L, 0, 0);
    if (c.cls & C_N)
        return run(s, len, q, C_N, 0, 0);
    if (!(c.cls & ws))
        return run_other(s, len, q, ws);
    size_t e = run(s, len, p, ws, 0, 0);
    return spaces(len, p, e, last_char_len(s, p, e));
}

/* Llama 3's and Qwen 2's pattern (digit_max 3 and 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
 *   |\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t piece_llama3(const uint8_t *s, size_t len, size_t p, size_t digit_max) {
    if (s[p] == '\'') {
        size_t e = contraction(s, len, p, 1);
        if (e)
            return e;
    }
    ch c0 = char_at(s, len, p);
    if (!(c0.cls & (C_CRLF | C_L | C_N))) { /* [^\r\n\p{L}\p{N}] before letters */
        ch c1 = char_at(s, len, p + c0.len);
        if (c1.cls & C_L)
            return run(s, len, p + c0.len, C_L, 0, 0);
    }
    if (c0.cls & C_L)
        return run(s, len, p, C_L, 0, 0);
    if (c0.cls & C_N)
        return run(s, len, p, C_N, 0, digit_max);
    size_t q = p;
    if (c0.cp == ' ') {
        ch c1 = char_at(s, len, p + 1);
        if (c1.len && !(c1.cls & (C_WS | C_L | C_N)))
            q = p + 1;
    }
    if (q > p || !(c0.cls & C_WS)) { /* ' '? other+ [\r\n]* */
        size_t e = run_other(s, len, q, C_WS);
        while (e < len && (s[e] == '\r' || s[e] == '\n'))
            e++;
        return e;
    }
    /* A space run [p, e): \s*[\r\n]+ takes it up to its last \r or \n, if it has one. */
    size_t e = run(s, len, p, C_WS, 0, 0);
    for (size_t k = e; k > p; k--)
        if (s[k - 1] == '\r' || s[k - 1] == '\n')
            return k;
    return spaces(len, p, e, last_char_len(s, p, e));
}

size_t kiln__tok_hf_piece_end(hf_pattern pat, const uint8_t *s, size_t len, size_t pos) {
    pthread_once(&bmp_once, bmp_init);
    switch (pat) {
    case HF_PAT_GPT2: return piece_gpt2(s, len, pos, C_JSWS);
    case HF_PAT_SPLIT_GPT2: return piece_gpt2(s, len, pos, C_WS);
    case HF_PAT_LLAMA3: return piece_llama3(s, len, pos, 3);
    case HF_PAT_QWEN2: return piece_llama3(s, len, pos, 1);
    case HF_PAT_NONE: break;
    }
    return len;
}
