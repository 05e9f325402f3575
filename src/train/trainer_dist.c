/* What data parallelism adds to the trainer: the same start on every rank, the gradient
 * reduction between backward and the norm, the gather of updated shards, and the figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "kiln/core.h"
#include "train/trainer_data.h"
#include "train/trainer_elastic.h"
#include "train/trainer_internal.h"

void kiln__trainer_dist_setup(kiln_trainer *t) {
    t->comm = t->cfg.dist.comm;
    t->rank = t->comm ? kiln_comm_rank(t->comm) : 0;
    t->world = t->comm ? kiln_comm_size(t->comm) : 1;
}

kiln_status kiln__trainer_agree(kiln_trainer *t, kiln_status local, const char *what) {
    if (t->world <= 1)
        return local;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", local != KILN_OK ? kiln_error_message() : "");
    /* the highest failed rank + 1 (0: none); floats hold these integers exactly */
    float failed = local != KILN_OK ? (float)(t->rank + 1) : 0.0f;
    kiln_status s =
        kiln_comm_allreduce(&failed, &failed, 1, KILN_DTYPE_F32, KILN_REDUCE_MAX, t->comm);
    if (s == KILN_OK && failed > 0.0f)
        t->agreed_failure = 1;
    if (local != KILN_OK)
        return kiln_error_setf(local, "%s", msg);
    if (s != KILN_OK)
        return s;
    if (failed > 0.0f)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "rank %d failed %s (its message says why); rank %d stops too",
                               (int)failed - 1, what, t->rank);
    return KILN_OK;
}

kiln_status kiln__trainer_agree_stop(kiln_trainer *t, int64_t step, int local, int *stop) {
    *stop = local != 0;
    if (t->world <= 1)
        return KILN_OK;
    /* local SGD's ranks do not talk between averages (no waiting for the slowest): they
     * agree at the averages alone, and a stop waits for the next one */
    if (t->cfg.dist.local_steps > 0 && !kiln__trainer_local_sync_due(t, step)) {
        *stop = 0;
        return KILN_OK;
    }
    float any = local != 0 ? 1.0f : 0.0f;
    KILN_CHECK(kiln_comm_allreduce(&any, &any, 1, KILN_DTYPE_F32, KILN_REDUCE_MAX, t->comm));
    *stop = any > 0.0f;
    return KILN_OK;
}

static void grad_ready(void *ctx, int64_t lo, int64_t hi) {
    kiln_dp_ready(ctx, lo, hi);
}

/* ---- several ranks on GPUs ---- */

/* This rank's place among the ranks of its machine (by host name), their number, and whether
 * the launcher gave each of them GPUs of its own (CUDA_VISIBLE_DEVICES set, and different, on
 * every one of them: Slurm's --gpus-per-task, say). */
static kiln_status machine_place(kiln_trainer *t, int *local, int *count, int *own_gpus) {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "?");
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    uint64_t mine[2] = {XXH3_64bits(host, strlen(host)),
                        vis && vis[0] ? XXH3_64bits(vis, strlen(vis)) | 1 : 0};
    uint64_t *all = calloc((size_t)t->world * 2, sizeof *all);
    int64_t *counts = calloc((size_t)t->world, sizeof *counts);
    kiln_status s = all && counts ? KILN_OK : kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    for (int r = 0; s == KILN_OK && r < t->world; r++)
        counts[r] = 4; /* two hashes as four floats' bytes: allgather moves bytes */
    if (s == KILN_OK) {
        memcpy(all + 2 * t->rank, mine, sizeof mine);
        s = kiln_comm_allgather(all + 2 * t->rank, all, counts, KILN_DTYPE_F32, t->comm);
    }
    *local = *count = 0;
    *own_gpus = mine[1] != 0;
    for (int r = 0; s == KILN_OK && r < t->world; r++) {
        if (all[2 * r] != mine[0])
            continue;
        *local += r < t->rank;
        (*count)++;
        if (all[2 * r + 1] == 0 || (r != t->rank && all[2 * r + 1] == mine[1]))
            *own_gpus = 0;
    }
    free(all);
    free(counts);
    return s;
}

kiln_status kiln__trainer_gpu_ranks(kiln_trainer *t) {
    /* a rank that failed before this point stops here with the others */
    KILN_CHECK(kiln__trainer_agree(t, KILN_OK, "to start"));
    int local = 0, count = 0, own = 0, gpus = 0;
    KILN_CHECK(machine_place(t, &local, &count, &own));
    /* GPUs of its own: the first of them; GPUs the machine's ranks all see: its place's */
    kiln_status s = kiln_cuda_select(own ? 0 : local, &gpus);
    if (!own && gpus > 0 && gpus < count) /* (ranks past the last GPU were refused already) */
        s = kiln_error_setf(KILN_ERR_CONFIG,
                            "%d ranks run on this machine and each needs a GPU of its own, but %d "
                            "%s visible: start at most %d ranks a machine, or run on the CPU "
                            "(--device cpu)",
                            count, gpus, gpus == 1 ? "is" : "are", gpus);
    KILN_CHECK(kiln__trainer_agree(t, s, "to choose its GPU"));
    s = kiln_comm_init_nccl(t->comm, &t->dcomm);
    if (s != KILN_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s", kiln_error_message());
        return kiln_error_setf(s, "data parallelism across GPUs needs NCCL: %s", why);
    }
    return KILN_OK;
}

