/* The trainer: data -> model forward/backward -> clip -> optimizer, with metrics, run as phases
 * whose points the features attach to (trainer_feature.h, trainer_features.c). */
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
#include "train/trainer_data.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

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

void kiln_trainer_free(kiln_trainer *t) {
    if (!t)
        return;
    /* the features first: their threads (the watchdog's, the checkpoint writer's) read the
     * model and the trainer */
    kiln__trainer_features_free(t);
    free(t->rank_batches);
    free(t->inputs);
    free(t->targets);
    kiln_dp_free(t->dp);
    kiln_comm_free(t->dcomm); /* after the engine, which waited for its reductions */
    kiln_optim_free(t->opt);
    kiln_gpt_free(t->model);
    kiln_loader_close(t->val);
    if (t->micro_loaders) /* t->train is the first of them */
        for (int64_t i = 0; i < t->micro; i++)
            kiln_loader_close(t->micro_loaders[i]);
    else
        kiln_loader_close(t->train);
    free(t->micro_loaders);
    free(t);
}

static kiln_status move(kiln_trainer *t, void *dst, const void *src, size_t bytes,
                        kiln_copy_kind kind) {
    if (!t->staged) {
        memcpy(dst, src, bytes);
        return KILN_OK;
    }
    t->be->copy(t->be, dst, src, bytes, kind);
    return t->be->synchronize(t->be);
}

kiln_status kiln__trainer_to_host(kiln_trainer *t, void *dst, const void *src, size_t bytes) {
    return move(t, dst, src, bytes, KILN_COPY_TO_HOST);
}

kiln_status kiln__trainer_to_device(kiln_trainer *t, void *dst, const void *src, size_t bytes) {
    return move(t, dst, src, bytes, KILN_COPY_TO_DEVICE);
}

kiln_status kiln__trainer_load_slab(kiln_trainer *t, const char *path, void *dst, kiln_dtype dt) {
    if (!t->staged)
        return kiln_gpt_load_slab(t->model, path, dst, dt);
    size_t bytes = (size_t)kiln_gpt_slab_len(t->model) * kiln_dtype_size(dt);
    void *h = malloc(bytes);
    if (!h)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %.1f MiB to read %s into",
                               (double)bytes / (1 << 20), path);
    kiln_status s = kiln_gpt_load_slab(t->model, path, h, dt);
    if (s == KILN_OK)
        s = kiln__trainer_to_device(t, dst, h, bytes);
    free(h);
    return s;
}

static int wants_gpu(const kiln_train_config *cfg) {
    return cfg->compute.device && !strcmp(cfg->compute.device, "cuda");
}

/* What the GPU trainer does not do, or NULL: pruning, quantization-aware training and
 * distillation; across GPUs, ZeRO 2 and 3, reductions in bf16, local SGD and uneven ranks. */
static const char *gpu_refusal(const kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    if (c->compress.prune_sparsity > 0)
        return "pruning";
    if (c->compress.qat_bits)
        return "quantization-aware training";
    if (c->distill.teacher_path)
        return "distillation";
    if (t->world <= 1)
        return NULL;
    if (c->dist.dp.zero >= 2)
        return "ZeRO 2 or 3 across GPUs (--zero 0 and 1 it does)";
    if (c->dist.dp.reduce_dtype != KILN_DTYPE_F32)
        return "gradients reduced in bf16 across GPUs";
    if (c->dist.local_steps > 0)
        return "local SGD across GPUs";
    if (c->dist.rank_batches || c->dist.rank_batches_auto > 0)
        return "uneven ranks across GPUs";
    return NULL;
}

/* The backend from cfg->compute.device: what a GPU run cannot do is refused before the GPU is asked
 * for (the same answer on a machine without one), then the GPU's own checks. */
static kiln_status choose_backend(kiln_trainer *t) {
    const kiln_train_config *cfg = &t->cfg;
    const char *dev = cfg->compute.device && cfg->compute.device[0] ? cfg->compute.device : "cpu";
    if (!strcmp(dev, "cpu")) {
        t->be = kiln_backend_cpu();
        t->staged = t->faults.host_staging && (t->world == 1 || !gpu_refusal(t));
        return KILN_OK;
    }
    if (strcmp(dev, "cuda"))
        return kiln_error_setf(KILN_ERR_CONFIG, "unknown device '%s': cpu or cuda", dev);
    const char *no = gpu_refusal(t);
    if (no)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "training on the GPU (--device cuda) does not yet do %s: run it on "
                               "the CPU (--device cpu)",
                               no);
    if (t->world > 1) /* a GPU of its own for each rank, and NCCL between them */
        KILN_CHECK(kiln__trainer_gpu_ranks(t));
    KILN_CHECK(kiln_cuda_available(NULL, 0));
    t->be = kiln_backend_cuda();
    if (!t->be)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "the CUDA backend could not start (%s): run on the CPU "
                               "(--device cpu)",
                               kiln_error_message());
    t->gpu = 1;
    t->staged = 1;
    return KILN_OK;
}

static kiln_status build_optimizer(kiln_trainer *t) {
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
    const kiln_train_config *cfg = &t->cfg;
    kiln_optim_slab slab = {.n = kiln_gpt_slab_len(t->model),
                            .lo = t->shard_lo,
                            .hi = t->shard_hi,
                            .work = kiln_gpt_dtype(t->model),
                            .stochastic_seed =
                                cfg->compute.stochastic_rounding ? cfg->seed * 2 + 1 : 0,
                            .master = cfg->compress.qat_bits > 0};
    kiln_status s =
        kiln_optim_create(&t->opt, &cfg->optim, &slab, r, n, kiln_gpt_backend(t->model));
    free(r);
    return s;
}

#define MIB (1024.0 * 1024.0)

