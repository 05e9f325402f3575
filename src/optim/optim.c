/* Optimizers: AdamW, Adam, SGD with momentum, RMSprop.
 *
 * The optimizer owns its moment slabs (n floats each, same order as the parameter slab)
 * and a sorted list of ranges. A step calls one backend update kernel per range; the
 * kernels hold every loop over elements. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "kiln/core.h"
#include "kiln/optim.h"

struct kiln_optim {
    kiln_optim_config cfg;
    kiln_backend *be;
    kiln_optim_slab slab;     /* lo, hi set (hi > 0 unless the slab is empty) */
    int64_t n;                /* hi - lo: elements this optimizer owns */
    kiln_param_range *ranges; /* inside [lo, hi), sorted, disjoint, same-decay neighbours merged */
    int nranges;
    float *state[2]; /* (n) each, element 0 at slab offset lo; see kiln_optim_state */
    float *master;   /* (n) fp32 master weights when the working weights are narrower, or asked */
    int64_t steps;   /* updates applied so far */
};

kiln_optim_config kiln_optim_config_default(void) {
    kiln_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = KILN_OPTIM_ADAMW;
    c.beta1 = 0.9f;
    c.beta2 = 0.95f;
    c.eps = 1e-8f;
    c.weight_decay = 0.1f;
    c.momentum = 0.9f;
    c.dampening = 0.0f;
    c.nesterov = 0;
    c.alpha = 0.99f;
    return c;
}

static const char *const optim_names[] = {"adamw", "adam", "sgd", "rmsprop"};
#define OPTIM_NKINDS ((int)(sizeof optim_names / sizeof optim_names[0]))

kiln_status kiln_optim_kind_parse(const char *s, kiln_optim_kind *out) {
    if (!s || !out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_kind_parse: NULL argument");
    for (int k = 0; k < OPTIM_NKINDS; k++) {
        if (strcasecmp(s, optim_names[k]) == 0) {
            *out = (kiln_optim_kind)k;
            return KILN_OK;
        }
    }
    return kiln_error_setf(KILN_ERR_CONFIG,
                           "unknown optimizer \"%s\" (expected adamw, adam, sgd or rmsprop)", s);
}

const char *kiln_optim_kind_name(kiln_optim_kind k) {
    if ((int)k < 0 || (int)k >= OPTIM_NKINDS)
        return "unknown";
    return optim_names[k];
}

/* x in [0, 1) (upper bound open) or [0, 1] (closed); false for NaN. */
static int in_unit(float x, int closed) { return x >= 0.0f && (closed ? x <= 1.0f : x < 1.0f); }

static kiln_status bad_field(const kiln_optim_config *c, const char *field, double v,
                             const char *want) {
    return kiln_error_setf(KILN_ERR_CONFIG, "optimizer %s: %s = %g, expected %s",
                           kiln_optim_kind_name(c->kind), field, v, want);
}

kiln_status kiln_optim_config_check(const kiln_optim_config *c) {
    if (!c)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_config_check: NULL config");
    if ((int)c->kind < 0 || (int)c->kind >= OPTIM_NKINDS)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "optimizer kind %d is not one of adamw, adam, "
                               "sgd, rmsprop",
                               (int)c->kind);
    if (!(c->weight_decay >= 0.0f) || isinf(c->weight_decay))
        return bad_field(c, "weight_decay", c->weight_decay, "a finite value >= 0");
    switch (c->kind) {
    case KILN_OPTIM_ADAMW:
    case KILN_OPTIM_ADAM:
        if (!in_unit(c->beta1, 0))
            return bad_field(c, "beta1", c->beta1, "a value in [0, 1)");
        if (!in_unit(c->beta2, 0))
            return bad_field(c, "beta2", c->beta2, "a value in [0, 1)");
        break;
    case KILN_OPTIM_SGD:
        if (!in_unit(c->momentum, 0))
            return bad_field(c, "momentum", c->momentum, "a value in [0, 1)");
        if (!in_unit(c->dampening, 1))
            return bad_field(c, "dampening", c->dampening, "a value in [0, 1]");
        if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "optimizer sgd: Nesterov momentum needs "
                                   "momentum > 0 and dampening 0 (momentum %g, dampening %g)",
                                   c->momentum, c->dampening);
        break;
    case KILN_OPTIM_RMSPROP:
        if (!in_unit(c->alpha, 0))
            return bad_field(c, "alpha", c->alpha, "a value in [0, 1)");
        if (!in_unit(c->momentum, 0))
            return bad_field(c, "momentum", c->momentum, "a value in [0, 1)");
        break;
    }
    if (c->kind != KILN_OPTIM_SGD && (!(c->eps > 0.0f) || isinf(c->eps)))
        return bad_field(c, "eps", c->eps, "a finite value > 0");
    return KILN_OK;
}

