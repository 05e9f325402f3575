/* Optimizers: config checks, moment slabs, ranges and the arguments each update kernel
 * receives (through a recording backend), schedules, gradient clipping. */
#include <math.h>
#include <stdint.h>

#include <omp.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/optim.h"
#include "test.h"

/* ---- a backend that records the optimizer kernel calls it gets ---- */
typedef struct call {
    const char *kernel;
    float *p;
    kiln_work_out w; /* the working copy named, if any */
    int has_w;
    const float *g;
    float *s0, *s1;
    int64_t n;
    float lr, b1, b2, bc1, bc2, eps, decoupled_wd, l2_wd;
    float momentum, dampening, alpha, wd;
    float gscale; /* the gradient scale the kernel was given */
    int nesterov, first;
} call;

static call calls[64];
static int ncalls;

static call *record(const char *kernel, const kiln_work_out *w) {
    call *c = &calls[ncalls < 63 ? ncalls++ : 63];
    memset(c, 0, sizeof *c);
    c->kernel = kernel;
    c->has_w = w != NULL;
    if (w)
        c->w = *w;
    return c;
}

static void rec_adam(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                     float gscale, float *m, float *v, int64_t n, float lr, float b1, float b2,
                     float bc1, float bc2, float eps, float decoupled_wd, float l2_wd) {
    (void)be;
    call *c = record("adam", w);
    c->gscale = gscale;
    c->p = p, c->g = g, c->s0 = m, c->s1 = v, c->n = n, c->lr = lr, c->b1 = b1, c->b2 = b2;
    c->bc1 = bc1, c->bc2 = bc2, c->eps = eps, c->decoupled_wd = decoupled_wd, c->l2_wd = l2_wd;
}

static void rec_sgd(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                    float gscale, float *buf, int64_t n, float lr, float momentum, float dampening,
                    int nesterov, float wd, int first) {
    (void)be;
    call *c = record("sgd", w);
    c->gscale = gscale;
    c->p = p, c->g = g, c->s0 = buf, c->n = n, c->lr = lr, c->momentum = momentum;
    c->dampening = dampening, c->nesterov = nesterov, c->wd = wd, c->first = first;
}

static void rec_rmsprop(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                        float gscale, float *sq, float *buf, int64_t n, float lr, float alpha,
                        float eps, float wd, float momentum) {
    (void)be;
    call *c = record("rmsprop", w);
    c->gscale = gscale;
    c->p = p, c->g = g, c->s0 = sq, c->s1 = buf, c->n = n, c->lr = lr, c->alpha = alpha;
    c->eps = eps, c->wd = wd, c->momentum = momentum;
}

/* Memory is the CPU backend's (host memory from kiln_alloc, so counted). */
static void *rec_alloc(kiln_backend *be, size_t bytes) {
    (void)be;
    return kiln_backend_cpu()->alloc(kiln_backend_cpu(), bytes);
}
static void rec_free(kiln_backend *be, void *p) {
    (void)be;
    kiln_backend_cpu()->free(kiln_backend_cpu(), p);
}
static kiln_status rec_synchronize(kiln_backend *be) {
    kiln_status s = be->error;
    be->error = KILN_OK;
    return s;
}

static kiln_backend rec_backend = {
    .name = "recording",
    .alloc = rec_alloc,
    .free = rec_free,
    .synchronize = rec_synchronize,
    .adam_update = rec_adam,
    .sgd_update = rec_sgd,
    .rmsprop_update = rec_rmsprop,
};

/* A whole slab of n fp32 working weights. */
#define SLAB(n_) (&(kiln_optim_slab){.n = (n_), .work = KILN_DTYPE_F32})

/* ---- config ---- */
static void test_defaults_and_names(void) {
    kiln_optim_config c = kiln_optim_config_default();
    CHECK_INT_EQ(c.kind, KILN_OPTIM_ADAMW);
    CHECK_TRUE(c.beta1 == 0.9f && c.beta2 == 0.95f && c.eps == 1e-8f);
    CHECK_TRUE(c.weight_decay == 0.1f && c.momentum == 0.9f && c.dampening == 0.0f);
    CHECK_TRUE(c.nesterov == 0 && c.alpha == 0.99f);
    CHECK_OK(kiln_optim_config_check(&c));

    const char *names[] = {"adamw", "adam", "sgd", "rmsprop"};
    for (int k = 0; k < 4; k++) {
        kiln_optim_kind kind = KILN_OPTIM_ADAMW;
        CHECK_OK(kiln_optim_kind_parse(names[k], &kind));
        CHECK_INT_EQ(kind, k);
        CHECK_STR_EQ(kiln_optim_kind_name(kind), names[k]);
        c.kind = kind;
        CHECK_OK(kiln_optim_config_check(&c)); /* the defaults suit every kind */
    }
    kiln_optim_kind kind;
    CHECK_OK(kiln_optim_kind_parse("AdamW", &kind));
    CHECK_INT_EQ(kind, KILN_OPTIM_ADAMW);
    CHECK_STATUS(kiln_optim_kind_parse("lion", &kind), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "lion") != NULL);
    CHECK_STATUS(kiln_optim_kind_parse(NULL, &kind), KILN_ERR_ARG);
    CHECK_STR_EQ(kiln_optim_kind_name((kiln_optim_kind)17), "unknown");

    const char *lrs[] = {"constant", "cosine", "linear"};
    for (int k = 0; k < 3; k++) {
        kiln_lr_kind lk = KILN_LR_CONSTANT;
        CHECK_OK(kiln_lr_kind_parse(lrs[k], &lk));
        CHECK_INT_EQ(lk, k);
        CHECK_STR_EQ(kiln_lr_kind_name(lk), lrs[k]);
    }
    kiln_lr_kind lk;
    CHECK_STATUS(kiln_lr_kind_parse("step", &lk), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "step") != NULL);
}

