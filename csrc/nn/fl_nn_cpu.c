/* fl_nn_cpu.c - the CPU backend of the model core: matrix products through fl_blas, the
 * elementwise parts (bias, ReLU, losses, optimizer updates) as plain C loops the compiler
 * vectorizes. Semantics are torch's (see fl_nn_backend.h); the CUDA backend matches them. */
#include "nn/fl_nn_cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/fl_blas.h"
#include "base/fl_error.h"

/* The CPU needs no per-model state beyond the last error message. */
typedef struct {
    char error[512];
} cpu_ctx;

static int fail(void *ctx, int err, const char *message) {
    snprintf(((cpu_ctx *)ctx)->error, sizeof ((cpu_ctx *)ctx)->error, "%s", message);
    return err;
}

static int check_dtype(void *ctx, fl_dtype dtype) {
    if (dtype == FL_FLOAT32 || dtype == FL_FLOAT64)
        return FL_OK;
    return fail(ctx, FL_EINVAL, "the CPU backend computes in float32 or float64");
}

static int cpu_open(int device, void **ctx, const char **why) {
    (void)device;
    *ctx = calloc(1, sizeof(cpu_ctx));
    if (*ctx == NULL) {
        *why = "out of memory";
        return FL_ENOMEM;
    }
    return FL_OK;
}

static void cpu_close(void *ctx) { free(ctx); }
static const char *cpu_error(void *ctx) { return ((cpu_ctx *)ctx)->error; }
static int cpu_sync(void *ctx) { return (void)ctx, FL_OK; }

static void *cpu_alloc(void *ctx, size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
    void *ptr = rounded >= bytes ? aligned_alloc(64, rounded) : NULL;
    if (ptr == NULL)
        snprintf(((cpu_ctx *)ctx)->error, sizeof ((cpu_ctx *)ctx)->error,
                 "cannot allocate %zu bytes", bytes);
    return ptr;
}

static void cpu_free(void *ctx, void *ptr) { (void)ctx, free(ptr); }

static int cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes)
        memmove(dst, src, bytes);
    return FL_OK;
}

static int cpu_zero(void *ctx, void *ptr, size_t bytes) {
    (void)ctx;
    memset(ptr, 0, bytes);
    return FL_OK;
}