/* ---- slabs the ranks of one machine share ---- */

static void *shared_slab(void *ctx, size_t bytes, const char *what) {
    kiln_trainer *t = ctx;
    void *p = NULL;
    kiln_status s = kiln_comm_alloc_shared(t->comm, bytes, &p);
    if (s != KILN_OK || !p) {
        char why[512];
        snprintf(why, sizeof why, "%s", s != KILN_OK ? kiln_error_message() : "none given");
        kiln_error_setf(KILN_ERR_NOMEM, "%.1f MiB in memory the ranks share: %s",
                        (double)bytes / (1 << 20), why);
        return NULL;
    }
    (void)what;
    return p;
}

static void shared_slab_free(void *ctx, void *p, size_t bytes) {
    (void)bytes;
    kiln_comm_free_shared(((kiln_trainer *)ctx)->comm, p);
}

kiln_status kiln__trainer_shared_slabs(kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    /* ZeRO 2 and 3 map slabs that give pages back (not shared memory's way), and one
     * process has nobody to share with */
    if (t->world <= 1 || c->dist.dp.zero >= 2 || t->staged || !kiln_comm_shares_memory(t->comm))
        return KILN_OK; /* (a GPU's slabs are its own memory) */
    KILN_CHECK(kiln__trainer_agree(t, KILN_OK, "to start")); /* before its model */
    t->cfg.compute.model_opt.slabs = (kiln_slab_allocator){shared_slab, shared_slab_free, t};
    t->shared_slabs = 1;
    return KILN_OK;
}

/* ---- one copy of the weights for the machine's ranks (ZeRO 1) ---- */

static int common_weights_possible(const kiln_train_config *c, int world) {
    return world > 1 && c->dist.dp.zero == 1 && c->dist.comm &&
           kiln_comm_shares_memory(c->dist.comm) && c->dist.local_steps <= 0 &&
           c->compress.prune_sparsity <= 0.0 && c->compress.qat_bits == 0;
}

static int common_weights_refused(void) {
    return kiln__trainer_faults_get()->separate_weights;
}

int kiln__trainer_common_weights_apply(const kiln_train_config *c, int world) {
    return common_weights_possible(c, world) && !common_weights_refused();
}

kiln_status kiln__trainer_common_weights(kiln_trainer *t) {
    if (!t->shared_slabs || !common_weights_possible(&t->cfg, t->world))
        return KILN_OK;
    /* every rank decides alike only if every rank was given the same switch: agree on it,
     * since the allocation below is collective */
    float off = t->faults.separate_weights ? 1.0f : 0.0f;
    KILN_CHECK(kiln_comm_allreduce(&off, &off, 1, KILN_DTYPE_F32, KILN_REDUCE_MAX, t->comm));
    if (off > 0.0f)
        return KILN_OK;
    size_t es = kiln_dtype_size(kiln_gpt_dtype(t->model));
    void *common = NULL, *old = NULL;
    kiln_status s =
        kiln_comm_alloc_common(t->comm, (size_t)kiln_gpt_slab_len(t->model) * es, &common);
    s = kiln__trainer_agree(t, s, "to share the weights");
    if (s != KILN_OK || !common) { /* every rank alike */
        kiln_comm_free_shared(t->comm, common);
        return s;
    }
    /* each rank's shard, which its optimizer updates from now on; the gather (a barrier
     * for memory every rank shares) makes them every rank's */
    memcpy((char *)common + (size_t)t->shard_lo * es,
           (const char *)kiln_gpt_params(t->model) + (size_t)t->shard_lo * es,
           (size_t)(t->shard_hi - t->shard_lo) * es);
    s = kiln_gpt_swap_params(t->model, common, &old);
    if (s != KILN_OK) {
        kiln_comm_free_shared(t->comm, common);
        return s;
    }
    s = kiln__trainer_dist_gather(t);
    kiln_status f = kiln_comm_free_shared_now(t->comm, old);
    return s != KILN_OK ? s : f;
}

/* ---- ZeRO 3: parts of the weights gathered for use, kept while there is room ---- */

enum { PART_ABSENT, PART_COMING, PART_HERE };
enum { PARTS_KEPT = 4 }; /* a block and the next one's (fused tail), ln_f and wte, a prefetch */

static void part_range(kiln_trainer *t, int i, int64_t *lo, int64_t *hi) {
    kiln_gpt_part_range(t->model, i - 1, lo, hi);
}

static void part_drop(kiln_trainer *t, int i) {
    int64_t lo, hi;
    part_range(t, i, &lo, &hi);
    kiln_dp_discard_range(t->dp, kiln_gpt_params(t->model), kiln_gpt_dtype(t->model), lo, hi);
    t->part_state[i] = PART_ABSENT;
}

