/* libFuzzer target for the safetensors reader and writer.
 *
 * For any input: opening either fails with a message naming the file, or yields tensors
 * whose bytes all lie inside the input, tile the data buffer, convert to floats when they
 * are floats, read as each kiln dtype (F16 failing only on a value past 65504, with the
 * tensor named), and survive a write and re-read unchanged, or, converted to each kiln
 * dtype, read back as kiln_convert gives. The writer refuses the file exactly when
 * kiln_safetensors_check_dtype does. Any broken promise traps. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/safetensors.h"

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

static unsigned touch(const kiln_st_tensor *t) {
    const unsigned char *p = t->data;
    unsigned sum = 0;
    for (size_t i = 0; i < t->nbytes; i++)
        sum += p[i];
    return sum;
}

static int is_float(kiln_st_dtype d) {
    return d == KILN_ST_DTYPE_F32 || d == KILN_ST_DTYPE_F16 || d == KILN_ST_DTYPE_BF16 ||
           d == KILN_ST_DTYPE_F64;
}

/* Write every tensor and metadata entry back out and read the result: the same listing.
 * `consistent`: the file passes kiln_safetensors_check_dtype, so the writer must take it. */
static void round_trip(const kiln_safetensors *f, int consistent) {
    kiln_safetensors_writer *w = NULL;
    REQUIRE(kiln_safetensors_writer_init(&w) == KILN_OK);
    int n = kiln_safetensors_num_tensors(f);
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        REQUIRE(kiln_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data) ==
                KILN_OK);
    }
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        REQUIRE(kiln_safetensors_writer_set_metadata(w, k, v) == KILN_OK);
    }
    void *mem = NULL;
    size_t size = 0;
    kiln_status s = kiln_safetensors_writer_to_memory(w, &mem, &size);
    kiln_safetensors_writer_free(w);
    if (s == KILN_ERR_NOMEM)
        return;
    REQUIRE(s == (consistent ? KILN_OK : KILN_ERR_ARG));
    if (s != KILN_OK)
        return;
    kiln_safetensors *g = NULL;
    REQUIRE(kiln_safetensors_open_memory(&g, mem, size, "rewritten") == KILN_OK);
    REQUIRE(kiln_safetensors_num_tensors(g) == n);
    REQUIRE(kiln_safetensors_num_metadata(g) == kiln_safetensors_num_metadata(f));
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *a = kiln_safetensors_tensor(f, i);
        const kiln_st_tensor *b = kiln_safetensors_tensor(g, i);
        REQUIRE(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim);
        REQUIRE(a->offset == b->offset && a->nbytes == b->nbytes);
        REQUIRE(memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim) == 0);
        REQUIRE(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    }
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        const char *v2 = kiln_safetensors_metadata(g, k);
        REQUIRE(v2 && strcmp(v, v2) == 0);
    }
    kiln_safetensors_close(g);
    free(mem);
}

/* The message names the tensor (messages cut long names to their first 120 bytes). */
static int names(const char *name) {
    char head[101];
    snprintf(head, sizeof head, "%s", name);
    return strstr(kiln_error_message(), head) != NULL;
}

static int f16_overflows(float x) {
    return isfinite(x) && isinf(kiln_f16_to_f32(kiln_f32_to_f16(x)));
}

/* Re-store `out` (t->numel elements of d) in t's own dtype st with the converting writer: when
 * d is st or F32, which hold every value of st, the stored bytes are t's (NaNs aside). */
static void restore(const kiln_st_tensor *t, kiln_dtype st, kiln_dtype d, const void *out,
                    const float *wide) {
    kiln_safetensors_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    REQUIRE(kiln_safetensors_writer_init(&w) == KILN_OK);
    REQUIRE(kiln_safetensors_writer_add_as(w, t->name, st, t->ndim, t->shape, d, out) == KILN_OK);
    kiln_status s = kiln_safetensors_writer_to_memory(w, &mem, &size);
    kiln_safetensors_writer_free(w);
    int lossless = d == st || d == KILN_DTYPE_F32;
    REQUIRE(s == KILN_OK || s == KILN_ERR_NOMEM ||
            (!lossless && s == KILN_ERR_RANGE && names(t->name)));
    if (s != KILN_OK)
        return;
    kiln_safetensors *g = NULL;
    REQUIRE(kiln_safetensors_open_memory(&g, mem, size, "restored") == KILN_OK);
    const kiln_st_tensor *u = kiln_safetensors_tensor(g, 0);
    REQUIRE(u && u->dtype == t->dtype && u->nbytes == t->nbytes);
    size_t z = kiln_dtype_size(st);
    for (int64_t i = 0; lossless && i < t->numel; i++)
        REQUIRE(isnan(wide[i]) || memcmp((const char *)u->data + (size_t)i * z,
                                         (const char *)t->data + (size_t)i * z, z) == 0);
    kiln_safetensors_close(g);
    free(mem);
}

