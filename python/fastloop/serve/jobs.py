"""Jobs of an InferenceService: their statuses, the record a store keeps for each, ids, and
the exceptions that result() raises.

A job moves queued -> running -> done | failed; a queued job may instead be cancelled (it
ends "failed" with ``cancelled=True`` and never runs). A done or failed job reports "expired"
once its result is older than the service's ``result_ttl_s``; later the store forgets it and
the id is unknown (KeyError).

    >>> rec = JobRecord.new("job-1", submitted=time.time(), shape=(784,), dtype="float32")
    >>> rec.status
    'queued'
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from typing import Any

from ..errors import Error

# What fastloop.serve re-exports: the record and the exceptions a user meets. The statuses and
# the id helpers below are the serve package's own; its modules import them by name.
__all__ = ["JobRecord", "JobFailed", "JobCancelled", "JobExpired", "RowsFailed", "StoreError"]

QUEUED, RUNNING, DONE, FAILED, EXPIRED = "queued", "running", "done", "failed", "expired"
STATUSES = (QUEUED, RUNNING, DONE, FAILED, EXPIRED)
FINISHED = (DONE, FAILED)  # the states a result (or an error) is kept in until it expires
DEADLINE_EXCEEDED = "deadline exceeded"  # how the error of a job failed at its deadline starts

# Ids become file and key names: letters, digits, '_', '-', '.', not starting with '.'.
_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")  # fullmatch: "$" would let a final "\n" in


class _RandomIds:
    """Fresh random ids (32 hex digits): 128 bits each from os.urandom, where uuid4 draws them
    too (and keeps 122), cut from 4 KB read at once. One system call per 256 ids, not one per
    id: each call releases the GIL, and on a busy event loop taking it back waited for a worker
    (~10 us a submit). A forked child starts a pool of its own (else both would give the same ids)."""

    _BYTES = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool, self._used = b"", 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()  # a thread of the parent may have held it at the fork
        self._pool, self._used = b"", 0

    def __call__(self) -> str:
        with self._lock:
            if self._used == len(self._pool):
                self._pool, self._used = os.urandom(self._BYTES), 0
            start = self._used
            self._used += 16
            return self._pool[start:start + 16].hex()


new_job_id = _RandomIds()


def check_job_id(job_id: Any) -> str:
    """Returns job_id if it is a valid id; raises TypeError/ValueError naming the rule."""
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, not {type(job_id).__name__}")
    if not _ID.fullmatch(job_id):
        raise ValueError(f"job_id {job_id!r} is not valid: use 1-128 letters, digits, '_', '-' or '.', "
                         "not starting with '.'")
    return job_id


@dataclasses.dataclass
class JobRecord:
    """What a store keeps for one job (its input and result arrays are kept beside it).

    Times are wall-clock seconds (time.time()), so they mean the same after a restart.
    """

    id: str
    status: str
    submitted: float
    started: float | None = None
    finished: float | None = None
    error: str | None = None  # why a failed job failed
    cancelled: bool = False  # failed because cancel() took it off the queue
    shape: tuple[int, ...] = ()  # of the input
    dtype: str = ""  # of the input
    expired_at: float | None = None  # when the store dropped its result
    deadline: float | None = None  # when it must have ended (time.time(), from submit's timeout_s)
    rows: int | None = None  # a job of several rows (its input has a leading batch axis): how many
    row_errors: list[list[Any]] | None = None  # [[row index, reason], ...]: the rows that failed

    @classmethod
    def new(cls, job_id: str, submitted: float, shape: tuple[int, ...] = (), dtype: str = "",
            rows: int | None = None) -> "JobRecord":
        return cls(job_id, QUEUED, submitted, shape=tuple(shape), dtype=dtype, rows=rows)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)  # dataclasses.asdict deep-copies each field: ~10x slower, per job
        data["shape"] = list(self.shape)
        return data

    @classmethod
    def from_json(cls, data: Any) -> "JobRecord":
        """The inverse of to_json(); raises ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"a job record is a JSON object, not {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"id", "status", "submitted"} - data.keys()
        if missing:
            raise ValueError(f"job record lacks {sorted(missing)}")
        if data["status"] not in STATUSES:
            raise ValueError(f"job record has unknown status {data['status']!r}")
        values = {k: v for k, v in data.items() if k in names}
        values["shape"] = tuple(int(n) for n in values.get("shape", ()))
        return cls(**values)


class JobFailed(Error, RuntimeError):
    """result() of a job that failed: ``job_id`` and ``reason`` (the model's exception as
    "Type: message", or why the service gave up on the job).

    >>> svc.result(job_id)  # raises JobFailed: job 'a1' failed: ValueError: bad row
    """

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id!r} failed: {reason}")
        self.job_id, self.reason = job_id, reason


class JobCancelled(JobFailed):
    """result() of a job that cancel() took off the queue before it ran.

    >>> svc.cancel(job_id); svc.result(job_id)  # raises JobCancelled
    """


class RowsFailed(JobFailed):
    """result() of a job of several rows some of which failed (the others ran): ``errors``
    maps a row's index to its reason, ``result`` holds every row's output, a failed row's
    zero-filled.

    >>> svc.result(job_id)  # raises RowsFailed: job 'a1' failed: 1 of 8 rows failed (row 3: ...)
    """

    def __init__(self, job_id: str, errors: dict[int, str], result: Any = None, rows: int | None = None) -> None:
        first = min(errors)
        total = f" of {rows}" if rows is not None else ""
        super().__init__(job_id, f"{len(errors)}{total} rows failed (row {first}: {errors[first]})")
        self.errors, self.result = errors, result


class JobExpired(Error, LookupError):
    """result() of a job whose result outlived the service's result_ttl_s and was dropped.

    >>> svc.result(old_id)  # raises JobExpired: job 'a1' expired (its result was kept 600 s)
    """

    def __init__(self, job_id: str, message: str) -> None:
        super().__init__(message)
        self.job_id = job_id

    def __str__(self) -> str:  # LookupError would quote it like a KeyError
        return str(self.args[0])


class StoreError(Error, OSError):
    """A store could not read or write a job: an unparsable record file (the message names
    the path), a full disk, a directory another service holds.

    >>> FileStore("jobs")  # raises StoreError if another process serves from 'jobs'
    """
