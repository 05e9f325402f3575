/* bf16 products through oneDNN's matmul primitive (Debian's libdnnl, 2.6, built with the
 * OpenMP runtime: its threads are the OpenMP pool's, as OpenBLAS's and kiln's are).
 *
 * A primitive is slow to create (milliseconds: oneDNN generates its kernel), so each is kept
 * in a small cache keyed by everything it was created for (sizes, leading dimensions,
 * transposes, dtypes, alpha, beta, the epilogue), least recently used evicted first. Bias,
 * beta (a sum post-op) and GELU (an eltwise gelu_tanh post-op) are fused into the primitive;
 * when the caller wants the pre-activation as well (or alpha != 1 with a bias), the primitive
 * writes alpha * A x B to an fp32 workspace and kiln's epilogue does the rest. An F32 operand is
 * rounded to bf16 into a workspace first (oneDNN 2.6 multiplies bf16 only by bf16). */
#include "backend/cpu/gemm.h"

#include <stdio.h>
#include <string.h>

#include "kiln/core.h"

#ifdef KILN_HAVE_DNNL
#include <dnnl.h>

#include "core/dtype_inline.h"

enum { CACHE_SIZE = 32 };

typedef struct entry {
    int used;
    uint64_t stamp;
    int64_t key[16];
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias;
} entry;

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static entry cache[CACHE_SIZE];
static uint64_t clock_now;

const char *kiln__gemm_dnnl_version(void) {
    static char buf[32];
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "%d.%d.%d", v->major, v->minor, v->patch);
    return buf;
}

static void entry_free(entry *e) {
    if (e->prim)
        dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->a);
    dnnl_memory_destroy(e->b);
    dnnl_memory_destroy(e->c);
    dnnl_memory_destroy(e->bias);
    memset(e, 0, sizeof *e);
}

void kiln__gemm_dnnl_release(void) {
    for (int i = 0; i < CACHE_SIZE; i++)
        if (cache[i].used)
            entry_free(&cache[i]);
    if (stream)
        dnnl_stream_destroy(stream);
    if (engine)
        dnnl_engine_destroy(engine);
    stream = NULL;
    engine = NULL;
}

static dnnl_data_type_t dt_of(kiln_dtype t) {
    return t == KILN_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
}

#define DN(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t ds_ = (call);                                                                \
        if (ds_ != dnnl_success) {                                                                 \
            s = kiln_error_setf(KILN_ERR_INTERNAL, "oneDNN: %s failed (status %d)", #call,         \
                                (int)ds_);                                                         \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* A primitive for x = alpha * A x B (+ bias) (+ beta * C) (then GELU) into c_dt/ldc. */
static kiln_status entry_make(entry *e, const kiln__gemm_call *g, kiln_dtype c_dt, int64_t ldc,
                              int fused) {
    kiln_status s = KILN_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t amd, bmd, cmd, biasmd;
    dnnl_dims_t ad = {g->M, g->K}, bd = {g->K, g->N}, cd = {g->M, g->N}, biasd = {1, g->N};
    dnnl_dims_t as, bs, cs = {ldc, 1}, biass = {g->N, 1};
    as[0] = g->trans_a ? 1 : g->lda;
    as[1] = g->trans_a ? g->lda : 1;
    bs[0] = g->trans_b ? 1 : g->ldb;
    bs[1] = g->trans_b ? g->ldb : 1;
    int bias = fused && g->ep.bias;
    DN(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as));
    DN(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs));
    DN(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dt_of(c_dt), cs));
    DN(dnnl_memory_desc_init_by_strides(&biasmd, 2, biasd, dnnl_f32, biass));
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bmd, bias ? &biasmd : NULL, &cmd));
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_post_ops_create(&po));
    if (g->alpha != 1.0f)
        DN(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &g->alpha));
    if (fused && g->beta != 0.0f)
        DN(dnnl_post_ops_append_sum(po, g->beta));
    if (fused && g->ep.gelu)
        DN(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_tanh, 0.0f, 0.0f));
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    DN(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL));
    DN(dnnl_primitive_create(&e->prim, pd));
    DN(dnnl_memory_create(&e->a, &amd, engine, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&e->b, &bmd, engine, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&e->c, &cmd, engine, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&e->bias, &biasmd, engine, DNNL_MEMORY_NONE));
    e->used = 1;
