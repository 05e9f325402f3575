/* The CUDA backend's entry points in a build without CUDA (KILN_CUDA off, or no toolkit):
 * the backend does not exist, and asking for it says how to get it. */
#ifndef KILN_HAVE_CUDA
#include <stdio.h>
#include <string.h>

#include "kiln/backend.h"

#define NO_CUDA                                                                                    \
    "this kiln was built without CUDA (no CUDA toolkit found, or -DKILN_CUDA=OFF): rebuild "    \
    "with nvcc on PATH, or run on the CPU backend (cpu)"

kiln_backend *kiln_backend_cuda(void) { return NULL; }

kiln_status kiln_cuda_available(char *why, size_t cap) {
    if (why && cap)
        snprintf(why, cap, "%s", NO_CUDA);
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s", NO_CUDA);
}

kiln_status kiln_cuda_select(int index, int *count) {
    (void)index;
    if (count)
        *count = 0;
    return kiln_cuda_available(NULL, 0);
}

kiln_status kiln_cuda_device_info(kiln_cuda_info *info) {
    memset(info, 0, sizeof *info);
    return kiln_cuda_available(NULL, 0);
}

int kiln_cuda_set_flag(kiln_cuda_flag flag, int on) {
    (void)flag, (void)on;
    return -1;
}
#endif
