/* The "nccl" communicator on GPUs: every collective on device buffers of the CUDA backend,
 * checked against the result computed on the host, in F32, BF16 and F16, with sum, max and min,
 * in place and not, with equal and unequal counts (some of them 0), the non-blocking forms (wait
 * and test), send and recv, barrier, split, the order of the backend's stream, and the errors.
 *
 *   test_comm_nccl                one rank, booted from kiln_comm_init_single (gpu.comm_nccl)
 *   mpirun -np N test_comm_nccl   N ranks booted from MPI, each on GPU (local rank % GPUs) when
 *                                 the machine has a GPU per rank (gpu.comm_nccl_np2, N = 2)
 *
 * Inputs are small integers, exact in every dtype, so any order of reduction gives the same
 * bits; the rounding test alone sums BF16/F16 fractions, within the N-1 roundings of
 * kiln/comm.h. Without a usable GPU, without NCCL in the build or without libnccl it prints
 * "SKIP: ..." and exits 77; the ranks agree first, so that none waits for another. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

#include "dist/comm_nccl.h"
#include "kiln/backend.h"
#include "kiln/comm.h"
#include "kiln/core.h"
#include "kiln/dtype.h"
#include "test.h"

#define F32 KILN_DTYPE_F32
#define BF16 KILN_DTYPE_BF16
#define F16 KILN_DTYPE_F16
#define SUM KILN_REDUCE_SUM

static kiln_comm *boot, *nc;
static kiln_backend *gpu;
static int R, N; /* this rank, the number of ranks */
static const kiln_dtype dts[3] = {F32, BF16, F16};
static const char *const op_names[3] = {"sum", "max", "min"};
enum { SETS = 5, MAX_RANKS = 16 };

/* ---- values and buffers ---- */

/* Rank r's element i: an integer in [-3, 7], exact in every dtype, as are sums of 16. */
static float val(int r, int64_t i) {
    return (float)((r * 5 + i * 3) % 11) - 3.0f;
}

static float reduce_ranks(kiln_reduce_op op, int64_t i) {
    float a = val(0, i);
    for (int r = 1; r < N; r++) {
        float b = val(r, i);
        a = op == SUM ? a + b : op == KILN_REDUCE_MAX ? fmaxf(a, b) : fminf(a, b);
    }
    return a;
}

/* n floats as dt into device memory at d. */
static void upload(void *d, const float *x, int64_t n, kiln_dtype dt) {
    size_t bytes = (size_t)n * kiln_dtype_size(dt);
    void *h = malloc(bytes + 1);
    kiln_convert(h, dt, x, F32, n);
    gpu->copy(gpu, d, h, bytes, KILN_COPY_TO_DEVICE);
    free(h);
}

/* n elements of dt at device address d, as floats. */
static void download(float *x, const void *d, int64_t n, kiln_dtype dt) {
    size_t bytes = (size_t)n * kiln_dtype_size(dt);
    void *h = malloc(bytes + 1);
    gpu->copy(gpu, h, d, bytes, KILN_COPY_TO_HOST);
    kiln_convert(x, F32, h, dt, n);
    free(h);
}

static void *dev(int64_t n, kiln_dtype dt) {
    return gpu->alloc(gpu, (size_t)n * kiln_dtype_size(dt));
}

/* Rank r's values at elements [from, from + n). */
static float *values(int r, int64_t from, int64_t n) {
    float *x = malloc((size_t)n * sizeof *x + 1);
    for (int64_t i = 0; i < n; i++)
        x[i] = val(r, from + i);
    return x;
}

/* Elements that differ, the first one printed. */
static int mismatches(const float *got, const float *want, int64_t n, const char *what) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ == 0)
            fprintf(stderr, "  rank %d, %s: element %lld is %g, want %g\n", R, what, (long long)i,
                    got[i], want[i]);
    return bad;
}

/* Count set k: equal, none, rising (the scratch path of reduce-scatter in place), falling, and
 * every other rank without a piece. Offsets into off; the sum returned. */
