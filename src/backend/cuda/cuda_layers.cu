/* The CUDA backend's layer kernels other than products and attention: embedding, LayerNorm
 * (and the residual add fused with it), GELU, residual, the fused softmax cross-entropy,
 * and the column sums that parameter gradients need. Each loads its dtype, computes in fp32
 * (sums of a softmax in double) and rounds once when it stores.
 *
 * No kernel here adds with atomics: a sum over rows (a bias or LayerNorm gradient, the
 * embedding's) is split into fixed chunks of rows, each chunk summed in order by one
 * thread per column, then the chunks added in order; so the bits depend on the sizes
 * alone, not on scheduling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f
#define LN_EPS 1e-5f

enum { COL_THREADS = 128, ROW_WARPS = 4 };

/* Rows per chunk of a column sum: 32, or more when N is so large that the chunks would
 * pass the grid's y limit. */
int64_t kcu_rows_per_chunk(int64_t N) {
    int64_t r = (N + 65534) / 65535;
    return r > 32 ? r : 32;
}

/* ---- embedding ---- */

template <typename T>
__global__ void kcu_encoder_forward(T *out, const int32_t *ids, const T *wte, const T *wpe,
                                    int64_t N, int64_t T_, int64_t C) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * C;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t bt = i / C, c = i % C, t = bt % T_;
        float pe = wpe ? kcu_ld(wpe, t * C + c) : 0.0f; /* NULL: rotary positions, none here */
        kcu_st(out, i, kcu_ld(wte, (int64_t)ids[bt] * C + c) + pe);
    }
}

void kiln__cuda_encoder_forward(kiln_backend *be, kiln_dtype dt, void *out, const int32_t *inp,
                                const void *wte, const void *wpe, int64_t B, int64_t Tn,
                                int64_t C) {
    if (kcu_skip(be) || B * Tn * C <= 0)
        return;
    kcu_state *s = kcu_st(be);
    const int32_t *ids = kcu_device_ids(be, &s->ids, inp, B * Tn);
    if (!ids)
        return;
    KCU_DISPATCH(dt, kcu_encoder_forward<T><<<kcu_blocks(B * Tn * C, 256), 256, 0, s->stream>>>(
                         (T *)out, ids, (const T *)wte, (const T *)wpe, B * Tn, Tn, C));
    KCU_LAUNCHED(be, "encoder_forward");
}

/* dwte: the positions grouped by token on the host (a counting sort, stable), one block
 * row per distinct token adding its positions' gradients in position order. */
template <typename T>
__global__ void kcu_encoder_backward_wte(float *dwte, const T *dout, const int32_t *order,
                                         const int32_t *start, const int32_t *tok, int64_t C) {
    int64_t seg = blockIdx.x, c = blockIdx.y * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float acc = 0.0f;
    for (int32_t k = start[seg]; k < start[seg + 1]; k++)
        acc += kcu_ld(dout, (int64_t)order[k] * C + c);
    dwte[(int64_t)tok[seg] * C + c] += acc;
}

template <typename T>
__global__ void kcu_encoder_backward_wpe(float *dwpe, const T *dout, int64_t B, int64_t T_,
                                         int64_t C) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T_ * C;
         i += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int64_t b = 0; b < B; b++)
            acc += kcu_ld(dout, b * T_ * C + i);
        dwpe[i] += acc;
    }
}

