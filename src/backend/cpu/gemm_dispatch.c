/* kiln__cpu_gemm: argument checks, the choice of implementation, the workspaces, the fused
 * epilogue shared by every implementation, the fp32 (sgemm) path and the fallback that
 * widens bf16 to fp32 on CPUs without AVX512-BF16. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/gemm.h"
#include "core/dtype_inline.h"
#include "kiln/core.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f

/* ---- the CPU ---- */

int kiln__cpu_avx512_leaf7(unsigned *b, unsigned *c) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, d;
    if (!__get_cpuid(1, &a, b, c, &d) || !(*c & (1u << 27))) /* OSXSAVE */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6u) != 0xe6u) /* the OS saves SSE, AVX and the AVX-512 state */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, b, c, &d))
        return 0;
    return ((*b >> 16) & 1) && ((*b >> 30) & 1); /* AVX-512F, BW */
#else
    (void)b;
    (void)c;
    return 0;
#endif
}

static int detect_avx512bf16(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!kiln__cpu_avx512_leaf7(&b, &c) || !((b >> 31) & 1) || /* AVX-512VL */
        !__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return 0;
    return (a >> 5) & 1; /* AVX512_BF16 */
#else
    return 0;
#endif
}

int kiln__cpu_gemm_has_avx512bf16(void) {
    static int cached = -1;
    if (cached < 0)
        cached = detect_avx512bf16();
    return cached;
}

int kiln__cpu_gemm_has_dnnl(void) {
#ifdef KILN_HAVE_DNNL
    return 1;
#else
    return 0;
#endif
}

/* ---- the implementation ---- */

static kiln__gemm_impl impl_now = KILN__GEMM_AUTO;
static int impl_env_read;

static kiln__gemm_impl impl_default(void) {
    if (kiln__cpu_gemm_has_dnnl() && kiln__gemm_dnnl_has_amx() && kiln__gemm_dnnl_bf16_ok())
        return KILN__GEMM_DNNL;
    return kiln__cpu_gemm_has_avx512bf16() ? KILN__GEMM_OWN : KILN__GEMM_FP32;
}

static kiln_status impl_check(kiln__gemm_impl impl) {
    if (impl == KILN__GEMM_OWN && !kiln__cpu_gemm_has_avx512bf16())
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "kiln's bf16 kernel needs AVX512-BF16, which this CPU lacks");
    if (impl == KILN__GEMM_DNNL && !kiln__cpu_gemm_has_dnnl())
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "this kiln was built without oneDNN (apt-get install libdnnl-dev)");
    if (impl == KILN__GEMM_DNNL && !kiln__gemm_dnnl_bf16_ok())
        return KILN_ERR_UNSUPPORTED; /* the probe's message stands */
    if (impl < KILN__GEMM_AUTO || impl > KILN__GEMM_FP32)
        return kiln_error_setf(KILN_ERR_ARG, "no bf16 GEMM implementation %d", (int)impl);
    return KILN_OK;
}

kiln_status kiln__cpu_gemm_set_impl(kiln__gemm_impl impl) {
    impl_env_read = 1;
    kiln_status s = impl_check(impl);
    if (s)
        return s;
    impl_now = impl == KILN__GEMM_AUTO ? impl_default() : impl;
    return KILN_OK;
}

static void fallback_note(void) {
    static int said;
    if (!said && impl_now == KILN__GEMM_FP32 && !kiln__cpu_gemm_has_avx512bf16()) {
        said = 1;
        fprintf(stderr, "kiln: this CPU has no AVX512-BF16; bf16 matrix products are widened to "
                        "fp32 and run through sgemm (correct, slower than fp32 itself)\n");
    }
}

