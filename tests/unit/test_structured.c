/* Structured pruning (kiln_prune_structured): the rebuilt narrower model computes what the
 * full model computes with the removed heads' and neurons' output rows zeroed, with shared
 * blocks too; the scores are the stated measures, computed here by name from the tensors;
 * keeping no head is refused; a narrow model's gradients match central differences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "test.h"

static kiln_gpt_config cfg(int64_t share) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 24;
    c.vocab_size = 40;
    c.max_seq_len = 8;
    c.share_layers = share;
    return c;
}

static void batch(int32_t *in, int32_t *tg, int n, int V) {
    for (int i = 0; i < n; i++) {
        in[i] = (i * 5 + 2) % V;
        tg[i] = (i * 7 + 1) % V;
    }
}

/* Fill the slab with N(0, 0.1)-like values from a fixed sequence (biases too: a head's bias
 * that the rebuild dropped would show). */
static void fill(kiln_gpt *m, uint64_t seed) {
    kiln_gpt_init_weights(m, seed);
    float *w = kiln_gpt_params(m);
    uint64_t x = seed * 2654435761u + 1;
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        if (t->ndim == 2 && t->layer < 0)
            continue;
        for (int64_t e = 0; e < t->numel; e++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            w[t->offset + e] += (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5) * 0.2f;
        }
    }
}

static float *row_of(kiln_gpt *m, const char *name, int64_t b, int64_t row) {
    char full[64];
    snprintf(full, sizeof full, "h.%lld.%s", (long long)b, name);
    const kiln_tensor_info *t = kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, full));
    return (float *)kiln_gpt_params(m) + t->offset + row * t->shape[1];
}

static void check_equivalence(int64_t share) {
    kiln_gpt_config c = cfg(share);
    kiln_gpt *m = NULL, *p = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 6, NULL, kiln_backend_cpu()));
    if (!m)
        return;
    fill(m, 3 + (uint64_t)share);
    int64_t U = kiln_gpt_config_blocks(&c), NH = 4, hs = 6, H = 96;
    double *hsc = calloc((size_t)(U * NH), sizeof *hsc),
           *nsc = calloc((size_t)(U * H), sizeof *nsc);
    for (int64_t i = 0; i < U * NH; i++) /* a different order in each block */
        hsc[i] = (double)((i * 7 + 3) % 11);
    for (int64_t i = 0; i < U * H; i++)
        nsc[i] = (double)((i * 37 + 5) % 101);
    int64_t hk[2 * 2], nk[2 * 60];
    CHECK_OK(kiln_prune_structured(m, hsc, nsc, 2, 60, &p, hk, nk));
    if (!p) {
        kiln_gpt_free(m);
        free(hsc);
        free(nsc);
        return;
    }
    const kiln_gpt_config *pc = kiln_gpt_get_config(p);
    CHECK_INT_EQ(pc->n_head, 2);
    CHECK_INT_EQ(kiln_gpt_config_head_size(pc), hs);
    CHECK_INT_EQ(kiln_gpt_config_mlp_width(pc), 60);
    CHECK_INT_EQ(kiln_gpt_slab_len(p) - (kiln_gpt_config_num_params(pc) +
                                         (pc->padded_vocab_size - pc->vocab_size) * 24),
                 0);
    for (int64_t b = 0; b < U; b++) { /* the two highest scores of each block, ascending */
        int64_t best = -1, second = -1;
        for (int64_t h = 0; h < NH; h++) {
            double s = hsc[b * NH + h];
            if (best < 0 || s > hsc[b * NH + best]) {
                second = best;
                best = h;
            } else if (second < 0 || s > hsc[b * NH + second]) {
                second = h;
            }
        }
        CHECK_INT_EQ(hk[b * 2], best < second ? best : second);
        CHECK_INT_EQ(hk[b * 2 + 1], best < second ? second : best);
    }
    /* the full model with the removed heads' c_proj rows and neurons' mlp.c_proj rows zeroed */
    for (int64_t b = 0; b < U; b++) {
        for (int64_t h = 0; h < NH; h++)
            if (h != hk[b * 2] && h != hk[b * 2 + 1])
                memset(row_of(m, "attn.c_proj.weight", b, h * hs), 0,
                       (size_t)(hs * 24) * sizeof(float));
        for (int64_t j = 0; j < H; j++) {
            int kept = 0;
            for (int64_t k = 0; k < 60; k++)
                kept |= nk[b * 60 + k] == j;
            if (!kept)
                memset(row_of(m, "mlp.c_proj.weight", b, j), 0, 24 * sizeof(float));
        }
    }
    int32_t in[12], tg[12];
    batch(in, tg, 12, 40);
    float lm = 0, lp = 0;
    kiln_gpt *pt = NULL; /* the pruned model for training: the same weights, gradients too */
    CHECK_OK(kiln_gpt_create(&pt, pc, 2, 6, NULL, kiln_backend_cpu()));
    if (pt) {
        memcpy(kiln_gpt_params(pt), kiln_gpt_params(p),
               (size_t)kiln_gpt_slab_len(p) * sizeof(float));
        CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 6, &lm));
        CHECK_OK(kiln_gpt_forward(pt, in, tg, 2, 6, &lp));
        CHECK_NEAR(lp, lm, 2e-6);
        /* the kept parameters' gradients are the full model's (the zeroed rows aside) */
        kiln_gpt_zero_grad(m);
        kiln_gpt_zero_grad(pt);
        CHECK_OK(kiln_gpt_forward_backward(m, in, tg, 2, 6, 1.0f, &lm));
        CHECK_OK(kiln_gpt_forward_backward(pt, in, tg, 2, 6, 1.0f, &lp));
        const float *gm = kiln_gpt_grads(m), *gp = kiln_gpt_grads(pt);
        int64_t j = nk[60 - 1]; /* block 0's last kept neuron: its c_fc column */
        const kiln_tensor_info *fm =
            kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, "h.0.mlp.c_fc.weight"));
        const kiln_tensor_info *fp =
            kiln_gpt_tensor(pt, kiln_gpt_find_tensor(pt, "h.0.mlp.c_fc.weight"));
        double worst = 0.0;
        for (int64_t i = 0; i < 24; i++) {
            double a = gm[fm->offset + i * H + j], b = gp[fp->offset + i * 60 + 59];
            worst = fmax(worst, fabs(a - b));
        }
        CHECK_TRUE(worst < 1e-6);
        const kiln_tensor_info *wm = kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, "wte.weight"));
        const kiln_tensor_info *wp = kiln_gpt_tensor(pt, kiln_gpt_find_tensor(pt, "wte.weight"));
        worst = 0.0;
        for (int64_t e = 0; e < wm->numel; e++)
            worst = fmax(worst, fabs(gm[wm->offset + e] - gp[wp->offset + e]));
        CHECK_TRUE(worst < 1e-6);
    }
    /* no head left in a layer, or more than there are: refused */
    kiln_gpt *bad = NULL;
    CHECK_STATUS(kiln_prune_structured(m, hsc, nsc, 0, 60, &bad, NULL, NULL), KILN_ERR_ARG);
    CHECK_TRUE(bad == NULL);
    CHECK_STATUS(kiln_prune_structured(m, hsc, nsc, 5, 60, &bad, NULL, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_prune_structured(m, hsc, nsc, 2, 0, &bad, NULL, NULL), KILN_ERR_ARG);
    kiln_gpt_free(pt);
    kiln_gpt_free(p);
    kiln_gpt_free(m);
    free(hsc);
    free(nsc);
}

