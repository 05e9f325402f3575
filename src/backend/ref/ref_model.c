/* Reference kernels for the model's layers: plain single-threaded loops, written to be
 * read and trusted. Sums over a reduction axis are carried in double so that the
 * reference stays close to the exact result whatever the size.
 * Backward kernels accumulate (+=) into parameter gradients and write (=) activation
 * gradients, except layernorm_backward, which adds into dinp (see backend.h). */
#include <math.h>
#include <string.h>

#include "backend/ref/ref.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f
#define LN_EPS 1e-5

/* out (B,T,C) = wte[inp[b,t]] + wpe[t] */
void kiln__ref_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                               int64_t B, int64_t T, int64_t C) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            float *o = out + (b * T + t) * C;
            const float *we = wte + (int64_t)inp[b * T + t] * C;
            const float *pe = wpe + t * C;
            for (int64_t c = 0; c < C; c++)
                o[c] = we[c] + pe[c];
        }
    }
}

void kiln__ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                int64_t B, int64_t T, int64_t C) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *d = dout + (b * T + t) * C;
            float *dwe = dwte + (int64_t)inp[b * T + t] * C;
            float *dpe = dwpe + t * C;
            for (int64_t c = 0; c < C; c++) {
                dwe[c] += d[c];
                dpe[c] += d[c];
            }
        }
    }
}

/* inp, out (N,C); mean, rstd (N); weight, bias (C) */
void kiln__ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
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
void kiln__ref_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
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

void kiln__ref_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
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

void kiln__ref_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
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

/* qkv (B,T,3C): for position (b,t), q at [0,C), k at [C,2C), v at [2C,3C), head h at
 * channels [h*hs, (h+1)*hs) of each. att (B,NH,T,T), out (B,T,C). */
void kiln__ref_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T,
                                 int64_t C, int64_t NH) {
    int64_t hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            for (int64_t t = 0; t < T; t++) {
                const float *q = qkv + (b * T + t) * 3 * C + h * hs;
                float *a = att + ((b * NH + h) * T + t) * T;
                double maxv = -INFINITY;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
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
                        acc += (double)a[t2] * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    o[i] = (float)acc;
                }
            }
        }
    }
}

/* With p = att row, dp[t2] = dout . v[t2]; dscore = p * (dp - sum_j p[j] dp[j]);
 * dq = scale * sum dscore k; dk[t2] += scale * dscore q; dv[t2] += p dout.
 * scratch holds dscore for each (b, h, t, t2). */
void kiln__ref_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *att, int64_t B, int64_t T, int64_t C, int64_t NH) {
    int64_t hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    memset(dqkv, 0, (size_t)(B * T * 3 * C) * sizeof(float));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            for (int64_t t = 0; t < T; t++) {
                const float *p = att + ((b * NH + h) * T + t) * T;
                float *ds = scratch + ((b * NH + h) * T + t) * T;
                const float *d = dout + (b * T + t) * C + h * hs;
                double pdp = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
                    float *dv = dqkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
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
                const float *q = qkv + (b * T + t) * 3 * C + h * hs;
                float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
                for (int64_t i = 0; i < hs; i++) {
                    double acc = 0.0;
                    for (int64_t t2 = 0; t2 <= t; t2++)
                        acc += (double)ds[t2] * qkv[(b * T + t2) * 3 * C + C + h * hs + i];
                    dq[i] = (float)(acc * scale);
                }
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    float *dk = dqkv + (b * T + t2) * 3 * C + C + h * hs;
                    for (int64_t i = 0; i < hs; i++)
                        dk[i] += (float)(scale * ds[t2] * q[i]);
                }
            }
        }
    }
}

/* gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
void kiln__ref_gelu_forward(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

/* d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2) */
void kiln__ref_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float th = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] = grad * dout[i];
    }
}

void kiln__ref_residual_forward(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* logits, dlogits (N,Vp); losses, targets (N). Each row is read completely before it is
 * written, so dlogits may alias logits. */
void kiln__ref_crossentropy_forward_backward(float *losses, float *dlogits, const float *logits,
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
