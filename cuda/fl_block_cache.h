/* fl_block_cache.h - a small, bounded cache of freed device blocks, keyed by exact size, so a
 * DeviceArray a batch drops is reused by the next batch instead of going back through cudaFree
 * (which waits for the whole device). Plain C, knowing nothing of CUDA: a block carries an opaque
 * `fence` (fl_cuda_mem.cu's event recorded after the block's last use), and take() only hands
 * out a block whose fence the caller's ready() says has passed. Thread-safe (one mutex); nothing
 * here blocks on the device. Tested without a GPU by tests/c/test_block_cache.c.
 */
#ifndef FL_BLOCK_CACHE_H
#define FL_BLOCK_CACHE_H

#include <pthread.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FL_BLOCK_CACHE_SLOTS 8 /* blocks kept per cache: a loader's batches in flight, and then some */

typedef struct fl_block {
    void *ptr;
    size_t bytes;
    void *fence; /* the caller's: passed to ready() and handed back with the block */
} fl_block;

typedef struct fl_block_cache {
    pthread_mutex_t lock;
    size_t max_bytes; /* the most bytes kept at once */
    size_t bytes;     /* kept now */
    int count;
    fl_block blocks[FL_BLOCK_CACHE_SLOTS]; /* oldest first */
} fl_block_cache;

#define FL_BLOCK_CACHE_INIT(max_bytes) {PTHREAD_MUTEX_INITIALIZER, (max_bytes), 0, 0, {{0, 0, 0}}}

/* Takes the most recently kept block of exactly `bytes` whose ready(fence) returns 1 (ready runs
 * under the cache's lock and must not block). Returns 1 with *out filled (the caller now owns the
 * block and its fence), or 0 when none fits. Never fails. */
int fl_block_cache_take(fl_block_cache *cache, size_t bytes, int (*ready)(void *fence),
                        fl_block *out);

/* Keeps `block`, evicting the oldest blocks while more than FL_BLOCK_CACHE_SLOTS or max_bytes are
 * kept (a block larger than max_bytes on its own is not kept). Returns how many blocks the caller
 * must free now, copied into evicted[]. Never fails. */
int fl_block_cache_put(fl_block_cache *cache, const fl_block *block,
                       fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1]);

/* Empties the cache: returns how many blocks it held, copied into out[] for the caller to free. */
int fl_block_cache_drain(fl_block_cache *cache, fl_block out[FL_BLOCK_CACHE_SLOTS]);

#ifdef __cplusplus
}
#endif

#endif
