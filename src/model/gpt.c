/* GPT-2 forward and backward, written once against the backend's ops.
 * The model is embedding, blocks 0..L-1 and head, each with its own forward and backward. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "model/gpt_internal.h"

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

/* ---- embedding ---- */

static void embed_forward(kiln_gpt *m, int64_t B, int64_t T) {
    m->be->encoder_forward(m->encoded, m->inputs, m->p.wte, m->p.wpe, B, T, m->cfg.n_embd);
}

static void embed_backward(kiln_gpt *m, int64_t B, int64_t T) {
    m->be->encoder_backward(m->g.wte, m->g.wpe, m->d.dres, m->inputs, B, T, m->cfg.n_embd);
}

/* ---- blocks ---- */

static const float *block_input(const kiln_gpt *m, int64_t l) {
    return l == 0 ? m->encoded : m->blocks[l - 1].res3;
}

static void block_forward(kiln_gpt *m, int64_t l, int64_t B, int64_t T) {
    const kiln_backend *be = m->be;
    const gpt_block_params *w = &m->p.block[l];
    gpt_block_acts *a = &m->blocks[l];
    int64_t C = m->cfg.n_embd, NH = m->cfg.n_head, BT = B * T;
    const float *x = block_input(m, l);

    be->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1w, w->ln1b, BT, C);
    be->matmul_forward(a->qkv, a->ln1, w->qkvw, w->qkvb, BT, C, 3 * C, 0);
    be->attention_forward(a->atty, a->att, a->qkv, B, T, C, NH);
    be->matmul_forward(a->res2, a->atty, w->attprojw, w->attprojb, BT, C, C, 0);
    be->residual_forward(a->res2, a->res2, x, BT * C);

    be->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, BT, C);
    be->matmul_forward(a->fch, a->ln2, w->fcw, w->fcb, BT, C, 4 * C, 0);
    be->gelu_forward(a->fch_gelu, a->fch, BT * 4 * C);
    be->matmul_forward(a->res3, a->fch_gelu, w->fcprojw, w->fcprojb, BT, 4 * C, C, 0);
    be->residual_forward(a->res3, a->res3, a->res2, BT * C);
}

/* On entry d.dres holds the gradient of the block's output; on exit, of its input. */
static void block_backward(kiln_gpt *m, int64_t l, int64_t B, int64_t T) {
    const kiln_backend *be = m->be;
    const gpt_block_params *w = &m->p.block[l];
    gpt_block_params *g = &m->g.block[l];
    const gpt_block_acts *a = &m->blocks[l];
    gpt_grad_scratch *d = &m->d;
    int64_t C = m->cfg.n_embd, NH = m->cfg.n_head, BT = B * T;
    const float *x = block_input(m, l);

    be->matmul_backward(d->dfch_gelu, g->fcprojw, g->fcprojb, d->dres, a->fch_gelu, w->fcprojw,
                        BT, 4 * C, C, 0);
    be->gelu_backward(d->dfch, a->fch, d->dfch_gelu, BT * 4 * C);
    be->matmul_backward(d->dln, g->fcw, g->fcb, d->dfch, a->ln2, w->fcw, BT, C, 4 * C, 0);
    be->layernorm_backward(d->dres, g->ln2w, g->ln2b, d->dln, a->res2, w->ln2w, a->ln2_mean,
                           a->ln2_rstd, BT, C);

    be->matmul_backward(d->datty, g->attprojw, g->attprojb, d->dres, a->atty, w->attprojw, BT,
                        C, C, 0);
    be->attention_backward(d->dqkv, d->datt, d->datty, a->qkv, a->att, B, T, C, NH);
    be->matmul_backward(d->dln, g->qkvw, g->qkvb, d->dqkv, a->ln1, w->qkvw, BT, C, 3 * C, 0);
    be->layernorm_backward(d->dres, g->ln1w, g->ln1b, d->dln, x, w->ln1w, a->ln1_mean,
                           a->ln1_rstd, BT, C);
}

/* ---- head: final LayerNorm, tied output projection, cross-entropy ---- */

static void head_forward(kiln_gpt *m, int64_t B, int64_t T) {
    int64_t C = m->cfg.n_embd, BT = B * T;
    const float *x = block_input(m, m->cfg.n_layer);
    m->be->layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, m->p.lnfw, m->p.lnfb, BT, C);
    m->be->matmul_forward(m->logits, m->lnf, m->p.wte, NULL, BT, C, m->cfg.padded_vocab_size, 1);
}

