/* Every op of the CPU backend against the reference, in each dtype, on the same inputs: made
 * in fp32, rounded to the dtype once with kiln_convert, then given to both backends. Two
 * sizes: an awkward small one (nothing a multiple of a vector width) and a larger one that
 * crosses the attention block size. Outputs that ops accumulate into start from the same
 * random values for both backends, and outputs that ops write start from garbage. Each CPU
 * op is run twice from the same state and must give the same bits. Then the fused ops against
 * their unfused compositions, the optimizer updates with a working copy, the reductions,
 * slabs, conversions, memory and the recorded error.
 *
 * Tolerances. fp32 results are compared by relative error by norm as before the dtypes
 * existed: TOL_FWD for forward ops, TOL_BWD for backward ops (they sum more terms, in fp32
 * on the CPU and in double in the reference). In bf16 and fp16 each op computes in fp32 and
 * rounds each output once, so the two backends' outputs differ by their fp32 difference plus
 * at most one ulp of the dtype, which is 2u relative to the value (u = kiln_dtype_epsilon:
 * 2^-8 bf16, 2^-11 fp16): TOL(dt, tol32) = tol32 + 2u, elementwise where an op has no
 * reduction and by norm where it has. Outputs kept in fp32 whatever the dtype (parameter
 * gradients, LayerNorm statistics, losses) keep the fp32 tolerance: their inputs are the
 * same dtype values for both backends and their arithmetic is fp32. Matrix products: the
 * products of two bf16 (or fp16) values are exact in fp32 (8 + 8 or 11 + 11 significant
 * bits), so a product in the dtype is a sum of K exact terms in fp32, which is what the fp32
 * test bounds with tol32 whatever the order of the sum; TOL then adds the output rounding.
 * This holds for the CPU widening to fp32 for sgemm and for a native bf16 GEMM with fp32
 * accumulation alike. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype_inline.h" /* kiln__round_bits: the bits stochastic rounding uses */
#include "kiln/backend.h"
#include "kiln/core.h"
#include "test.h"

#define TOL_FWD 1e-5
#define TOL_BWD 1e-4
#define F32 KILN_DTYPE_F32

typedef struct {
    int64_t B, T, C, NH, V, Vp;
} sizes;

static kiln_rng rng;
static kiln_backend *ref, *cpu;
static kiln_dtype dt; /* the dtype under test */

/* tol32 plus one ulp of the dtype, relative (see the top of the file) */
static double TOL(double tol32) {
    return tol32 + (dt == F32 ? 0.0 : 2.0 * kiln_dtype_epsilon(dt));
}

static float *randn(int64_t n, float scale) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = kiln_rng_normal(&rng) * scale;
    return x;
}

/* n values of type t from fp32 x (rounded once); x is freed. */
static void *to_type(float *x, int64_t n, kiln_dtype t) {
    if (t == F32)
        return x;
    void *y = malloc((size_t)(n > 0 ? n : 1) * kiln_dtype_size(t));
    kiln_convert(y, t, x, F32, n);
    free(x);
    return y;
}

/* Random inputs in the dtype under test. */
static void *rand_dt(int64_t n, float scale) {
    return to_type(randn(n, scale), n, dt);
}

static void *dup_bytes(const void *x, size_t bytes) {
    void *y = malloc(bytes ? bytes : 1);
    memcpy(y, x, bytes);
    return y;
}

static float *widen(const void *x, int64_t n, kiln_dtype t) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    kiln_convert(y, F32, x, t, n);
    return y;
}

static int32_t *rand_ids(int64_t n, int64_t below) {
    int32_t *x = malloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++)
        x[i] = (int32_t)kiln_rng_below(&rng, (uint64_t)below);
    return x;
}

/* Three copies of an output buffer of type t: the reference's and two CPU runs. */
typedef struct {
    void *r, *c1, *c2;
    int64_t n;
    kiln_dtype t;
} out3;

static out3 out3_init(int64_t n, kiln_dtype t, int accumulate) {
    out3 o = {.n = n, .t = t};
    o.r = to_type(randn(n, accumulate ? 1.0f : 1e3f), n, t);
    o.c1 = dup_bytes(o.r, (size_t)n * kiln_dtype_size(t));
    o.c2 = dup_bytes(o.r, (size_t)n * kiln_dtype_size(t));
    return o;
}

static void out3_free(out3 *o) {
    free(o->r), free(o->c1), free(o->c2);
}

static void *at(const out3 *o, int k) {
    return k == 0 ? o->r : k == 1 ? o->c1 : o->c2;
}

/* Run k of three: 0 is the reference (outputs .r), 1 and 2 the CPU (.c1, .c2). */
static kiln_backend *be_of(int k) {
    return k == 0 ? ref : cpu;
}

static void report(const char *what, double err, double tol, const char *how) {
    test_checks++;
    if (getenv("KILN_TEST_VERBOSE"))
        fprintf(stderr, "  %-5s %-36s %.3g (%s)\n", kiln_dtype_name(dt), what, err, how);
    if (!(err <= tol)) {
        test_failures++;
        fprintf(stderr, "  %s %s: %s error %.3g > %.3g\n", kiln_dtype_name(dt), what, how, err,
                tol);
    }
}

static void same_runs(const char *what, const out3 *o) {
    test_checks++;
    if (memcmp(o->c1, o->c2, (size_t)o->n * kiln_dtype_size(o->t)) != 0) {
        test_failures++;
        fprintf(stderr, "  %s %s: two CPU runs differ\n", kiln_dtype_name(dt), what);
    }
}

/* Relative error by norm of the CPU result against the reference within tol, and both CPU
 * runs bit-identical. */
static void check_out(const char *what, const out3 *o, double tol) {
    float *c = widen(o->c1, o->n, o->t), *r = widen(o->r, o->n, o->t);
    report(what, test_rel_err(c, r, o->n), tol, "relative by norm");
    same_runs(what, o);
    free(c), free(r);
}

/* Elementwise: |cpu - ref| <= rel * max(|cpu|, |ref|) + abs for every element; the worst
 * element's excess is reported as a multiple of its bound. And the two CPU runs agree. */
static void check_elem(const char *what, const out3 *o, double rel, double abs) {
    float *c = widen(o->c1, o->n, o->t), *r = widen(o->r, o->n, o->t);
    double worst = 0;
    for (int64_t i = 0; i < o->n; i++) {
        double d = fabs((double)c[i] - r[i]);
        double bound = rel * fmax(fabs(c[i]), fabs(r[i])) + abs;
        double x = d == 0 ? 0 : bound > 0 ? d / bound : INFINITY;
        worst = x > worst ? x : worst;
    }
    report(what, worst, 1.0, "elementwise / bound");
    same_runs(what, o);
    free(c), free(r);
}

/* The CPU result equal to the reference's bit for bit. */
static void check_exact(const char *what, const out3 *o) {
    check_elem(what, o, 0, 0);
}

