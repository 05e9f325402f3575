/* GPT model construction: the parameter layout (tensor table and views), the planned
 * activation slab, and initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "model/gpt_internal.h"

/* Element k of a slab of dtype dt. */
static inline void *slab_at(void *slab, int64_t k, kiln_dtype dt) {
    return (char *)slab + k * (int64_t)kiln_dtype_size(dt);
}

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

/* A block matrix: "<name>.weight" (in,out), or when factored at rank r "<name>.weight_u"
 * (in,r) then "<name>.weight_v" (r,out). */
static void add_block_matrix(layout_builder *lb, const kiln_gpt_config *cfg, int layer, int kind,
                             const char *name) {
    int64_t in, out, r = cfg->rank[kind];
    kiln__gpt_matrix_shape(cfg, kind, &in, &out);
    char suffix[48];
    if (!r) {
        snprintf(suffix, sizeof suffix, "%s.weight", name);
        add_block_tensor(lb, layer, suffix, 2, in, out);
        return;
    }
    snprintf(suffix, sizeof suffix, "%s.weight_u", name);
    add_block_tensor(lb, layer, suffix, 2, in, r);
    snprintf(suffix, sizeof suffix, "%s.weight_v", name);
    add_block_tensor(lb, layer, suffix, 2, r, out);
}

int kiln__gpt_block_tensors(const kiln_gpt_config *cfg) {
    if (cfg->family == KILN_FAMILY_LLAMA)
        return 9;
    int n = 12;
    for (int k = 0; k < 4; k++)
        n += cfg->rank[k] > 0;
    return n;
}

/* A Llama's table, Hugging Face's names and (out, in) matrices: the embedding, each block's
 * input_layernorm, q, k, v and o projections (q, k and v one after another: one (Q, C) matrix
 * for the product), post_attention_layernorm, gate, up (one (2H, C) matrix) and down
 * projections, the final norm, and an untied head's lm_head (Vp rows, like the embedding). */
static int64_t build_layout_llama(kiln_gpt *m) {
    const kiln_gpt_config *cfg = &m->cfg;
    int64_t C = cfg->n_embd, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    int64_t A = kiln_gpt_config_attn_width(cfg), KV = kiln_gpt_config_kv_width(cfg);
    int64_t H = kiln_gpt_config_mlp_width(cfg);
    layout_builder lb = {m->tensors, 0, 0};
    add_tensor(&lb, "model.embed_tokens.weight", -1, 2, V, C);
    lb.offset += (Vp - V) * C;
    static const struct {
        const char *name;
        int what; /* 0: norm (C); else the matrix's (out, in): 1 q, 2 k/v, 3 o, 4 gate/up, 5 down */
    } block[9] = {{"input_layernorm.weight", 0},  {"self_attn.q_proj.weight", 1},
                  {"self_attn.k_proj.weight", 2}, {"self_attn.v_proj.weight", 2},
                  {"self_attn.o_proj.weight", 3}, {"post_attention_layernorm.weight", 0},
                  {"mlp.gate_proj.weight", 4},    {"mlp.up_proj.weight", 4},
                  {"mlp.down_proj.weight", 5}};
    for (int l = 0; l < (int)kiln_gpt_config_blocks(cfg); l++)
        for (int k = 0; k < 9; k++) {
            char name[64];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, block[k].name);
            const int64_t out[6] = {C, A, KV, C, H, C}, in[6] = {0, C, C, A, C, H};
            int w = block[k].what;
            add_tensor(&lb, name, l, w ? 2 : 1, out[w], in[w]);
        }
    add_tensor(&lb, "model.norm.weight", -1, 1, C, 0);
    if (cfg->untied_head) {
        add_tensor(&lb, "lm_head.weight", -1, 2, V, C);
        lb.offset += (Vp - V) * C;
    }
    m->ntensors = lb.n;
    m->nembed = 1;
    m->tw = 1;
    return lb.offset;
}

