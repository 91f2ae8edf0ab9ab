/* fl_sampler.c - seeded Fisher-Yates shuffles and strided shards. */
#include "data/fl_sampler.h"

#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_rng.h"
#include "base/fl_size.h"

/* The bytes an epoch's order takes: the shard, and the whole permutation when shuffling. */
static int order_bytes(const fl_sampler *s, size_t *bytes) {
    uint64_t entries;
    if (__builtin_add_overflow(fl_sampler_shard_size(s), s->shuffle ? s->n : 0, &entries) || entries > FL_SIZE_MAX)
        return fl_error_set(FL_EOVERFLOW, "a source of %llu samples is too large to order",
                            (unsigned long long)s->n);
    return fl_size_mul((size_t)entries, sizeof(int64_t), "the epoch order of len(source) samples", bytes);
}

int fl_sampler_check(const fl_sampler *s) {
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return fl_error_set(FL_EINVAL, "rank %d is not in [0, world_size=%d)", s->rank,
                            s->world_size);
    if (s->batch_size < 1)
        return fl_error_set(FL_EINVAL, "batch_size must be >= 1");
    size_t bytes;
    int rc = order_bytes(s, &bytes);
    return rc == FL_OK ? fl_size_fits_memory(bytes, "the epoch order of len(source) samples") : rc;
}

uint64_t fl_sampler_shard_size(const fl_sampler *s) {
    uint64_t w = (uint64_t)s->world_size;
    if (w == 1)
        return s->n;
    /* Equal shards, as torch's DistributedSampler: trimmed with drop_last, else padded. */
    return s->drop_last ? s->n / w : s->n / w + (s->n % w != 0); /* no n + w - 1 to wrap */
}

uint64_t fl_sampler_batches(const fl_sampler *s) {
    uint64_t size = fl_sampler_shard_size(s);
    return size / s->batch_size + (!s->drop_last && size % s->batch_size != 0);
}

size_t fl_sampler_batch_capacity(const fl_sampler *s) {
    uint64_t size = fl_sampler_shard_size(s);
    return size == 0 ? 1 : size < s->batch_size ? (size_t)size : s->batch_size;
}

uint64_t fl_sampler_epoch_seed(uint64_t seed, uint64_t epoch) {
    fl_rng mix = {seed ^ (epoch * 0x9E3779B97F4A7C15ULL)};
    return fl_rng_next(&mix);
}

/* Keeps this rank's stride of the epoch order `all` (n entries, NULL: in order): position
 * rank + k * world_size, wrapping around past the end when the shards are padded. */
static void take_stride(const fl_sampler *s, const int64_t *all, int64_t *order) {
    uint64_t w = (uint64_t)s->world_size, size = fl_sampler_shard_size(s);
    for (uint64_t k = 0; k < size; k++) {
        uint64_t position = ((uint64_t)s->rank + k * w) % s->n;
        order[k] = all ? all[position] : (int64_t)position;
    }
}

int fl_sampler_epoch(const fl_sampler *s, uint64_t epoch, int64_t *order) {
    if (!s->shuffle || s->n == 0) {
        take_stride(s, NULL, order);
        return FL_OK;
    }
    int64_t *all = malloc(s->n * sizeof *all);
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
    take_stride(s, all, order);
    free(all);
    return FL_OK;
}

int fl_sampler_check_ends(const fl_sampler *s, const uint64_t *ends, uint64_t n) {
    uint64_t shard = fl_sampler_shard_size(s), start = 0;
    for (uint64_t b = 0; b < n; start = ends[b++])
        if (ends[b] <= start || ends[b] - start > s->batch_size)
            return fl_error_set(FL_EINVAL, "batch %llu has %lld samples; each must have 1 to %zu",
                                (unsigned long long)b, (long long)(ends[b] - start), s->batch_size);
    if (start != shard)
        return fl_error_set(FL_EINVAL, "the batches hold %llu samples in all, the order %llu",
                            (unsigned long long)start, (unsigned long long)shard);
    return FL_OK;
}

int fl_sampler_copy_ends(const fl_sampler *s, const uint64_t *ends, uint64_t n, uint64_t **copy) {
    *copy = NULL;
    if (ends == NULL)
        return FL_OK;
    int rc = fl_sampler_check_ends(s, ends, n);
    if (rc != FL_OK)
        return rc;
    if (n > SIZE_MAX / sizeof **copy || (*copy = malloc(n ? n * sizeof **copy : 1)) == NULL)
        return FL_ENOMEM;
    memcpy(*copy, ends, n * sizeof **copy);
    return FL_OK;
}
