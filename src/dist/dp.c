/* Data parallelism: gradient buckets reduced on a communication thread while backward
 * computes, ZeRO shards, and the gather of updated shards (kiln/dp.h). */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/core.h"
#include "kiln/dp.h"

#define SHARD_ALIGN 16 /* elements: shard edges on 64-byte lines of fp32 */
#define DP_INFLIGHT 2  /* ZeRO 2/3: jobs queued before backward waits (kiln_dp_ready) */

typedef struct bucket {
    int64_t lo, hi; /* slab elements */
    int last_range; /* the range whose report completes it */
} bucket;

/* Work for the thread, done in the order posted (the same on every rank). */
typedef struct job {
    int kind; /* JOB_BUCKET: reduce bucket `index`; JOB_GATHER: [lo, hi) of buf */
    int index;
    int64_t lo, hi;
    void *buf;
    kiln_dtype dt;
} job;
enum { JOB_BUCKET, JOB_GATHER };

struct kiln_dp {
    kiln_comm *comm; /* the slabs' collectives */
    kiln_comm *host; /* the scalars' (host memory): comm's unless queued on another */
    /* queued (kiln_dp_create_queued): no thread; each bucket's reduction is started on the
     * caller's thread as it becomes final, and finish waits for the requests in order */
    int queued;
    kiln_comm_request **reqs;
    int64_t nreqs, reqs_cap;
    double started_ms; /* this step's first reduction started (kiln_time_ms) */
    uint64_t host_bytes_at_take, host_net_at_take;
    kiln_dp_config cfg;
    int rank, world;
    int64_t n;
    int64_t *shard_lo, *shard_hi; /* world entries */
    int64_t *range_lo, *range_hi;
    int nranges;
    bucket *buckets;
    int nbuckets;
    int64_t *counts;   /* world entries, scratch of the thread's reduce-scatter */
    uint16_t *staging; /* bf16 reduction: the largest bucket */
    float *grads;
    int next_range;     /* the range kiln_dp_ready expects next */
    int buckets_posted; /* of this step */
    int in_step;
    /* the thread, and what it shares with the caller (under mu) */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *jobs; /* a ring of cap jobs; job k is jobs[k % cap] */
    int64_t cap;
    uint64_t posted, done; /* jobs posted and done since the start */
    int quit;
    kiln_status error;
    char error_msg[512];
    double comm_s, exposed_s, other_s;
    uint64_t bytes_at_take, net_at_take;
    /* the embedding's rows apart (kiln_dp_rows_reserve): every rank's, gathered */
    int64_t rows_cap, rows_C;
    kiln_dtype rows_dt;
    int32_t *row_ids;
    void *row_buf;
    int64_t *row_counts;
};

static void discard_outside_shard(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo, int64_t hi);

kiln_dp_config kiln_dp_config_default(void) {
    kiln_dp_config c = {.zero = 0,
                        .bucket_bytes = (int64_t)25 << 20,
                        .reduce_dtype = KILN_DTYPE_F32,
                        .rows_apart = -1};
    return c;
}

