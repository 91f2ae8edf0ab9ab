"""CUDA in fastloop: whether it works here (and why not), device arrays that torch takes
without a copy, streams, pinned memory, GPU preprocessing, and the nn backend.

The CUDA code lives in a separate extension, loaded on first use, so fastloop imports and
works everywhere; these functions say what is missing where it does not.

    >>> answer = fastloop.cuda.is_available()
    >>> print(bool(answer), answer.reason)

``DeviceArray``, ``Stream`` and ``PinnedRegion`` are the extension's types, reached as
``fastloop.cuda.DeviceArray`` etc. once it is built (see docs/cuda.md).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import numpy.typing as npt

from ..errors import CudaError, CudaUnavailable
from . import _libsearch
from ._dtypes import dtype_name

if TYPE_CHECKING:
    from .._cuda import DeviceArray, PinnedRegion, Stream

__all__ = [
    "Answer",
    "Device",
    "DeviceArray",
    "Stream",
    "PinnedRegion",
    "is_built",
    "is_available",
    "require",
    "devices",
    "selftest",
    "empty",
    "to_device",
    "pin",
    "preprocess",
    "memcpy_benchmark",
    "load_cublas",
    "load_nvjpeg",
    "nvjpeg_candidates",
    "nn_backend",
]

_TYPES = ("DeviceArray", "Stream", "PinnedRegion", "JpegDecoder")
# The oldest Linux driver that runs each CUDA major version's runtime (NVIDIA's CUDA Toolkit
# release notes, minor version compatibility); the README's install table names the one the
# wheels need.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


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
        from .. import _build_info
    except ImportError:
        return None, "fastloop's build information is missing (was it built with setup.py?)"
    if not _build_info.CUDA_BUILT:
        return None, _build_info.CUDA_NOTE
    try:
        from .. import _cuda
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
    return _availability(module, {"libcublas": lambda: _load_cublas(module), "libnvjpeg": lambda: _load_nvjpeg(module)})


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{code % 1000 // 10}"


def _availability(module: Any, libraries: dict[str, Any]) -> Answer:
    """is_available's answer from the extension's driver_version(), runtime_version(),
    device_count() and device_info(), and the loaders of the libraries loaded at run time:
    the first thing missing, or the devices and what each library resolved to."""
    runtime = module.runtime_version()
    needed = f"NVIDIA driver >= {MIN_DRIVER.get(runtime // 1000, '?')} (for the CUDA {_cuda_version(runtime)} runtime linked in)"
    driver = module.driver_version()
    if driver == 0:
        return Answer(False, f"no NVIDIA driver: libcuda.so.1 could not be loaded (this fastloop needs {needed})")
    if driver < runtime // 1000 * 1000:  # minor version compatibility: the same major suffices
        return Answer(False, f"the NVIDIA driver is too old: it supports CUDA {_cuda_version(driver)}; "
                             f"this fastloop needs {needed}")
    try:
        count = module.device_count()
    except CudaError as error:  # CUDA_VISIBLE_DEVICES="" makes it cudaErrorNoDevice
        return Answer(False, f"the CUDA runtime cannot start: {error}{_visible_devices_note()}")
    if count == 0:
        note = _visible_devices_note() or " (check CUDA_VISIBLE_DEVICES)"
        return Answer(False, f"the CUDA runtime sees no device{note}")
    names = ", ".join(module.device_info(i)["name"] for i in range(count))
    found = []
    for name, load in libraries.items():
        try:
            found.append(f"{name}: {load()}")
        except CudaUnavailable as error:
            found.append(f"no {name} ({str(error).replace('CUDA is not available: ', '')})")
    return Answer(True, f"{count} CUDA device(s): {names}; driver supports CUDA {_cuda_version(driver)}; "
                        + "; ".join(found))


def _visible_devices_note() -> str:
    """Where CUDA_VISIBLE_DEVICES is set, words naming it for a reason no device is seen
    ("" or an index that does not exist hides every GPU from this process); else ""."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return ""
    if not value.strip():
        return "; CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU from this process"
    return f"; CUDA_VISIBLE_DEVICES={value!r} chooses which GPUs this process sees: check it names existing ones"


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


