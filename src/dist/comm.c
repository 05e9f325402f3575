/* kiln_comm: the public calls (argument checks, metrics, dispatch to a backend), the
 * single-process backend and the detection of how the process was launched. The MPI
 * backend is comm_mpi.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype_inline.h"
#include "core/error.h"
#include "dist/comm_internal.h"
#include "kiln/core.h"

int kiln_comm_have_mpi(void) {
#ifdef KILN_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

/* ---- helpers shared with the MPI backend ---- */

static size_t chunk_bytes_set; /* 0: the default; a test knob, see comm_internal.h */

void kiln__comm_set_chunk_bytes(size_t bytes) {
    chunk_bytes_set = bytes;
}

size_t kiln__comm_chunk_bytes(void) {
    return chunk_bytes_set ? chunk_bytes_set : (size_t)1 << 30;
}

KILN_INLINE float reduce_one(float a, float b, kiln_reduce_op op) {
    switch (op) {
    case KILN_REDUCE_MAX: return (isnan(a) || a > b) ? a : b;
    case KILN_REDUCE_MIN: return (isnan(a) || a < b) ? a : b;
    default: return a + b;
    }
}

/* Called with constant dt and op, so that each copy vectorises. */
KILN_INLINE void reduce_loop(void *restrict inout, const void *restrict in, int64_t n,
                             kiln_dtype dt, kiln_reduce_op op) {
    for (int64_t i = 0; i < n; i++)
        kiln__st(inout, i, reduce_one(kiln__ld(inout, i, dt), kiln__ld(in, i, dt), op), dt);
}

#define KILN__REDUCE_CASES(dt)                                                                     \
    switch (op) {                                                                                  \
    case KILN_REDUCE_MAX: reduce_loop(inout, in, n, dt, KILN_REDUCE_MAX); return;                  \
    case KILN_REDUCE_MIN: reduce_loop(inout, in, n, dt, KILN_REDUCE_MIN); return;                  \
    default: reduce_loop(inout, in, n, dt, KILN_REDUCE_SUM); return;                               \
    }

void kiln__comm_reduce_local(void *inout, const void *in, int64_t n, kiln_dtype dt,
                             kiln_reduce_op op) {
    switch (dt) {
    case KILN_DTYPE_BF16: KILN__REDUCE_CASES(KILN_DTYPE_BF16);
    case KILN_DTYPE_F16: KILN__REDUCE_CASES(KILN_DTYPE_F16);
    default: KILN__REDUCE_CASES(KILN_DTYPE_F32);
    }
}
#undef KILN__REDUCE_CASES

kiln_status kiln__comm_new(const kiln__comm_backend *be, int rank, int size, void *impl,
                           kiln_comm **out) {
    kiln_comm *c = calloc(1, sizeof *c);
    if (!c)
        return kiln_error_setf(KILN_ERR_NOMEM, "communicator: out of memory");
    c->be = be;
    c->rank = rank;
    c->size = size;
    c->impl = impl;
    *out = c;
    return KILN_OK;
}

/* ---- the single-process backend: rank 0 of 1, every collective a copy ---- */

static kiln_status single_split(kiln_comm *c, int color, int key, kiln_comm **out) {
    return kiln_comm_init_single(out);
}

static void copy(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes)
        memmove(dst, src, bytes);
}

static kiln_status single_allreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                    kiln_reduce_op op, kiln_comm *c, void **req) {
    copy(recv, send, (size_t)count * kiln_dtype_size(dt));
    return KILN_OK;
}

static kiln_status single_reduce_scatter(const void *send, void *recv, const int64_t *counts,
                                         kiln_dtype dt, kiln_reduce_op op, kiln_comm *c,
                                         void **req) {
    copy(recv, send, (size_t)counts[0] * kiln_dtype_size(dt));
    return KILN_OK;
}

static kiln_status single_allgather(const void *send, void *recv, const int64_t *counts,
                                    kiln_dtype dt, kiln_comm *c, void **req) {
    copy(recv, send, (size_t)counts[0] * kiln_dtype_size(dt));
    return KILN_OK;
}

static kiln_status single_broadcast(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c,
                                    void **req) {
    return KILN_OK;
}

static kiln_status single_p2p(kiln_comm *c) {
    return kiln_error_setf(KILN_ERR_INTERNAL, "single communicator: no peer to talk to");
}

