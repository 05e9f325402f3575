/* kiln train: train a GPT model on token shards. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/optim.h"
#include "kiln/train.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln train [flags]\n\n"
    "Train a GPT model on token shards made by `kiln prepare`. The model comes from a preset\n"
    "(gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, d4, d6, d12), a JSON file (n_layer, n_head,\n"
    "n_embd, max_seq_len, optional vocab_size), or --init weights; --layers/--heads/--embd/\n"
    "--context override it. The vocabulary is --vocab, else the JSON's vocab_size, else (and\n"
    "for presets) the data's; one that differs from the data's is an error. With --val-data\n"
    "the model is evaluated after the last step (and every --eval-every steps). The whole\n"
    "memory plan is checked against the machine before anything is allocated, and weights\n"
    "that are not finite (or give a loss that is not) are never saved: the --save file keeps\n"
    "the last good ones.";

/* Preset or JSON, then the overriding flags. */
static int resolve_model(kiln_gpt_config *mc, const char *model, int64_t layers, int64_t heads,
                         int64_t embd, int64_t context, int64_t vocab) {
    kiln_status s;
    size_t n = strlen(model);
    int json = n > 5 && !strcmp(model + n - 5, ".json");
    if (json)
        s = kiln_gpt_config_from_json(mc, model);
    else
        s = kiln_gpt_config_preset(mc, model);
    if (s) {
        tool_report("model", s);
        return 2;
    }
    if (layers > 0)
        mc->n_layer = layers;
    if (heads > 0)
        mc->n_head = heads;
    if (embd > 0)
        mc->n_embd = embd;
    if (context > 0)
        mc->max_seq_len = context;
    /* --vocab, else the JSON's vocab_size (0 when it has none), else the data's; a preset's
     * GPT-2 vocabulary gives way to the data's. */
    if (vocab > 0)
        mc->vocab_size = vocab;
    else if (!json)
        mc->vocab_size = 0;
    return 0;
}

/* --init takes the architecture from the weights; flags that say otherwise are an error
 * rather than silently ignored. */
static int check_init_matches(const char *init, int64_t layers, int64_t heads, int64_t embd,
                              int64_t context, int64_t vocab) {
    kiln_gpt_config fc;
    memset(&fc, 0, sizeof fc);
    fc.n_head = heads;
    kiln_status s = kiln_gpt_config_from_safetensors(&fc, init);
    if (s) {
        tool_report("train", s);
        return 1;
    }
    const struct {
        const char *flag;
        int64_t given, file;
    } f[] = {{"--layers", layers, fc.n_layer},     {"--heads", heads, fc.n_head},
             {"--embd", embd, fc.n_embd},          {"--context", context, fc.max_seq_len},
             {"--vocab", vocab, fc.vocab_size}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given > 0 && f[i].given != f[i].file) {
            fprintf(stderr, "kiln train: %s %lld, but the weights in %s have %lld\n", f[i].flag,
                    (long long)f[i].given, init, (long long)f[i].file);
            return 2;
        }
    return 0;
}

