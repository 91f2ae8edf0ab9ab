/* fl_cuda_nn.cu - the CUDA implementation of fl_nn_backend (csrc/fl_nn_backend.h): a
 * context per model on one device, with its own non-blocking stream, a cuBLAS handle bound
 * to that stream, a stream-ordered memory pool, and the scratch a loss needs.
 *
 * Every op makes the context's device current for the call and gives the calling thread its
 * own device back on return (fl_cuda_device_scope: Python threads differ, torch's current
 * device must not change under it), queues
 * its work on the context's stream, and checks every CUDA and cuBLAS return code; a failure
 * leaves "<call>: <error string>" in error(ctx) and returns FL_ENOMEM (out of memory),
 * FL_EINVAL (bad arguments) or FL_ECUDA (any other CUDA or cuBLAS failure).
 */
#include "fl_cuda.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/fl_error.h"
#include "fl_cublas.h"
#include "fl_cuda_device.h"
#include "fl_cuda_nn_kernels.h"

typedef struct nn_ctx {
    int device;
    cudaStream_t stream;
    cudaMemPool_t pool; /* NULL where the device has no memory pools: plain cudaMalloc */
    fl_cublas_handle blas;
    cudaEvent_t wait_event;   /* reused by wait_stream */
    nn_loss_scratch *scratch; /* device */
    double *partials;         /* device, NN_PARTIALS */
    nn_loss_scratch *host;    /* pinned host copy of *scratch */
    char error[512];
} nn_ctx;

/* Records a printf-style message and returns err. */
__attribute__((format(printf, 3, 4))) static int fail(nn_ctx *c, int err, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, args);
    va_end(args);
    return err;
}

/* Records "<what>: <CUDA error string>" and returns the fl_err for it. */
static int cuda_fail(nn_ctx *c, cudaError_t rc, const char *what) {
    (void)cudaGetLastError(); /* a non-sticky error must not resurface at the next launch */
    fail(c, FL_ECUDA, "%s: %s", what, cudaGetErrorString(rc));
    return rc == cudaErrorMemoryAllocation ? FL_ENOMEM : FL_ECUDA;
}

#define CUDA_CHECK(c, call, what)                   \
    do {                                            \
        cudaError_t rc_ = (call);                   \
        if (rc_ != cudaSuccess)                     \
            return cuda_fail((c), rc_, (what));     \
    } while (0)

/* Makes the context's device current until the enclosing scope ends; fails the op when it cannot. */
#define DEVICE_SCOPE(c)                                              \
    fl_cuda_device_scope device_scope_((c)->device);                 \
    CUDA_CHECK((c), (cudaError_t)device_scope_.rc, "cudaSetDevice")

static int bad_dtype(nn_ctx *c, fl_dtype dtype) {
    return fail(c, FL_EINVAL, "the cuda backend takes float32 or float64, not dtype %d", (int)dtype);
}

