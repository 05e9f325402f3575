/* safetensors reader: open, validate strictly, look up, convert to float.
 *
 * Every check happens at open, so that the accessors never meet a bad offset: the header
 * must be a JSON object of tensor entries (dtype, shape, data_offsets and nothing else) and
 * an optional __metadata__ object of strings; every entry's byte range must match its dtype
 * and shape; the ranges, sorted, must tile the data buffer exactly.
 *
 * A file is read whole into anonymous memory (pread), never mapped: a file truncated while a
 * mapping of it is read ends the process with SIGBUS, where a short read is an error naming
 * the file and its sizes. The memory is what the mapping's resident pages took (RSS counts
 * both), and readers read every tensor anyway. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors_internal.h"
#include "core/error.h"
#include "kiln/core.h"
#include "kiln/safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; kiln reads it in place on little-endian hosts only"
#endif

/* Names in messages are cut to this many bytes so that the file name and reason still fit. */
#define NAME_MAX_SHOWN 120

struct kiln_safetensors {
    char *path;                 /* for messages */
    const unsigned char *bytes; /* the whole file */
    size_t size;
    void *map; /* the file's bytes, read into page-aligned memory (NULL: opened over memory) */
    size_t map_len;
    const unsigned char *data; /* the data buffer: bytes + 8 + header length */
    size_t data_size;
    int n;
    kiln_st_tensor *tensors; /* in data order */
    int *by_name;            /* indices into tensors, sorted by name */
    int n_meta;
    char **meta; /* key i at 2i, its value at 2i+1 */
};

/* An integer JSON number in [0, 2^53] (beyond that a double no longer holds every integer). */
static int json_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= 9007199254740992.0) || d != floor(d))
        return 0;
    *out = (uint64_t)d;
    return 1;
}

static const char *tensor_name(const kiln_st_tensor *t) { return t->name ? t->name : "?"; }

static kiln_status parse_shape(kiln_safetensors *f, const cJSON *shape, kiln_st_tensor *t) {
    const char *nm = tensor_name(t);
    if (!cJSON_IsArray(shape))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%.*s\": \"shape\" is not an array",
                               f->path, NAME_MAX_SHOWN, nm);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > KILN_ST_MAX_DIMS)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "%s: tensor \"%.*s\" has %d dimensions; kiln reads at most %d",
                               f->path, NAME_MAX_SHOWN, nm, ndim, KILN_ST_MAX_DIMS);
    int64_t numel = 1;
    int zero = 0, overflow = 0, i = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        uint64_t v;
        if (!json_u64(d, &v))
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: tensor \"%.*s\": shape[%d] is not a non-negative integer",
                                   f->path, NAME_MAX_SHOWN, nm, i);
        t->shape[i] = (int64_t)v;
        zero |= v == 0;
        overflow |= __builtin_mul_overflow(numel, (int64_t)v, &numel);
    }
    if (zero) {
        numel = 0;
    } else if (overflow) {
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: tensor \"%.*s\": the product of its shape overflows 64 bits",
                               f->path, NAME_MAX_SHOWN, nm);
    }
    t->ndim = ndim;
    t->numel = numel;
    return KILN_OK;
}

static kiln_status parse_offsets(kiln_safetensors *f, const cJSON *offs, kiln_st_tensor *t) {
    const char *nm = tensor_name(t);
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u64(offs->child, &begin) ||
        !json_u64(offs->child->next, &end))
        return kiln_error_setf(
            KILN_ERR_FORMAT,
            "%s: tensor \"%.*s\": \"data_offsets\" is not [begin, end] in integers", f->path,
            NAME_MAX_SHOWN, nm);
    size_t esize = kiln_st_dtype_size(t->dtype);
    uint64_t need;
    if (__builtin_mul_overflow((uint64_t)t->numel, (uint64_t)esize, &need) ||
        need > (uint64_t)INT64_MAX)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%.*s\": its size in bytes overflows",
                               f->path, NAME_MAX_SHOWN, nm);
    if (end < begin || end - begin != need)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: tensor \"%.*s\": data_offsets [%llu, %llu] do not hold %lld %s "
                               "elements (%llu bytes)",
                               f->path, NAME_MAX_SHOWN, nm, (unsigned long long)begin,
                               (unsigned long long)end, (long long)t->numel,
                               kiln_st_dtype_name(t->dtype), (unsigned long long)need);
    if (end > f->data_size)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: tensor \"%.*s\": data_offsets [%llu, %llu] run past the end of "
                               "the data (%zu bytes)",
                               f->path, NAME_MAX_SHOWN, nm, (unsigned long long)begin,
                               (unsigned long long)end, f->data_size);
    t->offset = (size_t)begin;
    t->nbytes = (size_t)need;
    return KILN_OK;
}

