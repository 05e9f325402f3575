/* The int8 kernel of quantized inference against fp32 sgemm on GPT-2 124M's products, in
 * one run: out (M,N) = x (M,K) x W for W the blocks' c_attn (768 -> 2304), attn.c_proj
 * (768 -> 768), mlp.c_fc (768 -> 3072), mlp.c_proj (3072 -> 768) and the head (768 ->
 * 50304), at M = 1 (a GEMV: sampling's head), 64 and 512 rows. Each product cycles through
 * --copies copies of its matrix, as a model's layers do, so that the weights come from memory
 * rather than a warm cache (4 copies of c_fc are 38 MB in fp32, 9.4 MB in int8; of the head,
 * 618 MB and 155 MB).
 *
 * Columns: microseconds a product, for sgemm (fp32), int8 on this CPU's kernel (VNNI where
 * there is one; the activations' quantizing pass included) and int4 (groups of 32), then each
 * integer kernel's speed-up over sgemm. A cell is the fastest call within --seconds, the best
 * over --rounds passes over the table.
 *
 *   OMP_NUM_THREADS=2 build/bench_int8 [--seconds 0.3] [--rounds 3] [--copies 4] */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemm_int8.h"
#include "kiln/compress.h"
#include "kiln/core.h"

typedef struct product {
    const char *name;
    int64_t K, N;
} product;

static const product products[] = {
    {"c_attn", 768, 2304},     {"attn.c_proj", 768, 768}, {"c_fc", 768, 3072},
    {"mlp.c_proj", 3072, 768}, {"head", 768, 50304},
};
static const int64_t rows[] = {1, 64, 512};

typedef struct mats {
    float **w;           /* copies of (N,K) fp32 */
    kiln__qmat *q8, *q4; /* the same, packed */
} mats;

/* The fastest of the calls made within `seconds`, in microseconds. */
#define TIME_BEST(best, seconds, call)                                                             \
    do {                                                                                           \
        double end_ = omp_get_wtime() + (seconds);                                                 \
        int i_ = 0;                                                                                \
        while (omp_get_wtime() < end_ || i_ < 3) {                                                 \
            double t0_ = omp_get_wtime();                                                          \
            call;                                                                                  \
            double us_ = (omp_get_wtime() - t0_) * 1e6;                                            \
            best = us_ < best ? us_ : best;                                                        \
            i_++;                                                                                  \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    double seconds = 0.3;
    int rounds = 3, copies = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--copies"))
            copies = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_int8 [--seconds S] [--rounds R] [--copies C]\n");
            return 2;
        }
    }
    if (copies < 1 || rounds < 1 || !(seconds > 0)) {
        fprintf(stderr, "bench_int8: --copies and --rounds >= 1, --seconds > 0\n");
        return 2;
    }
    int np = (int)(sizeof products / sizeof products[0]), nr = (int)(sizeof rows / sizeof rows[0]);
    mats *m = calloc((size_t)np, sizeof *m);
    kiln_rng rng;
    kiln_rng_seed(&rng, 1);
    int64_t maxM = rows[nr - 1], maxK = 3072;
    float *x = malloc(sizeof(float) * (size_t)(maxM * maxK));
    float *out = malloc(sizeof(float) * (size_t)(maxM * 50304));
    for (int64_t i = 0; i < maxM * maxK; i++)
        x[i] = kiln_rng_normal(&rng);
    kiln__qact act;
    kiln__qws ws;
    if (!m || !x || !out || kiln__qact_init(&act, maxM, maxK, maxK / 32) ||
        kiln__qws_init(&ws, maxK, omp_get_max_threads())) {
        fprintf(stderr, "bench_int8: out of memory\n");
        return 1;
    }
    for (int p = 0; p < np; p++) {
        int64_t K = products[p].K, N = products[p].N;
        m[p].w = calloc((size_t)copies, sizeof *m[p].w);
        m[p].q8 = calloc((size_t)copies, sizeof *m[p].q8);
        m[p].q4 = calloc((size_t)copies, sizeof *m[p].q4);
        int8_t *q8 = malloc((size_t)(N * K));
        uint8_t *q4 = malloc((size_t)(N * K / 2));
        float *s8 = malloc(sizeof(float) * (size_t)N),
              *s4 = malloc(sizeof(float) * (size_t)(N * K / 32));
        for (int c = 0; c < copies; c++) {
            float *w = m[p].w[c] = kiln_alloc(sizeof(float) * (size_t)(N * K));
            for (int64_t i = 0; i < N * K; i++)
                w[i] = 0.02f * kiln_rng_normal(&rng);
            kiln_quant_int8(q8, s8, w, K, N, 1);
            kiln_quant_int4(q4, s4, w, K, N, 32, 1);
            if (kiln__qmat_pack(&m[p].q8[c], q8, s8, N, N, K, 8, 0) ||
                kiln__qmat_pack(&m[p].q4[c], q4, s4, N, N, K, 4, 32)) {
                fprintf(stderr, "bench_int8: cannot pack\n");
                return 1;
            }
        }
        free(q8), free(q4), free(s8), free(s4);
    }
    double best[5][3][3];
    for (int p = 0; p < np; p++)
        for (int r = 0; r < nr; r++)
            for (int k = 0; k < 3; k++)
                best[p][r][k] = 1e30;
    for (int round = 0; round < rounds; round++)
        for (int p = 0; p < np; p++)
            for (int r = 0; r < nr; r++) {
                int64_t M = rows[r], K = products[p].K, N = products[p].N;
                int c = 0;
                TIME_BEST(
                    best[p][r][0], seconds,
                    (cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K,
                                 1.0f, x, (int)K, m[p].w[c], (int)K, 0.0f, out, (int)N),
                     c = (c + 1) % copies));
                TIME_BEST(best[p][r][1], seconds,
                          (kiln__qgemm(out, N, x, &m[p].q8[c], NULL, M, &act, NULL),
                           c = (c + 1) % copies));
                TIME_BEST(best[p][r][2], seconds,
                          (kiln__qgemm(out, N, x, &m[p].q4[c], NULL, M, &act, &ws),
                           c = (c + 1) % copies));
            }
    printf("# %d threads, int8 kernel: %s, %d copies of each matrix, best of %d rounds\n",
           omp_get_max_threads(), kiln__qgemm_kernel_name(), copies, rounds);
    printf(
        "| product | M | K | N | sgemm us | int8 us | int4 us | int8 x sgemm | int4 x sgemm |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int p = 0; p < np; p++)
        for (int r = 0; r < nr; r++) {
            double *b = best[p][r];
            printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.1f | %.2f | %.2f |\n",
                   products[p].name, (long long)rows[r], (long long)products[p].K,
                   (long long)products[p].N, b[0], b[1], b[2], b[0] / b[1], b[0] / b[2]);
        }
    for (int p = 0; p < np; p++) {
        for (int c = 0; c < copies; c++) {
            kiln_free(m[p].w[c]);
            kiln__qmat_free(&m[p].q8[c]);
            kiln__qmat_free(&m[p].q4[c]);
        }
        free(m[p].w), free(m[p].q8), free(m[p].q4);
    }
    free(m), free(x), free(out);
    kiln__qact_free(&act);
    kiln__qws_free(&ws);
    return 0;
}
