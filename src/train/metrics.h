/* Per-step metrics: one JSON object per line, and the console line a person reads. */
#ifndef KILN_TRAIN_METRICS_H
#define KILN_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/status.h"
#include "kiln/train.h"

/* The metrics log (JSON Lines). A line the file cannot take (a full disk, an I/O error) does
 * not stop the run: the file is cut back to its last whole line, the line is kept in memory
 * (up to KILN__METRICS_KEEP bytes, the oldest dropped beyond) and written before the next
 * one; the console says so once, and again when writing works again. */
typedef struct kiln__metrics kiln__metrics;
enum { KILN__METRICS_KEEP = 64 << 20 };

/* Open path for writing: truncated, or appended to (a resumed run keeps the lines before). A
 * FIFO that no process reads fails at once. */
kiln_status kiln__metrics_open(kiln__metrics **out, const char *path, int append);
/* One line (without its newline). */
void kiln__metrics_line(kiln__metrics *m, const char *line, FILE *log);
/* The lines kept, tried once more, then the file closed; lines that still cannot be written
 * go to a file of their own (in the temporary folder), and log says where. NULL is safe. */
void kiln__metrics_close(kiln__metrics *m, FILE *log);
/* Lines kept in memory now (tests). */
int64_t kiln__metrics_pending(const kiln__metrics *m);
/* Test aid: the next `count` writes fail as with a full disk (ENOSPC), the first of them
 * after writing half its bytes. */
void kiln__metrics_fail_writes(kiln__metrics *m, int count);

/* A step's object, into buf (cap bytes). */
void kiln__train_metrics_format(char *buf, size_t cap, const kiln_step_info *s);
void kiln__train_metrics_console(FILE *log, const kiln_step_info *s);

#endif
