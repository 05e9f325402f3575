/* kiln train: train a GPT model on token shards. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "flags.h"
#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/loader.h"
#include "kiln/model.h"
#include "kiln/optim.h"
#include "kiln/train.h"
#include "tool_common.h"
#include "watchdog_flags.h"

static const char *usage =
    "usage: kiln train [flags]\n\n"
    "Train a GPT model on token shards made by `kiln prepare`. The model comes from a preset\n"
    "(gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, d4, d6, d12; Llamas llama-d4, llama-d6,\n"
    "llama-d12, smollm2-135m), a JSON file (kiln's: n_layer, n_head, n_embd, max_seq_len,\n"
    "optional vocab_size and \"family\": \"llama\" with n_kv_head, mlp_hidden, norm_eps,\n"
    "rope_theta, untied_head; or a Hugging Face config.json of model_type llama or gpt2), or\n"
    "--init weights; --layers/--heads/--embd/\n"
    "--context override it. The vocabulary is --vocab, else the JSON's vocab_size, else (and\n"
    "for presets) the data's; one that differs from the data's is an error. With --val-data\n"
    "the model is evaluated after the last step (and every --eval-every steps). The whole\n"
    "memory plan is checked against the machine before anything is allocated, and weights\n"
    "that are not finite (or give a loss that is not) are never saved: the --save file keeps\n"
    "the last good ones.\n\n"
    "--precision bf16 or fp16 trains with working weights and activations in that type and fp32\n"
    "master weights, gradients and optimizer state; fp16 scales the loss dynamically. --plan\n"
    "prints the memory each category takes and the largest batch that fits, allocating\n"
    "nothing.\n\n"
    "--device cuda trains on the GPU: the model, gradients and optimizer live there, and only\n"
    "the batch, the loss and the state for checkpoints and saved weights cross to the host;\n"
    "the memory plan is checked against the GPU's free memory and MFU is against its\n"
    "data-sheet peak. Under mpirun each rank takes a GPU of its own and the gradients go over\n"
    "NCCL (ZeRO 0 and 1). Without a usable GPU it says why and exits before anything starts.\n\n"
    "Checkpoints (--checkpoint-dir) are written by a writer thread while training goes on:\n"
    "the step pauses only to copy the state (--checkpoint-sync: it waits for the whole write).\n"
    "With several ranks each rank also writes its neighbour's optimizer file and rank 1 a\n"
    "second model file; a resume rebuilds a missing or damaged file from its copy.\n\n"
    "Preemption: SIGTERM, SIGUSR1 or SIGINT stops the run after the current step; with\n"
    "--checkpoint-dir the checkpoint of the steps done is written, else the --save weights,\n"
    "and the exit status is 3: preempted, saved, resume me (a scheduler requeues the job;\n"
    "`kiln run` passes it on). A second SIGTERM or SIGINT exits at once (143, 130).\n\n"
    "Watchdog (on by default): a step that runs --hang-warn-factor times the median step is\n"
    "warned about on stderr; at --hang-factor times the median, and never before --hang-min-s,\n"
    "it is hung: the --heartbeat file says \"hung\" and the process exits 4 (under mpirun every\n"
    "rank ends). With several ranks a rank consistently slower than the others (its compute\n"
    "time per step over --straggler-window steps above --straggler-factor times theirs) is\n"
    "named by rank 0 and in the metrics file; with --straggler-exit it ends the run after a\n"
    "checkpoint, exit 5. --inject-hang and --inject-slow are test aids.\n\n"
    "--config FILE takes any of these flags from a JSON object, keyed by the flag's name\n"
    "without dashes ({\"layers\": 2, \"lr\": 1e-3, \"nesterov\": true}); the command line\n"
    "overrides it. Every checkpoint keeps the run's resolved flags as config.json, and\n"
    "--config DIR/step_N/config.json starts the same run again (docs/config.md).";

/* Flags a step folder's config.json leaves out: which file it came from, and the run's
 * state (what to resume, the folder that another run of it would have to own). */
static const char *const config_skip[] = {"config", "resume", "checkpoint-dir", NULL};

/* Preemption: SIGTERM, SIGUSR1 or SIGINT asks the run to stop after the current step, save
 * what it has and exit TOOL_EXIT_PREEMPTED; a second SIGINT or SIGTERM while stopping ends
 * the process at once, 128 + the signal, and the atomic writes leave no half-written file
 * behind.
 *
 * No thread that computes ever runs a handler: the three signals are blocked in the main
 * thread before any other thread exists (MPI's, OpenMP's, kiln's own inherit the mask), and
 * one thread of their own takes them with sigwait. A handler runs on the stack of whatever
 * the interrupted thread was doing, and oneDNN's JIT f32 GEMM (Debian's 2.6; fixed in
 * oneDNN 3.11.2) points the stack register into a heap buffer while it runs: a signal
 * handled there wrote its frame over the heap (a preempted run aborted with "corrupted
 * size vs. prev_size" inside dnnl_sgemm). Before the run is armed for it (stop_armed), a
 * signal ends the process as its default action would. */
static volatile sig_atomic_t stop_signal;
static volatile sig_atomic_t stop_armed;
static struct timespec stop_at; /* CLOCK_MONOTONIC when stop_signal was first set */
static sigset_t stop_set;

static void on_stop_signal(int sig) {
    if (!stop_armed || (stop_signal && sig != SIGUSR1))
        _exit(128 + sig);
    if (!stop_signal) {
        clock_gettime(CLOCK_MONOTONIC, &stop_at);
        stop_signal = sig;
    }
}

static void *stop_signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&stop_set, &sig) == 0)
            on_stop_signal(sig);
    }
    return NULL;
}

/* First thing: the signals blocked everywhere but in the thread that waits for them. */
static void block_stop_signals(void) {
    static int started;
    if (started)
        return;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGUSR1);
    pthread_t th;
    if (pthread_sigmask(SIG_BLOCK, &stop_set, NULL) != 0 ||
        pthread_create(&th, NULL, stop_signal_thread, NULL) != 0) {
        pthread_sigmask(SIG_UNBLOCK, &stop_set, NULL); /* the default actions, as before */
        return;
    }
    pthread_detach(th);
    started = 1;
}

static void catch_stop_signals(void) {
    stop_armed = 1;
}

static double ms_since_stop_signal(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - stop_at.tv_sec) * 1e3 +
           (double)(now.tv_nsec - stop_at.tv_nsec) * 1e-6;
}

/* After the step the ranks agreed to stop at: the checkpoint (or the --save weights), then
 * TOOL_EXIT_PREEMPTED, or 1 when nothing could be saved. */
