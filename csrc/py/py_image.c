/* py_image.c - fastloop._core's image functions: loading the codecs, decoding, the fused
 * per-image geometry, resize (what fastloop.images and fastloop.ops call).
 *
 * Each Python thread that decodes keeps one fl_decoder (a pthread key frees it when the
 * thread ends), so a decompressor is made once per thread, not per image. */
#include "fl_module.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "data/fl_image.h"
#include "ops/fl_ops.h"
#include "py_image.h"

static pthread_key_t decoder_key;
static pthread_once_t decoder_key_once = PTHREAD_ONCE_INIT;

static void decoder_destroy(void *d) { fl_decoder_free(d); }

static void decoder_key_make(void) { (void)pthread_key_create(&decoder_key, decoder_destroy); }

/* This thread's decoder, or NULL with MemoryError set. */
static fl_decoder *thread_decoder(void) {
    fl_decoder *d = pthread_getspecific(decoder_key);
    if (d == NULL) {
        if (fl_decoder_new(&d) != FL_OK || pthread_setspecific(decoder_key, d) != 0) {
            fl_decoder_free(d);
            PyErr_NoMemory();
            return NULL;
        }
    }
    return d;
}

static fl_module_state *state_of(PyObject *module) { return fl_state_from_module(module); }

int fl_parse_geometry(PyObject *spec, fl_image_geometry *g) {
    memset(g, 0, sizeof *g);
    const char *kind;
    Py_ssize_t out_h, out_w, a, b;
    int dct;
    if (PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 8) {
        /* ("resized_crop", out_h, out_w, scale0, scale1, ratio0, ratio1, dct) */
        if (!PyArg_ParseTuple(spec, "snnddddp:geometry", &kind, &out_h, &out_w, &g->scale[0], &g->scale[1],
                              &g->ratio[0], &g->ratio[1], &dct))
            return -1;
        g->kind = FL_GEOMETRY_RESIZED_CROP;
    } else {
        /* ("resize", out_h, out_w, resize_h, resize_w (0: shorter side), dct) */
        if (!PyArg_ParseTuple(spec, "snnnnp:geometry", &kind, &out_h, &out_w, &a, &b, &dct))
            return -1;
        g->kind = FL_GEOMETRY_RESIZE;
        g->resize_h = (size_t)(a < 0 ? 0 : a);
        g->resize_w = (size_t)(b < 0 ? 0 : b);
    }
    if (out_h <= 0 || out_w <= 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "the output size must be positive");
        return -1;
    }
    g->out_h = (size_t)out_h, g->out_w = (size_t)out_w, g->dct_scaling = dct;
    int rc = fl_image_geometry_check(g);
    if (rc != FL_OK) {
        fl_raise_with(NULL, rc, &(fl_raise_opts){.in = FL_IN_DATA}); /* only ValueError: no state needed */
        return -1;
    }
    return 0;
}

/* arg: a path, or None for the library linked into fastloop; any failure is an OSError */
static PyObject *load_codec(PyObject *module, PyObject *arg, int jpeg) {
    PyObject *path = NULL;
    if (arg != Py_None && !PyUnicode_FSConverter(arg, &path))
        return NULL;
    const char *file = path ? PyBytes_AS_STRING(path) : NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = jpeg ? fl_image_load_jpeg(file) : fl_image_load_png(file);
    Py_END_ALLOW_THREADS
    Py_XDECREF(path);
    if (rc != FL_OK)
        return fl_raise_with(state_of(module), rc, &(fl_raise_opts){.in = FL_IN_LIBRARY});
    return PyUnicode_FromString(fl_image_codec(jpeg ? FL_IMAGE_JPEG : FL_IMAGE_PNG));
}

static PyObject *load_jpeg(PyObject *module, PyObject *arg) { return load_codec(module, arg, 1); }

static PyObject *load_png(PyObject *module, PyObject *arg) { return load_codec(module, arg, 0); }

static PyObject *codec_or_none(fl_image_format f) {
    const char *d = fl_image_codec(f);
    return d ? PyUnicode_FromString(d) : Py_NewRef(Py_None);
}

static PyObject *codecs(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    PyObject *j = codec_or_none(FL_IMAGE_JPEG), *p = codec_or_none(FL_IMAGE_PNG);
    PyObject *t = j && p ? PyTuple_Pack(2, j, p) : NULL;
    Py_XDECREF(j);
    Py_XDECREF(p);
    return t;
}

