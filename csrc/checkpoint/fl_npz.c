/* fl_npz.c - the .npy header format (NEP 1, aligned to 64 bytes as NumPy writes it) inside
 * a zip archive (PKWARE APPNOTE 6.3: local headers, central directory, zip64 extensions).
 * All integers in both formats are little-endian, as on every platform fastloop supports. */
#include "checkpoint/fl_npz.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/fl_buf.h"
#include "base/fl_crc.h"
#include "base/fl_error.h"
#include "base/fl_file.h"

enum { ZIP_LIMIT = 0xFFFFFFFFu, NPY_ALIGN = 64 };

static void put16(fl_buf *b, uint16_t v) { fl_buf_append(b, &v, 2); }
static void put32(fl_buf *b, uint32_t v) { fl_buf_append(b, &v, 4); }
static void put64(fl_buf *b, uint64_t v) { fl_buf_append(b, &v, 8); }

/* The .npy preamble of one array: magic, version, header length, the header dict padded
 * with spaces (and a newline) so the array data starts at a multiple of 64 bytes. */
static void npy_header(fl_buf *b, const fl_npz_entry *e) {
    fl_buf dict = {0};
    fl_buf_printf(&dict, "{'descr': %s, 'fortran_order': False, 'shape': (", e->descr);
    for (int d = 0; d < e->ndim; d++)
        fl_buf_printf(&dict, d ? ", %lld" : "%lld", (long long)e->shape[d]);
    fl_buf_printf(&dict, e->ndim == 1 ? ",), }" : "), }"); /* Python's tuple repr: (5,) */
    size_t preamble = 10;                                   /* magic, version, 2-byte length */
    size_t total = (preamble + dict.len + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    if (total - preamble > 65535) { /* version 2.0: a 4-byte header length */
        preamble = 12;
        total = (preamble + dict.len + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    }
    size_t header_len = total - preamble;
    fl_buf_append(b, "\x93NUMPY", 6);
    fl_buf_append(b, preamble == 10 ? "\x01\x00" : "\x02\x00", 2);
    if (preamble == 10)
        put16(b, (uint16_t)header_len);
    else
        put32(b, (uint32_t)header_len);
    fl_buf_append(b, dict.data, dict.len);
    for (size_t i = dict.len; i + 1 < header_len; i++)
        fl_buf_append(b, " ", 1);
    fl_buf_append(b, "\n", 1);
    if (dict.failed)
        b->failed = 1;
    fl_buf_free(&dict);
}

/* MS-DOS date and time of now, as zip headers store them. */
static void dos_time(uint16_t *time_out, uint16_t *date_out) {
    time_t now = time(NULL);
    struct tm t;
    localtime_r(&now, &t);
    *time_out = (uint16_t)((t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec / 2));
    *date_out = (uint16_t)(((t.tm_year - 80) << 9) | ((t.tm_mon + 1) << 5) | t.tm_mday);
}

typedef struct member {
    uint32_t crc;
    uint64_t size, offset;
} member;

/* The fields the local and the central header share, from "version needed" to the name's
 * length: stored (no compression), so both sizes are the data's. */
static void common_fields(fl_buf *b, const char *name, const member *m, int zip64,
                          uint16_t mtime, uint16_t mdate) {
    put16(b, zip64 ? 45 : 20);
    put16(b, 0); /* flags */
    put16(b, 0); /* stored */
    put16(b, mtime);
    put16(b, mdate);
    put32(b, m->crc);
    put32(b, zip64 ? ZIP_LIMIT : (uint32_t)m->size); /* compressed */
    put32(b, zip64 ? ZIP_LIMIT : (uint32_t)m->size); /* uncompressed */
    put16(b, (uint16_t)strlen(name));
}

/* Local file header: sizes and CRC are known up front (the data is in memory). */
static void local_header(fl_buf *b, const char *name, const member *m, int zip64,
                         uint16_t mtime, uint16_t mdate) {
    put32(b, 0x04034b50);
    common_fields(b, name, m, zip64, mtime, mdate);
    put16(b, zip64 ? 20 : 0);
    fl_buf_append(b, name, strlen(name));
    if (zip64) { /* extra field 0x0001: original size, compressed size */
        put16(b, 0x0001);
        put16(b, 16);
        put64(b, m->size);
        put64(b, m->size);
    }
}

static void central_header(fl_buf *b, const char *name, const member *m, int zip64,
                           uint16_t mtime, uint16_t mdate) {
    put32(b, 0x02014b50);
    put16(b, (3 << 8) | 45); /* made by: Unix, spec 4.5 */
    common_fields(b, name, m, zip64, mtime, mdate);
    put16(b, zip64 ? 28 : 0);
    put16(b, 0);                   /* comment */
    put16(b, 0);                   /* disk */
    put16(b, 0);                   /* internal attributes */
    put32(b, (uint32_t)0644 << 16); /* external: a regular file, rw-r--r-- */
    put32(b, zip64 ? ZIP_LIMIT : (uint32_t)m->offset);
    fl_buf_append(b, name, strlen(name));
    if (zip64) {
        put16(b, 0x0001);
        put16(b, 24);
        put64(b, m->size);
        put64(b, m->size);
        put64(b, m->offset);
    }
}

static void end_records(fl_buf *b, size_t count, uint64_t cd_offset, uint64_t cd_size,
                        int zip64) {
    if (zip64) {
        uint64_t record_offset = cd_offset + cd_size;
        put32(b, 0x06064b50); /* zip64 end of central directory */
        put64(b, 44);
        put16(b, (3 << 8) | 45);
        put16(b, 45);
        put32(b, 0);
        put32(b, 0);
        put64(b, count);
        put64(b, count);
        put64(b, cd_size);
        put64(b, cd_offset);
        put32(b, 0x07064b50); /* its locator */
        put32(b, 0);
        put64(b, record_offset);
        put32(b, 1);
    }
    put32(b, 0x06054b50);
    put16(b, 0);
    put16(b, 0);
    put16(b, zip64 || count > 0xFFFF ? 0xFFFF : (uint16_t)count);
    put16(b, zip64 || count > 0xFFFF ? 0xFFFF : (uint16_t)count);
    put32(b, zip64 ? ZIP_LIMIT : (uint32_t)cd_size);
    put32(b, zip64 ? ZIP_LIMIT : (uint32_t)cd_offset);
    put16(b, 0);
}

int fl_npz_write(int fd, const char *path, const fl_npz_entry *entries, size_t n,
                 const unsigned char *data, int force_zip64) {
    uint16_t mtime, mdate;
    dos_time(&mtime, &mdate);
    fl_buf central = {0}, header = {0}, local = {0};
    uint64_t offset = 0;
    int rc = FL_OK, any_zip64 = force_zip64 || n > 0xFFFF;
    char name[FL_NPZ_NAME_MAX + 8];
    for (size_t i = 0; i < n && rc == FL_OK; i++) {
        const fl_npz_entry *e = &entries[i];
        snprintf(name, sizeof name, "%s.npy", e->name);
        header.len = local.len = 0;
        npy_header(&header, e);
        member m = {fl_crc32(0, header.data, header.len), header.len + e->nbytes, offset};
        m.crc = fl_crc32(m.crc, data + e->offset, e->nbytes);
        int zip64 = force_zip64 || m.size >= ZIP_LIMIT || offset >= ZIP_LIMIT;
        any_zip64 |= zip64;
        local_header(&local, name, &m, zip64, mtime, mdate);
        central_header(&central, name, &m, zip64, mtime, mdate);
        if (local.failed || header.failed || central.failed)
            rc = FL_ENOMEM;
        if (rc == FL_OK)
            rc = fl_file_write_all(fd, local.data, local.len, path);
        if (rc == FL_OK)
            rc = fl_file_write_all(fd, header.data, header.len, path);
        if (rc == FL_OK)
            rc = fl_file_write_all(fd, data + e->offset, e->nbytes, path);
        offset += local.len + m.size;
    }
    if (rc == FL_OK) {
        uint64_t cd_size = central.len;
        any_zip64 |= offset >= ZIP_LIMIT;
        end_records(&central, n, offset, cd_size, any_zip64);
        rc = central.failed ? FL_ENOMEM : fl_file_write_all(fd, central.data, central.len, path);
    }
    fl_buf_free(&central);
    fl_buf_free(&header);
    fl_buf_free(&local);
    return rc;
}
