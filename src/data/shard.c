/* Token shards: the header, the verifying reader, the streaming writer.
 * The format is described in include/kiln/shard.h.
 *
 * The reader keeps the file open and reads with pread, never through a mapping: a shard
 * truncated while a run reads it then gives a short read, reported with the file and its
 * sizes then and now, where a mapping would kill the process with SIGBUS. */
#include "kiln/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/core.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token shards are read in place and need a little-endian machine"
#endif

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 8,
    OFF_WIDTH = 12,
    OFF_VOCAB = 16,
    OFF_COUNT = 24,
    OFF_DATA_HASH = 32,
    OFF_TOKENIZER = 40, /* version 2; reserved (zero) in version 1 */
    OFF_RESERVED = 48,
    OFF_HEADER_HASH = 56,
    VERIFY_CHUNK = 1 << 20, /* bytes hashed and range-checked per step: stays in L2 */
    WRITE_BUFFER = 1 << 20, /* bytes buffered by the writer between write() calls */
};

int kiln_shard_token_width(int64_t vocab_size) {
    return vocab_size <= 65536 ? 2 : 4;
}

static void put_u32(unsigned char *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static void put_u64(unsigned char *p, uint64_t v) {
    memcpy(p, &v, 8);
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void header_encode(unsigned char h[KILN_SHARD_HEADER_BYTES], const kiln_shard_info *in) {
    memset(h, 0, KILN_SHARD_HEADER_BYTES);
    memcpy(h + OFF_MAGIC, KILN_SHARD_MAGIC, 8);
    put_u32(h + OFF_VERSION, (uint32_t)in->version);
    put_u32(h + OFF_WIDTH, (uint32_t)in->token_width);
    put_u64(h + OFF_VOCAB, (uint64_t)in->vocab_size);
    put_u64(h + OFF_COUNT, (uint64_t)in->num_tokens);
    put_u64(h + OFF_DATA_HASH, in->data_hash);
    put_u64(h + OFF_TOKENIZER, in->tokenizer_id);
    put_u64(h + OFF_HEADER_HASH, XXH3_64bits(h, OFF_HEADER_HASH));
}

/* Check the header of a file of file_bytes bytes; fills info. Every error names path. */
static kiln_status header_decode(const unsigned char *h, uint64_t file_bytes, const char *path,
                                 kiln_shard_info *info) {
    if (file_bytes < KILN_SHARD_HEADER_BYTES)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: %llu bytes, shorter than the %d-byte shard header (truncated, "
                               "or not a token shard)",
                               path, (unsigned long long)file_bytes, KILN_SHARD_HEADER_BYTES);
    if (memcmp(h + OFF_MAGIC, KILN_SHARD_MAGIC, 8) != 0)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: bytes 0..7 are not the magic \"%s\" (not a kiln token shard)",
                               path, KILN_SHARD_MAGIC);
    uint32_t version = get_u32(h + OFF_VERSION);
    if (version < 1 || version > KILN_SHARD_VERSION)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: shard format version %u, this build reads version 1 to %d "
                               "(written by another kiln, or the header at offset 8 is damaged)",
                               path, version, KILN_SHARD_VERSION);
    uint64_t stored = get_u64(h + OFF_HEADER_HASH), computed = XXH3_64bits(h, OFF_HEADER_HASH);
    if (stored != computed)
        return kiln_error_setf(
            KILN_ERR_CHECKSUM,
            "%s: header bytes 0..55 fail their checksum (stored %016llx at offset "
            "56, computed %016llx): the header is damaged",
            path, (unsigned long long)stored, (unsigned long long)computed);
    uint32_t width = get_u32(h + OFF_WIDTH);
    uint64_t vocab = get_u64(h + OFF_VOCAB), count = get_u64(h + OFF_COUNT);
    for (int i = version == 1 ? OFF_TOKENIZER : OFF_RESERVED; i < OFF_HEADER_HASH; i++)
        if (h[i] != 0)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: reserved header byte %d is not zero", path,
                                   i);
    if (vocab < 1 || vocab > (uint64_t)KILN_SHARD_MAX_VOCAB)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: vocabulary size %llu is outside [1, 2^31]",
                               path, (unsigned long long)vocab);
    if (width != (uint32_t)kiln_shard_token_width((int64_t)vocab))
        return kiln_error_setf(
            KILN_ERR_FORMAT, "%s: token width %u bytes does not fit vocabulary size %llu (want %d)",
            path, width, (unsigned long long)vocab, kiln_shard_token_width((int64_t)vocab));
    uint64_t want = (uint64_t)KILN_SHARD_HEADER_BYTES + count * width;
    if (count > (uint64_t)INT64_MAX / 8 || want != file_bytes) {
        if (count <= (uint64_t)INT64_MAX / 8 && file_bytes < want)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: %llu bytes, but the header says %llu tokens of %u bytes "
                                   "(%llu bytes with the header): truncated by %llu bytes",
                                   path, (unsigned long long)file_bytes, (unsigned long long)count,
                                   width, (unsigned long long)want,
                                   (unsigned long long)(want - file_bytes));
        return kiln_error_setf(
            KILN_ERR_FORMAT, "%s: %llu bytes, but the header says %llu tokens of %u bytes: %s",
            path, (unsigned long long)file_bytes, (unsigned long long)count, width,
            count > (uint64_t)INT64_MAX / 8 ? "impossible count" : "extra bytes after the tokens");
    }
    info->version = (int)version;
    info->token_width = (int)width;
    info->vocab_size = (int64_t)vocab;
    info->num_tokens = (int64_t)count;
    info->data_hash = get_u64(h + OFF_DATA_HASH);
    info->tokenizer_id = version == 1 ? 0 : get_u64(h + OFF_TOKENIZER);
    return KILN_OK;
}

