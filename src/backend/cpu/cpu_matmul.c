/* Matrix products. fp32 through kiln__cpu_sgemm (oneDNN's sgemm, or OpenBLAS's for products
 * of few rows: gemm.h), called from serial code so that it threads itself over the shared OpenMP
 * pool. bf16 through kiln__cpu_gemm (gemm.h): bf16
 * products summed in fp32, with the bias and GELU fused into its output pass (kiln's own
 * AVX512-BF16 kernel, or sgemm on widened operands on a CPU without it). fp16 through
 * `product`, which widens the operands to fp32 in the backend's scratch and multiplies them:
 * this CPU has no fp16 dot product. Row-major throughout:
 *   inp (N,C), out/dout (N,OC), W (C,OC) when trans_w == 0 and (OC,C) when trans_w == 1. */
#include <omp.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/gemm.h"
#include "core/dtype_inline.h"
#include "kiln/status.h"

/* kiln__cpu_gemm, with a failure recorded in the backend. */
static void gemm(kiln_backend *be, void *c, kiln_dtype c_dt, int64_t ldc, const void *a,
                 int64_t lda, int ta, const void *b, int64_t ldb, int tb, int64_t M, int64_t N,
                 int64_t K, float beta, const kiln__gemm_epilogue *ep) {
    if (be->error != KILN_OK)
        return;
    kiln_status s = kiln__cpu_gemm(c, c_dt, ldc, a, KILN_DTYPE_BF16, lda, ta, b, KILN_DTYPE_BF16,
                                   ldb, tb, M, N, K, 1.0f, beta, ep);
    if (s != KILN_OK)
        kiln_backend_fail(be, s, "%s", kiln_error_message());
}

/* The bias (OC, bf16) widened for the product's epilogue, in the backend's scratch. */
static const float *bias_f32(kiln_backend *be, const void *bias, int64_t OC) {
    if (!bias)
        return NULL;
    float *b = kiln__cpu_scratch(be, (size_t)OC * sizeof(float));
    if (b)
        kiln_convert(b, KILN_DTYPE_F32, bias, KILN_DTYPE_BF16, OC);
    return b;
}

/* C (M,N, fp32, ldc) = A (M,K) x B (K,N) + beta C, with A and B of dtype dt given as
 * op(A) = A or A^T (ta) and op(B) likewise (tb), row-major with leading dimensions lda,
 * ldb. */
static void product(kiln_backend *be, kiln_dtype dt, int ta, int tb, int64_t M, int64_t N,
                    int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                    float *Cm, int64_t ldc) {
    const float *a = A, *b = B;
    if (dt != KILN_DTYPE_F32) {
        int64_t na = ta ? K * lda : M * lda, nb = tb ? N * ldb : K * ldb;
        float *s = kiln__cpu_scratch(be, (size_t)(na + nb) * sizeof(float));
        if (!s)
            return;
        kiln_convert(s, KILN_DTYPE_F32, A, dt, na);
        kiln_convert(s + na, KILN_DTYPE_F32, B, dt, nb);
        a = s;
        b = s + na;
    }
    kiln__cpu_sgemm(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, Cm, ldc);
}

/* out (N,OC) = bias, row by row */
static void fill_bias(float *out, const float *bias, int64_t N, int64_t OC) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *o = out + n * OC;
#pragma omp simd
        for (int64_t j = 0; j < OC; j++)
            o[j] = bias[j];
    }
}

/* acc (N,OC, fp32) += bias (OC, of dt) */
KILN_INLINE void add_bias_body(float *acc, const void *bias, int64_t N, int64_t OC, kiln_dtype dt) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
#pragma omp simd
        for (int64_t j = 0; j < OC; j++)
            acc[n * OC + j] += kiln__ld(bias, j, dt);
    }
}

static void add_bias_f32(float *acc, const void *bias, int64_t N, int64_t OC, kiln_dtype dt) {
    (void)dt; /* only fp16 comes here */
    add_bias_body(acc, bias, N, OC, KILN_DTYPE_F16);
}

