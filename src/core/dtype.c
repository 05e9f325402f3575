/* Element types and conversions (include/kiln/dtype.h). The scalar conversions are written
 * for the compiler to vectorise inside `omp simd` loops. (AVX512-BF16's VCVTNEPS2BF16 is not
 * used: it flushes subnormal inputs to zero, so its bits would differ from these.) */
#include "kiln/dtype.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

size_t kiln_dtype_size(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32: return 4;
    case KILN_DTYPE_BF16: return 2;
    case KILN_DTYPE_F16: return 2;
    }
    return 0;
}

const char *kiln_dtype_name(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32: return "fp32";
    case KILN_DTYPE_BF16: return "bf16";
    case KILN_DTYPE_F16: return "fp16";
    }
    return "?";
}

kiln_status kiln_dtype_parse(const char *s, kiln_dtype *out) {
    static const struct {
        const char *name;
        kiln_dtype t;
    } names[] = {{"fp32", KILN_DTYPE_F32},    {"f32", KILN_DTYPE_F32},  {"float32", KILN_DTYPE_F32},
                 {"bf16", KILN_DTYPE_BF16},   {"bfloat16", KILN_DTYPE_BF16},
                 {"fp16", KILN_DTYPE_F16},    {"f16", KILN_DTYPE_F16},  {"float16", KILN_DTYPE_F16}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(s, names[i].name) == 0) {
            *out = names[i].t;
            return KILN_OK;
        }
    return kiln_error_setf(KILN_ERR_ARG, "unknown precision \"%s\" (expected fp32, bf16 or fp16)",
                           s ? s : "(null)");
}

double kiln_dtype_epsilon(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32: return ldexp(1.0, -24);
    case KILN_DTYPE_BF16: return ldexp(1.0, -8);
    case KILN_DTYPE_F16: return ldexp(1.0, -11);
    }
    return 1.0;
}

static inline uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Round to nearest even on the 16 bits dropped; a NaN keeps a set mantissa bit (quiet). */
static inline uint16_t to_bf16(float x) {
    uint32_t u = bits_of(x);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline float from_bf16(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t kiln_f32_to_bf16(float x) { return to_bf16(x); }
float kiln_bf16_to_f32(uint16_t x) { return from_bf16(x); }

uint16_t kiln_f32_to_bf16_stochastic(float x, uint32_t r) {
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u) /* inf and NaN are kept */
        return to_bf16(x);
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

/* binary32 -> binary16, round to nearest even, with subnormals. */
static inline uint16_t to_f16(float x) {
    uint32_t u = bits_of(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) /* rounds past 65504: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero; add 0.5 and let the FPU round */
        float f = float_of(a) + 0.5f;
        return (uint16_t)(sign | (bits_of(f) - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd; /* rebias the exponent (-112 << 23) and round */
    return (uint16_t)(sign | (a >> 13));
}

static inline float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return float_of(sign | 0x7f800000u | (m << 13));
    if (e == 0) /* zero or subnormal: m x 2^-24 */
        return float_of(sign | bits_of((float)m * 5.9604644775390625e-08f));
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t kiln_f32_to_f16(float x) { return to_f16(x); }
float kiln_f16_to_f32(uint16_t x) { return from_f16(x); }

enum { PARALLEL_MIN = 1 << 16 }; /* below this a thread team costs more than it saves */

static void f32_to_bf16_n(uint16_t *d, const float *s, int64_t n) {
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        d[i] = to_bf16(s[i]);
}

void kiln_convert(void *dst, kiln_dtype dt, const void *src, kiln_dtype st, int64_t n) {
    if (n <= 0)
        return;
    if (dt == st) {
        if (dst != src)
            memmove(dst, src, (size_t)n * kiln_dtype_size(dt));
        return;
    }
    if (st == KILN_DTYPE_F32 && dt == KILN_DTYPE_BF16) {
        f32_to_bf16_n(dst, src, n);
    } else if (st == KILN_DTYPE_BF16 && dt == KILN_DTYPE_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = from_bf16(s[i]);
    } else if (st == KILN_DTYPE_F32 && dt == KILN_DTYPE_F16) {
        const float *s = src;
        uint16_t *d = dst;
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = to_f16(s[i]);
    } else if (st == KILN_DTYPE_F16 && dt == KILN_DTYPE_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = from_f16(s[i]);
    } else { /* BF16 <-> F16 through F32, one value at a time */
        const uint16_t *s = src;
        uint16_t *d = dst;
        int to_half = dt == KILN_DTYPE_F16;
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = to_half ? to_f16(from_bf16(s[i])) : to_bf16(from_f16(s[i]));
    }
}
