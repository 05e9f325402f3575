/* kiln bench: measurements of this machine that MFU is computed against. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/backend.h"
#include "tool_common.h"

char *openblas_get_corename(void);
char *openblas_get_config(void);

static const char *usage =
    "usage: kiln bench peak [flags]\n\n"
    "Measure the fp32 matrix-product rate of this machine with the GEMM kiln uses (OpenBLAS\n"
    "sgemm) on square and GPT-2-shaped products; the best rate is MFU's denominator.";

int cmd_bench(int argc, char **argv) {
    int64_t max_dim = 3072, threads = 0;
    double seconds = 3.0;
    const tool_flag flags[] = {
        {"seconds", TOOL_FLAG_FLOAT, &seconds, "time to spend measuring"},
        {"max-dim", TOOL_FLAG_INT, &max_dim, "largest square product"},
        {"threads", TOOL_FLAG_INT, &threads, "threads (0: OpenMP's default)"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos != 1 || strcmp(argv[1], "peak") != 0 || seconds <= 0 || max_dim < 64) {
        fprintf(stderr, "kiln bench: say `kiln bench peak` (see --help)\n");
        return 2;
    }
    tool_set_threads(threads);
    kiln_status s = kiln_backend_cpu()->prepare(kiln_backend_cpu());
    if (s) {
        tool_report("bench", s);
        return 1;
    }
    double g = kiln_backend_cpu_peak_gflops(max_dim, seconds);
    printf("peak fp32 GEMM: %.1f GFLOP/s (%d threads, OpenBLAS %s, kernel %s)\n", g,
           omp_get_max_threads(), openblas_get_config(), openblas_get_corename());
    return 0;
}