void kiln_dp_shard_bounds(int64_t n, int world, int r, int64_t *lo, int64_t *hi) {
    int64_t units = (n + SHARD_ALIGN - 1) / SHARD_ALIGN; /* equal pieces, edges aligned */
    int64_t a = units * r / world * SHARD_ALIGN, b = units * (r + 1) / world * SHARD_ALIGN;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

void kiln_dp_shard_of(const kiln_dp *dp, int r, int64_t *lo, int64_t *hi) {
    *lo = dp->shard_lo[r];
    *hi = dp->shard_hi[r];
}

void kiln_dp_shard(const kiln_dp *dp, int64_t *lo, int64_t *hi) {
    if (dp->cfg.zero == 0) {
        *lo = 0;
        *hi = dp->n;
        return;
    }
    kiln_dp_shard_of(dp, dp->rank, lo, hi);
}

int kiln_dp_num_buckets(const kiln_dp *dp) {
    return dp->nbuckets;
}

static int64_t overlap(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    int64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0;
}

/* MPI's collectives may take scratch the size of what one call moves (Open MPI's in-place
 * reduce-scatter and allgather do), so no call moves more than PIECE elements: a bucket
 * holding wte alone would otherwise cost hundreds of MiB of scratch. */
#define PIECE ((int64_t)4 << 20)

/* [lo, hi) of the gradients summed over ranks: all of it (zero 0), or this rank's part
 * (zero >= 1: its optimizer reads no other). */
static kiln_status reduce_piece(kiln_dp *dp, int64_t lo, int64_t hi) {
    int64_t len = hi - lo;
    float *g = dp->grads + lo;
    int bf16 = dp->cfg.reduce_dtype == KILN_DTYPE_BF16;
    void *buf = bf16 ? (void *)dp->staging : (void *)g;
    kiln_dtype dt = bf16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
    if (bf16)
        kiln_convert(dp->staging, KILN_DTYPE_BF16, g, KILN_DTYPE_F32, len);
    if (dp->cfg.zero < 1) {
        KILN_CHECK(kiln_comm_allreduce(buf, buf, len, dt, KILN_REDUCE_SUM, dp->comm));
        if (bf16)
            kiln_convert(g, KILN_DTYPE_F32, dp->staging, KILN_DTYPE_BF16, len);
        return KILN_OK;
    }
    int64_t before = 0;
    for (int r = 0; r < dp->world; r++) {
        dp->counts[r] = overlap(lo, hi, dp->shard_lo[r], dp->shard_hi[r]);
        if (r < dp->rank)
            before += dp->counts[r];
    }
    size_t esz = kiln_dtype_size(dt);
    void *mine = (char *)buf + before * (int64_t)esz; /* NCCL's in-place layout */
    KILN_CHECK(kiln_comm_reduce_scatter(buf, mine, dp->counts, dt, KILN_REDUCE_SUM, dp->comm));
    if (bf16 && dp->counts[dp->rank] > 0)
        kiln_convert(g + before, KILN_DTYPE_F32, mine, KILN_DTYPE_BF16, dp->counts[dp->rank]);
    return KILN_OK;
}

/* Queued: [lo, hi) of the gradients summed over ranks, started (reduce_piece's collectives in
 * their non-blocking forms, fp32 only), the request kept for finish. */
static kiln_status start_piece(kiln_dp *dp, int64_t lo, int64_t hi) {
    float *g = dp->grads + lo;
    if (dp->nreqs >= dp->reqs_cap)
        return kiln_error_setf(KILN_ERR_INTERNAL, "data parallel: more than %lld reductions a step",
                               (long long)dp->reqs_cap);
    kiln_comm_request **req = &dp->reqs[dp->nreqs];
    if (dp->nreqs == 0)
        dp->started_ms = kiln_time_ms();
    if (dp->cfg.zero < 1) {
        KILN_CHECK(kiln_comm_iallreduce(g, g, hi - lo, KILN_DTYPE_F32, KILN_REDUCE_SUM, dp->comm,
                                        req));
    } else {
        int64_t before = 0;
        for (int r = 0; r < dp->world; r++) {
            dp->counts[r] = overlap(lo, hi, dp->shard_lo[r], dp->shard_hi[r]);
            if (r < dp->rank)
                before += dp->counts[r];
        }
        KILN_CHECK(kiln_comm_ireduce_scatter(g, g + before, dp->counts, KILN_DTYPE_F32,
                                             KILN_REDUCE_SUM, dp->comm, req));
    }
    dp->nreqs++;
    return KILN_OK;
}

/* Queued: a bucket's reductions started; the first failure is kept for finish, and nothing
 * more starts after it. */
static void start_bucket(kiln_dp *dp, const bucket *b) {
    for (int64_t a = b->lo; a < b->hi && dp->error == KILN_OK; a += PIECE) {
        kiln_status s = start_piece(dp, a, b->hi - a < PIECE ? b->hi : a + PIECE);
        if (s != KILN_OK) {
            dp->error = s;
            snprintf(dp->error_msg, sizeof dp->error_msg, "%s", kiln_error_message());
        }
    }
}

/* One bucket's reduction, on the thread, piece by piece. With zero 2 and 3 the rest of the
 * bucket (not this rank's) is zeroed again and its pages given back. */
static kiln_status reduce_bucket(kiln_dp *dp, const bucket *b) {
    for (int64_t a = b->lo; a < b->hi; a += PIECE)
        KILN_CHECK(reduce_piece(dp, a, b->hi - a < PIECE ? b->hi : a + PIECE));
    if (dp->cfg.zero >= 2)
        discard_outside_shard(dp, dp->grads, KILN_DTYPE_F32, b->lo, b->hi);
    return KILN_OK;
}

/* [lo, hi) of buf from every rank's shard of it, in place (each rank's own piece is there). */
static kiln_status gather_piece(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo, int64_t hi) {
    int64_t before = 0;
    for (int r = 0; r < dp->world; r++) {
        dp->counts[r] = overlap(lo, hi, dp->shard_lo[r], dp->shard_hi[r]);
        if (r < dp->rank)
            before += dp->counts[r];
    }
    size_t esz = kiln_dtype_size(dt);
    char *base = (char *)buf + lo * (int64_t)esz;
    return kiln_comm_allgather(base + before * (int64_t)esz, base, dp->counts, dt, dp->comm);
}

/* In pieces of at most PIECE elements (see above). */
static kiln_status gather_range(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo, int64_t hi) {
    for (int64_t a = lo; a < hi; a += PIECE)
        KILN_CHECK(gather_piece(dp, buf, dt, a, hi - a < PIECE ? hi : a + PIECE));
    return KILN_OK;
}

static kiln_status run_job(kiln_dp *dp, const job *j) {
    if (j->kind == JOB_BUCKET)
        return reduce_bucket(dp, &dp->buckets[j->index]);
    return gather_range(dp, j->buf, j->dt, j->lo, j->hi);
}

/* The communication thread ahead of the compute when both want a core (more ranks than
 * cores, or a rank's reduction beside its own compute): a bucket's reduction starts, and
 * the network is kept busy, as soon as the bucket is final. KILN_COMM_NICE (default -10) is
 * its nice value relative to the process's; 0 leaves it; where the process may not lower a
 * nice value (no CAP_SYS_NICE, RLIMIT_NICE) it stays as it was. */
static void comm_thread_priority(void) {
    const char *env = getenv("KILN_COMM_NICE");
    char *end = NULL;
    long d = env && *env ? strtol(env, &end, 10) : -10;
    if ((end && *end) || d == 0 || d < -40 || d > 40)
        return;
    errno = 0;
    int now = getpriority(PRIO_PROCESS, 0);
    if (now == -1 && errno)
        return;
    long want = now + d < -20 ? -20 : now + d > 19 ? 19 : now + d;
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), (int)want);
}

