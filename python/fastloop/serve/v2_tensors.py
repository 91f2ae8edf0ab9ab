"""The tensors of the Open Inference Protocol (KServe v2, as Triton speaks it over REST): the
datatype names and their NumPy dtypes, and an infer request's and response's bodies, JSON or
with Triton's binary tensor extension. Pure functions of bytes and arrays (no service, no
HTTP), so each is tested alone; http_v2.py routes them.

    >>> request = read_request(body, header_length=None)         # a JSON body
    >>> request.inputs[0].name, request.inputs[0].array.shape      # ('x', (2, 4))
    >>> body, header_length = write_response("mnist", "1", "req-7", [("output0", y, True)])

Binary extension: the body is the JSON header (``Inference-Header-Content-Length`` bytes), then
each binary input's bytes in the order the inputs are listed, each input naming its size in
``parameters.binary_data_size``; numbers are little-endian, row-major; a BYTES tensor is each
element as a 4-byte little-endian length and its bytes. BF16 (which NumPy lacks) reads into
float32. An output is binary when its request asks (``parameters.binary_data``) or, for an
output the request does not list, when ``parameters.binary_data_output`` is true.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, NamedTuple

import numpy as np

from . import v2_json
from .http_inputs import BadInput, check_numbers
from .spec import _cast_list

__all__ = ["DATATYPES", "datatype_of", "Tensor", "Requested", "Request", "read_request", "write_response",
           "decode_json", "decode_binary", "encode_bytes", "decode_bytes"]

# The protocol's datatype -> the NumPy dtype its elements have (little-endian on the wire).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<f4"),  # read into float32: NumPy has no bfloat16
    "BYTES": np.dtype(object),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items() if name not in ("BF16", "BYTES")}

_REQUEST_KEYS = {"id", "parameters", "inputs", "outputs", "model_name", "model_version"}  # the last two: KServe's client
_REQUEST_PARAMETERS = {"binary_data_output", "timeout", "priority"}
_TENSOR_KEYS = {"name", "shape", "datatype", "parameters", "data"}


def datatype_of(dtype: np.dtype) -> str:
    """The protocol's name of a NumPy dtype (float32 -> "FP32"); BadInput for one it lacks."""
    name = _NAMES.get(dtype)  # the usual case: a native dtype the table has
    if name is not None:
        return name
    name = _NAMES.get(np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).kind in "iuf" else np.dtype(dtype))
    if name is None:
        raise BadInput(f"dtype {np.dtype(dtype)} has no Open Inference Protocol datatype")
    return name


class Tensor(NamedTuple):
    """One input of a request: its name, declared datatype and its elements as an array."""
    name: str
    datatype: str
    array: np.ndarray


class Requested(NamedTuple):
    """One output a request lists: its name, and whether it comes back binary (None: the
    request's default)."""
    name: str
    binary: bool | None


class Request(NamedTuple):
    id: str | None
    inputs: list[Tensor]
    outputs: list[Requested] | None  # None: every output
    binary_output: bool  # parameters.binary_data_output: the default for outputs not listed
    timeout_us: int | None  # parameters.timeout (Triton's: microseconds)
    priority: int  # parameters.priority (Triton's: 0 the default level, 1 the highest)
    model: tuple[str | None, str | None] = (None, None)  # the body's model_name and model_version, if given


_ENCODER = json.JSONEncoder(allow_nan=False)  # one for every response (json.dumps builds one a call for allow_nan)
MAX_WHOLE = 2 ** 63 - 1  # the largest timeout or priority (Triton's are 64-bit)