static kiln_status single_send(const void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                               kiln_comm *c) {
    return single_p2p(c);
}

static kiln_status single_recv(void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                               kiln_comm *c) {
    return single_p2p(c);
}

static kiln_status single_barrier(kiln_comm *c) {
    return KILN_OK;
}

/* Never called: single operations complete as they start (no request state). */
static kiln_status single_wait(void *req) {
    return KILN_OK;
}

static kiln_status single_test(void *req, int *done) {
    *done = 1;
    return KILN_OK;
}

static void single_free(kiln_comm *c) {}

static void single_abort(kiln_comm *c, int code) {} /* no other rank to end */

static const kiln__comm_backend single_backend = {
    .kind = "single",
    .split = single_split,
    .allreduce = single_allreduce,
    .reduce_scatter = single_reduce_scatter,
    .allgather = single_allgather,
    .broadcast = single_broadcast,
    .send = single_send,
    .recv = single_recv,
    .barrier = single_barrier,
    .wait = single_wait,
    .test = single_test,
    .progress = NULL,
    .free = single_free,
    .abort = single_abort,
};

/* ---- making and freeing ---- */

kiln_status kiln_comm_init_single(kiln_comm **out) {
    if (!out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_init_single: out is NULL");
    *out = NULL;
    return kiln__comm_new(&single_backend, 0, 1, NULL, out);
}

kiln_status kiln_comm_init_mpi(kiln_comm **out) {
    if (!out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_init_mpi: out is NULL");
    *out = NULL;
#ifdef KILN_HAVE_MPI
    return kiln__comm_mpi_init(out);
#else
    return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                           "this kiln was built without MPI, so it runs in one process only "
                           "(apt-get install libopenmpi-dev, then rebuild kiln)");
#endif
}

void kiln_comm_free(kiln_comm *c) {
    if (!c)
        return;
    c->be->free(c);
    free(c);
}

static kiln_status alloc_shared(kiln_comm *c, size_t bytes, int common, void **out,
                                const char *fn) {
    if (!out)
        return kiln_error_setf(KILN_ERR_ARG, "%s: NULL out", fn);
    *out = NULL;
    if (!c)
        return kiln_error_setf(KILN_ERR_ARG, "%s: NULL communicator", fn);
    return c->be->alloc_shared ? c->be->alloc_shared(c, bytes, common, out) : KILN_OK;
}

kiln_status kiln_comm_alloc_shared(kiln_comm *c, size_t bytes, void **out) {
    return alloc_shared(c, bytes, 0, out, "kiln_comm_alloc_shared");
}

kiln_status kiln_comm_alloc_common(kiln_comm *c, size_t bytes, void **out) {
    return alloc_shared(c, bytes, 1, out, "kiln_comm_alloc_common");
}

void kiln_comm_free_shared(kiln_comm *c, void *p) {
    if (c && p && c->be->free_shared)
        (void)c->be->free_shared(c, p, 0);
}

kiln_status kiln_comm_free_shared_now(kiln_comm *c, void *p) {
    if (!c || !p || !c->be->free_shared)
        return KILN_OK;
    return c->be->free_shared(c, p, 1);
}

int kiln_comm_shares_memory(const kiln_comm *c) {
    return c && c->be->shares_memory ? c->be->shares_memory(c) : 0;
}

int kiln_comm_local_size(const kiln_comm *c) {
    return c && c->be->local_size ? c->be->local_size(c) : 1;
}

int kiln_comm_rank(const kiln_comm *c) {
    return c ? c->rank : 0;
}

int kiln_comm_size(const kiln_comm *c) {
    return c ? c->size : 1;
}

const char *kiln_comm_kind(const kiln_comm *c) {
    return c ? c->be->kind : "?";
}

kiln_status kiln_comm_split(kiln_comm *c, int color, int key, kiln_comm **out) {
    if (!c || !out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_split: %s is NULL", c ? "out" : "comm");
    *out = NULL;
    if (color < 0)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_split: color %d is negative", color);
    double t0 = kiln_time_ms();
    kiln_status s = c->be->split(c, color, key, out);
    c->wait_seconds += (kiln_time_ms() - t0) * 1e-3;
    return s;
}

/* ---- how the process was launched ---- */

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

/* The value of `name` as a non-negative integer into *out; 0 when unset or not one. */
static int env_long(const char *name, long *out) {
    const char *v = env(name);
    char *end;
    if (!v)
        return 0;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 0)
        return 0;
    *out = x;
    return 1;
}

/* A launcher is known by the variables it sets in each process it starts. mpirun-style
 * launchers come first: under a Slurm allocation they start their daemons with srun, so
 * the SLURM_ variables their ranks inherit describe the daemons, not the ranks. */
kiln__comm_launch kiln__comm_launch_detect(void) {
    static const struct {
        const char *size_var, *rank_var, *by;
    } known[] = {
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpirun"},
        {"MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MVAPICH's mpirun"},
        {"PMI_SIZE", "PMI_RANK", "a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2)"},
        {NULL, "PMIX_RANK", "a PMIx launcher (prterun, srun --mpi=pmix)"},
    };
    kiln__comm_launch l = {NULL, NULL, NULL, -1, -1};
    long slurm_n = -1;
    const char *slurm_var = env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    env_long(slurm_var, &slurm_n);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (!env(known[i].rank_var) && !(known[i].size_var && env(known[i].size_var)))
            continue;
        l.by = known[i].by;
        l.rank_var = known[i].rank_var;
        l.size_var = known[i].size_var;
        env_long(l.rank_var, &l.rank);
        if (l.size_var)
            env_long(l.size_var, &l.size);
        else if (slurm_n > 1) /* srun --mpi=pmix: the task count is Slurm's */
            l.size_var = slurm_var, l.size = slurm_n;
        return l;
    }
    if (slurm_n > 1) {
        l.by = "srun";
        l.rank_var = "SLURM_PROCID";
        l.size_var = slurm_var;
        l.size = slurm_n;
        env_long("SLURM_PROCID", &l.rank);
    }
    return l;
}