int cmd_train(int argc, char **argv) {
    kiln_train_config cfg = kiln_train_config_default();
    const char *model = "d4", *init = NULL, *data = "data/brown/train_*.bin", *val = NULL;
    const char *optimizer = "adamw", *schedule = "cosine", *metrics = NULL;
    const char *save = "out/model.safetensors";
    int64_t layers = 0, heads = 0, embd = 0, context = 0, vocab = 0, threads = 0;
    int64_t B = cfg.B, T = cfg.T, accum = cfg.grad_accum, steps = cfg.steps;
    int64_t warmup = cfg.lr.warmup_steps, eval_every = 0, eval_batches = cfg.eval_batches;
    int64_t save_every = 0, seed = (int64_t)cfg.seed;
    double lr = cfg.lr.lr, min_lr_frac = 0.1, wd = cfg.optim.weight_decay;
    double beta1 = cfg.optim.beta1, beta2 = cfg.optim.beta2, eps = cfg.optim.eps;
    double momentum = cfg.optim.momentum, dampening = cfg.optim.dampening;
    double alpha = cfg.optim.alpha, clip = cfg.grad_clip, peak = 0.0;
    int nesterov = 0;
    const tool_flag flags[] = {
        {"model", TOOL_FLAG_STRING, &model, "preset name or model JSON file"},
        {"layers", TOOL_FLAG_INT, &layers, "override the number of layers (0: keep)"},
        {"heads", TOOL_FLAG_INT, &heads, "override the number of heads (0: keep)"},
        {"embd", TOOL_FLAG_INT, &embd, "override the channels (0: keep)"},
        {"context", TOOL_FLAG_INT, &context, "override the context length (0: keep)"},
        {"vocab", TOOL_FLAG_INT, &vocab,
         "vocabulary size (0: the model JSON's, else the data's)"},
        {"init", TOOL_FLAG_STRING, &init, "start from these safetensors weights"},
        {"data", TOOL_FLAG_STRING, &data, "training token shards: file, folder or glob"},
        {"val-data", TOOL_FLAG_STRING, &val,
         "validation token shards, evaluated after the last step"},
        {"eval-every", TOOL_FLAG_INT, &eval_every,
         "also evaluate every N steps (needs --val-data; 0: after the last step only)"},
        {"eval-batches", TOOL_FLAG_INT, &eval_batches, "validation batches per evaluation (0: all)"},
        {"batch", TOOL_FLAG_INT, &B, "sequences per micro-batch (B)"},
        {"seq", TOOL_FLAG_INT, &T, "tokens per sequence (T)"},
        {"grad-accum", TOOL_FLAG_INT, &accum, "micro-batches per optimizer step"},
        {"steps", TOOL_FLAG_INT, &steps,
         "optimizer steps (0: check the data, model and memory plan; train and save nothing)"},
        {"optimizer", TOOL_FLAG_STRING, &optimizer, "adamw, adam, sgd or rmsprop"},
        {"lr", TOOL_FLAG_FLOAT, &lr, "peak learning rate"},
        {"schedule", TOOL_FLAG_STRING, &schedule, "constant, cosine or linear (after warmup)"},
        {"warmup", TOOL_FLAG_INT, &warmup, "linear warmup steps"},
        {"min-lr-frac", TOOL_FLAG_FLOAT, &min_lr_frac, "final learning rate as a fraction of --lr"},
        {"weight-decay", TOOL_FLAG_FLOAT, &wd, "weight decay (matrices only)"},
        {"beta1", TOOL_FLAG_FLOAT, &beta1, "Adam beta1"},
        {"beta2", TOOL_FLAG_FLOAT, &beta2, "Adam beta2"},
        {"eps", TOOL_FLAG_FLOAT, &eps, "Adam / RMSprop epsilon"},
        {"momentum", TOOL_FLAG_FLOAT, &momentum, "SGD / RMSprop momentum"},
        {"dampening", TOOL_FLAG_FLOAT, &dampening, "SGD dampening"},
        {"nesterov", TOOL_FLAG_BOOL, &nesterov, "SGD Nesterov momentum"},
        {"alpha", TOOL_FLAG_FLOAT, &alpha, "RMSprop smoothing constant"},
        {"grad-clip", TOOL_FLAG_FLOAT, &clip, "clip the global gradient norm (0: off)"},
        {"seed", TOOL_FLAG_INT, &seed, "seed of the initialisation and the data order"},
        {"threads", TOOL_FLAG_INT, &threads, "threads (0: OpenMP's default)"},
        {"metrics", TOOL_FLAG_STRING, &metrics, "write one JSON object per step to this file"},
        {"save", TOOL_FLAG_STRING, &save, "write the final weights here (safetensors)"},
        {"save-every", TOOL_FLAG_INT, &save_every, "also save every N steps (0: at the end)"},
        {"peak-gflops", TOOL_FLAG_FLOAT, &peak, "MFU denominator (0: measure at start)"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos) {
        fprintf(stderr, "kiln train: unexpected argument '%s' (see --help)\n", argv[1]);
        return 2;
    }
    if (layers < 0 || heads < 0 || embd < 0 || context < 0 || vocab < 0) {
        fprintf(stderr, "kiln train: --layers, --heads, --embd, --context and --vocab must be "
                        ">= 0 (0 keeps the model's own)\n");
        return 2;
    }
    if (init && (rc = check_init_matches(init, layers, heads, embd, context, vocab)))
        return rc;
    if (!(clip >= 0) || !(peak >= 0) || T > (1 << 20) || B > (1 << 20)) {
        fprintf(stderr, "kiln train: --grad-clip and --peak-gflops must be numbers >= 0 (0: off / "
                        "measure), --seq and --batch at most 2^20\n");
        return 2;
    }
    if (eval_every < 0 || eval_batches < 0 || save_every < 0 || threads < 0 || threads > 4096) {
        fprintf(stderr, "kiln train: --eval-every, --eval-batches, --save-every must be >= 0 "
                        "and --threads 0..4096\n");
        return 2;
    }
    if (eval_every > 0 && !(val && val[0])) {
        fprintf(stderr, "kiln train: --eval-every %lld needs validation data: name it with "
                        "--val-data\n",
                (long long)eval_every);
        return 2;
    }
    tool_set_threads(threads);
    if (init) { /* the architecture is the file's; --heads only fills a missing head count */
        memset(&cfg.model, 0, sizeof cfg.model);
        cfg.model.n_head = heads;
    } else if ((rc = resolve_model(&cfg.model, model, layers, heads, embd, context, vocab))) {
        return rc;
    }
    kiln_status s = kiln_optim_kind_parse(optimizer, &cfg.optim.kind);
    if (!s)
        s = kiln_lr_kind_parse(schedule, &cfg.lr.kind);
    if (s) {
        tool_report("train", s);
        return 2;
    }
    if (B < 1 || T < 1 || accum < 1 || steps < 0 || !(lr >= 0) || min_lr_frac < 0 || warmup < 0) {
        fprintf(stderr, "kiln train: --batch, --seq, --grad-accum must be >= 1 and --steps, "
                        "--lr, --warmup, --min-lr-frac >= 0\n");
        return 2;
    }
    cfg.init_path = init;
    cfg.train_path = data;
    cfg.val_path = val && val[0] ? val : NULL;
    cfg.eval_every = eval_every;
    cfg.eval_batches = eval_batches;
    cfg.B = B;
    cfg.T = T;
    cfg.grad_accum = accum;
    cfg.steps = steps;
    cfg.lr.lr = (float)lr;
    cfg.lr.min_lr = (float)(lr * min_lr_frac);
    cfg.lr.warmup_steps = warmup;
    cfg.optim.weight_decay = (float)wd;
    cfg.optim.beta1 = (float)beta1;
    cfg.optim.beta2 = (float)beta2;
    cfg.optim.eps = (float)eps;
    cfg.optim.momentum = (float)momentum;
    cfg.optim.dampening = (float)dampening;
    cfg.optim.nesterov = nesterov;
    cfg.optim.alpha = (float)alpha;
    cfg.grad_clip = (float)clip;
    cfg.seed = (uint64_t)seed;
    cfg.metrics_path = metrics;
    cfg.save_path = save && save[0] ? save : NULL;
    cfg.save_every = save_every;
    cfg.peak_gflops = peak;
    cfg.log = stdout;
    /* A --save that could never be written fails now, not after hours of training. */
    if (cfg.save_path && ((s = tool_make_parent_dirs(cfg.save_path)) ||
                          (s = kiln_file_check_replaceable(cfg.save_path)))) {
        tool_report("train", s);
        return 1;
    }
    kiln_train_result res;
    s = kiln_train(&cfg, &res);
    if (s) {
        tool_report("train", s);
        return 1;
    }
    if (steps == 0)
        printf("--steps 0: the data, the model and the memory plan are good; nothing was trained "
               "and nothing saved\n");
    if (res.steps > 1)
        printf("done: %lld steps, loss %.4f -> %.4f, %.1f ms/step, %.0f tokens/s, MFU %.1f%%, "
               "peak RSS %.0f MiB\n",
               (long long)res.steps, res.first_loss, res.last_loss, res.mean_ms, res.tokens_per_s,
               100.0 * res.mfu, (double)res.peak_rss / (1024.0 * 1024.0));
    return 0;
}