static void *thread_main(void *arg) {
    kiln_dp *dp = arg;
    comm_thread_priority();
    pthread_mutex_lock(&dp->mu);
    for (;;) {
        while (!dp->quit && dp->done == dp->posted)
            pthread_cond_wait(&dp->cv, &dp->mu);
        if (dp->quit)
            break;
        job j = dp->jobs[dp->done % (uint64_t)dp->cap];
        int failed = dp->error != KILN_OK;
        pthread_mutex_unlock(&dp->mu);
        kiln_status s = KILN_OK;
        double t0 = kiln_time_ms();
        if (!failed) /* after a failure the ranks are out of step: reduce nothing more */
            s = run_job(dp, &j);
        double ms = kiln_time_ms() - t0;
        pthread_mutex_lock(&dp->mu);
        if (s != KILN_OK && dp->error == KILN_OK) {
            dp->error = s;
            snprintf(dp->error_msg, sizeof dp->error_msg, "%s", kiln_error_message());
        }
        dp->comm_s += ms / 1e3;
        dp->done++;
        pthread_cond_broadcast(&dp->cv);
    }
    pthread_mutex_unlock(&dp->mu);
    return NULL;
}

static int by_lo(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* The ranges, in any order, cover [0, n) once: sorted by their start they tile it. */
static kiln_status check_ranges(int64_t n, const int64_t *lo, const int64_t *hi, int k) {
    if (k < 1)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: no gradient ranges");
    int64_t *r = malloc((size_t)k * 2 * sizeof *r);
    if (!r)
        return kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
    for (int i = 0; i < k; i++)
        r[2 * i] = lo[i], r[2 * i + 1] = hi[i];
    qsort(r, (size_t)k, 2 * sizeof *r, by_lo);
    int64_t at = 0;
    kiln_status s = KILN_OK;
    for (int i = 0; i < k && s == KILN_OK; i++) {
        if (r[2 * i] != at || r[2 * i + 1] < r[2 * i])
            s = kiln_error_setf(KILN_ERR_ARG,
                                "data parallel: gradient range [%lld, %lld) does not start where "
                                "the one below it ends (%lld): the ranges must cover the slab "
                                "once",
                                (long long)r[2 * i], (long long)r[2 * i + 1], (long long)at);
        at = r[2 * i + 1];
    }
    if (s == KILN_OK && at != n)
        s = kiln_error_setf(KILN_ERR_ARG,
                            "data parallel: the gradient ranges end at %lld, not at "
                            "the slab's end %lld",
                            (long long)at, (long long)n);
    free(r);
    return s;
}

static kiln_status build(kiln_dp *dp, const int64_t *lo, const int64_t *hi, int k) {
    int W = dp->world;
    dp->shard_lo = calloc((size_t)W, sizeof(int64_t));
    dp->shard_hi = calloc((size_t)W, sizeof(int64_t));
    dp->counts = calloc((size_t)W, sizeof(int64_t));
    dp->range_lo = malloc((size_t)k * sizeof(int64_t));
    dp->range_hi = malloc((size_t)k * sizeof(int64_t));
    dp->buckets = calloc((size_t)k, sizeof(bucket));
    dp->cap = k + 64;
    dp->jobs = calloc((size_t)dp->cap, sizeof(job));
    if (!dp->shard_lo || !dp->shard_hi || !dp->counts || !dp->range_lo || !dp->range_hi ||
        !dp->buckets || !dp->jobs)
        return kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
    memcpy(dp->range_lo, lo, (size_t)k * sizeof(int64_t));
    memcpy(dp->range_hi, hi, (size_t)k * sizeof(int64_t));
    dp->nranges = k;
    for (int r = 0; r < W; r++)
        kiln_dp_shard_bounds(dp->n, W, r, &dp->shard_lo[r], &dp->shard_hi[r]);
    /* buckets: consecutive ranges in report order until bucket_bytes of fp32 gradients */
    int64_t cap =
        dp->cfg.bucket_bytes > 0 ? dp->cfg.bucket_bytes / (int64_t)sizeof(float) : dp->n + 1;
    int64_t largest = 0;
    /* a bucket: ranges reported one after another, each just below the one before */
    for (int i = 0; i < k;) {
        bucket *b = &dp->buckets[dp->nbuckets++];
        b->hi = hi[i];
        i++;
        while (i < k && hi[i] == lo[i - 1] && b->hi - lo[i] <= cap)
            i++;
        b->lo = lo[i - 1];
        b->last_range = i - 1;
        if (b->hi - b->lo > largest)
            largest = b->hi - b->lo;
    }
    if (dp->queued) { /* a request per piece of every bucket */
        dp->reqs_cap = dp->nbuckets + dp->n / PIECE + 2;
        dp->reqs = calloc((size_t)dp->reqs_cap, sizeof *dp->reqs);
        if (!dp->reqs)
            return kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
    }
    if (dp->cfg.reduce_dtype == KILN_DTYPE_BF16) {
        if (largest > PIECE)
            largest = PIECE; /* buckets are reduced in pieces */
        dp->staging = malloc((size_t)(largest > 0 ? largest : 1) * sizeof(uint16_t));
        if (!dp->staging)
            return kiln_error_setf(KILN_ERR_NOMEM,
                                   "data parallel: cannot allocate %lld bf16 elements for the "
                                   "reduction",
                                   (long long)largest);
    }
    return KILN_OK;
}

static kiln_status create(kiln_dp **out, kiln_comm *comm, kiln_comm *host, int queued,
                          const kiln_dp_config *cfg, int64_t n, const int64_t *lo,
                          const int64_t *hi, int nranges) {
    *out = NULL;
    if (!comm || !host || !cfg || n < 1)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: no communicator or empty slab");
    if (cfg->zero < 0 || cfg->zero > 3)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "data parallel: ZeRO stage %d is not one of 0, 1, 2, 3", cfg->zero);
    if (cfg->bucket_bytes < 0)
        return kiln_error_setf(KILN_ERR_CONFIG, "data parallel: bucket size must be >= 0");
    if (cfg->reduce_dtype != KILN_DTYPE_F32 && cfg->reduce_dtype != KILN_DTYPE_BF16)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "data parallel: gradients are reduced in fp32 or bf16, not %s",
                               kiln_dtype_name(cfg->reduce_dtype));
    if (kiln_comm_size(host) != kiln_comm_size(comm) ||
        kiln_comm_rank(host) != kiln_comm_rank(comm))
        return kiln_error_setf(KILN_ERR_ARG,
                               "data parallel: the scalars' communicator (rank %d of %d) is not "
                               "the slabs' (rank %d of %d)",
                               kiln_comm_rank(host), kiln_comm_size(host), kiln_comm_rank(comm),
                               kiln_comm_size(comm));
    if (queued && (cfg->zero > 1 || cfg->reduce_dtype != KILN_DTYPE_F32))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "data parallel with reductions started as backward reports them "
                               "(a GPU's) takes ZeRO 0 or 1 and fp32 reductions, not ZeRO %d with "
                               "%s",
                               cfg->zero, kiln_dtype_name(cfg->reduce_dtype));
    KILN_CHECK(check_ranges(n, lo, hi, nranges));
    kiln_dp *dp = calloc(1, sizeof *dp);
    if (!dp)
        return kiln_error_setf(KILN_ERR_NOMEM, "data parallel: out of memory");
    dp->comm = comm;
    dp->host = host;
    dp->queued = queued;
    dp->cfg = *cfg;
    dp->rank = kiln_comm_rank(comm);
    dp->world = kiln_comm_size(comm);
    dp->n = n;
    dp->bytes_at_take = kiln_comm_bytes_sent(comm);
    dp->net_at_take = kiln_comm_net_bytes(comm);
    if (host != comm) {
        dp->host_bytes_at_take = kiln_comm_bytes_sent(host);
        dp->host_net_at_take = kiln_comm_net_bytes(host);
    }
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->cv, NULL);
    kiln_status s = build(dp, lo, hi, nranges);
    if (s == KILN_OK && !queued) {
        if (pthread_create(&dp->thread, NULL, thread_main, dp) != 0)
            s = kiln_error_setf(KILN_ERR_IO,
                                "data parallel: cannot start the communication thread");
        else
            dp->thread_started = 1;
    }
    if (s != KILN_OK) {
        kiln_dp_free(dp);
        return s;
    }
    *out = dp;
    return KILN_OK;
}

