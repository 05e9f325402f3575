/* The trainer: data -> model forward/backward -> clip -> optimizer, with metrics. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "kiln/loader.h"
#include "kiln/train.h"
#include "train/metrics.h"

kiln_train_config kiln_train_config_default(void) {
    kiln_train_config c;
    memset(&c, 0, sizeof c);
    c.B = 4;
    c.T = 64;
    c.grad_accum = 1;
    c.steps = 100;
    c.eval_batches = 20;
    c.optim = kiln_optim_config_default();
    c.lr.kind = KILN_LR_COSINE;
    c.lr.lr = 3e-4f;
    c.lr.min_lr = 3e-5f;
    c.lr.warmup_steps = 10;
    c.grad_clip = 1.0f;
    c.seed = 1337;
    c.model_opt = kiln_gpt_options_default();
    c.save_dtype = KILN_DTYPE_F32;
    c.loss_scaler = kiln_loss_scaler_default();
    return c;
}

kiln_status kiln_eval_loader_open(kiln_loader **out, const char *path, int64_t B, int64_t T) {
    kiln_loader_config lc = {.path = path, .B = B, .T = T, .rank = 0, .world = 1, .shuffle = 0};
    return kiln_loader_open(out, &lc);
}

kiln_status kiln_evaluate(kiln_gpt *m, kiln_loader *l, int64_t B, int64_t T, int64_t batches,
                          double *mean_loss, int64_t *tokens) {
    const kiln_gpt_config *mc = kiln_gpt_get_config(m);
    if (kiln_loader_vocab_size(l) != mc->vocab_size)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the evaluation data holds tokens of a %lld-token vocabulary; the "
                               "model has %lld",
                               (long long)kiln_loader_vocab_size(l), (long long)mc->vocab_size);
    kiln_loader_state start = kiln_loader_get_state(l);
    start.epoch = 0;
    start.position = 0;
    KILN_CHECK(kiln_loader_set_state(l, &start));
    kiln_status s = KILN_OK;
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    if (!in || !tg) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate an evaluation batch");
        goto done;
    }
    int64_t n = kiln_loader_batches_per_epoch(l);
    if (batches > 0 && batches < n)
        n = batches;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float loss = 0.0f;
        KILN_CHECK_GOTO(s, kiln_loader_next(l, in, tg), done);
        KILN_CHECK_GOTO(s, kiln_gpt_forward(m, in, tg, B, T, &loss), done);
        sum += loss;
    }
    *mean_loss = n > 0 ? sum / (double)n : NAN;
    if (tokens)
        *tokens = n * B * T;
done:
    free(in);
    free(tg);
    return s;
}

typedef struct trainer {
    const kiln_train_config *cfg;
    kiln_loader *train, *val;
    kiln_gpt *model;
    kiln_optim *opt;
    int32_t *inputs, *targets;
    FILE *metrics;
    double flops_per_step;
    double peak;
    kiln_train_memory plan;
    kiln_loss_scaler scaler; /* fp16 only */
    int save_existed;   /* the --save file existed before this run */
    int64_t saved_step; /* the step whose weights were last saved in this run (-1: none) */
} trainer;

static void trainer_free(trainer *t) {
    if (t->metrics)
        fclose(t->metrics);
    free(t->inputs);
    free(t->targets);
    kiln_optim_free(t->opt);
    kiln_gpt_free(t->model);
    kiln_loader_close(t->val);
    kiln_loader_close(t->train);
}

static kiln_status build_optimizer(trainer *t) {
    int n = kiln_gpt_num_tensors(t->model);
    kiln_param_range *r = calloc((size_t)n, sizeof *r);
    if (!r)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate optimizer ranges");
    for (int i = 0; i < n; i++) {
        const kiln_tensor_info *ti = kiln_gpt_tensor(t->model, i);
        r[i].offset = ti->offset;
        r[i].numel = ti->numel;
        r[i].decay = ti->decay;
    }
    kiln_optim_slab slab = {.n = kiln_gpt_slab_len(t->model),
                            .work = kiln_gpt_dtype(t->model),
                            .stochastic_seed = t->cfg->stochastic_rounding ? t->cfg->seed * 2 + 1 : 0};
    kiln_status s = kiln_optim_create(&t->opt, &t->cfg->optim, &slab, r, n,
                                      kiln_gpt_backend(t->model));
    free(r);
    return s;
}

