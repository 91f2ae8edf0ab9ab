/* fl_gpu_decode.cu - nvJPEG batches and the resample/normalize kernels (fl_gpu_decode.h).
 *
 * One call: sort the staged entries by route; lay out one stream-ordered device allocation
 * (image descriptors, tables, decoded rectangles, the first pass's rows, CPU pixels); queue
 * the upload of descriptors and tables (from one of two pinned buffers the decoder owns), the
 * copies of CPU pixels, the nvJPEG decodes, the horizontal pass over decoded rectangles, and
 * the vertical pass that also mirrors, normalizes, lays out and casts every image; free the
 * allocation in stream order. The kernels' per-pixel code is fl_resample_math.cuh's, which
 * the tests also build and run on the host (tests/test_gpu_stage.py).
 */
#include "fl_gpu_decode.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "data/fl_gpu_stage.h"
#include "fl_cuda_device.h"
#include "fl_cuda_mem.h"
#include "fl_jpeg_plan.h"
#include "fl_resample_math.cuh"
#include "fl_nvjpeg.h"

enum { ALIGN = 256 };

/* What the kernels know of one image, and of the batch (fl_resample_math.cuh). */
typedef fl_gpu_image_desc image_desc;
typedef fl_gpu_resample_params kernel_params;

/* One backend's decoder states, used in turn (fl_jpeg_plan.h): state i may be reinitialized
 * only once event i, recorded after its last decode, has passed. */
typedef struct backend {
    fl_nvjpeg_handle handle;
    fl_nvjpeg_state state[2];
    cudaEvent_t done[2];
    fl_jpeg_states plan;
    int preallocates;                    /* the hardware backend, where nvJPEG has the call */
} backend;

struct fl_gpu_decoder {
    int device;
    const fl_nvjpeg_api *nv;
    backend hw, sw;                      /* hardware engine (handle NULL without one), fallback */
    fl_nvjpeg_stream parsed;             /* a header parsed for the engine's support checks */
    fl_nvjpeg_params probe;              /* the support checks' params (ROI or whole) */
    fl_jpeg_engine engine;               /* when the engine and its regions are used */
    fl_gpu_decoder_stats stats;
    size_t capacity;                     /* entries the host scratch below holds */
    fl_nvjpeg_params *params;            /* per image of an engine batch */
    size_t n_params;
    const unsigned char **data;
    size_t *lengths;
    fl_nvjpeg_image *images;
    int *order;                          /* entry index of each image, grouped by destination */
    unsigned char *dest;                 /* per entry: its fl_jpeg_dest this try */
    image_desc *descs;
    fl_gpu_upload_ring ring;             /* the pinned upload buffers' bookkeeping (fl_gpu_stage.h) */
    uint8_t *upload[FL_GPU_UPLOAD_BUFFERS];      /* pinned: descriptors then tables, as uploaded */
    cudaEvent_t uploaded[FL_GPU_UPLOAD_BUFFERS]; /* recorded after the last copy from each */
};

static int nvjpeg_code(int status) { return status ? FL_GPU_NVJPEG_ERROR + status : 0; }

static const fl_gpu_record *record_of(const fl_gpu_decode_job *j, size_t i) {
    return (const fl_gpu_record *)(j->entries + i * j->entry_bytes);
}

static const uint8_t *payload_of(const fl_gpu_decode_job *j, size_t i) {
    return j->entries + i * j->entry_bytes + FL_GPU_RECORD_BYTES;
}

/* ---- kernels: grid-strided loops over fl_resample_math.cuh's per-pixel functions ---- */

/* Pass 1, per decoded image (blockIdx.y): each rectangle row resampled across to out_w. */
__global__ void horizontal_pass(kernel_params p) {
    const image_desc d = p.descs[blockIdx.y];
    if (!d.resample)
        return;
    const long long work = (long long)d.rows * p.out_w;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < work; i += (long long)gridDim.x * blockDim.x)
        fl_gpu_horizontal_pixel(&d, p.out_w, i);
}

