/* kiln: the training data loader over token shards.
 *
 * Shards are read with pread (kiln/shard.h), one read of T+1 ids per window, so a shard
 * truncated during a run is an error naming it, not a SIGBUS. A batch is B windows of T+1
 * consecutive tokens: inputs are the first T, targets the last T. Each epoch visits the windows in
 * a deterministic shuffled order drawn from the run's seed; with `world` data-parallel ranks each
 * rank takes a disjoint slice of that order. The state (epoch, position, rng) can be saved and
 * restored so that a resumed run sees exactly the batches it would have seen.
 *
 * A folder path means every "*.bin" in it: `kiln prepare` puts train and val shards in
 * one folder, so name them with a pattern ("data/brown/train_*.bin"). Shards are taken in
 * name order, numbers in names compared as numbers (train_999 before train_1000). Only
 * regular files are shards: a FIFO, device or socket is refused by name, never opened.
 * Every shard is verified on open (kiln/shard.h) and must hold at least T+1 tokens; all
 * must record the same vocabulary size and, where they record one, the same tokenizer.
 *
 * The folder of each shard is checked against kiln prepare's records: a folder holding
 * "prepare.incomplete" (a prepare cut short in its last step, old and new shards mixed) is
 * refused, and when the folder has a prepare.json, every shard taken from it must be listed
 * there with the same token count and checksum. A folder with neither is not checked.
 * A restored state is only meaningful with the same shards, B, T, world size and rank. */
#ifndef KILN_LOADER_H
#define KILN_LOADER_H

#include <stdint.h>

#include "kiln/shard.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_loader_config {
    const char *path; /* one shard, a folder of shards, or a glob ("data/train_*.bin") */
    int64_t B, T;
    int rank, world; /* world >= 1, 0 <= rank < world */
    uint64_t seed;
    int shuffle; /* 0: windows in file order (evaluation) */
} kiln_loader_config;

typedef struct kiln_loader_state {
    uint64_t epoch;
    uint64_t position; /* batches taken in this epoch by this rank */
    uint64_t seed;
} kiln_loader_state;

typedef struct kiln_loader kiln_loader; /* opaque */

kiln_status kiln_loader_open(kiln_loader **out, const kiln_loader_config *cfg);
void kiln_loader_close(kiln_loader *l);
/* Fill inputs and targets (B*T ids each) with the next batch; wraps into the next epoch.
 * A shard that no longer holds its ids (truncated since it was opened) is KILN_ERR_IO naming
 * it; the position is then not advanced. */
kiln_status kiln_loader_next(kiln_loader *l, int32_t *inputs, int32_t *targets);
/* Vocabulary size recorded in the shards (all shards must agree). */
int64_t kiln_loader_vocab_size(const kiln_loader *l);
/* The tokenizer identity (kiln_tokenizer_id) recorded in the shards; 0 when none records one
 * (version 1 shards). */
uint64_t kiln_loader_tokenizer_id(const kiln_loader *l);
int64_t kiln_loader_num_tokens(const kiln_loader *l);
/* Batches in one epoch for this rank. */
int64_t kiln_loader_batches_per_epoch(const kiln_loader *l);
/* Windows of T+1 tokens over all shards (window k of a shard starts at token k*T). */
int64_t kiln_loader_num_windows(const kiln_loader *l);
/* The content of the data: XXH3 over every shard's token count and token checksum (the
 * headers'), in order. Two loaders over the same tokens in the same shards agree; the
 * same token count of other text does not. */
uint64_t kiln_loader_content_hash(const kiln_loader *l);
int kiln_loader_num_shards(const kiln_loader *l);
/* Shard i (in the loader's order): its path and header; NULL outside [0, num_shards). */
const char *kiln_loader_shard_path(const kiln_loader *l, int i);
const kiln_shard_info *kiln_loader_shard_info(const kiln_loader *l, int i);
kiln_loader_state kiln_loader_get_state(const kiln_loader *l);
kiln_status kiln_loader_set_state(kiln_loader *l, const kiln_loader_state *s);

#ifdef __cplusplus
}
#endif
#endif
