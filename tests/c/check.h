/* check.h - the smallest test harness: CHECK(cond) records a failure with file:line and
 * carries on; RUN(test) runs one test function; main returns check_failures != 0 (never the
 * count itself: an exit status keeps only its low 8 bits). */
#ifndef FL_TEST_CHECK_H
#define FL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_failures;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            check_failures++;                                                        \
        }                                                                            \
    } while (0)

#define RUN(test)                                                                         \
    do {                                                                                  \
        int before = check_failures;                                                      \
        test();                                                                           \
        fprintf(stderr, "%-52s %s\n", #test, check_failures == before ? "ok" : "FAILED"); \
    } while (0)

/* Scales the size of load tests: FL_TEST_SCALE=0.1 runs a tenth of the items. */
static inline double test_scale(void) {
    const char *scale = getenv("FL_TEST_SCALE");
    return scale != NULL ? atof(scale) : 1.0;
}

#endif
