/* The CPU backend's non-GEMM layer kernels: embedding, layernorm (and the residual add fused
 * with it), GELU, residual and the fused softmax cross-entropy. Loops over rows are split
 * statically over threads; sums over rows (parameter gradients) are split over channels
 * instead, each thread adding the rows in order, so that no two threads add into the same
 * value and the result does not depend on the thread count.
 *
 * Every kernel is written once, as a force-inlined body taking the dtype, and instantiated
 * for each dtype by a switch on a constant (DISPATCH): loads widen to fp32, arithmetic is
 * fp32, stores round once. */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"
#include "core/dtype_inline.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f
#define LN_EPS 1e-5f

/* Call body(..., dt) with dt a compile-time constant, so each dtype gets its own loops. */
#define DISPATCH(dt, call)                                                                         \
    switch (dt) {                                                                                  \
    case KILN_DTYPE_BF16: {                                                                        \
        const kiln_dtype D_ = KILN_DTYPE_BF16;                                                     \
        call;                                                                                      \
    } break;                                                                                       \
    case KILN_DTYPE_F16: {                                                                         \
        const kiln_dtype D_ = KILN_DTYPE_F16;                                                      \
        call;                                                                                      \
    } break;                                                                                       \
    default: {                                                                                     \
        const kiln_dtype D_ = KILN_DTYPE_F32;                                                      \
        call;                                                                                      \
    } break;                                                                                       \
    }

/* out (B,T,C) = wte[inp[b,t]] + wpe[t] */
KILN_INLINE void encoder_forward_body(void *out, const int32_t *inp, const void *wte,
                                      const void *wpe, int64_t B, int64_t T, int64_t C,
                                      kiln_dtype dt) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < B * T; n++) {
        int64_t o = n * C, e = (int64_t)inp[n] * C, p = (n % T) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            kiln__st(out, o + c, kiln__ld(wte, e + c, dt) + kiln__ld(wpe, p + c, dt), dt);
    }
}

void kiln__cpu_encoder_forward(kiln_backend *be, kiln_dtype dt, void *out, const int32_t *inp,
                               const void *wte, const void *wpe, int64_t B, int64_t T,
                               int64_t C) {
    (void)be;
    DISPATCH(dt, encoder_forward_body(out, inp, wte, wpe, B, T, C, D_));
}

/* Threads own channel ranges: positions with the same token add into the same dwte row,
 * so splitting over positions would race. */
KILN_INLINE void encoder_backward_body(float *dwte, float *dwpe, const void *dout,
                                       const int32_t *inp, int64_t B, int64_t T, int64_t C,
                                       kiln_dtype dt) {
#pragma omp parallel
    {
        int64_t c0, c1;
        kiln__cpu_split(C, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int64_t n = 0; n < B * T; n++) {
            float *dwe = dwte + (int64_t)inp[n] * C;
            float *dpe = dwpe + (n % T) * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) {
                float d = kiln__ld(dout, n * C + c, dt);
                dwe[c] += d;
                dpe[c] += d;
            }
        }
    }
}

void kiln__cpu_encoder_backward(kiln_backend *be, kiln_dtype dt, float *dwte, float *dwpe,
                                const void *dout, const int32_t *inp, int64_t B, int64_t T,
                                int64_t C) {
    (void)be;
    DISPATCH(dt, encoder_backward_body(dwte, dwpe, dout, inp, B, T, C, D_));
}

/* One row: out = (x - mean) * rstd * weight + bias. Two passes over the row (mean, then the
 * variance of the centred values) for accuracy; the row stays in L1/L2 between them.
 * With res != NULL, x = a + b is formed (and stored, rounded, in res) on the first pass. */
KILN_INLINE void layernorm_row(void *out, float *mean, float *rstd, void *res, const void *a,
                               const void *b, const void *weight, const void *bias, int64_t n,
                               int64_t C, kiln_dtype dt) {
    int64_t r = n * C;
    const void *x = a;
    float sum = 0.0f;
    if (res) {
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; c++) {
            kiln__st(res, r + c, kiln__ld(a, r + c, dt) + kiln__ld(b, r + c, dt), dt);
            sum += kiln__ld(res, r + c, dt);
        }
        x = res;
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; c++)
            sum += kiln__ld(x, r + c, dt);
    }
    float m = sum / (float)C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; c++) {
        float d = kiln__ld(x, r + c, dt) - m;
        var += d * d;
    }
    float s = 1.0f / sqrtf(var / (float)C + LN_EPS);
