/* kiln: communicators, for training on several processes (data, tensor and pipeline
 * parallelism).
 *
 * NCCL's shape: an opaque handle, every call returns a kiln_status, collectives read
 * (send, recv, count, dtype, op, comm). Three kinds: "single" (one process, rank 0 of 1:
 * every collective is a copy, or nothing in place), "mpi" (MPI_COMM_WORLD and groups split
 * from it; kiln built with MPI only) and "nccl" (between GPUs, on device memory: its
 * differences are listed at kiln_comm_init_nccl). Counts are in elements of dtype.
 *
 * Every rank of a communicator calls its collectives in the same order with the same
 * counts, dtype, op and root, as MPI and NCCL require; a rank that does not hangs the
 * others. Calls come from one thread at a time, not necessarily the main one
 * (MPI_THREAD_SERIALIZED: a communication thread may make them); never from two at once.
 * Counts past INT_MAX work: kiln cuts them into pieces MPI takes. */
#ifndef KILN_COMM_H
#define KILN_COMM_H

#include <stdint.h>

#include "kiln/dtype.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_comm kiln_comm;                 /* opaque */
typedef struct kiln_comm_request kiln_comm_request; /* a non-blocking operation in flight */

typedef enum kiln_reduce_op { KILN_REDUCE_SUM, KILN_REDUCE_MAX, KILN_REDUCE_MIN } kiln_reduce_op;
#define KILN_REDUCE_OP_COUNT 3

/* 1 when this kiln was built with MPI, else 0. */
int kiln_comm_have_mpi(void);

/* ---- making and freeing ---- */

/* One process: rank 0 of 1. */
kiln_status kiln_comm_init_single(kiln_comm **out);
/* MPI_COMM_WORLD (a duplicate of it, errors returned rather than fatal). Initialises MPI
 * (MPI_Init_thread, MPI_THREAD_SERIALIZED) unless the program did already; either way an
 * MPI below MPI_THREAD_SERIALIZED is KILN_ERR_UNSUPPORTED. MPI can be initialised once per
 * process: after kiln finalised it, this fails. KILN_ERR_UNSUPPORTED when kiln was built
 * without MPI. */
kiln_status kiln_comm_init_mpi(kiln_comm **out);
/* What the launch asks for: "mpi" when mpirun/mpiexec started this process
 * (OMPI_COMM_WORLD_SIZE, MPI_LOCALNRANKS, PMI_SIZE, PMIX_RANK, ...) or srun did with more
 * than one task (SLURM_STEP_NUM_TASKS or SLURM_NTASKS > 1), else "single". Under srun
 * MPI's rank and size must be SLURM_PROCID and the task count: an MPI without Slurm support
 * starts N processes of one rank each, and that is an error naming both. A launch of
 * several processes on a kiln without MPI is KILN_ERR_UNSUPPORTED (never N runs that each
 * believe they are alone). */
kiln_status kiln_comm_init_auto(kiln_comm **out);

/* ---- "nccl": collectives between GPUs (docs/cuda.md) ----
 * 1 when this kiln was built with the NCCL communicator (CUDA and nccl.h), else 0; whether a
 * GPU and libnccl.so.2 are there shows when kiln_comm_init_nccl runs. */
int kiln_comm_have_nccl(void);
/* A communicator of kind "nccl" with the ranks of boot (a "single" or "mpi" one), on the GPU
 * of the CUDA backend (kiln_backend_cuda() starts on the current CUDA device: give each rank
 * its own, with CUDA_VISIBLE_DEVICES or cudaSetDevice before the backend starts). Collective
 * over boot: rank 0 makes NCCL's id and broadcasts it over boot. The first call loads
 * libnccl.so.2 (dlopen). KILN_ERR_UNSUPPORTED, with the reason, on every rank when
 * a rank has no usable GPU or no libnccl (or kiln was built without NCCL); KILN_ERR_IO with
 * NCCL's message when NCCL fails.
 *
 * Its calls take the semantics above, with these differences. Buffers are device memory of
 * the CUDA backend (its alloc) on its GPU; any other is KILN_ERR_ARG. Every operation is
 * queued on the communicator's own stream behind the ops called on the backend before it, and
 * runs beside those called after it: a blocking call returns when its result is in place (ops
 * called then see it); a started one's buffers are left alone until its request completes
 * (a CUDA event), as for every kind. MAX and MIN are NCCL's (fmaxf, fminf): a NaN meets a number and gives the
 * number, so NaN does not propagate. BF16/F16 sums round once per combination as above, in
 * NCCL's order (ring, tree), or once in all over NVLink SHARP. send and recv take tags >= 0 but
 * do not match them: the messages between two ranks match in call order, counts must agree
 * and are not checked (a mismatch hangs or truncates), and send returns when the peer has
 * received (two ranks that both send first wait for ever). kiln_comm_split needs NCCL 2.18
 * or newer (ncclCommSplit; KILN_ERR_UNSUPPORTED before). No shared memory
 * (kiln_comm_alloc_shared gives NULL); kiln_comm_abort_job aborts NCCL and returns, and the
 * launcher ends the other ranks when the process exits. The calling thread's current CUDA device is set to the
 * backend's. */
