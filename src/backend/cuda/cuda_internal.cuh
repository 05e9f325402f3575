/* The CUDA backend's shared declarations: its state, error checks, element loads and stores
 * for each dtype, launch helpers and the kernels' entry points by file. Semantics of every
 * op: include/kiln/backend.h; the design: docs/cuda.md. */
#ifndef KILN_BACKEND_CUDA_INTERNAL_CUH
#define KILN_BACKEND_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/backend.h"

/* ---- state ---- */
typedef struct kcu_buf {
    void *p;
    size_t bytes;
} kcu_buf;

typedef struct kcu_state {
    int ready;     /* initialised (stream, handles, buffers) */
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws; /* cuBLASLt's workspace */
    size_t lt_ws_bytes;
    kcu_buf ids;   /* device: token ids staged from the host (encoder) */
    kcu_buf tgt;   /* device: targets staged from the host (cross-entropy) */
    kcu_buf part;  /* device: partial sums of column and slab reductions */
    kcu_buf hbuf;  /* host: encoder backward's grouping of positions by token */
    kcu_buf hids;  /* host: ids read back when a caller passes device ids */
    double *red_host; /* pinned: a reduction's result */
    /* flags (kiln_cuda_set_flag) */
    int deterministic, fuse_gelu, tf32, tc_attention;
} kcu_state;

kcu_state *kcu_st(kiln_backend *be);

/* Record a CUDA error (the first since the last synchronize) and return nonzero. */
int kcu_fail_cuda(kiln_backend *be, cudaError_t e, const char *what, const char *file, int line);
#define KCU_CHECK(be, call) kcu_fail_cuda((be), (call), #call, __FILE__, __LINE__)
/* After a kernel launch: a launch error (bad configuration) recorded. */
#define KCU_LAUNCHED(be, name) kcu_fail_cuda((be), cudaGetLastError(), name, __FILE__, __LINE__)
/* Ops do nothing once an error is recorded; synchronize reports it. */
static inline int kcu_skip(kiln_backend *be) { return be->error != KILN_OK; }

/* A device buffer of at least `bytes`, grown (never shrunk) as needed; NULL with the error
 * recorded. Growing frees the old buffer, which waits for the device. */
void *kcu_grow(kiln_backend *be, kcu_buf *b, size_t bytes);
/* The same for host memory. */
void *kcu_grow_host(kiln_backend *be, kcu_buf *b, size_t bytes);
/* Whether p is device memory (cudaMalloc'ed or managed) rather than host memory. */
int kcu_is_device(const void *p);
/* n token ids as device memory: p itself when it is, else copied into b. */
const int32_t *kcu_device_ids(kiln_backend *be, kcu_buf *b, const int32_t *p, int64_t n);
/* n token ids as host memory: p itself when it is, else read back (synchronously). */
const int32_t *kcu_host_ids(kiln_backend *be, const int32_t *p, int64_t n);

/* ---- elements ---- */
template <typename T> struct kcu_io;
template <> struct kcu_io<float> {
    static __device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
    static __device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
};
template <> struct kcu_io<__nv_bfloat16> {
    static __device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i) {
        return __bfloat162float(p[i]);
    }
    static __device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v) {
        p[i] = __float2bfloat16_rn(v);
    }
};
template <> struct kcu_io<__half> {
    static __device__ __forceinline__ float ld(const __half *p, int64_t i) {
        return __half2float(p[i]);
    }
    static __device__ __forceinline__ void st(__half *p, int64_t i, float v) {
        p[i] = __float2half_rn(v);
    }
};
template <typename T> __device__ __forceinline__ float kcu_ld(const T *p, int64_t i) {
    return kcu_io<T>::ld(p, i);
}
template <typename T> __device__ __forceinline__ void kcu_st(T *p, int64_t i, float v) {
    kcu_io<T>::st(p, i, v);
}

