/* Causal self-attention, parallel over (batch, head). Each (b, h) is a few small sgemm
 * calls made from inside the OpenMP region, where the OpenMP build of OpenBLAS runs them
 * on the calling thread; different (b, h) write disjoint memory, so there are no races
 * and the result does not depend on the thread count.
 *
 * Rows of the T x T score matrix go in blocks of ATT_BLOCK queries: block [r0, r1) only
 * needs keys [0, r1), which skips most of the masked upper triangle for long sequences.
 *
 * Layouts: qkv (B,T,W), W = (NH + 2 NKV) hs: query head h at channels h*hs, key head j at
 * C + j*hs, value head j at C + NKV*hs + j*hs (row stride W); query head h reads key/value
 * head h / g, g = NH / NKV. out, dout (B,T,C), head h at channels h*hs (row stride C).
 * Backward runs over (batch, key/value head), the g query heads of a group one after another
 * into the group's key and value gradients, so no two threads write the same rows and the
 * sums' order is fixed.
 * saved: the fp32 probabilities (B,NH,T,T). scratch: per thread, a T x T block for the
 * scores' gradient and, for a narrower dtype, fp32 copies of the head's slices (q, k, v,
 * dout, the outputs), so the products run in fp32 from values rounded once. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"
#include "core/dtype_inline.h"

#define ATT_BLOCK 64

/* floats of one thread's scratch */
static int64_t thread_floats(kiln_dtype dt, int64_t T, int64_t hs) {
    return T * T + (dt == KILN_DTYPE_F32 ? 0 : 8 * T * hs);
}

size_t kiln__cpu_attention_saved_bytes(kiln_backend *be, kiln_dtype dt, int64_t B, int64_t T,
                                       int64_t C, int64_t NH, int64_t NKV) {
    (void)be, (void)dt, (void)C, (void)NKV;
    return (size_t)(B * NH * T * T) * sizeof(float);
}

size_t kiln__cpu_attention_scratch_bytes(kiln_backend *be, kiln_dtype dt, int64_t B, int64_t T,
                                         int64_t C, int64_t NH, int64_t NKV) {
    (void)B, (void)NKV;
    /* one block per thread that may run: the thread count when the model is planned (kiln
     * sets threads before it builds a model); the ops never run more threads than the
     * fewest any plan was made for */
    int threads = omp_get_max_threads();
    int *cap = &kiln__cpu_state(be)->attention_threads;
    if (*cap == 0 || threads < *cap)
        *cap = threads;
    return (size_t)(threads * thread_floats(dt, T, C / NH)) * sizeof(float);
}

/* Softmax of row[0..t] in place; row[t+1..T) = 0. */
static void causal_softmax_row(float *row, int64_t t, int64_t T) {
    float maxv = -INFINITY;
    for (int64_t j = 0; j <= t; j++)
        maxv = row[j] > maxv ? row[j] : maxv;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j <= t; j++) {
        float e = kiln__cpu_expf(row[j] - maxv);
        row[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j <= t; j++)
        row[j] *= inv;
    for (int64_t j = t + 1; j < T; j++)
        row[j] = 0.0f;
}

/* One head: q, k, v rows of stride ld; o rows of stride ldo; a (T,T) probabilities. */
static void head_forward(float *o, int64_t ldo, float *a, const float *q, const float *k,
                         const float *v, int64_t ld, int64_t T, int64_t hs, float scale) {
    for (int64_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int64_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        /* scores [r0,r1) x [0,r1) = scale * q k^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)r1, (int)hs,
                    scale, q + r0 * ld, (int)ld, k, (int)ld, 0.0f, a + r0 * T, (int)T);
        for (int64_t t = r0; t < r1; t++)
            causal_softmax_row(a + t * T, t, T);
        /* out rows [r0,r1) = att x v */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)hs, (int)r1,
                    1.0f, a + r0 * T, (int)T, v, (int)ld, 0.0f, o + r0 * ldo, (int)ldo);
    }
}

/* The (T,hs) slice of head h at channel offset `off` of rows of stride ld in src, widened
 * to a contiguous fp32 (T,hs); and back. Called inside the parallel regions, where the
 * dtype is not a constant the compiler sees (OpenMP outlines the region first): so each
 * branches once to a loop compiled for its type. */
