/* GGUF's q8_0 and q4_0 blocks (src/compress/gguf.c): layout and error bounds. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kiln/compress.h"
#include "kiln/dtype.h"
#include "test.h"

static void test_layout(void) {
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16); /* amax 16 at j = 0: the value -16 */
    uint8_t q8[34], q4[18];
    kiln_quantize_q8_0(q8, x, 32);
    CHECK_NEAR(kiln_f16_to_f32((uint16_t)(q8[0] | q8[1] << 8)), 16.0 / 127.0, 1e-3);
    CHECK_INT_EQ((int8_t)q8[2], -127); /* -16 */
    CHECK_INT_EQ((int8_t)q8[2 + 16], 0);
    kiln_quantize_q4_0(q4, x, 32);
    /* the largest magnitude, -16, is -8 x d with d = 2: code 0; 0 is code 8 */
    CHECK_NEAR(kiln_f16_to_f32((uint16_t)(q4[0] | q4[1] << 8)), 2.0, 1e-6);
    CHECK_INT_EQ(q4[2] & 15, 0);
    CHECK_INT_EQ(q4[2] >> 4, 8); /* element 16 (value 0) shares byte 0 */
    CHECK_INT_EQ(q4[2 + 15] >> 4, 15); /* element 31, value 15: 7.5 + 8.5, clamped to 15 */
}

static void test_error_bounds(void) {
    enum { N = 32 * 64 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *b = malloc(N / 32 * 34);
    srand(7);
    for (int i = 0; i < N; i++)
        x[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
    kiln_quantize_q8_0(b, x, N);
    kiln_dequantize_q8_0(y, b, N);
    int bad8 = 0, bad4 = 0;
    for (int k = 0; k < N / 32; k++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[32 * k + j]));
        for (int j = 0; j < 32; j++) /* half a step, and the f16 scale's rounding */
            bad8 += fabsf(y[32 * k + j] - x[32 * k + j]) > amax / 127 * 0.5f + amax * 1e-3f;
    }
    kiln_quantize_q4_0(b, x, N);
    kiln_dequantize_q4_0(y, b, N);
    for (int k = 0; k < N / 32; k++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[32 * k + j]));
        for (int j = 0; j < 32; j++) /* a step (the top code is clamped), and rounding */
            bad4 += fabsf(y[32 * k + j] - x[32 * k + j]) > amax / 8 + amax * 1e-3f;
    }
    CHECK_INT_EQ(bad8, 0);
    CHECK_INT_EQ(bad4, 0);
    free(x);
    free(y);
    free(b);
}

static void test_type_names(void) {
    kiln_gguf_type t;
    CHECK_OK(kiln_gguf_type_parse("q4_0", &t));
    CHECK_INT_EQ(t, KILN_GGUF_Q4_0);
    CHECK_STR_EQ(kiln_gguf_type_name(KILN_GGUF_Q8_0), "q8_0");
    CHECK_STATUS(kiln_gguf_type_parse("q5_k", &t), KILN_ERR_ARG);
}

int main(void) {
    RUN_TEST(test_layout);
    RUN_TEST(test_error_bounds);
    RUN_TEST(test_type_names);
    TEST_MAIN_END();
}
