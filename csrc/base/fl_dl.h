/* fl_dl.h - loading a shared library at run time (the image codecs, BLAS, cuBLAS, nvJPEG) so
 * that a failure says which file and why: open, resolve a symbol table, try several names, load
 * once. No call blocks beyond the dynamic loader, except fl_dl_once_load() while another thread
 * loads; none needs Python. */
#ifndef FL_DL_H
#define FL_DL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* dlopen(path, RTLD_NOW | RTLD_LOCAL). NULL on failure, with FL_EINVAL and the detail
 * "cannot load <what> <path>: <dlerror>" set (`what` may be NULL: "cannot load <path>: ..."). */
void *fl_dl_open(const char *path, const char *what);

/* fl_dl_open() with RTLD_GLOBAL: for a library whose symbols another library loaded later
 * must find (cuBLAS's libcublasLt). Same failure contract. */
void *fl_dl_open_global(const char *path, const char *what);

/* The file name part of path (after its last '/'), for descriptions. Never fails. */
const char *fl_dl_base_name(const char *path);

/* One entry point to resolve: where its address goes, and its name. */
typedef struct fl_dl_symbol {
    void **slot;
    const char *name;
} fl_dl_symbol;

/* Fills each table[i].slot with dlsym(handle, table[i].name), in order. Returns NULL when all
 * resolved, else the name of the first missing one (the slots before it are filled). */
const char *fl_dl_resolve(void *handle, const fl_dl_symbol *table, size_t count);

/* fl_dl_open() then fl_dl_resolve(): the handle, or NULL with FL_EINVAL and the detail set:
 * fl_dl_open()'s, or "<path> has no symbol <name> (<hint>)" with the handle closed (`hint`
 * may be NULL: no parenthesis). */
void *fl_dl_open_resolved(const char *path, const char *what, const fl_dl_symbol *table,
                          size_t count, const char *hint);

/* Appends printf-style text to why, after "; " unless why is empty; always NUL-terminated,
 * truncated when full. For the reasons a library could not be loaded, one per candidate. */
__attribute__((format(printf, 3, 4))) void fl_dl_why(char *why, size_t why_len, const char *fmt, ...);

/* A library that goes by several names (libcublas.so.13, .12, ...), loaded once (cuBLAS,
 * nvJPEG): the lock guards the resolved table's address and the file it came from. Static
 * storage, initialised with FL_DL_FOUND_INIT. */
typedef struct fl_dl_found {
    pthread_mutex_t lock;
    const void *api; /* the table open() filled; NULL before a load succeeded */
    char path[1024];
} fl_dl_found;
#define FL_DL_FOUND_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, ""}

/* Unless loaded already, calls open_lib(candidate) for each non-NULL, non-empty candidate in order
 * until one returns a handle (it fills the table at `api`), and records api and the path.
 * Returns 0 then, else -1 with why holding each candidate's failure ("; "-separated, truncated
 * to why_len). Blocks while another thread loads. */
int fl_dl_found_load(fl_dl_found *found, const void *api, void *(*open_lib)(const char *path),
                     const char *const *candidates, size_t count, char *why, size_t why_len);

/* The loaded table, or NULL before a successful fl_dl_found_load(). Never fails. */
const void *fl_dl_found_api(fl_dl_found *found);

/* The file the table came from, or "" before a successful load. Never fails. */
const char *fl_dl_found_path(fl_dl_found *found);

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
