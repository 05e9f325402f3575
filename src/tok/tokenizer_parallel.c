/* Encoding with many threads: many documents at once, or one long text cut where the
 * pre-tokeniser provably starts a piece. Either way each thread has its own encoder
 * (regex match data, scratch, piece cache) and the ids equal the one-thread ids. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tok/tok_internal.h"

/* Below this a text is encoded by one thread: cutting and joining would cost more. */
#define TOK_PARALLEL_MIN (256 * 1024)

/* The first failure by item number, with its message (messages are per thread). */
typedef struct first_error {
    int64_t at;
    kiln_status s;
    char msg[512];
} first_error;

static void note_error(first_error *fe, int64_t at, kiln_status s) {
#pragma omp critical(kiln_tok_error)
    {
        if (at < fe->at) {
            fe->at = at;
            fe->s = s;
            snprintf(fe->msg, sizeof fe->msg, "%s", kiln_error_message());
        }
    }
}

/* Set the first failure's message on the calling thread (item -1: a thread's set-up). */
static kiln_status report_first(const first_error *fe, const char *what) {
    if (fe->s == KILN_OK)
        return KILN_OK;
    if (fe->at < 0)
        return kiln_error_setf(fe->s, "setting up a thread's encoder: %s", fe->msg);
    return kiln_error_setf(fe->s, "%s %lld: %s", what, (long long)fe->at, fe->msg);
}

kiln_status kiln_tokenizer_encode_many(const kiln_tokenizer *t, const char *const *texts,
                                       const size_t *lens, int64_t n, kiln_tokens *outs) {
    if (!t || n < 0 || (n && (!texts || !lens || !outs)))
        return kiln_error_setf(KILN_ERR_ARG, "kiln_tokenizer_encode_many: missing argument");
    for (int64_t i = 0; i < n; i++)
        if (!texts[i] && lens[i])
            return kiln_error_setf(KILN_ERR_ARG, "kiln_tokenizer_encode_many: text %lld is NULL",
                                   (long long)i);
    first_error fe = {INT64_MAX, KILN_OK, ""};
#pragma omp parallel
    {
        tok_encoder e;
        kiln_status s = kiln__tok_encoder_init(&e, t, 1);
        if (s != KILN_OK)
            note_error(&fe, -1, s);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            if (s != KILN_OK)
                continue;
            /* A copy, so that threads do not share the cache lines of neighbouring outs. */
            kiln_tokens mine = outs[i];
            kiln_status si =
                kiln__tok_encode_range(&e, (const uint8_t *)texts[i], lens[i], 0, lens[i], &mine);
            outs[i] = mine;
            if (si != KILN_OK)
                note_error(&fe, i, si);
        }
        if (s == KILN_OK)
            kiln__tok_encoder_free(&e);
    }
    return report_first(&fe, "encoding document");
}

kiln_status kiln_tokenizer_encode_parallel(const kiln_tokenizer *t, const char *text, size_t len,
                                           kiln_tokens *out) {
    if (!t || !out || (!text && len))
        return kiln_error_setf(KILN_ERR_ARG, "kiln_tokenizer_encode_parallel: missing argument");
    int threads = omp_get_max_threads();
    /* A Hugging Face tokenizer's normalisers (Prepend) make every cut a change: it runs on one
     * thread */
    if (len < TOK_PARALLEL_MIN || threads == 1 || t->kind == TOK_BYTES || t->kind == TOK_HF)
        return kiln_tokenizer_encode(t, text, len, out);
    const uint8_t *s = (const uint8_t *)text;
    int64_t parts = (int64_t)threads * 8;
    size_t *cut = malloc((size_t)(parts + 1) * sizeof *cut);
    kiln_tokens *res = calloc((size_t)parts, sizeof *res);
    if (!cut || !res) {
        free(cut);
        free(res);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %lld parts", (long long)parts);
    }
    cut[0] = 0;
    for (int64_t i = 1; i < parts; i++) {
        size_t target = (size_t)((double)len * (double)i / (double)parts);
        if (target < cut[i - 1])
            target = cut[i - 1];
        cut[i] = kiln__tok_pretok_safe_cut(s, len, target);
    }
    cut[parts] = len;
    first_error fe = {INT64_MAX, KILN_OK, ""};
#pragma omp parallel
    {
        tok_encoder e;
        kiln_status s0 = kiln__tok_encoder_init(&e, t, 1);
        if (s0 != KILN_OK)
            note_error(&fe, -1, s0);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < parts; i++) {
            if (s0 != KILN_OK || cut[i] == cut[i + 1])
                continue;
            kiln_status si = kiln_tokens_reserve(&res[i], (int64_t)((cut[i + 1] - cut[i]) / 3));
            if (si == KILN_OK)
                si = kiln__tok_encode_range(&e, s, len, cut[i], cut[i + 1], &res[i]);
            if (si != KILN_OK)
                note_error(&fe, i, si);
        }
        if (s0 == KILN_OK)
            kiln__tok_encoder_free(&e);
    }
    kiln_status st = report_first(&fe, "encoding part");
    int64_t total = 0;
    for (int64_t i = 0; i < parts; i++)
        total += res[i].len;
    if (st == KILN_OK)
        st = kiln_tokens_reserve(out, total);
    for (int64_t i = 0; i < parts; i++) {
        if (st == KILN_OK && res[i].len) {
            memcpy(out->ids + out->len, res[i].ids, (size_t)res[i].len * sizeof(int32_t));
            out->len += res[i].len;
        }
        kiln_tokens_free(&res[i]);
    }
    free(res);
    free(cut);
    return st;
}
