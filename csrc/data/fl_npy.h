/* fl_npy.h - reading NumPy .npy files: parsing and validating the header (format versions
 * 1.0, 2.0 and 3.0, as NEP 1 and numpy/lib/format.py define them) and memory-mapping the data.
 *
 * Only what a loader can use directly is accepted: a simple dtype (no fields, no objects,
 * no subarrays) given as a string descr such as '<f4', '|u1', '>i8', '<U5', '|b1' or
 * '|V16', C or Fortran order, and a shape of at most FL_NPY_MAX_DIMS dimensions. Anything
 * else -- bad magic, unknown version, malformed or oversized header, unsupported dtype,
 * negative or overflowing shape, a file shorter than header + data -- is FL_EINVAL with a
 * detail (fl_error_detail()) that says what is wrong; the caller adds the file name.
 * Nothing here needs Python; parsing never reads past `len`.
 */
#ifndef FL_NPY_H
#define FL_NPY_H

#include <stddef.h>
#include <stdint.h>

enum { FL_NPY_MAX_DIMS = 32, FL_NPY_DESCR_MAX = 32 };

typedef struct fl_npy_header {
    int major, minor;           /* format version */
    char descr[FL_NPY_DESCR_MAX]; /* NUL-terminated, as in the file: "<f4" */
    char byteorder;             /* '<', '>' or '|' (as in descr; '=' is normalized to '<'/'>') */
    char kind;                  /* NumPy kind letter: 'b','i','u','f','c','U','S','V','M','m' */
    size_t itemsize;            /* bytes per element */
    int fortran_order;
    int ndim;
    int64_t shape[FL_NPY_MAX_DIMS];
    size_t header_len;          /* bytes before the data: magic + version + length + dict */
    size_t data_len;            /* product(shape) * itemsize, checked for overflow */
} fl_npy_header;

/* Parses the header at the start of `data` (len bytes: the file's first bytes, or all of it).
 * Returns 0 and fills *out, FL_EAGAIN when len is too short to hold the whole header (read
 * more and call again), or FL_EINVAL with a detail. Does not check that the data is there. */
int fl_npy_parse_header(const void *data, size_t len, fl_npy_header *out);

typedef struct fl_npy_map {
    fl_npy_header header;
    void *base;        /* the mapping (whole file), for munmap */
    size_t map_len;    /* its length */
    const void *data;  /* base + header.header_len: the array's bytes */
} fl_npy_map;

/* Opens `path`, parses its header, checks the file holds header_len + data_len bytes, and
 * maps it read-only (MAP_SHARED, so pages are shared with other processes mapping it).
 * Returns 0 and fills *out, FL_EINVAL (bad or truncated file; detail names the path and the
 * problem) or FL_ESYS (open/stat/mmap failed; detail names the path and errno's message).
 * An empty array maps nothing (data NULL, map_len 0). */
int fl_npy_map_open(const char *path, fl_npy_map *out);

/* Unmaps. Safe on a zeroed or already-closed map. */
void fl_npy_map_close(fl_npy_map *map);

/* Reads one whole .npy file into `dst` (capacity `cap` bytes) with plain reads, checking its
 * header against `expect` (descr, fortran order and shape must be equal; pass NULL to accept
 * any). Used by loader workers for folders of per-sample files. Returns 0 and sets *nbytes,
 * FL_EINVAL (bad file, mismatch, or larger than cap; detail names path and problem) or
 * FL_ESYS (detail: path and errno). Thread-safe. */
int fl_npy_read_file(const char *path, const fl_npy_header *expect, void *dst, size_t cap,
                     size_t *nbytes);

#endif
