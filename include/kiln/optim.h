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
/* KILN_ERR_CONFIG, with a message, when a field the kind uses cannot work: betas and
 * alpha outside [0, 1), eps <= 0, weight decay < 0, momentum outside [0, 1), dampening
 * outside [0, 1], Nesterov without momentum or with dampening (as PyTorch), NaN anywhere. */
kiln_status kiln_optim_config_check(const kiln_optim_config *cfg);

/* A range of the slab and whether weight decay applies to it. */
typedef struct kiln_param_range {
    int64_t offset, numel;
    int decay;
} kiln_param_range;

typedef struct kiln_optim kiln_optim; /* opaque */

/* Moment slabs of n floats are allocated here (zero). The ranges are copied; they must lie
 * inside [0, n) and not overlap (gaps are left untouched by the step). nranges == 0 (ranges
 * may be NULL) means one range over the whole slab, with weight decay. The backend must
 * outlive the optimizer. */
kiln_status kiln_optim_create(kiln_optim **out, const kiln_optim_config *cfg, int64_t n,
                              const kiln_param_range *ranges, int nranges,
                              const kiln_backend *be);
void kiln_optim_free(kiln_optim *o);
/* One update at learning rate lr; the step counter (for bias correction) advances.
 * lr must be finite and >= 0 (KILN_ERR_CONFIG otherwise, nothing changed). */
kiln_status kiln_optim_step(kiln_optim *o, float *params, const float *grads, float lr);
int64_t kiln_optim_steps_taken(const kiln_optim *o);
/* Set the step counter, when resuming with moment slabs restored from a checkpoint. */
kiln_status kiln_optim_set_steps(kiln_optim *o, int64_t steps);
/* Moment slabs, for checkpoints: index 0 (m / momentum buffer / square average) and
 * 1 (v / RMSprop momentum buffer); NULL when the optimizer has no such slab. */
float *kiln_optim_state(kiln_optim *o, int index);
size_t kiln_optim_state_bytes(const kiln_optim *o);
/* The bytes kiln_optim_create would take for its moment slabs, for a slab of n floats and
 * this configuration: to check a plan before anything is allocated. */
size_t kiln_optim_state_bytes_for(const kiln_optim_config *cfg, int64_t n);

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
/* KILN_ERR_CONFIG, with a message, for an unknown kind, lr or min_lr negative or not finite,
 * min_lr > lr, or negative step counts. */
kiln_status kiln_lr_schedule_check(const kiln_lr_schedule *s);
/* Learning rate of step `step` (0-based). Warmup (every kind, when warmup_steps > 0):
 * lr * (step+1) / warmup_steps for step < warmup_steps. Then constant stays at lr; cosine
 * and linear go from lr at step warmup_steps to min_lr at total_steps and stay at min_lr
 * after it (also when total_steps <= warmup_steps: min_lr right after the warmup). */
float kiln_lr_at(const kiln_lr_schedule *s, int64_t step);

/* Global L2 norm of the gradient slab (sum of squares in double); if max_norm > 0 and
 * max_norm / (norm + 1e-6) < 1, the gradients are scaled by that factor, as
 * torch.nn.utils.clip_grad_norm_ does. Returns the norm before clipping. A norm that is
 * not finite is returned without scaling anything, so the caller can skip the step. */
float kiln_clip_grad_norm(const kiln_backend *be, float *grads, int64_t n, float max_norm);

#ifdef __cplusplus
}
#endif
#endif
