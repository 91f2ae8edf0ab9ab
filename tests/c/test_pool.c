/* test_pool.c - fl_pool: every index runs exactly once, for one caller and for several
 * callers sharing one pool at the same time, and the pool shuts down cleanly. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "check.h"
#include "base/fl_error.h"
#include "base/fl_pool.h"

typedef struct visits {
    atomic_int *count; /* per index */
    atomic_int calls;
} visits;

static void visit_range(void *ctx, size_t begin, size_t end) {
    visits *v = ctx;
    atomic_fetch_add(&v->calls, 1);
    for (size_t i = begin; i < end; i++)
        atomic_fetch_add_explicit(&v->count[i], 1, memory_order_relaxed);
}

static int each_visited_once(visits *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (atomic_load(&v->count[i]) != 1)
            return 0;
    return 1;
}

static void run_and_check(fl_pool *pool, int threads, size_t n, size_t grain) {
    visits v = {calloc(n ? n : 1, sizeof(atomic_int)), 0};
    fl_pool_run(pool, threads, n, grain, visit_range, &v);
    CHECK(each_visited_once(&v, n));
    free(v.count);
}

static void test_every_index_runs_once(void) {
    fl_pool *pool;
    CHECK(fl_pool_new(&pool) == FL_OK);
    size_t sizes[] = {0, 1, 7, 100, 4096, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int threads = 1; threads <= 5; threads++)
            for (size_t grain = 1; grain <= 1000; grain *= 10)
                run_and_check(pool, threads, sizes[s], grain);
    CHECK(fl_pool_workers(pool) == 4);
    fl_pool_free(pool);
}

static void test_serial_paths_need_no_pool(void) {
    run_and_check(NULL, 4, 1000, 1);
    fl_pool *pool;
    CHECK(fl_pool_new(&pool) == FL_OK);
    run_and_check(pool, 1, 1000, 1);
    run_and_check(pool, 8, 10, 100); /* n <= grain: runs on the caller */
    CHECK(fl_pool_workers(pool) == 0);
    fl_pool_free(pool);
}

typedef struct caller_arg {
    fl_pool *pool;
    int ok;
} caller_arg;

static void *caller_main(void *arg) {
    caller_arg *c = arg;
    c->ok = 1;
    enum { N = 2000 };
    for (int round = 0; round < 300; round++) {
        visits v = {calloc(N, sizeof(atomic_int)), 0};
        fl_pool_run(c->pool, 3, N, 16, visit_range, &v);
        c->ok &= each_visited_once(&v, N);
        free(v.count);
    }
    return NULL;
}

static void test_concurrent_callers_share_one_pool(void) {
    fl_pool *pool;
    CHECK(fl_pool_new(&pool) == FL_OK);
    enum { CALLERS = 4 };
    pthread_t threads[CALLERS];
    caller_arg args[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        args[i] = (caller_arg){pool, 0};
        pthread_create(&threads[i], NULL, caller_main, &args[i]);
    }
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(threads[i], NULL);
        CHECK(args[i].ok);
    }
    fl_pool_free(pool);
}

static void test_free_without_use_and_null(void) {
    fl_pool *pool;
    CHECK(fl_pool_new(&pool) == FL_OK);
    fl_pool_free(pool);
    fl_pool_free(NULL);
}

int main(void) {
    RUN(test_every_index_runs_once);
    RUN(test_serial_paths_need_no_pool);
    RUN(test_concurrent_callers_share_one_pool);
    RUN(test_free_without_use_and_null);
    return check_failures != 0;
}
