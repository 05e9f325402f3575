/* Tokenizers: "bytes", GPT-2 (known ids, BPE against a naive tiktoken-style reference,
 * bad input, long lines, threads), and load errors. The whole-corpus comparison with
 * tiktoken itself is in tests/tok. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <omp.h>

#include "kiln/core.h"
#include "kiln/tokenizer.h"
#include "test.h"
#include "tok/tok_internal.h"

static kiln_tokenizer *gpt2;

static void check_roundtrip(const kiln_tokenizer *t, const char *s, size_t n) {
    kiln_tokens ids = {0};
    kiln_bytes back = {0};
    CHECK_OK(kiln_tokenizer_encode(t, s, n, &ids));
    CHECK_OK(kiln_tokenizer_decode(t, ids.ids, ids.len, &back));
    CHECK_INT_EQ(back.len, n);
    CHECK_TRUE(back.len == n && (n == 0 || memcmp(back.data, s, n) == 0));
    kiln_bytes_free(&back);
    kiln_tokens_free(&ids);
}

static void check_ids(const kiln_tokenizer *t, const char *s, const int32_t *want, int64_t n) {
    kiln_tokens ids = {0};
    CHECK_OK(kiln_tokenizer_encode(t, s, strlen(s), &ids));
    CHECK_INT_EQ(ids.len, n);
    int same = ids.len == n;
    for (int64_t i = 0; same && i < n; i++)
        same = ids.ids[i] == want[i];
    if (!same)
        fprintf(stderr, "  ids of \"%s\" differ\n", s);
    CHECK_TRUE(same);
    kiln_tokens_free(&ids);
}

static void test_bytes(void) {
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(&t, "bytes"));
    CHECK_INT_EQ(kiln_tokenizer_vocab_size(t), 256);
    CHECK_INT_EQ(kiln_tokenizer_eot(t), -1);
    CHECK_STR_EQ(kiln_tokenizer_name(t), "bytes");
    const char s[] = "\x00\xff"
                     "ab";
    int32_t want[] = {0, 255, 'a', 'b'};
    kiln_tokens ids = {0};
    CHECK_OK(kiln_tokenizer_encode(t, s, 4, &ids));
    CHECK_INT_EQ(ids.len, 4);
    for (int i = 0; i < 4 && ids.len == 4; i++)
        CHECK_INT_EQ(ids.ids[i], want[i]);
    check_roundtrip(t, s, 4);
    check_roundtrip(t, "", 0);
    int32_t bad = 256;
    kiln_bytes out = {0};
    CHECK_STATUS(kiln_tokenizer_decode(t, &bad, 1, &out), KILN_ERR_RANGE);
    CHECK_TRUE(strstr(kiln_error_message(), "256") != NULL);
    CHECK_STATUS(kiln_tokenizer_save(t, "unused.kbpe"), KILN_ERR_UNSUPPORTED);
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
    kiln_tokenizer_free(NULL);
}

/* Ids from tiktoken 1.0.22, get_encoding("gpt2").encode_ordinary(...). */
static void test_gpt2_known_ids(void) {
    if (!gpt2) {
        TEST_SKIP("GPT-2's files are absent (scripts/setup.sh puts them in deps/gpt2)");
        return;
    }
    CHECK_INT_EQ(kiln_tokenizer_vocab_size(gpt2), 50257);
    CHECK_INT_EQ(kiln_tokenizer_eot(gpt2), 50256);
    CHECK_STR_EQ(kiln_tokenizer_name(gpt2), "gpt2");
    int32_t hello[] = {15496, 995};
    check_ids(gpt2, "Hello world", hello, 2);
    int32_t mixed[] = {15496, 995,  11,   340, 338, 257,  1332, 13,  314, 6,   3069,
                       766,   705,  50,   220, 220, 9029, 220,  220, 220, 198, 1760,
                       17031, 2231, 1279, 91,  437, 1659, 5239, 91,  29};
    check_ids(gpt2, "Hello world, it's a test. I'LL see 'S   spaces   \n done 12345 <|endoftext|>",
              mixed, (int64_t)(sizeof mixed / sizeof mixed[0]));
    const char *b = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tokenizer_token_bytes(gpt2, 50256, &b, &n));
    CHECK_TRUE(n == 13 && !memcmp(b, "<|endoftext|>", 13));
    CHECK_OK(kiln_tokenizer_token_bytes(gpt2, 220, &b, &n));
    CHECK_TRUE(n == 1 && b[0] == ' ');
    CHECK_STATUS(kiln_tokenizer_token_bytes(gpt2, 50257, &b, &n), KILN_ERR_RANGE);
    int32_t eot = 50256;
    kiln_bytes out = {0};
    CHECK_OK(kiln_tokenizer_decode(gpt2, &eot, 1, &out));
    CHECK_TRUE(out.len == 13 && !memcmp(out.data, "<|endoftext|>", 13));
    kiln_bytes_free(&out);
}

