"""JPEG and PNG decoding in C (libjpeg-turbo, libpng), the decoders fastloop's Loader threads use.

The binary wheels carry both codecs, linked into fastloop (libjpeg-turbo 2.1.5 and libpng
1.6.39, from Debian 12's static libraries): nothing else to install. A source build links
them the same way when the build machine has their -dev packages with static libraries
(``apt-get install libjpeg62-turbo-dev libpng-dev``); with only the headers it loads the
system's at run time (``libjpeg.so.62``, ``libpng16.so.16``); without the headers it has no
decoder, and decoding raises CodecUnavailable saying so. ``FASTLOOP_LIBJPEG`` and
``FASTLOOP_LIBPNG`` name a library file to load instead of either. Images become RGB as
``PIL.Image.open(f).convert("RGB")`` makes them; EXIF orientation is ignored, as
torchvision's default loader ignores it.

    >>> rgb = fastloop.images.decode("cat.jpg")      # (h, w, 3) uint8
    >>> fastloop.images.info()["jpeg"]["decoder"]
    'libjpeg-turbo 2.1.5 (linked into fastloop)'
"""

from __future__ import annotations

import ctypes.util
import os
import re
import threading
from typing import Any, Optional, Union

import numpy as np

from .. import _core
from ..errors import CodecUnavailable, retold

__all__ = ["decode", "size", "info", "MAX_PIXELS", "set_max_pixels", "CodecUnavailable"]

MAX_PIXELS: int = _core._image_max_pixels()
"""The default cap on width * height (2**27): bigger images are refused before decoding."""

_INSTALL = ("install a fastloop wheel (it carries both codecs), or the system's "
            "libraries (apt-get install libjpeg62-turbo libpng16-16)")
_LINKED = "linked into fastloop._core"
_lock = threading.Lock()
_loaded: dict[str, tuple[str, Optional[str]]] = {}  # format -> (origin, path; None when linked)
_failures: dict[str, list[str]] = {"jpeg": [], "png": []}
_SYSTEM = {"jpeg": ("jpeg", "libjpeg.so.62"), "png": ("png16", "libpng16.so.16")}
_ENV = {"jpeg": "FASTLOOP_LIBJPEG", "png": "FASTLOOP_LIBPNG"}


def candidates(fmt: str) -> list[tuple[str, Optional[str]]]:
    """(where it came from, path or None for the linked one) of each library worth trying for
    "jpeg" or "png", best first: $FASTLOOP_LIBJPEG / $FASTLOOP_LIBPNG, the one linked into
    fastloop, the system's."""
    found: list[tuple[str, Optional[str]]] = []
    explicit = os.environ.get(_ENV[fmt])
    if explicit:
        found.append((_ENV[fmt], explicit))
    found.append((_LINKED, None))
    name, soname = _SYSTEM[fmt]
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


def _version(path: Optional[str], description: str) -> str:
    if path is None:  # linked: the version its headers gave at build time
        match = re.search(r"(\d+\.\d+\.\d+)", description)
    else:
        match = re.search(r"\.so\.([0-9.]+)$", os.path.realpath(path))
    return match.group(1) if match else "unknown"


def info() -> dict[str, Any]:
    """Which decoder is in use for "jpeg" and "png": {"decoder", "path" (fastloop's own
    extension when linked), "origin", "file_version"}, or None with "<fmt>_missing" saying what
    was tried and what to install.

    >>> fastloop.images.info()["png"]["decoder"]
    'libpng 1.6.39 (linked into fastloop)'
    """
    result: dict[str, Any] = {}
    descriptions = dict(zip(("jpeg", "png"), _core._image_codecs()))
    for fmt in ("jpeg", "png"):
        if _load(fmt):
            origin, path = _loaded[fmt]
            decoder = descriptions[fmt] or _core._image_codecs()[fmt == "png"]
            result[fmt] = {"decoder": decoder, "path": path if path is not None else _core.__file__,
                           "origin": origin, "file_version": _version(path, decoder)}
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
        raise retold(error, f"{path}: {error}") from None


def decode(data: Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]) -> np.ndarray:
    """Decodes a JPEG or PNG (bytes, or a file path) to an (h, w, 3) uint8 RGB array, with
    the GIL released. Raises DecodeError (a ValueError) naming the cause (and the path) for
    bad or truncated data, ValueError for an image over the pixel cap, CodecUnavailable
    when the decoder for its format is not installed.

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