void kiln__cuda_encoder_backward(kiln_backend *be, kiln_dtype dt, float *dwte, float *dwpe,
                                 const void *dout, const int32_t *inp, int64_t B, int64_t Tn,
                                 int64_t C) {
    if (kcu_skip(be) || B * Tn * C <= 0)
        return;
    kcu_state *s = kcu_st(be);
    int64_t N = B * Tn;
    if (!dwte && !dwpe)
        return;
    if (!dwte) { /* wpe alone */
        KCU_DISPATCH(dt, {
            kcu_encoder_backward_wpe<T><<<kcu_blocks(Tn * C, 256), 256, 0, s->stream>>>(
                dwpe, (const T *)dout, B, Tn, C);
        });
        KCU_LAUNCHED(be, "encoder_backward");
        return;
    }
    const int32_t *ids = kcu_host_ids(be, inp, N);
    if (!ids)
        return;
    int32_t maxid = 0;
    for (int64_t i = 0; i < N; i++)
        maxid = ids[i] > maxid ? ids[i] : maxid;
    /* host layout: order (N), start (nseg+1), tok (nseg), then the counts (maxid+2) */
    size_t words = (size_t)N + 2 * (size_t)N + 1 + (size_t)maxid + 2;
    int32_t *h = (int32_t *)kcu_grow_host(be, &s->hbuf, words * sizeof(int32_t));
    if (!h)
        return;
    int32_t *order = h, *start = h + N, *count = h + 3 * N + 1;
    memset(count, 0, ((size_t)maxid + 2) * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        count[ids[i] + 1]++;
    int64_t nseg = 0;
    for (int32_t v = 0; v <= maxid; v++)
        nseg += count[v + 1] > 0;
    int32_t *tok = start + nseg + 1;
    int64_t k = 0;
    for (int32_t v = 0; v <= maxid; v++) { /* count[v]: first slot of token v */
        if (count[v + 1] > 0) {
            start[k] = count[v];
            tok[k++] = v;
        }
        count[v + 1] += count[v];
    }
    start[nseg] = (int32_t)N;
    for (int64_t i = 0; i < N; i++)
        order[count[ids[i]]++] = (int32_t)i;
    /* order, start and tok lie one after the other: one copy */
    size_t packed = (size_t)N + 2 * (size_t)nseg + 1;
    int32_t *d = (int32_t *)kcu_grow(be, &s->ids, packed * sizeof(int32_t));
    if (!d || KCU_CHECK(be, cudaMemcpyAsync(d, h, packed * sizeof(int32_t),
                                            cudaMemcpyHostToDevice, s->stream)))
        return;
    dim3 grid((unsigned)nseg, (unsigned)((C + COL_THREADS - 1) / COL_THREADS));
    KCU_DISPATCH(dt, {
        kcu_encoder_backward_wte<T><<<grid, COL_THREADS, 0, s->stream>>>(
            dwte, (const T *)dout, d, d + N, d + N + nseg + 1, C);
        if (dwpe) /* NULL: no position embedding */
            kcu_encoder_backward_wpe<T><<<kcu_blocks(Tn * C, 256), 256, 0, s->stream>>>(
                dwpe, (const T *)dout, B, Tn, C);
    });
    KCU_LAUNCHED(be, "encoder_backward");
}

/* ---- LayerNorm: one warp per row ---- */

/* With a (and b): x = a + b rounded to T and stored in res (res may be a or b), without b
 * x = a (kcu_norm_row). */
template <typename T>
__global__ void kcu_layernorm_forward(T *out, float *mean, float *rstd, T *res, const T *a,
                                      const T *b, const T *w, const T *bias, int64_t N,
                                      int64_t C) {
    int lane = threadIdx.x & 31;
    int64_t row = blockIdx.x * (int64_t)ROW_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    float sum;
    const T *x = kcu_norm_row(res, a, b, row, C, 0, &sum);
    float m = kcu_warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float d = kcu_ld(x, c) - m;
        var += d * d;
    }
    var = kcu_warp_sum(var) / (float)C;
    float s = 1.0f / sqrtf(var + LN_EPS);
    T *o = out + row * C;
    for (int64_t c = lane; c < C; c += 32)
        kcu_st(o, c, (kcu_ld(x, c) - m) * s * kcu_ld(w, c) + kcu_ld(bias, c));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

void kiln__cuda_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *mean,
                                  float *rstd, const void *inp, const void *weight,
                                  const void *bias, int64_t N, int64_t C) {
    if (kcu_skip(be) || N <= 0)
        return;
    unsigned grid = (unsigned)((N + ROW_WARPS - 1) / ROW_WARPS);
    KCU_DISPATCH(dt, kcu_layernorm_forward<T><<<grid, 32 * ROW_WARPS, 0, kcu_st(be)->stream>>>(
                         (T *)out, mean, rstd, (T *)NULL, (const T *)inp, (const T *)NULL,
                         (const T *)weight, (const T *)bias, N, C));
    KCU_LAUNCHED(be, "layernorm_forward");
}

