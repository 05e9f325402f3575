/* safetensors element types, their correspondence with kiln's, and conversion between kiln
 * dtypes a chunk at a time (safetensors_internal.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ckpt/safetensors_internal.h"
#include "core/error.h"
#include "kiln/safetensors.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[KILN_ST_DTYPE_COUNT] = {
    [KILN_ST_DTYPE_BOOL] = {"BOOL", 1},       [KILN_ST_DTYPE_U8] = {"U8", 1},
    [KILN_ST_DTYPE_I8] = {"I8", 1},           [KILN_ST_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [KILN_ST_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [KILN_ST_DTYPE_I16] = {"I16", 2},
    [KILN_ST_DTYPE_U16] = {"U16", 2},         [KILN_ST_DTYPE_F16] = {"F16", 2},
    [KILN_ST_DTYPE_BF16] = {"BF16", 2},       [KILN_ST_DTYPE_I32] = {"I32", 4},
    [KILN_ST_DTYPE_U32] = {"U32", 4},         [KILN_ST_DTYPE_F32] = {"F32", 4},
    [KILN_ST_DTYPE_F64] = {"F64", 8},         [KILN_ST_DTYPE_I64] = {"I64", 8},
    [KILN_ST_DTYPE_U64] = {"U64", 8},
};

const char *kiln_st_dtype_name(kiln_st_dtype t) {
    return (unsigned)t < KILN_ST_DTYPE_COUNT ? dtypes[t].name : "?";
}

size_t kiln_st_dtype_size(kiln_st_dtype t) {
    return (unsigned)t < KILN_ST_DTYPE_COUNT ? dtypes[t].size : 0;
}

kiln_status kiln_st_dtype_parse(const char *name, kiln_st_dtype *out) {
    for (int i = 0; name && i < KILN_ST_DTYPE_COUNT; i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (kiln_st_dtype)i;
            return KILN_OK;
        }
    }
    return KILN_ERR_FORMAT;
}

kiln_st_dtype kiln_st_dtype_from_kiln(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32: return KILN_ST_DTYPE_F32;
    case KILN_DTYPE_BF16: return KILN_ST_DTYPE_BF16;
    case KILN_DTYPE_F16: return KILN_ST_DTYPE_F16;
    }
    return KILN_ST_DTYPE_COUNT;
}

kiln_status kiln_st_dtype_to_kiln(kiln_st_dtype t, kiln_dtype *out) {
    switch (t) {
    case KILN_ST_DTYPE_F32: *out = KILN_DTYPE_F32; return KILN_OK;
    case KILN_ST_DTYPE_BF16: *out = KILN_DTYPE_BF16; return KILN_OK;
    case KILN_ST_DTYPE_F16: *out = KILN_DTYPE_F16; return KILN_OK;
    default: return KILN_ERR_DTYPE;
    }
}

int kiln__st_aligned(const void *p, kiln_dtype t) {
    size_t a = kiln_dtype_size(t);
    return a && (uintptr_t)p % a == 0;
}

float kiln__st_value(const void *src, kiln_dtype st, int64_t i) {
    const unsigned char *p = (const unsigned char *)src + (size_t)i * kiln_dtype_size(st);
    if (st == KILN_DTYPE_F32) {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return st == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

/* The first element infinite in d (F16) but finite in s (F32 or BF16), or -1. Only F16 has a
 * smaller range than the others; BF16 has F32's. */
static int64_t first_overflow(const uint16_t *d, const void *s, kiln_dtype st, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if ((d[i] & 0x7fffu) == 0x7c00u && isfinite(kiln__st_value(s, st, i)))
            return i;
    return -1;
}

int64_t kiln__st_convert_chunk(void *dst, kiln_dtype dt, const void *src, kiln_dtype st, int64_t n,
                               void *scratch) {
    if (n <= 0)
        return -1;
    size_t dsize = kiln_dtype_size(dt), ssize = kiln_dtype_size(st);
    if (dt == st) {
        memcpy(dst, src, (size_t)n * dsize);
        return -1;
    }
    const void *s = src;
    void *d = dst;
    if (!kiln__st_aligned(src, st)) {
        memcpy(scratch, src, (size_t)n * ssize);
        s = scratch;
    }
    if (!kiln__st_aligned(dst, dt))
        d = (unsigned char *)scratch + KILN__ST_SCRATCH_BYTES / 2;
    kiln_convert(d, dt, s, st, n);
    int64_t bad = dt == KILN_DTYPE_F16 ? first_overflow(d, s, st, n) : -1;
    if (d != dst)
        memcpy(dst, d, (size_t)n * dsize);
    return bad;
}

kiln_status kiln__st_overflow_error(const char *where, const char *name, int64_t i, float value) {
    return kiln_error_setf(KILN_ERR_RANGE,
                           "%s: tensor \"%.120s\": element %lld is %.9g, which rounds past fp16's "
                           "largest finite value 65504: the tensor does not fit in fp16",
                           where, name, (long long)i, (double)value);
}

kiln_status kiln_safetensors_check_dtype(const kiln_safetensors *f, int *declared,
                                         kiln_dtype *dtype) {
    if (!f)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors check dtype: NULL argument");
    const char *path = kiln_safetensors_path(f);
    const char *v = kiln_safetensors_metadata(f, KILN_ST_META_DTYPE);
    if (declared)
        *declared = v != NULL;
    if (!v) /* Hugging Face's files, and kiln's before it recorded the key */
        return KILN_OK;
    kiln_dtype want;
    if (kiln_dtype_parse(v, &want) != KILN_OK)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: metadata \"" KILN_ST_META_DTYPE "\" is \"%.32s\", not fp32, "
                               "bf16 or fp16",
                               path, v);
    kiln_st_dtype st = kiln_st_dtype_from_kiln(want);
    for (int i = 0; i < kiln_safetensors_num_tensors(f); i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        if (t->dtype != st)
            return kiln_error_setf(KILN_ERR_DTYPE,
                                   "%s: metadata says the weights are %s (" KILN_ST_META_DTYPE
                                   " = \"%.32s\") but tensor \"%.120s\" is %s",
                                   path, kiln_st_dtype_name(st), v, t->name,
                                   kiln_st_dtype_name(t->dtype));
    }
    if (dtype)
        *dtype = want;
    return KILN_OK;
}
