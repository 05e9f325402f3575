/* Causal self-attention on tensor cores: bf16 and fp16 operands, fp32 accumulation, head sizes
 * that are multiples of 16 up to 128. The same decomposition, outputs, `saved` and `scratch` as
 * the CUDA-core kernels of cuda_attention.cu (which pick between the two), so the forward of
 * either pairs with the backward of the other:
 *
 *   forward   one block per (batch and head, tile of 64 query rows): O and the lse;
 *   dq        one block per (batch and head, tile of 64 query rows): dQ = scale dS K;
 *   dkv       one block per (batch and key/value head, tile of 64 keys): dK = scale dS^T Q,
 *             dV = P^T dO, summed over the group's query heads (NH/NKV of them, in order);
 *
 * where S = scale Q K^T (causal), P = softmax(S) = exp(S - lse), dP = dO V^T and
 * dS = P (dP - D), D = rowsum(dO O) from cuda_attention.cu's kernel. qkv rows are
 * W = (NH + 2 NKV) hs wide, query head h reading key/value head h / (NH/NKV). Each block owns
 * what it writes and sums in a fixed order: no atomics, the same bits on every run.
 *
 * 128 threads, four warps; a warp owns 16 rows of the block's tile (queries, or keys in dkv).
 * Products are WMMA m16n16k16 fragments loaded from shared memory; their fp32 results go to
 * a warp's own fp32 tile in shared memory (store_matrix_sync), where its lanes (two per row,
 * each with every other column) apply the scale, the causal mask, the softmax and
 * dS = P (dP - D) in fp32, and write P and dS back rounded to the dtype as the next
 * product's operand. The forward keeps O in registers in that same lane layout (so the
 * online softmax rescales rows the lanes own) and adds each tile's P V to it through the
 * fp32 tile; dQ, dK, dV stay in accumulator fragments and leave through the fp32 tile.
 *
 * Shared memory (HSP: the head size padded to 32, 64 or 128, with zero channels): 16-bit
 * tiles of 64 rows of HSP + 8 elements (16 bytes more per row spreads a warp's fragment
 * loads over the banks), fp32 tiles of 16 rows of 64 + 4 floats per warp, 16-bit P and dS
 * of 64 rows of 64 + 8. WMMA needs leading dimensions in multiples of 16 bytes and fragment
 * pointers on 32-byte boundaries: every tile and every 16 x 16 block in it starts on one. */
#include <math.h>
#include <mma.h>

#include "backend/cuda/cuda_internal.cuh"

/* ---- kernels ---- */

namespace wmma = nvcuda::wmma;

/* TQ = TK: the diagonal key tile of a query tile is the one that starts at the same row. */
enum { TQ = 64, TK = 64, TC_THREADS = 128, LDS = TK + 4, LDP = TK + 8 };

template <int HSP> struct tc_dims {
    static constexpr int LDH = HSP + 8;                    /* 16-bit tiles' row, elements */
    static constexpr size_t TILE = (size_t)TQ * LDH * 2;   /* bytes of a 16-bit tile */
    static constexpr size_t WARPS_S = 4 * 16 * LDS * 4;    /* the warps' fp32 tiles */
    static constexpr size_t PT = (size_t)TQ * LDP * 2;     /* a 16-bit P or dS tile */
    static constexpr size_t fwd = 3 * TILE + WARPS_S + PT; /* Q, K, V; S; P */
    static constexpr size_t dq = 4 * TILE + WARPS_S + PT;  /* Q, dO, K, V; S or dP; dS */
    /* K, V, Q, dO; S^T or dP^T; P^T, dS^T; lse, D */
    static constexpr size_t dkv = 4 * TILE + WARPS_S + 2 * PT + 2 * TQ * sizeof(float);
};

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_acc;

/* Rows t0..t0+63 of a (T, ld) tensor, channels 0..HSP-1, into tile (64 x HSP + 8): zeros
 * past T and past the head size hs. 16 bytes at a time: src (channel 0 of the head at t = 0)
 * is 16-byte aligned, ld and hs are multiples of 8. */
