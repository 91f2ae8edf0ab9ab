"""fastloop.Folder: a folder of per-sample files as one field of a Loader's source, read by
the C loader's threads."""

from __future__ import annotations

import glob
import math
import os
from typing import Any, Sequence, Union

import numpy as np

from .._args import SSIZE_MAX, int_arg
from .._core import _npy_header

__all__ = ["Folder"]


class Folder:
    """A folder of per-sample files, one sample each: ``.npy`` files (checked against the
    first file's dtype and shape) or raw files of `dtype` and `shape`. Paths are made
    absolute and sorted now; files are opened lazily by the workers.

    >>> Loader((Folder("train/x", "*.npy"), labels), batch_size=64, num_workers=2)
    >>> Folder("frames", "*.raw", dtype="uint8", shape=(3, 64, 64))
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], pattern: str = "*.npy", *,
                 dtype: Any = None, shape: Sequence[int] | None = None) -> None:
        self.root = os.path.abspath(os.fspath(path))
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"not a directory: {self.root}")
        self.paths = sorted(glob.glob(os.path.join(glob.escape(self.root), pattern)))
        if not self.paths:
            raise FileNotFoundError(f"no files match {pattern!r} in {self.root}")
        self.raw = dtype is not None
        if self.raw:
            if shape is None:
                raise ValueError("raw files need both 'dtype' and 'shape'")
            self.dtype, self.shape = np.dtype(dtype), tuple(int_arg("shape", d, 0, SSIZE_MAX) for d in shape)
            if math.prod(self.shape) * self.dtype.itemsize > SSIZE_MAX:
                raise OverflowError(f"'shape' {self.shape} of {self.dtype} is too large: more bytes than a size holds")
        else:
            descr, fortran, sample_shape = _npy_header(self.paths[0])
            if fortran:
                raise ValueError(f"{self.paths[0]}: Fortran-ordered arrays are not supported; save C order")
            self.dtype, self.shape = np.dtype(descr), tuple(sample_shape)

    def __len__(self) -> int:
        return len(self.paths)

    def _field(self) -> tuple:
        nbytes = math.prod(self.shape) * self.dtype.itemsize  # Python ints: nothing wraps
        return ("files", [os.fsencode(p) for p in self.paths], self.raw, nbytes, self.dtype, self.shape,
                os.fsencode(self.paths[0]))

    def __repr__(self) -> str:
        return f"Folder({self.root!r}, {len(self.paths)} files of {self.dtype} {self.shape})"

