/* The whole GPT-2 model against PyTorch, and against finite differences.
 *
 *   test_ref_gpt DIR    compare kiln with the values tests/ref/gpt_ref.py wrote into DIR
 *   test_ref_gpt --fd   central differences of kiln's own loss on a tiny model
 *
 * Both run with the reference backend and with the CPU backend. The expected values are
 * PyTorch's, computed in float64 from the same float32 weights, so they are the exact
 * answer and the tolerances below measure kiln's float32 error alone. Tolerances, each a
 * relative error by norm: logits and loss 1e-5; every parameter's gradient 1e-4; the loss
 * of each of the AdamW steps 1e-4, and every parameter tensor after them 1e-4. That last
 * check is what catches weight decay on the wrong tensors (decay on biases and LayerNorm
 * moves them by ~1e-3 relative in 10 steps, while float32 PyTorch stays within ~2e-5). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/optim.h"
#include "ref_manifest.h"
#include "test.h"

#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-5
#define TOL_GRAD 1e-4
#define TOL_ADAMW 1e-4
#define TOL_ADAMW_PARAM 1e-4

typedef struct ref_case {
    ref_manifest m; /* dir, the manifest's entries, expected.f64 */
    int32_t *inputs, *targets; /* (steps, B, T) */
    int64_t B, T, steps;
    double lr, beta1, beta2, eps, weight_decay;
    kiln_gpt_config cfg;
} ref_case;

/* The whole file into *out (test_slurp), or -1 saying which file could not be read. */
static int read_file(const char *path, void **out, size_t *size) {
    *out = test_slurp(path, size);
    if (!*out) {
        fprintf(stderr, "cannot read %s\n", path);
        return -1;
    }
    return 0;
}

static int read_tokens(const ref_case *rc, const char *file, int32_t **out) {
    char path[512];
    void *buf;
    size_t size;
    snprintf(path, sizeof path, "%s/%s", rc->m.dir, file);
    if (read_file(path, &buf, &size))
        return -1;
    if (size != (size_t)(rc->steps * rc->B * rc->T) * sizeof(int32_t)) {
        fprintf(stderr,
                "%s: %zu bytes, wanted (steps %" PRId64 ", B %" PRId64 ", T %" PRId64 ") int32\n",
                path, size, rc->steps, rc->B, rc->T);
        free(buf);
        return -1;
    }
    *out = buf;
    return 0;
}

static int load_case(ref_case *rc, const char *dir) {
    char path[512];
    void *buf;
    size_t size;
    int ok = 1;
    snprintf(rc->m.dir, sizeof rc->m.dir, "%s", dir);
    if (read_manifest(&rc->m, " (run tests/ref/gpt_ref.py first)"))
        return -1;
    rc->B = (int64_t)scalar(&rc->m, "B", &ok);
    rc->T = (int64_t)scalar(&rc->m, "T", &ok);
    rc->steps = (int64_t)scalar(&rc->m, "steps", &ok);
    rc->lr = scalar(&rc->m, "lr", &ok);
    rc->beta1 = scalar(&rc->m, "beta1", &ok);
    rc->beta2 = scalar(&rc->m, "beta2", &ok);
    rc->eps = scalar(&rc->m, "eps", &ok);
    rc->weight_decay = scalar(&rc->m, "weight_decay", &ok);
    if (!ok)
        return -1;
    snprintf(path, sizeof path, "%s/expected.f64", dir);
    if (read_file(path, &buf, &size))
        return -1;
    rc->m.expected = buf;
    rc->m.n_expected = (int64_t)(size / sizeof(double));
    if (read_tokens(rc, "inputs.i32", &rc->inputs))
        return -1;
    if (read_tokens(rc, "targets.i32", &rc->targets))
        return -1;
    return 0;
}

static void free_case(ref_case *rc) {
    free(rc->m.expected);
    free(rc->inputs);
    free(rc->targets);
}

/* ||a - b|| / ||b|| over `rows` rows of `cols` values; a's rows are lda apart, b's cols. */
static double rel_err_rows(const float *a, int64_t lda, const double *b, int64_t rows,
                           int64_t cols) {
    double num = 0, den = 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) {
            double d = (double)a[r * lda + c] - b[r * cols + c];
            num += d * d;
            den += b[r * cols + c] * b[r * cols + c];
        }
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_rel(const char *what, double err, double tol) {
    test_checks++;
    int bad = !(err <= tol);
    if (bad)
        test_failures++;
    fprintf(stderr, "  %-34s rel err %.2e (tol %.0e)%s\n", what, err, tol, bad ? "  FAILED" : "");
}

