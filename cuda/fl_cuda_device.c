/* fl_cuda_device.c - the scoped device switch of fl_cuda_device.h. */
#include "fl_cuda_device.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>

static int runtime_get(int *device) { return (int)cudaGetDevice(device); }

static int runtime_set(int device) { return (int)cudaSetDevice(device); }

/* CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned *flags, int *active), resolved from the
 * libcuda the runtime loaded (the static runtime dlopens it; nothing here links it). */
typedef int (*primary_ctx_state_fn)(int device, unsigned *flags, int *active);
typedef int (*device_get_fn)(int *device, int ordinal);

static int runtime_has_context(int device) {
    static _Atomic(primary_ctx_state_fn) state_fn;
    static _Atomic(device_get_fn) get_fn;
    primary_ctx_state_fn state = atomic_load_explicit(&state_fn, memory_order_acquire);
    device_get_fn get = atomic_load_explicit(&get_fn, memory_order_acquire);
    if (state == NULL || get == NULL) {
        void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (libcuda == NULL)
            return 1; /* unknown: restore, as the runtime would have to */
        get = (device_get_fn)dlsym(libcuda, "cuDeviceGet");
        state = (primary_ctx_state_fn)dlsym(libcuda, "cuDevicePrimaryCtxGetState");
        dlclose(libcuda); /* RTLD_NOLOAD: only the reference taken here */
        if (state == NULL || get == NULL)
            return 1;
        atomic_store_explicit(&get_fn, get, memory_order_release);
        atomic_store_explicit(&state_fn, state, memory_order_release);
    }
    int handle = 0, active = 1;
    unsigned flags = 0;
    if (get(&handle, device) != 0 || state(handle, &flags, &active) != 0)
        return 1;
    return active != 0;
}

static const fl_cuda_device_ops runtime_ops = {runtime_get, runtime_set, runtime_has_context};

/* Replaced only by the tests (FL_TESTING); read once per call. */
static _Atomic(const fl_cuda_device_ops *) current_ops = &runtime_ops;

static const fl_cuda_device_ops *ops(void) {
    return atomic_load_explicit(&current_ops, memory_order_acquire);
}

int fl_cuda_device_begin(fl_cuda_device_guard *guard, int device) {
    const fl_cuda_device_ops *o = ops();
    guard->previous = -1;
    guard->restore = 0;
    if (device < 0)
        return 0;
    int previous = -1;
    if (o->get(&previous) == 0 && previous == device)
        return 0; /* already current: nothing to switch, nothing to restore */
    int rc = o->set(device);
    if (previous >= 0) { /* cudaSetDevice may have failed half-way: give the caller's back anyway */
        guard->previous = previous;
        guard->restore = 1;
    }
    return rc;
}

void fl_cuda_device_end(const fl_cuda_device_guard *guard) {
    const fl_cuda_device_ops *o = ops();
    if (guard->restore && o->has_context(guard->previous))
        (void)o->set(guard->previous);
}

#ifdef FL_TESTING
const fl_cuda_device_ops *fl_cuda_device_ops_swap(const fl_cuda_device_ops *replacement) {
    return atomic_exchange_explicit(&current_ops, replacement ? replacement : &runtime_ops,
                                    memory_order_acq_rel);
}
#endif