/* ---- reading ---- */

struct kiln_shard {
    char *path;
    kiln_shard_info info;
    int fd;        /* open for the shard's life: every read sees the file checked at open */
    uint64_t size; /* bytes when opened */
};

/* Largest id in ids[0..n) of the given width. Plain loops that the compiler vectorises. */
static uint32_t max_id(const unsigned char *p, size_t n, int width) {
    uint32_t m = 0;
    if (width == 2) {
        const uint16_t *q = (const uint16_t *)(const void *)p;
        for (size_t i = 0; i < n; i++)
            m = q[i] > m ? q[i] : m;
    } else {
        const uint32_t *q = (const uint32_t *)(const void *)p;
        for (size_t i = 0; i < n; i++)
            m = q[i] > m ? q[i] : m;
    }
    return m;
}

static uint32_t id_at(const unsigned char *p, int64_t i, int width) {
    if (width == 2) {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    return get_u32(p + 4 * i);
}

static int64_t first_out_of_range(const unsigned char *p, int64_t n, int width, uint64_t vocab) {
    for (int64_t i = 0; i < n; i++)
        if (id_at(p, i, width) >= vocab)
            return i;
    return -1;
}

/* A read of bytes [off, off+want) that failed (got < 0: errno) or came back short (got
 * bytes): the file, the range, and the file's size when opened and now. */
static kiln_status read_failed(const kiln_shard *s, uint64_t off, size_t want, ssize_t got) {
    if (got < 0)
        return kiln_error_setf(KILN_ERR_IO, "%s: reading bytes %llu..%llu failed: %s", s->path,
                               (unsigned long long)off, (unsigned long long)(off + want),
                               strerror(errno));
    struct stat sb;
    char now[64] = "of an unknown size";
    if (fstat(s->fd, &sb) == 0)
        snprintf(now, sizeof now, "%lld bytes", (long long)sb.st_size);
    return kiln_error_setf(KILN_ERR_IO,
                           "%s: bytes %llu..%llu could not be read (%lld of %zu came back): it "
                           "was %llu bytes when kiln opened it and is %s now (truncated or "
                           "rewritten while in use)",
                           s->path, (unsigned long long)off, (unsigned long long)(off + want),
                           (long long)got, want, (unsigned long long)s->size, now);
}

/* want bytes at off into buf, whole: a short read is an error naming the file. */
static kiln_status pread_full(const kiln_shard *s, void *buf, size_t want, uint64_t off) {
    size_t done = 0;
    while (done < want) {
        ssize_t got = pread(s->fd, (char *)buf + done, want - done, (off_t)(off + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return read_failed(s, off, want, got < 0 ? got : (ssize_t)done);
        done += (size_t)got;
    }
    return KILN_OK;
}

/* The token pass's verdict: the computed checksum, and the first id >= V (bad < 0: none). */
static kiln_status check_tokens(const kiln_shard *s, uint64_t computed, int64_t bad,
                                uint32_t bad_id) {
    const kiln_shard_info *in = &s->info;
    size_t bytes = (size_t)in->num_tokens * (size_t)in->token_width;
    char hint[160] = "";
    if (bad >= 0)
        snprintf(hint, sizeof hint, "; token %lld (byte offset %lld) is out of range",
                 (long long)bad,
                 (long long)(KILN_SHARD_HEADER_BYTES + bad * (int64_t)in->token_width));
    if (computed != in->data_hash)
        return kiln_error_setf(
            KILN_ERR_CHECKSUM,
            "%s: token bytes %d..%llu fail their checksum (stored %016llx at offset "
            "32, computed %016llx): the tokens are damaged%s",
            s->path, KILN_SHARD_HEADER_BYTES, (unsigned long long)(KILN_SHARD_HEADER_BYTES + bytes),
            (unsigned long long)in->data_hash, (unsigned long long)computed, hint);
    if (bad >= 0)
        return kiln_error_setf(
            KILN_ERR_RANGE,
            "%s: token %lld (byte offset %lld) is id %llu, outside the "
            "vocabulary of %lld ids",
            s->path, (long long)bad,
            (long long)(KILN_SHARD_HEADER_BYTES + bad * (int64_t)in->token_width),
            (unsigned long long)bad_id, (long long)in->vocab_size);
    return KILN_OK;
}

/* One pass over the tokens, read through a small buffer: the checksum and the largest id
 * (and, where that is out of range, the first id that is). Reading keeps the check at copy
 * speed; mapping pages in for the first time costs more than the check itself on some
 * machines (bench_loader). */
static kiln_status verify_tokens(const kiln_shard *s) {
    const kiln_shard_info *in = &s->info;
    size_t bytes = (size_t)in->num_tokens * (size_t)in->token_width;
    XXH3_state_t *st = XXH3_createState();
    unsigned char *buf = malloc(VERIFY_CHUNK);
    kiln_status status = KILN_OK;
    if (!st || !buf) {
        status = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to check the shard", s->path);
        goto done;
    }
    XXH3_64bits_reset(st);
    int64_t bad = -1;
    uint32_t bad_id = 0;
    for (size_t off = 0; off < bytes;) {
        size_t want = bytes - off < VERIFY_CHUNK ? bytes - off : VERIFY_CHUNK;
        KILN_CHECK_GOTO(status, pread_full(s, buf, want, KILN_SHARD_HEADER_BYTES + off), done);
        XXH3_64bits_update(st, buf, want);
        size_t n = want / (size_t)in->token_width;
        if (bad < 0 && max_id(buf, n, in->token_width) >= (uint64_t)in->vocab_size) {
            int64_t k =
                first_out_of_range(buf, (int64_t)n, in->token_width, (uint64_t)in->vocab_size);
            bad = (int64_t)(off / (size_t)in->token_width) + k;
            bad_id = id_at(buf, k, in->token_width);
        }
        off += want;
    }
    status = check_tokens(s, XXH3_64bits_digest(st), bad, bad_id);
done:
    XXH3_freeState(st);
    free(buf);
    return status;
}

/* A regular file only (never a FIFO or device: opening one could block), with its size. */
static kiln_status open_shard_file(const char *path, int *fd, uint64_t *size) {
    KILN_CHECK(kiln_file_open_regular(path, fd, size));
    if (*size > (uint64_t)INT64_MAX || *size > (uint64_t)SIZE_MAX) {
        close(*fd);
        *fd = -1;
        return kiln_error_setf(KILN_ERR_FORMAT, "%s: %llu bytes is too large for a shard", path,
                               (unsigned long long)*size);
    }
    return KILN_OK;
}

/* The first 64 bytes of a file of `size` bytes (left zero when shorter). */
static kiln_status read_header(int fd, const char *path, uint64_t size,
                               unsigned char h[KILN_SHARD_HEADER_BYTES]) {
    if (size < KILN_SHARD_HEADER_BYTES)
        return KILN_OK;
    ssize_t got;
    do
        got = pread(fd, h, KILN_SHARD_HEADER_BYTES, 0);
    while (got < 0 && errno == EINTR);
    if (got != KILN_SHARD_HEADER_BYTES)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot read the header: %s", path,
                               got < 0 ? strerror(errno) : "short read");
    return KILN_OK;
}

/* Open, check the header, check the tokens. Every later read goes through the same file
 * descriptor: a shard renamed over this path meanwhile does not mix in. */
static kiln_status open_checked(kiln_shard *s) {
    KILN_CHECK(open_shard_file(s->path, &s->fd, &s->size));
    unsigned char h[KILN_SHARD_HEADER_BYTES] = {0};
    KILN_CHECK(read_header(s->fd, s->path, s->size, h));
    KILN_CHECK(header_decode(h, s->size, s->path, &s->info));
    return verify_tokens(s);
}

kiln_status kiln_shard_open(kiln_shard **out, const char *path) {
    *out = NULL;
    if (!path)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_shard_open: no path");
    kiln_shard *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to open the shard", path);
    }
    s->fd = -1;
    kiln_status st;
    KILN_CHECK_GOTO(st, open_checked(s), fail);
    *out = s;
    return KILN_OK;
fail:
    kiln_shard_close(s);
    return st;
}

void kiln_shard_close(kiln_shard *s) {
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s->path);
    free(s);
}

