/* The GPT model: configurations, parameter layout, forward/backward consistency. */
#include <math.h>
#include <stdint.h>

#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/sample.h"
#include "test.h"

static kiln_gpt_config tiny_config(void) {
    kiln_gpt_config c = {.max_seq_len = 8, .vocab_size = 37, .n_layer = 2, .n_head = 2,
                         .n_embd = 12};
    kiln_gpt_config_validate(&c);
    return c;
}

static void fill_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)kiln_rng_below(&r, (uint64_t)V);
}

static void test_presets_and_validation(void) {
    kiln_gpt_config c;
    CHECK_OK(kiln_gpt_config_preset(&c, "gpt2-124m"));
    CHECK_INT_EQ(c.n_layer, 12);
    CHECK_INT_EQ(c.padded_vocab_size, 50304);
    CHECK_INT_EQ(kiln_gpt_config_num_params(&c), 124439808);
    CHECK_OK(kiln_gpt_config_preset(&c, "d4"));
    CHECK_INT_EQ(c.n_embd, 128);
    CHECK_STATUS(kiln_gpt_config_preset(&c, "gpt5"), KILN_ERR_NOT_FOUND);
    c.n_head = 5; /* does not divide 128 */
    CHECK_STATUS(kiln_gpt_config_validate(&c), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "n_head") != NULL);
    kiln_gpt_config t = tiny_config();
    kiln_gpt *m = NULL;
    CHECK_STATUS(kiln_gpt_create(&m, &t, 2, 9, kiln_backend_ref()), KILN_ERR_CONFIG);
    CHECK_TRUE(m == NULL);
}

/* Model FLOPs per token of one training step, written out product by product (README.md,
 * "MFU counts model FLOPs"): a matrix product of an (N, K) input with a (K, M) weight costs
 * 2 N K M forward and twice that backward (the input's and the weight's gradients): 6 K M per
 * row. Per layer: c_attn (C, 3C), attn.c_proj (C, C), mlp.c_fc (C, 4C), mlp.c_proj (4C, C);
 * the head (C, V), V unpadded. Attention per layer and token: QK^T and AV are each T x hs
 * multiply-adds per head, C over all heads: 2 x 2 T C forward, x3 with backward. The wte and
 * wpe lookups, biases, LayerNorm, GELU and softmax are not counted. */
static int64_t flops_by_hand(const kiln_gpt_config *c, int64_t T) {
    int64_t C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    int64_t per_layer = C * 3 * C + C * C + C * 4 * C + 4 * C * C;
    int64_t weights = L * per_layer + C * V;
    return 6 * weights + L * 3 * (2 * T * C + 2 * T * C);
}

/* The numel of the tensors the products above use, from a model's own layout: every
 * 2-D ".weight" of a block but the LayerNorms', and wte once (the head). */
static int64_t product_weights(const kiln_gpt *m) {
    int64_t n = 0;
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        if (t->ndim == 2 && (strstr(t->name, ".attn.") || strstr(t->name, ".mlp.") ||
                             !strcmp(t->name, "wte.weight")))
            n += t->numel;
    }
    return n;
}

/* kiln_gpt_flops_per_token is exactly the count above (integers, exact in a double). The
 * configs make the easy mistakes differ: dropping attention (12 L T C), adding wpe
 * (6 maxT C), counting the padded vocabulary (6 (Vp - V) C) or a T of 1. */
static void test_flops(void) {
    kiln_gpt_config cfgs[4];
    CHECK_OK(kiln_gpt_config_preset(&cfgs[0], "gpt2-124m"));
    cfgs[1] = tiny_config(); /* V 37, padded 128; maxT 8 */
    cfgs[2] = (kiln_gpt_config){
        .max_seq_len = 40, .vocab_size = 1001, .n_layer = 3, .n_head = 4, .n_embd = 48};
    CHECK_OK(kiln_gpt_config_validate(&cfgs[2]));
    CHECK_OK(kiln_gpt_config_preset(&cfgs[3], "d4"));
    const int64_t Ts[4] = {64, 8, 23, 1};
    for (int i = 0; i < 4; i++) {
        int64_t want = flops_by_hand(&cfgs[i], Ts[i]);
        double got = kiln_gpt_flops_per_token(&cfgs[i], Ts[i]);
        CHECK_INT_EQ((int64_t)got, want);
        CHECK_TRUE(got == (double)want); /* no fraction either */
        /* the counted weights are those of the model's layout */
        if (i == 0)
            continue;
        kiln_gpt *m = NULL;
        CHECK_OK(kiln_gpt_create(&m, &cfgs[i], 1, Ts[i], kiln_backend_ref()));
        if (m) {
            int64_t C = cfgs[i].n_embd, L = cfgs[i].n_layer;
            CHECK_INT_EQ(product_weights(m),
                         L * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + cfgs[i].vocab_size * C);
        }
        kiln_gpt_free(m);
    }
    /* GPT-2 124M at T = 64 by hand: 6 (12 x 12 x 768^2 + 50257 x 768) + 12 x 12 x 64 x 768. */
    CHECK_INT_EQ((int64_t)kiln_gpt_flops_per_token(&cfgs[0], 64), 748270080);
}

