/* The CUDA backend's kernels of the Llama family's layers: RMSNorm (and the residual add fused
 * with it), rotary position embeddings and SwiGLU. As in cuda_layers.cu, each loads its dtype,
 * computes in fp32 and rounds once when it stores, and no kernel adds with atomics: RMSNorm's
 * weight gradient is summed over fixed chunks of rows, one thread per column, then over the
 * chunks in order (kcu_add_parts), so its bits depend on the sizes alone.
 *
 * Launch shapes: the row kernels (RMSNorm forward, its dinp) run one warp per row, four rows to
 * a block of 128 threads; the weight gradient one thread per column and chunk of rows,
 * grid (columns / 128, chunks), into the backend's `part` buffer (chunks x C floats); RoPE
 * one thread per (position, rotated pair i < hs/2) looping over the q and k heads, SwiGLU
 * one thread per output element, both in grid-stride loops of 256-thread blocks. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"

enum { LL_ROW_WARPS = 4, LL_COL_THREADS = 128, LL_THREADS = 256 };

/* ---- RMSNorm: one warp per row ---- */

/* With b: x = a + b rounded to T and stored in res (res may be a or b), without b x = a
 * (kcu_norm_row); rstd = 1 / sqrt(mean(x^2) + eps), out = x rstd w. */
template <typename T>
__global__ void kcu_rmsnorm_forward(T *out, float *rstd, T *res, const T *a, const T *b,
                                    const T *w, int64_t N, int64_t C, float eps) {
    int lane = threadIdx.x & 31;
    int64_t row = blockIdx.x * (int64_t)LL_ROW_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    float ss;
    const T *x = kcu_norm_row(res, a, b, row, C, 1, &ss);
    float s = 1.0f / sqrtf(kcu_warp_sum(ss) / (float)C + eps);
    T *o = out + row * C;
    for (int64_t c = lane; c < C; c += 32)
        kcu_st(o, c, kcu_ld(x, c) * s * kcu_ld(w, c));
    if (lane == 0)
        rstd[row] = s;
}

static void rmsnorm_launch(kiln_backend *be, kiln_dtype dt, void *res, void *out, float *rstd,
                           const void *a, const void *b, const void *weight, int64_t N, int64_t C,
                           float eps, const char *name) {
    if (kcu_skip(be) || N <= 0 || C <= 0)
        return;
    unsigned grid = (unsigned)((N + LL_ROW_WARPS - 1) / LL_ROW_WARPS);
    KCU_DISPATCH(dt, kcu_rmsnorm_forward<T><<<grid, 32 * LL_ROW_WARPS, 0, kcu_st(be)->stream>>>(
                         (T *)out, rstd, (T *)res, (const T *)a, (const T *)b,
                         (const T *)weight, N, C, eps));
    KCU_LAUNCHED(be, name);
}

void kiln__cuda_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *rstd,
                                const void *inp, const void *weight, int64_t N, int64_t C,
                                float eps) {
    rmsnorm_launch(be, dt, NULL, out, rstd, inp, NULL, weight, N, C, eps, "rmsnorm_forward");
}

void kiln__cuda_residual_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                         float *rstd, const void *a, const void *b,
                                         const void *weight, int64_t N, int64_t C, float eps) {
    rmsnorm_launch(be, dt, res, out, rstd, a, b, weight, N, C, eps,
                   "residual_rmsnorm_forward");
}

/* dx += r (w dy) - x r^3 mean(x w dy), per row (r = rstd). */
template <typename T>
__global__ void kcu_rmsnorm_backward_dx(T *dinp, const T *dout, const T *inp, const T *w,
                                        const float *rstd, int64_t N, int64_t C) {
    int lane = threadIdx.x & 31;
    int64_t row = blockIdx.x * (int64_t)LL_ROW_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const T *x = inp + row * C, *d = dout + row * C;
    float r = rstd[row], dot = 0.0f;
    for (int64_t c = lane; c < C; c += 32)
        dot += kcu_ld(x, c) * kcu_ld(w, c) * kcu_ld(d, c);
    float k = r * r * r * kcu_warp_sum(dot) / (float)C;
    T *dx = dinp + row * C;
    for (int64_t c = lane; c < C; c += 32) {
        float g = r * kcu_ld(w, c) * kcu_ld(d, c) - kcu_ld(x, c) * k;
        kcu_st(dx, c, kcu_ld((const T *)dx, c) + g);
    }
}

