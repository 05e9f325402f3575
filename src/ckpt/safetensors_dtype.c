/* safetensors element types and the exact conversions of 16-bit floats to float. */
#include <string.h>

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


