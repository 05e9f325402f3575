/* Low-rank factorisation (src/compress/lowrank.c): the SVD and the rank it picks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/compress.h"
#include "kiln/model.h"
#include "test.h"

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* max |a - b| over n */
static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0.0;
    for (int64_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* out (K,N) = U (K,r) V (r,N) */
static void product(float *out, const float *U, const float *V, int64_t K, int64_t N,
                    int64_t r) {
    for (int64_t i = 0; i < K; i++)
        for (int64_t c = 0; c < N; c++) {
            double acc = 0.0;
            for (int64_t j = 0; j < r; j++)
                acc += (double)U[i * r + j] * (double)V[j * N + c];
            out[i * N + c] = (float)acc;
        }
}

static void test_energy_rank(void) {
    const float s[3] = {3.0f, 2.0f, 1.0f}; /* squares 9, 4, 1 of 14 */
    CHECK_NEAR(kiln_lowrank_energy(s, 3, 1), 9.0 / 14.0, 1e-12);
    CHECK_NEAR(kiln_lowrank_energy(s, 3, 2), 13.0 / 14.0, 1e-12);
    CHECK_NEAR(kiln_lowrank_energy(s, 3, 3), 1.0, 1e-12);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 0.5), 1);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 9.0 / 14.0), 1); /* exactly reached */
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 0.7), 2);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 0.95), 3);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 1.0), 3);
    const float zero[2] = {0.0f, 0.0f};
    CHECK_NEAR(kiln_lowrank_energy(zero, 2, 1), 1.0, 0.0);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(zero, 2, 1.0), 1);
}

static void test_kinds_parse(void) {
    int want[4];
    CHECK_OK(kiln_lowrank_kinds_parse("fc,fcproj", want));
    CHECK_TRUE(!want[0] && !want[1] && want[2] && want[3]);
    CHECK_OK(kiln_lowrank_kinds_parse("attproj,qkv,fcproj,fc", want));
    CHECK_TRUE(want[0] && want[1] && want[2] && want[3]);
    CHECK_STATUS(kiln_lowrank_kinds_parse("fc,mlp", want), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_kinds_parse("fc,fc", want), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_kinds_parse("", want), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_kinds_parse("fc,", want), KILN_ERR_ARG);
    CHECK_STR_EQ(kiln_lowrank_kind_name(KILN_GPT_MATRIX_FCPROJ), "fcproj");
    CHECK_TRUE(kiln_lowrank_kind_name(KILN_GPT_MATRIX_HEAD) == NULL);
}

/* A matrix of rank 3 (plus nothing): its SVD has three values above noise, the factors of
 * rank 3 give it back, and of rank k (the full SVD) too; the values decrease. Both shapes,
 * wide and tall. */
static void test_svd(void) {
    for (int tall = 0; tall < 2; tall++) {
        int64_t K = tall ? 40 : 12, N = tall ? 9 : 30, r0 = 3, k = K < N ? K : N;
        float *A = malloc((size_t)(K * r0) * sizeof *A), *Bm = malloc((size_t)(r0 * N) * sizeof *Bm);
        float *w = malloc((size_t)(K * N) * sizeof *w), *w2 = malloc((size_t)(K * N) * sizeof *w2);
        float *s = malloc((size_t)k * sizeof *s), *u = malloc((size_t)(K * k) * sizeof *u);
        float *vt = malloc((size_t)(k * N) * sizeof *vt);
        float *U = malloc((size_t)(K * k) * sizeof *U), *V = malloc((size_t)(k * N) * sizeof *V);
        srand(7 + tall);
        for (int64_t i = 0; i < K * r0; i++)
            A[i] = frand();
        for (int64_t i = 0; i < r0 * N; i++)
            Bm[i] = frand();
        product(w, A, Bm, K, N, r0);
        CHECK_OK(kiln_lowrank_svd(w, K, N, s, u, vt));
        for (int64_t i = 1; i < k; i++)
            CHECK_TRUE(s[i] <= s[i - 1]);
        CHECK_TRUE(s[2] > 1e-2f);
        CHECK_TRUE(s[3] < 1e-5f * s[0]);
        CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, k, 0.999999), 3);
        kiln_lowrank_split(U, V, u, s, vt, K, N, k, 3);
        product(w2, U, V, K, N, 3);
        CHECK_NEAR(max_diff(w, w2, K * N), 0.0, 1e-5);
        kiln_lowrank_split(U, V, u, s, vt, K, N, k, k);
        product(w2, U, V, K, N, k);
        CHECK_NEAR(max_diff(w, w2, K * N), 0.0, 1e-5);
        /* balanced: the factors' columns and rows carry the same norm, sqrt(s) */
        double nu = 0.0, nv = 0.0;
        for (int64_t i = 0; i < K; i++)
            nu += (double)U[i * k] * U[i * k];
        for (int64_t c = 0; c < N; c++)
            nv += (double)V[c] * V[c];
        CHECK_NEAR(nu, nv, 1e-4 * nu);
        /* one rank fewer loses exactly the energy of the dropped value */
        kiln_lowrank_split(U, V, u, s, vt, K, N, k, 2);
        product(w2, U, V, K, N, 2);
        double err = 0.0, tot = 0.0;
        for (int64_t i = 0; i < K * N; i++) {
            err += ((double)w[i] - w2[i]) * ((double)w[i] - w2[i]);
            tot += (double)w[i] * w[i];
        }
        CHECK_NEAR(err / tot, 1.0 - kiln_lowrank_energy(s, k, 2), 1e-4);
        w[5] = NAN;
        CHECK_STATUS(kiln_lowrank_svd(w, K, N, s, u, vt), KILN_ERR_RANGE);
        free(A), free(Bm), free(w), free(w2), free(s), free(u), free(vt), free(U), free(V);
    }
}

int main(void) {
    RUN_TEST(test_energy_rank);
    RUN_TEST(test_kinds_parse);
    RUN_TEST(test_svd);
    TEST_MAIN_END();
}
