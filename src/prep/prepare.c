/* kiln prepare: documents in, train and val token shards out (see kiln/prepare.h).
 *
 * Pass 1 (prepare_inputs.c) checks and counts every document and decides the split.
 * Pass 2 reads the documents again in order, cuts them into segments of about SEGMENT
 * bytes where a cut cannot change the ids (kiln__prep_is_safe_cut), gathers segments into a
 * batch, encodes the batch's segments in parallel (kiln_tokenizer_encode_many: the ids do
 * not depend on the thread count), then appends the ids in order to the train or val output,
 * each document led by <|endoftext|> when the tokenizer has one. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "kiln/core.h"
#include "kiln/tokenizer.h"
#include "prep/prepare_internal.h"
#include "prep/prepare_out.h"

enum {
    SEGMENT = 1 << 20,          /* bytes per segment, one encode call */
    BATCH_MIN = 8 << 20,        /* bytes per batch */
    BATCH_PER_THREAD = 4 << 20, /* ... at least this much per thread */
    SEGS_PER_BATCH = 1 << 16,   /* many small documents: bound the segments per batch */
};

void kiln_prepare_config_default(kiln_prepare_config *c) {
    memset(c, 0, sizeof *c);
    c->val_fraction = 0.1;
    c->seed = 1337;
    c->shard_tokens = 100000000;
    c->binary = KILN_PREPARE_BINARY_ERROR;
}

typedef struct segment {
    size_t off, len; /* bytes in the batch's arena */
    int64_t doc;     /* document number, to count invalid UTF-8 once per document */
    int split;       /* 0 train, 1 val */
    int doc_start;   /* 1: <|endoftext|> goes first */
    int bad_utf8;
} segment;

typedef struct run {
    const kiln_prepare_config *cfg;
    kiln_prepare_summary *sum;
    const kiln_tokenizer *tok; /* the caller's */
    int32_t eot;
    int threads;
    prep_inputs in;
    prep_out out[2]; /* train, val */
    /* the batch */
    char *arena;
    size_t arena_len, arena_cap, batch_bytes;
    segment *segs;
    kiln_tokens *ids; /* [SEGS_PER_BATCH], buffers kept between batches */
    const char **texts;
    size_t *lens;
    int nseg;
    int64_t last_bad_doc;              /* the last document counted as invalid UTF-8 */
    int64_t docs_done, bytes_done;     /* encoded, for progress */
    int64_t docs_queued, bytes_queued; /* handed to the batch */
    int64_t text_appended;             /* text bytes whose ids went to the outputs */
    int64_t doc_base;                  /* input bytes before the current document */
    const char *doc_text;              /* the current document, for progress within it */
    double t0, last_report;
} run;

static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
        if (k < 0 || i + (size_t)k >= n)
            return 0;
        uint32_t cp = c & (0x3Fu >> k);
        for (int j = 1; j <= k; j++) {
            if ((s[i + (size_t)j] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + (size_t)j] & 0x3Fu);
        }
        static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

static void report(run *r, int last) {
    const kiln_prepare_config *c = r->cfg;
    double now = kiln_time_ms();
    if (!c->progress || (!last && now - r->last_report < 100))
        return;
    r->last_report = now;
    kiln_prepare_progress p = {r->bytes_done,
                               r->in.bytes_total,
                               r->docs_done,
                               r->in.docs,
                               r->out[0].tokens + r->out[1].tokens,
                               (now - r->t0) / 1000};
    c->progress(c->ctx, &p);
}

/* Encode every segment of the batch, then append the ids in order. */
static kiln_status flush(run *r) {
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(r->threads);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < r->nseg; i++) {
        segment *s = &r->segs[i];
        r->texts[i] = r->arena + s->off;
        r->lens[i] = s->len;
        r->ids[i].len = 0;
        s->bad_utf8 = !utf8_valid((const unsigned char *)r->texts[i], s->len);
    }
    kiln_status st = kiln_tokenizer_encode_many(r->tok, r->texts, r->lens, r->nseg, r->ids);
    omp_set_num_threads(saved_threads);
    if (st != KILN_OK)
        return kiln_error_wrapf(st, "encoding");
    for (int i = 0; i < r->nseg; i++) {
        segment *s = &r->segs[i];
        if (s->bad_utf8 && s->doc != r->last_bad_doc) {
            r->sum->invalid_utf8++;
            r->last_bad_doc = s->doc;
        }
        prep_out *o = &r->out[s->split];
        if (s->doc_start && r->eot >= 0)
            KILN_CHECK(kiln__prep_out_append(o, &r->eot, 1));
        KILN_CHECK(kiln__prep_out_append(o, r->ids[i].ids, r->ids[i].len));
        r->text_appended += (int64_t)s->len;
    }
    r->nseg = 0;
    r->arena_len = 0;
    r->docs_done = r->docs_queued;
    r->bytes_done = r->bytes_queued;
    report(r, 0);
    return KILN_OK;
}

