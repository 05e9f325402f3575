/* safetensors in mixed precision: every (held, stored, loaded) combination of F32, BF16 and
 * F16 against kiln_convert bit for bit, exact BF16 round trips, F16 overflow refused with the
 * tensor and the value (reading and writing, the old file kept), the declared dtype held to
 * at load and at write, tensors larger than a conversion chunk, and unaligned tensors. */
#include <stdint.h>
#include <unistd.h>

#include "ckpt/safetensors_internal.h"
#include "kiln/core.h"
#include "kiln/safetensors.h"
#include "test.h"

static char dir[256];

static const kiln_dtype all_types[3] = {KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_F16};

/* Values inside F16's range that exercise rounding: ties of both 16-bit formats (to even
 * upward and downward), F16 subnormals and underflow, F32 subnormals, signed zeros,
 * infinities, NaN, and a spread of random magnitudes from 2^-30 to 2^15 (all of it held by
 * F16 after rounding to BF16: F16 overflow has tests of its own). */
static float *test_values(int64_t n) {
    float *v = malloc((size_t)n * sizeof *v);
    const float edge[] = {
        1.0f,
        -2.0f,
        0.0f,
        -0.0f,
        1.0f + 0x1p-8f,      /* BF16 tie, rounds down to even */
        1.0f + 3 * 0x1p-8f,  /* BF16 tie, rounds up to even */
        1.0f + 0x1p-11f,     /* F16 tie */
        1.0f + 3 * 0x1p-11f, /* F16 tie, up */
        0x1p-24f,            /* F16's smallest subnormal */
        0x1p-25f,            /* F16 underflow tie: to zero */
        0x1.8p-25f,          /* rounds up to 2^-24 */
        0x1p-130f,           /* F32 subnormal */
        65280.0f,            /* BF16's largest below F16's 65504 */
        -60000.0f,
        3.14159265f,
        INFINITY,
        -INFINITY,
        NAN,
    };
    int64_t ne = (int64_t)(sizeof edge / sizeof edge[0]);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; i++) {
        if (i < ne) {
            v[i] = edge[i];
            continue;
        }
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(r >> 32);
        int e = (int)(u % 45) - 30; /* 2^-30 .. 2^15 */
        float m = 1.0f + (float)(u >> 9 & 0x7fffff) * 0x1p-23f;
        v[i] = ldexpf(u & 1 ? -m : m, e);
    }
    return v;
}

/* Bits of a and b agree, for n elements of type t; any NaN matches any NaN. */
static int same_bits(const void *a, const void *b, kiln_dtype t, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = kiln__st_value(a, t, i), y = kiln__st_value(b, t, i);
        size_t z = kiln_dtype_size(t);
        if (isnan(x) && isnan(y))
            continue;
        if (memcmp((const char *)a + (size_t)i * z, (const char *)b + (size_t)i * z, z) != 0) {
            fprintf(stderr, "element %lld differs: %.9g vs %.9g\n", (long long)i, x, y);
            return 0;
        }
    }
    return 1;
}

/* The file's bytes of a writer, in memory and through a real file: they must agree. */
static void *written(kiln_safetensors_writer *w, size_t *size) {
    void *mem = NULL;
    CHECK_OK(kiln_safetensors_writer_to_memory(w, &mem, size));
    char path[512];
    test_path(path, sizeof path, dir, "w.safetensors");
    CHECK_OK(kiln_safetensors_writer_write(w, path));
    size_t fsize = 0;
    unsigned char *file = test_slurp(path, &fsize);
    CHECK_TRUE(file && mem && fsize == *size && memcmp(file, mem, fsize) == 0);
    free(file);
    remove(path);
    return mem;
}