/* Pass 2, per image (blockIdx.y): columns resampled down to out_h (or the CPU's pixels
 * read), mirrored, normalized, laid out and cast into the batch; the dtype a constant. */
template <int Dtype>
__global__ void vertical_pass(kernel_params p) {
    p.dtype = Dtype;
    const image_desc d = p.descs[blockIdx.y];
    const long long plane = (long long)p.out_h * p.out_w;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < plane; i += (long long)gridDim.x * blockDim.x)
        fl_gpu_vertical_pixel(&p, &d, i);
}

static cudaError_t launch(const fl_gpu_decode_job *j, const kernel_params *p, int images, int decoded) {
    const long long plane = (long long)j->out_h * j->out_w, threads = 256;
    const unsigned blocks = (unsigned)((plane + threads - 1) / threads < 1024 ? (plane + threads - 1) / threads : 1024);
    cudaStream_t stream = (cudaStream_t)j->stream;
    (void)cudaGetLastError(); /* report only these launches' errors */
    if (decoded > 0)
        horizontal_pass<<<dim3(blocks, (unsigned)decoded), (unsigned)threads, 0, stream>>>(*p);
    if (j->dtype == FL_CUDA_OUT_FLOAT16)
        vertical_pass<FL_CUDA_OUT_FLOAT16><<<dim3(blocks, (unsigned)images), (unsigned)threads, 0, stream>>>(*p);
    else if (j->dtype == FL_CUDA_OUT_BFLOAT16)
        vertical_pass<FL_CUDA_OUT_BFLOAT16><<<dim3(blocks, (unsigned)images), (unsigned)threads, 0, stream>>>(*p);
    else
        vertical_pass<FL_CUDA_OUT_FLOAT32><<<dim3(blocks, (unsigned)images), (unsigned)threads, 0, stream>>>(*p);
    return cudaGetLastError();
}

/* ---- the decoder ---- */

static void backend_free(const fl_nvjpeg_api *nv, backend *b) {
    for (int i = 0; i < 2; i++) {
        if (b->state[i] != NULL)
            nv->state_destroy(b->state[i]);
        if (b->done[i] != NULL)
            cudaEventDestroy(b->done[i]);
    }
    if (b->handle != NULL)
        nv->destroy(b->handle);
    memset(b, 0, sizeof *b);
}

/* A backend with its two states and events, created with `flags` (retried with 0 where the
 * library refuses them: *flags then says 0). Returns an nvJPEG status or a cudaError_t code. */
static int backend_new(const fl_nvjpeg_api *nv, int kind, unsigned *flags, backend *b) {
    memset(b, 0, sizeof *b);
    int status = nv->create_ex(kind, NULL, NULL, *flags, &b->handle);
    if (status != 0 && *flags != 0) {
        b->handle = NULL, *flags = 0;
        status = nv->create_ex(kind, NULL, NULL, 0, &b->handle);
    }
    for (int i = 0; i < 2 && status == 0; i++)
        status = nv->state_create(b->handle, &b->state[i]);
    if (status != 0) {
        backend_free(nv, b);
        return nvjpeg_code(status);
    }
    for (int i = 0; i < 2; i++)
        if (cudaEventCreateWithFlags(&b->done[i], cudaEventDisableTiming) != cudaSuccess) {
            backend_free(nv, b);
            return (int)cudaErrorMemoryAllocation;
        }
    fl_jpeg_states_init(&b->plan);
    b->preallocates = kind == FL_NVJPEG_BACKEND_HARDWARE && nv->batched_preallocate != NULL;
    return 0;
}

