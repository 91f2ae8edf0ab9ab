/* fl_dl.h - loading a shared library at run time (the image codecs, BLAS) so that a failure
 * says which file and why. Neither call blocks beyond the dynamic loader; none needs Python. */
#ifndef FL_DL_H
#define FL_DL_H

/* dlopen(path, RTLD_NOW | RTLD_LOCAL). NULL on failure, with FL_EINVAL and the detail
 * "cannot load <what> <path>: <dlerror>" set (`what` may be NULL: "cannot load <path>: ..."). */
void *fl_dl_open(const char *path, const char *what);

/* fl_dl_open() with RTLD_GLOBAL: for a library whose symbols another library loaded later
 * must find (cuBLAS's libcublasLt). Same failure contract. */
void *fl_dl_open_global(const char *path, const char *what);

/* The file name part of path (after its last '/'), for descriptions. Never fails. */
const char *fl_dl_base_name(const char *path);

#endif
