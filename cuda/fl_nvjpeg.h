/* fl_nvjpeg.h - nvJPEG found at run time: the entry points of its batched decoder that
 * fastloop uses, declared here (the toolkit may ship no nvJPEG headers) and resolved with
 * dlopen/dlsym, as fl_cublas.h does for cuBLAS.
 *
 * fastloop must import where nvJPEG is absent, so nothing links it. fl_nvjpeg_load() tries,
 * in order: the path it is given (fastloop.cuda passes each of nvjpeg_candidates(): the
 * nvidia-* wheels', torch's, the CUDA Toolkit's lib64), $FASTLOOP_NVJPEG, then
 * libnvjpeg.so.13, libnvjpeg.so.12, libnvjpeg.so. Once loaded the library stays loaded for the life of the process.
 * Thread-safe.
 */
#ifndef FL_NVJPEG_H
#define FL_NVJPEG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI of nvJPEG (values from NVIDIA's nvJPEG documentation, stable since CUDA 11). */
typedef struct fl_nvjpeg_handle_s *fl_nvjpeg_handle;
typedef struct fl_nvjpeg_state_s *fl_nvjpeg_state;
typedef struct fl_nvjpeg_stream_s *fl_nvjpeg_stream;     /* nvjpegJpegStream_t: a parsed bitstream */
typedef struct fl_nvjpeg_params_s *fl_nvjpeg_params;     /* nvjpegDecodeParams_t */

enum {
    FL_NVJPEG_STATUS_SUCCESS = 0,
    FL_NVJPEG_STATUS_INVALID_PARAMETER = 2,
    FL_NVJPEG_STATUS_BAD_JPEG = 3,
    FL_NVJPEG_STATUS_JPEG_NOT_SUPPORTED = 4,
    FL_NVJPEG_STATUS_ARCH_MISMATCH = 7,
    FL_NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED = 9,
};
enum { FL_NVJPEG_BACKEND_DEFAULT = 0, FL_NVJPEG_BACKEND_HARDWARE = 3 }; /* nvjpegBackend_t */
enum { FL_NVJPEG_OUTPUT_RGBI = 5 };                                    /* nvjpegOutputFormat_t */
enum { FL_NVJPEG_CSS_444 = 0 };                                        /* nvjpegChromaSubsampling_t */
/* nvJPEG >= 12.1: chroma upsampled with interpolation, as libjpeg-turbo's "fancy upsampling" */
enum { FL_NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION = 32 };
enum { FL_NVJPEG_MAX_COMPONENT = 4 };

/* nvjpegImage_t: per plane a device pointer and its row pitch; RGBI uses plane 0 only. */
typedef struct fl_nvjpeg_image {
    unsigned char *channel[FL_NVJPEG_MAX_COMPONENT];
    size_t pitch[FL_NVJPEG_MAX_COMPONENT];
} fl_nvjpeg_image;

typedef struct fl_nvjpeg_api {
    int (*create_ex)(int backend, void *dev_allocator, void *pinned_allocator, unsigned flags,
                     fl_nvjpeg_handle *handle);
    int (*destroy)(fl_nvjpeg_handle handle);
    int (*state_create)(fl_nvjpeg_handle handle, fl_nvjpeg_state *state);
    int (*state_destroy)(fl_nvjpeg_state state);
    int (*batched_initialize)(fl_nvjpeg_handle handle, fl_nvjpeg_state state, int batch_size,
                              int max_cpu_threads, int output_format);
    int (*batched)(fl_nvjpeg_handle handle, fl_nvjpeg_state state, const unsigned char *const *data,
                   const size_t *lengths, fl_nvjpeg_image *destinations, void *stream);
    int (*batched_ex)(fl_nvjpeg_handle handle, fl_nvjpeg_state state, const unsigned char *const *data,
                      const size_t *lengths, fl_nvjpeg_image *destinations, fl_nvjpeg_params *params,
                      void *stream);
    int (*batched_supported_ex)(fl_nvjpeg_handle handle, fl_nvjpeg_stream stream, fl_nvjpeg_params params,
                                int *is_supported); /* *is_supported == 0: supported */
    int (*stream_create)(fl_nvjpeg_handle handle, fl_nvjpeg_stream *stream);
    int (*stream_destroy)(fl_nvjpeg_stream stream);
    int (*stream_parse_header)(fl_nvjpeg_handle handle, const unsigned char *data, size_t length,
                               fl_nvjpeg_stream stream);
    int (*params_create)(fl_nvjpeg_handle handle, fl_nvjpeg_params *params);
    int (*params_destroy)(fl_nvjpeg_params params);
    int (*params_set_output_format)(fl_nvjpeg_params params, int output_format);
    int (*params_set_roi)(fl_nvjpeg_params params, int offset_x, int offset_y, int width, int height);
    int (*get_property)(int type, int *value); /* type 0: major, 1: minor, 2: patch */
    /* optional (NULL where the library lacks it): buffers for the hardware backend sized once */
    int (*batched_preallocate)(fl_nvjpeg_handle handle, fl_nvjpeg_state state, int batch_size, int width,
                               int height, int chroma_subsampling, int output_format);
} fl_nvjpeg_api;

/* Loads nvJPEG unless it is loaded already; `path` may be NULL (skip that candidate).
 * Returns 0, or -1 with a message naming every candidate tried and why it failed in
 * why[why_len]. Blocks while the dynamic loader runs. */
int fl_nvjpeg_load(const char *path, char *why, size_t why_len);

/* The loaded entry points, or NULL before a successful fl_nvjpeg_load(). Never fails. */
const fl_nvjpeg_api *fl_nvjpeg(void);

/* The file that was loaded ("" before loading). Never fails. */
const char *fl_nvjpeg_path(void);

/* The loaded library's version (nvjpegGetProperty): 0 with *major, *minor, or -1 before a load
 * or where the query fails. Never blocks. */
int fl_nvjpeg_version(int *major, int *minor);

/* "NVJPEG_STATUS_BAD_JPEG" for a status ("NVJPEG_STATUS_UNKNOWN" otherwise). Static. */
const char *fl_nvjpeg_status_name(int status);

#ifdef __cplusplus
}
#endif

#endif
