/* Core: status strings, error messages, the counting allocator, the RNG, the readers and
 * writers of users' files. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/core.h"
#include "test.h"

static void test_status_strings(void) {
    CHECK_STR_EQ(kiln_status_str(KILN_OK), "ok");
    CHECK_STR_EQ(kiln_status_str(KILN_ERR_NOMEM), "out of memory");
    kiln_status s = kiln_error_setf(KILN_ERR_FORMAT, "file %s at offset %d", "x.bin", 12);
    CHECK_INT_EQ(s, KILN_ERR_FORMAT);
    CHECK_STR_EQ(kiln_error_message(), "file x.bin at offset 12");
    kiln_error_wrapf(s, "loading %s", "model");
    CHECK_STR_EQ(kiln_error_message(), "loading model: file x.bin at offset 12");
    kiln_error_clear();
    CHECK_STR_EQ(kiln_error_message(), "");
}

static void test_alloc_counts_and_limits(void) {
    size_t before = kiln_alloc_current();
    float *p = kiln_alloc(1000 * sizeof(float));
    CHECK_TRUE(p != NULL);
    CHECK_INT_EQ(((uintptr_t)p) % 64, 0);
    CHECK_INT_EQ(kiln_alloc_current() - before, 4000);
    int zero = 1;
    for (int i = 0; i < 1000; i++)
        zero &= p[i] == 0.0f;
    CHECK_TRUE(zero);
    CHECK_TRUE(kiln_alloc_peak() >= before + 4000);
    kiln_free(p);
    kiln_free(NULL);
    CHECK_INT_EQ(kiln_alloc_current(), before);

    kiln_alloc_set_limit(before + 100);
    void *q = NULL;
    CHECK_STATUS(kiln_alloc_checked(&q, 200, "a test buffer"), KILN_ERR_NOMEM);
    CHECK_TRUE(q == NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "a test buffer") != NULL);
    CHECK_OK(kiln_alloc_checked(&q, 50, "a small buffer"));
    kiln_free(q);
    kiln_alloc_set_limit(0);
    CHECK_TRUE(kiln_alloc(SIZE_MAX - 10) == NULL);
}

static void test_rng(void) {
    kiln_rng a, b;
    kiln_rng_seed(&a, 42);
    kiln_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++)
        CHECK_TRUE(kiln_rng_u64(&a) == kiln_rng_u64(&b));
    kiln_rng_seed(&b, 43);
    CHECK_TRUE(kiln_rng_u64(&a) != kiln_rng_u64(&b));
    /* moments of the normal and uniform draws */
    double s = 0, s2 = 0, u = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = kiln_rng_normal(&a);
        s += x;
        s2 += x * x;
        float f = kiln_rng_uniform(&a);
        CHECK_TRUE(f >= 0.0f && f < 1.0f);
        u += f;
    }
    CHECK_NEAR(s / n, 0.0, 0.01);
    CHECK_NEAR(s2 / n, 1.0, 0.02);
    CHECK_NEAR(u / n, 0.5, 0.01);
    int counts[3] = {0, 0, 0};
    for (int i = 0; i < 30000; i++)
        counts[kiln_rng_below(&a, 3)]++;
    for (int k = 0; k < 3; k++)
        CHECK_NEAR(counts[k], 10000, 0.05);
}

/* Only regular files are read: a FIFO would block, /dev/zero never ends. */
static void test_file_read(void) {
    char dir[256], p[512], fifo[512];
    test_tmpdir(dir, sizeof dir, "core");
    test_path(p, sizeof p, dir, "a.txt");
    test_path(fifo, sizeof fifo, dir, "fifo");
    CHECK_INT_EQ(test_write_file(p, "hello", 5), 0);
    char *data = NULL;
    size_t len = 0;
    CHECK_OK(kiln_file_read(p, 0, &data, &len));
    CHECK_INT_EQ(len, 5);
    CHECK_STR_EQ(data, "hello");
    free(data);
    CHECK_STATUS(kiln_file_read(p, 4, &data, &len), KILN_ERR_RANGE);
    CHECK_TRUE(data == NULL && strstr(kiln_error_message(), "5 bytes") != NULL);
    CHECK_INT_EQ(mkfifo(fifo, 0600), 0);
    CHECK_STATUS(kiln_file_read(fifo, 0, &data, &len), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "FIFO") != NULL);
    CHECK_STATUS(kiln_file_read("/dev/zero", 0, &data, &len), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "a device") != NULL);
    CHECK_STATUS(kiln_file_read(dir, 0, &data, &len), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "a folder") != NULL);
    test_path(p, sizeof p, dir, "missing");
    CHECK_STATUS(kiln_file_read(p, 0, &data, &len), KILN_ERR_NOT_FOUND);
    int fd = -1;
    CHECK_STATUS(kiln_file_open_regular(fifo, &fd, NULL), KILN_ERR_IO);
    CHECK_INT_EQ(fd, -1);
    CHECK_STATUS(kiln_file_check_replaceable(fifo), KILN_ERR_IO);
    CHECK_OK(kiln_file_check_replaceable(p));
    test_rmtree(dir);
}

int main(void) {
    RUN_TEST(test_status_strings);
    RUN_TEST(test_alloc_counts_and_limits);
    RUN_TEST(test_rng);
    RUN_TEST(test_file_read);
    TEST_MAIN_END();
}