kiln_status kiln_dp_create(kiln_dp **out, kiln_comm *comm, const kiln_dp_config *cfg, int64_t n,
                           const int64_t *lo, const int64_t *hi, int nranges) {
    return create(out, comm, comm, 0, cfg, n, lo, hi, nranges);
}

kiln_status kiln_dp_create_queued(kiln_dp **out, kiln_comm *comm, kiln_comm *host,
                                  const kiln_dp_config *cfg, int64_t n, const int64_t *lo,
                                  const int64_t *hi, int nranges) {
    return create(out, comm, host ? host : comm, 1, cfg, n, lo, hi, nranges);
}

/* Queued: wait for every started reduction, in order (all of them, also after a failure, so
 * that none is left in flight on the gradients); the first failure. */
static kiln_status wait_started(kiln_dp *dp) {
    kiln_status first = KILN_OK;
    char msg[512] = "";
    for (int64_t i = 0; i < dp->nreqs; i++) {
        kiln_status s = kiln_comm_wait(dp->reqs[i]);
        dp->reqs[i] = NULL;
        if (s != KILN_OK && first == KILN_OK) {
            first = s;
            snprintf(msg, sizeof msg, "%s", kiln_error_message());
        }
    }
    dp->nreqs = 0;
    if (first != KILN_OK)
        return kiln_error_setf(first, "%s", msg);
    return KILN_OK;
}

