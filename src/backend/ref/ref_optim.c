/* Reference optimizer, reduction and slab kernels, and the reference backend's table. Each
 * update follows the formula in backend.h term by term, in float, one element at a time.
 * The gradient term g' = gscale g + wd p is one fused multiply-add on the rounded
 * gscale g, so a scale given here and one applied to g beforehand give the same bits. */
#include <math.h>
#include <string.h>

#include "backend/host.h"
#include "backend/ref/ref.h"
#include "core/dtype_inline.h"
#include "kiln/backend.h"

/* The working copy of element i, when the update has one. */
static void write_work(const kiln_work_out *w, int64_t i, float p) {
    if (!w || !w->p)
        return;
    if (w->dtype == KILN_DTYPE_BF16 && w->round_seed)
        ((uint16_t *)w->p)[i] =
            kiln_f32_to_bf16_stochastic(p, kiln__round_bits(w->round_seed, w->index0 + i));
    else
        kiln__st(w->p, i, p, w->dtype);
}

void kiln__ref_adam_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g, float gscale,
                           float *m, float *v, int64_t n, float lr, float b1, float b2, float bc1,
                           float bc2, float eps, float decoupled_wd, float l2_wd) {
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        float grad = fmaf(l2_wd, p[i], g[i] * gscale); /* fmaf: a rounding that is stated */
        m[i] = b1 * m[i] + (1.0f - b1) * grad;
        v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
        float mhat = m[i] / bc1;
        float vhat = v[i] / bc2;
        float x = p[i] * (1.0f - lr * decoupled_wd);
        p[i] = x - lr * mhat / (sqrtf(vhat) + eps);
        write_work(w, i, p[i]);
    }
}

void kiln__ref_sgd_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g, float gscale,
                          float *buf, int64_t n, float lr, float momentum, float dampening,
                          int nesterov, float wd, int first) {
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        float grad = fmaf(wd, p[i], g[i] * gscale);
        float step = grad;
        if (momentum != 0.0f) {
            buf[i] = first ? grad : momentum * buf[i] + (1.0f - dampening) * grad;
            step = nesterov ? grad + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * step;
        write_work(w, i, p[i]);
    }
}

void kiln__ref_rmsprop_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g, float gscale,
                              float *sq, float *buf, int64_t n, float lr, float alpha, float eps,
                              float wd, float momentum) {
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        float grad = fmaf(wd, p[i], g[i] * gscale);
        sq[i] = alpha * sq[i] + (1.0f - alpha) * grad * grad;
        float step = grad / (sqrtf(sq[i]) + eps);
        if (momentum > 0.0f) {
            buf[i] = momentum * buf[i] + step;
            step = buf[i];
        }
        p[i] -= lr * step;
        write_work(w, i, p[i]);
    }
}

double kiln__ref_sum(kiln_backend *be, const float *x, int64_t n) {
    (void)be;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++)
        acc += x[i];
    return acc;
}

double kiln__ref_sumsq(kiln_backend *be, kiln_dtype dt, const void *x, int64_t n) {
    (void)be;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = kiln__ld(x, i, dt);
        acc += v * v;
    }
    return acc;
}

void kiln__ref_scale(kiln_backend *be, float *x, float s, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

void kiln__ref_zero(kiln_backend *be, void *x, size_t bytes) {
    (void)be;
    if (bytes)
        memset(x, 0, bytes);
}

static kiln_backend ref_backend = {
    .name = "ref",
    KILN_BACKEND_FILL(kiln__ref_)
    .attention_decode = kiln__ref_attention_decode,
};

kiln_backend *kiln_backend_ref(void) { return &ref_backend; }
