/* The CPU backend's table: OpenBLAS sgemm for matrix products, OpenMP loops for the rest;
 * its memory is host memory (backend/host.c). */
#include "backend/cpu/cpu.h"

#include "backend/host.h"
#include "kiln/core.h"

static kiln__cpu_state_t cpu_impl;

kiln__cpu_state_t *kiln__cpu_state(kiln_backend *be) { return be->impl; }

void *kiln__cpu_alloc(kiln_backend *be, size_t bytes) { return kiln__host_alloc(be, bytes); }
void kiln__cpu_free(kiln_backend *be, void *p) { kiln__host_free(be, p); }
void kiln__cpu_copy(kiln_backend *be, void *dst, const void *src, size_t bytes,
                    kiln_copy_kind kind) {
    kiln__host_copy(be, dst, src, bytes, kind);
}
kiln_status kiln__cpu_synchronize(kiln_backend *be) { return kiln__host_synchronize(be); }
void kiln__cpu_convert(kiln_backend *be, void *dst, kiln_dtype dt, const void *src,
                       kiln_dtype st, int64_t n) {
    kiln__host_convert(be, dst, dt, src, st, n);
}

void *kiln__cpu_scratch(kiln_backend *be, size_t bytes) {
    kiln__cpu_state_t *s = be->impl;
    if (bytes <= s->scratch_bytes)
        return s->scratch;
    kiln_free(s->scratch);
    s->scratch = kiln_alloc(bytes);
    s->scratch_bytes = s->scratch ? bytes : 0;
    if (!s->scratch)
        kiln_backend_fail(be, KILN_ERR_NOMEM, "cpu backend: no memory for %zu bytes of scratch",
                          bytes);
    return s->scratch;
}

static kiln_backend cpu_backend = {
    .name = "cpu",
    KILN_BACKEND_FILL(kiln__cpu_)
    .prepare = kiln__cpu_prepare,
    .attention_decode = kiln__cpu_attention_decode,
    .impl = &cpu_impl,
};

kiln_backend *kiln_backend_cpu(void) { return &cpu_backend; }
