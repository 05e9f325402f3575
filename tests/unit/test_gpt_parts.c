/* The model in parts (kiln_gpt_begin, _embed_forward, _blocks_forward, _head_forward_backward,
 * _blocks_backward, _embed_backward): any split of the blocks into ranges gives the loss and
 * gradients of kiln_gpt_forward_backward bit for bit in fp32, for GPT-2 and Llama, fused or
 * not, with recomputation and a chunked head; two models holding the same weights run as two
 * pipeline stages (the stream and its gradient copied between them) give the whole model's
 * gradients; and the calls refuse what they cannot run. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "test.h"

enum { B = 2, T = 12, L = 4 };

static kiln_gpt_config gpt2(void) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = L;
    c.n_head = 4;
    c.n_embd = 32;
    c.max_seq_len = 16;
    c.vocab_size = 67;
    return c;
}

static kiln_gpt_config llama(void) {
    kiln_gpt_config c = gpt2();
    kiln_gpt_config_family(&c, "llama");
    c.n_kv_head = 2;
    c.mlp_hidden = 40;
    c.norm_eps = 1e-6;
    c.untied_head = 1;
    return c;
}

static void fill_ids(int32_t *ids, int n, int64_t V, uint64_t seed) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(kiln_rng_u64(&r) % (uint64_t)V);
}

static kiln_gpt *make(const kiln_gpt_config *c, const kiln_gpt_options *o) {
    kiln_gpt *m = NULL;
    if (kiln_gpt_create(&m, c, B, T, o, kiln_backend_cpu()) != KILN_OK)
        return NULL;
    kiln_gpt_init_weights(m, 17);
    kiln_gpt_zero_grad(m);
    return m;
}

/* The pass as parts, the blocks split at cut[0..n-1] (increasing, inside 1..L-1). */
static kiln_status parts(kiln_gpt *m, const int32_t *in, const int32_t *tg, const int *cut,
                         int n, float *loss) {
    int64_t edge[8];
    edge[0] = 0;
    for (int i = 0; i < n; i++)
        edge[i + 1] = cut[i];
    edge[n + 1] = L;
    KILN_CHECK(kiln_gpt_begin(m, in, tg, B, T));
    KILN_CHECK(kiln_gpt_embed_forward(m));
    for (int i = 0; i <= n; i++)
        KILN_CHECK(kiln_gpt_blocks_forward(m, edge[i], edge[i + 1]));
    KILN_CHECK(kiln_gpt_head_forward_backward(m, 1.0f, loss));
    for (int i = n; i >= 0; i--)
        KILN_CHECK(kiln_gpt_blocks_backward(m, edge[i], edge[i + 1]));
    return kiln_gpt_embed_backward(m);
}

static int same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

