/* kiln_comm on NCCL: collectives between GPUs, on a stream of their own behind the CUDA
 * backend's. Compiled to nothing without NCCL (KILN_HAVE_NCCL unset: comm_nccl_stub.c says
 * why).
 *
 * libnccl.so.2 is loaded with dlopen by the first kiln_comm_init_nccl, once the GPU is found
 * usable, so that a kiln built with CUDA maps no NCCL unless it communicates between GPUs;
 * nccl.h gives only types and constants. Buffers are the CUDA backend's device memory.
 *
 * Each communicator queues its operations on a stream of its own, each behind an event recorded
 * on the backend's stream when the operation is called: it starts after the kernels queued
 * before the call (those that made its input) and runs beside the ones queued after it, so a
 * bucket of gradients is reduced while backward computes the next. A blocking call then waits
 * for an event recorded behind it on the communicator's stream; a started one records an event
 * of its own, its request, and kiln_comm_wait waits for that. Kernels queued after the wait
 * (from any thread) see the result; until then the caller leaves the buffers alone, as the
 * non-blocking forms say.
 *
 * Reductions move their dtype (ncclFloat32, ncclBfloat16, ncclFloat16); broadcast, allgather,
 * send and recv move bytes. A v-collective of equal counts is NCCL's own (ncclReduceScatter,
 * ncclAllGather); of unequal counts, a group of one ncclReduce (ncclBroadcast) per rank's
 * piece. NCCL takes size_t counts, so nothing is cut in pieces. */
#ifdef KILN_HAVE_NCCL

#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_stream.h"
#include "core/error.h"
#include "dist/comm_internal.h"
#include "dist/comm_nccl.h"
#include "kiln/backend.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "the NCCL communicator needs nccl.h 2.10 or newer (bf16); CMakeLists.txt checks this"
#endif

/* ---- the library ---- */

/* What kiln calls, each found with dlsym. */
#define KNC_FUNCS(X)                                                                               \
    X(ncclGetVersion)                                                                              \
    X(ncclGetErrorString)                                                                          \
    X(ncclGetUniqueId)                                                                             \
    X(ncclCommInitRank)                                                                            \
    X(ncclCommDestroy)                                                                             \
    X(ncclCommAbort)                                                                               \
    X(ncclCommCount)                                                                               \
    X(ncclCommUserRank)                                                                            \
    X(ncclCommGetAsyncError)                                                                       \
    X(ncclAllReduce)                                                                               \
    X(ncclReduceScatter)                                                                           \
    X(ncclAllGather)                                                                               \
    X(ncclBroadcast)                                                                               \
    X(ncclReduce)                                                                                  \
    X(ncclSend)                                                                                    \
    X(ncclRecv)                                                                                    \
    X(ncclGroupStart)                                                                              \
    X(ncclGroupEnd)

/* Newer than 2.10: used where both the header and the loaded library have them. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
#define KNC_HAVE_LAST_ERROR 1
#define KNC_LAST_ERROR(X) X(ncclGetLastError)
#else
#define KNC_LAST_ERROR(X)
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
#define KNC_HAVE_SPLIT 1
#define KNC_SPLIT(X) X(ncclCommSplit)
#else
#define KNC_SPLIT(X)
#endif
#define KNC_OPTIONAL(X) KNC_LAST_ERROR(X) KNC_SPLIT(X)

#define KNC_FIELD_(f) __typeof__(&f) f;
static struct {
    int tried; /* loading was attempted: status and info hold its outcome */
    kiln_status status;
    char info[600]; /* which library and version, or why it did not load */
    void *lib;
    KNC_FUNCS(KNC_FIELD_)
    KNC_OPTIONAL(KNC_FIELD_)
} nccl;
#undef KNC_FIELD_

/* The library's places: the loader's search (LD_LIBRARY_PATH, ld.so.conf), then where the
 * build found it. */
static const char *const lib_names[] = {
    "libnccl.so.2",
#ifdef KILN_NCCL_LIBRARY_DIR
    KILN_NCCL_LIBRARY_DIR "/libnccl.so.2",
#endif
};
enum { LIB_NAMES = sizeof lib_names / sizeof lib_names[0] };