/* Creates what a context holds; on failure the context is half made (close frees it). */
static int open_resources(nn_ctx *c) {
    DEVICE_SCOPE(c);
    CUDA_CHECK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    int pools = 0;
    CUDA_CHECK(c, cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, c->device),
               "cudaDeviceGetAttribute(MemoryPoolsSupported)");
    if (pools) {
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = c->device;
        CUDA_CHECK(c, cudaMemPoolCreate(&c->pool, &props), "cudaMemPoolCreate");
        unsigned long long keep = ULLONG_MAX; /* freed blocks stay cached for reuse */
        CUDA_CHECK(c, cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep),
                   "cudaMemPoolSetAttribute(ReleaseThreshold)");
    }
    const fl_cublas_api *blas = fl_cublas();
    int status = blas->create(&c->blas);
    if (status == FL_CUBLAS_STATUS_SUCCESS)
        status = blas->set_stream(c->blas, c->stream);
    if (status != FL_CUBLAS_STATUS_SUCCESS)
        return fail(c, FL_ECUDA, "cublasCreate_v2: %s", fl_cublas_status_name(status));
    CUDA_CHECK(c, cudaEventCreateWithFlags(&c->wait_event, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    CUDA_CHECK(c, cudaMalloc((void **)&c->scratch, sizeof *c->scratch), "cudaMalloc(scratch)");
    CUDA_CHECK(c, cudaMalloc((void **)&c->partials, NN_PARTIALS * sizeof(double)),
               "cudaMalloc(partials)");
    CUDA_CHECK(c, cudaMallocHost((void **)&c->host, sizeof *c->host), "cudaMallocHost");
    return 0;
}

static void nn_close(void *ctx) {
    nn_ctx *c = (nn_ctx *)ctx;
    if (c == NULL)
        return;
    fl_cuda_device_scope scope(c->device);
    if (c->stream != NULL)
        cudaStreamSynchronize(c->stream);
    if (c->blas != NULL)
        fl_cublas()->destroy(c->blas);
    cudaFree(c->scratch);
    cudaFree(c->partials);
    cudaFreeHost(c->host);
    if (c->wait_event != NULL)
        cudaEventDestroy(c->wait_event);
    if (c->stream != NULL)
        cudaStreamDestroy(c->stream);
    if (c->pool != NULL)
        cudaMemPoolDestroy(c->pool);
    (void)cudaGetLastError();
    free(c);
}

static int nn_open(int device, void **ctx, const char **why) {
    static __thread char message[640]; /* the `why` of this thread's last failed open */
    char blas_why[512];
    *ctx = NULL;
    *why = message;
    if (fl_cublas() == NULL && fl_cublas_load(NULL, blas_why, sizeof blas_why) != 0) {
        snprintf(message, sizeof message, "cuBLAS could not be loaded: %s", blas_why);
        return FL_EINVAL;
    }
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(message, sizeof message, "cudaGetDeviceCount: %s", cudaGetErrorString(rc));
        return FL_ECUDA;
    }
    if (device < 0 || device >= count) {
        snprintf(message, sizeof message, "CUDA device %d does not exist (%d device(s))", device,
                 count);
        return FL_EINVAL;
    }
    nn_ctx *c = (nn_ctx *)calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(message, sizeof message, "out of host memory for a CUDA context");
        return FL_ENOMEM;
    }
    c->device = device;
    int err = open_resources(c);
    if (err != 0) {
        snprintf(message, sizeof message, "%s", c->error);
        nn_close(c);
        return err;
    }
    *ctx = c;
    return 0;
}

void *fl_cuda_nn_bare_context(int device) {
    nn_ctx *c = (nn_ctx *)calloc(1, sizeof *c);
    if (c != NULL)
        c->device = device;
    return c;
}

static const char *nn_error(void *ctx) { return ((nn_ctx *)ctx)->error; }

static int nn_sync(void *ctx) {
    nn_ctx *c = (nn_ctx *)ctx;
    DEVICE_SCOPE(c);
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return 0;
}

