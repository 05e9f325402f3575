/* Generation with a cache: attention_decode on the CPU backend against the reference and
 * against the whole-window attention's last rows; kiln_gpt_forward_cached's logits against
 * kiln_gpt_forward_last over the whole window, position by position, for fp32 and bf16, two
 * sequences, shared blocks and narrow heads, on both backends; kiln_generate_ex's tokens
 * with and without the cache; the calls it refuses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/sample.h"
#include "test.h"

static double lcg(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*x >> 40) / (double)(1ull << 24) - 0.5;
}

static void test_decode_op(void) {
    int64_t B = 2, ldT = 12, Tk = 9, T = 3, C = 24, NH = 3;
    uint64_t x = 5;
    float *qkv = malloc((size_t)(B * ldT * 3 * C) * sizeof *qkv);
    float *full = malloc((size_t)(B * Tk * 3 * C) * sizeof *full);
    for (int64_t i = 0; i < B * ldT * 3 * C; i++)
        qkv[i] = (float)lcg(&x) * 2.0f;
    for (int64_t b = 0; b < B; b++) /* the same positions packed as a (B,Tk) window */
        memcpy(full + b * Tk * 3 * C, qkv + b * ldT * 3 * C, (size_t)(Tk * 3 * C) * sizeof *qkv);
    float *oc = malloc((size_t)(B * T * C) * sizeof *oc),
          *orf = malloc((size_t)(B * T * C) * sizeof *orf);
    float *ow = malloc((size_t)(B * Tk * C) * sizeof *ow);
    kiln_backend *cpu = kiln_backend_cpu(), *ref = kiln_backend_ref();
    CHECK_TRUE(cpu->attention_decode != NULL && ref->attention_decode != NULL);
    cpu->attention_decode(cpu, KILN_DTYPE_F32, oc, qkv, B, ldT, Tk, T, C, NH, NH);
    ref->attention_decode(ref, KILN_DTYPE_F32, orf, qkv, B, ldT, Tk, T, C, NH, NH);
    CHECK_OK(cpu->synchronize(cpu));
    CHECK_OK(ref->synchronize(ref));
    void *saved = malloc(ref->attention_saved_bytes(ref, KILN_DTYPE_F32, B, Tk, C, NH, NH));
    void *scratch = malloc(ref->attention_scratch_bytes(ref, KILN_DTYPE_F32, B, Tk, C, NH, NH) + 1);
    ref->attention_forward(ref, KILN_DTYPE_F32, ow, saved, scratch, full, B, Tk, C, NH, NH);
    CHECK_OK(ref->synchronize(ref));
    double worst_ref = 0.0, worst_win = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++) {
                float a = oc[(b * T + t) * C + c], r = orf[(b * T + t) * C + c];
                float w = ow[(b * Tk + Tk - T + t) * C + c];
                worst_ref = fmax(worst_ref, fabs(a - r));
                worst_win = fmax(worst_win, fabs(r - w));
            }
    CHECK_TRUE(worst_ref < 1e-5);
    CHECK_TRUE(worst_win < 1e-6);
    /* bf16 on the CPU against the reference in bf16 */
    uint16_t *qb = malloc((size_t)(B * ldT * 3 * C) * sizeof *qb);
    uint16_t *ob = malloc((size_t)(B * T * C) * sizeof *ob),
             *obr = malloc((size_t)(B * T * C) * sizeof *obr);
    kiln_convert(qb, KILN_DTYPE_BF16, qkv, KILN_DTYPE_F32, B * ldT * 3 * C);
    cpu->attention_decode(cpu, KILN_DTYPE_BF16, ob, qb, B, ldT, Tk, T, C, NH, NH);
    ref->attention_decode(ref, KILN_DTYPE_BF16, obr, qb, B, ldT, Tk, T, C, NH, NH);
    CHECK_OK(cpu->synchronize(cpu));
    CHECK_OK(ref->synchronize(ref));
    float *fb = malloc((size_t)(B * T * C) * sizeof *fb),
          *fbr = malloc((size_t)(B * T * C) * sizeof *fbr);
    kiln_convert(fb, KILN_DTYPE_F32, ob, KILN_DTYPE_BF16, B * T * C);
    kiln_convert(fbr, KILN_DTYPE_F32, obr, KILN_DTYPE_BF16, B * T * C);
    double worst_bf = 0.0;
    for (int64_t i = 0; i < B * T * C; i++)
        worst_bf = fmax(worst_bf, fabs(fb[i] - fbr[i]) / (fabs(fbr[i]) + 1e-2));
    CHECK_TRUE(worst_bf < 1.6e-2); /* one bf16 rounding of the output apart */
    free(qkv), free(full), free(oc), free(orf), free(ow), free(saved), free(scratch);
    free(qb), free(ob), free(obr), free(fb), free(fbr);
}

static kiln_gpt_config cfg(int64_t share, int64_t head_size) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 4;
    c.n_head = 3;
    c.n_embd = 24;
    c.vocab_size = 50;
    c.max_seq_len = 16;
    c.share_layers = share;
    c.head_size = head_size;
    return c;
}