void kiln_dp_free(kiln_dp *dp) {
    if (!dp)
        return;
    if (dp->queued)
        (void)wait_started(dp);
    if (dp->thread_started) {
        pthread_mutex_lock(&dp->mu);
        dp->quit = 1;
        pthread_cond_broadcast(&dp->cv);
        pthread_mutex_unlock(&dp->mu);
        pthread_join(dp->thread, NULL);
    }
    pthread_cond_destroy(&dp->cv);
    pthread_mutex_destroy(&dp->mu);
    free(dp->shard_lo);
    free(dp->shard_hi);
    free(dp->counts);
    free(dp->range_lo);
    free(dp->range_hi);
    free(dp->buckets);
    free(dp->jobs);
    free(dp->staging);
    free(dp->reqs);
    free(dp->row_ids);
    free(dp->row_buf);
    free(dp->row_counts);
    free(dp);
}

kiln_status kiln_dp_begin(kiln_dp *dp, float *grads) {
    if (dp->in_step)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: begin twice without finish");
    dp->grads = grads;
    dp->next_range = 0;
    dp->buckets_posted = 0;
    dp->in_step = 1;
    if (dp->queued) {
        dp->error = KILN_OK;
        dp->nreqs = 0;
    }
    return KILN_OK;
}

/* Queue a job (waiting for room in the ring); its ticket is its number. */
static uint64_t post_job(kiln_dp *dp, const job *j) {
    pthread_mutex_lock(&dp->mu);
    while (dp->posted - dp->done >= (uint64_t)dp->cap)
        pthread_cond_wait(&dp->cv, &dp->mu);
    uint64_t ticket = dp->posted;
    dp->jobs[ticket % (uint64_t)dp->cap] = *j;
    dp->posted++;
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
    return ticket;
}

/* This step's buckets up to (not including) `upto`: queued for the thread, or started. */
static void post(kiln_dp *dp, int upto) {
    for (; dp->buckets_posted < upto; dp->buckets_posted++) {
        if (dp->queued) {
            start_bucket(dp, &dp->buckets[dp->buckets_posted]);
            continue;
        }
        job j = {.kind = JOB_BUCKET, .index = dp->buckets_posted};
        post_job(dp, &j);
    }
}

/* Wait until every job up to `until` (a count of jobs) is done; the first error, if any. */
static kiln_status wait_jobs(kiln_dp *dp, uint64_t until, double *waited) {
    double t0 = kiln_time_ms();
    pthread_mutex_lock(&dp->mu);
    while (dp->done < until)
        pthread_cond_wait(&dp->cv, &dp->mu);
    kiln_status s = dp->error;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dp->error_msg);
    pthread_mutex_unlock(&dp->mu);
    if (waited)
        *waited += (kiln_time_ms() - t0) / 1e3;
    if (s != KILN_OK)
        return kiln_error_setf(s, "data parallel: communication on rank %d: %s", dp->rank, msg);
    return KILN_OK;
}

