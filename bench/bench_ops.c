/* Milliseconds per CPU-backend op at GPT-2 124M's shapes (B=4, T=64 unless given), in fp32
 * and in bf16 side by side, and an estimate of one training step's time in each put together
 * from them, so that one run shows where a step's time goes and what bf16 changes. Each op
 * is timed the same way in both dtypes (best of repeated runs, in this run), and the ratio
 * bf16 / fp32 is printed. Matrix products also show GFLOP/s and their share of the machine's
 * sgemm peak measured in the same run.
 *
 * The counts per step are those of the default model (kiln_gpt_options_default: both
 * fusions on, no recomputation, the whole classifier at once). The unfused ops the fusions
 * replace are timed too, with a count of 0, for comparison. In a bf16 step the parameter
 * gradients and the optimizer state stay fp32; AdamW also writes the bf16 working copy.
 *
 *   bench_ops [B T]      (OMP_NUM_THREADS sets the thread count) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"

#define L 12
#define C 768
#define NH 12
#define V 50257
#define VP 50304
#define NPARAMS 124475904LL /* GPT-2 124M with the vocabulary padded to 50304 */

enum { NDT = 2 };
static const kiln_dtype dts[NDT] = {KILN_DTYPE_F32, KILN_DTYPE_BF16};

static kiln_backend *be;
static double total_ms[NDT]; /* the step estimates */
static double peak;

