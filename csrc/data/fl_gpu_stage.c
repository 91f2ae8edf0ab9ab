/* fl_gpu_stage.c - one worker's staging of one image for the GPU decoder (fl_gpu_stage.h). */
#include "data/fl_gpu_stage.h"

#include <string.h>

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "data/fl_jpeg_header.h"
#include "ops/fl_ops.h"

_Static_assert(sizeof(fl_gpu_record) <= FL_GPU_RECORD_BYTES, "a record fits its head");

size_t fl_gpu_entry_bytes(size_t out_h, size_t out_w, size_t capacity) {
    const char *what = "a staged image's entry (the decoded output or the capacity, and its record)";
    size_t pixels, total;
    if (fl_size_mul(out_h, out_w, what, &pixels) != FL_OK || fl_size_mul(pixels, 3, what, &pixels) != FL_OK)
        return 0;
    capacity = capacity > pixels ? capacity : pixels;
    if (fl_size_add(capacity, FL_GPU_RECORD_BYTES, what, &total) != FL_OK || fl_size_align(total, 64, what, &total) != FL_OK)
        return 0;
    return total;
}

/* The CPU path's result for an image the GPU decoder cannot take: decode, crop/resize, the
 * flips, into the payload. */
static int stage_pixels(const fl_gpu_stage_job *job, const void *data, size_t len, fl_gpu_reason reason,
                        uint8_t *entry) {
    const fl_image_geometry *g = job->geometry;
    fl_gpu_record *r = (fl_gpu_record *)entry;
    uint8_t *payload = entry + FL_GPU_RECORD_BYTES;
    int rc = fl_image_transform(job->decoder, g, data, len, job->seed, job->id,
                                job->flips != NULL ? job->pixels : payload);
    if (rc == FL_OK && job->flips != NULL) {
        fl_images one = {1, g->out_h, g->out_w, 3};
        rc = fl_pipeline_run(job->flips, (fl_exec){NULL, 1}, job->pixels, one, FL_UINT8, payload,
                             job->pipeline_scratch, job->seed, &job->id);
    }
    if (rc != FL_OK)
        return rc;
    *r = (fl_gpu_record){.route = FL_GPU_PIXELS, .reason = reason, .id = job->id,
                         .length = (uint32_t)(g->out_h * g->out_w * 3)};
    return FL_OK;
}

/* Writes one axis's table (lo, count, weights padded to `taps`) at *at; advances it. */
static void put_axis(const fl_resample_axis *a, size_t taps, int32_t **at) {
    int32_t *lo = *at, *count = lo + a->n, *k = count + a->n;
    for (size_t i = 0; i < a->n; i++) {
        lo[i] = a->lo[i];
        count[i] = a->count[i];
        memcpy(k + i * taps, a->k + i * a->ksize, taps * sizeof *k);
    }
    *at = k + a->n * taps;
}

/* Which decoder takes a parsed JPEG header, or the CPU with the reason. */
static fl_gpu_route route_of(const fl_jpeg_header *h, fl_gpu_reason *reason) {
    const char *why;
    switch (fl_jpeg_route_of(h, &why)) {
    case FL_JPEG_ROUTE_HARDWARE:
        *reason = FL_GPU_REASON_NONE;
        return FL_GPU_JPEG_HARDWARE;
    case FL_JPEG_ROUTE_CUDA:
        *reason = FL_GPU_REASON_SUBSAMPLING;
        return FL_GPU_JPEG_CUDA;
    default:
        *reason = FL_GPU_REASON_UNSUPPORTED;
        return FL_GPU_PIXELS;
    }
}

/* The JPEG routes: the bytes, then the tables, if both fit; FL_EAGAIN when they do not. */
static int stage_jpeg(const fl_gpu_stage_job *job, const void *data, size_t len, const fl_jpeg_header *h,
                      fl_gpu_route route, fl_gpu_reason reason, uint8_t *entry) {
    const fl_image_geometry *g = job->geometry;
    fl_image_rect rect;
    fl_resample_axis ax, ay;
    int rc = fl_image_gpu_plan(g, h->height, h->width, job->seed, job->id, &rect, &ax, &ay);
    int flip = 0;
    if (rc == FL_OK)
        rc = fl_pipeline_draw_flip(job->flips, job->seed, job->id, &flip);
    size_t tables_at = (len + 3) / 4 * 4;
    size_t room = job->entry_bytes - FL_GPU_RECORD_BYTES;
    if (rc == FL_OK && (tables_at > room || fl_gpu_tables_bytes(g->out_h, g->out_w, ax.ksize, ay.ksize) >
                                                room - tables_at))
        rc = FL_EAGAIN;
    if (rc == FL_OK) {
        uint8_t *payload = entry + FL_GPU_RECORD_BYTES;
        memcpy(payload, data, len);
        int32_t *at = (int32_t *)(payload + tables_at);
        put_axis(&ax, ax.ksize, &at);
        put_axis(&ay, ay.ksize, &at);
        *(fl_gpu_record *)entry = (fl_gpu_record){
            .route = route, .reason = reason, .flip = flip, .image_h = h->height, .image_w = h->width,
            .x0 = (uint32_t)rect.x0, .y0 = (uint32_t)rect.y0, .rect_w = (uint32_t)(rect.x1 - rect.x0),
            .rect_h = (uint32_t)(rect.y1 - rect.y0), .taps_x = (uint32_t)ax.ksize, .taps_y = (uint32_t)ay.ksize,
            .length = (uint32_t)len, .tables_at = (uint32_t)tables_at, .id = job->id};
    }
    fl_resample_axis_free(&ax);
    fl_resample_axis_free(&ay);
    return rc;
}

int fl_gpu_stage(const fl_gpu_stage_job *job, const void *data, size_t len, uint8_t *entry) {
    fl_jpeg_header h;
    if (fl_image_sniff(data, len) != FL_IMAGE_JPEG)
        return stage_pixels(job, data, len, FL_GPU_REASON_NOT_JPEG, entry);
    if (fl_jpeg_header_parse(data, len, &h) != FL_OK || (uint64_t)h.height * h.width > fl_image_max_pixels())
        return stage_pixels(job, data, len, FL_GPU_REASON_HEADER, entry); /* its error is the CPU path's */
    fl_gpu_reason reason;
    fl_gpu_route route = route_of(&h, &reason);
    if (route == FL_GPU_PIXELS)
        return stage_pixels(job, data, len, reason, entry);
    int rc = stage_jpeg(job, data, len, &h, route, reason, entry);
    return rc == FL_EAGAIN ? stage_pixels(job, data, len, FL_GPU_REASON_TOO_LARGE, entry) : rc;
}
