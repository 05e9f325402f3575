/* Conversions between kiln's element types as inline functions, for kernels that load and
 * store any dtype: called with a constant dtype inside a force-inlined kernel body, the
 * switch folds away and the loop vectorises as if it were written for that type. Rounding
 * to nearest even; the same bits as kiln_convert (src/core/dtype.c uses these). */
#ifndef KILN_CORE_DTYPE_INLINE_H
#define KILN_CORE_DTYPE_INLINE_H

#include <stdint.h>
#include <string.h>

#include "kiln/dtype.h"

#define KILN_INLINE static inline __attribute__((always_inline))

KILN_INLINE uint32_t kiln__bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

KILN_INLINE float kiln__float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Round to nearest even on the 16 bits dropped; a NaN keeps a set mantissa bit (quiet). */
KILN_INLINE uint16_t kiln__to_bf16(float x) {
    uint32_t u = kiln__bits(x);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

KILN_INLINE float kiln__from_bf16(uint16_t h) { return kiln__float((uint32_t)h << 16); }

/* binary32 -> binary16, round to nearest even, with subnormals; past 65504 rounds to inf. */
KILN_INLINE uint16_t kiln__to_f16(float x) {
    uint32_t u = kiln__bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* subnormal or zero (below 2^-14): add 0.5 and let the FPU round the low bits */
    float sub = kiln__float(a) + 0.5f;
    uint32_t r_sub = kiln__bits(sub) - 0x3f000000u;
    uint32_t r_norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; /* rebias (-112 << 23), round */
    uint32_t r = a < 0x38800000u ? r_sub : r_norm;
    r = a >= 0x477ff000u ? 0x7c00u : r;                                /* overflow: infinity */
    r = a > 0x7f800000u ? 0x7e00u : r;                                 /* NaN stays NaN */
    return (uint16_t)(sign | r);
}

KILN_INLINE float kiln__from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
    uint32_t special = sign | 0x7f800000u | (m << 13);
    uint32_t sub = sign | kiln__bits((float)m * 5.9604644775390625e-08f); /* m x 2^-24 */
    return kiln__float(e == 0x1f ? special : e == 0 ? sub : normal);
}

/* Element i of p, of type dt, as a float. */
KILN_INLINE float kiln__ld(const void *p, int64_t i, kiln_dtype dt) {
    switch (dt) {
    case KILN_DTYPE_BF16: return kiln__from_bf16(((const uint16_t *)p)[i]);
    case KILN_DTYPE_F16: return kiln__from_f16(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Store v as element i of p, of type dt. */
KILN_INLINE void kiln__st(void *p, int64_t i, float v, kiln_dtype dt) {
    switch (dt) {
    case KILN_DTYPE_BF16: ((uint16_t *)p)[i] = kiln__to_bf16(v); break;
    case KILN_DTYPE_F16: ((uint16_t *)p)[i] = kiln__to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* Element i of a row-major buffer of dt: the address, for pointer arithmetic on void *. */
KILN_INLINE void *kiln__at(void *p, int64_t i, kiln_dtype dt) {
    return (char *)p + i * (int64_t)(dt == KILN_DTYPE_F32 ? 4 : 2);
}
KILN_INLINE const void *kiln__cat(const void *p, int64_t i, kiln_dtype dt) {
    return (const char *)p + i * (int64_t)(dt == KILN_DTYPE_F32 ? 4 : 2);
}

/* 16 random bits for stochastic rounding of element i: a hash of (seed, i), splitmix64's
 * finaliser, so the bits depend on nothing else. */
KILN_INLINE uint32_t kiln__round_bits(uint64_t seed, int64_t i) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31)) & 0xffffu;
}

#endif
