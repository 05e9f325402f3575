/* kiln tokenizer: encode text to ids, decode ids to text, train a byte-level BPE. */
#include <ctype.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/core.h"
#include "kiln/tokenizer.h"
#include "tool_common.h"

static const char usage_top[] =
    "usage: kiln tokenizer encode [--tokenizer NAME] [FILE...]   ids of each FILE (or stdin)\n"
    "       kiln tokenizer decode [--tokenizer NAME] [FILE]      ids back to bytes\n"
    "       kiln tokenizer train --vocab N [--out FILE] FILES... learn a byte-level BPE\n"
    "NAME: gpt2, bytes, or a file written by `kiln tokenizer train`. Each command's --help\n"
    "lists its flags.";

/* Read all of path ("-" or NULL: stdin) into a malloc'd buffer. */
static int read_all(const char *path, char **out, size_t *len) {
    FILE *f = path && strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "kiln: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            char *b = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int err = !buf || ferror(f);
    if (f != stdin)
        fclose(f);
    if (err) {
        fprintf(stderr, "kiln: cannot read %s%s\n", path ? path : "stdin",
                buf ? "" : " (out of memory)");
        free(buf);
        return 1;
    }
    *out = buf;
    *len = n;
    return 0;
}

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
static int encode_one(const kiln_tokenizer *t, const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (read_all(path, &text, &len))
        return 1;
    kiln_tokens ids = {0};
    kiln_status s = kiln_tokenizer_encode_parallel(t, text, len, &ids);
    int rc = 0;
    if (s != KILN_OK) {
        tool_report(path ? path : "stdin", s);
        rc = 1;
    } else if (write_ids(ids.ids, ids.len)) {
        fprintf(stderr, "kiln: cannot write the ids\n");
        rc = 1;
    }
    kiln_tokens_free(&ids);
    free(text);
    return rc;
}

static int tok_cmd_encode(int argc, char **argv) {
    const char *spec = "gpt2";
    int64_t threads = 0;
    tool_flag flags[] = {
        {"tokenizer", TOOL_FLAG_STRING, &spec, "gpt2, bytes, or a trained tokenizer file"},
        {"threads", TOOL_FLAG_INT, &threads, "threads to encode with (0: OpenMP's default)"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, 2, argc, argv, &npos,
                              "usage: kiln tokenizer encode [flags] [FILE...]\n"
                              "Print the token ids of each FILE (stdin when none, or -), "
                              "spaced, one line per FILE.");
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (threads < 0) {
        fprintf(stderr, "kiln tokenizer encode: --threads must be >= 0\n");
        return 2;
    }
    if (threads > 0)
        omp_set_num_threads((int)threads);
    kiln_tokenizer *t = NULL;
    if (load(spec, &t))
        return 1;
    rc = 0;
    for (int i = 1; i <= (npos ? npos : 1) && !rc; i++)
        rc = encode_one(t, npos ? argv[i] : NULL);
    if (!rc && fflush(stdout)) {
        fprintf(stderr, "kiln: cannot write the ids\n");
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
    tool_flag flags[] = {
        {"tokenizer", TOOL_FLAG_STRING, &spec, "gpt2, bytes, or a trained tokenizer file"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, 1, argc, argv, &npos,
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
    rc = load(spec, &t) || read_all(npos ? argv[1] : NULL, &text, &len) ||
         parse_ids(text, len, &ids);
    if (!rc) {
        kiln_status s = kiln_tokenizer_decode(t, ids.ids, ids.len, &out);
        if (s != KILN_OK) {
            tool_report("decoding", s);
            rc = 1;
        } else if (fwrite(out.data, 1, out.len, stdout) != out.len || fflush(stdout)) {
            fprintf(stderr, "kiln: cannot write the text\n");
            rc = 1;
        }
    }
    kiln_bytes_free(&out);
    kiln_tokens_free(&ids);
    free(text);
    kiln_tokenizer_free(t);
    return rc;
}

static int tok_cmd_train(int argc, char **argv) {
    int64_t vocab = 0;
    const char *out = "tokenizer.kbpe";
    tool_flag flags[] = {
        {"vocab", TOOL_FLAG_INT, &vocab,
         "vocabulary size: 256 bytes + merges + <|endoftext|> (required, >= 257)"},
        {"out", TOOL_FLAG_STRING, &out, "file to write the tokenizer to"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, 2, argc, argv, &npos,
                              "usage: kiln tokenizer train --vocab N [--out FILE] FILES...\n"
                              "Learn a byte-level BPE (GPT-2's pre-tokenisation) from FILES.");
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos < 1 || vocab < 257) {
        fprintf(stderr, "kiln tokenizer train: give --vocab N (N >= 257) and at least one FILE\n");
        return 2;
    }
    double t0 = kiln_time_ms();
    kiln_bpe_trainer *tr = NULL;
    kiln_tokenizer *t = NULL;
    kiln_status s = kiln_bpe_trainer_init(&tr);
    size_t bytes = 0;
    for (int i = 1; i <= npos && s == KILN_OK; i++) {
        char *text = NULL;
        size_t len = 0;
        if (read_all(argv[i], &text, &len)) {
            kiln_bpe_trainer_free(tr);
            return 1;
        }
        bytes += len;
        s = kiln_bpe_trainer_add(tr, text, len);
        free(text);
    }
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