int fl_gpu_decoder_new(int device, fl_gpu_decoder **out) {
    *out = NULL;
    const fl_nvjpeg_api *nv = fl_nvjpeg();
    if (nv == NULL)
        return nvjpeg_code(1); /* NVJPEG_STATUS_NOT_INITIALIZED: not loaded */
    fl_cuda_device_guard caller; /* the caller's device comes back on the way out (fl_cuda_device.h) */
    int rc = fl_cuda_device_begin(&caller, device);
    fl_gpu_decoder *d = rc == 0 ? (fl_gpu_decoder *)calloc(1, sizeof *d) : NULL;
    if (d == NULL) {
        fl_cuda_device_end(&caller);
        return rc != 0 ? rc : (int)cudaErrorMemoryAllocation;
    }
    d->device = device;
    d->nv = nv;
    fl_nvjpeg_version(&d->stats.version_major, &d->stats.version_minor);
    unsigned flags = fl_jpeg_handle_flags(d->stats.version_major, d->stats.version_minor);
    /* the engine exists on A100/H100/H200 only: elsewhere this fails (ARCH_MISMATCH, ...) */
    unsigned hw_flags = flags;
    if (backend_new(nv, FL_NVJPEG_BACKEND_HARDWARE, &hw_flags, &d->hw) != 0)
        memset(&d->hw, 0, sizeof d->hw);
    rc = backend_new(nv, FL_NVJPEG_BACKEND_DEFAULT, &flags, &d->sw);
    d->stats.hardware_flags = d->hw.handle != NULL ? hw_flags : 0;
    d->stats.fallback_flags = flags;
    fl_nvjpeg_handle checker = d->hw.handle != NULL ? d->hw.handle : d->sw.handle;
    if (rc == 0)
        rc = nvjpeg_code(nv->stream_create(checker, &d->parsed));
    if (rc == 0)
        rc = nvjpeg_code(nv->params_create(checker, &d->probe));
    if (rc != 0) {
        fl_gpu_decoder_free(d);
        fl_cuda_device_end(&caller);
        return rc;
    }
    fl_jpeg_engine_init(&d->engine, d->hw.handle != NULL);
    *out = d;
    fl_cuda_device_end(&caller);
    return 0;
}

void fl_gpu_decoder_free(fl_gpu_decoder *d) {
    if (d == NULL)
        return;
    const fl_nvjpeg_api *nv = d->nv;
    fl_cuda_device_guard caller; /* the caller's device comes back on the way out (fl_cuda_device.h) */
    fl_cuda_device_begin(&caller, d->device);
    cudaDeviceSynchronize(); /* nvJPEG's buffers may still be in use by queued work */
    for (size_t i = 0; i < d->n_params; i++)
        nv->params_destroy(d->params[i]);
    if (d->probe != NULL)
        nv->params_destroy(d->probe);
    if (d->parsed != NULL)
        nv->stream_destroy(d->parsed);
    backend_free(nv, &d->hw);
    backend_free(nv, &d->sw);
    free(d->params), free(d->data), free(d->lengths), free(d->images), free(d->order), free(d->descs);
    free(d->dest);
    for (int k = 0; k < FL_GPU_UPLOAD_BUFFERS; k++) {
        if (d->upload[k] != NULL)
            cudaFreeHost(d->upload[k]);
        if (d->uploaded[k] != NULL)
            cudaEventDestroy(d->uploaded[k]);
    }
    fl_cuda_device_end(&caller);
    free(d);
}

int fl_gpu_decoder_has_hardware(const fl_gpu_decoder *d) { return d->hw.handle != NULL; }

int fl_gpu_decoder_decodes_regions(const fl_gpu_decoder *d) { return fl_jpeg_engine_regions(&d->engine); }

void fl_gpu_decoder_get_stats(const fl_gpu_decoder *d, fl_gpu_decoder_stats *out) {
    *out = d->stats;
    out->engine_on = fl_jpeg_engine_usable(&d->engine);
    out->regions_on = fl_jpeg_engine_regions(&d->engine);
    out->demotions = d->engine.demotions;
    out->engine_errors = d->engine.errors_total;
}