def whole(value: Any) -> int | None:
    """`value` as an int if it is a JSON integer from 0 to MAX_WHOLE (2.0 included: JSON, and
    JSON Schema's "integer", do not tell 2.0 from 2), else None."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_WHOLE:
        return None
    return value


def _shape(value: Any, label: str) -> tuple[int, ...]:
    sizes = [whole(s) for s in value] if isinstance(value, list) else [None]
    if None in sizes:
        raise BadInput(f"{label}: 'shape' must be a list of sizes (ints >= 0), not {value!r:.60}")
    return tuple(sizes)  # type: ignore[arg-type]


def _object(value: Any, label: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadInput(f"{label} must be a JSON object, not {type(value).__name__}")
    return value


def decode_json(datatype: str, shape: tuple[int, ...], data: Any, label: str) -> np.ndarray:
    """A tensor's "data" (row-major, flat or nested) as an array of `shape`; BadInput naming
    `label` for elements the datatype cannot hold exactly or a count the shape does not have.
    `data` may be a v2_json.Numbers (an array of numbers read in C, of a float datatype)."""
    if isinstance(data, v2_json.Numbers):
        try:
            array = v2_json.cast_floats(data.values, DATATYPES[datatype], label)
        except ValueError as error:
            raise BadInput(str(error)) from None
        return _reshaped(array, shape, label)
    if datatype == "BYTES":
        flat = np.array(data, dtype=object).ravel()
        if not all(isinstance(item, str) for item in flat):
            raise BadInput(f"{label}: BYTES data must be strings")
        array = np.array([item.encode() for item in flat] if flat.size else [], dtype=object)
    elif datatype == "BOOL":
        array = np.array(data)
        if array.size and array.dtype != bool:
            raise BadInput(f"{label}: BOOL data must be true or false, got {array.dtype} values")
        array = array.astype(bool)
    else:
        check_numbers(data, label)
        try:
            array = _cast_list(data, DATATYPES[datatype], label)
        except (TypeError, ValueError) as error:
            raise BadInput(str(error)) from None
    return _reshaped(array, shape, label)


def _reshaped(array: np.ndarray, shape: tuple[int, ...], label: str) -> np.ndarray:
    if array.size != math.prod(shape):
        raise BadInput(f"{label}: shape {list(shape)} holds {math.prod(shape)} elements, 'data' has {array.size}")
    return array.reshape(shape)


def decode_bytes(buffer: bytes | memoryview, count: int, label: str) -> np.ndarray:
    """`count` length-prefixed (4-byte little-endian) elements of a binary BYTES tensor."""
    items, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(buffer):
            raise BadInput(f"{label}: the binary BYTES data ends inside an element's length")
        (size,) = struct.unpack_from("<I", buffer, offset)
        if offset + 4 + size > len(buffer):
            raise BadInput(f"{label}: a BYTES element of {size} bytes runs past the data")
        items.append(bytes(buffer[offset + 4:offset + 4 + size]))
        offset += 4 + size
    if offset != len(buffer):
        raise BadInput(f"{label}: {len(buffer) - offset} bytes follow the {count} BYTES elements")
    return np.array(items, dtype=object)


def encode_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor's binary form: each element as its length (4 bytes, little-endian), then it."""
    parts = []
    for item in array.ravel():
        raw = item if isinstance(item, bytes) else str(item).encode()
        parts += [struct.pack("<I", len(raw)), raw]
    return b"".join(parts)