/* Tensor table in slab order (see model.h). Returns the slab length. */
static int64_t build_layout(kiln_gpt *m) {
    if (m->cfg.family == KILN_FAMILY_LLAMA)
        return build_layout_llama(m);
    const kiln_gpt_config *cfg = &m->cfg;
    int64_t C = cfg->n_embd, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    layout_builder lb = {m->tensors, 0, 0};
    add_tensor(&lb, "wte.weight", -1, 2, V, C);
    lb.offset += (Vp - V) * C; /* padded rows: in the slab, in no tensor */
    add_tensor(&lb, "wpe.weight", -1, 2, cfg->max_seq_len, C);
    for (int l = 0; l < (int)kiln_gpt_config_blocks(cfg); l++) { /* shared: fewer */
        add_block_tensor(&lb, l, "ln_1.weight", 1, C, 0);
        add_block_tensor(&lb, l, "ln_1.bias", 1, C, 0);
        add_block_matrix(&lb, cfg, l, KILN_GPT_MATRIX_QKV, "attn.c_attn");
        add_block_tensor(&lb, l, "attn.c_attn.bias", 1, 3 * kiln_gpt_config_attn_width(cfg), 0);
        add_block_matrix(&lb, cfg, l, KILN_GPT_MATRIX_ATTPROJ, "attn.c_proj");
        add_block_tensor(&lb, l, "attn.c_proj.bias", 1, C, 0);
        add_block_tensor(&lb, l, "ln_2.weight", 1, C, 0);
        add_block_tensor(&lb, l, "ln_2.bias", 1, C, 0);
        add_block_matrix(&lb, cfg, l, KILN_GPT_MATRIX_FC, "mlp.c_fc");
        add_block_tensor(&lb, l, "mlp.c_fc.bias", 1, kiln_gpt_config_mlp_width(cfg), 0);
        add_block_matrix(&lb, cfg, l, KILN_GPT_MATRIX_FCPROJ, "mlp.c_proj");
        add_block_tensor(&lb, l, "mlp.c_proj.bias", 1, C, 0);
    }
    add_tensor(&lb, "ln_f.weight", -1, 1, C, 0);
    add_tensor(&lb, "ln_f.bias", -1, 1, C, 0);
    m->ntensors = lb.n;
    m->nembed = 2;
    m->tw = 0;
    return lb.offset;
}

/* Part p's first tensor is t[e + n p] (e embedding tensors, n tensors a block) for the blocks
 * and for the head (p = L: ln_f.weight, or model.norm.weight then an untied lm_head), so each
 * part runs from its first tensor to the next part's; the embeddings start at 0 (wte's padded
 * rows are theirs) and the last part ends at the slab's end. */
void kiln__gpt_part_range(const kiln_gpt *m, int64_t part, int64_t *lo, int64_t *hi) {
    int64_t L = kiln_gpt_config_blocks(&m->cfg); /* parts are blocks of weights */
    int64_t n = kiln__gpt_block_tensors(&m->cfg), e = m->nembed;
    *lo = part < 0 ? 0 : m->tensors[e + n * part].offset;
    *hi = part < L ? m->tensors[e + n * (part + 1)].offset : m->slab_len;
}

void kiln_gpt_part_range(const kiln_gpt *m, int part, int64_t *lo, int64_t *hi) {
    kiln__gpt_part_range(m, part, lo, hi);
}

void kiln_gpt_wte_range(const kiln_gpt *m, int64_t *lo, int64_t *hi) {
    *lo = m->tensors[0].offset; /* wte and its padded rows, first in the embeddings' part */
    *hi = *lo + m->cfg.padded_vocab_size * m->cfg.n_embd;
}

