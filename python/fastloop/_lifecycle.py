"""Closing fastloop's background workers when the interpreter exits.

Every Monitor and Checkpointer registers here. At exit, before Python tears modules down,
each is closed: queued records are written and an in-flight checkpoint is finished, within a
bounded time, so a script that forgets close() neither loses data nor hangs. (The C threads
never take the GIL, so they cannot deadlock with finalization either.)
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Protocol


class Closable(Protocol):
    def _close_at_exit(self, deadline: float) -> None: ...


_live: "weakref.WeakSet[Closable]" = weakref.WeakSet()
_draining: set = set()  # closed with a timeout that ran out, maybe still writing: kept alive until exit
_lock = threading.Lock()

EXIT_DEADLINE_S = 30.0  # upper bound for a wedged disk; normal exits take milliseconds


def close_deadline(timeout: float | None) -> float | None:
    """The monotonic deadline of a close(timeout=) (None: no limit); ValueError/TypeError
    naming 'timeout' for one that is not a number >= 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"'timeout' must be a number of seconds or None, not {type(timeout).__name__}")
    if not timeout >= 0:  # NaN too
        raise ValueError(f"'timeout' must be >= 0 seconds or None, not {timeout}")
    return time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (None: no limit), never below 0."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def register(obj: Closable) -> None:
    with _lock:
        _live.add(obj)


def draining(obj: Closable) -> None:
    """obj was closed without waiting: make sure exit still waits for its writer."""
    with _lock:
        _draining.add(obj)


def _close_all() -> None:
    deadline = time.monotonic() + EXIT_DEADLINE_S
    with _lock:
        objects = list(_live) + [o for o in _draining if o not in _live]
        _draining.clear()
    for obj in objects:
        try:
            obj._close_at_exit(deadline)
        except Exception as error:  # exiting: report, never raise from atexit
            print(f"fastloop: closing {obj!r} at exit failed: {error}")


atexit.register(_close_all)
