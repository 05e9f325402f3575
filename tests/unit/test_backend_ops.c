/* Every op of the CPU backend against the reference on random inputs, at an awkward small
 * size (nothing a multiple of a vector width) and a larger one that crosses the attention
 * block size. Outputs that ops accumulate into start from the same random values for
 * both backends, and outputs that ops write start from garbage. Each CPU op is run twice
 * from the same state and must give the same bits. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "test.h"

#define TOL_FWD 1e-5
#define TOL_BWD 1e-4

typedef struct {
    int64_t B, T, C, NH, V, Vp;
} sizes;

static kiln_rng rng;
static const kiln_backend *ref, *cpu;

static float *randn(int64_t n, float scale) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = kiln_rng_normal(&rng) * scale;
    return x;
}

static float *dup(const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static int32_t *rand_ids(int64_t n, int64_t below) {
    int32_t *x = malloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++)
        x[i] = (int32_t)kiln_rng_below(&rng, (uint64_t)below);
    return x;
}

/* Three copies of an output buffer: the reference's and two CPU runs. */
typedef struct {
    float *r, *c1, *c2;
    int64_t n;
} out3;

static out3 out3_init(int64_t n, int accumulate) {
    out3 o = {.n = n};
    o.r = randn(n, accumulate ? 1.0f : 1e3f);
    o.c1 = dup(o.r, n);
    o.c2 = dup(o.r, n);
    return o;
}

static void out3_free(out3 *o) { free(o->r), free(o->c1), free(o->c2); }

/* Relative error of the CPU result against the reference within tol, and both CPU runs
 * bit-identical. */
static void check_out(const char *what, const out3 *o, double tol) {
    double err = test_rel_err(o->c1, o->r, o->n);
    test_checks += 2;
    if (getenv("KILN_TEST_VERBOSE"))
        fprintf(stderr, "  %-34s %.3g\n", what, err);
    if (!(err <= tol)) {
        test_failures++;
        fprintf(stderr, "  %s: relative error %.3g > %.1g\n", what, err, tol);
    }
    if (memcmp(o->c1, o->c2, (size_t)o->n * sizeof(float)) != 0) {
        test_failures++;
        fprintf(stderr, "  %s: two CPU runs differ\n", what);
    }
}

/* Run k of three: 0 is the reference (outputs .r), 1 and 2 the CPU (.c1, .c2). */
static const kiln_backend *be_of(int k) { return k == 0 ? ref : cpu; }

static float *at(const out3 *o, int k) { return k == 0 ? o->r : k == 1 ? o->c1 : o->c2; }

static void test_encoder(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    int32_t *ids = rand_ids(N, s->V);
    ids[N - 1] = ids[0]; /* a repeated token */
    float *wte = randn(s->V * C, 1.0f), *wpe = randn(s->T * C, 1.0f), *dout = randn(N * C, 1.0f);
    out3 out = out3_init(N * C, 0), dwte = out3_init(s->V * C, 1), dwpe = out3_init(s->T * C, 1);
    for (int k = 0; k < 3; k++)
        be_of(k)->encoder_forward(at(&out, k), ids, wte, wpe, s->B, s->T, C);
    check_out("encoder_forward out", &out, TOL_FWD);
    for (int k = 0; k < 3; k++)
        be_of(k)->encoder_backward(at(&dwte, k), at(&dwpe, k), dout, ids, s->B, s->T, C);
    check_out("encoder_backward dwte", &dwte, TOL_BWD);
    check_out("encoder_backward dwpe", &dwpe, TOL_BWD);
    free(ids), free(wte), free(wpe), free(dout);
    out3_free(&out), out3_free(&dwte), out3_free(&dwpe);
}