/* Room for one more part: the least recently used ones that are here go, but never a or b. */
static void make_room(kiln_trainer *t, int a, int b) {
    for (;;) {
        int held = 0, victim = -1;
        for (int i = 0; i < t->nparts; i++) {
            if (t->part_state[i] == PART_ABSENT)
                continue;
            held++;
            if (t->part_state[i] == PART_HERE && i != a && i != b &&
                (victim < 0 || t->part_used[i] < t->part_used[victim]))
                victim = i;
        }
        if (held < PARTS_KEPT || victim < 0)
            return;
        part_drop(t, victim);
    }
}

static kiln_status part_fetch(kiln_trainer *t, int i) {
    int64_t lo, hi;
    part_range(t, i, &lo, &hi);
    KILN_CHECK(kiln_dp_gather_range_async(t->dp, kiln_gpt_params(t->model),
                                          kiln_gpt_dtype(t->model), lo, hi, &t->part_ticket[i]));
    t->part_state[i] = PART_COMING;
    t->part_used[i] = ++t->part_clock;
    return KILN_OK;
}

static kiln_status param_need(void *ctx, int part, int next) {
    kiln_trainer *t = ctx;
    int i = part + 1, j = next >= -1 && next + 1 < t->nparts ? next + 1 : -1;
    if (i < 0 || i >= t->nparts)
        return kiln_error_setf(KILN_ERR_ARG, "ZeRO 3: no part %d of the model", part);
    if (t->part_state[i] == PART_ABSENT) {
        make_room(t, i, j);
        KILN_CHECK(part_fetch(t, i));
    }
    if (t->part_state[i] == PART_COMING) {
        KILN_CHECK(kiln_dp_wait(t->dp, t->part_ticket[i], NULL));
        t->part_state[i] = PART_HERE;
    }
    t->part_used[i] = ++t->part_clock;
    if (j >= 0 && t->part_state[j] == PART_ABSENT) { /* the next part, while this one computes */
        make_room(t, i, j);
        KILN_CHECK(part_fetch(t, j));
    }
    return KILN_OK;
}

static int64_t overlap(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    int64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0;
}

void kiln__zero3_resident(const kiln_train_config *cfg, const kiln_gpt_config *mc, int rank,
                          int world, int64_t slab, int64_t *params, int64_t *grads) {
    int64_t C = mc->n_embd, L = kiln_gpt_config_blocks(mc), lo, hi; /* blocks of weights */
    kiln_dp_shard_bounds(slab, world, rank, &lo, &hi);
    /* the parts in slab order: the embeddings, the blocks, ln_f (the rest of the slab) */
    /* a block's weights: what is neither embedding nor ln_f */
    int64_t block =
        (kiln_gpt_config_num_params(mc) - (mc->vocab_size + mc->max_seq_len) * C - 2 * C) / L;
    int64_t kept[PARTS_KEPT] = {0}, emb_extra = 0, at = 0;
    for (int64_t i = -1; i <= L; i++) {
        int64_t size = i < 0   ? (mc->padded_vocab_size + mc->max_seq_len) * C
                       : i < L ? block
                               : slab - at;
        int64_t extra = size - overlap(at, at + size, lo, hi);
        at += size;
        if (i < 0)
            emb_extra = extra;
        for (int k = 0; k < PARTS_KEPT; k++) { /* the PARTS_KEPT largest, kept sorted */
            if (extra > kept[k]) {
                int64_t t = kept[k];
                kept[k] = extra;
                extra = t;
            }
        }
    }
    int64_t gathered = 0;
    for (int k = 0; k < PARTS_KEPT; k++)
        gathered += kept[k];
    /* Gradients beyond the shard: wte's, which the head writes first and the embeddings'
     * bucket reduces last, and the buckets backward may run ahead by (kiln_dp_ready lets two
     * wait behind the one reducing while it fills the next; a bucket holds a block at least) */
    int64_t bucket =
        cfg->dist.dp.bucket_bytes > 0 ? cfg->dist.dp.bucket_bytes / (int64_t)sizeof(float) : slab;
    int64_t inflight = emb_extra + 4 * (bucket > block ? bucket : block);
    *params = (hi - lo) + (gathered < slab - (hi - lo) ? gathered : slab - (hi - lo));
    *grads = (hi - lo) + (inflight < slab - (hi - lo) ? inflight : slab - (hi - lo));
}

kiln_status kiln__trainer_zero3_drop_all(kiln_trainer *t) {
    if (!t->zero3)
        return KILN_OK;
    KILN_CHECK(kiln_dp_idle(t->dp)); /* a part still coming lands before it is dropped */
    for (int i = 0; i < t->nparts; i++)
        if (t->part_state[i] != PART_ABSENT)
            part_drop(t, i);
    return KILN_OK;
}

kiln_status kiln__trainer_zero3_need_all(kiln_trainer *t) {
    if (!t->zero3)
        return KILN_OK;
    for (int i = 0; i < t->nparts; i++) {
        if (t->part_state[i] == PART_ABSENT)
            KILN_CHECK(part_fetch(t, i));
    }
    KILN_CHECK(kiln_dp_idle(t->dp));
    for (int i = 0; i < t->nparts; i++)
        t->part_state[i] = PART_HERE;
    return KILN_OK;
}