static void print_plan(const kiln_trainer *t) {
    FILE *log = t->cfg.metrics.log;
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
    if (c->family != KILN_FAMILY_GPT2)
        fprintf(log,
                "model: %s: %lld key/value heads, RMSNorm eps %g, rotary base %g, SwiGLU MLP "
                "of %lld, %s head\n",
                kiln_family_name(c->family), (long long)kiln_gpt_config_kv_heads(c),
                (double)kiln_gpt_config_norm_eps(c), (double)kiln_gpt_config_rope_theta(c),
                (long long)kiln_gpt_config_mlp_width(c), c->untied_head ? "an untied" : "a tied");
    else if (c->head_size || c->mlp_hidden) /* narrower than GPT-2's shape (structured pruning) */
        fprintf(log, "model: heads of %lld channels (attention width %lld), MLP width %lld\n",
                (long long)kiln_gpt_config_head_size(c), (long long)kiln_gpt_config_attn_width(c),
                (long long)kiln_gpt_config_mlp_width(c));
    kiln_train_memory_print(log, &t->plan, t->cfg.data.B, t->cfg.data.T);
    if (t->dp && !t->cfg.dist.local_steps) {
        int nb = kiln_dp_num_buckets(t->dp);
        fprintf(log, "gradient reduction: %d bucket%s, %s\n", nb, nb == 1 ? "" : "s",
                t->dcomm    ? "each queued over NCCL on the GPU's communication stream as "
                              "backward finishes it"
                : t->staged ? "each started with MPI's non-blocking collectives as backward "
                              "finishes it (the GPU trainer's way)"
                            : "each reduced on a communication thread as backward finishes it");
    }
    if (t->gpu)
        fprintf(log, "compute: %.2f GFLOP per step on the GPU; MFU against %.1f TFLOP/s (%s)\n",
                t->flops_per_step / 1e9, t->peak / 1e3, t->peak_what);
    else
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

/* The checkpoints' staging (trainer_ckpt.c): this rank's optimizer file (the optimizer's
 * state and, narrow, its working weights), its neighbour's (replicas) and the fp32 slab. */
static size_t checkpoint_staging(const kiln_train_config *cfg, int world, int64_t slab,
                                 int64_t owned, size_t state) {
    if (!cfg->checkpoint.dir)
        return 0;
    kiln_dtype dt = cfg->compute.model_opt.dtype;
    size_t image = 128 + state + (dt == KILN_DTYPE_F32 ? 0 : (size_t)owned * kiln_dtype_size(dt));
    int replicas = world > 1 ? cfg->checkpoint.replicas >= 0 : cfg->checkpoint.replicas > 0;
    return image + (replicas && world > 1 ? image : 0) + (size_t)slab * sizeof(float);
}

kiln_status kiln_train_memory_plan(const kiln_train_config *cfg, const kiln_gpt_config *mc,
                                   kiln_train_memory *p) {
    memset(p, 0, sizeof *p);
    kiln_gpt_memory model;
    KILN_CHECK(kiln_gpt_memory_plan_for(mc, cfg->data.B, cfg->data.T, &cfg->compute.model_opt, NULL,
                                        &model));
    kiln_dtype dt = cfg->compute.model_opt.dtype;
    int64_t slab = (int64_t)(model.params / kiln_dtype_size(dt));
    /* ZeRO 1 and 2: each rank's optimizer owns a world-th of the slab (its largest shard) */
    int world = cfg->dist.comm             ? kiln_comm_size(cfg->dist.comm)
                : cfg->dist.plan_world > 1 ? cfg->dist.plan_world
                                           : 1;
    int rank = cfg->dist.comm ? kiln_comm_rank(cfg->dist.comm) : 0;
    int64_t owned = world > 1 && cfg->dist.dp.zero >= 1 ? (slab + world - 1) / world + 16 : slab;
    if (owned > slab)
        owned = slab;
    size_t state = kiln_optim_state_bytes_for(&cfg->optim, owned, dt);
    /* master weights kept for the fake quantization */
    if (cfg->compress.qat_bits && dt == KILN_DTYPE_F32)
        state += (size_t)owned * sizeof(float);
    if (world > 1 && cfg->dist.local_steps > 0 &&
        (cfg->dist.outer_lr != 1.0f || cfg->dist.outer_momentum != 0.0f))
        state += (size_t)slab * 2 * sizeof(float); /* DiLoCo's outer weights and momentum */
    p->params = model.params;
    p->grads = model.grads;
    if (world > 1 && cfg->dist.dp.zero >= 2) { /* this rank's shard and what it gathers */
        int64_t pe = 0, ge = 0;
        kiln__zero3_resident(cfg, mc, rank, world, slab, &pe, &ge);
        if (cfg->dist.dp.zero == 3) /* ZeRO 2 holds every weight */
            p->params = (size_t)pe * kiln_dtype_size(dt);
        p->grads = (size_t)ge * sizeof(float);
        model.total = model.total - model.params - model.grads + p->params + p->grads;
    }
    p->master = dt == KILN_DTYPE_F32 && !cfg->compress.qat_bits ? 0 : (size_t)owned * sizeof(float);
    p->moments = state - p->master;
    p->activations = model.activations;
    p->workspace = model.workspace;
    if (world > 1) { /* MPI's scratch for a collective of one piece (4M elements) at a time,
                        in and out, a bf16 reduction's staging, every rank's embedding rows */
        size_t comm = (size_t)2 * (4 << 20) * sizeof(float);
        if (cfg->dist.dp.reduce_dtype == KILN_DTYPE_BF16)
            comm += (size_t)(4 << 20) * 2;
        if (kiln__trainer_rows_apart(cfg, mc, world))
            comm += kiln_dp_rows_bytes(world, cfg->data.B * cfg->data.T, mc->n_embd, dt);
        p->workspace += comm;
        model.total += comm;
    }
    /* (the ranks of a GPU run share no slab: each GPU holds its own) */
    if (world > 1 && cfg->dist.dp.zero <= 1 && cfg->dist.comm &&
        kiln_comm_shares_memory(cfg->dist.comm) && !wants_gpu(cfg)) {
        /* gradients: piece r of every other rank's to reduce, and (ZeRO 0) piece q of rank
         * q's to copy; weights: ZeRO 1's gather reads piece q of rank q's, and local SGD's
         * average of fp32 weights (no master copy) reads them as ZeRO 0 reads gradients;
         * with one copy of the weights for the machine, that copy is the parameters above,
         * and this rank's shard of it is written while its own copy still exists (the start).
         * Ranks on several machines: those of this machine, each reading a local share of
         * every other one's slab. */
        int local = kiln_comm_local_size(cfg->dist.comm);
        int64_t piece = (slab + local - 1) / local, others = local - 1;
        int64_t g = others * (cfg->dist.dp.zero == 0 ? 2 * piece : piece);
        p->common_weights = kiln__trainer_common_weights_apply(cfg, world);
        int64_t w = p->common_weights                                   ? (slab + world - 1) / world
                    : cfg->dist.dp.zero == 1                            ? piece * others
                    : cfg->dist.local_steps > 0 && dt == KILN_DTYPE_F32 ? 2 * piece * others
                                                                        : 0;
        p->peers = (size_t)(g < others * slab ? g : others * slab) * sizeof(float) +
                   (size_t)(w < others * slab ? w : others * slab) * kiln_dtype_size(dt);
    }
    p->batches =
        (size_t)(cfg->data.B * cfg->data.T) * 2 * sizeof(int32_t) * (cfg->data.val_path ? 2 : 1);
    p->checkpoint = checkpoint_staging(cfg, world, slab, owned, state);
    if (wants_gpu(cfg)) { /* the slabs on the GPU; a save reads the fp32 weights back */
        p->device = model.total + state + p->peers;
        p->host_copy = cfg->save.path ? (size_t)slab * sizeof(float) : 0;
        p->device_available = SIZE_MAX;
        kiln_cuda_info gi;
        if (kiln_cuda_device_info(&gi) == KILN_OK) {
            p->device_available = gi.mem_free;
            snprintf(p->device_what, sizeof p->device_what, "free on GPU %d (%.80s)", gi.device,
                     gi.name);
        } else {
            snprintf(p->device_what, sizeof p->device_what, "no usable GPU here");
        }
    }
    p->total = model.total + state + p->batches + p->checkpoint + p->peers + p->host_copy;
    /* a GPU run's room on the GPU besides the plan: cuBLASLt's workspace, the backend's
     * staging and reduction buffers, allocation rounding */
    p->device_headroom = p->device ? ((size_t)256 << 20) + p->device / 20 : 0;
    /* The process takes more than its slabs: its code, OpenBLAS's work buffers, the pages
     * of the data. A plan that leaves less than this beside it is refused rather than left
     * to the kernel's out-of-memory killer. */
    p->headroom = ((size_t)256 << 20) + (p->total - p->device) / 20;
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
    if (p->checkpoint)
        fprintf(log, " (with checkpoints' staging %s)", size_str(p->checkpoint).s);
    if (p->peers)
        fprintf(log, " (with %s of the other ranks' slabs read through shared memory)",
                size_str(p->peers).s);
    if (p->common_weights)
        fprintf(log, " (parameters: one copy for the machine's ranks from the first step)");
    if (p->device) {
        fprintf(log, " (on the GPU: %s", size_str(p->device).s);
        if (p->device_available != SIZE_MAX)
            fprintf(log, " of %s %s", size_str(p->device_available).s, p->device_what);
        else
            fprintf(log, "; %s", p->device_what);
        fprintf(log, "; on the host: %s", size_str(p->total - p->device).s);
        if (p->host_copy)
            fprintf(log, ", with the fp32 weights a save reads back, %s",
                    size_str(p->host_copy).s);
        if (p->available != SIZE_MAX)
            fprintf(log, ", of %s available", size_str(p->available).s);
        fprintf(log, ")");
    } else if (p->available != SIZE_MAX)
        fprintf(log, " of %s available", size_str(p->available).s);
    fprintf(log, "\n");
    if (p->process)
        fprintf(log, "planned peak: %s (the process held %s before the plan's memory)\n",
                size_str(p->process + p->total).s, size_str(p->process).s);
}

/* The whole plan against what the machine can give, before any of it is taken (and before
 * OpenBLAS's buffers or the peak measurement): a plan that cannot fit fails now with both
 * figures, not minutes later in an allocation. */
static kiln_status check_plan(kiln_trainer *t, const kiln_gpt_config *mc) {
    const kiln_train_config *cfg = &t->cfg;
    kiln_train_memory *p = &t->plan;
    KILN_CHECK(kiln_train_memory_plan(cfg, mc, p));
    size_t dh = p->device_headroom;
    if (p->device && p->device_available != SIZE_MAX &&
        (p->device > p->device_available || dh > p->device_available - p->device)) {
        size_t need = p->device + dh;
        return kiln_error_setf(KILN_ERR_NOMEM,
                               "the run is planned to take %s of GPU memory (parameters %s, "
                               "gradients %s, master weights %s, optimizer moments %s, "
                               "activations %s, workspace %s at B=%lld, T=%lld) and about %s more "
                               "for cuBLASLt and the kernels, but %s is %s: %s short; use a "
                               "smaller batch (--batch) or sequence length (--seq), "
                               "recomputation (--recompute), a narrower precision (--precision "
                               "bf16), a smaller model, or the CPU (--device cpu)",
                               size_str(p->device).s, size_str(p->params).s, size_str(p->grads).s,
                               size_str(p->master).s, size_str(p->moments).s,
                               size_str(p->activations).s, size_str(p->workspace).s,
                               (long long)cfg->data.B, (long long)cfg->data.T, size_str(dh).s,
                               size_str(p->device_available).s, p->device_what,
                               size_str(need - p->device_available).s);
    }
    size_t host = p->total - p->device; /* the whole plan on the CPU */
    if (host <= p->available && p->headroom <= p->available - host)
        return KILN_OK;
    if (p->device) {
        size_t need = host + p->headroom;
        return kiln_error_setf(KILN_ERR_NOMEM,
                               "the run's host memory (batches %s, checkpoints' staging %s, the "
                               "weights a save reads back %s) and about %s more for the process "
                               "itself come to %s, but %s is available (%s): %s short",
                               size_str(p->batches).s, size_str(p->checkpoint).s,
                               size_str(p->host_copy).s, size_str(p->headroom).s,
                               size_str(need).s, size_str(p->available).s, p->available_what,
                               size_str(need > p->available ? need - p->available : 0).s);
    }
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
                           size_str(p->batches).s, (long long)cfg->data.B, (long long)cfg->data.T,
                           size_str(p->headroom).s, size_str(p->available).s, p->available_what,
                           size_str(need > p->available ? need - p->available : 0).s);
}

