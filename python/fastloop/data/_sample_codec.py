"""What a Loader's worker process sends besides the fixed-shape arrays of a batch: the
samples' other values (strings, bytes, None, arrays of varying shape, any object), written
into the batch slot's object area, or after the batch on the worker's socket when they do not
fit, and read back in the main process.

A blob is b"S" (the batch's object columns: one list per object field, in the slots' order)
or b"R" (the batch's whole samples, when some sample did not fit the slots' layout), three
bytes of padding, the sample count (u32), each sample's dataset index (i64), then one value.
A value is a tag byte and its body, little-endian:

    m  u64 n, n bytes of `marshal`: str, bytes, int, float, complex, bool, None and
       tuples, lists, dicts and sets of them, exact types only (checked first: marshal would
       write any other object with a buffer, an array say, as bytes); no code runs to load it
    a  an array: u8 n + n bytes of dtype.str, u8 ndim, ndim x i64 shape, zero padding to a
       multiple of 16 from the blob's start, the C-order bytes (tensors travel as arrays)
    n  a NumPy scalar: an array of shape () whose element is handed back
    t/l  u32 n, n values: a tuple/list holding an array (otherwise it is one 'm' value)
    d  u32 n, n (key, value) pairs: a dict holding an array
    c  a value (the namedtuple's type, pickled), u32 n, n values: a namedtuple
    p  u64 n, n bytes of pickle protocol 5: anything else, as DataLoader sends everything
"""

from __future__ import annotations

import marshal
import pickle
import struct
from typing import Any, Callable, Sequence

import numpy as np

from ._torch_interop import is_tensor, tensor_as_array

_U8, _U32, _U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")
_ALIGN = 16
COLUMNS, SAMPLES = b"S", b"R"
_ATOMS = frozenset({str, bytes, int, float, complex, bool, type(None)})
_COLLECTIONS = frozenset({tuple, list, set, frozenset})


def _plain(v: Any) -> bool:
    """Whether marshal writes v exactly: atoms and collections of them, of exact types."""
    kind = type(v)
    if kind in _ATOMS:
        return True
    if kind in _COLLECTIONS:
        return all(type(x) in _ATOMS or _plain(x) for x in v)
    if kind is dict:
        return all(type(k) in _ATOMS and (type(x) in _ATOMS or _plain(x)) for k, x in v.items())
    return False


def describe(path: tuple) -> str:
    """A field's path as users write it: "field 2", "field 'boxes'", "field 1['boxes'][0]"."""
    if not path:
        return "the sample"
    return f"field {path[0]!r}" + "".join(f"[{p!r}]" for p in path[1:])


def what(path: tuple) -> str:
    """The value at `path` of a sample, in words: "sample field 2", or "the sample" itself."""
    return f"sample {describe(path)}" if path else "the sample"


class Unsendable(TypeError):
    """A value a worker cannot send (a tensor NumPy cannot view, an object pickle refuses)."""


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def value(self, v: Any, path: tuple) -> None:
        if isinstance(v, np.ndarray):
            self.array(b"a", v, path)
        elif is_tensor(v):
            self.array(b"a", tensor_as_array(v, lambda: what(path)), path)
        elif isinstance(v, np.generic) and not isinstance(v, (str, bytes, np.void, np.object_)):
            self.array(b"n", np.asarray(v), path)
        elif _plain(v):
            self.marshalled(v)
        else:  # an array inside, or another type
            self.composite(v, path)

    def marshalled(self, v: Any) -> None:
        data = marshal.dumps(v)
        self.out += b"m" + _U64.pack(len(data)) + data

    def array(self, tag: bytes, a: np.ndarray, path: tuple) -> None:
        if a.dtype.hasobject or a.dtype.fields is not None or a.ndim > 255:
            self.pickled(a, path)  # Python objects inside, or a layout dtype.str does not keep
            return
        descr = a.dtype.str.encode()
        self.out += tag + _U8.pack(len(descr)) + descr + _U8.pack(a.ndim)
        self.out += struct.pack(f"<{a.ndim}q", *a.shape)
        self.out += bytes(-len(self.out) % _ALIGN)
        self.out += memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))  # any dtype, shape, size

    def composite(self, v: Any, path: tuple) -> None:
        kind = type(v)
        if kind is tuple or kind is list:
            self.out += (b"t" if kind is tuple else b"l") + _U32.pack(len(v))
            for i, x in enumerate(v):
                self.value(x, path + (i,))
        elif kind is dict:
            self.out += b"d" + _U32.pack(len(v))
            for k, x in v.items():
                self.value(k, path)
                self.value(x, path + (k,))
        elif isinstance(v, tuple) and hasattr(kind, "_fields"):  # a namedtuple, as default_collate keeps it
            self.out += b"c"
            self.pickled(kind, path)
            self.out += _U32.pack(len(v))
            for i, x in enumerate(v):
                self.value(x, path + (i,))
        else:
            self.pickled(v, path)

    def pickled(self, v: Any, path: tuple) -> None:
        try:
            data = pickle.dumps(v, protocol=5)
        except Exception as e:
            raise Unsendable(f"{what(path)} is a {type(v).__name__}, which cannot be sent from a "
                             f"worker process: pickle says {e}") from None
        self.out += b"p" + _U64.pack(len(data)) + data


