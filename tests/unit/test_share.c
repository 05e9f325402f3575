/* Cross-layer weight sharing (kiln_gpt_config.share_layers): the tensor table holds one block
 * per group of layers, the shared weights' gradients are the sum over their layers (central
 * differences), and a shared model computes what the unshared model with copied blocks does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "test.h"

static kiln_gpt_config cfg(int64_t share) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 4;
    c.n_head = 2;
    c.n_embd = 16;
    c.vocab_size = 24;
    c.max_seq_len = 8;
    c.share_layers = share;
    return c;
}

static void test_layout_and_equivalence(void) {
    kiln_gpt_config cs = cfg(2), cu = cfg(1);
    kiln_gpt *s = NULL, *u = NULL;
    CHECK_OK(kiln_gpt_create(&s, &cs, 2, 5, NULL, kiln_backend_cpu()));
    CHECK_OK(kiln_gpt_create(&u, &cu, 2, 5, NULL, kiln_backend_cpu()));
    if (!s || !u)
        return;
    CHECK_INT_EQ(kiln_gpt_config_blocks(&cs), 2);
    CHECK_INT_EQ(kiln_gpt_num_tensors(s), 2 + 12 * 2 + 2);
    CHECK_TRUE(kiln_gpt_find_tensor(s, "h.1.mlp.c_fc.weight") >= 0);
    CHECK_TRUE(kiln_gpt_find_tensor(s, "h.2.mlp.c_fc.weight") < 0);
    /* two blocks fewer: a block holds 12 C^2 + 13 C weights */
    CHECK_INT_EQ(kiln_gpt_config_num_params(&cu) - kiln_gpt_config_num_params(&cs),
                 2 * (12 * 16 * 16 + 13 * 16));
    CHECK_INT_EQ(kiln_gpt_slab_len(u) - kiln_gpt_slab_len(s), 2 * (12 * 16 * 16 + 13 * 16));
    /* the unshared model with block l/2's weights in layer l computes the same */
    kiln_gpt_init_weights(s, 5);
    const float *ws = kiln_gpt_params(s);
    float *wu = kiln_gpt_params(u);
    for (int i = 0; i < kiln_gpt_num_tensors(u); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(u, i);
        char name[64];
        snprintf(name, sizeof name, "%s", t->name);
        if (t->layer >= 0) /* h.<l>.x -> h.<l/2>.x */
            snprintf(name, sizeof name, "h.%d.%s", t->layer / 2, strchr(t->name + 2, '.') + 1);
        int j = kiln_gpt_find_tensor(s, name);
        CHECK_TRUE(j >= 0);
        if (j >= 0)
            memcpy(wu + t->offset, ws + kiln_gpt_tensor(s, j)->offset,
                   (size_t)t->numel * sizeof *wu);
    }
    int32_t in[10], tg[10];
    for (int i = 0; i < 10; i++) {
        in[i] = (i * 5 + 2) % 24;
        tg[i] = (i * 7 + 1) % 24;
    }
    float ls = 0, lu = 0;
    CHECK_OK(kiln_gpt_forward(s, in, tg, 2, 5, &ls));
    CHECK_OK(kiln_gpt_forward(u, in, tg, 2, 5, &lu));
    CHECK_NEAR(ls, lu, 1e-6);
    /* the shared gradient is the sum of the unshared model's two layers' */
    kiln_gpt_zero_grad(s);
    kiln_gpt_zero_grad(u);
    CHECK_OK(kiln_gpt_forward_backward(s, in, tg, 2, 5, 1.0f, &ls));
    CHECK_OK(kiln_gpt_forward_backward(u, in, tg, 2, 5, 1.0f, &lu));
    const float *gs = kiln_gpt_grads(s), *gu = kiln_gpt_grads(u);
    double worst = 0.0;
    for (int i = 0; i < kiln_gpt_num_tensors(s); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(s, i);
        for (int64_t e = 0; e < t->numel; e++) {
            double want = 0.0;
            if (t->layer < 0) {
                want = gu[kiln_gpt_tensor(u, kiln_gpt_find_tensor(u, t->name))->offset + e];
            } else {
                for (int l = 2 * t->layer; l < 2 * t->layer + 2; l++) {
                    char name[64];
                    snprintf(name, sizeof name, "h.%d.%s", l, strchr(t->name + 2, '.') + 1);
                    want += gu[kiln_gpt_tensor(u, kiln_gpt_find_tensor(u, name))->offset + e];
                }
            }
            double d = fabs(gs[t->offset + e] - want) / (fabs(want) + 1e-3);
            if (d > worst)
                worst = d;
        }
    }
    CHECK_TRUE(worst < 1e-4);
    kiln_gpt_free(s);
    kiln_gpt_free(u);
}

static void test_config(void) {
    kiln_gpt_config c = cfg(3);
    CHECK_STATUS(kiln_gpt_config_validate(&c), KILN_ERR_CONFIG); /* 3 does not divide 4 */
    c = cfg(4);
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_INT_EQ(kiln_gpt_config_blocks(&c), 1);
    c = cfg(0);
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_INT_EQ(kiln_gpt_config_blocks(&c), 4);
}

int main(void) {
    RUN_TEST(test_layout_and_equivalence);
    RUN_TEST(test_config);
    TEST_MAIN_END();
}