template <typename T, int HSP>
__device__ __forceinline__ void tc_load(T *tile, const T *src, int64_t ld, int64_t t0, int64_t T_,
                                        int hs) {
    constexpr int VR = HSP / 8, LDH = HSP + 8;
    for (int e = threadIdx.x; e < TQ * VR; e += TC_THREADS) {
        int r = e / VR, i = e % VR * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (i < hs && t0 + r < T_)
            v = *reinterpret_cast<const uint4 *>(src + (t0 + r) * ld + i);
        *reinterpret_cast<uint4 *>(tile + r * LDH + i) = v;
    }
}

/* How many 16-row chunks of a tile cover its first n rows, at most 4. */
__device__ __forceinline__ int tc_chunks(int64_t n) {
    return n <= 0 ? 0 : n >= TK ? 4 : (int)((n + 15) / 16);
}

/* The warp's S (16 x 64, fp32, ld LDS), 16 columns at a time for chunks n0..n1-1:
 * S[:, 16 nt..] = A (16 rows x HSP, ld LDH) times the transpose of rows 16 nt.. of Bm. */
template <typename T, int HSP>
__device__ __forceinline__ void tc_scores(float *S, const T *A, const T *Bm, int n0, int n1) {
    constexpr int LDH = HSP + 8;
    for (int nt = n0; nt < n1; nt++) {
        tc_acc s;
        wmma::fill_fragment(s, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HSP / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bt;
            wmma::load_matrix_sync(a, A + 16 * kk, LDH);
            wmma::load_matrix_sync(bt, Bm + 16 * nt * LDH + 16 * kk, LDH); /* (k, n) at [n][k] */
            wmma::mma_sync(s, a, bt, s);
        }
        wmma::store_matrix_sync(S + 16 * nt, s, LDS, wmma::mem_row_major);
    }
}

/* acc[c] += A (16 x 64, ld LDP; its 16-column chunks n0..n1-1) times rows 16 n0 .. 16 n1 - 1
 * of Bm (64 x HSP, ld LDH), for the 16-column chunks c of HSP. */
template <typename T, int HSP>
__device__ __forceinline__ void tc_accumulate(tc_acc *acc, const T *A, const T *Bm, int n0,
                                              int n1) {
    constexpr int LDH = HSP + 8;
    for (int kt = n0; kt < n1; kt++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::load_matrix_sync(a, A + 16 * kt, LDP);
#pragma unroll
        for (int c = 0; c < HSP / 16; c++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bm;
            wmma::load_matrix_sync(bm, Bm + 16 * kt * LDH + 16 * c, LDH);
            wmma::mma_sync(acc[c], a, bm, acc[c]);
        }
    }
}

/* The warp's 16 rows of acc (16 x HSP) times mul into dst, rows t0.. (those below T) of a
 * tensor of row stride ld, channels 0..hs-1, through the warp's fp32 tile S, 64 channels at
 * a time (consecutive lanes write consecutive channels). */
template <typename T, int HSP>
__device__ __forceinline__ void tc_write(T *dst, int64_t ld, int64_t t0, int64_t T_, int hs,
                                         const tc_acc *acc, float mul, float *S) {
    constexpr int G = HSP < 64 ? HSP : 64;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int g = 0; g < HSP / G; g++) {
#pragma unroll
        for (int c = 0; c < G / 16; c++)
            wmma::store_matrix_sync(S + 16 * c, acc[g * (G / 16) + c], LDS, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 16 * G; e += 32) {
            int r = e / G, ch = g * G + e % G;
            if (t0 + r < T_ && ch < hs)
                kcu_st(dst, (t0 + r) * ld + ch, S[r * LDS + e % G] * mul);
        }
        __syncwarp(); /* S is read before it is written again */
    }
}