int kiln__trainer_rows_apart(const kiln_train_config *cfg, const kiln_gpt_config *mc, int world) {
    /* the rows are added on the host: not for a GPU's slabs */
    int gpu = cfg->compute.device && !strcmp(cfg->compute.device, "cuda");
    if (world <= 1 || cfg->dist.local_steps > 0 || cfg->dist.dp.rows_apart == 0 || gpu ||
        mc->untied_head)
        return 0;
    int64_t vp = mc->padded_vocab_size ? mc->padded_vocab_size : mc->vocab_size;
    return cfg->dist.dp.rows_apart > 0 ||
           (int64_t)(world - 1) * cfg->data.B * cfg->data.T * 4 <= vp;
}

kiln_status kiln__trainer_dist_start(kiln_trainer *t) {
    int64_t n = kiln_gpt_slab_len(t->model);
    t->shard_lo = 0;
    t->shard_hi = n;
    if (t->world <= 1)
        return KILN_OK;
    enum { MAXR = 4096 };
    int64_t *lo = malloc(MAXR * sizeof *lo), *hi = malloc(MAXR * sizeof *hi);
    kiln_status s = KILN_OK;
    if (!lo || !hi) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
        goto done;
    }
    if (t->staged)
        t->cfg.dist.dp.rows_apart = 0; /* the rows are added on the host */
    t->rows_apart = kiln__trainer_rows_apart(&t->cfg, kiln_gpt_get_config(t->model), t->world);
    int k = t->rows_apart ? kiln_gpt_grad_ranges_apart(t->model, lo, hi, MAXR)
                          : kiln_gpt_grad_ranges(t->model, lo, hi, MAXR);
    if (k > MAXR) {
        s = kiln_error_setf(KILN_ERR_CONFIG, "data parallel: %d gradient ranges (at most %d)", k,
                            MAXR);
        goto done;
    }
    if (t->staged) /* a GPU's: NCCL's collectives queued on its streams (the staged CPU run's:
                      MPI's non-blocking ones) as backward reports each bucket */
        KILN_CHECK_GOTO(s,
                        kiln_dp_create_queued(&t->dp, t->dcomm ? t->dcomm : t->comm, t->comm,
                                              &t->cfg.dist.dp, n, lo, hi, k),
                        done);
    else
        KILN_CHECK_GOTO(s, kiln_dp_create(&t->dp, t->comm, &t->cfg.dist.dp, n, lo, hi, k), done);
    kiln_gpt_set_grad_ready(t->model, grad_ready, t->dp);
    if (t->rows_apart)
        KILN_CHECK_GOTO(s,
                        kiln_dp_rows_reserve(t->dp, t->cfg.data.B * t->cfg.data.T,
                                             kiln_gpt_get_config(t->model)->n_embd,
                                             kiln_gpt_dtype(t->model)),
                        done);
    kiln_dp_shard(t->dp, &t->shard_lo, &t->shard_hi);
    if (t->cfg.dist.dp.zero == 3) {
        t->zero3 = 1;
        t->nparts = kiln_gpt_config_blocks(kiln_gpt_get_config(t->model)) + 2; /* the
                                                        embeddings, the blocks, ln_f */
        t->part_state = calloc((size_t)k, sizeof *t->part_state);
        t->part_ticket = calloc((size_t)k, sizeof *t->part_ticket);
        t->part_used = calloc((size_t)k, sizeof *t->part_used);
        if (!t->part_state || !t->part_ticket || !t->part_used) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "ZeRO 3: out of memory");
            goto done;
        }
        /* every part is here until the start's checks are done (kiln_trainer_create) */
        for (int i = 0; i < k; i++)
            t->part_state[i] = PART_HERE;
        kiln_gpt_set_param_need(t->model, param_need, t);
    }
done:
    free(lo);
    free(hi);
    return s;
}

/* ---- the same start on every rank ---- */

typedef struct hasher {
    uint64_t v[96];
    int n;
} hasher;

static void put_i(hasher *h, int64_t x) {
    h->v[h->n++] = (uint64_t)x;
}
static void put_f(hasher *h, double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    h->v[h->n++] = u;
}

static const char *optim_label(int v) {
    return kiln_optim_kind_name((kiln_optim_kind)v);
}
static const char *lr_label(int v) {
    return kiln_lr_kind_name((kiln_lr_kind)v);
}
static const char *dtype_label(int v) {
    return kiln_dtype_name((kiln_dtype)v);
}
static const char *family_label(int v) {
    return kiln_family_name((kiln_family)v);
}
static const char *recompute_label(int v) {
    return kiln_recompute_name((kiln_recompute)v);
}

int64_t kiln__trainer_global_batch(const kiln_trainer *t) {
    return t->cfg.data.B * t->micro_total;
}

