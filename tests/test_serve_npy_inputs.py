"""The serving side reads .npy data from outside in one place (serve/npy_codec.read_checked):
a request body and a file a client names are refused for the same faults, each naming what
it read."""

from __future__ import annotations

import io

import numpy as np
import pytest

from fastloop.serve import http_inputs, npy_codec


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, a=np.ones(3))
    return buffer.getvalue()


GOOD = np.arange(12, dtype=np.float32).reshape(3, 4)
FAULTS = [
    (npy(GOOD) + b"xx", "has 2 bytes after its .npy array"),
    (npy(GOOD)[:-5], "not a .npy array"),  # truncated: its header claims more than follows
    (npy(np.array([{"a": 1}], dtype=object)), "Python objects"),
    (npz(), "not a .npy array of numbers"),
    (b"not an array", "not a .npy array of numbers"),
]


def test_a_body_and_a_file_are_read_alike(tmp_path):
    (tmp_path / "ok.npy").write_bytes(npy(GOOD))
    np.testing.assert_array_equal(http_inputs.load_npy_under(str(tmp_path), "ok.npy", 1 << 20), GOOD)
    np.testing.assert_array_equal(http_inputs.parse_npy(npy(GOOD)), GOOD)
    for i, (data, reason) in enumerate(FAULTS):
        (tmp_path / f"bad{i}.npy").write_bytes(data)
        with pytest.raises(http_inputs.BadInput, match=f"^the body .*{reason}"):
            http_inputs.parse_npy(data)
        with pytest.raises(http_inputs.BadInput, match=f"^'bad{i}.npy' .*{reason}"):
            http_inputs.load_npy_under(str(tmp_path), f"bad{i}.npy", 1 << 20)
        with pytest.raises(ValueError, match=reason):
            npy_codec.read_checked(_at(data), len(data), "x")  # from where the stream stands


def _at(data: bytes) -> io.BytesIO:
    """A stream positioned after some bytes that are not part of the array."""
    stream = io.BytesIO(b"prefix" + data)
    stream.seek(6)
    return stream