const kiln_shard_info *kiln_shard_get_info(const kiln_shard *s) {
    return &s->info;
}
const char *kiln_shard_path(const kiln_shard *s) {
    return s->path;
}

enum { READ_CHUNK = 4096 }; /* 2-byte ids read per pread before widening: 8 KiB on the stack */

kiln_status kiln_shard_read(const kiln_shard *s, int64_t start, int64_t n, int32_t *out) {
    if (start < 0 || n < 0 || start > s->info.num_tokens - n)
        return kiln_error_setf(KILN_ERR_RANGE, "%s: tokens [%lld, %lld) are outside [0, %lld)",
                               s->path, (long long)start, (long long)(start + n),
                               (long long)s->info.num_tokens);
    uint64_t off = KILN_SHARD_HEADER_BYTES + (uint64_t)start * (uint64_t)s->info.token_width;
    if (s->info.token_width == 4)
        return pread_full(s, out, (size_t)n * 4, off);
    uint16_t buf[READ_CHUNK];
    for (int64_t i = 0; i < n;) {
        int64_t k = n - i < READ_CHUNK ? n - i : READ_CHUNK;
        KILN_CHECK(pread_full(s, buf, (size_t)k * 2, off + (uint64_t)i * 2));
        for (int64_t j = 0; j < k; j++)
            out[i + j] = buf[j];
        i += k;
    }
    return KILN_OK;
}

