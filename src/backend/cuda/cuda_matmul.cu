/* Matrix products through cuBLASLt. kiln's matrices are row-major; cuBLASLt's are
 * column-major, where a row-major (r, c) matrix is a column-major (c, r) one. So
 * out (N,OC) = inp (N,C) x W is computed as out^T (OC,N) = W^T (OC,C) x inp^T (C,N): the
 * row-major buffers passed as they are, with W transposed or not by its layout.
 *
 * bf16 and fp16 products take their inputs in the dtype and accumulate in fp32
 * (CUBLAS_COMPUTE_32F); weight gradients are written in fp32 straight from the accumulator
 * with beta = 1, so they add to the gradient slab without a rounding to the dtype. fp32
 * products use fp32 arithmetic unless the TF32 flag is on. The bias is added in the
 * product's epilogue, and GELU too when the FUSE_GELU flag is on and cuBLASLt has a kernel
 * for the case (else a separate pass of GELU over the stored pre-activation, as the
 * reference computes it). The bias gradient is a column sum (cuda_layers.cu), in a fixed
 * order. Each product's algorithm is chosen once by cuBLASLt's heuristic and cached by
 * shape, layout, types and alignment. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

/* cuBLASLt is loaded when the backend starts (dlopen), not linked: the library is large, and
 * a kiln that runs on the CPU should neither map it at load time nor need it installed. */
#define KCU_LT_FUNCS(X)                                                                            \
    X(cublasLtCreate)                                                                              \
    X(cublasLtGetStatusString)                                                                     \
    X(cublasLtMatmul)                                                                              \
    X(cublasLtMatmulAlgoGetHeuristic)                                                              \
    X(cublasLtMatmulDescCreate)                                                                    \
    X(cublasLtMatmulDescDestroy)                                                                   \
    X(cublasLtMatmulDescSetAttribute)                                                              \
    X(cublasLtMatmulPreferenceCreate)                                                              \
    X(cublasLtMatmulPreferenceDestroy)                                                             \
    X(cublasLtMatmulPreferenceSetAttribute)                                                        \
    X(cublasLtMatrixLayoutCreate)                                                                  \
    X(cublasLtMatrixLayoutDestroy)
#define KCU_LT_POINTER_(f) static decltype(&f) p_##f;
KCU_LT_FUNCS(KCU_LT_POINTER_)
#undef KCU_LT_POINTER_
#define cublasLtCreate p_cublasLtCreate
#define cublasLtGetStatusString p_cublasLtGetStatusString
#define cublasLtMatmul p_cublasLtMatmul
#define cublasLtMatmulAlgoGetHeuristic p_cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate p_cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy p_cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute p_cublasLtMatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate p_cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy p_cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute p_cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate p_cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy p_cublasLtMatrixLayoutDestroy

#define KCU_STR_(x) #x
#define KCU_STR(x) KCU_STR_(x)

