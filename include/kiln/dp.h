/* kiln: data parallelism over a communicator (kiln/comm.h): gradient buckets reduced while
 * backward still computes, and ZeRO's shards of the optimizer state and gradients.
 *
 * Every rank holds the whole parameter and gradient slabs (n elements). The slab is cut into
 * world shards, contiguous and in rank order; rank r's optimizer owns shard r ([lo, hi) of
 * kiln_dp_shard) when zero >= 1, and the whole slab when zero == 0. A step:
 *
 *   kiln_dp_begin(dp, grads)            before the last micro-batch's backward
 *   kiln_dp_ready(dp, lo, hi)           from the model's grad-ready callback (kiln/model.h):
 *                                       a bucket whose ranges are all final is handed to a
 *                                       communication thread and reduced at once
 *   kiln_dp_finish(dp)                  after backward: waits for the last buckets
 *   kiln_dp_add_rows(dp, ...)           the embedding's rows, when kept apart (below)
 *   kiln_dp_allreduce_sums(dp, v, k)    global scalars (the loss, the gradients' sum of squares)
 *   (the optimizer updates its range)
 *   kiln_dp_gather(dp, params, dtype)   zero >= 1: every rank's updated shard to every rank
 *
 * After finish the gradients hold the SUM over ranks (the caller scales the loss by 1/world
 * to average): everywhere for zero 0 (allreduce), on this rank's shard only for zero 1-3
 * (reduce-scatter, half the bytes: the rest of the slab is left undefined with zero 1, zero
 * again with its pages given back with zero 2 and 3). Buckets are
 * reduced in the order backward finishes them (the head, then blocks L-1..0, then the embeddings);
 * with bucket_bytes 0 the whole slab is one reduction after backward.
 *
 * MPI calls come from the communication thread while backward runs and from the calling
 * thread between finish and the next begin, never both at once (MPI_THREAD_SERIALIZED);
 * kiln_dp_create_queued's engine makes every call on the caller's thread. */
#ifndef KILN_DP_H
#define KILN_DP_H

#include <stdint.h>

#include "kiln/comm.h"
#include "kiln/dtype.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_dp_config {
    int zero;                /* 0: replicated; 1: optimizer state sharded; 2: gradients too;
                                3: parameters too (gathered per part for use, then dropped) */
    int64_t bucket_bytes;    /* about this many bytes of fp32 gradients per bucket (0: one) */
    kiln_dtype reduce_dtype; /* F32, or BF16: gradients travel in bf16, added in fp32 */
    /* The embedding's rows apart (kiln_gpt_set_embed_rows_apart): wte's gradient reduced as
     * soon as the classifier's backward has run, every rank's embedding rows gathered and
     * added after backward. -1: where the rows are few against wte's (every other rank's
     * rows at most a quarter of wte's vocabulary, (world - 1) B T <= Vp / 4), 0: never,
     * 1: always. Not with local SGD. */
    int rows_apart;
} kiln_dp_config;

/* zero 0, buckets of 25 MiB, fp32 reduction, the rows apart where they are few (-1). */
kiln_dp_config kiln_dp_config_default(void);

typedef struct kiln_dp kiln_dp; /* opaque */

/* A data-parallel engine over comm (which must outlive it) for a slab of n elements whose
 * gradients backward reports in the nranges ranges [lo[i], hi[i]), in report order (they
 * must cover [0, n) exactly; kiln_gpt_grad_ranges gives them). Starts the thread. */
kiln_status kiln_dp_create(kiln_dp **out, kiln_comm *comm, const kiln_dp_config *cfg, int64_t n,
                           const int64_t *lo, const int64_t *hi, int nranges);
/* The same engine without a thread, for communicators whose operations are queued rather than
 * run (NCCL's, on a GPU's stream): kiln_dp_ready starts each final bucket's reduction on the
 * caller's thread with the non-blocking collectives, and kiln_dp_finish waits for them in order.
 * comm moves the slabs (device memory for NCCL); host (NULL: comm) carries
 * kiln_dp_allreduce_sums' host scalars and must have comm's ranks. ZeRO 0 and 1 with fp32
 * reductions only, and neither the rows apart, nor ZeRO 3's gathers, nor kiln_dp_average.
 * comm_s is then the span from the first start to the end of the wait in finish. */
