/* Resuming on another split (src/train/trainer_elastic.c): the re-cut of old ranks' ranges to a
 * new rank's, the loader position after k batches (against the loader itself, across epochs),
 * and the message for a global batch that differs. */
#include <stdint.h>
#include <stdlib.h>

#include "kiln/dp.h"
#include "kiln/loader.h"
#include "kiln/shard.h"
#include "test.h"
#include "train/trainer_elastic.h"

static char dir[512];

/* Two ZeRO shards [0,50) [50,100) into the whole slab, into a middle range, into nothing. */
static void test_recut_two_into_one(void) {
    int64_t lo[2] = {0, 50}, hi[2] = {50, 100}, gap = -1;
    kiln__recut_piece p[3];
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 2, 0, 100, p, &gap), 2);
    CHECK_INT_EQ(p[0].rank, 0);
    CHECK_INT_EQ(p[0].lo, 0);
    CHECK_INT_EQ(p[0].hi, 50);
    CHECK_INT_EQ(p[1].rank, 1);
    CHECK_INT_EQ(p[1].lo, 50);
    CHECK_INT_EQ(p[1].hi, 100);
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 2, 30, 70, p, &gap), 2);
    CHECK_INT_EQ(p[0].lo, 30);
    CHECK_INT_EQ(p[0].hi, 50);
    CHECK_INT_EQ(p[1].lo, 50);
    CHECK_INT_EQ(p[1].hi, 70);
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 2, 55, 60, p, &gap), 1);
    CHECK_INT_EQ(p[0].rank, 1);
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 2, 60, 60, p, &gap), 0);
}

/* ZeRO 0: every file holds the whole slab; the first (rank 0) gives it all. */
static void test_recut_replicated(void) {
    int64_t lo[3] = {0, 0, 0}, hi[3] = {100, 100, 100}, gap = -1;
    kiln__recut_piece p[4];
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 3, 20, 80, p, &gap), 1);
    CHECK_INT_EQ(p[0].rank, 0);
    CHECK_INT_EQ(p[0].lo, 20);
    CHECK_INT_EQ(p[0].hi, 80);
}

/* Ranges that leave elements out: -1 and the first element missing. */
static void test_recut_gap(void) {
    int64_t lo[2] = {0, 50}, hi[2] = {40, 100}, gap = -1;
    kiln__recut_piece p[3];
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 2, 0, 100, p, &gap), -1);
    CHECK_INT_EQ(gap, 40);
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 2, 45, 60, p, &gap), -1);
    CHECK_INT_EQ(gap, 45);
    CHECK_INT_EQ(kiln__ckpt_recut(lo, hi, 2, 50, 60, p, &gap), 1);
}

/* Every old world's shards to every new world's: the pieces tile each new range in order, each
 * inside its old rank's range, and the values read through them are the slab's. */
static void test_recut_all_worlds(void) {
    enum { MAXW = 7 };
    int bad = 0;
    for (int64_t n = 1; n <= 103; n += 17) {
        float *slab = malloc((size_t)n * sizeof *slab), *got = malloc((size_t)n * sizeof *got);
        for (int64_t i = 0; i < n; i++)
            slab[i] = (float)(i * 3 + 1);
        for (int ow = 1; ow <= MAXW; ow++) {
            int64_t lo[MAXW], hi[MAXW];
            for (int r = 0; r < ow; r++)
                kiln_dp_shard_bounds(n, ow, r, &lo[r], &hi[r]);
            for (int nw = 1; nw <= MAXW; nw++) {
                for (int r = 0; r < nw; r++) {
                    int64_t a, b, gap = -1;
                    kiln_dp_shard_bounds(n, nw, r, &a, &b);
                    kiln__recut_piece p[MAXW + 1];
                    int k = kiln__ckpt_recut(lo, hi, ow, a, b, p, &gap);
                    int64_t at = a;
                    for (int i = 0; i < k; i++) {
                        const kiln__recut_piece *q = &p[i];
                        if (q->lo != at || q->hi <= q->lo || q->lo < lo[q->rank] ||
                            q->hi > hi[q->rank])
                            bad++;
                        /* old rank q->rank's file: its range of the slab, from its own 0 */
                        const float *file = slab + lo[q->rank];
                        for (int64_t e = q->lo; e < q->hi; e++)
                            got[e] = file[e - lo[q->rank]];
                        at = q->hi;
                    }
                    if (k < 0 || at != b || k > ow + 1)
                        bad++;
                    for (int64_t e = a; e < b; e++)
                        if (got[e] != slab[e])
                            bad++;
                }
            }
        }
        free(slab);
        free(got);
    }
    CHECK_INT_EQ(bad, 0);
}