kiln_status kiln_comm_init_nccl(kiln_comm *boot, kiln_comm **out);

/* NULL safe. Freeing the last MPI communicator (the world one, once the groups split from
 * it are freed) calls MPI_Finalize when kiln called MPI_Init. */
void kiln_comm_free(kiln_comm *c);

int kiln_comm_rank(const kiln_comm *c);
int kiln_comm_size(const kiln_comm *c);
const char *kiln_comm_kind(const kiln_comm *c); /* "single", "mpi" */

/* Sub-groups (tensor or pipeline parallel groups): every rank of c calls it; those with the
 * same color (>= 0) form one communicator, ranked by key (ties by their rank in c). */
kiln_status kiln_comm_split(kiln_comm *c, int color, int key, kiln_comm **out);

/* ---- collectives ----
 * dtype: reductions take F32, BF16 and F16; broadcast, allgather, send and recv move any
 * dtype as bytes. Reductions of BF16 and F16 add (or compare) in fp32 per element and round
 * to nearest even each time two partial results meet: each of the size()-1 combinations an
 * element goes through rounds once, a relative error of 2^-8 (BF16) or 2^-11 (F16) per
 * combination. F32 reductions are MPI's own. NaN propagates through BF16/F16 MAX and MIN.
 *
 * Invalid arguments are KILN_ERR_ARG with a message: a NULL buffer with a count > 0,
 * negative counts, a dtype or op out of range, root or peer out of range, peer == self,
 * buffers that overlap other than in the in-place layouts below. An MPI failure is
 * KILN_ERR_IO with MPI's error string. */

/* recv = op over ranks of send, count elements. send == recv is in place. */
kiln_status kiln_comm_allreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                kiln_reduce_op op, kiln_comm *c);
/* send holds sum(counts) elements; rank r receives counts[r] elements, the r-th consecutive
 * piece reduced over ranks. counts has size() entries, the same on every rank. In place:
 * recv == send (the result lands at the start) or recv == send + the rank's offset (NCCL's
 * layout); in place the rest of send is left undefined. */
kiln_status kiln_comm_reduce_scatter(const void *send, void *recv, const int64_t *counts,
                                     kiln_dtype dt, kiln_reduce_op op, kiln_comm *c);
/* Rank r contributes counts[r] elements from send; recv gets all sum(counts), in rank order.
 * In place: send points into recv at rank r's piece. */
kiln_status kiln_comm_allgather(const void *send, void *recv, const int64_t *counts, kiln_dtype dt,
                                kiln_comm *c);
/* buf of root to every rank's buf. */
kiln_status kiln_comm_broadcast(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c);
/* Point to point, blocking; tag >= 0 (at most 32767 is portable; MPI_TAG_UB is checked). */
kiln_status kiln_comm_send(const void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                           kiln_comm *c);
/* count must be the count the peer sent (both sides cut past INT_MAX the same way); any
 * other is KILN_ERR_IO naming both. */
kiln_status kiln_comm_recv(void *buf, int64_t count, kiln_dtype dt, int peer, int tag,
                           kiln_comm *c);
kiln_status kiln_comm_barrier(kiln_comm *c);

/* ---- non-blocking forms ----
 * *req is set; complete it with kiln_comm_wait (which frees it) or poll it with
 * kiln_comm_test (which frees it when *done). Buffers stay untouched until completion.
 * Requests complete in any order; the collectives start in call order on every rank. */
kiln_status kiln_comm_iallreduce(const void *send, void *recv, int64_t count, kiln_dtype dt,
                                 kiln_reduce_op op, kiln_comm *c, kiln_comm_request **req);
kiln_status kiln_comm_ireduce_scatter(const void *send, void *recv, const int64_t *counts,
                                      kiln_dtype dt, kiln_reduce_op op, kiln_comm *c,
                                      kiln_comm_request **req);
kiln_status kiln_comm_iallgather(const void *send, void *recv, const int64_t *counts, kiln_dtype dt,
                                 kiln_comm *c, kiln_comm_request **req);
kiln_status kiln_comm_ibroadcast(void *buf, int64_t count, kiln_dtype dt, int root, kiln_comm *c,
                                 kiln_comm_request **req);
/* Frees req, also when it fails. */
kiln_status kiln_comm_wait(kiln_comm_request *req);
/* *done = 1 (and req freed) when complete, else 0. A failure frees req too. */
kiln_status kiln_comm_test(kiln_comm_request *req, int *done);
/* Lets MPI advance outstanding non-blocking operations: call it between pieces of compute
 * (MPI progresses them only inside its calls). Nothing for "single". */
void kiln_comm_progress(kiln_comm *c);

