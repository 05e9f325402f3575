/* Matrix products through OpenBLAS's sgemm, called from serial code so that it threads
 * itself over the shared OpenMP pool. Row-major throughout:
 *   inp (N,C), out/dout (N,OC), W (C,OC) when trans_w == 0 and (OC,C) when trans_w == 1. */
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"

void kiln__cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                              int64_t N, int64_t C, int64_t OC, int trans_w) {
    float beta = 0.0f;
    if (bias) {
        /* start from the bias and let sgemm add the product (beta = 1) */
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            float *o = out + n * OC;
#pragma omp simd
            for (int64_t j = 0; j < OC; j++)
                o[j] = bias[j];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_w ? CblasTrans : CblasNoTrans, (int)N, (int)OC,
                (int)C, 1.0f, inp, (int)C, weight, trans_w ? (int)C : (int)OC, beta, out, (int)OC);
}

/* dbias (OC) += column sums of dout (N,OC). Each thread owns a range of columns and adds
 * the rows in order, so the sums do not depend on the thread count. */
static void bias_backward(float *dbias, const float *dout, int64_t N, int64_t OC) {
#pragma omp parallel
    {
        int64_t j0, j1;
        kiln__cpu_split(OC, omp_get_thread_num(), omp_get_num_threads(), &j0, &j1);
        for (int64_t n = 0; n < N; n++) {
            const float *d = dout + n * OC;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++)
                dbias[j] += d[j];
        }
    }
}

void kiln__cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int64_t N, int64_t C,
                               int64_t OC, int trans_w) {
    if (dinp) {
        /* dinp (N,C) = dout (N,OC) x W^T, W^T being (OC,C) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_w ? CblasNoTrans : CblasTrans, (int)N,
                    (int)C, (int)OC, 1.0f, dout, (int)OC, weight, trans_w ? (int)C : (int)OC, 0.0f,
                    dinp, (int)C);
    }
    if (trans_w) {
        /* dW (OC,C) += dout^T x inp */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, dout,
                    (int)OC, inp, (int)C, 1.0f, dweight, (int)C);
    } else {
        /* dW (C,OC) += inp^T x dout */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)C, (int)OC, (int)N, 1.0f, inp,
                    (int)C, dout, (int)OC, 1.0f, dweight, (int)OC);
    }
    if (dbias)
        bias_backward(dbias, dout, N, OC);
}
