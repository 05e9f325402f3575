/* Matrix products on the CPU in fp32 and bf16, with fp32 accumulation and a fused epilogue.
 *
 *   x = alpha * op(A) x op(B) + beta * C + bias      (row-major; op(X) = X or X^T)
 *   C = gelu(x) when the epilogue asks for GELU, else x; pre = x when asked for, and then
 *   GELU's input is x as stored in pre (rounded to pre's dtype), as backward reads it
 *
 *   op(A) is (M,K): A is stored (M,K) with leading dimension lda when trans_a == 0, and
 *                   (K,M) when trans_a == 1;
 *   op(B) is (K,N): B is stored (K,N) with leading dimension ldb when trans_b == 0, and
 *                   (N,K) when trans_b == 1;
 *   C, pre are (M,N) with leading dimensions ldc, ldpre; bias (N) is fp32, one per column.
 *
 * How the product is computed follows the input dtypes:
 *   - both F32: fp32 throughout, through oneDNN's sgemm (dnnl_sgemm) where kiln was built
 *     with oneDNN and the product has at least KILN__GEMM_F32_DNNL_ROWS rows, else OpenBLAS
 *     sgemm (kiln__gemm_f32 below);
 *   - either BF16 (the other F32 or BF16): bf16 x bf16 products summed in fp32, F32 inputs
 *     rounded to bf16 on the way (to nearest even). The implementation is kiln__gemm_impl;
 *   - either F16: both converted to F32 and sgemm. x86 CPUs without AVX512-FP16 (an Intel
 *     extension from Sapphire Rapids on; AMD's Zen 5 has none) have no fp16 dot product,
 *     so fp16 products gain nothing over fp32 here.
 * C and pre may each be F32 or BF16. x is held in fp32 until it is stored, so a BF16 C is
 * rounded once, after beta * C (read from its bf16 value), the bias and GELU are applied.
 *
 * The backend's products (inp (BT,C), out and dout (BT,OC), W (C,OC), or (OC,C) with
 * trans_w, the tied output head):
 *   forward  out  = inp x W + bias   M=BT N=OC K=C   A=inp              B=W    trans_b=trans_w
 *   dinp     dinp = dout x W^T       M=BT N=C  K=OC  A=dout             B=W    trans_b=!trans_w
 *   dW (C,OC)  += inp^T x dout       M=C  N=OC K=BT  A=inp, trans_a=1   B=dout beta=1
 *   dW (OC,C)  += dout^T x inp       M=OC N=C  K=BT  A=dout, trans_a=1  B=inp  beta=1
 * and the MLP's first product with GELU fused: C = gelu(x) (the GELU output), pre = x.
 *
 * Threads: OpenMP only. Call from serial code; the product threads itself over the
 * OpenMP pool (omp_get_max_threads()), as sgemm and oneDNN do (Debian's libdnnl is built
 * with the OpenMP runtime, libgomp, the same pool). Not reentrant: one call at a time.
 *
 * Determinism: the same inputs give the same bits on every run. For kiln's own kernel they
 * are also the same for every thread count (each element sums its K products in a fixed
 * order; threads split M and N only, never K). */
#ifndef KILN_BACKEND_CPU_GEMM_H
#define KILN_BACKEND_CPU_GEMM_H

#include <stdint.h>

#include "kiln/dtype.h"
#include "kiln/status.h"

/* The fused output pass; a NULL epilogue or a zeroed one adds nothing. */
typedef struct kiln__gemm_epilogue {
    const float *bias; /* (N) added to every row; NULL: none */
    int gelu;          /* 1: C = gelu(x), tanh approximation (GPT-2's) */
    void *pre;         /* (M,N), leading dim ldpre: x before GELU, for backward; NULL: none */
    kiln_dtype pre_dt; /* F32 or BF16 */
    int64_t ldpre;
} kiln__gemm_epilogue;

