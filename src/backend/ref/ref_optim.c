/* Reference optimizer and utility kernels, and the reference backend's table. Each update
 * follows the formula in backend.h term by term, in float, one element at a time. */
#include <math.h>
#include <string.h>

#include "backend/ref/ref.h"
#include "kiln/backend.h"

void kiln__ref_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                           float b1, float b2, float bc1, float bc2, float eps, float decoupled_wd,
                           float l2_wd) {
    for (int64_t i = 0; i < n; i++) {
        float grad = g[i] + l2_wd * p[i];
        m[i] = b1 * m[i] + (1.0f - b1) * grad;
        v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
        float mhat = m[i] / bc1;
        float vhat = v[i] / bc2;
        float w = p[i] * (1.0f - lr * decoupled_wd);
        p[i] = w - lr * mhat / (sqrtf(vhat) + eps);
    }
}

void kiln__ref_sgd_update(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                          float dampening, int nesterov, float wd, int first) {
    for (int64_t i = 0; i < n; i++) {
        float grad = g[i] + wd * p[i];
        float step = grad;
        if (momentum != 0.0f) {
            buf[i] = first ? grad : momentum * buf[i] + (1.0f - dampening) * grad;
            step = nesterov ? grad + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * step;
    }
}

void kiln__ref_rmsprop_update(float *p, const float *g, float *sq, float *buf, int64_t n, float lr,
                              float alpha, float eps, float wd, float momentum) {
    for (int64_t i = 0; i < n; i++) {
        float grad = g[i] + wd * p[i];
        sq[i] = alpha * sq[i] + (1.0f - alpha) * grad * grad;
        float step = grad / (sqrtf(sq[i]) + eps);
        if (momentum > 0.0f) {
            buf[i] = momentum * buf[i] + step;
            step = buf[i];
        }
        p[i] -= lr * step;
    }
}

double kiln__ref_sumsq(const float *x, int64_t n) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++)
        acc += (double)x[i] * (double)x[i];
    return acc;
}

void kiln__ref_scale(float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

void kiln__ref_zero(float *x, int64_t n) {
    if (n > 0)
        memset(x, 0, (size_t)n * sizeof(float));
}

static const kiln_backend ref_backend = {.name = "ref", KILN_BACKEND_FILL(kiln__ref_)};

const kiln_backend *kiln_backend_ref(void) { return &ref_backend; }
