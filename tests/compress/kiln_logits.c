/* kiln's logits of the last of some token ids, for the comparison with llama.cpp's (and of a
 * quantized model's with its dense model's):
 *   kiln_logits WEIGHTS IDS   (IDS: comma-separated; WEIGHTS dense or quantized)
 * prints {"logits": [...V numbers...]} on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/model.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: kiln_logits WEIGHTS IDS\n");
        return 2;
    }
    int32_t ids[4096];
    int64_t n = 0;
    for (char *p = argv[2]; *p && n < 4096;) {
        ids[n++] = (int32_t)strtol(p, &p, 10);
        if (*p == ',')
            p++;
    }
    kiln_gpt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    kiln_gpt *m = NULL;
    kiln_quant_type qt = KILN_QUANT_NONE;
    kiln_status s = kiln_quant_probe(argv[1], &qt, NULL);
    if (!s && qt != KILN_QUANT_NONE) {
        s = kiln_quant_load(&m, argv[1], 1, 0);
        if (!s) {
            cfg = *kiln_gpt_get_config(m);
            n = n > cfg.max_seq_len ? cfg.max_seq_len : n;
        }
    } else if (!s) {
        s = kiln_gpt_config_from_safetensors(&cfg, argv[1]);
        if (!s)
            s = kiln_gpt_config_validate(&cfg);
        if (!s && n > cfg.max_seq_len)
            n = cfg.max_seq_len;
        if (!s)
            s = kiln_gpt_create_inference(&m, &cfg, 1, n, KILN_DTYPE_F32, NULL);
        if (!s)
            s = kiln_gpt_load_safetensors(m, argv[1]);
    }
    if (!s)
        s = kiln_gpt_forward_last(m, ids, 1, n);
    float *logits = malloc((size_t)cfg.padded_vocab_size * sizeof *logits);
    if (!s && !logits)
        s = KILN_ERR_NOMEM;
    if (!s)
        s = kiln_gpt_logits_f32(m, 1, logits);
    if (s) {
        fprintf(stderr, "kiln_logits: %s: %s\n", kiln_status_str(s), kiln_error_message());
        return 1;
    }
    printf("{\"logits\": [");
    for (int64_t v = 0; v < cfg.vocab_size; v++)
        printf("%s%.9g", v ? ", " : "", logits[v]);
    printf("]}\n");
    free(logits);
    kiln_gpt_free(m);
    return 0;
}
