/* kiln__cpu_gemm (src/backend/cpu/gemm.h) against a plain double-precision reference, for
 * every implementation of the bf16 products (kiln's AVX512-BF16 kernel, oneDNN, the fp32
 * fallback; each forced in turn), every layout (A and B each transposed or not, padded
 * leading dimensions), every input dtype pairing, both output dtypes and every epilogue
 * (none, bias, bias + GELU keeping the pre-activation in F32 or BF16), on small and odd
 * shapes (1s, sizes that are not multiples of the tiles, K past one k-block, M past one row
 * block), with beta 0 (C holding NaN, never read), 1 and 0.5, alpha 1 and 0.5.
 *
 * Tolerances, from the formats (u = kiln_dtype_epsilon: 2^-24 for fp32, 2^-8 for bf16):
 *   - The bf16 path rounds each input to bf16; the product of two bf16 values has at most
 *     16 significant bits, so it is exact in fp32, and only the K - 1 additions (and the
 *     alpha, beta * C, bias additions: 4 more) round. Summed in any order, the fp32 error is
 *     at most (K + 4) u32 S with S = |alpha| sum_k |a_ik b_kj| + |beta c_ij| + |bias_j|
 *     (the standard bound for recursive or blocked summation). So against the reference
 *     computed from the ROUNDED inputs: |x - x_ref| <= (K + 4) u32 S.
 *   - Against the UNROUNDED inputs, each product a b differs from ã b̃ by at most
 *     (2 u16 + u16^2) |a b|, so |x - x_exact| <= (2.01 u16 + (K + 4) u32) S: about two
 *     bf16 epsilons relative to the sizes of the terms.
 *   - GELU adds its own rounding (sigmoid through expf, a few operations: 64 u32 of |x|
 *     allowed) and carries x's error with a slope of at most 1.13; a BF16 output adds one
 *     rounding, u16 of the value.
 * The fp32 inputs of the sgemm path (F32 x F32, or an F16 input) are not rounded to bf16:
 * the same bound with the exact inputs. */
#include <dirent.h>
#include <omp.h>
#include <stdint.h>

#include "backend/cpu/gemm.h"
#include "kiln/core.h"
#include "kiln/dtype.h"
#include "test.h"

static double u32, u16;

static float rnd(uint64_t *s) { /* in [-1, 1) */
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 23) - 1.0);
}

static double gelu(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double bf(float x) {
    return (double)kiln_bf16_to_f32(kiln_f32_to_bf16(x));
}

static void put(void *m, int64_t i, kiln_dtype dt, float v) {
    if (dt == KILN_DTYPE_F32)
        ((float *)m)[i] = v;
    else if (dt == KILN_DTYPE_BF16)
        ((uint16_t *)m)[i] = kiln_f32_to_bf16(v);
    else
        ((uint16_t *)m)[i] = kiln_f32_to_f16(v);
}

static double get(const void *m, int64_t i, kiln_dtype dt) {
    return dt == KILN_DTYPE_F32 ? ((const float *)m)[i]
                                : kiln_bf16_to_f32(((const uint16_t *)m)[i]);
}

/* One problem: op(A) (M,K) and op(B) (K,N) as fp32 values in op layout, and the references. */
typedef struct problem {
    int64_t M, N, K;
    float *a, *b, *bias, *c0;    /* a (M,K), b (K,N), bias (N), c0 (M,N): C before the call */
    double *p_rnd, *p_exact, *s; /* sum_k ã b̃, sum_k a b, sum_k |a b| (M,N) */
} problem;

/* With `grid`, inputs are multiples of 1/64 in [-2, 2]: exact in bf16 and fp16 alike. */
static void problem_make(problem *p, int64_t M, int64_t N, int64_t K, uint64_t seed, int grid) {
    p->M = M, p->N = N, p->K = K;
    p->a = malloc(sizeof(float) * (size_t)(M * K + 1));
    p->b = malloc(sizeof(float) * (size_t)(K * N + 1));
    p->bias = malloc(sizeof(float) * (size_t)N);
    p->c0 = malloc(sizeof(float) * (size_t)(M * N));
    p->p_rnd = malloc(sizeof(double) * (size_t)(M * N));
    p->p_exact = malloc(sizeof(double) * (size_t)(M * N));
    p->s = malloc(sizeof(double) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++)
        p->a[i] = 2.0f * rnd(&seed);
    for (int64_t i = 0; i < K * N; i++)
        p->b[i] = rnd(&seed);
    for (int64_t i = 0; grid && i < M * K; i++)
        p->a[i] = roundf(p->a[i] * 64) / 64;
    for (int64_t i = 0; grid && i < K * N; i++)
        p->b[i] = roundf(p->b[i] * 64) / 64;
    for (int64_t j = 0; j < N; j++)
        p->bias[j] = 0.5f * rnd(&seed);
    /* C's old values are bf16-representable, so F32 and BF16 C start from the same values */
    for (int64_t i = 0; i < M * N; i++)
        p->c0[i] = (float)bf(rnd(&seed));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double r = 0, e = 0, s = 0;
            for (int64_t k = 0; k < K; k++) {
                double ar = bf(p->a[i * K + k]), br = bf(p->b[k * N + j]);
                r += ar * br;
                e += (double)p->a[i * K + k] * p->b[k * N + j];
                s += fabs(ar * br);
            }
            p->p_rnd[i * N + j] = r, p->p_exact[i * N + j] = e, p->s[i * N + j] = s;
        }
}

