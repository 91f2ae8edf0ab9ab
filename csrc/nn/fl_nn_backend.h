/* fl_nn_backend.h - the operations a model core needs from a device: memory, matrix
 * products, and the elementwise parts of forward, backward, loss and optimizer steps.
 *
 * fl_nn (the model core) is written once against this table; the CPU backend
 * (fl_nn_cpu.c, BLAS through fl_blas) and the CUDA backend (cuda/fl_cuda_nn.cu, cuBLAS and
 * kernels) implement it. The CUDA table reaches the core through a PyCapsule, so the core
 * never links CUDA. Plain C, no Python.
 *
 * Conventions: matrices are row-major; `rows` is the batch dimension. Every pointer an op
 * takes is device memory of that backend (from `alloc`), except where an op says "host".
 * Ops are called by one thread at a time per context (the model holds its lock). An op
 * returns 0 or a negative fl_err code and then leaves a message in `error(ctx)`. Ops may
 * run asynchronously (queued on a stream); `sync` and the ops that return host values
 * (`loss`, `to_host`) wait for what was queued before them.
 */
#ifndef FL_NN_BACKEND_H
#define FL_NN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The loss functions (torch's reductions: the mean over the batch). */
typedef enum fl_nn_loss {
    FL_NN_MSE = 0,           /* mean over every element of (output - target)^2 */
    FL_NN_CROSS_ENTROPY = 1, /* mean over rows of -log softmax(output)[label]; int64 labels */
} fl_nn_loss;

/* One optimizer step's hyper-parameters for one parameter tensor (torch's semantics). */
typedef struct fl_nn_sgd_args {
    double lr, momentum, weight_decay;
    int nesterov;
    int first_step; /* the momentum buffer starts as the first gradient, as in torch */
} fl_nn_sgd_args;

typedef struct fl_nn_adam_args {
    double lr, beta1, beta2, eps, weight_decay;
    int decoupled; /* AdamW: p *= 1 - lr * weight_decay instead of adding it to the gradient */
    int64_t step;  /* 1 on the first step (bias corrections use it) */
} fl_nn_adam_args;

typedef struct fl_nn_backend {
    const char *name; /* "cpu", "cuda" */
    int host_memory;  /* 1 when the device's memory is the host's (the CPU): no staging copies */

    /* Makes a context for device `device` (ignored by the CPU). Returns 0 and sets *ctx,
     * or a negative fl_err with a message in *why (a static or thread-local string). */
    int (*open)(int device, void **ctx, const char **why);
    void (*close)(void *ctx);
    /* The message of the last failed op on this context. */
    const char *(*error)(void *ctx);
    /* Waits for everything queued on the context. */
    int (*sync)(void *ctx);

    /* Memory of `bytes` (>0) on the device, aligned for any dtype; NULL when out of memory
     * (with a message in error(ctx)). free(NULL) is a no-op. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *ptr);
    /* Copies between host memory and device memory, and within the device. to_host waits
     * for the copy; the others may be queued. */
    int (*to_device)(void *ctx, void *dst, const void *host_src, size_t bytes);
    int (*to_host)(void *ctx, void *host_dst, const void *src, size_t bytes);
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);

    /* c = alpha * op(a) @ op(b) + beta * c with op(x) = x or x^T (trans_*), c being m x n,
     * op(a) m x k and op(b) k x n; lda/ldb/ldc are row strides in elements. */
    int (*gemm)(void *ctx, fl_dtype dtype, int trans_a, int trans_b, int64_t m, int64_t n,
                int64_t k, double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                double beta, void *c, int64_t ldc);
    /* Every row of out (rows x cols) = row (cols). */
    int (*fill_rows)(void *ctx, fl_dtype dtype, void *out, int64_t rows, int64_t cols,
                     const void *row);
    /* out (cols) = the sum of the rows of in (rows x cols). */
    int (*sum_rows)(void *ctx, fl_dtype dtype, const void *in, int64_t rows, int64_t cols,
                    void *out);
    /* out = max(in, 0) over n elements (out may be in). */
    int (*relu)(void *ctx, fl_dtype dtype, const void *in, void *out, int64_t n);
    /* grad_in = grad_out where out > 0, else 0 (grad_in may be grad_out). */
    int (*relu_backward)(void *ctx, fl_dtype dtype, const void *out, const void *grad_out,
                         void *grad_in, int64_t n);
    /* The loss of output (rows x cols) against target (rows x cols of dtype for MSE; rows
     * int64 labels for cross-entropy) into *host_loss, and, when grad is not NULL, its
     * gradient with respect to output into grad (rows x cols). A label outside [0, cols)
     * fails with FL_EINVAL naming the row and the label, before grad is written. Waits for
     * the result. */
    int (*loss)(void *ctx, fl_dtype dtype, fl_nn_loss kind, const void *output, const void *target,
                int64_t rows, int64_t cols, void *grad, double *host_loss);
    /* One SGD step on n parameters: param and momentum buffer (NULL without momentum). */
    int (*sgd)(void *ctx, fl_dtype dtype, void *param, const void *grad, void *momentum_buf,
               int64_t n, const fl_nn_sgd_args *args);
    /* One Adam step on n parameters with its two moment buffers. */
    int (*adam)(void *ctx, fl_dtype dtype, void *param, const void *grad, void *exp_avg,
                void *exp_avg_sq, int64_t n, const fl_nn_adam_args *args);
    /* Sets `bytes` bytes to zero. */
    int (*zero)(void *ctx, void *ptr, size_t bytes);
    /* Makes the context's later ops wait for what is queued now on a foreign stream (a
     * cudaStream_t given as an integer, as in __cuda_array_interface__'s "stream"), without
     * blocking the host. NULL on backends without streams. */
    int (*wait_stream)(void *ctx, uintptr_t stream);
} fl_nn_backend;

/* The name of the capsule that carries a `const fl_nn_backend *` between extensions. */
#define FL_NN_BACKEND_CAPSULE "fastloop.nn_backend"

#ifdef __cplusplus
}
#endif

#endif
