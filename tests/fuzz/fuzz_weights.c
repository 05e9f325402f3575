/* libFuzzer target for dense model weights, the path the tools take to load a model from a
 * safetensors file: kiln_gpt_config_from_safetensors (the configuration from kiln's metadata
 * or inferred from the tensors), a model of that configuration, kiln_gpt_load_safetensors
 * into it, and kiln_gpt_load_slab into a bf16 slab.
 *
 * For any input: each step either fails with a message or succeeds; a load that fails leaves
 * the parameters as they were (the whole file is checked before anything is copied); a model
 * that loads runs a forward over a few tokens; memory taken stays within the file's size (the
 * fuzzer's malloc limit traps a configuration claimed far past what the file holds). */
#include "fuzz_file.h"

#include <stdlib.h>

#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "kiln/model.h"

static void load_bf16(kiln_gpt *m, const char *path) {
    size_t n = (size_t)kiln_gpt_slab_len(m);
    uint16_t *slab = malloc(n * sizeof *slab + 1);
    REQUIRE(slab != NULL);
    memset(slab, 0xa5, n * sizeof *slab);
    kiln_status s = kiln_gpt_load_slab(m, path, slab, KILN_DTYPE_BF16);
    if (s != KILN_OK) {
        REQUIRE(kiln_error_message()[0] != '\0');
        for (size_t i = 0; i < n; i++)
            REQUIRE(slab[i] == 0xa5a5);
    }
    free(slab);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file f;
    fuzz_file_open(&f, data, size);
    kiln_gpt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_head = size % 3 == 0 ? 2 : 0; /* a caller's head count, or GPT-2's rule */
    kiln_status s = kiln_gpt_config_from_safetensors(&cfg, f.path);
    if (s != KILN_OK) {
        REQUIRE(s != KILN_ERR_ARG);
        REQUIRE(kiln_error_message()[0] != '\0');
        fuzz_file_close(&f);
        return 0;
    }
    REQUIRE(kiln_gpt_config_validate(&cfg) == KILN_OK);
    int64_t T = cfg.max_seq_len < 4 ? cfg.max_seq_len : 4;
    kiln_gpt *m = NULL;
    s = kiln_gpt_create_inference(&m, &cfg, 1, T, KILN_DTYPE_F32, NULL);
    REQUIRE(s == KILN_OK);
    size_t n = (size_t)kiln_gpt_slab_len(m);
    float *params = kiln_gpt_params(m);
    for (size_t i = 0; i < n; i++)
        params[i] = 0.25f;
    s = kiln_gpt_load_safetensors(m, f.path);
    if (s != KILN_OK) {
        REQUIRE(kiln_error_message()[0] != '\0');
        for (size_t i = 0; i < n; i++)
            REQUIRE(params[i] == 0.25f);
    } else {
        int32_t ids[4];
        for (int64_t i = 0; i < T; i++)
            ids[i] = (int32_t)((i * 5 + 3) % cfg.vocab_size);
        REQUIRE(kiln_gpt_forward(m, ids, NULL, 1, T, NULL) == KILN_OK);
    }
    load_bf16(m, f.path);
    kiln_gpt_free(m);
    fuzz_file_close(&f);
    return 0;
}
