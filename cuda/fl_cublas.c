/* fl_cublas.c - dlopen()s cuBLAS and resolves the entry points in fl_cublas.h. */
#include "fl_cublas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_dl.h"
#include "base/fl_error.h"

static fl_cublas_api api; /* filled once, under found's lock */
static fl_dl_found found = FL_DL_FOUND_INIT;

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
    preload_lt(path);
    const fl_dl_symbol table[] = {
        {(void **)&api.create, "cublasCreate_v2"},       {(void **)&api.destroy, "cublasDestroy_v2"},
        {(void **)&api.set_stream, "cublasSetStream_v2"}, {(void **)&api.sgemm, "cublasSgemm_v2"},
        {(void **)&api.dgemm, "cublasDgemm_v2"},
    };
    return fl_dl_open_resolved(path, "cuBLAS", table, sizeof table / sizeof table[0], NULL);
}

int fl_cublas_load(const char *path, char *why, size_t why_len) {
    const char *candidates[] = {path, getenv("FASTLOOP_CUBLAS"), "libcublas.so.13",
                                "libcublas.so.12", "libcublas.so"};
    return fl_dl_found_load(&found, &api, open_resolved, candidates,
                            sizeof candidates / sizeof candidates[0], why, why_len);
}

const fl_cublas_api *fl_cublas(void) { return fl_dl_found_api(&found); }

const char *fl_cublas_path(void) { return fl_dl_found_path(&found); }

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
