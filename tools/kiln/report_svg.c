/* kiln report's text: a growable buffer, and the canvas that writes a plot as inline SVG. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

static int reserve(report_buf *b, size_t more) {
    if (b->failed)
        return -1;
    if (b->len + more + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->failed = 1;
        return -1;
    }
    b->s = s;
    b->cap = cap;
    return 0;
}

void report_buf_put(report_buf *b, const char *s, size_t n) {
    if (reserve(b, n))
        return;
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void report_buf_puts(report_buf *b, const char *s) {
    report_buf_put(b, s, strlen(s));
}

void report_buf_printf(report_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        report_buf_put(b, small, (size_t)n);
        return;
    }
    if (reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void report_buf_html(report_buf *b, const char *s) {
    for (const char *p = s; *p;) {
        size_t run = strcspn(p, "&<>\"'");
        report_buf_put(b, p, run);
        p += run;
        if (!*p)
            break;
        switch (*p++) {
        case '&': report_buf_put(b, "&amp;", 5); break;
        case '<': report_buf_put(b, "&lt;", 4); break;
        case '>': report_buf_put(b, "&gt;", 4); break;
        case '"': report_buf_put(b, "&quot;", 6); break;
        default: report_buf_put(b, "&#39;", 5); break;
        }
    }
}

void report_buf_free(report_buf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}

/* ---- the SVG canvas ---- */

static void points(report_buf *b, const double *xy, int n) {
    for (int i = 0; i < n; i++)
        report_buf_printf(b, "%s%.1f,%.1f", i ? " " : "", xy[2 * i], xy[2 * i + 1]);
}

static void close_titled(report_buf *b, const char *tag, const char *title) {
    if (!title) {
        report_buf_put(b, "/>\n", 3);
        return;
    }
    report_buf_put(b, "><title>", 8);
    report_buf_html(b, title);
    report_buf_printf(b, "</title></%s>\n", tag);
}

static void svg_rect(void *ctx, double x, double y, double w, double h, uint32_t rgb) {
    report_buf_printf(ctx,
                      "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                      "fill=\"#%06x\"/>\n",
                      x, y, w, h, rgb);
}

static void svg_lines(void *ctx, const double *xy, int n, uint32_t rgb, double width, int dashed,
                      const char *title) {
    report_buf *b = ctx;
    const char *dash = dashed ? " stroke-dasharray=\"6 4\"" : "";
    if (n == 2 && !title) {
        report_buf_printf(b,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                          "stroke=\"#%06x\" stroke-width=\"%g\"%s/>\n",
                          xy[0], xy[1], xy[2], xy[3], rgb, width, dash);
        return;
    }
    report_buf_printf(b,
                      "<polyline%s fill=\"none\" stroke=\"#%06x\" stroke-width=\"%g\" "
                      "stroke-linejoin=\"round\"%s points=\"",
                      title ? " class=\"series\"" : "", rgb, width, dash);
    points(b, xy, n);
    report_buf_put(b, "\"", 1);
    close_titled(b, "polyline", title);
}

static void svg_polygon(void *ctx, const double *xy, int n, uint32_t rgb, int filled,
                        const char *title) {
    report_buf *b = ctx;
    if (filled)
        report_buf_printf(b, "<polygon%s fill=\"#%06x\" points=\"", title ? " class=\"mark\"" : "",
                          rgb);
    else
        report_buf_printf(b,
                          "<polygon%s fill=\"#ffffff\" stroke=\"#%06x\" stroke-width=\"1.5\" "
                          "points=\"",
                          title ? " class=\"mark\"" : "", rgb);
    points(b, xy, n);
    report_buf_put(b, "\"", 1);
    close_titled(b, "polygon", title);
}

static void svg_text(void *ctx, double x, double y, const char *s, int anchor, uint32_t rgb,
                     int bold) {
    report_buf *b = ctx;
    static const char *anchors[3] = {"start", "middle", "end"};
    report_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"#%06x\"%s>", x, y,
                      anchors[anchor + 1], rgb,
                      bold ? " font-size=\"14\" font-weight=\"600\"" : "");
    report_buf_html(b, s);
    report_buf_put(b, "</text>\n", 8);
}

static const report_canvas_ops svg_ops = {svg_rect, svg_lines, svg_polygon, svg_text};

void report_svg_plot(report_buf *b, const report_plot_def *d, report_run *const *runs, int nruns) {
    double h = report_plot_height(d, runs, nruns);
    report_buf_printf(b,
                      "<svg class=\"plot\" data-plot=\"%s\" viewBox=\"0 0 %d %.0f\" "
                      "width=\"%d\" height=\"%.0f\" role=\"img\" aria-label=\"",
                      d->id, REPORT_W, h, REPORT_W, h);
    report_buf_html(b, d->title);
    report_buf_put(b, "\" font-size=\"11\">\n", 18);
    report_canvas c = {&svg_ops, b};
    report_plot_draw(&c, d, runs, nruns);
    report_buf_put(b, "</svg>\n", 7);
}