int kiln_gpt_grad_ranges_apart(const kiln_gpt *m, int64_t *lo, int64_t *hi, int max) {
    int64_t U = kiln_gpt_config_blocks(&m->cfg), wlo, whi, elo, ehi;
    kiln_gpt_wte_range(m, &wlo, &whi);
    kiln__gpt_part_range(m, -1, &elo, &ehi);
    int n = (int)U + (whi < ehi ? 3 : 2); /* no wpe (rotary positions): nothing after wte */
    for (int i = 0; i < n && i < max; i++) { /* wte, ln_f, blocks U-1..0, wpe */
        if (i == 0) {
            lo[i] = wlo, hi[i] = whi;
        } else if (i == (int)U + 2) {
            lo[i] = whi, hi[i] = ehi;
        } else {
            kiln__gpt_part_range(m, U - (i - 1), &lo[i], &hi[i]);
        }
    }
    return n;
}

int kiln_gpt_grad_ranges(const kiln_gpt *m, int64_t *lo, int64_t *hi, int max) {
    int64_t U = kiln_gpt_config_blocks(&m->cfg);
    int n = (int)U + 2;
    for (int i = 0; i < n && i < max; i++) /* backward's order: ln_f, blocks U-1..0, embeddings */
        kiln__gpt_part_range(m, U - i, &lo[i], &hi[i]);
    return n;
}

/* The slab offsets of one block's tensors (b: its first in the table) by role: off[k] for
 * the twelve of model.h's order (k = 0..11), -1 for a factored matrix, whose two tensors
 * are uoff[kind] and voff[kind] (-1 for a dense one). */
typedef struct block_offsets {
    int64_t off[12], uoff[4], voff[4];
} block_offsets;

static block_offsets block_offsets_of(const kiln_gpt *m, const kiln_tensor_info *b) {
    static const int kind_of[12] = {-1, -1, 0, -1, 1, -1, -1, -1, 2, -1, 3, -1};
    block_offsets o;
    int i = 0;
    for (int k = 0; k < 12; k++) {
        int kind = kind_of[k];
        if (kind >= 0)
            o.uoff[kind] = o.voff[kind] = -1;
        if (kind >= 0 && m->cfg.rank[kind]) {
            o.off[k] = -1;
            o.uoff[kind] = b[i++].offset;
            o.voff[kind] = b[i++].offset;
        } else {
            o.off[k] = b[i++].offset;
        }
    }
    return o;
}

static void *param_at(const kiln_gpt *m, void *slab, int64_t off) {
    return off < 0 ? NULL : slab_at(slab, off, m->dt);
}

static float *grad_at(float *slab, int64_t off) {
    return off < 0 ? NULL : slab + off;
}

/* A Llama's offsets of the views (-1: none), by the role of gpt_block_params's twelve
 * fields: input_layernorm, q (then k, v), o, post_attention_layernorm, gate (then up), down. */
static block_offsets llama_offsets(const kiln_gpt *m, int64_t l) {
    int64_t share = m->cfg.share_layers > 1 ? m->cfg.share_layers : 1;
    const kiln_tensor_info *b = &m->tensors[m->nembed + 9 * (l / share)];
    block_offsets o;
    for (int k = 0; k < 12; k++)
        o.off[k] = -1;
    for (int k = 0; k < 4; k++)
        o.uoff[k] = o.voff[k] = -1;
    o.off[0] = b[0].offset;  /* ln1w */
    o.off[2] = b[1].offset;  /* qkvw: q, k, v */
    o.off[4] = b[4].offset;  /* attprojw */
    o.off[6] = b[5].offset;  /* ln2w */
    o.off[8] = b[6].offset;  /* fcw: gate, up */
    o.off[10] = b[8].offset; /* fcprojw */
    return o;
}

/* The views' offsets of layer l's block. */
static block_offsets layer_offsets(const kiln_gpt *m, int64_t l) {
    if (m->cfg.family == KILN_FAMILY_LLAMA)
        return llama_offsets(m, l);
    int64_t share = m->cfg.share_layers > 1 ? m->cfg.share_layers : 1; /* shared: the same */
    return block_offsets_of(m, &m->tensors[2 + kiln__gpt_block_tensors(&m->cfg) * (l / share)]);
}

