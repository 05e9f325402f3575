/* kiln_comm in one process: the single communicator's collectives (copies, in place,
 * v-counts, non-blocking), split, argument errors, the BF16/F16 reduction operator MPI
 * runs, and init_auto's reading of the launch environment. Never calls MPI_Init (the
 * multi-process tests are tests/dist). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/comm_internal.h"
#include "kiln/comm.h"
#include "kiln/dtype.h"
#include "test.h"

static void test_single_basics(void) {
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    CHECK_INT_EQ(kiln_comm_rank(c), 0);
    CHECK_INT_EQ(kiln_comm_size(c), 1);
    CHECK_STR_EQ(kiln_comm_kind(c), "single");
    CHECK_OK(kiln_comm_barrier(c));
    kiln_comm_progress(c);
    CHECK_INT_EQ(kiln_comm_bytes_sent(c), 0);
    CHECK_INT_EQ(kiln_comm_net_bytes(c), 0);
    CHECK_TRUE(kiln_comm_wait_seconds(c) >= 0);
    kiln_comm_free(c);
    kiln_comm_free(NULL);
}

static void test_single_allreduce(void) {
    kiln_comm *c;
    CHECK_OK(kiln_comm_init_single(&c));
    float a[5] = {1, -2, 3.5f, 4, 1e30f}, b[5] = {0};
    for (int op = 0; op < KILN_REDUCE_OP_COUNT; op++) {
        memset(b, 0, sizeof b);
        CHECK_OK(kiln_comm_allreduce(a, b, 5, KILN_DTYPE_F32, (kiln_reduce_op)op, c));
        CHECK_TRUE(memcmp(a, b, sizeof a) == 0);
    }
    CHECK_OK(kiln_comm_allreduce(b, b, 5, KILN_DTYPE_F32, KILN_REDUCE_SUM, c)); /* in place */
    CHECK_TRUE(memcmp(a, b, sizeof a) == 0);
    uint16_t h[3] = {kiln_f32_to_bf16(1.5f), kiln_f32_to_bf16(-3), 0}, g[3];
    CHECK_OK(kiln_comm_allreduce(h, g, 3, KILN_DTYPE_BF16, KILN_REDUCE_MAX, c));
    CHECK_TRUE(memcmp(h, g, sizeof h) == 0);
    CHECK_OK(kiln_comm_allreduce(h, g, 3, KILN_DTYPE_F16, KILN_REDUCE_MIN, c));
    CHECK_OK(kiln_comm_allreduce(NULL, NULL, 0, KILN_DTYPE_F32, KILN_REDUCE_SUM, c));
    kiln_comm_free(c);
}

static void test_single_vcollectives(void) {
    kiln_comm *c;
    CHECK_OK(kiln_comm_init_single(&c));
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {0};
    int64_t counts[1] = {6};
    CHECK_OK(kiln_comm_reduce_scatter(x, y, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, c));
    CHECK_TRUE(memcmp(x, y, sizeof x) == 0);
    CHECK_OK(kiln_comm_reduce_scatter(y, y, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, c));
    CHECK_TRUE(memcmp(x, y, sizeof x) == 0);
    memset(y, 0, sizeof y);
    CHECK_OK(kiln_comm_allgather(x, y, counts, KILN_DTYPE_F32, c));
    CHECK_TRUE(memcmp(x, y, sizeof x) == 0);
    CHECK_OK(kiln_comm_allgather(y, y, counts, KILN_DTYPE_F32, c)); /* in place */
    CHECK_TRUE(memcmp(x, y, sizeof x) == 0);
    uint16_t h[4] = {1, 2, 3, 4}, g[4] = {0};
    int64_t four[1] = {4}, zero[1] = {0};
    CHECK_OK(kiln_comm_allgather(h, g, four, KILN_DTYPE_F16, c));
    CHECK_TRUE(memcmp(h, g, sizeof h) == 0);
    CHECK_OK(kiln_comm_allgather(NULL, NULL, zero, KILN_DTYPE_F16, c));
    CHECK_OK(kiln_comm_broadcast(x, 6, KILN_DTYPE_F32, 0, c));
    CHECK_INT_EQ(x[5], 6);
    kiln_comm_free(c);
}

