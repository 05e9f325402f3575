/* Latency, bandwidth and collective times of kiln_comm between MPI ranks. Prints one table
 * (rank 0), and with --csv the same rows as CSV for bench/bench_net.py.
 *
 *   mpirun -np N bench_pingpong [--min B] [--max B] [--pp-min B] [--budget S]
 *                               [--dtype f32|bf16] [--ops pingpong,allreduce,...] [--csv F]
 *                               [--times 1]   (default ops: all five; --times 1 also prints
 *                               every repetition's time)
 *
 * pingpong      rank 0 sends B bytes to rank 1 (kiln_comm_send), which sends them back;
 *               time is half the round trip: the one-way time of a B-byte message. Sizes
 *               from --pp-min (8 bytes) to --max by powers of 2. The other ranks wait.
 * allreduce     kiln_comm_allreduce of B bytes (sum) on every rank, in place (as kiln's
 *               gradient buckets are)
 * reduce_scatter kiln_comm_reduce_scatter: B bytes in, B/N out on every rank
 * allgather     kiln_comm_allgather: B/N bytes in, B bytes out on every rank
 * local_sum     no communication: every rank at once adds B bytes of fp32 into B bytes
 *               (y += x), the work a reduction does besides moving bytes (the gamma of an
 *               alpha-beta-gamma model), with all ranks sharing the machine's cores and
 *               memory as they do inside a collective
 *               sizes from --min (4 KiB) to --max (256 MiB) by powers of 4
 *
 * Each size runs once untimed, then `reps` timed repetitions, each after a barrier, its
 * time the slowest rank's (the collective is done when the last rank is). reps is what fits
 * in --budget seconds (0.5) at the untimed run's speed, at least 3 and at most 1000: rank
 * 0 decides and tells the others, since every rank must make the same calls. The table
 * gives the median and the fastest repetition in microseconds and the algorithm bandwidth
 * B / median (GB/s = 1e9 bytes/s); for pingpong also "bus" = the same, for the collectives
 * the bytes a rank sends by the ring count (kiln_comm_bytes_sent) over the median. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/comm.h"
#include "kiln/core.h"
#include "kiln/dtype.h"
#include "kiln/status.h"

enum { OP_PINGPONG, OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_LOCAL_SUM, OP_COUNT };
static const char *op_names[OP_COUNT] = {"pingpong", "allreduce", "reduce_scatter", "allgather",
                                         "local_sum"};

typedef struct bench_args {
    size_t min_bytes, max_bytes, pp_min_bytes;
    double budget_s;
    kiln_dtype dt;
    int ops[OP_COUNT]; /* 1: run it */
    const char *csv;
    int times; /* 1: print every repetition's time too */
} bench_args;

/* One size's figures, in seconds. */
typedef struct bench_row {
    double median, best;
    int reps;
    uint64_t sent; /* bytes this rank sent in one operation, by the ring count */
} bench_row;

static kiln_comm *world;
static int R, N;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        kiln_status s_ = (call);                                                                   \
        if (s_ != KILN_OK) {                                                                       \
            fprintf(stderr, "rank %d: %s: %s: %s\n", R, #call, kiln_status_str(s_),                \
                    kiln_error_message());                                                         \
            kiln_comm_abort(world, 1, "bench_pingpong failed");                                    \
        }                                                                                          \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* counts[r]: rank r's piece of count elements (the first count % N pieces one larger). */
static void split_counts(int64_t *counts, int64_t count) {
    for (int r = 0; r < N; r++)
        counts[r] = count / N + (r < count % N);
}

