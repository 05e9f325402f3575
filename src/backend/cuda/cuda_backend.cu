/* The CUDA backend's instance: whether it can run here, its stream and library handles,
 * memory, synchronisation and errors, and the slab ops (reductions, scale, zero, convert).
 *
 * One stream, created non-blocking, carries every op, so ops run in the order they are
 * called and a buffer reused by a later op is never overwritten early. Copies to and from
 * the host wait for the stream before they return (a caller may read, reuse or free its
 * host buffer at once, as on the CPU); everything else is queued and `synchronize` waits. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_stream.h"

static kcu_state state = {0, 0, NULL, NULL, NULL, 0, {NULL, 0}, {NULL, 0}, {NULL, 0},
                          {NULL, 0}, {NULL, 0}, NULL, 1, 1, 0, 1};
static kiln_backend cuda_backend;

kcu_state *kcu_st(kiln_backend *be) { return (kcu_state *)be->impl; }

cudaStream_t kiln__cuda_stream(kiln_backend *be) { return kcu_st(be)->stream; }
int kiln__cuda_device(kiln_backend *be) { return kcu_st(be)->device; }

int kcu_fail_cuda(kiln_backend *be, cudaError_t e, const char *what, const char *file,
                  int line) {
    if (e == cudaSuccess)
        return 0;
    kiln_backend_fail(be, KILN_ERR_INTERNAL, "CUDA error %s (%s) in %s at %s:%d",
                      cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
    return 1;
}

void *kcu_grow(kiln_backend *be, kcu_buf *b, size_t bytes) {
    if (bytes <= b->bytes && b->p)
        return b->p;
    if (b->p)
        cudaFree(b->p); /* waits for the ops that may still read it */
    b->p = NULL;
    b->bytes = 0;
    size_t want = bytes < 4096 ? 4096 : bytes + bytes / 4;
    if (KCU_CHECK(be, cudaMalloc(&b->p, want))) {
        b->p = NULL;
        return NULL;
    }
    b->bytes = want;
    return b->p;
}

void *kcu_grow_host(kiln_backend *be, kcu_buf *b, size_t bytes) {
    if (bytes <= b->bytes && b->p)
        return b->p;
    free(b->p);
    size_t want = bytes < 4096 ? 4096 : bytes + bytes / 4;
    b->p = malloc(want);
    b->bytes = b->p ? want : 0;
    if (!b->p)
        kiln_backend_fail(be, KILN_ERR_NOMEM, "cuda backend: no host memory for %zu bytes", want);
    return b->p;
}

