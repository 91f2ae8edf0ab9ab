/* fl_cuda_mem.cu - the runtime calls declared in fl_cuda_mem.h. */
#include "fl_cuda_mem.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>

#include "fl_block_cache.h"
#include "fl_cuda_device.h"

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

/* An entry point's result: a failed call's error is also the runtime's "last error" of this
 * thread until someone reads it, and torch's next launch check would report it as its own. */
static int finish(cudaError_t rc) {
    if (rc != cudaSuccess && cudaPeekAtLastError() == rc)
        (void)cudaGetLastError(); /* clears a non-sticky error; a sticky one stays */
    return (int)rc;
}

int fl_cuda_alloc_async(int device, size_t bytes, uintptr_t stream, void **ptr) {
    cudaMemPool_t pool = NULL;
    *ptr = NULL;
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = device_pool(device, &pool);
    if (rc == cudaSuccess)
        rc = pool ? cudaMallocFromPoolAsync(ptr, bytes, pool, as_stream(stream)) : cudaMalloc(ptr, bytes);
    return finish(rc);
}

int fl_cuda_free_async(int device, void *ptr, uintptr_t stream) {
    if (ptr == NULL)
        return 0;
    cudaMemPool_t pool = NULL;
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = device_pool(device, &pool);
    if (rc == cudaSuccess && pool != NULL)
        return finish(cudaFreeAsync(ptr, as_stream(stream)));
    if (rc == cudaSuccess) /* no pools: plain cudaMalloc memory, freed after a wait */
        rc = cudaStreamSynchronize(as_stream(stream));
    cudaFree(ptr);
    return finish(rc);
}

int fl_cuda_malloc(int device, size_t bytes, void **ptr) {
    *ptr = NULL;
    fl_cuda_device_scope scope(device);
    return finish(scope.rc != 0 ? (cudaError_t)scope.rc : cudaMalloc(ptr, bytes));
}

int fl_cuda_free(int device, void *ptr) {
    if (ptr == NULL)
        return 0;
    fl_cuda_device_scope scope(device);
    return finish(scope.rc != 0 ? (cudaError_t)scope.rc : cudaFree(ptr));
}

/* ---- the per-device cache of DeviceArray blocks (fl_block_cache.h) ---- */

#define CACHE_MAX_BYTES ((size_t)2 << 30) /* per device: a few batches of a large model's input */

static fl_block_cache caches[MAX_DEVICES] = {
#define CACHE_INIT FL_BLOCK_CACHE_INIT(CACHE_MAX_BYTES)
#define CACHE_INIT8 CACHE_INIT, CACHE_INIT, CACHE_INIT, CACHE_INIT, CACHE_INIT, CACHE_INIT, CACHE_INIT, CACHE_INIT
    CACHE_INIT8, CACHE_INIT8, CACHE_INIT8, CACHE_INIT8, CACHE_INIT8, CACHE_INIT8, CACHE_INIT8, CACHE_INIT8,
#undef CACHE_INIT8
#undef CACHE_INIT
};

/* A block's fence passed: its event is done (a failed query counts as not done). */
static int fence_passed(void *fence) {
    cudaError_t rc = cudaEventQuery((cudaEvent_t)fence);
    if (rc != cudaSuccess)
        (void)finish(rc); /* cudaErrorNotReady must not linger as the last error */
    return rc == cudaSuccess;
}

/* Frees blocks the cache handed back (evicted or drained); the device is current. */
static void free_blocks(const fl_block *blocks, int n) {
    for (int i = 0; i < n; i++) {
        cudaFree(blocks[i].ptr); /* waits for the device: only past the cache's bounds, or at release */
        cudaEventDestroy((cudaEvent_t)blocks[i].fence);
    }
    if (n > 0)
        (void)finish(cudaPeekAtLastError());
}

int fl_cuda_cached_malloc(int device, size_t bytes, void **ptr) {
    *ptr = NULL;
    if (device < 0 || device >= MAX_DEVICES)
        return fl_cuda_malloc(device, bytes, ptr);
    fl_block block;
    if (fl_block_cache_take(&caches[device], bytes, fence_passed, &block)) {
        cudaEventDestroy((cudaEvent_t)block.fence); /* an event needs no current device */
        *ptr = block.ptr;
        return 0;
    }
    return fl_cuda_malloc(device, bytes, ptr);
}

int fl_cuda_cached_free(int device, void *ptr, size_t bytes, void *last_write) {
    if (ptr == NULL)
        return 0;
    if (device < 0 || device >= MAX_DEVICES)
        return fl_cuda_free(device, ptr);
    fl_cuda_device_scope scope(device);
    cudaEvent_t fence = NULL;
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = cudaEventCreateWithFlags(&fence, cudaEventDisableTiming);
    /* The fence passes once the array's own write is done and what any blocking stream
     * (torch's default stream among them) queued before this free: the legacy default stream
     * waits for both. A consumer on a non-blocking stream must order its own work, as with
     * any stream-ordered allocator. */
    if (rc == cudaSuccess && last_write != NULL)
        rc = cudaStreamWaitEvent(cudaStreamLegacy, (cudaEvent_t)last_write, 0);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(fence, cudaStreamLegacy);
    if (rc != cudaSuccess) { /* no fence: the device-wide wait of cudaFree instead */
        if (fence != NULL)
            cudaEventDestroy(fence);
        if (scope.rc == 0)
            rc = cudaFree(ptr);
        return finish(rc);
    }
    fl_block block = {ptr, bytes, fence}, evicted[FL_BLOCK_CACHE_SLOTS + 1];
    free_blocks(evicted, fl_block_cache_put(&caches[device], &block, evicted));
    return 0;
}

