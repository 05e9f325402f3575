/* libFuzzer target for the quantized model reader (kiln compress quantize's files), the path
 * kiln eval and kiln sample take: kiln_quant_probe, then kiln_quant_load.
 *
 * For any input: the load either fails, with a message and no model, or yields a model whose
 * forward over a few tokens runs; a dense load of the same file refuses it as quantized or
 * fails; memory taken stays within the file's size (the fuzzer's malloc limit traps a
 * configuration claimed far past what the file holds). Any broken promise traps. */
#include "fuzz_file.h"

#include <stdlib.h>

#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file f;
    fuzz_file_open(&f, data, size);
    kiln_quant_type type = KILN_QUANT_NONE;
    int64_t group = -1;
    kiln_status ps = kiln_quant_probe(f.path, &type, &group);
    kiln_gpt *m = (kiln_gpt *)&f; /* must come back NULL on failure */
    kiln_status s = kiln_quant_load(&m, f.path, 1, 4);
    if (s != KILN_OK) {
        REQUIRE(m == NULL);
        REQUIRE(s != KILN_ERR_ARG);
        REQUIRE(kiln_error_message()[0] != '\0');
        fuzz_file_close(&f);
        return 0;
    }
    REQUIRE(ps == KILN_OK && type != KILN_QUANT_NONE);
    REQUIRE(type == KILN_QUANT_INT4 ? group >= 8 && group % 8 == 0 : group == 0);
    const kiln_gpt_config *cfg = kiln_gpt_get_config(m);
    int64_t T = cfg->max_seq_len < 4 ? cfg->max_seq_len : 4;
    int32_t ids[4];
    for (int64_t i = 0; i < T; i++)
        ids[i] = (int32_t)((i * 7 + 1) % cfg->vocab_size);
    REQUIRE(kiln_gpt_forward(m, ids, NULL, 1, T, NULL) == KILN_OK);
    float *logits = malloc((size_t)(T * cfg->padded_vocab_size) * sizeof *logits);
    REQUIRE(logits != NULL);
    REQUIRE(kiln_gpt_logits_f32(m, T, logits) == KILN_OK);
    free(logits);
    /* The dense loader refuses it, naming it quantized. */
    kiln_gpt_config dense;
    memset(&dense, 0, sizeof dense);
    REQUIRE(kiln_gpt_config_from_safetensors(&dense, f.path) == KILN_ERR_UNSUPPORTED);
    kiln_gpt_free(m);
    fuzz_file_close(&f);
    return 0;
}