kiln_status kiln_dp_create_queued(kiln_dp **out, kiln_comm *comm, kiln_comm *host,
                                  const kiln_dp_config *cfg, int64_t n, const int64_t *lo,
                                  const int64_t *hi, int nranges);
void kiln_dp_free(kiln_dp *dp); /* NULL safe */

/* Shard r of a slab of n elements over world ranks: equal pieces, edges on multiples of 16
 * elements (what kiln_dp_shard_of gives, without an engine). */
void kiln_dp_shard_bounds(int64_t n, int world, int r, int64_t *lo, int64_t *hi);
/* This rank's shard of the slab: what its optimizer updates ([0, n) for zero 0). */
void kiln_dp_shard(const kiln_dp *dp, int64_t *lo, int64_t *hi);
/* Shard r's range, for any rank r. */
void kiln_dp_shard_of(const kiln_dp *dp, int r, int64_t *lo, int64_t *hi);
int kiln_dp_num_buckets(const kiln_dp *dp);

kiln_status kiln_dp_begin(kiln_dp *dp, float *grads);
void kiln_dp_ready(kiln_dp *dp, int64_t lo, int64_t hi);
kiln_status kiln_dp_finish(kiln_dp *dp);
/* v[0..k) = the sum over ranks of each v[i] (doubles), k <= 8. */
kiln_status kiln_dp_allreduce_sums(kiln_dp *dp, double *v, int k);
/* zero >= 1: params (the whole slab, dtype) gets every shard from its owner. */
kiln_status kiln_dp_gather(kiln_dp *dp, void *params, kiln_dtype dt);

/* x (n floats, the same slab on every rank) = its mean over the ranks, in fp32; timed as
 * other_s (local SGD's averaging of the weights). Not during backward. */
kiln_status kiln_dp_average(kiln_dp *dp, float *x, int64_t n);

/* ZeRO 3's parameters: [lo, hi) of buf (the whole slab, dtype dt) from every rank's shard,
 * in place, queued behind the thread's other work; *ticket for kiln_dp_wait. */
kiln_status kiln_dp_gather_range_async(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo,
                                       int64_t hi, uint64_t *ticket);
/* Wait for a queued job and everything before it (the time waited adds to exposed_s and to
 * *waited_s, which may be NULL). */
kiln_status kiln_dp_wait(kiln_dp *dp, uint64_t ticket, double *waited_s);
/* Wait until the thread has nothing left to do. */
kiln_status kiln_dp_idle(kiln_dp *dp);
/* Zero [lo, hi) of buf outside this rank's shard and give its whole pages back
 * (kiln_memory_discard): a gathered part released, or reduced gradients not this rank's. */
void kiln_dp_discard_range(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo, int64_t hi);

/* The embedding's rows apart (kiln_gpt_set_embed_rows_apart): room for every rank's rows,
 * up to max_rows of C values of dtype dt each per rank, taken now; kiln_dp_rows_bytes is how
 * much (the plan's). */
kiln_status kiln_dp_rows_reserve(kiln_dp *dp, int64_t max_rows, int64_t C, kiln_dtype dt);
size_t kiln_dp_rows_bytes(int world, int64_t max_rows, int64_t C, kiln_dtype dt);
/* After kiln_dp_finish: every rank's n rows (row ids[i] of wte, whose gradient starts at
 * element `at` of grads; rows of C values of the reserved dtype) gathered and added into
 * grads in rank order, each rank's rows in order, on this rank's shard (zero 2 and 3) or
 * everywhere; timed as other_s. n may differ across ranks. */
kiln_status kiln_dp_add_rows(kiln_dp *dp, float *grads, int64_t at, const int32_t *ids,
                             const void *rows, int64_t n);

typedef struct kiln_dp_stats {
    double comm_s;    /* seconds the gradient reductions took (on the thread) */
    double exposed_s; /* seconds the caller waited for them in kiln_dp_finish */
    double other_s;   /* seconds in allreduce_sums and gather (never hidden) */
    uint64_t bytes;   /* payload bytes this rank sent (kiln_comm_bytes_sent's count) */
    uint64_t net_bytes; /* of those, what left the process as messages (kiln_comm_net_bytes) */
} kiln_dp_stats;
/* Totals since the last call (then reset). hidden = 1 - exposed_s / comm_s. */
kiln_dp_stats kiln_dp_take_stats(kiln_dp *dp);

#ifdef __cplusplus
}
#endif
#endif
