/* py_pipeline.c - fastloop._core._Pipeline, the C half of fastloop.ops.Pipeline: built from
 * step tuples once, then run on batches (by itself, or inside loader workers). */
#include "py_pipeline.h"

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "fl_numpy.h"
#include "py_ops.h"

typedef struct {
    PyObject_HEAD
    fl_pipeline *pipeline;
    fl_layout layout;
} PipelineObject;

/* Appends one ("crop", h, w, center) / ("hflip", p) / ("normalize", mean, std, out_layout)
 * / ("cast", dtype) step. */
static int add_step(fl_module_state *state, fl_pipeline *p, PyObject *spec) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        fl_raisef(NULL, FL_EXC_TYPE, "pipeline steps are (name, ...) tuples");
        return -1;
    }
    const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    int rc;
    if (strcmp(kind, "crop") == 0) {
        Py_ssize_t h, w;
        int center;
        if (!PyArg_ParseTuple(spec, "snnp", &kind, &h, &w, &center))
            return -1;
        rc = h > 0 && w > 0 ? fl_pipeline_crop(p, (size_t)h, (size_t)w, center)
                            : fl_error_set(FL_EINVAL, "crop size must be positive");
    } else if (strcmp(kind, "hflip") == 0) {
        double probability;
        if (!PyArg_ParseTuple(spec, "sd", &kind, &probability))
            return -1;
        rc = fl_pipeline_hflip(p, probability);
    } else if (strcmp(kind, "normalize") == 0) {
        PyObject *mean_obj, *std_obj;
        const char *layout_text;
        fl_layout layout;
        if (!PyArg_ParseTuple(spec, "sOOs", &kind, &mean_obj, &std_obj, &layout_text) ||
            fl_parse_layout(layout_text, "layout", &layout) < 0)
            return -1;
        PyObject *mean = PyArray_FROMANY(mean_obj, NPY_FLOAT32, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
        PyObject *std = mean ? PyArray_FROMANY(std_obj, NPY_FLOAT32, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST) : NULL;
        if (std == NULL || PyArray_SIZE((PyArrayObject *)mean) != PyArray_SIZE((PyArrayObject *)std)) {
            if (!PyErr_Occurred())
                fl_raisef(NULL, FL_EXC_VALUE, "Normalize: mean and std need one value per channel");
            Py_XDECREF(mean);
            Py_XDECREF(std);
            return -1;
        }
        rc = fl_pipeline_normalize(p, PyArray_DATA((PyArrayObject *)mean), PyArray_DATA((PyArrayObject *)std),
                                   (size_t)PyArray_SIZE((PyArrayObject *)mean), layout);
        Py_DECREF(mean);
        Py_DECREF(std);
    } else if (strcmp(kind, "cast") == 0) {
        PyObject *descr_obj;
        fl_dtype dtype;
        if (!PyArg_ParseTuple(spec, "sO", &kind, &descr_obj) ||
            fl_dtype_from_descr(descr_obj, "dtype", &dtype) < 0)
            return -1;
        rc = fl_pipeline_cast(p, dtype);
    } else {
        fl_raisef(NULL, FL_EXC_VALUE, "unknown pipeline step '%s'", kind);
        return -1;
    }
    if (rc != FL_OK) {
        fl_raise_with(state, rc, &(fl_raise_opts){.in = FL_IN_DATA});
        return -1;
    }
    return 0;
}