/* C = epilogue(alpha * op(A) x op(B) + beta * C). beta == 0 never reads C (it may hold
 * NaN). Errors, each with a message: KILN_ERR_ARG for sizes or leading dimensions that do
 * not fit, or a C or pre dtype other than F32/BF16; KILN_ERR_NOMEM when a workspace cannot
 * be had; KILN_ERR_INTERNAL when oneDNN refuses a primitive. M, N or K of 0 is valid
 * (K = 0: x = beta * C + bias). */
kiln_status kiln__cpu_gemm(void *c, kiln_dtype c_dt, int64_t ldc, const void *a, kiln_dtype a_dt,
                           int64_t lda, int trans_a, const void *b, kiln_dtype b_dt, int64_t ldb,
                           int trans_b, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                           const kiln__gemm_epilogue *ep);

/* ---- which implementation computes the fp32 products ---- */

/* oneDNN 2.6's sgemm measured faster than OpenBLAS 0.3.21's at training's shapes (256 rows
 * and more) on an AVX-512 AMD EPYC, and no faster at one row, where sampling runs; d12
 * trained 5% faster with it at 1 and at 2 threads (README "Using kiln").
 *
 * Signals: oneDNN's JIT f32 GEMM (2.6; fixed in oneDNN 3.11.2) points the stack register into
 * a heap buffer while it runs, so a signal handler that runs on a thread inside it writes its
 * frame over the heap. A program that installs handlers blocks those signals in the threads
 * that compute and takes them in a thread of its own (sigwait), as `kiln train` does, or runs
 * its handlers on an alternate stack (sigaltstack, SA_ONSTACK) in every thread. Signals
 * without a handler (the default actions) are safe. */
typedef enum kiln__gemm_f32 {
    KILN__GEMM_F32_AUTO = 0, /* with AVX-512, oneDNN from KILN__GEMM_F32_DNNL_ROWS rows on;
                                else sgemm */
    KILN__GEMM_F32_SGEMM,    /* OpenBLAS cblas_sgemm */
    KILN__GEMM_F32_DNNL,     /* oneDNN dnnl_sgemm, where kiln was built with oneDNN */
} kiln__gemm_f32;
#define KILN__GEMM_F32_DNNL_ROWS 16

/* Force one (tests and benchmarks); KILN_ERR_UNSUPPORTED without oneDNN. The environment
 * variable KILN_GEMM_F32=auto|sgemm|dnnl sets it at the first call as well. */
kiln_status kiln__cpu_gemm_set_f32(kiln__gemm_f32 impl);
kiln__gemm_f32 kiln__cpu_gemm_get_f32(void);
/* C (M,N) = alpha op(A) op(B) + beta C in fp32, row-major, through the fp32 implementation
 * chosen above (a oneDNN failure falls back to sgemm). Serial callers only, as sgemm. */
void kiln__cpu_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc);
/* "oneDNN 2.6.3 sgemm (OpenBLAS below 16 rows)", "OpenBLAS sgemm", "oneDNN 2.6.3 sgemm" */
const char *kiln__cpu_gemm_f32_name(kiln__gemm_f32 impl);

/* ---- which implementation computes the bf16 products ---- */

typedef enum kiln__gemm_impl {
    KILN__GEMM_AUTO = 0, /* the default: DNNL where oneDNN runs on AMX tiles (14x OWN's rate
                            on an Emerald Rapids host: docs/training-and-precision.md), else
                            OWN where the CPU has AVX512-BF16, else FP32 */
    KILN__GEMM_OWN,      /* kiln's AVX512-BF16 kernel (src/backend/cpu/gemm_bf16.c) */
    KILN__GEMM_DNNL,     /* oneDNN's matmul primitive, where kiln was built with oneDNN */
    KILN__GEMM_FP32,     /* bf16 widened to fp32, then sgemm: correct, slower */
} kiln__gemm_impl;

/* Force one (tests and the benchmark); KILN_ERR_UNSUPPORTED with a message when this
 * build or CPU lacks it. AUTO restores the default. The environment variable
 * KILN_GEMM_BF16=own|dnnl|fp32 sets it at the first call as well. */
