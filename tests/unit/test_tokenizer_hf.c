/* Hugging Face tokenizer.json: small hand-written files of both styles (byte-level BPE with
 * Llama 3's pattern, SentencePiece-style BPE with byte fallback) give the ids worked out by
 * hand; added and special tokens, BOS and eot; the prepared form is made, reused, and made
 * again when the file changes; the identity; and bad files are refused, saying what. The
 * comparison with tokenizers.js on real files is in tests/tok/ref_hf.js. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core.h"
#include "kiln/tokenizer.h"
#include "test.h"

static char dir[512];

/* GPT-2's byte alphabet: the character that stands for byte b, as UTF-8, into out. */
static void alphabet_char(int b, char *out) {
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
        if (!printable && x == b)
            cp = 256 + n;
        n += !printable;
    }
    if (cp < 0)
        cp = b;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* The alphabet's bytes in id order: printable ones first, as GPT-2 numbers them. */
static int byte_of_id(int id) {
    int n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int x = 0; x < 256; x++) {
            int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
            if (printable == !pass && n++ == id)
                return x;
        }
    return -1;
}

static const char llama3_re[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

/* A byte-level tokenizer.json: ids 0..255 the bytes, then he, Ġt, Ġthe, ll, llo; added
 * <|endoftext|> 261 (special), <tool> 262 (not special), <|begin_of_text|> 263 (special, the
 * post-processor's BOS). `merges` and `extra` (more top-level members) vary it. */
static char *byte_level_json(const char *merges, const char *pre) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(
        s + n, cap - n,
        "{\"version\":\"1.0\",\"added_tokens\":["
        "{\"id\":261,\"content\":\"<|endoftext|>\",\"special\":true},"
        "{\"id\":262,\"content\":\"<tool>\",\"special\":false,\"normalized\":false},"
        "{\"id\":263,\"content\":\"<|begin_of_text|>\",\"special\":true}],"
        "\"normalizer\":null,\"pre_tokenizer\":%s,"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
        "{\"id\":\"<|begin_of_text|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]"
        ","
        "\"special_tokens\":{\"<|begin_of_text|>\":{\"id\":\"<|begin_of_text|>\",\"ids\":[263]}}},"
        "\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"ignore_merges\":false,"
        "\"vocab\":{",
        pre);
    for (int id = 0; id < 256; id++) {
        char c[4];
        alphabet_char(byte_of_id(id), c);
        const char *esc = c[0] == '"' ? "\\\"" : c[0] == '\\' ? "\\\\" : c;
        n += (size_t)snprintf(s + n, cap - n, "\"%s\":%d,", esc, id);
    }
    n += (size_t)snprintf(s + n, cap - n,
                          "\"he\":256,\"\xc4\xa0t\":257,\"\xc4\xa0the\":258,"
                          "\"ll\":259,\"llo\":260},\"merges\":[%s]}}",
                          merges);
    return s;
}

static const char bl_merges[] = "\"h e\",\"\xc4\xa0 t\",\"\xc4\xa0t he\",\"l l\",\"ll o\"";
static char bl_pre[1024];

/* A SentencePiece-style one: <unk> <s> </s>, <0x00>..<0xFF> (3..258), then ▁ a b ▁a ab ▁ab. */
static char *sp_json(const char *merges, const char *norm) {
    size_t cap = 1 << 15, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(
        s + n, cap - n,
        "{\"added_tokens\":["
        "{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
        "{\"id\":1,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
        "\"normalizer\":%s,\"pre_tokenizer\":null,"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
        "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
        "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1]}}},"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\"\xe2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
        "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,"
        "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,",
        norm);
    for (int b = 0; b < 256; b++)
        n += (size_t)snprintf(s + n, cap - n, "\"<0x%02X>\":%d,", b, 3 + b);
    n += (size_t)snprintf(s + n, cap - n,
                          "\"\xe2\x96\x81\":259,\"a\":260,\"b\":261,"
                          "\"\xe2\x96\x81"
                          "a\":262,\"ab\":263,\"\xe2\x96\x81"
                          "ab\":264},"
                          "\"merges\":[%s]}}",
                          merges);
    return s;
}
static const char sp_merges[] = "\"\xe2\x96\x81 a\",\"a b\",\"\xe2\x96\x81"
                                "a b\"";
static const char sp_norm[] =
    "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]}";

static void write_json(const char *name, char *text, char *path, size_t cap) {
    test_path(path, cap, dir, name);
    CHECK_TRUE(test_write_file(path, text, strlen(text)) == 0);
    free(text);
}

static void check_ids(const kiln_tokenizer *t, const char *s, const int32_t *want, int64_t n) {
    kiln_tokens ids = {0};
    CHECK_OK(kiln_tokenizer_encode(t, s, strlen(s), &ids));
    CHECK_INT_EQ(ids.len, n);
    for (int64_t i = 0; i < n && i < ids.len; i++)
        CHECK_INT_EQ(ids.ids[i], want[i]);
    kiln_tokens_free(&ids);
}

