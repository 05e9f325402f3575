/* GFLOP/s of GPT-2 124M's matrix products in fp32 (OpenBLAS sgemm) and in bf16 with fp32
 * accumulation (kiln's AVX512-BF16 kernel and oneDNN's matmul), and their ratios, all
 * measured in one run. One row per product and pass:
 *   fwd   out (BT,OC) = inp (BT,C) x W + bias     (the head: W is (Vp,C), no bias)
 *   dinp  dinp (BT,C) = dout (BT,OC) x W^T
 *   dW    dW += inp^T x dout, into fp32 (beta = 1)
 * Columns: sgemm (fp32 in and out); own and dnnl with fp32 output (":f32") and bf16 output
 * (":bf16"; not for dW, whose output is the fp32 gradient); ratios of the fp32-output
 * columns. The "fc+gelu" row is the MLP's first product with bias and GELU fused and the
 * pre-activation kept (bf16 out; its ratio compares the bf16 columns). The "step" row is
 * all of a training step's products as one rate (see print_step). The last line is the
 * cores' fp32 FMA peak measured on registers alone (fma_peak): the ceiling of every column.
 *
 * A cell is the rate of the fastest call within --seconds, and the best such over --rounds
 * passes over the whole table, so that a burst of other work on a shared machine costs a
 * round, not the table.
 *
 *   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 build/bench_gemm
 *       [--bt 256,2048] [--seconds 0.3] [--rounds 3] [--impls sgemm,own,dnnl] [--check]
 * (OPENBLAS_CORETYPE, where set, holds OpenBLAS to an older kernel; unset it to measure.) */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemm.h"
#include "kiln/core.h"
#include "kiln/dtype.h"

#define C 768
#define VP 50304

static double seconds = 0.3;
static int check;
static const char *impls = "sgemm,own,dnnl"; /* the columns to measure */
static int rounds = 3;                       /* passes over the table; each cell keeps its best */

static void *buf(int64_t n, size_t size, float scale, kiln_dtype dt) {
    void *x = kiln_alloc((size_t)n * size);
    if (!x) {
        fprintf(stderr, "bench_gemm: out of memory for %lld elements\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        float v = scale * ((float)((i * 2654435761u) % 1000) / 500.0f - 1.0f);
        if (dt == KILN_DTYPE_BF16)
            ((uint16_t *)x)[i] = kiln_f32_to_bf16(v);
        else if (dt == KILN_DTYPE_F32)
            ((float *)x)[i] = v;
    }
    return x;
}

typedef struct prod {
    int64_t M, N, K, lda, ldb, ldc;
    int ta, tb;
    float beta;
    const float *bias;
    int gelu;
} prod;

/* Operands of one product in both types. */
typedef struct operands {
    float *a32, *b32, *c32;
    uint16_t *a16, *b16, *c16, *pre16;
} operands;

static int run(int impl, const prod *p, const operands *o, int bf16_out) {
    if (impl == 0) {
        cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans,
                    p->tb ? CblasTrans : CblasNoTrans, (int)p->M, (int)p->N, (int)p->K, 1.0f,
                    o->a32, (int)p->lda, o->b32, (int)p->ldb, p->beta, o->c32, (int)p->ldc);
        return 0;
    }
    kiln__gemm_epilogue ep = {p->bias, p->gelu, p->gelu ? o->pre16 : NULL, KILN_DTYPE_BF16, p->ldc};
    kiln_status s = kiln__cpu_gemm(bf16_out ? (void *)o->c16 : (void *)o->c32,
                                   bf16_out ? KILN_DTYPE_BF16 : KILN_DTYPE_F32, p->ldc, o->a16,
                                   KILN_DTYPE_BF16, p->lda, p->ta, o->b16, KILN_DTYPE_BF16, p->ldb,
                                   p->tb, p->M, p->N, p->K, 1.0f, p->beta, &ep);
    if (s) {
        fprintf(stderr, "bench_gemm: %s: %s\n", kiln_status_str(s), kiln_error_message());
        exit(1);
    }
    return 0;
}

/* GFLOP/s of the fastest of repeated calls within `seconds` (at least 3), after a warm-up;
 * 0 when the implementation is not available. */