/* ---- a naive tiktoken-style BPE: ranks looked up by the bytes of the joined parts ---- */

typedef struct vocab_entry {
    const char *b;
    size_t n;
    int32_t id;
} vocab_entry;
static vocab_entry *sorted;
static int32_t nsorted;

static int entry_cmp(const void *x, const void *y) {
    const vocab_entry *a = x, *b = y;
    size_t m = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->b, b->b, m);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

static int32_t rank_of_bytes(const uint8_t *s, size_t n) {
    vocab_entry key = {(const char *)s, n, 0};
    vocab_entry *e = bsearch(&key, sorted, (size_t)nsorted, sizeof *sorted, entry_cmp);
    return e ? e->id : -1;
}

static void build_sorted(const kiln_tokenizer *t) {
    nsorted = 0;
    sorted = malloc((size_t)kiln_tokenizer_vocab_size(t) * sizeof *sorted);
    for (int32_t id = 0; id < kiln_tokenizer_vocab_size(t); id++) {
        if (id == kiln_tokenizer_eot(t))
            continue;
        kiln_tokenizer_token_bytes(t, id, &sorted[nsorted].b, &sorted[nsorted].n);
        sorted[nsorted++].id = id;
    }
    qsort(sorted, (size_t)nsorted, sizeof *sorted, entry_cmp);
}

/* ids of one piece, as tiktoken computes them; returns the count. */
static int64_t naive_piece(const uint8_t *s, size_t n, int32_t *ids) {
    int32_t whole = rank_of_bytes(s, n);
    if (whole >= 0) {
        ids[0] = whole;
        return 1;
    }
    size_t *start = malloc((n + 1) * sizeof *start);
    size_t parts = n;
    for (size_t i = 0; i <= n; i++)
        start[i] = i;
    for (;;) {
        int32_t best = INT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < parts; i++) {
            int32_t r = rank_of_bytes(s + start[i], start[i + 2] - start[i]);
            if (r >= 0 && r < best) {
                best = r;
                bi = i;
            }
        }
        if (best == INT32_MAX)
            break;
        memmove(start + bi + 1, start + bi + 2, (parts - bi - 1) * sizeof *start);
        parts--;
    }
    for (size_t i = 0; i < parts; i++)
        ids[i] = rank_of_bytes(s + start[i], start[i + 1] - start[i]);
    free(start);
    return (int64_t)parts;
}

static void test_bpe_against_naive(void) {
    if (!gpt2) {
        TEST_SKIP("GPT-2's files are absent (scripts/setup.sh puts them in deps/gpt2)");
        return;
    }
    build_sorted(gpt2);
    tok_encoder e;
    CHECK_OK(kiln__tok_encoder_init(&e, gpt2, 1));
    kiln_rng rng;
    kiln_rng_seed(&rng, 7);
    const char *alpha[] = {
        "aeinrst", " ", "ab", "a", "0123456789", "\xe4\xb8\xad\xe6\x96\x87", ".-=", "\x00\xff\x80"};
    static uint8_t s[3000];
    static int32_t want[3000];
    int bad = 0;
    for (int trial = 0; trial < 1200; trial++) {
        const char *a = alpha[trial % 8];
        size_t na = strlen(a) ? strlen(a) : 1;
        if (trial % 8 == 7)
            na = 3;
        size_t n = 1 + kiln_rng_below(&rng, trial % 10 == 0 ? 700 : 90);
        for (size_t i = 0; i < n; i++)
            s[i] = (uint8_t)a[kiln_rng_below(&rng, na)];
        kiln_tokens got = {0};
        CHECK_OK(kiln__tok_encode_piece(&e, s, n, &got));
        int64_t m = naive_piece(s, n, want);
        int same = got.len == m;
        for (int64_t i = 0; same && i < m; i++)
            same = got.ids[i] == want[i];
        if (!same && bad++ < 3)
            fprintf(stderr, "  piece of %zu bytes from alphabet %d: %lld ids, naive %lld\n", n,
                    trial % 8, (long long)got.len, (long long)m);
        kiln_tokens_free(&got);
    }
    CHECK_INT_EQ(bad, 0);
    kiln__tok_encoder_free(&e);
    free(sorted);
}