static void check_decode(const kiln_tokenizer *t, const char *s, const char *want) {
    kiln_tokens ids = {0};
    kiln_bytes back = {0};
    CHECK_OK(kiln_tokenizer_encode(t, s, strlen(s), &ids));
    CHECK_OK(kiln_tokenizer_decode(t, ids.ids, ids.len, &back));
    CHECK_INT_EQ(back.len, strlen(want));
    CHECK_TRUE(back.len == strlen(want) && !memcmp(back.data, want, back.len));
    kiln_bytes_free(&back);
    kiln_tokens_free(&ids);
}

static void test_byte_level(void) {
    char path[600];
    write_json("bl.json", byte_level_json(bl_merges, bl_pre), path, sizeof path);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(&t, path));
    if (!t)
        return;
    CHECK_INT_EQ(kiln_tokenizer_vocab_size(t), 264);
    CHECK_INT_EQ(kiln_tokenizer_eot(t), 261);
    CHECK_INT_EQ(kiln_tokenizer_bos(t), 263);
    /* "hello" -> h e l l o -> he l l o -> he ll o -> he llo; " the" -> Ġ t he -> Ġt he -> Ġthe */
    check_ids(t, "hello the", (const int32_t[]){256, 260, 258}, 3);
    /* <tool> (not special) is found in text; <|endoftext|> (special) is ordinary text:
     * "<|", "endoftext", "|>" as bytes */
    check_ids(t, "x<tool>y", (const int32_t[]){'x' - 33, 262, 'y' - 33}, 3);
    kiln_tokens ids = {0};
    CHECK_OK(kiln_tokenizer_encode(t, "<|endoftext|>", 13, &ids));
    CHECK_INT_EQ(ids.len, 13); /* 13 bytes, none of which merge */
    for (int64_t i = 0; i < ids.len; i++)
        CHECK_TRUE(ids.ids[i] != 261);
    kiln_tokens_free(&ids);
    /* Llama 3's pattern: contractions in any case, digits by three, spaces before a newline */
    check_ids(t, "IT'S", (const int32_t[]){'I' - 33, 'T' - 33, '\'' - 33, 'S' - 33}, 4);
    check_decode(t, "caf\xc3\xa9 12345  \n\n\t x<tool>", "caf\xc3\xa9 12345  \n\n\t x<tool>");
    check_decode(t, "\xff\xfe bad utf-8 \xc3", "\xff\xfe bad utf-8 \xc3");
    kiln_tokenizer_free(t);
}

static void test_sentencepiece(void) {
    char path[600];
    write_json("sp.json", sp_json(sp_merges, sp_norm), path, sizeof path);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(&t, path));
    if (!t)
        return;
    CHECK_INT_EQ(kiln_tokenizer_eot(t), 2);
    CHECK_INT_EQ(kiln_tokenizer_bos(t), 1);
    /* "ab ab" -> ▁ab▁ab -> (▁a b)(▁a b) -> ▁ab ▁ab */
    check_ids(t, "ab ab", (const int32_t[]){264, 264}, 2);
    /* c is not in the vocabulary: its byte 0x63 (id 3 + 0x63); é: bytes C3 A9 */
    check_ids(t, "ac", (const int32_t[]){262, 3 + 0x63}, 2);
    check_ids(t, "\xc3\xa9", (const int32_t[]){259, 3 + 0xC3, 3 + 0xA9}, 3);
    /* <s> in text is ordinary: < s > as bytes after ▁ */
    check_ids(t, "<s>", (const int32_t[]){259, 3 + '<', 3 + 's', 3 + '>'}, 4);
    check_decode(t, "ab ba", " ab ba"); /* decode keeps the space Prepend added */
    kiln_tokenizer_free(t);
}

/* The prepared form: written beside the file, used when current, made again when the file
 * changes; the identity follows what decides the ids, not the path. */
