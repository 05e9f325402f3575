/* Causal self-attention, flash-style: no (B,NH,T,T) matrix in global memory.
 *
 * Forward: one block per (batch and head, tile of BR query rows). It keeps the queries in
 * shared memory and walks the key tiles up to the diagonal: scores for the tile, the
 * running row maximum and sum of exponentials (the online softmax), the output accumulated
 * in registers and rescaled when the maximum grows. It writes the output and each row's
 * log-sum-exp (lse). `saved` holds the lse (B,NH,T) fp32 and a copy of the output (B,T,C)
 * in the dtype: backward needs D = rowsum(dO * O) and the interface does not pass O.
 *
 * Backward recomputes the probabilities from the lse, P = exp(S - lse), in two kernels that
 * each own what they write, so no value is added to by two blocks (no atomics, the same bits
 * on every run): one per query tile for dQ = scale * dS K, one per key tile for
 * dK = scale * dS^T Q and dV = P^T dO, where dS = P (dP - D) and dP = dO V^T. D comes from a
 * small kernel first, into `scratch`.
 *
 * Grouped-query attention (NKV key/value heads, NH/NKV query heads reading each): qkv rows
 * are W = (NH + 2 NKV) hs wide; the forward and dQ kernels run a block per query head, reading
 * its group's key/value head; the dK/dV kernel runs a block per (batch row, key/value head, key
 * tile) that walks the group's query heads one after the other, each over its query tiles, so
 * a key/value head's gradient is summed in registers in one fixed order, without atomics or
 * scratch. NKV = NH is the multi-head layout (W = 3C).
 *
 * Decode (attention_decode) is the forward kernel with the queries at an offset: the last T
 * of the Tk cached rows of each sequence (ldT rows apart), attending to every row up to their
 * own; nothing saved.
 *
 * Threads: 128 per block, BR = BC = 32; four threads share a row (of queries in forward and
 * dQ, of keys in dK/dV), each with every fourth channel of the row's accumulators, and
 * eight of the tile's 32 columns of scores. Rows of the tiles in shared memory are padded
 * to HSP + 1 floats (HSP: the head size rounded up to 32, 64, 128 or 256), so the threads
 * of a warp reading different rows at the same channel hit different banks. Arithmetic in
 * fp32, operands widened from the dtype when loaded. Head sizes up to 256.
 *
 * In bf16 and fp16, head sizes that are multiples of 16 up to 128 run on tensor cores instead
 * (cuda_attention_tc.cu) while KILN_CUDA_TC_ATTENTION is on: the same `saved` and `scratch`, so
 * either forward pairs with either backward; D comes from the kernel here in both. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"

enum { BR = 32, BC = 32, ATT_THREADS = 128 };

static inline size_t round256(size_t x) { return (x + 255) & ~(size_t)255; }

/* saved: the lse (B,NH,T) fp32, then O (B,T,C) in dt; scratch: D (B,NH,T) fp32. Neither
 * depends on NKV: the dK/dV kernel sums a group's query heads in registers. */
size_t kiln__cuda_attention_saved_bytes(kiln_backend *be, kiln_dtype dt, int64_t B, int64_t T,
                                        int64_t C, int64_t NH, int64_t NKV) {
    (void)be, (void)NKV;
    return round256((size_t)(B * NH * T) * sizeof(float)) + (size_t)(B * T * C) * kiln_dtype_size(dt);
}

size_t kiln__cuda_attention_scratch_bytes(kiln_backend *be, kiln_dtype dt, int64_t B, int64_t T,
                                          int64_t C, int64_t NH, int64_t NKV) {
    (void)be, (void)dt, (void)C, (void)NKV;
    return round256((size_t)(B * NH * T) * sizeof(float));
}

/* rows x HSP values of q, k, v or a (B,T,C)-shaped tensor into tile (rows x SP floats),
 * zeros past the head size and past T. src points at channel 0 of the head at t = 0 of the
 * batch row; ld is the stride between positions. */
template <typename T, int HSP>
__device__ __forceinline__ void kcu_load_tile(float *tile, const T *src, int64_t ld, int64_t t0,
                                              int64_t T_, int hs) {
    const int SP = HSP + 1;
    for (int e = threadIdx.x; e < 32 * HSP; e += ATT_THREADS) {
        int r = e / HSP, i = e % HSP;
        float v = 0.0f;
        if (i < hs && t0 + r < T_)
            v = kcu_ld(src, (t0 + r) * ld + i);
        tile[r * SP + i] = v;
    }
}

