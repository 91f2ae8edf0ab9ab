"""CUDA in fastloop: whether it was built, whether it works on this machine, and why not.

The CUDA code lives in a separate extension, loaded on first use, so fastloop imports and
works everywhere; these functions say what is missing where it does not.

    >>> answer = fastloop.cuda.is_available()
    >>> print(bool(answer), answer.reason)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

from .errors import CudaError, CudaUnavailable

__all__ = ["Answer", "Device", "is_built", "is_available", "require", "devices", "selftest"]


@dataclass(frozen=True)
class Answer:
    """A yes/no answer with its reason: true when yes, and ``reason`` says why either way.

    >>> if not fastloop.cuda.is_available():
    ...     print(fastloop.cuda.is_available().reason)
    """

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Device:
    """One CUDA device, as the runtime describes it.

    >>> [d.name for d in fastloop.cuda.devices()]
    """

    index: int
    name: str
    total_memory: int
    compute_capability: tuple[int, int]
    multiprocessors: int
    pci_bus_id: int


@functools.lru_cache(maxsize=None)
def _load() -> tuple[ModuleType | None, str]:
    """Imports fastloop._cuda once; returns (module or None, how it was built or why not)."""
    try:
        from . import _build_info
    except ImportError:
        return None, "fastloop's build information is missing (was it built with setup.py?)"
    if not _build_info.CUDA_BUILT:
        return None, _build_info.CUDA_NOTE
    try:
        from . import _cuda
    except ImportError as error:
        return None, f"the CUDA extension was built but failed to load: {error}"
    return _cuda, _build_info.CUDA_NOTE


def is_built() -> Answer:
    """Whether fastloop was built with its CUDA extension (nvcc found at build time).

    >>> fastloop.cuda.is_built().reason
    'built with nvcc 13.0 (nvcc from PATH) for sm_{75,80,86,89,90}'
    """
    module, note = _load()
    return Answer(module is not None, note)


def is_available() -> Answer:
    """Whether CUDA can run here now: built, a driver loaded, and at least one device.

    >>> fastloop.cuda.is_available()
    Answer(ok=False, reason='no NVIDIA driver: libcuda.so.1 could not be loaded')
    """
    module, note = _load()
    if module is None:
        return Answer(False, note)
    if module.driver_version() == 0:
        return Answer(False, "no NVIDIA driver: libcuda.so.1 could not be loaded")
    try:
        count = module.device_count()
    except CudaError as error:
        return Answer(False, f"the CUDA runtime cannot start: {error}")
    if count == 0:
        return Answer(False, "the CUDA runtime sees no device (check CUDA_VISIBLE_DEVICES)")
    names = ", ".join(d.name for d in devices())
    return Answer(True, f"{count} CUDA device(s): {names}; driver {module.driver_version()}")


def require() -> ModuleType:
    """Returns the CUDA extension, or raises CudaUnavailable saying why it cannot be used.

    >>> cuda = fastloop.cuda.require()   # before doing anything with device="cuda"
    """
    answer = is_available()
    if not answer:
        raise CudaUnavailable(f"CUDA is not available: {answer.reason}")
    module, _ = _load()
    assert module is not None
    return module


def devices() -> list[Device]:
    """The CUDA devices visible to this process (raises CudaUnavailable when none can be).

    >>> fastloop.cuda.devices()[0].compute_capability
    (9, 0)
    """
    module, note = _load()
    if module is None:
        raise CudaUnavailable(f"CUDA is not available: {note}")
    return [Device(**module.device_info(i)) for i in range(module.device_count())]


def selftest(device: int = 0, n: int = 1 << 20) -> dict[str, float | int]:
    """Runs a vector-add kernel on `device` and checks every result.

    >>> fastloop.cuda.selftest()["errors"]
    0
    """
    return require().selftest(device=device, n=n)
