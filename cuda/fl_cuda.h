/* fl_cuda.h - the C interface to fastloop's CUDA code (built only where nvcc exists).
 *
 * Functions return 0 on success or a positive cudaError_t code; fl_cuda_error_name() and
 * fl_cuda_error_string() describe it. None of them needs Python. The CUDA runtime is linked
 * statically and loads the driver (libcuda) on first use, so a machine without a driver
 * still loads this code and gets cudaErrorInsufficientDriver / cudaErrorNoDevice back.
 */
#ifndef FL_CUDA_H
#define FL_CUDA_H

#include <stddef.h>

#include "nn/fl_nn_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_cuda_device {
    char name[256];
    size_t total_memory; /* bytes */
    int major, minor;    /* compute capability */
    int multiprocessors;
    int pci_bus_id;
} fl_cuda_device;

/* The CUDA runtime version this code was built with (e.g. 13000). Never fails. */
int fl_cuda_runtime_version(void);

/* The version the installed driver supports, or 0 when no driver is loaded. Never fails. */
int fl_cuda_driver_version(void);

/* Sets *count to the number of usable devices. Returns 0 or a cudaError_t code. */
int fl_cuda_device_count(int *count);

/* Fills *out for device `index`. Returns 0 or a cudaError_t code. */
int fl_cuda_device_info(int index, fl_cuda_device *out);

/* Runs a vector add of n floats on device `index` (copy in, kernel, copy back, compare)
 * and reports the kernel time in *kernel_ms and the number of wrong results in *errors.
 * Returns 0 or a cudaError_t code. Blocks until the device finishes. */
int fl_cuda_selftest(int index, size_t n, double *kernel_ms, size_t *errors);

/* The CUDA implementation of the model core's device operations (fl_cuda_nn.cu): cuBLAS
 * for gemm (fl_cublas_load() must have succeeded, or open() tries the default names and
 * fails with the reason), kernels for the rest. Never fails; the table is static. */
const fl_nn_backend *fl_cuda_nn_backend(void);

/* A context of that backend that holds only its device (no stream, pool or cuBLAS handle was
 * made): for the tests that run each op into its error path on a machine without a GPU. The
 * backend's close() frees it; NULL when out of memory. Never touches the device. */
void *fl_cuda_nn_bare_context(int device);

/* "cudaErrorNoDevice" and "no CUDA-capable device is detected" for a code. */
const char *fl_cuda_error_name(int code);
const char *fl_cuda_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif
