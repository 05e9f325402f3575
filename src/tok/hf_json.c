/* Hugging Face tokenizer.json -> a TOK_HF tokenizer.
 *
 * Every component the file names is checked against what kiln runs exactly; anything else
 * (another model type, a normaliser, pre-tokeniser, post-processor or decoder kiln does not
 * have, a pattern it does not recognise, an option it does not follow) is refused by name,
 * never approximated. Merges must join tokens of the vocabulary into a token of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "kiln/core.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

#define HF_MAX_TOKENS (1 << 24)

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
/* 1 true, 0 false or absent (null), -1 another value. */
static int bool_of(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return dflt;
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : -1;
}
static int is_null(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v);
}
static const char *type_of(const cJSON *o) {
    const char *s = str_of(o, "type");
    return s ? s : "(no type)";
}

typedef struct hf_parse {
    const char *where;
    kiln_tokenizer *t;
    tok_hf *h;
    const cJSON *root;
    int has_byte_level_pretok;
    hf_norm_step dec_replace[4]; /* the decoder's Replace steps (SentencePiece style) */
    int n_dec_replace, dec_byte_fallback;
} hf_parse;

#define REFUSE(P, ...) kiln_error_setf(KILN_ERR_UNSUPPORTED, __VA_ARGS__)

static kiln_status norm_step(hf_parse *p, const cJSON *n) {
    const char *ty = type_of(n);
    tok_hf *h = p->h;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *it;
        if (!cJSON_IsArray(list))
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: normalizer Sequence has no list",
                                   p->where);
        cJSON_ArrayForEach(it, list) KILN_CHECK(norm_step(p, it));
        return KILN_OK;
    }
    if (h->n_norm == HF_MAX_NORM)
        return REFUSE(p, "%s: more than %d normalizers", p->where, HF_MAX_NORM);
    hf_norm_step *st = &h->norm[h->n_norm];
    memset(st, 0, sizeof *st);
    if (!strcmp(ty, "NFC") || !strcmp(ty, "NFKC")) {
        st->kind = ty[2] == 'K' ? HF_NORM_NFKC : HF_NORM_NFC;
    } else if (!strcmp(ty, "Prepend")) {
        const char *a = str_of(n, "prepend");
        if (!a || strlen(a) >= sizeof st->a)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: normalizer Prepend needs a short \"prepend\"", p->where);
        st->kind = HF_NORM_PREPEND;
        st->alen = (uint32_t)strlen(a);
        memcpy(st->a, a, st->alen);
    } else if (!strcmp(ty, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *a = str_of(pat, "String"), *b = str_of(n, "content");
        if (!a)
            return REFUSE(p,
                          "%s: normalizer Replace with a Regex pattern is not supported (only a "
                          "String)",
                          p->where);
        if (!b || !*a || strlen(a) >= sizeof st->a || strlen(b) >= sizeof st->b)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: normalizer Replace needs a short pattern "
                                   "and content",
                                   p->where);
        st->kind = HF_NORM_REPLACE;
        st->alen = (uint32_t)strlen(a);
        st->blen = (uint32_t)strlen(b);
        memcpy(st->a, a, st->alen);
        memcpy(st->b, b, st->blen);
    } else {
        return REFUSE(p,
                      "%s: normalizer %s is not supported (kiln runs NFC, NFKC, Prepend, "
                      "Replace of a string, and Sequence of those)",
                      p->where, ty);
    }
    h->n_norm++;
    return KILN_OK;
}

static kiln_status byte_level_opts(hf_parse *p, const cJSON *b, int want_regex) {
    if (bool_of(b, "add_prefix_space", 0) != 0)
        return REFUSE(p, "%s: pre-tokenizer ByteLevel with add_prefix_space is not supported",
                      p->where);
    int re = bool_of(b, "use_regex", 1);
    if (re < 0 || (want_regex == 0 && re))
        return REFUSE(p, "%s: pre-tokenizer ByteLevel's use_regex after a Split is not supported",
                      p->where);
    p->h->pattern = re ? HF_PAT_GPT2 : HF_PAT_NONE;
    p->has_byte_level_pretok = 1;
    return KILN_OK;
}