/* Configuration from config.json, cross-checked with what the weights file says. */
static void check_config(ref_case *rc) {
    char path[512];
    kiln_gpt_config from_st;
    snprintf(path, sizeof path, "%s/config.json", rc->m.dir);
    CHECK_OK(kiln_gpt_config_from_json(&rc->cfg, path));
    CHECK_OK(kiln_gpt_config_validate(&rc->cfg));
    memset(&from_st, 0, sizeof from_st);
    from_st.n_head = rc->cfg.n_head; /* Hugging Face files do not record it */
    snprintf(path, sizeof path, "%s/model.safetensors", rc->m.dir);
    CHECK_OK(kiln_gpt_config_from_safetensors(&from_st, path));
    CHECK_OK(kiln_gpt_config_validate(&from_st));
    CHECK_INT_EQ(from_st.n_layer, rc->cfg.n_layer);
    CHECK_INT_EQ(from_st.n_embd, rc->cfg.n_embd);
    CHECK_INT_EQ(from_st.vocab_size, rc->cfg.vocab_size);
    CHECK_INT_EQ(from_st.max_seq_len, rc->cfg.max_seq_len);
    CHECK_INT_EQ(from_st.padded_vocab_size, rc->cfg.padded_vocab_size);
}

static kiln_status build(const ref_case *rc, kiln_backend *be, kiln_gpt **m) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", rc->m.dir);
    kiln_status s = kiln_gpt_create(m, &rc->cfg, rc->B, rc->T, NULL, be);
    if (s != KILN_OK)
        return s;
    return kiln_gpt_load_safetensors(*m, path);
}

/* Every parameter tensor of `slab` against the expected "<prefix><HF name>" values, by
 * relative error by norm; the worst tensor is named. kiln's tensor table must name each
 * tensor PyTorch has, with weight decay exactly on the 2-D ones. */
