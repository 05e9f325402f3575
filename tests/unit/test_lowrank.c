/* Low-rank factorisation (src/compress/lowrank.c): the SVD and the rank it picks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/model.h"
#include "test.h"

static float frand(void) {
    return (float)rand() / (float)RAND_MAX - 0.5f;
}

/* max |a - b| over n */
static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0.0;
    for (int64_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* out (K,N) = U (K,r) V (r,N) */
static void product(float *out, const float *U, const float *V, int64_t K, int64_t N, int64_t r) {
    for (int64_t i = 0; i < K; i++)
        for (int64_t c = 0; c < N; c++) {
            double acc = 0.0;
            for (int64_t j = 0; j < r; j++)
                acc += (double)U[i * r + j] * (double)V[j * N + c];
            out[i * N + c] = (float)acc;
        }
}

static void test_energy_rank(void) {
    const float s[3] = {3.0f, 2.0f, 1.0f}; /* squares 9, 4, 1 of 14 */
    CHECK_NEAR(kiln_lowrank_energy(s, 3, 1), 9.0 / 14.0, 1e-12);
    CHECK_NEAR(kiln_lowrank_energy(s, 3, 2), 13.0 / 14.0, 1e-12);
    CHECK_NEAR(kiln_lowrank_energy(s, 3, 3), 1.0, 1e-12);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 0.5), 1);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 9.0 / 14.0), 1); /* exactly reached */
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 0.7), 2);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 0.95), 3);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, 3, 1.0), 3);
    const float zero[2] = {0.0f, 0.0f};
    CHECK_NEAR(kiln_lowrank_energy(zero, 2, 1), 1.0, 0.0);
    CHECK_INT_EQ(kiln_lowrank_rank_for_energy(zero, 2, 1.0), 1);
}

static void test_kinds_parse(void) {
    int want[4];
    CHECK_OK(kiln_lowrank_kinds_parse("fc,fcproj", want));
    CHECK_TRUE(!want[0] && !want[1] && want[2] && want[3]);
    CHECK_OK(kiln_lowrank_kinds_parse("attproj,qkv,fcproj,fc", want));
    CHECK_TRUE(want[0] && want[1] && want[2] && want[3]);
    CHECK_STATUS(kiln_lowrank_kinds_parse("fc,mlp", want), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_kinds_parse("fc,fc", want), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_kinds_parse("", want), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_kinds_parse("fc,", want), KILN_ERR_ARG);
    CHECK_STR_EQ(kiln_lowrank_kind_name(KILN_GPT_MATRIX_FCPROJ), "fcproj");
    CHECK_TRUE(kiln_lowrank_kind_name(KILN_GPT_MATRIX_HEAD) == NULL);
}

/* A matrix of rank 3 (plus nothing): its SVD has three values above noise, the factors of
 * rank 3 give it back, and of rank k (the full SVD) too; the values decrease. Both shapes,
 * wide and tall. */
static void test_svd(void) {
    for (int tall = 0; tall < 2; tall++) {
        int64_t K = tall ? 40 : 12, N = tall ? 9 : 30, r0 = 3, k = K < N ? K : N;
        float *A = malloc((size_t)(K * r0) * sizeof *A),
              *Bm = malloc((size_t)(r0 * N) * sizeof *Bm);
        float *w = malloc((size_t)(K * N) * sizeof *w), *w2 = malloc((size_t)(K * N) * sizeof *w2);
        float *s = malloc((size_t)k * sizeof *s), *u = malloc((size_t)(K * k) * sizeof *u);
        float *vt = malloc((size_t)(k * N) * sizeof *vt);
        float *U = malloc((size_t)(K * k) * sizeof *U), *V = malloc((size_t)(k * N) * sizeof *V);
        srand(7 + tall);
        for (int64_t i = 0; i < K * r0; i++)
            A[i] = frand();
        for (int64_t i = 0; i < r0 * N; i++)
            Bm[i] = frand();
        product(w, A, Bm, K, N, r0);
        CHECK_OK(kiln_lowrank_svd(w, K, N, s, u, vt));
        for (int64_t i = 1; i < k; i++)
            CHECK_TRUE(s[i] <= s[i - 1]);
        CHECK_TRUE(s[2] > 1e-2f);
        CHECK_TRUE(s[3] < 1e-5f * s[0]);
        CHECK_INT_EQ(kiln_lowrank_rank_for_energy(s, k, 0.999999), 3);
        kiln_lowrank_split(U, V, u, s, vt, K, N, k, 3);
        product(w2, U, V, K, N, 3);
        CHECK_NEAR(max_diff(w, w2, K * N), 0.0, 1e-5);
        kiln_lowrank_split(U, V, u, s, vt, K, N, k, k);
        product(w2, U, V, K, N, k);
        CHECK_NEAR(max_diff(w, w2, K * N), 0.0, 1e-5);
        /* balanced: the factors' columns and rows carry the same norm, sqrt(s) */
        double nu = 0.0, nv = 0.0;
        for (int64_t i = 0; i < K; i++)
            nu += (double)U[i * k] * U[i * k];
        for (int64_t c = 0; c < N; c++)
            nv += (double)V[c] * V[c];
        CHECK_NEAR(nu, nv, 1e-4 * nu);
        /* one rank fewer loses exactly the energy of the dropped value */
        kiln_lowrank_split(U, V, u, s, vt, K, N, k, 2);
        product(w2, U, V, K, N, 2);
        double err = 0.0, tot = 0.0;
        for (int64_t i = 0; i < K * N; i++) {
            err += ((double)w[i] - w2[i]) * ((double)w[i] - w2[i]);
            tot += (double)w[i] * w[i];
        }
        CHECK_NEAR(err / tot, 1.0 - kiln_lowrank_energy(s, k, 2), 1e-4);
        w[5] = NAN;
        CHECK_STATUS(kiln_lowrank_svd(w, K, N, s, u, vt), KILN_ERR_RANGE);
        free(A), free(Bm), free(w), free(w2), free(s), free(u), free(vt), free(U), free(V);
    }
}

