/* The loader: windows and targets, the per-epoch shuffle, disjoint rank slices, exact
 * resumption from a saved state, shard discovery, and its errors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core.h"
#include "kiln/loader.h"
#include "kiln/shard.h"
#include "test.h"

static char dir[256];

/* Shard k holds n ids base, base+1, ...: a window is named by its first id. */
static void write_counting_shard(const char *name, int64_t base, int64_t n, int64_t vocab) {
    char p[512];
    test_path(p, sizeof p, dir, name);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)((base + i) % vocab);
    kiln_status s = kiln_shard_write(p, vocab, ids, n);
    if (s != KILN_OK)
        fprintf(stderr, "writing %s: %s\n", p, kiln_error_message());
    free(ids);
}

static kiln_loader *open_loader(const char *pattern, int64_t B, int64_t T, int rank, int world,
                                uint64_t seed, int shuffle) {
    char p[512];
    test_path(p, sizeof p, dir, pattern);
    kiln_loader_config c = {p, B, T, rank, world, seed, shuffle};
    kiln_loader *l = NULL;
    kiln_status s = kiln_loader_open(&l, &c);
    if (s != KILN_OK)
        fprintf(stderr, "open %s: %s: %s\n", p, kiln_status_str(s), kiln_error_message());
    return l;
}

/* Shards a (1000 tokens) and b (601 tokens) with T=10: 99 + 60 windows. */
static void test_windows_in_file_order(void) {
    kiln_loader *l = open_loader("ab_*.bin", 3, 10, 0, 1, 1, 0);
    CHECK_TRUE(l != NULL);
    if (!l)
        return;
    CHECK_INT_EQ(kiln_loader_vocab_size(l), 65536);
    CHECK_INT_EQ(kiln_loader_num_tokens(l), 1601);
    CHECK_INT_EQ(kiln_loader_num_windows(l), 99 + 60);
    CHECK_INT_EQ(kiln_loader_batches_per_epoch(l), 53);
    int32_t in[30], tg[30];
    int ok = 1;
    for (int j = 0; j < 53; j++) {
        CHECK_OK(kiln_loader_next(l, in, tg));
        for (int b = 0; b < 3; b++) {
            int64_t w = j * 3 + b;
            int64_t first = w < 99 ? w * 10 : 20000 + (w - 99) * 10;
            for (int t = 0; t < 10; t++)
                ok &= in[b * 10 + t] == first + t && tg[b * 10 + t] == first + t + 1;
        }
    }
    CHECK_TRUE(ok);
    kiln_loader_state st = kiln_loader_get_state(l);
    CHECK_INT_EQ(st.epoch, 0);
    CHECK_INT_EQ(st.position, 53);
    CHECK_OK(kiln_loader_next(l, in, tg)); /* wraps */
    st = kiln_loader_get_state(l);
    CHECK_INT_EQ(st.epoch, 1);
    CHECK_INT_EQ(st.position, 1);
    CHECK_INT_EQ(in[0], 0);
    kiln_loader_close(l);
}

