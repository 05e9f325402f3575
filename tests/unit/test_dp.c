/* The data-parallel engine (kiln/dp.h) in one process: shards, buckets built from the
 * backward's ranges, the order they must come in, the reduction (a copy of one rank's
 * gradients) and the errors. tests/dist runs it on many ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/dp.h"
#include "test.h"

/* ranges as a GPT's backward reports them: ln_f, blocks L-1..0, the embeddings */
enum { N = 1000, K = 4 };
static const int64_t LO[K] = {990, 600, 200, 0}, HI[K] = {1000, 990, 600, 200};

static void test_shards_and_buckets(void) {
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    kiln_dp_config cfg = kiln_dp_config_default();
    kiln_dp *dp = NULL;
    CHECK_OK(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K));
    int64_t lo = -1, hi = -1;
    kiln_dp_shard(dp, &lo, &hi);
    CHECK_INT_EQ(lo, 0);
    CHECK_INT_EQ(hi, N);
    /* 25 MiB buckets: all four ranges in one */
    CHECK_INT_EQ(kiln_dp_num_buckets(dp), 1);
    kiln_dp_free(dp);
    /* buckets of 400 floats: ranges join until the next would pass the size, and a range
     * larger than a bucket is a bucket of its own: {990..1000, 600..990}, {200..600}, {0..200} */
    cfg.bucket_bytes = 400 * 4;
    cfg.zero = 1;
    CHECK_OK(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K));
    CHECK_INT_EQ(kiln_dp_num_buckets(dp), 3);
    kiln_dp_shard(dp, &lo, &hi); /* one rank: its shard is everything */
    CHECK_INT_EQ(lo, 0);
    CHECK_INT_EQ(hi, N);
    kiln_dp_free(dp);
    kiln_comm_free(c);
}

static void test_step(void) {
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        for (int zero = 0; zero <= 3; zero++) {
            kiln_dp_config cfg = {.zero = zero, .bucket_bytes = 300 * 4,
                                  .reduce_dtype = bf16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32};
            kiln_dp *dp = NULL;
            CHECK_OK(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K));
            float *g = malloc(N * sizeof *g), *want = malloc(N * sizeof *want);
            for (int i = 0; i < N; i++)
                g[i] = want[i] = 0.001f * (float)(i - 500); /* not bf16-exact: rounded */
            CHECK_OK(kiln_dp_begin(dp, g));
            for (int k = 0; k < K; k++)
                kiln_dp_ready(dp, LO[k], HI[k]);
            CHECK_OK(kiln_dp_finish(dp));
            /* one rank: the sum is the gradient itself, rounded to bf16 when sent in bf16 */
            double worst = 0.0;
            for (int i = 0; i < N; i++)
                worst = fmax(worst, fabs((double)g[i] - want[i]) / fmax(fabs(want[i]), 1e-3));
            CHECK_TRUE(worst <= (bf16 ? 1.0 / 256 : 0.0));
            double v[2] = {1.5, -2.25};
            CHECK_OK(kiln_dp_allreduce_sums(dp, v, 2));
            CHECK_NEAR(v[0], 1.5, 0.0);
            CHECK_NEAR(v[1], -2.25, 0.0);
            CHECK_OK(kiln_dp_gather(dp, g, KILN_DTYPE_F32));
            CHECK_OK(kiln_dp_average(dp, g, N));
            kiln_dp_stats st = kiln_dp_take_stats(dp);
            CHECK_TRUE(st.comm_s >= 0.0 && st.exposed_s >= 0.0 && st.bytes == 0);
            free(g);
            free(want);
            kiln_dp_free(dp);
        }
    }
    kiln_comm_free(c);
}

static void test_shard_bounds(void) {
    /* equal pieces on 16-element edges, covering [0, n) in rank order */
    for (int world = 1; world <= 7; world++) {
        for (int64_t n = 1; n < 200; n += 37) {
            int64_t end = 0;
            for (int r = 0; r < world; r++) {
                int64_t lo, hi;
                kiln_dp_shard_bounds(n, world, r, &lo, &hi);
                CHECK_INT_EQ(lo, end);
                CHECK_TRUE(hi >= lo && (hi == n || hi % 16 == 0));
                end = hi;
            }
            CHECK_INT_EQ(end, n);
        }
    }
}

