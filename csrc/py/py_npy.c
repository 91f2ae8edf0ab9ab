/* py_npy.c - fastloop.load_npy() and the header reader Folder uses: .npy files parsed and
 * validated in C (fl_npy), mapped read-only, and shown to Python as ordinary ndarrays. */
#include "fl_module.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "data/fl_npy.h"

typedef struct {
    PyObject_HEAD
    fl_npy_map map;
} MappingObject;

static void mapping_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    fl_npy_map_close(&((MappingObject *)self)->map);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyType_Slot mapping_slots[] = {
    {Py_tp_doc, "Keeps a .npy file mapped while arrays view it."},
    {Py_tp_dealloc, mapping_dealloc},
    {0, NULL},
};

static PyType_Spec mapping_spec = {
    .name = "fastloop._core._NpyMapping",
    .basicsize = sizeof(MappingObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = mapping_slots,
};

/* Raises the error of a failed fl_npy call on `path`: ValueError for a bad file, OSError
 * (with errno's class, e.g. FileNotFoundError) for a failed system call; the detail names
 * the file. */
static PyObject *raise_npy(PyObject *module, int rc) {
    return fl_raise_with(fl_state_from_module(module), rc, &(fl_raise_opts){.in = FL_IN_DATA});
}

static PyObject *header_tuple(const fl_npy_header *h) {
    PyObject *shape = PyTuple_New(h->ndim);
    for (int d = 0; shape != NULL && d < h->ndim; d++)
        PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(h->shape[d]));
    if (shape == NULL)
        return NULL;
    return Py_BuildValue("(sON)", h->descr, h->fortran_order ? Py_True : Py_False, shape);
}

static PyObject *npy_header(PyObject *module, PyObject *path_obj) {
    (void)module;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(path_obj, &path))
        return NULL;
    fl_npy_map map;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_npy_map_open(PyBytes_AS_STRING(path), &map);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (rc != FL_OK)
        return raise_npy(module, rc);
    PyObject *result = header_tuple(&map.header);
    fl_npy_map_close(&map);
    return result;
}

static PyObject *load_npy(PyObject *module, PyObject *path_obj) {
    fl_module_state *state = fl_state_from_module(module);
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(path_obj, &path))
        return NULL;
    MappingObject *mapping = PyObject_New(MappingObject, state->npy_mapping_type);
    if (mapping == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    memset(&mapping->map, 0, sizeof mapping->map);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_npy_map_open(PyBytes_AS_STRING(path), &mapping->map);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (rc != FL_OK) {
        Py_DECREF(mapping);
        return raise_npy(module, rc);
    }
    const fl_npy_header *h = &mapping->map.header;
    PyObject *descr_text = PyUnicode_FromString(h->descr);
    PyArray_Descr *descr = NULL;
    if (descr_text == NULL || !PyArray_DescrConverter(descr_text, &descr)) {
        Py_XDECREF(descr_text);
        Py_DECREF(mapping);
        return NULL;
    }
    Py_DECREF(descr_text);
    npy_intp dims[FL_NPY_MAX_DIMS];
    for (int d = 0; d < h->ndim; d++)
        dims[d] = (npy_intp)h->shape[d];
    static char empty[64]; /* a zero-size array still needs a data pointer */
    void *data = mapping->map.data != NULL ? (void *)mapping->map.data : empty;
    int flags = h->fortran_order ? NPY_ARRAY_F_CONTIGUOUS | NPY_ARRAY_ALIGNED : NPY_ARRAY_CARRAY_RO;
    PyObject *array = PyArray_NewFromDescr(&PyArray_Type, descr, h->ndim, dims, NULL, data,
                                           flags & ~NPY_ARRAY_WRITEABLE, NULL);
    if (array == NULL || PyArray_SetBaseObject((PyArrayObject *)array, (PyObject *)mapping) < 0) {
        Py_XDECREF(array);
        return NULL;
    }
    return array;
}

static PyMethodDef npy_functions[] = {
    {"load_npy", load_npy, METH_O,
     "load_npy(path, /)\n--\n\n"
     "Open a .npy file as a read-only NumPy array backed by a memory map. The header is parsed\n"
     "and checked in C (magic, version, dtype, shape, file size): a bad or truncated file\n"
     "raises ValueError naming it; a missing one OSError.\n\n"
     "    x = fastloop.load_npy(\"train_images.npy\")   # no copy: pages load on first touch\n"
     "    loader = fastloop.Loader((x, y), batch_size=256)"},
    {"_npy_header", npy_header, METH_O,
     "_npy_header(path, /)\n--\n\n(descr, fortran_order, shape) of a .npy file, validated."},
    {NULL, NULL, 0, NULL},
};

int fl_npy_module_init(PyObject *module, fl_module_state *state) {
    state->npy_mapping_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &mapping_spec, NULL);
    if (state->npy_mapping_type == NULL)
        return -1;
    FL_DISALLOW_INSTANTIATION(state->npy_mapping_type);
    return PyModule_AddFunctions(module, npy_functions);
}
