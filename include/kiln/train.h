/* kiln: the trainer loop that wires data, model, optimizer and metrics together. */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/comm.h"
#include "kiln/dp.h"
#include "kiln/model.h"
#include "kiln/optim.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A range of batches to skip (kiln_train_data_config.skip_batches). */
typedef struct kiln_batch_skip {
    int64_t step, count;
} kiln_batch_skip;
enum { KILN_TRAIN_MAX_SKIPS = 64 };

/* The watchdog's exit statuses (kiln train's; next to its 3, "preempted"): a step ran past
 * the hang limit (kiln train's hang handler ends the process, under mpirun every rank with
 * it), or a rank stayed a straggler with straggler_exit set (every rank stops after the same
 * step, saved). */
#define KILN_EXIT_HUNG 4
#define KILN_EXIT_STRAGGLER 5

/* A hang the watchdog found (kiln_watchdog_config.on_hang). */
typedef struct kiln_watchdog_hang {
    int rank;
    int64_t step;        /* the step in progress, or the last one done (between steps) */
    double stalled_s;    /* seconds without progress */
    double limit_s;      /* the hang limit it passed */
    const char *message; /* "kiln: watchdog: rank R: no progress for ... : hung" (no newline) */
} kiln_watchdog_hang;

/* Hangs and stragglers. A thread per process knows when each step begins and ends and keeps
 * the median of the last `window` step times (the process's first step, warming caches, is
 * left out). When no progress (a step's beginning or end) comes for warn_factor x the median
 * (and at least min(hang_min_s / 4, 10 s)) it warns on stderr, naming the rank, the step and
 * how long; at hang_factor x the median, and never before hang_min_s (the only limit until
 * three steps are timed), it writes the heartbeat with health "hung" and reports the hang
 * (on_hang); the library never ends the process. It watches from the first step to the last: the time between two
 * kiln_trainer_step calls counts, and an evaluation is allowed its batches' worth of steps. With
 * several ranks, each rank's compute time per step (the step less what it waited in communication)
 * goes to every rank each step (an allgather of one float, counted in the step's communication;
 * with local SGD at the averages only). In each exchange a rank's time is divided by the median of
 * the other ranks'; a rank whose median ratio over straggler_window exchanges is above
 * straggler_factor, in every verdict of a whole window (so at least 2 windows of steps), is a
 * straggler: rank 0 warns on stderr and writes an event ({"event": "straggler", ...}) in the
 * metrics file. */
typedef struct kiln_watchdog_config {
    int enabled;        /* 0: no thread, no heartbeat, no exchange */
    double warn_factor; /* a warning at this many times the median step */
    double hang_factor; /* the end at this many times the median step, */
    double hang_min_s;  /* and never before this many seconds without progress */
    int window;         /* steps in the median (3..1024) */
    /* heartbeat: a JSON file rewritten (under a temporary name, then renamed) every
     * heartbeat_s seconds and when the health changes: pid, rank, world, step, steps, time of
     * the last progress, last and median step ms, health (ok, slow, hung, straggler) and the
     * time. NULL: none. With world > 1 each rank writes PATH.rank<R>. */
    const char *heartbeat_path;
    double heartbeat_s;
    double straggler_factor; /* 0: no straggler detection */
    int straggler_window;    /* exchanges in a rank's median (3..1024) */
    int straggler_exit;      /* a straggler for another whole window after the warning ends
                                the run: kiln_trainer_watchdog_exit says KILN_EXIT_STRAGGLER */
    /* A hang: called once, on the watchdog's thread, after the heartbeat says "hung" (the
     * training thread is still inside the stuck step). It may end the process (kiln train's
     * prints the message and exits with KILN_EXIT_HUNG). NULL, or when it returns: the
     * message goes to stderr, the run is marked hung, and the stuck step, if it ever comes
     * back, fails with KILN_ERR_HUNG, as does every later one; kiln_trainer_watchdog_exit
     * then says KILN_EXIT_HUNG. */
    void (*on_hang)(const kiln_watchdog_hang *hang, void *user);
    void *on_hang_user;
} kiln_watchdog_config;