/* The kernels a kind calls must be present. */
static kiln_status check_backend(kiln_backend *be, kiln_optim_kind kind) {
    if (!be)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_create: NULL backend");
    const char *missing = NULL;
    if ((kind == KILN_OPTIM_ADAMW || kind == KILN_OPTIM_ADAM) && !be->adam_update)
        missing = "adam_update";
    else if (kind == KILN_OPTIM_SGD && !be->sgd_update)
        missing = "sgd_update";
    else if (kind == KILN_OPTIM_RMSPROP && !be->rmsprop_update)
        missing = "rmsprop_update";
    if (missing)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "backend %s has no %s kernel for optimizer %s",
                               be->name ? be->name : "(unnamed)", missing,
                               kiln_optim_kind_name(kind));
    return KILN_OK;
}

typedef struct indexed_range {
    kiln_param_range r;
    int index; /* position in the caller's array, for messages */
} indexed_range;

static int cmp_range(const void *a, const void *b) {
    const indexed_range *x = a, *y = b;
    if (x->r.offset != y->r.offset)
        return x->r.offset < y->r.offset ? -1 : 1;
    return x->index - y->index;
}

/* Validates the caller's ranges and stores them sorted, with empty ones dropped and
 * adjacent ranges of equal decay merged (fewer, longer kernel calls; same result). */
static kiln_status copy_ranges(kiln_optim *o, const kiln_param_range *ranges, int nranges) {
    int64_t lo = o->slab.lo, hi = o->slab.hi, total = o->slab.n;
    if (nranges == 0) {
        o->ranges = malloc(sizeof *o->ranges);
        if (!o->ranges)
            return kiln_error_setf(KILN_ERR_NOMEM, "kiln_optim_create: range list");
        o->ranges[0] = (kiln_param_range){.offset = lo, .numel = hi - lo, .decay = 1};
        o->nranges = hi > lo;
        return KILN_OK;
    }
    if (nranges < 0 || !ranges)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_create: %d ranges at %p", nranges,
                               (const void *)ranges);
    indexed_range *tmp = malloc((size_t)nranges * sizeof *tmp);
    o->ranges = malloc((size_t)nranges * sizeof *o->ranges);
    if (!tmp || !o->ranges) {
        free(tmp);
        return kiln_error_setf(KILN_ERR_NOMEM, "kiln_optim_create: range list of %d", nranges);
    }
    for (int i = 0; i < nranges; i++) {
        const kiln_param_range *r = &ranges[i];
        if (r->offset < 0 || r->numel < 0 || r->offset > total - r->numel) {
            free(tmp);
            return kiln_error_setf(KILN_ERR_ARG,
                                   "kiln_optim_create: range %d [%lld, +%lld) is outside the slab "
                                   "of %lld elements",
                                   i, (long long)r->offset, (long long)r->numel, (long long)total);
        }
        /* the part of it this optimizer owns */
        int64_t b = r->offset > lo ? r->offset : lo, e = r->offset + r->numel;
        e = e < hi ? e : hi;
        tmp[i] = (indexed_range){.r = {b, e > b ? e - b : 0, r->decay}, .index = i};
    }
    qsort(tmp, (size_t)nranges, sizeof *tmp, cmp_range);
    int k = 0;
    int64_t end = 0; /* end of the last non-empty range kept */
    int last = -1;   /* caller's index of that range */
    for (int i = 0; i < nranges; i++) {
        kiln_param_range r = tmp[i].r;
        if (r.numel == 0)
            continue;
        if (r.offset < end) {
            int a = last, b = tmp[i].index;
            free(tmp);
            return kiln_error_setf(KILN_ERR_ARG,
                                   "kiln_optim_create: ranges %d and %d overlap at "
                                   "offset %lld",
                                   a, b, (long long)r.offset);
        }
        r.decay = r.decay != 0;
        if (k > 0 && o->ranges[k - 1].offset + o->ranges[k - 1].numel == r.offset &&
            o->ranges[k - 1].decay == r.decay)
            o->ranges[k - 1].numel += r.numel;
        else
            o->ranges[k++] = r;
        end = r.offset + r.numel;
        last = tmp[i].index;
    }
    free(tmp);
    o->nranges = k;
    return KILN_OK;
}

static kiln_status alloc_slab(kiln_optim *o, float **out, const char *what) {
    *out = o->be->alloc(o->be, (size_t)(o->n > 0 ? o->n : 1) * sizeof(float));
    if (!*out)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %.1f MiB of %s",
                               (double)o->n * sizeof(float) / (1024.0 * 1024.0), what);
    return KILN_OK;
}

