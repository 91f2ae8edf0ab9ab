/* fl_cuda_nn_kernels.cu - elementwise, reduction, loss and optimizer kernels of the CUDA nn
 * backend. Grid-stride loops over int64 indexes; 256 threads a block. */
#include "fl_cuda_nn_kernels.h"

#include <math.h>

#define THREADS 256

/* Blocks for n elements: enough to fill an H200 several times over, then grid-stride. */
static unsigned grid_for(int64_t n) {
    int64_t blocks = (n + THREADS - 1) / THREADS;
    return (unsigned)(blocks < 65535 ? blocks : 65535);
}

#define GRID_STRIDE(i, n)                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);      \
         i += (int64_t)gridDim.x * blockDim.x)

/* Clears an error an earlier runtime call left, so a launch reports only its own. */
static void clear_last_error(void) { (void)cudaGetLastError(); }

/* The sum of v over the block, valid in thread 0. blockDim.x is a multiple of 32. */
__device__ double block_sum(double v) {
    __shared__ double warp_sums[32];
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, offset);
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.0;
    if (warp == 0)
        for (int offset = 16; offset > 0; offset >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

/* Every lane of the warp gets the max / sum over the warp. */
__device__ double warp_max(double v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmax(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
__device__ double warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <typename T>
__global__ void fill_rows_kernel(T *out, int64_t rows, int64_t cols, const T *row) {
    GRID_STRIDE(i, rows * cols) out[i] = row[i % cols];
}

/* Block (32, 8): threadIdx.x picks the column, the 8 rows of threads split the rows. */
template <typename T>
__global__ void sum_rows_kernel(const T *in, int64_t rows, int64_t cols, T *out) {
    __shared__ double partial[8][33];
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double acc = 0;
    if (col < cols)
        for (int64_t r = threadIdx.y; r < rows; r += 8)
            acc += (double)in[r * cols + col];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int y = 1; y < 8; y++)
            acc += partial[y][threadIdx.x];
        out[col] = (T)acc;
    }
}

template <typename T> __global__ void relu_kernel(const T *in, T *out, int64_t n) {
    GRID_STRIDE(i, n) out[i] = in[i] > (T)0 ? in[i] : (T)0;
}

template <typename T>
__global__ void relu_backward_kernel(const T *out, const T *grad_out, T *grad_in, int64_t n) {
    GRID_STRIDE(i, n) grad_in[i] = out[i] > (T)0 ? grad_out[i] : (T)0;
}

template <typename T>
__global__ void mse_kernel(const T *output, const T *target, int64_t n, T *grad, T grad_scale,
                           double *partials) {
    double acc = 0;
    GRID_STRIDE(i, n) {
        const double d = (double)output[i] - (double)target[i];
        acc += d * d;
        if (grad != NULL)
            grad[i] = (output[i] - target[i]) * grad_scale;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = acc;
}

/* One block: scratch->loss = scale * the sum of count partials. */
__global__ void finish_kernel(const double *partials, unsigned count, double scale,
                              nn_loss_scratch *scratch) {
    double acc = 0;
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x)
        acc += partials[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0)
        scratch->loss = acc * scale;
}

__global__ void check_labels_kernel(const int64_t *labels, int64_t rows, int64_t cols,
                                    unsigned long long *bad_row) {
    GRID_STRIDE(r, rows) {
        if (labels[r] < 0 || labels[r] >= cols)
            atomicMin(bad_row, (unsigned long long)r);
    }
}

/* One warp per row (rows grid-strided over the warps); every lane of a warp walks the same
 * rows, so the shuffles see full warps. Writes nothing but a zero partial when a label was
 * bad (check_labels_kernel ran before on the same stream). */
template <typename T>
__global__ void cross_entropy_kernel(const T *output, const int64_t *labels, int64_t rows,
                                     int64_t cols, T *grad, double inv_rows,
                                     const nn_loss_scratch *scratch, double *partials) {
    const bool bad = scratch->bad_row != ~0ull;
    const unsigned lane = threadIdx.x & 31;
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    double acc = 0;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; !bad && r < rows;
         r += warps) {
        const T *x = output + r * cols;
        double m = -INFINITY, s = 0;
        for (int64_t c = lane; c < cols; c += 32)
            m = fmax(m, (double)x[c]);
        m = warp_max(m);
        for (int64_t c = lane; c < cols; c += 32)
            s += exp((double)x[c] - m);
        const double lse = m + log(warp_sum(s));
        const int64_t label = labels[r];
        if (lane == 0)
            acc += lse - (double)x[label];
        if (grad != NULL)
            for (int64_t c = lane; c < cols; c += 32)
                grad[r * cols + c] =
                    (T)((exp((double)x[c] - lse) - (c == label ? 1.0 : 0.0)) * inv_rows);
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = acc;
}

template <typename T>
__global__ void sgd_kernel(T *param, const T *grad, T *buf, int64_t n, T lr, T momentum, T wd,
                           int nesterov, int first_step) {
    GRID_STRIDE(i, n) {
        T g = grad[i] + wd * param[i];
        if (buf != NULL) {
            const T b = first_step ? g : momentum * buf[i] + g;
            buf[i] = b;
            g = nesterov ? g + momentum * b : b;
        }
        param[i] -= lr * g;
    }
}

template <typename T>
__global__ void adam_kernel(T *param, const T *grad, T *m, T *v, int64_t n, T beta1,
                            T one_minus_beta1, T beta2, T one_minus_beta2, T eps, T wd,
                            T decay, int decoupled, T step_size, T bc2_sqrt) {
    GRID_STRIDE(i, n) {
        T p = param[i], g = grad[i];
        if (decoupled)
            p *= decay;
        else
            g += wd * p;
        const T mi = beta1 * m[i] + one_minus_beta1 * g;
        const T vi = beta2 * v[i] + one_minus_beta2 * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = p - step_size * (mi / (sqrt(vi) / bc2_sqrt + eps));
    }
}

template <typename T>
cudaError_t nn_fill_rows(cudaStream_t stream, T *out, int64_t rows, int64_t cols, const T *row) {
    if (rows * cols == 0)
        return cudaSuccess;
    clear_last_error();
    fill_rows_kernel<T><<<grid_for(rows * cols), THREADS, 0, stream>>>(out, rows, cols, row);
    return cudaGetLastError();
}

template <typename T>
cudaError_t nn_sum_rows(cudaStream_t stream, const T *in, int64_t rows, int64_t cols, T *out) {
    if (cols == 0)
        return cudaSuccess;
    clear_last_error();
    const int64_t blocks = (cols + 31) / 32; /* <= 2^31 - 1 for any cols a gemm can use */
    sum_rows_kernel<T><<<(unsigned)blocks, dim3(32, 8), 0, stream>>>(in, rows, cols, out);
    return cudaGetLastError();
}

template <typename T> cudaError_t nn_relu(cudaStream_t stream, const T *in, T *out, int64_t n) {
    if (n == 0)
        return cudaSuccess;
    clear_last_error();
    relu_kernel<T><<<grid_for(n), THREADS, 0, stream>>>(in, out, n);
    return cudaGetLastError();
}

template <typename T>
cudaError_t nn_relu_backward(cudaStream_t stream, const T *out, const T *grad_out, T *grad_in,
                             int64_t n) {
    if (n == 0)
        return cudaSuccess;
    clear_last_error();
    relu_backward_kernel<T><<<grid_for(n), THREADS, 0, stream>>>(out, grad_out, grad_in, n);
    return cudaGetLastError();
}

/* Blocks for a reduction over n items: at most NN_PARTIALS (one partial each). */
static unsigned reduction_blocks(int64_t items_per_block, int64_t n) {
    int64_t blocks = (n + items_per_block - 1) / items_per_block;
    return (unsigned)(blocks < NN_PARTIALS ? (blocks > 0 ? blocks : 1) : NN_PARTIALS);
}

template <typename T>
cudaError_t nn_mse(cudaStream_t stream, const T *output, const T *target, int64_t n, T *grad,
                   double *partials, nn_loss_scratch *scratch) {
    const unsigned blocks = reduction_blocks(THREADS, n);
    clear_last_error();
    mse_kernel<T><<<blocks, THREADS, 0, stream>>>(output, target, n, grad, (T)(2.0 / (double)n),
                                                 partials);
    finish_kernel<<<1, THREADS, 0, stream>>>(partials, blocks, 1.0 / (double)n, scratch);
    return cudaGetLastError();
}

template <typename T>
cudaError_t nn_cross_entropy(cudaStream_t stream, const T *output, const int64_t *labels,
                             int64_t rows, int64_t cols, T *grad, double *partials,
                             nn_loss_scratch *scratch) {
    const unsigned blocks = reduction_blocks(THREADS / 32, rows);
    cudaError_t rc = cudaMemsetAsync(&scratch->bad_row, 0xff, sizeof scratch->bad_row, stream);
    if (rc != cudaSuccess)
        return rc;
    clear_last_error();
    check_labels_kernel<<<grid_for(rows), THREADS, 0, stream>>>(labels, rows, cols,
                                                                &scratch->bad_row);
    cross_entropy_kernel<T><<<blocks, THREADS, 0, stream>>>(output, labels, rows, cols, grad,
                                                           1.0 / (double)rows, scratch, partials);
    finish_kernel<<<1, THREADS, 0, stream>>>(partials, blocks, 1.0 / (double)rows, scratch);
    return cudaGetLastError();
}

template <typename T>
cudaError_t nn_sgd(cudaStream_t stream, T *param, const T *grad, T *momentum_buf, int64_t n,
                   double lr, double momentum, double weight_decay, int nesterov, int first_step) {
    if (n == 0)
        return cudaSuccess;
    clear_last_error();
    sgd_kernel<T><<<grid_for(n), THREADS, 0, stream>>>(param, grad, momentum != 0 ? momentum_buf : NULL,
                                                      n, (T)lr, (T)momentum, (T)weight_decay,
                                                      nesterov, first_step);
    return cudaGetLastError();
}

template <typename T>
cudaError_t nn_adam(cudaStream_t stream, T *param, const T *grad, T *exp_avg, T *exp_avg_sq,
                    int64_t n, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int decoupled, int64_t step) {
    if (n == 0)
        return cudaSuccess;
    const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
    clear_last_error();
    adam_kernel<T><<<grid_for(n), THREADS, 0, stream>>>(
        param, grad, exp_avg, exp_avg_sq, n, (T)beta1, (T)(1.0 - beta1), (T)beta2,
        (T)(1.0 - beta2), (T)eps, (T)weight_decay, (T)(1.0 - lr * weight_decay), decoupled,
        (T)(lr / bc1), (T)sqrt(bc2));
    return cudaGetLastError();
}

/* The two element types the backend supports. */
#define INSTANTIATE(T)                                                                         \
    template cudaError_t nn_fill_rows<T>(cudaStream_t, T *, int64_t, int64_t, const T *);     \
    template cudaError_t nn_sum_rows<T>(cudaStream_t, const T *, int64_t, int64_t, T *);      \
    template cudaError_t nn_relu<T>(cudaStream_t, const T *, T *, int64_t);                   \
    template cudaError_t nn_relu_backward<T>(cudaStream_t, const T *, const T *, T *, int64_t); \
    template cudaError_t nn_mse<T>(cudaStream_t, const T *, const T *, int64_t, T *, double *, \
                                   nn_loss_scratch *);                                         \
    template cudaError_t nn_cross_entropy<T>(cudaStream_t, const T *, const int64_t *, int64_t, \
                                             int64_t, T *, double *, nn_loss_scratch *);       \
    template cudaError_t nn_sgd<T>(cudaStream_t, T *, const T *, T *, int64_t, double, double,  \
                                   double, int, int);                                          \
    template cudaError_t nn_adam<T>(cudaStream_t, T *, const T *, T *, T *, int64_t, double,   \
                                    double, double, double, double, int, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
