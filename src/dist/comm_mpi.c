/* kiln_comm on MPI: MPI_COMM_WORLD and the groups split from it. Compiled to nothing
 * without MPI (KILN_HAVE_MPI unset).
 *
 * Each communicator is a duplicate of its MPI one with MPI_ERRORS_RETURN, so that kiln's
 * messages never meet the program's and an MPI failure comes back as a kiln_status. Counts
 * past what one MPI call takes (an int, and kiln__comm_chunk_bytes) are cut in pieces: a
 * contiguous buffer in consecutive calls; a v-collective whose offsets pass an int as one
 * reduce (reduce-scatter) or broadcast (allgather) per rank, each cut in pieces. BF16 and
 * F16 reductions are user-defined operators on MPI_UINT16_T that add in fp32. */
#ifdef KILN_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dist/comm_internal.h"
#include "dist/comm_shm.h"

/* MPI is one per process, so its state is too: the operators kiln made, how many kiln
 * communicators are alive, and whether kiln initialised MPI (then the last free
 * finalises it). */
static struct {
    int live;
    int kiln_initialised;
    int ops_made;
    MPI_Op ops[KILN_DTYPE_COUNT][KILN_REDUCE_OP_COUNT]; /* the BF16 and F16 rows */
} mpi_state;

typedef struct mpi_comm {
    MPI_Comm comm;
    int tag_ub;     /* the largest tag MPI takes */
    kiln__shm *shm; /* the ranks share this machine (comm_shm.c); NULL: they do not */
} mpi_comm;

/* One operation: MPI's requests for its pieces (none when blocking) and what to do after
 * they complete: free scratch (count arrays MPI reads until then) and move a result that
 * in place lands where the caller does not want it. */
typedef struct mpi_req {
    int blocking;
    int n, cap;
    MPI_Request *reqs;
    void *scratch;
    void *move_dst;
    const void *move_src;
    size_t move_bytes;
    kiln_comm *c; /* for messages */
} mpi_req;

static MPI_Comm comm_of(const kiln_comm *c) {
    return ((const mpi_comm *)c->impl)->comm;
}

kiln_status kiln__comm_mpi_fail(int err, const char *call, const kiln_comm *c) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", err);
    if (c)
        return kiln_error_setf(KILN_ERR_IO, "%s (rank %d of %d): %s", call, c->rank, c->size, msg);
    return kiln_error_setf(KILN_ERR_IO, "%s: %s", call, msg);
}

/* ---- reduction operators ---- */

#define KILN__MPI_OP(name, dt, op)                                                                 \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type) {                        \
        kiln__comm_reduce_local(inout, in, *len, dt, op);                                          \
    }
KILN__MPI_OP(op_bf16_sum, KILN_DTYPE_BF16, KILN_REDUCE_SUM)
KILN__MPI_OP(op_bf16_max, KILN_DTYPE_BF16, KILN_REDUCE_MAX)
KILN__MPI_OP(op_bf16_min, KILN_DTYPE_BF16, KILN_REDUCE_MIN)
KILN__MPI_OP(op_f16_sum, KILN_DTYPE_F16, KILN_REDUCE_SUM)
KILN__MPI_OP(op_f16_max, KILN_DTYPE_F16, KILN_REDUCE_MAX)
KILN__MPI_OP(op_f16_min, KILN_DTYPE_F16, KILN_REDUCE_MIN)
#undef KILN__MPI_OP

static kiln_status ops_make(void) {
    static MPI_User_function *const fns[KILN_DTYPE_COUNT][KILN_REDUCE_OP_COUNT] = {
        [KILN_DTYPE_BF16] = {op_bf16_sum, op_bf16_max, op_bf16_min},
        [KILN_DTYPE_F16] = {op_f16_sum, op_f16_max, op_f16_min},
    };
    if (mpi_state.ops_made)
        return KILN_OK;
    for (int d = 0; d < KILN_DTYPE_COUNT; d++)
        for (int o = 0; o < KILN_REDUCE_OP_COUNT; o++) {
            mpi_state.ops[d][o] = MPI_OP_NULL;
            if (!fns[d][o])
                continue;
            int e = MPI_Op_create(fns[d][o], 1 /* commutative */, &mpi_state.ops[d][o]);
            if (e != MPI_SUCCESS)
                return kiln__comm_mpi_fail(e, "MPI_Op_create", NULL);
        }
    mpi_state.ops_made = 1;
    return KILN_OK;
}

