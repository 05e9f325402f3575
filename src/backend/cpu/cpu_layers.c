/* The CPU backend's non-GEMM layer kernels: embedding, layernorm, GELU, residual and the
 * fused softmax cross-entropy. Loops over rows are split statically over threads; sums
 * over rows (parameter gradients) are split over channels instead, each thread adding
 * the rows in order, so that no two threads add into the same value and the result does
 * not depend on the thread count. */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f
#define LN_EPS 1e-5f

/* out (B,T,C) = wte[inp[b,t]] + wpe[t] */
void kiln__cpu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                               int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < B * T; n++) {
        float *o = out + n * C;
        const float *we = wte + (int64_t)inp[n] * C;
        const float *pe = wpe + (n % T) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            o[c] = we[c] + pe[c];
    }
}

/* Threads own channel ranges: positions with the same token add into the same dwte row,
 * so splitting over positions would race. */
void kiln__cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                int64_t B, int64_t T, int64_t C) {
#pragma omp parallel
    {
        int64_t c0, c1;
        kiln__cpu_split(C, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int64_t n = 0; n < B * T; n++) {
            const float *d = dout + n * C;
            float *dwe = dwte + (int64_t)inp[n] * C;
            float *dpe = dwpe + (n % T) * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) {
                dwe[c] += d[c];
                dpe[c] += d[c];
            }
        }
    }
}

/* inp, out (N,C); mean, rstd (N). Two passes over each row (mean, then the variance of
 * the centred values) for accuracy; the row stays in L1/L2 between them. */
void kiln__cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; c++)
            sum += x[c];
        float m = sum / (float)C;
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int64_t c = 0; c < C; c++)
            var += (x[c] - m) * (x[c] - m);
        float s = 1.0f / sqrtf(var / (float)C + LN_EPS);
        float *o = out + n * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = weight * dout, by rows;
 * then dweight += sum_n xhat * dout and dbias += sum_n dout, by channel ranges. */
void kiln__cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int64_t N, int64_t C) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C, *d = dout + n * C;
            float m = mean[n], s = rstd[n];
            float gsum = 0.0f, gxsum = 0.0f;
#pragma omp simd reduction(+ : gsum, gxsum)
            for (int64_t c = 0; c < C; c++) {
                float g = weight[c] * d[c];
                gsum += g;
                gxsum += g * (x[c] - m) * s;
            }
            float gmean = gsum / (float)C, gxmean = gxsum / (float)C;
            float *dx = dinp + n * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                dx[c] += s * (weight[c] * d[c] - gmean - xhat * gxmean);
            }
        }
        int64_t c0, c1;
        kiln__cpu_split(C, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C, *d = dout + n * C;
            float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) {
                dweight[c] += (x[c] - m) * s * d[c];
                dbias[c] += d[c];
            }
        }
    }
}

/* gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
void kiln__cpu_gelu_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        out[i] = x * kiln__cpu_sigmoidf(2.0f * u);
    }
}

/* With s = sigmoid(2u): 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s), so
 * d gelu / dx = s + 2 x s (1 - s) du/dx. */
void kiln__cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float s = kiln__cpu_sigmoidf(2.0f * u);
        dinp[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

void kiln__cpu_residual_forward(float *out, const float *a, const float *b, int64_t n) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* One row of logits (Vp): returns -log p[y]. With d != NULL, d (which may be x itself)
 * receives (softmax - onehot(y)) * dloss, and 0 in the padding. The exponentials are
 * stored in d on the way and scaled afterwards, so each value is exponentiated once. */
static float crossentropy_row(float *d, const float *x, int32_t y, float dloss, int64_t V,
                              int64_t Vp) {
    float xy = x[y]; /* read before d overwrites it */
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int64_t i = 0; i < V; i++)
        maxv = x[i] > maxv ? x[i] : maxv;
    float sum = 0.0f;
    if (d) {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < V; i++) {
            float e = kiln__cpu_expf(x[i] - maxv);
            d[i] = e;
            sum += e;
        }
        float f = dloss / sum;
#pragma omp simd
        for (int64_t i = 0; i < V; i++)
            d[i] *= f;
        d[y] -= dloss;
        for (int64_t i = V; i < Vp; i++)
            d[i] = 0.0f;
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < V; i++)
            sum += kiln__cpu_expf(x[i] - maxv);
    }
    return logf(sum) + maxv - xy;
}

void kiln__cpu_crossentropy_forward_backward(float *losses, float *dlogits, const float *logits,
                                             const int32_t *targets, float dloss, int64_t N,
                                             int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        losses[n] = crossentropy_row(dlogits ? dlogits + n * Vp : NULL, logits + n * Vp, targets[n],
                                     dloss, V, Vp);
    }
}
