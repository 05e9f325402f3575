/* safetensors reader: every malformed header is refused with KILN_ERR_FORMAT and a message
 * naming the file and the tensor; well-formed edge cases open. Files are hand-built bytes. */
#include <stdint.h>

#include "kiln/safetensors.h"
#include "test.h"

/* 8-byte length + json + data_size bytes of data (0, 1, 2, ...). */
static unsigned char *build(const char *json, size_t data_size, size_t *size) {
    size_t n = strlen(json);
    *size = 8 + n + data_size;
    unsigned char *b = malloc(*size ? *size : 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    for (size_t i = 0; i < data_size; i++)
        b[8 + n + i] = (unsigned char)i;
    return b;
}

/* Open json+data from memory; expect `want`, and when failing, a message holding the file's
 * name and `needle` (a tensor name or a reason). */
static void expect_open(int line, const char *json, size_t data_size, kiln_status want,
                        const char *needle) {
    size_t size;
    unsigned char *b = build(json, data_size, &size);
    kiln_safetensors *f = NULL;
    kiln_status s = kiln_safetensors_open_memory(&f, b, size, "bad.safetensors");
    test_checks++;
    if (s != want) {
        test_failures++;
        fprintf(stderr, "line %d: %s gave %s (%s), wanted %s\n", line, json, kiln_status_str(s),
                kiln_error_message(), kiln_status_str(want));
    } else if (s != KILN_OK && (!strstr(kiln_error_message(), "bad.safetensors") ||
                                (needle && !strstr(kiln_error_message(), needle)))) {
        test_failures++;
        fprintf(stderr, "line %d: message \"%s\" lacks the file name or \"%s\"\n", line,
                kiln_error_message(), needle ? needle : "");
    }
    CHECK_TRUE((s == KILN_OK) == (f != NULL));
    kiln_safetensors_close(f);
    free(b);
}

#define EXPECT_FORMAT(json, data, needle) expect_open(__LINE__, json, data, KILN_ERR_FORMAT, needle)
#define EXPECT_OK(json, data) expect_open(__LINE__, json, data, KILN_OK, NULL)

static void test_short_and_bad_lengths(void) {
    kiln_safetensors *f = NULL;
    unsigned char b[16] = {0};
    CHECK_STATUS(kiln_safetensors_open_memory(&f, b, 0, "bad.safetensors"), KILN_ERR_FORMAT);
    CHECK_STATUS(kiln_safetensors_open_memory(&f, b, 7, "bad.safetensors"), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "bad.safetensors") != NULL);
    /* length 0: no JSON at all */
    CHECK_STATUS(kiln_safetensors_open_memory(&f, b, 8, "bad.safetensors"), KILN_ERR_FORMAT);
    /* length past the end of the file */
    b[0] = 9;
    memcpy(b + 8, "{}      ", 8);
    CHECK_STATUS(kiln_safetensors_open_memory(&f, b, 16, "bad.safetensors"), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "past the end") != NULL);
    b[0] = 8;
    CHECK_OK(kiln_safetensors_open_memory(&f, b, 16, "ok.safetensors"));
    CHECK_INT_EQ(kiln_safetensors_num_tensors(f), 0);
    kiln_safetensors_close(f);
    /* absurd lengths: 200 MB, and 2^63 */
    uint64_t big[2] = {200000000ull, 1ull << 63};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 8; i++)
            b[i] = (unsigned char)(big[k] >> (8 * i));
        f = NULL;
        CHECK_STATUS(kiln_safetensors_open_memory(&f, b, 16, "bad.safetensors"), KILN_ERR_FORMAT);
        CHECK_TRUE(strstr(kiln_error_message(), "limit") != NULL);
        CHECK_TRUE(f == NULL);
    }
    CHECK_STATUS(kiln_safetensors_open_memory(NULL, b, 16, "x"), KILN_ERR_ARG);
}