kiln_status kiln_shard_read_info(const char *path, kiln_shard_info *info) {
    int fd;
    uint64_t size;
    KILN_CHECK(open_shard_file(path, &fd, &size));
    unsigned char h[KILN_SHARD_HEADER_BYTES] = {0};
    kiln_status st = read_header(fd, path, size, h);
    if (st == KILN_OK)
        st = header_decode(h, size, path, info);
    close(fd);
    return st;
}

/* ---- writing ---- */

struct kiln_shard_writer {
    char *path;
    kiln__atomic_file file;
    int width;
    int64_t vocab, count;
    uint64_t tokenizer_id;
    kiln_shard_info info; /* the header written, once finished */
    int failed, finished;
    XXH3_state_t *hash;
    unsigned char *buf; /* WRITE_BUFFER bytes */
    size_t buf_len;
};

static kiln_status flush_buffer(kiln_shard_writer *w) {
    if (w->buf_len == 0)
        return KILN_OK;
    XXH3_64bits_update(w->hash, w->buf, w->buf_len);
    kiln_status st = kiln__atomic_write(&w->file, w->buf, w->buf_len);
    w->buf_len = 0;
    return st;
}

kiln_status kiln_shard_writer_open(kiln_shard_writer **out, const char *path, int64_t vocab_size) {
    *out = NULL;
    if (!path || vocab_size < 1 || vocab_size > KILN_SHARD_MAX_VOCAB)
        return kiln_error_setf(KILN_ERR_ARG, "%s: cannot write a shard with vocabulary size %lld",
                               path ? path : "(no path)", (long long)vocab_size);
    kiln_shard_writer *w = calloc(1, sizeof *w);
    if (!w)
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for a shard writer", path);
    w->file = (kiln__atomic_file)KILN__ATOMIC_FILE_INIT;
    w->width = kiln_shard_token_width(vocab_size);
    w->vocab = vocab_size;
    w->path = strdup(path);
    w->hash = XXH3_createState();
    w->buf = malloc(WRITE_BUFFER);
    kiln_status st;
    if (!w->path || !w->hash || !w->buf) {
        st = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for a shard writer", path);
        goto fail;
    }
    XXH3_64bits_reset(w->hash);
    KILN_CHECK_GOTO(st, kiln__atomic_open(&w->file, path), fail);
    /* A zero header until finish: an interrupted file has no magic. */
    unsigned char zero[KILN_SHARD_HEADER_BYTES] = {0};
    KILN_CHECK_GOTO(st, kiln__atomic_write(&w->file, zero, sizeof zero), fail);
    *out = w;
    return KILN_OK;
fail:
    kiln_shard_writer_free(w);
    return st;
}

