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
#include "fl_cuda_mem.h"
#include "fl_resample_math.cuh"
#include "fl_nvjpeg.h"

enum { ALIGN = 256 };

/* What the kernels know of one image, and of the batch (fl_resample_math.cuh). */
typedef fl_gpu_image_desc image_desc;
typedef fl_gpu_resample_params kernel_params;

struct fl_gpu_decoder {
    int device;
    const fl_nvjpeg_api *nv;
    fl_nvjpeg_handle hw, sw;             /* hardware backend (or NULL), default backend */
    fl_nvjpeg_state hw_state, sw_state;
    fl_nvjpeg_stream parsed;             /* for support checks after a refused batch */
    int regions;                         /* decode rectangles, until the engine keeps failing */
    int engine_off;                      /* the engine kept failing on whole images too */
    int engine_failures;                 /* engine batches refused in a row */
    size_t capacity;                     /* entries the host scratch below holds */
    fl_nvjpeg_params *params;            /* per image of an engine batch */
    size_t n_params;
    const unsigned char **data;
    size_t *lengths;
    fl_nvjpeg_image *images;
    int *order;                          /* entry index of each image, grouped by route */
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

int fl_gpu_decoder_new(int device, fl_gpu_decoder **out) {
    *out = NULL;
    const fl_nvjpeg_api *nv = fl_nvjpeg();
    if (nv == NULL)
        return nvjpeg_code(1); /* NVJPEG_STATUS_NOT_INITIALIZED: not loaded */
    int rc = (int)cudaSetDevice(device);
    if (rc != 0)
        return rc;
    fl_gpu_decoder *d = (fl_gpu_decoder *)calloc(1, sizeof *d);
    if (d == NULL)
        return (int)cudaErrorMemoryAllocation;
    d->device = device;
    d->nv = nv;
    d->regions = 1;
    /* the engine exists on A100/H100/H200 only: elsewhere this fails (ARCH_MISMATCH, ...) */
    if (nv->create_ex(FL_NVJPEG_BACKEND_HARDWARE, NULL, NULL, 0, &d->hw) != 0 ||
        nv->state_create(d->hw, &d->hw_state) != 0) {
        if (d->hw != NULL)
            nv->destroy(d->hw);
        d->hw = NULL, d->hw_state = NULL;
    }
    rc = nvjpeg_code(nv->create_ex(FL_NVJPEG_BACKEND_DEFAULT, NULL, NULL, 0, &d->sw));
    if (rc == 0)
        rc = nvjpeg_code(nv->state_create(d->sw, &d->sw_state));
    if (rc == 0)
        rc = nvjpeg_code(nv->stream_create(d->hw ? d->hw : d->sw, &d->parsed));
    if (rc != 0) {
        fl_gpu_decoder_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void fl_gpu_decoder_free(fl_gpu_decoder *d) {
    if (d == NULL)
        return;
    const fl_nvjpeg_api *nv = d->nv;
    cudaSetDevice(d->device);
    cudaDeviceSynchronize(); /* nvJPEG's buffers may still be in use by queued work */
    for (size_t i = 0; i < d->n_params; i++)
        nv->params_destroy(d->params[i]);
    if (d->parsed != NULL)
        nv->stream_destroy(d->parsed);
    if (d->hw_state != NULL)
        nv->state_destroy(d->hw_state);
    if (d->sw_state != NULL)
        nv->state_destroy(d->sw_state);
    if (d->hw != NULL)
        nv->destroy(d->hw);
    if (d->sw != NULL)
        nv->destroy(d->sw);
    free(d->params), free(d->data), free(d->lengths), free(d->images), free(d->order), free(d->descs);
    for (int k = 0; k < FL_GPU_UPLOAD_BUFFERS; k++) {
        if (d->upload[k] != NULL)
            cudaFreeHost(d->upload[k]);
        if (d->uploaded[k] != NULL)
            cudaEventDestroy(d->uploaded[k]);
    }
    free(d);
}

int fl_gpu_decoder_has_hardware(const fl_gpu_decoder *d) { return d->hw != NULL; }

int fl_gpu_decoder_decodes_regions(const fl_gpu_decoder *d) { return d->regions; }

/* Grows the per-image host scratch to n entries. */
static int reserve(fl_gpu_decoder *d, size_t n) {
    if (n <= d->capacity)
        return 0;
    void *p[6] = {realloc(d->data, n * sizeof *d->data), NULL, NULL, NULL, NULL, NULL};
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
    for (int i = 0; i < 6; i++)
        if (p[i] == NULL)
            return (int)cudaErrorMemoryAllocation;
    d->capacity = n;
    return 0;
}

/* Makes params for the first n engine images (kept from batch to batch). */
static int reserve_params(fl_gpu_decoder *d, size_t n) {
    for (; d->n_params < n; d->n_params++) {
        int status = d->nv->params_create(d->hw, &d->params[d->n_params]);
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
    size_t n_hw, n_sw, n_pixels, n_images; /* order[]: engine images, CUDA images, CPU pixels */
    size_t descs_bytes, tables_bytes, upload_bytes;
    size_t decoded_at, tmp_at, pixels_at, total;
    uint8_t *device;                       /* one fl_cuda_alloc_async allocation */
    uint8_t *upload;                       /* pinned: the upload, written here, copied from here */
    fl_gpu_upload_turn turn;               /* which of the decoder's pinned buffers that is */
} batch_plan;

/* Sorts the entries by route into d->order (failed ones left out) and sizes the upload;
 * with no_engine every JPEG goes to the CUDA decoder. */
static void sort_entries(fl_gpu_decoder *d, const fl_gpu_decode_job *j, int no_engine, batch_plan *b) {
    const int engine = d->hw != NULL && !d->engine_off && !no_engine;
    size_t k = 0;
    for (int route = FL_GPU_JPEG_HARDWARE; route <= FL_GPU_PIXELS; route++)
        for (size_t i = 0; i < j->n; i++) {
            const fl_gpu_record *r = record_of(j, i);
            const int to_engine = r->route == FL_GPU_JPEG_HARDWARE && engine;
            int mine = route == FL_GPU_JPEG_HARDWARE ? to_engine
                     : route == FL_GPU_JPEG_CUDA     ? r->route != FL_GPU_PIXELS && !to_engine
                                                     : r->route == FL_GPU_PIXELS;
            if (!mine || j->failed[i])
                continue;
            d->order[k++] = (int)i;
            b->n_hw += route == FL_GPU_JPEG_HARDWARE;
            b->n_sw += route == FL_GPU_JPEG_CUDA;
            b->n_pixels += route == FL_GPU_PIXELS;
            if (r->route != FL_GPU_PIXELS)
                b->tables_bytes += fl_gpu_tables_bytes(j->out_h, j->out_w, r->taps_x, r->taps_y);
        }
    b->n_images = k;
    b->descs_bytes = align_up(k * sizeof(image_desc));
    b->upload_bytes = b->descs_bytes + align_up(b->tables_bytes);
}

/* Bytes of image k's decode: its rectangle (region decodes) or the whole image. */
static size_t decoded_bytes(const fl_gpu_decoder *d, const fl_gpu_record *r, int engine) {
    int region = engine && d->regions;
    return align_up((size_t)3 * (region ? r->rect_w : r->image_w) * (region ? r->rect_h : r->image_h));
}

/* Sizes the device allocation: upload, decoded images, first-pass rows, CPU pixels. */
static void size_device(const fl_gpu_decoder *d, const fl_gpu_decode_job *j, batch_plan *b) {
    size_t decoded = 0, tmp = 0;
    for (size_t k = 0; k < b->n_hw + b->n_sw; k++) {
        const fl_gpu_record *r = record_of(j, (size_t)d->order[k]);
        decoded += decoded_bytes(d, r, k < b->n_hw);
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
        if (r->route == FL_GPU_PIXELS) {
            desc->src = b->device + pixels;
            desc->pitch = (long long)j->out_w * 3;
            pixels += align_up(3 * j->out_h * j->out_w);
            continue;
        }
        const int region = k < b->n_hw && d->regions;
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
        decoded += decoded_bytes(d, r, k < b->n_hw);
        tmp += align_up((size_t)3 * r->rect_h * j->out_w);
        tables += bytes;
    }
    memcpy(b->upload, d->descs, b->n_images * sizeof *d->descs);
    return 0;
}

/* The engine's batch: regions while they are accepted. Returns an nvJPEG status. */
static int decode_engine(fl_gpu_decoder *d, const fl_gpu_decode_job *j, const batch_plan *b) {
    const fl_nvjpeg_api *nv = d->nv;
    int n = (int)b->n_hw;
    int status = nv->batched_initialize(d->hw, d->hw_state, n, 1, FL_NVJPEG_OUTPUT_RGBI);
    if (status != 0 || !d->regions)
        return status ? status : nv->batched(d->hw, d->hw_state, d->data, d->lengths, d->images, (void *)j->stream);
    for (int k = 0; k < n && status == 0; k++) {
        const fl_gpu_record *r = record_of(j, (size_t)d->order[k]);
        status = nv->params_set_roi(d->params[k], (int)r->x0, (int)r->y0, (int)r->rect_w, (int)r->rect_h);
    }
    return status ? status : nv->batched_ex(d->hw, d->hw_state, d->data, d->lengths, d->images, d->params, (void *)j->stream);
}

/* nvJPEG's CUDA decoder, the images [first, first + n) of order[]. Returns a status. */
static int decode_cuda(fl_gpu_decoder *d, const fl_gpu_decode_job *j, size_t first, size_t n) {
    int status = d->nv->batched_initialize(d->sw, d->sw_state, (int)n, 1, FL_NVJPEG_OUTPUT_RGBI);
    return status ? status : d->nv->batched(d->sw, d->sw_state, d->data + first, d->lengths + first, d->images + first,
                                            (void *)j->stream);
}

/* After a refused batch: each image alone, flagging those nvJPEG cannot decode. Returns
 * how many were flagged. */
static size_t decode_one_by_one(fl_gpu_decoder *d, fl_gpu_decode_job *j, size_t first, size_t n) {
    size_t flagged = 0;
    for (size_t k = first; k < first + n; k++)
        if (decode_cuda(d, j, k, 1) != 0)
            j->failed[d->order[k]] = 1, flagged++;
    return flagged;
}

enum { ENGINE_TRIES = 3 }; /* engine batches refused in a row before it gives up a feature */

/* The engine refused a batch (a rectangle it does not take, an image it cannot decode):
 * the batch goes to the CUDA decoder; after ENGINE_TRIES in a row the engine decodes whole
 * images, after as many more it is no longer used. */
static void engine_refused(fl_gpu_decoder *d) {
    if (++d->engine_failures < ENGINE_TRIES)
        return;
    d->engine_failures = 0;
    if (d->regions)
        d->regions = 0;
    else
        d->engine_off = 1;
}

typedef enum retry { RETRY_NONE = 0, RETRY_WITHOUT_ENGINE = 1, RETRY_WITHOUT_FAILED = 2 } retry;

/* Queues the upload, the CPU pixels' copies and the decodes. Returns a code, and in *again
 * whether the batch must be planned again (the engine refused it; images were flagged). */
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
        int status = reserve_params(d, b->n_hw);
        if (status != 0)
            return status;
        if (decode_engine(d, j, b) != 0) {
            engine_refused(d);
            *again = RETRY_WITHOUT_ENGINE;
            return 0;
        }
        d->engine_failures = 0;
    }
    if (b->n_sw > 0 && decode_cuda(d, j, b->n_hw, b->n_sw) != 0 && decode_one_by_one(d, j, b->n_hw, b->n_sw) > 0)
        *again = RETRY_WITHOUT_FAILED;
    return 0;
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
    }
    int freed = b.device ? fl_cuda_free_async(d->device, b.device, j->stream) : 0;
    return rc ? rc : freed;
}

int fl_gpu_decode(fl_gpu_decoder *d, fl_gpu_decode_job *j) {
    int rc = (int)cudaSetDevice(d->device);
    if (rc == 0)
        rc = reserve(d, j->n ? j->n : 1);
    int no_engine = 0;
    /* each retry drops the engine or flags at least one image: at most n + 1 of them */
    for (size_t attempt = 0; rc == 0 && attempt <= j->n + 1; attempt++) {
        retry again = RETRY_NONE;
        rc = decode_once(d, j, no_engine, &again);
        if (again == RETRY_NONE)
            break;
        no_engine |= again == RETRY_WITHOUT_ENGINE;
    }
    if (rc != 0 && rc < FL_GPU_NVJPEG_ERROR)
        (void)cudaGetLastError();
    return rc;
}
