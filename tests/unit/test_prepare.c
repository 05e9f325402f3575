/* kiln prepare: the Brown corpus text, safe cuts, the split, sharding, determinism across
 * thread counts, and bad input (empty, binary, invalid UTF-8, malformed JSON Lines). */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "kiln/core.h"
#include "kiln/loader.h"
#include "kiln/prepare.h"
#include "kiln/shard.h"
#include "kiln/tokenizer.h"
#include "prep/prepare_internal.h"
#include "test.h"

static char dir[256];
static int have_gpt2;

static void path_in(char *out, size_t n, const char *name) {
    test_path(out, n, dir, name);
}

static void put_file(const char *name, const char *data, size_t n) {
    char p[512];
    path_in(p, sizeof p, name);
    CHECK_INT_EQ(test_write_file(p, data, n), 0);
}

static void put_text(const char *name, const char *s) {
    put_file(name, s, strlen(s));
}

static int exists(const char *name) {
    char p[512];
    struct stat sb;
    path_in(p, sizeof p, name);
    return stat(p, &sb) == 0;
}

/* All ids of <out>/<split>_*.bin in order; returns the count (-1 on error). */
static int64_t read_split(const char *out, const char *split, int32_t **ids) {
    *ids = NULL;
    int64_t n = 0;
    for (int i = 0;; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s/%s_%03d.bin", dir, out, split, i);
        kiln_shard *s = NULL;
        if (access(p, F_OK) != 0)
            break;
        if (kiln_shard_open(&s, p) != KILN_OK)
            return -1;
        int64_t k = kiln_shard_get_info(s)->num_tokens;
        *ids = realloc(*ids, (size_t)(n + k + 1) * sizeof **ids);
        kiln_shard_read(s, 0, k, *ids + n);
        n += k;
        kiln_shard_close(s);
    }
    return n;
}

/* The split of include/kiln/prepare.h, computed here: document i (non-empty documents,
 * from 0) is in val when XXH3_64bits_withSeed(i as 8 little-endian bytes, seed) is below
 * val_fraction * 2^64; when no document is, the one of smallest hash is; when all are, the
 * one of largest hash is not. is_val[i] gets the answer; returns the val count. */
static int64_t expected_split(uint64_t seed, double val_fraction, int64_t docs, char *is_val) {
    uint64_t threshold = (uint64_t)(val_fraction * 18446744073709551616.0);
    int64_t nval = 0, lo = 0, hi = 0;
    uint64_t lo_h = UINT64_MAX, hi_h = 0;
    for (int64_t i = 0; i < docs; i++) {
        unsigned char le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (unsigned char)((uint64_t)i >> (8 * b));
        uint64_t h = XXH3_64bits_withSeed(le, sizeof le, seed);
        is_val[i] = h < threshold;
        nval += is_val[i];
        if (h <= lo_h)
            lo_h = h, lo = i;
        if (h >= hi_h)
            hi_h = h, hi = i;
    }
    if (nval == 0 && docs > 1)
        is_val[lo] = 1, nval = 1;
    else if (nval == docs && docs > 1)
        is_val[hi] = 0, nval--;
    return nval;
}

/* Shards of a split of n ids (include/kiln/prepare.h): S each but the last, which holds more
 * than R = min(S / 8, 2^20) and at most S + R. Returns the count; *last the last's size. */
static int expected_shards(int64_t n, int64_t S, int64_t *last) {
    int64_t R = S / 8 < (1 << 20) ? S / 8 : (1 << 20);
    int64_t k = n <= S + R ? 1 : (n - R + S - 1) / S;
    *last = n - (k - 1) * S;
    return (int)k;
}