#ifdef KILN_HAVE_MPI
/* MPI must see the processes the launcher started: an MPI that does not understand the
 * launcher (another MPI's mpirun, srun without PMI support) makes each process a world of
 * one, and training would run N copies that each believe they are alone. */
static kiln_status launch_agrees(const kiln__comm_launch *l, const kiln_comm *c) {
    if ((l->size < 0 || l->size == c->size) && (l->rank < 0 || l->rank == c->rank))
        return KILN_OK;
    return kiln_error_setf(
        KILN_ERR_CONFIG,
        "started by %s as rank %ld of %ld (%s, %s) but MPI says rank %d of %d: kiln's MPI "
        "does not understand this launcher (an mpirun of another MPI, or an MPI built "
        "without Slurm/PMI support; under Slurm try srun --mpi=pmix)",
        l->by, l->rank, l->size, l->rank_var ? l->rank_var : "-", l->size_var ? l->size_var : "-",
        c->rank, c->size);
}
#endif

kiln_status kiln_comm_init_auto(kiln_comm **out) {
    if (!out)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_init_auto: out is NULL");
    *out = NULL;
    kiln__comm_launch l = kiln__comm_launch_detect();
    if (!l.by)
        return kiln_comm_init_single(out);
#ifdef KILN_HAVE_MPI
    kiln_comm *c;
    KILN_CHECK(kiln__comm_mpi_init(&c));
    kiln_status s = launch_agrees(&l, c);
    if (s != KILN_OK) {
        kiln_comm_free(c);
        return s;
    }
    *out = c;
    return KILN_OK;
#else
    if (l.size == 1)
        return kiln_comm_init_single(out);
    char size[32] = "several";
    if (l.size > 1)
        snprintf(size, sizeof size, "%ld", l.size);
    return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                           "started by %s as one of %s processes (%s=%s) but this kiln was built "
                           "without MPI: refusing to run them as independent copies (apt-get "
                           "install libopenmpi-dev, then rebuild kiln)",
                           l.by, size, l.size_var ? l.size_var : l.rank_var,
                           env(l.size_var ? l.size_var : l.rank_var));
#endif
}

/* ---- argument checks ---- */

static kiln_status check_comm(const kiln_comm *c, const char *fn) {
    return c ? KILN_OK : kiln_error_setf(KILN_ERR_ARG, "%s: communicator is NULL", fn);
}

