/* fl_tfevents.h - TensorBoard event files: Event/Summary protobuf messages in TFRecord
 * framing (length, masked CRC-32C of the length, data, masked CRC-32C of the data).
 *
 * Field numbers follow tensorflow/core/util/event.proto and framework/summary.proto:
 * Event{wall_time=1 double, step=2 int64, file_version=3 string, summary=5 Summary},
 * Summary{value=1 repeated Value}, Value{tag=1 string, simple_value=2 float}.
 */
#ifndef FL_TFEVENTS_H
#define FL_TFEVENTS_H

#include <stdint.h>

#include "base/fl_buf.h"

/* Appends one framed record holding `data` to out. */
void fl_tfrecord_append(fl_buf *out, const void *data, size_t len);

/* Appends the framed first record of every event file: file_version "brain.Event:2". */
void fl_tfevents_append_file_version(fl_buf *out, double wall_time);

/* Appends a framed Event carrying one scalar summary value. */
void fl_tfevents_append_scalar(fl_buf *out, double wall_time, int64_t step, const char *tag,
                               float value);

#endif
