/* Training a byte-level BPE: the trained tokenizer encodes as applying its merges by rank
 * (checked against a naive reference), saves and reloads to the same ids, trains the same
 * twice, and its file format rejects damaged files with clear errors. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "kiln/core.h"
#include "kiln/tokenizer.h"
#include "test.h"
#include "tok/tok_internal.h"

static char *make_corpus(size_t n, uint64_t seed) {
    static const char *syl[] = {"ka", "lo", "mi", "ne", "ta", "ri", "su",       "ve",
                                "do", "pa", "th", "er", "in", "on", "\xc3\xa9", "\xe4\xb8\xad"};
    static const char *sep[] = {" ", " ", " ", " ", ", ", ". ", "\n", "'s ", " 12", "  "};
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    char *s = malloc(n + 16);
    size_t at = 0;
    while (at < n) {
        /* Zipf-like: low syllable numbers are much more common */
        int len = 1 + (int)kiln_rng_below(&rng, 4);
        for (int i = 0; i < len; i++) {
            uint64_t r = kiln_rng_below(&rng, 16);
            const char *p = syl[r * r / 16];
            size_t l = strlen(p);
            if (at + l > n)
                break;
            memcpy(s + at, p, l);
            at += l;
        }
        const char *p = sep[kiln_rng_below(&rng, 10)];
        size_t l = strlen(p);
        if (at + l > n)
            break;
        memcpy(s + at, p, l);
        at += l;
    }
    s[at] = '\0';
    return s;
}

/* Applying the merges by rank: for each merge in order, every non-overlapping occurrence in
 * each piece, left to right. */
static void naive_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_tokens *out) {
    tok_pretok pre;
    kiln__tok_pretok_init(&pre);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(pre.re, NULL);
    const uint8_t *s = (const uint8_t *)text;
    int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
    for (size_t pos = 0, end = 0; pos < len; pos = end) {
        kiln__tok_pretok_next(&pre, md, s, len, pos, 0, &end);
        size_t n = end - pos;
        for (size_t i = 0; i < n; i++)
            ids[i] = s[pos + i];
        for (int64_t r = 0; r < t->n_merges && n > 1; r++) {
            int32_t a = t->merges[r][0], b = t->merges[r][1];
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                if (i + 1 < n && ids[i] == a && ids[i + 1] == b) {
                    ids[k++] = (int32_t)(256 + r);
                    i++;
                } else {
                    ids[k++] = ids[i];
                }
            }
            n = k;
        }
        kiln_tokens_reserve(out, (int64_t)n);
        memcpy(out->ids + out->len, ids, n * sizeof *ids);
        out->len += (int64_t)n;
    }
    free(ids);
    pcre2_match_data_free(md);
    kiln__tok_pretok_free(&pre);
}

static int same_ids(const kiln_tokens *a, const kiln_tokens *b) {
    return a->len == b->len && !memcmp(a->ids, b->ids, (size_t)a->len * sizeof(int32_t));
}

static kiln_tokenizer *train(const char *text, int64_t vocab) {
    kiln_bpe_trainer *tr = NULL;
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_bpe_trainer_init(&tr));
    /* in two parts, as the command adds one file after another (cut where a piece starts,
     * so that the pieces are those of the whole) */
    size_t half = kiln__tok_pretok_safe_cut((const uint8_t *)text, strlen(text), strlen(text) / 2);
    CHECK_OK(kiln_bpe_trainer_add(tr, text, half));
    CHECK_OK(kiln_bpe_trainer_add(tr, text + half, strlen(text) - half));
    CHECK_OK(kiln_bpe_trainer_finish(tr, vocab, &t));
    kiln_bpe_trainer_free(tr);
    return t;
}

static char *corpus;

static void check_against_naive(const kiln_tokenizer *t, const char *text, size_t len) {
    kiln_tokens got = {0}, want = {0};
    kiln_bytes back = {0};
    CHECK_OK(kiln_tokenizer_encode(t, text, len, &got));
    naive_encode(t, text, len, &want);
    CHECK_INT_EQ(got.len, want.len);
    CHECK_TRUE(same_ids(&got, &want));
    CHECK_OK(kiln_tokenizer_decode(t, got.ids, got.len, &back));
    CHECK_TRUE(back.len == len && !memcmp(back.data, text, len));
    kiln_tokens_free(&got);
    kiln_tokens_free(&want);
    kiln_bytes_free(&back);
}

