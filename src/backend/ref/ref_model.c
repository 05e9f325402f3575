/* Reference kernels for the model's layers: plain single-threaded loops, written to be
 * read and trusted. Sums over a reduction axis are carried in double so that the
 * reference stays close to the exact result whatever the size.
 * Backward kernels accumulate (+=) into parameter gradients and write (=) activation
 * gradients, except layernorm_backward, which adds into dinp (see backend.h). */
#include <math.h>
#include <string.h>

#include "backend/host.h"
#include "backend/ref/ref.h"
#include "backend/ref/ref_dtype.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f
#define LN_EPS 1e-5

/* out (B,T,C) = wte[inp[b,t]] + wpe[t] */
static void encoder_forward_f32(float *out, const int32_t *inp, const float *wte, const float *wpe,
                                int64_t B, int64_t T, int64_t C) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            float *o = out + (b * T + t) * C;
            const float *we = wte + (int64_t)inp[b * T + t] * C;
            const float *pe = wpe ? wpe + t * C : NULL;
            for (int64_t c = 0; c < C; c++)
                o[c] = we[c] + (pe ? pe[c] : 0.0f);
        }
    }
}

static void encoder_backward_f32(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                 int64_t B, int64_t T, int64_t C) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *d = dout + (b * T + t) * C;
            float *dwe = dwte ? dwte + (int64_t)inp[b * T + t] * C : NULL;
            float *dpe = dwpe ? dwpe + t * C : NULL;
            for (int64_t c = 0; c < C; c++) {
                if (dwe)
                    dwe[c] += d[c];
                if (dpe)
                    dpe[c] += d[c];
            }
        }
    }
}

/* inp, out (N,C); mean, rstd (N); weight, bias (C) */
static void layernorm_forward_f32(float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int64_t N, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        double m = 0.0;
        for (int64_t c = 0; c < C; c++)
            m += x[c];
        m /= (double)C;
        double var = 0.0;
        for (int64_t c = 0; c < C; c++)
            var += ((double)x[c] - m) * ((double)x[c] - m);
        var /= (double)C;
        double s = 1.0 / sqrt(var + LN_EPS);
        float *o = out + n * C;
        for (int64_t c = 0; c < C; c++)
            o[c] = (float)(((double)x[c] - m) * s * weight[c] + bias[c]);
        mean[n] = (float)m;
        rstd[n] = (float)s;
    }
}

/* With xhat = (x - mean) * rstd and g = weight * dout:
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static void layernorm_backward_f32(float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, const float *mean,
                                   const float *rstd, int64_t N, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        const float *d = dout + n * C;
        double m = mean[n], s = rstd[n];
        double gmean = 0.0, gxmean = 0.0;
        for (int64_t c = 0; c < C; c++) {
            double xhat = ((double)x[c] - m) * s;
            double g = (double)weight[c] * d[c];
            gmean += g;
            gxmean += g * xhat;
        }
        gmean /= (double)C;
        gxmean /= (double)C;
        float *dx = dinp + n * C;
        for (int64_t c = 0; c < C; c++) {
            double xhat = ((double)x[c] - m) * s;
            double g = (double)weight[c] * d[c];
            dbias[c] += d[c];
            dweight[c] += (float)(xhat * d[c]);
            dx[c] += (float)(s * (g - gmean - xhat * gxmean));
        }
    }
}

/* W(c, o): weight element for input channel c and output channel o in either layout. */
static inline float w_at(const float *weight, int64_t c, int64_t o, int64_t C, int64_t OC,
                         int trans_w) {
    return trans_w ? weight[o * C + c] : weight[c * OC + o];
}

static void matmul_forward_f32(float *out, const float *inp, const float *weight, const float *bias,
                               int64_t N, int64_t C, int64_t OC, int trans_w) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        for (int64_t o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int64_t c = 0; c < C; c++)
                acc += (double)x[c] * w_at(weight, c, o, C, OC, trans_w);
            out[n * OC + o] = (float)acc;
        }
    }
}