kiln__gemm_impl kiln__cpu_gemm_get_impl(void) {
    if (!impl_env_read) {
        impl_env_read = 1;
        impl_now = impl_default();
        const char *e = getenv("KILN_GEMM_BF16");
        kiln__gemm_impl want = KILN__GEMM_AUTO;
        if (e && !strcmp(e, "own"))
            want = KILN__GEMM_OWN;
        else if (e && !strcmp(e, "dnnl"))
            want = KILN__GEMM_DNNL;
        else if (e && !strcmp(e, "fp32"))
            want = KILN__GEMM_FP32;
        if (want != KILN__GEMM_AUTO && impl_check(want) == KILN_OK)
            impl_now = want;
        else if (e && e[0])
            fprintf(stderr, "kiln: KILN_GEMM_BF16=%s is not available here; using %s\n", e,
                    kiln__cpu_gemm_impl_name(impl_now));
    }
    return impl_now;
}

const char *kiln__cpu_gemm_impl_name(kiln__gemm_impl impl) {
    static char dnnl[64];
    switch (impl) {
    case KILN__GEMM_AUTO: return kiln__cpu_gemm_impl_name(kiln__cpu_gemm_get_impl());
    case KILN__GEMM_OWN: return "kiln AVX512-BF16";
    case KILN__GEMM_DNNL:
        snprintf(dnnl, sizeof dnnl, "oneDNN %s", kiln__gemm_dnnl_version());
        return dnnl;
    case KILN__GEMM_FP32:
        return kiln__cpu_gemm_has_avx512bf16() ? "fp32 sgemm (widened)"
                                               : "fp32 sgemm (no AVX512-BF16: slower)";
    }
    return "?";
}

/* ---- workspaces ---- */

enum { WS_SLOTS = 4 };
static void *ws_ptr[WS_SLOTS];
static size_t ws_size[WS_SLOTS];

kiln_status kiln__gemm_workspace(void **out, int slot, size_t bytes) {
    if (bytes > ws_size[slot]) {
        kiln_free(ws_ptr[slot]);
        ws_ptr[slot] = NULL;
        ws_size[slot] = 0;
        kiln_status s = kiln_alloc_checked(&ws_ptr[slot], bytes, "GEMM workspace");
        if (s)
            return s;
        ws_size[slot] = bytes;
    }
    *out = ws_ptr[slot];
    return KILN_OK;
}

void kiln__cpu_gemm_release(void) {
    for (int i = 0; i < WS_SLOTS; i++) {
        kiln_free(ws_ptr[i]);
        ws_ptr[i] = NULL;
        ws_size[i] = 0;
    }
    kiln__gemm_dnnl_release();
    kiln__gemm_own_release();
}

/* ---- the epilogue ---- */

/* One row: x = acc + beta * C + bias; pre = x; C = gelu(pre) or x (GELU of the stored,
 * rounded pre-activation). With the dtypes constant
 * (each caller below passes literals), the loads and stores fold and the loop vectorises. */
__attribute__((always_inline)) static inline void store_row(void *c, kiln_dtype c_dt, void *pre,
                                                            kiln_dtype pre_dt, int gelu,
                                                            const float *acc, const float *bias,
                                                            float beta, int64_t n) {
    if (beta != 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float x = acc[j] + beta * kiln__ld(c, j, c_dt) + (bias ? bias[j] : 0.0f);
            if (pre) { /* GELU of x as stored: the value backward and recomputation see */
                kiln__st(pre, j, x, pre_dt);
                x = kiln__ld(pre, j, pre_dt);
            }
            if (gelu)
                x = x * kiln__cpu_sigmoidf(2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x));
            kiln__st(c, j, x, c_dt);
        }
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float x = acc[j] + (bias ? bias[j] : 0.0f);
            if (pre) { /* GELU of x as stored: the value backward and recomputation see */
                kiln__st(pre, j, x, pre_dt);
                x = kiln__ld(pre, j, pre_dt);
            }
            if (gelu)
                x = x * kiln__cpu_sigmoidf(2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x));
            kiln__st(c, j, x, c_dt);
        }
    }
}

#define STORE_CASE(CDT, PDT, G)                                                                    \
    for (int64_t i = i0; i < i1; i++)                                                              \
        store_row(kiln__at(g->c, i * g->ldc + j0, CDT), CDT,                                       \
                  pre ? kiln__at(pre, i * g->ep.ldpre + j0, PDT) : NULL, PDT, G,                   \
                  acc + (i - i0) * ldacc, bias, g->beta, n);

