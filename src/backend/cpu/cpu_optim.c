/* The CPU backend's optimizer and slab kernels: each is one fused pass over its arrays,
 * split statically over threads and vectorised (omp simd), since at these sizes they are
 * bound by memory bandwidth. Each update evaluates the reference's expression in the
 * same order, element by element. */
#include <math.h>
#include <omp.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"

/* The updates run on contiguous ranges [i0, i1) split statically over threads. */
#define FOR_MY_RANGE(n, i0, i1)                                                                    \
    int64_t i0, i1;                                                                                \
    kiln__cpu_split((n), omp_get_thread_num(), omp_get_num_threads(), &i0, &i1)

/* Without -fno-math-errno the compiler will not vectorise a loop holding sqrtf (it keeps
 * a branch to the library call for negative input), so the updates that need a square
 * root spell out their AVX-512 body; the scalar body does the rest with the same
 * operations in the same order. */
static inline void adam_one(float *p, const float *g, float *m, float *v, int64_t i, float lr,
                            float b1, float b2, float bc1, float bc2, float eps, float decay,
                            float l2_wd) {
    float pi = p[i];
    float grad = g[i] + l2_wd * pi;
    float mi = b1 * m[i] + (1.0f - b1) * grad;
    float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

static void adam_range(float *p, const float *g, float *m, float *v, int64_t i0, int64_t i1,
                       float lr, float b1, float b2, float bc1, float bc2, float eps, float decay,
                       float l2_wd) {
    int64_t i = i0;
#ifdef __AVX512F__
    __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2);
    __m512 vc1 = _mm512_set1_ps(1.0f - b1), vc2 = _mm512_set1_ps(1.0f - b2);
    __m512 vbc1 = _mm512_set1_ps(bc1), vbc2 = _mm512_set1_ps(bc2), veps = _mm512_set1_ps(eps);
    __m512 vlr = _mm512_set1_ps(lr), vdecay = _mm512_set1_ps(decay);
    __m512 vl2 = _mm512_set1_ps(l2_wd);
    for (; i + 16 <= i1; i += 16) {
        __m512 pi = _mm512_loadu_ps(p + i);
        __m512 grad = _mm512_fmadd_ps(vl2, pi, _mm512_loadu_ps(g + i));
        __m512 mi = _mm512_fmadd_ps(vc1, grad, _mm512_mul_ps(vb1, _mm512_loadu_ps(m + i)));
        __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(vc2, grad), grad,
                                    _mm512_mul_ps(vb2, _mm512_loadu_ps(v + i)));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        __m512 den = _mm512_add_ps(_mm512_sqrt_ps(_mm512_div_ps(vi, vbc2)), veps);
        __m512 step = _mm512_div_ps(_mm512_mul_ps(vlr, _mm512_div_ps(mi, vbc1)), den);
        _mm512_storeu_ps(p + i, _mm512_fmsub_ps(pi, vdecay, step));
    }
#endif
    for (; i < i1; i++)
        adam_one(p, g, m, v, i, lr, b1, b2, bc1, bc2, eps, decay, l2_wd);
}

void kiln__cpu_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                           float b1, float b2, float bc1, float bc2, float eps, float decoupled_wd,
                           float l2_wd) {
    float decay = 1.0f - lr * decoupled_wd;
#pragma omp parallel
    {
        FOR_MY_RANGE(n, i0, i1);
        adam_range(p, g, m, v, i0, i1, lr, b1, b2, bc1, bc2, eps, decay, l2_wd);
    }
}

/* buf = keep buf + take g'; p -= lr (own g' + ahead buf): the first step, dampening and
 * Nesterov are folded into the four coefficients so that the loop is branch-free. */
static void sgd_momentum_range(float *p, const float *g, float *buf, int64_t i0, int64_t i1,
                               float lr, float wd, float keep, float take, float own, float ahead) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float grad = g[i] + wd * p[i];
        float b = keep * buf[i] + take * grad;
        buf[i] = b;
        p[i] -= lr * (own * grad + ahead * b);
    }
}

