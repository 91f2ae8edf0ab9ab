/* fl_safetensors.c - the safetensors header (JSON, RFC 8259 strings) and the file around it.
 * Integers in the format are little-endian, as on every platform fastloop supports. */
#include "checkpoint/fl_safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "base/fl_buf.h"
#include "base/fl_error.h"
#include "base/fl_file.h"

static const struct {
    const char *code;
    size_t size;
} DTYPES[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E4M3FNUZ", 1},
    {"F8_E5M2FNUZ", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2}, {"BF16", 2}, {"I32", 4},
    {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8}, {"C64", 8},
};

size_t fl_st_dtype_size(const char *dtype) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof *DTYPES; i++)
        if (strcmp(dtype, DTYPES[i].code) == 0)
            return DTYPES[i].size;
    return 0;
}

/* 1 when s[0..len) is well-formed UTF-8 (no overlongs, surrogates or code points past
 * U+10FFFF), as JSON readers require. */
static int utf8_valid(const unsigned char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        size_t extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 9;
        if (extra == 9 || (extra > 0 && extra >= len - i))
            return 0; /* not a lead byte, or a sequence cut short */
        unsigned cp = extra == 0 ? c : c & (0x3Fu >> extra);
        for (size_t k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        static const unsigned least[] = {0, 0x80, 0x800, 0x10000};
        if (cp < least[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += extra + 1;
    }
    return 1;
}

static int compare_names(const void *a, const void *b) {
    return strcmp((*(const fl_st_entry *const *)a)->name, (*(const fl_st_entry *const *)b)->name);
}

/* FL_EINVAL when two entries share a name. */
static int check_unique(const fl_st_entry *entries, size_t n) {
    const fl_st_entry **sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (sorted == NULL)
        return FL_ENOMEM;
    for (size_t i = 0; i < n; i++)
        sorted[i] = &entries[i];
    qsort(sorted, n, sizeof *sorted, compare_names);
    int rc = FL_OK;
    for (size_t i = 1; i < n && rc == FL_OK; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            rc = fl_error_set(FL_EINVAL, "tensor name '%s' appears twice", sorted[i]->name);
    free(sorted);
    return rc;
}

static int check_entry(const fl_st_entry *e, size_t index, size_t offset) {
    size_t len = strnlen(e->name, FL_ST_NAME_MAX);
    if (len == 0 || len == FL_ST_NAME_MAX || !utf8_valid((const unsigned char *)e->name, len))
        return fl_error_set(FL_EINVAL, "tensor %zu: the name must be 1 to %d bytes of UTF-8", index,
                            FL_ST_NAME_MAX - 1);
    if (strcmp(e->name, "__metadata__") == 0)
        return fl_error_set(FL_EINVAL, "tensor %zu: '__metadata__' is the header's own key", index);
    size_t size = strnlen(e->dtype, FL_ST_DTYPE_MAX) < FL_ST_DTYPE_MAX ? fl_st_dtype_size(e->dtype) : 0;
    if (size == 0)
        return fl_error_set(FL_EINVAL, "tensor '%s': unknown safetensors dtype", e->name);
    if (e->ndim < 0 || e->ndim > FL_ST_MAX_DIMS)
        return fl_error_set(FL_EINVAL, "tensor '%s': %d dimensions", e->name, e->ndim);
    for (int d = 0; d < e->ndim; d++)
        if (e->shape[d] < 0 || __builtin_mul_overflow(size, (size_t)e->shape[d], &size))
            return fl_error_set(FL_EINVAL, "tensor '%s': dimension %d (%lld) is negative or "
                                "overflows the size", e->name, d, (long long)e->shape[d]);
    if (size != e->nbytes)
        return fl_error_set(FL_EINVAL, "tensor '%s': %zu bytes, its shape and dtype make %zu",
                            e->name, e->nbytes, size);
    if (e->offset != offset)
        return fl_error_set(FL_EINVAL, "tensor '%s': at offset %zu, not right after the "
                            "previous tensor (%zu)", e->name, e->offset, offset);
    return FL_OK;
}

int fl_st_check(const fl_st_entry *entries, size_t n, size_t *total) {
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = check_entry(&entries[i], i, offset);
        if (rc != FL_OK)
            return rc;
        if (__builtin_add_overflow(offset, entries[i].nbytes, &offset))
            return fl_error_set(FL_EINVAL, "tensor '%s': the data passes SIZE_MAX bytes",
                                entries[i].name);
    }
    *total = offset;
    return check_unique(entries, n);
}

/* A JSON string: quotes, backslashes and control characters escaped, UTF-8 kept as is. */
static void json_string(fl_buf *b, const char *s) {
    fl_buf_append(b, "\"", 1);
    for (const char *run = s;; s++) {
        unsigned char c = (unsigned char)*s;
        if (c != '\0' && c >= 0x20 && c != '"' && c != '\\')
            continue;
        fl_buf_append(b, run, (size_t)(s - run));
        if (c == '\0')
            break;
        if (c == '"' || c == '\\')
            fl_buf_printf(b, "\\%c", c);
        else
            fl_buf_printf(b, "\\u%04x", c);
        run = s + 1;
    }
    fl_buf_append(b, "\"", 1);
}

/* The header: metadata first (as the safetensors package writes it), then each tensor, then
 * spaces up to a multiple of 8 bytes so the data buffer starts aligned. */
static void build_header(fl_buf *b, const fl_st_entry *entries, size_t n, const fl_st_meta *meta,
                         size_t n_meta) {
    fl_buf_append(b, "{", 1);
    if (n_meta > 0) {
        fl_buf_append(b, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < n_meta; i++) {
            if (i > 0)
                fl_buf_append(b, ",", 1);
            json_string(b, meta[i].key);
            fl_buf_append(b, ":", 1);
            json_string(b, meta[i].value);
        }
        fl_buf_append(b, n > 0 ? "}," : "}", n > 0 ? 2 : 1);
    }
    for (size_t i = 0; i < n; i++) {
        const fl_st_entry *e = &entries[i];
        if (i > 0)
            fl_buf_append(b, ",", 1);
        json_string(b, e->name);
        fl_buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", e->dtype);
        for (int d = 0; d < e->ndim; d++)
            fl_buf_printf(b, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        fl_buf_printf(b, "],\"data_offsets\":[%zu,%zu]}", e->offset, e->offset + e->nbytes);
    }
    fl_buf_append(b, "}", 1);
    while (b->len % 8 != 0)
        fl_buf_append(b, " ", 1);
}

static int check_meta(const fl_st_meta *meta, size_t n_meta) {
    for (size_t i = 0; i < n_meta; i++)
        if (!utf8_valid((const unsigned char *)meta[i].key, strlen(meta[i].key)) ||
            !utf8_valid((const unsigned char *)meta[i].value, strlen(meta[i].value)))
            return fl_error_set(FL_EINVAL, "metadata %zu is not UTF-8 text", i);
    return FL_OK;
}

int fl_st_write(int fd, const char *path, const fl_st_entry *entries, size_t n,
                const unsigned char *data, const fl_st_meta *meta, size_t n_meta) {
    int rc = check_meta(meta, n_meta);
    if (rc != FL_OK)
        return rc;
    fl_buf header = {0};
    build_header(&header, entries, n, meta, n_meta);
    size_t total = n > 0 ? entries[n - 1].offset + entries[n - 1].nbytes : 0;
    uint64_t len = header.len;
    if (header.failed)
        rc = FL_ENOMEM;
    else if (len > FL_ST_HEADER_LIMIT)
        rc = fl_error_set(FL_EINVAL, "%s: a header of %llu bytes, over the %llu safetensors reads",
                          path, (unsigned long long)len, FL_ST_HEADER_LIMIT);
    if (rc == FL_OK)
        rc = fl_file_write_all(fd, &len, sizeof len, path);
    if (rc == FL_OK)
        rc = fl_file_write_all(fd, header.data, header.len, path);
    if (rc == FL_OK && total > 0)
        rc = fl_file_write_all(fd, data, total, path);
    fl_buf_free(&header);
    return rc;
}