/* The training configuration: one struct per concern, each with its defaults
 * (kiln_train_<concern>_default), gathered in kiln_train_config. */

/* Data: token shards (file, folder or glob) and the batch. */
typedef struct kiln_train_data_config {
    const char *train_path, *val_path; /* val_path may be NULL */
    int64_t B, T;
    int64_t grad_accum;   /* micro-batches per step (>= 1) */
    int64_t eval_every;   /* every N steps (needs val_path); validation data is always
                             evaluated after the last step (0: only then) */
    int64_t eval_batches; /* batches of validation per evaluation (0: the whole val set) */
    /* Batches to skip: at the start of step `step`, `count` steps' worth of batches are
     * drawn and dropped (data known to be bad; a rollback adds its own). */
    const struct kiln_batch_skip *skip_batches;
    int nskip_batches;
} kiln_train_data_config;
/* B 4, T 64, grad_accum 1, eval_every 0, eval_batches 20, no paths, no skips. */
kiln_train_data_config kiln_train_data_default(void);

/* Where the model computes and in what precision. */
typedef struct kiln_train_compute_config {
    /* Where the model, its gradients and the optimizer live and run: "cpu" (NULL: the same)
     * or "cuda" (kiln_backend_cuda: the GPU, one process; the batch's ids, the loss, and the
     * slabs for checkpoints and saved weights cross to the host, nothing else). A GPU run
     * that asks for what the GPU trainer has not (several ranks, pruning, quantization-aware
     * training, distillation) is refused at start, as is one the GPU cannot hold. */
    const char *device;
    /* Precision and memory: the model's working dtype, recomputation, fusions and classifier
     * chunk (kiln_gpt_options; inference is ignored). With bf16 or fp16 the optimizer keeps
     * fp32 master weights; fp16 scales the loss (loss_scaler). */
    kiln_gpt_options model_opt;
    int stochastic_rounding; /* bf16: round the working weights stochastically */
    kiln_loss_scaler loss_scaler;
    double peak_gflops; /* MFU denominator; <= 0 measures it at start (the CPU's GEMM rate)
                           or takes the GPU's data-sheet peak (kiln_cuda_device_info) */
} kiln_train_compute_config;
/* The CPU, kiln_gpt_options_default, kiln_loss_scaler_default, the peak measured. */
kiln_train_compute_config kiln_train_compute_default(void);

/* Metrics and the console. */
typedef struct kiln_train_metrics_config {
    const char *path; /* JSON Lines, one object per step (NULL: none) */
    /* TensorBoard: a folder for an events.out.tfevents.* file of the same scalars, written
     * by rank 0 as the steps go (NULL: none); a write that fails later is a warning */
    const char *tensorboard_dir;
    FILE *log; /* console lines (NULL: silent) */
} kiln_train_metrics_config;
kiln_train_metrics_config kiln_train_metrics_default(void); /* none of them */

/* The final weights. */
typedef struct kiln_train_save_config {
    const char *path; /* final weights (NULL: not saved); weights that are not finite, or
                         give a non-finite loss, are never saved: the run stops and the file
                         keeps the last good weights */
    int64_t every;    /* also save every N steps (0: only at the end) */
    kiln_dtype dtype; /* the dtype weights are saved in */
} kiln_train_save_config;
kiln_train_save_config kiln_train_save_default(void); /* no path, only at the end, fp32 */

/* Checkpoints: every `every` steps (and after the last) the whole training state goes to
 * dir/step_<8 digits>/ (model.safetensors, optim_rank<R>.bin per rank, state.json), written
 * under a temporary name and renamed, then dir/latest names it. The last `keep` (3 when 0)
 * stay, and every keep_every-th (0: none). A checkpoint that cannot be written is a warning:
 * training goes on. resume_path: a checkpoint folder (its `latest`, or one step folder) to
 * continue from; its checksums and its configuration's and data's hashes are checked against
 * this run's first, and a damaged checkpoint gives way to the newest older good one. The
 * number of ranks, their split of the global batch (world x B x micro-batches, which must
 * stay), the ZeRO stage and the steps may differ from the checkpoint's run: the state is
 * re-cut. */