/* The starting weights in fp32: into the optimizer's master copy when the working weights are
 * narrower (then rounded into them), else into the working weights themselves. A master copy
 * of a shard (ZeRO) is cut from the whole slab's, which also gives every working weight. */
static kiln_status init_weights(kiln_trainer *t) {
    const kiln_train_config *cfg = &t->cfg;
    float *master = kiln_optim_master(t->opt);
    int64_t n = kiln_gpt_slab_len(t->model);
    if (t->zero3 && !cfg->init_path) { /* ZeRO 3: this rank's shard alone, never the slab */
        float *dst = master ? master : (float *)kiln_gpt_params(t->model) + t->shard_lo;
        kiln_gpt_init_weights_f32_range(t->model, cfg->seed, t->shard_lo, t->shard_hi, dst);
        return master ? kiln_optim_write_working(t->opt, kiln_gpt_params(t->model)) : KILN_OK;
    }
    if (!master) { /* the model writes its working weights through the backend's copy */
        if (cfg->init_path)
            return kiln__trainer_load_slab(t, cfg->init_path, kiln_gpt_params(t->model),
                                           kiln_gpt_dtype(t->model));
        kiln_gpt_init_weights(t->model, cfg->seed);
        return t->be->synchronize(t->be);
    }
    /* staged slabs (a GPU's) take the whole slab made on the host and copied over */
    int whole = t->shard_lo == 0 && t->shard_hi == n;
    float *full = whole && !t->staged ? master : malloc((size_t)n * sizeof *full);
    if (!full)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the starting weights");
    kiln_status s = KILN_OK;
    if (cfg->init_path)
        s = kiln_gpt_load_slab(t->model, cfg->init_path, full, KILN_DTYPE_F32);
    else
        kiln_gpt_init_weights_f32(t->model, cfg->seed, full);
    if (s == KILN_OK && whole && full != master)
        s = kiln__trainer_to_device(t, master, full, (size_t)n * sizeof *full);
    if (s == KILN_OK && whole)
        s = kiln_optim_write_working(t->opt, kiln_gpt_params(t->model));
    if (s == KILN_OK && !whole) {
        memcpy(master, full + t->shard_lo, (size_t)(t->shard_hi - t->shard_lo) * sizeof *full);
        kiln_convert(kiln_gpt_params(t->model), kiln_gpt_dtype(t->model), full, KILN_DTYPE_F32, n);
    }
    if (full != master)
        free(full);
    return s;
}

