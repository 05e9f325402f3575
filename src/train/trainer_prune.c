/* Gradual magnitude pruning in the trainer (compress.prune_*): the mask is recomputed
 * at the schedule's steps from the fp32 weights (the master copy in bf16/fp16) and applied
 * after every update, so that a pruned weight stays zero whatever the optimizer's moments
 * say. One process: the threshold is over the whole slab. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/compress.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

/* The fp32 weights: the master copy, else the working weights (fp32). */
static float *weights32(kiln_trainer *t) {
    float *master = kiln_optim_master(t->opt);
    return master ? master : (float *)kiln_gpt_params(t->model);
}

/* keep's zeros into the fp32 weights and, when narrower, the working weights. */
static void apply(kiln_trainer *t) {
    float *w = weights32(t);
    float *master = kiln_optim_master(t->opt);
    size_t es = kiln_dtype_size(kiln_gpt_dtype(t->model));
    char *work = kiln_gpt_params(t->model);
    for (int i = 0; i < kiln_gpt_num_tensors(t->model); i++) {
        if (!kiln_prune_tensor(t->model, i))
            continue;
        const kiln_tensor_info *ti = kiln_gpt_tensor(t->model, i);
        const uint8_t *k = t->prune_keep + ti->offset;
        float *wi = w + ti->offset;
        for (int64_t e = 0; e < ti->numel; e++)
            if (!k[e])
                wi[e] = 0.0f;
        if (master)
            for (int64_t e = 0; e < ti->numel; e++)
                if (!k[e])
                    memset(work + (size_t)(ti->offset + e) * es, 0, es);
    }
}

kiln_status kiln__trainer_prune_init(kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    if (c->compress.prune_sparsity == 0.0)
        return KILN_OK;
    if (!(c->compress.prune_sparsity > 0.0 && c->compress.prune_sparsity < 1.0) ||
        c->compress.prune_start < 1 || c->compress.prune_end < c->compress.prune_start ||
        c->compress.prune_every < 1 ||
        (c->compress.prune_scope != KILN_PRUNE_GLOBAL &&
         c->compress.prune_scope != KILN_PRUNE_LAYER))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "pruning needs a sparsity in (0, 1), 1 <= start <= end and an "
                               "interval >= 1 (got %g, %lld, %lld, %lld)",
                               c->compress.prune_sparsity, (long long)c->compress.prune_start,
                               (long long)c->compress.prune_end,
                               (long long)c->compress.prune_every);
    if (t->world > 1)
        return kiln_error_setf(KILN_ERR_CONFIG, "pruning runs in one process (not under mpirun)");
    if (t->steps_done < c->compress.prune_start)
        return KILN_OK;
    /* resumed past the first pruning step: the pruned weights are the zeros */
    t->prune_keep = malloc((size_t)kiln_gpt_slab_len(t->model));
    if (!t->prune_keep)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the pruning mask");
    memset(t->prune_keep, 1, (size_t)kiln_gpt_slab_len(t->model));
    const float *w = weights32(t);
    for (int i = 0; i < kiln_gpt_num_tensors(t->model); i++)
        if (kiln_prune_tensor(t->model, i)) {
            const kiln_tensor_info *ti = kiln_gpt_tensor(t->model, i);
            for (int64_t e = 0; e < ti->numel; e++)
                t->prune_keep[ti->offset + e] = w[ti->offset + e] != 0.0f;
        }
    return KILN_OK;
}

kiln_status kiln__trainer_prune_step(kiln_trainer *t, int64_t step) {
    const kiln_train_config *c = &t->cfg;
    if (c->compress.prune_sparsity == 0.0)
        return KILN_OK;
    int due = step >= c->compress.prune_start && step <= c->compress.prune_end &&
              ((step - c->compress.prune_start) % c->compress.prune_every == 0 ||
               step == c->compress.prune_end);
    if (due) {
        if (!t->prune_keep && !(t->prune_keep = malloc((size_t)kiln_gpt_slab_len(t->model))))
            return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the pruning mask");
        double target = kiln_prune_schedule(0.0, c->compress.prune_sparsity,
                                            c->compress.prune_start, c->compress.prune_end, step);
        KILN_CHECK(kiln_prune_magnitude(t->model, weights32(t), target,
                                        (kiln_prune_scope)c->compress.prune_scope, t->prune_keep));
        char line[160];
        snprintf(line, sizeof line,
                 "{\"event\": \"prune\", \"step\": %lld, \"sparsity\": %.6f, \"scope\": \"%s\"}",
                 (long long)step, target,
                 c->compress.prune_scope == KILN_PRUNE_LAYER ? "layer" : "global");
        kiln__metrics_line(t->metrics, line, c->metrics.log);
        if (c->metrics.log)
            fprintf(c->metrics.log,
                    "prune: step %lld: %.1f%% of the blocks' matrices set to zero (%s)\n",
                    (long long)step, 100.0 * target,
                    c->compress.prune_scope == KILN_PRUNE_LAYER ? "per matrix"
                                                                : "global threshold");
    }
    if (t->prune_keep)
        apply(t);
    return KILN_OK;
}

const char *const *kiln__trainer_prune_meta(kiln_trainer *t, const float *w32) {
    if (!t->prune_keep)
        return NULL;
    size_t cap = 96 * (size_t)kiln_gpt_num_tensors(t->model) + 64;
    char *json = realloc(t->prune_json, cap);
    if (!json)
        return NULL;
    t->prune_json = json;
    double all = 0.0;
    kiln_prune_report(t->model, w32 ? w32 : weights32(t), json, cap, &all);
    t->prune_meta[0] = "kiln.sparsity";
    t->prune_meta[1] = json;
    t->prune_meta[2] = NULL;
    return t->prune_meta;
}

void kiln__trainer_prune_free(kiln_trainer *t) {
    free(t->prune_keep);
    free(t->prune_json);
}

/* ---- pruning as a feature of the trainer (trainer_feature.h) ---- */

static kiln_status prune_after_update(kiln_trainer *t, int64_t step, int updated) {
    return updated ? kiln__trainer_prune_step(t, step) : KILN_OK;
}

const kiln__feature kiln__feature_prune = {
    .name = "pruning",
    .init = kiln__trainer_prune_init,
    .after_update = prune_after_update,
    .free = kiln__trainer_prune_free,
};
