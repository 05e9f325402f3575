/* GPT model construction: the parameter layout (tensor table and views), the planned
 * activation slab, and initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "model/gpt_internal.h"

typedef struct layout_builder {
    kiln_tensor_info *t;
    int n;
    int64_t offset;
} layout_builder;

static void add_tensor(layout_builder *lb, const char *name, int layer, int ndim, int64_t d0,
                       int64_t d1) {
    kiln_tensor_info *ti = &lb->t[lb->n++];
    memset(ti, 0, sizeof *ti);
    snprintf(ti->name, sizeof ti->name, "%s", name);
    ti->offset = lb->offset;
    ti->ndim = ndim;
    ti->shape[0] = d0;
    ti->shape[1] = ndim > 1 ? d1 : 0;
    ti->numel = ndim > 1 ? d0 * d1 : d0;
    ti->decay = ndim > 1;
    ti->layer = layer;
    lb->offset += ti->numel;
}

static void add_block_tensor(layout_builder *lb, int layer, const char *suffix, int ndim,
                             int64_t d0, int64_t d1) {
    char name[64];
    snprintf(name, sizeof name, "h.%d.%s", layer, suffix);
    add_tensor(lb, name, layer, ndim, d0, d1);
}

/* Tensor table in slab order (see model.h). Returns the slab length. */
static int64_t build_layout(kiln_gpt *m) {
    int64_t C = m->cfg.n_embd, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    layout_builder lb = {m->tensors, 0, 0};
    add_tensor(&lb, "wte.weight", -1, 2, V, C);
    lb.offset += (Vp - V) * C; /* padded rows: in the slab, in no tensor */
    add_tensor(&lb, "wpe.weight", -1, 2, m->cfg.max_seq_len, C);
    for (int l = 0; l < (int)m->cfg.n_layer; l++) {
        add_block_tensor(&lb, l, "ln_1.weight", 1, C, 0);
        add_block_tensor(&lb, l, "ln_1.bias", 1, C, 0);
        add_block_tensor(&lb, l, "attn.c_attn.weight", 2, C, 3 * C);
        add_block_tensor(&lb, l, "attn.c_attn.bias", 1, 3 * C, 0);
        add_block_tensor(&lb, l, "attn.c_proj.weight", 2, C, C);
        add_block_tensor(&lb, l, "attn.c_proj.bias", 1, C, 0);
        add_block_tensor(&lb, l, "ln_2.weight", 1, C, 0);
        add_block_tensor(&lb, l, "ln_2.bias", 1, C, 0);
        add_block_tensor(&lb, l, "mlp.c_fc.weight", 2, C, 4 * C);
        add_block_tensor(&lb, l, "mlp.c_fc.bias", 1, 4 * C, 0);
        add_block_tensor(&lb, l, "mlp.c_proj.weight", 2, 4 * C, C);
        add_block_tensor(&lb, l, "mlp.c_proj.bias", 1, C, 0);
    }
    add_tensor(&lb, "ln_f.weight", -1, 1, C, 0);
    add_tensor(&lb, "ln_f.bias", -1, 1, C, 0);
    m->ntensors = lb.n;
    return lb.offset;
}

/* Point views at a slab, following the tensor table's order. */
static void bind_views(const kiln_gpt *m, gpt_params *v, float *slab) {
    const kiln_tensor_info *t = m->tensors;
    v->wte = slab + t[0].offset;
    v->wpe = slab + t[1].offset;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        const kiln_tensor_info *b = &t[2 + 12 * l];
        gpt_block_params *bp = &v->block[l];
        float **fields[12] = {&bp->ln1w,     &bp->ln1b,     &bp->qkvw, &bp->qkvb,
                              &bp->attprojw, &bp->attprojb, &bp->ln2w, &bp->ln2b,
                              &bp->fcw,      &bp->fcb,      &bp->fcprojw, &bp->fcprojb};
        for (int k = 0; k < 12; k++)
            *fields[k] = slab + b[k].offset;
    }
    v->lnfw = slab + t[m->ntensors - 2].offset;
    v->lnfb = slab + t[m->ntensors - 1].offset;
}