/* Run op once on bytes of send/recv (each at least max_bytes). */
static void run_once(int op, size_t bytes, kiln_dtype dt, void *send, void *recv) {
    size_t esize = kiln_dtype_size(dt);
    int64_t count = (int64_t)(bytes / esize);
    int64_t counts[64];
    switch (op) {
    case OP_PINGPONG:
        if (R == 0) {
            CHECK(kiln_comm_send(send, count, dt, 1, 7, world));
            CHECK(kiln_comm_recv(recv, count, dt, 1, 7, world));
        } else if (R == 1) {
            CHECK(kiln_comm_recv(recv, count, dt, 0, 7, world));
            CHECK(kiln_comm_send(recv, count, dt, 0, 7, world));
        }
        break;
    case OP_ALLREDUCE:
        CHECK(kiln_comm_allreduce(recv, recv, count, dt, KILN_REDUCE_SUM, world));
        break;
    case OP_LOCAL_SUM: {
        float *y = recv;
        const float *x = send;
        for (size_t i = 0; i < bytes / sizeof *y; i++)
            y[i] += x[i];
        break;
    }
    case OP_REDUCE_SCATTER:
        split_counts(counts, count);
        CHECK(kiln_comm_reduce_scatter(send, recv, counts, dt, KILN_REDUCE_SUM, world));
        break;
    case OP_ALLGATHER: {
        split_counts(counts, count);
        CHECK(kiln_comm_allgather(send, recv, counts, dt, world));
        break;
    }
    }
}

/* Time of one run of op: the slowest rank's, in seconds (pingpong: half the round trip).
 * *sent: the bytes this rank sent in it, by kiln's ring count. */
static double time_once(int op, size_t bytes, kiln_dtype dt, void *send, void *recv,
                        uint64_t *sent) {
    CHECK(kiln_comm_barrier(world));
    uint64_t before = kiln_comm_bytes_sent(world);
    double t0 = kiln_time_ms();
    run_once(op, bytes, dt, send, recv);
    float t = (float)((kiln_time_ms() - t0) * 1e-3);
    *sent = kiln_comm_bytes_sent(world) - before;
    CHECK(kiln_comm_allreduce(&t, &t, 1, KILN_DTYPE_F32, KILN_REDUCE_MAX, world));
    return op == OP_PINGPONG ? t / 2 : t;
}

static bench_row measure(int op, size_t bytes, const bench_args *a, void *send, void *recv,
                         double *times) {
    bench_row row = {0};
    /* untimed: TCP connections, first touch of the pages */
    double first = time_once(op, bytes, a->dt, send, recv, &row.sent);
    float reps = first > 0 ? (float)(a->budget_s / first) : 1000;
    reps = reps < 3 ? 3 : reps > 1000 ? 1000 : reps;
    CHECK(kiln_comm_broadcast(&reps, 1, KILN_DTYPE_F32, 0, world)); /* rank 0's count */
    int n = (int)reps;
    uint64_t sent;
    for (int i = 0; i < n; i++)
        times[i] = time_once(op, bytes, a->dt, send, recv, &sent);
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    row.reps = n;
    row.best = times[0];
    row.median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    if (op == OP_PINGPONG)
        row.sent = bytes; /* one way */
    return row;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    double m = 1;
    if (*end == 'K' || *end == 'k')
        m = 1024;
    else if (*end == 'M' || *end == 'm')
        m = 1024 * 1024;
    else if (*end == 'G' || *end == 'g')
        m = 1024.0 * 1024 * 1024;
    return (size_t)(v * m);
}

static int parse_args(int argc, char **argv, bench_args *a) {
    *a = (bench_args){4096, (size_t)256 << 20, 8, 0.5, KILN_DTYPE_F32, {1, 1, 1, 1, 1}, NULL, 0};
    for (int i = 1; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return -1;
        if (!strcmp(k, "--min"))
            a->min_bytes = parse_size(v);
        else if (!strcmp(k, "--max"))
            a->max_bytes = parse_size(v);
        else if (!strcmp(k, "--pp-min"))
            a->pp_min_bytes = parse_size(v);
        else if (!strcmp(k, "--budget"))
            a->budget_s = atof(v);
        else if (!strcmp(k, "--csv"))
            a->csv = v;
        else if (!strcmp(k, "--times"))
            a->times = atoi(v);
        else if (!strcmp(k, "--dtype")) {
            if (!strcmp(v, "f32"))
                a->dt = KILN_DTYPE_F32;
            else if (!strcmp(v, "bf16"))
                a->dt = KILN_DTYPE_BF16;
            else
                return -1;
        } else if (!strcmp(k, "--ops")) {
            memset(a->ops, 0, sizeof a->ops);
            for (int o = 0; o < OP_COUNT; o++)
                a->ops[o] = strstr(v, op_names[o]) != NULL;
        } else
            return -1;
    }
    /* whole elements: 2-byte ones at least, and a piece for each of up to 64 ranks */
    if (a->min_bytes < 4 * 64 || a->max_bytes < a->min_bytes || a->pp_min_bytes < 4)
        return -1;
    return 0;
}

