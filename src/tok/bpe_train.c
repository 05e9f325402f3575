/* Learning a byte-level BPE.
 *
 * Texts are cut into pieces by GPT-2's pre-tokeniser and the distinct pieces counted.
 * Each distinct piece ("word") starts as its bytes; every round merges the adjacent pair
 * of ids with the largest count summed over words (ties: smaller first id, then smaller
 * second id), rewriting the words that hold it left to right. Pair counts are updated only
 * for the words a merge touches: each pair keeps a list of the words it was seen in, and a
 * max-heap with lazy deletion finds the best pair. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/tok_internal.h"

#define TRAIN_MAX_TOKEN_BYTES (1 << 16) /* as the file format allows */

typedef struct word_slot {
    uint64_t hash;
    uint32_t off, len; /* in the key arena; len 0: free */
    int64_t count;
} word_slot;

struct kiln_bpe_trainer {
    tok_pretok pretok;
    pcre2_match_data *md;
    word_slot *slots;
    uint64_t mask;
    int64_t nwords;
    char *keys;
    size_t keys_len, keys_cap;
};

/* ---- counting pieces ---- */

kiln_status kiln_bpe_trainer_init(kiln_bpe_trainer **out) {
    if (!out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_bpe_trainer_init: no output");
    *out = NULL;
    kiln_bpe_trainer *tr = calloc(1, sizeof *tr);
    if (!tr)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a BPE trainer");
    kiln_status s = kiln__tok_pretok_init(&tr->pretok);
    if (s == KILN_OK && !(tr->md = pcre2_match_data_create_from_pattern(tr->pretok.re, NULL)))
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate regex match data");
    if (s == KILN_OK && !(tr->slots = calloc(1024, sizeof *tr->slots)))
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the piece counts");
    if (s != KILN_OK) {
        kiln_bpe_trainer_free(tr);
        return s;
    }
    tr->mask = 1023;
    *out = tr;
    return KILN_OK;
}

void kiln_bpe_trainer_free(kiln_bpe_trainer *tr) {
    if (!tr)
        return;
    if (tr->md)
        pcre2_match_data_free(tr->md);
    kiln__tok_pretok_free(&tr->pretok);
    free(tr->slots);
    free(tr->keys);
    free(tr);
}

static void place(word_slot *slots, uint64_t mask, const word_slot *w) {
    for (uint64_t i = w->hash;; i++)
        if (!slots[i & mask].len) {
            slots[i & mask] = *w;
            return;
        }
}

static kiln_status count_piece(kiln_bpe_trainer *tr, const uint8_t *s, size_t n) {
    if (n > UINT32_MAX)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "a piece of %zu bytes is too long to train on",
                               n);
    uint64_t h = kiln__tok_hash_bytes(s, n);
    for (uint64_t i = h;; i++) {
        word_slot *w = &tr->slots[i & tr->mask];
        if (!w->len)
            break;
        if (w->hash == h && w->len == n && !memcmp(tr->keys + w->off, s, n)) {
            w->count++;
            return KILN_OK;
        }
    }
    if ((uint64_t)(tr->nwords + 1) * 2 > tr->mask + 1) {
        uint64_t nslots = (tr->mask + 1) * 2;
        word_slot *ns = calloc(nslots, sizeof *ns);
        if (!ns)
            return kiln_error_setf(KILN_ERR_NOMEM, "cannot grow the piece counts to %llu slots",
                                   (unsigned long long)nslots);
        for (uint64_t i = 0; i <= tr->mask; i++)
            if (tr->slots[i].len)
                place(ns, nslots - 1, &tr->slots[i]);
        free(tr->slots);
        tr->slots = ns;
        tr->mask = nslots - 1;
    }
    if (tr->keys_len + n > tr->keys_cap) {
        size_t cap = tr->keys_cap ? tr->keys_cap : 1 << 16;
        while (cap < tr->keys_len + n)
            cap *= 2;
        if (cap > UINT32_MAX)
            return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                                   "the distinct pieces to train on exceed 4 GiB");
        char *k = realloc(tr->keys, cap);
        if (!k)
            return kiln_error_setf(KILN_ERR_NOMEM, "cannot grow the piece store to %zu bytes", cap);
        tr->keys = k;
        tr->keys_cap = cap;
    }
    memcpy(tr->keys + tr->keys_len, s, n);
    word_slot w = {h, (uint32_t)tr->keys_len, (uint32_t)n, 1};
    tr->keys_len += n;
    tr->nwords++;
    place(tr->slots, tr->mask, &w);
    return KILN_OK;
}

