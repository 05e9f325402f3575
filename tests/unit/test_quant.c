/* Post-training quantization: the rounding of a matrix and its bounds, the int8 kernel (VNNI
 * where this CPU has it, and the plain one) against a reference written here from the
 * definition (exact integer sums, then the same float steps: the same bits), the kernel
 * against the fp32 product within the quantization's error bound, and a quantized model's
 * logits against the dense model's. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemm_int8.h"
#include "kiln/checkpoint.h"
#include "kiln/compress.h"
#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/safetensors.h"
#include "test.h"

static void fill_normal(float *x, int64_t n, float sd, uint64_t seed) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        x[i] = sd * kiln_rng_normal(&r);
}

/* ---- one matrix ---- */

static void test_int8_bounds(void) {
    const int64_t K = 70, N = 9;
    float *w = malloc(sizeof(float) * K * N), *wt = malloc(sizeof(float) * K * N);
    float *back = malloc(sizeof(float) * K * N), scale[9], scale_t[9];
    int8_t *q = malloc((size_t)(K * N)), *qt = malloc((size_t)(K * N));
    fill_normal(w, K * N, 0.05f, 1);
    for (int64_t k = 0; k < K; k++)
        w[k * N + 3] = 0.0f; /* a channel of zeros */
    w[5 * N + 7] = -1.5f;    /* a channel whose largest value is negative */
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++)
            wt[n * K + k] = w[k * N + n];
    kiln_quant_int8(q, scale, w, K, N, 0);
    kiln_quant_int8(qt, scale_t, wt, K, N, 1);
    CHECK_TRUE(memcmp(q, qt, (size_t)(K * N)) == 0); /* (in,out) and (out,in) agree */
    CHECK_TRUE(memcmp(scale, scale_t, sizeof scale) == 0);
    kiln_dequant_int8(back, q, scale, N, K);
    int worst = 0;
    for (int64_t n = 0; n < N; n++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(w[k * N + n]));
        CHECK_TRUE(scale[n] == amax / 127.0f);
        for (int64_t k = 0; k < K; k++) {
            int v = q[n * K + k];
            float err = fabsf(back[n * K + k] - w[k * N + n]);
            if (v < -127 || v > 127 || err > scale[n] * 0.5f * (1.0f + 1e-6f) + 1e-12f)
                worst++;
        }
    }
    CHECK_INT_EQ(worst, 0);
    CHECK_TRUE(scale[3] == 0.0f && q[3 * K] == 0 && back[3 * K + 10] == 0.0f);
    CHECK_INT_EQ(q[7 * K + 5], -127); /* the largest value maps to the end of the range */
    free(w), free(wt), free(back), free(q), free(qt);
}

static void test_int4_bounds(void) {
    const int64_t K = 64, N = 5, G = 16, groups = K / G;
    float *w = malloc(sizeof(float) * K * N), *back = malloc(sizeof(float) * K * N);
    float scale[5 * 4];
    uint8_t *q = malloc((size_t)(K * N / 2));
    fill_normal(w, K * N, 0.1f, 2);
    CHECK_OK(kiln_quant_int4(q, scale, w, K, N, G, 0));
    kiln_dequant_int4(back, q, scale, N, K, G);
    int worst = 0, bad_nibble = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < groups; g++) {
            float amax = 0.0f;
            for (int64_t k = g * G; k < (g + 1) * G; k++)
                amax = fmaxf(amax, fabsf(w[k * N + n]));
            CHECK_TRUE(scale[n * groups + g] == amax / 7.0f);
            for (int64_t k = g * G; k < (g + 1) * G; k++) {
                int v = (q[n * K / 2 + k / 2] >> (4 * (k % 2))) & 15;
                bad_nibble += v < 1 || v > 15; /* -7..7, stored + 8 */
                if (fabsf(back[n * K + k] - w[k * N + n]) >
                    scale[n * groups + g] * 0.5f * (1.0f + 1e-6f) + 1e-12f)
                    worst++;
            }
        }
    CHECK_INT_EQ(worst, 0);
    CHECK_INT_EQ(bad_nibble, 0);
    /* groups that do not divide the inputs, or are not a multiple of 8 */
    CHECK_STATUS(kiln_quant_int4(q, scale, w, K, N, 24, 0), KILN_ERR_ARG);
    CHECK_STATUS(kiln_quant_int4(q, scale, w, K, N, 4, 0), KILN_ERR_ARG);
    kiln_quant_type t;
    CHECK_STATUS(kiln_quant_type_parse("int3", &t), KILN_ERR_ARG);
    CHECK_OK(kiln_quant_type_parse("int4", &t));
    CHECK_INT_EQ(t, KILN_QUANT_INT4);
    free(w), free(back), free(q);
}

/* ---- the kernel ---- */

/* The reference, from the definition: rows quantized to [-127, 127] with max|x| / 127,
 * exact sums in int64 per group, then the kernel's float steps. q8 (N,K) int8 or q4 (N,K/2). */
static void reference(float *out, const float *x, const int8_t *q8, const uint8_t *q4,
                      const float *sw, const float *bias, int64_t M, int64_t N, int64_t K,
                      int64_t G, int8_t *xq_out) {
    int64_t groups = G ? K / G : 1, g_len = G ? G : K;
    int8_t *xq = malloc((size_t)K);
    for (int64_t m = 0; m < M; m++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(x[m * K + k]));
        float inv = 127.0f / amax, sa = amax / 127.0f;
        for (int64_t k = 0; k < K; k++)
            xq[k] =
                amax > 0.0f ? (int8_t)fmaxf(-127.0f, fminf(127.0f, rintf(x[m * K + k] * inv))) : 0;
        if (xq_out)
            memcpy(xq_out + m * K, xq, (size_t)K);
        for (int64_t n = 0; n < N; n++) {
            float f = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                int64_t dot = 0;
                for (int64_t k = g * g_len; k < (g + 1) * g_len; k++) {
                    int wv =
                        q8 ? q8[n * K + k] : ((q4[n * K / 2 + k / 2] >> (4 * (k % 2))) & 15) - 8;
                    dot += (int64_t)wv * xq[k];
                }
                f = fmaf((float)dot, sw[n * groups + g], f);
            }
            out[m * N + n] = fmaf(f, sa, bias ? bias[n] : 0.0f);
        }
    }
    free(xq);
}

typedef struct shape {
    int64_t M, N, K, G; /* G 0: int8 */
} shape;

/* Both kernels against the reference (bit for bit) and against the fp32 product (within the
 * bound the two roundings allow). */
