/* Tokenizer load time: each SPEC loaded REPEAT times, best and first in milliseconds. The
 * first load of a tokenizer.json whose prepared form is absent parses the JSON and writes it;
 * later loads read the prepared form.
 *   bench_tokenizer_load [--repeat N] SPEC...
 * Prints "load SPEC first_ms best_ms" per spec. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/tokenizer.h"

int main(int argc, char **argv) {
    int repeat = 10, i = 1;
    if (argc > 2 && !strcmp(argv[1], "--repeat")) {
        repeat = atoi(argv[2]);
        i = 3;
    }
    if (i >= argc || repeat < 1) {
        fprintf(stderr, "usage: bench_tokenizer_load [--repeat N] SPEC...\n");
        return 2;
    }
    for (; i < argc; i++) {
        double first = 0, best = 1e30;
        for (int r = 0; r < repeat; r++) {
            kiln_tokenizer *t = NULL;
            double t0 = kiln_time_ms();
            if (kiln_tokenizer_load(&t, argv[i]) != KILN_OK) {
                fprintf(stderr, "bench_tokenizer_load: %s\n", kiln_error_message());
                return 1;
            }
            double ms = kiln_time_ms() - t0;
            kiln_tokenizer_free(t);
            if (r == 0)
                first = ms;
            if (ms < best)
                best = ms;
        }
        printf("load %s %.1f %.1f\n", argv[i], first, best);
    }
    return 0;
}
