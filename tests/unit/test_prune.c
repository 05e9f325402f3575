/* Magnitude pruning (src/compress/prune.c): exact counts, ties, scopes, the schedule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/compress.h"
#include "kiln/model.h"
#include "test.h"

static kiln_gpt *tiny(void) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.vocab_size = 64;
    c.max_seq_len = 8;
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_OK(kiln_gpt_create_inference(&m, &c, 1, 8, KILN_DTYPE_F32, NULL));
    return m;
}

static void test_counts_and_scopes(void) {
    kiln_gpt *m = tiny();
    if (!m)
        return;
    int64_t n = kiln_gpt_slab_len(m);
    float *w = malloc((size_t)n * sizeof *w), *w0 = malloc((size_t)n * sizeof *w0);
    uint8_t *keep = malloc((size_t)n);
    srand(3);
    for (int64_t i = 0; i < n; i++)
        w0[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    /* ties: a run of equal magnitudes in the first matrix */
    int first = -1;
    for (int i = 0; i < kiln_gpt_num_tensors(m) && first < 0; i++)
        if (kiln_prune_tensor(m, i))
            first = i;
    const kiln_tensor_info *t0 = kiln_gpt_tensor(m, first);
    for (int e = 0; e < 100; e++)
        w0[t0->offset + e] = (e % 2 ? 0.01f : -0.01f);
    for (int scope = 0; scope < 2; scope++) {
        memcpy(w, w0, (size_t)n * sizeof *w);
        CHECK_OK(kiln_prune_magnitude(m, w, 0.4, (kiln_prune_scope)scope, keep));
        int64_t total = 0, zeros = 0, changed_outside = 0, keep_mismatch = 0;
        for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
            const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
            int64_t z = 0;
            for (int64_t e = 0; e < t->numel; e++) {
                float x = w[t->offset + e];
                z += x == 0.0f;
                keep_mismatch += keep[t->offset + e] != (x != 0.0f || !kiln_prune_tensor(m, i));
                if (!kiln_prune_tensor(m, i))
                    changed_outside += x != w0[t->offset + e];
            }
            if (kiln_prune_tensor(m, i)) {
                total += t->numel;
                zeros += z;
                if (scope == KILN_PRUNE_LAYER)
                    CHECK_INT_EQ(z, llround(0.4 * (double)t->numel));
            }
        }
        CHECK_INT_EQ(zeros, scope == KILN_PRUNE_GLOBAL ? llround(0.4 * (double)total) : zeros);
        CHECK_INT_EQ(changed_outside, 0); /* embeddings, LayerNorms, biases untouched */
        CHECK_INT_EQ(keep_mismatch, 0);
        /* every kept weight is at least as large as every pruned one */
        float max_pruned = 0.0f, min_kept = INFINITY;
        for (int64_t e = 0; e < t0->numel; e++) {
            float x = fabsf(w0[t0->offset + e]);
            if (w[t0->offset + e] == 0.0f)
                max_pruned = fmaxf(max_pruned, x);
            else
                min_kept = fminf(min_kept, x);
        }
        CHECK_TRUE(max_pruned <= min_kept);
    }
    CHECK_STATUS(kiln_prune_magnitude(m, w, 1.0, KILN_PRUNE_GLOBAL, NULL), KILN_ERR_ARG);
    free(w);
    free(w0);
    free(keep);
    kiln_gpt_free(m);
}

static void test_schedule(void) {
    CHECK_NEAR(kiln_prune_schedule(0, 0.5, 10, 20, 5), 0.0, 1e-12);
    CHECK_NEAR(kiln_prune_schedule(0, 0.5, 10, 20, 10), 0.0, 1e-12);
    CHECK_NEAR(kiln_prune_schedule(0, 0.5, 10, 20, 15), 0.5 - 0.5 * 0.125, 1e-12);
    CHECK_NEAR(kiln_prune_schedule(0, 0.5, 10, 20, 20), 0.5, 1e-12);
    CHECK_NEAR(kiln_prune_schedule(0, 0.5, 10, 10, 10), 0.5, 1e-12); /* one shot */
    kiln_prune_scope s;
    CHECK_OK(kiln_prune_scope_parse("layer", &s));
    CHECK_INT_EQ(s, KILN_PRUNE_LAYER);
    CHECK_STATUS(kiln_prune_scope_parse("row", &s), KILN_ERR_ARG);
}

int main(void) {
    RUN_TEST(test_counts_and_scopes);
    RUN_TEST(test_schedule);
    TEST_MAIN_END();
}
