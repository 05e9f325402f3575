/* How the reference runs any dtype: its inputs are widened to fp32 copies, the fp32 kernel
 * runs, and each output is rounded to the dtype once. For F32 the copies are the buffers
 * themselves. Memory for the copies is malloc'ed per call (the reference is for tests, not
 * speed); a failed allocation is recorded in the backend and the op does nothing. */
#ifndef KILN_BACKEND_REF_DTYPE_H
#define KILN_BACKEND_REF_DTYPE_H

#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"

typedef struct ref_buf {
    float *f;        /* the fp32 view */
    void *dst;       /* an output's destination (NULL for inputs) */
    kiln_dtype dt;
    int64_t n;
    int owned;       /* f is a copy to free (and, for an output, to round into dst) */
} ref_buf;

static inline int ref_ok(const kiln_backend *be) { return be->error == KILN_OK; }

static inline float *ref_copy_f32(kiln_backend *be, const void *p, kiln_dtype dt, int64_t n) {
    float *c = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!c) {
        kiln_backend_fail(be, KILN_ERR_NOMEM, "reference: no memory for %lld floats",
                          (long long)n);
        return NULL;
    }
    kiln_convert(c, KILN_DTYPE_F32, p, dt, n);
    return c;
}

/* An input of n elements (NULL stays NULL). */
static inline ref_buf ref_in(kiln_backend *be, const void *p, kiln_dtype dt, int64_t n) {
    ref_buf b = {(float *)p, NULL, dt, n, 0};
    if (p && dt != KILN_DTYPE_F32) {
        b.f = ref_copy_f32(be, p, dt, n);
        b.owned = 1;
    }
    return b;
}

/* An output of n elements; accumulate != 0 for ops that add into it (it is read first). */
static inline ref_buf ref_out(kiln_backend *be, void *p, kiln_dtype dt, int64_t n,
                              int accumulate) {
    ref_buf b = {(float *)p, p, dt, n, 0};
    if (p && dt != KILN_DTYPE_F32) {
        b.f = accumulate ? ref_copy_f32(be, p, dt, n)
                         : calloc((size_t)(n > 0 ? n : 1), sizeof(float));
        if (!b.f && !accumulate)
            kiln_backend_fail(be, KILN_ERR_NOMEM, "reference: no memory for %lld floats",
                              (long long)n);
        b.owned = 1;
    }
    return b;
}

/* Round an output into its destination and free the copies. */
static inline void ref_done(ref_buf *b) {
    if (!b->owned)
        return;
    if (b->dst && b->f)
        kiln_convert(b->dst, b->dt, b->f, KILN_DTYPE_F32, b->n);
    free(b->f);
    b->f = NULL;
    b->owned = 0;
}

#endif