/* Held in h, stored in s, loaded as l: the loaded bits are kiln_convert(h -> s -> l). */
static void test_every_combination(void) {
    int64_t n = 1000;
    float *v = test_values(n);
    void *held = malloc((size_t)n * 4), *stored = malloc((size_t)n * 4),
         *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    int combos = 0;
    for (int hi = 0; hi < 3; hi++) {
        for (int si = 0; si < 3; si++) {
            kiln_dtype h = all_types[hi], s = all_types[si];
            kiln_convert(held, h, v, KILN_DTYPE_F32, n);
            kiln_convert(stored, s, held, h, n);
            kiln_safetensors_writer *w = NULL;
            CHECK_OK(kiln_safetensors_writer_init(&w));
            int64_t shape[2] = {n / 10, 10};
            CHECK_OK(kiln_safetensors_writer_add_as(w, "t", s, 2, shape, h, held));
            size_t size = 0;
            void *mem = written(w, &size);
            kiln_safetensors_writer_free(w);
            kiln_safetensors *f = NULL;
            CHECK_OK(kiln_safetensors_open_memory(&f, mem, size, "combo.safetensors"));
            const kiln_st_tensor *t = f ? kiln_safetensors_find(f, "t") : NULL;
            CHECK_TRUE(t && t->dtype == kiln_st_dtype_from_kiln(s) && t->numel == n);
            CHECK_TRUE(t && same_bits(t->data, stored, s, n));
            for (int li = 0; t && li < 3; li++) {
                kiln_dtype l = all_types[li];
                kiln_convert(want, l, stored, s, n);
                memset(got, 0xa5, (size_t)n * 4);
                CHECK_OK(kiln_safetensors_read_as(f, t, l, got));
                int ok = same_bits(got, want, l, n);
                CHECK_TRUE(ok);
                if (!ok)
                    fprintf(stderr, "held %s, stored %s, loaded %s\n", kiln_dtype_name(h),
                            kiln_dtype_name(s), kiln_dtype_name(l));
                combos++;
            }
            kiln_safetensors_close(f);
            free(mem);
        }
    }
    CHECK_INT_EQ(combos, 27);
    free(v), free(held), free(stored), free(want), free(got);
}

/* F32 -> BF16 -> F32 is exact for values BF16 holds, and rounds the others to nearest. */
static void test_bf16_round_trip(void) {
    int64_t n = 65536;
    float *exact = malloc((size_t)n * 4), *other = test_values(n), *back = malloc((size_t)n * 4);
    int64_t k = 0;
    for (uint32_t h = 0; h < 65536; h++) { /* every finite BF16 value */
        float x = kiln_bf16_to_f32((uint16_t)h);
        if (isfinite(x))
            exact[k++] = x;
    }
    kiln_safetensors_writer *w = NULL;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(
        kiln_safetensors_writer_add_as(w, "exact", KILN_DTYPE_BF16, 1, &k, KILN_DTYPE_F32, exact));
    CHECK_OK(
        kiln_safetensors_writer_add_as(w, "other", KILN_DTYPE_BF16, 1, &n, KILN_DTYPE_F32, other));
    CHECK_OK(kiln_safetensors_writer_declare_dtype(w, KILN_DTYPE_BF16));
    size_t size = 0;
    void *mem = written(w, &size);
    kiln_safetensors_writer_free(w);
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open_memory(&f, mem, size, "bf16.safetensors"));
    if (f) {
        CHECK_STR_EQ(kiln_safetensors_metadata(f, KILN_ST_META_DTYPE), "bf16");
        CHECK_OK(
            kiln_safetensors_read_as(f, kiln_safetensors_find(f, "exact"), KILN_DTYPE_F32, back));
        CHECK_TRUE(memcmp(back, exact, (size_t)k * 4) == 0);
        CHECK_OK(kiln_safetensors_read_f32(f, kiln_safetensors_find(f, "other"), back));
        int nearest = 1;
        for (int64_t i = 0; i < n; i++) {
            float want = kiln_bf16_to_f32(kiln_f32_to_bf16(other[i]));
            nearest &= isnan(want) ? isnan(back[i]) : back[i] == want;
        }
        CHECK_TRUE(nearest);
        CHECK_TRUE(back[4] == 1.0f && back[5] == 1.0f + 4 * 0x1p-8f); /* ties to even */
    }
    kiln_safetensors_close(f);
    free(mem), free(exact), free(other), free(back);
}

/* A file holding `v` (n values) as tensor "h.0.mlp.c_fc.weight" stored in s. */
static void *file_of(const float *v, int64_t n, kiln_dtype s, size_t *size) {
    kiln_safetensors_writer *w = NULL;
    void *mem = NULL;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add_as(w, "h.0.mlp.c_fc.weight", s, 1, &n, KILN_DTYPE_F32, v));
    CHECK_OK(kiln_safetensors_writer_to_memory(w, &mem, size));
    kiln_safetensors_writer_free(w);
    return mem;
}

/* Reading F32 or BF16 into F16: a value past 65504 fails with the tensor, index and value,
 * in whichever chunk it lies. 65519 rounds down to 65504 and fits. */