int kiln__trainer_config_items(const kiln_trainer *t, const kiln_gpt_config *mc,
                               kiln__config_item *out) {
    const kiln_train_config *c = &t->cfg;
    int n = 0;
#define ITEM_I(nm, v) out[n++] = (kiln__config_item){.name = (nm), .kind = KILN__ITEM_INT, .i = (v)}
#define ITEM_E(nm, v, lb)                                                                          \
    out[n++] = (kiln__config_item) {                                                               \
        .name = (nm), .kind = KILN__ITEM_INT, .label = (lb), .i = (v)                              \
    }
#define ITEM_F(nm, v)                                                                              \
    out[n++] = (kiln__config_item) {                                                               \
        .name = (nm), .kind = KILN__ITEM_REAL, .f = (v)                                            \
    }
    ITEM_I("--layers", mc->n_layer);
    ITEM_I("--share-layers", mc->share_layers > 1 ? mc->share_layers : 1);
    ITEM_I("--heads", mc->n_head);
    ITEM_I("--embd", mc->n_embd);
    ITEM_I("--context", mc->max_seq_len);
    ITEM_I("--vocab", mc->vocab_size);
    if (mc->family != KILN_FAMILY_GPT2) { /* GPT-2's settings hash as they did before families */
        ITEM_E("the model family", mc->family, family_label);
        ITEM_I("the key/value heads", kiln_gpt_config_kv_heads(mc));
        ITEM_F("the norms' epsilon", kiln_gpt_config_norm_eps(mc));
        ITEM_F("the rotary base", kiln_gpt_config_rope_theta(mc));
        ITEM_I("an untied head", mc->untied_head);
    }
    ITEM_I("--seq", c->data.T);
    ITEM_I("the global batch (sequences per step)", kiln__trainer_global_batch(t));
    ITEM_I("--eval-every", c->data.eval_every);
    ITEM_I("--eval-batches", c->data.eval_batches);
    ITEM_I("--val-data (given or not)", !!c->data.val_path);
    ITEM_E("--optimizer", c->optim.kind, optim_label);
    ITEM_F("--beta1", c->optim.beta1);
    ITEM_F("--beta2", c->optim.beta2);
    ITEM_F("--eps", c->optim.eps);
    ITEM_F("--weight-decay", c->optim.weight_decay);
    ITEM_F("--momentum", c->optim.momentum);
    ITEM_F("--dampening", c->optim.dampening);
    ITEM_I("--nesterov", c->optim.nesterov);
    ITEM_F("--alpha", c->optim.alpha);
    ITEM_E("--schedule", t->sched.kind, lr_label);
    ITEM_F("--lr", t->sched.lr);
    ITEM_F("the final learning rate (--min-lr-frac x --lr)", t->sched.min_lr);
    ITEM_I("--warmup", t->sched.warmup_steps);
    ITEM_F("--grad-clip", c->grad_clip);
    out[n++] = (kiln__config_item){.name = "--seed", .kind = KILN__ITEM_HEX, .u = c->seed};
    ITEM_E("--precision", c->compute.model_opt.dtype, dtype_label);
    ITEM_E("--recompute", c->compute.model_opt.recompute, recompute_label);
    ITEM_I("--fuse-gelu", c->compute.model_opt.fuse_gelu);
    ITEM_I("--fuse-residual-ln", c->compute.model_opt.fuse_residual_ln);
    ITEM_I("--classifier-chunk", c->compute.model_opt.classifier_chunk);
    ITEM_I("--stochastic-rounding", c->compute.stochastic_rounding);
    ITEM_F("--loss-scale", c->compute.loss_scaler.scale);
    ITEM_I("the loss scaler's interval", c->compute.loss_scaler.interval);
    ITEM_E("--save-dtype", c->save.dtype, dtype_label);
    ITEM_I("--inject-nonfinite", t->faults.nonfinite_step);
    ITEM_I("--local-steps", c->dist.local_steps);
    ITEM_F("--outer-lr", c->dist.outer_lr);
    ITEM_F("--outer-momentum", c->dist.outer_momentum);
#undef ITEM_I
#undef ITEM_E
#undef ITEM_F
    return n;
}

/* The training itself: what a resumed run must share with the run that wrote its checkpoint. */
uint64_t kiln__trainer_config_hash(const kiln_trainer *t, const kiln_gpt_config *mc) {
    kiln__config_item items[KILN__CONFIG_ITEMS_MAX];
    int n = kiln__trainer_config_items(t, mc, items);
    hasher h = {.n = 0};
    for (int i = 0; i < n; i++) {
        if (items[i].kind == KILN__ITEM_REAL)
            put_f(&h, items[i].f);
        else
            put_i(&h, items[i].kind == KILN__ITEM_HEX ? (int64_t)items[i].u : items[i].i);
    }
    return XXH3_64bits(h.v, (size_t)h.n * sizeof h.v[0]);
}

uint64_t kiln__trainer_split_hash(const kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    hasher h = {.n = 0};
    put_i(&h, t->world), put_i(&h, c->data.B), put_i(&h, c->data.grad_accum);
    put_i(&h, c->dist.rank_batches
                  ? (int64_t)XXH3_64bits(c->dist.rank_batches, (size_t)t->world * sizeof(int64_t))
                  : -1);
    put_i(&h, c->steps), put_i(&h, t->sched.total_steps);
    put_i(&h, c->dist.dp.zero), put_i(&h, c->dist.dp.bucket_bytes),
        put_i(&h, c->dist.dp.reduce_dtype);
    put_i(&h, t->rows_apart);
    return XXH3_64bits(h.v, (size_t)h.n * sizeof h.v[0]);
}

