/* Blocks report: backward announces each range of the gradient slab as it becomes final
 * (kiln_gpt_set_grad_ready). The ranges cover the slab once, in decreasing order, once per
 * backward; and what a range holds when it is announced is what it holds at the end, in
 * every recompute mode, with and without a chunked classifier, in fp32 and bf16. */
#include <stdint.h>

#include "kiln/core.h"
#include "kiln/model.h"
#include "test.h"

enum { B = 2, T = 8, MAX_RANGES = 16 };

/* What the callback saw: the ranges in order, and the slab's values at each announcement. */
typedef struct seen {
    kiln_backend *be;
    const float *grads;
    float *snap; /* (slab_len) each range copied when announced */
    int64_t lo[MAX_RANGES], hi[MAX_RANGES];
    int n;
} seen;

static void on_ready(void *ctx, int64_t lo, int64_t hi) {
    seen *s = ctx;
    if (s->n < MAX_RANGES) {
        s->lo[s->n] = lo;
        s->hi[s->n] = hi;
    }
    s->n++;
    if (lo >= 0 && hi >= lo)
        s->be->copy(s->be, s->snap + lo, s->grads + lo, (size_t)(hi - lo) * sizeof(float),
                    KILN_COPY_TO_HOST);
}

static kiln_gpt_config three_blocks(void) {
    kiln_gpt_config c = {
        .max_seq_len = 8, .vocab_size = 37, .n_layer = 3, .n_head = 2, .n_embd = 12};
    kiln_gpt_config_validate(&c);
    return c;
}

static void fill_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)kiln_rng_below(&r, (uint64_t)V);
}

/* The announced ranges of one pass, s->lo/hi[first .. first+L+2), against the model's own
 * list and the layout: ln_f's tensors, then each block's, then wte and wpe from 0. */
static void check_ranges(const kiln_gpt *m, const seen *s, int first, const char *what) {
    int64_t L = kiln_gpt_get_config(m)->n_layer, n = kiln_gpt_slab_len(m);
    int64_t lo[MAX_RANGES], hi[MAX_RANGES];
    CHECK_INT_EQ(kiln_gpt_grad_ranges(m, lo, hi, MAX_RANGES), L + 2);
    CHECK_INT_EQ(hi[0], n);
    CHECK_INT_EQ(lo[L + 1], 0);
    CHECK_INT_EQ(lo[0], kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, "ln_f.weight"))->offset);
    CHECK_INT_EQ(hi[L + 1], kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, "h.0.ln_1.weight"))->offset);
    for (int64_t i = 0; i <= L + 1; i++) {
        CHECK_TRUE(lo[i] < hi[i]);
        if (i > 0) /* contiguous and decreasing: together they cover [0, n) once */
            CHECK_INT_EQ(hi[i], lo[i - 1]);
        if (i >= 1 && i <= L) {
            char name[64];
            snprintf(name, sizeof name, "h.%lld.ln_1.weight", (long long)(L - i));
            CHECK_INT_EQ(lo[i], kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, name))->offset);
        }
        if (s->lo[first + i] != lo[i] || s->hi[first + i] != hi[i])
            fprintf(stderr, "  %s: range %lld announced [%lld, %lld), listed [%lld, %lld)\n", what,
                    (long long)i, (long long)s->lo[first + i], (long long)s->hi[first + i],
                    (long long)lo[i], (long long)hi[i]);
        CHECK_INT_EQ(s->lo[first + i], lo[i]);
        CHECK_INT_EQ(s->hi[first + i], hi[i]);
    }
    /* a shorter list: only max written, the count still returned */
    int64_t one_lo = -1, one_hi = -1;
    CHECK_INT_EQ(kiln_gpt_grad_ranges(m, &one_lo, &one_hi, 1), L + 2);
    CHECK_INT_EQ(one_lo, lo[0]);
    CHECK_INT_EQ(one_hi, hi[0]);
}

/* The snapshot taken at each announcement equals the slab now, bit for bit; names the first
 * tensor that differs. */
static int snapshot_differs(const kiln_gpt *m, const float *snap, const float *g,
                            const char *what) {
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        if (memcmp(snap + t->offset, g + t->offset, (size_t)t->numel * sizeof(float)) != 0) {
            fprintf(stderr, "  %s: %s changed after it was announced final\n", what, t->name);
            return 1;
        }
    }
    return 0;
}

/* One model: two passes through forward_backward (accumulating), then one through forward
 * and backward; after each, the announced ranges and values. The gradients are the same bits
 * as the same model's with no callback. */
