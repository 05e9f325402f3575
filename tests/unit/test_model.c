/* The GPT model: configurations, parameter layout, forward/backward consistency. */
#include <math.h>
#include <stdint.h>

#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/optim.h"
#include "kiln/sample.h"
#include "test.h"

static kiln_gpt_config tiny_config(void) {
    kiln_gpt_config c = {
        .max_seq_len = 8, .vocab_size = 37, .n_layer = 2, .n_head = 2, .n_embd = 12};
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
    CHECK_STATUS(kiln_gpt_create(&m, &t, 2, 9, NULL, kiln_backend_ref()), KILN_ERR_CONFIG);
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
        CHECK_OK(kiln_gpt_create(&m, &cfgs[i], 1, Ts[i], NULL, kiln_backend_ref()));
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
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 8, NULL, kiln_backend_ref()));
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
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 8, NULL, kiln_backend_ref()));
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
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 5, NULL, kiln_backend_ref()));
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
    CHECK_OK(kiln_gpt_create(&a, &c, 2, 8, NULL, kiln_backend_cpu()));
    CHECK_OK(kiln_gpt_create(&b, &c, 2, 8, NULL, kiln_backend_cpu()));
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
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 8, NULL, kiln_backend_cpu()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 21);
    int32_t in[14];
    fill_ids(in, 14, c.vocab_size, 22);
    int64_t Vp = c.padded_vocab_size, V = c.vocab_size;
    CHECK_OK(kiln_gpt_forward(m, in, NULL, 2, 7, NULL));
    float full[2][128];
    for (int b = 0; b < 2; b++)
        memcpy(full[b], (const float *)kiln_gpt_logits(m) + (b * 7 + 6) * Vp,
               (size_t)V * sizeof(float));
    CHECK_OK(kiln_gpt_forward_last(m, in, 2, 7));
    for (int b = 0; b < 2; b++)
        CHECK_TRUE(test_rel_err((const float *)kiln_gpt_logits(m) + b * Vp, full[b], V) < 1e-6);
    in[3] = (int32_t)V;
    CHECK_STATUS(kiln_gpt_forward_last(m, in, 2, 7), KILN_ERR_RANGE);
    kiln_gpt_free(m);
}

/* An inference model (no gradients, shared block buffers) computes the same losses and
 * logits, bit for bit, as a training model with the same weights, in every dtype, with less
 * memory, and refuses backward. */