kiln_status kcu_matmul_start(kcu_state *s) {
    static const char *const names[] = {"libcublasLt.so." KCU_STR(CUBLAS_VER_MAJOR),
                                        "libcublasLt.so"};
    void *h = NULL;
    for (int i = 0; i < 2 && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "cuda backend: cannot load %s (%s): install the CUDA toolkit's "
                               "cuBLAS libraries, or run on the CPU backend (cpu)",
                               names[0], dlerror());
#define KCU_LT_LOAD_(f)                                                                            \
    if (!(p_##f = (decltype(p_##f))dlsym(h, #f)))                                                 \
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "cuda backend: %s has no %s", names[0], #f);
    KCU_LT_FUNCS(KCU_LT_LOAD_)
#undef KCU_LT_LOAD_
    cublasStatus_t st = cublasLtCreate(&s->lt);
    if (st != CUBLAS_STATUS_SUCCESS)
        return kiln_error_setf(KILN_ERR_INTERNAL, "cuda backend: cublasLtCreate failed: %s",
                               cublasLtGetStatusString(st));
    return KILN_OK;
}

static cudaDataType_t cuda_type(kiln_dtype dt) {
    return dt == KILN_DTYPE_BF16 ? CUDA_R_16BF : dt == KILN_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The largest power of two up to 256 that divides the address. */
static uint32_t align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0)
        al >>= 1;
    return al;
}

/* One product: D (m,n, column-major, ld ldd, type td) = op(A) op(B) (+ D when beta = 1),
 * A and B of type tab, with an epilogue (bias, GELU with its input to aux). */
typedef struct lt_problem {
    int64_t m, n, k, lda, ldb, ldd, ldaux;
    int transa, transb;
    cudaDataType_t tab, td;
    cublasComputeType_t compute;
    cublasLtEpilogue_t epilogue;
    uint32_t align[4]; /* A, B, D, aux/bias */
    int beta_one;
} lt_problem;

enum { LT_CACHE = 128 };
typedef struct lt_cached {
    lt_problem key;
    cublasLtMatmulAlgo_t algo;
    int used;
} lt_cached;
static lt_cached lt_cache[LT_CACHE];
static int lt_cache_next;

void kcu_matmul_release(kcu_state *s) {
    (void)s;
    memset(lt_cache, 0, sizeof lt_cache);
    lt_cache_next = 0;
}

static int same_problem(const lt_problem *a, const lt_problem *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

/* Returns 0 on success; 1 when cuBLASLt has no algorithm or does not support the case
 * (nothing recorded: the caller may take another way); -1 on an error (recorded). */
static int lt_matmul(kiln_backend *be, const lt_problem *pr, void *D, const void *A,
                     const void *B, const void *bias, void *aux, const char *what) {
    kcu_state *s = kcu_st(be);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t st;
    int ret = -1;
    const char *step = "cublasLtMatmulDescCreate";
    cublasOperation_t ta = pr->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = pr->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int32_t tdt = (int32_t)pr->td;
    float alpha = 1.0f, beta = pr->beta_one ? 1.0f : 0.0f;
    lt_cached *hit = NULL;
    cublasLtMatmulAlgo_t algo;

#define LT(call)                                                                                   \
    do {                                                                                           \
        step = #call;                                                                              \
        if ((st = (call)) != CUBLAS_STATUS_SUCCESS)                                                \
            goto fail;                                                                             \
    } while (0)
    LT(cublasLtMatmulDescCreate(&op, pr->compute, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &pr->epilogue,
                                      sizeof pr->epilogue));
    if (bias) {
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &tdt,
                                          sizeof tdt));
    }
    if (aux) {
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                          sizeof aux));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &pr->ldaux,
                                          sizeof pr->ldaux));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &tdt,
                                          sizeof tdt));
    }
    /* stored shapes: A is (m,k) or, transposed, (k,m); B is (k,n) or (n,k) */
    LT(cublasLtMatrixLayoutCreate(&la, pr->tab, pr->transa ? pr->k : pr->m,
                                  pr->transa ? pr->m : pr->k, pr->lda));
    LT(cublasLtMatrixLayoutCreate(&lb, pr->tab, pr->transb ? pr->n : pr->k,
                                  pr->transb ? pr->k : pr->n, pr->ldb));
    LT(cublasLtMatrixLayoutCreate(&ld, pr->td, pr->m, pr->n, pr->ldd));

    for (int i = 0; i < LT_CACHE; i++)
        if (lt_cache[i].used && same_problem(&lt_cache[i].key, pr)) {
            hit = &lt_cache[i];
            break;
        }
    if (hit) {
        algo = hit->algo;
    } else {
        uint64_t ws = s->lt_ws_bytes;
        LT(cublasLtMatmulPreferenceCreate(&pref));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &pr->align[0], sizeof pr->align[0]));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &pr->align[1], sizeof pr->align[1]));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &pr->align[2], sizeof pr->align[2]));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &pr->align[2], sizeof pr->align[2]));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        step = "cublasLtMatmulAlgoGetHeuristic";
        st = cublasLtMatmulAlgoGetHeuristic(s->lt, op, la, lb, ld, ld, pref, 1, &res, &found);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
            ret = 1; /* no algorithm: the caller decides */
            goto done;
        }
        algo = res.algo;
        lt_cached *c = &lt_cache[lt_cache_next];
        lt_cache_next = (lt_cache_next + 1) % LT_CACHE;
        c->key = *pr;
        c->algo = algo;
        c->used = 1;
    }
    LT(cublasLtMatmul(s->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &algo, s->lt_ws,
                      s->lt_ws_bytes, s->stream));
#undef LT
    ret = 0;
    goto done;
fail:
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) { /* as no algorithm: the caller decides */
        ret = 1;
        goto done;
    }
    kiln_backend_fail(be, KILN_ERR_INTERNAL,
                      "cuBLASLt: %s failed in %s (m %lld, n %lld, k %lld): %s", step, what,
                      (long long)pr->m, (long long)pr->n, (long long)pr->k,
                      cublasLtGetStatusString(st));
    ret = -1;
done:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return ret;
}

static cublasComputeType_t compute_type(kiln_backend *be, kiln_dtype dt) {
    if (dt == KILN_DTYPE_F32 && kcu_st(be)->tf32)
        return CUBLAS_COMPUTE_32F_FAST_TF32;
    return CUBLAS_COMPUTE_32F;
}

/* A problem with no algorithm is an error unless the caller can do otherwise. */
static void no_algorithm(kiln_backend *be, const lt_problem *pr, const char *what) {
    kiln_backend_fail(be, KILN_ERR_UNSUPPORTED,
                      "cuBLASLt has no algorithm for %s (m %lld, n %lld, k %lld, alignments %u %u "
                      "%u)",
                      what, (long long)pr->m, (long long)pr->n, (long long)pr->k, pr->align[0],
                      pr->align[1], pr->align[2]);
}