/* ---- model ops ---- */

static void test_encoder(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    int32_t *ids = rand_ids(N, s->V);
    ids[N - 1] = ids[0]; /* a repeated token */
    void *wte = rand_dt(s->V * C, 1.0f), *wpe = rand_dt(s->T * C, 1.0f);
    void *dout = rand_dt(N * C, 1.0f);
    out3 out = out3_init(N * C, dt, 0), dwte = out3_init(s->V * C, F32, 1),
         dwpe = out3_init(s->T * C, F32, 1);
    for (int k = 0; k < 3; k++)
        be_of(k)->encoder_forward(be_of(k), dt, at(&out, k), ids, wte, wpe, s->B, s->T, C);
    /* one fp32 addition rounded once: within one ulp of the dtype */
    check_elem("encoder_forward out", &out, TOL(0), 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->encoder_backward(be_of(k), dt, at(&dwte, k), at(&dwpe, k), dout, ids, s->B, s->T,
                                   C);
    check_out("encoder_backward dwte", &dwte, TOL_BWD); /* fp32 sums of dtype values */
    check_out("encoder_backward dwpe", &dwpe, TOL_BWD);
    free(ids), free(wte), free(wpe), free(dout);
    out3_free(&out), out3_free(&dwte), out3_free(&dwpe);
}

static void test_layernorm(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    float *x32 = randn(N * C, 2.0f);
    for (int64_t i = 0; i < N * C; i++)
        x32[i] += 3.0f; /* an offset, so the variance is not the mean square */
    void *inp = to_type(x32, N * C, dt), *w = rand_dt(C, 1.0f), *b = rand_dt(C, 1.0f);
    void *dout = rand_dt(N * C, 1.0f);
    out3 out = out3_init(N * C, dt, 0), mean = out3_init(N, F32, 0), rstd = out3_init(N, F32, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->layernorm_forward(be_of(k), dt, at(&out, k), at(&mean, k), at(&rstd, k), inp, w,
                                    b, N, C);
    check_out("layernorm_forward out", &out, TOL(TOL_FWD)); /* sums over C, then rounded */
    check_out("layernorm_forward mean", &mean, TOL_FWD);    /* fp32 */
    check_out("layernorm_forward rstd", &rstd, TOL_FWD);
    out3 dinp = out3_init(N * C, dt, 1), dw = out3_init(C, F32, 1), db = out3_init(C, F32, 1);
    for (int k = 0; k < 3; k++)
        be_of(k)->layernorm_backward(be_of(k), dt, at(&dinp, k), at(&dw, k), at(&db, k), dout, inp,
                                     w, mean.r, rstd.r, N, C);
    check_out("layernorm_backward dinp", &dinp, TOL(TOL_BWD)); /* += in fp32, rounded once */
    check_out("layernorm_backward dweight", &dw, TOL_BWD);
    check_out("layernorm_backward dbias", &db, TOL_BWD);

    /* fused residual + LayerNorm: res = a + b (one rounding), then as layernorm_forward */
    void *a2 = rand_dt(N * C, 1.0f);
    out3 res = out3_init(N * C, dt, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->residual_layernorm_forward(be_of(k), dt, at(&res, k), at(&out, k), at(&mean, k),
                                             at(&rstd, k), a2, inp, w, b, N, C);
    check_elem("residual_layernorm_forward res", &res, TOL(0), 0);
    check_out("residual_layernorm_forward out", &out, TOL(TOL_FWD));
    check_out("residual_layernorm_forward mean", &mean, TOL_FWD);
    check_out("residual_layernorm_forward rstd", &rstd, TOL_FWD);
    free(inp), free(w), free(b), free(dout), free(a2);
    out3_free(&out), out3_free(&mean), out3_free(&rstd), out3_free(&res);
    out3_free(&dinp), out3_free(&dw), out3_free(&db);
}

/* The Llama family's ops: RMSNorm (and fused with the residual add), rotary embeddings on a
 * grouped qkv (at position 0 and further on), SwiGLU, and the embedding without positions. */
static void test_llama_ops(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C, NH = s->NH, hs = C / NH, NKV = NH % 2 ? 1 : NH / 2;
    void *inp = rand_dt(N * C, 2.0f), *w = rand_dt(C, 1.0f), *dout = rand_dt(N * C, 1.0f);
    out3 out = out3_init(N * C, dt, 0), rstd = out3_init(N, F32, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->rmsnorm_forward(be_of(k), dt, at(&out, k), at(&rstd, k), inp, w, N, C, 1e-6f);
    check_out("rmsnorm_forward out", &out, TOL(TOL_FWD));
    check_out("rmsnorm_forward rstd", &rstd, TOL_FWD);
    out3 dinp = out3_init(N * C, dt, 1), dw = out3_init(C, F32, 1);
    for (int k = 0; k < 3; k++)
        be_of(k)->rmsnorm_backward(be_of(k), dt, at(&dinp, k), at(&dw, k), dout, inp, w, rstd.r,
                                   N, C);
    check_out("rmsnorm_backward dinp", &dinp, TOL(TOL_BWD));
    check_out("rmsnorm_backward dweight", &dw, TOL_BWD);
    void *a2 = rand_dt(N * C, 1.0f);
    out3 res = out3_init(N * C, dt, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->residual_rmsnorm_forward(be_of(k), dt, at(&res, k), at(&out, k), at(&rstd, k),
                                           a2, inp, w, N, C, 1e-5f);
    check_elem("residual_rmsnorm_forward res", &res, TOL(0), 0);
    check_out("residual_rmsnorm_forward out", &out, TOL(TOL_FWD));
    check_out("residual_rmsnorm_forward rstd", &rstd, TOL_FWD);

    /* rotary embeddings: in place, on copies of one qkv; positions from 0 and from 37 */
    int64_t W = (NH + 2 * NKV) * hs, nq = N * W;
    void *qkv = rand_dt(nq, 1.0f);
    for (int64_t pos0 = 0; pos0 <= 37; pos0 += 37) {
        out3 q = out3_init(nq, dt, 0), dq = out3_init(nq, dt, 0);
        for (int k = 0; k < 3; k++) {
            memcpy(at(&q, k), qkv, (size_t)nq * kiln_dtype_size(dt));
            memcpy(at(&dq, k), qkv, (size_t)nq * kiln_dtype_size(dt));
            be_of(k)->rope_forward(be_of(k), dt, at(&q, k), s->B, s->T, NH, NKV, hs, pos0,
                                   10000.0f);
            be_of(k)->rope_backward(be_of(k), dt, at(&dq, k), s->B, s->T, NH, NKV, hs, pos0,
                                    10000.0f);
        }
        check_out(pos0 ? "rope_forward (from position 37)" : "rope_forward", &q, TOL(TOL_FWD));
        check_out(pos0 ? "rope_backward (from position 37)" : "rope_backward", &dq, TOL(TOL_FWD));
        /* v is not touched */
        int same_v = 1;
        for (int64_t n = 0; n < N; n++)
            same_v &= memcmp((char *)q.c1 + (size_t)(n * W + (NH + NKV) * hs) * kiln_dtype_size(dt),
                             (char *)qkv + (size_t)(n * W + (NH + NKV) * hs) * kiln_dtype_size(dt),
                             (size_t)(NKV * hs) * kiln_dtype_size(dt)) == 0;
        CHECK_TRUE(same_v);
        out3_free(&q), out3_free(&dq);
    }

    /* SwiGLU over rows of [gate | up] */
    int64_t H = 2 * C + 1;
    void *gu = rand_dt(N * 2 * H, 3.0f), *dy = rand_dt(N * H, 1.0f);
    out3 sw = out3_init(N * H, dt, 0), dsw = out3_init(N * 2 * H, dt, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->swiglu_forward(be_of(k), dt, at(&sw, k), gu, N, H);
    check_out("swiglu_forward", &sw, TOL(TOL_FWD));
    for (int k = 0; k < 3; k++)
        be_of(k)->swiglu_backward(be_of(k), dt, at(&dsw, k), gu, dy, N, H);
    check_out("swiglu_backward", &dsw, TOL(TOL_BWD));

    /* the embedding with no position embedding, and its backward into wte alone */
    int32_t *ids = rand_ids(N, s->V);
    void *wte = rand_dt(s->V * C, 1.0f);
    out3 emb = out3_init(N * C, dt, 0), dwte = out3_init(s->V * C, F32, 1);
    for (int k = 0; k < 3; k++) {
        be_of(k)->encoder_forward(be_of(k), dt, at(&emb, k), ids, wte, NULL, s->B, s->T, C);
        be_of(k)->encoder_backward(be_of(k), dt, at(&dwte, k), NULL, dout, ids, s->B, s->T, C);
    }
    check_elem("encoder_forward without positions", &emb, TOL(0), 0);
    check_out("encoder_backward into wte alone", &dwte, TOL_BWD);
    free(inp), free(w), free(dout), free(a2), free(qkv), free(gu), free(dy), free(ids), free(wte);
    out3_free(&out), out3_free(&rstd), out3_free(&dinp), out3_free(&dw), out3_free(&res);
    out3_free(&sw), out3_free(&dsw), out3_free(&emb), out3_free(&dwte);
}

/* |x| of n values of type t, as fp32. */
static float *abs32(const void *x, int64_t n, kiln_dtype t) {
    float *y = widen(x, n, t);
    for (int64_t i = 0; i < n; i++)
        y[i] = fabsf(y[i]);
    return y;
}

/* The rounding of the CPU's bf16/fp16 matmul_forward with a bias, which rounds the product
 * to the dtype and then adds the bias and rounds again (cpu_matmul.c; reported): up to u|p|
 * more than one rounding, p the product. 0 when that is fixed. */
#define MATMUL_BIAS_DOUBLE_ROUNDING 0

/* Elementwise bound for a product of K terms (a matrix product in fp32 or a dtype, whose
 * products of two dtype values are exact in fp32): any order of fp32 summation is within
 * gamma = (K + 2) u32 of the exact sum relative to the sum of the terms' magnitudes S (plus
 * the magnitude of what it is added to), and the output is then rounded once to the dtype:
 * |cpu - ref| <= gamma S + 2u max(|cpu|, |ref|) (+ extra, per element). */
static void check_product(const char *what, const out3 *o, const float *S, int64_t K,
                          const float *extra) {
    float *c = widen(o->c1, o->n, o->t), *r = widen(o->r, o->n, o->t);
    double gamma = (double)(K + 2) * 0x1p-24,
           two_u = o->t == F32 ? 0 : 2 * kiln_dtype_epsilon(o->t);
    double worst = 0;
    for (int64_t i = 0; i < o->n; i++) {
        double d = fabs((double)c[i] - r[i]);
        double bound = gamma * S[i] + two_u * fmax(fabs(c[i]), fabs(r[i])) + (extra ? extra[i] : 0);
        double x = d == 0 ? 0 : bound > 0 ? d / bound : INFINITY;
        worst = x > worst ? x : worst;
    }
    report(what, worst, 1.0, "elementwise / bound");
    free(c), free(r);
}

static void matmul_case(int64_t N, int64_t C, int64_t OC, int trans_w, int with_bias,
                        int with_dinp) {
    void *inp = rand_dt(N * C, 1.0f), *w = rand_dt(C * OC, 0.1f), *bias = rand_dt(OC, 1.0f);
    void *dout = rand_dt(N * OC, 1.0f);
    const void *b = with_bias ? bias : NULL;
    /* the sums of the terms' magnitudes, for the elementwise bounds: the reference's products
     * of |inp|, |w|, |bias|, |dout| in fp32 (it sums in double) */
    float *ai = abs32(inp, N * C, dt), *aw = abs32(w, C * OC, dt), *ab = abs32(bias, OC, dt);
    float *ad = abs32(dout, N * OC, dt);
    float *S_out = randn(N * OC, 0), *S_dinp = randn(N * C, 0);
    ref->matmul_forward(ref, F32, S_out, ai, aw, with_bias ? ab : NULL, N, C, OC, trans_w, NULL);
    out3 out = out3_init(N * OC, dt, 0), act = out3_init(N * OC, dt, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->matmul_forward(be_of(k), dt, at(&out, k), inp, w, b, N, C, OC, trans_w, NULL);
    /* K = C exact products summed in fp32 (or double), then rounded once (top of file) */
    const char *name = trans_w ? "matmul_forward (trans_w) out" : "matmul_forward out";
    check_out(name, &out, TOL(TOL_FWD));
    float *extra = NULL;
    if (MATMUL_BIAS_DOUBLE_ROUNDING && with_bias && dt != F32) {
        float *r = widen(out.r, N * OC, dt);
        extra = malloc((size_t)(N * OC) * sizeof(float));
        float *bw = widen(bias, OC, dt);
        for (int64_t i = 0; i < N * OC; i++)
            extra[i] = (float)(kiln_dtype_epsilon(dt) * fabs((double)r[i] - bw[i % OC])); /* u|p| */
        free(r), free(bw);
    }
    check_product(name, &out, S_out, C, extra);
    free(extra);
    /* with GELU fused: the same pre-activation, and GELU of it */
    for (int k = 0; k < 3; k++)
        be_of(k)->matmul_forward(be_of(k), dt, at(&out, k), inp, w, b, N, C, OC, trans_w,
                                 at(&act, k));
    check_out("matmul_forward+gelu out", &out, TOL(TOL_FWD));
    check_out("matmul_forward+gelu gelu_out", &act, TOL(TOL_FWD));
    out3 dinp = out3_init(N * C, dt, 0), dw = out3_init(C * OC, F32, 1), db = out3_init(OC, F32, 1);
    /* the magnitudes for the backward: dweight and dbias add to what they hold */
    float *S_dw = abs32(dw.r, C * OC, F32), *S_db = abs32(db.r, OC, F32);
    ref->matmul_backward(ref, F32, S_dinp, S_dw, S_db, ad, ai, aw, N, C, OC, trans_w);
    for (int k = 0; k < 3; k++)
        be_of(k)->matmul_backward(be_of(k), dt, with_dinp ? at(&dinp, k) : NULL, at(&dw, k),
                                  with_bias ? at(&db, k) : NULL, dout, inp, w, N, C, OC, trans_w);
    if (with_dinp) {
        check_out("matmul_backward dinp", &dinp, TOL(TOL_BWD));
        check_product("matmul_backward dinp", &dinp, S_dinp, OC, NULL);
    } else { /* untouched */
        CHECK_TRUE(memcmp(dinp.r, dinp.c1, (size_t)N * C * kiln_dtype_size(dt)) == 0);
    }
    check_out("matmul_backward dweight", &dw, TOL_BWD);
    check_product("matmul_backward dweight", &dw, S_dw, N, NULL);
    check_out("matmul_backward dbias", &db, TOL_BWD); /* untouched when with_bias == 0 */
    check_product("matmul_backward dbias", &db, S_db, N, NULL);
    free(inp), free(w), free(bias), free(dout), free(ai), free(aw), free(ab), free(ad);
    free(S_out), free(S_dinp), free(S_dw), free(S_db);
    out3_free(&out), out3_free(&act), out3_free(&dinp), out3_free(&dw), out3_free(&db);
}

static void test_matmul(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    matmul_case(N, C, 3 * C, 0, 1, 1); /* qkv projection */
    matmul_case(N, 4 * C, C, 0, 1, 1); /* MLP down projection */
    matmul_case(N, C, s->Vp, 1, 0, 1); /* output head, tied to wte (Vp,C) */
    matmul_case(N, C, 3 * C, 1, 1, 0); /* trans_w with bias, no dinp */
    matmul_case(N, C, 3 * C, 0, 0, 0); /* no bias, no dinp */
}

/* What forward keeps (`saved`) is each backend's own business: each backend's backward gets
 * what its own forward saved, in buffers of the sizes it reports. */
static void test_attention(const sizes *s, int64_t NKV) {
    int64_t B = s->B, T = s->T, C = s->C, NH = s->NH, W = C + 2 * NKV * (C / NH);
    void *qkv = rand_dt(B * T * W, 1.0f), *dout = rand_dt(B * T * C, 1.0f);
    out3 out = out3_init(B * T * C, dt, 0), dqkv = out3_init(B * T * W, dt, 0);
    void *saved[3], *scratch[3];
    for (int k = 0; k < 3; k++) {
        kiln_backend *be = be_of(k);
        saved[k] = be->alloc(be, be->attention_saved_bytes(be, dt, B, T, C, NH, NKV));
        scratch[k] = be->alloc(be, be->attention_scratch_bytes(be, dt, B, T, C, NH, NKV));
        CHECK_TRUE(saved[k] && scratch[k]);
    }
    for (int k = 0; k < 3 && saved[k] && scratch[k]; k++)
        be_of(k)->attention_forward(be_of(k), dt, at(&out, k), saved[k], scratch[k], qkv, B, T, C,
                                    NH, NKV);
    check_out("attention_forward out", &out, TOL(TOL_FWD));
    for (int k = 0; k < 3 && saved[k] && scratch[k]; k++)
        be_of(k)->attention_backward(be_of(k), dt, at(&dqkv, k), scratch[k], dout, qkv, saved[k], B,
                                     T, C, NH, NKV);
    check_out("attention_backward dqkv", &dqkv, TOL(TOL_BWD));
    for (int k = 0; k < 3; k++)
        be_of(k)->free(be_of(k), saved[k]), be_of(k)->free(be_of(k), scratch[k]);
    free(qkv), free(dout);
    out3_free(&out), out3_free(&dqkv);
}

static void test_pointwise(const sizes *s) {
    int64_t n = s->B * s->T * 4 * s->C + 3;
    float *x32 = randn(n, 3.0f);
    x32[0] = 0.0f, x32[1] = 12.0f, x32[2] = -12.0f, x32[3] = 50.0f, x32[4] = -50.0f;
    void *inp = to_type(x32, n, dt), *b = rand_dt(n, 1.0f), *dout = rand_dt(n, 1.0f);
    out3 out = out3_init(n, dt, 0), dinp = out3_init(n, dt, 0), res = out3_init(n, dt, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->gelu_forward(be_of(k), dt, at(&out, k), inp, n);
    /* Elementwise, the tails of GELU included: one ulp of the dtype, and 2e-6 absolute for
     * the two fp32 formulas (the reference's 0.5 x (1 + tanh u) loses digits below x = -3,
     * where 1 + tanh u nears fp32's spacing of 6e-8 at 1: at most about 0.5 |x| 6e-8, under
     * 2e-6 for |x| <= 50; the CPU's x sigmoid(2u) does not) */
    check_elem("gelu_forward", &out, TOL(4 * 0x1p-24), 2e-6);
    for (int k = 0; k < 3; k++)
        be_of(k)->gelu_backward(be_of(k), dt, at(&dinp, k), inp, dout, n);
    check_out("gelu_backward", &dinp, TOL(TOL_BWD));
    for (int k = 0; k < 3; k++)
        be_of(k)->residual_forward(be_of(k), dt, at(&res, k), inp, b, n);
    check_elem("residual_forward", &res, TOL(0), 0); /* one fp32 addition, rounded once */
    free(inp), free(b), free(dout);
    out3_free(&out), out3_free(&dinp), out3_free(&res);
}

static void test_crossentropy(const sizes *s) {
    int64_t N = s->B * s->T, V = s->V, Vp = s->Vp;
    size_t e = kiln_dtype_size(dt);
    float *l32 = randn(N * Vp, 4.0f);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = V; i < Vp; i++)
            l32[n * Vp + i] = 1e4f; /* padding must not take part */
    void *logits = to_type(l32, N * Vp, dt);
    int32_t *targets = rand_ids(N, V);
    targets[0] = 0, targets[N - 1] = (int32_t)(V - 1);
    const float dloss = 1.0f / (float)N;
    out3 losses = out3_init(N, F32, 0), dl = out3_init(N * Vp, dt, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->crossentropy_forward_backward(be_of(k), dt, at(&losses, k), at(&dl, k), logits,
                                                targets, dloss, N, V, Vp);
    check_out("crossentropy losses", &losses, TOL_FWD); /* fp32 from the same logits */
    check_out("crossentropy dlogits", &dl, TOL(TOL_BWD));
    /* in place on the logits: the same losses and gradient */
    void *inplace = dup_bytes(logits, (size_t)(N * Vp) * e);
    float *losses2 = randn(N, 1.0f);
    cpu->crossentropy_forward_backward(cpu, dt, losses2, inplace, inplace, targets, dloss, N, V,
                                       Vp);
    CHECK_TRUE(memcmp(inplace, dl.c1, (size_t)(N * Vp) * e) == 0);
    CHECK_TRUE(memcmp(losses2, losses.c1, (size_t)N * sizeof(float)) == 0);
    /* loss only */
    out3 lossonly = out3_init(N, F32, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->crossentropy_forward_backward(be_of(k), dt, at(&lossonly, k), NULL, logits,
                                                targets, dloss, N, V, Vp);
    check_out("crossentropy losses (no dlogits)", &lossonly, TOL_FWD);
    free(logits), free(targets), free(inplace), free(losses2);
    out3_free(&losses), out3_free(&dl), out3_free(&lossonly);
}

/* ---- fused ops against their unfused compositions, on the CPU: the same bits ---- */

static int same_bytes(const void *a, const void *b, size_t n, const char *what) {
    int same = memcmp(a, b, n) == 0;
    if (!same)
        fprintf(stderr, "  %s %s: fused and unfused differ\n", kiln_dtype_name(dt), what);
    return same;
}

static void test_fusions(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    size_t e = kiln_dtype_size(dt), nc = (size_t)(N * C) * e, nf = (size_t)N * sizeof(float);
    void *a = rand_dt(N * C, 1.0f), *b = rand_dt(N * C, 2.0f), *w = rand_dt(C, 1.0f);
    void *bias = rand_dt(C, 1.0f);
    void *res1 = malloc(nc), *out1 = malloc(nc), *res2 = malloc(nc), *out2 = malloc(nc);
    float *m1 = malloc(nf), *r1 = malloc(nf), *m2 = malloc(nf), *r2 = malloc(nf);
    cpu->residual_layernorm_forward(cpu, dt, res1, out1, m1, r1, a, b, w, bias, N, C);
    cpu->residual_forward(cpu, dt, res2, a, b, N * C);
    cpu->layernorm_forward(cpu, dt, out2, m2, r2, res2, w, bias, N, C);
    CHECK_TRUE(same_bytes(res1, res2, nc, "residual_layernorm res"));
    CHECK_TRUE(same_bytes(out1, out2, nc, "residual_layernorm out"));
    CHECK_TRUE(same_bytes(m1, m2, nf, "residual_layernorm mean") &&
               same_bytes(r1, r2, nf, "residual_layernorm rstd"));
    /* in place (res the same pointer as a), as the model calls it */
    memcpy(res1, a, nc);
    cpu->residual_layernorm_forward(cpu, dt, res1, out1, m1, r1, res1, b, w, bias, N, C);
    CHECK_TRUE(same_bytes(res1, res2, nc, "residual_layernorm res (in place)"));
    CHECK_TRUE(same_bytes(out1, out2, nc, "residual_layernorm out (in place)"));

    /* matmul with GELU fused: out the pre-activation, gelu_out GELU of it */
    int64_t OC = 4 * C;
    void *x = rand_dt(N * C, 1.0f), *W = rand_dt(C * OC, 0.1f), *bb = rand_dt(OC, 1.0f);
    size_t no = (size_t)(N * OC) * e;
    void *pre1 = malloc(no), *act1 = malloc(no), *pre2 = malloc(no), *act2 = malloc(no);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (int trans_w = 0; trans_w < 2; trans_w++) {
            const void *bp = with_bias ? bb : NULL;
            cpu->matmul_forward(cpu, dt, pre1, x, W, bp, N, C, OC, trans_w, act1);
            cpu->matmul_forward(cpu, dt, pre2, x, W, bp, N, C, OC, trans_w, NULL);
            cpu->gelu_forward(cpu, dt, act2, pre2, N * OC);
            CHECK_TRUE(same_bytes(pre1, pre2, no, "matmul+gelu pre-activation"));
            CHECK_TRUE(same_bytes(act1, act2, no, "matmul+gelu activation"));
        }
    }
    free(a), free(b), free(w), free(bias), free(res1), free(out1), free(res2), free(out2);
    free(m1), free(r1), free(m2), free(r2), free(x), free(W), free(bb);
    free(pre1), free(act1), free(pre2), free(act2);
}

/* ---- optimizer updates (fp32 parameters and state) ---- */

/* Give the CPU copies the reference's state, so that each update starts from the same
 * values. */
static void sync(out3 *o) {
    memcpy(o->c1, o->r, (size_t)o->n * sizeof(float));
    memcpy(o->c2, o->r, (size_t)o->n * sizeof(float));
}

/* An update is small next to the parameter, so compare the steps p_new - p_old. */
static void check_step(const char *what, const out3 *p, const float *before, double tol) {
    out3 d = out3_init(p->n, F32, 0);
    float *dr = d.r, *d1 = d.c1, *d2 = d.c2;
    const float *pr = p->r, *p1 = p->c1, *p2 = p->c2;
    for (int64_t i = 0; i < p->n; i++) {
        dr[i] = pr[i] - before[i];
        d1[i] = p1[i] - before[i];
        d2[i] = p2[i] - before[i];
    }
    check_out(what, &d, tol);
    out3_free(&d);
}

/* The optimizer kernels' state, the reference's in .r. */
typedef struct {
    int64_t n;
    float *g, *p0;
    out3 p, m, v, buf, sq;
} opt_state;

static void opt_sync(opt_state *s) {
    sync(&s->p), sync(&s->m), sync(&s->v), sync(&s->buf), sync(&s->sq);
    memcpy(s->p0, s->p.r, (size_t)s->n * sizeof(float));
}

/* One of the five update calls below on backend k, with working copy w (may be NULL). */
static void opt_call(int which, opt_state *s, int k, const kiln_work_out *w, int64_t i0,
                     int64_t cnt) {
    kiln_backend *be = be_of(k);
    float *p = (float *)at(&s->p, k) + i0, *m = (float *)at(&s->m, k) + i0;
    float *v = (float *)at(&s->v, k) + i0, *buf = (float *)at(&s->buf, k) + i0;
    float *sq = (float *)at(&s->sq, k) + i0;
    const float *g = s->g + i0;
    switch (which) {
    case 0: /* AdamW */
        be->adam_update(be, p, w, g, 1.0f, m, v, cnt, 1e-3f, 0.9f, 0.95f, 0.3f, 0.2f, 1e-8f, 0.1f, 0.0f);
        break;
    case 1: /* Adam with L2 */
        be->adam_update(be, p, w, g, 1.0f, m, v, cnt, 1e-2f, 0.8f, 0.99f, 0.5f, 0.1f, 1e-6f, 0.0f, 0.01f);
        break;
    case 2: /* SGD, momentum with dampening */
        be->sgd_update(be, p, w, g, 1.0f, buf, cnt, 0.1f, 0.9f, 0.3f, 0, 0.01f, 0);
        break;
    case 3: /* SGD Nesterov */
        be->sgd_update(be, p, w, g, 1.0f, buf, cnt, 0.1f, 0.9f, 0.0f, 1, 0.0f, 0);
        break;
    case 4: /* RMSprop with momentum */
        be->rmsprop_update(be, p, w, g, 1.0f, sq, buf, cnt, 1e-2f, 0.9f, 1e-8f, 0.0f, 0.5f);
        break;
    }
}

static const char *const opt_names[5] = {"adamw", "adam (l2)", "sgd dampening", "sgd nesterov",
                                         "rmsprop (momentum)"};

/* The gradient scale an update takes is one fp32 multiply of g: the same bits as the update
 * of gradients scaled beforehand, for every kernel on both backends. */
static void test_grad_scale(void) {
    enum { N = 1003 };
    float *g = randn(N, 1.0f), *gs = malloc(N * sizeof(float)), *p0 = randn(N, 0);
    const float scale = 0.37f;
    for (int64_t i = 0; i < N; i++)
        gs[i] = g[i] * scale;
    kiln_backend *bes[2] = {kiln_backend_ref(), kiln_backend_cpu()};
    for (int k = 0; k < 2; k++) {
        kiln_backend *be = bes[k];
        for (int which = 0; which < 3; which++) {
            float *p[2], *a[2], *b[2];
            for (int r = 0; r < 2; r++) {
                p[r] = malloc(N * sizeof(float)), a[r] = calloc(N, sizeof(float));
                b[r] = calloc(N, sizeof(float));
                memcpy(p[r], p0, N * sizeof(float));
            }
            for (int t = 0; t < 2; t++)
                for (int r = 0; r < 2; r++) {
                    const float *gg = r ? gs : g;
                    float sc = r ? 1.0f : scale;
                    if (which == 0)
                        be->adam_update(be, p[r], NULL, gg, sc, a[r], b[r], N, 1e-2f, 0.9f, 0.95f,
                                        0.5f, 0.3f, 1e-8f, 0.1f, 0.0f);
                    else if (which == 1)
                        be->sgd_update(be, p[r], NULL, gg, sc, a[r], N, 0.1f, 0.9f, 0.0f, 1, 0.01f,
                                       t == 0);
                    else
                        be->rmsprop_update(be, p[r], NULL, gg, sc, a[r], b[r], N, 1e-2f, 0.9f,
                                           1e-8f, 0.01f, 0.5f);
                }
            if (memcmp(p[0], p[1], N * sizeof(float)) != 0)
                fprintf(stderr, "%s: kernel %d with gradient scale differs from pre-scaled\n",
                        be->name, which);
            CHECK_TRUE(memcmp(p[0], p[1], N * sizeof(float)) == 0);
            for (int r = 0; r < 2; r++)
                free(p[r]), free(a[r]), free(b[r]);
        }
    }
    free(g), free(gs), free(p0);
}

static void test_optimizers(int64_t n) {
    dt = F32;
    opt_state s = {.n = n, .g = randn(n, 1.0f), .p0 = randn(n, 0)};
    s.p = out3_init(n, F32, 1), s.m = out3_init(n, F32, 1), s.v = out3_init(n, F32, 1);
    s.buf = out3_init(n, F32, 1), s.sq = out3_init(n, F32, 1);
    float *v = s.v.r, *sq = s.sq.r;
    for (int64_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]) * 1e-3f, sq[i] = fabsf(sq[i]);
    for (int which = 0; which < 5; which++) {
        opt_sync(&s);
        for (int k = 0; k < 3; k++)
            opt_call(which, &s, k, NULL, 0, n);
        char what[64];
        snprintf(what, sizeof what, "%s step", opt_names[which]);
        check_step(what, &s.p, s.p0, TOL_FWD);
        snprintf(what, sizeof what, "%s state", opt_names[which]);
        check_out(what, which < 2 ? &s.m : which < 4 ? &s.buf : &s.sq, TOL_FWD);
        if (which < 2)
            check_out("adam v", &s.v, TOL_FWD);
    }
    /* plain SGD and first steps */
    opt_sync(&s);
    for (int k = 0; k < 3; k++)
        be_of(k)->sgd_update(be_of(k), at(&s.p, k), NULL, s.g, 1.0f, NULL, n, 0.1f, 0.0f, 0.0f, 0, 0.01f,
                             1);
    check_step("sgd plain step", &s.p, s.p0, TOL_FWD);
    opt_sync(&s);
    for (int k = 0; k < 3; k++)
        be_of(k)->sgd_update(be_of(k), at(&s.p, k), NULL, s.g, 1.0f, at(&s.buf, k), n, 0.1f, 0.9f, 0.0f,
                             0, 0.01f, 1);
    check_step("sgd first step", &s.p, s.p0, TOL_FWD);
    check_out("sgd first buf", &s.buf, TOL_FWD);
    opt_sync(&s);
    for (int k = 0; k < 3; k++)
        be_of(k)->rmsprop_update(be_of(k), at(&s.p, k), NULL, s.g, 1.0f, at(&s.sq, k), NULL, n, 1e-2f,
                                 0.99f, 1e-8f, 0.01f, 0.0f);
    check_step("rmsprop step", &s.p, s.p0, TOL_FWD);
    check_out("rmsprop sq", &s.sq, TOL_FWD);

    /* Working copies. Each backend's copy is its own fp32 result rounded to the copy's
     * dtype: to nearest even (the same bits as kiln_convert), or for bf16 with a seed
     * stochastically with the 16 bits kiln__round_bits(seed, index0 + i), so one of the two
     * bf16 neighbours of the fp32 value and the same for any split of the slab and any
     * thread count. index0 is not 0, as for a range inside a slab. */
    const int64_t index0 = 1000;
    const uint64_t seed = 0xfeedbeef;
    for (int which = 0; which < 5; which++) {
        for (int wt = 0; wt < 4; wt++) {
            kiln_dtype wd = wt == 3 ? KILN_DTYPE_BF16 : (kiln_dtype)wt;
            uint64_t rs = wt == 3 ? seed : 0;
            out3 work = out3_init(n, wd, 0);
            opt_sync(&s);
            for (int k = 0; k < 3; k++) {
                kiln_work_out w = {at(&work, k), wd, rs, index0};
                opt_call(which, &s, k, &w, 0, n);
            }
            int bad_round = 0, not_neighbour = 0, not_nearest = 0;
            for (int k = 0; k < 2; k++) {
                const float *p = at(&s.p, k);
                const uint16_t *h = at(&work, k);
                for (int64_t i = 0; i < n; i++) {
                    uint32_t u = kiln__bits(p[i]);
                    if (wd == F32) {
                        bad_round += ((const uint32_t *)at(&work, k))[i] != u;
                    } else if (!rs) {
                        uint16_t want =
                            wd == KILN_DTYPE_BF16 ? kiln_f32_to_bf16(p[i]) : kiln_f32_to_f16(p[i]);
                        bad_round += h[i] != want;
                    } else {
                        uint32_t bits = kiln__round_bits(rs, index0 + i);
                        bad_round += h[i] != kiln_f32_to_bf16_stochastic(p[i], bits);
                        uint16_t down = (uint16_t)(u >> 16), up = (u & 0xffff) ? down + 1 : down;
                        not_neighbour += h[i] != down && h[i] != up;
                        not_nearest += h[i] != kiln_f32_to_bf16(p[i]);
                    }
                }
            }
            if (bad_round || not_neighbour)
                fprintf(stderr, "  %s, working copy %s%s: %d wrong, %d not neighbours\n",
                        opt_names[which], kiln_dtype_name(wd), rs ? " stochastic" : "", bad_round,
                        not_neighbour);
            CHECK_INT_EQ(bad_round, 0);
            CHECK_INT_EQ(not_neighbour, 0);
            /* a value a fraction f of the way to its upper neighbour goes to the farther one
             * with probability min(f, 1 - f): about a quarter of them, n / 2 of both
             * backends' 2n */
            if (rs)
                CHECK_TRUE(not_nearest > n / 4);
            same_runs("working copy", &work);
            out3_free(&work);
        }
    }
    /* The same bits for 1 and 2 threads, and for a slab split into two ranges at an
     * arbitrary point (the vector bodies and the scalar tails round alike), every kernel. */
    int threads = omp_get_max_threads();
    for (int which = 0; which < 5; which++) {
        out3 work = out3_init(n, KILN_DTYPE_BF16, 0);
        opt_sync(&s);
        for (int k = 1; k < 3; k++) {
            omp_set_num_threads(k);
            kiln_work_out w = {at(&work, k), KILN_DTYPE_BF16, seed, index0};
            opt_call(which, &s, k, &w, 0, n);
        }
        omp_set_num_threads(threads);
        CHECK_TRUE(memcmp(s.p.c1, s.p.c2, (size_t)n * sizeof(float)) == 0);
        same_runs("working copy, 1 and 2 threads", &work);
        out3_free(&work);
    }
    for (int which = 0; which < 5; which++) {
        out3 work = out3_init(n, KILN_DTYPE_BF16, 0);
        int64_t cut = n / 3 + 5;
        opt_sync(&s);
        kiln_work_out w1 = {work.c1, KILN_DTYPE_BF16, seed, index0};
        opt_call(which, &s, 1, &w1, 0, n);
        kiln_work_out a = {work.c2, KILN_DTYPE_BF16, seed, index0};
        kiln_work_out b = {(uint16_t *)work.c2 + cut, KILN_DTYPE_BF16, seed, index0 + cut};
        opt_call(which, &s, 2, &a, 0, cut);
        opt_call(which, &s, 2, &b, cut, n - cut);
        CHECK_TRUE(memcmp(s.p.c1, s.p.c2, (size_t)n * sizeof(float)) == 0);
        same_runs("working copy, two ranges", &work);
        out3_free(&work);
    }
    free(s.g), free(s.p0);
    out3_free(&s.p), out3_free(&s.m), out3_free(&s.v), out3_free(&s.buf), out3_free(&s.sq);
}

/* ---- reductions, slabs, conversions, memory, errors ---- */

static void test_reductions(int64_t n) {
    /* sumsq: close to the reference's sequential double sum (both sum squares of the same
     * dtype values in double), and the same bits whatever the thread count */
    float *x = randn(n, 1.0f);
    int threads = omp_get_max_threads();
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) {
        dt = (kiln_dtype)t;
        void *xd = to_type(randn(n, 1.0f), n, dt);
        double want = ref->sumsq(ref, dt, xd, n), got = cpu->sumsq(cpu, dt, xd, n);
        CHECK_NEAR(got, want, 1e-12);
        omp_set_num_threads(1);
        double one = cpu->sumsq(cpu, dt, xd, n);
        omp_set_num_threads(3);
        double three = cpu->sumsq(cpu, dt, xd, n);
        omp_set_num_threads(threads);
        CHECK_TRUE(one == got && three == got);
        free(xd);
    }
    dt = F32;
    /* sum: the same bits whatever the thread count, small (one thread) and large */
    const int64_t sizes_[2] = {37, n};
    for (int i = 0; i < 2; i++) {
        double want = ref->sum(ref, x, sizes_[i]), got = cpu->sum(cpu, x, sizes_[i]);
        CHECK_NEAR(got, want, 1e-12);
        omp_set_num_threads(1);
        double one = cpu->sum(cpu, x, sizes_[i]);
        omp_set_num_threads(3);
        double three = cpu->sum(cpu, x, sizes_[i]);
        omp_set_num_threads(threads);
        CHECK_TRUE(one == got && three == got);
    }
    /* scale */
    out3 p = out3_init(n, F32, 1);
    for (int k = 0; k < 3; k++)
        be_of(k)->scale(be_of(k), at(&p, k), 0.37f, n);
    check_exact("scale", &p);
    /* zero takes bytes: an odd range that starts and ends inside floats */
    size_t bytes = (size_t)n * sizeof(float);
    unsigned char *z[3];
    for (int k = 0; k < 3; k++) {
        z[k] = malloc(bytes);
        memset(z[k], 0xa5, bytes);
        be_of(k)->zero(be_of(k), z[k] + 3, bytes - 8);
    }
    CHECK_TRUE(memcmp(z[0], z[1], bytes) == 0 && memcmp(z[1], z[2], bytes) == 0);
    CHECK_TRUE(z[1][2] == 0xa5 && z[1][3] == 0 && z[1][bytes - 6] == 0 && z[1][bytes - 5] == 0xa5);
    for (int k = 0; k < 3; k++)
        be_of(k)->zero(be_of(k), z[k], 0); /* nothing */
    CHECK_TRUE(z[1][0] == 0xa5);
    for (int k = 0; k < 3; k++)
        free(z[k]);
    out3_free(&p);
    free(x);
}

/* convert: every pair of dtypes, the bits of kiln_convert on both backends. */
static void test_convert(int64_t n) {
    float *x = randn(n, 10.0f);
    x[0] = 1e6f, x[1] = -1e-6f, x[2] = 0.0f, x[3] = 70000.0f; /* fp16: 70000 -> inf */
    for (int s = 0; s < KILN_DTYPE_COUNT; s++) {
        kiln_dtype st = (kiln_dtype)s;
        void *src = malloc((size_t)n * kiln_dtype_size(st));
        kiln_convert(src, st, x, F32, n);
        for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
            kiln_dtype dd = (kiln_dtype)d;
            size_t bytes = (size_t)n * kiln_dtype_size(dd);
            void *want = malloc(bytes), *r = malloc(bytes), *c = malloc(bytes);
            kiln_convert(want, dd, src, st, n);
            ref->convert(ref, r, dd, src, st, n);
            cpu->convert(cpu, c, dd, src, st, n);
            CHECK_TRUE(memcmp(want, r, bytes) == 0 && memcmp(want, c, bytes) == 0);
            free(want), free(r), free(c);
        }
        free(src);
    }
    free(x);
}

static void test_memory_and_errors(kiln_backend *be) {
    size_t sizes_[3] = {0, 1, 1000003};
    for (int i = 0; i < 3; i++) {
        unsigned char *p = be->alloc(be, sizes_[i]);
        CHECK_TRUE(p != NULL && (uintptr_t)p % 64 == 0);
        if (!p)
            continue;
        int zero = 1;
        for (size_t k = 0; k < sizes_[i]; k++)
            zero &= p[k] == 0;
        CHECK_TRUE(zero);
        be->free(be, p);
    }
    be->free(be, NULL);
    float host[5] = {1, 2, 3, 4, 5}, back[5] = {0};
    float *d1 = be->alloc(be, sizeof host), *d2 = be->alloc(be, sizeof host);
    CHECK_TRUE(d1 && d2);
    if (d1 && d2) {
        be->copy(be, d1, host, sizeof host, KILN_COPY_TO_DEVICE);
        be->copy(be, d2, d1, sizeof host, KILN_COPY_ON_DEVICE);
        be->copy(be, back, d2, sizeof host, KILN_COPY_TO_HOST);
        CHECK_OK(be->synchronize(be));
        CHECK_TRUE(memcmp(back, host, sizeof host) == 0);
    }
    be->free(be, d1), be->free(be, d2);
    /* a recorded error comes back from synchronize with its message, once */
    CHECK_INT_EQ(kiln_backend_error(be), KILN_OK);
    CHECK_STATUS(kiln_backend_fail(be, KILN_ERR_INTERNAL, "device %d fell over", 3),
                 KILN_ERR_INTERNAL);
    kiln_backend_fail(be, KILN_ERR_NOMEM, "a second error"); /* dropped: the first is kept */
    CHECK_INT_EQ(kiln_backend_error(be), KILN_ERR_INTERNAL);
    CHECK_STATUS(be->synchronize(be), KILN_ERR_INTERNAL);
    CHECK_TRUE(strstr(kiln_error_message(), "device 3 fell over") != NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "second") == NULL);
    CHECK_INT_EQ(kiln_backend_error(be), KILN_OK);
    CHECK_OK(be->synchronize(be));
}

/* kiln_backend_cpu_peak_gflops(256, ...) is the best rate of timed 256^3 sgemm products
 * (2 x 256^3 FLOPs each). Measured here the same way, through the CPU backend's matmul, its
 * figure must agree within a factor of 1.4: a wrong FLOP count (a factor of 2), a figure
 * from nothing (1.0, 0) or from another size would be outside. On shared cores a single
 * product takes anything from 0.13 ms to 25 ms, so the two measurements are interleaved
 * finely (the best of each then sees the same quiet moments), and up to three attempts
 * are made before the figures are called different. */
static void test_peak(void) {
    int64_t n = 256;
    float *a = randn(n * n, 0.1f), *w = randn(n * n, 0.1f), *o = randn(n * n, 1.0f);
    double peak = 0, here = 0, ratio = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        peak = here = 0;
        double start = kiln_time_ms();
        for (int it = 0; it < 50 || kiln_time_ms() - start < 300; it++) {
            double p = kiln_backend_cpu_peak_gflops(n, 0.0005);
            peak = p > peak ? p : peak;
            for (int rep = 0; rep < 2; rep++) {
                double t0 = kiln_time_ms();
                cpu->matmul_forward(cpu, F32, o, a, w, NULL, n, n, n, 0, NULL);
                double ms = kiln_time_ms() - t0, g = 2.0 * (double)(n * n * n) / (ms * 1e6);
                here = ms > 0 && g > here ? g : here;
            }
        }
        ratio = here > 0 ? peak / here : 0;
        fprintf(stderr, "  peak: kiln %.1f GFLOP/s, measured here %.1f (ratio %.2f)\n", peak, here,
                ratio);
        if (ratio > 1 / 1.4 && ratio < 1.4)
            break;
    }
    CHECK_TRUE(here > 0);
    CHECK_TRUE(ratio > 1 / 1.4 && ratio < 1.4);
    free(a), free(w), free(o);
}

int main(void) {
    kiln_rng_seed(&rng, 42);
    ref = kiln_backend_ref();
    cpu = kiln_backend_cpu();
    CHECK_STR_EQ(ref->name, "ref");
    CHECK_STR_EQ(cpu->name, "cpu");
    /* Every op of the list is in both tables (the list is the interface, written once). */
#define HAS_OP(b, op)                                                                              \
    if (!(b)->op)                                                                                  \
        fprintf(stderr, "%s has no %s\n", (b)->name, #op);                                         \
    CHECK_TRUE((b)->op != NULL);
    KILN_BACKEND_OPS(HAS_OP, ref)
    KILN_BACKEND_OPS(HAS_OP, cpu)
#undef HAS_OP
    const sizes small = {.B = 2, .T = 7, .C = 24, .NH = 3, .V = 50, .Vp = 128};
    const sizes large = {.B = 2, .T = 130, .C = 96, .NH = 4, .V = 1000, .Vp = 1024};
    const sizes *cases[2] = {&small, &large};
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) {
        dt = (kiln_dtype)t;
        for (int i = 0; i < 2; i++) {
            const sizes *s = cases[i];
            int before = test_failures;
            test_encoder(s);
            test_layernorm(s);
            test_matmul(s);
            for (int64_t kv = s->NH; kv >= 1; kv /= 2) /* every head its own, grouped, one */
                if (s->NH % kv == 0)
                    test_attention(s, kv);
            test_llama_ops(s);
            test_pointwise(s);
            test_crossentropy(s);
            test_fusions(s);
            fprintf(stderr, "%s %s model ops, B=%lld T=%lld C=%lld NH=%lld V=%lld Vp=%lld\n",
                    test_failures == before ? "ok  " : "FAIL", kiln_dtype_name(dt), (long long)s->B,
                    (long long)s->T, (long long)s->C, (long long)s->NH, (long long)s->V,
                    (long long)s->Vp);
        }
    }
    int before = test_failures;
    test_optimizers(1000003);
    test_grad_scale();
    fprintf(stderr, "%s optimizer updates and working copies\n",
            test_failures == before ? "ok  " : "FAIL");
    before = test_failures;
    test_reductions(1000003);
    test_convert(100003);
    test_memory_and_errors(ref);
    test_memory_and_errors(cpu);
    fprintf(stderr, "%s reductions, slabs, conversions, memory, errors\n",
            test_failures == before ? "ok  " : "FAIL");
    test_peak();
    TEST_MAIN_END();
}
