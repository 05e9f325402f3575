/* The CUDA backend's optimizer updates: one fused pass over the slab range, a thread per
 * element, evaluating the reference's expression (src/backend/ref/ref_optim.c) term by term
 * in fp32 with IEEE division and square root, then the working copy in its dtype: rounded
 * to nearest even, or bf16 rounded stochastically with the same 16 bits per element as on
 * the CPU (a hash of the seed and the element's index in the whole slab), so the result
 * does not depend on how the work is split. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"

/* The working copy's destination, by value for the kernels. */
typedef struct kcu_work {
    void *p;
    int dtype; /* kiln_dtype */
    unsigned long long seed;
    long long index0;
} kcu_work;

static kcu_work work_of(const kiln_work_out *w) {
    kcu_work k = {NULL, 0, 0, 0};
    if (w && w->p) {
        k.p = w->p;
        k.dtype = (int)w->dtype;
        k.seed = w->round_seed;
        k.index0 = w->index0;
    }
    return k;
}

/* kiln__round_bits (src/core/dtype_inline.h): splitmix64's finaliser of (seed, i). */
__device__ __forceinline__ uint32_t kcu_round_bits(uint64_t seed, int64_t i) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31)) & 0xffffu;
}

__device__ __forceinline__ void kcu_write_work(const kcu_work &w, int64_t i, float p) {
    if (!w.p)
        return;
    if (w.dtype == KILN_DTYPE_BF16) {
        uint16_t *d = (uint16_t *)w.p;
        uint32_t u = __float_as_uint(p);
        if (w.seed && (u & 0x7fffffffu) < 0x7f800000u)
            d[i] = (uint16_t)((u + kcu_round_bits(w.seed, w.index0 + i)) >> 16);
        else
            kcu_st((__nv_bfloat16 *)w.p, i, p);
    } else if (w.dtype == KILN_DTYPE_F16) {
        kcu_st((__half *)w.p, i, p);
    } else {
        ((float *)w.p)[i] = p;
    }
}

#define KCU_FOR_EACH(i, n)                                                                         \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                     \
         i += (int64_t)gridDim.x * blockDim.x)

__global__ void kcu_adam(float *p, kcu_work w, const float *g, float gscale, float *m, float *v,
                         int64_t n, float lr, float b1, float b2, float bc1, float bc2, float eps,
                         float dwd, float l2) {
    KCU_FOR_EACH(i, n) {
        float grad = fmaf(l2, p[i], g[i] * gscale);
        float mi = b1 * m[i] + (1.0f - b1) * grad;
        float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float x = p[i] * (1.0f - lr * dwd);
        float pi = x - lr * mhat / (sqrtf(vhat) + eps);
        p[i] = pi;
        kcu_write_work(w, i, pi);
    }
}

__global__ void kcu_sgd(float *p, kcu_work w, const float *g, float gscale, float *buf, int64_t n,
                        float lr, float momentum, float dampening, int nesterov, float wd,
                        int first) {
    KCU_FOR_EACH(i, n) {
        float grad = fmaf(wd, p[i], g[i] * gscale);
        float step = grad;
        if (momentum != 0.0f) {
            float b = first ? grad : momentum * buf[i] + (1.0f - dampening) * grad;
            buf[i] = b;
            step = nesterov ? grad + momentum * b : b;
        }
        float pi = p[i] - lr * step;
        p[i] = pi;
        kcu_write_work(w, i, pi);
    }
}

__global__ void kcu_rmsprop(float *p, kcu_work w, const float *g, float gscale, float *sq,
                            float *buf, int64_t n, float lr, float alpha, float eps, float wd,
                            float momentum) {
    KCU_FOR_EACH(i, n) {
        float grad = fmaf(wd, p[i], g[i] * gscale);
        float s = alpha * sq[i] + (1.0f - alpha) * grad * grad;
        sq[i] = s;
        float step = grad / (sqrtf(s) + eps);
        if (momentum > 0.0f) {
            float b = momentum * buf[i] + step;
            buf[i] = b;
            step = b;
        }
        float pi = p[i] - lr * step;
        p[i] = pi;
        kcu_write_work(w, i, pi);
    }
}

void kiln__cuda_adam_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                            float gscale, float *m, float *v, int64_t n, float lr, float b1,
                            float b2, float bc1, float bc2, float eps, float decoupled_wd,
                            float l2_wd) {
    if (kcu_skip(be) || n <= 0)
        return;
    kcu_adam<<<kcu_blocks(n, 256), 256, 0, kcu_st(be)->stream>>>(
        p, work_of(w), g, gscale, m, v, n, lr, b1, b2, bc1, bc2, eps, decoupled_wd, l2_wd);
    KCU_LAUNCHED(be, "adam_update");
}

void kiln__cuda_sgd_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                           float gscale, float *buf, int64_t n, float lr, float momentum,
                           float dampening, int nesterov, float wd, int first) {
    if (kcu_skip(be) || n <= 0)
        return;
    kcu_sgd<<<kcu_blocks(n, 256), 256, 0, kcu_st(be)->stream>>>(
        p, work_of(w), g, gscale, buf, n, lr, momentum, dampening, nesterov, wd, first);
    KCU_LAUNCHED(be, "sgd_update");
}

void kiln__cuda_rmsprop_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                               float gscale, float *sq, float *buf, int64_t n, float lr,
                               float alpha, float eps, float wd, float momentum) {
    if (kcu_skip(be) || n <= 0)
        return;
    kcu_rmsprop<<<kcu_blocks(n, 256), 256, 0, kcu_st(be)->stream>>>(
        p, work_of(w), g, gscale, sq, buf, n, lr, alpha, eps, wd, momentum);
    KCU_LAUNCHED(be, "rmsprop_update");
}