/* NCCL's version code as "2.28.9" (codes before 2.9 are 1000 x major + 100 x minor + patch). */
static void version_text(int v, char *buf, size_t cap) {
    if (v >= 10000)
        snprintf(buf, cap, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else
        snprintf(buf, cap, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
}

static kiln_status lib_open(void) {
    char tried[400] = "";
    size_t at = 0;
    for (int i = 0; i < LIB_NAMES && !nccl.lib; i++) {
        nccl.lib = dlopen(lib_names[i], RTLD_NOW | RTLD_LOCAL);
        if (!nccl.lib && at < sizeof tried)
            at += (size_t)snprintf(tried + at, sizeof tried - at, "%s%s", i ? "; " : "", dlerror());
    }
    if (!nccl.lib)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "cannot load libnccl.so.2 (%s): install NCCL (Debian's libnccl2, "
                               "or NVIDIA's) or put its folder on LD_LIBRARY_PATH, or use the "
                               "mpi communicator",
                               tried);
    return KILN_OK;
}

static kiln_status lib_symbols(void) {
#define KNC_LOAD_(f)                                                                               \
    if (!(nccl.f = (__typeof__(nccl.f))dlsym(nccl.lib, #f)))                                       \
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "libnccl.so.2 has no %s", #f);
    KNC_FUNCS(KNC_LOAD_)
#undef KNC_LOAD_
#define KNC_LOAD_OPTIONAL_(f) nccl.f = (__typeof__(nccl.f))dlsym(nccl.lib, #f);
    KNC_OPTIONAL(KNC_LOAD_OPTIONAL_)
#undef KNC_LOAD_OPTIONAL_
    int v = 0;
    char text[32];
    if (nccl.ncclGetVersion(&v) != ncclSuccess)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "libnccl.so.2: ncclGetVersion failed");
    version_text(v, text, sizeof text);
    if (v < NCCL_VERSION(2, 10, 0))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "libnccl.so.2 is NCCL %s, and kiln needs 2.10 or newer (bf16)",
                               text);
    snprintf(nccl.info, sizeof nccl.info, "libnccl.so.2, NCCL %s", text);
    return KILN_OK;
}

/* Load libnccl once per process; a failure is kept and told again on every later call. */
static kiln_status lib_load(void) {
    if (nccl.tried)
        return nccl.status == KILN_OK ? KILN_OK : kiln_error_setf(nccl.status, "%s", nccl.info);
    nccl.tried = 1;
    kiln_status s = lib_open();
    if (s == KILN_OK)
        s = lib_symbols();
    nccl.status = s;
    if (s != KILN_OK) {
        snprintf(nccl.info, sizeof nccl.info, "%s", kiln_error_message());
        if (nccl.lib)
            dlclose(nccl.lib);
        nccl.lib = NULL;
    }
    return s;
}

kiln_status kiln__comm_nccl_load(char *what, size_t cap) {
    kiln_status s = lib_load();
    if (what && cap)
        snprintf(what, cap, "%s", s == KILN_OK ? nccl.info : kiln_error_message());
    return s;
}

int kiln_comm_have_nccl(void) {
    return 1;
}

/* ---- errors ---- */

/* " (rank r of n)" for messages; "" without a communicator. */
static const char *rank_text(const kiln_comm *c, char *buf, size_t cap) {
    if (!c)
        return "";
    snprintf(buf, cap, " (rank %d of %d)", c->rank, c->size);
    return buf;
}

/* A failed NCCL call as KILN_ERR_IO: the call, the rank, NCCL's words for the code and its
 * last message. */
static kiln_status nccl_fail(ncclResult_t r, const char *call, const kiln_comm *c,
                             ncclComm_t comm) {
    const char *last = NULL;
    char where[48];
#ifdef KNC_HAVE_LAST_ERROR
    if (nccl.ncclGetLastError)
        last = nccl.ncclGetLastError(comm);
#endif
    return kiln_error_setf(KILN_ERR_IO, "%s%s: %s%s%s", call, rank_text(c, where, sizeof where),
                           nccl.ncclGetErrorString(r), last && last[0] ? ": " : "",
                           last ? last : "");
}

/* A failed CUDA call of the communicator as KILN_ERR_IO (the operation did not happen). */
static kiln_status cuda_fail(cudaError_t e, const char *call, const kiln_comm *c) {
    char where[48];
    cudaGetLastError(); /* forget it unless it is sticky */
    return kiln_error_setf(KILN_ERR_IO, "nccl communicator%s: %s failed: %s (%s)",
                           rank_text(c, where, sizeof where), call, cudaGetErrorName(e),
                           cudaGetErrorString(e));
}

/* ---- communicators and operations ---- */

typedef struct nccl_comm {
    ncclComm_t comm;
    int device;           /* the CUDA backend's GPU */
    cudaStream_t compute; /* the CUDA backend's stream */
    cudaStream_t stream;  /* the communicator's own: every operation is queued here */
    cudaEvent_t called;   /* recorded on compute at each call, waited for by stream */
    cudaEvent_t done;     /* recorded behind each blocking operation */
    float *word;         /* device: the barrier's one element */
    void *scratch;       /* device: a reduce-scatter result on its way to the start of send */
    size_t scratch_bytes;
} nccl_comm;

/* A started operation: the event behind it. */
typedef struct nccl_req {
    cudaEvent_t ev;
    kiln_comm *c;
} nccl_req;

/* Errors NCCL met in flight (a peer or the network lost): KILN_ERR_IO. */
static kiln_status async_error(const kiln_comm *c) {
    const nccl_comm *m = c->impl;
    ncclResult_t a = ncclSuccess, r = nccl.ncclCommGetAsyncError(m->comm, &a);
    if (r != ncclSuccess)
        return nccl_fail(r, "ncclCommGetAsyncError", c, m->comm);
    if (a != ncclSuccess && a != ncclInProgress)
        return nccl_fail(a, "NCCL, in flight", c, m->comm);
    return KILN_OK;
}

/* The calling thread's CUDA device made the communicator's (NCCL and events use it). */
static kiln_status use_device(const nccl_comm *m, const kiln_comm *c) {
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur == m->device)
        return KILN_OK;
    if ((e = cudaSetDevice(m->device)) != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice", c);
    return KILN_OK;
}

/* Before an operation is queued: the calling thread on the communicator's GPU, and the
 * communicator's stream behind what the backend's stream holds now. */
static kiln_status enter(const nccl_comm *m, const kiln_comm *c) {
    KILN_CHECK(use_device(m, c));
    cudaError_t e = cudaEventRecord(m->called, m->compute);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(m->stream, m->called, 0);
    if (e != cudaSuccess)
        return cuda_fail(e, "ordering NCCL behind the backend's kernels", c);
    return KILN_OK;
}

/* `bytes` at p must be device memory of the communicator's GPU: NCCL would fault on any other,
 * and a fault ends the process's CUDA context. Only the start is checked. */
static kiln_status check_device(const nccl_comm *m, const void *p, size_t bytes, const char *what,
                                const char *fn) {
    if (!bytes)
        return KILN_OK;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return kiln_error_setf(KILN_ERR_ARG,
                               "%s: %s (%p) is not GPU memory: the nccl communicator takes the "
                               "CUDA backend's (its alloc)",
                               fn, what, p);
    if (a.device != m->device)
        return kiln_error_setf(KILN_ERR_ARG,
                               "%s: %s is memory of GPU %d, and the communicator runs on GPU %d",
                               fn, what, a.device, m->device);
    return KILN_OK;
}

static kiln_status reduce_type(kiln_dtype dt, ncclDataType_t *t) {
    switch (dt) {
    case KILN_DTYPE_F32: *t = ncclFloat32; return KILN_OK;
    case KILN_DTYPE_BF16: *t = ncclBfloat16; return KILN_OK;
    case KILN_DTYPE_F16: *t = ncclFloat16; return KILN_OK;
    default:
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "nccl communicator: no reduction of %s",
                               kiln_dtype_name(dt));
    }
}

static ncclRedOp_t red_op(kiln_reduce_op op) {
    return op == KILN_REDUCE_MAX ? ncclMax : op == KILN_REDUCE_MIN ? ncclMin : ncclSum;
}

/* Wait for what is queued on the stream up to now: an event recorded there, then NCCL's errors
 * in flight. */
static kiln_status wait_queued(kiln_comm *c) {
    nccl_comm *m = c->impl;
    cudaError_t e = cudaEventRecord(m->done, m->stream);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(m->done);
    if (e != cudaSuccess)
        return cuda_fail(e, "waiting for an NCCL operation", c);
    return async_error(c);
}

/* A started operation's request: an event recorded behind it. On a failure the operation is
 * waited for, so that nothing stays in flight on the caller's buffers. */
static kiln_status request_start(kiln_comm *c, void **req) {
    nccl_comm *m = c->impl;
    nccl_req *q = malloc(sizeof *q);
    if (!q) {
        (void)wait_queued(c);
        return kiln_error_setf(KILN_ERR_NOMEM, "nccl communicator: out of memory for a request");
    }
    cudaError_t e = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming);
    if (e == cudaSuccess && (e = cudaEventRecord(q->ev, m->stream)) != cudaSuccess)
        cudaEventDestroy(q->ev);
    if (e != cudaSuccess) {
        free(q);
        kiln_status s = cuda_fail(e, "cudaEventRecord", c);
        (void)wait_queued(c);
        return s;
    }
    q->c = c;
    *req = q;
    return KILN_OK;
}