static kiln_status prepare(const char *tokenizer, const char *out, const char **inputs, int n,
                           double val, uint64_t seed, int64_t shard_tokens, int threads,
                           kiln_prepare_binary binary, kiln_prepare_summary *sum) {
    char o[512];
    path_in(o, sizeof o, out);
    char in[8][512];
    const char *ins[8];
    for (int i = 0; i < n; i++) {
        path_in(in[i], sizeof in[i], inputs[i]);
        ins[i] = in[i];
    }
    kiln_tokenizer *tok = NULL;
    if (tokenizer) {
        kiln_status ts = test_tokenizer_load(&tok, tokenizer);
        if (ts != KILN_OK)
            return ts;
    }
    kiln_prepare_config c;
    kiln_prepare_config_default(&c);
    c.tokenizer = tok;
    c.out_dir = o;
    c.inputs = ins;
    c.num_inputs = n;
    c.val_fraction = val;
    c.seed = seed;
    c.shard_tokens = shard_tokens;
    c.threads = threads;
    c.binary = binary;
    kiln_status st = kiln_prepare(&c, sum);
    kiln_tokenizer_free(tok);
    return st;
}

static void test_brown_text(void) {
    const char *tagged =
        "\n\n\tThe/at jury/nn said/vbd ,/, ``/`` it/pps ''/'' ./.\n"
        "Mr./np Jones/np (/( 1/2/cd )/) left/vbd ;/. ;/. he/pps came/vbd from/in Washington/np "
        "D.C./np ./.\n\n\n"
        "Big/jj-hl News/nn-hl\n"
        "\tHe/pps said/vbd '/' so/rb '/' to/in her/ppo ?/.\n";
    char *out;
    size_t len;
    CHECK_OK(kiln_prepare_brown_text(tagged, strlen(tagged), &out, &len));
    const char *want = "The jury said, \"it\". Mr. Jones (1/2) left; he came from Washington D.C.\n"
                       "\nBig News\n\nHe said 'so' to her?\n";
    CHECK_STR_EQ(out, want);
    CHECK_INT_EQ(len, strlen(want));
    free(out);
    CHECK_OK(kiln_prepare_brown_text("", 0, &out, &len));
    CHECK_INT_EQ(len, 0);
    free(out);
}

/* encode(text) == encode(text[0..i)) ++ encode(text[i..)) at every safe cut i. */
static int cuts_keep_ids(const kiln_tokenizer *t, const char *text, size_t len, int *ncuts) {
    kiln_tokens whole = {0}, part = {0};
    int ok = kiln_tokenizer_encode(t, text, len, &whole) == KILN_OK;
    for (size_t i = 1; ok && i < len; i++) {
        if (!kiln__prep_is_safe_cut(text, len, i))
            continue;
        (*ncuts)++;
        part.len = 0;
        ok = kiln_tokenizer_encode(t, text, i, &part) == KILN_OK &&
             kiln_tokenizer_encode(t, text + i, len - i, &part) == KILN_OK;
        ok = ok && part.len == whole.len &&
             memcmp(part.ids, whole.ids, (size_t)whole.len * sizeof *whole.ids) == 0;
        if (!ok)
            fprintf(stderr, "cut at %zu of \"%.*s\" changes the ids\n", i, (int)len, text);
    }
    kiln_tokens_free(&whole);
    kiln_tokens_free(&part);
    return ok;
}