static kiln_status split_opts(hf_parse *p, const cJSON *sp) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(sp, "pattern");
    const char *re = str_of(pat, "Regex"), *beh = str_of(sp, "behavior");
    if (!re)
        return REFUSE(p, "%s: pre-tokenizer Split on a String is not supported", p->where);
    hf_pattern k = kiln__tok_hf_pattern_of(re);
    if (k == HF_PAT_NONE)
        return REFUSE(p,
                      "%s: pre-tokenizer Split pattern \"%.200s\" is not one kiln runs exactly "
                      "(it runs GPT-2's, Llama 3's and Qwen 2's)",
                      p->where, re);
    if (!beh || strcmp(beh, "Isolated") != 0 || bool_of(sp, "invert", 0) != 0)
        return REFUSE(p,
                      "%s: pre-tokenizer Split with behavior %s%s is not supported (only "
                      "Isolated, not inverted)",
                      p->where, beh ? beh : "(none)", bool_of(sp, "invert", 0) ? ", inverted" : "");
    p->h->pattern = k;
    return KILN_OK;
}

static kiln_status pre_tokenizer(hf_parse *p, const cJSON *pt) {
    if (!pt || cJSON_IsNull(pt))
        return KILN_OK;
    const char *ty = type_of(pt);
    if (!strcmp(ty, "ByteLevel"))
        return byte_level_opts(p, pt, 1);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        int n = cJSON_IsArray(l) ? cJSON_GetArraySize(l) : 0;
        const cJSON *a = n == 2 ? cJSON_GetArrayItem(l, 0) : NULL, *b = a ? a->next : NULL;
        if (a && b && !strcmp(type_of(a), "Split") && !strcmp(type_of(b), "ByteLevel")) {
            KILN_CHECK(byte_level_opts(p, b, 0));
            return split_opts(p, a);
        }
        char names[160] = "";
        const cJSON *it;
        cJSON_ArrayForEach(it, l) {
            size_t u = strlen(names);
            snprintf(names + u, sizeof names - u, "%s%s", u ? ", " : "", type_of(it));
        }
        return REFUSE(p,
                      "%s: pre-tokenizer Sequence [%s] is not supported (kiln runs Split then "
                      "ByteLevel, or ByteLevel alone)",
                      p->where, names);
    }
    return REFUSE(p,
                  "%s: pre-tokenizer %s is not supported (kiln runs ByteLevel, Split with a "
                  "known pattern then ByteLevel, or none)",
                  p->where, ty);
}

static kiln_status decoder(hf_parse *p, const cJSON *d) {
    if (!d || cJSON_IsNull(d))
        return KILN_OK;
    const char *ty = type_of(d);
    if (p->has_byte_level_pretok) {
        if (strcmp(ty, "ByteLevel") != 0)
            return REFUSE(p, "%s: decoder %s with a ByteLevel pre-tokenizer is not supported",
                          p->where, ty);
        return KILN_OK;
    }
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders"), *it;
    if (strcmp(ty, "Sequence") != 0)
        list = NULL;
    for (it = list ? list->child : d; it; it = list ? it->next : NULL) {
        const char *k = type_of(it);
        if (!strcmp(k, "Replace")) {
            const char *a = str_of(cJSON_GetObjectItemCaseSensitive(it, "pattern"), "String");
            const char *b = str_of(it, "content");
            if (!a || !b || !*a || strlen(a) >= 64 || strlen(b) >= 64 || p->n_dec_replace == 4)
                return REFUSE(p, "%s: decoder Replace other than of a short string", p->where);
            hf_norm_step *st = &p->dec_replace[p->n_dec_replace++];
            memset(st, 0, sizeof *st);
            st->alen = (uint32_t)strlen(a);
            st->blen = (uint32_t)strlen(b);
            memcpy(st->a, a, st->alen);
            memcpy(st->b, b, st->blen);
        } else if (!strcmp(k, "ByteFallback")) {
            p->dec_byte_fallback = 1;
        } else if (strcmp(k, "Fuse") != 0 && strcmp(k, "Strip") != 0) {
            return REFUSE(p,
                          "%s: decoder %s is not supported (kiln decodes ByteLevel, and Replace, "
                          "ByteFallback, Fuse, Strip in a Sequence)",
                          p->where, k);
        }
    }
    return KILN_OK;
}

/* The id of a token of the vocabulary by its spelling, or -1. */
static int32_t vocab_id(const cJSON *vocab, const char *s) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, s);
    return cJSON_IsNumber(v) ? (int32_t)v->valuedouble : -1;
}

