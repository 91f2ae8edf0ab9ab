"""Finding a BLAS for fastloop.nn's CPU matrix products, without adding a dependency.

The C core dlopens a CBLAS at run time (csrc/nn/fl_blas.c). This module picks the library:
an explicit ``FASTLOOP_BLAS``, the ``scipy-openblas32`` wheel when installed (the build of
OpenBLAS made for other packages to use), the OpenBLAS that NumPy's own wheel bundles, or
a system CBLAS. The first that loads wins; every failure is kept for the error message.
``blas_info()`` and ``set_blas_threads()`` (public as fastloop.nn's) live here with it.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import threading

from .. import _core

_lock = threading.Lock()
_failures: list[str] = []
_loaded_from: list[str] = []  # [origin, path] once loaded


def candidates() -> list[tuple[str, str]]:
    """(where it came from, path) for each BLAS worth trying, best first."""
    found: list[tuple[str, str]] = []
    explicit = os.environ.get("FASTLOOP_BLAS")
    if explicit:
        found.append(("FASTLOOP_BLAS", explicit))
    try:
        import scipy_openblas32  # type: ignore[import-not-found]

        lib_dir = scipy_openblas32.get_lib_dir()
        found += [("scipy-openblas32", p) for p in sorted(glob.glob(os.path.join(lib_dir, "*.so*")))]
    except (ImportError, AttributeError):
        pass
    import numpy

    numpy_libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    found += [("NumPy's bundled OpenBLAS", p) for p in sorted(glob.glob(os.path.join(numpy_libs, "*openblas*.so*")))]
    for name in ("openblas", "cblas", "blas", "mkl_rt", "blis"):
        path = ctypes.util.find_library(name)
        if path:
            found.append((f"system lib{name}", path))
    return found


def ensure_loaded() -> str:
    """Loads a BLAS once; returns its description or raises RuntimeError listing what failed."""
    with _lock:
        info = _core._blas_info()
        if info is not None:
            return info + (f" from {_loaded_from[0]}" if _loaded_from else "")
        _failures.clear()
        for origin, path in candidates():
            try:
                description = _core._blas_load(path)
                _loaded_from[:] = [origin, path]
                return f"{description} from {origin}"
            except OSError as error:
                _failures.append(f"{origin}: {error}")
        tried = "; ".join(_failures) or "no candidate found"
        raise RuntimeError(
            "fastloop.nn needs a CBLAS for CPU models and found none usable "
            f"({tried}). Install scipy-openblas32 or a system OpenBLAS, or set FASTLOOP_BLAS "
            "to a CBLAS shared library."
        )


def path() -> str:
    """The file of the BLAS in use (loading one first); `make ctest` hands it to the C tests."""
    ensure_loaded()
    return _loaded_from[1] if _loaded_from else ""


def blas_info() -> str:
    """Which BLAS the CPU backend uses (loading one if none is yet).

    >>> fl.nn.blas_info()
    'libscipy_openblas64_-....so (scipy_cblas_sgemm64_, 64-bit integers) from ...'
    """
    return ensure_loaded()


def set_blas_threads(num_threads: int) -> None:
    """Sets the CPU BLAS's thread count, for the whole process (NumPy's matmul shares it when
    it is the same library). A server running several models at once, each on its own
    thread, wants 1: BLAS threads that spin beside busy workers slow every call.

    >>> fl.nn.set_blas_threads(1)
    """
    ensure_loaded()
    _core._blas_set_threads(int(num_threads))