static void test_bad_input_roundtrips(void) {
    if (!gpt2) {
        TEST_SKIP("GPT-2's files are absent (scripts/setup.sh puts them in deps/gpt2)");
        return;
    }
    const char *cases[] = {
        "\xff\xfe",
        "abc\xc3",
        "\xc3(",
        "\xed\xa0\x80 lone surrogate \xed\xbf\xbf",
        "\xc0\xaf overlong",
        "\xf4\x90\x80\x80 too high",
        "a\x00b\x00\x00 c",
        "  \xff  x",
        "\xe2\x80",
        "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\xf0\x9f",
        "\n\n\t \r\n",
        "'S 'LL 's 'll",
        "\x7f\x01\x1f",
        "\xef\xbb\xbf BOM",
        "a\xcc\x81\xcc\x81 combining",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_roundtrip(gpt2, cases[i], strlen(cases[i]));
    check_roundtrip(gpt2, "a\0b\0\0 c", 7);
    check_roundtrip(gpt2, "", 0);
    kiln_rng rng;
    kiln_rng_seed(&rng, 11);
    size_t n = 200000;
    char *bin = malloc(n);
    for (size_t i = 0; i < n; i++) /* binary: mostly any byte, sometimes runs */
        bin[i] =
            (char)(kiln_rng_below(&rng, 4) ? (int)kiln_rng_below(&rng, 256) : bin[i ? i - 1 : 0]);
    check_roundtrip(gpt2, bin, n);
    free(bin);
}

/* One line of n bytes (no newline), and single pieces of n bytes: linear time, no blow-up. */
static void test_long_lines(void) {
    if (!gpt2) {
        TEST_SKIP("GPT-2's files are absent (scripts/setup.sh puts them in deps/gpt2)");
        return;
    }
    size_t n = 5u << 20;
    char *s = malloc(n);
    const char words[] = "the quick brown fox jumps over lazy dogs, 12345 times! ";
    for (size_t i = 0; i < n; i++)
        s[i] = words[i % (sizeof words - 1)];
    double t0 = kiln_time_ms();
    check_roundtrip(gpt2, s, n);
    double words_ms = kiln_time_ms() - t0;
    /* Single pieces (a run of one letter, of spaces, of NULs, of invalid UTF-8, of one
     * digit) go through the heap BPE: O(n log n). 1 MiB keeps the test short; the same
     * code was run on 100 MB (see bench/README of the tokenizer numbers). */
    const char fill[] = {'a', ' ', '\0', '\xff', '7'};
    size_t m = 1u << 20;
    for (int k = 0; k < 5; k++) {
        memset(s, fill[k], m);
        t0 = kiln_time_ms();
        kiln_tokens ids = {0};
        kiln_bytes back = {0};
        CHECK_OK(kiln_tokenizer_encode(gpt2, s, m, &ids));
        double ms = kiln_time_ms() - t0;
        CHECK_TRUE(ids.len > 0 && ids.len <= (int64_t)m); /* GPT-2 has no runs of spaces */
        CHECK_OK(kiln_tokenizer_decode(gpt2, ids.ids, ids.len, &back));
        CHECK_TRUE(back.len == m && !memcmp(back.data, s, m));
        fprintf(stderr, "  1 MiB of byte 0x%02x: %lld ids in %.0f ms\n", (unsigned char)fill[k],
                (long long)ids.len, ms);
        CHECK_TRUE(ms < 20000); /* quadratic would take hours */
        kiln_tokens_free(&ids);
        kiln_bytes_free(&back);
    }
    fprintf(stderr, "  5 MiB line of words: %.0f ms\n", words_ms);
    free(s);
}

static void test_threads_agree(void) {
    if (!gpt2) {
        TEST_SKIP("GPT-2's files are absent (scripts/setup.sh puts them in deps/gpt2)");
        return;
    }
    size_t n = 3u << 20;
    char *s = malloc(n);
    kiln_rng rng;
    kiln_rng_seed(&rng, 3);
    const char *w[] = {"The",  " cat", " sat", "\n",    " on", " the",
                       " mat", ".",    "\n\n", " It's", "  ",  " \xc3\xa9t\xc3\xa9",
                       " 42",  "x"};
    size_t at = 0;
    while (at < n) {
        const char *p = w[kiln_rng_below(&rng, 14)];
        size_t l = strlen(p);
        if (at + l > n)
            l = n - at;
        memcpy(s + at, p, l);
        at += l;
    }
    kiln_tokens one = {0}, par = {0};
    CHECK_OK(kiln_tokenizer_encode(gpt2, s, n, &one));
    int threads = omp_get_max_threads();
    omp_set_num_threads(threads < 2 ? 2 : threads);
    CHECK_OK(kiln_tokenizer_encode_parallel(gpt2, s, n, &par));
    CHECK_INT_EQ(par.len, one.len);
    CHECK_TRUE(par.len == one.len && !memcmp(par.ids, one.ids, (size_t)one.len * 4));
    /* The same text as 97 documents. */
    const char *texts[97];
    size_t lens[97];
    kiln_tokens outs[97];
    memset(outs, 0, sizeof outs);
    size_t cut = 0;
    for (int i = 0; i < 97; i++) {
        size_t next =
            i == 96 ? n : kiln__tok_pretok_safe_cut((const uint8_t *)s, n, (n / 97) * (i + 1));
        texts[i] = s + cut;
        lens[i] = next - cut;
        cut = next;
    }
    CHECK_OK(kiln_tokenizer_encode_many(gpt2, texts, lens, 97, outs));
    int same = 1; /* each document as if encoded alone */
    for (int i = 0; i < 97; i++) {
        kiln_tokens alone = {0};
        CHECK_OK(kiln_tokenizer_encode(gpt2, texts[i], lens[i], &alone));
        same &= alone.len == outs[i].len &&
                !memcmp(alone.ids, outs[i].ids, (size_t)alone.len * sizeof(int32_t));
        kiln_tokens_free(&alone);
        kiln_tokens_free(&outs[i]);
    }
    CHECK_TRUE(same);
    kiln_tokens_free(&one);
    kiln_tokens_free(&par);
    free(s);
}

static char dir[256];

static void write_file(const char *name, const char *text) {
    char p[512];
    test_path(p, sizeof p, dir, name);
    CHECK_INT_EQ(test_write_file(p, text, strlen(text)), 0);
}

static void test_load_errors(void) {
    kiln_tokenizer *t = NULL;
    CHECK_STATUS(kiln_tokenizer_load(&t, "no-such-tokenizer"), KILN_ERR_NOT_FOUND);
    CHECK_TRUE(strstr(kiln_error_message(), "gpt2") != NULL);
    CHECK_STATUS(kiln_tokenizer_load(&t, NULL), KILN_ERR_ARG);
    CHECK_TRUE(t == NULL);

    /* The library does not search for GPT-2's files: "gpt2" alone names no folder. */
    CHECK_STATUS(kiln_tokenizer_load(&t, "gpt2"), KILN_ERR_NOT_FOUND);
    CHECK_TRUE(strstr(kiln_error_message(), "encoder.json and vocab.bpe") != NULL);
    CHECK_TRUE(t == NULL);

    /* A folder with GPT-2-format files that are wrong. */
    test_tmpdir(dir, sizeof dir, "tok_bad_gpt2");
    write_file("encoder.json", "[1, 2, 3]");
    write_file("vocab.bpe", "#version: 0.2\n");
    CHECK_STATUS(kiln_tokenizer_load(&t, dir), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "encoder.json") != NULL);
    write_file("encoder.json", "{\"a\": 0, \"b\": 0}");
    CHECK_STATUS(kiln_tokenizer_load(&t, dir), KILN_ERR_FORMAT);
    CHECK_TRUE(t == NULL);
    test_rmtree(dir);
}