/* Which moment slabs a config needs: Adam(W) m and v; SGD a momentum buffer when
 * momentum > 0; RMSprop the square average and, when momentum > 0, a momentum buffer. */
static void slabs_needed(const kiln_optim_config *c, int need[2]) {
    need[0] = need[1] = 0;
    switch (c->kind) {
    case KILN_OPTIM_ADAMW:
    case KILN_OPTIM_ADAM:
        need[0] = need[1] = 1;
        break;
    case KILN_OPTIM_SGD:
        need[0] = c->momentum > 0.0f;
        need[1] = 0;
        break;
    case KILN_OPTIM_RMSPROP:
        need[0] = 1;
        need[1] = c->momentum > 0.0f;
        break;
    }
}

kiln_status kiln_optim_create(kiln_optim **out, const kiln_optim_config *cfg,
                              const kiln_optim_slab *slab, const kiln_param_range *ranges,
                              int nranges, kiln_backend *be) {
    if (!out || !slab)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_create: NULL output or slab");
    *out = NULL;
    KILN_CHECK(kiln_optim_config_check(cfg));
    KILN_CHECK(check_backend(be, cfg->kind));
    kiln_optim_slab sl = *slab;
    if (sl.lo == 0 && sl.hi == 0)
        sl.hi = sl.n;
    if (sl.n < 0 || (uint64_t)sl.n > SIZE_MAX / sizeof(float) || sl.lo < 0 || sl.hi < sl.lo ||
        sl.hi > sl.n)
        return kiln_error_setf(KILN_ERR_ARG,
                               "kiln_optim_create: range [%lld, %lld) of a slab of %lld elements",
                               (long long)sl.lo, (long long)sl.hi, (long long)sl.n);
    if ((unsigned)sl.work >= KILN_DTYPE_COUNT)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_create: working dtype %d", (int)sl.work);

    kiln_status st = KILN_OK;
    kiln_optim *o = calloc(1, sizeof *o);
    if (!o)
        return kiln_error_setf(KILN_ERR_NOMEM, "kiln_optim_create: optimizer struct");
    o->cfg = *cfg;
    o->be = be;
    o->slab = sl;
    o->n = sl.hi - sl.lo;
    KILN_CHECK_GOTO(st, copy_ranges(o, ranges, nranges), fail);

    int need[2];
    slabs_needed(cfg, need);
    static const char *const what[2] = {"optimizer moment slab 0", "optimizer moment slab 1"};
    for (int i = 0; i < 2; i++) {
        if (need[i])
            KILN_CHECK_GOTO(st, alloc_slab(o, &o->state[i], what[i]), fail);
    }
    if (sl.work != KILN_DTYPE_F32 || sl.master)
        KILN_CHECK_GOTO(st, alloc_slab(o, &o->master, "fp32 master weights"), fail);
    *out = o;
    return KILN_OK;
fail:
    kiln_optim_free(o);
    return st;
}

void kiln_optim_free(kiln_optim *o) {
    if (!o)
        return;
    o->be->free(o->be, o->master);
    o->be->free(o->be, o->state[1]);
    o->be->free(o->be, o->state[0]);
    free(o->ranges);
    free(o);
}

/* One kernel call over range r; t is the 1-based step number. */
static void update_range(kiln_optim *o, const kiln_param_range *r, void *params,
                         const float *grads, float gs, float lr, float bc1, float bc2,
                         int64_t t) {
    const kiln_optim_config *c = &o->cfg;
    kiln_backend *be = o->be;
    int64_t off = r->offset, cnt = r->numel, k = off - o->slab.lo; /* k: index in my arrays */
    float wd = r->decay ? c->weight_decay : 0.0f;
    const float *g = grads + off;
    float *s0 = o->state[0] ? o->state[0] + k : NULL;
    float *s1 = o->state[1] ? o->state[1] + k : NULL;
    kiln_work_out work = {0}, *w = NULL;
    float *p;
    if (o->master) {
        p = o->master + k;
        work.p = (char *)params + off * (int64_t)kiln_dtype_size(o->slab.work);
        work.dtype = o->slab.work;
        /* a different, nonzero seed each step: the same element rounds independently */
        work.round_seed = o->slab.stochastic_seed
                              ? (o->slab.stochastic_seed ^ ((uint64_t)t * 0x9e3779b97f4a7c15ull)) | 1
                              : 0;
        work.index0 = off;
        w = &work;
    } else {
        p = (float *)params + off;
    }
    switch (c->kind) {
    case KILN_OPTIM_ADAMW:
        be->adam_update(be, p, w, g, gs, s0, s1, cnt, lr, c->beta1, c->beta2, bc1, bc2, c->eps, wd,
                        0.0f);
        break;
    case KILN_OPTIM_ADAM:
        be->adam_update(be, p, w, g, gs, s0, s1, cnt, lr, c->beta1, c->beta2, bc1, bc2, c->eps, 0.0f,
                        wd);
        break;
    case KILN_OPTIM_SGD:
        be->sgd_update(be, p, w, g, gs, s0, cnt, lr, c->momentum, c->dampening, c->nesterov != 0, wd,
                       t == 1);
        break;
    case KILN_OPTIM_RMSPROP:
        be->rmsprop_update(be, p, w, g, gs, s0, s1, cnt, lr, c->alpha, c->eps, wd, c->momentum);
        break;
    }
}