static void test_f16_overflow_read(void) {
    int64_t n = 2 * KILN__ST_CHUNK + 7, at = KILN__ST_CHUNK + 3;
    float *v = calloc((size_t)n, sizeof *v);
    uint16_t *out = malloc((size_t)n * 2);
    v[1] = -1.5f, v[2] = INFINITY; /* fit: inf stays inf */
    for (int si = 0; si < 2; si++) {
        kiln_dtype s = all_types[si];                       /* F32, BF16 */
        v[0] = s == KILN_DTYPE_F32 ? 65519.0f : 65280.0f;   /* rounds to F16's 65504; fits */
        v[at] = s == KILN_DTYPE_F32 ? 65520.0f : -70144.0f; /* -70144 is a BF16 value */
        size_t size = 0;
        void *mem = file_of(v, n, s, &size);
        kiln_safetensors *f = NULL;
        CHECK_OK(kiln_safetensors_open_memory(&f, mem, size, "big.safetensors"));
        const kiln_st_tensor *t = f ? kiln_safetensors_tensor(f, 0) : NULL;
        if (t) {
            /* checked first, nothing written */
            out[0] = 0x1234;
            CHECK_STATUS(kiln_safetensors_check_fits(f, t, KILN_DTYPE_F16), KILN_ERR_RANGE);
            char first[512];
            snprintf(first, sizeof first, "%s", kiln_error_message());
            CHECK_INT_EQ(out[0], 0x1234);
            CHECK_OK(kiln_safetensors_check_fits(f, t, KILN_DTYPE_BF16));
            CHECK_OK(kiln_safetensors_check_fits(f, t, KILN_DTYPE_F32));
            CHECK_STATUS(kiln_safetensors_read_as(f, t, KILN_DTYPE_F16, out), KILN_ERR_RANGE);
            const char *msg = kiln_error_message();
            CHECK_STR_EQ(msg, first); /* the same message as the read */
            char idx[32];
            snprintf(idx, sizeof idx, "element %lld", (long long)at);
            CHECK_TRUE(strstr(msg, "big.safetensors") && strstr(msg, "h.0.mlp.c_fc.weight") &&
                       strstr(msg, idx) && strstr(msg, "65504") &&
                       strstr(msg, s == KILN_DTYPE_F32 ? "65520" : "-70144"));
            /* the chunks before were converted, 65519 to F16's largest */
            CHECK_INT_EQ(out[0], s == KILN_DTYPE_F32 ? 0x7bff : 0x7bf8);
            CHECK_INT_EQ(out[2], 0x7c00);
            /* F32 and BF16 destinations take the same tensor */
            CHECK_OK(kiln_safetensors_read_as(f, t, KILN_DTYPE_BF16, out));
        }
        kiln_safetensors_close(f);
        free(mem);
    }
    /* F16 stored, F16 loaded: no conversion, infinities stored are read as they are */
    uint16_t h[2] = {0x7c00, 0x3c00};
    int64_t two = 2;
    kiln_safetensors_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add(w, "h", KILN_ST_DTYPE_F16, 1, &two, h));
    CHECK_OK(kiln_safetensors_writer_to_memory(w, &mem, &size));
    kiln_safetensors_writer_free(w);
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open_memory(&f, mem, size, "inf.safetensors"));
    if (f) {
        CHECK_OK(kiln_safetensors_check_fits(f, kiln_safetensors_tensor(f, 0), KILN_DTYPE_F16));
        CHECK_OK(kiln_safetensors_read_as(f, kiln_safetensors_tensor(f, 0), KILN_DTYPE_F16, out));
    }
    CHECK_TRUE(out[0] == 0x7c00 && out[1] == 0x3c00);
    kiln_safetensors_close(f);
    free(mem), free(v), free(out);
}

/* Saving as F16 a tensor that does not fit: the write fails naming tensor and value, and the
 * file it would have replaced stays as it was, with no temporary left. */
