/* The prepared form of a Hugging Face tokenizer: what tokenizer.json decides, ready to use,
 * so that a tokenizer loads in milliseconds instead of parsing megabytes of JSON.
 *
 * Layout (this machine's byte order, which the header records):
 *   0   8 bytes  magic "KILNHFT\0"
 *   8   u32      format version; u32 0x01020304 (byte order)
 *   16  u64      XXH3 of the tokenizer.json it was made from (never read stale: a changed
 *                file has another checksum, and the cache is made again)
 *   24  u64      XXH3 of the payload after this header (the tokenizer's identity)
 *   32  payload: u32 fields (n, eot, style, pattern, ignore_merges, byte_fallback, sp_cut,
 *                unk, bos, n_norm, n_added, has spellings), u64 n_ranks, u64 sizes of the
 *                blobs, then the normalisers, added tokens, offsets and bytes of every token,
 *                special flags, spellings (SentencePiece style), merges, added tokens' text. */
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

#define HF_CACHE_HEADER 32
#define HF_CACHE_VERSION 1u
static const char hf_magic[8] = "KILNHFT";

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} wbuf;

static void w(wbuf *b, const void *s, size_t n) {
    if (b->oom)
        return;
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap - b->len < n)
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
    b->len += n;
}

kiln_status kiln__tok_hf_serialize(const kiln_tokenizer *t, uint64_t source_hash, uint8_t **buf,
                                   size_t *len) {
    const tok_hf *h = t->hf;
    wbuf b = {0};
    uint8_t head[HF_CACHE_HEADER] = {0};
    uint32_t ver[2] = {HF_CACHE_VERSION, 0x01020304u};
    memcpy(head, hf_magic, 8);
    memcpy(head + 8, ver, 8);
    memcpy(head + 16, &source_hash, 8);
    w(&b, head, sizeof head);
    uint32_t f[12] = {(uint32_t)t->n, (uint32_t)t->eot,     h->style,
                      h->pattern,     h->ignore_merges,     h->byte_fallback,
                      h->sp_cut,      (uint32_t)h->unk,     (uint32_t)h->bos,
                      h->n_norm,      (uint32_t)h->n_added, h->moff ? 1u : 0u};
    uint64_t added_len = 0;
    for (int32_t i = 0; i < h->n_added; i++)
        added_len += h->added[i].len;
    uint64_t g[4] = {(uint64_t)h->n_ranks, t->off[t->n], h->moff ? h->moff[t->n] : 0, added_len};
    w(&b, f, sizeof f);
    w(&b, g, sizeof g);
    w(&b, h->norm, h->n_norm * sizeof *h->norm);
    w(&b, h->added, (size_t)h->n_added * sizeof *h->added);
    w(&b, t->off, ((size_t)t->n + 1) * sizeof *t->off);
    w(&b, t->blob, t->off[t->n]);
    w(&b, h->special, (size_t)t->n);
    if (h->moff) {
        w(&b, h->moff, ((size_t)t->n + 1) * sizeof *h->moff);
        w(&b, h->mblob, h->moff[t->n]);
    }
    w(&b, h->rank_merge, (size_t)h->n_ranks * sizeof *h->rank_merge);
    w(&b, h->added_text, added_len);
    if (b.oom) {
        free(b.p);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the prepared form of %s", t->name);
    }
    uint64_t id = XXH3_64bits(b.p + HF_CACHE_HEADER, b.len - HF_CACHE_HEADER);
    memcpy(b.p + 24, &id, 8);
    *buf = b.p;
    *len = b.len;
    return KILN_OK;
}

typedef struct rbuf {
    const uint8_t *p;
    size_t len, at;
} rbuf;

/* Copy n bytes into a new allocation *dst (n may be 0); -1 when the data is short. */
static int r_alloc(rbuf *b, void **dst, size_t n) {
    if (b->len - b->at < n)
        return -1;
    if (kiln_alloc_checked(dst, n ? n : 1, "prepared tokenizer") != KILN_OK)
        return -1;
    if (n)
        memcpy(*dst, b->p + b->at, n);
    b->at += n;
    return 0;
}

