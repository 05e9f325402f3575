/* Distillation in the trainer (kiln_train_config.distill.teacher_path): the teacher, an fp32 model
 * for inference, runs forward on each micro-batch the student trains on, and its tempered
 * probabilities become the student's soft targets (kiln_gpt_set_soft_targets). The teacher
 * never runs backward and holds no gradients or optimizer state. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/checkpoint.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

kiln_status kiln__trainer_distill_init(kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    if (!c->distill.teacher_path)
        return KILN_OK;
    const kiln_gpt_config *sc = kiln_gpt_get_config(t->model);
    if (kiln_gpt_dtype(t->model) != KILN_DTYPE_F32)
        return kiln_error_setf(KILN_ERR_CONFIG, "distillation trains an fp32 student (--precision "
                                                "fp32)");
    if (!(c->distill.alpha >= 0.0f && c->distill.alpha <= 1.0f) ||
        !(c->distill.temperature > 0.0f && c->distill.temperature <= 100.0f))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "distillation: alpha must be in [0, 1] and the temperature in (0, "
                               "100] (got %g, %g)",
                               c->distill.alpha, c->distill.temperature);
    kiln_gpt_config tc;
    memset(&tc, 0, sizeof tc);
    KILN_CHECK(kiln_gpt_config_from_safetensors(&tc, c->distill.teacher_path));
    KILN_CHECK(kiln_gpt_config_validate(&tc));
    if (tc.vocab_size != sc->vocab_size)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the teacher %s has a %lld-token vocabulary and the student %lld: "
                               "distillation needs the same tokenizer for both",
                               c->distill.teacher_path, (long long)tc.vocab_size,
                               (long long)sc->vocab_size);
    if (c->data.T > tc.max_seq_len)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the teacher's context (%lld) is shorter than --seq %lld",
                               (long long)tc.max_seq_len, (long long)c->data.T);
    KILN_CHECK(
        kiln_gpt_create_inference(&t->teacher, &tc, c->data.B, c->data.T, KILN_DTYPE_F32, NULL));
    KILN_CHECK(kiln_gpt_load_safetensors(t->teacher, c->distill.teacher_path));
    int64_t BT = c->data.B * c->data.T;
    t->teacher_logits = malloc((size_t)(BT * tc.padded_vocab_size) * sizeof(float));
    t->teacher_p = malloc((size_t)(BT * tc.vocab_size) * sizeof(float));
    if (!t->teacher_logits || !t->teacher_p)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the teacher's outputs");
    if (c->metrics.log)
        fprintf(c->metrics.log,
                "distillation: teacher %s (%lld layers, %lld channels), alpha %g (the data's "
                "cross-entropy) and 1 - alpha of T^2 KL at temperature %g\n",
                c->distill.teacher_path, (long long)tc.n_layer, (long long)tc.n_embd,
                (double)c->distill.alpha, (double)c->distill.temperature);
    return KILN_OK;
}

kiln_status kiln__trainer_distill_targets(kiln_trainer *t) {
    if (!t->teacher)
        return KILN_OK;
    const kiln_train_config *c = &t->cfg;
    const kiln_gpt_config *tc = kiln_gpt_get_config(t->teacher);
    int64_t BT = c->data.B * c->data.T, V = tc->vocab_size, Vp = tc->padded_vocab_size;
    KILN_CHECK(kiln_gpt_forward(t->teacher, t->inputs, NULL, c->data.B, c->data.T, NULL));
    KILN_CHECK(kiln_gpt_logits_f32(t->teacher, BT, t->teacher_logits));
    float T = c->distill.temperature;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BT; i++) {
        const float *z = t->teacher_logits + i * Vp;
        float *p = t->teacher_p + i * V, mx = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            mx = fmaxf(mx, z[v] / T);
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++)
            sum += (double)(p[v] = expf(z[v] / T - mx));
        for (int64_t v = 0; v < V; v++)
            p[v] = (float)(p[v] / sum);
    }
    return kiln_gpt_set_soft_targets(t->model, t->teacher_p, c->distill.alpha, T);
}

void kiln__trainer_distill_free(kiln_trainer *t) {
    kiln_gpt_free(t->teacher);
    free(t->teacher_logits);
    free(t->teacher_p);
}

/* ---- distillation as a feature of the trainer (trainer_feature.h) ---- */

static kiln_status distill_before_forward(kiln_trainer *t, int64_t micro) {
    (void)micro;
    return kiln__trainer_distill_targets(t);
}

const kiln__feature kiln__feature_distill = {
    .name = "distillation",
    .init = kiln__trainer_distill_init,
    .before_forward = distill_before_forward,
    .free = kiln__trainer_distill_free,
};