static int stop_preempted(kiln_trainer *tr, int checkpoint, int rank, int world, kiln_comm *comm,
                          const char *what) {
    const char *where = NULL;
    int64_t step = kiln_trainer_steps_done(tr);
    if (rank == 0)
        printf("stopping after step %lld: %s\n", (long long)step,
               stop_signal ? strsignal(stop_signal) : "another rank was signalled");
    kiln_status s = kiln_trainer_save_now(tr, &where);
    if (s) {
        tool_report(what, s);
        if (world > 1)
            kiln_comm_abort(comm, 1, "the checkpoint at a stop failed; every rank stops");
        return 1;
    }
    if (rank == 0) {
        char after[64] = "";
        if (stop_signal)
            snprintf(after, sizeof after, ", %.0f ms after the signal", ms_since_stop_signal());
        if (checkpoint)
            printf("preempted: the checkpoint of step %lld is in %s%s; exit %d: run again with "
                   "--resume %s\n",
                   (long long)step, where, after, TOOL_EXIT_PREEMPTED, where);
        else
            printf("preempted: the weights of step %lld are in %s%s (no --checkpoint-dir: no "
                   "optimizer state or data position to resume from); exit %d\n",
                   (long long)step, where, after, TOOL_EXIT_PREEMPTED);
        fflush(stdout);
    }
    return TOOL_EXIT_PREEMPTED;
}

/* The watchdog stopped the run (a persistent straggler, --straggler-exit): every rank after
 * the same step. Its checkpoint (or --save weights), then the watchdog's status. */
static int stop_watchdog(kiln_trainer *tr, int rank, int world, kiln_comm *comm, const char *what) {
    const char *where = NULL;
    kiln_status s = kiln_trainer_save_now(tr, &where);
    if (s) {
        tool_report(what, s);
        if (world > 1)
            kiln_comm_abort(comm, 1, "the checkpoint at the watchdog's stop failed");
        return 1;
    }
    if (rank == 0) {
        printf("stopped by the watchdog after step %lld (a straggling rank): the state is in %s; "
               "exit %d: resume it on fewer ranks, or with --rank-batches\n",
               (long long)kiln_trainer_steps_done(tr), where, kiln_trainer_watchdog_exit(tr));
        fflush(stdout);
    }
    return kiln_trainer_watchdog_exit(tr);
}

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
    } f[] = {{"--layers", layers, fc.n_layer},
             {"--heads", heads, fc.n_head},
             {"--embd", embd, fc.n_embd},
             {"--context", context, fc.max_seq_len},
             {"--vocab", vocab, fc.vocab_size}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given > 0 && f[i].given != f[i].file) {
            fprintf(stderr, "kiln train: %s %lld, but the weights in %s have %lld\n", f[i].flag,
                    (long long)f[i].given, init, (long long)f[i].file);
            return 2;
        }
    return 0;
}

/* A size like 24G, 512M, 1.5GiB or plain bytes; 0 when it is not one. */
static size_t parse_bytes(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !(v > 0))
        return 0;
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K': mult = 1024.0; break;
    case 'm':
    case 'M': mult = 1024.0 * 1024.0; break;
    case 'g':
    case 'G': mult = 1024.0 * 1024.0 * 1024.0; break;
    case 't':
    case 'T': mult = 1024.0 * 1024.0 * 1024.0 * 1024.0; break;
    case '\0': break;
    default: return 0;
    }
    if (*end && end[1] && strcmp(end + 1, "B") && strcmp(end + 1, "iB"))
        return 0;
    return v * mult < 1.8e19 ? (size_t)(v * mult) : 0;
}

/* --plan: the memory by category for the batch asked, and the largest batch that fits
 * `budget` bytes (0: what the machine has available). Nothing is allocated. */
static int print_plan(kiln_train_config *cfg, const char *budget_text) {
    kiln_gpt_config mc = cfg->model;
    kiln_status s = KILN_OK;
    if (cfg->init_path)
        s = kiln_gpt_config_from_safetensors(&mc, cfg->init_path);
    if (!s && mc.vocab_size <= 0) {
        kiln_loader *l = NULL;
        kiln_loader_config lc = {.path = cfg->data.train_path, .B = 1, .T = 1, .world = 1};
        if (kiln_loader_open(&l, &lc) == KILN_OK) {
            mc.vocab_size = kiln_loader_vocab_size(l);
            kiln_loader_close(l);
        } else {
            mc.vocab_size = 50257;
            printf("(no data at %s: planned with GPT-2's vocabulary of 50257)\n",
                   cfg->data.train_path);
        }
    }
    if (!s)
        s = kiln_gpt_config_validate(&mc);
    kiln_train_memory p;
    if (!s)
        s = kiln_train_memory_plan(cfg, &mc, &p);
    if (s) {
        tool_report("plan", s);
        return 1;
    }
    size_t budget = budget_text ? parse_bytes(budget_text) : p.available;
    if (budget_text && budget == 0) {
        fprintf(stderr, "kiln train: --plan-memory wants a size such as 24G or 512M, got '%s'\n",
                budget_text);
        return 2;
    }
    printf("model: %lld layers, %lld heads, %lld channels, vocabulary %lld, context %lld: "
           "%.2fM parameters; %s, recompute %s\n",
           (long long)mc.n_layer, (long long)mc.n_head, (long long)mc.n_embd,
           (long long)mc.vocab_size, (long long)mc.max_seq_len,
           (double)kiln_gpt_config_num_params(&mc) / 1e6,
           kiln_dtype_name(cfg->compute.model_opt.dtype),
           kiln_recompute_name(cfg->compute.model_opt.recompute));
    kiln_train_memory_print(stdout, &p, cfg->data.B, cfg->data.T);
    double gib = 1024.0 * 1024.0 * 1024.0;
    /* a GPU run: the GPU's part against the GPU's free memory (or --plan-memory) */
    int gpu = p.device > 0;
    if (gpu && !budget_text)
        budget = p.device_available;
    if (gpu && budget == SIZE_MAX) {
        printf("on the GPU with its own ~%.2f GiB: %.2f GiB (%s; --plan-memory to plan for a "
               "GPU of that size)\n",
               p.device_headroom / gib, (p.device + p.device_headroom) / gib, p.device_what);
        return 0;
    }
    size_t need = gpu ? p.device + p.device_headroom : p.total + p.headroom;
    printf("with the %s own ~%.2f GiB: %.2f GiB against %.2f GiB (%s): %s",
           gpu ? "GPU's" : "process's", (gpu ? p.device_headroom : p.headroom) / gib, need / gib,
           budget / gib,
           budget_text ? "--plan-memory"
           : gpu       ? p.device_what
                       : p.available_what,
           need <= budget ? "fits" : "does not fit");
    if (need > budget)
        printf(", %.2f GiB short", (need - budget) / gib);
    printf("\n");
    /* the largest batch at this T: the plan grows with B, so bisect */
    int64_t lo = 0, hi = 1 << 20;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        kiln_train_config c = *cfg;
        c.data.B = mid;
        kiln_train_memory q;
        if (kiln_train_memory_plan(&c, &mc, &q) == KILN_OK &&
            (gpu ? q.device + q.device_headroom : q.total + q.headroom) <= budget)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo > 0)
        printf("largest batch that fits at T=%lld: B=%lld\n", (long long)cfg->data.T,
               (long long)lo);
    else
        printf("no batch fits at T=%lld in %.2f GiB\n", (long long)cfg->data.T, budget / gib);
    return 0;
}