static void ops_free(void) {
    for (int d = 0; d < KILN_DTYPE_COUNT; d++)
        for (int o = 0; o < KILN_REDUCE_OP_COUNT; o++)
            if (mpi_state.ops[d][o] != MPI_OP_NULL)
                MPI_Op_free(&mpi_state.ops[d][o]);
    mpi_state.ops_made = 0;
}

static MPI_Datatype elem_type(kiln_dtype dt) {
    return dt == KILN_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T;
}

static MPI_Op reduce_op(kiln_dtype dt, kiln_reduce_op op) {
    if (dt != KILN_DTYPE_F32)
        return mpi_state.ops[dt][op];
    return op == KILN_REDUCE_MAX ? MPI_MAX : op == KILN_REDUCE_MIN ? MPI_MIN : MPI_SUM;
}

MPI_Datatype kiln__mpi_elem_type(kiln_dtype dt) { return elem_type(dt); }
MPI_Op kiln__mpi_reduce_op(kiln_dtype dt, kiln_reduce_op op) { return reduce_op(dt, op); }

/* The most elements of dt one MPI call moves. */
static int64_t chunk_elems(kiln_dtype dt) {
    int64_t n = (int64_t)(kiln__comm_chunk_bytes() / kiln_dtype_size(dt));
    return n < 1 ? 1 : n > INT_MAX ? INT_MAX : n;
}

/* ---- operations: blocking, or started and finished later ---- */

static void req_free(mpi_req *q) {
    free(q->reqs);
    free(q->scratch);
    if (!q->blocking)
        free(q);
}

static void req_finish(mpi_req *q) {
    if (q->move_bytes && q->move_dst != q->move_src)
        memmove(q->move_dst, q->move_src, q->move_bytes);
    req_free(q);
}

/* `local` for a blocking call (req NULL), else a new operation; NULL (message set) without
 * memory. */
static mpi_req *op_begin(kiln_comm *c, void **req, mpi_req *local) {
    mpi_req *q = req ? malloc(sizeof *q) : local;
    if (!q) {
        kiln_error_setf(KILN_ERR_NOMEM, "communicator: out of memory for a request");
        return NULL;
    }
    memset(q, 0, sizeof *q);
    q->blocking = !req;
    q->c = c;
    return q;
}

/* Where MPI puts the request of the next piece: *slot NULL when blocking. */
static kiln_status op_slot(mpi_req *q, MPI_Request **slot) {
    *slot = NULL;
    if (q->blocking)
        return KILN_OK;
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 4;
        MPI_Request *r = realloc(q->reqs, (size_t)cap * sizeof *r);
        if (!r)
            return kiln_error_setf(KILN_ERR_NOMEM, "communicator: out of memory for requests");
        q->reqs = r;
        q->cap = cap;
    }
    *slot = &q->reqs[q->n++];
    **slot = MPI_REQUEST_NULL; /* what a failed start leaves for op_end's wait */
    return KILN_OK;
}

/* Ends the start of an operation with status s: a blocking one is finished; a started one
 * goes to *req (NULL when nothing was left in flight). A failure waits for the pieces
 * already started (MPI cannot cancel a collective) before it frees them. */
static kiln_status op_end(mpi_req *q, kiln_status s, void **req) {
    if (s != KILN_OK) {
        if (q->n)
            MPI_Waitall(q->n, q->reqs, MPI_STATUSES_IGNORE);
        req_free(q);
        return s;
    }
    if (q->blocking || q->n == 0) {
        req_finish(q);
        if (req)
            *req = NULL;
        return KILN_OK;
    }
    *req = q;
    return KILN_OK;
}

