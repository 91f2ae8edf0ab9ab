/* fl_blas.h - matrix products through a maintained BLAS found at run time.
 *
 * fastloop does not link a BLAS: the Python layer finds one (an explicit FASTLOOP_BLAS,
 * the scipy-openblas32 wheel, the OpenBLAS that NumPy's wheel bundles, a system CBLAS) and
 * hands its path to fl_blas_load(), which dlopens it and picks the CBLAS flavour by the
 * symbols it exports: plain `cblas_sgemm` (LP64), scipy-openblas's prefixed
 * `scipy_cblas_sgemm` (LP64) or `scipy_cblas_sgemm64_` (ILP64), or `cblas_sgemm64_`
 * (ILP64). So NumPy stays the only runtime dependency and the GEMM is OpenBLAS's (or
 * MKL's, BLIS's...), never a loop of ours.
 */
#ifndef FL_BLAS_H
#define FL_BLAS_H

#include <stdint.h>

#include "base/fl_dtype.h"

/* Loads the BLAS at `path` (a file name dlopen resolves, or a full path) unless one is
 * already loaded. Returns 0, or FL_EINVAL with a detail naming the path and what is
 * missing (dlerror(), or "no cblas_sgemm/scipy_cblas_sgemm... symbol"). Thread-safe. */
int fl_blas_load(const char *path);

/* 1 once a BLAS is loaded. */
int fl_blas_loaded(void);

/* "libscipy_openblas64_-....so (scipy_cblas_*64_, 64-bit ints)"; "" before loading. */
const char *fl_blas_describe(void);

/* Sets the BLAS's own thread count where it exports a setter (OpenBLAS); returns 0, or
 * FL_EINVAL when the loaded BLAS has none. Affects every user of that library in the
 * process (NumPy's matmul too, when it is the same library). */
int fl_blas_set_threads(int threads);

/* Row-major c = alpha * op(a) @ op(b) + beta * c for FLOAT32 or FLOAT64, c being m x n;
 * lda/ldb/ldc are row strides in elements. Returns 0, FL_EINVAL (no BLAS loaded, another
 * dtype, or a dimension the BLAS's integers cannot hold). */
int fl_blas_gemm(fl_dtype dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                 double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                 double beta, void *c, int64_t ldc);

#endif
