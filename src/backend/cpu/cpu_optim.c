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
#include "core/dtype_inline.h"

/* Updates go in blocks of this many elements: after a block's update its fp32 values are
 * still in L1 when they are rounded into the working copy. */
#define WORK_BLOCK 2048

/* w->p[i0..i1) = p[i0..i1) in w's dtype (rounded to nearest even, or stochastically). */
static void write_work(const kiln_work_out *w, const float *p, int64_t i0, int64_t i1) {
    if (w->dtype == KILN_DTYPE_BF16 && w->round_seed) {
        uint16_t *d = w->p;
        for (int64_t i = i0; i < i1; i++) {
            uint32_t r = kiln__round_bits(w->round_seed, w->index0 + i);
            uint32_t u = kiln__bits(p[i]);
            d[i] = (u & 0x7fffffffu) >= 0x7f800000u ? kiln__to_bf16(p[i])
                                                     : (uint16_t)((u + r) >> 16);
        }
    } else if (w->dtype == KILN_DTYPE_BF16) {
        uint16_t *d = w->p;
#pragma omp simd
        for (int64_t i = i0; i < i1; i++)
            d[i] = kiln__to_bf16(p[i]);
    } else if (w->dtype == KILN_DTYPE_F16) {
        uint16_t *d = w->p;
#pragma omp simd
        for (int64_t i = i0; i < i1; i++)
            d[i] = kiln__to_f16(p[i]);
    } else {
        memcpy((float *)w->p + i0, p + i0, (size_t)(i1 - i0) * sizeof(float));
    }
}

/* Run range(b0, b1) over [i0, i1) in blocks, each followed by its working copy. */
#define IN_BLOCKS(w, params, i0, i1, range)                                                        \
    do {                                                                                           \
        if (!(w) || !(w)->p) { /* no working copy: one pass over the range */                     \
            int64_t blk0 = (i0), blk1 = (i1);                                                      \
            range;                                                                                 \
            break;                                                                                 \
        }                                                                                          \
        for (int64_t blk0 = (i0); blk0 < (i1); blk0 += WORK_BLOCK) {                               \
            int64_t blk1 = blk0 + WORK_BLOCK < (i1) ? blk0 + WORK_BLOCK : (i1);                    \
            range;                                                                                 \
            if ((w) && (w)->p)                                                                     \
                write_work((w), (params), blk0, blk1);                                             \
        }                                                                                          \
    } while (0)

/* The updates run on contiguous ranges [i0, i1) split statically over threads. */
#define FOR_MY_RANGE(n, i0, i1)                                                                    \
    int64_t i0, i1;                                                                                \
    kiln__cpu_split((n), omp_get_thread_num(), omp_get_num_threads(), &i0, &i1)

/* With the AVX-512 bodies below, the generic loops (the tails there, every element elsewhere)
 * must round exactly as they do: the same fused multiply-adds (FMA), so an element gets the
 * same bits wherever a range boundary falls. Where the CPU has FMA the generic loops use it
 * too, vectorised by the compiler (omp simd) with the same rounding per element; without it
 * plain arithmetic is it (fmaf would be a library call per element). */
#if defined(__AVX512F__) || defined(__FMA__)
#define FMA(a, b, c) fmaf((a), (b), (c))
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif

/* The updates that need a square root spell out their AVX-512 body (masked tails and the
 * bf16 store in one pass); the generic body does the rest with the same operations in the
 * same order, vectorised by the compiler as -fno-math-errno lets it (sqrtf inline). The
 * gradient is read as g * gscale, one multiply. */
static inline void adam_one(float *p, const float *g, float gs, float *m, float *v, int64_t i,
                            float lr, float b1, float b2, float bc1, float bc2, float eps,
                            float decay, float l2_wd) {
    float pi = p[i];
    float grad = FMA(l2_wd, pi, g[i] * gs);
    float mi = FMA(1.0f - b1, grad, b1 * m[i]);
    float vi = FMA((1.0f - b2) * grad, grad, b2 * v[i]);
    m[i] = mi;
    v[i] = vi;
    p[i] = FMA(pi, decay, -(lr * (mi / bc1) / (sqrtf(vi / bc2) + eps)));
}

#ifdef __AVX512F__
/* 16 floats rounded to bf16, to nearest even, NaN kept quiet (kiln__to_bf16's arithmetic). */
static inline __m256i bf16_round16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    __m512i absu = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(absu, _mm512_set1_epi32(0x7f800000));
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}
#endif

/* [i0, i1) of the update; with wb != NULL the new p is also stored rounded to bf16 in wb (the
 * working copy, in the same pass: no second read of p). */