/* The status of one MPI call, with its name (the I-form when the piece was started). */
static kiln_status call_status(int e, const MPI_Request *slot, const char *blocking,
                               const char *started, const kiln_comm *c) {
    return e == MPI_SUCCESS ? KILN_OK : kiln__comm_mpi_fail(e, slot ? started : blocking, c);
}

static kiln_status mpi_wait(void *req) {
    mpi_req *q = req;
    int e = MPI_Waitall(q->n, q->reqs, MPI_STATUSES_IGNORE);
    kiln_status s = call_status(e, NULL, "MPI_Waitall", NULL, q->c);
    if (s == KILN_OK)
        req_finish(q);
    else
        req_free(q);
    return s;
}

static kiln_status mpi_test(void *req, int *done) {
    mpi_req *q = req;
    int flag = 0;
    int e = MPI_Testall(q->n, q->reqs, &flag, MPI_STATUSES_IGNORE);
    *done = flag;
    if (e != MPI_SUCCESS) {
        kiln_status s = kiln__comm_mpi_fail(e, "MPI_Testall", q->c);
        req_free(q);
        return s;
    }
    if (flag)
        req_finish(q);
    return KILN_OK;
}

static void mpi_progress(kiln_comm *c) {
    /* Any MPI call runs Open MPI's progress engine, which advances started collectives. */
    int flag;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_of(c), &flag, MPI_STATUS_IGNORE);
}

/* ---- collectives ---- */

static kiln__shm *shm_of(const kiln_comm *c) {
    return ((const mpi_comm *)c->impl)->shm;
}

static kiln_status mpi_allreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                 kiln_reduce_op op, kiln_comm *c, void **req) {
    kiln_status st;
    if (!req && send == recv && kiln__shm_allreduce(shm_of(c), recv, count, dt, op, &st)) {
        c->call_net = kiln__shm_net_bytes(shm_of(c));
        return st;
    }
    mpi_req local, *q = op_begin(c, req, &local);
    if (!q)
        return KILN_ERR_NOMEM;
    kiln_status s = KILN_OK;
    size_t es = kiln_dtype_size(dt);
    int64_t lim = chunk_elems(dt);
    for (int64_t at = 0; at < count && s == KILN_OK; at += lim) {
        int n = (int)(count - at < lim ? count - at : lim);
        const void *sp = send == recv ? MPI_IN_PLACE : (const char *)send + (size_t)at * es;
        void *rp = (char *)recv + (size_t)at * es;
        MPI_Request *slot;
        KILN_CHECK_GOTO(s, op_slot(q, &slot), done);
        int e = slot ? MPI_Iallreduce(sp, rp, n, elem_type(dt), reduce_op(dt, op), comm_of(c), slot)
                     : MPI_Allreduce(sp, rp, n, elem_type(dt), reduce_op(dt, op), comm_of(c));
        s = call_status(e, slot, "MPI_Allreduce", "MPI_Iallreduce", c);
    }
done:
    return op_end(q, s, req);
}

/* offsets[r] = sum of counts before r (size() entries). */
static int64_t *offsets_of(const kiln_comm *c, const int64_t *counts) {
    int64_t *off = malloc((size_t)c->size * sizeof *off);
    for (int r = 0; off && r < c->size; r++)
        off[r] = r ? off[r - 1] + counts[r - 1] : 0;
    return off;
}

/* counts and offsets as ints for a v-collective, in one array: [0, size) counts, then
 * [size, 2 size) offsets; NULL without memory. The caller checked they fit. */
static int *int_counts(const kiln_comm *c, const int64_t *counts, const int64_t *off) {
    int *v = malloc(2 * (size_t)c->size * sizeof *v);
    for (int r = 0; v && r < c->size; r++) {
        v[r] = (int)counts[r];
        v[c->size + r] = (int)off[r];
    }
    return v;
}

/* Reduce-scatter as one reduce per rank, each cut in pieces: when the offsets pass an int.
 * base is send, written in place when in_place. */
