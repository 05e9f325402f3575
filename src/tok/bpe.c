/* Byte-level BPE encoding: pieces -> ids.
 *
 * A piece's bytes start as one id each; then, as tiktoken does, the adjacent pair with the
 * lowest rank (= merged id) is merged, the leftmost of equal ones first, until no pair
 * merges. Short pieces (nearly all) do this in a small array; long ones (a run of one
 * character, say) use a heap so that a piece of n bytes costs O(n log n), not O(n^2).
 * A per-encoder cache remembers the ids of pieces seen before. */
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

enum {
    TOK_SHORT = 64,         /* pieces up to this many bytes use the array loop */
    TOK_CACHE_KEY_MAX = 64, /* longer pieces are not cached */
    TOK_CACHE_MIN_SLOTS = 1 << 12,
    TOK_CACHE_MAX_SLOTS = 1 << 20, /* when full the cache starts again empty */
};

/* ---- growable buffers (kiln_alloc has no realloc) ---- */

static kiln_status grow(void **p, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap)
        return KILN_OK;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need)
        ncap = ncap < SIZE_MAX / 4 ? ncap * 2 : need;
    if (ncap > SIZE_MAX / elem)
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: %zu elements are too many", what, need);
    void *q = NULL;
    KILN_CHECK(kiln_alloc_checked(&q, ncap * elem, what));
    if (*p)
        memcpy(q, *p, *cap * elem);
    kiln_free(*p);
    *p = q;
    *cap = ncap;
    return KILN_OK;
}

kiln_status kiln__tok_tokens_grow(kiln_tokens *out, int64_t extra) {
    if (extra < 0 || out->len > INT64_MAX - extra)
        return kiln_error_setf(KILN_ERR_ARG, "token buffer: cannot grow by %lld ids",
                               (long long)extra);
    size_t cap = (size_t)out->cap;
    void *p = out->ids;
    KILN_CHECK(grow(&p, &cap, (size_t)(out->len + extra), sizeof(int32_t), "token ids"));
    out->ids = p;
    out->cap = (int64_t)cap;
    return KILN_OK;
}

/* ---- pair map ---- */

kiln_status kiln__tok_pair_map_init(tok_pair_map *m, int64_t expected) {
    memset(m, 0, sizeof *m);
    uint64_t slots = 64;
    while (slots < (uint64_t)expected * 2)
        slots *= 2;
    void *k = NULL, *v = NULL;
    KILN_CHECK(kiln_alloc_checked(&k, slots * sizeof(uint64_t), "BPE pair map"));
    if (kiln_alloc_checked(&v, slots * sizeof(int32_t), "BPE pair map") != KILN_OK) {
        kiln_free(k);
        return KILN_ERR_NOMEM;
    }
    m->keys = k;
    m->vals = v;
    memset(m->keys, 0xff, slots * sizeof(uint64_t)); /* TOK_PAIR_EMPTY */
    memset(m->vals, 0, slots * sizeof(int32_t));     /* written out whole by hf_cache.c */
    m->mask = slots - 1;
    return KILN_OK;
}

void kiln__tok_pair_map_free(tok_pair_map *m) {
    kiln_free(m->keys);
    kiln_free(m->vals);
    memset(m, 0, sizeof *m);
}

void kiln__tok_pair_map_set(tok_pair_map *m, int32_t a, int32_t b, int32_t value) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = tok_pair_slot(key);; i++) {
        uint64_t *k = &m->keys[i & m->mask];
        if (*k == key || *k == TOK_PAIR_EMPTY) {
            m->count += *k == TOK_PAIR_EMPTY;
            *k = key;
            m->vals[i & m->mask] = value;
            return;
        }
    }
}

int kiln__tok_pair_map_put(tok_pair_map *m, int32_t a, int32_t b, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = tok_pair_slot(key);; i++) {
        uint64_t *k = &m->keys[i & m->mask];
        if (*k == key)
            return 1;
        if (*k == TOK_PAIR_EMPTY) {
            *k = key;
            m->vals[i & m->mask] = merged;
            m->count++;
            return 0;
        }
    }
}