static void check_shape(shape sh, uint64_t seed) {
    int64_t M = sh.M, N = sh.N, K = sh.K, G = sh.G, groups = G ? K / G : 1;
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * K * N);
    float *bias = malloc(sizeof(float) * N), *sw = malloc(sizeof(float) * N * groups);
    float *ref = malloc(sizeof(float) * M * N), *out = malloc(sizeof(float) * M * N);
    int8_t *q8 = malloc((size_t)(N * K)), *xq = malloc((size_t)(M * K));
    uint8_t *q4 = malloc((size_t)(N * K / 2 + 1));
    fill_normal(x, M * K, 1.0f, seed);
    fill_normal(w, K * N, 0.05f, seed + 1);
    fill_normal(bias, N, 0.1f, seed + 2);
    x[0] = 40.0f; /* an outlier: row 0 is quantized coarsely */
    if (G)
        CHECK_OK(kiln_quant_int4(q4, sw, w, K, N, G, 0));
    else
        kiln_quant_int8(q8, sw, w, K, N, 0);
    reference(ref, x, G ? NULL : q8, G ? q4 : NULL, sw, bias, M, N, K, G, xq);
    kiln__qmat pm;
    kiln__qact act;
    kiln__qws ws = {0};
    CHECK_OK(
        kiln__qmat_pack(&pm, G ? (const void *)q4 : (const void *)q8, sw, N, N, K, G ? 4 : 8, G));
    CHECK_OK(kiln__qact_init(&act, M, pm.Kp, pm.groups));
    if (G)
        CHECK_OK(kiln__qws_init(&ws, pm.Kp, 4));
    int kernels = kiln__qgemm_has_vnni() ? 2 : 1;
    for (int vnni = 0; vnni < kernels; vnni++) {
        int prev = kiln__qgemm_use_vnni(vnni);
        memset(out, 0xff, sizeof(float) * M * N);
        kiln__qgemm(out, N, x, &pm, bias, M, &act, G ? &ws : NULL);
        kiln__qgemm_use_vnni(prev);
        int same_q = 1, same_out = memcmp(out, ref, sizeof(float) * M * N) == 0;
        for (int64_t m = 0; m < M; m++)
            same_q &= memcmp(act.q + m * pm.Kp, xq + m * K, (size_t)K) == 0;
        if (!same_out || !same_q)
            fprintf(stderr, "M %lld N %lld K %lld G %lld, %s kernel: %s differ\n", (long long)M,
                    (long long)N, (long long)K, (long long)G, vnni ? "vnni" : "plain",
                    same_q ? "outputs" : "quantized activations");
        CHECK_TRUE(same_q);
        CHECK_TRUE(same_out);
    }
    /* against fp32: |x.w - xq.wq| <= sum |x| |w - wq| + |x - xq| |wq|, each term bounded by
     * half a step of its scale */
    int outside = 0;
    for (int64_t m = 0; m < M; m++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(x[m * K + k]));
        double sa = amax / 127.0;
        for (int64_t n = 0; n < N; n++) {
            double exact = bias[n], bound = 1e-5;
            for (int64_t k = 0; k < K; k++) {
                double s = sw[n * groups + (G ? k / G : 0)];
                exact += (double)x[m * K + k] * w[k * N + n];
                bound += fabs(x[m * K + k]) * s / 2 + sa / 2 * (fabs(w[k * N + n]) + s / 2);
            }
            outside += fabs(out[m * N + n] - exact) > bound * 1.001;
        }
    }
    CHECK_INT_EQ(outside, 0);
    kiln__qmat_free(&pm);
    kiln__qact_free(&act);
    kiln__qws_free(&ws);
    free(x), free(w), free(bias), free(sw), free(ref), free(out), free(q8), free(xq), free(q4);
}

