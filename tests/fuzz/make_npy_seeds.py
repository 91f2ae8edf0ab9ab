"""Writes the seed corpus for fuzz_npy: .npy files made by NumPy (versions 1.0, 2.0, 3.0; many
dtypes, shapes and orders, up to FL_NPY_MAX_DIMS + 1 = 33 dimensions), each cut to its header
plus a few data bytes.

    python3 tests/fuzz/make_npy_seeds.py DIR
"""
import hashlib
import io
import pathlib
import sys

import numpy as np
from numpy.lib import format as npformat

DTYPES = ["<f4", ">f8", "<f2", "|u1", "<i2", ">i4", "<u8", "|b1", "<c8", ">c16",
          "<U3", ">U1", "|S5", "|V4", "<M8[ns]", ">m8[10s]", "=f4", "<f16"]
SHAPES = [(), (0,), (5,), (2, 3), (0, 4), (1, 1, 1), (2, 1, 3, 1)]
# Too many dimensions for random mutation to reach: the limit, and one past it.
DEEP = [("<f4", (1,) * 32), ("|u1", (2,) + (1,) * 32)]


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    cases = [(d, s) for d in DTYPES for s in SHAPES] + DEEP
    for i, (dtype, shape) in enumerate(cases):
        array = np.zeros(shape, dtype=dtype)
        if i % 3 == 1 and array.ndim > 1:
            array = np.asfortranarray(array)
        buf = io.BytesIO()
        npformat.write_array(buf, array, version=[(1, 0), (2, 0), (3, 0)][i % 3])
        data = buf.getvalue()
        header_len = len(data) - array.nbytes
        data = data[: header_len + 8]
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
