/* The trainer's state, shared by trainer.c (one process) and trainer_dist.c (what data
 * parallelism adds between its phases). */
#ifndef KILN_TRAIN_TRAINER_INTERNAL_H
#define KILN_TRAIN_TRAINER_INTERNAL_H

#include <stdio.h>

#include "kiln/loader.h"
#include "kiln/train.h"
#include "train/guard.h"
#include "train/metrics.h"
#include "train/trainer_fault.h"

/* The trainer between steps: what kiln_trainer_create builds and every step uses. */
struct kiln_trainer {
    kiln_train_config cfg;  /* a copy; the strings and the log in it are the caller's */
    kiln__trainer_faults faults; /* tests' switches (trainer_fault.h), taken at the start */
    kiln_lr_schedule sched; /* cfg.lr with total_steps resolved */
    kiln_loader *train, *val;
    /* uneven ranks: this rank's micro-batches come from loaders of their own (one per
     * micro-batch of the step, as slices of one process's batch), train unused */
    kiln_loader **micro_loaders;
    int64_t micro;       /* this rank's micro-batches per step */
    int64_t micro_total; /* every rank's together: the step's gradients are averaged over them */
    kiln_gpt *model;
    kiln_optim *opt;
    /* The backend the model and optimizer run on, and whether the trainer reaches their slabs
     * through its copy op (staged): a GPU's memory, or the CPU's with faults.host_staging
     * (tests: the GPU trainer's copies, checked where they can run) */
    kiln_backend *be;
    int gpu, staged;
    char peak_what[320]; /* where the MFU's denominator came from */
    size_t device_used0; /* GPU memory in use before the model was made */
    int32_t *inputs, *targets; /* (B,T): the last micro-batch */
    kiln__metrics *metrics;
    struct kiln__tfevents *tb; /* --tensorboard's events file (rank 0; NULL: none) */
    double flops_per_step; /* model FLOPs of one optimizer step */
    double peak;           /* GFLOP/s: MFU's denominator */
    kiln_train_memory plan;
    kiln_loss_scaler scaler; /* fp16 only */
    int save_existed;        /* the --save file existed before this run */
    int64_t saved_step;      /* the step whose weights were last saved in this run (-1: none) */
    /* the run so far, for kiln_trainer_result */
    int64_t steps_done;
    float first_loss, last_loss, last_val_loss;
    double later_ms; /* the time of the steps after the first, ms */
    /* wall clock (kiln_time_ms) when the trainer was made and when this process's first step
     * ended (at its console line), for the elapsed time and the estimate of the time left */
    double wall0_ms, first_end_ms;
    int64_t first_end_step;
    /* data parallelism (trainer_dist.c): world 1 and dp NULL in one process */
    kiln_comm *comm;
    kiln_comm *dcomm; /* several ranks on GPUs: NCCL's, for the slabs (comm keeps the rest) */
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
    /* the checkpoint folder's lock (trainer_lock.c), held by rank 0; every rank's name for
     * the temporary folders: rank 0's pid */
    int ckpt_locked, ckpt_lock_fd;
    size_t ckpt_dir_made; /* the length of the first folder of the path the lock made (0: none) */
    /* checkpoints that were due and not written: how many, the first, and why */
    int64_t ckpt_missed, ckpt_first_missed;
    char ckpt_why[512];
    long ckpt_owner;
    char ckpt_lock_path[4096];
    int64_t resumed_step; /* the step this process started from (0: not resumed) */
    int stopping;         /* the ranks agreed to stop after the last step (cfg.stop_flag) */
    int agreed_failure;   /* an agreement (kiln__trainer_agree) found a rank that failed */
    int shared_slabs;     /* the slabs are in memory the machine's ranks share (comm_shm) */
    int rows_apart;       /* the embedding's rows apart (kiln_gpt_set_embed_rows_apart) */
    /* stability guards (trainer_guard.c) */
    kiln_guard guard;
    int64_t bad_run, first_bad; /* bad steps in a row now, and the first of them */
    int64_t rollbacks, last_rollback_to;
    int64_t high_water; /* the furthest step done (a rollback goes back from it) */
    kiln_batch_skip skips[KILN_TRAIN_MAX_SKIPS]; /* cfg.data.skip_batches and the rollbacks' */
    int nskips;
    float *probe_seq; /* kiln_train_replay: per-sequence losses wanted (NULL: not) */
    /* pruning (trainer_prune.c): 1 for a weight kept, 0 for one pruned (slab length; NULL
     * before the first pruning step), and the metadata the saved weights carry */
    uint8_t *prune_keep;
    char *prune_json;
    const char *prune_meta[3];
    /* uneven ranks (trainer_balance.c): the split in force (cfg.dist.rank_batches points at it),
     * whether it was chosen from measured times yet, and the busy time measured so far */
    int64_t *rank_batches;
    int balanced;
    double balance_ms;
    /* distillation (trainer_distill.c): the teacher, its logits and tempered probabilities */
    kiln_gpt *teacher;
    float *teacher_logits, *teacher_p;
    /* the --save file could not be written: failures in a row, and the step to try again */
    int64_t save_failures, save_retry_at;
    /* checkpoints' staging and writer thread (trainer_ckpt.c; NULL: none yet) */
    struct kiln__ckpt_writer *ckw;
    struct kiln__watchdog *wd; /* watchdog.c (NULL: off) */
};