static void check_model(kiln_gpt_options o, kiln_backend *be) {
    kiln_gpt_config c = three_blocks();
    char what[128];
    snprintf(what, sizeof what, "%s %s recompute %s chunk %lld", be->name, kiln_dtype_name(o.dtype),
             kiln_recompute_name(o.recompute), (long long)o.classifier_chunk);
    kiln_gpt *m = NULL, *plain = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, B, T, &o, be));
    CHECK_OK(kiln_gpt_create(&plain, &c, B, T, &o, be));
    int64_t n = m ? kiln_gpt_slab_len(m) : 0, L = c.n_layer;
    seen s = {.be = be, .snap = calloc((size_t)n + 1, sizeof(float))};
    float *g = malloc(((size_t)n + 1) * sizeof(float));
    float *gp = malloc(((size_t)n + 1) * sizeof(float));
    if (!m || !plain || !s.snap || !g || !gp)
        goto done;
    s.grads = kiln_gpt_grads(m);
    kiln_gpt_init_weights(m, 7);
    kiln_gpt_init_weights(plain, 7);
    kiln_gpt_zero_grad(m);
    kiln_gpt_zero_grad(plain);
    kiln_gpt_set_grad_ready(m, on_ready, &s);
    int32_t in[B * T], tg[B * T];
    for (int pass = 0; pass < 3; pass++) {
        fill_ids(in, B * T, c.vocab_size, 100 + (uint64_t)pass);
        fill_ids(tg, B * T, c.vocab_size, 200 + (uint64_t)pass);
        float l = 0, lp = 0;
        int before = s.n;
        if (pass < 2) {
            CHECK_OK(kiln_gpt_forward_backward(m, in, tg, B, T, 0.5f, &l));
            CHECK_OK(kiln_gpt_forward_backward(plain, in, tg, B, T, 0.5f, &lp));
        } else {
            CHECK_OK(kiln_gpt_forward(m, in, tg, B, T, &l));
            CHECK_INT_EQ(s.n, before); /* forward announces nothing */
            CHECK_OK(kiln_gpt_backward(m, 0.5f));
            CHECK_OK(kiln_gpt_forward(plain, in, tg, B, T, &lp));
            CHECK_OK(kiln_gpt_backward(plain, 0.5f));
        }
        CHECK_INT_EQ(s.n - before, L + 2); /* once per backward */
        if (s.n - before != L + 2 || s.n > MAX_RANGES)
            break;
        check_ranges(m, &s, before, what);
        be->copy(be, g, kiln_gpt_grads(m), (size_t)n * sizeof(float), KILN_COPY_TO_HOST);
        be->copy(be, gp, kiln_gpt_grads(plain), (size_t)n * sizeof(float), KILN_COPY_TO_HOST);
        CHECK_OK(be->synchronize(be));
        CHECK_INT_EQ(snapshot_differs(m, s.snap, g, what), 0);
        CHECK_TRUE(memcmp(g, gp, (size_t)n * sizeof(float)) == 0);
        CHECK_TRUE(memcmp(&l, &lp, sizeof l) == 0);
        s.n = 0;
        memset(s.snap, 0xff, (size_t)n * sizeof(float)); /* NaNs: a range not copied shows */
    }
    /* cleared: backward announces nothing */
    kiln_gpt_set_grad_ready(m, NULL, &s);
    CHECK_OK(kiln_gpt_forward_backward(m, in, tg, B, T, 0.5f, NULL));
    CHECK_INT_EQ(s.n, 0);
done:
    free(gp);
    free(g);
    free(s.snap);
    kiln_gpt_free(plain);
    kiln_gpt_free(m);
}

static void test_every_mode(void) {
    const kiln_dtype dts[] = {KILN_DTYPE_F32, KILN_DTYPE_BF16};
    const int64_t chunks[] = {0, 5};
    for (int d = 0; d < 2; d++)
        for (int rc = KILN_RECOMPUTE_NONE; rc <= KILN_RECOMPUTE_BLOCK; rc++)
            for (int k = 0; k < 2; k++) {
                kiln_gpt_options o = kiln_gpt_options_default();
                o.dtype = dts[d];
                o.recompute = (kiln_recompute)rc;
                o.classifier_chunk = chunks[k];
                o.fuse_residual_ln = (rc + k) & 1; /* both ways across the modes */
                check_model(o, kiln_backend_cpu());
            }
}

/* The reference backend reports the same ranges (its ops are synchronous too). */
static void test_reference_backend(void) {
    kiln_gpt_options o = kiln_gpt_options_default();
    o.recompute = KILN_RECOMPUTE_BLOCK;
    check_model(o, kiln_backend_ref());
}

/* The embedding's rows apart: backward announces wte first (right after the classifier),
 * then ln_f, the blocks and wpe, as kiln_gpt_grad_ranges_apart lists them, and what each
 * holds when announced is final; wte's gradient lacks the embedding's rows, which
 * kiln_gpt_embed_rows gives, and those rows added into it (as encoder_backward adds them)
 * give the same bits as the plain model's. fp32 and bf16, on the CPU and reference
 * backends; accumulated over a pass without the rows apart first. */