typedef struct kiln_train_checkpoint_config {
    const char *dir;
    /* The run's configuration as JSON text (the tool's resolved flags), written as
     * config.json into every step folder with its other files (NULL: none). Read, not
     * parsed, by the trainer: its owner keeps it for the trainer's life. */
    const char *config_json;
    int64_t every, keep, keep_every;
    /* How checkpoints are written. sync 0: the step pauses only to copy the state into
     * staging memory (kept between checkpoints), a writer thread writes and hashes the files
     * while training goes on, and the checkpoint is published (state.json, rename, latest) at
     * the end of the first step after every rank's writer is done; 1: all of it on the
     * training thread. replicas 0: with several ranks rank r also writes rank r-1's optimizer
     * file (optim_rank<r-1>.replica.bin) and rank 1 model.replica.safetensors, and a resume
     * rebuilds a bad file from its replica; one process writes none; 1: one process too
     * writes a second copy of its files; -1: none. */
    int sync, replicas;
    const char *resume_path;
} kiln_train_checkpoint_config;
kiln_train_checkpoint_config kiln_train_checkpoint_default(void); /* none; keep 3 */

/* Stability guards. A step whose loss or gradient norm is not finite, or spikes (more than z
 * standard deviations above the mean of the last `window` good steps; the norm's on its
 * logarithm), skips its update: the metrics line says why, and an event line follows.
 * max_bad (>= 1) such steps in a row roll the run back to the newest checkpoint before them
 * (in the checkpoint dir; an older one when the last rollback went there and the same
 * happened again), and the batches of those steps are skipped when the run comes to them; at
 * most max_rollbacks rollbacks, and without a checkpoint the run stops there with an error.
 * Trends that often precede divergence (the gradient norm doubling, the loss rising, spikes
 * piling up, fp16's loss scale collapsing within a window) are warned of on the console and
 * in the metrics. window 0 or z 0: no spike checks (non-finite steps are still skipped).
 * fp16's overflows are the loss scaler's, not bad steps. A gradient-norm spike of a run whose
 * gradients are clipped (grad_clip > 0) is clipped and trains on, as PyTorch's
 * clip_grad_norm_ lets it (an event line says so; it is no bad step), unless
 * skip_norm_spikes: healthy runs trip it (bench/bench_guards.py), and the clipped update is
 * bounded. ceiling (nats; 0: off): from the second step on, a loss more than this above the
 * run's first loss is bad whatever the history (a model worse than it was untrained: a
 * divergence, which the spike checks, wanting half a window of history, miss when it comes
 * early). Whatever stops a run, its last good weights are saved (the save path, or a rescue
 * file that the error names). */
typedef struct kiln_train_guard_config {
    int64_t window;
    float z, ceiling;
    int64_t max_bad, max_rollbacks;
    int skip_norm_spikes;
} kiln_train_guard_config;
/* window 50, z 6, ceiling 1 nat, max_bad 3, max_rollbacks 3. */
kiln_train_guard_config kiln_train_guard_default(void);

/* Smaller models while training: pruning and quantization-aware training (one process). */
typedef struct kiln_train_compress_config {
    /* Gradual magnitude pruning of the blocks' matrices (kiln_prune_magnitude): at steps
     * prune_start, prune_start + prune_every, ... up to prune_end the target sparsity follows
     * Zhu and Gupta's cubic schedule from 0 to prune_sparsity (prune_start == prune_end: one
     * shot), the smallest weights (over all of them, or per matrix: prune_scope, a
     * kiln_prune_scope) are set to zero, and the pruned ones stay zero through every later
     * update (the mask is applied after each). The saved weights carry each matrix's sparsity
     * ("kiln.sparsity" in the metadata). prune_sparsity 0: none. */
    double prune_sparsity;
    int prune_scope;
    int64_t prune_start, prune_end, prune_every;
    /* Quantization-aware training: qat_bits 8 trains fp32 master weights while forward and
     * backward see them fake-quantized: every block matrix symmetric int8 per output column,
     * the tied embedding/head per row (scale max|w| / 127; round(w / scale) x scale), the
     * gradient passed straight through to the master weights. The saved weights are the
     * master's; quantized to int8 they give the model the run trained. 0: none. */
    int qat_bits;
} kiln_train_compress_config;
kiln_train_compress_config kiln_train_compress_default(void); /* neither */

