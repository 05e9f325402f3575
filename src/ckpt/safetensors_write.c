/* safetensors writer: collect tensors and metadata, then write atomically (core/fs.h): the
 * target is either the old file, byte for byte, or the complete new one. A tensor added in
 * one kiln dtype to be stored in another is converted as it is written, a chunk at a time
 * (safetensors_internal.h), so no copy of the whole tensor is ever made. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors_internal.h"
#include "core/error.h"
#include "core/fs.h"
#include "kiln/safetensors.h"

typedef struct writer_entry {
    char *name;
    kiln_st_dtype dtype;
    int ndim;
    int64_t shape[KILN_ST_MAX_DIMS];
    size_t nbytes;    /* as stored */
    const void *data; /* borrowed */
    int convert;      /* 1: data holds numel elements of src_type, stored as stored_type */
    kiln_dtype src_type, stored_type;
} writer_entry;

struct kiln_safetensors_writer {
    int n, cap;
    writer_entry *e; /* in the order added, which is the order of the data */
    int n_meta, cap_meta;
    char **meta; /* key i at 2i, value at 2i+1 */
};

kiln_status kiln_safetensors_writer_init(kiln_safetensors_writer **out) {
    if (!out)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: NULL argument");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory");
    return KILN_OK;
}

void kiln_safetensors_writer_free(kiln_safetensors_writer *w) {
    if (!w)
        return;
    for (int i = 0; i < w->n; i++)
        free(w->e[i].name);
    for (int i = 0; i < 2 * w->n_meta; i++)
        free(w->meta[i]);
    free(w->e);
    free(w->meta);
    free(w);
}

/* The checks and bookkeeping of both add functions; *out is the new entry. */
static kiln_status add_entry(kiln_safetensors_writer *w, const char *name, kiln_st_dtype dtype,
                             int ndim, const int64_t *shape, const void *data, writer_entry **out) {
    if (!w || !name || (ndim > 0 && !shape))
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: NULL argument");
    if (!name[0] || strcmp(name, "__metadata__") == 0)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: invalid tensor name \"%s\"",
                               name);
    if ((unsigned)dtype >= KILN_ST_DTYPE_COUNT || ndim < 0 || ndim > KILN_ST_MAX_DIMS)
        return kiln_error_setf(
            KILN_ERR_ARG, "safetensors writer: tensor \"%s\": bad dtype or ndim %d", name, ndim);
    uint64_t numel = 1, nbytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: tensor \"%s\": bad shape",
                                   name);
    }
    if (__builtin_mul_overflow(numel, (uint64_t)kiln_st_dtype_size(dtype), &nbytes) ||
        nbytes > (uint64_t)INT64_MAX)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: tensor \"%s\" is too large",
                               name);
    if (nbytes && !data)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: tensor \"%s\" has no data", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        writer_entry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e)
            return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for tensors");
        w->e = e;
        w->cap = cap;
    }
    writer_entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name)
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for tensors");
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->nbytes = (size_t)nbytes;
    e->data = data;
    w->n++;
    *out = e;
    return KILN_OK;
}

kiln_status kiln_safetensors_writer_add(kiln_safetensors_writer *w, const char *name,
                                        kiln_st_dtype dtype, int ndim, const int64_t *shape,
                                        const void *data) {
    writer_entry *e = NULL;
    return add_entry(w, name, dtype, ndim, shape, data, &e);
}

kiln_status kiln_safetensors_writer_add_as(kiln_safetensors_writer *w, const char *name,
                                           kiln_dtype stored_type, int ndim, const int64_t *shape,
                                           kiln_dtype src_type, const void *src) {
    if (kiln_dtype_size(stored_type) == 0 || kiln_dtype_size(src_type) == 0)
        return kiln_error_setf(KILN_ERR_ARG,
                               "safetensors writer: tensor \"%s\": no such kiln dtype (%d, %d)",
                               name ? name : "?", (int)stored_type, (int)src_type);
    writer_entry *e = NULL;
    KILN_CHECK(add_entry(w, name, kiln_st_dtype_from_kiln(stored_type), ndim, shape, src, &e));
    e->convert = stored_type != src_type;
    e->src_type = src_type;
    e->stored_type = stored_type;
    return KILN_OK;
}

kiln_status kiln_safetensors_writer_set_metadata(kiln_safetensors_writer *w, const char *key,
                                                 const char *value) {
    if (!w || !key || !value)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: NULL argument");
    char *v = strdup(value);
    if (!v)
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for metadata");
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[2 * i], key) == 0) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return KILN_OK;
        }
    }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **m = realloc(w->meta, (size_t)(2 * cap) * sizeof *m);
        if (!m) {
            free(v);
            return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for metadata");
        }
        w->meta = m;
        w->cap_meta = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for metadata");
    }
    w->meta[2 * w->n_meta] = k;
    w->meta[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return KILN_OK;
}

