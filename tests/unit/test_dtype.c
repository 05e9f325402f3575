/* Element types: names, sizes, and conversions against plain references: every binary16
 * value round-trips; F32 -> BF16/F16 rounds to the nearest value (ties to even) found by
 * search over the representable neighbours; the bulk conversion equals the scalar one;
 * stochastic rounding picks a neighbour and is unbiased. */
#include <float.h>
#include <stdint.h>

#include "kiln/core.h"
#include "kiln/dtype.h"
#include "test.h"

static void test_names(void) {
    kiln_dtype t;
    CHECK_OK(kiln_dtype_parse("bf16", &t));
    CHECK_INT_EQ(t, KILN_DTYPE_BF16);
    CHECK_OK(kiln_dtype_parse("FP16", &t));
    CHECK_INT_EQ(t, KILN_DTYPE_F16);
    CHECK_OK(kiln_dtype_parse("float32", &t));
    CHECK_INT_EQ(t, KILN_DTYPE_F32);
    CHECK_STATUS(kiln_dtype_parse("fp8", &t), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "fp8") != NULL);
    CHECK_INT_EQ(kiln_dtype_size(KILN_DTYPE_BF16), 2);
    CHECK_INT_EQ(kiln_dtype_size(KILN_DTYPE_F32), 4);
    CHECK_STR_EQ(kiln_dtype_name(KILN_DTYPE_F16), "fp16");
    CHECK_TRUE(kiln_dtype_epsilon(KILN_DTYPE_BF16) == 1.0 / 256);
    CHECK_TRUE(kiln_dtype_epsilon(KILN_DTYPE_F16) == 1.0 / 2048);
}

/* The representable value nearest x among all 65536 encodings' values (ties: even
 * encoding), by search: a reference that shares no code with the converters. */
static uint16_t nearest(double x, float (*value)(uint16_t), uint16_t inf_bits) {
    if (x != x)
        return 0;
    uint16_t best = 0;
    double bd = INFINITY;
    for (uint32_t h = 0; h < 65536; h++) {
        float v = value((uint16_t)h);
        if (v != v || isinf(v))
            continue;
        if (v == 0.0f && !!signbit(v) != !!signbit(x)) /* zero keeps its sign */
            continue;
        double d = fabs((double)v - x);
        if (d < bd || (d == bd && !(h & 1))) {
            bd = d;
            best = (uint16_t)h;
        }
    }
    /* past the largest finite value by half an ulp or more: infinity */
    float top = value((uint16_t)((inf_bits & 0x7fff) - 1));
    float below = value((uint16_t)((inf_bits & 0x7fff) - 2));
    if (fabs(x) >= (double)top + ((double)top - (double)below) / 2)
        return (uint16_t)(inf_bits | (x < 0 ? 0x8000 : 0));
    return best;
}