static kiln_status post_processor(hf_parse *p, const cJSON *pp, const cJSON *vocab) {
    if (!pp || cJSON_IsNull(pp))
        return KILN_OK;
    const char *ty = type_of(pp);
    if (!strcmp(ty, "ByteLevel"))
        return KILN_OK; /* it only moves offsets */
    if (!strcmp(ty, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pp, "processors"))
            KILN_CHECK(post_processor(p, it, vocab));
        return KILN_OK;
    }
    if (strcmp(ty, "TemplateProcessing") != 0)
        return REFUSE(p,
                      "%s: post-processor %s is not supported (kiln reads TemplateProcessing "
                      "and ByteLevel)",
                      p->where, ty);
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "single"), 0);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const char *name = str_of(sp, "id");
    if (!name)
        return KILN_OK;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(pp, "special_tokens"), name);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(st, "ids");
    if (cJSON_GetArraySize(ids) == 1 && cJSON_IsNumber(ids->child))
        p->h->bos = (int32_t)ids->child->valuedouble;
    else if (vocab_id(vocab, name) >= 0)
        p->h->bos = vocab_id(vocab, name);
    return KILN_OK;
}

/* A token's bytes: the byte alphabet decoded (byte-level), or the decoder's Replace steps and
 * <0xXX> (SentencePiece style). out has room for 4x the spelling. */
static long decode_spelling(const hf_parse *p, const char *s, uint8_t *out) {
    size_t n = strlen(s);
    if (p->has_byte_level_pretok)
        return kiln__tok_byte_alphabet_decode(s, n, out);
    unsigned v;
    char tail;
    if (p->dec_byte_fallback && n == 6 && sscanf(s, "<0x%2X>%c", &v, &tail) == 1 && s[5] == '>') {
        out[0] = (uint8_t)v;
        return 1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int hit = 0;
        for (int r = 0; r < p->n_dec_replace && !hit; r++) {
            const hf_norm_step *st = &p->dec_replace[r];
            if (n - i >= st->alen && !memcmp(s + i, st->a, st->alen)) {
                memcpy(out + k, st->b, st->blen);
                k += st->blen;
                i += st->alen;
                hit = 1;
            }
        }
        if (!hit)
            out[k++] = (uint8_t)s[i++];
    }
    return (long)k;
}

static kiln_status model_opts(hf_parse *p, const cJSON *m) {
    const char *ty = str_of(m, "type");
    if (!cJSON_IsObject(m))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: no \"model\" object (not a tokenizer.json?)",
                               p->where);
    if (!ty || strcmp(ty, "BPE") != 0)
        return REFUSE(p, "%s: model type %s is not supported (kiln runs BPE)", p->where,
                      ty ? ty : "(none)");
    const cJSON *dr = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (dr && !cJSON_IsNull(dr) && !(cJSON_IsNumber(dr) && dr->valuedouble == 0))
        return REFUSE(p, "%s: BPE dropout is not supported (it makes encoding random)", p->where);
    const char *opt[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *v = str_of(m, opt[i]);
        if ((v && *v) || (!v && !is_null(m, opt[i])))
            return REFUSE(p, "%s: BPE %s is not supported", p->where, opt[i]);
    }
    int bf = bool_of(m, "byte_fallback", 0), im = bool_of(m, "ignore_merges", 0);
    if (bf < 0 || im < 0)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: byte_fallback and ignore_merges must be true "
                               "or false",
                               p->where);
    p->h->byte_fallback = (uint32_t)bf;
    p->h->ignore_merges = (uint32_t)im;
    return KILN_OK;
}

/* Fill t->n, off and blob (what each id decodes to), h->mblob and moff (SentencePiece style:
 * the vocabulary's spellings), h->special and the added tokens looked for in text. */