fail:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (s)
        entry_free(e);
    return s;
}

static kiln_status entry_get(entry **out, const kiln__gemm_call *g, kiln_dtype c_dt, int64_t ldc,
                             int fused) {
    float ab[2] = {g->alpha, fused ? g->beta : 0.0f};
    int64_t fb = 0;
    memcpy(&fb, ab, sizeof ab);
    int64_t key[16] = {g->M,
                       g->N,
                       g->K,
                       g->lda,
                       g->ldb,
                       ldc,
                       g->trans_a,
                       g->trans_b,
                       c_dt,
                       fused,
                       fused && g->ep.bias,
                       fused && g->ep.gelu,
                       fb};
    entry *victim = &cache[0];
    for (int i = 0; i < CACHE_SIZE; i++) {
        entry *e = &cache[i];
        if (e->used && !memcmp(e->key, key, sizeof key)) {
            e->stamp = ++clock_now;
            *out = e;
            return KILN_OK;
        }
        if (!e->used || (victim->used && e->stamp < victim->stamp))
            victim = e;
    }
    if (victim->used)
        entry_free(victim);
    kiln_status s = entry_make(victim, g, c_dt, ldc, fused);
    if (s)
        return s;
    memcpy(victim->key, key, sizeof key);
    victim->stamp = ++clock_now;
    *out = victim;
    return KILN_OK;
}

static kiln_status engine_start(void) {
    kiln_status s = KILN_OK;
    if (!engine) {
        DN(dnnl_engine_create(&engine, dnnl_cpu, 0));
        DN(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    }
fail:
    return s;
}

/* A 16 x 16 x 16 bf16 product's primitive, made and thrown away. */
static kiln_status bf16_probe(void) {
    kiln_status s = engine_start();
    if (s)
        return s;
    dnnl_memory_desc_t md16, md32;
    dnnl_dims_t d = {16, 16}, st = {16, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    DN(dnnl_memory_desc_init_by_strides(&md16, 2, d, dnnl_bf16, st));
    DN(dnnl_memory_desc_init_by_strides(&md32, 2, d, dnnl_f32, st));
    DN(dnnl_matmul_desc_init(&md, &md16, &md16, NULL, &md32));
    dnnl_status_t ds = dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ds == dnnl_unimplemented)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "oneDNN %s has no bf16 matrix product for this CPU (it needs "
                               "AVX-512)",
                               kiln__gemm_dnnl_version());
    DN(ds);
fail:
    return s;
}

int kiln__gemm_dnnl_bf16_ok(void) {
    static int asked;
    static kiln_status probed;
    static char why[256];
    if (!asked) {
        asked = 1;
        probed = bf16_probe();
        if (probed)
            snprintf(why, sizeof why, "%s", kiln_error_message());
    }
    if (probed)
        kiln_error_setf(probed, "%s", why);
    return probed == KILN_OK;
}

int kiln__gemm_dnnl_has_amx(void) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_amx) ==
           (unsigned)dnnl_cpu_isa_avx512_core_amx;
}

/* rows x cols of an F32 operand (leading dimension ld) rounded to bf16, dense. */
static kiln_status to_bf16(const void **out, int64_t *ld, int slot, const void *src, int64_t rows,
                           int64_t cols) {
    uint16_t *w;
    kiln_status s = kiln__gemm_workspace((void **)&w, slot, (size_t)(rows * cols) * 2);
    if (s)
        return s;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 15))
    for (int64_t r = 0; r < rows; r++)
        kiln_convert(w + r * cols, KILN_DTYPE_BF16, (const float *)src + r * *ld, KILN_DTYPE_F32,
                     cols);
    *out = w;
    *ld = cols;
    return KILN_OK;
}

