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

kiln_status kiln_lowrank_svd(const float *w, int64_t K, int64_t N, float *s, float *u, float *vt) {
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
        /* within 1e-9 of the total: fp32 rounding leaves singular values of about 1e-6 of
         * the largest in a matrix of lower rank, which energy 1 need not keep */
        if (kept >= (energy - 1e-9) * total)
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

/* The blocks' matrices by kind, as the model names them ("h.<b>.<name>.weight"). */
static const char *const kind_tensor[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

/* One kind's SVDs, a block each. */
typedef struct kind_svd {
    int64_t in, out, k, rank;
    float *s, *u, *vt; /* blocks x (k), (in,k), (k,out) */
} kind_svd;

static void kind_svd_free(kind_svd *d) {
    free(d->s), free(d->u), free(d->vt);
    memset(d, 0, sizeof *d);
}

static const kiln_tensor_info *block_tensor(const kiln_gpt *m, int64_t b, const char *name,
                                            const char *suffix) {
    char full[64];
    snprintf(full, sizeof full, "h.%lld.%s%s", (long long)b, name, suffix);
    return kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, full));
}

/* Every block's SVD of one kind, and the rank for it. */
static kiln_status kind_decompose(kiln_gpt *dense, int kind, double energy, int64_t rank,
                                  kind_svd *d) {
    int64_t nb = kiln_gpt_config_blocks(kiln_gpt_get_config(dense));
    const kiln_tensor_info *t0 = block_tensor(dense, 0, kind_tensor[kind], ".weight");
    if (!t0)
        return kiln_error_setf(KILN_ERR_ARG, "the model has no %s.weight", kind_tensor[kind]);
    d->in = t0->shape[0], d->out = t0->shape[1];
    d->k = d->in < d->out ? d->in : d->out;
    if (rank > 0 && rank >= d->k)
        return kiln_error_setf(KILN_ERR_ARG,
                               "rank %lld for %s: a rank must be below min(in, out) = %lld of "
                               "its (%lld, %lld) matrices",
                               (long long)rank, kiln_lowrank_kind_name((kiln_gpt_matrix)kind),
                               (long long)d->k, (long long)d->in, (long long)d->out);
    d->s = malloc((size_t)(nb * d->k) * sizeof *d->s);
    d->u = malloc((size_t)(nb * d->in * d->k) * sizeof *d->u);
    d->vt = malloc((size_t)(nb * d->k * d->out) * sizeof *d->vt);
    if (!d->s || !d->u || !d->vt)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the SVDs of %s", kind_tensor[kind]);
    const float *w = kiln_gpt_params(dense);
    d->rank = rank;
    for (int64_t b = 0; b < nb; b++) {
        const kiln_tensor_info *t = block_tensor(dense, b, kind_tensor[kind], ".weight");
        kiln_status s = kiln_lowrank_svd(w + t->offset, d->in, d->out, d->s + b * d->k,
                                         d->u + b * d->in * d->k, d->vt + b * d->k * d->out);
        if (s)
            return kiln_error_wrapf(s, "%s", t->name);
        int64_t r = kiln_lowrank_rank_for_energy(d->s + b * d->k, d->k, energy);
        if (rank == 0 && r > d->rank)
            d->rank = r;
    }
    if (d->rank * (d->in + d->out) >= d->in * d->out)
        return kiln_error_setf(
            KILN_ERR_ARG,
            "%s: rank %lld keeps every block's energy %g but saves no "
            "weights: %lld x (%lld + %lld) >= %lld x %lld; lower the energy, "
            "give a rank below %lld, or leave %s dense",
            kiln_lowrank_kind_name((kiln_gpt_matrix)kind), (long long)d->rank, energy,
            (long long)d->rank, (long long)d->in, (long long)d->out, (long long)d->in,
            (long long)d->out,
            (long long)((d->in * d->out + d->in + d->out - 1) / (d->in + d->out)),
            kiln_lowrank_kind_name((kiln_gpt_matrix)kind));
    return KILN_OK;
}

/* Write the factored model's tensors: the factors of the kinds decomposed, copies of the
 * rest; the report. */
