/* fl_cuda_device.h - a scoped device switch: every fl_cuda_* entry point makes its device
 * current and gives the calling thread its own device back before returning, so a fastloop call
 * never changes the device torch (or any other caller) sees as current in that thread.
 *
 * fl_cuda_device_begin() / fl_cuda_device_end() are the pair; .cu files use the RAII
 * fl_cuda_device_scope below, which ends on every return path. The runtime calls go through a
 * table of operations (cudaGetDevice, cudaSetDevice, "has a context") that a FL_TESTING build
 * can replace, so the tests prove every entry point restores the device without a GPU.
 */
#ifndef FL_CUDA_DEVICE_H
#define FL_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* What begin() remembered: the caller's device, and whether end() must switch back to it. */
typedef struct fl_cuda_device_guard {
    int previous;
    int restore;
} fl_cuda_device_guard;

/* Makes `device` current on the calling thread (device < 0: leaves the caller's current device,
 * for calls that bind none). Returns 0 or a cudaError_t code; call fl_cuda_device_end() either
 * way. Never blocks. */
int fl_cuda_device_begin(fl_cuda_device_guard *guard, int device);

/* Gives the thread back the device begin() found, unless that device has no context yet (switching
 * to it would create one: a thread that never chose a device reads as device 0, and a context on
 * GPU 0 from every rank of a multi-GPU job costs memory there). Never fails. */
void fl_cuda_device_end(const fl_cuda_device_guard *guard);

/* The runtime calls the guard makes; each returns 0 or a cudaError_t code. */
typedef struct fl_cuda_device_ops {
    int (*get)(int *device);
    int (*set)(int device);
    int (*has_context)(int device); /* 1: the device's primary context is active (or unknown) */
} fl_cuda_device_ops;

#ifdef FL_TESTING
/* Replaces the operations (NULL: the CUDA runtime's again) and returns the previous table. */
const fl_cuda_device_ops *fl_cuda_device_ops_swap(const fl_cuda_device_ops *ops);
#endif

#ifdef __cplusplus
}

/* The guard for one C++ scope: `fl_cuda_device_scope scope(device); if (scope.rc) return ...;` */
struct fl_cuda_device_scope {
    fl_cuda_device_guard guard;
    int rc;
    explicit fl_cuda_device_scope(int device) : guard(), rc(fl_cuda_device_begin(&guard, device)) {}
    ~fl_cuda_device_scope() { fl_cuda_device_end(&guard); }
    fl_cuda_device_scope(const fl_cuda_device_scope &) = delete;
    fl_cuda_device_scope &operator=(const fl_cuda_device_scope &) = delete;
};
#endif

#endif
