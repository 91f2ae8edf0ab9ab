/* py_gpu_math_testing.c - the tests' host build of the GPU kernels' per-pixel code: the very
 * cuda/fl_..._math.cuh functions the kernels call, compiled here by the C compiler and run over every
 * pixel, so pytest compares the GPU's arithmetic with the CPU path's without a GPU
 * (FASTLOOP_TESTING=1 builds only; tests/test_gpu_kernels_host.py). */
#include "fl_module.h"

#include <stdlib.h>

#include "data/fl_gpu_stage.h"
/* beside the kernels, not in the core's include path: relative to this file */
#include "../../cuda/fl_preprocess_math.cuh"
#include "../../cuda/fl_resample_math.cuh"

static int check_dtype(int dtype) {
    if (dtype < FL_CUDA_OUT_FLOAT32 || dtype > FL_CUDA_OUT_BFLOAT16) {
        PyErr_Format(PyExc_ValueError, "dtype code must be 0 (float32), 1 (float16) or 2 (bfloat16), not %d", dtype);
        return -1;
    }
    return 0;
}

static int check_length(const Py_buffer *b, Py_ssize_t want, const char *name) {
    if (b->len < want) {
        PyErr_Format(PyExc_ValueError, "'%s' holds %zd bytes, %zd needed", name, b->len, want);
        return -1;
    }
    return 0;
}

/* _gpu_round(values, dtype) -> bytes: float32 values to float16 (1) or bfloat16 (2) bits. */
static PyObject *gpu_round(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer values;
    int dtype;
    if (!PyArg_ParseTuple(args, "y*i:_gpu_round", &values, &dtype))
        return NULL;
    PyObject *out = NULL;
    if (check_dtype(dtype) == 0 && dtype != FL_CUDA_OUT_FLOAT32) {
        const Py_ssize_t n = values.len / (Py_ssize_t)sizeof(float);
        out = PyBytes_FromStringAndSize(NULL, n * 2);
        for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
            float v;
            memcpy(&v, (const char *)values.buf + i * sizeof v, sizeof v);
            fl_gpu_store(PyBytes_AS_STRING(out), dtype, i, v);
        }
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_gpu_round rounds to float16 (1) or bfloat16 (2)");
    }
    PyBuffer_Release(&values);
    return out;
}

/* _gpu_preprocess(src, n, h, w, c, src_chw, dst_chw, out_h, out_w, top, left, offsets, flips,
 * a, b, dtype) -> bytes: fl_cuda_preprocess's kernel, pixel by pixel (offsets: int32 pairs or
 * None; flips: uint8 flags or None; a, b: float32). */
static PyObject *gpu_preprocess(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer src, offsets = {0}, flips = {0}, a, b;
    fl_gpu_preprocess_params p;
    memset(&p, 0, sizeof p);
    PyObject *offsets_obj, *flips_obj, *out = NULL;
    if (!PyArg_ParseTuple(args, "y*LLLLiiLLLLOOy*y*i:_gpu_preprocess", &src, &p.n, &p.h, &p.w, &p.c, &p.src_chw,
                          &p.dst_chw, &p.out_h, &p.out_w, &p.top, &p.left, &offsets_obj, &flips_obj, &a, &b, &p.dtype))
        return NULL;
    int ok = offsets_obj == Py_None || PyObject_GetBuffer(offsets_obj, &offsets, PyBUF_SIMPLE) == 0;
    ok = ok && (flips_obj == Py_None || PyObject_GetBuffer(flips_obj, &flips, PyBUF_SIMPLE) == 0);
    ok = ok && check_dtype(p.dtype) == 0 && check_length(&src, (Py_ssize_t)(p.n * p.h * p.w * p.c), "src") == 0 &&
         check_length(&a, (Py_ssize_t)(p.c * 4), "a") == 0 && check_length(&b, (Py_ssize_t)(p.c * 4), "b") == 0 &&
         (offsets.buf == NULL || check_length(&offsets, (Py_ssize_t)(p.n * 8), "offsets") == 0) &&
         (flips.buf == NULL || check_length(&flips, (Py_ssize_t)p.n, "flips") == 0);
    for (long long i = 0; ok && i < p.n; i++) { /* every crop inside its image, as fl_cuda_preprocess's caller checks */
        const int32_t *o = offsets.buf ? (const int32_t *)offsets.buf + 2 * i : NULL;
        const long long top = o ? o[0] : p.top, left = o ? o[1] : p.left;
        if (top < 0 || left < 0 || top + p.out_h > p.h || left + p.out_w > p.w) {
            PyErr_Format(PyExc_ValueError, "image %lld's crop leaves the image", i);
            ok = 0;
        }
    }
    if (ok) {
        const long long pixels = p.n * p.out_h * p.out_w;
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(pixels * p.c * (p.dtype == FL_CUDA_OUT_FLOAT32 ? 4 : 2)));
        if (out != NULL) {
            p.src = src.buf, p.dst = PyBytes_AS_STRING(out), p.a = a.buf, p.b = b.buf;
            p.offsets = offsets.buf, p.flips = flips.buf;
            for (long long i = 0; i < pixels; i++) /* what each GPU thread does for its pixel */
                fl_gpu_preprocess_pixel(&p, i);
        }
    }
    PyBuffer_Release(&src), PyBuffer_Release(&a), PyBuffer_Release(&b);
    if (offsets.obj != NULL)
        PyBuffer_Release(&offsets);
    if (flips.obj != NULL)
        PyBuffer_Release(&flips);
    return out;
}

/* 1 when every table entry of an axis reads inside [0, span), else 0. */
static int axis_inside(const fl_gpu_axis *axis, long long n, long long span) {
    for (long long o = 0; o < n; o++)
        if (axis->lo[o] < 0 || axis->count[o] < 0 || axis->count[o] > axis->taps || axis->lo[o] + axis->count[o] > span)
            return 0;
    return 1;
}