kiln_status kiln_bpe_trainer_add(kiln_bpe_trainer *tr, const char *text, size_t len) {
    if (!tr || (!text && len))
        return kiln_error_setf(KILN_ERR_ARG, "kiln_bpe_trainer_add: no trainer or no text");
    const uint8_t *s = (const uint8_t *)text;
    for (size_t pos = 0, end = 0; pos < len; pos = end) {
        KILN_CHECK(kiln__tok_pretok_next(&tr->pretok, tr->md, s, len, pos, 1, &end));
        KILN_CHECK(count_piece(tr, s + pos, end - pos));
    }
    return KILN_OK;
}

/* ---- learning merges ---- */

typedef struct heap_entry {
    int64_t count;
    int32_t pair;
} heap_entry;

typedef struct learner {
    /* words: their ids in sym[woff[w] .. woff[w] + wlen[w]) */
    int64_t nw;
    int32_t *sym;
    int64_t *woff, *wcount;
    int32_t *wlen, *wstamp;
    /* pairs: ids, summed counts, the words they were seen in (a linked list in occ) */
    tok_pair_map index; /* (a, b) -> pair number */
    int32_t (*pab)[2];
    int64_t *pcount, *pold;
    int64_t *phead;
    int32_t *pstamp;
    uint8_t *pbanned;
    int64_t np, pcap;
    int64_t (*occ)[2]; /* (word, next) */
    int64_t nocc, occcap;
    heap_entry *heap;
    int64_t nheap, heapcap;
    int32_t *touched;
    int64_t ntouched, touchcap;
    uint32_t *tlen; /* bytes in each id */
} learner;

static int entry_before(const learner *L, heap_entry x, heap_entry y) {
    if (x.count != y.count)
        return x.count > y.count;
    const int32_t *a = L->pab[x.pair], *b = L->pab[y.pair];
    return a[0] != b[0] ? a[0] < b[0] : a[1] < b[1];
}

#define GROW(ptr, n, cap, what)                                                                    \
    do {                                                                                           \
        if ((n) >= (cap)) {                                                                        \
            int64_t nc_ = (cap) ? (cap)*2 : 1024;                                                  \
            void *np_ = realloc((ptr), (size_t)nc_ * sizeof *(ptr));                               \
            if (!np_)                                                                              \
                return kiln_error_setf(KILN_ERR_NOMEM, "BPE training: cannot grow %s to %lld",     \
                                       what, (long long)nc_);                                      \
            (ptr) = np_;                                                                           \
            (cap) = nc_;                                                                           \
        }                                                                                          \
    } while (0)