static void test_f16_all_values(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_f16_to_f32((uint16_t)h);
        uint16_t back = kiln_f32_to_f16(f);
        if (f != f)
            bad += (back & 0x7c00) != 0x7c00 || !(back & 0x3ff);
        else
            bad += back != h;
    }
    CHECK_INT_EQ(bad, 0);
    CHECK_TRUE(kiln_f16_to_f32(kiln_f32_to_f16(65504.0f)) == 65504.0f);
    CHECK_TRUE(isinf(kiln_f16_to_f32(kiln_f32_to_f16(65520.0f)))); /* the tie rounds up */
    CHECK_TRUE(kiln_f16_to_f32(kiln_f32_to_f16(65519.0f)) == 65504.0f);
    CHECK_TRUE(isnan(kiln_f16_to_f32(kiln_f32_to_f16(NAN))));
    CHECK_TRUE(kiln_bf16_to_f32(kiln_f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f); /* tie to even */
    CHECK_TRUE(kiln_bf16_to_f32(kiln_f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
    CHECK_TRUE(isnan(kiln_bf16_to_f32(kiln_f32_to_bf16(NAN))));
    CHECK_TRUE(isinf(kiln_bf16_to_f32(kiln_f32_to_bf16(FLT_MAX)))); /* rounds past the top */
}

/* Random values over the whole range, subnormals and ties included. */
static float random_float(kiln_rng *r) {
    uint64_t u = kiln_rng_u64(r);
    switch (u % 4) {
    case 0: { /* any bit pattern */
        uint32_t b = (uint32_t)(u >> 32);
        float f;
        memcpy(&f, &b, sizeof f);
        return f;
    }
    case 1: /* the binary16 range, subnormals included */
        return ldexpf(kiln_rng_uniform(r) * 2 - 1, (int)((u >> 8) % 44) - 26);
    case 2: { /* an exact tie for binary16 or bfloat16 */
        uint32_t b = (uint32_t)(u >> 32) & 0xbfffe000u;
        b |= (u & 64) ? 0x1000u : 0x8000u;
        float f;
        memcpy(&f, &b, sizeof f);
        return f;
    }
    default:
        return kiln_rng_normal(r) * 3.0f;
    }
}

static void test_rounding_against_search(void) {
    kiln_rng r;
    kiln_rng_seed(&r, 5);
    int bad_bf = 0, bad_h = 0;
    for (int i = 0; i < 3000; i++) {
        float x = random_float(&r);
        if (x != x || isinf(x))
            continue;
        uint16_t want_h = nearest(x, kiln_f16_to_f32, 0x7c00);
        uint16_t got_h = kiln_f32_to_f16(x);
        if (got_h != want_h && !(x == 0.0f)) {
            if (bad_h++ < 5)
                fprintf(stderr, "f16(%a) = %04x, nearest %04x\n", x, got_h, want_h);
        }
        uint16_t want_b = nearest(x, kiln_bf16_to_f32, 0x7f80);
        uint16_t got_b = kiln_f32_to_bf16(x);
        if (got_b != want_b && !(x == 0.0f)) {
            if (bad_bf++ < 5)
                fprintf(stderr, "bf16(%a) = %04x, nearest %04x\n", x, got_b, want_b);
        }
    }
    CHECK_INT_EQ(bad_h, 0);
    CHECK_INT_EQ(bad_bf, 0);
}

/* kiln_convert over many elements (the threaded, vectorised loops) equals the scalar
 * conversions, every pair of types. */
static void test_bulk_equals_scalar(void) {
    int64_t n = 200003;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint16_t *h = malloc((size_t)n * 2), *b = malloc((size_t)n * 2), *c = malloc((size_t)n * 2);
    kiln_rng r;
    kiln_rng_seed(&r, 9);
    for (int64_t i = 0; i < n; i++)
        x[i] = random_float(&r);
    kiln_convert(b, KILN_DTYPE_BF16, x, KILN_DTYPE_F32, n);
    kiln_convert(h, KILN_DTYPE_F16, x, KILN_DTYPE_F32, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int nan = x[i] != x[i];
        bad += nan ? !isnan(kiln_bf16_to_f32(b[i])) : b[i] != kiln_f32_to_bf16(x[i]);
        bad += nan ? !isnan(kiln_f16_to_f32(h[i])) : h[i] != kiln_f32_to_f16(x[i]);
    }
    CHECK_INT_EQ(bad, 0);
    kiln_convert(y, KILN_DTYPE_F32, b, KILN_DTYPE_BF16, n);
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += memcmp(&y[i], &(float){kiln_bf16_to_f32(b[i])}, 4) != 0;
    kiln_convert(y, KILN_DTYPE_F32, h, KILN_DTYPE_F16, n);
    for (int64_t i = 0; i < n; i++)
        bad += memcmp(&y[i], &(float){kiln_f16_to_f32(h[i])}, 4) != 0;
    kiln_convert(c, KILN_DTYPE_F16, b, KILN_DTYPE_BF16, n);
    for (int64_t i = 0; i < n; i++)
        bad += !isnan(kiln_bf16_to_f32(b[i])) && c[i] != kiln_f32_to_f16(kiln_bf16_to_f32(b[i]));
    CHECK_INT_EQ(bad, 0);
    kiln_convert(y, KILN_DTYPE_F32, x, KILN_DTYPE_F32, n);
    CHECK_TRUE(memcmp(x, y, (size_t)n * 4) == 0);
    free(x), free(y), free(h), free(b), free(c);
}

static void test_stochastic_rounding(void) {
    float x = 1.0f + 1.0f / 1024; /* a quarter of the way from 1 to the next bf16, 1 + 2^-7 */
    float lo = 1.0f, hi = 1.0f + 1.0f / 128;
    kiln_rng r;
    kiln_rng_seed(&r, 3);
    double sum = 0;
    int n = 200000, others = 0;
    for (int i = 0; i < n; i++) {
        float v = kiln_bf16_to_f32(kiln_f32_to_bf16_stochastic(x, (uint32_t)kiln_rng_u64(&r)));
        others += v != lo && v != hi;
        sum += v;
    }
    CHECK_INT_EQ(others, 0);
    /* the mean is x within 5 standard errors of a Bernoulli(1/8) times the gap */
    double se = sqrt(0.125 * 0.875 / n) * (hi - lo);
    CHECK_NEAR(sum / n, x, 5 * se / x);
    CHECK_TRUE(kiln_bf16_to_f32(kiln_f32_to_bf16_stochastic(2.0f, 0xffff)) == 2.0f); /* exact */
    CHECK_TRUE(isinf(kiln_bf16_to_f32(kiln_f32_to_bf16_stochastic(INFINITY, 0xffff))));
    CHECK_TRUE(isnan(kiln_bf16_to_f32(kiln_f32_to_bf16_stochastic(NAN, 0))));
}

int main(void) {
    RUN_TEST(test_names);
    RUN_TEST(test_f16_all_values);
    RUN_TEST(test_rounding_against_search);
    RUN_TEST(test_bulk_equals_scalar);
    RUN_TEST(test_stochastic_rounding);
    TEST_MAIN_END();
}
