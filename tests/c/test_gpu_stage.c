/* test_gpu_stage.c - the GPU decoder's pinned upload buffers' bookkeeping (fl_gpu_upload_ring,
 * csrc/data/fl_gpu_stage.h), driven as cuda/fl_gpu_decode.cu drives it, with host memory and
 * "in flight" flags for the buffers and events: batches alternate between the two buffers, a
 * buffer is never written while a copy from it may be in flight, and batches of sizes seen
 * before allocate nothing (the upload used to be a pageable buffer copied by the driver). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/fl_gpu_stage.h"

/* The decoder's side: the buffers, whether a copy from each is in flight, allocations made. */
typedef struct fake_decoder {
    fl_gpu_upload_ring ring;
    uint8_t *buffer[FL_GPU_UPLOAD_BUFFERS];
    size_t bytes[FL_GPU_UPLOAD_BUFFERS];
    int in_flight[FL_GPU_UPLOAD_BUFFERS];
    int allocations;
    int fail_next_allocation;
} fake_decoder;

/* One batch as fl_gpu_decode's take_upload + fill_plan + queue_decodes do it; queue: whether
 * the copy is queued (a retried batch is planned again before its copy). Returns the buffer
 * written, or -1 when its allocation failed. */
static int batch(fake_decoder *d, size_t bytes, int queue) {
    fl_gpu_upload_turn t = fl_gpu_upload_take(&d->ring, bytes);
    const int k = t.buffer;
    CHECK(k >= 0 && k < FL_GPU_UPLOAD_BUFFERS);
    if (t.wait)
        d->in_flight[k] = 0; /* cudaEventSynchronize */
    if (t.grow_to != 0) {
        CHECK(t.grow_to >= bytes);
        CHECK((t.grow_to & (t.grow_to - 1)) == 0); /* a power of two: sizes near it reuse it */
        free(d->buffer[k]);
        d->buffer[k] = d->fail_next_allocation ? NULL : malloc(t.grow_to);
        d->fail_next_allocation = 0;
        d->bytes[k] = d->buffer[k] != NULL ? t.grow_to : 0;
        d->allocations++;
    }
    fl_gpu_upload_allocated(&d->ring, &t, d->buffer[k] != NULL);
    if (d->buffer[k] == NULL)
        return -1;
    CHECK(!d->in_flight[k]); /* never written under a copy */
    CHECK(d->bytes[k] >= bytes);
    memset(d->buffer[k], 0xab, bytes);
    if (queue)
        d->in_flight[k] = 1, fl_gpu_upload_queued(&d->ring, &t); /* cudaMemcpyAsync + cudaEventRecord */
    return k;
}

static void fake_free(fake_decoder *d) {
    for (int k = 0; k < FL_GPU_UPLOAD_BUFFERS; k++)
        free(d->buffer[k]);
}

static void test_batches_alternate_and_wait_for_the_last_copy(void) {
    fake_decoder d;
    memset(&d, 0, sizeof d);
    for (int i = 0; i < 10; i++)
        CHECK(batch(&d, 1600000, 1) == i % 2);
    CHECK(d.allocations == 2);
    fake_free(&d);
}

static void test_batches_of_sizes_seen_before_allocate_nothing(void) {
    fake_decoder d;
    memset(&d, 0, sizeof d);
    const size_t sizes[] = {1600000, 1500000, 1700000, 1234567, 1600001, 900000};
    for (int i = 0; i < 6; i++)
        batch(&d, sizes[i], 1);
    const int warm = d.allocations;
    CHECK(warm <= 2 * FL_GPU_UPLOAD_BUFFERS);
    for (int i = 0; i < 1000; i++)
        batch(&d, sizes[i % 6] - (size_t)(i % 97), 1);
    CHECK(d.allocations == warm); /* no allocation per batch */
    CHECK(batch(&d, 5000000, 1) >= 0); /* a larger batch grows its buffer, once */
    CHECK(d.allocations == warm + 1);
    fake_free(&d);
}

static void test_a_small_first_batch_gets_a_minimum_buffer(void) {
    fake_decoder d;
    memset(&d, 0, sizeof d);
    batch(&d, 300, 1);
    CHECK(d.bytes[0] == 64 << 10);
    for (int i = 0; i < 20; i++)
        batch(&d, 256 + (size_t)i * 1000, 1);
    CHECK(d.allocations == 2);
    fake_free(&d);
}

static void test_a_batch_planned_again_before_its_copy_waits_for_nothing(void) {
    fake_decoder d;
    memset(&d, 0, sizeof d);
    batch(&d, 1000, 1);                        /* buffer 0, copied */
    fl_gpu_upload_turn t = fl_gpu_upload_take(&d.ring, 1000); /* buffer 1: never copied from */
    CHECK(t.buffer == 1 && !t.wait && t.grow_to == 64 << 10);
    fl_gpu_upload_allocated(&d.ring, &t, 1);   /* planned, refused before its copy: not queued */
    t = fl_gpu_upload_take(&d.ring, 1000);
    CHECK(t.buffer == 0 && t.wait && t.grow_to == 0); /* buffer 0's copy may be in flight */
    fl_gpu_upload_allocated(&d.ring, &t, 1);
    t = fl_gpu_upload_take(&d.ring, 1000);
    CHECK(t.buffer == 1 && !t.wait && t.grow_to == 0);
    fake_free(&d);
}

static void test_a_failed_allocation_is_asked_for_again(void) {
    fake_decoder d;
    memset(&d, 0, sizeof d);
    d.fail_next_allocation = 1;
    CHECK(batch(&d, 1000, 1) == -1);
    CHECK(d.ring.capacity[0] == 0);
    CHECK(batch(&d, 1000, 1) == 1);
    CHECK(batch(&d, 1000, 1) == 0); /* buffer 0 allocated this time */
    CHECK(d.allocations == 3);
    fake_free(&d);
}

int main(void) {
    RUN(test_batches_alternate_and_wait_for_the_last_copy);
    RUN(test_batches_of_sizes_seen_before_allocate_nothing);
    RUN(test_a_small_first_batch_gets_a_minimum_buffer);
    RUN(test_a_batch_planned_again_before_its_copy_waits_for_nothing);
    RUN(test_a_failed_allocation_is_asked_for_again);
    return check_failures != 0;
}
