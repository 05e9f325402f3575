/* The data a checkpoint was trained on, by content: state.json's "data" record (each split's
 * --data path and every shard's token count and XXH3, from the shards' headers), written with
 * every checkpoint and compared on resume, so that a re-prepared folder or a replaced shard of
 * another text with the same token count is refused, naming the checkpoint's file and this
 * run's. The token counts alone are in "data_hash" (kiln__trainer_data_hash). */
#ifndef KILN_TRAIN_TRAINER_DATA_H
#define KILN_TRAIN_TRAINER_DATA_H

#include <stdint.h>

#include "kiln/status.h"

struct kiln_trainer;
struct cJSON;

/* Add "data" to state.json's object j. */
void kiln__ckpt_put_data(const struct kiln_trainer *t, struct cJSON *j);
/* The checkpoint in folder (its state.json parsed in j) was trained on this run's tokens:
 * KILN_ERR_CONFIG naming both files otherwise. A checkpoint without "data" (an older kiln's)
 * passes with a note on the log that the content could not be compared. */
kiln_status kiln__ckpt_check_data(struct kiln_trainer *t, const char *folder,
                                  const struct cJSON *j);
/* The batch of a step could not be read (st: the loader's error, a shard truncated since it
 * was opened): the weights are still those of the last step done, the last good ones. One
 * process saves them to --save and publishes a checkpoint in flight before it returns the
 * error, which then says where they are; with several ranks (the others wait in the step's
 * collectives) the error alone, and every rank stops. */
kiln_status kiln__trainer_data_failed(struct kiln_trainer *t, kiln_status st);
/* The content of the training and validation data (kiln_loader_content_hash of each). */
uint64_t kiln__trainer_content_hash(const struct kiln_trainer *t);

#endif