/* Collect each window's first id for a whole epoch. */
static void epoch_starts(kiln_loader *l, int64_t B, int64_t T, int32_t *out) {
    int64_t nb = kiln_loader_batches_per_epoch(l);
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    for (int64_t j = 0; j < nb; j++) {
        kiln_loader_next(l, in, tg);
        for (int64_t b = 0; b < B; b++)
            out[j * B + b] = in[b * T];
    }
    free(in);
    free(tg);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_shuffle_is_a_seeded_permutation(void) {
    kiln_loader *l = open_loader("ab_*.bin", 4, 10, 0, 1, 42, 1);
    kiln_loader *same = open_loader("ab_*.bin", 4, 10, 0, 1, 42, 1);
    kiln_loader *other = open_loader("ab_*.bin", 4, 10, 0, 1, 43, 1);
    CHECK_TRUE(l && same && other);
    if (!l || !same || !other)
        return;
    int64_t n = kiln_loader_batches_per_epoch(l) * 4; /* 156 of 159 windows */
    int32_t *e0 = malloc((size_t)n * 4), *e1 = malloc((size_t)n * 4);
    int32_t *s0 = malloc((size_t)n * 4), *o0 = malloc((size_t)n * 4);
    epoch_starts(l, 4, 10, e0);
    epoch_starts(l, 4, 10, e1);
    epoch_starts(same, 4, 10, s0);
    epoch_starts(other, 4, 10, o0);
    CHECK_TRUE(memcmp(e0, s0, (size_t)n * 4) == 0);
    CHECK_TRUE(memcmp(e0, e1, (size_t)n * 4) != 0);
    CHECK_TRUE(memcmp(e0, o0, (size_t)n * 4) != 0);
    qsort(e0, (size_t)n, 4, cmp_i32);
    int distinct = 1, aligned = 1;
    for (int64_t i = 0; i < n; i++) {
        distinct &= i == 0 || e0[i] != e0[i - 1];
        aligned &= e0[i] % 10 == 0;
    }
    CHECK_TRUE(distinct);
    CHECK_TRUE(aligned);
    free(e0);
    free(e1);
    free(s0);
    free(o0);
    kiln_loader_close(l);
    kiln_loader_close(same);
    kiln_loader_close(other);
}

/* With B=1 an epoch visits every window once; over many epochs every window is equally
 * likely at every place (within 5 standard deviations). */
static void test_shuffle_covers_and_spreads(void) {
    static const int sizes[] = {1, 2, 3, 5, 8, 17, 64, 100, 1000};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int W = sizes[k];
        char name[64];
        snprintf(name, sizeof name, "perm_%d.bin", W);
        write_counting_shard(name, 0, 4 * W + 1, 65536);
        kiln_loader *l = open_loader(name, 1, 4, 0, 1, 77, 1);
        CHECK_TRUE(l != NULL);
        if (!l)
            continue;
        CHECK_INT_EQ(kiln_loader_batches_per_epoch(l), W);
        int epochs = W <= 8 ? 4000 : 3, ok = 1;
        int *seen = calloc((size_t)W, sizeof *seen);
        int count[8][8] = {{0}}; /* [window][place] */
        for (int e = 0; e < epochs; e++) {
            int32_t in[4], tg[4];
            memset(seen, 0, (size_t)W * sizeof *seen);
            for (int j = 0; j < W; j++) {
                kiln_loader_next(l, in, tg);
                int w = in[0] / 4;
                ok &= w >= 0 && w < W && !seen[w];
                if (w >= 0 && w < W) {
                    seen[w] = 1;
                    if (W <= 8)
                        count[w][j]++;
                }
            }
        }
        CHECK_TRUE(ok);
        if (W > 1 && W <= 8) {
            double p = 1.0 / W, mean = epochs * p, sd = sqrt(epochs * p * (1 - p));
            int spread = 1;
            for (int w = 0; w < W; w++)
                for (int j = 0; j < W; j++)
                    spread &= fabs(count[w][j] - mean) < 5 * sd;
            CHECK_TRUE(spread);
        }
        free(seen);
        kiln_loader_close(l);
    }
}

/* Three ranks with B=2 see disjoint windows whose union is one process's B=6 batches. */
static void test_ranks_are_disjoint_slices(void) {
    kiln_loader *one = open_loader("ab_*.bin", 6, 10, 0, 1, 7, 1);
    kiln_loader *r[3];
    for (int k = 0; k < 3; k++)
        r[k] = open_loader("ab_*.bin", 2, 10, k, 3, 7, 1);
    CHECK_TRUE(one && r[0] && r[1] && r[2]);
    if (!one || !r[0] || !r[1] || !r[2])
        return;
    CHECK_INT_EQ(kiln_loader_batches_per_epoch(r[1]), kiln_loader_batches_per_epoch(one));
    int32_t in[60], tg[60], rin[20], rtg[20];
    int ok = 1;
    for (int step = 0; step < 2 * kiln_loader_batches_per_epoch(one) + 3; step++) {
        kiln_loader_next(one, in, tg);
        for (int k = 0; k < 3; k++) {
            kiln_loader_next(r[k], rin, rtg);
            ok &= memcmp(rin, in + k * 20, sizeof rin) == 0;
            ok &= memcmp(rtg, tg + k * 20, sizeof rtg) == 0;
        }
        for (int a = 0; a < 6; a++)
            for (int b = a + 1; b < 6; b++)
                ok &= in[a * 10] != in[b * 10];
    }
    CHECK_TRUE(ok);
    kiln_loader_close(one);
    for (int k = 0; k < 3; k++)
        kiln_loader_close(r[k]);
}

/* Take k batches, save, take m more; a fresh loader restored from the save gives the same m,
 * across an epoch boundary too. */
static void check_resume(int shuffle, int k, int m) {
    kiln_loader *a = open_loader("ab_*.bin", 4, 10, 1, 2, 99, shuffle);
    kiln_loader *b = open_loader("ab_*.bin", 4, 10, 1, 2, 12345, shuffle); /* seed from state */
    CHECK_TRUE(a && b);
    if (!a || !b)
        return;
    int32_t in[40], tg[40];
    for (int i = 0; i < k; i++)
        kiln_loader_next(a, in, tg);
    kiln_loader_state saved = kiln_loader_get_state(a);
    int32_t *want = malloc((size_t)m * 80 * sizeof *want);
    for (int i = 0; i < m; i++)
        kiln_loader_next(a, want + i * 80, want + i * 80 + 40);
    CHECK_OK(kiln_loader_set_state(b, &saved));
    int ok = 1;
    for (int i = 0; i < m; i++) {
        kiln_loader_next(b, in, tg);
        ok &= memcmp(in, want + i * 80, sizeof in) == 0 &&
              memcmp(tg, want + i * 80 + 40, sizeof tg) == 0;
    }
    CHECK_TRUE(ok);
    kiln_loader_state end_a = kiln_loader_get_state(a), end_b = kiln_loader_get_state(b);
    CHECK_TRUE(memcmp(&end_a, &end_b, sizeof end_a) == 0);
    free(want);
    kiln_loader_close(a);
    kiln_loader_close(b);
}