static void test_inference_model(void) {
    kiln_gpt_config c = tiny_config();
    int64_t Vp = c.padded_vocab_size;
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        kiln_dtype dt = (kiln_dtype)d;
        kiln_gpt_options o = kiln_gpt_options_default();
        o.dtype = dt;
        kiln_gpt *t = NULL, *inf = NULL;
        CHECK_OK(kiln_gpt_create(&t, &c, 2, 8, &o, kiln_backend_cpu()));
        CHECK_OK(kiln_gpt_create_inference(&inf, &c, 2, 8, dt, kiln_backend_cpu()));
        if (!t || !inf) {
            kiln_gpt_free(t), kiln_gpt_free(inf);
            continue;
        }
        CHECK_INT_EQ(kiln_gpt_dtype(inf), dt);
        CHECK_TRUE(kiln_gpt_get_options(inf)->inference == 1);
        kiln_gpt_init_weights(t, 31);
        size_t bytes = (size_t)kiln_gpt_slab_len(t) * kiln_dtype_size(dt);
        memcpy(kiln_gpt_params(inf), kiln_gpt_params(t), bytes);
        int32_t in[16], tg[16];
        fill_ids(in, 16, c.vocab_size, 32);
        fill_ids(tg, 16, c.vocab_size, 33);
        size_t lbytes = (size_t)(16 * Vp) * kiln_dtype_size(dt);
        float lt, li;
        CHECK_OK(kiln_gpt_forward(t, in, tg, 2, 8, &lt));
        CHECK_OK(kiln_gpt_forward(inf, in, tg, 2, 8, &li));
        CHECK_TRUE(lt == li);
        CHECK_TRUE(memcmp(kiln_gpt_losses(t), kiln_gpt_losses(inf), 16 * sizeof(float)) == 0);
        CHECK_TRUE(memcmp(kiln_gpt_logits(t), kiln_gpt_logits(inf), lbytes) == 0);
        /* without targets, and the last positions only */
        CHECK_OK(kiln_gpt_forward(inf, in, NULL, 2, 8, NULL));
        CHECK_TRUE(memcmp(kiln_gpt_logits(t), kiln_gpt_logits(inf), lbytes) == 0);
        CHECK_OK(kiln_gpt_forward_last(t, in, 2, 8));
        CHECK_OK(kiln_gpt_forward_last(inf, in, 2, 8));
        CHECK_TRUE(memcmp(kiln_gpt_logits(t), kiln_gpt_logits(inf),
                          (size_t)(2 * Vp) * kiln_dtype_size(dt)) == 0);
        /* logits_f32: the logits widened */
        float wide[2 * 128], want[2 * 128];
        CHECK_OK(kiln_gpt_logits_f32(inf, 2, wide));
        kiln_convert(want, KILN_DTYPE_F32, kiln_gpt_logits(inf), dt, 2 * Vp);
        CHECK_TRUE(memcmp(wide, want, sizeof wide) == 0);
        /* a training model's loss after a training step is the inference model's too */
        float ls;
        kiln_gpt_zero_grad(t);
        CHECK_OK(kiln_gpt_forward_backward(t, in, tg, 2, 8, 1.0f, &ls));
        CHECK_TRUE(ls == li);
        CHECK_TRUE(kiln_gpt_grads(inf) == NULL);
        CHECK_STATUS(kiln_gpt_backward(inf, 1.0f), KILN_ERR_UNSUPPORTED);
        CHECK_STATUS(kiln_gpt_forward_backward(inf, in, tg, 2, 8, 1.0f, &ls), KILN_ERR_UNSUPPORTED);
        kiln_gpt_memory mt = kiln_gpt_memory_plan(t), mi = kiln_gpt_memory_plan(inf);
        CHECK_INT_EQ(mi.grads, 0);
        CHECK_INT_EQ(mi.params, mt.params);
        CHECK_TRUE(mi.activations < mt.activations);
        /* forward alone holds a block's activations only while it runs: twice the layers,
         * the same activation memory (training's grows with every layer it keeps) */
        kiln_gpt_config c2 = c;
        c2.n_layer = 2 * c.n_layer;
        kiln_gpt_options oi = o;
        oi.inference = 1;
        kiln_gpt_memory mi2, mt2;
        CHECK_OK(kiln_gpt_memory_plan_for(&c2, 2, 8, &oi, kiln_backend_cpu(), &mi2));
        CHECK_OK(kiln_gpt_memory_plan_for(&c2, 2, 8, &o, kiln_backend_cpu(), &mt2));
        CHECK_INT_EQ(mi2.activations, mi.activations);
        CHECK_TRUE(mt2.activations > mt.activations);
        kiln_gpt_free(t);
        kiln_gpt_free(inf);
    }
}

/* ---- options: recomputation, fusions, the chunked head, dtypes ---- */

static int verbose(void) {
    return getenv("KILN_TEST_VERBOSE") != NULL;
}

/* A tiny model with three blocks (a middle block's fused tail writes the next block's
 * LayerNorm) on the CPU backend, weights from seed 41. */
static kiln_gpt_config three_blocks(void) {
    kiln_gpt_config c = tiny_config();
    c.n_layer = 3;
    kiln_gpt_config_validate(&c);
    return c;
}

static kiln_gpt *build_with(const kiln_gpt_config *c, const kiln_gpt_options *o, kiln_backend *be) {
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, c, 2, 8, o, be));
    if (m)
        kiln_gpt_init_weights(m, 41);
    return m;
}

