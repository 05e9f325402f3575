/* The NCCL communicator's internals that tests and diagnostics use (comm_nccl.c; without
 * NCCL in the build, comm_nccl_stub.c). */
#ifndef KILN_DIST_COMM_NCCL_H
#define KILN_DIST_COMM_NCCL_H

#include <stddef.h>

#include "kiln/status.h"

/* Load libnccl.so.2 now (once per process; kiln_comm_init_nccl does it itself) and write which
 * library and version into what (cap bytes, may be NULL): "libnccl.so.2, NCCL 2.28.9".
 * KILN_ERR_UNSUPPORTED with the reason (the names tried and dlerror's words, a library older
 * than 2.10, a build without NCCL) as the thread's message and in what. It maps the library
 * whether a GPU is there or not: kiln_comm_init_nccl checks the GPU first. */
kiln_status kiln__comm_nccl_load(char *what, size_t cap);

#endif