kiln_status kiln_optim_step(kiln_optim *o, void *params, const float *grads, float lr) {
    return kiln_optim_step_scaled(o, params, grads, lr, 1.0f);
}

kiln_status kiln_optim_step_scaled(kiln_optim *o, void *params, const float *grads, float lr,
                                   float grad_scale) {
    if (!o || ((!params || !grads) && o->nranges > 0))
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_step: NULL optimizer, parameters or "
                                             "gradients");
    int64_t t = o->steps + 1;
    if (!(lr >= 0.0f) || isinf(lr))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "optimizer %s: learning rate %g at step %lld is not "
                               "a finite value >= 0",
                               kiln_optim_kind_name(o->cfg.kind), lr, (long long)t);
    if (!(grad_scale > 0.0f) || isinf(grad_scale))
        return kiln_error_setf(KILN_ERR_CONFIG, "optimizer %s: gradient scale %g at step %lld is "
                                                "not a finite value > 0",
                               kiln_optim_kind_name(o->cfg.kind), grad_scale, (long long)t);
    /* Bias corrections from the step count in double; b^t underflows to 0 harmlessly. */
    float bc1 = (float)(1.0 - pow((double)o->cfg.beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)o->cfg.beta2, (double)t));
    for (int i = 0; i < o->nranges; i++)
        update_range(o, &o->ranges[i], params, grads, grad_scale, lr, bc1, bc2, t);
    o->steps = t;
    return o->be->synchronize(o->be);
}

float *kiln_optim_master(kiln_optim *o) { return o ? o->master : NULL; }

kiln_status kiln_optim_write_working(kiln_optim *o, void *params) {
    if (!o || !params)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_write_working: NULL argument");
    if (o->master)
        o->be->convert(o->be, (char *)params + o->slab.lo * (int64_t)kiln_dtype_size(o->slab.work),
                       o->slab.work, o->master, KILN_DTYPE_F32, o->n);
    return o->be->synchronize(o->be);
}

kiln_status kiln_optim_read_working(kiln_optim *o, const void *params) {
    if (!o || !params)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_read_working: NULL argument");
    if (o->master)
        o->be->convert(o->be, o->master, KILN_DTYPE_F32,
                       (const char *)params + o->slab.lo * (int64_t)kiln_dtype_size(o->slab.work),
                       o->slab.work, o->n);
    return o->be->synchronize(o->be);
}

int64_t kiln_optim_steps_taken(const kiln_optim *o) { return o ? o->steps : 0; }

kiln_status kiln_optim_set_steps(kiln_optim *o, int64_t steps) {
    if (!o || steps < 0)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_optim_set_steps: %s%lld steps",
                               o ? "" : "NULL optimizer, ", (long long)steps);
    o->steps = steps;
    return KILN_OK;
}

float *kiln_optim_state(kiln_optim *o, int index) {
    if (!o || index < 0 || index > 1)
        return NULL;
    return o->state[index];
}

size_t kiln_optim_state_bytes(const kiln_optim *o) {
    if (!o)
        return 0;
    size_t slabs = (o->state[0] != NULL) + (o->state[1] != NULL) + (o->master != NULL);
    return slabs * (size_t)o->n * sizeof(float);
}

size_t kiln_optim_master_bytes(const kiln_optim *o) {
    return o && o->master ? (size_t)o->n * sizeof(float) : 0;
}

size_t kiln_optim_state_bytes_for(const kiln_optim_config *cfg, int64_t n, kiln_dtype work) {
    if (!cfg || n <= 0)
        return 0;
    int need[2];
    slabs_needed(cfg, need);
    return (size_t)(need[0] + need[1] + (work != KILN_DTYPE_F32)) * (size_t)n * sizeof(float);
}
