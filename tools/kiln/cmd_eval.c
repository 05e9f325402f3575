/* kiln eval: mean loss and perplexity of a model over a token file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/loader.h"
#include "kiln/train.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln eval [flags]\n\n"
    "Mean next-token loss (nats) and perplexity of a model over the windows of T+1 tokens of the\n"
    "token shards in --data, in file order, in whole batches of --batch windows (the last\n"
    "windows that do not fill a batch are left out; --batch 1 takes every window). With\n"
    "--device cuda the model is evaluated on the GPU (its weights copied there once).";

int cmd_eval(int argc, char **argv) {
    const char *weights = "out/model.safetensors", *data = "data/brown/val_*.bin";
    int64_t B = 4, T = 64, batches = 0, heads = 0, threads = 0;
    const char *precision = "fp32", *teacher = NULL, *device = "cpu";
    const tool_flag flags[] = {
        {"weights", TOOL_FLAG_STRING, &weights,
         "model weights (safetensors; quantized ones run on the int8 kernel)"},
        {"data", TOOL_FLAG_STRING, &data, "token shards: file, folder or glob"},
        {"batch", TOOL_FLAG_INT, &B, "sequences per batch", TOOL_RANGE(1, 1 << 20)},
        {"seq", TOOL_FLAG_INT, &T, "tokens per sequence", TOOL_RANGE(1, 1 << 20)},
        {"batches", TOOL_FLAG_INT, &batches, "batches to evaluate (0: every whole batch)",
         TOOL_MIN(0)},
        {"heads", TOOL_FLAG_INT, &heads, "head count, for weights without kiln metadata",
         TOOL_MIN(0)},
        {"threads", TOOL_FLAG_INT, &threads, "threads (0: OpenMP's default)", TOOL_RANGE(0, 4096)},
        {"teacher", TOOL_FLAG_STRING, &teacher,
         "also KL(teacher || model) in nats per token over the same windows: how far this model "
         "(pruned, distilled, quantized) is from the one it came from"},
        {"precision", TOOL_FLAG_STRING, &precision,
         "fp32, bf16 or fp16: the dtype the weights are held and computed in"},
        {"device", TOOL_FLAG_STRING, &device, "cpu or cuda: where the model is evaluated"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos) {
        fprintf(stderr, "kiln eval: unexpected argument '%s' (see --help)\n", argv[1]);
        return 2;
    }
    kiln_dtype dt = KILN_DTYPE_F32;
    kiln_status ps = kiln_dtype_parse(precision, &dt);
    if (ps) {
        tool_report(argv[0], ps);
        return 2;
    }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "kiln eval: --device is cpu or cuda, not '%s'\n", device);
        return 2;
    }
    if (teacher && !strcmp(device, "cuda")) {
        fprintf(stderr, "kiln eval: --teacher compares on the CPU: leave --device at cpu\n");
        return 2;
    }
    if (!strcmp(device, "cpu"))
        tool_precision_note(dt);
    tool_set_threads(threads);
    kiln_gpt *m = NULL;
    kiln_loader *l = NULL;
    kiln_backend *be = NULL;
    /* The data first: a bad file is reported before the model's memory is taken. */
    kiln_status s = kiln_eval_loader_open(&l, data, B, T);
    if (!s)
        s = tool_device_backend(device, &be);
    if (!s)
        s = tool_load_model_on(&m, weights, heads, B, T, dt, be);
    if (!s && T > kiln_gpt_max_seq(m)) {
        fprintf(stderr, "kiln eval: --seq %lld is beyond the model's context %lld\n", (long long)T,
                (long long)kiln_gpt_max_seq(m));
        kiln_gpt_free(m);
        kiln_loader_close(l);
        return 2;
    }
    double loss = 0.0, t0 = kiln_time_ms(); /* the model is loaded: evaluation alone */
    int64_t tokens = 0;
    if (!s && (s = kiln_evaluate(m, l, B, T, batches, &loss, &tokens)))
        kiln_error_wrapf(s, "evaluating on %s", data);
    double secs = (kiln_time_ms() - t0) / 1e3, kl = NAN;
    if (!s && teacher) {
        kiln_gpt *tm = NULL;
        s = tool_load_model(&tm, teacher, 0, B, T, KILN_DTYPE_F32);
        if (!s && (s = kiln_evaluate_kl(tm, m, l, B, T, batches, &kl)))
            kiln_error_wrapf(s, "comparing with the teacher %s", teacher);
        kiln_gpt_free(tm);
    }
    if (!s && !isfinite(loss))
        s = kiln_error_setf(KILN_ERR_RANGE,
                            "the loss over %s is %f: the weights in %s hold values "
                            "that are not finite",
                            data, loss, weights);
    kiln_gpt_free(m);
    kiln_loader_close(l);
    if (s) {
        tool_report("eval", s);
        return 1;
    }
    char klt[64] = "";
    if (teacher)
        snprintf(klt, sizeof klt, " | KL from the teacher %.6f", kl);
    if (printf("tokens %lld | loss %.6f | perplexity %.4f | %.1f s | %.0f tokens/s%s\n",
               (long long)tokens, loss, exp(loss), secs, secs > 0 ? (double)tokens / secs : 0.0,
               klt) < 0 ||
        fflush(stdout) != 0) {
        fprintf(stderr, "kiln eval: cannot write the result to standard output: %s\n",
                strerror(errno));
        return 1;
    }
    return 0;
}
