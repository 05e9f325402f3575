/* Internal parts of kiln_comm shared by its files: the backend table, the structs behind
 * the opaque handles, and helpers the MPI backend and the tests use. */
#ifndef KILN_DIST_COMM_INTERNAL_H
#define KILN_DIST_COMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/comm.h"

/* What one kind of communicator does. comm.c checks every argument and keeps the metrics
 * before it calls these, so a backend only moves data.
 *
 * The collectives take `req`: NULL means block until done; else start the operation and
 * set *req to the backend's state of it (NULL when it is done already), which wait or test
 * later finish and free. */
typedef struct kiln__comm_backend {
    const char *kind;
    kiln_status (*split)(kiln_comm *c, int color, int key, kiln_comm **out);
    kiln_status (*allreduce)(const void *send, void *recv, int64_t count, kiln_dtype dt,
                             kiln_reduce_op op, kiln_comm *c, void **req);
    kiln_status (*reduce_scatter)(const void *send, void *recv, const int64_t *counts,
                                  kiln_dtype dt, kiln_reduce_op op, kiln_comm *c, void **req);
    kiln_status (*allgather)(const void *send, void *recv, const int64_t *counts, kiln_dtype dt,
                             kiln_comm *c, void **req);
    kiln_status (*broadcast)(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c,
                             void **req);
    /* peer != self: a one-rank backend never sees these. */
    kiln_status (*send)(const void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                        kiln_comm *c);
    kiln_status (*recv)(void *buf, int64_t count, kiln_dtype dt, int peer, int tag, kiln_comm *c);
    kiln_status (*barrier)(kiln_comm *c);
    kiln_status (*wait)(void *req);            /* finishes req and frees it, also on failure */
    kiln_status (*test)(void *req, int *done); /* frees req when done or failed */
    void (*progress)(kiln_comm *c);            /* optional (NULL: nothing to advance) */
    /* optional (NULL: *out = NULL, nothing shared): kiln_comm_alloc_shared's memory */
    kiln_status (*alloc_shared)(kiln_comm *c, size_t bytes, int common, void **out);
    kiln_status (*free_shared)(kiln_comm *c, void *p, int now);
    int (*shares_memory)(const kiln_comm *c);
    int (*local_size)(const kiln_comm *c); /* optional (NULL: 1) */
    void (*free)(kiln_comm *c);            /* frees c->impl, not c */
    void (*abort)(kiln_comm *c, int code); /* kiln_comm_abort_job: ends the other ranks */
} kiln__comm_backend;

struct kiln_comm {
    const kiln__comm_backend *be;
    int rank, size;
    uint64_t bytes_sent; /* bytes, by the algorithm model of kiln_comm_bytes_sent */
    uint64_t net_bytes;  /* of those, the ones MPI's (or NCCL's) messages carried */
    uint64_t call_net;   /* the blocking collective being made: its share of bytes_sent,
                            until a backend that moves some through shared memory lowers it */
    double wait_seconds; /* seconds in blocking calls and waits */
    void *impl;          /* the backend's state (MPI: the MPI_Comm) */
};

struct kiln_comm_request {
    kiln_comm *comm;
    void *impl; /* the backend's state; NULL when it completed as it started */
};

/* A new communicator of backend `be` owning impl; on failure impl is not freed. */
kiln_status kiln__comm_new(const kiln__comm_backend *be, int rank, int size, void *impl,
                           kiln_comm **out);

/* inout[i] = op(inout[i], in[i]) for n elements of dt: F32 directly; BF16 and F16 in fp32,
 * rounded to nearest even once per element. NaN propagates through MAX and MIN. What the
 * MPI backend's reduction operators run. */
void kiln__comm_reduce_local(void *inout, const void *in, int64_t n, kiln_dtype dt,
                             kiln_reduce_op op);

/* The most bytes one MPI call moves (default 1 GiB, so that a count always fits in an int
 * and no transport meets a message past 2 GiB); 0 restores the default. Larger buffers
 * are cut into pieces of this size. Every rank must use the same value; tests make it small
 * to run the paths of counts past INT_MAX on small buffers. */
void kiln__comm_set_chunk_bytes(size_t bytes);
size_t kiln__comm_chunk_bytes(void);

/* What the launch environment asks for (kiln_comm_init_auto's rules): the launcher ("srun",
 * "Open MPI's mpirun", ...; NULL: none, one process), the variables it was read from and
 * the rank and size they give (-1: unknown). */
typedef struct kiln__comm_launch {
    const char *by;
    const char *rank_var, *size_var;
    long rank, size;
} kiln__comm_launch;
kiln__comm_launch kiln__comm_launch_detect(void);

/* How many collectives went through shared memory in this process (comm_shm.c; tests). */
uint64_t kiln__comm_shm_runs(void);

#ifdef KILN_HAVE_MPI
/* An MPI error code as KILN_ERR_IO naming the call, MPI's string and (c non-NULL) the rank. */
kiln_status kiln__comm_mpi_fail(int err, const char *call, const kiln_comm *c);
/* MPI_COMM_WORLD (comm_mpi.c). */
kiln_status kiln__comm_mpi_init(kiln_comm **out);
#endif

#endif