static void test_f16_overflow_write(void) {
    char path[512];
    test_path(path, sizeof path, dir, "keep.safetensors");
    float ok[3] = {1, 2, 3};
    int64_t n3 = 3;
    kiln_safetensors_writer *w = NULL;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add(w, "old", KILN_ST_DTYPE_F32, 1, &n3, ok));
    CHECK_OK(kiln_safetensors_writer_write(w, path));
    kiln_safetensors_writer_free(w);
    size_t old_size = 0;
    unsigned char *old = test_slurp(path, &old_size);

    int64_t n = KILN__ST_CHUNK + 100;
    uint16_t *bf = calloc((size_t)n, 2);
    bf[KILN__ST_CHUNK + 50] = kiln_f32_to_bf16(-1e5f);
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add_as(w, "fine", KILN_DTYPE_F16, 1, &n3, KILN_DTYPE_F32, ok));
    CHECK_OK(kiln_safetensors_writer_add_as(w, "h.3.attn.c_proj.weight", KILN_DTYPE_F16, 1, &n,
                                            KILN_DTYPE_BF16, bf));
    CHECK_OK(kiln_safetensors_writer_declare_dtype(w, KILN_DTYPE_F16));
    CHECK_STATUS(kiln_safetensors_writer_write(w, path), KILN_ERR_RANGE);
    const char *msg = kiln_error_message();
    char idx[32];
    snprintf(idx, sizeof idx, "element %lld", (long long)(KILN__ST_CHUNK + 50));
    CHECK_TRUE(strstr(msg, path) && strstr(msg, "h.3.attn.c_proj.weight") && strstr(msg, idx) &&
               strstr(msg, "-99840")); /* -1e5 as BF16 */
    size_t now_size = 0;
    unsigned char *now = test_slurp(path, &now_size);
    CHECK_TRUE(now && old && now_size == old_size && memcmp(now, old, old_size) == 0);
    char tmp[600];
    CHECK_INT_EQ(test_find_temp(path, (long)getpid(), tmp, sizeof tmp), 0);
    void *mem = NULL;
    size_t size = 0;
    CHECK_STATUS(kiln_safetensors_writer_to_memory(w, &mem, &size), KILN_ERR_RANGE);
    CHECK_TRUE(mem == NULL && strstr(kiln_error_message(), "h.3.attn.c_proj.weight"));
    kiln_safetensors_writer_free(w);
    free(now), free(old), free(bf);
}

/* Bytes of a file: 8-byte header length, the JSON, then data_size bytes. */
static unsigned char *hand_file(const char *json, size_t data_size, size_t *size) {
    size_t n = strlen(json);
    *size = 8 + n + data_size;
    unsigned char *b = calloc(1, *size);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    return b;
}

static kiln_status check_json(const char *json, size_t data_size, int *declared,
                              kiln_dtype *dtype) {
    size_t size;
    unsigned char *b = hand_file(json, data_size, &size);
    kiln_safetensors *f = NULL;
    kiln_status s = kiln_safetensors_open_memory(&f, b, size, "decl.safetensors");
    if (s == KILN_OK)
        s = kiln_safetensors_check_dtype(f, declared, dtype);
    kiln_safetensors_close(f);
    free(b);
    return s;
}

