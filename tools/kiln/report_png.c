/* kiln report's raster canvas: a plot drawn into an RGB image (lines anti-aliased, text in a
 * 5x7 font) and written as a PNG, its pixels deflated by zlib. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "kiln/core.h"
#include "report.h"

enum { SCALE = 2 }; /* pixels a plot unit */

typedef struct raster {
    int w, h;
    uint8_t *px;  /* [h][w][3] */
    float *cover; /* [h][w]: one stroke's coverage, as it is gathered */
} raster;

static void blend(raster *r, int x, int y, uint32_t rgb, double a) {
    if (x < 0 || y < 0 || x >= r->w || y >= r->h || a <= 0)
        return;
    if (a > 1)
        a = 1;
    uint8_t *p = r->px + 3 * ((size_t)y * (size_t)r->w + (size_t)x);
    const int c[3] = {(int)(rgb >> 16 & 0xff), (int)(rgb >> 8 & 0xff), (int)(rgb & 0xff)};
    for (int k = 0; k < 3; k++)
        p[k] = (uint8_t)lround(p[k] + (c[k] - p[k]) * a);
}

static int clampi(double v, int lo, int hi) {
    if (!(v > lo))
        return lo;
    return v < hi ? (int)v : hi;
}

static void ras_rect(void *ctx, double x, double y, double w, double h, uint32_t rgb) {
    raster *r = ctx;
    int x0 = clampi(floor(x * SCALE + 0.5), 0, r->w),
        x1 = clampi(floor((x + w) * SCALE + 0.5), 0, r->w);
    int y0 = clampi(floor(y * SCALE + 0.5), 0, r->h),
        y1 = clampi(floor((y + h) * SCALE + 0.5), 0, r->h);
    for (int py = y0; py < y1; py++)
        for (int px = x0; px < x1; px++)
            blend(r, px, py, rgb, 1.0);
}

/* One segment's coverage (pixel coordinates) into r->cover, the largest kept, and the box it
 * touched grown to hold it. */
static void cover_segment(raster *r, double ax, double ay, double bx, double by, double half,
                          int box[4]) {
    int x0 = clampi(floor(fmin(ax, bx) - half - 1), 0, r->w),
        x1 = clampi(ceil(fmax(ax, bx) + half + 1), 0, r->w);
    int y0 = clampi(floor(fmin(ay, by) - half - 1), 0, r->h),
        y1 = clampi(ceil(fmax(ay, by) + half + 1), 0, r->h);
    double dx = bx - ax, dy = by - ay, len2 = dx * dx + dy * dy;
    for (int py = y0; py < y1; py++)
        for (int px = x0; px < x1; px++) {
            double cx = px + 0.5 - ax, cy = py + 0.5 - ay;
            double t = len2 > 0 ? (cx * dx + cy * dy) / len2 : 0;
            t = t < 0 ? 0 : t > 1 ? 1 : t;
            double ex = cx - t * dx, ey = cy - t * dy;
            double a = half + 0.5 - sqrt(ex * ex + ey * ey);
            float *c = &r->cover[(size_t)py * (size_t)r->w + (size_t)px];
            if (a > *c)
                *c = (float)(a > 1 ? 1 : a);
        }
    box[0] = x0 < box[0] ? x0 : box[0];
    box[1] = y0 < box[1] ? y0 : box[1];
    box[2] = x1 > box[2] ? x1 : box[2];
    box[3] = y1 > box[3] ? y1 : box[3];
}