static PyObject *set_max_pixels(PyObject *module, PyObject *arg) {
    (void)module;
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    fl_image_set_max_pixels(n);
    Py_RETURN_NONE;
}

static PyObject *max_pixels(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromUnsignedLongLong(fl_image_max_pixels());
}

static PyObject *probe(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    fl_decoder *d = thread_decoder();
    fl_image_info info;
    int rc = d ? fl_image_probe(d, view.buf, (size_t)view.len, &info) : FL_ENOMEM;
    PyBuffer_Release(&view);
    if (d == NULL)
        return NULL;
    if (rc != FL_OK)
        return fl_raise(state_of(module), rc, "image");
    return Py_BuildValue("(nns)", (Py_ssize_t)info.width, (Py_ssize_t)info.height,
                         info.format == FL_IMAGE_JPEG ? "jpeg" : "png");
}

/* A new h x w x c uint8 array; OverflowError/ValueError naming the output 'size' when its
 * bytes overflow or exceed the machine's memory. */
static PyObject *new_image(size_t h, size_t w, size_t c) {
    const char *what = "the output 'size' (height x width x channels)";
    size_t pixels, bytes;
    int rc = fl_size_mul(h, w, what, &pixels);
    if (rc == FL_OK)
        rc = fl_size_mul(pixels, c, what, &bytes);
    if (rc == FL_OK)
        rc = fl_size_fits_memory(bytes, what);
    if (rc != FL_OK)
        return fl_raise_with(NULL, rc, &(fl_raise_opts){.what = "image"});
    npy_intp shape[3] = {(npy_intp)h, (npy_intp)w, (npy_intp)c};
    return PyArray_SimpleNew(3, shape, NPY_UINT8);
}

/* Copies the decoded rectangle `held` (all of the image here) into a fresh array. */
static PyObject *decoded_array(const fl_decoded *out) {
    PyObject *array = new_image(out->height, out->width, 3);
    if (array == NULL)
        return NULL;
    uint8_t *dst = PyArray_DATA((PyArrayObject *)array);
    for (size_t y = 0; y < out->height; y++)
        memcpy(dst + y * out->width * 3, out->pixels + y * out->stride, out->width * 3);
    return array;
}

static PyObject *decode(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    fl_decoder *d = thread_decoder();
    if (d == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    fl_decoded out;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_image_decode(d, view.buf, (size_t)view.len, 1, NULL, &out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc != FL_OK)
        return fl_raise(state_of(module), rc, "image");
    return decoded_array(&out); /* the decoder's buffer: this thread's, untouched meanwhile */
}

/* _image_transform(geometry, data, seed, index): data is encoded bytes or an HWC uint8 array. */
static PyObject *transform(PyObject *module, PyObject *args) {
    static fl_arg_cache image_transform_args = FL_ARG_CACHE("_image_transform"); /* positional */
    PyObject *spec, *data;
    unsigned long long seed;
    long long index;
    fl_image_geometry g;
    if (fl_parse_args_dict(&image_transform_args, args, NULL, FL_ARG("geometry", OBJECT, &spec),
                           FL_ARG("data", OBJECT, &data), FL_ARG("seed", UINT64, &seed),
                           FL_ARG("index", INT64, &index)) < 0 ||
        fl_parse_geometry(spec, &g) < 0)
        return NULL;
    int is_array = PyArray_Check(data);
    PyArrayObject *a = (PyArrayObject *)data;
    if (is_array && (fl_check_array(data, "image") == NULL || PyArray_TYPE(a) != NPY_UINT8 || PyArray_NDIM(a) != 3)) {
        if (!PyErr_Occurred())
            fl_raisef(NULL, FL_EXC_VALUE, "'image' must be an (h, w, c) uint8 array");
        return NULL;
    }
    size_t c = is_array ? (size_t)PyArray_DIM(a, 2) : 3;
    PyObject *result = new_image(g.out_h, g.out_w, c);
    Py_buffer view = {0};
    fl_decoder *d = is_array ? NULL : thread_decoder();
    if (result == NULL || (!is_array && (d == NULL || PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0))) {
        Py_XDECREF(result);
        return NULL;
    }
    uint8_t *dst = PyArray_DATA((PyArrayObject *)result);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = is_array ? fl_image_transform_pixels(&g, PyArray_DATA(a), (size_t)PyArray_DIM(a, 0),
                                              (size_t)PyArray_DIM(a, 1), c, seed, index, dst)
                  : fl_image_transform(d, &g, view.buf, (size_t)view.len, seed, index, dst);
    Py_END_ALLOW_THREADS
    if (!is_array)
        PyBuffer_Release(&view);
    return fl_result_or_raise(state_of(module), rc, result, "image");
}

static PyObject *resize(PyObject *module, PyObject *args) {
    static fl_arg_cache resize_args = FL_ARG_CACHE("resize"); /* positional only */
    PyObject *image;
    Py_ssize_t out_h, out_w;
    if (fl_parse_args_dict(&resize_args, args, NULL, FL_ARG("image", OBJECT, &image),
                           FL_ARG("out_h", SSIZE, &out_h), FL_ARG("out_w", SSIZE, &out_w)) < 0 ||
        fl_check_array(image, "image") == NULL)
        return NULL;
    PyArrayObject *a = (PyArrayObject *)image;
    if (PyArray_TYPE(a) != NPY_UINT8 || PyArray_NDIM(a) != 3) {
        fl_raisef(NULL, FL_EXC_VALUE, "'image' must be an (h, w, c) uint8 array");
        return NULL;
    }
    if (out_h <= 0 || out_w <= 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "the output size must be positive, not (%zd, %zd)", out_h, out_w);
        return NULL;
    }
    size_t h = (size_t)PyArray_DIM(a, 0), w = (size_t)PyArray_DIM(a, 1), c = (size_t)PyArray_DIM(a, 2);
    PyObject *result = new_image((size_t)out_h, (size_t)out_w, c);
    if (result == NULL)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_resize(PyArray_DATA(a), h, w, c, PyArray_DATA((PyArrayObject *)result), (size_t)out_h, (size_t)out_w);
    Py_END_ALLOW_THREADS
    return fl_result_or_raise(state_of(module), rc, result, "resize");
}