static kiln_status reduce_scatter_rooted(const char *base, int in_place, void *recv,
                                         const int64_t *counts, const int64_t *off, kiln_dtype dt,
                                         kiln_reduce_op op, kiln_comm *c, mpi_req *q) {
    size_t es = kiln_dtype_size(dt);
    int64_t lim = chunk_elems(dt);
    for (int root = 0; root < c->size; root++)
        for (int64_t at = 0; at < counts[root]; at += lim) {
            int n = (int)(counts[root] - at < lim ? counts[root] - at : lim);
            const char *sp = base + (size_t)(off[root] + at) * es;
            void *rp = NULL;
            if (root == c->rank)
                rp = in_place ? (void *)sp : (char *)recv + (size_t)at * es;
            if (root == c->rank && in_place)
                sp = MPI_IN_PLACE;
            MPI_Request *slot;
            KILN_CHECK(op_slot(q, &slot));
            int e = slot
                        ? MPI_Ireduce(sp, rp, n, elem_type(dt), reduce_op(dt, op), root, comm_of(c),
                                      slot)
                        : MPI_Reduce(sp, rp, n, elem_type(dt), reduce_op(dt, op), root, comm_of(c));
            KILN_CHECK(call_status(e, slot, "MPI_Reduce", "MPI_Ireduce", c));
        }
    return KILN_OK;
}

static kiln_status mpi_reduce_scatter(const void *send, void *recv, const int64_t *counts,
                                      kiln_dtype dt, kiln_reduce_op op, kiln_comm *c, void **req) {
    kiln_status st;
    if (!req && kiln__shm_reduce_scatter(shm_of(c), send, recv, counts, dt, op, &st)) {
        c->call_net = kiln__shm_net_bytes(shm_of(c));
        return st;
    }
    mpi_req local, *q = op_begin(c, req, &local);
    if (!q)
        return KILN_ERR_NOMEM;
    kiln_status s = KILN_OK;
    size_t es = kiln_dtype_size(dt);
    int64_t *off = offsets_of(c, counts);
    if (!off) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "reduce-scatter: out of memory");
        goto done;
    }
    int64_t mine = off[c->rank], total = off[c->size - 1] + counts[c->size - 1];
    /* In place (recv is send, or send + this rank's offset) send is written: base. */
    int in_place = recv == send || (char *)recv == (const char *)send + (size_t)mine * es;
    char *base = in_place ? (char *)recv - (recv == send ? 0 : (size_t)mine * es) : NULL;
    if (total > chunk_elems(dt)) {
        /* The result lands at base + mine: where recv is, unless recv == send. */
        if (in_place)
            q->move_dst = recv, q->move_src = base + (size_t)mine * es;
        s = reduce_scatter_rooted(in_place ? base : send, in_place, recv, counts, off, dt, op, c,
                                  q);
    } else {
        int *v = q->scratch = int_counts(c, counts, off);
        if (!v) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "reduce-scatter: out of memory");
            goto done;
        }
        /* MPI_IN_PLACE leaves the result at the start of base. */
        if (in_place)
            q->move_dst = recv, q->move_src = base;
        const void *sp = in_place ? MPI_IN_PLACE : send;
        void *rp = in_place ? base : recv;
        MPI_Request *slot;
        KILN_CHECK_GOTO(s, op_slot(q, &slot), done);
        int e = slot ? MPI_Ireduce_scatter(sp, rp, v, elem_type(dt), reduce_op(dt, op), comm_of(c),
                                           slot)
                     : MPI_Reduce_scatter(sp, rp, v, elem_type(dt), reduce_op(dt, op), comm_of(c));
        s = call_status(e, slot, "MPI_Reduce_scatter", "MPI_Ireduce_scatter", c);
    }
    q->move_bytes = in_place ? (size_t)counts[c->rank] * es : 0;
done:
    free(off);
    return op_end(q, s, req);
}