/* Sets one field to a bad value and expects KILN_ERR_CONFIG naming the field. */
#define EXPECT_BAD(kind_, field_, value_, word_)                                                   \
    do {                                                                                           \
        kiln_optim_config c_ = kiln_optim_config_default();                                        \
        c_.kind = (kind_);                                                                         \
        c_.field_ = (value_);                                                                      \
        CHECK_STATUS(kiln_optim_config_check(&c_), KILN_ERR_CONFIG);                               \
        CHECK_TRUE(strstr(kiln_error_message(), (word_)) != NULL);                                 \
        kiln_optim *o_ = NULL;                                                                     \
        CHECK_STATUS(kiln_optim_create(&o_, &c_, SLAB(8), NULL, 0, &rec_backend),                  \
                     KILN_ERR_CONFIG);                                                             \
        CHECK_TRUE(o_ == NULL);                                                                    \
    } while (0)

static void test_config_validation(void) {
    EXPECT_BAD(KILN_OPTIM_ADAMW, beta1, 1.0f, "beta1");
    EXPECT_BAD(KILN_OPTIM_ADAMW, beta1, -0.1f, "beta1");
    EXPECT_BAD(KILN_OPTIM_ADAM, beta2, 1.0f, "beta2");
    EXPECT_BAD(KILN_OPTIM_ADAM, beta2, NAN, "beta2");
    EXPECT_BAD(KILN_OPTIM_ADAMW, eps, 0.0f, "eps");
    EXPECT_BAD(KILN_OPTIM_ADAMW, eps, INFINITY, "eps");
    EXPECT_BAD(KILN_OPTIM_ADAMW, weight_decay, -0.01f, "weight_decay");
    EXPECT_BAD(KILN_OPTIM_SGD, weight_decay, NAN, "weight_decay");
    EXPECT_BAD(KILN_OPTIM_SGD, momentum, 1.0f, "momentum");
    EXPECT_BAD(KILN_OPTIM_SGD, momentum, -0.5f, "momentum");
    EXPECT_BAD(KILN_OPTIM_SGD, dampening, 1.5f, "dampening");
    EXPECT_BAD(KILN_OPTIM_RMSPROP, alpha, 1.0f, "alpha");
    EXPECT_BAD(KILN_OPTIM_RMSPROP, eps, -1e-8f, "eps");
    EXPECT_BAD(KILN_OPTIM_RMSPROP, momentum, 2.0f, "momentum");
    EXPECT_BAD((kiln_optim_kind)9, beta1, 0.9f, "kind");

    kiln_optim_config c = kiln_optim_config_default();
    c.kind = KILN_OPTIM_SGD;
    c.nesterov = 1;
    c.dampening = 0.1f;
    CHECK_STATUS(kiln_optim_config_check(&c), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "Nesterov") != NULL);
    c.dampening = 0.0f;
    c.momentum = 0.0f;
    CHECK_STATUS(kiln_optim_config_check(&c), KILN_ERR_CONFIG);
    c.momentum = 0.9f;
    CHECK_OK(kiln_optim_config_check(&c));
    /* fields a kind does not use are not its concern: SGD ignores betas and eps */
    c.beta1 = 3.0f;
    c.eps = 0.0f;
    CHECK_OK(kiln_optim_config_check(&c));
    /* edge values that work */
    c = kiln_optim_config_default();
    c.beta1 = 0.0f;
    c.beta2 = 0.0f;
    c.weight_decay = 0.0f;
    CHECK_OK(kiln_optim_config_check(&c));
    CHECK_STATUS(kiln_optim_config_check(NULL), KILN_ERR_ARG);
}

/* ---- moment slabs ---- */
static kiln_optim_config config_of(kiln_optim_kind kind, float momentum) {
    kiln_optim_config c = kiln_optim_config_default();
    c.kind = kind;
    c.momentum = momentum;
    return c;
}

static int all_zero(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != 0.0f)
            return 0;
    return 1;
}

static void check_slabs(kiln_optim_kind kind, float momentum, int want0, int want1) {
    const int64_t n = 1000;
    size_t before = kiln_alloc_current();
    kiln_optim_config c = config_of(kind, momentum);
    kiln_optim *o = NULL;
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(n), NULL, 0, &rec_backend));
    if (!o)
        return;
    float *s0 = kiln_optim_state(o, 0), *s1 = kiln_optim_state(o, 1);
    CHECK_INT_EQ(s0 != NULL, want0);
    CHECK_INT_EQ(s1 != NULL, want1);
    CHECK_TRUE(!s0 || all_zero(s0, n));
    CHECK_TRUE(!s1 || all_zero(s1, n));
    size_t want_bytes = (size_t)(want0 + want1) * (size_t)n * sizeof(float);
    CHECK_INT_EQ(kiln_optim_state_bytes(o), want_bytes);
    CHECK_INT_EQ(kiln_optim_state_bytes_for(&c, n, KILN_DTYPE_F32),
                 want_bytes);                                /* the plan, before creating */
    CHECK_INT_EQ(kiln_alloc_current() - before, want_bytes); /* slabs come from kiln_alloc */
    CHECK_TRUE(kiln_optim_state(o, 2) == NULL && kiln_optim_state(o, -1) == NULL);
    CHECK_INT_EQ(kiln_optim_steps_taken(o), 0);
    kiln_optim_free(o);
    CHECK_INT_EQ(kiln_alloc_current(), before);
}

static void test_state_slabs(void) {
    check_slabs(KILN_OPTIM_ADAMW, 0.9f, 1, 1);
    check_slabs(KILN_OPTIM_ADAM, 0.0f, 1, 1);
    check_slabs(KILN_OPTIM_SGD, 0.0f, 0, 0);
    check_slabs(KILN_OPTIM_SGD, 0.9f, 1, 0);
    check_slabs(KILN_OPTIM_RMSPROP, 0.0f, 1, 0);
    check_slabs(KILN_OPTIM_RMSPROP, 0.5f, 1, 1);
    kiln_optim_free(NULL);
    CHECK_TRUE(kiln_optim_state(NULL, 0) == NULL);
    CHECK_INT_EQ(kiln_optim_state_bytes(NULL), 0);

    /* out of memory on the second slab: an error naming it, nothing left allocated */
    size_t before = kiln_alloc_current();
    kiln_alloc_set_limit(before + 1000 * sizeof(float) + 16);
    kiln_optim_config c = kiln_optim_config_default();
    kiln_optim *o = NULL;
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(1000), NULL, 0, &rec_backend), KILN_ERR_NOMEM);
    CHECK_TRUE(strstr(kiln_error_message(), "optimizer moment slab 1") != NULL);
    CHECK_TRUE(o == NULL);
    kiln_alloc_set_limit(0);
    CHECK_INT_EQ(kiln_alloc_current(), before);

    /* a backend without the kernel this kind needs */
    kiln_backend partial = rec_backend;
    partial.rmsprop_update = NULL;
    c.kind = KILN_OPTIM_RMSPROP;
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(10), NULL, 0, &partial), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "rmsprop_update") != NULL);
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(10), NULL, 0, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(-1), NULL, 0, &rec_backend), KILN_ERR_ARG);
}