/* Grows the per-image host scratch to n entries. */
static int reserve(fl_gpu_decoder *d, size_t n) {
    if (n <= d->capacity)
        return 0;
    void *p[7] = {realloc(d->data, n * sizeof *d->data), NULL, NULL, NULL, NULL, NULL, NULL};
    if (p[0]) d->data = (const unsigned char **)p[0];
    p[1] = realloc(d->lengths, n * sizeof *d->lengths);
    if (p[1]) d->lengths = (size_t *)p[1];
    p[2] = realloc(d->images, n * sizeof *d->images);
    if (p[2]) d->images = (fl_nvjpeg_image *)p[2];
    p[3] = realloc(d->order, n * sizeof *d->order);
    if (p[3]) d->order = (int *)p[3];
    p[4] = realloc(d->descs, n * sizeof *d->descs);
    if (p[4]) d->descs = (image_desc *)p[4];
    p[5] = realloc(d->params, n * sizeof *d->params);
    if (p[5]) d->params = (fl_nvjpeg_params *)p[5];
    p[6] = realloc(d->dest, n * sizeof *d->dest);
    if (p[6]) d->dest = (unsigned char *)p[6];
    for (int i = 0; i < 7; i++)
        if (p[i] == NULL)
            return (int)cudaErrorMemoryAllocation;
    d->capacity = n;
    return 0;
}

/* Makes params for the first n engine images (kept from batch to batch). */
static int reserve_params(fl_gpu_decoder *d, size_t n) {
    for (; d->n_params < n; d->n_params++) {
        int status = d->nv->params_create(d->hw.handle, &d->params[d->n_params]);
        if (status == 0)
            status = d->nv->params_set_output_format(d->params[d->n_params], FL_NVJPEG_OUTPUT_RGBI);
        if (status != 0)
            return nvjpeg_code(status);
    }
    return 0;
}

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Where one batch's parts sit, host and device. */
typedef struct batch_plan {
    size_t n_hw, n_sw, n_pixels, n_images; /* order[]: engine images, fallback images, CPU pixels */
    size_t n_regions, n_refused;           /* engine images decoded as regions; refused by the engine */
    int max_w, max_h;                      /* the largest engine image */
    size_t descs_bytes, tables_bytes, upload_bytes;
    size_t decoded_at, tmp_at, pixels_at, total;
    uint8_t *device;                       /* one fl_cuda_alloc_async allocation */
    uint8_t *upload;                       /* pinned: the upload, written here, copied from here */
    fl_gpu_upload_turn turn;               /* which of the decoder's pinned buffers that is */
} batch_plan;

/* What a support check needs: the decoder and the image. */
typedef struct support_query {
    fl_gpu_decoder *d;
    const fl_gpu_record *r;
    const uint8_t *jpeg;
    int parsed;                            /* 0: not yet, 1: parsed, -1: did not parse */
} support_query;

/* fl_jpeg_ask: nvjpegDecodeBatchedSupportedEx on the image, with its region or whole. */
static int ask_engine(void *context, int region) {
    support_query *q = (support_query *)context;
    const fl_nvjpeg_api *nv = q->d->nv;
    if (q->parsed == 0)
        q->parsed = nv->stream_parse_header(q->d->hw.handle, q->jpeg, q->r->length, q->d->parsed) == 0 ? 1 : -1;
    if (q->parsed < 0)
        return 0;
    const int status = region ? nv->params_set_roi(q->d->probe, (int)q->r->x0, (int)q->r->y0, (int)q->r->rect_w,
                                                   (int)q->r->rect_h)
                              : nv->params_set_roi(q->d->probe, 0, 0, -1, -1);
    int refused = 1;
    return status == 0 && nv->batched_supported_ex(q->d->hw.handle, q->d->parsed, q->d->probe, &refused) == 0 &&
           refused == 0;
}

/* Routes every entry (fl_jpeg_route: per image, the engine asked about each of its own) into
 * d->dest, then sorts them into d->order: engine, fallback, CPU pixels (failed ones left out);
 * sizes the upload. With no_engine every JPEG goes to the fallback backend. */