void kiln_dp_ready(kiln_dp *dp, int64_t lo, int64_t hi) {
    if (!dp->in_step || dp->next_range >= dp->nranges)
        return;
    int i = dp->next_range;
    if (dp->range_lo[i] != lo || dp->range_hi[i] != hi) {
        /* out of the order the buckets were built for: no bucket starts early; finish
         * reduces what is left and reports the mismatch */
        dp->next_range = dp->nranges + 1;
        return;
    }
    dp->next_range++;
    int b = dp->buckets_posted;
    while (b < dp->nbuckets && dp->buckets[b].last_range < dp->next_range)
        b++;
    post(dp, b);
    if (dp->queued) { /* MPI's non-blocking collectives advance when MPI is called */
        kiln_comm_progress(dp->comm);
        return;
    }
    /* ZeRO 2 and 3 give each bucket's memory back once it is reduced: backward waits while
     * more than DP_INFLIGHT jobs are queued, so that the gradients held beyond the rank's
     * shard stay within the plan when the reductions fall behind the compute */
    if (dp->cfg.zero >= 2) {
        double t0 = kiln_time_ms();
        pthread_mutex_lock(&dp->mu);
        while (dp->posted - dp->done > DP_INFLIGHT && dp->error == KILN_OK)
            pthread_cond_wait(&dp->cv, &dp->mu);
        pthread_mutex_unlock(&dp->mu);
        dp->exposed_s += (kiln_time_ms() - t0) / 1e3;
    }
}

kiln_status kiln_dp_finish(kiln_dp *dp) {
    if (!dp->in_step)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: finish without begin");
    int out_of_order = dp->next_range > dp->nranges;
    post(dp, dp->nbuckets); /* whatever backward did not report (one bucket: all of it) */
    if (dp->queued) {
        double t0 = kiln_time_ms();
        kiln_status s = wait_started(dp);
        double t1 = kiln_time_ms();
        dp->exposed_s += (t1 - t0) / 1e3;
        /* the reductions' span: from the first start to the last one's end */
        if (dp->started_ms > 0.0)
            dp->comm_s += (t1 - dp->started_ms) / 1e3;
        dp->started_ms = 0.0;
        dp->in_step = 0;
        if (s == KILN_OK && dp->error != KILN_OK)
            s = kiln_error_setf(dp->error, "%s", dp->error_msg);
        dp->error = KILN_OK;
        if (s != KILN_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", kiln_error_message());
            return kiln_error_setf(s, "data parallel: communication on rank %d: %s", dp->rank, msg);
        }
        if (out_of_order)
            return kiln_error_setf(KILN_ERR_ARG, "data parallel: backward reported its gradient "
                                                 "ranges out of the expected order");
        return KILN_OK;
    }
    pthread_mutex_lock(&dp->mu);
    uint64_t all = dp->posted;
    pthread_mutex_unlock(&dp->mu);
    kiln_status s = wait_jobs(dp, all, &dp->exposed_s);
    dp->in_step = 0;
    if (s != KILN_OK)
        return s;
    if (out_of_order)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: backward reported its gradient "
                                             "ranges out of the expected order");
    return KILN_OK;
}

kiln_status kiln_dp_allreduce_sums(kiln_dp *dp, double *v, int k) {
    if (k < 1 || k > 8)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: %d sums (1 to 8)", k);
    if (dp->in_step)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: sums during backward");
    /* doubles as pairs of nothing MPI reduces: the sums travel as fp32 would lose the
     * loss's digits, so each double goes as its value in a float pair (hi, lo) */
    float pairs[16];
    for (int i = 0; i < k; i++) {
        pairs[2 * i] = (float)v[i];
        pairs[2 * i + 1] = (float)(v[i] - (double)pairs[2 * i]);
    }
    KILN_CHECK(kiln_dp_idle(dp));
    double t0 = kiln_time_ms();
    KILN_CHECK(kiln_comm_allreduce(pairs, pairs, 2 * k, KILN_DTYPE_F32, KILN_REDUCE_SUM, dp->host));
    dp->other_s += (kiln_time_ms() - t0) / 1e3;
    for (int i = 0; i < k; i++)
        v[i] = (double)pairs[2 * i] + (double)pairs[2 * i + 1];
    return KILN_OK;
}

kiln_status kiln_dp_gather(kiln_dp *dp, void *params, kiln_dtype dt) {
    if (dp->cfg.zero == 0)
        return KILN_OK;
    KILN_CHECK(kiln_dp_idle(dp));
    double t0 = kiln_time_ms();
    KILN_CHECK(gather_range(dp, params, dt, 0, dp->n));
    dp->other_s += (kiln_time_ms() - t0) / 1e3;
    return KILN_OK;
}