static void test_bad_ranges(void) {
    kiln_optim_config c = kiln_optim_config_default();
    kiln_optim *o = NULL;
    size_t before = kiln_alloc_current();
    kiln_param_range outside[] = {{0, 10, 1}, {10, 11, 0}};
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(20), outside, 2, &rec_backend), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "range 1") != NULL);
    kiln_param_range negative[] = {{-1, 2, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(20), negative, 1, &rec_backend), KILN_ERR_ARG);
    kiln_param_range neg_numel[] = {{3, -2, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(20), neg_numel, 1, &rec_backend), KILN_ERR_ARG);
    kiln_param_range huge[] = {{5, INT64_MAX, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(20), huge, 1, &rec_backend), KILN_ERR_ARG);
    kiln_param_range overlap[] = {{10, 5, 1}, {0, 4, 0}, {3, 4, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(20), overlap, 3, &rec_backend), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "ranges 1 and 2 overlap at offset 3") != NULL);
    CHECK_STATUS(kiln_optim_create(&o, &c, SLAB(20), NULL, 2, &rec_backend), KILN_ERR_ARG);
    CHECK_TRUE(o == NULL);
    CHECK_INT_EQ(kiln_alloc_current(), before);
}

/* ---- what the kernels receive ---- */
static void test_adamw_calls(void) {
    enum { N = 30 };
    float p[N], g[N];
    /* out of order, a gap at [15, 20), an empty range, two adjacent decay ranges to merge */
    kiln_param_range r[] = {{20, 6, 1}, {0, 4, 1}, {4, 6, 1}, {10, 5, 0}, {26, 0, 0}};
    kiln_optim_config c = kiln_optim_config_default();
    c.beta1 = 0.8f;
    c.beta2 = 0.9f;
    kiln_optim *o = NULL;
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(N), r, 5, &rec_backend));
    if (!o)
        return;
    float *m = kiln_optim_state(o, 0), *v = kiln_optim_state(o, 1);
    for (int t = 1; t <= 3; t++) {
        ncalls = 0;
        CHECK_OK(kiln_optim_step(o, p, g, 0.5f * (float)t));
        CHECK_INT_EQ(kiln_optim_steps_taken(o), t);
        CHECK_INT_EQ(ncalls, 3);
        const int64_t off[] = {0, 10, 20}, cnt[] = {10, 5, 6};
        const int decay[] = {1, 0, 1};
        for (int i = 0; i < 3 && i < ncalls; i++) {
            call *k = &calls[i];
            CHECK_STR_EQ(k->kernel, "adam");
            CHECK_TRUE(k->p == p + off[i] && k->g == g + off[i]);
            CHECK_TRUE(k->s0 == m + off[i] && k->s1 == v + off[i]);
            CHECK_INT_EQ(k->n, cnt[i]);
            CHECK_TRUE(k->lr == 0.5f * (float)t && k->b1 == 0.8f && k->b2 == 0.9f);
            CHECK_TRUE(k->eps == 1e-8f);
            CHECK_TRUE(k->bc1 == (float)(1.0 - pow(0.8f, t)));
            CHECK_TRUE(k->bc2 == (float)(1.0 - pow(0.9f, t)));
            CHECK_TRUE(k->decoupled_wd == (decay[i] ? 0.1f : 0.0f));
            CHECK_TRUE(k->l2_wd == 0.0f);
            CHECK_TRUE(!k->has_w); /* fp32 working weights are the parameters themselves */
            CHECK_TRUE(k->gscale == 1.0f);
        }
    }
    /* a gradient scale (clipping, a loss scale's division) reaches every kernel call */
    ncalls = 0;
    CHECK_OK(kiln_optim_step_scaled(o, p, g, 0.5f, 0.25f));
    CHECK_INT_EQ(ncalls, 3);
    for (int i = 0; i < ncalls; i++)
        CHECK_TRUE(calls[i].gscale == 0.25f);
    /* resuming: the bias corrections follow the restored step count */
    CHECK_OK(kiln_optim_set_steps(o, 99));
    ncalls = 0;
    CHECK_OK(kiln_optim_step(o, p, g, 1.0f));
    CHECK_INT_EQ(kiln_optim_steps_taken(o), 100);
    CHECK_TRUE(calls[0].bc1 == (float)(1.0 - pow(0.8f, 100)));
    CHECK_TRUE(calls[0].bc2 == (float)(1.0 - pow(0.9f, 100)));
    CHECK_STATUS(kiln_optim_set_steps(o, -1), KILN_ERR_ARG);
    kiln_optim_free(o);
}

