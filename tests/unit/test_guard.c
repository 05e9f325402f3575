/* Stability guards' bookkeeping (src/train/guard.c) on made-up series, and the metrics log
 * that keeps lines a full disk would not take (src/train/metrics.c). */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "train/guard.h"
#include "train/metrics.h"

/* A loss falling from 6 with noise of +-1%, a norm around 2 with +-20%: steady training. */
static double loss_at(int64_t i) { return 6.0 - 0.002 * (double)i + 0.06 * sin(1.7 * (double)i); }
static double norm_at(int64_t i) { return 2.0 * (1.0 + 0.2 * sin(2.3 * (double)i)); }

static void feed(kiln_guard *g, int64_t from, int64_t to) {
    double r;
    for (int64_t i = from; i < to; i++)
        kiln__guard_record(g, i, KILN_GUARD_OK, loss_at(i), norm_at(i), 0.0, &r);
}

static void test_verdicts(void) {
    kiln_guard g;
    double z = 0.0;
    CHECK_OK(kiln__guard_init(&g, 50, 6.0));
    CHECK_INT_EQ(kiln__guard_check(&g, NAN, 1.0, &z), KILN_GUARD_NONFINITE_LOSS);
    CHECK_INT_EQ(kiln__guard_check(&g, 1.0, INFINITY, &z), KILN_GUARD_NONFINITE_GRAD);
    /* too little history: even a huge loss is not a spike yet */
    feed(&g, 1, 20);
    CHECK_INT_EQ(kiln__guard_check(&g, 60.0, 2.0, &z), KILN_GUARD_OK);
    CHECK_INT_EQ(z, 0);
    feed(&g, 20, 120);
    int spikes = 0;
    for (int64_t i = 120; i < 400; i++) { /* the series itself never spikes */
        spikes += kiln__guard_check(&g, loss_at(i), norm_at(i), &z) != KILN_GUARD_OK;
        feed(&g, i, i + 1);
    }
    CHECK_INT_EQ(spikes, 0);
    CHECK_INT_EQ(kiln__guard_check(&g, loss_at(400) * 1.5, norm_at(400), &z), KILN_GUARD_LOSS_SPIKE);
    CHECK_TRUE(z > 6.0);
    CHECK_INT_EQ(kiln__guard_check(&g, loss_at(400), 40.0, &z), KILN_GUARD_NORM_SPIKE);
    /* a smaller bump stays below the threshold: the deviation's floor (2% of the loss) */
    CHECK_INT_EQ(kiln__guard_check(&g, loss_at(400) * 1.05, norm_at(400), &z), KILN_GUARD_OK);
    /* z 0: spikes are not judged; non-finite values still are */
    kiln_guard off;
    CHECK_OK(kiln__guard_init(&off, 50, 0.0));
    feed(&off, 1, 100);
    CHECK_INT_EQ(kiln__guard_check(&off, 1e6, 1e6, &z), KILN_GUARD_OK);
    CHECK_INT_EQ(kiln__guard_check(&off, NAN, 1.0, &z), KILN_GUARD_NONFINITE_LOSS);
    CHECK_STR_EQ(kiln__guard_verdict_name(KILN_GUARD_LOSS_SPIKE), "loss_spike");
    kiln__guard_free(&off);
    CHECK_STATUS(kiln__guard_init(&off, -1, 1.0), KILN_ERR_CONFIG);
    kiln__guard_free(&g);
}

/* The ceiling: a loss above it for KILN_GUARD_CEILING_RUN steps in a row is bad from the
 * first steps on, before any history; fewer in a row (an early spike) are not; a step below it
 * starts the count again; a rollback's reset too. */
static void test_ceiling(void) {
    kiln_guard g;
    double z = 0.0, r = 0.0;
    CHECK_OK(kiln__guard_init(&g, 50, 6.0));
    g.ceiling = 6.0; /* a first loss of 5, a margin of 1 nat */
    for (int round = 0; round < 2; round++) {
        for (int k = 1; k < KILN_GUARD_CEILING_RUN; k++) { /* a spike of a step or two: trains */
            CHECK_INT_EQ(kiln__guard_check(&g, 8.0, 2.0, &z), KILN_GUARD_OK);
            kiln__guard_record(&g, k, KILN_GUARD_OK, 8.0, 2.0, 0.0, &r);
        }
        if (round == 0) { /* back below: the count starts again */
            CHECK_INT_EQ(kiln__guard_check(&g, 4.0, 2.0, &z), KILN_GUARD_OK);
            kiln__guard_record(&g, 3, KILN_GUARD_OK, 4.0, 2.0, 0.0, &r);
        }
    }
    CHECK_INT_EQ(kiln__guard_check(&g, 8.0, 2.0, &z), KILN_GUARD_LOSS_CEILING);
    CHECK_INT_EQ(kiln__guard_check(&g, 5.9, 2.0, &z), KILN_GUARD_OK); /* below it: fine */
    CHECK_STR_EQ(kiln__guard_verdict_name(KILN_GUARD_LOSS_CEILING), "loss_above_start");
    kiln__guard_record(&g, 9, KILN_GUARD_LOSS_CEILING, 8.0, 2.0, 0.0, &r);
    CHECK_INT_EQ(kiln__guard_check(&g, 8.0, 2.0, &z), KILN_GUARD_LOSS_CEILING); /* it stays */
    kiln__guard_reset(&g);
    CHECK_INT_EQ(kiln__guard_check(&g, 8.0, 2.0, &z), KILN_GUARD_OK);
    g.ceiling = 0.0; /* off: never */
    for (int k = 0; k < 5; k++)
        kiln__guard_record(&g, 20 + k, KILN_GUARD_OK, 80.0, 2.0, 0.0, &r);
    CHECK_INT_EQ(kiln__guard_check(&g, 80.0, 2.0, &z), KILN_GUARD_OK);
    kiln__guard_free(&g);
}

