"""Reading a job's input for the HTTP front: a JSON body, a ``.npy`` body
(``Content-Type: application/x-npy``: no number parsing, the dtype kept exactly), or a
``.npy`` file named by a path under the configured input root. Everything here raises
BadInput (a ValueError) with the reason the client gets in its 400, or TooLarge for its 413;
nothing is read with pickle.

    >>> payload = parse_body(b'{"path": "images/cat.npy"}')
    >>> x = load_npy_under("/srv/inputs", payload["path"], max_bytes=1 << 20)
    >>> x = parse_npy(request_body)            # Content-Type: application/x-npy
"""

from __future__ import annotations

import io
import json
import os
import stat
from typing import Any

import numpy as np

__all__ = ["BadInput", "TooLarge", "NPY_TYPE", "parse_body", "parse_npy", "npy_bytes", "load_npy_under"]

NPY_TYPE = "application/x-npy"  # a body holding one array in NumPy's .npy format

_KEYS = {"inputs", "path", "id", "priority"}


class BadInput(ValueError):
    """A request the client must fix (HTTP 400); the message is the reason."""


class TooLarge(ValueError):
    """An input over the size limit (HTTP 413)."""


def parse_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a POST /v1/jobs: exactly one of "inputs" and "path", optionally "id"
    and "priority" (the service checks it)."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise BadInput(f"the body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadInput(f"the body must be a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise BadInput(f"unknown keys {unknown}: use 'inputs' (a nested list) or 'path', and optionally 'id' and 'priority'")
    if ("inputs" in data) == ("path" in data):
        raise BadInput("give exactly one of 'inputs' (a nested list of numbers) or 'path' (a .npy file)")
    if "inputs" in data and not isinstance(data["inputs"], (list, int, float)):
        raise BadInput(f"'inputs' must be a (nested) list of numbers, not {type(data['inputs']).__name__}")
    if "path" in data and not isinstance(data["path"], str):
        raise BadInput(f"'path' must be a string, not {type(data['path']).__name__}")
    if "id" in data and not isinstance(data["id"], str):
        raise BadInput(f"'id' must be a string, not {type(data['id']).__name__}")
    return data


def parse_npy(body: bytes) -> np.ndarray:
    """The array of a .npy body; BadInput for anything else: another format, a pickled or
    object array, a truncated one, or bytes after the array."""
    stream = io.BytesIO(body)
    try:
        array = np.lib.format.read_array(stream, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise BadInput(f"the body is not a .npy array of numbers: {error}") from None
    if stream.tell() != len(body):
        raise BadInput(f"the body has {len(body) - stream.tell()} bytes after its .npy array")
    return array


def npy_bytes(array: np.ndarray) -> bytes:
    """`array` in the .npy format (the body of a result asked for as application/x-npy)."""
    stream = io.BytesIO()
    np.lib.format.write_array(stream, np.asarray(array), allow_pickle=False)
    return stream.getvalue()


def resolve_under(root: str | None, path: str) -> str:
    """The real path of `path` (relative to `root`, or absolute), if it lies inside `root`
    once every symlink and '..' is resolved; BadInput otherwise."""
    if root is None:
        raise BadInput("this server takes no 'path' inputs (it was started without an input root)")
    if "\0" in path or not path.endswith(".npy"):
        raise BadInput(f"'path' must name a .npy file, not {path!r}")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, path))  # an absolute path replaces the root
    if os.path.commonpath([real_root, real]) != real_root or real == real_root:
        raise BadInput(f"'path' {path!r} is outside the input root")
    return real


def load_npy_under(root: str | None, path: str, max_bytes: int) -> np.ndarray:
    """Loads the .npy file `path` names under `root`: no pickles (object arrays are refused),
    no symlink or '..' escape, at most `max_bytes` on disk."""
    real = resolve_under(root, path)
    try:
        # O_NOFOLLOW: the resolved path has no symlink left; one appearing now is refused
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise BadInput(f"cannot open {path!r}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{path!r} is not a regular file")
        if info.st_size > max_bytes:
            raise TooLarge(f"{path!r} has {info.st_size} bytes, over the limit of {max_bytes}")
        try:
            array = np.load(f, allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:  # pickled data, object arrays, not a .npy
            raise BadInput(f"{path!r} is not a .npy file of numbers: {error}") from None
    if not isinstance(array, np.ndarray):  # np.load of an .npz returns an NpzFile
        raise BadInput(f"{path!r} is not a single .npy array")
    return array