static kiln_status check_dtype(kiln_dtype dt, const char *fn) {
    if ((int)dt < 0 || (int)dt >= KILN_DTYPE_COUNT)
        return kiln_error_setf(KILN_ERR_ARG, "%s: dtype %d is not one of kiln's", fn, (int)dt);
    return KILN_OK;
}

static kiln_status check_op(kiln_reduce_op op, const char *fn) {
    if ((int)op < 0 || (int)op >= KILN_REDUCE_OP_COUNT)
        return kiln_error_setf(KILN_ERR_ARG, "%s: reduce op %d is not sum, max or min", fn,
                               (int)op);
    return KILN_OK;
}

/* A count of elements of dt whose bytes fit a size_t and an int64_t. */
static kiln_status check_count(int64_t n, kiln_dtype dt, const char *fn, const char *what) {
    if (n < 0 || (uint64_t)n > (uint64_t)INT64_MAX / 8)
        return kiln_error_setf(KILN_ERR_ARG, "%s: %s %lld is out of range", fn, what, (long long)n);
    return KILN_OK;
}

static kiln_status check_buf(const void *p, int64_t n, const char *fn, const char *what) {
    if (!p && n > 0)
        return kiln_error_setf(KILN_ERR_ARG, "%s: %s is NULL with %lld elements", fn, what,
                               (long long)n);
    return KILN_OK;
}

/* The v-counts of a collective: size() entries >= 0; *total their sum, *mine the offset of
 * this rank's piece. */
static kiln_status check_counts(const kiln_comm *c, const int64_t *counts, kiln_dtype dt,
                                const char *fn, int64_t *total, int64_t *mine) {
    if (!counts)
        return kiln_error_setf(KILN_ERR_ARG, "%s: counts is NULL", fn);
    int64_t sum = 0;
    for (int r = 0; r < c->size; r++) {
        KILN_CHECK(check_count(counts[r], dt, fn, "counts[r]"));
        if (r == c->rank)
            *mine = sum;
        sum += counts[r];
        KILN_CHECK(check_count(sum, dt, fn, "sum(counts)"));
    }
    *total = sum;
    return KILN_OK;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

static kiln_status check_allreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                   kiln_reduce_op op, const kiln_comm *c, const char *fn) {
    KILN_CHECK(check_comm(c, fn));
    KILN_CHECK(check_dtype(dt, fn));
    KILN_CHECK(check_op(op, fn));
    KILN_CHECK(check_count(count, dt, fn, "count"));
    KILN_CHECK(check_buf(send, count, fn, "send"));
    KILN_CHECK(check_buf(recv, count, fn, "recv"));
    size_t bytes = (size_t)count * kiln_dtype_size(dt);
    if (send != recv && overlap(send, bytes, recv, bytes))
        return kiln_error_setf(KILN_ERR_ARG, "%s: send and recv overlap without being equal", fn);
    return KILN_OK;
}

static kiln_status check_reduce_scatter(const void *send, void *recv, const int64_t *counts,
                                        kiln_dtype dt, kiln_reduce_op op, const kiln_comm *c,
                                        const char *fn, int64_t *total) {
    int64_t mine = 0;
    KILN_CHECK(check_comm(c, fn));
    KILN_CHECK(check_dtype(dt, fn));
    KILN_CHECK(check_op(op, fn));
    KILN_CHECK(check_counts(c, counts, dt, fn, total, &mine));
    KILN_CHECK(check_buf(send, *total, fn, "send"));
    KILN_CHECK(check_buf(recv, counts[c->rank], fn, "recv"));
    size_t es = kiln_dtype_size(dt);
    const char *at = (const char *)send;
    if (recv != send && recv != at + (size_t)mine * es &&
        overlap(send, (size_t)*total * es, recv, (size_t)counts[c->rank] * es))
        return kiln_error_setf(KILN_ERR_ARG,
                               "%s: recv overlaps send but is neither send nor send + this "
                               "rank's offset (%lld elements)",
                               fn, (long long)mine);
    return KILN_OK;
}