static void check_tensors(const ref_case *rc, kiln_gpt *m, const float *slab, const char *prefix,
                          const char *label, double tol) {
    double worst = 0;
    const char *worst_name = "(none)";
    int n = kiln_gpt_num_tensors(m), n_expected = 0;
    size_t plen = strlen(prefix);
    for (int i = 0; i < rc->m.n_entries; i++)
        n_expected += rc->m.entries[i].is_tensor && !strncmp(rc->m.entries[i].name, prefix, plen);
    CHECK_INT_EQ(n, n_expected);
    for (int i = 0; i < n; i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        char name[128];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        const double *want = expected(&rc->m, name, t->numel);
        CHECK_TRUE(want != NULL);
        CHECK_INT_EQ(t->decay, t->ndim == 2);
        if (!want)
            continue;
        double err = rel_err_rows(slab + t->offset, t->numel, want, 1, t->numel);
        if (getenv("KILN_REF_VERBOSE"))
            fprintf(stderr, "    %-30s %.2e\n", name, err);
        if (!(err <= worst)) {
            worst = err;
            worst_name = t->name;
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%s (worst: %s)", label, worst_name);
    check_rel(what, worst, tol);
}

/* The padded rows (V..Vp-1) of the embedding (the table's first tensor) and of an untied
 * head are outside every tensor: never a gradient. */
static void check_padded_rows(kiln_gpt *m) {
    const kiln_gpt_config *cfg = kiln_gpt_get_config(m);
    int head = kiln_gpt_find_tensor(m, "lm_head.weight");
    for (int k = 0; k < (head >= 0 ? 2 : 1); k++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, k ? head : 0);
        const float *g = kiln_gpt_grads(m) + t->offset + t->numel;
        int64_t n = (cfg->padded_vocab_size - cfg->vocab_size) * cfg->n_embd, nonzero = 0;
        for (int64_t i = 0; i < n; i++)
            nonzero += g[i] != 0.0f;
        CHECK_INT_EQ(nonzero, 0);
    }
}

/* Forward and backward on batch 0; then once more, which must give the same bits. */
static void check_forward_backward(const ref_case *rc, kiln_backend *be) {
    kiln_gpt *m = NULL;
    float *g1 = NULL;
    const kiln_gpt_config *cfg = &rc->cfg;
    int64_t N = rc->B * rc->T;
    float loss = 0, loss2 = 0;
    TRY(build(rc, be, &m));
    kiln_gpt_zero_grad(m);
    const double *want = expected(&rc->m, "logits", N * cfg->vocab_size);
    const double *want_loss = expected(&rc->m, "loss", 1);
    CHECK_TRUE(want && want_loss);
    if (!want || !want_loss)
        goto done;
    TRY(kiln_gpt_forward(m, rc->inputs, rc->targets, rc->B, rc->T, &loss));
    /* before backward, which turns the logits into their gradient in place */
    check_rel("logits",
              rel_err_rows(kiln_gpt_logits(m), cfg->padded_vocab_size, want, N, cfg->vocab_size),
              TOL_LOGITS);
    check_rel("loss", fabs(loss - *want_loss) / fabs(*want_loss), TOL_LOSS);
    TRY(kiln_gpt_backward(m, 1.0f));
    fprintf(stderr, "  loss: kiln %.7f, PyTorch float64 %.7f\n", loss, *want_loss);
    check_tensors(rc, m, kiln_gpt_grads(m), "grad.", "gradients", TOL_GRAD);
    check_padded_rows(m);

    int64_t n = kiln_gpt_slab_len(m);
    g1 = malloc((size_t)n * sizeof *g1);
    CHECK_TRUE(g1 != NULL);
    if (!g1)
        goto done;
    memcpy(g1, kiln_gpt_grads(m), (size_t)n * sizeof *g1);
    kiln_gpt_zero_grad(m);
    TRY(kiln_gpt_forward(m, rc->inputs, rc->targets, rc->B, rc->T, &loss2));
    TRY(kiln_gpt_backward(m, 1.0f));
    CHECK_TRUE(memcmp(&loss, &loss2, sizeof loss) == 0);
    CHECK_TRUE(memcmp(g1, kiln_gpt_grads(m), (size_t)n * sizeof *g1) == 0);
done:
    free(g1);
    kiln_gpt_free(m);
}

/* `steps` AdamW steps, batch k for step k; loss k is measured before update k. */
static void check_adamw(const ref_case *rc, kiln_backend *be) {
    kiln_gpt *m = NULL;
    kiln_optim *o = NULL;
    kiln_param_range *ranges = NULL;
    const double *want = expected(&rc->m, "adamw_losses", rc->steps);
    CHECK_TRUE(want != NULL);
    if (!want)
        return;
    TRY(build(rc, be, &m));
    int n = kiln_gpt_num_tensors(m);
    ranges = calloc((size_t)n, sizeof *ranges);
    CHECK_TRUE(ranges != NULL);
    if (!ranges)
        goto done;
    for (int i = 0; i < n; i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        ranges[i] = (kiln_param_range){t->offset, t->numel, t->decay};
    }
    kiln_optim_config oc = kiln_optim_config_default();
    oc.kind = KILN_OPTIM_ADAMW;
    oc.beta1 = (float)rc->beta1;
    oc.beta2 = (float)rc->beta2;
    oc.eps = (float)rc->eps;
    oc.weight_decay = (float)rc->weight_decay;
    kiln_optim_slab slab = {.n = kiln_gpt_slab_len(m), .work = KILN_DTYPE_F32};
    TRY(kiln_optim_create(&o, &oc, &slab, ranges, n, be));

    double worst = 0;
    int64_t worst_step = 0, BT = rc->B * rc->T;
    float loss = 0;
    for (int64_t k = 0; k < rc->steps; k++) {
        kiln_gpt_zero_grad(m);
        TRY(kiln_gpt_forward(m, rc->inputs + k * BT, rc->targets + k * BT, rc->B, rc->T, &loss));
        TRY(kiln_gpt_backward(m, 1.0f));
        TRY(kiln_optim_step(o, kiln_gpt_params(m), kiln_gpt_grads(m), (float)rc->lr));
        double err = fabs(loss - want[k]) / fabs(want[k]);
        if (getenv("KILN_REF_VERBOSE"))
            fprintf(stderr, "    step %" PRId64 ": kiln %.7f torch %.7f\n", k, loss, want[k]);
        if (!(err <= worst)) {
            worst = err;
            worst_step = k;
        }
    }
    CHECK_INT_EQ(kiln_optim_steps_taken(o), rc->steps);
    char what[96];
    snprintf(what, sizeof what, "AdamW losses, %" PRId64 " steps (worst: %" PRId64 ")", rc->steps,
             worst_step);
    check_rel(what, worst, TOL_ADAMW);
    check_tensors(rc, m, kiln_gpt_params(m), "adamw_param.", "parameters after AdamW",
                  TOL_ADAMW_PARAM);
    fprintf(stderr, "  AdamW loss: step 0 %.5f -> step %" PRId64 " %.5f (PyTorch %.5f)\n", want[0],
            rc->steps - 1, loss, want[rc->steps - 1]);
done:
    kiln_optim_free(o);
    free(ranges);
    kiln_gpt_free(m);
}

static const char *scalar_text(const ref_case *rc, const char *key) {
    const entry *e = find_entry(&rc->m, 0, key);
    return e ? e->value : "?";
}

static int run_case(const char *dir) {
    static ref_case rc; /* large: keep it off the stack */
    memset(&rc, 0, sizeof rc);
    if (load_case(&rc, dir)) {
        free_case(&rc);
        return -1;
    }
    check_config(&rc);
    fprintf(stderr,
            "case %s (%s): L=%" PRId64 " NH=%" PRId64 " C=%" PRId64 " V=%" PRId64 " (Vp %" PRId64
            ") maxT=%" PRId64 " B=%" PRId64 " T=%" PRId64 "\n",
            scalar_text(&rc, "case"), dir, rc.cfg.n_layer, rc.cfg.n_head, rc.cfg.n_embd,
            rc.cfg.vocab_size, rc.cfg.padded_vocab_size, rc.cfg.max_seq_len, rc.B, rc.T);
    fprintf(stderr,
            "  float32 PyTorch vs float64 here: logits %s, gradients worst %s, "
            "AdamW losses worst %s, parameters after AdamW worst %s\n",
            scalar_text(&rc, "torch32_logits_rel"), scalar_text(&rc, "torch32_grad_worst_rel"),
            scalar_text(&rc, "torch32_adamw_worst_rel"),
            scalar_text(&rc, "torch32_adamw_param_worst_rel"));
    kiln_backend *backends[2] = {kiln_backend_ref(), kiln_backend_cpu()};
    for (int b = 0; b < 2; b++) {
        int before = test_failures;
        fprintf(stderr, "backend %s\n", backends[b]->name);
        check_forward_backward(&rc, backends[b]);
        check_adamw(&rc, backends[b]);
        fprintf(stderr, "%s backend %s\n", test_failures == before ? "ok  " : "FAIL",
                backends[b]->name);
    }
    free_case(&rc);
    return 0;
}

/* ---- finite differences ----
 * A tiny model with weights large enough (matrices N(0, 0.2)) that gradients stand well
 * above float32's rounding of the loss. Central differences with step FD_H: a loss of ~3
 * rounds to ~2.4e-7, which is ~1.2e-5 in a difference quotient, so only coordinates whose
 * gradient is at least a tenth of their tensor's largest are compared, to FD_REL relative
 * plus FD_ABS. PyTorch's float32 model reaches 2.3e-3 relative on this test. */
#define FD_H 1e-2f
#define FD_REL 1e-2
#define FD_ABS 2e-5
#define FD_PER_TENSOR 3

static void fd_weights(kiln_gpt *m, uint64_t seed) {
    kiln_rng r;
    float *p = kiln_gpt_params(m);
    kiln_rng_seed(&r, seed);
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        size_t len = strlen(t->name);
        int ln_weight = t->ndim == 1 && strstr(t->name, "ln_") && len > 7 &&
                        strcmp(t->name + len - 7, ".weight") == 0;
        for (int64_t j = 0; j < t->numel; j++)
            p[t->offset + j] = (ln_weight ? 1.0f : 0.0f) + 0.2f * kiln_rng_normal(&r);
    }
}