/* Leaves the gradient of the last block's output in d.dres. */
static void head_backward(kiln_gpt *m, int64_t B, int64_t T, float grad_scale) {
    const kiln_backend *be = m->be;
    int64_t C = m->cfg.n_embd, BT = B * T, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    const float *x = block_input(m, m->cfg.n_layer);
    /* Softmax is recomputed here, in place over the logits, rather than kept from forward:
     * one pass over (BT,Vp) costs less than a second buffer of that size. */
    be->crossentropy_forward_backward(m->losses, m->logits, m->logits, m->targets,
                                      grad_scale / (float)BT, BT, V, Vp);
    be->matmul_backward(m->d.dln, m->g.wte, NULL, m->logits, m->lnf, m->p.wte, BT, C, Vp, 1);
    be->zero(m->d.dres, BT * C);
    be->layernorm_backward(m->d.dres, m->g.lnfw, m->g.lnfb, m->d.dln, x, m->p.lnfw, m->lnf_mean,
                           m->lnf_rstd, BT, C);
}

/* Checks the batch and runs the embedding and every block. */
static kiln_status body_forward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                                int64_t B, int64_t T) {
    if (B < 1 || B > m->maxB || T < 1 || T > m->maxT)
        return kiln_error_setf(KILN_ERR_ARG,
                               "batch %lld x %lld does not fit the model's plan of %lld x %lld",
                               (long long)B, (long long)T, (long long)m->maxB, (long long)m->maxT);
    int64_t BT = B * T, V = m->cfg.vocab_size;
    m->have_targets = 0;
    KILN_CHECK(check_ids(inputs, BT, T, V, "input"));
    if (targets)
        KILN_CHECK(check_ids(targets, BT, T, V, "target"));
    memcpy(m->inputs, inputs, (size_t)BT * sizeof *inputs);
    m->B = B;
    m->T = T;
    embed_forward(m, B, T);
    for (int64_t l = 0; l < m->cfg.n_layer; l++)
        block_forward(m, l, B, T);
    return KILN_OK;
}

kiln_status kiln_gpt_forward_last(kiln_gpt *m, const int32_t *inputs, int64_t B, int64_t T) {
    KILN_CHECK(body_forward(m, inputs, NULL, B, T));
    int64_t C = m->cfg.n_embd;
    const float *x = block_input(m, m->cfg.n_layer);
    for (int64_t b = 0; b < B; b++)
        m->be->layernorm_forward(m->lnf + b * C, m->lnf_mean + b, m->lnf_rstd + b,
                                 x + (b * T + T - 1) * C, m->p.lnfw, m->p.lnfb, 1, C);
    m->be->matmul_forward(m->logits, m->lnf, m->p.wte, NULL, B, C, m->cfg.padded_vocab_size, 1);
    return KILN_OK;
}

kiln_status kiln_gpt_forward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                             int64_t B, int64_t T, float *loss) {
    KILN_CHECK(body_forward(m, inputs, targets, B, T));
    int64_t BT = B * T, V = m->cfg.vocab_size;
    head_forward(m, B, T);

    if (targets) {
        memcpy(m->targets, targets, (size_t)BT * sizeof *targets);
        m->be->crossentropy_forward_backward(m->losses, NULL, m->logits, m->targets, 0.0f, BT, V,
                                             m->cfg.padded_vocab_size);
        double sum = 0.0; /* fixed order: the same bits on every run */
        for (int64_t i = 0; i < BT; i++)
            sum += m->losses[i];
        if (loss)
            *loss = (float)(sum / (double)BT);
        m->have_targets = 1;
    }
    return KILN_OK;
}

kiln_status kiln_gpt_backward(kiln_gpt *m, float grad_scale) {
    if (m->inference)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "this model was built for inference: no backward");
    if (!m->have_targets)
        return kiln_error_setf(KILN_ERR_ARG, "backward needs a forward with targets before it");
    int64_t B = m->B, T = m->T;
    head_backward(m, B, T, grad_scale);
    for (int64_t l = m->cfg.n_layer - 1; l >= 0; l--)
        block_backward(m, l, B, T);
    embed_backward(m, B, T);
    m->have_targets = 0; /* the logits now hold their gradient */
    return KILN_OK;
}

void kiln_gpt_zero_grad(kiln_gpt *m) {
    if (m->grads)
        m->be->zero(m->grads, m->slab_len);
}

const float *kiln_gpt_logits(const kiln_gpt *m) { return m->logits; }
const float *kiln_gpt_losses(const kiln_gpt *m) { return m->losses; }
