/* fl_cuda_preprocess.cu - the preprocess kernel and what queues it (fl_cuda_preprocess.h). */
#include "fl_cuda_preprocess.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cuda_device.h"
#include "fl_cuda_mem.h"
#include "fl_preprocess_math.cuh"

typedef fl_gpu_preprocess_params preprocess_params;

/* One thread per output pixel (grid-strided), all channels of it (fl_preprocess_math.cuh);
 * the dtype a constant, so each instance stores one type. */
template <int Dtype>
__global__ void preprocess_kernel(preprocess_params p) {
    p.dtype = Dtype;
    const long long pixels = p.n * p.out_h * p.out_w;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < pixels;
         i += (long long)gridDim.x * blockDim.x)
        fl_gpu_preprocess_pixel(&p, i);
}

size_t fl_cuda_out_dtype_size(fl_cuda_out_dtype dtype) {
    return dtype == FL_CUDA_OUT_FLOAT32 ? 4 : 2;
}

void fl_cuda_preprocess_coefficients(const float *mean, const float *std, size_t c, float *a,
                                     float *b) {
    const float scale = 1.0f / 255.0f;
    for (size_t ch = 0; ch < c; ch++) {
        a[ch] = scale / std[ch];
        b[ch] = -mean[ch] / std[ch];
    }
}

/* The small arguments laid out as the head of the staging buffer: a, b, offsets, flips. */
typedef struct params_layout {
    size_t offsets_at, flips_at, images_at, total;
} params_layout;

static params_layout layout_of(const fl_cuda_preprocess_job *j) {
    params_layout l;
    l.offsets_at = 2 * j->c * sizeof(float);
    l.flips_at = l.offsets_at + (j->offsets ? 2 * j->n * sizeof(int32_t) : 0);
    l.images_at = (l.flips_at + (j->flips ? j->n : 0) + 255) & ~(size_t)255;
    l.total = l.images_at + j->n * j->h * j->w * j->c;
    return l;
}

/* Queues the copies of the small arguments and of the images into `staging`. */
static cudaError_t queue_copies(const fl_cuda_preprocess_job *j, const params_layout *l,
                                uint8_t *staging, cudaStream_t stream) {
    uint8_t *head = (uint8_t *)malloc(l->images_at);
    if (head == NULL)
        return cudaErrorMemoryAllocation;
    memcpy(head, j->a, j->c * sizeof(float));
    memcpy(head + j->c * sizeof(float), j->b, j->c * sizeof(float));
    if (j->offsets)
        memcpy(head + l->offsets_at, j->offsets, 2 * j->n * sizeof(int32_t));
    if (j->flips)
        memcpy(head + l->flips_at, j->flips, j->n);
    /* pageable: staged by the runtime before the call returns, so `head` can go */
    cudaError_t rc = cudaMemcpyAsync(staging, head, l->images_at, cudaMemcpyHostToDevice, stream);
    free(head);
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(staging + l->images_at, j->host_src, l->total - l->images_at,
                             cudaMemcpyHostToDevice, stream);
    return rc;
}

static cudaError_t queue_kernel(const fl_cuda_preprocess_job *j, const params_layout *l,
                                const uint8_t *staging, cudaStream_t stream) {
    preprocess_params p;
    p.src = staging + l->images_at;
    p.dst = j->dst;
    p.a = (const float *)staging;
    p.b = (const float *)staging + j->c;
    p.offsets = j->offsets ? (const int32_t *)(staging + l->offsets_at) : NULL;
    p.flips = j->flips ? staging + l->flips_at : NULL;
    p.n = (long long)j->n, p.h = (long long)j->h, p.w = (long long)j->w, p.c = (long long)j->c;
    p.out_h = (long long)j->out_h, p.out_w = (long long)j->out_w;
    p.top = (long long)j->top, p.left = (long long)j->left;
    p.src_chw = j->src_chw, p.dst_chw = j->dst_chw;
    p.dtype = (int)j->dst_dtype;
    const long long pixels = p.n * p.out_h * p.out_w, threads = 256;
    const long long blocks = (pixels + threads - 1) / threads;
    if (pixels == 0)
        return cudaSuccess;
    const unsigned grid = (unsigned)(blocks < 65535 ? blocks : 65535);
    (void)cudaGetLastError(); /* report only this launch's error */
    if (j->dst_dtype == FL_CUDA_OUT_FLOAT16)
        preprocess_kernel<FL_CUDA_OUT_FLOAT16><<<grid, threads, 0, stream>>>(p);
    else if (j->dst_dtype == FL_CUDA_OUT_BFLOAT16)
        preprocess_kernel<FL_CUDA_OUT_BFLOAT16><<<grid, threads, 0, stream>>>(p);
    else
        preprocess_kernel<FL_CUDA_OUT_FLOAT32><<<grid, threads, 0, stream>>>(p);
    return cudaGetLastError();
}

int fl_cuda_preprocess(const fl_cuda_preprocess_job *job, void **event) {
    const cudaStream_t stream = (cudaStream_t)job->stream;
    const params_layout l = layout_of(job);
    uint8_t *staging = NULL;
    fl_cuda_device_scope scope(job->device); /* the copies and the launch below need it current */
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = (cudaError_t)fl_cuda_alloc_async(job->device, l.total, job->stream, (void **)&staging);
    if (rc == cudaSuccess)
        rc = queue_copies(job, &l, staging, stream);
    if (rc == cudaSuccess)
        rc = queue_kernel(job, &l, staging, stream);
    if (staging != NULL) {
        cudaError_t freed = (cudaError_t)fl_cuda_free_async(job->device, staging, job->stream);
        rc = rc == cudaSuccess ? freed : rc;
    }
    if (rc == cudaSuccess && event != NULL)
        rc = (cudaError_t)fl_cuda_event_record(job->device, event, job->stream);
    if (rc != cudaSuccess)
        (void)cudaGetLastError();
    return (int)rc;
}
