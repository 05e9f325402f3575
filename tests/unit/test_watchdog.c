/* The watchdog's judgements (src/train/watchdog_stats.c): medians over a window, the hang and
 * warning limits against the median step, and the straggler among ranks; and a hang in a real
 * run, which the library reports (a status, the on_hang callback) and never ends the process
 * for. */
#include <math.h>
#include <string.h>

#include "kiln/shard.h"
#include "kiln/train.h"
#include "test.h"
#include "train/trainer_fault.h"
#include "train/watchdog.h"

static void test_median(void) {
    double odd[] = {5, 1, 3}, even[] = {4, 1, 3, 2}, one[] = {7};
    CHECK_NEAR(kiln__median(odd, 3), 3.0, 0);
    CHECK_NEAR(kiln__median(even, 4), 2.5, 0);
    CHECK_NEAR(kiln__median(one, 1), 7.0, 0);
    CHECK_TRUE(isnan(kiln__median(one, 0)));
    CHECK_NEAR(odd[0], 5.0, 0); /* left as it was */
}

static void test_window(void) {
    kiln__window w;
    kiln__window_init(&w, 3);
    CHECK_TRUE(isnan(kiln__window_median(&w)));
    kiln__window_push(&w, 10);
    kiln__window_push(&w, 30);
    CHECK_INT_EQ(w.n, 2);
    CHECK_NEAR(kiln__window_median(&w), 20.0, 0);
    kiln__window_push(&w, 20);
    kiln__window_push(&w, 1000); /* 10 leaves: {30, 20, 1000} */
    kiln__window_push(&w, 1000); /* 30 leaves: {20, 1000, 1000} */
    CHECK_INT_EQ(w.n, 3);
    CHECK_NEAR(kiln__window_median(&w), 1000.0, 0);
    kiln__window_init(&w, 1 << 20); /* at most the largest window */
    CHECK_INT_EQ(w.cap, KILN__WD_MAX_WINDOW);
}

static void test_hang_limits(void) {
    kiln_watchdog_config c = kiln_train_config_default().watchdog;
    CHECK_INT_EQ(c.enabled, 1);
    double warn = 0, hang = 0;
    /* before three steps are timed: only the minimum, and no warning (a first step's
     * warm-up is never a hang) */
    CHECK_INT_EQ(kiln__hang_judge(&c, 299.0, 1.0, 2, &warn, &hang), KILN__HANG_OK);
    CHECK_TRUE(isinf(warn));
    CHECK_NEAR(hang, 300.0, 0);
    CHECK_INT_EQ(kiln__hang_judge(&c, 300.0, NAN, 0, NULL, NULL), KILN__HANG_HUNG);
    /* short steps: the floors (10 s to warn, 300 s to end), not 5x and 20x of 100 ms */
    CHECK_INT_EQ(kiln__hang_judge(&c, 9.0, 100.0, 20, &warn, &hang), KILN__HANG_OK);
    CHECK_NEAR(warn, 10.0, 1e-12);
    CHECK_NEAR(hang, 300.0, 0);
    CHECK_INT_EQ(kiln__hang_judge(&c, 11.0, 100.0, 20, NULL, NULL), KILN__HANG_SLOW);
    CHECK_INT_EQ(kiln__hang_judge(&c, 301.0, 100.0, 20, NULL, NULL), KILN__HANG_HUNG);
    /* long steps: the factors (a 60 s step warns at 300 s, ends at 1200 s) */
    CHECK_INT_EQ(kiln__hang_judge(&c, 299.0, 60e3, 20, &warn, &hang), KILN__HANG_OK);
    CHECK_NEAR(warn, 300.0, 1e-9);
    CHECK_NEAR(hang, 1200.0, 1e-9);
    CHECK_INT_EQ(kiln__hang_judge(&c, 1199.0, 60e3, 20, NULL, NULL), KILN__HANG_SLOW);
    CHECK_INT_EQ(kiln__hang_judge(&c, 1200.0, 60e3, 20, NULL, NULL), KILN__HANG_HUNG);
    /* a small minimum (tests): the warning floor is a quarter of it */
    c.hang_min_s = 2.0;
    CHECK_INT_EQ(kiln__hang_judge(&c, 0.4, 1.0, 5, &warn, &hang), KILN__HANG_OK);
    CHECK_NEAR(warn, 0.5, 1e-12);
    CHECK_INT_EQ(kiln__hang_judge(&c, 0.6, 1.0, 5, NULL, NULL), KILN__HANG_SLOW);
    CHECK_INT_EQ(kiln__hang_judge(&c, 2.0, 1.0, 5, NULL, NULL), KILN__HANG_HUNG);
}

/* rows x world, row-major */
static void fill(float *t, int rows, int world, const float *per_rank) {
    for (int i = 0; i < rows; i++)
        for (int r = 0; r < world; r++)
            t[i * world + r] = per_rank[r];
}

