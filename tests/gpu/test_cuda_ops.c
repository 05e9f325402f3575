/* Every op of the CUDA backend against the reference backend, in fp32, bf16 and fp16, on
 * random inputs of several shapes: odd widths (C = 72, 200), head sizes 12, 24, 32, 64, 128
 * and 200 (the generic path of the padded 256 kernel), vocabularies of no multiple of 128,
 * T = 1 and T = 23. The same host inputs go to both backends (the GPU's through `copy`);
 * outputs that ops accumulate into start from the same random values on both.
 *
 * Error. Each output's error is max |gpu - ref| over its elements divided by the largest
 * |ref| (so one scale for the whole tensor, which tiny elements cannot inflate), and must be
 * within the op's tolerance: fp32 1e-5 for elementwise and row ops, 1e-4 where an output
 * sums many terms (products, attention, gradients of LayerNorm and embeddings), and in bf16
 * and fp16 that plus a few units of the dtype's roundoff u (2^-8, 2^-11) for each rounding
 * the two backends may place differently (the fused GELU epilogue rounds its pre-activation
 * after GELU reads it, attention's backward reads its output back rounded). Outputs kept in
 * fp32 whatever the dtype keep the fp32 tolerance. The optimizer's fp32 state must agree to
 * 1e-6, its working copy within one unit of its dtype. Each op's worst error over the shapes
 * is printed in a table.
 *
 * The Llama family's ops: RMSNorm (and its fused residual form), rotary embeddings from
 * position 0 and 37 with two bases, SwiGLU, the embedding without position table. Attention
 * runs with NKV key/value heads for NKV = NH, NH/2 and 1 (grouped-query attention: a key/value
 * head's gradient summed over its query heads), and attention_decode (the last rows of a
 * cache, whose unfilled rows hold NaN that must not be read) against the reference's.
 *
 * Attention runs with KILN_CUDA_TC_ATTENTION on and off: "tc" rows are the tensor-core
 * kernels (bf16 and fp16, head sizes that are multiples of 16 up to 128), "cc" rows the
 * CUDA-core ones, "after forward ..." rows the backward of one path from the forward of the
 * other; more shapes for attention alone (T = 1, 17, 70, 100, 130, 257, head sizes 16 to 128).
 *
 * Then: the backward ops run twice give the same bits (no atomics; attention on each path);
 * the attention flag changes the bits exactly where the tensor-core kernels fit; token ids
 * given as device pointers as well as host ones; an op that cannot run (head size 300)
 * records an error that synchronize reports once and clears.
 *
 * Without a usable GPU (or in a build without CUDA) it prints "SKIP: no CUDA GPU (...)" and
 * exits 77, which CTest reports as skipped. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"

#define F32 KILN_DTYPE_F32
#define BF16 KILN_DTYPE_BF16
#define F16 KILN_DTYPE_F16

static kiln_backend *ref, *gpu;
static kiln_rng rng;
static kiln_dtype dt;
static int failures, checks;

/* ---- the table of worst errors ---- */
typedef struct {
    char op[64];
    kiln_dtype t;
    double err, tol;
    int n;
} row;
static row rows[512];
static int nrows;

static void record(const char *op, double err, double tol) {
    checks++;
    int fail = !(err <= tol);
    if (fail) {
        failures++;
        fprintf(stderr, "  FAIL %s %s: error %.3g > %.3g\n", kiln_dtype_name(dt), op, err, tol);
    }
    for (int i = 0; i < nrows; i++)
        if (rows[i].t == dt && !strcmp(rows[i].op, op)) {
            if (!(err <= rows[i].err) || isnan(err))
                rows[i].err = err;
            if (tol > rows[i].tol)
                rows[i].tol = tol;
            rows[i].n++;
            return;
        }
    if (nrows < (int)(sizeof rows / sizeof rows[0])) {
        row *r = &rows[nrows++];
        snprintf(r->op, sizeof r->op, "%s", op);
        r->t = dt;
        r->err = err;
        r->tol = tol;
        r->n = 1;
    }
}

static void check_true(const char *what, int ok) {
    checks++;
    if (!ok) {
        failures++;
        fprintf(stderr, "  FAIL %s %s\n", kiln_dtype_name(dt), what);
    }
}

/* u of the dtype under test (0 for fp32) */
static double U(void) { return dt == F32 ? 0.0 : kiln_dtype_epsilon(dt); }

/* ---- buffers: a host copy for the reference, a device copy for the GPU ---- */
typedef struct {
    void *h, *d;
    int64_t n;
    kiln_dtype t;
} buf;

static size_t bytes_of(const buf *b) { return (size_t)(b->n > 0 ? b->n : 1) * kiln_dtype_size(b->t); }

static buf mk(int64_t n, kiln_dtype t, float scale, float offset) {
    buf b = {NULL, NULL, n, t};
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = kiln_rng_normal(&rng) * scale + offset;
    b.h = malloc(bytes_of(&b));
    kiln_convert(b.h, t, x, F32, n);
    free(x);
    b.d = gpu->alloc(gpu, bytes_of(&b));
    if (!b.d) {
        fprintf(stderr, "cannot allocate %zu bytes on the GPU\n", bytes_of(&b));
        exit(1);
    }
    gpu->copy(gpu, b.d, b.h, bytes_of(&b), KILN_COPY_TO_DEVICE);
    return b;
}

static void rm(buf *b) {
    free(b->h);
    gpu->free(gpu, b->d);
    b->h = b->d = NULL;
}

