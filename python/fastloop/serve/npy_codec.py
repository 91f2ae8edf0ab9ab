"""Arrays as ``.npy`` bytes (a Redis store's inputs and results), with the header of each
(dtype, shape) built or parsed once: a job's input and result cross Redis as .npy, and
np.save/np.load on a BytesIO cost 30-90 us per small array, mostly in the header (np.load
parses it with ast.literal_eval every time). The bytes are exactly np.save's, and anything
the fast path does not know (Fortran order, object dtypes, a header not seen before, a size
that does not match) goes through NumPy, whose errors callers already handle.

    >>> data = encode(np.ones(784, np.float32))
    >>> decode(data).shape
    (784,)
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np

__all__ = ["encode", "decode"]

_MAGIC = b"\x93NUMPY"
_CACHE_MAX = 1024  # distinct (dtype, shape) pairs remembered; a service sees a handful
_headers: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}  # (dtype, shape) -> np.save's header
_layouts: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}  # header -> dtype, shape, items


def encode(array: np.ndarray) -> bytes:
    """np.save(array, allow_pickle=False)'s bytes."""
    if not array.flags.c_contiguous or array.dtype.hasobject:
        return _save(array)
    key = (array.dtype, array.shape)
    header = _headers.get(key)
    if header is None:
        data = _save(array)
        _remember(_headers, key, data[:len(data) - array.nbytes])
        return data
    return header + array.tobytes()


def decode(data: bytes) -> np.ndarray:
    """np.load(data, allow_pickle=False) for .npy bytes (a writable array of its own);
    ValueError/OSError/EOFError as np.load raises them."""
    end = _header_end(data)
    layout = _layouts.get(bytes(data[:end])) if end else None
    if layout is not None:
        dtype, shape, items = layout
        if len(data) - end == items * dtype.itemsize:
            return np.frombuffer(data, dtype, count=items, offset=end).reshape(shape).copy()
    array = np.load(io.BytesIO(data), allow_pickle=False)
    if end and array.flags.c_contiguous and not array.dtype.hasobject and not _fortran(data):
        _remember(_layouts, bytes(data[:end]), (array.dtype, array.shape, array.size))
    return array


def _save(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _header_end(data: Any) -> int:
    """Where the array's bytes start (0 when the bytes are not a .npy we can read)."""
    if len(data) < 10 or data[:6] != _MAGIC:
        return 0
    if data[6] == 1:
        return 10 + struct.unpack_from("<H", data, 8)[0]
    if data[6] in (2, 3) and len(data) >= 12:
        return 12 + struct.unpack_from("<I", data, 8)[0]
    return 0


def _fortran(data: bytes) -> bool:
    """Whether the header says Fortran order (a transposed array must not be read as C)."""
    return b"'fortran_order': True" in data[:_header_end(data)]


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value