#define MIB (1024.0 * 1024.0)

static void print_plan(const trainer *t) {
    FILE *log = t->cfg->log;
    if (!log)
        return;
    const kiln_gpt_config *c = kiln_gpt_get_config(t->model);
    const kiln_gpt_options *o = kiln_gpt_get_options(t->model);
    fprintf(log,
            "model: %lld layers, %lld heads, %lld channels, vocabulary %lld (padded %lld), "
            "context %lld: %.2fM parameters; %s, recompute %s\n",
            (long long)c->n_layer, (long long)c->n_head, (long long)c->n_embd,
            (long long)c->vocab_size, (long long)c->padded_vocab_size, (long long)c->max_seq_len,
            (double)kiln_gpt_config_num_params(c) / 1e6, kiln_dtype_name(o->dtype),
            kiln_recompute_name(o->recompute));
    kiln_train_memory_print(log, &t->plan, t->cfg->B, t->cfg->T);
    fprintf(log, "compute: %.2f GFLOP per step; MFU against %.1f GFLOP/s (%s products: %s)\n",
            t->flops_per_step / 1e9, t->peak, kiln_dtype_name(o->dtype),
            kiln_backend_cpu_gemm_name(o->dtype));
}

/* "812.3 MiB", or "23.3 GiB" from 1 GiB up. */
typedef struct size_text {
    char s[32];
} size_text;

static size_text size_str(size_t bytes) {
    size_text t;
    double mib = (double)bytes / MIB;
    if (mib >= 1024.0) /* to the MiB: the plan is compared with the measured peak */
        snprintf(t.s, sizeof t.s, "%.0f MiB (%.1f GiB)", mib, mib / 1024.0);
    else
        snprintf(t.s, sizeof t.s, "%.1f MiB", mib);
    return t;
}

kiln_status kiln_train_memory_plan(const kiln_train_config *cfg, const kiln_gpt_config *mc,
                                  kiln_train_memory *p) {
    memset(p, 0, sizeof *p);
    kiln_gpt_memory model;
    KILN_CHECK(kiln_gpt_memory_plan_for(mc, cfg->B, cfg->T, &cfg->model_opt, NULL, &model));
    kiln_dtype dt = cfg->model_opt.dtype;
    int64_t slab = (int64_t)(model.params / kiln_dtype_size(dt));
    size_t state = kiln_optim_state_bytes_for(&cfg->optim, slab, dt);
    p->params = model.params;
    p->grads = model.grads;
    p->master = dt == KILN_DTYPE_F32 ? 0 : (size_t)slab * sizeof(float);
    p->moments = state - p->master;
    p->activations = model.activations;
    p->workspace = model.workspace;
    p->batches = (size_t)(cfg->B * cfg->T) * 2 * sizeof(int32_t) * (cfg->val_path ? 2 : 1);
    p->total = model.total + state + p->batches;
    /* The process takes more than its slabs: its code, OpenBLAS's work buffers, the pages
     * of the data. A plan that leaves less than this beside it is refused rather than left
     * to the kernel's out-of-memory killer. */
    p->headroom = ((size_t)256 << 20) + p->total / 20;
    p->available = kiln_memory_available(&p->available_what);
    return KILN_OK;
}

void kiln_train_memory_print(FILE *log, const kiln_train_memory *p, int64_t B, int64_t T) {
    fprintf(log,
            "memory plan: parameters %s, gradients %s, master weights %s, optimizer moments %s, "
            "activations %s, workspace %s, batches %s (B=%lld, T=%lld): %s in all",
            size_str(p->params).s, size_str(p->grads).s, size_str(p->master).s,
            size_str(p->moments).s, size_str(p->activations).s, size_str(p->workspace).s,
            size_str(p->batches).s, (long long)B, (long long)T, size_str(p->total).s);
    if (p->available != SIZE_MAX)
        fprintf(log, " of %s available", size_str(p->available).s);
    fprintf(log, "\n");
    if (p->process)
        fprintf(log, "planned peak: %s (the process held %s before the plan's memory)\n",
                size_str(p->process + p->total).s, size_str(p->process).s);
}