/* The GPU's values as fp32 (after a synchronize that must succeed). */
static float *gpu_f32(const buf *b) {
    void *h = malloc(bytes_of(b));
    gpu->copy(gpu, h, b->d, bytes_of(b), KILN_COPY_TO_HOST);
    kiln_status s = gpu->synchronize(gpu);
    if (s != KILN_OK)
        fprintf(stderr, "  GPU error: %s\n", kiln_error_message());
    check_true("synchronize", s == KILN_OK);
    float *f = malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(float));
    kiln_convert(f, F32, h, b->t, b->n);
    free(h);
    return f;
}

static float *host_f32(const buf *b) {
    float *f = malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(float));
    kiln_convert(f, F32, b->h, b->t, b->n);
    return f;
}

/* max |gpu - ref| / max |ref| */
static double max_err(const float *g, const float *r, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(r[i]));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - (double)r[i]);
        if (isnan(g[i]) != isnan(r[i]) || (!isnan(d) && d > worst))
            worst = isnan(d) ? INFINITY : d;
    }
    return scale > 0 ? worst / scale : worst;
}

static void cmp(const char *op, const buf *b, double tol) {
    float *g = gpu_f32(b), *r = host_f32(b);
    record(op, max_err(g, r, b->n), tol);
    free(g), free(r);
}

/* The two buffers' bytes on the GPU are the same. */
static int gpu_same(const buf *a, const buf *b) {
    void *x = malloc(bytes_of(a)), *y = malloc(bytes_of(b));
    gpu->copy(gpu, x, a->d, bytes_of(a), KILN_COPY_TO_HOST);
    gpu->copy(gpu, y, b->d, bytes_of(b), KILN_COPY_TO_HOST);
    int same = gpu->synchronize(gpu) == KILN_OK && !memcmp(x, y, bytes_of(a));
    free(x), free(y);
    return same;
}

static buf clone(const buf *a) {
    buf b = *a;
    b.h = malloc(bytes_of(a));
    memcpy(b.h, a->h, bytes_of(a));
    b.d = gpu->alloc(gpu, bytes_of(a));
    gpu->copy(gpu, b.d, a->d, bytes_of(a), KILN_COPY_ON_DEVICE);
    return b;
}

typedef struct {
    int64_t B, T, C, NH, V, Vp;
} sizes;

static int32_t *rand_ids(int64_t n, int64_t below) {
    int32_t *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++)
        x[i] = (int32_t)kiln_rng_below(&rng, (uint64_t)below);
    return x;
}

/* ---- the ops ---- */

static void test_encoder(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    int32_t *ids = rand_ids(N, s->V);
    ids[N - 1] = ids[0];
    buf wte = mk(s->Vp * C, dt, 1, 0), wpe = mk(s->T * C, dt, 1, 0), dout = mk(N * C, dt, 1, 0);
    buf out = mk(N * C, dt, 1e3f, 0), dwte = mk(s->Vp * C, F32, 1, 0), dwpe = mk(s->T * C, F32, 1, 0);
    ref->encoder_forward(ref, dt, out.h, ids, wte.h, wpe.h, s->B, s->T, C);
    gpu->encoder_forward(gpu, dt, out.d, ids, wte.d, wpe.d, s->B, s->T, C);
    cmp("encoder_forward", &out, 2 * U());
    ref->encoder_backward(ref, dt, dwte.h, dwpe.h, dout.h, ids, s->B, s->T, C);
    gpu->encoder_backward(gpu, dt, dwte.d, dwpe.d, dout.d, ids, s->B, s->T, C);
    cmp("encoder_backward dwte", &dwte, 1e-5);
    cmp("encoder_backward dwpe", &dwpe, 1e-5);
    /* the ids as device memory: the same results */
    int32_t *dids = gpu->alloc(gpu, (size_t)N * sizeof(int32_t));
    gpu->copy(gpu, dids, ids, (size_t)N * sizeof(int32_t), KILN_COPY_TO_DEVICE);
    buf out2 = clone(&out), dwte2 = clone(&dwte);
    gpu->encoder_forward(gpu, dt, out2.d, dids, wte.d, wpe.d, s->B, s->T, C);
    check_true("encoder_forward with device ids", gpu_same(&out, &out2));
    buf dwpe2 = clone(&dwpe);
    gpu->encoder_backward(gpu, dt, dwte.d, dwpe.d, dout.d, ids, s->B, s->T, C);
    gpu->encoder_backward(gpu, dt, dwte2.d, dwpe2.d, dout.d, dids, s->B, s->T, C);
    check_true("encoder_backward with device ids, and twice the same", gpu_same(&dwte, &dwte2));
    gpu->free(gpu, dids);
    /* no position table (rotary positions): wpe NULL, dwpe NULL */
    ref->encoder_forward(ref, dt, out.h, ids, wte.h, NULL, s->B, s->T, C);
    gpu->encoder_forward(gpu, dt, out.d, ids, wte.d, NULL, s->B, s->T, C);
    cmp("encoder_forward without wpe", &out, 2 * U());
    /* from the same values on both sides (the GPU's dwte took the runs above) */
    gpu->copy(gpu, dwte.d, dwte.h, bytes_of(&dwte), KILN_COPY_TO_DEVICE);
    ref->encoder_backward(ref, dt, dwte.h, NULL, dout.h, ids, s->B, s->T, C);
    gpu->encoder_backward(gpu, dt, dwte.d, NULL, dout.d, ids, s->B, s->T, C);
    cmp("encoder_backward without dwpe", &dwte, 1e-5);
    free(ids);
    rm(&wte), rm(&wpe), rm(&dout), rm(&out), rm(&dwte), rm(&dwpe), rm(&out2), rm(&dwte2),
        rm(&dwpe2);
}