static void *nn_alloc(void *ctx, size_t bytes) {
    nn_ctx *c = (nn_ctx *)ctx;
    void *ptr = NULL;
    fl_cuda_device_scope scope(c->device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = c->pool ? cudaMallocFromPoolAsync(&ptr, bytes, c->pool, c->stream)
                     : cudaMalloc(&ptr, bytes);
    if (rc == cudaSuccess)
        return ptr;
    char what[96];
    snprintf(what, sizeof what, "%s(%zu bytes)", c->pool ? "cudaMallocFromPoolAsync" : "cudaMalloc",
             bytes);
    cuda_fail(c, rc, what);
    return NULL;
}

/* Stream-ordered: the block returns to the pool once the context's queued work is done. */
static void nn_free(void *ctx, void *ptr) {
    nn_ctx *c = (nn_ctx *)ctx;
    if (ptr == NULL)
        return;
    fl_cuda_device_scope scope(c->device);
    if (scope.rc != 0) {
        (void)cudaGetLastError();
        return;
    }
    cudaError_t rc = c->pool ? cudaFreeAsync(ptr, c->stream) : cudaFree(ptr);
    if (rc != cudaSuccess)
        cuda_fail(c, rc, c->pool ? "cudaFreeAsync" : "cudaFree");
}

/* A pinned source could change before a queued copy reads it, so that copy is waited for;
 * a pageable one is staged by the runtime before cudaMemcpyAsync returns. */
static int nn_to_device(void *ctx, void *dst, const void *host_src, size_t bytes) {
    nn_ctx *c = (nn_ctx *)ctx;
    DEVICE_SCOPE(c);
    cudaPointerAttributes attributes;
    CUDA_CHECK(c, cudaPointerGetAttributes(&attributes, host_src), "cudaPointerGetAttributes");
    CUDA_CHECK(c, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream),
               "cudaMemcpyAsync(host to device)");
    if (attributes.type == cudaMemoryTypeHost)
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return 0;
}

static int nn_to_host(void *ctx, void *host_dst, const void *src, size_t bytes) {
    nn_ctx *c = (nn_ctx *)ctx;
    DEVICE_SCOPE(c);
    CUDA_CHECK(c, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
               "cudaMemcpyAsync(device to host)");
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return 0;
}

static int nn_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    nn_ctx *c = (nn_ctx *)ctx;
    DEVICE_SCOPE(c);
    CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream),
               "cudaMemcpyAsync(device to device)");
    return 0;
}

static int nn_zero(void *ctx, void *ptr, size_t bytes) {
    nn_ctx *c = (nn_ctx *)ctx;
    DEVICE_SCOPE(c);
    CUDA_CHECK(c, cudaMemsetAsync(ptr, 0, bytes, c->stream), "cudaMemsetAsync");
    return 0;
}

static int nn_wait_stream(void *ctx, uintptr_t stream) {
    nn_ctx *c = (nn_ctx *)ctx;
    DEVICE_SCOPE(c);
    CUDA_CHECK(c, cudaEventRecord(c->wait_event, (cudaStream_t)stream), "cudaEventRecord");
    CUDA_CHECK(c, cudaStreamWaitEvent(c->stream, c->wait_event, 0), "cudaStreamWaitEvent");
    return 0;
}

/* ---- gemm: row-major C = alpha op(A) op(B) + beta C is column-major C^T = op(B)^T op(A)^T,
 * so cuBLAS gets the operands swapped. ---- */

static int gemm_dims_fit(nn_ctx *c, const int64_t dims[6]) {
    static const char *names[6] = {"m", "n", "k", "lda", "ldb", "ldc"};
    for (int i = 0; i < 6; i++)
        if (dims[i] < 0 || dims[i] > INT_MAX)
            return fail(c, FL_EINVAL, "gemm: %s=%lld does not fit cuBLAS's int", names[i],
                        (long long)dims[i]);
    return 0;
}

static int nn_gemm(void *ctx, fl_dtype dtype, int trans_a, int trans_b, int64_t m, int64_t n,
                   int64_t k, double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                   double beta, void *cm, int64_t ldc) {
    nn_ctx *c = (nn_ctx *)ctx;
    const int64_t dims[6] = {m, n, k, lda, ldb, ldc};
    int err = gemm_dims_fit(c, dims);
    if (err != 0)
        return err;
    DEVICE_SCOPE(c);
    const fl_cublas_op op_a = trans_a ? FL_CUBLAS_OP_T : FL_CUBLAS_OP_N;
    const fl_cublas_op op_b = trans_b ? FL_CUBLAS_OP_T : FL_CUBLAS_OP_N;
    int status;
    if (dtype == FL_FLOAT32) {
        const float alpha_f = (float)alpha, beta_f = (float)beta;
        status = fl_cublas()->sgemm(c->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha_f,
                                    (const float *)b, (int)ldb, (const float *)a, (int)lda,
                                    &beta_f, (float *)cm, (int)ldc);
    } else if (dtype == FL_FLOAT64) {
        status = fl_cublas()->dgemm(c->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha,
                                    (const double *)b, (int)ldb, (const double *)a, (int)lda,
                                    &beta, (double *)cm, (int)ldc);
    } else {
        return bad_dtype(c, dtype);
    }
    if (status != FL_CUBLAS_STATUS_SUCCESS)
        return fail(c, status == 3 ? FL_ENOMEM : FL_ECUDA, "%s: %s",
                    dtype == FL_FLOAT32 ? "cublasSgemm_v2" : "cublasDgemm_v2",
                    fl_cublas_status_name(status));
    return 0;
}