uint64_t kiln__trainer_data_hash(const kiln_trainer *t) {
    hasher h = {.n = 0};
    put_i(&h, kiln_loader_num_tokens(t->train));
    put_i(&h, kiln_loader_num_windows(t->train));
    put_i(&h, (int64_t)kiln_loader_tokenizer_id(t->train));
    put_i(&h, kiln_loader_vocab_size(t->train));
    put_i(&h, t->val ? kiln_loader_num_tokens(t->val) : -1);
    return XXH3_64bits(h.v, (size_t)h.n * sizeof h.v[0]);
}

/* What each rank's data is, to name the files when the ranks' data differ. */
enum { DATA_NAME = 512 };
typedef struct data_record {
    uint64_t sizes, train, val; /* kiln__trainer_data_hash; each split's content hash */
    char train_path[DATA_NAME], val_path[DATA_NAME];
} data_record;

/* Every rank found that some rank's data differ from rank 0's: all gather each rank's files
 * and hashes, and all give the same error, naming the first such rank's file and rank 0's. */
static kiln_status data_differ(kiln_trainer *t) {
    data_record mine = {kiln__trainer_data_hash(t), kiln_loader_content_hash(t->train),
                        t->val ? kiln_loader_content_hash(t->val) : 0, "", ""};
    snprintf(mine.train_path, DATA_NAME, "%s",
             t->cfg.data.train_path ? t->cfg.data.train_path : "");
    snprintf(mine.val_path, DATA_NAME, "%s", t->cfg.data.val_path ? t->cfg.data.val_path : "");
    data_record *all = calloc((size_t)t->world, sizeof *all);
    int64_t *counts = calloc((size_t)t->world, sizeof *counts);
    kiln_status s = KILN_OK;
    if (!all || !counts) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
        goto done;
    }
    for (int r = 0; r < t->world; r++)
        counts[r] = (int64_t)(sizeof mine / 4); /* bytes moved as floats */
    all[t->rank] = mine;
    KILN_CHECK_GOTO(s, kiln_comm_allgather(all + t->rank, all, counts, KILN_DTYPE_F32, t->comm),
                    done);
    for (int r = 1; r < t->world; r++) {
        const data_record *a = &all[r], *z = &all[0];
        int val = a->train == z->train && a->val != z->val;
        const char *pa = val ? a->val_path : a->train_path, *pz = val ? z->val_path : z->train_path;
        if (a->sizes != z->sizes)
            s = kiln_error_setf(KILN_ERR_CONFIG,
                                "the ranks do not train on the same data: rank %d's training or "
                                "validation data (%s, %s) differ in size from rank 0's (%s, %s); "
                                "every rank must be given the same files",
                                r, a->train_path, a->val_path[0] ? a->val_path : "none",
                                z->train_path, z->val_path[0] ? z->val_path : "none");
        else if (a->train != z->train || a->val != z->val)
            s = kiln_error_setf(KILN_ERR_CONFIG,
                                "the ranks do not train on the same data: rank %d's %s data %s "
                                "holds other tokens than rank 0's %s (the same token count; "
                                "content XXH3 %016llx and %016llx); every rank must be given the "
                                "same files",
                                r, val ? "validation" : "training", pa, pz,
                                (unsigned long long)(val ? a->val : a->train),
                                (unsigned long long)(val ? z->val : z->train));
        if (s != KILN_OK)
            break;
    }
    if (s == KILN_OK) /* the hashes differed, so some record does */
        s = kiln_error_setf(KILN_ERR_CONFIG, "the ranks do not train on the same data");
done:
    free(all);
    free(counts);
    return s;
}