void kiln__cuda_matmul_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                               const void *weight, const void *bias, int64_t N, int64_t C,
                               int64_t OC, int trans_w, void *gelu_out) {
    if (kcu_skip(be) || N <= 0 || OC <= 0)
        return;
    if (C <= 0) { /* an empty sum: the bias alone */
        kiln_backend_fail(be, KILN_ERR_ARG, "matmul_forward with C = %lld", (long long)C);
        return;
    }
    lt_problem pr;
    memset(&pr, 0, sizeof pr); /* padding too: the cache compares bytes */
    pr.m = OC, pr.n = N, pr.k = C;
    pr.transa = trans_w != 0, pr.lda = trans_w ? C : OC;
    pr.transb = 0, pr.ldb = C;
    pr.ldd = OC;
    pr.tab = pr.td = cuda_type(dt);
    pr.compute = compute_type(be, dt);
    pr.align[0] = align_of(weight), pr.align[1] = align_of(inp);
    int fuse = gelu_out && kcu_st(be)->fuse_gelu && dt != KILN_DTYPE_F32 && OC % 8 == 0 &&
               align_of(out) >= 16 && align_of(gelu_out) >= 16;
    if (fuse) {
        /* D = GELU(product + bias) into gelu_out; the pre-activation into out */
        pr.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        pr.ldaux = OC;
        pr.align[2] = align_of(gelu_out);
        pr.align[3] = align_of(out) < (bias ? align_of(bias) : 256) ? align_of(out)
                                                                    : align_of(bias);
        int r = lt_matmul(be, &pr, gelu_out, weight, inp, bias, out, "matmul_forward (GELU)");
        if (r <= 0)
            return;
        /* no fused kernel: the plain product and a GELU pass */
    }
    pr.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    pr.ldaux = 0;
    pr.align[2] = align_of(out);
    pr.align[3] = bias ? align_of(bias) : 0;
    if (lt_matmul(be, &pr, out, weight, inp, bias, NULL, "matmul_forward") == 1)
        no_algorithm(be, &pr, "matmul_forward");
    if (gelu_out)
        kiln__cuda_gelu_forward(be, dt, gelu_out, out, N * OC);
}

void kiln__cuda_matmul_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                float *dbias, const void *dout, const void *inp,
                                const void *weight, int64_t N, int64_t C, int64_t OC,
                                int trans_w) {
    if (kcu_skip(be) || N <= 0 || C <= 0 || OC <= 0)
        return;
    lt_problem pr;
    if (dinp) {
        /* dinp^T (C,N) = W (C,OC) x dout^T (OC,N) */
        memset(&pr, 0, sizeof pr);
        pr.m = C, pr.n = N, pr.k = OC;
        pr.transa = trans_w == 0, pr.lda = trans_w ? C : OC;
        pr.transb = 0, pr.ldb = OC;
        pr.ldd = C;
        pr.tab = pr.td = cuda_type(dt);
        pr.compute = compute_type(be, dt);
        pr.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        pr.align[0] = align_of(weight), pr.align[1] = align_of(dout), pr.align[2] = align_of(dinp);
        if (lt_matmul(be, &pr, dinp, weight, dout, NULL, NULL, "matmul_backward (dinp)") == 1)
            no_algorithm(be, &pr, "matmul_backward (dinp)");
    }
    /* dweight += inp^T dout, in fp32: trans_w 0, dW (C,OC) row-major = (OC,C) column-major:
     * dout^T (OC,N) x inp (N,C); trans_w 1, dW (OC,C) row-major = (C,OC) column-major:
     * inp^T (C,N) x dout (N,OC) */
    memset(&pr, 0, sizeof pr);
    const void *A, *B;
    if (!trans_w) {
        pr.m = OC, pr.n = C, pr.k = N;
        A = dout, pr.transa = 0, pr.lda = OC;
        B = inp, pr.transb = 1, pr.ldb = C;
        pr.ldd = OC;
    } else {
        pr.m = C, pr.n = OC, pr.k = N;
        A = inp, pr.transa = 0, pr.lda = C;
        B = dout, pr.transb = 1, pr.ldb = OC;
        pr.ldd = C;
    }
    pr.tab = cuda_type(dt);
    pr.td = CUDA_R_32F;
    pr.compute = compute_type(be, dt);
    pr.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    pr.beta_one = 1;
    pr.align[0] = align_of(A), pr.align[1] = align_of(B), pr.align[2] = align_of(dweight);
    if (lt_matmul(be, &pr, dweight, A, B, NULL, NULL, "matmul_backward (dweight)") == 1)
        no_algorithm(be, &pr, "matmul_backward (dweight)");
    if (dbias)
        kcu_column_sums(be, dt, dbias, dout, N, OC);
}
