/* py_gpu_decode.c - fastloop._cuda.JpegDecoder (staged loader entries decoded by nvJPEG
 * into a normalized batch, cuda/fl_gpu_decode.h) and nvjpeg_load(). The entries come from
 * fastloop's own workers; they are checked anyway (every offset and table index inside its
 * entry and rectangle) before the GPU reads them, so a bad one is a ValueError, not a wild
 * read on the device.
 *
 * fl_gpu_decode() takes one call at a time per decoder, and a decode changes the decoder's
 * `regions` flag and the object's counts: they are behind the object's mutex, which is held
 * only with the GIL released, around C code that touches no Python object. */
#include "py_cuda.h"

#include <pthread.h>
#include <string.h>

#include "data/fl_gpu_stage.h"
#include "fl_gpu_decode.h"
#include "fl_jpeg_plan.h"
#include "fl_nvjpeg.h"

typedef struct JpegDecoder {
    PyObject_HEAD
    fl_gpu_decoder *decoder; /* set in tp_new; its calls under lock */
    int device;
    pthread_mutex_t lock;          /* one decode at a time; guards the decoder's stats too */
} JpegDecoder;

static PyObject *nvjpeg_load(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache nvjpeg_load_args = FL_ARG_CACHE("nvjpeg_load");
    return fl_py_load_library(module, args, kwargs, &nvjpeg_load_args, fl_nvjpeg_load,
                              fl_nvjpeg_path, "nvJPEG");
}

/* Raises CudaError for a decoder code: a cudaError_t, or nvJPEG's status. */
static PyObject *raise_decode(cuda_state *state, int code, const char *what) {
    if (code < FL_GPU_NVJPEG_ERROR)
        return fl_py_raise_cuda(state, code, what);
    int status = code - FL_GPU_NVJPEG_ERROR;
    PyObject *message = PyUnicode_FromFormat("%s: nvJPEG failed with %s (status %d)", what,
                                             fl_nvjpeg_status_name(status), status);
    fl_exc_raise(&state->exc, FL_EXC_CUDA, message, (fl_exc_codes){.code = FL_ECUDA, .cuda_code = code});
    Py_XDECREF(message);
    return NULL;
}

static PyObject *decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache jpegdecoder_args = FL_ARG_CACHE("JpegDecoder");
    int device = 0;
    if (fl_parse_args_dict(&jpegdecoder_args, args, kwargs,
                           FL_ARG("|device", INT, &device)) < 0)
        return NULL;
    cuda_state *state = fl_py_state_of(type);
    if (fl_nvjpeg() == NULL)
        return fl_raisef(&state->exc, FL_EXC_CUDA_UNAVAILABLE, "nvJPEG is not loaded (fastloop.cuda.load_nvjpeg() loads it)");
    if (fl_py_require_device(state, device) < 0)
        return NULL;
    JpegDecoder *self = (JpegDecoder *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->lock, NULL);
    self->device = device;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_gpu_decoder_new(device, &self->decoder);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(self);
        return raise_decode(state, rc, "JpegDecoder");
    }
    return (PyObject *)self;
}