/* The head's tensors: the final norm's weight and bias (-1: none) and the output matrix. */
static void head_offsets(const kiln_gpt *m, int64_t *lnfw, int64_t *lnfb, int64_t *head) {
    const kiln_tensor_info *t = m->tensors;
    int n = m->ntensors;
    if (m->cfg.family == KILN_FAMILY_LLAMA) {
        *lnfw = t[n - 1 - m->cfg.untied_head].offset;
        *lnfb = -1;
        *head = m->cfg.untied_head ? t[n - 1].offset : t[0].offset;
        return;
    }
    *lnfw = t[n - 2].offset;
    *lnfb = t[n - 1].offset;
    *head = t[0].offset;
}

/* Point views at the slabs, following the tensor table's order. */
static void bind_params(const kiln_gpt *m, gpt_params *v, void *slab) {
    const kiln_tensor_info *t = m->tensors;
    kiln_dtype dt = m->dt;
    v->wte = slab_at(slab, t[0].offset, dt);
    v->wpe = m->nembed > 1 ? slab_at(slab, t[1].offset, dt) : NULL;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        block_offsets o = layer_offsets(m, l);
        gpt_block_params *bp = &v->block[l];
        void **fields[12] = {&bp->ln1w,     &bp->ln1b,     &bp->qkvw,    &bp->qkvb,
                             &bp->attprojw, &bp->attprojb, &bp->ln2w,    &bp->ln2b,
                             &bp->fcw,      &bp->fcb,      &bp->fcprojw, &bp->fcprojb};
        for (int k = 0; k < 12; k++)
            *fields[k] = param_at(m, slab, o.off[k]);
        for (int k = 0; k < 4; k++) {
            bp->u[k] = param_at(m, slab, o.uoff[k]);
            bp->v[k] = param_at(m, slab, o.voff[k]);
        }
    }
    int64_t lnfw, lnfb, head;
    head_offsets(m, &lnfw, &lnfb, &head);
    v->lnfw = param_at(m, slab, lnfw);
    v->lnfb = param_at(m, slab, lnfb);
    v->head = param_at(m, slab, head);
}

static void bind_grads(const kiln_gpt *m, gpt_grads *v, float *slab) {
    const kiln_tensor_info *t = m->tensors;
    v->wte = slab + t[0].offset;
    v->wpe = m->nembed > 1 ? slab + t[1].offset : NULL;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        block_offsets o = layer_offsets(m, l);
        gpt_block_grads *bg = &v->block[l];
        float **fields[12] = {&bg->ln1w,     &bg->ln1b,     &bg->qkvw,    &bg->qkvb,
                              &bg->attprojw, &bg->attprojb, &bg->ln2w,    &bg->ln2b,
                              &bg->fcw,      &bg->fcb,      &bg->fcprojw, &bg->fcprojb};
        for (int k = 0; k < 12; k++)
            *fields[k] = grad_at(slab, o.off[k]);
        for (int k = 0; k < 4; k++) {
            bg->u[k] = grad_at(slab, o.uoff[k]);
            bg->v[k] = grad_at(slab, o.voff[k]);
        }
    }
    int64_t lnfw, lnfb, head;
    head_offsets(m, &lnfw, &lnfb, &head);
    v->lnfw = grad_at(slab, lnfw);
    v->lnfb = grad_at(slab, lnfb);
    v->head = grad_at(slab, head);
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

kiln_gpt_options kiln_gpt_options_default(void) {
    kiln_gpt_options o;
    memset(&o, 0, sizeof o);
    o.dtype = KILN_DTYPE_F32;
    o.recompute = KILN_RECOMPUTE_NONE;
    o.fuse_gelu = 1;
    o.fuse_residual_ln = 1;
    o.classifier_chunk = 0;
    return o;
}

static kiln_status check_options(const kiln_gpt_options *o) {
    if ((unsigned)o->dtype >= KILN_DTYPE_COUNT)
        return kiln_error_setf(KILN_ERR_ARG, "model dtype %d is not one of fp32, bf16, fp16",
                               (int)o->dtype);
    if ((unsigned)o->recompute > KILN_RECOMPUTE_BLOCK)
        return kiln_error_setf(KILN_ERR_ARG,
                               "recompute %d is not one of none, gelu, attention, block",
                               (int)o->recompute);
    if (o->classifier_chunk < 0)
        return kiln_error_setf(KILN_ERR_ARG, "classifier chunk %lld must be >= 0",
                               (long long)o->classifier_chunk);
    return KILN_OK;
}