kiln_status kiln__cpu_gemm_set_impl(kiln__gemm_impl impl);
/* The implementation bf16 products use now (never AUTO). */
kiln__gemm_impl kiln__cpu_gemm_get_impl(void);
/* "own AVX512-BF16", "oneDNN 2.6.3", "fp32 sgemm (no AVX512-BF16: slower)" ... */
const char *kiln__cpu_gemm_impl_name(kiln__gemm_impl impl);
/* 1 when the CPU and the OS support AVX512-BF16 (CPUID, XGETBV). */
int kiln__cpu_gemm_has_avx512bf16(void);
/* 1 when kiln was built with oneDNN. */
int kiln__cpu_gemm_has_dnnl(void);

/* Reserve the workspaces for products up to these sizes (so that a training step allocates
 * nothing) and warm oneDNN where it is used; optional. Prints, once per process, a line to
 * stderr when bf16 products go through fp32 for want of AVX512-BF16. */
kiln_status kiln__cpu_gemm_prepare(int64_t max_m, int64_t max_n, int64_t max_k);
/* Free the workspaces and oneDNN's cached primitives. */
void kiln__cpu_gemm_release(void);

/* ---- internal to the gemm_*.c files ---- */

/* The arguments of one call, checked. */
typedef struct kiln__gemm_call {
    void *c;
    kiln_dtype c_dt;
    int64_t ldc;
    const void *a;
    kiln_dtype a_dt;
    int64_t lda;
    int trans_a;
    const void *b;
    kiln_dtype b_dt;
    int64_t ldb;
    int trans_b;
    int64_t M, N, K;
    float alpha, beta;
    kiln__gemm_epilogue ep; /* zeroed when none */
} kiln__gemm_call;

/* A workspace of at least `bytes`, 64-byte aligned, kept between calls (slot 0..3). */
kiln_status kiln__gemm_workspace(void **out, int slot, size_t bytes);

/* The epilogue for rows [i0,i1) x columns [j0,j1) of x, held in fp32 at acc (leading
 * dimension ldacc, acc's (0,0) being (i0,j0)): adds beta * C and the bias, stores pre,
 * applies GELU, stores C. alpha is applied by the caller. */
void kiln__gemm_store(const kiln__gemm_call *g, const float *acc, int64_t ldacc, int64_t i0,
                      int64_t i1, int64_t j0, int64_t j1);

/* The implementations; each takes a checked call whose inputs are BF16 or F32 and at least
 * one BF16. */
kiln_status kiln__gemm_own(const kiln__gemm_call *g);
kiln_status kiln__gemm_dnnl(const kiln__gemm_call *g);
kiln_status kiln__gemm_fp32(const kiln__gemm_call *g);
/* C = alpha op(A) op(B) + beta C, all fp32 and row-major, through oneDNN's dnnl_sgemm;
 * KILN_ERR_UNSUPPORTED without oneDNN, KILN_ERR_INTERNAL when it refuses (the caller then
 * runs OpenBLAS sgemm). */
kiln_status kiln__gemm_dnnl_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  int64_t ldb, float beta, float *c, int64_t ldc);
const char *kiln__gemm_dnnl_version(void);
/* 1 when oneDNN has a bf16 matmul for this CPU (oneDNN 2.6 has none without AVX-512: there it
 * refuses every bf16 primitive), else 0 with the reason in kiln_error_message; asked once. */
int kiln__gemm_dnnl_bf16_ok(void);
/* 1 when oneDNN runs its bf16 products on AMX tiles on this CPU (its effective ISA includes
 * AVX-512 with AMX: the CPU has AMX-BF16 and the kernel lets the process use the tiles). */
int kiln__gemm_dnnl_has_amx(void);
void kiln__gemm_dnnl_release(void);
void kiln__gemm_own_release(void);

#endif
