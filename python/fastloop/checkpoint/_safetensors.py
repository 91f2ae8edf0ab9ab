"""Reading safetensors files, as strictly as the safetensors package does and then some: the
header length is bounded (100 MB, the package's limit) and inside the file, the header is
UTF-8 JSON (json's own parser: no NaN, no duplicate keys), every entry has a known dtype, a
shape of non-negative ints and offsets whose span is exactly shape x itemsize, and the
entries cover the data buffer back to back, without holes or overlaps, to the end of the file.
Nothing else in fastloop parses the format (the C writer only writes it).

    contents = read("ckpts/ckpt-000000001200.safetensors")   # .arrays, .codes, .metadata
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, NamedTuple

import numpy as np

from ._dtypes import NUMPY_OF, TORCH_NAME_OF

HEADER_LIMIT = 100_000_000
_INTP_MAX = 2**63 - 1
CRC_KEY = "fastloop.crc32"  # the data buffer's CRC-32 (zlib's), 8 hex digits, when fastloop wrote it


class FormatError(ValueError):
    """The bytes are not a valid safetensors file; the message says what is wrong (the caller
    adds the path)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise FormatError(f"the header has the key {key!r} twice")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise FormatError(f"the header holds {name}, which JSON does not allow")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry(name: str, info: Any) -> tuple[str, np.dtype, list[int], int, int]:
    """(code, dtype, shape, begin, end) of one header entry, checked."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise FormatError(f"tensor {name!r} is not a {{dtype, shape, data_offsets}} object")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in NUMPY_OF:
        raise FormatError(f"tensor {name!r} has the unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise FormatError(f"tensor {name!r} has the shape {shape!r}, not a list of ints >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise FormatError(f"tensor {name!r} has the data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end")
    dtype = NUMPY_OF[code]
    count = 1
    for d in shape:  # as a checked multiply in the order given, like the package's
        count *= d
        if count > _INTP_MAX:
            raise FormatError(f"tensor {name!r} has the shape {shape}, whose size overflows")
    size = count * dtype.itemsize
    if offsets[1] - offsets[0] != size:
        raise FormatError(f"tensor {name!r} spans {offsets[1] - offsets[0]} bytes; its dtype {code} "
                          f"and shape {shape} make {size}")
    return code, dtype, shape, offsets[0], offsets[1]


def parse_header(raw: bytes, data_len: int) -> tuple[dict[str, tuple[str, np.dtype, list[int], int, int]], dict[str, str]]:
    """The entries and metadata of a header whose data buffer is `data_len` bytes; FormatError
    says what is wrong."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except UnicodeDecodeError as error:
        raise FormatError(f"the header is not UTF-8 ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise FormatError(f"the header is not JSON ({error.msg} at byte {error.pos})") from None
    except RecursionError:
        raise FormatError("the header nests too deep") from None
    if not isinstance(header, dict):
        raise FormatError(f"the header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("the header's __metadata__ is not an object of strings")
    entries = {name: _entry(name, info) for name, info in header.items()}
    end = 0
    for name, (_, _, _, begin, stop) in sorted(entries.items(), key=lambda item: item[1][3:]):
        if begin != end:
            raise FormatError(f"tensor {name!r} starts at byte {begin} of the data, not {end}: "
                              + ("a hole" if begin > end else "an overlap"))
        end = stop
    if end != data_len:
        raise FormatError(f"the tensors cover {end} bytes of data; the file holds {data_len}")
    return entries, metadata


def _header(f: Any) -> tuple[int, bytes]:
    """(file size, header bytes) of an open file, its header length checked."""
    size = os.fstat(f.fileno()).st_size
    if size < 8:
        raise FormatError(f"{size} bytes: too short for a safetensors file (8-byte header length, header, data)")
    header_len = int.from_bytes(f.read(8), "little")
    if header_len > HEADER_LIMIT:
        raise FormatError(f"a header length of {header_len} bytes, over the {HEADER_LIMIT} safetensors reads")
    if header_len > size - 8:
        raise FormatError(f"a header length of {header_len} bytes in a file of {size}")
    raw = f.read(header_len)
    if len(raw) != header_len:
        raise FormatError(f"the file shrank while it was read (it was {size} bytes)")
    return size, raw


def check(path: str | os.PathLike[str]) -> None:
    """Checks the header of the file at `path` and that its size is what the header says,
    without reading the data: FormatError (what is wrong) or OSError."""
    with open(path, "rb") as f:
        size, raw = _header(f)
    parse_header(raw, size - 8 - len(raw))


class Contents(NamedTuple):
    arrays: dict[str, np.ndarray]  # by name, views of one writable buffer
    codes: dict[str, str]  # safetensors dtype codes by name
    metadata: dict[str, str]


def read(path: str | os.PathLike[str]) -> Contents:
    """The tensors and metadata of the safetensors file at `path`: views of one writable
    buffer (copies when a tensor is not aligned to its item size), dtypes NumPy lacks as
    their raw bits. Raises FormatError (what is wrong) or OSError; checks the data's CRC-32
    when the metadata holds one."""
    with open(path, "rb") as f:
        size, raw = _header(f)
        data = bytearray(size - 8 - len(raw))
        if f.readinto(data) != len(data):
            raise FormatError(f"the file shrank while it was read (it was {size} bytes)")
    entries, metadata = parse_header(raw, len(data))
    if CRC_KEY in metadata and metadata[CRC_KEY] != f"{zlib.crc32(data):08x}":
        raise FormatError(f"the data's CRC-32 is {zlib.crc32(data):08x}, the header says "
                          f"{metadata[CRC_KEY]}: the file is damaged")
    arrays, codes = {}, {}
    for name, (code, dtype, shape, begin, end) in entries.items():
        if begin == end:
            arrays[name] = np.empty(shape, dtype)
        else:
            array = np.frombuffer(data, dtype, (end - begin) // dtype.itemsize, begin).reshape(shape)
            arrays[name] = array if begin % dtype.itemsize == 0 else array.copy()
        codes[name] = code
    return Contents(arrays, codes, metadata)


def flat_manifest(contents: Contents) -> str:
    """A manifest for a file fastloop did not write: a dict of CPU tensors by name (torch
    tensors when torch is importable, else NumPy arrays; see _state.unflatten)."""
    items = [[{"t": "const", "v": name}, {"t": "tensor", "dtype": TORCH_NAME_OF[code], "device": "cpu", "k": name}]
             for name, code in contents.codes.items()]
    return json.dumps({"version": 1, "root": {"t": "dict", "v": items}})
