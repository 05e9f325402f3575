/* Per-step metrics: one JSON object per line, and the console line a person reads. */
#ifndef KILN_TRAIN_METRICS_H
#define KILN_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/status.h"
#include "kiln/train.h"

kiln_status kiln__train_metrics_write(FILE *f, const char *path, const kiln_step_info *s);
void kiln__train_metrics_console(FILE *log, const kiln_step_info *s);

#endif
