/* Loading a Hugging Face tokenizer.json: through its prepared form when that is current,
 * else from the JSON (then the prepared form is written for the next load).
 *
 * The prepared form lives beside the file (".<name>.kiln"); where that folder cannot be
 * written, in $XDG_CACHE_HOME/kiln (else ~/.cache/kiln) under the checksum of the source.
 * Either is trusted only when it records the checksum of the tokenizer.json read now and its
 * own checksum holds; otherwise it is made again. Writing it is best effort: a tokenizer
 * that cannot be cached still loads. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

#define HF_JSON_MAX_BYTES ((size_t)1 << 30)

void kiln__tok_hf_free(tok_hf *h) {
    if (!h)
        return;
    if (h->arena) { /* these point into it */
        h->added = NULL;
        h->added_text = NULL;
        h->special = NULL;
        h->mblob = NULL;
        h->moff = NULL;
        h->rank_ids = NULL;
        munmap(h->arena, h->arena_len);
    }
    kiln_free(h->added);
    kiln_free(h->added_text);
    kiln_free(h->special);
    kiln_free(h->mblob);
    kiln_free(h->moff);
    kiln_free(h->rank_merge);
    kiln_free(h->rank_ids);
    memset(h, 0, sizeof *h);
}

static int32_t lookup(const kiln_tokenizer *t, const char *s, size_t n) {
    return kiln__tok_piece_lookup(t, (const uint8_t *)s, n, kiln__tok_hash_bytes(s, n));
}

/* Whether some token has a character other than U+2581 right before a U+2581. */
static int has_inner_space_mark(const kiln_tokenizer *t) {
    static const char mark[3] = {'\xE2', '\x96', '\x81'};
    for (int32_t id = 0; id < t->n; id++) {
        if (t->hf->special[id])
            continue;
        const char *s = t->key_blob + t->key_off[id];
        size_t n = t->key_off[id + 1] - t->key_off[id];
        for (size_t i = 1; i + 3 <= n; i++)
            if (!memcmp(s + i, mark, 3) && (i < 3 || memcmp(s + i - 3, mark, 3) != 0))
                return 1;
    }
    return 0;
}

/* rank -> merged id, the pair map, and whether SentencePiece words may be cut. */
static kiln_status build_tables(kiln_tokenizer *t) {
    tok_hf *h = t->hf;
    void *ri = NULL;
    KILN_CHECK(
        kiln_alloc_checked(&ri, (size_t)(h->n_ranks ? h->n_ranks : 1) * sizeof(int32_t), "merges"));
    h->rank_ids = ri;
    t->rank_id = h->rank_ids;
    KILN_CHECK(kiln__tok_pair_map_init(&t->pairs, h->n_ranks));
    for (int64_t r = 0; r < h->n_ranks; r++) {
        const int32_t *m = h->rank_merge[r];
        if (m[0] < 0 || m[1] < 0 || m[2] < 0 || m[0] >= t->n || m[1] >= t->n || m[2] >= t->n)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: merge %lld names an id outside the "
                                   "vocabulary",
                                   t->name, (long long)r);
        h->rank_ids[r] = m[2];
        kiln__tok_pair_map_set(&t->pairs, m[0], m[1], (int32_t)r); /* the last one wins */
    }
    h->sp_cut = h->moff && !h->ignore_merges && !has_inner_space_mark(t);
    return KILN_OK;
}

static kiln_status check_tables(kiln_tokenizer *t) {
    const tok_hf *h = t->hf;
    int bad = 0;
    for (int64_t r = 0; r < h->n_ranks; r++)
        bad |= h->rank_ids[r] < 0 || h->rank_ids[r] >= t->n;
    /* A key is only ever compared; a value indexes rank_id, so every one must be a rank
     * (free slots hold 0: kiln__tok_pair_map_init zeroes them). */
    uint32_t ranks = h->n_ranks ? (uint32_t)h->n_ranks : 1;
    for (uint64_t i = 0; i <= t->pairs.mask; i++)
        bad |= (uint32_t)t->pairs.vals[i] >= ranks;
    bad |= h->n_ranks == 0 && t->pairs.count != 0;
    for (uint64_t i = 0; i <= t->piece_mask; i++)
        bad |= t->pieces[i].id1 > (uint32_t)t->n;
    if (bad)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: the prepared tables name ids outside the "
                               "vocabulary",
                               t->name);
    return KILN_OK;
}

