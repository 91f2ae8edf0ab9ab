"""Reading a job's input for the HTTP front: a JSON body, a ``.npy`` body
(``Content-Type: application/x-npy``: no number parsing, the dtype kept exactly), or a
``.npy`` file named by a path under the configured input root. Everything here raises
BadInput (a ValueError) with the reason the client gets in its 400, or TooLarge for its 413;
nothing is read with pickle. The usual body, "inputs" a rectangular array of numbers for a
float model, is parsed in C (fastloop._core.parse_json_inputs: ~15 us for 784 floats, the GIL
released from 64 KB); every other
body goes through json.loads, as before.

    >>> payload = parse_body(b'{"path": "images/cat.npy"}')
    >>> x = load_npy_under("/srv/inputs", payload["path"], max_bytes=1 << 20)
    >>> x = parse_npy(request_body)            # Content-Type: application/x-npy
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

import numpy as np

from .. import _core
from . import npy_codec

__all__ = ["BadInput", "TooLarge", "NPY_TYPE", "parse_body", "parse_npy", "npy_bytes", "load_npy_under",
           "check_numbers", "check_npy_header"]

NPY_TYPE = "application/x-npy"  # a body holding one array in NumPy's .npy format

_KEYS = {"inputs", "path", "id", "timeout_s", "priority"}


class BadInput(ValueError):
    """A request the client must fix (HTTP 400); the message is the reason."""


class TooLarge(ValueError):
    """An input over the size limit (HTTP 413)."""


def _refuse_constant(token: str) -> Any:
    raise json.JSONDecodeError(f"{token} is not JSON (send a finite number)", token, 0)


def parse_body(body: bytes, dtype: np.dtype | None = None) -> dict[str, Any]:
    """The JSON object of a POST /v1/jobs: exactly one of "inputs" and "path", optionally "id"
    and "priority" (the service checks it).

    ``dtype``: the model's. When it is a float dtype, a body whose "inputs" is a rectangular
    array of numbers is parsed in C (the GIL released for large bodies) and its "inputs" comes back as an array of
    that dtype holding the values the nested list would have become; any other body takes the
    json.loads path, so what is accepted or refused, and every message, stays the same."""
    if dtype is not None and dtype.kind == "f":
        data = _parse_numbers_body(body, dtype)
        if data is not None:
            return data
    try:
        data = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:  # ValueError: also an integer over Python's digit limit
        raise BadInput(f"the body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadInput(f"the body must be a JSON object, not {type(data).__name__}")
    _check_keys(data)
    if "inputs" in data:
        if isinstance(data["inputs"], dict):  # one nested list per named input
            for name, value in data["inputs"].items():
                check_numbers(value, f"'inputs' {name!r}")
        else:
            check_numbers(data["inputs"])
    _check_values(data)
    return data


def _parse_numbers_body(body: bytes, dtype: np.dtype) -> dict[str, Any] | None:
    """parse_body's result for the usual body, "inputs" read in C (large bodies without the GIL) and cast to
    `dtype`; None for any other body, or any doubt, so json.loads decides and words the error.
    The C parser leaves integer literals >= 2**53 to json.loads: below that a double holds an
    int exactly, so casting the float64 array rounds each number as NumPy rounds the list's."""
    float32 = dtype == np.float32  # the usual model: narrowed in C, None past float32's range
    parsed = _core.parse_json_inputs(body, float32=float32)
    if parsed is None:
        return None
    inputs, raw = parsed
    try:
        data = {key: json.loads(value) for key, value in raw.items()}
        if float32:
            data["inputs"] = inputs
        else:
            with np.errstate(over="raise"):  # 1e300 as float16: the general path names the input
                data["inputs"] = inputs.astype(dtype, copy=False)
    except (ValueError, RecursionError, FloatingPointError):
        return None
    _check_keys(data)
    _check_values(data)
    return data


def _check_keys(data: dict[str, Any]) -> None:
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise BadInput(f"unknown keys {unknown}: use 'inputs' (a nested list) or 'path', and optionally 'id', "
                       "'timeout_s' and 'priority'")
    if ("inputs" in data) == ("path" in data):
        raise BadInput("give exactly one of 'inputs' (a nested list of numbers) or 'path' (a .npy file)")


