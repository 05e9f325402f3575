/* Internal to kiln prepare: the train and val outputs (ids cut into shards, the last shard
 * of each kept from being tiny) and the staging folder that makes a run's shards appear
 * together or not at all. */
#ifndef KILN_DATA_PREPARE_OUT_H
#define KILN_DATA_PREPARE_OUT_H

#include <stdint.h>

#include "kiln/shard.h"
#include "kiln/status.h"

typedef struct prep_out {
    const char *name; /* "train" or "val": shards are <dir>/<name>_000.bin, ... */
    const char *dir;  /* the staging folder */
    int64_t vocab;
    int64_t shard_tokens; /* S */
    int64_t reserve;      /* R: ids held back so that the last shard gets at least R */
    kiln_shard_writer *w; /* the shard being written, or NULL */
    int32_t *pend;        /* ids not yet given to a writer */
    int64_t npend, cap;
    int shards;     /* shards finished */
    int64_t tokens; /* ids appended */
} prep_out;

void kiln__prep_out_init(prep_out *o, const char *name, const char *dir, int64_t vocab,
                         int64_t shard_tokens);
kiln_status kiln__prep_out_append(prep_out *o, const int32_t *ids, int64_t n);
/* Write what is held back and finish the last shard. */
kiln_status kiln__prep_out_finish(prep_out *o);
void kiln__prep_out_free(prep_out *o);

/* Create out_dir (and parents), remove staging folders left by dead runs, and make
 * <out_dir>/.prepare.tmp.<pid>; *staging is malloc'ed. */
kiln_status kiln__prep_stage_begin(const char *out_dir, char **staging);
/* Move every shard from staging into out_dir, remove train_/val_ shards there that this run
 * did not write, write manifest (a JSON text) as out_dir/prepare.json, remove staging. */
kiln_status kiln__prep_stage_commit(const char *out_dir, const char *staging, const prep_out *outs,
                                    int n_outs, const char *manifest);
/* Remove the staging folder and what is in it. */
void kiln__prep_stage_abort(const char *staging);

#endif