static kiln_status check_allgather(const void *send, void *recv, const int64_t *counts,
                                   kiln_dtype dt, const kiln_comm *c, const char *fn,
                                   int64_t *total) {
    int64_t mine = 0;
    KILN_CHECK(check_comm(c, fn));
    KILN_CHECK(check_dtype(dt, fn));
    KILN_CHECK(check_counts(c, counts, dt, fn, total, &mine));
    KILN_CHECK(check_buf(send, counts[c->rank], fn, "send"));
    KILN_CHECK(check_buf(recv, *total, fn, "recv"));
    size_t es = kiln_dtype_size(dt);
    if (send != (const char *)recv + (size_t)mine * es &&
        overlap(send, (size_t)counts[c->rank] * es, recv, (size_t)*total * es))
        return kiln_error_setf(KILN_ERR_ARG,
                               "%s: send overlaps recv but is not this rank's piece of it "
                               "(recv + %lld elements)",
                               fn, (long long)mine);
    return KILN_OK;
}

static kiln_status check_broadcast(void *buf, int64_t count, kiln_dtype dt, int root,
                                   const kiln_comm *c, const char *fn) {
    KILN_CHECK(check_comm(c, fn));
    KILN_CHECK(check_dtype(dt, fn));
    KILN_CHECK(check_count(count, dt, fn, "count"));
    KILN_CHECK(check_buf(buf, count, fn, "buf"));
    if (root < 0 || root >= c->size)
        return kiln_error_setf(KILN_ERR_ARG, "%s: root %d is not a rank of a communicator of %d",
                               fn, root, c->size);
    return KILN_OK;
}

static kiln_status check_p2p(const void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                             const kiln_comm *c, const char *fn) {
    KILN_CHECK(check_comm(c, fn));
    KILN_CHECK(check_dtype(dt, fn));
    KILN_CHECK(check_count(count, dt, fn, "count"));
    KILN_CHECK(check_buf(buf, count, fn, "buf"));
    if (peer < 0 || peer >= c->size)
        return kiln_error_setf(KILN_ERR_ARG, "%s: peer %d is not a rank of a communicator of %d",
                               fn, peer, c->size);
    if (peer == c->rank)
        return kiln_error_setf(KILN_ERR_ARG, "%s: peer %d is this rank itself", fn, peer);
    if (tag < 0)
        return kiln_error_setf(KILN_ERR_ARG, "%s: tag %d is negative", fn, tag);
    return KILN_OK;
}

static kiln_status check_req(kiln_comm_request **req, const char *fn) {
    if (!req)
        return kiln_error_setf(KILN_ERR_ARG, "%s: req is NULL", fn);
    *req = NULL;
    return KILN_OK;
}

/* ---- metrics: bytes as the ring (chain) algorithms send them ---- */

static uint64_t bytes_allreduce(const kiln_comm *c, int64_t count, kiln_dtype dt) {
    uint64_t b = (uint64_t)count * kiln_dtype_size(dt);
    return c->size > 1 ? 2 * (b / (uint64_t)c->size) * (uint64_t)(c->size - 1) : 0;
}

/* Ring reduce-scatter: rank r sends a partial sum of every piece but its own. */
static uint64_t bytes_reduce_scatter(const kiln_comm *c, const int64_t *counts, int64_t total,
                                     kiln_dtype dt) {
    return (uint64_t)(total - counts[c->rank]) * kiln_dtype_size(dt);
}

/* Ring allgather: rank r forwards every piece but its successor's. */
static uint64_t bytes_allgather(const kiln_comm *c, const int64_t *counts, int64_t total,
                                kiln_dtype dt) {
    return (uint64_t)(total - counts[(c->rank + 1) % c->size]) * kiln_dtype_size(dt);
}

/* Chain broadcast: every rank passes the buffer on, but the last of the chain. */
static uint64_t bytes_broadcast(const kiln_comm *c, int64_t count, kiln_dtype dt, int root) {
    int last = (root + c->size - 1) % c->size;
    return c->rank == last ? 0 : (uint64_t)count * kiln_dtype_size(dt);
}

/* ---- collectives ---- */

/* s, after adding the seconds since t0 (kiln_time_ms) to c's wait seconds:
 *   double t0 = kiln_time_ms();
 *   return timed(c, t0, blocking_call(...)); */
static kiln_status timed(kiln_comm *c, double t0, kiln_status s) {
    c->wait_seconds += (kiln_time_ms() - t0) * 1e-3;
    return s;
}