static double rate(int impl, const prod *p, const operands *o, int bf16_out) {
    if (!strstr(impls, impl == 0 ? "sgemm" : impl == 1 ? "own" : "dnnl"))
        return 0;
    if (impl == 1 && kiln__cpu_gemm_set_impl(KILN__GEMM_OWN))
        return 0;
    if (impl == 2 && kiln__cpu_gemm_set_impl(KILN__GEMM_DNNL))
        return 0;
    run(impl, p, o, bf16_out);
    double best = 1e30, start = kiln_time_ms();
    for (int r = 0; r < 3 || kiln_time_ms() - start < seconds * 1000.0; r++) {
        double t0 = kiln_time_ms();
        run(impl, p, o, bf16_out);
        double ms = kiln_time_ms() - t0;
        best = ms < best ? ms : best;
    }
    return 2.0 * (double)p->M * (double)p->N * (double)p->K / (best * 1e6);
}

/* ||own - sgemm|| / ||sgemm|| with fp32 output and beta = 0 (--check). */
static double rel_err(int impl, const prod *p, const operands *o) {
    prod q = *p;
    q.beta = 0;
    int64_t n = p->M * p->ldc;
    float *ref = malloc((size_t)n * sizeof(float));
    run(0, &q, o, 0);
    memcpy(ref, o->c32, (size_t)n * sizeof(float));
    kiln__cpu_gemm_set_impl(impl == 1 ? KILN__GEMM_OWN : KILN__GEMM_DNNL);
    q.bias = NULL;
    q.gelu = 0;
    run(impl, &q, o, 0);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)o->c32[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    free(ref);
    return sqrt(num / (den > 0 ? den : 1));
}

typedef struct row_t {
    int64_t bt;
    const char *name, *pass;
    prod p;
    int per_step;   /* times a training step runs it (12 layers; the head once) */
    double cell[5]; /* GFLOP/s: sgemm, own f32, own bf16, dnnl f32, dnnl bf16; best so far */
} row_t;

/* Measure every column of one row, keeping each column's best over the rounds. */
static void measure(row_t *r) {
    const prod *p = &r->p;
    int64_t na = (p->ta ? p->K : p->M) * p->lda, nb = (p->tb ? p->N : p->K) * p->ldb;
    int64_t nc = p->M * p->ldc;
    operands o = {buf(na, 4, 1.0f, KILN_DTYPE_F32),   buf(nb, 4, 0.05f, KILN_DTYPE_F32),
                  buf(nc, 4, 0.0f, KILN_DTYPE_F32),   buf(na, 2, 1.0f, KILN_DTYPE_BF16),
                  buf(nb, 2, 0.05f, KILN_DTYPE_BF16), buf(nc, 2, 0.0f, KILN_DTYPE_BF16),
                  buf(nc, 2, 0.0f, KILN_DTYPE_BF16)};
    int out16 = p->beta == 0; /* dW accumulates into the fp32 gradient: no bf16 output */
    double c[5] = {p->gelu ? 0 : rate(0, p, &o, 0), p->gelu ? 0 : rate(1, p, &o, 0),
                   out16 ? rate(1, p, &o, 1) : 0, p->gelu ? 0 : rate(2, p, &o, 0),
                   out16 ? rate(2, p, &o, 1) : 0};
    for (int i = 0; i < 5; i++)
        r->cell[i] = c[i] > r->cell[i] ? c[i] : r->cell[i];
    if (check && !p->gelu) {
        printf("%5lld %-8s %-5s error vs sgemm: own %.1e", (long long)r->bt, r->name, r->pass,
               rel_err(1, p, &o));
        if (kiln__cpu_gemm_has_dnnl())
            printf(" dnnl %.1e", rel_err(2, p, &o));
        printf("\n");
    }
    kiln_free(o.a32), kiln_free(o.b32), kiln_free(o.c32), kiln_free(o.a16), kiln_free(o.b16);
    kiln_free(o.c16), kiln_free(o.pre16);
}

static void cell(double v) {
    if (v > 0)
        printf(" %9.1f", v);
    else
        printf(" %9s", "-");
}

