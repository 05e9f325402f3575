/* The trainer's state, shared by trainer.c (one process) and trainer_dist.c (what data
 * parallelism adds between its phases). */
#ifndef KILN_TRAIN_TRAINER_INTERNAL_H
#define KILN_TRAIN_TRAINER_INTERNAL_H

#include <stdio.h>

#include "kiln/loader.h"
#include "kiln/train.h"

/* The trainer between steps: what kiln_trainer_create builds and every step uses. */
struct kiln_trainer {
    kiln_train_config cfg;  /* a copy; the strings and the log in it are the caller's */
    kiln_lr_schedule sched; /* cfg.lr with total_steps resolved */
    kiln_loader *train, *val;
    /* uneven ranks: this rank's micro-batches come from loaders of their own (one per
     * micro-batch of the step, as slices of one process's batch), train unused */
    kiln_loader **micro_loaders;
    int64_t micro;       /* this rank's micro-batches per step */
    int64_t micro_total; /* every rank's together: the step's gradients are averaged over them */
    kiln_gpt *model;
    kiln_optim *opt;
    int32_t *inputs, *targets; /* (B,T): the last micro-batch */
    FILE *metrics;
    double flops_per_step; /* model FLOPs of one optimizer step */
    double peak;           /* GFLOP/s: MFU's denominator */
    kiln_train_memory plan;
    kiln_loss_scaler scaler; /* fp16 only */
    int save_existed;   /* the --save file existed before this run */
    int64_t saved_step; /* the step whose weights were last saved in this run (-1: none) */
    /* the run so far, for kiln_trainer_result */
    int64_t steps_done;
    float first_loss, last_loss, last_val_loss;
    double later_ms; /* the time of the steps after the first, ms */
    /* data parallelism (trainer_dist.c): world 1 and dp NULL in one process */
    kiln_comm *comm;
    int rank, world;
    kiln_dp *dp;
    int64_t shard_lo, shard_hi; /* this rank's part of the sums and of the optimizer (zero >= 1) */
    /* local SGD / DiLoCo: the weights at the last average, and the outer momentum (fp32,
     * whole slab; NULL for plain averaging) */
    float *outer_weights, *outer_velocity;
    /* ZeRO 3: which parts (index part + 1: the embeddings, blocks, ln_f) hold gathered
     * weights: PART_ABSENT, PART_COMING (a gather queued, its ticket) or PART_HERE */
    int zero3;
    int nparts;
    signed char *part_state;
    uint64_t *part_ticket, *part_used, part_clock;
    int64_t ckpt_step;    /* the step of the last checkpoint written or resumed from (0: none) */
    int64_t resumed_step; /* the step this process started from (0: not resumed) */
    int stopping;         /* the ranks agreed to stop after the last step (cfg.stop_flag) */
    struct kiln__watchdog *wd; /* watchdog.c (NULL: off) */
};

/* ---- trainer_ckpt.c, trainer_resume.c ---- */
/* The checkpoint due after `step` (checkpoint_every, and the last step), written by every
 * rank together. A failed write is a warning on the console and KILN_OK: training goes on
 * and older checkpoints stay; an error only when the ranks can no longer communicate. */
kiln_status kiln__trainer_checkpoint(kiln_trainer *t, int64_t step);
/* The same checkpoint whether due or not (a stop between steps); nothing when the last one
 * written or resumed from is of this step. The same warning and KILN_OK when a write fails:
 * the caller compares ckpt_step with step. */
kiln_status kiln__trainer_checkpoint_now(kiln_trainer *t, int64_t step);
/* cfg.resume_path's checkpoint into the trainer (after its weights and optimizer exist, before
 * any file of the run is written); every rank reads the files itself. */
kiln_status kiln__trainer_resume(kiln_trainer *t);


/* ---- trainer_dist.c ---- */
/* Rank and world from cfg.comm; no communication. */
void kiln__trainer_dist_setup(kiln_trainer *t);
/* After every rank's own start (local: its status): all ranks learn whether any failed, so
 * that none goes on to wait for the others in a collective. Returns local when it failed,
 * an error naming the failed rank when another did, else KILN_OK. */
kiln_status kiln__trainer_agree(kiln_trainer *t, kiln_status local, const char *what);
/* At the end of `step`: whether any rank wants to stop (local: this one), *stop the same on
 * every rank. One process: local; local SGD: 0 except at the steps that average. */
kiln_status kiln__trainer_agree_stop(kiln_trainer *t, int64_t step, int local, int *stop);
/* The data-parallel engine for the model's gradient ranges and the backward callback; sets
 * shard_lo and shard_hi (the optimizer's range). No communication. */
kiln_status kiln__trainer_dist_start(kiln_trainer *t);
/* Every rank has the same configuration, data and starting weights (a hash of each,
 * gathered and compared); an error on every rank naming the ranks that differ. */
kiln_status kiln__trainer_dist_check(kiln_trainer *t, const kiln_gpt_config *mc);
/* (b) of a step: the gradient reduction's end, then the loss (this rank's sum over its
 * micro-batches in, the mean over every rank's out) and the gradients' sum of squares. inject: make this rank's
 * first gradient infinite first (fault injection). One process: the sum of squares alone. */
kiln_status kiln__trainer_dist_sync(kiln_trainer *t, double *loss, double *sumsq, int inject);
/* (d)'s end: every rank's updated shard to every rank (zero >= 1). */
kiln_status kiln__trainer_dist_gather(kiln_trainer *t);
/* The mean over ranks of a per-rank value (an evaluation's mean loss). */
kiln_status kiln__trainer_dist_mean(kiln_trainer *t, double *v);
/* The fp32 master weights of the whole slab in *full (malloc'd; the caller frees), gathered
 * from every rank's shard (zero >= 1 with narrow working weights). */
kiln_status kiln__trainer_gather_master(kiln_trainer *t, float **full);
/* Local SGD: whether this step averages (every local_steps, and the last). */
int kiln__trainer_local_sync_due(const kiln_trainer *t, int64_t step);
/* Local SGD's average of the weights, or DiLoCo's outer step (cfg.outer_lr, momentum). */
kiln_status kiln__trainer_outer_step(kiln_trainer *t);
kiln_status kiln__trainer_local_start(kiln_trainer *t);
/* ZeRO 3: every part's gathered weights dropped (after the update made them stale). */
kiln_status kiln__trainer_zero3_drop_all(kiln_trainer *t);
/* ZeRO 3: every part's weights gathered (to save them). */
kiln_status kiln__trainer_zero3_need_all(kiln_trainer *t);
/* ZeRO 3's plan for rank `rank` of world: the parameter elements it holds at most (its shard,
 * and the gathered parts the cache keeps beyond it) and the gradient elements (its shard, and
 * the buckets in flight beyond it). */
void kiln__zero3_resident(const kiln_train_config *cfg, const kiln_gpt_config *mc, int rank,
                          int world, int64_t slab, int64_t *params, int64_t *grads);
/* Hashes of what must be equal for the ranks (and a resumed run) to train one model: the
 * configuration (model, batch, optimizer, schedule, precision, seed, flags) and the data. */
uint64_t kiln__trainer_config_hash(const kiln_trainer *t, const kiln_gpt_config *mc);
uint64_t kiln__trainer_data_hash(const kiln_trainer *t);
/* The step's communication figures into mt. */
void kiln__trainer_dist_stats(kiln_trainer *t, kiln_step_info *mt);

#endif
