/* Resuming a checkpoint on another split of the same training: another number of ranks, another
 * micro-batch B or number of micro-batches, another ZeRO stage, more or fewer steps.
 *
 * What must stay equal is the training itself: the model, the data, the optimizer and its
 * schedule, the precision, the seed, and the global batch (every rank's micro-batches of B
 * together). Its configuration is a list of items (kiln__trainer_config_items), hashed for the
 * ranks' agreement and written into state.json by name, so that a resumed run names the item
 * that differs. The split of the global batch over ranks, the ZeRO stage, the data-parallel
 * flags and the steps are another hash (kiln__trainer_split_hash), which ranks must share but
 * a resumed run may change. */
#ifndef KILN_TRAIN_TRAINER_ELASTIC_H
#define KILN_TRAIN_TRAINER_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/model.h"

struct kiln_trainer;
struct cJSON;

enum { KILN__ITEM_INT, KILN__ITEM_REAL, KILN__ITEM_HEX };
enum { KILN__CONFIG_ITEMS_MAX = 64 };

/* One setting of the training: its name as a user sets it ("--lr"), and its value. */
typedef struct kiln__config_item {
    const char *name;
    int kind;                  /* KILN__ITEM_* */
    const char *(*label)(int); /* an enum's name for its value (NULL: the number) */
    int64_t i;                 /* KILN__ITEM_INT */
    double f;                  /* KILN__ITEM_REAL: a float setting, widened */
    uint64_t u;                /* KILN__ITEM_HEX */
} kiln__config_item;

/* The training's settings in a fixed order (at most KILN__CONFIG_ITEMS_MAX); returns the count.
 * kiln__trainer_config_hash hashes exactly these. */
int kiln__trainer_config_items(const struct kiln_trainer *t, const kiln_gpt_config *mc,
                               kiln__config_item *out);
/* The global batch's split over the ranks, the ZeRO stage, the data-parallel flags, the steps
 * and the schedule's resolved total: what ranks must share, and a resumed run may change. */
uint64_t kiln__trainer_split_hash(const struct kiln_trainer *t);
/* Sequences per optimizer step, every rank's micro-batches together. */
int64_t kiln__trainer_global_batch(const struct kiln_trainer *t);

/* state.json's "config" (the items by name) and "run" (the split, the steps, the schedule's
 * total) of the running trainer, added to the checkpoint's object. */
void kiln__ckpt_put_run(const struct kiln_trainer *t, struct cJSON *state);

/* A contiguous range [lo, hi) of a slab, read from one old rank's file. */
typedef struct kiln__recut_piece {
    int rank;
    int64_t lo, hi;
} kiln__recut_piece;

/* The pieces that make [lo, hi) of a slab from the rank files holding [los[r], his[r]),
 * r < world, in slab order: each element from the first file (by rank) that holds it, a piece
 * as long as that file goes on holding it. out has room for world + 1 pieces. Returns their
 * count (0 when lo == hi), or -1 when an element of [lo, hi) is in no file: *gap is the first. */
int kiln__ckpt_recut(const int64_t *los, const int64_t *his, int world, int64_t lo, int64_t hi,
                     kiln__recut_piece *out, int64_t *gap);

/* The loader state (epoch, position) of a loader that has given k batches from the start of
 * epoch 0, with per_epoch batches an epoch: what kiln_loader_next leaves behind (an epoch ends
 * at position per_epoch, and the next begins at the next call). */
void kiln__loader_position_after(int64_t k, int64_t per_epoch, uint64_t *epoch, uint64_t *position);

/* The message for a global batch that differs: the split that wrote the checkpoint (old_world
 * ranks of old_B, old_micro_total micro-batches a step together), this run's (world ranks of B,
 * accum micro-batches each, or rank_micro together with --rank-batches; 0: none), and the
 * --batch (or --grad-accum) that gives the checkpoint's global batch on this run's ranks. */
void kiln__batch_advice(char *out, size_t size, int64_t old_global, int old_world, int64_t old_B,
                        int64_t old_micro_total, int world, int64_t B, int64_t accum,
                        int64_t rank_micro);

/* Uneven ranks from measured times (trainer_balance.c): counts[0..world) summing to M in
 * inverse proportion to each rank's ms per micro-batch, each at least 1. */
void kiln__balance_split(const double *ms, int world, int64_t M, int64_t *counts);

#endif