kiln_status kiln_gpt_memory_plan_for(const kiln_gpt_config *cfg_in, int64_t B, int64_t T,
                                     const kiln_gpt_options *opt, kiln_backend *be,
                                     kiln_gpt_memory *out) {
    if (!cfg_in || !out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_memory_plan_for: NULL argument");
    memset(out, 0, sizeof *out);
    kiln_gpt m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg_in;
    m.opt = opt ? *opt : kiln_gpt_options_default();
    KILN_CHECK(check_options(&m.opt));
    KILN_CHECK(check_sizes(&m.cfg, B, T));
    m.dt = m.opt.dtype;
    m.be = be ? be : kiln_backend_cpu();
    m.maxB = B;
    m.maxT = T;
    /* The slab: every parameter and the padded embedding rows (see build_layout). */
    int64_t slab =
        kiln_gpt_config_num_params(&m.cfg) +
        (m.cfg.untied_head ? 2 : 1) * (m.cfg.padded_vocab_size - m.cfg.vocab_size) * m.cfg.n_embd;
    out->params = (size_t)slab * kiln_dtype_size(m.dt);
    out->grads = m.opt.inference ? 0 : (size_t)slab * sizeof(float);
    size_t arena = kiln__gpt_plan_acts(&m, NULL, &out->workspace);
    if (arena == 0)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot plan the activations");
    out->activations = arena - out->workspace;
    out->total = out->params + out->grads + arena;
    return KILN_OK;
}

/* The model's own memory must fit what the process can still take: one message with the
 * whole plan, before any of it is taken. */
/* slab: a parameter or gradient slab, mapped untouched when the model is sharded */
static kiln_status device_alloc(kiln_gpt *m, void **out, size_t bytes, const char *what, int slab) {
    const kiln_slab_allocator *sa = &m->opt.slabs;
    *out = slab && m->mapped   ? kiln_memory_map(bytes)
           : slab && sa->alloc ? sa->alloc(sa->ctx, bytes, what)
                               : m->be->alloc(m->be, bytes);
    if (!*out && slab && !m->mapped && sa->alloc) { /* the allocator said why */
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_error_message());
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the %s: %s", what, why);
    }
    if (!*out)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %.1f MiB of %s on the %s backend",
                               (double)bytes / (1024.0 * 1024.0), what, m->be->name);
    return KILN_OK;
}

static kiln_status check_fits(const kiln_gpt_memory *mem) {
    const char *what = NULL;
    size_t avail = kiln_memory_available(&what);
    if (mem->total <= avail)
        return KILN_OK;
    double mib = 1024.0 * 1024.0;
    return kiln_error_setf(
        KILN_ERR_NOMEM,
        "the model needs %.1f MiB (parameters %.1f MiB, gradients %.1f MiB, "
        "activations and workspace %.1f MiB) but %.1f MiB is available (%s): "
        "use a smaller batch or sequence length, or a smaller model",
        (double)mem->total / mib, (double)mem->params / mib, (double)mem->grads / mib,
        (double)(mem->activations + mem->workspace) / mib, (double)avail / mib, what);
}

