/* TensorBoard event files: the step's scalars as tf.Event records, for `kiln train
 * --tensorboard DIR` (rank 0). A record is its length (u64, little-endian), the length's
 * masked CRC32C, an Event protocol buffer (wall_time, step, and a Summary of tag/simple_value
 * pairs; the first record holds file_version "brain.Event:2") and its masked CRC32C. The CRC
 * is ISA-L's (crc32_iscsi). A write that fails is a warning and the run goes on: the records
 * of the steps meanwhile are lost, and the file never holds part of a record. */
#ifndef KILN_TRAIN_TFEVENTS_H
#define KILN_TRAIN_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/status.h"
#include "kiln/train.h"

typedef struct kiln__tfevents kiln__tfevents;

/* DIR (made, with its parents) and a new events.out.tfevents.<seconds>.<host>.<pid> in it. */
kiln_status kiln__tfevents_open(kiln__tfevents **out, const char *dir);
/* One event at step with n scalars (tags[i], values[i]); non-finite values are left out. */
void kiln__tfevents_scalars(kiln__tfevents *w, int64_t step, const char *const *tags,
                            const double *values, int n, FILE *log);
/* A step's scalars as kiln train logs them: train/loss, train/lr, train/grad_norm, val/loss,
 * perf/step_ms, perf/tokens_per_s, perf/mfu, mem/peak_rss_mb, and where they apply
 * train/loss_scale, guard/skipped, guard/clipped_spike, comm/ms, comm/hidden. */
void kiln__tfevents_step(kiln__tfevents *w, const kiln_step_info *s, FILE *log);
/* The file's path (for messages). */
const char *kiln__tfevents_path(const kiln__tfevents *w);
void kiln__tfevents_close(kiln__tfevents *w);

/* The record framing (tests): CRC32C of n bytes, and TensorBoard's mask of it. */
uint32_t kiln__crc32c(const void *data, size_t n);
uint32_t kiln__crc32c_masked(const void *data, size_t n);

#endif