static void decoder_dealloc(JpegDecoder *self) {
    PyTypeObject *type = Py_TYPE(self);
    if (self->decoder != NULL) {
        fl_gpu_decoder *decoder = self->decoder;
        Py_BEGIN_ALLOW_THREADS /* waits for the device */
            fl_gpu_decoder_free(decoder);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_destroy(&self->lock);
    type->tp_free(self);
    Py_DECREF(type);
}

/* Checks one entry's record and tables against its entry and the output size. */
static int check_entry(const uint8_t *entry, size_t entry_bytes, size_t out_h, size_t out_w, Py_ssize_t i) {
    const fl_gpu_record *r = (const fl_gpu_record *)entry;
    const size_t room = entry_bytes - FL_GPU_RECORD_BYTES;
    if (r->route == FL_GPU_PIXELS) {
        if (out_h * out_w * 3 <= room) /* no wrap: out_h, out_w checked against the entry first */
            return 0;
    } else if ((r->route == FL_GPU_JPEG_HARDWARE || r->route == FL_GPU_JPEG_CUDA) && r->length <= room &&
               r->tables_at % 4 == 0 && r->tables_at >= r->length && r->taps_x > 0 && r->taps_y > 0 &&
               r->taps_x <= 65536 && r->taps_y <= 65536 && /* no wrap in the tables' size */
               r->tables_at <= room && fl_gpu_tables_bytes(out_h, out_w, r->taps_x, r->taps_y) <= room - r->tables_at &&
               r->rect_w > 0 && r->rect_h > 0 && (uint64_t)r->x0 + r->rect_w <= r->image_w &&
               (uint64_t)r->y0 + r->rect_h <= r->image_h) {
        int32_t tables[2];
        const uint8_t *at = entry + FL_GPU_RECORD_BYTES + r->tables_at;
        size_t axes[2][3] = {{out_w, r->taps_x, r->rect_w}, {out_h, r->taps_y, r->rect_h}};
        int ok = 1;
        for (int a = 0; a < 2 && ok; a++) {
            const size_t n = axes[a][0], taps = axes[a][1], limit = axes[a][2];
            for (size_t o = 0; o < n && ok; o++) {
                memcpy(&tables[0], at + 4 * o, 4);       /* lo */
                memcpy(&tables[1], at + 4 * (n + o), 4); /* count */
                ok = tables[0] >= 0 && tables[1] >= 0 && (size_t)tables[1] <= taps &&
                     (size_t)tables[0] + (size_t)tables[1] <= limit;
            }
            at += 4 * n * (2 + taps);
        }
        if (ok)
            return 0;
    }
    fl_raisef(NULL, FL_EXC_VALUE, "staged entry %zd is inconsistent (route %d): not made by a fastloop loader "
              "for this output size?", i, (int)r->route);
    return -1;
}

/* entries: a C-contiguous (n, entry_bytes) uint8 array with every entry checked. */
static PyArrayObject *check_entries(PyObject *obj, size_t out_h, size_t out_w) {
    size_t pixels;
    if (__builtin_mul_overflow(out_h, out_w, &pixels) || pixels > ((size_t)1 << 40)) {
        fl_raisef(NULL, FL_EXC_VALUE, "an output of %zu x %zu pixels is too large", out_h, out_w);
        return NULL;
    }
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_UINT8 || PyArray_NDIM((PyArrayObject *)obj) != 2 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) || PyArray_DIM((PyArrayObject *)obj, 1) <= FL_GPU_RECORD_BYTES) {
        fl_raisef(NULL, FL_EXC_TYPE, "'entries' must be a C-contiguous (n, entry_bytes) uint8 array of staged images");
        return NULL;
    }
    PyArrayObject *entries = (PyArrayObject *)obj;
    const uint8_t *data = PyArray_DATA(entries);
    const size_t bytes = (size_t)PyArray_DIM(entries, 1);
    for (Py_ssize_t i = 0; i < PyArray_DIM(entries, 0); i++)
        if (check_entry(data + (size_t)i * bytes, bytes, out_h, out_w, i) < 0)
            return NULL;
    return entries;
}

