/* Token shards: round trips at both widths, the streaming writer, atomic replacement,
 * and the writer's refusals. Damaged files are in tests/fault/. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kiln/core.h"
#include "kiln/shard.h"
#include "test.h"

static char dir[256];

static void path_in(char *out, size_t n, const char *name) {
    test_path(out, n, dir, name);
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* 1 when this process left a temporary of `final` (core/fs.h names them). */
static int tmp_files_left(const char *final) {
    char p[600];
    return test_find_temp(final, (long)getpid(), p, sizeof p);
}

static int32_t *make_ids(int64_t n, int64_t vocab, uint64_t seed) {
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)kiln_rng_below(&r, (uint64_t)vocab);
    if (n > 0)
        ids[n - 1] = (int32_t)(vocab - 1); /* the largest id is legal */
    return ids;
}

static void check_round_trip(int64_t vocab, int64_t n, int want_width) {
    char p[512];
    path_in(p, sizeof p, "rt.bin");
    int32_t *ids = make_ids(n, vocab, (uint64_t)vocab + (uint64_t)n);
    CHECK_OK(kiln_shard_write(p, vocab, ids, n));
    CHECK_TRUE(!tmp_files_left(p));
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(&s, p));
    if (!s) {
        free(ids);
        return;
    }
    const kiln_shard_info *in = kiln_shard_get_info(s);
    CHECK_INT_EQ(in->version, KILN_SHARD_VERSION);
    CHECK_INT_EQ(in->token_width, want_width);
    CHECK_INT_EQ(in->vocab_size, vocab);
    CHECK_INT_EQ(in->num_tokens, n);
    size_t file_len = 0;
    char *file = test_slurp(p, &file_len);
    CHECK_TRUE(file && file_len == (size_t)(KILN_SHARD_HEADER_BYTES + n * want_width));
    CHECK_TRUE(file && in->data_hash ==
                           XXH3_64bits(file + KILN_SHARD_HEADER_BYTES, (size_t)(n * want_width)));
    free(file);
    int32_t *back = malloc((size_t)(n ? n : 1) * sizeof *back);
    CHECK_OK(kiln_shard_read(s, 0, n, back));
    CHECK_TRUE(memcmp(back, ids, (size_t)n * sizeof *ids) == 0);
    CHECK_STATUS(kiln_shard_read(s, n - 1, 2, back), KILN_ERR_RANGE);
    CHECK_STATUS(kiln_shard_read(s, -1, 1, back), KILN_ERR_RANGE);
    struct stat sb;
    CHECK_TRUE(stat(p, &sb) == 0 && sb.st_size == KILN_SHARD_HEADER_BYTES + n * want_width);
    kiln_shard_info hdr;
    CHECK_OK(kiln_shard_read_info(p, &hdr));
    CHECK_INT_EQ(hdr.num_tokens, n);
    CHECK_TRUE(hdr.data_hash == in->data_hash);
    kiln_shard_close(s);
    free(back);
    free(ids);
}

static void test_round_trips(void) {
    CHECK_INT_EQ(kiln_shard_token_width(256), 2);
    CHECK_INT_EQ(kiln_shard_token_width(65536), 2);
    CHECK_INT_EQ(kiln_shard_token_width(65537), 4);
    check_round_trip(256, 1000, 2);
    check_round_trip(50257, 300000, 2); /* crosses the writer's 1 MiB buffer */
    check_round_trip(65536, 5000, 2);
    check_round_trip(65537, 5000, 4);
    check_round_trip(100277, 400000, 4);
    check_round_trip(7, 1, 2);
    check_round_trip(50257, 0, 2); /* an empty shard is a valid file */
}

/* Many small appends give the same bytes as one large one. */
static void test_streaming_equals_one_shot(void) {
    char a[512], b[512];
    path_in(a, sizeof a, "one.bin");
    path_in(b, sizeof b, "many.bin");
    int64_t n = 777777, V = 50257;
    int32_t *ids = make_ids(n, V, 5);
    CHECK_OK(kiln_shard_write(a, V, ids, n));
    kiln_shard_writer *w = NULL;
    CHECK_OK(kiln_shard_writer_open(&w, b, V));
    int64_t i = 0, step = 1;
    while (i < n) {
        int64_t k = step < n - i ? step : n - i;
        CHECK_OK(kiln_shard_writer_append(w, ids + i, k));
        i += k;
        step = step * 3 % 100003 + 1;
    }
    CHECK_INT_EQ(kiln_shard_writer_count(w), n);
    CHECK_TRUE(!file_exists(b)); /* nothing under the final name before finish */
    CHECK_OK(kiln_shard_writer_finish(w));
    kiln_shard_writer_free(w);
    size_t na = 0, nb = 0;
    char *da = test_slurp(a, &na), *db = test_slurp(b, &nb);
    CHECK_TRUE(da && db && na == nb && memcmp(da, db, na) == 0);
    free(da);
    free(db);
    free(ids);
}