/* After the calls of an operation were queued (r: their status; call: what to name on a
 * failure): a blocking one (req NULL) waits, a started one gets its request. */
static kiln_status finish(kiln_comm *c, ncclResult_t r, const char *call, void **req) {
    nccl_comm *m = c->impl;
    if (r != ncclSuccess)
        return nccl_fail(r, call, c, m->comm);
    return req ? request_start(c, req) : wait_queued(c);
}

static kiln_status nc_wait(void *req) {
    nccl_req *q = req;
    cudaError_t e = cudaEventSynchronize(q->ev);
    kiln_status s =
        e == cudaSuccess ? async_error(q->c) : cuda_fail(e, "cudaEventSynchronize", q->c);
    cudaEventDestroy(q->ev);
    free(q);
    return s;
}

/* Not done yet: NCCL's errors in flight end it too (it would never complete). */
static kiln_status nc_test(void *req, int *done) {
    nccl_req *q = req;
    cudaError_t e = cudaEventQuery(q->ev);
    kiln_status s = KILN_OK;
    *done = e != cudaErrorNotReady;
    if (*done) {
        s = e == cudaSuccess ? async_error(q->c) : cuda_fail(e, "cudaEventQuery", q->c);
    } else {
        cudaGetLastError(); /* "not ready" is no error: the backend's next check must not see it */
        s = async_error(q->c);
    }
    if (*done || s != KILN_OK) {
        cudaEventDestroy(q->ev);
        free(q);
    }
    return s;
}