/* ---- factored models ---- */

static kiln_gpt_config tiny_cfg(int64_t r0, int64_t r1, int64_t r2, int64_t r3) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.vocab_size = 24;
    c.max_seq_len = 8;
    c.rank[0] = r0, c.rank[1] = r1, c.rank[2] = r2, c.rank[3] = r3;
    return c;
}

static const char *const kind_names[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

static const kiln_tensor_info *named(const kiln_gpt *m, int layer, const char *name,
                                     const char *suffix) {
    char full[64];
    snprintf(full, sizeof full, "h.%d.%s%s", layer, name, suffix);
    return kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, full));
}

/* dense's weights from factored's: the same tensors copied, W = U V for each factored one */
static void densify(kiln_gpt *dense, kiln_gpt *f) {
    float *wd = kiln_gpt_params(dense);
    const float *wf = kiln_gpt_params(f);
    for (int i = 0; i < kiln_gpt_num_tensors(dense); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(dense, i);
        int j = kiln_gpt_find_tensor(f, t->name);
        if (j >= 0) {
            memcpy(wd + t->offset, wf + kiln_gpt_tensor(f, j)->offset,
                   (size_t)t->numel * sizeof *wd);
            continue;
        }
        char base[64];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
        const kiln_tensor_info *u = named(f, t->layer, strchr(base + 2, '.') + 1, ".weight_u");
        const kiln_tensor_info *v = named(f, t->layer, strchr(base + 2, '.') + 1, ".weight_v");
        CHECK_TRUE(u && v);
        if (u && v)
            product(wd + t->offset, wf + u->offset, wf + v->offset, t->shape[0], t->shape[1],
                    u->shape[1]);
    }
}

static void batch(int32_t *in, int32_t *tg, int n) {
    for (int i = 0; i < n; i++) {
        in[i] = (i * 5 + 2) % 24;
        tg[i] = (i * 7 + 1) % 24;
    }
}