static void test_gather_and_discard(void) {
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    kiln_dp_config cfg = kiln_dp_config_default();
    cfg.zero = 3;
    kiln_dp *dp = NULL;
    CHECK_OK(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K));
    float *w = malloc(N * sizeof *w);
    for (int i = 0; i < N; i++)
        w[i] = (float)i;
    uint64_t t1 = 0, t2 = 0;
    CHECK_OK(kiln_dp_gather_range_async(dp, w, KILN_DTYPE_F32, 200, 600, &t1));
    CHECK_OK(kiln_dp_gather_range_async(dp, w, KILN_DTYPE_F32, 0, 200, &t2));
    CHECK_TRUE(t2 > t1);
    CHECK_OK(kiln_dp_wait(dp, t2, NULL));
    CHECK_NEAR(w[300], 300.0, 0.0); /* one rank: its own shard, unchanged */
    CHECK_STATUS(kiln_dp_gather_range_async(dp, w, KILN_DTYPE_F32, 900, 1001, &t1), KILN_ERR_ARG);
    /* one rank owns everything: nothing outside its shard to discard */
    kiln_dp_discard_range(dp, w, KILN_DTYPE_F32, 0, N);
    CHECK_NEAR(w[999], 999.0, 0.0);
    CHECK_OK(kiln_dp_idle(dp));
    free(w);
    kiln_dp_free(dp);
    kiln_comm_free(c);
}

static void test_memory_discard(void) {
    size_t bytes = (size_t)3 << 20;
    unsigned char *p = kiln_memory_map(bytes);
    CHECK_TRUE(p != NULL);
    memset(p, 7, bytes);
    kiln_memory_discard(p + 1000, bytes - 2000); /* partial pages at both ends */
    CHECK_INT_EQ(p[999], 7);
    CHECK_INT_EQ(p[1000], 0);
    CHECK_INT_EQ(p[bytes / 2], 0);
    CHECK_INT_EQ(p[bytes - 1001], 0);
    CHECK_INT_EQ(p[bytes - 1000], 7);
    kiln_memory_unmap(p, bytes);
}

static void test_errors(void) {
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    kiln_dp_config cfg = kiln_dp_config_default();
    kiln_dp *dp = NULL;
    /* ranges that overlap, or leave a gap */
    int64_t lo[2] = {0, 400}, hi[2] = {500, 1000};
    CHECK_STATUS(kiln_dp_create(&dp, c, &cfg, N, lo, hi, 2), KILN_ERR_ARG);
    CHECK_TRUE(dp == NULL);
    int64_t lo2[2] = {500, 10}, hi2[2] = {1000, 500};
    CHECK_STATUS(kiln_dp_create(&dp, c, &cfg, N, lo2, hi2, 2), KILN_ERR_ARG);
    int64_t lo3[2] = {500, 0}, hi3[2] = {1000, 500};
    hi3[1] = 499;
    CHECK_STATUS(kiln_dp_create(&dp, c, &cfg, N, lo3, hi3, 2), KILN_ERR_ARG);
    /* any order that covers the slab once (the embedding's rows apart report wte, at 0,
     * first): ranges not just below the one before start a bucket of their own */
    int64_t lo4[3] = {0, 600, 300}, hi4[3] = {300, 1000, 600};
    CHECK_OK(kiln_dp_create(&dp, c, &cfg, N, lo4, hi4, 3));
    CHECK_INT_EQ(dp ? kiln_dp_num_buckets(dp) : 0, 2); /* [0,300); [300,1000) fits 25 MiB */
    kiln_dp_free(dp);
    dp = NULL;
    cfg.zero = 4;
    CHECK_STATUS(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K), KILN_ERR_CONFIG);
    cfg.zero = -1;
    CHECK_STATUS(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K), KILN_ERR_CONFIG);
    cfg.zero = 0;
    cfg.reduce_dtype = KILN_DTYPE_F16;
    CHECK_STATUS(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K), KILN_ERR_CONFIG);
    cfg.reduce_dtype = KILN_DTYPE_F32;
    cfg.bucket_bytes = 100 * 4;
    CHECK_OK(kiln_dp_create(&dp, c, &cfg, N, LO, HI, K));
    float *g = calloc(N, sizeof *g);
    /* a range out of the order the buckets were built for */
    CHECK_OK(kiln_dp_begin(dp, g));
    kiln_dp_ready(dp, LO[1], HI[1]);
    CHECK_STATUS(kiln_dp_finish(dp), KILN_ERR_ARG);
    /* finish without begin, begin twice */
    CHECK_STATUS(kiln_dp_finish(dp), KILN_ERR_ARG);
    CHECK_OK(kiln_dp_begin(dp, g));
    CHECK_STATUS(kiln_dp_begin(dp, g), KILN_ERR_ARG);
    double v = 1.0;
    CHECK_STATUS(kiln_dp_allreduce_sums(dp, &v, 1), KILN_ERR_ARG); /* during backward */
    CHECK_OK(kiln_dp_finish(dp));
    CHECK_STATUS(kiln_dp_allreduce_sums(dp, &v, 9), KILN_ERR_ARG);
    free(g);
    kiln_dp_free(dp);
    kiln_dp_free(NULL);
    kiln_comm_free(c);
}