/* Distillation: with teacher_path (safetensors weights of a model with the student's
 * vocabulary, any size), every micro-batch also runs forward through the teacher, and the
 * student's loss is alpha x the data's cross-entropy + (1 - alpha) x T^2 x KL(teacher ||
 * student) at temperature `temperature` (kiln_gpt_set_soft_targets). An fp32 student. NULL:
 * none. */
typedef struct kiln_train_distill_config {
    const char *teacher_path;
    float alpha, temperature;
} kiln_train_distill_config;
kiln_train_distill_config kiln_train_distill_default(void); /* no teacher; alpha 0.5, T 2 */

/* Data parallelism. comm NULL (or a communicator of one rank) trains in this process alone.
 * With N ranks every rank runs the same configuration (checked at start: a hash of the
 * configuration, the data and the starting weights is compared across ranks), B is each
 * rank's micro-batch, and a step takes N x B x grad_accum sequences: the result equals one
 * process with batch N x B. Only rank 0 prints, writes metrics and saves. */
typedef struct kiln_train_dist_config {
    kiln_comm *comm;
    kiln_dp_config dp;
    int plan_world; /* kiln_train_memory_plan without a communicator: plan rank 0 of this
                       many ranks (0 or 1: one process) */
    /* Uneven ranks: rank r takes rank_batches[r] (>= 1) micro-batches of B per step instead
     * of grad_accum (which must then be 1), e.g. fewer on a slower machine. The gradients are
     * weighted by tokens, so a step equals one process with batch sum(rank_batches) x B: the
     * ranks together take that process's batch, rank r the micro-batches numbered from the
     * sum of those before it. NULL: every rank grad_accum. world entries. */
    const int64_t *rank_batches;
    /* Uneven ranks chosen from measured step times: after this many steps (0: never), each
     * rank's busy time per micro-batch (its step less the communication it waited for) is
     * shared, and the step's micro-batches (rank_batches, or grad_accum on every rank) are
     * split again in inverse proportion, each rank at least one: the global batch and the
     * training stay the same; a slower rank takes fewer. Several ranks. */
    int64_t rank_batches_auto;
    /* Less traffic: local SGD. local_steps H > 0: the ranks step alone (their own batches,
     * optimizers and norms, no gradient reduction) and every H steps (and after the last)
     * average their weights; with outer_lr and outer_momentum, DiLoCo's outer step instead:
     * the change of the averaged weights since the last average is an outer gradient, to
     * which Nesterov momentum (outer_momentum) and outer_lr apply. outer_lr 1 and momentum 0
     * is plain averaging. Needs dp.zero 0. */
    int64_t local_steps;
    float outer_lr, outer_momentum;
} kiln_train_dist_config;
/* One process; kiln_dp_config_default; no uneven ranks; no local SGD (outer_lr 1). */
kiln_train_dist_config kiln_train_dist_default(void);

/* Warn at 5x the median step, end at 20x and at least 300 s; heartbeat every 5 s when a path
 * is set; stragglers at 1.3x over 20 steps; no hang handler. */
kiln_watchdog_config kiln_watchdog_config_default(void);