static int64_t count_set(int k, int64_t *counts, int64_t *off) {
    int64_t sum = 0;
    for (int r = 0; r < N; r++) {
        counts[r] = k == 0   ? 5
                    : k == 1 ? 0
                    : k == 2 ? 2 + 3 * r
                    : k == 3 ? 2 * (N - r) + 1
                             : (r % 2 ? 0 : 4 + r);
        off[r] = sum;
        sum += counts[r];
    }
    return sum;
}

/* ---- tests ---- */

static void test_identity(void) {
    CHECK_INT_EQ(kiln_comm_have_nccl(), 1);
    CHECK_STR_EQ(kiln_comm_kind(nc), "nccl");
    CHECK_INT_EQ(kiln_comm_rank(nc), R);
    CHECK_INT_EQ(kiln_comm_size(nc), N);
    void *p = (void *)1;
    CHECK_OK(kiln_comm_alloc_shared(nc, 4096, &p)); /* none: the caller allocates */
    CHECK_TRUE(p == NULL);
    CHECK_INT_EQ(kiln_comm_shares_memory(nc), 0);
}

static void allreduce_case(kiln_dtype dt, kiln_reduce_op op, int64_t n, int in_place) {
    char what[64];
    snprintf(what, sizeof what, "allreduce %s %s n=%lld%s", kiln_dtype_name(dt), op_names[op],
             (long long)n, in_place ? " in place" : "");
    float *x = values(R, 0, n), *want = malloc((size_t)n * sizeof *want + 1),
          *got = malloc((size_t)n * sizeof *got + 1);
    for (int64_t i = 0; i < n; i++)
        want[i] = reduce_ranks(op, i);
    void *s = dev(n, dt), *r = in_place ? s : dev(n, dt);
    upload(s, x, n, dt);
    CHECK_OK(kiln_comm_allreduce(s, r, n, dt, op, nc));
    download(got, r, n, dt);
    CHECK_INT_EQ(mismatches(got, want, n, what), 0);
    if (r != s)
        gpu->free(gpu, r);
    gpu->free(gpu, s);
    free(x), free(want), free(got);
}

static void test_allreduce(void) {
    const int64_t sizes[] = {0, 1, 1000, 4099};
    for (int d = 0; d < 3; d++)
        for (int op = 0; op < KILN_REDUCE_OP_COUNT; op++)
            for (int k = 0; k < 4; k++)
                for (int in_place = 0; in_place < 2; in_place++)
                    allreduce_case(dts[d], (kiln_reduce_op)op, sizes[k], in_place);
}

/* BF16/F16 sums of fractions: within one rounding per combination (N-1 of them). */
static void test_rounding(void) {
    enum { n = 4099 };
    static float x[n], got[n];
    for (int d = 1; d < 3; d++) {
        kiln_dtype dt = dts[d];
        double worst = 0;
        for (int64_t i = 0; i < n; i++)
            x[i] = 1.0f + 0.013f * (float)R + 0.0007f * (float)(i % 101);
        void *s = dev(n, dt);
        upload(s, x, n, dt);
        CHECK_OK(kiln_comm_allreduce(s, s, n, dt, SUM, nc));
        download(got, s, n, dt);
        for (int64_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < N; r++) {
                float v = 1.0f + 0.013f * (float)r + 0.0007f * (float)(i % 101);
                want += dt == BF16 ? kiln_bf16_to_f32(kiln_f32_to_bf16(v))
                                   : kiln_f16_to_f32(kiln_f32_to_f16(v));
            }
            worst = fmax(worst, fabs(got[i] - want) / want);
        }
        CHECK_NEAR(worst, 0, (N - 1) * kiln_dtype_epsilon(dt));
        gpu->free(gpu, s);
    }
}

