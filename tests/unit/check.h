/* check: the minimal assertion kit of the unit tests. CHECK records a failure with file:line and
 * goes on; CHECK_DONE() prints "N passed, N failed" and returns the exit status from main. */
#ifndef DFLASH_TEST_CHECK_H
#define DFLASH_TEST_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) check_passed++;                                                                  \
        else {                                                                                     \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        if (va_ == vb_) check_passed++;                                                            \
        else {                                                                                     \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, \
                    #a, #b, va_, vb_);                                                             \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double va_ = (double)(a), vb_ = (double)(b);                                               \
        if (fabs(va_ - vb_) <= (tol)) check_passed++;                                              \
        else {                                                                                     \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s ~ %s (%.9g vs %.9g)\n", __FILE__, __LINE__,  \
                    #a, #b, va_, vb_);                                                             \
        }                                                                                          \
    } while (0)

#define CHECK_DONE()                                                                               \
    do {                                                                                           \
        printf("%d passed, %d failed\n", check_passed, check_failed);                             \
        return check_failed ? 1 : 0;                                                               \
    } while (0)

#endif
