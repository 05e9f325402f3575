/* Collectives through memory the ranks of one machine share (comm_shm.c): the MPI
 * backend's fast path for buffers from kiln_comm_alloc_shared; with ranks on several
 * machines, shared memory on each and MPI between them. */
#ifndef KILN_DIST_COMM_SHM_H
#define KILN_DIST_COMM_SHM_H

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#include <stddef.h>

#include "dist/comm_internal.h"

typedef struct kiln__shm kiln__shm;

/* The machines' groups for comm, where every machine runs the same number (2 or more) of
 * consecutive ranks of comm (KILN_COMM_NODE_RANKS=L: machines of L ranks, whatever the
 * hardware) and the environment does not say KILN_COMM_SHM=0; else *out = NULL (KILN_OK).
 * Collective. */
kiln_status kiln__shm_create(MPI_Comm comm, kiln__shm **out);
/* Ranks per machine (1 for NULL). */
int kiln__shm_local_size(const kiln__shm *s);
/* comm_mpi.c's element type and reduction operator for dt (bf16 and fp16: kiln's own ops). */
MPI_Datatype kiln__mpi_elem_type(kiln_dtype dt);
MPI_Op kiln__mpi_reduce_op(kiln_dtype dt, kiln_reduce_op op);
void kiln__shm_free(kiln__shm *s); /* NULL safe; collective (frees the windows left) */
/* bytes of zeroed memory for this rank in a new window every rank maps (common: one buffer
 * for all, the same memory behind every rank's pointer). Collective, with the same bytes
 * and common on every rank. */
kiln_status kiln__shm_alloc(kiln__shm *s, size_t bytes, int common, void **out);
/* The window kiln__shm_alloc gave p, given back; local (the window is freed at the next
 * kiln__shm_alloc or kiln__shm_free, which every rank reaches in step). */
void kiln__shm_release(kiln__shm *s, void *p);
/* The same, freed now with every window given back: collective. */
kiln_status kiln__shm_free_now(kiln__shm *s, void *p);

/* Each returns 1 when it ran the collective (its status in *st), 0 when the buffers are
 * not for shared memory and the caller runs MPI's instead; every rank returns the same.
 * allreduce: in place. reduce_scatter: send in shared memory, recv at this rank's piece of
 * send (NCCL's layout) or in memory of its own. allgather: in place (send at this rank's
 * piece of recv). Arguments are checked already (comm.c). */
int kiln__shm_allreduce(kiln__shm *s, void *buf, int64_t count, kiln_dtype dt, kiln_reduce_op op,
                        kiln_status *st);
int kiln__shm_reduce_scatter(kiln__shm *s, const void *send, void *recv, const int64_t *counts,
                             kiln_dtype dt, kiln_reduce_op op, kiln_status *st);
int kiln__shm_allgather(kiln__shm *s, const void *send, void *recv, const int64_t *counts,
                        kiln_dtype dt, kiln_status *st);
/* What the last of those that ran sent between machines, by the ring's count over the rail
 * (0 on one machine, where nothing leaves the shared memory). */
uint64_t kiln__shm_net_bytes(const kiln__shm *s);
#endif

#endif
