/* A small test harness: each test is a function; a failed check prints both values,
 * the expression and the line, and the test continues to count failures. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;
static int test_checks;

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

#define RUN_TEST(fn)                                                                 \
    do {                                                                             \
        int before_ = test_failures;                                                 \
        fn();                                                                        \
        fprintf(stderr, "%s %s\n", test_failures == before_ ? "ok  " : "FAIL", #fn);  \
    } while (0)

#define TEST_MAIN_END()                                                              \
    do {                                                                             \
        fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);       \
        return test_failures ? 1 : 0;                                                \
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

#endif
