/* kiln_comm on MPI, run by tests/dist/run_mpi.sh under mpirun with 2, 3 and 4 ranks.
 *
 * Every rank contributes data that depends on its rank, so that each result is known in
 * closed form (sums of ranks and small integers: exact in fp32) and is checked on every
 * rank. BF16/F16 sums are checked against the exact sum of the rounded inputs within the
 * rounding the header states: each of the n-1 combinations of partial sums rounds once, so
 * the error is at most (n-1) u |sum| for positive inputs, u = 2^-8 (BF16) or 2^-11 (F16).
 *
 *   test_comm_mpi             every test; the exit status is the harness's
 *   test_comm_mpi dead-exit   rank 1 calls _exit(3) while the others wait in an allreduce
 *   test_comm_mpi dead-kill   rank 1 raises SIGKILL there instead
 *   test_comm_mpi abort       rank 1 calls kiln_comm_abort(world, 6, ...) there instead
 *   test_comm_mpi srun-singleton  started without mpirun but with srun's variables for
 *                             rank 1 of 2 (tests.cmake sets them): MPI starts a world of
 *                             one, and init_auto must refuse it naming both
 *   test_comm_mpi huge        a broadcast and an allreduce past INT_MAX elements (BF16,
 *                             4 GiB a rank; not registered: run by hand)
 *
 * Every rank runs the same collectives in the same order whatever its checks find (a CHECK
 * never skips a call), or the ranks would hang each other. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/comm_internal.h"
#include "kiln/comm.h"
#include "kiln/core.h"
#include "kiln/dtype.h"
#include "test.h"

static kiln_comm *world;
static int R, N; /* this rank, the number of ranks */

/* counts[r] = base + step r, and their offsets. */
static int64_t vcounts(int64_t *counts, int64_t *off, int64_t base, int64_t step) {
    int64_t sum = 0;
    for (int r = 0; r < N; r++) {
        counts[r] = base + step * r;
        off[r] = sum;
        sum += counts[r];
    }
    return sum;
}

static void test_world(void) {
    CHECK_STR_EQ(kiln_comm_kind(world), "mpi");
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (n)
        CHECK_INT_EQ(N, atoi(n));
    CHECK_TRUE(N >= 2);
    CHECK_TRUE(R >= 0 && R < N);
    /* A second world communicator (MPI is initialised already) is independent of the first. */
    kiln_comm *w2 = NULL;
    CHECK_OK(kiln_comm_init_mpi(&w2));
    CHECK_INT_EQ(kiln_comm_rank(w2), R);
    CHECK_INT_EQ(kiln_comm_size(w2), N);
    CHECK_OK(kiln_comm_barrier(w2));
    kiln_comm_free(w2);
}

static void test_allreduce_f32(void) {
    enum { n = 1000 };
    static float x[n], y[n];
    for (int i = 0; i < n; i++)
        x[i] = (float)(R + 1 + i % 7);
    const char *names[] = {"sum", "max", "min"};
    for (int op = 0; op < KILN_REDUCE_OP_COUNT; op++) {
        CHECK_OK(kiln_comm_allreduce(x, y, n, KILN_DTYPE_F32, (kiln_reduce_op)op, world));
        int bad = 0;
        for (int i = 0; i < n; i++) {
            double want = op == KILN_REDUCE_SUM   ? N * (N + 1) / 2.0 + (double)N * (i % 7)
                          : op == KILN_REDUCE_MAX ? N + i % 7
                                                  : 1 + i % 7;
            bad += y[i] != want;
        }
        if (bad)
            fprintf(stderr, "allreduce %s: %d wrong\n", names[op], bad);
        CHECK_INT_EQ(bad, 0);
    }
    CHECK_OK(kiln_comm_allreduce(x, x, n, KILN_DTYPE_F32, KILN_REDUCE_SUM, world)); /* in place */
    CHECK_NEAR(x[0], N * (N + 1) / 2.0, 0);
    CHECK_NEAR(x[n - 1], N * (N + 1) / 2.0 + N * ((n - 1) % 7), 0);
    uint64_t before = kiln_comm_bytes_sent(world), net = kiln_comm_net_bytes(world);
    CHECK_OK(kiln_comm_allreduce(y, y, n, KILN_DTYPE_F32, KILN_REDUCE_MAX, world));
    CHECK_INT_EQ(kiln_comm_bytes_sent(world) - before, 2 * (4 * n / N) * (N - 1));
    /* private memory: every byte goes as MPI's messages */
    CHECK_INT_EQ(kiln_comm_net_bytes(world) - net, 2 * (4 * n / N) * (N - 1));
}

/* Each rank's value of element i, rounded to dt. */
static float half_value(int r, int i, kiln_dtype dt) {
    float v = 1.0f + 0.013f * (float)r + 0.0007f * (float)(i % 101);
    return dt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(kiln_f32_to_bf16(v))
                                 : kiln_f16_to_f32(kiln_f32_to_f16(v));
}

