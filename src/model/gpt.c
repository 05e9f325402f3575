/* GPT-2 forward and backward, written once against the backend's ops.
 * The model is embedding, blocks 0..L-1 and head, each with its own forward and backward.
 * Activations are in the model's dtype (m->dt); the ops keep what precision needs in fp32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/gpt_internal.h"

/* Row r of a (rows, cols) activation buffer of dtype dt. */
static void *row(void *p, int64_t r, int64_t cols, kiln_dtype dt) {
    return (char *)p + r * cols * (int64_t)kiln_dtype_size(dt);
}

static kiln_status check_ids(const int32_t *ids, int64_t n, int64_t T, int64_t V,
                             const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return kiln_error_setf(KILN_ERR_RANGE,
                                   "%s token id %d at batch row %lld, position %lld is outside the "
                                   "model's vocabulary 0..%lld",
                                   what, ids[i], (long long)(i / T), (long long)(i % T),
                                   (long long)V - 1);
    return KILN_OK;
}

/* The rank of matrix `which` of the blocks (0: dense; the head is dense). */
static int64_t rank_of(const kiln_gpt *m, kiln_gpt_matrix which) {
    return which < KILN_GPT_MATRIX_HEAD ? m->cfg.rank[which] : 0;
}

/* out (N,OC) = inp x W + bias through the backend, or through the model's own products
 * (kiln_gpt_set_linear) for matrix `which` of layer `layer` (-1: the head). A factored
 * matrix runs as mid (N,r) = inp x U, kept for backward, then out = mid x V + bias. */
static void linear(kiln_gpt *m, int64_t layer, kiln_gpt_matrix which, void *out, const void *inp,
                   const void *w, const void *bias, int64_t N, int64_t C, int64_t OC,
                   void *gelu_out) {
    int64_t r = layer >= 0 ? rank_of(m, which) : 0;
    if (r) {
        const gpt_block_params *p = &m->p.block[layer];
        void *mid = m->blocks[layer].mid[which];
        m->be->matmul_forward(m->be, m->dt, mid, inp, p->u[which], NULL, N, C, r, 0, NULL);
        m->be->matmul_forward(m->be, m->dt, out, mid, p->v[which], bias, N, r, OC, 0, gelu_out);
        return;
    }
    if (!m->linear) {
        /* the head's matrix is (Vp,C) in every family; the blocks' in the family's layout */
        m->be->matmul_forward(m->be, m->dt, out, inp, w, bias, N, C, OC, layer >= 0 ? m->tw : 1,
                              gelu_out);
        return;
    }
    int64_t share = m->cfg.share_layers > 1 ? m->cfg.share_layers : 1;
    m->linear(m->linear_ctx, layer >= 0 ? layer / share : layer, which, out, inp, bias, N, C, OC);
    if (gelu_out)
        m->be->gelu_forward(m->be, m->dt, gelu_out, out, N * OC);
}

/* The backward of linear for a block matrix: dinp (N,C) written, dW (or a factored matrix's
 * dU and dV: dmid = dout V^T, dV += mid^T dout, dU += inp^T dmid) and dbias added to. */
static void linear_backward(kiln_gpt *m, int64_t layer, kiln_gpt_matrix which, void *dinp,
                            float *dweight, float *dbias, const void *dout, const void *inp,
                            const void *w, int64_t N, int64_t C, int64_t OC) {
    kiln_backend *be = m->be;
    int64_t r = rank_of(m, which);
    if (!r) {
        be->matmul_backward(be, m->dt, dinp, dweight, dbias, dout, inp, w, N, C, OC, m->tw);
        return;
    }
    const gpt_block_params *p = &m->p.block[layer];
    gpt_block_grads *g = &m->g.block[layer];
    const void *mid = m->blocks[layer].mid[which];
    be->matmul_backward(be, m->dt, m->d.dmid, g->v[which], dbias, dout, mid, p->v[which], N, r, OC,
                        0);
    be->matmul_backward(be, m->dt, dinp, g->u[which], NULL, m->d.dmid, inp, p->u[which], N, C, r,
                        0);
}

/* ---- embedding ---- */

/* Positions 0..T-1, or t0..t0+T-1 in a cached forward (the position embedding's rows from
 * t0). */
static void embed_forward(kiln_gpt *m, int64_t B, int64_t T) {
    int64_t t0 = m->kv.t0 > 0 ? m->kv.t0 : 0, C = m->cfg.n_embd;
    const void *wpe =
        m->p.wpe ? (const char *)m->p.wpe + (size_t)(t0 * C) * kiln_dtype_size(m->dt) : NULL;
    m->be->encoder_forward(m->be, m->dt, m->encoded, m->inputs, m->p.wte, wpe, B, T, C);
}

/* With the rows apart, wte's part is left to the caller (kiln_gpt_embed_rows). */
static void embed_backward(kiln_gpt *m, int64_t B, int64_t T) {
    m->be->encoder_backward(m->be, m->dt, m->rows_apart ? NULL : m->g.wte, m->g.wpe, m->d.dres,
                            m->inputs, B, T, m->cfg.n_embd);
    m->rows_n = m->rows_apart ? B * T : 0;
}

/* ---- norms: LayerNorm or RMSNorm, as the architecture says ---- */

/* out, mean, rstd (N,C) of inp; RMSNorm keeps no mean (NULL) and has no bias. */
static void norm_forward(kiln_gpt *m, void *out, float *mean, float *rstd, const void *inp,
                         const void *w, const void *b, int64_t N) {
    int64_t C = m->cfg.n_embd;
    if (m->cfg.norm == KILN_NORM_RMSNORM)
        m->be->rmsnorm_forward(m->be, m->dt, out, rstd, inp, w, N, C,
                               kiln_gpt_config_norm_eps(&m->cfg));
    else
        m->be->layernorm_forward(m->be, m->dt, out, mean, rstd, inp, w, b, N, C);
}