static void test_safe_cuts(void) {
    const char *s = "ab cd";
    CHECK_TRUE(kiln__prep_is_safe_cut(s, 5, 2));
    CHECK_TRUE(!kiln__prep_is_safe_cut(s, 5, 3));
    CHECK_TRUE(!kiln__prep_is_safe_cut("a  b", 4, 2)); /* after a space */
    CHECK_TRUE(kiln__prep_is_safe_cut("a\nb", 3, 2));
    CHECK_TRUE(!kiln__prep_is_safe_cut("a\n\nb", 4, 3)); /* a run of newlines */
    CHECK_INT_EQ(kiln__prep_next_cut("abcdef", 6, 0), 6);
    if (!have_gpt2) {
        TEST_SKIP("the GPT-2 part of test_safe_cuts: deps/gpt2 is absent");
        return;
    }
    kiln_tokenizer *t = NULL;
    CHECK_OK(test_tokenizer_load(&t, "gpt2"));
    if (!t)
        return;
    /* Random strings over characters that stress the pre-tokeniser's rules. */
    static const char *alphabet[] = {" ",
                                     " ",
                                     "  ",
                                     "\n",
                                     "\n\n",
                                     "\t",
                                     "\r\n",
                                     "a",
                                     "Zq",
                                     "x",
                                     "7",
                                     "42",
                                     ".",
                                     ",",
                                     "!?",
                                     "'",
                                     "'s",
                                     "'ll",
                                     "-",
                                     "\xc3\xa9",
                                     "\xc2\xa0",
                                     "\xe3\x80\x80",
                                     "\xf0\x9f\x99\x82",
                                     "\xe2\x80\x99",
                                     "\xff",
                                     "<|endoftext|>"};
    kiln_rng r;
    kiln_rng_seed(&r, 11);
    int ok = 1, ncuts = 0;
    char buf[400];
    for (int trial = 0; trial < 300 && ok; trial++) {
        size_t len = 0;
        while (len < 200) {
            const char *a = alphabet[kiln_rng_below(&r, sizeof alphabet / sizeof *alphabet)];
            memcpy(buf + len, a, strlen(a));
            len += strlen(a);
        }
        ok = cuts_keep_ids(t, buf, len, &ncuts);
    }
    CHECK_TRUE(ok);
    CHECK_TRUE(ncuts > 1000);
    const char *shakespeare = test_shared_data("tinyshakespeare.txt");
    size_t n = 0;
    char *text = shakespeare ? test_slurp(shakespeare, &n) : NULL;
    if (text) {
        CHECK_TRUE(cuts_keep_ids(t, text, n < 3000 ? n : 3000, &ncuts));
        free(text);
    } else {
        TEST_SKIP("tinyshakespeare in test_safe_cuts: ../shared/data/tinyshakespeare.txt is "
                  "absent (or set KILN_SHARED_DATA)");
    }
    kiln_tokenizer_free(t);
}

/* Document i of test_folder_split_and_shards into text; its length. */
static int folder_doc(int i, char *text, size_t cap) {
    int n = snprintf(text, cap, "document %d says", i);
    for (int k = 0; k < 20 + i * 7; k++)
        n += snprintf(text + n, cap - (size_t)n, " word%d", k % 13);
    return n;
}

/* Bytes tokenizer: ids are bytes, so the shards spell out the documents. The split, the
 * token counts and the shard sizes are those the rules of kiln/prepare.h give, computed
 * here. */
