/* fl_npz.h - writing NumPy .npz files: a zip archive (stored, not compressed) holding one
 * .npy member per array, readable by numpy.load() and zipfile. Zip64 records are written
 * when a size or offset needs them (or always, for tests). */
#ifndef FL_NPZ_H
#define FL_NPZ_H

#include <stddef.h>
#include <stdint.h>

enum { FL_NPZ_NAME_MAX = 256, FL_NPZ_DESCR_MAX = 256, FL_NPZ_MAX_DIMS = 64 };

typedef struct fl_npz_entry {
    char name[FL_NPZ_NAME_MAX];   /* the key; the member is "<name>.npy" */
    char descr[FL_NPZ_DESCR_MAX]; /* the dtype as a Python literal: "'<f4'", "[('a', '<i8')]" */
    int ndim;
    int64_t shape[FL_NPZ_MAX_DIMS];
    size_t offset, nbytes; /* where the C-order bytes are in the data buffer */
} fl_npz_entry;

/* Writes n entries whose bytes are in `data` to fd as an .npz (path: for messages only).
 * Returns 0, FL_ESYS (detail: the path and the system's reason) or FL_EINVAL. Blocks on
 * I/O; needs no Python. */
int fl_npz_write(int fd, const char *path, const fl_npz_entry *entries, size_t n,
                 const unsigned char *data, int force_zip64);

#endif