static void ratio(double a, double b) {
    if (a > 0 && b > 0)
        printf(" %9.2f", a / b);
    else
        printf(" %9s", "-");
}

static void print_row(const row_t *r) {
    const prod *p = &r->p;
    char shape[48];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)p->M, (long long)p->N,
             (long long)p->K);
    printf("%5lld %-8s %-5s %-17s", (long long)r->bt, r->name, r->pass, shape);
    for (int i = 0; i < 5; i++)
        cell(r->cell[i]);
    double sg = r->cell[0], fo = p->gelu ? r->cell[2] : r->cell[1];
    double fd = p->gelu ? r->cell[4] : r->cell[3];
    ratio(fo, sg);
    ratio(fd, sg);
    ratio(fo, fd);
    printf("\n");
}

/* One training step's products at this BT (each layer's four products in its three passes,
 * 12 layers, and the head's three), as one rate: total FLOPs / total time, the time of each
 * product being FLOPs / its rate. bf16 uses the bf16-output columns for fwd and dinp (what a
 * bf16 trainer stores), fp32 output for dW. */
/* The core's fp32 FMA peak, the ceiling of every column: 12 independent chains of fused
 * multiply-adds on registers (no memory), on every thread at once, in GFLOP/s for all of them
 * together (2 FLOP per lane). AVX-512 where the CPU has it, else AVX2 with FMA; 0 without. */
#if defined(__x86_64__)
#include <immintrin.h>
#define FMA_CHAINS 12
#define FMA_LOOP(vec, set1, fmadd, lanes)                                                          \
    vec a[FMA_CHAINS], b = set1(0.999999f), c = set1(1e-7f);                                      \
    for (int i = 0; i < FMA_CHAINS; i++)                                                          \
        a[i] = set1((float)i);                                                                     \
    for (int64_t k = 0; k < iters; k++)                                                            \
        for (int i = 0; i < FMA_CHAINS; i++)                                                      \
            a[i] = fmadd(a[i], b, c);                                                              \
    vec t = a[0];                                                                                  \
    for (int i = 1; i < FMA_CHAINS; i++)                                                          \
        t = _mm##lanes##_add_ps(t, a[i]);                                                          \
    float out[16];                                                                                 \
    _mm##lanes##_storeu_ps(out, t);                                                                \
    return out[0];

__attribute__((target("avx2,fma"))) static float fma_avx2(int64_t iters) {
    FMA_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, 256)
}
__attribute__((target("avx512f"))) static float fma_avx512(int64_t iters) {
    FMA_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, 512)
}
#endif

static double fma_peak(int *lanes) {
    *lanes = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    int wide = __builtin_cpu_supports("avx512f");
    if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
        return 0;
    *lanes = wide ? 16 : 8;
    const int64_t iters = 20000000;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = kiln_time_ms();
        volatile float sink = 0;
#pragma omp parallel
        {
            float v = wide ? fma_avx512(iters) : fma_avx2(iters);
#pragma omp atomic
            sink += v;
        }
        double s = (kiln_time_ms() - t0) / 1e3;
        double g = (double)iters * FMA_CHAINS * *lanes * 2 * omp_get_max_threads() / s / 1e9;
        best = g > best ? g : best;
    }
    return best;
#else
    return 0;
#endif
}

static void print_step(const row_t *rows, int n, int64_t bt) {
    double flops = 0, t[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        if (r->bt != bt || r->p.gelu)
            continue;
        double f = 2.0 * (double)r->p.M * (double)r->p.N * (double)r->p.K * r->per_step;
        int out16 = r->p.beta == 0;
        double v[3] = {r->cell[0], r->cell[out16 ? 2 : 1], r->cell[out16 ? 4 : 3]};
        flops += f;
        for (int k = 0; k < 3; k++)
            t[k] += v[k] > 0 ? f / v[k] : INFINITY;
    }
    printf("%5lld %-8s %-5s %-17s", (long long)bt, "step", "all", "(12 layers + head)");
    double g[3];
    for (int k = 0; k < 3; k++)
        g[k] = isfinite(t[k]) && t[k] > 0 ? flops / t[k] : 0;
    cell(g[0]);
    cell(0);
    cell(g[1]);
    cell(0);
    cell(g[2]);
    ratio(g[1], g[0]);
    ratio(g[2], g[0]);
    ratio(g[1], g[2]);
    printf("\n");
}

