/* The prepared form of a Hugging Face tokenizer: what tokenizer.json decides and the tables
 * built from it, laid out to be used where it is read, so that a tokenizer loads in a few
 * milliseconds instead of parsing megabytes of JSON and building hash maps.
 *
 * Layout (this machine's byte order, which the header records):
 *   0   8 bytes  magic "KILNHFT\0"
 *   8   u32      format version; u32 0x01020304 (byte order)
 *   16  u64      XXH3 of the tokenizer.json it was made from (a changed file has another
 *                checksum, and the form is made again: never read stale)
 *   24  u64      the tokenizer's identity: XXH3 of what decides the ids (the fields, the
 *                normalisers, the added tokens, every token's bytes and spelling, the special
 *                flags and the merges as (a, b, merged id) by rank)
 *   32  u64      XXH3 of everything after the header
 *   40  u64      0
 *   48  payload: u32 fields[12], u64 sizes[8], then these sections, each at a multiple of
 *       16 bytes: normalisers, added tokens, token offsets, token bytes, special flags,
 *       [spellings' offsets, spellings], merged id by rank, pair map keys and values, piece
 *       map, added tokens' text. */
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

#define HF_CACHE_HEADER 48
#define HF_CACHE_VERSION 2u
#define HF_FIELDS 12
#define HF_SIZES 8
static const char hf_magic[8] = "KILNHFT";

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} wbuf;

static void w(wbuf *b, const void *s, size_t n) {
    size_t pad = (16 - n % 16) % 16;
    if (b->oom)
        return;
    if (b->cap - b->len < n + pad) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap - b->len < n + pad)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    memset(b->p + b->len + n, 0, pad);
    b->len += n + pad;
}

kiln_status kiln__tok_hf_serialize(const kiln_tokenizer *t, uint64_t source_hash, uint8_t **buf,
                                   size_t *len) {
    const tok_hf *h = t->hf;
    wbuf b = {0};
    uint8_t head[HF_CACHE_HEADER] = {0};
    w(&b, head, sizeof head);
    uint32_t f[HF_FIELDS] = {(uint32_t)t->n, (uint32_t)t->eot,     h->style,
                             h->pattern,     h->ignore_merges,     h->byte_fallback,
                             h->sp_cut,      (uint32_t)h->unk,     (uint32_t)h->bos,
                             h->n_norm,      (uint32_t)h->n_added, h->moff ? 1u : 0u};
    uint64_t added_len = 0;
    for (int32_t i = 0; i < h->n_added; i++)
        added_len += h->added[i].len;
    uint64_t g[HF_SIZES] = {(uint64_t)h->n_ranks,
                            t->off[t->n],
                            h->moff ? h->moff[t->n] : 0,
                            added_len,
                            t->pairs.mask,
                            (uint64_t)t->pairs.count,
                            t->piece_mask,
                            0};
    const size_t n1 = (size_t)t->n + 1;
    XXH3_state_t id;
    XXH3_64bits_reset(&id);
    XXH3_64bits_update(&id, f, sizeof f);
    XXH3_64bits_update(&id, g, 4 * sizeof g[0]);
    struct {
        const void *p;
        size_t n;
        int identity; /* 1: decides the ids; 0: a table built from those */
    } sec[] = {
        {h->norm, h->n_norm * sizeof *h->norm, 1},
        {h->added, (size_t)h->n_added * sizeof *h->added, 1},
        {t->off, n1 * sizeof *t->off, 1},
        {t->blob, t->off[t->n], 1},
        {h->special, (size_t)t->n, 1},
        {h->moff, h->moff ? n1 * sizeof *h->moff : 0, 1},
        {h->mblob, h->moff ? h->moff[t->n] : 0, 1},
        {h->rank_ids, (size_t)h->n_ranks * sizeof *h->rank_ids, 0},
        {t->pairs.keys, (t->pairs.mask + 1) * sizeof *t->pairs.keys, 0},
        {t->pairs.vals, (t->pairs.mask + 1) * sizeof *t->pairs.vals, 0},
        {t->pieces, (t->piece_mask + 1) * sizeof *t->pieces, 0},
        {h->added_text, added_len, 1},
    };
    w(&b, f, sizeof f);
    w(&b, g, sizeof g);
    for (size_t i = 0; i < sizeof sec / sizeof sec[0]; i++) {
        w(&b, sec[i].p, sec[i].n);
        if (sec[i].identity && sec[i].n)
            XXH3_64bits_update(&id, sec[i].p, sec[i].n);
    }
    /* The merges by rank decide the ids; the pair map only finds them fast. */
    if (h->rank_merge && h->n_ranks)
        XXH3_64bits_update(&id, h->rank_merge, (size_t)h->n_ranks * sizeof *h->rank_merge);
    if (b.oom) {
        free(b.p);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the prepared form of %s", t->name);
    }
    uint32_t ver[2] = {HF_CACHE_VERSION, 0x01020304u};
    uint64_t ident = XXH3_64bits_digest(&id),
             sum = XXH3_64bits(b.p + HF_CACHE_HEADER, b.len - HF_CACHE_HEADER);
    memcpy(b.p, hf_magic, 8);
    memcpy(b.p + 8, ver, 8);
    memcpy(b.p + 16, &source_hash, 8);
    memcpy(b.p + 24, &ident, 8);
    memcpy(b.p + 32, &sum, 8);
    *buf = b.p;
    *len = b.len;
    return KILN_OK;
}

