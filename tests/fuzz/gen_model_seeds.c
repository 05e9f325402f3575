/* Writes the seed corpora of the model-file fuzzers into a folder, with kiln's own writers,
 * from tiny models (n_embd 32, vocabulary 64, context 16):
 *   gen_model_seeds quant DIR    int8 and int4 files (kiln_quant_save), shared layers too
 *   gen_model_seeds weights DIR  dense files (kiln_gpt_save_safetensors) in fp32, bf16 and
 *                                fp16, with shared layers, and a Hugging Face style file
 *                                without kiln's metadata (prefix, lm_head, mask buffers)
 *   gen_model_seeds config DIR   model configuration JSON files */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/safetensors.h"

static const char *out_dir;
static int failed;

static void check(kiln_status s, const char *what) {
    if (s != KILN_OK) {
        fprintf(stderr, "gen_model_seeds: %s: %s\n", what, kiln_error_message());
        failed = 1;
    }
}

static kiln_gpt *tiny(int64_t L, int64_t share, uint64_t seed) {
    kiln_gpt_config c = {.max_seq_len = 16,
                         .vocab_size = 64,
                         .n_layer = L,
                         .n_head = 2,
                         .n_embd = 32,
                         .share_layers = share};
    kiln_gpt *m = NULL;
    check(kiln_gpt_config_validate(&c), "config");
    check(kiln_gpt_create_inference(&m, &c, 1, 16, KILN_DTYPE_F32, NULL), "model");
    if (m)
        kiln_gpt_init_weights(m, seed);
    return m;
}

static void path_of(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", out_dir, name);
}

static void quant(void) {
    char p[1024];
    kiln_gpt *m1 = tiny(1, 0, 1), *m2 = tiny(2, 0, 2), *ms = tiny(2, 2, 3);
    if (!m1 || !m2 || !ms)
        return;
    path_of(p, sizeof p, "int8_l1.safetensors");
    check(kiln_quant_save(m1, KILN_QUANT_INT8, 0, p), p);
    path_of(p, sizeof p, "int8_l2.safetensors");
    check(kiln_quant_save(m2, KILN_QUANT_INT8, 0, p), p);
    path_of(p, sizeof p, "int8_shared.safetensors");
    check(kiln_quant_save(ms, KILN_QUANT_INT8, 0, p), p);
    path_of(p, sizeof p, "int4_g8.safetensors");
    check(kiln_quant_save(m1, KILN_QUANT_INT4, 8, p), p);
    path_of(p, sizeof p, "int4_g32_l2.safetensors");
    check(kiln_quant_save(m2, KILN_QUANT_INT4, 32, p), p);
    path_of(p, sizeof p, "int4_shared.safetensors");
    check(kiln_quant_save(ms, KILN_QUANT_INT4, 16, p), p);
    kiln_gpt_free(m1);
    kiln_gpt_free(m2);
    kiln_gpt_free(ms);
}

/* Hugging Face's layout: "transformer." names, no kiln metadata, an lm_head.weight copy of
 * wte and the attention mask buffers. */
static void hf_style(kiln_gpt *m, const char *name) {
    char p[1024], full[160];
    float *slab = kiln_gpt_params(m);
    kiln_safetensors_writer *w = NULL;
    check(kiln_safetensors_writer_init(&w), "writer");
    if (!w)
        return;
    check(kiln_safetensors_writer_set_metadata(w, "format", "pt"), "metadata");
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        snprintf(full, sizeof full, "transformer.%s", t->name);
        check(kiln_safetensors_writer_add(w, full, KILN_ST_DTYPE_F32, t->ndim, t->shape,
                                          slab + t->offset),
              full);
        if (!strcmp(t->name, "wte.weight"))
            check(kiln_safetensors_writer_add(w, "lm_head.weight", KILN_ST_DTYPE_F32, t->ndim,
                                              t->shape, slab + t->offset),
                  "lm_head");
    }
    static float mask[16 * 16];
    for (int i = 0; i < 16 * 16; i++)
        mask[i] = (float)(i % 16 <= i / 16);
    const int64_t shape[4] = {1, 1, 16, 16};
    check(kiln_safetensors_writer_add(w, "transformer.h.0.attn.bias", KILN_ST_DTYPE_F32, 4, shape,
                                      mask),
          "mask");
    path_of(p, sizeof p, name);
    check(kiln_safetensors_writer_write(w, p), p);
    kiln_safetensors_writer_free(w);
}

