/* kiln's tokenizer file: a trained byte-level BPE.
 *
 * Layout, little-endian:
 *   0   8 bytes  magic "KILNBPE\0"
 *   8   u32      format version (1)
 *   12  u32      pre-tokeniser (1: GPT-2's pattern)
 *   16  u32      number of merges M
 *   20  u32      flags (bit 0: the last id is <|endoftext|>)
 *   24  M x (u32 a, u32 b)   merge i turns the adjacent ids a, b into id 256 + i
 *   24 + 8M  u64 xxHash64 (seed 0) of every byte before it */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/core.h"
#include "tok/tok_internal.h"

#define TOK_FILE_HEADER 24
#define TOK_FILE_VERSION 1u
#define TOK_MAX_MERGES (1 << 24)
#define TOK_MAX_TOKEN_BYTES (1 << 16)
static const char tok_magic[8] = "KILNBPE";

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    return get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}
static void put_u64(uint8_t *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

/* Token bytes for ids 0..n-1 from the merges. */
static kiln_status build_vocab(kiln_tokenizer *t, const char *where) {
    void *off = NULL, *blob = NULL;
    KILN_CHECK(kiln_alloc_checked(&off, ((size_t)t->n + 1) * sizeof(uint32_t), "token offsets"));
    t->off = off;
    /* First the lengths, in off[id + 1]; then their prefix sums make the offsets. */
    for (int32_t id = 0; id < t->n; id++) {
        uint32_t len = id < 256 ? 1 : id == t->eot ? 13 : 0;
        if (id >= 256 && id != t->eot) {
            const int32_t *m = t->merges[id - 256];
            len = t->off[m[0] + 1] + t->off[m[1] + 1];
            if (len > TOK_MAX_TOKEN_BYTES)
                return kiln_error_setf(KILN_ERR_FORMAT,
                                       "%s: merge %d makes a token of %u bytes (at most %d)", where,
                                       id - 256, len, TOK_MAX_TOKEN_BYTES);
        }
        t->off[id + 1] = len;
    }
    uint64_t total = 0;
    for (int32_t id = 0; id < t->n; id++) {
        total += t->off[id + 1];
        if (total > UINT32_MAX)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: the tokens hold more than 4 GiB", where);
    }
    KILN_CHECK(kiln_alloc_checked(&blob, (size_t)total + 1, "token bytes"));
    t->blob = blob;
    t->off[0] = 0;
    for (int32_t id = 0; id < t->n; id++) {
        uint32_t at = t->off[id], len = t->off[id + 1];
        if (id < 256) {
            t->blob[at] = (char)id;
        } else if (id == t->eot) {
            memcpy(t->blob + at, "<|endoftext|>", 13);
        } else {
            const int32_t *m = t->merges[id - 256];
            uint32_t la = t->off[m[0] + 1] - t->off[m[0]];
            memcpy(t->blob + at, t->blob + t->off[m[0]], la);
            memcpy(t->blob + at + la, t->blob + t->off[m[1]], len - la);
        }
        t->off[id + 1] = at + len;
    }
    return KILN_OK;
}

kiln_status kiln__tok_from_merges(kiln_tokenizer **out, const int32_t (*merges)[2],
                                  int64_t n_merges, int has_eot, const char *name,
                                  const char *where) {
    *out = NULL;
    if (n_merges < 0 || n_merges > TOK_MAX_MERGES)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: %lld merges (at most %d)", where,
                               (long long)n_merges, TOK_MAX_MERGES);
    kiln_tokenizer *t = NULL;
    KILN_CHECK(kiln__tok_new(&t, TOK_BPE, name));
    kiln_status s = KILN_OK;
    t->n = (int32_t)(256 + n_merges + (has_eot ? 1 : 0));
    t->eot = has_eot ? (int32_t)(256 + n_merges) : -1;
    t->n_merges = n_merges;
    t->merges = malloc((size_t)(n_merges ? n_merges : 1) * sizeof *t->merges);
    if (!t->merges) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "%s: cannot allocate %lld merges", where,
                            (long long)n_merges);
        goto fail;
    }
    KILN_CHECK_GOTO(s, kiln__tok_pair_map_init(&t->pairs, n_merges), fail);
    for (int64_t i = 0; i < n_merges; i++) {
        int32_t a = merges[i][0], b = merges[i][1];
        if (a < 0 || b < 0 || a >= 256 + i || b >= 256 + i) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: merge %lld joins ids %d and %d, but only ids below %lld exist "
                                "by then",
                                where, (long long)i, a, b, (long long)(256 + i));
            goto fail;
        }
        if (kiln__tok_pair_map_put(&t->pairs, a, b, (int32_t)(256 + i))) {
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: merge %lld repeats the pair (%d, %d)", where,
                                (long long)i, a, b);
            goto fail;
        }
        t->merges[i][0] = a;
        t->merges[i][1] = b;
    }
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = i;
    KILN_CHECK_GOTO(s, build_vocab(t, where), fail);
    *out = t;
    return KILN_OK;
