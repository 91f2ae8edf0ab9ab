/* fl_nn.c - the model core (see fl_nn.h): layers, buffers, forward/backward on a backend. */
#include "nn/fl_nn.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_size.h"

typedef struct param {
    int layer, is_bias;
    int64_t rows, cols, count;
    void *value, *grad; /* device memory */
} param;

typedef struct layer {
    fl_nn_layer_kind kind;
    int64_t width_in, width_out;
    int weight, bias; /* parameter indices, -1 when absent */
    void *act;        /* this layer's output: rows_cap x width_out */
} layer;

struct fl_nn_model {
    const fl_nn_backend *be;
    void *ctx;
    fl_dtype dtype;
    size_t esize;
    int layer_count, param_count;
    layer *layers;
    param *params;
    int64_t in_features, out_features, max_width;
    int64_t rows_cap;     /* activation buffers hold this many rows */
    void *grad_a, *grad_b; /* ping-pong gradients of activations: rows_cap x max_width */
    void *x_stage, *y_stage; /* device copies of host inputs (device backends only) */
    pthread_mutex_t lock;
};

struct fl_nn_optimizer {
    fl_nn_model *model;
    fl_nn_optimizer_kind kind;
    fl_nn_hyper hyper;
    int64_t steps;
    void **state[2]; /* per parameter: SGD's momentum buffer; Adam's exp_avg, exp_avg_sq */
};

/* Turns a failed backend op into this thread's error detail. */
static int backend_error(fl_nn_model *m, int rc, const char *what) {
    return fl_error_set(rc, "%s on %s: %s", what, m->be->name, m->be->error(m->ctx));
}

static void *device_alloc(fl_nn_model *m, size_t bytes, int *rc) {
    void *ptr = m->be->alloc(m->ctx, bytes ? bytes : 1);
    if (ptr == NULL)
        *rc = backend_error(m, FL_ENOMEM, "allocating model memory");
    return ptr;
}

/* The bytes of a rows x cols matrix of the model's elements: 0, or FL_EOVERFLOW/FL_EINVAL
 * naming `what` when they overflow (or, in host memory, exceed the machine's memory). */
static int matrix_bytes(const fl_nn_model *m, int64_t rows, int64_t cols, const char *what, size_t *bytes) {
    size_t values;
    int rc = fl_size_mul((size_t)rows, (size_t)cols, what, &values);
    if (rc == FL_OK)
        rc = fl_size_mul(values, m->esize, what, bytes);
    return rc == FL_OK && m->be->host_memory ? fl_size_fits_memory(*bytes, what) : rc;
}

static void free_activations(fl_nn_model *m) {
    for (int i = 0; i < m->layer_count; i++) {
        m->be->free(m->ctx, m->layers[i].act);
        m->layers[i].act = NULL;
    }
    void **buffers[] = {&m->grad_a, &m->grad_b, &m->x_stage, &m->y_stage};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) {
        m->be->free(m->ctx, *buffers[i]);
        *buffers[i] = NULL;
    }
    m->rows_cap = 0;
}

/* Grows the activation buffers to hold `rows` rows. */
static int reserve_rows(fl_nn_model *m, int64_t rows) {
    if (rows <= m->rows_cap)
        return FL_OK;
    /* every buffer below is at most rows x the widest layer (8 bytes at least): checked once */
    size_t widest;
    int rc = matrix_bytes(m, rows, m->max_width > 8 ? m->max_width : 8, "a batch's activations (rows x the widest layer)",
                          &widest);
    if (rc != FL_OK)
        return rc;
    free_activations(m);
    size_t row_bytes = m->esize * (size_t)m->max_width;
    for (int i = 0; i < m->layer_count && rc == FL_OK; i++)
        m->layers[i].act = device_alloc(m, (size_t)rows * m->esize * (size_t)m->layers[i].width_out, &rc);
    if (rc == FL_OK)
        m->grad_a = device_alloc(m, (size_t)rows * row_bytes, &rc);
    if (rc == FL_OK)
        m->grad_b = device_alloc(m, (size_t)rows * row_bytes, &rc);
    if (rc == FL_OK && !m->be->host_memory) {
        m->x_stage = device_alloc(m, (size_t)rows * m->esize * (size_t)m->in_features, &rc);
        size_t y_row = m->esize * (size_t)m->out_features;
        if (rc == FL_OK)
            m->y_stage = device_alloc(m, (size_t)rows * (y_row > 8 ? y_row : 8), &rc);
    }
    if (rc != FL_OK) {
        free_activations(m);
        return rc;
    }
    m->rows_cap = rows;
    return FL_OK;
}

