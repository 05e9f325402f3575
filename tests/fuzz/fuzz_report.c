/* libFuzzer target for kiln report's metrics reader (report_runs.c) and its plots
 * (report_plot.c, report_svg.c): any bytes as a metrics file. The reader keeps a run or says
 * in a note why not, never fails but for memory; every plot of a kept run draws with finite
 * coordinates only, and its SVG is one element, closed. */
#include "fuzz_file.h"

#include <math.h>
#include <stdlib.h>

#include "report.h"

static void check_xy(const double *xy, int n) {
    for (int i = 0; i < 2 * n; i++)
        REQUIRE(isfinite(xy[i]) && fabs(xy[i]) < 1e7);
}

static void c_rect(void *ctx, double x, double y, double w, double h, uint32_t rgb) {
    (void)ctx, (void)rgb;
    double xy[4] = {x, y, w, h};
    check_xy(xy, 2);
    REQUIRE(w >= 0 && h >= 0);
}

static void c_lines(void *ctx, const double *xy, int n, uint32_t rgb, double width, int dashed,
                    const char *title) {
    (void)ctx, (void)rgb, (void)dashed, (void)title;
    REQUIRE(n >= 2 && width > 0);
    check_xy(xy, n);
}

static void c_polygon(void *ctx, const double *xy, int n, uint32_t rgb, int filled,
                      const char *title) {
    (void)ctx, (void)rgb, (void)filled, (void)title;
    REQUIRE(n >= 3 && n <= 16);
    check_xy(xy, n);
}

static void c_text(void *ctx, double x, double y, const char *s, int anchor, uint32_t rgb,
                   int bold) {
    (void)ctx, (void)rgb, (void)bold;
    double xy[2] = {x, y};
    check_xy(xy, 1);
    REQUIRE(s && anchor >= -1 && anchor <= 1);
}

static const report_canvas_ops checking = {c_rect, c_lines, c_polygon, c_text};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file f;
    fuzz_file_open(&f, data, size);
    report_set set = {0};
    REQUIRE(report_read_arg(&set, f.path) == 0);
    REQUIRE(set.n == 1 || set.nnotes > 0); /* a run, or a note saying why not */
    REQUIRE(report_name_runs(&set) == 0);
    for (int i = 0; i < set.n; i++) {
        const report_run *r = set.runs[i];
        for (int64_t k = 1; k < r->n; k++)
            REQUIRE(r->step[k - 1] < r->step[k]); /* steps kept ascending, once each */
    }
    for (int p = 0; p < report_nplots; p++) {
        const report_plot_def *d = &report_plots[p];
        if (!report_plot_present(d, set.runs, set.n))
            continue;
        report_canvas c = {&checking, NULL};
        report_plot_draw(&c, d, set.runs, set.n);
        report_buf b = {0};
        report_svg_plot(&b, d, set.runs, set.n);
        REQUIRE(b.failed || (b.s && !strncmp(b.s, "<svg", 4) && strstr(b.s, "</svg>\n") &&
                             strstr(b.s, "</svg>\n")[7] == '\0'));
        report_buf_free(&b);
    }
    report_set_free(&set);
    fuzz_file_close(&f);
    return 0;
}