static void test_arguments(void) {
    kiln_tokens ids = {0};
    CHECK_STATUS(kiln_tokenizer_encode(NULL, "a", 1, &ids), KILN_ERR_ARG);
    if (gpt2) {
        CHECK_STATUS(kiln_tokenizer_encode(gpt2, NULL, 1, &ids), KILN_ERR_ARG);
        CHECK_OK(kiln_tokenizer_encode(gpt2, NULL, 0, &ids));
        CHECK_INT_EQ(ids.len, 0);
        int32_t neg = -1;
        kiln_bytes out = {0};
        CHECK_STATUS(kiln_tokenizer_decode(gpt2, &neg, 1, &out), KILN_ERR_RANGE);
        CHECK_OK(kiln_tokenizer_encode_many(gpt2, NULL, NULL, 0, NULL));
    } else {
        TEST_SKIP("the GPT-2 part: GPT-2's files are absent");
    }
    kiln_tokens_free(&ids);
    kiln_tokens_free(NULL);
    kiln_bytes_free(NULL);
}

int main(void) {
    size_t before = kiln_alloc_current();
    if (test_tokenizer_load(&gpt2, "gpt2") != KILN_OK) {
        fprintf(stderr, "no GPT-2 tokenizer (%s): its tests will skip\n", kiln_error_message());
        gpt2 = NULL;
    }
    RUN_TEST(test_bytes);
    RUN_TEST(test_gpt2_known_ids);
    RUN_TEST(test_bpe_against_naive);
    RUN_TEST(test_bad_input_roundtrips);
    RUN_TEST(test_long_lines);
    RUN_TEST(test_threads_agree);
    RUN_TEST(test_load_errors);
    RUN_TEST(test_arguments);
    kiln_tokenizer_free(gpt2);
    CHECK_INT_EQ(kiln_alloc_current(), before); /* every buffer given back */
    TEST_MAIN_END();
}