static void problem_free(problem *p) {
    free(p->a), free(p->b), free(p->bias), free(p->c0), free(p->p_rnd), free(p->p_exact);
    free(p->s);
}

/* X (rows,cols in op layout) stored with or without transposing, leading dimension ld, as
 * dtype dt. */
static void *store(const float *x, int64_t rows, int64_t cols, int trans, int64_t ld,
                   kiln_dtype dt) {
    int64_t srows = trans ? cols : rows;
    void *m = malloc((size_t)(srows * ld) * 4 + 4);
    for (int64_t i = 0; i < srows * ld; i++) /* padding holds garbage the call must skip */
        put(m, i, dt, 1e30f);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            put(m, trans ? c * ld + r : r * ld + c, dt, x[r * cols + c]);
    return m;
}

typedef struct variant {
    int ta, tb;
    kiln_dtype at, bt, ct;
    int ep; /* 0 none, 1 bias, 2 bias + GELU + pre F32, 3 GELU + pre BF16 */
    float alpha, beta;
} variant;

/* Run one variant and check every element; returns the number of bad elements. */
static int check_variant(const problem *p, const variant *v, int exact_inputs) {
    int64_t M = p->M, N = p->N, K = p->K;
    int64_t lda = (v->ta ? M : K) + 3, ldb = (v->tb ? K : N) + 1, ldc = N + 2, ldpre = N + 5;
    void *a = store(p->a, M, K, v->ta, lda, v->at), *b = store(p->b, K, N, v->tb, ldb, v->bt);
    void *c = malloc((size_t)(M * ldc) * 4), *pre = malloc((size_t)(M * ldpre) * 4);
    for (int64_t i = 0; i < M * ldc; i++)
        put(c, i, v->ct, NAN);
    if (v->beta != 0.0f)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                put(c, i * ldc + j, v->ct, p->c0[i * N + j]);
    kiln_dtype pre_dt = v->ep == 3 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
    kiln__gemm_epilogue ep = {v->ep >= 1 && v->ep <= 2 ? p->bias : NULL, v->ep >= 2,
                              v->ep >= 2 ? pre : NULL, pre_dt, ldpre};
    kiln_status s = kiln__cpu_gemm(c, v->ct, ldc, a, v->at, lda, v->ta, b, v->bt, ldb, v->tb, M, N,
                                   K, v->alpha, v->beta, v->ep ? &ep : NULL);
    int bad = s != KILN_OK;
    if (s)
        fprintf(stderr, "gemm failed: %s: %s\n", kiln_status_str(s), kiln_error_message());
    for (int64_t i = 0; i < M && !s; i++)
        for (int64_t j = 0; j < N; j++) {
            double bias = ep.bias ? p->bias[j] : 0.0, cold = v->beta != 0.0f ? p->c0[i * N + j] : 0;
            double prod = exact_inputs ? p->p_exact[i * N + j] : p->p_rnd[i * N + j];
            double x = v->alpha * prod + v->beta * cold + bias;
            double S = fabs(v->alpha) * p->s[i * N + j] + fabs(v->beta * cold) + fabs(bias);
            double tol_x = (double)(K + 4) * u32 * S + 1e-30;
            double want = ep.gelu ? gelu(x) : x;
            double tol = ep.gelu ? 1.13 * tol_x + 64 * u32 * fabs(x) : tol_x;
            if (ep.gelu && ep.pre && pre_dt == KILN_DTYPE_BF16) {
                /* GELU's input is the pre-activation as stored (rounded to bf16, checked
                 * below), the value backward reads: only GELU's own evaluation error */
                double xs = get(pre, i * ldpre + j, pre_dt);
                want = gelu(xs);
                tol = 64 * u32 * fabs(xs) + 1e-30;
            }
            if (v->ct == KILN_DTYPE_BF16)
                tol = tol * (1 + u16) + u16 * fabs(want);
            double got = get(c, i * ldc + j, v->ct);
            if (!(fabs(got - want) <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr,
                            "  C(%lld,%lld) = %.9g, want %.9g (tol %.3g) [M=%lld N=%lld K=%lld "
                            "ta=%d tb=%d %s x %s -> %s ep=%d alpha=%g beta=%g]\n",
                            (long long)i, (long long)j, got, want, tol, (long long)M, (long long)N,
                            (long long)K, v->ta, v->tb, kiln_dtype_name(v->at),
                            kiln_dtype_name(v->bt), kiln_dtype_name(v->ct), v->ep, v->alpha,
                            v->beta);
            }
            if (ep.pre) {
                double tp = pre_dt == KILN_DTYPE_BF16 ? tol_x * (1 + u16) + u16 * fabs(x) : tol_x;
                double gp = get(pre, i * ldpre + j, pre_dt);
                if (!(fabs(gp - x) <= tp) && bad++ < 3)
                    fprintf(stderr, "  pre(%lld,%lld) = %.9g, want %.9g (tol %.3g)\n", (long long)i,
                            (long long)j, gp, x, tp);
            }
            /* two bf16 epsilons of the terms' sizes from the unrounded inputs */
            if (!exact_inputs && !ep.gelu && v->ct == KILN_DTYPE_F32) {
                double xe = v->alpha * p->p_exact[i * N + j] + v->beta * cold + bias;
                if (!(fabs(got - xe) <= (2.01 * u16 + (double)(K + 4) * u32) * S + 1e-30) &&
                    bad++ < 3)
                    fprintf(stderr, "  C(%lld,%lld) = %.9g, unrounded inputs give %.9g\n",
                            (long long)i, (long long)j, got, xe);
            }
        }
    free(a), free(b), free(c), free(pre);
    return bad;
}