static void test_kernel_int8(void) {
    /* M 1 (sampling's head), rows past the 4-row tile and past a 128-row chunk; N past a
     * 16-channel block and an odd number of blocks; K not a multiple of 4 or of 64 */
    const shape shapes[] = {{1, 16, 64, 0},  {1, 50, 37, 0},   {3, 33, 100, 0},  {5, 17, 3, 0},
                            {7, 96, 192, 0}, {130, 40, 70, 0}, {1, 300, 768, 0}, {9, 1, 1, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(shapes[i], 10 + i);
    fprintf(stderr, "  int8 kernel here: %s\n", kiln__qgemm_kernel_name());
}

static void test_kernel_int4(void) {
    const shape shapes[] = {{1, 16, 64, 32},  {1, 50, 40, 8},    {3, 33, 96, 16},
                            {6, 70, 128, 32}, {131, 20, 64, 64}, {2, 48, 768, 32}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(shapes[i], 40 + i);
}

/* A row that is all zeros has outputs = bias; a row with a NaN has NaN outputs. */
static void test_kernel_special_rows(void) {
    const int64_t N = 20, K = 12;
    float x[3 * 12] = {0}, w[12 * 20], bias[20], out[3 * 20], sw[20];
    int8_t q[20 * 12];
    fill_normal(w, K * N, 0.1f, 7);
    fill_normal(bias, N, 0.1f, 8);
    fill_normal(x + K, K, 1.0f, 9);
    x[2 * K + 4] = NAN;
    kiln_quant_int8(q, sw, w, K, N, 0);
    kiln__qmat pm;
    kiln__qact act;
    CHECK_OK(kiln__qmat_pack(&pm, q, sw, N, N, K, 8, 0));
    CHECK_OK(kiln__qact_init(&act, 3, pm.Kp, 1));
    kiln__qgemm(out, N, x, &pm, bias, 3, &act, NULL);
    int zero_ok = 1, nan_ok = 1;
    for (int64_t n = 0; n < N; n++) {
        zero_ok &= out[n] == bias[n];
        nan_ok &= isnan(out[2 * N + n]);
    }
    CHECK_TRUE(zero_ok);
    CHECK_TRUE(nan_ok);
    CHECK_TRUE(isfinite(out[N]));
    /* a padded head: rows past the given ones give zero */
    kiln__qmat_free(&pm);
    CHECK_OK(kiln__qmat_pack(&pm, q, sw, 10, N, K, 8, 0));
    kiln__qgemm(out, N, x + K, &pm, NULL, 1, &act, NULL);
    CHECK_TRUE(out[9] != 0.0f && out[10] == 0.0f && out[19] == 0.0f);
    kiln__qmat_free(&pm);
    kiln__qact_free(&act);
}

/* A row of values so small that 127 / its largest would overflow (below 3.7e-37, subnormals
 * included) quantizes as any other: zeros stay 0 and the largest is +-127, on every kernel
 * (127 / amax was infinite, and 0 x inf made its zeros NaN: -127 on one kernel, undefined
 * behaviour on the other). */
static void test_tiny_row(void) {
    const int64_t K = 40, Kp = 64, G = 64;
    float x[40] = {0};
    x[3] = 1e-40f; /* subnormal: the largest */
    x[7] = -3e-41f;
    x[9] = 3e-42f;
    int kernels = kiln__qgemm_has_vnni() ? 2 : 1;
    for (int vnni = 0; vnni < kernels; vnni++) {
        int prev = kiln__qgemm_use_vnni(vnni);
        kiln__qact act;
        CHECK_OK(kiln__qact_init(&act, 1, Kp, Kp / G));
        kiln__qact_quantize(&act, x, 1, K, Kp, G);
        int zeros = 1;
        for (int64_t k = 0; k < Kp; k++)
            if (k != 3 && k != 7 && k != 9)
                zeros &= act.q[k] == 0;
        CHECK_TRUE(zeros);
        CHECK_INT_EQ(act.q[3], 127);
        CHECK_INT_EQ(act.q[7], -38);
        CHECK_INT_EQ(act.q[9], 4);
        CHECK_TRUE(act.scale[0] > 0.0f && isfinite(act.scale[0]));
        kiln__qact_free(&act);
        kiln__qgemm_use_vnni(prev);
    }
}

/* ---- a model ---- */

static const int32_t ids[12] = {3, 17, 250, 4, 99, 0, 12, 255, 31, 8, 64, 200};

/* The last position's logits of the model in path (dense or quantized). */
static kiln_status logits_of(const char *path, float *out, int64_t Vp) {
    kiln_quant_type t;
    kiln_gpt *m = NULL;
    kiln_status s = kiln_quant_probe(path, &t, NULL);
    if (!s && t != KILN_QUANT_NONE) {
        s = kiln_quant_load(&m, path, 1, 12);
    } else if (!s) {
        kiln_gpt_config cfg = {0};
        s = kiln_gpt_config_from_safetensors(&cfg, path);
        if (!s)
            s = kiln_gpt_create_inference(&m, &cfg, 1, 12, KILN_DTYPE_F32, NULL);
        if (!s)
            s = kiln_gpt_load_safetensors(m, path);
    }
    if (!s)
        s = kiln_gpt_forward_last(m, ids, 1, 12);
    if (!s)
        s = kiln_gpt_logits_f32(m, 1, out);
    (void)Vp;
    kiln_gpt_free(m);
    return s;
}

static void no_product(void *ctx, int64_t layer, kiln_gpt_matrix which, float *out,
                       const float *inp, const float *bias, int64_t N, int64_t C, int64_t OC) {
    (void)ctx, (void)layer, (void)which, (void)out, (void)inp, (void)bias, (void)N, (void)C,
        (void)OC;
}

static void test_model_logits(void) {
    char dir[256], dense[512], q8[512], q4[512], bad[512];
    test_tmpdir(dir, sizeof dir, "quant");
    test_path(dense, sizeof dense, dir, "dense.safetensors");
    test_path(q8, sizeof q8, dir, "q8.safetensors");
    test_path(q4, sizeof q4, dir, "q4.safetensors");
    test_path(bad, sizeof bad, dir, "bad.safetensors");
    kiln_gpt_config cfg = {
        .max_seq_len = 16, .vocab_size = 256, .n_layer = 2, .n_head = 2, .n_embd = 64};
    CHECK_OK(kiln_gpt_config_validate(&cfg));
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create_inference(&m, &cfg, 1, 16, KILN_DTYPE_F32, NULL));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 5);
    /* larger weights than the initialisation's, so that the logits spread */
    float *p = kiln_gpt_params(m);
    for (int64_t i = 0; i < kiln_gpt_slab_len(m); i++)
        p[i] *= 3.0f;
    CHECK_OK(kiln_gpt_save_safetensors(m, dense, KILN_DTYPE_F32));
    CHECK_OK(kiln_quant_save(m, KILN_QUANT_INT8, 0, q8));
    CHECK_OK(kiln_quant_save(m, KILN_QUANT_INT4, 32, q4));
    /* bad groups: an error and no file */
    CHECK_STATUS(kiln_quant_save(m, KILN_QUANT_INT4, 48, bad), KILN_ERR_ARG);
    CHECK_STATUS(kiln_quant_save(m, KILN_QUANT_INT4, 12, bad), KILN_ERR_ARG);
    struct stat st;
    CHECK_TRUE(stat(bad, &st) != 0);
    int64_t Vp = cfg.padded_vocab_size;
    float *ld = calloc((size_t)Vp, 4), *l8 = calloc((size_t)Vp, 4), *l4 = calloc((size_t)Vp, 4);
    CHECK_OK(logits_of(dense, ld, Vp));
    CHECK_OK(logits_of(q8, l8, Vp));
    CHECK_OK(logits_of(q4, l4, Vp));
    /* Tolerances for this random model (weights 3x GPT-2's initialisation, whose logits spread
     * more than a trained model's do not): measured 0.028 and 0.32; a matrix read the wrong
     * way round, or a scale on the wrong channel, gives errors near 1. */
    double d8 = test_rel_err(l8, ld, 256), d4 = test_rel_err(l4, ld, 256);
    fprintf(stderr, "  logits' relative error (by norm): int8 %.3g, int4 %.3g\n", d8, d4);
    CHECK_TRUE(d8 < 0.05);
    CHECK_TRUE(d4 < 0.5);
    CHECK_TRUE(d8 < d4);
    CHECK_TRUE(d8 > 0.0); /* the quantized path did run */
    kiln_quant_type t;
    int64_t g = 0;
    CHECK_OK(kiln_quant_probe(q4, &t, &g));
    CHECK_INT_EQ(t, KILN_QUANT_INT4);
    CHECK_INT_EQ(g, 32);
    CHECK_OK(kiln_quant_probe(dense, &t, &g));
    CHECK_INT_EQ(t, KILN_QUANT_NONE);
    /* dense loaders refuse a quantized file by name; a dense one is not quantized */
    kiln_gpt_config c2 = {0};
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c2, q8), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "quantized") != NULL);
    CHECK_STATUS(kiln_gpt_load_safetensors(m, q4), KILN_ERR_UNSUPPORTED);
    kiln_gpt *qm = NULL;
    CHECK_STATUS(kiln_quant_load(&qm, dense, 1, 4), KILN_ERR_FORMAT);
    CHECK_TRUE(qm == NULL);
    /* a quantized model cannot be quantized again, nor hooked when it trains */
    CHECK_OK(kiln_quant_load(&qm, q8, 1, 4));
    if (qm)
        CHECK_STATUS(kiln_quant_save(qm, KILN_QUANT_INT8, 0, bad), KILN_ERR_ARG);
    kiln_gpt_free(qm);
    kiln_gpt *tm = NULL;
    CHECK_OK(kiln_gpt_create(&tm, &cfg, 1, 4, NULL, NULL));
    if (tm)
        CHECK_STATUS(kiln_gpt_set_linear(tm, no_product, NULL, NULL), KILN_ERR_UNSUPPORTED);
    kiln_gpt_free(tm);
    free(ld), free(l8), free(l4);
    kiln_gpt_free(m);
    test_rmtree(dir);
}

/* src copied to dst with metadata key set to value (NULL: removed). */
static void rewrite_metadata(const char *src, const char *dst, const char *key, const char *value) {
    kiln_safetensors *f = NULL;
    kiln_safetensors_writer *w = NULL;
    CHECK_OK(kiln_safetensors_open(&f, src));
    CHECK_OK(kiln_safetensors_writer_init(&w));
    if (!f || !w)
        return;
    for (int i = 0; i < kiln_safetensors_num_tensors(f); i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        CHECK_OK(kiln_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data));
    }
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        if (strcmp(k, key) != 0)
            CHECK_OK(kiln_safetensors_writer_set_metadata(w, k, v));
    }
    if (value)
        CHECK_OK(kiln_safetensors_writer_set_metadata(w, key, value));
    CHECK_OK(kiln_safetensors_writer_write(w, dst));
    kiln_safetensors_writer_free(w);
    kiln_safetensors_close(f);
}

/* The file records its layout's version: one of a newer kiln is refused naming the version,
 * one without it (an older kiln's) is version 1, a malformed one is not a version. */
static void test_format_version(void) {
    char dir[256], q8[512], x[512];
    test_tmpdir(dir, sizeof dir, "quant_version");
    test_path(q8, sizeof q8, dir, "q8.safetensors");
    test_path(x, sizeof x, dir, "x.safetensors");
    kiln_gpt_config cfg = {
        .max_seq_len = 8, .vocab_size = 64, .n_layer = 1, .n_head = 2, .n_embd = 32};
    CHECK_OK(kiln_gpt_config_validate(&cfg));
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create_inference(&m, &cfg, 1, 8, KILN_DTYPE_F32, NULL));
    if (!m)
        return;
    kiln_gpt_init_weights(m, 3);
    CHECK_OK(kiln_quant_save(m, KILN_QUANT_INT8, 0, q8));
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(&f, q8));
    const char *v = f ? kiln_safetensors_metadata(f, KILN_ST_META_QUANT_VERSION) : NULL;
    CHECK_TRUE(v && atoi(v) == KILN_QUANT_VERSION);
    kiln_safetensors_close(f);
    kiln_quant_type t;
    kiln_gpt *qm = NULL;
    char newer[16];
    snprintf(newer, sizeof newer, "%d", KILN_QUANT_VERSION + 1);
    rewrite_metadata(q8, x, KILN_ST_META_QUANT_VERSION, newer);
    CHECK_STATUS(kiln_quant_probe(x, &t, NULL), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "newer kiln") != NULL);
    char says[64];
    snprintf(says, sizeof says, "format version %s", newer);
    CHECK_TRUE(strstr(kiln_error_message(), says) != NULL);
    CHECK_STATUS(kiln_quant_load(&qm, x, 1, 4), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(qm == NULL);
    rewrite_metadata(q8, x, KILN_ST_META_QUANT_VERSION, "1.5");
    CHECK_STATUS(kiln_quant_probe(x, &t, NULL), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "not a version") != NULL);
    rewrite_metadata(q8, x, KILN_ST_META_QUANT_VERSION, NULL); /* an older kiln's file */
    CHECK_OK(kiln_quant_probe(x, &t, NULL));
    CHECK_INT_EQ(t, KILN_QUANT_INT8);
    CHECK_OK(kiln_quant_load(&qm, x, 1, 4));
    kiln_gpt_free(qm);
    qm = NULL;
    /* Metadata claiming a model far larger than the file's tensors: refused before the model
     * is allocated (64 layers of 4096 channels would take 52 GB). */
    rewrite_metadata(q8, x, "kiln.n_layer", "64");
    char y[512];
    test_path(y, sizeof y, dir, "y.safetensors");
    rewrite_metadata(x, y, "kiln.n_embd", "4096");
    CHECK_STATUS(kiln_quant_load(&qm, y, 1, 4), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "too few for the") != NULL);
    CHECK_TRUE(qm == NULL);
    kiln_gpt_free(m);
    test_rmtree(dir);
}

int main(void) {
    RUN_TEST(test_int8_bounds);
    RUN_TEST(test_int4_bounds);
    RUN_TEST(test_kernel_int8);
    RUN_TEST(test_kernel_int4);
    RUN_TEST(test_kernel_special_rows);
    RUN_TEST(test_tiny_row);
    RUN_TEST(test_model_logits);
    RUN_TEST(test_format_version);
    TEST_MAIN_END();
}