/* One training step's loss and gradients (zeroed first) on a fixed batch. */
static kiln_status step_of(kiln_gpt *m, float grad_scale, float *loss) {
    const kiln_gpt_config *c = kiln_gpt_get_config(m);
    int32_t in[16], tg[16];
    fill_ids(in, 16, c->vocab_size, 42);
    fill_ids(tg, 16, c->vocab_size, 43);
    kiln_gpt_zero_grad(m);
    return kiln_gpt_forward_backward(m, in, tg, 2, 8, grad_scale, loss);
}

/* The tensors whose gradients differ in their bits, named on stderr; their number. */
static int grads_differ(kiln_gpt *a, kiln_gpt *b, const char *what) {
    int n = 0;
    for (int i = 0; i < kiln_gpt_num_tensors(a); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(a, i);
        if (memcmp(kiln_gpt_grads(a) + t->offset, kiln_gpt_grads(b) + t->offset,
                   (size_t)t->numel * sizeof(float)) != 0) {
            if (n++ < 3 || verbose())
                fprintf(stderr, "  %s: gradient of %s differs (relative error %.3g)\n", what,
                        t->name,
                        test_rel_err(kiln_gpt_grads(b) + t->offset, kiln_gpt_grads(a) + t->offset,
                                     t->numel));
        }
    }
    return n;
}

/* Recomputation and the fusions compute the same values in the same order as the default
 * model: the same loss and gradients bit for bit. Every combination of recompute level and
 * fusions in fp32 on the CPU and on the reference; in bf16 and fp16 (on the CPU) a
 * combination per recompute level, each fusion on and off among them. */
static void test_recompute_and_fusions_exact(void) {
    kiln_gpt_config c = three_blocks();
    /* recompute level, fuse_gelu, fuse_residual_ln */
    static const int some[4][3] = {{0, 0, 1}, {1, 1, 0}, {2, 0, 0}, {3, 1, 1}};
    for (int run = 0; run < 4; run++) {
        kiln_backend *be = run == 3 ? kiln_backend_ref() : kiln_backend_cpu();
        kiln_gpt_options base = kiln_gpt_options_default();
        base.dtype = run == 3 ? KILN_DTYPE_F32 : (kiln_dtype)run;
        int all = base.dtype == KILN_DTYPE_F32;
        kiln_gpt *m0 = build_with(&c, &base, be);
        float l0 = 0;
        CHECK_OK(m0 ? step_of(m0, 1.0f, &l0) : KILN_ERR_ARG);
        for (int k = 0; m0 && k < (all ? 16 : 4); k++) {
            kiln_gpt_options o = base;
            o.recompute = (kiln_recompute)(all ? k / 4 : some[k][0]);
            o.fuse_gelu = all ? k & 1 : some[k][1];
            o.fuse_residual_ln = all ? (k >> 1) & 1 : some[k][2];
            char what[128];
            snprintf(what, sizeof what, "%s %s recompute %s fuse_gelu %d fuse_residual_ln %d",
                     be->name, kiln_dtype_name(base.dtype), kiln_recompute_name(o.recompute),
                     o.fuse_gelu, o.fuse_residual_ln);
            kiln_gpt *m = build_with(&c, &o, be);
            float l = 0;
            CHECK_OK(m ? step_of(m, 1.0f, &l) : KILN_ERR_ARG);
            if (m) {
                CHECK_TRUE(kiln_gpt_get_options(m)->recompute == o.recompute);
                if (memcmp(&l, &l0, sizeof l) != 0)
                    fprintf(stderr, "  %s: loss %.9g, default %.9g\n", what, l, l0);
                CHECK_TRUE(memcmp(&l, &l0, sizeof l) == 0);
                CHECK_INT_EQ(grads_differ(m, m0, what), 0);
            }
            kiln_gpt_free(m);
        }
        kiln_gpt_free(m0);
    }
}