/* Queue text[0..len) as segments of one document part going to split. */
static kiln_status add_text(run *r, const char *text, size_t len, int64_t doc, int split) {
    size_t pos = 0;
    do {
        size_t end = len - pos > SEGMENT ? kiln__prep_next_cut(text, len, pos + SEGMENT) : len;
        size_t n = end - pos;
        if (r->nseg > 0 && (r->arena_len + n > r->batch_bytes || r->nseg == SEGS_PER_BATCH))
            KILN_CHECK(flush(r));
        if (r->arena_len + n > r->arena_cap) {
            size_t cap = r->arena_cap ? r->arena_cap : r->batch_bytes;
            while (cap < r->arena_len + n)
                cap *= 2;
            char *a = realloc(r->arena, cap);
            if (!a)
                return kiln_error_setf(KILN_ERR_NOMEM, "no memory for %zu bytes of text", cap);
            r->arena = a;
            r->arena_cap = cap;
        }
        memcpy(r->arena + r->arena_len, text + pos, n);
        r->segs[r->nseg] = (segment){r->arena_len, n, doc, split, pos == 0, 0};
        r->nseg++;
        r->arena_len += n;
        pos = end;
        r->bytes_queued = r->doc_base + (int64_t)(text + end - r->doc_text);
    } while (pos < len);
    return KILN_OK;
}

/* The only document: its head is train, its tail val (see kiln/prepare.h). */
static kiln_status add_single(run *r, const char *text, size_t len) {
    double f = r->cfg->val_fraction;
    if (f <= 0 || len < 2) {
        if (f > 0)
            kiln__prep_note(r->cfg, "note: the only document is too short to split; val is empty");
        r->sum->train_documents++;
        return add_text(r, text, len, 0, 0);
    }
    size_t target = (size_t)((1.0 - f) * (double)len), cut = kiln__prep_next_cut(text, len, target);
    for (size_t i = target; cut == len && i > 0; i--)
        if (kiln__prep_is_safe_cut(text, len, i))
            cut = i;
    if (cut == len || cut == 0) { /* nowhere safe: cut at a character boundary */
        cut = target > 0 ? target : 1;
        while (cut > 1 && ((unsigned char)text[cut] & 0xC0) == 0x80)
            cut--;
    }
    r->sum->split_single_document = 1;
    r->sum->train_documents++;
    r->sum->val_documents++;
    KILN_CHECK(add_text(r, text, cut, 0, 0));
    return add_text(r, text + cut, len - cut, 0, 1);
}

static kiln_status encode_all(run *r) {
    int64_t doc = 0;
    for (int fi = 0; fi < r->in.n; fi++) {
        const prep_file *f = &r->in.files[fi];
        if (f->skip)
            continue;
        prep_reader rd;
        KILN_CHECK(kiln__prep_reader_open(&rd, f));
        kiln_status st = KILN_OK;
        int64_t before = r->bytes_queued;
        for (;;) {
            r->doc_base = before + rd.bytes_read;
            const char *text;
            size_t len;
            if ((st = kiln__prep_reader_next(&rd, &text, &len)) != KILN_OK || !text)
                break;
            r->sum->bytes += (int64_t)len;
            r->doc_text = text;
            if (r->in.docs == 1) {
                st = add_single(r, text, len);
            } else {
                int val = kiln__prep_doc_is_val(&r->in, r->cfg->seed, doc);
                r->sum->train_documents += !val;
                r->sum->val_documents += val;
                st = add_text(r, text, len, doc, val);
            }
            if (st != KILN_OK)
                break;
            doc++;
            r->docs_queued = doc;
            r->bytes_queued = before + rd.bytes_read;
        }
        kiln__prep_reader_close(&rd);
        KILN_CHECK(st);
    }
    r->sum->documents = doc;
    return r->nseg ? flush(r) : KILN_OK;
}

/* A path as JSON: a string when it is valid UTF-8, else {"hex": its bytes in hex}, so that
 * prepare.json stays valid JSON and still names the file exactly. */
static cJSON *json_path(const char *path) {
    size_t n = strlen(path);
    if (utf8_valid((const unsigned char *)path, n))
        return cJSON_CreateString(path);
    char *hex = malloc(2 * n + 1);
    if (!hex)
        return NULL;
    for (size_t i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)path[i]);
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "hex", hex)) {
        cJSON_Delete(o);
        o = NULL;
    }
    free(hex);
    return o;
}

static void add_hex64(cJSON *o, const char *key, uint64_t v) {
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
    cJSON_AddStringToObject(o, key, hex);
}