static void adam_range(float *p, const float *g, float gs, float *m, float *v, int64_t i0,
                       int64_t i1, float lr, float b1, float b2, float bc1, float bc2, float eps,
                       float decay, float l2_wd, uint16_t *wb) {
    int64_t i = i0;
#ifdef __AVX512F__
    __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2);
    __m512 vc1 = _mm512_set1_ps(1.0f - b1), vc2 = _mm512_set1_ps(1.0f - b2);
    __m512 vbc1 = _mm512_set1_ps(bc1), vbc2 = _mm512_set1_ps(bc2), veps = _mm512_set1_ps(eps);
    __m512 vlr = _mm512_set1_ps(lr), vdecay = _mm512_set1_ps(decay);
    __m512 vl2 = _mm512_set1_ps(l2_wd), vgs = _mm512_set1_ps(gs);
    for (; i + 16 <= i1; i += 16) {
        __m512 pi = _mm512_loadu_ps(p + i);
        __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), vgs);
        __m512 grad = _mm512_fmadd_ps(vl2, pi, gi);
        __m512 mi = _mm512_fmadd_ps(vc1, grad, _mm512_mul_ps(vb1, _mm512_loadu_ps(m + i)));
        __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(vc2, grad), grad,
                                    _mm512_mul_ps(vb2, _mm512_loadu_ps(v + i)));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        __m512 den = _mm512_add_ps(_mm512_sqrt_ps(_mm512_div_ps(vi, vbc2)), veps);
        __m512 step = _mm512_div_ps(_mm512_mul_ps(vlr, _mm512_div_ps(mi, vbc1)), den);
        __m512 np = _mm512_fmsub_ps(pi, vdecay, step);
        _mm512_storeu_ps(p + i, np);
        if (wb)
            _mm256_storeu_si256((__m256i *)(wb + i), bf16_round16(np));
    }
#endif
#pragma omp simd
    for (int64_t j = i; j < i1; j++) {
        adam_one(p, g, gs, m, v, j, lr, b1, b2, bc1, bc2, eps, decay, l2_wd);
        if (wb)
            wb[j] = kiln__to_bf16(p[j]);
    }
}

/* The working copy is written in the update's own pass when it is bf16 rounded to nearest. */
static uint16_t *bf16_in_pass(const kiln_work_out *w) {
    return w && w->p && w->dtype == KILN_DTYPE_BF16 && !w->round_seed ? w->p : NULL;
}

void kiln__cpu_adam_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                           float gscale, float *m, float *v, int64_t n, float lr, float b1,
                           float b2, float bc1, float bc2, float eps, float decoupled_wd,
                           float l2_wd) {
    (void)be;
    float decay = 1.0f - lr * decoupled_wd;
    uint16_t *wb = bf16_in_pass(w);
#pragma omp parallel
    {
        FOR_MY_RANGE(n, i0, i1);
        if (wb)
            adam_range(p, g, gscale, m, v, i0, i1, lr, b1, b2, bc1, bc2, eps, decay, l2_wd, wb);
        else
            IN_BLOCKS(w, p, i0, i1,
                      adam_range(p, g, gscale, m, v, blk0, blk1, lr, b1, b2, bc1, bc2, eps, decay,
                                 l2_wd, NULL));
    }
}

/* buf = keep buf + take g'; p -= lr (own g' + ahead buf): the first step, dampening and
 * Nesterov are folded into the four coefficients so that the loop is branch-free. */
static void sgd_momentum_range(float *p, const float *g, float gs, float *buf, int64_t i0,
                               int64_t i1, float lr, float wd, float keep, float take, float own,
                               float ahead) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float grad = FMA(wd, p[i], g[i] * gs);
        float b = keep * buf[i] + take * grad;
        buf[i] = b;
        p[i] -= lr * (own * grad + ahead * b);
    }
}

static void sgd_plain_range(float *p, const float *g, float gs, int64_t i0, int64_t i1, float lr,
                            float wd) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++)
        p[i] -= lr * FMA(wd, p[i], g[i] * gs);
}

void kiln__cpu_sgd_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                          float gscale, float *buf, int64_t n, float lr, float momentum,
                          float dampening, int nesterov, float wd, int first) {
    (void)be;
    float keep = first ? 0.0f : momentum, take = first ? 1.0f : 1.0f - dampening;
    float own = nesterov ? 1.0f : 0.0f, ahead = nesterov ? momentum : 1.0f;
#pragma omp parallel
    {
        FOR_MY_RANGE(n, i0, i1);
        if (momentum == 0.0f)
            IN_BLOCKS(w, p, i0, i1, sgd_plain_range(p, g, gscale, blk0, blk1, lr, wd));
        else
            IN_BLOCKS(w, p, i0, i1,
                      sgd_momentum_range(p, g, gscale, buf, blk0, blk1, lr, wd, keep, take, own,
                                         ahead));
    }
}