static kiln_status vocabulary(hf_parse *p, const cJSON *vocab, const cJSON *added) {
    kiln_tokenizer *t = p->t;
    tok_hf *h = p->h;
    if (!cJSON_IsObject(vocab))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: model has no \"vocab\" object", p->where);
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: \"added_tokens\" is not a list", p->where);
    int64_t n = 0;
    size_t total = 0;
    const cJSON *it;
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *list = pass ? added : vocab;
        cJSON_ArrayForEach(it, list) {
            const cJSON *idv = pass ? cJSON_GetObjectItemCaseSensitive(it, "id") : it;
            const char *s = pass ? str_of(it, "content") : it->string;
            double v = cJSON_IsNumber(idv) ? idv->valuedouble : -1;
            if (!s || v < 0 || v >= HF_MAX_TOKENS || v != (double)(int32_t)v)
                return kiln_error_setf(KILN_ERR_FORMAT,
                                       "%s: %s \"%.40s\" has id %g (want 0 .. 2^24)", p->where,
                                       pass ? "added token" : "token", s ? s : "?", v);
            if ((int64_t)v + 1 > n)
                n = (int64_t)v + 1;
            total += strlen(s);
        }
    }
    if (n < 1)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: the vocabulary is empty", p->where);
    const char **spell = calloc((size_t)n, sizeof *spell);
    uint8_t *from_added = calloc((size_t)n, 1);
    kiln_status s = KILN_OK;
    void *off = NULL, *blob = NULL, *moff = NULL, *mblob = NULL, *sp = NULL;
    if (!spell || !from_added) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "%s: cannot index %lld tokens", p->where, (long long)n);
        goto done;
    }
    KILN_CHECK_GOTO(s, kiln_alloc_checked(&sp, (size_t)n, "special-token flags"), done);
    h->special = sp;
    memset(h->special, 0, (size_t)n);
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = (int32_t)it->valuedouble;
        if (spell[id]) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: tokens \"%.40s\" and \"%.40s\" have the same "
                                "id %d",
                                p->where, spell[id], it->string, id);
            goto done;
        }
        spell[id] = it->string;
    }
    int n_added = 0;
    cJSON_ArrayForEach(it, added) {
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        const char *c = str_of(it, "content");
        int special = bool_of(it, "special", 0) == 1;
        if (spell[id] && strcmp(spell[id], c) != 0 && !h->special[id]) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: added token \"%.40s\" has id %d, which is "
                                "the vocabulary's \"%.40s\"",
                                p->where, c, id, spell[id]);
            goto done;
        }
        spell[id] = c;
        from_added[id] = 1;
        h->special[id] = (uint8_t)special;
        if (!special) {
            if (bool_of(it, "lstrip", 0) || bool_of(it, "rstrip", 0) ||
                bool_of(it, "single_word", 0)) {
                s = REFUSE(p,
                           "%s: added token \"%.40s\": lstrip, rstrip and single_word are not "
                           "supported",
                           p->where, c);
                goto done;
            }
            if (!*c) {
                s = kiln_error_setf(KILN_ERR_FORMAT, "%s: added token %d is empty", p->where, id);
                goto done;
            }
            n_added++;
        }
    }
    for (int64_t id = 0; id < n; id++)
        if (!spell[id]) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: no token has id %lld (ids must be 0..%lld, "
                                "each once)",
                                p->where, (long long)id, (long long)n - 1);
            goto done;
        }
    size_t grow = 1; /* a decoder's Replace may lengthen a spelling this many times */
    for (int r = 0; r < p->n_dec_replace; r++)
        if ((p->dec_replace[r].blen + p->dec_replace[r].alen - 1) / p->dec_replace[r].alen > grow)
            grow = (p->dec_replace[r].blen + p->dec_replace[r].alen - 1) / p->dec_replace[r].alen;
    size_t cap = total * grow + 8;
    KILN_CHECK_GOTO(
        s, kiln_alloc_checked(&off, ((size_t)n + 1) * sizeof(uint32_t), "token offsets"), done);
    t->off = off;
    KILN_CHECK_GOTO(s, kiln_alloc_checked(&blob, cap, "token bytes"), done);
    t->blob = blob;
    t->n = (int32_t)n;
    if (!p->has_byte_level_pretok) {
        KILN_CHECK_GOTO(
            s, kiln_alloc_checked(&moff, ((size_t)n + 1) * sizeof(uint32_t), "token spellings"),
            done);
        h->moff = moff;
        KILN_CHECK_GOTO(s, kiln_alloc_checked(&mblob, total + 1, "token spellings"), done);
        h->mblob = mblob;
    }
    size_t at = 0, mat = 0;
    for (int64_t id = 0; id < n; id++) {
        int is_added = from_added[id];
        long k;
        size_t sl = strlen(spell[id]);
        if (is_added) { /* an added token's text is its bytes */
            memcpy(t->blob + at, spell[id], sl);
            k = (long)sl;
        } else if ((k = decode_spelling(p, spell[id], (uint8_t *)t->blob + at)) < 0 ||
                   (k == 0 && sl)) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: token %lld \"%.40s\" is not spelled in the "
                                "ByteLevel byte alphabet",
                                p->where, (long long)id, spell[id]);
            goto done;
        }
        t->off[id] = (uint32_t)at;
        at += (size_t)k;
        if (h->moff) {
            h->moff[id] = (uint32_t)mat;
            memcpy(h->mblob + mat, spell[id], sl);
            mat += sl;
        }
        if (at > UINT32_MAX / 2) {
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: the tokens hold more than 2 GiB", p->where);
            goto done;
        }
    }
    t->off[n] = (uint32_t)at;
    if (h->moff)
        h->moff[n] = (uint32_t)mat;
    /* The added tokens looked for in text; normalised ones by their normalised text. */
    void *ad = NULL;
    KILN_CHECK_GOTO(
        s, kiln_alloc_checked(&ad, (size_t)(n_added + 1) * sizeof(hf_added), "added tokens"), done);
    h->added = ad;
    kiln_bytes nb = {0}, acc = {0};
    KILN_CHECK_GOTO(s, kiln__tok_bytes_reserve(&acc, 1), added_done);
    cJSON_ArrayForEach(it, added) {
        if (bool_of(it, "special", 0) == 1)
            continue;
        const char *c = str_of(it, "content");
        hf_added *a = &h->added[h->n_added++];
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        a->normalized = bool_of(it, "normalized", 1) == 1 && h->n_norm > 0;
        a->off = (uint32_t)acc.len;
        const char *text = c;
        size_t tl = strlen(c);
        if (a->normalized) {
            KILN_CHECK_GOTO(s, kiln__tok_hf_normalize(h, (const uint8_t *)c, tl, &nb), added_done);
            text = nb.data;
            tl = nb.len;
        }
        if (tl == 0 || tl > (1u << 20)) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: added token \"%.40s\" normalises to %zu bytes", p->where, c,
                                tl);
            goto added_done;
        }
        KILN_CHECK_GOTO(s, kiln__tok_bytes_reserve(&acc, tl), added_done);
        memcpy(acc.data + acc.len, text, tl);
        acc.len += tl;
        a->len = (uint32_t)tl;
    }
    h->added_text = acc.data;
    acc.data = NULL;