/* grid: x = B*NH, y = query tiles (the longest, last, first). */
template <typename T, int HSP>
__global__ void __launch_bounds__(TC_THREADS)
    kcu_att_tc_fwd(T *out, float *lse, T *osave, const T *qkv, int64_t T_, int NH, int NKV,
                   int hs, float scale) {
    constexpr int LDH = HSP + 8, G = HSP < 64 ? HSP : 64;
    extern __shared__ __align__(128) unsigned char tc_sm[];
    T *Qs = (T *)tc_sm, *Ks = Qs + TQ * LDH, *Vs = Ks + TK * LDH;
    float *Ss = (float *)(Vs + TK * LDH);
    T *Ps = (T *)(Ss + 4 * 16 * LDS);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float *S = Ss + warp * 16 * LDS; /* this warp's rows */
    T *P = Ps + warp * 16 * LDP;
    int64_t C = (int64_t)NH * hs, W = C + 2 * (int64_t)NKV * hs;
    int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    int64_t q0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * TQ, qw = q0 + 16 * warp, qi = qw + r;
    const T *base = qkv + b * T_ * W + h * hs;
    const T *kb = qkv + b * T_ * W + C + kvh * hs, *vb = kb + (int64_t)NKV * hs;
    tc_load<T, HSP>(Qs, base, W, q0, T_, hs);
    float o[HSP / 2]; /* row r of the output, channels half + 2 j */
#pragma unroll
    for (int j = 0; j < HSP / 2; j++)
        o[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int64_t qend = q0 + TQ < T_ ? q0 + TQ : T_; /* keys below qend are all any row sees */
    for (int64_t k0 = 0; k0 < qend; k0 += TK) {
        __syncthreads(); /* the previous tile's K and V are no longer read */
        tc_load<T, HSP>(Ks, kb, W, k0, T_, hs);
        tc_load<T, HSP>(Vs, vb, W, k0, T_, hs);
        __syncthreads();
        /* the key chunks the warp's rows see: up to its last row, below T */
        int nk = tc_chunks(qw + 16 < T_ ? qw + 16 - k0 : T_ - k0);
        tc_scores<T, HSP>(S, Qs + 16 * warp * LDH, Ks, 0, nk);
        __syncwarp();
        float sc[32], mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 32; j++) { /* columns past chunk nk are masked, never read */
            int c = half + 2 * j;
            sc[j] = k0 + c <= qi && qi < T_ ? S[r * LDS + c] * scale : -INFINITY;
            mx = fmaxf(mx, sc[j]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)); /* the row's other lane */
        float mnew = fmaxf(m, mx);
        /* a row past T sees no key: m and mnew stay -inf, p and alpha 0 */
        float alpha = m == -INFINITY ? 0.0f : expf(m - mnew), psum = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            float p = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - mnew);
            kcu_st(P, r * LDP + half + 2 * j, p);
            psum += p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * alpha + psum;
        m = mnew;
#pragma unroll
        for (int j = 0; j < HSP / 2; j++)
            o[j] *= alpha;
        __syncwarp(); /* P written and S read by every lane */
        /* o += P V (16 x nk chunks, times those rows of V), G channels at a time via S */
#pragma unroll
        for (int g = 0; g < HSP / G; g++) {
#pragma unroll
            for (int c = 0; c < G / 16; c++) {
                tc_acc acc;
                wmma::fill_fragment(acc, 0.0f);
                for (int kt = 0; kt < nk; kt++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> v;
                    wmma::load_matrix_sync(a, P + 16 * kt, LDP);
                    wmma::load_matrix_sync(v, Vs + 16 * kt * LDH + g * G + 16 * c, LDH);
                    wmma::mma_sync(acc, a, v, acc);
                }
                wmma::store_matrix_sync(S + 16 * c, acc, LDS, wmma::mem_row_major);
            }
            __syncwarp();
#pragma unroll
            for (int j = 0; j < G / 2; j++)
                o[g * (G / 2) + j] += S[r * LDS + half + 2 * j];
            __syncwarp(); /* S is read before it is written again */
        }
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    int64_t at = (b * T_) * C + h * hs; /* channel 0 of the head at t = 0 */
#pragma unroll
    for (int g = 0; g < HSP / G; g++) {
#pragma unroll
        for (int j = 0; j < G / 2; j++)
            S[r * LDS + half + 2 * j] = o[g * (G / 2) + j] * inv;
        __syncwarp();
        for (int e = lane; e < 16 * G; e += 32) {
            int rr = e / G, ch = g * G + e % G;
            if (qw + rr < T_ && ch < hs) {
                float v = S[rr * LDS + e % G];
                kcu_st(out, at + (qw + rr) * C + ch, v);
                kcu_st(osave, at + (qw + rr) * C + ch, v);
            }
        }
        __syncwarp();
    }
    if (half == 0 && qi < T_)
        lse[bh * T_ + qi] = m + logf(l);
}