kiln_status kiln_safetensors_writer_declare_dtype(kiln_safetensors_writer *w, kiln_dtype t) {
    if (kiln_dtype_size(t) == 0)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: no such kiln dtype %d", (int)t);
    return kiln_safetensors_writer_set_metadata(w, KILN_ST_META_DTYPE, kiln_dtype_name(t));
}

/* A declared dtype (KILN_ST_META_DTYPE) must name a kiln dtype and be every tensor's: kiln
 * never writes a file that kiln_safetensors_check_dtype would refuse. */
static kiln_status check_declared(const kiln_safetensors_writer *w) {
    const char *v = NULL;
    for (int i = 0; i < w->n_meta && !v; i++)
        if (strcmp(w->meta[2 * i], KILN_ST_META_DTYPE) == 0)
            v = w->meta[2 * i + 1];
    if (!v)
        return KILN_OK;
    kiln_dtype t;
    if (kiln_dtype_parse(v, &t) != KILN_OK)
        return kiln_error_setf(KILN_ERR_ARG,
                               "safetensors writer: metadata \"" KILN_ST_META_DTYPE
                               "\" is \"%.32s\", not fp32, bf16 or fp16",
                               v);
    for (int i = 0; i < w->n; i++)
        if (w->e[i].dtype != kiln_st_dtype_from_kiln(t))
            return kiln_error_setf(KILN_ERR_ARG,
                                   "safetensors writer: the file is declared %s but tensor \"%s\" "
                                   "would be stored as %s",
                                   kiln_dtype_name(t), w->e[i].name,
                                   kiln_st_dtype_name(w->e[i].dtype));
    return KILN_OK;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static kiln_status check_unique(const kiln_safetensors_writer *w) {
    char **names = malloc((size_t)(w->n ? w->n : 1) * sizeof *names);
    if (!names)
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory");
    for (int i = 0; i < w->n; i++)
        names[i] = w->e[i].name;
    qsort(names, (size_t)w->n, sizeof *names, cmp_names);
    kiln_status s = KILN_OK;
    for (int i = 1; i < w->n && s == KILN_OK; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            s = kiln_error_setf(KILN_ERR_ARG, "safetensors writer: tensor \"%s\" added twice",
                                names[i]);
    free(names);
    return s;
}

/* Append an integer written exactly (cJSON's own numbers are doubles). */
static int add_int(cJSON *array, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON *d = cJSON_CreateRaw(buf);
    if (d && cJSON_AddItemToArray(array, d))
        return 1;
    cJSON_Delete(d);
    return 0;
}

/* "name": {"dtype": .., "shape": [..], "data_offsets": [begin, end]}; 0 when out of memory
 * (whatever was attached to root is freed with it). */
static int add_tensor_json(cJSON *root, const writer_entry *e, uint64_t begin) {
    cJSON *obj = cJSON_CreateObject();
    if (!obj || !cJSON_AddItemToObject(root, e->name, obj)) {
        cJSON_Delete(obj);
        return 0;
    }
    if (!cJSON_AddStringToObject(obj, "dtype", kiln_st_dtype_name(e->dtype)))
        return 0;
    cJSON *shape = cJSON_AddArrayToObject(obj, "shape");
    for (int i = 0; i < e->ndim; i++)
        if (!shape || !add_int(shape, (uint64_t)e->shape[i]))
            return 0;
    cJSON *offs = cJSON_AddArrayToObject(obj, "data_offsets");
    return shape && offs && add_int(offs, begin) && add_int(offs, begin + e->nbytes);
}

/* The header JSON padded with spaces to a multiple of 8 (so the data starts 8-aligned),
 * and the size of the data buffer. *out is malloc'd. */
static kiln_status build_header(const kiln_safetensors_writer *w, char **out, size_t *len,
                                size_t *data_size) {
    KILN_CHECK(check_unique(w));
    KILN_CHECK(check_declared(w));
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && w->n_meta) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int i = 0; ok && i < w->n_meta; i++)
            ok = cJSON_AddStringToObject(meta, w->meta[2 * i], w->meta[2 * i + 1]) != NULL;
    }
    uint64_t off = 0;
    for (int i = 0; ok && i < w->n; i++) {
        ok = add_tensor_json(root, &w->e[i], off);
        off += w->e[i].nbytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json)
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for the header");
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    char *h = realloc(json, padded + 1);
    if (!h) {
        free(json);
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for the header");
    }
    memset(h + n, ' ', padded - n);
    h[padded] = '\0';
    *out = h;
    *len = padded;
    *data_size = (size_t)off;
    return KILN_OK;
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Buffers for converting tensors as they are written: `out` takes a chunk in the stored dtype,
 * `scratch` is kiln__st_convert_chunk's. Allocated only when some tensor converts. */
typedef struct convert_buffers {
    unsigned char *out, *scratch;
} convert_buffers;

