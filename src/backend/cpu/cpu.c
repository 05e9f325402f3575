/* The CPU backend's table: OpenBLAS sgemm for matrix products, OpenMP loops for the rest. */
#include "backend/cpu/cpu.h"
#include "kiln/backend.h"

static const kiln_backend cpu_backend = {
    .name = "cpu",
    KILN_BACKEND_FILL(kiln__cpu_).prepare = kiln__cpu_prepare,
};

const kiln_backend *kiln_backend_cpu(void) { return &cpu_backend; }
