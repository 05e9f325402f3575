/* The Llama family: its description and presets, Hugging Face config.json (and what is refused
 * by name), the tensor table in Hugging Face's names and layouts, gradients against finite
 * differences, the CPU backend against the reference in fp32 and bf16, generation's cache,
 * weights saved and loaded, and the gradient parts of data parallelism. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/safetensors.h"
#include "test.h"

/* A small Llama: 2 layers, 4 query heads of 8 over 2 key/value heads, MLP 40, V 61. */
static kiln_gpt_config small(int64_t kv, int untied) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 32;
    c.max_seq_len = 16;
    c.vocab_size = 61;
    kiln_gpt_config_family(&c, "llama");
    c.n_kv_head = kv;
    c.mlp_hidden = 40;
    c.norm_eps = 1e-6;
    c.rope_theta = 500.0; /* a small base: positions 0..15 turn the low channels far */
    c.untied_head = untied;
    return c;
}

static void fill_ids(int32_t *ids, int n, int64_t V, uint64_t seed) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(kiln_rng_u64(&r) % (uint64_t)V);
}

static const char *tmp_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/kiln_test_llama_%d_%s",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), name);
    return buf;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_presets_and_description(void) {
    kiln_gpt_config c;
    CHECK_OK(kiln_gpt_config_preset(&c, "llama-d6"));
    CHECK_INT_EQ(c.family, KILN_FAMILY_LLAMA);
    CHECK_INT_EQ(c.norm, KILN_NORM_RMSNORM);
    CHECK_INT_EQ(c.position, KILN_POSITION_ROPE);
    CHECK_INT_EQ(c.mlp, KILN_MLP_SWIGLU);
    CHECK_INT_EQ(kiln_gpt_config_kv_heads(&c), 3);
    CHECK_INT_EQ(kiln_gpt_config_qkv_width(&c), 192 + 2 * 96);
    kiln_gpt_config g;
    CHECK_OK(kiln_gpt_config_preset(&g, "d6"));
    /* the same shape within 2% of the parameters: comparable runs */
    double ratio = (double)kiln_gpt_config_num_params(&c) / (double)kiln_gpt_config_num_params(&g);
    CHECK_TRUE(ratio > 0.95 && ratio < 1.02);
    CHECK_OK(kiln_gpt_config_preset(&c, "smollm2-135m"));
    CHECK_INT_EQ(c.vocab_size, 49152);
    /* SmolLM2-135M: 134,515,008 parameters (tied) */
    CHECK_INT_EQ(kiln_gpt_config_num_params(&c), 134515008);
    /* a GPT-2 with a Llama's part is no description kiln runs */
    CHECK_OK(kiln_gpt_config_preset(&g, "d4"));
    g.norm = KILN_NORM_RMSNORM;
    CHECK_STATUS(kiln_gpt_config_validate(&g), KILN_ERR_CONFIG);
    kiln_gpt_config bad = small(3, 0);
    CHECK_STATUS(kiln_gpt_config_validate(&bad), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "n_kv_head 3 does not divide n_head 4") != NULL);
    bad = small(2, 0);
    bad.head_size = 7;
    CHECK_STATUS(kiln_gpt_config_validate(&bad), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "even head size") != NULL);
    bad = small(2, 0);
    bad.rank[0] = 4;
    CHECK_STATUS(kiln_gpt_config_validate(&bad), KILN_ERR_UNSUPPORTED);
    CHECK_STATUS(kiln_gpt_config_family(&bad, "mamba"), KILN_ERR_NOT_FOUND);
}