kiln_status kiln__tok_hf_deserialize(kiln_tokenizer **out, const uint8_t *buf, size_t len,
                                     uint64_t source_hash, const char *where) {
    *out = NULL;
    uint32_t ver[2];
    uint64_t src, id;
    if (len < HF_CACHE_HEADER + 48 + 32 || memcmp(buf, hf_magic, 8) != 0)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: not a prepared tokenizer", where);
    memcpy(ver, buf + 8, 8);
    memcpy(&src, buf + 16, 8);
    memcpy(&id, buf + 24, 8);
    if (ver[0] != HF_CACHE_VERSION || ver[1] != 0x01020304u)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: prepared by another kiln", where);
    if (src != source_hash)
        return kiln_error_setf(KILN_ERR_CHECKSUM, "%s: made from another tokenizer.json", where);
    if (XXH3_64bits(buf + HF_CACHE_HEADER, len - HF_CACHE_HEADER) != id)
        return kiln_error_setf(KILN_ERR_CHECKSUM, "%s: damaged (checksum)", where);
    uint32_t f[12];
    uint64_t g[4];
    memcpy(f, buf + HF_CACHE_HEADER, sizeof f);
    memcpy(g, buf + HF_CACHE_HEADER + sizeof f, sizeof g);
    kiln_tokenizer *t = NULL;
    KILN_CHECK(kiln__tok_new(&t, TOK_HF, where));
    kiln_status s = KILN_OK;
    tok_hf *h = calloc(1, sizeof *h);
    t->hf = h;
    if (!h || f[0] < 1 || f[0] > (1u << 24) || f[9] > HF_MAX_NORM || f[10] > f[0] ||
        g[0] > (1u << 26) || g[1] > UINT32_MAX || g[2] > UINT32_MAX || g[3] > UINT32_MAX)
        goto bad;
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
    rbuf b = {buf, len, HF_CACHE_HEADER + sizeof f + sizeof g};
    size_t n1 = (size_t)t->n + 1;
    if (b.len - b.at < h->n_norm * sizeof *h->norm)
        goto bad;
    memcpy(h->norm, b.p + b.at, h->n_norm * sizeof *h->norm);
    b.at += h->n_norm * sizeof *h->norm;
    if (r_alloc(&b, (void **)&h->added, (size_t)h->n_added * sizeof *h->added) ||
        r_alloc(&b, (void **)&t->off, n1 * sizeof *t->off) ||
        r_alloc(&b, (void **)&t->blob, (size_t)g[1]) ||
        r_alloc(&b, (void **)&h->special, (size_t)t->n))
        goto bad;
    if (f[11] && (r_alloc(&b, (void **)&h->moff, n1 * sizeof *h->moff) ||
                  r_alloc(&b, (void **)&h->mblob, (size_t)g[2])))
        goto bad;
    if (r_alloc(&b, (void **)&h->rank_merge, (size_t)h->n_ranks * sizeof *h->rank_merge) ||
        r_alloc(&b, (void **)&h->added_text, (size_t)g[3]) || b.at != b.len)
        goto bad;
    /* The checksum says these are the bytes that were written; a written form is whole. */
    if (t->off[t->n] != g[1] || (h->moff && h->moff[t->n] != g[2]))
        goto bad;
    h->identity = id;
    t->key_off = h->moff;
    t->key_blob = h->mblob;
    KILN_CHECK_GOTO(s, kiln__tok_build_piece_map(t), fail);
    KILN_CHECK_GOTO(s, kiln__tok_hf_finish(t), fail);
    *out = t;
    return KILN_OK;
bad:
    s = kiln_error_setf(KILN_ERR_FORMAT, "%s: the prepared tokenizer is inconsistent", where);
fail:
    kiln_tokenizer_free(t);
    return s;
}