/* The scores against the definitions, by tensor name: magnitude is the L2 norm of the
 * group's weights; one batch's Taylor score (sum of w x g over the group)^2. */
static void test_scores(void) {
    kiln_gpt_config c = cfg(0);
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 6, NULL, kiln_backend_cpu()));
    if (!m)
        return;
    fill(m, 11);
    int64_t NH = 4, hs = 6, A = 24, C = 24, H = 96, U = 2;
    double hsc[8] = {0}, nsc[2 * 96] = {0};
    const float *w = kiln_gpt_params(m);
    CHECK_OK(kiln_struct_scores_magnitude(m, w, hsc, nsc));
    int32_t in[12], tg[12];
    batch(in, tg, 12, 40);
    float loss;
    kiln_gpt_zero_grad(m);
    CHECK_OK(kiln_gpt_forward_backward(m, in, tg, 2, 6, 1.0f, &loss));
    const float *g = kiln_gpt_grads(m);
    double th[8] = {0}, tn[2 * 96] = {0};
    CHECK_OK(kiln_struct_scores_taylor_add(m, w, g, th, tn));
    for (int64_t b = 0; b < U; b++) {
        char name[64];
#define T_(suffix)                                                                                 \
    (snprintf(name, sizeof name, "h.%lld." suffix, (long long)b),                                  \
     kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, name)))
        const kiln_tensor_info *qw = T_("attn.c_attn.weight"), *qb = T_("attn.c_attn.bias"),
                               *pw = T_("attn.c_proj.weight"), *fw = T_("mlp.c_fc.weight"),
                               *fb = T_("mlp.c_fc.bias"), *ow = T_("mlp.c_proj.weight");