static void test_hf_config(void) {
    const char *p = tmp_path("config.json");
    write_text(p,
               "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\",\n"
               " \"hidden_size\": 576, \"intermediate_size\": 1536, \"num_hidden_layers\": 30,\n"
               " \"num_attention_heads\": 9, \"num_key_value_heads\": 3, \"rms_norm_eps\": 1e-05,\n"
               " \"rope_theta\": 100000, \"rope_scaling\": null, \"tie_word_embeddings\": true,\n"
               " \"vocab_size\": 49152, \"max_position_embeddings\": 8192,\n"
               " \"hidden_act\": \"silu\", \"attention_bias\": false, \"bos_token_id\": 0,\n"
               " \"torch_dtype\": \"bfloat16\", \"pretraining_tp\": 1}\n");
    kiln_gpt_config c, want;
    CHECK_OK(kiln_gpt_config_from_json(&c, p));
    CHECK_OK(kiln_gpt_config_preset(&want, "smollm2-135m"));
    CHECK_INT_EQ(c.n_layer, want.n_layer);
    CHECK_INT_EQ(kiln_gpt_config_kv_heads(&c), 3);
    CHECK_INT_EQ(kiln_gpt_config_mlp_width(&c), 1536);
    CHECK_INT_EQ(c.untied_head, 0);
    CHECK_NEAR(kiln_gpt_config_rope_theta(&c), 100000.0, 0);
    CHECK_INT_EQ(kiln_gpt_config_num_params(&c), kiln_gpt_config_num_params(&want));
    /* what changes the math and is not supported: refused by name */
    static const char *const refused[][2] = {
        {"\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling"},
        {"\"attention_bias\": true", "attention_bias"},
        {"\"mlp_bias\": true", "mlp_bias"},
        {"\"hidden_act\": \"gelu\"", "hidden_act"},
        {"\"attention_dropout\": 0.1", "attention_dropout"},
    };
    char text[1024];
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        snprintf(text, sizeof text,
                 "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, "
                 "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                 "\"max_position_embeddings\": 64, %s}",
                 refused[k][0]);
        write_text(p, text);
        CHECK_STATUS(kiln_gpt_config_from_json(&c, p), KILN_ERR_UNSUPPORTED);
        CHECK_TRUE(strstr(kiln_error_message(), refused[k][1]) != NULL);
    }
    write_text(p, "{\"model_type\": \"mistral\", \"hidden_size\": 64}");
    CHECK_STATUS(kiln_gpt_config_from_json(&c, p), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "mistral") != NULL);
    write_text(p, "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, "
                  "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                  "\"num_key_value_heads\": 3, \"max_position_embeddings\": 64}");
    CHECK_STATUS(kiln_gpt_config_from_json(&c, p), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "n_kv_head 3") != NULL);
    /* kiln's own JSON names the family */
    write_text(p,
               "{\"family\": \"llama\", \"n_layer\": 2, \"n_head\": 4, \"n_kv_head\": 1, "
               "\"n_embd\": 32, \"max_seq_len\": 16, \"mlp_hidden\": 40, \"untied_head\": true}");
    CHECK_OK(kiln_gpt_config_from_json(&c, p));
    CHECK_INT_EQ(c.family, KILN_FAMILY_LLAMA);
    CHECK_INT_EQ(kiln_gpt_config_kv_heads(&c), 1);
    CHECK_INT_EQ(c.untied_head, 1);
    unlink(p);
}

/* Hugging Face's names and (out, in) shapes; the tensors tile the slab; the parts of
 * backward's reports cover it once. */
static void test_layout(void) {
    kiln_gpt_config c = small(2, 1);
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 8, NULL, kiln_backend_ref()));
    if (!m)
        return;
    CHECK_INT_EQ(kiln_gpt_num_tensors(m), 1 + 9 * 2 + 2);
    const kiln_tensor_info *t =
        kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, "model.layers.1.self_attn.k_proj.weight"));
    CHECK_TRUE(t != NULL);
    if (t) {
        CHECK_INT_EQ(t->shape[0], 16); /* 2 kv heads of 8 */
        CHECK_INT_EQ(t->shape[1], 32);
    }
    t = kiln_gpt_tensor(m, kiln_gpt_find_tensor(m, "model.layers.0.mlp.down_proj.weight"));
    CHECK_TRUE(t && t->shape[0] == 32 && t->shape[1] == 40);
    CHECK_TRUE(kiln_gpt_find_tensor(m, "lm_head.weight") >= 0);
    CHECK_TRUE(kiln_gpt_find_tensor(m, "wpe.weight") < 0);
    int64_t sum = 0;
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++)
        sum += kiln_gpt_tensor(m, i)->numel;
    CHECK_INT_EQ(sum, kiln_gpt_config_num_params(&c));
    int64_t lo[8], hi[8], covered = 0;
    int n = kiln_gpt_grad_ranges(m, lo, hi, 8);
    CHECK_INT_EQ(n, 4);
    for (int i = 0; i < n; i++) {
        covered += hi[i] - lo[i];
        if (i)
            CHECK_INT_EQ(hi[i], lo[i - 1]);
    }
    CHECK_INT_EQ(covered, kiln_gpt_slab_len(m));
    kiln_gpt_free(m);
}