static kiln_status heap_push(learner *L, int32_t pair) {
    GROW(L->heap, L->nheap, L->heapcap, "the pair heap");
    heap_entry e = {L->pcount[pair], pair};
    int64_t at = L->nheap++;
    while (at > 0 && entry_before(L, e, L->heap[(at - 1) / 2])) {
        L->heap[at] = L->heap[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    L->heap[at] = e;
    return KILN_OK;
}

static heap_entry heap_pop(learner *L) {
    heap_entry top = L->heap[0], last = L->heap[--L->nheap];
    int64_t at = 0;
    for (;;) {
        int64_t c = 2 * at + 1;
        if (c >= L->nheap)
            break;
        if (c + 1 < L->nheap && entry_before(L, L->heap[c + 1], L->heap[c]))
            c++;
        if (!entry_before(L, L->heap[c], last))
            break;
        L->heap[at] = L->heap[c];
        at = c;
    }
    if (L->nheap)
        L->heap[at] = last;
    return top;
}

/* realloc *p to n elements; 0, or 1 (and *p untouched) when memory cannot be had. */
static int resize(void **p, int64_t n, size_t elem) {
    void *q = realloc(*p, (size_t)n * elem);
    if (!q)
        return 1;
    *p = q;
    return 0;
}

/* Pair (a, b)'s number, made when new. */
static kiln_status pair_of(learner *L, int32_t a, int32_t b, int32_t *out) {
    int32_t p = tok_pair_get(&L->index, a, b);
    if (p < 0) {
        if ((uint64_t)(L->index.count + 1) * 2 > L->index.mask + 1) {
            tok_pair_map bigger;
            KILN_CHECK(kiln__tok_pair_map_init(&bigger, (L->index.count + 1) * 2));
            for (uint64_t i = 0; i <= L->index.mask; i++)
                if (L->index.keys[i] != TOK_PAIR_EMPTY)
                    kiln__tok_pair_map_put(&bigger, (int32_t)(L->index.keys[i] >> 32),
                                           (int32_t)(uint32_t)L->index.keys[i], L->index.vals[i]);
            kiln__tok_pair_map_free(&L->index);
            L->index = bigger;
        }
        if (L->np >= INT32_MAX)
            return kiln_error_setf(KILN_ERR_UNSUPPORTED, "BPE training: more than 2^31 pairs");
        if (L->np >= L->pcap) {
            int64_t nc = L->pcap ? L->pcap * 2 : 1 << 16;
            int bad = resize((void **)&L->pab, nc, sizeof *L->pab) |
                      resize((void **)&L->pcount, nc, sizeof *L->pcount) |
                      resize((void **)&L->pold, nc, sizeof *L->pold) |
                      resize((void **)&L->phead, nc, sizeof *L->phead) |
                      resize((void **)&L->pstamp, nc, sizeof *L->pstamp) |
                      resize((void **)&L->pbanned, nc, 1);
            if (bad)
                return kiln_error_setf(
                    KILN_ERR_NOMEM, "BPE training: cannot grow the pairs to %lld", (long long)nc);
            L->pcap = nc;
        }
        p = (int32_t)L->np++;
        L->pab[p][0] = a;
        L->pab[p][1] = b;
        L->pcount[p] = 0;
        L->phead[p] = -1;
        L->pstamp[p] = -1;
        L->pbanned[p] = 0;
        kiln__tok_pair_map_put(&L->index, a, b, p);
    }
    *out = p;
    return KILN_OK;
}

/* Add sign * the word's count to each of its pairs; with sign > 0 also note the word in
 * the pairs' lists. stamp marks the pairs touched in this round. */
static kiln_status count_word(learner *L, int64_t w, int sign, int32_t stamp) {
    const int32_t *s = L->sym + L->woff[w];
    for (int32_t i = 0; i + 1 < L->wlen[w]; i++) {
        int32_t p;
        KILN_CHECK(pair_of(L, s[i], s[i + 1], &p));
        if (L->pstamp[p] != stamp) {
            L->pstamp[p] = stamp;
            L->pold[p] = L->pcount[p];
            GROW(L->touched, L->ntouched, L->touchcap, "the touched pairs");
            L->touched[L->ntouched++] = p;
        }
        L->pcount[p] += sign * L->wcount[w];
        if (sign > 0) {
            GROW(L->occ, L->nocc, L->occcap, "the pair lists");
            L->occ[L->nocc][0] = w;
            L->occ[L->nocc][1] = L->phead[p];
            L->phead[p] = L->nocc++;
        }
    }
    return KILN_OK;
}

/* Merge pair p into id z in every word holding it. */
static kiln_status apply_merge(learner *L, int32_t p, int32_t z, int32_t round) {
    int32_t a = L->pab[p][0], b = L->pab[p][1];
    L->ntouched = 0;
    for (int64_t o = L->phead[p]; o >= 0; o = L->occ[o][1]) {
        int64_t w = L->occ[o][0];
        if (L->wstamp[w] == round) /* listed twice */
            continue;
        L->wstamp[w] = round;
        int32_t *s = L->sym + L->woff[w], n = L->wlen[w], found = 0;
        for (int32_t i = 0; i + 1 < n && !found; i++)
            found = s[i] == a && s[i + 1] == b;
        if (!found) /* an old entry: the word no longer holds the pair */
            continue;
        KILN_CHECK(count_word(L, w, -1, round));
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++) {
            if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                s[k++] = z;
                i++;
            } else {
                s[k++] = s[i];
            }
        }
        L->wlen[w] = k;
        KILN_CHECK(count_word(L, w, +1, round));
    }
    for (int64_t i = 0; i < L->ntouched; i++) {
        int32_t q = L->touched[i];
        if (L->pcount[q] != L->pold[q] && L->pcount[q] > 0)
            KILN_CHECK(heap_push(L, q));
    }
    return KILN_OK;
}

