/* Structured pruning (include/kiln/compress.h): attention heads and MLP neurons scored, the
 * lowest of each block removed, and the model rebuilt narrower. A head h of a block owns
 * columns h*hs..(h+1)*hs of each of q, k and v in attn.c_attn (weights and bias) and the same
 * rows of attn.c_proj; MLP neuron j owns column j of mlp.c_fc (and its bias) and row j of
 * mlp.c_proj. Removing a head or a neuron is exactly zeroing its rows of the output
 * projection: what the rebuilt model computes is what the full one computes with them zeroed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/compress.h"
#include "kiln/loader.h"

kiln_status kiln_importance_parse(const char *name, kiln_importance *out) {
    if (name && !strcmp(name, "taylor"))
        *out = KILN_IMPORTANCE_TAYLOR;
    else if (name && !strcmp(name, "magnitude"))
        *out = KILN_IMPORTANCE_MAGNITUDE;
    else
        return kiln_error_setf(KILN_ERR_ARG, "unknown importance '%s': taylor or magnitude",
                               name ? name : "(null)");
    return KILN_OK;
}

/* The four tensors of weight block b that heads and neurons own parts of. */
typedef struct block_views {
    const kiln_tensor_info *qkvw, *qkvb, *projw, *fcw, *fcb, *fcprojw;
} block_views;

static kiln_status views_of(const kiln_gpt *m, int64_t b, block_views *v) {
    static const char *const names[] = {"attn.c_attn.weight", "attn.c_attn.bias",
                                        "attn.c_proj.weight", "mlp.c_fc.weight",
                                        "mlp.c_fc.bias",      "mlp.c_proj.weight"};
    const kiln_tensor_info **slots[] = {&v->qkvw, &v->qkvb, &v->projw,
                                        &v->fcw,  &v->fcb,  &v->fcprojw};
    for (int k = 0; k < 6; k++) {
        char name[64];
        snprintf(name, sizeof name, "h.%lld.%s", (long long)b, names[k]);
        int i = kiln_gpt_find_tensor(m, name);
        if (i < 0)
            return kiln_error_setf(KILN_ERR_FORMAT, "the model has no tensor %s", name);
        *slots[k] = kiln_gpt_tensor(m, i);
    }
    return KILN_OK;
}

/* Per group, over w and (Taylor) g: f(sum over the group's elements of w x g), or the sum of
 * w^2 (magnitude, g NULL). Added into head[b * NH + h] and neuron[b * H + j]. */
static kiln_status score(const kiln_gpt *m, const float *w, const float *g, double *head,
                         double *neuron) {
    const kiln_gpt_config *c = kiln_gpt_get_config(m);
    int64_t U = kiln_gpt_config_blocks(c), C = c->n_embd, NH = c->n_head;
    int64_t hs = kiln_gpt_config_head_size(c), A = NH * hs, H = kiln_gpt_config_mlp_width(c);
    double *acc = malloc((size_t)(NH > H ? NH : H) * sizeof *acc);
    if (!acc)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the importance scores");
#define TERM(k) (g ? (double)w[k] * (double)g[k] : (double)w[k] * (double)w[k])
    for (int64_t b = 0; b < U; b++) {
        block_views v;
        kiln_status s = views_of(m, b, &v);
        if (s) {
            free(acc);
            return s;
        }
        memset(acc, 0, (size_t)NH * sizeof *acc);
        for (int64_t i = 0; i < C; i++) /* c_attn (C,3A): q, k and v columns of each head */
            for (int64_t p = 0; p < 3; p++)
                for (int64_t col = 0; col < A; col++)
                    acc[col / hs] += TERM(v.qkvw->offset + i * 3 * A + p * A + col);
        for (int64_t p = 0; p < 3; p++)
            for (int64_t col = 0; col < A; col++)
                acc[col / hs] += TERM(v.qkvb->offset + p * A + col);
        for (int64_t r = 0; r < A; r++) /* c_proj (A,C): the head's rows */
            for (int64_t o = 0; o < C; o++)
                acc[r / hs] += TERM(v.projw->offset + r * C + o);
        for (int64_t h = 0; h < NH; h++)
            head[b * NH + h] += g ? acc[h] * acc[h] : sqrt(acc[h]);
        memset(acc, 0, (size_t)H * sizeof *acc);
        for (int64_t i = 0; i < C; i++) /* c_fc (C,H): column j */
            for (int64_t j = 0; j < H; j++)
                acc[j] += TERM(v.fcw->offset + i * H + j);
        for (int64_t j = 0; j < H; j++)
            acc[j] += TERM(v.fcb->offset + j);
        for (int64_t j = 0; j < H; j++) /* mlp.c_proj (H,C): row j */
            for (int64_t o = 0; o < C; o++)
                acc[j] += TERM(v.fcprojw->offset + j * C + o);
        for (int64_t j = 0; j < H; j++)
            neuron[b * H + j] += g ? acc[j] * acc[j] : sqrt(acc[j]);
    }
#undef TERM
    free(acc);
    return KILN_OK;
}

