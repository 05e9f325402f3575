/* The reference backend checked against itself: each backward kernel against central
 * finite differences of its forward kernel, and the optimizer kernels against values
 * worked out by hand. Sizes are tiny so that every input can be perturbed.
 *
 * The scalar probed is L = sum(out * R) for a fixed random R, so the analytic gradient
 * is the backward kernel fed dout = R. L is summed in double from float outputs; with
 * step h = 1e-2 (inputs are O(1)) the truncation error is O(h^2) and the rounding error
 * about 1e-7 * |L| / h, so a relative tolerance of 5e-4 separates right from wrong. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "test.h"

#define FD_H 1e-2f
#define FD_TOL 5e-4

static kiln_rng rng;
static kiln_backend *R; /* the reference backend */
#define F32 KILN_DTYPE_F32

static float *randn(int64_t n, float scale) {
    float *x = calloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = kiln_rng_normal(&rng) * scale;
    return x;
}

static double dot(const float *a, const float *b, int64_t n) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++)
        acc += (double)a[i] * b[i];
    return acc;
}

/* A forward pass seen as a function of one input buffer, returning L. */
typedef double (*loss_fn)(void *ctx);

/* Compare grad (n) with central differences of f with respect to x (n). */
static double fd_rel_err(loss_fn f, void *ctx, float *x, const float *grad, int64_t n) {
    float *num = calloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + FD_H;
        double lp = f(ctx);
        x[i] = keep - FD_H;
        double lm = f(ctx);
        x[i] = keep;
        num[i] = (float)((lp - lm) / (2.0 * (double)FD_H));
    }
    double err = test_rel_err(grad, num, n);
    free(num);
    return err;
}

/* ---- layernorm ---- */
typedef struct {
    int64_t N, C;
    float *inp, *w, *b, *out, *mean, *rstd, *R;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    R->layernorm_forward(R, F32, c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->R, c->N * c->C);
}

