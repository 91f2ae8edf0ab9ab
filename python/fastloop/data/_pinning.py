"""Page-locking a Loader's batch slots once, for the life of the loader.

Slots are recycled, so pinning each one the first time a batch comes from it pins them all
after one round, and no batch is ever copied into pinned memory (what DataLoader's
pin_memory does per batch). The registration goes through fastloop's CUDA extension when it
is built, else through torch's binding of the same runtime call (cudaHostRegister), so a
CPU-only fastloop wheel beside a CUDA torch pins too.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np


def _is_slot_view(array: Any) -> bool:
    """A batch field that views a loader slot (not a copy made when every slot was held)."""
    from .._core import _SlotLease

    return isinstance(array, np.ndarray) and isinstance(array.base, _SlotLease)


def _fastloop_register(address: int, nbytes: int, device: int | None = None) -> Callable[[], None]:
    from .. import cuda

    memory = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    region = cuda.pin(memory, device)  # the loader's device current for the call, no other GPU's
    return region.close


_HOST_MEMORY_ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device


def _torch_cudart_get_last_error() -> Callable[[], int] | None:
    """cudaGetLastError of the CUDA runtime torch loaded (torch.cuda.cudart() does not bind it),
    found among the libraries mapped into this process; None where there is none to find."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line.rsplit("/", 1)[-1]}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            function = ctypes.CDLL(path).cudaGetLastError  # already loaded: the same runtime
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_int
        return function
    return None


def _clear_last_error() -> None:
    """Reads (and so clears) the calling thread's last error in torch's CUDA runtime."""
    get_last_error = _torch_cudart_get_last_error()
    if get_last_error is not None:
        get_last_error()


def _torch_register(address: int, nbytes: int) -> Callable[[], None]:
    import torch

    cudart = torch.cuda.cudart()
    error = int(cudart.cudaHostRegister(address, nbytes, _PORTABLE))
    if error == _HOST_MEMORY_ALREADY_REGISTERED:
        _clear_last_error()  # else torch's next launch check reports error 712 as its own
        return lambda: None  # someone else's registration: theirs to undo
    if error != 0:
        from ..errors import CudaError

        raise CudaError(f"cudaHostRegister({nbytes} bytes) failed with cudaError {error} (through torch's "
                        f"CUDA runtime)", cuda_code=error)

    def unregister() -> None:
        cudart.cudaHostUnregister(address)

    return unregister


def registrar(device: int | None = None) -> Callable[[int, int], Callable[[], None]]:
    """The pinning call to use here: fastloop's CUDA extension where it runs (with `device`
    current for the call), else torch's."""
    from .. import cuda

    if cuda.is_available():
        return lambda address, nbytes: _fastloop_register(address, nbytes, device)
    return _torch_register


class SlotPinner:
    """Pins the slot memory under each batch field once: a slot's first batch registers the
    rows it holds, and a later, fuller batch from the same slot (the first was an epoch's short
    last one) widens the registration once. Never past what a batch views: a slot is sized for
    the largest batch its epoch makes, which may be less than batch_size."""

    def __init__(self, batch_size: int, register: Callable[[int, int], Callable[[], None]] | None = None,
                 device: int | None = None) -> None:
        self.batch_size = batch_size
        self.register = register or registrar(device)
        self._pinned: dict[int, tuple[int, Callable[[], None]]] = {}  # field address -> (bytes, unregistration)

    def pin(self, array: Any) -> bool:
        """Pins the slot memory under `array` unless done already; False when it is no slot
        view (a copy: left pageable, as it would be unregistered while in use)."""
        if not _is_slot_view(array) or array.nbytes == 0:
            return False
        address = array.__array_interface__["data"][0]
        pinned = self._pinned.get(address)
        if pinned is None or pinned[0] < array.nbytes:
            if pinned is not None:
                pinned[1]()  # a fuller batch from this slot: register its whole extent instead
            self._pinned[address] = (array.nbytes, self.register(address, array.nbytes))
        return True

    @property
    def pinned(self) -> int:
        """How many slot fields are pinned."""
        return len(self._pinned)

    def close(self) -> None:
        """Unpins everything (after the copies from it are done: the caller waits first)."""
        pinned, self._pinned = self._pinned, {}
        for _, undo in pinned.values():
            undo()
