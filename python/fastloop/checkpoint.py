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
import zipfile
from typing import Any, Callable, Mapping, NamedTuple, Union

import numpy as np
from numpy.lib.format import dtype_to_descr

from . import _lifecycle
from ._core import _Checkpointer
from .errors import CheckpointError

__all__ = ["Checkpointer", "Checkpoint"]

_NAME = re.compile(r"^ckpt-(\d+)\.npz$")


class Checkpoint(NamedTuple):
    """A published checkpoint: its step and file.

    >>> ckpt.latest()
    Checkpoint(step=1200, path='ckpts/ckpt-000000001200.npz')
    """

    step: int
    path: str


def _entries(state: Mapping[str, Any]) -> list[tuple[str, np.ndarray, str]]:
    """(name, C-contiguous array, dtype literal) for each item; refuses what needs pickling."""
    if not isinstance(state, Mapping):
        raise TypeError(f"'state' must be a mapping of names to arrays, not {type(state).__name__}")
    entries = []
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state keys must be str, not {type(key).__name__} ({key!r})")
        array = np.asarray(value)  # numbers become 0-d arrays (ascontiguousarray would make them 1-d)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # a copy only for a non-contiguous view
        if array.dtype.hasobject:
            raise TypeError(f"state[{key!r}] is a {type(value).__name__} that holds Python objects; "
                            "checkpoints hold arrays and numbers only (nothing is pickled)")
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        entries.append((key, array, repr(dtype_to_descr(array.dtype))))
    return entries


class Checkpointer:
    """Background, atomic checkpoints of dicts of NumPy arrays and numbers in `directory`
    (created if missing), keeping the newest `keep`.

    save() blocks only to copy the state into a staging buffer (kept between saves, so the
    copy goes to warm memory); a second save() while the first is still being written
    waits for that write to finish (at most one in flight; nothing is coalesced or lost).
    A background write error is raised by the next save() or by close(). With `every_s` and
    `state_fn` (returning ``(step, state)``) it also saves periodically from a thread.

        with fastloop.Checkpointer("ckpts", keep=3) as ckpt:
            ckpt.save({"weights": w, "step": step}, step)
    """

    def __init__(
        self,
        directory: Union[str, "os.PathLike[str]"],
        keep: int = 3,
        *,
        every_s: float | None = None,
        state_fn: Callable[[], tuple[int, Mapping[str, Any]]] | None = None,
    ) -> None:
        if (every_s is None) != (state_fn is None):
            raise ValueError("'every_s' and 'state_fn' go together: a period and a function "
                             "returning (step, state)")
        if every_s is not None and every_s <= 0:
            raise ValueError(f"'every_s' must be > 0, not {every_s}")
        self.directory = os.fspath(directory)
        self._core = _Checkpointer(self.directory, keep)
        self._closed = False
        self._periodic_error: BaseException | None = None
        self._stop = threading.Event()
        self._periodic = None
        if every_s is not None:
            self._periodic = threading.Thread(target=self._save_periodically, args=(every_s, state_fn),
                                              name="fastloop-checkpoint-every", daemon=True)
            self._periodic.start()
        _lifecycle.register(self)

    def save(self, state: Mapping[str, Any], step: int, timeout: float | None = None) -> None:
        """Snapshot `state` as checkpoint `step` and return; the file is written in the
        background. Waits (GIL released, Ctrl-C works) while the previous save is still
        being written, up to `timeout` (then TimeoutError).

        >>> ckpt.save({"w": w, "epoch": 3}, step=1200)
        """
        self._raise_periodic_error()
        self._core.save(_entries(state), int(step), timeout)

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

    def load(self, step: int | None = None) -> dict[str, np.ndarray]:
        """The state saved as `step` (default: the latest) as a dict of NumPy arrays
        (numbers come back as 0-d arrays: int(state["epoch"])). Raises CheckpointError
        naming the file when there is none or it does not read back intact.

        >>> state = ckpt.load(); w = state["w"]
        """
        if step is None:
            latest = self.latest()
            if latest is None:
                raise CheckpointError(f"no checkpoint in {self.directory!r}")
            path = latest.path
        else:
            path = os.path.join(self.directory, f"ckpt-{int(step):012d}.npz")
            if not os.path.exists(path):
                raise CheckpointError(f"no checkpoint for step {step} in {self.directory!r}")
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            raise CheckpointError(f"checkpoint {path} cannot be read: {error}") from error

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
        self._stop.set()
        if self._periodic is not None and wait:
            self._periodic.join()
        self._closed = True
        self._core.close(wait=wait)
        if not wait:
            _lifecycle.draining(self)
            return
        self._raise_periodic_error()

    def _save_periodically(self, every_s: float, state_fn: Callable[[], tuple[int, Mapping[str, Any]]]) -> None:
        while not self._stop.wait(every_s):
            try:
                step, state = state_fn()
                self._core.save(_entries(state), int(step), None)
            except BaseException as error:  # keep it for the owner; stop periodic saves
                self._periodic_error = error
                return

    def _raise_periodic_error(self) -> None:
        error, self._periodic_error = self._periodic_error, None
        if error is not None:
            raise CheckpointError(f"periodic save failed: {type(error).__name__}: {error}") from error

    def _close_at_exit(self, deadline: float) -> None:
        self._stop.set()
        self._core.wait(max(0.0, deadline - time.monotonic()))
        self._core.close(wait=False)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fastloop.Checkpointer {self.directory!r}{' closed' if self._closed else ''}>"
