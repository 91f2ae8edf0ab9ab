/* test_block_cache.c - cuda/fl_block_cache.c (plain C, no GPU): exact-size reuse, fences that
 * have not passed are skipped, the slot and byte bounds evict the oldest, drain empties, and
 * threads putting and taking at once lose and duplicate nothing. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "../../cuda/fl_block_cache.c" /* the CUDA extension's file, built here without CUDA */

/* A fence is a pointer to an int: 1 once "the device" passed it. */
static int fence_ready(void *fence) { return *(int *)fence; }

static fl_block block(uintptr_t ptr, size_t bytes, int *fence) {
    fl_block b = {(void *)ptr, bytes, fence};
    return b;
}

static void test_take_reuses_a_block_of_exactly_the_size(void) {
    fl_block_cache cache = FL_BLOCK_CACHE_INIT(1 << 20);
    int passed = 1;
    fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1], got;
    CHECK(fl_block_cache_put(&cache, &(fl_block){(void *)0x1000, 512, &passed}, evicted) == 0);
    CHECK(fl_block_cache_take(&cache, 256, fence_ready, &got) == 0);
    CHECK(fl_block_cache_take(&cache, 1024, fence_ready, &got) == 0);
    CHECK(fl_block_cache_take(&cache, 512, fence_ready, &got) == 1);
    CHECK(got.ptr == (void *)0x1000 && got.bytes == 512 && got.fence == &passed);
    CHECK(fl_block_cache_take(&cache, 512, fence_ready, &got) == 0); /* taken once only */
    CHECK(cache.bytes == 0 && cache.count == 0);
}

static void test_take_skips_a_block_whose_last_use_is_not_done(void) {
    fl_block_cache cache = FL_BLOCK_CACHE_INIT(1 << 20);
    int busy = 0, done = 1;
    fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1], got;
    fl_block old = block(0x1000, 64, &done), newer = block(0x2000, 64, &busy);
    fl_block_cache_put(&cache, &old, evicted);
    fl_block_cache_put(&cache, &newer, evicted);
    CHECK(fl_block_cache_take(&cache, 64, fence_ready, &got) == 1);
    CHECK(got.ptr == (void *)0x1000); /* the newer one is still in use */
    CHECK(fl_block_cache_take(&cache, 64, fence_ready, &got) == 0);
    busy = 1;
    CHECK(fl_block_cache_take(&cache, 64, fence_ready, &got) == 1 && got.ptr == (void *)0x2000);
}

static void test_take_prefers_the_newest_ready_block(void) {
    fl_block_cache cache = FL_BLOCK_CACHE_INIT(1 << 20);
    int done = 1;
    fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1], got;
    for (uintptr_t i = 1; i <= 3; i++) {
        fl_block b = block(i * 0x1000, 64, &done);
        fl_block_cache_put(&cache, &b, evicted);
    }
    CHECK(fl_block_cache_take(&cache, 64, fence_ready, &got) == 1 && got.ptr == (void *)0x3000);
    CHECK(cache.count == 2 && cache.blocks[0].ptr == (void *)0x1000 && cache.blocks[1].ptr == (void *)0x2000);
}

static void test_put_evicts_the_oldest_past_the_slot_bound(void) {
    fl_block_cache cache = FL_BLOCK_CACHE_INIT(1 << 20);
    int done = 1;
    fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1];
    for (uintptr_t i = 1; i <= FL_BLOCK_CACHE_SLOTS; i++) {
        fl_block b = block(i, 10, &done);
        CHECK(fl_block_cache_put(&cache, &b, evicted) == 0);
    }
    fl_block b = block(99, 10, &done);
    CHECK(fl_block_cache_put(&cache, &b, evicted) == 1);
    CHECK(evicted[0].ptr == (void *)1);
    CHECK(cache.count == FL_BLOCK_CACHE_SLOTS && cache.bytes == 10 * FL_BLOCK_CACHE_SLOTS);
    CHECK(cache.blocks[FL_BLOCK_CACHE_SLOTS - 1].ptr == (void *)99);
}

