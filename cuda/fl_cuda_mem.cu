/* fl_cuda_mem.cu - the runtime calls declared in fl_cuda_mem.h. */
#include "fl_cuda_mem.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>

static cudaStream_t as_stream(uintptr_t stream) { return (cudaStream_t)stream; }

#define MAX_DEVICES 64

/* Per-device pools, made on first use and kept (release threshold: never) for the process. */
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaMemPool_t pools[MAX_DEVICES];
static int pools_tried[MAX_DEVICES];

/* *pool = the device's pool, or NULL where the device has no memory pools. */
static cudaError_t device_pool(int device, cudaMemPool_t *pool) {
    cudaError_t rc = cudaSuccess;
    *pool = NULL;
    if (device < 0 || device >= MAX_DEVICES)
        return cudaErrorInvalidDevice;
    pthread_mutex_lock(&pools_lock);
    if (!pools_tried[device]) {
        int supported = 0;
        rc = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device);
        if (rc == cudaSuccess && supported) {
            cudaMemPoolProps props = {};
            props.allocType = cudaMemAllocationTypePinned;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = device;
            rc = cudaMemPoolCreate(&pools[device], &props);
            unsigned long long keep = ~0ull;
            if (rc == cudaSuccess)
                rc = cudaMemPoolSetAttribute(pools[device], cudaMemPoolAttrReleaseThreshold, &keep);
        }
        pools_tried[device] = rc == cudaSuccess;
    }
    *pool = pools[device];
    pthread_mutex_unlock(&pools_lock);
    return rc;
}

int fl_cuda_alloc_async(int device, size_t bytes, uintptr_t stream, void **ptr) {
    cudaMemPool_t pool = NULL;
    *ptr = NULL;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = device_pool(device, &pool);
    if (rc == cudaSuccess)
        rc = pool ? cudaMallocFromPoolAsync(ptr, bytes, pool, as_stream(stream)) : cudaMalloc(ptr, bytes);
    return (int)rc;
}

int fl_cuda_free_async(int device, void *ptr, uintptr_t stream) {
    if (ptr == NULL)
        return 0;
    cudaMemPool_t pool = NULL;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = device_pool(device, &pool);
    if (rc == cudaSuccess && pool != NULL)
        return (int)cudaFreeAsync(ptr, as_stream(stream));
    if (rc == cudaSuccess) /* no pools: plain cudaMalloc memory, freed after a wait */
        rc = cudaStreamSynchronize(as_stream(stream));
    cudaFree(ptr);
    return (int)rc;
}

int fl_cuda_malloc(int device, size_t bytes, void **ptr) {
    *ptr = NULL;
    cudaError_t rc = cudaSetDevice(device);
    return rc != cudaSuccess ? (int)rc : (int)cudaMalloc(ptr, bytes);
}

int fl_cuda_free(int device, void *ptr) {
    if (ptr == NULL)
        return 0;
    cudaError_t rc = cudaSetDevice(device);
    return rc != cudaSuccess ? (int)rc : (int)cudaFree(ptr);
}

int fl_cuda_to_device(int device, void *dst, const void *src, size_t bytes, uintptr_t stream,
                      int wait) {
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream));
    if (rc == cudaSuccess && wait)
        rc = cudaStreamSynchronize(as_stream(stream));
    return (int)rc;
}

int fl_cuda_to_host(int device, void *dst, const void *src, size_t bytes, uintptr_t stream) {
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream));
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(as_stream(stream));
    return (int)rc;
}

int fl_cuda_stream_create(int device, uintptr_t *stream) {
    cudaStream_t created = NULL;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
    *stream = (uintptr_t)created;
    return (int)rc;
}

int fl_cuda_stream_destroy(int device, uintptr_t stream) {
    cudaError_t rc = cudaSetDevice(device);
    return rc != cudaSuccess ? (int)rc : (int)cudaStreamDestroy(as_stream(stream));
}

int fl_cuda_stream_synchronize(int device, uintptr_t stream) {
    cudaError_t rc = cudaSetDevice(device);
    return rc != cudaSuccess ? (int)rc : (int)cudaStreamSynchronize(as_stream(stream));
}