static kiln_status buffers_init(convert_buffers *b, const kiln_safetensors_writer *w) {
    b->out = b->scratch = NULL;
    int any = 0;
    for (int i = 0; i < w->n; i++)
        any |= w->e[i].convert;
    if (!any)
        return KILN_OK;
    b->out = malloc((size_t)KILN__ST_CHUNK * 4);
    b->scratch = malloc(KILN__ST_SCRATCH_BYTES);
    if (!b->out || !b->scratch) {
        free(b->out);
        free(b->scratch);
        b->out = b->scratch = NULL;
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory to convert tensors");
    }
    return KILN_OK;
}

static void buffers_free(convert_buffers *b) {
    free(b->out);
    free(b->scratch);
}

/* Elements [at, at + n) of a converting entry, in its stored dtype, into dst (n at most a
 * chunk; dst may be unaligned). An element that does not fit the stored dtype fails, naming
 * the tensor and the value; `where` (the file) begins the message. */
static kiln_status convert_range(const char *where, const writer_entry *e, int64_t at, int64_t n,
                                 void *dst, void *scratch) {
    const void *src = (const unsigned char *)e->data + (size_t)at * kiln_dtype_size(e->src_type);
    int64_t bad = kiln__st_convert_chunk(dst, e->stored_type, src, e->src_type, n, scratch);
    if (bad >= 0)
        return kiln__st_overflow_error(where, e->name, at + bad,
                                       kiln__st_value(src, e->src_type, bad));
    return KILN_OK;
}

static int64_t entry_numel(const writer_entry *e) {
    return (int64_t)(e->nbytes / kiln_st_dtype_size(e->dtype));
}

kiln_status kiln_safetensors_writer_to_memory(const kiln_safetensors_writer *w, void **out,
                                              size_t *size) {
    if (!w || !out || !size)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: NULL argument");
    char *header;
    size_t hlen, dsize;
    KILN_CHECK(build_header(w, &header, &hlen, &dsize));
    unsigned char *buf = NULL;
    if (dsize <= SIZE_MAX - 8 - hlen)
        buf = malloc(8 + hlen + dsize);
    if (!buf) {
        free(header);
        return kiln_error_setf(KILN_ERR_NOMEM, "safetensors writer: no memory for %zu bytes",
                               dsize);
    }
    convert_buffers cb;
    kiln_status s = buffers_init(&cb, w);
    put_le64(buf, hlen);
    memcpy(buf + 8, header, hlen);
    size_t at = 8 + hlen;
    for (int i = 0; i < w->n && s == KILN_OK; i++) {
        const writer_entry *e = &w->e[i];
        if (!e->convert && e->nbytes)
            memcpy(buf + at, e->data, e->nbytes);
        size_t esize = kiln_st_dtype_size(e->dtype);
        for (int64_t k = 0; e->convert && k < entry_numel(e) && s == KILN_OK; k += KILN__ST_CHUNK) {
            int64_t n = entry_numel(e) - k < KILN__ST_CHUNK ? entry_numel(e) - k : KILN__ST_CHUNK;
            s = convert_range("safetensors writer", e, k, n, buf + at + (size_t)k * esize,
                              cb.scratch);
        }
        at += e->nbytes;
    }
    buffers_free(&cb);
    free(header);
    if (s != KILN_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    *size = at;
    return KILN_OK;
}

kiln_status kiln_safetensors_writer_write(const kiln_safetensors_writer *w, const char *path) {
    if (!w || !path || !path[0])
        return kiln_error_setf(KILN_ERR_ARG, "safetensors writer: NULL argument");
    char *header = NULL;
    size_t hlen, dsize;
    KILN_CHECK(build_header(w, &header, &hlen, &dsize));
    kiln__atomic_file f = KILN__ATOMIC_FILE_INIT;
    convert_buffers cb;
    kiln_status s;
    KILN_CHECK_GOTO(s, buffers_init(&cb, w), fail_header);
    KILN_CHECK_GOTO(s, kiln__atomic_open(&f, path), fail);
    unsigned char len8[8];
    put_le64(len8, hlen);
    KILN_CHECK_GOTO(s, kiln__atomic_write(&f, len8, 8), fail);
    KILN_CHECK_GOTO(s, kiln__atomic_write(&f, header, hlen), fail);
    for (int i = 0; i < w->n; i++) {
        const writer_entry *e = &w->e[i];
        if (!e->convert) {
            KILN_CHECK_GOTO(s, kiln__atomic_write(&f, e->data, e->nbytes), fail);
            continue;
        }
        size_t esize = kiln_st_dtype_size(e->dtype);
        for (int64_t k = 0; k < entry_numel(e); k += KILN__ST_CHUNK) {
            int64_t n = entry_numel(e) - k < KILN__ST_CHUNK ? entry_numel(e) - k : KILN__ST_CHUNK;
            KILN_CHECK_GOTO(s, convert_range(path, e, k, n, cb.out, cb.scratch), fail);
            KILN_CHECK_GOTO(s, kiln__atomic_write(&f, cb.out, (size_t)n * esize), fail);
        }
    }
    s = kiln__atomic_commit(&f);
fail:
    kiln__atomic_abort(&f);
    buffers_free(&cb);
fail_header:
    free(header);
    return s;
}