/* ---- trainer.c: the slabs from and to the host ---- */
/* bytes of the backend's memory at src into host memory at dst (waits for the backend; its
 * error, if any), or a memcpy when the slabs are the host's. */
kiln_status kiln__trainer_to_host(kiln_trainer *t, void *dst, const void *src, size_t bytes);
/* bytes of host memory at src into the backend's memory at dst. */
kiln_status kiln__trainer_to_device(kiln_trainer *t, void *dst, const void *src, size_t bytes);
/* The working weights (or an fp32 slab laid out as they are, dt) from a safetensors file into
 * dst, the backend's memory of n elements of dt, through a host buffer when staged. */
kiln_status kiln__trainer_load_slab(kiln_trainer *t, const char *path, void *dst, kiln_dtype dt);

/* ---- trainer_prune.c ---- */
/* Checks the pruning flags; after a resume past prune_start, the mask from the weights' zeros. */
kiln_status kiln__trainer_prune_init(kiln_trainer *t);
/* After the update of `step`: a pruning step's new mask, then the mask applied. */
kiln_status kiln__trainer_prune_step(kiln_trainer *t, int64_t step);
/* The metadata of saved weights ("kiln.sparsity": per-matrix sparsity), or NULL. */
const char *const *kiln__trainer_prune_meta(kiln_trainer *t, const float *w32);
void kiln__trainer_prune_free(kiln_trainer *t);

/* ---- trainer_distill.c ---- */
/* The teacher loaded and checked against the student (cfg.distill.teacher_path; nothing without).
 */
kiln_status kiln__trainer_distill_init(kiln_trainer *t);
/* The teacher's forward on t->inputs, its probabilities the student's soft targets. */
kiln_status kiln__trainer_distill_targets(kiln_trainer *t);
void kiln__trainer_distill_free(kiln_trainer *t);

/* ---- trainer_qat.c ---- */
/* Checks the flags; the working weights fake-quantized from the master's (after a resume too). */
kiln_status kiln__trainer_qat_init(kiln_trainer *t);
/* After an update: the working weights fake-quantized from the updated master weights. */
kiln_status kiln__trainer_qat_apply(kiln_trainer *t);

/* ---- trainer_balance.c ---- */
/* At a step's end: with rank_batches_auto, the measuring, then the new split (collective). */
kiln_status kiln__trainer_balance(kiln_trainer *t, const kiln_step_info *mt);

/* ---- trainer_save.c ---- */
/* The --save weights after `step` when due (save_every, the last step, a failed save's retry)
 * or forced (a stop). Weights that are not good are an error (KILN_ERR_RANGE, naming where the
 * last good ones are); a failed write is a warning during the run and retried, and at the end
 * (or forced) retried with waits, then written to a rescue file that the error names. */
