/* Per-step metrics: one JSON object per line, and the console line a person reads. */
#ifndef KILN_TRAIN_METRICS_H
#define KILN_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/status.h"

typedef struct train_step_metrics {
    int64_t step, steps;
    float loss, lr, grad_norm;
    double ms, tokens_per_s, mfu;
    float val_loss; /* NaN when this step did not evaluate */
    float loss_scale; /* fp16's loss scale after the step (0: no loss scaling) */
    int skipped;      /* this step's update was skipped (an fp16 overflow) */
    int64_t skipped_total;
    size_t rss;     /* peak resident bytes so far */
} train_step_metrics;

kiln_status kiln__train_metrics_write(FILE *f, const char *path, const train_step_metrics *s);
void kiln__train_metrics_console(FILE *log, const train_step_metrics *s);

#endif