int kcu_is_device(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: forget it */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* Whether p is ordinary (pageable, not registered with CUDA) host memory. */
static int kcu_is_pageable(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

/* The model keeps the batch's ids in host memory (src/model/gpt.c: m->inputs, m->targets,
 * checked there against the vocabulary) and passes those pointers; ids already on the
 * device are used as they are. A host copy goes through the stream: a pageable source is
 * staged before cudaMemcpyAsync returns, so the caller may change it at once, and the
 * device buffer is reused only by ops queued after this one. */
const int32_t *kcu_device_ids(kiln_backend *be, kcu_buf *b, const int32_t *p, int64_t n) {
    if (kcu_is_device(p))
        return p;
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(int32_t);
    int32_t *d = (int32_t *)kcu_grow(be, b, bytes);
    if (!d)
        return NULL;
    if (n > 0 && KCU_CHECK(be, cudaMemcpyAsync(d, p, (size_t)n * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, kcu_st(be)->stream)))
        return NULL;
    return d;
}

const int32_t *kcu_host_ids(kiln_backend *be, const int32_t *p, int64_t n) {
    if (!kcu_is_device(p))
        return p;
    kcu_state *s = kcu_st(be);
    int32_t *h = (int32_t *)kcu_grow_host(be, &s->hids, (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!h)
        return NULL;
    if (KCU_CHECK(be, cudaMemcpyAsync(h, p, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                      s->stream)) ||
        KCU_CHECK(be, cudaStreamSynchronize(s->stream)))
        return NULL;
    return h;
}

/* ---- whether it can run, and starting it ---- */

__global__ void kcu_probe_kernel(int *x) {
    if (x)
        *x = 1;
}

static kiln_status unavailable(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kiln_status unavailable(char *why, size_t cap, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (why && cap)
        snprintf(why, cap, "%s; run on the CPU backend (cpu) instead", msg);
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s; run on the CPU backend (cpu) instead", msg);
}

kiln_status kiln_cuda_available(char *why, size_t cap) {
    int n = 0, drv = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&drv);
    if (e != cudaSuccess)
        cudaGetLastError();
    if (drv == 0) /* cudaDriverGetVersion gives 0 when no driver is installed */
        return unavailable(why, cap, "no NVIDIA driver found (%s)",
                           e == cudaSuccess ? "no device" : cudaGetErrorString(e));
    if (e == cudaErrorInsufficientDriver || drv < CUDART_VERSION)
        return unavailable(why, cap,
                           "the NVIDIA driver supports CUDA %d.%d but kiln was built with CUDA "
                           "%d.%d: update the driver",
                           drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000,
                           CUDART_VERSION % 1000 / 10);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0))
        return unavailable(why, cap, "no CUDA GPU found (%s)",
                           e == cudaSuccess ? "no device" : cudaGetErrorString(e));
    if (e != cudaSuccess)
        return unavailable(why, cap, "CUDA cannot start: %s", cudaGetErrorString(e));
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, dev)) != cudaSuccess) {
        cudaGetLastError();
        return unavailable(why, cap, "cannot read GPU %d's properties: %s", dev,
                           cudaGetErrorString(e));
    }
    if (p.major < 8)
        return unavailable(why, cap,
                           "GPU %d (%s) has compute capability %d.%d, and kiln's CUDA backend needs "
                           "8.0 or newer (bf16)",
                           dev, p.name, p.major, p.minor);
    cudaFuncAttributes fa;
    if ((e = cudaFuncGetAttributes(&fa, kcu_probe_kernel)) != cudaSuccess) {
        cudaGetLastError();
        return unavailable(why, cap,
                           "kiln's CUDA kernels were not built for GPU %d (%s, compute capability "
                           "%d.%d): %s; rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d",
                           dev, p.name, p.major, p.minor, cudaGetErrorString(e), p.major, p.minor);
    }
    if (why && cap)
        snprintf(why, cap, "GPU %d: %s, compute capability %d.%d, %.1f GiB, driver CUDA %d.%d", dev,
                 p.name, p.major, p.minor, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
                 drv / 1000, drv % 1000 / 10);
    return KILN_OK;
}

kiln_status kiln_cuda_select(int index, int *count) {
    int n = 0;
    if (count)
        *count = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return kiln_cuda_available(NULL, 0);
    }
    if (count)
        *count = n;
    if (index < 0 || index >= n)
        return kiln_error_setf(KILN_ERR_CONFIG, "there is no GPU %d here: %d %s visible", index, n,
                               n == 1 ? "is" : "are");
    if (state.ready)
        return state.device == index
                   ? KILN_OK
                   : kiln_error_setf(KILN_ERR_CONFIG,
                                     "the CUDA backend runs on GPU %d already, not on GPU %d",
                                     state.device, index);
    cudaError_t e = cudaSetDevice(index);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "cannot use GPU %d: %s", index,
                               cudaGetErrorString(e));
    }
    return KILN_OK;
}

int kiln_cuda_set_flag(kiln_cuda_flag flag, int on) {
    int *f = flag == KILN_CUDA_DETERMINISTIC  ? &state.deterministic
             : flag == KILN_CUDA_FUSE_GELU    ? &state.fuse_gelu
             : flag == KILN_CUDA_TF32         ? &state.tf32
             : flag == KILN_CUDA_TC_ATTENTION ? &state.tc_attention
                                              : NULL;
    if (!f)
        return -1;
    int old = *f;
    *f = on != 0;
    return old;
}