/* mean/std: three floats each, as the normalize coefficients a, b. */
static int parse_normalize(PyObject *mean_obj, PyObject *std_obj, float a[3], float b[3]) {
    float mean[3], std[3];
    PyObject *objs[2] = {mean_obj, std_obj};
    float *dst[2] = {mean, std};
    static const char *names[2] = {"mean", "std"};
    for (int v = 0; v < 2; v++) {
        PyArrayObject *values = (PyArrayObject *)PyArray_FROMANY(objs[v], NPY_FLOAT32, 0, 1, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
        if (values == NULL)
            return -1;
        const npy_intp size = PyArray_SIZE(values);
        const float *data = PyArray_DATA(values);
        for (int ch = 0; ch < 3 && (size == 1 || size == 3); ch++)
            dst[v][ch] = data[size == 1 ? 0 : ch];
        Py_DECREF(values);
        if (size != 1 && size != 3) {
            fl_raisef(NULL, FL_EXC_VALUE, "'%s' must hold 1 or 3 values (one per channel), not %zd", names[v], (Py_ssize_t)size);
            return -1;
        }
    }
    for (int ch = 0; ch < 3; ch++)
        if (std[ch] == 0.0f) {
            fl_raisef(NULL, FL_EXC_VALUE, "'std[%d]' is 0", ch);
            return -1;
        }
    fl_cuda_preprocess_coefficients(mean, std, 3, a, b);
    return 0;
}

static int parse_dtype(const char *name, fl_cuda_out_dtype *dtype) {
    static const char *names[] = {"float32", "float16", "bfloat16"};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            *dtype = (fl_cuda_out_dtype)i;
            return 0;
        }
    fl_raisef(NULL, FL_EXC_VALUE, "'dtype' must be 'float32', 'float16' or 'bfloat16', not '%s'", name);
    return -1;
}

static PyObject *decoder_decode(JpegDecoder *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache decode_args = FL_ARG_CACHE("decode");
    PyObject *entries_obj, *mean, *std, *stream_obj = Py_None, *stream_ref = NULL;
    unsigned long long out_ptr;
    Py_ssize_t out_nbytes, out_h, out_w;
    const char *dtype_name = "float32";
    int channels_first = 1;
    cuda_state *state = fl_py_state_of(Py_TYPE(self));
    if (fl_parse_args_dict(&decode_args, args, kwargs, FL_ARG("entries", OBJECT, &entries_obj),
                           FL_ARG("|$out_ptr", UINT64, &out_ptr),
                           FL_ARG("out_nbytes", SSIZE, &out_nbytes), FL_ARG("out_h", SSIZE, &out_h),
                           FL_ARG("out_w", SSIZE, &out_w), FL_ARG("mean", OBJECT, &mean),
                           FL_ARG("std", OBJECT, &std), FL_ARG("dtype", STR, &dtype_name),
                           FL_ARG("channels_first", BOOL, &channels_first),
                           FL_ARG("stream", OBJECT, &stream_obj)) < 0)
        return NULL;
    fl_gpu_decode_job job;
    memset(&job, 0, sizeof job);
    if (out_h < 1 || out_w < 1)
        return fl_raisef(NULL, FL_EXC_VALUE, "'out_h' and 'out_w' must be >= 1, not %zd and %zd", out_h, out_w);
    PyArrayObject *entries = check_entries(entries_obj, (size_t)out_h, (size_t)out_w);
    if (entries == NULL || parse_normalize(mean, std, job.a, job.b) < 0 || parse_dtype(dtype_name, &job.dtype) < 0 ||
        fl_py_parse_stream(state, stream_obj, self->device, &job.stream, &stream_ref) < 0)
        return NULL;
    job.entries = PyArray_DATA(entries);
    job.n = (size_t)PyArray_DIM(entries, 0);
    job.entry_bytes = (size_t)PyArray_DIM(entries, 1);
    job.out_h = (size_t)out_h, job.out_w = (size_t)out_w;
    job.dst_chw = channels_first;
    job.dst = (void *)(uintptr_t)out_ptr;
    size_t want = 3 * fl_cuda_out_dtype_size(job.dtype) * job.out_h * job.out_w; /* < 2^45: checked above */
    if (__builtin_mul_overflow(want, job.n, &want) || out_ptr == 0 || out_nbytes < 0 || (size_t)out_nbytes != want)
        return fl_raisef(NULL, FL_EXC_VALUE, "'out_ptr' must be non-zero, with 'out_nbytes' %zu (the output's size), "
                         "not %zd", want, out_nbytes);
    npy_intp n = (npy_intp)job.n;
    PyObject *failed = PyArray_ZEROS(1, &n, NPY_BOOL, 0);
    if (failed == NULL)
        return NULL;
    job.failed = PyArray_DATA((PyArrayObject *)failed);
    int rc;
    Py_BEGIN_ALLOW_THREADS /* nvJPEG parses the batch on this thread */
        pthread_mutex_lock(&self->lock);
        rc = fl_gpu_decode(self->decoder, &job);
        pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(failed);
        return raise_decode(state, rc, "JpegDecoder.decode");
    }
    return failed;
}