/* The next section of n bytes, or NULL when the form is too short. */
static void *take(char *buf, size_t len, size_t *at, size_t n) {
    size_t pad = (16 - n % 16) % 16;
    if (len - *at < n + pad)
        return NULL;
    void *p = buf + *at;
    *at += n + pad;
    return p;
}

kiln_status kiln__tok_hf_deserialize(kiln_tokenizer **out, char *buf, size_t len,
                                     uint64_t source_hash, const char *where) {
    *out = NULL;
    uint32_t ver[2], f[HF_FIELDS];
    uint64_t src, ident, sum, g[HF_SIZES];
    const size_t fixed = HF_CACHE_HEADER + sizeof f + 16 + sizeof g;
    if (len < fixed || memcmp(buf, hf_magic, 8) != 0)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: not a prepared tokenizer", where);
    memcpy(ver, buf + 8, 8);
    memcpy(&src, buf + 16, 8);
    memcpy(&ident, buf + 24, 8);
    memcpy(&sum, buf + 32, 8);
    if (ver[0] != HF_CACHE_VERSION || ver[1] != 0x01020304u)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: prepared by another kiln", where);
    if (src != source_hash)
        return kiln_error_setf(KILN_ERR_CHECKSUM, "%s: made from another tokenizer.json", where);
    if (XXH3_64bits(buf + HF_CACHE_HEADER, len - HF_CACHE_HEADER) != sum)
        return kiln_error_setf(KILN_ERR_CHECKSUM, "%s: damaged (checksum)", where);
    size_t at = HF_CACHE_HEADER;
    memcpy(f, take(buf, len, &at, sizeof f), sizeof f);
    memcpy(g, take(buf, len, &at, sizeof g), sizeof g);
    if (f[0] < 1 || f[0] > (1u << 24) || f[9] > HF_MAX_NORM || f[10] > f[0] || g[0] > (1u << 26) ||
        g[1] > UINT32_MAX || g[2] > UINT32_MAX || g[3] > UINT32_MAX || g[4] >= (1u << 28) ||
        (g[4] & (g[4] + 1)) || g[6] >= (1u << 28) || (g[6] & (g[6] + 1)))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: the prepared tokenizer is inconsistent",
                               where);
    kiln_tokenizer *t = NULL;
    KILN_CHECK(kiln__tok_new(&t, TOK_HF, where));
    tok_hf *h = calloc(1, sizeof *h);
    t->hf = h;
    if (!h) {
        kiln_tokenizer_free(t);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a tokenizer");
    }
    h->arena = buf;
    t->n = (int32_t)f[0];
    t->eot = (int32_t)f[1];
    h->style = f[2];
    h->pattern = f[3];
    h->ignore_merges = f[4];
    h->byte_fallback = f[5];
    h->sp_cut = f[6];
    h->unk = (int32_t)f[7];
    h->bos = (int32_t)f[8];
    h->n_norm = f[9];
    h->n_added = (int32_t)f[10];
    h->n_ranks = (int64_t)g[0];
    h->identity = ident;
    const size_t n1 = (size_t)t->n + 1;
    const void *norm = take(buf, len, &at, h->n_norm * sizeof *h->norm);
    if (norm)
        memcpy(h->norm, norm, h->n_norm * sizeof *h->norm);
    h->added = take(buf, len, &at, (size_t)h->n_added * sizeof *h->added);
    t->off = take(buf, len, &at, n1 * sizeof *t->off);
    t->blob = take(buf, len, &at, (size_t)g[1]);
    h->special = take(buf, len, &at, (size_t)t->n);
    int ok = norm && h->added && t->off && t->blob && h->special;
    if (f[11]) {
        h->moff = take(buf, len, &at, n1 * sizeof *h->moff);
        h->mblob = take(buf, len, &at, (size_t)g[2]);
        ok = ok && h->moff && h->mblob;
    }
    h->rank_ids = take(buf, len, &at, (size_t)h->n_ranks * sizeof *h->rank_ids);
    t->pairs.mask = g[4];
    t->pairs.count = (int64_t)g[5];
    t->pairs.keys = take(buf, len, &at, (g[4] + 1) * sizeof *t->pairs.keys);
    t->pairs.vals = take(buf, len, &at, (g[4] + 1) * sizeof *t->pairs.vals);
    t->piece_mask = g[6];
    t->pieces = take(buf, len, &at, (g[6] + 1) * sizeof *t->pieces);
    h->added_text = take(buf, len, &at, (size_t)g[3]);
    ok = ok && h->rank_ids && t->pairs.keys && t->pairs.vals && t->pieces &&
         (h->added_text || g[3] == 0) && at == len && t->off[t->n] == g[1] &&
         (!h->moff || h->moff[t->n] == g[2]) && (uint64_t)t->pairs.count <= g[4];
    t->rank_id = h->rank_ids;
    t->key_off = h->moff;
    t->key_blob = h->mblob;
    kiln_status s = ok ? kiln__tok_hf_finish(t, 1)
                       : kiln_error_setf(KILN_ERR_FORMAT,
                                         "%s: the prepared tokenizer is "
                                         "inconsistent",
                                         where);
    if (s != KILN_OK) {
        h->arena = NULL; /* the caller still owns buf */
        t->off = NULL;
        t->blob = NULL;
        t->pieces = NULL;
        t->pairs.keys = NULL;
        t->pairs.vals = NULL;
        h->added = NULL;
        h->added_text = NULL;
        h->special = NULL;
        h->moff = NULL;
        h->mblob = NULL;
        h->rank_ids = NULL;
        kiln_tokenizer_free(t);
        return s;
    }
    *out = t;
    return KILN_OK;
}