template <int HSP>
__device__ __forceinline__ float kcu_dot(const float *a, const float *b, int hs) {
    float s = 0.0f;
    for (int i = 0; i < hs; i++)
        s += a[i] * b[i];
    return s;
}

template <int HSP> static size_t fwd_smem() {
    return (size_t)((BR + 2 * BC) * (HSP + 1) + BR * (BC + 1)) * sizeof(float);
}
template <int HSP> static size_t dq_smem() {
    return (size_t)((2 * BR + 2 * BC) * (HSP + 1) + BR * (BC + 1)) * sizeof(float);
}
template <int HSP> static size_t dkv_smem() {
    return (size_t)((2 * BR + 2 * BC) * (HSP + 1) + 2 * BC * (BR + 1) + 2 * BR) * sizeof(float);
}

/* grid: x = B*NH, y = query tiles (the longest, last, first). Each of the B sequences has ldT
 * rows of W = (NH + 2 NKV) hs; its Tq queries are rows qoff.. (0 in training, where
 * Tq = ldT = T), the keys rows 0..qoff+Tq-1; query row t sees keys up to qoff + t. out is
 * (B,Tq,C); lse (B,NH,Tq) and osave (B,Tq,C) are written unless NULL (decode). */
template <typename T, int HSP>
__global__ void __launch_bounds__(ATT_THREADS)
    kcu_attention_forward(T *out, float *lse, T *osave, const T *qkv, int64_t Tq, int64_t qoff,
                          int64_t ldT, int NH, int NKV, int hs, float scale) {
    const int SP = HSP + 1, KD = HSP / 4;
    extern __shared__ float sm[];
    float *Qs = sm, *Ks = Qs + BR * SP, *Vs = Ks + BC * SP, *Ps = Vs + BC * SP;
    int64_t C = (int64_t)NH * hs, W = C + 2 * (int64_t)NKV * hs, Tk = qoff + Tq;
    int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    int64_t q0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * BR;
    int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3;
    int64_t qi = q0 + r;
    const T *seq = qkv + b * ldT * W;
    const T *kb = seq + C + kvh * hs, *vb = kb + (int64_t)NKV * hs;
    kcu_load_tile<T, HSP>(Qs, seq + qoff * W + h * hs, W, q0, Tq, hs);
    float o[KD];
    for (int k = 0; k < KD; k++)
        o[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    /* keys below kend are all any row sees */
    int64_t kend = qoff + (q0 + BR < Tq ? q0 + BR : Tq);
    for (int64_t k0 = 0; k0 < kend; k0 += BC) {
        __syncthreads(); /* the previous tile's K, V and P are no longer read */
        kcu_load_tile<T, HSP>(Ks, kb, W, k0, Tk, hs);
        kcu_load_tile<T, HSP>(Vs, vb, W, k0, Tk, hs);
        __syncthreads();
        float sc[BC / 4], mx = -INFINITY;
        for (int j = 0; j < BC / 4; j++) {
            int c = q4 + 4 * j;
            float s = -INFINITY;
            if (k0 + c <= qoff + qi && qi < Tq)
                s = kcu_dot<HSP>(Qs + r * SP, Ks + c * SP, hs) * scale;
            sc[j] = s;
            mx = fmaxf(mx, s);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mnew = fmaxf(m, mx);
        float alpha = m == -INFINITY ? 0.0f : expf(m - mnew);
        float psum = 0.0f;
        for (int j = 0; j < BC / 4; j++) {
            float p = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - mnew);
            Ps[r * (BC + 1) + q4 + 4 * j] = p;
            psum += p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        psum += __shfl_xor_sync(0xffffffffu, psum, 2);
        l = l * alpha + psum;
        m = mnew;
        __syncwarp(); /* row r's P, written by its four lanes, is read by them */
        for (int k = 0; k < KD; k++)
            o[k] *= alpha;
        for (int c = 0; c < BC; c++) {
            float p = Ps[r * (BC + 1) + c];
            const float *v = Vs + c * SP + q4;
            for (int k = 0; k < KD; k++)
                o[k] += p * v[4 * k];
        }
    }
    if (qi < Tq) {
        float inv = 1.0f / l;
        int64_t at = (b * Tq + qi) * C + h * hs;
        for (int k = 0; k < KD; k++) {
            int d = q4 + 4 * k;
            if (d < hs) {
                kcu_st(out, at + d, o[k] * inv);
                if (osave)
                    kcu_st(osave, at + d, o[k] * inv);
            }
        }
        if (q4 == 0 && lse)
            lse[bh * Tq + qi] = m + logf(l);
    }
}

/* D[bh, t] = sum over the head's channels of dO * O: one warp per (b, t, h). */
template <typename T>
__global__ void kcu_attention_rowdot(float *D, const T *dout, const T *osave, int64_t B,
                                     int64_t T_, int64_t C, int NH, int hs) {
    int lane = threadIdx.x & 31;
    int64_t nw = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < B * T_ * NH;
         w += nw) { /* the same w in all lanes of a warp */
        int64_t h = w % NH, bt = w / NH, b = bt / T_, t = bt % T_;
        int64_t at = bt * C + h * hs;
        float s = 0.0f;
        for (int i = lane; i < hs; i += 32)
            s += kcu_ld(dout, at + i) * kcu_ld(osave, at + i);
        s = kcu_warp_sum(s);
        if (lane == 0)
            D[(b * NH + h) * T_ + t] = s;
    }
}

/* dQ: grid x = B*NH, y = query tiles; query head h reads key/value head h / (NH/NKV). */
template <typename T, int HSP>
__global__ void __launch_bounds__(ATT_THREADS)
    kcu_attention_backward_dq(T *dqkv, const T *dout, const T *qkv, const float *lse,
                              const float *D, int64_t T_, int NH, int NKV, int hs, float scale) {
    const int SP = HSP + 1, KD = HSP / 4;
    extern __shared__ float sm[];
    float *Qs = sm, *dOs = Qs + BR * SP, *Ks = dOs + BR * SP, *Vs = Ks + BC * SP,
          *dSs = Vs + BC * SP;
    int64_t C = (int64_t)NH * hs, W = C + 2 * (int64_t)NKV * hs;
    int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    int64_t q0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * BR;
    int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3;
    int64_t qi = q0 + r;
    const T *base = qkv + b * T_ * W + h * hs;
    const T *kb = qkv + b * T_ * W + C + kvh * hs, *vb = kb + (int64_t)NKV * hs;
    kcu_load_tile<T, HSP>(Qs, base, W, q0, T_, hs);
    kcu_load_tile<T, HSP>(dOs, dout + b * T_ * C + h * hs, C, q0, T_, hs);
    float lr = qi < T_ ? lse[bh * T_ + qi] : 0.0f, dr = qi < T_ ? D[bh * T_ + qi] : 0.0f;
    float dq[KD];
    for (int k = 0; k < KD; k++)
        dq[k] = 0.0f;
    int64_t qend = q0 + BR < T_ ? q0 + BR : T_;
    for (int64_t k0 = 0; k0 < qend; k0 += BC) {
        __syncthreads();
        kcu_load_tile<T, HSP>(Ks, kb, W, k0, T_, hs);
        kcu_load_tile<T, HSP>(Vs, vb, W, k0, T_, hs);
        __syncthreads();
        for (int j = 0; j < BC / 4; j++) {
            int c = q4 + 4 * j;
            float ds = 0.0f;
            if (k0 + c <= qi && qi < T_) {
                float p = expf(kcu_dot<HSP>(Qs + r * SP, Ks + c * SP, hs) * scale - lr);
                float dp = kcu_dot<HSP>(dOs + r * SP, Vs + c * SP, hs);
                ds = p * (dp - dr);
            }
            dSs[r * (BC + 1) + c] = ds;
        }
        __syncwarp();
        for (int c = 0; c < BC; c++) {
            float ds = dSs[r * (BC + 1) + c];
            const float *kk = Ks + c * SP + q4;
            for (int k = 0; k < KD; k++)
                dq[k] += ds * kk[4 * k];
        }
    }
    if (qi < T_) {
        int64_t at = (b * T_ + qi) * W + h * hs;
        for (int k = 0; k < KD; k++) {
            int d = q4 + 4 * k;
            if (d < hs)
                kcu_st(dqkv, at + d, dq[k] * scale);
        }
    }
}

/* dK, dV: grid x = B*NKV, y = key tiles (the longest, first, first). The block of key/value
 * head kvh sums over its group's query heads kvh * G .. kvh * G + G - 1 (G = NH/NKV), in that
 * order, each over its query tiles in order. */
template <typename T, int HSP>
__global__ void __launch_bounds__(ATT_THREADS)
    kcu_attention_backward_dkv(T *dqkv, const T *dout, const T *qkv, const float *lse,
                               const float *D, int64_t T_, int NH, int NKV, int hs,
                               float scale) {
    const int SP = HSP + 1, KD = HSP / 4;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + BC * SP, *Qs = Vs + BC * SP, *dOs = Qs + BR * SP,
          *Ps = dOs + BR * SP, *dSs = Ps + BC * (BR + 1), *Ls = dSs + BC * (BR + 1),
          *Ds = Ls + BR;
    int64_t C = (int64_t)NH * hs, W = C + 2 * (int64_t)NKV * hs;
    int G = NH / NKV;
    int64_t bk = blockIdx.x, b = bk / NKV, kvh = bk % NKV;
    int64_t k0 = (int64_t)blockIdx.y * BC;
    int tid = threadIdx.x, c = tid >> 2, q4 = tid & 3;
    int64_t kj = k0 + c;
    const T *kb = qkv + b * T_ * W + C + kvh * hs, *vb = kb + (int64_t)NKV * hs;
    kcu_load_tile<T, HSP>(Ks, kb, W, k0, T_, hs);
    kcu_load_tile<T, HSP>(Vs, vb, W, k0, T_, hs);
    float dk[KD], dv[KD];
    for (int k = 0; k < KD; k++)
        dk[k] = dv[k] = 0.0f;
    for (int64_t h = kvh * G; h < (kvh + 1) * G; h++) {
        int64_t bh = b * NH + h;
        const T *base = qkv + b * T_ * W + h * hs;
        const T *dbase = dout + b * T_ * C + h * hs;
        /* query tiles from the one holding query k0 (earlier queries see none of these keys) */
        for (int64_t q0 = k0 / BR * BR; q0 < T_; q0 += BR) {
            __syncthreads(); /* the previous query tile is no longer read */
            kcu_load_tile<T, HSP>(Qs, base, W, q0, T_, hs);
            kcu_load_tile<T, HSP>(dOs, dbase, C, q0, T_, hs);
            if (tid < BR) {
                int64_t qi = q0 + tid;
                Ls[tid] = qi < T_ ? lse[bh * T_ + qi] : 0.0f;
                Ds[tid] = qi < T_ ? D[bh * T_ + qi] : 0.0f;
            }
            __syncthreads();
            for (int j = 0; j < BR / 4; j++) {
                int r = q4 + 4 * j;
                int64_t qi = q0 + r;
                float p = 0.0f, ds = 0.0f;
                if (kj <= qi && qi < T_) {
                    p = expf(kcu_dot<HSP>(Qs + r * SP, Ks + c * SP, hs) * scale - Ls[r]);
                    float dp = kcu_dot<HSP>(dOs + r * SP, Vs + c * SP, hs);
                    ds = p * (dp - Ds[r]);
                }
                Ps[c * (BR + 1) + r] = p;
                dSs[c * (BR + 1) + r] = ds;
            }
            __syncwarp(); /* key row c's P and dS, written by its four lanes, are read by them */
            for (int r = 0; r < BR; r++) {
                float p = Ps[c * (BR + 1) + r], ds = dSs[c * (BR + 1) + r];
                const float *g = dOs + r * SP + q4, *q = Qs + r * SP + q4;
                for (int k = 0; k < KD; k++) {
                    dv[k] += p * g[4 * k];
                    dk[k] += ds * q[4 * k];
                }
            }
        }
    }
    if (kj < T_) {
        int64_t at = (b * T_ + kj) * W + C + kvh * hs;
        for (int k = 0; k < KD; k++) {
            int d = q4 + 4 * k;
            if (d < hs) {
                kcu_st(dqkv, at + d, dk[k] * scale);
                kcu_st(dqkv, at + (int64_t)NKV * hs + d, dv[k]);
            }
        }
    }
}

/* The padded head size for hs, 0 when too large. */
static int head_pad(int64_t hs) {
    return hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= 128 ? 128 : hs <= 256 ? 256 : 0;
}

/* Whether the kernels take the shape (T query rows), the error recorded when not. */
static int check_shape(kiln_backend *be, const char *op, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t NKV) {
    if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || NH > 0x7fffffffLL) {
        kiln_backend_fail(be, KILN_ERR_UNSUPPORTED,
                          "cuda %s: %lld query heads, %lld key/value heads: the key/value heads "
                          "must divide the query heads",
                          op, (long long)NH, (long long)NKV);
        return 0;
    }
    if (C % NH != 0 || head_pad(C / NH) == 0 || B * NH > 0x7fffffffLL ||
        (T + BR - 1) / BR > 65535) {
        kiln_backend_fail(be, KILN_ERR_UNSUPPORTED,
                          "cuda %s: C %lld, %lld heads, T %lld: the head size must divide C and "
                          "be at most 256, and T at most %d",
                          op, (long long)C, (long long)NH, (long long)T, 65535 * BR);
        return 0;
    }
    return 1;
}