/* res = x + y, then the norm of res. */
static void residual_norm_forward(kiln_gpt *m, void *res, void *out, float *mean, float *rstd,
                                  const void *x, const void *y, const void *w, const void *b,
                                  int64_t N) {
    int64_t C = m->cfg.n_embd;
    if (m->cfg.norm == KILN_NORM_RMSNORM)
        m->be->residual_rmsnorm_forward(m->be, m->dt, res, out, rstd, x, y, w, N, C,
                                        kiln_gpt_config_norm_eps(&m->cfg));
    else
        m->be->residual_layernorm_forward(m->be, m->dt, res, out, mean, rstd, x, y, w, b, N, C);
}

/* dinp (N,C) += the norm's backward of dout; dw, db (C) +=. */
static void norm_backward(kiln_gpt *m, void *dinp, float *dw, float *db, const void *dout,
                          const void *inp, const void *w, const float *mean, const float *rstd,
                          int64_t N) {
    int64_t C = m->cfg.n_embd;
    if (m->cfg.norm == KILN_NORM_RMSNORM)
        m->be->rmsnorm_backward(m->be, m->dt, dinp, dw, dout, inp, w, rstd, N, C);
    else
        m->be->layernorm_backward(m->be, m->dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

/* ---- blocks ---- */

static void *block_input(const kiln_gpt *m, int64_t l) {
    return l == 0 ? m->encoded : m->blocks[l - 1].res3;
}

/* How a block's forward runs. */
enum {
    BLOCK_TAIL = 1,      /* with fused residual-norm: compute the next norm (the next block's
                          * first, or the final norm after the last block) with the residual add */
    BLOCK_RECOMPUTE = 2, /* again in backward: compute the first norm here (the previous
                          * block's tail did it in forward), stop before the last product */
};

/* The first position of the rows being run: a cached forward's t0, else 0. */
static int64_t first_position(const kiln_gpt *m) {
    return m->kv.t0 > 0 ? m->kv.t0 : 0;
}

/* Rotary positions on the q and k of a->qkv, in place (none with learned positions). */
static void rotate(kiln_gpt *m, void *qkv, int64_t B, int64_t T) {
    if (m->cfg.position != KILN_POSITION_ROPE)
        return;
    m->be->rope_forward(m->be, m->dt, qkv, B, T, m->cfg.n_head, kiln_gpt_config_kv_heads(&m->cfg),
                        kiln_gpt_config_head_size(&m->cfg), first_position(m),
                        kiln_gpt_config_rope_theta(&m->cfg));
}

/* Attention of block l over a->qkv: the whole window, or with the cache (kv.t0 >= 0) the
 * rows of positions t0.. appended to layer l's cache and attended over all cached ones. */
static void attend(kiln_gpt *m, int64_t l, gpt_block_acts *a, int64_t B, int64_t T) {
    kiln_backend *be = m->be;
    int64_t A = kiln_gpt_config_attn_width(&m->cfg), NH = m->cfg.n_head;
    int64_t NKV = kiln_gpt_config_kv_heads(&m->cfg), Q = kiln_gpt_config_qkv_width(&m->cfg);
    if (m->kv.t0 < 0) {
        be->attention_forward(be, m->dt, a->atty, a->att, m->att_scratch, a->qkv, B, T, A, NH, NKV);
        return;
    }
    size_t e = kiln_dtype_size(m->dt), row = (size_t)Q * e;
    int64_t cap = m->kv.cap, at = m->kv.t0 - m->kv.base;
    char *layer = (char *)m->kv.buf + (size_t)(l * m->maxB * cap) * row;
    for (int64_t b = 0; b < B; b++)
        be->copy(be, layer + (size_t)(b * cap + at) * row,
                 (const char *)a->qkv + (size_t)(b * T) * row, (size_t)T * row,
                 KILN_COPY_ON_DEVICE);
    /* the window: the last maxT positions (all of them, until maxT have run) */
    int64_t end = at + T, from = end > m->maxT ? end - m->maxT : 0;
    be->attention_decode(be, m->dt, a->atty, layer + (size_t)from * row, B, cap, end - from, T, A,
                         NH, NKV);
}

/* Before position t0 is appended past the cache's end (rotary positions): the last maxT - 1
 * positions moved to the front of each sequence's rows, where the window goes on. cap is
 * 2 maxT, so the rows moved and the rows they land on never overlap. */
static void cache_slide(kiln_gpt *m, int64_t t0) {
    int64_t keep = m->maxT - 1, at = t0 - m->kv.base, cap = m->kv.cap;
    if (at < cap)
        return;
    size_t row = (size_t)kiln_gpt_config_qkv_width(&m->cfg) * kiln_dtype_size(m->dt);
    for (int64_t i = 0; i < m->cfg.n_layer * m->B; i++) {
        char *seq = (char *)m->kv.buf + (size_t)(i * cap) * row;
        m->be->copy(m->be, seq, seq + (size_t)(at - keep) * row, (size_t)keep * row,
                    KILN_COPY_ON_DEVICE);
    }
    m->kv.base = t0 - keep;
}

/* The MLP's activation: fch_gelu (BT,H) from fch (BT,H), or SwiGLU's from gate and up
 * (BT,2H). */
static void activate(kiln_gpt *m, gpt_block_acts *a, int64_t BT) {
    int64_t H = kiln_gpt_config_mlp_width(&m->cfg);
    if (m->cfg.mlp == KILN_MLP_SWIGLU)
        m->be->swiglu_forward(m->be, m->dt, a->fch_gelu, a->fch, BT, H);
    else
        m->be->gelu_forward(m->be, m->dt, a->fch_gelu, a->fch, BT * H);
}

static void block_forward(kiln_gpt *m, int64_t l, int64_t B, int64_t T, int how) {
    kiln_backend *be = m->be;
    kiln_dtype dt = m->dt;
    const gpt_block_params *w = &m->p.block[l];
    gpt_block_acts *a = &m->blocks[l];
    int64_t C = m->cfg.n_embd, BT = B * T, L = m->cfg.n_layer;
    int64_t A = kiln_gpt_config_attn_width(&m->cfg), H = kiln_gpt_config_mlp_width(&m->cfg);
    int64_t Q = kiln_gpt_config_qkv_width(&m->cfg), in, FC;
    kiln__gpt_matrix_shape(&m->cfg, KILN_GPT_MATRIX_FC, &in, &FC);
    const void *x = block_input(m, l);
    int fused = m->opt.fuse_residual_ln;
    /* GELU in the product's output pass; SwiGLU reads two columns of it, so runs apart */
    int fuse_act = m->opt.fuse_gelu && m->cfg.mlp == KILN_MLP_GELU;

    if (!fused || (how & BLOCK_RECOMPUTE) || m->norm_ready != l)
        norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1w, w->ln1b, BT);
    if (!(how & BLOCK_RECOMPUTE))
        m->norm_ready = -1;
    linear(m, l, KILN_GPT_MATRIX_QKV, a->qkv, a->ln1, w->qkvw, w->qkvb, BT, C, Q, NULL);
    rotate(m, a->qkv, B, T);
    attend(m, l, a, B, T);
    if (fused) {
        linear(m, l, KILN_GPT_MATRIX_ATTPROJ, a->tmp, a->atty, w->attprojw, w->attprojb, BT, A, C,
               NULL);
        residual_norm_forward(m, a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, a->tmp, x, w->ln2w,
                              w->ln2b, BT);
    } else {
        linear(m, l, KILN_GPT_MATRIX_ATTPROJ, a->res2, a->atty, w->attprojw, w->attprojb, BT, A, C,
               NULL);
        be->residual_forward(be, dt, a->res2, a->res2, x, BT * C);
        norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, BT);
    }
    if (fuse_act) {
        linear(m, l, KILN_GPT_MATRIX_FC, a->fch, a->ln2, w->fcw, w->fcb, BT, C, FC, a->fch_gelu);
    } else {
        linear(m, l, KILN_GPT_MATRIX_FC, a->fch, a->ln2, w->fcw, w->fcb, BT, C, FC, NULL);
        activate(m, a, BT);
    }
    if (how & BLOCK_RECOMPUTE) {
        /* backward needs nothing the last product makes, but a factored one's first half */
        int64_t r = m->cfg.rank[KILN_GPT_MATRIX_FCPROJ];
        if (r)
            be->matmul_forward(be, dt, a->mid[KILN_GPT_MATRIX_FCPROJ], a->fch_gelu,
                               w->u[KILN_GPT_MATRIX_FCPROJ], NULL, BT, H, r, 0, NULL);
        return;
    }
    if (fused && (how & BLOCK_TAIL)) {
        int last = l + 1 == L;
        gpt_block_acts *next = last ? NULL : &m->blocks[l + 1];
        linear(m, l, KILN_GPT_MATRIX_FCPROJ, a->tmp, a->fch_gelu, w->fcprojw, w->fcprojb, BT, H, C,
               NULL);
        residual_norm_forward(m, a->res3, last ? m->lnf : next->ln1,
                              last ? m->lnf_mean : next->ln1_mean,
                              last ? m->lnf_rstd : next->ln1_rstd, a->tmp, a->res2,
                              last ? m->p.lnfw : m->p.block[l + 1].ln1w,
                              last ? m->p.lnfb : m->p.block[l + 1].ln1b, BT);
        m->norm_ready = l + 1;
    } else {
        linear(m, l, KILN_GPT_MATRIX_FCPROJ, a->res3, a->fch_gelu, w->fcprojw, w->fcprojb, BT, H, C,
               NULL);
        be->residual_forward(be, dt, a->res3, a->res3, a->res2, BT * C);
    }
}