/* A request around the backend state `impl` started by `s`. */
static kiln_status request_new(kiln_comm *c, kiln_status s, void *impl, kiln_comm_request **req) {
    if (s != KILN_OK)
        return s;
    kiln_comm_request *r = malloc(sizeof *r);
    if (!r) {
        if (impl)
            c->be->wait(impl); /* nothing may stay in flight on buffers the caller owns */
        return kiln_error_setf(KILN_ERR_NOMEM, "communicator: out of memory for a request");
    }
    r->comm = c;
    r->impl = impl;
    *req = r;
    return KILN_OK;
}

kiln_status kiln_comm_allreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                kiln_reduce_op op, kiln_comm *c) {
    KILN_CHECK(check_allreduce(send, recv, count, dt, op, c, "kiln_comm_allreduce"));
    c->call_net = bytes_allreduce(c, count, dt);
    c->bytes_sent += c->call_net;
    double t0 = kiln_time_ms();
    kiln_status s = timed(c, t0, c->be->allreduce(send, recv, count, dt, op, c, NULL));
    c->net_bytes += c->call_net;
    return s;
}

kiln_status kiln_comm_iallreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                 kiln_reduce_op op, kiln_comm *c, kiln_comm_request **req) {
    KILN_CHECK(check_req(req, "kiln_comm_iallreduce"));
    KILN_CHECK(check_allreduce(send, recv, count, dt, op, c, "kiln_comm_iallreduce"));
    uint64_t b = bytes_allreduce(c, count, dt);
    c->bytes_sent += b;
    c->net_bytes += b; /* never through shared memory */
    void *impl = NULL;
    kiln_status s = c->be->allreduce(send, recv, count, dt, op, c, &impl);
    return request_new(c, s, impl, req);
}

kiln_status kiln_comm_reduce_scatter(const void *send, void *recv, const int64_t *counts,
                                     kiln_dtype dt, kiln_reduce_op op, kiln_comm *c) {
    int64_t total;
    KILN_CHECK(
        check_reduce_scatter(send, recv, counts, dt, op, c, "kiln_comm_reduce_scatter", &total));
    c->call_net = bytes_reduce_scatter(c, counts, total, dt);
    c->bytes_sent += c->call_net;
    double t0 = kiln_time_ms();
    kiln_status s = timed(c, t0, c->be->reduce_scatter(send, recv, counts, dt, op, c, NULL));
    c->net_bytes += c->call_net;
    return s;
}

kiln_status kiln_comm_ireduce_scatter(const void *send, void *recv, const int64_t *counts,
                                      kiln_dtype dt, kiln_reduce_op op, kiln_comm *c,
                                      kiln_comm_request **req) {
    int64_t total;
    KILN_CHECK(check_req(req, "kiln_comm_ireduce_scatter"));
    KILN_CHECK(
        check_reduce_scatter(send, recv, counts, dt, op, c, "kiln_comm_ireduce_scatter", &total));
    uint64_t b = bytes_reduce_scatter(c, counts, total, dt);
    c->bytes_sent += b;
    c->net_bytes += b; /* never through shared memory */
    void *impl = NULL;
    kiln_status s = c->be->reduce_scatter(send, recv, counts, dt, op, c, &impl);
    return request_new(c, s, impl, req);
}

kiln_status kiln_comm_allgather(const void *send, void *recv, const int64_t *counts, kiln_dtype dt,
                                kiln_comm *c) {
    int64_t total;
    KILN_CHECK(check_allgather(send, recv, counts, dt, c, "kiln_comm_allgather", &total));
    c->call_net = bytes_allgather(c, counts, total, dt);
    c->bytes_sent += c->call_net;
    double t0 = kiln_time_ms();
    kiln_status s = timed(c, t0, c->be->allgather(send, recv, counts, dt, c, NULL));
    c->net_bytes += c->call_net;
    return s;
}

kiln_status kiln_comm_iallgather(const void *send, void *recv, const int64_t *counts, kiln_dtype dt,
                                 kiln_comm *c, kiln_comm_request **req) {
    int64_t total;
    KILN_CHECK(check_req(req, "kiln_comm_iallgather"));
    KILN_CHECK(check_allgather(send, recv, counts, dt, c, "kiln_comm_iallgather", &total));
    uint64_t b = bytes_allgather(c, counts, total, dt);
    c->bytes_sent += b;
    c->net_bytes += b; /* never through shared memory */
    void *impl = NULL;
    kiln_status s = c->be->allgather(send, recv, counts, dt, c, &impl);
    return request_new(c, s, impl, req);
}