kiln_status kiln__trainer_dist_check(kiln_trainer *t, const kiln_gpt_config *mc) {
    if (t->world <= 1)
        return KILN_OK;
    const int K = 3;
    /* the training and its split over the ranks: both the same on every rank */
    uint64_t both[2] = {kiln__trainer_config_hash(t, mc), kiln__trainer_split_hash(t)};
    /* the data by size and by content (the shards' checksums) */
    uint64_t data[2] = {kiln__trainer_data_hash(t), kiln__trainer_content_hash(t)};
    uint64_t mine[3] = {XXH3_64bits(both, sizeof both), XXH3_64bits(data, sizeof data), 0};
    kiln_gpt *m = t->model;
    /* ZeRO 3 from a seed: each rank made only its shard (the seed is in the configuration's
     * hash); otherwise every rank holds all the starting weights */
    if (!(t->zero3 && !t->cfg.init_path)) {
        size_t bytes = (size_t)kiln_gpt_slab_len(m) * kiln_dtype_size(kiln_gpt_dtype(m));
        void *w = t->staged ? malloc(bytes) : kiln_gpt_params(m);
        if (!w)
            return kiln_error_setf(KILN_ERR_NOMEM,
                                   "data parallel: no %zu bytes to hash the "
                                   "starting weights",
                                   bytes);
        kiln_status h =
            t->staged ? kiln__trainer_to_host(t, w, kiln_gpt_params(m), bytes) : KILN_OK;
        if (h == KILN_OK)
            mine[2] = XXH3_64bits(w, bytes);
        if (t->staged)
            free(w);
        KILN_CHECK(h);
    }
    uint64_t *all = calloc((size_t)t->world * K, sizeof *all);
    int64_t *counts = calloc((size_t)t->world, sizeof *counts);
    kiln_status s = KILN_OK;
    if (!all || !counts) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
        goto done;
    }
    /* 3 hashes as 6 floats' bytes: allgather moves bytes */
    for (int r = 0; r < t->world; r++)
        counts[r] = 2 * K;
    memcpy(all + (size_t)t->rank * K, mine, sizeof mine);
    KILN_CHECK_GOTO(
        s, kiln_comm_allgather(all + (size_t)t->rank * K, all, counts, KILN_DTYPE_F32, t->comm),
        done);
    static const char *what[3] = {"configuration (model, batch, optimizer, schedule, precision, "
                                  "seed or data-parallel flags)",
                                  "training or validation data", "starting weights"};
    for (int k = 0; k < K; k++) {
        char differ[256] = "";
        size_t used = 0;
        for (int r = 1; r < t->world; r++)
            if (all[(size_t)r * K + k] != all[k] && used < sizeof differ - 16)
                used += (size_t)snprintf(differ + used, sizeof differ - used, "%s%d",
                                         used ? ", " : "", r);
        if (used && k == 1) {
            s = data_differ(t);
            goto done;
        }
        if (used) {
            s = kiln_error_setf(KILN_ERR_CONFIG,
                                "the ranks do not train the same model: the %s of rank(s) %s "
                                "differ(s) from rank 0's; every rank must be started with the "
                                "same flags and files",
                                what[k], differ);
            goto done;
        }
    }
done:
    free(all);
    free(counts);
    if (t->dp) /* the start's own traffic is not the first step's */
        (void)kiln_dp_take_stats(t->dp);
    return s;
}

/* ---- a step ---- */

kiln_status kiln__trainer_dist_sync(kiln_trainer *t, double *loss, double *sumsq, int inject) {
    kiln_backend *be = kiln_gpt_backend(t->model);
    float *g = kiln_gpt_grads(t->model);
    float inf = INFINITY;
    if (t->world <= 1) {
        if (inject)
            be->copy(be, g, &inf, sizeof inf, KILN_COPY_TO_DEVICE);
        *sumsq = be->sumsq(be, KILN_DTYPE_F32, g, kiln_gpt_slab_len(t->model));
        *loss /= (double)t->micro_total;
        return KILN_OK;
    }
    if (t->cfg.dist.local_steps > 0) { /* local SGD: this rank's own gradients, loss and norm */
        if (inject)
            be->copy(be, g, &inf, sizeof inf, KILN_COPY_TO_DEVICE);
        *sumsq = be->sumsq(be, KILN_DTYPE_F32, g, kiln_gpt_slab_len(t->model));
        *loss /= (double)t->micro;
        return KILN_OK;
    }
    KILN_CHECK(kiln_dp_finish(t->dp));
    if (t->rows_apart) { /* every rank's embedding rows into wte's reduced gradient */
        const int32_t *ids;
        const void *rows;
        int64_t nr, wlo, whi;
        kiln_gpt_embed_rows(t->model, &ids, &rows, &nr);
        kiln_gpt_wte_range(t->model, &wlo, &whi);
        KILN_CHECK(kiln_dp_add_rows(t->dp, g, wlo, ids, rows, nr));
    }
    /* each rank's shard of the (reduced) gradients: together the whole slab once */
    int64_t lo, hi;
    kiln_dp_shard_of(t->dp, t->rank, &lo, &hi);
    if (inject && hi > lo)
        be->copy(be, g + lo, &inf, sizeof inf, KILN_COPY_TO_DEVICE);
    double v[2] = {*loss, hi > lo ? be->sumsq(be, KILN_DTYPE_F32, g + lo, hi - lo) : 0.0};
    KILN_CHECK(kiln_dp_allreduce_sums(t->dp, v, 2));
    *loss = v[0] / (double)t->micro_total;
    *sumsq = v[1];
    return KILN_OK;
}

kiln_status kiln__trainer_dist_gather(kiln_trainer *t) {
    if (!t->dp)
        return KILN_OK;
    return kiln_dp_gather(t->dp, kiln_gpt_params(t->model), kiln_gpt_dtype(t->model));
}

kiln_status kiln__trainer_gather_one(kiln_trainer *t, float mine, float **all) {
    *all = calloc((size_t)t->world, sizeof **all);
    int64_t *counts = calloc((size_t)t->world, sizeof *counts);
    kiln_status s = *all && counts ? KILN_OK : kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    for (int r = 0; s == KILN_OK && r < t->world; r++)
        counts[r] = 1;
    if (s == KILN_OK)
        s = kiln_comm_allgather(&mine, *all, counts, KILN_DTYPE_F32, t->comm);
    free(counts);
    if (s != KILN_OK) {
        free(*all);
        *all = NULL;
    }
    return s;
}

