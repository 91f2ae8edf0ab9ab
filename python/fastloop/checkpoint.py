"""fastloop.Checkpointer: save() copies the state (a memcpy) and returns; a C thread
writes it atomically in the background, so training resumes at once and a crash never
leaves a torn checkpoint.

File format: ``<directory>/ckpt-<12-digit step>.npz``, an uncompressed NumPy .npz (a zip of
.npy files, zip64 when large) that ``numpy.load`` reads directly; every member carries a
CRC-32 that the reader checks. A checkpoint appears under its name only once it is
complete and synced (temp file in the same directory, fsync, rename, fsync of the
directory); then all but the newest `keep` are deleted.

    ckpt = fastloop.Checkpointer("ckpts", keep=3)
    ckpt.save({"w": w, "b": b, "epoch": epoch}, step)      # returns after the copy
    state = ckpt.load()                                     # the latest, as NumPy arrays
"""

from __future__ import annotations

import os
import re
import threading
import time
import warnings
import zipfile
from typing import Any, Callable, NamedTuple, Union

import numpy as np
from numpy.lib.format import dtype_to_descr

from . import _lifecycle
from ._core import _Checkpointer
from ._state import MANIFEST, flatten, unflatten
from .errors import CheckpointError

__all__ = ["Checkpointer", "Checkpoint", "read_checkpoint"]

_NAME = re.compile(r"^ckpt-(\d+)\.npz$")


class Checkpoint(NamedTuple):
    """A published checkpoint: its step and file.

    >>> ckpt.latest()
    Checkpoint(step=1200, path='ckpts/ckpt-000000001200.npz')
    """

    step: int
    path: str


def _entries(state: Any, pinned: "_PinnedCopies") -> list[tuple[str, np.ndarray, str]]:
    """(member name, C-contiguous array, dtype literal) for each array of a nested state,
    the manifest last; TypeError names the path of what would need pickling."""
    arrays, manifest = flatten(state, cuda_copy=pinned.copy)
    pinned.synchronize()  # device->host copies done before the arrays are read
    arrays[MANIFEST] = np.frombuffer(manifest.encode(), np.uint8)
    return [(name, array, repr(dtype_to_descr(array.dtype))) for name, array in arrays.items()]