/* ---- BPE over one piece ---- */

static inline int32_t rank_of(const tok_pair_map *m, int32_t a, int32_t b) {
    if ((a | b) < 0) /* a character outside the vocabulary (TOK_HF) never merges */
        return INT32_MAX;
    int32_t r = tok_pair_get(m, a, b);
    return r < 0 ? INT32_MAX : r;
}

static inline int32_t merged_id(const kiln_tokenizer *t, int32_t rank) {
    return t->rank_id ? t->rank_id[rank] : rank;
}

/* Merge ids[0..n) in place; returns how many are left. n <= TOK_SHORT. */
static int bpe_merge_short(const kiln_tokenizer *t, int32_t *ids, int n) {
    const tok_pair_map *m = &t->pairs;
    int32_t rk[TOK_SHORT]; /* rk[i]: rank of the pair (ids[i], ids[i+1]) */
    for (int i = 0; i + 1 < n; i++)
        rk[i] = rank_of(m, ids[i], ids[i + 1]);
    int len = n;
    while (len > 1) {
        int32_t best = INT32_MAX;
        int bi = -1;
        for (int i = 0; i + 1 < len; i++)
            if (rk[i] < best) {
                best = rk[i];
                bi = i;
            }
        if (bi < 0)
            break;
        ids[bi] = merged_id(t, best);
        memmove(ids + bi + 1, ids + bi + 2, (size_t)(len - bi - 2) * sizeof *ids);
        if (len - bi - 3 > 0)
            memmove(rk + bi + 1, rk + bi + 2, (size_t)(len - bi - 3) * sizeof *rk);
        len--;
        if (bi + 1 < len)
            rk[bi] = rank_of(m, ids[bi], ids[bi + 1]);
        if (bi > 0)
            rk[bi - 1] = rank_of(m, ids[bi - 1], ids[bi]);
    }
    return len;
}

/* ids[0..n) := the piece's ids; returns how many. n <= TOK_SHORT. */
static int bpe_short(const kiln_tokenizer *t, const uint8_t *s, int n, int32_t *ids) {
    for (int i = 0; i < n; i++)
        ids[i] = t->byte_id[s[i]];
    return bpe_merge_short(t, ids, n);
}

/* Marks the slots of tok[] inside a part (after its first). */
#define TOK_GONE INT32_MIN

/* Long pieces: parts live at their first byte's position in tok[] (TOK_GONE inside a part). The
 * heap holds one key per part whose pair with the next part merges: rank << 32 | position,
 * so that the smallest key is the lowest rank, leftmost first; hidx[i] is part i's place in
 * the heap (-1: absent). 12 bytes of scratch per symbol of the piece. */
typedef struct bpe_heap {
    int32_t *tok, *hidx;
    uint64_t *key;
    int32_t size;
} bpe_heap;

static inline void heap_put(bpe_heap *h, int32_t at, uint64_t key) {
    h->key[at] = key;
    h->hidx[(uint32_t)key] = at;
}

static void heap_sift(bpe_heap *h, int32_t at) {
    uint64_t key = h->key[at];
    while (at > 0 && key < h->key[(at - 1) / 2]) {
        heap_put(h, at, h->key[(at - 1) / 2]);
        at = (at - 1) / 2;
    }
    for (;;) {
        int32_t c = 2 * at + 1;
        if (c >= h->size)
            break;
        if (c + 1 < h->size && h->key[c + 1] < h->key[c])
            c++;
        if (h->key[c] >= key)
            break;
        heap_put(h, at, h->key[c]);
        at = c;
    }
    heap_put(h, at, key);
}