/* layout 0: recv apart; 1: recv == send (result at the start); 2: recv == send + offset. */
static void reduce_scatter_case(kiln_dtype dt, kiln_reduce_op op, int set, int layout) {
    int64_t counts[MAX_RANKS], off[MAX_RANKS];
    int64_t total = count_set(set, counts, off), n = counts[R];
    size_t es = kiln_dtype_size(dt);
    char what[96];
    snprintf(what, sizeof what, "reduce_scatter %s %s counts %d layout %d", kiln_dtype_name(dt),
             op_names[op], set, layout);
    float *x = values(R, 0, total), *want = malloc((size_t)n * sizeof *want + 1),
          *got = malloc((size_t)n * sizeof *got + 1);
    for (int64_t i = 0; i < n; i++)
        want[i] = reduce_ranks(op, off[R] + i);
    char *s = dev(total, dt), *apart = layout == 0 ? dev(n, dt) : NULL;
    char *r = layout == 0 ? apart : layout == 1 ? s : s + (size_t)off[R] * es;
    upload(s, x, total, dt);
    CHECK_OK(kiln_comm_reduce_scatter(s, r, counts, dt, op, nc));
    download(got, r, n, dt);
    CHECK_INT_EQ(mismatches(got, want, n, what), 0);
    gpu->free(gpu, apart);
    gpu->free(gpu, s);
    free(x), free(want), free(got);
}

static void test_reduce_scatter(void) {
    for (int d = 0; d < 3; d++)
        for (int op = 0; op < KILN_REDUCE_OP_COUNT; op++)
            for (int set = 0; set < SETS; set++)
                for (int layout = 0; layout < 3; layout++)
                    reduce_scatter_case(dts[d], (kiln_reduce_op)op, set, layout);
}

/* in place: send is this rank's piece of recv. */
static void allgather_case(kiln_dtype dt, int set, int in_place) {
    int64_t counts[MAX_RANKS], off[MAX_RANKS];
    int64_t total = count_set(set, counts, off), n = counts[R];
    size_t es = kiln_dtype_size(dt);
    char what[96];
    snprintf(what, sizeof what, "allgather %s counts %d%s", kiln_dtype_name(dt), set,
             in_place ? " in place" : "");
    float *want = malloc((size_t)total * sizeof *want + 1),
          *got = malloc((size_t)total * sizeof *got + 1), *mine = values(R, off[R], n);
    for (int q = 0; q < N; q++)
        for (int64_t i = 0; i < counts[q]; i++)
            want[off[q] + i] = val(q, off[q] + i);
    char *r = dev(total, dt), *apart = in_place ? NULL : dev(n, dt);
    char *s = in_place ? r + (size_t)off[R] * es : apart;
    upload(s, mine, n, dt);
    CHECK_OK(kiln_comm_allgather(s, r, counts, dt, nc));
    download(got, r, total, dt);
    CHECK_INT_EQ(mismatches(got, want, total, what), 0);
    gpu->free(gpu, apart);
    gpu->free(gpu, r);
    free(want), free(got), free(mine);
}

static void test_allgather(void) {
    for (int d = 0; d < 3; d++)
        for (int set = 0; set < SETS; set++)
            for (int in_place = 0; in_place < 2; in_place++)
                allgather_case(dts[d], set, in_place);
}

static void test_broadcast(void) {
    const int64_t sizes[] = {0, 1, 777};
    for (int d = 0; d < 3; d++)
        for (int root = 0; root < N; root++)
            for (int k = 0; k < 3; k++) {
                int64_t n = sizes[k];
                float *x = values(R, 0, n), *want = values(root, 0, n),
                      *got = malloc((size_t)n * sizeof *got + 1);
                void *b = dev(n, dts[d]);
                upload(b, x, n, dts[d]);
                CHECK_OK(kiln_comm_broadcast(b, n, dts[d], root, nc));
                download(got, b, n, dts[d]);
                CHECK_INT_EQ(mismatches(got, want, n, "broadcast"), 0);
                gpu->free(gpu, b);
                free(x), free(want), free(got);
            }
}

/* Pairs (0,1), (2,3), ...: the even rank sends two messages then receives two, the odd one the
 * other way round; NCCL matches them in order (tags are not matched). */