void kiln__cuda_residual_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                           float *mean, float *rstd, const void *a, const void *b,
                                           const void *weight, const void *bias, int64_t N,
                                           int64_t C) {
    if (kcu_skip(be) || N <= 0)
        return;
    unsigned grid = (unsigned)((N + ROW_WARPS - 1) / ROW_WARPS);
    KCU_DISPATCH(dt, kcu_layernorm_forward<T><<<grid, 32 * ROW_WARPS, 0, kcu_st(be)->stream>>>(
                         (T *)out, mean, rstd, (T *)res, (const T *)a, (const T *)b,
                         (const T *)weight, (const T *)bias, N, C));
    KCU_LAUNCHED(be, "residual_layernorm_forward");
}

/* dx += rstd (g - mean(g) - xhat mean(g xhat)), g = weight * dout, per row. */
template <typename T>
__global__ void kcu_layernorm_backward_dx(T *dinp, const T *dout, const T *inp, const T *w,
                                          const float *mean, const float *rstd, int64_t N,
                                          int64_t C) {
    int lane = threadIdx.x & 31;
    int64_t row = blockIdx.x * (int64_t)ROW_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const T *x = inp + row * C, *d = dout + row * C;
    float m = mean[row], s = rstd[row];
    float gs = 0.0f, gxs = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float g = kcu_ld(w, c) * kcu_ld(d, c);
        gs += g;
        gxs += g * (kcu_ld(x, c) - m) * s;
    }
    float gmean = kcu_warp_sum(gs) / (float)C, gxmean = kcu_warp_sum(gxs) / (float)C;
    T *dx = dinp + row * C;
    for (int64_t c = lane; c < C; c += 32) {
        float xhat = (kcu_ld(x, c) - m) * s;
        float g = kcu_ld(w, c) * kcu_ld(d, c);
        kcu_st(dx, c, kcu_ld((const T *)dx, c) + s * (g - gmean - xhat * gxmean));
    }
}

/* Per chunk of rows and column: sum of xhat * dout and of dout, into part (chunk, 2, C). */
template <typename T>
__global__ void kcu_layernorm_backward_parts(float *part, const T *dout, const T *inp,
                                             const float *mean, const float *rstd, int64_t N,
                                             int64_t C, int64_t rpc) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= C)
        return;
    int64_t r0 = k * rpc, r1 = r0 + rpc < N ? r0 + rpc : N;
    float dw = 0.0f, db = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        float d = kcu_ld(dout, r * C + c);
        dw += (kcu_ld(inp, r * C + c) - mean[r]) * rstd[r] * d;
        db += d;
    }
    part[k * 2 * C + c] = dw;
    part[k * 2 * C + C + c] = db;
}

/* dst_j[c] += sum over chunks k of part[k * stride + j * cols + c], j < nsum, in k order. */
__global__ void kcu_sum_parts(float *dst0, float *dst1, const float *part, int64_t chunks,
                              int64_t cols, int64_t stride) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    float s0 = 0.0f, s1 = 0.0f;
    for (int64_t k = 0; k < chunks; k++) {
        s0 += part[k * stride + c];
        if (dst1)
            s1 += part[k * stride + cols + c];
    }
    dst0[c] += s0;
    if (dst1)
        dst1[c] += s1;
}