static void test_declared_dtype(void) {
    int declared = -1;
    kiln_dtype dt = KILN_DTYPE_F32;
    /* kiln's own file: declared and consistent */
    CHECK_OK(check_json("{\"__metadata__\":{\"kiln.dtype\":\"bf16\"},"
                        "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                        "\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[4,6]}}",
                        6, &declared, &dt));
    CHECK_INT_EQ(declared, 1);
    CHECK_INT_EQ(dt, KILN_DTYPE_BF16);
    /* metadata says bf16, one tensor is F32: refused, naming the file and the tensor */
    CHECK_STATUS(check_json("{\"__metadata__\":{\"kiln.dtype\":\"bf16\",\"format\":\"pt\"},"
                            "\"h.3.ln_1.bias\":{\"dtype\":\"BF16\",\"shape\":[2],"
                            "\"data_offsets\":[0,4]},"
                            "\"h.3.mlp.c_fc.weight\":{\"dtype\":\"F32\",\"shape\":[2],"
                            "\"data_offsets\":[4,12]}}",
                            12, &declared, &dt),
                 KILN_ERR_DTYPE);
    const char *msg = kiln_error_message();
    CHECK_TRUE(strstr(msg, "decl.safetensors") && strstr(msg, "h.3.mlp.c_fc.weight") &&
               strstr(msg, "F32") && strstr(msg, "BF16"));
    CHECK_TRUE(!strstr(msg, "h.3.ln_1.bias"));
    /* a file declaring fp16 written wholly in F32 */
    CHECK_STATUS(check_json("{\"__metadata__\":{\"kiln.dtype\":\"fp16\"},"
                            "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[1],"
                            "\"data_offsets\":[0,4]}}",
                            4, NULL, NULL),
                 KILN_ERR_DTYPE);
    CHECK_TRUE(strstr(kiln_error_message(), "wte.weight") != NULL);
    /* a value that names no kiln dtype */
    CHECK_STATUS(check_json("{\"__metadata__\":{\"kiln.dtype\":\"int8\"}}", 0, NULL, NULL),
                 KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "int8") != NULL);
    /* no key (Hugging Face's files, older kiln's): any of the three, even mixed */
    CHECK_OK(check_json("{\"__metadata__\":{\"format\":\"pt\"},"
                        "\"a\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                        "\"b\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[2,4]},"
                        "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        8, &declared, &dt));
    CHECK_INT_EQ(declared, 0);
    CHECK_OK(check_json("{}", 0, &declared, NULL));
    CHECK_INT_EQ(declared, 0);

    /* The writer never produces a file the check refuses. */
    float x[2] = {1, 2};
    int64_t two = 2;
    kiln_safetensors_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add_as(w, "ok", KILN_DTYPE_BF16, 1, &two, KILN_DTYPE_F32, x));
    CHECK_OK(
        kiln_safetensors_writer_add(w, "h.1.mlp.c_proj.weight", KILN_ST_DTYPE_F32, 1, &two, x));
    CHECK_OK(kiln_safetensors_writer_declare_dtype(w, KILN_DTYPE_BF16));
    CHECK_STATUS(kiln_safetensors_writer_to_memory(w, &mem, &size), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "h.1.mlp.c_proj.weight") != NULL);
    char path[512];
    test_path(path, sizeof path, dir, "never.safetensors");
    CHECK_STATUS(kiln_safetensors_writer_write(w, path), KILN_ERR_ARG);
    CHECK_TRUE(access(path, F_OK) != 0);
    CHECK_OK(kiln_safetensors_writer_set_metadata(w, KILN_ST_META_DTYPE, "bogus"));
    CHECK_STATUS(kiln_safetensors_writer_to_memory(w, &mem, &size), KILN_ERR_ARG);
    CHECK_STATUS(kiln_safetensors_writer_declare_dtype(w, (kiln_dtype)7), KILN_ERR_ARG);
    kiln_safetensors_writer_free(w);
}

/* A tensor several chunks long, with a partial last chunk, written to a file while converting:
 * the same bits as converting it whole. */
static void test_chunked_write(void) {
    int64_t n = 3 * KILN__ST_CHUNK + 12345;
    float *v = test_values(n);
    uint16_t *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
    for (int si = 1; si < 3; si++) {
        kiln_dtype s = all_types[si];
        kiln_convert(want, s, v, KILN_DTYPE_F32, n);
        kiln_safetensors_writer *w = NULL;
        CHECK_OK(kiln_safetensors_writer_init(&w));
        int64_t shape[2] = {1, n};
        CHECK_OK(kiln_safetensors_writer_add_as(w, "big", s, 2, shape, KILN_DTYPE_F32, v));
        CHECK_OK(kiln_safetensors_writer_declare_dtype(w, s));
        char path[512];
        test_path(path, sizeof path, dir, "big.safetensors");
        CHECK_OK(kiln_safetensors_writer_write(w, path));
        kiln_safetensors_writer_free(w);
        kiln_safetensors *f = NULL;
        CHECK_OK(kiln_safetensors_open(&f, path));
        const kiln_st_tensor *t = f ? kiln_safetensors_find(f, "big") : NULL;
        CHECK_TRUE(t && t->nbytes == (size_t)n * 2 && same_bits(t->data, want, s, n));
        int declared = 0;
        if (f)
            CHECK_OK(kiln_safetensors_check_dtype(f, &declared, NULL));
        CHECK_INT_EQ(declared, 1);
        if (t)
            CHECK_OK(kiln_safetensors_read_as(f, t, s, got));
        CHECK_TRUE(same_bits(got, want, s, n));
        kiln_safetensors_close(f);
        remove(path);
    }
    free(v), free(want), free(got);
}

/* Tensors whose bytes are not aligned to their dtype (an odd-length 16-bit tensor before
 * them), converted on the way in and on the way out. */