static void test_send_recv(void) {
    enum { n = 3001 };
    int peer = R ^ 1;
    float *got = malloc(n * sizeof *got);
    void *b = dev(n, F32);
    if (peer >= N) { /* one rank, or the last of an odd number: no peer */
        CHECK_STATUS(kiln_comm_send(b, n, F32, R, 0, nc), KILN_ERR_ARG);
        gpu->free(gpu, b);
        free(got);
        return;
    }
    for (int phase = 0; phase < 2; phase++) {
        int sending = (R % 2 == 0) == (phase == 0);
        for (int k = 0; k < 2; k++) {
            int from = sending ? R : peer;
            float *want = values(from * 10 + k, 0, n);
            if (sending) {
                upload(b, want, n, F32);
                CHECK_OK(kiln_comm_send(b, n, F32, peer, 7 + k, nc));
            } else {
                CHECK_OK(kiln_comm_recv(b, n, F32, peer, 7 + k, nc));
                download(got, b, n, F32);
                CHECK_INT_EQ(mismatches(got, want, n, "recv"), 0);
            }
            free(want);
        }
    }
    gpu->free(gpu, b);
    free(got);
}

/* Four operations in flight at once; the first polled with test, the others waited for. */
static void test_nonblocking(void) {
    enum { n = 4099 };
    int64_t counts[MAX_RANKS], off[MAX_RANKS];
    int64_t total = count_set(2, counts, off), most = n > total ? n : total;
    float *x = values(R, 0, most), *got = malloc((size_t)most * sizeof *got),
          *want = malloc((size_t)most * sizeof *want);
    void *a = dev(n, F32), *rs = dev(total, BF16), *ag = dev(total, F16), *bc = dev(n, F32);
    void *mine = (char *)ag + (size_t)off[R] * kiln_dtype_size(F16);
    upload(a, x, n, F32);
    upload(rs, x, total, BF16);
    upload(mine, x + off[R], counts[R], F16);
    upload(bc, x, n, F32);
    kiln_comm_request *q[4] = {NULL, NULL, NULL, NULL};
    CHECK_OK(kiln_comm_iallreduce(a, a, n, F32, SUM, nc, &q[0]));
    CHECK_OK(kiln_comm_ireduce_scatter(rs, rs, counts, BF16, KILN_REDUCE_MAX, nc, &q[1]));
    CHECK_OK(kiln_comm_iallgather(mine, ag, counts, F16, nc, &q[2]));
    CHECK_OK(kiln_comm_ibroadcast(bc, n, F32, N - 1, nc, &q[3]));
    int done = 0;
    double t0 = kiln_time_ms();
    while (q[0] && !done && kiln_time_ms() - t0 < 30e3)
        CHECK_OK(kiln_comm_test(q[0], &done));
    CHECK_TRUE(done);
    for (int i = 1; i < 4; i++)
        if (q[i])
            CHECK_OK(kiln_comm_wait(q[i]));
    download(got, a, n, F32);
    for (int64_t i = 0; i < n; i++)
        want[i] = reduce_ranks(SUM, i);
    CHECK_INT_EQ(mismatches(got, want, n, "iallreduce"), 0);
    download(got, rs, counts[R], BF16);
    for (int64_t i = 0; i < counts[R]; i++)
        want[i] = reduce_ranks(KILN_REDUCE_MAX, off[R] + i);
    CHECK_INT_EQ(mismatches(got, want, counts[R], "ireduce_scatter in place"), 0);
    download(got, ag, total, F16);
    for (int qr = 0; qr < N; qr++)
        for (int64_t i = 0; i < counts[qr]; i++)
            want[off[qr] + i] = val(qr, off[qr] + i);
    CHECK_INT_EQ(mismatches(got, want, total, "iallgather in place"), 0);
    download(got, bc, n, F32);
    for (int64_t i = 0; i < n; i++)
        want[i] = val(N - 1, i);
    CHECK_INT_EQ(mismatches(got, want, n, "ibroadcast"), 0);
    gpu->free(gpu, a), gpu->free(gpu, rs), gpu->free(gpu, ag), gpu->free(gpu, bc);
    free(x), free(got), free(want);
}

/* Elements of device buffer d (n fp32) that are not v. */
static int64_t not_all(const float *d, int64_t n, float v, const char *what) {
    float *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
    download(got, d, n, F32);
    for (int64_t i = 0; i < n; i++)
        want[i] = v;
    int64_t bad = mismatches(got, want, n, what);
    free(got), free(want);
    return bad;
}

/* A started collective runs after the backend's ops called before it (no synchronize between
 * them), beside those called after it on other buffers (on the communicator's own stream), and
 * its result is there for the ops called after the wait. */