static void test_factored_layout(void) {
    kiln_gpt_config c = tiny_cfg(3, 0, 5, 6), d = tiny_cfg(0, 0, 0, 0);
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 5, NULL, NULL));
    if (!m)
        return;
    CHECK_INT_EQ(kiln_gpt_num_tensors(m), 2 + 15 * 2 + 2);
    const kiln_tensor_info *u = named(m, 1, "mlp.c_fc", ".weight_u");
    const kiln_tensor_info *v = named(m, 1, "mlp.c_fc", ".weight_v");
    CHECK_TRUE(u && v && !named(m, 1, "mlp.c_fc", ".weight"));
    if (u && v) {
        CHECK_INT_EQ(u->shape[0], 16);
        CHECK_INT_EQ(u->shape[1], 5);
        CHECK_INT_EQ(v->shape[0], 5);
        CHECK_INT_EQ(v->shape[1], 64);
        CHECK_INT_EQ(v->offset, u->offset + u->numel); /* U then V */
    }
    CHECK_TRUE(named(m, 0, "attn.c_proj", ".weight") != NULL);
    /* parameters: each factored kind r (in + out) instead of in x out, per block */
    int64_t saved = 2 * ((16 * 48 - 3 * 64) + (16 * 64 - 5 * 80) + (64 * 16 - 6 * 80));
    CHECK_INT_EQ(kiln_gpt_config_num_params(&d) - kiln_gpt_config_num_params(&c), saved);
    CHECK_INT_EQ(kiln_gpt_slab_len(m),
                 kiln_gpt_config_num_params(&c) + (c.padded_vocab_size - c.vocab_size) * 16);
    CHECK_NEAR(kiln_gpt_flops_per_token(&d, 5) - kiln_gpt_flops_per_token(&c, 5), 6.0 * saved,
               1e-6);
    /* backward's ranges cover the slab once, a block each */
    int64_t lo[8], hi[8];
    int n = kiln_gpt_grad_ranges(m, lo, hi, 8);
    CHECK_INT_EQ(n, 4);
    CHECK_INT_EQ(hi[0], kiln_gpt_slab_len(m));
    for (int i = 1; i < n; i++)
        CHECK_INT_EQ(hi[i], lo[i - 1]);
    CHECK_INT_EQ(lo[n - 1], 0);
    CHECK_INT_EQ(lo[2], named(m, 0, "ln_1", ".weight")->offset);
    CHECK_INT_EQ(lo[1], named(m, 1, "ln_1", ".weight")->offset);
    /* the factors' product starts as the dense matrix would: N(0, 0.02) */
    kiln_gpt_init_weights(m, 11);
    if (u && v) {
        float w[16 * 64];
        product(w, (float *)kiln_gpt_params(m) + u->offset, (float *)kiln_gpt_params(m) + v->offset,
                16, 64, 5);
        double ss = 0.0;
        for (int i = 0; i < 16 * 64; i++)
            ss += (double)w[i] * w[i];
        double sd = sqrt(ss / (16 * 64));
        CHECK_TRUE(sd > 0.01 && sd < 0.03);
    }
    /* ranks outside 0..min(in, out) */
    kiln_gpt_config bad = tiny_cfg(0, 17, 0, 0);
    CHECK_STATUS(kiln_gpt_config_validate(&bad), KILN_ERR_CONFIG);
    bad = tiny_cfg(-1, 0, 0, 0);
    CHECK_STATUS(kiln_gpt_config_validate(&bad), KILN_ERR_CONFIG);
    kiln_gpt_free(m);
}

/* A factored model computes the loss of the dense model whose W = U V, and its factors'
 * gradients are the chain rule's through W: dU = dW V^T, dV = U^T dW; every other gradient is
 * the dense model's. In every recompute mode. */
