/* Causal self-attention, parallel over (batch, head). Each (b, h) is a few small sgemm
 * calls made from inside the OpenMP region, where the OpenMP build of OpenBLAS runs them
 * on the calling thread; different (b, h) write disjoint memory, so there are no races
 * and the result does not depend on the thread count.
 *
 * Rows of the T x T score matrix go in blocks of ATT_BLOCK queries: block [r0, r1) only
 * needs keys [0, r1), which skips most of the masked upper triangle for long sequences.
 *
 * Layouts: qkv (B,T,3C) with q, k, v of head h at channels h*hs of each third (row
 * stride 3C); out, dout (B,T,C), head h at channels h*hs (row stride C);
 * att, scratch (B,NH,T,T). */
#include <cblas.h>
#include <math.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"

#define ATT_BLOCK 64

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

static void head_forward(float *o, float *a, const float *q, int64_t T, int64_t C, int64_t hs,
                         float scale) {
    const float *k = q + C, *v = q + 2 * C;
    int ld = (int)(3 * C);
    for (int64_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int64_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        /* scores [r0,r1) x [0,r1) = scale * q k^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)r1, (int)hs,
                    scale, q + r0 * ld, ld, k, ld, 0.0f, a + r0 * T, (int)T);
        for (int64_t t = r0; t < r1; t++)
            causal_softmax_row(a + t * T, t, T);
        /* out rows [r0,r1) = att x v */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)hs, (int)r1,
                    1.0f, a + r0 * T, (int)T, v, ld, 0.0f, o + r0 * C, (int)C);
    }
}

void kiln__cpu_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T,
                                 int64_t C, int64_t NH) {
    int64_t hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            head_forward(out + b * T * C + h * hs, att + (b * NH + h) * T * T,
                         qkv + b * T * 3 * C + h * hs, T, C, hs, scale);
        }
    }
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

/* dq, dk, dv point at head h's channels of dqkv's three thirds (row stride 3C). */
static void head_backward(float *dq, float *s, const float *dout, const float *q, const float *a,
                          int64_t T, int64_t C, int64_t hs, float scale) {
    const float *k = q + C, *v = q + 2 * C;
    float *dk = dq + C, *dv = dq + 2 * C;
    int ld = (int)(3 * C);
    int64_t nblocks = (T + ATT_BLOCK - 1) / ATT_BLOCK;
    for (int64_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int64_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        int m = (int)(r1 - r0);
        /* dp [r0,r1) x [0,r1) = dout v^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, (int)r1, (int)hs, 1.0f,
                    dout + r0 * C, (int)C, v, ld, 0.0f, s + r0 * T, (int)T);
        for (int64_t t = r0; t < r1; t++)
            softmax_backward_row(s + t * T, a + t * T, t, r1, scale);
        /* dq rows [r0,r1) = ds k */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, (int)hs, (int)r1, 1.0f,
                    s + r0 * T, (int)T, k, ld, 0.0f, dq + r0 * ld, ld);
    }
    /* dk = ds^T q and dv = att^T dout, last block first: it covers every key row, so it
     * writes (beta = 0) and the earlier blocks add to their prefix (beta = 1). */
    for (int64_t bi = nblocks - 1; bi >= 0; bi--) {
        int64_t r0 = bi * ATT_BLOCK;
        int64_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        int m = (int)(r1 - r0);
        float beta = bi == nblocks - 1 ? 0.0f : 1.0f;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hs, m, 1.0f, s + r0 * T,
                    (int)T, q + r0 * ld, ld, beta, dk, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hs, m, 1.0f, a + r0 * T,
                    (int)T, dout + r0 * C, (int)C, beta, dv, ld);
    }
}

void kiln__cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *att, int64_t B, int64_t T, int64_t C, int64_t NH) {
    int64_t hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            int64_t bh = b * NH + h;
            head_backward(dqkv + b * T * 3 * C + h * hs, scratch + bh * T * T,
                          dout + b * T * C + h * hs, qkv + b * T * 3 * C + h * hs, att + bh * T * T,
                          T, C, hs, scale);
        }
    }
}