void kiln__gemm_store(const kiln__gemm_call *g, const float *acc, int64_t ldacc, int64_t i0,
                      int64_t i1, int64_t j0, int64_t j1) {
    int64_t n = j1 - j0;
    const float *bias = g->ep.bias ? g->ep.bias + j0 : NULL;
    void *pre = g->ep.pre;
    int cb = g->c_dt == KILN_DTYPE_BF16, pb = g->ep.pre_dt == KILN_DTYPE_BF16, gl = !!g->ep.gelu;
    const kiln_dtype F = KILN_DTYPE_F32, H = KILN_DTYPE_BF16;
    switch (cb * 4 + pb * 2 + gl) {
    case 0: STORE_CASE(F, F, 0) break;
    case 1: STORE_CASE(F, F, 1) break;
    case 2: STORE_CASE(F, H, 0) break;
    case 3: STORE_CASE(F, H, 1) break;
    case 4: STORE_CASE(H, F, 0) break;
    case 5: STORE_CASE(H, F, 1) break;
    case 6: STORE_CASE(H, H, 0) break;
    case 7: STORE_CASE(H, H, 1) break;
    }
}

/* The epilogue over all of C from x (M,N) fp32 (x may be C itself when C is F32 and beta
 * was applied already: the call then carries beta = 0), threaded over rows. */
static void store_all(const kiln__gemm_call *g, const float *x, int64_t ldx) {
#pragma omp parallel for schedule(static) if (g->M * g->N >= (1 << 15))
    for (int64_t i = 0; i < g->M; i++)
        kiln__gemm_store(g, x + i * ldx, ldx, i, i + 1, 0, g->N);
}

/* ---- fp32 products (sgemm), and bf16 widened to fp32 ---- */

/* rows x cols of src (type st, leading dimension ld) into dst (fp32, dense); with round,
 * F32 values are rounded to bf16 first, as the bf16 kernels round them. */
static void widen(float *dst, const void *src, kiln_dtype st, int64_t ld, int64_t rows,
                  int64_t cols, int round) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 15))
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * cols;
        kiln_convert(d, KILN_DTYPE_F32, kiln__cat(src, r * ld, st), st, cols);
        if (round && st == KILN_DTYPE_F32)
            for (int64_t c = 0; c < cols; c++)
                d[c] = kiln__from_bf16(kiln__to_bf16(d[c]));
    }
}

/* ---- which implementation computes the fp32 products ---- */

static kiln__gemm_f32 f32_now = KILN__GEMM_F32_AUTO;
static int f32_env_read;

static kiln_status f32_check(kiln__gemm_f32 impl) {
    if (impl == KILN__GEMM_F32_DNNL && !kiln__cpu_gemm_has_dnnl())
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "this kiln was built without oneDNN (apt-get install libdnnl-dev)");
    if (impl < KILN__GEMM_F32_AUTO || impl > KILN__GEMM_F32_DNNL)
        return kiln_error_setf(KILN_ERR_ARG, "no fp32 GEMM implementation %d", (int)impl);
    return KILN_OK;
}

kiln_status kiln__cpu_gemm_set_f32(kiln__gemm_f32 impl) {
    f32_env_read = 1;
    kiln_status s = f32_check(impl);
    if (s)
        return s;
    f32_now = impl;
    return KILN_OK;
}

kiln__gemm_f32 kiln__cpu_gemm_get_f32(void) {
    if (!f32_env_read) {
        f32_env_read = 1;
        const char *e = getenv("KILN_GEMM_F32");
        kiln__gemm_f32 want = KILN__GEMM_F32_AUTO;
        if (e && !strcmp(e, "sgemm"))
            want = KILN__GEMM_F32_SGEMM;
        else if (e && !strcmp(e, "dnnl"))
            want = KILN__GEMM_F32_DNNL;
        if (want != KILN__GEMM_F32_AUTO && f32_check(want) == KILN_OK)
            f32_now = want;
        else if (e && e[0] && strcmp(e, "auto") != 0)
            fprintf(stderr, "kiln: KILN_GEMM_F32=%s is not available here; using %s\n", e,
                    kiln__cpu_gemm_f32_name(f32_now));
    }
    return f32_now;
}