/* Per chunk of rpc rows and column: sum of x rstd dout, into part (chunk, C). */
template <typename T>
__global__ void kcu_rmsnorm_backward_parts(float *part, const T *dout, const T *inp,
                                           const float *rstd, int64_t N, int64_t C,
                                           int64_t rpc) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= C)
        return;
    int64_t r0 = k * rpc, r1 = r0 + rpc < N ? r0 + rpc : N;
    float dw = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        dw += kcu_ld(inp, r * C + c) * rstd[r] * kcu_ld(dout, r * C + c);
    part[k * C + c] = dw;
}

void kiln__cuda_rmsnorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                 const void *dout, const void *inp, const void *weight,
                                 const float *rstd, int64_t N, int64_t C) {
    if (kcu_skip(be) || N <= 0 || C <= 0)
        return;
    kcu_state *s = kcu_st(be);
    int64_t rpc = kcu_rows_per_chunk(N), chunks = (N + rpc - 1) / rpc;
    float *part = (float *)kcu_grow(be, &s->part, (size_t)(chunks * C) * sizeof(float));
    if (!part)
        return;
    unsigned rows = (unsigned)((N + LL_ROW_WARPS - 1) / LL_ROW_WARPS);
    dim3 grid((unsigned)((C + LL_COL_THREADS - 1) / LL_COL_THREADS), (unsigned)chunks);
    KCU_DISPATCH(dt, {
        kcu_rmsnorm_backward_dx<T><<<rows, 32 * LL_ROW_WARPS, 0, s->stream>>>(
            (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, rstd, N, C);
        kcu_rmsnorm_backward_parts<T><<<grid, LL_COL_THREADS, 0, s->stream>>>(
            part, (const T *)dout, (const T *)inp, rstd, N, C, rpc);
    });
    if (KCU_LAUNCHED(be, "rmsnorm_backward"))
        return;
    kcu_add_parts(be, dweight, NULL, part, chunks, C, C);
}

/* ---- rotary position embeddings ---- */

/* One thread per (row n of B*T, pair i < half), over every q and k head of the row: the row's
 * position is pos0 + n % T. inv_freq = 1 / theta^(2i/hs) with the exponent and the power
 * rounded to fp32 (the power taken in double, so it is the correctly rounded fp32 value in all
 * but rare cases, where a host's powf may differ by an ulp), the angle pos * inv_freq in fp32
 * as Hugging Face computes it, its cosine and sine in double then rounded to fp32: within an
 * ulp of the exact values of that fp32 angle, whatever its size. sign -1 rotates back. */
template <typename T>
__global__ void kcu_rope(T *x, int64_t rows, int64_t T_, int64_t heads, int64_t W, int64_t hs,
                         int64_t pos0, float theta, float sign) {
    int64_t half = hs / 2;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < rows * half;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = e / half, i = e % half;
        float ex = (float)(2 * i) / (float)hs;
        float inv_freq = 1.0f / (float)pow((double)theta, (double)ex);
        float angle = (float)(pos0 + n % T_) * inv_freq;
        double sd, cd;
        sincos((double)angle, &sd, &cd);
        float c = (float)cd, s = sign * (float)sd;
        T *row = x + n * W + i;
        for (int64_t h = 0; h < heads; h++) { /* q heads, then k heads */
            T *p = row + h * hs;
            float x0 = kcu_ld((const T *)p, 0), x1 = kcu_ld((const T *)p, half);
            kcu_st(p, 0, x0 * c - x1 * s);
            kcu_st(p, half, x1 * c + x0 * s);
        }
    }
}

