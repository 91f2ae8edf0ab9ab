/* fl_cuda.cu - device queries and a kernel self-test: the proof that fastloop's CUDA build
 * path works, and what fastloop.cuda reports from. */
#include "fl_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cuda_device.h"

int fl_cuda_runtime_version(void) { return CUDART_VERSION; }

int fl_cuda_driver_version(void) {
    int version = 0;
    if (cudaDriverGetVersion(&version) != cudaSuccess)
        return 0;
    return version;
}

int fl_cuda_device_count(int *count) {
    *count = 0;
    cudaError_t rc = cudaGetDeviceCount(count);
    if (rc != cudaSuccess)
        *count = 0;
    return (int)rc;
}

int fl_cuda_device_info(int index, fl_cuda_device *out) {
    memset(out, 0, sizeof *out);
    cudaDeviceProp prop;
    cudaError_t rc = cudaGetDeviceProperties(&prop, index);
    if (rc != cudaSuccess)
        return (int)rc;
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->total_memory = prop.totalGlobalMem;
    out->major = prop.major;
    out->minor = prop.minor;
    out->multiprocessors = prop.multiProcessorCount;
    out->pci_bus_id = prop.pciBusID;
    return 0;
}

__global__ void vector_add(const float *a, const float *b, float *c, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        c[i] = a[i] + b[i];
}

/* Frees what selftest allocated; each pointer may be NULL. */
static void selftest_free(float *host, float *device, cudaEvent_t start, cudaEvent_t stop) {
    free(host);
    cudaFree(device);
    if (start != NULL)
        cudaEventDestroy(start);
    if (stop != NULL)
        cudaEventDestroy(stop);
}

int fl_cuda_selftest(int index, size_t n, double *kernel_ms, size_t *errors) {
    *kernel_ms = 0;
    *errors = 0;
    float *host = NULL, *device = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    fl_cuda_device_scope scope(index); /* the caller's device is current again on return */
    cudaError_t rc = (cudaError_t)scope.rc;
    if (rc == cudaSuccess && (host = (float *)malloc(3 * n * sizeof(float))) == NULL)
        rc = cudaErrorMemoryAllocation;
    if (rc == cudaSuccess)
        rc = cudaMalloc(&device, 3 * n * sizeof(float));
    if (rc == cudaSuccess)
        rc = cudaEventCreate(&start);
    if (rc == cudaSuccess)
        rc = cudaEventCreate(&stop);
    if (rc != cudaSuccess) {
        selftest_free(host, device, start, stop);
        (void)cudaGetLastError(); /* a non-sticky error must not reach the caller's next launch */
        return (int)rc;
    }
    for (size_t i = 0; i < n; i++) {
        host[i] = (float)i;
        host[n + i] = 2.0f * (float)i;
    }
    rc = cudaMemcpy(device, host, 2 * n * sizeof(float), cudaMemcpyHostToDevice);
    if (rc == cudaSuccess) {
        cudaEventRecord(start);
        vector_add<<<256, 256>>>(device, device + n, device + 2 * n, n);
        rc = cudaGetLastError();
        cudaEventRecord(stop);
    }
    if (rc == cudaSuccess)
        rc = cudaMemcpy(host + 2 * n, device + 2 * n, n * sizeof(float), cudaMemcpyDeviceToHost);
    if (rc == cudaSuccess) {
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        *kernel_ms = ms;
        for (size_t i = 0; i < n; i++)
            *errors += host[2 * n + i] != 3.0f * (float)i;
    }
    selftest_free(host, device, start, stop);
    if (rc != cudaSuccess)
        (void)cudaGetLastError();
    return (int)rc;
}

const char *fl_cuda_error_name(int code) { return cudaGetErrorName((cudaError_t)code); }

const char *fl_cuda_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }
