"""The exception a Loader raises for a worker's failure: the worker's own exception type
where it can be re-created (as torch.utils.data does), naming the worker and the sample."""

from __future__ import annotations

import importlib
import re
from typing import Any

from ..errors import DecodeError, Error, WorkerError, retold


def process_failure(kind: str, worker: int, pid: int, signal: int, index: int, text: str) -> BaseException:
    """The exception to raise for a worker failure: the worker's own exception type when it
    can be re-created (as torch.utils.data does), carrying the sample index and traceback."""
    if kind == "died":
        return WorkerError(text, pid=pid, signal=signal or None, worker=worker)
    name, _, rest = text.partition("\x1e")
    message, _, traceback = rest.partition("\x1e")
    on = f" on sample {index}" if index >= 0 else ""  # -1: the message names the sample
    full = (f"{name.rsplit('.', 1)[-1]} in worker {worker} (pid {pid}){on}: {message}\n"
            f"Worker traceback:\n{traceback}")
    module, _, qualname = name.rpartition(".")
    try:
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if isinstance(cls, type) and issubclass(cls, Exception):
            error = cls(full)
            error.index = index  # type: ignore[attr-defined]
            return error
    except Exception:
        pass
    return WorkerError(full, pid=pid, worker=worker, index=index)


def thread_failure(worker: int, index: int, error: BaseException) -> BaseException:
    """The exception next() raises for a worker thread's failure: the same type as the one
    raised in the worker (the original as its cause, traceback and all), naming the worker and
    the sample, as processes mode does."""
    on = f" on sample {index}" if index >= 0 else ""  # -1: the message names the sample
    full = f"{type(error).__name__} in worker thread {worker}{on}: {error}"
    try:
        raised = retold(error, full) if isinstance(error, Error) else type(error)(full)
    except Exception:  # a type that takes other arguments
        raised = WorkerError(full, worker=worker, index=index)
    raised.__cause__ = error
    try:
        raised.index = index  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return raised


def naming_member(source: Any, error: BaseException) -> BaseException | None:
    """The C loader's error on a tar member names the shard; this adds the member's name."""
    match = re.match(r"sample (\d+): ", str(error)) if type(error) in (ValueError, DecodeError) else None
    if match is None or not hasattr(source, "members") or not int(match.group(1)) < len(source.members):
        return None
    return retold(error, f"{error} (member {source.members[int(match.group(1))]!r})")

