/* Internal to kiln prepare: the inputs (files, folders, JSON Lines, the Brown corpus), a
 * first pass that counts and checks every document, and a reader that hands the documents
 * out again, in the same order, for encoding. */
#ifndef KILN_DATA_PREPARE_INTERNAL_H
#define KILN_DATA_PREPARE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "kiln/prepare.h"

typedef enum prep_kind { PREP_TEXT, PREP_JSONL, PREP_BROWN } prep_kind;

typedef struct prep_file {
    char *path;
    prep_kind kind;
    int64_t size; /* bytes on disk */
    int64_t docs; /* non-empty documents it holds */
    int64_t text; /* bytes of their text (a .jsonl's strings, a Brown file without its tags) */
    int skip;     /* 1: empty or a skipped binary file */
} prep_file;

typedef struct prep_inputs {
    prep_file *files;
    int n, cap;
    int64_t docs;        /* non-empty documents in all files */
    int64_t bytes_total; /* on-disk bytes of the files that are read */
    int64_t empty;       /* empty files and documents */
    int64_t binary;      /* binary files (skipped or encoded) */
    /* The split (see kiln/prepare.h): threshold on the document hash, and the documents
     * moved when it leaves a side empty (-1: none). */
    uint64_t val_threshold;
    int64_t forced_val, forced_train;
    /* The output folder when it exists: never read as input. */
    int has_out_dir;
    dev_t out_dev;
    ino_t out_ino;
} prep_inputs;

/* Expand cfg's inputs (or the Brown corpus in cfg->corpus_dir), check every document, count
 * them, and decide the split. Notes go through cfg->note. */
kiln_status kiln__prep_inputs_collect(prep_inputs *in, const kiln_prepare_config *cfg);
void kiln__prep_inputs_free(prep_inputs *in);

/* 1 when document index i (counting non-empty documents from 0) goes to val. */
int kiln__prep_doc_is_val(const prep_inputs *in, uint64_t seed, int64_t i);

/* Reads the non-empty documents of one file in order. */
typedef struct prep_reader {
    const prep_file *file;
    FILE *f;    /* JSONL */
    char *line; /* JSONL: getline buffer */
    size_t line_cap;
    int64_t line_no;
    void *json;  /* JSONL: the cJSON of the current line */
    char *owned; /* BROWN: the document's text */
    size_t owned_len;
    char *text; /* TEXT: the file's bytes, read whole (never mapped: a file truncated under
                 * a mapping ends the process with SIGBUS) */
    size_t text_len;
    int fd; /* TEXT: the file, open until its end is checked (-1: none) */
    int done;
    int64_t bytes_read; /* on-disk bytes consumed so far */
} prep_reader;

kiln_status kiln__prep_reader_open(prep_reader *r, const prep_file *file);
/* The next non-empty document: *text (valid until the next call) and *len; *text NULL at
 * the end of the file. */
kiln_status kiln__prep_reader_next(prep_reader *r, const char **text, size_t *len);
void kiln__prep_reader_close(prep_reader *r);

/* Where text may be cut without changing how either side tokenizes under GPT-2's
 * pre-tokeniser (and trivially for bytes): before a space that follows a printable ASCII
 * character, or after a newline that sits between two printable ASCII characters. */
int kiln__prep_is_safe_cut(const char *text, size_t len, size_t i);
/* The first safe cut at or after from (len when none). */
size_t kiln__prep_next_cut(const char *text, size_t len, size_t from);

/* Print a note through cfg->note (printf-style). */
void kiln__prep_note(const kiln_prepare_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