kiln_status kiln__trainer_maybe_save(kiln_trainer *t, int64_t step, int force);

/* ---- trainer.c: a step's phases ---- */
/* (a) this rank's micro-batches drawn, forward and backward (gradients summed, scaled by S);
 * *loss the sum of their losses. With t->probe_seq (replay's diagnosis) also each sequence's
 * own loss into it, micro x B of them (a forward pass per sequence). */
kiln_status kiln__trainer_forward_backward(kiln_trainer *t, float S, double *loss);
/* (b) the gradients' reduction; *loss the step's mean, *sumsq the gradients' sum of squares. */
kiln_status kiln__trainer_sync_gradients(kiln_trainer *t, double *loss, double *sumsq);

/* ---- trainer_guard.c ---- */
kiln_status kiln__trainer_guard_init(kiln_trainer *t);
/* Before `step`: the batches to skip at its start, drawn and dropped. */
kiln_status kiln__trainer_guard_skip_batches(kiln_trainer *t, int64_t step);
/* Tests: the injected spike of faults.spike_step, on this step's figures and gradients. */
void kiln__trainer_guard_inject(kiln_trainer *t, int64_t step, double *loss, double *sumsq);
/* The verdict on mt's loss and grad_norm (mt->guard_z set); KILN_GUARD_OK: update. */
kiln_guard_verdict kiln__trainer_guard_check(kiln_trainer *t, kiln_step_info *mt);
/* After the step's metrics line: history, early warnings, events, and the rollback after
 * guard_max_bad bad steps in a row (*rolled: the trainer is back at an older step). */
kiln_status kiln__trainer_guard_after(kiln_trainer *t, const kiln_step_info *mt, int *rolled);

/* ---- trainer_ckpt.c, trainer_resume.c ---- */
/* The checkpoint due after `step` (checkpoint_every, and the last step), written by every
 * rank together. A failed write is a warning on the console and KILN_OK: training goes on
 * and older checkpoints stay; an error only when the ranks can no longer communicate. */
kiln_status kiln__trainer_checkpoint(kiln_trainer *t, int64_t step);
/* The same checkpoint whether due or not (a stop between steps); nothing when the last one
 * written or resumed from is of this step. The same warning and KILN_OK when a write fails:
 * the caller compares ckpt_step with step. */
kiln_status kiln__trainer_checkpoint_now(kiln_trainer *t, int64_t step);
/* cfg.checkpoint.resume_path's checkpoint into the trainer (after its weights and optimizer exist,
 * before any file of the run is written); every rank reads the files itself. */
kiln_status kiln__trainer_resume(kiln_trainer *t);
/* At a step's end while a checkpoint is written in the background: whether every rank's
 * writer is done (a MIN all-reduce), and if so the checkpoint published. wait: wait for it
 * (the next checkpoint, a stop, the run's end). Nothing when none is pending. */
kiln_status kiln__trainer_checkpoint_poll(kiln_trainer *t, int64_t step, int wait);
/* The checkpoints' staging allocated and its pages taken (a checkpoint_dir; no
 * communication). */
kiln_status kiln__trainer_checkpoint_start(kiln_trainer *t);
/* The writer thread joined and the staging freed (a write in flight is waited for, never
 * published: its temporary folder is removed by the next checkpoint). */
void kiln__trainer_checkpoint_free(kiln_trainer *t);
/* At the start, every rank: rank 0 makes the checkpoint folder and takes its lock; a folder
 * another run holds (KILN_ERR_BUSY) or one that can never be written stops every rank. A
 * fault that may pass (a full disk) is a warning and the run goes on unlocked. */
kiln_status kiln__trainer_ckpt_lock(kiln_trainer *t);
/* Every rank, after the last step's checkpoint was not written and no --save file was asked
 * for: the weights go to a rescue file (TMPDIR, /tmp or here), and the error names it. */
kiln_status kiln__trainer_rescue_final(kiln_trainer *t, int64_t step);
/* Rank 0 releases the lock (its file removed); a no-op where none is held. */
void kiln__trainer_ckpt_unlock(kiln_trainer *t);


