/* fl_nvjpeg.c - dlopen()s nvJPEG and resolves the entry points in fl_nvjpeg.h. */
#include "fl_nvjpeg.h"

#include <dlfcn.h>
#include <stdlib.h>

#include "base/fl_dl.h"
#include "base/fl_error.h"

static fl_nvjpeg_api api; /* filled once, under found's lock */
static fl_dl_found found = FL_DL_FOUND_INIT;

/* Opens path and resolves every entry point into api: the handle, or NULL with the detail set. */
static void *open_resolved(const char *path) {
    const fl_dl_symbol table[] = {
        {(void **)&api.create_ex, "nvjpegCreateEx"},
        {(void **)&api.destroy, "nvjpegDestroy"},
        {(void **)&api.state_create, "nvjpegJpegStateCreate"},
        {(void **)&api.state_destroy, "nvjpegJpegStateDestroy"},
        {(void **)&api.batched_initialize, "nvjpegDecodeBatchedInitialize"},
        {(void **)&api.batched, "nvjpegDecodeBatched"},
        {(void **)&api.batched_ex, "nvjpegDecodeBatchedEx"},
        {(void **)&api.batched_supported_ex, "nvjpegDecodeBatchedSupportedEx"},
        {(void **)&api.stream_create, "nvjpegJpegStreamCreate"},
        {(void **)&api.stream_destroy, "nvjpegJpegStreamDestroy"},
        {(void **)&api.stream_parse_header, "nvjpegJpegStreamParseHeader"},
        {(void **)&api.params_create, "nvjpegDecodeParamsCreate"},
        {(void **)&api.params_destroy, "nvjpegDecodeParamsDestroy"},
        {(void **)&api.params_set_output_format, "nvjpegDecodeParamsSetOutputFormat"},
        {(void **)&api.params_set_roi, "nvjpegDecodeParamsSetROI"},
        {(void **)&api.get_property, "nvjpegGetProperty"},
    };
    void *handle = fl_dl_open_resolved(path, "nvJPEG", table, sizeof table / sizeof table[0],
                                       "nvJPEG older than CUDA 11?");
    if (handle != NULL) /* optional: an older nvJPEG decodes without it */
        *(void **)&api.batched_preallocate = dlsym(handle, "nvjpegDecodeBatchedPreAllocate");
    return handle;
}

int fl_nvjpeg_load(const char *path, char *why, size_t why_len) {
    const char *candidates[] = {path, getenv("FASTLOOP_NVJPEG"), "libnvjpeg.so.13", "libnvjpeg.so.12",
                                "libnvjpeg.so"};
    return fl_dl_found_load(&found, &api, open_resolved, candidates,
                            sizeof candidates / sizeof candidates[0], why, why_len);
}

const fl_nvjpeg_api *fl_nvjpeg(void) { return fl_dl_found_api(&found); }

const char *fl_nvjpeg_path(void) { return fl_dl_found_path(&found); }

int fl_nvjpeg_version(int *major, int *minor) {
    const fl_nvjpeg_api *nv = fl_nvjpeg();
    *major = *minor = -1;
    if (nv == NULL || nv->get_property(0, major) != 0 || nv->get_property(1, minor) != 0) {
        *major = *minor = -1;
        return -1;
    }
    return 0;
}

const char *fl_nvjpeg_status_name(int status) {
    static const char *const names[] = {
        "NVJPEG_STATUS_SUCCESS",          "NVJPEG_STATUS_NOT_INITIALIZED",
        "NVJPEG_STATUS_INVALID_PARAMETER", "NVJPEG_STATUS_BAD_JPEG",
        "NVJPEG_STATUS_JPEG_NOT_SUPPORTED", "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        "NVJPEG_STATUS_EXECUTION_FAILED", "NVJPEG_STATUS_ARCH_MISMATCH",
        "NVJPEG_STATUS_INTERNAL_ERROR",   "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
    };
    return status >= 0 && status < (int)(sizeof names / sizeof names[0]) ? names[status] : "NVJPEG_STATUS_UNKNOWN";
}