/* ---- elementwise ops: one templated body, dispatched on the dtype ---- */

/* Runs `launch` for the dtype's C type T (float or double), checking the device first. */
#define DISPATCH(c, dtype, what, launch)                                       \
    do {                                                                       \
        DEVICE_SCOPE(c);                                                       \
        cudaError_t launched;                                                  \
        if ((dtype) == FL_FLOAT32) {                                           \
            typedef float T;                                                   \
            launched = (launch);                                               \
        } else if ((dtype) == FL_FLOAT64) {                                    \
            typedef double T;                                                  \
            launched = (launch);                                               \
        } else {                                                               \
            return bad_dtype((c), (dtype));                                    \
        }                                                                      \
        CUDA_CHECK((c), launched, what);                                       \
        return 0;                                                              \
    } while (0)

static int nn_fill_rows_op(void *ctx, fl_dtype dtype, void *out, int64_t rows, int64_t cols,
                           const void *row) {
    nn_ctx *c = (nn_ctx *)ctx;
    DISPATCH(c, dtype, "fill_rows kernel",
             nn_fill_rows<T>(c->stream, (T *)out, rows, cols, (const T *)row));
}

static int nn_sum_rows_op(void *ctx, fl_dtype dtype, const void *in, int64_t rows, int64_t cols,
                          void *out) {
    nn_ctx *c = (nn_ctx *)ctx;
    DISPATCH(c, dtype, "sum_rows kernel",
             nn_sum_rows<T>(c->stream, (const T *)in, rows, cols, (T *)out));
}

static int nn_relu_op(void *ctx, fl_dtype dtype, const void *in, void *out, int64_t n) {
    nn_ctx *c = (nn_ctx *)ctx;
    DISPATCH(c, dtype, "relu kernel", nn_relu<T>(c->stream, (const T *)in, (T *)out, n));
}

static int nn_relu_backward_op(void *ctx, fl_dtype dtype, const void *out, const void *grad_out,
                               void *grad_in, int64_t n) {
    nn_ctx *c = (nn_ctx *)ctx;
    DISPATCH(c, dtype, "relu_backward kernel",
             nn_relu_backward<T>(c->stream, (const T *)out, (const T *)grad_out, (T *)grad_in, n));
}

static int nn_sgd_op(void *ctx, fl_dtype dtype, void *param, const void *grad, void *momentum_buf,
                     int64_t n, const fl_nn_sgd_args *a) {
    nn_ctx *c = (nn_ctx *)ctx;
    if (a->momentum != 0 && momentum_buf == NULL)
        return fail(c, FL_EINVAL, "sgd: momentum %g needs a momentum buffer", a->momentum);
    DISPATCH(c, dtype, "sgd kernel",
             nn_sgd<T>(c->stream, (T *)param, (const T *)grad, (T *)momentum_buf, n, a->lr,
                       a->momentum, a->weight_decay, a->nesterov, a->first_step));
}