static void test_folder_split_and_shards(void) {
    char name[64], text[4096], p[512];
    path_in(p, sizeof p, "docs");
    mkdir(p, 0755);
    path_in(p, sizeof p, "docs/sub");
    mkdir(p, 0755);
    int64_t total = 0;
    for (int i = 0; i < 40; i++) {
        int n = folder_doc(i, text, sizeof text);
        snprintf(name, sizeof name, i % 4 ? "docs/d%02d.txt" : "docs/sub/d%02d.md", i);
        put_text(name, text);
        total += n;
    }
    put_text("docs/empty.txt", "");
    put_text("docs/.hidden", "never read");
    /* Input order: names sorted, so docs/d01.txt .. d39.txt (i % 4 != 0), then docs/sub
     * (i % 4 == 0); empty.txt is no document. order[k] is the i of document index k. */
    int order[40], k = 0;
    for (int i = 0; i < 40; i++)
        if (i % 4)
            order[k++] = i;
    for (int i = 0; i < 40; i += 4)
        order[k++] = i;
    char is_val[40];
    int64_t want_val = expected_split(5, 0.25, 40, is_val), want_val_tokens = 0;
    char val_of[40]; /* by document number i */
    for (k = 0; k < 40; k++) {
        val_of[order[k]] = is_val[k];
        if (is_val[k])
            want_val_tokens += folder_doc(order[k], text, sizeof text);
    }
    const char *in[] = {"docs"};
    kiln_prepare_summary s;
    CHECK_OK(prepare("bytes", "out_a", in, 1, 0.25, 5, 1000, 2, 0, &s));
    CHECK_INT_EQ(s.documents, 40);
    CHECK_INT_EQ(s.empty_skipped, 1);
    CHECK_INT_EQ(s.val_documents, want_val);
    CHECK_INT_EQ(s.train_documents, 40 - want_val);
    CHECK_INT_EQ(s.val_tokens, want_val_tokens);
    CHECK_INT_EQ(s.train_tokens, total - want_val_tokens); /* no <|endoftext|> in "bytes" */
    CHECK_INT_EQ(s.bytes, total);
    CHECK_INT_EQ(s.vocab_size, 256);
    int64_t last_train = 0, last_val = 0;
    CHECK_INT_EQ(s.train_shards, expected_shards(total - want_val_tokens, 1000, &last_train));
    CHECK_INT_EQ(s.val_shards, expected_shards(want_val_tokens, 1000, &last_val));
    CHECK_TRUE(s.train_shards >= 2); /* the case of several shards is exercised */
    int32_t *tr = NULL, *va = NULL;
    CHECK_INT_EQ(read_split("out_a", "train", &tr), s.train_tokens);
    CHECK_INT_EQ(read_split("out_a", "val", &va), s.val_tokens);
    for (int sp = 0; sp < 2; sp++)
        for (int i = 0; i < (sp ? s.val_shards : s.train_shards); i++) {
            kiln_shard_info info;
            snprintf(name, sizeof name, "out_a/%s_%03d.bin", sp ? "val" : "train", i);
            path_in(p, sizeof p, name);
            CHECK_OK(kiln_shard_read_info(p, &info));
            int last = i + 1 == (sp ? s.val_shards : s.train_shards);
            CHECK_INT_EQ(info.num_tokens, !last ? 1000 : sp ? last_val : last_train);
        }
    /* Every document appears whole, once, in the split the rule puts it in. */
    int ok = 1;
    for (int i = 0; i < 40 && tr && va; i++) {
        int n = folder_doc(i, text, sizeof text);
        int found[2] = {0, 0};
        for (int sp = 0; sp < 2; sp++) {
            const int32_t *ids = sp ? va : tr;
            int64_t m = sp ? s.val_tokens : s.train_tokens;
            for (int64_t a = 0; a + n <= m; a++) {
                int64_t j = 0;
                while (j < n && ids[a + j] == (unsigned char)text[j])
                    j++;
                found[sp] += j == n && (a + n == m || ids[a + n] == 'd');
            }
        }
        if (found[(int)val_of[i]] != 1 || found[!val_of[i]] != 0) {
            fprintf(stderr, "  document %d: %d times in train, %d in val; wanted in %s\n", i,
                    found[0], found[1], val_of[i] ? "val" : "train");
            ok = 0;
        }
    }
    CHECK_TRUE(ok);
    free(tr);
    free(va);
    CHECK_TRUE(exists("out_a/prepare.json"));
    /* No staging folder (".prepare.tmp.*") or temporary is left behind. */
    path_in(p, sizeof p, "out_a");
    DIR *d = opendir(p);
    int left = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        left += strstr(e->d_name, ".tmp") != NULL;
    if (d)
        closedir(d);
    CHECK_TRUE(d != NULL);
    CHECK_INT_EQ(left, 0);
    /* The loader reads the result. */
    char pat[600];
    snprintf(pat, sizeof pat, "%s/out_a/train_*.bin", dir);
    kiln_loader_config lc = {pat, 2, 64, 0, 1, 1, 1};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&l, &lc));
    if (l)
        CHECK_INT_EQ(kiln_loader_vocab_size(l), 256);
    kiln_loader_close(l);

    /* Again with no val: the earlier val shards and surplus train shards go. */
    CHECK_OK(prepare("bytes", "out_a", in, 1, 0, 5, 100000, 1, 0, &s));
    CHECK_INT_EQ(s.val_shards, 0);
    CHECK_INT_EQ(s.train_shards, 1);
    CHECK_TRUE(!exists("out_a/val_000.bin") && !exists("out_a/train_001.bin"));
    CHECK_INT_EQ(s.train_tokens, total);
}

