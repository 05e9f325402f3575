/* kiln report's plots, drawn once against a canvas (SVG text or a raster): the axes with
 * their ticks, one curve per run and series, the runs' events marked along the step axis, a
 * legend of the runs and a key of the event marks. Units are the plot's: REPORT_W wide. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#define NS REPORT_NSERIES
const report_plot_def report_plots[] = {
    {"loss", "loss (nats)", REPORT_LOSS, REPORT_VAL_LOSS, 1.0, 0, 0},
    {"lr", "learning rate", REPORT_LR, NS, 1.0, 0, 1},
    {"grad_norm", "gradient norm (before clipping)", REPORT_GRAD_NORM, NS, 1.0, 2, 1},
    {"tokens_per_s", "throughput (tokens/s)", REPORT_TOKENS_PER_S, NS, 1.0, 0, 1},
    {"mfu", "model FLOPs utilisation (%)", REPORT_MFU, NS, 100.0, 0, 1},
    {"memory", "peak resident memory (MiB)", REPORT_RSS, NS, 1.0, 0, 1},
    {"comm_ms", "communication time (ms a step)", REPORT_COMM_MS, NS, 1.0, 0, 1},
    {"comm_hidden", "communication hidden behind compute (%)", REPORT_COMM_HIDDEN, NS, 100.0, 0, 1},
    {"loss_scale", "loss scale (fp16)", REPORT_LOSS_SCALE, NS, 1.0, 1, 0},
};
#undef NS
const int report_nplots = (int)(sizeof report_plots / sizeof report_plots[0]);

/* Tableau's ten: told apart by most eyes, and far from the axes' greys. */
const uint32_t report_palette[10] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                                     0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};

enum {
    AREA_H = 200, /* the plotting area's height */
    BELOW = 46,   /* tick labels and the axis name under it */
    KEY_H = 20,   /* the key of the event marks */
    LEGEND_ROW = 16,
    NAME_MAX = 40, /* characters of a run's name in a legend */
};
#define LEFT 72.0
#define RIGHT (REPORT_W - 24.0)
#define CHAR_W 6.5 /* a character's advance, both canvases' text being about this wide */
#define INK 0x333333u
#define GRID 0xe6e6e6u
#define FRAME 0x999999u

typedef struct axis {
    double lo, hi; /* log10 of the bounds when log */
    int log;
    double p0, p1; /* where lo and hi go */
} axis;

static double axis_map(const axis *a, double v) {
    double t = ((a->log ? log10(v) : v) - a->lo) / (a->hi - a->lo);
    return a->p0 + t * (a->p1 - a->p0);
}

static int series_in(const report_plot_def *d, int s) {
    return s == (int)d->primary || (d->secondary != REPORT_NSERIES && s == (int)d->secondary);
}

int report_plot_present(const report_plot_def *d, report_run *const *runs, int nruns) {
    for (int i = 0; i < nruns; i++)
        for (int s = 0; s < REPORT_NSERIES; s++)
            if (series_in(d, s) && runs[i]->has[s])
                return 1;
    return 0;
}

static int usable(double v, int log) {
    return isfinite(v) && (!log || v > 0);
}

static void data_range(const report_plot_def *d, report_run *const *runs, int nruns, int log,
                       double *x0, double *x1, double *y0, double *y1) {
    *x0 = *y0 = INFINITY;
    *x1 = *y1 = -INFINITY;
    for (int i = 0; i < nruns; i++)
        for (int s = 0; s < REPORT_NSERIES; s++) {
            if (!series_in(d, s) || !runs[i]->has[s])
                continue;
            for (int64_t k = 0; k < runs[i]->n; k++) {
                double v = runs[i]->v[s][k] * d->scale;
                if (!usable(v, log))
                    continue;
                *x0 = fmin(*x0, (double)runs[i]->step[k]);
                *x1 = fmax(*x1, (double)runs[i]->step[k]);
                *y0 = fmin(*y0, v);
                *y1 = fmax(*y1, v);
            }
        }
}

/* 1, 2 or 5 times a power of ten, near span / target. */
static double nice_step(double span, int target) {
    double raw = span / target, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1.0 : f < 3.0 ? 2.0 : f < 7.0 ? 5.0 : 10.0) * p;
}