static void test_position_after(void) {
    uint64_t e = 9, p = 9;
    kiln__loader_position_after(0, 10, &e, &p);
    CHECK_INT_EQ(e, 0);
    CHECK_INT_EQ(p, 0);
    kiln__loader_position_after(7, 10, &e, &p);
    CHECK_INT_EQ(e, 0);
    CHECK_INT_EQ(p, 7);
    kiln__loader_position_after(10, 10, &e, &p); /* the epoch's end: the next call begins epoch 1 */
    CHECK_INT_EQ(e, 0);
    CHECK_INT_EQ(p, 10);
    kiln__loader_position_after(11, 10, &e, &p);
    CHECK_INT_EQ(e, 1);
    CHECK_INT_EQ(p, 1);
    kiln__loader_position_after(35, 10, &e, &p);
    CHECK_INT_EQ(e, 3);
    CHECK_INT_EQ(p, 5);
}

static kiln_loader *open_loader(int64_t B, int rank, int world) {
    char p[512];
    test_path(p, sizeof p, dir, "data.bin");
    kiln_loader_config c = {
        .path = p, .B = B, .T = 8, .rank = rank, .world = world, .seed = 7, .shuffle = 1};
    kiln_loader *l = NULL;
    kiln_status s = kiln_loader_open(&l, &c);
    if (s != KILN_OK)
        fprintf(stderr, "open %s: %s\n", p, kiln_error_message());
    return l;
}

/* A checkpoint of 2 ranks of B=5 (a loader batch of 10 windows) at step s, resumed by 1 process
 * of B=5 with 2 micro-batches (a loader batch of 5): 305 windows make epochs of 300 windows
 * (30 batches of 10) and of 305 (61 of 5), so the two cross epochs at different steps. The resumed
 * loader, put at position_after(2 s), reads what the uninterrupted one reads after 2 s batches; and
 * the old loaders' place is k = s batches in, as the resume checks. */
static void test_position_matches_loader(void) {
    int bad = 0;
    /* steps at and around the epochs' ends: 30 and 60 (old), 61 (2 x 61 new batches) */
    static const int64_t steps[] = {1, 15, 29, 30, 31, 60, 61, 62, 95};
    for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
        int64_t s = steps[si];
        kiln_loader *old = open_loader(5, 1, 2), *ref = open_loader(5, 0, 1);
        kiln_loader *res = open_loader(5, 0, 1);
        if (!old || !ref || !res) {
            CHECK_TRUE(0);
            return;
        }
        int32_t in[5 * 8], tg[5 * 8], in2[5 * 8], tg2[5 * 8];
        for (int64_t i = 0; i < s; i++)
            kiln_loader_next(old, in, tg);
        kiln_loader_state os = kiln_loader_get_state(old);
        if ((int64_t)(os.epoch * (uint64_t)kiln_loader_batches_per_epoch(old) + os.position) != s)
            bad++;
        for (int64_t i = 0; i < 2 * s; i++)
            kiln_loader_next(ref, in, tg);
        kiln_loader_state st = kiln_loader_get_state(res);
        kiln__loader_position_after(2 * s, kiln_loader_batches_per_epoch(res), &st.epoch,
                                    &st.position);
        kiln_loader_state rs = kiln_loader_get_state(ref);
        if (st.epoch != rs.epoch || st.position != rs.position)
            bad++;
        CHECK_OK(kiln_loader_set_state(res, &st));
        for (int i = 0; i < 80; i++) {
            kiln_loader_next(ref, in, tg);
            kiln_loader_next(res, in2, tg2);
            if (memcmp(in, in2, sizeof in) || memcmp(tg, tg2, sizeof tg))
                bad++;
        }
        kiln_loader_close(old);
        kiln_loader_close(ref);
        kiln_loader_close(res);
    }
    CHECK_INT_EQ(bad, 0);
}

