/* GPT-2's tokenizer from its encoder.json (token -> id) and vocab.bpe (the merges).
 *
 * Both files spell bytes as printable characters (GPT-2's byte alphabet: printable Latin-1
 * bytes stand for themselves, the other 68 bytes for U+0100..U+0143). Like tiktoken, kiln
 * takes a pair's rank to be the id of the two tokens' concatenated bytes, so every way of
 * splitting a token into two tokens is a pair that merges; vocab.bpe is checked to agree
 * with encoder.json (merge i makes id 256 + i). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/tok_internal.h"

static const char eot_text[] = "<|endoftext|>";

/* The byte each of GPT-2's 256 alphabet characters stands for, by code point (-1: none),
 * and the bytes in the order of their ids 0..255. */
typedef struct gpt2_alphabet {
    int16_t byte_of[324];
    uint8_t order[256];
} gpt2_alphabet;

static void alphabet_init(gpt2_alphabet *a) {
    int n = 0, extra = 0;
    for (int c = 0; c < 324; c++)
        a->byte_of[c] = -1;
    for (int b = 0; b < 256; b++)
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
            a->byte_of[b] = (int16_t)b;
            a->order[n++] = (uint8_t)b;
        }
    for (int b = 0; b < 256; b++)
        if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
            a->byte_of[256 + extra++] = (int16_t)b;
            a->order[n++] = (uint8_t)b;
        }
}

/* Decode s[0..len) spelled in the alphabet into out (at most len bytes); -1 if a
 * character is outside it. */
static long alphabet_decode(const gpt2_alphabet *a, const char *s, size_t len, uint8_t *out) {
    size_t i = 0;
    long n = 0;
    while (i < len) {
        uint8_t c = (uint8_t)s[i];
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < len && ((uint8_t)s[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(c & 0x1F) << 6 | ((uint8_t)s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* the alphabet lies below U+0800 */
        }
        if (cp >= 324 || a->byte_of[cp] < 0)
            return -1;
        out[n++] = (uint8_t)a->byte_of[cp];
    }
    return n;
}

/* GPT-2's files are 1 MB (encoder.json) and 0.5 MB (vocab.bpe); a vocabulary of the most
 * tokens kiln takes (2^24) stays well under this. */
#define GPT2_FILE_MAX_BYTES ((size_t)256 << 20)

/* The whole of a regular file: a FIFO or a device in the folder is refused, not waited on. */
static kiln_status read_file(const char *path, char **out, size_t *len) {
    return kiln_file_read(path, GPT2_FILE_MAX_BYTES, out, len);
}

/* out := dir + suffix; 0, or -1 when it does not fit in cap bytes. */
static int join(char *out, size_t cap, const char *dir, const char *suffix) {
    size_t a = strlen(dir), b = strlen(suffix);
    if (a + b + 1 > cap)
        return -1;
    memcpy(out, dir, a);
    memcpy(out + a, suffix, b + 1);
    return 0;
}

/* Fill t->n, off, blob and eot from encoder.json. */
static kiln_status parse_encoder(kiln_tokenizer *t, const gpt2_alphabet *a, const char *path) {
    char *text = NULL;
    size_t len = 0;
    KILN_CHECK(read_file(path, &text, &len));
    kiln_status s = KILN_OK;
    const cJSON **by_id = NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: not a JSON object of token -> id", path);
        goto done;
    }
    int n = cJSON_GetArraySize(root);
    if (n < 257 || n > (1 << 24)) {
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: %d tokens (want 257 .. 2^24)", path, n);
        goto done;
    }
    by_id = calloc((size_t)n, sizeof *by_id);
    if (!by_id) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "%s: cannot allocate an index of %d tokens", path, n);
        goto done;
    }
    size_t total = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        int id = (int)v;
        if (v != (double)id || id < 0 || id >= n || by_id[id]) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: token \"%.40s\" has id %g (ids must be 0..%d, each once)",
                                path, it->string, v, n - 1);
            goto done;
        }
        by_id[id] = it;
        total += strlen(it->string);
    }
    void *off = NULL, *blob = NULL;
    KILN_CHECK_GOTO(
        s, kiln_alloc_checked(&off, ((size_t)n + 1) * sizeof(uint32_t), "token offsets"), done);
    t->off = off;
    KILN_CHECK_GOTO(s, kiln_alloc_checked(&blob, total + 1, "token bytes"), done);
    t->blob = blob;
    t->n = n;
    uint32_t at = 0;
    for (int id = 0; id < n; id++) {
        const char *key = by_id[id]->string;
        size_t klen = strlen(key);
        long m;
        if (!strcmp(key, eot_text)) {
            t->eot = id;
            memcpy(t->blob + at, key, klen);
            m = (long)klen;
        } else if (klen == 0 || (m = alphabet_decode(a, key, klen, (uint8_t *)t->blob + at)) < 0) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: token %d \"%.40s\" is not spelled in GPT-2's byte alphabet",
                                path, id, key);
            goto done;
        }
        t->off[id] = at;
        at += (uint32_t)m;
    }
    t->off[n] = at;
done:
    free(by_id);
    cJSON_Delete(root);
    free(text);
    return s;
}

