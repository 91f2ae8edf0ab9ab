/* fl_buf.h - a growable byte buffer, and the few protobuf wire-format encoders that
 * TensorBoard's Event/Summary messages need (varint, fixed64, fixed32, length-delimited). */
#ifndef FL_BUF_H
#define FL_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct fl_buf {
    unsigned char *data;
    size_t len, cap;
    int failed; /* set once an allocation failed; later appends do nothing */
} fl_buf;

/* An empty buffer needs no init: fl_buf b = {0}. Frees the bytes; b may be reused. */
void fl_buf_free(fl_buf *b);

/* Appends bytes / formatted text (printf-style, without the NUL). On allocation failure
 * sets b->failed and keeps what it had. */
void fl_buf_append(fl_buf *b, const void *data, size_t len);
void fl_buf_printf(fl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends the shortest decimal text that reads back as exactly `value` ("0.1", "1e+300",
 * "nan", "inf", "-inf"); integral values below 2^53 take a fast path ("42"). */
void fl_buf_double(fl_buf *b, double value);

/* Appends a signed integer in decimal. */
void fl_buf_int(fl_buf *b, int64_t value);

/* Appends a non-negative number of seconds with exactly six decimals ("1712345678.123456"),
 * rounded to the microsecond; negative input is written as 0. */
void fl_buf_seconds(fl_buf *b, double seconds);

/* Protobuf wire format: a field's key, then its value. */
void fl_pb_varint(fl_buf *b, uint64_t value);
void fl_pb_field_varint(fl_buf *b, int field, uint64_t value);
void fl_pb_field_double(fl_buf *b, int field, double value);
void fl_pb_field_float(fl_buf *b, int field, float value);
void fl_pb_field_bytes(fl_buf *b, int field, const void *data, size_t len);

#endif
