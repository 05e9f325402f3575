/* The machine's fp32 GEMM rate, measured with the GEMM the CPU backend uses. */
#include <cblas.h>
#include <stdint.h>

#include "kiln/backend.h"
#include "kiln/core.h"

/* GFLOP/s of the best of repeated (M x K) x (K x N) products within `seconds`; 0 when the
 * buffers cannot be had. */
static double time_gemm(int64_t M, int64_t K, int64_t N, double seconds) {
    float *a = kiln_alloc((size_t)(M * K) * sizeof(float));
    float *b = kiln_alloc((size_t)(K * N) * sizeof(float));
    float *c = kiln_alloc((size_t)(M * N) * sizeof(float));
    double best = 0.0;
    if (!a || !b || !c)
        goto done;
    for (int64_t i = 0; i < M * K; i++)
        a[i] = (float)((i * 7 + 3) % 13) * 0.01f - 0.06f;
    for (int64_t i = 0; i < K * N; i++)
        b[i] = (float)((i * 5 + 1) % 11) * 0.01f - 0.05f;
    /* one untimed call warms the thread pool and the caches */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a, (int)K,
                b, (int)N, 0.0f, c, (int)N);
    double start = kiln_time_ms();
    int reps = 0;
    do {
        double t0 = kiln_time_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a,
                    (int)K, b, (int)N, 0.0f, c, (int)N);
        double ms = kiln_time_ms() - t0;
        double gflops = 2.0 * (double)M * (double)N * (double)K / (ms * 1e6);
        if (ms > 0 && gflops > best)
            best = gflops;
        reps++;
    } while (reps < 2 || kiln_time_ms() - start < seconds * 1000.0);
done:
    kiln_free(a);
    kiln_free(b);
    kiln_free(c);
    return best;
}

double kiln_backend_cpu_peak_gflops(int64_t max_dim, double seconds) {
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
        double g = time_gemm(M, K, N, per);
        if (g > best)
            best = g;
    }
    if (usable == 0)
        best = time_gemm(max_dim, max_dim, max_dim, seconds);
    return best;
}