/* Carve the activation slab. With base == NULL it only counts, writing no view (so a model
 * that holds only its config, sizes and inference flag can be counted); returns the floats
 * needed. */
static int64_t carve_acts(kiln_gpt *m, float *base) {
    int64_t B = m->maxB, T = m->maxT, C = m->cfg.n_embd, NH = m->cfg.n_head;
    int64_t BT = B * T, Vp = m->cfg.padded_vocab_size;
    int64_t off = 0;
    gpt_block_acts unused;
    /* Each buffer starts on a 64-byte boundary for aligned vector loads. */
#define CARVE(ptr, n)                                 \
    do {                                              \
        if (base)                                     \
            (ptr) = base + off;                       \
        off += ((int64_t)(n) + 15) / 16 * 16;         \
    } while (0)
    CARVE(m->encoded, BT * C);
    /* Forward alone reads a block's activations only while that block runs (its output
     * is written after its input's last read), so in inference every block uses block 0's. */
    int64_t carved = m->inference ? 1 : m->cfg.n_layer;
    for (int64_t l = 0; l < carved; l++) {
        gpt_block_acts *a = base ? &m->blocks[l] : &unused;
        CARVE(a->ln1, BT * C);
        CARVE(a->ln1_mean, BT);
        CARVE(a->ln1_rstd, BT);
        CARVE(a->qkv, BT * 3 * C);
        CARVE(a->atty, BT * C);
        CARVE(a->att, B * NH * T * T);
        CARVE(a->res2, BT * C);
        CARVE(a->ln2, BT * C);
        CARVE(a->ln2_mean, BT);
        CARVE(a->ln2_rstd, BT);
        CARVE(a->fch, BT * 4 * C);
        CARVE(a->fch_gelu, BT * 4 * C);
        CARVE(a->res3, BT * C);
    }
    if (base)
        for (int64_t l = carved; l < m->cfg.n_layer; l++)
            m->blocks[l] = m->blocks[0];
    gpt_grad_scratch *d = &m->d;
    CARVE(m->lnf, BT * C);
    CARVE(m->lnf_mean, BT);
    CARVE(m->lnf_rstd, BT);
    CARVE(m->logits, BT * Vp);
    CARVE(m->losses, BT);
    if (!m->inference) {
        CARVE(d->dres, BT * C);
        CARVE(d->dln, BT * C);
        CARVE(d->datty, BT * C);
        CARVE(d->dqkv, BT * 3 * C);
        CARVE(d->dfch, BT * 4 * C);
        CARVE(d->dfch_gelu, BT * 4 * C);
        CARVE(d->datt, B * NH * T * T);
    }
#undef CARVE
    return off;
}

/* Sizes a model of cfg (validated here into *cfg) can be planned for. */
static kiln_status check_sizes(kiln_gpt_config *cfg, int64_t B, int64_t T) {
    KILN_CHECK(kiln_gpt_config_validate(cfg));
    if (B < 1)
        return kiln_error_setf(KILN_ERR_CONFIG, "batch size %lld must be at least 1", (long long)B);
    if (T < 1 || T > cfg->max_seq_len)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "sequence length %lld is outside the model's context 1..%lld",
                               (long long)T, (long long)cfg->max_seq_len);
    if ((double)B * (double)T * (double)cfg->n_head * (double)T > 1e11 ||
        (double)B * (double)T * (double)cfg->padded_vocab_size > 1e11)
        return kiln_error_setf(KILN_ERR_CONFIG, "batch %lld x %lld is too large to plan",
                               (long long)B, (long long)T);
    return KILN_OK;
}

