/* kiln tokenizer: encode text to ids, decode ids to text, train a byte-level BPE. */
#include <ctype.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "flags.h"
#include "kiln/core.h"
#include "kiln/prepare.h"
#include "kiln/tokenizer.h"
#include "tool_common.h"

static const char usage_top[] =
    "usage: kiln tokenizer encode [--tokenizer NAME] [FILE...]   ids of each FILE (or stdin)\n"
    "       kiln tokenizer decode [--tokenizer NAME] [FILE]      ids back to bytes\n"
    "       kiln tokenizer train --vocab N [--out FILE] INPUTS... learn a byte-level BPE\n"
    "NAME: gpt2, bytes, or a file written by `kiln tokenizer train`. Each command's --help\n"
    "lists its flags.";

/* The default of --max-input: an eighth of this machine's memory (1 GiB when unknown), so
 * that the text, its ids (4 bytes per token) and the work space fit together. */
static int64_t default_max_input(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return (int64_t)1 << 30;
    return (int64_t)pages / 8 * (int64_t)page;
}

/* After "stdin holds more than N bytes, the most kiln reads from it". */
#define MAX_INPUT_HINT " (--max-input): give a file, or a larger --max-input"

#define MAX_INPUT_HELP                                                                             \
    "bytes of one input (a file or stdin) read into memory; the default is an eighth of this "     \
    "machine's memory"

/* Read all of path ("-" or NULL: stdin) into a malloc'd buffer: a regular file only (a FIFO
 * or device is refused by kiln_file_read), and at most max bytes either way. */
static int read_all(const char *path, size_t max, char **out, size_t *len) {
    int from_stdin = !path || !strcmp(path, "-");
    kiln_status st = from_stdin ? tool_read_stdin(max, MAX_INPUT_HINT, out, len)
                                : kiln_file_read(path, max, out, len);
    if (st == KILN_ERR_RANGE && !from_stdin)
        kiln_error_wrapf(st, "--max-input %zu", max);
    if (st != KILN_OK) {
        tool_report(from_stdin ? "reading stdin" : "reading the input", st);
        return 1;
    }
    return 0;
}

#define TRY_STATUS(expr)                                                                           \
    do {                                                                                           \
        kiln_status s_ = (expr);                                                                   \
        if (s_ != KILN_OK)                                                                         \
            return s_;                                                                             \
    } while (0)

static int load(const char *spec, kiln_tokenizer **t) {
    kiln_status s = tool_tokenizer_load(t, spec);
    if (s != KILN_OK) {
        tool_report("loading the tokenizer", s);
        return 1;
    }
    return 0;
}