static void test_adam_sgd_rmsprop_calls(void) {
    enum { N = 12 };
    float p[N], g[N];
    kiln_param_range r[] = {{0, 8, 1}, {8, 4, 0}};
    kiln_optim *o = NULL;

    kiln_optim_config c = config_of(KILN_OPTIM_ADAM, 0.0f);
    c.weight_decay = 0.25f;
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(N), r, 2, &rec_backend));
    ncalls = 0;
    CHECK_OK(kiln_optim_step(o, p, g, 0.1f));
    CHECK_INT_EQ(ncalls, 2);
    CHECK_TRUE(calls[0].l2_wd == 0.25f && calls[0].decoupled_wd == 0.0f);
    CHECK_TRUE(calls[1].l2_wd == 0.0f && calls[1].decoupled_wd == 0.0f);
    kiln_optim_free(o);

    c = config_of(KILN_OPTIM_SGD, 0.9f);
    c.weight_decay = 0.01f;
    c.dampening = 0.0f;
    c.nesterov = 1;
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(N), r, 2, &rec_backend));
    for (int t = 1; t <= 2; t++) {
        ncalls = 0;
        CHECK_OK(kiln_optim_step(o, p, g, 0.1f));
        CHECK_INT_EQ(ncalls, 2);
        CHECK_STR_EQ(calls[0].kernel, "sgd");
        CHECK_INT_EQ(calls[0].first, t == 1);
        CHECK_INT_EQ(calls[1].first, t == 1);
        CHECK_TRUE(calls[0].s0 == kiln_optim_state(o, 0));
        CHECK_TRUE(calls[1].s0 == kiln_optim_state(o, 0) + 8);
        CHECK_TRUE(calls[0].wd == 0.01f && calls[1].wd == 0.0f);
        CHECK_TRUE(calls[0].momentum == 0.9f && calls[0].nesterov == 1);
    }
    kiln_optim_free(o);

    c = config_of(KILN_OPTIM_SGD, 0.0f);
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(N), r, 2, &rec_backend));
    ncalls = 0;
    CHECK_OK(kiln_optim_step(o, p, g, 0.1f));
    CHECK_TRUE(ncalls == 2 && calls[0].s0 == NULL && calls[1].s0 == NULL);
    kiln_optim_free(o);

    for (int withmom = 0; withmom < 2; withmom++) {
        c = config_of(KILN_OPTIM_RMSPROP, withmom ? 0.5f : 0.0f);
        c.weight_decay = 0.02f;
        c.eps = 1e-6f;
        CHECK_OK(kiln_optim_create(&o, &c, SLAB(N), r, 2, &rec_backend));
        ncalls = 0;
        CHECK_OK(kiln_optim_step(o, p, g, 0.1f));
        CHECK_INT_EQ(ncalls, 2);
        CHECK_STR_EQ(calls[1].kernel, "rmsprop");
        CHECK_TRUE(calls[1].s0 == kiln_optim_state(o, 0) + 8);
        CHECK_TRUE(withmom ? calls[1].s1 == kiln_optim_state(o, 1) + 8 : calls[1].s1 == NULL);
        CHECK_TRUE(calls[0].wd == 0.02f && calls[1].wd == 0.0f);
        CHECK_TRUE(calls[0].alpha == 0.99f && calls[0].eps == 1e-6f);
        CHECK_TRUE(calls[0].momentum == (withmom ? 0.5f : 0.0f));
        kiln_optim_free(o);
    }
}

static void test_step_validation(void) {
    enum { N = 8 };
    float p[N], g[N];
    kiln_optim_config c = kiln_optim_config_default();
    kiln_optim *o = NULL;
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(N), NULL, 0, &rec_backend));
    if (!o)
        return;
    const float bad[] = {-1e-3f, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        ncalls = 0;
        CHECK_STATUS(kiln_optim_step(o, p, g, bad[i]), KILN_ERR_CONFIG);
        CHECK_TRUE(strstr(kiln_error_message(), "learning rate") != NULL);
        CHECK_INT_EQ(ncalls, 0);
        CHECK_INT_EQ(kiln_optim_steps_taken(o), 0);
    }
    CHECK_STATUS(kiln_optim_step(o, NULL, g, 0.1f), KILN_ERR_ARG);
    CHECK_STATUS(kiln_optim_step(NULL, p, g, 0.1f), KILN_ERR_ARG);
    const float bad_scale[] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        ncalls = 0;
        CHECK_STATUS(kiln_optim_step_scaled(o, p, g, 0.1f, bad_scale[i]), KILN_ERR_CONFIG);
        CHECK_TRUE(strstr(kiln_error_message(), "gradient scale") != NULL);
        CHECK_INT_EQ(ncalls, 0);
    }
    /* no ranges given: one call over the whole slab, with decay */
    ncalls = 0;
    CHECK_OK(kiln_optim_step(o, p, g, 0.0f));
    CHECK_TRUE(ncalls == 1 && calls[0].n == N && calls[0].decoupled_wd == 0.1f);
    kiln_optim_free(o);
}

/* One AdamW step through the reference kernels, worked by hand: with m = v = 0,
 * mhat = g and vhat = g^2, so p' = p (1 - lr wd) - lr g / (|g| + eps). */
static void test_adamw_first_step_values(void) {
    float p[4] = {1.0f, -2.0f, 0.5f, 3.0f}, g[4] = {0.5f, -0.25f, 0.0f, 2.0f};
    kiln_param_range r[] = {{0, 2, 1}, {2, 2, 0}};
    kiln_optim_config c = kiln_optim_config_default();
    kiln_optim *o = NULL;
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(4), r, 2, kiln_backend_ref()));
    if (!o)
        return;
    CHECK_OK(kiln_optim_step(o, p, g, 0.01f));
    CHECK_NEAR(p[0], 1.0 * (1 - 0.001) - 0.01, 1e-6);
    CHECK_NEAR(p[1], -2.0 * (1 - 0.001) + 0.01, 1e-6);
    CHECK_NEAR(p[2], 0.5, 1e-7);
    CHECK_NEAR(p[3], 3.0 - 0.01, 1e-6);
    CHECK_NEAR(kiln_optim_state(o, 0)[3], 0.1 * 2.0, 1e-7);
    CHECK_NEAR(kiln_optim_state(o, 1)[3], 0.05 * 4.0, 1e-7);
    kiln_optim_free(o);
}

/* ---- master weights ---- */

/* A bf16 working slab with a range [lo, hi): each kernel call updates the master weights of
 * its part of the range and names the working copy at the same slab offset, with the
 * rounding seed of the step (nonzero and new each step when stochastic, 0 otherwise). */
