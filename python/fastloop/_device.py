"""Parsing a `device=` argument ("cpu", "cuda", "cuda:N" or a CUDA index), in one place for
fastloop.nn and fastloop.Loader."""

from __future__ import annotations

import sys
from typing import Any


def parse_device(device: str | int | None, arg: str = "device") -> tuple[str, int]:
    """("cpu", 0) for None or "cpu"; ("cuda", N) for "cuda:N" or N >= 0, and for "cuda" the
    current device (current_cuda_device()) when it is parsed. Anything else raises ValueError
    naming `arg`."""
    if device is None or device == "cpu":
        return "cpu", 0
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return "cuda", device
    text = str(device)
    if text == "cuda":
        return "cuda", current_cuda_device()
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise ValueError(f"'{arg}' must be 'cpu', 'cuda', 'cuda:N' or a CUDA device index, not {device!r}")


def current_cuda_device() -> int:
    """The device "cuda" means, as torch's "cuda" does: torch's current device when the
    program imported torch and torch started CUDA (torch.cuda.set_device(local_rank) under
    torchrun does), else the CUDA runtime's current device of this thread (cudaGetDevice,
    from fastloop's CUDA extension), else 0 (no extension, or a runtime that cannot answer:
    then nothing can run on a device anyway, and the caller says why). torch is never
    imported here, and its CUDA is never started: a Loader forks its workers later."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None:
        try:
            started = getattr(cuda, "is_initialized", lambda: True)()
            if started:
                return int(cuda.current_device())
        except Exception:  # torch without CUDA, or a broken install: ask the runtime instead
            pass
    module = _cuda_extension()
    if module is None or not hasattr(module, "current_device"):
        return 0
    try:
        return int(module.current_device())
    except Exception:  # no driver or no device: CudaError; device 0 is then as good as any
        return 0


def _cuda_extension() -> Any:
    """fastloop._cuda, or None where it was not built or does not load (fastloop.cuda, a
    layer above this module, says why: tests/test_layers.py)."""
    try:
        from . import _build_info

        if not _build_info.CUDA_BUILT:
            return None
        from . import _cuda
    except ImportError:
        return None
    return _cuda