static int64_t step_micro(const kiln_train_config *cfg, int world) {
    int64_t n = 0;
    for (int r = 0; r < world; r++)
        n += cfg->dist.rank_batches ? cfg->dist.rank_batches[r] : cfg->data.grad_accum;
    return n;
}

/* --global-batch G: G / B micro-batches a step over `world` ranks, evenly (--grad-accum) when
 * they divide, else the first ranks one more (--rank-batches), so that the same command runs
 * on any number of ranks (kiln run --fewer-ranks) and trains the same way. */
static int split_global_batch(int64_t G, int64_t B, int world, kiln_train_config *cfg,
                              int64_t **per_rank) {
    *per_rank = NULL;
    int64_t micro = G / B;
    if (G % B || micro < world) {
        fprintf(stderr,
                "kiln train: --global-batch %lld must be a multiple of --batch %lld with at least "
                "one micro-batch per rank (%d ranks)\n",
                (long long)G, (long long)B, world);
        return 2;
    }
    if (micro % world == 0) {
        cfg->data.grad_accum = micro / world;
        return 0;
    }
    int64_t *v = calloc((size_t)world, sizeof *v);
    if (!v)
        return 1;
    for (int r = 0; r < world; r++)
        v[r] = micro / world + (r < micro % world);
    cfg->data.grad_accum = 1;
    *per_rank = v;
    return 0;
}

/* --rank-batches 3,1: one count per rank, each 1..4096. */
static int parse_rank_batches(const char *text, int world, int64_t accum, int64_t **out) {
    *out = NULL;
    if (accum != 1) {
        fprintf(stderr, "kiln train: --rank-batches sets each rank's micro-batches; leave "
                        "--grad-accum at 1\n");
        return 2;
    }
    int64_t *v = calloc((size_t)world, sizeof *v);
    if (!v)
        return 1;
    const char *p = text;
    int n = 0;
    for (;;) {
        char *end = NULL;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < 1 || x > 4096 || n >= world)
            break;
        v[n++] = x;
        p = end;
        if (*p == '\0' && n == world) {
            *out = v;
            return 0;
        }
        if (*p != ',')
            break;
        p++;
    }
    fprintf(stderr,
            "kiln train: --rank-batches wants %d counts of micro-batches (1..4096), "
            "one per rank, separated by commas, e.g. %s; got '%s'\n",
            world, world == 2 ? "3,1" : "2,2,1,1", text);
    free(v);
    return 2;
}