#undef T_
        for (int64_t h = 0; h < NH; h++) {
            double sq = 0.0, wg = 0.0;
            for (int64_t p = 0; p < 3; p++)
                for (int64_t d = 0; d < hs; d++) {
                    int64_t col = p * A + h * hs + d;
                    for (int64_t i = 0; i < C; i++) {
                        int64_t k = qw->offset + i * 3 * A + col;
                        sq += (double)w[k] * w[k];
                        wg += (double)w[k] * g[k];
                    }
                    sq += (double)w[qb->offset + col] * w[qb->offset + col];
                    wg += (double)w[qb->offset + col] * g[qb->offset + col];
                }
            for (int64_t k = pw->offset + h * hs * C; k < pw->offset + (h + 1) * hs * C; k++) {
                sq += (double)w[k] * w[k];
                wg += (double)w[k] * g[k];
            }
            CHECK_NEAR(hsc[b * NH + h], sqrt(sq), 1e-9 * sqrt(sq) + 1e-12);
            CHECK_NEAR(th[b * NH + h], wg * wg, 1e-9 * wg * wg + 1e-15);
        }
        for (int64_t j = 0; j < H; j += 17) {
            double sq = 0.0, wg = 0.0;
            for (int64_t i = 0; i < C; i++) {
                int64_t k = fw->offset + i * H + j;
                sq += (double)w[k] * w[k];
                wg += (double)w[k] * g[k];
            }
            sq += (double)w[fb->offset + j] * w[fb->offset + j];
            wg += (double)w[fb->offset + j] * g[fb->offset + j];
            for (int64_t k = ow->offset + j * C; k < ow->offset + (j + 1) * C; k++) {
                sq += (double)w[k] * w[k];
                wg += (double)w[k] * g[k];
            }
            CHECK_NEAR(nsc[b * H + j], sqrt(sq), 1e-9 * sqrt(sq) + 1e-12);
            CHECK_NEAR(tn[b * H + j], wg * wg, 1e-9 * wg * wg + 1e-15);
        }
    }
    kiln_importance imp;
    CHECK_OK(kiln_importance_parse("magnitude", &imp));
    CHECK_INT_EQ(imp, KILN_IMPORTANCE_MAGNITUDE);
    CHECK_STATUS(kiln_importance_parse("random", &imp), KILN_ERR_ARG);
    kiln_gpt_free(m);
}

/* A narrow model (3 heads of 5 for C = 24, MLP 40): backward against central differences. */
static void test_narrow_gradients(void) {
    kiln_gpt_config c = cfg(0);
    c.n_head = 3;
    c.head_size = 5;
    c.mlp_hidden = 40;
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_INT_EQ(kiln_gpt_config_attn_width(&c), 15);
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 6, NULL, kiln_backend_cpu()));
    if (!m)
        return;
    fill(m, 17);
    int32_t in[12], tg[12];
    batch(in, tg, 12, 40);
    float loss;
    kiln_gpt_zero_grad(m);
    CHECK_OK(kiln_gpt_forward_backward(m, in, tg, 2, 6, 1.0f, &loss));
    float *g = malloc((size_t)kiln_gpt_slab_len(m) * sizeof *g);
    memcpy(g, kiln_gpt_grads(m), (size_t)kiln_gpt_slab_len(m) * sizeof *g);
    float *w = kiln_gpt_params(m);
    const char *names[] = {"h.1.attn.c_attn.weight", "h.0.attn.c_proj.weight",
                           "h.1.mlp.c_fc.weight", "h.0.mlp.c_proj.weight", "h.1.attn.c_attn.bias"};
    double worst = 0.0;
    for (int k = 0; k < 5; k++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, names[k]));
        for (int64_t e = 0; e < t->numel; e += t->numel / 7 + 1) {
            int64_t at = t->offset + e;
            float keep = w[at], lp, lm, h = 1e-2f;
            w[at] = keep + h;
            CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 6, &lp));
            w[at] = keep - h;
            CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 6, &lm));
            w[at] = keep;
            double fd = ((double)lp - lm) / (2.0 * h);
            worst = fmax(worst, fabs(fd - g[at]) / (fabs(fd) + 1e-3));
        }
    }
    CHECK_TRUE(worst < 2e-2);
    free(g);
    kiln_gpt_free(m);
}

static void test_equivalence(void) {
    check_equivalence(0);
}
static void test_equivalence_shared(void) {
    check_equivalence(2);
}

/* head_size and mlp_hidden: the defaults are stored as 0, bad values refused */
static void test_config(void) {
    kiln_gpt_config c = cfg(0);
    c.head_size = 6; /* = 24 / 4 */
    c.mlp_hidden = 96;
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_INT_EQ(c.head_size, 0);
    CHECK_INT_EQ(c.mlp_hidden, 0);
    c.n_head = 5; /* 5 does not divide 24, but heads of 4 are given */
    c.head_size = 4;
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_INT_EQ(kiln_gpt_config_attn_width(&c), 20);
    c.head_size = -1;
    CHECK_STATUS(kiln_gpt_config_validate(&c), KILN_ERR_CONFIG);
    c.head_size = 0; /* 5 heads of 24 / 5 */
    CHECK_STATUS(kiln_gpt_config_validate(&c), KILN_ERR_CONFIG);
    c = cfg(0);
    c.mlp_hidden = -3;
    CHECK_STATUS(kiln_gpt_config_validate(&c), KILN_ERR_CONFIG);
}

int main(void) {
    RUN_TEST(test_equivalence);
    RUN_TEST(test_equivalence_shared);
    RUN_TEST(test_scores);
    RUN_TEST(test_narrow_gradients);
    RUN_TEST(test_config);
    TEST_MAIN_END();
}