def __getattr__(name: str) -> Any:
    """fastloop.cuda.DeviceArray / Stream / PinnedRegion: the extension's types."""
    if name in _TYPES:
        module, note = _load()
        if module is None:
            raise AttributeError(f"fastloop.cuda.{name} needs the CUDA extension: {note}")
        return getattr(module, name)
    raise AttributeError(f"module 'fastloop.cuda' has no attribute {name!r}")


def _module() -> ModuleType:
    """The extension, or CudaUnavailable when it was not built (the functions in it raise
    CudaUnavailable themselves when there is no driver or device)."""
    module, note = _load()
    if module is None:
        raise CudaUnavailable(f"CUDA is not available: {note}")
    return module


def empty(shape: int | Sequence[int], dtype: npt.DTypeLike, device: int = 0) -> DeviceArray:
    """A DeviceArray of uninitialized memory (cudaMalloc; freed when the array goes).

    >>> x = fastloop.cuda.empty((256, 784), numpy.float32)
    >>> x.shape, x.dtype, x.device
    ((256, 784), dtype('float32'), 0)
    """
    return _module().empty(shape, dtype, device)


def to_device(array: npt.ArrayLike, device: int = 0, *, stream: Any = None,
              out: DeviceArray | None = None) -> DeviceArray:
    """Copy a host array to the device. Without ``stream`` the copy is done on return; with
    one (a Stream, an int handle, a torch.cuda.Stream) it is queued there and returns at once:
    ``ready()``/``synchronize()`` on the result, and the host array is kept alive until then.

    >>> y = fastloop.cuda.to_device(labels.astype(numpy.int64))
    >>> torch.from_dlpack(y)  # same memory, no copy
    """
    return _module().to_device(array, device, stream=stream, out=out)


def pin(array: np.ndarray, device: int | None = None) -> PinnedRegion:
    """Page-lock a C-contiguous NumPy array's buffer (cudaHostRegister) so copies from it run
    at full speed and asynchronously; ``close()`` or the end of a ``with`` block unpins it.
    Pinning memory that is already pinned succeeds (``already_pinned`` is then True).
    ``device``: made current for the call (and the thread's own device current again after);
    None: the thread's current device.

    >>> with fastloop.cuda.pin(slot) as region:
    ...     x = fastloop.cuda.preprocess(slot, mean=MEAN, std=STD, stream=s)
    """
    return _module().pin(array, device)


def _empty_cache(device: int | None = None) -> None:
    """Free the device blocks dropped DeviceArrays left for reuse (every device when None)."""
    module, _ = _load()
    if module is not None:
        module.empty_cache(device if device is not None else -1)


