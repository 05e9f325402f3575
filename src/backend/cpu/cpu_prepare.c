/* Before the CPU backend's first kernel: OpenBLAS maps a 128 MiB work buffer (Debian's
 * 0.3.21 on x86-64) for each thread that computes a product, measured here: one at load
 * time for the main thread, then one for each of its own worker threads at the first
 * threaded product, and one for each other OpenMP thread that calls sgemm inside a
 * parallel region (as attention does): 2 x (threads - 1) after load. When a mapping fails
 * (under an address-space limit, `ulimit -v`) OpenBLAS retries forever instead of failing.
 * So kiln checks the headroom first and then has every thread take its buffer at once,
 * while the answer can still be an error message. (A limit too small for OpenBLAS's own
 * load-time buffer hangs inside OpenBLAS before kiln's code runs at all.) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <cblas.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm.h"
#include "core/error.h"

#define BLAS_BUFFER_BYTES ((size_t)128 << 20)

static size_t address_space_used(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return (size_t)pages * 4096;
}

kiln_status kiln__cpu_prepare(kiln_backend *be) {
    (void)be;
    static int ready_threads; /* buffers exist for this many threads */
    int threads = omp_get_max_threads();
    if (threads <= ready_threads)
        return KILN_OK;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        size_t used = address_space_used();
        size_t need = 2 * (size_t)(threads - 1) * BLAS_BUFFER_BYTES + ((size_t)16 << 20);
        if (used + need > (size_t)rl.rlim_cur)
            return kiln_error_setf(
                KILN_ERR_NOMEM,
                "the address-space limit (ulimit -v) of %.0f MiB leaves %.0f MiB, "
                "and OpenBLAS needs about %.0f MiB of work buffers for %d "
                "threads: raise the limit or use fewer --threads",
                (double)rl.rlim_cur / 1048576.0,
                (double)(rl.rlim_cur > used ? rl.rlim_cur - used : 0) / 1048576.0,
                (double)need / 1048576.0, threads);
    }
    /* Products large enough to take OpenBLAS's general path (tiny ones skip the buffer). */
    enum { D = 256 };
    float *a = calloc((size_t)(2 + threads) * D * D, sizeof(float));
    if (!a)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the BLAS warm-up matrices");
    float *b = a + D * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, D, D, D, 1.0f, a, D, b, D, 0.0f,
                b + D * D, D);
#pragma omp parallel
    {
        float *c = b + (size_t)(1 + omp_get_thread_num()) * D * D;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, D, D, D, 1.0f, a, D, b, D, 0.0f, c,
                    D);
    }
    free(a);
    ready_threads = threads;
    /* the bf16 product's per-thread buffers too (bounded whatever the shapes), and the line
     * saying so when bf16 products must go through fp32 on this CPU */
    return kiln__cpu_gemm_prepare((int64_t)1 << 30, (int64_t)1 << 30, (int64_t)1 << 30);
}
