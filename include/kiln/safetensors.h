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
 * failed write leaves no temporary behind and an existing file byte-for-byte as it was.
 *
 * Mixed precision: a tensor stored F32, BF16 or F16 reads into memory of any kiln_dtype, and
 * one held in any kiln_dtype is stored in any of the three, converted with kiln_convert (round
 * to nearest, ties to even) a chunk at a time, never through a copy of the whole tensor. A
 * value that does not fit F16 (one that rounds past 65504) is an error naming the tensor and
 * the value, never a silent infinity. kiln records the dtype it stored weights in under the
 * metadata key KILN_ST_META_DTYPE; kiln_safetensors_check_dtype holds a file to it. */
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
/* The format's type for a kiln dtype (KILN_ST_DTYPE_COUNT for a value out of range). */
kiln_st_dtype kiln_st_dtype_from_kiln(kiln_dtype t);
/* The kiln dtype of F32, BF16 or F16; KILN_ERR_DTYPE (without setting a message) otherwise. */
kiln_status kiln_st_dtype_to_kiln(kiln_st_dtype t, kiln_dtype *out);

/* The metadata key holding the dtype kiln stored a file's tensors in, with the value
 * kiln_dtype_name gives: "fp32", "bf16" or "fp16". */
#define KILN_ST_META_DTYPE "kiln.dtype"

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

/* Read a tensor stored F32, BF16 or F16 into out, t->numel elements of dst_type (out aligned
 * for dst_type; the file's bytes need not be). Same dtype: the bytes as stored. Otherwise
 * kiln_convert's rounding (to nearest, ties to even; widening is exact; infinities and NaNs
 * stay what they are). Errors name the file and the tensor: KILN_ERR_DTYPE for any other
 * stored dtype; KILN_ERR_RANGE, with the element's index and value, for a finite value that
 * rounds past F16's 65504 when dst_type is F16 (out is then partly written); KILN_ERR_ARG for
 * a dst_type out of range. Large tensors are converted in chunks, threaded with OpenMP. */
kiln_status kiln_safetensors_read_as(const kiln_safetensors *f, const kiln_st_tensor *t,
                                     kiln_dtype dst_type, void *out);

/* Whether kiln_safetensors_read_as(f, t, dst_type, ..) would succeed, writing nothing: the
 * same errors, found by converting a chunk at a time into scratch (work only for F32 or BF16
 * read as F16). A loader checks every tensor with it before copying any, so that a file that
 * does not fit leaves the destination as it was. */
kiln_status kiln_safetensors_check_fits(const kiln_safetensors *f, const kiln_st_tensor *t,
                                        kiln_dtype dst_type);

/* Convert a tensor of dtype F32, F16, BF16 or F64 to floats: out holds t->numel floats.
 * Other dtypes fail with KILN_ERR_DTYPE naming the file and the tensor. F16 and BF16
 * convert exactly (subnormals, infinities and NaNs included). */
kiln_status kiln_safetensors_read_f32(const kiln_safetensors *f, const kiln_st_tensor *t,
                                      float *out);

/* Hold a file to the dtype its metadata declares (KILN_ST_META_DTYPE). Without the key
 * (Hugging Face's files, kiln's before it wrote one): KILN_OK, *declared = 0, tensors of any
 * dtype. With it: *declared = 1 and *dtype the declared dtype, when every tensor is stored in
 * it; else KILN_ERR_DTYPE naming the file, the declared dtype and the first tensor (in data
 * order) stored otherwise, or KILN_ERR_FORMAT when the value names no kiln dtype.
 * declared and dtype may be NULL. */
kiln_status kiln_safetensors_check_dtype(const kiln_safetensors *f, int *declared,
                                         kiln_dtype *dtype);

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
/* Add a tensor held as numel elements of src_type at `src` (borrowed until the write, aligned
 * for src_type), to be stored as stored_type: converted while it is written, a chunk at a
 * time. Checks as for kiln_safetensors_writer_add. A value that does not fit (a finite one
 * rounding past F16's 65504) fails the write with KILN_ERR_RANGE naming the tensor, the
 * element and its value; kiln_safetensors_writer_write then leaves the target as it was. */
kiln_status kiln_safetensors_writer_add_as(kiln_safetensors_writer *w, const char *name,
                                           kiln_dtype stored_type, int ndim, const int64_t *shape,
                                           kiln_dtype src_type, const void *src);
/* Set a metadata entry (a later value for the same key replaces the earlier one). */
kiln_status kiln_safetensors_writer_set_metadata(kiln_safetensors_writer *w, const char *key,
                                                 const char *value);
/* Declare that every tensor is stored as t (metadata KILN_ST_META_DTYPE = kiln_dtype_name(t)).
 * A write whose declared dtype (set here or through set_metadata) is not a kiln dtype, or is
 * not some tensor's stored dtype, fails with KILN_ERR_ARG naming that tensor: kiln never
 * writes a file that kiln_safetensors_check_dtype refuses. */
kiln_status kiln_safetensors_writer_declare_dtype(kiln_safetensors_writer *w, kiln_dtype t);

/* Write atomically to `path` (temporary file in the same folder, fsync, rename). */
kiln_status kiln_safetensors_writer_write(const kiln_safetensors_writer *w, const char *path);
/* The same bytes into one buffer, which the caller frees with free(). */
kiln_status kiln_safetensors_writer_to_memory(const kiln_safetensors_writer *w, void **out,
                                              size_t *size);

#ifdef __cplusplus
}
#endif
#endif