kiln_status kiln_comm_broadcast(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c) {
    KILN_CHECK(check_broadcast(buf, count, dt, root, c, "kiln_comm_broadcast"));
    c->call_net = bytes_broadcast(c, count, dt, root);
    c->bytes_sent += c->call_net;
    double t0 = kiln_time_ms();
    kiln_status s = timed(c, t0, c->be->broadcast(buf, count, dt, root, c, NULL));
    c->net_bytes += c->call_net;
    return s;
}

kiln_status kiln_comm_ibroadcast(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c,
                                 kiln_comm_request **req) {
    KILN_CHECK(check_req(req, "kiln_comm_ibroadcast"));
    KILN_CHECK(check_broadcast(buf, count, dt, root, c, "kiln_comm_ibroadcast"));
    uint64_t b = bytes_broadcast(c, count, dt, root);
    c->bytes_sent += b;
    c->net_bytes += b; /* never through shared memory */
    void *impl = NULL;
    kiln_status s = c->be->broadcast(buf, count, dt, root, c, &impl);
    return request_new(c, s, impl, req);
}

kiln_status kiln_comm_send(const void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                           kiln_comm *c) {
    KILN_CHECK(check_p2p(buf, count, dt, peer, tag, c, "kiln_comm_send"));
    c->bytes_sent += (uint64_t)count * kiln_dtype_size(dt);
    c->net_bytes += (uint64_t)count * kiln_dtype_size(dt);
    double t0 = kiln_time_ms();
    return timed(c, t0, c->be->send(buf, count, dt, peer, tag, c));
}

kiln_status kiln_comm_recv(void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                           kiln_comm *c) {
    KILN_CHECK(check_p2p(buf, count, dt, peer, tag, c, "kiln_comm_recv"));
    double t0 = kiln_time_ms();
    return timed(c, t0, c->be->recv(buf, count, dt, peer, tag, c));
}

kiln_status kiln_comm_barrier(kiln_comm *c) {
    KILN_CHECK(check_comm(c, "kiln_comm_barrier"));
    double t0 = kiln_time_ms();
    return timed(c, t0, c->be->barrier(c));
}

kiln_status kiln_comm_wait(kiln_comm_request *req) {
    if (!req)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_wait: req is NULL");
    kiln_comm *c = req->comm;
    void *impl = req->impl;
    free(req);
    if (!impl)
        return KILN_OK;
    double t0 = kiln_time_ms();
    return timed(c, t0, c->be->wait(impl));
}

kiln_status kiln_comm_test(kiln_comm_request *req, int *done) {
    if (!req || !done)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_comm_test: %s is NULL", req ? "done" : "req");
    *done = 1;
    kiln_status s = req->impl ? req->comm->be->test(req->impl, done) : KILN_OK;
    if (*done || s != KILN_OK)
        free(req);
    return s;
}

void kiln_comm_progress(kiln_comm *c) {
    if (c && c->be->progress)
        c->be->progress(c);
}

uint64_t kiln_comm_bytes_sent(const kiln_comm *c) {
    return c ? c->bytes_sent : 0;
}

uint64_t kiln_comm_net_bytes(const kiln_comm *c) {
    return c ? c->net_bytes : 0;
}

double kiln_comm_wait_seconds(const kiln_comm *c) {
    return c ? c->wait_seconds : 0;
}

/* the program's handler (kiln_comm_set_abort_handler): process-wide, like a signal's */
static kiln_comm_abort_fn abort_fn;
static void *abort_user;

void kiln_comm_set_abort_handler(kiln_comm_abort_fn fn, void *user) {
    abort_fn = fn;
    abort_user = user;
}

kiln_status kiln_comm_abort(kiln_comm *c, int code, const char *msg) {
    const char *m = msg ? msg : "abort";
    fflush(stdout);
    if (c)
        fprintf(stderr, "kiln: rank %d of %d: %s\n", c->rank, c->size, m);
    else
        fprintf(stderr, "kiln: %s\n", m);
    fflush(stderr);
    if (abort_fn)
        abort_fn(c, code, m, abort_user);
    return kiln_error_setf(KILN_ERR_ABORTED, "%s (exit code %d asked for; no abort handler ended "
                                             "the process)",
                           m, code);
}

void kiln_comm_abort_job(kiln_comm *c, int code) {
    if (c)
        c->be->abort(c, code);
}