static void learner_free(learner *L) {
    free(L->sym);
    free(L->woff);
    free(L->wcount);
    free(L->wlen);
    free(L->wstamp);
    kiln__tok_pair_map_free(&L->index);
    free(L->pab);
    free(L->pcount);
    free(L->pold);
    free(L->phead);
    free(L->pstamp);
    free(L->pbanned);
    free(L->occ);
    free(L->heap);
    free(L->touched);
    free(L->tlen);
}

static kiln_status learner_init(learner *L, const kiln_bpe_trainer *tr, int64_t max_ids) {
    memset(L, 0, sizeof *L);
    L->nw = tr->nwords;
    size_t nw = (size_t)(L->nw ? L->nw : 1);
    L->sym = malloc((tr->keys_len ? tr->keys_len : 1) * sizeof *L->sym);
    L->woff = malloc(nw * sizeof *L->woff);
    L->wcount = malloc(nw * sizeof *L->wcount);
    L->wlen = malloc(nw * sizeof *L->wlen);
    L->wstamp = malloc(nw * sizeof *L->wstamp);
    L->tlen = malloc((size_t)max_ids * sizeof *L->tlen);
    if (!L->sym || !L->woff || !L->wcount || !L->wlen || !L->wstamp || !L->tlen)
        return kiln_error_setf(KILN_ERR_NOMEM, "BPE training: cannot allocate %lld words",
                               (long long)L->nw);
    KILN_CHECK(kiln__tok_pair_map_init(&L->index, 1 << 16));
    /* The order of the words does not change what is learned. */
    int64_t w = 0, at = 0;
    for (uint64_t i = 0; i <= tr->mask; i++) {
        const word_slot *ws = &tr->slots[i];
        if (!ws->len)
            continue;
        L->woff[w] = at;
        L->wlen[w] = (int32_t)ws->len;
        L->wcount[w] = ws->count;
        L->wstamp[w] = -1;
        for (uint32_t k = 0; k < ws->len; k++)
            L->sym[at + k] = (uint8_t)tr->keys[ws->off + k];
        at += ws->len;
        w++;
    }
    for (int i = 0; i < 256; i++)
        L->tlen[i] = 1;
    for (int64_t v = 0; v < L->nw; v++)
        KILN_CHECK(count_word(L, v, +1, -2));
    for (int32_t p = 0; p < L->np; p++)
        KILN_CHECK(heap_push(L, p));
    return KILN_OK;
}

kiln_status kiln_bpe_trainer_finish(kiln_bpe_trainer *tr, int64_t vocab_size,
                                    kiln_tokenizer **out) {
    if (!tr || !out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_bpe_trainer_finish: no trainer or no output");
    *out = NULL;
    if (vocab_size < 257 || vocab_size > (1 << 24))
        return kiln_error_setf(
            KILN_ERR_ARG, "vocabulary size %lld: want 257 (the bytes and <|endoftext|>) to 2^24",
            (long long)vocab_size);
    int64_t want = vocab_size - 257;
    learner L;
    int32_t(*merges)[2] = malloc((size_t)(want ? want : 1) * sizeof *merges);
    kiln_status s =
        merges ? learner_init(&L, tr, 256 + want)
               : kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %lld merges", (long long)want);
    int64_t m = 0;
    while (s == KILN_OK && m < want && L.nheap > 0) {
        heap_entry e = heap_pop(&L);
        int32_t p = e.pair;
        if (e.count != L.pcount[p] || e.count <= 0 || L.pbanned[p])
            continue; /* stale */
        int32_t a = L.pab[p][0], b = L.pab[p][1];
        if (L.tlen[a] + L.tlen[b] > TRAIN_MAX_TOKEN_BYTES) {
            L.pbanned[p] = 1;
            continue;
        }
        int32_t z = (int32_t)(256 + m);
        L.tlen[z] = L.tlen[a] + L.tlen[b];
        merges[m][0] = a;
        merges[m][1] = b;
        s = apply_merge(&L, p, z, (int32_t)m);
        m++;
    }
    if (s == KILN_OK)
        s = kiln__tok_from_merges(out, (const int32_t(*)[2])merges, m, 1, "bpe",
                                  "trained tokenizer");
    if (merges)
        learner_free(&L);
    free(merges);
    return s;
}