def preprocess(batch: np.ndarray, *, mean: float | Sequence[float], std: float | Sequence[float],
               layout: str = "HWC->CHW", crop: int | tuple[int, int] | None = None,
               offsets: npt.ArrayLike | None = None, flips: npt.ArrayLike | None = None,
               out: Any = None, stream: Any = None, device: int = 0, dtype: Any = "float32") -> Any:
    """Queue on ``stream`` the copy of a uint8 image batch (a host NumPy array, ideally pinned)
    and one kernel that crops, mirrors and normalizes it exactly as fastloop.ops.normalize
    does ((x/255 - mean)/std per channel, then rounded to ``dtype``: float32, float16 or
    bfloat16), and return the output at once: (N, C, h, w) for layout "HWC->CHW" or "CHW",
    (N, h, w, C) for "HWC" or "CHW->HWC". ``crop``: (h, w) or an int, centered (torchvision's
    rounding) unless ``offsets`` (N, 2) gives each image's (top, left); ``flips``: one bool
    per image, mirrored left-right after the crop. Arguments are checked (TypeError /
    ValueError naming them) before the GPU is touched.

    ``out``: None (a new DeviceArray; not for bfloat16), a DeviceArray, or a torch CUDA tensor
    of the output's shape whose dtype is the output's (``dtype`` is then taken from it), either
    contiguous or, for (N, C, h, w), channels_last. A DeviceArray's ``ready()`` turns True
    (``synchronize()`` waits) once the copy and the kernel are done: only then may ``batch`` be
    overwritten; with a tensor, the caller orders its use after ``stream`` (e.g.
    ``torch.cuda.current_stream().wait_stream(s)``) and keeps ``batch`` until then.

    >>> x = fastloop.cuda.preprocess(batch_u8, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], crop=224, stream=s)
    >>> loss = train(torch.from_dlpack(x))
    """

    module = _module()
    if out is not None and _is_torch_tensor(out):
        return _preprocess_into_tensor(module, batch, out, mean=mean, std=std, layout=layout, crop=crop,
                                       offsets=offsets, flips=flips, stream=stream, device=device)
    return module.preprocess(batch, mean=mean, std=std, layout=layout, crop=crop, offsets=offsets, flips=flips,
                             out=out, stream=stream, device=device, dtype=dtype_name(dtype))


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _preprocess_into_tensor(module: ModuleType, batch: np.ndarray, out: Any, *, layout: str, device: int,
                            crop: Any, **kwargs: Any) -> Any:
    """preprocess() writing into a torch CUDA tensor: its dtype and memory layout decide the
    kernel's output type and order (channels_last is the kernel's HWC order under (N, C, h, w))."""
    import torch


    if out.device.type != "cuda" or out.device.index != device:
        raise ValueError(f"'out' must be a tensor on cuda:{device}, not on {out.device}")
    name = dtype_name(out.dtype, "out")
    source, _, dest = layout.rpartition("->")
    source, dest = (source or dest), dest
    expected = _preprocess_shape(batch, source, dest, crop)
    if expected is not None and tuple(out.shape) != expected:
        raise ValueError(f"'out' must have shape {expected} for this batch, layout and crop, not {tuple(out.shape)}")
    kernel_layout = layout
    if not out.is_contiguous():
        if dest != "CHW" or not out.is_contiguous(memory_format=torch.channels_last):
            raise ValueError("'out' must be contiguous, or channels_last for an (N, C, h, w) output")
        kernel_layout = "HWC" if source == "HWC" else "CHW->HWC"  # channels_last: NHWC in memory
    module.preprocess(batch, layout=kernel_layout, device=device, dtype=name, crop=crop, _out_ptr=out.data_ptr(),
                      _out_nbytes=out.numel() * out.element_size(), **kwargs)
    return out


def _preprocess_shape(batch: Any, source: str, dest: str, crop: Any) -> tuple[int, ...] | None:
    """The output shape preprocess() gives (None when the batch is not 4-D: its own check says why)."""
    shape = getattr(batch, "shape", ())
    if len(shape) != 4:
        return None
    n, a, b, c = shape
    h, w, channels = (a, b, c) if source == "HWC" else (b, c, a)
    if crop is not None:
        h, w = (crop, crop) if isinstance(crop, int) else tuple(crop)
    return (n, channels, h, w) if dest == "CHW" else (n, h, w, channels)


def memcpy_benchmark(nbytes: int, pinned: bool = True, repeats: int = 10, device: int = 0) -> float:
    """Host-to-device cudaMemcpyAsync bandwidth in GB/s (1e9 bytes/s), from cudaMallocHost
    memory (pinned) or malloc'd memory, timed with CUDA events: the yardstick for copies.

    >>> fastloop.cuda.memcpy_benchmark(64 << 20)
    52.3
    """
    return _module().memcpy_benchmark(nbytes, pinned, repeats, device)


def _library_candidates(name: str, patterns: Sequence[str]) -> list[str]:
    """Copies of lib<name>.so.N shipped in Python packages (the nvidia-* wheels' nvidia/cu13/lib
    or nvidia/<lib>/lib, torch's or torchvision's lib folders) found on sys.path, newest major
    version first."""
    found: dict[str, str] = {}
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        for pattern in patterns:
            for path in glob.glob(os.path.join(entry, pattern)):
                found.setdefault(os.path.realpath(path), path)

    def major(path: str) -> int:
        match = re.search(rf"lib{name}[^/]*?\.so\.(\d+)", path)
        return int(match.group(1)) if match else 0

    return sorted(found.values(), key=lambda p: (-major(p), len(p)))


