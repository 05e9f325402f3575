/* Milliseconds per CUDA-backend op at GPT-2 124M's shapes (C = 768, 12 heads, V = 50257
 * padded to 50304) in bf16, B = 8 and T = 1024 unless given, with TFLOP/s for the products
 * and attention, and an estimate of one training step put together from the ops' counts in
 * the default model (fused residual + LayerNorm and GELU epilogue, no recomputation).
 * Each op: two warm-up calls, then as many calls as fit in about 0.2 s (at least 3), the
 * mean time between two synchronizes. Attention's FLOPs count the causal half of the
 * scores: forward 4 B NH T^2 hs / 2, backward 2.5 times that. Attention is timed on tensor
 * cores (KILN_CUDA_TC_ATTENTION on, the default, which the step estimate counts) and on CUDA
 * cores (the flag off, "/step" 0), for the ratio in one run.
 *
 *   bench_cuda_ops [B T]
 *
 * Without a usable GPU it says why and exits 77. Its last line starts with RESULT. */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/backend.h"
#include "kiln/core.h"

#define L 12
#define C 768
#define NH 12
#define V 50257
#define VP 50304
#define NPARAMS 124475904LL

static kiln_backend *be;
static const kiln_dtype dt = KILN_DTYPE_BF16;
static double step_ms, step_flop, last_ms; /* last_ms: the last TIME's, 0 when it failed */

static void *dbuf(int64_t n, kiln_dtype t, float scale) {
    float *x = malloc((size_t)n * sizeof(float));
    void *h = malloc((size_t)n * kiln_dtype_size(t));
    void *d = be->alloc(be, (size_t)n * kiln_dtype_size(t));
    if (!x || !h || !d) {
        fprintf(stderr, "cannot allocate %lld elements\n", (long long)n);
        exit(1);
    }
    kiln_rng r;
    kiln_rng_seed(&r, (uint64_t)n);
    for (int64_t i = 0; i < n; i++) /* random for activations, a cheap pattern for slabs */
        x[i] = (n < (1 << 24) ? kiln_rng_uniform(&r) : (float)(i % 997) / 997.0f) * scale -
               scale / 2;
    kiln_convert(h, t, x, KILN_DTYPE_F32, n);
    be->copy(be, d, h, (size_t)n * kiln_dtype_size(t), KILN_COPY_TO_DEVICE);
    free(x), free(h);
    return d;
}

#define TIME(name, count, flop, call)                                                              \
    do {                                                                                           \
        last_ms = 0;                                                                               \
        for (int w_ = 0; w_ < 2; w_++)                                                             \
            call;                                                                                  \
        if (be->synchronize(be) != KILN_OK) {                                                      \
            printf("%-34s FAILED: %s\n", name, kiln_error_message());                            \
            failed++;                                                                              \
            break;                                                                                 \
        }                                                                                          \
        double t0_ = kiln_time_ms(), t1_;                                                          \
        int n_ = 0;                                                                                \
        do {                                                                                       \
            call;                                                                                  \
            n_++;                                                                                  \
            if (n_ >= 3 && n_ % 4 == 0)                                                            \
                be->synchronize(be);                                                               \
            t1_ = kiln_time_ms();                                                                  \
        } while (n_ < 3 || t1_ - t0_ < 200.0);                                                     \
        kiln_status s_ = be->synchronize(be);                                                      \
        t1_ = kiln_time_ms();                                                                      \
        double ms_ = (t1_ - t0_) / n_;                                                             \
        if (s_ != KILN_OK) {                                                                       \
            printf("%-34s FAILED: %s\n", name, kiln_error_message());                            \
            failed++;                                                                              \
            break;                                                                                 \
        }                                                                                          \
        last_ms = ms_;                                                                             \
        double f_ = (flop);                                                                        \
        step_ms += (count) * ms_;                                                                  \
        step_flop += (count) * f_;                                                                 \
        if (f_ > 0)                                                                                \
            printf("%-34s %9.3f ms %5d  %8.1f TFLOP/s\n", name, ms_, (int)(count),                 \
                   f_ / ms_ / 1e9);                                                                \
        else                                                                                       \
            printf("%-34s %9.3f ms %5d\n", name, ms_, (int)(count));                               \
    } while (0)