class _PinnedCopies:
    """Pinned host buffers, kept between saves, that device tensors are copied into
    asynchronously (non_blocking) and waited for once before the snapshot is read."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, Any] = {}
        self.devices: set[Any] = set()

    def copy(self, tensor: Any, path: tuple) -> Any:
        import torch

        if tensor.device.type != "cuda":
            return tensor.cpu()
        buffer = self.buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.buffers[path] = buffer
        buffer.copy_(tensor, non_blocking=True)
        self.devices.add(tensor.device)
        return buffer

    def synchronize(self) -> None:
        if self.devices:
            import torch

            for device in self.devices:
                torch.cuda.synchronize(device)
            self.devices.clear()


def read_checkpoint(path: Union[str, "os.PathLike[str]"], map_location: Any = None) -> Any:
    """The state saved in checkpoint file `path`, with its nested types (tensors as torch
    tensors when torch is importable; see Checkpointer.load). Raises CheckpointError naming
    the file when it does not read back intact.

    >>> state = fastloop.read_checkpoint("ckpts/ckpt-000000001200.npz")
    """
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"checkpoint {path} cannot be read: {error}") from error
    manifest = arrays.pop(MANIFEST, None)
    if manifest is None:  # written before nested states: a flat dict of arrays
        return arrays
    try:
        return unflatten(arrays, manifest.tobytes().decode(), map_location)
    except (KeyError, ValueError, AttributeError) as error:
        raise CheckpointError(f"checkpoint {path} has a damaged manifest: {error!r}") from error


StateOrFn = Union[Any, Callable[[], Any]]


class Checkpointer:
    """Background, atomic checkpoints of nested training state (a torch model's and
    optimizer's state_dict, NumPy arrays, numbers, strings; nothing pickled) in `directory`
    (created if missing), keeping the newest `keep`.

    save() blocks only to copy the state into a staging buffer (kept between saves, so the
    copy goes to warm memory); a second save() while the first is still being written
    waits for that write to finish (at most one in flight; nothing is coalesced or lost).
    A background write error is raised by the next save(), wait(), load() or close().
    Periodic saves: with `every_steps` and/or `every_s`, call ``maybe_save(step, state)``
    from the training loop at a point where the state is consistent (between optimizer
    steps); it saves when one period has passed since the last save. `state_fn` (a function
    returning the state) is used when maybe_save gets no state.

        with fastloop.Checkpointer("ckpts", keep=3, every_steps=1000) as ckpt:
            ckpt.maybe_save(step, lambda: {"model": model.state_dict(), "step": step})
    """

    def __init__(
        self,
        directory: Union[str, "os.PathLike[str]"],
        keep: int = 3,
        *,
        every_steps: int | None = None,
        every_s: float | None = None,
        state_fn: Callable[[], Any] | None = None,
    ) -> None:
        if every_s is not None and not every_s > 0:
            raise ValueError(f"'every_s' must be > 0, not {every_s}")
        if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                        or every_steps < 1):
            raise ValueError(f"'every_steps' must be an int >= 1, not {every_steps!r}")
        if state_fn is not None and not callable(state_fn):
            raise TypeError(f"'state_fn' must be callable, not {type(state_fn).__name__}")
        self.directory = os.fspath(directory)
        self._core = _Checkpointer(self.directory, keep)
        self._closed = False
        self._every_steps, self._every_s, self._state_fn = every_steps, every_s, state_fn
        self._last_step: int | None = None
        self._maybe_called = False
        self._last_time = time.monotonic()
        self._pinned = _PinnedCopies()
        self._snapshot = threading.Lock()  # one snapshot at a time: the pinned buffers are shared
        _lifecycle.register(self)

    def save(self, state: Any, step: int, timeout: float | None = None) -> None:
        """Snapshot `state` as checkpoint `step` and return; the file is written in the
        background. Waits (GIL released, Ctrl-C works) while the previous save is still
        being written, up to `timeout` (then TimeoutError). TypeError names the path of a
        value that cannot be stored (e.g. ``state['optim']['extra']``).

        >>> ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}, step=1200)
        """
        with self._snapshot:
            self._core.save(_entries(state, self._pinned), int(step), timeout)
            self._last_step, self._last_time = int(step), time.monotonic()

    def due(self, step: int) -> bool:
        """Whether maybe_save(step) would save now (a period has passed since the last save).

        >>> ckpt.due(step)
        False
        """
        if self._every_steps is None and self._every_s is None:
            raise ValueError("maybe_save()/due() need a period: Checkpointer(..., every_steps=, every_s=)")
        self._maybe_called = True
        if self._last_step is None:
            self._last_step = int(step)  # periods count from the first step seen
        if self._every_steps is not None and step - self._last_step >= self._every_steps:
            return True
        return self._every_s is not None and time.monotonic() - self._last_time >= self._every_s

    def maybe_save(self, step: int, state: StateOrFn = None) -> bool:
        """Save `state` (or what a callable `state` or the Checkpointer's `state_fn` returns)
        as checkpoint `step` when due (every_steps/every_s since the last save). Call it from
        the training loop between steps: the snapshot is taken here, in this thread, so it
        never races an optimizer step. While the previous checkpoint is still being written
        it skips (returns False) and saves at a later call. Returns whether it saved.

        >>> ckpt.maybe_save(step, lambda: {"model": model.state_dict(), "step": step})
        True
        """
        if not self.due(step) or not self._core.wait(0):
            return False
        if state is None:
            if self._state_fn is None:
                raise TypeError("maybe_save() got no state and the Checkpointer has no state_fn")
            state = self._state_fn()
        elif callable(state):
            state = state()
        self.save(state, step)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the last save() is on disk; False when `timeout` passed first.
        Raises CheckpointError when that write failed.

        >>> ckpt.save(state, 10); ckpt.wait()
        True
        """
        return self._core.wait(timeout)

    def checkpoints(self) -> list[Checkpoint]:
        """Published checkpoints in `directory`, oldest first.

        >>> [c.step for c in ckpt.checkpoints()]
        [800, 1000, 1200]
        """
        found = []
        for name in os.listdir(self.directory):
            match = _NAME.match(name)
            if match:
                found.append(Checkpoint(int(match.group(1)), os.path.join(self.directory, name)))
        return sorted(found)

    def latest(self) -> Checkpoint | None:
        """The newest published checkpoint, or None.

        >>> ckpt.latest().step
        1200
        """
        found = self.checkpoints()
        return found[-1] if found else None

    def load(self, step: int | None = None, map_location: Any = None) -> Any:
        """The state saved as `step` (default: the latest), waiting for a pending save first,
        with its nested types: dicts (OrderedDicts stay OrderedDicts), lists, tuples,
        numbers, strings; tensors come back as torch tensors on the device they were saved
        from, or where `map_location` says ("cpu", a torch.device, a {saved: new} dict or a
        ``fn(tensor, saved_device)``), as torch.load does. Without torch they come back as
        NumPy arrays (bfloat16 as float32, exactly). Raises CheckpointError naming the file
        when there is none or it does not read back intact.

        >>> state = ckpt.load(map_location="cpu"); model.load_state_dict(state["model"])
        """
        self.wait()
        if step is None:
            latest = self.latest()
            if latest is None:
                raise CheckpointError(f"no checkpoint in {self.directory!r}")
            path = latest.path
        else:
            path = os.path.join(self.directory, f"ckpt-{int(step):012d}.npz")
            if not os.path.exists(path):
                raise CheckpointError(f"no checkpoint for step {step} in {self.directory!r}")
        return read_checkpoint(path, map_location)

    def stats(self) -> dict[str, float]:
        """Checkpoints written, bytes, the last write's seconds and step.

        >>> ckpt.stats()["written"]
        3
        """
        return self._core.stats()

    def close(self, wait: bool = True) -> None:
        """Refuse new saves. With wait (default), finish the pending write first and raise
        a write error not yet reported; wait=False returns at once (exit still waits).

        >>> ckpt.close()
        """
        if not self._closed and not self._maybe_called and (self._every_s or self._every_steps):
            warnings.warn("Checkpointer(every_s=/every_steps=) saves only when the training loop "
                          "calls ckpt.maybe_save(step); it was never called (periodic saves no "
                          "longer run from a thread of their own)", RuntimeWarning, stacklevel=2)
        self._closed = True
        self._core.close(wait=wait)
        if not wait:
            _lifecycle.draining(self)

    def _close_at_exit(self, deadline: float) -> None:
        self._core.wait(max(0.0, deadline - time.monotonic()))
        self._core.close(wait=False)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fastloop.Checkpointer {self.directory!r}{' closed' if self._closed else ''}>"