static const int64_t shapes[][3] = {{1, 1, 1},   {1, 7, 3},     {5, 1, 9},     {7, 13, 5},
                                    {9, 50, 33}, {17, 97, 130}, {23, 49, 771}, {3, 200, 2}};

/* Every layout, dtype pairing, output dtype and epilogue on every shape, with the
 * implementation set now; the product runs in bf16 (at least one BF16 input). */
static void all_variants(void) {
    const kiln_dtype ins[3][2] = {{KILN_DTYPE_BF16, KILN_DTYPE_BF16},
                                  {KILN_DTYPE_F32, KILN_DTYPE_BF16},
                                  {KILN_DTYPE_BF16, KILN_DTYPE_F32}};
    const float betas[3] = {0.0f, 1.0f, 0.5f};
    int bad = 0, n = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        problem p;
        problem_make(&p, shapes[sh][0], shapes[sh][1], shapes[sh][2], 17 + sh, 0);
        for (int lay = 0; lay < 4; lay++)
            for (int d = 0; d < 3; d++)
                for (int ct = 0; ct < 2; ct++)
                    for (int ep = 0; ep < 4; ep++, n++) {
                        variant v = {lay & 1,
                                     lay >> 1,
                                     ins[d][0],
                                     ins[d][1],
                                     ct ? KILN_DTYPE_BF16 : KILN_DTYPE_F32,
                                     ep,
                                     n % 5 == 4 ? 0.5f : 1.0f,
                                     betas[n % 3]};
                        bad += check_variant(&p, &v, 0);
                    }
        problem_free(&p);
    }
    CHECK_INT_EQ(bad, 0);
    fprintf(stderr, "  %d variants with %s\n", n,
            kiln__cpu_gemm_impl_name(kiln__cpu_gemm_get_impl()));
}