/* One tensor entry: an object with exactly dtype, shape and data_offsets. */
static kiln_status parse_entry(kiln_safetensors *f, const cJSON *item, kiln_st_tensor *t) {
    const char *nm = tensor_name(t);
    if (!cJSON_IsObject(item))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%.*s\": entry is not an object",
                               f->path, NAME_MAX_SHOWN, nm);
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *c = item->child; c; c = c->next) {
        const cJSON **slot = NULL;
        if (c->string && strcmp(c->string, "dtype") == 0)
            slot = &dtype;
        else if (c->string && strcmp(c->string, "shape") == 0)
            slot = &shape;
        else if (c->string && strcmp(c->string, "data_offsets") == 0)
            slot = &offs;
        if (!slot || *slot)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%.*s\": %s field \"%.*s\"",
                                   f->path, NAME_MAX_SHOWN, nm, slot ? "repeated" : "unknown",
                                   NAME_MAX_SHOWN, c->string ? c->string : "");
        *slot = c;
    }
    const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
    if (missing)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%.*s\": no \"%s\" field", f->path,
                               NAME_MAX_SHOWN, nm, missing);
    if (!cJSON_IsString(dtype) || kiln_st_dtype_parse(dtype->valuestring, &t->dtype) != KILN_OK)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%.*s\": unknown dtype \"%.*s\"",
                               f->path, NAME_MAX_SHOWN, nm, 32,
                               cJSON_IsString(dtype) ? dtype->valuestring : "(not a string)");
    KILN_CHECK(parse_shape(f, shape, t));
    return parse_offsets(f, offs, t);
}

static int cmp_offsets(const void *a, const void *b) {
    const kiln_st_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* qsort has no context argument in C11: the table being sorted, per thread. */
static _Thread_local const kiln_st_tensor *sort_tensors;

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(sort_tensors[*(const int *)a].name, sort_tensors[*(const int *)b].name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* Sorted by offset, the tensors must follow each other with no gap, no overlap, and end
 * exactly at the end of the data buffer. Names must be unique. */
static kiln_status check_layout(kiln_safetensors *f) {
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_offsets);
    size_t expect = 0;
    for (int i = 0; i < f->n; i++) {
        const kiln_st_tensor *t = &f->tensors[i];
        if (t->offset < expect)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: tensor \"%.*s\" (bytes %zu..%zu) overlaps tensor \"%.*s\"",
                                   f->path, NAME_MAX_SHOWN, t->name, t->offset,
                                   t->offset + t->nbytes, NAME_MAX_SHOWN, f->tensors[i - 1].name);
        if (t->offset > expect)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: bytes %zu..%zu of the data belong to no tensor (before "
                                   "tensor \"%.*s\")",
                                   f->path, expect, t->offset, NAME_MAX_SHOWN, t->name);
        expect = t->offset + t->nbytes;
    }
    if (expect != f->data_size)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: the data has %zu bytes but its tensors end at byte %zu",
                               f->path, f->data_size, expect);
    f->by_name = malloc((f->n > 0 ? (size_t)f->n : 1) * sizeof *f->by_name);
    if (!f->by_name)
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for the tensor index", f->path);
    for (int i = 0; i < f->n; i++)
        f->by_name[i] = i;
    sort_tensors = f->tensors;
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name);
    for (int i = 1; i < f->n; i++) {
        const char *a = f->tensors[f->by_name[i - 1]].name, *b = f->tensors[f->by_name[i]].name;
        if (strcmp(a, b) == 0)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: tensor \"%.*s\" appears twice", f->path,
                                   NAME_MAX_SHOWN, a);
    }
    for (int i = 0; i < f->n; i++)
        f->tensors[i].data = f->data + f->tensors[i].offset;
    return KILN_OK;
}

