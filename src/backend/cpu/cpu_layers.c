/* The CPU backend's non-GEMM layer kernels: embedding, layernorm (and the residual add fused
 * with it), GELU, residual and the fused softmax cross-entropy. Loops over rows are split
 * statically over threads; sums over rows (parameter gradients) are split over channels
 * instead, each thread adding the rows in order, so that no two threads add into the same
 * value and the result does not depend on the thread count.
 *
 * Every kernel is written once, as a force-inlined body taking the dtype, and instantiated
 * for each dtype by a switch on a constant (KILN_CPU_DISPATCH): loads widen to fp32, arithmetic is
 * fp32, stores round once. */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"
#include "core/dtype_inline.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f
#define LN_EPS 1e-5f

KILN_INLINE float gelu(float x) {
    float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    return x * kiln__cpu_sigmoidf(2.0f * u);
}

/* The kernels of cpu_layers_t.h once per dtype: name_f32, name_bf16, name_f16. (A dtype
 * passed as an argument would not do: OpenMP outlines a parallel loop before the compiler
 * propagates constants, so the loop would switch on the dtype per element and never
 * vectorise.) */
#define DT KILN_DTYPE_F32
#define T(name) name##_f32
#include "backend/cpu/cpu_layers_t.h"
#undef DT
#undef T
#define DT KILN_DTYPE_BF16
#define T(name) name##_bf16
#include "backend/cpu/cpu_layers_t.h"
#undef DT
#undef T
#define DT KILN_DTYPE_F16
#define T(name) name##_f16
#include "backend/cpu/cpu_layers_t.h"
#undef DT
#undef T



/* out (B,T,C) = wte[inp[b,t]] + wpe[t] */
void kiln__cpu_encoder_forward(kiln_backend *be, kiln_dtype dt, void *out, const int32_t *inp,
                               const void *wte, const void *wpe, int64_t B, int64_t T,
                               int64_t C) {
    (void)be;
    KILN_CPU_DISPATCH(dt, encoder_forward, (out, inp, wte, wpe, B, T, C));
}

/* Threads own channel ranges: positions with the same token add into the same dwte row,
 * so splitting over positions would race. */
void kiln__cpu_encoder_backward(kiln_backend *be, kiln_dtype dt, float *dwte, float *dwpe,
                                const void *dout, const int32_t *inp, int64_t B, int64_t T,
                                int64_t C) {
    (void)be;
    KILN_CPU_DISPATCH(dt, encoder_backward, (dwte, dwpe, dout, inp, B, T, C));
}

/* One row: out = (x - mean) * rstd * weight + bias. Two passes over the row (mean, then the
 * variance of the centred values) for accuracy; the row stays in L1/L2 between them.
 * With res != NULL, x = a + b is formed (and stored, rounded, in res) on the first pass. */
void kiln__cpu_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *mean,
                                 float *rstd, const void *inp, const void *weight,
                                 const void *bias, int64_t N, int64_t C) {
    (void)be;
    KILN_CPU_DISPATCH(dt, layernorm_forward, (out, mean, rstd, NULL, inp, NULL, weight, bias, N, C));
}

void kiln__cpu_residual_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                          float *mean, float *rstd, const void *a, const void *b,
                                          const void *weight, const void *bias, int64_t N,
                                          int64_t C) {
    (void)be;
    KILN_CPU_DISPATCH(dt, layernorm_forward, (out, mean, rstd, res, a, b, weight, bias, N, C));
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = weight * dout, by rows;
 * then dweight += sum_n xhat * dout and dbias += sum_n dout, by channel ranges. */
void kiln__cpu_layernorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                  float *dbias, const void *dout, const void *inp,
                                  const void *weight, const float *mean, const float *rstd,
                                  int64_t N, int64_t C) {
    (void)be;
    KILN_CPU_DISPATCH(dt, layernorm_backward, (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                         C));
}

/* gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
void kiln__cpu_gelu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                            int64_t n) {
    (void)be;
    KILN_CPU_DISPATCH(dt, gelu_forward, (out, inp, n));
}


/* With s = sigmoid(2u): 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s), so
 * d gelu / dx = s + 2 x s (1 - s) du/dx. */
void kiln__cpu_gelu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                             const void *dout, int64_t n) {
    (void)be;
    KILN_CPU_DISPATCH(dt, gelu_backward, (dinp, inp, dout, n));
}

void kiln__cpu_residual_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *a,
                                const void *b, int64_t n) {
    (void)be;
    KILN_CPU_DISPATCH(dt, residual, (out, a, b, n));
}

/* One row of logits (Vp): returns -log p[y]. With d != NULL, d (which may be x itself)
 * receives (softmax - onehot(y)) * dloss, and 0 in the padding. For fp32 the exponentials
 * are stored in d on the way and scaled afterwards, so each value is exponentiated once; a
 * narrower d would round them, so they are computed again instead. */
void kiln__cpu_crossentropy_forward_backward(kiln_backend *be, kiln_dtype dt, float *losses,
                                             void *dlogits, const void *logits,
                                             const int32_t *targets, float dloss, int64_t N,
                                             int64_t V, int64_t Vp) {
    (void)be;
    KILN_CPU_DISPATCH(dt, crossentropy, (losses, dlogits, logits, targets, dloss, N, V, Vp));
}
