/* fuzz_checks.h - what the fuzz targets (fuzz_npy.c, fuzz_image.c) assert about every input. */
#ifndef FUZZ_CHECKS_H
#define FUZZ_CHECKS_H

#include <stdlib.h>

/* Stops the run on a broken invariant; libFuzzer and ASan both report the abort. */
#define INVARIANT(cond) \
    do {                \
        if (!(cond))    \
            abort();    \
    } while (0)

/* 1 when every character of s is printable ASCII (an error detail a user may read). */
static inline int printable(const char *s) {
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e)
            return 0;
    return 1;
}

#endif