static void weights(void) {
    char p[1024];
    kiln_gpt *m1 = tiny(1, 0, 4), *m2 = tiny(2, 0, 5), *ms = tiny(2, 2, 6);
    if (!m1 || !m2 || !ms)
        return;
    path_of(p, sizeof p, "f32_l1.safetensors");
    check(kiln_gpt_save_safetensors(m1, p, KILN_DTYPE_F32), p);
    path_of(p, sizeof p, "bf16_l2.safetensors");
    check(kiln_gpt_save_safetensors(m2, p, KILN_DTYPE_BF16), p);
    path_of(p, sizeof p, "f16_l1.safetensors");
    check(kiln_gpt_save_safetensors(m1, p, KILN_DTYPE_F16), p);
    path_of(p, sizeof p, "bf16_shared.safetensors");
    check(kiln_gpt_save_safetensors(ms, p, KILN_DTYPE_BF16), p);
    hf_style(m1, "hf_l1.safetensors");
    kiln_gpt_free(m1);
    kiln_gpt_free(m2);
    kiln_gpt_free(ms);
}

static void config(void) {
    static const char *const seeds[] = {
        "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 64, \"max_seq_len\": 16}",
        "{\"n_layer\": 12, \"n_head\": 12, \"n_embd\": 768, \"n_positions\": 1024}",
        ("{\"n_layer\": 4, \"n_head\": 4, \"n_embd\": 128, \"max_seq_len\": 256, "
         "\"vocab_size\": 0, \"share_layers\": 2}"),
        "{\"n_layer\": 1e3, \"n_head\": -1, \"n_embd\": 3.5, \"max_seq_len\": \"16\"}",
        "[1, 2, {\"n_layer\": null}]",
        ("{\"family\": \"llama\", \"n_layer\": 2, \"n_head\": 4, \"n_kv_head\": 2, "
         "\"n_embd\": 32, \"max_seq_len\": 16, \"mlp_hidden\": 40, \"norm_eps\": 1e-6, "
         "\"rope_theta\": 500000, \"untied_head\": true}"),
        ("{\"model_type\": \"llama\", \"hidden_size\": 576, \"intermediate_size\": 1536, "
         "\"num_hidden_layers\": 30, \"num_attention_heads\": 9, \"num_key_value_heads\": 3, "
         "\"rms_norm_eps\": 1e-05, \"rope_theta\": 100000, \"rope_scaling\": null, "
         "\"tie_word_embeddings\": true, \"vocab_size\": 49152, "
         "\"max_position_embeddings\": 8192, \"hidden_act\": \"silu\"}"),
        ("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, "
         "\"n_positions\": 16, \"activation_function\": \"gelu_new\", "
         "\"layer_norm_epsilon\": 1e-05, \"n_inner\": null}"),
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char p[1024], name[32];
        snprintf(name, sizeof name, "config%zu.json", i);
        path_of(p, sizeof p, name);
        FILE *fp = fopen(p, "wb");
        if (!fp || fputs(seeds[i], fp) < 0 || fclose(fp) != 0) {
            fprintf(stderr, "gen_model_seeds: cannot write %s\n", p);
            failed = 1;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gen_model_seeds quant|weights|config DIR\n");
        return 2;
    }
    out_dir = argv[2];
    if (!strcmp(argv[1], "quant"))
        quant();
    else if (!strcmp(argv[1], "weights"))
        weights();
    else if (!strcmp(argv[1], "config"))
        config();
    else {
        fprintf(stderr, "gen_model_seeds: unknown corpus %s\n", argv[1]);
        return 2;
    }
    return failed;
}