/* Run the statement with T bound to dt's element type. */
#define KCU_DISPATCH(dt, ...)                                                                      \
    do {                                                                                           \
        switch (dt) {                                                                              \
        case KILN_DTYPE_BF16: {                                                                    \
            typedef __nv_bfloat16 T;                                                               \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case KILN_DTYPE_F16: {                                                                     \
            typedef __half T;                                                                      \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        default: {                                                                                 \
            typedef float T;                                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        }                                                                                          \
    } while (0)

/* Blocks of `threads` covering n items, capped for grid-stride loops. */
static inline unsigned kcu_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    if (b > 65535LL * 32)
        b = 65535LL * 32;
    return (unsigned)b;
}

/* Warp sums and maxima (all 32 lanes take part). */
__device__ __forceinline__ float kcu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double kcu_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float kcu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The input row `row` (C wide) of a LayerNorm or RMSNorm, read by one warp: with b, x = a + b
 * rounded to T and stored in res (res may be a or b: each element is read and written by the
 * same lane), and the row of res returned; without b, the row of a. *part receives the lane's
 * sum of x (square 0) or of x^2 (square 1) over its channels lane, lane + 32, ... */
template <typename T>
__device__ __forceinline__ const T *kcu_norm_row(T *res, const T *a, const T *b, int64_t row,
                                                 int64_t C, int square, float *part) {
    int lane = threadIdx.x & 31;
    const T *x = a + row * C;
    float sum = 0.0f;
    if (b) {
        T *r = res + row * C;
        const T *y = b + row * C;
        for (int64_t c = lane; c < C; c += 32) {
            kcu_st(r, c, kcu_ld(x, c) + kcu_ld(y, c));
            float v = kcu_ld((const T *)r, c);
            sum += square ? v * v : v;
        }
        x = r;
    } else {
        for (int64_t c = lane; c < C; c += 32) {
            float v = kcu_ld(x, c);
            sum += square ? v * v : v;
        }
    }
    *part = sum;
    return x;
}

/* cuda_layers.cu: column sums of x (N, cols) of dtype T (or products, see there) added into
 * dst (cols, fp32), in a fixed order: partial sums over chunks of rows, then the chunks. */
void kcu_column_sums(kiln_backend *be, kiln_dtype dt, float *dst, const void *x, int64_t N,
                     int64_t cols);

/* cuda_layers.cu: the rows per chunk of such a sum for N rows (so that the chunks fit the
 * grid's y limit), and the chunks' partial sums part (chunks, stride) added in chunk order:
 * dst0[c] += sum of part[k stride + c], and dst1 (when not NULL) from part[k stride + cols + c],
 * c < cols. */
int64_t kcu_rows_per_chunk(int64_t N);
void kcu_add_parts(kiln_backend *be, float *dst0, float *dst1, const float *part, int64_t chunks,
                   int64_t cols, int64_t stride);

/* cuda_attention_tc.cu: attention on tensor cores, for bf16 and fp16 and head sizes that are
 * multiples of 16 up to 128 (kcu_attention_tc_fits); pointers 16-byte aligned; NKV key/value
 * heads as in attention_forward. The forward writes out, the lse (B,NH,T) and osave (B,T,C) as
 * cuda_attention.cu's forward does; the backward writes dqkv from D = rowsum(dO O) (B,NH,T),
 * already computed, and the lse. */
int kcu_attention_tc_fits(kiln_dtype dt, int64_t hs);
void kcu_attention_tc_forward(kiln_backend *be, kiln_dtype dt, void *out, float *lse, void *osave,
                              const void *qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                              int64_t NKV);
void kcu_attention_tc_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, const float *D,
                               const void *dout, const void *qkv, const float *lse, int64_t B,
                               int64_t T, int64_t C, int64_t NH, int64_t NKV);

/* cuda_matmul.cu: load cuBLASLt and create the handle (the thread's error message says why
 * not); forget the cached algorithms. */
kiln_status kcu_matmul_start(kcu_state *s);
void kcu_matmul_release(kcu_state *s);

/* Every op of the table: KILN_BACKEND_DECLARE gives kiln__cuda_<op>; and the optional one the
 * backend has (cuda_attention.cu). */
KILN_BACKEND_DECLARE(kiln__cuda_)
kiln_op_attention_decode kiln__cuda_attention_decode;

#endif