static void test_prepared(void) {
    char path[600], cache[700], other[600];
    write_json("p.json", byte_level_json(bl_merges, bl_pre), path, sizeof path);
    snprintf(cache, sizeof cache, "%s/.p.json.kiln", dir);
    unlink(cache);
    kiln_tokenizer *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(kiln_tokenizer_load(&a, path));
    struct stat st;
    CHECK_TRUE(stat(cache, &st) == 0);
    CHECK_OK(kiln_tokenizer_load(&b, path)); /* from the cache */
    CHECK_TRUE(a && b && kiln_tokenizer_id(a) == kiln_tokenizer_id(b));
    write_json("q.json", byte_level_json(bl_merges, bl_pre), other, sizeof other);
    CHECK_OK(kiln_tokenizer_load(&c, other));
    CHECK_TRUE(c && a && kiln_tokenizer_id(c) == kiln_tokenizer_id(a));
    kiln_tokenizer_free(c);
    c = NULL;
    /* Change the file: one merge fewer. The stale cache is not used. */
    write_json("p.json", byte_level_json("\"h e\",\"\xc4\xa0 t\",\"\xc4\xa0t he\",\"l l\"", bl_pre),
               path, sizeof path);
    CHECK_OK(kiln_tokenizer_load(&c, path));
    if (c) {
        CHECK_TRUE(kiln_tokenizer_id(c) != kiln_tokenizer_id(a));
        check_ids(c, "hello", (const int32_t[]){256, 259, 'o' - 33}, 3);
    }
    /* A damaged cache is made again, not trusted. */
    kiln_tokenizer_free(c);
    c = NULL;
    FILE *f = fopen(cache, "r+b");
    CHECK_TRUE(f != NULL);
    if (f) {
        fseek(f, 100, SEEK_SET);
        fputc(0x5A, f);
        fclose(f);
    }
    CHECK_OK(kiln_tokenizer_load(&c, path));
    if (c)
        check_ids(c, "hello", (const int32_t[]){256, 259, 'o' - 33}, 3);
    kiln_tokenizer_free(a);
    kiln_tokenizer_free(b);
    kiln_tokenizer_free(c);
}

static void expect_refused(const char *name, char *json, kiln_status want, const char *words) {
    char path[600];
    write_json(name, json, path, sizeof path);
    kiln_tokenizer *t = NULL;
    CHECK_STATUS(kiln_tokenizer_load(&t, path), want);
    CHECK_TRUE(t == NULL);
    const char *msg = kiln_error_message();
    if (!strstr(msg, words))
        fprintf(stderr, "  message \"%s\" does not name \"%s\"\n", msg, words);
    CHECK_TRUE(strstr(msg, words) != NULL);
}

static char *replaced(char *s, const char *from, const char *to) {
    char *at = strstr(s, from);
    CHECK_TRUE(at != NULL);
    if (!at)
        return s;
    size_t a = (size_t)(at - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *r = malloc(n - fl + tl + 1);
    memcpy(r, s, a);
    memcpy(r + a, to, tl);
    memcpy(r + a + tl, at + fl, n - a - fl + 1);
    free(s);
    return r;
}

static void test_bad_files(void) {
    expect_refused("m1.json",
                   replaced(byte_level_json(bl_merges, bl_pre), "\"BPE\"", "\"Unigram\""),
                   KILN_ERR_UNSUPPORTED, "model type Unigram");
    expect_refused("m2.json", replaced(byte_level_json(bl_merges, bl_pre), "{1,3}", "{1,4}"),
                   KILN_ERR_UNSUPPORTED, "is not one kiln runs exactly");
    expect_refused("m3.json", replaced(byte_level_json(bl_merges, bl_pre), "\"ll o\"", "\"ll q\""),
                   KILN_ERR_FORMAT, "not in the vocabulary");
    expect_refused("m4.json", replaced(byte_level_json(bl_merges, bl_pre), "\"ll o\"", "\"ll zz\""),
                   KILN_ERR_FORMAT, "\"zz\", which is not in the vocabulary");
    expect_refused("m5.json",
                   replaced(byte_level_json(bl_merges, bl_pre), "\"merges\"", "\"merges\":[}"),
                   KILN_ERR_FORMAT, "not valid JSON");
    expect_refused("m6.json",
                   replaced(sp_json(sp_merges, sp_norm), "\"Prepend\",\"prepend\":\"\xe2\x96\x81\"",
                            "\"Lowercase\""),
                   KILN_ERR_UNSUPPORTED, "normalizer Lowercase");
    expect_refused("m7.json",
                   replaced(sp_json(sp_merges, sp_norm), "\"pre_tokenizer\":null",
                            "\"pre_tokenizer\":{\"type\":\"Metaspace\"}"),
                   KILN_ERR_UNSUPPORTED, "pre-tokenizer Metaspace");
    expect_refused(
        "m8.json",
        replaced(sp_json(sp_merges, sp_norm), "{\"type\":\"Fuse\"}", "{\"type\":\"CTC\"}"),
        KILN_ERR_UNSUPPORTED, "decoder CTC");
    expect_refused("m9.json",
                   replaced(byte_level_json(bl_merges, bl_pre), "\"ll\":259", "\"ll\":999"),
                   KILN_ERR_FORMAT, "no token has id 259");
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "tokenizer_hf");
    snprintf(bl_pre, sizeof bl_pre,
             "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
             "\"%s\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
             "\"add_prefix_space\":false,\"use_regex\":false}]}",
             llama3_re);
    RUN_TEST(test_byte_level);
    RUN_TEST(test_sentencepiece);
    RUN_TEST(test_prepared);
    RUN_TEST(test_bad_files);
    test_rmtree(dir);
    TEST_MAIN_END();
}
