/* fl_dlpack.h - internal to the binding (py_dlpack.c): the DLPack structures fastloop exports, declared from the DLPack
 * specification (https://dmlc.github.io/dlpack/latest/c_api.html): DLManagedTensor (0.8,
 * capsule "dltensor") and DLManagedTensorVersioned (1.x, capsule "dltensor_versioned"). */
#ifndef FL_DLPACK_H
#define FL_DLPACK_H

#include <stdint.h>

#define FL_DLPACK_MAJOR 1
#define FL_DLPACK_MINOR 0

enum { FL_DL_CPU = 1, FL_DL_CUDA = 2 };                                   /* DLDeviceType */
enum { FL_DL_INT = 0, FL_DL_UINT = 1, FL_DL_FLOAT = 2, FL_DL_COMPLEX = 5, FL_DL_BOOL = 6 }; /* DLDataTypeCode */

typedef struct fl_dl_device {
    int32_t device_type; /* a C enum in the spec: int-sized */
    int32_t device_id;
} fl_dl_device;

typedef struct fl_dl_datatype {
    uint8_t code, bits;
    uint16_t lanes;
} fl_dl_datatype;

typedef struct fl_dl_tensor {
    void *data;
    fl_dl_device device;
    int32_t ndim;
    fl_dl_datatype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements */
    uint64_t byte_offset;
} fl_dl_tensor;

typedef struct fl_dl_managed_tensor {
    fl_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct fl_dl_managed_tensor *self);
} fl_dl_managed_tensor;

typedef struct fl_dl_version {
    uint32_t major, minor;
} fl_dl_version;

typedef struct fl_dl_managed_tensor_versioned {
    fl_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct fl_dl_managed_tensor_versioned *self);
    uint64_t flags; /* bit 0 read-only, bit 1 is-copied */
    fl_dl_tensor dl_tensor;
} fl_dl_managed_tensor_versioned;

#endif