static int same_file(const char *a, const char *b) {
    char pa[600], pb[600];
    path_in(pa, sizeof pa, a);
    path_in(pb, sizeof pb, b);
    size_t na = 0, nb = 0;
    char *da = test_slurp(pa, &na), *db = test_slurp(pb, &nb);
    int same = da && db && na == nb && memcmp(da, db, na) == 0;
    free(da);
    free(db);
    return same;
}

/* One long document (cut into many segments) and many small ones: the same files for one
 * thread and two; the gpt2 ids of the long one equal one encode call's. */
static void test_deterministic_across_threads(void) {
    const char *tok = have_gpt2 ? "gpt2" : "bytes";
    if (!have_gpt2)
        TEST_SKIP("the GPT-2 part of test_deterministic_across_threads (bytes instead): "
                  "deps/gpt2 is absent");
    size_t n = 3u << 20;
    char *big = malloc(n);
    kiln_rng r;
    kiln_rng_seed(&r, 3);
    static const char *words[] = {"the ",  "cat ",    "sat\n", "on ",   "a ",
                                  "mat, ", "and\n\n", "it's ", "1999 ", "\xc3\xa9t\xc3\xa9 ",
                                  "  ",    "O'Neil "};
    size_t len = 0;
    while (len + 16 < n) {
        const char *w = words[kiln_rng_below(&r, sizeof words / sizeof *words)];
        memcpy(big + len, w, strlen(w));
        len += strlen(w);
    }
    put_file("long.txt", big, len);
    char jl[64 * 1024];
    size_t m = 0;
    for (int i = 0; i < 300; i++)
        m += (size_t)snprintf(jl + m, sizeof jl - m,
                              "{\"text\": \"line %d of many\\n\", \"id\": %d}\n", i, i);
    put_file("many.jsonl", jl, m);
    const char *in[] = {"long.txt", "many.jsonl"};
    kiln_prepare_summary s1, s2, s3;
    CHECK_OK(prepare(tok, "det1", in, 2, 0.1, 9, 400000, 1, 0, &s1));
    CHECK_OK(prepare(tok, "det2", in, 2, 0.1, 9, 400000, 2, 0, &s2));
    CHECK_OK(prepare(tok, "det3", in, 2, 0.1, 10, 400000, 2, 0, &s3));
    CHECK_INT_EQ(s1.documents, 301);
    char is_val[301];
    CHECK_INT_EQ(s1.val_documents, expected_split(9, 0.1, 301, is_val));
    CHECK_INT_EQ(s3.val_documents, expected_split(10, 0.1, 301, is_val));
    CHECK_INT_EQ(s1.train_shards, s2.train_shards);
    for (int i = 0; i < s1.train_shards; i++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "det1/train_%03d.bin", i);
        snprintf(b, sizeof b, "det2/train_%03d.bin", i);
        CHECK_TRUE(same_file(a, b));
    }
    CHECK_TRUE(same_file("det1/val_000.bin", "det2/val_000.bin"));
    CHECK_TRUE(s3.val_documents != s1.val_documents ||
               !same_file("det1/val_000.bin", "det3/val_000.bin"));
    if (have_gpt2) {
        /* The long document is document 0; find its ids in train or val. */
        kiln_tokenizer *t = NULL;
        CHECK_OK(test_tokenizer_load(&t, "gpt2"));
        kiln_tokens want = {0};
        CHECK_OK(kiln_tokenizer_encode(t, big, len, &want));
        int32_t *tr = NULL, *va = NULL;
        int64_t ntr = read_split("det1", "train", &tr), nva = read_split("det1", "val", &va);
        int found = 0;
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids = sp ? va : tr;
            int64_t k = sp ? nva : ntr;
            found |= k > want.len && ids[0] == 50256 &&
                     memcmp(ids + 1, want.ids, (size_t)want.len * 4) == 0 &&
                     (k == want.len + 1 || ids[want.len + 1] == 50256);
        }
        CHECK_TRUE(found);
        free(tr);
        free(va);
        kiln_tokens_free(&want);
        kiln_tokenizer_free(t);
    }
    free(big);
}