static void test_stream_order(void) {
    enum { n = 1 << 20 };
    float *x = malloc(n * sizeof *x);
    for (int i = 0; i < n; i++)
        x[i] = 1.0f;
    float *d = dev(n, F32), *e = dev(n, F32);
    upload(d, x, n, F32);
    upload(e, x, n, F32);
    gpu->scale(gpu, d, 3.0f, n);
    kiln_comm_request *q = NULL;
    CHECK_OK(kiln_comm_iallreduce(d, d, n, F32, SUM, nc, &q));
    for (int k = 0; k < 8; k++) /* beside the collective: another buffer */
        gpu->scale(gpu, e, 2.0f, n);
    if (q)
        CHECK_OK(kiln_comm_wait(q));
    gpu->scale(gpu, d, 0.5f, n);
    CHECK_OK(gpu->synchronize(gpu));
    CHECK_INT_EQ(not_all(d, n, 1.5f * (float)N, "scale, allreduce, wait, scale"), 0);
    CHECK_INT_EQ(not_all(e, n, 256.0f, "the ops beside the collective"), 0);
    /* blocking: the ops called after it see its result without a wait of their own */
    upload(d, x, n, F32);
    gpu->scale(gpu, d, 3.0f, n);
    CHECK_OK(kiln_comm_allreduce(d, d, n, F32, SUM, nc));
    gpu->scale(gpu, d, 0.5f, n);
    CHECK_OK(gpu->synchronize(gpu));
    CHECK_INT_EQ(not_all(d, n, 1.5f * (float)N, "scale, blocking allreduce, scale"), 0);
    gpu->free(gpu, d), gpu->free(gpu, e);
    free(x);
}

static void test_barrier(void) {
    for (int i = 0; i < 3; i++)
        CHECK_OK(kiln_comm_barrier(nc));
}

/* One group of every rank in reverse order, and a group per rank. */
static void test_split(void) {
    kiln_comm *rev = NULL, *solo = NULL;
    kiln_status s = kiln_comm_split(nc, 0, N - 1 - R, &rev);
    if (s == KILN_ERR_UNSUPPORTED) {
        TEST_SKIP("%s", kiln_error_message());
        return;
    }
    CHECK_OK(s);
    CHECK_OK(kiln_comm_split(nc, R, 0, &solo));
    if (!rev || !solo) {
        kiln_comm_free(rev), kiln_comm_free(solo);
        return;
    }
    CHECK_STR_EQ(kiln_comm_kind(rev), "nccl");
    CHECK_INT_EQ(kiln_comm_rank(rev), N - 1 - R);
    CHECK_INT_EQ(kiln_comm_size(rev), N);
    CHECK_INT_EQ(kiln_comm_rank(solo), 0);
    CHECK_INT_EQ(kiln_comm_size(solo), 1);
    float v = (float)(kiln_comm_rank(rev) + 1), got = 0;
    float *d = dev(1, F32);
    upload(d, &v, 1, F32);
    CHECK_OK(kiln_comm_allreduce(d, d, 1, F32, SUM, rev));
    download(&got, d, 1, F32);
    CHECK_NEAR(got, N * (N + 1) / 2.0, 0);
    CHECK_OK(kiln_comm_allreduce(d, d, 1, F32, KILN_REDUCE_MAX, solo));
    download(&got, d, 1, F32);
    CHECK_NEAR(got, N * (N + 1) / 2.0, 0);
    CHECK_OK(kiln_comm_barrier(rev));
    gpu->free(gpu, d);
    kiln_comm_free(solo);
    kiln_comm_free(rev);
}

/* Refused before NCCL sees them, on every rank alike. */
static void test_errors(void) {
    float host[4] = {1, 2, 3, 4};
    CHECK_STATUS(kiln_comm_allreduce(host, host, 4, F32, SUM, nc), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "not GPU memory") != NULL);
    CHECK_STATUS(kiln_comm_broadcast(host, 4, F32, 0, nc), KILN_ERR_ARG);
    kiln_comm *x = (kiln_comm *)1;
    CHECK_STATUS(kiln_comm_init_nccl(nc, &x), KILN_ERR_ARG);
    CHECK_TRUE(x == NULL);
    CHECK_STATUS(kiln_comm_init_nccl(NULL, &x), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_init_nccl(boot, NULL), KILN_ERR_ARG);
}