static int nn_adam_op(void *ctx, fl_dtype dtype, void *param, const void *grad, void *exp_avg,
                      void *exp_avg_sq, int64_t n, const fl_nn_adam_args *a) {
    nn_ctx *c = (nn_ctx *)ctx;
    if (a->step < 1)
        return fail(c, FL_EINVAL, "adam: step must be >= 1, not %lld", (long long)a->step);
    DISPATCH(c, dtype, "adam kernel",
             nn_adam<T>(c->stream, (T *)param, (const T *)grad, (T *)exp_avg, (T *)exp_avg_sq, n,
                        a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->decoupled,
                        a->step));
}

/* ---- loss: kernels, then one copy of the scratch to pinned memory, then a wait ---- */

static int queue_loss(nn_ctx *c, fl_dtype dtype, fl_nn_loss kind, const void *output,
                      const void *target, int64_t rows, int64_t cols, void *grad) {
    if (kind == FL_NN_MSE)
        DISPATCH(c, dtype, "mse kernels",
                 nn_mse<T>(c->stream, (const T *)output, (const T *)target, rows * cols, (T *)grad,
                           c->partials, c->scratch));
    DISPATCH(c, dtype, "cross_entropy kernels",
             nn_cross_entropy<T>(c->stream, (const T *)output, (const int64_t *)target, rows,
                                 cols, (T *)grad, c->partials, c->scratch));
}

static int nn_loss(void *ctx, fl_dtype dtype, fl_nn_loss kind, const void *output,
                   const void *target, int64_t rows, int64_t cols, void *grad, double *host_loss) {
    nn_ctx *c = (nn_ctx *)ctx;
    if (kind != FL_NN_MSE && kind != FL_NN_CROSS_ENTROPY)
        return fail(c, FL_EINVAL, "unknown loss %d", (int)kind);
    if (rows <= 0 || cols <= 0)
        return fail(c, FL_EINVAL, "loss of an empty output (%lld x %lld)", (long long)rows,
                    (long long)cols);
    DEVICE_SCOPE(c); /* for the copies after the kernels too */
    int err = queue_loss(c, dtype, kind, output, target, rows, cols, grad);
    if (err != 0)
        return err;
    CUDA_CHECK(c, cudaMemcpyAsync(c->host, c->scratch, sizeof *c->host, cudaMemcpyDeviceToHost,
                                  c->stream),
               "cudaMemcpyAsync(loss to host)");
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    if (kind == FL_NN_CROSS_ENTROPY && c->host->bad_row != ULLONG_MAX) {
        const int64_t row = (int64_t)c->host->bad_row;
        CUDA_CHECK(c, cudaMemcpy(&c->host->bad_label, (const int64_t *)target + row,
                                 sizeof(int64_t), cudaMemcpyDeviceToHost),
                   "cudaMemcpy(label to host)");
        return fail(c, FL_EINVAL, "label %lld at row %lld is outside [0, %lld)",
                    (long long)c->host->bad_label, (long long)row, (long long)cols);
    }
    *host_loss = c->host->loss;
    return 0;
}

/* Filled by name, so the table survives fields being added to fl_nn_backend. */
static fl_nn_backend make_backend(void) {
    fl_nn_backend b = {};
    b.name = "cuda";
    b.host_memory = 0;
    b.open = nn_open;
    b.close = nn_close;
    b.error = nn_error;
    b.sync = nn_sync;
    b.alloc = nn_alloc;
    b.free = nn_free;
    b.to_device = nn_to_device;
    b.to_host = nn_to_host;
    b.copy = nn_copy;
    b.gemm = nn_gemm;
    b.fill_rows = nn_fill_rows_op;
    b.sum_rows = nn_sum_rows_op;
    b.relu = nn_relu_op;
    b.relu_backward = nn_relu_backward_op;
    b.loss = nn_loss;
    b.sgd = nn_sgd_op;
    b.adam = nn_adam_op;
    b.zero = nn_zero;
    b.wait_stream = nn_wait_stream;
    return b;
}

const fl_nn_backend *fl_cuda_nn_backend(void) {
    static const fl_nn_backend backend = make_backend(); /* C++: initialized once, thread-safe */
    return &backend;
}
