/* Quantization-aware training (compress.qat_bits): the optimizer keeps fp32 master
 * weights (forced for fp32 runs) and after every update the working weights become the master
 * weights fake-quantized: the block matrices per output column, the tied embedding/head per
 * row, as int8 symmetric (scale max|w| / 127). Forward and backward see the quantized model;
 * the gradient they give updates the master weights as if the rounding were not there (the
 * straight-through estimator). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/compress.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

/* rows x cols of src (row-major), fake-quantized into dst along `per_row` rows (each row its
 * scale) or columns; the model's working dtype dt. */
static void fake_quant(void *dst, kiln_dtype dt, const float *src, int64_t rows, int64_t cols,
                       int per_row, float *scale) {
    int64_t groups = per_row ? rows : cols;
    for (int64_t g = 0; g < groups; g++)
        scale[g] = 0.0f;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float a = fabsf(src[r * cols + c]);
            float *s = &scale[per_row ? r : c];
            if (a > *s)
                *s = a;
        }
    for (int64_t g = 0; g < groups; g++)
        scale[g] /= 127.0f;
    size_t es = kiln_dtype_size(dt);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float s = scale[per_row ? r : c];
            float q = s > 0.0f ? rintf(src[r * cols + c] / s) * s : 0.0f;
            int64_t i = r * cols + c;
            if (dt == KILN_DTYPE_F32)
                ((float *)dst)[i] = q;
            else
                kiln_convert((char *)dst + (size_t)i * es, dt, &q, KILN_DTYPE_F32, 1);
        }
}

kiln_status kiln__trainer_qat_apply(kiln_trainer *t) {
    if (t->cfg.compress.qat_bits == 0)
        return KILN_OK;
    const float *master = kiln_optim_master(t->opt);
    kiln_dtype dt = kiln_gpt_dtype(t->model);
    char *work = kiln_gpt_params(t->model);
    size_t es = kiln_dtype_size(dt);
    int64_t most = 0;
    for (int i = 0; i < kiln_gpt_num_tensors(t->model); i++) {
        const kiln_tensor_info *ti = kiln_gpt_tensor(t->model, i);
        if (ti->ndim == 2 && ti->shape[0] > most)
            most = ti->shape[0];
        if (ti->ndim == 2 && ti->shape[1] > most)
            most = ti->shape[1];
    }
    float *scale = malloc((size_t)most * sizeof *scale);
    if (!scale)
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < kiln_gpt_num_tensors(t->model); i++) {
        const kiln_tensor_info *ti = kiln_gpt_tensor(t->model, i);
        if (!kiln_quant_is_matrix(ti->name)) /* the matrices int8 quantizes, alike */
            continue;
        /* wte (V, C): a row is the head's output channel; block matrices (in, out): a column */
        fake_quant(work + (size_t)ti->offset * es, dt, master + ti->offset, ti->shape[0],
                   ti->shape[1], !strcmp(ti->name, "wte.weight"), scale);
    }
    free(scale);
    return KILN_OK;
}

kiln_status kiln__trainer_qat_init(kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    if (c->compress.qat_bits == 0)
        return KILN_OK;
    if (c->compress.qat_bits != 8)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "quantization-aware training fakes int8 (8 bits), not %d",
                               c->compress.qat_bits);
    KILN_CHECK(kiln_gpt_require_family(kiln_gpt_get_config(t->model), KILN_FAMILY_GPT2,
                                       "quantization-aware training"));
    if (t->world > 1)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "quantization-aware training runs in one process (not under "
                               "mpirun)");
    if (!kiln_optim_master(t->opt))
        return kiln_error_setf(KILN_ERR_CONFIG, "quantization-aware training needs master weights");
    if (c->metrics.log)
        fprintf(c->metrics.log,
                "quantization-aware training: int8 per output channel, fake-quantized "
                "forward and backward, fp32 master weights\n");
    return kiln__trainer_qat_apply(t);
}

/* ---- quantization-aware training as a feature of the trainer (trainer_feature.h) ---- */

static kiln_status qat_after_update(kiln_trainer *t, int64_t step, int updated) {
    (void)step;
    return updated ? kiln__trainer_qat_apply(t) : KILN_OK;
}

const kiln__feature kiln__feature_qat = {
    .name = "quantization-aware training",
    .init = kiln__trainer_qat_init,
    .after_update = qat_after_update,
};