/* Part pos's pair now has this rank (INT32_MAX: it does not merge). */
static void heap_set(bpe_heap *h, int32_t pos, int32_t rank) {
    int32_t at = h->hidx[pos];
    if (rank == INT32_MAX) {
        if (at < 0)
            return;
        h->hidx[pos] = -1;
        uint64_t last = h->key[--h->size];
        if (at < h->size) {
            heap_put(h, at, last);
            heap_sift(h, at);
        }
        return;
    }
    if (at < 0)
        at = h->size++;
    heap_put(h, at, (uint64_t)(uint32_t)rank << 32 | (uint32_t)pos);
    heap_sift(h, at);
}

/* Merge ids[0..n) in place with the heap; the ids left are compacted to the front. */
static kiln_status bpe_merge_long(tok_encoder *e, int32_t *ids, size_t n, int64_t *left) {
    const kiln_tokenizer *t = e->t;
    if (n > INT32_MAX / 2)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "a single pre-tokenised piece of %zu symbols (more than 2^30)", n);
    size_t keys_at = (n + 1) / 2 * 2; /* the keys are 8-byte aligned */
    KILN_CHECK(
        grow((void **)&e->work, &e->work_cap, keys_at + 2 * n, sizeof(int32_t), "BPE scratch"));
    int32_t N = (int32_t)n;
    /* tok[] is ids itself: the slots inside a merged part become TOK_GONE (a negative id
     * from the caller, a character outside the vocabulary, stays as it is). */
    bpe_heap h = {ids, e->work, (uint64_t *)(void *)(e->work + keys_at), 0};
    for (int32_t i = 0; i < N; i++)
        h.hidx[i] = -1;
    for (int32_t i = 0; i + 1 < N; i++) {
        int32_t r = rank_of(&t->pairs, h.tok[i], h.tok[i + 1]);
        if (r != INT32_MAX)
            heap_put(&h, h.size++, (uint64_t)(uint32_t)r << 32 | (uint32_t)i);
    }
    for (int32_t at = h.size / 2 - 1; at >= 0; at--) { /* heapify: keys only sift down */
        uint64_t key = h.key[at];
        int32_t k = at;
        for (;;) {
            int32_t c = 2 * k + 1;
            if (c >= h.size)
                break;
            if (c + 1 < h.size && h.key[c + 1] < h.key[c])
                c++;
            if (h.key[c] >= key)
                break;
            heap_put(&h, k, h.key[c]);
            k = c;
        }
        heap_put(&h, k, key);
    }
    while (h.size > 0) {
        int32_t p = (int32_t)(uint32_t)h.key[0], q = p + 1;
        while (h.tok[q] == TOK_GONE) /* the next part; parts are at most a token long */
            q++;
        h.tok[p] = merged_id(t, (int32_t)(h.key[0] >> 32));
        h.tok[q] = TOK_GONE;
        heap_set(&h, q, INT32_MAX);
        int32_t r = q + 1;
        while (r < N && h.tok[r] == TOK_GONE)
            r++;
        heap_set(&h, p, r < N ? rank_of(&t->pairs, h.tok[p], h.tok[r]) : INT32_MAX);
        if (p > 0) {
            int32_t l = p - 1;
            while (h.tok[l] == TOK_GONE)
                l--;
            heap_set(&h, l, rank_of(&t->pairs, h.tok[l], h.tok[p]));
        }
    }
    int64_t k = 0;
    for (int32_t i = 0; i < N; i++)
        if (h.tok[i] != TOK_GONE)
            ids[k++] = h.tok[i];
    *left = k;
    return KILN_OK;
}

static kiln_status bpe_long(tok_encoder *e, const uint8_t *s, size_t n, kiln_tokens *out) {
    const kiln_tokenizer *t = e->t;
    if (n > INT32_MAX / 2)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "a single pre-tokenised piece of %zu bytes (more than 1 GiB)", n);
    KILN_CHECK(kiln_tokens_reserve(out, (int64_t)n));
    int32_t *ids = out->ids + out->len;
    for (size_t i = 0; i < n; i++)
        ids[i] = t->byte_id[s[i]];
    int64_t k = 0;
    KILN_CHECK(bpe_merge_long(e, ids, n, &k));
    out->len += k;
    return KILN_OK;
}