/* ---- collectives ---- */

/* Where this rank's piece starts (mine), the sum of the counts, and whether they are equal. */
static void layout(const kiln_comm *c, const int64_t *counts, int64_t *mine, int64_t *total,
                   int *equal) {
    int64_t sum = 0;
    *equal = 1;
    *mine = 0;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank)
            *mine = sum;
        sum += counts[r];
        *equal &= counts[r] == counts[0];
    }
    *total = sum;
}

static kiln_status nc_allreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                kiln_reduce_op op, kiln_comm *c, void **req) {
    nccl_comm *m = c->impl;
    const char *fn = "kiln_comm_allreduce";
    size_t bytes = (size_t)count * kiln_dtype_size(dt);
    ncclDataType_t t = ncclFloat32;
    KILN_CHECK(reduce_type(dt, &t));
    KILN_CHECK(enter(m, c));
    KILN_CHECK(check_device(m, send, bytes, "send", fn));
    KILN_CHECK(check_device(m, recv, bytes, "recv", fn));
    ncclResult_t r = ncclSuccess;
    if (count)
        r = nccl.ncclAllReduce(send, recv, (size_t)count, t, red_op(op), m->comm, m->stream);
    return finish(c, r, "ncclAllReduce", req);
}

/* One ncclReduce per rank's piece of send, in a group: root r's piece lands in its dst. */
static ncclResult_t reduce_each(const char *send, void *dst, const int64_t *counts, size_t es,
                                ncclDataType_t t, ncclRedOp_t op, kiln_comm *c) {
    nccl_comm *m = c->impl;
    ncclResult_t r = nccl.ncclGroupStart();
    if (r != ncclSuccess)
        return r;
    int64_t off = 0;
    for (int root = 0; root < c->size && r == ncclSuccess; root++) {
        const char *sp = send + (size_t)off * es;
        void *rp = root == c->rank ? dst : (void *)sp; /* read by root only */
        if (counts[root])
            r = nccl.ncclReduce(sp, rp, (size_t)counts[root], t, op, root, m->comm, m->stream);
        off += counts[root];
    }
    ncclResult_t e = nccl.ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

/* A device buffer of at least `bytes` for the communicator's own use. Growing it frees the old
 * one, which waits for the device (operations queued before may still use it). */
static kiln_status scratch_grow(nccl_comm *m, size_t bytes, const kiln_comm *c) {
    if (m->scratch_bytes >= bytes)
        return KILN_OK;
    cudaFree(m->scratch);
    m->scratch = NULL;
    m->scratch_bytes = 0;
    cudaError_t e = cudaMalloc(&m->scratch, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        m->scratch = NULL;
        return kiln_error_setf(KILN_ERR_NOMEM,
                               "kiln_comm_reduce_scatter (rank %d of %d): no GPU memory for %zu "
                               "bytes of scratch",
                               c->rank, c->size, bytes);
    }
    m->scratch_bytes = bytes;
    return KILN_OK;
}

/* In place with recv == send the result belongs at send's start. It is reduced into this
 * rank's piece of send (NCCL's in-place layout) or, where that piece overlaps the start (a
 * piece longer than its offset, unequal counts only), into scratch, then moved there. */
static kiln_status nc_reduce_scatter(const void *send, void *recv, const int64_t *counts,
                                     kiln_dtype dt, kiln_reduce_op op, kiln_comm *c, void **req) {
    nccl_comm *m = c->impl;
    const char *fn = "kiln_comm_reduce_scatter";
    size_t es = kiln_dtype_size(dt), n = (size_t)counts[c->rank] * es;
    int64_t mine, total;
    int equal;
    ncclDataType_t t = ncclFloat32;
    layout(c, counts, &mine, &total, &equal);
    KILN_CHECK(reduce_type(dt, &t));
    KILN_CHECK(enter(m, c));
    KILN_CHECK(check_device(m, send, (size_t)total * es, "send", fn));
    KILN_CHECK(check_device(m, recv, n, "recv", fn));
    char *at = (char *)send + (size_t)mine * es; /* this rank's piece of send */
    int front = recv == send && mine > 0 && n > 0;
    void *dst = recv;
    if (front && (size_t)mine * es < n) {
        KILN_CHECK(scratch_grow(m, n, c));
        dst = m->scratch;
    } else if (front) {
        dst = at;
    }
    ncclResult_t r = ncclSuccess;
    if (!equal)
        r = reduce_each(send, dst, counts, es, t, red_op(op), c);
    else if (counts[0])
        r = nccl.ncclReduceScatter(send, dst, (size_t)counts[0], t, red_op(op), m->comm, m->stream);
    if (r == ncclSuccess && front) {
        cudaError_t e = cudaMemcpyAsync(recv, dst, n, cudaMemcpyDeviceToDevice, m->stream);
        if (e != cudaSuccess) {
            kiln_status s = cuda_fail(e, "cudaMemcpyAsync (reduce-scatter in place)", c);
            (void)wait_queued(c);
            return s;
        }
    }
    return finish(c, r, equal ? "ncclReduceScatter" : "ncclReduce", req);
}

/* One ncclBroadcast per rank's piece of recv, in a group; the root's from send. */
static ncclResult_t broadcast_each(const void *send, char *recv, const int64_t *counts, size_t es,
                                   kiln_comm *c) {
    nccl_comm *m = c->impl;
    ncclResult_t r = nccl.ncclGroupStart();
    if (r != ncclSuccess)
        return r;
    int64_t off = 0;
    for (int root = 0; root < c->size && r == ncclSuccess; root++) {
        char *p = recv + (size_t)off * es;
        const void *sp = root == c->rank ? send : p;
        if (counts[root])
            r = nccl.ncclBroadcast(sp, p, (size_t)counts[root] * es, ncclUint8, root, m->comm,
                                   m->stream);
        off += counts[root];
    }
    ncclResult_t e = nccl.ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

static kiln_status nc_allgather(const void *send, void *recv, const int64_t *counts, kiln_dtype dt,
                                kiln_comm *c, void **req) {
    nccl_comm *m = c->impl;
    const char *fn = "kiln_comm_allgather";
    size_t es = kiln_dtype_size(dt);
    int64_t mine, total;
    int equal;
    layout(c, counts, &mine, &total, &equal);
    KILN_CHECK(enter(m, c));
    KILN_CHECK(check_device(m, send, (size_t)counts[c->rank] * es, "send", fn));
    KILN_CHECK(check_device(m, recv, (size_t)total * es, "recv", fn));
    ncclResult_t r = ncclSuccess;
    if (!equal)
        r = broadcast_each(send, recv, counts, es, c);
    else if (counts[0]) /* in place when send is recv + mine, NCCL's layout too */
        r = nccl.ncclAllGather(send, recv, (size_t)counts[0] * es, ncclUint8, m->comm, m->stream);
    return finish(c, r, equal ? "ncclAllGather" : "ncclBroadcast", req);
}

static kiln_status nc_broadcast(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c,
                                void **req) {
    nccl_comm *m = c->impl;
    size_t bytes = (size_t)count * kiln_dtype_size(dt);
    KILN_CHECK(enter(m, c));
    KILN_CHECK(check_device(m, buf, bytes, "buf", "kiln_comm_broadcast"));
    ncclResult_t r = ncclSuccess;
    if (bytes)
        r = nccl.ncclBroadcast(buf, buf, bytes, ncclUint8, root, m->comm, m->stream);
    return finish(c, r, "ncclBroadcast", req);
}

/* NCCL has no tags: messages between two ranks match in the order they are called. A message
 * of no bytes is no call on either side (both have the same count). */
static kiln_status p2p(void *buf, int64_t count, kiln_dtype dt, int peer, kiln_comm *c,
                       int sending) {
    nccl_comm *m = c->impl;
    size_t bytes = (size_t)count * kiln_dtype_size(dt);
    KILN_CHECK(enter(m, c));
    KILN_CHECK(check_device(m, buf, bytes, "buf", sending ? "kiln_comm_send" : "kiln_comm_recv"));
    ncclResult_t r = ncclSuccess;
    if (bytes && sending)
        r = nccl.ncclSend(buf, bytes, ncclUint8, peer, m->comm, m->stream);
    else if (bytes)
        r = nccl.ncclRecv(buf, bytes, ncclUint8, peer, m->comm, m->stream);
    return finish(c, r, sending ? "ncclSend" : "ncclRecv", NULL);
}

static kiln_status nc_send(const void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                           kiln_comm *c) {
    (void)tag;
    return p2p((void *)buf, count, dt, peer, c, 1);
}

static kiln_status nc_recv(void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                           kiln_comm *c) {
    (void)tag;
    return p2p(buf, count, dt, peer, c, 0);
}

/* A one-element allreduce every rank must reach, waited for. */
static kiln_status nc_barrier(kiln_comm *c) {
    nccl_comm *m = c->impl;
    KILN_CHECK(enter(m, c));
    ncclResult_t r =
        nccl.ncclAllReduce(m->word, m->word, 1, ncclFloat32, ncclSum, m->comm, m->stream);
    return finish(c, r, "ncclAllReduce (barrier)", NULL);
}

/* ---- making and freeing ---- */

static const kiln__comm_backend nccl_backend;

static void impl_free(nccl_comm *m) {
    if (!m)
        return;
    if (m->comm)
        nccl.ncclCommDestroy(m->comm);
    if (m->done)
        cudaEventDestroy(m->done);
    if (m->called)
        cudaEventDestroy(m->called);
    cudaFree(m->word);
    cudaFree(m->scratch);
    if (m->stream)
        cudaStreamDestroy(m->stream);
    free(m);
}

/* A kiln communicator owning comm (destroyed here on failure), on the backend's device, with
 * a stream of its own behind the backend's (compute). */
static kiln_status comm_wrap(ncclComm_t comm, int device, cudaStream_t compute, kiln_comm **out) {
    int rank = 0, size = 1;
    kiln_status s;
    ncclResult_t r;
    cudaError_t e;
    nccl_comm *m = calloc(1, sizeof *m);
    if (!m) {
        nccl.ncclCommDestroy(comm);
        return kiln_error_setf(KILN_ERR_NOMEM, "nccl communicator: out of memory");
    }
    m->comm = comm;
    m->device = device;
    m->compute = compute;
    if ((r = nccl.ncclCommUserRank(comm, &rank)) != ncclSuccess ||
        (r = nccl.ncclCommCount(comm, &size)) != ncclSuccess) {
        s = nccl_fail(r, "ncclCommUserRank/ncclCommCount", NULL, comm);
        goto fail;
    }
    if ((e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        m->stream = NULL;
        s = cuda_fail(e, "cudaStreamCreate", NULL);
        goto fail;
    }
    if ((e = cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&m->called, cudaEventDisableTiming)) != cudaSuccess) {
        s = cuda_fail(e, "cudaEventCreate", NULL);
        goto fail;
    }
    if ((e = cudaMalloc((void **)&m->word, sizeof *m->word)) != cudaSuccess ||
        (e = cudaMemsetAsync(m->word, 0, sizeof *m->word, m->stream)) != cudaSuccess) {
        s = cuda_fail(e, "cudaMalloc (the barrier's word)", NULL);
        goto fail;
    }
    KILN_CHECK_GOTO(s, kiln__comm_new(&nccl_backend, rank, size, m, out), fail);
    return KILN_OK;
fail:
    impl_free(m);
    return s;
}

/* This rank's part before the communicator exists: a usable GPU (checked before libnccl is
 * mapped), the CUDA backend started on it, and libnccl. */
static kiln_status local_ready(kiln_backend **be) {
    char why[400];
    if (kiln_cuda_available(why, sizeof why) != KILN_OK)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "kiln_comm_init_nccl: no usable GPU: %s", why);
    if (!(*be = kiln_backend_cuda()))
        return kiln_error_wrapf(KILN_ERR_UNSUPPORTED,
                                "kiln_comm_init_nccl: the CUDA backend cannot start");
    kiln_status s = lib_load();
    return s == KILN_OK ? KILN_OK : kiln_error_wrapf(s, "kiln_comm_init_nccl");
}

/* Whether every rank of boot is ready (the least of the ranks' flags): a rank that cannot run
 * NCCL must not leave the others waiting for its id. */
static kiln_status every_rank(kiln_comm *boot, int ready, int *all) {
    float mine = ready ? 1.0f : 0.0f, least = 0.0f;
    KILN_CHECK(kiln_comm_allreduce(&mine, &least, 1, KILN_DTYPE_F32, KILN_REDUCE_MIN, boot));
    *all = least > 0.5f;
    return KILN_OK;
}

/* What rank 0 broadcasts over boot, as 16-bit units (broadcast moves any dtype as bytes). */
typedef struct boot_msg {
    uint16_t ok, pad;
    ncclUniqueId id;
} boot_msg;
_Static_assert(sizeof(boot_msg) % 2 == 0, "boot_msg goes as 16-bit units");

static kiln_status share_id(kiln_comm *boot, ncclUniqueId *id) {
    boot_msg msg;
    ncclResult_t r = ncclSuccess;
    memset(&msg, 0, sizeof msg);
    if (boot->rank == 0) {
        r = nccl.ncclGetUniqueId(&msg.id);
        msg.ok = r == ncclSuccess;
    }
    KILN_CHECK(kiln_comm_broadcast(&msg, sizeof msg / 2, KILN_DTYPE_BF16, 0, boot));
    if (!msg.ok && boot->rank == 0)
        return nccl_fail(r, "ncclGetUniqueId", boot, NULL);
    if (!msg.ok)
        return kiln_error_setf(KILN_ERR_IO,
                               "kiln_comm_init_nccl (rank %d of %d): rank 0 could "
                               "not make NCCL's id (its own error says why)",
                               boot->rank, boot->size);
    *id = msg.id;
    return KILN_OK;
}

kiln_status kiln_comm_init_nccl(kiln_comm *boot, kiln_comm **out) {
    if (out)
        *out = NULL;
    if (!out || !boot)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_init_nccl: %s is NULL",
                               out ? "boot" : "out");
    if (boot->be == &nccl_backend)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_init_nccl: boot is an nccl communicator; "
                                             "boot from a single or mpi one, or use "
                                             "kiln_comm_split for NCCL's sub-groups");
    kiln_backend *be = NULL;
    int all = 0;
    kiln_status here = local_ready(&be);
    char why[600];
    snprintf(why, sizeof why, "%s", kiln_error_message());
    KILN_CHECK(every_rank(boot, here == KILN_OK, &all));
    if (here != KILN_OK)
        return kiln_error_setf(here, "%s", why);
    if (!all)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "kiln_comm_init_nccl (rank %d of %d): another rank cannot run NCCL "
                               "(its own error says why)",
                               boot->rank, boot->size);
    int device = kiln__cuda_device(be);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice", boot);
    ncclUniqueId id;
    KILN_CHECK(share_id(boot, &id));
    ncclComm_t comm = NULL;
    ncclResult_t r = nccl.ncclCommInitRank(&comm, boot->size, id, boot->rank);
    if (r != ncclSuccess)
        return nccl_fail(r, "ncclCommInitRank", boot, NULL);
    return comm_wrap(comm, device, kiln__cuda_stream(be), out);
}

