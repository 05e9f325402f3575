/* Milliseconds per CPU-backend op at GPT-2 124M's shapes (B=4, T=64 unless given), and
 * an estimate of one training step's time put together from them, so that one run shows
 * where a step's time goes. Matrix products also show GFLOP/s and the share of the
 * machine's sgemm peak measured in the same run.
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

static const kiln_backend *be;
static double total_ms; /* the step estimate */
static double peak;

static float *buf(int64_t n, float value) {
    float *x = kiln_alloc((size_t)n * sizeof(float));
    if (!x) {
        fprintf(stderr, "bench_ops: out of memory for %lld floats\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = value * (float)((i * 2654435761u) % 1000) / 1000.0f;
    return x;
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

/* One table row; `per_step` is how many times a training step runs the op. */
static void row(const char *name, double ms, double flops, int per_step) {
    total_ms += ms * per_step;
    if (flops > 0) {
        double gflops = flops / (ms * 1e6);
        printf("%-36s %9.3f %6d %9.1f %8.1f %5.0f%%\n", name, ms, per_step, ms * per_step, gflops,
               peak > 0 ? 100.0 * gflops / peak : 0.0);
    } else {
        printf("%-36s %9.3f %6d %9.1f\n", name, ms, per_step, ms * per_step);
    }
}

static void bench_matmul(const char *name, int64_t N, int64_t in, int64_t out, int trans_w,
                         int bias, int per_step) {
    float *x = buf(N * in, 1.0f), *w = buf(in * out, 0.02f), *b = bias ? buf(out, 0.1f) : NULL;
    float *y = buf(N * out, 0), *dy = buf(N * out, 0.01f), *dx = buf(N * in, 0);
    float *dw = buf(in * out, 0), *db = bias ? buf(out, 0) : NULL;
    double flops = 2.0 * (double)N * (double)in * (double)out, ms;
    char label[64];
    TIME_MS(ms, be->matmul_forward(y, x, w, b, N, in, out, trans_w));
    snprintf(label, sizeof label, "%s fwd", name);
    row(label, ms, flops, per_step);
    TIME_MS(ms, be->matmul_backward(dx, dw, db, dy, x, w, N, in, out, trans_w));
    snprintf(label, sizeof label, "%s bwd", name);
    row(label, ms, 2 * flops, per_step);
    kiln_free(x), kiln_free(w), kiln_free(b), kiln_free(y), kiln_free(dy), kiln_free(dx);
    kiln_free(dw), kiln_free(db);
}

static void bench_layers(int64_t B, int64_t T) {
    int64_t N = B * T;
    double ms;
    float *qkv = buf(N * 3 * C, 0.5f), *att = buf(B * NH * T * T, 0), *out = buf(N * C, 0);
    float *dout = buf(N * C, 0.01f), *dqkv = buf(N * 3 * C, 0), *scratch = buf(B * NH * T * T, 0);
    double att_flops = 4.0 * (double)B * NH * (double)T * (double)T * (C / NH);
    TIME_MS(ms, be->attention_forward(out, att, qkv, B, T, C, NH));
    row("attention fwd", ms, att_flops, L);
    TIME_MS(ms, be->attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH));
    row("attention bwd", ms, 2 * att_flops, L);

    float *x = buf(N * C, 1.0f), *w = buf(C, 1.0f), *bb = buf(C, 0.1f), *mean = buf(N, 0);
    float *rstd = buf(N, 0), *dx = buf(N * C, 0), *dw = buf(C, 0), *db = buf(C, 0);
    TIME_MS(ms, be->layernorm_forward(out, mean, rstd, x, w, bb, N, C));
    row("layernorm fwd", ms, 0, 2 * L + 1);
    TIME_MS(ms, be->layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C));
    row("layernorm bwd", ms, 0, 2 * L + 1);
    TIME_MS(ms, be->residual_forward(out, x, dout, N * C));
    row("residual fwd", ms, 0, 2 * L);

    float *h = buf(N * 4 * C, 1.0f), *gh = buf(N * 4 * C, 0), *dh = buf(N * 4 * C, 0.01f);
    TIME_MS(ms, be->gelu_forward(gh, h, N * 4 * C));
    row("gelu fwd (N x 3072)", ms, 0, L);
    TIME_MS(ms, be->gelu_backward(gh, h, dh, N * 4 * C));
    row("gelu bwd (N x 3072)", ms, 0, L);

    int32_t *ids = malloc((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 7919) % V);
    float *wte = buf((int64_t)VP * C, 0.02f), *wpe = buf(1024 * C, 0.02f);
    TIME_MS(ms, be->encoder_forward(out, ids, wte, wpe, B, T, C));
    row("encoder fwd", ms, 0, 1);
    TIME_MS(ms, be->encoder_backward(wte, wpe, dout, ids, B, T, C));
    row("encoder bwd", ms, 0, 1);

    float *logits = buf(N * VP, 1.0f), *losses = buf(N, 0), *dlogits = buf(N * VP, 0);
    TIME_MS(ms, be->crossentropy_forward_backward(losses, dlogits, logits, ids, 1.0f / (float)N, N,
                                                  V, VP));
    row("crossentropy fwd+bwd (N x 50304)", ms, 0, 1);
    free(ids);
    kiln_free(qkv), kiln_free(att), kiln_free(out), kiln_free(dout), kiln_free(dqkv);
    kiln_free(scratch), kiln_free(x), kiln_free(w), kiln_free(bb), kiln_free(mean);
    kiln_free(rstd), kiln_free(dx), kiln_free(dw), kiln_free(db), kiln_free(h), kiln_free(gh);
    kiln_free(dh), kiln_free(wte), kiln_free(wpe), kiln_free(logits), kiln_free(losses);
    kiln_free(dlogits);
}

static void bench_slabs(void) {
    int64_t n = NPARAMS;
    double ms;
    float *p = buf(n, 0.02f), *g = buf(n, 0.001f), *m = buf(n, 0), *v = buf(n, 0);
    TIME_MS(ms, be->adam_update(p, g, m, v, n, 6e-4f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.1f, 0.0f));
    row("adam_update (124M)", ms, 0, 1);
    TIME_MS(ms, be->zero(g, n));
    row("zero (124M)", ms, 0, 1);
    volatile double sink = 0;
    TIME_MS(ms, sink += be->sumsq(g, n));
    row("sumsq (124M)", ms, 0, 1);
    TIME_MS(ms, be->scale(g, 0.5f, n));
    row("scale (124M)", ms, 0, 0);
    (void)sink;
    kiln_free(p), kiln_free(g), kiln_free(m), kiln_free(v);
}

int main(int argc, char **argv) {
    int64_t B = argc > 2 ? atoll(argv[1]) : 4, T = argc > 2 ? atoll(argv[2]) : 64;
    if (B < 1 || T < 1 || T > 1024) {
        fprintf(stderr, "usage: bench_ops [B T] with 1 <= T <= 1024\n");
        return 2;
    }
    be = kiln_backend_cpu();
    const char *coretype = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
    printf("bench_ops: GPT-2 124M shapes, B=%lld T=%lld, %d threads, OPENBLAS_CORETYPE %s%s, "
           "OPENBLAS_L2_SIZE %s%s\n",
           (long long)B, (long long)T, omp_get_max_threads(), coretype ? "=" : "unset",
           coretype ? coretype : "", l2 ? "=" : "unset", l2 ? l2 : "");
    peak = kiln_backend_cpu_peak_gflops(VP, 2.0);
    printf("sgemm peak (kiln_backend_cpu_peak_gflops): %.1f GFLOP/s\n\n", peak);
    printf("%-36s %9s %6s %9s %8s %6s\n", "op", "ms", "/step", "ms/step", "GFLOP/s", "peak");
    int64_t N = B * T;
    bench_matmul("matmul qkv 768->2304", N, C, 3 * C, 0, 1, L);
    bench_matmul("matmul attn proj 768->768", N, C, C, 0, 1, L);
    bench_matmul("matmul fc 768->3072", N, C, 4 * C, 0, 1, L);
    bench_matmul("matmul fc proj 3072->768", N, 4 * C, C, 0, 1, L);
    bench_matmul("matmul classifier 768->50304", N, C, VP, 1, 0, 1);
    bench_layers(B, T);
    bench_slabs();
    double model_flops = 6.0 * (double)NPARAMS * (double)N + 12.0 * L * (double)N * T * C;
    printf("\nestimated step (sum of ms/step): %.1f ms; model FLOPs %.1f GFLOP -> %.1f GFLOP/s "
           "(%.0f%% of peak)\n",
           total_ms, model_flops / 1e9, model_flops / (total_ms * 1e6),
           peak > 0 ? 100.0 * model_flops / (total_ms * 1e6) / peak : 0.0);
    return 0;
}