static void test_straggler(void) {
    float t[10 * 4];
    double ratio = -1;
    /* two ranks: rank 1 at 2x rank 0 */
    fill(t, 10, 2, (const float[]){10, 20});
    CHECK_INT_EQ(kiln__straggler_find(t, 10, 2, 1.3, &ratio), 1);
    CHECK_NEAR(ratio, 2.0, 1e-12);
    /* under the factor: none, but the ratio is told */
    fill(t, 10, 2, (const float[]){10, 12});
    CHECK_INT_EQ(kiln__straggler_find(t, 10, 2, 1.3, &ratio), -1);
    CHECK_NEAR(ratio, 1.2, 1e-6);
    /* four ranks, rank 2 slow: against the median of the other three */
    fill(t, 10, 4, (const float[]){10, 11, 16, 9});
    CHECK_INT_EQ(kiln__straggler_find(t, 10, 4, 1.3, &ratio), 2);
    CHECK_NEAR(ratio, 1.6, 1e-6);
    /* one slow step in ten is no straggler: the median looks past it */
    fill(t, 10, 2, (const float[]){10, 10});
    t[3 * 2 + 1] = 500;
    CHECK_INT_EQ(kiln__straggler_find(t, 10, 2, 1.3, NULL), -1);
    /* slow in most of the window is */
    for (int i = 0; i < 6; i++)
        t[i * 2 + 1] = 30;
    CHECK_INT_EQ(kiln__straggler_find(t, 10, 2, 1.3, &ratio), 1);
    CHECK_NEAR(ratio, 3.0, 1e-6);
    /* nothing to compare: one rank, no rows, others at ~0 ms */
    CHECK_INT_EQ(kiln__straggler_find(t, 10, 1, 1.3, &ratio), -1);
    CHECK_NEAR(ratio, 0.0, 0);
    CHECK_INT_EQ(kiln__straggler_find(t, 0, 2, 1.3, NULL), -1);
    fill(t, 10, 2, (const float[]){0, 5});
    CHECK_INT_EQ(kiln__straggler_find(t, 10, 2, 1.3, &ratio), -1);
}

static char dir[256], shard_path[300];

static void make_data(void) {
    test_tmpdir(dir, sizeof dir, "test_watchdog");
    test_path(shard_path, sizeof shard_path, dir, "train_000.bin");
    int32_t ids[2000];
    for (int i = 0; i < 2000; i++)
        ids[i] = (int32_t)((i * 7 + (i / 13)) % 50);
    CHECK_OK(kiln_shard_write(shard_path, 50, ids, 2000));
}

/* A tiny run whose rank 0 hangs inside step 2, and a watchdog that calls 1 s without
 * progress a hang (the limit before any median counts). */
static kiln_train_config hanging_run(void) {
    kiln_train_config c = kiln_train_config_default();
    c.model = (kiln_gpt_config){.max_seq_len = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
    c.data.train_path = shard_path;
    c.data.B = 2;
    c.data.T = 16;
    c.steps = 5;
    c.compute.peak_gflops = 100.0;
    c.watchdog.hang_min_s = 1.0;
    kiln__trainer_fault_set(&(kiln__trainer_faults){.hang_step = 2, .hang_rank = 0});
    return c;
}

/* No handler: the hang is reported as the step's status, and this process goes on. */
static void test_hang_without_handler(void) {
    kiln_train_config c = hanging_run();
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_create(&t, &c));
    if (!t)
        return;
    CHECK_OK(kiln_trainer_step(t, NULL));
    CHECK_INT_EQ(kiln_trainer_watchdog_exit(t), 0);
    CHECK_STATUS(kiln_trainer_step(t, NULL), KILN_ERR_HUNG);
    CHECK_TRUE(strstr(kiln_error_message(), "rank 0: no progress for") != NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "in step 2") != NULL);
    CHECK_INT_EQ(kiln_trainer_watchdog_exit(t), KILN_EXIT_HUNG);
    CHECK_INT_EQ(kiln_trainer_steps_done(t), 1);
    CHECK_STATUS(kiln_trainer_step(t, NULL), KILN_ERR_HUNG); /* a hung run takes no more */
    kiln_trainer_free(t);
    kiln__trainer_fault_set(NULL);
}

static int hang_calls;
static kiln_watchdog_hang hang_seen;
static char hang_text[512];

static void record_hang(const kiln_watchdog_hang *h, void *user) {
    hang_calls += user == (void *)&hang_calls;
    hang_seen = *h;
    snprintf(hang_text, sizeof hang_text, "%s", h->message);
}

/* A registered handler is called once, on the hang, with where and how long; when it
 * returns, the step still fails. */
static void test_hang_handler_called(void) {
    kiln_train_config c = hanging_run();
    c.watchdog.on_hang = record_hang;
    c.watchdog.on_hang_user = &hang_calls;
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_create(&t, &c));
    if (!t)
        return;
    CHECK_OK(kiln_trainer_step(t, NULL));
    CHECK_INT_EQ(hang_calls, 0);
    CHECK_STATUS(kiln_trainer_step(t, NULL), KILN_ERR_HUNG);
    CHECK_INT_EQ(hang_calls, 1);
    CHECK_INT_EQ(hang_seen.rank, 0);
    CHECK_INT_EQ(hang_seen.step, 2);
    CHECK_TRUE(hang_seen.stalled_s >= 1.0);
    CHECK_NEAR(hang_seen.limit_s, 1.0, 1e-9);
    CHECK_TRUE(strstr(hang_text, "kiln: watchdog: rank 0: no progress for") == hang_text);
    CHECK_TRUE(strstr(hang_text, "): hung") != NULL);
    kiln_trainer_free(t);
    kiln__trainer_fault_set(NULL);
    CHECK_INT_EQ(hang_calls, 1);
}

int main(void) {
    make_data();
    RUN_TEST(test_median);
    RUN_TEST(test_window);
    RUN_TEST(test_hang_limits);
    RUN_TEST(test_straggler);
    RUN_TEST(test_hang_without_handler);
    RUN_TEST(test_hang_handler_called);
    test_rmtree(dir);
    TEST_MAIN_END();
}
