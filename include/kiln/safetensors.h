/* kiln: reading and writing safetensors files.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON (padded with spaces)
 *   {"__metadata__": {"key": "value", ...},
 *    "name": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
 * then the data buffer. Offsets are bytes into the data buffer; tensors are row-major,
 * little-endian, and tile the buffer exactly (no overlap, no holes, nothing after the last).
 *
 * The reader checks all of that when a file is opened: a file that opens is safe to read
 * through every kiln_st_tensor it lists. Any violation is KILN_ERR_FORMAT with a message
 * naming the file and the tensor. Files are memory-mapped, not copied.
 *
 * The writer collects tensors (borrowed pointers) and metadata, then writes a temporary
 * file in the target's folder, flushes it to disk and renames it over the final name: a
 * failed write leaves no temporary behind and an existing file byte-for-byte as it was. */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/dtype.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of the format (those of whole bytes). */
typedef enum kiln_st_dtype {
    KILN_ST_DTYPE_BOOL,
    KILN_ST_DTYPE_U8,
    KILN_ST_DTYPE_I8,
    KILN_ST_DTYPE_F8_E5M2,
    KILN_ST_DTYPE_F8_E4M3,
    KILN_ST_DTYPE_I16,
    KILN_ST_DTYPE_U16,
    KILN_ST_DTYPE_F16,
    KILN_ST_DTYPE_BF16,
    KILN_ST_DTYPE_I32,
    KILN_ST_DTYPE_U32,
    KILN_ST_DTYPE_F32,
    KILN_ST_DTYPE_F64,
    KILN_ST_DTYPE_I64,
    KILN_ST_DTYPE_U64,
    KILN_ST_DTYPE_COUNT
} kiln_st_dtype;

/* The format's name ("F32", "BF16", ...), or "?" for a value out of range. */
const char *kiln_st_dtype_name(kiln_st_dtype t);
/* Bytes per element (0 for a value out of range). */
size_t kiln_st_dtype_size(kiln_st_dtype t);
/* Parse a dtype name; KILN_ERR_FORMAT (without setting a message) when unknown. */
kiln_status kiln_st_dtype_parse(const char *name, kiln_st_dtype *out);

#define KILN_ST_MAX_DIMS 8
/* Headers larger than this are refused as malformed rather than parsed. */
#define KILN_ST_MAX_HEADER ((size_t)100 * 1000 * 1000)

/* One tensor of an open file. Valid until the file is closed. */
typedef struct kiln_st_tensor {
    const char *name;
    kiln_st_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[KILN_ST_MAX_DIMS];
    int64_t numel;    /* product of shape (1 for a scalar) */
    size_t offset;    /* bytes from the start of the data buffer */
    size_t nbytes;    /* numel x dtype size */
    const void *data; /* the bytes, little-endian; NOT necessarily aligned to the dtype */
} kiln_st_tensor;

/* ---- reading ---- */

typedef struct kiln_safetensors kiln_safetensors; /* opaque */

/* Open and validate a file. On success *out must be closed with kiln_safetensors_close. */
kiln_status kiln_safetensors_open(kiln_safetensors **out, const char *path);
/* The same over bytes in memory, which are borrowed: they must stay valid and unchanged until
 * the handle is closed. `name` (may be NULL) stands for the file in messages. */
kiln_status kiln_safetensors_open_memory(kiln_safetensors **out, const void *bytes, size_t size,
                                         const char *name);
void kiln_safetensors_close(kiln_safetensors *f); /* NULL is safe */

/* The path (or name) given at open. */
const char *kiln_safetensors_path(const kiln_safetensors *f);

/* Tensors in the order of their data in the file. */
int kiln_safetensors_num_tensors(const kiln_safetensors *f);
const kiln_st_tensor *kiln_safetensors_tensor(const kiln_safetensors *f, int i);
/* By exact name, or NULL. */
const kiln_st_tensor *kiln_safetensors_find(const kiln_safetensors *f, const char *name);

/* __metadata__ entries, in the file's order; values are strings. */
int kiln_safetensors_num_metadata(const kiln_safetensors *f);
void kiln_safetensors_metadata_at(const kiln_safetensors *f, int i, const char **key,
                                  const char **value);
/* The value of a metadata key, or NULL. */
const char *kiln_safetensors_metadata(const kiln_safetensors *f, const char *key);

/* Convert a tensor of dtype F32, F16, BF16 or F64 to floats: out holds t->numel floats.
 * Other dtypes fail with KILN_ERR_DTYPE naming the file and the tensor. F16 and BF16
 * convert exactly (subnormals, infinities and NaNs included). */
kiln_status kiln_safetensors_read_f32(const kiln_safetensors *f, const kiln_st_tensor *t,
                                      float *out);

/* (Element conversions: kiln/dtype.h.) */

/* ---- writing ---- */

typedef struct kiln_safetensors_writer kiln_safetensors_writer; /* opaque */

kiln_status kiln_safetensors_writer_init(kiln_safetensors_writer **out);
void kiln_safetensors_writer_free(kiln_safetensors_writer *w); /* NULL is safe */

/* Add a tensor. `data` holds numel elements of `dtype` in little-endian order and is
 * borrowed until the write; name and shape are copied. Names must be unique, non-empty and
 * not "__metadata__". ndim 0 is a scalar. */
kiln_status kiln_safetensors_writer_add(kiln_safetensors_writer *w, const char *name,
                                        kiln_st_dtype dtype, int ndim, const int64_t *shape,
                                        const void *data);
/* Set a metadata entry (a later value for the same key replaces the earlier one). */
kiln_status kiln_safetensors_writer_set_metadata(kiln_safetensors_writer *w, const char *key,
                                                 const char *value);

/* Write atomically to `path` (temporary file in the same folder, fsync, rename). */
kiln_status kiln_safetensors_writer_write(const kiln_safetensors_writer *w, const char *path);
/* The same bytes into one buffer, which the caller frees with free(). */
kiln_status kiln_safetensors_writer_to_memory(const kiln_safetensors_writer *w, void **out,
                                              size_t *size);

#ifdef __cplusplus
}
#endif
#endif