static void test_master_calls(void) {
    enum { N = 40 };
    uint16_t work[N];
    float g[N];
    kiln_param_range r[] = {{0, 10, 1}, {10, 20, 0}, {30, 10, 1}};
    kiln_optim_config c = kiln_optim_config_default();
    for (int stochastic = 0; stochastic < 2; stochastic++) {
        kiln_optim_slab sl = {.n = N,
                              .lo = 5,
                              .hi = 35,
                              .work = KILN_DTYPE_BF16,
                              .stochastic_seed = stochastic ? 1234 : 0};
        kiln_optim *o = NULL;
        CHECK_OK(kiln_optim_create(&o, &c, &sl, r, 3, &rec_backend));
        if (!o)
            return;
        float *master = kiln_optim_master(o);
        CHECK_TRUE(master != NULL);
        CHECK_INT_EQ(kiln_optim_master_bytes(o), 30 * sizeof(float));
        CHECK_INT_EQ(kiln_optim_state_bytes(o), 3 * 30 * sizeof(float)); /* m, v, master */
        CHECK_INT_EQ(kiln_optim_state_bytes_for(&c, 30, KILN_DTYPE_BF16), 3 * 30 * sizeof(float));
        uint64_t seeds[2] = {0, 0};
        for (int t = 0; t < 2; t++) {
            ncalls = 0;
            CHECK_OK(kiln_optim_step(o, work, g, 0.1f));
            CHECK_INT_EQ(ncalls, 3);
            const int64_t off[] = {5, 10, 30}, cnt[] = {5, 20, 5};
            for (int i = 0; i < 3 && i < ncalls; i++) {
                call *k = &calls[i];
                CHECK_TRUE(k->has_w && k->w.dtype == KILN_DTYPE_BF16);
                CHECK_TRUE(k->p == master + (off[i] - 5));
                CHECK_TRUE(k->w.p == work + off[i]);
                CHECK_INT_EQ(k->w.index0, off[i]);
                CHECK_TRUE(k->g == g + off[i] && k->s0 == kiln_optim_state(o, 0) + (off[i] - 5));
                CHECK_INT_EQ(k->n, cnt[i]);
                CHECK_TRUE(k->w.round_seed == calls[0].w.round_seed); /* one seed per step */
            }
            seeds[t] = calls[0].w.round_seed;
        }
        if (stochastic)
            CHECK_TRUE(seeds[0] != 0 && seeds[1] != 0 && seeds[0] != seeds[1]);
        else
            CHECK_TRUE(seeds[0] == 0 && seeds[1] == 0);
        kiln_optim_free(o);
    }
    /* fp32 working weights keep no master */
    kiln_optim *o = NULL;
    CHECK_OK(kiln_optim_create(&o, &c, SLAB(N), NULL, 0, &rec_backend));
    CHECK_TRUE(o && kiln_optim_master(o) == NULL && kiln_optim_master_bytes(o) == 0);
    kiln_optim_free(o);
}

/* The slab of these tests, its ranges and where they are split: MW_SPLIT cuts the middle
 * range at an arbitrary point; MW_SPLIT16 cuts it 48 elements after the range's start. */
enum { MW_N = 10007, MW_SPLIT = 3050, MW_SPLIT16 = 3048 };
static const kiln_param_range mw_ranges[] = {{0, 3000, 1}, {3000, 100, 0}, {3100, 6907, 1}};

static float *mw_randn(uint64_t seed, float scale) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    float *x = malloc(MW_N * sizeof(float));
    for (int i = 0; i < MW_N; i++)
        x[i] = kiln_rng_normal(&r) * scale;
    return x;
}

/* An optimizer over [lo, hi) of the slab with bf16/fp16 working weights `work` (the whole
 * slab), its master weights initialised from init; three AdamW steps with the gradients
 * grads[0..2]. Returns the optimizer. */
static kiln_optim *mw_run(kiln_backend *be, kiln_dtype dt, uint64_t seed, int64_t lo, int64_t hi,
                          const float *init, float *const grads[3], void *work) {
    kiln_optim_config c = kiln_optim_config_default();
    kiln_optim_slab sl = {.n = MW_N, .lo = lo, .hi = hi, .work = dt, .stochastic_seed = seed};
    kiln_optim *o = NULL;
    CHECK_OK(kiln_optim_create(&o, &c, &sl, mw_ranges, 3, be));
    if (!o)
        return NULL;
    memcpy(kiln_optim_master(o), init + lo, (size_t)(hi - lo) * sizeof(float));
    CHECK_OK(kiln_optim_write_working(o, work));
    for (int t = 0; t < 3; t++)
        CHECK_OK(kiln_optim_step(o, work, grads[t], 1e-2f));
    return o;
}

/* The working weights are the master weights rounded (to nearest even; fp16 too), after the
 * first write and after every step; read_working widens them back. */
static void check_master_nearest(kiln_backend *be, kiln_dtype dt) {
    float *init = mw_randn(1, 0.05f), *g[3] = {mw_randn(2, 1), mw_randn(3, 1), mw_randn(4, 1)};
    uint16_t *work = malloc(MW_N * sizeof(uint16_t)), *want = malloc(MW_N * sizeof(uint16_t));
    kiln_optim_config c = kiln_optim_config_default();
    kiln_optim_slab sl = {.n = MW_N, .work = dt};
    kiln_optim *o = NULL;
    CHECK_OK(kiln_optim_create(&o, &c, &sl, mw_ranges, 3, be));
    if (!o)
        return;
    float *master = kiln_optim_master(o);
    memcpy(master, init, MW_N * sizeof(float));
    CHECK_OK(kiln_optim_write_working(o, work));
    kiln_convert(want, dt, init, KILN_DTYPE_F32, MW_N);
    CHECK_TRUE(memcmp(work, want, MW_N * sizeof(uint16_t)) == 0);
    int bad = 0, moved = 0;
    for (int t = 0; t < 3; t++) {
        uint16_t before = work[17];
        CHECK_OK(kiln_optim_step(o, work, g[t], 1e-2f));
        kiln_convert(want, dt, master, KILN_DTYPE_F32, MW_N);
        bad += memcmp(work, want, MW_N * sizeof(uint16_t)) != 0;
        moved += work[17] != before;
    }
    CHECK_INT_EQ(bad, 0);
    CHECK_TRUE(moved > 0); /* lr 1e-2 moves a weight of 0.05 by more than a bf16 ulp */
    /* read_working: a fresh optimizer's master = the working weights widened */
    kiln_optim *r = NULL;
    CHECK_OK(kiln_optim_create(&r, &c, &sl, NULL, 0, be));
    if (r) {
        CHECK_OK(kiln_optim_read_working(r, work));
        float *wide = malloc(MW_N * sizeof(float));
        kiln_convert(wide, KILN_DTYPE_F32, work, dt, MW_N);
        CHECK_TRUE(memcmp(kiln_optim_master(r), wide, MW_N * sizeof(float)) == 0);
        free(wide);
    }
    kiln_optim_free(r);
    kiln_optim_free(o);
    free(init), free(g[0]), free(g[1]), free(g[2]), free(work), free(want);
}