/* A single document: head to train, tail to val, nothing lost. The cut is the first place
 * at or after byte (1 - 0.2) n where cutting keeps the ids (prep/prepare_internal.h): before
 * a space that follows a printable ASCII character, or after a newline between two. */
static void test_single_document(void) {
    char text[5000];
    size_t n = 0;
    for (int i = 0; n < 4000; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "Sentence number %d goes here.\n", i);
    put_file("single.txt", text, n);
    const char *in[] = {"single.txt"};
    kiln_prepare_summary s;
    CHECK_OK(prepare("bytes", "single", in, 1, 0.2, 1, 1 << 20, 2, 0, &s));
    CHECK_TRUE(s.split_single_document);
    CHECK_INT_EQ(s.train_documents, 1);
    CHECK_INT_EQ(s.val_documents, 1);
    CHECK_INT_EQ(s.train_tokens + s.val_tokens, (int64_t)n);
    size_t cut = (size_t)(0.8 * (double)n);
    while (cut < n && !(text[cut] == ' ' && cut > 0 && isgraph((unsigned char)text[cut - 1])) &&
           !(cut >= 2 && text[cut - 1] == '\n' && isgraph((unsigned char)text[cut - 2]) &&
             isgraph((unsigned char)text[cut])))
        cut++;
    /* By hand: 133 lines (10 of 29 bytes, 90 of 30, 33 of 31), n = 4013; 0.8 n = 3210 is the
     * 't' of "Sentence" on line 107 (from 3207), and the first cut is the space after it. */
    CHECK_INT_EQ(n, 4013);
    CHECK_INT_EQ(cut, 3215);
    CHECK_INT_EQ(s.val_tokens, (int64_t)(n - cut));
    int32_t *tr = NULL, *va = NULL;
    read_split("single", "train", &tr);
    read_split("single", "val", &va);
    int ok = tr && va;
    for (int64_t i = 0; ok && i < s.train_tokens; i++)
        ok = tr[i] == (unsigned char)text[i];
    for (int64_t i = 0; ok && i < s.val_tokens; i++)
        ok = va[i] == (unsigned char)text[s.train_tokens + i];
    CHECK_TRUE(ok);
    free(tr);
    free(va);
    if (!have_gpt2) {
        TEST_SKIP("the GPT-2 part of test_single_document: deps/gpt2 is absent");
    } else {
        CHECK_OK(prepare("gpt2", "single2", in, 1, 0.2, 1, 1 << 20, 2, 0, &s));
        read_split("single2", "train", &tr);
        read_split("single2", "val", &va);
        CHECK_TRUE(tr && va && tr[0] == 50256 && va[0] == 50256);
        free(tr);
        free(va);
    }
}

