/* Stability guards' bookkeeping (guard.h): z-scores over a window of good steps and the
 * trends that precede divergence. */
#include "train/guard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* A spike needs a history of at least half a window (and 8 steps), so that the first steps,
 * whose loss falls fastest, are never judged against too few. */
#define GUARD_MIN_HISTORY 8
/* Standard deviations below these floors are raised to them, so that a flat series does not
 * make an ordinary wobble a spike: 2% of the mean loss; 0.35 in log(norm) (a norm 1.4x): with z 6 a
 * calm history calls a norm a spike at 8x its geometric mean. */
#define GUARD_LOSS_REL_FLOOR 0.02
#define GUARD_LNORM_FLOOR 0.35
/* Trend thresholds: the norm's median doubles, the loss's median rises 5%, 3 spikes, the loss
 * scale falls 256-fold, each within one window. */
#define GUARD_NORM_GROWTH 2.0
#define GUARD_LOSS_RISE 1.05
#define GUARD_SPIKE_RATE 3
#define GUARD_SCALE_FALL 256.0

const char *kiln__guard_verdict_name(kiln_guard_verdict v) {
    switch (v) {
    case KILN_GUARD_OK: return "ok";
    case KILN_GUARD_NONFINITE_LOSS: return "nonfinite_loss";
    case KILN_GUARD_NONFINITE_GRAD: return "nonfinite_grad";
    case KILN_GUARD_LOSS_SPIKE: return "loss_spike";
    case KILN_GUARD_NORM_SPIKE: return "grad_norm_spike";
    case KILN_GUARD_LOSS_CEILING: return "loss_above_start";
    }
    return "unknown";
}

kiln_status kiln__guard_init(kiln_guard *g, int64_t window, double z) {
    memset(g, 0, sizeof *g);
    if (window < 0 || window > 100000 || !(z >= 0.0))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the guard's window must be 0-100000 steps and its z-score >= 0");
    g->window = window;
    g->z = z;
    if (window == 0)
        return KILN_OK;
    g->loss = calloc((size_t)window, sizeof *g->loss);
    g->lnorm = calloc((size_t)window, sizeof *g->lnorm);
    g->spikes = calloc((size_t)window, sizeof *g->spikes);
    if (!g->loss || !g->lnorm || !g->spikes) {
        kiln__guard_free(g);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the guard's history");
    }
    return KILN_OK;
}

void kiln__guard_free(kiln_guard *g) {
    free(g->loss);
    free(g->lnorm);
    free(g->spikes);
    memset(g, 0, sizeof *g);
}

void kiln__guard_reset(kiln_guard *g) { /* the ceiling stays: the run's start is the same */
    g->count = g->head = 0;
    g->above = 0;
    g->nspikes = g->spike_head = 0;
    g->scale_max = 0.0;
    g->scale_max_step = 0;
}

static int64_t min_history(const kiln_guard *g) {
    int64_t h = g->window / 2;
    return h < GUARD_MIN_HISTORY ? GUARD_MIN_HISTORY : h;
}

/* The z-score of x against the history's values (h[0..n)), the deviation at least floor. */
static double zscore(const double *h, int64_t n, double x, double floor) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; i++)
        mean += h[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++)
        var += (h[i] - mean) * (h[i] - mean);
    double sd = sqrt(var / (double)n);
    if (sd < floor)
        sd = floor;
    return (x - mean) / sd;
}