/* ---- which GPU, and whether every rank can run ---- */

#ifdef KILN_TEST_CUDA
static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : dflt;
}

/* With several ranks: this one on GPU (local rank % GPUs), when the machine has one a rank. */
static int pick_device(char *why, size_t cap) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
        return 1; /* kiln_cuda_available says why */
    int local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", N);
    int lr = env_int("OMPI_COMM_WORLD_LOCAL_RANK", R);
    if (n < local) {
        snprintf(why, cap, "%d ranks on this machine need a GPU each, and %d %s visible", local, n,
                 n == 1 ? "is" : "are");
        return 0;
    }
    if (cudaSetDevice(lr % n) != cudaSuccess) {
        snprintf(why, cap, "cudaSetDevice(%d) failed", lr % n);
        return 0;
    }
    return 1;
}
#endif

static int gpu_ready(const char *lib, char *why, size_t cap) {
#ifdef KILN_TEST_CUDA
    if (N > 1 && !pick_device(why, cap))
        return 0;
#endif
    char r[512];
    if (kiln_cuda_available(r, sizeof r) != KILN_OK) {
        snprintf(why, cap, "no CUDA GPU (%s)", r);
        return 0;
    }
    if (!kiln_comm_have_nccl()) {
        snprintf(why, cap, "%s", lib);
        return 0;
    }
    return 1;
}

static int skip(const char *why) {
    printf("SKIP: %s\n", why);
    fprintf(stderr, "SKIP: %s\n", why);
    kiln_comm_free(nc);
    kiln_comm_free(boot);
    return TEST_SKIP_CODE;
}

int main(void) {
    kiln_status s = kiln_comm_init_auto(&boot);
    if (s != KILN_OK) {
        fprintf(stderr, "kiln_comm_init_auto: %s: %s\n", kiln_status_str(s), kiln_error_message());
        return 1;
    }
    R = kiln_comm_rank(boot);
    N = kiln_comm_size(boot);
    if (N > MAX_RANKS) {
        fprintf(stderr, "at most %d ranks\n", MAX_RANKS);
        return 1;
    }
    char lib[600], why[700] = "";
    kiln__comm_nccl_load(lib, sizeof lib); /* which libnccl, or why none (maps it) */
    if (R == 0)
        printf("NCCL: %s\n", lib);
    float ready = (float)gpu_ready(lib, why, sizeof why), all = 0;
    if (kiln_comm_allreduce(&ready, &all, 1, F32, KILN_REDUCE_MIN, boot) != KILN_OK) {
        fprintf(stderr, "agreeing over the boot communicator: %s\n", kiln_error_message());
        return 1;
    }
    if (all < 0.5f)
        return skip(ready > 0.5f ? "another rank has no usable GPU" : why);
    gpu = kiln_backend_cuda();
    s = gpu ? kiln_comm_init_nccl(boot, &nc) : KILN_ERR_INTERNAL;
    if (s == KILN_ERR_UNSUPPORTED)
        return skip(kiln_error_message());
    if (s != KILN_OK) {
        fprintf(stderr, "FAIL: kiln_comm_init_nccl: %s: %s\n", kiln_status_str(s),
                kiln_error_message());
        return 1;
    }
    printf("rank %d of %d on an nccl communicator\n", R, N);
    RUN_TEST(test_identity);
    RUN_TEST(test_allreduce);
    RUN_TEST(test_rounding);
    RUN_TEST(test_reduce_scatter);
    RUN_TEST(test_allgather);
    RUN_TEST(test_broadcast);
    RUN_TEST(test_send_recv);
    RUN_TEST(test_nonblocking);
    RUN_TEST(test_stream_order);
    RUN_TEST(test_barrier);
    RUN_TEST(test_split);
    RUN_TEST(test_errors);
    kiln_comm_free(nc);
    kiln_comm_free(boot);
    TEST_MAIN_END();
}