static void matmul_backward_f32(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, int64_t N, int64_t C,
                                int64_t OC, int trans_w) {
    if (dinp) {
        for (int64_t n = 0; n < N; n++) {
            for (int64_t c = 0; c < C; c++) {
                double acc = 0.0;
                for (int64_t o = 0; o < OC; o++)
                    acc += (double)dout[n * OC + o] * w_at(weight, c, o, C, OC, trans_w);
                dinp[n * C + c] = (float)acc;
            }
        }
    }
    for (int64_t c = 0; c < C; c++) {
        for (int64_t o = 0; o < OC; o++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++)
                acc += (double)inp[n * C + c] * dout[n * OC + o];
            float *dw = trans_w ? &dweight[o * C + c] : &dweight[c * OC + o];
            *dw = (float)((double)*dw + acc);
        }
    }
    if (dbias) {
        for (int64_t o = 0; o < OC; o++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++)
                acc += dout[n * OC + o];
            dbias[o] = (float)((double)dbias[o] + acc);
        }
    }
}

/* qkv (B,T,W), W = (NH + 2 NKV) hs: for position (b,t), query head h at [h hs, (h+1) hs),
 * key head j at C + j hs, value head j at C + NKV hs + j hs; query head h reads key/value
 * head h / (NH/NKV). att (B,NH,T,T), out (B,T,C). */
typedef struct gqa {
    int64_t hs, W, group, kv0, v0; /* head size, row width, queries a kv head, k and v starts */
} gqa;

static gqa gqa_of(int64_t C, int64_t NH, int64_t NKV) {
    int64_t hs = C / NH;
    return (gqa){hs, C + 2 * NKV * hs, NH / NKV, C, C + NKV * hs};
}

static void attention_forward_f32(float *out, float *att, const float *qkv, int64_t B, int64_t T,
                                  int64_t C, int64_t NH, int64_t NKV) {
    gqa g = gqa_of(C, NH, NKV);
    int64_t hs = g.hs, W = g.W;
    double scale = 1.0 / sqrt((double)hs);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            int64_t ko = g.kv0 + (h / g.group) * hs, vo = g.v0 + (h / g.group) * hs;
            for (int64_t t = 0; t < T; t++) {
                const float *q = qkv + (b * T + t) * W + h * hs;
                float *a = att + ((b * NH + h) * T + t) * T;
                double maxv = -INFINITY;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (b * T + t2) * W + ko;
                    double dot = 0.0;
                    for (int64_t i = 0; i < hs; i++)
                        dot += (double)q[i] * k[i];
                    dot *= scale;
                    a[t2] = (float)dot;
                    if (dot > maxv)
                        maxv = dot;
                }
                double sum = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    double e = exp((double)a[t2] - maxv);
                    a[t2] = (float)e;
                    sum += e;
                }
                for (int64_t t2 = 0; t2 <= t; t2++)
                    a[t2] = (float)((double)a[t2] / sum);
                for (int64_t t2 = t + 1; t2 < T; t2++)
                    a[t2] = 0.0f;
                float *o = out + (b * T + t) * C + h * hs;
                for (int64_t i = 0; i < hs; i++) {
                    double acc = 0.0;
                    for (int64_t t2 = 0; t2 <= t; t2++)
                        acc += (double)a[t2] * qkv[(b * T + t2) * W + vo + i];
                    o[i] = (float)acc;
                }
            }
        }
    }
}

/* With p = att row, dp[t2] = dout . v[t2]; dscore = p * (dp - sum_j p[j] dp[j]);
 * dq = scale * sum dscore k; dk[t2] += scale * dscore q; dv[t2] += p dout (a shared key/value
 * head gathers every query head's part). scratch holds dscore for each (b, h, t, t2). */
static void attention_backward_f32(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                   const float *att, int64_t B, int64_t T, int64_t C, int64_t NH,
                                   int64_t NKV) {
    gqa g = gqa_of(C, NH, NKV);
    int64_t hs = g.hs, W = g.W;
    double scale = 1.0 / sqrt((double)hs);
    memset(dqkv, 0, (size_t)(B * T * W) * sizeof(float));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            int64_t ko = g.kv0 + (h / g.group) * hs, vo = g.v0 + (h / g.group) * hs;
            for (int64_t t = 0; t < T; t++) {
                const float *p = att + ((b * NH + h) * T + t) * T;
                float *ds = scratch + ((b * NH + h) * T + t) * T;
                const float *d = dout + (b * T + t) * C + h * hs;
                double pdp = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (b * T + t2) * W + vo;
                    float *dv = dqkv + (b * T + t2) * W + vo;
                    double dp = 0.0;
                    for (int64_t i = 0; i < hs; i++) {
                        dp += (double)d[i] * v[i];
                        dv[i] += p[t2] * d[i];
                    }
                    ds[t2] = (float)dp;
                    /* the stored (rounded) dp, so that a row with one entry (p = 1)
                     * gives exactly 0 below */
                    pdp += (double)p[t2] * (double)ds[t2];
                }
                for (int64_t t2 = 0; t2 <= t; t2++)
                    ds[t2] = (float)((double)p[t2] * ((double)ds[t2] - pdp));
                const float *q = qkv + (b * T + t) * W + h * hs;
                float *dq = dqkv + (b * T + t) * W + h * hs;
                for (int64_t i = 0; i < hs; i++) {
                    double acc = 0.0;
                    for (int64_t t2 = 0; t2 <= t; t2++)
                        acc += (double)ds[t2] * qkv[(b * T + t2) * W + ko + i];
                    dq[i] = (float)(acc * scale);
                }
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    float *dk = dqkv + (b * T + t2) * W + ko;
                    for (int64_t i = 0; i < hs; i++)
                        dk[i] += (float)(scale * ds[t2] * q[i]);
                }
            }
        }
    }
}

/* gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
static void gelu_forward_f32(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

/* d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2) */
static void gelu_backward_f32(float *dinp, const float *inp, const float *dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float th = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] = grad * dout[i];
    }
}

static void residual_forward_f32(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* logits, dlogits (N,Vp); losses, targets (N). Each row is read completely before it is
 * written, so dlogits may alias logits. */
static void crossentropy_forward_backward_f32(float *losses, float *dlogits, const float *logits,
                                              const int32_t *targets, float dloss, int64_t N,
                                              int64_t V, int64_t Vp) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * Vp;
        double maxv = -INFINITY;
        for (int64_t i = 0; i < V; i++)
            if (x[i] > maxv)
                maxv = x[i];
        double sum = 0.0;
        for (int64_t i = 0; i < V; i++)
            sum += exp((double)x[i] - maxv);
        double logz = maxv + log(sum);
        int64_t y = targets[n];
        losses[n] = (float)(logz - (double)x[y]);
        if (!dlogits)
            continue;
        float *d = dlogits + n * Vp;
        for (int64_t i = 0; i < V; i++) {
            double p = exp((double)x[i] - logz);
            d[i] = (float)((p - (i == y ? 1.0 : 0.0)) * dloss);
        }
        for (int64_t i = V; i < Vp; i++)
            d[i] = 0.0f;
    }
}

/* ---- the ops: any dtype through the fp32 kernels above (ref_dtype.h) ---- */

void kiln__ref_encoder_forward(kiln_backend *be, kiln_dtype dt, void *out, const int32_t *inp,
                               const void *wte, const void *wpe, int64_t B, int64_t T, int64_t C) {
    /* wte's rows are only those that inp names; it is read as a whole here, which the
     * reference can afford */
    int64_t maxid = 0;
    for (int64_t i = 0; i < B * T; i++)
        maxid = inp[i] > maxid ? inp[i] : maxid;
    ref_buf o = ref_out(be, out, dt, B * T * C, 0), e = ref_in(be, wte, dt, (maxid + 1) * C),
            p = ref_in(be, wpe, dt, T * C); /* wpe NULL: p.f NULL */
    if (ref_ok(be))
        encoder_forward_f32(o.f, inp, e.f, p.f, B, T, C);
    ref_done(&o), ref_done(&e), ref_done(&p);
}

void kiln__ref_encoder_backward(kiln_backend *be, kiln_dtype dt, float *dwte, float *dwpe,
                                const void *dout, const int32_t *inp, int64_t B, int64_t T,
                                int64_t C) {
    ref_buf d = ref_in(be, dout, dt, B * T * C);
    if (ref_ok(be))
        encoder_backward_f32(dwte, dwpe, d.f, inp, B, T, C);
    ref_done(&d);
}

void kiln__ref_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *mean,
                                 float *rstd, const void *inp, const void *weight, const void *bias,
                                 int64_t N, int64_t C) {
    ref_buf o = ref_out(be, out, dt, N * C, 0), x = ref_in(be, inp, dt, N * C),
            w = ref_in(be, weight, dt, C), b = ref_in(be, bias, dt, C);
    if (ref_ok(be))
        layernorm_forward_f32(o.f, mean, rstd, x.f, w.f, b.f, N, C);
    ref_done(&o), ref_done(&x), ref_done(&w), ref_done(&b);
}