kiln_guard_verdict kiln__guard_check(const kiln_guard *g, double loss, double norm,
                                     double *zs) {
    *zs = 0.0;
    if (!isfinite(loss))
        return KILN_GUARD_NONFINITE_LOSS;
    if (!isfinite(norm))
        return KILN_GUARD_NONFINITE_GRAD;
    if (g->ceiling > 0.0 && loss > g->ceiling && g->above + 1 >= KILN_GUARD_CEILING_RUN)
        return KILN_GUARD_LOSS_CEILING;
    if (g->window == 0 || g->z <= 0.0 || g->count < min_history(g) || g->count < 2)
        return KILN_GUARD_OK;
    double mean = 0.0;
    for (int64_t i = 0; i < g->count; i++)
        mean += g->loss[i];
    mean /= (double)g->count;
    double zl = zscore(g->loss, g->count, loss, GUARD_LOSS_REL_FLOOR * fabs(mean) + 1e-6);
    double zn = zscore(g->lnorm, g->count, log(norm > 1e-30 ? norm : 1e-30), GUARD_LNORM_FLOOR);
    *zs = zl > zn ? zl : zn;
    if (zl > g->z)
        return KILN_GUARD_LOSS_SPIKE;
    if (zn > g->z)
        return KILN_GUARD_NORM_SPIKE;
    return KILN_GUARD_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The medians of the older and the newer half of a full window (oldest first from head). */
static void half_medians(const kiln_guard *g, const double *ring, double *older, double *newer) {
    int64_t n = g->window, h = n / 2;
    double *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) {
        *older = *newer = 0.0;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        tmp[i] = ring[(g->head + i) % n];
    qsort(tmp, (size_t)h, sizeof *tmp, cmp_double);
    qsort(tmp + h, (size_t)(n - h), sizeof *tmp, cmp_double);
    *older = tmp[h / 2];
    *newer = tmp[h + (n - h) / 2];
    free(tmp);
}

/* Whether warning `bit` may be given at step (at most once a window). */
static int due(kiln_guard *g, int bit, int64_t step) {
    int k = 0;
    while ((1 << k) != bit)
        k++;
    if (g->warned_at[k] > 0 && step - g->warned_at[k] < g->window)
        return 0;
    g->warned_at[k] = step;
    return 1;
}

int kiln__guard_record(kiln_guard *g, int64_t step, kiln_guard_verdict v, double loss,
                       double norm, double loss_scale, double *ratio) {
    *ratio = 0.0;
    g->above = g->ceiling > 0.0 && loss > g->ceiling ? g->above + 1 : 0;
    if (g->window == 0)
        return 0;
    int warn = 0;
    if (v == KILN_GUARD_OK) {
        g->loss[g->head] = loss;
        g->lnorm[g->head] = log(norm > 1e-30 ? norm : 1e-30);
        g->head = (g->head + 1) % g->window;
        if (g->count < g->window)
            g->count++;
    } else {
        g->spikes[g->spike_head] = step;
        g->spike_head = (g->spike_head + 1) % g->window;
        if (g->nspikes < g->window)
            g->nspikes++;
    }
    if (g->count == g->window && g->window >= 4) {
        double lo, hi;
        half_medians(g, g->lnorm, &lo, &hi);
        if (exp(hi - lo) >= GUARD_NORM_GROWTH && !*ratio && due(g, KILN_GUARD_WARN_NORM_GROWTH, step)) {
            warn |= KILN_GUARD_WARN_NORM_GROWTH;
            *ratio = exp(hi - lo);
        }
        half_medians(g, g->loss, &lo, &hi);
        if (lo > 0 && hi / lo >= GUARD_LOSS_RISE && due(g, KILN_GUARD_WARN_LOSS_RISE, step)) {
            warn |= KILN_GUARD_WARN_LOSS_RISE;
            if (!*ratio)
                *ratio = hi / lo;
        }
    }
    int64_t recent = 0;
    for (int64_t i = 0; i < g->nspikes; i++)
        recent += step - g->spikes[i] < g->window;
    if (recent >= GUARD_SPIKE_RATE && due(g, KILN_GUARD_WARN_SPIKE_RATE, step)) {
        warn |= KILN_GUARD_WARN_SPIKE_RATE;
        if (!*ratio)
            *ratio = (double)recent;
    }
    if (loss_scale > 0.0) {
        if (loss_scale >= g->scale_max || step - g->scale_max_step >= g->window) {
            g->scale_max = loss_scale;
            g->scale_max_step = step;
        }
        if (g->scale_max / loss_scale >= GUARD_SCALE_FALL &&
            due(g, KILN_GUARD_WARN_SCALE_FALL, step)) {
            warn |= KILN_GUARD_WARN_SCALE_FALL;
            if (!*ratio)
                *ratio = g->scale_max / loss_scale;
        }
    }
    return warn;
}
