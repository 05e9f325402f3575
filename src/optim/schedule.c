/* Learning-rate schedules and global gradient-norm clipping. */
#include <math.h>
#include <strings.h>

#include "core/error.h"
#include "kiln/optim.h"

static const char *const lr_names[] = {"constant", "cosine", "linear"};
#define LR_NKINDS ((int)(sizeof lr_names / sizeof lr_names[0]))

kiln_status kiln_lr_kind_parse(const char *s, kiln_lr_kind *out) {
    if (!s || !out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_lr_kind_parse: NULL argument");
    for (int k = 0; k < LR_NKINDS; k++) {
        if (strcasecmp(s, lr_names[k]) == 0) {
            *out = (kiln_lr_kind)k;
            return KILN_OK;
        }
    }
    return kiln_error_setf(KILN_ERR_CONFIG,
                           "unknown learning-rate schedule \"%s\" (expected constant, cosine or "
                           "linear)",
                           s);
}

const char *kiln_lr_kind_name(kiln_lr_kind k) {
    if ((int)k < 0 || (int)k >= LR_NKINDS)
        return "unknown";
    return lr_names[k];
}

static int finite_nonneg(float x) { return x >= 0.0f && !isinf(x); }

kiln_status kiln_lr_schedule_check(const kiln_lr_schedule *s) {
    if (!s)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_lr_schedule_check: NULL schedule");
    if ((int)s->kind < 0 || (int)s->kind >= LR_NKINDS)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "learning-rate schedule kind %d is not one of "
                               "constant, cosine, linear",
                               (int)s->kind);
    if (!finite_nonneg(s->lr))
        return kiln_error_setf(KILN_ERR_CONFIG, "learning rate %g is not a finite value >= 0",
                               s->lr);
    if (s->kind != KILN_LR_CONSTANT && (!finite_nonneg(s->min_lr) || s->min_lr > s->lr))
        return kiln_error_setf(KILN_ERR_CONFIG, "%s schedule: min_lr %g is not in [0, lr = %g]",
                               kiln_lr_kind_name(s->kind), s->min_lr, s->lr);
    if (s->warmup_steps < 0 || s->total_steps < 0)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "learning-rate schedule: warmup_steps %lld and "
                               "total_steps %lld must be >= 0",
                               (long long)s->warmup_steps, (long long)s->total_steps);
    return KILN_OK;
}

float kiln_lr_at(const kiln_lr_schedule *s, int64_t step) {
    if (!s)
        return 0.0f;
    if (step < 0)
        step = 0;
    double lr = s->lr, min_lr = s->min_lr;
    if (step < s->warmup_steps)
        return (float)(lr * (double)(step + 1) / (double)s->warmup_steps);
    if (s->kind == KILN_LR_CONSTANT)
        return s->lr;
    if (step >= s->total_steps)
        return s->min_lr;
    /* Here warmup <= step < total, so the span is > 0 even when warmup_steps <= 0. */
    int64_t start = s->warmup_steps > 0 ? s->warmup_steps : 0;
    double frac = (double)(step - start) / (double)(s->total_steps - start); /* [0, 1) */
    double coef = s->kind == KILN_LR_COSINE ? 0.5 * (1.0 + cos(M_PI * frac)) : 1.0 - frac;
    return (float)(min_lr + coef * (lr - min_lr));
}

float kiln_clip_grad_norm(kiln_backend *be, float *grads, int64_t n, float max_norm) {
    if (!be || !be->sumsq || !grads || n <= 0)
        return n <= 0 ? 0.0f : NAN;
    double norm = sqrt(be->sumsq(be, KILN_DTYPE_F32, grads, n));
    if (!isfinite(norm))
        return (float)norm;
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1. */
    if (max_norm > 0.0f && be->scale) {
        double coef = (double)max_norm / (norm + 1e-6);
        if (coef < 1.0)
            be->scale(be, grads, (float)coef, n);
    }
    return (float)norm;
}

kiln_loss_scaler kiln_loss_scaler_default(void) {
    kiln_loss_scaler s = {65536.0f, 2.0f, 0.5f, 2000, 0x1p-14f, 0, 0};
    return s;
}

kiln_status kiln_loss_scaler_update(kiln_loss_scaler *s, int finite) {
    if (finite) {
        if (++s->clean_steps >= s->interval) {
            float grown = s->scale * s->growth;
            if (isfinite(grown))
                s->scale = grown;
            s->clean_steps = 0;
        }
        return KILN_OK;
    }
    s->skipped++;
    s->clean_steps = 0;
    s->scale *= s->backoff;
    if (s->scale < s->min_scale)
        return kiln_error_setf(KILN_ERR_RANGE,
                               "the loss scale fell to %g, below its minimum %g: the gradients "
                               "overflow fp16 whatever the scale (%lld steps skipped); train in "
                               "bf16 or fp32, or lower the learning rate",
                               (double)s->scale, (double)s->min_scale, (long long)s->skipped);
    return KILN_OK;
}