static void test_layernorm(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    buf inp = mk(N * C, dt, 2, 3), w = mk(C, dt, 1, 1), b = mk(C, dt, 1, 0), dout = mk(N * C, dt, 1, 0);
    buf out = mk(N * C, dt, 1e3f, 0), mean = mk(N, F32, 1e3f, 0), rstd = mk(N, F32, 1e3f, 0);
    ref->layernorm_forward(ref, dt, out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C);
    gpu->layernorm_forward(gpu, dt, out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C);
    cmp("layernorm_forward out", &out, 1e-5 + 4 * U());
    cmp("layernorm_forward mean", &mean, 1e-5);
    cmp("layernorm_forward rstd", &rstd, 1e-5);
    /* backward from the same statistics on both sides (the reference's) */
    gpu->copy(gpu, mean.d, mean.h, bytes_of(&mean), KILN_COPY_TO_DEVICE);
    gpu->copy(gpu, rstd.d, rstd.h, bytes_of(&rstd), KILN_COPY_TO_DEVICE);
    buf dinp = mk(N * C, dt, 1, 0), dw = mk(C, F32, 1, 0), db = mk(C, F32, 1, 0);
    buf dinp2 = clone(&dinp), dw2 = clone(&dw), db2 = clone(&db);
    ref->layernorm_backward(ref, dt, dinp.h, dw.h, db.h, dout.h, inp.h, w.h, mean.h, rstd.h, N, C);
    gpu->layernorm_backward(gpu, dt, dinp.d, dw.d, db.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    gpu->layernorm_backward(gpu, dt, dinp2.d, dw2.d, db2.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    cmp("layernorm_backward dinp", &dinp, 1e-4 + 4 * U());
    cmp("layernorm_backward dweight", &dw, 1e-4);
    cmp("layernorm_backward dbias", &db, 1e-4);
    check_true("layernorm_backward twice the same",
               gpu_same(&dinp, &dinp2) && gpu_same(&dw, &dw2) && gpu_same(&db, &db2));
    /* fused residual: res separate, then res the same pointer as a */
    buf a = mk(N * C, dt, 1, 0), res = mk(N * C, dt, 1e3f, 0);
    ref->residual_layernorm_forward(ref, dt, res.h, out.h, mean.h, rstd.h, a.h, inp.h, w.h, b.h, N, C);
    gpu->residual_layernorm_forward(gpu, dt, res.d, out.d, mean.d, rstd.d, a.d, inp.d, w.d, b.d, N, C);
    cmp("residual_layernorm_forward res", &res, 2 * U());
    cmp("residual_layernorm_forward out", &out, 1e-5 + 4 * U());
    cmp("residual_layernorm_forward mean", &mean, 1e-5);
    cmp("residual_layernorm_forward rstd", &rstd, 1e-5);
    ref->residual_layernorm_forward(ref, dt, a.h, out.h, mean.h, rstd.h, a.h, inp.h, w.h, b.h, N, C);
    gpu->residual_layernorm_forward(gpu, dt, a.d, out.d, mean.d, rstd.d, a.d, inp.d, w.d, b.d, N, C);
    cmp("residual_layernorm_forward in place", &a, 2 * U());
    cmp("residual_layernorm_forward in place out", &out, 1e-5 + 4 * U());
    rm(&inp), rm(&w), rm(&b), rm(&dout), rm(&out), rm(&mean), rm(&rstd), rm(&dinp), rm(&dw),
        rm(&db), rm(&dinp2), rm(&dw2), rm(&db2), rm(&a), rm(&res);
}

static void test_rmsnorm(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    float eps = 1e-6f;
    buf inp = mk(N * C, dt, 2, 1), w = mk(C, dt, 1, 1), dout = mk(N * C, dt, 1, 0);
    buf out = mk(N * C, dt, 1e3f, 0), rstd = mk(N, F32, 1e3f, 0);
    ref->rmsnorm_forward(ref, dt, out.h, rstd.h, inp.h, w.h, N, C, eps);
    gpu->rmsnorm_forward(gpu, dt, out.d, rstd.d, inp.d, w.d, N, C, eps);
    cmp("rmsnorm_forward out", &out, 1e-5 + 4 * U());
    cmp("rmsnorm_forward rstd", &rstd, 1e-5);
    /* backward from the same statistics on both sides (the reference's) */
    gpu->copy(gpu, rstd.d, rstd.h, bytes_of(&rstd), KILN_COPY_TO_DEVICE);
    buf dinp = mk(N * C, dt, 1, 0), dw = mk(C, F32, 1, 0);
    buf dinp2 = clone(&dinp), dw2 = clone(&dw);
    ref->rmsnorm_backward(ref, dt, dinp.h, dw.h, dout.h, inp.h, w.h, rstd.h, N, C);
    gpu->rmsnorm_backward(gpu, dt, dinp.d, dw.d, dout.d, inp.d, w.d, rstd.d, N, C);
    gpu->rmsnorm_backward(gpu, dt, dinp2.d, dw2.d, dout.d, inp.d, w.d, rstd.d, N, C);
    cmp("rmsnorm_backward dinp", &dinp, 1e-4 + 4 * U());
    cmp("rmsnorm_backward dweight", &dw, 1e-4);
    check_true("rmsnorm_backward twice the same", gpu_same(&dinp, &dinp2) && gpu_same(&dw, &dw2));
    /* fused residual: res separate, then res the same pointer as a */
    buf a = mk(N * C, dt, 1, 0), res = mk(N * C, dt, 1e3f, 0);
    ref->residual_rmsnorm_forward(ref, dt, res.h, out.h, rstd.h, a.h, inp.h, w.h, N, C, eps);
    gpu->residual_rmsnorm_forward(gpu, dt, res.d, out.d, rstd.d, a.d, inp.d, w.d, N, C, eps);
    cmp("residual_rmsnorm_forward res", &res, 2 * U());
    cmp("residual_rmsnorm_forward out", &out, 1e-5 + 4 * U());
    cmp("residual_rmsnorm_forward rstd", &rstd, 1e-5);
    ref->residual_rmsnorm_forward(ref, dt, a.h, out.h, rstd.h, a.h, inp.h, w.h, N, C, eps);
    gpu->residual_rmsnorm_forward(gpu, dt, a.d, out.d, rstd.d, a.d, inp.d, w.d, N, C, eps);
    cmp("residual_rmsnorm_forward in place", &a, 2 * U());
    cmp("residual_rmsnorm_forward in place out", &out, 1e-5 + 4 * U());
    rm(&inp), rm(&w), rm(&dout), rm(&out), rm(&rstd), rm(&dinp), rm(&dw), rm(&dinp2), rm(&dw2),
        rm(&a), rm(&res);
}

/* Rotary embeddings on qkv (B,T,(NH + 2 NKV) hs), forward and backward, from position 0 and
 * 37, with Llama 2's base and Llama 3's. The angles stay below 100 radians: an fp32 inv_freq
 * one ulp off between the host's powf and the GPU's power moves them by 6e-6 at most. */
static void test_rope(const sizes *s, int64_t NKV) {
    int64_t NH = s->NH, hs = s->C / NH, W = (NH + 2 * NKV) * hs, n = s->B * s->T * W;
    static const float thetas[2] = {10000.0f, 500000.0f};
    for (int k = 0; k < 2; k++)
        for (int64_t pos0 = 0; pos0 <= 37; pos0 += 37) {
            char op[64];
            buf q = mk(n, dt, 1, 0), dq = mk(n, dt, 1, 0);
            ref->rope_forward(ref, dt, q.h, s->B, s->T, NH, NKV, hs, pos0, thetas[k]);
            gpu->rope_forward(gpu, dt, q.d, s->B, s->T, NH, NKV, hs, pos0, thetas[k]);
            snprintf(op, sizeof op, "rope_forward%s", pos0 ? " (from position 37)" : "");
            cmp(op, &q, 1e-5 + 2 * U());
            ref->rope_backward(ref, dt, dq.h, s->B, s->T, NH, NKV, hs, pos0, thetas[k]);
            gpu->rope_backward(gpu, dt, dq.d, s->B, s->T, NH, NKV, hs, pos0, thetas[k]);
            snprintf(op, sizeof op, "rope_backward%s", pos0 ? " (from position 37)" : "");
            cmp(op, &dq, 1e-5 + 2 * U());
            rm(&q), rm(&dq);
        }
}

static void test_swiglu(const sizes *s) {
    int64_t N = s->B * s->T, H = 2 * s->C + 1; /* no multiple of the block */
    buf inp = mk(N * 2 * H, dt, 3, 0), dout = mk(N * H, dt, 1, 0);
    buf out = mk(N * H, dt, 1e3f, 0), dinp = mk(N * 2 * H, dt, 1e3f, 0);
    ref->swiglu_forward(ref, dt, out.h, inp.h, N, H);
    gpu->swiglu_forward(gpu, dt, out.d, inp.d, N, H);
    cmp("swiglu_forward", &out, 1e-5 + 2 * U());
    ref->swiglu_backward(ref, dt, dinp.h, inp.h, dout.h, N, H);
    gpu->swiglu_backward(gpu, dt, dinp.d, inp.d, dout.d, N, H);
    cmp("swiglu_backward", &dinp, 1e-5 + 2 * U());
    rm(&inp), rm(&dout), rm(&out), rm(&dinp);
}

static void one_matmul(const char *name, int64_t N, int64_t C, int64_t OC, int trans_w,
                       int with_bias, int gelu, int with_dinp) {
    char op[64];
    buf inp = mk(N * C, dt, 1, 0), w = mk(C * OC, dt, 0.1f, 0), bias = mk(OC, dt, 1, 0);
    buf out = mk(N * OC, dt, 1e3f, 0), g = mk(N * OC, dt, 1e3f, 0), dout = mk(N * OC, dt, 1, 0);
    ref->matmul_forward(ref, dt, out.h, inp.h, w.h, with_bias ? bias.h : NULL, N, C, OC, trans_w,
                        gelu ? g.h : NULL);
    gpu->matmul_forward(gpu, dt, out.d, inp.d, w.d, with_bias ? bias.d : NULL, N, C, OC, trans_w,
                        gelu ? g.d : NULL);
    snprintf(op, sizeof op, "matmul_forward %s", name);
    cmp(op, &out, 1e-4 + 4 * U());
    if (gelu) {
        snprintf(op, sizeof op, "matmul_forward %s gelu", name);
        cmp(op, &g, 1e-4 + 8 * U());
    }
    buf dinp = mk(N * C, dt, 1e3f, 0), dw = mk(C * OC, F32, 1, 0), db = mk(OC, F32, 1, 0);
    ref->matmul_backward(ref, dt, with_dinp ? dinp.h : NULL, dw.h, with_bias ? db.h : NULL, dout.h,
                         inp.h, w.h, N, C, OC, trans_w);
    gpu->matmul_backward(gpu, dt, with_dinp ? dinp.d : NULL, dw.d, with_bias ? db.d : NULL, dout.d,
                         inp.d, w.d, N, C, OC, trans_w);
    if (with_dinp) {
        snprintf(op, sizeof op, "matmul_backward %s dinp", name);
        cmp(op, &dinp, 1e-4 + 4 * U());
    }
    snprintf(op, sizeof op, "matmul_backward %s dweight", name);
    cmp(op, &dw, 1e-4);
    if (with_bias) {
        snprintf(op, sizeof op, "matmul_backward %s dbias", name);
        cmp(op, &db, 1e-4);
    }
    rm(&inp), rm(&w), rm(&bias), rm(&out), rm(&g), rm(&dout), rm(&dinp), rm(&dw), rm(&db);
}

static void test_matmul(const sizes *s) {
    int64_t N = s->B * s->T, C = s->C;
    one_matmul("qkv", N, C, 3 * C, 0, 1, 0, 1);
    one_matmul("fc+gelu", N, C, 4 * C, 0, 1, 1, 1);
    int old = kiln_cuda_set_flag(KILN_CUDA_FUSE_GELU, 0);
    one_matmul("fc+gelu unfused", N, C, 4 * C, 0, 1, 1, 1);
    kiln_cuda_set_flag(KILN_CUDA_FUSE_GELU, old);
    one_matmul("proj", N, 4 * C, C, 0, 1, 0, 1);
    one_matmul("head", N, C, s->Vp, 1, 0, 0, 1);
    one_matmul("no dinp", N, C, C, 0, 0, 0, 0);
}

/* Whether attention runs on tensor cores with KILN_CUDA_TC_ATTENTION on: bf16 and fp16 at head
 * sizes that are multiples of 16 up to 128 (and 16-byte aligned tensors, as cudaMalloc's are);
 * CUDA cores otherwise, whatever the flag. */
static int att_tc_fits(int64_t hs) {
    return dt != F32 && hs % 16 == 0 && hs >= 16 && hs <= 128;
}

/* Attention with the flag on ("tc" where the tensor-core kernels fit) and off ("cc"), each
 * forward with each backward (either reads what the other saved), against the reference.
 * Tolerances: fp32 arithmetic on CUDA cores reads O back rounded for D = rowsum(dO O) (the
 * backward's 16 u). The tensor-core kernels also round each probability P to the dtype before
 * P V, which moves an output element by at most u/2 of the weighted mean of |v|: about one
 * unit of the dtype at the scale of the row's values, inside the forward's 4 u with the two
 * backends' roundings of the output; and P and dS = P (dP - D) before dV = P^T dO,
 * dK = dS^T Q and dQ = dS K, each term off by at most u/2 of itself, inside the backward's
 * 16 u (an emulation of the kernels' tiling on the CPU, at these shapes, saw 1.2 u and 1.8 u
 * at most). */
static void test_attention(const sizes *s, int64_t NKV) {
    int64_t B = s->B, T = s->T, C = s->C, NH = s->NH, W = C + 2 * NKV * (C / NH);
    int fits = att_tc_fits(C / NH);
    static const char *path[2] = {"cc", "tc"};
    buf qkv = mk(B * T * W, dt, 1, 0), dout = mk(B * T * C, dt, 1, 0);
    buf out = mk(B * T * C, dt, 1e3f, 0), dqkv = mk(B * T * W, dt, 1e3f, 0);
    size_t rs = ref->attention_saved_bytes(ref, dt, B, T, C, NH, NKV),
           rw = ref->attention_scratch_bytes(ref, dt, B, T, C, NH, NKV);
    size_t gs = gpu->attention_saved_bytes(gpu, dt, B, T, C, NH, NKV),
           gw = gpu->attention_scratch_bytes(gpu, dt, B, T, C, NH, NKV);
    void *rsaved = calloc(1, rs ? rs : 1), *rscr = calloc(1, rw ? rw : 1);
    ref->attention_forward(ref, dt, out.h, rsaved, rscr, qkv.h, B, T, C, NH, NKV);
    ref->attention_backward(ref, dt, dqkv.h, rscr, dout.h, qkv.h, rsaved, B, T, C, NH, NKV);
    /* [f]: forward with the flag f; [f][b]: that forward's saved, backward with the flag b.
     * Each starts from the same device values as out and dqkv (all must be overwritten). */
    void *gsaved[2], *gscr = gpu->alloc(gpu, gw);
    buf o[2], d[2][2];
    char op[64];
    int old = kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, 1);
    for (int f = 0; f < 2; f++) {
        gsaved[f] = gpu->alloc(gpu, gs);
        o[f] = clone(&out);
        kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, f);
        gpu->attention_forward(gpu, dt, o[f].d, gsaved[f], gscr, qkv.d, B, T, C, NH, NKV);
        snprintf(op, sizeof op, "attention_forward %s", path[f && fits]);
        cmp(op, &o[f], 1e-4 + 4 * U());
    }
    for (int f = 0; f < 2; f++)
        for (int b = 0; b < 2; b++) {
            d[f][b] = clone(&dqkv);
            kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, b);
            gpu->attention_backward(gpu, dt, d[f][b].d, gscr, dout.d, qkv.d, gsaved[f], B, T, C,
                                    NH, NKV);
            if (f != b && !fits)
                continue; /* the same kernels as f == b */
            snprintf(op, sizeof op, "attention_backward %s%s", path[b && fits],
                     f == b ? ""
                     : f    ? " after forward tc"
                            : " after forward cc");
            cmp(op, &d[f][b], 1e-4 + 16 * U());
        }
    for (int b = 0; b < 2; b++) { /* no atomics: twice the same bits, on each path */
        buf again = clone(&dqkv);
        kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, b);
        gpu->attention_backward(gpu, dt, again.d, gscr, dout.d, qkv.d, gsaved[b], B, T, C, NH,
                                NKV);
        snprintf(op, sizeof op, "attention_backward %s twice the same", path[b && fits]);
        check_true(op, gpu_same(&d[b][b], &again));
        rm(&again);
    }
    kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, old);
    /* The flag switches kernels exactly where the tensor-core ones fit: their rounded P gives
     * other bits once rows have several keys; elsewhere the same kernels run either way. */
    if (fits && T >= 8)
        check_true("attention: tc and cc paths give different bits (the flag switches kernels)",
                   !gpu_same(&o[0], &o[1]) || !gpu_same(&d[0][0], &d[1][1]));
    else if (!fits)
        check_true("attention: the flag changes nothing where tensor cores do not fit",
                   gpu_same(&o[0], &o[1]) && gpu_same(&d[0][0], &d[1][1]));
    printf("attention %-4s B %lld T %3lld C %3lld NH %lld NKV %lld (head size %3lld): %s\n",
           kiln_dtype_name(dt), (long long)B, (long long)T, (long long)C, (long long)NH,
           (long long)NKV, (long long)(C / NH),
           fits ? "tc and cc, each forward with each backward" : "cc (flag on and off)");
    free(rsaved), free(rscr);
    gpu->free(gpu, gsaved[0]), gpu->free(gpu, gsaved[1]), gpu->free(gpu, gscr);
    rm(&qkv), rm(&dout), rm(&out), rm(&dqkv), rm(&o[0]), rm(&o[1]);
    for (int f = 0; f < 2; f++)
        rm(&d[f][0]), rm(&d[f][1]);
}