#pragma omp simd
    for (int64_t c = 0; c < C; c++)
        kiln__st(out, r + c,
                 (kiln__ld(x, r + c, dt) - m) * s * kiln__ld(weight, c, dt) + kiln__ld(bias, c, dt),
                 dt);
    mean[n] = m;
    rstd[n] = s;
}

KILN_INLINE void layernorm_forward_body(void *out, float *mean, float *rstd, void *res,
                                        const void *a, const void *b, const void *weight,
                                        const void *bias, int64_t N, int64_t C, kiln_dtype dt) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        layernorm_row(out, mean, rstd, res, a, b, weight, bias, n, C, dt);
}

void kiln__cpu_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *mean,
                                 float *rstd, const void *inp, const void *weight,
                                 const void *bias, int64_t N, int64_t C) {
    (void)be;
    DISPATCH(dt, layernorm_forward_body(out, mean, rstd, NULL, inp, NULL, weight, bias, N, C, D_));
}

void kiln__cpu_residual_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                          float *mean, float *rstd, const void *a, const void *b,
                                          const void *weight, const void *bias, int64_t N,
                                          int64_t C) {
    (void)be;
    DISPATCH(dt, layernorm_forward_body(out, mean, rstd, res, a, b, weight, bias, N, C, D_));
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = weight * dout, by rows;
 * then dweight += sum_n xhat * dout and dbias += sum_n dout, by channel ranges. */
KILN_INLINE void layernorm_backward_body(void *dinp, float *dweight, float *dbias,
                                         const void *dout, const void *inp, const void *weight,
                                         const float *mean, const float *rstd, int64_t N,
                                         int64_t C, kiln_dtype dt) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            int64_t r = n * C;
            float m = mean[n], s = rstd[n];
            float gsum = 0.0f, gxsum = 0.0f;
#pragma omp simd reduction(+ : gsum, gxsum)
            for (int64_t c = 0; c < C; c++) {
                float g = kiln__ld(weight, c, dt) * kiln__ld(dout, r + c, dt);
                gsum += g;
                gxsum += g * (kiln__ld(inp, r + c, dt) - m) * s;
            }
            float gmean = gsum / (float)C, gxmean = gxsum / (float)C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) {
                float xhat = (kiln__ld(inp, r + c, dt) - m) * s;
                float g = kiln__ld(weight, c, dt) * kiln__ld(dout, r + c, dt);
                kiln__st(dinp, r + c, kiln__ld(dinp, r + c, dt) + s * (g - gmean - xhat * gxmean),
                         dt);
            }
        }
        int64_t c0, c1;
        kiln__cpu_split(C, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int64_t n = 0; n < N; n++) {
            int64_t r = n * C;
            float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) {
                float d = kiln__ld(dout, r + c, dt);
                dweight[c] += (kiln__ld(inp, r + c, dt) - m) * s * d;
                dbias[c] += d;
            }
        }
    }
}

void kiln__cpu_layernorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                  float *dbias, const void *dout, const void *inp,
                                  const void *weight, const float *mean, const float *rstd,
                                  int64_t N, int64_t C) {
    (void)be;
    DISPATCH(dt, layernorm_backward_body(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                         C, D_));
}

/* gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
KILN_INLINE float gelu(float x) {
    float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    return x * kiln__cpu_sigmoidf(2.0f * u);
}

KILN_INLINE void gelu_forward_body(void *out, const void *inp, int64_t n, kiln_dtype dt) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++)
        kiln__st(out, i, gelu(kiln__ld(inp, i, dt)), dt);
}

void kiln__cpu_gelu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                            int64_t n) {
    (void)be;
    DISPATCH(dt, gelu_forward_body(out, inp, n, D_));
}

KILN_INLINE void bias_gelu_body(void *x, void *gelu_out, const void *bias, int64_t N, int64_t OC,
                                kiln_dtype dt) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        int64_t r = n * OC;
#pragma omp simd
        for (int64_t j = 0; j < OC; j++) {
            float v = kiln__ld(x, r + j, dt) + (bias ? kiln__ld(bias, j, dt) : 0.0f);
            if (bias)
                kiln__st(x, r + j, v, dt);
            if (gelu_out) /* GELU of the stored (rounded) pre-activation */
                kiln__st(gelu_out, r + j, gelu(kiln__ld(x, r + j, dt)), dt);
        }
    }
}

