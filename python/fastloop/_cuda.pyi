# Stubs for fastloop._cuda (cuda/py/py_*.c); the documented API is fastloop.cuda. The types'
# docstrings are the binding's, copied here so docs/api.md is written without importing the
# extension (tests/test_docs.py checks they match where it is built).
from types import TracebackType
from typing import Any, Literal, Sequence

import numpy as np
import numpy.typing as npt

_StreamArg = Stream | int | Any | None  # Any: an object with an int `cuda_stream` (torch.cuda.Stream)

class DeviceArray:
    """DeviceArray: CUDA device memory with a shape and a NumPy dtype (C order).

    Made by fastloop.cuda.empty(), to_device() and preprocess(); exported
    without a copy through __cuda_array_interface__ and __dlpack__
    (torch.from_dlpack(array)). Not constructible directly."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, a tuple of ints."""
    @property
    def dtype(self) -> np.dtype[Any]:
        """The NumPy dtype of the elements."""
    @property
    def size(self) -> int:
        """The number of elements."""
    @property
    def ptr(self) -> int:
        """The device address of the first element, an int."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Numba's CUDA Array Interface, version 3; 'stream' is the stream of the last queued
        write (None when none is pending)."""
    device: int
    """The CUDA device index."""
    ndim: int
    """The number of dimensions."""
    nbytes: int
    """The size in bytes."""
    def to_numpy(self) -> npt.NDArray[Any]:
        """A new NumPy array holding a copy (waits for the array's pending write
        and the copy)."""
    def copy_from_numpy(self, arr: npt.ArrayLike, /) -> None:
        """Copy a host array of the same shape (and a dtype that
        casts safely) into this array; returns once the copy is done."""
    def ready(self) -> bool:
        """True once the last queued write (and the copy from host memory it reads)
        is done; never blocks. A loader slot given to preprocess() can be reused then."""
    def synchronize(self) -> None:
        """Wait (GIL released) until the last queued write is done."""
    def __dlpack__(
        self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None, copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of this array (no copy); the consumer's `stream` waits for the
        array's pending write (stream -1: no wait)."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """(2, device): kDLCUDA and the device index."""

class Stream:
    """A non-blocking CUDA stream (no implicit ordering with
    the legacy default stream). `with Stream() as s:` synchronizes at the end.
    Destroyed when the object goes; queued work still completes."""

    def __init__(self, device: int = 0) -> None: ...
    @property
    def handle(self) -> int:
        """The cudaStream_t as an int."""
    device: int
    """The CUDA device index."""
    def synchronize(self) -> None:
        """Wait (GIL released) for everything queued on the stream."""
    def query(self) -> bool:
        """True when everything queued on the stream is done; never blocks."""
    def wait(self, stream: _StreamArg, /) -> None:
        """Make work queued later here wait for what is queued now on
        `stream` (a Stream, an int handle or a torch.cuda.Stream); the host does not wait."""
    def __enter__(self) -> Stream: ...
    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None: ...

class PinnedRegion:
    """PinnedRegion: a NumPy array's buffer page-locked by fastloop.cuda.pin()."""

    nbytes: int
    """Bytes registered."""
    already_pinned: bool
    """True when the memory was registered before (close() leaves it registered)."""
    @property
    def closed(self) -> bool:
        """True once close() ran."""
    def close(self) -> None:
        """Unregister the pages (unless they were pinned before pin() was called)
        and let go of the array. Idempotent."""
    def __enter__(self) -> PinnedRegion: ...
    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None: ...

def runtime_version() -> int: ...
def driver_version() -> int: ...
def device_count() -> int: ...
def current_device() -> int: ...
def device_info(index: int, /) -> dict[str, Any]: ...
def selftest(device: int = 0, n: int = 1048576) -> dict[str, float | int]: ...
def cublas_load(path: str | None = None) -> str: ...
def nn_backend() -> Any: ...
def _device_restored() -> dict[str, list[str]]: ...
def memcpy_benchmark(nbytes: int, pinned: bool = True, repeats: int = 10, device: int = 0) -> float: ...
def empty(shape: int | Sequence[int], dtype: npt.DTypeLike, device: int = 0) -> DeviceArray: ...
def to_device(array: npt.ArrayLike, device: int = 0, *, stream: _StreamArg = None, out: DeviceArray | None = None) -> DeviceArray: ...
def pin(array: npt.NDArray[Any], /, device: int | None = None) -> PinnedRegion: ...
def empty_cache(device: int = -1) -> None: ...
def preprocess(
    batch: npt.NDArray[np.uint8], *, mean: float | Sequence[float], std: float | Sequence[float],
    layout: Literal["HWC->CHW", "CHW", "HWC", "CHW->HWC"] = "HWC->CHW", crop: int | tuple[int, int] | None = None,
    offsets: npt.ArrayLike | None = None, flips: npt.ArrayLike | None = None, out: DeviceArray | None = None,
    stream: _StreamArg = None, device: int = 0, dtype: Literal["float32", "float16", "bfloat16"] = "float32",
    _out_ptr: int = 0, _out_nbytes: int = -1,
) -> DeviceArray | None: ...

# Private: for fastloop's own C code and tests.
def _from_pointer(ptr: int, shape: int | Sequence[int], dtype: npt.DTypeLike, device: int, owner: object,
                  stream: _StreamArg = None) -> DeviceArray: ...

class _NNContext:
    def __init__(self, device: int = 0) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