kiln_status kiln_gpt_create(kiln_gpt **out, const kiln_gpt_config *cfg_in, int64_t B, int64_t T,
                            const kiln_gpt_options *opt, kiln_backend *be) {
    *out = NULL;
    kiln_gpt_config cfg = *cfg_in;
    kiln_gpt_options o = opt ? *opt : kiln_gpt_options_default();
    if (!be)
        be = kiln_backend_cpu();
    kiln_gpt_memory plan;
    KILN_CHECK(kiln_gpt_memory_plan_for(&cfg, B, T, &o, be, &plan));
    KILN_CHECK(check_fits(&plan));
    KILN_CHECK(kiln_gpt_config_validate(&cfg));
    if (be->prepare)
        KILN_CHECK(be->prepare(be));
    kiln_status s = KILN_ERR_NOMEM;
    kiln_gpt *m = calloc(1, sizeof *m);
    if (!m)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the model");
    m->cfg = cfg;
    m->opt = o;
    m->dt = o.dtype;
    m->be = be;
    m->kv.t0 = -1; /* no cached forward running */
    m->maxB = B;
    m->maxT = T;
    if ((o.sharded || o.slabs.alloc) && strcmp(be->name, "cpu") != 0 &&
        strcmp(be->name, "ref") != 0) {
        s = kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s need a host backend, not %s",
                            o.sharded ? "sharded parameters (ZeRO 2 and 3)"
                                      : "slabs in memory of the caller's",
                            be->name);
        goto fail;
    }
    if (o.sharded && o.slabs.alloc) {
        s = kiln_error_setf(KILN_ERR_ARG, "a sharded model maps its own slabs: no slab allocator");
        goto fail;
    }
    m->mapped = o.sharded && !o.inference;
    int64_t L = cfg.n_layer;
    m->tensors = calloc((size_t)(4 + kiln__gpt_block_tensors(&cfg) * L), sizeof *m->tensors);
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
    KILN_CHECK_GOTO(
        s,
        device_alloc(m, &m->params, (size_t)m->slab_len * kiln_dtype_size(m->dt), "parameters", 1),
        fail);
    bind_params(m, &m->p, m->params);
    if (!o.inference) {
        KILN_CHECK_GOTO(s,
                        device_alloc(m, (void **)&m->grads, (size_t)m->slab_len * sizeof(float),
                                     "gradients", 1),
                        fail);
        bind_grads(m, &m->g, m->grads);
    }
    m->acts_bytes = kiln__gpt_plan_acts(m, NULL, &m->workspace_bytes);
    KILN_CHECK_GOTO(s, device_alloc(m, &m->acts, m->acts_bytes, "activations", 0), fail);
    kiln__gpt_plan_acts(m, m->acts, NULL);
    *out = m;
    return KILN_OK;
fail:
    kiln_gpt_free(m);
    return s;
}

kiln_status kiln_gpt_set_linear(kiln_gpt *m, kiln_gpt_linear_fn forward, void *ctx,
                                void (*release)(void *ctx)) {
    if (!m)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_set_linear: NULL model");
    if (forward && m->cfg.family != KILN_FAMILY_GPT2)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "products outside the backend are for gpt2 models, not %s",
                               kiln_family_name(m->cfg.family));
    if (forward && kiln__gpt_block_tensors(&m->cfg) != 12)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "products outside the backend need dense block matrices, not "
                               "factored ones");
    if (forward && (!m->opt.inference || m->dt != KILN_DTYPE_F32 ||
                    (strcmp(m->be->name, "cpu") != 0 && strcmp(m->be->name, "ref") != 0)))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "products outside the backend need an fp32 inference model on a "
                               "host backend");
    if (m->linear_release && m->linear_ctx != ctx)
        m->linear_release(m->linear_ctx);
    m->linear = forward;
    m->linear_ctx = forward ? ctx : NULL;
    m->linear_release = forward ? release : NULL;
    return KILN_OK;
}

int kiln_gpt_has_linear(const kiln_gpt *m) {
    return m && m->linear;
}

kiln_status kiln_gpt_create_inference(kiln_gpt **out, const kiln_gpt_config *cfg, int64_t B,
                                      int64_t T, kiln_dtype dtype, kiln_backend *be) {
    kiln_gpt_options o = kiln_gpt_options_default();
    o.inference = 1;
    o.dtype = dtype;
    return kiln_gpt_create(out, cfg, B, T, &o, be);
}

