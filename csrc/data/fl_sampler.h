/* fl_sampler.h - which samples make up each epoch, and in what order: an optional seeded
 * shuffle (a new order every epoch, the same on every rank) split into disjoint shards by
 * rank, then cut into batches.
 *
 * Shard r takes every world_size-th sample of the epoch's order, starting at r. As with
 * torch's DistributedSampler, every rank gets the same number of samples, so ranks run the
 * same number of steps (a rank with one batch more would wait forever in an all-reduce):
 * with drop_last the order's tail is trimmed to a multiple of world_size (the shards are
 * disjoint; up to world_size - 1 samples sit out the epoch, a different few each shuffled
 * epoch), without it the order wraps around to pad the last shards (up to world_size - 1
 * samples are seen twice). When world_size divides n, the shards are disjoint and together
 * hold every sample exactly once. Pure functions of their arguments; thread-safe; no Python.
 *
 * The one sharding rule of every Loader mode: the thread loader (fl_loader), the process pool
 * (fl_procpool) and the in-process path (workers=0 with Python code, through the binding's
 * _epoch_order/_epoch_batches) all take their order and batch count from here.
 */
#ifndef FL_SAMPLER_H
#define FL_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct fl_sampler {
    uint64_t n;      /* samples in the dataset */
    int shuffle;     /* 0: in order */
    uint64_t seed;   /* shuffle seed */
    int rank;        /* 0 <= rank < world_size */
    int world_size;  /* >= 1 */
    size_t batch_size;
    int drop_last;   /* 1: no final partial batch */
} fl_sampler;

/* Checks the fields, and that an epoch's order (fl_sampler_epoch's memory) fits in memory.
 * Returns 0 or FL_EINVAL/FL_EOVERFLOW with a detail naming the argument. */
int fl_sampler_check(const fl_sampler *s);

/* Samples in this rank's shard. */
uint64_t fl_sampler_shard_size(const fl_sampler *s);

/* Batches per epoch for this shard: the same on every rank. */
uint64_t fl_sampler_batches(const fl_sampler *s);

/* The most samples one batch holds: batch_size, or the shard's size when smaller (a batch
 * slot sized by it fits any batch of the epoch), at least 1. */
size_t fl_sampler_batch_capacity(const fl_sampler *s);

/* Writes this shard's sample indices for `epoch` into order (shard_size entries). Needs
 * n * 8 bytes of scratch when shuffling (the full permutation): returns 0 or FL_ENOMEM. */
int fl_sampler_epoch(const fl_sampler *s, uint64_t epoch, int64_t *order);

/* The seed of an epoch's random augmentations: mixes seed and epoch so every epoch draws
 * anew while staying reproducible. */
uint64_t fl_sampler_epoch_seed(uint64_t seed, uint64_t epoch);

/* Batches of uneven sizes, as a batch sampler gives them: batch b is the epoch order's
 * positions ends[b - 1] (0 for b = 0) up to ends[b]. Returns 0 when the n `ends` split this
 * shard into batches of 1 to batch_size samples each, else FL_EINVAL naming the first bad
 * batch. Pure. */
int fl_sampler_check_ends(const fl_sampler *s, const uint64_t *ends, uint64_t n);

/* fl_sampler_check_ends, then a malloc'd copy of `ends` into *copy (NULL for ends NULL: the
 * split into batch_size samples). Returns 0, FL_EINVAL or FL_ENOMEM (*copy NULL). */
int fl_sampler_copy_ends(const fl_sampler *s, const uint64_t *ends, uint64_t n, uint64_t **copy);

#endif