kiln_status kiln_struct_scores_magnitude(const kiln_gpt *m, const float *w, double *head,
                                         double *neuron) {
    if (!m || !w || !head || !neuron)
        return kiln_error_setf(KILN_ERR_ARG, "structured scores: NULL argument");
    KILN_CHECK(
        kiln_gpt_require_family(kiln_gpt_get_config(m), KILN_FAMILY_GPT2, "structured pruning"));
    return score(m, w, NULL, head, neuron);
}

kiln_status kiln_struct_scores_taylor_add(const kiln_gpt *m, const float *w, const float *g,
                                          double *head, double *neuron) {
    if (!m || !w || !g || !head || !neuron)
        return kiln_error_setf(KILN_ERR_ARG, "structured scores: NULL argument");
    KILN_CHECK(
        kiln_gpt_require_family(kiln_gpt_get_config(m), KILN_FAMILY_GPT2, "structured pruning"));
    return score(m, w, g, head, neuron);
}

kiln_status kiln_struct_scores_calibrate(kiln_gpt *m, kiln_loader *l, int64_t B, int64_t T,
                                         int64_t batches, double *head, double *neuron,
                                         double *mean_loss) {
    if (!m || !l || !head || !neuron || batches < 1)
        return kiln_error_setf(KILN_ERR_ARG, "structured calibration: bad argument");
    KILN_CHECK(
        kiln_gpt_require_family(kiln_gpt_get_config(m), KILN_FAMILY_GPT2, "structured pruning"));
    if (!kiln_gpt_grads(m) || kiln_gpt_dtype(m) != KILN_DTYPE_F32)
        return kiln_error_setf(KILN_ERR_ARG,
                               "structured calibration needs an fp32 model with gradients");
    const kiln_gpt_config *c = kiln_gpt_get_config(m);
    if (kiln_loader_vocab_size(l) != c->vocab_size)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the calibration data holds tokens of a %lld-token vocabulary; "
                               "the model has %lld",
                               (long long)kiln_loader_vocab_size(l), (long long)c->vocab_size);
    int64_t n = kiln_loader_batches_per_epoch(l);
    if (n < 1)
        return kiln_error_setf(KILN_ERR_CONFIG, "the calibration data holds no whole batch");
    if (batches > n)
        batches = n;
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    kiln_status s =
        in && tg ? KILN_OK : kiln_error_setf(KILN_ERR_NOMEM, "no memory for a calibration batch");
    double sum = 0.0;
    for (int64_t i = 0; s == KILN_OK && i < batches; i++) {
        float loss = 0.0f;
        KILN_CHECK_GOTO(s, kiln_loader_next(l, in, tg), done);
        kiln_gpt_zero_grad(m);
        KILN_CHECK_GOTO(s, kiln_gpt_forward_backward(m, in, tg, B, T, 1.0f, &loss), done);
        KILN_CHECK_GOTO(s, score(m, kiln_gpt_params(m), kiln_gpt_grads(m), head, neuron), done);
        sum += loss;
    }
    if (mean_loss)
        *mean_loss = sum / (double)batches;
done:
    free(in);
    free(tg);
    return s;
}

typedef struct ranked {
    double score;
    int64_t index;
} ranked;

static int by_score_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index; /* ties: the lower index first */
}

static int by_index(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The `keep` highest of s[0..n) by score, their indices ascending into out[0..keep). */
static kiln_status top(const double *s, int64_t n, int64_t keep, int64_t *out) {
    ranked *r = malloc((size_t)n * sizeof *r);
    if (!r)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory to rank %lld scores", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        r[i].score = isnan(s[i]) ? -INFINITY : s[i];
        r[i].index = i;
    }
    qsort(r, (size_t)n, sizeof *r, by_score_desc);
    for (int64_t i = 0; i < keep; i++)
        out[i] = r[i].index;
    qsort(out, (size_t)keep, sizeof *out, by_index);
    free(r);
    return KILN_OK;
}

kiln_status kiln_prune_structured(const kiln_gpt *m, const double *head, const double *neuron,
                                  int64_t keep_heads, int64_t keep_neurons, kiln_gpt **out,
                                  int64_t *heads_kept, int64_t *neurons_kept) {
    if (!m || !head || !neuron || !out)
        return kiln_error_setf(KILN_ERR_ARG, "structured pruning: NULL argument");
    *out = NULL;
    const kiln_gpt_config *c = kiln_gpt_get_config(m);
    KILN_CHECK(kiln_gpt_require_family(c, KILN_FAMILY_GPT2, "structured pruning"));
    int64_t U = kiln_gpt_config_blocks(c), C = c->n_embd, NH = c->n_head;
    int64_t hs = kiln_gpt_config_head_size(c), A = NH * hs, H = kiln_gpt_config_mlp_width(c);
    if (kiln_gpt_dtype(m) != KILN_DTYPE_F32 || kiln_gpt_has_linear(m))
        return kiln_error_setf(KILN_ERR_ARG,
                               "structured pruning needs a dense fp32 model (not a quantized "
                               "one)");
    if (keep_heads < 1 || keep_heads > NH)
        return kiln_error_setf(KILN_ERR_ARG,
                               "structured pruning would keep %lld of %lld heads in each layer: "
                               "a layer needs at least one head",
                               (long long)keep_heads, (long long)NH);
    if (keep_neurons < 1 || keep_neurons > H)
        return kiln_error_setf(KILN_ERR_ARG,
                               "structured pruning would keep %lld of %lld MLP neurons in each "
                               "layer: a layer needs at least one",
                               (long long)keep_neurons, (long long)H);
    kiln_gpt_config nc = *c;
    nc.head_size = hs;
    nc.mlp_hidden = keep_neurons;
    nc.n_head = keep_heads;
    int64_t A2 = keep_heads * hs, H2 = keep_neurons;
    KILN_CHECK(kiln_gpt_config_validate(&nc));
    int64_t *hk = malloc((size_t)(U * keep_heads) * sizeof *hk);
    int64_t *nk = malloc((size_t)(U * keep_neurons) * sizeof *nk);
    kiln_gpt *n = NULL;
    kiln_status s =
        hk && nk ? KILN_OK : kiln_error_setf(KILN_ERR_NOMEM, "no memory for structured pruning");
    for (int64_t b = 0; s == KILN_OK && b < U; b++) {
        s = top(head + b * NH, NH, keep_heads, hk + b * keep_heads);
        if (s == KILN_OK)
            s = top(neuron + b * H, H, keep_neurons, nk + b * keep_neurons);
    }
    if (s == KILN_OK)
        s = kiln_gpt_create_inference(&n, &nc, 1, 1, KILN_DTYPE_F32, NULL);
    if (s != KILN_OK)
        goto done;
    const float *src = kiln_gpt_params((kiln_gpt *)m);
    float *dst = kiln_gpt_params(n);
    for (int i = 0; i < kiln_gpt_num_tensors(n); i++) { /* everything but the blocks' widths */
        const kiln_tensor_info *t = kiln_gpt_tensor(n, i);
        int j = kiln_gpt_find_tensor(m, t->name);
        if (j < 0 || kiln_gpt_tensor(m, j)->numel != t->numel)
            continue;
        memcpy(dst + t->offset, src + kiln_gpt_tensor(m, j)->offset,
               (size_t)t->numel * sizeof *dst);
    }
    for (int64_t b = 0; b < U; b++) {
        block_views v, w;
        KILN_CHECK_GOTO(s, views_of(m, b, &v), done);
        KILN_CHECK_GOTO(s, views_of(n, b, &w), done);
        const int64_t *kh = hk + b * keep_heads, *kn = nk + b * keep_neurons;
        for (int64_t p = 0; p < 3; p++) /* q, k, v: the kept heads' columns, in order */
            for (int64_t h = 0; h < keep_heads; h++) {
                int64_t from = p * A + kh[h] * hs, to = p * A2 + h * hs;
                for (int64_t i = 0; i < C; i++)
                    memcpy(dst + w.qkvw->offset + i * 3 * A2 + to,
                           src + v.qkvw->offset + i * 3 * A + from, (size_t)hs * sizeof *dst);
                memcpy(dst + w.qkvb->offset + to, src + v.qkvb->offset + from,
                       (size_t)hs * sizeof *dst);
            }
        for (int64_t h = 0; h < keep_heads; h++) /* c_proj: the kept heads' rows */
            memcpy(dst + w.projw->offset + h * hs * C, src + v.projw->offset + kh[h] * hs * C,
                   (size_t)(hs * C) * sizeof *dst);
        for (int64_t i = 0; i < C; i++)
            for (int64_t j = 0; j < keep_neurons; j++)
                dst[w.fcw->offset + i * H2 + j] = src[v.fcw->offset + i * H + kn[j]];
        for (int64_t j = 0; j < keep_neurons; j++) {
            dst[w.fcb->offset + j] = src[v.fcb->offset + kn[j]];
            memcpy(dst + w.fcprojw->offset + j * C, src + v.fcprojw->offset + kn[j] * C,
                   (size_t)C * sizeof *dst);
        }
    }
    if (heads_kept)
        memcpy(heads_kept, hk, (size_t)(U * keep_heads) * sizeof *hk);
    if (neurons_kept)
        memcpy(neurons_kept, nk, (size_t)(U * keep_neurons) * sizeof *nk);
    *out = n;
    n = NULL;
done:
    kiln_gpt_free(n);
    free(hk);
    free(nk);
    return s;
}
