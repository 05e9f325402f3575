/* The whole model on the CUDA backend against the same model on the CPU backend: the same
 * configuration, weights from the same seed, the same batches; three training steps of
 * forward, backward and AdamW (through kiln_optim, on each backend), in fp32 and in bf16
 * (with fp32 master weights), for two shapes (head size 16, and head size 12 with a
 * vocabulary of no multiple of 128 and T below the planned maximum). Each step's loss must
 * agree to 1e-4 relative in fp32 and 2e-2 in bf16; the gradient slab and, after the last
 * step, the weights must agree to a max error (relative to the slab's largest value) of
 * 1e-3 in fp32 and 5e-2 in bf16: the backends sum in different orders, and in bf16 round
 * their activations at different places (attention's backward, GELU in the product's
 * epilogue), which the steps then compound.
 *
 * Without a usable GPU it prints "SKIP: no CUDA GPU (...)" and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/optim.h"

static int failures, checks;

static void check(const char *what, double err, double tol) {
    checks++;
    int ok = err <= tol;
    failures += !ok;
    printf("  %-44s %10.3g  (tolerance %.3g) %s\n", what, err, tol, ok ? "ok" : "FAIL");
}

static void check_ok(const char *what, kiln_status s) {
    checks++;
    if (s != KILN_OK) {
        failures++;
        printf("  FAIL %s: %s: %s\n", what, kiln_status_str(s), kiln_error_message());
    }
}

/* max |a - b| / max |b| */
static double max_err(const float *a, const float *b, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d) || d > worst)
            worst = isnan(d) ? INFINITY : d;
    }
    return scale > 0 ? worst / scale : worst;
}

/* n floats of a backend's memory, on the host */
static float *fetch_f32(kiln_backend *be, const void *p, int64_t n, kiln_dtype t) {
    void *h = malloc((size_t)n * kiln_dtype_size(t));
    float *f = malloc((size_t)n * sizeof(float));
    be->copy(be, h, p, (size_t)n * kiln_dtype_size(t), KILN_COPY_TO_HOST);
    check_ok("synchronize", be->synchronize(be));
    kiln_convert(f, KILN_DTYPE_F32, h, t, n);
    free(h);
    return f;
}

typedef struct {
    kiln_gpt *m;
    kiln_optim *o;
    kiln_backend *be;
} run;

static kiln_status start(run *r, const kiln_gpt_config *c, kiln_dtype dt, kiln_backend *be,
                         int64_t B, int64_t T) {
    r->be = be;
    kiln_gpt_options o = kiln_gpt_options_default();
    o.dtype = dt;
    kiln_status s = kiln_gpt_create(&r->m, c, B, T, &o, be);
    if (s)
        return s;
    kiln_gpt_init_weights(r->m, 5);
    kiln_optim_config oc = kiln_optim_config_default();
    kiln_optim_slab slab = {.n = kiln_gpt_slab_len(r->m), .work = dt};
    s = kiln_optim_create(&r->o, &oc, &slab, NULL, 0, be);
    if (s)
        return s;
    return kiln_optim_read_working(r->o, kiln_gpt_params(r->m));
}

static void finish(run *r) {
    kiln_optim_free(r->o);
    kiln_gpt_free(r->m);
}

static void compare(const kiln_gpt_config *c, kiln_dtype dt, int64_t B, int64_t T, int64_t maxT) {
    printf("%s, C %lld, %lld heads, V %lld, B %lld, T %lld:\n", kiln_dtype_name(dt),
           (long long)c->n_embd, (long long)c->n_head, (long long)c->vocab_size, (long long)B,
           (long long)T);
    run a = {0}, g = {0};
    kiln_status s1 = start(&a, c, dt, kiln_backend_cpu(), B, maxT);
    kiln_status s2 = s1 ? s1 : start(&g, c, dt, kiln_backend_cuda(), B, maxT);
    check_ok("build the models", s2);
    if (s2) {
        finish(&a), finish(&g);
        return;
    }
    int64_t n = kiln_gpt_slab_len(a.m);
    double ltol = dt == KILN_DTYPE_F32 ? 1e-4 : 2e-2, gtol = dt == KILN_DTYPE_F32 ? 1e-3 : 5e-2;
    kiln_rng rng;
    kiln_rng_seed(&rng, 99);
    int32_t *in = malloc((size_t)(B * T) * sizeof(int32_t)), *tg = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int step = 0; step < 3; step++) {
        for (int64_t i = 0; i < B * T; i++) {
            in[i] = (int32_t)kiln_rng_below(&rng, (uint64_t)c->vocab_size);
            tg[i] = (int32_t)kiln_rng_below(&rng, (uint64_t)c->vocab_size);
        }
        float la = 0, lg = 0;
        kiln_gpt_zero_grad(a.m);
        kiln_gpt_zero_grad(g.m);
        check_ok("cpu forward_backward", kiln_gpt_forward_backward(a.m, in, tg, B, T, 1.0f, &la));
        check_ok("cuda forward_backward", kiln_gpt_forward_backward(g.m, in, tg, B, T, 1.0f, &lg));
        char what[96];
        snprintf(what, sizeof what, "step %d loss (%.6f vs %.6f)", step + 1, lg, la);
        check(what, fabs((double)lg - la) / fmax(fabs(la), 1e-30), ltol);
        float *ga = fetch_f32(a.be, kiln_gpt_grads(a.m), n, KILN_DTYPE_F32);
        float *gg = fetch_f32(g.be, kiln_gpt_grads(g.m), n, KILN_DTYPE_F32);
        snprintf(what, sizeof what, "step %d gradients", step + 1);
        check(what, max_err(gg, ga, n), gtol);
        free(ga), free(gg);
        check_ok("cpu step", kiln_optim_step(a.o, kiln_gpt_params(a.m), kiln_gpt_grads(a.m), 1e-3f));
        check_ok("cuda step", kiln_optim_step(g.o, kiln_gpt_params(g.m), kiln_gpt_grads(g.m), 1e-3f));
    }
    float *pa = fetch_f32(a.be, kiln_gpt_params(a.m), n, dt);
    float *pg = fetch_f32(g.be, kiln_gpt_params(g.m), n, dt);
    check("weights after 3 steps", max_err(pg, pa, n), gtol);
    free(pa), free(pg), free(in), free(tg);
    finish(&a), finish(&g);
}

int main(void) {
    char why[512];
    if (kiln_cuda_available(why, sizeof why) != KILN_OK) {
        printf("SKIP: no CUDA GPU (%s)\n", why);
        fprintf(stderr, "SKIP: no CUDA GPU (%s)\n", why);
        return 77;
    }
    printf("%s\n", why);
    if (!kiln_backend_cuda()) {
        fprintf(stderr, "kiln_backend_cuda: %s\n", kiln_error_message());
        return 1;
    }
    kiln_gpt_config c1 = {.max_seq_len = 32, .vocab_size = 512, .n_layer = 2, .n_head = 4, .n_embd = 64};
    kiln_gpt_config c2 = {.max_seq_len = 32, .vocab_size = 1001, .n_layer = 2, .n_head = 6, .n_embd = 72};
    if (kiln_gpt_config_validate(&c1) || kiln_gpt_config_validate(&c2)) {
        fprintf(stderr, "config: %s\n", kiln_error_message());
        return 1;
    }
    kiln_dtype dts[2] = {KILN_DTYPE_F32, KILN_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        compare(&c1, dts[k], 2, 32, 32);
        compare(&c2, dts[k], 3, 23, 32);
    }
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
