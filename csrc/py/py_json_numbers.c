/* py_json_numbers.c - fastloop._core.parse_json_inputs(): the HTTP front's usual JSON body
 * ("inputs" a rectangular array of numbers) parsed in C (serve/fl_json_numbers), a large one
 * without the GIL; None tells the caller to run its general parser. */
#include "fl_module.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "serve/fl_json_numbers.h"

#define VALUES_CAPSULE "fastloop._core.json_values"

/* Bodies from this size are parsed with the GIL released (~60 us of parsing at ~1 byte/ns).
 * A smaller one (a 784-float row is 16 KB: ~15 us) keeps it: under a busy event loop, taking
 * the GIL back can wait up to the interpreter's switch interval (5 ms), far longer than the
 * parse itself. */
#define JSON_GIL_RELEASE_BYTES (64 * 1024)

static void free_values(PyObject *capsule) { free(PyCapsule_GetPointer(capsule, VALUES_CAPSULE)); }

/* The parsed numbers as a float64 array that owns them (through a capsule); NULL on error,
 * with parsed->values freed either way. */
static PyObject *values_array(fl_json_inputs *parsed) {
    PyObject *owner = PyCapsule_New(parsed->values, VALUES_CAPSULE, free_values);
    if (owner == NULL) {
        fl_json_inputs_free(parsed);
        return NULL;
    }
    parsed->values = NULL; /* the capsule frees them now */
    npy_intp dims[FL_JSON_MAX_DIMS];
    for (int d = 0; d < parsed->ndim; d++)
        dims[d] = (npy_intp)parsed->shape[d];
    PyObject *array = PyArray_SimpleNewFromData(parsed->ndim, dims, NPY_FLOAT64,
                                                PyCapsule_GetPointer(owner, VALUES_CAPSULE));
    if (array == NULL || PyArray_SetBaseObject((PyArrayObject *)array, owner) < 0) { /* steals owner */
        Py_XDECREF(array);
        if (array == NULL)
            Py_DECREF(owner);
        return NULL;
    }
    return array;
}

/* {name: raw JSON value bytes} of the other top-level keys. */
static PyObject *other_keys(const char *body, const fl_json_inputs *parsed) {
    PyObject *keys = PyDict_New();
    for (int i = 0; keys != NULL && i < parsed->nkeys; i++) {
        const fl_json_key *key = &parsed->keys[i];
        PyObject *name = PyUnicode_DecodeUTF8(body + key->name.start, (Py_ssize_t)key->name.len, "strict");
        PyObject *value = PyBytes_FromStringAndSize(body + key->value.start, (Py_ssize_t)key->value.len);
        if (name == NULL || value == NULL || PyDict_SetItem(keys, name, value) < 0)
            Py_CLEAR(keys);
        Py_XDECREF(name);
        Py_XDECREF(value);
    }
    return keys;
}

static PyObject *parse_json_inputs(PyObject *module, PyObject *body) {
    if (!PyBytes_Check(body))
        return fl_raisef(NULL, FL_EXC_TYPE, "parse_json_inputs: body must be bytes, not %.100s",
                         Py_TYPE(body)->tp_name);
    fl_json_inputs parsed;
    const char *bytes = PyBytes_AS_STRING(body);
    size_t len = (size_t)PyBytes_GET_SIZE(body);
    int rc;
    Py_INCREF(body); /* held while the GIL is away (bytes never change) */
    if (len >= JSON_GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = fl_json_parse_inputs(bytes, len, &parsed);
        Py_END_ALLOW_THREADS
    } else {
        rc = fl_json_parse_inputs(bytes, len, &parsed);
    }
    PyObject *result = NULL;
    if (rc == FL_ENOTSUP) {
        fl_error_clear();
        result = Py_NewRef(Py_None);
    } else if (rc != FL_OK) {
        fl_raise(fl_state_from_module(module), rc, "parse_json_inputs");
    } else {
        PyObject *keys = other_keys(bytes, &parsed);
        PyObject *array = keys != NULL ? values_array(&parsed) : NULL;
        if (array != NULL)
            result = PyTuple_Pack(2, array, keys);
        Py_XDECREF(array);
        Py_XDECREF(keys);
    }
    fl_json_inputs_free(&parsed);
    Py_DECREF(body);
    return result;
}

static PyMethodDef json_numbers_functions[] = {
    {"parse_json_inputs", parse_json_inputs, METH_O,
     "parse_json_inputs(body, /)\n--\n\n"
     "The HTTP front's usual JSON body -- an object whose \"inputs\" is a rectangular nested\n"
     "array of numbers -- parsed in C (the GIL released from 64 KB): (inputs as a float64 array,\n"
     "{other key: its raw JSON value as bytes}). None for any other body (named inputs, nulls,\n"
     "ragged rows, a syntax error, a number past float64 or an integer >= 2**53, ...): the\n"
     "caller's json.loads path then decides, with its own messages.\n\n"
     "    x, rest = _core.parse_json_inputs(b'{\"inputs\": [[1.5, 2]], \"id\": \"a\"}')\n"
     "    # x: array([[1.5, 2.]]), rest: {'id': b'\"a\"'}"},
    {NULL, NULL, 0, NULL},
};

int fl_json_numbers_module_init(PyObject *module) {
    return PyModule_AddFunctions(module, json_numbers_functions);
}