/* The training data: each rank its slice of every global batch of world x B sequences; with
 * uneven ranks, rank r's micro-batches are slices offset + m of a batch cut in micro_total
 * slices of B (offset: the micro-batches of the ranks before it), one loader each. */
static kiln_status open_train_data(kiln_trainer *t) {
    const kiln_train_config *cfg = &t->cfg;
    kiln_loader_config lc = {.path = cfg->data.train_path,
                             .B = cfg->data.B,
                             .T = cfg->data.T,
                             .rank = t->rank,
                             .world = t->world,
                             .seed = cfg->seed,
                             .shuffle = 1};
    t->micro = cfg->data.grad_accum;
    t->micro_total = cfg->data.grad_accum * t->world;
    /* the split in force is the trainer's own copy: chosen again from step times (auto), or
     * with an even one to start from */
    if (cfg->dist.rank_batches || (cfg->dist.rank_batches_auto > 0 && t->world > 1)) {
        t->rank_batches = calloc((size_t)t->world, sizeof *t->rank_batches);
        if (!t->rank_batches)
            return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
        for (int r = 0; r < t->world; r++)
            t->rank_batches[r] =
                cfg->dist.rank_batches ? cfg->dist.rank_batches[r] : cfg->data.grad_accum;
        if (!cfg->dist.rank_batches)
            t->cfg.data.grad_accum = 1;
        t->cfg.dist.rank_batches = t->rank_batches;
    }
    if (!cfg->dist.rank_batches)
        return kiln_loader_open(&t->train, &lc);
    if (cfg->data.grad_accum != 1)
        return kiln_error_setf(KILN_ERR_CONFIG, "uneven ranks (rank_batches) set each rank's "
                                                "micro-batches: grad_accum must be 1");
    int64_t offset = 0, total = 0;
    for (int r = 0; r < t->world; r++) {
        if (cfg->dist.rank_batches[r] < 1 || cfg->dist.rank_batches[r] > 4096)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "rank %d's micro-batches per step are %lld: 1 to 4096", r,
                                   (long long)cfg->dist.rank_batches[r]);
        if (r < t->rank)
            offset += cfg->dist.rank_batches[r];
        total += cfg->dist.rank_batches[r];
    }
    t->micro = cfg->dist.rank_batches[t->rank];
    t->micro_total = total;
    t->micro_loaders = calloc((size_t)t->micro, sizeof *t->micro_loaders);
    if (!t->micro_loaders)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the loaders");
    lc.world = (int)total;
    for (int64_t m = 0; m < t->micro; m++) {
        lc.rank = (int)(offset + m);
        KILN_CHECK(kiln_loader_open(&t->micro_loaders[m], &lc));
    }
    t->train = t->micro_loaders[0]; /* for the data's vocabulary, tokenizer and size */
    return KILN_OK;
}