/* A chunked head (classifier_chunk rows of logits at a time) gives the same gradients and
 * losses as the whole head up to fp32 reassociation, not bit for bit:
 *  - dwte adds each chunk's product separately (sgemm with beta = 1) where the whole head
 *    sums all B*T rows in one product;
 *  - sgemm's result for one row of logits (and of dlnf) depends in its last bits on how many
 *    rows the call has (OpenBLAS picks its kernels by shape), so in fp32 the per-position
 *    losses and every gradient upstream of the head move by a few fp32 ulps.
 * A product of K terms in fp32 is within about K u32 (u32 = 2^-24) of the exact one relative
 * to the sum of the terms' magnitudes; the head's products have K = C = 12 (logits) and
 * K = B*T = 16 (dwte), so the relative error by norm is below 16 u32 = 1e-6 unless the terms
 * cancel; the gradients are compared at 1e-5, a factor 10 for that and for the small
 * differences passing through the blocks' backward. The losses (about log V = 3.6, logits of
 * order 0.1) are compared at 1e-6 relative. In bf16 and fp16 the logits are rounded to the
 * dtype from those fp32 products, which absorbs the last-bit differences (only dwte differed
 * when this was written); a rounding could still flip by one ulp of the dtype, moving a
 * loss by at most one ulp of its logits: 2 u_dt relative covers that. A training forward
 * keeps no logits when chunked. */
static void test_classifier_chunk(void) {
    kiln_gpt_config c = three_blocks();
    const int64_t chunks[] = {2, 5, 8, 15};
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        kiln_gpt_options o = kiln_gpt_options_default();
        o.dtype = (kiln_dtype)d;
        double loss_tol = d == KILN_DTYPE_F32 ? 1e-6 : 2 * kiln_dtype_epsilon(o.dtype);
        kiln_gpt *m0 = build_with(&c, &o, kiln_backend_cpu());
        float l0 = 0, losses0[16];
        CHECK_OK(m0 ? step_of(m0, 1.0f, &l0) : KILN_ERR_ARG);
        if (m0)
            memcpy(losses0, kiln_gpt_losses(m0), sizeof losses0);
        for (int k = 0; m0 && k < 4; k++) {
            o.classifier_chunk = chunks[k];
            kiln_gpt *m = build_with(&c, &o, kiln_backend_cpu());
            float l = 0;
            CHECK_OK(m ? step_of(m, 1.0f, &l) : KILN_ERR_ARG);
            if (!m)
                continue;
            for (int i = 0; i < 16; i++)
                CHECK_NEAR(kiln_gpt_losses(m)[i], losses0[i], loss_tol);
            CHECK_NEAR(l, l0, loss_tol);
            double worst = 0;
            const char *worst_name = "";
            for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
                const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
                double e = test_rel_err(kiln_gpt_grads(m) + t->offset,
                                        kiln_gpt_grads(m0) + t->offset, t->numel);
                if (e > worst)
                    worst = e, worst_name = t->name;
            }
            if (verbose() || !(worst <= 1e-5))
                fprintf(stderr, "  %s chunk %lld: worst gradient %s, relative error %.3g%s\n",
                        kiln_dtype_name(o.dtype), (long long)chunks[k], worst_name, worst,
                        memcmp(kiln_gpt_losses(m), losses0, sizeof losses0) ? " (losses differ)"
                                                                            : "");
            CHECK_TRUE(worst <= 1e-5);
            /* forward with targets: the same losses, and no logits kept */
            int32_t in[16], tg[16];
            fill_ids(in, 16, c.vocab_size, 42);
            fill_ids(tg, 16, c.vocab_size, 43);
            float lf = 0;
            CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 8, &lf));
            CHECK_TRUE(lf == l);
            CHECK_TRUE(kiln_gpt_logits(m) == NULL);
            float row0[128];
            CHECK_STATUS(kiln_gpt_logits_f32(m, 1, row0), KILN_ERR_ARG);
            /* backward after a chunked forward: the chunks again, the same gradients */
            kiln_gpt_zero_grad(m);
            CHECK_OK(kiln_gpt_backward(m, 1.0f));
            float *g1 = malloc((size_t)kiln_gpt_slab_len(m) * sizeof(float));
            if (g1) {
                memcpy(g1, kiln_gpt_grads(m), (size_t)kiln_gpt_slab_len(m) * sizeof(float));
                CHECK_OK(step_of(m, 1.0f, &l));
                CHECK_TRUE(memcmp(g1, kiln_gpt_grads(m),
                                  (size_t)kiln_gpt_slab_len(m) * sizeof(float)) == 0);
            }
            free(g1);
            /* forward without targets needs every row at once */
            CHECK_STATUS(kiln_gpt_forward(m, in, NULL, 2, 8, NULL), KILN_ERR_ARG);
            kiln_gpt_free(m);
        }
        kiln_gpt_free(m0);
    }
}