/* Directional finite differences of the loss, tensor by tensor, on the reference backend. */
static void check_gradients(kiln_gpt_config c, kiln_recompute rc) {
    kiln_gpt_options o = kiln_gpt_options_default();
    o.recompute = rc;
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 2, 7, &o, kiln_backend_ref()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 3);
    float *p = kiln_gpt_params(m);
    int64_t len = kiln_gpt_slab_len(m);
    kiln_rng r;
    kiln_rng_seed(&r, 4);
    for (int64_t k = 0; k < len; k++) /* larger than the init, and norms away from 1 */
        p[k] = p[k] * 2.0f + (float)(kiln_rng_uniform(&r) - 0.5) * 0.1f;
    int32_t in[14], tg[14];
    fill_ids(in, 14, c.vocab_size, 5);
    fill_ids(tg, 14, c.vocab_size, 6);
    float loss;
    kiln_gpt_zero_grad(m);
    CHECK_OK(kiln_gpt_forward(m, in, tg, 2, 7, &loss));
    CHECK_OK(kiln_gpt_backward(m, 1.0f));
    const float *g = kiln_gpt_grads(m);
    float *saved = malloc((size_t)len * sizeof(float)), *dir = malloc((size_t)len * sizeof(float));
    memcpy(saved, p, (size_t)len * sizeof(float));
    int bad = 0;
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
        kiln_gpt_forward(m, in, tg, 2, 7, &lp);
        for (int64_t k = 0; k < t->numel; k++)
            p[t->offset + k] = saved[t->offset + k] - (float)h * dir[k];
        kiln_gpt_forward(m, in, tg, 2, 7, &lm);
        memcpy(p + t->offset, saved + t->offset, (size_t)t->numel * sizeof(float));
        double fd = ((double)lp - (double)lm) / (2.0 * h);
        if (fabs(fd - analytic) > 0.02 * fmax(fabs(fd), fabs(analytic)) + 2e-3) {
            bad++;
            fprintf(stderr, "  %s: backward %.6g, differences %.6g\n", t->name, analytic, fd);
        }
    }
    CHECK_INT_EQ(bad, 0);
    free(saved);
    free(dir);
    kiln_gpt_free(m);
}

static void test_finite_differences(void) {
    check_gradients(small(2, 1), KILN_RECOMPUTE_NONE); /* grouped, untied */
    check_gradients(small(1, 0), KILN_RECOMPUTE_NONE); /* multi-query, tied */
    check_gradients(small(4, 0), KILN_RECOMPUTE_BLOCK);
}

/* One step's loss and gradients on the CPU backend against the reference: fp32 closely, bf16
 * within its rounding; every recompute mode gives the same as keeping everything. */
static void test_cpu_against_ref(void) {
    kiln_gpt_config c = small(2, 1);
    int32_t in[32], tg[32];
    fill_ids(in, 32, c.vocab_size, 8);
    fill_ids(tg, 32, c.vocab_size, 9);
    kiln_gpt *ref = NULL;
    CHECK_OK(kiln_gpt_create(&ref, &c, 2, 16, NULL, kiln_backend_ref()));
    if (!ref)
        return;
    kiln_gpt_init_weights(ref, 21);
    float lref;
    kiln_gpt_zero_grad(ref);
    CHECK_OK(kiln_gpt_forward_backward(ref, in, tg, 2, 16, 1.0f, &lref));
    int64_t n = kiln_gpt_slab_len(ref);
    for (int dt = 0; dt < 2; dt++)
        for (int rc = KILN_RECOMPUTE_NONE; rc <= KILN_RECOMPUTE_BLOCK; rc++) {
            kiln_gpt_options o = kiln_gpt_options_default();
            o.dtype = dt ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
            o.recompute = (kiln_recompute)rc;
            o.fuse_residual_ln = rc != KILN_RECOMPUTE_GELU; /* both paths of the norms */
            kiln_gpt *m = NULL;
            CHECK_OK(kiln_gpt_create(&m, &c, 2, 16, &o, kiln_backend_cpu()));
            if (!m)
                continue;
            kiln_gpt_init_weights(m, 21);
            float l;
            kiln_gpt_zero_grad(m);
            CHECK_OK(kiln_gpt_forward_backward(m, in, tg, 2, 16, 1.0f, &l));
            double tol = dt ? 3e-2 : 1e-5;
            CHECK_NEAR(l, lref, dt ? 1e-2 : 1e-6);
            double e = test_rel_err(kiln_gpt_grads(m), kiln_gpt_grads(ref), n);
            if (!(e < tol))
                fprintf(stderr, "  %s recompute %s: gradients' relative error %.3g\n",
                        dt ? "bf16" : "fp32", kiln_recompute_name((kiln_recompute)rc), e);
            CHECK_TRUE(e < tol);
            kiln_gpt_free(m);
        }
    kiln_gpt_free(ref);
}