/* The cached model's logits at every position against the whole window's. */
static void check_model(kiln_backend *be, kiln_dtype dt, int64_t share, int64_t head_size,
                        double tol) {
    kiln_gpt_config c = cfg(share, head_size);
    kiln_gpt *m = NULL, *w = NULL;
    int64_t B = 2, maxT = 16, Vp = 128;
    CHECK_OK(kiln_gpt_create_inference(&m, &c, B, maxT, dt, be));
    CHECK_OK(kiln_gpt_create_inference(&w, &c, B, maxT, dt, be));
    if (!m || !w) {
        kiln_gpt_free(m);
        kiln_gpt_free(w);
        return;
    }
    kiln_gpt_init_weights(m, 21);
    kiln_gpt_init_weights(w, 21);
    CHECK_OK(kiln_gpt_enable_cache(m));
    int32_t ids[2 * 16];
    for (int i = 0; i < 2 * 16; i++)
        ids[i] = (i * 13 + 7) % 50;
    float *a = malloc((size_t)(B * Vp) * sizeof *a), *r = malloc((size_t)(B * Vp) * sizeof *r);
    int32_t win[2 * 16], step[2];
    double worst = 0.0;
    int64_t n0 = 5; /* a prompt of 5, then one position at a time up to the context */
    for (int64_t len = n0; len <= maxT; len++) {
        if (len == n0) {
            for (int64_t b = 0; b < B; b++)
                memcpy(win + b * n0, ids + b * 16, (size_t)n0 * sizeof *win);
            CHECK_OK(kiln_gpt_forward_cached(m, win, B, 0, n0));
        } else {
            for (int64_t b = 0; b < B; b++)
                step[b] = ids[b * 16 + len - 1];
            CHECK_OK(kiln_gpt_forward_cached(m, step, B, len - 1, 1));
        }
        for (int64_t b = 0; b < B; b++)
            memcpy(win + b * len, ids + b * 16, (size_t)len * sizeof *win);
        CHECK_OK(kiln_gpt_forward_last(w, win, B, len));
        CHECK_OK(kiln_gpt_logits_f32(m, B, a));
        CHECK_OK(kiln_gpt_logits_f32(w, B, r));
        for (int64_t b = 0; b < B; b++)
            for (int64_t v = 0; v < 50; v++)
                worst = fmax(worst, fabs(a[b * Vp + v] - r[b * Vp + v]));
    }
    CHECK_TRUE(worst <= tol);
    if (worst > tol)
        fprintf(stderr, "  %s %s share %lld head %lld: worst logit difference %.3g\n", be->name,
                kiln_dtype_name(dt), (long long)share, (long long)head_size, worst);
    /* refused: a gap, past the context, another batch size; a fresh start is fine */
    CHECK_STATUS(kiln_gpt_forward_cached(m, step, B, maxT + 1, 1), KILN_ERR_ARG);
    CHECK_STATUS(kiln_gpt_forward_cached(m, step, B, maxT, 1), KILN_ERR_ARG);
    CHECK_STATUS(kiln_gpt_forward_cached(m, step, 1, 3, 1), KILN_ERR_ARG);
    CHECK_OK(kiln_gpt_forward_cached(m, win, 1, 0, 4));
    CHECK_STATUS(kiln_gpt_forward_cached(m, step, 1, 5, 1), KILN_ERR_ARG);
    free(a);
    free(r);
    kiln_gpt_free(m);
    kiln_gpt_free(w);
}

static void test_model_fp32(void) {
    check_model(kiln_backend_cpu(), KILN_DTYPE_F32, 0, 0, 2e-5);
    check_model(kiln_backend_cpu(), KILN_DTYPE_F32, 2, 0, 2e-5);
    check_model(kiln_backend_cpu(), KILN_DTYPE_F32, 0, 5, 2e-5);
    check_model(kiln_backend_ref(), KILN_DTYPE_F32, 0, 0, 2e-5);
}

static void test_model_bf16(void) {
    /* the cached rows are the same bf16 values; sums in another order move a logit by a
     * bf16 rounding at most */
    check_model(kiln_backend_cpu(), KILN_DTYPE_BF16, 0, 0, 2e-2);
}

static void test_generate_and_refusals(void) {
    kiln_gpt_config c = cfg(0, 0);
    kiln_gpt *m = NULL, *t = NULL;
    CHECK_OK(kiln_gpt_create_inference(&m, &c, 1, 16, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 8);
    int32_t a[40] = {3, 9, 27}, b[40] = {3, 9, 27};
    /* past the context (16): the cache fills, then whole windows */
    CHECK_OK(kiln_generate_ex(m, a, 3, 30, 1.0f, 0, 42, 1, NULL, NULL));
    CHECK_OK(kiln_generate_ex(m, b, 3, 30, 1.0f, 0, 42, 0, NULL, NULL));
    CHECK_TRUE(memcmp(a, b, sizeof a) == 0);
    kiln_gpt_free(m);
    /* a training model keeps no cache */
    CHECK_OK(kiln_gpt_create(&t, &c, 1, 16, NULL, kiln_backend_cpu()));
    if (t) {
        CHECK_STATUS(kiln_gpt_enable_cache(t), KILN_ERR_UNSUPPORTED);
        int32_t one = 1;
        CHECK_STATUS(kiln_gpt_forward_cached(t, &one, 1, 0, 1), KILN_ERR_ARG);
        kiln_gpt_free(t);
    }
}

int main(void) {
    RUN_TEST(test_decode_op);
    RUN_TEST(test_model_fp32);
    RUN_TEST(test_model_bf16);
    RUN_TEST(test_generate_and_refusals);
    TEST_MAIN_END();
}