static int write_ids(const int32_t *ids, int64_t n) {
    char buf[1 << 16];
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        if (at > sizeof buf - 16) {
            if (fwrite(buf, 1, at, stdout) != at)
                return 1;
            at = 0;
        }
        char tmp[12];
        int k = 0;
        uint32_t v = (uint32_t)ids[i];
        do {
            tmp[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        if (i)
            buf[at++] = ' ';
        while (k)
            buf[at++] = tmp[--k];
    }
    buf[at++] = '\n';
    return fwrite(buf, 1, at, stdout) != at;
}

/* Encode one input and print its ids on one line. */
static int encode_one(const kiln_tokenizer *t, const char *path, size_t max_input) {
    char *text = NULL;
    size_t len = 0;
    if (read_all(path, max_input, &text, &len))
        return 1;
    kiln_tokens ids = {0};
    kiln_status s = kiln_tokenizer_encode_parallel(t, text, len, &ids);
    int rc = 0;
    if (s != KILN_OK) {
        tool_report(path ? path : "stdin", s);
        rc = 1;
    } else if (write_ids(ids.ids, ids.len)) {
        fprintf(stderr, "kiln: cannot write the ids: %s\n", strerror(errno));
        rc = 1;
    }
    kiln_tokens_free(&ids);
    free(text);
    return rc;
}

static int tok_cmd_encode(int argc, char **argv) {
    const char *spec = "gpt2";
    int64_t threads = 0, max_input = default_max_input();
    tool_flag flags[] = {
        {"tokenizer", TOOL_FLAG_STRING, &spec, "gpt2, bytes, or a trained tokenizer file"},
        {"threads", TOOL_FLAG_INT, &threads, "threads to encode with (0: OpenMP's default)",
         TOOL_MIN(0)},
        {"max-input", TOOL_FLAG_INT, &max_input, MAX_INPUT_HELP, TOOL_MIN(1)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, 3, argc, argv, &npos,
                              "usage: kiln tokenizer encode [flags] [FILE...]\n"
                              "Print the token ids of each FILE (stdin when none, or -), "
                              "spaced, one line per FILE.");
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (threads > 0)
        omp_set_num_threads((int)threads);
    kiln_tokenizer *t = NULL;
    if (load(spec, &t))
        return 1;
    rc = 0;
    for (int i = 1; i <= (npos ? npos : 1) && !rc; i++)
        rc = encode_one(t, npos ? argv[i] : NULL, (size_t)max_input);
    if (!rc && fflush(stdout)) {
        fprintf(stderr, "kiln: cannot write the ids: %s\n", strerror(errno));
        rc = 1;
    }
    kiln_tokenizer_free(t);
    return rc;
}

/* Ids separated by white space; anything else is an error naming its byte offset. */
static int parse_ids(const char *s, size_t len, kiln_tokens *ids) {
    size_t i = 0;
    while (i < len) {
        if (isspace((unsigned char)s[i])) {
            i++;
            continue;
        }
        size_t start = i;
        int64_t v = 0;
        while (i < len && s[i] >= '0' && s[i] <= '9' && v <= INT32_MAX)
            v = v * 10 + (s[i++] - '0');
        if (i == start || v > INT32_MAX || (i < len && !isspace((unsigned char)s[i]))) {
            size_t end = start;
            while (end < len && end - start < 20 && !isspace((unsigned char)s[end]))
                end++;
            fprintf(stderr, "kiln: '%.*s' at byte %zu is not a token id\n", (int)(end - start),
                    s + start, start);
            return 1;
        }
        kiln_status st = kiln_tokens_reserve(ids, 1);
        if (st != KILN_OK) {
            tool_report("reading ids", st);
            return 1;
        }
        ids->ids[ids->len++] = (int32_t)v;
    }
    return 0;
}

static int tok_cmd_decode(int argc, char **argv) {
    const char *spec = "gpt2";
    int64_t max_input = default_max_input();
    tool_flag flags[] = {
        {"tokenizer", TOOL_FLAG_STRING, &spec, "gpt2, bytes, or a trained tokenizer file"},
        {"max-input", TOOL_FLAG_INT, &max_input, MAX_INPUT_HELP, TOOL_MIN(1)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, 2, argc, argv, &npos,
                              "usage: kiln tokenizer decode [flags] [FILE]\n"
                              "Write the bytes of the token ids in FILE (stdin when absent or "
                              "-) to stdout.");
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos > 1) {
        fprintf(stderr, "kiln tokenizer decode: one FILE at most\n");
        return 2;
    }
    kiln_tokenizer *t = NULL;
    char *text = NULL;
    size_t len = 0;
    kiln_tokens ids = {0};
    kiln_bytes out = {0};
    rc = load(spec, &t) || read_all(npos ? argv[1] : NULL, (size_t)max_input, &text, &len) ||
         parse_ids(text, len, &ids);
    if (!rc) {
        kiln_status s = kiln_tokenizer_decode(t, ids.ids, ids.len, &out);
        if (s != KILN_OK) {
            tool_report("decoding", s);
            rc = 1;
        } else if (fwrite(out.data, 1, out.len, stdout) != out.len || fflush(stdout)) {
            fprintf(stderr, "kiln: cannot write the text: %s\n", strerror(errno));
            rc = 1;
        }
    }
    kiln_bytes_free(&out);
    kiln_tokens_free(&ids);
    free(text);
    kiln_tokenizer_free(t);
    return rc;
}

static void on_note(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "kiln tokenizer train: %s\n", line);
}

/* Count the pieces of every document of the inputs (kiln prepare's rules: files, folders,
 * .jsonl) and of stdin when one input is "-". *bytes: the text bytes counted. */
static kiln_status add_inputs(kiln_bpe_trainer *tr, char **inputs, int n, const char *binary,
                              size_t max_input, size_t *bytes) {
    int use_stdin = 0, nfiles = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(inputs[i], "-"))
            use_stdin = 1;
        else
            inputs[nfiles++] = inputs[i]; /* the files, in order */
    }
    kiln_prepare_config cfg;
    kiln_prepare_config_default(&cfg);
    cfg.inputs = (const char *const *)inputs;
    cfg.num_inputs = nfiles;
    cfg.binary = !strcmp(binary, "skip")     ? KILN_PREPARE_BINARY_SKIP
                 : !strcmp(binary, "encode") ? KILN_PREPARE_BINARY_ENCODE
                                             : KILN_PREPARE_BINARY_ERROR;
    cfg.note = on_note;
    if (nfiles > 0) {
        kiln_documents *docs = NULL;
        TRY_STATUS(kiln_documents_open(&docs, &cfg));
        kiln_status st;
        for (;;) {
            const char *text;
            size_t len;
            if ((st = kiln_documents_next(docs, &text, &len)) != KILN_OK || !text)
                break;
            *bytes += len;
            if ((st = kiln_bpe_trainer_add(tr, text, len)) != KILN_OK)
                break;
        }
        kiln_documents_close(docs);
        TRY_STATUS(st);
    }
    if (use_stdin) {
        char *text = NULL;
        size_t len = 0;
        TRY_STATUS(tool_read_stdin(max_input, MAX_INPUT_HINT, &text, &len));
        *bytes += len;
        kiln_status st = kiln_bpe_trainer_add(tr, text, len);
        free(text);
        TRY_STATUS(st);
    }
    return KILN_OK;
}