kiln_status kiln_shard_writer_append(kiln_shard_writer *w, const int32_t *ids, int64_t n) {
    if (w->failed || w->finished)
        return kiln_error_setf(KILN_ERR_ARG, "%s: append after the writer %s", w->path,
                               w->finished ? "finished" : "failed");
    for (int64_t i = 0; i < n;) {
        if (w->buf_len == WRITE_BUFFER) {
            kiln_status st = flush_buffer(w);
            if (st != KILN_OK) {
                w->failed = 1;
                return st;
            }
        }
        int64_t room = (int64_t)((WRITE_BUFFER - w->buf_len) / (size_t)w->width);
        int64_t k = n - i < room ? n - i : room;
        const int32_t *src = ids + i;
        int bad = 0;
        if (w->width == 2) {
            uint16_t *dst = (uint16_t *)(void *)(w->buf + w->buf_len);
            for (int64_t j = 0; j < k; j++) {
                bad |= src[j] < 0 || src[j] >= w->vocab;
                dst[j] = (uint16_t)src[j];
            }
        } else {
            uint32_t *dst = (uint32_t *)(void *)(w->buf + w->buf_len);
            for (int64_t j = 0; j < k; j++) {
                bad |= src[j] < 0 || src[j] >= w->vocab;
                dst[j] = (uint32_t)src[j];
            }
        }
        if (bad) {
            int64_t j = 0;
            while (src[j] >= 0 && src[j] < w->vocab)
                j++;
            w->failed = 1;
            return kiln_error_setf(KILN_ERR_RANGE,
                                   "%s: id %d (token %lld of the shard) is outside the vocabulary "
                                   "of %lld ids",
                                   w->path, src[j], (long long)(w->count + i + j),
                                   (long long)w->vocab);
        }
        w->buf_len += (size_t)k * (size_t)w->width;
        i += k;
    }
    w->count += n;
    return KILN_OK;
}

int64_t kiln_shard_writer_count(const kiln_shard_writer *w) {
    return w->count;
}

void kiln_shard_writer_set_tokenizer(kiln_shard_writer *w, uint64_t tokenizer_id) {
    w->tokenizer_id = tokenizer_id;
}

const kiln_shard_info *kiln_shard_writer_info(const kiln_shard_writer *w) {
    return w && w->finished ? &w->info : NULL;
}

kiln_status kiln_shard_writer_finish(kiln_shard_writer *w) {
    if (w->failed || w->finished)
        return kiln_error_setf(KILN_ERR_ARG, "%s: finish after the writer %s", w->path,
                               w->finished ? "finished" : "failed");
    kiln_status st;
    KILN_CHECK_GOTO(st, flush_buffer(w), fail);
    kiln_shard_info in = {KILN_SHARD_VERSION,          w->width,       w->vocab, w->count,
                          XXH3_64bits_digest(w->hash), w->tokenizer_id};
    unsigned char h[KILN_SHARD_HEADER_BYTES];
    header_encode(h, &in);
    KILN_CHECK_GOTO(st, kiln__atomic_pwrite(&w->file, h, sizeof h, 0), fail);
    KILN_CHECK_GOTO(st, kiln__atomic_commit(&w->file), fail);
    w->info = in;
    w->finished = 1;
    return KILN_OK;
fail:
    w->failed = 1;
    return st;
}

void kiln_shard_writer_free(kiln_shard_writer *w) {
    if (!w)
        return;
    kiln__atomic_abort(&w->file);
    if (w->hash)
        XXH3_freeState(w->hash);
    free(w->buf);
    free(w->path);
    free(w);
}

kiln_status kiln_shard_write(const char *path, int64_t vocab_size, const int32_t *ids, int64_t n) {
    kiln_shard_writer *w;
    KILN_CHECK(kiln_shard_writer_open(&w, path, vocab_size));
    kiln_status st = kiln_shard_writer_append(w, ids, n);
    if (st == KILN_OK)
        st = kiln_shard_writer_finish(w);
    kiln_shard_writer_free(w);
    return st;
}
