/* kiln: element types of tensors and conversions between them.
 *
 * F32 is IEEE binary32; BF16 its top 16 bits (8 exponent bits, 7 mantissa bits: F32's range,
 * a relative precision of 2^-8); F16 is IEEE binary16 (5 exponent bits, 10 mantissa bits:
 * a relative precision of 2^-11, finite up to 65504). Conversions to BF16 and F16 round to
 * nearest, ties to even; NaN stays NaN; F16 overflows to infinity past 65504 (what dynamic
 * loss scaling detects). */
#ifndef KILN_DTYPE_H
#define KILN_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_BF16 = 1,
    KILN_DTYPE_F16 = 2,
} kiln_dtype;
#define KILN_DTYPE_COUNT 3

/* Bytes per element (0 for a value out of range). */
size_t kiln_dtype_size(kiln_dtype t);
/* "fp32", "bf16", "fp16" (the names --precision takes), "?" out of range. */
const char *kiln_dtype_name(kiln_dtype t);
/* Parse "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16"; else
 * KILN_ERR_ARG with a message. */
kiln_status kiln_dtype_parse(const char *s, kiln_dtype *out);
/* The unit roundoff u = 2^-(mantissa bits + 1): a rounded value is within a relative u of
 * the exact one. Tests derive their tolerances from it. */
double kiln_dtype_epsilon(kiln_dtype t);

/* One value. */
uint16_t kiln_f32_to_bf16(float x);
float kiln_bf16_to_f32(uint16_t x);
uint16_t kiln_f32_to_f16(float x);
float kiln_f16_to_f32(uint16_t x);
/* To BF16 with stochastic rounding: round up with probability equal to the fraction of the
 * way to the next BF16 value, given 16 random bits r. Unbiased in expectation. */
uint16_t kiln_f32_to_bf16_stochastic(float x, uint32_t r);

/* n elements of src (type st) into dst (type dt); dst and src do not overlap unless they are
 * the same pointer with the same type. Threaded with OpenMP for large n. */
void kiln_convert(void *dst, kiln_dtype dt, const void *src, kiln_dtype st, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