/* One element; buf is neither read nor written when momentum == 0. */
static inline void rmsprop_one(float *p, const float *g, float gs, float *sq, float *buf,
                               int64_t i, float lr, float alpha, float eps, float wd,
                               float momentum) {
    float grad = FMA(wd, p[i], g[i] * gs);
    float s = FMA((1.0f - alpha) * grad, grad, alpha * sq[i]);
    sq[i] = s;
    float step = grad / (sqrtf(s) + eps);
    if (momentum > 0.0f) {
        buf[i] = FMA(momentum, buf[i], step);
        step = buf[i];
    }
    p[i] = FMA(-lr, step, p[i]);
}

static void rmsprop_range(float *p, const float *g, float gs, float *sq, float *buf, int64_t i0,
                          int64_t i1, float lr, float alpha, float eps, float wd, float momentum) {
    int64_t i = i0;
#ifdef __AVX512F__
    __m512 valpha = _mm512_set1_ps(alpha), vc = _mm512_set1_ps(1.0f - alpha);
    __m512 veps = _mm512_set1_ps(eps), vwd = _mm512_set1_ps(wd), vlr = _mm512_set1_ps(lr);
    __m512 vmom = _mm512_set1_ps(momentum), vgs = _mm512_set1_ps(gs);
    for (; i + 16 <= i1; i += 16) {
        __m512 pi = _mm512_loadu_ps(p + i);
        __m512 grad =
            _mm512_fmadd_ps(vwd, pi, _mm512_mul_ps(_mm512_loadu_ps(g + i), vgs));
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
#pragma omp simd
    for (int64_t j = i; j < i1; j++)
        rmsprop_one(p, g, gs, sq, buf, j, lr, alpha, eps, wd, momentum);
}

void kiln__cpu_rmsprop_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                              float gscale, float *sq, float *buf, int64_t n, float lr,
                              float alpha, float eps, float wd, float momentum) {
    (void)be;
#pragma omp parallel
    {
        FOR_MY_RANGE(n, i0, i1);
        IN_BLOCKS(w, p, i0, i1,
                  rmsprop_range(p, g, gscale, sq, buf, blk0, blk1, lr, alpha, eps, wd, momentum));
    }
}

/* A fixed number of parts, each summed in double in a fixed vector order, then the parts
 * summed in order: the result does not depend on the thread count. */
#define SUM_PARTS 64

KILN_INLINE double sumsq_part(const void *x, int64_t i0, int64_t i1, kiln_dtype dt) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; i++) {
        double v = kiln__ld(x, i, dt);
        s += v * v;
    }
    return s;
}

double kiln__cpu_sumsq(kiln_backend *be, kiln_dtype dt, const void *x, int64_t n) {
    (void)be;
    double part[SUM_PARTS];
#pragma omp parallel for schedule(static)
    for (int k = 0; k < SUM_PARTS; k++) {
        int64_t i0, i1;
        kiln__cpu_split(n, k, SUM_PARTS, &i0, &i1);
        part[k] = dt == KILN_DTYPE_F32    ? sumsq_part(x, i0, i1, KILN_DTYPE_F32)
                  : dt == KILN_DTYPE_BF16 ? sumsq_part(x, i0, i1, KILN_DTYPE_BF16)
                                          : sumsq_part(x, i0, i1, KILN_DTYPE_F16);
    }
    double total = 0.0;
    for (int k = 0; k < SUM_PARTS; k++)
        total += part[k];
    return total;
}

/* Small n (a batch's losses) in one thread, in order; the same parts as sumsq otherwise. */
double kiln__cpu_sum(kiln_backend *be, const float *x, int64_t n) {
    (void)be;
    double part[SUM_PARTS];
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int k = 0; k < SUM_PARTS; k++) {
        int64_t i0, i1;
        kiln__cpu_split(n, k, SUM_PARTS, &i0, &i1);
        double s = 0.0;
        for (int64_t i = i0; i < i1; i++)
            s += x[i];
        part[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < SUM_PARTS; k++)
        total += part[k];
    return total;
}

void kiln__cpu_scale(kiln_backend *be, float *x, float s, int64_t n) {
    (void)be;
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

void kiln__cpu_zero(kiln_backend *be, void *x, size_t bytes) {
    (void)be;
#pragma omp parallel
    {
        int64_t i0, i1;
        kiln__cpu_split((int64_t)bytes, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
        if (i1 > i0)
            memset((char *)x + i0, 0, (size_t)(i1 - i0));
    }
}