/* The whole plan against what the machine can give, before any of it is taken (and before
 * OpenBLAS's buffers or the peak measurement): a plan that cannot fit fails now with both
 * figures, not minutes later in an allocation. */
static kiln_status check_plan(trainer *t, const kiln_gpt_config *mc) {
    const kiln_train_config *cfg = t->cfg;
    kiln_train_memory *p = &t->plan;
    KILN_CHECK(kiln_train_memory_plan(cfg, mc, p));
    if (p->total <= p->available && p->headroom <= p->available - p->total)
        return KILN_OK;
    size_t need = p->total + p->headroom;
    return kiln_error_setf(KILN_ERR_NOMEM,
                           "the run is planned to take %s (parameters %s, gradients %s, master "
                           "weights %s, optimizer moments %s, activations %s, workspace %s, "
                           "batches %s at B=%lld, T=%lld) and about %s more for the process "
                           "itself, but %s is available (%s): %s short; use a smaller batch "
                           "(--batch) or sequence length (--seq), recomputation (--recompute), "
                           "a narrower precision (--precision bf16), or a smaller model",
                           size_str(p->total).s, size_str(p->params).s, size_str(p->grads).s,
                           size_str(p->master).s, size_str(p->moments).s,
                           size_str(p->activations).s, size_str(p->workspace).s,
                           size_str(p->batches).s, (long long)cfg->B, (long long)cfg->T,
                           size_str(p->headroom).s, size_str(p->available).s, p->available_what,
                           size_str(need > p->available ? need - p->available : 0).s);
}

/* Metrics may go to a regular file, a device (/dev/stdout) or a FIFO that a process reads;
 * O_NONBLOCK makes a FIFO that nobody reads fail at once instead of blocking the run. */
static kiln_status open_metrics(FILE **out, const char *path) {
    *out = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK, 0666);
    if (fd < 0) {
        int e = errno;
        return kiln_error_setf(KILN_ERR_IO, "cannot open metrics file %s for writing: %s%s", path,
                               strerror(e),
                               e == ENXIO ? " (a FIFO that no process is reading)" : "");
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *out = fdopen(fd, "w");
    if (!*out) {
        int e = errno;
        close(fd);
        return kiln_error_setf(KILN_ERR_IO, "cannot open metrics file %s for writing: %s", path,
                               strerror(e));
    }
    return KILN_OK;
}