/* Training's forward (qoff = 0, Tq = ldT = T) and decode's. */
template <typename T, int HSP>
static void launch_forward(kiln_backend *be, T *out, float *lse, T *osave, const T *qkv,
                           int64_t B, int64_t Tq, int64_t qoff, int64_t ldT, int64_t C, int64_t NH,
                           int64_t NKV) {
    size_t smem = fwd_smem<HSP>();
    if (KCU_CHECK(be, cudaFuncSetAttribute(kcu_attention_forward<T, HSP>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem)))
        return;
    int hs = (int)(C / NH);
    dim3 grid((unsigned)(B * NH), (unsigned)((Tq + BR - 1) / BR));
    kcu_attention_forward<T, HSP><<<grid, ATT_THREADS, smem, kcu_st(be)->stream>>>(
        out, lse, osave, qkv, Tq, qoff, ldT, (int)NH, (int)NKV, hs, 1.0f / sqrtf((float)hs));
    KCU_LAUNCHED(be, lse ? "attention_forward" : "attention_decode");
}

/* D = rowsum(dO * O) into scratch, for either backward. */
template <typename T>
static void launch_rowdot(kiln_backend *be, float *D, const T *dout, const T *osave, int64_t B,
                          int64_t T_, int64_t C, int64_t NH) {
    int64_t warps = B * T_ * NH;
    kcu_attention_rowdot<T><<<kcu_blocks(warps * 32, 256), 256, 0, kcu_st(be)->stream>>>(
        D, dout, osave, B, T_, C, (int)NH, (int)(C / NH));
    KCU_LAUNCHED(be, "attention_backward (D)");
}