static int use(kiln__gemm_impl impl) {
    kiln_status s = kiln__cpu_gemm_set_impl(impl);
    if (s == KILN_ERR_UNSUPPORTED) {
        TEST_SKIP("%s", kiln_error_message());
        return 0;
    }
    CHECK_OK(s);
    return s == KILN_OK;
}

static void test_own(void) {
    if (use(KILN__GEMM_OWN))
        all_variants();
}
static void test_dnnl(void) {
    if (use(KILN__GEMM_DNNL))
        all_variants();
}
static void test_fallback(void) {
    if (!use(KILN__GEMM_FP32))
        return;
    CHECK_TRUE(strstr(kiln__cpu_gemm_impl_name(KILN__GEMM_FP32), "fp32") != NULL);
    all_variants();
}

/* Shapes past the own kernel's blocks: M past one row block (2048), K past several
 * k-blocks with an odd tail, N past the columns the partial-sums buffer holds. */
static void test_large(void) {
    kiln__gemm_impl impls[3] = {KILN__GEMM_OWN, KILN__GEMM_DNNL, KILN__GEMM_FP32};
    const int64_t big[][3] = {{2100, 61, 19}, {70, 300, 1201}, {2053, 150, 777}};
    int bad = 0, ran = 0;
    for (size_t sh = 0; sh < sizeof big / sizeof big[0]; sh++) {
        problem p;
        problem_make(&p, big[sh][0], big[sh][1], big[sh][2], 99 + sh, 0);
        for (int im = 0; im < 3; im++) {
            if (kiln__cpu_gemm_set_impl(impls[im]))
                continue;
            for (int lay = 0; lay < 4; lay++) {
                variant v = {lay & 1,
                             lay >> 1,
                             KILN_DTYPE_BF16,
                             KILN_DTYPE_BF16,
                             lay == 3 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32,
                             lay == 2 ? 2 : lay,
                             1.0f,
                             lay == 1 ? 1.0f : 0.0f};
                bad += check_variant(&p, &v, 0);
                ran++;
            }
        }
        problem_free(&p);
    }
    CHECK_TRUE(ran >= 12); /* the fallback always runs */
    CHECK_INT_EQ(bad, 0);
    kiln__cpu_gemm_set_impl(KILN__GEMM_AUTO);
}

/* F32 x F32 goes to sgemm, an F16 input is widened to fp32: no bf16 rounding. */
static void test_fp32_inputs(void) {
    CHECK_OK(kiln__cpu_gemm_set_impl(KILN__GEMM_AUTO));
    const kiln_dtype ins[3][2] = {{KILN_DTYPE_F32, KILN_DTYPE_F32},
                                  {KILN_DTYPE_F16, KILN_DTYPE_F32},
                                  {KILN_DTYPE_BF16, KILN_DTYPE_F16}};
    int bad = 0;
    for (int sh = 3; sh < 7; sh++) {
        problem p;
        problem_make(&p, shapes[sh][0], shapes[sh][1], shapes[sh][2], 5 + sh, 1);
        for (int d = 0; d < 3; d++)
            for (int lay = 0; lay < 4; lay++)
                for (int ep = 0; ep < 4; ep++) {
                    variant v = {lay & 1,
                                 lay >> 1,
                                 ins[d][0],
                                 ins[d][1],
                                 ep == 3 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32,
                                 ep,
                                 1.0f,
                                 ep == 1 ? 1.0f : 0.0f};
                    bad += check_variant(&p, &v, 1);
                }
        problem_free(&p);
    }
    CHECK_INT_EQ(bad, 0);
}