static void test_layout(void) {
    kiln_gpt_config c = tiny_config();
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 8, kiln_backend_ref()));
    if (!m)
        return;
    CHECK_INT_EQ(kiln_gpt_num_tensors(m), 4 + 12 * 2);
    int64_t total = 0, expect_offset = 0;
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        CHECK_INT_EQ(t->offset, expect_offset);
        expect_offset = t->offset + t->numel;
        if (i == 0)
            expect_offset += (c.padded_vocab_size - c.vocab_size) * c.n_embd;
        total += t->numel;
    }
    CHECK_INT_EQ(total, kiln_gpt_config_num_params(&c));
    CHECK_INT_EQ(kiln_gpt_slab_len(m), expect_offset);
    int i = kiln_gpt_find_tensor(m, "h.1.mlp.c_fc.weight");
    CHECK_TRUE(i > 0);
    const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
    CHECK_INT_EQ(t->shape[0], 12);
    CHECK_INT_EQ(t->shape[1], 48);
    CHECK_INT_EQ(t->decay, 1);
    CHECK_INT_EQ(t->layer, 1);
    CHECK_INT_EQ(kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, "h.0.ln_1.bias"))->decay, 0);
    CHECK_INT_EQ(kiln_gpt_find_tensor(m, "nope"), -1);
    kiln_gpt_free(m);
    kiln_gpt_free(NULL);
}

/* Loss at initialisation is close to log(V); bad ids fail cleanly. */
static void test_forward_checks(void) {
    kiln_gpt_config c = tiny_config();
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 8, kiln_backend_ref()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 1);
    int32_t in[16], tg[16];
    fill_ids(in, 16, c.vocab_size, 3);
    fill_ids(tg, 16, c.vocab_size, 4);
    float loss = 0;
    CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 8, &loss));
    CHECK_NEAR(loss, log(37.0), 0.05);
    in[5] = 37;
    CHECK_STATUS(kiln_gpt_forward(m, in, tg, 2, 8, &loss), KILN_ERR_RANGE);
    CHECK_TRUE(strstr(kiln_error_message(), "position 5") != NULL);
    CHECK_STATUS(kiln_gpt_backward(m, 1.0f), KILN_ERR_ARG);
    in[5] = 0;
    CHECK_STATUS(kiln_gpt_forward(m, in, tg, 3, 8, &loss), KILN_ERR_ARG);
    /* padded rows of the embedding stay zero through training steps */
    CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 8, &loss));
    kiln_gpt_zero_grad(m);
    CHECK_OK(kiln_gpt_backward(m, 1.0f));
    const float *g = kiln_gpt_grads(m);
    double pad = 0;
    for (int64_t k = c.vocab_size * c.n_embd; k < c.padded_vocab_size * c.n_embd; k++)
        pad += fabs(g[k]);
    CHECK_TRUE(pad == 0.0);
    kiln_gpt_free(m);
}

