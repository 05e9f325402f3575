/* Internal to kiln prepare: the train and val outputs (ids cut into shards, the last shard
 * of each kept from being tiny) and the staging folder that makes a run's shards appear
 * together or not at all. */
#ifndef KILN_DATA_PREPARE_OUT_H
#define KILN_DATA_PREPARE_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/shard.h"
#include "kiln/status.h"

/* A finished shard, for prepare.json. */
typedef struct prep_shard_rec {
    int64_t tokens;
    uint64_t hash; /* XXH3 of its token bytes, as in its header */
} prep_shard_rec;

typedef struct prep_out {
    const char *name; /* "train" or "val": shards are <dir>/<name>_<i>.bin while staged */
    const char *dir;  /* the staging folder */
    int64_t vocab;
    uint64_t tokenizer_id; /* written into every shard */
    int64_t shard_tokens;  /* S */
    int64_t reserve;       /* R: ids held back so that the last shard gets at least R */
    kiln_shard_writer *w;  /* the shard being written, or NULL */
    int32_t *pend;         /* ids not yet given to a writer */
    int64_t npend, cap;
    int shards;           /* shards finished */
    int64_t tokens;       /* ids appended */
    prep_shard_rec *recs; /* [shards] */
    int recs_cap;
    int too_many; /* 1: it stopped at KILN_PREPARE_MAX_SHARDS */
} prep_out;

void kiln__prep_out_init(prep_out *o, const char *name, const char *dir, int64_t vocab,
                         int64_t shard_tokens, uint64_t tokenizer_id);
kiln_status kiln__prep_out_append(prep_out *o, const int32_t *ids, int64_t n);
/* Write what is held back and finish the last shard. */
kiln_status kiln__prep_out_finish(prep_out *o);
void kiln__prep_out_free(prep_out *o);

/* The published name of shard i of a split of n shards: "<name>_<i>.bin" with i padded to
 * 3 digits, or to the digits of n - 1 when that is more, so the names of a run sort in
 * order as strings too. */
void kiln__prep_shard_name(char *buf, size_t cap, const char *name, int i, int n);

/* Create out_dir (and parents), remove staging folders left by dead runs, and make
 * <out_dir>/.prepare.tmp.<pid>; *staging is malloc'ed. */
kiln_status kiln__prep_stage_begin(const char *out_dir, char **staging);
/* Publish the run: write out_dir/prepare.incomplete, remove the old prepare.json, move every
 * shard from staging into out_dir (kiln__prep_shard_name), remove <name>_<digits>.bin files
 * there that this run did not write, write manifest (a JSON text) as out_dir/prepare.json,
 * remove prepare.incomplete and staging. A commit cut short leaves prepare.incomplete, which
 * the loader refuses (kiln/loader.h). */
kiln_status kiln__prep_stage_commit(const char *out_dir, const char *staging, const prep_out *outs,
                                    int n_outs, const char *manifest);
/* Remove the staging folder and what is in it. */
void kiln__prep_stage_abort(const char *staging);

#endif
