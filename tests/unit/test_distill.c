/* Distillation's loss and gradient (kiln_gpt_set_soft_targets): directional central
 * differences of alpha CE + (1 - alpha) T^2 KL(p || softmax(z / T)) against backward, on the
 * CPU backend; alpha 1 is the plain cross-entropy; bad settings are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "test.h"

static kiln_gpt_config cfg(void) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.vocab_size = 24;
    c.max_seq_len = 8;
    return c;
}

/* Teacher probabilities: random rows that sum to 1, some exact zeros. */
static void teacher(float *p, int64_t rows, int64_t V, float T) {
    srand(5);
    for (int64_t i = 0; i < rows; i++) {
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) {
            float z = (float)rand() / (float)RAND_MAX * 4.0f;
            p[i * V + v] = v % 7 == 3 ? 0.0f : expf(z / T);
            sum += p[i * V + v];
        }
        for (int64_t v = 0; v < V; v++)
            p[i * V + v] = (float)(p[i * V + v] / sum);
    }
}

static void test_gradient(void) {
    kiln_gpt_config c = cfg();
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 5, NULL, kiln_backend_cpu()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 3);
    float *w = kiln_gpt_params(m);
    int64_t n = kiln_gpt_slab_len(m);
    for (int64_t k = 0; k < n; k++)
        w[k] *= 3.0f;
    int32_t in[10], tg[10];
    for (int i = 0; i < 10; i++) {
        in[i] = (i * 7 + 3) % 24;
        tg[i] = (i * 5 + 1) % 24;
    }
    float p[10 * 24];
    teacher(p, 10, 24, 2.0f);
    CHECK_OK(kiln_gpt_set_soft_targets(m, p, 0.3f, 2.0f));
    float loss = 0.0f, again = 0.0f;
    kiln_gpt_zero_grad(m);
    CHECK_OK(kiln_gpt_forward_backward(m, in, tg, 2, 5, 1.0f, &loss));
    CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 5, &again));
    CHECK_NEAR(again, loss, 1e-6); /* forward reports the same mixed loss */
    const float *g = kiln_gpt_grads(m);
    float *saved = malloc((size_t)n * sizeof *saved), *dir = malloc((size_t)n * sizeof *dir);
    memcpy(saved, w, (size_t)n * sizeof *saved);
    int bad = 0;
    srand(11);
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        double analytic = 0.0, h = 1e-3;
        for (int64_t k = 0; k < t->numel; k++) {
            dir[k] = rand() & 1 ? 1.0f : -1.0f;
            analytic += (double)g[t->offset + k] * dir[k];
        }
        float lp = 0.0f, lm = 0.0f;
        for (int64_t k = 0; k < t->numel; k++)
            w[t->offset + k] = saved[t->offset + k] + (float)h * dir[k];
        kiln_gpt_forward(m, in, tg, 2, 5, &lp);
        for (int64_t k = 0; k < t->numel; k++)
            w[t->offset + k] = saved[t->offset + k] - (float)h * dir[k];
        kiln_gpt_forward(m, in, tg, 2, 5, &lm);
        memcpy(w + t->offset, saved + t->offset, (size_t)t->numel * sizeof *w);
        double fd = ((double)lp - (double)lm) / (2.0 * h);
        if (fabs(fd - analytic) > 0.02 * fmax(fabs(fd), fabs(analytic)) + 1e-3) {
            bad++;
            fprintf(stderr, "  %s: backward %.6g, differences %.6g\n", t->name, analytic, fd);
        }
    }
    CHECK_INT_EQ(bad, 0);
    /* alpha 1: the plain cross-entropy, the same bits as without soft targets */
    float plain = 0.0f, mixed1 = 0.0f;
    CHECK_OK(kiln_gpt_set_soft_targets(m, NULL, 0.0f, 0.0f));
    CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 5, &plain));
    CHECK_OK(kiln_gpt_set_soft_targets(m, p, 1.0f, 2.0f));
    CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 5, &mixed1));
    CHECK_NEAR(mixed1, plain, 1e-6);
    /* out of range */
    CHECK_STATUS(kiln_gpt_set_soft_targets(m, p, 1.5f, 2.0f), KILN_ERR_ARG);
    CHECK_STATUS(kiln_gpt_set_soft_targets(m, p, 0.5f, 0.0f), KILN_ERR_ARG);
    free(saved);
    free(dir);
    kiln_gpt_free(m);
}

static void test_refused_off_fp32(void) {
    kiln_gpt_config c = cfg();
    kiln_gpt_options o = kiln_gpt_options_default();
    o.dtype = KILN_DTYPE_BF16;
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 1, 4, &o, kiln_backend_cpu()));
    float p[4 * 24] = {0};
    if (m)
        CHECK_STATUS(kiln_gpt_set_soft_targets(m, p, 0.5f, 2.0f), KILN_ERR_UNSUPPORTED);
    kiln_gpt_free(m);
}

int main(void) {
    RUN_TEST(test_gradient);
    RUN_TEST(test_refused_off_fp32);
    TEST_MAIN_END();
}