def decode_binary(datatype: str, shape: tuple[int, ...], buffer: bytes | memoryview, label: str) -> np.ndarray:
    """A binary tensor's bytes as an array of `shape`: read-only, over `buffer` (no copy: the
    service's submit makes its own, private one)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return decode_bytes(buffer, count, label).reshape(shape)
    itemsize = 2 if datatype == "BF16" else DATATYPES[datatype].itemsize
    if len(buffer) != count * itemsize:
        raise BadInput(f"{label}: shape {list(shape)} of {datatype} takes {count * itemsize} bytes, "
                       f"binary_data_size gives {len(buffer)}")
    if datatype == "BF16":  # the upper half of a float32
        return (np.frombuffer(buffer, "<u2").astype("<u4") << 16).view("<f4").reshape(shape)
    array = np.frombuffer(buffer, DATATYPES[datatype]).reshape(shape)
    if datatype == "BOOL" and array.size and np.frombuffer(buffer, np.uint8).max() > 1:
        raise BadInput(f"{label}: BOOL bytes must be 0 or 1")
    return array


def read_request(body: bytes, header_length: int | None) -> Request:
    """An infer request's body: its JSON (the first `header_length` bytes when the binary
    extension is used, else all of it) and the binary tensors after it."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise BadInput(f"Inference-Header-Content-Length is {header_length}, the body has {len(body)} bytes")
    head = body if header_length is None else body[:header_length]
    if header_length is None:
        request = _read_plain(head)
        if request is not None:
            return request
    try:
        data = v2_json.loads(head)  # each input's numeric "data" read in C
    except (ValueError, RecursionError) as error:
        raise BadInput(f"the request's JSON is not valid: {error}") from None
    data = _object(data, "the request")
    if not _REQUEST_KEYS.issuperset(data):
        raise BadInput(f"unknown request fields {sorted(set(data) - _REQUEST_KEYS)}: an infer request has 'id', "
                       "'parameters', 'inputs' and 'outputs'")
    for key in ("id", "model_name", "model_version"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise BadInput(f"{key!r} must be a string, not {type(data[key]).__name__}")
    request_id = data.get("id")
    timeout, priority, binary_output = _read_parameters(data["parameters"]) if "parameters" in data else (None, 0, False)
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadInput("'inputs' must be a non-empty list of tensors")
    offset = len(head)
    tensors = []
    for item in inputs:
        tensor, offset = _read_input(_object(item, "each input"), body, offset)
        tensors.append(tensor)
    if offset != len(body):
        raise BadInput(f"{len(body) - offset} bytes follow the inputs' binary data (binary_data_size)")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise BadInput(f"inputs are named more than once: {names}")
    return Request(request_id, tensors, _read_outputs(data.get("outputs")), binary_output, timeout, priority,
                   (data.get("model_name"), data.get("model_version")))


def _read_plain(head: bytes) -> Request | None:
    """The usual JSON request (v2_json.read_plain) as read_request reads it, or None."""
    plain = v2_json.read_plain(head)
    if plain is None:
        return None
    inputs, request_id = plain
    tensors = [Tensor(name, datatype, decode_json(datatype, shape, v2_json.Numbers(values), f"input {name!r}"))
               for name, datatype, shape, values in inputs]
    if len(tensors) > 1 and len({t.name for t in tensors}) != len(tensors):
        return None  # read_request words it
    return Request(request_id, tensors, None, False, None, 0)


def _read_parameters(value: Any) -> tuple[int | None, int, bool]:
    """The request's parameters: (timeout, priority, binary_data_output)."""
    parameters = _object(value, "'parameters'")
    if not _REQUEST_PARAMETERS.issuperset(parameters):
        raise BadInput(f"unsupported request parameters {sorted(set(parameters) - _REQUEST_PARAMETERS)}: this server "
                       f"takes {sorted(_REQUEST_PARAMETERS)} (no sequence batching, no custom parameters)")
    timeout, priority = parameters.get("timeout"), parameters.get("priority")
    for name, value in (("timeout", timeout), ("priority", priority)):
        if value is not None and whole(value) is None:
            raise BadInput(f"parameter {name!r} must be an integer from 0 to 2**63-1, not {value!r:.40}")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise BadInput(f"parameter 'binary_data_output' must be true or false, not {binary_output!r:.40}")
    return (None if timeout is None else whole(timeout)), (0 if priority is None else whole(priority)), binary_output


def _read_input(item: dict[str, Any], body: bytes, offset: int) -> tuple[Tensor, int]:
    name = item.get("name")
    if not isinstance(name, str):
        raise BadInput(f"each input needs a 'name' (a string), not {name!r:.40}")
    label = f"input {name!r}"
    if not _TENSOR_KEYS.issuperset(item):
        raise BadInput(f"{label}: unknown fields {sorted(set(item) - _TENSOR_KEYS)}")
    datatype = item.get("datatype")
    if datatype not in DATATYPES:
        raise BadInput(f"{label}: datatype {datatype!r:.40} is not one of {', '.join(DATATYPES)}")
    shape = _shape(item.get("shape"), label)
    size = _binary_size(item["parameters"], label) if "parameters" in item else None
    if size is None:
        if "data" not in item:
            raise BadInput(f"{label} has neither 'data' nor parameters.binary_data_size")
        return Tensor(name, datatype, decode_json(datatype, shape, item["data"], label)), offset
    if "data" in item:
        raise BadInput(f"{label} has both 'data' and parameters.binary_data_size: give one")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(body):
        raise BadInput(f"{label}: binary_data_size {size!r:.40} runs past the body's {len(body) - offset} "
                       "binary bytes (is Inference-Header-Content-Length set?)")
    view = memoryview(body)[offset:offset + size]
    return Tensor(name, datatype, decode_binary(datatype, shape, view, label)), offset + size


def _binary_size(value: Any, label: str) -> Any:
    """An input's parameters: its binary_data_size (None: none given; checked by the caller)."""
    parameters = _object(value, f"{label} 'parameters'")
    unknown = sorted(set(parameters) - {"binary_data_size"})
    if unknown:
        hint = " (shared memory is not supported)" if any("shared_memory" in key for key in unknown) else ""
        raise BadInput(f"{label}: unsupported parameters {unknown}{hint}")
    return parameters.get("binary_data_size")


def _read_outputs(outputs: Any) -> list[Requested] | None:
    if outputs is None:
        return None
    if not isinstance(outputs, list):
        raise BadInput(f"'outputs' must be a list, not {type(outputs).__name__}")
    requested = []
    for item in outputs:
        item = _object(item, "each requested output")
        name = item.get("name")
        if not isinstance(name, str):
            raise BadInput(f"each requested output needs a 'name' (a string), not {name!r:.40}")
        parameters = _object(item.get("parameters", {}), f"output {name!r} 'parameters'")
        unknown = sorted(set(parameters) - {"binary_data"})
        if unknown or set(item) - {"name", "parameters"}:
            raise BadInput(f"output {name!r}: unsupported fields or parameters "
                           f"{unknown or sorted(set(item) - {'name', 'parameters'})} (no classification, "
                           "no shared memory)")
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise BadInput(f"output {name!r}: binary_data must be true or false")
        requested.append(Requested(name, binary))
    return requested


def _json_data(array: np.ndarray) -> list[Any]:
    flat = array.ravel()
    if array.dtype == object:
        return [item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item) for item in flat]
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():  # JSON has no NaN or infinity
        return np.where(np.isfinite(flat), flat, None).tolist()
    return flat.tolist()


def write_response(model_name: str, version: str, request_id: str | None,
                   outputs: list[tuple[str, np.ndarray, bool]]) -> tuple[bytes, int | None]:
    """An infer response's body for `outputs` (name, array, binary), and the length of its
    JSON header when an output is binary (None: the body is all JSON)."""
    tensors, chunks = [], []
    for name, array, binary in outputs:
        datatype = "BYTES" if array.dtype == object else datatype_of(array.dtype)
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            raw = encode_bytes(array) if datatype == "BYTES" else \
                np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            tensor["data"] = _json_data(array)
        tensors.append(tensor)
    response: dict[str, Any] = {"model_name": model_name, "model_version": version}
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = tensors
    head = _ENCODER.encode(response).encode()
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)
