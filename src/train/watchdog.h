/* The trainer's watchdog (watchdog.c): a thread per process that notices a step running far
 * past the median (a hang) and writes heartbeats, and the exchange of each rank's compute time
 * that finds a straggler. The judgements themselves are pure functions (watchdog_stats.c). */
#ifndef KILN_TRAIN_WATCHDOG_H
#define KILN_TRAIN_WATCHDOG_H

#include <stdint.h>

#include "kiln/train.h"

#define KILN__WD_MAX_WINDOW 1024

/* ---- watchdog_stats.c: pure functions ---- */

/* The median of v[0..n) (n <= KILN__WD_MAX_WINDOW; v is left as it was); NaN when n is 0. */
double kiln__median(const double *v, int n);

/* The last `cap` values pushed (cap <= KILN__WD_MAX_WINDOW). */
typedef struct kiln__window {
    double v[KILN__WD_MAX_WINDOW];
    int cap, n, next;
} kiln__window;
void kiln__window_init(kiln__window *w, int cap);
void kiln__window_push(kiln__window *w, double x);
double kiln__window_median(const kiln__window *w); /* NaN when empty */

typedef enum kiln__hang_verdict {
    KILN__HANG_OK = 0,
    KILN__HANG_SLOW = 1, /* past the warning limit */
    KILN__HANG_HUNG = 2, /* past the hang limit */
} kiln__hang_verdict;

/* Steps timed before the median counts (until then only hang_min_s applies, and no warning). */
#define KILN__WD_MIN_SAMPLES 3

/* elapsed_s without progress, against the limits of c for a median step of median_ms over
 * `samples` timed steps. *warn_s and *hang_s (may be NULL): the limits applied (warn_s
 * INFINITY before the median counts). */
kiln__hang_verdict kiln__hang_judge(const kiln_watchdog_config *c, double elapsed_s,
                                    double median_ms, int samples, double *warn_s, double *hang_s);

/* times: rows x world compute times (ms), row-major, one row per exchange. In each row, each
 * rank's time over the median of the other ranks'; a rank's ratio is the median of its rows'.
 * Returns the rank with the largest ratio when it is above factor, else -1. *ratio (may be
 * NULL): that largest ratio (0 when none can be formed: world < 2, no rows, or the others at
 * ~0 ms). */
int kiln__straggler_find(const float *times, int rows, int world, double factor, double *ratio);

/* ---- watchdog.c: the watchdog of a trainer ---- */
typedef struct kiln__watchdog kiln__watchdog;
struct kiln_trainer;

/* Checks t->cfg.watchdog and starts the thread, which writes heartbeats from now on (after t's
 * rank and world are known, at the start); t->wd stays NULL when the watchdog is off. */
kiln_status kiln__watchdog_start(struct kiln_trainer *t);
void kiln__watchdog_stop(kiln__watchdog *wd); /* joins the thread; NULL is safe */
/* The start is done (a resumed run is known). Every rank takes part in the exchange of compute
 * times, or none (ranks given different watchdog flags would wait for each other): an error on
 * every rank naming those that differ. One collective, after the ranks' start is agreed. */
kiln_status kiln__watchdog_ready(struct kiln_trainer *t);
/* Step `step` begins (kiln_trainer_step's start); sleeps there when a fault is injected.
 * KILN_ERR_HUNG when the run is marked hung. */
kiln_status kiln__watchdog_begin(kiln__watchdog *wd, int64_t step);
/* An evaluation of the validation data begins: progress, and a stall until the next is allowed
 * the evaluation's batches' worth of median steps. */
void kiln__watchdog_evaluating(struct kiln_trainer *t);
/* Inside the step, before the exchange: each rank's compute time of the steps since the last
 * exchange to every rank (world > 1 and straggler detection on). */
kiln_status kiln__watchdog_exchange(struct kiln_trainer *t, int64_t step);
/* The exchange's time into mt's communication (before the step's lines are written). */
void kiln__watchdog_account(kiln__watchdog *wd, kiln_step_info *mt);
/* The step is done (after its lines): its time into the median, warnings, straggler verdicts
 * and events in the metrics file; may set t->stopping (straggler_exit). */
kiln_status kiln__watchdog_end(struct kiln_trainer *t, const kiln_step_info *mt);
/* KILN_EXIT_HUNG once a hang was found, KILN_EXIT_STRAGGLER after straggler_exit, else 0. */
int kiln__watchdog_exit_code(kiln__watchdog *wd);
/* KILN_ERR_HUNG (the hang's message) once the thread found a hang that no handler ended;
 * KILN_OK otherwise (NULL too). */
kiln_status kiln__watchdog_check(kiln__watchdog *wd);

#endif