static int cpu_gemm(void *ctx, fl_dtype dtype, int trans_a, int trans_b, int64_t m, int64_t n,
                    int64_t k, double alpha, const void *a, int64_t lda, const void *b,
                    int64_t ldb, double beta, void *c, int64_t ldc) {
    int rc = fl_blas_gemm(dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return rc == FL_OK ? rc : fail(ctx, rc, fl_error_detail());
}

/* The elementwise kernels, once per element type T (suffix S). */
#define FL_NN_CPU_KERNELS(T, S, SQRT)                                                                \
    static void fill_rows_##S(T *out, int64_t rows, int64_t cols, const T *row) {                \
        for (int64_t r = 0; r < rows; r++)                                                       \
            memcpy(out + r * cols, row, (size_t)cols * sizeof(T));                               \
    }                                                                                            \
    static void sum_rows_##S(const T *in, int64_t rows, int64_t cols, T *out) {                  \
        memset(out, 0, (size_t)cols * sizeof(T));                                                \
        for (int64_t r = 0; r < rows; r++)                                                       \
            for (int64_t c = 0; c < cols; c++)                                                   \
                out[c] += in[r * cols + c];                                                      \
    }                                                                                            \
    static void relu_##S(const T *in, T *out, int64_t n) {                                       \
        for (int64_t i = 0; i < n; i++)                                                          \
            out[i] = in[i] > 0 ? in[i] : 0;                                                      \
    }                                                                                            \
    static void relu_backward_##S(const T *out, const T *grad_out, T *grad_in, int64_t n) {      \
        for (int64_t i = 0; i < n; i++)                                                          \
            grad_in[i] = out[i] > 0 ? grad_out[i] : 0;                                           \
    }                                                                                            \
    static double mse_##S(const T *out, const T *target, int64_t n, T *grad) {                   \
        double sum = 0;                                                                          \
        T scale = (T)(2.0 / (double)n);                                                          \
        for (int64_t i = 0; i < n; i++) {                                                        \
            T diff = out[i] - target[i];                                                         \
            sum += (double)diff * diff;                                                          \
            if (grad)                                                                            \
                grad[i] = scale * diff;                                                          \
        }                                                                                        \
        return sum / (double)n;                                                                  \
    }                                                                                            \
    /* Mean of logsumexp(row) - row[label]; grad = (softmax - onehot) / rows. */                 \
    static double cross_entropy_##S(const T *out, const int64_t *labels, int64_t rows,           \
                                    int64_t cols, T *grad) {                                     \
        double total = 0;                                                                        \
        for (int64_t r = 0; r < rows; r++) {                                                     \
            const T *row = out + r * cols;                                                       \
            T max = row[0];                                                                      \
            for (int64_t c = 1; c < cols; c++)                                                   \
                max = row[c] > max ? row[c] : max;                                               \
            double sum = 0;                                                                      \
            for (int64_t c = 0; c < cols; c++)                                                   \
                sum += exp((double)(row[c] - max));                                              \
            double log_sum = log(sum);                                                           \
            total += log_sum - (double)(row[labels[r]] - max);                                   \
            if (grad) {                                                                          \
                T *g = grad + r * cols;                                                          \
                for (int64_t c = 0; c < cols; c++)                                               \
                    g[c] = (T)(exp((double)(row[c] - max) - log_sum) / (double)rows);            \
                g[labels[r]] -= (T)(1.0 / (double)rows);                                         \
            }                                                                                    \
        }                                                                                        \
        return total / (double)rows;                                                             \
    }                                                                                            \
    static void sgd_##S(T *p, const T *grad, T *buf, int64_t n, const fl_nn_sgd_args *a) {       \
        const T lr = (T)a->lr, momentum = (T)a->momentum, wd = (T)a->weight_decay;               \
        for (int64_t i = 0; i < n; i++) {                                                        \
            T g = grad[i];                                                                       \
            if (wd != 0)                                                                         \
                g += wd * p[i];                                                                  \
            if (buf) {                                                                           \
                buf[i] = a->first_step ? g : momentum * buf[i] + g;                              \
                g = a->nesterov ? g + momentum * buf[i] : buf[i];                                \
            }                                                                                    \
            p[i] -= lr * g;                                                                      \
        }                                                                                        \
    }                                                                                            \
    static void adam_##S(T *p, const T *grad, T *m, T *v, int64_t n, const fl_nn_adam_args *a) { \
        const T beta1 = (T)a->beta1, beta2 = (T)a->beta2, wd = (T)a->weight_decay;               \
        const T eps = (T)a->eps, decay = (T)(1.0 - a->lr * a->weight_decay);                     \
        const T step_size = (T)(a->lr / (1.0 - pow(a->beta1, (double)a->step)));                 \
        const T bc2_sqrt = (T)sqrt(1.0 - pow(a->beta2, (double)a->step));                        \
        for (int64_t i = 0; i < n; i++) {                                                        \
            T g = grad[i];                                                                       \
            if (a->decoupled)                                                                    \
                p[i] *= decay;                                                                   \
            else if (wd != 0)                                                                    \
                g += wd * p[i];                                                                  \
            m[i] = beta1 * m[i] + (1 - beta1) * g;                                               \
            v[i] = beta2 * v[i] + (1 - beta2) * g * g;                                           \
            p[i] -= step_size * m[i] / (SQRT(v[i]) / bc2_sqrt + eps);                            \
        }                                                                                        \
    }

FL_NN_CPU_KERNELS(float, f32, sqrtf)
FL_NN_CPU_KERNELS(double, f64, sqrt)

/* Calls NAME_f32 or NAME_f64 with the pointers cast to the element type. */
#define DISPATCH(dtype, call32, call64) ((dtype) == FL_FLOAT32 ? (call32) : (call64))