static int fd_loss(kiln_gpt *m, const int32_t *x, const int32_t *y, int64_t B, int64_t T,
                   float *loss) {
    kiln_status s = kiln_gpt_forward(m, x, y, B, T, loss);
    if (s != KILN_OK)
        CHECK_OK(s);
    return s == KILN_OK ? 0 : -1;
}

/* Up to FD_PER_TENSOR coordinates of tensor t; returns the worst relative error. */
static double fd_tensor(kiln_gpt *m, const kiln_tensor_info *t, const float *g, kiln_rng *r,
                        const int32_t *x, const int32_t *y, int64_t B, int64_t T, int *count) {
    float *p = kiln_gpt_params(m);
    double gmax = 0, worst = 0;
    for (int64_t j = 0; j < t->numel; j++)
        gmax = fmax(gmax, fabs(g[t->offset + j]));
    int done = 0;
    for (int tries = 0; tries < 10000 && done < FD_PER_TENSOR && gmax > 0; tries++) {
        int64_t j = t->offset + (int64_t)kiln_rng_below(r, (uint64_t)t->numel);
        if (fabs(g[j]) < 0.1 * gmax)
            continue;
        float p0 = p[j], lp, lm;
        float hp = p0 + FD_H, hm = p0 - FD_H;
        p[j] = hp;
        int bad = fd_loss(m, x, y, B, T, &lp);
        p[j] = hm;
        bad |= fd_loss(m, x, y, B, T, &lm);
        p[j] = p0;
        if (bad)
            return INFINITY;
        double fd = ((double)lp - (double)lm) / ((double)hp - (double)hm);
        double err = fabs(fd - g[j]) / fabs(g[j]);
        test_checks++;
        if (!(fabs(fd - g[j]) <= FD_REL * fabs(g[j]) + FD_ABS)) {
            test_failures++;
            fprintf(stderr, "  %s[%" PRId64 "]: gradient %.6e, central difference %.6e\n", t->name,
                    j - t->offset, g[j], fd);
        }
        worst = fmax(worst, err);
        done++;
    }
    *count += done;
    return worst;
}

