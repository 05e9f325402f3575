/* Token shards and the loader: what writing, opening (with the full check) and batching
 * cost. Prints one table.
 *
 *   bench_loader [--tokens N] [--dir D] [--batches N]
 *
 * The shard is written to D (default $TMPDIR or /tmp) and removed after. Opening is
 * measured with the file in the page cache (just written), which is the usual case for a
 * run that starts after `kiln prepare`; a cold open adds the disk's read time. The check
 * reads the file through a small buffer; for scale, the table also times reading every id
 * back with kiln_shard_read (pread, widened to int32), the loader's own path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "kiln/core.h"
#include "kiln/loader.h"
#include "kiln/shard.h"

typedef struct batch_figures {
    double open_ms, first_ms, mean_ms, max_ms;
} batch_figures;

static int loader_figures(const char *path, int64_t B, int64_t T, int batches, batch_figures *f) {
    kiln_loader_config c = {path, B, T, 0, 1, 1234, 1};
    kiln_loader *l = NULL;
    double t0 = kiln_time_ms();
    if (kiln_loader_open(&l, &c) != KILN_OK) {
        fprintf(stderr, "loader: %s\n", kiln_error_message());
        return 1;
    }
    f->open_ms = kiln_time_ms() - t0;
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    t0 = kiln_time_ms();
    kiln_loader_next(l, in, tg); /* builds the epoch's order */
    f->first_ms = kiln_time_ms() - t0;
    double total = 0, worst = 0;
    for (int i = 0; i < batches; i++) {
        double a = kiln_time_ms();
        kiln_loader_next(l, in, tg);
        double d = kiln_time_ms() - a;
        total += d;
        worst = d > worst ? d : worst;
    }
    f->mean_ms = total / batches;
    f->max_ms = worst;
    free(in);
    free(tg);
    kiln_loader_close(l);
    return 0;
}

int main(int argc, char **argv) {
    int64_t n = 50000000;
    int batches = 2000;
    const char *d = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens"))
            n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir"))
            d = argv[i + 1];
        else if (!strcmp(argv[i], "--batches"))
            batches = atoi(argv[i + 1]);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/kiln_bench_loader_%ld.bin", d, (long)getpid());
    const int64_t V = 50257, chunk = 1 << 20;
    int32_t *ids = malloc((size_t)chunk * sizeof *ids);
    kiln_rng r;
    kiln_rng_seed(&r, 1);
    for (int64_t i = 0; i < chunk; i++)
        ids[i] = (int32_t)kiln_rng_below(&r, (uint64_t)V);

    kiln_shard_writer *w = NULL;
    double t0 = kiln_time_ms();
    if (kiln_shard_writer_open(&w, path, V) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_error_message());
        return 1;
    }
    for (int64_t done = 0; done < n; done += chunk)
        kiln_shard_writer_append(w, ids, n - done < chunk ? n - done : chunk);
    if (kiln_shard_writer_finish(w) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_error_message());
        return 1;
    }
    kiln_shard_writer_free(w);
    double write_ms = kiln_time_ms() - t0;
    double mb = (double)n * 2 / 1e6;

    double open_ms[2] = {0, 0}, hash_ms = 0;
    for (int k = 0; k < 2; k++) { /* the first open brings the pages in; the second finds them */
        kiln_shard *s = NULL;
        t0 = kiln_time_ms();
        if (kiln_shard_open(&s, path) != KILN_OK) {
            fprintf(stderr, "%s\n", kiln_error_message());
            return 1;
        }
        open_ms[k] = kiln_time_ms() - t0;
        int32_t *all = malloc((size_t)n * sizeof *all);
        t0 = kiln_time_ms();
        if (!all || kiln_shard_read(s, 0, n, all) != KILN_OK) {
            fprintf(stderr, "reading the ids back: %s\n", all ? kiln_error_message() : "no memory");
            return 1;
        }
        hash_ms = kiln_time_ms() - t0;
        free(all);
        kiln_shard_close(s);
    }

    batch_figures small, large;
    if (loader_figures(path, 4, 64, batches, &small) ||
        loader_figures(path, 8, 1024, batches, &large))
        return 1;
    unlink(path);

    printf("token shard of %lld ids (%.0f MB, V=%lld), page cache warm\n", (long long)n, mb,
           (long long)V);
    printf("  %-44s %10.1f ms  %7.2f GB/s\n", "write (stream, fsync, rename)", write_ms,
           mb / write_ms);
    printf("  %-44s %10.1f ms  %7.2f GB/s\n", "open: check all (first time)", open_ms[0],
           mb / open_ms[0]);
    printf("  %-44s %10.1f ms  %7.2f GB/s\n", "open: check all (again)", open_ms[1],
           mb / open_ms[1]);
    printf("  %-44s %10.1f ms  %7.2f GB/s  (open / this = %.2f)\n",
           "for scale: kiln_shard_read of every id", hash_ms, mb / hash_ms, open_ms[1] / hash_ms);
    printf("\nloader, shuffled, %d batches after the first\n", batches);
    printf("  %-12s %10s %14s %10s %10s %12s\n", "B x T", "open ms", "1st batch ms", "ms/batch",
           "max ms", "Mtokens/s");
    const batch_figures *f[2] = {&small, &large};
    const int64_t bt[2][2] = {{4, 64}, {8, 1024}};
    for (int k = 0; k < 2; k++) {
        char name[32];
        snprintf(name, sizeof name, "%lld x %lld", (long long)bt[k][0], (long long)bt[k][1]);
        printf("  %-12s %10.1f %14.2f %10.4f %10.3f %12.1f\n", name, f[k]->open_ms, f[k]->first_ms,
               f[k]->mean_ms, f[k]->max_ms, (double)(bt[k][0] * bt[k][1]) / f[k]->mean_ms / 1e3);
    }
    printf("(the 1st batch of an epoch builds that epoch's shuffled order of all windows; the\n"
           " batch times are one pread of T+1 ids per window, from the page cache)\n");
    free(ids);
    return 0;
}