static void test_writer_refuses_bad_ids(void) {
    char p[512];
    path_in(p, sizeof p, "bad.bin");
    kiln_shard_writer *w = NULL;
    int32_t ids[4] = {1, 2, 256, 3};
    CHECK_OK(kiln_shard_writer_open(&w, p, 256));
    CHECK_STATUS(kiln_shard_writer_append(w, ids, 4), KILN_ERR_RANGE);
    CHECK_TRUE(strstr(kiln_error_message(), "id 256 (token 2") != NULL);
    CHECK_STATUS(kiln_shard_writer_finish(w), KILN_ERR_ARG); /* a failed writer stays failed */
    kiln_shard_writer_free(w);
    CHECK_TRUE(!file_exists(p));
    CHECK_TRUE(!tmp_files_left(p));

    int32_t neg[1] = {-1};
    CHECK_STATUS(kiln_shard_write(p, 256, neg, 1), KILN_ERR_RANGE);
    CHECK_TRUE(!file_exists(p) && !tmp_files_left(p));

    CHECK_STATUS(kiln_shard_writer_open(&w, p, 0), KILN_ERR_ARG);
    CHECK_TRUE(w == NULL);
    CHECK_STATUS(kiln_shard_writer_open(&w, p, KILN_SHARD_MAX_VOCAB + 1), KILN_ERR_ARG);
    char nodir[512];
    path_in(nodir, sizeof nodir, "no/such/folder/x.bin");
    CHECK_STATUS(kiln_shard_writer_open(&w, nodir, 256), KILN_ERR_IO);
    kiln_shard_writer_free(NULL);
    kiln_shard_close(NULL);
}

/* An abandoned writer leaves nothing; a finished one replaces the old file whole. */
static void test_abandon_and_replace(void) {
    char p[512];
    path_in(p, sizeof p, "replace.bin");
    int32_t old_ids[3] = {1, 2, 3}, new_ids[5] = {9, 8, 7, 6, 5};
    CHECK_OK(kiln_shard_write(p, 256, old_ids, 3));
    kiln_shard_writer *w = NULL;
    CHECK_OK(kiln_shard_writer_open(&w, p, 256));
    CHECK_OK(kiln_shard_writer_append(w, new_ids, 5));
    CHECK_TRUE(tmp_files_left(p)); /* the writer works in a temporary, which the check finds */
    kiln_shard_writer_free(w);     /* never finished */
    CHECK_TRUE(!tmp_files_left(p));
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(&s, p));
    CHECK_INT_EQ(s ? kiln_shard_get_info(s)->num_tokens : -1, 3);
    kiln_shard_close(s);
    CHECK_OK(kiln_shard_write(p, 256, new_ids, 5));
    CHECK_OK(kiln_shard_open(&s, p));
    int32_t back[5] = {0};
    if (s) {
        CHECK_OK(kiln_shard_read(s, 0, 5, back));
        CHECK_TRUE(memcmp(back, new_ids, sizeof back) == 0);
    }
    kiln_shard_close(s);
}

static void test_open_errors(void) {
    char p[512];
    path_in(p, sizeof p, "missing.bin");
    kiln_shard *s = NULL;
    CHECK_STATUS(kiln_shard_open(&s, p), KILN_ERR_NOT_FOUND);
    CHECK_TRUE(s == NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "missing.bin") != NULL);
    CHECK_STATUS(kiln_shard_open(&s, dir), KILN_ERR_IO); /* a folder */
}

/* Version 2 records the tokenizer's identity at offset 40; version 1 (bytes 40..55 zero) is
 * still read, its tokenizer unknown. */
static void test_tokenizer_id_and_version_1(void) {
    char p[512];
    path_in(p, sizeof p, "id.bin");
    const int32_t ids[4] = {1, 2, 3, 4};
    kiln_shard_writer *w = NULL;
    CHECK_OK(kiln_shard_writer_open(&w, p, 256));
    CHECK_OK(kiln_shard_writer_append(w, ids, 4));
    kiln_shard_writer_set_tokenizer(w, 0x1122334455667788ull);
    CHECK_OK(kiln_shard_writer_finish(w));
    kiln_shard_writer_free(w);
    kiln_shard_info in;
    CHECK_OK(kiln_shard_read_info(p, &in));
    CHECK_INT_EQ(in.version, 2);
    CHECK_TRUE(in.tokenizer_id == 0x1122334455667788ull);
    size_t n = 0;
    unsigned char *b = test_slurp(p, &n);
    CHECK_TRUE(b && n == KILN_SHARD_HEADER_BYTES + 8);
    if (!b)
        return;
    const uint32_t v1 = 1;
    memcpy(b + 8, &v1, 4);
    memset(b + 40, 0, 8);
    uint64_t h = XXH3_64bits(b, 56);
    memcpy(b + 56, &h, 8);
    CHECK_TRUE(test_write_file(p, b, n) == 0);
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(&s, p));
    CHECK_INT_EQ(s ? kiln_shard_get_info(s)->version : -1, 1);
    CHECK_TRUE(s && kiln_shard_get_info(s)->tokenizer_id == 0);
    kiln_shard_close(s);
    b[40] = 1; /* reserved in version 1 */
    h = XXH3_64bits(b, 56);
    memcpy(b + 56, &h, 8);
    CHECK_TRUE(test_write_file(p, b, n) == 0);
    CHECK_STATUS(kiln_shard_read_info(p, &in), KILN_ERR_FORMAT);
    free(b);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "test_shard");
    RUN_TEST(test_round_trips);
    RUN_TEST(test_streaming_equals_one_shot);
    RUN_TEST(test_writer_refuses_bad_ids);
    RUN_TEST(test_abandon_and_replace);
    RUN_TEST(test_open_errors);
    RUN_TEST(test_tokenizer_id_and_version_1);
    test_rmtree(dir);
    TEST_MAIN_END();
}