static void fill(kiln_gpt *fm, kiln_gpt *dense, const kind_svd *svd, kiln_lowrank_report *rep) {
    float *dst = kiln_gpt_params(fm);
    const float *src = kiln_gpt_params(dense);
    for (int i = 0; i < kiln_gpt_num_tensors(fm); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(fm, i);
        int j = kiln_gpt_find_tensor(dense, t->name);
        if (j >= 0)
            memcpy(dst + t->offset, src + kiln_gpt_tensor(dense, j)->offset,
                   (size_t)t->numel * sizeof *dst);
    }
    int64_t nb = kiln_gpt_config_blocks(kiln_gpt_get_config(dense));
    for (int k = 0; k < 4; k++) {
        const kind_svd *d = &svd[k];
        kiln_lowrank_report *r = &rep[k];
        memset(r, 0, sizeof *r);
        const kiln_tensor_info *t0 = block_tensor(dense, 0, kind_tensor[k], ".weight");
        r->in = t0 ? t0->shape[0] : 0, r->out = t0 ? t0->shape[1] : 0;
        r->params_before = r->params_after = nb * r->in * r->out;
        if (!d->rank)
            continue;
        r->rank = d->rank;
        r->params_after = nb * d->rank * (d->in + d->out);
        r->energy_min = 1.0;
        for (int64_t b = 0; b < nb; b++) {
            const kiln_tensor_info *tu = block_tensor(fm, b, kind_tensor[k], ".weight_u");
            const kiln_tensor_info *tv = block_tensor(fm, b, kind_tensor[k], ".weight_v");
            kiln_lowrank_split(dst + tu->offset, dst + tv->offset, d->u + b * d->in * d->k,
                               d->s + b * d->k, d->vt + b * d->k * d->out, d->in, d->out, d->k,
                               d->rank);
            double e = kiln_lowrank_energy(d->s + b * d->k, d->k, d->rank);
            r->energy_min = e < r->energy_min ? e : r->energy_min;
            r->energy_mean += e / (double)nb;
        }
    }
}

kiln_status kiln_lowrank_factor(kiln_gpt *dense, const int want[4], double energy, int64_t rank,
                                kiln_gpt **out, kiln_lowrank_report report[4]) {
    *out = NULL;
    const kiln_gpt_config *dc = kiln_gpt_get_config(dense);
    KILN_CHECK(kiln_gpt_require_family(dc, KILN_FAMILY_GPT2, "low-rank factorisation"));
    const char *be = kiln_gpt_backend(dense)->name;
    if (kiln_gpt_dtype(dense) != KILN_DTYPE_F32 || (strcmp(be, "cpu") && strcmp(be, "ref")) ||
        kiln_gpt_has_linear(dense))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "low-rank factorisation reads an fp32 model on the CPU");
    if (!(energy > 0.0 && energy <= 1.0))
        return kiln_error_setf(KILN_ERR_ARG, "energy %g is outside (0, 1]", energy);
    if (rank < 0)
        return kiln_error_setf(KILN_ERR_ARG, "rank %lld must be at least 1 (0: by energy)",
                               (long long)rank);
    for (int k = 0; k < 4; k++)
        if (dc->rank[k])
            return kiln_error_setf(KILN_ERR_ARG,
                                   "the model is factored already (%s at rank %lld): factor the "
                                   "dense weights it was made from",
                                   kiln_lowrank_kind_name((kiln_gpt_matrix)k),
                                   (long long)dc->rank[k]);
    if (!want[0] && !want[1] && !want[2] && !want[3])
        return kiln_error_setf(KILN_ERR_ARG, "no matrices to factor");
    kind_svd svd[4];
    memset(svd, 0, sizeof svd);
    kiln_status s = KILN_OK;
    for (int k = 0; k < 4 && !s; k++)
        if (want[k])
            s = kind_decompose(dense, k, energy, rank, &svd[k]);
    kiln_gpt_config cfg = *dc;
    for (int k = 0; k < 4; k++)
        cfg.rank[k] = svd[k].rank;
    kiln_gpt *fm = NULL;
    if (!s)
        s = kiln_gpt_create_inference(&fm, &cfg, 1, 1, KILN_DTYPE_F32, kiln_gpt_backend(dense));
    if (!s) {
        kiln_lowrank_report rep[4];
        fill(fm, dense, svd, rep);
        if (report)
            memcpy(report, rep, sizeof rep);
        *out = fm;
    }
    for (int k = 0; k < 4; k++)
        kind_svd_free(&svd[k]);
    return s;
}