/* attention_decode: each of B sequences has ldT = T + 3 rows, Tk = T of them filled (the
 * rest NaN, which must not be read), the last Tq queries' outputs against the reference's:
 * all T rows (what attention_forward gives them), one row (a generation step) and three. */
static void test_decode(const sizes *s, int64_t NKV) {
    int64_t B = s->B, Tk = s->T, ldT = Tk + 3, C = s->C, NH = s->NH, W = C + 2 * NKV * (C / NH);
    buf qkv = mk(B * ldT * W, dt, 1, 0);
    float *nan_row = malloc((size_t)W * sizeof(float));
    for (int64_t i = 0; i < W; i++)
        nan_row[i] = NAN;
    size_t e = kiln_dtype_size(dt);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = Tk; t < ldT; t++)
            kiln_convert((char *)qkv.h + (size_t)((b * ldT + t) * W) * e, dt, nan_row, F32, W);
    gpu->copy(gpu, qkv.d, qkv.h, bytes_of(&qkv), KILN_COPY_TO_DEVICE);
    free(nan_row);
    int64_t tqs[3] = {Tk, 1, Tk < 3 ? Tk : 3};
    for (int k = 0; k < 3; k++) {
        int64_t Tq = tqs[k];
        buf out = mk(B * Tq * C, dt, 1e3f, 0);
        ref->attention_decode(ref, dt, out.h, qkv.h, B, ldT, Tk, Tq, C, NH, NKV);
        gpu->attention_decode(gpu, dt, out.d, qkv.d, B, ldT, Tk, Tq, C, NH, NKV);
        cmp(k == 0 ? "attention_decode all rows" : "attention_decode last rows", &out,
            1e-4 + 4 * U());
        rm(&out);
    }
    rm(&qkv);
}