static void test_single_nonblocking(void) {
    kiln_comm *c;
    CHECK_OK(kiln_comm_init_single(&c));
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    int64_t counts[1] = {4};
    kiln_comm_request *r = NULL;
    CHECK_OK(kiln_comm_iallreduce(x, y, 4, KILN_DTYPE_F32, KILN_REDUCE_SUM, c, &r));
    CHECK_TRUE(r != NULL);
    int done = 0;
    CHECK_OK(kiln_comm_test(r, &done)); /* frees r: done */
    CHECK_INT_EQ(done, 1);
    CHECK_TRUE(memcmp(x, y, sizeof x) == 0);
    memset(y, 0, sizeof y);
    CHECK_OK(kiln_comm_ireduce_scatter(x, y, counts, KILN_DTYPE_F32, KILN_REDUCE_MAX, c, &r));
    CHECK_OK(kiln_comm_wait(r));
    CHECK_TRUE(memcmp(x, y, sizeof x) == 0);
    memset(y, 0, sizeof y);
    CHECK_OK(kiln_comm_iallgather(x, y, counts, KILN_DTYPE_F32, c, &r));
    CHECK_OK(kiln_comm_wait(r));
    CHECK_TRUE(memcmp(x, y, sizeof x) == 0);
    CHECK_OK(kiln_comm_ibroadcast(y, 4, KILN_DTYPE_F32, 0, c, &r));
    kiln_comm_progress(c);
    CHECK_OK(kiln_comm_wait(r));
    CHECK_INT_EQ(y[3], 4);
    kiln_comm_free(c);
}

static void test_single_split(void) {
    kiln_comm *c, *g = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    CHECK_OK(kiln_comm_split(c, 3, 7, &g));
    CHECK_TRUE(g != NULL);
    CHECK_INT_EQ(kiln_comm_rank(g), 0);
    CHECK_INT_EQ(kiln_comm_size(g), 1);
    CHECK_STR_EQ(kiln_comm_kind(g), "single");
    float x = 2, y = 0;
    CHECK_OK(kiln_comm_allreduce(&x, &y, 1, KILN_DTYPE_F32, KILN_REDUCE_SUM, g));
    CHECK_INT_EQ(y, 2);
    kiln_comm_free(c); /* a group outlives its parent */
    CHECK_OK(kiln_comm_barrier(g));
    kiln_comm_free(g);
}

/* What each MPI hop of a BF16/F16 reduction does: fp32 arithmetic, one rounding to nearest
 * even. */
