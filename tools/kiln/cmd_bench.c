/* kiln bench: measurements of this machine that MFU is computed against. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/dtype.h"
#include "tool_common.h"

char *openblas_get_corename(void);
char *openblas_get_config(void);

static const char *usage =
    "usage: kiln bench peak [flags]\n\n"
    "Measure the matrix-product rate of this machine with the GEMM kiln uses, on square and\n"
    "GPT-2-shaped products; the best rate is MFU's denominator in that precision. fp32: OpenBLAS\n"
    "sgemm. bf16 (bf16 inputs, fp32 accumulation): oneDNN where it runs on AMX tiles, else kiln's\n"
    "AVX512-BF16 kernel (KILN_GEMM_BF16=own|dnnl|fp32 forces one); on a CPU without AVX512-BF16,\n"
    "bf16 is widened to fp32 (slower).";

int cmd_bench(int argc, char **argv) {
    int64_t max_dim = 3072, threads = 0;
    double seconds = 3.0;
    const char *dtype_name = "fp32";
    const tool_flag flags[] = {
        {"dtype", TOOL_FLAG_STRING, &dtype_name, "precision of the products: fp32 or bf16"},
        {"seconds", TOOL_FLAG_FLOAT, &seconds, "time to spend measuring", TOOL_ABOVE(0)},
        {"max-dim", TOOL_FLAG_INT, &max_dim, "largest square product", TOOL_MIN(64)},
        {"threads", TOOL_FLAG_INT, &threads, "threads (0: OpenMP's default)", TOOL_RANGE(0, 4096)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos != 1 || strcmp(argv[1], "peak") != 0) {
        fprintf(stderr, "kiln bench: say `kiln bench peak` (see --help)\n");
        return 2;
    }
    kiln_dtype dt;
    kiln_status ds = kiln_dtype_parse(dtype_name, &dt);
    if (ds || dt == KILN_DTYPE_F16) {
        fprintf(stderr, "kiln bench: --dtype takes fp32 or bf16%s%s\n", ds ? ": " : "",
                ds ? kiln_error_message() : " (fp16 products run as fp32 on the CPU)");
        return 2;
    }
    tool_set_threads(threads);
    kiln_status s = kiln_backend_cpu()->prepare(kiln_backend_cpu());
    if (s) {
        tool_report("bench", s);
        return 1;
    }
    double g = kiln_backend_cpu_peak_gflops_dtype(dt, max_dim, seconds);
    if (g <= 0) {
        fprintf(stderr, "kiln bench: the %s GEMM could not be measured: %s\n", kiln_dtype_name(dt),
                kiln_error_message());
        return 1;
    }
    if (dt == KILN_DTYPE_F32)
        printf("peak fp32 GEMM: %.1f GFLOP/s (%d threads, OpenBLAS %s, kernel %s)\n", g,
               omp_get_max_threads(), openblas_get_config(), openblas_get_corename());
    else
        printf("peak %s GEMM: %.1f GFLOP/s (%d threads, %s, fp32 accumulation)\n",
               kiln_dtype_name(dt), g, omp_get_max_threads(), kiln_backend_cpu_gemm_name(dt));
    return 0;
}