/* The device address of an input: itself, or a staged copy of host memory. */
static const void *on_device(fl_nn_model *m, fl_nn_array a, void *stage, size_t bytes, int *rc) {
    if (a.on_device || m->be->host_memory)
        return a.data;
    int err = m->be->to_device(m->ctx, stage, a.data, bytes);
    if (err != FL_OK) {
        *rc = backend_error(m, err, "copying an input to the device");
        return NULL;
    }
    return stage;
}

static int add_param(fl_nn_model *m, int layer_index, int is_bias, int64_t rows, int64_t cols) {
    param *p = &m->params[m->param_count];
    size_t bytes;
    int rc = matrix_bytes(m, rows, cols, "Linear(in_features, out_features)'s weights", &bytes);
    if (rc != FL_OK)
        return rc;
    *p = (param){.layer = layer_index, .is_bias = is_bias, .rows = rows, .cols = cols, .count = rows * cols};
    p->value = device_alloc(m, bytes, &rc);
    if (rc == FL_OK)
        p->grad = device_alloc(m, bytes, &rc);
    if (rc != FL_OK) {
        m->be->free(m->ctx, p->value);
        return rc;
    }
    m->param_count++; /* owns the memory now: fl_nn_model_free releases it */
    int err = m->be->zero(m->ctx, p->value, bytes);
    if (err == FL_OK)
        err = m->be->zero(m->ctx, p->grad, bytes);
    return err == FL_OK ? m->param_count - 1 : backend_error(m, err, "zeroing parameters");
}

/* Checks the layer widths chain; sets in/out/max width. */
static int check_layers(const fl_nn_layer_spec *specs, int count, int64_t *in, int64_t *out,
                        int64_t *max_width) {
    int64_t width = -1;
    for (int i = 0; i < count; i++) {
        if (specs[i].kind == FL_NN_LINEAR) {
            if (specs[i].in_features <= 0 || specs[i].out_features <= 0)
                return fl_error_set(FL_EINVAL, "layer %d: Linear(%lld, %lld) needs positive sizes", i,
                                    (long long)specs[i].in_features, (long long)specs[i].out_features);
            if (width < 0)
                *in = *max_width = width = specs[i].in_features;
            if (specs[i].in_features != width)
                return fl_error_set(FL_EINVAL, "layer %d: Linear takes %lld features but the layer "
                                    "before gives %lld", i, (long long)specs[i].in_features,
                                    (long long)width);
            width = specs[i].out_features;
            *max_width = width > *max_width ? width : *max_width;
        } else if (specs[i].kind != FL_NN_RELU) {
            return fl_error_set(FL_EINVAL, "layer %d: unknown kind %d", i, (int)specs[i].kind);
        }
    }
    if (width < 0)
        return fl_error_set(FL_EINVAL, "a model needs at least one Linear layer");
    *out = width;
    return FL_OK;
}