def _check_values(data: dict[str, Any]) -> None:
    if "path" in data and not isinstance(data["path"], str):
        raise BadInput(f"'path' must be a string, not {type(data['path']).__name__}")
    if "id" in data and not isinstance(data["id"], str):
        raise BadInput(f"'id' must be a string, not {type(data['id']).__name__}")
    timeout = data.get("timeout_s")
    if "timeout_s" in data and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout)):
        raise BadInput(f"'timeout_s' must be a finite number of seconds, not {timeout!r:.40}")


_FLOAT = {float}
_INFINITIES = (math.inf, -math.inf)


def check_numbers(inputs: Any, what: str = "'inputs'") -> None:
    """BadInput unless `inputs` is a number or a nested list of numbers: a null would become
    NaN and a string "1" a 1.0 (a plausible wrong answer), so both are refused, as are
    booleans and numbers no float can hold (an integer past 2**1024, or a literal such as
    1e400, which json.loads reads as inf: JSON has no infinity, so an inf here overflowed)."""
    stack = [inputs]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            if set(map(type, item)) <= _FLOAT:  # a row of floats, checked in C (~8x faster than the loop)
                if any(inf in item for inf in _INFINITIES):
                    raise BadInput(_too_large(what))
                continue
            stack.extend(item)
            continue
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            kind = "null" if item is None else type(item).__name__
            raise BadInput(f"{what} must be a (nested) list of numbers; it holds {kind} {item!r:.40}")
        if isinstance(item, int) and item.bit_length() > 1024:  # past float64's range
            digits = int(item.bit_length() * 0.30103) + 1  # str() of a huge int may itself raise
            raise BadInput(f"{what} holds an integer of about {digits} digits, too large for any float")
        if isinstance(item, float) and item in _INFINITIES:
            raise BadInput(_too_large(what))


def _too_large(what: str) -> str:
    return f"{what} holds a number too large for any float (past 1.8e308: it would be read as infinity)"


def check_npy_header(stream: Any, available: int) -> None:
    """npy_codec.check_header (the stream put back where it was), raising BadInput."""
    try:
        npy_codec.check_header(stream, available)
    except ValueError as error:
        raise BadInput(str(error)) from None


def parse_npy(body: bytes) -> np.ndarray:
    """The array of a .npy body; BadInput for anything else: another format, a pickled or
    object array, a truncated one, or bytes after the array."""
    try:
        return npy_codec.decode_checked(body)
    except ValueError as error:
        raise BadInput(str(error)) from None


npy_bytes = npy_codec.encode  # the body of a result asked for as application/x-npy


MAX_PATH_CHARS = 1024  # longer 'path' inputs are refused before any lookup
MAX_PATH_PARTS = 32  # and deeper ones too: realpath's cost grows with the component count


def resolve_under(root: str | None, path: str) -> str:
    """The real path of `path` (relative to `root`, or absolute), if it lies inside `root`
    once every symlink and '..' is resolved; BadInput otherwise."""
    if root is None:
        raise BadInput("this server takes no 'path' inputs (it was started without an input root)")
    if "\0" in path or not path.endswith(".npy"):
        raise BadInput(f"'path' must name a .npy file, not {path!r:.200}")
    if len(path) > MAX_PATH_CHARS or path.count("/") >= MAX_PATH_PARTS:
        raise BadInput(f"'path' is too long: at most {MAX_PATH_CHARS} characters and {MAX_PATH_PARTS} components")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, path))  # an absolute path replaces the root
    if os.path.commonpath([real_root, real]) != real_root or real == real_root:
        raise BadInput(f"'path' {path!r} is outside the input root")
    return real


def load_npy_under(root: str | None, path: str, max_bytes: int) -> np.ndarray:
    """Loads the .npy file `path` names under `root`: no pickles (object arrays are refused),
    no symlink or '..' escape, at most `max_bytes` on disk."""
    real = resolve_under(root, path)
    # O_NOFOLLOW: the resolved path has no symlink left; one appearing now is refused.
    # O_NONBLOCK: opening a FIFO must not wait for a writer (fstat then refuses it).
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as error:
        raise BadInput(f"cannot open {path!r}: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{path!r} is not a regular file")
        if info.st_size > max_bytes:
            raise TooLarge(f"{path!r} has {info.st_size} bytes, over the limit of {max_bytes}")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            try:  # as a .npy body is read: no pickle, no .npz, nothing past the array
                return npy_codec.read_checked(f, info.st_size, repr(path))
            except ValueError as error:
                raise BadInput(str(error)) from None
    finally:
        os.close(fd)