/* Both fp32 implementations (OpenBLAS sgemm, oneDNN's sgemm) and the default choice between
 * them by rows, on shapes below and above KILN__GEMM_F32_DNNL_ROWS rows, in every layout and
 * epilogue, with alpha and beta: each within fp32 rounding of the fp64 product. Through the
 * backend's fp32 matmul ops, the tests of test_backend_ops run the default. */
static void test_fp32_impls(void) {
    const kiln__gemm_f32 impls[3] = {KILN__GEMM_F32_SGEMM, KILN__GEMM_F32_DNNL,
                                     KILN__GEMM_F32_AUTO};
    const int64_t sh32[][3] = {{7, 13, 5}, {16, 33, 40}, {37, 70, 129}, {64, 200, 48}};
    for (int im = 0; im < 3; im++) {
        if (impls[im] == KILN__GEMM_F32_DNNL && !kiln__cpu_gemm_has_dnnl()) {
            CHECK_STATUS(kiln__cpu_gemm_set_f32(impls[im]), KILN_ERR_UNSUPPORTED);
            continue;
        }
        CHECK_OK(kiln__cpu_gemm_set_f32(impls[im]));
        CHECK_TRUE(kiln__cpu_gemm_get_f32() == impls[im]);
        int bad = 0, n = 0;
        for (int sh = 0; sh < 4; sh++) {
            problem p;
            problem_make(&p, sh32[sh][0], sh32[sh][1], sh32[sh][2], 41 + sh, 0);
            for (int lay = 0; lay < 4; lay++)
                for (int ep = 0; ep < 4; ep++, n++) {
                    variant v = {lay & 1,
                                 lay >> 1,
                                 KILN_DTYPE_F32,
                                 KILN_DTYPE_F32,
                                 ep == 3 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32,
                                 ep,
                                 n % 3 == 2 ? 0.5f : 1.0f,
                                 ep == 1 ? 1.0f : (n % 4 == 3 ? 0.5f : 0.0f)};
                    bad += check_variant(&p, &v, 1);
                }
            problem_free(&p);
        }
        CHECK_INT_EQ(bad, 0);
        fprintf(stderr, "  %d fp32 variants with %s\n", n, kiln__cpu_gemm_f32_name(impls[im]));
    }
    CHECK_STATUS(kiln__cpu_gemm_set_f32((kiln__gemm_f32)9), KILN_ERR_ARG);
    CHECK_OK(kiln__cpu_gemm_set_f32(KILN__GEMM_F32_AUTO));
}

/* The same inputs give the same bits twice; kiln's kernel gives the same bits for 1 and 2
 * threads (threads split M and N, never K). */
static void test_determinism(void) {
    int64_t M = 67, N = 301, K = 999;
    problem p;
    problem_make(&p, M, N, K, 7, 0);
    uint16_t *a = store(p.a, M, K, 0, K, KILN_DTYPE_BF16),
             *b = store(p.b, K, N, 1, K, KILN_DTYPE_BF16);
    float *c[3];
    kiln__gemm_impl impls[2] = {KILN__GEMM_OWN, KILN__GEMM_DNNL};
    int ran = 0;
    for (int im = 0; im < 2; im++) {
        if (kiln__cpu_gemm_set_impl(impls[im]))
            continue;
        int threads = omp_get_max_threads();
        for (int r = 0; r < 3; r++) {
            c[r] = malloc(sizeof(float) * (size_t)(M * N));
            if (r == 2)
                omp_set_num_threads(threads > 1 ? 1 : 2);
            kiln__gemm_epilogue ep = {p.bias, 1, NULL, KILN_DTYPE_F32, 0};
            CHECK_OK(kiln__cpu_gemm(c[r], KILN_DTYPE_F32, N, a, KILN_DTYPE_BF16, K, 0, b,
                                    KILN_DTYPE_BF16, K, 1, M, N, K, 1.0f, 0.0f, &ep));
            omp_set_num_threads(threads);
        }
        CHECK_TRUE(memcmp(c[0], c[1], sizeof(float) * (size_t)(M * N)) == 0);
        if (impls[im] == KILN__GEMM_OWN)
            CHECK_TRUE(memcmp(c[0], c[2], sizeof(float) * (size_t)(M * N)) == 0);
        for (int r = 0; r < 3; r++)
            free(c[r]);
        ran++;
    }
    if (!ran)
        TEST_SKIP("neither kiln's AVX512-BF16 kernel nor oneDNN is available");
    free(a), free(b);
    problem_free(&p);
    kiln__cpu_gemm_set_impl(KILN__GEMM_AUTO);
}