int fl_nn_model_new(const fl_nn_backend *backend, int device, fl_dtype dtype,
                    const fl_nn_layer_spec *specs, int count, fl_nn_model **out) {
    if (dtype != FL_FLOAT32 && dtype != FL_FLOAT64)
        return fl_error_set(FL_EINVAL, "a model computes in float32 or float64, not %s", fl_dtype_name(dtype));
    int64_t in = 0, out_width = 0, max_width = 0;
    int rc = check_layers(specs, count, &in, &out_width, &max_width);
    if (rc != FL_OK)
        return rc;
    fl_nn_model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return fl_error_set(FL_ENOMEM, "model");
    const char *why = "";
    if ((rc = backend->open(device, &m->ctx, &why)) != FL_OK) {
        free(m);
        return fl_error_set(rc, "%s device %d: %s", backend->name, device, why);
    }
    m->be = backend, m->dtype = dtype, m->esize = fl_dtype_size(dtype);
    m->in_features = in, m->out_features = out_width, m->max_width = max_width;
    pthread_mutex_init(&m->lock, NULL);
    m->layers = calloc((size_t)count, sizeof *m->layers);
    m->params = calloc((size_t)count * 2, sizeof *m->params);
    if (m->layers == NULL || m->params == NULL) {
        fl_nn_model_free(m);
        return fl_error_set(FL_ENOMEM, "model");
    }
    m->layer_count = count;
    int64_t width = in;
    for (int i = 0; i < count && rc >= 0; i++) {
        layer *l = &m->layers[i];
        *l = (layer){.kind = specs[i].kind, .width_in = width, .width_out = width, .weight = -1, .bias = -1};
        if (l->kind != FL_NN_LINEAR)
            continue;
        l->width_out = width = specs[i].out_features;
        rc = l->weight = add_param(m, i, 0, specs[i].out_features, specs[i].in_features);
        if (rc >= 0 && specs[i].bias)
            rc = l->bias = add_param(m, i, 1, specs[i].out_features, 1);
    }
    if (rc < 0) {
        fl_nn_model_free(m);
        return rc;
    }
    *out = m;
    return FL_OK;
}

void fl_nn_model_free(fl_nn_model *m) {
    if (m == NULL)
        return;
    if (m->layers)
        free_activations(m);
    for (int i = 0; i < m->param_count; i++) {
        m->be->free(m->ctx, m->params[i].value);
        m->be->free(m->ctx, m->params[i].grad);
    }
    m->be->close(m->ctx);
    pthread_mutex_destroy(&m->lock);
    free(m->layers);
    free(m->params);
    free(m);
}

int64_t fl_nn_in_features(const fl_nn_model *m) { return m->in_features; }
int64_t fl_nn_out_features(const fl_nn_model *m) { return m->out_features; }
fl_dtype fl_nn_dtype(const fl_nn_model *m) { return m->dtype; }
int fl_nn_param_count(const fl_nn_model *m) { return m->param_count; }
int fl_nn_on_host(const fl_nn_model *m) { return m->be->host_memory; }
const char *fl_nn_backend_name(const fl_nn_model *m) { return m->be->name; }

int fl_nn_param_info_get(const fl_nn_model *m, int index, fl_nn_param_info *out) {
    if (index < 0 || index >= m->param_count)
        return fl_error_set(FL_EINVAL, "parameter index %d is outside [0, %d)", index, m->param_count);
    const param *p = &m->params[index];
    *out = (fl_nn_param_info){.layer = p->layer, .is_bias = p->is_bias, .rows = p->rows, .cols = p->cols, .count = p->count};
    return FL_OK;
}

/* Copies one parameter's value or gradient between the host and the device. */
static int transfer(fl_nn_model *m, int index, int grad, int to_host, void *host) {
    if (index < 0 || index >= m->param_count)
        return fl_error_set(FL_EINVAL, "parameter index %d is outside [0, %d)", index, m->param_count);
    param *p = &m->params[index];
    void *dev = grad ? p->grad : p->value;
    size_t bytes = (size_t)p->count * m->esize;
    pthread_mutex_lock(&m->lock);
    int rc = to_host ? m->be->to_host(m->ctx, host, dev, bytes) : m->be->to_device(m->ctx, dev, host, bytes);
    if (rc == FL_OK && !to_host)
        rc = m->be->sync(m->ctx); /* the host buffer may be freed once we return */
    pthread_mutex_unlock(&m->lock);
    return rc == FL_OK ? rc : backend_error(m, rc, "copying a parameter");
}