static kiln_status mpi_allgather(const void *send, void *recv, const int64_t *counts, kiln_dtype dt,
                                 kiln_comm *c, void **req) {
    kiln_status st;
    if (!req && kiln__shm_allgather(shm_of(c), send, recv, counts, dt, &st)) {
        c->call_net = kiln__shm_net_bytes(shm_of(c));
        return st;
    }
    mpi_req local, *q = op_begin(c, req, &local);
    if (!q)
        return KILN_ERR_NOMEM;
    kiln_status s = KILN_OK;
    size_t es = kiln_dtype_size(dt);
    int64_t lim = chunk_elems(dt);
    int64_t *off = offsets_of(c, counts);
    if (!off) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "allgather: out of memory");
        goto done;
    }
    /* Always in place: this rank's piece goes into recv first. */
    char *mine = (char *)recv + (size_t)off[c->rank] * es;
    if (send != mine && counts[c->rank])
        memcpy(mine, send, (size_t)counts[c->rank] * es);
    int64_t total = off[c->size - 1] + counts[c->size - 1];
    if (total > lim) {
        /* One broadcast per rank's piece, cut in pieces. */
        for (int root = 0; root < c->size && s == KILN_OK; root++)
            for (int64_t at = 0; at < counts[root] && s == KILN_OK; at += lim) {
                int n = (int)(counts[root] - at < lim ? counts[root] - at : lim);
                void *p = (char *)recv + (size_t)(off[root] + at) * es;
                MPI_Request *slot;
                KILN_CHECK_GOTO(s, op_slot(q, &slot), done);
                int e = slot ? MPI_Ibcast(p, n, elem_type(dt), root, comm_of(c), slot)
                             : MPI_Bcast(p, n, elem_type(dt), root, comm_of(c));
                s = call_status(e, slot, "MPI_Bcast", "MPI_Ibcast", c);
            }
    } else {
        int *v = q->scratch = int_counts(c, counts, off);
        if (!v) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "allgather: out of memory");
            goto done;
        }
        MPI_Request *slot;
        KILN_CHECK_GOTO(s, op_slot(q, &slot), done);
        int e = slot ? MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, v, v + c->size,
                                       elem_type(dt), comm_of(c), slot)
                     : MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, v, v + c->size,
                                      elem_type(dt), comm_of(c));
        s = call_status(e, slot, "MPI_Allgatherv", "MPI_Iallgatherv", c);
    }
done:
    free(off);
    return op_end(q, s, req);
}

static kiln_status mpi_broadcast(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c,
                                 void **req) {
    mpi_req local, *q = op_begin(c, req, &local);
    if (!q)
        return KILN_ERR_NOMEM;
    kiln_status s = KILN_OK;
    size_t es = kiln_dtype_size(dt);
    int64_t lim = chunk_elems(dt);
    for (int64_t at = 0; at < count && s == KILN_OK; at += lim) {
        int n = (int)(count - at < lim ? count - at : lim);
        void *p = (char *)buf + (size_t)at * es;
        MPI_Request *slot;
        KILN_CHECK_GOTO(s, op_slot(q, &slot), done);
        int e = slot ? MPI_Ibcast(p, n, elem_type(dt), root, comm_of(c), slot)
                     : MPI_Bcast(p, n, elem_type(dt), root, comm_of(c));
        s = call_status(e, slot, "MPI_Bcast", "MPI_Ibcast", c);
    }
done:
    return op_end(q, s, req);
}

static kiln_status check_tag(int tag, const kiln_comm *c, const char *fn) {
    int ub = ((const mpi_comm *)c->impl)->tag_ub;
    if (tag > ub)
        return kiln_error_setf(KILN_ERR_ARG, "%s: tag %d is past MPI's largest, %d", fn, tag, ub);
    return KILN_OK;
}

static kiln_status mpi_send(const void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                            kiln_comm *c) {
    KILN_CHECK(check_tag(tag, c, "kiln_comm_send"));
    size_t es = kiln_dtype_size(dt);
    int64_t lim = chunk_elems(dt);
    int64_t at = 0;
    do { /* a message of 0 elements is still one message */
        int n = (int)(count - at < lim ? count - at : lim);
        int e =
            MPI_Send((const char *)buf + (size_t)at * es, n, elem_type(dt), peer, tag, comm_of(c));
        KILN_CHECK(call_status(e, NULL, "MPI_Send", NULL, c));
        at += n;
    } while (at < count);
    return KILN_OK;
}