/* The decoder's stats, read under the lock (waited for with the GIL released: a decode may
 * hold it for a while). */
static void read_stats(JpegDecoder *self, fl_gpu_decoder_stats *stats) {
    Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->lock);
        fl_gpu_decoder_get_stats(self->decoder, stats);
        pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
}

static PyObject *get_hardware(JpegDecoder *self, void *unused) {
    (void)unused;
    return PyBool_FromLong(fl_gpu_decoder_has_hardware(self->decoder)); /* set at creation */
}

static PyObject *get_regions(JpegDecoder *self, void *unused) {
    (void)unused;
    fl_gpu_decoder_stats stats;
    read_stats(self, &stats);
    return PyBool_FromLong(stats.regions_on);
}

static PyObject *get_decoded(JpegDecoder *self, void *unused) {
    (void)unused;
    fl_gpu_decoder_stats stats;
    read_stats(self, &stats);
    return Py_BuildValue("{s:K,s:K,s:K}", "hardware", stats.hardware, "fallback", stats.fallback, "cpu", stats.pixels);
}

static PyObject *get_stats(JpegDecoder *self, void *unused) {
    (void)unused;
    fl_gpu_decoder_stats s;
    read_stats(self, &s);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O,s:O,s:I,s:I,s:(ii)}", "hardware", s.hardware,
                         "fallback", s.fallback, "cpu_workers", s.pixels, "regions", s.regions, "refused", s.refused,
                         "engine_errors", s.engine_errors, "demotions", s.demotions,
                         "has_engine", fl_gpu_decoder_has_hardware(self->decoder) ? Py_True : Py_False,
                         "engine_on", s.engine_on ? Py_True : Py_False, "regions_on", s.regions_on ? Py_True : Py_False,
                         "hardware_flags", s.hardware_flags, "fallback_flags", s.fallback_flags, "nvjpeg_version",
                         s.version_major, s.version_minor);
}