/* On entry d.dres holds the gradient of the block's output; on exit, of its input. What
 * forward did not keep (opt.recompute) is computed again first. */
static void block_backward(kiln_gpt *m, int64_t l, int64_t B, int64_t T) {
    kiln_backend *be = m->be;
    kiln_dtype dt = m->dt;
    const gpt_block_params *w = &m->p.block[l];
    gpt_block_grads *g = &m->g.block[l];
    gpt_block_acts *a = &m->blocks[l];
    gpt_grad_scratch *d = &m->d;
    int64_t C = m->cfg.n_embd, NH = m->cfg.n_head, BT = B * T;
    int64_t A = kiln_gpt_config_attn_width(&m->cfg), H = kiln_gpt_config_mlp_width(&m->cfg);
    int64_t NKV = kiln_gpt_config_kv_heads(&m->cfg), Q = kiln_gpt_config_qkv_width(&m->cfg), in, FC;
    kiln__gpt_matrix_shape(&m->cfg, KILN_GPT_MATRIX_FC, &in, &FC);
    const void *x = block_input(m, l);

    switch (m->opt.recompute) {
    case KILN_RECOMPUTE_BLOCK: block_forward(m, l, B, T, BLOCK_RECOMPUTE); break;
    case KILN_RECOMPUTE_ATTENTION:
        be->attention_forward(be, dt, a->atty, a->att, m->att_scratch, a->qkv, B, T, A, NH, NKV);
        activate(m, a, BT);
        break;
    case KILN_RECOMPUTE_GELU: activate(m, a, BT); break;
    case KILN_RECOMPUTE_NONE: break;
    }
    linear_backward(m, l, KILN_GPT_MATRIX_FCPROJ, d->dfch_gelu, g->fcprojw, g->fcprojb, d->dres,
                    a->fch_gelu, w->fcprojw, BT, H, C);
    if (m->cfg.mlp == KILN_MLP_SWIGLU)
        be->swiglu_backward(be, dt, d->dfch, a->fch, d->dfch_gelu, BT, H);
    else
        be->gelu_backward(be, dt, d->dfch, a->fch, d->dfch_gelu, BT * H);
    linear_backward(m, l, KILN_GPT_MATRIX_FC, d->dln, g->fcw, g->fcb, d->dfch, a->ln2, w->fcw, BT,
                    C, FC);
    norm_backward(m, d->dres, g->ln2w, g->ln2b, d->dln, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd,
                  BT);

    linear_backward(m, l, KILN_GPT_MATRIX_ATTPROJ, d->datty, g->attprojw, g->attprojb, d->dres,
                    a->atty, w->attprojw, BT, A, C);
    be->attention_backward(be, dt, d->dqkv, m->att_scratch, d->datty, a->qkv, a->att, B, T, A, NH,
                           NKV);
    if (m->cfg.position == KILN_POSITION_ROPE)
        be->rope_backward(be, dt, d->dqkv, B, T, NH, NKV, kiln_gpt_config_head_size(&m->cfg), 0,
                          kiln_gpt_config_rope_theta(&m->cfg));
    linear_backward(m, l, KILN_GPT_MATRIX_QKV, d->dln, g->qkvw, g->qkvb, d->dqkv, a->ln1, w->qkvw,
                    BT, C, Q);
    norm_backward(m, d->dres, g->ln1w, g->ln1b, d->dln, x, w->ln1w, a->ln1_mean, a->ln1_rstd, BT);
}

