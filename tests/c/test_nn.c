/* test_nn.c - the model core on the CPU backend: forward against a reference, gradients
 * against finite differences (float64), a bad label changes nothing, optimizer formulas,
 * and several threads training one model (its lock, under TSan).
 *
 * The BLAS comes from FASTLOOP_BLAS (make ctest passes the one fastloop.nn picks); without
 * it the test fails, saying so (a silent skip would hide a broken BLAS lookup). */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "nn/fl_blas.h"
#include "base/fl_error.h"
#include "nn/fl_nn.h"
#include "nn/fl_nn_cpu.h"

static const fl_nn_layer_spec MLP[] = {
    {.kind = FL_NN_LINEAR, .in_features = 5, .out_features = 7, .bias = 1},
    {.kind = FL_NN_RELU},
    {.kind = FL_NN_LINEAR, .in_features = 7, .out_features = 3, .bias = 1},
};
enum { ROWS = 4, IN = 5, HIDDEN = 7, OUT = 3 };

static double uniform(unsigned *state) {
    *state = *state * 1103515245u + 12345u;
    return ((*state >> 8) & 0xffff) / 32768.0 - 1.0;
}

/* Fills every parameter with deterministic values in [-1, 1). */
static void fill_params(fl_nn_model *m, unsigned seed) {
    for (int i = 0; i < fl_nn_param_count(m); i++) {
        fl_nn_param_info info;
        CHECK(fl_nn_param_info_get(m, i, &info) == FL_OK);
        double values[64];
        for (int64_t j = 0; j < info.count; j++)
            values[j] = 0.5 * uniform(&seed);
        CHECK(fl_nn_set_param(m, i, values) == FL_OK);
    }
}

static fl_nn_model *make_mlp(void) {
    fl_nn_model *m = NULL;
    CHECK(fl_nn_model_new(fl_nn_cpu_backend(), 0, FL_FLOAT64, MLP, 3, &m) == FL_OK);
    fill_params(m, 7);
    return m;
}

/* Reference forward of MLP in plain loops. */
static void reference_forward(fl_nn_model *m, const double *x, double *out) {
    double w1[HIDDEN * IN], b1[HIDDEN], w2[OUT * HIDDEN], b2[OUT], h[ROWS * HIDDEN];
    fl_nn_get_param(m, 0, w1), fl_nn_get_param(m, 1, b1), fl_nn_get_param(m, 2, w2), fl_nn_get_param(m, 3, b2);
    for (int r = 0; r < ROWS; r++) {
        for (int j = 0; j < HIDDEN; j++) {
            double s = b1[j];
            for (int k = 0; k < IN; k++)
                s += x[r * IN + k] * w1[j * IN + k];
            h[r * HIDDEN + j] = s > 0 ? s : 0;
        }
        for (int j = 0; j < OUT; j++) {
            double s = b2[j];
            for (int k = 0; k < HIDDEN; k++)
                s += h[r * HIDDEN + k] * w2[j * HIDDEN + k];
            out[r * OUT + j] = s;
        }
    }
}

static void make_batch(double *x, int64_t *labels) {
    unsigned seed = 3;
    for (int i = 0; i < ROWS * IN; i++)
        x[i] = uniform(&seed);
    for (int r = 0; r < ROWS; r++)
        labels[r] = r % OUT;
}

static fl_nn_array host(const void *p) { return (fl_nn_array){.data = (void *)p, .on_device = 0}; }

static void test_forward_matches_reference(void) {
    fl_nn_model *m = make_mlp();
    double x[ROWS * IN], out[ROWS * OUT], expected[ROWS * OUT];
    int64_t labels[ROWS];
    make_batch(x, labels);
    CHECK(fl_nn_forward(m, host(x), ROWS, host(out)) == FL_OK);
    reference_forward(m, x, expected);
    for (int i = 0; i < ROWS * OUT; i++)
        CHECK(fabs(out[i] - expected[i]) < 1e-12);
    fl_nn_model_free(m);
}