static void check_splits(const kiln_gpt_config *c, const kiln_gpt_options *o, const char *what) {
    int32_t in[B * T], tg[B * T];
    fill_ids(in, B * T, c->vocab_size, 5);
    fill_ids(tg, B * T, c->vocab_size, 6);
    kiln_gpt *whole = make(c, o), *split = make(c, o);
    CHECK_TRUE(whole && split);
    if (!whole || !split) {
        kiln_gpt_free(whole);
        kiln_gpt_free(split);
        return;
    }
    int64_t n = kiln_gpt_slab_len(whole);
    float lw = 0.0f;
    CHECK_OK(kiln_gpt_forward_backward(whole, in, tg, B, T, 1.0f, &lw));
    static const int cuts[][3] = {{1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {1, 2, 3}};
    static const int ncut[] = {1, 1, 1, 3};
    for (int k = 0; k < 4; k++) {
        kiln_gpt_zero_grad(split);
        float ls = -1.0f;
        CHECK_OK(parts(split, in, tg, cuts[k], ncut[k], &ls));
        int ok = ls == lw && same_bits(kiln_gpt_grads(split), kiln_gpt_grads(whole), n);
        if (!ok)
            fprintf(stderr, "  %s, split %d: loss %.9g against %.9g, gradients differ by %.3g\n",
                    what, k, ls, lw, test_rel_err(kiln_gpt_grads(split), kiln_gpt_grads(whole), n));
        CHECK_TRUE(ok);
    }
    /* a split pass twice accumulates twice, as the whole one does */
    CHECK_OK(kiln_gpt_forward_backward(whole, in, tg, B, T, 1.0f, &lw));
    kiln_gpt_zero_grad(split);
    float ls = 0.0f;
    CHECK_OK(parts(split, in, tg, cuts[1], 1, &ls));
    CHECK_OK(parts(split, in, tg, cuts[3], 3, &ls));
    CHECK_TRUE(same_bits(kiln_gpt_grads(split), kiln_gpt_grads(whole), n));
    kiln_gpt_free(whole);
    kiln_gpt_free(split);
}

static void test_splits_fp32(void) {
    kiln_gpt_config g = gpt2(), l = llama();
    kiln_gpt_options o = kiln_gpt_options_default();
    check_splits(&g, &o, "gpt2 fused");
    check_splits(&l, &o, "llama fused");
    o.fuse_residual_ln = 0;
    o.fuse_gelu = 0;
    check_splits(&g, &o, "gpt2 unfused");
    check_splits(&l, &o, "llama unfused");
    o = kiln_gpt_options_default();
    o.recompute = KILN_RECOMPUTE_BLOCK;
    check_splits(&g, &o, "gpt2 recompute block");
    check_splits(&l, &o, "llama recompute block");
    o = kiln_gpt_options_default();
    o.classifier_chunk = 5;
    check_splits(&g, &o, "gpt2 chunked head");
    check_splits(&l, &o, "llama chunked head");
}

/* bf16: the split computes a block's first norm after a plain residual add where the whole
 * pass fuses the two; in bf16 the fused kernel normalises the sum before it is rounded, so
 * the figures agree to bf16's rounding rather than bit for bit. */
static void test_splits_bf16(void) {
    kiln_gpt_config cs[2] = {gpt2(), llama()};
    for (int i = 0; i < 2; i++) {
        kiln_gpt_options o = kiln_gpt_options_default();
        o.dtype = KILN_DTYPE_BF16;
        int32_t in[B * T], tg[B * T];
        fill_ids(in, B * T, cs[i].vocab_size, 8);
        fill_ids(tg, B * T, cs[i].vocab_size, 9);
        kiln_gpt *whole = make(&cs[i], &o), *split = make(&cs[i], &o);
        CHECK_TRUE(whole && split);
        if (whole && split) {
            float lw = 0, ls = 0;
            static const int cut[] = {2};
            CHECK_OK(kiln_gpt_forward_backward(whole, in, tg, B, T, 1.0f, &lw));
            CHECK_OK(parts(split, in, tg, cut, 1, &ls));
            CHECK_NEAR(ls, lw, 1e-2 * fabsf(lw));
            double e = test_rel_err(kiln_gpt_grads(split), kiln_gpt_grads(whole),
                                    kiln_gpt_slab_len(whole));
            CHECK_TRUE(e < 3e-2);
        }
        kiln_gpt_free(whole);
        kiln_gpt_free(split);
    }
}

/* Two stages on two models with the same weights: stage one embeds and runs blocks
 * [0, cut), stage two runs [cut, L) and the head; the stream goes forward and its gradient
 * back between them as a pipeline would send them. Each model's gradients cover its own parts
 * (zero elsewhere, but for a tied wte, which both the embedding and the head add to); their
 * sum is the whole model's. */
static void check_stages(const kiln_gpt_config *c, int cut) {
    kiln_gpt_options o = kiln_gpt_options_default();
    int32_t in[B * T], tg[B * T];
    fill_ids(in, B * T, c->vocab_size, 11);
    fill_ids(tg, B * T, c->vocab_size, 12);
    kiln_gpt *whole = make(c, &o), *s1 = make(c, &o), *s2 = make(c, &o);
    CHECK_TRUE(whole && s1 && s2);
    if (whole && s1 && s2) {
        int64_t n = kiln_gpt_slab_len(whole);
        size_t stream = (size_t)(B * T * c->n_embd) * sizeof(float);
        float lw = 0, l2 = 0;
        CHECK_OK(kiln_gpt_forward_backward(whole, in, tg, B, T, 1.0f, &lw));
        CHECK_OK(kiln_gpt_begin(s1, in, NULL, B, T));
        CHECK_OK(kiln_gpt_embed_forward(s1));
        CHECK_OK(kiln_gpt_blocks_forward(s1, 0, cut));
        CHECK_OK(kiln_gpt_begin(s2, NULL, tg, B, T));
        memcpy(kiln_gpt_stream(s2, cut), kiln_gpt_stream(s1, cut), stream);
        CHECK_OK(kiln_gpt_blocks_forward(s2, cut, L));
        CHECK_OK(kiln_gpt_head_forward_backward(s2, 1.0f, &l2));
        CHECK_OK(kiln_gpt_blocks_backward(s2, cut, L));
        memcpy(kiln_gpt_stream_grad(s1), kiln_gpt_stream_grad(s2), stream);
        CHECK_OK(kiln_gpt_blocks_backward(s1, 0, cut));
        CHECK_OK(kiln_gpt_embed_backward(s1));
        CHECK_TRUE(l2 == lw);
        const float *g1 = kiln_gpt_grads(s1), *g2 = kiln_gpt_grads(s2), *gw = kiln_gpt_grads(whole);
        float *sum = malloc((size_t)n * sizeof *sum);
        int64_t both = 0;
        for (int64_t i = 0; sum && i < n; i++) {
            sum[i] = g1[i] + g2[i];
            both += g1[i] != 0.0f && g2[i] != 0.0f;
        }
        if (sum) {
            double e = test_rel_err(sum, gw, n);
            CHECK_TRUE(e < 1e-6);
            /* only the tied wte is written by both stages */
            int64_t wlo, whi;
            kiln_gpt_wte_range(whole, &wlo, &whi);
            CHECK_TRUE(c->untied_head ? both == 0 : both > 0 && both <= whi - wlo);
        }
        free(sum);
    }
    kiln_gpt_free(whole);
    kiln_gpt_free(s1);
    kiln_gpt_free(s2);
}

static void test_stages(void) {
    kiln_gpt_config g = gpt2(), l = llama();
    check_stages(&g, 1);
    check_stages(&g, 3);
    check_stages(&l, 2);
    l.untied_head = 0;
    check_stages(&l, 2);
}

static void test_refusals(void) {
    kiln_gpt_config c = llama();
    kiln_gpt_options o = kiln_gpt_options_default();
    kiln_gpt *m = make(&c, &o);
    CHECK_TRUE(m != NULL);
    if (!m)
        return;
    int32_t in[B * T];
    fill_ids(in, B * T, c.vocab_size, 3);
    CHECK_STATUS(kiln_gpt_blocks_forward(NULL, 0, 1), KILN_ERR_ARG);
    CHECK_STATUS(kiln_gpt_blocks_forward(m, 0, 1), KILN_ERR_ARG); /* no batch begun */
    CHECK_STATUS(kiln_gpt_begin(m, in, NULL, B + 1, T), KILN_ERR_ARG);
    in[3] = (int32_t)c.vocab_size;
    CHECK_STATUS(kiln_gpt_begin(m, in, NULL, B, T), KILN_ERR_RANGE);
    in[3] = 0;
    CHECK_OK(kiln_gpt_begin(m, NULL, in, B, T));
    CHECK_STATUS(kiln_gpt_embed_forward(m), KILN_ERR_ARG); /* no inputs */
    CHECK_STATUS(kiln_gpt_blocks_forward(m, 2, 1), KILN_ERR_ARG);
    CHECK_STATUS(kiln_gpt_blocks_forward(m, 0, L + 1), KILN_ERR_ARG);
    CHECK_STATUS(kiln_gpt_blocks_forward(m, -1, 1), KILN_ERR_ARG);
    CHECK_OK(kiln_gpt_begin(m, in, NULL, B, T));
    CHECK_OK(kiln_gpt_embed_forward(m));
    CHECK_OK(kiln_gpt_blocks_forward(m, 0, L));
    CHECK_STATUS(kiln_gpt_head_forward_backward(m, 1.0f, NULL), KILN_ERR_ARG); /* no targets */
    CHECK_STATUS(kiln_gpt_head_backward(m, 1.0f), KILN_ERR_ARG); /* no forward with targets */
    CHECK_TRUE(kiln_gpt_stream(m, -1) == NULL && kiln_gpt_stream(m, L + 1) == NULL);
    CHECK_TRUE(kiln_gpt_stream(m, 0) != NULL && kiln_gpt_stream(m, L) != NULL);
    kiln_gpt_free(m);
    /* an inference model has no backward */
    kiln_gpt *inf = NULL;
    CHECK_OK(kiln_gpt_create_inference(&inf, &c, B, T, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (inf) {
        CHECK_OK(kiln_gpt_begin(inf, in, in, B, T));
        CHECK_STATUS(kiln_gpt_blocks_backward(inf, 0, L), KILN_ERR_UNSUPPORTED);
        kiln_gpt_free(inf);
    }
}

int main(void) {
    RUN_TEST(test_splits_fp32);
    RUN_TEST(test_splits_bf16);
    RUN_TEST(test_stages);
    RUN_TEST(test_refusals);
    TEST_MAIN_END();
}