/* The planned activations shrink with each recompute level (each drops what the one before
 * it drops and more) and never grow with the fusions; a chunked head plans its logits chunk
 * instead of all B*T rows, counted as workspace. The model built takes what was planned. */
static void test_memory_plan(void) {
    kiln_gpt_config c = {
        .max_seq_len = 64, .vocab_size = 1000, .n_layer = 4, .n_head = 4, .n_embd = 64};
    CHECK_OK(kiln_gpt_config_validate(&c));
    const int64_t B = 4, T = 64;
    kiln_gpt_memory mem[4];
    for (int rc = 0; rc < 4; rc++) {
        kiln_gpt_options o = kiln_gpt_options_default();
        o.recompute = (kiln_recompute)rc;
        CHECK_OK(kiln_gpt_memory_plan_for(&c, B, T, &o, NULL, &mem[rc]));
        CHECK_INT_EQ(mem[rc].total,
                     mem[rc].params + mem[rc].grads + mem[rc].activations + mem[rc].workspace);
        if (verbose())
            fprintf(stderr, "  recompute %-9s activations %zu workspace %zu total %zu\n",
                    kiln_recompute_name(o.recompute), mem[rc].activations, mem[rc].workspace,
                    mem[rc].total);
        if (rc > 0) {
            CHECK_TRUE(mem[rc].activations < mem[rc - 1].activations);
            CHECK_TRUE(mem[rc].total < mem[rc - 1].total);
            CHECK_INT_EQ(mem[rc].params, mem[0].params);
            CHECK_INT_EQ(mem[rc].grads, mem[0].grads);
        }
        /* the fusions add no saved activation */
        kiln_gpt_options u = o;
        u.fuse_gelu = u.fuse_residual_ln = 0;
        kiln_gpt_memory mu;
        CHECK_OK(kiln_gpt_memory_plan_for(&c, B, T, &u, NULL, &mu));
        CHECK_TRUE(mem[rc].activations <= mu.activations);
    }
    /* block recomputation keeps each block's input and little else */
    CHECK_TRUE(mem[KILN_RECOMPUTE_BLOCK].activations < mem[KILN_RECOMPUTE_NONE].activations / 3);
    /* The chunked head plans its chunk of logits instead of all B*T rows: with a vocabulary
     * whose logits dominate the arena, the plan shrinks by (B*T - chunk) x Vp floats. (The
     * split between activations and workspace is not checked: workspace is the sum of the
     * scratch buffers, not the bytes they take once they share them, and activations the
     * arena less that sum, so a smaller logits buffer moves bytes into "activations".) */
    kiln_gpt_config big_v = c;
    big_v.vocab_size = 16000;
    CHECK_OK(kiln_gpt_config_validate(&big_v));
    kiln_gpt_options o = kiln_gpt_options_default();
    kiln_gpt_memory whole, chunked;
    CHECK_OK(kiln_gpt_memory_plan_for(&big_v, B, T, &o, NULL, &whole));
    o.classifier_chunk = 32;
    CHECK_OK(kiln_gpt_memory_plan_for(&big_v, B, T, &o, NULL, &chunked));
    if (verbose())
        fprintf(stderr, "  chunk 0: total %zu; chunk 32: total %zu\n", whole.total, chunked.total);
    CHECK_INT_EQ(whole.total - chunked.total,
                 (B * T - 32) * big_v.padded_vocab_size * (int64_t)sizeof(float));
    o = kiln_gpt_options_default();
    CHECK_OK(kiln_gpt_memory_plan_for(&c, B, T, &o, NULL, &whole));
    /* bf16: half the parameter bytes, the same fp32 gradients, fewer activation bytes */
    kiln_gpt_options h = kiln_gpt_options_default();
    h.dtype = KILN_DTYPE_BF16;
    kiln_gpt_memory half;
    CHECK_OK(kiln_gpt_memory_plan_for(&c, B, T, &h, NULL, &half));
    CHECK_INT_EQ(half.params * 2, whole.params);
    CHECK_INT_EQ(half.grads, whole.grads);
    CHECK_TRUE(half.activations < whole.activations);
    /* what a model built takes is its plan */
    o.recompute = KILN_RECOMPUTE_ATTENTION;
    kiln_gpt_memory planned;
    CHECK_OK(kiln_gpt_memory_plan_for(&c, B, T, &o, NULL, &planned));
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, B, T, &o, NULL));
    if (m) {
        kiln_gpt_memory got = kiln_gpt_memory_plan(m);
        CHECK_INT_EQ(got.params, planned.params);
        CHECK_INT_EQ(got.activations, planned.activations);
        CHECK_INT_EQ(got.workspace, planned.workspace);
        CHECK_INT_EQ(got.total, planned.total);
    }
    kiln_gpt_free(m);
    /* options that cannot work */
    o = kiln_gpt_options_default();
    o.recompute = (kiln_recompute)7;
    CHECK_STATUS(kiln_gpt_memory_plan_for(&c, B, T, &o, NULL, &planned), KILN_ERR_ARG);
    o = kiln_gpt_options_default();
    o.classifier_chunk = -1;
    CHECK_STATUS(kiln_gpt_create(&m, &c, B, T, &o, NULL), KILN_ERR_ARG);
    CHECK_TRUE(m == NULL);
}

