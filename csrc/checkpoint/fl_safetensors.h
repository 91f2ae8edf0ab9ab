/* fl_safetensors.h - writing safetensors files, the format torch, Hugging Face, JAX and NumPy
 * users load without pickle: an 8-byte little-endian header length N, N bytes of JSON header
 * ({"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"<key>": "<value>", ...}}, padded with spaces to a multiple of 8 bytes),
 * then the tensors' bytes, back to back, covering the data buffer without holes or overlaps.
 * Offsets count from the start of the data buffer. Needs no Python; never blocks but on I/O.
 */
#ifndef FL_SAFETENSORS_H
#define FL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum {
    FL_ST_NAME_MAX = 256,    /* bytes of a tensor name, NUL included */
    FL_ST_DTYPE_MAX = 16,    /* bytes of a dtype code ("F8_E4M3FNUZ"), NUL included */
    FL_ST_MAX_DIMS = 64,
};

/* The largest header the safetensors package reads (its MAX_HEADER_SIZE). */
#define FL_ST_HEADER_LIMIT 100000000ull

typedef struct fl_st_entry {
    char name[FL_ST_NAME_MAX];   /* UTF-8, unique, not "__metadata__" */
    char dtype[FL_ST_DTYPE_MAX]; /* a code fl_st_dtype_size() knows: "F32", "BF16", ... */
    int ndim;
    int64_t shape[FL_ST_MAX_DIMS];
    size_t offset, nbytes; /* where the C-order bytes are in the data buffer */
} fl_st_entry;

typedef struct fl_st_meta {
    const char *key, *value; /* UTF-8 text, NUL-terminated */
} fl_st_meta;

/* Bytes per element of a safetensors dtype code, or 0 for a code it does not have.
 * Never fails. */
size_t fl_st_dtype_size(const char *dtype);

/* Checks what a reader would refuse: each name valid UTF-8, 1 to FL_ST_NAME_MAX - 1 bytes,
 * not "__metadata__" and unique; each dtype known; nbytes == product(shape) * itemsize
 * (overflow-checked); entries back to back from offset 0 in order. Returns 0 and sets
 * *total to the data buffer's size, or FL_EINVAL with a detail naming the entry. */
int fl_st_check(const fl_st_entry *entries, size_t n, size_t *total);

/* Writes the safetensors file of n checked entries whose bytes are `data` (fl_st_check's
 * total of them) and n_meta metadata pairs to fd (path: for messages only). Returns 0,
 * FL_EINVAL (a header over FL_ST_HEADER_LIMIT, metadata that is not UTF-8), FL_ENOMEM or
 * FL_ESYS (detail: the path and the system's reason). Blocks on I/O. */
int fl_st_write(int fd, const char *path, const fl_st_entry *entries, size_t n,
                const unsigned char *data, const fl_st_meta *meta, size_t n_meta);

#endif
