/* Element types and conversions (include/kiln/dtype.h). The scalar conversions are written
 * for the compiler to vectorise inside `omp simd` loops. (AVX512-BF16's VCVTNEPS2BF16 is not
 * used: it flushes subnormal inputs to zero, so its bits would differ from these.) */
#include "kiln/dtype.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "core/dtype_inline.h"
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

uint16_t kiln_f32_to_bf16(float x) { return kiln__to_bf16(x); }
float kiln_bf16_to_f32(uint16_t x) { return kiln__from_bf16(x); }

uint16_t kiln_f32_to_bf16_stochastic(float x, uint32_t r) {
    uint32_t u = kiln__bits(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u) /* inf and NaN are kept */
        return kiln__to_bf16(x);
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

uint16_t kiln_f32_to_f16(float x) { return kiln__to_f16(x); }
float kiln_f16_to_f32(uint16_t x) { return kiln__from_f16(x); }

enum { PARALLEL_MIN = 1 << 16 }; /* below this a thread team costs more than it saves */

static void f32_to_bf16_n(uint16_t *d, const float *s, int64_t n) {
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        d[i] = kiln__to_bf16(s[i]);
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
            d[i] = kiln__from_bf16(s[i]);
    } else if (st == KILN_DTYPE_F32 && dt == KILN_DTYPE_F16) {
        const float *s = src;
        uint16_t *d = dst;
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = kiln__to_f16(s[i]);
    } else if (st == KILN_DTYPE_F16 && dt == KILN_DTYPE_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = kiln__from_f16(s[i]);
    } else { /* BF16 <-> F16 through F32, one value at a time */
        const uint16_t *s = src;
        uint16_t *d = dst;
        int to_half = dt == KILN_DTYPE_F16;
#pragma omp parallel for simd schedule(simd : static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = to_half ? kiln__to_f16(kiln__from_bf16(s[i])) : kiln__to_bf16(kiln__from_f16(s[i]));
    }
}