static void sort_entries(fl_gpu_decoder *d, const fl_gpu_decode_job *j, int no_engine, batch_plan *b) {
    const int engine = fl_jpeg_engine_usable(&d->engine) && !no_engine, regions = fl_jpeg_engine_regions(&d->engine);
    for (size_t i = 0; i < j->n; i++) {
        const fl_gpu_record *r = record_of(j, i);
        support_query q = {d, r, payload_of(j, i), 0};
        d->dest[i] = (unsigned char)fl_jpeg_route(r->route, j->failed[i], engine, regions, ask_engine, &q);
        b->n_refused += engine && r->route == FL_GPU_JPEG_HARDWARE && d->dest[i] == FL_JPEG_FALLBACK;
    }
    static const int groups[3][2] = {{FL_JPEG_ENGINE_REGION, FL_JPEG_ENGINE_WHOLE},
                                     {FL_JPEG_FALLBACK, FL_JPEG_FALLBACK},
                                     {FL_JPEG_PIXELS, FL_JPEG_PIXELS}};
    size_t k = 0;
    size_t *counts[3] = {&b->n_hw, &b->n_sw, &b->n_pixels};
    for (int g = 0; g < 3; g++)
        for (size_t i = 0; i < j->n; i++) {
            if (d->dest[i] != groups[g][0] && d->dest[i] != groups[g][1])
                continue;
            const fl_gpu_record *r = record_of(j, i);
            d->order[k++] = (int)i;
            (*counts[g])++;
            b->n_regions += d->dest[i] == FL_JPEG_ENGINE_REGION;
            if (g == 0) {
                b->max_w = (int)r->image_w > b->max_w ? (int)r->image_w : b->max_w;
                b->max_h = (int)r->image_h > b->max_h ? (int)r->image_h : b->max_h;
            }
            if (g != 2)
                b->tables_bytes += fl_gpu_tables_bytes(j->out_h, j->out_w, r->taps_x, r->taps_y);
        }
    b->n_images = k;
    b->descs_bytes = align_up(k * sizeof(image_desc));
    b->upload_bytes = b->descs_bytes + align_up(b->tables_bytes);
}

/* 1 when entry i is decoded as its rectangle only. */
static int is_region(const fl_gpu_decoder *d, size_t i) { return d->dest[i] == FL_JPEG_ENGINE_REGION; }

/* Bytes of entry i's decode: its rectangle (region decodes) or the whole image. */
static size_t decoded_bytes(const fl_gpu_decoder *d, const fl_gpu_record *r, size_t i) {
    const int region = is_region(d, i);
    return align_up((size_t)3 * (region ? r->rect_w : r->image_w) * (region ? r->rect_h : r->image_h));
}

/* Sizes the device allocation: upload, decoded images, first-pass rows, CPU pixels. */
static void size_device(const fl_gpu_decoder *d, const fl_gpu_decode_job *j, batch_plan *b) {
    size_t decoded = 0, tmp = 0;
    for (size_t k = 0; k < b->n_hw + b->n_sw; k++) {
        const size_t i = (size_t)d->order[k];
        const fl_gpu_record *r = record_of(j, i);
        decoded += decoded_bytes(d, r, i);
        tmp += align_up((size_t)3 * r->rect_h * j->out_w);
    }
    b->decoded_at = b->upload_bytes;
    b->tmp_at = b->decoded_at + decoded;
    b->pixels_at = b->tmp_at + tmp;
    b->total = b->pixels_at + b->n_pixels * align_up(3 * j->out_h * j->out_w);
}

/* The pinned buffer this batch's upload is written into and copied from (defect: it was
 * pageable, so every copy was staged by the driver): the last copy from it waited for, grown
 * when too small (fl_gpu_upload_ring: no allocation for a size seen before). */
static int take_upload(fl_gpu_decoder *d, batch_plan *b) {
    b->turn = fl_gpu_upload_take(&d->ring, b->upload_bytes);
    const int k = b->turn.buffer;
    cudaError_t rc = b->turn.wait ? cudaEventSynchronize(d->uploaded[k]) : cudaSuccess;
    if (rc == cudaSuccess && d->uploaded[k] == NULL)
        rc = cudaEventCreateWithFlags(&d->uploaded[k], cudaEventDisableTiming);
    if (rc != cudaSuccess)
        return (int)rc;
    if (b->turn.grow_to != 0) {
        if (d->upload[k] != NULL)
            cudaFreeHost(d->upload[k]);
        d->upload[k] = NULL;
        rc = cudaMallocHost((void **)&d->upload[k], b->turn.grow_to);
        if (rc != cudaSuccess)
            d->upload[k] = NULL;
    }
    fl_gpu_upload_allocated(&d->ring, &b->turn, d->upload[k] != NULL);
    b->upload = d->upload[k];
    return (int)rc;
}