static kiln_status nc_split(kiln_comm *c, int color, int key, kiln_comm **out) {
#ifdef KNC_HAVE_SPLIT
    nccl_comm *m = c->impl;
    if (!nccl.ncclCommSplit)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "kiln_comm_split: %s has no ncclCommSplit (NCCL 2.18 or newer has)",
                               nccl.info);
    KILN_CHECK(use_device(m, c));
    ncclComm_t sub = NULL;
    ncclResult_t r = nccl.ncclCommSplit(m->comm, color, key, &sub, NULL);
    if (r != ncclSuccess)
        return nccl_fail(r, "ncclCommSplit", c, m->comm);
    return comm_wrap(sub, m->device, m->compute, out);
#else
    return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                           "kiln_comm_split: kiln was built with nccl.h %d, "
                           "before ncclCommSplit (NCCL 2.18)",
                           NCCL_VERSION_CODE);
#endif
}

static void nc_free(kiln_comm *c) {
    nccl_comm *m = c->impl;
    (void)use_device(m, c);
    impl_free(m);
}

static void nc_abort(kiln_comm *c, int code) {
    (void)code; /* the process's exit is its owner's (an abort handler's) */
    nccl.ncclCommAbort(((nccl_comm *)c->impl)->comm);
}

static const kiln__comm_backend nccl_backend = {
    .kind = "nccl",
    .split = nc_split,
    .allreduce = nc_allreduce,
    .reduce_scatter = nc_reduce_scatter,
    .allgather = nc_allgather,
    .broadcast = nc_broadcast,
    .send = nc_send,
    .recv = nc_recv,
    .barrier = nc_barrier,
    .wait = nc_wait,
    .test = nc_test,
    .progress = NULL,
    .alloc_shared = NULL,
    .free_shared = NULL,
    .shares_memory = NULL,
    .local_size = NULL,
    .free = nc_free,
    .abort = nc_abort,
};

#else
/* Without NCCL this file is empty (comm_nccl_stub.c has the entry points); ISO C wants a
 * declaration in every file. */
typedef int kiln__comm_nccl_unused;
#endif
