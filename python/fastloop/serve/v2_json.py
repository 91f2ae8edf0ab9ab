"""An Open Inference Protocol infer request's JSON, its tensors' numbers read in C.

json.loads spends ~190 us on a 784-float "data" array (a Python float per element); the C
number parser the /v1 front uses (fastloop._core.parse_json_inputs) reads it in ~15 us. So
each input's "data", when it is an array of numbers, is cut out of the body by its byte span,
read in C, and replaced by a small placeholder; json.loads then reads what is left (the
names, shapes, datatypes and parameters: a few hundred bytes) and read_request checks it
exactly as before. Nothing is decided here: any doubt -- a span the C parser refuses (empty,
ragged, null, a string, a number past a double, a syntax error), a placeholder that does not
land on an input's "data" in order, a skeleton that is not JSON -- falls back to json.loads
of the whole body, so what is accepted or refused, and every message, stays the same.

    >>> request = loads(b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2.5]}]}')
    >>> request["inputs"][0]["data"]        # Numbers(values=array([1. , 2.5]), raw=b'[1, 2.5]')

Why not a C reader of the whole v2 request: the request's other fields need Python's checks
(and their messages) anyway, and this keeps one C grammar, the one already fuzzed and tested.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

import numpy as np

from .. import _core

__all__ = ["Numbers", "loads", "as_list", "cast_floats"]

# "data": then an array. In valid JSON the array's bytes run to the next key's quote or the
# object's closing brace, less the whitespace and comma before it (a string or an object
# inside the array cuts it short: the C parser then refuses the piece).
_DATA = re.compile(rb'"data"\s*:\s*(?=\[)')
_MARK = "\x00fastloop-data"  # the placeholder's key (written \u0000...: no client sends a NUL)
_MIN_SPAN = 64  # shorter arrays: json.loads is as fast


class Numbers(NamedTuple):
    """An input's "data" read in C: its values as float64 (nested arrays: that shape) and
    its JSON text, for a datatype that needs the general path (integers, BOOL, BYTES)."""
    values: np.ndarray
    raw: bytes


def loads(head: bytes) -> Any:
    """json.loads(head), with each input's numeric "data" a Numbers instead of a list.
    Raises as json.loads does (ValueError, RecursionError) for a body that is not JSON."""
    pieces: list[bytes] = []
    found: list[Numbers] = []
    start = 0
    for match in _DATA.finditer(head):
        begin = match.end()
        if begin < start:  # inside a span already taken
            continue
        quote, brace = head.find(b'"', begin), head.find(b"}", begin)
        end = min(quote if quote >= 0 else len(head), brace if brace >= 0 else len(head))
        while end > begin and head[end - 1] in b" \t\n\r,":
            end -= 1
        if end - begin < _MIN_SPAN:
            continue
        raw = head[begin:end]
        parsed = _core.parse_json_inputs(b'{"inputs":' + raw + b"}")
        if parsed is None or parsed[1]:
            continue
        pieces += [head[start:begin], b'{"\\u0000fastloop-data":%d}' % len(found)]
        found.append(Numbers(parsed[0], raw))
        start = end
    if not found:
        return json.loads(head)
    pieces.append(head[start:])
    try:
        data = json.loads(b"".join(pieces))
        if _put_back(data, found):
            return data
    except (ValueError, RecursionError):
        pass
    return json.loads(head)  # the whole body decides, and words any error


def _put_back(data: Any, found: list[Numbers]) -> bool:
    """Replaces each placeholder in data["inputs"][i]["data"] with its Numbers; False unless
    every placeholder sits there, in order, each once."""
    inputs = data.get("inputs") if isinstance(data, dict) else None
    if not isinstance(inputs, list):
        return False
    taken = 0
    for item in inputs:
        value = item.get("data") if isinstance(item, dict) else None
        if isinstance(value, dict) and _MARK in value:
            if value != {_MARK: taken}:
                return False
            item["data"] = found[taken]
            taken += 1
    return taken == len(found)


def as_list(data: Any) -> Any:
    """The list json.loads would have given for a Numbers (for the general path)."""
    return json.loads(data.raw) if isinstance(data, Numbers) else data


def cast_floats(values: np.ndarray, dtype: np.dtype, label: str) -> np.ndarray:
    """float64 values as a float `dtype`, refused (ValueError) where one overflows it, as
    spec's cast of the list refuses it. A double holds each parsed integer exactly (the C
    parser leaves those >= 2**53 to Python), so each value rounds as the list's would."""
    with np.errstate(over="ignore"):
        cast = values.astype(dtype)
    if values.size and np.isinf(cast).any():  # the C parser reads finite numbers only
        raise ValueError(f"{label}: values up to {np.abs(values).max()} overflow {dtype.name}")
    return cast
