/* What every backend instance shares: its first error, and finding one by name. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kiln/backend.h"
#include "core/error.h"

kiln_status kiln_backend_fail(kiln_backend *be, kiln_status s, const char *fmt, ...) {
    if (be->error != KILN_OK)
        return s;
    be->error = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(be->error_message, sizeof be->error_message, fmt, ap);
    va_end(ap);
    return s;
}

kiln_status kiln_backend_error(const kiln_backend *be) { return be->error; }

kiln_status kiln_backend_by_name(kiln_backend **out, const char *name) {
    *out = NULL;
    if (name && !strcmp(name, "cpu"))
        *out = kiln_backend_cpu();
    else if (name && !strcmp(name, "ref"))
        *out = kiln_backend_ref();
    else if (name && !strcmp(name, "cuda")) {
        KILN_CHECK(kiln_cuda_available(NULL, 0));
        *out = kiln_backend_cuda();
        if (!*out)
            return kiln_error_setf(KILN_ERR_UNSUPPORTED, "the CUDA backend could not start");
    }
    if (*out)
        return KILN_OK;
    return kiln_error_setf(KILN_ERR_NOT_FOUND,
                           "unknown backend \"%s\" (expected cpu, ref or cuda)",
                           name ? name : "(null)");
}