kiln_status kiln__tok_bpe_ids(tok_encoder *e, int32_t *ids, int64_t n, int64_t *left) {
    if (n <= TOK_SHORT) {
        *left = n > 1 ? bpe_merge_short(e->t, ids, (int)n) : n;
        return KILN_OK;
    }
    return bpe_merge_long(e, ids, (size_t)n, left);
}

/* ---- the piece cache ---- */

static kiln_status cache_alloc(tok_encoder *e, uint64_t slots) {
    void *p = NULL;
    KILN_CHECK(kiln_alloc_checked(&p, slots * sizeof(tok_cache_slot), "tokenizer cache"));
    kiln_free(e->cache);
    e->cache = p; /* zeroed: key_len 0 marks a free slot (empty pieces are never cached) */
    e->cache_mask = slots - 1;
    e->cache_count = 0;
    return KILN_OK;
}

const tok_cache_slot *kiln__tok_cache_find(const tok_encoder *e, const uint8_t *s, size_t n,
                                           uint64_t h) {
    for (uint64_t i = h;; i++) {
        const tok_cache_slot *c = &e->cache[i & e->cache_mask];
        if (c->key_len == 0)
            return NULL;
        if (c->hash == h && c->key_len == n && !memcmp(e->cache_keys + c->key_off, s, n))
            return c;
    }
}

static void cache_place(tok_encoder *e, const tok_cache_slot *src) {
    for (uint64_t i = src->hash;; i++) {
        tok_cache_slot *c = &e->cache[i & e->cache_mask];
        if (c->key_len == 0) {
            *c = *src;
            e->cache_count++;
            return;
        }
    }
}

/* Remember ids[0..k) as the ids of s[0..n). Failing to cache is not an error. */
void kiln__tok_cache_put(tok_encoder *e, const uint8_t *s, size_t n, uint64_t h, const int32_t *ids,
                         int k) {
    if ((uint64_t)(e->cache_count + 1) * 2 > e->cache_mask + 1) {
        uint64_t slots = (e->cache_mask + 1) * 2;
        if (slots > TOK_CACHE_MAX_SLOTS) { /* start again: bounded memory beats a full cache */
            memset(e->cache, 0, (e->cache_mask + 1) * sizeof(tok_cache_slot));
            e->cache_count = 0;
            e->cache_keys_len = e->cache_ids_len = 0;
        } else {
            tok_cache_slot *old = e->cache;
            uint64_t old_slots = e->cache_mask + 1;
            e->cache = NULL;
            if (cache_alloc(e, slots) != KILN_OK) {
                e->cache = old;
                return;
            }
            for (uint64_t i = 0; i < old_slots; i++)
                if (old[i].key_len)
                    cache_place(e, &old[i]);
            kiln_free(old);
        }
    }
    if (grow((void **)&e->cache_keys, &e->cache_keys_cap, e->cache_keys_len + n, 1,
             "tokenizer cache") != KILN_OK ||
        grow((void **)&e->cache_ids, &e->cache_ids_cap, e->cache_ids_len + (size_t)k,
             sizeof(int32_t), "tokenizer cache") != KILN_OK) {
        kiln_error_clear();
        return;
    }
    tok_cache_slot c = {h, (uint32_t)e->cache_keys_len, (uint32_t)n, (uint32_t)e->cache_ids_len,
                        (uint32_t)k};
    memcpy(e->cache_keys + e->cache_keys_len, s, n);
    memcpy(e->cache_ids + e->cache_ids_len, ids, (size_t)k * sizeof(int32_t));
    e->cache_keys_len += n;
    e->cache_ids_len += (size_t)k;
    cache_place(e, &c);
}

/* ---- encoder ---- */

