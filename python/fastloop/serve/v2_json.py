"""An Open Inference Protocol infer request's JSON, its tensors' numbers read in C.

json.loads spends ~190 us on a 784-float "data" array (a Python float per element). The C
reader (fastloop._core.parse_json_v2: the grammar /v1 bodies are read with, in
csrc/serve/fl_json_numbers.c, fuzzed and tested) takes a request whose every input has its
"data" as an array of numbers: each input's numbers come back as an array (float32 at once for
an "FP32" input, as NumPy's astype would round them), every other member as its JSON text,
which json.loads reads (a few hundred bytes). loads() gives what json.loads of the whole body
gives, with each "data" a Numbers, and read_request checks it exactly as before. Nothing is
decided here: any doubt -- a body the C reader refuses (an input without numeric data, a
duplicate key, a number past a double, an FP32 value past float32, a syntax error...), an input
of a datatype other than a float one -- falls back to json.loads of the whole body, so what is
accepted or refused, and every message, stays the same.

    >>> request = loads(b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2.5]}]}')
    >>> request["inputs"][0]["data"]        # Numbers(values=array([1. , 2.5], dtype=float32))
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np

from .. import _core

__all__ = ["Numbers", "loads", "read_plain", "cast_floats"]

_DECODER = json.JSONDecoder()
_FLOAT_DATATYPES = {b'"FP16"', b'"FP32"', b'"FP64"', b'"BF16"'}  # as written: an escape goes the general way
_PLAIN_DATATYPES = {text: text[1:-1].decode() for text in _FLOAT_DATATYPES}
_SHAPES: dict[bytes, tuple[int, ...]] = {}  # a shape's JSON text -> its sizes (a few per model: bounded below)
_MAX_SHAPES = 256
_MAX_SIZE = 2 ** 63 - 1  # v2_tensors.MAX_WHOLE: a larger size goes the general way, which refuses it


class Numbers(NamedTuple):
    """An input's "data" read in C: its values (nested arrays: that shape), float32 for an
    "FP32" input, else float64."""
    values: np.ndarray


def loads(head: bytes) -> Any:
    """json.loads(head), with each input's numeric "data" a Numbers instead of a list.
    Raises as json.loads does (ValueError, RecursionError) for a body that is not JSON."""
    parsed = _core.parse_json_v2(head)
    if parsed is None:
        return json.loads(head)
    inputs, rest = parsed
    tensors = []
    try:
        for values, members in inputs:
            if members.get("datatype") not in _FLOAT_DATATYPES:
                return json.loads(head)
            item = {key: _value(text) for key, text in members.items()}
            item["data"] = Numbers(values)
            tensors.append(item)
        data = {key: _value(text) for key, text in rest.items()}
    except (ValueError, RecursionError):  # e.g. an integer past Python's digit limit: the whole body words it
        return json.loads(head)
    data["inputs"] = tensors
    return data


def read_plain(head: bytes) -> tuple[list[tuple[str, str, tuple[int, ...], np.ndarray]], str | None] | None:
    """The usual request, read without building its JSON: inputs with exactly a plain "name",
    a float "datatype", a "shape" of sizes and numeric "data", and beside "inputs" at most a
    plain "id" (no parameters, no outputs). (inputs as (name, datatype, shape, values), id), or
    None for any other request: loads() and read_request's checks take it, and decide exactly
    what they would decide for this one (test_serve_v2_json compares the two)."""
    parsed = _core.parse_json_v2(head)
    if parsed is None:
        return None
    inputs, rest = parsed
    request_id = None
    if rest:
        text = rest.get("id")
        if len(rest) != 1 or text is None or text[:1] != b'"' or b"\\" in text:
            return None
        request_id = text[1:-1].decode()
    plain = []
    for values, members in inputs:
        name, datatype, shape = members.get("name"), _PLAIN_DATATYPES.get(members.get("datatype")), \
            _sizes(members.get("shape"))
        if len(members) != 3 or name is None or name[:1] != b'"' or b"\\" in name or datatype is None or shape is None:
            return None
        plain.append((name[1:-1].decode(), datatype, shape, values))
    return plain, request_id


def _sizes(text: bytes | None) -> tuple[int, ...] | None:
    """A "shape" written as a list of JSON integers >= 0, as a tuple; None for anything else."""
    sizes = _SHAPES.get(text)  # type: ignore[arg-type]
    if sizes is not None or text is None:
        return sizes
    try:
        value = _DECODER.decode(text.decode())
    except ValueError:
        return None
    if not isinstance(value, list) or not all(type(size) is int and 0 <= size <= _MAX_SIZE for size in value):
        return None
    if len(_SHAPES) < _MAX_SHAPES:
        _SHAPES[text] = tuple(value)
    return tuple(value)


def _value(text: bytes) -> Any:
    """One member's JSON text as json.loads reads it (a string without escapes, the usual
    name or datatype, without json.loads' own overhead)."""
    if text[:1] == b'"' and b"\\" not in text:
        return text[1:-1].decode()  # valid UTF-8: the C reader checked it
    return _DECODER.decode(text.decode())  # json.loads' own decoder, without its checks of the argument


def cast_floats(values: np.ndarray, dtype: np.dtype, label: str) -> np.ndarray:
    """Float values (float64, or float32 already rounded) as a float `dtype`, refused
    (ValueError) where one overflows it, as spec's cast of the list refuses it. A double holds
    each parsed integer exactly (the C reader leaves those >= 2**53 to Python), so each value
    rounds as the list's would."""
    if values.dtype == dtype:
        return values
    with np.errstate(over="ignore"):
        cast = values.astype(dtype)
    if values.size and np.isinf(cast).any():  # the C parser reads finite numbers only
        raise ValueError(f"{label}: values up to {np.abs(values).max()} overflow {dtype.name}")
    return cast