static int tok_cmd_train(int argc, char **argv) {
    int64_t vocab = 0, max_input = default_max_input();
    const char *out = "tokenizer.kbpe", *binary = "error";
    tool_flag flags[] = {
        {"vocab", TOOL_FLAG_INT, &vocab,
         "vocabulary size: 256 bytes + merges + <|endoftext|> (required)", TOOL_MIN(257)},
        {"out", TOOL_FLAG_STRING, &out, "file to write the tokenizer to"},
        {"binary", TOOL_FLAG_STRING, &binary, "binary input files: error, skip or encode"},
        {"max-input", TOOL_FLAG_INT, &max_input,
         "bytes read from stdin (-) at most; the default is an eighth of this machine's memory",
         TOOL_MIN(1)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, 4, argc, argv, &npos,
                              "usage: kiln tokenizer train --vocab N [--out FILE] INPUTS...\n"
                              "Learn a byte-level BPE (GPT-2's pre-tokenisation) from INPUTS, read "
                              "as kiln prepare reads them:\ntext files (one document each), "
                              "folders of them (recursively), .jsonl files (the \"text\" of\neach "
                              "line), and - for stdin.");
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos < 1 || vocab == 0) {
        fprintf(stderr, "kiln tokenizer train: give --vocab N (N >= 257) and at least one FILE\n");
        return 2;
    }
    if (strcmp(binary, "error") && strcmp(binary, "skip") && strcmp(binary, "encode")) {
        fprintf(stderr, "kiln tokenizer train: --binary wants error, skip or encode, got '%s'\n",
                binary);
        return 2;
    }
    double t0 = kiln_time_ms();
    kiln_bpe_trainer *tr = NULL;
    kiln_tokenizer *t = NULL;
    size_t bytes = 0;
    kiln_status s = kiln_bpe_trainer_init(&tr);
    if (s == KILN_OK)
        s = add_inputs(tr, argv + 1, npos, binary, (size_t)max_input, &bytes);
    if (s == KILN_OK)
        s = kiln_bpe_trainer_finish(tr, vocab, &t);
    if (s == KILN_OK)
        s = kiln_tokenizer_save(t, out);
    if (s != KILN_OK) {
        tool_report("training the tokenizer", s);
        rc = 1;
    } else {
        int64_t got = kiln_tokenizer_vocab_size(t);
        fprintf(stderr, "kiln: %s: %lld ids (%lld merges) learned from %.1f MB in %.1f s%s\n", out,
                (long long)got, (long long)(got - 257), (double)bytes / 1e6,
                (kiln_time_ms() - t0) / 1000.0,
                got < vocab ? "; the text held no more pairs to merge" : "");
    }
    kiln_tokenizer_free(t);
    kiln_bpe_trainer_free(tr);
    return rc;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "kiln tokenizer: say which: encode, decode or train\n%s\n", usage_top);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("%s\n", usage_top);
        return 0;
    }
    if (!strcmp(argv[1], "encode"))
        return tok_cmd_encode(argc - 1, argv + 1);
    if (!strcmp(argv[1], "decode"))
        return tok_cmd_decode(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train"))
        return tok_cmd_train(argc - 1, argv + 1);
    fprintf(stderr, "kiln tokenizer: unknown command '%s'\n%s\n", argv[1], usage_top);
    return 2;
}