/* Attention and decode with NKV = NH, NH/2 (when NH is even) and 1. */
static void test_attention_gqa(const sizes *s) {
    int64_t nkv[3] = {s->NH, s->NH % 2 == 0 ? s->NH / 2 : s->NH, 1};
    for (int k = 0; k < 3; k++) {
        if ((k == 1 && nkv[1] == nkv[0]) || (k == 2 && (nkv[2] == nkv[1] || nkv[2] == nkv[0])))
            continue; /* each distinct count once */
        test_attention(s, nkv[k]);
        test_decode(s, nkv[k]);
        test_rope(s, nkv[k]);
    }
}

static void test_elementwise(const sizes *s) {
    int64_t n = s->B * s->T * s->C * 4 + 3;
    buf x = mk(n, dt, 2, 0), y = mk(n, dt, 1, 0), out = mk(n, dt, 1e3f, 0);
    ref->gelu_forward(ref, dt, out.h, x.h, n);
    gpu->gelu_forward(gpu, dt, out.d, x.d, n);
    cmp("gelu_forward", &out, 1e-6 + 2 * U());
    ref->gelu_backward(ref, dt, out.h, x.h, y.h, n);
    gpu->gelu_backward(gpu, dt, out.d, x.d, y.d, n);
    cmp("gelu_backward", &out, 1e-6 + 2 * U());
    ref->residual_forward(ref, dt, out.h, x.h, y.h, n);
    gpu->residual_forward(gpu, dt, out.d, x.d, y.d, n);
    cmp("residual_forward", &out, 2 * U());
    rm(&x), rm(&y), rm(&out);
}