void kiln__cuda_layernorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                   float *dbias, const void *dout, const void *inp,
                                   const void *weight, const float *mean, const float *rstd,
                                   int64_t N, int64_t C) {
    if (kcu_skip(be) || N <= 0)
        return;
    kcu_state *s = kcu_st(be);
    int64_t rpc = kcu_rows_per_chunk(N), chunks = (N + rpc - 1) / rpc;
    float *part = (float *)kcu_grow(be, &s->part, (size_t)(chunks * 2 * C) * sizeof(float));
    if (!part)
        return;
    unsigned rows = (unsigned)((N + ROW_WARPS - 1) / ROW_WARPS);
    dim3 grid((unsigned)((C + COL_THREADS - 1) / COL_THREADS), (unsigned)chunks);
    unsigned cols = (unsigned)((C + COL_THREADS - 1) / COL_THREADS);
    KCU_DISPATCH(dt, {
        kcu_layernorm_backward_dx<T><<<rows, 32 * ROW_WARPS, 0, s->stream>>>(
            (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, N, C);
        kcu_layernorm_backward_parts<T><<<grid, COL_THREADS, 0, s->stream>>>(
            part, (const T *)dout, (const T *)inp, mean, rstd, N, C, rpc);
    });
    kcu_sum_parts<<<cols, COL_THREADS, 0, s->stream>>>(dweight, dbias, part, chunks, C, 2 * C);
    KCU_LAUNCHED(be, "layernorm_backward");
}

void kcu_add_parts(kiln_backend *be, float *dst0, float *dst1, const float *part, int64_t chunks,
                   int64_t cols, int64_t stride) {
    if (kcu_skip(be) || cols <= 0)
        return;
    unsigned cb = (unsigned)((cols + COL_THREADS - 1) / COL_THREADS);
    kcu_sum_parts<<<cb, COL_THREADS, 0, kcu_st(be)->stream>>>(dst0, dst1, part, chunks, cols,
                                                              stride);
    KCU_LAUNCHED(be, "column sums (chunks)");
}

/* Column sums of x (N, cols) into dst (+=), the bias gradient of a product. */
template <typename T>
__global__ void kcu_column_parts(float *part, const T *x, int64_t N, int64_t cols, int64_t rpc) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= cols)
        return;
    int64_t r0 = k * rpc, r1 = r0 + rpc < N ? r0 + rpc : N;
    float s = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        s += kcu_ld(x, r * cols + c);
    part[k * cols + c] = s;
}

void kcu_column_sums(kiln_backend *be, kiln_dtype dt, float *dst, const void *x, int64_t N,
                     int64_t cols) {
    if (kcu_skip(be) || N <= 0 || cols <= 0)
        return;
    kcu_state *s = kcu_st(be);
    int64_t rpc = kcu_rows_per_chunk(N), chunks = (N + rpc - 1) / rpc;
    float *part = (float *)kcu_grow(be, &s->part, (size_t)(chunks * cols) * sizeof(float));
    if (!part)
        return;
    unsigned cb = (unsigned)((cols + COL_THREADS - 1) / COL_THREADS);
    dim3 grid(cb, (unsigned)chunks);
    KCU_DISPATCH(dt, kcu_column_parts<T><<<grid, COL_THREADS, 0, s->stream>>>(
                         part, (const T *)x, N, cols, rpc));
    kcu_sum_parts<<<cb, COL_THREADS, 0, s->stream>>>(dst, NULL, part, chunks, cols, cols);
    KCU_LAUNCHED(be, "column sums");
}

/* ---- elementwise ---- */

__device__ __forceinline__ float kcu_gelu(float x) {
    float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

template <typename T> __global__ void kcu_gelu_forward(T *out, const T *inp, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        kcu_st(out, i, kcu_gelu(kcu_ld(inp, i)));
}

template <typename T>
__global__ void kcu_gelu_backward(T *dinp, const T *inp, const T *dout, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = kcu_ld(inp, i);
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float th = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        kcu_st(dinp, i, grad * kcu_ld(dout, i));
    }
}

template <typename T>
__global__ void kcu_residual_forward(T *out, const T *a, const T *b, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        kcu_st(out, i, kcu_ld(a, i) + kcu_ld(b, i));
}

