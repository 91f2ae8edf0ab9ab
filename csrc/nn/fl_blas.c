/* fl_blas.c - dlopen a CBLAS and call its sgemm/dgemm through whichever symbol flavour it
 * exports (see fl_blas.h). */
#include "nn/fl_blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/fl_dl.h"
#include "base/fl_error.h"

/* CBLAS's enum values (cblas.h): the same in every implementation. */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

typedef void (*sgemm32_fn)(int, int, int, int32_t, int32_t, int32_t, float, const float *,
                           int32_t, const float *, int32_t, float, float *, int32_t);
typedef void (*dgemm32_fn)(int, int, int, int32_t, int32_t, int32_t, double, const double *,
                           int32_t, const double *, int32_t, double, double *, int32_t);
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                           int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*dgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, double, const double *,
                           int64_t, const double *, int64_t, double, double *, int64_t);
typedef void (*set_threads_fn)(int);

/* One flavour: the symbol names and the width of its integers. */
typedef struct {
    const char *sgemm, *dgemm, *set_threads;
    int ilp64;
} blas_flavour;

static const blas_flavour FLAVOURS[] = {
    {"scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", "scipy_openblas_set_num_threads64_", 1},
    {"scipy_cblas_sgemm", "scipy_cblas_dgemm", "scipy_openblas_set_num_threads", 0},
    {"cblas_sgemm64_", "cblas_dgemm64_", "openblas_set_num_threads64_", 1},
    {"cblas_sgemm", "cblas_dgemm", "openblas_set_num_threads", 0},
};

static struct {
    pthread_mutex_t lock; /* guards loading; the pointers are read only after `loaded` */
    atomic_int loaded;
    void *sgemm, *dgemm;
    set_threads_fn set_threads;
    int ilp64;
    char description[512];
} blas = {.lock = PTHREAD_MUTEX_INITIALIZER};

int fl_blas_load(const char *path) {
    pthread_mutex_lock(&blas.lock);
    int rc = FL_OK;
    if (atomic_load_explicit(&blas.loaded, memory_order_relaxed))
        goto done;
    void *handle = fl_dl_open(path, "BLAS");
    if (handle == NULL) {
        rc = FL_EINVAL;
        goto done;
    }
    for (size_t i = 0; i < sizeof FLAVOURS / sizeof FLAVOURS[0]; i++) {
        const blas_flavour *f = &FLAVOURS[i];
        void *sgemm = dlsym(handle, f->sgemm), *dgemm = dlsym(handle, f->dgemm);
        if (sgemm == NULL || dgemm == NULL)
            continue;
        blas.sgemm = sgemm, blas.dgemm = dgemm, blas.ilp64 = f->ilp64;
        *(void **)&blas.set_threads = dlsym(handle, f->set_threads);
        snprintf(blas.description, sizeof blas.description, "%s (%s, %d-bit integers)",
                 fl_dl_base_name(path), f->sgemm, f->ilp64 ? 64 : 32);
        atomic_store_explicit(&blas.loaded, 1, memory_order_release);
        goto done; /* the handle stays open for the life of the process */
    }
    dlclose(handle);
    rc = fl_error_set(FL_EINVAL, "%s exports no CBLAS sgemm (looked for cblas_sgemm, "
                      "scipy_cblas_sgemm, their 64_ variants)", path);
done:
    pthread_mutex_unlock(&blas.lock);
    return rc;
}

int fl_blas_loaded(void) { return atomic_load_explicit(&blas.loaded, memory_order_acquire); }

const char *fl_blas_describe(void) { return fl_blas_loaded() ? blas.description : ""; }

int fl_blas_set_threads(int threads) {
    if (!fl_blas_loaded() || blas.set_threads == NULL)
        return fl_error_set(FL_EINVAL, "the loaded BLAS has no thread-count setter");
    blas.set_threads(threads < 1 ? 1 : threads);
    return FL_OK;
}

int fl_blas_gemm(fl_dtype dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                 double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                 double beta, void *c, int64_t ldc) {
    if (!fl_blas_loaded())
        return fl_error_set(FL_EINVAL, "no BLAS is loaded");
    if (dtype != FL_FLOAT32 && dtype != FL_FLOAT64)
        return fl_error_set(FL_EINVAL, "gemm takes float32 or float64, not %s", fl_dtype_name(dtype));
    if (m == 0 || n == 0)
        return FL_OK;
    int ta = trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS, tb = trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS;
    if (blas.ilp64) {
        if (dtype == FL_FLOAT32)
            ((sgemm64_fn)blas.sgemm)(CBLAS_ROW_MAJOR, ta, tb, m, n, k, (float)alpha, a, lda, b, ldb,
                                     (float)beta, c, ldc);
        else
            ((dgemm64_fn)blas.dgemm)(CBLAS_ROW_MAJOR, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta,
                                     c, ldc);
        return FL_OK;
    }
    const int64_t limit = INT32_MAX;
    if (m > limit || n > limit || k > limit || lda > limit || ldb > limit || ldc > limit)
        return fl_error_set(FL_EINVAL, "a %lld x %lld x %lld product is too large for this "
                            "BLAS's 32-bit integers", (long long)m, (long long)n, (long long)k);
    if (dtype == FL_FLOAT32)
        ((sgemm32_fn)blas.sgemm)(CBLAS_ROW_MAJOR, ta, tb, (int32_t)m, (int32_t)n, (int32_t)k,
                                 (float)alpha, a, (int32_t)lda, b, (int32_t)ldb, (float)beta, c,
                                 (int32_t)ldc);
    else
        ((dgemm32_fn)blas.dgemm)(CBLAS_ROW_MAJOR, ta, tb, (int32_t)m, (int32_t)n, (int32_t)k, alpha,
                                 a, (int32_t)lda, b, (int32_t)ldb, beta, c, (int32_t)ldc);
    return FL_OK;
}