/* dQ: grid x = B*NH, y = query tiles (the longest, last, first). */
template <typename T, int HSP>
__global__ void __launch_bounds__(TC_THREADS)
    kcu_att_tc_dq(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *D,
                  int64_t T_, int NH, int NKV, int hs, float scale) {
    constexpr int LDH = HSP + 8;
    extern __shared__ __align__(128) unsigned char tc_sm[];
    T *Qs = (T *)tc_sm, *dOs = Qs + TQ * LDH, *Ks = dOs + TQ * LDH, *Vs = Ks + TK * LDH;
    float *Ss = (float *)(Vs + TK * LDH);
    T *dSs = (T *)(Ss + 4 * 16 * LDS);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float *S = Ss + warp * 16 * LDS;
    T *dS = dSs + warp * 16 * LDP;
    int64_t C = (int64_t)NH * hs, W = C + 2 * (int64_t)NKV * hs;
    int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    int64_t q0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * TQ, qw = q0 + 16 * warp, qi = qw + r;
    const T *base = qkv + b * T_ * W + h * hs;
    const T *kb = qkv + b * T_ * W + C + kvh * hs, *vb = kb + (int64_t)NKV * hs;
    tc_load<T, HSP>(Qs, base, W, q0, T_, hs);
    tc_load<T, HSP>(dOs, dout + b * T_ * C + h * hs, C, q0, T_, hs);
    float lr = qi < T_ ? lse[bh * T_ + qi] : 0.0f, dr = qi < T_ ? D[bh * T_ + qi] : 0.0f;
    tc_acc dq[HSP / 16];
#pragma unroll
    for (int c = 0; c < HSP / 16; c++)
        wmma::fill_fragment(dq[c], 0.0f);
    int64_t qend = q0 + TQ < T_ ? q0 + TQ : T_;
    for (int64_t k0 = 0; k0 < qend; k0 += TK) {
        __syncthreads();
        tc_load<T, HSP>(Ks, kb, W, k0, T_, hs);
        tc_load<T, HSP>(Vs, vb, W, k0, T_, hs);
        __syncthreads();
        int nk = tc_chunks(qw + 16 < T_ ? qw + 16 - k0 : T_ - k0);
        tc_scores<T, HSP>(S, Qs + 16 * warp * LDH, Ks, 0, nk);
        __syncwarp();
        float p[32];
#pragma unroll
        for (int j = 0; j < 32; j++) {
            int c = half + 2 * j;
            p[j] = k0 + c <= qi && qi < T_ ? expf(S[r * LDS + c] * scale - lr) : 0.0f;
        }
        __syncwarp(); /* S read by every lane before dP overwrites it */
        tc_scores<T, HSP>(S, dOs + 16 * warp * LDH, Vs, 0, nk);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 32; j++) {
            int c = half + 2 * j;
            float ds = k0 + c <= qi && qi < T_ ? p[j] * (S[r * LDS + c] - dr) : 0.0f;
            kcu_st(dS, r * LDP + c, ds);
        }
        __syncwarp();
        tc_accumulate<T, HSP>(dq, dS, Ks, 0, nk);
    }
    tc_write<T, HSP>(dqkv + b * T_ * W + h * hs, W, qw, T_, hs, dq, scale, S);
}

/* dK, dV: grid x = B*NKV, y = key tiles (the longest, first, first); the block of key/value
 * head kvh walks query heads kvh G .. kvh G + G - 1 (G = NH/NKV) in order, each over its
 * query tiles, the sums staying in the accumulator fragments. */