/* Largest difference between two arrays of bf16 values of the same signs, in ulps. */
static int64_t max_ulps_bf16(const uint16_t *a, const uint16_t *b, int64_t n) {
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t d = (int64_t)(int16_t)a[i] - (int64_t)(int16_t)b[i];
        worst = llabs(d) > worst ? llabs(d) : worst;
    }
    return worst;
}

/* Ranges [0, k) and [k, n) as two optimizers (ZeRO shards) give the whole-slab optimizer's
 * master weights, moments and working weights bit for bit (ulps = 0); each touches only its
 * range. Stochastic rounding: every working weight is one of the two bf16 neighbours of its
 * master weight, some are not the nearest, and the result is the same for the split and for
 * 1 and 2 threads. (The CPU backend's vector bodies and scalar tails round alike, so this
 * holds at any split, 16-aligned or not; exact == 0 would allow fp32 rounding between the
 * two.) */
static void check_master_ranges(kiln_backend *be, uint64_t seed, int64_t split, int exact) {
    float *init = mw_randn(5, 0.05f), *g[3] = {mw_randn(6, 1), mw_randn(7, 1), mw_randn(8, 1)};
    uint16_t *whole = calloc(MW_N, sizeof(uint16_t)), *parts = calloc(MW_N, sizeof(uint16_t));
    uint16_t *one_thread = calloc(MW_N, sizeof(uint16_t));
    int threads = omp_get_max_threads();
    omp_set_num_threads(2);
    kiln_optim *w = mw_run(be, KILN_DTYPE_BF16, seed, 0, MW_N, init, g, whole);
    kiln_optim *a = mw_run(be, KILN_DTYPE_BF16, seed, 0, split, init, g, parts);
    /* a alone: [k, n) of the working weights is still as calloc left it */
    int untouched = 1;
    for (int64_t i = split; i < MW_N; i++)
        untouched &= parts[i] == 0;
    CHECK_TRUE(untouched);
    kiln_optim *b = mw_run(be, KILN_DTYPE_BF16, seed, split, MW_N, init, g, parts);
    omp_set_num_threads(1);
    kiln_optim *w1 = mw_run(be, KILN_DTYPE_BF16, seed, 0, MW_N, init, g, one_thread);
    omp_set_num_threads(threads);
    if (!w || !a || !b || !w1)
        goto done;
    /* threads: always the same bits */
    CHECK_TRUE(memcmp(whole, one_thread, MW_N * sizeof(uint16_t)) == 0);
    CHECK_TRUE(memcmp(kiln_optim_master(w), kiln_optim_master(w1), MW_N * sizeof(float)) == 0);
    /* the split */
    CHECK_INT_EQ(max_ulps_bf16(whole, parts, MW_N) > (exact ? 0 : 1), 0);
    const float *mw = kiln_optim_master(w);
    double tol = exact ? 0.0 : 1e-6;
    CHECK_TRUE(test_rel_err(kiln_optim_master(a), mw, split) <= tol);
    CHECK_TRUE(test_rel_err(kiln_optim_master(b), mw + split, MW_N - split) <= tol);
    for (int s = 0; s < 2; s++) {
        const float *sw = kiln_optim_state(w, s);
        CHECK_TRUE(test_rel_err(kiln_optim_state(a, s), sw, split) <= tol);
        CHECK_TRUE(test_rel_err(kiln_optim_state(b, s), sw + split, MW_N - split) <= tol);
    }
    int not_neighbour = 0, not_nearest = 0;
    for (int i = 0; i < MW_N; i++) {
        uint32_t u;
        memcpy(&u, &mw[i], sizeof u);
        uint16_t down = (uint16_t)(u >> 16); /* toward zero */
        uint16_t up = (u & 0xffffu) ? (uint16_t)(down + 1) : down;
        not_neighbour += whole[i] != down && whole[i] != up;
        not_nearest += whole[i] != kiln_f32_to_bf16(mw[i]);
    }
    CHECK_INT_EQ(not_neighbour, 0);
    if (seed)
        CHECK_TRUE(not_nearest > MW_N / 8); /* about 1/4 of them for uniform fractions */
    else
        CHECK_INT_EQ(not_nearest, 0);
done:
    kiln_optim_free(w), kiln_optim_free(a), kiln_optim_free(b), kiln_optim_free(w1);
    free(init), free(g[0]), free(g[1]), free(g[2]), free(whole), free(parts), free(one_thread);
}

static void test_master_weights(void) {
    kiln_backend *bes[2] = {kiln_backend_ref(), kiln_backend_cpu()};
    for (int i = 0; i < 2; i++) {
        int before = test_failures;
        check_master_nearest(bes[i], KILN_DTYPE_BF16);
        check_master_nearest(bes[i], KILN_DTYPE_F16);
        /* exact on both backends at any split */
        for (int k = 0; k < 2; k++) {
            uint64_t seed = k ? 0x5eed : 0;
            check_master_ranges(bes[i], seed, MW_SPLIT, 1);
            check_master_ranges(bes[i], seed, MW_SPLIT16, 1);
        }
        if (test_failures != before)
            fprintf(stderr, "  (on the %s backend)\n", bes[i]->name);
    }
}

/* An fp32 slab optimizer over [lo, hi) updates its range in place, exactly as the
 * whole-slab optimizer does there, and nothing outside it. */
