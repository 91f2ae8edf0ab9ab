/* py_ops.c - the fastloop.ops function table and docstrings. */
#include "py_ops.h"

PyDoc_STRVAR(
    normalize_doc,
    "normalize(x, mean, std, layout='HWC->CHW', out=None, num_threads=1)\n--\n\n"
    "Normalize images to float32 in one pass: (x * scale - mean) / std per channel, where\n"
    "scale is 1/255 for uint8 input (as torchvision's ToTensor) and 1 for float32/float64.\n"
    "x is one image or a batch with a leading axis. layout 'HWC->CHW' also transposes\n"
    "interleaved pixels to planes in the same pass ('CHW', 'HWC', 'CHW->HWC' also work).\n"
    "mean and std hold one number per channel (or one for all). Returns out (float32).\n\n"
    "    y = fastloop.ops.normalize(batch_u8, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])\n"
    "    y.shape  # (N, 3, H, W)");

PyDoc_STRVAR(
    cast_doc,
    "cast(x, dtype, out=None, num_threads=1)\n--\n\n"
    "Convert x to dtype element by element, as x.astype(dtype) does, except that float to\n"
    "integer saturates at the integer's range and maps NaN to 0 (NumPy leaves those\n"
    "undefined). Supported: (u)int8/16/32/64 (not uint64->), float32, float64.\n\n"
    "    y = fastloop.ops.cast(x_u8, numpy.float32, num_threads=2)");

PyDoc_STRVAR(
    crop_doc,
    "crop(x, size, offsets='random', seed=None, layout='HWC', out=None, num_threads=1)\n--\n\n"
    "Crop every image of x (one image or a batch) to size, an int or (h, w). offsets is\n"
    "'random' (uniform, drawn per image from seed: image i always gets the same crop for a\n"
    "given seed, whatever the thread count), 'center' (as torchvision's center_crop), one\n"
    "(top, left) pair for all images, or an (N, 2) array with one pair per image. Any dtype.\n\n"
    "    y = fastloop.ops.crop(batch, 56, seed=epoch)       # random 56x56 crops\n"
    "    y = fastloop.ops.crop(batch, (56, 64), offsets='center')");

PyDoc_STRVAR(
    hflip_doc,
    "hflip(x, p=0.5, seed=None, flip=None, layout='HWC', out=None, num_threads=1)\n--\n\n"
    "Mirror images left-right. Each image of the batch is flipped with probability p, drawn\n"
    "per image from seed (reproducible and independent of the thread count), or where the\n"
    "boolean sequence flip says so. out may be x itself (in place). Any dtype.\n\n"
    "    y = fastloop.ops.hflip(batch, seed=step)\n"
    "    fastloop.ops.hflip(batch, p=1.0, out=batch)   # flip all, in place");

PyDoc_STRVAR(
    stack_doc,
    "stack(arrays, out=None, num_threads=1)\n--\n\n"
    "Copy a sequence of arrays of one shape and dtype into a new batch axis, as\n"
    "numpy.stack(arrays) does, with the GIL released and optionally on several threads.\n\n"
    "    batch = fastloop.ops.stack([img0, img1, img2])   # shape (3, *img0.shape)");

PyDoc_STRVAR(
    divide_by_max_doc,
    "divide_by_max(x, out=None, num_threads=1)\n--\n\n"
    "Return x / x.max() exactly as NumPy computes it (float32 stays float32, other dtypes\n"
    "give float64; a NaN anywhere makes every value NaN), in two passes with the GIL\n"
    "released. out may be x itself when x already has the result dtype.\n\n"
    "    y = fastloop.ops.divide_by_max(x, num_threads=2)");

#define OP(name) \
    {#name, (PyCFunction)(void (*)(void))fl_py_##name, METH_VARARGS | METH_KEYWORDS, name##_doc}

static PyMethodDef ops_functions[] = {
    OP(normalize),         OP(cast), OP(crop), OP(hflip), OP(stack), OP(divide_by_max),
    {NULL, NULL, 0, NULL},
};

int fl_ops_module_init(PyObject *module) { return PyModule_AddFunctions(module, ops_functions); }