/* Fills the descriptors, the nvJPEG destinations and the pinned upload (descriptors, tables). */
static int fill_plan(fl_gpu_decoder *d, const fl_gpu_decode_job *j, batch_plan *b) {
    int rc = take_upload(d, b);
    if (rc != 0)
        return rc;
    size_t decoded = b->decoded_at, tmp = b->tmp_at, pixels = b->pixels_at, tables = b->descs_bytes;
    for (size_t k = 0; k < b->n_images; k++) {
        const size_t i = (size_t)d->order[k];
        const fl_gpu_record *r = record_of(j, i);
        image_desc *desc = &d->descs[k];
        memset(desc, 0, sizeof *desc);
        desc->index = (int)i;
        if (d->dest[i] == FL_JPEG_PIXELS) {
            desc->src = b->device + pixels;
            desc->pitch = (long long)j->out_w * 3;
            pixels += align_up(3 * j->out_h * j->out_w);
            continue;
        }
        const int region = is_region(d, i);
        const size_t width = region ? r->rect_w : r->image_w, bytes = fl_gpu_tables_bytes(j->out_h, j->out_w, r->taps_x, r->taps_y);
        *desc = (image_desc){b->device + decoded, (long long)width * 3, region ? 0 : (int)r->x0, region ? 0 : (int)r->y0,
                             (int)r->rect_h, 1, r->flip, (int)r->taps_x, (int)r->taps_y, (int)i,
                             (const int32_t *)(b->device + tables), b->device + tmp};
        memcpy(b->upload + tables, payload_of(j, i) + r->tables_at, bytes);
        memset(&d->images[k], 0, sizeof d->images[k]);
        d->images[k].channel[0] = b->device + decoded;
        d->images[k].pitch[0] = width * 3;
        d->data[k] = payload_of(j, i);
        d->lengths[k] = r->length;
        decoded += decoded_bytes(d, r, i);
        tmp += align_up((size_t)3 * r->rect_h * j->out_w);
        tables += bytes;
    }
    memcpy(b->upload, d->descs, b->n_images * sizeof *d->descs);
    return 0;
}

/* Makes one of the backend's states ready for a batch of n (fl_jpeg_states_next's step):
 * waits for the decode that last used it, initializes it once per batch size, pre-allocates
 * the hardware backend's buffers as images grow. Returns 0, an nvJPEG code or a CUDA code. */
static int take_state(fl_gpu_decoder *d, backend *be, int n, int max_w, int max_h, fl_jpeg_state_step *step) {
    fl_jpeg_states_next(&be->plan, n, max_w, max_h, be->preallocates, step);
    if (step->wait) { /* host wait: nvJPEG's rule is no initialize while a decode on the state runs */
        int rc = (int)cudaEventSynchronize(be->done[step->slot]);
        if (rc != 0)
            return rc;
    }
    int status = step->initialize ? d->nv->batched_initialize(be->handle, be->state[step->slot], n, 1,
                                                               FL_NVJPEG_OUTPUT_RGBI) : 0;
    if (status != 0) {
        fl_jpeg_states_forget(&be->plan, step->slot);
        return nvjpeg_code(status);
    }
    if (step->preallocate && d->nv->batched_preallocate(be->handle, be->state[step->slot], n, step->width, step->height,
                                                        FL_NVJPEG_CSS_444, FL_NVJPEG_OUTPUT_RGBI) != 0)
        be->preallocates = 0; /* an optimization only: decoding works without it */
    return 0;
}

/* Records the slot's event after its decode on the stream. Returns a CUDA code. */
static int release_state(backend *be, const fl_jpeg_state_step *step, const fl_gpu_decode_job *j, int decode_status) {
    if (decode_status != 0)
        fl_jpeg_states_forget(&be->plan, step->slot); /* initialized again before its next use */
    int rc = (int)cudaEventRecord(be->done[step->slot], (cudaStream_t)j->stream);
    if (rc == 0)
        fl_jpeg_states_queued(&be->plan, step->slot);
    return rc;
}