/* ---- memory the ranks of one machine share ----
 * Where the ranks of c run on one machine, or on several that each run the same number (2 or
 * more) of consecutive ranks (KILN_COMM_NODE_RANKS=L: machines of L ranks, whatever the
 * hardware), kiln_comm_alloc_shared gives this rank `bytes`
 * of zeroed memory in an MPI shared-memory window (MPI_Win_allocate_shared over the ranks of
 * the machine) that every rank maps. The blocking allreduce (in place), reduce-scatter
 * (send in it; recv at the rank's own piece of send, NCCL's layout, or in memory of the
 * rank's own) and allgather (in place) of at least 64 KiB of a buffer at the same offset of
 * such memory on every rank then move nothing through MPI's messages: between barriers,
 * each rank reduces its piece from every rank's buffer, adding the ranks in rank order, and
 * (allreduce, allgather) copies the other pieces from their owners. On several machines
 * each machine does the same with its ranks' buffers, and MPI moves only what crosses
 * machines: local rank l's share, over the rail of the ranks with local index l. Every rank
 * gets the same bits. Every other call, and the non-blocking forms, go through MPI as before.
 * Collective: every rank calls it with the same bytes. *out = NULL (and KILN_OK) where it
 * does not apply: "single", machines of unequal or non-consecutive ranks, or KILN_COMM_SHM=0 in the
 * environment; the caller then allocates as before. Memory of another rank that this rank
 * reads counts in this process's resident set too (RSS), but exists once. */
kiln_status kiln_comm_alloc_shared(kiln_comm *c, size_t bytes, void **out);
/* What kiln_comm_alloc_shared gave, given back. Local: a rank may call it alone (on a
 * failure path); the memory goes at the next kiln_comm_alloc_shared or kiln_comm_free,
 * which every rank reaches in step. NULL safe. */
void kiln_comm_free_shared(kiln_comm *c, void *p);
/* One buffer of `bytes` for all the ranks of the machine: every rank's *out maps the same
 * zeroed memory, zeroed before any rank returns (and NULL where kiln_comm_alloc_shared gives
 * none). Each rank writes only the pieces it owns; the in-place allgather of the buffer then
 * copies nothing (every rank's pieces are everyone's already) and is a barrier after which
 * every rank reads them: ZeRO 1's updated weights, one copy per machine. A reduction of it is
 * refused on every rank (KILN_ERR_ARG): each would add the same memory. Collective, with the
 * same bytes on every rank; given back as kiln_comm_alloc_shared's memory is. */
kiln_status kiln_comm_alloc_common(kiln_comm *c, size_t bytes, void **out);
/* kiln_comm_free_shared, and the memory freed now with whatever else was given back:
 * collective (every rank gives back its p in the same call). NULL safe. */
kiln_status kiln_comm_free_shared_now(kiln_comm *c, void *p);
/* 1 when kiln_comm_alloc_shared gives memory on c (every rank says the same), else 0. */
int kiln_comm_shares_memory(const kiln_comm *c);
/* The ranks that share memory with this one, itself included (its machine's ranks, where
 * kiln_comm_shares_memory; else 1). */
int kiln_comm_local_size(const kiln_comm *c);

/* ---- metrics ---- */
/* Payload bytes this rank has sent, as the textbook algorithm of each collective counts
 * them (what the network must carry, whatever MPI picked): ring allreduce 2(n-1)/n x bytes;
 * ring reduce-scatter and allgather every piece but one (n-1 of n for equal pieces); a
 * chain broadcast the buffer once on every rank but the root's predecessor; send its
 * bytes. 0 for "single". */
uint64_t kiln_comm_bytes_sent(const kiln_comm *c);
/* Of those, the bytes that left this process as messages (MPI's, NCCL's), by the same model:
 * a collective through the machine's shared memory (kiln_comm_alloc_shared) counts 0 on one
 * machine and, on several, what its rail between machines carries (see there). */
uint64_t kiln_comm_net_bytes(const kiln_comm *c);
/* Seconds spent inside blocking calls and kiln_comm_wait. */
double kiln_comm_wait_seconds(const kiln_comm *c);

/* A job that cannot go on. The library never ends the process: kiln_comm_abort prints msg on
 * this rank's stderr and calls the abort handler the program registered (one per process; the
 * kiln tool's calls kiln_comm_abort_job, then exits with the code). Without a handler, or when
 * it returns, kiln_comm_abort returns KILN_ERR_ABORTED (msg kept as the error's message) and
 * the process goes on; the communicator is as it was. fn NULL removes the handler. */
typedef void (*kiln_comm_abort_fn)(kiln_comm *c, int code, const char *msg, void *user);
void kiln_comm_set_abort_handler(kiln_comm_abort_fn fn, void *user);
kiln_status kiln_comm_abort(kiln_comm *c, int code, const char *msg);
/* For an abort handler: the job's other ranks ended with this code. "mpi": MPI_Abort (which,
 * under Open MPI, ends this process too, with the code); "nccl": ncclCommAbort, so that no
 * rank waits on this one's collectives (the launcher ends the others when this process exits),
 * then it returns; "single": nothing. The library itself never calls it. */
void kiln_comm_abort_job(kiln_comm *c, int code);

#ifdef __cplusplus
}
#endif
#endif