void kiln_gpt_free(kiln_gpt *m) {
    if (!m)
        return;
    free(m->soft.kl);
    free(m->soft.scratch);
    if (m->linear_release)
        m->linear_release(m->linear_ctx);
    if (m->be) {
        m->be->free(m->be, m->kv.buf);
        m->be->free(m->be, m->acts);
        if (m->mapped) {
            kiln_memory_unmap(m->grads, (size_t)m->slab_len * sizeof(float));
            kiln_memory_unmap(m->params, (size_t)m->slab_len * kiln_dtype_size(m->dt));
        } else if (m->opt.slabs.alloc) { /* the reverse of their making */
            const kiln_slab_allocator *sa = &m->opt.slabs;
            if (m->grads)
                sa->free(sa->ctx, m->grads, (size_t)m->slab_len * sizeof(float));
            if (m->params)
                sa->free(sa->ctx, m->params, (size_t)m->slab_len * kiln_dtype_size(m->dt));
        } else {
            m->be->free(m->be, m->grads);
            m->be->free(m->be, m->params);
        }
    }
    free(m->targets);
    free(m->inputs);
    free(m->blocks);
    free(m->g.block);
    free(m->p.block);
    free(m->tensors);
    free(m);
}

/* GPT-2's initial values in slab order, handed out in runs of at most 256 floats to
 * put(ctx, offset, values, n); the padded rows and biases are zeros. One generator for the
 * working weights (rounded) and for an fp32 master slab, so both hold the same values. */
static void init_values(const kiln_gpt *m, uint64_t seed,
                        void (*put)(void *ctx, int64_t off, const float *x, int64_t n), void *ctx) {
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    float buf[256];
    /* the normal draws a run of `fill` at a time (on every thread: kiln_rng_normal_fill) */
    int64_t fill = (int64_t)1 << 16;
    float *vals = malloc((size_t)fill * sizeof *vals);
    if (!vals)
        vals = buf, fill = 256;
    int64_t at = 0; /* slab elements handed out so far */
    for (int i = 0; i <= m->ntensors; i++) {
        const kiln_tensor_info *t = i < m->ntensors ? &m->tensors[i] : NULL;
        int64_t gap_end = t ? t->offset : m->slab_len;
        memset(buf, 0, sizeof buf);
        for (; at < gap_end; at += 256) /* what no tensor covers: zeros */
            put(ctx, at, buf, gap_end - at < 256 ? gap_end - at : 256);
        at = gap_end;
        if (!t)
            break;
        /* a Llama's 1-D tensors are all norm weights; its matrices all N(0, 0.02), as
         * Hugging Face's initialiser draws them */
        int llama = m->cfg.family == KILN_FAMILY_LLAMA;
        int ln_weight = llama
                            ? t->ndim == 1
                            : strstr(t->name, "ln_") != NULL && strstr(t->name, ".weight") != NULL;
        int resid = !llama && strstr(t->name, "c_proj.weight") != NULL;
        float std = resid ? resid_std : 0.02f;
        /* a factor of rank r: U and V alike N(0, s^2) with r s^4 = std^2, so that their
         * product's entries have the dense matrix's variance */
        size_t len = strlen(t->name);
        if (len > 2 && t->name[len - 2] == '_' &&
            (t->name[len - 1] == 'u' || t->name[len - 1] == 'v'))
            std = sqrtf(std / sqrtf((float)(t->name[len - 1] == 'u' ? t->shape[1] : t->shape[0])));
        for (int64_t k = 0; k < t->numel; k += fill) {
            int64_t n = t->numel - k < fill ? t->numel - k : fill;
            if (ln_weight || t->ndim != 2)
                for (int64_t j = 0; j < n; j++)
                    vals[j] = ln_weight ? 1.0f : 0.0f;
            else
                kiln_rng_normal_fill(&rng, vals, n, std);
            for (int64_t j = 0; j < n; j += 256)
                put(ctx, t->offset + k + j, vals + j, n - j < 256 ? n - j : 256);
        }
        at = t->offset + t->numel;
    }
    if (vals != buf)
        free(vals);
}

static void put_f32(void *ctx, int64_t off, const float *x, int64_t n) {
    memcpy((float *)ctx + off, x, (size_t)n * sizeof(float));
}