/* ---- head: final norm, output projection (tied or its own), cross-entropy ---- */

/* The final norm, unless the last block's fused tail computed it. */
static void head_norm(kiln_gpt *m, int64_t BT) {
    if (m->opt.fuse_residual_ln && m->norm_ready == m->cfg.n_layer)
        return;
    norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, block_input(m, m->cfg.n_layer), m->p.lnfw,
                 m->p.lnfb, BT);
}

/* Distillation's part of rows [r0, r0+n) (fp32 logits, before the cross-entropy overwrites
 * them): into soft.scratch (1 - alpha) T (softmax(z / T) - p) dloss, the gradient of
 * (1 - alpha) T^2 KL(p || softmax(z / T)), and each row's KL into soft.kl. */
static void soft_rows(kiln_gpt *m, int64_t r0, int64_t n, float dloss) {
    int64_t V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    float T = m->soft.temperature, w = (1.0f - m->soft.alpha) * T * dloss;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *z = (const float *)m->logits + i * Vp;
        const float *p = m->soft.p + (r0 + i) * V;
        float *g = m->soft.scratch + i * Vp;
        float mx = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            mx = fmaxf(mx, z[v] / T);
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++)
            sum += exp((double)(z[v] / T - mx));
        double lse = (double)mx + log(sum), kl = 0.0;
        for (int64_t v = 0; v < V; v++) {
            double logq = (double)(z[v] / T) - lse;
            if (p[v] > 0.0f)
                kl += (double)p[v] * (log((double)p[v]) - logq);
            g[v] = w * ((float)exp(logq) - p[v]);
        }
        m->soft.kl[r0 + i] = (float)kl;
    }
}

/* Rows [r0, r0+n) of the classifier: logits, then the losses, and with dloss != 0 the
 * logits' gradient in place and its backward: dlnf rows (d.dln) and dwte +=. With soft
 * targets the cross-entropy's share is alpha and distillation's is added. */
static void head_rows(kiln_gpt *m, int64_t r0, int64_t n, float dloss, int grad) {
    kiln_backend *be = m->be;
    kiln_dtype dt = m->dt;
    int64_t C = m->cfg.n_embd, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    void *lnf = row(m->lnf, r0, C, dt);
    linear(m, -1, KILN_GPT_MATRIX_HEAD, m->logits, lnf, m->p.head, NULL, n, C, Vp, NULL);
    int soft = m->soft.p != NULL;
    if (soft)
        soft_rows(m, r0, n, grad ? dloss : 0.0f);
    be->crossentropy_forward_backward(be, dt, m->losses + r0, grad ? m->logits : NULL, m->logits,
                                      m->targets + r0, soft ? dloss * m->soft.alpha : dloss, n, V,
                                      Vp);
    if (soft && grad) {
        float *d = m->logits;
        const float *g = m->soft.scratch;
        for (int64_t i = 0; i < n * Vp; i++)
            d[i] += g[i];
    }
    if (grad)
        be->matmul_backward(be, dt, row(m->d.dln, r0, C, dt), m->g.head, NULL, m->logits, lnf,
                            m->p.head, n, C, Vp, 1);
}

/* After d.dln holds the gradient of ln_f's output: ln_f's backward into d.dres, the
 * gradient of the last block's output. */
static void head_norm_backward(kiln_gpt *m, int64_t BT) {
    kiln_backend *be = m->be;
    int64_t C = m->cfg.n_embd;
    be->zero(be, m->d.dres, (size_t)(BT * C) * kiln_dtype_size(m->dt));
    norm_backward(m, m->d.dres, m->g.lnfw, m->g.lnfb, m->d.dln, block_input(m, m->cfg.n_layer),
                  m->p.lnfw, m->lnf_mean, m->lnf_rstd, BT);
}

/* Part `part` of the model (kiln__gpt_part_range) has its final gradient for this backward:
 * tell the caller of kiln_gpt_set_grad_ready, once the backend has finished writing it (a
 * queued op must not race the caller's communication). */
/* The part (block of weights) of layer l: -1 the embeddings (and -2 none) as they are, L ln_f
 * (part U), a layer its shared block's. */
