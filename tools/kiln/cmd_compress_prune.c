/* kiln compress prune: structured pruning of attention heads and MLP neurons. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/loader.h"
#include "kiln/train.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln compress prune --weights W --out P [--heads F] [--mlp F]\n"
    "                           [--importance taylor|magnitude] [--data D] [--batches 8]\n\n"
    "Structured pruning: removes the fraction --heads of each layer's attention heads and the\n"
    "fraction --mlp of its MLP neurons, and writes a narrower model (fewer heads of the same\n"
    "width, a narrower MLP) that kiln train (--init P), eval and sample take; fine-tune it to win\n"
    "back what the removed parts did. Every layer keeps the same number, its own\n"
    "highest-scoring ones. --importance taylor (the default) scores a head or neuron by the\n"
    "first-order estimate of the loss change its removal makes: per batch the square of the sum\n"
    "of weight x gradient over its weights, summed over --batches batches of --data run forward\n"
    "and backward; magnitude scores it by the L2 norm of its weights and needs no data. The kept\n"
    "neurons are rounded to a multiple of --multiple (fast products, int4 groups, GGUF blocks).";

#define TRY(call)                                                                                  \
    do {                                                                                           \
        if ((s = (call)) != KILN_OK)                                                               \
            goto done;                                                                             \
    } while (0)

int cmd_compress_prune(int argc, char **argv) {
    const char *weights = NULL, *out = NULL, *imp_name = "taylor";
    const char *data = "data/brown/train_*.bin";
    double heads_frac = 0.0, mlp_frac = 0.0;
    int64_t batches = 8, B = 8, T = 0, multiple = 32, threads = 0, heads = 0;
    const tool_flag flags[] = {
        {"weights", TOOL_FLAG_STRING, &weights, "the dense model (safetensors)"},
        {"out", TOOL_FLAG_STRING, &out, "the pruned model to write"},
        {"heads", TOOL_FLAG_FLOAT, &heads_frac, "fraction of each layer's heads to remove",
         TOOL_RANGE(0, 1)},
        {"mlp", TOOL_FLAG_FLOAT, &mlp_frac, "fraction of each layer's MLP neurons to remove",
         TOOL_RANGE(0, 1)},
        {"importance", TOOL_FLAG_STRING, &imp_name, "taylor or magnitude"},
        {"data", TOOL_FLAG_STRING, &data, "calibration token shards (taylor)"},
        {"batches", TOOL_FLAG_INT, &batches, "calibration batches (taylor)",
         TOOL_RANGE(1, 1000000)},
        {"batch", TOOL_FLAG_INT, &B, "sequences per calibration batch", TOOL_RANGE(1, 4096)},
        {"seq", TOOL_FLAG_INT, &T, "tokens per calibration sequence (0: min(context, 256))",
         TOOL_RANGE(0, 1 << 20)},
        {"multiple", TOOL_FLAG_INT, &multiple, "kept MLP neurons rounded to a multiple of this",
         TOOL_RANGE(1, 4096)},
        {"threads", TOOL_FLAG_INT, &threads, "threads (0: OpenMP's default)", TOOL_RANGE(0, 4096)},
        {"n-head", TOOL_FLAG_INT, &heads, "head count, for weights without kiln metadata",
         TOOL_MIN(0)},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    const char *me = "kiln compress prune";
    kiln_importance imp;
    kiln_status s = kiln_importance_parse(imp_name, &imp);
    if (s) {
        tool_report(me, s);
        return 2;
    }
    if (npos || !weights || !weights[0] || !out || !out[0]) {
        fprintf(stderr, "%s: --weights W and --out P are required (see --help)\n", me);
        return 2;
    }
    if (heads_frac == 0.0 && mlp_frac == 0.0) {
        fprintf(stderr, "%s: nothing to remove: give --heads or --mlp a fraction above 0\n", me);
        return 2;
    }
    if ((s = tool_refuse_same_file(weights, out)) != KILN_OK) {
        tool_report(me, s);
        return 2;
    }
    tool_set_threads(threads);

    kiln_gpt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_head = heads;
    kiln_gpt *m = NULL, *pruned = NULL;
    kiln_loader *l = NULL;
    double *hs = NULL, *ns = NULL, calib_loss = NAN;
    int64_t *hk = NULL, *nk = NULL;
    if ((s = kiln_gpt_config_from_safetensors(&cfg, weights)) != KILN_OK) {
        tool_report(me, s);
        return 1;
    }
    if (cfg.rank[0] || cfg.rank[1] || cfg.rank[2] || cfg.rank[3]) {
        fprintf(stderr,
                "%s: %s holds low-rank factors (kiln compress lowrank): prune the dense model "
                "and factorise after\n",
                me, weights);
        return 2;
    }
    int64_t NH = cfg.n_head, H = kiln_gpt_config_mlp_width(&cfg);
    int64_t U = kiln_gpt_config_blocks(&cfg);
    int64_t keep_heads = NH - (int64_t)llround(heads_frac * (double)NH);
    int64_t keep_neurons = H - (int64_t)llround(mlp_frac * (double)H);
    if (mlp_frac > 0.0 && multiple > 1 && H > multiple) {
        keep_neurons = (keep_neurons + multiple / 2) / multiple * multiple;
        if (keep_neurons > H)
            keep_neurons = H;
    }
    if (keep_heads < 1 || keep_neurons < 1) {
        fprintf(stderr,
                "%s: --heads %g and --mlp %g would leave %lld of %lld heads and %lld of %lld MLP "
                "neurons in each layer: a layer needs at least one of each\n",
                me, heads_frac, mlp_frac, (long long)keep_heads, (long long)NH,
                (long long)keep_neurons, (long long)H);
        return 2;
    }
    if (keep_heads == NH && keep_neurons == H) {
        fprintf(stderr, "%s: --heads %g of %lld heads and --mlp %g of %lld neurons remove none\n",
                me, heads_frac, (long long)NH, mlp_frac, (long long)H);
        return 2;
    }
    if (T == 0)
        T = cfg.max_seq_len < 256 ? cfg.max_seq_len : 256;
    if (T > cfg.max_seq_len) {
        fprintf(stderr, "%s: --seq %lld is beyond the model's context %lld\n", me, (long long)T,
                (long long)cfg.max_seq_len);
        return 2;
    }
    hs = calloc((size_t)(U * NH), sizeof *hs);
    ns = calloc((size_t)(U * H), sizeof *ns);
    hk = malloc((size_t)(U * keep_heads) * sizeof *hk);
    nk = malloc((size_t)(U * keep_neurons) * sizeof *nk);
    if (!hs || !ns || !hk || !nk) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "no memory for the scores");
        goto done;
    }
    if (imp == KILN_IMPORTANCE_TAYLOR) {
        /* the data first: a bad file is reported before the model's memory is taken */
        TRY(kiln_eval_loader_open(&l, data, B, T));
        TRY(kiln_gpt_create(&m, &cfg, B, T, NULL, NULL));
        TRY(kiln_gpt_load_safetensors(m, weights));
        TRY(kiln_gpt_check_finite(m));
        double t0 = kiln_time_ms();
        if ((s = kiln_struct_scores_calibrate(m, l, B, T, batches, hs, ns, &calib_loss)))
            goto done;
        printf("scored by the Taylor estimate over %lld batches of %lld x %lld tokens of %s "
               "(mean loss %.4f, %.1f s)\n",
               (long long)batches, (long long)B, (long long)T, data, calib_loss,
               (kiln_time_ms() - t0) / 1e3);
    } else {
        TRY(kiln_gpt_create_inference(&m, &cfg, 1, 1, KILN_DTYPE_F32, NULL));
        TRY(kiln_gpt_load_safetensors(m, weights));
        TRY(kiln_gpt_check_finite(m));
        TRY(kiln_struct_scores_magnitude(m, kiln_gpt_params(m), hs, ns));
        printf("scored by the L2 norm of each head's and neuron's weights\n");
    }
    TRY(kiln_prune_structured(m, hs, ns, keep_heads, keep_neurons, &pruned, hk, nk));
    for (int64_t b = 0; b < U; b++) {
        printf("block %lld keeps heads", (long long)b);
        for (int64_t h = 0; h < keep_heads; h++)
            printf(" %lld", (long long)hk[b * keep_heads + h]);
        printf("\n");
    }
    TRY(tool_make_parent_dirs(out));
    TRY(kiln_gpt_save_safetensors(pruned, out, KILN_DTYPE_F32));
    const kiln_gpt_config *pc = kiln_gpt_get_config(pruned);
    printf("pruned %s to %s: heads %lld -> %lld per layer (of %lld channels), MLP %lld -> %lld; "
           "parameters %.3fM -> %.3fM (%.1f%%)\n",
           weights, out, (long long)NH, (long long)pc->n_head,
           (long long)kiln_gpt_config_head_size(pc), (long long)H,
           (long long)kiln_gpt_config_mlp_width(pc), (double)kiln_gpt_config_num_params(&cfg) / 1e6,
           (double)kiln_gpt_config_num_params(pc) / 1e6,
           100.0 * (double)kiln_gpt_config_num_params(pc) /
               (double)kiln_gpt_config_num_params(&cfg));
done:
    kiln_gpt_free(pruned);
    kiln_gpt_free(m);
    kiln_loader_close(l);
    free(hs);
    free(ns);
    free(hk);
    free(nk);
    if (s) {
        tool_report(me, s);
        return 1;
    }
    return 0;
}