/* kiln_comm_abort reports; this program ends the job (the library never exits). */
static void end_job(kiln_comm *c, int code, const char *msg, void *user) {
    (void)msg;
    (void)user;
    kiln_comm_abort_job(c, code);
    exit(code);
}

int main(int argc, char **argv) {
    kiln_comm_set_abort_handler(end_job, NULL);
    bench_args a;
    if (parse_args(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: mpirun -np N bench_pingpong [--min B] [--max B] [--pp-min B] "
                        "[--budget S] [--dtype f32|bf16] [--times 0|1] [--ops pingpong,allreduce,"
                        "reduce_scatter,allgather,local_sum] [--csv FILE]   (B takes K, M, "
                        "G)\n");
        return 2;
    }
    kiln_status s = kiln_comm_init_auto(&world);
    if (s != KILN_OK) {
        fprintf(stderr, "kiln_comm_init_auto: %s: %s\n", kiln_status_str(s), kiln_error_message());
        return 1;
    }
    R = kiln_comm_rank(world);
    N = kiln_comm_size(world);
    if (N < 2 || N > 64) {
        fprintf(stderr, "bench_pingpong needs 2 to 64 ranks (mpirun -np N), not %d\n", N);
        kiln_comm_free(world);
        return 2;
    }
    unsigned char *send = malloc(a.max_bytes), *recv = malloc(a.max_bytes);
    double *times = malloc(1000 * sizeof *times);
    if (!send || !recv || !times)
        kiln_comm_abort(world, 1, "bench_pingpong: out of memory");
    /* zeros: the in-place allreduce sums its own result again on every repetition, and
     * zeros stay finite (and normal) in every dtype; TCP does not compress them */
    memset(send, 0, a.max_bytes);
    memset(recv, 0, a.max_bytes);
    FILE *csv = NULL;
    if (R == 0 && a.csv && !(csv = fopen(a.csv, "w")))
        kiln_comm_abort(world, 1, "bench_pingpong: cannot open the --csv file");
    if (csv)
        fprintf(csv, "op,ranks,bytes,reps,median_s,best_s,sent_bytes\n");
    if (R == 0)
        printf("bench_pingpong: %d ranks, %s, kiln_comm %s\n%-15s %12s %5s %12s %12s %9s %9s\n", N,
               kiln_dtype_name(a.dt), kiln_comm_kind(world), "op", "bytes", "reps", "median us",
               "best us", "algo GB/s", "bus GB/s");
    for (int op = 0; op < OP_COUNT; op++) {
        if (!a.ops[op])
            continue;
        size_t first = op == OP_PINGPONG ? a.pp_min_bytes : a.min_bytes;
        int factor = op == OP_PINGPONG ? 2 : 4;
        for (size_t b = first; b <= a.max_bytes; b *= (size_t)factor) {
            bench_row row = measure(op, b, &a, send, recv, times);
            if (R != 0)
                continue;
            printf("%-15s %12zu %5d %12.1f %12.1f %9.3f %9.3f\n", op_names[op], b, row.reps,
                   row.median * 1e6, row.best * 1e6, (double)b / row.median * 1e-9,
                   (double)row.sent / row.median * 1e-9);
            if (a.times) {
                printf("  times (ms, sorted):");
                for (int i = 0; i < row.reps; i++)
                    printf(" %.1f", times[i] * 1e3);
                printf("\n");
            }
            fflush(stdout);
            if (csv)
                fprintf(csv, "%s,%d,%zu,%d,%.9g,%.9g,%llu\n", op_names[op], N, b, row.reps,
                        row.median, row.best, (unsigned long long)row.sent);
        }
    }
    if (csv)
        fclose(csv);
    free(times);
    free(send);
    free(recv);
    kiln_comm_free(world);
    return 0;
}