static int64_t layer_part(const kiln_gpt *m, int64_t l) {
    int64_t share = m->cfg.share_layers > 1 ? m->cfg.share_layers : 1;
    if (l < 0)
        return l;
    return l >= m->cfg.n_layer ? kiln_gpt_config_blocks(&m->cfg) : l / share;
}

/* After layer l's backward (L: ln_f's, -1: the embeddings'). A shared block's gradients are
 * final once its lowest layer, the last backward reaches, has run. */
static kiln_status report_grads(kiln_gpt *m, int64_t l) {
    int64_t share = m->cfg.share_layers > 1 ? m->cfg.share_layers : 1;
    if (!m->grad_ready || (l >= 0 && l < m->cfg.n_layer && l % share != 0))
        return KILN_OK;
    int64_t part = layer_part(m, l);
    KILN_CHECK(m->be->synchronize(m->be));
    int64_t lo, hi, wlo, whi;
    kiln__gpt_part_range(m, part, &lo, &hi);
    if (part == -1 && m->rows_apart) { /* wte went first: wpe is what is left */
        kiln_gpt_wte_range(m, &wlo, &whi);
        lo = whi;
        if (lo == hi) /* none: rotary positions */
            return KILN_OK;
    }
    m->grad_ready(m->grad_ready_ctx, lo, hi);
    return KILN_OK;
}

/* With the rows apart: wte's gradient is final once the classifier's backward has run. */
static kiln_status report_wte(kiln_gpt *m) {
    if (!m->grad_ready || !m->rows_apart)
        return KILN_OK;
    KILN_CHECK(m->be->synchronize(m->be));
    int64_t lo, hi;
    kiln_gpt_wte_range(m, &lo, &hi);
    m->grad_ready(m->grad_ready_ctx, lo, hi);
    return KILN_OK;
}

/* Layer l's parameters are about to be read (ZeRO 3: their part fetched by the caller's
 * hook); `next` is the layer wanted after it (-2: none known). */
static kiln_status need(kiln_gpt *m, int64_t l, int64_t next) {
    if (!m->param_need)
        return KILN_OK;
    KILN_CHECK(m->be->synchronize(m->be)); /* queued ops may still read the slab */
    return m->param_need(m->param_need_ctx, (int)layer_part(m, l), (int)layer_part(m, next));
}

/* The head's parameters: the final norm, and the tied wte (an untied head's matrix is in the
 * norm's part). */
static kiln_status need_head(kiln_gpt *m) {
    KILN_CHECK(need(m, m->cfg.n_layer, m->cfg.untied_head ? -2 : -1));
    return m->cfg.untied_head ? KILN_OK : need(m, -1, -2);
}

/* The loss over the batch (in fixed order: the same bits on every run). */
static float mean_loss(kiln_gpt *m, int64_t BT) {
    double ce = m->be->sum(m->be, m->losses, BT) / (double)BT;
    if (!m->soft.p)
        return (float)ce;
    double kl = m->be->sum(m->be, m->soft.kl, BT) / (double)BT, T = m->soft.temperature;
    return (float)(m->soft.alpha * ce + (1.0 - m->soft.alpha) * T * T * kl);
}

kiln_status kiln_gpt_set_soft_targets(kiln_gpt *m, const float *p, float alpha, float temperature) {
    if (!p) {
        m->soft.p = NULL;
        return KILN_OK;
    }
    if (m->dt != KILN_DTYPE_F32 || strcmp(m->be->name, "cpu"))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "distillation needs an fp32 model on the CPU backend");
    if (!(alpha >= 0.0f && alpha <= 1.0f) || !(temperature > 0.0f && temperature <= 100.0f))
        return kiln_error_setf(KILN_ERR_ARG,
                               "distillation: alpha must be in [0, 1] and the temperature in "
                               "(0, 100] (got %g, %g)",
                               alpha, temperature);
    if (!m->soft.kl) {
        m->soft.kl = calloc((size_t)(m->maxB * m->maxT), sizeof *m->soft.kl);
        m->soft.scratch =
            calloc((size_t)(m->logit_rows * m->cfg.padded_vocab_size), sizeof *m->soft.scratch);
        if (!m->soft.kl || !m->soft.scratch)
            return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate distillation's buffers");
    }
    m->soft.p = p;
    m->soft.alpha = alpha;
    m->soft.temperature = temperature;
    return KILN_OK;
}

kiln_status kiln_gpt_begin(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                           int64_t B, int64_t T) {
    if (!m)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_begin: NULL model");
    if (B < 1 || B > m->maxB || T < 1 || T > m->maxT)
        return kiln_error_setf(KILN_ERR_ARG,
                               "batch %lld x %lld does not fit the model's plan of %lld x %lld",
                               (long long)B, (long long)T, (long long)m->maxB, (long long)m->maxT);
    int64_t BT = B * T, V = m->cfg.vocab_size;
    m->have_batch = 0;
    m->have_targets = 0;
    m->logits_valid = 0;
    m->norm_ready = -1;
    if (inputs)
        KILN_CHECK(check_ids(inputs, BT, T, V, "input"));
    if (targets) {
        KILN_CHECK(check_ids(targets, BT, T, V, "target"));
        memcpy(m->targets, targets, (size_t)BT * sizeof *targets);
    }
    if (inputs)
        memcpy(m->inputs, inputs, (size_t)BT * sizeof *inputs);
    m->B = B;
    m->T = T;
    m->have_batch = 1 | (inputs ? 2 : 0) | (targets ? 4 : 0);
    return KILN_OK;
}

/* A stage call's checks: a batch begun (with inputs or targets where `what` needs them). */
static kiln_status need_batch(const kiln_gpt *m, int bits, const char *fn) {
    if (!m)
        return kiln_error_setf(KILN_ERR_ARG, "%s: NULL model", fn);
    if ((m->have_batch & bits) != bits)
        return kiln_error_setf(KILN_ERR_ARG, "%s: no batch%s (kiln_gpt_begin first)", fn,
                               bits & 2 ? " with inputs" : bits & 4 ? " with targets" : "");
    return KILN_OK;
}

