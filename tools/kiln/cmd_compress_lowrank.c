/* kiln compress lowrank: the blocks' matrices as products of two thin factors. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln compress lowrank --weights W --out F (--energy E | --rank R)\n"
    "                             [--matrices qkv,attproj,fc,fcproj]\n\n"
    "Low-rank factorisation: each listed kind of block matrix W (in, out) becomes U (in, r) x\n"
    "V (r, out) from its truncated SVD (U = U_r sqrt(S_r), V = sqrt(S_r) V_r^T), r (in + out)\n"
    "weights instead of in x out. --energy E keeps, in every layer, at least the fraction E\n"
    "(0 < E <= 1) of the squared singular values: the kind's rank is the largest any layer\n"
    "needs. --rank R fixes it instead (1 <= R < min(in, out)). A rank that would not save\n"
    "weights is refused. The kinds: qkv (attn.c_attn), attproj (attn.c_proj), fc (mlp.c_fc),\n"
    "fcproj (mlp.c_proj). The file is safetensors (\"<name>.weight_u\", \"<name>.weight_v\"\n"
    "for each factored matrix, the ranks in kiln's metadata), written whole or not at all;\n"
    "kiln eval, kiln sample and kiln train --init take it (fine-tuning trains the factors).";

static void print_report(const kiln_lowrank_report *rep, int64_t before, int64_t after) {
    for (int k = 0; k < 4; k++) {
        const kiln_lowrank_report *r = &rep[k];
        const char *name = kiln_lowrank_kind_name((kiln_gpt_matrix)k);
        if (!r->rank) {
            printf("  %-8s dense (%lld, %lld)\n", name, (long long)r->in, (long long)r->out);
            continue;
        }
        printf("  %-8s rank %lld of %lld  energy kept per layer min %.4f mean %.4f  "
               "params %lld -> %lld (%.1f%%)\n",
               name, (long long)r->rank, (long long)(r->in < r->out ? r->in : r->out),
               r->energy_min, r->energy_mean, (long long)r->params_before,
               (long long)r->params_after,
               100.0 * (double)r->params_after / (double)r->params_before);
    }
    printf("  model    params %lld -> %lld (%.1f%%)\n", (long long)before, (long long)after,
           100.0 * (double)after / (double)before);
}

int cmd_compress_lowrank(int argc, char **argv) {
    const char *weights = NULL, *out = NULL, *matrices = "qkv,attproj,fc,fcproj";
    double energy = -1.0; /* -1: not given (the table's ranges refuse it given) */
    int64_t rank = -1, heads = 0;
    const tool_flag flags[] = {
        {"weights", TOOL_FLAG_STRING, &weights, "the dense model (safetensors)"},
        {"out", TOOL_FLAG_STRING, &out, "the factored file to write"},
        {"energy", TOOL_FLAG_FLOAT, &energy,
         "fraction of the squared singular values each layer keeps", TOOL_RANGE_ABOVE(0, 1)},
        {"rank", TOOL_FLAG_INT, &rank, "one rank for every kind listed, instead of --energy",
         TOOL_MIN(1)},
        {"matrices", TOOL_FLAG_STRING, &matrices,
         "kinds to factor, comma-separated: qkv, attproj, fc, fcproj"},
        {"heads", TOOL_FLAG_INT, &heads, "head count, for weights without kiln metadata",
         TOOL_MIN(0)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    int want[4];
    kiln_status s = kiln_lowrank_kinds_parse(matrices, want);
    if (s) {
        tool_report("compress lowrank", s);
        return 2;
    }
    if (npos != 0 || !weights || !weights[0] || !out || !out[0]) {
        fprintf(stderr, "kiln compress lowrank: --weights W and --out F are required\n");
        return 2;
    }
    int by_rank = rank != -1, by_energy = energy != -1.0;
    if (by_rank == by_energy) {
        fprintf(stderr, "kiln compress lowrank: give --energy E or --rank R (one of them)\n");
        return 2;
    }
    if ((s = tool_refuse_same_file(weights, out)) != KILN_OK) {
        tool_report("compress lowrank", s);
        return 2;
    }
    kiln_quant_type quant = KILN_QUANT_NONE;
    s = kiln_quant_probe(weights, &quant, NULL);
    if (!s && quant != KILN_QUANT_NONE)
        s = kiln_error_setf(KILN_ERR_ARG,
                            "%s is quantized (%s): factor the dense weights it was made from",
                            weights, kiln_quant_type_name(quant));
    kiln_gpt *dense = NULL, *fm = NULL;
    kiln_lowrank_report rep[4];
    if (!s)
        s = tool_load_model(&dense, weights, heads, 1, 1, KILN_DTYPE_F32);
    if (!s)
        s = kiln_lowrank_factor(dense, want, by_energy ? energy : 1.0, by_rank ? rank : 0, &fm,
                                rep);
    if (!s)
        s = tool_make_parent_dirs(out);
    if (!s)
        s = kiln_gpt_save_safetensors(fm, out, KILN_DTYPE_F32);
    int64_t before = dense ? kiln_gpt_config_num_params(kiln_gpt_get_config(dense)) : 0;
    int64_t after = fm ? kiln_gpt_config_num_params(kiln_gpt_get_config(fm)) : 0;
    kiln_gpt_free(dense);
    kiln_gpt_free(fm);
    if (s) {
        tool_report("compress lowrank", s);
        return 1;
    }
    printf("factored %s to %s (", weights, out);
    if (by_energy)
        printf("energy %g)\n", energy);
    else
        printf("rank %lld)\n", (long long)rank);
    print_report(rep, before, after);
    return 0;
}