static void test_crossentropy(const sizes *s) {
    int64_t N = s->B * s->T, V = s->V, Vp = s->Vp;
    int32_t *tg = rand_ids(N, V);
    buf logits = mk(N * Vp, dt, 3, 0), d = mk(N * Vp, dt, 1e3f, 0), losses = mk(N, F32, 1e3f, 0);
    float dloss = 1.0f / (float)N;
    ref->crossentropy_forward_backward(ref, dt, losses.h, d.h, logits.h, tg, dloss, N, V, Vp);
    gpu->crossentropy_forward_backward(gpu, dt, losses.d, d.d, logits.d, tg, dloss, N, V, Vp);
    cmp("crossentropy losses", &losses, 1e-5);
    cmp("crossentropy dlogits", &d, 1e-5 + 4 * U());
    /* padded columns exactly 0 */
    float *g = gpu_f32(&d);
    int pad_zero = 1;
    for (int64_t r = 0; r < N; r++)
        for (int64_t v = V; v < Vp; v++)
            pad_zero &= g[r * Vp + v] == 0.0f;
    free(g);
    check_true("crossentropy padded columns 0", pad_zero);
    /* in place, and losses only */
    ref->crossentropy_forward_backward(ref, dt, losses.h, logits.h, logits.h, tg, dloss, N, V, Vp);
    gpu->crossentropy_forward_backward(gpu, dt, losses.d, logits.d, logits.d, tg, dloss, N, V, Vp);
    cmp("crossentropy in place dlogits", &logits, 1e-5 + 4 * U());
    buf l2 = mk(N, dt, 3, 0), losses2 = mk(N, F32, 1e3f, 0);
    buf lg = mk(N * Vp, dt, 3, 0);
    ref->crossentropy_forward_backward(ref, dt, losses2.h, NULL, lg.h, tg, dloss, N, V, Vp);
    gpu->crossentropy_forward_backward(gpu, dt, losses2.d, NULL, lg.d, tg, dloss, N, V, Vp);
    cmp("crossentropy losses only", &losses2, 1e-5);
    free(tg);
    rm(&logits), rm(&d), rm(&losses), rm(&l2), rm(&losses2), rm(&lg);
}