kiln_status kiln_gpt_embed_forward(kiln_gpt *m) {
    KILN_CHECK(need_batch(m, 3, "kiln_gpt_embed_forward"));
    KILN_CHECK(need(m, -1, 0));
    embed_forward(m, m->B, m->T);
    m->norm_ready = -1;
    return KILN_OK;
}

/* Blocks [first, last) forward; each fused tail computes the next block's first norm when the
 * next block runs in this call, and the last block's the final norm when lnf_tail says so. */
static kiln_status blocks_run(kiln_gpt *m, int64_t first, int64_t last, int lnf_tail) {
    int64_t L = m->cfg.n_layer;
    for (int64_t l = first; l < last; l++) {
        int how = l + 1 < last || (l + 1 == L && lnf_tail) ? BLOCK_TAIL : 0;
        KILN_CHECK(need(m, l, l + 1));
        if ((how & BLOCK_TAIL) && m->opt.fuse_residual_ln) /* the next norm's weights */
            KILN_CHECK(need(m, l + 1, l + 2 <= L ? l + 2 : -2));
        block_forward(m, l, m->B, m->T, how);
    }
    return KILN_OK;
}

static kiln_status check_range(const kiln_gpt *m, int64_t first, int64_t last, const char *fn) {
    if (first < 0 || last > m->cfg.n_layer || first > last)
        return kiln_error_setf(KILN_ERR_ARG, "%s: blocks [%lld, %lld) of a model of %lld", fn,
                               (long long)first, (long long)last, (long long)m->cfg.n_layer);
    return KILN_OK;
}

kiln_status kiln_gpt_blocks_forward(kiln_gpt *m, int64_t first, int64_t last) {
    KILN_CHECK(need_batch(m, 1, "kiln_gpt_blocks_forward"));
    KILN_CHECK(check_range(m, first, last, "kiln_gpt_blocks_forward"));
    if (m->kv.t0 >= 0)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_blocks_forward: a cached forward runs");
    return blocks_run(m, first, last, 1);
}

void *kiln_gpt_stream(kiln_gpt *m, int64_t l) {
    if (!m || l < 0 || l > m->cfg.n_layer)
        return NULL;
    return block_input(m, l);
}

void *kiln_gpt_stream_grad(kiln_gpt *m) {
    return m ? m->d.dres : NULL;
}

/* The batch, then the embedding and every block; with_lnf: the last block's fused tail
 * computes ln_f over every row (generation computes it for the last rows only). */
static kiln_status body_forward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                                int64_t B, int64_t T, int with_lnf) {
    KILN_CHECK(kiln_gpt_begin(m, inputs, targets, B, T));
    KILN_CHECK(kiln_gpt_embed_forward(m));
    return blocks_run(m, 0, m->cfg.n_layer, with_lnf);
}

/* ln_f and the head on each sequence's last position of the body just run: logits (B,Vp). */
static kiln_status last_logits(kiln_gpt *m, int64_t B, int64_t T) {
    KILN_CHECK(need_head(m));
    kiln_backend *be = m->be;
    int64_t C = m->cfg.n_embd;
    const void *x = block_input(m, m->cfg.n_layer);
    for (int64_t b = 0; b < B; b++)
        norm_forward(m, row(m->lnf, b, C, m->dt), m->lnf_mean ? m->lnf_mean + b : NULL,
                     m->lnf_rstd + b, row((void *)x, b * T + T - 1, C, m->dt), m->p.lnfw, m->p.lnfb,
                     1);
    linear(m, -1, KILN_GPT_MATRIX_HEAD, m->logits, m->lnf, m->p.head, NULL, B, C,
           m->cfg.padded_vocab_size, NULL);
    KILN_CHECK(be->synchronize(be));
    m->logits_valid = 1;
    return KILN_OK;
}

kiln_status kiln_gpt_forward_last(kiln_gpt *m, const int32_t *inputs, int64_t B, int64_t T) {
    KILN_CHECK(body_forward(m, inputs, NULL, B, T, 0));
    return last_logits(m, B, T);
}

kiln_status kiln_gpt_enable_cache(kiln_gpt *m) {
    if (!m)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_enable_cache: NULL model");
    if (m->kv.buf)
        return KILN_OK;
    if (!m->opt.inference || !m->be->attention_decode)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "a generation cache needs an inference model on a backend with "
                               "attention_decode (the %s backend%s)",
                               m->be->name, m->be->attention_decode ? " has it" : " has none");
    int64_t cap = m->cfg.position == KILN_POSITION_ROPE ? 2 * m->maxT : m->maxT;
    size_t bytes = (size_t)(m->cfg.n_layer * m->maxB * cap) *
                   (size_t)kiln_gpt_config_qkv_width(&m->cfg) * kiln_dtype_size(m->dt);
    m->kv.buf = m->be->alloc(m->be, bytes);
    if (!m->kv.buf)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for a generation cache of %.1f MiB",
                               (double)bytes / (1 << 20));
    m->kv.len = 0;
    m->kv.cap = cap;
    m->kv.base = 0;
    return KILN_OK;
}

