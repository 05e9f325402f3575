/* The watchdog's judgements as pure functions: medians over windows, the hang limits, and the
 * straggler among ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/watchdog.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kiln__median(const double *v, int n) {
    if (n <= 0)
        return NAN;
    if (n > KILN__WD_MAX_WINDOW)
        n = KILN__WD_MAX_WINDOW;
    double s[KILN__WD_MAX_WINDOW];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

void kiln__window_init(kiln__window *w, int cap) {
    w->cap = cap < 1 ? 1 : cap > KILN__WD_MAX_WINDOW ? KILN__WD_MAX_WINDOW : cap;
    w->n = 0;
    w->next = 0;
}

void kiln__window_push(kiln__window *w, double x) {
    w->v[w->next] = x;
    w->next = (w->next + 1) % w->cap;
    if (w->n < w->cap)
        w->n++;
}

double kiln__window_median(const kiln__window *w) {
    return kiln__median(w->v, w->n);
}

kiln__hang_verdict kiln__hang_judge(const kiln_watchdog_config *c, double elapsed_s,
                                    double median_ms, int samples, double *warn_s, double *hang_s) {
    double warn = INFINITY, hang = c->hang_min_s;
    if (samples >= KILN__WD_MIN_SAMPLES && isfinite(median_ms) && median_ms >= 0) {
        /* a short step's few milliseconds of noise is no warning: a floor of a quarter of
         * the hang minimum, at most 10 s */
        warn = fmax(c->warn_factor * median_ms / 1e3, fmin(c->hang_min_s / 4, 10.0));
        hang = fmax(c->hang_factor * median_ms / 1e3, c->hang_min_s);
    }
    if (warn_s)
        *warn_s = warn;
    if (hang_s)
        *hang_s = hang;
    if (elapsed_s >= hang)
        return KILN__HANG_HUNG;
    return elapsed_s >= warn ? KILN__HANG_SLOW : KILN__HANG_OK;
}

int kiln__straggler_find(const float *times, int rows, int world, double factor, double *ratio) {
    if (ratio)
        *ratio = 0.0;
    if (world < 2 || rows < 1 || world > KILN__WD_MAX_WINDOW)
        return -1;
    if (rows > KILN__WD_MAX_WINDOW)
        rows = KILN__WD_MAX_WINDOW;
    /* each row's ratio, so that a step slow on every rank (a busy machine) cancels out */
    double row[KILN__WD_MAX_WINDOW], others[KILN__WD_MAX_WINDOW];
    int worst = -1;
    double best = 0.0;
    for (int r = 0; r < world; r++) {
        int n = 0;
        for (int i = 0; i < rows; i++) {
            const float *t = times + (size_t)i * (size_t)world;
            int k = 0;
            for (int q = 0; q < world; q++)
                if (q != r)
                    others[k++] = t[q];
            double o = kiln__median(others, k);
            if (o > 1e-3 && isfinite(t[r])) /* ms: a ratio to ~0 means nothing */
                row[n++] = t[r] / o;
        }
        double x = kiln__median(row, n);
        if (n > 0 && x > best) {
            best = x;
            worst = r;
        }
    }
    if (ratio)
        *ratio = best;
    return worst >= 0 && best > factor ? worst : -1;
}