static void test_range_fp32(void) {
    float *init = mw_randn(9, 0.05f), *g = mw_randn(10, 1);
    float *whole = malloc(MW_N * sizeof(float)), *part = malloc(MW_N * sizeof(float));
    memcpy(whole, init, MW_N * sizeof(float));
    memcpy(part, init, MW_N * sizeof(float));
    kiln_optim_config c = kiln_optim_config_default();
    /* [1008, MW_SPLIT16): both ends 16-aligned with their ranges (see check_master_ranges) */
    kiln_optim_slab all = {.n = MW_N}, mine = {.n = MW_N, .lo = 1008, .hi = MW_SPLIT16};
    kiln_optim *w = NULL, *p = NULL;
    CHECK_OK(kiln_optim_create(&w, &c, &all, mw_ranges, 3, kiln_backend_cpu()));
    CHECK_OK(kiln_optim_create(&p, &c, &mine, mw_ranges, 3, kiln_backend_cpu()));
    if (w && p) {
        CHECK_TRUE(kiln_optim_master(p) == NULL);
        CHECK_INT_EQ(kiln_optim_state_bytes(p), 2 * (MW_SPLIT16 - 1008) * sizeof(float));
        for (int t = 0; t < 2; t++) {
            CHECK_OK(kiln_optim_step(w, whole, g, 1e-2f));
            CHECK_OK(kiln_optim_step(p, part, g, 1e-2f));
        }
        CHECK_TRUE(memcmp(part, init, 1008 * sizeof(float)) == 0);
        CHECK_TRUE(memcmp(part + 1008, whole + 1008, (MW_SPLIT16 - 1008) * sizeof(float)) == 0);
        CHECK_TRUE(
            memcmp(part + MW_SPLIT16, init + MW_SPLIT16, (MW_N - MW_SPLIT16) * sizeof(float)) == 0);
        CHECK_TRUE(memcmp(part + 1008, init + 1008, sizeof(float)) != 0); /* it did move */
    }
    kiln_optim_free(w), kiln_optim_free(p);
    /* a range outside the slab */
    kiln_optim_slab bad = {.n = 10, .lo = 4, .hi = 11};
    CHECK_STATUS(kiln_optim_create(&w, &c, &bad, NULL, 0, kiln_backend_cpu()), KILN_ERR_ARG);
    bad = (kiln_optim_slab){.n = 10, .lo = 6, .hi = 4};
    CHECK_STATUS(kiln_optim_create(&w, &c, &bad, NULL, 0, kiln_backend_cpu()), KILN_ERR_ARG);
    free(init), free(g), free(whole), free(part);
}

/* ---- dynamic loss scaling ---- */
static void test_loss_scaler(void) {
    kiln_loss_scaler s = kiln_loss_scaler_default();
    CHECK_TRUE(s.scale == 65536.0f && s.growth == 2.0f && s.backoff == 0.5f);
    CHECK_INT_EQ(s.interval, 2000);
    CHECK_TRUE(s.min_scale == 0x1p-14f);
    CHECK_INT_EQ(s.clean_steps, 0);
    CHECK_INT_EQ(s.skipped, 0);
    s.interval = 3;
    /* growth after `interval` clean steps in a row */
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_TRUE(s.scale == 65536.0f);
    CHECK_INT_EQ(s.clean_steps, 2);
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_TRUE(s.scale == 131072.0f);
    CHECK_INT_EQ(s.clean_steps, 0);
    /* an overflow: skipped, backed off, and the clean count starts again */
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_OK(kiln_loss_scaler_update(&s, 0));
    CHECK_TRUE(s.scale == 65536.0f);
    CHECK_INT_EQ(s.skipped, 1);
    CHECK_INT_EQ(s.clean_steps, 0);
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_TRUE(s.scale == 65536.0f); /* two since the overflow: not yet */
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_TRUE(s.scale == 131072.0f);
    /* growth stops short of infinity */
    s.scale = 0x1p127f;
    s.clean_steps = 2;
    CHECK_OK(kiln_loss_scaler_update(&s, 1));
    CHECK_TRUE(s.scale == 0x1p127f);
    /* below min_scale the run cannot go on: an error saying so */
    s = kiln_loss_scaler_default();
    s.scale = 4.0f;
    s.min_scale = 2.0f;
    CHECK_OK(kiln_loss_scaler_update(&s, 0));
    CHECK_TRUE(s.scale == 2.0f); /* at the minimum is still allowed */
    CHECK_STATUS(kiln_loss_scaler_update(&s, 0), KILN_ERR_RANGE);
    CHECK_TRUE(s.scale == 1.0f);
    CHECK_INT_EQ(s.skipped, 2);
    CHECK_TRUE(strstr(kiln_error_message(), "loss scale") != NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "2 steps skipped") != NULL);
}

