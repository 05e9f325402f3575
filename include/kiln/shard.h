/* kiln: token shards, the files that `kiln prepare` writes and the loader reads.
 *
 * A shard is a 64-byte header followed by the tokens. Every integer is little-endian.
 *
 *   offset  bytes  field
 *        0      8  magic "KILNTOKS"
 *        8      4  format version, 2 (version 1 is still read)
 *       12      4  token width W in bytes: 2 when the vocabulary has at most 65536 ids, else 4
 *       16      8  vocabulary size V (1 <= V <= 2^31); every id is < V
 *       24      8  token count N
 *       32      8  XXH3_64bits of the N*W token bytes (seed 0)
 *       40      8  the tokenizer's identity (kiln_tokenizer_id); 0: unknown
 *       48      8  reserved, zero
 *       56      8  XXH3_64bits of header bytes 0..55 (seed 0)
 *       64    N*W  the ids, unsigned, W bytes each
 *
 * Version 1 is the same with bytes 40..55 reserved (zero): its tokenizer is unknown.
 *
 * The file is exactly 64 + N*W bytes. The reader checks all of it before handing it out:
 * size, magic, version, header checksum, fields, the token checksum and that every id is
 * below V. One pass over the tokens does both checks; it runs at memory speed
 * (bench/bench_loader.c measures it) and is paid once per open. The reader then keeps the
 * file open (one descriptor per shard) and reads ids with pread, never through a mapping:
 * a file truncated while it is open gives an error naming it and its sizes then and now
 * (a mapping would end the process with SIGBUS).
 *
 * The writer streams: ids go through a buffer into "<path>.tmp.<pid>", whose header
 * stays zero (so it never passes for a shard) until kiln_shard_writer_finish writes the
 * real header, fsyncs, renames the file to <path> and fsyncs the folder. A failure or a
 * killed process leaves at most the temporary file; <path> is either absent or the
 * previous complete shard. Two writers in one process must not write the same path. */
#ifndef KILN_SHARD_H
#define KILN_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_SHARD_MAGIC "KILNTOKS"
#define KILN_SHARD_VERSION 2 /* written; versions 1 and 2 are read */
#define KILN_SHARD_HEADER_BYTES 64
#define KILN_SHARD_MAX_VOCAB ((int64_t)1 << 31)

typedef struct kiln_shard_info {
    int version;
    int token_width;       /* bytes per id: 2 or 4 */
    int64_t vocab_size;    /* V */
    int64_t num_tokens;    /* N */
    uint64_t data_hash;    /* XXH3_64bits of the token bytes */
    uint64_t tokenizer_id; /* kiln_tokenizer_id of the writer's tokenizer; 0: unknown */
} kiln_shard_info;

/* Token width for a vocabulary of V ids: 2 when V <= 65536, else 4. */
int kiln_shard_token_width(int64_t vocab_size);

/* ---- reading ---- */

typedef struct kiln_shard kiln_shard; /* opaque; read-only after open, thread-safe */

/* Open and verify the whole shard. Only a regular file is opened (kiln_file_open_regular: a
 * FIFO or device is refused, never waited on). Errors name the file and what is wrong:
 * KILN_ERR_NOT_FOUND, KILN_ERR_IO (not a regular file, cannot open or read), KILN_ERR_FORMAT (size,
 * magic, version, fields), KILN_ERR_CHECKSUM (header or token checksum; byte ranges and both hashes
 * in the message), KILN_ERR_RANGE (an id >= V, with its index and byte offset). */
kiln_status kiln_shard_open(kiln_shard **out, const char *path);
void kiln_shard_close(kiln_shard *s); /* NULL is safe */

const kiln_shard_info *kiln_shard_get_info(const kiln_shard *s);
const char *kiln_shard_path(const kiln_shard *s);
/* Read ids [start, start+n) into out as int32; KILN_ERR_RANGE when outside [0, N),
 * KILN_ERR_IO when the file no longer holds them (truncated since it was opened: the
 * message names the file, the bytes and its sizes then and now). */
kiln_status kiln_shard_read(const kiln_shard *s, int64_t start, int64_t n, int32_t *out);

/* Read and check only the header (size, magic, version, header checksum, fields), not the
 * tokens: for listing shards without reading them. */
kiln_status kiln_shard_read_info(const char *path, kiln_shard_info *info);

/* ---- writing ---- */

typedef struct kiln_shard_writer kiln_shard_writer; /* opaque */

/* Start a shard that will be named path; vocab_size fixes the width. */
kiln_status kiln_shard_writer_open(kiln_shard_writer **out, const char *path, int64_t vocab_size);
/* Append n ids; each must be in [0, V) (KILN_ERR_RANGE names the first one that is not,
 * and the writer then refuses further calls). */
kiln_status kiln_shard_writer_append(kiln_shard_writer *w, const int32_t *ids, int64_t n);
int64_t kiln_shard_writer_count(const kiln_shard_writer *w); /* ids appended so far */
/* Record the tokenizer's identity (kiln_tokenizer_id) in the header; 0 (the default):
 * unknown. Call before finish. */
void kiln_shard_writer_set_tokenizer(kiln_shard_writer *w, uint64_t tokenizer_id);
/* Write the header, fsync, rename to the final path, fsync the folder. */
kiln_status kiln_shard_writer_finish(kiln_shard_writer *w);
/* The header written by a successful finish (NULL before). */
const kiln_shard_info *kiln_shard_writer_info(const kiln_shard_writer *w);
/* Free the writer; if it was not finished, close and delete its temporary file. */
void kiln_shard_writer_free(kiln_shard_writer *w);

/* Write ids[0..n) as one shard (open, append, finish, free). */
kiln_status kiln_shard_write(const char *path, int64_t vocab_size, const int32_t *ids, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