KILN_INLINE void gather_t(float *dst, const void *src, int64_t off, int64_t ld, int64_t T,
                          int64_t hs, kiln_dtype dt) {
    for (int64_t t = 0; t < T; t++) {
#pragma omp simd
        for (int64_t i = 0; i < hs; i++)
            dst[t * hs + i] = kiln__ld(src, t * ld + off + i, dt);
    }
}

static void gather(float *dst, const void *src, int64_t off, int64_t ld, int64_t T, int64_t hs,
                   kiln_dtype dt) {
    if (dt == KILN_DTYPE_BF16)
        gather_t(dst, src, off, ld, T, hs, KILN_DTYPE_BF16);
    else
        gather_t(dst, src, off, ld, T, hs, KILN_DTYPE_F16);
}

KILN_INLINE void scatter_t(void *dst, int64_t off, int64_t ld, const float *src, int64_t T,
                           int64_t hs, kiln_dtype dt) {
    for (int64_t t = 0; t < T; t++) {
#pragma omp simd
        for (int64_t i = 0; i < hs; i++)
            kiln__st(dst, t * ld + off + i, src[t * hs + i], dt);
    }
}

static void scatter(void *dst, int64_t off, int64_t ld, const float *src, int64_t T, int64_t hs,
                    kiln_dtype dt) {
    if (dt == KILN_DTYPE_BF16)
        scatter_t(dst, off, ld, src, T, hs, KILN_DTYPE_BF16);
    else
        scatter_t(dst, off, ld, src, T, hs, KILN_DTYPE_F16);
}

/* The threads an op may use: those the scratch was planned for. */
static int op_threads(kiln_backend *be) {
    int cap = kiln__cpu_state(be)->attention_threads, n = omp_get_max_threads();
    return cap > 0 && cap < n ? cap : n;
}

KILN_INLINE void forward_body(void *out, float *att, float *scratch, const void *qkv, int64_t B,
                              int64_t T, int64_t C, int64_t NH, int64_t NKV, int threads,
                              kiln_dtype dt) {
    int64_t hs = C / NH, W = C + 2 * NKV * hs, g = NH / NKV;
    float scale = (float)(1.0 / sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            float *a = att + (b * NH + h) * T * T;
            int64_t ko = C + (h / g) * hs, vo = ko + NKV * hs; /* its key/value head */
            if (dt == KILN_DTYPE_F32) {
                const float *x = (const float *)qkv + b * T * W;
                head_forward((float *)out + b * T * C + h * hs, C, a, x + h * hs, x + ko, x + vo, W,
                             T, hs, scale);
            } else {
                float *w = scratch + omp_get_thread_num() * thread_floats(dt, T, hs) + T * T;
                float *q = w, *k = w + T * hs, *v = w + 2 * T * hs, *o = w + 3 * T * hs;
                const void *src = kiln__cat(qkv, b * T * W, dt);
                gather(q, src, h * hs, W, T, hs, dt);
                gather(k, src, ko, W, T, hs, dt);
                gather(v, src, vo, W, T, hs, dt);
                head_forward(o, hs, a, q, k, v, hs, T, hs, scale);
                scatter(kiln__at(out, b * T * C, dt), h * hs, C, o, T, hs, dt);
            }
        }
    }
}

void kiln__cpu_attention_forward(kiln_backend *be, kiln_dtype dt, void *out, void *saved,
                                 void *scratch, const void *qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t NH, int64_t NKV) {
    int n = op_threads(be);
    if (dt == KILN_DTYPE_F32)
        forward_body(out, saved, scratch, qkv, B, T, C, NH, NKV, n, KILN_DTYPE_F32);
    else if (dt == KILN_DTYPE_BF16)
        forward_body(out, saved, scratch, qkv, B, T, C, NH, NKV, n, KILN_DTYPE_BF16);
    else
        forward_body(out, saved, scratch, qkv, B, T, C, NH, NKV, n, KILN_DTYPE_F16);
}

/* ds[0..t] = scale * p * (dp - sum_j p[j] dp[j]) in place over dp; ds[t+1..r1) = 0. */
static void softmax_backward_row(float *ds, const float *p, int64_t t, int64_t r1, float scale) {
    float pdp = 0.0f;
#pragma omp simd reduction(+ : pdp)
    for (int64_t j = 0; j <= t; j++)
        pdp += p[j] * ds[j];
#pragma omp simd
    for (int64_t j = 0; j <= t; j++)
        ds[j] = scale * p[j] * (ds[j] - pdp);
    for (int64_t j = t + 1; j < r1; j++)
        ds[j] = 0.0f;
}