static void test_bad_json(void) {
    EXPECT_FORMAT("{\"a\": ", 0, "not valid JSON");
    EXPECT_FORMAT("[1, 2]", 0, "'{'");
    EXPECT_FORMAT(" {}", 0, "'{'");
    EXPECT_FORMAT("{}x", 0, "after the header");
    EXPECT_FORMAT("{} }", 0, "after the header");
    EXPECT_OK("{}      ", 0);
    EXPECT_OK("{}\n", 0);
    /* metadata must be an object of strings, once */
    EXPECT_FORMAT("{\"__metadata__\": 3}", 0, "__metadata__");
    EXPECT_FORMAT("{\"__metadata__\": {\"k\": 1}}", 0, "\"k\"");
    EXPECT_FORMAT("{\"__metadata__\": {\"k\": \"a\", \"k\": \"b\"}}", 0, "\"k\" appears twice");
    EXPECT_FORMAT("{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "appears twice");
    EXPECT_OK("{\"__metadata__\": {}}", 0);
}

static void test_bad_entries(void) {
    EXPECT_FORMAT("{\"w\": 5}", 0, "\"w\"");
    EXPECT_FORMAT("{\"\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}", 4,
                  "empty name");
    EXPECT_FORMAT("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "\"w\": no \"dtype\"");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4,
                  "\"w\": no \"shape\"");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "\"w\": no \"data_offsets\"");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], "
                  "\"extra\": 1}}",
                  4, "unknown field \"extra\"");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"dtype\": \"F32\", \"shape\": [1], "
                  "\"data_offsets\": [0, 4]}}",
                  4, "repeated");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F128\", \"shape\": [1], \"data_offsets\": [0, 16]}}", 16,
                  "unknown dtype \"F128\"");
    EXPECT_FORMAT("{\"w\": {\"dtype\": 32, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                  "unknown dtype");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"f32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                  "unknown dtype");
}

static void test_bad_shapes(void) {
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4,
                  "\"w\": \"shape\" is not an array");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
                  "shape[0]");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1, 1.5], \"data_offsets\": [0, 4]}}", 4,
                  "shape[1]");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", 8,
                  "shape[0]");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 4]}}", 4,
                  "shape[0]");
    /* 2^32 x 2^32 x 4 overflows int64 */
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296, 4], "
                  "\"data_offsets\": [0, 4]}}",
                  4, "\"w\": the product of its shape overflows");
    /* 2^31 x 2^31 elements fit int64, but not in bytes at 8 bytes each */
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F64\", \"shape\": [2147483648, 2147483648, 4], "
                  "\"data_offsets\": [0, 4]}}",
                  4, "overflows");
    /* a zero dimension makes the tensor empty whatever the others are */
    EXPECT_OK("{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 4294967296, 4294967296], "
              "\"data_offsets\": [0, 0]}}",
              0);
    expect_open(__LINE__,
                "{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                "\"data_offsets\": [0, 1]}}",
                1, KILN_ERR_UNSUPPORTED, "9 dimensions");
    EXPECT_OK("{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1], "
              "\"data_offsets\": [0, 1]}}",
              1);
}

static void test_bad_offsets(void) {
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4,
                  "\"w\": data_offsets [0, 4] do not hold 2 F32 elements (8 bytes)");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", 4,
                  "\"w\"");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
                  "[begin, end]");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8,
                  "[begin, end]");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4,
                  "[begin, end]");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {}}}", 4,
                  "[begin, end]");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4,
                  "\"w\": data_offsets [0, 8] run past the end of the data (4 bytes)");
    EXPECT_FORMAT("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": "
                  "[18446744073709551612, 18446744073709551616]}}",
                  4, "\"w\"");
    /* overlap */
    EXPECT_FORMAT("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                  " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                  12, "\"b\" (bytes 4..12) overlaps tensor \"a\"");
    EXPECT_FORMAT("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                  " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                  8, "overlaps");
    /* an empty tensor inside another one also overlaps it */
    EXPECT_FORMAT("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                  " \"z\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]}}",
                  8, "\"z\"");
    /* holes: before the first tensor, between two, after the last */
    EXPECT_FORMAT("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8,
                  "bytes 0..4 of the data belong to no tensor (before tensor \"a\")");
    EXPECT_FORMAT("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                  " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
                  12, "before tensor \"b\"");
    EXPECT_FORMAT("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8,
                  "the data has 8 bytes but its tensors end at byte 4");
    EXPECT_FORMAT("{}", 1, "the data has 1 bytes");
    /* the same name twice */
    EXPECT_FORMAT("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                  " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                  8, "\"a\" appears twice");
    /* empty tensors at the boundaries are fine */
    EXPECT_OK("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
              " \"e\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [4, 4]},"
              " \"f\": {\"dtype\": \"I64\", \"shape\": [0], \"data_offsets\": [0, 0]}}",
              4);
}