/* Central differences of the mean loss against backward, on the reference backend. */
static void test_finite_differences(void) {
    kiln_gpt_config c = tiny_config();
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 5, kiln_backend_ref()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 7);
    float *p = kiln_gpt_params(m);
    /* larger weights than GPT-2's init so every path carries signal */
    for (int64_t k = 0; k < kiln_gpt_slab_len(m); k++)
        p[k] *= 3.0f;
    int32_t in[10], tg[10];
    fill_ids(in, 10, c.vocab_size, 5);
    fill_ids(tg, 10, c.vocab_size, 6);
    float loss;
    kiln_gpt_zero_grad(m);
    CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 5, &loss));
    CHECK_OK(kiln_gpt_backward(m, 1.0f));
    const float *g = kiln_gpt_grads(m);
    /* Directional derivatives: per tensor, a random +-1 direction scaled by h. Summing over
     * the whole tensor gives far more signal than single coordinates in float. */
    kiln_rng r;
    kiln_rng_seed(&r, 9);
    int checked = 0, bad = 0;
    float *saved = malloc((size_t)kiln_gpt_slab_len(m) * sizeof(float));
    float *dir = malloc((size_t)kiln_gpt_slab_len(m) * sizeof(float));
    memcpy(saved, p, (size_t)kiln_gpt_slab_len(m) * sizeof(float));
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        double analytic = 0.0, h = 1e-3;
        for (int64_t k = 0; k < t->numel; k++) {
            dir[k] = (kiln_rng_u64(&r) & 1) ? 1.0f : -1.0f;
            analytic += (double)g[t->offset + k] * dir[k];
        }
        float lp, lm;
        for (int64_t k = 0; k < t->numel; k++)
            p[t->offset + k] = saved[t->offset + k] + (float)h * dir[k];
        kiln_gpt_forward(m, in, tg, 2, 5, &lp);
        for (int64_t k = 0; k < t->numel; k++)
            p[t->offset + k] = saved[t->offset + k] - (float)h * dir[k];
        kiln_gpt_forward(m, in, tg, 2, 5, &lm);
        memcpy(p + t->offset, saved + t->offset, (size_t)t->numel * sizeof(float));
        double fd = ((double)lp - (double)lm) / (2.0 * h);
        checked++;
        if (fabs(fd - analytic) > 0.02 * fmax(fabs(fd), fabs(analytic)) + 1e-3) {
            bad++;
            fprintf(stderr, "  %s: backward %.6g, differences %.6g\n", t->name, analytic, fd);
        }
    }
    free(saved);
    free(dir);
    CHECK_INT_EQ(checked, kiln_gpt_num_tensors(m));
    CHECK_INT_EQ(bad, 0);
    kiln_gpt_free(m);
}

/* Two half-scaled backwards equal one full one: gradient accumulation. The CPU backend
 * gives the same bits run to run. */
static void test_accumulation_and_determinism(void) {
    kiln_gpt_config c = tiny_config();
    kiln_gpt *a = NULL, *b = NULL;
    CHECK_OK(kiln_gpt_create(&a, &c, 2, 8, kiln_backend_cpu()));
    CHECK_OK(kiln_gpt_create(&b, &c, 2, 8, kiln_backend_cpu()));
    if (!a || !b)
        return;
    kiln_gpt_init_weights(a, 11);
    kiln_gpt_init_weights(b, 11);
    int32_t in[16], tg[16];
    fill_ids(in, 16, c.vocab_size, 12);
    fill_ids(tg, 16, c.vocab_size, 13);
    float la, lb;
    kiln_gpt_zero_grad(a);
    kiln_gpt_zero_grad(b);
    CHECK_OK(kiln_gpt_forward(a, in, tg, 2, 8, &la));
    CHECK_OK(kiln_gpt_backward(a, 1.0f));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(kiln_gpt_forward(b, in, tg, 2, 8, &lb));
        CHECK_OK(kiln_gpt_backward(b, 0.5f));
    }
    CHECK_TRUE(la == lb);
    int64_t n = kiln_gpt_slab_len(a);
    CHECK_TRUE(test_rel_err(kiln_gpt_grads(b), kiln_gpt_grads(a), n) < 1e-6);
    /* same bits from a fresh run */
    kiln_gpt_zero_grad(b);
    CHECK_OK(kiln_gpt_forward(b, in, tg, 2, 8, &lb));
    CHECK_OK(kiln_gpt_backward(b, 1.0f));
    CHECK_TRUE(memcmp(kiln_gpt_grads(a), kiln_gpt_grads(b), (size_t)n * sizeof(float)) == 0);
    kiln_gpt_free(a);
    kiln_gpt_free(b);
}

/* Logits of the last positions only equal the last rows of a full forward. */
static void test_forward_last(void) {
    kiln_gpt_config c = tiny_config();
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 8, kiln_backend_cpu()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 21);
    int32_t in[14];
    fill_ids(in, 14, c.vocab_size, 22);
    int64_t Vp = c.padded_vocab_size, V = c.vocab_size;
    CHECK_OK(kiln_gpt_forward(m, in, NULL, 2, 7, NULL));
    float full[2][128];
    for (int b = 0; b < 2; b++)
        memcpy(full[b], kiln_gpt_logits(m) + (b * 7 + 6) * Vp, (size_t)V * sizeof(float));
    CHECK_OK(kiln_gpt_forward_last(m, in, 2, 7));
    for (int b = 0; b < 2; b++)
        CHECK_TRUE(test_rel_err(kiln_gpt_logits(m) + b * Vp, full[b], V) < 1e-6);
    in[3] = (int32_t)V;
    CHECK_STATUS(kiln_gpt_forward_last(m, in, 2, 7), KILN_ERR_RANGE);
    kiln_gpt_free(m);
}