kiln_status kiln__tok_encoder_init(tok_encoder *e, const kiln_tokenizer *t, int use_cache) {
    memset(e, 0, sizeof *e);
    e->t = t;
    e->ascii_fast = 1;
    if (t->kind == TOK_BYTES)
        return KILN_OK;
    if (t->pretok.re) { /* TOK_HF runs its patterns by hand */
        e->md = pcre2_match_data_create_from_pattern(t->pretok.re, NULL);
        if (!e->md)
            return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate regex match data");
    }
    if (use_cache) {
        kiln_status s = cache_alloc(e, TOK_CACHE_MIN_SLOTS);
        if (s != KILN_OK) {
            kiln__tok_encoder_free(e);
            return s;
        }
    }
    return KILN_OK;
}

void kiln__tok_encoder_free(tok_encoder *e) {
    if (e->md)
        pcre2_match_data_free(e->md);
    kiln_free(e->work);
    kiln_free(e->cache);
    kiln_free(e->cache_keys);
    kiln_free(e->cache_ids);
    kiln_bytes_free(&e->norm);
    kiln_free(e->sym);
    memset(e, 0, sizeof *e);
}

kiln_status kiln__tok_encode_piece(tok_encoder *e, const uint8_t *s, size_t n, kiln_tokens *out) {
    const kiln_tokenizer *t = e->t;
    if (n == 1)
        return tok_tokens_push(out, t->byte_id[s[0]]);
    uint64_t h = kiln__tok_hash_bytes(s, n);
    if (t->whole_piece_first) { /* GPT-2 has tokens of up to 128 bytes */
        int32_t id = kiln__tok_piece_lookup(t, s, n, h);
        if (id >= 0)
            return tok_tokens_push(out, id);
    }
    if (n > TOK_SHORT)
        return bpe_long(e, s, n, out);
    if (e->cache) {
        const tok_cache_slot *c = kiln__tok_cache_find(e, s, n, h);
        if (c) {
            KILN_CHECK(kiln_tokens_reserve(out, c->ids_len));
            memcpy(out->ids + out->len, e->cache_ids + c->ids_off, c->ids_len * sizeof(int32_t));
            out->len += c->ids_len;
            return KILN_OK;
        }
    }
    int32_t ids[TOK_SHORT];
    int k = bpe_short(t, s, (int)n, ids);
    KILN_CHECK(kiln_tokens_reserve(out, k));
    memcpy(out->ids + out->len, ids, (size_t)k * sizeof(int32_t));
    out->len += k;
    if (e->cache && n <= TOK_CACHE_KEY_MAX)
        kiln__tok_cache_put(e, s, n, h, ids, k);
    return KILN_OK;
}

kiln_status kiln__tok_encode_range(tok_encoder *e, const uint8_t *s, size_t len, size_t from,
                                   size_t to, kiln_tokens *out) {
    const kiln_tokenizer *t = e->t;
    if (t->kind == TOK_BYTES) {
        KILN_CHECK(kiln_tokens_reserve(out, (int64_t)(to - from)));
        for (size_t i = from; i < to; i++)
            out->ids[out->len++] = s[i];
        return KILN_OK;
    }
    if (t->kind == TOK_HF) {
        if (from != 0 || to != len)
            return kiln_error_setf(KILN_ERR_INTERNAL, "a Hugging Face tokenizer's text was cut");
        return kiln__tok_hf_encode(e, s, len, out);
    }
    size_t pos = from;
    while (pos < to) {
        size_t end = 0;
        KILN_CHECK(kiln__tok_pretok_next(&t->pretok, e->md, s, len, pos, e->ascii_fast, &end));
        if (end > to)
            return kiln_error_setf(KILN_ERR_INTERNAL,
                                   "a piece crosses byte %zu, where the text was cut", to);
        KILN_CHECK(kiln__tok_encode_piece(e, s + pos, end - pos, out));
        pos = end;
    }
    return KILN_OK;
}
