/* Internal to the safetensors reader and writer: conversion between kiln dtypes one chunk at
 * a time, whatever the alignment of either side (a tensor inside a file need not be aligned
 * to its dtype), with F16's overflow detected rather than stored as an infinity. */
#ifndef KILN_CKPT_SAFETENSORS_INTERNAL_H
#define KILN_CKPT_SAFETENSORS_INTERNAL_H

#include <stdint.h>

#include "kiln/dtype.h"
#include "kiln/status.h"

/* Elements converted at a time: bounded memory however large the tensor (1 MiB of F32),
 * and still a multiple of kiln_convert's threading threshold. */
#define KILN__ST_CHUNK ((int64_t)1 << 18)
/* Bytes of scratch kiln__st_convert_chunk needs: a chunk of F32 for each side. */
#define KILN__ST_SCRATCH_BYTES ((size_t)(2 * KILN__ST_CHUNK * 4))

/* 1 when p is aligned for elements of t. */
int kiln__st_aligned(const void *p, kiln_dtype t);

/* Convert n <= KILN__ST_CHUNK elements of src (type st) into dst (type dt) with kiln_convert.
 * A side that is not aligned for its dtype goes through `scratch` (KILN__ST_SCRATCH_BYTES,
 * 8-aligned; may be NULL when both sides are aligned). Returns the index of the first element
 * that was finite in src and became infinite in dst (a value that rounds past F16's 65504),
 * or -1 when none did; dst is written either way. */
int64_t kiln__st_convert_chunk(void *dst, kiln_dtype dt, const void *src, kiln_dtype st, int64_t n,
                               void *scratch);

/* Element i of src (type st, any alignment) as a float, for messages. */
float kiln__st_value(const void *src, kiln_dtype st, int64_t i);

/* KILN_ERR_RANGE with the message "<where>: tensor "<name>": element <i> is <value>, which
 * rounds past fp16's largest finite value 65504 ..." */
kiln_status kiln__st_overflow_error(const char *where, const char *name, int64_t i, float value);

#endif