int main(int argc, char **argv) {
    int64_t bts[8] = {256, 2048};
    int nbt = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--impls") && i + 1 < argc) {
            impls = argv[++i];
        } else if (!strcmp(argv[i], "--check")) {
            check = 1;
        } else if (!strcmp(argv[i], "--bt") && i + 1 < argc) {
            nbt = 0;
            for (char *s = argv[++i]; *s && nbt < 8; s += *s == ',') {
                char *end;
                bts[nbt++] = strtoll(s, &end, 10);
                s = end;
            }
        } else {
            fprintf(stderr, "usage: bench_gemm [--bt 256,2048] [--seconds 0.3] [--rounds 3] "
                            "[--impls sgemm,own,dnnl] [--check]\n");
            return 2;
        }
    }
    float *bias = buf(4 * C > VP ? 4 * C : VP, 4, 0.1f, KILN_DTYPE_F32);
    static const struct {
        const char *name;
        int64_t in, out;
        int trans_w;
    } layers[] = {{"qkv", C, 3 * C, 0},
                  {"attproj", C, C, 0},
                  {"fc", C, 4 * C, 0},
                  {"fcproj", 4 * C, C, 0},
                  {"head", C, VP, 1}};
    row_t rows[64];
    int n = 0;
    for (int b = 0; b < nbt; b++) {
        int64_t bt = bts[b];
        for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
            int64_t in = layers[l].in, out = layers[l].out;
            int tw = layers[l].trans_w, per = tw ? 1 : 12;
            const float *bs = tw ? NULL : bias;
            prod fwd = {bt, out, in, in, tw ? in : out, out, 0, tw, 0.0f, bs, 0};
            rows[n++] = (row_t){bt, layers[l].name, "fwd", fwd, per, {0}};
            if (!strcmp(layers[l].name, "fc")) {
                prod fg = fwd;
                fg.gelu = 1;
                rows[n++] = (row_t){bt, "fc+gelu", "fwd", fg, per, {0}};
            }
            prod dinp = {bt, in, out, out, tw ? in : out, in, 0, !tw, 0.0f, NULL, 0};
            rows[n++] = (row_t){bt, layers[l].name, "dinp", dinp, per, {0}};
            prod dw = tw ? (prod){out, in, bt, out, in, in, 1, 0, 1.0f, NULL, 0}
                         : (prod){in, out, bt, in, out, out, 1, 0, 1.0f, NULL, 0};
            rows[n++] = (row_t){bt, layers[l].name, "dW", dw, per, {0}};
        }
    }
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < n; i++)
            measure(&rows[i]);
        fprintf(stderr, "bench_gemm: round %d of %d done\n", round + 1, rounds);
    }
    printf("bf16 GEMM: GPT-2 124M products, GFLOP/s (best call of %d rounds), %d threads; "
           "AVX512-BF16 %s, oneDNN %s\n",
           rounds, omp_get_max_threads(), kiln__cpu_gemm_has_avx512bf16() ? "yes" : "no",
           kiln__cpu_gemm_has_dnnl() ? kiln__gemm_dnnl_version() : "not built");
    printf("%5s %-8s %-5s %-17s %9s %9s %9s %9s %9s %9s %9s %9s\n", "BT", "product", "pass",
           "MxNxK", "sgemm", "own:f32", "own:bf16", "dnnl:f32", "dnnl:bf16", "own/sg", "dnnl/sg",
           "own/dnnl");
    for (int b = 0; b < nbt; b++) {
        for (int i = 0; i < n; i++)
            if (rows[i].bt == bts[b])
                print_row(&rows[i]);
        print_step(rows, n, bts[b]);
    }
    int lanes = 0;
    double peak = fma_peak(&lanes);
    if (peak > 0)
        printf("fp32 FMA peak of %d threads (%d-lane FMAs on registers, no memory): %.1f GFLOP/s\n",
               omp_get_max_threads(), lanes, peak);
    kiln_free(bias);
    kiln__cpu_gemm_release();
    return 0;
}
