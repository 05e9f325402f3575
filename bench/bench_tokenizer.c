/* Tokenizer throughput: encode the given files (each one document) with one thread, then
 * the documents spread over all OpenMP threads (kiln_tokenizer_encode_many), then all of them
 * joined as one text cut for the threads (kiln_tokenizer_encode_parallel). One line per case:
 *   kiln <case> <threads> <MB> <seconds> <MB/s> <tokens>
 * bench/bench_tokenizer.sh runs this next to tiktoken and prints the table. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/tokenizer.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

typedef struct corpus {
    int64_t n;
    char **texts;
    size_t *lens;
    size_t bytes;
} corpus;

/* Best time of `repeat` runs of one case; returns tokens made. */
static int64_t run(const kiln_tokenizer *t, const corpus *c, int mode, int repeat, double *best) {
    int64_t ntok = 0;
    *best = 1e30;
    kiln_tokens *outs = calloc((size_t)c->n, sizeof *outs);
    for (int r = 0; r < repeat; r++) {
        for (int64_t i = 0; i < c->n; i++)
            outs[i].len = 0;
        double t0 = kiln_time_ms();
        kiln_status s = KILN_OK;
        if (mode == 0) { /* one thread, one document after another */
            for (int64_t i = 0; i < c->n && s == KILN_OK; i++)
                s = kiln_tokenizer_encode(t, c->texts[i], c->lens[i], &outs[i]);
        } else if (mode == 1) { /* documents spread over threads */
            s = kiln_tokenizer_encode_many(t, (const char *const *)c->texts, c->lens, c->n, outs);
        } else { /* one text (the documents joined), cut into parts for the threads */
            s = kiln_tokenizer_encode_parallel(t, c->texts[0], c->lens[0], &outs[0]);
        }
        double dt = (kiln_time_ms() - t0) / 1000.0;
        if (s != KILN_OK) {
            fprintf(stderr, "bench_tokenizer: %s: %s\n", kiln_status_str(s), kiln_error_message());
            exit(1);
        }
        if (dt < *best)
            *best = dt;
    }
    for (int64_t i = 0; i < c->n; i++) {
        ntok += outs[i].len;
        kiln_tokens_free(&outs[i]);
    }
    free(outs);
    return ntok;
}

int main(int argc, char **argv) {
    const char *spec = "gpt2";
    int repeat = 3, first = 1;
    while (first < argc && !strncmp(argv[first], "--", 2)) {
        if (!strcmp(argv[first], "--tokenizer") && first + 1 < argc)
            spec = argv[first + 1];
        else if (!strcmp(argv[first], "--repeat") && first + 1 < argc)
            repeat = atoi(argv[first + 1]);
        else
            break;
        first += 2;
    }
    if (first >= argc || repeat < 1) {
        fprintf(stderr, "usage: bench_tokenizer [--tokenizer NAME] [--repeat N] FILE...\n");
        return 2;
    }
    corpus c = {argc - first, calloc((size_t)(argc - first), sizeof(char *)),
                calloc((size_t)(argc - first), sizeof(size_t)), 0};
    for (int64_t i = 0; i < c.n; i++) {
        c.texts[i] = read_file(argv[first + i], &c.lens[i]);
        if (!c.texts[i]) {
            fprintf(stderr, "bench_tokenizer: cannot read %s\n", argv[first + i]);
            return 1;
        }
        c.bytes += c.lens[i];
    }
    kiln_tokenizer *t = NULL;
    /* "gpt2": its files from $KILN_GPT2_DIR (bench_tokenizer.sh sets it). */
    const char *gpt2_dir = getenv("KILN_GPT2_DIR");
    if (!strcmp(spec, "gpt2") && gpt2_dir && gpt2_dir[0])
        spec = gpt2_dir;
    double t0 = kiln_time_ms();
    if (kiln_tokenizer_load(&t, spec) != KILN_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", kiln_error_message());
        return 1;
    }
    printf("kiln load 1 0 %.4f 0 0\n", (kiln_time_ms() - t0) / 1000.0);
    /* the joined text, for encode_parallel */
    corpus joined = {1, calloc(1, sizeof(char *)), calloc(1, sizeof(size_t)), c.bytes};
    joined.texts[0] = malloc(c.bytes ? c.bytes : 1);
    joined.lens[0] = c.bytes;
    for (int64_t i = 0, at = 0; i < c.n; at += (int64_t)c.lens[i], i++)
        memcpy(joined.texts[0] + at, c.texts[i], c.lens[i]);
    int all = omp_get_max_threads();
    const char *names[3] = {"documents-1-thread", "encode_many", "encode_parallel"};
    for (int mode = 0; mode < 3; mode++) {
        int threads = mode == 0 ? 1 : all;
        omp_set_num_threads(threads);
        double best;
        int64_t ntok = run(t, mode == 2 ? &joined : &c, mode, repeat, &best);
        printf("kiln %s %d %.3f %.4f %.2f %lld\n", names[mode], threads, (double)c.bytes / 1e6,
               best, (double)c.bytes / 1e6 / best, (long long)ntok);
        fflush(stdout);
    }
    free(joined.texts[0]);
    free(joined.texts);
    free(joined.lens);
    kiln_tokenizer_free(t);
    for (int64_t i = 0; i < c.n; i++)
        free(c.texts[i]);
    free(c.texts);
    free(c.lens);
    return 0;
}
