/* The stability guards' verdicts replayed over a run's metrics file: the guards' own code
 * (train/guard.c) fed each step's loss and gradient norm in turn, as the trainer feeds it.
 * Used by bench_guards.py to weigh guard settings against healthy and diverging runs.
 *
 *   bench_guard_replay [--window N] [--z X] [--norm-skip 0|1] [--ceiling NATS] [--max-bad N]
 *                      METRICS.jsonl
 *
 * --ceiling NATS (0: off) replays the ceiling as the trainer sets it: from the second step, the
 * first step's loss plus NATS.
 * --norm-skip 0 replays "a gradient-norm spike of a clipped run trains on": such a verdict is
 * counted apart (clipped_spikes) and is no bad step. Prints one JSON object: bad_steps (steps
 * judged bad), first_bad (the first such step, 0: none), stop_step (the step at which
 * --max-bad bad steps in a row would roll back or stop, 0: never), clipped_spikes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/guard.h"

/* The number after "key": in line (null, absent or unparsable: NaN). */
static double field(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    if (!p)
        return NAN;
    p += strlen(pat);
    char *end = NULL;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

int main(int argc, char **argv) {
    long window = 50, max_bad = 3;
    double z = 6.0, ceiling = 0.0;
    int norm_skip = 1;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--window") && i + 1 < argc)
            window = atol(argv[++i]);
        else if (!strcmp(argv[i], "--z") && i + 1 < argc)
            z = atof(argv[++i]);
        else if (!strcmp(argv[i], "--norm-skip") && i + 1 < argc)
            norm_skip = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ceiling") && i + 1 < argc)
            ceiling = atof(argv[++i]);
        else if (!strcmp(argv[i], "--max-bad") && i + 1 < argc)
            max_bad = atol(argv[++i]);
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "usage: bench_guard_replay [--window N] [--z X] [--norm-skip 0|1] "
                            "[--ceiling NATS] [--max-bad N] METRICS.jsonl\n");
            return 2;
        }
    }
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) {
        fprintf(stderr, "bench_guard_replay: cannot open %s\n", path ? path : "(no file)");
        return 2;
    }
    kiln_guard g;
    if (kiln__guard_init(&g, window, z) != KILN_OK) {
        fprintf(stderr, "bench_guard_replay: bad --window or --z\n");
        fclose(f);
        return 2;
    }
    char line[4096];
    long bad = 0, first_bad = 0, stop = 0, in_a_row = 0, clipped = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "\"event\"") || !strstr(line, "\"step\""))
            continue;
        long step = (long)field(line, "step");
        double loss = field(line, "loss"), norm = field(line, "grad_norm");
        double zs = 0.0, ratio = 0.0;
        kiln_guard_verdict v = kiln__guard_check(&g, loss, norm, &zs);
        if (ceiling > 0.0 && g.ceiling == 0.0 && isfinite(loss)) /* after the first step */
            g.ceiling = loss + ceiling;
        if (v == KILN_GUARD_NORM_SPIKE && !norm_skip) {
            clipped++;
            in_a_row = 0;
            kiln__guard_record(&g, step, v, loss, norm, 0.0, &ratio);
            continue;
        }
        kiln__guard_record(&g, step, v, loss, norm, 0.0, &ratio);
        if (v == KILN_GUARD_OK) {
            in_a_row = 0;
            continue;
        }
        bad++;
        if (!first_bad)
            first_bad = step;
        if (++in_a_row >= max_bad && !stop)
            stop = step;
    }
    fclose(f);
    kiln__guard_free(&g);
    printf("{\"bad_steps\": %ld, \"first_bad\": %ld, \"stop_step\": %ld, \"clipped_spikes\": "
           "%ld}\n",
           bad, first_bad, stop, clipped);
    return 0;
}