static void test_bad_input(void) {
    kiln_prepare_summary s;
    put_text("e1.txt", "");
    put_text("e2.txt", "");
    const char *empties[] = {"e1.txt", "e2.txt"};
    CHECK_STATUS(prepare("bytes", "bad", empties, 2, 0.1, 1, 1000, 1, 0, &s), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "no text") != NULL);
    CHECK_TRUE(!exists("bad/prepare.json"));

    put_file("bin.dat", "GIF89a\0\0\1\2text", 15);
    put_text("ok.txt", "fine text here\n");
    const char *with_bin[] = {"ok.txt", "bin.dat"};
    CHECK_STATUS(prepare("bytes", "bad", with_bin, 2, 0.1, 1, 1000, 1, 0, &s), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "bin.dat looks binary (a NUL byte at offset 6)") !=
               NULL);
    CHECK_OK(prepare("bytes", "bad", with_bin, 2, 0.1, 1, 1000, 1, KILN_PREPARE_BINARY_SKIP, &s));
    CHECK_INT_EQ(s.documents, 1);
    CHECK_INT_EQ(s.binary_files, 1);
    CHECK_OK(prepare("bytes", "bad", with_bin, 2, 0.1, 1, 1000, 1, KILN_PREPARE_BINARY_ENCODE, &s));
    CHECK_INT_EQ(s.documents, 2);
    CHECK_INT_EQ(s.train_tokens + s.val_tokens, 15 + 15);

    put_text("bad_utf8.txt", "caf\xc3 au lait \xff\xfe and \xed\xa0\x80 too\n");
    put_text("good_utf8.txt", "caf\xc3\xa9 \xe2\x82\xac\n");
    const char *utf[] = {"bad_utf8.txt", "good_utf8.txt"};
    if (!have_gpt2)
        TEST_SKIP("invalid UTF-8 through GPT-2 (bytes instead): deps/gpt2 is absent");
    CHECK_OK(prepare(have_gpt2 ? "gpt2" : "bytes", "bad", utf, 2, 0.1, 1, 1000, 1, 0, &s));
    CHECK_INT_EQ(s.invalid_utf8, 1);
    CHECK_INT_EQ(s.documents, 2);

    const char *malformed[][2] = {
        {"{\"text\": \"a\"}\n\n{\"text\": \"b\"\n", "m.jsonl:3: not valid JSON"},
        {"{\"text\": \"a\"}\n[1, 2]\n", "m.jsonl:2: not a JSON object"},
        {"{\"body\": \"a\"}\n", "m.jsonl:1: the object has no \"text\" field"},
        {"{\"text\": 5}\n", "m.jsonl:1: \"text\" is not a string"},
        {"{\"text\": \"a\"} trailing\n", "m.jsonl:1: not valid JSON"},
    };
    const char *jin[] = {"m.jsonl"};
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
        put_text("m.jsonl", malformed[i][0]);
        CHECK_STATUS(prepare("bytes", "badj", jin, 1, 0.1, 1, 1000, 1, 0, &s), KILN_ERR_FORMAT);
        if (!strstr(kiln_error_message(), malformed[i][1])) {
            fprintf(stderr, "message \"%s\" lacks \"%s\"\n", kiln_error_message(), malformed[i][1]);
            CHECK_TRUE(0);
        }
    }
    CHECK_TRUE(!exists("badj")); /* found before anything was written */
    put_text("m.jsonl", "{\"text\": \"\"}\n  \n{\"text\": \"x\\u00e9y\"}\r\n{\"text\": \"z\"}");
    CHECK_OK(prepare("bytes", "goodj", jin, 1, 0.5, 1, 1000, 1, 0, &s));
    CHECK_INT_EQ(s.documents, 2);
    CHECK_INT_EQ(s.empty_skipped, 1);
    CHECK_INT_EQ(s.train_tokens + s.val_tokens, 5);
    CHECK_INT_EQ(s.train_documents, 1);
    CHECK_INT_EQ(s.val_documents, 1);

    const char *missing[] = {"no_such_file.txt"};
    CHECK_STATUS(prepare("bytes", "badm", missing, 1, 0.1, 1, 1000, 1, 0, &s), KILN_ERR_NOT_FOUND);
    const char *ok1[] = {"ok.txt"};
    CHECK_STATUS(prepare("bytes", "badm", ok1, 1, 1.0, 1, 1000, 1, 0, &s), KILN_ERR_ARG);
    CHECK_STATUS(prepare(NULL, "badm", ok1, 1, 0.1, 1, 1000, 1, 0, &s), KILN_ERR_ARG);
}

