/* safetensors: write and read back, 16-bit float conversion, and the atomic-write promise
 * (a failed save leaves no temporary and the old file byte-identical). */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/core.h"
#include "kiln/safetensors.h"
#include "test.h"

static char dir[256];

static void path_in_dir(char *out, size_t cap, const char *name) {
    test_path(out, cap, dir, name);
}

static int count_entries(const char *d) {
    DIR *dp = opendir(d);
    int n = 0;
    for (struct dirent *e; dp && (e = readdir(dp));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (dp)
        closedir(dp);
    return n;
}

/* Tensors of several dtypes, a scalar and an empty one, in an order that is not sorted. */
static float w_f32[6] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f};
static uint16_t w_bf16[4] = {0x3f80, 0xc000, 0x7f80, 0x0001}; /* 1, -2, inf, tiny subnormal */
static int64_t w_i64[4] = {1, -1, INT64_MAX, INT64_MIN};
static float w_scalar = 42.0f;

static kiln_safetensors_writer *example_writer(void) {
    kiln_safetensors_writer *w = NULL;
    if (kiln_safetensors_writer_init(&w) != KILN_OK)
        return NULL;
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s22[2] = {2, 2}, s05[2] = {0, 5};
    CHECK_OK(kiln_safetensors_writer_add(w, "w.f32", KILN_ST_DTYPE_F32, 2, s23, w_f32));
    CHECK_OK(kiln_safetensors_writer_add(w, "b.bf16", KILN_ST_DTYPE_BF16, 1, s4, w_bf16));
    CHECK_OK(kiln_safetensors_writer_add(w, "a.scalar", KILN_ST_DTYPE_F32, 0, NULL, &w_scalar));
    CHECK_OK(kiln_safetensors_writer_add(w, "empty", KILN_ST_DTYPE_F32, 2, s05, NULL));
    CHECK_OK(kiln_safetensors_writer_add(w, "c.i64", KILN_ST_DTYPE_I64, 2, s22, w_i64));
    CHECK_OK(kiln_safetensors_writer_set_metadata(w, "format", "pt"));
    CHECK_OK(kiln_safetensors_writer_set_metadata(w, "note", "first"));
    CHECK_OK(kiln_safetensors_writer_set_metadata(w, "note", "quote \" and \\ and \n"));
    return w;
}

static void test_round_trip(void) {
    char path[512];
    path_in_dir(path, sizeof path, "rt.safetensors");
    kiln_safetensors_writer *w = example_writer();
    CHECK_OK(kiln_safetensors_writer_write(w, path));
    void *mem = NULL;
    size_t mem_size = 0, file_size = 0;
    CHECK_OK(kiln_safetensors_writer_to_memory(w, &mem, &mem_size));
    kiln_safetensors_writer_free(w);
    unsigned char *file = test_slurp(path, &file_size);
    CHECK_TRUE(file && file_size == mem_size && memcmp(file, mem, mem_size) == 0);
    /* the data starts 8-aligned: the header is padded with spaces */
    uint64_t hlen = 0;
    memcpy(&hlen, file, 8);
    CHECK_INT_EQ(hlen % 8, 0);
    CHECK_TRUE(file[8] == '{');
    free(file);
    free(mem);
    CHECK_INT_EQ(count_entries(dir), 1); /* no temporary left */

    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(&f, path));
    if (!f)
        return;
    CHECK_STR_EQ(kiln_safetensors_path(f), path);
    CHECK_INT_EQ(kiln_safetensors_num_tensors(f), 5);
    /* data in the order added (the empty tensor sorts before the one at the same offset) */
    const char *order[5] = {"w.f32", "b.bf16", "a.scalar", "empty", "c.i64"};
    for (int i = 0; i < 5; i++)
        CHECK_STR_EQ(kiln_safetensors_tensor(f, i)->name, order[i]);
    const kiln_st_tensor *t = kiln_safetensors_find(f, "w.f32");
    CHECK_TRUE(t && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6);
    float out[6];
    CHECK_OK(kiln_safetensors_read_f32(f, t, out));
    CHECK_TRUE(memcmp(out, w_f32, sizeof w_f32) == 0);
    t = kiln_safetensors_find(f, "b.bf16");
    CHECK_TRUE(t && t->dtype == KILN_ST_DTYPE_BF16 && t->offset == 24 && t->nbytes == 8);
    CHECK_OK(kiln_safetensors_read_f32(f, t, out));
    CHECK_TRUE(out[0] == 1.0f && out[1] == -2.0f && isinf(out[2]) && out[3] > 0 && out[3] < 1e-38f);
    t = kiln_safetensors_find(f, "a.scalar");
    CHECK_TRUE(t && t->ndim == 0 && t->numel == 1);
    CHECK_OK(kiln_safetensors_read_f32(f, t, out));
    CHECK_TRUE(out[0] == 42.0f);
    t = kiln_safetensors_find(f, "empty");
    CHECK_TRUE(t && t->numel == 0 && t->nbytes == 0 && t->shape[1] == 5);
    CHECK_OK(kiln_safetensors_read_f32(f, t, out));
    t = kiln_safetensors_find(f, "c.i64");
    CHECK_TRUE(t && t->dtype == KILN_ST_DTYPE_I64 && memcmp(t->data, w_i64, sizeof w_i64) == 0);
    CHECK_STR_EQ(kiln_safetensors_metadata(f, "format"), "pt");
    CHECK_STR_EQ(kiln_safetensors_metadata(f, "note"), "quote \" and \\ and \n");
    CHECK_INT_EQ(kiln_safetensors_num_metadata(f), 2);
    kiln_safetensors_close(f);
}