/* ---- schedules ---- */
static void test_schedules(void) {
    kiln_lr_schedule s = {.kind = KILN_LR_CONSTANT,
                          .lr = 6e-4f,
                          .min_lr = 6e-5f,
                          .warmup_steps = 0,
                          .total_steps = 100};
    CHECK_OK(kiln_lr_schedule_check(&s));
    CHECK_TRUE(kiln_lr_at(&s, 0) == 6e-4f && kiln_lr_at(&s, 1000) == 6e-4f);
    s.warmup_steps = 4;
    CHECK_TRUE(kiln_lr_at(&s, 0) == (float)(6e-4f * 0.25));
    CHECK_TRUE(kiln_lr_at(&s, 3) == 6e-4f);
    CHECK_TRUE(kiln_lr_at(&s, 500) == 6e-4f);

    s = (kiln_lr_schedule){
        .kind = KILN_LR_COSINE, .lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .total_steps = 110};
    CHECK_TRUE(kiln_lr_at(&s, -5) == 0.1f); /* negative steps count as step 0 */
    CHECK_TRUE(kiln_lr_at(&s, 0) == 0.1f);
    CHECK_TRUE(kiln_lr_at(&s, 4) == 0.5f);
    CHECK_TRUE(kiln_lr_at(&s, 9) == 1.0f);
    CHECK_TRUE(kiln_lr_at(&s, 10) == 1.0f);
    CHECK_NEAR(kiln_lr_at(&s, 60), 0.55, 1e-7); /* halfway: the mean of lr and min_lr */
    CHECK_NEAR(kiln_lr_at(&s, 35), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-7);
    CHECK_TRUE(kiln_lr_at(&s, 109) > 0.1f && kiln_lr_at(&s, 109) < 0.1003f);
    CHECK_TRUE(kiln_lr_at(&s, 110) == 0.1f);
    CHECK_TRUE(kiln_lr_at(&s, 1000000) == 0.1f);
    float prev = 2.0f; /* non-increasing after the warmup */
    int monotone = 1;
    for (int64_t t = 10; t <= 120; t++) {
        monotone &= kiln_lr_at(&s, t) <= prev;
        prev = kiln_lr_at(&s, t);
    }
    CHECK_TRUE(monotone);

    s.kind = KILN_LR_LINEAR;
    CHECK_TRUE(kiln_lr_at(&s, 4) == 0.5f);
    CHECK_TRUE(kiln_lr_at(&s, 10) == 1.0f);
    CHECK_NEAR(kiln_lr_at(&s, 35), 1.0 - 0.9 * 0.25, 1e-7);
    CHECK_NEAR(kiln_lr_at(&s, 60), 0.55, 1e-7);
    CHECK_TRUE(kiln_lr_at(&s, 110) == 0.1f && kiln_lr_at(&s, 111) == 0.1f);

    /* no warmup: the decay starts at lr on step 0 */
    s.warmup_steps = 0;
    s.total_steps = 4;
    CHECK_TRUE(kiln_lr_at(&s, 0) == 1.0f);
    CHECK_NEAR(kiln_lr_at(&s, 2), 0.55, 1e-7);
    CHECK_TRUE(kiln_lr_at(&s, 4) == 0.1f);

    /* total_steps <= warmup_steps: warm up, then min_lr (no division by zero) */
    for (int k = KILN_LR_COSINE; k <= KILN_LR_LINEAR; k++) {
        s = (kiln_lr_schedule){.kind = (kiln_lr_kind)k,
                               .lr = 1.0f,
                               .min_lr = 0.1f,
                               .warmup_steps = 10,
                               .total_steps = 5};
        CHECK_TRUE(kiln_lr_at(&s, 4) == 0.5f);
        CHECK_TRUE(kiln_lr_at(&s, 9) == 1.0f);
        CHECK_TRUE(kiln_lr_at(&s, 10) == 0.1f && kiln_lr_at(&s, 50) == 0.1f);
        s.total_steps = 10;
        CHECK_TRUE(kiln_lr_at(&s, 10) == 0.1f);
        s.total_steps = 0;
        s.warmup_steps = 0;
        CHECK_TRUE(kiln_lr_at(&s, 0) == 0.1f);
        CHECK_TRUE(isfinite(kiln_lr_at(&s, 3)));
    }
    CHECK_TRUE(kiln_lr_at(NULL, 3) == 0.0f);

    kiln_lr_schedule bad = {
        .kind = KILN_LR_COSINE, .lr = 1.0f, .min_lr = 2.0f, .warmup_steps = 1, .total_steps = 10};
    CHECK_STATUS(kiln_lr_schedule_check(&bad), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "min_lr") != NULL);
    bad.min_lr = 0.0f;
    bad.lr = NAN;
    CHECK_STATUS(kiln_lr_schedule_check(&bad), KILN_ERR_CONFIG);
    bad.lr = 1.0f;
    bad.warmup_steps = -1;
    CHECK_STATUS(kiln_lr_schedule_check(&bad), KILN_ERR_CONFIG);
    bad.warmup_steps = 0;
    bad.kind = (kiln_lr_kind)7;
    CHECK_STATUS(kiln_lr_schedule_check(&bad), KILN_ERR_CONFIG);
    bad.kind = KILN_LR_LINEAR;
    CHECK_OK(kiln_lr_schedule_check(&bad));
}

/* ---- clipping ---- */
static void test_clip(void) {
    kiln_backend *be = kiln_backend_ref();
    float g[4] = {3.0f, 0.0f, -4.0f, 0.0f};
    CHECK_NEAR(kiln_clip_grad_norm(be, g, 4, 10.0f), 5.0, 1e-7);
    CHECK_TRUE(g[0] == 3.0f && g[2] == -4.0f); /* under the limit: untouched */
    CHECK_NEAR(kiln_clip_grad_norm(be, g, 4, 0.0f), 5.0, 1e-7);
    CHECK_TRUE(g[0] == 3.0f); /* max_norm 0: no clipping */
    CHECK_NEAR(kiln_clip_grad_norm(be, g, 4, 5.0f), 5.0, 1e-7);
    /* norm == max_norm: coef 5/(5+1e-6) < 1 scales, by a hair, as PyTorch does */
    CHECK_TRUE(g[0] < 3.0f && g[0] > 2.9999f);
    g[0] = 3.0f;
    g[2] = -4.0f;
    CHECK_NEAR(kiln_clip_grad_norm(be, g, 4, 1.0f), 5.0, 1e-7);
    CHECK_NEAR(g[0], 3.0 / (5.0 + 1e-6), 1e-7);
    CHECK_NEAR(g[2], -4.0 / (5.0 + 1e-6), 1e-7);
    CHECK_NEAR(sqrt(g[0] * g[0] + g[2] * g[2]), 1.0, 1e-6);
    CHECK_TRUE(g[1] == 0.0f && g[3] == 0.0f);

    /* a sum of squares that overflows float is still exact enough in double */
    float big[2] = {3e20f, 4e20f};
    CHECK_NEAR(kiln_clip_grad_norm(be, big, 2, 1.0f), 5e20, 1e-6);
    CHECK_NEAR(big[1], 0.8, 1e-6);

    float bad[3] = {1.0f, NAN, 2.0f};
    CHECK_TRUE(isnan(kiln_clip_grad_norm(be, bad, 3, 1.0f)));
    CHECK_TRUE(bad[0] == 1.0f && bad[2] == 2.0f); /* left for the caller to skip */
    float inf[2] = {INFINITY, 1.0f};
    CHECK_TRUE(isinf(kiln_clip_grad_norm(be, inf, 2, 1.0f)));
    CHECK_TRUE(inf[1] == 1.0f);
    CHECK_TRUE(kiln_clip_grad_norm(be, g, 0, 1.0f) == 0.0f);
    CHECK_TRUE(isnan(kiln_clip_grad_norm(NULL, g, 4, 1.0f)));
}

int main(void) {
    RUN_TEST(test_defaults_and_names);
    RUN_TEST(test_config_validation);
    RUN_TEST(test_state_slabs);
    RUN_TEST(test_bad_ranges);
    RUN_TEST(test_adamw_calls);
    RUN_TEST(test_adam_sgd_rmsprop_calls);
    RUN_TEST(test_step_validation);
    RUN_TEST(test_adamw_first_step_values);
    RUN_TEST(test_master_calls);
    RUN_TEST(test_master_weights);
    RUN_TEST(test_range_fp32);
    RUN_TEST(test_loss_scaler);
    RUN_TEST(test_schedules);
    RUN_TEST(test_clip);
    TEST_MAIN_END();
}