static kiln_status trainer_init(trainer *t, const kiln_train_config *cfg) {
    memset(t, 0, sizeof *t);
    t->cfg = cfg;
    t->saved_step = -1;
    if (cfg->B < 1 || cfg->T < 1 || cfg->grad_accum < 1 || cfg->steps < 0)
        return kiln_error_setf(KILN_ERR_CONFIG, "batch, sequence, accumulation must be positive");
    if (cfg->eval_every < 0 || (cfg->eval_every > 0 && !cfg->val_path))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "evaluating every %lld steps needs validation data (a val_path), "
                               "and the interval must be >= 0",
                               (long long)cfg->eval_every);
    KILN_CHECK(kiln_optim_config_check(&cfg->optim));
    kiln_lr_schedule sched = cfg->lr;
    if (sched.total_steps <= 0)
        sched.total_steps = cfg->steps;
    KILN_CHECK(kiln_lr_schedule_check(&sched));
    kiln_loader_config lc = {.path = cfg->train_path, .B = cfg->B, .T = cfg->T, .rank = 0,
                             .world = 1, .seed = cfg->seed, .shuffle = 1};
    KILN_CHECK(kiln_loader_open(&t->train, &lc));
    /* Validation data is opened (and checked) now, not at the first evaluation. */
    if (cfg->val_path) {
        KILN_CHECK(kiln_eval_loader_open(&t->val, cfg->val_path, cfg->B, cfg->T));
        if (kiln_loader_vocab_size(t->val) != kiln_loader_vocab_size(t->train))
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "%s holds a %lld-token vocabulary but %s holds %lld",
                                   cfg->val_path, (long long)kiln_loader_vocab_size(t->val),
                                   cfg->train_path, (long long)kiln_loader_vocab_size(t->train));
    }
    kiln_gpt_config mc = cfg->model;
    int64_t data_vocab = kiln_loader_vocab_size(t->train);
    if (cfg->init_path) {
        KILN_CHECK(kiln_gpt_config_from_safetensors(&mc, cfg->init_path));
        if (data_vocab != mc.vocab_size)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "%s was written with a %lld-token vocabulary but the weights "
                                   "in %s have %lld: tokenize the data with the model's tokenizer",
                                   cfg->train_path, (long long)data_vocab, cfg->init_path,
                                   (long long)mc.vocab_size);
    } else if (mc.vocab_size == 0) {
        mc.vocab_size = data_vocab;
    } else if (mc.vocab_size != data_vocab) {
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s was written with a %lld-token vocabulary, but the model's "
                               "vocab_size is %lld: tokenize the data with the model's tokenizer, "
                               "or leave the model's vocab_size unset to take the data's",
                               cfg->train_path, (long long)data_vocab, (long long)mc.vocab_size);
    }
    KILN_CHECK(kiln_gpt_config_validate(&mc));
    if (cfg->T > mc.max_seq_len)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "sequence length %lld is beyond the context of %lld",
                               (long long)cfg->T, (long long)mc.max_seq_len);
    KILN_CHECK(check_plan(t, &mc));
    struct stat st;
    t->save_existed = cfg->save_path && stat(cfg->save_path, &st) == 0;
    /* What the process holds before the plan's memory (its code, the data's pages, the
     * backend's own buffers, which prepare takes now): the planned peak is this plus the
     * plan, and the measured peak is compared with it. */
    kiln_backend *cpu = kiln_backend_cpu();
    if (cpu->prepare)
        KILN_CHECK(cpu->prepare(cpu));
    t->plan.process = kiln_current_rss();
    KILN_CHECK(kiln_gpt_create(&t->model, &mc, cfg->B, cfg->T, &cfg->model_opt, NULL));
    KILN_CHECK(build_optimizer(t));
    /* The starting weights in fp32: into the optimizer's master copy when the working weights
     * are narrower (then rounded into them), else into the working weights themselves. */
    float *master = kiln_optim_master(t->opt);
    if (master) {
        if (cfg->init_path)
            KILN_CHECK(kiln_gpt_load_slab(t->model, cfg->init_path, master, KILN_DTYPE_F32));
        else
            kiln_gpt_init_weights_f32(t->model, cfg->seed, master);
        KILN_CHECK(kiln_optim_write_working(t->opt, kiln_gpt_params(t->model)));
    } else if (cfg->init_path) {
        KILN_CHECK(kiln_gpt_load_safetensors(t->model, cfg->init_path));
    } else {
        kiln_gpt_init_weights(t->model, cfg->seed);
    }
    t->scaler = cfg->loss_scaler;
    t->inputs = malloc((size_t)(cfg->B * cfg->T) * sizeof *t->inputs);
    t->targets = malloc((size_t)(cfg->B * cfg->T) * sizeof *t->targets);
    if (!t->inputs || !t->targets)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a batch");
    if (cfg->metrics_path)
        KILN_CHECK(open_metrics(&t->metrics, cfg->metrics_path));
    t->flops_per_step = kiln_gpt_flops_per_token(&mc, cfg->T) * (double)(cfg->B * cfg->T) *
                        (double)cfg->grad_accum;
    /* MFU is against the matrix-product rate of the precision trained in (bf16 products run
     * at about twice fp32's here; fp16 products widen to fp32 on the CPU) */
    kiln_dtype peak_dt = cfg->model_opt.dtype == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
    t->peak = cfg->peak_gflops > 0 ? cfg->peak_gflops
                                   : kiln_backend_cpu_peak_gflops_dtype(peak_dt, 3072, 1.0);
    print_plan(t);
    return KILN_OK;
}

/* One optimizer step over grad_accum micro-batches; returns the mean loss. With fp16
 * working weights the loss is scaled for backward (kiln_loss_scaler) and a step whose
 * gradients overflow is skipped (*skipped = 1, weights unchanged). */