static void test_allreduce_half(void) {
    enum { n = 4099 };
    static uint16_t x[n], y[n];
    kiln_dtype dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        kiln_dtype dt = dts[d];
        for (int i = 0; i < n; i++)
            x[i] = dt == KILN_DTYPE_BF16 ? kiln_f32_to_bf16(half_value(R, i, dt))
                                         : kiln_f32_to_f16(half_value(R, i, dt));
        double tol = (N - 1) * kiln_dtype_epsilon(dt); /* one rounding per combination */
        CHECK_OK(kiln_comm_allreduce(x, y, n, dt, KILN_REDUCE_SUM, world));
        double worst = 0;
        int bad_max = 0;
        for (int i = 0; i < n; i++) {
            double want = 0,
                   got = dt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(y[i]) : kiln_f16_to_f32(y[i]);
            for (int r = 0; r < N; r++)
                want += half_value(r, i, dt);
            worst = fmax(worst, fabs(got - want) / want);
        }
        CHECK_NEAR(worst, 0, tol);
        CHECK_TRUE(worst > 0 || N == 1); /* it did round: not computed in fp32 end to end */
        CHECK_OK(kiln_comm_allreduce(x, x, n, dt, KILN_REDUCE_MAX, world)); /* exact */
        for (int i = 0; i < n; i++) {
            float got = dt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(x[i]) : kiln_f16_to_f32(x[i]);
            bad_max += got != half_value(N - 1, i, dt);
        }
        CHECK_INT_EQ(bad_max, 0);
    }
    /* Ties go to even: 1 + 2^-8 (rank 0 gives 1, rank 1 gives 2^-8, others 0) is 1 in
     * bf16, (1 + 2^-7) + 2^-8 is 1 + 2^-6. Truncation would give 1 + 2^-7. */
    uint16_t t[2];
    t[0] = kiln_f32_to_bf16(R == 0 ? 1.0f : R == 1 ? 0x1p-8f : 0.0f);
    t[1] = kiln_f32_to_bf16(R == 0 ? 1.0f + 0x1p-7f : R == 1 ? 0x1p-8f : 0.0f);
    CHECK_OK(kiln_comm_allreduce(t, t, 2, KILN_DTYPE_BF16, KILN_REDUCE_SUM, world));
    CHECK_NEAR(kiln_bf16_to_f32(t[0]), 1.0, 0);
    CHECK_NEAR(kiln_bf16_to_f32(t[1]), 1.0 + 0x1p-6, 0);
}

/* send[i] = R + (i % 11): piece r of the sum is n(n-1)/2 + n ((off[r] + j) % 11). */
static int reduce_scatter_bad(const float *got, int64_t from, int64_t count) {
    int bad = 0;
    for (int64_t j = 0; j < count; j++)
        bad += got[j] != N * (N - 1) / 2.0 + (double)N * ((from + j) % 11);
    return bad;
}