def _load_library(load: Any, env: str, name: str, patterns: Sequence[str] | None, install: str) -> str:
    """Calls the extension's loader on each candidate (each try also falls back to $env and
    the system's names); raises CudaUnavailable naming what was tried and how to get it.
    patterns None: every place _libsearch knows (wheels, torch, the toolkit)."""
    if os.environ.get(env):
        paths: list[str | None] = []
    elif patterns is None:
        paths = [path for path, _ in _libsearch.candidates(name)]
    else:
        paths = list(_library_candidates(name, patterns))
    error: CudaUnavailable | None = None
    for path in paths + [None]:
        try:
            return load(path)
        except CudaUnavailable as failed:
            error = failed
    raise CudaUnavailable(f"{error}; {install}, or set {env} to the path of lib{name}.so") from None


def load_cublas() -> str:
    """Loads cuBLAS (once) and returns the file loaded: $FASTLOOP_CUBLAS when set, else the
    nvidia-cublas wheel's or torch's copy found on sys.path, else libcublas.so.13/.12/.so
    from the system. Raises CudaUnavailable naming what was tried.

    >>> fastloop.cuda.load_cublas()
    '.../site-packages/nvidia/cu13/lib/libcublas.so.13'
    """
    return _load_cublas(require())


def _load_cublas(module: ModuleType) -> str:
    return _load_library(module.cublas_load, "FASTLOOP_CUBLAS", "cublas",
                         ("nvidia/*/lib/libcublas.so.*", "torch/lib/libcublas.so.*"),
                         "install the nvidia-cublas wheel (or torch with CUDA)")


def nvjpeg_candidates() -> list[tuple[str, str]]:
    """The copies of libnvjpeg load_nvjpeg() tries, in its order, each as (path, where found):
    the nvidia-* wheels (nvidia/nvjpeg/lib, nvidia/cu13/lib, ...) and torch's lib folder in
    every site-packages, then the CUDA Toolkit's lib64 ($CUDA_HOME, $CUDA_PATH, nvcc's,
    /usr/local/cuda); newest major version first. Needs no GPU and loads nothing.

    >>> fastloop.cuda.nvjpeg_candidates()[0]
    ('.../site-packages/nvidia/nvjpeg/lib/libnvjpeg.so.12', 'nvidia-* wheel in .../site-packages')
    """
    return _libsearch.candidates("nvjpeg")


def load_nvjpeg() -> str:
    """Loads nvJPEG (once) for Loader(decode="gpu") and returns the file loaded:
    $FASTLOOP_NVJPEG when set, else each of nvjpeg_candidates() (the nvidia-* wheels, torch's
    lib folder, the CUDA Toolkit's lib64), else libnvjpeg.so.13/.12/.so from the system's
    loader path. Raises CudaUnavailable naming what was tried and the fix.

    >>> fastloop.cuda.load_nvjpeg()
    '.../site-packages/nvidia/nvjpeg/lib/libnvjpeg.so.12'
    """
    return _load_nvjpeg(require())


def _load_nvjpeg(module: ModuleType) -> str:
    return _load_library(module.nvjpeg_load, "FASTLOOP_NVJPEG", "nvjpeg", None,
                         "install the nvidia-nvjpeg-cu12 wheel (nvidia-nvjpeg for CUDA 13) or the CUDA Toolkit")


def nn_backend() -> Any:
    """The CUDA nn backend for fastloop.nn: a PyCapsule named "fastloop.nn_backend" holding a
    ``const fl_nn_backend *``. Raises CudaUnavailable saying why (no GPU, no cuBLAS).

    >>> model = fastloop.nn.Sequential(fastloop.nn.Linear(784, 10), device="cuda")  # uses it
    """
    load_cublas()
    return require().nn_backend()