static PyObject *pipeline_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache pipeline_args = FL_ARG_CACHE("_Pipeline");
    const char *layout_text;
    PyObject *steps_obj;
    fl_layout layout;
    if (fl_parse_args_dict(&pipeline_args, args, kwargs, FL_ARG("layout", STR, &layout_text),
                           FL_ARG("steps", OBJECT, &steps_obj)) < 0 ||
        fl_parse_layout(layout_text, "layout", &layout) < 0)
        return NULL;
    PyObject *steps = PySequence_Tuple(steps_obj);
    if (steps == NULL)
        return NULL;
    PipelineObject *self = (PipelineObject *)type->tp_alloc(type, 0);
    if (self == NULL || fl_pipeline_new(layout, &self->pipeline) != FL_OK) {
        Py_XDECREF(self);
        Py_DECREF(steps);
        return PyErr_NoMemory();
    }
    self->layout = layout;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(steps); i++) {
        if (add_step(fl_state_from_type(type), self->pipeline, PyTuple_GET_ITEM(steps, i)) < 0) {
            Py_DECREF(steps);
            Py_DECREF(self);
            return NULL;
        }
    }
    Py_DECREF(steps);
    return (PyObject *)self;
}

/* The output array for x through the pipeline; NULL with ValueError when a step cannot apply. */
static PyObject *planned_output(PipelineObject *self, PyObject *x, fl_images *dims, fl_dtype *dtype,
                                size_t *scratch_per_image) {
    fl_images out;
    fl_dtype out_dtype;
    fl_layout out_layout;
    int rc = fl_pipeline_plan(self->pipeline, *dims, *dtype, &out, &out_dtype, &out_layout, scratch_per_image);
    if (rc != FL_OK)
        return fl_raise_with(fl_state_from_type(Py_TYPE(self)), rc,
                             &(fl_raise_opts){.what = "Pipeline", .in = FL_IN_DATA});
    out.n = dims->n;
    Py_ssize_t shape[4];
    fl_image_shape(x, out_layout, out, shape);
    return PyArray_Empty(PyArray_NDIM((PyArrayObject *)x), shape,
                         PyArray_DescrFromType(fl_dtype_to_numpy(out_dtype)), 0);
}

static PyObject *pipeline_run(PyObject *self_obj, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache run_args = FL_ARG_CACHE("run");
    PipelineObject *self = (PipelineObject *)self_obj;
    PyObject *x, *seed_obj = Py_None, *ids_obj = Py_None;
    int threads = 1;
    uint64_t seed;
    fl_images dims;
    fl_dtype dtype;
    if (fl_parse_args_dict(&run_args, args, kwargs, FL_ARG("x", OBJECT, &x),
                           FL_ARG("|seed", OBJECT, &seed_obj), FL_ARG("ids", OBJECT, &ids_obj),
                           FL_ARG("num_threads", INT, &threads)) < 0 ||
        fl_check_threads(threads) < 0 || fl_check_array(x, "x") == NULL || fl_dtype_of(x, "x", &dtype) < 0 ||
        fl_image_dims(x, self->layout, &dims) < 0 || fl_parse_seed(seed_obj, &seed) < 0)
        return NULL;
    PyObject *ids = NULL;
    if (ids_obj != Py_None) {
        ids = PyArray_FROMANY(ids_obj, NPY_INT64, 1, 1, NPY_ARRAY_CARRAY);
        if (ids == NULL || (size_t)PyArray_SIZE((PyArrayObject *)ids) != dims.n) {
            if (ids != NULL)
                fl_raisef(NULL, FL_EXC_VALUE, "'ids' needs one index per image (%zu)", dims.n);
            Py_XDECREF(ids);
            return NULL;
        }
    }
    size_t scratch_per_image, scratch_bytes = 0;
    PyObject *out = planned_output(self, x, &dims, &dtype, &scratch_per_image);
    int rc = out ? fl_size_mul(dims.n, scratch_per_image, "the Pipeline's scratch for 'x'", &scratch_bytes) : FL_OK;
    if (rc != FL_OK)
        Py_SETREF(out, fl_raise(fl_state_from_type(Py_TYPE(self)), rc, "Pipeline"));
    void *scratch = out ? PyMem_RawMalloc(scratch_bytes + 1) : NULL;
    if (out != NULL && scratch == NULL)
        Py_SETREF(out, PyErr_NoMemory());
    if (out != NULL) {
        const int64_t *id_data = ids ? PyArray_DATA((PyArrayObject *)ids) : NULL;
        FL_RUN_KERNEL(PyType_GetModuleByDef(Py_TYPE(self_obj), &fl_module_def), threads,
                      PyArray_NBYTES((PyArrayObject *)x), "Pipeline", out,
                      fl_pipeline_run(self->pipeline, exec, PyArray_DATA((PyArrayObject *)x), dims, dtype,
                                      PyArray_DATA((PyArrayObject *)out), scratch, seed, id_data));
    }
    PyMem_RawFree(scratch);
    Py_XDECREF(ids);
    return out;
}