/* ---- slabs: sums, scale, zero, convert, optimizers (dtype-independent parts run once per
 * dtype as the working copy's type) ---- */

static void test_slabs(void) {
    int64_t n = 100003;
    buf x = mk(n, F32, 1, 0.5f), xd = mk(n, dt, 1, 0.5f);
    double rs = ref->sum(ref, x.h, n), gs = gpu->sum(gpu, x.d, n);
    record("sum", fabs(gs - rs) / fmax(fabs(rs), 1e-30), 1e-12);
    double rq = ref->sumsq(ref, dt, xd.h, n), gq = gpu->sumsq(gpu, dt, xd.d, n);
    record("sumsq", fabs(gq - rq) / fmax(fabs(rq), 1e-30), 1e-12);
    check_true("sum of 0 elements", gpu->sum(gpu, x.d, 0) == 0.0);
    float inf = INFINITY;
    ref->scale(ref, x.h, 0.37f, n);
    gpu->scale(gpu, x.d, 0.37f, n);
    cmp("scale", &x, 0);
    gpu->zero(gpu, x.d, (size_t)n * sizeof(float));
    memset(x.h, 0, (size_t)n * sizeof(float));
    cmp("zero", &x, 0);
    /* a non-finite element makes sumsq non-finite */
    buf y = mk(n, F32, 1, 0);
    gpu->copy(gpu, (float *)y.d + 12345, &inf, sizeof inf, KILN_COPY_TO_DEVICE);
    check_true("sumsq of a slab with inf is not finite", !isfinite(gpu->sumsq(gpu, F32, y.d, n)));
    /* conversions from and to the dtype under test */
    kiln_dtype others[3] = {F32, BF16, F16};
    for (int k = 0; k < 3; k++) {
        buf src = mk(n, others[k], 3, 0), dst = mk(n, dt, 1e3f, 0);
        ref->convert(ref, dst.h, dt, src.h, others[k], n);
        gpu->convert(gpu, dst.d, dt, src.d, others[k], n);
        char op[64];
        snprintf(op, sizeof op, "convert from %s", kiln_dtype_name(others[k]));
        cmp(op, &dst, 0);
        rm(&src), rm(&dst);
    }
    rm(&x), rm(&xd), rm(&y);
}

/* One optimizer step on both sides with the working copy in dt (stochastic for bf16). */
static void test_optim(void) {
    int64_t n = 54321;
    for (int kind = 0; kind < 3; kind++) {
        buf p = mk(n, F32, 1, 0), g = mk(n, F32, 1, 0), s0 = mk(n, F32, 0.1f, 0), s1 = mk(n, F32, 0.1f, 0);
        float *sq = s1.h; /* second moments positive */
        for (int64_t i = 0; i < n; i++)
            sq[i] = fabsf(sq[i]);
        gpu->copy(gpu, s1.d, s1.h, bytes_of(&s1), KILN_COPY_TO_DEVICE);
        buf work = mk(n, dt, 1e3f, 0);
        kiln_work_out wr = {work.h, dt, dt == BF16 ? 0x1234567ull : 0, 1000};
        kiln_work_out wg = {work.d, dt, dt == BF16 ? 0x1234567ull : 0, 1000};
        const char *name = kind == 0 ? "adam_update" : kind == 1 ? "sgd_update" : "rmsprop_update";
        if (kind == 0) {
            ref->adam_update(ref, p.h, &wr, g.h, 0.5f, s0.h, s1.h, n, 1e-3f, 0.9f, 0.95f, 0.1f,
                             0.05f, 1e-8f, 0.1f, 0.01f);
            gpu->adam_update(gpu, p.d, &wg, g.d, 0.5f, s0.d, s1.d, n, 1e-3f, 0.9f, 0.95f, 0.1f,
                             0.05f, 1e-8f, 0.1f, 0.01f);
        } else if (kind == 1) {
            ref->sgd_update(ref, p.h, &wr, g.h, 0.5f, s0.h, n, 1e-2f, 0.9f, 0.1f, 1, 0.01f, 0);
            gpu->sgd_update(gpu, p.d, &wg, g.d, 0.5f, s0.d, n, 1e-2f, 0.9f, 0.1f, 1, 0.01f, 0);
        } else {
            ref->rmsprop_update(ref, p.h, &wr, g.h, 0.5f, s1.h, s0.h, n, 1e-3f, 0.99f, 1e-8f,
                                0.01f, 0.9f);
            gpu->rmsprop_update(gpu, p.d, &wg, g.d, 0.5f, s1.d, s0.d, n, 1e-3f, 0.99f, 1e-8f,
                                0.01f, 0.9f);
        }
        char op[64];
        snprintf(op, sizeof op, "%s p", name);
        cmp(op, &p, 1e-6);
        snprintf(op, sizeof op, "%s state", name);
        cmp(op, &s0, 1e-6);
        snprintf(op, sizeof op, "%s working copy", name);
        cmp(op, &work, 1e-6 + 2 * U());
        rm(&p), rm(&g), rm(&s0), rm(&s1), rm(&work);
    }
}