/* A polyline drawn at once: where its segments meet, a pixel is covered once, not twice. */
static void ras_lines(void *ctx, const double *xy, int n, uint32_t rgb, double width, int dashed,
                      const char *title) {
    (void)title;
    raster *r = ctx;
    double half = fmax(0.5, width * SCALE / 2);
    int box[4] = {r->w, r->h, 0, 0};
    double phase = 0; /* plot units into the dash pattern of 6 on, 4 off */
    for (int i = 0; i + 1 < n; i++) {
        double ax = xy[2 * i], ay = xy[2 * i + 1], bx = xy[2 * i + 2], by = xy[2 * i + 3];
        if (!dashed) {
            cover_segment(r, ax * SCALE, ay * SCALE, bx * SCALE, by * SCALE, half, box);
            continue;
        }
        double len = hypot(bx - ax, by - ay), at = 0;
        while (at < len) {
            double on = phase < 6, left = on ? 6 - phase : 10 - phase;
            double step = fmin(left, len - at);
            if (on) {
                double t0 = at / len, t1 = (at + step) / len;
                cover_segment(r, (ax + t0 * (bx - ax)) * SCALE, (ay + t0 * (by - ay)) * SCALE,
                              (ax + t1 * (bx - ax)) * SCALE, (ay + t1 * (by - ay)) * SCALE, half,
                              box);
            }
            at += step;
            phase = fmod(phase + step, 10);
        }
    }
    for (int py = box[1]; py < box[3]; py++)
        for (int px = box[0]; px < box[2]; px++) {
            float *c = &r->cover[(size_t)py * (size_t)r->w + (size_t)px];
            blend(r, px, py, rgb, *c);
            *c = 0;
        }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Even-odd fill, sampled at pixel centres. */
static void fill_polygon(raster *r, const double *xy, int n, uint32_t rgb) {
    double ylo = INFINITY, yhi = -INFINITY, cross[16];
    for (int i = 0; i < n; i++) {
        ylo = fmin(ylo, xy[2 * i + 1] * SCALE);
        yhi = fmax(yhi, xy[2 * i + 1] * SCALE);
    }
    for (int py = clampi(floor(ylo), 0, r->h); py < clampi(ceil(yhi), 0, r->h); py++) {
        double cy = py + 0.5;
        int nc = 0;
        for (int i = 0; i < n && nc < 16; i++) {
            double ax = xy[2 * i] * SCALE, ay = xy[2 * i + 1] * SCALE;
            double bx = xy[2 * ((i + 1) % n)] * SCALE, by = xy[2 * ((i + 1) % n) + 1] * SCALE;
            if ((ay <= cy) != (by <= cy))
                cross[nc++] = ax + (cy - ay) / (by - ay) * (bx - ax);
        }
        qsort(cross, (size_t)nc, sizeof cross[0], cmp_double);
        for (int k = 0; k + 1 < nc; k += 2)
            for (int px = clampi(ceil(cross[k] - 0.5), 0, r->w);
                 px < clampi(floor(cross[k + 1] - 0.5) + 1, 0, r->w); px++)
                blend(r, px, py, rgb, 1.0);
    }
}

static void ras_polygon(void *ctx, const double *xy, int n, uint32_t rgb, int filled,
                        const char *title) {
    raster *r = ctx;
    if (n < 3 || n > 16)
        return;
    fill_polygon(r, xy, n, filled ? rgb : 0xffffffu);
    if (!filled) {
        double closed[34];
        memcpy(closed, xy, (size_t)n * 2 * sizeof(double));
        closed[2 * n] = xy[0];
        closed[2 * n + 1] = xy[1];
        ras_lines(ctx, closed, n + 1, rgb, 1.5, 0, title);
    }
}

/* A character is 5 dots of one plot unit and a gap; bold text's dots are half as large again. */
#define ADVANCE 6.5

static void ras_text(void *ctx, double x, double y, const char *s, int anchor, uint32_t rgb,
                     int bold) {
    raster *r = ctx;
    double dot = bold ? 1.5 : 1.0, adv = ADVANCE * dot, len = (double)strlen(s);
    double w = len > 0 ? len * adv - 1.5 * dot : 0;
    double x0 = anchor < 0 ? x : anchor == 0 ? x - w / 2 : x - w;
    int d = (int)lround(dot * SCALE);
    for (size_t i = 0; s[i]; i++) {
        const uint8_t *g = report_glyph((unsigned char)s[i]);
        int gx = (int)lround((x0 + (double)i * adv) * SCALE),
            gy = (int)lround((y - 7 * dot) * SCALE);
        for (int row = 0; row < 7; row++)
            for (int col = 0; col < 5; col++)
                if (g[row] >> (4 - col) & 1)
                    for (int py = 0; py < d; py++)
                        for (int px = 0; px < d; px++)
                            blend(r, gx + col * d + px, gy + row * d + py, rgb, 1.0);
    }
}

static const report_canvas_ops raster_ops = {ras_rect, ras_lines, ras_polygon, ras_text};

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* A chunk of n data bytes at out + 8 framed: length, type, and the CRC after the data. */
static size_t chunk(uint8_t *out, const char type[4], size_t n) {
    put_be32(out, (uint32_t)n);
    memcpy(out + 4, type, 4);
    put_be32(out + 8 + n, (uint32_t)crc32(0L, out + 4, (uInt)(n + 4)));
    return n + 12;
}

int report_png_plot(const char *path, const report_plot_def *d, report_run *const *runs, int nruns,
                    char *why, size_t cap) {
    raster r = {REPORT_W * SCALE, (int)ceil(report_plot_height(d, runs, nruns)) * SCALE, NULL,
                NULL};
    size_t npx = (size_t)r.w * (size_t)r.h, raw_n = ((size_t)r.w * 3 + 1) * (size_t)r.h;
    r.px = malloc(npx * 3);
    r.cover = calloc(npx, sizeof(float));
    uint8_t *raw = malloc(raw_n);
    uLongf packed_n = compressBound((uLong)raw_n);
    uint8_t *png = malloc(packed_n + 64);
    int rc = -1;
    if (!r.px || !r.cover || !raw || !png) {
        snprintf(why, cap, "out of memory for a %dx%d image", r.w, r.h);
        goto done;
    }
    memset(r.px, 0xff, npx * 3);
    report_canvas c = {&raster_ops, &r};
    report_plot_draw(&c, d, runs, nruns);
    for (int y = 0; y < r.h; y++) { /* each row: filter type 0, then its pixels */
        uint8_t *row = raw + (size_t)y * ((size_t)r.w * 3 + 1);
        row[0] = 0;
        memcpy(row + 1, r.px + (size_t)y * (size_t)r.w * 3, (size_t)r.w * 3);
    }
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    size_t at = 0;
    memcpy(png, sig, 8);
    at += 8;
    uint8_t *ihdr = png + at + 8;
    put_be32(ihdr, (uint32_t)r.w);
    put_be32(ihdr + 4, (uint32_t)r.h);
    ihdr[8] = 8;  /* bits a sample */
    ihdr[9] = 2;  /* RGB */
    ihdr[10] = 0; /* deflate */
    ihdr[11] = 0; /* filters per row */
    ihdr[12] = 0; /* not interlaced */
    at += chunk(png + at, "IHDR", 13);
    if (compress2(png + at + 8, &packed_n, raw, (uLong)raw_n, 6) != Z_OK) {
        snprintf(why, cap, "zlib could not compress the image");
        goto done;
    }
    at += chunk(png + at, "IDAT", packed_n);
    at += chunk(png + at, "IEND", 0);
    if (kiln_file_write(path, png, at) != KILN_OK) {
        snprintf(why, cap, "%s", kiln_error_message());
        goto done;
    }
    rc = 0;
done:
    free(r.px);
    free(r.cover);
    free(raw);
    free(png);
    return rc;
}