int fl_nn_get_all(fl_nn_model *m, int grad, void *const *dsts) {
    int rc = FL_OK;
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < m->param_count && rc == FL_OK; i++) {
        param *p = &m->params[i];
        rc = m->be->to_host(m->ctx, dsts[i], grad ? p->grad : p->value, (size_t)p->count * m->esize);
    }
    pthread_mutex_unlock(&m->lock);
    return rc == FL_OK ? rc : backend_error(m, rc, "copying the parameters");
}

int fl_nn_get_param(fl_nn_model *m, int i, void *dst) { return transfer(m, i, 0, 1, dst); }
int fl_nn_set_param(fl_nn_model *m, int i, const void *src) { return transfer(m, i, 0, 0, (void *)src); }
int fl_nn_get_grad(fl_nn_model *m, int i, void *dst) { return transfer(m, i, 1, 1, dst); }
int fl_nn_set_grad(fl_nn_model *m, int i, const void *src) { return transfer(m, i, 1, 0, (void *)src); }

/* Runs the layers on x (rows x in, device memory); the output is in the last layer's act. */
static int run_forward(fl_nn_model *m, const void *x, int64_t rows) {
    const fl_nn_backend *be = m->be;
    const void *input = x;
    for (int i = 0; i < m->layer_count; i++) {
        layer *l = &m->layers[i];
        int rc;
        if (l->kind == FL_NN_RELU) {
            rc = be->relu(m->ctx, m->dtype, input, l->act, rows * l->width_out);
        } else {
            const param *w = &m->params[l->weight];
            rc = l->bias >= 0 ? be->fill_rows(m->ctx, m->dtype, l->act, rows, l->width_out, m->params[l->bias].value) : FL_OK;
            if (rc == FL_OK) /* act = input @ W^T (+ the bias rows already there) */
                rc = be->gemm(m->ctx, m->dtype, 0, 1, rows, l->width_out, l->width_in, 1.0, input,
                              l->width_in, w->value, l->width_in, l->bias >= 0 ? 1.0 : 0.0, l->act, l->width_out);
        }
        if (rc != FL_OK)
            return backend_error(m, rc, l->kind == FL_NN_RELU ? "relu" : "linear forward");
        input = l->act;
    }
    return FL_OK;
}

/* Back-propagates the gradient in m->grad_a (rows x out) through every layer. */
static int run_backward(fl_nn_model *m, const void *x, int64_t rows) {
    const fl_nn_backend *be = m->be;
    void *grad = m->grad_a, *spare = m->grad_b;
    for (int i = m->layer_count - 1; i >= 0; i--) {
        layer *l = &m->layers[i];
        const void *input = i > 0 ? m->layers[i - 1].act : x;
        int rc = FL_OK;
        if (l->kind == FL_NN_RELU) {
            rc = be->relu_backward(m->ctx, m->dtype, l->act, grad, grad, rows * l->width_out);
        } else {
            param *w = &m->params[l->weight];
            /* dW = grad^T @ input; db = column sums of grad; grad_input = grad @ W */
            rc = be->gemm(m->ctx, m->dtype, 1, 0, l->width_out, l->width_in, rows, 1.0, grad,
                          l->width_out, input, l->width_in, 0.0, w->grad, l->width_in);
            if (rc == FL_OK && l->bias >= 0)
                rc = be->sum_rows(m->ctx, m->dtype, grad, rows, l->width_out, m->params[l->bias].grad);
            if (rc == FL_OK && i > 0) {
                rc = be->gemm(m->ctx, m->dtype, 0, 0, rows, l->width_in, l->width_out, 1.0, grad,
                              l->width_out, w->value, l->width_in, 0.0, spare, l->width_in);
                void *t = grad;
                grad = spare, spare = t;
            }
        }
        if (rc != FL_OK)
            return backend_error(m, rc, l->kind == FL_NN_RELU ? "relu backward" : "linear backward");
    }
    return FL_OK;
}