/* replay_step > 0: kiln replay (the run's flags; nothing of the run is written). */
static int train_main(int argc, char **argv, int64_t replay_step, tool_owned *owned) {
    block_stop_signals();
    kiln_train_config cfg = kiln_train_config_default();
    const char *model = "d4", *init = NULL, *data = "data/brown/train_*.bin", *val = NULL;
    const char *optimizer = "adamw", *schedule = "cosine", *metrics = NULL;
    const char *save = "out/model.safetensors";
    int64_t layers = 0, heads = 0, embd = 0, context = 0, vocab = 0, threads = 0, share = 0;
    int64_t B = cfg.data.B, T = cfg.data.T, accum = cfg.data.grad_accum, steps = cfg.steps;
    int64_t warmup = cfg.lr.warmup_steps, eval_every = 0, eval_batches = cfg.data.eval_batches;
    int64_t lr_total = 0;
    int warmup_given = 0; /* the default stays silent with a run shorter than it */
    int64_t save_every = 0, seed = (int64_t)cfg.seed;
    const char *ckpt_dir = NULL, *resume = NULL;
    int64_t ckpt_every = 0, ckpt_keep = cfg.checkpoint.keep, ckpt_keep_every = 0;
    int ckpt_sync = 0;
    const char *ckpt_replicas = "auto";
    double lr = cfg.lr.lr, min_lr_frac = 0.1, wd = cfg.optim.weight_decay;
    double beta1 = cfg.optim.beta1, beta2 = cfg.optim.beta2, eps = cfg.optim.eps;
    double momentum = cfg.optim.momentum, dampening = cfg.optim.dampening;
    double alpha = cfg.optim.alpha, clip = cfg.grad_clip, peak = 0.0;
    int nesterov = 0, plan = 0, stochastic = 0;
    int fuse_gelu = cfg.compute.model_opt.fuse_gelu,
        fuse_ln = cfg.compute.model_opt.fuse_residual_ln;
    const char *precision = "fp32", *save_dtype = "fp32", *recompute = "none", *plan_memory = NULL;
    const char *device = "cpu";
    int64_t chunk = cfg.compute.model_opt.classifier_chunk;
    double loss_scale = cfg.compute.loss_scaler.scale;
    int64_t inject = 0, zero = 0, local_steps = 0, plan_ranks = 0;
    double outer_lr = 1.0, outer_momentum = 0.0;
    double bucket_mb = (double)kiln_dp_config_default().bucket_bytes / (1 << 20);
    const char *embedding_rows = "auto";
    const char *reduce_dtype = "fp32", *rank_batches = NULL;
    int64_t global_batch = 0;
    const char *teacher = NULL;
    int64_t qat = 0;
    double distill_alpha = cfg.distill.alpha, distill_temp = cfg.distill.temperature;
    int64_t guard_window = cfg.guard.window, guard_max_bad = cfg.guard.max_bad;
    int64_t guard_rollbacks = cfg.guard.max_rollbacks;
    int guard_skip_norm = cfg.guard.skip_norm_spikes, spike_norm_only = 0;
    double guard_z = cfg.guard.z, guard_ceiling = cfg.guard.ceiling;
    const char *tensorboard = NULL;
    const char *skip_batches = NULL, *inject_spike = NULL;
    double prune = 0.0;
    const char *prune_scope = "global";
    int64_t prune_start = 1, prune_end = 0, prune_every = 1;
    const char *config = NULL;
    int ckpt_every_given = 0;
    char *config_json = NULL;
    tool_watchdog_flags wf;
    tool_watchdog_flags_init(&wf, &cfg.watchdog);
    const tool_flag flags[] = {
        {"config", TOOL_FLAG_STRING, &config,
         "take flags from this JSON file (keys: flag names; the command line overrides them)"},
        {"model", TOOL_FLAG_STRING, &model, "preset name or model JSON file"},
        {"layers", TOOL_FLAG_INT, &layers, "override the number of layers (0: keep)", TOOL_MIN(0)},
        {"share-layers", TOOL_FLAG_INT, &share,
         "cross-layer weight sharing: each block's weights serve this many consecutive layers "
         "(it divides the layers; 0: the model's own, 1: none)",
         TOOL_RANGE(0, 1024)},
        {"heads", TOOL_FLAG_INT, &heads, "override the number of heads (0: keep)", TOOL_MIN(0)},
        {"embd", TOOL_FLAG_INT, &embd, "override the channels (0: keep)", TOOL_MIN(0)},
        {"context", TOOL_FLAG_INT, &context, "override the context length (0: keep)", TOOL_MIN(0)},
        {"vocab", TOOL_FLAG_INT, &vocab, "vocabulary size (0: the model JSON's, else the data's)",
         TOOL_MIN(0)},
        {"init", TOOL_FLAG_STRING, &init, "start from these safetensors weights"},
        {"data", TOOL_FLAG_STRING, &data, "training token shards: file, folder or glob"},
        {"val-data", TOOL_FLAG_STRING, &val,
         "validation token shards, evaluated after the last step"},
        {"eval-every", TOOL_FLAG_INT, &eval_every,
         "also evaluate every N steps (needs --val-data; 0: after the last step only)",
         TOOL_MIN(0)},
        {"eval-batches", TOOL_FLAG_INT, &eval_batches, "validation batches per evaluation (0: all)",
         TOOL_MIN(0)},
        {"batch", TOOL_FLAG_INT, &B, "sequences per micro-batch (B)", TOOL_RANGE(1, 1 << 20)},
        {"seq", TOOL_FLAG_INT, &T, "tokens per sequence (T)", TOOL_RANGE(1, 1 << 20)},
        {"grad-accum", TOOL_FLAG_INT, &accum, "micro-batches per optimizer step", TOOL_MIN(1)},
        {"global-batch", TOOL_FLAG_INT, &global_batch,
         "sequences per optimizer step over all ranks, split into --batch micro-batches over "
         "however many ranks run (evenly, or the first ranks one more): the same command "
         "trains alike on any number of ranks (0: --batch x --grad-accum per rank)",
         TOOL_MIN(0)},
        {"steps", TOOL_FLAG_INT, &steps,
         "optimizer steps (0: check the data, model and memory plan; train and save nothing)",
         TOOL_MIN(0)},
        {"optimizer", TOOL_FLAG_STRING, &optimizer, "adamw, adam, sgd or rmsprop"},
        {"lr", TOOL_FLAG_FLOAT, &lr, "peak learning rate", TOOL_FINITE_MIN(0)},
        {"schedule", TOOL_FLAG_STRING, &schedule, "constant, cosine or linear (after warmup)"},
        {"warmup", TOOL_FLAG_INT, &warmup,
         "linear warmup steps (given, at most the schedule's length: --lr-total-steps, else "
         "--steps)",
         TOOL_MIN(0), &warmup_given},
        {"min-lr-frac", TOOL_FLAG_FLOAT, &min_lr_frac, "final learning rate as a fraction of --lr",
         TOOL_RANGE(0, 1)},
        {"lr-total-steps", TOOL_FLAG_INT, &lr_total,
         "the steps the schedule decays over (0: --steps); a run resumed with another --steps "
         "keeps a total fixed here, else its schedule follows the new --steps",
         TOOL_MIN(0)},
        {"weight-decay", TOOL_FLAG_FLOAT, &wd, "weight decay (matrices only)", TOOL_FINITE_MIN(0)},
        {"beta1", TOOL_FLAG_FLOAT, &beta1, "Adam beta1", TOOL_RANGE_BELOW(0, 1)},
        {"beta2", TOOL_FLAG_FLOAT, &beta2, "Adam beta2", TOOL_RANGE_BELOW(0, 1)},
        {"eps", TOOL_FLAG_FLOAT, &eps, "Adam / RMSprop epsilon", TOOL_FINITE_ABOVE(0)},
        {"momentum", TOOL_FLAG_FLOAT, &momentum, "SGD / RMSprop momentum", TOOL_RANGE_BELOW(0, 1)},
        {"dampening", TOOL_FLAG_FLOAT, &dampening, "SGD dampening", TOOL_RANGE(0, 1)},
        {"nesterov", TOOL_FLAG_BOOL, &nesterov, "SGD Nesterov momentum"},
        {"alpha", TOOL_FLAG_FLOAT, &alpha, "RMSprop smoothing constant", TOOL_RANGE_BELOW(0, 1)},
        {"grad-clip", TOOL_FLAG_FLOAT, &clip, "clip the global gradient norm (0: off)",
         TOOL_MIN(0)},
        {"seed", TOOL_FLAG_INT, &seed, "seed of the initialisation and the data order"},
        {"threads", TOOL_FLAG_INT, &threads, "threads (0: OpenMP's default)", TOOL_RANGE(0, 4096)},
        {"metrics", TOOL_FLAG_STRING, &metrics, "write one JSON object per step to this file"},
        {"tensorboard", TOOL_FLAG_STRING, &tensorboard,
         "also write the steps' scalars as a TensorBoard events file into this folder"},
        {"save", TOOL_FLAG_STRING, &save, "write the final weights here (safetensors)"},
        {"save-every", TOOL_FLAG_INT, &save_every, "also save every N steps (0: at the end)",
         TOOL_MIN(0)},
        {"checkpoint-dir", TOOL_FLAG_STRING, &ckpt_dir,
         "write checkpoints (weights, optimizer, data position) into this folder"},
        {"checkpoint-every", TOOL_FLAG_INT, &ckpt_every,
         "with --checkpoint-dir: a checkpoint every N steps, and after the last", TOOL_MIN(0),
         &ckpt_every_given},
        {"checkpoint-keep", TOOL_FLAG_INT, &ckpt_keep, "keep the last N checkpoints", TOOL_MIN(1)},
        {"checkpoint-keep-every", TOOL_FLAG_INT, &ckpt_keep_every,
         "also keep every checkpoint whose step is a multiple of N (0: none)", TOOL_MIN(0)},
        {"checkpoint-sync", TOOL_FLAG_BOOL, &ckpt_sync,
         "write checkpoints on the training thread, the step waiting for the whole write (off: "
         "a writer thread writes them while training goes on)"},
        {"checkpoint-replicas", TOOL_FLAG_STRING, &ckpt_replicas,
         "auto (several ranks: each rank also writes its neighbour's optimizer file, rank 1 a "
         "second model file; a resume rebuilds a bad file from its copy), on (one process "
         "too: a second copy of its own files), off"},
        {"resume", TOOL_FLAG_STRING, &resume,
         "continue from a checkpoint: a --checkpoint-dir folder (its newest good checkpoint) "
         "or one step folder in it; run with the same flags, except that the number of ranks, "
         "--batch and --grad-accum (the same sequences a step), --zero and --steps may change"},
        {"peak-gflops", TOOL_FLAG_FLOAT, &peak,
         "MFU denominator (0: measure the GEMM rate of --precision at start)", TOOL_MIN(0)},
        {"device", TOOL_FLAG_STRING, &device,
         "cpu or cuda: where the model, its gradients and the optimizer live and run"},
        {"precision", TOOL_FLAG_STRING, &precision,
         "fp32, bf16 or fp16: working weights and activations (fp32 master weights otherwise)"},
        {"save-dtype", TOOL_FLAG_STRING, &save_dtype, "dtype of saved weights: fp32, bf16, fp16"},
        {"stochastic-rounding", TOOL_FLAG_BOOL, &stochastic,
         "bf16: round the working weights stochastically after each update"},
        {"loss-scale", TOOL_FLAG_FLOAT, &loss_scale,
         "fp16: the starting loss scale (dynamic: halved on overflow, doubled after 2000 clean "
         "steps)",
         TOOL_FINITE_ABOVE(0)},
        {"recompute", TOOL_FLAG_STRING, &recompute,
         "recompute in backward instead of keeping: none, gelu, attention or block"},
        {"fuse-gelu", TOOL_FLAG_BOOL, &fuse_gelu, "bias and GELU in the MLP product's output pass"},
        {"fuse-residual-ln", TOOL_FLAG_BOOL, &fuse_ln,
         "each residual add with the LayerNorm after it"},
        {"classifier-chunk", TOOL_FLAG_INT, &chunk,
         "rows of logits at a time in the fused classifier + cross-entropy (0: all at once)",
         TOOL_MIN(0)},
        {"inject-nonfinite", TOOL_FLAG_INT, &inject,
         "fault injection: make a gradient infinite at step N (fp16: an overflow to skip)"},
        {"guard-window", TOOL_FLAG_INT, &guard_window,
         "stability guard: good steps whose loss and gradient norm a spike is judged against "
         "(0: no spike checks)",
         TOOL_RANGE(0, 100000)},
        {"guard-z", TOOL_FLAG_FLOAT, &guard_z,
         "stability guard: a loss or gradient norm this many standard deviations above the "
         "window's mean skips the step's update (0: no spike checks)",
         TOOL_RANGE(0, 1e6)},
        {"guard-ceiling", TOOL_FLAG_FLOAT, &guard_ceiling,
         "stability guard: a loss this many nats above the run's first loss for 3 steps in a "
         "row is a bad step, from the second step on (the model is worse than untrained; 0: "
         "off)",
         TOOL_RANGE(0, 1e6)},
        {"guard-max-bad", TOOL_FLAG_INT, &guard_max_bad,
         "stability guard: this many bad steps (non-finite or spiking) in a row roll back to "
         "the newest checkpoint before them and skip their batches (no checkpoint: stop)",
         TOOL_RANGE(1, 1000000)},
        {"guard-max-rollbacks", TOOL_FLAG_INT, &guard_rollbacks,
         "stability guard: rollbacks allowed before the run stops as diverging",
         TOOL_RANGE(0, 1000000)},
        {"guard-skip-norm-spikes", TOOL_FLAG_BOOL, &guard_skip_norm,
         "stability guard: a gradient-norm spike skips its update as a loss spike does (off: "
         "with --grad-clip it is clipped and trains on, as in PyTorch)"},
        {"skip-batches", TOOL_FLAG_STRING, &skip_batches,
         "drop the batches of COUNT steps at the start of step STEP: STEP:COUNT[,STEP:COUNT...] "
         "(data known to be bad)"},
        {"inject-spike", TOOL_FLAG_STRING, &inject_spike,
         "fault injection: a loss and gradient spike at steps STEP[:COUNT] (their first visit)"},
        {"inject-spike-norm-only", TOOL_FLAG_BOOL, &spike_norm_only,
         "fault injection: --inject-spike's spike in the gradient norm alone"},
        {"prune-sparsity", TOOL_FLAG_FLOAT, &prune,
         "magnitude pruning: the fraction of the blocks' matrix weights set to zero by "
         "--prune-end (0: none)",
         TOOL_RANGE_BELOW(0, 1)},
        {"prune-scope", TOOL_FLAG_STRING, &prune_scope,
         "pruning: global (one threshold over all matrices) or layer (each matrix alike)"},
        {"prune-start", TOOL_FLAG_INT, &prune_start, "pruning: the first pruning step",
         TOOL_MIN(1)},
        {"prune-end", TOOL_FLAG_INT, &prune_end,
         "pruning: the step the final sparsity is reached, along Zhu and Gupta's cubic "
         "schedule (0: --prune-start, one shot)",
         TOOL_MIN(0)},
        {"prune-every", TOOL_FLAG_INT, &prune_every, "pruning: steps between pruning steps",
         TOOL_MIN(1)},
        {"qat", TOOL_FLAG_INT, &qat,
         "quantization-aware training: 8 trains the model as int8 will run it (fake-quantized "
         "matrices per output channel, fp32 master weights; 0: none)"},
        {"teacher", TOOL_FLAG_STRING, &teacher,
         "distillation: a trained model (safetensors, the same vocabulary) whose tempered "
         "outputs the student learns from (kiln distill)"},
        {"distill-alpha", TOOL_FLAG_FLOAT, &distill_alpha,
         "distillation: the weight of the data's cross-entropy; 1 - alpha goes to T^2 x KL "
         "from the teacher",
         TOOL_RANGE(0, 1)},
        {"distill-temperature", TOOL_FLAG_FLOAT, &distill_temp,
         "distillation: the temperature T both models' outputs are softened by",
         TOOL_RANGE_ABOVE(0, 100)},
        {"zero", TOOL_FLAG_INT, &zero,
         "data parallel: 0 replicates the optimizer state on every rank, 1 shards it, 2 shards "
         "the gradients' reduction too, 3 the weights too (gathered per block for use)",
         TOOL_RANGE(0, 3)},
        {"bucket-mb", TOOL_FLAG_FLOAT, &bucket_mb,
         "data parallel: MiB of gradients per bucket, each reduced as soon as backward finishes "
         "it (0: one reduction after backward)",
         TOOL_RANGE(0, 1e6)},
        {"reduce-dtype", TOOL_FLAG_STRING, &reduce_dtype,
         "data parallel: the dtype gradients travel in, fp32 or bf16 (added in fp32)"},
        {"embedding-rows", TOOL_FLAG_STRING, &embedding_rows,
         "data parallel: apart reduces wte's gradient as soon as the classifier's backward has "
         "run and adds every rank's embedding rows to it after backward (so that wte's "
         "reduction overlaps the blocks' backward); together reduces it last, with the "
         "embedding's part in it; auto (default) keeps them apart where every other rank's "
         "rows are at most a quarter of the vocabulary"},
        {"rank-batches", TOOL_FLAG_STRING, &rank_batches,
         "data parallel, uneven ranks: micro-batches per step of each rank, e.g. 3,1 (replaces "
         "--grad-accum; a step equals one process with batch sum x --batch), or auto[:N]: "
         "split again after N (10) steps in inverse proportion to each rank's measured time"},
        {"local-steps", TOOL_FLAG_INT, &local_steps,
         "data parallel, less traffic: ranks step alone and average their weights every N "
         "steps (local SGD; 0: reduce the gradients every step)",
         TOOL_MIN(0)},
        {"outer-lr", TOOL_FLAG_FLOAT, &outer_lr,
         "with --local-steps: DiLoCo's outer learning rate on the averaged change (1 with "
         "momentum 0: plain averaging)",
         TOOL_RANGE_ABOVE(0, 2)},
        {"outer-momentum", TOOL_FLAG_FLOAT, &outer_momentum,
         "with --local-steps: DiLoCo's outer Nesterov momentum", TOOL_RANGE_BELOW(0, 1)},
        {"plan", TOOL_FLAG_BOOL, &plan,
         "print the memory plan and the largest batch that fits; allocate and train nothing"},
        {"plan-ranks", TOOL_FLAG_INT, &plan_ranks,
         "with --plan: plan rank 0 of this many data-parallel ranks (with --zero; 0: one "
         "process)",
         TOOL_RANGE(0, 1 << 20)},
        {"plan-memory", TOOL_FLAG_STRING, &plan_memory,
         "with --plan: the memory to fit, e.g. 24G (default: what the machine has available)"},
        TOOL_WATCHDOG_FLAGS(wf),
    };
    int npos = 0, nflags = (int)(sizeof flags / sizeof flags[0]), rc = 0;
    /* the file first, wherever --config is on the line: the command line then overrides it */
    config = tool_flags_find(argc, argv, "config");
    if (config && tool_flags_load_json(flags, nflags, config, "kiln train", owned))
        return 2;
    int ckpt_every_from_file = ckpt_every_given;
    ckpt_every_given = 0;
    rc =
        tool_flags_parse(flags, nflags, argc, argv, &npos, replay_step ? tool_replay_usage : usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos) {
        fprintf(stderr, "kiln train: unexpected argument '%s' (see --help)\n", argv[1]);
        return 2;
    }
    if (init && (rc = check_init_matches(init, layers, heads, embd, context, vocab)))
        return rc;
    kiln_batch_skip skips[KILN_TRAIN_MAX_SKIPS];
    int nskips = 0;
    int64_t spike_at = 0, spike_count = 0;
    if ((skip_batches &&
         tool_parse_skips("--skip-batches", skip_batches, skips, KILN_TRAIN_MAX_SKIPS, &nskips)) ||
        (inject_spike &&
         tool_parse_step_count("--inject-spike", inject_spike, &spike_at, &spike_count)))
        return 2;
    kiln_prune_scope scope = KILN_PRUNE_GLOBAL;
    if (kiln_prune_scope_parse(prune_scope, &scope)) {
        fprintf(stderr, "kiln train: --prune-scope is global or layer, not '%s'\n", prune_scope);
        return 2;
    }
    if (prune_end != 0 && prune_end < prune_start) {
        fprintf(stderr,
                "kiln train: --prune-end %lld is before --prune-start %lld: give a step from "
                "--prune-start on, or 0 (one shot at --prune-start)\n",
                (long long)prune_end, (long long)prune_start);
        return 2;
    }
    if (teacher && !teacher[0]) {
        fprintf(stderr, "kiln train: --teacher needs a file\n");
        return 2;
    }
    if (qat != 0 && qat != 8) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)qat);
        return tool_flag_refuse("kiln train", "qat", v, "8 (int8) or 0 (none)");
    }
    cfg.compress.qat_bits = (int)qat;
    cfg.distill.teacher_path = teacher;
    cfg.distill.alpha = (float)distill_alpha;
    cfg.distill.temperature = (float)distill_temp;
    cfg.compress.prune_sparsity = prune;
    cfg.compress.prune_scope = (int)scope;
    cfg.compress.prune_start = prune_start;
    cfg.compress.prune_end = prune_end ? prune_end : prune_start;
    cfg.compress.prune_every = prune_every;
    cfg.guard.window = guard_window;
    cfg.guard.z = (float)guard_z;
    cfg.guard.ceiling = (float)guard_ceiling;
    cfg.guard.max_bad = guard_max_bad;
    cfg.guard.max_rollbacks = guard_rollbacks;
    cfg.guard.skip_norm_spikes = guard_skip_norm;
    cfg.data.skip_batches = skips;
    cfg.data.nskip_batches = nskips;
    kiln__trainer_faults faults = {.spike_step = spike_at,
                                   .spike_count = spike_count,
                                   .spike_norm_only = spike_norm_only};
    int has_ckpt_dir = ckpt_dir && ckpt_dir[0];
    /* a step folder's config.json keeps the cadence, not the folder (config_skip): without
     * a --checkpoint-dir the run writes no checkpoints, and says so */
    if (!has_ckpt_dir && ckpt_every > 0 && ckpt_every_from_file && !ckpt_every_given) {
        fprintf(stderr,
                "kiln train: %s: checkpoint-every %lld applies with a --checkpoint-dir; none "
                "given: no checkpoints\n",
                config, (long long)ckpt_every);
        ckpt_every = 0;
    }
    ckpt_every_given |= ckpt_every_from_file; /* config.json: the cadence as given */
    if (has_ckpt_dir != (ckpt_every > 0)) {
        fprintf(stderr,
                "kiln train: --checkpoint-dir and --checkpoint-every (>= 1) go together: "
                "%s\n",
                has_ckpt_dir ? "--checkpoint-dir without --checkpoint-every"
                             : "--checkpoint-every without --checkpoint-dir");
        return 2;
    }
    if (strcmp(ckpt_replicas, "auto") && strcmp(ckpt_replicas, "on") &&
        strcmp(ckpt_replicas, "off")) {
        fprintf(stderr, "kiln train: --checkpoint-replicas is auto, on or off, not '%s'\n",
                ckpt_replicas);
        return 2;
    }
    if (eval_every > 0 && !(val && val[0])) {
        fprintf(stderr,
                "kiln train: --eval-every %lld needs validation data: name it with "
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
    if (init && share > 0) {
        fprintf(stderr,
                "kiln train: --share-layers %lld with --init: the weights keep their own "
                "sharing\n",
                (long long)share);
        return 2;
    }
    if (share > 0)
        cfg.model.share_layers = share;
    kiln_status s = kiln_optim_kind_parse(optimizer, &cfg.optim.kind);
    if (!s)
        s = kiln_lr_kind_parse(schedule, &cfg.lr.kind);
    if (!s)
        s = kiln_dtype_parse(precision, &cfg.compute.model_opt.dtype);
    if (!s)
        s = kiln_dtype_parse(save_dtype, &cfg.save.dtype);
    if (!s)
        s = kiln_recompute_parse(recompute, &cfg.compute.model_opt.recompute);
    if (!s)
        s = kiln_dtype_parse(reduce_dtype, &cfg.dist.dp.reduce_dtype);
    if (!s) {
        cfg.dist.dp.rows_apart = !strcmp(embedding_rows, "apart")      ? 1
                                 : !strcmp(embedding_rows, "together") ? 0
                                 : !strcmp(embedding_rows, "auto")     ? -1
                                                                       : -2;
        if (cfg.dist.dp.rows_apart == -2)
            s = kiln_error_setf(KILN_ERR_ARG,
                                "--embedding-rows is apart, together or auto, not "
                                "'%s'",
                                embedding_rows);
    }
    if (s) {
        tool_report("train", s);
        return 2;
    }
    /* A warmup past the schedule's end never reaches --lr. --steps 0 has no schedule. */
    int64_t schedule_len = lr_total ? lr_total : steps;
    if (warmup_given && schedule_len > 0 && warmup > schedule_len) {
        fprintf(stderr,
                "kiln train: --warmup %lld is longer than the schedule (%s %lld): the learning "
                "rate would never reach --lr\n",
                (long long)warmup, lr_total ? "--lr-total-steps" : "--steps",
                (long long)schedule_len);
        return 2;
    }
    cfg.init_path = init;
    cfg.data.train_path = data;
    cfg.data.val_path = val && val[0] ? val : NULL;
    cfg.data.eval_every = eval_every;
    cfg.data.eval_batches = eval_batches;
    cfg.data.B = B;
    cfg.data.T = T;
    cfg.data.grad_accum = accum;
    cfg.steps = steps;
    cfg.lr.lr = (float)lr;
    cfg.lr.min_lr = (float)(lr * min_lr_frac);
    cfg.lr.warmup_steps = warmup;
    cfg.lr.total_steps = lr_total;
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
    cfg.metrics.path = metrics;
    cfg.metrics.tensorboard_dir = tensorboard && tensorboard[0] ? tensorboard : NULL;
    cfg.save.path = save && save[0] ? save : NULL;
    cfg.save.every = save_every;
    cfg.compute.peak_gflops = peak;
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "kiln train: --device is cpu or cuda, not '%s'\n", device);
        return 2;
    }
    cfg.compute.device = device;
    cfg.checkpoint.dir = ckpt_dir && ckpt_dir[0] ? ckpt_dir : NULL;
    cfg.checkpoint.every = ckpt_every;
    cfg.checkpoint.keep = ckpt_keep;
    cfg.checkpoint.keep_every = ckpt_keep_every;
    cfg.checkpoint.sync = ckpt_sync;
    cfg.checkpoint.replicas = !strcmp(ckpt_replicas, "on") ? 1 : 0;
    if (!strcmp(ckpt_replicas, "off"))
        cfg.checkpoint.replicas = -1;
    cfg.checkpoint.resume_path = resume && resume[0] ? resume : NULL;
    const char *run_log = NULL; /* replay: the run's metrics, read */
    if (replay_step) {
        run_log = cfg.metrics.path;
        cfg.metrics.path = NULL;
        cfg.metrics.tensorboard_dir = NULL;
        cfg.save.path = NULL;
        if (!cfg.checkpoint.resume_path)
            cfg.checkpoint.resume_path = cfg.checkpoint.dir;
    }
    cfg.metrics.log = stdout;
    cfg.compute.model_opt.fuse_gelu = fuse_gelu;
    cfg.compute.model_opt.fuse_residual_ln = fuse_ln;
    cfg.compute.model_opt.classifier_chunk = chunk;
    cfg.compute.stochastic_rounding = stochastic;
    faults.nonfinite_step = inject;
    cfg.compute.loss_scaler.scale = (float)loss_scale;
    cfg.dist.dp.zero = (int)zero;
    cfg.dist.plan_world = (int)plan_ranks;
    cfg.dist.local_steps = local_steps;
    cfg.dist.outer_lr = (float)outer_lr;
    cfg.dist.outer_momentum = (float)outer_momentum;
    cfg.dist.dp.bucket_bytes = (int64_t)(bucket_mb * (1 << 20));
    if ((rc = tool_watchdog_flags_apply(&wf, &cfg.watchdog, &faults)))
        return rc;
    tool_test_faults_from_env(&faults);
    kiln__trainer_fault_set(&faults); /* the test switches: one call, before any trainer */
    if (plan)
        return print_plan(&cfg, plan_memory);
    /* one process, or a rank of many when mpirun or srun started several */
    kiln_comm *comm = NULL;
    if ((s = kiln_comm_init_auto(&comm))) {
        tool_report("train", s);
        return 1;
    }
    int rank = kiln_comm_rank(comm), world = kiln_comm_size(comm);
    char what[64];
    snprintf(what, sizeof what, world > 1 ? "train (rank %d of %d)" : "train", rank, world);
    cfg.dist.comm = comm;
    if (rank == 0 && !strcmp(device, "cpu")) /* the CPU's bf16 products */
        tool_precision_note(cfg.compute.model_opt.dtype);
    /* A --save that could never be written fails now, not after hours of training. */
    if (!replay_step && rank == 0 && cfg.save.path &&
        ((s = tool_make_parent_dirs(cfg.save.path)) ||
         (s = kiln_file_check_replaceable(cfg.save.path)))) {
        tool_report(what, s);
        if (world > 1)
            kiln_comm_abort(comm, 1, "rank 0 cannot write its --save file");
        kiln_comm_free(comm);
        return 1;
    }
    int64_t *per_rank = NULL;
    if (global_batch && ((rank_batches && strncmp(rank_batches, "auto", 4)) || accum != 1)) {
        fprintf(stderr, "kiln train: --global-batch sets the micro-batches of every rank: leave "
                        "--grad-accum and --rank-batches out\n");
        kiln_comm_free(comm);
        return 2;
    }
    if (global_batch && (rc = split_global_batch(global_batch, B, world, &cfg, &per_rank))) {
        kiln_comm_free(comm);
        return rc;
    }
    if (rank_batches && !strncmp(rank_batches, "auto", 4)) { /* auto or auto:N steps */
        char *end = NULL;
        long long n = rank_batches[4] == ':' ? strtoll(rank_batches + 5, &end, 10) : 10;
        if ((rank_batches[4] && (rank_batches[4] != ':' || !end || *end)) || n < 2 || n > 100000) {
            fprintf(stderr,
                    "kiln train: --rank-batches auto or auto:N (2..100000 steps to "
                    "measure before the split is chosen); got '%s'\n",
                    rank_batches);
            kiln_comm_free(comm);
            return 2;
        }
        cfg.dist.rank_batches_auto = n;
        rank_batches = NULL;
    }
    if (rank_batches && (rc = parse_rank_batches(rank_batches, world, accum, &per_rank))) {
        kiln_comm_free(comm);
        return rc;
    }
    cfg.dist.rank_batches = per_rank;
    if (world > 1 && rank == 0)
        printf("data parallel: %d ranks (%s), ZeRO %d, gradient buckets of %.1f MiB, reduced in "
               "%s; a step takes %lld sequences of %lld tokens%s\n",
               world, kiln_comm_kind(comm), cfg.dist.dp.zero,
               (double)cfg.dist.dp.bucket_bytes / (1 << 20),
               kiln_dtype_name(cfg.dist.dp.reduce_dtype), (long long)(B * step_micro(&cfg, world)),
               (long long)T, per_rank ? " (uneven ranks: --rank-batches)" : "");
    if (replay_step) {
        rc = tool_replay(&cfg, replay_step, run_log, rank, what);
        kiln_comm_free(comm);
        free(per_rank);
        return rc;
    }
    /* every step folder keeps the flags resolved, its paths against this folder */
    if (cfg.checkpoint.dir) {
        size_t n = strlen(model);
        int model_file = n > 5 && !strcmp(model + n - 5, ".json");
        const char *paths[] = {"init",    "data",        "val-data",
                               "metrics", "tensorboard", "save",
                               "teacher", "heartbeat",   model_file ? "model" : NULL,
                               NULL};
        if (!(config_json = tool_flags_to_json(flags, nflags, config_skip, paths))) {
            fprintf(stderr, "kiln train: out of memory\n");
            kiln_comm_free(comm);
            free(per_rank);
            return 1;
        }
        cfg.checkpoint.config_json = config_json;
    }
    /* The loop over steps (kiln_train's): the place for what runs between them. */
    kiln_trainer *tr = NULL;
    kiln_train_result res;
    int started = 0;
    catch_stop_signals();
    cfg.stop_flag = &stop_signal;
    s = kiln_trainer_create(&tr, &cfg);
    started = s == KILN_OK;
    /* a checkpoint at or past --steps: the trainer said there is nothing left to do */
    int nothing_left =
        started && cfg.checkpoint.resume_path && kiln_trainer_steps_done(tr) >= cfg.steps;
    while (s == KILN_OK && !kiln_trainer_stopping(tr) && kiln_trainer_steps_done(tr) < cfg.steps)
        s = kiln_trainer_step(tr, NULL);
    if (s == KILN_OK && kiln_trainer_watchdog_exit(tr)) {
        rc = stop_watchdog(tr, rank, world, comm, what);
        kiln_trainer_free(tr);
        kiln_comm_free(comm);
        free(per_rank);
        free(config_json);
        return rc;
    }
    if (s == KILN_OK && kiln_trainer_stopping(tr)) {
        rc = stop_preempted(tr, cfg.checkpoint.dir != NULL, rank, world, comm, what);
        kiln_trainer_free(tr);
        kiln_comm_free(comm);
        free(per_rank);
        free(config_json);
        return rc;
    }
    if (s == KILN_OK)
        kiln_trainer_result(tr, &res);
    if (s) {
        tool_report(what, s);
        /* every rank agreed on a failed start; a failed step may be this rank's alone, and
         * the others would wait for it in their next collective: end them all */
        if (world > 1 && started)
            kiln_comm_abort(comm, 1, "a rank failed during training; every rank stops");
        kiln_trainer_free(tr);
        kiln_comm_free(comm);
        free(per_rank);
        free(config_json);
        /* a checkpoint folder another run owns: starting again would be refused the same
         * way, so kiln run does not restart it (exit 2, like a usage error) */
        return s == KILN_ERR_BUSY ? TOOL_EXIT_USAGE : 1;
    }
    kiln_trainer_free(tr);
    kiln_comm_free(comm);
    free(per_rank);
    free(config_json);
    if (rank != 0 || nothing_left)
        return 0;
    if (steps == 0)
        printf("--steps 0: the data, the model and the memory plan are good; nothing was trained "
               "and nothing saved\n");
    if (res.steps > 1)
        printf("done: %lld steps, loss %.4f -> %.4f, %.1f ms/step, %.0f tokens/s, MFU %.1f%%, "
               "peak RSS %.0f MiB (planned %.0f MiB)\n",
               (long long)res.steps, res.first_loss, res.last_loss, res.mean_ms, res.tokens_per_s,
               100.0 * res.mfu, (double)res.peak_rss / (1024.0 * 1024.0),
               (double)res.planned_peak / (1024.0 * 1024.0));
    if (res.steps > 0 && res.device_planned)
        printf("GPU memory: %.0f MiB taken by the run (planned %.0f MiB)\n",
               (double)res.device_used / (1024.0 * 1024.0),
               (double)res.device_planned / (1024.0 * 1024.0));
    if (res.checkpoints_missed > 0) { /* the last line: the run is not all it was asked to be */
        char newest[64] = "none";
        if (res.checkpoint_step > 0)
            snprintf(newest, sizeof newest, "step %lld", (long long)res.checkpoint_step);
        fflush(stdout);
        fprintf(stderr,
                "kiln train: warning: finished, but %lld checkpoint%s asked for %s not written "
                "(the first at step %lld: %s); the newest in %s is %s%s\n",
                (long long)res.checkpoints_missed, res.checkpoints_missed == 1 ? "" : "s",
                res.checkpoints_missed == 1 ? "was" : "were", (long long)res.first_missed_step,
                res.missed_why, cfg.checkpoint.dir, newest,
                cfg.save.path ? "; the final weights are in the --save file" : "");
    }
    return 0;
}

/* The run, and then the strings a --config file gave it freed. */
int tool_train_main(int argc, char **argv, int64_t replay_step) {
    tool_owned owned = {0};
    int rc = train_main(argc, argv, replay_step, &owned);
    tool_owned_free(&owned);
    return rc;
}

int cmd_train(int argc, char **argv) {
    return tool_train_main(argc, argv, 0);
}