static PyMethodDef decoder_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decoder_decode, METH_VARARGS | METH_KEYWORDS,
     "decode(entries, *, out_ptr, out_nbytes, out_h, out_w, mean, std, dtype='float32',\n"
     "       channels_first=True, stream=None)\n--\n\n"
     "Queue on `stream` the decode of a batch of staged entries into the device memory at\n"
     "out_ptr (n x 3 x out_h x out_w, or n x out_h x out_w x 3): nvJPEG, the resize, flips,\n"
     "normalization and cast. Returns at once a bool array flagging the images nvJPEG could not\n"
     "decode (their rows are left unwritten). `entries` must stay untouched until the stream\n"
     "passes this point."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef decoder_getset[] = {
    {"hardware", (getter)get_hardware, NULL, "True when nvJPEG's hardware engine decodes.", NULL},
    {"regions", (getter)get_regions, NULL, "True while the engine decodes only each image's crop.", NULL},
    {"decoded", (getter)get_decoded, NULL, "Images decoded so far: {'hardware', 'fallback', 'cpu'}.", NULL},
    {"stats", (getter)get_stats, NULL,
     "The decoder's counts and setup: hardware, fallback, cpu_workers (images by the engine, by\n"
     "nvJPEG's fallback backend, CPU pixels from the workers), regions (engine images decoded as\n"
     "their crop), refused (engine images sent to the fallback), engine_errors, demotions,\n"
     "has_engine, engine_on, regions_on, hardware_flags, fallback_flags (nvjpegCreateEx's:\n"
     "32 is interpolated chroma upsampling), nvjpeg_version ((major, minor), -1 unknown).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot decoder_slots[] = {
    {Py_tp_doc, "JpegDecoder(device=0)\n--\n\nDecodes a Loader's staged JPEGs with nvJPEG on `device`."},
    {Py_tp_new, decoder_new},
    {Py_tp_dealloc, decoder_dealloc},
    {Py_tp_methods, decoder_methods},
    {Py_tp_getset, decoder_getset},
    {0, NULL},
};

static PyType_Spec decoder_spec = {
    .name = "fastloop.cuda.JpegDecoder",
    .basicsize = sizeof(JpegDecoder),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = decoder_slots,
};

/* _check_staged(entries, out_h, out_w): decode()'s checks alone (no GPU needed), for tests. */
static PyObject *check_staged(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    (void)module;
    static fl_arg_cache check_staged_args = FL_ARG_CACHE("_check_staged");
    PyObject *entries;
    Py_ssize_t out_h, out_w;
    if (fl_parse_args(&check_staged_args, args, nargs, kwnames, FL_ARG("entries", OBJECT, &entries),
                      FL_ARG("out_h", SSIZE, &out_h), FL_ARG("out_w", SSIZE, &out_w)) < 0)
        return NULL;
    if (out_h < 1 || out_w < 1)
        return fl_raisef(NULL, FL_EXC_VALUE, "'out_h' and 'out_w' must be >= 1, not %zd and %zd", out_h, out_w);
    return check_entries(entries, (size_t)out_h, (size_t)out_w) ? Py_NewRef(Py_None) : NULL;
}

/* _jpeg_auto_gpu(has_engine, workers, cpu_rate, fallback_rate): fl_jpeg_auto_gpu's rule. */
static PyObject *jpeg_auto_gpu(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    (void)module;
    static fl_arg_cache auto_args = FL_ARG_CACHE("_jpeg_auto_gpu");
    int has_engine, workers;
    double cpu_rate, fallback_rate;
    if (fl_parse_args(&auto_args, args, nargs, kwnames, FL_ARG("has_engine", BOOL, &has_engine),
                      FL_ARG("workers", INT, &workers), FL_ARG("cpu_rate", DOUBLE, &cpu_rate),
                      FL_ARG("fallback_rate", DOUBLE, &fallback_rate)) < 0)
        return NULL;
    return PyBool_FromLong(fl_jpeg_auto_gpu(has_engine, workers, cpu_rate, fallback_rate));
}

static PyMethodDef decode_functions[] = {
    {"_jpeg_auto_gpu", (PyCFunction)(void (*)(void))jpeg_auto_gpu, METH_FASTCALL | METH_KEYWORDS,
     "_jpeg_auto_gpu(has_engine, workers, cpu_rate, fallback_rate)\n--\n\n"
     "decode='auto''s rule (cuda/fl_jpeg_plan.h): True to decode on the GPU."},
    {"_check_staged", (PyCFunction)(void (*)(void))check_staged, METH_FASTCALL | METH_KEYWORDS,
     "_check_staged(entries, out_h, out_w)\n--\n\nJpegDecoder.decode's checks of staged entries."},
    {"nvjpeg_load", (PyCFunction)(void (*)(void))nvjpeg_load, METH_VARARGS | METH_KEYWORDS,
     "nvjpeg_load(path=None)\n--\n\nLoad nvJPEG (path, then $FASTLOOP_NVJPEG, then\n"
     "libnvjpeg.so.13/.12/.so) unless loaded; returns the file loaded. Raises\n"
     "fastloop.CudaUnavailable naming every candidate tried."},
    {NULL, NULL, 0, NULL},
};

int fl_py_gpu_decode_init(PyObject *module, cuda_state *state) {
    state->jpeg_decoder_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &decoder_spec, NULL);
    if (state->jpeg_decoder_type == NULL ||
        PyModule_AddObjectRef(module, "JpegDecoder", (PyObject *)state->jpeg_decoder_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, decode_functions);
}