/* The engine's batch, each image as its region or whole. Returns 0, the nvJPEG status of a
 * refused batch (as is), or in *rc a CUDA code that ends the call. */
static int decode_engine(fl_gpu_decoder *d, const fl_gpu_decode_job *j, const batch_plan *b, int *rc) {
    const fl_nvjpeg_api *nv = d->nv;
    const int n = (int)b->n_hw;
    fl_jpeg_state_step step;
    *rc = take_state(d, &d->hw, n, b->max_w, b->max_h, &step);
    if (*rc >= FL_GPU_NVJPEG_ERROR) { /* the engine refused the initialize: an engine error */
        int status = *rc - FL_GPU_NVJPEG_ERROR;
        *rc = 0;
        return status;
    }
    if (*rc != 0)
        return 0;
    int status = 0;
    for (int k = 0; k < n && status == 0; k++) {
        const size_t i = (size_t)d->order[k];
        const fl_gpu_record *r = record_of(j, i);
        status = is_region(d, i) ? nv->params_set_roi(d->params[k], (int)r->x0, (int)r->y0, (int)r->rect_w, (int)r->rect_h)
                                 : nv->params_set_roi(d->params[k], 0, 0, -1, -1);
    }
    if (status == 0)
        status = nv->batched_ex(d->hw.handle, d->hw.state[step.slot], d->data, d->lengths, d->images, d->params,
                                (void *)j->stream);
    *rc = release_state(&d->hw, &step, j, status);
    return status;
}

/* The fallback backend, the images [first, first + n) of order[]. Returns an nvJPEG status
 * (0: queued), or in *rc a CUDA code that ends the call. */
static int decode_fallback(fl_gpu_decoder *d, const fl_gpu_decode_job *j, size_t first, size_t n, int *rc) {
    fl_jpeg_state_step step;
    *rc = take_state(d, &d->sw, (int)n, 0, 0, &step);
    if (*rc >= FL_GPU_NVJPEG_ERROR) { /* refused: decoded one by one, then by the CPU */
        int status = *rc - FL_GPU_NVJPEG_ERROR;
        *rc = 0;
        return status;
    }
    if (*rc != 0)
        return 0;
    int status = d->nv->batched(d->sw.handle, d->sw.state[step.slot], d->data + first, d->lengths + first,
                                d->images + first, (void *)j->stream);
    *rc = release_state(&d->sw, &step, j, status);
    return status;
}

/* After a refused fallback batch: each image alone, flagging those nvJPEG cannot decode
 * (the caller decodes them on the CPU). Returns how many were flagged. */
static size_t decode_one_by_one(fl_gpu_decoder *d, fl_gpu_decode_job *j, size_t first, size_t n, int *rc) {
    size_t flagged = 0;
    for (size_t k = first; k < first + n && *rc == 0; k++)
        if (decode_fallback(d, j, k, 1, rc) != 0 && *rc == 0)
            j->failed[d->order[k]] = 1, flagged++;
    return flagged;
}

typedef enum retry { RETRY_NONE = 0, RETRY_WITHOUT_ENGINE = 1, RETRY_WITHOUT_FAILED = 2 } retry;

/* Queues the upload, the CPU pixels' copies and the decodes. Returns a code, and in *again
 * whether the batch must be planned again (the engine failed on it; images were flagged). */
