/* fl_sampler.c - seeded Fisher-Yates shuffles and strided shards. */
#include "fl_sampler.h"

#include <stdlib.h>

#include "fl_error.h"
#include "fl_rng.h"

int fl_sampler_check(const fl_sampler *s) {
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return fl_error_set(FL_EINVAL, "rank %d is not in [0, world_size=%d)", s->rank,
                            s->world_size);
    if (s->batch_size < 1)
        return fl_error_set(FL_EINVAL, "batch_size must be >= 1");
    return FL_OK;
}

uint64_t fl_sampler_shard_size(const fl_sampler *s) {
    uint64_t w = (uint64_t)s->world_size, r = (uint64_t)s->rank;
    return s->n > r ? (s->n - r + w - 1) / w : 0;
}

uint64_t fl_sampler_batches(const fl_sampler *s) {
    uint64_t size = fl_sampler_shard_size(s);
    return s->drop_last ? size / s->batch_size : (size + s->batch_size - 1) / s->batch_size;
}

uint64_t fl_sampler_epoch_seed(uint64_t seed, uint64_t epoch) {
    fl_rng mix = {seed ^ (epoch * 0x9E3779B97F4A7C15ULL)};
    return fl_rng_next(&mix);
}

int fl_sampler_epoch(const fl_sampler *s, uint64_t epoch, int64_t *order) {
    uint64_t w = (uint64_t)s->world_size, r = (uint64_t)s->rank;
    if (!s->shuffle) {
        for (uint64_t i = r, k = 0; i < s->n; i += w)
            order[k++] = (int64_t)i;
        return FL_OK;
    }
    int64_t *all = malloc((s->n ? s->n : 1) * sizeof *all);
    if (all == NULL)
        return FL_ENOMEM;
    for (uint64_t i = 0; i < s->n; i++)
        all[i] = (int64_t)i;
    /* Every rank draws the same permutation from (seed, epoch), then keeps its stride. */
    fl_rng rng = {fl_sampler_epoch_seed(s->seed, epoch) ^ 0x5851F42D4C957F2DULL};
    for (uint64_t i = s->n; i > 1; i--) {
        uint64_t j = fl_rng_below(&rng, i);
        int64_t t = all[i - 1];
        all[i - 1] = all[j];
        all[j] = t;
    }
    for (uint64_t i = r, k = 0; i < s->n; i += w)
        order[k++] = all[i];
    free(all);
    return FL_OK;
}