/* The queued engine (no thread; the GPU trainer's): the same step, its refusals, and the
 * host communicator for the scalars. */
static void test_queued(void) {
    kiln_comm *c = NULL, *h = NULL;
    CHECK_OK(kiln_comm_init_single(&c));
    CHECK_OK(kiln_comm_init_single(&h));
    for (int zero = 0; zero <= 1; zero++) {
        for (int64_t bucket = 0; bucket <= 300 * 4; bucket += 300 * 4) {
            kiln_dp_config cfg = {.zero = zero, .bucket_bytes = bucket,
                                  .reduce_dtype = KILN_DTYPE_F32};
            kiln_dp *dp = NULL;
            CHECK_OK(kiln_dp_create_queued(&dp, c, h, &cfg, N, LO, HI, K));
            if (!dp)
                continue;
            CHECK_INT_EQ(kiln_dp_num_buckets(dp), (bucket ? 4 : 1));
            float *g = malloc(N * sizeof *g);
            for (int step = 0; step < 2; step++) {
                for (int i = 0; i < N; i++)
                    g[i] = 0.001f * (float)(i - 500 + step);
                CHECK_OK(kiln_dp_begin(dp, g));
                for (int k = 0; k < K; k++)
                    kiln_dp_ready(dp, LO[k], HI[k]);
                CHECK_OK(kiln_dp_finish(dp));
                int same = 1; /* one rank: the sum is the gradient itself */
                for (int i = 0; i < N; i++)
                    same &= g[i] == 0.001f * (float)(i - 500 + step);
                CHECK_TRUE(same);
            }
            double v[2] = {1.5, -2.25};
            CHECK_OK(kiln_dp_allreduce_sums(dp, v, 2));
            CHECK_NEAR(v[0], 1.5, 0.0);
            CHECK_OK(kiln_dp_gather(dp, g, KILN_DTYPE_F32));
            /* what the queued engine does not do */
            CHECK_STATUS(kiln_dp_average(dp, g, N), KILN_ERR_UNSUPPORTED);
            CHECK_STATUS(kiln_dp_rows_reserve(dp, 4, 8, KILN_DTYPE_F32), KILN_ERR_UNSUPPORTED);
            uint64_t ticket = 0;
            CHECK_STATUS(kiln_dp_gather_range_async(dp, g, KILN_DTYPE_F32, 0, 10, &ticket),
                         KILN_ERR_UNSUPPORTED);
            kiln_dp_stats st = kiln_dp_take_stats(dp);
            CHECK_TRUE(st.comm_s >= 0.0 && st.exposed_s >= 0.0 && st.exposed_s <= st.comm_s + 1e-3);
            /* out of order: finish reports it, and the next step runs */
            CHECK_OK(kiln_dp_begin(dp, g));
            kiln_dp_ready(dp, LO[1], HI[1]);
            CHECK_STATUS(kiln_dp_finish(dp), KILN_ERR_ARG);
            CHECK_OK(kiln_dp_begin(dp, g));
            CHECK_OK(kiln_dp_finish(dp));
            free(g);
            kiln_dp_free(dp);
        }
    }
    kiln_dp_config cfg = kiln_dp_config_default();
    kiln_dp *dp = NULL;
    cfg.zero = 2;
    CHECK_STATUS(kiln_dp_create_queued(&dp, c, h, &cfg, N, LO, HI, K), KILN_ERR_UNSUPPORTED);
    cfg.zero = 1;
    cfg.reduce_dtype = KILN_DTYPE_BF16;
    CHECK_STATUS(kiln_dp_create_queued(&dp, c, h, &cfg, N, LO, HI, K), KILN_ERR_UNSUPPORTED);
    CHECK_TRUE(dp == NULL);
    cfg.reduce_dtype = KILN_DTYPE_F32;
    CHECK_OK(kiln_dp_create_queued(&dp, c, NULL, &cfg, N, LO, HI, K)); /* host: comm's */
    kiln_dp_free(dp);
    kiln_comm_free(h);
    kiln_comm_free(c);
}

int main(void) {
    RUN_TEST(test_shards_and_buckets);
    RUN_TEST(test_step);
    RUN_TEST(test_shard_bounds);
    RUN_TEST(test_gather_and_discard);
    RUN_TEST(test_memory_discard);
    RUN_TEST(test_errors);
    RUN_TEST(test_queued);
    TEST_MAIN_END();
}