static kiln_status mpi_recv(void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                            kiln_comm *c) {
    KILN_CHECK(check_tag(tag, c, "kiln_comm_recv"));
    size_t es = kiln_dtype_size(dt);
    int64_t lim = chunk_elems(dt);
    int64_t at = 0;
    do {
        int n = (int)(count - at < lim ? count - at : lim), got = 0;
        MPI_Status st;
        int e =
            MPI_Recv((char *)buf + (size_t)at * es, n, elem_type(dt), peer, tag, comm_of(c), &st);
        KILN_CHECK(call_status(e, NULL, "MPI_Recv", NULL, c));
        MPI_Get_count(&st, elem_type(dt), &got);
        if (got != n)
            return kiln_error_setf(KILN_ERR_IO,
                                   "kiln_comm_recv (rank %d of %d): rank %d sent %d elements "
                                   "where %d were expected (%lld in all, tag %d)",
                                   c->rank, c->size, peer, got, n, (long long)count, tag);
        at += n;
    } while (at < count);
    return KILN_OK;
}

static kiln_status mpi_barrier(kiln_comm *c) {
    return call_status(MPI_Barrier(comm_of(c)), NULL, "MPI_Barrier", NULL, c);
}

/* ---- communicators ---- */

static const kiln__comm_backend mpi_backend;

/* Open MPI's own choice of algorithm for large allreduce, reduce-scatter and allgatherv can
 * make two ranks send to each other over one TCP connection, where a rendezvous reply waits
 * behind the other direction's bulk data: up to 2x the ring's time at 1 Gbit/s
 * (docs/network.md). The ring is as fast or faster on shared memory too (16 MiB allreduce on
 * 2 ranks: 2.8 against 3.6 ms), so it is kiln's default; a user's own setting (environment
 * or mpirun --mca) wins, as setenv does not overwrite. */
static void prefer_ring(void) {
#ifdef OPEN_MPI
    /* A rank waiting in MPI gives its core up (sched_yield) rather than spin: kiln's
     * communication thread shares its rank's core with the compute threads, which a spinning
     * wait starves (d12 on 2 ranks of 1 thread: 727 against 792 ms a step, bench_dist.py's
     * threads part). */
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 0);
    setenv("OMPI_MCA_coll_tuned_allreduce_algorithm", "4", 0);      /* ring */
    setenv("OMPI_MCA_coll_tuned_reduce_scatter_algorithm", "3", 0); /* ring */
    setenv("OMPI_MCA_coll_tuned_allgatherv_algorithm", "3", 0);     /* ring */
#endif
}

/* A kiln communicator owning comm (freed here on failure). */
static kiln_status comm_wrap(MPI_Comm comm, kiln_comm **out) {
    int rank = 0, size = 1, flag = 0, *ub = NULL, e;
    mpi_comm *m = NULL;
    kiln_status s;
    if ((e = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (e = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS ||
        (e = MPI_Comm_size(comm, &size)) != MPI_SUCCESS ||
        (e = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag)) != MPI_SUCCESS) {
        s = kiln__comm_mpi_fail(e, "MPI communicator setup", NULL);
        goto fail;
    }
    if (!(m = malloc(sizeof *m))) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "communicator: out of memory");
        goto fail;
    }
    m->comm = comm;
    m->tag_ub = flag && ub ? *ub : 32767; /* the least MPI promises */
    m->shm = NULL;
    KILN_CHECK_GOTO(s, kiln__shm_create(comm, &m->shm), fail);
    KILN_CHECK_GOTO(s, kiln__comm_new(&mpi_backend, rank, size, m, out), fail);
    mpi_state.live++;
    return KILN_OK;
fail:
    if (m)
        kiln__shm_free(m->shm);
    free(m);
    MPI_Comm_free(&comm);
    return s;
}