/* An inference model (no gradients, shared block buffers) computes the same logits, bit
 * for bit, as a training model with the same weights, with less memory, and refuses
 * backward. */
static void test_inference_model(void) {
    kiln_gpt_config c = tiny_config();
    kiln_gpt *t = NULL, *inf = NULL;
    CHECK_OK(kiln_gpt_create(&t, &c, 2, 8, kiln_backend_cpu()));
    CHECK_OK(kiln_gpt_create_inference(&inf, &c, 2, 8, kiln_backend_cpu()));
    if (!t || !inf)
        return;
    kiln_gpt_init_weights(t, 31);
    memcpy(kiln_gpt_params(inf), kiln_gpt_params(t), (size_t)kiln_gpt_slab_len(t) * sizeof(float));
    int32_t in[16], tg[16];
    fill_ids(in, 16, c.vocab_size, 32);
    fill_ids(tg, 16, c.vocab_size, 33);
    float lt, li;
    CHECK_OK(kiln_gpt_forward(t, in, tg, 2, 8, &lt));
    CHECK_OK(kiln_gpt_forward(inf, in, tg, 2, 8, &li));
    CHECK_TRUE(lt == li);
    CHECK_TRUE(memcmp(kiln_gpt_logits(t), kiln_gpt_logits(inf),
                      (size_t)(16 * c.padded_vocab_size) * sizeof(float)) == 0);
    CHECK_TRUE(kiln_gpt_grads(inf) == NULL);
    CHECK_STATUS(kiln_gpt_backward(inf, 1.0f), KILN_ERR_UNSUPPORTED);
    kiln_gpt_memory mt = kiln_gpt_memory_plan(t), mi = kiln_gpt_memory_plan(inf);
    CHECK_INT_EQ(mi.grads, 0);
    CHECK_TRUE(mi.activations < mt.activations / 2);
    kiln_gpt_free(t);
    kiln_gpt_free(inf);
}

/* Temperature: near 0 the draw is the most likely id (no overflow), top-k keeps only the
 * k largest, and the same seed draws the same ids. */
static void test_sampling(void) {
    float logits[6] = {1.0f, 3.0f, 2.5f, -1.0f, 3.0001f, 0.0f};
    float scratch[12];
    kiln_rng r;
    kiln_rng_seed(&r, 1);
    CHECK_INT_EQ(kiln_sample_logits(logits, 6, 0.0f, 0, &r, scratch), 4);
    CHECK_INT_EQ(kiln_sample_logits(logits, 6, 1e-40f, 0, &r, scratch), 4);
    CHECK_INT_EQ(kiln_sample_logits(logits, 6, 1e-40f, 3, &r, scratch), 4);
    int counts[6] = {0};
    for (int i = 0; i < 3000; i++)
        counts[kiln_sample_logits(logits, 6, 1.0f, 2, &r, scratch)]++;
    CHECK_INT_EQ(counts[0] + counts[2] + counts[3] + counts[5], 0);
    CHECK_NEAR(counts[1], 1500, 0.1);
    kiln_rng a, b;
    kiln_rng_seed(&a, 9);
    kiln_rng_seed(&b, 9);
    for (int i = 0; i < 50; i++)
        CHECK_INT_EQ(kiln_sample_logits(logits, 6, 1.0f, 0, &a, scratch),
                     kiln_sample_logits(logits, 6, 1.0f, 0, &b, scratch));
}

static void test_out_of_memory(void) {
    kiln_gpt_config c;
    kiln_gpt_config_preset(&c, "gpt2-124m");
    kiln_gpt *m = NULL;
    kiln_alloc_set_limit(kiln_alloc_current() + (64u << 20));
    CHECK_STATUS(kiln_gpt_create(&m, &c, 4, 64, kiln_backend_ref()), KILN_ERR_NOMEM);
    CHECK_TRUE(strstr(kiln_error_message(), "MiB") != NULL);
    CHECK_TRUE(m == NULL);
    kiln_alloc_set_limit(0);
}

int main(void) {
    RUN_TEST(test_presets_and_validation);
    RUN_TEST(test_flops);
    RUN_TEST(test_layout);
    RUN_TEST(test_forward_checks);
    RUN_TEST(test_finite_differences);
    RUN_TEST(test_accumulation_and_determinism);
    RUN_TEST(test_forward_last);
    RUN_TEST(test_inference_model);
    RUN_TEST(test_sampling);
    RUN_TEST(test_out_of_memory);
    TEST_MAIN_END();
}