added_done:
    kiln_bytes_free(&acc);
    kiln_bytes_free(&nb);
done:
    free(spell);
    free(from_added);
    return s;
}

/* The merges: "a b" (or ["a", "b"]) joins two tokens into the token a+b; rank = place. */
static kiln_status merges(hf_parse *p, const cJSON *list) {
    kiln_tokenizer *t = p->t;
    tok_hf *h = p->h;
    if (!cJSON_IsArray(list))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: model has no \"merges\" list", p->where);
    int64_t m = cJSON_GetArraySize(list);
    h->n_ranks = m;
    void *rm = NULL;
    if (kiln_alloc_checked(&rm, (size_t)(m ? m : 1) * sizeof *h->rank_merge, "merges") != KILN_OK)
        return KILN_ERR_NOMEM;
    h->rank_merge = rm;
    uint8_t *buf = malloc(1 << 17);
    kiln_status s = KILN_OK;
    if (!buf) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "%s: cannot allocate %lld merges", p->where,
                            (long long)m);
        goto done;
    }
    int64_t r = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                s = kiln_error_setf(KILN_ERR_FORMAT,
                                    "%s: merge %lld \"%.60s\" is not two tokens "
                                    "and one space",
                                    p->where, (long long)r, it->valuestring);
                goto done;
            }
            a = it->valuestring;
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            a = it->child->valuestring;
            b = it->child->next->valuestring;
            al = strlen(a);
            bl = strlen(b);
        }
        if (!a || !al || !bl || al + bl > (1 << 14)) {
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: merge %lld is not a pair of tokens", p->where,
                                (long long)r);
            goto done;
        }
        /* Look both up by what they decode to (byte-level) or as spelled. */
        int32_t ids[3];
        const char *part[2] = {a, b};
        size_t plen[2] = {al, bl};
        long dl[2];
        for (int k = 0; k < 2; k++) {
            if (p->has_byte_level_pretok) {
                dl[k] = kiln__tok_byte_alphabet_decode(part[k], plen[k], buf + (k ? dl[0] : 0));
                if (dl[k] < 0) {
                    s = kiln_error_setf(KILN_ERR_FORMAT,
                                        "%s: merge %lld is not spelled in the "
                                        "ByteLevel byte alphabet",
                                        p->where, (long long)r);
                    goto done;
                }
            } else {
                memcpy(buf + (k ? dl[0] : 0), part[k], plen[k]);
                dl[k] = (long)plen[k];
            }
            const uint8_t *q = buf + (k ? dl[0] : 0);
            ids[k] =
                kiln__tok_piece_lookup(t, q, (size_t)dl[k], kiln__tok_hash_bytes(q, (size_t)dl[k]));
            if (ids[k] < 0) {
                s = kiln_error_setf(KILN_ERR_FORMAT,
                                    "%s: merge %lld names \"%.*s\", which is not in "
                                    "the vocabulary",
                                    p->where, (long long)r, (int)(plen[k] > 60 ? 60 : plen[k]),
                                    part[k]);
                goto done;
            }
        }
        size_t ml = (size_t)(dl[0] + dl[1]);
        ids[2] = kiln__tok_piece_lookup(t, buf, ml, kiln__tok_hash_bytes(buf, ml));
        if (ids[2] < 0) {
            s = kiln_error_setf(KILN_ERR_FORMAT,
                                "%s: merge %lld joins \"%.*s\" and \"%.*s\" into a "
                                "token that is not in the vocabulary",
                                p->where, (long long)r, (int)(al > 40 ? 40 : al), a,
                                (int)(bl > 40 ? 40 : bl), b);
            goto done;
        }
        memcpy(h->rank_merge[r++], ids, sizeof ids);
    }
