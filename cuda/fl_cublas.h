/* fl_cublas.h - cuBLAS found at run time: the few cuBLAS v2 entry points fastloop uses,
 * declared here (the toolkit may ship no cuBLAS headers) and resolved with dlopen/dlsym.
 *
 * fastloop must import where cuBLAS is absent, so nothing links it. fl_cublas_load()
 * tries, in order: the path it is given (fastloop.cuda passes the nvidia-cublas wheel's or
 * torch's copy), $FASTLOOP_CUBLAS, then libcublas.so.13, libcublas.so.12, libcublas.so.
 * Once loaded the library stays loaded for the life of the process. Thread-safe.
 */
#ifndef FL_CUBLAS_H
#define FL_CUBLAS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI of cuBLAS v2 (values from NVIDIA's cuBLAS documentation, stable since CUDA 4). */
typedef struct fl_cublas_context *fl_cublas_handle;
typedef enum fl_cublas_op { FL_CUBLAS_OP_N = 0, FL_CUBLAS_OP_T = 1 } fl_cublas_op;
enum { FL_CUBLAS_STATUS_SUCCESS = 0 };

typedef struct fl_cublas_api {
    int (*create)(fl_cublas_handle *handle);
    int (*destroy)(fl_cublas_handle handle);
    int (*set_stream)(fl_cublas_handle handle, void *stream); /* a cudaStream_t */
    int (*sgemm)(fl_cublas_handle handle, fl_cublas_op transa, fl_cublas_op transb, int m, int n,
                 int k, const float *alpha, const float *a, int lda, const float *b, int ldb,
                 const float *beta, float *c, int ldc);
    int (*dgemm)(fl_cublas_handle handle, fl_cublas_op transa, fl_cublas_op transb, int m, int n,
                 int k, const double *alpha, const double *a, int lda, const double *b, int ldb,
                 const double *beta, double *c, int ldc);
} fl_cublas_api;

/* Loads cuBLAS unless it is loaded already; `path` may be NULL (skip that candidate).
 * Returns 0, or -1 with a message naming every candidate tried and its dlerror() in
 * why[why_len]. Blocks while the dynamic loader runs. */
int fl_cublas_load(const char *path, char *why, size_t why_len);

/* The loaded entry points, or NULL before a successful fl_cublas_load(). Never fails. */
const fl_cublas_api *fl_cublas(void);

/* The file that was loaded ("" before loading). Never fails. */
const char *fl_cublas_path(void);

/* "CUBLAS_STATUS_EXECUTION_FAILED" for a status code ("CUBLAS_STATUS_UNKNOWN" otherwise).
 * Never fails; the string is static. */
const char *fl_cublas_status_name(int status);

#ifdef __cplusplus
}
#endif

#endif
