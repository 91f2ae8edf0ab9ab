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
    from ._core import _SlotLease

    return isinstance(array, np.ndarray) and isinstance(array.base, _SlotLease)


def _fastloop_register(address: int, nbytes: int) -> Callable[[], None]:
    from . import cuda

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
        from .errors import CudaError

        raise CudaError(f"cudaHostRegister({nbytes} bytes) failed with cudaError {error} (through torch's "
                        f"CUDA runtime)", error)

    def unregister() -> None:
        cudart.cudaHostUnregister(address)

    return unregister


def registrar() -> Callable[[int, int], Callable[[], None]]:
    """The pinning call to use here: fastloop's CUDA extension where it runs, else torch's."""
    from . import cuda

    return _fastloop_register if cuda.is_available() else _torch_register


class SlotPinner:
    """Pins each slot's field extent (the whole batch_size rows, even for a short batch, so
    the first registration of a slot covers what later batches from it use) once."""

    def __init__(self, batch_size: int, register: Callable[[int, int], Callable[[], None]] | None = None) -> None:
        self.batch_size = batch_size
        self.register = register or registrar()
        self._unpin: dict[int, Callable[[], None]] = {}  # field address -> its unregistration

    def pin(self, array: Any) -> bool:
        """Pins the slot memory under `array` unless done already; False when it is no slot
        view (a copy: left pageable, as it would be unregistered while in use)."""
        if not _is_slot_view(array) or array.nbytes == 0:
            return False
        address = array.__array_interface__["data"][0]
        if address not in self._unpin:
            row_bytes = array.nbytes // len(array)
            self._unpin[address] = self.register(address, row_bytes * self.batch_size)
        return True

    @property
    def pinned(self) -> int:
        """How many slot fields are pinned."""
        return len(self._unpin)

    def close(self) -> None:
        """Unpins everything (after the copies from it are done: the caller waits first)."""
        unpin, self._unpin = self._unpin, {}
        for undo in unpin.values():
            undo()