static void test_resume_is_exact(void) {
    CHECK_INT_EQ(0, 0);
    check_resume(1, 5, 7);
    check_resume(1, 19, 10); /* 19 batches per epoch: restores at the boundary */
    check_resume(1, 30, 25);
    check_resume(0, 12, 30);
    check_resume(1, 0, 3);
}

static void test_discovery_and_width4(void) {
    kiln_loader *l = open_loader("w4", 2, 16, 0, 1, 3, 1); /* a folder: every *.bin */
    CHECK_TRUE(l != NULL);
    if (l) {
        CHECK_INT_EQ(kiln_loader_vocab_size(l), 100000);
        CHECK_INT_EQ(kiln_loader_num_tokens(l), 600);
        int32_t in[32], tg[32];
        CHECK_OK(kiln_loader_next(l, in, tg));
        int ok = 1;
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < 16; t++)
                ok &= tg[b * 16 + t] == (in[b * 16 + t] + 1) % 100000 &&
                      in[b * 16] % 16 == 99984 % 16;
        CHECK_TRUE(ok);
        kiln_loader_close(l);
    }
    l = open_loader("w4/one.bin", 2, 16, 0, 1, 3, 0); /* a single file */
    CHECK_TRUE(l != NULL);
    if (l)
        CHECK_INT_EQ(kiln_loader_num_tokens(l), 300);
    kiln_loader_close(l);
}

static void expect_open_error(const char *pattern, int64_t B, int64_t T, int rank, int world,
                              kiln_status want, const char *needle) {
    char p[512];
    test_path(p, sizeof p, dir, pattern);
    kiln_loader_config c = {p, B, T, rank, world, 1, 1};
    kiln_loader *l = NULL;
    CHECK_STATUS(kiln_loader_open(&l, &c), want);
    CHECK_TRUE(l == NULL);
    if (needle && !strstr(kiln_error_message(), needle)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", kiln_error_message(), needle);
        CHECK_TRUE(0);
    }
}

static void test_errors(void) {
    expect_open_error("short_*.bin", 1, 64, 0, 1, KILN_ERR_CONFIG, "fewer than one window");
    expect_open_error("short_*.bin", 1, 64, 0, 1, KILN_ERR_CONFIG, "short_a.bin holds 50 tokens");
    expect_open_error("mixed_*.bin", 1, 8, 0, 1, KILN_ERR_FORMAT, "vocabulary size");
    expect_open_error("nothing_*.bin", 1, 8, 0, 1, KILN_ERR_NOT_FOUND, "no shards match");
    expect_open_error("absent.bin", 1, 8, 0, 1, KILN_ERR_NOT_FOUND, "absent.bin");
    expect_open_error("ab_*.bin", 200, 10, 0, 1, KILN_ERR_CONFIG, "fewer than one batch");
    expect_open_error("ab_*.bin", 1, 10, 2, 2, KILN_ERR_ARG, "rank 2");
    expect_open_error("ab_*.bin", 0, 10, 0, 1, KILN_ERR_ARG, "B=0");
    kiln_loader *l = open_loader("ab_*.bin", 4, 10, 0, 1, 1, 1);
    if (l) {
        kiln_loader_state s = {0, 1000, 1};
        CHECK_STATUS(kiln_loader_set_state(l, &s), KILN_ERR_RANGE);
    }
    kiln_loader_close(l);
    kiln_loader_close(NULL);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "test_loader");
    write_counting_shard("ab_a.bin", 0, 1000, 65536);
    write_counting_shard("ab_b.bin", 20000, 601, 65536);
    write_counting_shard("short_a.bin", 0, 50, 256);
    write_counting_shard("mixed_a.bin", 0, 50, 256);
    write_counting_shard("mixed_b.bin", 0, 50, 50257);
    char p[512];
    test_path(p, sizeof p, dir, "w4");
    mkdir(p, 0755);
    write_counting_shard("w4/one.bin", 99984, 300, 100000);
    write_counting_shard("w4/two.bin", 99984, 300, 100000);
    write_counting_shard("w4/notes.txt", 0, 10, 256); /* not *.bin: ignored in a folder */
    RUN_TEST(test_windows_in_file_order);
    RUN_TEST(test_shuffle_is_a_seeded_permutation);
    RUN_TEST(test_shuffle_covers_and_spreads);
    RUN_TEST(test_ranks_are_disjoint_slices);
    RUN_TEST(test_resume_is_exact);
    RUN_TEST(test_discovery_and_width4);
    RUN_TEST(test_errors);
    test_rmtree(dir);
    TEST_MAIN_END();
}
