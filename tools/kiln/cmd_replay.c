/* kiln replay: one step of a run re-run from its checkpoint (kiln_train_replay), with the
 * run's own kiln train flags (cmd_train.c parses them) and its report. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/core.h"
#include "kiln/train.h"
#include "tool_common.h"

const char *tool_replay_usage =
    "usage: kiln replay --step N [the run's kiln train flags]\n\n"
    "Re-run step N of a run from its newest checkpoint before N (its --checkpoint-dir, or\n"
    "--resume DIR) and its data position, to tell a bad batch from a numeric blow-up: the\n"
    "steps in between run again, then step N's batches and those of the 3 steps after it go\n"
    "through forward and backward with the same weights, without an update. Prints the\n"
    "step's loss and gradient norm, each sequence's loss, the batches after it, and a verdict:\n"
    "bad_batch (skip it with --skip-batches N:1), numeric (the weights themselves blew up) or\n"
    "not_reproduced. With --metrics FILE (the run's log, read, not written) the step's logged\n"
    "loss is compared with the replay's. Nothing of the run is written. Give it the flags of\n"
    "the run (under mpirun, the same number of ranks).";

/* The run's logged loss and norm of `step` (its last line for the step: after a rollback the
 * step ran again); 0 when not found. */
static int logged_step(const char *path, int64_t step, double *loss, double *norm) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[4096], key[48];
    snprintf(key, sizeof key, "{\"step\": %lld,", (long long)step);
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\": "), *g = strstr(line, "\"grad_norm\": ");
        if (strncmp(line, key, strlen(key)) || !l || !g)
            continue;
        *loss = strncmp(l + 8, "null", 4) ? strtod(l + 8, NULL) : NAN;
        *norm = strncmp(g + 13, "null", 4) ? strtod(g + 13, NULL) : NAN;
        found = 1;
    }
    fclose(f);
    return found;
}

/* The replay and its report (rank 0 prints). */
int tool_replay(const kiln_train_config *cfg, int64_t step, const char *run_log, int rank,
                const char *what) {
    kiln_replay_report r;
    kiln_status s = kiln_train_replay(cfg, step, &r);
    if (s) {
        tool_report(what, s);
        kiln_replay_report_free(&r);
        return 1;
    }
    if (rank == 0) {
        printf("replay of step %lld from the checkpoint of step %lld:\n", (long long)step,
               (long long)r.from_step);
        if (!isnan(r.prev_loss))
            printf("  step %lld (the step before): loss %.6f\n", (long long)(step - 1),
                   r.prev_loss);
        printf("  step %lld: loss %.6f, gradient norm %.6f\n", (long long)step, r.loss,
               r.grad_norm);
        /* the sequences with the highest losses */
        int64_t worst[3] = {-1, -1, -1};
        for (int64_t i = 0; i < r.nseq; i++)
            for (int k = 0; k < 3; k++)
                if (worst[k] < 0 || !(r.seq_loss[i] <= r.seq_loss[worst[k]])) {
                    for (int j = 2; j > k; j--)
                        worst[j] = worst[j - 1];
                    worst[k] = i;
                    break;
                }
        printf("  its %lld sequences' losses (this rank's):", (long long)r.nseq);
        for (int64_t i = 0; i < r.nseq && i < 32; i++)
            printf(" %.3f", r.seq_loss[i]);
        printf("%s\n  highest:", r.nseq > 32 ? " ..." : "");
        for (int k = 0; k < 3 && worst[k] >= 0; k++)
            printf(" sequence %lld (micro-batch %lld, row %lld) %.3f", (long long)worst[k],
                   (long long)(worst[k] / cfg->data.B), (long long)(worst[k] % cfg->data.B),
                   r.seq_loss[worst[k]]);
        printf("\n");
        for (int k = 0; k < r.nothers; k++)
            printf("  the batches of step %lld, same weights: loss %.6f, gradient norm %.6f\n",
                   (long long)(step + 1 + k), r.other_loss[k], r.other_norm[k]);
        double ll = 0.0, ln = 0.0;
        if (run_log && logged_step(run_log, step, &ll, &ln))
            printf("  the run's log (%s) has step %lld at loss %.6f, gradient norm %.6f: %s\n",
                   run_log, (long long)step, ll, ln,
                   fabs(ll - r.loss) <= 1e-6 * fmax(1.0, fabs(ll))
                       ? "the replay reproduces it"
                       : "the replay differs (the step was not deterministic, or a fault was "
                         "injected or transient)");
        else if (run_log)
            printf("  the run's log (%s) has no line for step %lld\n", run_log, (long long)step);
        printf("verdict: %s: %s\n", r.verdict, r.why);
    }
    kiln_replay_report_free(&r);
    return 0;
}

/* kiln replay --step N <the run's kiln train flags> */
int cmd_replay(int argc, char **argv) {
    int64_t step = 0;
    const char *bad = NULL; /* a --step given out of range */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return 1;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (i > 0 && !strcmp(argv[i], "--step") && i + 1 < argc)
            v = argv[++i];
        else if (i > 0 && !strncmp(argv[i], "--step=", 7))
            v = argv[i] + 7;
        if (!v) {
            rest[n++] = argv[i];
            continue;
        }
        char *end = NULL;
        long long x = strtoll(v, &end, 10);
        step = end != v && !*end && x >= 2 && x <= (1LL << 40) ? x : -1;
        bad = step < 0 ? v : NULL;
    }
    int help = 0;
    for (int i = 1; i < n; i++)
        help |= !strcmp(rest[i], "--help") || !strcmp(rest[i], "-h");
    if (bad && !help) {
        free(rest);
        return tool_flag_refuse("kiln replay", "step", bad,
                                "a whole number 2..1099511627776 (a step after a checkpoint)");
    }
    if (step <= 0 && !help) {
        fprintf(stderr, "kiln replay: --step N (2 or more: a step after a checkpoint) is "
                        "required\n\n%s\n",
                tool_replay_usage);
        free(rest);
        return 2;
    }
    int rc = tool_train_main(n, rest, step > 0 ? step : 2);
    free(rest);
    return rc;
}