static void test_unaligned(void) {
    int64_t n = KILN__ST_CHUNK + 9, three = 3;
    float *v = test_values(n);
    uint16_t pad[3] = {1, 2, 3};
    kiln_safetensors_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add(w, "pad", KILN_ST_DTYPE_BF16, 1, &three, pad));
    /* stored F32 at data offset 6: the writer converts into unaligned memory */
    uint16_t *held = malloc((size_t)n * 2);
    kiln_convert(held, KILN_DTYPE_BF16, v, KILN_DTYPE_F32, n);
    CHECK_OK(
        kiln_safetensors_writer_add_as(w, "f32", KILN_DTYPE_F32, 1, &n, KILN_DTYPE_BF16, held));
    CHECK_OK(kiln_safetensors_writer_to_memory(w, &mem, &size));
    kiln_safetensors_writer_free(w);
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open_memory(&f, mem, size, "odd.safetensors"));
    const kiln_st_tensor *t = f ? kiln_safetensors_find(f, "f32") : NULL;
    CHECK_TRUE(t && t->offset == 6 && !kiln__st_aligned(t->data, KILN_DTYPE_F32));
    float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    kiln_convert(want, KILN_DTYPE_F32, held, KILN_DTYPE_BF16, n);
    CHECK_TRUE(t && same_bits(t->data, want, KILN_DTYPE_F32, n));
    for (int li = 0; t && li < 3; li++) {
        kiln_dtype l = all_types[li];
        kiln_convert(got, l, want, KILN_DTYPE_F32, n); /* reference into got, then compare */
        void *out = malloc((size_t)n * 4);
        CHECK_OK(kiln_safetensors_read_as(f, t, l, out));
        CHECK_TRUE(same_bits(out, got, l, n));
        free(out);
    }
    kiln_safetensors_close(f);
    free(mem), free(v), free(held), free(want), free(got);
}

static void test_read_errors(void) {
    int64_t w_i64[2] = {1, 2}, two = 2;
    kiln_safetensors_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add(w, "ids", KILN_ST_DTYPE_I64, 1, &two, w_i64));
    CHECK_OK(kiln_safetensors_writer_to_memory(w, &mem, &size));
    CHECK_STATUS(
        kiln_safetensors_writer_add_as(w, "x", (kiln_dtype)5, 1, &two, KILN_DTYPE_F32, w_i64),
        KILN_ERR_ARG);
    kiln_safetensors_writer_free(w);
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open_memory(&f, mem, size, "ids.safetensors"));
    float out[2];
    if (f) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, 0);
        CHECK_STATUS(kiln_safetensors_read_as(f, t, KILN_DTYPE_BF16, out), KILN_ERR_DTYPE);
        CHECK_TRUE(strstr(kiln_error_message(), "ids.safetensors") &&
                   strstr(kiln_error_message(), "\"ids\"") && strstr(kiln_error_message(), "I64"));
        CHECK_STATUS(kiln_safetensors_read_f32(f, t, out), KILN_ERR_DTYPE);
        CHECK_STATUS(kiln_safetensors_check_fits(f, t, KILN_DTYPE_F32), KILN_ERR_DTYPE);
        CHECK_TRUE(strstr(kiln_error_message(), "\"ids\"") != NULL);
        CHECK_STATUS(kiln_safetensors_read_as(f, t, (kiln_dtype)3, out), KILN_ERR_ARG);
    }
    kiln_safetensors_close(f);
    free(mem);
    kiln_dtype k;
    CHECK_INT_EQ(kiln_st_dtype_from_kiln(KILN_DTYPE_F16), KILN_ST_DTYPE_F16);
    CHECK_INT_EQ(kiln_st_dtype_from_kiln((kiln_dtype)9), KILN_ST_DTYPE_COUNT);
    CHECK_OK(kiln_st_dtype_to_kiln(KILN_ST_DTYPE_BF16, &k));
    CHECK_INT_EQ(k, KILN_DTYPE_BF16);
    CHECK_STATUS(kiln_st_dtype_to_kiln(KILN_ST_DTYPE_F64, &k), KILN_ERR_DTYPE);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "safetensors_dtype");
    RUN_TEST(test_every_combination);
    RUN_TEST(test_bf16_round_trip);
    RUN_TEST(test_f16_overflow_read);
    RUN_TEST(test_f16_overflow_write);
    RUN_TEST(test_declared_dtype);
    RUN_TEST(test_chunked_write);
    RUN_TEST(test_unaligned);
    RUN_TEST(test_read_errors);
    test_rmtree(dir);
    TEST_MAIN_END();
}