/* One head: q, k, v and dq, dk, dv rows of stride ld; dout rows of stride ldd; s a (T,T)
 * block of scratch; a the (T,T) probabilities. dk and dv are written, or with add added to
 * (the second and later query heads of a key/value head). */
static void head_backward(float *dq, float *dk, float *dv, float *s, const float *dout, int64_t ldd,
                          const float *q, const float *k, const float *v, int64_t ld,
                          const float *a, int64_t T, int64_t hs, float scale, int add) {
    int64_t nblocks = (T + ATT_BLOCK - 1) / ATT_BLOCK;
    for (int64_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int64_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        int m = (int)(r1 - r0);
        /* dp [r0,r1) x [0,r1) = dout v^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, (int)r1, (int)hs, 1.0f,
                    dout + r0 * ldd, (int)ldd, v, (int)ld, 0.0f, s + r0 * T, (int)T);
        for (int64_t t = r0; t < r1; t++)
            softmax_backward_row(s + t * T, a + t * T, t, r1, scale);
        /* dq rows [r0,r1) = ds k */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, (int)hs, (int)r1, 1.0f,
                    s + r0 * T, (int)T, k, (int)ld, 0.0f, dq + r0 * ld, (int)ld);
    }
    /* dk = ds^T q and dv = att^T dout, last block first: it covers every key row, so it
     * writes (beta = 0) and the earlier blocks add to their prefix (beta = 1). */
    for (int64_t bi = nblocks - 1; bi >= 0; bi--) {
        int64_t r0 = bi * ATT_BLOCK;
        int64_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        int m = (int)(r1 - r0);
        float beta = bi == nblocks - 1 && !add ? 0.0f : 1.0f;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hs, m, 1.0f, s + r0 * T,
                    (int)T, q + r0 * ld, (int)ld, beta, dk, (int)ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hs, m, 1.0f, a + r0 * T,
                    (int)T, dout + r0 * ldd, (int)ldd, beta, dv, (int)ld);
    }
}

KILN_INLINE void backward_body(void *dqkv, float *scratch, const void *dout, const void *qkv,
                               const float *att, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t NKV, int threads, kiln_dtype dt) {
    int64_t hs = C / NH, W = C + 2 * NKV * hs, g = NH / NKV;
    float scale = (float)(1.0 / sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t j = 0; j < NKV; j++) {
            float *s = scratch + omp_get_thread_num() * thread_floats(dt, T, hs);
            int64_t ko = C + j * hs, vo = ko + NKV * hs;
            if (dt == KILN_DTYPE_F32) {
                float *dx = (float *)dqkv + b * T * W;
                const float *x = (const float *)qkv + b * T * W;
                for (int64_t h = j * g; h < (j + 1) * g; h++)
                    head_backward(dx + h * hs, dx + ko, dx + vo, s,
                                  (const float *)dout + b * T * C + h * hs, C, x + h * hs, x + ko,
                                  x + vo, W, att + (b * NH + h) * T * T, T, hs, scale, h > j * g);
            } else {
                float *w = s + T * T;
                float *q = w, *k = w + T * hs, *v = w + 2 * T * hs, *d = w + 3 * T * hs;
                float *dq = w + 4 * T * hs, *dk = w + 5 * T * hs, *dv = w + 6 * T * hs;
                const void *src = kiln__cat(qkv, b * T * W, dt);
                void *dst = kiln__at(dqkv, b * T * W, dt);
                gather(k, src, ko, W, T, hs, dt);
                gather(v, src, vo, W, T, hs, dt);
                for (int64_t h = j * g; h < (j + 1) * g; h++) {
                    gather(q, src, h * hs, W, T, hs, dt);
                    gather(d, kiln__cat(dout, b * T * C, dt), h * hs, C, T, hs, dt);
                    head_backward(dq, dk, dv, s, d, hs, q, k, v, hs, att + (b * NH + h) * T * T, T,
                                  hs, scale, h > j * g);
                    scatter(dst, h * hs, W, dq, T, hs, dt);
                }
                scatter(dst, ko, W, dk, T, hs, dt);
                scatter(dst, vo, W, dv, T, hs, dt);
            }
        }
    }
}

