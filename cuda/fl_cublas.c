/* fl_cublas.c - dlopen()s cuBLAS and resolves the entry points in fl_cublas.h. */
#include "fl_cublas.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_dl.h"
#include "base/fl_error.h"

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static fl_cublas_api api;           /* filled once under load_lock */
static const fl_cublas_api *loaded; /* &api once every symbol resolved; read under load_lock */
static char loaded_path[1024];

/* A wheel's libcublas.so.N needs libcublasLt.so.N beside it, which its RPATH may not
 * name: loading that first (by full path) lets the dynamic loader reuse it. */
static void preload_lt(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (slash == NULL || strncmp(name, "libcublas.so", 12) != 0)
        return;
    char lt[1100];
    snprintf(lt, sizeof lt, "%.*slibcublasLt.so%s", (int)(name - path), path, name + 12);
    if (fl_dl_open_global(lt, "cuBLASLt") == NULL)
        fl_error_clear(); /* a failure shows up as libcublas's own dlerror */
}

/* Opens path and resolves every entry point into api: the handle, or NULL with the detail set. */
static void *open_resolved(const char *path) {
    const fl_dl_symbol table[] = {
        {(void **)&api.create, "cublasCreate_v2"},       {(void **)&api.destroy, "cublasDestroy_v2"},
        {(void **)&api.set_stream, "cublasSetStream_v2"}, {(void **)&api.sgemm, "cublasSgemm_v2"},
        {(void **)&api.dgemm, "cublasDgemm_v2"},
    };
    return fl_dl_open_resolved(path, "cuBLAS", table, sizeof table / sizeof table[0], NULL);
}

/* Tries one candidate; returns 0 once loaded, else appends why it failed. */
static int try_load(const char *path, char *why, size_t why_len) {
    preload_lt(path);
    if (open_resolved(path) == NULL) {
        fl_dl_why(why, why_len, "%s", fl_error_detail());
        fl_error_clear();
        return -1;
    }
    snprintf(loaded_path, sizeof loaded_path, "%s", path);
    loaded = &api;
    return 0;
}

int fl_cublas_load(const char *path, char *why, size_t why_len) {
    const char *candidates[] = {path, getenv("FASTLOOP_CUBLAS"), "libcublas.so.13",
                                "libcublas.so.12", "libcublas.so"};
    pthread_mutex_lock(&load_lock);
    int rc = loaded ? 0
                    : fl_dl_first(candidates, sizeof candidates / sizeof candidates[0], try_load,
                                  why, why_len);
    pthread_mutex_unlock(&load_lock);
    return rc;
}

const fl_cublas_api *fl_cublas(void) {
    pthread_mutex_lock(&load_lock);
    const fl_cublas_api *result = loaded;
    pthread_mutex_unlock(&load_lock);
    return result;
}

const char *fl_cublas_path(void) { return fl_cublas() ? loaded_path : ""; }

const char *fl_cublas_status_name(int status) {
    switch (status) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}
