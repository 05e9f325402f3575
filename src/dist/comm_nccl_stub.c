/* The NCCL communicator's entry points in a build without it (no CUDA, -DKILN_NCCL=OFF, or a
 * toolkit without nccl.h 2.10 or newer): the kind does not exist, and asking for it says why
 * and how to get it. comm_nccl.c is the communicator. */
#ifndef KILN_HAVE_NCCL
#include <stdio.h>

#include "dist/comm_nccl.h"
#include "kiln/comm.h"

#ifdef KILN_HAVE_CUDA
#define NO_NCCL                                                                                    \
    "this kiln was built with CUDA but without NCCL (no nccl.h 2.10 or newer found, or "           \
    "-DKILN_NCCL=OFF): install NCCL's headers (or set NCCL_ROOT) and rebuild, or use the mpi "     \
    "communicator"
#else
#define NO_NCCL                                                                                    \
    "this kiln was built without CUDA, so without NCCL (no CUDA toolkit found, or "                \
    "-DKILN_CUDA=OFF): rebuild with nvcc on PATH, or use the mpi communicator"
#endif

int kiln_comm_have_nccl(void) {
    return 0;
}

kiln_status kiln_comm_init_nccl(kiln_comm *boot, kiln_comm **out) {
    (void)boot;
    if (out)
        *out = NULL;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "kiln_comm_init_nccl: %s", NO_NCCL);
}

kiln_status kiln__comm_nccl_load(char *what, size_t cap) {
    if (what && cap)
        snprintf(what, cap, "%s", NO_NCCL);
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s", NO_NCCL);
}
#else
/* With NCCL this file is empty; ISO C wants a declaration in every file. */
typedef int kiln__comm_nccl_stub_unused;
#endif
