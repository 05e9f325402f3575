/* The machine's GEMM rate, measured with the GEMM the CPU backend uses: kiln__cpu_gemm's
 * fp32 implementation (oneDNN or OpenBLAS sgemm) for fp32, its bf16 implementation (bf16 inputs,
 * fp32 accumulation and output) for bf16. MFU in each precision is reported against the rate of
 * that precision. */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/gemm.h"
#include "kiln/backend.h"
#include "kiln/core.h"

/* One (M x K) x (K x N) product in dt (fp32 output); 0 on success. */
static int gemm_once(kiln_dtype dt, const void *a, const void *b, float *c, int64_t M, int64_t K,
                     int64_t N) {
    return kiln__cpu_gemm(c, KILN_DTYPE_F32, N, a, dt, K, 0, b, dt, N, 0, M, N, K, 1.0f, 0.0f,
                          NULL) != KILN_OK;
}

/* GFLOP/s of the best of repeated (M x K) x (K x N) products within `seconds`; 0 when the
 * buffers cannot be had or the product fails. */
static double time_gemm(kiln_dtype dt, int64_t M, int64_t K, int64_t N, double seconds) {
    size_t es = kiln_dtype_size(dt);
    float *a = kiln_alloc((size_t)(M * K) * es);
    float *b = kiln_alloc((size_t)(K * N) * es);
    float *af = kiln_alloc((size_t)(M * K > K * N ? M * K : K * N) * sizeof(float));
    float *c = kiln_alloc((size_t)(M * N) * sizeof(float));
    double best = 0.0;
    if (!a || !b || !af || !c)
        goto done;
    for (int64_t i = 0; i < M * K; i++)
        af[i] = (float)((i * 7 + 3) % 13) * 0.01f - 0.06f;
    kiln_convert(a, dt, af, KILN_DTYPE_F32, M * K);
    for (int64_t i = 0; i < K * N; i++)
        af[i] = (float)((i * 5 + 1) % 11) * 0.01f - 0.05f;
    kiln_convert(b, dt, af, KILN_DTYPE_F32, K * N);
    /* one untimed call warms the thread pool and the caches (and builds oneDNN's kernel) */
    if (gemm_once(dt, a, b, c, M, K, N))
        goto done;
    double start = kiln_time_ms();
    int reps = 0;
    do {
        double t0 = kiln_time_ms();
        gemm_once(dt, a, b, c, M, K, N);
        double ms = kiln_time_ms() - t0;
        double gflops = 2.0 * (double)M * (double)N * (double)K / (ms * 1e6);
        if (ms > 0 && gflops > best)
            best = gflops;
        reps++;
    } while (reps < 2 || kiln_time_ms() - start < seconds * 1000.0);
done:
    kiln_free(a);
    kiln_free(b);
    kiln_free(af);
    kiln_free(c);
    return best;
}

double kiln_backend_cpu_peak_gflops_dtype(kiln_dtype dt, int64_t max_dim, double seconds) {
    if (kiln_dtype_size(dt) == 0)
        return 0.0;
    if (max_dim < 64)
        max_dim = 64;
    /* square products up to max_dim, then GPT-2-124M's MLP and classifier shapes */
    int64_t shapes[][3] = {{512, 512, 512},  {1024, 1024, 1024}, {2048, 2048, 2048},
                           {256, 768, 3072}, {256, 3072, 768},   {256, 768, 50304}};
    int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    int usable = 0;
    for (int i = 0; i < nshapes; i++)
        if (shapes[i][0] <= max_dim && shapes[i][1] <= max_dim && shapes[i][2] <= max_dim)
            usable++;
    double per = seconds / (usable > 0 ? usable : 1);
    double best = 0.0;
    for (int i = 0; i < nshapes; i++) {
        int64_t M = shapes[i][0], K = shapes[i][1], N = shapes[i][2];
        if (M > max_dim || K > max_dim || N > max_dim)
            continue;
        double g = time_gemm(dt, M, K, N, per);
        if (g > best)
            best = g;
    }
    if (usable == 0)
        best = time_gemm(dt, max_dim, max_dim, max_dim, seconds);
    return best;
}

double kiln_backend_cpu_peak_gflops(int64_t max_dim, double seconds) {
    return kiln_backend_cpu_peak_gflops_dtype(KILN_DTYPE_F32, max_dim, seconds);
}

void kiln_backend_cpu_warm_products(int64_t M, int64_t K, int64_t N) {
    if (M <= 0 || K <= 0 || N <= 0)
        return;
    /* calloc, not kiln_alloc (which writes its zeros): input pages that are only read map
     * the kernel's zero page; the outputs' pages are given back when freed */
    float *x = calloc((size_t)(M * K), sizeof(float)); /* (M,K) */
    float *w = calloc((size_t)(K * N), sizeof(float)); /* (N,K) */
    float *y = calloc((size_t)(M * N), sizeof(float)); /* (M,N) */
    if (x && w && y) {
        kiln__cpu_sgemm(0, 1, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N); /* y = x w^T */
        kiln__cpu_sgemm(0, 0, M, K, N, 1.0f, y, N, w, K, 0.0f, x, K); /* dx = dy w */
        kiln__cpu_sgemm(1, 0, N, K, M, 1.0f, y, N, x, K, 1.0f, w, K); /* dw += dy^T x */
    }
    free(x);
    free(w);
    free(y);
}

const char *kiln_backend_cpu_gemm_name(kiln_dtype dt) {
    if (dt == KILN_DTYPE_F32)
        return kiln__cpu_gemm_f32_name(kiln__cpu_gemm_get_f32());
    if (dt == KILN_DTYPE_F16)
        return "fp16 widened to fp32, then the fp32 product (no fp16 dot-product instructions)";
    return kiln__cpu_gemm_impl_name(kiln__cpu_gemm_get_impl());
}