kiln_status kiln_gpt_forward_cached(kiln_gpt *m, const int32_t *inputs, int64_t B, int64_t t0,
                                    int64_t T) {
    if (!m || !inputs)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_forward_cached: NULL argument");
    if (!m->kv.buf)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_forward_cached: no cache "
                                             "(kiln_gpt_enable_cache first)");
    /* past maxT positions only rotary ones go on, a position at a time after the last */
    int slides = m->cfg.position == KILN_POSITION_ROPE && T == 1 && t0 == m->kv.len;
    if (t0 < 0 || t0 > m->kv.len || T < 1 || (t0 + T > m->maxT && !slides) || B < 1 ||
        B > m->maxB || (t0 > 0 && B != m->B))
        return kiln_error_setf(KILN_ERR_ARG,
                               "cached forward of positions %lld..%lld (batch %lld): the cache "
                               "holds %lld positions of batch %lld, the plan %lld x %lld%s",
                               (long long)t0, (long long)(t0 + T - 1), (long long)B,
                               (long long)m->kv.len, (long long)m->B, (long long)m->maxB,
                               (long long)m->maxT,
                               m->cfg.position == KILN_POSITION_ROPE
                                   ? " (past it, one position at a time after the last)"
                                   : " (learned positions end there)");
    if (t0 == 0)
        m->kv.base = 0;
    if (t0 < m->kv.base) /* a position that slid out of the window */
        return kiln_error_setf(KILN_ERR_ARG,
                               "cached forward from position %lld: the cache starts at %lld",
                               (long long)t0, (long long)m->kv.base);
    if (t0 + T > m->maxT)
        cache_slide(m, t0);
    m->kv.t0 = t0; /* the blocks' attention appends to the cache and reads it */
    kiln_status s = body_forward(m, inputs, NULL, B, T, 0);
    m->kv.t0 = -1;
    KILN_CHECK(s);
    m->kv.len = t0 + T;
    return last_logits(m, B, T);
}

/* The head over the batch's rows: ln_f (unless the last block's tail made it), then the
 * classifier and the losses chunk by chunk; with grad, the logits' gradient and the
 * classifier's backward too (d.dln: the gradient of ln_f's output). */
static void head_run(kiln_gpt *m, float dloss, int grad) {
    int64_t BT = m->B * m->T;
    head_norm(m, BT);
    for (int64_t r0 = 0; r0 < BT; r0 += m->logit_rows)
        head_rows(m, r0, BT - r0 < m->logit_rows ? BT - r0 : m->logit_rows, dloss, grad);
}

kiln_status kiln_gpt_head_forward(kiln_gpt *m, float *loss) {
    KILN_CHECK(need_batch(m, 1, "kiln_gpt_head_forward"));
    KILN_CHECK(need_head(m));
    int64_t BT = m->B * m->T, C = m->cfg.n_embd, Vp = m->cfg.padded_vocab_size;
    if (m->have_batch & 4) {
        /* the losses chunk by chunk; the logits stay only when one chunk holds them all */
        head_run(m, 0.0f, 0);
        m->logits_valid = m->logit_rows >= BT;
        float l = mean_loss(m, BT);
        if (loss)
            *loss = l;
        m->have_targets = 1;
    } else if (m->logit_rows >= BT) {
        head_norm(m, BT);
        linear(m, -1, KILN_GPT_MATRIX_HEAD, m->logits, m->lnf, m->p.head, NULL, BT, C, Vp, NULL);
        m->logits_valid = 1;
    } else {
        return kiln_error_setf(KILN_ERR_ARG,
                               "logits of %lld rows do not fit this model's classifier chunk of "
                               "%lld rows: give targets, or build it with classifier_chunk 0",
                               (long long)BT, (long long)m->logit_rows);
    }
    return m->be->synchronize(m->be);
}

kiln_status kiln_gpt_forward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets, int64_t B,
                             int64_t T, float *loss) {
    KILN_CHECK(body_forward(m, inputs, targets, B, T, 1));
    return kiln_gpt_head_forward(m, loss);
}

static kiln_status check_trainable(const kiln_gpt *m) {
    if (m->opt.inference)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "this model was built for inference: no backward");
    return KILN_OK;
}

/* After the classifier's backward (d.dln holds the gradient of ln_f's output): ln_f's
 * backward into d.dres, the gradient of the last block's output. Each part's gradients are
 * final once its own backward has run, except wte's, which the classifier's backward also
 * adds to: they are final with wpe's, last (or now, with the rows apart). */
static kiln_status head_tail_backward(kiln_gpt *m) {
    int64_t L = m->cfg.n_layer;
    m->have_targets = 0;
    m->logits_valid = 0; /* they now hold their gradient, or nothing */
    KILN_CHECK(report_wte(m));
    KILN_CHECK(need(m, L, L - 1));
    head_norm_backward(m, m->B * m->T);
    return report_grads(m, L);
}

kiln_status kiln_gpt_head_backward(kiln_gpt *m, float grad_scale) {
    if (!m)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_gpt_head_backward: NULL model");
    KILN_CHECK(check_trainable(m));
    if (!m->have_targets)
        return kiln_error_setf(KILN_ERR_ARG, "backward needs a forward with targets before it");
    if (m->soft.p)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "distillation's gradient comes from forward_backward");
    int64_t BT = m->B * m->T;
    float dloss = grad_scale / (float)BT;
    KILN_CHECK(need_head(m));
    if (m->logits_valid) {
        /* Softmax is recomputed here, in place over the kept logits, rather than kept from
         * forward: one pass over (BT,Vp) costs less than a second buffer of that size. */
        kiln_backend *be = m->be;
        int64_t C = m->cfg.n_embd, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
        be->crossentropy_forward_backward(be, m->dt, m->losses, m->logits, m->logits, m->targets,
                                          dloss, BT, V, Vp);
        be->matmul_backward(be, m->dt, m->d.dln, m->g.head, NULL, m->logits, m->lnf, m->p.head, BT,
                            C, Vp, 1);
    } else {
        for (int64_t r0 = 0; r0 < BT; r0 += m->logit_rows) /* the chunks again */
            head_rows(m, r0, BT - r0 < m->logit_rows ? BT - r0 : m->logit_rows, dloss, 1);
    }
    return head_tail_backward(m);
}