/* A valid file in a different order than its data: tensors are listed in data order, found
 * by name, and point at the right bytes. */
static void test_listing_and_lookup(void) {
    const char *json = "{\"__metadata__\": {\"format\": \"pt\", \"k\": \"v\"},"
                       " \"z\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [0, 3]},"
                       " \"a\": {\"dtype\": \"F32\", \"shape\": [1, 2], \"data_offsets\": [7, 15]},"
                       " \"m\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [3, 7]}}";
    size_t size;
    unsigned char *b = build(json, 15, &size);
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open_memory(&f, b, size, NULL));
    if (!f) {
        free(b);
        return;
    }
    CHECK_STR_EQ(kiln_safetensors_path(f), "<memory>");
    CHECK_INT_EQ(kiln_safetensors_num_tensors(f), 3);
    CHECK_STR_EQ(kiln_safetensors_tensor(f, 0)->name, "z");
    CHECK_STR_EQ(kiln_safetensors_tensor(f, 1)->name, "m");
    CHECK_STR_EQ(kiln_safetensors_tensor(f, 2)->name, "a");
    CHECK_TRUE(kiln_safetensors_tensor(f, 3) == NULL);
    CHECK_TRUE(kiln_safetensors_tensor(f, -1) == NULL);
    const kiln_st_tensor *a = kiln_safetensors_find(f, "a");
    CHECK_TRUE(a != NULL && a->dtype == KILN_ST_DTYPE_F32 && a->ndim == 2 && a->shape[1] == 2);
    CHECK_TRUE(a && a->numel == 2 && a->offset == 7 && a->nbytes == 8);
    CHECK_TRUE(a && (const unsigned char *)a->data == b + size - 8);
    CHECK_TRUE(kiln_safetensors_find(f, "m") == kiln_safetensors_tensor(f, 1));
    CHECK_TRUE(kiln_safetensors_find(f, "b") == NULL);
    CHECK_TRUE(kiln_safetensors_find(f, "") == NULL);
    CHECK_INT_EQ(kiln_safetensors_num_metadata(f), 2);
    CHECK_STR_EQ(kiln_safetensors_metadata(f, "format"), "pt");
    CHECK_TRUE(kiln_safetensors_metadata(f, "nope") == NULL);
    const char *k, *v;
    kiln_safetensors_metadata_at(f, 1, &k, &v);
    CHECK_STR_EQ(k, "k");
    CHECK_STR_EQ(v, "v");
    /* U8 and I32 are listed but are not floats */
    float out[4];
    CHECK_STATUS(kiln_safetensors_read_f32(f, kiln_safetensors_find(f, "m"), out), KILN_ERR_DTYPE);
    CHECK_TRUE(strstr(kiln_error_message(), "\"m\" is I32") != NULL);
    /* "a" starts at byte 7 of the data: an unaligned F32 tensor still reads */
    CHECK_OK(kiln_safetensors_read_f32(f, a, out));
    float want[2];
    memcpy(want, b + size - 8, 8);
    CHECK_TRUE(memcmp(out, want, 8) == 0);
    kiln_safetensors_close(f);
    kiln_safetensors_close(NULL);
    free(b);
}

int main(void) {
    RUN_TEST(test_short_and_bad_lengths);
    RUN_TEST(test_bad_json);
    RUN_TEST(test_bad_entries);
    RUN_TEST(test_bad_shapes);
    RUN_TEST(test_bad_offsets);
    RUN_TEST(test_listing_and_lookup);
    TEST_MAIN_END();
}