/* ---- trainer_dist.c ---- */
/* Rank and world from cfg.dist.comm; no communication. */
void kiln__trainer_dist_setup(kiln_trainer *t);
/* After every rank's own start (local: its status): all ranks learn whether any failed, so
 * that none goes on to wait for the others in a collective. Returns local when it failed,
 * an error naming the failed rank when another did, else KILN_OK. */
kiln_status kiln__trainer_agree(kiln_trainer *t, kiln_status local, const char *what);
/* Before the model: its slabs in memory the ranks of this machine share where that applies
 * (ZeRO 0 and 1 over a communicator whose ranks share memory), after every rank has agreed
 * it got this far (the slabs' allocation is collective). */
kiln_status kiln__trainer_shared_slabs(kiln_trainer *t);
/* Several ranks on GPUs (before the backend starts): each rank on the GPU of its place among
 * its machine's ranks, refused where the machine has fewer GPUs than ranks, and t->dcomm, NCCL
 * over them. Every rank makes the same calls and fails alike. */
kiln_status kiln__trainer_gpu_ranks(kiln_trainer *t);
/* Whether a run of cfg on world ranks keeps one copy of the working weights for the machine
 * (kiln_comm_alloc_common): ZeRO 1 with shared slabs, where nothing but each rank's
 * optimizer writes the weights after the start (no local SGD, pruning or fake quantization,
 * whose passes read and write all of them on every rank), unless the tests' separate_weights
 * switch (trainer_fault.h) is set. */
int kiln__trainer_common_weights_apply(const kiln_train_config *cfg, int world);
/* After every rank's start was agreed and checked: the working weights moved into that one
 * copy, each rank writing its own shard of it; collective. */
kiln_status kiln__trainer_common_weights(kiln_trainer *t);
/* Whether a run of cfg with model mc on world ranks keeps the embedding's rows apart
 * (kiln_dp_config.rows_apart), the same on every rank. */
int kiln__trainer_rows_apart(const kiln_train_config *cfg, const kiln_gpt_config *mc, int world);
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
 * micro-batches in, the mean over every rank's out) and the gradients' sum of squares. inject: make
 * this rank's first gradient infinite first (fault injection). One process: the sum of squares
 * alone. */
kiln_status kiln__trainer_dist_sync(kiln_trainer *t, double *loss, double *sumsq, int inject);
/* (d)'s end: every rank's updated shard to every rank (zero >= 1). */
kiln_status kiln__trainer_dist_gather(kiln_trainer *t);
/* Every rank's `mine`, in rank order, into *all (world floats, malloc'd: the caller frees). */
kiln_status kiln__trainer_gather_one(kiln_trainer *t, float mine, float **all);
/* The mean over ranks of a per-rank value (an evaluation's mean loss). */
kiln_status kiln__trainer_dist_mean(kiln_trainer *t, double *v);
/* The fp32 master weights of the whole slab in *full (malloc'd; the caller frees), gathered
 * from every rank's shard (zero >= 1 with narrow working weights). */
kiln_status kiln__trainer_gather_master(kiln_trainer *t, float **full);
kiln_status kiln__trainer_gather_master_into(kiln_trainer *t, float *full); /* n floats */
/* Local SGD: whether this step averages (every local_steps, and the last). */
int kiln__trainer_local_sync_due(const kiln_trainer *t, int64_t step);
/* Local SGD's average of the weights, or DiLoCo's outer step (cfg.dist.outer_lr, momentum). */
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
/* Hashes of what must be equal for a resumed run to train the same model: the training's
 * configuration (model, global batch, optimizer, schedule, precision, seed; not its split over
 * ranks, nor the steps: trainer_elastic.h) and the data. */
uint64_t kiln__trainer_config_hash(const kiln_trainer *t, const kiln_gpt_config *mc);
uint64_t kiln__trainer_data_hash(const kiln_trainer *t);
/* The step's communication figures into mt. */
void kiln__trainer_dist_stats(kiln_trainer *t, kiln_step_info *mt);

#endif