static void test_writer_rejects(void) {
    kiln_safetensors_writer *w = NULL;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    int64_t s1[1] = {1}, neg[1] = {-1};
    float x = 1;
    CHECK_STATUS(kiln_safetensors_writer_add(w, "", KILN_ST_DTYPE_F32, 1, s1, &x), KILN_ERR_ARG);
    CHECK_STATUS(kiln_safetensors_writer_add(w, "__metadata__", KILN_ST_DTYPE_F32, 1, s1, &x),
                 KILN_ERR_ARG);
    CHECK_STATUS(kiln_safetensors_writer_add(w, "n", KILN_ST_DTYPE_F32, 1, neg, &x), KILN_ERR_ARG);
    CHECK_STATUS(kiln_safetensors_writer_add(w, "d", KILN_ST_DTYPE_F32, 1, s1, NULL), KILN_ERR_ARG);
    CHECK_STATUS(kiln_safetensors_writer_add(w, "t", KILN_ST_DTYPE_COUNT, 1, s1, &x), KILN_ERR_ARG);
    CHECK_STATUS(kiln_safetensors_writer_add(w, "m", KILN_ST_DTYPE_F32, 9, s1, &x), KILN_ERR_ARG);
    CHECK_OK(kiln_safetensors_writer_add(w, "x", KILN_ST_DTYPE_F32, 1, s1, &x));
    CHECK_OK(kiln_safetensors_writer_add(w, "x", KILN_ST_DTYPE_F32, 1, s1, &x));
    char path[512];
    path_in_dir(path, sizeof path, "dup.safetensors");
    CHECK_STATUS(kiln_safetensors_writer_write(w, path), KILN_ERR_ARG);
    CHECK_TRUE(strstr(kiln_error_message(), "\"x\" added twice") != NULL);
    CHECK_TRUE(access(path, F_OK) != 0);
    kiln_safetensors_writer_free(w);
    kiln_safetensors_writer_free(NULL);
}