static kiln_status parse_metadata(kiln_safetensors *f, const cJSON *meta) {
    if (!cJSON_IsObject(meta))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: \"__metadata__\" is not an object", f->path);
    int n = cJSON_GetArraySize(meta);
    f->meta = calloc((size_t)(2 * n + 1), sizeof *f->meta);
    char ***keys = malloc((size_t)(n + 1) * sizeof *keys);
    if (!f->meta || !keys) {
        free(keys);
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for the metadata", f->path);
    }
    kiln_status s = KILN_OK;
    for (const cJSON *c = meta->child; c; c = c->next) {
        if (!c->string || !cJSON_IsString(c)) {
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: metadata \"%.*s\" is not a string", f->path,
                                NAME_MAX_SHOWN, c->string ? c->string : "");
            goto done;
        }
        char **kv = &f->meta[2 * f->n_meta];
        kv[0] = strdup(c->string);
        kv[1] = strdup(c->valuestring);
        keys[f->n_meta] = kv;
        f->n_meta++;
        if (!kv[0] || !kv[1]) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for the metadata", f->path);
            goto done;
        }
    }
    qsort(keys, (size_t)f->n_meta, sizeof *keys, cmp_str_ptr);
    for (int i = 1; i < f->n_meta; i++) {
        if (strcmp(*keys[i - 1], *keys[i]) == 0) {
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: metadata key \"%.*s\" appears twice", f->path,
                                NAME_MAX_SHOWN, *keys[i]);
            goto done;
        }
    }
done:
    free(keys);
    return s;
}

static kiln_status parse_json(kiln_safetensors *f, const char *header, size_t len) {
    if (len == 0 || header[0] != '{')
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: the header does not start with '{'", f->path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(header, len, &end, 0);
    if (!root) {
        size_t at = end && end >= header ? (size_t)(end - header) : 0;
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: the header is not valid JSON (at byte %zu of %zu)", f->path,
                               8 + at, 8 + len);
    }
    kiln_status s = KILN_OK;
    for (const char *p = end; p < header + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: bytes after the header's JSON (at byte %zu)",
                                f->path, 8 + (size_t)(p - header));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: the header is not a JSON object", f->path);
        goto done;
    }
    int count = cJSON_GetArraySize(root), seen_meta = 0;
    f->tensors = calloc((size_t)(count + 1), sizeof *f->tensors);
    if (!f->tensors) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for %d tensor entries", f->path, count);
        goto done;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        const char *key = c->string ? c->string : "";
        if (strcmp(key, "__metadata__") == 0) {
            if (seen_meta++) {
                s = kiln_error_setf(KILN_ERR_FORMAT, "%s: \"__metadata__\" appears twice", f->path);
                goto done;
            }
            KILN_CHECK_GOTO(s, parse_metadata(f, c), done);
            continue;
        }
        kiln_st_tensor *t = &f->tensors[f->n];
        if (key[0] == '\0') {
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: a tensor has an empty name", f->path);
            goto done;
        }
        t->name = strdup(key);
        if (!t->name) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for tensor names", f->path);
            goto done;
        }
        f->n++;
        KILN_CHECK_GOTO(s, parse_entry(f, c, t), done);
    }
    s = check_layout(f);
done:
    cJSON_Delete(root);
    return s;
}

/* Header length, header, data buffer. */
static kiln_status parse(kiln_safetensors *f) {
    if (f->size < 8)
        return kiln_error_setf(
            KILN_ERR_FORMAT,
            "%s: %zu bytes; a safetensors file starts with an 8-byte header length", f->path,
            f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | f->bytes[i];
    if (n > KILN_ST_MAX_HEADER)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: header length %llu is over kiln's limit of %zu bytes", f->path,
                               (unsigned long long)n, KILN_ST_MAX_HEADER);
    if (n > f->size - 8)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: header length %llu runs past the end of the file (%zu bytes)",
                               f->path, (unsigned long long)n, f->size);
    f->data = f->bytes + 8 + n;
    f->data_size = f->size - 8 - (size_t)n;
    return parse_json(f, (const char *)f->bytes + 8, (size_t)n);
}

static kiln_status new_handle(kiln_safetensors **out, const char *name) {
    kiln_safetensors *f = calloc(1, sizeof *f);
    if (f)
        f->path = strdup(name);
    if (!f || !f->path) {
        free(f);
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to open", name);
    }
    *out = f;
    return KILN_OK;
}

kiln_status kiln_safetensors_open_memory(kiln_safetensors **out, const void *bytes, size_t size,
                                         const char *name) {
    if (!out || (!bytes && size))
        return kiln_error_setf(KILN_ERR_ARG, "safetensors open: NULL argument");
    *out = NULL;
    kiln_safetensors *f = NULL;
    KILN_CHECK(new_handle(&f, name ? name : "<memory>"));
    f->bytes = bytes;
    f->size = size;
    kiln_status s = parse(f);
    if (s != KILN_OK) {
        kiln_safetensors_close(f);
        return s;
    }
    *out = f;
    return KILN_OK;
}

