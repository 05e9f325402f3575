/* Reference kernels of the Llama family's layers: RMSNorm, rotary position embeddings and
 * SwiGLU; plain single-threaded loops, sums in double (see ref_model.c). */
#include <math.h>

#include "backend/ref/ref.h"
#include "backend/ref/ref_dtype.h"

/* inp, out (N,C); rstd (N); weight (C) */
static void rmsnorm_forward_f32(float *out, float *rstd, const float *inp, const float *weight,
                                int64_t N, int64_t C, float eps) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++)
            ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        rstd[n] = r;
        for (int64_t c = 0; c < C; c++)
            out[n * C + c] = (float)((double)x[c] * r * weight[c]);
    }
}

/* y = x r w with r = (mean(x^2) + eps)^-1/2: dx = r (w dy) - x r^3 mean(x w dy);
 * dw += sum over rows of x r dy. */
static void rmsnorm_backward_f32(float *dinp, float *dweight, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int64_t N, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *d = dout + n * C;
        double r = rstd[n], dot = 0.0;
        for (int64_t c = 0; c < C; c++)
            dot += (double)x[c] * weight[c] * d[c];
        double k = r * r * r * dot / (double)C;
        for (int64_t c = 0; c < C; c++) {
            dinp[n * C + c] += (float)(r * weight[c] * d[c] - (double)x[c] * k);
            dweight[c] += (float)((double)x[c] * r * d[c]);
        }
    }
}

void kiln__ref_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *rstd,
                               const void *inp, const void *weight, int64_t N, int64_t C,
                               float eps) {
    ref_buf o = ref_out(be, out, dt, N * C, 0), x = ref_in(be, inp, dt, N * C),
            w = ref_in(be, weight, dt, C);
    if (ref_ok(be))
        rmsnorm_forward_f32(o.f, rstd, x.f, w.f, N, C, eps);
    ref_done(&o), ref_done(&x), ref_done(&w);
}

void kiln__ref_rmsnorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                const void *dout, const void *inp, const void *weight,
                                const float *rstd, int64_t N, int64_t C) {
    ref_buf dx = ref_out(be, dinp, dt, N * C, 1), d = ref_in(be, dout, dt, N * C),
            x = ref_in(be, inp, dt, N * C), w = ref_in(be, weight, dt, C);
    if (ref_ok(be))
        rmsnorm_backward_f32(dx.f, dweight, d.f, x.f, w.f, rstd, N, C);
    ref_done(&dx), ref_done(&d), ref_done(&x), ref_done(&w);
}

/* The composition it fuses: the residual rounded to dt, then its RMSNorm. */
void kiln__ref_residual_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                        float *rstd, const void *a, const void *b,
                                        const void *weight, int64_t N, int64_t C, float eps) {
    kiln__ref_residual_forward(be, dt, res, a, b, N * C);
    kiln__ref_rmsnorm_forward(be, dt, out, rstd, res, weight, N, C, eps);
}

/* Rotate the q and k heads of each row of x (B*T rows of (NH + 2 NKV) hs) by sign x angle:
 * +1 forward, -1 backward (the transpose). */
static void rope_f32(float *x, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                     int64_t pos0, float theta, int sign) {
    int64_t W = (NH + 2 * NKV) * hs, half = hs / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            float *row = x + (b * T + t) * W;
            for (int64_t i = 0; i < half; i++) {
                float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
                float angle = (float)(pos0 + t) * inv_freq;
                double c = cos((double)angle), s = sign * sin((double)angle);
                for (int64_t h = 0; h < NH + NKV; h++) { /* q heads, then k heads */
                    float *p = row + h * hs;
                    double x0 = p[i], x1 = p[i + half];
                    p[i] = (float)(x0 * c - x1 * s);
                    p[i + half] = (float)(x1 * c + x0 * s);
                }
            }
        }
}

static void rope(kiln_backend *be, kiln_dtype dt, void *qkv, int64_t B, int64_t T, int64_t NH,
                 int64_t NKV, int64_t hs, int64_t pos0, float theta, int sign) {
    ref_buf x = ref_out(be, qkv, dt, B * T * (NH + 2 * NKV) * hs, 1);
    if (ref_ok(be))
        rope_f32(x.f, B, T, NH, NKV, hs, pos0, theta, sign);
    ref_done(&x);
}

void kiln__ref_rope_forward(kiln_backend *be, kiln_dtype dt, void *qkv, int64_t B, int64_t T,
                            int64_t NH, int64_t NKV, int64_t hs, int64_t pos0, float theta) {
    rope(be, dt, qkv, B, T, NH, NKV, hs, pos0, theta, 1);
}

void kiln__ref_rope_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, int64_t B, int64_t T,
                             int64_t NH, int64_t NKV, int64_t hs, int64_t pos0, float theta) {
    rope(be, dt, dqkv, B, T, NH, NKV, hs, pos0, theta, -1);
}

static double silu(double g) {
    return g / (1.0 + exp(-g));
}

void kiln__ref_swiglu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                              int64_t N, int64_t H) {
    ref_buf o = ref_out(be, out, dt, N * H, 0), x = ref_in(be, inp, dt, N * 2 * H);
    for (int64_t n = 0; ref_ok(be) && n < N; n++)
        for (int64_t j = 0; j < H; j++)
            o.f[n * H + j] = (float)(silu(x.f[n * 2 * H + j]) * x.f[n * 2 * H + H + j]);
    ref_done(&o), ref_done(&x);
}

/* d gate = dy up silu'(g), silu'(g) = s (1 + g (1 - s)) with s the sigmoid; d up = dy silu(g) */
void kiln__ref_swiglu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                               const void *dout, int64_t N, int64_t H) {
    ref_buf dx = ref_out(be, dinp, dt, N * 2 * H, 0), x = ref_in(be, inp, dt, N * 2 * H),
            d = ref_in(be, dout, dt, N * H);
    for (int64_t n = 0; ref_ok(be) && n < N; n++)
        for (int64_t j = 0; j < H; j++) {
            double g = x.f[n * 2 * H + j], u = x.f[n * 2 * H + H + j], dy = d.f[n * H + j];
            double sg = 1.0 / (1.0 + exp(-g));
            dx.f[n * 2 * H + j] = (float)(dy * u * sg * (1.0 + g * (1.0 - sg)));
            dx.f[n * 2 * H + H + j] = (float)(dy * g * sg);
        }
    ref_done(&dx), ref_done(&x), ref_done(&d);
}