static double loss_at(fl_nn_model *m, const double *x, const int64_t *labels) {
    double out[ROWS * OUT], total = 0;
    reference_forward(m, x, out);
    for (int r = 0; r < ROWS; r++) {
        double max = out[r * OUT], sum = 0;
        for (int c = 1; c < OUT; c++)
            max = fmax(max, out[r * OUT + c]);
        for (int c = 0; c < OUT; c++)
            sum += exp(out[r * OUT + c] - max);
        total += log(sum) + max - out[r * OUT + labels[r]];
    }
    return total / ROWS;
}

static void test_gradients_match_finite_differences(void) {
    fl_nn_model *m = make_mlp();
    double x[ROWS * IN], loss;
    int64_t labels[ROWS];
    make_batch(x, labels);
    CHECK(fl_nn_backward(m, host(x), host(labels), ROWS, FL_NN_CROSS_ENTROPY, &loss) == FL_OK);
    CHECK(fabs(loss - loss_at(m, x, labels)) < 1e-12);
    for (int i = 0; i < fl_nn_param_count(m); i++) {
        fl_nn_param_info info;
        fl_nn_param_info_get(m, i, &info);
        double value[64], grad[64];
        fl_nn_get_param(m, i, value);
        fl_nn_get_grad(m, i, grad);
        for (int64_t j = 0; j < info.count; j++) {
            const double eps = 1e-6, saved = value[j];
            value[j] = saved + eps;
            fl_nn_set_param(m, i, value);
            double up = loss_at(m, x, labels);
            value[j] = saved - eps;
            fl_nn_set_param(m, i, value);
            double down = loss_at(m, x, labels);
            value[j] = saved;
            fl_nn_set_param(m, i, value);
            CHECK(fabs((up - down) / (2 * eps) - grad[j]) < 1e-7);
        }
    }
    fl_nn_model_free(m);
}

static void test_bad_label_changes_nothing(void) {
    fl_nn_model *m = make_mlp();
    fl_nn_hyper hyper = {.lr = 0.1, .momentum = 0.9};
    fl_nn_optimizer *opt = NULL;
    CHECK(fl_nn_optimizer_new(m, FL_NN_SGD, &hyper, &opt) == FL_OK);
    double x[ROWS * IN], before[HIDDEN * IN], after[HIDDEN * IN], loss;
    int64_t labels[ROWS];
    make_batch(x, labels);
    labels[2] = OUT;
    fl_nn_get_param(m, 0, before);
    CHECK(fl_nn_train_step(m, opt, host(x), host(labels), ROWS, FL_NN_CROSS_ENTROPY, &loss) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "label 3 at row 2 is outside [0, 3)") != NULL);
    fl_nn_get_param(m, 0, after);
    CHECK(memcmp(before, after, sizeof before) == 0);
    CHECK(fl_nn_optimizer_steps(opt) == 0);
    fl_nn_optimizer_free(opt);
    fl_nn_model_free(m);
}