/* AUTO's choice: oneDNN's sgemm on CPUs with AVX-512, where it measured 3-20% faster than
 * OpenBLAS at training's shapes; OpenBLAS's without, where oneDNN 2.6's AVX2 sgemm measured
 * slower at every training shape (AMD Zen 3, 1 thread: 63-86 GFLOP/s against OpenBLAS's
 * 81-93, and 33 at some, e.g. 256 x 4096 x 768). */
static int f32_auto_dnnl(void) {
    static int cached = -1;
    if (cached < 0) {
        unsigned b, c;
        cached = kiln__cpu_gemm_has_dnnl() && kiln__cpu_avx512_leaf7(&b, &c);
    }
    return cached;
}

const char *kiln__cpu_gemm_f32_name(kiln__gemm_f32 impl) {
    static char dnnl[64];
    switch (impl) {
    case KILN__GEMM_F32_AUTO:
        if (!kiln__cpu_gemm_has_dnnl())
            return "OpenBLAS sgemm";
        if (!f32_auto_dnnl())
            return "OpenBLAS sgemm (oneDNN's is slower without AVX-512)";
        snprintf(dnnl, sizeof dnnl, "oneDNN %s sgemm (OpenBLAS below %d rows)",
                 kiln__gemm_dnnl_version(), KILN__GEMM_F32_DNNL_ROWS);
        return dnnl;
    case KILN__GEMM_F32_SGEMM: return "OpenBLAS sgemm";
    case KILN__GEMM_F32_DNNL:
        snprintf(dnnl, sizeof dnnl, "oneDNN %s sgemm", kiln__gemm_dnnl_version());
        return dnnl;
    }
    return "?";
}

void kiln__cpu_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc) {
    kiln__gemm_f32 impl = kiln__cpu_gemm_get_f32();
    if (impl == KILN__GEMM_F32_AUTO)
        impl = f32_auto_dnnl() && M >= KILN__GEMM_F32_DNNL_ROWS ? KILN__GEMM_F32_DNNL
                                                                : KILN__GEMM_F32_SGEMM;
    if (impl == KILN__GEMM_F32_DNNL && kiln__gemm_dnnl_sgemm(trans_a, trans_b, M, N, K, alpha, a,
                                                             lda, b, ldb, beta, c, ldc) == KILN_OK)
        return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, a, (int)lda, b,
                (int)ldb, beta, c, (int)ldc);
}

static void sgemm(const kiln__gemm_call *g, const float *a, int64_t lda, const float *b,
                  int64_t ldb, float beta, float *c, int64_t ldc, int64_t M, int64_t N, int64_t K) {
    kiln__cpu_sgemm(g->trans_a, g->trans_b, M, N, K, g->alpha, a, lda, b, ldb, beta, c, ldc);
}

/* Both inputs F32: sgemm straight into an F32 C, then the epilogue in place. */
static kiln_status gemm_f32_inputs(const kiln__gemm_call *g) {
    int plain = !g->ep.bias && !g->ep.gelu && !g->ep.pre;
    if (g->c_dt == KILN_DTYPE_F32) {
        sgemm(g, g->a, g->lda, g->b, g->ldb, g->beta, g->c, g->ldc, g->M, g->N, g->K);
        if (!plain) {
            kiln__gemm_call h = *g;
            h.beta = 0.0f;
            store_all(&h, g->c, g->ldc);
        }
        return KILN_OK;
    }
    float *x;
    kiln_status s = kiln__gemm_workspace((void **)&x, 2, (size_t)(g->M * g->N) * sizeof(float));
    if (s)
        return s;
    sgemm(g, g->a, g->lda, g->b, g->ldb, 0.0f, x, g->N, g->M, g->N, g->K);
    store_all(g, x, g->N);
    return KILN_OK;
}

/* Blocks of the fallback: its workspaces stay bounded whatever the shape (about 20 MiB). */
enum { FB_MB = 2048, FB_NB = 1024, FB_KB = 1024 };