/* Everything before the first step, into t (zeroed, its cfg set); kiln_trainer_free undoes
 * whatever part of it was done. */
static kiln_status trainer_init(kiln_trainer *t) {
    const kiln_train_config *cfg = &t->cfg;
    kiln__trainer_dist_setup(t);
    if (t->rank != 0) {                  /* one console and one metrics file: rank 0's */
        t->cfg.metrics.log = NULL;
        t->cfg.metrics.path = NULL;
        t->cfg.metrics.tensorboard_dir = NULL;
    }
    t->saved_step = -1;
    t->last_val_loss = NAN;
    if (cfg->data.B < 1 || cfg->data.T < 1 || cfg->data.grad_accum < 1 || cfg->steps < 0)
        return kiln_error_setf(KILN_ERR_CONFIG, "batch, sequence, accumulation must be positive");
    /* before any work: heartbeats from here (hangs from the first step), and a checkpoint
     * folder in use stops the run now */
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_START, NULL));
    if (cfg->data.eval_every < 0 || (cfg->data.eval_every > 0 && !cfg->data.val_path))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "evaluating every %lld steps needs validation data (a val_path), "
                               "and the interval must be >= 0",
                               (long long)cfg->data.eval_every);
    KILN_CHECK(kiln_optim_config_check(&cfg->optim));
    t->sched = cfg->lr;
    if (t->sched.total_steps <= 0)
        t->sched.total_steps = cfg->steps;
    KILN_CHECK(kiln_lr_schedule_check(&t->sched));
    KILN_CHECK(open_train_data(t));
    /* Validation data is opened (and checked) now, not at the first evaluation. */
    if (cfg->data.val_path) {
        kiln_loader_config vc = {.path = cfg->data.val_path,
                                 .B = cfg->data.B,
                                 .T = cfg->data.T,
                                 .rank = t->rank,
                                 .world = t->world,
                                 .shuffle = 0};
        KILN_CHECK(kiln_loader_open(&t->val, &vc));
        if (kiln_loader_vocab_size(t->val) != kiln_loader_vocab_size(t->train))
            return kiln_error_setf(
                KILN_ERR_CONFIG, "%s holds a %lld-token vocabulary but %s holds %lld",
                cfg->data.val_path, (long long)kiln_loader_vocab_size(t->val), cfg->data.train_path,
                (long long)kiln_loader_vocab_size(t->train));
    }
    kiln_gpt_config mc = cfg->model;
    int64_t data_vocab = kiln_loader_vocab_size(t->train);
    if (cfg->init_path) {
        KILN_CHECK(kiln_gpt_config_from_safetensors(&mc, cfg->init_path));
        if (data_vocab != mc.vocab_size)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "%s was written with a %lld-token vocabulary but the weights "
                                   "in %s have %lld: tokenize the data with the model's tokenizer",
                                   cfg->data.train_path, (long long)data_vocab, cfg->init_path,
                                   (long long)mc.vocab_size);
    } else if (mc.vocab_size == 0) {
        mc.vocab_size = data_vocab;
    } else if (mc.vocab_size != data_vocab) {
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s was written with a %lld-token vocabulary, but the model's "
                               "vocab_size is %lld: tokenize the data with the model's tokenizer, "
                               "or leave the model's vocab_size unset to take the data's",
                               cfg->data.train_path, (long long)data_vocab,
                               (long long)mc.vocab_size);
    }
    KILN_CHECK(kiln_gpt_config_validate(&mc));
    if (cfg->data.T > mc.max_seq_len)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "sequence length %lld is beyond the context of %lld",
                               (long long)cfg->data.T, (long long)mc.max_seq_len);
    KILN_CHECK(choose_backend(t));
    KILN_CHECK(check_plan(t, &mc));
    struct stat st;
    t->save_existed = cfg->save.path && stat(cfg->save.path, &st) == 0;
    /* What the process holds before the plan's memory (its code, the data's pages, the
     * backend's own buffers, which prepare takes now): the planned peak is this plus the
     * plan, and the measured peak is compared with it. */
    if (t->gpu) { /* MFU against the GPU's data-sheet peak of the precision trained in */
        kiln_cuda_info gi;
        KILN_CHECK(kiln_cuda_device_info(&gi));
        int narrow = cfg->compute.model_opt.dtype != KILN_DTYPE_F32;
        t->peak = cfg->compute.peak_gflops > 0
                      ? cfg->compute.peak_gflops
                      : 1e3 * (narrow ? gi.peak_tflops_16 : gi.peak_tflops_32);
        snprintf(t->peak_what, sizeof t->peak_what, "%.100s: %.160s%s", gi.name,
                 cfg->compute.peak_gflops > 0 ? "--peak-gflops" : gi.peak_source,
                 cfg->compute.peak_gflops > 0 ? ""
                 : narrow                     ? ", dense 16-bit tensor cores"
                                              : ", fp32 CUDA cores");
    } else {
        kiln_backend *cpu = kiln_backend_cpu();
        if (cpu->prepare)
            KILN_CHECK(cpu->prepare(cpu));
        /* MFU is against the matrix-product rate of the precision trained in (bf16 products
         * run at about twice fp32's here; fp16 products widen to fp32 on the CPU). Measured
         * before the model exists: its matrices (about 100 MiB) are freed before the plan's
         * memory is taken, so they never add to the peak. */
        kiln_dtype peak_dt =
            cfg->compute.model_opt.dtype == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
        t->peak = cfg->compute.peak_gflops > 0
                      ? cfg->compute.peak_gflops
                      : kiln_backend_cpu_peak_gflops_dtype(peak_dt, 3072, 1.0);
        kiln_backend_cpu_warm_products(cfg->data.B * cfg->data.T < 256 ? cfg->data.B * cfg->data.T
                                                                       : 256,
                                       mc.n_embd, mc.padded_vocab_size);
    }
    t->plan.process = kiln_current_rss();
    /* ZeRO 3: slabs that take memory only where written */
    /* ZeRO 2 and 3: slabs that take memory only where written (2: the gradients not this
     * rank's give their pages back once reduced; 3: the weights too) */
    t->cfg.compute.model_opt.sharded = cfg->dist.dp.zero >= 2 && t->world > 1;
    KILN_CHECK(kiln__trainer_shared_slabs(t));
    if (t->gpu) {
        kiln_cuda_info gi;
        KILN_CHECK(kiln_cuda_device_info(&gi));
        t->device_used0 = gi.mem_total - gi.mem_free;
    }
    KILN_CHECK(kiln_gpt_create(&t->model, &mc, cfg->data.B, cfg->data.T, &cfg->compute.model_opt,
                               t->gpu ? t->be : NULL));
    KILN_CHECK(kiln__trainer_dist_start(t));
    KILN_CHECK(build_optimizer(t));
    KILN_CHECK(init_weights(t));
    t->scaler = cfg->compute.loss_scaler;
    t->inputs = malloc((size_t)(cfg->data.B * cfg->data.T) * sizeof *t->inputs);
    t->targets = malloc((size_t)(cfg->data.B * cfg->data.T) * sizeof *t->targets);
    if (!t->inputs || !t->targets)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a batch");
    /* the features' own starts: local SGD's state, the guards, the resume (before the metrics
     * file, truncated when opened: a checkpoint that is refused leaves every file of the run as
     * it was), pruning's mask, the teacher, QAT's first weights, the metrics files */
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_INIT, NULL));
    t->flops_per_step = kiln_gpt_flops_per_token(&mc, cfg->data.T) *
                        (double)(cfg->data.B * cfg->data.T) * (double)t->micro;
    print_plan(t);
    return KILN_OK;
}