static void rope(kiln_backend *be, kiln_dtype dt, void *qkv, int64_t B, int64_t Tn, int64_t NH,
                 int64_t NKV, int64_t hs, int64_t pos0, float theta, float sign,
                 const char *name) {
    if (kcu_skip(be) || B * Tn <= 0)
        return;
    if (hs <= 0 || hs % 2 != 0 || NH <= 0 || NKV <= 0 || pos0 < 0) {
        kiln_backend_fail(be, KILN_ERR_ARG,
                          "cuda %s: head size %lld (it must be even), %lld query and %lld "
                          "key/value heads, first position %lld",
                          name, (long long)hs, (long long)NH, (long long)NKV, (long long)pos0);
        return;
    }
    int64_t rows = B * Tn, W = (NH + 2 * NKV) * hs;
    KCU_DISPATCH(dt, kcu_rope<T><<<kcu_blocks(rows * (hs / 2), LL_THREADS), LL_THREADS, 0,
                                   kcu_st(be)->stream>>>((T *)qkv, rows, Tn, NH + NKV, W, hs, pos0,
                                                         theta, sign));
    KCU_LAUNCHED(be, name);
}

void kiln__cuda_rope_forward(kiln_backend *be, kiln_dtype dt, void *qkv, int64_t B, int64_t T,
                             int64_t NH, int64_t NKV, int64_t hs, int64_t pos0, float theta) {
    rope(be, dt, qkv, B, T, NH, NKV, hs, pos0, theta, 1.0f, "rope_forward");
}

void kiln__cuda_rope_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, int64_t B, int64_t T,
                              int64_t NH, int64_t NKV, int64_t hs, int64_t pos0, float theta) {
    rope(be, dt, dqkv, B, T, NH, NKV, hs, pos0, theta, -1.0f, "rope_backward");
}

/* ---- SwiGLU: one thread per output element ---- */

template <typename T>
__global__ void kcu_swiglu_forward(T *out, const T *inp, int64_t N, int64_t H) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * H;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / H, j = i % H;
        float g = kcu_ld(inp, n * 2 * H + j), u = kcu_ld(inp, n * 2 * H + H + j);
        kcu_st(out, i, g / (1.0f + expf(-g)) * u);
    }
}

/* d gate = dy up silu'(g), silu'(g) = s (1 + g (1 - s)) with s the sigmoid; d up = dy silu(g).
 * A gate so negative that exp(-g) overflows gives s = 0: both gradients 0, as in the limit. */
template <typename T>
__global__ void kcu_swiglu_backward(T *dinp, const T *inp, const T *dout, int64_t N, int64_t H) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * H;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / H, j = i % H;
        float g = kcu_ld(inp, n * 2 * H + j), u = kcu_ld(inp, n * 2 * H + H + j);
        float dy = kcu_ld(dout, i), s = 1.0f / (1.0f + expf(-g));
        kcu_st(dinp, n * 2 * H + j, dy * u * s * (1.0f + g * (1.0f - s)));
        kcu_st(dinp, n * 2 * H + H + j, dy * g * s);
    }
}

void kiln__cuda_swiglu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                               int64_t N, int64_t H) {
    if (kcu_skip(be) || N * H <= 0)
        return;
    KCU_DISPATCH(dt, kcu_swiglu_forward<T><<<kcu_blocks(N * H, LL_THREADS), LL_THREADS, 0,
                                             kcu_st(be)->stream>>>((T *)out, (const T *)inp, N,
                                                                   H));
    KCU_LAUNCHED(be, "swiglu_forward");
}

void kiln__cuda_swiglu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                                const void *dout, int64_t N, int64_t H) {
    if (kcu_skip(be) || N * H <= 0)
        return;
    KCU_DISPATCH(dt, kcu_swiglu_backward<T><<<kcu_blocks(N * H, LL_THREADS), LL_THREADS, 0,
                                              kcu_st(be)->stream>>>(
                         (T *)dinp, (const T *)inp, (const T *)dout, N, H));
    KCU_LAUNCHED(be, "swiglu_backward");
}
