"""Arrays as ``.npy`` bytes: the serving side's one home for the format (the C core's is
fl_npy.c). encode/decode carry a Redis store's inputs and results and the HTTP front's
``application/x-npy`` bodies; read_checked (decode_checked for bytes) is the one reader of
.npy data from outside (a request body, a file named by a client), refusing pickles, headers
that claim more than is there and bytes after the array.

encode/decode build or parse the header of each (dtype, shape) once: a job's input and result cross Redis as .npy, and
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

__all__ = ["encode", "decode", "check_header", "read_checked", "decode_checked"]

_MAGIC = b"\x93NUMPY"
_CACHE_MAX = 1024  # distinct (dtype, shape) pairs remembered; a service sees a handful
_headers: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}  # (dtype, shape) -> np.save's header
_layouts: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}  # header -> dtype, shape, items


def encode(array: Any) -> bytes:
    """np.save(array, allow_pickle=False)'s bytes."""
    array = np.asarray(array)
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


_HEADER_READERS = {(1, 0): "read_array_header_1_0", (2, 0): "read_array_header_2_0"}


def check_header(stream: Any, available: int) -> None:
    """Reads a .npy header from `stream` and puts the stream back where it was; ValueError when
    its array needs more bytes than the `available` ones (a header claiming terabytes must be
    refused before anything is allocated) or holds objects."""
    start = stream.tell()
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _HEADER_READERS:
            raise ValueError(f".npy format version {version} is not supported (1.0 and 2.0 are)")
        shape, _, dtype = getattr(np.lib.format, _HEADER_READERS[version])(stream)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as error:
        raise ValueError(f"not a .npy array of numbers: {error}") from None
    if dtype.hasobject:
        raise ValueError("not a .npy array of numbers: it holds Python objects (pickles are refused)")
    need = dtype.itemsize
    for n in shape:
        need *= n
    left = available - (stream.tell() - start)
    stream.seek(start)
    if need > left:
        raise ValueError(f"not a .npy array it can hold: its header claims shape {tuple(shape)} of {dtype} "
                         f"({need} bytes) but only {max(left, 0)} bytes follow it")


def read_checked(stream: Any, available: int, what: str = "the body") -> np.ndarray:
    """The one reader of .npy bytes from outside (a request body, a file a client names): the
    array at `stream`, which holds `available` bytes from where it stands; ValueError naming
    `what` for anything else: another format, a pickled or object array, a header claiming
    more than is there, a truncated array, or bytes after it."""
    start = stream.tell()
    try:
        check_header(stream, available)
    except ValueError as error:
        raise ValueError(f"{what} is {error}") from None
    try:
        array = np.lib.format.read_array(stream, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(f"{what} is not a .npy array of numbers: {error}") from None
    extra = available - (stream.tell() - start)
    if extra:
        raise ValueError(f"{what} has {extra} bytes after its .npy array")
    return array


def decode_checked(body: bytes) -> np.ndarray:
    """The array of .npy bytes from outside (read_checked over the bytes)."""
    return read_checked(io.BytesIO(body), len(body))


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