/* kiln's kernel stores the common epilogues (bias, beta 0 or 1, F32 or BF16 C) from its
 * registers and the others through kiln__gemm_store; asking for the pre-activation takes the
 * second way. Both give the same bits. */
static void test_epilogue_paths(void) {
    if (!use(KILN__GEMM_OWN))
        return;
    int64_t M = 29, N = 77, K = 500;
    problem p;
    problem_make(&p, M, N, K, 3, 0);
    uint16_t *a = store(p.a, M, K, 0, K, KILN_DTYPE_BF16),
             *b = store(p.b, K, N, 0, N, KILN_DTYPE_BF16);
    float *pre = malloc(sizeof(float) * (size_t)(M * N));
    for (int ct = 0; ct < 2; ct++)
        for (int beta = 0; beta < 2; beta++) {
            kiln_dtype dt = ct ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
            void *c1 = store(p.c0, M, N, 0, N, dt), *c2 = store(p.c0, M, N, 0, N, dt);
            kiln__gemm_epilogue e1 = {p.bias, 0, NULL, KILN_DTYPE_F32, 0};
            kiln__gemm_epilogue e2 = {p.bias, 0, pre, KILN_DTYPE_F32, N};
            CHECK_OK(kiln__cpu_gemm(c1, dt, N, a, KILN_DTYPE_BF16, K, 0, b, KILN_DTYPE_BF16, N, 0,
                                    M, N, K, 1.0f, (float)beta, &e1));
            CHECK_OK(kiln__cpu_gemm(c2, dt, N, a, KILN_DTYPE_BF16, K, 0, b, KILN_DTYPE_BF16, N, 0,
                                    M, N, K, 1.0f, (float)beta, &e2));
            CHECK_TRUE(memcmp(c1, c2, (size_t)(M * N) * kiln_dtype_size(dt)) == 0);
            free(c1), free(c2);
        }
    free(a), free(b), free(pre);
    problem_free(&p);
    kiln__cpu_gemm_set_impl(KILN__GEMM_AUTO);
}

/* Threads of this process, from /proc/self/task; -1 when it cannot be read. */
static int process_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Every implementation runs on the OpenMP pool (oneDNN from Debian is built with libgomp,
 * as OpenBLAS is): after products with each, the process has no more threads than the
 * pool, so kiln's loops and the library never oversubscribe the cores. */
static void test_one_thread_pool(void) {
    if (process_threads() < 0) {
        TEST_SKIP("/proc/self/task cannot be read");
        return;
    }
    int64_t n = 96;
    uint16_t *a = calloc((size_t)(n * n), 2);
    float *c = calloc((size_t)(n * n), 4);
    kiln__gemm_impl impls[3] = {KILN__GEMM_OWN, KILN__GEMM_DNNL, KILN__GEMM_FP32};
    for (int im = 0; im < 3; im++) {
        if (kiln__cpu_gemm_set_impl(impls[im]))
            continue;
        CHECK_OK(kiln__cpu_gemm(c, KILN_DTYPE_F32, n, a, KILN_DTYPE_BF16, n, 0, a, KILN_DTYPE_BF16,
                                n, 0, n, n, n, 1.0f, 0.0f, NULL));
        int t = process_threads(), pool = omp_get_max_threads();
        if (t > pool)
            fprintf(stderr, "  %s: %d threads, the pool has %d\n",
                    kiln__cpu_gemm_impl_name(impls[im]), t, pool);
        CHECK_TRUE(t <= pool);
    }
    free(a), free(c);
    kiln__cpu_gemm_set_impl(KILN__GEMM_AUTO);
}

