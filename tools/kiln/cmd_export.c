/* kiln export: a trained model in a format other runtimes load (GGUF: llama.cpp). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln export --weights W --out FILE [flags]\n\n"
    "Write a model and its tokenizer as a GGUF file that llama.cpp (and what runs on it)\n"
    "loads: llama.cpp's \"gpt2\" or \"llama\" architecture (the model's family), the matrices\n"
    "in --type f32, f16, q8_0 (8-bit blocks of 32 with an f16 scale) or q4_0 (4-bit blocks),\n"
    "norm weights and biases in f32. The tokenizer is the one the model was trained with (--tokenizer; by default\n"
    "chosen by the vocabulary size). The file is written whole or not at all.";

int cmd_export(int argc, char **argv) {
    const char *weights = "out/model.safetensors", *out = NULL, *format = "gguf";
    const char *type_name = "f16", *tokenizer = NULL, *name = NULL;
    int64_t heads = 0;
    const tool_flag flags[] = {
        {"weights", TOOL_FLAG_STRING, &weights, "model weights (safetensors)"},
        {"out", TOOL_FLAG_STRING, &out, "the file to write"},
        {"format", TOOL_FLAG_STRING, &format, "gguf"},
        {"type", TOOL_FLAG_STRING, &type_name, "f32, f16, q8_0 or q4_0"},
        {"tokenizer", TOOL_FLAG_STRING, &tokenizer,
         "gpt2, bytes or a tokenizer file (none: chosen by the vocabulary size)"},
        {"name", TOOL_FLAG_STRING, &name, "the model's name in the file (general.name)"},
        {"heads", TOOL_FLAG_INT, &heads, "head count, for weights without kiln metadata",
         TOOL_MIN(0)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    kiln_gguf_type type;
    kiln_status s = kiln_gguf_type_parse(type_name, &type);
    if (npos || !out || !out[0] || strcmp(format, "gguf") || s) {
        fprintf(stderr, "kiln export: --out FILE is required, --format must be gguf and --type "
                        "one of f32, f16, q8_0, q4_0 (see --help)\n");
        return 2;
    }
    if ((s = tool_refuse_same_file(weights, out)) != KILN_OK) {
        tool_report("export", s);
        return 2;
    }
    kiln_gpt *m = NULL;
    kiln_tokenizer *tok = NULL;
    s = tool_load_model(&m, weights, heads, 1, 1, KILN_DTYPE_F32);
    const char *spec = s ? NULL : tool_default_tokenizer(tokenizer, kiln_gpt_get_config(m)->vocab_size);
    if (!s && !spec)
        s = KILN_ERR_CONFIG;
    if (!s)
        s = tool_tokenizer_load(&tok, spec);
    if (!s)
        s = tool_make_parent_dirs(out);
    if (!s)
        s = kiln_export_gguf(m, tok, type, name, out);
    if (s)
        tool_report("export", s);
    else
        printf("exported %s as GGUF (%s) to %s\n", weights, kiln_gguf_type_name(type), out);
    kiln_tokenizer_free(tok);
    kiln_gpt_free(m);
    return s ? 1 : 0;
}