void kiln__ref_layernorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                  float *dbias, const void *dout, const void *inp,
                                  const void *weight, const float *mean, const float *rstd,
                                  int64_t N, int64_t C) {
    ref_buf dx = ref_out(be, dinp, dt, N * C, 1), d = ref_in(be, dout, dt, N * C),
            x = ref_in(be, inp, dt, N * C), w = ref_in(be, weight, dt, C);
    if (ref_ok(be))
        layernorm_backward_f32(dx.f, dweight, dbias, d.f, x.f, w.f, mean, rstd, N, C);
    ref_done(&dx), ref_done(&d), ref_done(&x), ref_done(&w);
}

/* The composition it fuses: the residual rounded to dt, then its LayerNorm. */
void kiln__ref_residual_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                          float *mean, float *rstd, const void *a, const void *b,
                                          const void *weight, const void *bias, int64_t N,
                                          int64_t C) {
    kiln__ref_residual_forward(be, dt, res, a, b, N * C);
    kiln__ref_layernorm_forward(be, dt, out, mean, rstd, res, weight, bias, N, C);
}

void kiln__ref_matmul_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                              const void *weight, const void *bias, int64_t N, int64_t C,
                              int64_t OC, int trans_w, void *gelu_out) {
    ref_buf o = ref_out(be, out, dt, N * OC, 0), x = ref_in(be, inp, dt, N * C),
            w = ref_in(be, weight, dt, C * OC), b = ref_in(be, bias, dt, OC);
    if (ref_ok(be))
        matmul_forward_f32(o.f, x.f, w.f, b.f, N, C, OC, trans_w);
    ref_done(&o), ref_done(&x), ref_done(&w), ref_done(&b);
    /* GELU of the stored (rounded) pre-activation, as the unfused ops compute it */
    if (gelu_out)
        kiln__ref_gelu_forward(be, dt, gelu_out, out, N * OC);
}

void kiln__ref_matmul_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                               float *dbias, const void *dout, const void *inp, const void *weight,
                               int64_t N, int64_t C, int64_t OC, int trans_w) {
    ref_buf dx = ref_out(be, dinp, dt, N * C, 0), d = ref_in(be, dout, dt, N * OC),
            x = ref_in(be, inp, dt, N * C), w = ref_in(be, weight, dt, C * OC);
    if (ref_ok(be))
        matmul_backward_f32(dx.f, dweight, dbias, d.f, x.f, w.f, N, C, OC, trans_w);
    ref_done(&dx), ref_done(&d), ref_done(&x), ref_done(&w);
}

/* saved: the fp32 probabilities (B,NH,T,T); scratch: dscore of the same shape. */
size_t kiln__ref_attention_saved_bytes(kiln_backend *be, kiln_dtype dt, int64_t B, int64_t T,
                                       int64_t C, int64_t NH, int64_t NKV) {
    (void)be, (void)dt, (void)C, (void)NKV;
    return (size_t)(B * NH * T * T) * sizeof(float);
}

size_t kiln__ref_attention_scratch_bytes(kiln_backend *be, kiln_dtype dt, int64_t B, int64_t T,
                                         int64_t C, int64_t NH, int64_t NKV) {
    return kiln__ref_attention_saved_bytes(be, dt, B, T, C, NH, NKV);
}

void kiln__ref_attention_forward(kiln_backend *be, kiln_dtype dt, void *out, void *saved,
                                 void *scratch, const void *qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t NH, int64_t NKV) {
    (void)scratch;
    int64_t W = gqa_of(C, NH, NKV).W;
    ref_buf o = ref_out(be, out, dt, B * T * C, 0), q = ref_in(be, qkv, dt, B * T * W);
    if (ref_ok(be))
        attention_forward_f32(o.f, saved, q.f, B, T, C, NH, NKV);
    ref_done(&o), ref_done(&q);
}

