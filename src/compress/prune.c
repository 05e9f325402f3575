/* Magnitude pruning (include/kiln/compress.h): the k smallest magnitudes of the prunable
 * weights, found by selection (no sort), set to zero. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/compress.h"

kiln_status kiln_prune_scope_parse(const char *name, kiln_prune_scope *out) {
    if (name && !strcmp(name, "global"))
        *out = KILN_PRUNE_GLOBAL;
    else if (name && !strcmp(name, "layer"))
        *out = KILN_PRUNE_LAYER;
    else
        return kiln_error_setf(KILN_ERR_ARG, "unknown pruning scope '%s': global or layer",
                               name ? name : "(null)");
    return KILN_OK;
}

int kiln_prune_tensor(const kiln_gpt *m, int i) {
    const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
    return t->layer >= 0 && t->ndim == 2;
}

/* The k-th smallest (0-based) of v[0..n), v reordered (Hoare's selection). */
static float select_kth(float *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                float x = v[i];
                v[i++] = v[j];
                v[j--] = x;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return v[k];
    }
    return v[k];
}

/* Prune k of the tensors listed (idx[0..nt)) in w: the magnitudes below the k-th smallest,
 * then those equal to it in slab order until k are gone. */
static kiln_status prune_set(const kiln_gpt *m, float *w, const int *idx, int nt, int64_t k,
                             uint8_t *keep) {
    int64_t n = 0;
    for (int j = 0; j < nt; j++)
        n += kiln_gpt_tensor(m, idx[j])->numel;
    if (k <= 0 || n == 0)
        return KILN_OK;
    if (k > n)
        k = n;
    float *a = malloc((size_t)n * sizeof *a);
    if (!a)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %lld magnitudes to prune",
                               (long long)n);
    int64_t at = 0;
    for (int j = 0; j < nt; j++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, idx[j]);
        for (int64_t e = 0; e < t->numel; e++)
            a[at++] = fabsf(w[t->offset + e]);
    }
    float thr = select_kth(a, n, k - 1);
    free(a);
    int64_t below = 0;
    for (int j = 0; j < nt; j++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, idx[j]);
        for (int64_t e = 0; e < t->numel; e++)
            below += fabsf(w[t->offset + e]) < thr;
    }
    int64_t ties = k - below; /* equal to the threshold: pruned in slab order */
    for (int j = 0; j < nt; j++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, idx[j]);
        for (int64_t e = 0; e < t->numel; e++) {
            float x = fabsf(w[t->offset + e]);
            int cut = x < thr || (x == thr && ties > 0);
            if (x == thr && cut)
                ties--;
            if (cut)
                w[t->offset + e] = 0.0f;
            if (keep)
                keep[t->offset + e] = (uint8_t)!cut;
        }
    }
    return KILN_OK;
}

kiln_status kiln_prune_magnitude(const kiln_gpt *m, float *w, double sparsity,
                                 kiln_prune_scope scope, uint8_t *keep) {
    if (!m || !w || !(sparsity >= 0.0 && sparsity < 1.0))
        return kiln_error_setf(KILN_ERR_ARG, "the sparsity must be in [0, 1), got %g", sparsity);
    int nt = kiln_gpt_num_tensors(m), np = 0;
    int *idx = malloc((size_t)nt * sizeof *idx);
    if (!idx)
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    if (keep)
        memset(keep, 1, (size_t)kiln_gpt_slab_len(m));
    for (int i = 0; i < nt; i++)
        if (kiln_prune_tensor(m, i))
            idx[np++] = i;
    kiln_status s = KILN_OK;
    if (scope == KILN_PRUNE_GLOBAL) {
        int64_t n = 0;
        for (int j = 0; j < np; j++)
            n += kiln_gpt_tensor(m, idx[j])->numel;
        s = prune_set(m, w, idx, np, (int64_t)llround(sparsity * (double)n), keep);
    } else {
        for (int j = 0; s == KILN_OK && j < np; j++)
            s = prune_set(m, w, idx + j, 1,
                          (int64_t)llround(sparsity * (double)kiln_gpt_tensor(m, idx[j])->numel),
                          keep);
    }
    free(idx);
    return s;
}

double kiln_prune_schedule(double s_init, double s_final, int64_t t0, int64_t t1, int64_t t) {
    if (t < t0)
        return s_init;
    if (t >= t1)
        return s_final;
    double r = 1.0 - (double)(t - t0) / (double)(t1 - t0);
    return s_final + (s_init - s_final) * r * r * r;
}

void kiln_prune_report(const kiln_gpt *m, const float *w, char *out, size_t cap, double *overall) {
    size_t at = 0;
    int64_t zeros = 0, n = 0;
    if (cap)
        out[0] = '\0';
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        if (!kiln_prune_tensor(m, i))
            continue;
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        int64_t z = 0;
        for (int64_t e = 0; e < t->numel; e++)
            z += w[t->offset + e] == 0.0f;
        zeros += z;
        n += t->numel;
        if (at < cap)
            at += (size_t)snprintf(out + at, cap - at, "%s\"%s\": %.6f", at ? ", " : "{", t->name,
                                   (double)z / (double)t->numel);
    }
    *overall = n ? (double)zeros / (double)n : 0.0;
    if (at < cap)
        snprintf(out + at, cap - at, "%s\"all\": %.6f}", at ? ", " : "{", *overall);
}