void kiln__cpu_matmul_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                              const void *weight, const void *bias, int64_t N, int64_t C,
                              int64_t OC, int trans_w, void *gelu_out) {
    int64_t ldw = trans_w ? C : OC;
    if (dt == KILN_DTYPE_F32) {
        float beta = 0.0f;
        if (bias) { /* start from the bias and let sgemm add the product (beta = 1) */
            fill_bias(out, bias, N, OC);
            beta = 1.0f;
        }
        product(be, dt, 0, trans_w, N, OC, C, inp, C, weight, ldw, beta, out, OC);
        if (gelu_out) /* sgemm added the bias: GELU's pass is all that is left */
            kiln__cpu_gelu_forward(be, dt, gelu_out, out, N * OC);
        return;
    }
    if (dt == KILN_DTYPE_BF16) {
        /* bias and GELU in the product's output pass: out keeps the pre-activation */
        kiln__gemm_epilogue ep = {bias_f32(be, bias, OC), gelu_out != NULL, NULL, dt, OC};
        if (bias && !ep.bias)
            return;
        if (gelu_out)
            ep.pre = out;
        gemm(be, gelu_out ? gelu_out : out, dt, OC, inp, C, 0, weight, ldw, trans_w, N, OC, C, 0.0f,
             &ep);
        return;
    }
    /* the fp32 product in scratch after the widened operands, then bias, GELU and the
     * rounding in one pass */
    size_t operands = (size_t)(N * C + C * OC) * sizeof(float);
    float *acc = kiln__cpu_scratch(be, operands + (size_t)(N * OC) * sizeof(float));
    if (!acc)
        return;
    acc = (float *)((char *)acc + operands);
    product(be, dt, 0, trans_w, N, OC, C, inp, C, weight, ldw, 0.0f, acc, OC);
    if (bias) /* in fp32, so the pre-activation is rounded once */
        add_bias_f32(acc, bias, N, OC, dt);
    kiln_convert(out, dt, acc, KILN_DTYPE_F32, N * OC);
    if (gelu_out) /* GELU of the rounded pre-activation, as backward reads it */
        kiln__cpu_gelu_forward(be, dt, gelu_out, out, N * OC);
}

/* dbias[j0, j1) += column sums of dout (N,OC) over those columns, rows in order. */
KILN_INLINE void bias_columns(float *dbias, const void *dout, int64_t N, int64_t OC, int64_t j0,
                              int64_t j1, kiln_dtype dt) {
    for (int64_t n = 0; n < N; n++) {
#pragma omp simd
        for (int64_t j = j0; j < j1; j++)
            dbias[j] += kiln__ld(dout, n * OC + j, dt);
    }
}

/* dbias (OC) += column sums of dout (N,OC). Each thread owns a range of columns and adds
 * the rows in order, so the sums do not depend on the thread count. The dtype is a literal
 * at each call inside the parallel region, so each loop is compiled for its type. */
static void bias_backward(float *dbias, const void *dout, int64_t N, int64_t OC, kiln_dtype dt) {
#pragma omp parallel
    {
        int64_t j0, j1;
        kiln__cpu_split(OC, omp_get_thread_num(), omp_get_num_threads(), &j0, &j1);
        if (dt == KILN_DTYPE_F32)
            bias_columns(dbias, dout, N, OC, j0, j1, KILN_DTYPE_F32);
        else if (dt == KILN_DTYPE_BF16)
            bias_columns(dbias, dout, N, OC, j0, j1, KILN_DTYPE_BF16);
        else
            bias_columns(dbias, dout, N, OC, j0, j1, KILN_DTYPE_F16);
    }
}

void kiln__cpu_matmul_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                               float *dbias, const void *dout, const void *inp, const void *weight,
                               int64_t N, int64_t C, int64_t OC, int trans_w) {
    int64_t ldw = trans_w ? C : OC;
    if (dt == KILN_DTYPE_BF16) {
        if (dinp)
            gemm(be, dinp, dt, C, dout, OC, 0, weight, ldw, !trans_w, N, C, OC, 0.0f, NULL);
        if (trans_w)
            gemm(be, dweight, KILN_DTYPE_F32, C, dout, OC, 1, inp, C, 0, OC, C, N, 1.0f, NULL);
        else
            gemm(be, dweight, KILN_DTYPE_F32, OC, inp, C, 1, dout, OC, 0, C, OC, N, 1.0f, NULL);
        if (dbias)
            bias_backward(dbias, dout, N, OC, dt);
        return;
    }
    if (dinp) {
        /* dinp (N,C) = dout (N,OC) x W^T, W^T being (OC,C) */
        if (dt == KILN_DTYPE_F32) {
            product(be, dt, 0, !trans_w, N, C, OC, dout, OC, weight, ldw, 0.0f, dinp, C);
        } else {
            size_t operands = (size_t)(N * OC + C * OC) * sizeof(float);
            float *acc = kiln__cpu_scratch(be, operands + (size_t)(N * C) * sizeof(float));
            if (!acc)
                return;
            acc = (float *)((char *)acc + operands);
            product(be, dt, 0, !trans_w, N, C, OC, dout, OC, weight, ldw, 0.0f, acc, C);
            kiln_convert(dinp, dt, acc, KILN_DTYPE_F32, N * C);
        }
    }
    if (trans_w) /* dW (OC,C) += dout^T x inp */
        product(be, dt, 1, 0, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C);
    else /* dW (C,OC) += inp^T x dout */
        product(be, dt, 1, 0, C, OC, N, inp, C, dout, OC, 1.0f, dweight, OC);
    if (dbias)
        bias_backward(dbias, dout, N, OC, dt);
}