static void test_reduce_scatter(void) {
    int64_t counts[8], off[8];
    int64_t total = vcounts(counts, off, 100, 37);
    float *x = malloc((size_t)total * sizeof *x), *y = malloc((size_t)total * sizeof *y);
    for (int64_t i = 0; i < total; i++)
        x[i] = (float)(R + i % 11);
    CHECK_OK(kiln_comm_reduce_scatter(x, y, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    CHECK_INT_EQ(reduce_scatter_bad(y, off[R], counts[R]), 0);
    /* in place, NCCL's layout: the result lands at send + this rank's offset */
    CHECK_OK(
        kiln_comm_reduce_scatter(x, x + off[R], counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    CHECK_INT_EQ(reduce_scatter_bad(x + off[R], off[R], counts[R]), 0);
    /* in place, MPI's layout: at the start */
    for (int64_t i = 0; i < total; i++)
        x[i] = (float)(R + i % 11);
    CHECK_OK(kiln_comm_reduce_scatter(x, x, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    CHECK_INT_EQ(reduce_scatter_bad(x, off[R], counts[R]), 0);
    /* BF16 max: exact */
    uint16_t *h = malloc((size_t)total * sizeof *h), *g = malloc((size_t)counts[R] * sizeof *g);
    for (int64_t i = 0; i < total; i++)
        h[i] = kiln_f32_to_bf16((float)((R * 7 + i) % 13));
    CHECK_OK(kiln_comm_reduce_scatter(h, g, counts, KILN_DTYPE_BF16, KILN_REDUCE_MAX, world));
    int bad = 0;
    for (int64_t j = 0; j < counts[R]; j++) {
        float want = 0;
        for (int r = 0; r < N; r++)
            want = fmaxf(want, (float)((r * 7 + off[R] + j) % 13));
        bad += kiln_bf16_to_f32(g[j]) != want;
    }
    CHECK_INT_EQ(bad, 0);
    free(h);
    free(g);
    free(x);
    free(y);
}

static int allgather_bad(const float *y, const int64_t *counts, const int64_t *off) {
    int bad = 0;
    for (int r = 0; r < N; r++)
        for (int64_t j = 0; j < counts[r]; j++)
            bad += y[off[r] + j] != (float)(1000 * r + j);
    return bad;
}

static void test_allgather(void) {
    int64_t counts[8], off[8];
    int64_t total = vcounts(counts, off, 50, 13);
    float *x = malloc((size_t)counts[R] * sizeof *x), *y = malloc((size_t)total * sizeof *y);
    for (int64_t j = 0; j < counts[R]; j++)
        x[j] = (float)(1000 * R + j);
    CHECK_OK(kiln_comm_allgather(x, y, counts, KILN_DTYPE_F32, world));
    CHECK_INT_EQ(allgather_bad(y, counts, off), 0);
    memset(y, 0, (size_t)total * sizeof *y);
    memcpy(y + off[R], x, (size_t)counts[R] * sizeof *x);
    CHECK_OK(kiln_comm_allgather(y + off[R], y, counts, KILN_DTYPE_F32, world)); /* in place */
    CHECK_INT_EQ(allgather_bad(y, counts, off), 0);
    /* F16 as bytes: any bit pattern, NaNs included, arrives as it left */
    uint16_t *h = malloc((size_t)counts[R] * 2), *g = malloc((size_t)total * 2);
    for (int64_t j = 0; j < counts[R]; j++)
        h[j] = (uint16_t)(0x7c01 + 97 * R + j);
    CHECK_OK(kiln_comm_allgather(h, g, counts, KILN_DTYPE_F16, world));
    int bad = 0;
    for (int r = 0; r < N; r++)
        for (int64_t j = 0; j < counts[r]; j++)
            bad += g[off[r] + j] != (uint16_t)(0x7c01 + 97 * r + j);
    CHECK_INT_EQ(bad, 0);
    /* a rank may contribute nothing */
    int64_t some[8];
    for (int r = 0; r < N; r++)
        some[r] = r == 1 ? 0 : 3;
    float z[3] = {(float)R, (float)R, (float)R}, all[24];
    CHECK_OK(kiln_comm_allgather(z, all, some, KILN_DTYPE_F32, world));
    int pos = 0;
    bad = 0;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < some[r]; j++)
            bad += all[pos++] != (float)r;
    CHECK_INT_EQ(bad, 0);
    free(h);
    free(g);
    free(x);
    free(y);
}

static void test_broadcast(void) {
    enum { n = 777 };
    static float b[n];
    for (int root = 0; root < N; root++) {
        for (int i = 0; i < n; i++)
            b[i] = R == root ? (float)(root * 10 + i) : -1.0f;
        CHECK_OK(kiln_comm_broadcast(b, n, KILN_DTYPE_F32, root, world));
        int bad = 0;
        for (int i = 0; i < n; i++)
            bad += b[i] != (float)(root * 10 + i);
        CHECK_INT_EQ(bad, 0);
    }
    CHECK_STATUS(kiln_comm_broadcast(b, n, KILN_DTYPE_F32, N, world), KILN_ERR_ARG);
}

/* Start an allreduce and an allgather, compute while they run, poll them to completion. */
static void test_nonblocking(void) {
    enum { n = 1 << 20 };
    float *x = malloc(n * sizeof *x), *s = malloc(n * sizeof *s);
    int64_t counts[8], off[8];
    int64_t total = vcounts(counts, off, 4000, 1000);
    float *g = malloc((size_t)total * sizeof *g), *mine = malloc((size_t)counts[R] * sizeof *g);
    for (int i = 0; i < n; i++)
        x[i] = (float)(R + i % 5);
    for (int64_t j = 0; j < counts[R]; j++)
        mine[j] = (float)(1000 * R + j);
    kiln_comm_request *ra = NULL, *rg = NULL;
    CHECK_OK(kiln_comm_iallreduce(x, s, n, KILN_DTYPE_F32, KILN_REDUCE_SUM, world, &ra));
    CHECK_OK(kiln_comm_iallgather(mine, g, counts, KILN_DTYPE_F32, world, &rg));
    CHECK_TRUE(ra != NULL && rg != NULL);
    double acc = 0;
    int done_a = 0, done_g = 0, rounds = 0;
    while ((!done_a || !done_g) && rounds < 1000000) {
        for (int k = 0; k < 20000; k++) /* a piece of compute */
            acc += sqrt((double)k + rounds);
        kiln_comm_progress(world);
        if (!done_a)
            CHECK_OK(kiln_comm_test(ra, &done_a));
        if (!done_g)
            CHECK_OK(kiln_comm_test(rg, &done_g));
        rounds++;
    }
    CHECK_TRUE(done_a && done_g);
    CHECK_TRUE(acc > 0);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += s[i] != N * (N - 1) / 2.0 + (double)N * (i % 5);
    CHECK_INT_EQ(bad, 0);
    CHECK_INT_EQ(allgather_bad(g, counts, off), 0);
    /* reduce-scatter and broadcast, completed by wait, in the order opposite to the start */
    kiln_comm_request *rr, *rb;
    float *y = malloc((size_t)counts[R] * sizeof *y), b[16];
    for (int64_t i = 0; i < total; i++)
        g[i] = (float)(R + i % 11);
    for (int i = 0; i < 16; i++)
        b[i] = R == N - 1 ? (float)i : 0;
    CHECK_OK(kiln_comm_ireduce_scatter(g, y, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, world, &rr));
    CHECK_OK(kiln_comm_ibroadcast(b, 16, KILN_DTYPE_F32, N - 1, world, &rb));
    CHECK_OK(kiln_comm_wait(rb));
    CHECK_OK(kiln_comm_wait(rr));
    CHECK_INT_EQ(reduce_scatter_bad(y, off[R], counts[R]), 0);
    CHECK_NEAR(b[15], 15, 0);
    free(y);
    free(x);
    free(s);
    free(g);
    free(mine);
}

/* Even and odd ranks form two groups, ranked in reverse (key = -rank). */
static void test_split(void) {
    kiln_comm *g = NULL;
    CHECK_OK(kiln_comm_split(world, R % 2, -R, &g));
    int size = 0, rank = 0, sum = 0;
    for (int r = R % 2; r < N; r += 2) {
        size++;
        rank += r > R;
        sum += r;
    }
    CHECK_INT_EQ(kiln_comm_size(g), size);
    CHECK_INT_EQ(kiln_comm_rank(g), rank);
    float v = (float)R;
    CHECK_OK(kiln_comm_allreduce(&v, &v, 1, KILN_DTYPE_F32, KILN_REDUCE_SUM, g));
    CHECK_NEAR(v, sum, 0);
    float top = (float)R; /* group rank 0 is the largest world rank of the parity */
    CHECK_OK(kiln_comm_broadcast(&top, 1, KILN_DTYPE_F32, 0, g));
    CHECK_NEAR(top, R % 2 + 2 * ((N - 1 - R % 2) / 2), 0);
    kiln_comm_free(g);
}

/* A ring: rank r sends to r+1 and receives from r-1 (rank 0 sends first, so it never
 * deadlocks whatever MPI buffers). Then a count that differs from the peer's. */
static void test_send_recv(void) {
    enum { n = 5000 };
    static float out[n], in[n];
    int next = (R + 1) % N, prev = (R + N - 1) % N;
    for (int i = 0; i < n; i++)
        out[i] = (float)(R * 100000 + i);
    if (R == 0)
        CHECK_OK(kiln_comm_send(out, n, KILN_DTYPE_F32, next, 7, world));
    CHECK_OK(kiln_comm_recv(in, n, KILN_DTYPE_F32, prev, 7, world));
    if (R != 0)
        CHECK_OK(kiln_comm_send(out, n, KILN_DTYPE_F32, next, 7, world));
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += in[i] != (float)(prev * 100000 + i);
    CHECK_INT_EQ(bad, 0);
    CHECK_STATUS(kiln_comm_send(out, n, KILN_DTYPE_F32, R, 7, world), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_send(out, n, KILN_DTYPE_F32, next, -1, world), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_recv(in, n, KILN_DTYPE_F32, N, 0, world), KILN_ERR_ARG);
    /* rank 0 sends 10 elements twice; rank 1 expects 5 (MPI truncates), then 20 */
    if (R == 0) {
        CHECK_OK(kiln_comm_send(out, 10, KILN_DTYPE_F32, 1, 9, world));
        CHECK_OK(kiln_comm_send(out, 10, KILN_DTYPE_F32, 1, 9, world));
    } else if (R == 1) {
        CHECK_STATUS(kiln_comm_recv(in, 5, KILN_DTYPE_F32, 0, 9, world), KILN_ERR_IO);
        CHECK_TRUE(strstr(kiln_error_message(), "MPI_ERR_TRUNCATE") != NULL);
        CHECK_STATUS(kiln_comm_recv(in, 20, KILN_DTYPE_F32, 0, 9, world), KILN_ERR_IO);
        CHECK_TRUE(strstr(kiln_error_message(), "sent 10 elements where 20") != NULL);
    } else {
        CHECK_TRUE(1);
    }
    CHECK_OK(kiln_comm_barrier(world));
}

/* A thread other than main makes the calls, one thread at a time (MPI_THREAD_SERIALIZED),
 * as data parallelism's communication thread does. */
static void *thread_allreduce(void *arg) {
    float *v = arg;
    kiln_status s = kiln_comm_allreduce(v, v, 64, KILN_DTYPE_F32, KILN_REDUCE_SUM, world);
    v[64] = s == KILN_OK ? 1.0f : 0.0f;
    return NULL;
}

static void test_thread(void) {
    float v[65];
    for (int i = 0; i < 64; i++)
        v[i] = (float)(R + i);
    pthread_t t;
    CHECK_INT_EQ(pthread_create(&t, NULL, thread_allreduce, v), 0);
    CHECK_INT_EQ(pthread_join(t, NULL), 0);
    CHECK_NEAR(v[64], 1, 0);
    CHECK_NEAR(v[63], N * (N - 1) / 2.0 + 63.0 * N, 0);
    CHECK_OK(kiln_comm_allreduce(v, v, 1, KILN_DTYPE_F32, KILN_REDUCE_SUM, world)); /* main */
}

/* 3e6 floats: the size of a small model's gradients, in a few tenths of a second. */
static void test_large(void) {
    enum { n = 3000000 };
    float *x = malloc(n * sizeof *x);
    for (int i = 0; i < n; i++)
        x[i] = (float)(R + i % 3);
    double t0 = kiln_time_ms();
    CHECK_OK(kiln_comm_allreduce(x, x, n, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    double ms = kiln_time_ms() - t0;
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += x[i] != N * (N - 1) / 2.0 + (double)N * (i % 3);
    CHECK_INT_EQ(bad, 0);
    if (R == 0)
        fprintf(stderr, "allreduce of %d floats on %d ranks: %.1f ms\n", n, N, ms);
    CHECK_TRUE(kiln_comm_wait_seconds(world) > 0);
    free(x);
}

/* The paths of counts past INT_MAX, on small buffers: with pieces of 4 KiB, every buffer
 * below is cut, and the v-collectives go one rank's piece at a time. */
static void test_chunked(void) {
    kiln__comm_set_chunk_bytes(4096); /* 1024 floats */
    enum { n = 10000 };
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (int i = 0; i < n; i++)
        x[i] = (float)(R + i % 11);
    CHECK_OK(kiln_comm_allreduce(x, y, n, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    CHECK_INT_EQ(reduce_scatter_bad(y, 0, n), 0);
    kiln_comm_request *q;
    CHECK_OK(kiln_comm_iallreduce(x, x, n, KILN_DTYPE_F32, KILN_REDUCE_SUM, world, &q));
    CHECK_OK(kiln_comm_wait(q));
    CHECK_INT_EQ(reduce_scatter_bad(x, 0, n), 0);

    int64_t counts[8], off[8];
    int64_t total = vcounts(counts, off, 1500, 400); /* over 1024 in all and apiece */
    float *big = malloc((size_t)total * sizeof *big), *got = malloc((size_t)total * sizeof *got);
    for (int64_t i = 0; i < total; i++)
        big[i] = (float)(R + i % 11);
    CHECK_OK(kiln_comm_reduce_scatter(big, got, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    CHECK_INT_EQ(reduce_scatter_bad(got, off[R], counts[R]), 0);
    CHECK_OK(kiln_comm_ireduce_scatter(big, big + off[R], counts, KILN_DTYPE_F32, KILN_REDUCE_SUM,
                                       world, &q));
    CHECK_OK(kiln_comm_wait(q));
    CHECK_INT_EQ(reduce_scatter_bad(big + off[R], off[R], counts[R]), 0);
    for (int64_t i = 0; i < total; i++)
        big[i] = (float)(R + i % 11);
    CHECK_OK(kiln_comm_reduce_scatter(big, big, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    CHECK_INT_EQ(reduce_scatter_bad(big, off[R], counts[R]), 0);

    for (int64_t j = 0; j < counts[R]; j++)
        big[j] = (float)(1000 * R + j);
    CHECK_OK(kiln_comm_iallgather(big, got, counts, KILN_DTYPE_F32, world, &q));
    CHECK_OK(kiln_comm_wait(q));
    CHECK_INT_EQ(allgather_bad(got, counts, off), 0);

    for (int i = 0; i < n; i++)
        x[i] = R == 1 ? (float)i : 0;
    CHECK_OK(kiln_comm_broadcast(x, n, KILN_DTYPE_F32, 1, world));
    CHECK_NEAR(x[n - 1], n - 1, 0);
    CHECK_NEAR(x[5000], 5000, 0);
    /* send/recv: 3000 floats in 3 messages */
    if (R == 0)
        CHECK_OK(kiln_comm_send(x, 3000, KILN_DTYPE_F32, 1, 3, world));
    else if (R == 1) {
        memset(y, 0, n * sizeof *y);
        CHECK_OK(kiln_comm_recv(y, 3000, KILN_DTYPE_F32, 0, 3, world));
        CHECK_NEAR(y[2999], 2999, 0);
    }
    kiln__comm_set_chunk_bytes(0);
    free(x);
    free(y);
    free(big);
    free(got);
}

/* Past INT_MAX elements for real: 2^31 + 3 BF16 values (4 GiB) a rank. */
static int run_huge(void) {
    int64_t n = ((int64_t)1 << 31) + 3;
    uint16_t *b = malloc((size_t)n * 2);
    if (!b) {
        fprintf(stderr, "huge: no memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n; i++)
        b[i] = kiln_f32_to_bf16(R == 0 ? (float)(i % 64) : 0);
    double t0 = kiln_time_ms();
    CHECK_OK(kiln_comm_broadcast(b, n, KILN_DTYPE_BF16, 0, world));
    double t1 = kiln_time_ms();
    CHECK_OK(kiln_comm_allreduce(b, b, n, KILN_DTYPE_BF16, KILN_REDUCE_SUM, world));
    double t2 = kiln_time_ms();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += kiln_bf16_to_f32(b[i]) != (float)(N * (i % 64));
    CHECK_INT_EQ(bad, 0);
    fprintf(stderr, "rank %d: broadcast %.1f s, allreduce %.1f s of %lld bf16\n", R,
            (t1 - t0) * 1e-3, (t2 - t1) * 1e-3, (long long)n);
    free(b);
    TEST_MAIN_END();
}

/* A rank dies while the others wait in an allreduce: it exits (how 0), is killed (1), or
 * calls kiln_comm_abort (2). Open MPI 4.1's mpirun notices and kills the other ranks at
 * once; this program only sets it up, run_mpi.sh checks what follows. */
static int run_dead(int how) {
    float x[1024] = {0};
    if (kiln_comm_barrier(world) != KILN_OK)
        return 1;
    if (R == 1) {
        usleep(300 * 1000); /* let the others enter the allreduce */
        if (how == 1)
            raise(SIGKILL);
        if (how == 2)
            kiln_comm_abort(world, 6, "test_comm_mpi: rank 1 aborts the job on purpose");
        _exit(3);
    }
    fprintf(stderr, "rank %d: waiting in an allreduce for rank 1\n", R);
    kiln_status s = kiln_comm_allreduce(x, x, 1024, KILN_DTYPE_F32, KILN_REDUCE_SUM, world);
    /* Not reached under Open MPI 4.1: the runtime ends this process first. */
    fprintf(stderr, "rank %d: allreduce returned %s: %s\n", R, kiln_status_str(s),
            kiln_error_message());
    return 4;
}

/* Memory the ranks share (kiln_comm_alloc_shared): allreduce, reduce-scatter and allgather
 * through it give what MPI's own give on private copies of the same data, bit for bit
 * (values whose sums are exact), for F32 and BF16, SUM and MAX, uneven counts, offsets off
 * the pieces' alignment; buffers that are not at the same offset on every rank, or not in
 * shared memory on one rank, fall back to MPI and are still right. */
static float val(int r, int64_t i) {
    return (float)(r * 3 + (int)(i % 61)) - 20.0f;
}

static void test_shared(void) {
    const char *env = getenv("KILN_COMM_SHM");
    if (env && !strcmp(env, "0")) {
        CHECK_INT_EQ(kiln_comm_shares_memory(world), 0);
        void *p = (void *)1;
        CHECK_OK(kiln_comm_alloc_shared(world, 4096, &p));
        CHECK_TRUE(p == NULL);
        return;
    }
    CHECK_INT_EQ(kiln_comm_shares_memory(world), 1);
    const char *per = getenv("KILN_COMM_NODE_RANKS"); /* machines of that many ranks */
    CHECK_INT_EQ(kiln_comm_local_size(world), per ? atoi(per) : N);
    uint64_t runs0 = kiln__comm_shm_runs();
    const int64_t n = 300007, lo = 5, cnt = n - 11; /* pieces not on 16-element edges */
    float *sh = NULL, *pv = malloc((size_t)n * sizeof(float));
    CHECK_OK(kiln_comm_alloc_shared(world, (size_t)n * sizeof(float), (void **)&sh));
    CHECK_TRUE(sh != NULL && pv != NULL);
    if (!sh || !pv)
        return;
    int zero = 1;
    for (int64_t i = 0; i < n; i++)
        zero &= sh[i] == 0.0f;
    CHECK_TRUE(zero);
    /* allreduce, sum and max, against MPI's on a private buffer */
    for (int op = 0; op < 2; op++) {
        kiln_reduce_op ro = op ? KILN_REDUCE_MAX : KILN_REDUCE_SUM;
        for (int64_t i = 0; i < n; i++)
            sh[i] = pv[i] = val(R, i);
        uint64_t b0 = kiln_comm_bytes_sent(world), n0 = kiln_comm_net_bytes(world);
        CHECK_OK(kiln_comm_allreduce(sh + lo, sh + lo, cnt, KILN_DTYPE_F32, ro, world));
        /* the ring's count either way; over the network only what crosses machines: nothing
         * on one, part of it on several (each machine's piece l over the rail) */
        uint64_t b1 = kiln_comm_bytes_sent(world), n1 = kiln_comm_net_bytes(world);
        CHECK_INT_EQ(b1 - b0, 2 * (4 * cnt / N) * (N - 1));
        if (!per || atoi(per) == N)
            CHECK_INT_EQ(n1 - n0, 0);
        else
            CHECK_TRUE(n1 - n0 > 0 && n1 - n0 < b1 - b0);
        CHECK_OK(kiln_comm_allreduce(pv + lo, pv + lo, cnt, KILN_DTYPE_F32, ro, world));
        CHECK_INT_EQ(kiln_comm_net_bytes(world) - n1, kiln_comm_bytes_sent(world) - b1);
        int same = 1;
        for (int64_t i = 0; i < n; i++)
            same &= sh[i] == pv[i];
        CHECK_TRUE(same);
        float want = 0.0f;
        for (int r = 0; r < N; r++)
            want = op ? (r ? fmaxf(want, val(r, 100)) : val(r, 100)) : want + val(r, 100);
        CHECK_TRUE(sh[100] == want);
        CHECK_TRUE(sh[0] == val(R, 0) && sh[n - 1] == val(R, n - 1)); /* outside: untouched */
    }
    /* bf16 in the same window: small integers, exact in bf16 */
    uint16_t *hb = (uint16_t *)sh, *pb = (uint16_t *)pv;
    for (int64_t i = 0; i < 2 * cnt; i++) {
        float v = (float)(R + (int)(i % 5));
        kiln_convert(&hb[i], KILN_DTYPE_BF16, &v, KILN_DTYPE_F32, 1);
        pb[i] = hb[i];
    }
    CHECK_OK(kiln_comm_allreduce(hb, hb, 2 * cnt, KILN_DTYPE_BF16, KILN_REDUCE_SUM, world));
    CHECK_OK(kiln_comm_allreduce(pb, pb, 2 * cnt, KILN_DTYPE_BF16, KILN_REDUCE_SUM, world));
    CHECK_TRUE(memcmp(hb, pb, (size_t)(2 * cnt) * 2) == 0);
    /* reduce-scatter in NCCL's layout, uneven counts */
    int64_t counts[64], off[64];
    int64_t total = vcounts(counts, off, 20011, 37);
    CHECK_TRUE(total + lo <= n);
    for (int64_t i = 0; i < n; i++)
        sh[i] = pv[i] = val(R, i);
    CHECK_OK(kiln_comm_reduce_scatter(sh + lo, sh + lo + off[R], counts, KILN_DTYPE_F32,
                                      KILN_REDUCE_SUM, world));
    CHECK_OK(kiln_comm_reduce_scatter(pv + lo, pv + lo + off[R], counts, KILN_DTYPE_F32,
                                      KILN_REDUCE_SUM, world));
    CHECK_TRUE(memcmp(sh + lo + off[R], pv + lo + off[R], (size_t)counts[R] * 4) == 0);
    float want = 0.0f;
    for (int r = 0; r < N; r++)
        want += val(r, lo + off[R]);
    CHECK_TRUE(sh[lo + off[R]] == want);
    /* ... and into memory of this rank's own */
    float *mine = malloc((size_t)counts[R] * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        sh[i] = val(R, i);
    CHECK_OK(
        kiln_comm_reduce_scatter(sh + lo, mine, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    CHECK_TRUE(mine && memcmp(mine, pv + lo + off[R], (size_t)counts[R] * 4) == 0);
    free(mine);
    /* allgather in place */
    for (int64_t i = 0; i < n; i++)
        sh[i] = pv[i] = -1.0f;
    for (int64_t i = 0; i < counts[R]; i++)
        sh[lo + off[R] + i] = pv[lo + off[R] + i] = val(R, i);
    CHECK_OK(kiln_comm_allgather(sh + lo + off[R], sh + lo, counts, KILN_DTYPE_F32, world));
    CHECK_OK(kiln_comm_allgather(pv + lo + off[R], pv + lo, counts, KILN_DTYPE_F32, world));
    CHECK_TRUE(memcmp(sh, pv, (size_t)n * 4) == 0);
    CHECK_TRUE(sh[lo + off[N - 1]] == val(N - 1, 0) && sh[lo - 1] == -1.0f);
    /* 2 allreduces (sum, max) + bf16 + 2 reduce-scatters + 1 allgather went through it */
    CHECK_INT_EQ((long long)(kiln__comm_shm_runs() - runs0), 6);
    runs0 = kiln__comm_shm_runs();
    /* offsets that differ across ranks, and one rank's buffer private: MPI's path */
    int64_t mylo = R == 0 ? 0 : 16;
    for (int64_t i = 0; i < n; i++)
        sh[i] = val(R, i);
    CHECK_OK(
        kiln_comm_allreduce(sh + mylo, sh + mylo, cnt, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    want = 0.0f;
    for (int r = 0; r < N; r++)
        want += val(r, r == 0 ? 0 : 16);
    CHECK_TRUE(sh[mylo] == want);
    for (int64_t i = 0; i < n; i++)
        sh[i] = pv[i] = val(R, i);
    float *buf = R == N - 1 ? pv : sh;
    CHECK_OK(kiln_comm_allreduce(buf, buf, cnt, KILN_DTYPE_F32, KILN_REDUCE_SUM, world));
    want = 0.0f;
    for (int r = 0; r < N; r++)
        want += val(r, 7);
    CHECK_TRUE(buf[7] == want);
    CHECK_INT_EQ((long long)(kiln__comm_shm_runs() - runs0), 0);
    /* given back, then a new one (the old window goes then, on every rank together) */
    kiln_comm_free_shared(world, sh);
    kiln_comm_free_shared(world, NULL);
    float *again = NULL;
    CHECK_OK(kiln_comm_alloc_shared(world, 1 << 20, (void **)&again));
    CHECK_TRUE(again != NULL && again[12345] == 0.0f);
    kiln_comm_free_shared(world, again);
    free(pv);
}

/* One buffer for the machine (kiln_comm_alloc_common): every rank sees every rank's writes
 * after the in-place allgather, which copies nothing; reductions of it are refused. */
static void test_common(void) {
    const char *env = getenv("KILN_COMM_SHM");
    float *c = (float *)1;
    const int64_t n = 400009;
    CHECK_OK(kiln_comm_alloc_common(world, (size_t)n * sizeof(float), (void **)&c));
    if (env && !strcmp(env, "0")) {
        CHECK_TRUE(c == NULL);
        return;
    }
    CHECK_TRUE(c != NULL);
    if (!c)
        return;
    int zero = 1;
    for (int64_t i = 0; i < n; i++)
        zero &= c[i] == 0.0f;
    CHECK_TRUE(zero);
    CHECK_OK(kiln_comm_barrier(world)); /* every rank has looked before any writes */
    int64_t counts[64], off[64];
    int64_t total = vcounts(counts, off, 20011, 37);
    CHECK_TRUE(total <= n);
    /* each rank writes its piece alone; then every piece is everyone's */
    for (int64_t i = 0; i < counts[R]; i++)
        c[off[R] + i] = val(R, i);
    uint64_t runs0 = kiln__comm_shm_runs();
    CHECK_OK(kiln_comm_allgather(c + off[R], c, counts, KILN_DTYPE_F32, world));
    CHECK_INT_EQ((long long)(kiln__comm_shm_runs() - runs0), 1);
    int same = 1;
    for (int r = 0; r < N; r++)
        for (int64_t i = 0; i < counts[r]; i++)
            same &= c[off[r] + i] == val(r, i);
    CHECK_TRUE(same);
    CHECK_TRUE(c[total] == 0.0f);
    /* the same memory behind every pointer of a machine's ranks: a write of its first
     * rank's, after a gather */
    int L = kiln_comm_local_size(world);
    CHECK_TRUE(L >= 2 && N % L == 0);
    if (R % L == 0)
        c[n - 1] = 42.0f + (float)(R / L);
    CHECK_OK(kiln_comm_allgather(c + off[R], c, counts, KILN_DTYPE_F32, world));
    CHECK_TRUE(c[n - 1] == 42.0f + (float)(R / L));
    CHECK_TRUE(c[off[N - 1]] == val(N - 1, 0)); /* and the gather left every piece as it was */
    /* every rank adding the same memory: refused on every rank, large and small */
    CHECK_STATUS(kiln_comm_allreduce(c, c, n, KILN_DTYPE_F32, KILN_REDUCE_SUM, world),
                 KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "shares as one") != NULL);
    CHECK_STATUS(kiln_comm_allreduce(c, c, 8, KILN_DTYPE_F32, KILN_REDUCE_SUM, world),
                 KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_reduce_scatter(c, c + off[R], counts, KILN_DTYPE_F32, KILN_REDUCE_SUM,
                                          world),
                 KILN_ERR_ARG);
    CHECK_TRUE(c[off[R]] == val(R, 0)); /* untouched by the refusals */
    /* the common buffer on rank 0 alone: an error on every rank, not a wrong gather */
    float *pv = calloc((size_t)n, sizeof(float));
    CHECK_TRUE(pv != NULL);
    if (pv) {
        float *buf = R == 0 ? c : pv;
        CHECK_STATUS(kiln_comm_allgather(buf + off[R], buf, counts, KILN_DTYPE_F32, world),
                     KILN_ERR_ARG);
        free(pv);
    }
    /* given back now, on every rank together, and the memory of a new one is zero again */
    CHECK_OK(kiln_comm_free_shared_now(world, c));
    float *again = NULL;
    CHECK_OK(kiln_comm_alloc_common(world, (size_t)n * sizeof(float), (void **)&again));
    CHECK_TRUE(again != NULL && again[off[R]] == 0.0f && again[n - 1] == 0.0f);
    kiln_comm_free_shared(world, again);
}

/* kiln_comm_abort reports; this program ends the job, as the kiln command does. */
static void end_job(kiln_comm *c, int code, const char *msg, void *user) {
    (void)msg;
    (void)user;
    kiln_comm_abort_job(c, code);
    exit(code);
}

int main(int argc, char **argv) {
    kiln_comm_set_abort_handler(end_job, NULL);
    if (!kiln_comm_have_mpi()) {
        fprintf(stderr, "SKIP: kiln was built without MPI\n");
        return TEST_SKIP_CODE;
    }
    const char *mode = argc > 1 ? argv[1] : "all";
    if (!strcmp(mode, "srun-singleton")) {
        CHECK_STATUS(kiln_comm_init_auto(&world), KILN_ERR_CONFIG);
        CHECK_TRUE(world == NULL);
        fprintf(stderr, "init_auto: %s\n", kiln_error_message());
        CHECK_TRUE(strstr(kiln_error_message(), "rank 1 of 2 (SLURM_PROCID, SLURM_NTASKS)"));
        CHECK_TRUE(strstr(kiln_error_message(), "MPI says rank 0 of 1"));
        TEST_MAIN_END();
    }
    kiln_status s = kiln_comm_init_auto(&world);
    if (s != KILN_OK) {
        fprintf(stderr, "kiln_comm_init_auto: %s: %s\n", kiln_status_str(s), kiln_error_message());
        return 1;
    }
    R = kiln_comm_rank(world);
    N = kiln_comm_size(world);
    if (N > 8) {
        fprintf(stderr, "at most 8 ranks\n");
        return 1;
    }
    if (!strcmp(mode, "dead-exit"))
        return run_dead(0);
    if (!strcmp(mode, "dead-kill"))
        return run_dead(1);
    if (!strcmp(mode, "abort"))
        return run_dead(2);
    if (!strcmp(mode, "huge")) {
        int rc = run_huge();
        kiln_comm_free(world);
        return rc;
    }
    RUN_TEST(test_world);
    RUN_TEST(test_allreduce_f32);
    RUN_TEST(test_allreduce_half);
    RUN_TEST(test_reduce_scatter);
    RUN_TEST(test_allgather);
    RUN_TEST(test_broadcast);
    RUN_TEST(test_nonblocking);
    RUN_TEST(test_split);
    RUN_TEST(test_send_recv);
    RUN_TEST(test_thread);
    RUN_TEST(test_large);
    RUN_TEST(test_chunked);
    RUN_TEST(test_shared);
    RUN_TEST(test_common);
    kiln_comm_free(world); /* the last communicator: MPI_Finalize */
    TEST_MAIN_END();
}
