/* A short training run of a GPT-2 model on the CUDA backend: the model and AdamW (fp32
 * master weights and moments, bf16 working copy) on the GPU, random tokens (the step's
 * cost does not depend on them), each step zeroing the gradients, forward and backward,
 * the global gradient norm (a sum of squares over the slab, as clipping needs) and the
 * update. Prints each step's loss and time, then tokens/s and MFU: the model's FLOPs per
 * token (kiln_gpt_flops_per_token: 6 x matrix parameters + attention, causal mask not
 * discounted) times tokens/s over a peak, by default the H200 SXM's dense bf16 tensor rate,
 * 989 TFLOP/s. The first steps (warm-up: cuBLASLt's choices, first-touch) are left out of
 * the rate.
 *
 *   bench_cuda_train [preset B T steps seconds peak_tflops dtype]
 *   defaults:         gpt2-124m 16 1024 30 60 989 bf16
 *
 * It stops after `steps` steps or once `seconds` have passed, whichever is first. Without a
 * usable GPU it says why and exits 77. Its last line starts with RESULT. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/optim.h"

#define WARMUP 3

static int fail(const char *what) {
    printf("%s: %s\nRESULT failed (%s)\n", what, kiln_error_message(), what);
    return 1;
}

int main(int argc, char **argv) {
    const char *preset = argc > 1 ? argv[1] : "gpt2-124m";
    int64_t B = argc > 2 ? atoll(argv[2]) : 16, T = argc > 3 ? atoll(argv[3]) : 1024;
    int steps = argc > 4 ? atoi(argv[4]) : 30;
    double seconds = argc > 5 ? atof(argv[5]) : 60, peak = argc > 6 ? atof(argv[6]) : 989;
    kiln_dtype dt = KILN_DTYPE_BF16;
    if (argc > 7 && kiln_dtype_parse(argv[7], &dt) != KILN_OK)
        return fail("dtype");
    char why[512];
    if (kiln_cuda_available(why, sizeof why) != KILN_OK) {
        printf("SKIP: no CUDA GPU (%s)\nRESULT skipped\n", why);
        return 77;
    }
    kiln_backend *be = kiln_backend_cuda();
    if (!be)
        return fail("kiln_backend_cuda");
    kiln_gpt_config cfg;
    if (kiln_gpt_config_preset(&cfg, preset) || kiln_gpt_config_validate(&cfg))
        return fail("config");
    kiln_gpt_options o = kiln_gpt_options_default();
    o.dtype = dt;
    kiln_gpt *m = NULL;
    if (kiln_gpt_create(&m, &cfg, B, T, &o, be))
        return fail("kiln_gpt_create");
    kiln_gpt_memory mem = kiln_gpt_memory_plan(m);
    kiln_gpt_init_weights(m, 1);
    kiln_optim_config oc = kiln_optim_config_default();
    kiln_optim_slab slab = {.n = kiln_gpt_slab_len(m), .work = dt};
    kiln_optim *opt = NULL;
    if (kiln_optim_create(&opt, &oc, &slab, NULL, 0, be) ||
        kiln_optim_read_working(opt, kiln_gpt_params(m)))
        return fail("kiln_optim_create");
    double flops_tok = kiln_gpt_flops_per_token(&cfg, T);
    printf("%s\n%s, %s, B %lld, T %lld: %.1f GiB on the GPU for the model (+ %.1f GiB optimizer), "
           "%.3g GFLOP per token, peak %.0f TFLOP/s\n",
           why, preset, kiln_dtype_name(dt), (long long)B, (long long)T,
           (double)mem.total / (1 << 30),
           (double)kiln_optim_state_bytes(opt) / (1 << 30), flops_tok / 1e9, peak);
    int32_t *in = malloc((size_t)(B * T) * sizeof(int32_t)),
            *tg = malloc((size_t)(B * T) * sizeof(int32_t));
    kiln_rng r;
    kiln_rng_seed(&r, 3);
    double t_start = kiln_time_ms(), timed_ms = 0;
    int timed = 0, done = 0;
    float first = NAN, last = NAN;
    for (int s = 0; s < steps; s++) {
        for (int64_t i = 0; i < B * T; i++) {
            in[i] = (int32_t)kiln_rng_below(&r, (uint64_t)cfg.vocab_size);
            tg[i] = (int32_t)kiln_rng_below(&r, (uint64_t)cfg.vocab_size);
        }
        double t0 = kiln_time_ms();
        float loss = 0;
        kiln_gpt_zero_grad(m);
        if (kiln_gpt_forward_backward(m, in, tg, B, T, 1.0f, &loss))
            return fail("forward_backward");
        double norm = sqrt(be->sumsq(be, KILN_DTYPE_F32, kiln_gpt_grads(m), kiln_gpt_slab_len(m)));
        if (kiln_optim_step(opt, kiln_gpt_params(m), kiln_gpt_grads(m), 3e-4f))
            return fail("optimizer step");
        double ms = kiln_time_ms() - t0;
        done++;
        if (s == 0)
            first = loss;
        last = loss;
        if (s >= WARMUP) {
            timed_ms += ms;
            timed++;
        }
        printf("step %3d  loss %.4f  grad norm %.3f  %8.1f ms  %8.0f tok/s\n", s + 1, loss, norm,
               ms, (double)(B * T) / (ms / 1e3));
        if (!isfinite(loss))
            return fail("the loss is not finite");
        if (kiln_time_ms() - t_start > seconds * 1e3)
            break;
    }
    if (timed == 0) {
        printf("RESULT failed (no step after the warm-up within %g s)\n", seconds);
        return 1;
    }
    double tok_s = (double)(B * T) * timed / (timed_ms / 1e3);
    double mfu = flops_tok * tok_s / (peak * 1e12);
    printf("\n%d steps (%d timed): %.1f ms per step, %.0f tokens/s, MFU %.1f%% of %.0f TFLOP/s; "
           "loss %.4f -> %.4f\n",
           done, timed, timed_ms / timed, tok_s, 100 * mfu, peak, first, last);
    printf("RESULT ok %.0f tok/s, MFU %.1f%% (peak %.0f TFLOP/s), %.1f ms/step\n", tok_s, 100 * mfu,
           peak, timed_ms / timed);
    kiln_optim_free(opt);
    kiln_gpt_free(m);
    free(in), free(tg);
    return 0;
}