static void test_sgd_momentum_and_adam_follow_torch(void) {
    static const fl_nn_layer_spec one[] = {{.kind = FL_NN_LINEAR, .in_features = 1, .out_features = 1, .bias = 0}};
    fl_nn_model *m = NULL;
    CHECK(fl_nn_model_new(fl_nn_cpu_backend(), 0, FL_FLOAT64, one, 1, &m) == FL_OK);
    double w = 1.0, g = 0.5, got;
    fl_nn_set_param(m, 0, &w);
    fl_nn_set_grad(m, 0, &g);
    fl_nn_hyper sgd = {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
    fl_nn_optimizer *opt = NULL;
    CHECK(fl_nn_optimizer_new(m, FL_NN_SGD, &sgd, &opt) == FL_OK);
    fl_nn_optimizer_step(opt); /* buf = g + wd*w = 0.51; w = 1 - 0.051 */
    fl_nn_optimizer_step(opt); /* buf = 0.9*0.51 + 0.5 + 0.01*0.949 */
    fl_nn_get_param(m, 0, &got);
    double buf = 0.9 * 0.51 + 0.5 + 0.01 * 0.949;
    CHECK(fabs(got - (0.949 - 0.1 * buf)) < 1e-15);
    fl_nn_optimizer_free(opt);
    fl_nn_hyper adam = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    CHECK(fl_nn_optimizer_new(m, FL_NN_ADAM, &adam, &opt) == FL_OK);
    fl_nn_set_param(m, 0, &w);
    fl_nn_optimizer_step(opt); /* the first Adam step moves by lr * sign(g) (almost) */
    fl_nn_get_param(m, 0, &got);
    CHECK(fabs(got - (1.0 - 0.01 * 0.5 / (0.5 + 1e-8))) < 1e-12);
    fl_nn_optimizer_free(opt);
    fl_nn_model_free(m);
}

static void test_bad_specs(void) {
    static const fl_nn_layer_spec chain[] = {
        {.kind = FL_NN_LINEAR, .in_features = 4, .out_features = 3, .bias = 1},
        {.kind = FL_NN_LINEAR, .in_features = 5, .out_features = 2, .bias = 1},
    };
    fl_nn_model *m = NULL;
    CHECK(fl_nn_model_new(fl_nn_cpu_backend(), 0, FL_FLOAT32, chain, 2, &m) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "layer 1: Linear takes 5 features") != NULL);
    CHECK(fl_nn_model_new(fl_nn_cpu_backend(), 0, FL_INT32, MLP, 3, &m) == FL_EINVAL);
    CHECK(fl_nn_model_new(fl_nn_cpu_backend(), 0, FL_FLOAT32, MLP + 1, 1, &m) == FL_EINVAL);
    CHECK(m == NULL);
}

typedef struct {
    fl_nn_model *model;
    fl_nn_optimizer *opt;
    int failures;
} shared_model;

static void *train_many(void *arg) {
    shared_model *s = arg;
    double x[ROWS * IN], loss, param[HIDDEN * IN];
    int64_t labels[ROWS];
    make_batch(x, labels);
    int steps = (int)(200 * test_scale()) + 1;
    for (int i = 0; i < steps; i++) {
        if (fl_nn_train_step(s->model, s->opt, host(x), host(labels), ROWS, FL_NN_CROSS_ENTROPY, &loss) != FL_OK ||
            fl_nn_get_param(s->model, 0, param) != FL_OK)
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void test_threads_share_one_model(void) {
    shared_model s = {.model = make_mlp()};
    fl_nn_hyper hyper = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    CHECK(fl_nn_optimizer_new(s.model, FL_NN_ADAM, &hyper, &s.opt) == FL_OK);
    pthread_t threads[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&threads[i], NULL, train_many, &s);
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    CHECK(s.failures == 0);
    CHECK(fl_nn_optimizer_steps(s.opt) == 4 * ((int)(200 * test_scale()) + 1));
    fl_nn_optimizer_free(s.opt);
    fl_nn_model_free(s.model);
}

int main(void) {
    const char *path = getenv("FASTLOOP_BLAS");
    if (path == NULL || fl_blas_load(path) != FL_OK) {
        fprintf(stderr, "test_nn: FAILED, no BLAS (set FASTLOOP_BLAS): %s\n", fl_error_detail());
        return 1; /* not a silent skip: make ctest passes the BLAS fastloop.nn picks */
    }
    fl_blas_set_threads(1); /* the BLAS's own threads are not instrumented for TSan */
    RUN(test_bad_specs);
    RUN(test_forward_matches_reference);
    RUN(test_gradients_match_finite_differences);
    RUN(test_bad_label_changes_nothing);
    RUN(test_sgd_momentum_and_adam_follow_torch);
    RUN(test_threads_share_one_model);
    return check_failures != 0; /* not the count: 256 failures would exit 0 */
}
