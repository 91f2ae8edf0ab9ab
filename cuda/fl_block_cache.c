/* fl_block_cache.c - the bounded cache of freed device blocks of fl_block_cache.h. */
#include "fl_block_cache.h"

#include <string.h>

/* Removes blocks[i], keeping the others oldest first. The caller holds the lock. */
static fl_block remove_at(fl_block_cache *cache, int i) {
    fl_block block = cache->blocks[i];
    memmove(&cache->blocks[i], &cache->blocks[i + 1], (size_t)(cache->count - i - 1) * sizeof block);
    cache->count--;
    cache->bytes -= block.bytes;
    return block;
}

int fl_block_cache_take(fl_block_cache *cache, size_t bytes, int (*ready)(void *fence),
                        fl_block *out) {
    int found = 0;
    pthread_mutex_lock(&cache->lock);
    for (int i = cache->count - 1; i >= 0 && !found; i--) /* newest first: likeliest done */
        if (cache->blocks[i].bytes == bytes && ready(cache->blocks[i].fence) == 1) {
            *out = remove_at(cache, i);
            found = 1;
        }
    pthread_mutex_unlock(&cache->lock);
    return found;
}

int fl_block_cache_put(fl_block_cache *cache, const fl_block *block,
                       fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1]) {
    if (block->bytes > cache->max_bytes) {
        evicted[0] = *block;
        return 1;
    }
    int n = 0;
    pthread_mutex_lock(&cache->lock);
    while (cache->count > 0 &&
           (cache->count == FL_BLOCK_CACHE_SLOTS || cache->bytes + block->bytes > cache->max_bytes))
        evicted[n++] = remove_at(cache, 0);
    cache->blocks[cache->count++] = *block;
    cache->bytes += block->bytes;
    pthread_mutex_unlock(&cache->lock);
    return n;
}

int fl_block_cache_drain(fl_block_cache *cache, fl_block out[FL_BLOCK_CACHE_SLOTS]) {
    pthread_mutex_lock(&cache->lock);
    int n = cache->count;
    memcpy(out, cache->blocks, (size_t)n * sizeof *out);
    cache->count = 0;
    cache->bytes = 0;
    pthread_mutex_unlock(&cache->lock);
    return n;
}