static PyObject *resized_crop_params(PyObject *module, PyObject *args) {
    (void)module;
    unsigned long long seed;
    long long index;
    Py_ssize_t h, w;
    double scale[2], ratio[2];
    if (!PyArg_ParseTuple(args, "KLnn(dd)(dd):_resized_crop_params", &seed, &index, &h, &w, &scale[0],
                          &scale[1], &ratio[0], &ratio[1]))
        return NULL;
    if (h <= 0 || w <= 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "the image size must be positive");
        return NULL;
    }
    size_t top, left, ch, cw;
    fl_resized_crop_params(seed, index, (size_t)h, (size_t)w, scale, ratio, &top, &left, &ch, &cw);
    return Py_BuildValue("(nnnn)", (Py_ssize_t)top, (Py_ssize_t)left, (Py_ssize_t)ch, (Py_ssize_t)cw);
}

static PyMethodDef image_methods[] = {
    {"_image_load_jpeg", load_jpeg, METH_O, "_image_load_jpeg(path, /)\n--\n\nLoad libjpeg-turbo (path None: the one linked in); returns its description."},
    {"_image_load_png", load_png, METH_O, "_image_load_png(path, /)\n--\n\nLoad libpng16 (path None: the one linked in); returns its description."},
    {"_image_codecs", codecs, METH_NOARGS, "_image_codecs()\n--\n\n(JPEG codec, PNG codec): descriptions or None."},
    {"_image_set_max_pixels", set_max_pixels, METH_O, "_image_set_max_pixels(n, /)\n--\n\nThe pixel cap."},
    {"_image_max_pixels", max_pixels, METH_NOARGS, "_image_max_pixels()\n--\n\nThe pixel cap."},
    {"_image_probe", probe, METH_O, "_image_probe(data, /)\n--\n\n(width, height, format) of encoded bytes."},
    {"_image_decode", decode, METH_O, "_image_decode(data, /)\n--\n\nDecode to an (h, w, 3) uint8 array."},
    {"_image_transform", transform, METH_VARARGS,
     "_image_transform(geometry, data, seed, index, /)\n--\n\nThe fused decode/crop/resize of one image."},
    {"_resize", resize, METH_VARARGS, "_resize(image, out_h, out_w, /)\n--\n\nAntialiased bilinear resize."},
    {"_resized_crop_params", resized_crop_params, METH_VARARGS,
     "_resized_crop_params(seed, index, h, w, scale, ratio, /)\n--\n\n(top, left, height, width)."},
    {NULL, NULL, 0, NULL},
};

int fl_image_module_init(PyObject *module) {
    pthread_once(&decoder_key_once, decoder_key_make);
    return PyModule_AddFunctions(module, image_methods);
}