kiln_status kiln_trainer_create(kiln_trainer **out, const kiln_train_config *cfg) {
    *out = NULL;
    kiln_trainer *t = calloc(1, sizeof *t);
    if (!t)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the trainer");
    t->cfg = *cfg;
    t->faults = *kiln__trainer_faults_get(); /* tests' switches, as they are now */
    kiln_status s = trainer_init(t);
    /* an agreement inside found a failed rank already: that was this start's agreement */
    if (!t->agreed_failure)
        s = kiln__trainer_agree(t, s, "to start");
    if (s == KILN_OK) /* the checks across ranks, and what every rank does together */
        s = kiln__trainer_phase(t, KILN__PHASE_READY, NULL);
    if (s) {
        kiln_trainer_free(t);
        return s;
    }
    t->wall0_ms = kiln_time_ms();
    *out = t;
    return KILN_OK;
}

/* A step runs in phases, so that data parallelism can put its communication between them:
 * (a) forward and backward over the micro-batches, (b) the gradients' synchronisation,
 * (c) the global norm, the non-finite checks and the clip coefficient, (d) the update.
 * The loss scale S (fp16; 1 otherwise) multiplies the gradients from (a) to (c). */

/* (a) The step's gradients, summed over this rank's micro-batches into the zeroed slab;
 * *loss is the sum of their losses. Each micro-batch's loss is divided by every rank's
 * micro-batches together, so that the sum the reduction makes is the mean over the whole
 * step's batch, and the last micro-batch's backward hands each finished range of gradients
 * to the reduction. */
kiln_status kiln__trainer_forward_backward(kiln_trainer *t, float S, double *loss) {
    const kiln_train_config *cfg = &t->cfg;
    if (t->world > 1 && t->cfg.dist.dp.zero >= 2) /* the rest is zero: the reduction gave it back */
        kiln_gpt_backend(t->model)->zero(kiln_gpt_backend(t->model),
                                         kiln_gpt_grads(t->model) + t->shard_lo,
                                         (size_t)(t->shard_hi - t->shard_lo) * sizeof(float));
    else
        kiln_gpt_zero_grad(t->model);
    double sum = 0.0;
    /* local SGD: each rank's own mean */
    float scale = S / (float)(t->cfg.dist.local_steps > 0 ? t->micro : t->micro_total);
    kiln_gpt_set_embed_rows_apart(t->model, 0); /* and no rows from an earlier step */
    for (int64_t micro = 0; micro < t->micro; micro++) {
        float l = 0.0f;
        kiln_loader *ld = t->micro_loaders ? t->micro_loaders[micro] : t->train;
        kiln_status rd = kiln_loader_next(ld, t->inputs, t->targets);
        if (rd != KILN_OK) /* the weights are still the last step's: kept, then the error */
            return kiln__trainer_data_failed(t, rd);
        kiln__phase_args pa = {.micro = micro};
        KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_BEFORE_FORWARD, &pa));
        int last = t->dp && !t->cfg.dist.local_steps && micro == t->micro - 1;
        if (last)
            KILN_CHECK(kiln_dp_begin(t->dp, kiln_gpt_grads(t->model)));
        kiln_gpt_set_embed_rows_apart(t->model, last && t->rows_apart);
        KILN_CHECK(kiln_gpt_forward_backward(t->model, t->inputs, t->targets, cfg->data.B,
                                             cfg->data.T, scale, &l));
        sum += l;
        for (int64_t b = 0; t->probe_seq && b < cfg->data.B; b++)
            KILN_CHECK(kiln_gpt_forward(t->model, t->inputs + b * cfg->data.T,
                                        t->targets + b * cfg->data.T, 1, cfg->data.T,
                                        &t->probe_seq[micro * cfg->data.B + b]));
    }
    *loss = sum;
    return KILN_OK;
}