kiln_status kiln__gemm_fp32(const kiln__gemm_call *g) {
    float *wa, *wb, *x;
    int64_t mb = g->M < FB_MB ? g->M : FB_MB, nb = g->N < FB_NB ? g->N : FB_NB;
    int64_t kb = g->K < FB_KB ? g->K : FB_KB;
    kiln_status s = kiln__gemm_workspace((void **)&wa, 0, (size_t)(mb * kb) * sizeof(float));
    if (!s)
        s = kiln__gemm_workspace((void **)&wb, 1, (size_t)(kb * nb) * sizeof(float));
    if (!s)
        s = kiln__gemm_workspace((void **)&x, 2, (size_t)(mb * nb) * sizeof(float));
    if (s)
        return s;
    /* bf16 products round F32 inputs to bf16; with an F16 input everything is fp32 */
    int round = g->a_dt != KILN_DTYPE_F16 && g->b_dt != KILN_DTYPE_F16;
    for (int64_t i0 = 0; i0 < g->M; i0 += mb) {
        int64_t m = g->M - i0 < mb ? g->M - i0 : mb;
        for (int64_t j0 = 0; j0 < g->N; j0 += nb) {
            int64_t n = g->N - j0 < nb ? g->N - j0 : nb;
            if (g->K == 0)
                memset(x, 0, (size_t)(m * n) * sizeof(float));
            for (int64_t k0 = 0; k0 < g->K; k0 += kb) {
                int64_t k = g->K - k0 < kb ? g->K - k0 : kb;
                /* the block of op(A) (m,k) and of op(B) (k,n), each widened as stored */
                if (g->trans_a)
                    widen(wa, kiln__cat(g->a, k0 * g->lda + i0, g->a_dt), g->a_dt, g->lda, k, m,
                          round);
                else
                    widen(wa, kiln__cat(g->a, i0 * g->lda + k0, g->a_dt), g->a_dt, g->lda, m, k,
                          round);
                if (g->trans_b)
                    widen(wb, kiln__cat(g->b, j0 * g->ldb + k0, g->b_dt), g->b_dt, g->ldb, n, k,
                          round);
                else
                    widen(wb, kiln__cat(g->b, k0 * g->ldb + j0, g->b_dt), g->b_dt, g->ldb, k, n,
                          round);
                sgemm(g, wa, g->trans_a ? m : k, wb, g->trans_b ? k : n, k0 ? 1.0f : 0.0f, x, n, m,
                      n, k);
            }
            kiln__gemm_call h = *g;
            h.c = kiln__at(g->c, i0 * g->ldc + j0, g->c_dt);
            h.ep.bias = g->ep.bias ? g->ep.bias + j0 : NULL;
            h.ep.pre = g->ep.pre ? kiln__at(g->ep.pre, i0 * g->ep.ldpre + j0, g->ep.pre_dt) : NULL;
            h.M = m;
            h.N = n;
            store_all(&h, x, n);
        }
    }
    return KILN_OK;
}

/* ---- the entry point ---- */

static int dtype_ok(kiln_dtype t) {
    return t == KILN_DTYPE_F32 || t == KILN_DTYPE_BF16 || t == KILN_DTYPE_F16;
}