static char *manifest_json(const run *r, const kiln_prepare_summary *s) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "tokenizer", json_path(kiln_tokenizer_name(r->tok)));
    add_hex64(root, "tokenizer_id", kiln_tokenizer_id(r->tok));
    cJSON_AddNumberToObject(root, "vocab_size", (double)s->vocab_size);
    cJSON_AddNumberToObject(root, "eot", r->eot);
    cJSON_AddNumberToObject(root, "val_fraction", r->cfg->val_fraction);
    cJSON_AddNumberToObject(root, "seed", (double)r->cfg->seed);
    cJSON_AddNumberToObject(root, "shard_tokens", (double)r->cfg->shard_tokens);
    cJSON_AddNumberToObject(root, "documents", (double)s->documents);
    cJSON_AddNumberToObject(root, "bytes", (double)s->bytes);
    cJSON_AddBoolToObject(root, "split_single_document", s->split_single_document);
    const int64_t docs[2] = {s->train_documents, s->val_documents};
    for (int k = 0; k < 2; k++) {
        const prep_out *o = &r->out[k];
        cJSON *split = cJSON_AddObjectToObject(root, o->name);
        cJSON *list = cJSON_AddArrayToObject(split, "shards");
        for (int i = 0; i < o->shards; i++) {
            char name[64];
            kiln__prep_shard_name(name, sizeof name, o->name, i, o->shards);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", name);
            cJSON_AddNumberToObject(e, "tokens", (double)o->recs[i].tokens);
            add_hex64(e, "xxh3", o->recs[i].hash);
            cJSON_AddItemToArray(list, e);
        }
        cJSON_AddNumberToObject(split, "tokens", (double)o->tokens);
        cJSON_AddNumberToObject(split, "documents", (double)docs[k]);
    }
    cJSON *in = cJSON_AddArrayToObject(root, "inputs");
    for (int i = 0; i < r->cfg->num_inputs; i++)
        cJSON_AddItemToArray(in, json_path(r->cfg->inputs[i]));
    if (r->cfg->num_inputs == 0)
        cJSON_AddItemToArray(in, json_path(r->cfg->corpus_dir));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

/* A --shard-tokens to suggest for about `tokens` ids: enough for KILN_PREPARE_MAX_SHARDS
 * shards, rounded up to one significant digit. */
static long long suggest_shard_tokens(double tokens) {
    double need = tokens / KILN_PREPARE_MAX_SHARDS, p = 1;
    while (p * 10 <= need)
        p *= 10;
    long long v = (long long)(p * ceil(need / p));
    return v > 1 ? v : 2;
}

/* Refuse before writing anything when even the fewest ids the text can give (every token as
 * long as the tokenizer's longest) fill more than KILN_PREPARE_MAX_SHARDS shards in the larger
 * split, which holds at least half of them. Runs that only encoding shows to be too large are
 * stopped by prep_out when a split reaches the limit. */
static kiln_status check_shard_count(const run *r) {
    size_t longest = 1;
    for (int32_t id = 0; id < kiln_tokenizer_vocab_size(r->tok); id++) {
        const char *b;
        size_t n;
        if (id != r->eot && kiln_tokenizer_token_bytes(r->tok, id, &b, &n) == KILN_OK)
            longest = n > longest ? n : longest;
    }
    double text = 0;
    for (int i = 0; i < r->in.n; i++)
        if (!r->in.files[i].skip)
            text += (double)r->in.files[i].text;
    double fewest = text / (double)longest;
    double limit = (double)r->cfg->shard_tokens * (KILN_PREPARE_MAX_SHARDS + 1);
    if (fewest / 2 <= limit)
        return KILN_OK;
    return kiln_error_setf(KILN_ERR_CONFIG,
                           "prepare: %.0f bytes of text make at least %.0f tokens, more than %d "
                           "shards of --shard-tokens %lld: pass a larger --shard-tokens (at least "
                           "%lld; the default is 100000000)",
                           text, fewest, KILN_PREPARE_MAX_SHARDS, (long long)r->cfg->shard_tokens,
                           suggest_shard_tokens(fewest));
}

/* A split that reached KILN_PREPARE_MAX_SHARDS while encoding: say how large a shard would do,
 * from the split's ids per byte of text so far (an estimate: the text may change). */
static kiln_status explain_too_many(const run *r, kiln_status st) {
    for (int k = 0; k < 2; k++) {
        const prep_out *o = &r->out[k];
        if (!o->too_many)
            continue;
        double done = r->text_appended > 0 ? (double)r->text_appended : 1;
        double tokens = (double)o->tokens * (double)r->in.bytes_total / done;
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "prepare: the %s split needs more than %d shards of --shard-tokens "
                               "%lld: pass a larger --shard-tokens (about %lld)",
                               o->name, KILN_PREPARE_MAX_SHARDS, (long long)o->shard_tokens,
                               suggest_shard_tokens(tokens));
    }
    return st;
}

