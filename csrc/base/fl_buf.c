/* fl_buf.c - growable byte buffer and protobuf encoders. */
#include "base/fl_buf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fl_buf_free(fl_buf *b) {
    free(b->data);
    *b = (fl_buf){0};
}

static int reserve(fl_buf *b, size_t extra) {
    if (b->failed)
        return -1;
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    unsigned char *data = realloc(b->data, cap);
    if (data == NULL) {
        b->failed = 1;
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

void fl_buf_append(fl_buf *b, const void *data, size_t len) {
    if (reserve(b, len) == 0) {
        memcpy(b->data + b->len, data, len);
        b->len += len;
    }
}

void fl_buf_printf(fl_buf *b, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, args);
    va_end(args);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        fl_buf_append(b, small, (size_t)n);
        return;
    }
    if (reserve(b, (size_t)n + 1) != 0)
        return;
    va_start(args, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, args);
    va_end(args);
    b->len += (size_t)n;
}

void fl_buf_int(fl_buf *b, int64_t value) {
    char text[24], *p = text + sizeof text;
    uint64_t magnitude = value < 0 ? 0 - (uint64_t)value : (uint64_t)value;
    do {
        *--p = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0)
        *--p = '-';
    fl_buf_append(b, p, (size_t)(text + sizeof text - p));
}

void fl_buf_seconds(fl_buf *b, double seconds) {
    /* Clamped before the cast: a double outside uint64's range (inf, 1e300) is undefined to cast. */
    double scaled = seconds * 1e6 + 0.5;
    uint64_t micros = !(seconds > 0) ? 0 : scaled >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)scaled;
    fl_buf_int(b, (int64_t)(micros / 1000000));
    char fraction[7];
    uint64_t rest = micros % 1000000;
    for (int i = 6; i >= 1; i--, rest /= 10)
        fraction[i] = (char)('0' + rest % 10);
    fraction[0] = '.';
    fl_buf_append(b, fraction, sizeof fraction);
}

void fl_buf_double(fl_buf *b, double value) {
    /* Range first: casting NaN, inf or 1e300 to int64 is undefined behaviour. */
    if (value > -9007199254740992.0 && value < 9007199254740992.0 && value == trunc(value)) {
        fl_buf_int(b, (int64_t)value); /* integral and exact in an int64: no printf */
        return;
    }
    if (isnan(value)) {
        fl_buf_append(b, "nan", 3);
        return;
    }
    if (isinf(value)) {
        fl_buf_append(b, value > 0 ? "inf" : "-inf", value > 0 ? 3 : 4);
        return;
    }
    char text[32];
    for (int digits = 15; digits <= 17; digits++) { /* 17 always round-trips */
        snprintf(text, sizeof text, "%.*g", digits, value);
        if (digits == 17 || strtod(text, NULL) == value)
            break;
    }
    fl_buf_append(b, text, strlen(text));
}

void fl_pb_varint(fl_buf *b, uint64_t value) {
    unsigned char bytes[10];
    size_t n = 0;
    do {
        bytes[n] = (unsigned char)(value & 0x7f);
        value >>= 7;
        bytes[n++] |= value ? 0x80 : 0;
    } while (value);
    fl_buf_append(b, bytes, n);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

static void key(fl_buf *b, int field, int wire_type) {
    fl_pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire_type);
}

void fl_pb_field_varint(fl_buf *b, int field, uint64_t value) {
    key(b, field, WIRE_VARINT);
    fl_pb_varint(b, value);
}

/* Protobuf's fixed-width fields are little-endian, as is every platform fastloop builds on. */
void fl_pb_field_double(fl_buf *b, int field, double value) {
    key(b, field, WIRE_FIXED64);
    fl_buf_append(b, &value, 8);
}

void fl_pb_field_float(fl_buf *b, int field, float value) {
    key(b, field, WIRE_FIXED32);
    fl_buf_append(b, &value, 4);
}

void fl_pb_field_bytes(fl_buf *b, int field, const void *data, size_t len) {
    key(b, field, WIRE_BYTES);
    fl_pb_varint(b, len);
    fl_buf_append(b, data, len);
}