kiln_status kiln__cpu_gemm(void *c, kiln_dtype c_dt, int64_t ldc, const void *a, kiln_dtype a_dt,
                           int64_t lda, int trans_a, const void *b, kiln_dtype b_dt, int64_t ldb,
                           int trans_b, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                           const kiln__gemm_epilogue *ep) {
    kiln__gemm_call g = {c,   c_dt,      ldc, a, a_dt, lda,   !!trans_a, b,  b_dt,
                         ldb, !!trans_b, M,   N, K,    alpha, beta,      {0}};
    if (ep)
        g.ep = *ep;
    if (!g.ep.pre)
        g.ep.pre_dt = KILN_DTYPE_F32;
    if (M < 0 || N < 0 || K < 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return kiln_error_setf(KILN_ERR_ARG, "GEMM: sizes M=%lld N=%lld K=%lld out of range",
                               (long long)M, (long long)N, (long long)K);
    if (!dtype_ok(a_dt) || !dtype_ok(b_dt) || (c_dt != KILN_DTYPE_F32 && c_dt != KILN_DTYPE_BF16) ||
        (g.ep.pre && g.ep.pre_dt != KILN_DTYPE_F32 && g.ep.pre_dt != KILN_DTYPE_BF16))
        return kiln_error_setf(KILN_ERR_ARG, "GEMM: types A %s B %s C %s pre %s not supported",
                               kiln_dtype_name(a_dt), kiln_dtype_name(b_dt), kiln_dtype_name(c_dt),
                               kiln_dtype_name(g.ep.pre_dt));
    int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if ((M > 0 && K > 0 && lda < (a_cols > 1 ? a_cols : 1)) ||
        (K > 0 && N > 0 && ldb < (b_cols > 1 ? b_cols : 1)) || (M > 0 && ldc < N) ||
        (g.ep.pre && M > 0 && g.ep.ldpre < N))
        return kiln_error_setf(KILN_ERR_ARG,
                               "GEMM: leading dimensions lda=%lld ldb=%lld ldc=%lld ldpre=%lld too "
                               "small for M=%lld N=%lld K=%lld",
                               (long long)lda, (long long)ldb, (long long)ldc,
                               (long long)g.ep.ldpre, (long long)M, (long long)N, (long long)K);
    if (M == 0 || N == 0)
        return KILN_OK;
    if (K == 0) { /* nothing to multiply: the epilogue of beta * C + bias */
        float *x;
        kiln_status s = kiln__gemm_workspace((void **)&x, 2, (size_t)N * sizeof(float));
        if (s)
            return s;
        memset(x, 0, (size_t)N * sizeof(float));
        for (int64_t i = 0; i < M; i++)
            kiln__gemm_store(&g, x, N, i, i + 1, 0, N);
        return KILN_OK;
    }
    if (a_dt == KILN_DTYPE_F16 || b_dt == KILN_DTYPE_F16 ||
        (a_dt == KILN_DTYPE_F32 && b_dt == KILN_DTYPE_F32)) {
        if (a_dt == KILN_DTYPE_F32 && b_dt == KILN_DTYPE_F32)
            return gemm_f32_inputs(&g);
        return kiln__gemm_fp32(&g); /* F16 widened, blockwise */
    }
    switch (kiln__cpu_gemm_get_impl()) {
    case KILN__GEMM_OWN: return kiln__gemm_own(&g);
    case KILN__GEMM_DNNL: return kiln__gemm_dnnl(&g);
    default: fallback_note(); /* the first bf16 product says so, not an fp32 run */
        return kiln__gemm_fp32(&g);
    }
}

kiln_status kiln__cpu_gemm_prepare(int64_t max_m, int64_t max_n, int64_t max_k) {
    kiln__gemm_impl impl = kiln__cpu_gemm_get_impl();
    if (impl == KILN__GEMM_OWN) {
        /* one tiny product makes the kernel reserve its per-thread buffers */
        uint16_t one[1] = {0x3f80};
        float out[1];
        return kiln__cpu_gemm(out, KILN_DTYPE_F32, 1, one, KILN_DTYPE_BF16, 1, 0, one,
                              KILN_DTYPE_BF16, 1, 0, 1, 1, 1, 1.0f, 0.0f, NULL);
    }
    if (impl == KILN__GEMM_FP32) { /* the fallback's blocks, bounded whatever the shapes */
        int64_t mb = max_m < FB_MB ? max_m : FB_MB, nb = max_n < FB_NB ? max_n : FB_NB;
        int64_t kb = max_k < FB_KB ? max_k : FB_KB;
        void *w;
        kiln_status s = kiln__gemm_workspace(&w, 0, (size_t)(mb * kb) * sizeof(float));
        if (!s)
            s = kiln__gemm_workspace(&w, 1, (size_t)(kb * nb) * sizeof(float));
        if (!s)
            s = kiln__gemm_workspace(&w, 2, (size_t)(mb * nb) * sizeof(float));
        return s;
    }
    return KILN_OK; /* oneDNN: its primitives are made at each shape's first call */
}