kiln_status kiln_gpt_memory_plan_for(const kiln_gpt_config *cfg_in, int64_t B, int64_t T,
                                     int inference, kiln_gpt_memory *out) {
    if (!cfg_in || !out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_memory_plan_for: NULL argument");
    memset(out, 0, sizeof *out);
    kiln_gpt m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg_in;
    KILN_CHECK(check_sizes(&m.cfg, B, T));
    m.maxB = B;
    m.maxT = T;
    m.inference = inference != 0;
    /* The slab: every parameter and the padded embedding rows (see build_layout). */
    int64_t slab = kiln_gpt_config_num_params(&m.cfg) +
                   (m.cfg.padded_vocab_size - m.cfg.vocab_size) * m.cfg.n_embd;
    out->params = (size_t)slab * sizeof(float);
    out->grads = inference ? 0 : out->params;
    out->activations = (size_t)carve_acts(&m, NULL) * sizeof(float);
    out->total = out->params + out->grads + out->activations;
    return KILN_OK;
}

/* The model's own memory must fit what the process can still take: one message with the
 * whole plan, before any of it is taken. */
static kiln_status check_fits(const kiln_gpt_memory *mem) {
    const char *what = NULL;
    size_t avail = kiln_memory_available(&what);
    if (mem->total <= avail)
        return KILN_OK;
    double mib = 1024.0 * 1024.0;
    return kiln_error_setf(KILN_ERR_NOMEM,
                           "the model needs %.1f MiB (parameters %.1f MiB, gradients %.1f MiB, "
                           "activations %.1f MiB) but %.1f MiB is available (%s): use a smaller "
                           "batch or sequence length, or a smaller model",
                           (double)mem->total / mib, (double)mem->params / mib,
                           (double)mem->grads / mib, (double)mem->activations / mib,
                           (double)avail / mib, what);
}

static kiln_status gpt_create(kiln_gpt **out, const kiln_gpt_config *cfg_in, int64_t B,
                              int64_t T, const kiln_backend *be, int inference) {
    *out = NULL;
    kiln_gpt_config cfg = *cfg_in;
    kiln_gpt_memory plan;
    KILN_CHECK(kiln_gpt_memory_plan_for(&cfg, B, T, inference, &plan));
    KILN_CHECK(check_fits(&plan));
    KILN_CHECK(kiln_gpt_config_validate(&cfg));
    if (!be)
        be = kiln_backend_cpu();
    if (be->prepare)
        KILN_CHECK(be->prepare());
    kiln_status s = KILN_ERR_NOMEM;
    kiln_gpt *m = calloc(1, sizeof *m);
    if (!m)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the model");
    m->cfg = cfg;
    m->be = be;
    m->inference = inference;
    m->maxB = B;
    m->maxT = T;
    int64_t L = cfg.n_layer;
    m->tensors = calloc((size_t)(4 + 12 * L), sizeof *m->tensors);
    m->p.block = calloc((size_t)L, sizeof *m->p.block);
    m->g.block = calloc((size_t)L, sizeof *m->g.block);
    m->blocks = calloc((size_t)L, sizeof *m->blocks);
    m->inputs = calloc((size_t)(B * T), sizeof *m->inputs);
    m->targets = calloc((size_t)(B * T), sizeof *m->targets);
    if (!m->tensors || !m->p.block || !m->g.block || !m->blocks || !m->inputs || !m->targets) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the model's tables");
        goto fail;
    }
    m->slab_len = build_layout(m);
    size_t slab_bytes = (size_t)m->slab_len * sizeof(float);
    KILN_CHECK_GOTO(s, kiln_alloc_checked((void **)&m->params, slab_bytes, "parameters"), fail);
    bind_views(m, &m->p, m->params);
    if (!inference) {
        KILN_CHECK_GOTO(s, kiln_alloc_checked((void **)&m->grads, slab_bytes, "gradients"), fail);
        bind_views(m, &m->g, m->grads);
    }
    m->acts_bytes = (size_t)carve_acts(m, NULL) * sizeof(float);
    KILN_CHECK_GOTO(s, kiln_alloc_checked((void **)&m->acts, m->acts_bytes, "activations"), fail);
    carve_acts(m, m->acts);
    *out = m;
    return KILN_OK;
fail:
    kiln_gpt_free(m);
    return s;
}