kiln_status kiln__trainer_dist_mean(kiln_trainer *t, double *v) {
    if (!t->dp)
        return KILN_OK;
    KILN_CHECK(kiln_dp_allreduce_sums(t->dp, v, 1));
    *v /= t->world;
    return KILN_OK;
}

kiln_status kiln__trainer_gather_master(kiln_trainer *t, float **full) {
    int64_t n = kiln_gpt_slab_len(t->model);
    *full = malloc((size_t)n * sizeof **full);
    if (!*full)
        return kiln_error_setf(KILN_ERR_NOMEM,
                               "cannot allocate %lld floats to gather the master weights",
                               (long long)n);
    kiln_status s = kiln__trainer_gather_master_into(t, *full);
    if (s != KILN_OK) {
        free(*full);
        *full = NULL;
    }
    return s;
}

kiln_status kiln__trainer_gather_master_into(kiln_trainer *t, float *full) {
    int64_t *counts = calloc((size_t)t->world, sizeof *counts);
    if (!counts)
        return kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
    for (int r = 0; r < t->world; r++) {
        int64_t lo, hi;
        kiln_dp_shard_of(t->dp, r, &lo, &hi);
        counts[r] = hi - lo;
    }
    /* this rank's shard to the host (a GPU's through the backend), then every rank's */
    kiln_status s = kiln__trainer_to_host(t, full + t->shard_lo, kiln_optim_master(t->opt),
                                          (size_t)(t->shard_hi - t->shard_lo) * sizeof(float));
    if (s == KILN_OK)
        s = kiln_comm_allgather(full + t->shard_lo, full, counts, KILN_DTYPE_F32, t->comm);
    free(counts);
    return s;
}

/* ---- local SGD and DiLoCo ---- */

kiln_status kiln__trainer_local_start(kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    if (c->dist.local_steps < 0)
        return kiln_error_setf(KILN_ERR_CONFIG, "local steps must be >= 0");
    if (c->dist.local_steps == 0)
        return KILN_OK;
    if (c->dist.dp.zero != 0)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "local SGD keeps a whole optimizer on every rank: it needs ZeRO 0, "
                               "not %d",
                               c->dist.dp.zero);
    if (!(c->dist.outer_lr > 0.0f && c->dist.outer_lr <= 2.0f) ||
        !(c->dist.outer_momentum >= 0.0f && c->dist.outer_momentum < 1.0f))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the outer learning rate must be in (0, 2] and the outer momentum "
                               "in [0, 1) (got %g, %g)",
                               (double)c->dist.outer_lr, (double)c->dist.outer_momentum);
    if (t->world <= 1 || (c->dist.outer_lr == 1.0f && c->dist.outer_momentum == 0.0f))
        return KILN_OK; /* plain averaging keeps nothing */
    int64_t n = kiln_gpt_slab_len(t->model);
    t->outer_weights = malloc((size_t)n * sizeof(float));
    t->outer_velocity = calloc((size_t)n, sizeof(float));
    if (!t->outer_weights || !t->outer_velocity)
        return kiln_error_setf(KILN_ERR_NOMEM,
                               "cannot allocate DiLoCo's outer state (2 x %lld "
                               "floats)",
                               (long long)n);
    float *master = kiln_optim_master(t->opt);
    if (master)
        memcpy(t->outer_weights, master, (size_t)n * sizeof(float));
    else
        memcpy(t->outer_weights, kiln_gpt_params(t->model), (size_t)n * sizeof(float));
    return KILN_OK;
}

int kiln__trainer_local_sync_due(const kiln_trainer *t, int64_t step) {
    return t->world > 1 && (step % t->cfg.dist.local_steps == 0 || step == t->cfg.steps);
}

kiln_status kiln__trainer_outer_step(kiln_trainer *t) {
    int64_t n = kiln_gpt_slab_len(t->model);
    float *master = kiln_optim_master(t->opt);
    float *x = master ? master : (float *)kiln_gpt_params(t->model);
    KILN_CHECK(kiln_dp_average(t->dp, x, n));
    if (t->outer_weights) {
        /* DiLoCo: outer gradient d = w - avg; v = mu v + d; w -= lr (d + mu v) (Nesterov) */
        float *w = t->outer_weights, *v = t->outer_velocity;
        float mu = t->cfg.dist.outer_momentum, lr = t->cfg.dist.outer_lr;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = w[i] - x[i];
            v[i] = mu * v[i] + d;
            w[i] -= lr * (d + mu * v[i]);
            x[i] = w[i];
        }
    }
    if (master)
        KILN_CHECK(kiln_optim_write_working(t->opt, kiln_gpt_params(t->model)));
    return KILN_OK;
}

void kiln__trainer_dist_stats(kiln_trainer *t, kiln_step_info *mt) {
    mt->world = t->world;
    if (!t->dp)
        return;
    kiln_dp_stats st = kiln_dp_take_stats(t->dp);
    double all = st.comm_s + st.other_s, exposed = st.exposed_s + st.other_s;
    mt->comm_ms = all * 1e3;
    mt->comm_hidden = all > 0 ? fmax(0.0, 1.0 - exposed / all) : 0.0;
    mt->comm_bytes = st.bytes;
    mt->net_bytes = st.net_bytes;
}