template <typename T, int HSP>
static void launch_backward(kiln_backend *be, T *dqkv, const float *D, const T *dout, const T *qkv,
                            const float *lse, int64_t B, int64_t T_, int64_t C, int64_t NH,
                            int64_t NKV) {
    cudaStream_t st = kcu_st(be)->stream;
    int hs = (int)(C / NH);
    float scale = 1.0f / sqrtf((float)hs);
    size_t s1 = dq_smem<HSP>(), s2 = dkv_smem<HSP>();
    if (KCU_CHECK(be, cudaFuncSetAttribute(kcu_attention_backward_dq<T, HSP>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1)) ||
        KCU_CHECK(be, cudaFuncSetAttribute(kcu_attention_backward_dkv<T, HSP>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2)))
        return;
    dim3 grid((unsigned)(B * NH), (unsigned)((T_ + BR - 1) / BR));
    kcu_attention_backward_dq<T, HSP><<<grid, ATT_THREADS, s1, st>>>(dqkv, dout, qkv, lse, D, T_,
                                                                     (int)NH, (int)NKV, hs, scale);
    if (KCU_LAUNCHED(be, "attention_backward (dq)"))
        return;
    dim3 grid2((unsigned)(B * NKV), (unsigned)((T_ + BC - 1) / BC));
    kcu_attention_backward_dkv<T, HSP><<<grid2, ATT_THREADS, s2, st>>>(
        dqkv, dout, qkv, lse, D, T_, (int)NH, (int)NKV, hs, scale);
    KCU_LAUNCHED(be, "attention_backward (dk, dv)");
}