static kiln_status train_step(trainer *t, int64_t step, float *loss, float *norm, float *lr,
                              int *skipped) {
    const kiln_train_config *cfg = t->cfg;
    kiln_backend *be = kiln_gpt_backend(t->model);
    float *grads = kiln_gpt_grads(t->model);
    int64_t n = kiln_gpt_slab_len(t->model);
    int scaled = kiln_gpt_dtype(t->model) == KILN_DTYPE_F16;
    float S = scaled ? t->scaler.scale : 1.0f;
    *skipped = 0;
    kiln_gpt_zero_grad(t->model);
    double sum = 0.0;
    for (int64_t micro = 0; micro < cfg->grad_accum; micro++) {
        float l = 0.0f;
        KILN_CHECK(kiln_loader_next(t->train, t->inputs, t->targets));
        KILN_CHECK(kiln_gpt_forward_backward(t->model, t->inputs, t->targets, cfg->B, cfg->T,
                                             S / (float)cfg->grad_accum, &l));
        sum += l;
    }
    *loss = (float)(sum / (double)cfg->grad_accum);
    if (cfg->inject_nonfinite_step == step + 1) { /* a fault on purpose, for tests */
        float inf = INFINITY;
        be->copy(be, grads, &inf, sizeof inf, KILN_COPY_TO_DEVICE);
    }
    if (!isfinite(*loss))
        return kiln_error_setf(KILN_ERR_RANGE, "loss is %f at step %lld; weights unchanged", *loss,
                               (long long)step + 1);
    kiln_lr_schedule sched = cfg->lr;
    if (sched.total_steps <= 0)
        sched.total_steps = cfg->steps;
    *lr = kiln_lr_at(&sched, step);
    /* The norm of the gradients as the loss scale left them; the optimizer then reads them
     * divided by the scale and clipped (torch.nn.utils.clip_grad_norm_: max_norm / (norm +
     * 1e-6) when < 1). */
    double norm_scaled = sqrt(be->sumsq(be, KILN_DTYPE_F32, grads, n));
    *norm = (float)(norm_scaled / S);
    if (!isfinite(norm_scaled)) {
        if (!scaled) /* never let a non-finite gradient reach the weights */
            return kiln_error_setf(KILN_ERR_RANGE,
                                   "gradient norm is %f at step %lld; weights unchanged", *norm,
                                   (long long)step + 1);
        *skipped = 1; /* an fp16 overflow: skip, and back the scale off */
        return kiln_loss_scaler_update(&t->scaler, 0);
    }
    double coef = 1.0 / S;
    if (cfg->grad_clip > 0.0f && (double)cfg->grad_clip / (*norm + 1e-6) < 1.0)
        coef *= (double)cfg->grad_clip / (*norm + 1e-6);
    if (scaled)
        KILN_CHECK(kiln_loss_scaler_update(&t->scaler, 1));
    /* the scale's division and the clipping in the optimizer's own pass */
    return kiln_optim_step_scaled(t->opt, kiln_gpt_params(t->model), grads, *lr, (float)coef);
}

/* Weights are saved only when they can be used: every parameter finite, and a finite loss
 * on the last batch (weights of 1e29 are finite, yet overflow in the next forward pass). */
static kiln_status check_savable(trainer *t) {
    KILN_CHECK(kiln_gpt_check_finite(t->model));
    float loss = 0.0f;
    KILN_CHECK(kiln_gpt_forward(t->model, t->inputs, t->targets, t->cfg->B, t->cfg->T, &loss));
    if (!isfinite(loss))
        return kiln_error_setf(KILN_ERR_RANGE,
                               "they are finite but give a loss of %f on the last batch", loss);
    return KILN_OK;
}