static kiln_status start(void) {
    kcu_state *s = &state;
    kiln_backend *be = &cuda_backend;
#define KCU_SET_OP_(prefix, op) be->op = prefix##op;
    KILN_BACKEND_OPS(KCU_SET_OP_, kiln__cuda_)
#undef KCU_SET_OP_
    be->name = "cuda";
    be->device_memory = 1;
    be->prepare = NULL;
    be->attention_decode = kiln__cuda_attention_decode; /* generation's cache */
    be->impl = s;
    cudaError_t e = cudaSuccess;
    const char *what = NULL;
    kiln_status ks;
    if ((e = cudaGetDevice(&s->device)) != cudaSuccess) {
        what = "cudaGetDevice";
    } else if ((e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        what = "cudaStreamCreate";
    } else if ((ks = kcu_matmul_start(s)) != KILN_OK) {
        return ks;
    } else {
        s->lt_ws_bytes = (size_t)32 << 20; /* what cuBLASLt suggests for Hopper */
        if ((e = cudaMalloc(&s->lt_ws, s->lt_ws_bytes)) != cudaSuccess)
            what = "cudaMalloc (cuBLASLt workspace)";
        else if ((e = cudaMallocHost((void **)&s->red_host, 64)) != cudaSuccess)
            what = "cudaMallocHost";
    }
    if (what) {
        cudaGetLastError();
        return kiln_error_setf(KILN_ERR_INTERNAL, "cuda backend: %s failed: %s", what,
                               cudaGetErrorString(e));
    }
    s->ready = 1;
    return KILN_OK;
}

kiln_backend *kiln_backend_cuda(void) {
    if (state.ready)
        return &cuda_backend;
    if (kiln_cuda_available(NULL, 0) != KILN_OK || start() != KILN_OK)
        return NULL;
    return &cuda_backend;
}

/* ---- memory ---- */

void *kiln__cuda_alloc(kiln_backend *be, size_t bytes) {
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    cudaError_t e = cudaMalloc(&p, n); /* 256-byte aligned */
    if (e != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: the caller reports it */
        return NULL;
    }
    if (KCU_CHECK(be, cudaMemsetAsync(p, 0, n, kcu_st(be)->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

void kiln__cuda_free(kiln_backend *be, void *p) {
    if (p)
        KCU_CHECK(be, cudaFree(p));
}

void kiln__cuda_copy(kiln_backend *be, void *dst, const void *src, size_t bytes,
                     kiln_copy_kind kind) {
    if (!bytes || dst == src || kcu_skip(be))
        return;
    cudaStream_t st = kcu_st(be)->stream;
    cudaMemcpyKind k = kind == KILN_COPY_TO_DEVICE ? cudaMemcpyHostToDevice
                       : kind == KILN_COPY_TO_HOST ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyDeviceToDevice;
    if (KCU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, k, st)))
        return;
    /* The host side may be read, reused or freed on return: wait, except for a copy from
     * pageable memory to the device, which CUDA stages before cudaMemcpyAsync returns (the
     * model's weights go up in many small copies, each of which would otherwise wait). */
    if (kind == KILN_COPY_TO_HOST || (kind == KILN_COPY_TO_DEVICE && !kcu_is_pageable(src)))
        KCU_CHECK(be, cudaStreamSynchronize(st));
}

kiln_status kiln__cuda_synchronize(kiln_backend *be) {
    KCU_CHECK(be, cudaStreamSynchronize(kcu_st(be)->stream));
    kiln_status s = be->error;
    if (s != KILN_OK) {
        kiln_error_setf(s, "%s backend: %s", be->name, be->error_message);
        be->error = KILN_OK;
        be->error_message[0] = '\0';
    }
    return s;
}

void kiln__cuda_zero(kiln_backend *be, void *x, size_t bytes) {
    if (bytes && !kcu_skip(be))
        KCU_CHECK(be, cudaMemsetAsync(x, 0, bytes, kcu_st(be)->stream));
}

/* ---- slab ops ---- */

__global__ void kcu_scale_kernel(float *x, float s, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

void kiln__cuda_scale(kiln_backend *be, float *x, float s, int64_t n) {
    if (n <= 0 || kcu_skip(be))
        return;
    kcu_scale_kernel<<<kcu_blocks(n, 256), 256, 0, kcu_st(be)->stream>>>(x, s, n);
    KCU_LAUNCHED(be, "scale");
}

template <typename TD, typename TS>
__global__ void kcu_convert_kernel(TD *dst, const TS *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        kcu_st(dst, i, kcu_ld(src, i));
}

void kiln__cuda_convert(kiln_backend *be, void *dst, kiln_dtype dt, const void *src,
                        kiln_dtype st, int64_t n) {
    if (n <= 0 || kcu_skip(be) || (dst == src && dt == st))
        return;
    cudaStream_t stream = kcu_st(be)->stream;
    if (dt == st) {
        KCU_CHECK(be, cudaMemcpyAsync(dst, src, (size_t)n * kiln_dtype_size(dt),
                                      cudaMemcpyDeviceToDevice, stream));
        return;
    }
    unsigned blocks = kcu_blocks(n, 256);
    KCU_DISPATCH(dt, {
        typedef T TD;
        KCU_DISPATCH(st, kcu_convert_kernel<TD, T><<<blocks, 256, 0, stream>>>(
                             (TD *)dst, (const T *)src, n));
    });
    KCU_LAUNCHED(be, "convert");
}

/* Reductions in a fixed order, whatever the GPU: RED_PARTS blocks each sum a fixed range of
 * the n elements (threads stride through it, then the block's values are added in a fixed
 * tree), then one block adds the parts in the same tree. Sums in double. */
enum { RED_PARTS = 256, RED_THREADS = 512 };

__device__ double kcu_block_sum_d(double v) {
    __shared__ double warps[32];
    v = kcu_warp_sum_d(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* warps[] may still be read by a previous call */
    if (lane == 0)
        warps[w] = v;
    __syncthreads();
    v = threadIdx.x < nw ? warps[threadIdx.x] : 0.0;
    if (w == 0)
        v = kcu_warp_sum_d(v);
    return v; /* valid in thread 0 */
}

template <typename T>
__global__ void kcu_reduce_parts(double *part, const T *x, int64_t n, int square) {
    int64_t per = (n + RED_PARTS - 1) / RED_PARTS;
    int64_t i0 = blockIdx.x * per, i1 = i0 + per < n ? i0 + per : n;
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        double v = (double)kcu_ld(x, i);
        s += square ? v * v : v;
    }
    s = kcu_block_sum_d(s);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

__global__ void kcu_reduce_final(double *out, const double *part) {
    double v = kcu_block_sum_d(threadIdx.x < RED_PARTS ? part[threadIdx.x] : 0.0);
    if (threadIdx.x == 0)
        *out = v;
}

static double reduce(kiln_backend *be, kiln_dtype dt, const void *x, int64_t n, int square) {
    if (kcu_skip(be))
        return NAN;
    if (n <= 0)
        return 0.0;
    kcu_state *s = kcu_st(be);
    double *part = (double *)kcu_grow(be, &s->part, (RED_PARTS + 1) * sizeof(double));
    if (!part)
        return NAN;
    KCU_DISPATCH(dt, kcu_reduce_parts<T><<<RED_PARTS, RED_THREADS, 0, s->stream>>>(
                         part, (const T *)x, n, square));
    kcu_reduce_final<<<1, RED_PARTS, 0, s->stream>>>(part + RED_PARTS, part);
    if (KCU_LAUNCHED(be, "sum") ||
        KCU_CHECK(be, cudaMemcpyAsync(s->red_host, part + RED_PARTS, sizeof(double),
                                      cudaMemcpyDeviceToHost, s->stream)) ||
        KCU_CHECK(be, cudaStreamSynchronize(s->stream)))
        return NAN;
    return s->red_host[0];
}

double kiln__cuda_sum(kiln_backend *be, const float *x, int64_t n) {
    return reduce(be, KILN_DTYPE_F32, x, n, 0);
}

double kiln__cuda_sumsq(kiln_backend *be, kiln_dtype dt, const void *x, int64_t n) {
    return reduce(be, dt, x, n, 1);
}