typedef struct kiln_train_config {
    /* Model: the architecture; vocab_size 0 takes the training shards' vocabulary.
     * init_path: start from these safetensors weights instead of a seeded init. */
    kiln_gpt_config model;
    const char *init_path;
    int64_t steps; /* 0: check data, model and memory plan; train and save nothing */
    uint64_t seed;
    /* The optimizer and its schedule (lr.total_steps 0 means `steps`; resumed: a
     * checkpoint's fixed total, if it had one), and the gradients' clip (0: none). */
    kiln_optim_config optim;
    kiln_lr_schedule lr;
    float grad_clip;
    kiln_train_data_config data;
    kiln_train_compute_config compute;
    kiln_train_metrics_config metrics;
    kiln_train_save_config save;
    kiln_train_checkpoint_config checkpoint;
    kiln_train_guard_config guard;
    kiln_train_compress_config compress;
    kiln_train_distill_config distill;
    kiln_train_dist_config dist;
    kiln_watchdog_config watchdog; /* hangs and stragglers, heartbeats (on by default) */
    /* Stopping early (preemption): when stop_flag is set and *stop_flag is non-zero on any
     * rank at the end of a step, every rank learns it in that step (a MAX over the ranks,
     * counted in the step's communication) and kiln_trainer_stopping says so on all: they
     * stop after the same step. A signal handler may set it. With local SGD the ranks agree
     * only at the steps that average (they do not talk between them). NULL: never. */
    const volatile sig_atomic_t *stop_flag;
} kiln_train_config;

/* Defaults: steps 100, AdamW lr 3e-4 cosine to 10% with warmup 10, grad_clip 1.0, seed 1337,
 * and every concern's defaults (kiln_train_<concern>_default). */
kiln_train_config kiln_train_config_default(void);

typedef struct kiln_train_result {
    int64_t steps;
    float first_loss, last_loss, last_val_loss; /* last_val_loss NaN when never evaluated */
    double mean_ms;                             /* per step, over steps after the first */
    double tokens_per_s;                        /* over steps after the first */
    double mfu; /* fraction of peak_gflops, over steps after the first */
    double peak_gflops;
    size_t peak_rss;
    size_t planned_peak;   /* the process before the plan's memory, plus the plan (on the
                              host: a GPU run's host part) */
    /* A GPU run: the GPU memory the run took (in use now, less what was in use before the
     * model was made: the CUDA context, cuBLASLt's workspace) and the plan's (0 on the CPU) */
    size_t device_used, device_planned;
    int64_t skipped_steps; /* fp16: steps skipped for overflow */
    float loss_scale;      /* fp16: the loss scale at the end */
    /* checkpoints that were due and not written (each was a warning), the step of the first of
     * them and why; and the step of the newest checkpoint written or resumed from (0: none) */
    int64_t checkpoints_missed, first_missed_step, checkpoint_step;
    char missed_why[512];
} kiln_train_result;

/* Run the training: kiln_trainer_create, cfg->steps steps, the result. Everything is checked
 * before the first step: the data, the model, and the whole memory plan (parameters,
 * gradients, optimizer moments, activations, batches) against kiln_memory_available(),
 * before any of it is allocated; a plan that cannot fit is KILN_ERR_NOMEM naming the planned
 * and the available bytes. On a failure after the start, *result holds the steps taken. */
kiln_status kiln_train(const kiln_train_config *cfg, kiln_train_result *result);

