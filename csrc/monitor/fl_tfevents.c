/* fl_tfevents.c - encoding TensorBoard events as TFRecords. */
#include "monitor/fl_tfevents.h"

#include <string.h>

#include "base/fl_crc.h"

enum {
    EVENT_WALL_TIME = 1,
    EVENT_STEP = 2,
    EVENT_FILE_VERSION = 3,
    EVENT_SUMMARY = 5,
    SUMMARY_VALUE = 1,
    VALUE_TAG = 1,
    VALUE_SIMPLE_VALUE = 2,
};

void fl_tfrecord_append(fl_buf *out, const void *data, size_t len) {
    uint64_t length = len; /* little-endian on every supported platform, as TFRecord wants */
    uint32_t length_crc = fl_crc32c_masked(&length, sizeof length);
    uint32_t data_crc = fl_crc32c_masked(data, len);
    fl_buf_append(out, &length, sizeof length);
    fl_buf_append(out, &length_crc, sizeof length_crc);
    fl_buf_append(out, data, len);
    fl_buf_append(out, &data_crc, sizeof data_crc);
}

void fl_tfevents_append_file_version(fl_buf *out, double wall_time) {
    static const char version[] = "brain.Event:2";
    fl_buf event = {0};
    fl_pb_field_double(&event, EVENT_WALL_TIME, wall_time);
    fl_pb_field_bytes(&event, EVENT_FILE_VERSION, version, sizeof version - 1);
    if (event.failed)
        out->failed = 1;
    else
        fl_tfrecord_append(out, event.data, event.len);
    fl_buf_free(&event);
}

void fl_tfevents_append_scalar(fl_buf *out, double wall_time, int64_t step, const char *tag,
                               float value) {
    fl_buf summary_value = {0}, summary = {0}, event = {0};
    fl_pb_field_bytes(&summary_value, VALUE_TAG, tag, strlen(tag));
    fl_pb_field_float(&summary_value, VALUE_SIMPLE_VALUE, value);
    fl_pb_field_bytes(&summary, SUMMARY_VALUE, summary_value.data, summary_value.len);
    fl_pb_field_double(&event, EVENT_WALL_TIME, wall_time);
    fl_pb_field_varint(&event, EVENT_STEP, (uint64_t)step); /* int64: two's complement */
    fl_pb_field_bytes(&event, EVENT_SUMMARY, summary.data, summary.len);
    if (summary_value.failed || summary.failed || event.failed)
        out->failed = 1;
    else
        fl_tfrecord_append(out, event.data, event.len);
    fl_buf_free(&summary_value);
    fl_buf_free(&summary);
    fl_buf_free(&event);
}