/* An op that cannot run records its error; synchronize reports it once and clears it. */
static void test_errors(void) {
    int64_t B = 1, T = 4, C = 300, NH = 1; /* head size 300: beyond the kernels' 256 */
    buf qkv = mk(B * T * 3 * C, dt, 1, 0), out = mk(B * T * C, dt, 1, 0);
    void *saved = gpu->alloc(gpu, gpu->attention_saved_bytes(gpu, dt, B, T, C, NH, NH));
    gpu->attention_forward(gpu, dt, out.d, saved, NULL, qkv.d, B, T, C, NH, NH);
    kiln_status s = gpu->synchronize(gpu);
    check_true("an op that cannot run is reported", s == KILN_ERR_UNSUPPORTED);
    check_true("with a message", strstr(kiln_error_message(), "head size") != NULL);
    check_true("and then cleared", gpu->synchronize(gpu) == KILN_OK);
    /* 3 key/value heads for 4 query heads: no grouping */
    gpu->attention_forward(gpu, dt, out.d, saved, NULL, qkv.d, 1, 2, 64, 4, 3);
    check_true("key/value heads that do not divide the query heads are reported",
               gpu->synchronize(gpu) == KILN_ERR_UNSUPPORTED);
    gpu->free(gpu, saved);
    rm(&qkv), rm(&out);
}

int main(void) {
    char why[512];
    if (kiln_cuda_available(why, sizeof why) != KILN_OK) {
        printf("SKIP: no CUDA GPU (%s)\n", why);
        fprintf(stderr, "SKIP: no CUDA GPU (%s)\n", why);
        return 77;
    }
    printf("%s\n", why);
    ref = kiln_backend_ref();
    gpu = kiln_backend_cuda();
    if (!gpu) {
        fprintf(stderr, "kiln_backend_cuda: %s\n", kiln_error_message());
        return 1;
    }
    kiln_rng_seed(&rng, 1234);
    /* head sizes 12, 24, 64, 128, 32, 200; V no multiple of 128; T = 1, 23, 33, ... */
    const sizes shapes[] = {
        {2, 23, 72, 6, 1001, 1024}, {1, 1, 48, 2, 50, 64},     {2, 64, 128, 2, 300, 384},
        {1, 40, 256, 2, 129, 256},  {1, 33, 96, 3, 77, 128},   {1, 17, 200, 1, 10, 16},
    };
    /* attention alone: the tensor-core kernels' tiles of 64 rows and keys at head sizes 64
     * and 128 (and 16, 48, 80, padded to 32, 64, 128), T of no multiple of 64 (1, 17, 70,
     * 100, 130, 257), several batch rows and heads */
    const sizes att_shapes[] = {
        {2, 100, 128, 2, 0, 0}, {1, 257, 256, 2, 0, 0}, {3, 17, 192, 3, 0, 0}, {2, 1, 256, 2, 0, 0},
        {1, 70, 96, 2, 0, 0},   {1, 33, 80, 1, 0, 0},   {2, 130, 64, 4, 0, 0},
    };
    const kiln_dtype dts[] = {F32, BF16, F16};
    for (int k = 0; k < 3; k++) {
        dt = dts[k];
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const sizes *s = &shapes[i];
            test_encoder(s);
            test_layernorm(s);
            test_rmsnorm(s);
            test_matmul(s);
            test_attention_gqa(s);
            test_swiglu(s);
            test_elementwise(s);
            test_crossentropy(s);
        }
        for (size_t i = 0; i < sizeof att_shapes / sizeof att_shapes[0]; i++)
            test_attention_gqa(&att_shapes[i]);
        test_slabs();
        test_optim();
        test_errors();
    }
    printf("\n%-48s %-5s %10s %10s %4s  %s\n", "op", "dtype", "max error", "tolerance", "runs",
           "");
    for (int i = 0; i < nrows; i++)
        printf("%-48s %-5s %10.3g %10.3g %4d  %s\n", rows[i].op, kiln_dtype_name(rows[i].t),
               rows[i].err, rows[i].tol, rows[i].n, rows[i].err <= rows[i].tol ? "ok" : "FAIL");
    printf("\n%d checks, %d failed\n", checks, failures);
    return failures ? 1 : checks ? 0 : 1;
}