static void check_finite_differences(kiln_backend *be) {
    kiln_gpt_config cfg = {
        .max_seq_len = 8, .vocab_size = 13, .n_layer = 2, .n_head = 2, .n_embd = 16};
    enum { B = 2, T = 4 };
    int32_t x[B * T], y[B * T];
    kiln_gpt *m = NULL;
    float *g = NULL, loss = 0;
    kiln_rng r;
    kiln_rng_seed(&r, 99);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)kiln_rng_below(&r, (uint64_t)cfg.vocab_size);
        y[i] = (int32_t)kiln_rng_below(&r, (uint64_t)cfg.vocab_size);
    }
    TRY(kiln_gpt_config_validate(&cfg));
    TRY(kiln_gpt_create(&m, &cfg, B, T, NULL, be));
    fd_weights(m, 5);
    kiln_gpt_zero_grad(m);
    TRY(kiln_gpt_forward(m, x, y, B, T, &loss));
    TRY(kiln_gpt_backward(m, 1.0f));
    int64_t n = kiln_gpt_slab_len(m);
    g = malloc((size_t)n * sizeof *g);
    CHECK_TRUE(g != NULL);
    if (!g)
        goto done;
    memcpy(g, kiln_gpt_grads(m), (size_t)n * sizeof *g);

    double worst = 0;
    const char *worst_name = "(none)";
    int count = 0, before = test_failures;
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        int c = count;
        double err = fd_tensor(m, t, g, &r, x, y, B, T, &count);
        CHECK_TRUE(count > c); /* every tensor gets at least one coordinate checked */
        if (!(err <= worst)) {
            worst = err;
            worst_name = t->name;
        }
    }
    fprintf(stderr, "  loss %.5f; %d coordinates in %d tensors, worst rel err %.2e (%s)%s\n", loss,
            count, kiln_gpt_num_tensors(m), worst, worst_name,
            test_failures == before ? "" : "  FAILED");
done:
    free(g);
    kiln_gpt_free(m);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr,
                "usage: %s CASE_DIR   (written by tests/ref/gpt_ref.py)\n"
                "       %s --fd       (finite-difference check)\n",
                argv[0], argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "--fd") == 0) {
        kiln_backend *backends[2] = {kiln_backend_ref(), kiln_backend_cpu()};
        for (int b = 0; b < 2; b++) {
            int before = test_failures;
            fprintf(stderr, "finite differences, backend %s\n", backends[b]->name);
            check_finite_differences(backends[b]);
            fprintf(stderr, "%s backend %s\n", test_failures == before ? "ok  " : "FAIL",
                    backends[b]->name);
        }
    } else {
        /* No expected values: gpt_ref.py could not run (it says why: no PyTorch). */
        char manifest[600];
        struct stat st;
        snprintf(manifest, sizeof manifest, "%s/manifest.txt", argv[1]);
        if (stat(manifest, &st) != 0) {
            fprintf(stderr, "SKIP: %s is absent: tests/ref/gpt_ref.py writes it, with PyTorch\n",
                    manifest);
            return TEST_SKIP_CODE;
        }
        if (run_case(argv[1]) != 0)
            return 1;
    }
    TEST_MAIN_END();
}