kiln_status kiln__comm_mpi_init(kiln_comm **out) {
    int inited = 0, finalized = 0, provided = 0, e;
    MPI_Finalized(&finalized);
    if (finalized)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "MPI was finalised already in this process, and MPI can be "
                               "initialised once per process only");
    MPI_Initialized(&inited);
    if (inited) {
        MPI_Query_thread(&provided);
    } else {
        prefer_ring();
        e = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (e != MPI_SUCCESS)
            return kiln__comm_mpi_fail(e, "MPI_Init_thread", NULL);
        mpi_state.kiln_initialised = 1;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    /* One thread at a time, not always the main one: data parallelism (src/dist/dp.c)
     * reduces gradients on a communication thread. */
    if (provided < MPI_THREAD_SERIALIZED) {
        if (mpi_state.kiln_initialised && mpi_state.live == 0)
            MPI_Finalize();
        mpi_state.kiln_initialised = 0;
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "MPI provides thread level %d, below MPI_THREAD_SERIALIZED (%d) "
                               "that kiln needs: its communication thread calls MPI",
                               provided, MPI_THREAD_SERIALIZED);
    }
    kiln_status s = ops_make();
    MPI_Comm comm;
    if (s == KILN_OK && (e = MPI_Comm_dup(MPI_COMM_WORLD, &comm)) != MPI_SUCCESS)
        s = kiln__comm_mpi_fail(e, "MPI_Comm_dup", NULL);
    if (s == KILN_OK)
        s = comm_wrap(comm, out);
    if (s != KILN_OK && mpi_state.live == 0) {
        ops_free();
        if (mpi_state.kiln_initialised)
            MPI_Finalize();
        mpi_state.kiln_initialised = 0;
    }
    return s;
}

static kiln_status mpi_split(kiln_comm *c, int color, int key, kiln_comm **out) {
    MPI_Comm comm;
    int e = MPI_Comm_split(comm_of(c), color, key, &comm);
    if (e != MPI_SUCCESS)
        return kiln__comm_mpi_fail(e, "MPI_Comm_split", c);
    return comm_wrap(comm, out);
}

static kiln_status mpi_alloc_shared(kiln_comm *c, size_t bytes, int common, void **out) {
    mpi_comm *m = c->impl;
    return m->shm ? kiln__shm_alloc(m->shm, bytes, common, out) : KILN_OK;
}

static kiln_status mpi_free_shared(kiln_comm *c, void *p, int now) {
    mpi_comm *m = c->impl;
    if (m->shm && now)
        return kiln__shm_free_now(m->shm, p);
    if (m->shm)
        kiln__shm_release(m->shm, p);
    return KILN_OK;
}

static int mpi_shares_memory(const kiln_comm *c) {
    return shm_of(c) != NULL;
}

static int mpi_local_size(const kiln_comm *c) {
    return kiln__shm_local_size(shm_of(c));
}

static void mpi_free(kiln_comm *c) {
    mpi_comm *m = c->impl;
    kiln__shm_free(m->shm);
    MPI_Comm_free(&m->comm);
    free(m);
    if (--mpi_state.live > 0)
        return;
    ops_free();
    if (mpi_state.kiln_initialised)
        MPI_Finalize();
    mpi_state.kiln_initialised = 0;
}

static void mpi_abort(kiln_comm *c, int code) {
    MPI_Abort(comm_of(c), code);
}

static const kiln__comm_backend mpi_backend = {
    .kind = "mpi",
    .split = mpi_split,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .barrier = mpi_barrier,
    .wait = mpi_wait,
    .test = mpi_test,
    .progress = mpi_progress,
    .alloc_shared = mpi_alloc_shared,
    .free_shared = mpi_free_shared,
    .shares_memory = mpi_shares_memory,
    .local_size = mpi_local_size,
    .free = mpi_free,
    .abort = mpi_abort,
};

#else
/* Without MPI this file is empty; ISO C wants a declaration in every file. */
typedef int kiln__comm_mpi_unused;
#endif