/* The file's f->size bytes into memory of its own: a short read (the file truncated since it
 * was opened) names the file, where the read stopped and its size now. */
static kiln_status read_whole(kiln_safetensors *f, int fd) {
    /* page-aligned, as a mapping was: a tensor's alignment is its offset's in the file */
    if (posix_memalign(&f->map, 4096, f->size) != 0)
        f->map = NULL;
    if (!f->map)
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to read its %zu bytes", f->path,
                               f->size);
    f->map_len = f->size;
    f->bytes = f->map;
    size_t done = 0;
    while (done < f->size) {
        ssize_t k = pread(fd, (char *)f->map + done, f->size - done, (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return kiln_error_setf(KILN_ERR_IO, "%s: cannot read at byte %zu: %s", f->path, done,
                                   strerror(errno));
        if (k == 0) {
            struct stat sb;
            return kiln_error_setf(KILN_ERR_IO,
                                   "%s was %zu bytes when opened, but reading it stopped at byte "
                                   "%zu and it is %lld bytes now (truncated or rewritten while "
                                   "kiln read it)",
                                   f->path, f->size, done,
                                   fstat(fd, &sb) == 0 ? (long long)sb.st_size : -1LL);
        }
        done += (size_t)k;
    }
    return KILN_OK;
}

kiln_status kiln_safetensors_open(kiln_safetensors **out, const char *path) {
    if (!out || !path)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors open: NULL argument");
    *out = NULL;
    /* Regular files only: opening a FIFO would wait for a writer forever, and a device has
     * no size to map. */
    int fd = -1;
    uint64_t size = 0;
    KILN_CHECK(kiln_file_open_regular(path, &fd, &size));
    if (size > (uint64_t)SIZE_MAX) {
        close(fd);
        return kiln_error_setf(KILN_ERR_RANGE, "%s is too large to read", path);
    }
    kiln_safetensors *f = NULL;
    kiln_status s = new_handle(&f, path);
    if (s != KILN_OK) {
        close(fd);
        return s;
    }
    f->size = (size_t)size;
    if (f->size >= 8) /* shorter files fail in parse() with a clear message */
        s = read_whole(f, fd);
    close(fd);
    if (s == KILN_OK)
        s = parse(f);
    if (s != KILN_OK) {
        kiln_safetensors_close(f);
        return s;
    }
    *out = f;
    return KILN_OK;
}

void kiln_safetensors_close(kiln_safetensors *f) {
    if (!f)
        return;
    for (int i = 0; i < f->n; i++)
        free((char *)f->tensors[i].name);
    for (int i = 0; i < 2 * f->n_meta; i++)
        free(f->meta[i]);
    free(f->meta);
    free(f->tensors);
    free(f->by_name);
    free(f->map);
    free(f->path);
    free(f);
}

const char *kiln_safetensors_path(const kiln_safetensors *f) { return f->path; }
int kiln_safetensors_num_tensors(const kiln_safetensors *f) { return f->n; }

const kiln_st_tensor *kiln_safetensors_tensor(const kiln_safetensors *f, int i) {
    return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const kiln_st_tensor *kiln_safetensors_find(const kiln_safetensors *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->tensors[f->by_name[mid]].name);
        if (c == 0)
            return &f->tensors[f->by_name[mid]];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

int kiln_safetensors_num_metadata(const kiln_safetensors *f) { return f->n_meta; }

void kiln_safetensors_metadata_at(const kiln_safetensors *f, int i, const char **key,
                                  const char **value) {
    int ok = i >= 0 && i < f->n_meta;
    if (key)
        *key = ok ? f->meta[2 * i] : NULL;
    if (value)
        *value = ok ? f->meta[2 * i + 1] : NULL;
}

const char *kiln_safetensors_metadata(const kiln_safetensors *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0)
            return f->meta[2 * i + 1];
    return NULL;
}

/* The tensor's kiln dtype in *st, when it has one and dst_type is a kiln dtype. */
static kiln_status convertible(const kiln_safetensors *f, const kiln_st_tensor *t,
                               kiln_dtype dst_type, kiln_dtype *st) {
    if (!f || !t)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors read: NULL argument");
    if (kiln_dtype_size(dst_type) == 0)
        return kiln_error_setf(KILN_ERR_ARG, "%s: tensor \"%.*s\": no such kiln dtype %d", f->path,
                               NAME_MAX_SHOWN, t->name, (int)dst_type);
    if (kiln_st_dtype_to_kiln(t->dtype, st) != KILN_OK)
        return kiln_error_setf(KILN_ERR_DTYPE,
                               "%s: tensor \"%.*s\" is %s; kiln reads F32, BF16 and F16 as %s",
                               f->path, NAME_MAX_SHOWN, t->name, kiln_st_dtype_name(t->dtype),
                               kiln_dtype_name(dst_type));
    return KILN_OK;
}

/* Convert t (stored as st) a chunk at a time into out as dt; with out NULL, into scratch only,
 * to find a value that does not fit. */
static kiln_status convert_tensor(const kiln_safetensors *f, const kiln_st_tensor *t, kiln_dtype st,
                                  kiln_dtype dt, unsigned char *out) {
    size_t ssize = kiln_dtype_size(st), dsize = kiln_dtype_size(dt);
    unsigned char *buf = NULL; /* kiln__st_convert_chunk's scratch, then a chunk when !out */
    if (!out || !kiln__st_aligned(t->data, st) || !kiln__st_aligned(out, dt)) {
        buf = malloc(KILN__ST_SCRATCH_BYTES + (out ? 0 : (size_t)KILN__ST_CHUNK * dsize));
        if (!buf)
            return kiln_error_setf(KILN_ERR_NOMEM, "%s: tensor \"%.*s\": no memory to convert",
                                   f->path, NAME_MAX_SHOWN, t->name);
    }
    const unsigned char *src = t->data;
    kiln_status s = KILN_OK;
    for (int64_t at = 0; at < t->numel && s == KILN_OK; at += KILN__ST_CHUNK) {
        int64_t n = t->numel - at < KILN__ST_CHUNK ? t->numel - at : KILN__ST_CHUNK;
        const void *from = src + (size_t)at * ssize;
        void *to = out ? out + (size_t)at * dsize : buf + KILN__ST_SCRATCH_BYTES;
        int64_t bad = kiln__st_convert_chunk(to, dt, from, st, n, buf);
        if (bad >= 0)
            s = kiln__st_overflow_error(f->path, t->name, at + bad, kiln__st_value(from, st, bad));
    }
    free(buf);
    return s;
}

kiln_status kiln_safetensors_read_as(const kiln_safetensors *f, const kiln_st_tensor *t,
                                     kiln_dtype dst_type, void *out) {
    if (!out && t && t->numel)
        return kiln_error_setf(KILN_ERR_ARG, "safetensors read: NULL argument");
    kiln_dtype st;
    KILN_CHECK(convertible(f, t, dst_type, &st));
    if (st == dst_type) { /* the bytes as they are (memcpy: the source may be unaligned) */
        if (t->nbytes)
            memcpy(out, t->data, t->nbytes);
        return KILN_OK;
    }
    return t->numel ? convert_tensor(f, t, st, dst_type, out) : KILN_OK;
}

kiln_status kiln_safetensors_check_fits(const kiln_safetensors *f, const kiln_st_tensor *t,
                                        kiln_dtype dst_type) {
    kiln_dtype st;
    KILN_CHECK(convertible(f, t, dst_type, &st));
    /* only F16 has a smaller range than the others */
    if (dst_type != KILN_DTYPE_F16 || st == KILN_DTYPE_F16 || t->numel == 0)
        return KILN_OK;
    return convert_tensor(f, t, st, dst_type, NULL);
}

kiln_status kiln_safetensors_read_f32(const kiln_safetensors *f, const kiln_st_tensor *t,
                                      float *out) {
    if (t && t->dtype == KILN_ST_DTYPE_F64) {
        const unsigned char *p = t->data;
        for (int64_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        return KILN_OK;
    }
    kiln_dtype st;
    if (f && t && kiln_st_dtype_to_kiln(t->dtype, &st) != KILN_OK)
        return kiln_error_setf(
            KILN_ERR_DTYPE,
            "%s: tensor \"%.*s\" is %s; kiln reads F32, F16, BF16 and F64 as floats", f->path,
            NAME_MAX_SHOWN, t->name, kiln_st_dtype_name(t->dtype));
    /* F16 and BF16 widen to F32 exactly: this cannot overflow */
    return kiln_safetensors_read_as(f, t, KILN_DTYPE_F32, out);
}