static void test_reduce_rounding(void) {
    /* bf16 has 7 mantissa bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7. */
    uint16_t a[4] = {kiln_f32_to_bf16(1.0f), kiln_f32_to_bf16(1.0f + 0x1p-7f),
                     kiln_f32_to_bf16(3.0f), kiln_f32_to_bf16(-2.0f)};
    uint16_t b[4] = {kiln_f32_to_bf16(0x1p-8f), kiln_f32_to_bf16(0x1p-8f),
                     kiln_f32_to_bf16(0x1p-9f), kiln_f32_to_bf16(5.0f)};
    uint16_t s[4];
    memcpy(s, a, sizeof s);
    kiln__comm_reduce_local(s, b, 4, KILN_DTYPE_BF16, KILN_REDUCE_SUM);
    CHECK_NEAR(kiln_bf16_to_f32(s[0]), 1.0, 0);              /* tie to even: down */
    CHECK_NEAR(kiln_bf16_to_f32(s[1]), 1.0 + 2 * 0x1p-7, 0); /* tie to even: up */
    CHECK_NEAR(kiln_bf16_to_f32(s[2]), 3.0, 0);              /* below half an ulp */
    CHECK_NEAR(kiln_bf16_to_f32(s[3]), 3.0, 0);
    memcpy(s, a, sizeof s);
    kiln__comm_reduce_local(s, b, 4, KILN_DTYPE_BF16, KILN_REDUCE_MAX);
    CHECK_NEAR(kiln_bf16_to_f32(s[0]), 1.0, 0);
    CHECK_NEAR(kiln_bf16_to_f32(s[3]), 5.0, 0);
    memcpy(s, a, sizeof s);
    kiln__comm_reduce_local(s, b, 4, KILN_DTYPE_BF16, KILN_REDUCE_MIN);
    CHECK_NEAR(kiln_bf16_to_f32(s[0]), 0x1p-8, 0);
    CHECK_NEAR(kiln_bf16_to_f32(s[3]), -2.0, 0);

    /* f16 has 10 mantissa bits: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
    uint16_t f[3] = {kiln_f32_to_f16(1.0f), kiln_f32_to_f16(1.0f + 0x1p-10f),
                     kiln_f32_to_f16(60000.0f)};
    uint16_t e[3] = {kiln_f32_to_f16(0x1p-11f), kiln_f32_to_f16(0x1p-11f),
                     kiln_f32_to_f16(60000.0f)};
    kiln__comm_reduce_local(f, e, 3, KILN_DTYPE_F16, KILN_REDUCE_SUM);
    CHECK_NEAR(kiln_f16_to_f32(f[0]), 1.0, 0);
    CHECK_NEAR(kiln_f16_to_f32(f[1]), 1.0 + 2 * 0x1p-10, 0);
    CHECK_TRUE(isinf(kiln_f16_to_f32(f[2]))); /* past 65504: what loss scaling detects */

    /* NaN propagates through MAX whichever side it is on. */
    uint16_t n1[2] = {kiln_f32_to_bf16(NAN), kiln_f32_to_bf16(1.0f)};
    uint16_t n2[2] = {kiln_f32_to_bf16(1.0f), kiln_f32_to_bf16(NAN)};
    kiln__comm_reduce_local(n1, n2, 2, KILN_DTYPE_BF16, KILN_REDUCE_MAX);
    CHECK_TRUE(isnan(kiln_bf16_to_f32(n1[0])));
    CHECK_TRUE(isnan(kiln_bf16_to_f32(n1[1])));

    float x[2] = {1.0f, 2.0f}, y[2] = {0x1p-30f, -1.0f};
    kiln__comm_reduce_local(x, y, 2, KILN_DTYPE_F32, KILN_REDUCE_SUM);
    CHECK_NEAR(x[0], 1.0f + 0x1p-30f, 0);
    CHECK_NEAR(x[1], 1.0, 0);
}