/* Check that vocab.bpe's merge i makes id 256 + i out of ids that exist. */
static kiln_status check_merges(kiln_tokenizer *t, const gpt2_alphabet *a, const char *path) {
    char *text = NULL;
    size_t len = 0;
    KILN_CHECK(read_file(path, &text, &len));
    kiln_status s = KILN_OK;
    uint8_t *buf = malloc(len + 1);
    if (!buf) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %zu bytes for %s", len, path);
        goto done;
    }
    int64_t merge = 0, line = 0;
    for (char *p = text, *nl; p < text + len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl)
            nl = text + len;
        line++;
        size_t ll = (size_t)(nl - p);
        if (ll && p[ll - 1] == '\r')
            ll--;
        if (ll == 0 || (line == 1 && p[0] == '#'))
            continue;
        char *sp = memchr(p, ' ', ll);
        long na = sp ? alphabet_decode(a, p, (size_t)(sp - p), buf) : -1;
        long nb = na > 0 ? alphabet_decode(a, sp + 1, ll - (size_t)(sp + 1 - p), buf + na) : -1;
        int32_t ia = na > 0 ? kiln__tok_piece_lookup(t, buf, (size_t)na,
                                                     kiln__tok_hash_bytes(buf, (size_t)na))
                            : -1;
        int32_t ib = nb > 0 ? kiln__tok_piece_lookup(t, buf + na, (size_t)nb,
                                                     kiln__tok_hash_bytes(buf + na, (size_t)nb))
                            : -1;
        size_t nc = (size_t)(na + nb);
        int32_t ic = ia >= 0 && ib >= 0
                         ? kiln__tok_piece_lookup(t, buf, nc, kiln__tok_hash_bytes(buf, nc))
                         : -1;
        if (ic != 256 + merge) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s line %lld: merge \"%.*s\" does not make token %lld of "
                                "encoder.json (the two files do not belong together)",
                                path, (long long)line, (int)(ll > 60 ? 60 : ll), p,
                                (long long)(256 + merge));
            goto done;
        }
        merge++;
    }
    if (256 + merge + (t->eot >= 0) != t->n)
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: %lld merges, but encoder.json has %d tokens",
                            path, (long long)merge, t->n);
done:
    free(buf);
    free(text);
    return s;
}

/* Every split of a token into two tokens is a pair that merges into it. */
static kiln_status build_pairs(kiln_tokenizer *t) {
    int64_t count = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            KILN_CHECK(kiln__tok_pair_map_init(&t->pairs, count));
        for (int32_t id = 0; id < t->n; id++) {
            if (id == t->eot)
                continue;
            const uint8_t *s = (const uint8_t *)t->blob + t->off[id];
            size_t len = t->off[id + 1] - t->off[id];
            for (size_t k = 1; k < len; k++) {
                int32_t x = kiln__tok_piece_lookup(t, s, k, kiln__tok_hash_bytes(s, k));
                if (x < 0)
                    continue;
                int32_t y =
                    kiln__tok_piece_lookup(t, s + k, len - k, kiln__tok_hash_bytes(s + k, len - k));
                if (y < 0)
                    continue;
                if (pass == 0)
                    count++;
                else
                    kiln__tok_pair_map_put(&t->pairs, x, y, id);
            }
        }
    }
    return KILN_OK;
}

static kiln_status load_from(kiln_tokenizer *t, const char *dir) {
    gpt2_alphabet a;
    alphabet_init(&a);
    char enc[PATH_MAX], bpe[PATH_MAX];
    if (join(enc, sizeof enc, dir, "/encoder.json") || join(bpe, sizeof bpe, dir, "/vocab.bpe"))
        return kiln_error_setf(KILN_ERR_ARG, "the folder name %.100s... is too long", dir);
    KILN_CHECK(parse_encoder(t, &a, enc));
    KILN_CHECK(kiln__tok_build_piece_map(t));
    for (int i = 0; i < 256; i++) {
        uint8_t b = a.order[i];
        int32_t id = kiln__tok_piece_lookup(t, &b, 1, kiln__tok_hash_bytes(&b, 1));
        if (id != i)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: byte 0x%02x has id %d, GPT-2's byte order gives %d", enc, b,
                                   id, i);
        t->byte_id[b] = id;
    }
    KILN_CHECK(check_merges(t, &a, bpe));
    KILN_CHECK(build_pairs(t));
    t->whole_piece_first = 1;
    return KILN_OK;
}

kiln_status kiln__tok_load_gpt2(kiln_tokenizer **out, const char *dir) {
    kiln_tokenizer *t = NULL;
    KILN_CHECK(kiln__tok_new(&t, TOK_GPT2, "gpt2"));
    kiln_status s = load_from(t, dir);
    if (s != KILN_OK) {
        kiln_tokenizer_free(t);
        return kiln_error_wrapf(s, "loading the GPT-2 tokenizer from %s", dir);
    }
    *out = t;
    return KILN_OK;
}

long kiln__tok_byte_alphabet_decode(const char *s, size_t len, uint8_t *out) {
    gpt2_alphabet a; /* 900 bytes, built in well under a microsecond */
    alphabet_init(&a);
    return alphabet_decode(&a, s, len, out);
}