void kiln__cuda_gelu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                             int64_t n) {
    if (kcu_skip(be) || n <= 0)
        return;
    KCU_DISPATCH(dt, kcu_gelu_forward<T><<<kcu_blocks(n, 256), 256, 0, kcu_st(be)->stream>>>(
                         (T *)out, (const T *)inp, n));
    KCU_LAUNCHED(be, "gelu_forward");
}

void kiln__cuda_gelu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                              const void *dout, int64_t n) {
    if (kcu_skip(be) || n <= 0)
        return;
    KCU_DISPATCH(dt, kcu_gelu_backward<T><<<kcu_blocks(n, 256), 256, 0, kcu_st(be)->stream>>>(
                         (T *)dinp, (const T *)inp, (const T *)dout, n));
    KCU_LAUNCHED(be, "gelu_backward");
}

void kiln__cuda_residual_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *a,
                                 const void *b, int64_t n) {
    if (kcu_skip(be) || n <= 0)
        return;
    KCU_DISPATCH(dt, kcu_residual_forward<T><<<kcu_blocks(n, 256), 256, 0, kcu_st(be)->stream>>>(
                         (T *)out, (const T *)a, (const T *)b, n));
    KCU_LAUNCHED(be, "residual_forward");
}

/* ---- softmax cross-entropy: one block per row ---- */

enum { CE_THREADS = 512 };

/* The block's maximum (every thread gets it). */
__device__ float kcu_block_max(float v, float *shared) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kcu_warp_max(v);
    __syncthreads();
    if (lane == 0)
        shared[w] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : -INFINITY;
    return kcu_warp_max(v);
}

/* The block's sum in double, in a fixed order (every thread gets it). */
__device__ double kcu_block_sum_all_d(double v, double *shared) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kcu_warp_sum_d(v);
    __syncthreads();
    if (lane == 0)
        shared[w] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : 0.0;
    return kcu_warp_sum_d(v);
}

/* Every value of the row is read (two passes) before the block's barriers, and written
 * after them by the thread that read it, so dlogits may alias logits. */
template <typename T>
__global__ void kcu_crossentropy(float *losses, T *dlogits, const T *logits,
                                 const int32_t *targets, float dloss, int64_t V, int64_t Vp) {
    __shared__ float smax[32];
    __shared__ double ssum[32];
    int64_t n = blockIdx.x;
    const T *x = logits + n * Vp;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, kcu_ld(x, i));
    mx = kcu_block_max(mx, smax);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        sum += (double)expf(kcu_ld(x, i) - mx);
    sum = kcu_block_sum_all_d(sum, ssum);
    double logz = (double)mx + log(sum);
    int64_t y = targets[n];
    if (threadIdx.x == 0)
        losses[n] = (float)(logz - (double)kcu_ld(x, y));
    __syncthreads(); /* x[y] is read before any thread may overwrite it */
    if (!dlogits)
        return;
    T *d = dlogits + n * Vp;
    for (int64_t i = threadIdx.x; i < Vp; i += blockDim.x) {
        float v = 0.0f;
        if (i < V) {
            float p = expf((float)((double)kcu_ld(x, i) - logz));
            v = (p - (i == y ? 1.0f : 0.0f)) * dloss;
        }
        kcu_st(d, i, v);
    }
}

void kiln__cuda_crossentropy_forward_backward(kiln_backend *be, kiln_dtype dt, float *losses,
                                              void *dlogits, const void *logits,
                                              const int32_t *targets, float dloss, int64_t N,
                                              int64_t V, int64_t Vp) {
    if (kcu_skip(be) || N <= 0)
        return;
    kcu_state *s = kcu_st(be);
    const int32_t *tg = kcu_device_ids(be, &s->tgt, targets, N);
    if (!tg)
        return;
    KCU_DISPATCH(dt, kcu_crossentropy<T><<<(unsigned)N, CE_THREADS, 0, s->stream>>>(
                         losses, (T *)dlogits, (const T *)logits, tg, dloss, V, Vp));
    KCU_LAUNCHED(be, "crossentropy_forward_backward");
}
