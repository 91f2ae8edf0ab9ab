/* fl_summary.h - the variable-size monitor records (histograms, images, text) and their
 * TensorBoard encoding: Summary.Value messages in an Event, framed as fl_tfevents does.
 *
 * A record is one malloc'd block (header + payload) that the owner fills, hands to the
 * monitor (fl_monitor_put_summary) and never touches again: the writer thread encodes it
 * (histogram buckets, PNG) off the training thread and frees it.
 *
 * Field numbers follow tensorflow/core/framework/summary.proto, tensor.proto and
 * tensor_shape.proto: Value{tag=1, image=4, histo=5, tensor=8, metadata=9},
 * Image{height=1, width=2, colorspace=3, encoded_image_string=4},
 * HistogramProto{min=1, max=2, num=3, sum=4, sum_squares=5, bucket_limit=6, bucket=7},
 * SummaryMetadata{plugin_data=1 PluginData{plugin_name=1}},
 * TensorProto{dtype=1 (DT_STRING = 7), tensor_shape=2, string_val=8}.
 */
#ifndef FL_SUMMARY_H
#define FL_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_buf.h"

enum { FL_SUMMARY_TAG_MAX = 256 }; /* bytes in fl_summary.tag, the NUL included */

typedef enum fl_summary_kind {
    FL_SUMMARY_HISTOGRAM = 1, /* payload: `count` float64 values; `bins` equal-width buckets */
    FL_SUMMARY_IMAGE = 2,     /* payload: height x width x channels uint8 (1, 3 or 4 channels) */
    FL_SUMMARY_TEXT = 3,      /* payload: `count` bytes of UTF-8 */
} fl_summary_kind;

typedef struct fl_summary {
    int32_t kind;    /* fl_summary_kind */
    int32_t bins;    /* histogram buckets (>= 1) */
    int32_t height, width, channels;
    double wall_time;
    int64_t step;    /* < 0: the monitor stamps its latest step */
    size_t count;    /* histogram values or text bytes */
    char tag[FL_SUMMARY_TAG_MAX];
    unsigned char payload[]; /* the data, copied in by the owner */
} fl_summary;

/* A record of `kind` with room for payload_bytes, wall time now and step -1; tag and the
 * kind's fields are the caller's to fill. Returns NULL when out of memory. Free it with
 * free() (one block). */
fl_summary *fl_summary_new(fl_summary_kind kind, size_t payload_bytes);

/* Appends the framed Event carrying `s` to out (a text summary under "<tag>/text_summary",
 * as SummaryWriter.add_text names it). Returns 0, FL_ENOMEM, or FL_EINVAL when an image
 * cannot be PNG-encoded (zlib not loadable; detail says why). */
int fl_tfevents_append_summary(fl_buf *out, const fl_summary *s);

/* PNG (8-bit gray, RGB or RGBA, no interlace) of an HWC uint8 image, appended to out. zlib
 * is loaded with dlopen on first use (libz.so.1, present wherever Python's zlib is).
 * Returns 0, FL_ENOMEM or FL_EINVAL (bad shape, zlib missing: detail says which). */
int fl_png_encode(fl_buf *out, const unsigned char *hwc, int height, int width, int channels);

#endif