static void test_batch_advice(void) {
    char m[512];
    kiln__batch_advice(m, sizeof m, 8, 2, 4, 2, 1, 4, 1, 0);
    CHECK_TRUE(strstr(m, "2 ranks of B=4 wrote this checkpoint, 8 sequences a step") != NULL);
    CHECK_TRUE(strstr(m, "with 1 process use --batch 8") != NULL);
    kiln__batch_advice(m, sizeof m, 8, 1, 8, 1, 2, 8, 1, 0);
    CHECK_TRUE(strstr(m, "with 2 ranks use --batch 4") != NULL);
    kiln__batch_advice(m, sizeof m, 8, 1, 8, 1, 2, 8, 2, 0);
    CHECK_TRUE(strstr(m, "with 2 ranks and --grad-accum 2 use --batch 2") != NULL);
    kiln__batch_advice(m, sizeof m, 8, 1, 8, 1, 1, 2, 3, 0);
    CHECK_TRUE(strstr(m, "use --batch 8 --grad-accum 1") != NULL);
    kiln__batch_advice(m, sizeof m, 8, 1, 8, 1, 3, 2, 1, 0);
    CHECK_TRUE(strstr(m, "do not split evenly over 3 ranks") != NULL);
    fprintf(stderr, "  e.g.: %s\n", m);
}

/* Uneven ranks from measured times: inverse proportion, each at least one, the total kept. */
static void test_balance_split(void) {
    int64_t c[4];
    double ms[4] = {10, 30, 10, 10};
    kiln__balance_split(ms, 2, 4, c);
    CHECK_INT_EQ(c[0], 3);
    CHECK_INT_EQ(c[1], 1);
    kiln__balance_split(ms, 4, 8, c);
    CHECK_INT_EQ(c[0] + c[1] + c[2] + c[3], 8);
    CHECK_INT_EQ(c[1], 1);
    CHECK_TRUE(c[0] == 2 || c[0] == 3);
    double even[3] = {5, 5, 5};
    kiln__balance_split(even, 3, 6, c);
    CHECK_TRUE(c[0] == 2 && c[1] == 2 && c[2] == 2);
    double slow[2] = {1, 1000};
    kiln__balance_split(slow, 2, 2, c); /* never below one */
    CHECK_TRUE(c[0] == 1 && c[1] == 1);
}

int main(void) {
    RUN_TEST(test_balance_split);
    test_tmpdir(dir, sizeof dir, "test_elastic");
    char p[512];
    test_path(p, sizeof p, dir, "data.bin");
    enum { TOKENS = 305 * 8 + 1 }; /* 305 windows of T=8 */
    int32_t *ids = malloc(TOKENS * sizeof *ids);
    for (int i = 0; i < TOKENS; i++)
        ids[i] = i % 256;
    CHECK_OK(kiln_shard_write(p, 256, ids, TOKENS));
    free(ids);
    RUN_TEST(test_recut_two_into_one);
    RUN_TEST(test_recut_replicated);
    RUN_TEST(test_recut_gap);
    RUN_TEST(test_recut_all_worlds);
    RUN_TEST(test_position_after);
    RUN_TEST(test_position_matches_loader);
    RUN_TEST(test_batch_advice);
    test_rmtree(dir);
    TEST_MAIN_END();
}