int main(int argc, char **argv) {
    int64_t B = argc > 1 ? atoll(argv[1]) : 8, T = argc > 2 ? atoll(argv[2]) : 1024;
    char why[512];
    if (kiln_cuda_available(why, sizeof why) != KILN_OK) {
        printf("SKIP: no CUDA GPU (%s)\nRESULT skipped\n", why);
        return 77;
    }
    be = kiln_backend_cuda();
    if (!be) {
        printf("kiln_backend_cuda: %s\nRESULT failed\n", kiln_error_message());
        return 1;
    }
    int64_t N = B * T, H = 4 * C;
    printf("%s\nbf16, B %lld, T %lld, C %d, %d heads, V %d (%d padded)\n\n", why, (long long)B,
           (long long)T, C, NH, V, VP);
    printf("%-34s %12s %5s  %s\n", "op", "time", "/step", "rate");
    void *x = dbuf(N * C, dt, 2), *y = dbuf(N * C, dt, 2), *o = dbuf(N * C, dt, 0);
    void *qkv = dbuf(N * 3 * C, dt, 2), *dqkv = dbuf(N * 3 * C, dt, 0);
    void *h = dbuf(N * H, dt, 2), *hg = dbuf(N * H, dt, 0), *dh = dbuf(N * H, dt, 0);
    void *wqkv = dbuf(C * 3 * C, dt, 0.05f), *bqkv = dbuf(3 * C, dt, 0.1f);
    void *wfc = dbuf(C * H, dt, 0.05f), *bfc = dbuf(H, dt, 0.1f);
    void *wp = dbuf(H * C, dt, 0.05f), *bp = dbuf(C, dt, 0.1f), *lw = dbuf(C, dt, 1), *lb = dbuf(C, dt, 1);
    void *wte = dbuf((int64_t)VP * C, dt, 0.05f), *wpe = dbuf(T * C, dt, 0.05f);
    void *logits = dbuf(N * VP, dt, 2);
    float *g = dbuf(NPARAMS, KILN_DTYPE_F32, 1e-3f), *p = dbuf(NPARAMS, KILN_DTYPE_F32, 0.1f);
    float *m = dbuf(NPARAMS, KILN_DTYPE_F32, 0), *v = dbuf(NPARAMS, KILN_DTYPE_F32, 0);
    void *work = dbuf(NPARAMS, dt, 0);
    float *mean = dbuf(N, KILN_DTYPE_F32, 0), *rstd = dbuf(N, KILN_DTYPE_F32, 0);
    float *losses = dbuf(N, KILN_DTYPE_F32, 0);
    float *gw = dbuf((int64_t)VP * C, KILN_DTYPE_F32, 0), *gb = dbuf(H, KILN_DTYPE_F32, 0);
    float *gpe = dbuf(T * C, KILN_DTYPE_F32, 0);
    size_t sv = be->attention_saved_bytes(be, dt, B, T, C, NH, NH),
           sc = be->attention_scratch_bytes(be, dt, B, T, C, NH, NH);
    void *saved = be->alloc(be, sv), *scratch = be->alloc(be, sc);
    int32_t *ids = malloc((size_t)N * sizeof(int32_t));
    kiln_rng r;
    kiln_rng_seed(&r, 7);
    for (int64_t i = 0; i < N; i++)
        ids[i] = (int32_t)kiln_rng_below(&r, V);
    if (!saved || !scratch) {
        printf("cannot allocate attention's buffers\nRESULT failed\n");
        return 1;
    }
    int failed = 0;
    double f_att = 4.0 * (double)B * NH * (double)T * T * (C / NH) / 2;
#define MM(n_, k_, oc_) (2.0 * (double)(n_) * (k_) * (oc_))
    TIME("encoder_forward", 1, 0, be->encoder_forward(be, dt, o, ids, wte, wpe, B, T, C));
    TIME("encoder_backward", 1, 0, be->encoder_backward(be, dt, gw, gpe, o, ids, B, T, C));
    TIME("layernorm_forward", 1, 0, be->layernorm_forward(be, dt, o, mean, rstd, x, lw, lb, N, C));
    TIME("residual_layernorm_forward", 2 * L, 0,
         be->residual_layernorm_forward(be, dt, y, o, mean, rstd, y, x, lw, lb, N, C));
    TIME("layernorm_backward", 2 * L + 1, 0,
         be->layernorm_backward(be, dt, y, gb, gb + C, x, y, lw, mean, rstd, N, C));
    TIME("matmul_forward qkv", L, MM(N, C, 3 * C),
         be->matmul_forward(be, dt, qkv, x, wqkv, bqkv, N, C, 3 * C, 0, NULL));
    TIME("matmul_forward fc + gelu", L, MM(N, C, H),
         be->matmul_forward(be, dt, h, x, wfc, bfc, N, C, H, 0, hg));
    TIME("matmul_forward fcproj", L, MM(N, H, C),
         be->matmul_forward(be, dt, o, hg, wp, bp, N, H, C, 0, NULL));
    TIME("matmul_forward attproj", L, MM(N, C, C),
         be->matmul_forward(be, dt, o, x, wp, bp, N, C, C, 0, NULL));
    TIME("matmul_forward head", 1, MM(N, C, VP),
         be->matmul_forward(be, dt, logits, x, wte, NULL, N, C, VP, 1, NULL));
    TIME("matmul_backward qkv", L, 2 * MM(N, C, 3 * C),
         be->matmul_backward(be, dt, x, gw, gb, qkv, y, wqkv, N, C, 3 * C, 0));
    TIME("matmul_backward fc", L, 2 * MM(N, C, H),
         be->matmul_backward(be, dt, x, gw, gb, h, y, wfc, N, C, H, 0));
    TIME("matmul_backward fcproj", L, 2 * MM(N, H, C),
         be->matmul_backward(be, dt, dh, gw, gb, x, hg, wp, N, H, C, 0));
    TIME("matmul_backward attproj", L, 2 * MM(N, C, C),
         be->matmul_backward(be, dt, y, gw, gb, x, o, wp, N, C, C, 0));
    TIME("matmul_backward head", 1, 2 * MM(N, C, VP),
         be->matmul_backward(be, dt, x, gw, NULL, logits, y, wte, N, C, VP, 1));
    /* tensor cores (the default, in the step estimate), then CUDA cores (KILN_CUDA_TC_ATTENTION
     * off, not in the estimate), each backward from its own path's forward */
    double att_ms[2][2]; /* [tensor cores][backward] */
    int tc_old = kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, 1);
    TIME("attention_forward (tensor cores)", L, f_att,
         be->attention_forward(be, dt, o, saved, scratch, qkv, B, T, C, NH, NH));
    att_ms[1][0] = last_ms;
    TIME("attention_backward (tensor cores)", L, 2.5 * f_att,
         be->attention_backward(be, dt, dqkv, scratch, o, qkv, saved, B, T, C, NH, NH));
    att_ms[1][1] = last_ms;
    kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, 0);
    TIME("attention_forward (CUDA cores)", 0, f_att,
         be->attention_forward(be, dt, o, saved, scratch, qkv, B, T, C, NH, NH));
    att_ms[0][0] = last_ms;
    TIME("attention_backward (CUDA cores)", 0, 2.5 * f_att,
         be->attention_backward(be, dt, dqkv, scratch, o, qkv, saved, B, T, C, NH, NH));
    att_ms[0][1] = last_ms;
    kiln_cuda_set_flag(KILN_CUDA_TC_ATTENTION, tc_old);
    /* the Llama family's ops, not in GPT-2's step estimate: grouped-query attention with a
     * quarter of the heads for keys and values (rows narrower than qkv's 3C), RMSNorm, rotary
     * embeddings on qkv, SwiGLU over h's rows read as (N, 2 (2C)) */
    int NKV = NH % 4 == 0 ? NH / 4 : 1;
    TIME("attention_forward (GQA)", 0, f_att,
         be->attention_forward(be, dt, o, saved, scratch, qkv, B, T, C, NH, NKV));
    TIME("attention_backward (GQA)", 0, 2.5 * f_att,
         be->attention_backward(be, dt, dqkv, scratch, o, qkv, saved, B, T, C, NH, NKV));
    TIME("rmsnorm_forward", 0, 0, be->rmsnorm_forward(be, dt, o, rstd, x, lw, N, C, 1e-5f));
    TIME("rmsnorm_backward", 0, 0,
         be->rmsnorm_backward(be, dt, o, gb, x, y, lw, rstd, N, C));
    TIME("rope_forward", 0, 0,
         be->rope_forward(be, dt, qkv, B, T, NH, NH, C / NH, 0, 10000.0f));
    TIME("swiglu_forward", 0, 0, be->swiglu_forward(be, dt, hg, h, N, 2 * C));
    TIME("swiglu_backward", 0, 0, be->swiglu_backward(be, dt, dh, h, hg, N, 2 * C));
    TIME("gelu_backward", L, 0, be->gelu_backward(be, dt, dh, h, hg, N * H));
    TIME("residual_forward", 0, 0, be->residual_forward(be, dt, o, x, y, N * C));
    TIME("crossentropy_forward_backward", 1, 0,
         be->crossentropy_forward_backward(be, dt, losses, logits, logits, ids, 1.0f / N, N, V,
                                           VP));
    kiln_work_out wo = {work, dt, 0, 0};
    TIME("adam_update (124M, bf16 copy)", 1, 0,
         be->adam_update(be, p, &wo, g, 1.0f, m, v, NPARAMS, 1e-4f, 0.9f, 0.95f, 0.1f, 0.05f,
                         1e-8f, 0.1f, 0.0f));
    TIME("sumsq (124M fp32)", 1, 0, (void)be->sumsq(be, KILN_DTYPE_F32, g, NPARAMS));
    TIME("zero (124M fp32)", 1, 0, be->zero(be, g, (size_t)NPARAMS * sizeof(float)));
    if (att_ms[0][0] > 0 && att_ms[0][1] > 0 && att_ms[1][0] > 0 && att_ms[1][1] > 0)
        printf("\nattention on tensor cores against CUDA cores: forward %.1fx, backward %.1fx "
               "faster\n",
               att_ms[0][0] / att_ms[1][0], att_ms[0][1] / att_ms[1][1]);
    double tok_s = (double)N / (step_ms / 1e3);
    printf("\nstep estimate from the ops: %.1f ms, %.0f tokens/s, %.1f TFLOP/s in products and "
           "attention\n",
           step_ms, tok_s, step_flop / step_ms / 1e9);
    printf("RESULT %s step estimate %.1f ms, %.0f tok/s\n", failed ? "failed" : "ok", step_ms,
           tok_s);
    return failed ? 1 : 0;
}