template <typename T>
static void forward_dt(kiln_backend *be, int hsp, T *out, float *lse, T *osave, const T *qkv,
                       int64_t B, int64_t Tq, int64_t qoff, int64_t ldT, int64_t C, int64_t NH,
                       int64_t NKV) {
#define FWD_(HSP) launch_forward<T, HSP>(be, out, lse, osave, qkv, B, Tq, qoff, ldT, C, NH, NKV)
    switch (hsp) {
    case 32: FWD_(32); break;
    case 64: FWD_(64); break;
    case 128: FWD_(128); break;
    default: FWD_(256); break;
    }
#undef FWD_
}

template <typename T>
static void backward_dt(kiln_backend *be, int hsp, T *dqkv, const float *D, const T *dout,
                        const T *qkv, const float *lse, int64_t B, int64_t T_, int64_t C,
                        int64_t NH, int64_t NKV) {
#define BWD_(HSP) launch_backward<T, HSP>(be, dqkv, D, dout, qkv, lse, B, T_, C, NH, NKV)
    switch (hsp) {
    case 32: BWD_(32); break;
    case 64: BWD_(64); break;
    case 128: BWD_(128); break;
    default: BWD_(256); break;
    }
#undef BWD_
}

/* The tensor-core kernels (cuda_attention_tc.cu) when the flag is on and they fit: bf16 or
 * fp16, a head size that is a multiple of 16 up to 128, 16-byte aligned tensors. */