kiln_status kiln_gpt_head_forward_backward(kiln_gpt *m, float grad_scale, float *loss) {
    KILN_CHECK(need_batch(m, 5, "kiln_gpt_head_forward_backward"));
    KILN_CHECK(check_trainable(m));
    KILN_CHECK(need_head(m));
    int64_t BT = m->B * m->T;
    head_run(m, grad_scale / (float)BT, 1);
    KILN_CHECK(head_tail_backward(m));
    /* the losses' rows live to the end of the step, so the blocks' backward leaves them alone:
     * the caller reads the loss after queueing it (the step's one wait for the device) */
    if (loss)
        *loss = mean_loss(m, BT);
    return KILN_OK;
}

kiln_status kiln_gpt_blocks_backward(kiln_gpt *m, int64_t first, int64_t last) {
    KILN_CHECK(need_batch(m, 1, "kiln_gpt_blocks_backward"));
    KILN_CHECK(check_trainable(m));
    KILN_CHECK(check_range(m, first, last, "kiln_gpt_blocks_backward"));
    for (int64_t l = last - 1; l >= first; l--) {
        KILN_CHECK(need(m, l, l - 1 >= 0 ? l - 1 : -2));
        block_backward(m, l, m->B, m->T);
        KILN_CHECK(report_grads(m, l));
    }
    return KILN_OK;
}

kiln_status kiln_gpt_embed_backward(kiln_gpt *m) {
    KILN_CHECK(need_batch(m, 3, "kiln_gpt_embed_backward"));
    KILN_CHECK(check_trainable(m));
    embed_backward(m, m->B, m->T);
    KILN_CHECK(report_grads(m, -1));
    return m->be->synchronize(m->be);
}

/* The blocks and the embedding backward, after the head's. */
static kiln_status body_backward(kiln_gpt *m) {
    KILN_CHECK(kiln_gpt_blocks_backward(m, 0, m->cfg.n_layer));
    return kiln_gpt_embed_backward(m);
}

kiln_status kiln_gpt_backward(kiln_gpt *m, float grad_scale) {
    KILN_CHECK(kiln_gpt_head_backward(m, grad_scale));
    return body_backward(m);
}

kiln_status kiln_gpt_forward_backward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                                      int64_t B, int64_t T, float grad_scale, float *loss) {
    KILN_CHECK(check_trainable(m));
    if (!targets)
        return kiln_error_setf(KILN_ERR_ARG, "forward_backward needs targets");
    KILN_CHECK(body_forward(m, inputs, targets, B, T, 1));
    float l = 0.0f;
    KILN_CHECK(kiln_gpt_head_forward_backward(m, grad_scale, NULL));
    KILN_CHECK(body_backward(m));
    l = mean_loss(m, B * T);
    if (loss)
        *loss = l;
    return KILN_OK;
}

void kiln_gpt_set_grad_ready(kiln_gpt *m, kiln_grad_ready_fn fn, void *ctx) {
    m->grad_ready = fn;
    m->grad_ready_ctx = fn ? ctx : NULL;
}

void kiln_gpt_set_embed_rows_apart(kiln_gpt *m, int on) {
    m->rows_apart = on != 0;
}

void kiln_gpt_embed_rows(const kiln_gpt *m, const int32_t **ids, const void **rows, int64_t *n) {
    *ids = m->inputs;
    *rows = m->d.dres; /* the embedding output's gradient, which embed_backward read */
    *n = m->rows_n;
}

void kiln_gpt_set_param_need(kiln_gpt *m, kiln_param_need_fn fn, void *ctx) {
    m->param_need = fn;
    m->param_need_ctx = fn ? ctx : NULL;
}

void kiln_gpt_zero_grad(kiln_gpt *m) {
    if (m->grads)
        m->be->zero(m->be, m->grads, (size_t)m->slab_len * sizeof(float));
}

const void *kiln_gpt_logits(const kiln_gpt *m) {
    return m->logits_valid ? m->logits : NULL;
}

kiln_status kiln_gpt_logits_f32(const kiln_gpt *m, int64_t rows, float *out) {
    if (!m->logits_valid)
        return kiln_error_setf(KILN_ERR_ARG, "the model holds no logits (a chunked head keeps "
                                             "none, and backward turns them into gradients)");
    int64_t n = rows * m->cfg.padded_vocab_size;
    if (m->dt == KILN_DTYPE_F32) {
        m->be->copy(m->be, out, m->logits, (size_t)n * sizeof(float), KILN_COPY_TO_HOST);
    } else {
        /* widen on the device into the tail of out's bytes is not possible in general: copy
         * the narrow values to the host first, then widen there, back to front */
        m->be->copy(m->be, out, m->logits, (size_t)n * kiln_dtype_size(m->dt), KILN_COPY_TO_HOST);
        const uint16_t *h = (const uint16_t *)out;
        for (int64_t i = n - 1; i >= 0; i--) {
            uint16_t v = h[i];
            out[i] = m->dt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(v) : kiln_f16_to_f32(v);
        }
    }
    return m->be->synchronize(m->be);
}

const float *kiln_gpt_losses(const kiln_gpt *m) {
    return m->losses;
}

static const char *const recompute_names[] = {"none", "gelu", "attention", "block"};

kiln_status kiln_recompute_parse(const char *s, kiln_recompute *out) {
    for (int i = 0; s && i < 4; i++)
        if (!strcmp(s, recompute_names[i])) {
            *out = (kiln_recompute)i;
            return KILN_OK;
        }
    return kiln_error_setf(KILN_ERR_ARG,
                           "unknown recompute \"%s\" (expected none, gelu, attention or block)",
                           s ? s : "(null)");
}

const char *kiln_recompute_name(kiln_recompute r) {
    return (unsigned)r < 4 ? recompute_names[r] : "?";
}
