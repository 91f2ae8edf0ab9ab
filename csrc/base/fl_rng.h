/* fl_rng.h - small counter-based random numbers for reproducible per-sample augmentation.
 *
 * Sample i of a call seeded with s always draws the same numbers, whichever thread handles
 * it and however many threads there are: each sample gets its own stream derived from
 * (seed, index) with SplitMix64 (Steele, Lea and Flood, 2014), whose output passes BigCrush.
 */
#ifndef FL_RNG_H
#define FL_RNG_H

#include <stdint.h>

typedef struct fl_rng {
    uint64_t state;
} fl_rng;

/* Advances the generator and returns 64 random bits. */
static inline uint64_t fl_rng_next(fl_rng *rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* The stream of sample `index` under `seed`. */
static inline fl_rng fl_rng_for_sample(uint64_t seed, uint64_t index) {
    fl_rng mix = {seed ^ 0x6A09E667F3BCC909ULL};
    fl_rng salt = {index};
    fl_rng rng = {fl_rng_next(&mix) ^ fl_rng_next(&salt)};
    return rng;
}

/* A uniform integer in [0, bound) (bound > 0), by Lemire's multiply-shift without the
 * rejection step: the bias, bound / 2^64, is far below anything an image size can show. */
static inline uint64_t fl_rng_below(fl_rng *rng, uint64_t bound) {
    return (uint64_t)(((unsigned __int128)fl_rng_next(rng) * bound) >> 64);
}

/* A uniform double in [0, 1). */
static inline double fl_rng_uniform(fl_rng *rng) {
    return (double)(fl_rng_next(rng) >> 11) * 0x1.0p-53;
}

#endif