/* K = 0 leaves beta * C + bias; M or N = 0 does nothing; bad arguments are refused. */
static void test_edges(void) {
    float c[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {0.5f, 0, -1};
    uint16_t x[4] = {0};
    kiln__gemm_epilogue ep = {bias, 0, NULL, KILN_DTYPE_F32, 0};
    CHECK_OK(kiln__cpu_gemm(c, KILN_DTYPE_F32, 3, x, KILN_DTYPE_BF16, 1, 0, x, KILN_DTYPE_BF16, 3,
                            0, 2, 3, 0, 1.0f, 2.0f, &ep));
    CHECK_TRUE(c[0] == 2.5f && c[2] == 5.0f && c[5] == 11.0f);
    CHECK_OK(kiln__cpu_gemm(c, KILN_DTYPE_F32, 3, x, KILN_DTYPE_BF16, 1, 0, x, KILN_DTYPE_BF16, 3,
                            0, 0, 3, 4, 1.0f, 0.0f, NULL));
    CHECK_TRUE(c[0] == 2.5f);
    CHECK_STATUS(kiln__cpu_gemm(c, KILN_DTYPE_F32, 2, x, KILN_DTYPE_BF16, 1, 0, x, KILN_DTYPE_BF16,
                                3, 0, 2, 3, 1, 1.0f, 0.0f, NULL),
                 KILN_ERR_ARG); /* ldc < N */
    CHECK_TRUE(strstr(kiln_error_message(), "ldc=2") != NULL);
    CHECK_STATUS(kiln__cpu_gemm(c, KILN_DTYPE_F16, 3, x, KILN_DTYPE_BF16, 1, 0, x, KILN_DTYPE_BF16,
                                3, 0, 2, 3, 1, 1.0f, 0.0f, NULL),
                 KILN_ERR_ARG); /* F16 output */
    CHECK_STATUS(kiln__cpu_gemm_set_impl((kiln__gemm_impl)9), KILN_ERR_ARG);
    if (!kiln__cpu_gemm_has_dnnl())
        CHECK_STATUS(kiln__cpu_gemm_set_impl(KILN__GEMM_DNNL), KILN_ERR_UNSUPPORTED);
    if (!kiln__cpu_gemm_has_avx512bf16())
        CHECK_STATUS(kiln__cpu_gemm_set_impl(KILN__GEMM_OWN), KILN_ERR_UNSUPPORTED);
    CHECK_OK(kiln__cpu_gemm_set_impl(KILN__GEMM_AUTO));
    /* the default: oneDNN where it runs on AMX tiles, else kiln's kernel, else widened */
    kiln__gemm_impl want = KILN__GEMM_FP32;
    if (kiln__cpu_gemm_has_dnnl() && kiln__gemm_dnnl_has_amx())
        want = KILN__GEMM_DNNL;
    else if (kiln__cpu_gemm_has_avx512bf16())
        want = KILN__GEMM_OWN;
    CHECK_TRUE(kiln__cpu_gemm_get_impl() == want);
}

int main(void) {
    u32 = kiln_dtype_epsilon(KILN_DTYPE_F32);
    u16 = kiln_dtype_epsilon(KILN_DTYPE_BF16);
    fprintf(stderr, "AVX512-BF16: %s, oneDNN: %s\n", kiln__cpu_gemm_has_avx512bf16() ? "yes" : "no",
            kiln__cpu_gemm_has_dnnl() ? "built" : "not built");
    RUN_TEST(test_edges);
    RUN_TEST(test_one_thread_pool); /* before test_determinism changes the thread count */
    RUN_TEST(test_own);
    RUN_TEST(test_dnnl);
    RUN_TEST(test_fallback);
    RUN_TEST(test_large);
    RUN_TEST(test_fp32_inputs);
    RUN_TEST(test_fp32_impls);
    RUN_TEST(test_determinism);
    RUN_TEST(test_epilogue_paths);
    kiln__cpu_gemm_release();
    TEST_MAIN_END();
}
