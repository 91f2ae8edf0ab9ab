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


def _fastloop_register(address: int, nbytes: int) -> Callable[[], None]:
    from .. import cuda

    memory = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    region = cuda.pin(memory)
    return region.close


_HOST_MEMORY_ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device


def _torch_register(address: int, nbytes: int) -> Callable[[], None]:
    import torch

    cudart = torch.cuda.cudart()
    error = int(cudart.cudaHostRegister(address, nbytes, _PORTABLE))
    if error == _HOST_MEMORY_ALREADY_REGISTERED:
        return lambda: None  # someone else's registration: theirs to undo
    if error != 0:
        from ..errors import CudaError

        raise CudaError(f"cudaHostRegister({nbytes} bytes) failed with cudaError {error} (through torch's "
                        f"CUDA runtime)", cuda_code=error)

    def unregister() -> None:
        cudart.cudaHostUnregister(address)

    return unregister


def registrar() -> Callable[[int, int], Callable[[], None]]:
    """The pinning call to use here: fastloop's CUDA extension where it runs, else torch's."""
    from .. import cuda

    return _fastloop_register if cuda.is_available() else _torch_register


class SlotPinner:
    """Pins the slot memory under each batch field once: a slot's first batch registers the
    rows it holds, and a later, fuller batch from the same slot (the first was an epoch's short
    last one) widens the registration once. Never past what a batch views: a slot is sized for
    the largest batch its epoch makes, which may be less than batch_size."""

    def __init__(self, batch_size: int, register: Callable[[int, int], Callable[[], None]] | None = None) -> None:
        self.batch_size = batch_size
        self.register = register or registrar()
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