static void test_train_encodes_by_rank(void) {
    kiln_tokenizer *t = train(corpus, 257 + 600);
    if (!t)
        return;
    CHECK_INT_EQ(kiln_tokenizer_vocab_size(t), 857);
    CHECK_INT_EQ(kiln_tokenizer_eot(t), 856);
    CHECK_STR_EQ(kiln_tokenizer_name(t), "bpe");
    check_against_naive(t, corpus, strlen(corpus));
    char *other = make_corpus(50000, 99); /* text it was not trained on */
    check_against_naive(t, other, strlen(other));
    const char odd[] = "\xff\xfe caf\xc3\xa9 \xed\xa0\x80 'S 'LL   \n\n\t kakaka 12345 \x00 x";
    check_against_naive(t, odd, sizeof odd - 1);
    /* Frequent syllables became tokens: the corpus shrinks well below one id per byte. */
    kiln_tokens ids = {0};
    CHECK_OK(kiln_tokenizer_encode(t, corpus, strlen(corpus), &ids));
    CHECK_TRUE(ids.len * 3 < (int64_t)strlen(corpus));
    kiln_tokens_free(&ids);
    free(other);
    kiln_tokenizer_free(t);
}

static char dir[256], path_a[512], path_b[512], path_bad[512];

static int read_whole(const char *path, uint8_t **buf, size_t *len) {
    *buf = test_slurp(path, len);
    return *buf ? 0 : -1;
}

static void write_whole(const char *path, const uint8_t *buf, size_t len) {
    CHECK_INT_EQ(test_write_file(path, buf, len), 0);
}

static void test_save_load_and_determinism(void) {
    kiln_tokenizer *t = train(corpus, 257 + 300), *u = train(corpus, 257 + 300), *r = NULL;
    if (!t || !u)
        return;
    CHECK_OK(kiln_tokenizer_save(t, path_a));
    CHECK_OK(kiln_tokenizer_save(u, path_b));
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK_TRUE(read_whole(path_a, &a, &na) == 0);
    CHECK_TRUE(read_whole(path_b, &b, &nb) == 0);
    CHECK_TRUE(na == nb && na == 24 + 8 * 300 + 8 && !memcmp(a, b, na));
    CHECK_OK(kiln_tokenizer_load(&r, path_a));
    if (r) {
        CHECK_STR_EQ(kiln_tokenizer_name(r), path_a);
        CHECK_INT_EQ(kiln_tokenizer_vocab_size(r), kiln_tokenizer_vocab_size(t));
        CHECK_INT_EQ(kiln_tokenizer_eot(r), kiln_tokenizer_eot(t));
        kiln_tokens x = {0}, y = {0};
        CHECK_OK(kiln_tokenizer_encode(t, corpus, strlen(corpus), &x));
        CHECK_OK(kiln_tokenizer_encode(r, corpus, strlen(corpus), &y));
        CHECK_TRUE(same_ids(&x, &y));
        kiln_tokens_free(&x);
        kiln_tokens_free(&y);
    }
    free(a);
    free(b);
    kiln_tokenizer_free(r);
    kiln_tokenizer_free(t);
    kiln_tokenizer_free(u);
    remove(path_b);
}

/* Damage a copy of tok_train_a.kbpe; reseal recomputes the checksum so that the check
 * behind it is reached. */
static void check_damaged(uint8_t *buf, size_t len, int reseal, kiln_status want,
                          const char *says) {
    if (reseal) {
        uint64_t h = XXH64(buf, len - 8, 0);
        for (int i = 0; i < 8; i++)
            buf[len - 8 + i] = (uint8_t)(h >> (8 * i));
    }
    write_whole(path_bad, buf, len);
    kiln_tokenizer *t = NULL;
    CHECK_STATUS(kiln_tokenizer_load(&t, path_bad), want);
    CHECK_TRUE(t == NULL);
    if (!strstr(kiln_error_message(), says)) {
        fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", kiln_error_message(), says);
        CHECK_TRUE(0);
    }
    kiln_tokenizer_free(t);
}