/* (b) Every process's gradients made the same (their mean over the processes; with ZeRO 2,
 * on this rank's shard), then the loss and the gradients' sum of squares over all ranks. A
 * fault injected on purpose (tests) makes one gradient infinite, after the reduction. */
kiln_status kiln__trainer_sync_gradients(kiln_trainer *t, double *loss, double *sumsq) {
    int64_t step = t->steps_done + 1;
    int inject = t->faults.nonfinite_step == step && step > t->high_water;
    KILN_CHECK(kiln__trainer_dist_sync(t, loss, sumsq, inject));
    kiln__phase_args a = {.step = step, .loss = loss, .sumsq = sumsq};
    return kiln__trainer_phase(t, KILN__PHASE_AFTER_SYNC, &a);
}

/* (c) The norm of the gradients as the loss scale left them (sumsq: their sum of squares);
 * the optimizer then reads them divided by the scale and clipped (torch.nn.utils.
 * clip_grad_norm_: max_norm / (norm + 1e-6) when < 1), the factor in *coef. A step the guards
 * judge bad (a non-finite loss or norm, a spike) skips its update (mt->skipped, mt->guard),
 * except an fp16 overflow (a finite loss, a non-finite norm), which is the loss scaler's: it
 * skips the update and backs the scale off. Every rank sees the same loss and norm, so every
 * rank decides alike. */
static kiln_status clip_coefficient(kiln_trainer *t, float S, double sumsq, kiln_step_info *mt,
                                    double *coef) {
    const kiln_train_config *cfg = &t->cfg;
    int scaled = kiln_gpt_dtype(t->model) == KILN_DTYPE_F16;
    double norm_scaled = sqrt(sumsq);
    mt->grad_norm = (float)(norm_scaled / S);
    if (scaled && isfinite(mt->loss) && !isfinite(norm_scaled)) {
        mt->skipped = 1;
        return kiln_loss_scaler_update(&t->scaler, 0);
    }
    kiln__phase_args a = {.step = mt->step, .mt = mt};
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_JUDGE, &a));
    if (mt->skipped)
        return KILN_OK;
    *coef = 1.0 / S;
    if (cfg->grad_clip > 0.0f && (double)cfg->grad_clip / (mt->grad_norm + 1e-6) < 1.0)
        *coef *= (double)cfg->grad_clip / (mt->grad_norm + 1e-6);
    if (scaled)
        return kiln_loss_scaler_update(&t->scaler, 1);
    return KILN_OK;
}

/* One optimizer step: fills mt's loss, lr, grad_norm and skipped. */
static kiln_status train_step(kiln_trainer *t, kiln_step_info *mt) {
    float S = kiln_gpt_dtype(t->model) == KILN_DTYPE_F16 ? t->scaler.scale : 1.0f;
    double loss = 0.0, sumsq = 0.0;
    KILN_CHECK(kiln__trainer_forward_backward(t, S, &loss));
    KILN_CHECK(kiln__trainer_sync_gradients(t, &loss, &sumsq));
    mt->loss = (float)loss;
    mt->lr = kiln_lr_at(&t->sched, t->steps_done);
    double coef = 1.0;
    KILN_CHECK(clip_coefficient(t, S, sumsq, mt, &coef));
    /* (d) the scale's division and the clipping in the optimizer's own pass, over this
     * rank's range; then what follows an update (or takes its place: local SGD's averages
     * are every rank's, whatever one rank skipped) */
    kiln__phase_args a = {.step = mt->step, .updated = !mt->skipped};
    if (a.updated)
        KILN_CHECK(kiln_optim_step_scaled(t->opt, kiln_gpt_params(t->model),
                                          kiln_gpt_grads(t->model), mt->lr, (float)coef));
    return kiln__trainer_phase(t, KILN__PHASE_AFTER_UPDATE, &a);
}

kiln_status kiln_trainer_evaluate(kiln_trainer *t, double *val_loss) {
    if (!t->val)
        return kiln_error_setf(KILN_ERR_CONFIG, "no validation data to evaluate (a val_path)");
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_BEFORE_EVAL, NULL));
    KILN_CHECK(kiln_evaluate(t->model, t->val, t->cfg.data.B, t->cfg.data.T,
                             t->cfg.data.eval_batches, val_loss, NULL));
    /* each rank evaluated its slice of every batch: the mean of the means is one process's
     * mean over batches of world x B */
    KILN_CHECK(kiln__trainer_dist_mean(t, val_loss));
    t->last_val_loss = (float)*val_loss;
    return KILN_OK;
}