static void test_put_evicts_the_oldest_past_the_byte_bound(void) {
    fl_block_cache cache = FL_BLOCK_CACHE_INIT(100);
    int done = 1;
    fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1];
    fl_block a = block(1, 40, &done), b = block(2, 40, &done), c = block(3, 70, &done);
    CHECK(fl_block_cache_put(&cache, &a, evicted) == 0);
    CHECK(fl_block_cache_put(&cache, &b, evicted) == 0);
    CHECK(fl_block_cache_put(&cache, &c, evicted) == 2); /* 150 > 100: a, then 110 > 100: b */
    CHECK(evicted[0].ptr == (void *)1 && evicted[1].ptr == (void *)2);
    CHECK(cache.count == 1 && cache.bytes == 70);
    fl_block huge = block(4, 101, &done); /* more than the bound alone: handed straight back */
    CHECK(fl_block_cache_put(&cache, &huge, evicted) == 1 && evicted[0].ptr == (void *)4);
    CHECK(cache.count == 1 && cache.bytes == 70);
}

static void test_drain_hands_back_every_block(void) {
    fl_block_cache cache = FL_BLOCK_CACHE_INIT(1 << 20);
    int done = 1;
    fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1], out[FL_BLOCK_CACHE_SLOTS];
    for (uintptr_t i = 1; i <= 3; i++) {
        fl_block b = block(i, i * 8, &done);
        fl_block_cache_put(&cache, &b, evicted);
    }
    CHECK(fl_block_cache_drain(&cache, out) == 3);
    CHECK(out[0].ptr == (void *)1 && out[2].ptr == (void *)3 && out[2].bytes == 24);
    CHECK(cache.count == 0 && cache.bytes == 0);
    CHECK(fl_block_cache_drain(&cache, out) == 0);
}

/* Threads each own a set of distinct pointers; each round puts one and takes one back. Every
 * pointer must end up either with a thread, in the cache, or evicted: exactly once. */
enum { THREADS = 4, ROUNDS = 20000, OWN = 3 };
static fl_block_cache shared = FL_BLOCK_CACHE_INIT(1 << 20);
static int always = 1;
static int seen[THREADS * OWN + 1];
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

static void *traffic(void *arg) {
    uintptr_t base = (uintptr_t)arg * OWN;
    fl_block held[OWN * 2 + FL_BLOCK_CACHE_SLOTS * 2];
    int n = 0;
    for (int i = 0; i < OWN; i++)
        held[n++] = block(base + (uintptr_t)i + 1, 32, &always);
    for (int round = 0; round < ROUNDS; round++) {
        fl_block evicted[FL_BLOCK_CACHE_SLOTS + 1];
        if (n > 0) {
            int e = fl_block_cache_put(&shared, &held[--n], evicted);
            pthread_mutex_lock(&seen_lock);
            for (int i = 0; i < e; i++)
                seen[(uintptr_t)evicted[i].ptr]++;
            pthread_mutex_unlock(&seen_lock);
        }
        fl_block got;
        if (round % 2 == 0 && n < (int)(sizeof held / sizeof *held) && fl_block_cache_take(&shared, 32, fence_ready, &got))
            held[n++] = got;
    }
    pthread_mutex_lock(&seen_lock);
    for (int i = 0; i < n; i++)
        seen[(uintptr_t)held[i].ptr]++;
    pthread_mutex_unlock(&seen_lock);
    return NULL;
}

static void test_threads_lose_and_duplicate_nothing(void) {
    pthread_t threads[THREADS];
    for (uintptr_t t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, traffic, (void *)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    fl_block out[FL_BLOCK_CACHE_SLOTS];
    int n = fl_block_cache_drain(&shared, out);
    for (int i = 0; i < n; i++)
        seen[(uintptr_t)out[i].ptr]++;
    for (int p = 1; p <= THREADS * OWN; p++)
        CHECK(seen[p] == 1);
}

int main(void) {
    RUN(test_take_reuses_a_block_of_exactly_the_size);
    RUN(test_take_skips_a_block_whose_last_use_is_not_done);
    RUN(test_take_prefers_the_newest_ready_block);
    RUN(test_put_evicts_the_oldest_past_the_slot_bound);
    RUN(test_put_evicts_the_oldest_past_the_byte_bound);
    RUN(test_drain_hands_back_every_block);
    RUN(test_threads_lose_and_duplicate_nothing);
    return check_failures != 0;
}