void kiln__cpu_bias_gelu_rows(void *x, void *gelu_out, const void *bias, int64_t N, int64_t OC,
                              kiln_dtype dt) {
    DISPATCH(dt, bias_gelu_body(x, gelu_out, bias, N, OC, D_));
}

/* With s = sigmoid(2u): 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s), so
 * d gelu / dx = s + 2 x s (1 - s) du/dx. */
KILN_INLINE void gelu_backward_body(void *dinp, const void *inp, const void *dout, int64_t n,
                                    kiln_dtype dt) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++) {
        float x = kiln__ld(inp, i, dt);
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float s = kiln__cpu_sigmoidf(2.0f * u);
        kiln__st(dinp, i, (s + 2.0f * x * s * (1.0f - s) * du) * kiln__ld(dout, i, dt), dt);
    }
}

void kiln__cpu_gelu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                             const void *dout, int64_t n) {
    (void)be;
    DISPATCH(dt, gelu_backward_body(dinp, inp, dout, n, D_));
}

KILN_INLINE void residual_body(void *out, const void *a, const void *b, int64_t n,
                               kiln_dtype dt) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++)
        kiln__st(out, i, kiln__ld(a, i, dt) + kiln__ld(b, i, dt), dt);
}

void kiln__cpu_residual_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *a,
                                const void *b, int64_t n) {
    (void)be;
    DISPATCH(dt, residual_body(out, a, b, n, D_));
}

/* One row of logits (Vp): returns -log p[y]. With d != NULL, d (which may be x itself)
 * receives (softmax - onehot(y)) * dloss, and 0 in the padding. For fp32 the exponentials
 * are stored in d on the way and scaled afterwards, so each value is exponentiated once; a
 * narrower d would round them, so they are computed again instead. */
KILN_INLINE float crossentropy_row(void *d, const void *x, int64_t r, int32_t y, float dloss,
                                   int64_t V, int64_t Vp, kiln_dtype dt) {
    float xy = kiln__ld(x, r + y, dt); /* read before d overwrites it */
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int64_t i = 0; i < V; i++) {
        float v = kiln__ld(x, r + i, dt);
        maxv = v > maxv ? v : maxv;
    }
    float sum = 0.0f;
    if (d && dt == KILN_DTYPE_F32) {
        float *df = (float *)d + r;
        const float *xf = (const float *)x + r;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < V; i++) {
            float e = kiln__cpu_expf(xf[i] - maxv);
            df[i] = e;
            sum += e;
        }
        float f = dloss / sum;
#pragma omp simd
        for (int64_t i = 0; i < V; i++)
            df[i] *= f;
        df[y] -= dloss;
        for (int64_t i = V; i < Vp; i++)
            df[i] = 0.0f;
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < V; i++)
            sum += kiln__cpu_expf(kiln__ld(x, r + i, dt) - maxv);
        if (d) {
            float f = dloss / sum;
#pragma omp simd
            for (int64_t i = 0; i < V; i++) {
                float p = kiln__cpu_expf(kiln__ld(x, r + i, dt) - maxv) * f;
                kiln__st(d, r + i, i == y ? p - dloss : p, dt);
            }
            for (int64_t i = V; i < Vp; i++)
                kiln__st(d, r + i, 0.0f, dt);
        }
    }
    return logf(sum) + maxv - xy;
}

KILN_INLINE void crossentropy_body(float *losses, void *dlogits, const void *logits,
                                   const int32_t *targets, float dloss, int64_t N, int64_t V,
                                   int64_t Vp, kiln_dtype dt) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        losses[n] = crossentropy_row(dlogits, logits, n * Vp, targets[n], dloss, V, Vp, dt);
}

void kiln__cpu_crossentropy_forward_backward(kiln_backend *be, kiln_dtype dt, float *losses,
                                             void *dlogits, const void *logits,
                                             const int32_t *targets, float dloss, int64_t N,
                                             int64_t V, int64_t Vp) {
    (void)be;
    DISPATCH(dt, crossentropy_body(losses, dlogits, logits, targets, dloss, N, V, Vp, D_));
}