static void test_factored_equals_dense(void) {
    kiln_recompute modes[] = {KILN_RECOMPUTE_NONE, KILN_RECOMPUTE_GELU, KILN_RECOMPUTE_BLOCK};
    for (int mi = 0; mi < 4; mi++) {
        kiln_gpt_config cf = tiny_cfg(3, 4, 5, 6), cd = tiny_cfg(0, 0, 0, 0);
        if (mi == 3) { /* narrower heads and MLP: (16,24), (8,16), (16,40), (40,16) */
            cf.head_size = cd.head_size = 4;
            cf.mlp_hidden = cd.mlp_hidden = 40;
        }
        kiln_gpt_options o = kiln_gpt_options_default();
        o.recompute = modes[mi % 3];
        kiln_gpt *f = NULL, *d = NULL;
        CHECK_OK(kiln_gpt_create(&f, &cf, 2, 5, &o, NULL));
        CHECK_OK(kiln_gpt_create(&d, &cd, 2, 5, &o, NULL));
        if (!f || !d) {
            kiln_gpt_free(f), kiln_gpt_free(d);
            return;
        }
        kiln_gpt_init_weights(f, 3);
        densify(d, f);
        int32_t in[10], tg[10];
        batch(in, tg, 10);
        float lf = 0.0f, ld = 0.0f;
        kiln_gpt_zero_grad(f), kiln_gpt_zero_grad(d);
        CHECK_OK(kiln_gpt_forward_backward(f, in, tg, 2, 5, 1.0f, &lf));
        CHECK_OK(kiln_gpt_forward_backward(d, in, tg, 2, 5, 1.0f, &ld));
        CHECK_NEAR(lf, ld, 1e-5 * fabs(ld));
        const float *gf = kiln_gpt_grads(f), *gd = kiln_gpt_grads(d), *wf = kiln_gpt_params(f);
        /* the tensors both have */
        double worst = 0.0, scale = 0.0;
        for (int i = 0; i < kiln_gpt_num_tensors(d); i++) {
            const kiln_tensor_info *t = kiln_gpt_tensor(d, i);
            int j = kiln_gpt_find_tensor(f, t->name);
            for (int64_t e = 0; j >= 0 && e < t->numel; e++) {
                worst =
                    fmax(worst, fabs(gd[t->offset + e] - gf[kiln_gpt_tensor(f, j)->offset + e]));
                scale = fmax(scale, fabs(gd[t->offset + e]));
            }
        }
        CHECK_NEAR(worst, 0.0, 1e-4 * scale);
        /* the factors */
        for (int l = 0; l < 2; l++)
            for (int k = 0; k < 4; k++) {
                const kiln_tensor_info *tw = named(d, l, kind_names[k], ".weight");
                const kiln_tensor_info *tu = named(f, l, kind_names[k], ".weight_u");
                const kiln_tensor_info *tv = named(f, l, kind_names[k], ".weight_v");
                int64_t K = tw->shape[0], N = tw->shape[1], r = tu->shape[1];
                const float *dW = gd + tw->offset, *U = wf + tu->offset, *V = wf + tv->offset;
                double du = 0.0, dv = 0.0, su = 0.0, sv = 0.0;
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < r; j++) {
                        double want = 0.0; /* (dW V^T)[i][j] */
                        for (int64_t c = 0; c < N; c++)
                            want += (double)dW[i * N + c] * V[j * N + c];
                        du = fmax(du, fabs(want - gf[tu->offset + i * r + j]));
                        su = fmax(su, fabs(want));
                    }
                for (int64_t j = 0; j < r; j++)
                    for (int64_t c = 0; c < N; c++) {
                        double want = 0.0; /* (U^T dW)[j][c] */
                        for (int64_t i = 0; i < K; i++)
                            want += (double)U[i * r + j] * dW[i * N + c];
                        dv = fmax(dv, fabs(want - gf[tv->offset + j * N + c]));
                        sv = fmax(sv, fabs(want));
                    }
                CHECK_TRUE(su > 0.0 && sv > 0.0);
                CHECK_NEAR(du, 0.0, 1e-4 * su);
                CHECK_NEAR(dv, 0.0, 1e-4 * sv);
            }
        kiln_gpt_free(f), kiln_gpt_free(d);
    }
}

/* A loss at a training size: m's weights copied into a model of its configuration. */
static float loss_of(kiln_gpt *m) {
    kiln_gpt *t = NULL;
    float loss = 0.0f;
    CHECK_OK(kiln_gpt_create(&t, kiln_gpt_get_config(m), 2, 5, NULL, NULL));
    if (!t)
        return NAN;
    memcpy(kiln_gpt_params(t), kiln_gpt_params(m), (size_t)kiln_gpt_slab_len(m) * sizeof(float));
    int32_t in[10], tg[10];
    batch(in, tg, 10);
    CHECK_OK(kiln_gpt_forward(t, in, tg, 2, 5, &loss));
    kiln_gpt_free(t);
    return loss;
}

/* The SVD at energy 1 of a model whose matrices have rank 2 finds rank 2 and gives back the
 * dense model's loss; a lower energy, a lower rank; bad arguments refused. */