static int use_tc(kiln_backend *be, kiln_dtype dt, int64_t hs, const void *a, const void *b,
                  const void *c) {
    uintptr_t any = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return kcu_st(be)->tc_attention && kcu_attention_tc_fits(dt, hs) && any % 16 == 0;
}

void kiln__cuda_attention_forward(kiln_backend *be, kiln_dtype dt, void *out, void *saved,
                                  void *scratch, const void *qkv, int64_t B, int64_t Tn,
                                  int64_t C, int64_t NH, int64_t NKV) {
    (void)scratch;
    if (kcu_skip(be) || B * Tn <= 0 || !check_shape(be, "attention_forward", B, Tn, C, NH, NKV))
        return;
    float *lse = (float *)saved;
    void *osave = (char *)saved + round256((size_t)(B * NH * Tn) * sizeof(float));
    if (use_tc(be, dt, C / NH, out, osave, qkv)) {
        kcu_attention_tc_forward(be, dt, out, lse, osave, qkv, B, Tn, C, NH, NKV);
        return;
    }
    int hsp = head_pad(C / NH);
    KCU_DISPATCH(dt, forward_dt<T>(be, hsp, (T *)out, lse, (T *)osave, (const T *)qkv, B, Tn, 0,
                                   Tn, C, NH, NKV));
}

void kiln__cuda_attention_decode(kiln_backend *be, kiln_dtype dt, void *out, const void *qkv,
                                 int64_t B, int64_t ldT, int64_t Tk, int64_t Tn, int64_t C,
                                 int64_t NH, int64_t NKV) {
    if (kcu_skip(be) || B * Tn <= 0 || !check_shape(be, "attention_decode", B, Tn, C, NH, NKV))
        return;
    if (Tk < Tn || Tk > ldT) {
        kiln_backend_fail(be, KILN_ERR_ARG,
                          "cuda attention_decode: %lld rows of %lld filled of %lld per sequence",
                          (long long)Tn, (long long)Tk, (long long)ldT);
        return;
    }
    int hsp = head_pad(C / NH);
    KCU_DISPATCH(dt, forward_dt<T>(be, hsp, (T *)out, (float *)NULL, (T *)NULL, (const T *)qkv, B,
                                   Tn, Tk - Tn, ldT, C, NH, NKV));
}

void kiln__cuda_attention_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, void *scratch,
                                   const void *dout, const void *qkv, const void *saved,
                                   int64_t B, int64_t Tn, int64_t C, int64_t NH, int64_t NKV) {
    if (kcu_skip(be) || B * Tn <= 0 ||
        !check_shape(be, "attention_backward", B, Tn, C, NH, NKV))
        return;
    const float *lse = (const float *)saved;
    const void *osave = (const char *)saved + round256((size_t)(B * NH * Tn) * sizeof(float));
    float *D = (float *)scratch;
    KCU_DISPATCH(dt, launch_rowdot<T>(be, D, (const T *)dout, (const T *)osave, B, Tn, C, NH));
    if (kcu_skip(be))
        return;
    if (use_tc(be, dt, C / NH, dqkv, dout, qkv)) {
        kcu_attention_tc_backward(be, dt, dqkv, D, dout, qkv, lse, B, Tn, C, NH, NKV);
        return;
    }
    int hsp = head_pad(C / NH);
    KCU_DISPATCH(dt, backward_dt<T>(be, hsp, (T *)dqkv, D, (const T *)dout, (const T *)qkv, lse, B,
                                    Tn, C, NH, NKV));
}