static int queue_decodes(fl_gpu_decoder *d, fl_gpu_decode_job *j, const batch_plan *b, retry *again) {
    cudaStream_t stream = (cudaStream_t)j->stream;
    int rc = (int)cudaMemcpyAsync(b->device, b->upload, b->upload_bytes, cudaMemcpyHostToDevice, stream);
    if (rc == 0)
        rc = (int)cudaEventRecord(d->uploaded[b->turn.buffer], stream);
    if (rc == 0)
        fl_gpu_upload_queued(&d->ring, &b->turn);
    for (size_t k = b->n_hw + b->n_sw; rc == 0 && k < b->n_images; k++)
        rc = (int)cudaMemcpyAsync((void *)d->descs[k].src, payload_of(j, (size_t)d->order[k]), 3 * j->out_h * j->out_w,
                                  cudaMemcpyHostToDevice, stream);
    if (rc != 0)
        return rc;
    if (b->n_hw > 0) {
        rc = reserve_params(d, b->n_hw);
        if (rc != 0)
            return rc;
        /* the images were each checked as supported: a failure now is the engine's error */
        const int ok = decode_engine(d, j, b, &rc) == 0;
        if (rc != 0)
            return rc;
        fl_jpeg_engine_result(&d->engine, ok);
        if (!ok) {
            *again = RETRY_WITHOUT_ENGINE;
            return 0;
        }
    }
    if (b->n_sw > 0 && decode_fallback(d, j, b->n_hw, b->n_sw, &rc) != 0 && rc == 0 &&
        decode_one_by_one(d, j, b->n_hw, b->n_sw, &rc) > 0 && rc == 0)
        *again = RETRY_WITHOUT_FAILED;
    return rc;
}

/* One try at the batch: plan, decode, launch (unless it must be planned again), free. */
static int decode_once(fl_gpu_decoder *d, fl_gpu_decode_job *j, int no_engine, retry *again) {
    batch_plan b;
    memset(&b, 0, sizeof b);
    sort_entries(d, j, no_engine, &b);
    if (b.n_images == 0)
        return 0;
    if (b.n_images > 65535)
        return (int)cudaErrorInvalidValue; /* one grid row per image */
    size_device(d, j, &b);
    int rc = fl_cuda_alloc_async(d->device, b.total, j->stream, (void **)&b.device);
    if (rc == 0)
        rc = fill_plan(d, j, &b);
    if (rc == 0)
        rc = queue_decodes(d, j, &b, again);
    if (rc == 0 && *again == RETRY_NONE) {
        kernel_params p = {(const image_desc *)b.device, (int)j->out_h, (int)j->out_w, j->dst_chw,
                           {j->a[0], j->a[1], j->a[2]}, {j->b[0], j->b[1], j->b[2]}, j->dst, (int)j->dtype};
        rc = (int)launch(j, &p, (int)b.n_images, (int)(b.n_hw + b.n_sw));
        j->decoded[0] = b.n_hw, j->decoded[1] = b.n_sw, j->decoded[2] = b.n_pixels;
        j->regions = b.n_regions;
    }
    if (rc == 0 && !no_engine) /* refusals as the engine answered them, not once per retry */
        j->refused = b.n_refused;
    int freed = b.device ? fl_cuda_free_async(d->device, b.device, j->stream) : 0;
    return rc ? rc : freed;
}

int fl_gpu_decode(fl_gpu_decoder *d, fl_gpu_decode_job *j) {
    fl_cuda_device_guard caller; /* the caller's device comes back on the way out (fl_cuda_device.h) */
    int rc = fl_cuda_device_begin(&caller, d->device);
    if (rc == 0)
        rc = reserve(d, j->n ? j->n : 1);
    fl_jpeg_engine_begin_batch(&d->engine);
    int no_engine = 0;
    /* each retry drops the engine or flags at least one image: at most n + 1 of them */
    for (size_t attempt = 0; rc == 0 && attempt <= j->n + 1; attempt++) {
        retry again = RETRY_NONE;
        rc = decode_once(d, j, no_engine, &again);
        if (again == RETRY_NONE)
            break;
        no_engine |= again == RETRY_WITHOUT_ENGINE;
    }
    if (rc == 0) {
        d->stats.hardware += j->decoded[0], d->stats.fallback += j->decoded[1], d->stats.pixels += j->decoded[2];
        d->stats.regions += j->regions, d->stats.refused += j->refused;
    }
    if (rc != 0 && rc < FL_GPU_NVJPEG_ERROR)
        (void)cudaGetLastError();
    fl_cuda_device_end(&caller);
    return rc;
}