static void pipeline_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    fl_pipeline_free(((PipelineObject *)self)->pipeline);
    type->tp_free(self);
    Py_DECREF(type);
}

fl_pipeline *fl_pipeline_from_python(PyObject *obj, fl_module_state *state) {
    if (!PyObject_TypeCheck(obj, state->pipeline_type)) {
        fl_raisef(NULL, FL_EXC_TYPE, "expected a fastloop.ops.Pipeline, not %.200s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((PipelineObject *)obj)->pipeline;
}

fl_layout fl_pipeline_layout_of(PyObject *obj) { return ((PipelineObject *)obj)->layout; }

int fl_pipeline_input_of(PyObject *obj, PyObject *descr, PyObject *shape, const char *name, fl_images *image,
                         fl_dtype *dtype) {
    if (PyTuple_GET_SIZE(shape) != 3) {
        fl_raisef(NULL, FL_EXC_VALUE, "a Pipeline needs image samples (3 dimensions), not shape %R", shape);
        return -1;
    }
    if (fl_dtype_from_descr(descr, name, dtype) < 0)
        return -1;
    Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0)), b = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 1)),
               c = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 2));
    *image = fl_pipeline_layout_of(obj) == FL_HWC ? (fl_images){1, (size_t)a, (size_t)b, (size_t)c}
                                                  : (fl_images){1, (size_t)b, (size_t)c, (size_t)a};
    return 0;
}

int fl_pipeline_set_output(fl_images out, fl_dtype dtype, fl_layout layout, PyObject *descrs, PyObject *shapes) {
    PyObject *shape = layout == FL_HWC ? Py_BuildValue("(nnn)", (Py_ssize_t)out.h, (Py_ssize_t)out.w, (Py_ssize_t)out.c)
                                       : Py_BuildValue("(nnn)", (Py_ssize_t)out.c, (Py_ssize_t)out.h, (Py_ssize_t)out.w);
    PyObject *descr = (PyObject *)PyArray_DescrFromType(fl_dtype_to_numpy(dtype));
    if (shape == NULL || descr == NULL) {
        Py_XDECREF(shape), Py_XDECREF(descr);
        return -1;
    }
    if (PyList_SetItem(shapes, 0, shape) < 0) { /* steals shape either way */
        Py_DECREF(descr);
        return -1;
    }
    return PyList_SetItem(descrs, 0, descr);
}

static PyMethodDef pipeline_methods[] = {
    {"run", (PyCFunction)(void (*)(void))pipeline_run, METH_VARARGS | METH_KEYWORDS,
     "run($self, /, x, seed=None, ids=None, num_threads=1)\n--\n\nRun the pipeline on a batch."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot pipeline_slots[] = {
    {Py_tp_doc, "The C half of fastloop.ops.Pipeline."},
    {Py_tp_new, pipeline_new},
    {Py_tp_dealloc, pipeline_dealloc},
    {Py_tp_methods, pipeline_methods},
    {0, NULL},
};

static PyType_Spec pipeline_spec = {
    .name = "fastloop._core._Pipeline",
    .basicsize = sizeof(PipelineObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = pipeline_slots,
};

int fl_pipeline_module_init(PyObject *module, fl_module_state *state) {
    state->pipeline_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &pipeline_spec, NULL);
    if (state->pipeline_type == NULL || PyModule_AddType(module, state->pipeline_type) < 0)
        return -1;
    return 0;
}