static void put_work(void *ctx, int64_t off, const float *x, int64_t n) {
    kiln_gpt *m = ctx;
    uint16_t half[256];
    const void *src = x;
    if (m->dt != KILN_DTYPE_F32) {
        kiln_convert(half, m->dt, x, KILN_DTYPE_F32, n);
        src = half;
    }
    m->be->copy(m->be, slab_at(m->params, off, m->dt), src, (size_t)n * kiln_dtype_size(m->dt),
                KILN_COPY_TO_DEVICE);
}

void kiln_gpt_init_weights(kiln_gpt *m, uint64_t seed) {
    init_values(m, seed, put_work, m);
}

void kiln_gpt_init_weights_f32(const kiln_gpt *m, uint64_t seed, float *slab) {
    init_values(m, seed, put_f32, slab);
}

/* Only [lo, hi) of the values, into dst (hi - lo floats) */
typedef struct range_put {
    float *dst;
    int64_t lo, hi;
} range_put;

static void put_range(void *ctx, int64_t off, const float *x, int64_t n) {
    range_put *r = ctx;
    int64_t a = off > r->lo ? off : r->lo, b = off + n < r->hi ? off + n : r->hi;
    if (b > a)
        memcpy(r->dst + (a - r->lo), x + (a - off), (size_t)(b - a) * sizeof(float));
}

void kiln_gpt_init_weights_f32_range(const kiln_gpt *m, uint64_t seed, int64_t lo, int64_t hi,
                                     float *dst) {
    range_put r = {dst, lo, hi};
    init_values(m, seed, put_range, &r);
}

const kiln_gpt_config *kiln_gpt_get_config(const kiln_gpt *m) {
    return &m->cfg;
}
const kiln_gpt_options *kiln_gpt_get_options(const kiln_gpt *m) {
    return &m->opt;
}
kiln_backend *kiln_gpt_backend(const kiln_gpt *m) {
    return m->be;
}
kiln_dtype kiln_gpt_dtype(const kiln_gpt *m) {
    return m->dt;
}
int64_t kiln_gpt_max_batch(const kiln_gpt *m) {
    return m->maxB;
}
int64_t kiln_gpt_max_seq(const kiln_gpt *m) {
    return m->maxT;
}
void *kiln_gpt_params(kiln_gpt *m) {
    return m->params;
}

kiln_status kiln_gpt_swap_params(kiln_gpt *m, void *slab, void **old) {
    if (!m || !slab || !old)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_swap_params: NULL argument");
    *old = NULL;
    if (!m->opt.slabs.alloc || m->mapped)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_swap_params: the model's slabs are not "
                                             "from a slab allocator");
    *old = m->params;
    m->params = slab;
    bind_params(m, &m->p, m->params);
    return KILN_OK;
}

float *kiln_gpt_grads(kiln_gpt *m) {
    return m->grads;
}
int64_t kiln_gpt_slab_len(const kiln_gpt *m) {
    return m->slab_len;
}
int kiln_gpt_num_tensors(const kiln_gpt *m) {
    return m->ntensors;
}

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
    mem.params = (size_t)m->slab_len * kiln_dtype_size(m->dt);
    mem.grads = m->grads ? (size_t)m->slab_len * sizeof(float) : 0;
    mem.workspace = m->workspace_bytes;
    mem.activations = m->acts_bytes - m->workspace_bytes;
    mem.total = mem.params + mem.grads + m->acts_bytes;
    return mem;
}

kiln_status kiln_gpt_check_finite(const kiln_gpt *m) {
    for (int i = 0; i < m->ntensors; i++) {
        const kiln_tensor_info *t = &m->tensors[i];
        if (!isfinite(m->be->sumsq(m->be, m->dt, slab_at(m->params, t->offset, m->dt), t->numel)))
            return kiln_error_setf(KILN_ERR_RANGE, "tensor %s holds NaN or infinite values",
                                   t->name);
    }
    return KILN_OK;
}
