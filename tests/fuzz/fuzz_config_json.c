/* libFuzzer target for the model configuration JSON reader (kiln train --model FILE):
 * kiln_gpt_config_from_json. For any input: it fails with a message naming the file, or
 * gives a configuration that validates once a vocabulary is given (its own, or the data's
 * when it leaves vocab_size out). Kiln's own JSON and Hugging Face's config.json alike. */
#include "fuzz_file.h"

#include "kiln/core.h"
#include "kiln/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file f;
    fuzz_file_open(&f, data, size);
    kiln_gpt_config cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    kiln_gpt_config before = cfg;
    kiln_status s = kiln_gpt_config_from_json(&cfg, f.path);
    if (s != KILN_OK) {
        REQUIRE(s == KILN_ERR_CONFIG || s == KILN_ERR_RANGE || s == KILN_ERR_NOMEM ||
                s == KILN_ERR_UNSUPPORTED); /* a Hugging Face key kiln does not compute */
        REQUIRE(strstr(kiln_error_message(), f.path) != NULL);
        REQUIRE(memcmp(&cfg, &before, sizeof cfg) == 0); /* untouched */
    } else {
        REQUIRE(cfg.vocab_size >= 0);
        if (cfg.vocab_size == 0)
            cfg.vocab_size = 50257;
        REQUIRE(kiln_gpt_config_validate(&cfg) == KILN_OK);
    }
    fuzz_file_close(&f);
    return 0;
}