/* A float tensor read as each kiln dtype: the bits of kiln_convert from its exact F32 values
 * (NaN payloads aside), and to F16 a failure naming the tensor exactly when a finite value
 * rounds past 65504, which kiln_safetensors_check_fits predicts. Other dtypes are refused. */
static void read_as_each(const kiln_safetensors *f, const kiln_st_tensor *t) {
    kiln_dtype st;
    if (kiln_st_dtype_to_kiln(t->dtype, &st) != KILN_OK) {
        float x;
        REQUIRE(kiln_safetensors_read_as(f, t, KILN_DTYPE_F32, &x) == KILN_ERR_DTYPE);
        REQUIRE(kiln_safetensors_check_fits(f, t, KILN_DTYPE_BF16) == KILN_ERR_DTYPE);
        REQUIRE(strstr(kiln_error_message(), "fuzz-input"));
        return;
    }
    size_t bytes = (size_t)t->numel * 4 + 4;
    float *wide = malloc(bytes);
    void *out = malloc(bytes), *want = malloc(bytes);
    REQUIRE(wide && out && want);
    REQUIRE(kiln_safetensors_read_as(f, t, KILN_DTYPE_F32, wide) == KILN_OK);
    int overflow = 0;
    for (int64_t i = 0; i < t->numel; i++)
        overflow |= f16_overflows(wide[i]);
    for (int k = 0; k < KILN_DTYPE_COUNT; k++) {
        kiln_dtype d = (kiln_dtype)k;
        kiln_status fits = kiln_safetensors_check_fits(f, t, d);
        kiln_status s = kiln_safetensors_read_as(f, t, d, out);
        REQUIRE(fits == s);
        if (d == KILN_DTYPE_F16 && st != KILN_DTYPE_F16 && overflow) {
            REQUIRE(s == KILN_ERR_RANGE && names(t->name));
            continue;
        }
        REQUIRE(s == KILN_OK);
        kiln_convert(want, d, wide, KILN_DTYPE_F32, t->numel);
        size_t z = kiln_dtype_size(d);
        for (int64_t i = 0; i < t->numel; i++)
            REQUIRE(isnan(wide[i]) ||
                    memcmp((char *)out + (size_t)i * z, (char *)want + (size_t)i * z, z) == 0);
        restore(t, st, d, out, wide);
    }
    free(wide);
    free(out);
    free(want);
}

/* Keeps the reads of every byte from being optimised away. */
static volatile unsigned fuzz_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_safetensors *f = NULL;
    kiln_status s = kiln_safetensors_open_memory(&f, data, size, "fuzz-input");
    if (s != KILN_OK) {
        REQUIRE(f == NULL);
        REQUIRE(s == KILN_ERR_FORMAT || s == KILN_ERR_UNSUPPORTED || s == KILN_ERR_NOMEM);
        REQUIRE(strstr(kiln_error_message(), "fuzz-input") != NULL);
        return 0;
    }
    int n = kiln_safetensors_num_tensors(f);
    size_t expect = 0;
    unsigned sink = 0;
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        const unsigned char *p = t->data;
        REQUIRE(p >= data && p + t->nbytes <= data + size);
        REQUIRE(t->offset == expect);
        REQUIRE(t->nbytes == (size_t)t->numel * kiln_st_dtype_size(t->dtype));
        expect += t->nbytes;
        REQUIRE(kiln_safetensors_find(f, t->name) == t);
        sink += touch(t);
        if (is_float(t->dtype)) {
            float *out = malloc((size_t)t->numel * sizeof(float) + 1);
            REQUIRE(out != NULL);
            REQUIRE(kiln_safetensors_read_f32(f, t, out) == KILN_OK);
            for (int64_t k = 0; k < t->numel; k++)
                sink += out[k] == out[k];
            free(out);
            read_as_each(f, t);
        }
    }
    REQUIRE(8 + expect <= size);
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        REQUIRE(k && v && kiln_safetensors_metadata(f, k) != NULL);
    }
    fuzz_sink = sink;
    int declared = 0;
    kiln_dtype dt;
    s = kiln_safetensors_check_dtype(f, &declared, &dt);
    REQUIRE(s == KILN_OK || s == KILN_ERR_DTYPE || s == KILN_ERR_FORMAT);
    REQUIRE(s == KILN_OK || strstr(kiln_error_message(), "fuzz-input"));
    round_trip(f, s == KILN_OK);
    kiln_safetensors_close(f);
    return 0;
}
