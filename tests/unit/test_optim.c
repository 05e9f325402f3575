/* Optimizers: config checks, moment slabs, ranges and the arguments each update kernel
 * receives (through a recording backend), schedules, gradient clipping. */
#include <math.h>
#include <stdint.h>

#include "kiln/backend.h"
#include "kiln/core.h"
#include "kiln/optim.h"
#include "test.h"

/* ---- a backend that records the optimizer kernel calls it gets ---- */
typedef struct call {
    const char *kernel;
    float *p;
    const float *g;
    float *s0, *s1;
    int64_t n;
    float lr, b1, b2, bc1, bc2, eps, decoupled_wd, l2_wd;
    float momentum, dampening, alpha, wd;
    int nesterov, first;
} call;

static call calls[64];
static int ncalls;

static call *record(const char *kernel) {
    call *c = &calls[ncalls < 63 ? ncalls++ : 63];
    memset(c, 0, sizeof *c);
    c->kernel = kernel;
    return c;
}

static void rec_adam(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                     float b2, float bc1, float bc2, float eps, float decoupled_wd, float l2_wd) {
    call *c = record("adam");
    *c = (call){.kernel = "adam",
                .p = p,
                .g = g,
                .s0 = m,
                .s1 = v,
                .n = n,
                .lr = lr,
                .b1 = b1,
                .b2 = b2,
                .bc1 = bc1,
                .bc2 = bc2,
                .eps = eps,
                .decoupled_wd = decoupled_wd,
                .l2_wd = l2_wd};
}

static void rec_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                    float dampening, int nesterov, float wd, int first) {
    call *c = record("sgd");
    *c = (call){.kernel = "sgd",
                .p = p,
                .g = g,
                .s0 = buf,
                .n = n,
                .lr = lr,
                .momentum = momentum,
                .dampening = dampening,
                .nesterov = nesterov,
                .wd = wd,
                .first = first};
}

static void rec_rmsprop(float *p, const float *g, float *sq, float *buf, int64_t n, float lr,
                        float alpha, float eps, float wd, float momentum) {
    call *c = record("rmsprop");
    *c = (call){.kernel = "rmsprop",
                .p = p,
                .g = g,
                .s0 = sq,
                .s1 = buf,
                .n = n,
                .lr = lr,
                .alpha = alpha,
                .eps = eps,
                .wd = wd,
                .momentum = momentum};
}

static const kiln_backend rec_backend = {
    .name = "recording",
    .adam_update = rec_adam,
    .sgd_update = rec_sgd,
    .rmsprop_update = rec_rmsprop,
};

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
        CHECK_STATUS(kiln_optim_create(&o_, &c_, 8, NULL, 0, &rec_backend), KILN_ERR_CONFIG);      \
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
    CHECK_OK(kiln_optim_create(&o, &c, n, NULL, 0, &rec_backend));
    if (!o)
        return;
    float *s0 = kiln_optim_state(o, 0), *s1 = kiln_optim_state(o, 1);
    CHECK_INT_EQ(s0 != NULL, want0);
    CHECK_INT_EQ(s1 != NULL, want1);
    CHECK_TRUE(!s0 || all_zero(s0, n));
    CHECK_TRUE(!s1 || all_zero(s1, n));
    size_t want_bytes = (size_t)(want0 + want1) * (size_t)n * sizeof(float);
    CHECK_INT_EQ(kiln_optim_state_bytes(o), want_bytes);
    CHECK_INT_EQ(kiln_optim_state_bytes_for(&c, n), want_bytes); /* the plan, before creating */
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
    CHECK_STATUS(kiln_optim_create(&o, &c, 1000, NULL, 0, &rec_backend), KILN_ERR_NOMEM);
    CHECK_TRUE(strstr(kiln_error_message(), "optimizer moment slab 1") != NULL);
    CHECK_TRUE(o == NULL);
    kiln_alloc_set_limit(0);
    CHECK_INT_EQ(kiln_alloc_current(), before);

    /* a backend without the kernel this kind needs */
    kiln_backend partial = rec_backend;
    partial.rmsprop_update = NULL;
    c.kind = KILN_OPTIM_RMSPROP;
    CHECK_STATUS(kiln_optim_create(&o, &c, 10, NULL, 0, &partial), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "rmsprop_update") != NULL);
    CHECK_STATUS(kiln_optim_create(&o, &c, 10, NULL, 0, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_optim_create(&o, &c, -1, NULL, 0, &rec_backend), KILN_ERR_ARG);
}

static void test_bad_ranges(void) {
    kiln_optim_config c = kiln_optim_config_default();
    kiln_optim *o = NULL;
    size_t before = kiln_alloc_current();
    kiln_param_range outside[] = {{0, 10, 1}, {10, 11, 0}};
    CHECK_STATUS(kiln_optim_create(&o, &c, 20, outside, 2, &rec_backend), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "range 1") != NULL);
    kiln_param_range negative[] = {{-1, 2, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, 20, negative, 1, &rec_backend), KILN_ERR_ARG);
    kiln_param_range neg_numel[] = {{3, -2, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, 20, neg_numel, 1, &rec_backend), KILN_ERR_ARG);
    kiln_param_range huge[] = {{5, INT64_MAX, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, 20, huge, 1, &rec_backend), KILN_ERR_ARG);
    kiln_param_range overlap[] = {{10, 5, 1}, {0, 4, 0}, {3, 4, 1}};
    CHECK_STATUS(kiln_optim_create(&o, &c, 20, overlap, 3, &rec_backend), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "ranges 1 and 2 overlap at offset 3") != NULL);
    CHECK_STATUS(kiln_optim_create(&o, &c, 20, NULL, 2, &rec_backend), KILN_ERR_ARG);
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
    CHECK_OK(kiln_optim_create(&o, &c, N, r, 5, &rec_backend));
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
        }
    }
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
    CHECK_OK(kiln_optim_create(&o, &c, N, r, 2, &rec_backend));
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
    CHECK_OK(kiln_optim_create(&o, &c, N, r, 2, &rec_backend));
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
    CHECK_OK(kiln_optim_create(&o, &c, N, r, 2, &rec_backend));
    ncalls = 0;
    CHECK_OK(kiln_optim_step(o, p, g, 0.1f));
    CHECK_TRUE(ncalls == 2 && calls[0].s0 == NULL && calls[1].s0 == NULL);
    kiln_optim_free(o);

    for (int withmom = 0; withmom < 2; withmom++) {
        c = config_of(KILN_OPTIM_RMSPROP, withmom ? 0.5f : 0.0f);
        c.weight_decay = 0.02f;
        c.eps = 1e-6f;
        CHECK_OK(kiln_optim_create(&o, &c, N, r, 2, &rec_backend));
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
    CHECK_OK(kiln_optim_create(&o, &c, N, NULL, 0, &rec_backend));
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
    CHECK_OK(kiln_optim_create(&o, &c, 4, r, 2, kiln_backend_ref()));
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
    const kiln_backend *be = kiln_backend_ref();
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
    RUN_TEST(test_schedules);
    RUN_TEST(test_clip);
    TEST_MAIN_END();
}