kiln_status kiln_dp_average(kiln_dp *dp, float *x, int64_t n) {
    if (dp->in_step)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: averaging during backward");
    if (dp->queued) /* the mean is taken on the host */
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "data parallel: no averaging of the weights with queued reductions");
    KILN_CHECK(kiln_dp_idle(dp));
    double t0 = kiln_time_ms();
    KILN_CHECK(kiln_comm_allreduce(x, x, n, KILN_DTYPE_F32, KILN_REDUCE_SUM, dp->comm));
    float inv = 1.0f / (float)dp->world;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
    dp->other_s += (kiln_time_ms() - t0) / 1e3;
    return KILN_OK;
}

kiln_dp_stats kiln_dp_take_stats(kiln_dp *dp) {
    kiln_dp_stats st;
    pthread_mutex_lock(&dp->mu);
    uint64_t b = kiln_comm_bytes_sent(dp->comm), nb = kiln_comm_net_bytes(dp->comm);
    uint64_t hb = 0, hnb = 0;
    if (dp->host != dp->comm) {
        hb = kiln_comm_bytes_sent(dp->host);
        hnb = kiln_comm_net_bytes(dp->host);
    }
    st.comm_s = dp->comm_s;
    st.exposed_s = dp->exposed_s;
    st.other_s = dp->other_s;
    st.bytes = b - dp->bytes_at_take;
    st.net_bytes = nb - dp->net_at_take;
    st.bytes += hb - dp->host_bytes_at_take;
    st.net_bytes += hnb - dp->host_net_at_take;
    dp->comm_s = dp->exposed_s = dp->other_s = 0.0;
    dp->bytes_at_take = b;
    dp->net_at_take = nb;
    dp->host_bytes_at_take = hb;
    dp->host_net_at_take = hnb;
    pthread_mutex_unlock(&dp->mu);
    return st;
}

kiln_status kiln_dp_idle(kiln_dp *dp) {
    pthread_mutex_lock(&dp->mu);
    uint64_t all = dp->posted;
    pthread_mutex_unlock(&dp->mu);
    return wait_jobs(dp, all, &dp->other_s);
}

kiln_status kiln_dp_gather_range_async(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo,
                                       int64_t hi, uint64_t *ticket) {
    if (dp->queued)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "data parallel: no ZeRO 3 gathers with queued reductions");
    if (lo < 0 || hi > dp->n || lo > hi)
        return kiln_error_setf(KILN_ERR_ARG,
                               "data parallel: gather of [%lld, %lld) outside the "
                               "slab of %lld",
                               (long long)lo, (long long)hi, (long long)dp->n);
    job j = {.kind = JOB_GATHER, .lo = lo, .hi = hi, .buf = buf, .dt = dt};
    *ticket = post_job(dp, &j);
    return KILN_OK;
}

kiln_status kiln_dp_wait(kiln_dp *dp, uint64_t ticket, double *waited_s) {
    double w = 0.0;
    kiln_status s = wait_jobs(dp, ticket + 1, &w);
    dp->exposed_s += w;
    if (waited_s)
        *waited_s += w;
    return s;
}

static void discard_outside_shard(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo, int64_t hi) {
    size_t esz = kiln_dtype_size(dt);
    int64_t slo = dp->shard_lo[dp->rank], shi = dp->shard_hi[dp->rank];
    int64_t a = lo, b = hi < slo ? hi : slo; /* [lo, min(hi, slo)) */
    if (b > a)
        kiln_memory_discard((char *)buf + a * (int64_t)esz, (size_t)(b - a) * esz);
    a = lo > shi ? lo : shi; /* [max(lo, shi), hi) */
    if (hi > a)
        kiln_memory_discard((char *)buf + a * (int64_t)esz, (size_t)(hi - a) * esz);
}

void kiln_dp_discard_range(kiln_dp *dp, void *buf, kiln_dtype dt, int64_t lo, int64_t hi) {
    discard_outside_shard(dp, buf, dt, lo, hi);
}

/* ---- the embedding's rows apart ---- */

size_t kiln_dp_rows_bytes(int world, int64_t max_rows, int64_t C, kiln_dtype dt) {
    return (size_t)world * (size_t)max_rows * (sizeof(int32_t) + (size_t)C * kiln_dtype_size(dt)) +
           (size_t)world * sizeof(int64_t);
}

