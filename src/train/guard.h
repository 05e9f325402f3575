/* Stability guards: whether a step's loss and gradient norm may update the weights, and the
 * trends that come before a run diverges. Pure bookkeeping over the numbers a step produced
 * (no model, no files), so that it can be tested on made-up series; trainer_guard.c acts on
 * its verdicts (skip, roll back, report). */
#ifndef KILN_TRAIN_GUARD_H
#define KILN_TRAIN_GUARD_H

#include <stdint.h>

#include "kiln/status.h"

typedef enum kiln_guard_verdict {
    KILN_GUARD_OK = 0,
    KILN_GUARD_NONFINITE_LOSS, /* the loss is NaN or infinite */
    KILN_GUARD_NONFINITE_GRAD, /* a gradient is (their norm is not finite) */
    KILN_GUARD_LOSS_SPIKE,     /* the loss is z standard deviations above the window's mean */
    KILN_GUARD_NORM_SPIKE,     /* the same for the gradient norm (on its logarithm) */
    KILN_GUARD_LOSS_CEILING,   /* the loss stayed above the ceiling: worse than the run's start */
} kiln_guard_verdict;

/* Steps in a row above the ceiling that make a divergence: healthy runs' early loss spikes
 * rise above it for a step or two (bench/bench_guards.py: 24 of 64 runs for one step, 3 for
 * two in a row, none for three), diverging ones stay there. */
#define KILN_GUARD_CEILING_RUN 3

/* A name for metrics and console lines: "nonfinite_loss", "loss_spike", ... */
const char *kiln__guard_verdict_name(kiln_guard_verdict v);

/* Early warnings, each a bit. */
enum {
    KILN_GUARD_WARN_NORM_GROWTH = 1 << 0, /* the gradient norm's median doubled within a window */
    KILN_GUARD_WARN_SPIKE_RATE = 1 << 1,  /* several spikes within a window */
    KILN_GUARD_WARN_LOSS_RISE = 1 << 2,   /* the loss's median rose within a window */
    KILN_GUARD_WARN_SCALE_FALL = 1 << 3,  /* fp16: the loss scale fell 2^8-fold within a window */
};

typedef struct kiln_guard {
    int64_t window; /* good steps kept (the history); 0: no spike checks or trends */
    double z;       /* the spike threshold in standard deviations; 0: no spike checks */
    /* a loss above it for KILN_GUARD_CEILING_RUN steps in a row is bad, with no history
     * needed (0: none); the trainer sets the run's first loss plus a margin: a model worse
     * than it was untrained. above: the steps in a row above it so far */
    double ceiling;
    int64_t above;
    /* the last `window` good steps: loss and log(gradient norm), a ring */
    double *loss, *lnorm;
    int64_t count, head;
    /* the steps of recent spikes (a ring of window entries, the step number) */
    int64_t *spikes;
    int64_t nspikes, spike_head;
    /* fp16: the largest loss scale within the window and the step it was seen */
    double scale_max;
    int64_t scale_max_step;
    /* the step each warning was last given (0: never): each at most once a window */
    int64_t warned_at[4];
} kiln_guard;

/* window >= 0 good steps, z >= 0. */
kiln_status kiln__guard_init(kiln_guard *g, int64_t window, double z);
void kiln__guard_free(kiln_guard *g);
/* The verdict on a step's mean loss and gradient norm (unscaled). *zscore: the larger of the
 * two z-scores (0 before the history holds half a window). Records nothing. */
kiln_guard_verdict kiln__guard_check(const kiln_guard *g, double loss, double norm,
                                     double *zscore);
/* After the verdict: a good step joins the history; a spike is counted for the spike rate.
 * loss_scale: fp16's scale after the step (0 without). Returns the warnings newly due at
 * `step` (KILN_GUARD_WARN_*), *ratio the figure of the first: the norm's or loss's growth,
 * the spikes in the window, or the scale's fall. */
int kiln__guard_record(kiln_guard *g, int64_t step, kiln_guard_verdict v, double loss,
                       double norm, double loss_scale, double *ratio);
/* Forget the history (a rollback's weights start a new series). */
void kiln__guard_reset(kiln_guard *g);

#endif