int fl_cuda_stream_query(int device, uintptr_t stream, int *done) {
    *done = 0;
    cudaError_t rc = cudaSetDevice(device);
    if (rc != cudaSuccess)
        return (int)rc;
    rc = cudaStreamQuery(as_stream(stream));
    *done = rc == cudaSuccess;
    return rc == cudaErrorNotReady ? 0 : (int)rc;
}

int fl_cuda_stream_wait(int device, uintptr_t waiter, uintptr_t producer) {
    cudaEvent_t event = NULL;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(event, as_stream(producer));
    if (rc == cudaSuccess)
        rc = cudaStreamWaitEvent(as_stream(waiter), event, 0);
    if (event != NULL)
        cudaEventDestroy(event); /* released once the wait no longer needs it */
    return (int)rc;
}

int fl_cuda_event_record(int device, void **event, uintptr_t stream) {
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess && *event == NULL) {
        cudaEvent_t created;
        rc = cudaEventCreateWithFlags(&created, cudaEventDisableTiming);
        if (rc == cudaSuccess)
            *event = created;
    }
    if (rc == cudaSuccess)
        rc = cudaEventRecord((cudaEvent_t)*event, as_stream(stream));
    return (int)rc;
}

int fl_cuda_event_query(void *event, int *done) {
    cudaError_t rc = cudaEventQuery((cudaEvent_t)event);
    *done = rc == cudaSuccess;
    return rc == cudaErrorNotReady ? 0 : (int)rc;
}

int fl_cuda_event_synchronize(void *event) { return (int)cudaEventSynchronize((cudaEvent_t)event); }

void fl_cuda_event_destroy(void *event) {
    if (event != NULL)
        cudaEventDestroy((cudaEvent_t)event);
}

int fl_cuda_host_register(void *ptr, size_t bytes, int *already) {
    *already = 0;
    cudaError_t rc = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (rc == cudaErrorHostMemoryAlreadyRegistered) {
        cudaGetLastError(); /* not sticky, but the runtime keeps it as the "last error" */
        *already = 1;
        return 0;
    }
    return (int)rc;
}

int fl_cuda_host_unregister(void *ptr) { return (int)cudaHostUnregister(ptr); }

/* What memcpy_benchmark holds; each member may be NULL. */
typedef struct bench_buffers {
    void *host, *device;
    int pinned;
    cudaStream_t stream;
    cudaEvent_t start, stop;
} bench_buffers;

static void bench_free(bench_buffers *b) {
    if (b->pinned)
        cudaFreeHost(b->host);
    else
        free(b->host);
    cudaFree(b->device);
    if (b->stream != NULL)
        cudaStreamDestroy(b->stream);
    if (b->start != NULL)
        cudaEventDestroy(b->start);
    if (b->stop != NULL)
        cudaEventDestroy(b->stop);
}

static cudaError_t bench_alloc(bench_buffers *b, size_t bytes) {
    cudaError_t rc = b->pinned ? cudaMallocHost(&b->host, bytes) : cudaSuccess;
    if (!b->pinned && (b->host = malloc(bytes)) == NULL)
        rc = cudaErrorMemoryAllocation;
    if (rc == cudaSuccess)
        rc = cudaMalloc(&b->device, bytes);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaEventCreate(&b->start);
    if (rc == cudaSuccess)
        rc = cudaEventCreate(&b->stop);
    return rc;
}

int fl_cuda_memcpy_benchmark(int device, size_t bytes, int pinned, int repeats, double *gbps) {
    *gbps = 0;
    bench_buffers b = {NULL, NULL, pinned, NULL, NULL, NULL};
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = bench_alloc(&b, bytes);
    if (rc == cudaSuccess) /* the pages are touched here, not inside the timing */
        rc = cudaMemcpyAsync(b.device, b.host, bytes, cudaMemcpyHostToDevice, b.stream);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(b.start, b.stream);
    for (int i = 0; rc == cudaSuccess && i < repeats; i++)
        rc = cudaMemcpyAsync(b.device, b.host, bytes, cudaMemcpyHostToDevice, b.stream);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(b.stop, b.stream);
    if (rc == cudaSuccess)
        rc = cudaEventSynchronize(b.stop);
    float ms = 0;
    if (rc == cudaSuccess)
        rc = cudaEventElapsedTime(&ms, b.start, b.stop);
    if (rc == cudaSuccess && ms > 0)
        *gbps = (double)bytes * repeats / (ms * 1e-3) / 1e9;
    bench_free(&b);
    return (int)rc;
}