void kiln__ref_attention_decode(kiln_backend *be, kiln_dtype dt, void *out, const void *qkv,
                                int64_t B, int64_t ldT, int64_t Tk, int64_t T, int64_t C,
                                int64_t NH, int64_t NKV) {
    gqa g = gqa_of(C, NH, NKV);
    int64_t hs = g.hs, W = g.W;
    ref_buf o = ref_out(be, out, dt, B * T * C, 0), q = ref_in(be, qkv, dt, B * ldT * W);
    double *a = malloc((size_t)(Tk > 0 ? Tk : 1) * sizeof *a);
    if (!a)
        kiln_backend_fail(be, KILN_ERR_NOMEM, "ref attention_decode: no memory");
    double scale = 1.0 / sqrt((double)hs);
    for (int64_t b = 0; ref_ok(be) && b < B; b++) {
        const float *seq = q.f + b * ldT * W;
        for (int64_t h = 0; h < NH; h++) {
            int64_t ko = g.kv0 + (h / g.group) * hs, vo = g.v0 + (h / g.group) * hs;
            for (int64_t t = 0; t < T; t++) {
                int64_t p = Tk - T + t; /* the query's position */
                const float *qr = seq + p * W + h * hs;
                double maxv = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j <= p; j++) {
                    double dot = 0.0;
                    for (int64_t i = 0; i < hs; i++)
                        dot += (double)qr[i] * seq[j * W + ko + i];
                    a[j] = dot * scale;
                    maxv = a[j] > maxv ? a[j] : maxv;
                }
                for (int64_t j = 0; j <= p; j++) {
                    a[j] = exp(a[j] - maxv);
                    sum += a[j];
                }
                float *orow = o.f + (b * T + t) * C + h * hs;
                for (int64_t i = 0; i < hs; i++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j <= p; j++)
                        acc += a[j] / sum * seq[j * W + vo + i];
                    orow[i] = (float)acc;
                }
            }
        }
    }
    free(a);
    ref_done(&o), ref_done(&q);
}

void kiln__ref_attention_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, void *scratch,
                                  const void *dout, const void *qkv, const void *saved, int64_t B,
                                  int64_t T, int64_t C, int64_t NH, int64_t NKV) {
    int64_t W = gqa_of(C, NH, NKV).W;
    ref_buf dq = ref_out(be, dqkv, dt, B * T * W, 0), d = ref_in(be, dout, dt, B * T * C),
            q = ref_in(be, qkv, dt, B * T * W);
    if (ref_ok(be))
        attention_backward_f32(dq.f, scratch, d.f, q.f, saved, B, T, C, NH, NKV);
    ref_done(&dq), ref_done(&d), ref_done(&q);
}

void kiln__ref_gelu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                            int64_t n) {
    ref_buf o = ref_out(be, out, dt, n, 0), x = ref_in(be, inp, dt, n);
    if (ref_ok(be))
        gelu_forward_f32(o.f, x.f, n);
    ref_done(&o), ref_done(&x);
}

void kiln__ref_gelu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                             const void *dout, int64_t n) {
    ref_buf dx = ref_out(be, dinp, dt, n, 0), x = ref_in(be, inp, dt, n),
            d = ref_in(be, dout, dt, n);
    if (ref_ok(be))
        gelu_backward_f32(dx.f, x.f, d.f, n);
    ref_done(&dx), ref_done(&x), ref_done(&d);
}

void kiln__ref_residual_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *a,
                                const void *b, int64_t n) {
    ref_buf x = ref_in(be, a, dt, n), y = ref_in(be, b, dt, n), o = ref_out(be, out, dt, n, 0);
    if (ref_ok(be))
        residual_forward_f32(o.f, x.f, y.f, n);
    ref_done(&o), ref_done(&x), ref_done(&y);
}

void kiln__ref_crossentropy_forward_backward(kiln_backend *be, kiln_dtype dt, float *losses,
                                             void *dlogits, const void *logits,
                                             const int32_t *targets, float dloss, int64_t N,
                                             int64_t V, int64_t Vp) {
    ref_buf x = ref_in(be, logits, dt, N * Vp), d = ref_out(be, dlogits, dt, N * Vp, 0);
    if (ref_ok(be))
        crossentropy_forward_backward_f32(losses, d.f, x.f, targets, dloss, N, V, Vp);
    ref_done(&d), ref_done(&x);
}

/* Memory: host memory (backend/host.c). */
void *kiln__ref_alloc(kiln_backend *be, size_t bytes) {
    return kiln__host_alloc(be, bytes);
}
void kiln__ref_free(kiln_backend *be, void *p) {
    kiln__host_free(be, p);
}
void kiln__ref_copy(kiln_backend *be, void *dst, const void *src, size_t bytes,
                    kiln_copy_kind kind) {
    kiln__host_copy(be, dst, src, bytes, kind);
}
kiln_status kiln__ref_synchronize(kiln_backend *be) {
    return kiln__host_synchronize(be);
}
void kiln__ref_convert(kiln_backend *be, void *dst, kiln_dtype dt, const void *src, kiln_dtype st,
                       int64_t n) {
    kiln__host_convert(be, dst, dt, src, st, n);
}