static void test_layernorm(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    float *inp = randn(N * C, 2.0f), *w = randn(C, 1.0f), *b = randn(C, 1.0f);
    for (int64_t i = 0; i < N * C; i++)
        inp[i] += 3.0f; /* an offset, so the variance is not the mean square */
    float *dout = randn(N * C, 1.0f);
    out3 out = out3_init(N * C, 0), mean = out3_init(N, 0), rstd = out3_init(N, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->layernorm_forward(at(&out, k), at(&mean, k), at(&rstd, k), inp, w, b, N, C);
    check_out("layernorm_forward out", &out, TOL_FWD);
    check_out("layernorm_forward mean", &mean, TOL_FWD);
    check_out("layernorm_forward rstd", &rstd, TOL_FWD);
    out3 dinp = out3_init(N * C, 1), dw = out3_init(C, 1), db = out3_init(C, 1);
    for (int k = 0; k < 3; k++)
        be_of(k)->layernorm_backward(at(&dinp, k), at(&dw, k), at(&db, k), dout, inp, w, mean.r,
                                     rstd.r, N, C);
    check_out("layernorm_backward dinp", &dinp, TOL_BWD);
    check_out("layernorm_backward dweight", &dw, TOL_BWD);
    check_out("layernorm_backward dbias", &db, TOL_BWD);
    free(inp), free(w), free(b), free(dout);
    out3_free(&out), out3_free(&mean), out3_free(&rstd);
    out3_free(&dinp), out3_free(&dw), out3_free(&db);
}

static void matmul_case(int64_t N, int64_t C, int64_t OC, int trans_w, int with_bias,
                        int with_dinp) {
    float *inp = randn(N * C, 1.0f), *w = randn(C * OC, 0.1f), *bias = randn(OC, 1.0f);
    float *dout = randn(N * OC, 1.0f);
    const float *b = with_bias ? bias : NULL;
    out3 out = out3_init(N * OC, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->matmul_forward(at(&out, k), inp, w, b, N, C, OC, trans_w);
    check_out(trans_w ? "matmul_forward (trans_w) out" : "matmul_forward out", &out, TOL_FWD);
    out3 dinp = out3_init(N * C, 0), dw = out3_init(C * OC, 1), db = out3_init(OC, 1);
    for (int k = 0; k < 3; k++)
        be_of(k)->matmul_backward(with_dinp ? at(&dinp, k) : NULL, at(&dw, k),
                                  with_bias ? at(&db, k) : NULL, dout, inp, w, N, C, OC, trans_w);
    if (with_dinp)
        check_out("matmul_backward dinp", &dinp, TOL_BWD);
    else
        CHECK_TRUE(memcmp(dinp.r, dinp.c1, (size_t)dinp.n * sizeof(float)) == 0);
    check_out("matmul_backward dweight", &dw, TOL_BWD);
    check_out("matmul_backward dbias", &db, TOL_BWD); /* untouched when with_bias == 0 */
    free(inp), free(w), free(bias), free(dout);
    out3_free(&out), out3_free(&dinp), out3_free(&dw), out3_free(&db);
}

static void test_matmul(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    matmul_case(N, C, 3 * C, 0, 1, 1); /* qkv projection */
    matmul_case(N, 4 * C, C, 0, 1, 1); /* MLP down projection */
    matmul_case(N, C, s->Vp, 1, 0, 1); /* output head, tied to wte (Vp,C) */
    matmul_case(N, C, 3 * C, 1, 1, 0); /* trans_w with bias, no dinp */
    matmul_case(N, C, 3 * C, 0, 0, 0); /* no bias, no dinp */
}

static void test_attention(const sizes *s) {
    int64_t B = s->B, T = s->T, C = s->C, NH = s->NH;
    float *qkv = randn(B * T * 3 * C, 1.0f), *dout = randn(B * T * C, 1.0f);
    out3 out = out3_init(B * T * C, 0), att = out3_init(B * NH * T * T, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->attention_forward(at(&out, k), at(&att, k), qkv, B, T, C, NH);
    check_out("attention_forward out", &out, TOL_FWD);
    check_out("attention_forward att", &att, TOL_FWD);
    out3 dqkv = out3_init(B * T * 3 * C, 0), scratch = out3_init(B * NH * T * T, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->attention_backward(at(&dqkv, k), at(&scratch, k), dout, qkv, att.r, B, T, C, NH);
    check_out("attention_backward dqkv", &dqkv, TOL_BWD);
    free(qkv), free(dout);
    out3_free(&out), out3_free(&att), out3_free(&dqkv), out3_free(&scratch);
}

static void test_pointwise(const sizes *s) {
    int64_t n = s->B * s->T * 4 * s->C + 3;
    float *inp = randn(n, 3.0f), *b = randn(n, 1.0f), *dout = randn(n, 1.0f);
    inp[0] = 0.0f, inp[1] = 12.0f, inp[2] = -12.0f, inp[3] = 50.0f, inp[4] = -50.0f;
    out3 out = out3_init(n, 0), dinp = out3_init(n, 0), res = out3_init(n, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->gelu_forward(at(&out, k), inp, n);
    check_out("gelu_forward", &out, TOL_FWD);
    for (int k = 0; k < 3; k++)
        be_of(k)->gelu_backward(at(&dinp, k), inp, dout, n);
    check_out("gelu_backward", &dinp, TOL_BWD);
    for (int k = 0; k < 3; k++)
        be_of(k)->residual_forward(at(&res, k), inp, b, n);
    check_out("residual_forward", &res, TOL_FWD);
    /* elementwise too, not only by norm: the tails of GELU */
    for (int i = 0; i < 5; i++)
        CHECK_NEAR(out.c1[i], out.r[i], 1e-6);
    free(inp), free(b), free(dout);
    out3_free(&out), out3_free(&dinp), out3_free(&res);
}

static void test_crossentropy(const sizes *s) {
    int64_t N = s->B * s->T, V = s->V, Vp = s->Vp;
    float *logits = randn(N * Vp, 4.0f);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = V; i < Vp; i++)
            logits[n * Vp + i] = 1e4f; /* padding must not take part */
    int32_t *targets = rand_ids(N, V);
    targets[0] = 0, targets[N - 1] = (int32_t)(V - 1);
    const float dloss = 1.0f / (float)N;
    out3 losses = out3_init(N, 0), dl = out3_init(N * Vp, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->crossentropy_forward_backward(at(&losses, k), at(&dl, k), logits, targets, dloss,
                                                N, V, Vp);
    check_out("crossentropy losses", &losses, TOL_FWD);
    check_out("crossentropy dlogits", &dl, TOL_BWD);
    /* in place on the logits: the same losses and gradient */
    float *inplace = dup(logits, N * Vp);
    float *losses2 = randn(N, 1.0f);
    cpu->crossentropy_forward_backward(losses2, inplace, inplace, targets, dloss, N, V, Vp);
    CHECK_TRUE(memcmp(inplace, dl.c1, (size_t)(N * Vp) * sizeof(float)) == 0);
    CHECK_TRUE(memcmp(losses2, losses.c1, (size_t)N * sizeof(float)) == 0);
    /* loss only */
    out3 lossonly = out3_init(N, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->crossentropy_forward_backward(at(&lossonly, k), NULL, logits, targets, dloss, N,
                                                V, Vp);
    check_out("crossentropy losses (no dlogits)", &lossonly, TOL_FWD);
    free(logits), free(targets), free(inplace), free(losses2);
    out3_free(&losses), out3_free(&dl), out3_free(&lossonly);
}

/* Give the CPU copies the reference's state, so that each update starts from the same
 * values. */
static void sync(out3 *o) {
    memcpy(o->c1, o->r, (size_t)o->n * sizeof(float));
    memcpy(o->c2, o->r, (size_t)o->n * sizeof(float));
}

/* An update is small next to the parameter, so compare the steps p_new - p_old. */
static void check_step(const char *what, const out3 *p, const float *before, double tol) {
    out3 d = out3_init(p->n, 0);
    for (int64_t i = 0; i < p->n; i++) {
        d.r[i] = p->r[i] - before[i];
        d.c1[i] = p->c1[i] - before[i];
        d.c2[i] = p->c2[i] - before[i];
    }
    check_out(what, &d, tol);
    out3_free(&d);
}

#define SYNC_ALL() (sync(&p), sync(&m), sync(&v), sync(&buf), sync(&sq), memcpy(p0, p.r, bytes))

static void test_optimizers(int64_t n) {
    size_t bytes = (size_t)n * sizeof(float);
    float *g = randn(n, 1.0f), *p0 = randn(n, 0);
    out3 p = out3_init(n, 1), m = out3_init(n, 1), v = out3_init(n, 1);
    out3 buf = out3_init(n, 1), sq = out3_init(n, 1);
    for (int64_t i = 0; i < n; i++)
        v.r[i] = fabsf(v.r[i]) * 1e-3f, sq.r[i] = fabsf(sq.r[i]);
    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->adam_update(at(&p, k), g, at(&m, k), at(&v, k), n, 1e-3f, 0.9f, 0.95f, 0.3f, 0.2f,
                              1e-8f, 0.1f, 0.0f);
    check_step("adamw step", &p, p0, TOL_FWD);
    check_out("adamw m", &m, TOL_FWD);
    check_out("adamw v", &v, TOL_FWD);
    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->adam_update(at(&p, k), g, at(&m, k), at(&v, k), n, 1e-2f, 0.8f, 0.99f, 0.5f, 0.1f,
                              1e-6f, 0.0f, 0.01f);
    check_step("adam (l2) step", &p, p0, TOL_FWD);
    check_out("adam (l2) m", &m, TOL_FWD);
    check_out("adam (l2) v", &v, TOL_FWD);

    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->sgd_update(at(&p, k), g, NULL, n, 0.1f, 0.0f, 0.0f, 0, 0.01f, 1);
    check_step("sgd plain step", &p, p0, TOL_FWD);
    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->sgd_update(at(&p, k), g, at(&buf, k), n, 0.1f, 0.9f, 0.0f, 0, 0.01f, 1);
    check_step("sgd first step", &p, p0, TOL_FWD);
    check_out("sgd first buf", &buf, TOL_FWD);
    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->sgd_update(at(&p, k), g, at(&buf, k), n, 0.1f, 0.9f, 0.3f, 0, 0.01f, 0);
    check_step("sgd dampening step", &p, p0, TOL_FWD);
    check_out("sgd dampening buf", &buf, TOL_FWD);
    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->sgd_update(at(&p, k), g, at(&buf, k), n, 0.1f, 0.9f, 0.0f, 1, 0.0f, 0);
    check_step("sgd nesterov step", &p, p0, TOL_FWD);
    check_out("sgd nesterov buf", &buf, TOL_FWD);

    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->rmsprop_update(at(&p, k), g, at(&sq, k), NULL, n, 1e-2f, 0.99f, 1e-8f, 0.01f,
                                 0.0f);
    check_step("rmsprop step", &p, p0, TOL_FWD);
    check_out("rmsprop sq", &sq, TOL_FWD);
    SYNC_ALL();
    for (int k = 0; k < 3; k++)
        be_of(k)->rmsprop_update(at(&p, k), g, at(&sq, k), at(&buf, k), n, 1e-2f, 0.9f, 1e-8f, 0.0f,
                                 0.5f);
    check_step("rmsprop (momentum) step", &p, p0, TOL_FWD);
    check_out("rmsprop (momentum) sq", &sq, TOL_FWD);
    check_out("rmsprop (momentum) buf", &buf, TOL_FWD);

    /* sumsq: close to the reference's sequential double sum, and the same bits whatever
     * the thread count */
    double want = ref->sumsq(g, n), got = cpu->sumsq(g, n);
    CHECK_NEAR(got, want, 1e-12);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double one = cpu->sumsq(g, n);
    omp_set_num_threads(3);
    double three = cpu->sumsq(g, n);
    omp_set_num_threads(threads);
    CHECK_TRUE(one == got && three == got);

    sync(&p);
    for (int k = 0; k < 3; k++)
        be_of(k)->scale(at(&p, k), 0.37f, n);
    check_out("scale", &p, 0);
    for (int k = 0; k < 3; k++)
        be_of(k)->zero(at(&p, k) + 1, n - 2);
    check_out("zero", &p, 0);
    CHECK_TRUE(p.c1[0] != 0.0f && p.c1[1] == 0.0f && p.c1[n - 2] == 0.0f && p.c1[n - 1] != 0.0f);
    free(g), free(p0);
    out3_free(&p), out3_free(&m), out3_free(&v), out3_free(&buf), out3_free(&sq);
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
                cpu->matmul_forward(o, a, w, NULL, n, n, n, 0);
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
    for (int i = 0; i < 2; i++) {
        const sizes *s = cases[i];
        fprintf(stderr, "B=%lld T=%lld C=%lld NH=%lld V=%lld Vp=%lld\n", (long long)s->B,
                (long long)s->T, (long long)s->C, (long long)s->NH, (long long)s->V,
                (long long)s->Vp);
        int before = test_failures;
        test_encoder(s);
        test_layernorm(s);
        test_matmul(s);
        test_attention(s);
        test_pointwise(s);
        test_crossentropy(s);
        fprintf(stderr, "%s model ops\n", test_failures == before ? "ok  " : "FAIL");
    }
    int before = test_failures;
    test_optimizers(1000003);
    fprintf(stderr, "%s optimizer and slab ops\n", test_failures == before ? "ok  " : "FAIL");
    test_peak();
    TEST_MAIN_END();
}