static void check_apart(kiln_dtype dt, kiln_backend *be) {
    kiln_gpt_config c = three_blocks();
    kiln_gpt_options o = kiln_gpt_options_default();
    o.dtype = dt;
    kiln_gpt *m = NULL, *plain = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, B, T, &o, be));
    CHECK_OK(kiln_gpt_create(&plain, &c, B, T, &o, be));
    if (!m || !plain)
        goto done;
    int64_t n = kiln_gpt_slab_len(m), L = c.n_layer, C = c.n_embd;
    seen s = {.be = be, .grads = kiln_gpt_grads(m), .snap = calloc((size_t)n, sizeof(float))};
    kiln_gpt_init_weights(m, 9);
    kiln_gpt_init_weights(plain, 9);
    kiln_gpt_zero_grad(m);
    kiln_gpt_zero_grad(plain);
    int32_t in[B * T], tg[B * T];
    for (int pass = 0; pass < 2; pass++) {
        fill_ids(in, B * T, c.vocab_size, 300 + (uint64_t)pass);
        fill_ids(tg, B * T, c.vocab_size, 400 + (uint64_t)pass);
        kiln_gpt_set_embed_rows_apart(m, pass == 1);
        kiln_gpt_set_grad_ready(m, pass == 1 ? on_ready : NULL, &s);
        CHECK_OK(kiln_gpt_forward_backward(m, in, tg, B, T, 0.5f, NULL));
        CHECK_OK(kiln_gpt_forward_backward(plain, in, tg, B, T, 0.5f, NULL));
    }
    int64_t lo[MAX_RANGES], hi[MAX_RANGES], wlo, whi;
    CHECK_INT_EQ(kiln_gpt_grad_ranges_apart(m, lo, hi, MAX_RANGES), L + 3);
    CHECK_INT_EQ(s.n, L + 3);
    kiln_gpt_wte_range(m, &wlo, &whi);
    CHECK_INT_EQ(lo[0], 0);
    CHECK_INT_EQ(hi[0], whi);
    CHECK_INT_EQ(lo[L + 2], whi);
    CHECK_INT_EQ(hi[1], n);
    for (int i = 0; i < s.n && i < L + 3; i++) {
        CHECK_INT_EQ(s.lo[i], lo[i]);
        CHECK_INT_EQ(s.hi[i], hi[i]);
    }
    const int32_t *ids;
    const void *rows;
    int64_t nr;
    kiln_gpt_embed_rows(m, &ids, &rows, &nr);
    CHECK_INT_EQ(nr, B * T);
    float *g = kiln_gpt_grads(m), *gp = kiln_gpt_grads(plain);
    CHECK_INT_EQ(snapshot_differs(m, s.snap, g, "rows apart"), 0);
    /* wpe and everything else as the plain model's; wte only once the rows are in */
    CHECK_TRUE(memcmp(g + whi, gp + whi, (size_t)(n - whi) * sizeof(float)) == 0);
    CHECK_TRUE(memcmp(g, gp, (size_t)whi * sizeof(float)) != 0);
    float *scratch = calloc((size_t)(T * C), sizeof(float)); /* a wpe nobody reads */
    be->encoder_backward(be, dt, g + wlo, scratch, rows, ids, B, T, C);
    CHECK_OK(be->synchronize(be));
    CHECK_TRUE(memcmp(g, gp, (size_t)n * sizeof(float)) == 0);
    /* off again: the next backward adds the rows itself, and leaves none apart */
    kiln_gpt_set_embed_rows_apart(m, 0);
    kiln_gpt_set_grad_ready(m, NULL, NULL);
    CHECK_OK(kiln_gpt_forward_backward(m, in, tg, B, T, 0.5f, NULL));
    CHECK_OK(kiln_gpt_forward_backward(plain, in, tg, B, T, 0.5f, NULL));
    kiln_gpt_embed_rows(m, &ids, &rows, &nr);
    CHECK_INT_EQ(nr, 0);
    CHECK_TRUE(memcmp(g, gp, (size_t)n * sizeof(float)) == 0);
    free(scratch);
    free(s.snap);
done:
    kiln_gpt_free(plain);
    kiln_gpt_free(m);
}

static void test_rows_apart(void) {
    check_apart(KILN_DTYPE_F32, kiln_backend_cpu());
    check_apart(KILN_DTYPE_BF16, kiln_backend_cpu());
    check_apart(KILN_DTYPE_F32, kiln_backend_ref());
}

int main(void) {
    RUN_TEST(test_every_mode);
    RUN_TEST(test_reference_backend);
    RUN_TEST(test_rows_apart);
    TEST_MAIN_END();
}
