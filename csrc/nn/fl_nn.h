/* fl_nn.h - the model core: a sequence of Linear and ReLU layers with its gradients,
 * losses and optimizers, on any fl_nn_backend (CPU or CUDA).
 *
 * One call runs a whole training step (forward, loss, backward, update) so the binding
 * releases the GIL once per step. A model keeps its parameters, gradients and activation
 * buffers on the backend's device; activations grow to the largest batch seen. Every
 * public call takes the model's lock, so a model may be used from several threads (calls
 * run one at a time). Parameters are numbered in the order torch.nn.Sequential lists them:
 * each Linear's weight (out x in) then its bias (out).
 */
#ifndef FL_NN_H
#define FL_NN_H

#include <stdint.h>

#include "base/fl_dtype.h"
#include "nn/fl_nn_backend.h"

typedef enum fl_nn_layer_kind { FL_NN_LINEAR = 0, FL_NN_RELU = 1 } fl_nn_layer_kind;

typedef struct fl_nn_layer_spec {
    fl_nn_layer_kind kind;
    int64_t in_features, out_features; /* Linear only */
    int bias;                          /* Linear only: 1 with a bias vector */
} fl_nn_layer_spec;

/* Where an input or output array lives: host memory, or the model's device. */
typedef struct fl_nn_array {
    void *data;
    int on_device;
} fl_nn_array;

typedef struct fl_nn_model fl_nn_model;
typedef struct fl_nn_optimizer fl_nn_optimizer;

/* Builds a model of `count` layers computing in `dtype` (FLOAT32/FLOAT64) on `device` of
 * `backend`. Parameters start at zero (set them with fl_nn_set_param). Widths must chain:
 * each Linear's in_features equals the width before it; a ReLU keeps the width. Returns 0,
 * FL_EINVAL (with a detail naming the layer), FL_ENOMEM, or the backend's open error. */
int fl_nn_model_new(const fl_nn_backend *backend, int device, fl_dtype dtype,
                    const fl_nn_layer_spec *layers, int count, fl_nn_model **out);
/* Frees the model and its device memory. Optimizers of it must be freed first. */
void fl_nn_model_free(fl_nn_model *model);

int64_t fl_nn_in_features(const fl_nn_model *model);
int64_t fl_nn_out_features(const fl_nn_model *model);
fl_dtype fl_nn_dtype(const fl_nn_model *model);

/* The number of parameter tensors, and tensor i's layer index, kind (0 weight, 1 bias),
 * shape (rows, cols; cols = 1 for a bias) and element count. */
int fl_nn_param_count(const fl_nn_model *model);
typedef struct fl_nn_param_info {
    int layer;
    int is_bias;
    int64_t rows, cols, count;
} fl_nn_param_info;
int fl_nn_param_info_get(const fl_nn_model *model, int index, fl_nn_param_info *out);

/* Copies parameter (or gradient) `index` to or from host memory of count elements. */
int fl_nn_get_param(fl_nn_model *model, int index, void *host_dst);
int fl_nn_set_param(fl_nn_model *model, int index, const void *host_src);
int fl_nn_get_grad(fl_nn_model *model, int index, void *host_dst);
int fl_nn_set_grad(fl_nn_model *model, int index, const void *host_src);
/* Copies every parameter (grad 0) or gradient (grad 1) under one lock, so a snapshot taken
 * while another thread trains holds the values of one step: host_dsts[i] for tensor i. */
int fl_nn_get_all(fl_nn_model *model, int grad, void *const *host_dsts);

/* 1 when the model's memory is the host's (CPU backend): device inputs are refused. */
int fl_nn_on_host(const fl_nn_model *model);
/* The backend's name ("cpu", "cuda"). */
const char *fl_nn_backend_name(const fl_nn_model *model);

/* Makes the model's later work wait for what is queued on a foreign CUDA stream (an
 * input written there); a no-op on backends without streams. */
int fl_nn_wait_stream(fl_nn_model *model, uintptr_t stream);

/* Inference: out (rows x out_features) = model(x (rows x in_features)). */
int fl_nn_forward(fl_nn_model *model, fl_nn_array x, int64_t rows, fl_nn_array out);

/* Forward, loss against y (rows x out_features of the model's dtype for MSE, rows int64
 * labels for cross-entropy) into *loss, and backward: the gradients replace the previous
 * ones. A bad label fails with FL_EINVAL before any gradient changes. */
int fl_nn_backward(fl_nn_model *model, fl_nn_array x, fl_nn_array y, int64_t rows,
                   fl_nn_loss kind, double *loss);

/* fl_nn_backward() then fl_nn_optimizer_step(): one training step under one lock. */
int fl_nn_train_step(fl_nn_model *model, fl_nn_optimizer *opt, fl_nn_array x, fl_nn_array y,
                     int64_t rows, fl_nn_loss kind, double *loss);

/* ---- optimizers ---- */

typedef enum fl_nn_optimizer_kind { FL_NN_SGD = 0, FL_NN_ADAM = 1 } fl_nn_optimizer_kind;

/* Hyper-parameters; SGD reads lr, momentum, weight_decay, nesterov; Adam reads lr, betas,
 * eps, weight_decay, decoupled. */
typedef struct fl_nn_hyper {
    double lr, momentum, weight_decay, beta1, beta2, eps;
    int nesterov, decoupled;
} fl_nn_hyper;

/* An optimizer over every parameter of `model`; its state buffers live on the model's
 * device and start at zero (allocated on the first step). The model must outlive it. */
int fl_nn_optimizer_new(fl_nn_model *model, fl_nn_optimizer_kind kind, const fl_nn_hyper *hyper,
                        fl_nn_optimizer **out);
void fl_nn_optimizer_free(fl_nn_optimizer *opt);

/* Applies one update from the model's current gradients. */
int fl_nn_optimizer_step(fl_nn_optimizer *opt);

/* Reads or replaces the hyper-parameters (a learning-rate schedule sets lr between steps). */
void fl_nn_optimizer_get_hyper(fl_nn_optimizer *opt, fl_nn_hyper *out);
void fl_nn_optimizer_set_hyper(fl_nn_optimizer *opt, const fl_nn_hyper *hyper);

/* Steps taken so far (Adam's bias correction uses it; SGD uses 0 vs. more for momentum). */
int64_t fl_nn_optimizer_steps(fl_nn_optimizer *opt);
void fl_nn_optimizer_set_steps(fl_nn_optimizer *opt, int64_t steps);

/* State buffers per parameter: 0 (plain SGD), 1 (SGD momentum_buffer), 2 (Adam exp_avg,
 * exp_avg_sq). Get/set copy buffer `which` of parameter `index` to or from the host;
 * get before the first step yields zeros. */
int fl_nn_optimizer_buffers(fl_nn_optimizer *opt);
int fl_nn_optimizer_get_state(fl_nn_optimizer *opt, int index, int which, void *host_dst);
int fl_nn_optimizer_set_state(fl_nn_optimizer *opt, int index, int which, const void *host_src);

#endif
