#include "backend/host.h"

#include <string.h>

#include "kiln/core.h"

void *kiln__host_alloc(kiln_backend *be, size_t bytes) {
    (void)be;
    return kiln_alloc(bytes ? bytes : 1);
}

void kiln__host_free(kiln_backend *be, void *p) {
    (void)be;
    kiln_free(p);
}

void kiln__host_copy(kiln_backend *be, void *dst, const void *src, size_t bytes,
                     kiln_copy_kind kind) {
    (void)be, (void)kind;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}

kiln_status kiln__host_synchronize(kiln_backend *be) {
    kiln_status s = be->error;
    if (s != KILN_OK) {
        kiln_error_setf(s, "%s backend: %s", be->name, be->error_message);
        be->error = KILN_OK;
        be->error_message[0] = '\0';
    }
    return s;
}

void kiln__host_convert(kiln_backend *be, void *dst, kiln_dtype dt, const void *src,
                        kiln_dtype st, int64_t n) {
    (void)be;
    kiln_convert(dst, dt, src, st, n);
}