static kiln_status check_config(const kiln_prepare_config *c) {
    if (!c->tokenizer || !c->out_dir)
        return kiln_error_setf(KILN_ERR_ARG, "prepare: tokenizer and output folder are required");
    if (!(c->val_fraction >= 0 && c->val_fraction < 1))
        return kiln_error_setf(KILN_ERR_ARG, "prepare: val fraction %g is not in [0, 1)",
                               c->val_fraction);
    if (c->shard_tokens < 1)
        return kiln_error_setf(KILN_ERR_ARG, "prepare: shard size %lld tokens is not positive",
                               (long long)c->shard_tokens);
    if (c->num_inputs < 0 || (c->num_inputs > 0 && !c->inputs))
        return kiln_error_setf(KILN_ERR_ARG, "prepare: bad list of inputs");
    return KILN_OK;
}

static kiln_status run_all(run *r, char **staging) {
    const kiln_prepare_config *c = r->cfg;
    KILN_CHECK(kiln__prep_inputs_collect(&r->in, c));
    r->sum->empty_skipped = r->in.empty;
    r->sum->binary_files = r->in.binary;
    r->tok = c->tokenizer;
    r->eot = kiln_tokenizer_eot(r->tok);
    r->sum->vocab_size = kiln_tokenizer_vocab_size(r->tok);
    r->threads = c->threads > 0 ? c->threads : omp_get_max_threads();
    r->batch_bytes = (size_t)r->threads * BATCH_PER_THREAD;
    r->batch_bytes = r->batch_bytes > BATCH_MIN ? r->batch_bytes : BATCH_MIN;
    r->segs = calloc(SEGS_PER_BATCH, sizeof *r->segs);
    r->ids = calloc(SEGS_PER_BATCH, sizeof *r->ids);
    r->texts = calloc(SEGS_PER_BATCH, sizeof *r->texts);
    r->lens = calloc(SEGS_PER_BATCH, sizeof *r->lens);
    if (!r->segs || !r->ids || !r->texts || !r->lens)
        return kiln_error_setf(KILN_ERR_NOMEM, "prepare: no memory for a batch");
    KILN_CHECK(check_shard_count(r));
    KILN_CHECK(kiln__prep_stage_begin(c->out_dir, staging));
    uint64_t tok_id = kiln_tokenizer_id(r->tok);
    kiln__prep_out_init(&r->out[0], "train", *staging, r->sum->vocab_size, c->shard_tokens, tok_id);
    kiln__prep_out_init(&r->out[1], "val", *staging, r->sum->vocab_size, c->shard_tokens, tok_id);
    KILN_CHECK(encode_all(r));
    KILN_CHECK(kiln__prep_out_finish(&r->out[0]));
    KILN_CHECK(kiln__prep_out_finish(&r->out[1]));
    r->sum->train_tokens = r->out[0].tokens;
    r->sum->val_tokens = r->out[1].tokens;
    r->sum->train_shards = r->out[0].shards;
    r->sum->val_shards = r->out[1].shards;
    char *manifest = manifest_json(r, r->sum);
    if (!manifest)
        return kiln_error_setf(KILN_ERR_NOMEM, "prepare: no memory for prepare.json");
    kiln_status st = kiln__prep_stage_commit(c->out_dir, *staging, r->out, 2, manifest);
    free(manifest);
    return st;
}

kiln_status kiln_prepare(const kiln_prepare_config *cfg, kiln_prepare_summary *summary) {
    kiln_prepare_summary local;
    kiln_prepare_summary *sum = summary ? summary : &local;
    memset(sum, 0, sizeof *sum);
    KILN_CHECK(check_config(cfg));
    run r = {.cfg = cfg, .sum = sum, .last_bad_doc = -1};
    r.t0 = kiln_time_ms();
    r.last_report = r.t0 - 1e9; /* the first batch reports at once */
    char *staging = NULL;
    kiln_status st = run_all(&r, &staging);
    if (st != KILN_OK)
        st = explain_too_many(&r, st);
    sum->seconds = (kiln_time_ms() - r.t0) / 1000;
    if (st == KILN_OK)
        report(&r, 1);
    else
        kiln__prep_stage_abort(staging); /* the output folder keeps what it had */
    free(staging);
    kiln__prep_out_free(&r.out[0]);
    kiln__prep_out_free(&r.out[1]);
    for (int i = 0; r.ids && i < SEGS_PER_BATCH; i++)
        kiln_tokens_free(&r.ids[i]);
    free(r.ids);
    free(r.texts);
    free(r.lens);
    free(r.segs);
    free(r.arena);
    kiln__prep_inputs_free(&r.in);
    return st;
}