void kiln__cpu_sgd_update(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                          float dampening, int nesterov, float wd, int first) {
    if (momentum == 0.0f) {
#pragma omp parallel for simd schedule(simd : static)
        for (int64_t i = 0; i < n; i++)
            p[i] -= lr * (g[i] + wd * p[i]);
        return;
    }
    float keep = first ? 0.0f : momentum, take = first ? 1.0f : 1.0f - dampening;
    float own = nesterov ? 1.0f : 0.0f, ahead = nesterov ? momentum : 1.0f;
#pragma omp parallel
    {
        FOR_MY_RANGE(n, i0, i1);
        sgd_momentum_range(p, g, buf, i0, i1, lr, wd, keep, take, own, ahead);
    }
}

/* One element; buf is neither read nor written when momentum == 0. */
static inline void rmsprop_one(float *p, const float *g, float *sq, float *buf, int64_t i, float lr,
                               float alpha, float eps, float wd, float momentum) {
    float grad = g[i] + wd * p[i];
    float s = alpha * sq[i] + (1.0f - alpha) * grad * grad;
    sq[i] = s;
    float step = grad / (sqrtf(s) + eps);
    if (momentum > 0.0f) {
        buf[i] = momentum * buf[i] + step;
        step = buf[i];
    }
    p[i] -= lr * step;
}

static void rmsprop_range(float *p, const float *g, float *sq, float *buf, int64_t i0, int64_t i1,
                          float lr, float alpha, float eps, float wd, float momentum) {
    int64_t i = i0;
#ifdef __AVX512F__
    __m512 valpha = _mm512_set1_ps(alpha), vc = _mm512_set1_ps(1.0f - alpha);
    __m512 veps = _mm512_set1_ps(eps), vwd = _mm512_set1_ps(wd), vlr = _mm512_set1_ps(lr);
    __m512 vmom = _mm512_set1_ps(momentum);
    for (; i + 16 <= i1; i += 16) {
        __m512 pi = _mm512_loadu_ps(p + i);
        __m512 grad = _mm512_fmadd_ps(vwd, pi, _mm512_loadu_ps(g + i));
        __m512 s = _mm512_fmadd_ps(_mm512_mul_ps(vc, grad), grad,
                                   _mm512_mul_ps(valpha, _mm512_loadu_ps(sq + i)));
        _mm512_storeu_ps(sq + i, s);
        __m512 step = _mm512_div_ps(grad, _mm512_add_ps(_mm512_sqrt_ps(s), veps));
        if (momentum > 0.0f) {
            step = _mm512_fmadd_ps(vmom, _mm512_loadu_ps(buf + i), step);
            _mm512_storeu_ps(buf + i, step);
        }
        _mm512_storeu_ps(p + i, _mm512_fnmadd_ps(vlr, step, pi));
    }
#endif
    for (; i < i1; i++)
        rmsprop_one(p, g, sq, buf, i, lr, alpha, eps, wd, momentum);
}

void kiln__cpu_rmsprop_update(float *p, const float *g, float *sq, float *buf, int64_t n, float lr,
                              float alpha, float eps, float wd, float momentum) {
#pragma omp parallel
    {
        FOR_MY_RANGE(n, i0, i1);
        rmsprop_range(p, g, sq, buf, i0, i1, lr, alpha, eps, wd, momentum);
    }
}

/* A fixed number of parts, each summed in double in a fixed vector order, then the parts
 * summed in order: the result does not depend on the thread count. */
#define SUMSQ_PARTS 64

double kiln__cpu_sumsq(const float *x, int64_t n) {
    double part[SUMSQ_PARTS];
#pragma omp parallel for schedule(static)
    for (int k = 0; k < SUMSQ_PARTS; k++) {
        int64_t i0, i1;
        kiln__cpu_split(n, k, SUMSQ_PARTS, &i0, &i1);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = i0; i < i1; i++)
            s += (double)x[i] * (double)x[i];
        part[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < SUMSQ_PARTS; k++)
        total += part[k];
    return total;
}

void kiln__cpu_scale(float *x, float s, int64_t n) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

void kiln__cpu_zero(float *x, int64_t n) {
#pragma omp parallel
    {
        int64_t i0, i1;
        kiln__cpu_split(n, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
        if (i1 > i0)
            memset(x + i0, 0, (size_t)(i1 - i0) * sizeof(float));
    }
}
