/* kiln compress: smaller models for kiln's own inference (kiln compress quantize). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln compress quantize --weights W --out Q [--type int8|int4] [--group 32]\n"
    "       kiln compress prune --weights W --out P [--heads F] [--mlp F] (see prune --help)\n"
    "       kiln compress lowrank --help   (low-rank factorisation)\n\n"
    "Post-training quantization for kiln eval and kiln sample. The matrices of the blocks and\n"
    "the tied embedding/head become int8 (--type int8: one scale per output channel) or int4\n"
    "(--type int4: one scale per --group inputs of an output channel, the group a multiple of\n"
    "8 that divides n_embd); biases, LayerNorms and the position embedding stay fp32. kiln\n"
    "eval --weights Q and kiln sample --weights Q then run those products with integer\n"
    "arithmetic (AVX512-VNNI where the CPU has it), the activations quantized per token. The\n"
    "file is safetensors, written whole or not at all; kiln train and kiln export refuse it.";

int cmd_compress(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "prune"))
        return cmd_compress_prune(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "lowrank") == 0)
        return cmd_compress_lowrank(argc - 1, argv + 1);
    const char *weights = NULL, *out = NULL, *type_name = "int8";
    int64_t group = 32, heads = 0;
    const tool_flag flags[] = {
        {"weights", TOOL_FLAG_STRING, &weights, "the dense model (safetensors)"},
        {"out", TOOL_FLAG_STRING, &out, "the quantized file to write"},
        {"type", TOOL_FLAG_STRING, &type_name, "int8 or int4"},
        {"group", TOOL_FLAG_INT, &group,
         "int4: inputs per scale (a multiple of 8 dividing n_embd)"},
        {"heads", TOOL_FLAG_INT, &heads, "head count, for weights without kiln metadata",
         TOOL_MIN(0)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos != 1 || strcmp(argv[1], "quantize") != 0) {
        fprintf(stderr, "kiln compress: the actions are 'quantize', 'prune' and 'lowrank' (see "
                        "--help)\n");
        return 2;
    }
    kiln_quant_type type;
    kiln_status s = kiln_quant_type_parse(type_name, &type);
    if (s) {
        tool_report("compress", s);
        return 2;
    }
    if (!weights || !weights[0] || !out || !out[0]) {
        fprintf(stderr, "kiln compress quantize: --weights W and --out Q are required\n");
        return 2;
    }
    if (type == KILN_QUANT_INT4 && (group < 8 || group > 4096 || group % 8)) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)group);
        return tool_flag_refuse("kiln compress quantize", "group", v,
                                "a multiple of 8 from 8 to 4096 (with --type int4)");
    }
    if ((s = tool_refuse_same_file(weights, out)) != KILN_OK) {
        tool_report("compress", s);
        return 2;
    }
    kiln_quant_type already = KILN_QUANT_NONE;
    s = kiln_quant_probe(weights, &already, NULL);
    if (!s && already != KILN_QUANT_NONE)
        s = kiln_error_setf(KILN_ERR_ARG,
                            "%s is quantized already (%s): quantize the dense "
                            "weights it was made from",
                            weights, kiln_quant_type_name(already));
    kiln_gpt *m = NULL;
    if (!s)
        s = tool_load_model(&m, weights, heads, 1, 1, KILN_DTYPE_F32);
    if (!s)
        s = tool_make_parent_dirs(out);
    if (!s)
        s = kiln_quant_save(m, type, type == KILN_QUANT_INT4 ? group : 0, out);
    kiln_gpt_free(m);
    if (s) {
        tool_report("compress", s);
        return 1;
    }
    printf("quantized %s to %s (%s", weights, out, kiln_quant_type_name(type));
    if (type == KILN_QUANT_INT4)
        printf(", groups of %lld", (long long)group);
    printf(")\n");
    return 0;
}