done:
    free(buf);
    return s;
}

/* Document separator: the first of these that is a special added token. */
static int32_t pick_eot(const kiln_tokenizer *t) {
    static const char *names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
    for (int k = 0; k < 4; k++)
        for (int32_t id = 0; id < t->n; id++) {
            size_t len = t->off[id + 1] - t->off[id];
            if (t->hf->special[id] && len == strlen(names[k]) &&
                !memcmp(t->blob + t->off[id], names[k], len))
                return id;
        }
    return -1;
}

kiln_status kiln__tok_hf_from_json(kiln_tokenizer **out, const char *text, size_t len,
                                   const char *where) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: not valid JSON (a tokenizer.json is one JSON "
                               "object)",
                               where);
    }
    kiln_tokenizer *t = NULL;
    kiln_status s = kiln__tok_new(&t, TOK_HF, where);
    if (s != KILN_OK) {
        cJSON_Delete(root);
        return s;
    }
    hf_parse p = {.where = where, .t = t, .root = root};
    t->hf = calloc(1, sizeof *t->hf);
    if (!t->hf) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a tokenizer");
        goto fail;
    }
    p.h = t->hf;
    p.h->unk = p.h->bos = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    KILN_CHECK_GOTO(s, model_opts(&p, model), fail);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm))
        KILN_CHECK_GOTO(s, norm_step(&p, norm), fail);
    KILN_CHECK_GOTO(s, pre_tokenizer(&p, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")),
                    fail);
    p.h->style = p.has_byte_level_pretok ? HF_BYTE_LEVEL : HF_SENTENCEPIECE;
    KILN_CHECK_GOTO(s, decoder(&p, cJSON_GetObjectItemCaseSensitive(root, "decoder")), fail);
    KILN_CHECK_GOTO(
        s, vocabulary(&p, vocab, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")), fail);
    KILN_CHECK_GOTO(
        s, post_processor(&p, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), vocab),
        fail);
    const char *unk = str_of(model, "unk_token");
    if (unk && (p.h->unk = vocab_id(vocab, unk)) < 0) {
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: unk_token \"%.40s\" is not in the vocabulary",
                            where, unk);
        goto fail;
    }
    t->key_off = p.h->moff;
    t->key_blob = p.h->mblob;
    KILN_CHECK_GOTO(s, kiln__tok_build_piece_map(t), fail);
    KILN_CHECK_GOTO(s, merges(&p, cJSON_GetObjectItemCaseSensitive(model, "merges")), fail);
    t->eot = pick_eot(t);
    KILN_CHECK_GOTO(s, kiln__tok_hf_finish(t, 0), fail);
    cJSON_Delete(root);
    *out = t;
    return KILN_OK;
fail:
    cJSON_Delete(root);
    kiln_tokenizer_free(t);
    return s;
}
