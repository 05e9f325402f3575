/* Low-rank factorisation of the blocks' matrices: a truncated SVD (LAPACK) of each matrix,
 * the rank chosen by the energy kept or fixed, and the balanced factors written into a model
 * whose configuration holds the ranks. */
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/compress.h"

static const char *const kind_names[4] = {"qkv", "attproj", "fc", "fcproj"};

const char *kiln_lowrank_kind_name(kiln_gpt_matrix kind) {
    return (unsigned)kind < 4 ? kind_names[kind] : NULL;
}

kiln_status kiln_lowrank_kinds_parse(const char *list, int want[4]) {
    memset(want, 0, 4 * sizeof *want);
    if (!list || !list[0])
        return kiln_error_setf(KILN_ERR_ARG,
                               "no matrices named: give a list of qkv, attproj, fc, fcproj");
    const char *p = list;
    for (;;) {
        size_t n = strcspn(p, ",");
        int k = 0;
        while (k < 4 && !(strlen(kind_names[k]) == n && strncmp(p, kind_names[k], n) == 0))
            k++;
        if (k == 4)
            return kiln_error_setf(KILN_ERR_ARG,
                                   "unknown matrix kind \"%.*s\" in \"%s\" (expected qkv, "
                                   "attproj, fc or fcproj)",
                                   (int)n, p, list);
        if (want[k])
            return kiln_error_setf(KILN_ERR_ARG, "matrix kind \"%s\" is listed twice in \"%s\"",
                                   kind_names[k], list);
        want[k] = 1;
        if (!p[n])
            return KILN_OK;
        p += n + 1;
    }
}

kiln_status kiln_lowrank_svd(const float *w, int64_t K, int64_t N, float *s, float *u,
                             float *vt) {
    int64_t k = K < N ? K : N;
    if (K < 1 || N < 1 || K > (1 << 30) / N)
        return kiln_error_setf(KILN_ERR_ARG, "SVD of a %lld x %lld matrix", (long long)K,
                               (long long)N);
    for (int64_t i = 0; i < K * N; i++)
        if (!isfinite(w[i]))
            return kiln_error_setf(KILN_ERR_RANGE,
                                   "the %lld x %lld matrix holds a NaN or infinite value at "
                                   "(%lld, %lld)",
                                   (long long)K, (long long)N, (long long)(i / N),
                                   (long long)(i % N));
    /* LAPACK overwrites its input; sgesvd wants a second copy should sgesdd fail */
    float *a = malloc((size_t)(K * N) * sizeof *a);
    float *superb = malloc((size_t)k * sizeof *superb);
    if (!a || !superb) {
        free(a), free(superb);
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the SVD of a %lld x %lld matrix",
                               (long long)K, (long long)N);
    }
    memcpy(a, w, (size_t)(K * N) * sizeof *a);
    lapack_int info = LAPACKE_sgesdd(LAPACK_ROW_MAJOR, 'S', (lapack_int)K, (lapack_int)N, a,
                                     (lapack_int)N, s, u, (lapack_int)k, vt, (lapack_int)N);
    if (info > 0) { /* divide and conquer did not converge: QR iteration */
        memcpy(a, w, (size_t)(K * N) * sizeof *a);
        info = LAPACKE_sgesvd(LAPACK_ROW_MAJOR, 'S', 'S', (lapack_int)K, (lapack_int)N, a,
                              (lapack_int)N, s, u, (lapack_int)k, vt, (lapack_int)N, superb);
    }
    free(a), free(superb);
    if (info != 0)
        return kiln_error_setf(info == LAPACK_WORK_MEMORY_ERROR ? KILN_ERR_NOMEM : KILN_ERR_RANGE,
                               "the SVD of a %lld x %lld matrix failed (LAPACK info %d)",
                               (long long)K, (long long)N, (int)info);
    return KILN_OK;
}

double kiln_lowrank_energy(const float *s, int64_t k, int64_t r) {
    double total = 0.0, kept = 0.0;
    for (int64_t i = 0; i < k; i++) {
        double e = (double)s[i] * (double)s[i];
        total += e;
        kept += i < r ? e : 0.0;
    }
    return total > 0.0 ? kept / total : 1.0;
}

int64_t kiln_lowrank_rank_for_energy(const float *s, int64_t k, double energy) {
    double total = 0.0;
    for (int64_t i = 0; i < k; i++)
        total += (double)s[i] * (double)s[i];
    double kept = 0.0;
    for (int64_t r = 1; r <= k; r++) {
        kept += (double)s[r - 1] * (double)s[r - 1];
        /* a relative margin so that energy 1 is reached at k despite rounding in the sums */
        if (kept >= energy * total * (1.0 - 1e-12))
            return r;
    }
    return k;
}

void kiln_lowrank_split(float *U, float *V, const float *u, const float *s, const float *vt,
                        int64_t K, int64_t N, int64_t k, int64_t r) {
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < r; j++)
            U[i * r + j] = u[i * k + j] * sqrtf(s[j]);
    for (int64_t j = 0; j < r; j++) {
        float q = sqrtf(s[j]);
        for (int64_t c = 0; c < N; c++)
            V[j * N + c] = q * vt[j * N + c];
    }
}