static void tick_label(char *b, size_t cap, double v, double step) {
    double a = fabs(v);
    if (a < step * 1e-6)
        snprintf(b, cap, "0");
    else if (a >= 1e9)
        snprintf(b, cap, "%.4gG", v / 1e9);
    else if (a >= 1e6)
        snprintf(b, cap, "%.4gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(b, cap, "%.4gk", v / 1e3);
    else
        snprintf(b, cap, "%.4g", v);
}

/* The plot's axes: x from the first step to the last, y to nice bounds. 0 when nothing. */
static int plot_axes(const report_plot_def *d, report_run *const *runs, int nruns, double top,
                     axis *ax, axis *ay) {
    double x0, x1, y0, y1;
    data_range(d, runs, nruns, d->log == 1, &x0, &x1, &y0, &y1);
    if (!(x0 <= x1))
        return 0;
    int log = d->log == 1 || (d->log == 2 && y0 > 0 && y1 / y0 > 100.0);
    if (x1 - x0 < 1) {
        x0 -= 1;
        x1 += 1;
    }
    *ax = (axis){x0, x1, 0, LEFT, RIGHT};
    *ay = (axis){0, 0, log, top + AREA_H, top};
    if (log) {
        ay->lo = floor(log10(y0));
        ay->hi = ceil(log10(y1));
        if (ay->hi <= ay->lo)
            ay->hi = ay->lo + 1;
        return 1;
    }
    if (d->from_zero && y0 > 0)
        y0 = 0;
    if (y1 - y0 <= fabs(y1) * 1e-9) {
        double pad = fabs(y1) > 0 ? fabs(y1) * 0.1 : 1.0;
        y0 -= pad;
        y1 += pad;
    }
    double st = nice_step(y1 - y0, 5);
    ay->lo = floor(y0 / st + 1e-9) * st;
    ay->hi = ceil(y1 / st - 1e-9) * st;
    return 1;
}

static void hline(report_canvas *c, double x0, double x1, double y, uint32_t rgb) {
    double xy[4] = {x0, y, x1, y};
    c->ops->lines(c->ctx, xy, 2, rgb, 1.0, 0, NULL);
}

static void vline(report_canvas *c, double x, double y0, double y1, uint32_t rgb, int dashed) {
    double xy[4] = {x, y0, x, y1};
    c->ops->lines(c->ctx, xy, 2, rgb, 1.0, dashed, NULL);
}

static void draw_axes(report_canvas *c, const axis *ax, const axis *ay) {
    double top = ay->p1, bottom = ay->p0;
    char b[32];
    if (ay->log) {
        int decades = (int)(ay->hi - ay->lo);
        for (int e = (int)ay->lo; e <= (int)ay->hi; e++)
            for (int m = 1; m <= 5; m++) {
                if ((m != 1 && (decades > 2 || m == 3 || m == 4)) || (m > 1 && e == (int)ay->hi))
                    continue;
                double v = m * pow(10.0, e), y = axis_map(ay, v);
                hline(c, LEFT, RIGHT, y, GRID);
                tick_label(b, sizeof b, v, v);
                c->ops->text(c->ctx, LEFT - 6, y + 4, b, 1, INK, 0);
            }
    } else {
        double st = nice_step(ay->hi - ay->lo, 5);
        for (double v = ay->lo; v <= ay->hi + st * 1e-6; v += st) {
            double y = axis_map(ay, v);
            hline(c, LEFT, RIGHT, y, GRID);
            tick_label(b, sizeof b, v, st);
            c->ops->text(c->ctx, LEFT - 6, y + 4, b, 1, INK, 0);
        }
    }
    double st = fmax(1.0, nice_step(ax->hi - ax->lo, 8));
    for (double v = ceil(ax->lo / st) * st; v <= ax->hi + 1e-9; v += st) {
        double x = axis_map(ax, v);
        vline(c, x, top, bottom, GRID, 0);
        vline(c, x, bottom, bottom + 4, FRAME, 0);
        tick_label(b, sizeof b, v, st);
        c->ops->text(c->ctx, x, bottom + 16, b, 0, INK, 0);
    }
    c->ops->text(c->ctx, (LEFT + RIGHT) / 2, bottom + 34, "step", 0, INK, 0);
    double frame[10] = {LEFT, top, RIGHT, top, RIGHT, bottom, LEFT, bottom, LEFT, top};
    c->ops->lines(c->ctx, frame, 5, FRAME, 1.0, 0, NULL);
}

/* ---- curves ---- */

/* Points in columns of this width at most 4 a column (first, lowest, highest, last): a
 * million steps draw as fast as a thousand and look the same. */
typedef struct piece {
    double *xy;
    int n;
    int col; /* the column being gathered (INT32_MIN: none) */
    double first[2], lo[2], hi[2], last[2];
    int64_t ifirst, ilo, ihi, ilast;
} piece;

static void put_point(piece *p, const double *pt) {
    if (p->n > 0 && p->xy[2 * p->n - 2] == pt[0] && p->xy[2 * p->n - 1] == pt[1])
        return;
    p->xy[2 * p->n] = pt[0];
    p->xy[2 * p->n + 1] = pt[1];
    p->n++;
}

static void flush_column(piece *p) {
    if (p->col == INT32_MIN)
        return;
    /* the column's points in the order they came */
    const double *pts[4] = {p->first, p->lo, p->hi, p->last};
    int64_t at[4] = {p->ifirst, p->ilo, p->ihi, p->ilast};
    for (;;) {
        int best = -1;
        for (int k = 0; k < 4; k++)
            if (at[k] >= 0 && (best < 0 || at[k] < at[best]))
                best = k;
        if (best < 0)
            break;
        put_point(p, pts[best]);
        int64_t done = at[best];
        for (int k = 0; k < 4; k++)
            if (at[k] == done)
                at[k] = -1;
    }
    p->col = INT32_MIN;
}

static void add_point(piece *p, double x, double y, int64_t i) {
    int col = (int)floor(x);
    if (col != p->col) {
        flush_column(p);
        p->col = col;
        p->first[0] = p->lo[0] = p->hi[0] = x;
        p->first[1] = p->lo[1] = p->hi[1] = y;
        p->ifirst = p->ilo = p->ihi = i;
    }
    if (y < p->lo[1]) { /* screen y grows downwards: lo is the highest value */
        p->lo[0] = x, p->lo[1] = y, p->ilo = i;
    }
    if (y > p->hi[1]) {
        p->hi[0] = x, p->hi[1] = y, p->ihi = i;
    }
    p->last[0] = x, p->last[1] = y, p->ilast = i;
}

static void dot(report_canvas *c, double x, double y, double r, uint32_t rgb, const char *title) {
    double xy[24];
    for (int k = 0; k < 12; k++) {
        xy[2 * k] = x + r * cos(k * M_PI / 6);
        xy[2 * k + 1] = y + r * sin(k * M_PI / 6);
    }
    c->ops->polygon(c->ctx, xy, 12, rgb, 1, title);
}

static void end_piece(report_canvas *c, piece *p, uint32_t rgb, int dashed, const char *title) {
    flush_column(p);
    if (p->n == 1 || (dashed && p->n <= 60)) /* a lone point, or evaluations few enough */
        for (int k = 0; k < p->n; k++)
            dot(c, p->xy[2 * k], p->xy[2 * k + 1], 2.5, rgb, title);
    if (p->n >= 2)
        c->ops->lines(c->ctx, p->xy, p->n, rgb, dashed ? 1.5 : 1.8, dashed, title);
    p->n = 0;
}

static void draw_series(report_canvas *c, const report_plot_def *d, const report_run *r,
                        report_series s, uint32_t rgb, const axis *ax, const axis *ay) {
    int dashed = s == d->secondary;
    piece p = {.xy = malloc((size_t)(r->n * 2 + 8) * sizeof(double)), .col = INT32_MIN};
    if (!p.xy)
        return;
    char title[600];
    snprintf(title, sizeof title, "%s: %s%s", r->name, d->title, dashed ? " (validation)" : "");
    for (int64_t k = 0; k < r->n; k++) {
        double v = r->v[s][k] * d->scale;
        if (!usable(v, ay->log)) {
            if (!dashed || !isnan(v)) /* a gap; evaluations, every few steps, are joined */
                end_piece(c, &p, rgb, dashed, title);
            continue;
        }
        add_point(&p, axis_map(ax, (double)r->step[k]), axis_map(ay, v), k);
    }
    end_piece(c, &p, rgb, dashed, title);
    free(p.xy);
}

/* ---- events ---- */

/* A mark's outline at unit size, and whether it is filled. */
typedef struct mark {
    int n;
    double pt[16];
    int filled;
    int row; /* 0 at the axis (the guards'), 1 above it */
} mark;

static const mark marks[REPORT_EV_NKINDS] = {
    [REPORT_EV_SKIP] = {3, {-1, -1, 1, -1, 0, 1}, 1, 0},
    [REPORT_EV_ROLLBACK] = {4, {-1, -1, 1, -1, 1, 1, -1, 1}, 1, 0},
    [REPORT_EV_WARNING] = {4, {0, -1.2, 1.2, 0, 0, 1.2, -1.2, 0}, 0, 0},
    [REPORT_EV_CLIPPED] = {8, {1, 0, .7, .7, 0, 1, -.7, .7, -1, 0, -.7, -.7, 0, -1, .7, -.7}, 0, 0},
    [REPORT_EV_OVERFLOW] = {4, {0, -1.2, 1.2, 0, 0, 1.2, -1.2, 0}, 1, 0},
    [REPORT_EV_STRAGGLER] = {3, {-1, 1, 1, 1, 0, -1}, 1, 1},
    [REPORT_EV_STRAGGLER_END] = {3, {-1, 1, 1, 1, 0, -1}, 0, 1},
    [REPORT_EV_RESTART] = {8, {1, 0, .7, .7, 0, 1, -.7, .7, -1, 0, -.7, -.7, 0, -1, .7, -.7}, 1, 1},
    [REPORT_EV_PRUNE] = {4, {-1, -1, 1, -1, 1, 1, -1, 1}, 0, 1},
    [REPORT_EV_REBALANCE] = {3, {-1, -1, 1, -1, 0, 1}, 0, 1},
    [REPORT_EV_OTHER] = {4, {-.5, -1.2, .5, -1.2, .5, 1.2, -.5, 1.2}, 1, 1},
};

static void draw_mark(report_canvas *c, report_event_kind k, double x, double y, uint32_t rgb,
                      const char *title) {
    const mark *m = &marks[k];
    double xy[16];
    for (int i = 0; i < m->n; i++) {
        xy[2 * i] = x + 4.0 * m->pt[2 * i];
        xy[2 * i + 1] = y + 4.0 * m->pt[2 * i + 1];
    }
    c->ops->polygon(c->ctx, xy, m->n, rgb, m->filled, title);
}

/* The kinds of event that fall on the plot's steps, as bits. */
static unsigned kinds_shown(report_run *const *runs, int nruns, const axis *ax) {
    unsigned bits = 0;
    for (int i = 0; i < nruns; i++)
        for (int64_t e = 0; e < runs[i]->nev; e++) {
            double s = (double)runs[i]->ev[e].step;
            if (runs[i]->ev[e].step >= 0 && s >= ax->lo && s <= ax->hi)
                bits |= 1u << runs[i]->ev[e].kind;
        }
    return bits;
}

static void draw_events(report_canvas *c, report_run *const *runs, int nruns, const axis *ax,
                        const axis *ay) {
    for (int i = 0; i < nruns; i++) {
        const report_run *r = runs[i];
        uint32_t rgb = report_palette[i % 10];
        int last_col[REPORT_EV_NKINDS];
        for (int k = 0; k < REPORT_EV_NKINDS; k++)
            last_col[k] = INT32_MIN;
        for (int64_t e = 0; e < r->nev; e++) {
            const report_event *ev = &r->ev[e];
            double s = (double)ev->step;
            if (ev->step < 0 || s < ax->lo || s > ax->hi)
                continue;
            double x = axis_map(ax, s);
            if ((int)floor(x) == last_col[ev->kind]) /* one mark a column, a kind and a run */
                continue;
            last_col[ev->kind] = (int)floor(x);
            char title[1024];
            snprintf(title, sizeof title, "%s: step %lld: %s%s%s", r->name, (long long)ev->step,
                     ev->kind == REPORT_EV_OTHER ? ev->name : report_event_label(ev->kind),
                     ev->text[0] ? ": " : "", ev->text);
            if (ev->kind == REPORT_EV_RESTART || ev->kind == REPORT_EV_ROLLBACK)
                vline(c, x, ay->p1, ay->p0, rgb, 1);
            draw_mark(c, ev->kind, x, ay->p0 - 7 - 12 * marks[ev->kind].row, rgb, title);
        }
    }
}

static void draw_key(report_canvas *c, unsigned bits, double y) {
    double x = LEFT;
    for (int k = 0; k < REPORT_EV_NKINDS; k++) {
        if (!(bits & (1u << k)))
            continue;
        draw_mark(c, (report_event_kind)k, x + 4, y - 4, 0x555555u, NULL);
        c->ops->text(c->ctx, x + 12, y, report_event_label((report_event_kind)k), -1, INK, 0);
        x += 24 + CHAR_W * (double)strlen(report_event_label((report_event_kind)k));
    }
}

/* ---- the legend ---- */

static double name_width(const char *name) {
    size_t n = strlen(name);
    return CHAR_W * (double)(n > NAME_MAX ? NAME_MAX : n);
}

/* Rows of the legend, placed from LEFT and wrapped at RIGHT; draws them when c is set. */
static int legend(report_canvas *c, report_run *const *runs, int nruns, double y0, int val) {
    double x = LEFT, y = y0;
    int rows = 1;
    for (int i = 0; i <= nruns; i++) {
        if (i == nruns && !val)
            break;
        const char *name = i < nruns ? runs[i]->name : "validation: dashed";
        double w = 22 + name_width(name);
        if (x > LEFT && x + w > RIGHT) {
            x = LEFT;
            y += LEGEND_ROW;
            rows++;
        }
        if (c && i < nruns) {
            char text[NAME_MAX + 1];
            if (strlen(name) > NAME_MAX)
                snprintf(text, sizeof text, "%.*s...", NAME_MAX - 3, name);
            else
                snprintf(text, sizeof text, "%s", name);
            c->ops->rect(c->ctx, x, y - 7, 16, 5, report_palette[i % 10]);
            c->ops->text(c->ctx, x + 20, y, text, -1, INK, 0);
        } else if (c) {
            double xy[4] = {x, y - 4.5, x + 16, y - 4.5};
            c->ops->lines(c->ctx, xy, 2, 0x555555u, 1.5, 1, NULL);
            c->ops->text(c->ctx, x + 20, y, name, -1, INK, 0);
        }
        x += w + 14;
    }
    return rows;
}

static int has_val(const report_plot_def *d, report_run *const *runs, int nruns) {
    for (int i = 0; i < nruns && d->secondary != REPORT_NSERIES; i++)
        if (runs[i]->has[d->secondary])
            return 1;
    return 0;
}

static double area_top(const report_plot_def *d, report_run *const *runs, int nruns) {
    return 34.0 + LEGEND_ROW * legend(NULL, runs, nruns, 0, has_val(d, runs, nruns));
}

double report_plot_height(const report_plot_def *d, report_run *const *runs, int nruns) {
    axis ax, ay;
    double top = area_top(d, runs, nruns);
    if (!plot_axes(d, runs, nruns, top, &ax, &ay))
        return top + AREA_H + BELOW;
    return top + AREA_H + BELOW + (kinds_shown(runs, nruns, &ax) ? KEY_H : 0);
}

void report_plot_draw(report_canvas *c, const report_plot_def *d, report_run *const *runs,
                      int nruns) {
    double top = area_top(d, runs, nruns), h = report_plot_height(d, runs, nruns);
    axis ax, ay;
    c->ops->rect(c->ctx, 0, 0, REPORT_W, h, 0xffffffu);
    c->ops->text(c->ctx, LEFT, 20, d->title, -1, 0x111111u, 1);
    legend(c, runs, nruns, 40, has_val(d, runs, nruns));
    if (!plot_axes(d, runs, nruns, top, &ax, &ay))
        return;
    draw_axes(c, &ax, &ay);
    for (int i = 0; i < nruns; i++) {
        uint32_t rgb = report_palette[i % 10];
        if (d->secondary != REPORT_NSERIES && runs[i]->has[d->secondary])
            draw_series(c, d, runs[i], d->secondary, rgb, &ax, &ay);
        if (runs[i]->has[d->primary])
            draw_series(c, d, runs[i], d->primary, rgb, &ax, &ay);
    }
    draw_events(c, runs, nruns, &ax, &ay);
    unsigned bits = kinds_shown(runs, nruns, &ax);
    if (bits)
        draw_key(c, bits, top + AREA_H + BELOW + 8);
}