template <typename T, int HSP>
__global__ void __launch_bounds__(TC_THREADS)
    kcu_att_tc_dkv(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *D,
                   int64_t T_, int NH, int NKV, int hs, float scale) {
    constexpr int LDH = HSP + 8;
    extern __shared__ __align__(128) unsigned char tc_sm[];
    T *Ks = (T *)tc_sm, *Vs = Ks + TK * LDH, *Qs = Vs + TK * LDH, *dOs = Qs + TQ * LDH;
    float *Ss = (float *)(dOs + TQ * LDH);
    T *Pts = (T *)(Ss + 4 * 16 * LDS), *dSts = Pts + TK * LDP;
    float *Ls = (float *)(dSts + TK * LDP), *Ds = Ls + TQ;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float *S = Ss + warp * 16 * LDS; /* S^T, then dP^T: key rows, query columns */
    T *Pt = Pts + warp * 16 * LDP, *dSt = dSts + warp * 16 * LDP;
    int64_t C = (int64_t)NH * hs, W = C + 2 * (int64_t)NKV * hs;
    int G = NH / NKV;
    int64_t bk = blockIdx.x, b = bk / NKV, kvh = bk % NKV;
    int64_t k0 = (int64_t)blockIdx.y * TK, kw = k0 + 16 * warp, kj = kw + r;
    const T *kb = qkv + b * T_ * W + C + kvh * hs, *vb = kb + (int64_t)NKV * hs;
    tc_load<T, HSP>(Ks, kb, W, k0, T_, hs);
    tc_load<T, HSP>(Vs, vb, W, k0, T_, hs);
    tc_acc dk[HSP / 16], dv[HSP / 16];
#pragma unroll
    for (int c = 0; c < HSP / 16; c++) {
        wmma::fill_fragment(dk[c], 0.0f);
        wmma::fill_fragment(dv[c], 0.0f);
    }
    for (int64_t h = kvh * G; h < (kvh + 1) * G; h++) {
        int64_t bh = b * NH + h;
        const T *base = qkv + b * T_ * W + h * hs;
        const T *dbase = dout + b * T_ * C + h * hs;
        /* query tiles from the diagonal one (earlier queries see none of these keys) */
        for (int64_t q0 = k0; q0 < T_; q0 += TQ) {
            __syncthreads(); /* the previous query tile is no longer read */
            tc_load<T, HSP>(Qs, base, W, q0, T_, hs);
            tc_load<T, HSP>(dOs, dbase, C, q0, T_, hs);
            if (threadIdx.x < TQ) {
                int64_t t = q0 + threadIdx.x;
                Ls[threadIdx.x] = t < T_ ? lse[bh * T_ + t] : 0.0f;
                Ds[threadIdx.x] = t < T_ ? D[bh * T_ + t] : 0.0f;
            }
            __syncthreads();
            /* the query chunks that see a key of the warp's (at or after its first) and are
             * below T; in the diagonal tile the first is chunk `warp` */
            int n0 = kw > q0 ? (int)((kw - q0) / 16) : 0, n1 = tc_chunks(T_ - q0);
            tc_scores<T, HSP>(S, Ks + 16 * warp * LDH, Qs, n0, n1);
            __syncwarp();
            float p[32];
#pragma unroll
            for (int j = 0; j < 32; j++) { /* columns outside chunks n0..n1-1 are masked */
                int c = half + 2 * j;
                p[j] = kj <= q0 + c && q0 + c < T_ ? expf(S[r * LDS + c] * scale - Ls[c])
                                                   : 0.0f;
                kcu_st(Pt, r * LDP + c, p[j]);
            }
            __syncwarp();
            tc_scores<T, HSP>(S, Vs + 16 * warp * LDH, dOs, n0, n1);
            __syncwarp();
#pragma unroll
            for (int j = 0; j < 32; j++) {
                int c = half + 2 * j;
                float ds = kj <= q0 + c && q0 + c < T_ ? p[j] * (S[r * LDS + c] - Ds[c]) : 0.0f;
                kcu_st(dSt, r * LDP + c, ds);
            }
            __syncwarp();
            tc_accumulate<T, HSP>(dv, Pt, dOs, n0, n1);
            tc_accumulate<T, HSP>(dk, dSt, Qs, n0, n1);
        }
    }
    T *dst = dqkv + b * T_ * W + C + kvh * hs;
    tc_write<T, HSP>(dst, W, kw, T_, hs, dk, scale, S);
    tc_write<T, HSP>(dst + (int64_t)NKV * hs, W, kw, T_, hs, dv, 1.0f, S);
}

/* ---- launch ---- */

template <typename K> static int tc_prepare(kiln_backend *be, K kernel, size_t smem) {
    return KCU_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)smem)) ||
           KCU_CHECK(be,
                     cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          (int)cudaSharedmemCarveoutMaxShared));
}