/* bf16 and fp16 models track the fp32 model over four AdamW steps (lr 1e-3) from the same
 * initial values: fp32 master weights for the narrow ones, their working weights rounded
 * from them. Tolerances, from the unit roundoff u of the dtype (2^-8 bf16, 2^-11 fp16):
 *  - the loss within u relative: the narrow model rounds each activation once (relative u)
 *    a few dozen stages deep, which moves the logits by a small multiple of u times their
 *    size; log-softmax moves by at most twice the largest change of a logit, and at GPT-2's
 *    initialisation the logits are of order 0.1 against a loss of log V = 3.6 (measured:
 *    below 0.03 u);
 *  - the gradients by norm within S u, S = 2 (8 L + 3) = 54 for L = 3 the rounding stages
 *    between a weight and the loss and back (per block ln_1, qkv, attention, c_proj +
 *    residual, ln_2, c_fc, GELU, c_proj + residual; the embedding, ln_f and the logits),
 *    errors adding linearly at worst (measured: below 5 u). Single bias tensors sum
 *    activation gradients that largely cancel and are not compared alone. */
static void test_dtypes_track_fp32(void) {
    kiln_gpt_config c = three_blocks();
    kiln_gpt_options o = kiln_gpt_options_default();
    kiln_gpt *ref = build_with(&c, &o, kiln_backend_cpu());
    if (!ref)
        return;
    int64_t n = kiln_gpt_slab_len(ref);
    int nt = kiln_gpt_num_tensors(ref);
    kiln_param_range *ranges = calloc((size_t)nt, sizeof *ranges);
    for (int i = 0; i < nt; i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(ref, i);
        ranges[i] = (kiln_param_range){t->offset, t->numel, t->decay};
    }
    kiln_optim_config oc = kiln_optim_config_default();
    for (int d = KILN_DTYPE_BF16; d <= KILN_DTYPE_F16; d++) {
        kiln_dtype dt = (kiln_dtype)d;
        double u = kiln_dtype_epsilon(dt);
        /* fp16: the loss scaled by 2^10 as the trainer's loss scaler would, so that small
         * activation gradients stay clear of fp16's subnormals; unscaled before comparing */
        float scale = dt == KILN_DTYPE_F16 ? 1024.0f : 1.0f;
        kiln_gpt_options on = o;
        on.dtype = dt;
        kiln_gpt *f = build_with(&c, &o, kiln_backend_cpu());
        kiln_gpt *m = build_with(&c, &on, kiln_backend_cpu());
        kiln_optim *of = NULL, *om = NULL;
        kiln_optim_slab sf = {.n = n, .work = KILN_DTYPE_F32}, sm = {.n = n, .work = dt};
        CHECK_OK(kiln_optim_create(&of, &oc, &sf, ranges, nt, kiln_backend_cpu()));
        CHECK_OK(kiln_optim_create(&om, &oc, &sm, ranges, nt, kiln_backend_cpu()));
        if (!f || !m || !of || !om)
            goto next;
        kiln_gpt_init_weights_f32(m, 41, kiln_optim_master(om));
        CHECK_TRUE(memcmp(kiln_optim_master(om), kiln_gpt_params(f), (size_t)n * 4) == 0);
        for (int step = 0; step < 4; step++) {
            float lf = 0, lm = 0;
            CHECK_OK(step_of(f, 1.0f, &lf));
            CHECK_OK(step_of(m, scale, &lm));
            kiln_backend_cpu()->scale(kiln_backend_cpu(), kiln_gpt_grads(m), 1.0f / scale, n);
            double worst = 0, all = test_rel_err(kiln_gpt_grads(m), kiln_gpt_grads(f), n);
            const char *worst_name = "";
            for (int i = 0; i < nt; i++) {
                const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
                double e = test_rel_err(kiln_gpt_grads(m) + t->offset,
                                        kiln_gpt_grads(f) + t->offset, t->numel);
                if (e > worst)
                    worst = e, worst_name = t->name;
            }
            if (verbose())
                fprintf(stderr,
                        "  %s step %d: loss %.7f, fp32 %.7f (%.3g u); gradients %.3g u, worst "
                        "tensor %s %.3g u\n",
                        kiln_dtype_name(dt), step, lm, lf, fabs(lm - lf) / lf / u, all / u,
                        worst_name, worst / u);
            CHECK_NEAR(lm, lf, u); /* relative: the loss is above 1 */
            CHECK_TRUE(all <= 2 * (8 * c.n_layer + 3) * u);
            CHECK_OK(kiln_optim_step(of, kiln_gpt_params(f), kiln_gpt_grads(f), 1e-3f));
            CHECK_OK(kiln_optim_step(om, kiln_gpt_params(m), kiln_gpt_grads(m), 1e-3f));
        }
    next:
        kiln_optim_free(of), kiln_optim_free(om);
        kiln_gpt_free(f), kiln_gpt_free(m);
    }
    free(ranges);
    kiln_gpt_free(ref);
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
    CHECK_STATUS(kiln_gpt_create(&m, &c, 4, 64, NULL, kiln_backend_ref()), KILN_ERR_NOMEM);
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
    RUN_TEST(test_recompute_and_fusions_exact);
    RUN_TEST(test_classifier_chunk);
    RUN_TEST(test_memory_plan);
    RUN_TEST(test_dtypes_track_fp32);
    RUN_TEST(test_sampling);
    RUN_TEST(test_out_of_memory);
    TEST_MAIN_END();
}