def encode(kind: bytes, indices: Sequence[int], payload: Any, paths: Sequence[tuple] | None = None) -> bytearray:
    """A blob of `kind` (COLUMNS: payload is a list of columns, `paths` theirs; SAMPLES: a
    list of samples) for the samples `indices`. An Unsendable value raises it with the
    sample's index in the message."""
    w = _Writer()
    w.out += kind + bytes(3) + _U32.pack(len(indices))
    w.out += np.asarray(indices, dtype="<i8").tobytes()
    if _plain(payload):  # the usual case: strings, numbers, None
        w.marshalled(payload)
        return w.out
    w.out += b"l" + _U32.pack(len(payload))
    for k, item in enumerate(payload):
        if kind == COLUMNS:
            _encode_column(w, item, paths[k] if paths is not None else (k,), indices)
        else:
            _with_index(lambda: w.value(item, ()), indices[k])
    return w.out


def _encode_column(w: _Writer, column: list, path: tuple, indices: Sequence[int]) -> None:
    if _plain(column):
        w.marshalled(column)
        return
    w.out += b"l" + _U32.pack(len(column))
    for i, item in enumerate(column):
        _with_index(lambda: w.value(item, path), indices[i])


def _with_index(write: Callable[[], None], index: int) -> None:
    try:
        write()
    except TypeError as e:  # Unsendable, or a tensor NumPy cannot view
        raise Unsendable(f"sample {index}: {e}") from None


class _Reader:
    def __init__(self, blob: bytearray) -> None:
        self.blob, self.view, self.pos = blob, memoryview(blob), 0

    def take(self, s: struct.Struct) -> int:
        (n,) = s.unpack_from(self.blob, self.pos)
        self.pos += s.size
        return n

    def value(self) -> Any:
        tag = self.blob[self.pos]
        self.pos += 1
        if tag == 0x6D:  # m
            n = self.take(_U64)
            self.pos += n
            return marshal.loads(self.view[self.pos - n:self.pos])
        if tag in (0x61, 0x6E):  # a, n
            return self.array(scalar=tag == 0x6E)
        if tag in (0x74, 0x6C):  # t, l
            items = [self.value() for _ in range(self.take(_U32))]
            return tuple(items) if tag == 0x74 else items
        if tag == 0x64:  # d
            out = {}
            for _ in range(self.take(_U32)):
                key = self.value()
                out[key] = self.value()
            return out
        if tag == 0x63:  # c
            kind = self.value()
            return kind(*[self.value() for _ in range(self.take(_U32))])
        if tag == 0x70:  # p
            n = self.take(_U64)
            self.pos += n
            return pickle.loads(self.view[self.pos - n:self.pos])
        raise ValueError(f"a worker's sample data is corrupt: tag {tag:#x} at byte {self.pos - 1}")

    def array(self, scalar: bool) -> Any:
        n = self.take(_U8)
        dtype = np.dtype(bytes(self.view[self.pos:self.pos + n]).decode())
        self.pos += n
        ndim = self.take(_U8)
        shape = struct.unpack_from(f"<{ndim}q", self.blob, self.pos)
        self.pos += 8 * ndim
        self.pos += -self.pos % _ALIGN
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            a = np.empty(shape, dtype)
        else:  # a view of the blob (a bytearray: writable, as the worker's array was)
            a = np.frombuffer(self.blob, dtype, count, self.pos).reshape(shape)
            self.pos += count * dtype.itemsize
        return a[()] if scalar else a


def decode(blob: bytearray) -> tuple[bytes, np.ndarray, Any]:
    """(kind, the samples' dataset indices, the payload) of a blob encode() made."""
    kind = bytes(blob[:1])
    if kind not in (COLUMNS, SAMPLES):
        raise ValueError(f"a worker's sample data is corrupt: it starts with {bytes(blob[:8])!r}")
    (count,) = _U32.unpack_from(blob, 4)
    indices = np.frombuffer(blob, "<i8", count, 8)
    reader = _Reader(blob)
    reader.pos = 8 + 8 * count
    return kind, indices, reader.value()
