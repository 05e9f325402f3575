/* kiln: optimizers, learning-rate schedules and gradient clipping.
 *
 * An optimizer updates the parameter slab from the gradient slab. Its moments are slabs
 * in the same order, so a range of the parameter slab has the matching range of moments.
 * Weight decay applies only to the ranges marked decay (matrices), as GPT-2 training does. */
#ifndef KILN_OPTIM_H
#define KILN_OPTIM_H

#include <stdint.h>

#include "kiln/backend.h"
#include "kiln/dtype.h"
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

/* The parameter slab an optimizer updates: its length, the range [lo, hi) this optimizer
 * owns (0, 0: all of it; a ZeRO shard is a smaller range), and the working weights' dtype.
 * With F32 working weights the step updates them in place. With BF16 or F16 the optimizer
 * keeps fp32 master weights for its range, updates those, and writes the working weights
 * rounded from them: to nearest even, or (BF16 with stochastic_seed != 0) stochastically,
 * with bits drawn from (seed, step, element), the same whatever the threads or ranges. */
typedef struct kiln_optim_slab {
    int64_t n;
    int64_t lo, hi;
    kiln_dtype work;
    uint64_t stochastic_seed;
    int master; /* keep fp32 master weights even for F32 working weights (quantization-aware
                   training writes fake-quantized working weights from them) */
} kiln_optim_slab;

/* Moment slabs (and master weights) for [lo, hi) are allocated here on the backend (zero).
 * The ranges, given over the whole slab, are copied and cut to [lo, hi); they must lie inside
 * [0, n) and not overlap (gaps are left untouched by the step). nranges == 0 (ranges may be
 * NULL) means one range over [lo, hi), with weight decay. The backend must outlive the
 * optimizer. Master weights start at zero: fill them (kiln_optim_master) or read them from the
 * working weights (kiln_optim_read_working) before the first step. */
kiln_status kiln_optim_create(kiln_optim **out, const kiln_optim_config *cfg,
                              const kiln_optim_slab *slab, const kiln_param_range *ranges,
                              int nranges, kiln_backend *be);
void kiln_optim_free(kiln_optim *o);
/* One update at learning rate lr of the working weights `params` (the whole slab, in the
 * slab's working dtype) from the fp32 gradients `grads` (the whole slab); the step counter
 * (for bias correction) advances. lr must be finite and >= 0 (KILN_ERR_CONFIG otherwise,
 * nothing changed). */
kiln_status kiln_optim_step(kiln_optim *o, void *params, const float *grads, float lr);
/* The same with the gradients read as grad_scale x grads (finite, > 0): clipping and a
 * loss scale's division in the update's own pass, not a pass of their own. */
kiln_status kiln_optim_step_scaled(kiln_optim *o, void *params, const float *grads, float lr,
                                   float grad_scale);
int64_t kiln_optim_steps_taken(const kiln_optim *o);
/* Set the step counter, when resuming with moment slabs restored from a checkpoint. */
kiln_status kiln_optim_set_steps(kiln_optim *o, int64_t steps);
/* Moment slabs, for checkpoints: index 0 (m / momentum buffer / square average) and
 * 1 (v / RMSprop momentum buffer), hi - lo floats for [lo, hi); NULL when the optimizer has
 * no such slab. */
float *kiln_optim_state(kiln_optim *o, int index);
/* The fp32 master weights of [lo, hi) (hi - lo floats), or NULL with F32 working weights. */
float *kiln_optim_master(kiln_optim *o);
/* Working weights [lo, hi) of params = the master weights, rounded (to nearest even). */
kiln_status kiln_optim_write_working(kiln_optim *o, void *params);
/* Master weights = the working weights [lo, hi) of params, widened. */
kiln_status kiln_optim_read_working(kiln_optim *o, const void *params);
/* Bytes of the moment slabs and master weights, and of the master weights alone. */
size_t kiln_optim_state_bytes(const kiln_optim *o);
size_t kiln_optim_master_bytes(const kiln_optim *o);
/* The bytes kiln_optim_create would take for a range of n elements with this configuration
 * and working dtype: to check a plan before anything is allocated. */
size_t kiln_optim_state_bytes_for(const kiln_optim_config *cfg, int64_t n, kiln_dtype work);

/* ---- dynamic loss scaling (fp16) ----
 * The loss is multiplied by `scale` before backward, so that small gradients survive fp16;
 * the optimizer sees them divided back. A step whose gradients are not finite (an overflow)
 * is skipped and the scale backed off; after `interval` clean steps in a row it grows. */
typedef struct kiln_loss_scaler {
    float scale;           /* current scale (2^16) */
    float growth, backoff; /* x2 after `interval` clean steps; x0.5 after an overflow */
    int64_t interval;      /* 2000 */
    float min_scale;       /* below this the run cannot go on (2^-14) */
    int64_t clean_steps;   /* in a row, since the last change */
    int64_t skipped;       /* steps skipped in all */
} kiln_loss_scaler;
/* PyTorch GradScaler's defaults: 65536, x2, x0.5, every 2000 steps; minimum 2^-14. */
kiln_loss_scaler kiln_loss_scaler_default(void);
/* After a step's gradients were checked: finite != 0 keeps the step (and may grow the
 * scale), 0 skips it and backs off. KILN_ERR_RANGE, with a message, when the scale falls
 * below min_scale: the gradients overflow whatever the scale, and the run must stop. */
kiln_status kiln_loss_scaler_update(kiln_loss_scaler *s, int finite);

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
float kiln_clip_grad_norm(kiln_backend *be, float *grads, int64_t n, float max_norm);

#ifdef __cplusplus
}
#endif
#endif
