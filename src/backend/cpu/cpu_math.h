/* Branch-free float math that the compiler vectorises inside `omp simd` loops (libm's
 * expf and tanhf are calls it cannot vectorise without -ffast-math), and the static work
 * split the CPU backend's loops share. */
#ifndef KILN_BACKEND_CPU_MATH_H
#define KILN_BACKEND_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* e^x with a relative error below 2 ulp where the result is a normal float; 0 below
 * e^-87.3 (about FLT_MIN, so sums of probabilities never meet subnormals) and 2.2e38
 * above e^88.3. -inf gives 0 and NaN gives NaN.
 * x = n ln2 + r with |r| <= ln2/2; e^r by its Taylor polynomial; 2^n built in the
 * exponent bits. */
static inline float kiln__cpu_expf(float xin) {
    /* written so that NaN clamps to -87.3 (every comparison with NaN is false): the
     * float-to-int conversion below must never see a NaN */
    float x = xin > -87.3f ? xin : -87.3f;
    x = x < 88.3f ? x : 88.3f;
    /* round to nearest by the 1.5 * 2^23 trick: exact for |x log2 e| < 2^22 */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f; /* ln2 split in two so n*hi is exact */
    r = r - n * 1.42860682030941723e-06f;
    /* Taylor series to r^7: the r^8/8! remainder is below 6e-9 for |r| <= 0.347 */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float out = xin < -87.3f ? 0.0f : p * scale;
    return xin == xin ? out : xin;
}

/* 1 / (1 + e^-x): tanh(u) = 2 sigmoid(2u) - 1 without the cancellation near -1. */
static inline float kiln__cpu_sigmoidf(float x) { return 1.0f / (1.0f + kiln__cpu_expf(-x)); }

/* [begin, end) of part `i` of `parts` of n elements, boundaries rounded to multiples of
 * 16 floats (a 64-byte line) so that no two threads write the same cache line. */
static inline void kiln__cpu_split(int64_t n, int i, int parts, int64_t *begin, int64_t *end) {
    int64_t lines = (n + 15) / 16;
    int64_t b = lines * i / parts * 16, e = lines * (i + 1) / parts * 16;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

/* Call kernel name_f32, name_bf16 or name_f16 (instantiated per dtype, see cpu_layers.c) for dt. */
#define KILN_CPU_DISPATCH(dt, name, args)                                                          \
    switch (dt) {                                                                                  \
    case KILN_DTYPE_BF16: name##_bf16 args; break;                                                 \
    case KILN_DTYPE_F16: name##_f16 args; break;                                                   \
    default: name##_f32 args; break;                                                               \
    }

#endif
