/* fl_dl.h - loading a shared library at run time (the image codecs, BLAS) so that a failure
 * says which file and why. Neither call blocks beyond the dynamic loader; none needs Python. */
#ifndef FL_DL_H
#define FL_DL_H

#include <pthread.h>
#include <stdatomic.h>

/* dlopen(path, RTLD_NOW | RTLD_LOCAL). NULL on failure, with FL_EINVAL and the detail
 * "cannot load <what> <path>: <dlerror>" set (`what` may be NULL: "cannot load <path>: ..."). */
void *fl_dl_open(const char *path, const char *what);

/* fl_dl_open() with RTLD_GLOBAL: for a library whose symbols another library loaded later
 * must find (cuBLAS's libcublasLt). Same failure contract. */
void *fl_dl_open_global(const char *path, const char *what);

/* The file name part of path (after its last '/'), for descriptions. Never fails. */
const char *fl_dl_base_name(const char *path);

/* A library resolved once per process (the image codecs): the lock serializes loading, the
 * flag publishes the resolved pointers. Static storage, initialised with FL_DL_ONCE_INIT. */
typedef struct fl_dl_once {
    pthread_mutex_t lock;
    atomic_int loaded;
} fl_dl_once;
#define FL_DL_ONCE_INIT {PTHREAD_MUTEX_INITIALIZER, 0}

/* Calls resolve(path) under once->lock unless an earlier call succeeded, and marks the library
 * loaded when it returns FL_OK (release: whoever sees fl_dl_once_done() sees the pointers it
 * filled). Returns FL_OK or resolve's error. Blocks while another thread is loading. */
int fl_dl_once_load(fl_dl_once *once, int (*resolve)(const char *path), const char *path);

/* 1 once fl_dl_once_load() succeeded (acquire), else 0. Never blocks. */
int fl_dl_once_done(fl_dl_once *once);

#endif
