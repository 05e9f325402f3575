/* The starting weights of a GPT-2 model: kiln_gpt_init_weights_f32 (the normal draws'
 * transcendental functions on every OpenMP thread, kiln_rng_normal_fill) against the same
 * draws one at a time with kiln_rng_normal, as every start made them before, in the same run.
 * Both must give the same bits; the ratio is the time saved at the start of every run.
 *
 *   bench_init [preset rounds]      defaults: gpt2-124m 2   (OMP_NUM_THREADS: the threads) */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/model.h"

/* The values kiln_gpt_init_weights_f32 gives, drawn one at a time (tensor order, N(0, std)
 * for matrices, ones for LayerNorm weights, zeros else): the same code path in spirit, kept
 * here only as the peer. */
static void init_sequential(const kiln_gpt *m, uint64_t seed, float *slab) {
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    int n = kiln_gpt_num_tensors(m);
    float resid_std = 0.02f / sqrtf(2.0f * (float)kiln_gpt_get_config(m)->n_layer);
    memset(slab, 0, (size_t)kiln_gpt_slab_len(m) * sizeof *slab);
    for (int i = 0; i < n; i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        int ln = strstr(t->name, "ln_") && strstr(t->name, ".weight");
        float std = strstr(t->name, "c_proj.weight") ? resid_std : 0.02f;
        for (int64_t k = 0; k < t->numel; k++)
            slab[t->offset + k] = ln ? 1.0f : t->ndim == 2 ? std * kiln_rng_normal(&rng) : 0.0f;
    }
}

int main(int argc, char **argv) {
    const char *preset = argc > 1 ? argv[1] : "gpt2-124m";
    int rounds = argc > 2 ? atoi(argv[2]) : 2;
    kiln_gpt_config c;
    if (kiln_gpt_config_preset(&c, preset)) {
        printf("%s\n", kiln_error_message());
        return 1;
    }
    c.vocab_size = 50257;
    kiln_gpt *m = NULL;
    kiln_gpt_options o = kiln_gpt_options_default();
    if (kiln_gpt_config_validate(&c) || kiln_gpt_create(&m, &c, 1, 64, &o, NULL)) {
        printf("%s\n", kiln_error_message());
        return 1;
    }
    int64_t n = kiln_gpt_slab_len(m);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    if (!a || !b) {
        printf("cannot allocate two slabs of %lld floats\n", (long long)n);
        return 1;
    }
    double best_fill = 1e30, best_seq = 1e30;
    for (int r = 0; r < rounds; r++) { /* interleaved, the best of each */
        double t0 = kiln_time_ms();
        kiln_gpt_init_weights_f32(m, 1337, a);
        double t1 = kiln_time_ms();
        init_sequential(m, 1337, b);
        double t2 = kiln_time_ms();
        best_fill = t1 - t0 < best_fill ? t1 - t0 : best_fill;
        best_seq = t2 - t1 < best_seq ? t2 - t1 : best_seq;
    }
    int same = memcmp(a, b, (size_t)n * sizeof *a) == 0;
    printf("%s, %lld values, %d threads: one at a time %.0f ms, kiln_gpt_init_weights_f32 %.0f ms "
           "(%.2fx); the same bits: %s\n",
           preset, (long long)n, omp_get_max_threads(), best_seq, best_fill, best_seq / best_fill,
           same ? "yes" : "NO");
    free(a);
    free(b);
    kiln_gpt_free(m);
    return same ? 0 : 1;
}