static void test_arg_errors(void) {
    kiln_comm *c;
    CHECK_OK(kiln_comm_init_single(&c));
    float x[8] = {0};
    int64_t counts[1] = {4}, neg[1] = {-1};
    kiln_comm_request *r = NULL;
    int done;
    CHECK_STATUS(kiln_comm_allreduce(x, x, 4, KILN_DTYPE_F32, KILN_REDUCE_SUM, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_allreduce(NULL, x, 4, KILN_DTYPE_F32, KILN_REDUCE_SUM, c), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "send is NULL") != NULL);
    CHECK_STATUS(kiln_comm_allreduce(x, NULL, 4, KILN_DTYPE_F32, KILN_REDUCE_SUM, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_allreduce(x, x, -1, KILN_DTYPE_F32, KILN_REDUCE_SUM, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_allreduce(x, x, 4, (kiln_dtype)7, KILN_REDUCE_SUM, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_allreduce(x, x, 4, KILN_DTYPE_F32, (kiln_reduce_op)9, c), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "reduce op 9") != NULL);
    CHECK_STATUS(kiln_comm_allreduce(x, x + 2, 4, KILN_DTYPE_F32, KILN_REDUCE_SUM, c),
                 KILN_ERR_ARG); /* overlapping, not equal */
    CHECK_STATUS(kiln_comm_iallreduce(x, x, 4, KILN_DTYPE_F32, KILN_REDUCE_SUM, c, NULL),
                 KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_reduce_scatter(x, x, NULL, KILN_DTYPE_F32, KILN_REDUCE_SUM, c),
                 KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_reduce_scatter(x, x, neg, KILN_DTYPE_F32, KILN_REDUCE_SUM, c),
                 KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_reduce_scatter(x, x + 1, counts, KILN_DTYPE_F32, KILN_REDUCE_SUM, c),
                 KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_allgather(x + 1, x, counts, KILN_DTYPE_F32, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_allgather(NULL, x, counts, KILN_DTYPE_F32, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_iallgather(x, x, counts, KILN_DTYPE_F32, c, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_broadcast(x, 4, KILN_DTYPE_F32, 1, c), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "root 1") != NULL);
    CHECK_STATUS(kiln_comm_broadcast(x, 4, KILN_DTYPE_F32, -1, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_ibroadcast(NULL, 4, KILN_DTYPE_F32, 0, c, &r), KILN_ERR_ARG);
    CHECK_TRUE(r == NULL);
    CHECK_STATUS(kiln_comm_send(x, 4, KILN_DTYPE_F32, 0, 0, c), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "this rank itself") != NULL);
    CHECK_STATUS(kiln_comm_send(x, 4, KILN_DTYPE_F32, 1, 0, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_recv(x, 4, KILN_DTYPE_F32, 0, 0, c), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_barrier(NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_wait(NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_comm_test(NULL, &done), KILN_ERR_ARG);
    kiln_comm *g = NULL;
    CHECK_STATUS(kiln_comm_split(c, -1, 0, &g), KILN_ERR_ARG);
    CHECK_TRUE(g == NULL);
    CHECK_STATUS(kiln_comm_init_single(NULL), KILN_ERR_ARG);
    CHECK_INT_EQ(kiln_comm_bytes_sent(c), 0);
    kiln_comm_free(c);
}

/* The launch variables init_auto reads, cleared so that the test sees no launcher even when
 * it runs under one. */
static const char *const launch_vars[] = {
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "MV2_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_PROCID",
};

static void clear_launch_env(void) {
    for (size_t i = 0; i < sizeof launch_vars / sizeof launch_vars[0]; i++)
        unsetenv(launch_vars[i]);
}

static void test_init_auto_single(void) {
    clear_launch_env();
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_init_auto(&c));
    CHECK_STR_EQ(kiln_comm_kind(c), "single");
    CHECK_INT_EQ(kiln_comm_size(c), 1);
    kiln_comm_free(c);
    setenv("SLURM_NTASKS", "1", 1); /* srun of one task: one process */
    setenv("SLURM_PROCID", "0", 1);
    CHECK_OK(kiln_comm_init_auto(&c));
    CHECK_STR_EQ(kiln_comm_kind(c), "single");
    kiln_comm_free(c);
    clear_launch_env();
}

/* How a launch is read, without initialising MPI. */
static void test_launch_detect(void) {
    clear_launch_env();
    kiln__comm_launch l = kiln__comm_launch_detect();
    CHECK_TRUE(l.by == NULL);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_PROCID", "1", 1);
    l = kiln__comm_launch_detect();
    CHECK_STR_EQ(l.by, "srun");
    CHECK_INT_EQ(l.rank, 1);
    CHECK_INT_EQ(l.size, 2);
    setenv("SLURM_STEP_NUM_TASKS", "4", 1); /* the step's tasks win over the job's */
    CHECK_INT_EQ(kiln__comm_launch_detect().size, 4);
    /* mpirun under Slurm: its ranks inherit its daemons' SLURM_ variables; its own win */
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    l = kiln__comm_launch_detect();
    CHECK_TRUE(l.by && strstr(l.by, "mpirun"));
    CHECK_INT_EQ(l.rank, 5);
    CHECK_INT_EQ(l.size, 8);
    clear_launch_env();
    setenv("PMIX_RANK", "3", 1); /* srun --mpi=pmix: the size is Slurm's */
    setenv("SLURM_NTASKS", "6", 1);
    l = kiln__comm_launch_detect();
    CHECK_TRUE(l.by && strstr(l.by, "PMIx"));
    CHECK_INT_EQ(l.rank, 3);
    CHECK_INT_EQ(l.size, 6);
    clear_launch_env();
}

/* A multi-process launch on a kiln without MPI is refused. With MPI, init_auto would call
 * MPI_Init here, which a unit test must not: tests/dist runs those launches, and a build
 * with -DKILN_MPI=OFF runs this one. */
static void test_init_auto_without_mpi(void) {
    kiln_comm *c = NULL;
    CHECK_STATUS(kiln_comm_init_mpi(&c), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "without MPI") != NULL);
    clear_launch_env();
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_PROCID", "1", 1);
    CHECK_STATUS(kiln_comm_init_auto(&c), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(c == NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "srun") != NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "SLURM_NTASKS=2") != NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "without MPI") != NULL);
    clear_launch_env();
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    CHECK_STATUS(kiln_comm_init_auto(&c), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "mpirun") != NULL);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1); /* mpirun -np 1: one process is fine */
    CHECK_OK(kiln_comm_init_auto(&c));
    CHECK_STR_EQ(kiln_comm_kind(c), "single");
    kiln_comm_free(c);
    clear_launch_env();
    setenv("PMIX_RANK", "0", 1); /* a size it does not say could be several */
    CHECK_STATUS(kiln_comm_init_auto(&c), KILN_ERR_UNSUPPORTED);
    clear_launch_env();
}

/* kiln_comm_abort never ends the process itself: without a handler it returns
 * KILN_ERR_ABORTED with the message; a registered handler gets the communicator, the code and
 * the message, and ending the process is the handler's (here, in a child, with the code). */
static int abort_calls, abort_code;
static kiln_comm *abort_comm;
static void *abort_user;
static char abort_msg[128];

static void record_abort(kiln_comm *c, int code, const char *msg, void *user) {
    abort_calls++;
    abort_code = code;
    abort_comm = c;
    abort_user = user;
    snprintf(abort_msg, sizeof abort_msg, "%s", msg);
}

static void exit_abort(kiln_comm *c, int code, const char *msg, void *user) {
    (void)c;
    (void)msg;
    (void)user;
    _exit(code);
}

static void test_abort(void) {
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    kiln_comm_set_abort_handler(NULL, NULL);
    CHECK_STATUS(kiln_comm_abort(c, 5, "test_comm: no handler"), KILN_ERR_ABORTED);
    CHECK_TRUE(strstr(kiln_error_message(), "test_comm: no handler") != NULL);
    float x = 2.0f; /* the communicator still works */
    CHECK_OK(kiln_comm_allreduce(&x, &x, 1, KILN_DTYPE_F32, KILN_REDUCE_SUM, c));
    CHECK_NEAR(x, 2.0, 0);

    int token = 7;
    kiln_comm_set_abort_handler(record_abort, &token);
    CHECK_STATUS(kiln_comm_abort(c, 6, "test_comm: a handler that returns"), KILN_ERR_ABORTED);
    CHECK_INT_EQ(abort_calls, 1);
    CHECK_INT_EQ(abort_code, 6);
    CHECK_TRUE(abort_comm == c);
    CHECK_TRUE(abort_user == &token);
    CHECK_STR_EQ(abort_msg, "test_comm: a handler that returns");
    kiln_comm_abort_job(c, 6); /* "single": no other rank, and it returns */
    CHECK_INT_EQ(abort_calls, 1);

    kiln_comm_set_abort_handler(exit_abort, NULL);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        kiln_comm_abort(c, 5, "test_comm: a handler that ends the process");
        _exit(99); /* not reached: the handler exits */
    }
    int status = 0;
    CHECK_TRUE(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_TRUE(WIFEXITED(status));
    CHECK_INT_EQ(WEXITSTATUS(status), 5);
    kiln_comm_set_abort_handler(NULL, NULL);
    kiln_comm_free(c);
}

int main(void) {
    RUN_TEST(test_single_basics);
    RUN_TEST(test_single_allreduce);
    RUN_TEST(test_single_vcollectives);
    RUN_TEST(test_single_nonblocking);
    RUN_TEST(test_single_split);
    RUN_TEST(test_reduce_rounding);
    RUN_TEST(test_arg_errors);
    RUN_TEST(test_init_auto_single);
    RUN_TEST(test_launch_detect);
    if (kiln_comm_have_mpi()) /* the refusal needs a build with -DKILN_MPI=OFF */
        printf("(test_init_auto_without_mpi is for builds without MPI; this one has it)\n");
    else
        RUN_TEST(test_init_auto_without_mpi);
    RUN_TEST(test_abort);
    TEST_MAIN_END();
}