static void test_warnings(void) {
    kiln_guard g;
    double r = 0.0;
    CHECK_OK(kiln__guard_init(&g, 20, 6.0));
    /* the gradient norm doubling within the window */
    int warn = 0;
    for (int64_t i = 1; i <= 40 && !warn; i++)
        warn = kiln__guard_record(&g, i, KILN_GUARD_OK, 3.0, i <= 20 ? 1.0 : 2.5, 0.0, &r);
    CHECK_INT_EQ(warn, KILN_GUARD_WARN_NORM_GROWTH);
    CHECK_TRUE(r >= 2.0);
    /* given once a window, not every step */
    CHECK_INT_EQ(kiln__guard_record(&g, 41, KILN_GUARD_OK, 3.0, 2.5, 0.0, &r) & KILN_GUARD_WARN_NORM_GROWTH, 0);
    kiln__guard_reset(&g);
    /* three spikes within a window */
    feed(&g, 1, 30);
    CHECK_INT_EQ(kiln__guard_record(&g, 30, KILN_GUARD_LOSS_SPIKE, 9, 9, 0, &r) & KILN_GUARD_WARN_SPIKE_RATE, 0);
    CHECK_INT_EQ(kiln__guard_record(&g, 35, KILN_GUARD_LOSS_SPIKE, 9, 9, 0, &r) & KILN_GUARD_WARN_SPIKE_RATE, 0);
    CHECK_TRUE(kiln__guard_record(&g, 40, KILN_GUARD_NORM_SPIKE, 9, 9, 0, &r) & KILN_GUARD_WARN_SPIKE_RATE);
    CHECK_INT_EQ(r, 3);
    kiln__guard_reset(&g);
    /* the loss rising 10% */
    warn = 0;
    for (int64_t i = 1; i <= 60 && !(warn & KILN_GUARD_WARN_LOSS_RISE); i++)
        warn = kiln__guard_record(&g, 100 + i, KILN_GUARD_OK, i <= 10 ? 3.0 : 3.3, 1.0, 0.0, &r);
    CHECK_TRUE(warn & KILN_GUARD_WARN_LOSS_RISE);
    kiln__guard_reset(&g);
    /* fp16's loss scale falling 2^8-fold */
    warn = 0;
    double scale = 65536.0;
    for (int64_t i = 1; i <= 10; i++, scale /= 2)
        warn |= kiln__guard_record(&g, 200 + i, KILN_GUARD_OK, 3.0, 1.0, scale, &r);
    CHECK_TRUE(warn & KILN_GUARD_WARN_SCALE_FALL);
    /* a steady series warns of nothing */
    kiln__guard_reset(&g);
    warn = 0;
    for (int64_t i = 1; i < 300; i++)
        warn |= kiln__guard_record(&g, 1000 + i, KILN_GUARD_OK, loss_at(i), norm_at(i), 1024.0, &r);
    CHECK_INT_EQ(warn, 0);
    kiln__guard_free(&g);
}

/* A full disk for a while: the file holds whole lines only, the kept lines follow when it
 * takes them again, in order. */
static void test_metrics_kept(void) {
    char path[] = "/tmp/kiln_test_metricsXXXXXX";
    int fd = mkstemp(path);
    CHECK_TRUE(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    kiln__metrics *m = NULL;
    CHECK_OK(kiln__metrics_open(&m, path, 0));
    if (!m)
        return;
    kiln__metrics_line(m, "{\"step\": 1}", NULL);
    kiln__metrics_fail_writes(m, 2); /* the first failure writes half a line first */
    kiln__metrics_line(m, "{\"step\": 2, \"loss\": 3.5}", NULL);
    CHECK_INT_EQ(kiln__metrics_pending(m), 1);
    kiln__metrics_line(m, "{\"step\": 3}", NULL);
    CHECK_INT_EQ(kiln__metrics_pending(m), 2);
    char buf[256] = {0};
    fd = open(path, O_RDONLY);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    CHECK_STR_EQ(n > 0 ? buf : "", "{\"step\": 1}\n"); /* the half line is cut away */
    kiln__metrics_line(m, "{\"step\": 4}", NULL);
    CHECK_INT_EQ(kiln__metrics_pending(m), 0);
    kiln__metrics_close(m, NULL);
    memset(buf, 0, sizeof buf);
    fd = open(path, O_RDONLY);
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    CHECK_STR_EQ(n > 0 ? buf : "",
                 "{\"step\": 1}\n{\"step\": 2, \"loss\": 3.5}\n{\"step\": 3}\n{\"step\": 4}\n");
    /* appending (a resumed run) keeps what is there */
    CHECK_OK(kiln__metrics_open(&m, path, 1));
    kiln__metrics_line(m, "{\"step\": 5}", NULL);
    kiln__metrics_close(m, NULL);
    fd = open(path, O_RDONLY);
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    CHECK_TRUE(n > 0 && strstr(buf, "{\"step\": 4}\n{\"step\": 5}\n") != NULL);
    unlink(path);
    kiln__metrics_close(NULL, NULL);
}

int main(void) {
    RUN_TEST(test_verdicts);
    RUN_TEST(test_ceiling);
    RUN_TEST(test_warnings);
    RUN_TEST(test_metrics_kept);
    TEST_MAIN_END();
}