static int cpu_fill_rows(void *ctx, fl_dtype dtype, void *out, int64_t rows, int64_t cols,
                         const void *row) {
    int rc = check_dtype(ctx, dtype);
    if (rc == FL_OK)
        DISPATCH(dtype, fill_rows_f32(out, rows, cols, row), fill_rows_f64(out, rows, cols, row));
    return rc;
}

static int cpu_sum_rows(void *ctx, fl_dtype dtype, const void *in, int64_t rows, int64_t cols,
                        void *out) {
    int rc = check_dtype(ctx, dtype);
    if (rc == FL_OK)
        DISPATCH(dtype, sum_rows_f32(in, rows, cols, out), sum_rows_f64(in, rows, cols, out));
    return rc;
}

static int cpu_relu(void *ctx, fl_dtype dtype, const void *in, void *out, int64_t n) {
    int rc = check_dtype(ctx, dtype);
    if (rc == FL_OK)
        DISPATCH(dtype, relu_f32(in, out, n), relu_f64(in, out, n));
    return rc;
}

static int cpu_relu_backward(void *ctx, fl_dtype dtype, const void *out, const void *grad_out,
                             void *grad_in, int64_t n) {
    int rc = check_dtype(ctx, dtype);
    if (rc == FL_OK)
        DISPATCH(dtype, relu_backward_f32(out, grad_out, grad_in, n),
                 relu_backward_f64(out, grad_out, grad_in, n));
    return rc;
}

static int cpu_loss(void *ctx, fl_dtype dtype, fl_nn_loss kind, const void *output,
                    const void *target, int64_t rows, int64_t cols, void *grad, double *loss) {
    int rc = check_dtype(ctx, dtype);
    if (rc != FL_OK)
        return rc;
    if (kind == FL_NN_MSE) {
        *loss = DISPATCH(dtype, mse_f32(output, target, rows * cols, grad),
                         mse_f64(output, target, rows * cols, grad));
        return FL_OK;
    }
    if (kind != FL_NN_CROSS_ENTROPY)
        return fail(ctx, FL_EINVAL, "unknown loss");
    const int64_t *labels = target;
    for (int64_t r = 0; r < rows; r++) {
        if (labels[r] < 0 || labels[r] >= cols) {
            char message[128];
            snprintf(message, sizeof message, "label %lld at row %lld is outside [0, %lld)",
                     (long long)labels[r], (long long)r, (long long)cols);
            return fail(ctx, FL_EINVAL, message);
        }
    }
    *loss = DISPATCH(dtype, cross_entropy_f32(output, labels, rows, cols, grad),
                     cross_entropy_f64(output, labels, rows, cols, grad));
    return FL_OK;
}

static int cpu_sgd(void *ctx, fl_dtype dtype, void *param, const void *grad, void *buf,
                   int64_t n, const fl_nn_sgd_args *args) {
    int rc = check_dtype(ctx, dtype);
    if (rc == FL_OK)
        DISPATCH(dtype, sgd_f32(param, grad, buf, n, args), sgd_f64(param, grad, buf, n, args));
    return rc;
}

static int cpu_adam(void *ctx, fl_dtype dtype, void *param, const void *grad, void *exp_avg,
                    void *exp_avg_sq, int64_t n, const fl_nn_adam_args *args) {
    int rc = check_dtype(ctx, dtype);
    if (rc == FL_OK)
        DISPATCH(dtype, adam_f32(param, grad, exp_avg, exp_avg_sq, n, args),
                 adam_f64(param, grad, exp_avg, exp_avg_sq, n, args));
    return rc;
}

static const fl_nn_backend CPU_BACKEND = {
    .name = "cpu",
    .host_memory = 1,
    .open = cpu_open,
    .close = cpu_close,
    .error = cpu_error,
    .sync = cpu_sync,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .gemm = cpu_gemm,
    .fill_rows = cpu_fill_rows,
    .sum_rows = cpu_sum_rows,
    .relu = cpu_relu,
    .relu_backward = cpu_relu_backward,
    .loss = cpu_loss,
    .sgd = cpu_sgd,
    .adam = cpu_adam,
    .zero = cpu_zero,
    .wait_stream = NULL,
};

const fl_nn_backend *fl_nn_cpu_backend(void) { return &CPU_BACKEND; }