/* The Brown corpus from deps/, when scripts/setup.sh has installed it. */
static void test_brown_corpus(void) {
    const char *corpus = test_brown_dir();
    if (!corpus) {
        TEST_SKIP("the Brown corpus is not installed (scripts/setup.sh installs it)");
        return;
    }
    kiln_tokenizer *bytes = NULL;
    CHECK_OK(kiln_tokenizer_load(&bytes, "bytes"));
    kiln_prepare_config c;
    kiln_prepare_config_default(&c);
    char out[512];
    path_in(out, sizeof out, "brown");
    c.tokenizer = bytes;
    c.out_dir = out;
    c.corpus_dir = corpus;
    kiln_prepare_summary s;
    CHECK_OK(kiln_prepare(&c, &s));
    kiln_tokenizer_free(bytes);
    CHECK_INT_EQ(s.documents, 500);
    /* The split of the default seed and fraction (1337, 0.1), and the bytes of the text of
     * each file (ca01..cr09 in name order) as kiln_prepare_brown_text gives it, summed here. */
    char is_val[500];
    CHECK_INT_EQ(s.val_documents, expected_split(1337, 0.1, 500, is_val));
    CHECK_INT_EQ(s.val_documents, 57); /* the count once computed, for the record */
    int64_t text_bytes = 0, val_bytes = 0;
    int i = 0;
    for (char part = 'a'; part <= 'r'; part++)
        for (int d = 0; d < 100; d++) {
            char name[8], p[4200];
            snprintf(name, sizeof name, "c%c%02d", part, d);
            test_path(p, sizeof p, corpus, name);
            size_t n = 0, len = 0;
            char *raw = test_slurp(p, &n), *txt = NULL;
            if (!raw)
                continue;
            CHECK_OK(kiln_prepare_brown_text(raw, n, &txt, &len));
            text_bytes += (int64_t)len;
            val_bytes += i < 500 && is_val[i] ? (int64_t)len : 0;
            i++;
            free(raw);
            free(txt);
        }
    CHECK_INT_EQ(i, 500);
    CHECK_INT_EQ(s.bytes, text_bytes);
    CHECK_INT_EQ(s.bytes, 5978887);        /* the sum once computed, for the record */
    CHECK_INT_EQ(s.val_tokens, val_bytes); /* bytes: one id per byte, no <|endoftext|> */
    CHECK_INT_EQ(s.train_tokens, text_bytes - val_bytes);
}

/* Run the kiln command with args in dir; its exit status, and its stdout+stderr in out. */
static int run_kiln(const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' prepare %s 2>&1", dir, getenv("KILN_BIN"), args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, cap - 1, p) : 0;
    out[n] = '\0';
    int status = p ? pclose(p) : -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The command: exit statuses, the summary, the default output folder, messages. */
static void test_command(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        TEST_SKIP("test_command: KILN_BIN is not set to the kiln command (CTest sets it)");
        return;
    }
    char out[8192];
    put_text("cli.txt", "Some text for the command line.\n");
    CHECK_INT_EQ(run_kiln("--tokenizer bytes cli.txt", out, sizeof out), 0);
    CHECK_TRUE(strstr(out, "prepared data/cli: 1 document, 32 tokens") != NULL);
    CHECK_TRUE(exists("data/cli/train_000.bin") && exists("data/cli/val_000.bin"));
    put_text("cli.jsonl", "{\"text\": \"a\"}\n{\"text\": 1}\n");
    CHECK_INT_EQ(run_kiln("--tokenizer bytes --out o2 cli.jsonl", out, sizeof out), 1);
    CHECK_TRUE(strstr(out, "cli.jsonl:2: \"text\" is not a string") != NULL);
    CHECK_INT_EQ(run_kiln("--binary maybe cli.txt", out, sizeof out), 2);
    CHECK_INT_EQ(run_kiln("--val-fraction 1 cli.txt", out, sizeof out), 2); /* a usage error */
    CHECK_TRUE(strstr(out, "kiln prepare: --val-fraction 1: must be in [0, 1)") != NULL);
    CHECK_INT_EQ(run_kiln("--help", out, sizeof out), 0);
    CHECK_TRUE(strstr(out, "--val-fraction") != NULL);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "test_prepare");
    kiln_tokenizer *t = NULL;
    have_gpt2 = test_tokenizer_load(&t, "gpt2") == KILN_OK;
    kiln_tokenizer_free(t);
    if (!have_gpt2)
        fprintf(stderr, "GPT-2 tokenizer files not found (%s): GPT-2 checks will skip\n",
                kiln_error_message());
    RUN_TEST(test_brown_text);
    RUN_TEST(test_safe_cuts);
    RUN_TEST(test_folder_split_and_shards);
    RUN_TEST(test_deterministic_across_threads);
    RUN_TEST(test_single_document);
    RUN_TEST(test_bad_input);
    RUN_TEST(test_brown_corpus);
    RUN_TEST(test_command);
    test_rmtree(dir);
    TEST_MAIN_END();
}