/* n elements of type t with values spread over [0, value), in backend memory. */
static void *buf(int64_t n, float value, kiln_dtype t) {
    float *x = kiln_alloc((size_t)n * sizeof(float));
    void *y = be->alloc(be, (size_t)n * kiln_dtype_size(t));
    if (!x || !y) {
        fprintf(stderr, "bench_ops: out of memory for %lld values\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = value * (float)((i * 2654435761u) % 1000) / 1000.0f;
    be->convert(be, y, t, x, KILN_DTYPE_F32, n);
    kiln_free(x);
    return y;
}

static void unbuf(void *p) {
    be->free(be, p);
}

/* Best of repeated runs within about 0.3 s (at least 3), after one warm-up run. */
#define TIME_MS(out_ms, stmt)                                                                      \
    do {                                                                                           \
        stmt;                                                                                      \
        double best_ = 1e30, start_ = kiln_time_ms();                                              \
        for (int r_ = 0; r_ < 3 || kiln_time_ms() - start_ < 300.0; r_++) {                        \
            double t0_ = kiln_time_ms();                                                           \
            stmt;                                                                                  \
            double ms_ = kiln_time_ms() - t0_;                                                     \
            best_ = ms_ < best_ ? ms_ : best_;                                                     \
            if (r_ > 200)                                                                          \
                break;                                                                             \
        }                                                                                          \
        (out_ms) = best_;                                                                          \
    } while (0)

/* One table row: the op's time in each dtype; `per_step` is how many times a training step
 * runs it. */
static void row(const char *name, const double ms[NDT], double flops, int per_step) {
    for (int d = 0; d < NDT; d++)
        total_ms[d] += ms[d] * per_step;
    printf("%-38s %6d %9.3f %9.3f %6.2f", name, per_step, ms[0], ms[1], ms[1] / ms[0]);
    if (flops > 0)
        for (int d = 0; d < NDT; d++) {
            double gflops = flops / (ms[d] * 1e6);
            printf(" %8.1f %4.0f%%", gflops, peak > 0 ? 100.0 * gflops / peak : 0.0);
        }
    printf("\n");
}

static void bench_matmul(const char *name, int64_t N, int64_t in, int64_t out, int trans_w,
                         int bias, int gelu, int per_step) {
    double fwd[NDT], bwd[NDT], flops = 2.0 * (double)N * (double)in * (double)out;
    for (int d = 0; d < NDT; d++) {
        kiln_dtype t = dts[d];
        void *x = buf(N * in, 1.0f, t), *w = buf(in * out, 0.02f, t);
        void *b = bias ? buf(out, 0.1f, t) : NULL, *y = buf(N * out, 0, t);
        void *g = gelu ? buf(N * out, 0, t) : NULL, *dy = buf(N * out, 0.01f, t);
        void *dx = buf(N * in, 0, t);
        float *dw = buf(in * out, 0, KILN_DTYPE_F32),
              *db = bias ? buf(out, 0, KILN_DTYPE_F32) : NULL;
        TIME_MS(fwd[d], be->matmul_forward(be, t, y, x, w, b, N, in, out, trans_w, g));
        TIME_MS(bwd[d], be->matmul_backward(be, t, dx, dw, db, dy, x, w, N, in, out, trans_w));
        unbuf(x), unbuf(w), unbuf(b), unbuf(y), unbuf(g), unbuf(dy), unbuf(dx), unbuf(dw);
        unbuf(db);
    }
    char label[64];
    snprintf(label, sizeof label, "%s%s fwd", name, gelu ? " +gelu" : "");
    row(label, fwd, flops, per_step);
    snprintf(label, sizeof label, "%s bwd", name);
    row(label, bwd, 2 * flops, per_step);
}

static void bench_attention(int64_t B, int64_t T) {
    int64_t N = B * T;
    double fwd[NDT], bwd[NDT], flops = 4.0 * (double)B * NH * (double)T * (double)T * (C / NH);
    for (int d = 0; d < NDT; d++) {
        kiln_dtype t = dts[d];
        void *qkv = buf(N * 3 * C, 0.5f, t), *out = buf(N * C, 0, t), *dout = buf(N * C, 0.01f, t);
        void *dqkv = buf(N * 3 * C, 0, t);
        void *saved = be->alloc(be, be->attention_saved_bytes(be, t, B, T, C, NH, NH));
        void *scratch = be->alloc(be, be->attention_scratch_bytes(be, t, B, T, C, NH, NH));
        if (!saved || !scratch) {
            fprintf(stderr, "bench_ops: out of memory for attention\n");
            exit(1);
        }
        TIME_MS(fwd[d], be->attention_forward(be, t, out, saved, scratch, qkv, B, T, C, NH, NH));
        TIME_MS(bwd[d],
                be->attention_backward(be, t, dqkv, scratch, dout, qkv, saved, B, T, C, NH, NH));
        unbuf(qkv), unbuf(out), unbuf(dout), unbuf(dqkv), unbuf(saved), unbuf(scratch);
    }
    row("attention fwd", fwd, flops, L);
    row("attention bwd", bwd, 2 * flops, L);
}

static void bench_layers(int64_t B, int64_t T) {
    int64_t N = B * T;
    enum { LN_F, LN_B, RES_LN, RES, GELU_F, GELU_B, ENC_F, ENC_B, CE, NOPS };
    double ms[NOPS][NDT];
    int32_t *ids = malloc((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 7919) % V);
    for (int d = 0; d < NDT; d++) {
        kiln_dtype t = dts[d];
        void *x = buf(N * C, 1.0f, t), *w = buf(C, 1.0f, t), *bb = buf(C, 0.1f, t);
        void *out = buf(N * C, 0, t), *res = buf(N * C, 0, t), *dout = buf(N * C, 0.01f, t);
        void *dx = buf(N * C, 0, t);
        float *mean = buf(N, 0, KILN_DTYPE_F32), *rstd = buf(N, 0, KILN_DTYPE_F32);
        float *dw = buf(C, 0, KILN_DTYPE_F32), *db = buf(C, 0, KILN_DTYPE_F32);
        TIME_MS(ms[LN_F][d], be->layernorm_forward(be, t, out, mean, rstd, x, w, bb, N, C));
        TIME_MS(ms[LN_B][d],
                be->layernorm_backward(be, t, dx, dw, db, dout, x, w, mean, rstd, N, C));
        TIME_MS(ms[RES_LN][d],
                be->residual_layernorm_forward(be, t, res, out, mean, rstd, x, dout, w, bb, N, C));
        TIME_MS(ms[RES][d], be->residual_forward(be, t, out, x, dout, N * C));

        void *h = buf(N * 4 * C, 1.0f, t), *gh = buf(N * 4 * C, 0, t);
        void *dh = buf(N * 4 * C, 0.01f, t);
        TIME_MS(ms[GELU_F][d], be->gelu_forward(be, t, gh, h, N * 4 * C));
        TIME_MS(ms[GELU_B][d], be->gelu_backward(be, t, gh, h, dh, N * 4 * C));

        void *wte = buf((int64_t)VP * C, 0.02f, t), *wpe = buf(1024 * C, 0.02f, t);
        float *dwte = buf((int64_t)VP * C, 0, KILN_DTYPE_F32),
              *dwpe = buf(1024 * C, 0, KILN_DTYPE_F32);
        TIME_MS(ms[ENC_F][d], be->encoder_forward(be, t, out, ids, wte, wpe, B, T, C));
        TIME_MS(ms[ENC_B][d], be->encoder_backward(be, t, dwte, dwpe, dout, ids, B, T, C));

        void *logits = buf(N * VP, 1.0f, t), *dlogits = buf(N * VP, 0, t);
        float *losses = buf(N, 0, KILN_DTYPE_F32);
        TIME_MS(ms[CE][d], be->crossentropy_forward_backward(be, t, losses, dlogits, logits, ids,
                                                             1.0f / (float)N, N, V, VP));
        unbuf(x), unbuf(w), unbuf(bb), unbuf(out), unbuf(res), unbuf(dout), unbuf(dx);
        unbuf(mean), unbuf(rstd), unbuf(dw), unbuf(db), unbuf(h), unbuf(gh), unbuf(dh);
        unbuf(wte), unbuf(wpe), unbuf(dwte), unbuf(dwpe), unbuf(logits), unbuf(dlogits);
        unbuf(losses);
    }
    free(ids);
    /* the default model: block 0's first LayerNorm alone; each residual add with the
     * LayerNorm after it (ln_2, then the next ln_1 or ln_f); GELU in the c_fc product */
    row("layernorm fwd", ms[LN_F], 0, 1);
    row("residual+layernorm fwd (fused)", ms[RES_LN], 0, 2 * L);
    row("layernorm bwd", ms[LN_B], 0, 2 * L + 1);
    row("residual fwd (unfused)", ms[RES], 0, 0);
    row("gelu fwd (N x 3072, unfused)", ms[GELU_F], 0, 0);
    row("gelu bwd (N x 3072)", ms[GELU_B], 0, L);
    row("encoder fwd", ms[ENC_F], 0, 1);
    row("encoder bwd", ms[ENC_B], 0, 1);
    row("crossentropy fwd+bwd (N x 50304)", ms[CE], 0, 1);
}

/* The optimizer and slab ops over the 124M parameters: the fp32 step updates the fp32
 * weights in place; the bf16 step updates the fp32 master weights and writes the bf16
 * working copy. Gradients are fp32 in both. */
static void bench_slabs(void) {
    int64_t n = NPARAMS;
    double adam[NDT], zero[NDT], sumsq[NDT], scale[NDT], wsumsq[NDT];
    volatile double sink = 0;
    for (int d = 0; d < NDT; d++) {
        kiln_dtype t = dts[d];
        float *p = buf(n, 0.02f, KILN_DTYPE_F32), *g = buf(n, 0.001f, KILN_DTYPE_F32);
        float *m = buf(n, 0, KILN_DTYPE_F32), *v = buf(n, 0, KILN_DTYPE_F32);
        void *work = t == KILN_DTYPE_F32 ? NULL : buf(n, 0, t);
        kiln_work_out w = {work, t, 0, 0};
        TIME_MS(adam[d], be->adam_update(be, p, work ? &w : NULL, g, 1.0f, m, v, n, 6e-4f, 0.9f, 0.95f,
                                         0.1f, 0.05f, 1e-8f, 0.1f, 0.0f));
        TIME_MS(zero[d], be->zero(be, g, (size_t)n * sizeof(float)));
        TIME_MS(sumsq[d], sink += be->sumsq(be, KILN_DTYPE_F32, g, n));
        TIME_MS(scale[d], be->scale(be, g, 0.5f, n));
        /* the finite-weights check reads the working weights */
        TIME_MS(wsumsq[d], sink += be->sumsq(be, t, work ? work : p, n));
        unbuf(p), unbuf(g), unbuf(m), unbuf(v), unbuf(work);
    }
    (void)sink;
    row("adam_update (124M)", adam, 0, 1);
    row("zero grads (124M)", zero, 0, 1);
    row("sumsq grads (124M)", sumsq, 0, 1);
    row("scale grads (124M)", scale, 0, 0);
    row("sumsq working weights (124M)", wsumsq, 0, 0);
}

int main(int argc, char **argv) {
    int64_t B = argc > 2 ? atoll(argv[1]) : 4, T = argc > 2 ? atoll(argv[2]) : 64;
    if (B < 1 || T < 1 || T > 1024) {
        fprintf(stderr, "usage: bench_ops [B T] with 1 <= T <= 1024\n");
        return 2;
    }
    be = kiln_backend_cpu();
    if (be->prepare && be->prepare(be) != KILN_OK) {
        fprintf(stderr, "bench_ops: %s\n", kiln_error_message());
        return 1;
    }
    const char *coretype = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
    printf("bench_ops: GPT-2 124M shapes, B=%lld T=%lld, %d threads, OPENBLAS_CORETYPE %s%s, "
           "OPENBLAS_L2_SIZE %s%s\n",
           (long long)B, (long long)T, omp_get_max_threads(), coretype ? "=" : "unset",
           coretype ? coretype : "", l2 ? "=" : "unset", l2 ? l2 : "");
    peak = kiln_backend_cpu_peak_gflops(VP, 2.0);
    printf("sgemm peak (kiln_backend_cpu_peak_gflops): %.1f GFLOP/s\n\n", peak);
    printf("%-38s %6s %9s %9s %6s %8s %5s %8s %5s\n", "op", "/step", "fp32 ms", "bf16 ms", "ratio",
           "fp32 GF", "peak", "bf16 GF", "peak");
    int64_t N = B * T;
    bench_matmul("matmul qkv 768->2304", N, C, 3 * C, 0, 1, 0, L);
    bench_matmul("matmul attn proj 768->768", N, C, C, 0, 1, 0, L);
    bench_matmul("matmul fc 768->3072", N, C, 4 * C, 0, 1, 1, L);
    bench_matmul("matmul fc proj 3072->768", N, 4 * C, C, 0, 1, 0, L);
    bench_matmul("matmul classifier 768->50304", N, C, VP, 1, 0, 0, 1);
    bench_attention(B, T);
    bench_layers(B, T);
    bench_slabs();
    kiln_status s = be->synchronize(be);
    if (s != KILN_OK) {
        fprintf(stderr, "bench_ops: %s\n", kiln_error_message());
        return 1;
    }
    double model_flops = 6.0 * (double)NPARAMS * (double)N + 12.0 * L * (double)N * T * C;
    for (int d = 0; d < NDT; d++)
        printf("%sestimated %s step (sum of ms/step): %.1f ms; model FLOPs %.1f GFLOP -> %.1f "
               "GFLOP/s (%.0f%% of the sgemm peak)\n",
               d ? "" : "\n", kiln_dtype_name(dts[d]), total_ms[d], model_flops / 1e9,
               model_flops / (total_ms[d] * 1e6),
               peak > 0 ? 100.0 * model_flops / (total_ms[d] * 1e6) / peak : 0.0);
    printf("bf16 / fp32 step: %.2f\n", total_ms[1] / total_ms[0]);
    return 0;
}