kiln_status kiln_dp_rows_reserve(kiln_dp *dp, int64_t max_rows, int64_t C, kiln_dtype dt) {
    if (dp->queued) /* the rows are added on the host */
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "data parallel: the embedding's rows are not kept apart with "
                               "queued reductions");
    if (max_rows < 1 || C < 1)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: %lld rows of %lld",
                               (long long)max_rows, (long long)C);
    size_t W = (size_t)dp->world;
    dp->row_ids = malloc(W * (size_t)max_rows * sizeof(int32_t));
    dp->row_buf = malloc(W * (size_t)max_rows * (size_t)C * kiln_dtype_size(dt));
    dp->row_counts = calloc(W, sizeof(int64_t));
    if (!dp->row_ids || !dp->row_buf || !dp->row_counts)
        return kiln_error_setf(KILN_ERR_NOMEM,
                               "data parallel: cannot allocate %.1f MiB for the embedding's rows",
                               (double)kiln_dp_rows_bytes(dp->world, max_rows, C, dt) / (1 << 20));
    dp->rows_cap = max_rows;
    dp->rows_C = C;
    dp->rows_dt = dt;
    return KILN_OK;
}

/* grads[at + ids[i] C + c] += rows[i][c] for the rows of every rank (rank order, then row
 * order, as one process adds its positions), columns split over threads, only inside
 * [glo, ghi). */
static void add_rows(float *g, int64_t at, int64_t C, const int32_t *ids, const void *rows,
                     kiln_dtype dt, int64_t n, int64_t glo, int64_t ghi) {
    size_t es = kiln_dtype_size(dt);
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), th = omp_get_thread_num();
        int64_t c0 = C * th / nt, c1 = C * (th + 1) / nt;
        float tmp[256];
        for (int64_t i = 0; i < n; i++) {
            int64_t base = at + (int64_t)ids[i] * C;
            int64_t a = base + c0 > glo ? c0 : glo - base, b = base + c1 < ghi ? c1 : ghi - base;
            for (int64_t c = a; c < b; c += 256) {
                int64_t m = b - c < 256 ? b - c : 256;
                kiln_convert(tmp, KILN_DTYPE_F32,
                             (const char *)rows + ((size_t)i * (size_t)C + (size_t)c) * es, dt, m);
                float *d = g + base + c;
                for (int64_t j = 0; j < m; j++)
                    d[j] += tmp[j];
            }
        }
    }
}

kiln_status kiln_dp_add_rows(kiln_dp *dp, float *grads, int64_t at, const int32_t *ids,
                             const void *rows, int64_t n) {
    if (!dp->rows_cap)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: no room reserved for rows");
    if (n < 0 || n > dp->rows_cap)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: %lld rows, room for %lld",
                               (long long)n, (long long)dp->rows_cap);
    if (dp->in_step)
        return kiln_error_setf(KILN_ERR_ARG, "data parallel: rows during backward");
    KILN_CHECK(kiln_dp_idle(dp));
    double t0 = kiln_time_ms();
    int W = dp->world;
    int64_t C = dp->rows_C, *cnt = dp->row_counts;
    size_t es = kiln_dtype_size(dp->rows_dt);
    /* every rank's count (floats hold them exactly: n <= 2^24 here) */
    float mine = (float)n, *all = (float *)dp->row_ids; /* room for W at least */
    for (int r = 0; r < W; r++)
        cnt[r] = 1;
    KILN_CHECK(kiln_comm_allgather(&mine, all, cnt, KILN_DTYPE_F32, dp->comm));
    int64_t before = 0, total = 0;
    for (int r = 0; r < W; r++) {
        cnt[r] = (int64_t)all[r];
        if (r < dp->rank)
            before += cnt[r];
        total += cnt[r];
    }
    /* the ids (as 4-byte elements), then the rows (as bytes of their dtype) */
    memcpy(dp->row_ids + before, ids, (size_t)n * sizeof(int32_t));
    KILN_CHECK(
        kiln_comm_allgather(dp->row_ids + before, dp->row_ids, cnt, KILN_DTYPE_F32, dp->comm));
    for (int r = 0; r < W; r++)
        cnt[r] *= C;
    memcpy((char *)dp->row_buf + (size_t)(before * C) * es, rows, (size_t)(n * C) * es);
    KILN_CHECK(kiln_comm_allgather((char *)dp->row_buf + (size_t)(before * C) * es, dp->row_buf,
                                   cnt, dp->rows_dt, dp->comm));
    int64_t glo, ghi;
    kiln_dp_shard(dp, &glo, &ghi);
    if (dp->cfg.zero < 1) /* the whole gradient is every rank's */
        glo = 0, ghi = dp->n;
    add_rows(grads, at, C, dp->row_ids, dp->row_buf, dp->rows_dt, total, glo, ghi);
    dp->other_s += (kiln_time_ms() - t0) / 1e3;
    return KILN_OK;
}
