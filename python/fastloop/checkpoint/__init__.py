"""fastloop.Checkpointer: save() copies the state (a memcpy) and returns; a C thread
writes it atomically in the background, so training resumes at once and a crash never
leaves a torn checkpoint.

File format: ``<directory>/ckpt-<12-digit step>.safetensors``: tensors by dotted name
(``model.fc.weight``, bf16 as BF16), the nested structure (optimizer param groups, numbers,
strings) as JSON in the header's ``__metadata__["fastloop.state"]``, the data's CRC-32 in
``__metadata__["fastloop.crc32"]``; no pickle. ``safetensors.torch.load_file`` and
``safetensors.numpy.load_file`` read it without fastloop. A checkpoint appears under its
name only once it is complete and synced (temp file in the same directory, fsync, rename,
fsync of the directory); then all but the newest `keep` are deleted. ``.npz`` checkpoints
of earlier versions are still read.

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

from .. import _lifecycle
from . import _safetensors
from .._core import _Checkpointer
from ._state import MANIFEST, flatten, unflatten
from ..errors import CheckpointError

__all__ = ["Checkpointer", "Checkpoint", "read_checkpoint"]

_NAME = re.compile(r"^ckpt-(\d+)\.(safetensors|npz)$")
STATE_KEY = "fastloop.state"  # the __metadata__ entry holding the manifest (JSON)
_MAX_AUTO_WORKERS = 8  # num_workers=None's cap: a few cores reach a machine's memory bandwidth


class Checkpoint(NamedTuple):
    """A published checkpoint: its step and file.

    >>> ckpt.latest()
    Checkpoint(step=1200, path='ckpts/ckpt-000000001200.safetensors')
    """

    step: int
    path: str


def _snapshot(state: Any, pinned: "_PinnedCopies") -> tuple[list[tuple[str, np.ndarray, str]], list[tuple[str, str]]]:
    """(name, C-contiguous array, safetensors dtype) for each tensor of a nested state, widest
    items first (so each starts aligned to its item size), and the metadata pairs; TypeError
    names the path of what would need pickling."""
    flat = flatten(state, cuda_copy=pinned.copy)
    pinned.synchronize()  # device->host copies done before the arrays are read
    entries = sorted(((name, array, code) for name, (array, code) in flat.arrays.items()),
                     key=lambda entry: -entry[1].dtype.itemsize)
    return entries, [("format", "pt" if flat.has_tensors else "np"), (STATE_KEY, flat.manifest)]


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


def _read_npz(path: str) -> tuple[dict[str, np.ndarray], str | None]:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    manifest = arrays.pop(MANIFEST, None)
    return arrays, None if manifest is None else manifest.tobytes().decode()


def _read_safetensors(path: str) -> tuple[dict[str, np.ndarray], str]:
    contents = _safetensors.read(path)
    manifest = contents.metadata.get(STATE_KEY)
    return contents.arrays, _safetensors.flat_manifest(contents) if manifest is None else manifest


def _whole(path: str) -> str | None:
    """Why the checkpoint file at `path` is not whole (the header or the size is wrong),
    or None; the data itself is checked when it is read."""
    try:
        if _is_zip(path):
            with zipfile.ZipFile(path):
                return None  # its central directory, at the end, is there
        _safetensors.check(path)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        return str(error)
    return None


def _is_zip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def read_checkpoint(path: Union[str, "os.PathLike[str]"], map_location: Any = None) -> Any:
    """The state saved in checkpoint file `path` (a .safetensors file, or an .npz of an
    earlier version), with its nested types (tensors as torch tensors when torch is
    importable; see Checkpointer.load). A safetensors file fastloop did not write loads as a
    dict of its tensors. Raises CheckpointError naming the file when it does not read back
    intact (truncated, empty, damaged, not a checkpoint).

    >>> state = fastloop.read_checkpoint("ckpts/ckpt-000000001200.safetensors")
    """
    path = os.fspath(path)
    try:
        arrays, manifest = (_read_npz if _is_zip(path) else _read_safetensors)(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"checkpoint {path} cannot be read: {error}") from error
    if manifest is None:  # an .npz written before nested states: a flat dict of arrays
        return arrays
    try:
        return unflatten(arrays, manifest, map_location)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, OverflowError, RecursionError) as error:
        raise CheckpointError(f"checkpoint {path} has a damaged manifest: {error!r}") from error


StateOrFn = Union[Any, Callable[[], Any]]


class Checkpointer:
    """Background, atomic checkpoints of nested training state (a torch model's and
    optimizer's state_dict, NumPy arrays, numbers, strings; nothing pickled) in `directory`
    (created if missing), keeping the newest `keep`, as safetensors files.

    save() blocks only to copy the state into a staging area (kept between saves, so the
    copy goes to warm memory) on `num_workers` threads (None, the default: min(8, CPUs), as
    a few cores already reach a machine's memory bandwidth). Every save is written, in
    order: up to `max_pending` snapshots may wait for the writer (each costs a staging area
    the size of the state); a save() when that many wait blocks until the oldest is written
    (back-pressure: nothing is skipped or coalesced). A background write error is raised by
    the next save(), wait(), latest(), load() or close().
    Periodic saves: with `every_steps` and/or `every_s`, call ``maybe_save(state, step)``
    (or ``maybe_save(step=step)`` with a `state_fn`) from the training loop at a point where
    the state is consistent (between optimizer steps); it saves at every step that is a
    multiple of `every_steps` (10, 20, ... for 10), and when `every_s` seconds have passed
    since the last save. `state_fn` (a function returning the state) is used when
    maybe_save gets no state.

        with fastloop.Checkpointer("ckpts", keep=3, every_steps=1000) as ckpt:
            ckpt.maybe_save(lambda: {"model": model.state_dict(), "step": step}, step)
    """

    def __init__(
        self,
        directory: Union[str, "os.PathLike[str]"],
        keep: int = 3,
        *,
        every_steps: int | None = None,
        every_s: float | None = None,
        state_fn: Callable[[], Any] | None = None,
        max_pending: int = 1,
        num_workers: int | None = None,
    ) -> None:
        if every_s is not None and not every_s > 0:
            raise ValueError(f"'every_s' must be > 0, not {every_s}")
        if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                        or every_steps < 1):
            raise ValueError(f"'every_steps' must be an int >= 1, not {every_steps!r}")
        if state_fn is not None and not callable(state_fn):
            raise TypeError(f"'state_fn' must be callable, not {type(state_fn).__name__}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int):
            raise TypeError(f"'max_pending' must be an int, not {type(max_pending).__name__}")
        if num_workers is None:
            num_workers = min(_MAX_AUTO_WORKERS, os.cpu_count() or 1)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"'num_workers' must be an int >= 1 or None (auto), not {num_workers!r}")
        self._num_workers = num_workers
        self.directory = os.fspath(directory)
        self._core = _Checkpointer(self.directory, keep, max_pending)
        self._closed = False
        self._every_steps, self._every_s, self._state_fn = every_steps, every_s, state_fn
        self._last_step: int | None = None
        self._maybe_called = False
        self._only_read = None  # True once load() ran before any save: a reader, which the close() warning spares
        self._last_time = time.monotonic()
        self._pinned = _PinnedCopies()
        self._snapshot = threading.Lock()  # one snapshot at a time: the pinned buffers are shared
        _lifecycle.register(self)

    def save(self, state: Any, step: int, timeout: float | None = None) -> None:
        """Snapshot `state` as checkpoint `step` and return; the file is written in the
        background. Waits (GIL released, Ctrl-C works) while `max_pending` earlier saves are
        still to be written, up to `timeout` (then TimeoutError). TypeError names the path of
        a value that cannot be stored (e.g. ``state['optim']['extra']``).

        >>> ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}, step=1200)
        """
        self._only_read = False
        with self._snapshot:
            entries, metadata = _snapshot(state, self._pinned)
            self._core.save(entries, metadata, int(step), timeout, self._num_workers)
            self._last_step, self._last_time = int(step), time.monotonic()

    def due(self, step: int) -> bool:
        """Whether maybe_save(step) saves: `step` is a multiple of every_steps (0 excluded)
        not saved yet, or every_s seconds have passed since the last save (or the first call).

        >>> ckpt.due(step)
        False
        """
        if self._every_steps is None and self._every_s is None:
            raise ValueError("maybe_save()/due() need a period: Checkpointer(..., every_steps=, every_s=)")
        self._maybe_called = True
        step = int(step)
        if self._every_steps is not None and step > 0 and step % self._every_steps == 0 and step != self._last_step:
            return True
        return self._every_s is not None and time.monotonic() - self._last_time >= self._every_s

    def maybe_save(self, state: StateOrFn = None, step: int | None = None) -> bool:
        """Save `state` (or what a callable `state` or the Checkpointer's `state_fn` returns)
        as checkpoint `step` when due (see due()); `step` is required. Call it from the
        training loop between steps: the snapshot is taken here, in this thread, so it never
        races an optimizer step. A due save is never skipped: while `max_pending` saves still
        wait for the writer, it waits as save() does. Returns whether it saved.

        >>> ckpt.maybe_save(lambda: {"model": model.state_dict(), "step": step}, step)
        True
        >>> ckpt.maybe_save(step=step)   # with Checkpointer(state_fn=...)
        True
        """
        if step is None:
            raise TypeError("maybe_save() missing required argument 'step' (the training step: "
                            "ckpt.maybe_save(state, step) or ckpt.maybe_save(step=step))")
        if not self.due(step):
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
        """Wait until every save() is on disk; False when `timeout` passed first.
        Raises CheckpointError when a write failed.

        >>> ckpt.save(state, 10); ckpt.wait()
        True
        """
        return self._core.wait(timeout)

    def checkpoints(self) -> list[Checkpoint]:
        """Checkpoint files in `directory`, oldest first (one per step: a .safetensors file
        over an .npz of an earlier version), after waiting for pending saves, so the last
        save() is among them. Lists names only: see latest() and load() for which read back.

        >>> [c.step for c in ckpt.checkpoints()]
        [800, 1000, 1200]
        """
        self.wait()
        found: dict[int, str] = {}
        for name in os.listdir(self.directory):
            match = _NAME.match(name)
            if match and (int(match.group(1)) not in found or match.group(2) == "safetensors"):
                found[int(match.group(1))] = os.path.join(self.directory, name)
        return [Checkpoint(step, path) for step, path in sorted(found.items())]

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint whose file is whole (its header and size check; load()
        also checks the data), or None. Waits for pending saves first, so it sees the last
        save(); a file it passes over is named in a RuntimeWarning with the reason.

        >>> ckpt.latest().step
        1200
        """
        for checkpoint in reversed(self.checkpoints()):
            problem = _whole(checkpoint.path)
            if problem is None:
                return checkpoint
            warnings.warn(f"checkpoint {checkpoint.path} skipped: {problem}", RuntimeWarning, stacklevel=2)
        return None

    def load(self, step: int | None = None, map_location: Any = None) -> Any:
        """The state saved as `step` (default: the newest that reads back intact), waiting
        for pending saves first, with its nested types: dicts (OrderedDicts stay
        OrderedDicts), lists, tuples, numbers, strings; tensors come back as torch tensors on
        the device they were saved from, or where `map_location` says ("cpu", a
        torch.device, a {saved: new} dict or a ``fn(tensor, saved_device)``), as torch.load
        does. Without torch they come back as NumPy arrays (bfloat16 as float32, exactly).
        A newest file that does not read back (damaged, truncated, empty) is skipped with a
        RuntimeWarning naming it and why, and the one before it is tried. Raises
        CheckpointError naming the file(s) when none is readable, or when `step` was asked
        for and its file does not read back.

        >>> state = ckpt.load(map_location="cpu"); model.load_state_dict(state["model"])
        """
        if self._only_read is None:
            self._only_read = True
        self.wait()
        if step is not None:
            for checkpoint in self.checkpoints():
                if checkpoint.step == int(step):
                    return read_checkpoint(checkpoint.path, map_location)
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory!r}")
        skipped = []
        for checkpoint in reversed(self.checkpoints()):
            try:
                return read_checkpoint(checkpoint.path, map_location)
            except CheckpointError as error:
                skipped.append(str(error))
                warnings.warn(f"{error}; trying the one before it", RuntimeWarning, stacklevel=2)
        if skipped:
            raise CheckpointError(f"no readable checkpoint in {self.directory!r}: " + "; ".join(skipped))
        raise CheckpointError(f"no checkpoint in {self.directory!r}")

    def stats(self) -> dict[str, Any]:
        """Checkpoints written and their bytes (ints), the last write's seconds
        (last_write_s, a float) and step, and the saves still to be written (pending, and the
        newest one's step: pending_step, -1 when none).

        >>> ckpt.stats()["written"]
        3
        """
        return self._core.stats()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new saves (save() and maybe_save() then raise fastloop.Closed), then wait
        at most `timeout` seconds (None, the default: until done; 0: return at once) until
        every save that returned is written (a save() running on another thread as close()
        begins included), and raise a write error not yet reported. When the time runs out
        first, close() returns and the C writer thread goes on writing the pending
        checkpoints in the background (interpreter exit waits for it; a later close() waits
        again; errors are then raised by that close()). Any number of threads may call it,
        at once too.

        >>> ckpt.close()
        """
        deadline = _lifecycle.close_deadline(timeout)
        # a period but no maybe_save() call: a training loop that forgot it (one only opened
        # to load() saved nothing and is spared)
        forgotten = not self._maybe_called and not self._only_read and (self._every_s or self._every_steps)
        if not self._closed and forgotten:
            warnings.warn("Checkpointer(every_s=/every_steps=) saves only when the training loop "
                          "calls ckpt.maybe_save(state, step); it was never called (periodic saves no "
                          "longer run from a thread of their own)", RuntimeWarning, stacklevel=2)
        self._closed = True
        if not self._core.close(_lifecycle.remaining(deadline)):
            _lifecycle.draining(self)

    def _close_at_exit(self, deadline: float) -> None:
        self._core.close(0)
        self._core.wait_closed(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fastloop.Checkpointer {self.directory!r}{' closed' if self._closed else ''}>"