int fl_cuda_cache_release(int device) {
    if (device < 0 || device >= MAX_DEVICES)
        return (int)cudaErrorInvalidDevice;
    fl_block blocks[FL_BLOCK_CACHE_SLOTS];
    int n = fl_block_cache_drain(&caches[device], blocks);
    if (n == 0)
        return 0;
    fl_cuda_device_scope scope(device);
    if (scope.rc == 0)
        free_blocks(blocks, n);
    return finish((cudaError_t)scope.rc);
}

int fl_cuda_to_device(int device, void *dst, const void *src, size_t bytes, uintptr_t stream,
                      int wait) {
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream));
    if (rc == cudaSuccess && wait)
        rc = cudaStreamSynchronize(as_stream(stream));
    return finish(rc);
}

int fl_cuda_to_host(int device, void *dst, const void *src, size_t bytes, uintptr_t stream) {
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream));
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(as_stream(stream));
    return finish(rc);
}

int fl_cuda_stream_create(int device, uintptr_t *stream) {
    cudaStream_t created = NULL;
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
    *stream = (uintptr_t)created;
    return finish(rc);
}

int fl_cuda_stream_destroy(int device, uintptr_t stream) {
    fl_cuda_device_scope scope(device);
    return finish(scope.rc != 0 ? (cudaError_t)scope.rc : cudaStreamDestroy(as_stream(stream)));
}

int fl_cuda_stream_synchronize(int device, uintptr_t stream) {
    fl_cuda_device_scope scope(device);
    return finish(scope.rc != 0 ? (cudaError_t)scope.rc : cudaStreamSynchronize(as_stream(stream)));
}

int fl_cuda_stream_query(int device, uintptr_t stream, int *done) {
    *done = 0;
    fl_cuda_device_scope scope(device);
    if (scope.rc != 0)
        return finish((cudaError_t)scope.rc);
    cudaError_t rc = cudaStreamQuery(as_stream(stream));
    *done = rc == cudaSuccess;
    if (rc == cudaErrorNotReady) {
        (void)finish(rc);
        return 0;
    }
    return finish(rc);
}

int fl_cuda_stream_wait(int device, uintptr_t waiter, uintptr_t producer) {
    cudaEvent_t event = NULL;
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(event, as_stream(producer));
    if (rc == cudaSuccess)
        rc = cudaStreamWaitEvent(as_stream(waiter), event, 0);
    if (event != NULL)
        cudaEventDestroy(event); /* released once the wait no longer needs it */
    return finish(rc);
}

int fl_cuda_stream_wait_event(int device, uintptr_t waiter, void *event) {
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = cudaStreamWaitEvent(as_stream(waiter), (cudaEvent_t)event, 0);
    return finish(rc);
}

int fl_cuda_event_record(int device, void **event, uintptr_t stream) {
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess && *event == NULL) {
        cudaEvent_t created;
        rc = cudaEventCreateWithFlags(&created, cudaEventDisableTiming);
        if (rc == cudaSuccess)
            *event = created;
    }
    if (rc == cudaSuccess)
        rc = cudaEventRecord((cudaEvent_t)*event, as_stream(stream));
    return finish(rc);
}

int fl_cuda_event_query(void *event, int *done) {
    cudaError_t rc = cudaEventQuery((cudaEvent_t)event);
    *done = rc == cudaSuccess;
    if (rc == cudaErrorNotReady) {
        (void)finish(rc);
        return 0;
    }
    return finish(rc);
}

int fl_cuda_event_synchronize(void *event) { return finish(cudaEventSynchronize((cudaEvent_t)event)); }

void fl_cuda_event_destroy(void *event) {
    if (event != NULL)
        (void)finish(cudaEventDestroy((cudaEvent_t)event));
}

int fl_cuda_host_register(int device, void *ptr, size_t bytes, int *already) {
    *already = 0;
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess)
        rc = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (rc == cudaErrorHostMemoryAlreadyRegistered) {
        (void)finish(rc); /* not sticky, but the runtime keeps it as the "last error" */
        *already = 1;
        return 0;
    }
    return finish(rc);
}

int fl_cuda_host_unregister(int device, void *ptr) {
    fl_cuda_device_scope scope(device);
    return finish(scope.rc != 0 ? (cudaError_t)scope.rc : cudaHostUnregister(ptr));
}

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
    fl_cuda_device_scope scope(device);
    cudaError_t rc = (cudaError_t)scope.rc;
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
    return finish(rc);
}
