/* fl_cuda_nn_kernels.h - internal to cuda/ (fl_cuda_nn.cu): the kernels of the CUDA nn backend (fl_cuda_nn.cu), as launchers
 * templated on the element type (instantiated for float and double).
 *
 * Each launcher queues its kernels on `stream` and returns cudaGetLastError() after the
 * launch (an error left by an earlier call is cleared first, so it is not reported twice).
 * n == 0 queues nothing. Loss values accumulate in double.
 */
#ifndef FL_CUDA_NN_KERNELS_H
#define FL_CUDA_NN_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

/* Device scratch of one loss call; `bad_row` is UINT64_MAX unless a label is out of range. */
typedef struct nn_loss_scratch {
    double loss;
    unsigned long long bad_row; /* the first row whose label is outside [0, cols) */
    long long bad_label;        /* filled by the host from the labels once bad_row is known */
} nn_loss_scratch;

/* Per-block partial sums a loss reduction needs (the size of `partials`). */
#define NN_PARTIALS 1024

template <typename T>
cudaError_t nn_fill_rows(cudaStream_t stream, T *out, int64_t rows, int64_t cols, const T *row);
template <typename T>
cudaError_t nn_sum_rows(cudaStream_t stream, const T *in, int64_t rows, int64_t cols, T *out);
template <typename T>
cudaError_t nn_relu(cudaStream_t stream, const T *in, T *out, int64_t n);
template <typename T>
cudaError_t nn_relu_backward(cudaStream_t stream, const T *out, const T *grad_out, T *grad_in,
                             int64_t n);

/* scratch->loss = mean((output - target)^2) over n elements; grad (may be NULL) gets
 * 2 * (output - target) / n. */
template <typename T>
cudaError_t nn_mse(cudaStream_t stream, const T *output, const T *target, int64_t n, T *grad,
                   double *partials, nn_loss_scratch *scratch);

/* Sets scratch->bad_row to the first row whose label is outside [0, cols); then, only if
 * there is none, scratch->loss = mean over rows of logsumexp(row) - row[label] and grad
 * (may be NULL) = (softmax(row) - onehot(label)) / rows. Resets bad_row itself first. */
template <typename T>
cudaError_t nn_cross_entropy(cudaStream_t stream, const T *output, const int64_t *labels,
                             int64_t rows, int64_t cols, T *grad, double *partials,
                             nn_loss_scratch *scratch);

/* torch's SGD step (dampening 0); momentum_buf is used only when momentum != 0. */
template <typename T>
cudaError_t nn_sgd(cudaStream_t stream, T *param, const T *grad, T *momentum_buf, int64_t n,
                   double lr, double momentum, double weight_decay, int nesterov, int first_step);

/* torch's Adam/AdamW step (not fused, not amsgrad). */
template <typename T>
cudaError_t nn_adam(cudaStream_t stream, T *param, const T *grad, T *exp_avg, T *exp_avg_sq,
                    int64_t n, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int decoupled, int64_t step);

#endif