static void test_f16_bf16(void) {
    CHECK_TRUE(kiln_f16_to_f32(0x3c00) == 1.0f);
    CHECK_TRUE(kiln_f16_to_f32(0xc000) == -2.0f);
    CHECK_TRUE(kiln_f16_to_f32(0x7bff) == 65504.0f);
    CHECK_TRUE(kiln_f16_to_f32(0x3555) == 0x1.554p-2f);
    CHECK_TRUE(kiln_f16_to_f32(0x0400) == 0x1p-14f);   /* smallest normal */
    CHECK_TRUE(kiln_f16_to_f32(0x0001) == 0x1p-24f);   /* smallest subnormal */
    CHECK_TRUE(kiln_f16_to_f32(0x03ff) == 0x3ffp-24f); /* largest subnormal */
    CHECK_TRUE(kiln_f16_to_f32(0x8001) == -0x1p-24f);
    CHECK_TRUE(kiln_f16_to_f32(0x0000) == 0.0f && !signbit(kiln_f16_to_f32(0x0000)));
    CHECK_TRUE(kiln_f16_to_f32(0x8000) == 0.0f && signbit(kiln_f16_to_f32(0x8000)));
    CHECK_TRUE(isinf(kiln_f16_to_f32(0x7c00)) && kiln_f16_to_f32(0x7c00) > 0);
    CHECK_TRUE(isinf(kiln_f16_to_f32(0xfc00)) && kiln_f16_to_f32(0xfc00) < 0);
    CHECK_TRUE(isnan(kiln_f16_to_f32(0x7e00)) && isnan(kiln_f16_to_f32(0xfc01)));
    CHECK_TRUE(kiln_bf16_to_f32(0x3f80) == 1.0f);
    CHECK_TRUE(kiln_bf16_to_f32(0x4049) == 3.140625f);
    CHECK_TRUE(kiln_bf16_to_f32(0x0001) == 0x1p-133f);
    CHECK_TRUE(isinf(kiln_bf16_to_f32(0xff80)) && isnan(kiln_bf16_to_f32(0x7fc0)));
    /* every finite half converts to a float that rounds back to the same half bits (the
     * conversion is monotone and exact: values strictly increase with the bit pattern) */
    float prev = -INFINITY;
    int monotone = 1;
    for (uint32_t h = 0xfbff; h >= 0x8001; h--) { /* negative finite, increasing */
        float v = kiln_f16_to_f32((uint16_t)h);
        monotone &= v > prev;
        prev = v;
    }
    for (uint32_t h = 0x0000; h <= 0x7bff; h++) {
        float v = kiln_f16_to_f32((uint16_t)h);
        monotone &= h == 0 ? v >= prev : v > prev;
        prev = v;
    }
    CHECK_TRUE(monotone);

    /* read_f32 over F16 and F64 tensors */
    uint16_t h[3] = {0x3c00, 0xbc00, 0x7c00};
    double d[2] = {0.1, -1e300};
    int64_t s3[1] = {3}, s2[1] = {2};
    kiln_safetensors_writer *w = NULL;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add(w, "h", KILN_ST_DTYPE_F16, 1, s3, h));
    CHECK_OK(kiln_safetensors_writer_add(w, "d", KILN_ST_DTYPE_F64, 1, s2, d));
    void *mem = NULL;
    size_t size = 0;
    CHECK_OK(kiln_safetensors_writer_to_memory(w, &mem, &size));
    kiln_safetensors_writer_free(w);
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open_memory(&f, mem, size, "mem"));
    float out[3] = {0};
    if (f) {
        CHECK_OK(kiln_safetensors_read_f32(f, kiln_safetensors_find(f, "h"), out));
        CHECK_TRUE(out[0] == 1.0f && out[1] == -1.0f && isinf(out[2]));
        CHECK_OK(kiln_safetensors_read_f32(f, kiln_safetensors_find(f, "d"), out));
        CHECK_TRUE(out[0] == 0.1f && isinf(out[1]) && out[1] < 0);
    }
    kiln_safetensors_close(f);
    free(mem);
}

static void test_open_errors(void) {
    kiln_safetensors *f = NULL;
    char path[512];
    path_in_dir(path, sizeof path, "missing.safetensors");
    CHECK_STATUS(kiln_safetensors_open(&f, path), KILN_ERR_NOT_FOUND);
    CHECK_TRUE(strstr(kiln_error_message(), path) != NULL);
    CHECK_STATUS(kiln_safetensors_open(&f, dir), KILN_ERR_IO);
    path_in_dir(path, sizeof path, "short.safetensors");
    CHECK_INT_EQ(test_write_file(path, "abc", 3), 0);
    CHECK_STATUS(kiln_safetensors_open(&f, path), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), path) != NULL);
    /* a file that claims a huge header */
    CHECK_INT_EQ(test_write_file(path, "\xff\xff\xff\xff\xff\xff\xff\x7f{}      ", 16), 0);
    CHECK_STATUS(kiln_safetensors_open(&f, path), KILN_ERR_FORMAT);
    CHECK_TRUE(f == NULL);
    remove(path);
}