kiln_status kiln_trainer_step(kiln_trainer *t, kiln_step_info *info) {
    const kiln_train_config *cfg = &t->cfg;
    if (t->steps_done >= cfg->steps)
        return kiln_error_setf(KILN_ERR_ARG, "the run's %lld steps are done",
                               (long long)cfg->steps);
    kiln_step_info mt = {.step = t->steps_done + 1, .steps = cfg->steps, .val_loss = NAN};
    double t0 = kiln_time_ms();
    kiln__phase_args a = {.step = mt.step, .mt = &mt};
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_STEP_BEGIN, &a));
    KILN_CHECK(train_step(t, &mt));
    if (kiln_gpt_dtype(t->model) == KILN_DTYPE_F16) {
        mt.loss_scale = t->scaler.scale;
        mt.skipped_total = t->scaler.skipped;
    }
    /* before the step's figures: the agreements' traffic is this step's */
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_STEP_SYNC, &a));
    mt.ms = kiln_time_ms() - t0;
    mt.tokens_per_s = (double)(cfg->data.B * cfg->data.T * t->micro_total) / (mt.ms / 1e3);
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_STEP_FIGURES, &a));
    mt.mfu = t->flops_per_step / (mt.ms / 1e3) / (t->peak * 1e9);
    if (t->steps_done == 0)
        t->first_loss = mt.loss;
    if (t->steps_done > t->resumed_step) /* this process's first step warms caches: left out */
        t->later_ms += mt.ms;
    t->last_loss = mt.loss;
    t->steps_done = mt.step;
    /* Validation data is evaluated every eval_every steps, and always after the last. */
    int due =
        mt.step == cfg->steps || (cfg->data.eval_every > 0 && mt.step % cfg->data.eval_every == 0);
    if (t->val && due) {
        double vl = 0.0;
        KILN_CHECK(kiln_trainer_evaluate(t, &vl));
        mt.val_loss = (float)vl;
    }
    mt.rss = kiln_peak_rss();
    double now = kiln_time_ms();
    mt.elapsed_s = (now - t->wall0_ms) / 1e3;
    mt.eta_s = NAN;
    if (t->first_end_step == 0) {
        t->first_end_ms = now;
        t->first_end_step = mt.step;
    } else if (mt.step > t->first_end_step) {
        double per_ms = (now - t->first_end_ms) / (double)(mt.step - t->first_end_step);
        mt.eta_s = per_ms * (double)(cfg->steps - mt.step) / 1e3;
    }
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_STEP_REPORT, &a));
    if (info)
        *info = mt;
    return kiln__trainer_phase(t, KILN__PHASE_STEP_END, &a);
}

kiln_status kiln_trainer_save_now(kiln_trainer *t, const char **where) {
    *where = NULL;
    if (t->steps_done == 0)
        return kiln_error_setf(KILN_ERR_CONFIG, "no step is done yet: nothing to save");
    kiln__phase_args a = {.step = t->steps_done, .where = where};
    KILN_CHECK(kiln__trainer_phase(t, KILN__PHASE_SAVE_NOW, &a));
    if (!*where)
        return kiln_error_setf(KILN_ERR_CONFIG, "neither a checkpoint folder nor a --save file "
                                                "to save to");
    return KILN_OK;
}

int kiln_trainer_stopping(const kiln_trainer *t) {
    return t->stopping;
}
int64_t kiln_trainer_steps_done(const kiln_trainer *t) {
    return t->steps_done;
}
kiln_gpt *kiln_trainer_model(kiln_trainer *t) {
    return t->model;
}
kiln_optim *kiln_trainer_optim(kiln_trainer *t) {
    return t->opt;
}

void kiln_trainer_result(const kiln_trainer *t, kiln_train_result *res) {
    const kiln_train_config *cfg = &t->cfg;
    memset(res, 0, sizeof *res);
    res->steps = t->steps_done;
    res->first_loss = t->first_loss;
    res->last_loss = t->last_loss;
    res->last_val_loss = t->last_val_loss;
    res->peak_gflops = t->peak;
    int64_t timed = t->steps_done - t->resumed_step - 1; /* steps in later_ms */
    if (timed > 0) { /* the first step (warming caches and pages) is left out */
        res->mean_ms = t->later_ms / (double)timed;
        res->tokens_per_s =
            (double)(cfg->data.B * cfg->data.T * t->micro_total) / (res->mean_ms / 1e3);
        res->mfu = t->flops_per_step / (res->mean_ms / 1e3) / (t->peak * 1e9);
    }
    res->peak_rss = kiln_peak_rss();
    res->planned_peak = t->plan.process + t->plan.total - t->plan.device;
    kiln_cuda_info gi;
    if (t->gpu && kiln_cuda_device_info(&gi) == KILN_OK) {
        size_t used = gi.mem_total - gi.mem_free;
        res->device_used = used > t->device_used0 ? used - t->device_used0 : 0;
        res->device_planned = t->plan.device;
    }
    res->skipped_steps = t->scaler.skipped;
    res->loss_scale = t->scaler.scale;
    res->checkpoints_missed = t->ckpt_missed;
    res->first_missed_step = t->ckpt_first_missed;
    res->checkpoint_step = t->ckpt_step;
    snprintf(res->missed_why, sizeof res->missed_why, "%s", t->ckpt_why);
}

/* No steps: the data, the model and the plan are checked; nothing is trained, and nothing is
 * saved (the starting weights would replace a --save file with nothing learned). */
kiln_status kiln_train(const kiln_train_config *cfg, kiln_train_result *res) {
    kiln_trainer *t = NULL;
    memset(res, 0, sizeof *res);
    res->last_val_loss = NAN;
    kiln_status s = kiln_trainer_create(&t, cfg);
    while (s == KILN_OK && !kiln_trainer_stopping(t) && kiln_trainer_steps_done(t) < cfg->steps)
        s = kiln_trainer_step(t, NULL);
    if (t)
        kiln_trainer_result(t, res);
    kiln_trainer_free(t);
    return s;
}
