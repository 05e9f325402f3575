/* kiln report's pieces: the runs read from metrics files and checkpoints (report_runs.c), the
 * plots drawn once against a canvas (report_plot.c) that is either SVG text (report_svg.c) or
 * an RGB raster encoded as PNG (report_png.c), and the page around them (cmd_report.c). */
#ifndef KILN_TOOL_REPORT_H
#define KILN_TOOL_REPORT_H

#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* ---- a growable text buffer ---- */

typedef struct report_buf {
    char *s;
    size_t len, cap;
    int failed; /* an allocation failed: the text is cut short */
} report_buf;

void report_buf_printf(report_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void report_buf_put(report_buf *b, const char *s, size_t n);
void report_buf_puts(report_buf *b, const char *s); /* a NUL-terminated s */
/* s with &, <, >, " and ' as entities (text and attribute values alike). */
void report_buf_html(report_buf *b, const char *s);
void report_buf_free(report_buf *b);

/* ---- runs ---- */

/* The series a step line may carry, by the metrics file's key. */
typedef enum report_series {
    REPORT_LOSS,         /* "loss", nats */
    REPORT_VAL_LOSS,     /* "val_loss", nats */
    REPORT_LR,           /* "lr" */
    REPORT_GRAD_NORM,    /* "grad_norm", before clipping */
    REPORT_TOKENS_PER_S, /* "tokens_per_s" */
    REPORT_MFU,          /* "mfu", a fraction */
    REPORT_RSS,          /* "peak_rss_mb", MiB */
    REPORT_COMM_MS,      /* "comm_ms": ms a step in communication (several ranks) */
    REPORT_COMM_HIDDEN,  /* "comm_hidden": the fraction of it behind compute */
    REPORT_LOSS_SCALE,   /* "loss_scale" (fp16) */
    REPORT_MS,           /* "ms": the step's time */
    REPORT_ELAPSED,      /* "elapsed_s": since the process's first step began */
    REPORT_NSERIES
} report_series;

/* What an event is, for its marker and its count in the summary. */
typedef enum report_event_kind {
    REPORT_EV_SKIP,          /* guard: a bad step's update skipped ("skip") */
    REPORT_EV_ROLLBACK,      /* guard: back to a checkpoint ("rollback") */
    REPORT_EV_WARNING,       /* guard: an early warning ("warning") */
    REPORT_EV_CLIPPED,       /* guard: a norm spike clipped and trained on ("clipped_spike") */
    REPORT_EV_OVERFLOW,      /* fp16: an overflow skipped the step (a step line's "skipped") */
    REPORT_EV_STRAGGLER,     /* watchdog: a rank became a straggler ("straggler") */
    REPORT_EV_STRAGGLER_END, /* ... and was no longer one ("straggler_end") */
    REPORT_EV_RESTART,       /* a resumed process appended to the file: its steps went back */
    REPORT_EV_PRUNE,         /* pruning ("prune") */
    REPORT_EV_REBALANCE,     /* uneven ranks split again ("rank_batches") */
    REPORT_EV_OTHER,         /* a kind this kiln does not know (a newer kiln's) */
    REPORT_EV_NKINDS
} report_event_kind;

typedef struct report_event {
    int64_t step; /* -1: the line named none */
    report_event_kind kind;
    char *name; /* the line's "event" */
    char *text; /* its other fields, "key value, ..." */
} report_event;

typedef struct report_run {
    char *name;    /* for the legend, unique among the runs */
    char *source;  /* the RUN argument it came from */
    char *metrics; /* the metrics file (NULL: a checkpoint alone) */
    char *state_path;
    struct cJSON *state; /* the checkpoint's state.json, or NULL */
    /* the steps kept, ascending: a step run again (after a restart or a rollback) keeps the
     * last line written for it, as kiln run's goodput counts it */
    int64_t n, cap;
    int64_t *step;             /* [n] */
    double *v[REPORT_NSERIES]; /* [n] each; NAN where the line had no such value */
    int has[REPORT_NSERIES];   /* some kept step has the series */
    report_event *ev;          /* [nev], in the file's order */
    int64_t nev, evcap;
    int64_t count[REPORT_EV_NKINDS];
    int64_t step_lines; /* every step line read, redone steps included */
    double ms_all;      /* their "ms", summed */
    double elapsed;     /* each process's last "elapsed_s", summed (0: none) */
} report_run;

typedef struct report_set {
    report_run **runs;
    int n, cap;
    char **notes; /* what was skipped and why, for stderr and the page */
    int nnotes, notes_cap;
} report_set;

/* Read one RUN argument: a metrics file, a folder holding metrics files (*.jsonl) and
 * perhaps a checkpoint folder, or a checkpoint folder (or its state.json). Adds the runs it
 * found to set and a note for each thing skipped; 0, or -1 when out of memory. */
int report_read_arg(report_set *set, const char *arg);
/* Unique names for the legend, once every argument is read; -1 when out of memory. */
int report_name_runs(report_set *set);
void report_note(report_set *set, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void report_set_free(report_set *set);

/* "guard skip", "restart"...: an event kind in words. */
const char *report_event_label(report_event_kind k);

/* ---- drawing ---- */

/* A surface in plot units (a plot is REPORT_W wide). Colours are 0xRRGGBB. */
typedef struct report_canvas_ops {
    void (*rect)(void *ctx, double x, double y, double w, double h, uint32_t rgb);
    /* a polyline of n points xy[2n]; dashed: a pattern of 6 on, 4 off */
    void (*lines)(void *ctx, const double *xy, int n, uint32_t rgb, double width, int dashed,
                  const char *title);
    /* a closed polygon, filled or outlined */
    void (*polygon)(void *ctx, const double *xy, int n, uint32_t rgb, int filled,
                    const char *title);
    /* anchor -1 start, 0 middle, 1 end; y is the baseline */
    void (*text)(void *ctx, double x, double y, const char *s, int anchor, uint32_t rgb, int bold);
} report_canvas_ops;

typedef struct report_canvas {
    const report_canvas_ops *ops;
    void *ctx;
} report_canvas;

enum { REPORT_W = 900 };

/* One plot of the page: its file name, and what it draws. */
typedef struct report_plot_def {
    const char *id; /* "loss": the figure's id and the PNG's name */
    const char *title;
    report_series primary, secondary; /* secondary REPORT_NSERIES: none (dashed when set) */
    double scale;                     /* values are multiplied by this (a fraction as %) */
    int log;       /* 0 linear, 1 always logarithmic, 2 when the values span > 100x */
    int from_zero; /* a linear axis includes 0 */
} report_plot_def;

extern const report_plot_def report_plots[];
extern const int report_nplots;
extern const uint32_t report_palette[10];
/* Whether some run has the plot's series. */
int report_plot_present(const report_plot_def *d, report_run *const *runs, int nruns);
/* The plot's height in plot units, and the plot drawn on c. */
double report_plot_height(const report_plot_def *d, report_run *const *runs, int nruns);
void report_plot_draw(report_canvas *c, const report_plot_def *d, report_run *const *runs,
                      int nruns);

/* The plot as an inline <svg> element appended to b. */
void report_svg_plot(report_buf *b, const report_plot_def *d, report_run *const *runs, int nruns);
/* The plot as a PNG file at path, written atomically (2 pixels a plot unit). 0, or -1 with
 * the reason in why. */
int report_png_plot(const char *path, const report_plot_def *d, report_run *const *runs, int nruns,
                    char *why, size_t cap);

/* The 5x7 glyph of a printable ASCII character: 7 rows, bit 4 the leftmost column ('?' for
 * any other byte). */
const uint8_t *report_glyph(unsigned char c);

#endif