/* Overwrite an existing file with a writer that fails part-way; the old bytes must stay. */
static void expect_save_fails_cleanly(const kiln_safetensors_writer *w, const char *path,
                                      const unsigned char *old, size_t old_size, int entries) {
    CHECK_STATUS(kiln_safetensors_writer_write(w, path), KILN_ERR_IO);
    size_t now_size = 0;
    unsigned char *now = test_slurp(path, &now_size);
    CHECK_TRUE(now && now_size == old_size && memcmp(now, old, old_size) == 0);
    free(now);
    CHECK_INT_EQ(count_entries(dir), entries);
}

static void test_atomic_write(void) {
    char path[512];
    path_in_dir(path, sizeof path, "model.safetensors");
    kiln_safetensors_writer *w = example_writer();
    CHECK_OK(kiln_safetensors_writer_write(w, path));
    kiln_safetensors_writer_free(w);
    size_t old_size = 0;
    unsigned char *old = test_slurp(path, &old_size);
    int entries = count_entries(dir);

    /* A 4 MiB tensor written under a 64 KiB file-size limit: write() fails with EFBIG part-way
     * through the temporary file. */
    int64_t n = 1 << 20;
    float *big = kiln_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        big[i] = (float)i;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    CHECK_OK(kiln_safetensors_writer_add(w, "big", KILN_ST_DTYPE_F32, 1, &n, big));
    struct rlimit saved, lim;
    getrlimit(RLIMIT_FSIZE, &saved);
    lim = saved;
    lim.rlim_cur = 64 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK_TRUE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    expect_save_fails_cleanly(w, path, old, old_size, entries);
    CHECK_TRUE(strstr(kiln_error_message(), "File too large") != NULL);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);

    /* The target is a folder: refused before anything is written. */
    char sub[512];
    path_in_dir(sub, sizeof sub, "a_folder");
    CHECK_TRUE(mkdir(sub, 0755) == 0);
    CHECK_STATUS(kiln_safetensors_writer_write(w, sub), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "is a folder") != NULL);
    CHECK_INT_EQ(count_entries(dir), entries + 1);
    CHECK_INT_EQ(count_entries(sub), 0);
    rmdir(sub);

    /* A folder that does not exist. */
    path_in_dir(sub, sizeof sub, "nope/model.safetensors");
    CHECK_STATUS(kiln_safetensors_writer_write(w, sub), KILN_ERR_IO);

    /* A folder this process may not write to. Root may write anywhere, so as root the save
     * runs in a child that has given up root (to nobody, 65534). */
    CHECK_TRUE(chmod(dir, 0555) == 0);
    if (geteuid() != 0) {
        expect_save_fails_cleanly(w, path, old, old_size, entries);
    } else {
        pid_t pid = fork();
        if (pid == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0)
                _exit(3);
            _exit(kiln_safetensors_writer_write(w, path) == KILN_ERR_IO ? 0 : 1);
        }
        int status = 0;
        CHECK_TRUE(pid > 0 && waitpid(pid, &status, 0) == pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
            TEST_SKIP("the read-only folder case: running as root, and cannot give it up");
        } else {
            CHECK_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            size_t now_size = 0;
            unsigned char *now = test_slurp(path, &now_size);
            CHECK_TRUE(now && now_size == old_size && memcmp(now, old, old_size) == 0);
            free(now);
            CHECK_INT_EQ(count_entries(dir), entries);
        }
    }
    CHECK_TRUE(chmod(dir, 0755) == 0);

    /* And a save that succeeds replaces the file whole. */
    CHECK_OK(kiln_safetensors_writer_write(w, path));
    CHECK_INT_EQ(count_entries(dir), entries);
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(&f, path));
    CHECK_INT_EQ(f ? kiln_safetensors_num_tensors(f) : -1, 1);
    const kiln_st_tensor *t = f ? kiln_safetensors_find(f, "big") : NULL;
    CHECK_TRUE(t && memcmp(t->data, big, (size_t)n * sizeof(float)) == 0);
    kiln_safetensors_close(f);
    kiln_safetensors_writer_free(w);
    kiln_free(big);
    free(old);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "safetensors");
    RUN_TEST(test_round_trip);
    RUN_TEST(test_writer_rejects);
    RUN_TEST(test_f16_bf16);
    RUN_TEST(test_open_errors);
    RUN_TEST(test_atomic_write);
    test_rmtree(dir);
    TEST_MAIN_END();
}
