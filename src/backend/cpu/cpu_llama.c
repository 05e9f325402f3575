/* The CPU backend's kernels of the Llama family: RMSNorm (and the residual add fused with it),
 * rotary position embeddings and SwiGLU. Loops over rows are split statically over threads,
 * RMSNorm's weight gradient over channels, so the result does not depend on the thread count.
 * Each kernel is written once in cpu_llama_t.h and instantiated per dtype (see cpu_layers.c). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"
#include "core/dtype_inline.h"
#include "kiln/core.h"

#define DT KILN_DTYPE_F32
#define T(name) name##_f32
#include "backend/cpu/cpu_llama_t.h"
#undef DT
#undef T
#define DT KILN_DTYPE_BF16
#define T(name) name##_bf16
#include "backend/cpu/cpu_llama_t.h"
#undef DT
#undef T
#define DT KILN_DTYPE_F16
#define T(name) name##_f16
#include "backend/cpu/cpu_llama_t.h"
#undef DT
#undef T


void kiln__cpu_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *rstd,
                               const void *inp, const void *weight, int64_t N, int64_t C,
                               float eps) {
    (void)be;
    KILN_CPU_DISPATCH(dt, rmsnorm_forward, (out, rstd, NULL, inp, NULL, weight, N, C, eps));
}

void kiln__cpu_residual_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                        float *rstd, const void *a, const void *b,
                                        const void *weight, int64_t N, int64_t C, float eps) {
    (void)be;
    KILN_CPU_DISPATCH(dt, rmsnorm_forward, (out, rstd, res, a, b, weight, N, C, eps));
}

void kiln__cpu_rmsnorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                const void *dout, const void *inp, const void *weight,
                                const float *rstd, int64_t N, int64_t C) {
    (void)be;
    KILN_CPU_DISPATCH(dt, rmsnorm_backward, (dinp, dweight, dout, inp, weight, rstd, N, C));
}

/* The cos and sin of positions 0..npos-1 for a head size and base, kept by the backend and
 * made again only when another head size or base, or more positions, are asked for: the
 * angles in fp32 as Hugging Face computes them, their cos and sin in double rounded once. */
static const float *rope_table(kiln_backend *be, int64_t npos, int64_t hs, float theta) {
    kiln__cpu_state_t *s = kiln__cpu_state(be);
    if (s->rope_tab && s->rope_hs == hs && s->rope_theta == theta && s->rope_pos >= npos)
        return s->rope_tab;
    int64_t half = hs / 2;
    float *tab = kiln_alloc((size_t)(npos * half * 2) * sizeof *tab);
    if (!tab) {
        kiln_backend_fail(be, KILN_ERR_NOMEM, "cpu rope: no memory for %lld positions' table",
                          (long long)npos);
        return NULL;
    }
    for (int64_t i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
        for (int64_t p = 0; p < npos; p++) {
            float angle = (float)p * inv_freq;
            tab[(p * half + i) * 2] = (float)cos((double)angle);
            tab[(p * half + i) * 2 + 1] = (float)sin((double)angle);
        }
    }
    kiln_free(s->rope_tab);
    s->rope_tab = tab;
    s->rope_pos = npos;
    s->rope_hs = hs;
    s->rope_theta = theta;
    return tab;
}

static void rope(kiln_backend *be, kiln_dtype dt, void *x, int64_t B, int64_t T, int64_t NH,
                 int64_t NKV, int64_t hs, int64_t pos0, float theta, float sign) {
    const float *tab = rope_table(be, pos0 + T, hs, theta);
    if (!tab)
        return;
    KILN_CPU_DISPATCH(dt, rope, (x, tab, B, T, NH, NKV, hs, pos0, sign));
}

void kiln__cpu_rope_forward(kiln_backend *be, kiln_dtype dt, void *qkv, int64_t B, int64_t T,
                            int64_t NH, int64_t NKV, int64_t hs, int64_t pos0, float theta) {
    rope(be, dt, qkv, B, T, NH, NKV, hs, pos0, theta, 1.0f);
}

void kiln__cpu_rope_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, int64_t B, int64_t T,
                             int64_t NH, int64_t NKV, int64_t hs, int64_t pos0, float theta) {
    rope(be, dt, dqkv, B, T, NH, NKV, hs, pos0, theta, -1.0f);
}

void kiln__cpu_swiglu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                              int64_t N, int64_t H) {
    (void)be;
    KILN_CPU_DISPATCH(dt, swiglu_forward, (out, inp, N, H));
}

/* d gate = dy up silu'(g), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g); d up = dy silu(g) */
void kiln__cpu_swiglu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                               const void *dout, int64_t N, int64_t H) {
    (void)be;
    KILN_CPU_DISPATCH(dt, swiglu_backward, (dinp, inp, dout, N, H));
}