/* Generation's cache: one position at a time gives the whole window's last logits. */
static void test_cache(void) {
    kiln_gpt_config c = small(1, 0);
    kiln_gpt *full = NULL, *cached = NULL;
    CHECK_OK(kiln_gpt_create_inference(&full, &c, 1, 16, KILN_DTYPE_F32, kiln_backend_cpu()));
    CHECK_OK(kiln_gpt_create_inference(&cached, &c, 1, 16, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (!full || !cached)
        return;
    kiln_gpt_init_weights(full, 5);
    kiln_gpt_init_weights(cached, 5);
    CHECK_OK(kiln_gpt_enable_cache(cached));
    int32_t ids[12];
    fill_ids(ids, 12, c.vocab_size, 3);
    int64_t Vp = kiln_gpt_get_config(full)->padded_vocab_size;
    float *a = malloc((size_t)Vp * sizeof(float)), *b = malloc((size_t)Vp * sizeof(float));
    double worst = 0.0;
    CHECK_OK(kiln_gpt_forward_cached(cached, ids, 1, 0, 5));
    for (int64_t t = 5; t <= 12; t++) {
        if (t > 5)
            CHECK_OK(kiln_gpt_forward_cached(cached, ids + t - 1, 1, t - 1, 1));
        CHECK_OK(kiln_gpt_forward_last(full, ids, 1, t));
        CHECK_OK(kiln_gpt_logits_f32(full, 1, a));
        CHECK_OK(kiln_gpt_logits_f32(cached, 1, b));
        double e = test_rel_err(b, a, c.vocab_size);
        worst = e > worst ? e : worst;
    }
    CHECK_TRUE(worst < 1e-5);
    free(a);
    free(b);
    kiln_gpt_free(full);
    kiln_gpt_free(cached);
}

/* Past the context (maxT W) the cache goes on a position at a time, every layer's attention
 * over the last W positions of that layer (a sliding window: through the layers a position
 * still sees further back, which a whole rerun of the last W tokens would cut off). With one
 * layer the two are the same computation, so a rerun of the last W tokens from position 0 is
 * the reference; with two, the reference backend's cache. 40 positions slide the cache's rows
 * to its front several times. A GPT-2's learned positions end at maxT. */
static double past_window(int64_t layers, kiln_backend *ref_be, int32_t *ids, int N, int W) {
    kiln_gpt_config c = small(2, 1);
    c.n_layer = layers;
    kiln_gpt *full = NULL, *cached = NULL;
    CHECK_OK(kiln_gpt_create_inference(&full, &c, 1, W, KILN_DTYPE_F32,
                                       ref_be ? ref_be : kiln_backend_cpu()));
    CHECK_OK(kiln_gpt_create_inference(&cached, &c, 1, W, KILN_DTYPE_F32, kiln_backend_cpu()));
    double worst = 1.0;
    float *a = NULL, *b = NULL;
    if (!full || !cached)
        goto done;
    int64_t Vp = kiln_gpt_get_config(full)->padded_vocab_size;
    a = malloc((size_t)Vp * sizeof(float));
    b = malloc((size_t)Vp * sizeof(float));
    if (!a || !b)
        goto done;
    kiln_gpt_init_weights(full, 7);
    kiln_gpt_init_weights(cached, 7);
    CHECK_OK(kiln_gpt_enable_cache(cached));
    if (ref_be)
        CHECK_OK(kiln_gpt_enable_cache(full));
    worst = 0.0;
    CHECK_OK(kiln_gpt_forward_cached(cached, ids, 1, 0, 3));
    if (ref_be)
        CHECK_OK(kiln_gpt_forward_cached(full, ids, 1, 0, 3));
    for (int64_t t = 4; t <= N; t++) {
        CHECK_OK(kiln_gpt_forward_cached(cached, ids + t - 1, 1, t - 1, 1));
        int64_t n = t < W ? t : W;
        if (ref_be)
            CHECK_OK(kiln_gpt_forward_cached(full, ids + t - 1, 1, t - 1, 1));
        else
            CHECK_OK(kiln_gpt_forward_last(full, ids + t - n, 1, n));
        CHECK_OK(kiln_gpt_logits_f32(full, 1, a));
        CHECK_OK(kiln_gpt_logits_f32(cached, 1, b));
        double e = test_rel_err(b, a, c.vocab_size);
        worst = e > worst ? e : worst;
    }
    /* past the window: one position at a time, after the last */
    CHECK_STATUS(kiln_gpt_forward_cached(cached, ids, 1, N, 2), KILN_ERR_ARG);
    CHECK_STATUS(kiln_gpt_forward_cached(cached, ids, 1, N - 1, 1), KILN_ERR_ARG);
    /* t0 0 starts afresh */
    CHECK_OK(kiln_gpt_forward_cached(cached, ids, 1, 0, W));
    CHECK_OK(kiln_gpt_forward_last(full, ids, 1, W));
    CHECK_OK(kiln_gpt_logits_f32(full, 1, a));
    CHECK_OK(kiln_gpt_logits_f32(cached, 1, b));
    CHECK_TRUE(test_rel_err(b, a, c.vocab_size) < 1e-5);
done:
    free(a);
    free(b);
    kiln_gpt_free(full);
    kiln_gpt_free(cached);
    return worst;
}

static void test_cache_past_window(void) {
    enum { W = 6, N = 40 };
    int32_t ids[N];
    fill_ids(ids, N, 61, 4);
    CHECK_TRUE(past_window(1, NULL, ids, N, W) < 1e-5);
    CHECK_TRUE(past_window(2, kiln_backend_ref(), ids, N, W) < 1e-5);
    /* the window matters with two layers: a rerun of the last W tokens differs */
    CHECK_TRUE(past_window(2, NULL, ids, N, W) > 1e-3);
    /* learned positions end at maxT */
    kiln_gpt_config g;
    memset(&g, 0, sizeof g);
    g.n_layer = 1;
    g.n_head = 2;
    g.n_embd = 16;
    g.max_seq_len = W;
    g.vocab_size = 61;
    kiln_gpt *gm = NULL;
    CHECK_OK(kiln_gpt_create_inference(&gm, &g, 1, W, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (gm) {
        kiln_gpt_init_weights(gm, 1);
        CHECK_OK(kiln_gpt_enable_cache(gm));
        CHECK_OK(kiln_gpt_forward_cached(gm, ids, 1, 0, W));
        CHECK_STATUS(kiln_gpt_forward_cached(gm, ids + W, 1, W, 1), KILN_ERR_ARG);
        kiln_gpt_free(gm);
    }
}

/* Saved weights carry the description and load back the same; a Hugging Face file (no kiln
 * metadata) takes its configuration from the config.json beside it; a file of another shape
 * is refused naming the tensor. */
static void test_save_load(void) {
    kiln_gpt_config c = small(2, 1);
    kiln_gpt *m = NULL, *back = NULL;
    CHECK_OK(kiln_gpt_create_inference(&m, &c, 1, 8, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 9);
    const char *st = tmp_path("w.safetensors");
    char path[512];
    snprintf(path, sizeof path, "%s", st);
    CHECK_OK(kiln_gpt_save_safetensors(m, path, KILN_DTYPE_F32));
    kiln_gpt_config fc;
    memset(&fc, 0, sizeof fc);
    CHECK_OK(kiln_gpt_config_from_safetensors(&fc, path));
    CHECK_TRUE(memcmp(&fc, kiln_gpt_get_config(m), sizeof fc) == 0);
    CHECK_OK(kiln_gpt_create_inference(&back, &fc, 1, 8, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (back) {
        CHECK_OK(kiln_gpt_load_safetensors(back, path));
        CHECK_TRUE(memcmp(kiln_gpt_params(back), kiln_gpt_params(m),
                          (size_t)kiln_gpt_slab_len(m) * sizeof(float)) == 0);
        kiln_gpt_free(back);
    }
    /* another model's weights: the tensor named */
    kiln_gpt_config other = small(4, 1);
    kiln_gpt *o = NULL;
    CHECK_OK(kiln_gpt_create_inference(&o, &other, 1, 8, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (o) {
        CHECK_STATUS(kiln_gpt_load_safetensors(o, path), KILN_ERR_SHAPE);
        CHECK_TRUE(strstr(kiln_error_message(), "k_proj.weight") != NULL);
        kiln_gpt_free(o);
    }
    unlink(path);
    kiln_gpt_free(m);
}

/* A Hugging Face folder: model.safetensors without kiln's metadata and config.json beside. */
static void test_hf_folder(void) {
    char dir[512], cfgp[600], st[600];
    snprintf(dir, sizeof dir, "%s", tmp_path("hf"));
    mkdir(dir, 0700);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    write_text(cfgp, "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 40,"
                     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                     " \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 500,"
                     " \"tie_word_embeddings\": false, \"vocab_size\": 61,"
                     " \"max_position_embeddings\": 16}");
    kiln_gpt_config c;
    CHECK_OK(kiln_gpt_config_from_json(&c, cfgp));
    kiln_gpt_config want = small(2, 1);
    CHECK_OK(kiln_gpt_config_validate(&want));
    CHECK_TRUE(memcmp(&c, &want, sizeof c) == 0);
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create_inference(&m, &c, 1, 8, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (m) {
        kiln_gpt_init_weights(m, 2);
        /* the tensors alone, as transformers writes them: no kiln.* metadata */
        kiln_safetensors_writer *w = NULL;
        CHECK_OK(kiln_safetensors_writer_init(&w));
        for (int i = 0; w && i < kiln_gpt_num_tensors(m); i++) {
            const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
            CHECK_OK(kiln_safetensors_writer_add_as(w, t->name, KILN_DTYPE_BF16, t->ndim, t->shape,
                                                    KILN_DTYPE_F32,
                                                    (const float *)kiln_gpt_params(m) + t->offset));
        }
        if (w)
            CHECK_OK(kiln_safetensors_writer_write(w, st));
        kiln_safetensors_writer_free(w);
        kiln_gpt_config fc;
        memset(&fc, 0, sizeof fc);
        CHECK_OK(kiln_gpt_config_from_safetensors(&fc, st));
        CHECK_TRUE(memcmp(&fc, &want, sizeof fc) == 0);
        kiln_gpt_free(m);
    }
    unlink(st);
    unlink(cfgp);
    /* no config.json: the error says where it looked */
    write_text(st, "");
    kiln_gpt_config fc;
    CHECK_TRUE(kiln_gpt_config_from_safetensors(&fc, st) != KILN_OK);
    unlink(st);
    rmdir(dir);
}

static void no_products(void *ctx, int64_t layer, kiln_gpt_matrix which, float *out,
                        const float *inp, const float *bias, int64_t N, int64_t C, int64_t OC) {
    (void)ctx, (void)layer, (void)which, (void)inp, (void)bias, (void)C;
    memset(out, 0, (size_t)(N * OC) * sizeof *out);
}

/* Features built for GPT-2 only say so instead of doing something else. */
static void test_gpt2_only_features(void) {
    kiln_gpt_config c = small(2, 0);
    CHECK_OK(kiln_gpt_config_validate(&c));
    CHECK_STATUS(kiln_gpt_require_family(&c, KILN_FAMILY_GPT2, "structured pruning"),
                 KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(),
                      "structured pruning is for gpt2 models; this one is a llama") != NULL);
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create_inference(&m, &c, 1, 8, KILN_DTYPE_F32, kiln_backend_cpu()));
    if (m) { /* a quantized model's products read GPT-2's matrices */
        CHECK_STATUS(kiln_gpt_set_linear(m, no_products, NULL, NULL), KILN_ERR_UNSUPPORTED);
        CHECK_TRUE(!kiln_gpt_has_linear(m));
        kiln_gpt_free(m);
    }
}

int main(void) {
    RUN_TEST(test_presets_and_description);
    RUN_TEST(test_hf_config);
    RUN_TEST(test_layout);
    RUN_TEST(test_finite_differences);
    RUN_TEST(test_cpu_against_ref);
    RUN_TEST(test_cache);
    RUN_TEST(test_cache_past_window);
    RUN_TEST(test_save_load);
    RUN_TEST(test_hf_folder);
    RUN_TEST(test_gpt2_only_features);
    TEST_MAIN_END();
}