kiln_status kiln__tok_hf_finish(kiln_tokenizer *t, int tables_ready) {
    tok_hf *h = t->hf;
    const char *where = t->name;
    int32_t n = t->n;
    if ((h->style != HF_BYTE_LEVEL && h->style != HF_SENTENCEPIECE) || h->pattern > HF_PAT_QWEN2 ||
        h->unk >= n || h->bos >= n || t->eot >= n || (h->style == HF_SENTENCEPIECE) != !!h->moff)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: inconsistent tokenizer", where);
    for (int32_t i = 0; i < n; i++)
        if (t->off[i] > t->off[i + 1] || (h->moff && h->moff[i] > h->moff[i + 1]))
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: inconsistent token offsets", where);
    size_t added_len = 0;
    for (int32_t i = 0; i < h->n_added; i++) {
        const hf_added *a = &h->added[i];
        if (a->id < 0 || a->id >= n || a->len == 0 || a->off != added_len)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: inconsistent added tokens", where);
        added_len += a->len;
        h->added_first[a->normalized ? 1 : 0][(uint8_t)h->added_text[a->off]] = 1;
    }
    if (tables_ready) /* read from the prepared form: check that every id is in range */
        KILN_CHECK(check_tables(t));
    else
        KILN_CHECK(build_tables(t));
    for (int b = 0; b < 256; b++) {
        char c = (char)b, hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        h->byte_tok[b] = h->moff ? lookup(t, hex, 6) : -1;
        if (b < 128)
            h->ascii_id[b] = lookup(t, &c, 1);
        t->byte_id[b] = h->moff ? -1 : lookup(t, &c, 1);
        if (!h->moff && t->byte_id[b] < 0)
            return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                                   "%s: byte-level vocabulary without a "
                                   "token for byte 0x%02X",
                                   where, b);
    }
    t->whole_piece_first = h->style == HF_BYTE_LEVEL && h->ignore_merges;
    return KILN_OK;
}

/* The folder for prepared forms when the tokenizer's own folder is read-only. */
static int cache_dir(char *out, size_t cap) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int k = x && *x         ? snprintf(out, cap, "%s/kiln", x)
            : home && *home ? snprintf(out, cap, "%s/.cache/kiln", home)
                            : -1;
    return k > 0 && (size_t)k < cap ? 0 : -1;
}

static void beside_path(char *out, size_t cap, const char *path) {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    snprintf(out, cap, "%.*s.%s.kiln", (int)dl, path, slash ? slash + 1 : path);
}

/* A file mapped whole (read-only), or NULL. */
static void *map_file(const char *path, size_t *len) {
    int fd = -1;
    uint64_t size = 0;
    if (kiln_file_open_regular(path, &fd, &size) != KILN_OK) {
        kiln_error_clear();
        return NULL;
    }
    void *p =
        size ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED)
        return NULL;
    *len = (size_t)size;
    return p;
}

/* A current prepared form at cpath, or NULL (stale, damaged or absent: made again). */
static kiln_tokenizer *try_cache(const char *cpath, uint64_t src, const char *path) {
    size_t len = 0;
    char *buf = map_file(cpath, &len);
    kiln_tokenizer *t = NULL;
    if (!buf)
        return NULL;
    if (kiln__tok_hf_deserialize(&t, buf, len, src, path) == KILN_OK) {
        t->hf->arena_len = len; /* it owns the mapping now */
        return t;
    }
    munmap(buf, len);
    kiln_error_clear();
    return NULL;
}

kiln_status kiln__tok_load_hf(kiln_tokenizer **out, const char *path) {
    *out = NULL;
    size_t len = 0;
    char *text = map_file(path, &len); /* no copy: it is read once, to check the cache */
    kiln_status s = KILN_OK;
    if (!text) { /* empty, or not mappable: read it, for the message or the text */
        s = kiln_file_read(path, HF_JSON_MAX_BYTES, &text, &len);
        if (s != KILN_OK)
            return kiln_error_wrapf(s, "tokenizer.json");
        char *copy = text;
        text = len ? NULL : copy;
        if (len) { /* a file that reads but does not map: parse its copy */
            s = kiln__tok_hf_from_json(out, copy, len, path);
            free(copy);
            return s;
        }
        free(copy);
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: empty file (not a tokenizer.json)", path);
    }
    if (len > HF_JSON_MAX_BYTES) {
        munmap(text, len);
        return kiln_error_setf(KILN_ERR_RANGE, "%s: %zu bytes (a tokenizer.json has at most %zu)",
                               path, len, HF_JSON_MAX_BYTES);
    }
    uint64_t src = XXH3_64bits(text, len);
    char beside[PATH_MAX + 16], dir[PATH_MAX], other[PATH_MAX + 64];
    beside_path(beside, sizeof beside, path);
    int have_dir = cache_dir(dir, sizeof dir) == 0;
    if (have_dir)
        snprintf(other, sizeof other, "%s/hf-%016llx.kiln", dir, (unsigned long long)src);
    kiln_tokenizer *t = try_cache(beside, src, path);
    if (!t && have_dir)
        t = try_cache(other, src, path);
    if (t) {
        munmap(text, len);
        *out = t;
        return KILN_OK;
    }
    s = kiln__tok_hf_from_json(&t, text, len, path);
    munmap(text, len);
    if (s != KILN_OK)
        return s;
    uint8_t *buf = NULL;
    size_t blen = 0;
    s = kiln__tok_hf_serialize(t, src, &buf, &blen);
    if (s != KILN_OK) {
        kiln_tokenizer_free(t);
        return s;
    }
    memcpy(&t->hf->identity, buf + 24, 8); /* the identity the prepared form records */
    if (kiln__write_file_atomic(beside, buf, blen) != KILN_OK) {
        kiln_error_clear();
        if (have_dir && (mkdir(dir, 0755) == 0 || errno == EEXIST) &&
            kiln__write_file_atomic(other, buf, blen) != KILN_OK)
            kiln_error_clear();
    }
    free(buf);
    *out = t;
    return KILN_OK;
}
