/* kiln: optimizers, learning-rate schedules and gradient clipping.
 *
 * An optimizer updates the parameter slab from the gradient slab. Its moments are slabs
 * in the same order, so a range of the parameter slab has the matching range of moments.
 * Weight decay applies only to the ranges marked decay (matrices), as GPT-2 training does. */
#ifndef KILN_OPTIM_H
#define KILN_OPTIM_H

#include <stdint.h>

#include "kiln/backend.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_optim_kind {
    KILN_OPTIM_ADAMW = 0, /* decoupled weight decay (Loshchilov & Hutter) */
    KILN_OPTIM_ADAM,      /* weight decay as L2 added to the gradient */
    KILN_OPTIM_SGD,       /* with momentum, optionally Nesterov */
    KILN_OPTIM_RMSPROP,
} kiln_optim_kind;

typedef struct kiln_optim_config {
    kiln_optim_kind kind;
    float beta1, beta2, eps;   /* Adam(W); eps also RMSprop's */
    float weight_decay;
    float momentum;            /* SGD, RMSprop */
    float dampening;           /* SGD */
    int nesterov;              /* SGD */
    float alpha;               /* RMSprop smoothing constant */
} kiln_optim_config;

/* Defaults: AdamW, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, momentum 0.9,
 * dampening 0, nesterov 0, alpha 0.99. */
kiln_optim_config kiln_optim_config_default(void);
/* Parse "adamw", "adam", "sgd", "rmsprop". */
kiln_status kiln_optim_kind_parse(const char *s, kiln_optim_kind *out);
const char *kiln_optim_kind_name(kiln_optim_kind k);

/* A range of the slab and whether weight decay applies to it. */
typedef struct kiln_param_range {
    int64_t offset, numel;
    int decay;
} kiln_param_range;

typedef struct kiln_optim kiln_optim; /* opaque */

/* Moment slabs of n floats are allocated here (zero). The ranges are copied. */
kiln_status kiln_optim_create(kiln_optim **out, const kiln_optim_config *cfg, int64_t n,
                              const kiln_param_range *ranges, int nranges,
                              const kiln_backend *be);
void kiln_optim_free(kiln_optim *o);
/* One update at learning rate lr; the step counter (for bias correction) advances. */
kiln_status kiln_optim_step(kiln_optim *o, float *params, const float *grads, float lr);
int64_t kiln_optim_steps_taken(const kiln_optim *o);
/* Moment slabs, for checkpoints: index 0 (m / momentum buffer / square average) and
 * 1 (v / RMSprop momentum buffer); NULL when the optimizer has no such slab. */
float *kiln_optim_state(kiln_optim *o, int index);
size_t kiln_optim_state_bytes(const kiln_optim *o);

/* ---- schedules ---- */
typedef enum kiln_lr_kind {
    KILN_LR_CONSTANT = 0,
    KILN_LR_COSINE, /* linear warmup, then cosine from lr to min_lr at total_steps */
    KILN_LR_LINEAR, /* linear warmup, then linear from lr to min_lr at total_steps */
} kiln_lr_kind;

typedef struct kiln_lr_schedule {
    kiln_lr_kind kind;
    float lr, min_lr;
    int64_t warmup_steps, total_steps;
} kiln_lr_schedule;

kiln_status kiln_lr_kind_parse(const char *s, kiln_lr_kind *out); /* constant|cosine|linear */
const char *kiln_lr_kind_name(kiln_lr_kind k);
/* Learning rate of step `step` (0-based). Warmup: lr * (step+1) / warmup_steps. */
float kiln_lr_at(const kiln_lr_schedule *s, int64_t step);

/* Global L2 norm of the gradient slab; if max_norm > 0 and the norm exceeds it, the
 * gradients are scaled by max_norm / (norm + 1e-6) as torch.nn.utils.clip_grad_norm_ does.
 * Returns the norm before clipping. */
float kiln_clip_grad_norm(const kiln_backend *be, float *grads, int64_t n, float max_norm);

#ifdef __cplusplus
}
#endif
#endif
