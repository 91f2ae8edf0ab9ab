/* fl_cuda_mem.h - device memory, host<->device copies, streams, events and pinned host
 * memory: the CUDA runtime calls behind fastloop.cuda's DeviceArray, Stream and pin().
 *
 * Every function returns 0 or a positive cudaError_t code (fl_cuda_error_string() says
 * what it means), and leaves no error of its own behind as the runtime's "last error" (torch's
 * next launch check would report it). One that takes a `device` makes it current for the call
 * and gives the calling thread its own device back before returning (fl_cuda_device.h), on
 * every path: Python threads differ, and torch's current device must not change under it. Streams travel as integers, as __cuda_array_interface__ and DLPack
 * number them: a cudaStream_t's value, 1 for the legacy default stream and 2 for the
 * per-thread default stream. Events are opaque pointers (a cudaEvent_t).
 */
#ifndef FL_CUDA_MEM_H
#define FL_CUDA_MEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FL_CUDA_LEGACY_STREAM ((uintptr_t)1)

/* cudaMalloc of `bytes` (>0) into *ptr. The caller frees with fl_cuda_free(). */
int fl_cuda_malloc(int device, size_t bytes, void **ptr);

/* cudaFree: waits for the device's queued work first, as cudaFree does. NULL is a no-op. */
int fl_cuda_free(int device, void *ptr);

/* Like fl_cuda_malloc(), first reusing a block of exactly `bytes` that fl_cuda_cached_free()
 * kept for the device and whose last use is done (never waits for it). For DeviceArrays: a
 * loader's batches come and go at one size, and cudaFree waits for the whole device. */
int fl_cuda_cached_malloc(int device, size_t bytes, void **ptr);

/* Keeps fl_cuda_cached_malloc() memory for reuse instead of freeing it (a bounded cache per
 * device, fl_block_cache.h; what falls out of it is cudaFree'd). The block is reused only once
 * `last_write` (an event recorded after the memory's last queued write, or NULL) and the work
 * queued before this call on the legacy default stream and every blocking stream are done.
 * Never blocks, except for a cudaFree of a block the cache evicts. */
int fl_cuda_cached_free(int device, void *ptr, size_t bytes, void *last_write);

/* cudaFree's every block the device's cache keeps (waits for the device once). */
int fl_cuda_cache_release(int device);

/* Stream-ordered device memory from a per-device pool kept for the life of the process (a
 * batch's scratch is a pool hit, not a cudaMalloc, and nothing synchronizes): *ptr may be used
 * by work queued on `stream` after this call. Where the device has no memory pools, a plain
 * cudaMalloc. Returns 0 or a cudaError_t code. */
int fl_cuda_alloc_async(int device, size_t bytes, uintptr_t stream, void **ptr);

/* Gives fl_cuda_alloc_async() memory back once the work queued on `stream` so far is done
 * (without pools: waits for the stream, then cudaFree). NULL is a no-op. */
int fl_cuda_free_async(int device, void *ptr, uintptr_t stream);

/* Copies host -> device on `stream`. With wait, returns once the copy is done; without,
 * a pinned `src` must stay untouched until the stream passes the copy (pageable memory is
 * staged by the runtime before this returns). */
int fl_cuda_to_device(int device, void *dst, const void *src, size_t bytes, uintptr_t stream,
                      int wait);

/* Copies device -> host on `stream` and waits for it (and what was queued before it). */
int fl_cuda_to_host(int device, void *dst, const void *src, size_t bytes, uintptr_t stream);

/* A new non-blocking stream (no implicit ordering with the legacy default stream). */
int fl_cuda_stream_create(int device, uintptr_t *stream);

/* Destroys a stream; work queued on it still completes. */
int fl_cuda_stream_destroy(int device, uintptr_t stream);

/* Blocks until everything queued on `stream` is done. */
int fl_cuda_stream_synchronize(int device, uintptr_t stream);

/* *done = 1 when everything queued on `stream` is done, else 0. Never blocks. */
int fl_cuda_stream_query(int device, uintptr_t stream, int *done);

/* Makes work queued later on `waiter` wait for what is queued now on `producer`, without
 * blocking the host (an event recorded on producer, waited for by waiter). */
int fl_cuda_stream_wait(int device, uintptr_t waiter, uintptr_t producer);

/* Makes work queued later on `waiter` wait for the work before `event`'s last record (not
 * for what was queued on that stream since). Never blocks the host. */
int fl_cuda_stream_wait_event(int device, uintptr_t waiter, void *event);

/* Records *event on `stream`, creating it first (timing disabled) when *event is NULL. The
 * caller destroys it with fl_cuda_event_destroy(). */
int fl_cuda_event_record(int device, void **event, uintptr_t stream);

/* *done = 1 once the work before the event's last record is done. Never blocks. */
int fl_cuda_event_query(void *event, int *done);

/* Blocks until the work before the event's last record is done. */
int fl_cuda_event_synchronize(void *event);

/* Destroys an event (NULL is a no-op); pending work is unaffected. Never fails. */
void fl_cuda_event_destroy(void *event);

/* Page-locks [ptr, ptr + bytes) for every device (cudaHostRegisterPortable), with `device`
 * current (the loader's: no context is made on another GPU; < 0: the caller's current device).
 * When the range is already registered, returns 0 with *already = 1 (that registration is
 * someone else's to undo) and clears error 712 from the runtime's "last error". */
int fl_cuda_host_register(int device, void *ptr, size_t bytes, int *already);

/* Undoes fl_cuda_host_register(), with `device` current (as it was registered). */
int fl_cuda_host_unregister(int device, void *ptr);

/* Host -> device cudaMemcpyAsync bandwidth in GB/s (1e9 bytes/s): `repeats` copies of
 * `bytes` from pinned (cudaMallocHost) or pageable (malloc) memory, timed with events
 * after one warm-up copy. Blocks for the whole run. */
int fl_cuda_memcpy_benchmark(int device, size_t bytes, int pinned, int repeats, double *gbps);

#ifdef __cplusplus
}
#endif

#endif