kiln_status kiln__gemm_dnnl(const kiln__gemm_call *gin) {
    kiln_status s = KILN_OK;
    kiln__gemm_call g = *gin;
    if ((s = engine_start()))
        return s;
    if (g.a_dt == KILN_DTYPE_F32 &&
        (s = to_bf16(&g.a, &g.lda, 0, g.a, g.trans_a ? g.K : g.M, g.trans_a ? g.M : g.K)))
        return s;
    if (g.b_dt == KILN_DTYPE_F32 &&
        (s = to_bf16(&g.b, &g.ldb, 1, g.b, g.trans_b ? g.N : g.K, g.trans_b ? g.K : g.N)))
        return s;
    /* oneDNN 2.6 scales after adding the bias ((A x B + bias) * alpha), so alpha != 1 with a
     * bias goes through kiln's epilogue as the pre-activation does */
    int fused = !g.ep.pre && (g.alpha == 1.0f || !g.ep.bias);
    float *x = NULL;
    if (!fused && (s = kiln__gemm_workspace((void **)&x, 2, (size_t)(g.M * g.N) * sizeof(float))))
        return s;
    entry *e;
    if ((s = entry_get(&e, &g, fused ? g.c_dt : KILN_DTYPE_F32, fused ? g.ldc : g.N, fused)))
        return s;
    DN(dnnl_memory_set_data_handle(e->a, (void *)g.a));
    DN(dnnl_memory_set_data_handle(e->b, (void *)g.b));
    DN(dnnl_memory_set_data_handle(e->c, fused ? g.c : x));
    DN(dnnl_memory_set_data_handle(e->bias, (void *)g.ep.bias));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a},
                               {DNNL_ARG_WEIGHTS, e->b},
                               {DNNL_ARG_DST, e->c},
                               {DNNL_ARG_BIAS, e->bias}};
    DN(dnnl_primitive_execute(e->prim, stream, fused && g.ep.bias ? 4 : 3, args));
    DN(dnnl_stream_wait(stream));
    if (!fused) {
        g.alpha = 1.0f;
#pragma omp parallel for schedule(static) if (g.M * g.N >= (1 << 15))
        for (int64_t i = 0; i < g.M; i++)
            kiln__gemm_store(&g, x + i * g.N, g.N, i, i + 1, 0, g.N);
    }
fail:
    return s;
}

/* fp32: oneDNN's BLAS-like sgemm, row-major as kiln's products are. It keeps no state
 * of kiln's and threads over the OpenMP pool as sgemm does. */
kiln_status kiln__gemm_dnnl_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  int64_t ldb, float beta, float *c, int64_t ldc) {
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, a, lda,
                                  b, ldb, beta, c, ldc);
    if (st != dnnl_success)
        return kiln_error_setf(KILN_ERR_INTERNAL, "oneDNN sgemm M=%lld N=%lld K=%lld: status %d",
                               (long long)M, (long long)N, (long long)K, (int)st);
    return KILN_OK;
}

#else /* built without oneDNN */

kiln_status kiln__gemm_dnnl_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  int64_t ldb, float beta, float *c, int64_t ldc) {
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)a, (void)lda;
    (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "this kiln was built without oneDNN");
}

const char *kiln__gemm_dnnl_version(void) {
    return "(not built)";
}
int kiln__gemm_dnnl_bf16_ok(void) {
    kiln_error_setf(KILN_ERR_UNSUPPORTED, "this kiln was built without oneDNN");
    return 0;
}
kiln_status kiln__gemm_dnnl(const kiln__gemm_call *g) {
    (void)g;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "this kiln was built without oneDNN");
}
int kiln__gemm_dnnl_has_amx(void) {
    return 0;
}
void kiln__gemm_dnnl_release(void) {}

#endif