fail:
    kiln_tokenizer_free(t);
    return s;
}

kiln_status kiln__tok_load_file(kiln_tokenizer **out, const char *path) {
    *out = NULL;
    /* A regular file no larger than the most merges a file may hold: a FIFO, a device or a
     * huge file is refused before anything is read. */
    char *text = NULL;
    size_t size = 0;
    kiln_status s = kiln_file_read(path, TOK_FILE_HEADER + 8 * (size_t)TOK_MAX_MERGES + 8, &text,
                                   &size);
    if (s == KILN_ERR_RANGE)
        return kiln_error_wrapf(s, "not a kiln tokenizer file");
    if (s)
        return kiln_error_wrapf(s, "tokenizer file");
    const uint8_t *buf = (const uint8_t *)text;
    int32_t(*merges)[2] = NULL;
    if (size < TOK_FILE_HEADER + 8 || memcmp(buf, tok_magic, 8) != 0) {
        s = kiln_error_setf(KILN_ERR_FORMAT,
                            "%s is not a kiln tokenizer file (no \"KILNBPE\" magic at its start): "
                            "use gpt2, bytes, or a file written by `kiln tokenizer train`",
                            path);
        goto done;
    }
    uint32_t version = get_u32(buf + 8), pretok = get_u32(buf + 12);
    uint32_t m = get_u32(buf + 16), flags = get_u32(buf + 20);
    if (version != TOK_FILE_VERSION) {
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: tokenizer format version %u (this kiln reads %u)",
                            path, version, TOK_FILE_VERSION);
        goto done;
    }
    if (pretok != 1 || flags > 1 || m > TOK_MAX_MERGES) {
        s = kiln_error_setf(KILN_ERR_FORMAT,
                            "%s: header has pre-tokeniser %u, flags %u, %u merges (want 1, 0 or 1, "
                            "at most %d)",
                            path, pretok, flags, m, TOK_MAX_MERGES);
        goto done;
    }
    size_t want = TOK_FILE_HEADER + 8 * (size_t)m + 8;
    if (size != want) {
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: %zu bytes, but %u merges need %zu (truncated?)",
                            path, size, m, want);
        goto done;
    }
    merges = malloc((m ? m : 1) * sizeof *merges);
    if (!merges) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %u merges to read %s", m, path);
        goto done;
    }
    uint64_t stored = get_u64(buf + want - 8), computed = XXH64(buf, want - 8, 0);
    if (stored != computed) {
        s = kiln_error_setf(KILN_ERR_CHECKSUM,
                            "%s: checksum %016llx stored, %016llx computed (the file is damaged)",
                            path, (unsigned long long)stored, (unsigned long long)computed);
        goto done;
    }
    for (uint32_t i = 0; i < m; i++) {
        uint32_t a = get_u32(buf + TOK_FILE_HEADER + 8 * (size_t)i);
        uint32_t b = get_u32(buf + TOK_FILE_HEADER + 8 * (size_t)i + 4);
        merges[i][0] = a > INT32_MAX ? -1 : (int32_t)a;
        merges[i][1] = b > INT32_MAX ? -1 : (int32_t)b;
    }
    s = kiln__tok_from_merges(out, (const int32_t(*)[2])merges, m, (int)(flags & 1), path, path);
done:
    free(merges);
    free(text);
    return s;
}

kiln_status kiln_tokenizer_save(const kiln_tokenizer *t, const char *path) {
    if (!t || !path)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_tokenizer_save: no tokenizer or no path");
    if (t->kind != TOK_BPE)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "the %s tokenizer is not saved to a file: name it by \"%s\"",
                               t->name, t->name);
    size_t size = TOK_FILE_HEADER + 8 * (size_t)t->n_merges + 8;
    uint8_t *buf = malloc(size);
    if (!buf)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %zu bytes to save %s", size, path);
    memcpy(buf, tok_magic, 8);
    put_u32(buf + 8, TOK_FILE_VERSION);
    put_u32(buf + 12, 1);
    put_u32(buf + 16, (uint32_t)t->n_merges);
    put_u32(buf + 20, t->eot >= 0 ? 1u : 0u);
    for (int64_t i = 0; i < t->n_merges; i++) {
        put_u32(buf + TOK_FILE_HEADER + 8 * i, (uint32_t)t->merges[i][0]);
        put_u32(buf + TOK_FILE_HEADER + 8 * i + 4, (uint32_t)t->merges[i][1]);
    }
    put_u64(buf + size - 8, XXH64(buf, size - 8, 0));

    kiln_status s = kiln__write_file_atomic(path, buf, size);
    free(buf);
    return s;
}