static int check_rows(int64_t rows) {
    return rows > 0 ? FL_OK : fl_error_set(FL_EINVAL, "a batch needs at least one row, got %lld", (long long)rows);
}

int fl_nn_wait_stream(fl_nn_model *m, uintptr_t stream) {
    if (m->be->wait_stream == NULL)
        return FL_OK;
    pthread_mutex_lock(&m->lock);
    int rc = m->be->wait_stream(m->ctx, stream);
    pthread_mutex_unlock(&m->lock);
    return rc == FL_OK ? rc : backend_error(m, rc, "waiting for an input's stream");
}

int fl_nn_forward(fl_nn_model *m, fl_nn_array x, int64_t rows, fl_nn_array out) {
    if (rows == 0)
        return FL_OK;
    int rc = check_rows(rows);
    if (rc != FL_OK)
        return rc;
    pthread_mutex_lock(&m->lock);
    const void *input = NULL;
    if ((rc = reserve_rows(m, rows)) == FL_OK)
        input = on_device(m, x, m->x_stage, (size_t)rows * m->esize * (size_t)m->in_features, &rc);
    if (rc == FL_OK)
        rc = run_forward(m, input, rows);
    if (rc == FL_OK) {
        const void *result = m->layers[m->layer_count - 1].act;
        size_t bytes = (size_t)rows * m->esize * (size_t)m->out_features;
        int err = out.on_device ? m->be->copy(m->ctx, out.data, result, bytes)
                                : m->be->to_host(m->ctx, out.data, result, bytes);
        if (err == FL_OK && out.on_device)
            err = m->be->sync(m->ctx);
        if (err != FL_OK)
            rc = backend_error(m, err, "copying the output");
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* fl_nn_backward() with the lock held. */
static int backward_locked(fl_nn_model *m, fl_nn_array x, fl_nn_array y, int64_t rows,
                           fl_nn_loss kind, double *loss) {
    int rc = check_rows(rows);
    if (rc == FL_OK && kind != FL_NN_MSE && kind != FL_NN_CROSS_ENTROPY)
        rc = fl_error_set(FL_EINVAL, "unknown loss %d", (int)kind);
    if (rc == FL_OK)
        rc = reserve_rows(m, rows);
    if (rc != FL_OK)
        return rc;
    size_t y_bytes = (size_t)rows * (kind == FL_NN_MSE ? m->esize * (size_t)m->out_features : sizeof(int64_t));
    const void *input = on_device(m, x, m->x_stage, (size_t)rows * m->esize * (size_t)m->in_features, &rc);
    const void *target = rc == FL_OK ? on_device(m, y, m->y_stage, y_bytes, &rc) : NULL;
    if (rc == FL_OK)
        rc = run_forward(m, input, rows);
    if (rc != FL_OK)
        return rc;
    const void *output = m->layers[m->layer_count - 1].act;
    rc = m->be->loss(m->ctx, m->dtype, kind, output, target, rows, m->out_features, m->grad_a, loss);
    if (rc != FL_OK) /* a bad label: the backend names it */
        return fl_error_set(rc, "%s", m->be->error(m->ctx));
    return run_backward(m, input, rows);
}

int fl_nn_backward(fl_nn_model *m, fl_nn_array x, fl_nn_array y, int64_t rows, fl_nn_loss kind,
                   double *loss) {
    pthread_mutex_lock(&m->lock);
    int rc = backward_locked(m, x, y, rows, kind, loss);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* ---- optimizers ---- */

static int optimizer_buffer_count(fl_nn_optimizer_kind kind) { return kind == FL_NN_ADAM ? 2 : 1; }

int fl_nn_optimizer_new(fl_nn_model *m, fl_nn_optimizer_kind kind, const fl_nn_hyper *hyper,
                        fl_nn_optimizer **out) {
    if (kind != FL_NN_SGD && kind != FL_NN_ADAM)
        return fl_error_set(FL_EINVAL, "unknown optimizer %d", (int)kind);
    fl_nn_optimizer *opt = calloc(1, sizeof *opt);
    if (opt == NULL)
        return fl_error_set(FL_ENOMEM, "optimizer");
    *opt = (fl_nn_optimizer){.model = m, .kind = kind, .hyper = *hyper};
    for (int b = 0; b < optimizer_buffer_count(kind); b++) {
        opt->state[b] = calloc((size_t)m->param_count + 1, sizeof(void *));
        if (opt->state[b] == NULL) {
            fl_nn_optimizer_free(opt);
            return fl_error_set(FL_ENOMEM, "optimizer");
        }
    }
    *out = opt;
    return FL_OK;
}

void fl_nn_optimizer_free(fl_nn_optimizer *opt) {
    if (opt == NULL)
        return;
    for (int b = 0; b < 2; b++) {
        for (int i = 0; opt->state[b] && i < opt->model->param_count; i++)
            opt->model->be->free(opt->model->ctx, opt->state[b][i]);
        free(opt->state[b]);
    }
    free(opt);
}

/* The state buffer `which` of parameter i, allocated (zeroed) on first use. *fresh says
 * whether it was just made. */
static void *state_buffer(fl_nn_optimizer *opt, int i, int which, int *fresh, int *rc) {
    fl_nn_model *m = opt->model;
    *fresh = 0;
    if (opt->state[which][i] != NULL)
        return opt->state[which][i];
    size_t bytes = (size_t)m->params[i].count * m->esize;
    void *buf = device_alloc(m, bytes, rc);
    if (buf == NULL)
        return NULL;
    int err = m->be->zero(m->ctx, buf, bytes);
    if (err != FL_OK) {
        m->be->free(m->ctx, buf);
        *rc = backend_error(m, err, "zeroing optimizer state");
        return NULL;
    }
    *fresh = 1;
    return opt->state[which][i] = buf;
}

static int step_locked(fl_nn_optimizer *opt) {
    fl_nn_model *m = opt->model;
    const fl_nn_hyper *h = &opt->hyper;
    int rc = FL_OK;
    for (int i = 0; i < m->param_count && rc == FL_OK; i++) {
        param *p = &m->params[i];
        int fresh = 0, fresh2 = 0;
        if (opt->kind == FL_NN_SGD) {
            void *buf = h->momentum != 0 ? state_buffer(opt, i, 0, &fresh, &rc) : NULL;
            fl_nn_sgd_args args = {.lr = h->lr, .momentum = h->momentum, .weight_decay = h->weight_decay,
                                   .nesterov = h->nesterov, .first_step = fresh};
            if (rc == FL_OK && (rc = m->be->sgd(m->ctx, m->dtype, p->value, p->grad, buf, p->count, &args)) != FL_OK)
                rc = backend_error(m, rc, "SGD step");
        } else {
            void *avg = state_buffer(opt, i, 0, &fresh, &rc);
            void *avg_sq = rc == FL_OK ? state_buffer(opt, i, 1, &fresh2, &rc) : NULL;
            fl_nn_adam_args args = {.lr = h->lr, .beta1 = h->beta1, .beta2 = h->beta2, .eps = h->eps,
                                    .weight_decay = h->weight_decay, .decoupled = h->decoupled,
                                    .step = opt->steps + 1};
            if (rc == FL_OK && (rc = m->be->adam(m->ctx, m->dtype, p->value, p->grad, avg, avg_sq, p->count, &args)) != FL_OK)
                rc = backend_error(m, rc, "Adam step");
        }
    }
    if (rc == FL_OK)
        opt->steps++;
    return rc;
}

int fl_nn_optimizer_step(fl_nn_optimizer *opt) {
    pthread_mutex_lock(&opt->model->lock);
    int rc = step_locked(opt);
    pthread_mutex_unlock(&opt->model->lock);
    return rc;
}

int fl_nn_train_step(fl_nn_model *m, fl_nn_optimizer *opt, fl_nn_array x, fl_nn_array y,
                     int64_t rows, fl_nn_loss kind, double *loss) {
    if (opt->model != m)
        return fl_error_set(FL_EINVAL, "the optimizer belongs to another model");
    pthread_mutex_lock(&m->lock);
    int rc = backward_locked(m, x, y, rows, kind, loss);
    if (rc == FL_OK)
        rc = step_locked(opt);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void fl_nn_optimizer_get_hyper(fl_nn_optimizer *opt, fl_nn_hyper *out) {
    pthread_mutex_lock(&opt->model->lock);
    *out = opt->hyper;
    pthread_mutex_unlock(&opt->model->lock);
}

void fl_nn_optimizer_set_hyper(fl_nn_optimizer *opt, const fl_nn_hyper *hyper) {
    pthread_mutex_lock(&opt->model->lock);
    opt->hyper = *hyper;
    pthread_mutex_unlock(&opt->model->lock);
}

int64_t fl_nn_optimizer_steps(fl_nn_optimizer *opt) {
    pthread_mutex_lock(&opt->model->lock);
    int64_t steps = opt->steps;
    pthread_mutex_unlock(&opt->model->lock);
    return steps;
}

void fl_nn_optimizer_set_steps(fl_nn_optimizer *opt, int64_t steps) {
    pthread_mutex_lock(&opt->model->lock);
    opt->steps = steps;
    pthread_mutex_unlock(&opt->model->lock);
}

int fl_nn_optimizer_buffers(fl_nn_optimizer *opt) {
    if (opt->kind == FL_NN_ADAM)
        return 2;
    pthread_mutex_lock(&opt->model->lock); /* set_hyper may change momentum meanwhile */
    int buffers = opt->hyper.momentum != 0 ? 1 : 0;
    pthread_mutex_unlock(&opt->model->lock);
    return buffers;
}

/* Checks that (index, which) names one of opt's state buffers; *bytes is that buffer's size. */
static int state_bytes(fl_nn_optimizer *opt, int index, int which, size_t *bytes) {
    fl_nn_model *m = opt->model;
    if (index < 0 || index >= m->param_count)
        return fl_error_set(FL_EINVAL, "parameter index %d is outside [0, %d)", index, m->param_count);
    if (which < 0 || which >= optimizer_buffer_count(opt->kind))
        return fl_error_set(FL_EINVAL, "state buffer %d is outside [0, %d)", which, optimizer_buffer_count(opt->kind));
    *bytes = (size_t)m->params[index].count * m->esize;
    return FL_OK;
}

int fl_nn_optimizer_get_state(fl_nn_optimizer *opt, int index, int which, void *host_dst) {
    fl_nn_model *m = opt->model;
    size_t bytes = 0;
    int rc = state_bytes(opt, index, which, &bytes);
    if (rc != FL_OK)
        return rc;
    pthread_mutex_lock(&m->lock);
    void *buf = opt->state[which][index];
    if (buf == NULL)
        memset(host_dst, 0, bytes);
    else if ((rc = m->be->to_host(m->ctx, host_dst, buf, bytes)) != FL_OK)
        rc = backend_error(m, rc, "copying optimizer state");
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int fl_nn_optimizer_set_state(fl_nn_optimizer *opt, int index, int which, const void *host_src) {
    fl_nn_model *m = opt->model;
    size_t bytes = 0;
    int rc = state_bytes(opt, index, which, &bytes);
    if (rc != FL_OK)
        return rc;
    pthread_mutex_lock(&m->lock);
    int fresh;
    void *buf = state_buffer(opt, index, which, &fresh, &rc);
    if (buf != NULL && ((rc = m->be->to_device(m->ctx, buf, host_src, bytes)) != FL_OK ||
                        (rc = m->be->sync(m->ctx)) != FL_OK))
        rc = backend_error(m, rc, "copying optimizer state");
    pthread_mutex_unlock(&m->lock);
    return rc;
}
