/* The trainer as phases, and the features that attach to them. A step runs: its start, each
 * micro-batch's forward and backward, the gradients' synchronisation, the guards' verdict, the
 * update, the step's synchronisation and figures, its lines, its end. A feature (guards,
 * pruning, QAT, distillation, local SGD and ZeRO, checkpoints, saves, the watchdog, metrics,
 * uneven ranks) is a table of optional callbacks, one per point it attaches to; trainer.c
 * runs each point's callbacks in the registry's order (trainer_features.c) and names no
 * feature. Every callback may do nothing where its part of the configuration is off. */
#ifndef KILN_TRAIN_TRAINER_FEATURE_H
#define KILN_TRAIN_TRAINER_FEATURE_H

#include <stdint.h>

#include "kiln/train.h"

typedef struct kiln__feature {
    const char *name;
    /* The start, in three points: `start` once rank and world are known and the batch checked
     * (before the data); `init` once the model, the optimizer and the starting weights exist;
     * `ready` once every rank's start is agreed (collectives allowed). */
    kiln_status (*start)(kiln_trainer *t);
    kiln_status (*init)(kiln_trainer *t);
    kiln_status (*ready)(kiln_trainer *t);
    /* Step `step` begins, before its first batch is drawn. */
    kiln_status (*step_begin)(kiln_trainer *t, int64_t step);
    /* Micro-batch `micro` is in t->inputs and t->targets, before the model's forward. */
    kiln_status (*before_forward)(kiln_trainer *t, int64_t micro);
    /* The gradients are synchronised: *loss the step's mean loss, *sumsq the gradients' sum of
     * squares (as the loss scale left them), both the same on every rank. */
    kiln_status (*after_sync)(kiln_trainer *t, int64_t step, double *loss, double *sumsq);
    /* The verdict before the update: mt's loss and grad_norm are set; a feature that judges
     * the step bad sets mt->skipped (and mt->guard), and the update does not happen. */
    kiln_status (*judge)(kiln_trainer *t, kiln_step_info *mt);
    /* After the update (updated 1), or in its place when the step was skipped (updated 0). */
    kiln_status (*after_update)(kiln_trainer *t, int64_t step, int updated);
    /* The step's work is done, before its time is taken: its collectives count in the step. */
    kiln_status (*step_sync)(kiln_trainer *t, int64_t step);
    /* The step's time is known (mt->ms): its figures, before the lines. */
    kiln_status (*step_figures)(kiln_trainer *t, kiln_step_info *mt);
    /* The step's lines: the console, the metrics file, TensorBoard. */
    kiln_status (*step_report)(kiln_trainer *t, const kiln_step_info *mt);
    /* The step's end, after its lines. *done 1: the rest of the step's end is skipped (the
     * trainer went back to an older step, or the weights are not good to save). */
    kiln_status (*step_end)(kiln_trainer *t, const kiln_step_info *mt, int *done);
    /* An evaluation of the validation data begins (kiln_trainer_evaluate). */
    void (*before_eval)(kiln_trainer *t);
    /* The state after step `step`, now (kiln_trainer_save_now): a feature that keeps it (a
     * checkpoint when there is a checkpoint folder, else the --save weights) writes it,
     * every rank together, and sets *where to the folder or file; an error when it could not
     * be written. */
    kiln_status (*save_now)(kiln_trainer *t, int64_t step, const char **where);
    /* Whatever the feature holds, in the registry's order (NULL-safe: after a failed start
     * too). */
    void (*free)(kiln_trainer *t);
} kiln__feature;

/* The features each file attaches, in the registry. */
extern const kiln__feature kiln__feature_dist;        /* trainer_dist_phases.c: checks, stops */
extern const kiln__feature kiln__feature_balance;     /* trainer_balance.c: uneven ranks */
extern const kiln__feature kiln__feature_watchdog;    /* watchdog.c */
extern const kiln__feature kiln__feature_guard;       /* trainer_guard.c */
extern const kiln__feature kiln__feature_save;        /* trainer_save.c: --save weights */
extern const kiln__feature kiln__feature_checkpoint;  /* trainer_ckpt.c, trainer_resume.c */
extern const kiln__feature kiln__feature_prune;       /* trainer_prune.c */
extern const kiln__feature kiln__feature_distill;     /* trainer_distill.c */
extern const kiln__feature kiln__feature_qat;         /* trainer_qat.c */
extern const kiln__feature kiln__feature_metrics;     /* trainer_report.c: metrics, tfevents */
extern const kiln__feature kiln__feature_dist_update; /* trainer_dist_phases.c: local SGD, ZeRO */

/* The registry: every feature in the order its callbacks run, NULL-terminated. */
extern const kiln__feature *const kiln__trainer_features[];

/* The points, one per callback of kiln__feature (free aside). */
typedef enum kiln__phase {
    KILN__PHASE_START,
    KILN__PHASE_INIT,
    KILN__PHASE_READY,
    KILN__PHASE_STEP_BEGIN,
    KILN__PHASE_BEFORE_FORWARD,
    KILN__PHASE_AFTER_SYNC,
    KILN__PHASE_JUDGE,
    KILN__PHASE_AFTER_UPDATE,
    KILN__PHASE_STEP_SYNC,
    KILN__PHASE_STEP_FIGURES,
    KILN__PHASE_STEP_REPORT,
    KILN__PHASE_STEP_END,
    KILN__PHASE_BEFORE_EVAL,
    KILN__PHASE_SAVE_NOW,
} kiln__phase;

/* What a point hands its callbacks (each takes the fields its callback names). */
typedef struct kiln__phase_args {
    int64_t step, micro;
    double *loss, *sumsq;
    kiln_step_info *mt;
    int updated;
    const char **where; /* KILN__PHASE_SAVE_NOW */
    int done;           /* KILN__PHASE_STEP_END: a feature ended the step's end */
} kiln__phase_args;

/* Every feature's callback at point p, in the registry's order; the first failure ends it,
 * as does a step's end that a feature ended (a->done). a NULL: a point that takes nothing. */
kiln_status kiln__trainer_phase(kiln_trainer *t, kiln__phase p, kiln__phase_args *a);
/* Every feature's free, in the registry's order. */
void kiln__trainer_features_free(kiln_trainer *t);

#endif
