/* py_json_numbers.c - fastloop._core.parse_json_inputs() and parse_json_v2(): the HTTP
 * front's usual JSON bodies (/v1: "inputs" a rectangular array of numbers; /v2: each input's
 * "data" one) parsed in C (serve/fl_json_numbers), a large one without the GIL; None tells the
 * caller to run its general parser. */
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

/* Narrows the parsed doubles to float32 in place (each rounded to nearest, as NumPy's astype
 * rounds it); 0 when one overflows (a finite double past float32's range): the caller's general
 * path then refuses it in its own words. */
static int narrow_to_float32(fl_json_inputs *parsed) {
    for (size_t i = 0; i < parsed->count; i++) {
        float narrowed = (float)parsed->values[i];
        if (isinf(narrowed))
            return 0;
        /* float i goes to bytes 4i..4i+3, inside double i/2: read already */
        memcpy((char *)parsed->values + i * sizeof narrowed, &narrowed, sizeof narrowed);
    }
    return 1;
}

/* The parsed numbers as an array that owns them (through a capsule), of `typenum`: NPY_FLOAT64,
 * or NPY_FLOAT32 once narrow_to_float32 ran; NULL on error, with parsed->values freed either way. */
static PyObject *values_array(fl_json_inputs *parsed, int typenum) {
    PyObject *owner = PyCapsule_New(parsed->values, VALUES_CAPSULE, free_values);
    if (owner == NULL) {
        fl_json_inputs_free(parsed);
        return NULL;
    }
    parsed->values = NULL; /* the capsule frees them now */
    npy_intp dims[FL_JSON_MAX_DIMS];
    for (int d = 0; d < parsed->ndim; d++)
        dims[d] = (npy_intp)parsed->shape[d];
    PyObject *array = PyArray_SimpleNewFromData(parsed->ndim, dims, typenum,
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

/* Runs parse(bytes, len, out) on the body, without the GIL for a large one. */
static int parse_bytes(PyObject *body, int (*parse)(const void *, size_t, void *), void *out) {
    const char *bytes = PyBytes_AS_STRING(body);
    size_t len = (size_t)PyBytes_GET_SIZE(body);
    if (len < JSON_GIL_RELEASE_BYTES)
        return parse(bytes, len, out);
    int rc;
    Py_INCREF(body); /* held while the GIL is away (bytes never change) */
    Py_BEGIN_ALLOW_THREADS
    rc = parse(bytes, len, out);
    Py_END_ALLOW_THREADS
    Py_DECREF(body);
    return rc;
}

static int parse_inputs(const void *body, size_t len, void *out) { return fl_json_parse_inputs(body, len, out); }
static int parse_v2(const void *body, size_t len, void *out) { return fl_json_parse_v2_request(body, len, out); }

/* Py_None for FL_ENOTSUP (the caller's general path), NULL with the error raised for another
 * failure, or NULL with nothing raised when it parsed. */
static PyObject *refusal(PyObject *module, int rc, const char *function) {
    if (rc == FL_ENOTSUP) {
        fl_error_clear();
        return Py_NewRef(Py_None);
    }
    if (rc != FL_OK)
        fl_raise(fl_state_from_module(module), rc, function);
    return NULL;
}

/* One object's numbers (float32: narrowed, or None when one overflows) and its other members. */
static PyObject *numbers_and_keys(const char *body, fl_json_inputs *parsed, int float32) {
    if (float32 && !narrow_to_float32(parsed))
        return Py_NewRef(Py_None);
    PyObject *keys = other_keys(body, parsed);
    PyObject *array = keys != NULL ? values_array(parsed, float32 ? NPY_FLOAT32 : NPY_FLOAT64) : NULL;
    PyObject *pair = array != NULL ? PyTuple_Pack(2, array, keys) : NULL;
    Py_XDECREF(array);
    Py_XDECREF(keys);
    return pair;
}

static PyObject *parse_json_inputs(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static fl_arg_cache parse_args = FL_ARG_CACHE("parse_json_inputs");
    PyObject *body;
    int float32 = 0;
    if (fl_parse_args(&parse_args, args, nargs, kwnames, FL_ARG("body", OBJECT, &body),
                      FL_ARG("|$float32", BOOL, &float32)) < 0)
        return NULL;
    if (!PyBytes_Check(body))
        return fl_raisef(NULL, FL_EXC_TYPE, "parse_json_inputs: body must be bytes, not %.100s",
                         Py_TYPE(body)->tp_name);
    fl_json_inputs parsed;
    int rc = parse_bytes(body, parse_inputs, &parsed);
    PyObject *result = refusal(module, rc, "parse_json_inputs");
    if (result == NULL && rc == FL_OK)
        result = numbers_and_keys(PyBytes_AS_STRING(body), &parsed, float32);
    fl_json_inputs_free(&parsed);
    return result;
}

/* Whether an input's "datatype" member is written exactly "FP32". */
static int is_fp32(const char *body, const fl_json_inputs *input) {
    for (int k = 0; k < input->nkeys; k++) {
        const fl_json_key *key = &input->keys[k];
        if (key->name.len == 8 && memcmp(body + key->name.start, "datatype", 8) == 0)
            return key->value.len == 6 && memcmp(body + key->value.start, "\"FP32\"", 6) == 0;
    }
    return 0;
}

/* parse_json_v2's answer for a parsed request (None: an FP32 value past float32). */
static PyObject *v2_answer(const char *bytes, fl_json_v2_request *parsed) {
    PyObject *inputs = PyList_New(parsed->ninputs);
    if (inputs == NULL)
        return NULL;
    for (int i = 0; i < parsed->ninputs; i++) {
        PyObject *input = numbers_and_keys(bytes, &parsed->inputs[i], is_fp32(bytes, &parsed->inputs[i]));
        if (input == NULL || input == Py_None) {
            Py_DECREF(inputs);
            return input;
        }
        PyList_SET_ITEM(inputs, i, input);
    }
    PyObject *rest = other_keys(bytes, &parsed->rest);
    PyObject *answer = rest != NULL ? PyTuple_Pack(2, inputs, rest) : NULL;
    Py_DECREF(inputs);
    Py_XDECREF(rest);
    return answer;
}

static PyObject *parse_json_v2(PyObject *module, PyObject *body) {
    if (!PyBytes_Check(body))
        return fl_raisef(NULL, FL_EXC_TYPE, "parse_json_v2: body must be bytes, not %.100s", Py_TYPE(body)->tp_name);
    fl_json_v2_request parsed;
    int rc = parse_bytes(body, parse_v2, &parsed);
    PyObject *result = refusal(module, rc, "parse_json_v2");
    if (result == NULL && rc == FL_OK)
        result = v2_answer(PyBytes_AS_STRING(body), &parsed);
    fl_json_v2_request_free(&parsed);
    return result;
}

static PyMethodDef json_numbers_functions[] = {
    {"parse_json_inputs", (PyCFunction)(void (*)(void))parse_json_inputs, METH_FASTCALL | METH_KEYWORDS,
     "parse_json_inputs(body, *, float32=False)\n--\n\n"
     "The HTTP front's usual JSON body -- an object whose \"inputs\" is a rectangular nested\n"
     "array of numbers -- parsed in C (the GIL released from 64 KB): (inputs as a float64 array,\n"
     "{other key: its raw JSON value as bytes}). None for any other body (named inputs, nulls,\n"
     "ragged rows, a syntax error, a number past float64 or an integer >= 2**53, ...): the\n"
     "caller's json.loads path then decides, with its own messages. float32: the numbers rounded\n"
     "to float32 as NumPy's astype rounds them (None when one overflows it).\n\n"
     "    x, rest = _core.parse_json_inputs(b'{\"inputs\": [[1.5, 2]], \"id\": \"a\"}')\n"
     "    # x: array([[1.5, 2.]]), rest: {'id': b'\"a\"'}"},
    {"parse_json_v2", parse_json_v2, METH_O,
     "parse_json_v2(body, /)\n--\n\n"
     "An Open Inference Protocol infer request whose every input has numeric \"data\", parsed in\n"
     "C: ([(data, {other member: raw JSON}) per input], {other member of the request: raw JSON}).\n"
     "data: a float32 array for an input whose \"datatype\" is written \"FP32\", else float64. None\n"
     "for any other body (as parse_json_inputs; also an input without numeric data, or an FP32\n"
     "value past float32): the caller's general path decides.\n\n"
     "    inputs, rest = _core.parse_json_v2(b'{\"inputs\": [{\"name\": \"x\", \"datatype\": \"FP32\", \"data\": [1]}]}')\n"
     "    # inputs: [(array([1.], dtype=float32), {'name': b'\"x\"', 'datatype': b'\"FP32\"'})], rest: {}"},
    {NULL, NULL, 0, NULL},
};

int fl_json_numbers_module_init(PyObject *module) {
    return PyModule_AddFunctions(module, json_numbers_functions);
}