static void test_factor_full_energy(void) {
    kiln_gpt_config cd = tiny_cfg(0, 0, 0, 0);
    kiln_gpt *d = NULL, *f = NULL, *g = NULL;
    CHECK_OK(kiln_gpt_create_inference(&d, &cd, 2, 5, KILN_DTYPE_F32, NULL));
    if (!d)
        return;
    kiln_gpt_init_weights(d, 9);
    float *w = kiln_gpt_params(d);
    srand(5);
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 4; k++) {
            const kiln_tensor_info *t = named(d, l, kind_names[k], ".weight");
            int64_t K = t->shape[0], N = t->shape[1];
            float A[64 * 2], Bm[2 * 64];
            for (int64_t i = 0; i < K * 2; i++)
                A[i] = 0.3f * frand();
            for (int64_t i = 0; i < 2 * N; i++)
                Bm[i] = 0.3f * frand();
            product(w + t->offset, A, Bm, K, N, 2);
        }
    int all[4] = {1, 1, 1, 1}, mlp[4] = {0, 0, 1, 1};
    kiln_lowrank_report rep[4];
    CHECK_OK(kiln_lowrank_factor(d, all, 1.0, 0, &f, rep));
    if (!f) {
        kiln_gpt_free(d);
        return;
    }
    for (int k = 0; k < 4; k++) {
        CHECK_INT_EQ(kiln_gpt_get_config(f)->rank[k], 2);
        CHECK_INT_EQ(rep[k].rank, 2);
        CHECK_INT_EQ(rep[k].params_after, 2 * 2 * (rep[k].in + rep[k].out));
        CHECK_INT_EQ(rep[k].params_before, 2 * rep[k].in * rep[k].out);
        CHECK_TRUE(rep[k].energy_min > 1.0 - 1e-6 && rep[k].energy_mean <= 1.0 + 1e-9);
    }
    float ld = loss_of(d), lf = loss_of(f);
    CHECK_NEAR(lf, ld, 1e-5 * fabs(ld));
    /* an already factored model, bad energies and ranks */
    CHECK_STATUS(kiln_lowrank_factor(f, all, 1.0, 0, &g, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_factor(d, all, 0.0, 0, &g, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_factor(d, all, 1.5, 0, &g, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_factor(d, all, 1.0, 16, &g, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_lowrank_factor(d, all, 1.0, 12, &g, NULL), KILN_ERR_ARG); /* saves none */
    CHECK_TRUE(g == NULL);
    /* a fixed rank, the MLP only: attention stays as it was */
    CHECK_OK(kiln_lowrank_factor(d, mlp, 1.0, 1, &g, rep));
    if (g) {
        CHECK_INT_EQ(kiln_gpt_get_config(g)->rank[0], 0);
        CHECK_INT_EQ(kiln_gpt_get_config(g)->rank[2], 1);
        CHECK_INT_EQ(rep[0].rank, 0);
        CHECK_TRUE(rep[2].energy_min < 1.0);
        const kiln_tensor_info *a = named(d, 1, "attn.c_attn", ".weight");
        const kiln_tensor_info *b = named(g, 1, "attn.c_attn", ".weight");
        CHECK_TRUE(b && !memcmp((float *)kiln_gpt_params(g) + b->offset, w + a->offset,
                                (size_t)a->numel * sizeof(float)));
    }
    kiln_gpt_free(g);
    kiln_gpt_free(f);
    kiln_gpt_free(d);
}

/* Saved and loaded: the ranks come back from the tensors' shapes (and the metadata), the
 * MLP's width from its V factor, the weights whole. */
static void test_save_load(void) {
    kiln_gpt_config c = tiny_cfg(0, 4, 5, 0), got;
    c.mlp_hidden = 40;
    kiln_gpt *m = NULL, *n = NULL;
    CHECK_OK(kiln_gpt_create_inference(&m, &c, 1, 4, KILN_DTYPE_F32, NULL));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 2);
    const char *path = "test_lowrank.safetensors";
    CHECK_OK(kiln_gpt_save_safetensors(m, path, KILN_DTYPE_F32));
    memset(&got, 0, sizeof got);
    CHECK_OK(kiln_gpt_config_from_safetensors(&got, path));
    CHECK_INT_EQ(got.rank[0], 0);
    CHECK_INT_EQ(got.rank[1], 4);
    CHECK_INT_EQ(got.rank[2], 5);
    CHECK_INT_EQ(got.rank[3], 0);
    CHECK_INT_EQ(kiln_gpt_config_mlp_width(&got), 40);
    CHECK_OK(kiln_gpt_create_inference(&n, &got, 1, 4, KILN_DTYPE_F32, NULL));
    if (n) {
        CHECK_OK(kiln_gpt_load_safetensors(n, path));
        CHECK_INT_EQ(kiln_gpt_slab_len(n), kiln_gpt_slab_len(m));
        CHECK_TRUE(!memcmp(kiln_gpt_params(n), kiln_gpt_params(m),
                           (size_t)kiln_gpt_slab_len(m) * sizeof(float)));
    }
    /* a dense model does not take the factored file */
    kiln_gpt *d = NULL;
    kiln_gpt_config cd = tiny_cfg(0, 0, 0, 0);
    cd.mlp_hidden = 40;
    CHECK_OK(kiln_gpt_create_inference(&d, &cd, 1, 4, KILN_DTYPE_F32, NULL));
    if (d)
        CHECK_TRUE(kiln_gpt_load_safetensors(d, path) != KILN_OK);
    remove(path);
    kiln_gpt_free(d);
    kiln_gpt_free(n);
    kiln_gpt_free(m);
}

int main(void) {
    RUN_TEST(test_energy_rank);
    RUN_TEST(test_kinds_parse);
    RUN_TEST(test_svd);
    RUN_TEST(test_factored_layout);
    RUN_TEST(test_factored_equals_dense);
    RUN_TEST(test_factor_full_energy);
    RUN_TEST(test_save_load);
    TEST_MAIN_END();
}