/* The memory a run takes, by category, planned without allocating anything. */
typedef struct kiln_train_memory {
    size_t params;      /* working weights, in the model's dtype */
    size_t grads;       /* fp32 gradients */
    size_t master;      /* fp32 master weights (bf16 and fp16 only) */
    size_t moments;     /* the optimizer's moment slabs */
    size_t activations; /* what forward saves for backward */
    size_t workspace;   /* scratch: activation gradients, attention workspace, logits */
    size_t batches;     /* token ids of a training (and evaluation) batch */
    size_t checkpoint;  /* checkpoints' staging: this rank's optimizer file, its neighbour's
                           (replicas) and the fp32 weights (0: no checkpoint.dir) */
    size_t peers;       /* the other ranks' slab pages this rank reads where the machine's
                           ranks share their slabs (kiln_comm_alloc_shared): in its resident
                           set (RSS) as well as theirs, though they exist once */
    int common_weights; /* 1: the parameters are one copy for the machine's ranks, each rank
                           writing its shard (ZeRO 1 on one machine), after a start that
                           holds this rank's own copy beside its shard of that one (peers) */
    size_t total;       /* the sum */
    size_t headroom;    /* what the process needs besides (code, BLAS buffers, data pages) */
    size_t available;   /* what the process can still take (SIZE_MAX: unknown) */
    size_t process;     /* a run: what the process held before the plan's memory (0: not known) */
    const char *available_what;
    /* A GPU run (device "cuda"): of total, what lives in the GPU's memory (all but the batches
     * and the checkpoints' staging, and the fp32 copy of the weights a save takes, which are
     * the host's), and the GPU's free memory (SIZE_MAX: not known). 0 and 0 on the CPU. */
    size_t device, device_available;
    size_t device_headroom; /* what the GPU needs besides: cuBLASLt's workspace, buffers */
    size_t host_copy; /* a GPU run's --save: the fp32 weights read back to be written */
    char device_what[128];
} kiln_train_memory;
/* The plan of a run of cfg with the model mc (validated, its vocabulary set). */
kiln_status kiln_train_memory_plan(const kiln_train_config *cfg, const kiln_gpt_config *mc,
                                   kiln_train_memory *out);
/* One line: the plan's categories and the available memory. */
void kiln_train_memory_print(FILE *f, const kiln_train_memory *p, int64_t B, int64_t T);

/* The trainer as an object: kiln_train is a loop over kiln_trainer_step, and a caller that
 * needs to act between steps (communication, checkpoints, signals) runs the loop itself. */
typedef struct kiln_trainer kiln_trainer; /* opaque */

/* The figures of one step: what the console line and the metrics line show. */
typedef struct kiln_step_info {
    int64_t step, steps;   /* this step, from 1, of the run's cfg.steps */
    float loss;            /* mean training loss over the step's micro-batches */
    float val_loss;        /* NaN when this step did not evaluate */
    float lr;              /* the learning rate the step used */
    float grad_norm;       /* the gradients' global norm before clipping (unscaled) */
    double ms;             /* the step (forward, backward, optimizer), not evaluation or saving */
    double tokens_per_s;   /* world x B x T x micro-batches over ms: every rank's tokens */
    double mfu;            /* model FLOPs per second over peak_gflops */
    size_t rss;            /* peak resident bytes so far */
    float loss_scale;      /* fp16: the loss scale after the step (0: no loss scaling) */
    int skipped;           /* this step's update was skipped: an fp16 overflow, or a guard */
    const char *guard;     /* the guard that skipped it ("loss_spike", ...; NULL: none) */
    int clipped_spike;     /* a gradient-norm spike that was clipped and updated (guard_z) */
    double guard_z;        /* the step's largest z-score (loss or gradient norm) */
    int64_t skipped_total; /* fp16: steps skipped so far */
    int world;             /* data-parallel ranks (1: one process) */
    double comm_ms;        /* time in communication (gradient buckets on the thread, the
                              global sums and the gather of shards) */
    double comm_hidden;    /* the fraction of comm_ms that overlapped compute */
    uint64_t comm_bytes;   /* payload bytes this rank sent */
    uint64_t net_bytes;    /* of those, what left the process as messages (not shared memory) */
    double elapsed_s;      /* wall time since this process's trainer was made (all of it:
                              evaluations, saves and checkpoints too) */
    double eta_s;          /* the time the steps left would take at this process's wall time
                              per step so far (NaN: not known yet, before its second step) */
} kiln_step_info;

/* Everything kiln_train checks and builds before its first step: the configuration, the
 * data, the memory plan, the model and its starting weights, the optimizer, the metrics file
 * and the peak rate; prints the plan to cfg->metrics.log. The trainer keeps a copy of *cfg, but the
 * strings it points to (paths) and the log stay the caller's and must outlive the trainer. */