static kiln_status maybe_save(trainer *t, int64_t step) {
    const kiln_train_config *cfg = t->cfg;
    if (!cfg->save_path)
        return KILN_OK;
    int last = step == cfg->steps;
    if (!last && !(cfg->save_every > 0 && step % cfg->save_every == 0))
        return KILN_OK;
    kiln_status s = check_savable(t);
    if (s == KILN_ERR_RANGE) {
        char why[512], kept[512];
        snprintf(why, sizeof why, "%s", kiln_error_message());
        if (t->saved_step > 0)
            snprintf(kept, sizeof kept, "the last good weights, of step %lld, are in %s",
                     (long long)t->saved_step, cfg->save_path);
        else if (t->save_existed)
            snprintf(kept, sizeof kept, "%s is left as it was before this run", cfg->save_path);
        else
            snprintf(kept, sizeof kept, "nothing was saved to %s", cfg->save_path);
        return kiln_error_setf(KILN_ERR_RANGE,
                               "the weights after step %lld are not saved: %s (is the learning "
                               "rate too high?); %s",
                               (long long)step, why, kept);
    }
    KILN_CHECK(s);
    /* from the fp32 master weights when there are some: the exact values, in any dtype */
    float *master = kiln_optim_master(t->opt);
    if (master)
        KILN_CHECK(kiln_gpt_save_slab(t->model, cfg->save_path, master, KILN_DTYPE_F32,
                                      cfg->save_dtype));
    else
        KILN_CHECK(kiln_gpt_save_safetensors(t->model, cfg->save_path, cfg->save_dtype));
    t->saved_step = step;
    if (cfg->log)
        fprintf(cfg->log, "saved weights to %s (step %lld)\n", cfg->save_path, (long long)step);
    return KILN_OK;
}

kiln_status kiln_train(const kiln_train_config *cfg, kiln_train_result *res) {
    trainer t;
    memset(res, 0, sizeof *res);
    res->last_val_loss = NAN;
    kiln_status s = trainer_init(&t, cfg);
    if (s)
        goto done;
    res->peak_gflops = t.peak;
    /* No steps: the data, the model and the plan are checked; nothing is trained, and
     * nothing is saved (the starting weights would replace a --save file with nothing
     * learned). */
    double total_ms = 0.0;
    for (int64_t step = 0; step < cfg->steps; step++) {
        train_step_metrics mt = {.step = step + 1, .steps = cfg->steps, .val_loss = NAN};
        double t0 = kiln_time_ms();
        int skipped = 0;
        KILN_CHECK_GOTO(s, train_step(&t, step, &mt.loss, &mt.grad_norm, &mt.lr, &skipped), done);
        if (kiln_gpt_dtype(t.model) == KILN_DTYPE_F16) {
            mt.loss_scale = t.scaler.scale;
            mt.skipped = skipped;
            mt.skipped_total = t.scaler.skipped;
        }
        mt.ms = kiln_time_ms() - t0;
        mt.tokens_per_s = (double)(cfg->B * cfg->T * cfg->grad_accum) / (mt.ms / 1e3);
        mt.mfu = t.flops_per_step / (mt.ms / 1e3) / (t.peak * 1e9);
        int last = step + 1 == cfg->steps;
        /* Validation data is evaluated every eval_every steps, and always after the last. */
        if (t.val && (last || (cfg->eval_every > 0 && (step + 1) % cfg->eval_every == 0))) {
            double vl = 0.0;
            KILN_CHECK_GOTO(s, kiln_evaluate(t.model, t.val, cfg->B, cfg->T, cfg->eval_batches,
                                             &vl, NULL), done);
            mt.val_loss = (float)vl;
            res->last_val_loss = (float)vl;
        }
        mt.rss = kiln_peak_rss();
        kiln__train_metrics_console(cfg->log, &mt);
        if (t.metrics)
            KILN_CHECK_GOTO(s, kiln__train_metrics_write(t.metrics, cfg->metrics_path, &mt), done);
        if (step == 0)
            res->first_loss = mt.loss;
        else
            total_ms += mt.ms;
        res->last_loss = mt.loss;
        res->steps = step + 1;
        KILN_CHECK_GOTO(s, maybe_save(&t, step + 1), done);
    }
    if (res->steps > 1) {
        res->mean_ms = total_ms / (double)(res->steps - 1);
        res->tokens_per_s = (double)(cfg->B * cfg->T * cfg->grad_accum) / (res->mean_ms / 1e3);
        res->mfu = t.flops_per_step / (res->mean_ms / 1e3) / (t.peak * 1e9);
    }
    res->peak_rss = kiln_peak_rss();
    res->planned_peak = t.plan.process + t.plan.total;
    res->skipped_steps = t.scaler.skipped;
    res->loss_scale = t.scaler.scale;
done:
    trainer_free(&t);
    return s;
}