template <typename T, int HSP>
static void tc_forward(kiln_backend *be, T *out, float *lse, T *osave, const T *qkv, int64_t B,
                       int64_t T_, int64_t C, int64_t NH, int64_t NKV) {
    size_t smem = tc_dims<HSP>::fwd;
    if (tc_prepare(be, kcu_att_tc_fwd<T, HSP>, smem))
        return;
    int hs = (int)(C / NH);
    dim3 grid((unsigned)(B * NH), (unsigned)((T_ + TQ - 1) / TQ));
    kcu_att_tc_fwd<T, HSP><<<grid, TC_THREADS, smem, kcu_st(be)->stream>>>(
        out, lse, osave, qkv, T_, (int)NH, (int)NKV, hs, 1.0f / sqrtf((float)hs));
    KCU_LAUNCHED(be, "attention_forward (tensor cores)");
}

template <typename T, int HSP>
static void tc_backward(kiln_backend *be, T *dqkv, const float *D, const T *dout, const T *qkv,
                        const float *lse, int64_t B, int64_t T_, int64_t C, int64_t NH,
                        int64_t NKV) {
    cudaStream_t st = kcu_st(be)->stream;
    size_t s1 = tc_dims<HSP>::dq, s2 = tc_dims<HSP>::dkv;
    if (tc_prepare(be, kcu_att_tc_dq<T, HSP>, s1) || tc_prepare(be, kcu_att_tc_dkv<T, HSP>, s2))
        return;
    int hs = (int)(C / NH);
    float scale = 1.0f / sqrtf((float)hs);
    dim3 grid((unsigned)(B * NH), (unsigned)((T_ + TQ - 1) / TQ));
    kcu_att_tc_dq<T, HSP><<<grid, TC_THREADS, s1, st>>>(dqkv, dout, qkv, lse, D, T_, (int)NH,
                                                        (int)NKV, hs, scale);
    if (KCU_LAUNCHED(be, "attention_backward (dq, tensor cores)"))
        return;
    dim3 grid2((unsigned)(B * NKV), (unsigned)((T_ + TK - 1) / TK));
    kcu_att_tc_dkv<T, HSP><<<grid2, TC_THREADS, s2, st>>>(dqkv, dout, qkv, lse, D, T_, (int)NH,
                                                          (int)NKV, hs, scale);
    KCU_LAUNCHED(be, "attention_backward (dk, dv, tensor cores)");
}

int kcu_attention_tc_fits(kiln_dtype dt, int64_t hs) {
    return dt != KILN_DTYPE_F32 && hs >= 16 && hs <= 128 && hs % 16 == 0;
}

void kcu_attention_tc_forward(kiln_backend *be, kiln_dtype dt, void *out, float *lse, void *osave,
                              const void *qkv, int64_t B, int64_t T_, int64_t C, int64_t NH,
                              int64_t NKV) {
    int64_t hs = C / NH;
#define TC_FWD_(T, HSP)                                                                            \
    tc_forward<T, HSP>(be, (T *)out, lse, (T *)osave, (const T *)qkv, B, T_, C, NH, NKV)
#define TC_FWD_HS_(T) hs <= 32 ? TC_FWD_(T, 32) : hs <= 64 ? TC_FWD_(T, 64) : TC_FWD_(T, 128)
    if (dt == KILN_DTYPE_BF16)
        TC_FWD_HS_(__nv_bfloat16);
    else
        TC_FWD_HS_(__half);
#undef TC_FWD_HS_
#undef TC_FWD_
}

void kcu_attention_tc_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, const float *D,
                               const void *dout, const void *qkv, const float *lse, int64_t B,
                               int64_t T_, int64_t C, int64_t NH, int64_t NKV) {
    int64_t hs = C / NH;
#define TC_BWD_(T, HSP)                                                                            \
    tc_backward<T, HSP>(be, (T *)dqkv, D, (const T *)dout, (const T *)qkv, lse, B, T_, C, NH,     \
                        NKV)
#define TC_BWD_HS_(T) hs <= 32 ? TC_BWD_(T, 32) : hs <= 64 ? TC_BWD_(T, 64) : TC_BWD_(T, 128)
    if (dt == KILN_DTYPE_BF16)
        TC_BWD_HS_(__nv_bfloat16);
    else
        TC_BWD_HS_(__half);
#undef TC_BWD_HS_
#undef TC_BWD_
}