kiln_status kiln_gpt_create(kiln_gpt **out, const kiln_gpt_config *cfg, int64_t B, int64_t T,
                            const kiln_backend *be) {
    return gpt_create(out, cfg, B, T, be, 0);
}

kiln_status kiln_gpt_create_inference(kiln_gpt **out, const kiln_gpt_config *cfg, int64_t B,
                                      int64_t T, const kiln_backend *be) {
    return gpt_create(out, cfg, B, T, be, 1);
}

void kiln_gpt_free(kiln_gpt *m) {
    if (!m)
        return;
    kiln_free(m->acts);
    kiln_free(m->grads);
    kiln_free(m->params);
    free(m->targets);
    free(m->inputs);
    free(m->blocks);
    free(m->g.block);
    free(m->p.block);
    free(m->tensors);
    free(m);
}

void kiln_gpt_init_weights(kiln_gpt *m, uint64_t seed) {
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    memset(m->params, 0, (size_t)m->slab_len * sizeof(float));
    for (int i = 0; i < m->ntensors; i++) {
        const kiln_tensor_info *t = &m->tensors[i];
        float *x = m->params + t->offset;
        int is_ln = strstr(t->name, "ln_") != NULL;
        if (is_ln && strstr(t->name, ".weight")) {
            for (int64_t k = 0; k < t->numel; k++)
                x[k] = 1.0f;
        } else if (t->ndim == 2) {
            int resid = strstr(t->name, "c_proj.weight") != NULL;
            float std = resid ? resid_std : 0.02f;
            for (int64_t k = 0; k < t->numel; k++)
                x[k] = std * kiln_rng_normal(&rng);
        } /* biases stay 0 */
    }
}

const kiln_gpt_config *kiln_gpt_get_config(const kiln_gpt *m) { return &m->cfg; }
const kiln_backend *kiln_gpt_backend(const kiln_gpt *m) { return m->be; }
int64_t kiln_gpt_max_batch(const kiln_gpt *m) { return m->maxB; }
int64_t kiln_gpt_max_seq(const kiln_gpt *m) { return m->maxT; }
float *kiln_gpt_params(kiln_gpt *m) { return m->params; }
float *kiln_gpt_grads(kiln_gpt *m) { return m->grads; }
int64_t kiln_gpt_slab_len(const kiln_gpt *m) { return m->slab_len; }
int kiln_gpt_num_tensors(const kiln_gpt *m) { return m->ntensors; }

const kiln_tensor_info *kiln_gpt_tensor(const kiln_gpt *m, int i) {
    return i >= 0 && i < m->ntensors ? &m->tensors[i] : NULL;
}

int kiln_gpt_find_tensor(const kiln_gpt *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return i;
    return -1;
}

kiln_gpt_memory kiln_gpt_memory_plan(const kiln_gpt *m) {
    kiln_gpt_memory mem;
    mem.params = (size_t)m->slab_len * sizeof(float);
    mem.grads = m->grads ? mem.params : 0;
    mem.activations = m->acts_bytes;
    mem.total = mem.params + mem.grads + mem.activations;
    return mem;
}

kiln_status kiln_gpt_check_finite(const kiln_gpt *m) {
    for (int i = 0; i < m->ntensors; i++) {
        const kiln_tensor_info *t = &m->tensors[i];
        if (!isfinite(m->be->sumsq(m->params + t->offset, t->numel)))
            return kiln_error_setf(KILN_ERR_RANGE, "tensor %s holds NaN or infinite values",
                                   t->name);
    }
    return KILN_OK;
}