/* _gpu_resample(entry, pixels, pixels_h, pixels_w, x0, y0, out_h, out_w, a, b, dtype, dst_chw)
 * -> bytes: fl_gpu_decode's two passes over one staged entry, pixel by pixel. pixels: the
 * decoded RGB image (x0, y0: the record's rectangle origin in it) or the rectangle alone (0, 0,
 * as a region decode gives it); unused for an entry holding the CPU's pixels. */
static PyObject *gpu_resample(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer entry, pixels, a, b;
    int pixels_h, pixels_w, x0, y0, out_h, out_w, dtype, dst_chw;
    if (!PyArg_ParseTuple(args, "y*y*iiiiiiy*y*ii:_gpu_resample", &entry, &pixels, &pixels_h, &pixels_w, &x0, &y0,
                          &out_h, &out_w, &a, &b, &dtype, &dst_chw))
        return NULL;
    PyObject *out = NULL;
    uint8_t *copy = NULL, *tmp = NULL;
    fl_gpu_record r;
    int ok = check_dtype(dtype) == 0 && check_length(&a, 12, "a") == 0 && check_length(&b, 12, "b") == 0 &&
             check_length(&entry, FL_GPU_RECORD_BYTES, "entry") == 0 && out_h > 0 && out_w > 0;
    if (ok) {
        memcpy(&r, entry.buf, sizeof r);
        copy = malloc((size_t)entry.len); /* 4-byte aligned tables */
        if (copy == NULL)
            PyErr_NoMemory(), ok = 0;
        else
            memcpy(copy, entry.buf, (size_t)entry.len);
    }
    fl_gpu_image_desc d;
    memset(&d, 0, sizeof d);
    const uint8_t *payload = copy != NULL ? copy + FL_GPU_RECORD_BYTES : NULL;
    const Py_ssize_t room = entry.len - FL_GPU_RECORD_BYTES;
    if (ok && r.route == FL_GPU_PIXELS) {
        ok = check_length(&entry, FL_GPU_RECORD_BYTES + 3 * (Py_ssize_t)out_h * out_w, "entry") == 0;
        d.src = payload;
    } else if (ok) {
        d = (fl_gpu_image_desc){pixels.buf, (long long)pixels_w * 3, x0, y0, (int)r.rect_h, 1, r.flip,
                                (int)r.taps_x, (int)r.taps_y, 0, (const int32_t *)(payload + r.tables_at), NULL};
        const fl_gpu_axis ax = fl_gpu_axis_x(&d, out_w), ay = fl_gpu_axis_y(&d, out_h, out_w);
        ok = r.tables_at % 4 == 0 && (Py_ssize_t)r.tables_at +
             (Py_ssize_t)fl_gpu_tables_bytes((size_t)out_h, (size_t)out_w, r.taps_x, r.taps_y) <= room &&
             check_length(&pixels, 3 * (Py_ssize_t)pixels_h * pixels_w, "pixels") == 0 && x0 >= 0 && y0 >= 0 &&
             x0 + (long long)r.rect_w <= pixels_w && y0 + (long long)r.rect_h <= pixels_h &&
             axis_inside(&ax, out_w, r.rect_w) && axis_inside(&ay, out_h, r.rect_h);
        if (ok)
            if ((tmp = d.tmp = malloc(3 * (size_t)r.rect_h * (size_t)out_w + 1)) == NULL)
                PyErr_NoMemory(), ok = 0;
    }
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "the entry, the pixels or the output size are inconsistent");
    if (ok) {
        const long long plane = (long long)out_h * out_w;
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(3 * plane * (dtype == FL_CUDA_OUT_FLOAT32 ? 4 : 2)));
        if (out != NULL) {
            fl_gpu_resample_params p = {&d, out_h, out_w, dst_chw, {0}, {0}, PyBytes_AS_STRING(out), dtype};
            memcpy(p.a, a.buf, sizeof p.a), memcpy(p.b, b.buf, sizeof p.b);
            for (long long i = 0; d.resample && i < (long long)d.rows * out_w; i++) /* the first kernel's threads */
                fl_gpu_horizontal_pixel(&d, out_w, i);
            for (long long i = 0; i < plane; i++) /* then the second's */
                fl_gpu_vertical_pixel(&p, &d, i);
        }
    }
    free(copy), free(tmp);
    PyBuffer_Release(&entry), PyBuffer_Release(&pixels), PyBuffer_Release(&a), PyBuffer_Release(&b);
    return out;
}

static PyMethodDef gpu_math_functions[] = {
    {"_gpu_round", gpu_round, METH_VARARGS,
     "_gpu_round(values, dtype)\n--\n\nfloat32 values (a buffer) rounded as the GPU kernels round them to\n"
     "float16 (dtype 1) or bfloat16 (dtype 2): the bits, 2 bytes each."},
    {"_gpu_preprocess", gpu_preprocess, METH_VARARGS,
     "_gpu_preprocess(src, n, h, w, c, src_chw, dst_chw, out_h, out_w, top, left, offsets, flips, a, b, dtype)\n--\n\n"
     "fl_cuda_preprocess's kernel run on the host, pixel by pixel: the output bytes."},
    {"_gpu_resample", gpu_resample, METH_VARARGS,
     "_gpu_resample(entry, pixels, pixels_h, pixels_w, x0, y0, out_h, out_w, a, b, dtype, dst_chw)\n--\n\n"
     "fl_gpu_decode's two kernels run on the host over one staged entry: the output bytes."},
    {NULL, NULL, 0, NULL},
};

int fl_gpu_math_testing_init(PyObject *module) { return PyModule_AddFunctions(module, gpu_math_functions); }