kiln_status kiln_trainer_create(kiln_trainer **out, const kiln_train_config *cfg);
/* One optimizer step (grad_accum micro-batches), then the evaluation and the save due after
 * it; fills *info (may be NULL), prints the console line and writes the metrics line. At most
 * cfg.steps steps (KILN_ERR_ARG after). A step that fails leaves the weights unchanged when
 * the failure is before the optimizer's update (a non-finite loss or gradient). */
kiln_status kiln_trainer_step(kiln_trainer *t, kiln_step_info *info);
/* Mean loss over data.eval_batches batches of the validation data (KILN_ERR_CONFIG without one);
 * it becomes the result's last_val_loss. */
kiln_status kiln_trainer_evaluate(kiln_trainer *t, double *val_loss);
/* Whether the ranks agreed, in the last step, to stop after it (cfg.stop_flag). */
int kiln_trainer_stopping(const kiln_trainer *t);
/* The exit status the watchdog asks for when it stopped the run (KILN_EXIT_STRAGGLER: the
 * ranks agreed, and kiln_trainer_stopping is 1; KILN_EXIT_HUNG: it found a hang and no
 * on_hang ended the process); 0 otherwise. */
int kiln_trainer_watchdog_exit(const kiln_trainer *t);
/* The state after the steps done so far, now, by every rank: with cfg.checkpoint.dir a
 * checkpoint of them (an error, not a warning, when it could not be written), else the weights
 * to cfg.save.path (when they are good). *where: the folder or file written. */
kiln_status kiln_trainer_save_now(kiln_trainer *t, const char **where);
int64_t kiln_trainer_steps_done(const kiln_trainer *t);
kiln_gpt *kiln_trainer_model(kiln_trainer *t);
kiln_optim *kiln_trainer_optim(kiln_trainer *t);
/* The run's summary after the steps taken so far (what kiln_train returns). */
void kiln_trainer_result(const kiln_trainer *t, kiln_train_result *res);
void kiln_trainer_free(kiln_trainer *t); /* NULL is safe */

/* A replay's findings (kiln_train_replay). */
enum { KILN_REPLAY_OTHERS = 3 };
typedef struct kiln_replay_report {
    int64_t step, from_step; /* the step replayed; the checkpoint it started from */
    float prev_loss;         /* the step before it, as replayed (NaN: none ran) */
    float loss, grad_norm;   /* the step's batches with its weights */
    float *seq_loss;         /* each sequence's loss (this rank's, micro-batch by micro-batch) */
    int64_t nseq;
    int nothers; /* the batches of the steps after it, with the same weights */
    float other_loss[KILN_REPLAY_OTHERS], other_norm[KILN_REPLAY_OTHERS];
    const char *verdict; /* "bad_batch", "numeric" or "not_reproduced" */
    char why[512];       /* the verdict in words, with what to do */
} kiln_replay_report;

/* Re-run step `step` of the run cfg describes from its newest checkpoint before it
 * (cfg->checkpoint.resume_path: the run's checkpoint folder) and its data position: the steps
 * between are run again (nothing is written: no metrics, checkpoints or weights), then the step's
 * batches and those of the steps after it go through forward and backward with the same
 * weights, without an update, and the report says which of a bad batch, blown-up weights or
 * neither explains the step. Every rank of the run calls it (the same world). */
kiln_status kiln_train_replay(const kiln_train_config *cfg, int64_t step, kiln_replay_report *r);
void kiln_replay_report_free(kiln_replay_report *r);

struct kiln_loader;

/* Mean loss of a model over the windows of an evaluation loader (opened with shuffle 0),
 * from its first batch, in file order; batches 0: every whole batch. The loader's
 * vocabulary must be the model's, and its B and T fit the model's plan. */
kiln_status kiln_evaluate(kiln_gpt *m, struct kiln_loader *l, int64_t B, int64_t T, int64_t batches,
                          double *mean_loss, int64_t *tokens);

/* Open `path` for evaluation: file order, one rank. */
kiln_status kiln_eval_loader_open(struct kiln_loader **out, const char *path, int64_t B, int64_t T);

#ifdef __cplusplus
}
#endif
#endif