static void test_damaged_files(void) {
    uint8_t *good = NULL, *buf = NULL;
    size_t n = 0;
    if (read_whole(path_a, &good, &n) != 0) {
        CHECK_TRUE(0);
        return;
    }
    buf = malloc(n);
#define FRESH() memcpy(buf, good, n)
    FRESH();
    check_damaged(buf, n - 5, 0, KILN_ERR_FORMAT, "truncated");
    FRESH();
    buf[100] ^= 1;
    check_damaged(buf, n, 0, KILN_ERR_CHECKSUM, "checksum");
    FRESH();
    buf[0] = 'X';
    check_damaged(buf, n, 0, KILN_ERR_FORMAT, "not a kiln tokenizer file");
    FRESH();
    buf[8] = 2;
    check_damaged(buf, n, 1, KILN_ERR_FORMAT, "version 2");
    FRESH();
    buf[24 + 8 * 5] = 0xff; /* merge 5 joins an id that does not exist yet */
    buf[24 + 8 * 5 + 1] = 0x10;
    check_damaged(buf, n, 1, KILN_ERR_FORMAT, "merge 5");
    FRESH();
    memcpy(buf + 24 + 8 * 7, buf + 24 + 8 * 3, 8); /* merge 7 repeats merge 3 */
    check_damaged(buf, n, 1, KILN_ERR_FORMAT, "repeats");
    check_damaged(buf, 0, 0, KILN_ERR_FORMAT, "not a kiln tokenizer file");
#undef FRESH
    kiln_tokenizer *t = NULL;
    char nothing[600];
    test_path(nothing, sizeof nothing, dir, "nothing.kbpe");
    CHECK_STATUS(kiln_tokenizer_load(&t, nothing), KILN_ERR_NOT_FOUND);
    snprintf(nothing, sizeof nothing, "%s/nothing", path_a); /* below a file */
    CHECK_TRUE(kiln_tokenizer_load(&t, nothing) != KILN_OK && t == NULL);
    CHECK_TRUE(strstr(kiln_error_message(), nothing) != NULL);
    CHECK_OK(kiln_tokenizer_load(&t, path_a));
    CHECK_STATUS(kiln_tokenizer_save(t, "/nonexistent-dir/x.kbpe"), KILN_ERR_IO);
    kiln_tokenizer_free(t);
    free(buf);
    free(good);
    remove(path_bad);
    remove(path_a);
}

static void test_small_and_edge_vocabularies(void) {
    kiln_tokenizer *t = train("ab ab ab", 1000);
    if (t) { /* "ab" and " ab" are all there is to learn */
        CHECK_INT_EQ(kiln_tokenizer_vocab_size(t), 257 + 2);
        CHECK_INT_EQ(kiln_tokenizer_eot(t), 258);
        check_against_naive(t, "ab ab abab", 10);
        kiln_tokenizer_free(t);
    }
    t = train("hello", 257);
    if (t) {
        CHECK_INT_EQ(kiln_tokenizer_vocab_size(t), 257);
        check_against_naive(t, "hello", 5);
        kiln_tokenizer_free(t);
    }
    kiln_bpe_trainer *tr = NULL;
    CHECK_OK(kiln_bpe_trainer_init(&tr));
    CHECK_STATUS(kiln_bpe_trainer_finish(tr, 256, &t), KILN_ERR_ARG);
    CHECK_OK(kiln_bpe_trainer_finish(tr, 300, &t)); /* no text: no merges */
    CHECK_INT_EQ(kiln_tokenizer_vocab_size(t), 257);
    kiln_tokenizer_free(t);
    kiln_bpe_trainer_free(tr);
    /* A long run of one byte: long tokens, no blow-up. */
    size_t n = 1 << 17;
    char *run = malloc(n + 1);
    memset(run, 'a', n);
    run[n] = '\0';
    t = train(run, 300);
    if (t) {
        check_against_naive(t, run, 1000);
        kiln_tokenizer_free(t);
    }
    free(run);
}

int main(void) {
    corpus = make_corpus(300000, 1);
    test_tmpdir(dir, sizeof dir, "tokenizer_train");
    test_path(path_a, sizeof path_a, dir, "tok_train_a.kbpe");
    test_path(path_b, sizeof path_b, dir, "tok_train_b.kbpe");
    test_path(path_bad, sizeof path_bad, dir, "tok_train_bad.kbpe");
    size_t before = kiln_alloc_current();
    RUN_TEST(test_train_encodes_by_rank);
    RUN_TEST(test_save_load_and_determinism);
    RUN_TEST(test_damaged_files);
    RUN_TEST(test_small_and_edge_vocabularies);
    CHECK_INT_EQ(kiln_alloc_current(), before);
    free(corpus);
    test_rmtree(dir);
    TEST_MAIN_END();
}