static void test_layernorm_fd(void) {
    ln_ctx c = {.N = 3, .C = 7};
    int64_t nc = c.N * c.C;
    c.inp = randn(nc, 1.0f), c.w = randn(c.C, 1.0f), c.b = randn(c.C, 1.0f);
    c.out = randn(nc, 0), c.mean = randn(c.N, 0), c.rstd = randn(c.N, 0), c.R = randn(nc, 1.0f);
    float *dinp = randn(nc, 0), *dw = randn(c.C, 0), *db = randn(c.C, 0);
    ln_loss(&c);
    R->layernorm_backward(R, F32, dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
    CHECK_TRUE(fd_rel_err(ln_loss, &c, c.inp, dinp, nc) < FD_TOL);
    CHECK_TRUE(fd_rel_err(ln_loss, &c, c.w, dw, c.C) < FD_TOL);
    CHECK_TRUE(fd_rel_err(ln_loss, &c, c.b, db, c.C) < FD_TOL);
    /* dinp accumulates: a second backward doubles it */
    float first = dinp[5];
    R->layernorm_backward(R, F32, dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
    CHECK_NEAR(dinp[5], 2.0f * first, 1e-6);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
    free(dinp), free(dw), free(db);
}

/* ---- matmul ---- */
typedef struct {
    int64_t N, C, OC;
    int trans_w;
    float *inp, *w, *b, *out, *R;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    R->matmul_forward(R, F32, c->out, c->inp, c->w, c->b, c->N, c->C, c->OC, c->trans_w, NULL);
    return dot(c->out, c->R, c->N * c->OC);
}

static void test_matmul_fd(void) {
    for (int trans_w = 0; trans_w < 2; trans_w++) {
        mm_ctx c = {.N = 4, .C = 5, .OC = 6, .trans_w = trans_w};
        c.inp = randn(c.N * c.C, 1.0f), c.w = randn(c.C * c.OC, 1.0f), c.b = randn(c.OC, 1.0f);
        c.out = randn(c.N * c.OC, 0), c.R = randn(c.N * c.OC, 1.0f);
        float *dinp = randn(c.N * c.C, 1.0f); /* garbage: dinp is written, not added to */
        float *dw = randn(c.C * c.OC, 0), *db = randn(c.OC, 0);
        R->matmul_backward(R, F32, dinp, dw, db, c.R, c.inp, c.w, c.N, c.C, c.OC, trans_w);
        CHECK_TRUE(fd_rel_err(mm_loss, &c, c.inp, dinp, c.N * c.C) < FD_TOL);
        CHECK_TRUE(fd_rel_err(mm_loss, &c, c.w, dw, c.C * c.OC) < FD_TOL);
        CHECK_TRUE(fd_rel_err(mm_loss, &c, c.b, db, c.OC) < FD_TOL);
        free(c.inp), free(c.w), free(c.b), free(c.out), free(c.R), free(dinp), free(dw), free(db);
    }
}

/* ---- attention ---- */
typedef struct {
    int64_t B, T, C, NH;
    float *qkv, *out, *att, *R;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    R->attention_forward(R, F32, c->out, c->att, NULL, c->qkv, c->B, c->T, c->C, c->NH, c->NH);
    return dot(c->out, c->R, c->B * c->T * c->C);
}

static void test_attention_fd(void) {
    att_ctx c = {.B = 2, .T = 5, .C = 8, .NH = 2};
    int64_t nqkv = c.B * c.T * 3 * c.C, nout = c.B * c.T * c.C, natt = c.B * c.NH * c.T * c.T;
    c.qkv = randn(nqkv, 1.0f), c.out = randn(nout, 0), c.att = randn(natt, 0);
    c.R = randn(nout, 1.0f);
    float *dqkv = randn(nqkv, 1.0f), *scratch = randn(natt, 0);
    /* the reference keeps the fp32 probabilities, and its backward works in a block of
     * their size */
    CHECK_INT_EQ(R->attention_saved_bytes(R, F32, c.B, c.T, c.C, c.NH, c.NH), natt * sizeof(float));
    CHECK_INT_EQ(R->attention_scratch_bytes(R, F32, c.B, c.T, c.C, c.NH, c.NH), natt * sizeof(float));
    att_loss(&c);
    /* probabilities: rows sum to 1, zero above the diagonal */
    for (int64_t r = 0; r < c.B * c.NH * c.T; r++) {
        int64_t t = r % c.T;
        double s = 0.0;
        for (int64_t t2 = 0; t2 < c.T; t2++) {
            s += c.att[r * c.T + t2];
            if (t2 > t)
                CHECK_TRUE(c.att[r * c.T + t2] == 0.0f);
        }
        CHECK_NEAR(s, 1.0, 1e-6);
    }
    R->attention_backward(R, F32, dqkv, scratch, c.R, c.qkv, c.att, c.B, c.T, c.C, c.NH, c.NH);
    CHECK_TRUE(fd_rel_err(att_loss, &c, c.qkv, dqkv, nqkv) < FD_TOL);
    free(c.qkv), free(c.out), free(c.att), free(c.R), free(dqkv), free(scratch);
}

/* ---- gelu ---- */
typedef struct {
    int64_t n;
    float *inp, *out, *R;
} gelu_ctx;

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    R->gelu_forward(R, F32, c->out, c->inp, c->n);
    return dot(c->out, c->R, c->n);
}

static void test_gelu_fd(void) {
    gelu_ctx c = {.n = 33};
    c.inp = randn(c.n, 2.0f), c.out = randn(c.n, 0), c.R = randn(c.n, 1.0f);
    float *dinp = randn(c.n, 0);
    R->gelu_backward(R, F32, dinp, c.inp, c.R, c.n);
    CHECK_TRUE(fd_rel_err(gelu_loss, &c, c.inp, dinp, c.n) < FD_TOL);
    /* known values: gelu(0) = 0, gelu(1) = 0.841192 (tanh form) */
    float x[2] = {0.0f, 1.0f}, y[2];
    R->gelu_forward(R, F32, y, x, 2);
    CHECK_NEAR(y[0], 0.0, 1e-7);
    CHECK_NEAR(y[1], 0.8411920, 1e-6);
    free(c.inp), free(c.out), free(c.R), free(dinp);
}

/* ---- crossentropy ---- */
typedef struct {
    int64_t N, V, Vp;
    float *logits, *losses, dloss;
    int32_t *targets;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    R->crossentropy_forward_backward(R, F32, c->losses, NULL, c->logits, c->targets, c->dloss, c->N,
                                     c->V, c->Vp);
    double s = 0.0;
    for (int64_t n = 0; n < c->N; n++)
        s += c->losses[n];
    return s * c->dloss;
}

static void test_crossentropy_fd(void) {
    ce_ctx c = {.N = 3, .V = 7, .Vp = 9, .dloss = 0.25f};
    int32_t targets[3] = {0, 6, 3};
    c.targets = targets;
    c.logits = randn(c.N * c.Vp, 2.0f), c.losses = randn(c.N, 0);
    float *dlogits = randn(c.N * c.Vp, 1.0f);
    R->crossentropy_forward_backward(R, F32, c.losses, dlogits, c.logits, c.targets, c.dloss, c.N,
                                     c.V, c.Vp);
    /* the padded columns do not reach the loss: their numerical gradient is 0 too */
    CHECK_TRUE(fd_rel_err(ce_loss, &c, c.logits, dlogits, c.N * c.Vp) < FD_TOL);
    for (int64_t n = 0; n < c.N; n++)
        for (int64_t i = c.V; i < c.Vp; i++)
            CHECK_TRUE(dlogits[n * c.Vp + i] == 0.0f);
    /* uniform logits: loss = log V */
    float flat[7] = {0}, loss;
    int32_t y = 2;
    R->crossentropy_forward_backward(R, F32, &loss, NULL, flat, &y, 1.0f, 1, 7, 7);
    CHECK_NEAR(loss, log(7.0), 1e-6);
    /* in place: dlogits aliasing logits gives the same values */
    float *inplace = calloc((size_t)(c.N * c.Vp), sizeof(float));
    memcpy(inplace, c.logits, (size_t)(c.N * c.Vp) * sizeof(float));
    float losses2[3];
    R->crossentropy_forward_backward(R, F32, losses2, inplace, inplace, c.targets, c.dloss, c.N,
                                     c.V, c.Vp);
    CHECK_TRUE(memcmp(inplace, dlogits, (size_t)(c.N * c.Vp) * sizeof(float)) == 0);
    CHECK_TRUE(memcmp(losses2, c.losses, sizeof losses2) == 0);
    free(c.logits), free(c.losses), free(dlogits), free(inplace);
}

/* ---- encoder ---- */
static void test_encoder(void) {
    const int64_t B = 2, T = 3, C = 4, V = 5;
    int32_t inp[6] = {1, 4, 1, 0, 2, 1};
    float *wte = randn(V * C, 1.0f), *wpe = randn(T * C, 1.0f), *out = randn(B * T * C, 0);
    R->encoder_forward(R, F32, out, inp, wte, wpe, B, T, C);
    CHECK_NEAR(out[(1 * T + 2) * C + 3], wte[1 * C + 3] + wpe[2 * C + 3], 1e-7);
    float *dout = randn(B * T * C, 1.0f), *dwte = randn(V * C, 0), *dwpe = randn(T * C, 0);
    R->encoder_backward(R, F32, dwte, dwpe, dout, inp, B, T, C);
    /* token 1 occurs at (0,0), (0,2), (1,2) */
    CHECK_NEAR(dwte[1 * C + 2], dout[0 * C + 2] + dout[2 * C + 2] + dout[5 * C + 2], 1e-6);
    CHECK_NEAR(dwte[3 * C + 0], 0.0, 0);
    CHECK_NEAR(dwpe[1 * C + 1], dout[1 * C + 1] + dout[4 * C + 1], 1e-6);
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
}

/* ---- optimizers, one element worked by hand ---- */
static void test_optimizers(void) {
    kiln_backend *be = R;
    /* AdamW step 1: m = 0.1 g, v = 0.001 g^2, mhat = g, vhat = g^2 -> step lr*g/(|g|+eps) */
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    be->adam_update(be, &p, NULL, &g, 1.0f, &m, &v, 1, 0.1f, 0.9f, 0.999f, 0.1f, 0.001f, 1e-8f, 0.01f,
                    0.0f);
    CHECK_NEAR(m, 0.05, 1e-7);
    CHECK_NEAR(v, 0.00025, 1e-8);
    CHECK_NEAR(p, 1.0 * (1 - 0.1 * 0.01) - 0.1 * 0.5 / (0.5 + 1e-8), 1e-6);
    /* Adam with L2: g' = 0.5 + 0.2 * 1 */
    p = 1.0f, m = 0.0f, v = 0.0f;
    be->adam_update(be, &p, NULL, &g, 1.0f, &m, &v, 1, 0.1f, 0.9f, 0.999f, 0.1f, 0.001f, 1e-8f, 0.0f,
                    0.2f);
    CHECK_NEAR(m, 0.07, 1e-7);
    CHECK_NEAR(p, 0.9, 1e-6);
    /* SGD momentum 0.9, dampening 0, nesterov: first buf = g' = 0.5 + 0.1*2 */
    float ps = 2.0f, gs = 0.5f, buf = 123.0f;
    be->sgd_update(be, &ps, NULL, &gs, 1.0f, &buf, 1, 0.1f, 0.9f, 0.0f, 1, 0.1f, 1);
    CHECK_NEAR(buf, 0.7, 1e-6);
    CHECK_NEAR(ps, 2.0 - 0.1 * (0.7 + 0.9 * 0.7), 1e-6);
    be->sgd_update(be, &ps, NULL, &gs, 1.0f, &buf, 1, 0.1f, 0.9f, 0.5f, 0, 0.0f, 0);
    CHECK_NEAR(buf, 0.9 * 0.7 + 0.5 * 0.5, 1e-6);
    /* plain SGD, no buffer */
    ps = 1.0f;
    be->sgd_update(be, &ps, NULL, &gs, 1.0f, NULL, 1, 0.1f, 0.0f, 0.0f, 0, 0.0f, 1);
    CHECK_NEAR(ps, 0.95, 1e-7);
    /* RMSprop: sq = 0.01 g^2 */
    float pr = 1.0f, gr = 0.5f, sq = 0.0f, rb = 0.0f;
    be->rmsprop_update(be, &pr, NULL, &gr, 1.0f, &sq, &rb, 1, 0.01f, 0.99f, 1e-8f, 0.0f, 0.0f);
    CHECK_NEAR(sq, 0.0025, 1e-8);
    CHECK_NEAR(pr, 1.0 - 0.01 * 0.5 / (0.05 + 1e-8), 1e-6);
    pr = 1.0f, sq = 0.0f;
    be->rmsprop_update(be, &pr, NULL, &gr, 1.0f, &sq, &rb, 1, 0.01f, 0.99f, 1e-8f, 0.0f, 0.5f);
    CHECK_NEAR(rb, 10.0, 1e-4);
    CHECK_NEAR(pr, 0.9, 1e-6);
    /* sum, sumsq, scale, zero */
    float x[3] = {1.0f, -2.0f, 3.0f};
    CHECK_NEAR(be->sum(be, x, 3), 2.0, 0);
    CHECK_NEAR(be->sumsq(be, F32, x, 3), 14.0, 0);
    be->scale(be, x, 0.5f, 3);
    CHECK_NEAR(x[2], 1.5, 0);
    be->zero(be, x, 2 * sizeof(float)); /* bytes, not elements */
    CHECK_TRUE(x[0] == 0.0f && x[1] == 0.0f && x[2] == 1.5f);
    be->zero(be, x, 3 * sizeof(float));
    CHECK_NEAR(be->sumsq(be, F32, x, 3), 0.0, 0);
    /* sumsq of bf16 and fp16 values (exact in either): 1.5^2 + 0.25^2 + 3^2 */
    uint16_t b16[3] = {kiln_f32_to_bf16(1.5f), kiln_f32_to_bf16(-0.25f), kiln_f32_to_bf16(3.0f)};
    uint16_t h16[3] = {kiln_f32_to_f16(1.5f), kiln_f32_to_f16(-0.25f), kiln_f32_to_f16(3.0f)};
    CHECK_NEAR(be->sumsq(be, KILN_DTYPE_BF16, b16, 3), 11.3125, 0);
    CHECK_NEAR(be->sumsq(be, KILN_DTYPE_F16, h16, 3), 11.3125, 0);
}

/* The working copy an update writes: p rounded to the dtype, or (bf16 with a seed) to one
 * of its two neighbours by the bits kiln__round_bits gives element index0 + i. */
static void test_working_copy(void) {
    kiln_backend *be = R;
    /* SGD with lr 1, g = -d: p = 1 + d. 1 + 2^-9 + 2^-12 lies between the bf16 values 1 and
     * 1 + 2^-7, nearer 1; in fp16 (spacing 2^-10 at 1) between 1 + 2^-9 (2^-12 away) and
     * 1 + 3 x 2^-10 (3 x 2^-12 away), nearer the first */
    float d = 0x1p-9f + 0x1p-12f;
    float p = 1.0f, g = -d;
    uint16_t w16 = 0;
    kiln_work_out w = {.p = &w16, .dtype = KILN_DTYPE_BF16};
    be->sgd_update(be, &p, &w, &g, 1.0f, NULL, 1, 1.0f, 0.0f, 0.0f, 0, 0.0f, 1);
    CHECK_TRUE(p == 1.0f + d);
    CHECK_INT_EQ(w16, kiln_f32_to_bf16(1.0f));
    p = 1.0f;
    w.dtype = KILN_DTYPE_F16;
    be->sgd_update(be, &p, &w, &g, 1.0f, NULL, 1, 1.0f, 0.0f, 0.0f, 0, 0.0f, 1);
    CHECK_TRUE(kiln_f16_to_f32(w16) == 1.0f + 0x1p-9f);
    float w32 = 0;
    p = 1.0f;
    w = (kiln_work_out){.p = &w32, .dtype = F32};
    be->sgd_update(be, &p, &w, &g, 1.0f, NULL, 1, 1.0f, 0.0f, 0.0f, 0, 0.0f, 1);
    CHECK_TRUE(w32 == p);
    /* stochastic: about (d / 2^-7) = 1/4 + 1/32 of many elements round up */
    enum { N = 4000 };
    float *ps = calloc(N, sizeof(float)), *gs = calloc(N, sizeof(float));
    uint16_t *ws = calloc(N, sizeof(uint16_t));
    for (int i = 0; i < N; i++)
        ps[i] = 1.0f, gs[i] = -d;
    w = (kiln_work_out){.p = ws, .dtype = KILN_DTYPE_BF16, .round_seed = 77, .index0 = 5};
    be->sgd_update(be, ps, &w, gs, 1.0f, NULL, N, 1.0f, 0.0f, 0.0f, 0, 0.0f, 1);
    int up = 0, other = 0;
    for (int i = 0; i < N; i++) {
        up += ws[i] == kiln_f32_to_bf16(1.0f + 0x1p-7f);
        other += ws[i] != kiln_f32_to_bf16(1.0f) && ws[i] != kiln_f32_to_bf16(1.0f + 0x1p-7f);
    }
    CHECK_INT_EQ(other, 0);
    /* binomial(4000, 0.28125): standard deviation 28, so 5 of them is 142 */
    CHECK_NEAR(up, 0.28125 * N, 142.0 / (0.28125 * N));
    free(ps), free(gs), free(ws);
}

/* convert and the memory ops (host memory), and a recorded error. */
static void test_memory_and_errors(void) {
    kiln_backend *be = R;
    float src[4] = {1.0f, -0.5f, 65504.0f, 1e-3f}, back[4];
    uint16_t *dev = be->alloc(be, 4 * sizeof(uint16_t));
    CHECK_TRUE(dev != NULL);
    if (!dev)
        return;
    CHECK_TRUE(dev[0] == 0 && dev[3] == 0); /* zero-filled */
    be->convert(be, dev, KILN_DTYPE_F16, src, F32, 4);
    be->copy(be, back, dev, 0, KILN_COPY_TO_HOST); /* 0 bytes: nothing */
    uint16_t host[4];
    be->copy(be, host, dev, sizeof host, KILN_COPY_TO_HOST);
    for (int i = 0; i < 4; i++)
        CHECK_INT_EQ(host[i], kiln_f32_to_f16(src[i]));
    be->convert(be, back, F32, dev, KILN_DTYPE_F16, 4);
    CHECK_TRUE(back[0] == 1.0f && back[1] == -0.5f && back[2] == 65504.0f);
    CHECK_NEAR(back[3], 1e-3, 1e-3 * 0x1p-11);
    be->free(be, dev);
    be->free(be, NULL);
    CHECK_OK(be->synchronize(be));
    CHECK_STATUS(kiln_backend_fail(be, KILN_ERR_IO, "disk %d", 7), KILN_ERR_IO);
    kiln_backend_fail(be, KILN_ERR_NOMEM, "a later one, dropped");
    CHECK_INT_EQ(kiln_backend_error(be), KILN_ERR_IO);
    CHECK_STATUS(be->synchronize(be), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "disk 7") != NULL);
    CHECK_OK(be->synchronize(be)); /* cleared */
}

int main(void) {
    kiln_rng_seed(&rng, 1234);
    R = kiln_backend_ref();
    RUN_TEST(test_layernorm_fd);
    RUN_TEST(test_matmul_fd);
    RUN_TEST(test_attention_fd);
    RUN_TEST(test_gelu_fd);
    RUN_TEST(test_crossentropy_fd);
    RUN_TEST(test_encoder);
    RUN_TEST(test_optimizers);
    RUN_TEST(test_working_copy);
    RUN_TEST(test_memory_and_errors);
    TEST_MAIN_END();
}