void kiln__cpu_attention_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, void *scratch,
                                  const void *dout, const void *qkv, const void *saved, int64_t B,
                                  int64_t T, int64_t C, int64_t NH, int64_t NKV) {
    int n = op_threads(be);
    if (dt == KILN_DTYPE_F32)
        backward_body(dqkv, scratch, dout, qkv, saved, B, T, C, NH, NKV, n, KILN_DTYPE_F32);
    else if (dt == KILN_DTYPE_BF16)
        backward_body(dqkv, scratch, dout, qkv, saved, B, T, C, NH, NKV, n, KILN_DTYPE_BF16);
    else
        backward_body(dqkv, scratch, dout, qkv, saved, B, T, C, NH, NKV, n, KILN_DTYPE_F16);
}

/* Generation: each (sequence, head, query) on its own, the query's scores over its keys in a
 * per-thread row, all in fp32 from values widened once. */
KILN_INLINE void decode_body(void *out, const void *qkv, int64_t B, int64_t ldT, int64_t Tk,
                             int64_t T, int64_t C, int64_t NH, int64_t NKV, float *buf, int threads,
                             kiln_dtype dt) {
    int64_t hs = C / NH, W = C + 2 * NKV * hs, g = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3) schedule(static) num_threads(threads)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            for (int64_t t = 0; t < T; t++) {
                float *sc = buf + (int64_t)omp_get_thread_num() * (Tk + 2 * hs);
                float *qf = sc + Tk, *acc = qf + hs;
                int64_t p = Tk - T + t, seq = b * ldT * W; /* the query's position */
                int64_t ko = C + (h / g) * hs, vo = ko + NKV * hs;
                for (int64_t i = 0; i < hs; i++)
                    qf[i] = kiln__ld(qkv, seq + p * W + h * hs + i, dt) * scale;
                float maxv = -INFINITY;
                for (int64_t j = 0; j <= p; j++) {
                    int64_t k0 = seq + j * W + ko;
                    float d = 0.0f;
#pragma omp simd reduction(+ : d)
                    for (int64_t i = 0; i < hs; i++)
                        d += qf[i] * kiln__ld(qkv, k0 + i, dt);
                    sc[j] = d;
                    maxv = d > maxv ? d : maxv;
                }
                float sum = 0.0f;
                for (int64_t j = 0; j <= p; j++) {
                    sc[j] = kiln__cpu_expf(sc[j] - maxv);
                    sum += sc[j];
                }
                for (int64_t i = 0; i < hs; i++)
                    acc[i] = 0.0f;
                for (int64_t j = 0; j <= p; j++) {
                    int64_t v0 = seq + j * W + vo;
                    float w = sc[j];
#pragma omp simd
                    for (int64_t i = 0; i < hs; i++)
                        acc[i] += w * kiln__ld(qkv, v0 + i, dt);
                }
                float inv = 1.0f / sum;
                for (int64_t i = 0; i < hs; i++)
                    kiln__st(out, (b * T + t) * C + h * hs + i, acc[i] * inv, dt);
            }
        }
    }
}

void kiln__cpu_attention_decode(kiln_backend *be, kiln_dtype dt, void *out, const void *qkv,
                                int64_t B, int64_t ldT, int64_t Tk, int64_t T, int64_t C,
                                int64_t NH, int64_t NKV) {
    int n = omp_get_max_threads();
    float *buf = malloc((size_t)n * (size_t)(Tk + 2 * (C / NH)) * sizeof *buf);
    if (!buf) {
        kiln_backend_fail(be, KILN_ERR_NOMEM, "cpu attention_decode: no memory for %lld keys",
                          (long long)Tk);
        return;
    }
    if (dt == KILN_DTYPE_F32)
        decode_body(out, qkv, B, ldT, Tk, T, C, NH, NKV, buf, n, KILN_DTYPE_F32);
    else if (dt == KILN_DTYPE_BF16)
        decode_body(out, qkv, B, ldT, Tk, T, C, NH, NKV, buf, n, KILN_DTYPE_BF16);
    else
        decode_body(out, qkv, B, ldT, Tk, T, C, NH, NKV, buf, n, KILN_DTYPE_F16);
    free(buf);
}
