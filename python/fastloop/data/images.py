"""JPEG and PNG decoding in C (libjpeg-turbo, libpng), the decoders fastloop's Loader threads use.

The C core loads the codec libraries at run time, as it loads the BLAS: first the ones
Pillow's wheel bundles (``pip install pillow``, or ``fastloop[images]``), then the system's
(``apt-get install libjpeg62-turbo libpng16-16``), or the files named by ``FASTLOOP_LIBJPEG``
and ``FASTLOOP_LIBPNG``. Images become RGB as ``PIL.Image.open(f).convert("RGB")`` makes
them; EXIF orientation is ignored, as torchvision's default loader ignores it.

    >>> rgb = fastloop.images.decode("cat.jpg")      # (h, w, 3) uint8
    >>> fastloop.images.info()["jpeg"]["decoder"]
    'libjpeg-turbo (libjpeg.so.62 ABI) libjpeg-6dc8d115.so.62.4.0'
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import os
import re
import threading
from typing import Any, Union

import numpy as np

from .. import _core
from ..errors import CodecUnavailable

__all__ = ["decode", "size", "info", "MAX_PIXELS", "set_max_pixels", "CodecUnavailable"]

MAX_PIXELS: int = _core._image_max_pixels()
"""The default cap on width * height (2**27): bigger images are refused before decoding."""

_INSTALL = ("pip install pillow (its wheel bundles libjpeg-turbo and libpng), or "
            "apt-get install libjpeg62-turbo libpng16-16")
_lock = threading.Lock()
_loaded: dict[str, tuple[str, str]] = {}  # format -> (origin, path)
_failures: dict[str, list[str]] = {"jpeg": [], "png": []}
_PATTERNS = {"jpeg": ("libjpeg-*.so*", "jpeg", "libjpeg.so.62"), "png": ("libpng16-*.so*", "png16", "libpng16.so.16")}
_ENV = {"jpeg": "FASTLOOP_LIBJPEG", "png": "FASTLOOP_LIBPNG"}


def _pillow_libs() -> str | None:
    spec = importlib.util.find_spec("PIL")
    if spec is None or not spec.origin:
        return None
    return os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "pillow.libs")


def candidates(fmt: str) -> list[tuple[str, str]]:
    """(where it came from, path) of each library worth trying for "jpeg" or "png", best first."""
    found: list[tuple[str, str]] = []
    explicit = os.environ.get(_ENV[fmt])
    if explicit:
        found.append((_ENV[fmt], explicit))
    pattern, name, soname = _PATTERNS[fmt]
    libs = _pillow_libs()
    if libs:
        found += [("Pillow's bundled library", p) for p in sorted(glob.glob(os.path.join(libs, pattern)))]
    system = ctypes.util.find_library(name)
    found += [("the system library", p) for p in dict.fromkeys(x for x in (system, soname) if x)]
    return found


def _load(fmt: str) -> bool:
    """Loads the codec for fmt once (the first candidate that loads); False if none does."""
    with _lock:
        if fmt in _loaded:
            return True
        load = _core._image_load_jpeg if fmt == "jpeg" else _core._image_load_png
        _failures[fmt].clear()
        for origin, path in candidates(fmt):
            try:
                load(path)
                _loaded[fmt] = (origin, path)
                return True
            except OSError as error:
                _failures[fmt].append(f"{origin}: {error}")
        return False


def ensure_loaded() -> None:
    """Loads both codecs; raises CodecUnavailable when neither loads (one alone is enough:
    images of the other format then fail with CodecUnavailable when decoded)."""
    jpeg, png = _load("jpeg"), _load("png")
    if not (jpeg or png):
        tried = "; ".join(_failures["jpeg"] + _failures["png"]) or "no library found"
        raise CodecUnavailable(f"no JPEG or PNG decoder is installed ({tried}): {_INSTALL}")


def _version(path: str) -> str:
    match = re.search(r"\.so\.([0-9.]+)$", os.path.realpath(path))
    return match.group(1) if match else "unknown"


def info() -> dict[str, Any]:
    """Which decoder is in use for "jpeg" and "png": {"decoder", "path", "origin",
    "file_version"}, or None with "missing" saying what was tried and what to install.

    >>> fastloop.images.info()["png"]["decoder"]
    'libpng 1.6.58 libpng16-1d1ba958.so.16.58.0'
    """
    result: dict[str, Any] = {}
    descriptions = dict(zip(("jpeg", "png"), _core._image_codecs()))
    for fmt in ("jpeg", "png"):
        if _load(fmt):
            origin, path = _loaded[fmt]
            result[fmt] = {"decoder": descriptions[fmt] or _core._image_codecs()[fmt == "png"],
                           "path": path, "origin": origin, "file_version": _version(path)}
        else:
            result[fmt] = None
            result[f"{fmt}_missing"] = f"tried: {'; '.join(_failures[fmt]) or 'nothing found'}; {_INSTALL}"
    return result


def set_max_pixels(n: int) -> None:
    """Sets the cap on width * height for every decode (Loader threads included).

    >>> fastloop.images.set_max_pixels(16384 * 16384)
    """
    if n < 1:
        raise ValueError(f"'n' must be >= 1, not {n}")
    _core._image_set_max_pixels(int(n))


def _read(data: Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]) -> tuple[Any, str | None]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data, None
    path = os.fspath(data)
    with open(path, "rb") as f:
        return f.read(), str(path)


def _call(fn: Any, data: Any, *args: Any) -> Any:
    ensure_loaded()
    encoded, path = _read(data)
    try:
        return fn(encoded, *args)
    except (ValueError, CodecUnavailable) as error:
        if path is None:
            raise
        raise type(error)(f"{path}: {error}") from None


def decode(data: Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]) -> np.ndarray:
    """Decodes a JPEG or PNG (bytes, or a file path) to an (h, w, 3) uint8 RGB array, with
    the GIL released. Raises ValueError naming the cause (and the path) for bad, truncated
    or oversized data, CodecUnavailable when the decoder for its format is not installed.

    >>> fastloop.images.decode(open("cat.jpg", "rb").read()).shape
    (375, 500, 3)
    """
    return _call(_core._image_decode, data)


def size(data: Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]) -> tuple[int, int]:
    """(height, width) of a JPEG or PNG from its header, without decoding it.

    >>> fastloop.images.size("cat.jpg")
    (375, 500)
    """
    width, height, _ = _call(_core._image_probe, data)
    return height, width
